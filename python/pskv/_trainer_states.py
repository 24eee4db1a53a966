"""The Trainer's optimizer configuration and states (learning rate changes, states
files): a part of :class:`pskv.torch.Trainer`, apart from the step."""
import os
import tempfile

from . import _pskv


class TrainerStates(object):
    """Mixin of :class:`pskv.torch.Trainer`: uses its ``kv``, ``_uok``, ``_updater``,
    ``_name``, ``_cfg``, ``_config()`` and ``_ship_optimizer()``."""

    def set_learning_rate(self, lr):
        """Sets the base learning rate; the optimizer states (momentum, ...) are kept,
        also on the servers of a dist store (call it on every worker).

        Parameters
        ----------
        lr : float
            The new base learning rate.
        """
        self._cfg['learning_rate'] = repr(float(lr))
        self._reconfigure()

    def _reconfigure(self):
        """Installs self._cfg, keeping the optimizer states."""
        if not self._uok:
            blob = self._updater.save_states(False)
            self._updater = _pskv.Optimizer(self._name, self._config())
            self._updater.load_states(blob)
            return
        # The store's SetOptimizer starts from fresh states: carry them over through a
        # states file (written and read by rank 0 only).
        fd, path = tempfile.mkstemp(prefix='pskv_states_')
        os.close(fd)
        try:
            self.kv.save_optimizer_states(path)
            self._ship_optimizer()
            self.kv.load_optimizer_states(path)
            self.kv.barrier()  # rank 0 loads: nobody pushes before it is done
        finally:
            os.unlink(path)

    def save_states(self, fname):
        """Saves the optimizer states with the optimizer (learning rate, ...).

        With update_on_kvstore (dist too) the store gathers them: call on every worker;
        rank 0 writes the file.

        Parameters
        ----------
        fname : str
            The file to write.
        """
        if self._uok:
            self.kv.save_optimizer_states(fname, dump_optimizer=True)
            self.kv.barrier()  # rank 0 writes: the file is complete when this returns
            return
        # With its checksum, renamed once complete (workers writing the same path do
        # not interleave).
        _pskv.write_states_file(fname, self._updater.save_states(True))

    def load_states(self, fname):
        """Loads what :meth:`save_states` wrote: the states and the saved optimizer
        configuration (call on every worker).

        Parameters
        ----------
        fname : str
            The file to read.
        """
        cfg = _states_config(fname)
        if self._uok:
            self.kv.load_optimizer_states(fname)
            self.kv.barrier()  # rank 0 loads: nobody pushes before the states are in
        else:
            self._updater.load_states(_pskv.read_states_file(fname))
        if cfg is not None:  # the store or updater now runs the saved optimizer (C++: the same)
            self._name = cfg.pop('type', self._name)
            self._cfg = cfg


def _states_config(fname):
    """The optimizer configuration inside a dumped states file, or None."""
    text = _pskv.states_file_config(fname)  # the file's format: one codec, in C++
    if text is None:
        return None
    return dict(line.split('=', 1) for line in text.splitlines() if '=' in line)
