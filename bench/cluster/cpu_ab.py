#!/usr/bin/python3
"""Before/after pairs of the CPU cost per byte (issue 40 item 2): in one namespace
cluster (bench/cluster/scaling.py's), jobs of variant A and variant B alternate
(A B A B ...), each a dense push+pull of M bytes for --steps steps; per variant the
median and range of the step time and of the machine's CPU per byte moved (2 n M per
step; scaling.py's cpu_cost), in units of one thread's memcpy measured in the same
run. Needs root.

A variant is NAME=[BUILD_DIR][:VAR=VALUE[:VAR=VALUE...]]: a build (PSKV_BUILD_DIR;
empty: this tree's build/) and pskv variables for the job, e.g.

    bench/cluster/cpu_ab.py --servers 0 --pairs 4 base=/tmp/base-build new=build
    bench/cluster/cpu_ab.py spin=:PSKV_SPIN_US=100 nospin=:PSKV_SPIN_US=0

One JSON line per variant (bench "cluster_cpu_ab") to --out and stdout.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scaling  # noqa: E402
from scaling import netns_cluster  # noqa: E402


def parse_variant(s):
    name, _, rest = s.partition('=')
    parts = rest.split(':')
    env = dict(x.split('=', 1) for x in parts[1:] if x)
    return name, (os.path.abspath(parts[0]) if parts[0] else ''), env


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('variants', nargs='+')
    ap.add_argument('--workers', type=int, default=4)
    ap.add_argument('--servers', type=int, default=0, help='extra server hosts k')
    ap.add_argument('--size', default='64MB')
    ap.add_argument('--rate', default='1gbit')
    ap.add_argument('--steps', type=int, default=5)
    ap.add_argument('--pairs', type=int, default=3, help='rounds of one job per variant')
    ap.add_argument('--out')
    args = ap.parse_args()
    why = netns_cluster.why_unavailable()
    if why:
        raise SystemExit('bench/cluster/cpu_ab.py: ' + why)
    variants = [parse_variant(v) for v in args.variants]
    n, k, m = args.workers, args.servers, scaling.parse_size(args.size)
    res = {name: {'step': [], 'cost': []} for name, _, _ in variants}
    default_build = os.environ.get('PSKV_BUILD_DIR', '')
    with netns_cluster.Cluster(hosts=n + k, networks={'net': args.rate}) as c:
        b = scaling.link_rate(c)
        memcpy = [scaling.memcpy_ns_per_byte()]
        for _ in range(args.pairs):
            for name, build, env in variants:
                if build or default_build:
                    os.environ['PSKV_BUILD_DIR'] = build or default_build
                else:
                    os.environ.pop('PSKV_BUILD_DIR', None)
                cpus = []
                t, _, lk = scaling.run_pskv(c, c.hosts, n, n + k, m // 4, args.steps, cpu_out=cpus,
                                            PSKV_SERVER_WEIGHTS='balanced', **env)
                cost = scaling.cpu_cost(cpus[0], args.steps, n, m, sum(tx for _, tx in lk) / (args.steps + 1))
                res[name]['step'].append(t)
                res[name]['cost'].append(cost)
                print('%-10s step %.3f s  %.3f ns/B  ctxt/MB %.0f' % (name, t, cost['cpu_ns_per_byte'],
                                                                     cost['ctxt_per_mb']), flush=True)
            memcpy.append(scaling.memcpy_ns_per_byte())
    mc = statistics.median(memcpy)
    t_opt = scaling.t_opt(n, k, m, b)
    for name, build, env in variants:
        r = res[name]
        ns = [x['cpu_ns_per_byte'] for x in r['cost']]
        row = {'bench': 'cluster_cpu_ab', 'variant': name, 'build': build or default_build or 'build',
               'env': env, 'workers': n, 'extra_servers': k, 'rate': args.rate, 'link_bytes_per_s': round(b),
               'model_bytes': m, 'steps': args.steps, 'jobs': len(ns), 't_opt_s': round(t_opt, 4),
               'memcpy_ns_per_byte': round(mc, 4)}
        row['step_s'], row['step_min_s'], row['step_max_s'] = scaling.spread(r['step'])
        row['step_vs_t_opt'] = round(row['step_s'] / t_opt, 3)
        row['cpu_ns_per_byte'], row['cpu_ns_per_byte_min'], row['cpu_ns_per_byte_max'] = scaling.spread(ns)
        row['cpu_per_byte_memcpys'] = round(row['cpu_ns_per_byte'] / mc, 2)
        row['cpu_per_byte_memcpys_range'] = [round(min(ns) / mc, 2), round(max(ns) / mc, 2)]
        row['cores_busy'] = round(statistics.median([x['cores_busy'] for x in r['cost']]), 3)
        row['context_switches_per_mb'] = round(statistics.median([x['ctxt_per_mb'] for x in r['cost']]), 1)
        row['cpu_split'] = {f: round(statistics.median([x['cpu_split'][f] for x in r['cost']]), 3)
                            for f in scaling.CPU_FIELDS}
        row['step_runs_s'] = [round(x, 4) for x in r['step']]
        row['cpu_ns_per_byte_runs'] = [round(x, 4) for x in ns]
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, 'a') as f:
                f.write(line + '\n')


if __name__ == '__main__':
    main()
