"""row_sparse keys of a store: their init and their pulls of chosen rows. A part of
:class:`pskv.kvstore.KVStore` (it inherits this); docs/sparse.md has the rules."""
import numpy as np

from . import _pskv
from . import sparse as _sparse
from ._values import _is_list


class _RowSparse(object):
    """KVStore's row_sparse keys (state made by KVStore.__init__: ``_kv``, ``_sparse``)."""

    def _init_row_sparse(self, key, value):
        rsp = _sparse.row_sparse_array(value)
        self._kv.init_row_sparse([key], list(rsp.shape), rsp.indices, rsp.data)
        self._remember([key])
        self._sparse[key] = (rsp.shape, rsp.data.dtype)

    def _rsp_of(self, key, v):
        if isinstance(v, tuple) and len(v) == 2 and key in self._sparse:
            return _sparse.row_sparse_array(v, shape=self._sparse[key][0])
        return _sparse.row_sparse_array(v)

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
            Row ids (any integer dtype, or floats holding whole numbers as MXNet's float32
            ids; any shape; flattened, de-duplicated and sorted).
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
                'row_sparse_pull of key %r: the key is not row_sparse in this store (init it with '
                'a row_sparse value: pskv.row_sparse_array, a torch sparse tensor)' % (key,))
        shape, dtype = self._sparse[key]
        ids = row_ids if _is_list(row_ids) else [row_ids]
        ids = [_sparse._row_ids(i) for i in ids]
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
        ids = [_sparse._row_ids(row_ids)]
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

