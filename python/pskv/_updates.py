"""What a store does with the values pushed: an optimizer, a Python updater,
gradient compression, and the optimizer states saved and loaded. A part of
:class:`pskv.kvstore.KVStore` (it inherits this)."""
import os
import tempfile
import warnings

from . import _pskv
from . import optimizer as _opt


class _Updates(object):
    """KVStore's updates (state made by KVStore.__init__: ``_kv``, ``_str_names``)."""

    # --- updates
    def set_optimizer(self, optimizer):
        """Runs `optimizer` on every push (on the servers in dist mode).

        A non-dist store follows the optimizer object afterwards, as MXNet's updater
        did: a change of its ``learning_rate``/``lr``, ``wd``, multipliers
        (``set_lr_mult``, ``set_wd_mult``) or other parameters applies from the next
        push, the optimizer states (momentum, ...) kept. The servers of a dist store
        run the optimizer as it was here; a later change gets a warning (call
        ``set_optimizer`` again on every worker to send it; that restarts the states).

        Parameters
        ----------
        optimizer : pskv.optimizer.Optimizer or str
            An optimizer, or its name with default parameters (``'sgd'``, ``'adam'``, ...).
            A ``torch.optim`` optimizer is translated (:func:`pskv.optimizer.from_torch`).
        """
        if isinstance(optimizer, str):
            optimizer = _opt.create(optimizer)
        optimizer = _opt._as_pskv(optimizer, 'set_optimizer')
        params = optimizer.params(self._key_ids())
        self._kv.set_optimizer(optimizer.name, params)
        self._optimizer = (optimizer, params)

    def _key_ids(self):
        return {name: i for i, name in enumerate(self._str_names)}

    def _follow_optimizer(self):
        """Before a push: the optimizer given to set_optimizer changed since the store
        got it. A non-dist store takes the change, keeping the states (MXNet's updater
        read the live optimizer); a dist store warns once (its servers have a copy)."""
        if self._optimizer is None:
            return
        with self._book:
            opt, shipped = self._optimizer
            now = opt.params(self._key_ids())
            if now == shipped:
                return
            changed = sorted(k for k in set(now) | set(shipped) if now.get(k) != shipped.get(k))
            self._optimizer = (opt, now)
            if _pskv.store_type(self.type)['dist']:
                warnings.warn(
                    'pskv: the optimizer changed after set_optimizer (%s) but the servers run the copy they '
                    'received: the change is not applied. Call kv.set_optimizer(optimizer) again on every worker '
                    'to send it (it restarts the optimizer states; save_optimizer_states before and '
                    'load_optimizer_states after keep them), or with pskv.torch.Trainer use '
                    'trainer.set_learning_rate' % ', '.join(changed), UserWarning, stacklevel=4)
                return
            fd, path = tempfile.mkstemp(prefix='pskv_states_')
            os.close(fd)
            try:
                self._kv.save_optimizer_states(path, False)
                self._kv.set_optimizer(opt.name, now)
                self._kv.load_optimizer_states(path)
            finally:
                os.unlink(path)

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
        self._optimizer = None

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

