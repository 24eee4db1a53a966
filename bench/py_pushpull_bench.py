#!/usr/bin/python3
"""py_pushpull_bench.py: a Python per-parameter loop over P keys (what a training
step's communication looks like from Python), three ways in the same run:

  * blocking:  kv.pushpull(k, g, out=w); kv.wait(k) for every key, i.e. one round
    trip after the other (pskv's Python behaviour before issue 13 item 5);
  * sync store: kv.pushpull(k, g, out=w) on a store created with blocking=True
    (what PSKV_PY_SYNC=1 gives: the call waits);
  * async:     kv.pushpull(k, g, out=w) for every key, then one kv.wait_all();
  * async+copy: as async, but each gradient is copied first (g.copy()): what a
    snapshot of the inputs, letting the caller reuse them at once, would cost.

1 worker + 1 server (dist_sync, real processes under build/pskv-launch). The modes
alternate step by step (same machine state); reported: the median step time per
mode and the blocking/async ratio.

    /usr/bin/python3 bench/py_pushpull_bench.py [--shapes 100x64KiB|resnet50]
        [--steps 30] [--json] [--workers 1] [--servers 1]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ('blocking', 'sync store', 'async', 'async+copy')


def build_dir():
    return os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))


def resnet50_shapes():
    """The 161 parameter tensors of torchvision's ResNet-50 (25.6M floats)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(width, cin, 1, 1), (width,), (width,), (width, width, 3, 3), (width,), (width,),
                       (4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if b == 0:
                shapes += [(4 * width, cin, 1, 1), (4 * width,), (4 * width,)]
            cin = 4 * width
    shapes += [(1000, 2048), (1000,)]
    return shapes


def parse_shapes(spec):
    if spec == 'resnet50':
        return resnet50_shapes()
    n, size = spec.lower().split('x')  # e.g. 100x64KiB, 8x4KiB
    mult = {'kib': 1024, 'mib': 1 << 20, 'b': 1}
    for suffix, m in mult.items():
        if size.endswith(suffix):
            return [(int(size[:-len(suffix)]) * m // 4,)] * int(n)
    raise SystemExit('--shapes: NxSIZE (e.g. 100x64KiB) or resnet50')


def worker(args):
    import numpy as np
    import pskv
    kv = pskv.create('dist_sync')
    shapes = parse_shapes(args.shapes)
    grads = [np.full(s, 1.0, np.float32) for s in shapes]
    outs = [np.zeros(s, np.float32) for s in shapes]
    keys = list(range(len(shapes)))
    kv.init(keys, [np.zeros(s, np.float32) for s in shapes])
    kv_sync = pskv.create('dist_sync', blocking=True)  # a second store of the job
    kv_sync.init(keys, [np.zeros(s, np.float32) for s in shapes])

    def step(mode):
        store = kv_sync if mode == 'sync store' else kv
        for k in reversed(keys):  # backward order, as a Trainer issues them
            g = grads[k].copy() if mode == 'async+copy' else grads[k]
            store.pushpull(k, g, out=outs[k], priority=-k)
            if mode == 'blocking':
                kv.wait(k)
        if mode not in ('blocking', 'sync store'):
            kv.wait_all()

    for mode in MODES:  # warm-up: connections, allocations
        step(mode)
    times = {m: [] for m in MODES}
    for _ in range(args.steps):
        for mode in MODES:
            t0 = time.perf_counter()
            step(mode)
            times[mode].append(time.perf_counter() - t0)
    expect = float(kv.num_workers)
    for o in outs:  # every mode computed the same sum
        assert o.flat[0] == expect, (o.flat[0], expect)
    if kv.rank == 0:
        med = {m: sorted(t)[len(t) // 2] for m, t in times.items()}
        nbytes = sum(int(np.prod(s)) * 4 for s in shapes)
        res = {'bench': 'py_pushpull', 'shapes': args.shapes, 'keys': len(shapes), 'bytes_per_step': nbytes,
               'workers': kv.num_workers, 'steps': args.steps,
               'ms_per_step': {m: round(v * 1e3, 3) for m, v in med.items()},
               'speedup_async_vs_blocking': round(med['blocking'] / med['async'], 3),
               'copy_cost_ratio': round(med['async+copy'] / med['async'], 3)}
        print('RESULT ' + json.dumps(res), flush=True)
    kv_sync.close()
    kv.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--shapes', default='100x64KiB')
    ap.add_argument('--steps', type=int, default=30)
    ap.add_argument('--workers', type=int, default=1)
    ap.add_argument('--servers', type=int, default=1)
    ap.add_argument('--json', action='store_true', help='print the result as one JSON line')
    ap.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    env = dict(os.environ, PYTHONPATH=os.path.join(build_dir(), 'python'))
    cmd = [os.path.join(build_dir(), 'pskv-launch'), '-n', str(args.workers), '-s', str(args.servers),
           '--timeout', '1800', '--', sys.executable, os.path.abspath(__file__), '--worker',
           '--shapes', args.shapes, '--steps', str(args.steps)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1900)
    out = p.stdout.decode()
    if p.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit('py_pushpull_bench: the job failed (exit %d)' % p.returncode)
    res = json.loads([l for l in out.splitlines() if 'RESULT ' in l][-1].split('RESULT ', 1)[1])
    if args.json:
        print(json.dumps(res))
    else:
        ms = res['ms_per_step']
        print('%s: %d keys, %.1f MB per step, %d worker(s), median of %d steps' %
              (res['shapes'], res['keys'], res['bytes_per_step'] / 1e6, res['workers'], res['steps']))
        for m in MODES:
            print('  %-12s %9.3f ms/step' % (m, ms[m]))
        print('  async is %.2f x faster than blocking; copying the inputs costs %.2f x'
              % (res['speedup_async_vs_blocking'], res['copy_cost_ratio']))


if __name__ == '__main__':
    main()
