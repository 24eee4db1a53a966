#!/usr/bin/python3
"""click_prediction.py: a click-through-rate model whose parameters are mostly one
big embedding table (issue 15) — where a parameter server beats allreduce.

    PYTHONPATH=build/python build/pskv-launch -n 2 -s 2 -- \\
        /usr/bin/python3 examples/click_prediction.py --kv-store dist_sync

Model: nn.Embedding(rows, 64, sparse=True) looked up for FIELDS categorical features
per sample, concatenated, then a small MLP to one logit. The table's gradient is
sparse, so pskv.torch.Trainer pushes only the rows a batch touched (row_sparse), the
servers' AdaGrad updates only those rows, and each worker pulls the rows of its next
batch. `--dense` makes the table a dense key instead (the whole table every step).

Data: synthetic, from a known generating model, so the accuracy is checkable. Field f
draws ids from its own range of rows with Zipf-like popularity; every id has a true
scalar effect t[id] ~ N(0, 1); a click happens with probability
sigmoid(2 * (sum_f t[id_f] + 0.5 * t[id_0] * t[id_1])). The best possible accuracy
(the Bayes rate, predicting with the true probabilities) is printed next to the
model's; `--min-ratio` fails the run if accuracy / Bayes rate is below it.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

import pskv
import pskv.torch

FIELDS = 4


class Generator(object):
    """The generating model: same on every worker (seeded), a different sample stream
    per worker."""

    def __init__(self, rows, seed=7):
        rng = np.random.RandomState(seed)
        self.rows = rows
        self.per_field = rows // FIELDS
        self.effect = rng.randn(rows).astype(np.float32)
        # Zipf-like popularity within a field: id rank k has weight 1 / (k + 10)
        w = 1.0 / (np.arange(self.per_field) + 10.0)
        self.cdf = np.cumsum(w / w.sum())
        self.perm = [rng.permutation(self.per_field) for _ in range(FIELDS)]

    def batch(self, rng, n):
        u = rng.rand(n, FIELDS)
        k = np.minimum(np.searchsorted(self.cdf, u), self.per_field - 1)
        ids = np.stack([f * self.per_field + self.perm[f][k[:, f]] for f in range(FIELDS)], 1)
        t = self.effect[ids]
        logit = 2.0 * (t.sum(1) + 0.5 * t[:, 0] * t[:, 1])
        p = 1.0 / (1.0 + np.exp(-logit))
        y = (rng.rand(n) < p).astype(np.float32)
        return ids.astype(np.int64), y, p


class CTR(torch.nn.Module):
    def __init__(self, rows, dim, sparse):
        super().__init__()
        self.emb = torch.nn.Embedding(rows, dim, sparse=sparse)
        torch.nn.init.normal_(self.emb.weight, std=0.01)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(FIELDS * dim, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def forward(self, ids):
        return self.mlp(self.emb(ids).flatten(1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--kv-store', default='dist_sync')
    ap.add_argument('--rows', type=int, default=1 << 20, help='embedding rows (default 1M)')
    ap.add_argument('--dim', type=int, default=64)
    ap.add_argument('--batch-size', type=int, default=512, help='per worker')
    ap.add_argument('--steps', type=int, default=600)
    ap.add_argument('--lr', type=float, default=0.1)
    ap.add_argument('--dense', action='store_true', help='the table as a dense key (for comparison)')
    ap.add_argument('--test-size', type=int, default=20000)
    ap.add_argument('--min-ratio', type=float, default=0.0, help='fail if accuracy / Bayes rate is lower')
    ap.add_argument('--json', action='store_true', help='rank 0 prints one JSON line of results')
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    pskv.configure_process(tune_allocator=True)  # PSKV_* logging/metrics; allocator for big tensors
    kv = pskv.create(args.kv_store)
    gen = Generator(args.rows)
    model = CTR(args.rows, args.dim, sparse=not args.dense)
    trainer = pskv.torch.Trainer(model, pskv.optimizer.AdaGrad(learning_rate=args.lr), kv,
                                 loss_reduction='mean', update_on_kvstore=True)
    rng = np.random.RandomState(100 + kv.rank)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    ids, y, _ = gen.batch(rng, args.batch_size)
    t0 = time.time()
    for step in range(args.steps):
        x = torch.from_numpy(ids)
        loss = loss_fn(model(x), torch.from_numpy(y))
        loss.backward()
        ids, y, _ = gen.batch(rng, args.batch_size)  # the next batch: pull its rows
        if args.dense:
            trainer.step()
        else:
            trainer.step(row_ids=ids)
        if kv.rank == 0 and not args.json and (step + 1) % max(1, args.steps // 5) == 0:
            print('step %d loss %.4f' % (step + 1, loss.item()), flush=True)
    elapsed = time.time() - t0
    # Evaluation on fresh samples (the same on every worker): rows pulled first.
    test_ids, test_y, test_p = gen.batch(np.random.RandomState(999), args.test_size)
    if not args.dense:
        trainer.row_sparse_pull(model.emb.weight, test_ids)
    with torch.no_grad():
        pred = (model(torch.from_numpy(test_ids)) > 0).numpy().astype(np.float32)
    acc = float((pred == test_y).mean())
    bayes = float(((test_p > 0.5).astype(np.float32) == test_y).mean())
    samples = args.steps * args.batch_size * kv.num_workers
    res = {'workers': kv.num_workers, 'rows': args.rows, 'dense': args.dense, 'accuracy': acc,
           'bayes_accuracy': bayes, 'samples_per_s': samples / max(elapsed, 1e-9), 'seconds': elapsed}
    if kv.rank == 0:
        if args.json:
            print(json.dumps(res), flush=True)
        else:
            print('accuracy %.4f (Bayes rate %.4f, ratio %.3f); %.0f samples/s over %d workers' %
                  (acc, bayes, acc / bayes, res['samples_per_s'], kv.num_workers), flush=True)
    kv.close()
    if acc / bayes < args.min_ratio:
        print('accuracy %.4f is below %.2f x the Bayes rate %.4f' % (acc, args.min_ratio, bayes), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
