"""Multi-host tests on a cluster of network namespaces (netns_cluster.py): pskv-launch's
ssh launcher across 4 hosts, each with a rate-limited "slow" (100 Mbit/s, the one the
host file names) and "fast" (1 Gbit/s) network and its own sshd.  Real processes, real
sshd, real links; root only (skipped otherwise, with the reason)."""
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netns_cluster  # noqa: E402

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(HERE, '..', '..', 'build')))
LAUNCH = os.path.join(BUILD, 'pskv-launch')
SERVER = os.path.join(BUILD, 'pskv-server')
WORKER = os.path.join(HERE, 'cluster_worker.py')
PY = '/usr/bin/python3'
EQUIV = os.path.join(BUILD, 'tests', 'torch_equiv')


@pytest.fixture(scope='module')
def cluster():
    reason = netns_cluster.why_unavailable()
    if reason:
        pytest.skip('cluster tests: ' + reason)
    if not os.path.exists(LAUNCH):
        pytest.skip('build pskv-launch first')
    # opt/: "the launcher's own installation", absent on every host's sshd side;
    # local/: a private directory per host (each host its own disk there).
    with netns_cluster.Cluster(hosts=4, networks={'slow': '100mbit', 'fast': '1gbit'},
                               hide=['opt', 'local']) as c:
        yield c


def job_env(**kw):
    e = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'), OPENBLAS_NUM_THREADS='1',
             PATH='/usr/sbin:/usr/bin:/sbin:/bin')
    for k in ('DMLC_PS_ROOT_URI', 'DMLC_NODE_HOST', 'DMLC_INTERFACE', 'PSKV_SHM'):
        e.pop(k, None)
    e.update(kw)
    return e


def launch(c, args, hosts, launcher=LAUNCH, env=None, timeout=60, cwd=None, popen=False):
    """pskv-launch run on host 0 (the scheduler lives there) over ssh to `hosts`."""
    argv = [launcher, '-H', c.hostfile(hosts), '--timeout', str(timeout)] + c.launcher_ssh_args() + args
    kw = dict(env=env or job_env(), cwd=cwd or HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if popen:
        return c.hosts[0].popen(argv, **kw)
    return subprocess.run(c.hosts[0].argv(argv), timeout=timeout + 30, **kw)


def job_processes(c):
    """Processes in the cluster's namespaces other than the sshds (a finished job
    leaves none)."""
    out = []
    for h in c.hosts:
        for pid in h.pids():
            try:
                comm = open('/proc/%d/comm' % pid).read().strip()
                cmd = open('/proc/%d/cmdline' % pid, 'rb').read().replace(b'\0', b' ').decode()
            except OSError:
                continue
            if comm != 'sshd' and not cmd.startswith('sshd'):
                out.append((h.ns, pid, cmd))
    return out


def wait_for(cond, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_placement_follows_the_cycling_rule(cluster, tmp_path):
    """4 hosts, -s 3 -n 3: servers on hosts 0, 1, 2, workers on hosts 3, 0, 1 (MXNet's
    rule, "5 hosts and n = 3: servers on the first three hosts, workers on the fourth,
    fifth and first"), seen from inside each host; the job's sums are exact."""
    c = cluster
    rec = tmp_path / 'rec'
    rec.mkdir()
    p = launch(c, ['-n', '3', '-s', '3', '--env', 'PSKV_CLUSTER_REC=%s' % rec,
                   '--server-command', '%s %s serve' % (PY, WORKER), '--', PY, WORKER, 'sum', '1000', '3'],
               c.hosts)
    assert p.returncode == 0, p.stdout
    where = {}
    for f in os.listdir(rec):
        ino, addrs = open(rec / f).read().split('\n', 1)
        h = c.host_of_inode(ino)
        assert h is not None and h.addr('slow') in addrs, (f, ino, addrs)
        where[f[:-4]] = h.index
    # task ids: workers 0..n-1, servers n..n+S-1; the scheduler next to the launcher
    assert where == {'scheduler-x': 0, 'server-3': 0, 'server-4': 1, 'server-5': 2,
                     'worker-0': 3, 'worker-1': 0, 'worker-2': 1}, where
    assert p.stdout.count('all sums exact') == 3, p.stdout


def install_copy(c):
    """pskv-launch and pskv-server copied to a directory no host has (opt/ is hidden)."""
    opt = os.path.join(c.tmp, 'opt')
    os.makedirs(opt, exist_ok=True)
    for f in ('pskv-launch', 'pskv-server'):
        shutil.copy2(os.path.join(BUILD, f), opt)
    return os.path.join(opt, 'pskv-launch')


def test_hosts_without_pskv_at_the_launchers_path(cluster, tmp_path):
    """The launcher's own pskv-server path does not exist on the hosts: a clear error
    by default; --sync-dst-dir copies pskv-server (and libpskv) with the job into each
    host's own directory; --remote-server names the hosts' installation."""
    c = cluster
    launcher = install_copy(c)
    hosts = c.hosts[1:3]
    p = launch(c, ['-n', '1', '-s', '1', '--', PY, WORKER, 'sum', '100', '2'], hosts, launcher=launcher,
               timeout=30)
    assert p.returncode == 127, p.stdout
    assert 'has no pskv-server at %s/opt/pskv-server' % c.tmp in p.stdout, p.stdout
    assert '--sync-dst-dir' in p.stdout and '--remote-server' in p.stdout, p.stdout

    src = tmp_path / 'src'
    src.mkdir()
    (src / 'data.txt').write_text('synced')
    dst = os.path.join(c.tmp, 'local', 'job')  # a private directory on every host
    check = 'test "$(cat data.txt)" = synced && test -x .pskv/pskv-server && exec %s %s sum 1000 3' % (PY, WORKER)
    p = launch(c, ['-n', '2', '-s', '2', '--sync-dst-dir', dst, '--', 'sh', '-c', check], hosts,
               launcher=launcher, cwd=str(src))
    assert p.returncode == 0, p.stdout
    assert p.stdout.count('all sums exact') == 2, p.stdout
    assert not os.path.exists(dst), 'the job was synced to the shared disk, not to the hosts'

    p = launch(c, ['-n', '2', '-s', '1', '--remote-server', SERVER, '--', PY, WORKER, 'sum', '1000', '2'],
               hosts, launcher=launcher)
    assert p.returncode == 0, p.stdout


def counters(c, hosts, net):
    return sum(h.counters(net)[1] for h in hosts)


@pytest.mark.parametrize('case', ['default', 'interface', 'interface_shm_forced'])
def test_data_takes_the_chosen_network(cluster, case):
    """Without DMLC_INTERFACE the data travels on the network the host file names
    (slow); DMLC_INTERFACE=fast moves it to the fast one; and shared memory is never
    used between hosts, even when forced (PSKV_SHM=1): the bytes are on the link.
    Measured by the interfaces' byte counters inside the worker hosts."""
    c = cluster
    hosts = c.hosts[1:4]  # server on host 1, workers on hosts 2 and 3
    elements, rounds = 500_000, 5  # 2 MB a push and a pull, per worker and round
    extra = {} if case == 'default' else {'DMLC_INTERFACE': 'fast'}
    if case == 'interface_shm_forced':
        extra['PSKV_SHM'] = '1'
    workers = c.hosts[2:4]
    before = {n: counters(c, workers, n) for n in c.nets}
    p = launch(c, ['-n', '2', '-s', '1', '--', PY, WORKER, 'sum', str(elements), str(rounds)], hosts,
               env=job_env(**extra))
    assert p.returncode == 0, p.stdout
    sent = {n: counters(c, workers, n) - before[n] for n in c.nets}
    volume = 2 * elements * 4 * rounds  # what the two workers push, at least
    chosen, other = ('slow', 'fast') if case == 'default' else ('fast', 'slow')
    assert sent[chosen] >= volume, sent
    assert sent[other] < volume / 10, sent


@pytest.mark.parametrize('weights', ['balanced', 'auto'])
def test_big_keys_follow_the_link_balanced_shares(cluster, weights):
    """3 workers and 4 servers on 4 hosts (workers on hosts 0-2, host 3 serves only):
    with PSKV_SERVER_WEIGHTS=balanced a big key is split 0.2 to each co-located
    server and 0.4 to host 3's, so every host link carries 1.2 M each way per
    push+pull of M bytes (the bound). By default (auto) a layout whose co-located
    servers would keep a share is split evenly (measured faster: docs/performance.md):
    host 3's link carries 0.75 M and a worker host's 1.25 M. Measured by the byte
    counters of the fast network."""
    c = cluster
    elements, rounds = 2_000_000, 4  # 8 MB: above MXNET_KVSTORE_BIGARRAY_BOUND
    m = elements * 4
    before = [h.counters('fast') for h in c.hosts]
    p = launch(c, ['-n', '3', '-s', '4', '--', PY, WORKER, 'sum', str(elements), str(rounds)], c.hosts,
               env=job_env(DMLC_INTERFACE='fast', PSKV_SERVER_WEIGHTS=weights))
    assert p.returncode == 0, p.stdout
    after = [h.counters('fast') for h in c.hosts]
    rx = [(a[0] - b[0]) / (m * rounds) for a, b in zip(after, before)]
    tx = [(a[1] - b[1]) / (m * rounds) for a, b in zip(after, before)]
    # Hosts 1 and 2 run one worker and one server each; rank 0 (host 0) also pushes the
    # initial value once. Headers and acknowledgements add a few per cent everywhere:
    # the ratio host 3 / worker host shows the split (balanced 1.0, even 0.6).
    want_server, want_worker = (1.2, 1.2) if weights == 'balanced' else (0.75, 1.25)
    for got, want in ((tx[3], want_server), (tx[1], want_worker), (tx[2], want_worker)):
        assert 0.97 * want < got < 1.15 * want, (weights, tx, rx)
    for three, one in ((tx[3], tx[1]), (rx[3], rx[1]), (tx[3], tx[2])):
        assert abs(three / one - want_server / want_worker) < 0.1, (weights, tx, rx)


def test_link_rate_is_learned_within_20_percent_of_the_limit(cluster):
    """By default (PSKV_LINK_RATE unset) the nodes learn the host links' rate from their
    paced connections' TCP_INFO (src/kvstore/distributed/link_pacing.h), share it
    through the heartbeats (src/ps/link_rate_share.h) and log both (PS_VERBOSE=1). 4
    workers and 4 servers on the 4 hosts' 100 Mbit/s network (tc tbf, 12.5 MB/s; one
    TCP stream's payload about 12.2 MB/s), a few seconds of push+pulls of 16 MB: every
    worker's last estimate, and the job's rate every node paces at, within 20 % of the
    limit."""
    import re
    c = cluster
    elements, rounds = 4_000_000, 8
    p = launch(c, ['-n', '4', '-s', '4', '--', PY, WORKER, 'sum', str(elements), str(rounds)], c.hosts,
               env=job_env(PS_VERBOSE='1'), timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    last, job = {}, {}
    # "worker[1]: link rate learned N B/s, the job's M B/s" when it moves, "link pacing:
    # ... estimate N B/s, the job's M B/s" every second.
    for node, rate, shared in re.findall(
            r'(\w+\[\d+\]): (?:link rate learned|link pacing: [^\n]* estimate) (\d+) B/s, the job\'s (\d+) B/s',
            p.stdout):
        last[node] = int(rate)
        if int(shared) > 0:
            job[node] = int(shared)
    workers = {k: v for k, v in last.items() if k.startswith('worker')}
    assert len(workers) == 4, (last, p.stdout[-3000:])
    for node, rate in last.items():
        assert 0.8 * 12.5e6 < rate < 1.2 * 12.5e6, (node, last)
    assert len(job) >= 4, (job, p.stdout[-3000:])
    for node, rate in job.items():
        assert 0.8 * 12.5e6 < rate < 1.2 * 12.5e6, (node, job)


def test_link_cut_fails_every_process_naming_the_node(cluster, tmp_path):
    """A worker host's cable is pulled mid-job: every process ends with an error that
    names the unreachable node within PS_HEARTBEAT_TIMEOUT + PS_HEARTBEAT_INTERVAL (+
    the launcher's 3 s stop grace and start-up slack), and no process of the job is
    left on any host."""
    c = cluster
    hosts = c.hosts[1:4]  # server on host 1; workers 0, 1, 2 on hosts 2, 3, 1
    marks = tmp_path / 'marks'
    marks.mkdir()
    interval, timeout = 1, 3
    cmd = 'set -o pipefail; %s %s loop 2>&1 | tee %s/out-$DMLC_TASK_ID.txt' % (PY, WORKER, tmp_path)
    p = launch(c, ['-n', '3', '-s', '1', '--env', 'PSKV_TEST_MARKER_DIR=%s' % marks, '--', 'bash', '-c', cmd],
               hosts, env=job_env(PS_HEARTBEAT_INTERVAL=str(interval), PS_HEARTBEAT_TIMEOUT=str(timeout)),
               popen=True, timeout=100)
    try:
        assert wait_for(lambda: len(os.listdir(marks)) == 3, 40), 'workers did not start'
        time.sleep(0.3)
        t0 = time.time()
        c.cut(3)
        out, _ = p.communicate(timeout=timeout + interval + 3 + 10)
        took = time.time() - t0
        gone = wait_for(lambda: not job_processes(c), 15)
        left = job_processes(c)
        gone_after = time.time() - t0
    finally:
        c.restore(3)
        if p.poll() is None:
            p.kill()
    cut_addr = c.hosts[3].addr('slow')
    assert p.returncode != 0, out
    assert took < timeout + interval + 3 + 6, (took, out)
    # the processes the launcher hears from name the lost worker (host 3's address)
    for name in ('scheduler', 'server 0', 'worker 0', 'worker 2'):
        lines = [l for l in out.splitlines() if ('[%s]' % name) in l and cut_addr in l]
        assert lines or ('[%s]' % name) not in out or name == 'scheduler', (name, out)
    assert any('[worker 0]' in l and 'NodeFailure' in l and cut_addr in l for l in out.splitlines()), out
    # the lost worker itself (its output stays on its host) names the scheduler it lost
    lost = (tmp_path / 'out-1.txt').read_text()
    assert 'NodeFailure' in lost and 'scheduler' in lost, lost
    assert gone and not left, (gone_after, left)
    assert gone_after < timeout + interval + 15, gone_after


def test_short_cut_heals_and_the_job_finishes_exactly(cluster, tmp_path):
    """A 2 s cut within PS_HEARTBEAT_TIMEOUT (6 s): nobody is declared dead, TCP
    retransmits, and every round's sum is still exact."""
    c = cluster
    hosts = c.hosts[1:3]  # server on host 1, workers on hosts 2 and 1
    marks = tmp_path / 'marks'
    marks.mkdir()
    p = launch(c, ['-n', '2', '-s', '1', '--env', 'PSKV_TEST_MARKER_DIR=%s' % marks, '--',
                   PY, WORKER, 'sum', '1000', '1', '7'], hosts,
               env=job_env(PS_HEARTBEAT_INTERVAL='1', PS_HEARTBEAT_TIMEOUT='6'), popen=True)
    try:
        assert wait_for(lambda: len(os.listdir(marks)) == 2, 40), 'workers did not start'
        time.sleep(1)
        c.cut(2)
        time.sleep(2)
        c.restore(2)
        out, _ = p.communicate(timeout=60)
    finally:
        c.restore(2)
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out
    assert out.count('all sums exact') == 2, out
    assert wait_for(lambda: not job_processes(c), 10), job_processes(c)


def read_floats(path):
    import numpy as np
    return np.fromfile(path, dtype=np.float32)


@pytest.mark.skipif(not os.path.exists(EQUIV), reason='torch_equiv not built (PSKV_BUILD_TORCH=OFF)')
@pytest.mark.skipif(not os.path.isdir('/usr/share/datasets/fashion-mnist'), reason='no Fashion-MNIST')
def test_dist_sync_across_hosts_equals_one_process_with_n_times_the_batch(cluster, tmp_path):
    """MXNet's promise across hosts: 2 workers on 2 hosts with batch b, servers on
    other hosts, end with the weights of one process with batch 2b (6 SGD steps)."""
    c = cluster
    single, dist = str(tmp_path / 'single'), str(tmp_path / 'dist')
    r = subprocess.run([EQUIV, single, 'local', '1', '32', '6', '1'], env=job_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    p = launch(c, ['-n', '2', '-s', '2', '--', EQUIV, dist, 'dist_sync', '1', '16', '6', '1'], c.hosts[1:4],
               timeout=120)
    assert p.returncode == 0, p.stdout
    a, b = read_floats(single), read_floats(dist)
    assert a.size == b.size and a.size > 50000
    assert abs(a - b).max() < 2e-5, abs(a - b).max()


def test_harness_removes_everything_on_sigterm_and_sigkill(tmp_path):
    """A cluster's owner killed by SIGTERM (handler) or SIGKILL (the reaper): no
    namespace, link, state file or temporary directory of it remains."""
    reason = netns_cluster.why_unavailable()
    if reason:
        pytest.skip('cluster tests: ' + reason)
    script = ('import sys, time; sys.path.insert(0, %r); import netns_cluster as n\n'
              'c = n.Cluster(hosts=2, networks={"a": "10mbit", "b": None})\n'
              'print(c.prefix, c.tmp, flush=True); time.sleep(60)\n' % HERE)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True)
        prefix, tmp = p.stdout.readline().split()
        assert any(l.startswith(prefix) for l in subprocess.run(['ip', 'netns', 'list'], capture_output=True,
                                                                 text=True).stdout.splitlines())
        p.send_signal(sig)
        p.wait(timeout=10)

        def clean():
            ns = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
            links = subprocess.run(['ip', 'link'], capture_output=True, text=True).stdout
            return (prefix not in ns and prefix not in links and not os.path.exists(tmp)
                    and not os.path.exists(os.path.join(netns_cluster.STATE_DIR, prefix + '.json')))
        assert wait_for(clean, 10), (sig, prefix)
