"""A batch of calls that travel together (``with kv.batch() as b:``), and the
Python side's record of each call issued through one. Public as
:class:`pskv.kvstore.Batch`."""
from . import _pskv
from ._values import _bump_versions, _is_list


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

    __module__ = 'pskv.kvstore'  # where it is documented and imported from

    def __init__(self, kv):
        self._store = kv
        self._keys = {}  # keys of the calls issued through this batch (ordered set)
        self._misuse = []  # torch tensors modified in flight: raised at the end
        self._written = []  # torch outputs of its calls: version counters bumped at the end
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
        written, self._written = self._written, []
        try:
            if kv._closed():  # closed inside the block: close waited; report what it saw
                if keys and kv._close_error is not None:
                    raise kv._close_error
                return
            if keys:
                kv._wait_keys(keys)
        finally:
            # Once per tensor however many calls wrote it, after the in-flight check.
            seen = set()
            _bump_versions([t for t in written if not (id(t) in seen or seen.add(id(t)))])
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

