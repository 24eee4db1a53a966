#!/usr/bin/python3
"""Dense push+pull across namespace "hosts" against the parameter-server bound, and
against PyTorch DDP (gloo ring all-reduce) on the same hosts and links (issue 26,
deliverable 3). Needs root (tests/cluster/netns_cluster.py builds the cluster).

For n workers, k extra server hosts (k = 0: a server on every worker host) and links
of rate B, a step moving a model of M bytes (every worker pushes M and pulls M) takes
at least

    t_opt = 2 n (n - 1) M / ((n^2 + k n - 2 k) B)        (k = 0: 2 (n - 1) M / (n B),
                                                          all-reduce's bound)

B is measured in the same run (one TCP stream between two hosts through the rate
limit). Each configuration is a fresh cluster of n + k hosts on one rate-limited
network; pskv runs under pskv-launch over ssh with a server on every host (workers
on hosts 0 .. n-1 by the cycling rule, the k extra hosts serve only), DDP with n
processes on the worker hosts.

    bench/cluster/scaling.py [--workers 4] [--servers 0,2,4] [--sizes 4MB,64MB]
        [--rates 100mbit,1gbit] [--steps 5] [--ddp] [--json]

Prints one JSON object per configuration (--json) or a table; ratios: measured /
t_opt, and pskv vs DDP.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
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


def link_rate(c, nbytes=8 << 20):
    """Bytes/s of one TCP stream from host 1 to host 0 through the rate limit."""
    port = 5999
    server = c.hosts[0].popen(['/usr/bin/python3', '-c', (
        'import socket,sys\n'
        's=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n'
        's.bind(("0.0.0.0", %d)); s.listen(1); a,_=s.accept(); n=0\n'
        'while True:\n'
        '    b=a.recv(1<<20)\n'
        '    if not b: break\n'
        '    n+=len(b)\n'
        'print(n)\n') % port], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the listener is up (python starts in the namespace)
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
kv = pskv.create('dist_sync')
if os.environ.get('DMLC_ROLE', 'worker') != 'worker':
    sys.exit(0)
elems, steps = int(sys.argv[1]), int(sys.argv[2])
g = np.ones(elems, np.float32)
w = np.zeros(elems, np.float32)
kv.init(0, w)
kv.pushpull(0, g, out=w)  # warm-up: connections, buffers
times = []
for _ in range(steps):
    kv.barrier()
    t = time.perf_counter()
    kv.pushpull(0, g, out=w)
    times.append(time.perf_counter() - t)
assert float(w[0]) == kv.num_workers and float(w[-1]) == kv.num_workers, (w[0], w[-1])
if kv.rank == 0:
    print('RESULT ' + json.dumps(sorted(times)[len(times) // 2]), flush=True)
kv.close()
'''

DDP = r'''
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group('gloo', init_method='tcp://%s:29500' % os.environ['MASTER'],
                        rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD']))
elems, steps = int(sys.argv[1]), int(sys.argv[2])
t = torch.ones(elems)
dist.all_reduce(t)
times = []
for _ in range(steps):
    t.fill_(1.0)
    dist.barrier()
    s = time.perf_counter()
    dist.all_reduce(t)
    times.append(time.perf_counter() - s)
assert float(t[0]) == dist.get_world_size()
if dist.get_rank() == 0:
    print('RESULT %r' % sorted(times)[len(times) // 2], flush=True)
dist.destroy_process_group()
'''


def run_pskv(c, n, k, elems, steps):
    script = os.path.join(c.tmp, 'scaling_worker.py')
    with open(script, 'w') as f:
        f.write(WORKER)
    # A server on every host (n + k), as the bound assumes (BytePS's layout: the k extra
    # hosts add server bandwidth); big keys are split evenly over the servers. The
    # cycling rule puts the workers on hosts 0 .. n-1, the k extra hosts serve only.
    servers = n + k
    hosts = c.hosts
    argv = [os.path.join(build_dir(), 'pskv-launch'), '-H', c.hostfile(hosts), '--timeout', '900'] + \
        c.launcher_ssh_args() + ['-n', str(n), '-s', str(servers), '--', '/usr/bin/python3', script,
                                 str(elems), str(steps)]
    r = subprocess.run(c.hosts[0].argv(argv), env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=1000, cwd=c.tmp)
    if r.returncode != 0:
        raise SystemExit('pskv job failed:\n' + r.stdout[-3000:])
    return json.loads([line for line in r.stdout.splitlines() if 'RESULT ' in line][-1].split('RESULT ', 1)[1])


def run_ddp(c, n, k, elems, steps):
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
    return float([line for line in outs[0].splitlines() if 'RESULT ' in line][-1].split('RESULT ', 1)[1])


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--workers', type=int, default=4)
    ap.add_argument('--servers', default='0,2,4', help='extra server hosts k (0: servers on the worker hosts)')
    ap.add_argument('--sizes', default='4MB,64MB')
    ap.add_argument('--rates', default='100mbit,1gbit')
    ap.add_argument('--steps', type=int, default=5)
    ap.add_argument('--ddp', action='store_true', help='also PyTorch DDP (gloo all-reduce), k = 0 layout')
    ap.add_argument('--json', action='store_true')
    ap.add_argument('--out', help='also append the JSON lines to this file (e.g. bench/results/cluster_scaling.json)')
    args = ap.parse_args()
    why = netns_cluster.why_unavailable()
    if why:
        raise SystemExit('bench/cluster/scaling.py: ' + why)
    n = args.workers
    rows = []
    for rate in args.rates.split(','):
        for k in [int(x) for x in args.servers.split(',')]:
            with netns_cluster.Cluster(hosts=n + k, networks={'net': rate}) as c:
                b = link_rate(c)
                for size in args.sizes.split(','):
                    m = parse_size(size)
                    elems = m // 4
                    row = {'bench': 'cluster_scaling', 'workers': n, 'extra_servers': k, 'rate': rate,
                           'link_bytes_per_s': round(b), 'model_bytes': m, 'steps': args.steps,
                           't_opt_s': round(t_opt(n, k, m, b), 4), 't_even_split_s': round(t_even(n, k, m, b), 4)}
                    row['pskv_s'] = round(run_pskv(c, n, k, elems, args.steps), 4)
                    row['pskv_vs_t_opt'] = round(row['pskv_s'] / row['t_opt_s'], 3)
                    row['pskv_vs_t_even_split'] = round(row['pskv_s'] / row['t_even_split_s'], 3)
                    if args.ddp and k == 0:
                        row['ddp_gloo_s'] = round(run_ddp(c, n, k, elems, args.steps), 4)
                        row['ddp_vs_t_opt'] = round(row['ddp_gloo_s'] / row['t_opt_s'], 3)
                        row['pskv_speedup_vs_ddp'] = round(row['ddp_gloo_s'] / row['pskv_s'], 3)
                    rows.append(row)
                    if args.out:
                        with open(args.out, 'a') as f:
                            f.write(json.dumps(row) + '\n')
                    print(json.dumps(row) if args.json else
                          '%-8s k=%d M=%-5s B=%.1f MB/s  t_opt %.3f s  even split %.3f s  pskv %.3f s (%.2f x t_opt, '
                          '%.2f x even)%s' % (
                              rate, k, size, b / 1e6, row['t_opt_s'], row['t_even_split_s'], row['pskv_s'],
                              row['pskv_vs_t_opt'], row['pskv_vs_t_even_split'],
                              '  ddp-gloo %.3f s (%.2f x)' % (row['ddp_gloo_s'], row['ddp_vs_t_opt'])
                              if 'ddp_gloo_s' in row else ''), flush=True)
    return rows


if __name__ == '__main__':
    main()
