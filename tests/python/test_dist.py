"""Distributed checks from Python: 4 workers and 2 servers under pskv-launch."""
import os
import subprocess
import sys

import pytest

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')
HERE = os.path.dirname(os.path.abspath(__file__))


def launch(scenario, workers=4, servers=2, python_servers=False):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    cmd = [LAUNCH, '-n', str(workers), '-s', str(servers), '--timeout', '150',
           '--env', 'MXNET_KVSTORE_BIGARRAY_BOUND=1000']
    if python_servers:  # the servers run the same script: pskv.create() runs their role
        cmd += ['--server-command', '/usr/bin/python3 %s %s' % (os.path.join(HERE, 'dist_check.py'), scenario)]
    cmd += ['--', '/usr/bin/python3', os.path.join(HERE, 'dist_check.py'), scenario]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=200)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for w in range(workers):
        assert 'worker %d: %s passed' % (w, scenario) in out, out


@pytest.mark.parametrize('scenario', ['sync', 'sync_str', 'async', 'compression'])
def test_dist(scenario):
    launch(scenario)


def test_python_program_runs_the_server_role():
    launch('sync', workers=2, servers=2, python_servers=True)
