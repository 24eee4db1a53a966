"""What a store does with the values pushed: an optimizer, a Python updater,
gradient compression, and the optimizer states saved and loaded. A part of
:class:`pskv.kvstore.KVStore` (it inherits this)."""
from .optimizer import Optimizer


class _Updates(object):
    """KVStore's updates (state made by KVStore.__init__: ``_kv``, ``_str_names``)."""

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

