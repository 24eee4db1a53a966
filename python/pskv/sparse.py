"""row_sparse arrays (MXNet's ``RowSparseNDArray``): a table of which only some rows
are present; every other row is zero."""
import numpy as np

from . import _pskv


class RowSparseArray(object):
    """A row_sparse array: ``shape`` (``shape[0]`` rows), the present rows' ``indices``
    (int64, ascending, unique) and their ``data`` (``(len(indices),) + shape[1:]``).

    Build it with :func:`row_sparse_array`; a torch sparse COO tensor (the gradient of
    ``nn.Embedding(sparse=True)``) or a ``(data, indices)`` pair of numpy arrays is
    accepted wherever a RowSparseArray is.

    Parameters
    ----------
    data : numpy.ndarray
        The present rows.
    indices : numpy.ndarray
        Their row ids (any integer dtype, uint64 included; floats holding whole
        numbers, as MXNet's float32 ids; a fractional one is an InvalidArgument; sorted and de-duplicated by the store, rows of repeated ids
        summed).
    shape : tuple of int
        The full shape.
    """

    stype = 'row_sparse'

    def __init__(self, data, indices, shape):
        self.shape = tuple(int(s) for s in shape)
        self.data = np.ascontiguousarray(data)
        self.indices = _row_ids(indices)
        if self.data.shape[:1] != (len(self.indices),):
            self.data = self.data.reshape((len(self.indices),) + self.shape[1:])

    @property
    def dtype(self):
        """The element dtype (numpy)."""
        return self.data.dtype

    def asnumpy(self):
        """The dense array (zeros in the absent rows).

        Returns
        -------
        numpy.ndarray
        """
        out = np.zeros(self.shape, self.data.dtype)
        if len(self.indices):
            np.add.at(out, self.indices, self.data)
        return out

    tostype_default = asnumpy

    def __repr__(self):
        return 'RowSparseArray(shape=%s, nnz=%d, dtype=%s)' % (self.shape, len(self.indices),
                                                               self.data.dtype)


def _row_ids(ids):
    """Row ids as a flat int64 array: any integer dtype (uint64 range-checked), or
    floats holding whole numbers >= 0 (MXNet's row ids are float32); a fractional,
    negative or non-finite float is refused, not truncated (an empty array of any
    dtype is fine)."""
    a = np.asarray(_numpy(ids))
    if a.size and a.dtype.kind == 'f':
        flat = a.reshape(-1)
        with np.errstate(invalid='ignore'):
            bad = ~np.isfinite(flat) | (flat < 0) | (flat != np.floor(flat)) | (flat >= 2.0 ** 63)
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            raise _pskv.InvalidArgument(
                'row id %r (position %d of the %s row ids) is not a row number: float row ids must hold '
                'whole numbers >= 0 (below 2^63)' % (float(flat[at]), at, a.dtype))
        return np.ascontiguousarray(flat, dtype=np.int64)
    if a.size and a.dtype.kind not in 'iu':
        raise _pskv.InvalidArgument(
            'row ids must be of an integer dtype, got %s: convert them first, e.g. '
            'ids.astype(np.int64) (floats are not truncated silently)' % a.dtype)
    if a.size and a.dtype.kind == 'u' and a.max() > np.iinfo(np.int64).max:
        raise _pskv.KeyError('row id %d is out of range: row ids are below 2^63' % a.max())
    return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)


def row_sparse_array(arg, shape=None, dtype=None):
    """Builds a :class:`RowSparseArray` (MXNet's ``mx.nd.sparse.row_sparse_array``).

    Parameters
    ----------
    arg : tuple (data, indices), numpy.ndarray, or torch sparse COO tensor
        ``(data, indices)`` with `shape`; a dense array (its nonzero rows are kept); or a
        torch sparse COO tensor (shape from the tensor).
    shape : tuple of int, optional
        The full shape; required for ``(data, indices)``.
    dtype : numpy dtype, optional
        Converts the data.

    Returns
    -------
    RowSparseArray
    """
    if isinstance(arg, RowSparseArray):
        rsp = arg
    elif _is_torch_sparse(arg):
        rsp = _from_torch(arg)
    elif isinstance(arg, tuple) and len(arg) == 2:
        if shape is None:
            raise _pskv.InvalidArgument('row_sparse_array((data, indices)) needs shape=')
        rsp = RowSparseArray(_numpy(arg[0]), _numpy(arg[1]), shape)
    else:
        dense = _numpy(arg)
        rows = np.flatnonzero(dense.reshape(dense.shape[0], -1).any(axis=1))
        rsp = RowSparseArray(dense[rows], rows, dense.shape)
    if dtype is not None:
        rsp = RowSparseArray(rsp.data.astype(dtype), rsp.indices, rsp.shape)
    return rsp


def _numpy(a):
    if isinstance(a, np.ndarray):
        return a
    if type(a).__module__.startswith('torch'):
        return a.detach().cpu().contiguous().numpy()
    return np.asarray(a)


def _is_torch_sparse(v):
    return type(v).__module__.startswith('torch') and getattr(v, 'is_sparse', False)


def _from_torch(t):
    """A torch sparse COO tensor with one sparse dimension (nn.Embedding's gradient)."""
    if t.sparse_dim() != 1:
        raise _pskv.InvalidArgument('only torch sparse COO tensors with one sparse dimension (rows) '
                                    'are row_sparse values; got sparse_dim=%d' % t.sparse_dim())
    # Uncoalesced is fine: the store sums the rows of repeated ids.
    return RowSparseArray(_numpy(t._values()), _numpy(t._indices()[0]), tuple(t.shape))


def is_sparse(v):
    """True for a RowSparseArray or a torch sparse tensor.

    Parameters
    ----------
    v : object
        Any value.

    Returns
    -------
    bool
    """
    return isinstance(v, RowSparseArray) or _is_torch_sparse(v)


def to_torch(rsp):
    """A torch sparse COO tensor (coalesced) of a RowSparseArray.

    Parameters
    ----------
    rsp : RowSparseArray
        The array (e.g. a result of :meth:`pskv.KVStore.row_sparse_pull`).

    Returns
    -------
    torch.Tensor
    """
    import torch
    idx = torch.from_numpy(rsp.indices.copy()).reshape(1, -1)
    return torch.sparse_coo_tensor(idx, torch.from_numpy(rsp.data.copy()), rsp.shape).coalesce()
