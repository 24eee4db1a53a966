"""Data helpers of :mod:`pskv.torch`: a worker's part of a dataset (Gluon's ``shard``)
and the DataLoader sampler with MXNet's partitioning and equal batches per worker."""
import torch as _torch

from . import data
from .data import partition_range


def shard(dataset, rank, num_workers):
    """The part of `dataset` for worker `rank` (Gluon's shard: the first
    ``len % num_workers`` parts get one sample more).

    Parameters
    ----------
    dataset : torch.utils.data.Dataset
        A dataset with ``len()``.
    rank : int
        This worker's rank.
    num_workers : int
        The number of workers.

    Returns
    -------
    torch.utils.data.Subset
    """
    n = len(dataset)
    q, r = divmod(n, num_workers)
    start = q * rank + min(rank, r)
    end = start + q + (1 if rank < r else 0)
    return _torch.utils.data.Subset(dataset, range(start, end))


class Sampler(_torch.utils.data.Sampler):
    """Indices of this worker's part of a dataset for torch.utils.data.DataLoader.

    MXNet's partitioning (records [floor(n*p/k), floor(n*(p+1)/k)), as MNISTIter's
    num_parts/part_index) and exactly epoch_size(n, k, batch_size) batches per epoch
    on every worker (wrapping around like ResizeIter), so sync training never waits
    for a worker that ran out of data. Shuffled per epoch with `seed` (call
    set_epoch(e) like DistributedSampler). Same order as the C++ pskv::data::EpochOrder.

    Parameters
    ----------
    length : int or sized
        The dataset, or its length.
    batch_size : int
        Per-worker batch size.
    num_parts : int, optional
        Workers (``kv.num_workers``).
    part_index : int, optional
        This worker (``kv.rank``).
    shuffle : bool, optional
        Shuffle every epoch.
    seed : int, optional
        The shuffle's seed (the same on every worker).
    epoch_size : int, optional
        Batches per epoch; default :func:`pskv.data.epoch_size`.

    Examples
    --------
    >>> sampler = pskv.torch.Sampler(len(ds), batch_size=64, num_parts=kv.num_workers,
    ...                              part_index=kv.rank)   # doctest: +SKIP
    >>> loader = DataLoader(ds, batch_size=64, sampler=sampler)   # doctest: +SKIP
    """

    def __init__(self, length, batch_size, num_parts=1, part_index=0, shuffle=True, seed=0,
                 epoch_size=None):
        if hasattr(length, '__len__'):
            length = len(length)
        partition_range(length, num_parts, part_index)  # validates
        self.length, self.batch_size = int(length), int(batch_size)
        self.num_parts, self.part_index = int(num_parts), int(part_index)
        self.shuffle, self.seed, self.epoch = bool(shuffle), int(seed), 0
        self.epoch_size = epoch_size if epoch_size is not None else data.epoch_size(length, num_parts, batch_size)

    def set_epoch(self, epoch):
        """Selects the epoch whose order the next iteration yields.

        Parameters
        ----------
        epoch : int
            The epoch number.
        """
        self.epoch = int(epoch)

    def __iter__(self):
        return iter(data.epoch_order(self.length, self.num_parts, self.part_index, self.batch_size,
                                     self.epoch_size, self.seed, self.epoch, self.shuffle))

    def __len__(self):
        return self.epoch_size * self.batch_size
