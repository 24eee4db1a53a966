"""The calls a store has in flight, as the Python side sees them: batches, the
calls issued through them until they are released, waits that release them, and the
calls named in errors. A part of :class:`pskv.kvstore.KVStore` (it inherits this)."""
from . import _pskv
from ._batch import Batch, _Op
from ._values import _annotated, _bump_versions, _is_list, _key_names, _torch_outputs, _torch_watch, _unique

import numpy as np


class _Tracking(object):
    """KVStore's batches, waits and calls in flight (state made by KVStore.__init__:
    ``_kv``, ``_book``, ``_ops``, ``_sweep_at``)."""

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

    def _track(self, what, keys, completion, values=(), batch=None, written=None):
        """After a call was issued: a plain call waits for it (its failure is raised
        here); a batch's call is noted (its keys in the batch, the torch tensors among
        `values`, what the caller passed, watched) until released. The torch tensors
        among `written` (the call's outputs) have their version counters bumped once
        written: a plain call's now, a batch's when the batch ends (so that the batch's
        own check of tensors changed in flight does not take pskv's writes for one)."""
        if batch is None:
            try:
                self._kv.wait(_unique(keys))
            except Exception as e:  # noqa: BLE001 - re-raised naming the call
                new = _annotated(e, '%s of key %s failed' % (what, _key_names(keys)))
                if new is e:
                    raise
                raise new from None
            finally:
                _bump_versions(_torch_outputs(written))
            return
        batch._written.extend(_torch_outputs(written))
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

