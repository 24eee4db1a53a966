"""MXNet's single-machine kvstore tests (tests/python/unittest/test_kvstore.py and
spec section 2), re-expressed with numpy and PyTorch CPU tensors."""
import os
import tempfile

import numpy as np
import pytest

import pskv

SHAPE = (4, 4)
KEYS = [5, 7, 11]
STR_KEYS = ['b', 'c', 'd']


def ones(v=1.0, shape=SHAPE, dtype=np.float32):
    return np.full(shape, v, dtype=dtype)


@pytest.fixture(params=['local', 'device'])
def kv(request):
    return pskv.create(request.param)


def test_single_kv_pair(kv):
    kv.init(3, ones())
    kv.push(3, ones(4))
    out = ones(0)
    kv.pull(3, out=out)
    kv.wait_all()
    assert (out == 4).all()


def test_list_kv_pair(kv):
    kv.init(KEYS, [ones()] * 3)
    kv.push(KEYS, [ones(4)] * 3)
    outs = [ones(0) for _ in KEYS]
    kv.pull(KEYS, out=outs)
    kv.wait_all()
    for o in outs:
        assert (o == 4).all()


def test_aggregator(kv):
    num_devs = 4
    kv.init(3, ones())
    kv.push(3, [ones() for _ in range(num_devs)])
    outs = [ones(0) for _ in range(num_devs)]
    kv.pull(3, out=outs)
    kv.wait_all()
    for o in outs:
        assert (o == num_devs).all()
    # list of keys, list of lists of values
    kv.init(KEYS, [ones()] * 3)
    vals = [[ones(2) for _ in range(num_devs)] for _ in KEYS]
    kv.push(KEYS, vals)
    outs = [[ones(0) for _ in range(num_devs)] for _ in KEYS]
    kv.pull(KEYS, out=outs)
    kv.wait_all()
    for row in outs:
        for o in row:
            assert (o == 2 * num_devs).all()


@pytest.mark.parametrize('keys', [KEYS, STR_KEYS])
def test_updater(kv, keys):
    kv.init(keys, [ones()] * 3)
    seen = []

    def updater(key, recv, stored):
        seen.append(key)
        stored += recv

    kv._set_updater(updater)
    num_devs, num_push = 4, 4
    for _ in range(num_push):
        kv.push(keys, [[ones() for _ in range(num_devs)] for _ in keys])
    outs = [ones(0) for _ in keys]
    kv.pull(keys, out=outs)
    kv.wait_all()
    for o in outs:
        assert (o == 1 + num_devs * num_push).all()
    assert set(seen) == set(keys)  # str keys reach a str updater


def test_pushpull_reads_inputs_before_writing_outputs(kv):
    # 4 shared arrays of 2.0 are inputs and outputs of 3 keys: every output is 8, not 32
    kv.init(KEYS, [ones()] * 3)
    shared = [ones(2) for _ in range(4)]
    kv.pushpull(KEYS, [shared] * 3)
    kv.wait_all()
    for s in shared:
        assert (s == 8).all()


def test_pushpull_into_out(kv):
    kv.init(1, ones())
    out = ones(0)
    kv.pushpull(1, [ones(3), ones(4)], out=out)
    kv.wait_all()
    assert (out == 7).all()


def test_broadcast(kv):
    outs = [ones(0), ones(0)]
    kv.broadcast(4, ones(6), out=outs)
    kv.wait_all()
    for o in outs:
        assert (o == 6).all()
    with pytest.raises(pskv.KeyError, match='duplicate init'):
        kv.broadcast(4, ones(6), out=outs)


def test_properties(kv):
    assert kv.rank == 0 and kv.num_workers == 1
    kv.barrier()
    kv._barrier()


def test_type():
    assert pskv.create('local').type == 'local'
    assert pskv.create('Device').type == 'device'


def test_torch_tensors_shared_without_copy(kv):
    torch = pytest.importorskip('torch')
    w = torch.ones(SHAPE)
    kv.init('w', w)
    kv.push('w', [torch.full(SHAPE, 2.0), torch.full(SHAPE, 3.0)])
    out = torch.zeros(SHAPE)
    kv.pull('w', out=out)
    kv.wait_all()
    assert (out == 5).all()


def test_optimizer_and_states(kv):
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=0.1, momentum=0.9))
    kv.init(0, ones(1.0, (2,)))
    out = ones(0, (2,))
    kv.push(0, ones(1.0, (2,)))
    kv.pull(0, out=out)
    kv.wait_all()
    assert np.allclose(out, 0.9)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'states')
        kv.save_optimizer_states(path)
        kv.push(0, ones(1.0, (2,)))
        kv.pull(0, out=out)
        kv.wait_all()
        assert np.allclose(out, 0.71)
        kv2 = pskv.create(kv.type)
        kv2.set_optimizer(pskv.optimizer.create('sgd', learning_rate=0.1, momentum=0.9))
        kv2.init(0, ones(0.9, (2,)))
        kv2.load_optimizer_states(path)
        kv2.push(0, ones(1.0, (2,)))
        out2 = ones(0, (2,))
        kv2.pull(0, out=out2)
        kv2.wait_all()
        assert np.allclose(out2, out)


def test_lr_scheduler():
    kv = pskv.create('local')
    sched = pskv.lr_scheduler.FactorScheduler(step=1, factor=0.5)
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-1.0, lr_scheduler=sched))
    kv.init(0, ones(0, (1,)))
    out = ones(0, (1,))
    for _ in range(3):
        kv.push(0, ones(1, (1,)))
    kv.pull(0, out=out)
    kv.wait_all()
    assert out[0] == pytest.approx(1 + 0.5 + 0.25)


def test_gradient_compression_device_only():
    with pytest.raises(pskv.UsageError):
        pskv.create('local').set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv = pskv.create('device')
    with pytest.raises(pskv.InvalidArgument):
        kv.set_gradient_compression({'type': '2bit', 'threshold': -1})
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv.init(0, ones(0, (3,)))
    kv.push(0, np.array([-0.7, 0.2, 2.0], np.float32))
    out = ones(0, (3,))
    kv.pull(0, out=out)
    kv.wait_all()
    assert out.tolist() == [-0.5, 0, 0.5]


def test_errors(kv):
    out = ones(0)
    with pytest.raises(pskv.UsageError, match='needs out='):
        kv.pull(3, out=None)
    with pytest.raises(pskv.KeyError, match='has not been inited'):
        kv.pull(3, out=out)
    kv.init(3, ones())
    with pytest.raises(pskv.KeyError, match='duplicate init'):
        kv.init(3, ones())
    with pytest.raises(pskv.ShapeError):
        kv.push(3, ones(1, (2, 2)))
    with pytest.raises(pskv.ShapeError):
        kv.push(3, ones(1, dtype=np.float64))
    with pytest.raises(pskv.KeyError, match='Mixed key types'):
        kv.init('x', ones())
    with pytest.raises(AssertionError, match='inconsistent types'):
        kv.push([3, 'x'], [ones(), ones()])
    with pytest.raises(AssertionError, match='unexpected type'):
        kv.push(3.5, ones())
    with pytest.raises(pskv.UsageError):
        kv.save_optimizer_states('/tmp/nothing')
    with pytest.raises(pskv.InvalidArgument, match='valid types'):
        pskv.create('foo')
    with pytest.raises(TypeError):
        pskv.create(3)
    with pytest.raises(pskv.InvalidArgument):
        pskv.optimizer.create('sgdd')
    with pytest.raises(pskv.InvalidArgument, match='C-contiguous'):
        kv.push(3, np.ones((4, 8), np.float32)[:, ::2])


def test_updater_exception_reaches_caller(kv):
    kv.init(0, ones())

    def bad(key, recv, stored):
        raise ValueError('updater failed on %s' % key)

    kv.set_updater(bad)
    with pytest.raises(ValueError, match='updater failed on 0') as e:
        kv.push(0, ones())  # the call is complete when it returns: its failure is its own
    assert 'push of key 0 failed' in '\n'.join(getattr(e.value, '__notes__', []))
    with pytest.raises(ValueError, match='updater failed on 0'):
        with kv.batch() as b:  # in a batch: raised when the batch ends
            b.push(0, ones())
