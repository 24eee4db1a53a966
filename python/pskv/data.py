"""Data-parallel helpers with MXNet's semantics (spec section 7), the same
functions as the C++ ``pskv::data`` (they run the same code).

    lo, hi = pskv.data.partition_range(len(ds), kv.num_workers, kv.rank)   # MNISTIter num_parts/part_index
    n_batches = pskv.data.epoch_size(len(ds), kv.num_workers, batch)      # equal on every worker (sync)
    xs = pskv.data.split_data(x, 2)                                       # Gluon split_data
    xs = pskv.data.split_data(x, 2, work_load_list=[1, 3])                # Module's work_load_list

See also pskv.torch.Sampler (a DataLoader sampler built on these).
"""
from . import _pskv

_d = _pskv.data


def partition_range(count, num_parts=1, part_index=0):
    """Records [begin, end) of part `part_index` of `num_parts`:
    floor(count*p/num_parts) .. floor(count*(p+1)/num_parts) (MXNet's MNISTIter)."""
    return tuple(_d.partition_range(int(count), int(num_parts), int(part_index)))


def epoch_size(num_examples, num_workers, batch_size):
    """Batches per epoch every worker runs in sync mode:
    ceil(floor(num_examples / num_workers) / batch_size)."""
    return _d.epoch_size(int(num_examples), int(num_workers), int(batch_size))


def epoch_order(count, num_parts, part_index, batch_size, epoch_size, seed=0, epoch=0, shuffle=True):
    """This worker's sample indices for one epoch: its partition, shuffled with
    (seed, epoch), exactly epoch_size*batch_size indices (wrapping around like
    MXNet's ResizeIter, or cut short)."""
    return _d.epoch_order(int(count), int(num_parts), int(part_index), int(batch_size), int(epoch_size),
                          int(seed), int(epoch), bool(shuffle))


def split_batch(size, num_slice, even_split=True):
    """[(begin, end)] slices of a batch of `size` over `num_slice` devices: the first
    size % num_slice get one more; even_split requires size % num_slice == 0."""
    return [tuple(s) for s in _d.split_batch(int(size), int(num_slice), bool(even_split))]


def split_by_workload(batch, work_load_list):
    """[(begin, end)] slices by per-device workloads (Module's work_load_list):
    b_i = round(w_i*batch/sum(w)) (half to even), the deficit added to the last."""
    return [tuple(s) for s in _d.split_by_workload(int(batch), [float(w) for w in work_load_list])]


def split_data(data, num_slice, batch_axis=0, even_split=True, work_load_list=None):
    """Gluon's split_data on a numpy array or torch tensor (views, no copy): a list
    of `num_slice` slices along `batch_axis`."""
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
