"""Builds pskv's extension module with CMake for `pip install .` / `pip wheel .`.

The metadata is in pyproject.toml. CMake builds `_pskv`, `libpskv` and the tools
`pskv-launch` and `pskv-server` (tests, benchmarks, examples and libtorch off) for
the interpreter that runs this build; they are copied into the package: _pskv and
libpskv.so.0 side by side (RPATH $ORIGIN), the tools in pskv/bin (RPATH $ORIGIN/..).

Environment: PSKV_CMAKE_ARGS (extra CMake arguments), PSKV_BUILD_JOBS (default: cores).
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if shutil.which('cmake') is None:
            raise RuntimeError('pskv needs cmake to build (Debian: apt-get install cmake ninja-build '
                               'pybind11-dev python3-dev libzmq3-dev libsodium-dev zlib1g-dev libcli11-dev; '
                               'or run scripts/install-deps.sh)')
        out = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build = os.path.abspath(os.path.join(self.build_temp, 'cmake'))
        os.makedirs(build, exist_ok=True)
        args = ['-S', ROOT, '-B', build, '-DCMAKE_BUILD_TYPE=Release', '-DPSKV_PYTHON_WHEEL=ON',
                '-DPSKV_BUILD_PYTHON=ON', '-DPSKV_BUILD_TESTS=OFF', '-DPSKV_BUILD_BENCH=OFF',
                '-DPSKV_BUILD_EXAMPLES=OFF', '-DPSKV_BUILD_TORCH=OFF', '-DPSKV_INSTALL=OFF',
                '-DPython3_EXECUTABLE=' + sys.executable]
        if shutil.which('ninja'):
            args += ['-G', 'Ninja']
        args += shlex.split(os.environ.get('PSKV_CMAKE_ARGS', ''))
        jobs = os.environ.get('PSKV_BUILD_JOBS', str(os.cpu_count() or 1))
        subprocess.run(['cmake'] + args, check=True)
        subprocess.run(['cmake', '--build', build, '-j', jobs, '--target', '_pskv', 'pskv-launch',
                        'pskv-server'], check=True)
        os.makedirs(os.path.join(out, 'bin'), exist_ok=True)
        module = glob.glob(os.path.join(build, 'python', 'pskv', '_pskv*.so'))
        if len(module) != 1:
            raise RuntimeError('CMake did not build exactly one _pskv module: %s' % module)
        shutil.copy2(module[0], os.path.join(out, os.path.basename(self.get_ext_fullpath(ext.name))))
        shutil.copy2(os.path.join(build, 'libpskv.so.0'), os.path.join(out, 'libpskv.so.0'),
                     follow_symlinks=True)
        for tool in ('pskv-launch', 'pskv-server'):
            shutil.copy2(os.path.join(build, tool), os.path.join(out, 'bin', tool))


setup(ext_modules=[CMakeExtension('pskv._pskv')], cmdclass={'build_ext': CMakeBuild})
