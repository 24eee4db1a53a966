"""The README's Python quick start runs as written.

The commands are read from the README's fenced blocks between the markers
`<!-- quickstart:NAME ... -->` and `<!-- /quickstart -->`, so this test follows the text:
change the README and this runs the new lines. Each line runs in a shell from the
repository root, as a user pastes it, with two substitutions only: `build` (the build
directory) is the build tree under test (PSKV_BUILD_DIR), and `~/pskv-env` a fresh
directory. A `python3` that is not Debian's (pyenv, conda) is put first on PATH and
fails when run: the quick start must not depend on which `python3` comes first.

The build-tree block runs in the `python_readme_quickstart` CTest entry (seconds once the
tree is built). The installed block builds the package with pip, the project's one pip
build (`python_readme_quickstart_pip`), and then checks what the installed package must
do beyond the quick start: it imports outside the source tree with its version, and its
`pskv-launch` reports that version. PSKV_SKIP_PIP_TEST=1 skips it. CTest gives the pip
build PSKV_CMAKE_ARGS that compile without optimisation (-O0, no LTO): the same sources
and packaging in about a third of the time, what this test checks does not depend on it.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))
README = os.path.join(ROOT, 'README.md')


def quickstart(name):
    """The command lines of the README block marked `quickstart:NAME` (comments cut)."""
    text = open(README).read()
    m = re.search(r'<!-- quickstart:%s\b[^>]*-->\s*```[^\n]*\n(.*?)```\s*<!-- /quickstart -->' % re.escape(name),
                  text, re.S)
    assert m, 'README.md has no block marked <!-- quickstart:%s --> ... <!-- /quickstart -->' % name
    lines = [l.split('  #')[0].strip() for l in m.group(1).split('\n')]
    return [l for l in lines if l]


def user_env(tmp_path):
    """The environment of a shell where PYTHONPATH is unset and a foreign python3 comes first."""
    fake = tmp_path / 'other-python'
    fake.mkdir()
    (fake / 'python3').write_text('#!/bin/sh\necho "a python3 without numpy (pyenv/conda stand-in)" >&2\nexit 3\n')
    (fake / 'python3').chmod(0o755)
    env = dict(os.environ, PATH=str(fake) + os.pathsep + os.environ.get('PATH', ''), PIP_NO_INDEX='1',
               PSKV_BUILD_JOBS='2')
    for k in ('PYTHONPATH', 'VIRTUAL_ENV', 'DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_PS_ROOT_PORT'):
        env.pop(k, None)
    return env


def run_lines(lines, env, subst, timeout):
    outs = []
    for line in lines:
        cmd = line
        for pattern, value in subst:
            cmd = re.sub(pattern, value, cmd)
        p = subprocess.run(['/bin/bash', '-c', cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        out = p.stdout.decode(errors='replace')
        assert p.returncode == 0, 'README line does not run as written:\n  %s\n(ran: %s)\n%s' % (line, cmd, out[-4000:])
        outs.append(out)
    return outs


def check_training_output(out):
    assert re.search(r'\[worker 0\][^\n]*epoch 2: loss \d', out), out[-3000:]
    sums = re.findall(r'\[worker (\d)\][^\n]*worker \d: done, weights checksum (-?[\d.]+)', out)
    assert sorted(w for w, _ in sums) == ['0', '1'], out[-3000:]
    assert sums[0][1] == sums[1][1], 'the workers ended with different weights: %s' % sums
    assert 'job succeeded' in out, out[-3000:]


def test_readme_quickstart_from_the_build_tree(tmp_path):
    pytest.importorskip('torch')
    lines = quickstart('build-tree')
    assert any('pskv-launch' in l for l in lines), lines
    # `build` as a word of its own or before a slash: the build tree under test.
    subst = [(r'(?<![\w./-])build(?=/|\s|$)', BUILD)]
    outs = run_lines(lines, user_env(tmp_path), subst, timeout=900)
    check_training_output(outs[-1])


@pytest.mark.skipif(os.environ.get('PSKV_SKIP_PIP_TEST') == '1', reason='PSKV_SKIP_PIP_TEST=1')
def test_readme_quickstart_installed_into_a_venv(tmp_path):
    pytest.importorskip('torch')
    lines = quickstart('installed')
    assert any('venv' in l for l in lines) and any('pip install' in l for l in lines), lines
    venv = str(tmp_path / 'pskv-env')
    env = user_env(tmp_path)
    outs = run_lines(lines, env, [(r'~/pskv-env', venv)], timeout=1500)
    check_training_output(outs[-1])
    # The installed package outside the source tree: its version, a store, its tools.
    sys.path.insert(0, os.path.join(BUILD, 'python'))
    import pskv  # noqa: E402  (the build tree's, for the version)
    py = os.path.join(venv, 'bin', 'python')
    code = ('import pskv, numpy as np\n'
            'kv = pskv.create("local"); kv.init(3, np.ones(4, np.float32))\n'
            'kv.push(3, [np.ones(4, np.float32)] * 2); out = np.zeros(4, np.float32); kv.pull(3, out=out); kv.wait(3)\n'
            'assert out[0] == 2, out\n'
            'print(pskv.__version__, pskv.__file__)\n')
    r = subprocess.run([py, '-c', code], env=env, cwd=str(tmp_path), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert out.startswith(pskv.__version__) and venv in out, out
    r = subprocess.run([os.path.join(venv, 'bin', 'pskv-launch'), '--version'], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=30)
    assert r.returncode == 0 and pskv.__version__ in r.stdout.decode(), r.stdout.decode()
