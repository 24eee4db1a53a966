#!/usr/bin/python3
"""What PSKV_REPLICAS=1 costs on rate-limited links: `pskv-bench replicas` (R=1 against
R=0, alternating jobs, medians; bench/replicas_bench.cc) across namespace hosts
(tests/cluster/netns_cluster.py; needs root).

Placements, for each WxS topology:
  shared   S = W hosts, a server and a worker on each (the replica's bytes share the
           workers' links);
  own      W + S hosts, the servers on hosts of their own (the cycling rule puts the
           servers on the first S hosts): the replica's bytes use only server links.
One fresh cluster per placement and topology, every link limited to --rate (tc tbf);
the link rate B is measured in the same cluster (one TCP stream).

    bench/cluster/replicas.py [--topologies 2x2,4x4] [--placements shared,own]
        [--rate 100mbit] [--sparse] [--bytes N] [--keys N] [--steps 8] [--repeats 3]
        [--env K=V ...] [--out FILE]
--env: environment for every process of every job (pskv-launch --env), e.g. to compare
settings.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scaling  # noqa: E402  (env, build_dir, link_rate; it puts tests/cluster on the path)
import netns_cluster  # noqa: E402


def link_floor(w, s, placement, sparse, rows_frac=0.125):
    """The least overhead of R=1 where the links are the limit (docs/performance.md,
    "Replicated servers"): the busiest link's bytes per direction with R=1 over those
    with R=0. Per step each worker pushes and pulls D (dense: the model M; row_sparse:
    its rows, f T of each table of T bytes), and R=1 sends each range's round once
    more, primary to replica: the sum, M / S of a dense range, and for row_sparse the
    union of the W workers' random rows, u T / S with u = 1 - (1 - f)^W (dense: D = M,
    u = f = 1). With T = M = 1:
      shared (a server and a worker on each of W = S hosts): a host sends (W - 1) f / W
        of pushes and (W - 1) f / W of answers, and one range's copy u / W more:
        u / (2 (W - 1) f) for row_sparse; dense 0: the replica on a worker's host answers
        that worker's one-key push-pulls for the primary (docs/fault-tolerance.md,
        "Answers from a copy on the worker's host"), so the copy replaces an answer;
      own (servers on S hosts of their own): a worker's link carries f, a server's
        W f / S, and with R=1 (W f + u) / S: max(f, (W f + u) / S) / max(f, W f / S) - 1,
        u / (W f) at S = W, and 0 once the server links have room for the copy."""
    u, f = (1 - (1 - rows_frac) ** w, rows_frac) if sparse else (1.0, 1.0)
    if placement == 'shared':
        return u / (2 * (w - 1) * f) if sparse else 0.0
    return max(f, (w * f + u) / s) / max(f, w * f / s) - 1


def run(c, hosts, w, s, args, placement, b):
    bench = os.path.join(scaling.build_dir(), 'pskv-bench')
    launch = ['-H', c.hostfile(hosts)] + c.launcher_ssh_args()
    for kv in args.env:
        launch += ['--env', kv]
    argv = [bench, 'replicas', '--json', '--topologies', '%dx%d' % (w, s), '--steps', str(args.steps),
            '--repeats', str(args.repeats), '--keys', str(args.keys),
            '--label', '%s-%s' % (args.rate, placement),
            '--launch-args', ' '.join(shlex.quote(a) for a in launch)]
    if args.bytes:
        argv += ['--bytes', str(args.bytes)]
    if args.sparse:
        argv += ['--sparse']
    r = subprocess.run(c.hosts[0].argv(argv), env=scaling.env(), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=1200, cwd=c.tmp)
    if r.returncode != 0:
        raise SystemExit('pskv-bench replicas failed:\n' + r.stdout[-3000:])
    for line in r.stdout.splitlines():
        if line.startswith('{'):
            row = json.loads(line)
            row['placement'] = placement
            row['floor'] = round(link_floor(w, s, placement, args.sparse), 4)
            row['env'] = args.env
            row['link_bytes_per_s'] = round(b)
            yield row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--topologies', default='2x2,4x4')
    ap.add_argument('--placements', default='shared,own')
    ap.add_argument('--rate', default='100mbit')
    ap.add_argument('--sparse', action='store_true')
    ap.add_argument('--bytes', type=int, default=0, help='per key (default: the bench\'s)')
    ap.add_argument('--keys', type=int, default=4)
    ap.add_argument('--steps', type=int, default=8)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--env', action='append', default=[], metavar='K=V')
    ap.add_argument('--out', help='also append the JSON lines to this file')
    args = ap.parse_args()
    why = netns_cluster.why_unavailable()
    if why:
        raise SystemExit('bench/cluster/replicas.py: ' + why)
    for topo in args.topologies.split(','):
        w, s = (int(x) for x in topo.split('x'))
        for placement in args.placements.split(','):
            n = max(w, s) if placement == 'shared' else w + s
            with netns_cluster.Cluster(hosts=n, networks={'net': args.rate}) as c:
                b = scaling.link_rate(c)
                for row in run(c, c.hosts, w, s, args, placement, b):
                    if args.out:
                        with open(args.out, 'a') as f:
                            f.write(json.dumps(row) + '\n')
                    print('%-7s %-6s %s %dx%d  B=%.1f MB/s  R=0 %.1f ms  R=1 %.1f ms  %+.1f %% '
                          '(floor %+.1f %%) %s' % (
                              args.rate, placement, row['keys_kind'], w, s, b / 1e6,
                              row['step_ms_r0'], row['step_ms_r1'], 100 * row['overhead'],
                              100 * row['floor'], ' '.join(args.env)), flush=True)


if __name__ == '__main__':
    main()
