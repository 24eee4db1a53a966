#!/usr/bin/python3
"""criteo_embedding.py: click prediction on Criteo-shaped data over a dynamic embedding
table (issue 41 item 8) — the sparse part of a ranking model on CPU servers.

    PYTHONPATH=build/python build/pskv-launch -n 2 -s 2 -- \\
        /usr/bin/python3 examples/criteo_embedding.py --kv-store dist_sync

Data: ``pskv.synthetic.CriteoSynthetic``: 13 dense counts and 26 categorical features
whose values are u64 ids drawn from Zipf laws over the Criteo Kaggle set's
vocabularies (up to 10 M ids per feature), with labels from a hidden logistic model
whose own AUC is printed next to the model's. Each worker reads its part
(``num_parts``/``part_index``); the test samples follow the training samples.

Model: each categorical feature's id looked up in one embedding table (``--dim``
values per row), the 26 rows concatenated with the standardised ``log1p`` of the dense
counts, then an MLP to one logit. Two tables to choose from (``--table``):

* ``dynamic`` (default): a pskv dynamic table (``pskv.embedding``): ids as they are, a
  row made on an id's ``--admit-after``-th push, rows not pushed for ``--ttl-steps``
  steps evicted; the rows live on the servers, the worker pulls its batch's distinct
  ids and pushes their gradients (``pskv.torch.EmbeddingBag``); the servers' AdaGrad
  updates only those rows. The MLP is trained by ``pskv.torch.Trainer``.
* ``row_sparse``: MXNet's fixed-shape table: ``--rows`` rows declared up front, ids
  hashed onto them (collisions share a row), ``nn.Embedding(sparse=True)`` pushed as
  row_sparse gradients by the Trainer.

``--json`` makes rank 0 print one JSON line (samples/s, AUC, live rows), which
``bench/embedding_train_bench.py`` reads; ``--min-auc-ratio`` fails a run whose test
AUC is below that fraction of the hidden model's.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

import pskv
import pskv.embedding
import pskv.synthetic
import pskv.torch

TABLE_KEY = 1 << 20  # the dynamic table's key: clear of the Trainer's keys 0, 1, ...


def standardise(dense):
    """The dense counts as the model sees them (log1p, roughly unit scale)."""
    return torch.log1p(torch.from_numpy(dense)) * 0.25


class DynamicLookup(torch.nn.Module):
    """ids (B, F) -> (B, F * dim) over a pskv dynamic table (one id per bag)."""

    def __init__(self, table):
        super().__init__()
        self.bag = pskv.torch.EmbeddingBag(table, mode='sum')

    def forward(self, ids):
        b, f = ids.shape
        return self.bag(ids.reshape(-1, 1)).reshape(b, -1)


class HashedLookup(torch.nn.Module):
    """ids (B, F) -> (B, F * dim) over a fixed table of `rows` rows (the hashing trick)."""

    def __init__(self, rows, dim):
        super().__init__()
        self.rows = rows
        self.emb = torch.nn.Embedding(rows, dim, sparse=True)
        torch.nn.init.uniform_(self.emb.weight, -0.01, 0.01)

    def rows_of(self, ids):
        """The table rows of u64 ids (as int64 bits): the id modulo the row count."""
        return (np.ascontiguousarray(ids).view(np.uint64) % np.uint64(self.rows)).astype(np.int64)

    def forward(self, ids):
        return self.emb(torch.from_numpy(self.rows_of(ids.numpy()))).flatten(1)


class ClickModel(torch.nn.Module):
    def __init__(self, lookup, num_sparse, num_dense, dim):
        super().__init__()
        self.lookup = lookup
        self.mlp = torch.nn.Sequential(torch.nn.Linear(num_sparse * dim + num_dense, 128), torch.nn.ReLU(),
                                       torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, dense, ids):
        return self.mlp(torch.cat([self.lookup(ids), standardise(dense)], 1)).squeeze(1)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--kv-store', default='dist_sync')
    ap.add_argument('--table', choices=('dynamic', 'row_sparse'), default='dynamic')
    ap.add_argument('--samples', type=int, default=400000, help='training samples over all workers')
    ap.add_argument('--test-size', type=int, default=20000)
    ap.add_argument('--batch-size', type=int, default=1024, help='per worker')
    ap.add_argument('--steps', type=int, default=-1, help='stop after this many steps (default: one epoch)')
    ap.add_argument('--dim', type=int, default=16, help='values per embedding row')
    ap.add_argument('--rows', type=int, default=1 << 20, help='row_sparse: the fixed table\'s rows')
    ap.add_argument('--admit-after', type=int, default=1, help='dynamic: pushes before an id gets a row')
    ap.add_argument('--ttl-steps', type=int, default=0, help='dynamic: evict rows not pushed for this long')
    ap.add_argument('--cache-rows', type=int, default=0, help='dynamic: rows of the worker\'s cache (0: none)')
    ap.add_argument('--staleness', type=int, default=0,
                    help='dynamic: a cached row is refetched once it may be this many steps old')
    ap.add_argument('--lr', type=float, default=0.05, help='AdaGrad learning rate (table and MLP)')
    ap.add_argument('--min-auc-ratio', type=float, default=0.0,
                    help='fail if test AUC / the hidden model\'s AUC is below this')
    ap.add_argument('--json', action='store_true', help='rank 0 prints one JSON line of results')
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    pskv.configure_process(tune_allocator=True)
    kv = pskv.create(args.kv_store)
    workers = kv.num_workers
    data = pskv.synthetic.CriteoSynthetic(args.samples, seed=0, num_parts=workers, part_index=kv.rank)
    # Equal steps on every worker (dist_sync): the smallest part's full batches.
    steps = (args.samples // workers) // args.batch_size
    if args.steps >= 0:
        steps = min(steps, args.steps)
    elif steps < 1:
        raise SystemExit('--samples %d gives no full batch of %d per worker' % (args.samples, args.batch_size))

    if args.table == 'dynamic':
        # Each worker's loss is its batch's mean, the servers sum the workers' pushes:
        # 1/workers makes the table's step the mean over all workers, as the Trainer's.
        table = pskv.embedding.create(kv, TABLE_KEY, args.dim, optimizer='adagrad',
                                      optimizer_params={'learning_rate': args.lr, 'rescale_grad': 1.0 / workers},
                                      init='uniform', init_range=(-0.01, 0.01), seed=1,
                                      admit_after=args.admit_after, ttl_steps=args.ttl_steps,
                                      cache_rows=args.cache_rows, staleness=args.staleness)
        lookup = DynamicLookup(table)
    else:
        lookup = HashedLookup(args.rows, args.dim)
    model = ClickModel(lookup, data.num_sparse, data.num_dense, args.dim)
    trainer = pskv.torch.Trainer(model.mlp if args.table == 'dynamic' else model,
                                 pskv.optimizer.AdaGrad(learning_rate=args.lr), kv, loss_reduction='mean',
                                 update_on_kvstore=True)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batches = data.batches(args.batch_size)
    dense, ids, labels = next(batches) if steps else (None, None, None)
    t0 = time.time()
    for step in range(steps):
        loss = loss_fn(model(dense, torch.from_numpy(ids)), torch.from_numpy(labels))
        loss.backward()  # dynamic: the backward pass pushes the table's rows
        if step + 1 < steps:
            dense, ids, labels = next(batches)
        if args.table == 'dynamic':
            trainer.step()
        else:
            trainer.step(row_ids=lookup.rows_of(ids))  # pulls the next batch's rows
        if kv.rank == 0 and not args.json and (step + 1) % max(1, steps // 5) == 0:
            print('step %d/%d loss %.4f' % (step + 1, steps, loss.item()), flush=True)
    elapsed = time.time() - t0
    # The rows this worker's pulls received in training (the cache's saving), before evaluation.
    pulled = table.stats()['pull_bytes_received'] if args.table == 'dynamic' else None

    # Test samples: the ones after the training set (sample i depends only on the seed and i).
    full = pskv.synthetic.CriteoSynthetic(args.samples + args.test_size, seed=0)
    t_dense, t_ids, t_labels, t_p = full.read(args.samples, args.samples + args.test_size, with_probability=True)
    if args.table == 'row_sparse':
        trainer.row_sparse_pull(lookup.emb.weight, lookup.rows_of(t_ids))
    model.eval()
    with torch.no_grad():
        scores = torch.cat([model(t_dense[i:i + 4096], torch.from_numpy(t_ids[i:i + 4096]))
                            for i in range(0, len(t_labels), 4096)]).numpy()
    auc = pskv.synthetic.roc_auc(t_labels, scores)
    best = pskv.synthetic.roc_auc(t_labels, t_p)
    samples = steps * args.batch_size * workers
    res = {'workers': workers, 'table': args.table, 'steps': steps, 'batch_size': args.batch_size, 'dim': args.dim,
           'auc': auc, 'hidden_model_auc': best, 'samples_per_s': samples / max(elapsed, 1e-9), 'seconds': elapsed, 'cache_rows': args.cache_rows, 'staleness': args.staleness,
           'pull_bytes_received_per_step': pulled / max(steps, 1) if pulled is not None else None}
    if kv.rank == 0:
        if args.json:
            print(json.dumps(res), flush=True)
        else:
            print('test AUC %.4f (the hidden model\'s %.4f, ratio %.3f); %.0f samples/s over %d workers' %
                  (auc, best, auc / best, res['samples_per_s'], workers), flush=True)
    kv.close()
    if auc / best < args.min_auc_ratio:
        print('test AUC %.4f is below %.2f x the hidden model\'s %.4f' % (auc, args.min_auc_ratio, best),
              file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
