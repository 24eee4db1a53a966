"""Process-wide settings are the program's (python/pskv/process.py, include/pskv/process.h):
importing pskv and creating stores change neither the allocator nor the log name;
pskv.configure_process does what it is asked; a dist worker that did not call it gets
the logging and metrics the environment asks for from its first dist store, and a
program that calls it first keeps what it chose."""
import os
import subprocess
import sys

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(('DMLC_', 'PSKV_', 'MXNET_'))}
    env['PYTHONPATH'] = os.path.join(BUILD, 'python')
    return env


def test_import_and_local_stores_change_no_process_wide_setting():
    code = '''
import numpy as np, pskv
from pskv import _pskv
assert not _pskv.allocator_tuned() and _pskv.log_name() == 'pskv'
for kind in ('local', 'device'):
    kv = pskv.create(kind)
    kv.init(0, np.zeros(2, np.float32))
    kv.close()
assert not _pskv.allocator_tuned() and _pskv.log_name() == 'pskv'
pskv.configure_process()
assert not _pskv.allocator_tuned()
pskv.configure_process(tune_allocator=True)
assert _pskv.allocator_tuned()
print('checked')
'''
    p = subprocess.run([sys.executable, '-c', code], env=_env(), capture_output=True, timeout=60)
    assert p.returncode == 0 and b'checked' in p.stdout, p.stderr.decode()


WORKER = '''
import sys, numpy as np, pskv
from pskv import _pskv
if sys.argv[1] == 'configured':
    pskv.configure_process(tune_allocator=True)
kv = pskv.create('dist_sync')
kv.init(0, np.ones(2, np.float32))
kv.pushpull(0, np.ones(2, np.float32))
rank, name, tuned = kv.rank, _pskv.log_name(), _pskv.allocator_tuned()
kv.close()
print('worker %d: name=%s tuned=%s' % (rank, name, tuned))
'''


def _launch(tmp_path, mode):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    metrics = tmp_path / 'm.prom'
    cmd = [LAUNCH, '-n', '1', '-s', '1', '--timeout', '60', '--env', 'PSKV_METRICS_FILE=%s' % metrics,
           '--', sys.executable, str(script), mode]
    p = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    written = ''.join(f.read_text() for f in tmp_path.glob('m.*.prom'))
    return out, written


def test_a_dist_store_configures_a_process_that_did_not(tmp_path):
    out, metrics = _launch(tmp_path, 'plain')
    assert 'worker 0: name=worker[0] tuned=False' in out, out
    assert 'node="worker[0]"' in metrics, metrics  # the worker's metrics file, named after its node


def test_a_program_that_configured_the_process_keeps_its_choice(tmp_path):
    out, metrics = _launch(tmp_path, 'configured')
    assert 'worker 0: name=worker[0] tuned=True' in out, out
    assert 'node="worker[0]"' in metrics, metrics
