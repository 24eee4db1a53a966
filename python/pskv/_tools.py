"""Entry points of the installed package: ``pskv-launch`` and ``pskv-server``.

pip installs these as console scripts; they run the C++ tools shipped inside the
package (``pskv/bin``). In a build tree (``PYTHONPATH=build/python``) the tools are
next to the package's parent directory instead (``build/pskv-launch``).
"""
import os
import sys


def tool_path(name):
    """Path of the C++ tool `name` ('pskv-launch' or 'pskv-server').

    Parameters
    ----------
    name : str
        The tool's file name.

    Returns
    -------
    str
        An executable file: ``pskv/bin/<name>`` of an installed package, or
        ``<build>/<name>`` of a build tree.

    Raises
    ------
    FileNotFoundError
        If neither exists (the package was not built with its tools).
    """
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, 'bin', name), os.path.join(here, '..', '..', name)):
        if os.access(candidate, os.X_OK):
            return os.path.normpath(candidate)
    raise FileNotFoundError('%s is not part of this pskv installation (%s); reinstall with '
                            '`pip install --no-build-isolation .` or build with CMake' % (name, here))


def _exec(name):
    path = tool_path(name)
    os.execv(path, [path] + sys.argv[1:])


def launch():
    """Runs ``pskv-launch`` with this process's arguments (never returns)."""
    _exec('pskv-launch')


def server():
    """Runs ``pskv-server`` with this process's arguments (never returns)."""
    _exec('pskv-server')
