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

__all__ = ["EmbeddingTable", "create", "EmbeddingBag", "read_export"]


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

    def stats(self, timeout=0.0):
        """The table's counters as a dict: the servers' parts summed (``live``,
        ``admitted``, ``evicted_ttl``, ``evicted_capacity``, ``dropped_grads`` — gradient
        rows of ids not admitted yet —, ``pulled_rows``, ``pulled_defaults``,
        ``pending_ids``, ``memory_bytes``, ``step``) and this worker's pulls and cache
        (``pulls``, ``pulled_ids``, ``pull_bytes_sent``, ``pull_bytes_received``,
        ``cache_hits``, ``cache_evicted``, ``cache_rows``)."""
        return self._t.stats(float(timeout))

    def save(self, dir, kind='full', timeout=0.0):
        """Saves the table into directory ``dir``: ``kind`` 'full' (every live row; starts
        a chain) or 'delta' (the rows changed since the previous save). Collective: every
        worker calls it at the same point between steps; each server writes its part's
        file, atomically. Returns the bytes written."""
        if kind not in ('full', 'delta'):
            raise _pskv.InvalidArgument("save kind must be 'full' or 'delta', got %r" % (kind,))
        return self._t.save(str(dir), kind == 'full', float(timeout))

    def restore(self, dir, timeout=0.0):
        """Replaces the table's content with the newest save in ``dir`` (a full save and its
        deltas), saved by any number of servers. Collective. IOError naming the file and
        the fix for a missing or corrupt file (the table is left as it was)."""
        self._t.restore(str(dir), float(timeout))

    def export(self, dir, timeout=0.0):
        """Writes the live rows (id -> values) into ``dir`` for serving (one file per
        server; :func:`read_export` reads them). Collective. Returns the bytes written."""
        return self._t.export(str(dir), float(timeout))


def create(kv, key, width, name=None, optimizer='adagrad', optimizer_params=None, init='uniform',
           init_range=(-0.01, 0.01), seed=0, admit_after=1, bloom_ids=None, bloom_fpr=0.01,
           unadmitted='initializer', ttl_steps=0, capacity=0, max_bytes=0, cache_rows=0, staleness=0,
           cache_aging_steps=256):
    """Creates dynamic embedding table ``key`` of store ``kv`` (collective: every worker
    calls it with the same arguments).

    ``optimizer`` and ``optimizer_params`` as :class:`pskv.optimizer.Optimizer`'s
    (values as strings or numbers); ``init`` 'uniform' (``init_range`` = (low, high)),
    'normal' (``init_range`` = (mean, std)) or 'zeros'; ``admit_after`` sightings
    before a row exists, counted exactly or, with ``bloom_ids`` (the distinct ids
    expected), by a counting Bloom filter of false-positive rate ``bloom_fpr``;
    ``unadmitted`` ('initializer' or 'zeros') is what a pull of an id without a row
    reads; ``ttl_steps``, ``capacity`` (rows per shard, LRU) and ``max_bytes`` (per
    shard) bound the memory, 0 for none.

    ``cache_rows`` > 0 gives this worker a cache of that many hot rows in front of a dist
    table's pulls (an :class:`EmbeddingBag` over the table uses it): a pull asks the
    servers only for rows not cached or fetched more than ``staleness`` steps (this
    worker's pushes) ago, so a row read at step t is the servers' row of a step in
    [t - staleness, t]; ``staleness=0`` reads exactly what an uncached pull reads. A local
    store's table ignores the cache."""
    cfg = dict(name=name or ('embedding %d' % key), width=int(width), seed=int(seed), init=init,
               init_a=float(init_range[0]), init_b=float(init_range[1]), optimizer=optimizer,
               optimizer_params={k: str(v) for k, v in (optimizer_params or {}).items()},
               admit_after=int(admit_after), bloom_ids=bloom_ids, bloom_fpr=float(bloom_fpr),
               unadmitted=unadmitted, ttl_steps=int(ttl_steps), capacity=int(capacity),
               max_bytes=int(max_bytes), cache_rows=int(cache_rows), staleness=int(staleness),
               cache_aging_steps=int(cache_aging_steps))
    return EmbeddingTable(_pskv.create_embedding(kv._kv, int(key), cfg), kv)


def read_export(dir, key):
    """The export of table ``key`` in ``dir`` (:meth:`EmbeddingTable.export`): (ids uint64
    (n,), values float32 (n, width)), every server's live rows."""
    return _pskv.read_embedding_export(str(dir), int(key))


def EmbeddingBag(table, mode='sum'):
    """A ``torch.nn.Module`` over ``table`` like ``torch.nn.EmbeddingBag`` (see
    :class:`pskv.torch.EmbeddingBag`)."""
    from .torch import EmbeddingBag as _Bag
    return _Bag(table, mode=mode)
