"""A worker of test_embedding.py's dist job (pskv-launch, dist_sync, 2 workers x 2
servers) for the worker cache and checkpoints: pskv.torch.EmbeddingBag over three
tables of one configuration, pushed the same gradients: without a cache, with a cache
of staleness 0 (its rows must equal the uncached ones bit for bit, with the same pull
bytes) and of staleness 3 (fewer pull bytes); then save (full, delta), export, and
restore from Python."""
import sys

import numpy as np
import torch

import pskv
import pskv.torch


def batch(rank, step):
    rng = np.random.default_rng(rank * 100 + step)
    return (rng.zipf(1.3, size=(8, 5)).astype(np.uint64) * np.uint64(1000003)).view(np.int64)


def main():
    out_dir = sys.argv[1]
    kv = pskv.create('dist_sync')
    rank = kv.rank
    kw = dict(width=6, optimizer='adagrad', optimizer_params={'learning_rate': 0.5}, admit_after=2, ttl_steps=3)
    tables = [pskv.embedding.create(kv, 20, **kw),
              pskv.embedding.create(kv, 21, cache_rows=64, staleness=0, **kw),
              pskv.embedding.create(kv, 22, cache_rows=64, staleness=3, **kw)]
    bags = [pskv.torch.EmbeddingBag(t, mode='sum') for t in tables]
    every = np.unique(np.concatenate([batch(w, k).reshape(-1) for w in range(2) for k in range(8)]))
    for step in range(8):
        b = torch.from_numpy(batch(rank, step))
        outs = [bag(b) for bag in bags]
        assert torch.equal(outs[0], outs[1]), 'S = 0 differs from no cache at step %d' % step
        for o in outs:
            o.sum().backward()  # the same gradients to each table
        if step == 3:
            assert tables[0].save(out_dir, 'full') > 0
        if step == 5:
            assert tables[0].save(out_dir, 'delta') > 0
            before = tables[0].stats()['pull_bytes_received']
            saved = tables[0].pull(every, versions=True)
            snapshot_bytes = tables[0].stats()['pull_bytes_received'] - before
    s = [t.stats() for t in tables]
    assert s[0]['pull_bytes_received'] - snapshot_bytes == s[1]['pull_bytes_received'], s
    assert s[2]['pull_bytes_received'] < s[1]['pull_bytes_received'], s
    assert s[2]['cache_hits'] > 0 and s[0]['cache_rows'] == 0, s
    assert s[0]['live'] == s[1]['live'] and s[0]['dropped_grads'] > 0 and s[0]['step'] == 8, s
    rows, versions = tables[0].pull(every, versions=True)
    assert tables[0].export(out_dir + '/serve') > 0
    kv.barrier()
    ids, values = pskv.embedding.read_export(out_dir + '/serve', 20)
    live = versions >= 0
    order = np.argsort(ids.view(np.int64))
    assert np.array_equal(ids.view(np.int64)[order], every[live]), 'export ids'
    assert np.array_equal(values[order], rows[live]), 'export values'
    # Back to the save after step 5 (full after 3, delta after 5): the step is 6.
    tables[0].restore(out_dir)
    assert tables[0].stats()['step'] == 6
    got = tables[0].pull(every, versions=True)
    assert np.array_equal(got[0].view(np.int32), saved[0].view(np.int32)), 'restored rows'
    assert np.array_equal(got[1], saved[1]), 'restored versions'
    print('worker %d: embedding io passed' % rank, flush=True)
    kv.close()


if __name__ == '__main__':
    sys.exit(main())
