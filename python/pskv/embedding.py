"""Dynamic embedding tables: u64 ids that grow on first use (docs/embedding.md).

A table maps ids from the whole u64 space to rows of ``width`` float32 values. A row
appears once its id was pushed ``admit_after`` times, filled by a deterministic per-id
initializer, leaves after ``ttl_steps`` steps without a push or when its shard is over
``capacity`` (least recently pushed first), and carries its own optimizer state
(lazy updates: only on the pushes that carry it). With a dist store the rows live on
the servers, sharded by a hash of the id; with a local store, in this process.

Examples
--------
>>> import numpy as np, pskv
>>> kv = pskv.create('local')
>>> t = pskv.embedding.create(kv, 7, width=4, optimizer='sgd', optimizer_params={'learning_rate': '1'})
>>> ids = np.array([3, 2**63 + 5, 3], np.uint64)       # any u64; repeats are summed
>>> rows = t.pull(ids)                                  # (3, 4) float32: the initializer's values
>>> t.push(ids, np.ones((3, 4), np.float32))            # one update of the table
>>> float(t.pull(np.array([3], np.uint64))[0, 0] - rows[0, 0])
-2.0
"""
import numpy as np

from . import _pskv

__all__ = ["EmbeddingTable", "create", "EmbeddingBag"]


def _ids(ids):
    a = np.ascontiguousarray(ids)
    if a.dtype == np.uint64:
        return a.view(np.int64)  # a u64 id travels as its bits
    if a.dtype != np.int64:
        raise _pskv.InvalidArgument('embedding ids must be int64 or uint64 (got %s): convert them with '
                                    'ids.astype(np.int64)' % a.dtype)
    return a


class EmbeddingTable:
    """A dynamic embedding table of a store; make it with :func:`create`."""

    def __init__(self, handle, store):
        self._t = handle
        self._store = store  # the store outlives its tables

    @property
    def key(self):
        return self._t.key

    @property
    def width(self):
        return self._t.width

    def pull(self, ids, timeout=0.0, versions=False):
        """The rows of ``ids`` (any shape, n ids): float32 (n, width). An id without a row
        reads the initializer's value (or zeros). ``versions=True`` also returns each
        row's version (the table's step of its last push, -1 without a row)."""
        rows, ver = self._t.pull(_ids(ids).reshape(-1), float(timeout))
        return (rows, ver) if versions else rows

    def push(self, ids, grads, timeout=0.0):
        """One update: gradients float32 (n, width) for ``ids`` (n). In dist_sync every
        worker pushes once per step (an empty push joins the step)."""
        self._t.push(_ids(ids).reshape(-1), np.ascontiguousarray(grads), float(timeout))


def create(kv, key, width, name=None, optimizer='adagrad', optimizer_params=None, init='uniform',
           init_range=(-0.01, 0.01), seed=0, admit_after=1, bloom_ids=None, bloom_fpr=0.01,
           unadmitted='initializer', ttl_steps=0, capacity=0, max_bytes=0):
    """Creates dynamic embedding table ``key`` of store ``kv`` (collective: every worker
    calls it with the same arguments).

    ``optimizer`` and ``optimizer_params`` as :class:`pskv.optimizer.Optimizer`'s
    (values as strings or numbers); ``init`` 'uniform' (``init_range`` = (low, high)),
    'normal' (``init_range`` = (mean, std)) or 'zeros'; ``admit_after`` sightings
    before a row exists, counted exactly or, with ``bloom_ids`` (the distinct ids
    expected), by a counting Bloom filter of false-positive rate ``bloom_fpr``;
    ``unadmitted`` ('initializer' or 'zeros') is what a pull of an id without a row
    reads; ``ttl_steps``, ``capacity`` (rows per shard, LRU) and ``max_bytes`` (per
    shard) bound the memory, 0 for none."""
    cfg = dict(name=name or ('embedding %d' % key), width=int(width), seed=int(seed), init=init,
               init_a=float(init_range[0]), init_b=float(init_range[1]), optimizer=optimizer,
               optimizer_params={k: str(v) for k, v in (optimizer_params or {}).items()},
               admit_after=int(admit_after), bloom_ids=bloom_ids, bloom_fpr=float(bloom_fpr),
               unadmitted=unadmitted, ttl_steps=int(ttl_steps), capacity=int(capacity),
               max_bytes=int(max_bytes))
    return EmbeddingTable(_pskv.create_embedding(kv._kv, int(key), cfg), kv)


def EmbeddingBag(table, mode='sum'):
    """A ``torch.nn.Module`` over ``table`` like ``torch.nn.EmbeddingBag`` (see
    :class:`pskv.torch.EmbeddingBag`)."""
    from .torch import EmbeddingBag as _Bag
    return _Bag(table, mode=mode)
