"""Keys and values as callers give them (MXNet's shapes: a key or a list, arrays or
lists of arrays per key, numpy arrays, torch tensors, device arrays, row_sparse values)
-> the flat lists of keys and arrays the binding takes (numpy arrays and
pskv.DeviceArray); and the wording of errors about them. Used by :mod:`pskv.kvstore`."""
import numpy as np

from . import _pskv
from . import sparse as _sparse


def _as_array(v, output=False):
    """A numpy view of a numpy array or a PyTorch CPU tensor (no copy); a
    pskv.DeviceArray as it is; a view of another library's device array given through
    ``__cuda_array_interface__`` (no copy). `output`: the array receives a result (a
    copy would receive it instead, so the advice differs)."""
    if isinstance(v, np.ndarray):
        if not v.flags['C_CONTIGUOUS']:
            raise _pskv.InvalidArgument(_CONTIGUOUS_OUT if output else
                                        'arrays must be C-contiguous (numpy.ascontiguousarray)')
        return v
    if isinstance(v, _pskv.DeviceArray):
        return v
    if type(v).__module__.startswith('torch'):
        if v.device.type != 'cpu':
            raise _pskv.InvalidArgument('only CPU tensors are supported on this build')
        if not v.is_contiguous():
            raise _pskv.InvalidArgument(_CONTIGUOUS_OUT if output else
                                        'tensors must be contiguous (call .contiguous())')
        return v.detach().numpy()
    if hasattr(v, '__cuda_array_interface__'):
        return _pskv.DeviceArray.wrap(v)
    raise TypeError('values must be numpy arrays, torch tensors, pskv.DeviceArray or device arrays '
                    'exposing __cuda_array_interface__, got %s' % type(v).__name__)


def _is_dense(v):
    """A dense value as _as_array gives it (the binding takes these)."""
    return isinstance(v, (np.ndarray, _pskv.DeviceArray))


_CONTIGUOUS_OUT = ('an output must be C-contiguous: pull into a contiguous buffer (numpy.empty_like, '
                   'torch.empty_like) and copy it back (w[...] = buf); a contiguous copy of the output '
                   'would receive the result instead of it')


def _is_list(v):
    return isinstance(v, (list, tuple))


def _torch_watch(*values):
    """(tensor, version) of every torch tensor in `values` (nested lists too): torch
    tensors cannot be made read-only, but their version counter says whether an
    in-place operation touched them (pskv itself writes through a numpy view, which
    does not count). Not watched: views (a view shares its base's counter, so a
    change to another part of the base, e.g. of a flat gradient bucket, would look
    like one to the view) and inference tensors (they have no counter)."""
    for v in values:
        if v is not None and type(v) is not np.ndarray:
            break
    else:
        return ()  # the common case, cheaply
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


def _torch_outputs(out):
    """The dense torch tensors among `out` (nested lists too) that a pull writes into,
    once each; inference tensors have no version counter and are left out."""
    if out is None or type(out) is np.ndarray:
        return []  # the common case, cheaply
    found, seen, stack = [], set(), [out]
    while stack:
        v = stack.pop()
        if _is_list(v):
            stack.extend(v)
        elif (type(v).__module__.startswith('torch') and id(v) not in seen and
              getattr(v, 'layout', None) is not None and str(v.layout) == 'torch.strided' and
              not v.is_inference()):
            seen.add(id(v))
            found.append(v)
    return found


def _bump_versions(tensors):
    """Counts pskv's write into each tensor of `tensors` as torch counts an in-place
    write: its version counter goes up by one, so that autograd refuses a tensor it
    saved for backward and a pull changed since, as it refuses one ``copy_`` changed
    (pskv writes through a numpy view, which torch does not see). The write is an
    in-place op on an empty view: no element is touched, the counter (shared with
    the view) moves; no_grad lets it run on leaves that require grad."""
    if not tensors:
        return
    import torch
    with torch.no_grad():
        for t in tensors:
            t.view(-1)[:0].zero_()


def _flatten(key, value, sparse_keys=None, output=False):
    """(key, value) in any of MXNet's shapes -> parallel flat lists (as MXNet).

    With `sparse_keys` (a container of the store's row_sparse keys), row_sparse values
    (RowSparseArray, torch sparse tensors, and ``(data, indices)`` pairs of a row_sparse
    key) are kept as they are; otherwise every value becomes a numpy array."""
    if type(value) is np.ndarray and type(key) in (int, str) and value.flags.c_contiguous:
        return [key], [value]  # the common case, cheaply
    if _is_list(key):
        if not _is_list(value) or len(key) != len(value):
            raise AssertionError('the number of keys and values differ')
        keys, vals = [], []
        for k, v in zip(key, value):
            k2, v2 = _flatten(k, v, sparse_keys, output)
            keys += k2
            vals += v2
        types = set(type(k) for k in keys)
        if len(types) > 1:
            raise AssertionError('inconsistent types of keys detected.')
        return keys, vals
    if isinstance(key, bool) or not isinstance(key, (int, str, np.integer)):
        raise AssertionError('unexpected type for keys: %s' % type(key).__name__)
    key = int(key) if isinstance(key, np.integer) else key
    if _is_list(value) and not _is_rows(key, value, sparse_keys):
        return [key] * len(value), [_value(key, v, sparse_keys, output) for v in value]
    return [key], [_value(key, value, sparse_keys, output)]


def _is_rows(key, v, sparse_keys):
    """A ``(data, indices)`` pair standing for one value of a row_sparse key (values
    only: a pull's outputs are never rows)."""
    return sparse_keys is not None and isinstance(v, tuple) and len(v) == 2 and key in sparse_keys


def _value(key, v, sparse_keys, output=False):
    if sparse_keys is not None and (_sparse.is_sparse(v) or _is_rows(key, v, sparse_keys)):
        return v
    return _as_array(v, output)


def _split_sparse(keys, vals):
    """Flat (keys, values) -> (dense keys, dense arrays, {key: [row_sparse values]})."""
    if all(type(v) is np.ndarray for v in vals):
        return keys, vals, {}
    dk, dv, sp = [], [], {}
    for k, v in zip(keys, vals):
        if _is_dense(v):
            dk.append(k)
            dv.append(v)
        else:
            sp.setdefault(k, []).append(v)
    both = set(dk).intersection(sp)
    if both:
        raise _pskv.InvalidArgument(
            'the values of key %s mix dense and row_sparse arrays: all values of one key must '
            'share one storage type' % _key_names(sorted(both, key=repr)))
    return dk, dv, sp


def _unique(keys):
    return list(dict.fromkeys(keys))


def _key_names(keys):
    return ', '.join(repr(k) for k in _unique(keys))


def _annotated(e, text):
    """`e` with `text` in its message (pskv errors, same type) or as a note (others)."""
    if isinstance(e, _pskv.Error) and len(e.args) == 1:
        new = type(e)('%s [%s]' % (e.args[0], text))
        new.__cause__ = e.__cause__
        return new.with_traceback(e.__traceback__)
    if hasattr(e, 'add_note'):
        e.add_note('pskv: ' + text)
    return e
