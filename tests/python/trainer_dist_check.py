"""pskv.torch.Trainer in a 2-worker dist_sync job (run by pskv-launch from
test_trainer_dist.py). Each worker writes its results as JSON for the test.

    trainer_dist_check.py features UOK OUT_DIR
    trainer_dist_check.py ckpt UOK full|first|resume OUT_DIR
"""
import json
import os
import sys

import numpy as np
import torch

import pskv
import pskv.torch


def features(kv, uok, out):
    r = kv.rank
    torch.manual_seed(1 + r)  # differs per worker: the broadcast must make it equal
    a = torch.nn.Parameter(torch.zeros(1))
    f = torch.nn.Parameter(torch.full((1,), 3.0 + r), requires_grad=False)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    params = [a, f] + list(net.parameters())
    tr = pskv.torch.Trainer(params, pskv.optimizer.SGD(learning_rate=1.0), kv, global_batch_size=1,
                            update_on_kvstore=None if uok else False, buffers=list(net.buffers()))
    res = {'uok': tr.update_on_kvstore, 'f0': f.item()}
    # 1. accumulation over two micro-batches: sum over workers of 2(r+1) = 6
    (a * (r + 1)).sum().backward()
    (a * (r + 1)).sum().backward()
    net(torch.randn(8, 3) + 5 * r).sum().backward()  # BN statistics differ per worker
    tr.step()
    res['accumulate'] = a.item()
    res['running_mean'] = net[1].running_mean.tolist()
    res['num_batches_tracked'] = int(net[1].num_batches_tracked)
    # 2. clipping after backward: each worker's 10 clipped to 1
    (10 * a).sum().backward()
    torch.nn.utils.clip_grad_norm_([a], 1.0)
    tr.step()
    res['clip'] = a.item()
    # 3. set_learning_rate reaches the servers
    tr.set_learning_rate(0.5)
    a.sum().backward()
    tr.step()
    res['lr'] = a.item()
    res['f'] = f.item()
    # 4. weights loaded after a step: dist + update_on_kvstore refuses (as MXNet)
    with torch.no_grad():
        a.copy_(torch.zeros(1))
    a.sum().backward()
    try:
        tr.step()
        res['reload'] = a.item()
    except pskv.UsageError as e:
        res['reload'] = str(e)
    tr.zero_grad()
    # 5. a store running a Trainer's optimizer is not shared
    try:
        pskv.torch.Trainer([torch.nn.Parameter(torch.zeros(1))], 'sgd', kv, loss_reduction='mean',
                           update_on_kvstore=False)
        res['shared'] = 'ok'
    except pskv.UsageError as e:
        res['shared'] = str(e)
    # 6. mean losses, a second Trainer sharing the store (update_on_kvstore=False)
    if not uok:
        b = torch.nn.Parameter(torch.zeros(1))
        tb = pskv.torch.Trainer([b], pskv.optimizer.SGD(learning_rate=1.0), kv, loss_reduction='mean',
                                update_on_kvstore=False)
        (b * (r + 1)).sum().backward()
        tb.step()
        res['mean'] = b.item()
        # allreduce_grads(): every worker's .grad holds the mean (loss_reduction='mean');
        # update() does not scale again
        (b * (r + 1)).sum().backward()
        tb.allreduce_grads()
        res['allreduced'] = b.grad.item()
        tb.update()
        res['update'] = b.item()
    with open(os.path.join(out, 'features%d.json' % r), 'w') as fh:
        json.dump(res, fh)


def mean(kv, uok, out):
    """loss_reduction='mean': the gradients are averaged over workers."""
    r = kv.rank
    b = torch.nn.Parameter(torch.zeros(1))
    tb = pskv.torch.Trainer([b], pskv.optimizer.SGD(learning_rate=1.0, rescale_grad=2.0), kv,
                            loss_reduction='mean', update_on_kvstore=uok)
    (b * (r + 1)).sum().backward()
    tb.step()
    with open(os.path.join(out, 'mean%d.json' % r), 'w') as fh:
        json.dump({'mean': b.item()}, fh)


def gan(kvtype, out):
    """Two models, two stores, two Trainers in one worker process (a GAN step).
    n workers with batch b must match one process ('local') with batch n*b."""
    kv_g, kv_d = pskv.create(kvtype), pskv.create(kvtype)  # a second dist store shares the node
    r, n = kv_g.rank, kv_g.num_workers
    assert (kv_d.rank, kv_d.num_workers) == (r, n)
    torch.manual_seed(20 + r)  # differs per worker: the broadcasts must fix it
    G = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    D = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    # the same keys 0.. in both stores; different optimizers on the servers
    tg = pskv.torch.Trainer(G, pskv.optimizer.Adam(learning_rate=0.01), kv_g, loss_reduction='mean',
                            update_on_kvstore=True)
    td = pskv.torch.Trainer(D, pskv.optimizer.SGD(learning_rate=0.1, momentum=0.5), kv_d,
                            loss_reduction='mean', update_on_kvstore=True)
    gen = torch.Generator().manual_seed(7)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    b = 8 // n
    for _ in range(4):
        real_all = torch.randn(8, 2, generator=gen) * 0.5 + 2
        z_all = torch.randn(8, 3, generator=gen)
        real, z = real_all[r * b:(r + 1) * b], z_all[r * b:(r + 1) * b]
        fake = G(z)
        td.zero_grad()
        d_loss = bce(D(real), torch.ones(b, 1)) + bce(D(fake.detach()), torch.zeros(b, 1))
        d_loss.backward()
        td.step()
        tg.zero_grad()
        bce(D(fake), torch.ones(b, 1)).backward()
        tg.step()  # D's gradients from this backward are dropped by td.zero_grad()
    if kvtype.startswith('dist'):
        # two more stores with string keys in different orders: ids are per store
        kv_a, kv_b = pskv.create(kvtype), pskv.create(kvtype)
        kv_a.init(['x', 'y'], [np.zeros(2, np.float32)] * 2)
        kv_b.init(['y', 'x'], [np.zeros(2, np.float32)] * 2)
        a, b = np.full(2, r + 1, np.float32), np.full(2, 10 * (r + 1), np.float32)
        kv_a.pushpull('x', a)
        kv_a.wait_all()
        kv_b.pushpull('x', b)
        kv_b.wait_all()
        assert (a == 3).all() and (b == 30).all(), (a, b)  # summed over workers, no cross-talk
        kv_a.close()
        kv_b.close()
    if r == 0:
        w = np.concatenate([t.detach().numpy().ravel() for m in (G, D) for t in m.parameters()])
        np.save(os.path.join(out, 'gan_%s.npy' % kvtype), w)
    kv_g.barrier()
    return r


def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:].sum(1) > 0).long()
    return x, y


def ckpt(kv, uok, mode, out):
    r, n = kv.rank, kv.num_workers
    x, y = make_data()
    torch.manual_seed(5 + r)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    prefix = os.path.join(out, 'ckpt')
    meta = pskv.torch.load_checkpoint(prefix, model) if mode == 'resume' else None
    sched = pskv.lr_scheduler.FactorScheduler(step=4, factor=0.7)
    tr = pskv.torch.Trainer(model, pskv.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4,
                                                      lr_scheduler=sched),
                            kv, loss_reduction='mean', update_on_kvstore=uok)
    start = 0
    if meta is not None:
        tr.load_states(prefix + '.states')
        start = meta['epoch']
    batch = 8
    sampler = pskv.torch.Sampler(len(x), batch, num_parts=n, part_index=r, seed=3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, sampler=sampler)
    epochs = 1 if mode == 'first' else 2
    for epoch in range(start, epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            tr.step()
        if epoch == 0:
            tr.set_learning_rate(0.05)  # the resumed run gets it from the saved optimizer
        if mode == 'first':
            pskv.torch.save_checkpoint(prefix, model, tr, epoch=epoch + 1)
    if mode != 'first':
        w = np.concatenate([t.detach().numpy().ravel() for t in model.state_dict().values()
                            if t.dtype == torch.float32])
        np.save(os.path.join(out, '%s%d.npy' % (mode, r)), w)
        with open(os.path.join(out, '%s%d.json' % (mode, r)), 'w') as fh:
            json.dump({'lr': tr.learning_rate}, fh)


if __name__ == '__main__':
    torch.set_num_threads(1)
    if sys.argv[1] == 'gan':
        print('worker %d: gan passed' % gan(sys.argv[2], sys.argv[3]), flush=True)
        sys.exit(0)
    kv = pskv.create('dist_sync')
    if sys.argv[1] == 'features':
        features(kv, sys.argv[2] == '1', sys.argv[3])
    elif sys.argv[1] == 'mean':
        mean(kv, sys.argv[2] == '1', sys.argv[3])
    else:
        ckpt(kv, sys.argv[2] == '1', sys.argv[3], sys.argv[4])
    kv.barrier()
    print('worker %d: %s passed' % (kv.rank, sys.argv[1]), flush=True)
