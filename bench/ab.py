#!/usr/bin/python3
"""Before/after comparison of two builds of pskv-bench, alternated in one run.

    bench/ab.py --before DIR --after DIR [--rounds 3] [--benches pushpull,fusion,latency,replicas]

DIR holds a pskv-bench and what it runs with (pskv-launch, pskv-server, libpskv.so*;
a build folder does). Each round runs every benchmark once with the before build and once
with the after build, in alternating order (before first in odd rounds), so that both
see the same machine state; reported per metric: the median of each side and
after / before. A refactor that must not cost speed (issue 39) shows ratios near 1
for throughputs and latencies alike; the spread between rounds says how near counts.

Every figure is the benchmark's own (its JSON lines); nothing is timed here."""
import argparse
import json
import os
import statistics
import subprocess
import sys

# bench -> (arguments, [(metric name, the JSON line's selector, the field)])
BENCHES = {
    'pushpull': (['pushpull', '--json', '--min-bytes', '1048576', '--max-bytes', '67108864'],
                 lambda r: f"pushpull {r['bytes'] >> 20} MiB", ['tcp_gbps', 'shm_gbps', 'ratio']),
    'fusion': (['fusion', '--json', '--reps', '3'],
               lambda r: 'fusion', ['fused_gbps', 'unfused_gbps', 'resnet50_fused_ms']),
    'latency': (['latency', '--json', '--reps', '400'],
                lambda r: f"latency {r['transport']} {r['store']}", ['p50_us', 'p90_us']),
    'replicas': (['replicas', '--json', '--topologies', '2x2', '--repeats', '1', '--steps', '20'],
                 lambda r: f"replicas {r['workers']}x{r['servers']}",
                 ['step_ms_r0', 'step_ms_r1', 'overhead']),
}


def run(build, args):
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.abspath(build))
    out = subprocess.run([os.path.join(build, 'pskv-bench')] + args, env=env, check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         timeout=900).stdout
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith('{'):
            rows.append(json.loads(line))
    if not rows:
        sys.exit(f'ab.py: {build}/pskv-bench {" ".join(args)} printed no JSON line')
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--before', required=True)
    ap.add_argument('--after', required=True)
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--benches', default=','.join(BENCHES))
    ap.add_argument('--json', help='write the medians to this file')
    a = ap.parse_args()
    samples = {}  # (metric, side) -> values
    for rnd in range(a.rounds):
        sides = [('before', a.before), ('after', a.after)]
        if rnd % 2:
            sides.reverse()
        for bench in a.benches.split(','):
            args, name, fields = BENCHES[bench]
            for side, build in sides:
                for row in run(build, args):
                    for f in fields:
                        if f in row and isinstance(row[f], (int, float)):
                            samples.setdefault((f'{name(row)} {f}', side), []).append(row[f])
        print(f'round {rnd + 1}/{a.rounds} done', file=sys.stderr)
    out = []
    print(f'{"metric":<44} {"before":>10} {"after":>10} {"after/before":>12}')
    for metric in sorted({m for m, _ in samples}):
        b = statistics.median(samples.get((metric, 'before'), [float('nan')]))
        f = statistics.median(samples.get((metric, 'after'), [float('nan')]))
        ratio = f / b if b else float('nan')
        print(f'{metric:<44} {b:>10.4g} {f:>10.4g} {ratio:>12.3f}')
        out.append({'metric': metric, 'before': b, 'after': f, 'ratio': ratio,
                    'rounds': a.rounds})
    if a.json:
        with open(a.json, 'w') as fh:
            for r in out:
                fh.write(json.dumps(r) + '\n')


if __name__ == '__main__':
    main()
