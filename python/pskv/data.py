"""Data-parallel helpers with MXNet's semantics (spec section 7), the same
functions as the C++ ``pskv::data`` (they run the same code).

    lo, hi = pskv.data.partition_range(len(ds), kv.num_workers, kv.rank)   # MNISTIter num_parts/part_index
    n_batches = pskv.data.epoch_size(len(ds), kv.num_workers, batch)      # equal on every worker (sync)
    xs = pskv.data.split_data(x, 2)                                       # Gluon split_data
    xs = pskv.data.split_data(x, 2, work_load_list=[1, 3])                # Module's work_load_list
    xs = pskv.data.split_and_load(x, ['cuda:0', 'cuda:1'])                # one DeviceArray per device

See also pskv.torch.Sampler (a DataLoader sampler built on these).
"""
from . import _pskv

_d = _pskv.data


def partition_range(count, num_parts=1, part_index=0):
    """Records [begin, end) of part `part_index` of `num_parts` (MXNet's MNISTIter).

    Parameters
    ----------
    count : int
        Number of records.
    num_parts : int, optional
        Number of parts (workers).
    part_index : int, optional
        This part, 0 .. num_parts - 1.

    Returns
    -------
    tuple of int
        ``(floor(count*p/num_parts), floor(count*(p+1)/num_parts))``.
    """
    return tuple(_d.partition_range(int(count), int(num_parts), int(part_index)))


def epoch_size(num_examples, num_workers, batch_size):
    """Batches per epoch every worker runs in sync mode.

    Parameters
    ----------
    num_examples : int
        Records in the whole dataset.
    num_workers : int
        Workers of the job.
    batch_size : int
        Per-worker batch size.

    Returns
    -------
    int
        ``ceil(floor(num_examples / num_workers) / batch_size)``.
    """
    return _d.epoch_size(int(num_examples), int(num_workers), int(batch_size))


def epoch_order(count, num_parts, part_index, batch_size, epoch_size, seed=0, epoch=0, shuffle=True):
    """This worker's sample indices for one epoch.

    Its partition, shuffled with (seed, epoch), exactly ``epoch_size*batch_size``
    indices (wrapping around like MXNet's ResizeIter, or cut short).

    Parameters
    ----------
    count : int
        Records in the dataset.
    num_parts, part_index : int
        The partition (workers and this worker's rank).
    batch_size, epoch_size : int
        Per-worker batch size and batches per epoch.
    seed, epoch : int, optional
        The shuffle's seed and epoch number.
    shuffle : bool, optional
        Shuffle (True) or keep the partition's order.

    Returns
    -------
    list of int
    """
    return _d.epoch_order(int(count), int(num_parts), int(part_index), int(batch_size), int(epoch_size),
                          int(seed), int(epoch), bool(shuffle))


def split_batch(size, num_slice, even_split=True):
    """Slices of a batch of `size` over `num_slice` devices.

    Parameters
    ----------
    size : int
        The batch size.
    num_slice : int
        The number of slices.
    even_split : bool, optional
        Require ``size % num_slice == 0``; otherwise the first ``size % num_slice``
        slices get one more.

    Returns
    -------
    list of tuple of int
        ``[(begin, end)]``.
    """
    return [tuple(s) for s in _d.split_batch(int(size), int(num_slice), bool(even_split))]


def split_by_workload(batch, work_load_list):
    """Slices of a batch by per-device workloads (Module's work_load_list).

    Parameters
    ----------
    batch : int
        The batch size.
    work_load_list : list of float
        The relative workloads: ``b_i = round(w_i*batch/sum(w))`` (half to even), the
        deficit added to the last.

    Returns
    -------
    list of tuple of int
        ``[(begin, end)]``.
    """
    return [tuple(s) for s in _d.split_by_workload(int(batch), [float(w) for w in work_load_list])]


def split_data(data, num_slice, batch_axis=0, even_split=True, work_load_list=None):
    """Gluon's split_data on a numpy array or torch tensor (views, no copy).

    Parameters
    ----------
    data : numpy.ndarray or torch.Tensor
        The batch.
    num_slice : int
        The number of slices.
    batch_axis : int, optional
        The axis to split.
    even_split : bool, optional
        See :func:`split_batch`.
    work_load_list : list of float, optional
        Split by workloads instead (see :func:`split_by_workload`).

    Returns
    -------
    list
        `num_slice` views of `data` along `batch_axis`.
    """
    size = data.shape[batch_axis]
    if work_load_list is not None:
        if len(work_load_list) != num_slice:
            raise _pskv.InvalidArgument('work_load_list has %d entries for %d slices'
                                        % (len(work_load_list), num_slice))
        slices = split_by_workload(size, work_load_list)
    else:
        slices = split_batch(size, num_slice, even_split)
    out = []
    for lo, hi in slices:
        index = [slice(None)] * len(data.shape)
        index[batch_axis] = slice(lo, hi)
        out.append(data[tuple(index)])
    return out


def split_and_load(batch, devices, work_load_list=None, batch_axis=0, even_split=False):
    """Splits a batch over devices and copies each slice to its device (Gluon's
    split_and_load; Module's work_load_list).

    The slices are :func:`split_data`'s: ``b/k`` samples each, the first ``b % k``
    devices one more (or in proportion to `work_load_list`, see
    :func:`split_by_workload`), so every call places the samples the same way.

    Parameters
    ----------
    batch : numpy.ndarray or torch.Tensor
        The batch (host memory).
    devices : str or list of str
        The devices: ``'cuda:N'``, ``'gpu:N'``, MXNet's ``'gpu(N)'``, ``'cpu_pinned'``, or
        ``'cpu'`` (a view of the batch, no copy).
    work_load_list : list of float, optional
        Relative workloads, one per device (``[3, 1]``: the first device gets 3/4).
    batch_axis : int, optional
        The axis of the samples.
    even_split : bool, optional
        Require ``b % k == 0`` (Gluon's default is True; pskv's, False).

    Returns
    -------
    list
        One array per device: a :class:`pskv.DeviceArray` on a device, a view of
        `batch` for ``'cpu'``.

    Raises
    ------
    pskv.DeviceUnavailable
        A device that does not exist here.
    """
    if isinstance(devices, str) or not hasattr(devices, '__len__'):
        devices = [devices]
    parts = split_data(batch, len(devices), batch_axis, even_split, work_load_list)
    return [p if str(d).lower() in ('cpu', 'cpu(0)', 'cpu:0') else _pskv.DeviceArray(p, d)
            for p, d in zip(parts, devices)]
