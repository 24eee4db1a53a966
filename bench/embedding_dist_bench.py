#!/usr/bin/python3
"""embedding_dist_bench.py: a dist dynamic embedding table's worker cache and
checkpoints, measured in a real job (issue 41 bench 8(c) and 8(d) through the wiring).

A pskv-launch job of W workers and S servers (dist_sync). Every step each worker draws
a batch of `--batch` ids (Zipf with exponent 1 over `--ids` ranks, by the inverse CDF
of the continuous 1/x law, each rank scrambled into a u64 id), pulls their rows from
each table and pushes the same gradients to each. The tables (64 float32 per row,
AdaGrad, every id admitted) differ only in this worker's cache: none, and staleness
S = 0, 1, 4, 16 (`--cache-rows` rows). Reported per table (from table.stats(), counters,
not times): the bytes a worker's pulls received per step, and the cache's hit rate.
Then the uncached table is saved full, trained one step, saved as a delta, trained
`--delta-steps` more and saved again: the bytes of each save (all servers), and the
time of a restore of the full save and both deltas.

    /usr/bin/python3 bench/embedding_dist_bench.py [--workers 2] [--servers 2]
        [--ids 1048576] [--batch 8192] [--steps 100] [--warmup 20]
        [--cache-rows 65536] [--staleness 0,1,4,16] [--delta-steps 9]

--replicas 0,1,2 measures the replication's cost instead: one job per PSKV_REPLICAS
value (the same ids, one uncached table), each worker timing its pushes only (a sync
push returns once the round was applied and, replicated, acknowledged by every copy of
its range): the time of one push per step, and per row pushed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))


def batch(args, rank, step):
    rng = np.random.default_rng(rank * 1000003 + step)
    ranks = np.floor(np.exp(rng.random(args.batch) * np.log(args.ids))).astype(np.uint64)
    return (ranks * np.uint64(0x9E3779B97F4A7C15) + np.uint64(12345)).view(np.int64)


def push_worker(args, kv):
    """--replicas: the time of each step's push of one uncached table."""
    t = pskv_module().embedding.create(kv, 30, width=64, optimizer='adagrad',
                                       optimizer_params={'learning_rate': 0.05})
    rng = np.random.default_rng(kv.rank)
    times, rows = [], 0
    for i in range(args.warmup + args.steps):
        ids = batch(args, kv.rank, i)
        t.pull(ids)
        grads = rng.standard_normal((ids.size, 64)).astype(np.float32) * 0.01
        t0 = time.perf_counter()
        t.push(ids, grads)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            rows += np.unique(ids).size
    print('RESULT ' + json.dumps({'rank': kv.rank, 'push_s': times, 'rows': rows}), flush=True)
    kv.close()


def pskv_module():
    sys.path.insert(0, os.path.join(BUILD, 'python'))
    import pskv
    return pskv


def worker(args):
    pskv = pskv_module()
    kv = pskv.create('dist_sync')
    if args.replicas:
        return push_worker(args, kv)
    rank = kv.rank
    kw = dict(width=64, optimizer='adagrad', optimizer_params={'learning_rate': 0.05})
    stale = [int(s) for s in args.staleness.split(',')]
    tables = [pskv.embedding.create(kv, 30, **kw)]
    for k, s in enumerate(stale):
        tables.append(pskv.embedding.create(kv, 31 + k, cache_rows=args.cache_rows, staleness=s, **kw))
    rng = np.random.default_rng(rank)

    def step(i, which):
        ids = batch(args, rank, i)
        for t in which:
            t.pull(ids)
        grads = rng.standard_normal((ids.size, 64)).astype(np.float32) * 0.01
        for t in which:
            t.push(ids, grads)

    for i in range(args.warmup):
        step(i, tables)
    before = [t.stats() for t in tables]
    t0 = time.time()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i, tables)
    wall = time.time() - t0
    after = [t.stats() for t in tables]
    out = {'rank': rank, 'wall_s': wall, 'live': after[0]['live'], 'tables': []}
    for k, (b, a) in enumerate(zip(before, after)):
        planned = a['pulled_ids'] - b['pulled_ids'] + a['cache_hits'] - b['cache_hits']
        out['tables'].append({
            'staleness': None if k == 0 else stale[k - 1],
            'received_per_step': (a['pull_bytes_received'] - b['pull_bytes_received']) / args.steps,
            'sent_per_step': (a['pull_bytes_sent'] - b['pull_bytes_sent']) / args.steps,
            'distinct_per_step': planned / args.steps,
            'hit_rate': (a['cache_hits'] - b['cache_hits']) / max(1, planned),
            'cached': a['cache_rows']})
    # Checkpoints of the uncached table while it trains.
    ck = args.dir
    t = tables[0]
    t0 = time.time()
    full = t.save(ck, 'full')
    full_s = time.time() - t0
    step(10**6, [t])
    t0 = time.time()
    delta1 = t.save(ck, 'delta')
    delta1_s = time.time() - t0
    for i in range(args.delta_steps):
        step(10**6 + 1 + i, [t])
    delta2 = t.save(ck, 'delta')
    rows = t.stats()['live']
    t0 = time.time()
    t.restore(ck)
    restore_s = time.time() - t0
    out.update(full_bytes=full, delta1_bytes=delta1, delta_n_bytes=delta2, full_s=full_s,
               delta1_s=delta1_s, restore_s=restore_s, live_at_save=rows)
    print('RESULT ' + json.dumps(out), flush=True)
    kv.close()


def launch(args, timeout, launch_args=(), worker_args=()):
    """Runs this script's workers (--worker, `worker_args`, then this run's arguments) under
    pskv-launch with `launch_args`: their RESULT records, or None where the job failed or a
    worker wrote none (its output then goes to stderr)."""
    cmd = ([os.path.join(BUILD, 'pskv-launch'), '-n', str(args.workers), '-s', str(args.servers),
            '--timeout', str(timeout)] + list(launch_args)
           + ['--', sys.executable, os.path.abspath(__file__), '--worker'] + list(worker_args)
           + sys.argv[1:])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.decode()
    results = [json.loads(line.split('RESULT ', 1)[1]) for line in out.splitlines() if 'RESULT ' in line]
    if p.returncode or len(results) != args.workers:
        sys.stderr.write(out)
        return None
    return results


def replicas_sweep(args):
    print('%d workers x %d servers, %d-id batches over %d ids, 64-float rows, AdaGrad, %d steps'
          % (args.workers, args.servers, args.batch, args.ids, args.steps))
    print('| PSKV_REPLICAS | push per step (median, ms) | per row pushed (us) | against R=0 |')
    print('|---|---|---|---|')
    base = None
    for r in [int(x) for x in args.replicas.split(',')]:
        results = launch(args, 300, launch_args=['--env', 'PSKV_REPLICAS=%d' % r])
        if results is None:
            return 1
        med = float(np.median([x for res in results for x in res['push_s']]))
        per_row = np.mean([sum(res['push_s']) / res['rows'] for res in results])
        base = base or med
        print('| %d | %.2f | %.2f | %+.0f %% |' % (r, med * 1e3, per_row * 1e6, 100 * (med / base - 1)))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--workers', type=int, default=2)
    ap.add_argument('--servers', type=int, default=2)
    ap.add_argument('--ids', type=int, default=1 << 20)
    ap.add_argument('--batch', type=int, default=8192)
    ap.add_argument('--steps', type=int, default=100)
    ap.add_argument('--warmup', type=int, default=20)
    ap.add_argument('--cache-rows', type=int, default=65536)
    ap.add_argument('--staleness', default='0,1,4,16')
    ap.add_argument('--delta-steps', type=int, default=9)
    ap.add_argument('--replicas', default='', help='PSKV_REPLICAS values: the replication cost instead')
    ap.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    ap.add_argument('--dir', help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.replicas:
        return replicas_sweep(args)
    d = tempfile.mkdtemp(prefix='pskv-emb-bench-')
    try:
        results = launch(args, 900, worker_args=['--dir', d])
        if results is None:
            return 1
        r0 = results[0]
        print('%d workers x %d servers, %d-id batches over %d ids, %d steps: %d live rows, %.1f s'
              % (args.workers, args.servers, args.batch, args.ids, args.steps, r0['live'], r0['wall_s']))
        print('| S | distinct ids per step | hit rate | KB received per step and worker | against no cache |')
        print('|---|---|---|---|---|')
        base = np.mean([r['tables'][0]['received_per_step'] for r in results])
        for k, t in enumerate(r0['tables']):
            recv = np.mean([r['tables'][k]['received_per_step'] for r in results])
            hit = np.mean([r['tables'][k]['hit_rate'] for r in results])
            dist = np.mean([r['tables'][k]['distinct_per_step'] for r in results])
            name = 'no cache' if t['staleness'] is None else str(t['staleness'])
            print('| %s | %.0f | %.1f %% | %.1f | %+.1f %% |' % (name, dist, 100 * hit, recv / 1e3,
                                                              100 * (recv / base - 1)))
        print('checkpoints (all servers): full %.2f MB (%.2f s), delta after 1 step %.2f MB (%.1fx less, '
              '%.2f s), after %d more %.2f MB (%.1fx less); restore of the three %.2f s; %d live rows'
              % (r0['full_bytes'] / 1e6, r0['full_s'], r0['delta1_bytes'] / 1e6,
                 r0['full_bytes'] / r0['delta1_bytes'], r0['delta1_s'], args.delta_steps,
                 r0['delta_n_bytes'] / 1e6, r0['full_bytes'] / r0['delta_n_bytes'], r0['restore_s'],
                 r0['live_at_save']))
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
