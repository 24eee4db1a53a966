#!/usr/bin/python3
"""embedding_train_bench.py: issue 41 item 8(b): the click model of
examples/criteo_embedding.py (26 Criteo-shaped categorical features, 13 dense, an MLP)
trained three ways in the same run, for 2 and 4 workers on this machine:

  * pskv dynamic: the rows in a dynamic table (u64 ids as they are) on the servers;
    workers pull their batch's distinct ids and push those rows' gradients.
  * pskv row_sparse: MXNet's fixed-shape table (--rows rows, ids hashed onto them),
    row_sparse gradients pushed by pskv.torch.Trainer, next batch's rows pulled.
  * torch DDP (gloo): the same model with the hashed table as a dense
    torch.nn.EmbeddingBag, its whole gradient all-reduced every step.

Reported per mode and worker count: samples/s (all workers), bytes on the wire per step
and worker, and the test AUC reached (pskv modes). pskv's bytes are measured (the
workers' per-peer counters, PSKV_METRICS_FILE) as the bytes of a run of --steps steps
minus those of a run of 0 steps; DDP's are computed from its ring all-reduce
(2 (W-1)/W x the parameter bytes per worker), since gloo keeps no counters.

    /usr/bin/python3 bench/embedding_train_bench.py [--workers 2,4] [--servers 2]
        [--steps 30] [--modes dynamic,row_sparse,ddp] [--json]
    /usr/bin/python3 bench/embedding_train_bench.py --cache-sweep 0,1,4,16 [--cache-rows 65536]
        [--workers 2] [--steps N] [--json]     # bench 8(c): bytes and AUC against S
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, 'examples', 'criteo_embedding.py')
sys.path.insert(0, HERE)
import sparse_bench  # noqa: E402  (the launch, byte-counting and DDP harness)


def run_pskv(args, table, cache=()):
    extra = ['--table', table, '--rows', str(args.rows), '--dim', str(args.dim), '--samples', str(args.samples),
             '--test-size', str(args.test_size)] + list(cache)
    res, wire = sparse_bench.launch_example(EXAMPLE, args.workers, args.servers, args.steps, args.batch_size, extra)
    _, wire0 = sparse_bench.launch_example(EXAMPLE, args.workers, args.servers, 0, args.batch_size, extra)
    return {'mode': 'pskv ' + table, 'samples_per_s': res['samples_per_s'], 'auc': res['auc'],
            'hidden_model_auc': res['hidden_model_auc'],
            'bytes_per_step_per_worker': max(0, wire - wire0) / res['steps'] / args.workers, 'bytes_measured': True,
            'pull_bytes_received_per_step': res.get('pull_bytes_received_per_step')}


def cache_sweep(args):
    """Bench 8(c) in training: the dynamic table behind a worker cache of --cache-rows
    rows, one job per staleness S (and one without a cache): rank 0's pulled bytes per
    step and the test AUC reached."""
    rows = []
    for s in [None] + [int(x) for x in args.cache_sweep.split(',')]:
        cache = [] if s is None else ['--cache-rows', str(args.cache_rows), '--staleness', str(s)]
        r = run_pskv(args, 'dynamic', cache)
        r.update(bench='embedding_cache', workers=args.workers, servers=args.servers, steps=args.steps,
                 batch_size=args.batch_size, dim=args.dim, staleness=s, cache_rows=0 if s is None else args.cache_rows)
        rows.append(r)
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print('S=%-5s pulled %.3f MB/step (rank 0), wire %.3f MB/step/worker, AUC %.4f' % (
                '-' if s is None else s, r['pull_bytes_received_per_step'] / 1e6,
                r['bytes_per_step_per_worker'] / 1e6, r['auc']), flush=True)
    return rows


def ddp_worker(rank, args, port, q):
    import torch
    sys.path.insert(0, os.path.join(ROOT, 'examples'))
    sys.path.insert(0, os.path.join(sparse_bench.build_dir(), 'python'))  # the example imports pskv
    import criteo_embedding as ce
    import pskv.synthetic
    sparse_bench.ddp_init(rank, args, port)
    data = pskv.synthetic.CriteoSynthetic(args.samples, seed=0, num_parts=args.workers, part_index=rank)
    lookup = ce.HashedLookup(args.rows, args.dim)
    lookup.emb = torch.nn.Embedding(args.rows, args.dim, sparse=False)  # DDP all-reduces dense gradients
    model = torch.nn.parallel.DistributedDataParallel(ce.ClickModel(lookup, data.num_sparse, data.num_dense,
                                                                    args.dim))
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    batches = data.batches(args.batch_size)

    def next_batch():
        dense, ids, labels = next(batches)
        return (dense, torch.from_numpy(ids)), torch.from_numpy(labels)

    sparse_bench.ddp_train_and_report(rank, args, q, model, opt, next_batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--workers', default='2,4', help='worker counts, comma-separated')
    ap.add_argument('--servers', type=int, default=2)
    ap.add_argument('--rows', type=int, default=1 << 20, help='the fixed tables\' rows (row_sparse, DDP)')
    ap.add_argument('--dim', type=int, default=16)
    ap.add_argument('--samples', type=int, default=400000)
    ap.add_argument('--test-size', type=int, default=10000)
    ap.add_argument('--steps', type=int, default=30)
    ap.add_argument('--batch-size', type=int, default=1024)
    ap.add_argument('--modes', default='dynamic,row_sparse,ddp')
    ap.add_argument('--cache-sweep', default='', help='staleness values S: the cache sweep instead (bench 8(c))')
    ap.add_argument('--cache-rows', type=int, default=65536)
    ap.add_argument('--json', action='store_true')
    args = ap.parse_args()
    if args.cache_sweep:
        args.workers = int(args.workers.split(',')[0])
        cache_sweep(args)
        return 0
    for workers in [int(w) for w in args.workers.split(',')]:
        args.workers = workers
        results = []
        for mode in args.modes.split(','):
            if mode in ('dynamic', 'row_sparse'):
                results.append(run_pskv(args, mode))
            elif mode == 'ddp':
                results.append(sparse_bench.run_ddp(args, target=ddp_worker))
            else:
                raise SystemExit('unknown mode %r' % mode)
        ref = next((r for r in results if r['mode'] == 'pskv row_sparse'), None)
        for r in results:
            r.update(workers=workers, servers=args.servers, rows=args.rows, dim=args.dim, steps=args.steps,
                     batch_size=args.batch_size)
            if ref:
                r['speed_vs_row_sparse'] = r['samples_per_s'] / ref['samples_per_s']
            if args.json:
                print(json.dumps(dict(bench='embedding_train', **r)), flush=True)
        if not args.json:
            print('embedding_train: 26 features x %d values, %d workers, %d servers, batch %d per worker, %d steps'
                  % (args.dim, workers, args.servers, args.batch_size, args.steps))
            print('%-18s %12s %16s %8s %10s' % ('mode', 'samples/s', 'MB/step/worker', 'AUC', 'vs sparse'))
            for r in results:
                print('%-18s %12.0f %14.2f%s %8s %10.3f' % (
                    r['mode'], r['samples_per_s'], r['bytes_per_step_per_worker'] / 1e6,
                    '' if r['bytes_measured'] else ' *', '%.4f' % r['auc'] if 'auc' in r else '-',
                    r.get('speed_vs_row_sparse', 1.0)))
            print('* computed (ring all-reduce), not measured')
    return 0


if __name__ == '__main__':
    sys.exit(main())
