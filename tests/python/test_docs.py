"""Every snippet of README.md, python/README.md and docs/*.md runs as pasted, and
every relative link resolves.

* ```python blocks run with /usr/bin/python3 (PYTHONPATH=build/python). Info-string
  words after the language: `dist` runs the block under pskv-launch (2 workers, 1
  server); `prelude=torch` defines the names a fragment assumes (a small model `net`/
  `model`, `train_set`, `x`, `y`, `batch_size`, `opt`, `kv`, `sampler`, `epochs`).
* ```cpp blocks are compiled against include/ and build/libpskv (lines starting with
  #include go first, the rest into main) and run under pskv-launch with `dist`.
  `norun` marks an excerpt of a file that a test runs (it says which).
* Shell lines (fenced or indented blocks) that run pskv-launch are run with --dry-run;
  `PYTHONPATH=build/python /usr/bin/python3 -c ...` lines are run. The install recipe
  (`pip install`, venv) is run by test_readme_quickstart.py::test_readme_quickstart_installed_into_a_venv.
"""
import glob
import os
import re
import shlex
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')
DOCS = [os.path.join(ROOT, 'README.md'), os.path.join(ROOT, 'python', 'README.md')] + \
    sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))

PRELUDE_TORCH = '''
import os, torch, numpy as np, pskv, pskv.torch
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)
    def forward(self, x):
        return self.fc(x)
net = model = Net()
train_set = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
x, y = train_set[:32]
batch_size = 32
epochs, start = 2, 0
opt = pskv.optimizer.SGD(learning_rate=0.05, momentum=0.9)
kv = pskv.create('dist_sync' if os.environ.get('DMLC_ROLE') else 'local')
sampler = pskv.torch.Sampler(train_set, 64, num_parts=kv.num_workers, part_index=kv.rank)
'''


def blocks():
    """(doc, line, lang, tags, code) of every fenced block."""
    out = []
    for doc in DOCS:
        lines = open(doc).read().split('\n')
        i = 0
        while i < len(lines):
            m = re.match(r'^```(\S*)\s*(.*)$', lines[i])
            if m:
                j = i + 1
                while not lines[j].startswith('```'):
                    j += 1
                out.append((os.path.relpath(doc, ROOT), i + 1, m.group(1), m.group(2).split(),
                            '\n'.join(lines[i + 1:j])))
                i = j
            i += 1
    return out


def shell_lines():
    """(doc, line, text) of shell lines in unlabelled fenced or indented blocks."""
    out = []
    for doc in DOCS:
        fenced, lang = False, ''
        for n, line in enumerate(open(doc).read().split('\n'), 1):
            if line.startswith('```'):
                fenced, lang = (not fenced), line[3:].strip()
                continue
            text = line.strip() if (fenced and lang == '') else (line[4:] if line.startswith('    ') and not fenced
                                                                  else None)
            if text:
                out.append((os.path.relpath(doc, ROOT), n, text.split('  #')[0].strip()))
    return out


def env():
    e = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'), DMLC_PS_ROOT_URI='127.0.0.1')
    e.pop('DMLC_ROLE', None)
    return e


def run_launched(cmd, tmp_path):
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '1', '--timeout', '120', '--'] + cmd, cwd=str(tmp_path), env=env(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    return p.returncode, p.stdout.decode()


PY = [b for b in blocks() if b[2] == 'python']
CPP = [b for b in blocks() if b[2] == 'cpp']


@pytest.mark.parametrize('doc,line,lang,tags,code', PY, ids=['%s:%d' % (b[0], b[1]) for b in PY])
def test_python_snippet_runs(doc, line, lang, tags, code, tmp_path):
    if 'norun' in tags:
        pytest.skip('excerpt')
    if 'prelude=torch' in tags:
        pytest.importorskip('torch')
        code = PRELUDE_TORCH + '\n' + code
    script = tmp_path / 'snippet.py'
    script.write_text(code + '\n')
    if 'dist' in tags:
        rc, out = run_launched(['/usr/bin/python3', str(script)], tmp_path)
    else:
        p = subprocess.run(['/usr/bin/python3', str(script)], cwd=str(tmp_path), env=env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        rc, out = p.returncode, p.stdout.decode()
    assert rc == 0, '%s:%d does not run as pasted:\n%s' % (doc, line, out[-3000:])


@pytest.mark.parametrize('doc,line,lang,tags,code', CPP, ids=['%s:%d' % (b[0], b[1]) for b in CPP])
def test_cpp_snippet_compiles_and_runs(doc, line, lang, tags, code, tmp_path):
    if 'norun' in tags:
        assert re.search(r'tests/[\w/]+\.cc', open(os.path.join(ROOT, doc)).read()), 'say which test runs it'
        pytest.skip('excerpt of a tested file')
    includes = [l for l in code.split('\n') if l.startswith('#include')]
    body = [l for l in code.split('\n') if not l.startswith('#include')]
    src = tmp_path / 'snippet.cc'
    src.write_text('\n'.join(includes) + '\n#include <pskv/ndarray.h>\nint main() {\n'
                   '  pskv::NDArray weights({4}), grad_dev0({4}), grad_dev1({4});\n' + '\n'.join(body) +
                   '\n  return 0;\n}\n')
    exe = str(tmp_path / 'snippet')
    p = subprocess.run(['g++', '-std=c++20', '-I', os.path.join(ROOT, 'include'), str(src), '-o', exe,
                        '-L', BUILD, '-lpskv', '-Wl,-rpath,' + BUILD], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=300)
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    if 'dist' in tags:
        rc, out = run_launched([exe], tmp_path)
    else:
        q = subprocess.run([exe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        rc, out = q.returncode, q.stdout.decode()
    assert rc == 0, out


LAUNCH_LINES = [s for s in shell_lines() if re.match(r'^(PYTHONPATH=\S+ )?(build/)?pskv-launch\b', s[2])]
PY_LINES = [s for s in shell_lines() if s[2].startswith('PYTHONPATH=build/python /usr/bin/python3 -c')]


@pytest.mark.parametrize('doc,line,text', LAUNCH_LINES, ids=['%s:%d' % (s[0], s[1]) for s in LAUNCH_LINES])
def test_launcher_command_line_parses(doc, line, text):
    argv = shlex.split(text)
    while '=' in argv[0] and not argv[0].startswith('-'):   # VAR=value before the command
        argv = argv[1:]
    args = [a for a in argv[1:]]
    if args == ['--help'] or args == ['--version']:
        full = [LAUNCH] + args
    else:
        full = [LAUNCH, '--dry-run'] + args
    p = subprocess.run(full, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    assert p.returncode == 0, '%s:%d: %s\n%s' % (doc, line, text, p.stdout.decode())


@pytest.mark.parametrize('doc,line,text', PY_LINES, ids=['%s:%d' % (s[0], s[1]) for s in PY_LINES])
def test_python_command_line_runs(doc, line, text):
    e = dict(os.environ)
    e.pop('PYTHONPATH', None)
    cmd = text.replace('build/python', os.path.join(BUILD, 'python'), 1)
    p = subprocess.run(cmd, shell=True, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert p.returncode == 0, '%s:%d: %s\n%s' % (doc, line, text, p.stdout.decode())


def test_every_relative_link_resolves():
    broken = []
    for doc in DOCS:
        text = open(doc).read()
        for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', text):
            if re.match(r'^[a-z]+:', target):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            if not os.path.exists(path):
                broken.append('%s -> %s' % (os.path.relpath(doc, ROOT), target))
            elif not path.startswith(ROOT + os.sep):
                broken.append('%s -> %s (outside the repository)' % (os.path.relpath(doc, ROOT), target))
        for target in re.findall(r'`(\.\./[^`]+)`', text):
            path = os.path.normpath(os.path.join(os.path.dirname(doc), target))
            if not path.startswith(ROOT + os.sep):
                broken.append('%s -> %s (outside the repository)' % (os.path.relpath(doc, ROOT), target))
    assert not broken, broken


# ---- the table of environment variables (src/common/env_table.cc) is the one list

ENV_TABLE_HEADER = ['| variable | default | scope | meaning |', '|---|---|---|---|']


def env_table():
    from pskv import _pskv
    return _pskv.env_table()


def readme_env_rows():
    """The README's configuration table as rendered from the environment table."""
    return ENV_TABLE_HEADER + ['| `%s` | %s | %s | %s |' % (v['name'], v['default'], v['scope'], v['doc'])
                               for v in env_table() if v['scope'] != 'test']


def test_readme_variable_table_is_the_environment_table():
    lines = open(os.path.join(ROOT, 'README.md')).read().split('\n')
    start = lines.index(ENV_TABLE_HEADER[0])
    end = start
    while end < len(lines) and lines[end].startswith('|'):
        end += 1
    expected = readme_env_rows()
    assert lines[start:end] == expected, (
        'README.md\'s variable table differs from src/common/env_table.cc; the table should read:\n' +
        '\n'.join(expected))


# Names of pskv's macros and CMake options, which look like variables but are not.
NOT_VARIABLES = re.compile(r'^(PSKV_(WARN|INFO|ERROR|DEBUG|LOG_AT|LOG_LIMITED|VERSION|WITH_CUDA|HOST_DEVICE)|\w+_)$')


def sources(*exts):
    for top in ('src', 'python', 'tools', 'include'):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(exts):
                    yield os.path.join(dirpath, f)


def test_every_variable_read_or_named_in_the_code_is_in_the_table():
    names = {v['name'] for v in env_table()}
    unknown, direct = [], []
    for path in sources('.cc', '.h', '.py', '.pyi'):
        rel = os.path.relpath(path, ROOT)
        text = open(path, encoding='utf-8').read()
        # Only the table reads the environment (EnvValue); Python goes through the binding.
        if rel != 'src/common/env_table.cc' and re.search(r'\bgetenv\s*\(|os\.environ|os\.getenv', text):
            direct.append(rel)
        for name in re.findall(r'\b((?:PSKV|DMLC|PS|MXNET)_[A-Z0-9_]+)\b', text):
            if name not in names and not NOT_VARIABLES.match(name):
                unknown.append('%s: %s' % (rel, name))
    assert not direct, 'read the environment through Options::FromEnv / EnvValue (src/common/env_table.h): %s' % direct
    assert not unknown, 'not in src/common/env_table.cc: %s' % sorted(set(unknown))


def test_snippets_were_found():
    assert len(PY) >= 5 and len(CPP) >= 2 and len(LAUNCH_LINES) >= 3
