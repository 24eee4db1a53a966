"""pskv-launch over ssh (an sshd of the test's own on 127.0.0.1 with generated keys),
under Open MPI's mpirun and under SLURM (a one-node cluster of the test's own), for
real on this host."""
import os
import shutil
import signal
import socket
import subprocess
import time
import sys
import uuid

import pytest

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')
WORKER = os.path.join(BUILD, 'tests', 'dist_worker')


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pids_with_env(needle):
    """Live pids whose environment contains needle (by pid list, not by name)."""
    out = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open('/proc/%s/environ' % pid, 'rb') as f:
                if needle.encode() in f.read().split(b'\0'):
                    out.append(int(pid))
        except OSError:
            pass
    return out


def wait_for(cond, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture
def sshd(tmp_path):
    if not shutil.which('sshd') and not os.path.exists('/usr/sbin/sshd'):
        pytest.skip('openssh-server not installed')
    os.makedirs('/run/sshd', exist_ok=True)
    for k in ('host_key', 'user_key'):
        subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', str(tmp_path / k)], check=True)
    shutil.copy(tmp_path / 'user_key.pub', tmp_path / 'authorized_keys')
    port = free_port()
    (tmp_path / 'sshd_config').write_text(
        'Port %d\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin prohibit-password\n'
        'PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile %s\n'
        % (port, tmp_path / 'host_key', tmp_path / 'authorized_keys', tmp_path / 'sshd.pid'))
    proc = subprocess.Popen(['/usr/sbin/sshd', '-D', '-e', '-f', str(tmp_path / 'sshd_config')],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            socket.create_connection(('127.0.0.1', port), timeout=0.2).close()
            return True
        except OSError:
            return False
    assert wait_for(up, 10), 'sshd did not start'
    (tmp_path / 'hosts').write_text('127.0.0.1:%d\n' % port)
    ssh_args = []
    for a in ['-i', str(tmp_path / 'user_key'), '-o', 'UserKnownHostsFile=/dev/null', '-o', 'LogLevel=ERROR']:
        ssh_args += ['--ssh-arg', a]
    yield tmp_path, ssh_args
    proc.terminate()
    proc.wait(timeout=10)


def env():
    return dict(os.environ, DMLC_PS_ROOT_URI='127.0.0.1')  # only loopback is touched


def test_ssh_job_with_sync_dst_dir(sshd, tmp_path):
    d, ssh_args = sshd
    src = tmp_path / 'src'
    src.mkdir()
    (src / 'data.txt').write_text('synced')
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '2', '-H', str(d / 'hosts'), '--sync-dst-dir', str(tmp_path / 'dst'),
                        '--timeout', '100'] + ssh_args + ['--', WORKER, 'sync', '2'],
                       cwd=str(src), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=150)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert '[worker 0] worker 0: all checks passed' in out and '[worker 1] worker 1: all checks passed' in out
    assert (tmp_path / 'dst' / 'data.txt').read_text() == 'synced'


def test_ssh_sigterm_leaves_no_remote_process(sshd, tmp_path):
    d, ssh_args = sshd
    tag = 'PSKV_TEST_TAG=ssh_%s' % uuid.uuid4().hex
    markers = tmp_path / 'markers'
    markers.mkdir()
    p = subprocess.Popen([LAUNCH, '-n', '2', '-s', '1', '-H', str(d / 'hosts'), '--env', tag,
                          '--env', 'PSKV_TEST_MARKER_DIR=%s' % markers] + ssh_args + ['--', WORKER, 'loop_until_failure'],
                         env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: len(os.listdir(markers)) == 2, 60), 'workers did not start'
    assert len(pids_with_env(tag)) >= 4
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=15) == 128 + signal.SIGTERM
    assert wait_for(lambda: not pids_with_env(tag), 10), pids_with_env(tag)


def test_ssh_failing_worker_stops_the_job(sshd):
    d, ssh_args = sshd
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '1', '-H', str(d / 'hosts'), '--timeout', '100'] + ssh_args +
                       ['--', WORKER, 'exit3'], env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=150)
    assert p.returncode == 3, p.stdout.decode()


@pytest.mark.skipif(not shutil.which('mpirun'), reason='openmpi-bin not installed')
def test_mpi_job():
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '2', '--launcher', 'mpi', '--timeout', '100', '--',
                        WORKER, 'sync', '2'], env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=150)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert out.count('all checks passed') == 2


@pytest.mark.skipif(not shutil.which('mpirun'), reason='openmpi-bin not installed')
def test_mpi_failing_worker_stops_the_job():
    tag = 'PSKV_TEST_TAG=mpi_%s' % uuid.uuid4().hex
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '1', '--launcher', 'mpi', '--timeout', '100', '--env', tag, '--',
                        WORKER, 'exit3'], env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=150)
    assert p.returncode != 0, p.stdout.decode()
    assert wait_for(lambda: not pids_with_env(tag), 10)


@pytest.fixture
def slurm(tmp_path):
    """A one-node SLURM cluster of the test's own (munged, slurmctld, slurmd)."""
    for tool in ('munged', 'slurmctld', 'slurmd', 'srun'):
        if not shutil.which(tool) and not os.path.exists('/usr/sbin/' + tool):
            pytest.skip('slurm-wlm / munge not installed')
    procs = []
    os.makedirs('/run/munge', exist_ok=True)
    if subprocess.run('munge -n | unmunge', shell=True, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode != 0:
        procs.append(subprocess.Popen(['/usr/sbin/munged', '-F', '--force'], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        assert wait_for(lambda: subprocess.run('munge -n | unmunge', shell=True, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL).returncode == 0, 10), 'munged'
    for sub in ('spool', 'state'):
        (tmp_path / sub).mkdir()
    host = socket.gethostname()
    conf = tmp_path / 'slurm.conf'
    conf.write_text('\n'.join([
        'ClusterName=pskvtest', 'SlurmctldHost=%s(127.0.0.1)' % host,
        'SlurmctldPort=%d' % free_port(), 'SlurmdPort=%d' % free_port(), 'AuthType=auth/munge',
        'ProctrackType=proctrack/linuxproc', 'TaskPlugin=task/none', 'SelectType=select/cons_tres',
        'SelectTypeParameters=CR_Core', 'ReturnToService=2', 'SlurmUser=root',
        'SlurmdSpoolDir=%s' % (tmp_path / 'spool'), 'StateSaveLocation=%s' % (tmp_path / 'state'),
        'SlurmctldPidFile=%s' % (tmp_path / 'ctld.pid'), 'SlurmdPidFile=%s' % (tmp_path / 'slurmd.pid'),
        'JobAcctGatherType=jobacct_gather/none',
        'NodeName=%s NodeAddr=127.0.0.1 CPUs=%d State=UNKNOWN' % (host, os.cpu_count() or 1),
        'PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8', '']))
    e = dict(os.environ, SLURM_CONF=str(conf))
    for daemon in ('slurmctld', 'slurmd'):
        procs.append(subprocess.Popen(['/usr/sbin/' + daemon, '-D', '-f', str(conf)], env=e,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    ready = wait_for(lambda: b'idle' in subprocess.run(['sinfo', '-h', '-o', '%T'], env=e,
                                                        stdout=subprocess.PIPE).stdout, 30)
    try:
        assert ready, 'the one-node SLURM cluster did not come up'
        yield e
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_slurm_job(slurm):
    e = dict(slurm, DMLC_PS_ROOT_URI='127.0.0.1')
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '1', '--launcher', 'slurm', '--timeout', '120', '--',
                        WORKER, 'sync', '2'], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert out.count('all checks passed') == 2


FAILOVER_WORKER = os.path.join(BUILD, 'tests', 'failover_worker')
TEST_SERVER = os.path.join(BUILD, 'pskv-test-server')


def failover_job(tmp_path, name, env, extra=(), kill_server=False):
    """The failover worker's replicated job (as tests/distributed/test_failover_launch.cc):
    2 workers, 2 servers, PSKV_REPLICAS=1, 12 rounds; with kill_server, one server
    process killed (SIGKILL) after round 4. Returns (exit status, output, weights)."""
    d = tmp_path / name
    d.mkdir()
    tag = 'PSKV_TEST_TAG=failover_%s_%s' % (name, uuid.uuid4().hex)
    args = [LAUNCH, '-n', '2', '-s', '2', '--timeout', '150', '--env', tag, '--env', 'PSKV_REPLICAS=1',
            '--env', 'MXNET_KVSTORE_BIGARRAY_BOUND=1000', '--env', 'PSKV_WIRE_CHUNK_BYTES=262144',
            '--env', 'PSKV_TEST_REPLY_DELAY=30', '--server-command', 'exec ' + TEST_SERVER] + list(extra)
    log = tmp_path / (name + '.out')
    with open(log, 'wb') as out:
        p = subprocess.Popen(args + ['--', FAILOVER_WORKER, '12', str(d)], env=env, stdout=out,
                             stderr=subprocess.STDOUT)
    try:
        if kill_server:
            assert wait_for(lambda: (d / 'w0.r4').exists(), 90), log.read_text()

            def servers():  # the server processes themselves (not srun, not slurmstepd)
                out = []
                for pid in pids_with_env(tag):
                    try:
                        exe = os.readlink('/proc/%d/exe' % pid)
                        with open('/proc/%d/environ' % pid, 'rb') as f:
                            role = b'DMLC_ROLE=server' in f.read().split(b'\0')
                    except OSError:
                        continue
                    if role and os.path.basename(exe) == 'pskv-test-server':
                        out.append(pid)
                return sorted(out)
            assert len(servers()) == 2, log.read_text()
            os.kill(servers()[1], signal.SIGKILL)
        status = p.wait(timeout=200)
    finally:
        if p.poll() is None:
            p.kill()
    assert wait_for(lambda: not pids_with_env(tag), 15), 'processes of the job outlived the launcher'
    weights = [(d / ('w%d.weights' % w)).read_bytes() if (d / ('w%d.weights' % w)).exists() else b''
               for w in range(2)]
    return status, log.read_text(), weights


def test_slurm_server_killed(slurm, tmp_path):
    """Each server is an srun step of its own (issue 42, hole 1): a killed server ends
    only its step, and the replicated job ends with exit status 0 and the weights of
    the undisturbed job (run by the local launcher)."""
    status, out, want = failover_job(tmp_path, 'undisturbed', env())
    assert status == 0, out
    assert want[0] and want[0] == want[1]
    e = dict(slurm, DMLC_PS_ROOT_URI='127.0.0.1')
    status, out, got = failover_job(tmp_path, 'slurm', e, ['--launcher', 'slurm'], kill_server=True)
    assert status == 0, out
    assert 'the job goes on without it' in out, out
    assert 'surviving the loss of server' in out, out
    assert got == want, "the final weights differ from the undisturbed job's"


def test_python_traceback_printed_once_and_summary(tmp_path):
    """A worker's Python traceback appears once in the launcher's output (forwarded,
    not repeated in the failure report); the headline and the summary name it."""
    script = tmp_path / 'fail.py'
    script.write_text('import os, sys\n'
                      'if os.environ["DMLC_TASK_ID"] == "1":\n'
                      '    raise RuntimeError("boom from worker one")\n')
    p = subprocess.run([LAUNCH, '-n', '2', '-s', '1', '--timeout', '60', '--env', 'PSKV_REGISTER_TIMEOUT=5', '--',
                        sys.executable, str(script)], env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=90)
    out = p.stdout.decode()
    assert p.returncode == 1, out
    assert out.count('Traceback (most recent call last)') == 1, out
    assert out.count('RuntimeError: boom from worker one') == 1, out
    assert 'pskv-launch: worker 1 (pid' in out and 'exited with status 1' in out, out
    assert 'job FAILED (exit status 1)' in out, out
