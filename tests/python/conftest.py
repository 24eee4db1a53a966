import os
import sys

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
sys.path.insert(0, os.path.join(BUILD, 'python'))


def launch_scenarios(script, scenarios, workers, delay_ms):
    """Runs tests/python/`script` as every worker of a dist job (1 server) whose server
    holds each reply `delay_ms` (PSKV_TEST_REPLY_DELAY), and checks that each worker
    printed 'worker R: SCENARIO passed' for every scenario (comma-separated)."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    cmd = [os.path.join(BUILD, 'pskv-launch'), '-n', str(workers), '-s', '1', '--timeout', '150',
           '--env', 'PSKV_TEST_REPLY_DELAY=%d' % delay_ms,
           # pskv-server with the fail points the PSKV_TEST_* variables drive
           # (tests/support/env_fail_points.h)
           '--server-command', 'exec ' + os.path.join(BUILD, 'pskv-test-server'),
           '--', '/usr/bin/python3', os.path.join(here, script), scenarios]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=200)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for w in range(workers):
        for s in scenarios.split(','):
            assert 'worker %d: %s passed' % (w, s) in out, out


def slow_store(kind='local', delay=0.05):
    """A store whose updater (w <- w + g) sleeps `delay` s first: a push stays in its
    engine for a while, so a call returning before its result landed is caught."""
    import time
    import pskv

    kv = pskv.create(kind)

    def slow_sum(key, recv, stored):
        time.sleep(delay)
        stored += recv
    kv.set_updater(slow_sum)
    return kv
