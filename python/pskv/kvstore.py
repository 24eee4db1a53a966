"""KVStore with MXNet's Python API (``mx.kv``) over the C++ core."""
import atexit
import sys
import threading
import warnings
import weakref

import numpy as np

from . import _pskv
from . import process as _process
from . import sparse as _sparse
from .optimizer import Optimizer


def _as_array(v, output=False):
    """A numpy view of a numpy array or a PyTorch CPU tensor (no copy). `output`: the
    array receives a result (a copy would receive it instead, so the advice differs)."""
    if isinstance(v, np.ndarray):
        if not v.flags['C_CONTIGUOUS']:
            raise _pskv.InvalidArgument(_CONTIGUOUS_OUT if output else
                                        'arrays must be C-contiguous (numpy.ascontiguousarray)')
        return v
    if type(v).__module__.startswith('torch'):
        if v.device.type != 'cpu':
            raise _pskv.InvalidArgument('only CPU tensors are supported on this build')
        if not v.is_contiguous():
            raise _pskv.InvalidArgument(_CONTIGUOUS_OUT if output else
                                        'tensors must be contiguous (call .contiguous())')
        return v.detach().numpy()
    raise TypeError('values must be numpy arrays or torch tensors, got %s' % type(v).__name__)


_CONTIGUOUS_OUT = ('an output must be C-contiguous: pull into a contiguous buffer (numpy.empty_like, '
                   'torch.empty_like) and copy it back (w[...] = buf); a contiguous copy of the output '
                   'would receive the result instead of it')


def _is_list(v):
    return isinstance(v, (list, tuple))


def _torch_watch(*values):
    """(tensor, version) of every torch tensor in `values` (nested lists too): torch
    tensors cannot be made read-only, but their version counter says whether an
    in-place operation touched them (pskv itself writes through a numpy view, which
    does not count). Not watched: views (a view shares its base's counter, so a
    change to another part of the base, e.g. of a flat gradient bucket, would look
    like one to the view) and inference tensors (they have no counter)."""
    for v in values:
        if v is not None and type(v) is not np.ndarray:
            break
    else:
        return ()  # the common case, cheaply
    out, seen = [], set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if _is_list(v):
            stack.extend(v)
        elif type(v).__module__.startswith('torch') and id(v) not in seen:
            seen.add(id(v))
            if v._base is None and not v.is_inference():
                out.append((v, v._version))
    return out


def _flatten(key, value, sparse_keys=None, output=False):
    """(key, value) in any of MXNet's shapes -> parallel flat lists (as MXNet).

    With `sparse_keys` (a container of the store's row_sparse keys), row_sparse values
    (RowSparseArray, torch sparse tensors, and ``(data, indices)`` pairs of a row_sparse
    key) are kept as they are; otherwise every value becomes a numpy array."""
    if type(value) is np.ndarray and type(key) in (int, str) and value.flags.c_contiguous:
        return [key], [value]  # the common case, cheaply
    if _is_list(key):
        if not _is_list(value) or len(key) != len(value):
            raise AssertionError('the number of keys and values differ')
        keys, vals = [], []
        for k, v in zip(key, value):
            k2, v2 = _flatten(k, v, sparse_keys, output)
            keys += k2
            vals += v2
        types = set(type(k) for k in keys)
        if len(types) > 1:
            raise AssertionError('inconsistent types of keys detected.')
        return keys, vals
    if isinstance(key, bool) or not isinstance(key, (int, str, np.integer)):
        raise AssertionError('unexpected type for keys: %s' % type(key).__name__)
    key = int(key) if isinstance(key, np.integer) else key
    if _is_list(value) and not _is_rows(key, value, sparse_keys):
        return [key] * len(value), [_value(key, v, sparse_keys, output) for v in value]
    return [key], [_value(key, value, sparse_keys, output)]


def _is_rows(key, v, sparse_keys):
    """A ``(data, indices)`` pair standing for one value of a row_sparse key (values
    only: a pull's outputs are never rows)."""
    return sparse_keys is not None and isinstance(v, tuple) and len(v) == 2 and key in sparse_keys


def _value(key, v, sparse_keys, output=False):
    if sparse_keys is not None and (_sparse.is_sparse(v) or _is_rows(key, v, sparse_keys)):
        return v
    return _as_array(v, output)


def _split_sparse(keys, vals):
    """Flat (keys, values) -> (dense keys, dense arrays, {key: [row_sparse values]})."""
    if all(type(v) is np.ndarray for v in vals):
        return keys, vals, {}
    dk, dv, sp = [], [], {}
    for k, v in zip(keys, vals):
        if isinstance(v, np.ndarray):
            dk.append(k)
            dv.append(v)
        else:
            sp.setdefault(k, []).append(v)
    both = set(dk).intersection(sp)
    if both:
        raise _pskv.InvalidArgument(
            'the values of key %s mix dense and row_sparse arrays: all values of one key must '
            'share one storage type' % _key_names(sorted(both, key=repr)))
    return dk, dv, sp


def _unique(keys):
    return list(dict.fromkeys(keys))


def _key_names(keys):
    return ', '.join(repr(k) for k in _unique(keys))


def _annotated(e, text):
    """`e` with `text` in its message (pskv errors, same type) or as a note (others)."""
    if isinstance(e, _pskv.Error) and len(e.args) == 1:
        new = type(e)('%s [%s]' % (e.args[0], text))
        new.__cause__ = e.__cause__
        return new.with_traceback(e.__traceback__)
    if hasattr(e, 'add_note'):
        e.add_note('pskv: ' + text)
    return e


class _Op(object):
    """One call issued in a batch, as the Python side tracks it until its batch ends
    (or it finished): what it was (for messages) and the torch tensors it watches. The
    binding keeps the rest: its arrays alive, read-only, and the bytes it uses (later
    calls on overlapping bytes wait for it)."""
    __slots__ = ('what', 'keys', 'completion', 'watched', 'batch')

    def __init__(self, what, keys, completion, watched, batch):
        self.what, self.keys, self.completion, self.watched, self.batch = what, keys, completion, watched, batch


class Batch(object):
    """Calls that travel together and are waited for once: ``with kv.batch() as b:``
    (see :meth:`KVStore.batch`). It has the store's ``push``, ``pull``, ``pushpull``
    and ``broadcast``, issued at once; their results are there when the block ends.

    Parameters
    ----------
    kv : KVStore
        The store (use :meth:`KVStore.batch`).
    """

    def __init__(self, kv):
        self._store = kv
        self._keys = {}  # keys of the calls issued through this batch (ordered set)
        self._misuse = []  # torch tensors modified in flight: raised at the end
        self._state = 'new'  # -> 'open' -> 'ended'

    def __enter__(self):
        if self._state != 'new':
            raise _pskv.UsageError('a batch is entered once: open a new one with "with kv.batch() as b:"')
        self._state = 'open'
        with self._store._book:
            self._store._batches.add(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        kv = self._store
        self._state = 'ended'
        try:
            if exc is None:
                self._finish()  # raises the first failure, naming the calls in flight
                return False
            try:  # the block raised: still wait, so that nothing is in flight after it
                self._finish()
            except Exception as e:  # noqa: BLE001 - the block's own exception goes first
                if hasattr(exc, 'add_note'):
                    exc.add_note('pskv: the calls of the batch failed too: %s: %s' % (type(e).__name__, e))
            return False
        finally:
            with kv._book:
                kv._batches.discard(self)

    def _finish(self):
        kv = self._store
        keys, self._keys = list(self._keys), {}
        if kv._kv is None:  # closed inside the block: close waited; report what it saw
            if keys and kv._close_error is not None:
                raise kv._close_error
            return
        if keys:
            kv._wait_keys(keys)
        if self._misuse:
            msgs, self._misuse = self._misuse, []
            raise _pskv.UsageError('; '.join(msgs))

    def _open(self):
        if self._state != 'open':
            raise _pskv.UsageError(
                'this batch is %s: issue its calls inside "with kv.batch() as b:" (its results are '
                'there when the block ends)' % ('not entered yet' if self._state == 'new' else 'over'))
        return self

    def _issued(self, keys):
        """Keys of calls issued on the native store directly (the Trainer): the end of
        the batch waits for them too."""
        self._open()
        for k in keys:
            self._keys[k] = None

    def push(self, key, value, priority=0):
        """:meth:`KVStore.push`, issued at once; `value` may be reused when the block ends.

        Parameters
        ----------
        key, value, priority
            As :meth:`KVStore.push`.
        """
        self._store._push(key, value, priority, self._open())

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """:meth:`KVStore.pull`, issued at once; `out` holds the values when the block ends.

        Parameters
        ----------
        key, out, priority, ignore_sparse
            As :meth:`KVStore.pull`.
        """
        self._store._pull(key, out, priority, ignore_sparse, self._open())

    def pushpull(self, key, value, out=None, priority=0):
        """:meth:`KVStore.pushpull`, issued at once; results when the block ends.

        Parameters
        ----------
        key, value, out, priority
            As :meth:`KVStore.pushpull`.
        """
        self._store._pushpull(key, value, out, priority, self._open())

    def broadcast(self, key, value, out, priority=0):
        """:meth:`KVStore.broadcast` (the init waits), the pull issued at once.

        Parameters
        ----------
        key, value, out, priority
            As :meth:`KVStore.broadcast`.
        """
        self._store._broadcast(key, value, out, priority, self._open())

    def wait(self, key=None):
        """Waits early for this batch's calls on `key` (all of them if None), to read a
        result inside the block.

        Parameters
        ----------
        key : int, str, list, or None, optional
            The key(s).
        """
        self._open()
        keys = list(self._keys) if key is None else (key if _is_list(key) else [key])
        if keys:
            self._store._wait_keys(keys)

    @property
    def pending(self):
        """The number of this store's calls still in flight (issued in batches).

        Returns
        -------
        int
        """
        return self._store.pending


class KVStore(object):
    """A key-value store of arrays, with MXNet's ``mx.kv.KVStore`` API.

    Create it with :func:`pskv.create`, not directly. Every call is complete when it
    returns: a ``pull``'s outputs hold the result and a ``push``'s inputs may be
    reused. To issue many calls that travel together and are waited for once, issue
    them through a batch, ``with kv.batch() as b: b.pushpull(...)`` — the outputs hold
    their results when the block ends (see :meth:`batch`).

    Parameters
    ----------
    handle : _pskv.KVStore
        The C++ store (internal).

    Examples
    --------
    >>> import numpy as np, pskv
    >>> kv = pskv.create('local')
    >>> kv.init('w', np.zeros(3, np.float32))
    >>> kv.pushpull('w', np.ones(3, np.float32))
    """

    #: The capability :meth:`is_capable` knows (MXNet's ``KVStore.OPTIMIZER``).
    OPTIMIZER = 'optimizer'

    def __init__(self, handle):
        self._kv = handle
        # Batches' bookkeeping, guarded by _book (threads may share a store):
        self._book = threading.RLock()
        self._batches = set()  # Batch objects whose block is open
        self._ops = []  # _Op issued in batches, not yet released, in issue order
        self._sweep_at = 64  # amortised sweeping of finished _Op (see _track)
        self._close_error = None  # what close() saw failing (raised by open batches' ends)
        self._str_names = []  # string keys in first-init order = their int ids (as in C++)
        self._next_key = 0  # int keys handed out to Trainers sharing this store
        self._sparse = {}  # row_sparse key -> (shape, dtype), from init
        self._warned_sparse = set()  # keys whose row_sparse pull outputs were ignored

    def _reserve_keys(self, n):
        """A range of n int keys for one Trainer (several may share a store; they
        must be created in the same order on every worker)."""
        base = self._next_key
        self._next_key += n
        return base

    # --- properties
    @property
    def type(self):
        """The store type given to :func:`create` (``'local'``, ``'dist_sync'``, ...).

        Returns
        -------
        str
        """
        return self._kv.type

    @property
    def rank(self):
        """This worker's rank, 0 .. ``num_workers - 1`` (0 for non-dist stores).

        Returns
        -------
        int
        """
        return self._kv.rank

    @property
    def num_workers(self):
        """The number of workers of the job (1 for non-dist stores).

        Returns
        -------
        int
        """
        return self._kv.num_workers

    def is_capable(self, capability):
        """Whether the store supports `capability` (MXNet's ``is_capable``).

        Parameters
        ----------
        capability : str
            ``'optimizer'`` (:attr:`OPTIMIZER`): the store can run an optimizer (every
            pskv store can, on the servers in dist mode).

        Returns
        -------
        bool

        Raises
        ------
        ValueError
            An unknown capability (MXNet's error).
        """
        if isinstance(capability, str) and capability.lower() == KVStore.OPTIMIZER:
            return True
        raise ValueError('Unknown capability: %s' % (capability,))

    # --- data
    def init(self, key, value):
        """Initialises keys with values (MXNet's ``init``); in dist mode rank 0's value wins.

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s); all of one type. String keys get ids in first-init order.
        value : numpy.ndarray, torch.Tensor, RowSparseArray, or list of them
            One array per key (a list for a list of keys). A row_sparse value (a
            :class:`pskv.RowSparseArray` or a torch sparse tensor) makes a row_sparse key.

        Raises
        ------
        pskv.KeyError
            A key was initialised before.
        """
        keys, vals = _flatten(key, value, ())
        keys, vals, sparse = _split_sparse(keys, vals)
        if keys:
            self._kv.init(keys, vals)
            self._remember(keys)
        for k, vs in sparse.items():
            if len(vs) != 1:
                raise _pskv.InvalidArgument('init of key %r: one value per key (got %d)' % (k, len(vs)))
            self._init_row_sparse(k, vs[0])

    def _init_row_sparse(self, key, value):
        rsp = _sparse.row_sparse_array(value)
        self._kv.init_row_sparse([key], list(rsp.shape), rsp.indices, rsp.data)
        self._remember([key])
        self._sparse[key] = (rsp.shape, rsp.data.dtype)

    def _rsp_of(self, key, v):
        if isinstance(v, tuple) and len(v) == 2 and key in self._sparse:
            return _sparse.row_sparse_array(v, shape=self._sparse[key][0])
        return _sparse.row_sparse_array(v)

    def _remember(self, keys):
        if keys and isinstance(keys[0], str):
            known = set(self._str_names)
            for k in keys:
                if k not in known:
                    self._str_names.append(k)
                    known.add(k)

    # --- calls: complete when they return, or in flight until their batch ends
    def batch(self):
        """A batch: calls that travel together and are waited for once, at the end of
        its block.

        ``with kv.batch() as b:`` gives a :class:`Batch` with the store's ``push``,
        ``pull``, ``pushpull`` and ``broadcast``; issued through `b`, they return at
        once, so P calls cost about one round trip instead of P. When the block ends
        (also when it raises), pskv waits for every call issued through `b`: then every
        output holds its result and every input may be reused. The first failure of
        those calls is raised there, naming the calls in flight; if the block itself
        raised, its exception goes on, with the calls' failure added as a note.

        The store's own methods (``kv.pull``...) stay complete on return, inside the
        block too: only what goes through `b` is in flight. Inside the block, read the
        outputs of `b`'s calls after it ends (or after ``b.wait(key)``). pskv keeps
        what it can see right: a call (of any batch, or a plain one) whose bytes
        overlap those of a call in flight waits for that call first when one of them
        writes them, as MXNet's engine ordered NDArrays; the numpy arrays passed to a
        batch's calls are read-only until the call is done (a write raises
        ``ValueError``); a torch tensor passed to one and modified in place meanwhile
        makes the end of the batch raise :class:`pskv.UsageError`.

        Returns
        -------
        Batch
            Use it as a context manager.

        Examples
        --------
        >>> import numpy as np, pskv
        >>> kv = pskv.create('local')
        >>> kv.init([0, 1], [np.zeros(2, np.float32), np.zeros(2, np.float32)])
        >>> grads = [np.ones(2, np.float32), np.full(2, 2, np.float32)]
        >>> with kv.batch() as b:
        ...     for k, g in enumerate(grads):
        ...         b.pushpull(k, g)           # in flight: do not read g here
        >>> grads[1].tolist()                  # the block ended: results are in
        [2.0, 2.0]
        """
        return Batch(self)

    def _track(self, what, keys, completion, values=(), batch=None):
        """After a call was issued: a plain call waits for it (its failure is raised
        here); a batch's call is noted (its keys in the batch, the torch tensors among
        `values`, what the caller passed, watched) until released."""
        if batch is None:
            try:
                self._kv.wait(_unique(keys))
            except Exception as e:  # noqa: BLE001 - re-raised naming the call
                new = _annotated(e, '%s of key %s failed' % (what, _key_names(keys)))
                if new is e:
                    raise
                raise new from None
            return
        batch_keys = batch._keys
        for k in keys:
            batch_keys[k] = None
        if completion is None:
            return  # nothing of the caller's in flight (row_sparse pushes copy their rows)
        op = _Op(what, keys, completion, _torch_watch(*values), batch)
        with self._book:
            ops = self._ops
            ops.append(op)
            sweep = len(ops) >= self._sweep_at
        if sweep:  # a long batch: release what finished (amortised)
            self._sweep()

    def _release(self, op):
        for t, version in op.watched:
            if t._version != version and len(op.batch._misuse) < 8:
                op.batch._misuse.append(
                    '%s of key %s: a torch tensor given to it was modified in place before the '
                    'call was done (its version went from %d to %d): what was pushed or pulled may '
                    'be wrong. Modify it after the batch, or pass a copy (tensor.clone())' %
                    (op.what, _key_names(op.keys), version, t._version))

    def _sweep(self, waited=None):
        """Releases finished calls, and calls whose keys are all in `waited` (a set;
        True: every call)."""
        with self._book:
            keep = []
            for op in self._ops:
                if (waited is True or op.completion.done or
                        (waited is not None and all(k in waited for k in op.keys))):
                    self._release(op)
                else:
                    keep.append(op)
            self._ops = keep
            self._sweep_at = max(64, 2 * len(keep))

    def _in_flight(self, keys=None):
        ks = None if keys is None else set(keys)
        with self._book:
            ops = [op for op in self._ops if ks is None or any(k in ks for k in op.keys)]
        return '; '.join('%s of key %s' % (op.what, _key_names(op.keys)) for op in ops[:8]) + \
            (' and %d more' % (len(ops) - 8) if len(ops) > 8 else '')

    @property
    def pending(self):
        """The number of calls whose arrays pskv still uses (issued in a batch, not
        finished): their arrays are kept alive by the store.

        Returns
        -------
        int
        """
        return self._kv.pending()

    def push(self, key, value, priority=0):
        """Pushes values; the values of one key are summed (over devices, and over
        workers in dist mode) and applied by the updater or optimizer, if any.

        When it returns the push is done and `value` may be reused (issued through a
        :meth:`batch`: when the batch ends).

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s); each must have been initialised.
        value : array, RowSparseArray, list of them, or list of lists
            One array per key, or a list of arrays per key (several devices, summed).
            Row_sparse values (:class:`pskv.RowSparseArray`, torch sparse tensors,
            ``(data, indices)`` pairs of a row_sparse key) may stand in the lists.
        priority : int, optional
            Higher priorities are sent first (MXNet's hint).

        Raises
        ------
        pskv.KeyError
            A key was never initialised.
        pskv.ShapeError
            A value's shape or dtype differs from the key's.
        """
        self._push(key, value, priority, None)

    def _push(self, key, value, priority, batch):
        keys, vals = _flatten(key, value, self._sparse)
        keys, vals, sparse = _split_sparse(keys, vals)
        for k, vs in sparse.items():
            rsps = [self._rsp_of(k, v) for v in vs]
            shape = list(self._sparse[k][0]) if k in self._sparse else list(rsps[0].shape)
            # The rows are copied: nothing of the caller's stays in flight.
            self._kv.push_row_sparse([k], shape, [(r.indices, r.data) for r in rsps], priority)
            self._track('push', [k], None, (), batch)
        if not keys:
            return
        c = self._kv.push(keys, vals, priority, batch is not None)
        self._track('push', keys, c, (value,), batch)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Pulls rows `row_ids` of a row_sparse key (MXNet's ``row_sparse_pull``) and
        waits for them: the rows pulled decide the size of the result, which a
        RowSparseArray cannot hide, so this call blocks (other keys' calls stay in flight).

        Parameters
        ----------
        key : int or str
            A key initialised with a row_sparse value.
        out : RowSparseArray or list of them, optional
            Filled in place (its ``indices`` and ``data`` replaced); with None a new
            RowSparseArray is returned.
        priority : int, optional
            Higher priorities are served first.
        row_ids : array or list of arrays
            Row ids (any integer dtype and shape; flattened, de-duplicated and sorted).
            One array for several outputs gives each the same rows.

        Returns
        -------
        RowSparseArray or list of RowSparseArray
            `out` (or the new arrays): exactly the requested rows, other rows zero.

        Raises
        ------
        pskv.UsageError
            The key is dense (MXNet's rule: row_sparse_pull needs a row_sparse key).
        pskv.KeyError
            A row id is out of range.
        """
        assert row_ids is not None, 'row_sparse_pull needs row_ids'
        if key not in self._sparse:
            raise _pskv.UsageError(
                'RowSparsePull of key %r: the key is not row_sparse in this store (init it with '
                'a row_sparse value: pskv.row_sparse_array, a torch sparse tensor)' % (key,))
        shape, dtype = self._sparse[key]
        ids = row_ids if _is_list(row_ids) else [row_ids]
        ids = [np.ascontiguousarray(_sparse._numpy(i)) for i in ids]
        outs = out if _is_list(out) else ([out] if out is not None else [None] * len(ids))
        if len(ids) == 1 and len(outs) > 1:
            ids = ids * len(outs)
        if len(ids) != len(outs):
            raise AssertionError("the number of row_ids doesn't match the number of values")
        pending = self._kv.row_sparse_pull_start([key], list(shape), np.dtype(dtype).name, ids, priority)
        self.wait(key)
        return self._row_sparse_result(key, pending, out, outs, row_ids)

    def _row_sparse_start(self, key, row_ids, priority=0):
        """Schedules a row_sparse pull of one output (the Trainer: several keys in
        flight, one wait); read it with _row_sparse_result after a wait of `key`."""
        shape, dtype = self._sparse[key]
        ids = [np.ascontiguousarray(_sparse._numpy(row_ids))]
        return self._kv.row_sparse_pull_start([key], list(shape), np.dtype(dtype).name, ids, priority)

    def _row_sparse_result(self, key, pending, out=None, outs=(None,), row_ids=None):
        shape = self._sparse[key][0]
        got = pending.result()
        result = []
        for o, (idx, data) in zip(outs, got):
            if o is None:
                o = _sparse.RowSparseArray(data, idx, shape)
            else:
                o.indices, o.data = idx, data.reshape((len(idx),) + tuple(shape[1:]))
            result.append(o)
        return result if _is_list(out) or (out is None and _is_list(row_ids)) else result[0]

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Pulls the current values of keys into `out`, in place.

        When it returns, `out` holds the values (issued through a :meth:`batch`: when
        the batch ends). The pull sees every push of the key issued before it.

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s).
        out : array, list of arrays, or list of lists of arrays
            Where to write (every array of a key's list receives the value). Required.
        priority : int, optional
            Higher priorities are served first.
        ignore_sparse : bool, optional
            True (MXNet's default): row_sparse outputs (RowSparseArray, torch sparse
            tensors) in `out` are skipped, with a warning once per key — pull their
            rows with :meth:`row_sparse_pull`. False: such an output is an error.

        Raises
        ------
        pskv.UsageError
            A row_sparse output with ``ignore_sparse=False``.
        """
        self._pull(key, out, priority, ignore_sparse, None)

    def _pull(self, key, out, priority, ignore_sparse, batch):
        assert out is not None, 'pull needs out'
        keys, outs = _flatten(key, out, (), output=True)  # no (data, indices) outputs
        keys, outs, sparse = _split_sparse(keys, outs)
        if sparse:
            if not ignore_sparse:
                raise _pskv.UsageError(
                    'pull of key %s into a row_sparse output: pull fills dense arrays only; use '
                    'kv.row_sparse_pull(key, out, row_ids=...) for rows, or ignore_sparse=True to '
                    'skip such outputs' % _key_names(list(sparse)))
            new = [k for k in sparse if k not in self._warned_sparse]
            if new:
                self._warned_sparse.update(new)
                warnings.warn('pskv: pull of key %s: row_sparse outputs ignored (ignore_sparse=True); '
                              'use kv.row_sparse_pull for their rows' % _key_names(new), stacklevel=3)
        if not keys:
            return
        c = self._kv.pull(keys, outs, priority, True, batch is not None)
        self._track('pull', keys, c, (out,), batch)

    def pushpull(self, key, value, out=None, priority=0):
        """Pushes `value` and pulls the result into `out` in one round trip per key.

        When it returns, `out` (`value` when None) holds the result and `value` may be
        reused (issued through a :meth:`batch`: when the batch ends).

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s).
        value : array, list of arrays, or list of lists of arrays
            The values pushed (summed as in :meth:`push`).
        out : array or list, optional
            Where the result is written; ``None`` writes it back into `value`.
        priority : int, optional
            Higher priorities are served first.
        """
        self._pushpull(key, value, out, priority, None)

    def _pushpull(self, key, value, out, priority, batch):
        keys, vals = _flatten(key, value, self._sparse, output=out is None)
        if any(type(v) is not np.ndarray for v in vals):
            raise _pskv.UsageError('pushpull of key %s with row_sparse values: use push, then '
                                   'row_sparse_pull for the rows' % _key_names(keys))
        if out is None:
            okeys, outs = keys, vals
        else:
            okeys, outs = _flatten(key, out, output=True)
        c = self._kv.pushpull(keys, vals, okeys, outs, priority, True, batch is not None)
        self._track('pushpull', keys + okeys, c, (value, out), batch)

    def broadcast(self, key, value, out, priority=0):
        """Initialises keys with `value` (rank 0's in dist mode) and pulls them into `out`.

        When it returns, `out` holds the values (issued through a :meth:`batch`: when
        the batch ends).

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s), not initialised before.
        value : array or list of arrays
            The initial values.
        out : array or list
            Where every worker receives the initial values.
        priority : int, optional
            Higher priorities are served first.
        """
        self._broadcast(key, value, out, priority, None)

    def _broadcast(self, key, value, out, priority, batch):
        keys, vals = _flatten(key, value)
        self._kv.order(vals, [])  # init reads `value` now: after calls in flight writing it
        try:
            self._kv.init(keys, vals)
            self._remember(keys)
        except _pskv.KeyError as e:
            raise _pskv.KeyError(str(e) + ' (broadcast initialises its keys: check for an earlier '
                                 'kv.init or kv.broadcast of the same key)')
        self._pull(key, out, priority, True, batch)

    def _wait_keys(self, keys):
        """Waits for the calls on `keys` (None: every key), releasing them; a failure
        names the calls in flight."""
        if keys is not None:
            keys = [int(k) if isinstance(k, np.integer) else k for k in keys]
        waited = True if keys is None else set(keys)
        try:
            if keys is None:
                self._kv.wait_all()
            else:
                self._kv.wait(list(keys))
        except Exception as e:  # noqa: BLE001 - re-raised with what was in flight
            new = self._with_ops(e, keys)
            # A failure is reported once the keys' operations ended; a timeout is not.
            self._sweep(None if isinstance(e, _pskv.TimeoutError) else waited)
            if new is e:
                raise
            raise new from None
        self._sweep(waited)

    def wait(self, key=None):
        """Blocks until the calls issued on `key` (all keys if None) are done. Calls
        are done when they return, or when their :meth:`batch` ends: this only serves
        to read a batch's result before its end (``b.wait(key)`` does the same).

        Parameters
        ----------
        key : int, str, list, or None, optional
            The key(s) to wait for; ``None`` waits for every key.

        Raises
        ------
        pskv.Error
            The first error of a call on the keys (an updater's exception too),
            naming the calls that were in flight on them.
        pskv.TimeoutError
            ``PSKV_TIMEOUT`` passed.
        """
        if key is None:
            return self.wait_all()
        self._wait_keys(key if _is_list(key) else [key])

    def wait_all(self):
        """Blocks until every call issued is done (MXNet's ``mx.nd.waitall()``).

        Raises
        ------
        pskv.Error
            The first error of a call, naming the calls in flight.
        """
        self._wait_keys(None)

    def _with_ops(self, e, keys):
        """`e` with the calls in flight on `keys` in its message (pskv errors) or a note."""
        what = self._in_flight(keys)
        return _annotated(e, 'in flight when the wait failed: ' + what) if what else e

    # --- updates
    def set_optimizer(self, optimizer):
        """Runs `optimizer` on every push (on the servers in dist mode).

        Parameters
        ----------
        optimizer : pskv.optimizer.Optimizer or str
            An optimizer, or its name with default parameters (``'sgd'``, ``'adam'``, ...).
        """
        if isinstance(optimizer, str):
            from . import optimizer as opt_mod
            optimizer = opt_mod.create(optimizer)
        if not isinstance(optimizer, Optimizer):
            raise TypeError('set_optimizer needs a pskv.optimizer.Optimizer')
        ids = {name: i for i, name in enumerate(self._str_names)}
        self._kv.set_optimizer(optimizer.name, optimizer.params(ids))

    def set_updater(self, updater):
        """Runs a Python function on every push (non-dist stores), instead of an optimizer.

        An exception it raises is raised by the pull/pushpull/wait that covers the key.

        Parameters
        ----------
        updater : callable
            ``updater(key, recv, stored)``: key as given to init (int or str), recv and
            stored as numpy views; update `stored` in place.
        """
        names = self._str_names

        def call(key_id, recv, stored):
            key = names[key_id] if names else key_id
            try:
                updater(key, recv, stored)
            except Exception as e:
                if hasattr(e, 'add_note'):  # raised by a later wait: say which key
                    e.add_note('pskv: raised by the updater of key %r' % (key,))
                raise

        self._kv.wait_all()
        self._kv.set_updater(call)

    _set_updater = set_updater

    def set_gradient_compression(self, compression_params):
        """Compresses pushed gradients (device and dist types), as MXNet's.

        Parameters
        ----------
        compression_params : dict
            ``{'type': '2bit' or '1bit', 'threshold': 0.5}``; unknown names are an error.
        """
        params = {str(k): str(v) for k, v in compression_params.items()}
        self._kv.set_gradient_compression(params)

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Saves the optimizer states to a file.

        In dist mode every worker calls it and rank 0 writes the file (the states are
        gathered from every server).

        Parameters
        ----------
        fname : str
            The file to write.
        dump_optimizer : bool, optional
            The file also carries the optimizer; loading it restores the saved
            configuration (learning rate, ...) too.
        """
        self._kv.save_optimizer_states(fname, bool(dump_optimizer))

    def load_optimizer_states(self, fname):
        """Loads optimizer states written by :meth:`save_optimizer_states` (every worker calls it).

        The file holds whole keys: states saved by a dist job load into a job with any
        number of servers, or into a local store, and the reverse. Call it after
        ``init`` of the keys (rank 0 loads in dist mode).

        Parameters
        ----------
        fname : str
            The file to read.
        """
        self._kv.load_optimizer_states(fname)

    # --- synchronisation
    def barrier(self):
        """Blocks until every worker of the job reached this barrier (dist stores).

        Raises
        ------
        pskv.TimeoutError
            ``PSKV_TIMEOUT`` passed.
        pskv.NodeFailure
            A node of the job died.
        """
        self._kv.barrier()

    _barrier = barrier

    def close(self):
        """Waits for pending operations and releases the store; a dist worker passes
        the job's final barrier here. Called at interpreter exit for open stores.
        """
        kv = getattr(self, '_kv', None)
        if kv is None:
            return
        kv.check_close()  # UsageError inside this store's updater (on its engine thread)
        self._kv = None
        try:
            kv.wait_all()
        except Exception as e:  # noqa: BLE001 - still release the store
            if self._batches:  # closed inside a batch's block: its end raises this
                self._close_error = self._with_ops(e, None)
            else:
                sys.stderr.write('pskv: pending operations failed at close: %s\n' % e)
        kv.close()  # drops the arrays of every call
        with self._book:
            ops, self._ops = self._ops, []
            for op in ops:
                self._release(op)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if threading.current_thread() is threading.main_thread():
            self.close()
            return
        # Garbage collection can run on one of pskv's own C++ threads (an updater
        # runs on its store's engine thread): closing there would make that thread
        # join itself. Such stores are closed later, on the main thread.
        kv = getattr(self, '_kv', None)
        if kv is not None:
            self._kv = None
            _deferred_close.append(kv)  # keeps the arrays of calls in flight
            with self._book:
                for op in self._ops:
                    self._release(op)


_open_stores = weakref.WeakSet()
_deferred_close = []  # native stores dropped on a non-main thread (see KVStore.__del__)


def _close_deferred():
    while _deferred_close:
        kv = _deferred_close.pop()
        try:
            kv.wait_all()
        except Exception as e:  # noqa: BLE001 - still release the store
            sys.stderr.write('pskv: pending operations failed at close: %s\n' % e)
        kv.close()


@atexit.register
def _close_all():
    # Close before the interpreter finalises: the C++ threads may still need the GIL.
    for kv in list(_open_stores):
        kv.close()
    _close_deferred()


def create(name='local', blocking=None):
    """Creates a store (MXNet's ``mx.kv.create``).

    In a process started with DMLC_ROLE=server or scheduler, a dist type runs that
    role until the job ends and then exits (as ``import mxnet`` did).

    The first dist store of a process that did not call :func:`pskv.configure_process`
    calls it (logging, timeline and metrics as the ``PSKV_*`` variables say; the
    allocator untouched): the one process-wide setting the package makes by itself.

    Every call of the store is complete when it returns (its outputs hold the result,
    its inputs may be reused); :meth:`KVStore.batch` issues many calls that travel
    together and are waited for once.

    Parameters
    ----------
    name : str, optional
        ``'local'``, ``'device'``, ``'dist_sync'``, ``'dist_async'``, ``'dist_sync_device'``,
        ``'dist_async_device'`` (``'dist'`` means ``'dist_sync'``).
    blocking : bool, optional
        Accepted for code written for pskv 0.2: True (calls complete on return) is what
        every store does; False (calls that return before their results land, read
        after ``kv.wait``) is refused: use ``with kv.batch():`` instead.

    Returns
    -------
    KVStore

    Raises
    ------
    pskv.InvalidArgument
        An unknown type (the message lists the valid ones).
    pskv.UsageError
        ``blocking=False``.
    """
    if not isinstance(name, str):
        raise TypeError('name must be a string')
    if blocking is not None and not blocking:
        raise _pskv.UsageError(
            'pskv.create(blocking=False) is gone: calls that return before their results land let '
            'a read see old values silently. Every call now completes when it returns; to issue many '
            'calls that travel together, issue them inside "with kv.batch():" (their results are in '
            'when the block ends)')
    if 'dist' in name.lower() and _pskv.role() in ('server', 'scheduler'):
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(_pskv.run_role())
    _close_deferred()
    if 'dist' in name.lower():
        _process._configure_once()  # the package's one implicit process-wide call
    kv = KVStore(_pskv.KVStore.create(name))
    _open_stores.add(kv)
    return kv
