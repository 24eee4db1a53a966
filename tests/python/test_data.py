"""pskv.data and pskv.torch.Sampler: MXNet's partitioning, epoch_size, batch
splitting and work_load_list, the same functions as C++ pskv::data."""
import numpy as np
import pytest

import pskv


def test_partition_range_is_mnistiter_formula():
    for count, k in [(10, 3), (60000, 7), (5, 5), (7, 2)]:
        parts = [pskv.data.partition_range(count, k, p) for p in range(k)]
        assert parts == [(count * p // k, count * (p + 1) // k) for p in range(k)]
    assert pskv.data.partition_range(10, 3, 2) == (6, 10)
    with pytest.raises(pskv.InvalidArgument):
        pskv.data.partition_range(10, 3, 3)
    with pytest.raises(pskv.InvalidArgument):
        pskv.data.partition_range(10, 0, 0)


def test_epoch_size():
    assert pskv.data.epoch_size(60000, 2, 64) == 469  # ceil(30000 / 64)
    assert pskv.data.epoch_size(100, 3, 7) == 5  # ceil(33 / 7)
    assert pskv.data.epoch_size(10, 1, 5) == 2


def test_split_batch_and_split_data():
    assert pskv.data.split_batch(10, 3, even_split=False) == [(0, 4), (4, 7), (7, 10)]
    assert pskv.data.split_batch(8, 2) == [(0, 4), (4, 8)]
    with pytest.raises(pskv.InvalidArgument, match='multiple of 3'):
        pskv.data.split_batch(10, 3)
    x = np.arange(20).reshape(10, 2)
    parts = pskv.data.split_data(x, 3, even_split=False)
    assert [p.shape[0] for p in parts] == [4, 3, 3]
    assert np.array_equal(np.concatenate(parts), x)
    assert np.shares_memory(parts[0], x)  # views, no copy
    cols = pskv.data.split_data(x.T, 2, batch_axis=1, even_split=True)
    assert [c.shape for c in cols] == [(2, 5), (2, 5)]


def test_work_load_list():
    # b_i = round(w_i * b / sum w), half to even, deficit to the last device
    assert pskv.data.split_by_workload(10, [1, 3]) == [(0, 2), (2, 10)]  # round(2.5) = 2 -> 2 + 8
    assert pskv.data.split_by_workload(10, [1, 1, 1]) == [(0, 3), (3, 6), (6, 10)]
    parts = pskv.data.split_data(np.arange(12), 2, work_load_list=[1, 2])
    assert [len(p) for p in parts] == [4, 8]
    with pytest.raises(pskv.InvalidArgument, match='Too many slices'):
        pskv.data.split_by_workload(2, [1, 1, 100])
    with pytest.raises(pskv.InvalidArgument, match='work_load_list'):
        pskv.data.split_data(np.arange(12), 3, work_load_list=[1, 2])


def test_sampler_with_dataloader():
    torch = pytest.importorskip('torch')
    import pskv.torch
    ds = torch.utils.data.TensorDataset(torch.arange(23))
    batch, k = 4, 2
    seen = []
    for rank in range(k):
        s = pskv.torch.Sampler(ds, batch, num_parts=k, part_index=rank, seed=1)
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=s)
        lo, hi = pskv.data.partition_range(len(ds), k, rank)
        batches = [b[0].tolist() for b in loader]
        # every worker runs epoch_size batches (3 = ceil(11 / 4)), wrapping around its part
        assert len(batches) == len(s) // batch == pskv.data.epoch_size(len(ds), k, batch) == 3
        flat = sum(batches, [])
        assert all(lo <= i < hi for i in flat) and set(range(lo, hi)) <= set(flat)
        seen.append(set(flat))
        s.set_epoch(1)
        assert [b[0].tolist() for b in loader] != batches  # reshuffled per epoch
        s.set_epoch(0)
        assert [b[0].tolist() for b in loader] == batches  # deterministic
    assert not seen[0] & seen[1]
    s = pskv.torch.Sampler(10, 5, shuffle=False)
    assert list(s) == list(range(10))
