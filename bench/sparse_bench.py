#!/usr/bin/python3
"""sparse_bench.py: the click-prediction model of examples/click_prediction.py (a 1M x 64
embedding table plus a small MLP) trained three ways in the same run, on this machine:

  * pskv, row_sparse: the table's sparse gradient is pushed as the rows a batch
    touched; the servers update those rows; workers pull the next batch's rows.
  * pskv, dense: the same table as a dense key (the whole table every step).
  * PyTorch DDP (gloo): the same model with a dense table, all-reduced every step.

Reported per mode: samples/s (all workers) and bytes on the wire per step and worker.
pskv's bytes are measured (the workers' per-peer counters, PSKV_METRICS_FILE); DDP's
are computed from its ring all-reduce (2 (W-1)/W x the parameter bytes per worker),
since gloo keeps no counters. The dense pskv run and DDP are the ceilings' opposite:
they show what the table costs when it moves whole.

    /usr/bin/python3 bench/sparse_bench.py [--workers 2] [--servers 1] [--rows 1048576]
        [--steps 20] [--json] [--modes sparse,dense,ddp]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, 'examples', 'click_prediction.py')


def build_dir():
    return os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))


def peer_bytes(metrics_dir):
    """Bytes the workers exchanged with servers (both directions), from their metrics."""
    total = 0
    for f in glob.glob(os.path.join(metrics_dir, 'metrics.worker.*.txt')):
        for line in open(f):
            m = re.match(r'pskv_peer_bytes_total\{[^}]*peer="server\[\d+\]"[^}]*\} (\d+)', line)
            if m:
                total += int(m.group(1))
    return total


def run_pskv(args, dense):
    """samples/s of a run of args.steps steps; bytes per step = the bytes of that run
    minus those of a run of 0 steps (init and evaluation), divided by the steps."""
    res, wire = run_pskv_once(args, dense, args.steps)
    _, wire0 = run_pskv_once(args, dense, 0)
    return {'mode': 'pskv dense' if dense else 'pskv row_sparse', 'samples_per_s': res['samples_per_s'],
            'bytes_per_step_per_worker': max(0, wire - wire0) / args.steps / args.workers, 'bytes_measured': True}


def run_pskv_once(args, dense, steps):
    extra = ['--rows', str(args.rows), '--test-size', '1000'] + (['--dense'] if dense else [])
    return launch_example(EXAMPLE, args.workers, args.servers, steps, args.batch_size, extra)


def launch_example(example, workers, servers, steps, batch_size, extra):
    """Runs `example` (a training example that takes --kv-store, --steps, --batch-size and
    --json) under pskv-launch in dist_sync: its rank 0's JSON line and the bytes its
    workers exchanged with the servers."""
    with tempfile.TemporaryDirectory(prefix='pskv_sparse_bench_') as d:
        env = dict(os.environ, PYTHONPATH=os.path.join(build_dir(), 'python'))
        cmd = [os.path.join(build_dir(), 'pskv-launch'), '-n', str(workers), '-s', str(servers),
               '--timeout', '1800', '--env', 'PSKV_METRICS_FILE=%s' % os.path.join(d, 'metrics.txt'), '--',
               '/usr/bin/python3', example, '--kv-store', 'dist_sync', '--steps', str(steps),
               '--batch-size', str(batch_size), '--json'] + list(extra)
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = p.stdout.decode()
        if p.returncode != 0:
            raise RuntimeError('pskv run failed:\n' + out[-4000:])
        res = [json.loads(l[l.index('{'):]) for l in out.splitlines() if '{"workers"' in l][-1]
        return res, peer_bytes(d)


def ddp_worker(rank, args, port, q):
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join(ROOT, 'examples'))
    sys.path.insert(0, os.path.join(build_dir(), 'python'))  # the example imports pskv
    import click_prediction as cp
    ddp_init(rank, args, port)
    gen = cp.Generator(args.rows)
    model = torch.nn.parallel.DistributedDataParallel(cp.CTR(args.rows, 64, sparse=False))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    rng = np.random.RandomState(100 + rank)

    def next_batch():
        ids, y, _ = gen.batch(rng, args.batch_size)
        return (torch.from_numpy(ids),), torch.from_numpy(y)

    ddp_train_and_report(rank, args, q, model, opt, next_batch)


def ddp_init(rank, args, port):
    """One thread, the gloo process group of args.workers on 127.0.0.1:port, seed 0."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = str(port)
    dist.init_process_group('gloo', rank=rank, world_size=args.workers)
    torch.manual_seed(0)


def ddp_train_and_report(rank, args, q, model, opt, next_batch):
    """Trains DDP `model` for args.steps steps of `next_batch()` ((inputs...), labels)
    with a BCE loss; rank 0 puts samples/s and the ring all-reduce's bytes on `q`."""
    import torch
    import torch.distributed as dist
    loss_fn = torch.nn.BCEWithLogitsLoss()
    dist.barrier()
    t0 = time.time()
    for _ in range(args.steps):
        inputs, labels = next_batch()
        opt.zero_grad()
        loss_fn(model(*inputs), labels).backward()
        opt.step()
    dist.barrier()
    elapsed = time.time() - t0
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if rank == 0:
        q.put({'mode': 'torch DDP (gloo)', 'samples_per_s': args.steps * args.batch_size * args.workers / elapsed,
               'bytes_per_step_per_worker': 2.0 * (args.workers - 1) / args.workers * nbytes,
               'bytes_measured': False})
    dist.destroy_process_group()


def run_ddp(args, target=None):
    """Runs `target(rank, args, port, queue)` (default ddp_worker) in args.workers
    spawned processes; rank 0's result from the queue."""
    import socket
    import torch.multiprocessing as mp
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context('spawn')
    q = ctx.Queue()
    procs = [ctx.Process(target=target or ddp_worker, args=(r, args, port, q)) for r in range(args.workers)]
    for p in procs:
        p.start()
    import queue
    res = None
    deadline = time.time() + 3600
    while res is None:  # bounded, and a worker that died ends the wait
        try:
            res = q.get(timeout=1)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs) or time.time() > deadline:
                for p in procs:
                    p.kill()
                raise RuntimeError('a DDP worker failed (exit codes %s)' % [p.exitcode for p in procs])
    for p in procs:
        p.join(timeout=600)
        if p.exitcode != 0:
            raise RuntimeError('a DDP worker failed (exit %s)' % p.exitcode)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--workers', type=int, default=2)
    ap.add_argument('--servers', type=int, default=1)
    ap.add_argument('--rows', type=int, default=1 << 20)
    ap.add_argument('--steps', type=int, default=20)
    ap.add_argument('--batch-size', type=int, default=512)
    ap.add_argument('--modes', default='sparse,dense,ddp')
    ap.add_argument('--json', action='store_true')
    args = ap.parse_args()
    results = []
    for mode in args.modes.split(','):
        if mode == 'sparse':
            results.append(run_pskv(args, dense=False))
        elif mode == 'dense':
            results.append(run_pskv(args, dense=True))
        elif mode == 'ddp':
            results.append(run_ddp(args))
        else:
            raise SystemExit('unknown mode %r' % mode)
    ref = next((r for r in results if r['mode'] == 'pskv row_sparse'), None)
    for r in results:
        r.update(workers=args.workers, servers=args.servers, rows=args.rows, steps=args.steps,
                 batch_size=args.batch_size)
        if ref:
            r['speed_vs_row_sparse'] = r['samples_per_s'] / ref['samples_per_s']
        if args.json:
            print(json.dumps(dict(bench='sparse', **r)), flush=True)
    if not args.json:
        print('sparse: %d x %d embedding + MLP, %d workers, %d servers, batch %d per worker, %d steps'
              % (args.rows, 64, args.workers, args.servers, args.batch_size, args.steps))
        print('%-18s %12s %22s %10s' % ('mode', 'samples/s', 'MB/step/worker', 'vs sparse'))
        for r in results:
            print('%-18s %12.0f %20.2f%s %10.3f' % (r['mode'], r['samples_per_s'], r['bytes_per_step_per_worker'] / 1e6,
                                                   '' if r['bytes_measured'] else ' *',
                                                   r.get('speed_vs_row_sparse', 1.0)))
        print('* computed (ring all-reduce), not measured')
    return 0


if __name__ == '__main__':
    sys.exit(main())
