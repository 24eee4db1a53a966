"""Sparse parameters of :class:`pskv.torch.Trainer` (docs/sparse.md): their gradients
are pushed as the rows they have, and rows are pulled into the local weight."""
import numpy as np
import torch as _torch

from . import _pskv


class TrainerSparse(object):
    """Mixin of :class:`pskv.torch.Trainer`: uses its ``kv``, ``_keys``, ``_params``,
    ``_sparse`` and ``_versions``."""

    def _pull_rows(self, i, row_ids):
        """Rows `row_ids` of sparse parameter i from the store into the local weight."""
        pending = self.kv._row_sparse_start(self._keys[i], row_ids, i)
        self.kv.wait(self._keys[i])
        self._apply_rows(i, pending)

    def _apply_rows(self, i, pending):
        """Writes a finished row pull (kv._row_sparse_start) into the local weight."""
        out = self.kv._row_sparse_result(self._keys[i], pending)
        if len(out.indices):
            with _torch.no_grad():
                idx = _torch.from_numpy(out.indices)
                self._params[i].data.index_copy_(0, idx, _torch.from_numpy(out.data).to(self._params[i].dtype))
        if hasattr(self, '_versions'):  # the Trainer's own write, not a change from outside
            self._versions[i] = self._params[i]._version

    def row_sparse_pull(self, param, row_ids):
        """Refreshes rows `row_ids` of a sparse parameter from the store (e.g. the
        rows of the next batch, MXNet's ``param.row_sparse_data(row_id)``).

        Parameters
        ----------
        param : torch.Tensor
            A sparse parameter of this Trainer.
        row_ids : array-like of int
            Row ids (any order, repeats allowed).
        """
        for i in self._sparse:
            if self._params[i] is param:
                return self._pull_rows(i, np.asarray(row_ids, dtype=np.int64).reshape(-1))
        raise _pskv.InvalidArgument('row_sparse_pull: not a sparse parameter of this Trainer')

    def _push_sparse(self, batch, i, ratio):
        """Pushes the rows of sparse parameter i's gradient; returns their ids."""
        p = self._params[i]
        g = p.grad
        if g is None:
            g = _torch.sparse_coo_tensor(_torch.zeros((1, 0), dtype=_torch.int64),
                                         _torch.zeros((0,) + tuple(p.shape[1:]), dtype=p.dtype), tuple(p.shape))
        elif not g.is_sparse:
            g = g.to_sparse(1)  # a dense gradient (e.g. accumulated densely): its nonzero rows
        if ratio != 1.0:
            g = g * ratio
        g = g.coalesce()
        batch.push(self._keys[i], g, priority=i)  # an empty push takes part in the round
        return g.indices()[0].numpy()
