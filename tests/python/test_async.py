"""Issue 22 item 2: batches — calls issued through ``with kv.batch() as b:`` travel
together and are waited for when the block ends (also when it raises); the store's
own calls stay complete on return, whatever batch is open where; arrays in flight
stay alive and read-only; calls on overlapping bytes are ordered; errors come with
the calls in flight; the Trainer issues a step's communication in one batch."""
import asyncio
import threading
import warnings

import numpy as np
import pytest

import pskv
from conftest import launch_scenarios, slow_store


def failing_updater(key, recv, stored):
    raise ValueError('updater failed')


def launch(scenarios, workers, delay_ms):
    launch_scenarios('async_check.py', scenarios, workers, delay_ms)


@pytest.mark.parametrize('workers', [1, 2])
def test_dist_in_flight_semantics_and_lifetime(workers):
    # The checks that calls are still in flight right after they returned need the
    # servers to hold replies far longer than a stall of this (loaded) machine.
    launch('returns_at_once,lifetime', workers, delay_ms=1000)
    launch('ordering,trainer,close_first', workers, delay_ms=100)


def test_batch_results_at_its_end_and_read_only_inside():
    kv = slow_store()
    kv.init(['a', 'b'], [np.zeros(3, np.float32), np.zeros(3, np.float32)])
    g = np.ones(3, np.float32)
    out_a, out_b = np.zeros(3, np.float32), np.zeros(3, np.float32)
    with kv.batch() as b:
        b.push('a', g)
        with pytest.raises(ValueError, match='read-only'):
            g[0] = 2  # the push may not have read it yet
        b.pull('a', out=out_a)
        b.pushpull('b', np.full(3, 2, np.float32), out=out_b)
        assert kv.pending >= 1  # in flight: the block goes on at once
    assert g.flags.writeable and out_a.flags.writeable and out_b.flags.writeable
    assert out_a.tolist() == [1, 1, 1] and out_b.tolist() == [2, 2, 2]
    g[0] = 2  # reusable now
    with pytest.raises(pskv.UsageError, match='batch is over'):
        b.push('a', g)  # a batch is used inside its block only
    with pytest.raises(pskv.UsageError, match='not entered'):
        kv.batch().push('a', g)


def test_the_stores_own_calls_stay_complete_while_a_batch_is_open():
    """A batch is an object, not a mode: a generator suspended inside its block, an
    asyncio task or another thread holding one open changes nothing for plain calls."""
    kv = slow_store()
    kv.init([0, 1], [np.zeros(2, np.float32)] * 2)

    def gen():
        with kv.batch() as b:
            b.push(1, np.ones(2, np.float32))
            yield
    g = gen()
    next(g)  # suspended inside its block
    w = np.zeros(2, np.float32)
    kv.push(0, np.full(2, 5, np.float32))
    kv.pull(0, out=w)
    assert w.tolist() == [5, 5]
    g.close()

    async def holder(opened, done):
        with kv.batch() as b:
            b.push(1, np.ones(2, np.float32))
            opened.set()
            await done.wait()

    async def other(opened, done):
        await opened.wait()
        out = np.zeros(2, np.float32)
        kv.push(0, np.full(2, 4, np.float32))
        kv.pull(0, out=out)
        done.set()
        return out.tolist()

    async def main():
        opened, done = asyncio.Event(), asyncio.Event()
        return (await asyncio.gather(holder(opened, done), other(opened, done)))[1]
    assert asyncio.run(main()) == [9, 9]


def test_batch_orders_calls_on_overlapping_bytes():
    """A call reading (or writing) bytes that an earlier call in flight writes waits
    for it first, as MXNet's engine ordered NDArrays: same array, views at an offset,
    torch tensors on the same storage, plain calls and other batches alike."""
    torch = pytest.importorskip('torch')
    kv = slow_store()
    kv.init([1, 2, 3, 4], [np.zeros(2, np.float32)] * 3 + [np.zeros(4, np.float32)])
    w = np.zeros(2, np.float32)
    t = torch.zeros(2)
    big = np.zeros(4, np.float32)
    with kv.batch() as b:
        b.push(1, np.full(2, 3, np.float32))
        b.pull(1, out=w)  # w: an output in flight
        b.push(2, w)  # reads w: waits for the pull of key 1
        b.pull(2, out=w)  # writes w again
        b.push(3, np.full(2, 5, np.float32))
        b.pull(3, out=t)
        b.push(1, t)  # a torch tensor: a new numpy view, the same memory
        b.push(4, np.full(4, 7, np.float32))
        b.pull(4, out=big)
        b.push(2, big[2:])  # a view at an offset: overlapping bytes
        plain = np.zeros(2, np.float32)
        kv.pushpull(3, big[1:3], out=plain)  # a plain call on those bytes waits too
        assert plain.tolist() == [12, 12]  # 5 + 7: after the pull of key 4 landed in big
    assert w.tolist() == [3, 3] and t.tolist() == [5, 5] and big.tolist() == [7] * 4
    got = np.zeros(2, np.float32)
    kv.pull(1, out=got)
    assert got.tolist() == [8, 8]
    kv.pull(2, out=got)
    assert got.tolist() == [10, 10]


def test_batch_end_raises_the_first_failure_naming_the_calls():
    kv = pskv.create('local')
    kv.init('w', np.zeros(2, np.float32))

    kv.set_updater(failing_updater)
    g = np.ones(2, np.float32)
    with pytest.raises(ValueError, match='updater failed') as e:
        with kv.batch() as b:
            b.push('w', g)  # returns: the error is the batch's
    notes = '\n'.join(getattr(e.value, '__notes__', []))
    assert "updater of key 'w'" in notes and "push of key 'w'" in notes, notes
    assert g.flags.writeable  # released although the call failed
    kv.init(['p', 'q'], [np.zeros(2, np.float32)] * 2)

    def refuse(key, recv, stored):
        raise pskv.UsageError('refused by the updater')

    kv.set_updater(refuse)
    with pytest.raises(pskv.UsageError, match=r"refused by the updater .*push of key 'p', 'q'"):
        with kv.batch() as b:
            b.push(['p', 'q'], [np.ones(2, np.float32)] * 2)


def test_a_block_that_raises_still_waits_and_keeps_its_exception():
    kv = slow_store()
    kv.init('x', np.zeros(2, np.float32))
    out = np.zeros(2, np.float32)
    with pytest.raises(KeyboardInterrupt):
        with kv.batch() as b:
            b.push('x', np.ones(2, np.float32))
            b.pull('x', out=out)
            raise KeyboardInterrupt
    assert out.tolist() == [1, 1] and out.flags.writeable  # nothing in flight after the block

    kv.set_updater(failing_updater)
    with pytest.raises(RuntimeError, match='mine') as e:
        with kv.batch() as b:
            b.push('x', np.ones(2, np.float32))
            raise RuntimeError('mine')
    assert 'the calls of the batch failed too: ValueError' in '\n'.join(e.value.__notes__)


def test_close_inside_a_batch_reports_its_failures_at_the_end():
    kv = pskv.create('local')
    kv.init('c', np.zeros(2, np.float32))

    kv.set_updater(failing_updater)
    with pytest.raises(ValueError, match='updater failed'):
        with kv.batch() as b:
            b.push('c', np.ones(2, np.float32))
            kv.close()


def test_batches_nest_each_waiting_for_its_own_calls_and_threads_are_independent():
    kv = slow_store(delay=0.2)
    kv.init(['n', 'm'], [np.zeros(2, np.float32)] * 2)
    out = np.zeros(2, np.float32)
    with kv.batch() as outer:
        with kv.batch() as inner:
            inner.push('n', np.ones(2, np.float32))
            inner.pull('n', out=out)
        assert out.tolist() == [1, 1]  # the inner block's end waited for its calls
        seen = []

        def other():  # another thread's plain calls are complete when they return
            o = np.zeros(2, np.float32)
            kv.push('m', np.ones(2, np.float32))
            kv.pull('m', out=o)
            seen.append(o.tolist())
        outer.push('n', np.ones(2, np.float32))
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert seen == [[1, 1]]
        outer.pull('n', out=out)
    assert out.tolist() == [2, 2]


def test_blocking_false_is_refused():
    with pytest.raises(pskv.UsageError, match='kv.batch'):
        pskv.create('local', blocking=False)
    kv = pskv.create('local', blocking=True)  # what every store does: accepted
    kv.init(0, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    kv.pull(0, out=out)
    assert out.tolist() == [1, 1]


def test_same_out_twice_in_a_batch_and_read_only_arrays():
    kv = pskv.create('local')
    kv.init(0, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    ro = np.zeros(2, np.float32)
    ro.flags.writeable = False
    with kv.batch() as b:
        b.pull(0, out=out)
        b.pull(0, out=out)  # the same output again: ordered after the first
        with pytest.raises(pskv.InvalidArgument, match='read-only'):
            b.pull(0, out=ro)
        b.push(0, ro)  # an input that was read-only stays read-only
    assert out.flags.writeable and not ro.flags.writeable
    assert out.tolist() == [1, 1]


def test_an_output_that_is_not_contiguous_says_how_to_get_the_result():
    torch = pytest.importorskip('torch')
    kv = pskv.create('local')
    kv.init(0, np.ones(2, np.float32))
    for out in (np.zeros((2, 2), np.float32)[:, 0], torch.zeros(2, 2)[:, 0]):
        with pytest.raises(pskv.InvalidArgument, match=r'copy it back \(w\[\.\.\.\] = buf\)'):
            kv.pull(0, out=out)


@pytest.mark.parametrize('uok', [True, False])
def test_trainer_issues_a_step_before_one_wait(uok):
    pytest.importorskip('torch')
    from async_check import trainer_step_calls
    trainer_step_calls(pskv.create('local'), uok)  # buffers: in the 2-worker job above


def test_trainer_groups_small_parameters_by_the_stores_fusion_limit(monkeypatch):
    pytest.importorskip('torch')
    from async_check import trainer_step_calls
    monkeypatch.setenv('PSKV_FUSION_KEY_BYTES', '0')  # no fusion: one call per parameter
    kv = pskv.create('local')
    assert kv._kv.fusion_key_bytes == 0
    trainer_step_calls(kv, True)


def test_torch_tensor_modified_in_a_batch_is_reported_at_its_end():
    torch = pytest.importorskip('torch')
    kv = slow_store(delay=0.02)
    kv.init(['a', 'b', 'c'], [np.zeros(3, np.float32)] * 3)
    # Following the rules: no error, values right.
    g, out = torch.ones(3), torch.zeros(3)
    with kv.batch() as b:
        b.push('a', g)
        b.pull('a', out=out)
    assert out.tolist() == [1, 1, 1]
    g.add_(1)  # after the batch: fine
    # An input modified in place inside the batch.
    with pytest.raises(pskv.UsageError, match=r"push of key 'a'.*modified in place"):
        with kv.batch() as b:
            b.push('a', g)
            g.add_(1)
    # An output written inside the batch (pskv's own write does not count).
    o = torch.zeros(3)
    with pytest.raises(pskv.UsageError, match=r"pull of key 'b'"):
        with kv.batch() as b:
            b.pull('b', out=o)
            o[0] = 5
    # pushpull in place: pskv writes the result into the value, which is no misuse.
    v = torch.ones(3)
    with kv.batch() as b:
        b.pushpull('c', v)
    assert v.tolist() == [1, 1, 1]
    # Views (a flat bucket: another part of it changes) and inference tensors are
    # not watched: no false report, no error from the missing counter.
    flat = torch.zeros(6)
    with torch.inference_mode():
        inf = torch.zeros(3)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with kv.batch() as b:
            b.push('a', flat[:3])
            flat[3:].add_(1)
            b.pull('b', out=inf)


def test_a_call_refused_when_scheduled_leaves_its_arrays_writable():
    kv = pskv.create('local')
    kv.init('k', np.zeros(2, np.float32))
    g = np.ones(3, np.float32)  # the wrong shape: refused by the store
    with kv.batch() as b:
        with pytest.raises(pskv.ShapeError):
            b.push('k', g)
        g[0] = 5  # writable again at once


def test_another_threads_wait_never_frees_a_batch_call_still_running():
    """A plain call's wait on a key (another thread) releases only the batch calls
    scheduled before it began: one scheduled meanwhile stays claimed and read-only."""
    import sys
    import time
    kv = pskv.create('local')
    kv.init([0, 1], [np.zeros(4, np.float32)] * 2)
    state = {'busy': 0}

    def upd(k, recv, stored):
        state['busy'] = recv[0]
        time.sleep(0.002)
        stored[:] = recv
        state['busy'] = 0
    kv.set_updater(upd)
    stop = []

    def plain_loop():
        x = np.zeros(4, np.float32)
        while not stop:
            kv.pull(0, out=x)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    t = threading.Thread(target=plain_loop)
    t.start()
    bad = 0
    try:
        for i in range(150):
            g = np.full(4, i + 1, np.float32)
            with kv.batch() as b:
                b.pushpull(0, g)
                for _ in range(20):
                    time.sleep(0)
                    if g.flags.writeable and state['busy'] == i + 1:  # its update is running
                        bad += 1
                        break
    finally:
        stop.append(1)
        t.join(30)
        sys.setswitchinterval(old)
    assert bad == 0


def test_an_array_subclass_whose_setflags_calls_the_store_is_safe():
    kv = pskv.create('local')
    kv.init(list(range(60)), [np.zeros(4, np.float32)] * 60)

    class Arr(np.ndarray):
        def setflags(self, *a, **k):
            super().setflags(*a, **k)
            kv.pull(59, out=np.zeros(4, np.float32))  # a plain call while pskv restores flags

    for _ in range(5):
        arrs = [np.ones(4, np.float32).view(Arr) for _ in range(50)]
        with kv.batch() as b:
            for k, x in enumerate(arrs):
                b.pull(k, out=[x])
        assert all(x.flags.writeable for x in arrs)
