"""pskv.torch.EmbeddingBag: torch.nn.EmbeddingBag over a dynamic embedding table."""
import numpy as np
import torch as _torch


class EmbeddingBag(_torch.nn.Module):
    """``torch.nn.EmbeddingBag`` (``mode='sum'`` or ``'mean'``) over a dynamic embedding
    table (:func:`pskv.embedding.create`) whose rows live on the servers.

    forward(ids, offsets=None): ``ids`` int64 (B, L) — B bags of L ids — or 1-D with
    ``offsets`` (the start of each bag), as ``torch.nn.EmbeddingBag``. It pulls the
    rows of the batch's distinct ids once; in training mode, the backward pass pushes
    their gradients (one push per forward: in dist_sync, every worker runs one
    forward and one backward per step). The table's optimizer updates the rows on the
    servers, so these rows are not parameters of the module: the dense part's
    optimizer (e.g. :class:`pskv.torch.Trainer`) never sees them.
    """

    def __init__(self, table, mode='sum'):
        super().__init__()
        if mode not in ('sum', 'mean'):
            raise ValueError("EmbeddingBag mode must be 'sum' or 'mean', got %r" % (mode,))
        self.table = table
        self.mode = mode

    def forward(self, ids, offsets=None):
        ids = _torch.as_tensor(ids)
        if ids.dtype != _torch.int64:
            raise TypeError('EmbeddingBag ids must be int64 (got %s)' % ids.dtype)
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError('offsets must be None when ids is 2-D (B bags of L ids)')
            b, length = ids.shape
            offsets = _torch.arange(0, b * length, length, dtype=_torch.int64)
            ids = ids.reshape(-1)
        elif offsets is None:
            raise ValueError('1-D ids need offsets (the start of each bag)')
        unique, inverse = _torch.unique(ids.cpu(), return_inverse=True)
        rows = _torch.from_numpy(self.table.pull(unique.numpy()))
        if self.training and _torch.is_grad_enabled():
            rows.requires_grad_(True)
            keys = unique.numpy().copy()

            def push(grad):
                self.table.push(keys, np.ascontiguousarray(grad.detach().cpu().numpy(), np.float32))

            rows.register_hook(push)
        return _torch.nn.functional.embedding_bag(inverse, rows, offsets.cpu(), mode=self.mode)
