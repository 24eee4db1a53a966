#!/usr/bin/python3
"""Dense push+pull across namespace "hosts" against the parameter-server bound, and
against PyTorch DDP (gloo ring all-reduce) on the same hosts and links. Needs root
(tests/cluster/netns_cluster.py builds the cluster).

For n workers, k extra server hosts (k = 0: a server on every worker host) and links
of rate B, a step moving a model of M bytes (every worker pushes M and pulls M) takes
at least

    t_opt = 2 n (n - 1) M / ((n^2 + k n - 2 k) B)        (k = 0: 2 (n - 1) M / (n B),
                                                          all-reduce's bound)

which pskv reaches only with a split of big keys that gives the extra hosts' servers
more (PSKV_SERVER_WEIGHTS=balanced, src/kvstore/distributed/server_shares.h; the
default, auto, uses them only where k >= n and the even split, measured beside, otherwise);
an even split's bound is t_even. B is measured in the same run (one TCP stream
between two hosts through the rate limit). Each k is a fresh cluster of n + k hosts
on one rate-limited network; pskv runs under pskv-launch over ssh with a server on
every host (workers on hosts 0 .. n-1 by the cycling rule, the k extra hosts serve
only), DDP with n processes on the worker hosts. Every configuration runs --repeat
jobs (median and range of their median steps); each row also gives the machine's CPU
busy fraction during the steps (2 cores for all the hosts: near 1.0, the cores are
the limit, not the links) and the bytes each host link carried per step.

CPU per byte moved (issue 40 item 2; docs/performance.md, "CPU cost per byte at 1
Gbit/s"), fields of every grid row: `cpu_s_per_step`, the whole machine's CPU-seconds
per step (user + nice + system + irq + softirq jiffies of /proc/stat between worker 0's
first and last timed step; idle, iowait and steal left out; one kernel runs every
namespace, so both ends of every link, the bridge and the rate limiters are in it);
`cpu_ns_per_byte`, that per byte moved, counted as 2 n M per step (every worker pushes
M and pulls M: the job's work, the same for every layout); `cpu_ns_per_link_byte`, per
byte the host links carried (the whole job's tx / (steps + 1)); `memcpy_ns_per_byte`,
one thread's libc memcpy of 64 MiB measured in the same run (median, before and after
the jobs); `cpu_per_byte_memcpys` and `cpu_per_link_byte_memcpys`, the ratios: a byte
moved costs that many memcpys of it; `cpu_ns_per_byte_runs` per job; `cpu_split` (user,
system, irq, softirq shares); `context_switches_per_mb` (/proc/stat ctxt per MB of
2 n M). `--profile DIR` adds one job under `perf record -a -g` of the timed steps only
(DIR/RATE-kK-SIZE.perf.data; SCALING_PERF_CALLGRAPH=dwarf,16384 for callers of libc)
and `cpu_profile`: its split by bench/cluster/cpu_breakdown.py. bench/cluster/cpu_ab.py
alternates before/after builds or variables in one cluster.

--servers-series S1,S2,.. adds the seed's O(m/n) claim: n workers on their own hosts
and S servers on S other hosts (bound max(1, n/S) M/B), step time against S.

    bench/cluster/scaling.py [--workers 4] [--servers 0,2,4] [--sizes 4MB,64MB]
        [--rates 100mbit,1gbit] [--steps 3] [--repeat 3] [--ddp [--ddp-at 0,4]]
        [--even-repeat N] [--servers-series 1,2,4] [--profile DIR] [--json] [--out FILE]

`make bench-cluster` runs the whole set into bench/results/cluster_scaling.json and
plots it (bench/plot.py: docs/img/cluster_scaling.png, cluster_servers.png).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, 'tests', 'cluster'))
import netns_cluster  # noqa: E402


def build_dir():
    return os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))


def env(**kw):
    e = dict(os.environ, PYTHONPATH=os.path.join(build_dir(), 'python'), OPENBLAS_NUM_THREADS='1',
             OMP_NUM_THREADS='1', PATH='/usr/sbin:/usr/bin:/sbin:/bin')
    for k in ('DMLC_PS_ROOT_URI', 'DMLC_NODE_HOST', 'DMLC_INTERFACE', 'PSKV_SHM'):
        e.pop(k, None)
    e.update(kw)
    return e


def bulk_receiver(host, port):
    """A process on `host` that counts the bytes of one TCP connection to `port` and
    prints "N SECONDS" when it closes; returned once it listens."""
    p = host.popen(['/usr/bin/python3', '-c', (
        'import socket,time\n'
        's=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n'
        's.bind(("0.0.0.0", %d)); s.listen(1); print("up", flush=True); a,_=s.accept(); n=0; t=time.time()\n'
        'while True:\n'
        '    b=a.recv(1<<20)\n'
        '    if not b: break\n'
        '    n+=len(b)\n'
        'print(n, time.time()-t, flush=True)\n') % port], stdout=subprocess.PIPE, text=True)
    p.stdout.readline()  # "up": listening
    return p


def link_rate(c, nbytes=8 << 20):
    """Bytes/s of one TCP stream from host 1 to host 0 through the rate limit."""
    port = 5999
    server = bulk_receiver(c.hosts[0], port)
    t = c.hosts[1].run(['/usr/bin/python3', '-c', (
        'import socket,time\n'
        's=socket.create_connection(("%s", %d)); buf=b"x"*(1<<20); t=time.perf_counter()\n'
        'for _ in range(%d): s.sendall(buf)\n'
        's.shutdown(socket.SHUT_WR); s.recv(1); print(time.perf_counter()-t)\n')
        % (c.hosts[0].addr(), port, nbytes >> 20)], timeout=600)
    server.wait(60)
    if t.returncode != 0:
        raise SystemExit('link rate probe failed: ' + t.stderr[-500:])
    return nbytes / float(t.stdout.strip())


WORKER = r'''
import json, os, sys, time
import numpy as np
import pskv
pskv.configure_process(tune_allocator=True)  # as the examples: the allocator for big arrays
kv = pskv.create('dist_sync')
if os.environ.get('DMLC_ROLE', 'worker') != 'worker':
    sys.exit(0)
elems, steps = int(sys.argv[1]), int(sys.argv[2])
g = np.ones(elems, np.float32)
w = np.zeros(elems, np.float32)
kv.init(0, w)
kv.pushpull(0, g, out=w)  # warm-up: connections, buffers


def jiffies():  # /proc/stat (one kernel for all the hosts): the cpu line (user nice system idle iowait irq softirq steal ...), then ctxt
    lines = open('/proc/stat').read().splitlines()
    return [int(x) for x in lines[0].split()[1:]] + \
        [int(x.split()[1]) for x in lines if x.startswith('ctxt ')]


times = []
marks = os.environ.get('SCALING_MARKS')  # rank 0 touches MARKS.start, then MARKS.<step> after each step
j0 = jiffies()
t0 = time.perf_counter()
if marks and kv.rank == 0:
    open('%s.start' % marks, 'w').close()
for i in range(steps):
    kv.barrier()
    t = time.perf_counter()
    kv.pushpull(0, g, out=w)
    times.append(time.perf_counter() - t)
    if marks and kv.rank == 0:
        open('%s.%d' % (marks, i + 1), 'w').close()
t1 = time.perf_counter()
j1 = jiffies()
d = [b - a for a, b in zip(j0[:-1], j1[:-1])]  # the cpu line's jiffies of the steps
assert float(w[0]) == kv.num_workers and float(w[-1]) == kv.num_workers, (w[0], w[-1])
if kv.rank == 0:
    busy = (sum(d) - d[3] - d[4]) / max(1, sum(d))  # idle and iowait are not busy
    print('RESULT ' + json.dumps([sorted(times)[len(times) // 2], busy]), flush=True)
    print('STEPS ' + json.dumps(times), flush=True)
    print('CPU ' + json.dumps({'jiffies': d, 'ctxt': j1[-1] - j0[-1],
                               'hz': os.sysconf('SC_CLK_TCK'),
                               'wall_s': t1 - t0, 'cores': os.cpu_count()}), flush=True)
kv.close()
'''

DDP = r'''
import json, os, sys, time, torch, torch.distributed as dist
dist.init_process_group('gloo', init_method='tcp://%s:29500' % os.environ['MASTER'],
                        rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD']))
elems, steps = int(sys.argv[1]), int(sys.argv[2])
t = torch.ones(elems)
dist.all_reduce(t)


def cpu():
    f = [int(x) for x in open('/proc/stat').readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)


times = []
c0 = cpu()
for _ in range(steps):
    t.fill_(1.0)
    dist.barrier()
    s = time.perf_counter()
    dist.all_reduce(t)
    times.append(time.perf_counter() - s)
c1 = cpu()
assert float(t[0]) == dist.get_world_size()
if dist.get_rank() == 0:
    busy = (c1[0] - c0[0]) / max(1, c1[1] - c0[1])
    print('RESULT ' + json.dumps([sorted(times)[len(times) // 2], busy]), flush=True)
dist.destroy_process_group()
'''


def result(out):
    return json.loads([line for line in out.splitlines() if 'RESULT ' in line][-1].split('RESULT ', 1)[1])


class Profiler:
    """`perf record -a -g` of the whole machine (every namespace: one kernel) while a
    job's timed steps run: started disabled, enabled when rank 0 marks the start of
    its steps, disabled when it marks the last one (polled every 5 ms)."""

    def __init__(self, out, marks, steps, freq=999):
        self.marks, self.steps = marks, steps
        ctl_r, self.ctl = os.pipe()
        self.ack, ack_w = os.pipe()
        graph = ['--call-graph', os.environ['SCALING_PERF_CALLGRAPH']] if os.environ.get('SCALING_PERF_CALLGRAPH') \
            else ['-g']  # e.g. dwarf,16384: callers of functions without frame pointers (libc's memcpy)
        self.p = subprocess.Popen(['perf', 'record', '-a'] + graph + ['-F', str(freq), '-D', '-1', '--control',
                                   'fd:%d,%d' % (ctl_r, ack_w), '-o', out], pass_fds=(ctl_r, ack_w),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(ctl_r)
        os.close(ack_w)
        self.thread = None

    def _command(self, cmd):
        os.write(self.ctl, cmd + b'\n')
        os.read(self.ack, 16)

    def watch(self, job):
        import threading

        def run():
            for mark, cmd in (('start', b'enable'), (str(self.steps), b'disable')):
                while job.poll() is None and not os.path.exists('%s.%s' % (self.marks, mark)):
                    time.sleep(0.005)
                if job.poll() is not None:
                    return
                self._command(cmd)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self):
        if self.thread:
            self.thread.join(60)
        self.p.send_signal(2)  # before the control pipe closes (perf 6.1 then writes no data)
        self.p.wait(120)
        os.close(self.ctl)
        os.close(self.ack)


def run_pskv(c, hosts, workers, servers, elems, steps, changes=None, cpu_out=None, profile=None, **env_kw):
    """One pskv job: `servers` servers and `workers` workers on `hosts` by the cycling
    rule (servers on the first hosts). Returns (median step s, machine CPU busy
    fraction during the steps, per host [rx, tx] bytes of the whole job); with
    `changes` ([(after step, action)]: `action()` once step `after` ended) the step
    times instead of the median. `cpu_out` (a list): rank 0's record of the timed
    steps (/proc/stat jiffies, their rate, wall seconds) is appended to it. `profile`
    (a file): `perf record -a -g` of the timed steps into it (Profiler)."""
    script = os.path.join(c.tmp, 'scaling_worker.py')
    with open(script, 'w') as f:
        f.write(WORKER)
    argv = [os.path.join(build_dir(), 'pskv-launch'), '-H', c.hostfile(hosts), '--timeout', '900'] + \
        c.launcher_ssh_args() + ['-n', str(workers), '-s', str(servers), '--', '/usr/bin/python3', script,
                                 str(elems), str(steps)]
    before = [h.counters() for h in c.hosts]
    if changes or profile:
        # Through the launcher's --env: it forwards only the variables of pskv's own
        # table to the nodes it starts over ssh.
        marks = tempfile.mkdtemp(prefix='marks', dir=c.tmp) + '/step'  # fresh: no earlier job's marks
        argv[argv.index('--'):argv.index('--')] = ['--env', 'SCALING_MARKS=' + marks]
    log = os.environ['SCALING_LOG'] + '.job' if os.environ.get('SCALING_LOG') else os.path.join(c.tmp, 'job.log')
    with open(log, 'w') as f:
        p = subprocess.Popen(c.hosts[0].argv(argv), env=env(**env_kw), stdout=f,
                             stderr=subprocess.STDOUT, text=True, cwd=c.tmp)
    prof = None
    if profile:
        prof = Profiler(profile, marks, steps)
        prof.watch(p)
    if os.environ.get('SCALING_LOG'):  # every job's output as it comes, e.g. with PS_VERBOSE=1
        with open(os.environ['SCALING_LOG'], 'a') as f:
            f.write('==== %s %s\n' % (log, json.dumps(env_kw)))
    for after_step, act in sorted(changes or [], key=lambda x: x[0]):
        while p.poll() is None and not os.path.exists('%s.%d' % (marks, after_step)):
            time.sleep(0.01)
        if not os.path.exists('%s.%d' % (marks, after_step)):
            raise SystemExit('the job ended before step %d was marked: the change was not made' % after_step)
        act()
    p.wait(timeout=1000)
    if prof:
        prof.close()
    out = open(log).read()
    if os.environ.get('SCALING_LOG'):
        with open(os.environ['SCALING_LOG'], 'a') as f:
            f.write(out)
    if p.returncode != 0:
        raise SystemExit('pskv job failed:\n' + out[-3000:])
    after = [h.counters() for h in c.hosts]
    step, busy = result(out)
    if cpu_out is not None:
        cpu_out.append(json.loads('{' + [x for x in out.splitlines() if 'CPU {' in x][-1].split('CPU {', 1)[1]))
    if changes:
        return json.loads([x for x in out.splitlines() if 'STEPS ' in x][-1].split('STEPS ', 1)[1]), busy, out
    return step, busy, [[a[0] - b[0], a[1] - b[1]] for a, b in zip(after, before)]


def run_ddp(c, n, elems, steps):
    script = os.path.join(c.tmp, 'scaling_ddp.py')
    with open(script, 'w') as f:
        f.write(DDP)
    workers = c.hosts[:n]
    # gloo binds to the interface it is told (else the host name's, unknown here).
    procs = [h.popen(['/usr/bin/python3', script, str(elems), str(steps)],
                     env=env(MASTER=workers[0].addr(), RANK=str(i), WORLD=str(n), GLOO_SOCKET_IFNAME=c.nets[0]),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, h in enumerate(workers)]
    try:
        outs = [p.communicate(timeout=900)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit('DDP job did not finish within 900 s')
    if any(p.returncode for p in procs):
        raise SystemExit('DDP job failed:\n' + '\n'.join(o[-1500:] for o in outs))
    return result(outs[0])


def memcpy_ns_per_byte(nbytes=64 << 20, reps=9):
    """One thread's libc memcpy of `nbytes` (DRAM-sized: far beyond the caches) between
    two buffers already faulted in: nanoseconds per byte copied, the median of `reps`."""
    import ctypes
    src, dst = ctypes.create_string_buffer(nbytes), ctypes.create_string_buffer(nbytes)
    ctypes.memmove(dst, src, nbytes)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        ctypes.memmove(dst, src, nbytes)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e9 / nbytes


# /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice.
# The CPU a job costs: user + nice + system + irq + softirq (guest is inside user; idle,
# iowait and steal are time the job did not run).
CPU_FIELDS = {'user': (0, 1), 'system': (2,), 'irq': (5,), 'softirq': (6,)}


def cpu_cost(rec, steps, n, m, link_bytes_per_step):
    """From rank 0's record of the timed steps: the machine's CPU-seconds per step and
    per byte moved (2 n M: every worker pushes M and pulls M; the count of the job's
    work, the same for every layout), per byte the host links carried, and the split."""
    j = rec['jiffies']
    parts = {k: sum(j[i] for i in idx if i < len(j)) / rec['hz'] for k, idx in CPU_FIELDS.items()}
    busy = sum(parts.values())
    per_step = busy / steps
    return {'cpu_s_per_step': per_step, 'cpu_ns_per_byte': per_step * 1e9 / (2 * n * m),
            'cpu_ns_per_link_byte': per_step * 1e9 / link_bytes_per_step if link_bytes_per_step else None,
            'cpu_split': {k: v / busy if busy else 0.0 for k, v in parts.items()},
            'ctxt_per_mb': rec.get('ctxt', 0) / steps / (2 * n * m / 1e6),
            'cores_busy': busy / (rec['wall_s'] * rec['cores'])}


def t_opt(n, k, m, b):
    return 2.0 * n * (n - 1) * m / ((n * n + k * n - 2 * k) * b)


def t_even(n, k, m, b):
    """The bound of pskv's layout: every key split evenly over S = n + k servers. A
    worker host sends its pushes to the S - 1 other servers and its server's pull
    answers to the n - 1 other workers, M (S + n - 2) / S each way; an extra server
    host n M / S. Equal to t_opt for k = 0; above it for k > 0, where the optimum gives
    the extra hosts a larger share (BytePS's partition)."""
    s = n + k
    return max(m * (s + n - 2) / s, n * m / s) / b


def parse_size(s):
    s = s.upper()
    for suf, mult in (('MB', 1 << 20), ('KB', 1 << 10)):
        if s.endswith(suf):
            return int(float(s[:-len(suf)]) * mult)
    return int(s)


def spread(xs):
    """median, min, max rounded"""
    return round(statistics.median(xs), 4), round(min(xs), 4), round(max(xs), 4)


def emit(row, args, text):
    if args.out:
        with open(args.out, 'a') as f:
            f.write(json.dumps(row) + '\n')
    print(json.dumps(row) if args.json else text, flush=True)


def grid_config(c, args, n, k, rate, b, size):
    """pskv (auto shares) and, where asked, DDP and pskv with an even split, each
    --repeat times: one JSON row with medians and ranges."""
    m = parse_size(size)
    elems, steps = m // 4, args.steps
    # Rows with the kernel-paced columns are their own series (bench/plot.py: cluster_paced.png).
    row = {'bench': args.bench or ('cluster_paced' if args.paced_repeat else 'cluster_scaling'), 'workers': n,
           'extra_servers': k, 'rate': rate, 'pskv_pacing': 'default (PSKV_LINK_RATE unset: learned)',
           'link_bytes_per_s': round(b), 'model_bytes': m, 'steps': steps, 'repeats': args.repeat,
           't_opt_s': round(t_opt(n, k, m, b), 4), 't_even_split_s': round(t_even(n, k, m, b), 4)}
    runs, busy, links, cpus = [], [], [], []
    memcpy = memcpy_ns_per_byte()
    for _ in range(args.repeat):
        t, u, lk = run_pskv(c, c.hosts, n, n + k, elems, steps, cpu_out=cpus, PSKV_SERVER_WEIGHTS='balanced')
        runs.append(t)
        busy.append(u)
        links.append(lk)
    memcpy = statistics.median([memcpy, memcpy_ns_per_byte()])  # before and after the jobs
    row['pskv_s'], row['pskv_min_s'], row['pskv_max_s'] = spread(runs)
    row['pskv_runs_s'] = [round(x, 4) for x in runs]
    row['pskv_vs_t_opt'] = round(row['pskv_s'] / row['t_opt_s'], 3)
    row['cpu_busy'] = round(statistics.median(busy), 3)
    # Bytes each host link carried per push+pull, in units of M (the whole job over
    # its steps + 1 warm-up; rank 0's host also sent the initial value once).
    mid = links[runs.index(sorted(runs)[len(runs) // 2])]
    row['link_tx_per_step_M'] = [round(tx / (m * (steps + 1)), 3) for _, tx in mid]
    row['link_rx_per_step_M'] = [round(rx / (m * (steps + 1)), 3) for rx, _ in mid]
    # CPU per byte moved, against one thread's memcpy measured in this run.
    costs = [cpu_cost(r, steps, n, m, sum(tx for _, tx in lk) / (steps + 1)) for r, lk in zip(cpus, links)]
    row['memcpy_ns_per_byte'] = round(memcpy, 4)
    for key in ('cpu_s_per_step', 'cpu_ns_per_byte', 'cpu_ns_per_link_byte'):
        row[key] = round(statistics.median([x[key] for x in costs]), 4)
    row['cpu_ns_per_byte_runs'] = [round(x['cpu_ns_per_byte'], 4) for x in costs]
    row['cpu_per_byte_memcpys'] = round(row['cpu_ns_per_byte'] / memcpy, 2)
    row['cpu_per_link_byte_memcpys'] = round(row['cpu_ns_per_link_byte'] / memcpy, 2)
    row['context_switches_per_mb'] = round(statistics.median([x['ctxt_per_mb'] for x in costs]), 1)
    row['cpu_split'] = {k: round(statistics.median([x['cpu_split'][k] for x in costs]), 3)
                        for k in CPU_FIELDS}
    if args.profile:
        # One more job, under `perf record -a -g` (perturbed: not among the timed runs).
        os.makedirs(args.profile, exist_ok=True)
        data = os.path.join(args.profile, '%s-k%d-%s.perf.data' % (rate, k, size))
        pt, _, _ = run_pskv(c, c.hosts, n, n + k, elems, steps, profile=data, PSKV_SERVER_WEIGHTS='balanced')
        import cpu_breakdown
        row['cpu_profile'] = dict(cpu_breakdown.breakdown(data), profiled_step_s=round(pt, 4), perf_data=data)
    if k > 0 and args.even_repeat:
        ev = [run_pskv(c, c.hosts, n, n + k, elems, steps, PSKV_SERVER_WEIGHTS='even')[0]
              for _ in range(args.even_repeat)]
        row['pskv_even_s'], row['pskv_even_min_s'], row['pskv_even_max_s'] = spread(ev)
        row['pskv_even_vs_t_even_split'] = round(row['pskv_even_s'] / row['t_even_split_s'], 3)
    if args.unpaced_repeat:
        # PSKV_LINK_RATE=0: no pacing (the default before the rate was learned).
        up = [run_pskv(c, c.hosts, n, n + k, elems, steps, PSKV_SERVER_WEIGHTS='balanced', PSKV_LINK_RATE='0')[0]
              for _ in range(args.unpaced_repeat)]
        row['pskv_unpaced_s'], row['pskv_unpaced_min_s'], row['pskv_unpaced_max_s'] = spread(up)
        row['pskv_unpaced_vs_t_opt'] = round(row['pskv_unpaced_s'] / row['t_opt_s'], 3)
    if args.paced_repeat:
        # Kernel pacing (src/kvstore/distributed/link_pacing.h) at the link rate measured here.
        pace = str(int(b))
        pr = [run_pskv(c, c.hosts, n, n + k, elems, steps, PSKV_SERVER_WEIGHTS='balanced', PSKV_LINK_RATE=pace)[0]
              for _ in range(args.paced_repeat)]
        row['pskv_paced_s'], row['pskv_paced_min_s'], row['pskv_paced_max_s'] = spread(pr)
        row['pskv_paced_vs_t_opt'] = round(row['pskv_paced_s'] / row['t_opt_s'], 3)
        if k > 0:
            pe = [run_pskv(c, c.hosts, n, n + k, elems, steps, PSKV_SERVER_WEIGHTS='even', PSKV_LINK_RATE=pace)[0]
                  for _ in range(max(1, args.even_repeat))]
            row['pskv_paced_even_s'], row['pskv_paced_even_min_s'], row['pskv_paced_even_max_s'] = spread(pe)
            row['pskv_paced_even_vs_t_even_split'] = round(row['pskv_paced_even_s'] / row['t_even_split_s'], 3)
    if k in args.ddp_at:
        dd, dbusy = [], []
        for _ in range(args.repeat):
            t, u = run_ddp(c, n, elems, steps)
            dd.append(t)
            dbusy.append(u)
        row['ddp_gloo_s'], row['ddp_min_s'], row['ddp_max_s'] = spread(dd)
        row['ddp_runs_s'] = [round(x, 4) for x in dd]
        row['ddp_cpu_busy'] = round(statistics.median(dbusy), 3)
        row['ddp_vs_t_opt_k0'] = round(row['ddp_gloo_s'] / t_opt(n, 0, m, b), 3)
        row['pskv_speedup_vs_ddp'] = round(row['ddp_gloo_s'] / row['pskv_s'], 3)
        if 'pskv_paced_s' in row:
            row['pskv_paced_speedup_vs_ddp'] = round(row['ddp_gloo_s'] / row['pskv_paced_s'], 3)
    text = ('%-8s k=%d M=%-5s B=%.1f MB/s  t_opt %.3f s  pskv %.3f s [%.3f-%.3f] (%.2f x t_opt, cpu %.0f%%, '
            '%.2f ns/B = %.1f memcpys)%s%s'
            % (rate, k, size, b / 1e6, row['t_opt_s'], row['pskv_s'], row['pskv_min_s'], row['pskv_max_s'],
               row['pskv_vs_t_opt'], 100 * row['cpu_busy'], row['cpu_ns_per_byte'], row['cpu_per_byte_memcpys'],
               ('  unpaced %.3f s (%.2f x t_opt)' % (row['pskv_unpaced_s'], row['pskv_unpaced_vs_t_opt'])
                if 'pskv_unpaced_s' in row else '') +
               ('  even %.3f s' % row['pskv_even_s'] if 'pskv_even_s' in row else '') +
               ('  paced %.3f s (%.2f x t_opt)' % (row['pskv_paced_s'], row['pskv_paced_vs_t_opt'])
                if 'pskv_paced_s' in row else '') +
               ('  paced even %.3f s' % row['pskv_paced_even_s'] if 'pskv_paced_even_s' in row else ''),
               '  ddp-gloo %.3f s (pskv %.2f x faster%s)' % (
                   row['ddp_gloo_s'], row['pskv_speedup_vs_ddp'],
                   ', paced %.2f x' % row['pskv_paced_speedup_vs_ddp'] if 'pskv_paced_speedup_vs_ddp' in row else '')
               if 'ddp_gloo_s' in row else ''))
    emit(row, args, text)
    return row


def rate_change(c, args, n, k, rate, b):
    """One job per pacing mode with --change-steps steps; the link of a host changes
    rate after given steps (--change AFTER:HOST:RATE,...). Per step: its time over the
    bound of the links' rates then (every host link carries the same bytes with the
    link-balanced shares, so the bound scales with the slowest link), and per change
    the steps until the step time is within 10 % of the new bound."""
    m = parse_size(args.sizes.split(',')[0])
    changes = [(int(a), int(h), r) for a, h, r in (x.split(':') for x in args.change.split(','))] \
        if args.change else []
    base_bits = netns_cluster._rate_bits(rate)
    bounds, rates = [], [base_bits] * len(c.hosts)
    for i in range(args.change_steps):
        for a, h, r in changes:
            if a == i:
                rates[h] = netns_cluster._rate_bits(r)
        bounds.append(t_opt(n, k, m, b) * base_bits / min(rates[:n + k]))
    modes = [('learned', {})] + ([('PSKV_LINK_RATE=B', {'PSKV_LINK_RATE': str(int(b))})] if args.paced_repeat else []) + \
        ([('unpaced', {'PSKV_LINK_RATE': '0'})] if args.unpaced_repeat else [])
    compete = [int(x) for x in args.compete.split(':')] if args.compete else None
    for name, kw in modes:
        for h in range(len(c.hosts)):
            c.set_rate(h, rate)
        acts = [(a, lambda h=h, r=r: c.set_rate(h, r)) for a, h, r in changes]
        flow = None
        if compete:
            # A bulk TCP flow from host SRC to host DST (not the job's) between two steps.
            flow = CompetingFlow(c, compete[2], compete[3])
            acts += [(compete[0], flow.start), (compete[1], flow.stop)]
        times, busy, _ = run_pskv(c, c.hosts, n, n + k, m // 4, args.change_steps, changes=acts,
                                  PSKV_SERVER_WEIGHTS='balanced', **kw)
        marks = sorted(set([a for a, _, _ in changes] + (compete[:2] if compete else [])))
        if flow:
            # While it ran the flow took `flow.rate` of SRC's uplink and DST's downlink:
            # the job's bound is that of links of B - flow.rate.
            flow.stop()
            for i in range(compete[0], min(compete[1], len(bounds))):
                bounds[i] = t_opt(n, k, m, b) * b / max(b - flow.rate, 1.0)
        ratio = [round(t / bd, 3) for t, bd in zip(times, bounds)]
        recovery = []
        for a in marks:
            nxt = min([x for x in marks if x > a] + [len(times)])
            within = [i for i in range(a, nxt) if ratio[i] <= 1.10]
            recovery.append(within[0] - a + 1 if within else None)
        row = {'bench': args.bench or 'cluster_rate_change', 'workers': n, 'extra_servers': k, 'rate': rate,
               'link_bytes_per_s': round(b), 'model_bytes': m, 'pacing': name, 'changes': args.change,
               'compete': args.compete, 'competing_flow_bytes_per_s': round(flow.rate) if flow else None,
               'step_s': [round(t, 4) for t in times], 'bound_s': [round(x, 4) for x in bounds],
               'step_vs_bound': ratio, 'recovery_steps': recovery, 'cpu_busy': round(busy, 3)}
        emit(row, args, '%-8s k=%d %s changes %s: step/bound %s, steps to within 10 %%: %s' % (
            rate, k, name, args.change, ' '.join('%.2f' % x for x in ratio), recovery))


class CompetingFlow:
    """A bulk TCP stream from host `src` to host `dst` of cluster `c` (the kernel's
    default congestion control), started and stopped between a job's steps; `rate`:
    its payload bytes/s while it ran (the receiver's count over the time)."""

    def __init__(self, c, src, dst, port=5998):
        self.c, self.src, self.dst, self.port = c, src, dst, port
        self.recv = self.send = None
        self.rate = 0.0

    def start(self):
        self.recv = bulk_receiver(self.c.hosts[self.dst], self.port)
        self.send = self.c.hosts[self.src].popen(['/usr/bin/python3', '-c', (
            'import socket\n'
            's=socket.create_connection(("%s", %d)); buf=b"x"*(1<<20)\n'
            'while True: s.sendall(buf)\n') % (self.c.hosts[self.dst].addr(), self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        if self.send is None:
            return
        self.send.kill()
        self.send.wait(30)
        self.send = None
        n, secs = self.recv.communicate(timeout=60)[0].split()
        self.rate = float(n) / max(float(secs), 1e-3)


def servers_series(c, args, n, rate, b):
    """The seed's O(m/n) claim: n workers on hosts of their own, S servers on S other
    hosts; a step needs max(1, n/S) M/B (each server host receives n M/S and sends
    as much; each worker link M)."""
    m = parse_size(args.series_size)
    extra = c.hosts[n:]
    for s in [int(x) for x in args.servers_series.split(',')]:
        if s > len(extra):
            continue
        hosts = extra[:s] + c.hosts[:n]  # the cycling rule: servers first
        runs, busy = [], []
        for _ in range(args.repeat):
            t, u, _ = run_pskv(c, hosts, n, s, m // 4, args.steps)
            runs.append(t)
            busy.append(u)
        row = {'bench': 'cluster_servers', 'workers': n, 'servers': s, 'rate': rate, 'link_bytes_per_s': round(b),
               'model_bytes': m, 'steps': args.steps, 'repeats': args.repeat,
               't_bound_s': round(max(1.0, n / s) * m / b, 4)}
        row['pskv_s'], row['pskv_min_s'], row['pskv_max_s'] = spread(runs)
        row['pskv_runs_s'] = [round(x, 4) for x in runs]
        row['pskv_vs_bound'] = round(row['pskv_s'] / row['t_bound_s'], 3)
        row['cpu_busy'] = round(statistics.median(busy), 3)
        emit(row, args, '%-8s %d workers, %d server hosts, M=%s: bound %.3f s, pskv %.3f s [%.3f-%.3f] (%.2f x)' % (
            rate, n, s, args.series_size, row['t_bound_s'], row['pskv_s'], row['pskv_min_s'], row['pskv_max_s'],
            row['pskv_vs_bound']))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--workers', type=int, default=4)
    ap.add_argument('--servers', default='0,2,4', help='extra server hosts k (0: servers on the worker hosts)')
    ap.add_argument('--sizes', default='4MB,64MB')
    ap.add_argument('--rates', default='100mbit,1gbit')
    ap.add_argument('--steps', type=int, default=3, help='timed steps per job (median)')
    ap.add_argument('--repeat', type=int, default=3, help='jobs per configuration (median and range)')
    ap.add_argument('--ddp', action='store_true', help='also PyTorch DDP (gloo ring all-reduce) on the worker hosts')
    ap.add_argument('--ddp-at', default='0,4', help='with --ddp: the k whose clusters run DDP too')
    ap.add_argument('--even-repeat', type=int, default=0,
                    help='for k > 0, also this many jobs with PSKV_SERVER_WEIGHTS=even')
    ap.add_argument('--paced-repeat', type=int, default=0,
                    help='also this many jobs with PSKV_LINK_RATE = the measured B (kernel pacing per '
                         'connection) with the link-balanced shares, and for k > 0 --even-repeat (at least 1) '
                         'with the even split')
    ap.add_argument('--unpaced-repeat', type=int, default=0,
                    help='also this many jobs with PSKV_LINK_RATE=0 (no pacing; the default before it was learned)')
    ap.add_argument('--change', default='',
                    help='AFTER:HOST:RATE,...: instead of the grid, one job per pacing mode (learned, and with '
                         '--paced-repeat/--unpaced-repeat stated/unpaced) in which HOST\'s link changes to RATE '
                         'after step AFTER (first k, first size)')
    ap.add_argument('--change-steps', type=int, default=14)
    ap.add_argument('--compete', default='',
                    help='AFTER:UNTIL:SRC:DST: instead of the grid (or with --change), one job per pacing '
                         'mode in which a bulk TCP flow from host SRC to host DST runs from step AFTER to '
                         'step UNTIL; its steps measured against the bound of links of B less the flow\'s rate')
    ap.add_argument('--bench', default='', help='the rows\' "bench" name (default cluster_scaling/cluster_paced)')
    ap.add_argument('--servers-series', default='',
                    help='server counts S (e.g. 1,2,4) for the step time against servers: S hosts that only '
                         'serve, in the cluster of the largest k, at the first rate')
    ap.add_argument('--series-size', default='4MB')
    ap.add_argument('--profile', default='',
                    help='DIR: per grid row one more job under `perf record -a -g` of its timed steps '
                         '(DIR/RATE-kK-SIZE.perf.data) and the row\'s cpu_profile: where the CPU went '
                         '(bench/cluster/cpu_breakdown.py)')
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--out', help='also append the JSON lines to this file (e.g. bench/results/cluster_scaling.json)')
    args = ap.parse_args()
    args.ddp_at = [int(x) for x in args.ddp_at.split(',')] if args.ddp else []
    why = netns_cluster.why_unavailable()
    if why:
        raise SystemExit('bench/cluster/scaling.py: ' + why)
    n = args.workers
    ks = [int(x) for x in args.servers.split(',')]
    rates = args.rates.split(',')
    for rate in rates:
        for k in ks:
            with netns_cluster.Cluster(hosts=n + k, networks={'net': rate}) as c:
                b = link_rate(c)
                if args.change or args.compete:
                    rate_change(c, args, n, k, rate, b)
                    continue
                for size in args.sizes.split(','):
                    grid_config(c, args, n, k, rate, b, size)
                if args.servers_series and rate == rates[0] and k == max(ks):
                    servers_series(c, args, n, rate, b)


if __name__ == '__main__':
    main()
