"""pskv.torch.Trainer in one process ('local' store): gradient accumulation,
clipping, overlap with backward, frozen parameters, loss scaling, Gluon's Trainer
surface. Every test runs with update_on_kvstore True and False."""
import os

import numpy as np
import pytest

torch = pytest.importorskip('torch')
import pskv  # noqa: E402
import pskv.torch  # noqa: E402

UOK = [True, False]


def scalar(v=0.0):
    return torch.nn.Parameter(torch.full((1,), float(v)))


def trainer(params, uok, lr=1.0, kv='local', **kw):
    kw.setdefault('global_batch_size', 1)
    return pskv.torch.Trainer(params, pskv.optimizer.SGD(learning_rate=lr), pskv.create(kv) if isinstance(kv, str)
                              else kv, update_on_kvstore=uok, **kw)


@pytest.mark.parametrize('uok', UOK)
def test_gradient_accumulation_uses_every_micro_batch(uok):
    w = scalar()
    tr = trainer([w], uok)
    w.sum().backward()
    w.sum().backward()
    tr.step()
    assert w.item() == -2.0  # the old hook pushed the first micro-batch only: -1
    assert w.grad is None  # step() consumed the gradients


@pytest.mark.parametrize('uok', UOK)
def test_clipping_after_backward_applies(uok):
    w = scalar()
    tr = trainer([w], uok)
    (10 * w).sum().backward()
    torch.nn.utils.clip_grad_norm_([w], 1.0)
    tr.step()
    assert w.item() == pytest.approx(-1.0)


@pytest.mark.parametrize('uok', UOK)
def test_push_in_backward_no_sync_and_second_backward_error(uok):
    w = scalar()
    tr = trainer([w], uok, push_in_backward=True)
    with tr.no_sync():
        w.sum().backward()
        (2 * w).sum().backward()
    (3 * w).sum().backward()  # pushes the accumulated 1+2+3 from the hook
    tr.step()
    assert w.item() == -6.0
    w.sum().backward()
    with pytest.raises(pskv.UsageError, match='second backward'):
        w.sum().backward()
    tr.step()
    assert w.item() == -7.0


@pytest.mark.parametrize('uok', UOK)
def test_push_in_backward_parameter_used_twice(uok):
    w = scalar(1.0)
    tr = trainer([w], uok, push_in_backward=True)
    (w * w).sum().backward()  # dL/dw = 2w, one hook call
    tr.step()
    assert w.item() == -1.0


def test_push_in_backward_needs_the_scale():
    with pytest.raises(pskv.UsageError, match='loss scale'):
        pskv.torch.Trainer([scalar()], 'sgd', pskv.create('local'), push_in_backward=True)


@pytest.mark.parametrize('uok', UOK)
def test_frozen_parameters_are_skipped(uok):
    model = torch.nn.Linear(2, 1)
    model.bias.requires_grad_(False)
    b0 = model.bias.detach().clone()
    tr = trainer(model, uok, push_in_backward=True)  # torch refuses hooks on frozen tensors
    model(torch.ones(1, 2)).sum().backward()
    tr.step()
    assert torch.equal(model.bias.detach(), b0)
    tr2 = trainer(model, uok)
    model(torch.ones(1, 2)).sum().backward()
    tr2.step()
    assert torch.equal(model.bias.detach(), b0)


@pytest.mark.parametrize('uok', UOK)
def test_loss_scaling_conventions(uok):
    # mean: one worker -> gradient used as is
    w = scalar()
    tr = trainer([w], uok, global_batch_size=None, loss_reduction='mean')
    (4 * w).sum().backward()
    tr.step()
    assert w.item() == -4.0
    # sum + global batch 4
    w = scalar()
    tr = trainer([w], uok, global_batch_size=4)
    (4 * w).sum().backward()
    tr.step()
    assert w.item() == -1.0
    # Gluon: step(batch_size), no scale at construction
    w = scalar()
    tr = trainer([w], uok, global_batch_size=None)
    (4 * w).sum().backward()
    with pytest.raises(pskv.UsageError, match='loss scale is unknown'):
        tr.step()
    tr.step(2)
    assert w.item() == -2.0
    (4 * w).sum().backward()
    tr.step(4)
    assert w.item() == -3.0
    # step(batch_size) overrides global_batch_size for that step
    w = scalar()
    tr = trainer([w], uok, global_batch_size=4)
    (4 * w).sum().backward()
    tr.step(8)
    assert w.item() == -0.5
    # mean + step(batch_size) is ambiguous
    tr = trainer([scalar()], uok, global_batch_size=None, loss_reduction='mean')
    with pytest.raises(pskv.UsageError, match='already means'):
        tr.step(4)


@pytest.mark.parametrize('uok', UOK)
def test_rescale_grad_is_multiplied(uok):
    w = scalar()
    tr = pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=1.0, rescale_grad=0.5), pskv.create('local'),
                            global_batch_size=2, update_on_kvstore=uok)
    (4 * w).sum().backward()
    tr.step()
    assert w.item() == -1.0  # 4 * 0.5 / 2 (the old Trainer replaced 0.5 by 1/2: -2)
    assert float(tr.optimizer_config['rescale_grad']) == 0.25


def test_gluon_constructor_order_and_auto_update_on_kvstore(monkeypatch):
    w = scalar()
    tr = pskv.torch.Trainer([w], 'sgd', {'learning_rate': 0.5}, global_batch_size=1, kvstore='local')
    assert tr.learning_rate == 0.5
    assert tr.update_on_kvstore is False  # one device, not dist: MXNet uses no store
    assert pskv.torch.Trainer([scalar()], 'sgd', kvstore=pskv.create('local'),
                              global_batch_size=1).update_on_kvstore is True
    monkeypatch.setenv('MXNET_UPDATE_ON_KVSTORE', '0')
    assert pskv.torch.Trainer([scalar()], 'sgd', kvstore=pskv.create('local'),
                              global_batch_size=1).update_on_kvstore is False
    (w * 2).sum().backward()
    tr.step()
    assert w.item() == -1.0


@pytest.mark.parametrize('uok', UOK)
def test_set_learning_rate_keeps_momentum(uok):
    w = scalar()
    tr = pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=1.0, momentum=0.5), pskv.create('local'),
                            global_batch_size=1, update_on_kvstore=uok)
    w.sum().backward()
    tr.step()  # m = -1, w = -1
    assert tr.learning_rate == 1.0
    tr.set_learning_rate(0.1)
    assert tr.learning_rate == 0.1
    w.sum().backward()
    tr.step()  # m = 0.5*-1 - 0.1*1 = -0.6 (fresh states would give -0.1)
    assert w.item() == pytest.approx(-1.6)


@pytest.mark.parametrize('uok', UOK)
def test_save_and_load_states_restore_the_optimizer(uok, tmp_path):
    path = str(tmp_path / 'states')
    w = scalar()
    tr = pskv.torch.Trainer([w], pskv.optimizer.SGD(learning_rate=1.0, momentum=0.5), pskv.create('local'),
                            global_batch_size=1, update_on_kvstore=uok)
    w.sum().backward()
    tr.step()
    tr.set_learning_rate(0.1)
    tr.save_states(path)
    # a fresh trainer with another learning rate: loading restores lr 0.1 and the momentum
    w2 = scalar(-1.0)
    tr2 = pskv.torch.Trainer([w2], pskv.optimizer.SGD(learning_rate=7.0, momentum=0.5), pskv.create('local'),
                             global_batch_size=1, update_on_kvstore=uok)
    tr2.load_states(path)
    assert tr2.learning_rate == pytest.approx(0.1)
    w2.sum().backward()
    tr2.step()
    assert w2.item() == pytest.approx(-1.6)


def test_kvstore_load_optimizer_states_restores_dumped_optimizer(tmp_path):
    path = str(tmp_path / 's')
    kv = pskv.create('local')
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=0.1))
    kv.init(0, np.zeros(1, np.float32))
    kv.save_optimizer_states(path, dump_optimizer=True)
    for dump, want in [(True, -0.1), (False, -5.0)]:
        kv2 = pskv.create('local')
        kv2.set_optimizer(pskv.optimizer.SGD(learning_rate=5.0))
        kv2.init(0, np.zeros(1, np.float32))
        if not dump:
            kv.save_optimizer_states(path)
        kv2.load_optimizer_states(path)
        kv2.push(0, np.ones(1, np.float32))
        out = np.zeros(1, np.float32)
        kv2.pull(0, out=out)
        kv2.wait_all()
        assert out[0] == pytest.approx(want)


def test_allreduce_grads_and_update():
    w = scalar()
    tr = trainer([w], False)
    (10 * w).sum().backward()
    tr.allreduce_grads()
    torch.nn.utils.clip_grad_norm_([w], 2.0)
    tr.update()
    assert w.item() == pytest.approx(-2.0)
    with pytest.raises(pskv.UsageError, match='allreduce_grads'):
        tr.update()
    tr_uok = trainer([scalar()], True)
    with pytest.raises(pskv.UsageError, match='update_on_kvstore=False'):
        tr_uok.allreduce_grads()
    with pytest.raises(pskv.UsageError, match='step'):
        tr_uok.update()


@pytest.mark.parametrize('uok', UOK)
def test_lr_mult_and_wd_mult(uok):
    a, b, c = scalar(1.0), scalar(1.0), scalar(1.0)
    b.lr_mult = 0.5  # Gluon's habit: an attribute of the parameter
    params = [{'params': [a]}, {'params': [b]}, {'params': [c], 'wd_mult': 0.0}]
    tr = pskv.torch.Trainer(params, pskv.optimizer.SGD(learning_rate=1.0, wd=0.5), pskv.create('local'),
                            global_batch_size=1, update_on_kvstore=uok)
    (a + b + c).sum().backward()
    tr.step()
    assert a.item() == pytest.approx(1 - (1 + 0.5))
    assert b.item() == pytest.approx(1 - 0.5 * (1 + 0.5))
    assert c.item() == pytest.approx(1 - 1)


def test_weights_loaded_after_a_step_reset_a_local_store():
    model = torch.nn.Linear(2, 1)
    tr = trainer(model, True, lr=0.1)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model(torch.ones(1, 2)).sum().backward()
    tr.step()
    model.load_state_dict(saved)  # the store still holds the stepped weights
    model(torch.ones(1, 2)).sum().backward()
    tr.step()
    # one step from the loaded weights (the old Trainer continued from the store's)
    assert torch.allclose(model.weight.detach(), saved['weight'] - 0.1)
    assert torch.allclose(model.bias.detach(), saved['bias'] - 0.1)


def test_two_trainers_share_a_store():
    kv = pskv.create('local')
    g, d = scalar(), scalar()
    tg = pskv.torch.Trainer([g], pskv.optimizer.SGD(learning_rate=1.0), kv, global_batch_size=1,
                            update_on_kvstore=False)
    td = pskv.torch.Trainer([d], pskv.optimizer.SGD(learning_rate=0.1), kv, global_batch_size=1,
                            update_on_kvstore=False)
    (g + d).sum().backward()
    td.step()
    tg.step()
    assert (g.item(), d.item()) == (-1.0, pytest.approx(-0.1))
    # a store runs one optimizer on all its keys: no sharing with update_on_kvstore, either order
    with pytest.raises(pskv.UsageError, match='another Trainer'):
        pskv.torch.Trainer([scalar()], 'sgd', kv, global_batch_size=1, update_on_kvstore=True)
    kv2 = pskv.create('local')
    tu = pskv.torch.Trainer([scalar()], 'sgd', kv2, global_batch_size=1, update_on_kvstore=True)
    assert tu.update_on_kvstore
    for uok in (True, False):
        with pytest.raises(pskv.UsageError, match='another Trainer'):
            pskv.torch.Trainer([scalar()], 'sgd', kv2, global_batch_size=1, update_on_kvstore=uok)


def test_argument_errors():
    with pytest.raises(pskv.InvalidArgument, match="'mean' or 'sum'"):
        pskv.torch.Trainer([scalar()], 'sgd', pskv.create('local'), loss_reduction='avg')
    with pytest.raises(pskv.InvalidArgument, match='global_batch_size is for'):
        pskv.torch.Trainer([scalar()], 'sgd', pskv.create('local'), loss_reduction='mean', global_batch_size=4)


class EmbNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 2, sparse=True)
        self.fc = torch.nn.Linear(2, 1)

    def forward(self, ids):
        return self.fc(self.emb(ids)).sum()


def test_sparse_embedding_is_pushed_and_pulled_as_row_sparse():
    """Issue 15: nn.Embedding(sparse=True) is a row_sparse key; step() pushes the rows of
    its sparse gradient (lazy SGD updates those rows only) and pulls the rows asked for."""
    net = EmbNet()
    w0, fcw = net.emb.weight.detach().clone(), net.fc.weight.detach().clone()
    kv = pskv.create('local')
    tr = pskv.torch.Trainer(net, pskv.optimizer.SGD(learning_rate=0.5), kv, global_batch_size=1)
    assert tr.update_on_kvstore  # forced for sparse parameters
    net(torch.tensor([3, 1, 3])).backward()
    assert net.emb.weight.grad.is_sparse
    tr.step(row_ids=np.array([7, 3]))
    w = net.emb.weight.detach()
    assert torch.allclose(w[7], w0[7])
    assert torch.allclose(w[3], w0[3] - 0.5 * 2 * fcw[0])
    assert torch.allclose(w[1], w0[1])  # updated in the store, not pulled yet
    tr.row_sparse_pull(net.emb.weight, [1])
    assert torch.allclose(net.emb.weight.detach()[1], w0[1] - 0.5 * fcw[0])
    # a step without this parameter's gradient is an empty push; default pull = pushed rows
    net.fc(torch.ones(1, 2)).sum().backward()
    tr.step()
    with pytest.raises(pskv.UsageError, match='row_sparse_pull'):
        kv.pull(0, out=np.zeros((10, 2), np.float32))


def test_sparse_parameters_need_update_on_kvstore():
    with pytest.raises(pskv.UsageError, match='update_on_kvstore=True'):
        pskv.torch.Trainer(EmbNet(), pskv.optimizer.SGD(learning_rate=0.5), pskv.create('local'),
                           global_batch_size=1, update_on_kvstore=False)
