"""pskv.torch.Trainer with one replica per device (issue 36, item 5; MXNet's
``ctx=[gpu(0), gpu(1)]``): ``Trainer([model0, model1, model2], ..., devices=[...])``.

The devices are pskv's simulated ones (PSKV_SIM_DEVICES=3, docs/gpu.md): the tensors are
CPU tensors and each replica's exchange is staged to its device and back, so a store
sums and updates on the devices exactly as with GPU tensors, with the copies counted.
Each scenario runs in a fresh interpreter (the device runtime is chosen once per
process): ``python3 test_torch_devices.py SCENARIO``.

What is shown:
* 3 replicas on 3 simulated devices train bit for bit as the same 3 replicas on the CPU
  (``local`` and ``device`` stores, update_on_kvstore on and off, allreduce_grads);
* k devices on b/k samples each give the weights of one device on the batch b (fp64:
  within 1e-12 relative; the sums' order differs, so not bitwise);
* after the first step (which places each key's weight on its home device, as MXNet's
  first push did), the ``device`` store moves no byte between host and devices beyond
  the Trainer's own staging (k*M in and k*M out per step); ``local`` stages the sum
  through the host;
* misuse is a typed error.
"""
import copy
import sys

import pytest

from test_devices import run_scenario as _run_scenario

torch = pytest.importorskip('torch') if __name__ != '__main__' else __import__('torch')

K = 3
DEVS = ['cuda:%d' % i for i in range(K)]
B = 12  # samples per step (b/k = 4 per device)
STEPS = 4


def run_scenario(name):
    # random stream delays (jitter): ordering bugs give wrong values
    return _run_scenario(name, sim=K, script=__file__, PSKV_SIM_JITTER='1')


# --- scenarios (run in the child process)

def _model(dtype=torch.float32):
    torch.manual_seed(7)
    m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(dtype)
    return m


def _data(dtype=torch.float32):
    g = torch.Generator().manual_seed(11)
    xs = [torch.randn(B, 6, generator=g, dtype=dtype) for _ in range(STEPS)]
    ys = [torch.randint(0, 3, (B,), generator=g) for _ in range(STEPS)]
    return xs, ys


def _train(store, devices, replicas, uok, allreduce=False, dtype=torch.float32, reduction='mean'):
    """Trains `replicas` models (each on its slice of the batch) and returns replica 0's
    weights; every replica must end equal."""
    import pskv
    import pskv.torch
    kv = pskv.create(store)
    base = _model(dtype)
    models = [copy.deepcopy(base) for _ in range(replicas)]
    opt = pskv.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3)
    kw = dict(loss_reduction=reduction) if reduction == 'mean' else dict(loss_reduction='sum', global_batch_size=B)
    trainer = pskv.torch.Trainer(models if devices else models[0], opt, kvstore=kv,
                                 update_on_kvstore=uok, devices=devices, **kw)
    assert trainer.update_on_kvstore == uok
    xs, ys = _data(dtype)
    for x, y in zip(xs, ys):
        parts = torch.tensor_split(torch.arange(B), replicas)
        for m, idx in zip(models, parts):
            loss = torch.nn.functional.cross_entropy(m(x[idx]), y[idx], reduction=reduction)
            loss.backward()
        if allreduce:
            trainer.allreduce_grads()
            trainer.update()
        else:
            trainer.step()
    w = [p.detach().clone() for p in models[0].parameters()]
    for m in models[1:]:
        for a, b in zip(w, m.parameters()):
            assert torch.equal(a, b), 'a replica differs from replica 0'
    kv.close()
    return w


def _same_bits(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def scenario_bitwise():
    import pskv
    for store in ('local', 'device'):
        for uok in (True, False):
            for allreduce in ((False, True) if not uok else (False,)):
                host = _train(store, ['cpu'] * K, K, uok, allreduce)
                on_devices = _train(store, DEVS, K, uok, allreduce)
                assert _same_bits(host, on_devices), (store, uok, allreduce)
    assert pskv.cuda.stats()['kernel_launches'] > 0
    print('SCENARIO OK')


def scenario_k_devices_like_one():
    # fp64, so that the different order of the sums stays far below the tolerance
    one = _train('device', ['cuda:0'], 1, True, dtype=torch.float64, reduction='sum')
    for reduction in ('sum', 'mean'):
        k = _train('device', DEVS, K, True, dtype=torch.float64, reduction=reduction)
        for a, b in zip(one, k):
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-14), (reduction, (a - b).abs().max())
    print('SCENARIO OK')


def scenario_copies():
    import pskv
    import pskv.torch
    nbytes = sum(p.numel() * 4 for p in _model().parameters())
    got = {}
    for store in ('device', 'local'):
        kv = pskv.create(store)
        models = [copy.deepcopy(_model()) for _ in range(K)]
        trainer = pskv.torch.Trainer(models, 'sgd', {'learning_rate': 0.1}, kvstore=kv, loss_reduction='mean',
                                     update_on_kvstore=True, devices=DEVS)
        xs, ys = _data()
        for step in range(2):  # the first push places each key's weight on its home device (MXNet's too)
            for m, idx in zip(models, torch.tensor_split(torch.arange(B), K)):
                torch.nn.functional.cross_entropy(m(xs[step][idx]), ys[step][idx]).backward()
            pskv.cuda.reset_stats()
            trainer.step()
        got[store] = pskv.cuda.stats()
        kv.close()
    dev, loc = got['device'], got['local']
    # the Trainer's staging: every replica's gradients in, its weights out
    assert dev['h2d_bytes'] == K * nbytes and dev['d2h_bytes'] == K * nbytes, (dev, nbytes)
    assert dev['kernel_launches'] > 0
    # local: besides, the k gradients to the host for the sum and the weights back out
    assert loc['d2h_bytes'] == 2 * K * nbytes and loc['h2d_bytes'] == 2 * K * nbytes, (loc, nbytes)
    print('SCENARIO OK')


def scenario_misuse():
    import pskv
    import pskv.torch
    kv = pskv.create('device')
    models = [_model() for _ in range(2)]
    for kwargs, err, words in (
            (dict(devices=DEVS), pskv.InvalidArgument, 'one replica'),
            (dict(devices=['cuda:0', 'cuda:%d' % K]), pskv.DeviceUnavailable, 'PSKV_SIM_DEVICES'),
            (dict(devices=['cuda:0', 'cuda:1'], push_in_backward=True), pskv.UsageError, 'push_in_backward'),
            (dict(devices=['cuda:0', 'tpu:1']), pskv.InvalidArgument, 'unknown device')):
        with pytest.raises(err, match=words):
            pskv.torch.Trainer(models, 'sgd', {'learning_rate': 0.1}, kvstore=kv, loss_reduction='mean', **kwargs)
    with pytest.raises(pskv.InvalidArgument, match='other parameters'):
        pskv.torch.Trainer([_model(), torch.nn.Linear(6, 3)], 'sgd', {'learning_rate': 0.1}, kvstore=kv,
                           loss_reduction='mean', devices=['cuda:0', 'cuda:1'])
    # a failed construction leaves the store free for the next Trainer
    t = pskv.torch.Trainer(models, 'sgd', {'learning_rate': 0.1}, kvstore=kv, loss_reduction='mean',
                           devices=['gpu(0)', 'cuda:1'])
    assert t.update_on_kvstore
    kv.close()
    print('SCENARIO OK')


# --- the tests (parent process)

def test_replicas_on_devices_train_as_on_the_cpu_bit_for_bit():
    run_scenario('bitwise')


def test_k_devices_on_b_over_k_samples_give_one_devices_weights():
    run_scenario('k_devices_like_one')


def test_the_device_store_moves_only_the_trainers_staging():
    run_scenario('copies')


def test_devices_misuse_is_a_typed_error():
    run_scenario('misuse')


if __name__ == '__main__':
    globals()['scenario_' + sys.argv[1]]()
