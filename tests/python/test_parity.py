"""Issue 22 item 4: MXNet parity gaps — per-key lr/wd multipliers (worker and
servers), the Trainer's update_on_kvstore decision with sparse parameters, row_sparse
values in push/pull/init lists, is_capable."""
import os
import subprocess
import textwrap
import warnings

import numpy as np
import pytest

import pskv
from conftest import BUILD


def zeros(n=3):
    return np.zeros(n, np.float32)


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_lr_and_wd_multipliers_on_a_local_store(kind):
    kv = pskv.create(kind)
    kv.init([0, 1, 2], [np.ones(3, np.float32)] * 3)
    opt = pskv.optimizer.SGD(learning_rate=0.1, wd=0.5)
    opt.set_lr_mult({0: 2.0})
    opt.set_wd_mult({1: 0.0})
    assert opt._get_lr(0) == pytest.approx(0.2) and opt._get_lr(1) == pytest.approx(0.1)
    assert opt._get_wd(1) == 0 and opt._get_wd(2) == pytest.approx(0.5)
    kv.set_optimizer(opt)
    kv.push([0, 1, 2], [np.ones(3, np.float32)] * 3)
    w = [zeros(), zeros(), zeros()]
    kv.pull([0, 1, 2], out=w)
    # w <- w - lr * mult_lr * (g + wd * mult_wd * w)
    np.testing.assert_allclose(w[0], 1 - 0.2 * (1 + 0.5), rtol=1e-6)
    np.testing.assert_allclose(w[1], 1 - 0.1 * 1, rtol=1e-6)
    np.testing.assert_allclose(w[2], 1 - 0.1 * (1 + 0.5), rtol=1e-6)


def test_multipliers_by_name_string_keys_and_param_idx2name():
    kv = pskv.create('local')
    kv.init(['fc_weight', 'fc_bias'], [np.ones(2, np.float32)] * 2)
    opt = pskv.optimizer.SGD(learning_rate=0.1)
    opt.set_lr_mult({'fc_bias': 3.0})
    kv.set_optimizer(opt)
    kv.push(['fc_weight', 'fc_bias'], [np.ones(2, np.float32)] * 2)
    w, b = zeros(2), zeros(2)
    kv.pull(['fc_weight', 'fc_bias'], out=[w, b])
    np.testing.assert_allclose(w, 0.9, rtol=1e-6)
    np.testing.assert_allclose(b, 0.7, rtol=1e-6)
    # MXNet: with names known, set_wd_mult zeroes the decay of names ending neither in
    # _weight nor _gamma (biases, beta).
    named = pskv.optimizer.SGD(learning_rate=0.1, wd=0.1, param_idx2name={0: 'fc_weight', 1: 'fc_bias'})
    named.set_wd_mult({})
    assert named._get_wd(0) == pytest.approx(0.1) and named._get_wd(1) == 0
    named.set_lr_mult({'fc_weight': 2.0})
    assert named._get_lr(0) == pytest.approx(0.2)
    assert 'lr_mult' in named.params() and named.params()['lr_mult'] == '0:2.0'


def test_a_multiplier_for_no_key_is_an_error_not_ignored():
    kv = pskv.create('local')
    kv.init('w', np.ones(2, np.float32))
    opt = pskv.optimizer.SGD()
    opt.set_lr_mult({'typo': 2.0})
    with pytest.raises(pskv.UsageError, match="lr_mult of 'typo'"):
        kv.set_optimizer(opt)
    with pytest.raises(pskv.InvalidArgument, match='wd_mult'):
        opt.set_wd_mult({0: -1.0})
    with pytest.raises(pskv.InvalidArgument, match='set_lr_mult'):
        pskv.optimizer.SGD(lr_mult={0: 2.0})


def test_multipliers_apply_on_the_servers(tmp_path):
    script = tmp_path / 'w.py'
    script.write_text(textwrap.dedent('''
        import numpy as np, pskv
        kv = pskv.create('dist_sync')
        kv.init([0, 1], [np.zeros(4, np.float32)] * 2)
        opt = pskv.optimizer.SGD(learning_rate=0.1)
        opt.set_lr_mult({1: 4.0})
        kv.set_optimizer(opt)
        kv.push([0, 1], [np.ones(4, np.float32)] * 2)
        a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
        kv.pull([0, 1], out=[a, b])
        n = kv.num_workers
        assert np.allclose(a, -0.1 * n) and np.allclose(b, -0.4 * n), (a, b)
        print('worker %d: multipliers passed' % kv.rank, flush=True)
        kv.close()
    '''))
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    p = subprocess.run([os.path.join(BUILD, 'pskv-launch'), '-n', '2', '-s', '2', '--timeout', '120', '--',
                        '/usr/bin/python3', str(script)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=180)
    out = p.stdout.decode()
    assert p.returncode == 0 and out.count('multipliers passed') == 2, out


@pytest.mark.parametrize('kind', ['local', 'device'])
def test_trainer_with_sparse_parameters_decides_update_on_kvstore(kind):
    torch = pytest.importorskip('torch')
    import pskv.torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 3, sparse=True), torch.nn.Linear(3, 2))
    for kv in (kind, pskv.create(kind)):  # a type string (the Trainer's own store) or a store
        tr = pskv.torch.Trainer(model, pskv.optimizer.SGD(learning_rate=0.1), kv, update_on_kvstore=None,
                                loss_reduction='mean')
        assert tr.update_on_kvstore is True  # MXNet's _create_sparse_kvstore
        before = model[0].weight.detach().clone()
        model(torch.tensor([1, 2])).sum().backward()
        tr.step()
        changed = (model[0].weight.detach() != before).any(dim=1).nonzero().flatten().tolist()
        assert changed == [1, 2]
    # A bare parameter list hides which gradients are sparse: a clear error, not a crash.
    tr = pskv.torch.Trainer(model.parameters(), pskv.optimizer.SGD(learning_rate=0.1), kind,
                            update_on_kvstore=True, loss_reduction='mean')
    model(torch.tensor([1])).sum().backward()
    with pytest.raises(pskv.UsageError, match='sparse_params'):
        tr.step()


def test_row_sparse_values_in_lists_and_pull_outputs():
    kv = pskv.create('local')
    rsp = pskv.row_sparse_array(np.zeros((4, 2), np.float32))
    kv.init(['d', 's'], [zeros(2), rsp])  # a row_sparse value in an init list
    kv.push(['d', 's'], [np.ones(2, np.float32),
                         pskv.RowSparseArray(np.full((1, 2), 5, np.float32), [2], (4, 2))])
    d = zeros(2)
    out_s = pskv.RowSparseArray(np.zeros((0, 2), np.float32), [], (4, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        kv.pull(['d', 's'], out=[d, out_s])  # MXNet's ignore_sparse=True: the sparse output is skipped
    assert d.tolist() == [1, 1] and len(out_s.indices) == 0
    assert any('row_sparse outputs ignored' in str(w.message) for w in caught)
    with pytest.raises(pskv.UsageError, match='row_sparse_pull'):
        kv.pull(['d', 's'], out=[d, out_s], ignore_sparse=False)
    got = kv.row_sparse_pull('s', row_ids=np.array([2, 3]))
    assert got.data.tolist() == [[5, 5], [0, 0]]
    with pytest.raises(pskv.UsageError, match='pushpull'):
        kv.pushpull('s', pskv.RowSparseArray(np.ones((1, 2), np.float32), [0], (4, 2)))
    with pytest.raises(pskv.InvalidArgument, match='mix dense and row_sparse'):
        kv.push('s', [np.ones((4, 2), np.float32), pskv.RowSparseArray(np.ones((1, 2), np.float32), [0], (4, 2))])


def test_is_capable():
    for kind in ('local', 'device'):
        kv = pskv.create(kind)
        assert kv.is_capable('optimizer') and kv.is_capable(pskv.KVStore.OPTIMIZER)
        with pytest.raises(ValueError, match='Unknown capability: teleport'):
            kv.is_capable('teleport')


def test_multiplier_rules_follow_mxnet():
    # With names known, a bias has no weight decay from the start (MXNet's constructor
    # calls set_wd_mult({})), and an index's own entry wins over its name's.
    opt = pskv.optimizer.SGD(learning_rate=0.1, wd=0.5, param_idx2name={0: 'fc_weight', 1: 'fc_bias'})
    assert opt._get_wd(1) == 0 and opt._get_wd(0) == pytest.approx(0.5)
    assert opt.params()['wd_mult'] == '1:0.0'
    opt.set_lr_mult({0: 2.0, 'fc_weight': 3.0})
    assert opt._get_lr(0) == pytest.approx(0.2)
    assert opt.params()['lr_mult'] == '0:2.0'
    opt.set_lr_mult({'fc_weight': 3.0, 0: 2.0})  # whatever the order of the dict
    assert opt.params()['lr_mult'] == '0:2.0'


def test_a_tuple_of_outputs_of_a_row_sparse_key_is_not_taken_for_rows():
    kv = pskv.create('local')
    kv.init('s', pskv.row_sparse_array(np.ones((2, 2), np.float32)))
    a, b = np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32)
    with pytest.raises(pskv.UsageError, match='row_sparse'):
        kv.pull('s', out=(a, b))  # two dense outputs, as a list would be: a dense pull of a sparse key
