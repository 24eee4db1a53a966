"""Arrays on several devices from Python (issue 36, item 5): pskv.DeviceArray, the
stores taking device arrays in their value lists, __cuda_array_interface__ arrays of
other libraries, split_and_load, and pskv.cuda.

The devices are pskv's simulated ones (docs/gpu.md): the device runtime is chosen once
per process, and this pytest process shares its runtime with every other test file, so
each scenario runs in a fresh interpreter with PSKV_SIM_DEVICES=3 (this file, run as a
script: ``python3 test_devices.py SCENARIO``). A host read of simulated device memory
faults, so a binding that touched device memory from the host would crash the scenario.
"""
import gc
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

K = 3  # simulated devices
DEVS = ['cuda:%d' % i for i in range(K)]


def run_scenario(name, sim=K, script=__file__, **env):
    """Runs scenario `name` of `script` (this file by default) in a fresh interpreter
    with `sim` simulated devices and `env` set (the other device variables unset)."""
    e = dict(os.environ, **env)
    for var in ('PSKV_SIM_DEVICES', 'PSKV_SIM_JITTER', 'MXNET_ENABLE_GPU_P2P', 'PSKV_CUDA_FAKE_DEVICES'):
        if var not in env:
            e.pop(var, None)
    if sim:
        e['PSKV_SIM_DEVICES'] = str(sim)
    p = subprocess.run([sys.executable, os.path.abspath(script), name], env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode(errors='replace')
    assert p.returncode == 0, 'scenario %s failed (exit %d):\n%s' % (name, p.returncode, out)
    assert 'SCENARIO OK' in out, out
    return out


# --- scenarios (run in the child process)

def _grads(shape, seed, k=K):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(k)]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype == np.float32 else np.uint64)


def scenario_api():
    import pskv
    assert pskv.cuda.simulated() and not pskv.cuda.available()
    assert pskv.cuda.device_count() == K
    assert 'simulated' in pskv.cuda.status(), pskv.cuda.status()
    assert pskv.cuda.device_name(1) == 'simulated device 1', pskv.cuda.device_name(1)
    pskv.cuda.use_simulated_devices(K)  # what the runtime already is: accepted
    try:
        pskv.cuda.use_simulated_devices(K + 1)
        raise AssertionError('a second runtime was accepted')
    except pskv.UsageError:
        pass
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for spelling, name in (('cuda:1', 'cuda:1'), ('gpu(2)', 'cuda:2'), ('gpu:0', 'cuda:0'),
                           ('cpu_pinned', 'cpu_pinned'), ('cpu', 'cpu')):
        a = pskv.DeviceArray(x, spelling)
        assert a.device == name, (spelling, a.device)
        assert a.shape == (3, 4) and a.dtype == np.float32 and a.size == 12 and a.ndim == 2
        assert a.nbytes == 48
        back = a.asnumpy()
        assert np.array_equal(back, x) and not np.shares_memory(back, x)
        assert np.array_equal(a.numpy(), x)
    a = pskv.DeviceArray(x, 'cuda:1')
    assert repr(a) == "DeviceArray(shape=(3, 4), dtype=float32, device='cuda:1', simulated)", repr(a)
    assert a.__dlpack_device__() == (2, 1)
    cai = a.__cuda_array_interface__
    assert cai['shape'] == (3, 4) and cai['typestr'] == '<f4' and cai['version'] == 3
    assert cai['strides'] is None and cai['data'][1] is False and cai['data'][0] != 0
    assert not hasattr(pskv.DeviceArray(x, 'cpu_pinned'), '__cuda_array_interface__')
    b = a.to('cuda:2')
    assert b.device == 'cuda:2' and np.array_equal(b.asnumpy(), x)
    z = pskv.DeviceArray.zeros((2, 5), 'float64', 'cuda:0')
    assert z.dtype == np.float64 and np.array_equal(z.asnumpy(), np.zeros((2, 5)))
    assert pskv.DeviceArray([1, 2, 3], 'cuda:0', dtype='int32').asnumpy().tolist() == [1, 2, 3]
    # Device memory is never read implicitly: numpy conversion says what to do.
    try:
        np.asarray(a)
        raise AssertionError('implicit host read')
    except pskv.UsageError as e:
        assert 'asnumpy' in str(e), e
    # Copy counters: creating an array from host data is one h2d copy of its bytes.
    pskv.cuda.reset_stats()
    pskv.DeviceArray(x, 'cuda:0')
    s = pskv.cuda.stats()
    assert s['h2d_bytes'] == 48 and s['h2d_count'] == 1 and s['d2h_bytes'] == 0, s
    assert set(s) == {'d2h_bytes', 'd2h_count', 'h2d_bytes', 'h2d_count', 'd2d_bytes', 'd2d_count',
                      'peer_bytes', 'peer_count', 'kernel_launches'}


def scenario_sum_and_fill():
    import pskv
    shape = (17, 5)
    for store in ('local', 'device'):
        kv = pskv.create(store)
        kv.init(0, np.zeros(shape, np.float32))
        kv.init(1, np.zeros(shape, np.float32))
        for step in range(3):
            g = _grads(shape, step)
            expect = (g[0] + g[1]) + g[2]
            dg = [pskv.DeviceArray(gi, d) for gi, d in zip(g, DEVS)]
            kv.push(0, dg)
            outs = [pskv.DeviceArray.zeros(shape, 'float32', d) for d in DEVS]
            kv.pull(0, out=outs)
            for o, d in zip(outs, DEVS):
                assert o.device == d
                assert np.array_equal(o.asnumpy(), expect), (store, step, d)
            # pushpull of a list of keys, a list of devices per key, host and device mixed
            h = np.ones(shape, np.float32)
            out1 = [pskv.DeviceArray.zeros(shape, 'float32', d) for d in DEVS[:2]]
            host_out = np.zeros(shape, np.float32)
            kv.pushpull([0, 1], [dg, [h, pskv.DeviceArray(h, 'cuda:2')]], out=[outs, out1 + [host_out]])
            assert np.array_equal(outs[2].asnumpy(), expect), store
            for o in out1:
                assert np.array_equal(o.asnumpy(), 2 * h), store
            assert np.array_equal(host_out, 2 * h), store
        # a batch: temporaries stay alive while in flight
        with kv.batch() as b:
            b.push(0, [pskv.DeviceArray(np.full(shape, i, np.float32), d) for i, d in enumerate(DEVS)])
            gc.collect()
        out = pskv.DeviceArray.zeros(shape, 'float32', 'cuda:1')
        kv.pull(0, out=out)
        assert np.array_equal(out.asnumpy(), np.full(shape, 3, np.float32)), store
        # init and broadcast from a device, pinned host memory among the values
        kv.init(2, pskv.DeviceArray(np.full(shape, 2, np.float32), 'cuda:2'))
        pinned = pskv.DeviceArray.zeros(shape, 'float32', 'cpu_pinned')
        kv.pull(2, out=[pinned, out])
        assert np.array_equal(pinned.asnumpy(), np.full(shape, 2, np.float32)), store
        assert np.array_equal(out.asnumpy(), np.full(shape, 2, np.float32)), store
        kv.push(2, [pskv.DeviceArray(np.ones(shape, np.float32), 'cpu_pinned'), out])
        kv.pull(2, out=pinned)
        assert np.array_equal(pinned.asnumpy(), np.full(shape, 3, np.float32)), store
        kv.broadcast(3, pskv.DeviceArray(np.full(shape, 5, np.float32), 'cuda:1'), out=[out, pinned])
        assert np.array_equal(out.asnumpy(), np.full(shape, 5, np.float32)), store
        assert np.array_equal(pinned.asnumpy(), np.full(shape, 5, np.float32)), store
        kv.close()


def scenario_optimizer_bit_for_bit():
    import pskv
    shape = (64, 33)
    w0 = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    results = {}
    for store, on_devices in (('local', False), ('local', True), ('device', True)):
        kv = pskv.create(store)
        kv.set_optimizer(pskv.optimizer.SGD(learning_rate=0.05, momentum=0.9, wd=1e-3, rescale_grad=0.5))
        kv.init('w', w0)
        for step in range(5):
            g = _grads(shape, 100 + step)
            if on_devices:
                outs = [pskv.DeviceArray.zeros(shape, 'float32', d) for d in DEVS]
                kv.pushpull('w', [pskv.DeviceArray(gi, d) for gi, d in zip(g, DEVS)], out=outs)
                got = [o.asnumpy() for o in outs]
                for o in got[1:]:
                    assert np.array_equal(_bits(o), _bits(got[0])), store
                w = got[0]
            else:
                w = np.zeros(shape, np.float32)
                kv.pushpull('w', g, out=w)
            results.setdefault(step, []).append((store, on_devices, w))
        kv.close()
    for step, ws in results.items():
        ref = ws[0][2]
        assert not np.array_equal(ref, w0)
        for store, on_devices, w in ws[1:]:
            assert np.array_equal(_bits(w), _bits(ref)), (step, store, on_devices,
                                                          float(np.abs(w - ref).max()))


def scenario_copy_counters():
    import pskv
    shape = (256, 64)
    M = 256 * 64 * 4
    p2p = os.environ.get('MXNET_ENABLE_GPU_P2P', '1') != '0'
    for store in ('local', 'device'):
        kv = pskv.create(store)
        kv.init(0, np.zeros(shape, np.float32))
        kv.set_optimizer('sgd')
        grads = [pskv.DeviceArray(g, d) for g, d in zip(_grads(shape, 1), DEVS)]
        outs = [pskv.DeviceArray.zeros(shape, 'float32', d) for d in DEVS]
        kv.pushpull(0, grads, out=outs)  # the first step places the key
        for step in range(2):
            pskv.cuda.reset_stats()
            kv.pushpull(0, grads, out=outs)
            c = pskv.cuda.stats()
            if store == 'local':
                assert c['d2h_bytes'] == K * M and c['h2d_bytes'] == K * M, (store, c)
                assert c['peer_bytes'] == 0, (store, c)
            elif p2p:
                assert c['d2h_bytes'] == 0 and c['h2d_bytes'] == 0, (store, c)
                assert c['peer_bytes'] == 2 * (K - 1) * M, (store, c)
                assert c['kernel_launches'] >= 2, (store, c)
            else:
                assert c['peer_bytes'] == 0, (store, c)
                assert c['d2h_bytes'] == 2 * (K - 1) * M and c['h2d_bytes'] == 2 * (K - 1) * M, (store, c)
        kv.close()


class Foreign(object):
    """Another library's device array: elements [offset, offset+n) of a pskv array's
    memory, described by __cuda_array_interface__ (owner kept alive, as a library
    keeps its allocation)."""

    def __init__(self, owner, offset, n, typestr='<f4', strides=None, dlpack=True, stream=None, shape=None):
        self.owner = owner
        ptr = owner.__cuda_array_interface__['data'][0] + offset * owner.dtype.itemsize
        self.__cuda_array_interface__ = {'shape': shape or (n,), 'typestr': typestr, 'data': (ptr, False),
                                         'strides': strides, 'version': 3}
        if stream is not None:
            self.__cuda_array_interface__['stream'] = stream
        if dlpack:
            self.__dlpack_device__ = lambda: (2, int(owner.device.split(':')[1]))


def scenario_foreign_producer():
    import pskv
    base = np.arange(40, dtype=np.float32)
    owners = [pskv.DeviceArray(base * (i + 1), d) for i, d in enumerate(DEVS)]
    views = [Foreign(o, 10, 20) for o in owners]
    # wrap: zero copy (its pointer is the producer's), contents as the producer's
    w = pskv.DeviceArray.wrap(views[1])
    assert w.device == 'cuda:1' and w.shape == (20,)
    assert w.__cuda_array_interface__['data'][0] == views[1].__cuda_array_interface__['data'][0]
    assert np.array_equal(w.asnumpy(), 2 * base[10:30])
    for store in ('local', 'device'):
        kv = pskv.create(store)
        kv.init('x', np.zeros(20, np.float32))
        kv.push('x', views)  # foreign objects straight into the store
        out_owner = pskv.DeviceArray.zeros((40,), 'float32', 'cuda:2')
        kv.pull('x', out=Foreign(out_owner, 20, 20))  # and as an output
        got = out_owner.asnumpy()
        assert np.array_equal(got[20:], 6 * base[10:30]), store
        assert np.array_equal(got[:20], np.zeros(20, np.float32)), store  # nothing outside the view
        # kept alive while in flight, released after
        f = Foreign(pskv.DeviceArray(np.ones(20, np.float32), 'cuda:0'), 0, 20)
        ref = weakref.ref(f)
        with kv.batch() as b:
            b.push('x', [f, views[1]])
            del f
            gc.collect()
            assert ref() is not None, 'a foreign array in flight was released'
        kv._kv.pending()  # sweeps finished calls
        gc.collect()
        assert ref() is None, 'a foreign array was kept after its call finished'
        kv.close()
    # a device given explicitly when the object has no __dlpack_device__
    nd = Foreign(owners[2], 0, 4, dlpack=False)
    try:
        pskv.DeviceArray.wrap(nd)
        raise AssertionError('a device was guessed')
    except pskv.InvalidArgument as e:
        assert "device='cuda:N'" in str(e), e
    assert np.array_equal(pskv.DeviceArray.wrap(nd, device='cuda:2').asnumpy(), 3 * base[:4])
    # the producer's stream becomes the ready stream: pskv waits on it (the simulator
    # knows no stream 12345 and says so; a GPU would fail the same way, differently worded)
    bogus = pskv.DeviceArray.wrap(Foreign(owners[0], 0, 4, stream=12345))
    try:
        bogus.asnumpy()
        raise AssertionError('the stream was ignored')
    except pskv.DeviceError as e:
        assert 'stream' in str(e), e


def scenario_split_and_load():
    import pskv
    x = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    parts = pskv.data.split_and_load(x, DEVS)
    assert [p.shape for p in parts] == [(4, 3), (3, 3), (3, 3)]
    assert [p.device for p in parts] == DEVS
    assert np.array_equal(np.concatenate([p.asnumpy() for p in parts]), x)
    parts = pskv.data.split_and_load(x[:8], ['gpu(0)', 'gpu:2'], work_load_list=[3, 1])
    assert [p.shape for p in parts] == [(6, 3), (2, 3)] and [p.device for p in parts] == ['cuda:0', 'cuda:2']
    assert np.array_equal(parts[1].asnumpy(), x[6:8])
    parts = pskv.data.split_and_load(x, ['cpu', 'cuda:1'])
    assert isinstance(parts[0], np.ndarray) and np.shares_memory(parts[0], x) and parts[0].shape == (5, 3)
    assert parts[1].shape == (5, 3)
    # the same placement as the existing helper, for any b and k
    for b in range(1, 11):
        for k in range(1, 4):
            if b >= k:
                assert [p.shape[0] for p in pskv.data.split_and_load(x[:b], DEVS[:k])] == \
                    [hi - lo for lo, hi in pskv.data.split_batch(b, k, False)]
    try:
        pskv.data.split_and_load(x, DEVS, work_load_list=[1, 1])
        raise AssertionError('a work_load_list of the wrong length was accepted')
    except pskv.InvalidArgument:
        pass


def scenario_k_devices_equal_one():
    """Linear least squares, plain SGD: k devices with batch b (b/k each, gradients
    summed by the store) against one device with batch b. The sums differ in order
    (k partial sums added vs one), so float32 results agree to a relative 1e-5, not
    bit for bit."""
    import pskv
    rng = np.random.default_rng(3)
    b, d = 24, 6
    X = rng.standard_normal((b, d)).astype(np.float32)
    y = (X @ rng.standard_normal(d).astype(np.float32) + 0.1 * rng.standard_normal(b)).astype(np.float32)

    def train(devices, steps=20):
        kv = pskv.create('device')
        kv.set_optimizer(pskv.optimizer.SGD(learning_rate=0.1))
        kv.init(0, np.zeros(d, np.float32))
        ws = [pskv.DeviceArray.zeros((d,), 'float32', dev) for dev in devices]
        kv.pull(0, out=ws)
        xs = pskv.data.split_and_load(X, devices)
        ys = pskv.data.split_and_load(y, devices)
        for _ in range(steps):
            grads = []
            for w, xi, yi in zip(ws, xs, ys):  # each device's gradient of 1/(2b)|Xw - y|^2
                xh, yh = xi.asnumpy(), yi.asnumpy()
                g = (xh.T @ (xh @ w.asnumpy() - yh) / b).astype(np.float32)
                grads.append(pskv.DeviceArray(g, w.device))
            kv.pushpull(0, grads, out=ws)
        out = [w.asnumpy() for w in ws]
        kv.close()
        for o in out[1:]:
            assert np.array_equal(o, out[0])
        return out[0]

    one = train(['cuda:0'])
    many = train(DEVS)
    assert np.abs(one).max() > 0.1
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=0)
    lstsq = np.linalg.lstsq(X.astype(np.float64), y.astype(np.float64), rcond=None)[0]
    assert np.abs(train(DEVS, 400) - lstsq).max() < 1e-3  # and it does learn


def scenario_errors():
    import pskv
    x = np.zeros((4, 2), np.float32)
    for bad in ('cuda:3', 'gpu(7)'):
        try:
            pskv.DeviceArray(x, bad)
            raise AssertionError('device %s accepted' % bad)
        except pskv.DeviceUnavailable as e:
            assert 'does not exist' in str(e) and '3 simulated devices' in str(e), e
            assert isinstance(e, pskv.UsageError)
    try:
        pskv.DeviceArray(x, 'tpu:0')
        raise AssertionError('an unknown device accepted')
    except pskv.InvalidArgument as e:
        assert 'cuda:N' in str(e), e
    owner = pskv.DeviceArray(np.zeros(16, np.float32), 'cuda:1')
    try:
        pskv.DeviceArray.wrap(Foreign(owner, 0, 4, dlpack=False), device='cuda:5')
        raise AssertionError('device out of range accepted')
    except pskv.DeviceUnavailable as e:
        assert 'cuda:5' in str(e), e
    kv = pskv.create('device')
    kv.init(0, x)
    try:
        kv.push(0, [pskv.DeviceArray(np.zeros((2, 4), np.float32), d) for d in DEVS[:2]])
        raise AssertionError('a device array of the wrong shape was accepted')
    except pskv.ShapeError as e:
        assert '4' in str(e) and '2' in str(e), e
    try:
        kv.pull(0, out=[pskv.DeviceArray.zeros((3, 2), 'float32', 'cuda:0')])
        raise AssertionError('an output of the wrong shape was accepted')
    except pskv.ShapeError:
        pass
    cases = [
        (dict(strides=(4, 16), shape=(4, 2)), 'contiguous'),   # a transposed view
        (dict(typestr='<c8'), 'typestr'),
        (dict(typestr='>f4'), 'typestr'),                      # big-endian
        (dict(stream=0), 'stream 0'),
    ]
    for kw, words in cases:
        f = Foreign(owner, 0, 8, **kw)
        for call in (lambda: pskv.DeviceArray.wrap(f), lambda: kv.push(0, f)):
            try:
                call()
                raise AssertionError('accepted: %s' % kw)
            except pskv.InvalidArgument as e:
                assert words in str(e), (kw, e)
    # C-contiguous strides given explicitly (torch gives them) are fine
    ok = pskv.DeviceArray.wrap(Foreign(owner, 0, 8, strides=(8, 4), shape=(4, 2)))
    assert ok.shape == (4, 2)
    try:
        kv.push(0, object())
        raise AssertionError('an object accepted')
    except TypeError as e:
        assert '__cuda_array_interface__' in str(e), e
    kv.close()


def scenario_no_devices():
    """Without PSKV_SIM_DEVICES (and no GPU) there is no device, and no fallback."""
    import pskv
    if pskv.cuda.device_count() > 0 and not pskv.cuda.simulated():
        print('a GPU is here: nothing to check')
    else:
        assert not pskv.cuda.simulated() and not pskv.cuda.available() and pskv.cuda.device_count() == 0
        try:
            pskv.DeviceArray(np.zeros(3, np.float32), 'cuda:0')
            raise AssertionError('a device array without a device')
        except pskv.DeviceUnavailable as e:
            assert 'PSKV_SIM_DEVICES' in str(e), e
    # host arrays work as before
    a = pskv.DeviceArray(np.ones(3, np.float32), 'cpu')
    assert a.device == 'cpu' and a.asnumpy().tolist() == [1, 1, 1]


# --- the tests (this process)

@pytest.mark.parametrize('name', ['api', 'sum_and_fill', 'optimizer_bit_for_bit', 'foreign_producer',
                                  'split_and_load', 'k_devices_equal_one', 'errors'])
def test_simulated(name):
    run_scenario(name)


@pytest.mark.parametrize('p2p', ['1', '0'])
def test_copy_counters_follow_mxnets_contract(p2p):
    run_scenario('copy_counters', MXNET_ENABLE_GPU_P2P=p2p)


def test_with_random_stream_delays():
    """The store scenarios with the simulator's random delays (an ordering bug in the
    binding shows as a wrong value)."""
    run_scenario('sum_and_fill', PSKV_SIM_JITTER='7')
    run_scenario('foreign_producer', PSKV_SIM_JITTER='11')


def test_no_devices_without_the_variable():
    run_scenario('no_devices', sim=0)


def test_cuda_module_is_documented_and_stubbed():
    import test_packaging
    test_packaging.test_every_public_function_and_class_has_a_numpy_style_docstring('pskv.cuda')
    test_packaging.test_stubs_cover_the_public_api('pskv.cuda')
    test_packaging.test_stubs_cover_the_public_api('pskv.data')


if __name__ == '__main__':
    globals()['scenario_' + sys.argv[1]]()
    print('SCENARIO OK')
