"""Issue 42, hole 9: a closed store answers every call with pskv.UsageError (it raised
AttributeError: 'NoneType' ...), and a pull into a torch tensor counts as the in-place
write it is (the tensor's version counter goes up), so autograd refuses a saved tensor
a pull changed, as it refuses one ``copy_`` changed, instead of using the new values
silently; pskv's own check of tensors changed in a batch's flight keeps working."""
import os
import tempfile

import numpy as np
import pytest

import pskv

from conftest import slow_store


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_every_call_on_a_closed_store_is_a_usage_error(kind):
    kv = pskv.create(kind)
    kv.init(0, np.zeros(3, np.float32))
    kv.close()
    kv.close()  # again: nothing
    out = np.zeros(3, np.float32)
    calls = [
        lambda: kv.init(1, np.zeros(3, np.float32)),
        lambda: kv.push(0, np.ones(3, np.float32)),
        lambda: kv.pull(0, out=out),
        lambda: kv.pushpull(0, np.ones(3, np.float32)),
        lambda: kv.broadcast(2, np.ones(3, np.float32), out=out),
        lambda: kv.barrier(),
        lambda: kv.wait_all(),
        lambda: kv.wait(0),
        lambda: kv.set_optimizer(pskv.optimizer.SGD(learning_rate=0.1)),
        lambda: kv.save_optimizer_states(os.path.join(tempfile.gettempdir(), 'pskv_closed_states')),
        lambda: kv.load_optimizer_states(os.path.join(tempfile.gettempdir(), 'pskv_closed_states')),
        lambda: kv.rank,
        lambda: kv.num_workers,
        lambda: kv.type,
        lambda: kv.pending,
    ]
    for i, call in enumerate(calls):
        with pytest.raises(pskv.UsageError, match='closed') as e:
            call()
        assert not isinstance(e.value, AttributeError), i
    with pytest.raises(pskv.UsageError, match='closed'):
        with kv.batch() as b:
            b.push(0, np.ones(3, np.float32))
    # with-block: the same after its end
    with pskv.create(kind) as kv2:
        kv2.init(0, np.zeros(3, np.float32))
    with pytest.raises(pskv.UsageError, match='closed'):
        kv2.pull(0, out=out)


def _saved_for_backward(torch, value):
    """A tensor autograd saved for backward (y = sum(w * x) saves x), and y."""
    w = torch.ones(3, requires_grad=True)
    x = torch.tensor(value)
    return x, (w * x).sum()


def test_a_pull_into_a_saved_tensor_makes_backward_raise_as_torch_does():
    torch = pytest.importorskip('torch')
    kv = pskv.create('local')
    kv.init('k', np.full(3, 7, np.float32))
    # What torch does with its own in-place write: backward refuses the changed tensor.
    x, y = _saved_for_backward(torch, [1.0, 2.0, 3.0])
    x.copy_(torch.full((3,), 7.0))
    with pytest.raises(RuntimeError, match='modified by an inplace operation'):
        y.backward()
    # A pull, a pushpull (in place and into out=), a broadcast: the same.
    for call in ('pull', 'pushpull', 'pushpull_out', 'broadcast'):
        x, y = _saved_for_backward(torch, [1.0, 2.0, 3.0])
        before = x._version
        if call == 'pull':
            kv.pull('k', out=x)
        elif call == 'pushpull':
            kv.pushpull('k', x)
        elif call == 'pushpull_out':
            kv.pushpull('k', torch.zeros(3), out=x)
        else:
            kv.broadcast('b_' + str(before) + call, np.full(3, 7, np.float32), out=x)
        assert x._version == before + 1, call
        with pytest.raises(RuntimeError, match='modified by an inplace operation'):
            y.backward()
    # The pushed input of a pushpull with out= is only read: its version stays.
    g, o = torch.ones(3), torch.zeros(3)
    kv.pushpull('k', g, out=o)
    assert g._version == 0 and o._version == 1
    # A parameter (a leaf that requires grad) pulled into: counted, no error.
    p = torch.zeros(3, requires_grad=True)
    kv.pull('k', out=p.detach())
    assert p._version == 1
    # Inference tensors have no counter: pulled into without an error.
    with torch.inference_mode():
        inf = torch.zeros(3)
    kv.pull('k', out=inf)
    assert inf.tolist() == o.tolist()  # the value the last pushpull left


def test_a_batch_counts_its_pulls_once_at_its_end_and_still_reports_changes_in_flight():
    torch = pytest.importorskip('torch')
    kv = slow_store(delay=0.02)
    kv.init(['a', 'b'], [np.zeros(3, np.float32)] * 2)
    x, y = _saved_for_backward(torch, [1.0, 2.0, 3.0])
    with kv.batch() as b:
        b.push('a', torch.ones(3))
        b.pull('a', out=x)
        b.pull('a', out=x)  # two writes of one tensor in one batch: not a misuse
        b.pushpull('b', x)
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert x._version == 1  # once, at the end
    with pytest.raises(RuntimeError, match='modified by an inplace operation'):
        y.backward()
    # A tensor the caller changes while a batch's pull is in flight is still reported.
    o = torch.zeros(3)
    with pytest.raises(pskv.UsageError, match=r"pull of key 'b'.*modified in place"):
        with kv.batch() as b:
            b.pull('b', out=o)
            o[0] = 5
