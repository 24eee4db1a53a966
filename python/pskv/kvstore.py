"""KVStore with MXNet's Python API (``mx.kv``) over the C++ core."""
import atexit
import threading
import sys
import weakref

import numpy as np

from . import _pskv
from . import sparse as _sparse
from .optimizer import Optimizer


def _as_array(v):
    """A numpy view of a numpy array or a PyTorch CPU tensor (no copy)."""
    if isinstance(v, np.ndarray):
        if not v.flags['C_CONTIGUOUS']:
            raise _pskv.InvalidArgument('arrays must be C-contiguous (numpy.ascontiguousarray)')
        return v
    if type(v).__module__.startswith('torch'):
        if v.device.type != 'cpu':
            raise _pskv.InvalidArgument('only CPU tensors are supported on this build')
        if not v.is_contiguous():
            raise _pskv.InvalidArgument('tensors must be contiguous (call .contiguous())')
        return v.detach().numpy()
    raise TypeError('values must be numpy arrays or torch tensors, got %s' % type(v).__name__)


def _is_list(v):
    return isinstance(v, (list, tuple))


def _torch_watch(*values):
    """(tensor, version) of every torch tensor in `values` (nested lists too): torch
    tensors cannot be made read-only, but their version counter says whether an
    in-place operation touched them (pskv itself writes through a numpy view, which
    does not count). Not watched: views (a view shares its base's counter, so a
    change to another part of the base, e.g. of a flat gradient bucket, would look
    like one to the view) and inference tensors (they have no counter)."""
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


def _flatten(key, value):
    """(key, value) in any of MXNet's shapes -> parallel flat lists (spec 2.3)."""
    if _is_list(key):
        if not _is_list(value) or len(key) != len(value):
            raise AssertionError('the number of keys and values differ')
        keys, vals = [], []
        for k, v in zip(key, value):
            k2, v2 = _flatten(k, v)
            keys += k2
            vals += v2
        types = set(type(k) for k in keys)
        if len(types) > 1:
            raise AssertionError('inconsistent types of keys detected.')
        return keys, vals
    if isinstance(key, bool) or not isinstance(key, (int, str, np.integer)):
        raise AssertionError('unexpected type for keys: %s' % type(key).__name__)
    key = int(key) if isinstance(key, np.integer) else key
    if _is_list(value):
        return [key] * len(value), [_as_array(v) for v in value]
    return [key], [_as_array(value)]


def _unique(keys):
    return list(dict.fromkeys(keys))


def _key_names(keys):
    return ', '.join(repr(k) for k in _unique(keys))


class _Op(object):
    """One asynchronous call as the Python side tracks it: the numpy arrays it made
    read-only until the call is waited for or has finished."""
    __slots__ = ('what', 'keys', 'completion', 'locked', 'watched')

    def __init__(self, what, keys, completion, locked, watched=()):
        self.what, self.keys, self.completion, self.locked = what, keys, completion, locked
        self.watched = watched


class KVStore(object):
    """A key-value store of arrays, with MXNet's ``mx.kv.KVStore`` API.

    Create it with :func:`pskv.create`, not directly. ``push``, ``pull`` and
    ``pushpull`` schedule their work and return at once (MXNet's asynchronous
    semantics); :meth:`wait` / :meth:`wait_all` block until it is done. Operations on
    one key run in the order they were issued. Until an operation was waited for,
    its numpy arrays are read-only (writes raise ``ValueError: assignment destination
    is read-only``), and a ``pull``'s outputs hold their results only after the wait.
    ``pskv.create(..., blocking=True)`` or ``PSKV_PY_SYNC=1``: every call waits.

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

    def __init__(self, handle, blocking=False):
        self._kv = handle
        self._blocking = bool(blocking)
        self._ops = []  # _Op not yet released, in issue order
        self._locks = {}  # id(array) -> [array, number of _Op holding it read-only]
        self._misuse = []  # torch tensors modified in flight, raised by the next wait
        self._sweep_at = 64  # amortised sweeping of finished _Op (see _track)
        self._str_names = []  # string keys in first-init order = their int ids (as in C++)
        self._next_key = 0  # int keys handed out to Trainers sharing this store
        self._sparse = {}  # row_sparse key -> (shape, dtype), from init

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

    # --- data
    def init(self, key, value):
        """Initialises keys with values (MXNet's ``init``); in dist mode rank 0's value wins.

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s); all of one type. String keys get ids in first-init order.
        value : numpy.ndarray or torch.Tensor, or list of them
            One array per key (a list for a list of keys).

        Raises
        ------
        pskv.KeyError
            A key was initialised before.
        """
        if not _is_list(key) and _sparse.is_sparse(value):
            return self._init_row_sparse(key, value)
        keys, vals = _flatten(key, value)
        self._kv.init(keys, vals)
        self._remember(keys)

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

    # --- asynchronous calls: read-only arrays until released
    def _lock(self, arrays):
        locked = []
        seen = set()
        for a in arrays:
            i = id(a)
            if i in seen:
                continue
            seen.add(i)
            held = self._locks.get(i)
            if held is not None:
                held[1] += 1
            elif a.flags.writeable:
                a.flags.writeable = False
                self._locks[i] = [a, 1]
            else:
                continue  # read-only before: stays so, nothing to restore
            locked.append(a)
        return locked

    def _release(self, op):
        for t, version in op.watched:
            if t._version != version and len(self._misuse) < 8:
                self._misuse.append(
                    '%s of key %s: a torch tensor given to it was modified in place before the '
                    'call was waited for (its version went from %d to %d): what was pushed or '
                    'pulled may be wrong. Call kv.wait(key) or kv.wait_all() before modifying '
                    'it, or pass a copy (tensor.clone())' %
                    (op.what, _key_names(op.keys), version, t._version))
        for a in op.locked:
            held = self._locks[id(a)]
            held[1] -= 1
            if held[1] == 0:
                del self._locks[id(a)]
                try:
                    a.flags.writeable = True
                except ValueError:  # its base became read-only meanwhile: leave it so
                    pass

    def _check_outs(self, outs):
        for o in outs:
            if not o.flags.writeable and id(o) not in self._locks:
                raise _pskv.InvalidArgument(
                    'an output array is read-only (numpy flags.writeable is False, e.g. np.frombuffer of '
                    'bytes): pass a writable array, e.g. a copy')

    def _track(self, what, keys, completion, inputs, outs, watch=()):
        """After a call was scheduled: wait (blocking store) or lock its arrays (and
        watch its torch tensors: `watch`, from _torch_watch)."""
        if self._blocking:
            self._kv.wait(_unique(keys))
            return
        ops = self._ops
        # Cheap: the oldest calls usually finish first; everything now and then.
        while ops and ops[0].completion.done:
            self._release(ops.pop(0))
        ops.append(_Op(what, keys, completion, self._lock(list(inputs) + list(outs)), watch))
        if len(ops) >= self._sweep_at:
            self._sweep()

    def _sweep(self, waited=None):
        """Releases finished calls, and calls whose keys are all in `waited` (a set;
        True: every call)."""
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
        ops = [op for op in self._ops if ks is None or any(k in ks for k in op.keys)]
        return '; '.join('%s of key %s' % (op.what, _key_names(op.keys)) for op in ops[:8]) + \
            (' and %d more' % (len(ops) - 8) if len(ops) > 8 else '')

    @property
    def pending(self):
        """The number of push/pull/pushpull calls whose arrays pskv still uses
        (issued, not finished): their arrays are kept alive by the store.

        Returns
        -------
        int
        """
        return self._kv.pending()

    def push(self, key, value, priority=0):
        """Pushes values; the values of one key are summed (over devices, and over
        workers in dist mode) and applied by the updater or optimizer, if any.

        Schedules the push and returns at once. `value` is read later: do not modify
        it until :meth:`wait` of the key (or :meth:`wait_all`) returned; numpy arrays
        are read-only until then (a write raises ``ValueError``). A blocking store
        (``PSKV_PY_SYNC=1``) waits here.

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s); each must have been initialised.
        value : array, list of arrays, or list of lists of arrays
            One array per key, or a list of arrays per key (several devices, summed).
        priority : int, optional
            Higher priorities are sent first (MXNet's hint).

        Raises
        ------
        pskv.KeyError
            A key was never initialised.
        pskv.ShapeError
            A value's shape or dtype differs from the key's.
        """
        def sparse_like(v):
            return _sparse.is_sparse(v) or (isinstance(v, tuple) and key in self._sparse)
        if not _is_list(key) and (sparse_like(value) or
                                  (isinstance(value, list) and value and sparse_like(value[0]))):
            vals = value if isinstance(value, list) else [value]
            rsps = [self._rsp_of(key, v) for v in vals]
            shape = list(self._sparse[key][0]) if key in self._sparse else list(rsps[0].shape)
            self._kv.push_row_sparse([key], shape, [(r.indices, r.data) for r in rsps], priority)
            if self._blocking:  # the rows were copied: only the blocking store waits
                self._kv.wait([key])
            return
        keys, vals = _flatten(key, value)
        watch = _torch_watch(value)
        c = self._kv.push(keys, vals, priority)
        self._track('push', keys, c, vals, (), watch)

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
        """Pulls the current values of keys into `out`, in place; returns at once.

        `out` holds the values after :meth:`wait` of the key (or :meth:`wait_all`)
        returned: numpy cannot delay a read, so reading it earlier reads old bytes.
        Until then numpy outputs are read-only (a write raises ``ValueError``). The
        pull sees every push of the key issued before it. A blocking store
        (``PSKV_PY_SYNC=1``) waits here.

        Parameters
        ----------
        key : int, str, or list of int or str
            The key(s).
        out : array, list of arrays, or list of lists of arrays
            Where to write (every array of a key's list receives the value). Required.
        priority : int, optional
            Higher priorities are served first.
        ignore_sparse : bool, optional
            Accepted for MXNet compatibility; pskv has no sparse arrays.
        """
        assert out is not None, 'pull needs out'
        keys, outs = _flatten(key, out)
        self._check_outs(outs)
        watch = _torch_watch(out)
        c = self._kv.pull(keys, outs, priority, False)
        self._track('pull', keys, c, (), outs, watch)

    def pushpull(self, key, value, out=None, priority=0):
        """Pushes `value` and pulls the result into `out` in one round trip per key;
        returns at once.

        `out` (`value` when None) holds the result after :meth:`wait` of the key (or
        :meth:`wait_all`); until then `value` and `out` must not be modified (numpy
        arrays are read-only) nor `out` read. A blocking store waits here.

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
        keys, vals = _flatten(key, value)
        if out is None:
            okeys, outs = keys, vals
        else:
            okeys, outs = _flatten(key, out)
        self._check_outs(outs)
        watch = _torch_watch(value, out)
        c = self._kv.pushpull(keys, vals, okeys, outs, priority, False)
        self._track('pushpull', keys + okeys, c, vals, outs, watch)

    def broadcast(self, key, value, out, priority=0):
        """Initialises keys with `value` (rank 0's in dist mode) and pulls them into `out`.

        The pull is asynchronous as :meth:`pull`: `out` holds the values after
        :meth:`wait` / :meth:`wait_all`.

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
        keys, vals = _flatten(key, value)
        try:
            self._kv.init(keys, vals)
            self._remember(keys)
        except _pskv.KeyError as e:
            raise _pskv.KeyError(str(e) + ' (broadcast initialises its keys: check for an earlier '
                                 'kv.init or kv.broadcast of the same key)')
        self.pull(key, out=out, priority=priority)

    def wait(self, key=None):
        """Blocks until the scheduled operations on `key` (all keys if None) are done:
        then pulled outputs hold their values and pushed arrays may be modified.

        Parameters
        ----------
        key : int, str, list, or None, optional
            The key(s) to wait for; ``None`` waits for every key.

        Raises
        ------
        pskv.Error
            The first error of an operation on the keys (an updater's exception too),
            naming the calls that were in flight on them.
        pskv.TimeoutError
            ``PSKV_TIMEOUT`` passed.
        pskv.UsageError
            A torch tensor of a call was modified in place before that call was
            waited for (raised by the first wait after pskv noticed it).
        """
        if key is None:
            return self.wait_all()
        keys = [int(k) if isinstance(k, np.integer) else k for k in (key if _is_list(key) else [key])]
        try:
            self._kv.wait(list(keys))
        except Exception as e:  # noqa: BLE001 - re-raised with what was in flight
            new = self._with_ops(e, keys)
            # A failure is reported once the keys' operations ended; a timeout is not.
            self._sweep(None if isinstance(e, _pskv.TimeoutError) else set(keys))
            if new is e:
                raise
            raise new from None
        self._sweep(set(keys))
        self._raise_misuse()

    def wait_all(self):
        """Blocks until every scheduled operation is done (MXNet's ``mx.nd.waitall()``).

        Raises
        ------
        pskv.Error
            The first error of a scheduled operation, naming the calls in flight.
        """
        try:
            self._kv.wait_all()
        except Exception as e:  # noqa: BLE001 - re-raised with what was in flight
            new = self._with_ops(e, None)
            self._sweep(None if isinstance(e, _pskv.TimeoutError) else True)
            if new is e:
                raise
            raise new from None
        self._sweep(True)
        self._raise_misuse()

    def _raise_misuse(self):
        if self._misuse:
            msgs, self._misuse = self._misuse, []
            raise _pskv.UsageError('; '.join(msgs))

    def _with_ops(self, e, keys):
        """`e` with the calls in flight on `keys` in its message (pskv errors) or a note."""
        what = self._in_flight(keys)
        if not what:
            return e
        text = 'in flight when the wait failed: ' + what
        if isinstance(e, _pskv.Error) and len(e.args) == 1:
            new = type(e)('%s [%s]' % (e.args[0], text))
            new.__cause__ = e.__cause__
            return new.with_traceback(e.__traceback__)
        if hasattr(e, 'add_note'):
            e.add_note('pskv: ' + text)
        return e

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
        self._kv.set_optimizer(optimizer.name, optimizer.params())

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
        self._kv = None
        try:
            kv.wait_all()
        except Exception as e:  # noqa: BLE001 - still release the store
            sys.stderr.write('pskv: pending operations failed at close: %s\n' % e)
        kv.close()  # drops the arrays of every call
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

    Parameters
    ----------
    name : str, optional
        ``'local'``, ``'device'``, ``'dist_sync'``, ``'dist_async'``, ``'dist_sync_device'``,
        ``'dist_async_device'`` (``'dist'`` means ``'dist_sync'``).
    blocking : bool, optional
        True: ``push``, ``pull`` and ``pushpull`` wait for their keys before returning
        (results readable at once, inputs reusable at once; one round trip per call).
        False: they return at once (MXNet's semantics; :meth:`KVStore.wait`). Default:
        ``PSKV_PY_SYNC`` (0: False).

    Returns
    -------
    KVStore

    Raises
    ------
    pskv.InvalidArgument
        An unknown type (the message lists the valid ones).
    """
    if not isinstance(name, str):
        raise TypeError('name must be a string')
    if 'dist' in name.lower() and _pskv.role() in ('server', 'scheduler'):
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(_pskv.run_role())
    _close_deferred()
    if blocking is None:
        blocking = _pskv.python_sync()
    kv = KVStore(_pskv.KVStore.create(name), blocking=blocking)
    _open_stores.add(kv)
    return kv
