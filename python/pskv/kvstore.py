"""KVStore with MXNet's Python API (``mx.kv``) over the C++ core.

The store is put together from parts, one concern each: the calls (this module),
calls in flight and batches (``_tracking``, ``_batch``), row_sparse keys (``_rows``),
updates (``_updates``), keys and values as callers give them (``_values``), and the
process-wide settings (:mod:`pskv.process`)."""
import atexit
import sys
import threading
import warnings
import weakref

from . import _pskv
from . import process as _process
from ._batch import Batch  # noqa: F401 - public as pskv.kvstore.Batch
from ._rows import _RowSparse
from ._tracking import _Tracking
from ._updates import _Updates
from ._values import _flatten, _is_dense, _key_names, _split_sparse


class _Closed(object):
    """A closed store's handle: every call through it is a :class:`pskv.UsageError`
    (instead of an ``AttributeError`` on ``None``)."""
    __slots__ = ()

    def __getattr__(self, name):
        raise _pskv.UsageError(
            'this store was closed (kv.close(), the end of its with-block, or interpreter exit): '
            'create another with pskv.create to go on (calling %s on a closed store)' % name)


_CLOSED = _Closed()


def _is_closed(handle):
    return handle is None or handle is _CLOSED


class KVStore(_Tracking, _RowSparse, _Updates):
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
        self._optimizer = None  # (Optimizer given to set_optimizer, the parameters it ran)

    def _closed(self):
        return _is_closed(getattr(self, '_kv', None))

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
        value : numpy.ndarray, torch.Tensor, pskv.DeviceArray, RowSparseArray, or list of them
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

    def _remember(self, keys):
        if keys and isinstance(keys[0], str):
            known = set(self._str_names)
            for k in keys:
                if k not in known:
                    self._str_names.append(k)
                    known.add(k)

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
            Arrays are numpy arrays, torch CPU tensors, :class:`pskv.DeviceArray` or
            device arrays exposing ``__cuda_array_interface__`` (kept alive while in use).
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
        self._follow_optimizer()  # a local store runs the optimizer as it is now
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
        if out is None:
            raise _pskv.UsageError(
                'pull of key %s needs out=: the arrays to write into, e.g. out = np.empty_like(value); '
                'kv.pull(key, out=out) (one array per key, or a list of arrays per key)' % _key_names(
                    key if isinstance(key, (list, tuple)) else [key]))
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
        self._track('pull', keys, c, (out,), batch, written=out)

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
        if not all(_is_dense(v) for v in vals):
            raise _pskv.UsageError('pushpull of key %s with row_sparse values: use push, then '
                                   'row_sparse_pull for the rows' % _key_names(keys))
        if out is None:
            okeys, outs = keys, vals
        else:
            okeys, outs = _flatten(key, out, output=True)
        self._follow_optimizer()
        c = self._kv.pushpull(keys, vals, okeys, outs, priority, True, batch is not None)
        self._track('pushpull', keys + okeys, c, (value, out), batch,
                    written=value if out is None else out)

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

    def epoch_partition(self):
        """The data partition this worker reads next epoch, as ``(num_parts, part_index)``.

        With elastic workers (``PSKV_ELASTIC=1``, docs/fault-tolerance.md, "Elastic
        workers") call it at the start of every epoch: it passes a barrier of the workers
        and deals the data over the workers in the job at its release (the same list on
        every worker, so the parts cover the data once); a worker that joined a running
        job calls it first of all and gets its part of the epoch it was admitted in
        (``epoch`` says which). Otherwise ``(num_workers, rank)``, with no barrier. Pass
        the pair to ``pskv.data`` iterators as ``num_parts`` / ``part_index``.

        Returns
        -------
        tuple of (int, int)

        Raises
        ------
        pskv.TimeoutError
            ``PSKV_TIMEOUT`` passed at the barrier.
        pskv.NodeFailure
            The job failed (or this worker was dropped from it).
        """
        return tuple(self._kv.epoch_partition())

    @property
    def epoch(self):
        """The epoch the last ``epoch_partition()`` dealt, counted from 0 (-1 before it).

        With elastic workers it counts the epoch barriers the job released, so a worker
        that joined a running job learns the epoch it starts in.

        Returns
        -------
        int
        """
        return self._kv.epoch

    def close(self):
        """Waits for pending operations and releases the store; a dist worker passes
        the job's final barrier here. Called at interpreter exit for open stores.
        """
        kv = getattr(self, '_kv', None)
        if _is_closed(kv):
            return
        kv.check_close()  # UsageError inside this store's updater (on its engine thread)
        self._kv = _CLOSED
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
        if not _is_closed(kv):
            self._kv = _CLOSED
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
    dist = _pskv.store_type(name)['dist']
    if dist and _pskv.role() in ('server', 'scheduler'):
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(_pskv.run_role())
    _close_deferred()
    if dist:
        _process._configure_once()  # the package's one implicit process-wide call
    kv = KVStore(_pskv.KVStore.create(name))
    _open_stores.add(kv)
    return kv
