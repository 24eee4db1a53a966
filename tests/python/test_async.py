"""Issue 13 item 5: push/pull/pushpull return at once (MXNet's asynchronous
semantics); wait(keys)/wait_all() block; arrays in flight stay alive and read-only;
errors come with the calls in flight; PSKV_PY_SYNC=1 restores blocking calls; the
Trainer issues a step's communication before one wait."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pskv
from conftest import BUILD

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCH = os.path.join(BUILD, 'pskv-launch')


def launch(scenarios, workers, delay_ms=300):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    cmd = [LAUNCH, '-n', str(workers), '-s', '1', '--timeout', '150',
           '--env', 'PSKV_TEST_REPLY_DELAY=%d' % delay_ms,
           '--', '/usr/bin/python3', os.path.join(HERE, 'async_check.py'), scenarios]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=200)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for w in range(workers):
        for s in scenarios.split(','):
            assert 'worker %d: %s passed' % (w, s) in out, out


@pytest.mark.parametrize('workers', [1, 2])
def test_dist_in_flight_semantics_and_lifetime(workers):
    # The checks that calls are still in flight right after they returned need the
    # servers to hold replies far longer than a stall of this (loaded) machine.
    launch('returns_at_once,lifetime', workers, delay_ms=1000)
    launch('ordering,trainer,close_first', workers, delay_ms=100)


def test_results_after_wait_and_read_only_until_then():
    kv = pskv.create('local')
    kv.init(['a', 'b'], [np.zeros(3, np.float32), np.zeros(3, np.float32)])
    g = np.ones(3, np.float32)
    kv.push('a', g)
    with pytest.raises(ValueError, match='read-only'):
        g[0] = 2  # the push may not have read it yet
    out_a, out_b = np.zeros(3, np.float32), np.zeros(3, np.float32)
    kv.pull('a', out=out_a)
    kv.pull('b', out=out_b)
    kv.wait('a')  # releases the calls of key a only
    assert g.flags.writeable and out_a.flags.writeable
    assert out_a.tolist() == [1, 1, 1]
    kv.wait_all()
    assert out_b.flags.writeable
    g[0] = 2  # reusable now


def test_same_out_twice_before_wait_and_read_only_arrays():
    kv = pskv.create('local')
    kv.init(0, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    kv.pull(0, out=out)
    kv.pull(0, out=out)  # read-only because in flight, not because the user made it so
    ro = np.zeros(2, np.float32)
    ro.flags.writeable = False
    with pytest.raises(pskv.InvalidArgument, match='read-only'):
        kv.pull(0, out=ro)
    kv.push(0, ro)  # an input that was read-only stays read-only
    kv.wait(0)
    assert out.flags.writeable and not ro.flags.writeable
    assert out.tolist() == [1, 1]


def test_updater_error_raised_by_wait_names_key_and_call():
    kv = pskv.create('local')
    kv.init('w', np.zeros(2, np.float32))

    def bad(key, recv, stored):
        raise ValueError('updater failed')

    kv.set_updater(bad)
    g = np.ones(2, np.float32)
    kv.push('w', g)  # returns: the error is the wait's
    with pytest.raises(ValueError, match='updater failed') as e:
        kv.wait('w')
    notes = '\n'.join(getattr(e.value, '__notes__', []))
    assert "updater of key 'w'" in notes and "push of key 'w'" in notes, notes
    assert g.flags.writeable  # released although the call failed


def test_pskv_error_at_wait_lists_calls_in_flight():
    kv = pskv.create('local')
    kv.init([1, 2], [np.zeros(2, np.float32)] * 2)

    def bad(key, recv, stored):
        raise pskv.UsageError('refused by the updater')

    kv.set_updater(bad)
    kv.push([1, 2], [np.ones(2, np.float32)] * 2)
    with pytest.raises(pskv.UsageError, match=r'refused by the updater .*push of key 1, 2'):
        kv.wait_all()


def run(code, **env):
    e = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'), **env)
    r = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


BLOCKING = '''
    import numpy as np, pskv
    kv = pskv.create('local'{arg})
    kv.init(0, np.zeros(3, np.float32))
    g = np.ones(3, np.float32)
    kv.push(0, g)
    g[:] = 5                           # the push has completed: reusable at once
    out = np.zeros(3, np.float32)
    kv.pull(0, out=out)
    print(out.tolist(), out.flags.writeable, g.flags.writeable)
'''


@pytest.mark.parametrize('env,arg', [({'PSKV_PY_SYNC': '1'}, ''), ({}, ', blocking=True')])
def test_opt_out_restores_blocking_calls(env, arg):
    assert run(BLOCKING.format(arg=arg), **env).strip() == '[1.0, 1.0, 1.0] True True'


def test_py_sync_malformed_is_an_error_naming_it():
    e = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'), PSKV_PY_SYNC='yes')
    r = subprocess.run([sys.executable, '-c', 'import pskv; pskv.create("local")'], env=e,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and 'PSKV_PY_SYNC' in r.stderr, r.stderr


@pytest.mark.parametrize('uok', [True, False])
def test_trainer_issues_a_step_before_one_wait(uok):
    pytest.importorskip('torch')
    from async_check import trainer_step_calls
    trainer_step_calls(pskv.create('local'), uok)  # buffers: in the 2-worker job above


def test_trainer_groups_small_parameters_by_the_stores_fusion_limit(monkeypatch):
    pytest.importorskip('torch')
    from async_check import trainer_step_calls
    monkeypatch.setenv('PSKV_FUSION_KEY_BYTES', '0')  # no fusion: one call per parameter
    kv = pskv.create('local')
    assert kv._kv.fusion_key_bytes == 0
    trainer_step_calls(kv, True)


def test_torch_tensor_modified_in_flight_is_reported_by_the_next_wait():
    torch = pytest.importorskip('torch')
    kv = pskv.create('local')
    kv.init(['a', 'b', 'c'], [np.zeros(3, np.float32)] * 3)
    # Following the rules: no error, values right.
    g = torch.ones(3)
    out = torch.zeros(3)
    kv.push('a', g)
    kv.pull('a', out=out)
    kv.wait_all()
    assert out.tolist() == [1, 1, 1]
    g.add_(1)  # after the wait: fine
    out.zero_()
    kv.wait_all()
    # An input modified in place before its wait.
    kv.push('a', g)
    g.add_(1)
    with pytest.raises(pskv.UsageError, match=r"push of key 'a'.*modified in place"):
        kv.wait('a')
    kv.wait_all()  # reported once
    # An output written before its wait (pskv's own write does not count).
    o = torch.zeros(3)
    kv.pull('b', out=o)
    o[0] = 5
    with pytest.raises(pskv.UsageError, match=r"pull of key 'b'"):
        kv.wait_all()
    # pushpull in place: pskv writes the result into the value, which is no misuse.
    v = torch.ones(3)
    kv.pushpull('c', v)
    kv.wait('c')
    assert v.tolist() == [1, 1, 1]
    # Noticed when a later call releases the finished one: raised by the next wait.
    w = torch.ones(3)
    kv.push('c', w)
    w.mul_(3)
    for _ in range(200):  # bounded: the local push finishes at once
        kv.pull('b', out=np.zeros(3, np.float32))
    with pytest.raises(pskv.UsageError, match=r"push of key 'c'"):
        kv.wait('b')
    # Views (a flat bucket: another part of it changes) and inference tensors are
    # not watched: no false report, no error from the missing counter.
    flat = torch.zeros(6)
    kv.push('a', flat[:3])
    flat[3:].add_(1)
    with torch.inference_mode():
        inf = torch.zeros(3)
    kv.pull('b', out=inf)
    kv.wait_all()
