"""Issue 22 item 2: kv.batch() — calls issued inside travel together and are waited
for when the block ends (also when it raises); arrays in flight stay alive and
read-only; calls on the same memory are ordered; errors come with the calls in
flight; the Trainer issues a step's communication in one batch."""
import threading

import numpy as np
import pytest

import pskv
from conftest import launch_scenarios, slow_store


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
    with kv.batch() as same:
        assert same is kv
        kv.push('a', g)
        with pytest.raises(ValueError, match='read-only'):
            g[0] = 2  # the push may not have read it yet
        kv.pull('a', out=out_a)
        kv.pushpull('b', np.full(3, 2, np.float32), out=out_b)
        assert kv.pending >= 1  # in flight: the block goes on at once
    assert g.flags.writeable and out_a.flags.writeable and out_b.flags.writeable
    assert out_a.tolist() == [1, 1, 1] and out_b.tolist() == [2, 2, 2]
    g[0] = 2  # reusable now


def test_batch_orders_calls_on_the_same_memory():
    """A later call of the batch reading (or writing) an output of an earlier one
    still in flight waits for it first, as MXNet's engine ordered NDArrays."""
    torch = pytest.importorskip('torch')
    kv = slow_store()
    kv.init([1, 2, 3], [np.zeros(2, np.float32)] * 3)
    w = np.zeros(2, np.float32)
    t = torch.zeros(2)
    with kv.batch():
        kv.push(1, np.full(2, 3, np.float32))
        kv.pull(1, out=w)  # w: an output in flight
        kv.push(2, w)  # reads w: waits for the pull of key 1
        kv.pull(2, out=w)  # writes w again
        kv.push(3, np.full(2, 5, np.float32))
        kv.pull(3, out=t)
        kv.push(1, t)  # a torch tensor: a new numpy view, the same memory
    assert w.tolist() == [3, 3] and t.tolist() == [5, 5]
    got = np.zeros(2, np.float32)
    kv.pull(1, out=got)
    assert got.tolist() == [8, 8]


def test_batch_end_raises_the_first_failure_naming_the_calls():
    kv = pskv.create('local')
    kv.init('w', np.zeros(2, np.float32))

    def bad(key, recv, stored):
        raise ValueError('updater failed')

    kv.set_updater(bad)
    g = np.ones(2, np.float32)
    with pytest.raises(ValueError, match='updater failed') as e:
        with kv.batch():
            kv.push('w', g)  # returns: the error is the batch's
    notes = '\n'.join(getattr(e.value, '__notes__', []))
    assert "updater of key 'w'" in notes and "push of key 'w'" in notes, notes
    assert g.flags.writeable  # released although the call failed
    kv.init(['p', 'q'], [np.zeros(2, np.float32)] * 2)

    def refuse(key, recv, stored):
        raise pskv.UsageError('refused by the updater')

    kv.set_updater(refuse)
    with pytest.raises(pskv.UsageError, match=r"refused by the updater .*push of key 'p', 'q'"):
        with kv.batch():
            kv.push(['p', 'q'], [np.ones(2, np.float32)] * 2)


def test_a_block_that_raises_still_waits_and_keeps_its_exception():
    kv = slow_store()
    kv.init('x', np.zeros(2, np.float32))
    out = np.zeros(2, np.float32)
    with pytest.raises(KeyboardInterrupt):
        with kv.batch():
            kv.push('x', np.ones(2, np.float32))
            kv.pull('x', out=out)
            raise KeyboardInterrupt
    assert kv.pending == 0 or out.flags.writeable
    assert out.tolist() == [1, 1] and out.flags.writeable  # nothing in flight after the block

    def bad(key, recv, stored):
        raise ValueError('updater failed')

    kv.set_updater(bad)
    with pytest.raises(RuntimeError, match='mine') as e:
        with kv.batch():
            kv.push('x', np.ones(2, np.float32))
            raise RuntimeError('mine')
    assert 'the calls of the batch failed too: ValueError' in '\n'.join(e.value.__notes__)


def test_batches_nest_and_belong_to_their_thread():
    kv = slow_store(delay=0.2)
    kv.init(['n', 'm'], [np.zeros(2, np.float32)] * 2)
    out = np.zeros(2, np.float32)
    with kv.batch():
        with kv.batch():
            kv.push('n', np.ones(2, np.float32))
        assert kv.pending >= 1  # the inner block's end did not wait: the outer one does
        seen = []

        def other():  # another thread's call on the store is complete when it returns
            o = np.zeros(2, np.float32)
            kv.push('m', np.ones(2, np.float32))
            kv.pull('m', out=o)
            seen.append(o.tolist())
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert seen == [[1, 1]]
        kv.pull('n', out=out)
    assert out.tolist() == [1, 1]


def test_blocking_false_and_the_old_switch_are_refused():
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
    with kv.batch():
        kv.pull(0, out=out)
        kv.pull(0, out=out)  # the same output again: ordered after the first
        with pytest.raises(pskv.InvalidArgument, match='read-only'):
            kv.pull(0, out=ro)
        kv.push(0, ro)  # an input that was read-only stays read-only
    assert out.flags.writeable and not ro.flags.writeable
    assert out.tolist() == [1, 1]


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
    with kv.batch():
        kv.push('a', g)
        kv.pull('a', out=out)
    assert out.tolist() == [1, 1, 1]
    g.add_(1)  # after the batch: fine
    # An input modified in place inside the batch.
    with pytest.raises(pskv.UsageError, match=r"push of key 'a'.*modified in place"):
        with kv.batch():
            kv.push('a', g)
            g.add_(1)
    kv.wait_all()  # reported once
    # An output written inside the batch (pskv's own write does not count).
    o = torch.zeros(3)
    with pytest.raises(pskv.UsageError, match=r"pull of key 'b'"):
        with kv.batch():
            kv.pull('b', out=o)
            o[0] = 5
    # pushpull in place: pskv writes the result into the value, which is no misuse.
    v = torch.ones(3)
    with kv.batch():
        kv.pushpull('c', v)
    assert v.tolist() == [1, 1, 1]
    # Views (a flat bucket: another part of it changes) and inference tensors are
    # not watched: no false report, no error from the missing counter.
    flat = torch.zeros(6)
    with torch.inference_mode():
        inf = torch.zeros(3)
    with kv.batch():
        kv.push('a', flat[:3])
        flat[3:].add_(1)
        kv.pull('b', out=inf)
