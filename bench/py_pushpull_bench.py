#!/usr/bin/python3
"""py_pushpull_bench.py: a Python per-parameter loop over P keys (what a training
step's communication looks like from Python), three ways in the same run:

  * one by one: kv.pushpull(k, g, out=w) for every key, each complete when it returns
    (pskv's default since issue 22: one round trip after the other);
  * batch:      the same calls through ``with kv.batch() as b:`` (waited for once, at its end);
  * native:     the native store's calls, then one wait: the floor, without the Python
                package's bookkeeping (read-only flags, memory ordering).

1 worker + 1 server (dist_sync, real processes under build/pskv-launch). The modes
alternate step by step (same machine state); reported: the median step time per
mode and the one-by-one/batch ratio.

--trainer measures pskv.torch.Trainer.step() instead (parameters of the same shapes,
gradients set to ones): with --baseline DIR (a PYTHONPATH holding another pskv
package, e.g. an older release) the jobs of both packages alternate, --rounds times
each, and the medians of both are reported.

    /usr/bin/python3 bench/py_pushpull_bench.py [--shapes 100x64KiB|resnet50]
        [--steps 30] [--json] [--workers 1] [--servers 1] [--trainer [--baseline DIR]]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ('one by one', 'batch', 'native')


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
    if args.trainer:
        return trainer_worker(args)
    import numpy as np
    import pskv
    pskv.configure_process(tune_allocator=True)  # PSKV_* logging/metrics; allocator for big tensors
    kv = pskv.create('dist_sync')
    shapes = parse_shapes(args.shapes)
    grads = [np.full(s, 1.0, np.float32) for s in shapes]
    outs = [np.zeros(s, np.float32) for s in shapes]
    keys = list(range(len(shapes)))
    kv.init(keys, [np.zeros(s, np.float32) for s in shapes])

    def step(mode):
        if mode == 'native':
            for k in reversed(keys):
                kv._kv.pushpull([k], [grads[k]], [k], [outs[k]], -k, True)
            kv._kv.wait_all()
            return
        if mode == 'batch':
            with kv.batch() as b:
                for k in reversed(keys):  # backward order, as a Trainer issues them
                    b.pushpull(k, grads[k], out=outs[k], priority=-k)
            return
        for k in reversed(keys):
            kv.pushpull(k, grads[k], out=outs[k], priority=-k)

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
               'speedup_batch_vs_one_by_one': round(med['one by one'] / med['batch'], 3),
               'batch_vs_native': round(med['batch'] / med['native'], 3)}
        print('RESULT ' + json.dumps(res), flush=True)
    kv.close()


def trainer_worker(args):
    import torch
    import pskv
    import pskv.torch
    pskv.configure_process(tune_allocator=True)  # PSKV_* logging/metrics; allocator for big tensors
    kv = pskv.create('dist_sync')
    params = [torch.zeros(s, requires_grad=True) for s in parse_shapes(args.shapes)]
    trainer = pskv.torch.Trainer(params, pskv.optimizer.SGD(learning_rate=0.1), kv, loss_reduction='mean')
    times = []
    for i in range(args.steps + 3):
        for p in params:
            p.grad = torch.ones_like(p)
        t0 = time.perf_counter()
        trainer.step()
        if i >= 3:  # warm-up steps
            times.append(time.perf_counter() - t0)
    want = -0.1 * (args.steps + 3)
    assert abs(float(params[0].flatten()[0]) - want) < 1e-3, (float(params[0].flatten()[0]), want)
    if kv.rank == 0:
        med = sorted(times)[len(times) // 2]
        print('RESULT ' + json.dumps({'ms_per_step': round(med * 1e3, 3)}), flush=True)
    kv.close()


def run_job(args, pythonpath, trainer=False):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    cmd = [os.path.join(build_dir(), 'pskv-launch'), '-n', str(args.workers), '-s', str(args.servers),
           '--timeout', '1800', '--', sys.executable, os.path.abspath(__file__), '--worker',
           '--shapes', args.shapes, '--steps', str(args.steps)] + (['--trainer'] if trainer else [])
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1900)
    out = p.stdout.decode()
    if p.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit('py_pushpull_bench: the job failed (exit %d)' % p.returncode)
    return json.loads([l for l in out.splitlines() if 'RESULT ' in l][-1].split('RESULT ', 1)[1])


def trainer_main(args):
    packages = {'this': os.path.join(build_dir(), 'python')}
    if args.baseline:
        packages['baseline'] = os.path.abspath(args.baseline)
    runs = {name: [] for name in packages}
    for _ in range(args.rounds):
        for name, path in packages.items():
            runs[name].append(run_job(args, path, trainer=True)['ms_per_step'])
    med = {name: sorted(v)[len(v) // 2] for name, v in runs.items()}
    res = {'bench': 'py_trainer_step', 'shapes': args.shapes, 'workers': args.workers, 'steps': args.steps,
           'rounds': args.rounds, 'ms_per_step': med, 'runs': runs}
    if 'baseline' in med:
        res['this_vs_baseline'] = round(med['this'] / med['baseline'], 3)
    if args.json:
        print(json.dumps(res))
    else:
        print('Trainer.step, %s, %d worker(s), median of %d rounds x %d steps:' %
              (args.shapes, args.workers, args.rounds, args.steps))
        for name, v in med.items():
            print('  %-9s %9.3f ms/step  (rounds: %s)' % (name, v, ', '.join('%.3f' % x for x in runs[name])))
        if 'this_vs_baseline' in res:
            print('  this / baseline = %.3f' % res['this_vs_baseline'])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--shapes', default='100x64KiB')
    ap.add_argument('--steps', type=int, default=30)
    ap.add_argument('--workers', type=int, default=1)
    ap.add_argument('--servers', type=int, default=1)
    ap.add_argument('--json', action='store_true', help='print the result as one JSON line')
    ap.add_argument('--trainer', action='store_true', help='measure pskv.torch.Trainer.step() instead')
    ap.add_argument('--baseline', help='with --trainer: PYTHONPATH of another pskv package to compare with')
    ap.add_argument('--rounds', type=int, default=3, help='with --trainer: jobs per package')
    ap.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.trainer:
        return trainer_main(args)
    res = run_job(args, os.path.join(build_dir(), 'python'))
    if args.json:
        print(json.dumps(res))
    else:
        ms = res['ms_per_step']
        print('%s: %d keys, %.1f MB per step, %d worker(s), median of %d steps' %
              (res['shapes'], res['keys'], res['bytes_per_step'] / 1e6, res['workers'], res['steps']))
        for m in MODES:
            print('  %-12s %9.3f ms/step' % (m, ms[m]))
        print('  batch is %.2f x faster than one by one; batch / native = %.2f'
              % (res['speedup_batch_vs_one_by_one'], res['batch_vs_native']))


if __name__ == '__main__':
    main()
