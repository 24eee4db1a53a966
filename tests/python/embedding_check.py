"""A worker of test_embedding.py's dist job (pskv-launch, dist_sync): a
pskv.torch.EmbeddingBag over a dynamic table trains 4 steps on Zipf ids (each
worker's own; some repeat across steps); the pulled rows and versions must equal, bit
for bit, a local table pushed each step's gradients of every worker in rank order
(what the servers apply), admission and TTL included."""
import sys

import numpy as np
import torch

import pskv
import pskv.torch


def batch(rank, step):
    rng = np.random.default_rng(rank * 100 + step)
    ranks = rng.zipf(1.3, size=(8, 5)).astype(np.uint64)
    # u64 ids with the high bit set; each worker's own (a local table, the reference,
    # de-duplicates a whole push, while the servers count one sighting per worker)
    return (ranks * np.uint64(1000003) + np.uint64(2**63) + np.uint64(7 * rank)).view(np.int64)


def main():
    kv = pskv.create('dist_sync')
    rank, workers = kv.rank, kv.num_workers
    kw = dict(width=6, optimizer='adagrad', optimizer_params={'learning_rate': 0.5}, admit_after=2, ttl_steps=3)
    table = pskv.embedding.create(kv, 9, **kw)
    ref = pskv.embedding.create(pskv.create('local'), 9, **kw)
    bag = pskv.torch.EmbeddingBag(table, mode='mean')
    torch.manual_seed(0)  # the same dense layer on every worker
    dense = torch.nn.Linear(6, 1)
    for step in range(4):
        out = dense(bag(torch.from_numpy(batch(rank, step))))
        out.sum().backward()  # pushes the rows' gradients (this worker's part of the step)
        ids, grads = [], []
        for w in range(workers):  # every worker's push of this step, as the servers apply them
            b = torch.from_numpy(batch(w, step))
            unique, inverse = torch.unique(b.reshape(-1), return_inverse=True)
            rows = torch.from_numpy(ref.pull(unique.numpy())).requires_grad_(True)
            offsets = torch.arange(0, b.numel(), b.shape[1])
            dense(torch.nn.functional.embedding_bag(inverse, rows, offsets, mode='mean')).sum().backward()
            ids.append(unique.numpy())
            grads.append(rows.grad.numpy())
        dense.zero_grad()
        ref.push(np.concatenate(ids), np.concatenate(grads))
    every = np.unique(np.concatenate([batch(w, s).reshape(-1) for w in range(workers) for s in range(4)]))
    got, got_versions = table.pull(every, versions=True)
    want, want_versions = ref.pull(every, versions=True)
    assert np.array_equal(got.view(np.int32), want.view(np.int32)), 'rows differ'
    assert np.array_equal(got_versions, want_versions), 'versions differ'
    assert (want_versions == -1).any() and (want_versions >= 0).any(), 'admission did not act'
    print('worker %d: embedding passed' % rank, flush=True)
    kv.close()


if __name__ == '__main__':
    sys.exit(main())
