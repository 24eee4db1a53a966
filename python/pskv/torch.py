"""PyTorch integration: keep a module's parameters in sync through a pskv store.

    kv = pskv.create('dist_sync')
    trainer = pskv.torch.Trainer(model.parameters(), pskv.optimizer.SGD(learning_rate=0.1, momentum=0.9),
                                 kv, global_batch_size=batch * kv.num_workers)
    for x, y in loader:
        loss = torch.nn.functional.nll_loss(model(x), y, reduction='sum')
        loss.backward()   # gradients are pushed as backward produces them
        trainer.step()    # waits for the answers and updates the parameters

Gradients are summed over workers and rescaled by 1/global_batch_size, so n workers
with batch b train like one process with batch n*b (use a loss summed over the batch).
"""
import numpy as np
import torch as _torch

from . import _pskv
from .kvstore import KVStore, create
from . import optimizer as _opt


class Trainer(object):
    def __init__(self, params, optimizer, kvstore='dist_sync', global_batch_size=None,
                 update_on_kvstore=True, compression_params=None):
        self.params = [p for p in params]
        if not self.params:
            raise _pskv.InvalidArgument('Trainer needs parameters')
        for p in self.params:
            if p.device.type != 'cpu' or not p.is_contiguous():
                raise _pskv.InvalidArgument('pskv handles contiguous CPU parameters only on this build')
        self.kv = create(kvstore) if isinstance(kvstore, str) else kvstore
        if not isinstance(self.kv, KVStore):
            raise TypeError('kvstore must be a pskv.KVStore or a type string')
        if not global_batch_size or global_batch_size <= 0:
            raise _pskv.InvalidArgument('global_batch_size (samples per step over all workers) is required')
        if isinstance(optimizer, str):
            optimizer = _opt.create(optimizer)
        if 'async' in self.kv.type and not update_on_kvstore:
            raise _pskv.UsageError('Please set update_on_kvstore=True when training in async mode.')
        optimizer.rescale_grad = 1.0 / global_batch_size
        self.update_on_kvstore = update_on_kvstore
        if compression_params:
            self.kv.set_gradient_compression(compression_params)
        if update_on_kvstore:
            self.kv.set_optimizer(optimizer)
            self._updater = None
        else:
            self._updater = optimizer.create_updater()
        # Rank 0's initial weights become everyone's.
        with _torch.no_grad():
            for i, p in enumerate(self.params):
                self.kv.broadcast(i, p.data, out=p.data)
        self._buffers = [np.empty(tuple(p.shape), dtype=p.detach().numpy().dtype) for p in self.params]
        self._pushed = [False] * len(self.params)
        self._hold = {}
        for i, p in enumerate(self.params):
            p.register_hook(self._make_hook(i))

    def _make_hook(self, i):
        def hook(grad):
            self._push(i, grad)
        return hook

    def _push(self, i, grad):
        if self._pushed[i]:
            return
        self._pushed[i] = True
        g = grad.detach().contiguous()
        self._hold[i] = g
        # asynchronous: overlaps with the rest of backward; priority = layer index
        self.kv._kv.pushpull([i], [g.numpy()], [i], [self._buffers[i]], i)

    def step(self):
        for i in reversed(range(len(self.params))):
            if not self._pushed[i]:
                p = self.params[i]
                self._push(i, p.grad if p.grad is not None else _torch.zeros_like(p))
        self.kv.wait()
        with _torch.no_grad():
            for i, p in enumerate(self.params):
                if self.update_on_kvstore:
                    p.data.copy_(_torch.from_numpy(self._buffers[i]))
                else:
                    self._updater(i, self._buffers[i], p.data.numpy())
                p.grad = None
        self._pushed = [False] * len(self.params)
        self._hold.clear()


DistributedOptimizer = Trainer


def shard(dataset, rank, num_workers):
    """The part of `dataset` for worker `rank` of `num_workers` (Gluon's shard:
    the first len % num_workers parts get one sample more)."""
    n = len(dataset)
    q, r = divmod(n, num_workers)
    start = q * rank + min(rank, r)
    end = start + q + (1 if rank < r else 0)
    return _torch.utils.data.Subset(dataset, range(start, end))
