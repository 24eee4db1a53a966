"""The Python package as a user meets it: version, docstrings (numpy style) on every
public function and class, type stubs that cover the public API. (`pip install .` into a
fresh venv, offline, is test_readme_quickstart.py::test_readme_quickstart_installed_into_a_venv:
the README's recipe as written, then the installed package's own checks.)"""
import ast
import inspect
import os
import re
import subprocess
import sys

import pytest

import pskv
import pskv.data
import pskv.lr_scheduler
import pskv.optimizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
PKG = os.path.join(ROOT, 'python', 'pskv')
MODULES = ['pskv', 'pskv.kvstore', 'pskv.sparse', 'pskv.data', 'pskv.optimizer', 'pskv.lr_scheduler', 'pskv.torch',
           'pskv.process', 'pskv.recordio', 'pskv.synthetic']


def _module(name):
    if name == 'pskv.torch':
        pytest.importorskip('torch')
    __import__(name)
    return sys.modules[name]


def public_api(mod):
    """(qualified name, object) of the module's public functions, classes and methods."""
    out = []
    for name, obj in vars(mod).items():
        if name.startswith('_') or getattr(obj, '__module__', None) != mod.__name__:
            continue
        if inspect.isfunction(obj):
            out.append((name, obj))
        elif inspect.isclass(obj):
            out.append((name, obj))
            # Its own methods and those it inherits from pskv's classes (a class may be
            # put together from parts in private modules, as KVStore is).
            seen = set()
            for klass in obj.__mro__:
                if not klass.__module__.startswith('pskv'):
                    continue
                for mname, m in vars(klass).items():
                    if mname in seen or (mname.startswith('_') and mname != '__init__'):
                        continue
                    seen.add(mname)
                    if isinstance(m, property):
                        out.append((name + '.' + mname, m))
                    elif inspect.isfunction(m) and mname != '__init__':
                        out.append((name + '.' + mname, m))
    return out


def test_version_matches_cmake_project():
    cmake = open(os.path.join(ROOT, 'CMakeLists.txt')).read()
    version = re.search(r'project\(pskv VERSION ([0-9.]+)', cmake).group(1)
    assert pskv.__version__ == version


@pytest.mark.parametrize('modname', MODULES)
def test_every_public_function_and_class_has_a_numpy_style_docstring(modname):
    mod = _module(modname)
    assert mod.__doc__, modname
    missing, no_params = [], []
    for name, obj in public_api(mod):
        doc = inspect.getdoc(obj)
        if not doc:
            missing.append(name)
            continue
        fn = obj.__init__ if inspect.isclass(obj) else getattr(obj, 'fget', obj)
        try:
            params = [p for p in inspect.signature(fn).parameters if p not in ('self', 'cls')]
        except (TypeError, ValueError):
            params = []
        if inspect.isclass(obj) and fn is object.__init__:
            params = []
        if params and 'Parameters\n----------' not in doc:
            no_params.append(name)
    assert not missing, '%s: no docstring: %s' % (modname, missing)
    assert not no_params, '%s: no numpy-style Parameters section: %s' % (modname, no_params)


@pytest.mark.parametrize('modname', MODULES)
def test_stubs_cover_the_public_api(modname):
    mod = _module(modname)
    stub = os.path.join(PKG, ('__init__' if modname == 'pskv' else modname.split('.')[1]) + '.pyi')
    tree = ast.parse(open(stub).read(), stub)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    wanted = {n.split('.')[-1] for n, _ in public_api(mod)}
    if modname == 'pskv':
        wanted |= set(pskv.__all__)
    assert not wanted - names, '%s: not in %s: %s' % (modname, stub, sorted(wanted - names))


def test_an_interpreter_without_numpy_is_told_what_to_do():
    """The pyenv python3 first on PATH here has no numpy: importing pskv says which
    interpreter to use instead of a bare ModuleNotFoundError (simulated by hiding numpy)."""
    code = 'import sys; sys.modules["numpy"] = None; import pskv'
    r = subprocess.run(['/usr/bin/python3', '-c', code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=dict(os.environ), timeout=60)
    out = r.stdout.decode()
    assert r.returncode != 0
    assert 'needs numpy' in out and 'venv --system-site-packages' in out, out
