"""Issue 22 item 3: every documented way of calling reads right values right after
the call returns — never the old bytes of an output whose result has not landed.

Local stores: an updater that sleeps keeps each push in the engine for a while, so a
call returning before its result landed would be caught reading old values. Dist
stores: the servers hold every reply (PSKV_TEST_REPLY_DELAY), see stale_check.py.
On pskv before issue 22 (calls returned at once) these tests fail."""
import threading

import numpy as np
import pytest

import pskv
from conftest import launch_scenarios, slow_store



@pytest.fixture(params=['local', 'device'])
def kind(request):
    return request.param


def test_pull_after_push_rounds(kind):
    kv = slow_store(kind)
    kv.init(3, np.zeros(4, np.float32))
    out = np.zeros(4, np.float32)
    for r in range(1, 8):
        kv.push(3, [np.ones(4, np.float32)] * 2)  # two devices: summed
        kv.pull(3, out=out)
        assert out.tolist() == [2 * r] * 4, 'round %d' % r


def test_pull_after_init_and_into_lists(kind):
    kv = slow_store(kind)
    kv.init(['a', 'b'], [np.ones(4, np.float32), np.full(4, 2, np.float32)])
    outs = [[np.zeros(4, np.float32), np.zeros(4, np.float32)], [np.zeros(4, np.float32)]]
    kv.pull(['a', 'b'], out=outs)
    assert [o.tolist() for o in outs[0]] == [[1] * 4] * 2 and outs[1][0].tolist() == [2] * 4
    kv.push(['a', 'b'], [np.ones(4, np.float32), np.ones(4, np.float32)])
    kv.pull(['a', 'b'], out=outs)
    assert [o.tolist() for o in outs[0]] == [[2] * 4] * 2 and outs[1][0].tolist() == [3] * 4


def test_pushpull_in_place_and_inputs_reusable(kind):
    kv = slow_store(kind)
    kv.init('w', np.zeros(4, np.float32))
    for r in range(1, 4):
        g = np.ones(4, np.float32)
        kv.pushpull('w', g)
        assert g.tolist() == [r] * 4
        g[:] = 100  # reusable at once: the push has read it
    out = np.zeros(4, np.float32)
    kv.pull('w', out=out)
    assert out.tolist() == [3] * 4


def test_torch_tensors(kind):
    torch = pytest.importorskip('torch')
    kv = slow_store(kind)
    kv.init('t', torch.zeros(5))
    g, w = torch.ones(5), torch.zeros(5)
    kv.pushpull('t', g, out=w)
    assert w.tolist() == [1] * 5
    g.add_(1)  # reusable: no error from a later wait either
    kv.push('t', g)
    kv.pull('t', out=w)
    assert w.tolist() == [3] * 5
    kv.wait_all()


def test_broadcast(kind):
    kv = slow_store(kind)
    outs = [np.zeros(3, np.float32), np.zeros(3, np.float32)]
    kv.broadcast('b', np.full(3, 7, np.float32), out=outs)
    assert [o.tolist() for o in outs] == [[7] * 3] * 2


def test_row_sparse_pull_after_push(kind):
    kv = slow_store(kind)
    kv.init('e', pskv.row_sparse_array(np.zeros((6, 2), np.float32)))
    kv.push('e', pskv.RowSparseArray(np.ones((2, 2), np.float32), [0, 3], (6, 2)))
    got = kv.row_sparse_pull('e', row_ids=np.array([3, 5]))
    assert got.indices.tolist() == [3, 5] and got.data.tolist() == [[1, 1], [0, 0]]


def test_several_stores_in_one_process_and_threads():
    kvs = [slow_store('local', delay=0.02) for _ in range(3)]
    for i, kv in enumerate(kvs):
        kv.init('k', np.full(2, i, np.float32))
    errors = []

    def loop(i, kv):
        out = np.zeros(2, np.float32)
        for r in range(1, 5):
            kv.push('k', np.ones(2, np.float32))
            kv.pull('k', out=out)
            if out.tolist() != [i + r] * 2:
                errors.append((i, r, out.tolist()))
    threads = [threading.Thread(target=loop, args=(i, kv)) for i, kv in enumerate(kvs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


@pytest.mark.parametrize('workers', [1, 2])
def test_dist_sync_reads_right_values_right_after_each_call(workers):
    pytest.importorskip('torch')
    scenarios = 'pull_after_init,rounds,pushpull_in_place,lists,broadcast,row_sparse,two_stores'
    launch_scenarios('stale_check.py', scenarios, workers, delay_ms=100)
    launch_scenarios('stale_check.py', 'threads', workers, delay_ms=0)
