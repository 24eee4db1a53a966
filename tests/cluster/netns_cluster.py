#!/usr/bin/env python3
"""A cluster on one machine: N "hosts" as Linux network namespaces, joined by veth pairs
to one bridge per network, with per-interface rate limits (tc tbf), an sshd per host,
link cuts, and removal of everything it made.  Used by the cluster tests
(tests/cluster/test_cluster.py) and by benchmarks; docs/cluster-tests.md.

    with Cluster(hosts=4, networks={'slow': '100mbit', 'fast': '1gbit'}) as c:
        c.hosts[0].run(['ping', '-c1', c.hosts[1].addr('fast')])
        c.cut(3); c.restore(3)

Isolation: addresses 10.77.<network>.<host+1>/24 exist only inside the namespaces; the
bridges have no address and no real interface, the namespaces no default route: nothing
leaves the machine, and the root namespace's routing is untouched.

Cleanup: everything is named with a per-run prefix (`pc` + 6 hex digits) and recorded in
/run/pskv-cluster/<prefix>.json.  close() (also on an exception, SIGTERM or SIGINT) kills
every process in the namespaces and deletes namespaces, bridges, veths and the temporary
directory.  A reaper process (own session) does the same if the owner dies without
closing (SIGKILL, a CTest timeout), and `python3 netns_cluster.py cleanup` removes what
any dead run left behind.

Command line: `netns_cluster.py up [N]` (starts a cluster, prints it, waits for Ctrl-C),
`netns_cluster.py cleanup` (stale runs), `netns_cluster.py reap PREFIX OWNER_PID`.
"""
import atexit
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

STATE_DIR = '/run/pskv-cluster'
SUBNET = '10.77'
SSHD = '/usr/sbin/sshd'
PREFIX_RE = re.compile(r'^pc[0-9a-f]{6}$')


class Unavailable(Exception):
    """This machine cannot host the cluster (the message says why: for a pytest skip)."""


def why_unavailable():
    """None when a cluster can be made here, else the reason."""
    if os.geteuid() != 0:
        return 'needs root (network namespaces, veth, bridges, tc): run the cluster tests as root'
    for tool in ('ip', 'tc', 'ssh', 'ssh-keygen', 'rsync'):
        if not shutil.which(tool):
            return '`%s` not found: scripts/install-deps.sh --with-launchers' % tool
    if not os.access(SSHD, os.X_OK):
        return '%s not found: scripts/install-deps.sh --with-launchers (openssh-server)' % SSHD
    name = 'pcprobe%d' % os.getpid()
    r = subprocess.run(['ip', 'netns', 'add', name], capture_output=True, text=True)
    if r.returncode != 0:
        return 'cannot create a network namespace (%s)' % r.stderr.strip()
    r = subprocess.run(['ip', 'link', 'add', name[:15], 'type', 'bridge'], capture_output=True, text=True)
    subprocess.run(['ip', 'link', 'del', name[:15]], capture_output=True)
    subprocess.run(['ip', 'netns', 'del', name], capture_output=True)
    if r.returncode != 0:
        return 'cannot create a bridge (%s)' % r.stderr.strip()
    return None


def _sh(*argv, check=True):
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError('%s failed (%d): %s' % (' '.join(argv), r.returncode, r.stderr.strip()))
    return r.stdout


def _rate_bits(rate):
    m = re.fullmatch(r'(\d+(?:\.\d+)?)([kmg]?)bit', rate)
    if not m:
        raise ValueError("rate '%s': write it as tc does, e.g. 100mbit, 1gbit" % rate)
    return float(m.group(1)) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9}[m.group(2)]


class Host:
    """One namespace "host".  Its interfaces are named after the networks ('slow',
    'fast'); addr(net) is its IPv4 address there."""

    def __init__(self, cluster, index):
        self.cluster, self.index = cluster, index
        self.ns = '%s-h%d' % (cluster.prefix, index)
        self.sshd = None

    def addr(self, net=None):
        k = self.cluster.net_index(net)
        return '%s.%d.%d' % (SUBNET, k + 1, self.index + 1)

    def root_veth(self, net=None):
        """The bridge-side end of this host's cable on `net` (cut() takes it down)."""
        return '%sv%dn%d' % (self.cluster.prefix, self.index, self.cluster.net_index(net))

    def argv(self, argv):
        return ['ip', 'netns', 'exec', self.ns] + list(argv)

    def run(self, argv, **kw):
        kw.setdefault('capture_output', True)
        kw.setdefault('text', True)
        return subprocess.run(self.argv(argv), **kw)

    def popen(self, argv, **kw):
        return subprocess.Popen(self.argv(argv), **kw)

    def counters(self, net=None):
        """(rx_bytes, tx_bytes) of this host's interface on `net`, read inside the host."""
        out = json.loads(_sh('ip', '-n', self.ns, '-j', '-s', 'link', 'show', 'dev', net or self.cluster.nets[0]))
        st = out[0]['stats64']
        return st['rx']['bytes'], st['tx']['bytes']

    def netns_inode(self):
        return os.stat('/run/netns/' + self.ns).st_ino

    def pids(self):
        """Every process whose network namespace is this host's."""
        return [int(p) for p in _sh('ip', 'netns', 'pids', self.ns, check=False).split()]


class Cluster:
    """`hosts` namespaces on every network of `networks` ({name: rate or None}, in
    order; the first is the one ssh and host files use).  `hide`: paths that the
    processes started through a host's sshd see as empty private directories (a
    tmpfs each; relative paths are under the cluster's temporary directory): "pskv
    is not installed here", or a per-host disk."""

    def __init__(self, hosts=4, networks=None, sshd=True, hide=()):
        reason = why_unavailable()
        if reason:
            raise Unavailable(reason)
        cleanup_stale()
        self.networks = dict(networks or {'slow': None})
        self.nets = list(self.networks)
        for n in self.nets:
            if not re.fullmatch(r'[a-z][a-z0-9]{0,7}', n):
                raise ValueError("network name '%s': 1-8 lowercase letters/digits" % n)
        self.prefix = 'pc' + secrets.token_hex(3)
        self.tmp = tempfile.mkdtemp(prefix='pskv-cluster-%s-' % self.prefix)
        self.hosts = [Host(self, i) for i in range(hosts)]
        self.hide = [p if os.path.isabs(p) else os.path.join(self.tmp, p) for p in hide]
        self._closed = False
        self._reaper = None
        os.makedirs(STATE_DIR, exist_ok=True)
        self.state_file = os.path.join(STATE_DIR, self.prefix + '.json')
        with open(self.state_file, 'w') as f:
            json.dump({'owner': os.getpid(), 'tmp': self.tmp, 'hosts': hosts, 'nets': len(self.nets)}, f)
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                self._old[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the reaper still cleans up
                pass
        atexit.register(self.close)
        try:
            self._reaper = subprocess.Popen([sys.executable, os.path.abspath(__file__), 'reap', self.prefix,
                                             str(os.getpid())], start_new_session=True,
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)
            self._build()
            if sshd:
                self._start_sshd()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ set-up
    def net_index(self, net):
        return 0 if net is None else self.nets.index(net)

    def _build(self):
        for k, net in enumerate(self.nets):
            br = '%sb%d' % (self.prefix, k)
            _sh('ip', 'link', 'add', br, 'type', 'bridge')
            _sh('ip', 'link', 'set', br, 'up')
        for h in self.hosts:
            _sh('ip', 'netns', 'add', h.ns)
            _sh('ip', '-n', h.ns, 'link', 'set', 'lo', 'up')
            for k, net in enumerate(self.nets):
                outer = h.root_veth(net)
                _sh('ip', 'link', 'add', outer, 'type', 'veth', 'peer', 'name', net, 'netns', h.ns)
                _sh('ip', 'link', 'set', 'dev', outer, 'master', '%sb%d' % (self.prefix, k))
                _sh('ip', 'link', 'set', 'dev', outer, 'up')
                _sh('ip', '-n', h.ns, 'addr', 'add', h.addr(net) + '/24', 'dev', net)
                _sh('ip', '-n', h.ns, 'link', 'set', 'dev', net, 'up')
                rate = self.networks[net]
                if rate:
                    # Both directions: the host's egress on its interface, its ingress
                    # on the bridge-side end.  Bucket: 20 ms at the rate (>= 1 MTU+).
                    bits = _rate_bits(rate)
                    burst = str(max(int(bits / 8 / 50), 16000))
                    for dev_argv in (['ip', 'netns', 'exec', h.ns, 'tc'], ['tc']):
                        _sh(*dev_argv, 'qdisc', 'add', 'dev', net if len(dev_argv) > 1 else outer, 'root', 'tbf',
                            'rate', rate, 'burst', burst, 'latency', '100ms')

    def _start_sshd(self):
        d = self.tmp
        for k in ('host_key', 'user_key'):
            _sh('ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', os.path.join(d, k))
        shutil.copy(os.path.join(d, 'user_key.pub'), os.path.join(d, 'authorized_keys'))
        os.makedirs('/run/sshd', exist_ok=True)
        for h in self.hosts:
            cfg = os.path.join(d, 'sshd_config.%d' % h.index)
            with open(cfg, 'w') as f:
                f.write('Port 22\nListenAddress 0.0.0.0\nHostKey %s\nAuthorizedKeysFile %s\n'
                        'PermitRootLogin prohibit-password\nPasswordAuthentication no\n'
                        'KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n'
                        'MaxStartups 100\nMaxSessions 100\nAcceptEnv none\n'
                        % (os.path.join(d, 'host_key'), os.path.join(d, 'authorized_keys')))
            # `ip netns exec` gives sshd a mount namespace of its own (slave of the
            # root's), where the hidden paths become private tmpfs directories.
            mounts = ''.join('mkdir -p %s && mount -t tmpfs -o size=256m pskv-cluster %s && ' % (q(p), q(p))
                             for p in self.hide)
            h.sshd = h.popen(['sh', '-c', mounts + 'exec %s -D -e -f %s' % (SSHD, q(cfg))],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(d, 'sshd.%d.log' % h.index), 'w'))
        for h in self.hosts:
            end = time.time() + 15
            while not self._port_open(h):
                if h.sshd.poll() is not None or time.time() > end:
                    raise RuntimeError('sshd on %s did not start: %s' % (
                        h.ns, open(os.path.join(d, 'sshd.%d.log' % h.index)).read()))
                time.sleep(0.05)

    def _port_open(self, h):
        return h.run(['bash', '-c', 'exec 3<>/dev/tcp/%s/22' % h.addr()]).returncode == 0

    # ------------------------------------------------------------------ use
    def ssh_args(self):
        """ssh options that reach every host (for pskv-launch: --ssh-arg each)."""
        return ['-i', os.path.join(self.tmp, 'user_key'), '-o', 'UserKnownHostsFile=/dev/null', '-o', 'StrictHostKeyChecking=no',
                '-o', 'LogLevel=ERROR', '-o', 'ConnectTimeout=5']

    def launcher_ssh_args(self):
        out = []
        for a in self.ssh_args():
            out += ['--ssh-arg', a]
        return out

    def hostfile(self, hosts=None, net=None, path=None):
        """A host file naming `hosts` (default: all) by their address on `net`."""
        path = path or os.path.join(self.tmp, 'hosts')
        with open(path, 'w') as f:
            for h in (hosts or self.hosts):
                f.write(h.addr(net) + '\n')
        return path

    def host_of_inode(self, inode):
        for h in self.hosts:
            if h.netns_inode() == int(inode):
                return h
        return None

    def cut(self, i, net=None):
        """Pulls host i's cable on `net` (all networks when None): the bridge-side
        end goes down, the host keeps its address and sees no carrier."""
        for n in ([net] if net else self.nets):
            _sh('ip', 'link', 'set', 'dev', self.hosts[i].root_veth(n), 'down')

    def set_rate(self, i, rate, net=None):
        """Changes host i's rate limit on `net` (both directions, as built) mid-run:
        another job on the link, an operator's change."""
        n = net or self.nets[0]
        bits = _rate_bits(rate)
        burst = str(max(int(bits / 8 / 50), 16000))
        h = self.hosts[i]
        for dev_argv, dev in ((['ip', 'netns', 'exec', h.ns, 'tc'], n), (['tc'], h.root_veth(n))):
            _sh(*dev_argv, 'qdisc', 'change', 'dev', dev, 'root', 'tbf', 'rate', rate, 'burst', burst,
                'latency', '100ms')

    def restore(self, i, net=None):
        for n in ([net] if net else self.nets):
            _sh('ip', 'link', 'set', 'dev', self.hosts[i].root_veth(n), 'up')

    # ------------------------------------------------------------------ teardown
    def _on_signal(self, sig, frame):
        self.close()
        old = self._old.get(sig)
        if callable(old):
            old(sig, frame)
        raise SystemExit(128 + sig)

    def close(self):
        if self._closed:
            return
        self._closed = True
        for sig, old in self._old.items():
            try:
                signal.signal(sig, old)
            except (ValueError, TypeError):
                pass
        remove(self.prefix, len(self.hosts), len(self.nets), self.tmp)
        if self._reaper and self._reaper.poll() is None:
            self._reaper.kill()
            self._reaper.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def q(s):
    return "'" + str(s).replace("'", "'\\''") + "'"


def remove(prefix, hosts=None, nets=None, tmp=None):
    """Deletes everything of run `prefix`: processes in its namespaces, namespaces,
    bridges, veths, the temporary directory and the state file.  Idempotent."""
    assert PREFIX_RE.match(prefix), prefix
    names = [n.split()[0] for n in _sh('ip', 'netns', 'list', check=False).splitlines() if n.strip()]
    mine = [n for n in names if n.startswith(prefix + '-h')]
    for _ in range(2):  # SIGKILL every process in the namespaces (sshd, job leftovers)
        for ns in mine:
            for pid in _sh('ip', 'netns', 'pids', ns, check=False).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        time.sleep(0.05)
    for ns in mine:
        _sh('ip', 'netns', 'del', ns, check=False)
    links = json.loads(_sh('ip', '-j', 'link', 'show', check=False) or '[]')
    for link in links:
        if link.get('ifname', '').startswith(prefix):
            _sh('ip', 'link', 'del', link['ifname'], check=False)
    if tmp and os.path.basename(tmp).startswith('pskv-cluster-' + prefix):
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.unlink(os.path.join(STATE_DIR, prefix + '.json'))
    except OSError:
        pass


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cleanup_stale():
    """Removes the leftovers of runs whose owner process is gone."""
    if not os.path.isdir(STATE_DIR):
        return []
    done = []
    for f in os.listdir(STATE_DIR):
        prefix = f[:-5]
        if not (f.endswith('.json') and PREFIX_RE.match(prefix)):
            continue
        try:
            with open(os.path.join(STATE_DIR, f)) as fh:
                st = json.load(fh)
        except (OSError, ValueError):
            st = {}
        if st.get('owner') and _alive(int(st['owner'])):
            continue
        remove(prefix, tmp=st.get('tmp'))
        done.append(prefix)
    # Namespaces/links of our naming scheme with no state file at all (the state
    # directory was lost, e.g. /run was cleared): nobody can own them any more.
    owned = {f[:-5] for f in os.listdir(STATE_DIR)}
    names = [n.split()[0] for n in _sh('ip', 'netns', 'list', check=False).splitlines() if n.strip()]
    for n in names:
        m = re.match(r'^(pc[0-9a-f]{6})-h\d+$', n)
        if m and m.group(1) not in owned and m.group(1) not in done:
            remove(m.group(1))
            done.append(m.group(1))
    return done


def _reap(prefix, owner):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while _alive(owner):
        time.sleep(0.5)
    if os.path.exists(os.path.join(STATE_DIR, prefix + '.json')):
        with open(os.path.join(STATE_DIR, prefix + '.json')) as fh:
            st = json.load(fh)
        remove(prefix, tmp=st.get('tmp'))


def main(argv):
    if len(argv) >= 2 and argv[1] == 'cleanup':
        print('removed:', ' '.join(cleanup_stale()) or 'nothing')
        return 0
    if len(argv) == 4 and argv[1] == 'reap':
        _reap(argv[2], int(argv[3]))
        return 0
    if len(argv) >= 2 and argv[1] == 'up':
        n = int(argv[2]) if len(argv) > 2 else 4
        with Cluster(hosts=n, networks={'slow': '100mbit', 'fast': '1gbit'}) as c:
            for h in c.hosts:
                print(h.ns, ' '.join('%s=%s' % (net, h.addr(net)) for net in c.nets))
            print('ssh', ' '.join(c.ssh_args()), 'root@ADDR  (Ctrl-C removes the cluster)')
            sys.stdout.flush()
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
        return 0
    print(__doc__)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv))
