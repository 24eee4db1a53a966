"""Habits from PyTorch and MXNet that land softly (issue 38, items 4 and 5): wrong
optimizer names refused at construction with what pskv calls them, torch.optim
optimizers translated, allreduce_grads() averaging as loss_reduction says, stale
gradients warned about, pskv's errors that are also the builtins, Python names in
messages, MXNet's float row ids, and local stores following their optimizer."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import pskv

HERE = os.path.dirname(os.path.abspath(__file__))


def _torch():
    torch = pytest.importorskip('torch')
    import pskv.torch  # noqa: F401
    return torch


# --- optimizer parameters checked at construction
@pytest.mark.parametrize('make, hint', [
    (lambda: pskv.optimizer.Adam(betas=(0.9, 0.98)), 'beta1= and beta2='),
    (lambda: pskv.optimizer.SGD(learning_rate=0.1, weight_decay=1e-4), 'wd='),
    (lambda: pskv.optimizer.Adam(eps=1e-6), 'epsilon='),
    (lambda: pskv.optimizer.RMSProp(alpha=0.99), 'rho='),
    (lambda: pskv.optimizer.SGD(nesterov=True), 'NAG'),
    (lambda: pskv.optimizer.SGD(momentun=0.9), 'did you mean momentum='),
    (lambda: pskv.optimizer.create('adam', betas=(0.9, 0.98)), 'beta1='),
])
def test_unknown_optimizer_parameters_are_refused_with_what_pskv_calls_them(make, hint):
    with pytest.raises(pskv.InvalidArgument) as e:
        make()
    assert hint in str(e.value)
    assert 'pskv.optimizer.params(' in str(e.value)


def test_known_names_and_aliases_still_construct():
    assert pskv.optimizer.SGD(lr=0.25, momentum=0.9, wd=1e-4).learning_rate == 0.25
    assert pskv.optimizer.RMSProp(gamma1=0.95).params()['gamma1'] == '0.95'
    opt = pskv.optimizer.Adam(beta1=0.8, epsilon=1e-6)
    opt.lr = 0.5  # MXNet's attribute
    assert opt.learning_rate == 0.5 and opt.lr == 0.5


# --- torch.optim optimizers
def test_torch_optim_translations():
    torch = _torch()
    p = [torch.nn.Parameter(torch.zeros(2))]
    cases = [
        (torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4), 'sgd',
         {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-4}),
        (torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), 'nag', {'momentum': 0.9}),
        (torch.optim.Adam(p, lr=1e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01), 'adam',
         {'beta1': 0.8, 'beta2': 0.99, 'epsilon': 1e-6, 'wd': 0.01}),
        (torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05), 'adamw', {'wd': 0.05}),
        (torch.optim.RMSprop(p, lr=0.01, alpha=0.95, centered=True, momentum=0.5), 'rmsprop',
         {'rho': 0.95, 'centered': 1.0, 'momentum': 0.5}),
        (torch.optim.Adagrad(p, lr=0.01, eps=1e-9), 'adagrad', {'epsilon': 1e-9}),
    ]
    for topt, name, want in cases:
        opt = pskv.optimizer.from_torch(topt)
        assert opt.name == name
        got = opt.params()
        for k, v in want.items():
            assert float(got[k]) == pytest.approx(v), (name, k, got)


def test_torch_optim_without_a_pskv_equivalent_says_what_to_do():
    torch = _torch()
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(pskv.InvalidArgument, match='allreduce_grads'):
        pskv.optimizer.from_torch(torch.optim.LBFGS(p))
    with pytest.raises(pskv.InvalidArgument, match='dampening'):
        pskv.optimizer.from_torch(torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1))
    with pytest.raises(pskv.InvalidArgument, match='amsgrad'):
        pskv.optimizer.from_torch(torch.optim.Adam(p, amsgrad=True))
    two = torch.optim.SGD([{'params': p}, {'params': [torch.nn.Parameter(torch.zeros(1))], 'lr': 0.5}], lr=0.1)
    with pytest.raises(pskv.InvalidArgument, match='lr_mult'):
        pskv.optimizer.from_torch(two)
    with pytest.raises(TypeError, match='pskv.optimizer.Optimizer'):
        pskv.create('local').set_optimizer(object())


def test_trainer_with_a_torch_optimizer_trains_as_torch_would():
    """SGD with momentum and weight decay: the Trainer, given torch's optimizer,
    moves the weights as torch.optim would (same rule), and says it translated."""
    torch = _torch()
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    model = torch.nn.Linear(3, 2)
    model.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    with pytest.warns(UserWarning, match='torch.optim.SGD'):
        tr = pskv.torch.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                                       weight_decay=0.01), pskv.create('local'),
                                loss_reduction='mean', update_on_kvstore=True)
    x = torch.randn(4, 3)
    for _ in range(3):
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        model(x).pow(2).mean().backward()
        tr.step()
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


# --- allreduce_grads() averages as loss_reduction says
def test_allreduce_grads_leaves_the_gradient_the_optimizer_uses():
    torch = _torch()
    w = torch.nn.Parameter(torch.zeros(1))
    tr = pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=1.0), pskv.create('local'),
                            loss_reduction='sum', global_batch_size=4, update_on_kvstore=False)
    (8 * w).sum().backward()
    tr.allreduce_grads()
    assert w.grad.item() == 2.0  # 8 / global_batch_size, not the sum 8
    tr.update()  # the scale is applied once
    assert w.item() == -2.0
    # torch.optim kept by the user sees the same gradient
    topt = torch.optim.SGD([w], lr=1.0)
    (8 * w).sum().backward()
    tr.allreduce_grads()
    topt.step()
    assert w.item() == -4.0


# --- stale gradients
def test_step_without_backward_warns_naming_the_parameters():
    torch = _torch()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    tr = pskv.torch.Trainer(model, pskv.optimizer.SGD(learning_rate=0.1), pskv.create('local'),
                            loss_reduction='mean')
    model(torch.ones(1, 2)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        tr.step()  # fresh gradients: no warning
    with pytest.warns(UserWarning, match=r"'0.weight', '0.bias', '1.weight', '1.bias'.*ignore_stale_grad"):
        tr.step()  # no backward since the last step
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        tr.step()  # the same parameters: warned once
        model[1](torch.ones(1, 2)).sum().backward()
        tr.step(ignore_stale_grad=True)  # on purpose: silent
    model[1](torch.ones(1, 2)).sum().backward()
    with pytest.warns(UserWarning, match=r"'0.weight', '0.bias'") as rec:
        tr.step()  # another set: warned
    assert '1.weight' not in str(rec[0].message)


# --- a failed construction leaves the store usable
def test_failed_trainer_construction_leaves_the_store_unmarked():
    torch = _torch()
    kv = pskv.create('local')
    w = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(pskv.InvalidArgument, match='momentum'):
        pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=0.1, momentum=1.5), kv,
                           loss_reduction='mean', update_on_kvstore=True)
    tr = pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=0.1), kv, loss_reduction='mean',
                            update_on_kvstore=True)
    w.grad = torch.ones(2)
    tr.step()
    assert w.detach().numpy().tolist() == pytest.approx([-0.1, -0.1])


# --- errors
def test_pskv_errors_are_also_the_builtins():
    assert issubclass(pskv.KeyError, KeyError) and issubclass(pskv.KeyError, pskv.Error)
    assert issubclass(pskv.TimeoutError, TimeoutError) and issubclass(pskv.TimeoutError, pskv.Error)
    assert issubclass(pskv.IOError, OSError) and issubclass(pskv.IOError, pskv.Error)
    kv = pskv.create('local')
    try:
        kv.push(7, np.ones(2, np.float32))
    except KeyError as e:  # the builtin's except clause catches it
        assert isinstance(e, pskv.KeyError)
        assert not str(e).startswith("'"), str(e)  # a sentence, not KeyError's repr
        msg = str(e)
    else:
        pytest.fail('push of an uninitialised key did not raise')
    assert 'call init first' in msg and 'Init' not in msg and 'Push' not in msg, msg
    kv.init(0, np.zeros(2, np.float32))
    kv.set_optimizer('sgd')
    with pytest.raises(OSError):
        kv.load_optimizer_states('/nonexistent/pskv/states')


def test_messages_name_the_python_calls():
    from pskv import _pskv
    assert _pskv.python_names('RowSparsePull of key 3: call Init first; SetOptimizer, PushPull, WaitAll') == \
        'row_sparse_pull of key 3: call init first; set_optimizer, pushpull, wait_all'
    # only whole C++ names: other words and qualified names stay
    assert _pskv.python_names('Initialise Pushes Engine::Push Node::Init Pull: Push.') == \
        'Initialise Pushes Engine::Push Node::Init pull: push.'
    kv = pskv.create('local')
    kv.init(0, np.zeros(2, np.float32))
    with pytest.raises(pskv.UsageError) as e:
        kv.row_sparse_pull(0, row_ids=np.array([0]))
    assert 'row_sparse_pull' in str(e.value) and 'RowSparsePull' not in str(e.value)


def test_pull_without_out_says_how_to_call_it():
    kv = pskv.create('local')
    kv.init(0, np.zeros(2, np.float32))
    with pytest.raises(pskv.UsageError, match=r'out='):
        kv.pull(0)


def test_pskv_kv_is_mxnets_mx_kv():
    import pskv as mx
    kv = mx.kv.create('local')
    assert isinstance(kv, mx.kv.KVStore)


# --- MXNet code unchanged
def test_float_row_ids_with_whole_values_are_row_numbers():
    kv = pskv.create('local')
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    kv.init('emb', pskv.row_sparse_array(table))
    got = kv.row_sparse_pull('emb', row_ids=np.array([2.0, 0.0], np.float32))  # mx.nd.array's dtype
    assert got.indices.tolist() == [0, 2]
    assert np.array_equal(got.data, table[[0, 2]])
    for bad in (0.5, -1.0, float('nan'), float('inf')):
        with pytest.raises(pskv.InvalidArgument, match=r'row id %s' % repr(bad).replace('.', r'\.')):
            kv.row_sparse_pull('emb', row_ids=np.array([1.0, bad], np.float32))


def test_local_store_follows_its_optimizer():
    """MXNet's updater read the live optimizer: a learning rate or multiplier set after
    set_optimizer applies from the next push, the momentum kept."""
    kv = pskv.create('local')
    kv.init(0, np.zeros(1, np.float32))
    opt = pskv.optimizer.SGD(learning_rate=1.0, momentum=0.5)
    kv.set_optimizer(opt)
    out = np.zeros(1, np.float32)
    kv.push(0, np.ones(1, np.float32))  # m = -1, w = -1
    opt.lr = 0.5
    kv.push(0, np.ones(1, np.float32))  # m = 0.5 * -1 - 0.5 = -1, w = -2
    opt.set_lr_mult({0: 4.0})
    kv.push(0, np.ones(1, np.float32))  # m = -0.5 - 2 = -2.5, w = -4.5
    kv.pull(0, out=out)
    assert out[0] == pytest.approx(-4.5)


def test_update_on_kvstore_none_follows_mxnet_update_on_kvstore():
    """update_on_kvstore=None on local/device stores with dense parameters, as MXNet's
    Gluon Trainer: a store given to it follows MXNET_UPDATE_ON_KVSTORE (default 1), read
    by the environment table when the store is created; a store type given by name with
    one device means no store in MXNet, hence local updates, whatever the variable."""
    _torch()
    code = ('import torch, pskv, pskv.torch\n'
            'w = torch.nn.Parameter(torch.zeros(2))\n'
            'for t in ("local", "device"):\n'
            '    tr = pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=0.1), pskv.create(t),\n'
            '                            loss_reduction="mean")\n'
            '    named = pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=0.1), t, loss_reduction="mean")\n'
            '    print(t, tr.update_on_kvstore, named.update_on_kvstore)\n')
    for env, want in ((None, 'True'), ('1', 'True'), ('0', 'False')):
        e = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        e.pop('MXNET_UPDATE_ON_KVSTORE', None)
        if env is not None:
            e['MXNET_UPDATE_ON_KVSTORE'] = env
        r = subprocess.run([sys.executable, '-c', code], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=120)
        out = r.stdout.decode()
        assert r.returncode == 0, out
        assert 'local %s False' % want in out and 'device %s False' % want in out, (env, out)


def test_dist_store_says_its_servers_keep_their_optimizer():
    """The servers of a dist store run the optimizer they received: a change after
    set_optimizer is not applied, and the worker is told so (once per change)."""
    build = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(HERE, '..', '..', 'build')))
    code = ('import warnings, numpy as np, pskv\n'
            'kv = pskv.create("dist_sync")\n'
            'kv.init(0, np.zeros(1, np.float32))\n'
            'opt = pskv.optimizer.SGD(learning_rate=1.0)\n'
            'kv.set_optimizer(opt)\n'
            'kv.push(0, np.ones(1, np.float32))\n'
            'opt.lr = 0.5\n'
            'with warnings.catch_warnings(record=True) as w:\n'
            '    warnings.simplefilter("always")\n'
            '    kv.push(0, np.ones(1, np.float32))\n'
            '    kv.push(0, np.ones(1, np.float32))\n'
            'assert len(w) == 1 and "set_optimizer" in str(w[0].message), [str(x.message) for x in w]\n'
            'out = np.zeros(1, np.float32)\n'
            'kv.pull(0, out=out)\n'
            'assert out[0] == -3.0, out\n'  # the servers' learning rate is still 1
            'print("dist optimizer ok")\n')
    env = dict(os.environ, PYTHONPATH=os.path.join(build, 'python'))
    r = subprocess.run([os.path.join(build, 'pskv-launch'), '-n', '1', '-s', '1', '--timeout', '90', '--',
                        '/usr/bin/python3', '-c', code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=120)
    out = r.stdout.decode()
    assert r.returncode == 0 and 'dist optimizer ok' in out, out
