"""PyTorch integration: keep a module's parameters in sync through a pskv store.

    kv = pskv.create('dist_sync')
    trainer = pskv.torch.Trainer(model, pskv.optimizer.SGD(learning_rate=0.1, momentum=0.9),
                                 kv, loss_reduction='mean')
    for x, y in loader:
        loss = torch.nn.functional.nll_loss(model(x), y)     # torch's default: mean
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # optional: .grad is read in step()
        trainer.step()    # exchanges the gradients, updates the parameters, clears .grad

Loss-scaling convention (say which one you use; the Trainer never guesses):

* ``loss_reduction='mean'``: every worker's loss is a mean over its own batch. The
  gradients are summed over workers and divided by the number of workers.
* ``loss_reduction='sum'`` with ``global_batch_size=B``: the loss is summed over the
  batch; the gradients are summed over workers and divided by ``B`` (the samples
  of one step over all workers).
* ``step(batch_size)`` (Gluon): the summed gradients are divided by ``batch_size``
  for this step (pass the global batch to average).

The optimizer's own ``rescale_grad`` is multiplied by this scale, never replaced.

Communication: by default ``step()`` pushes the gradients as the user left them in
``.grad`` (accumulation over several backward passes and gradient clipping work).
``push_in_backward=True`` overlaps communication with backward: each gradient is
pushed by a hook as backward produces it; then run all micro-batches but the last
inside ``with trainer.no_sync():``, and do not modify ``.grad`` between backward and
``step()``. A second backward without ``step()`` is an error in that mode.

Sparse parameters (docs/sparse.md): the weight of ``nn.Embedding(..., sparse=True)`` (found
in a module given as `params`, or listed in `sparse_params`) is a row_sparse key: its
sparse gradient is pushed as the rows it has, the store's optimizer updates only those
rows (lazy update), and ``step(row_ids=...)`` pulls the rows the next batch needs
(default: the rows just pushed). Dense parameters are exchanged as before. Sparse
parameters need ``update_on_kvstore=True`` (the store holds the table, as in MXNet).
"""
import contextlib
import warnings

import numpy as np
import torch as _torch

from . import _pskv
from .kvstore import KVStore, create
from . import optimizer as _opt
from . import sparse as _sparse_mod
from .data import epoch_size, partition_range  # noqa: F401  (re-exported for convenience)
from ._torch_checkpoint import load_checkpoint, save_checkpoint  # noqa: F401
from ._torch_data import Sampler, shard  # noqa: F401
from ._torch_embedding import EmbeddingBag  # noqa: F401  (over pskv.embedding tables)
from ._trainer_sparse import TrainerSparse
from ._trainer_states import TrainerStates

_REDUCTIONS = ('mean', 'sum')
_UNSET = object()


def _np(t):
    return t.detach().numpy()


# Parameters of at most this many bytes are exchanged together in one call per step:
# the store's fusion limit (PSKV_FUSION_KEY_BYTES), or this if the store has none.
_SMALL_PARAM_BYTES = 65536


def _small_param_bytes(kv):
    return int(getattr(kv, 'fusion_key_bytes', _SMALL_PARAM_BYTES))


def _fmt_mults(m):
    return ','.join('%d:%r' % (k, float(v)) for k, v in sorted(m.items()))


class Trainer(TrainerStates, TrainerSparse):
    """Gluon's Trainer for torch parameters, over a pskv store.

    The store keys of this Trainer are consecutive ints, parameters first. Rank 0's
    initial weights and buffers become every worker's at construction.

    Parameters
    ----------
    params : torch.nn.Module, iterable of torch.Tensor, or iterable of dict
        A module (its parameters; its buffers are kept equal on every worker when
        `broadcast_buffers`), tensors, or dicts ``{'params': [...], 'lr_mult': x,
        'wd_mult': y}``. A parameter's ``lr_mult``/``wd_mult`` attribute (Gluon's habit)
        is honoured too. Parameters with ``requires_grad=False`` are kept equal at the
        start but never updated.
    optimizer : pskv.optimizer.Optimizer or str
        The optimizer, or its name (then `optimizer_params` are its parameters).
    optimizer_params : dict, optional
        Parameters for an optimizer given by name.
    kvstore : pskv.KVStore or str, optional
        A store, or a type to create one (default ``'dist_sync'``).
    global_batch_size : int, optional
        With ``loss_reduction='sum'``: samples of one step over all workers; the
        summed gradients are divided by it.
    update_on_kvstore : bool or None, optional
        Run the optimizer in the store (servers) or locally; None decides as MXNet.
    compression_params : dict, optional
        Gradient compression, see :meth:`pskv.KVStore.set_gradient_compression`.
    loss_reduction : {'mean', 'sum'}, optional
        How each worker's loss is reduced over its batch (see the module docstring).
    push_in_backward : bool, optional
        Push each gradient from a backward hook (overlaps communication with backward).
    broadcast_buffers : bool, optional
        Keep the module's buffers equal to rank 0's after every step (DDP's rule).
    buffers : iterable of torch.Tensor, optional
        Buffers to keep equal instead of the module's.
    sparse_params : iterable of torch.Tensor, optional
        Parameters whose gradients are sparse (row_sparse keys). Default: the weights
        of the ``nn.Embedding``/``nn.EmbeddingBag(sparse=True)`` of a module `params`.
    devices : list of str, optional
        One device per replica (MXNet's ``ctx=[gpu(0), gpu(1)]``): `params` is then a
        list of replicas (modules or lists of tensors with the same shapes), replica
        ``r`` trained on device ``devices[r]`` on its part of the batch
        (:func:`pskv.data.split_and_load`). The store sums the replicas' gradients on
        their devices (a ``device`` store on a device, ``local`` on the CPU) and writes
        every replica's new weights; ``loss_reduction='mean'`` divides by workers times
        replicas. On this build the tensors are CPU tensors and their exchange is
        staged to the devices and back: with ``PSKV_SIM_DEVICES=k`` a dry run of
        multi-device training with the copies counted (docs/gpu.md). Not with
        `push_in_backward` or sparse parameters.

    Examples
    --------
    >>> trainer = pskv.torch.Trainer(model, pskv.optimizer.SGD(learning_rate=0.1), kv,
    ...                              loss_reduction='mean')   # doctest: +SKIP
    """

    def __init__(self, params, optimizer, optimizer_params=None, kvstore=_UNSET, global_batch_size=None,
                 update_on_kvstore=None, compression_params=None, loss_reduction=None,
                 push_in_backward=False, broadcast_buffers=True, buffers=None, sparse_params=None,
                 devices=None):
        # Gluon's order is (params, optimizer, optimizer_params, kvstore, ...); earlier
        # pskv releases took (params, optimizer, kvstore, global_batch_size): both work.
        if isinstance(optimizer_params, (str, KVStore)):
            if kvstore is not _UNSET:
                if global_batch_size is not None:
                    raise TypeError('global_batch_size given twice')
                global_batch_size = kvstore
            optimizer_params, kvstore = None, optimizer_params
        if kvstore is _UNSET:
            kvstore = 'dist_sync'
        replicas = None
        if devices is not None:
            devices, replicas = _replicas_on(devices, params, push_in_backward, sparse_params)
            params = replicas[0]
        module_buffers = []
        sparse_ids = set(id(p) for p in (sparse_params or []))
        names = {}  # id(parameter) -> its name in the module (for messages)
        if isinstance(params, _torch.nn.Module):
            module_buffers = [b for b in params.buffers()]
            names = {id(p): n for n, p in params.named_parameters()}
            if sparse_params is None:
                for m in params.modules():
                    if isinstance(m, (_torch.nn.Embedding, _torch.nn.EmbeddingBag)) and m.sparse:
                        sparse_ids.add(id(m.weight))
            params = params.parameters()
        self._params, lr_mult, wd_mult = [], {}, {}
        seen = set()
        for item in params:
            group = item if isinstance(item, dict) else {'params': [item]}
            ps = group['params']
            ps = [ps] if isinstance(ps, _torch.Tensor) else list(ps)
            for p in ps:
                if id(p) in seen:
                    continue  # a parameter listed twice is kept once (Gluon)
                seen.add(id(p))
                i = len(self._params)
                self._params.append(p)
                for name, table in (('lr_mult', lr_mult), ('wd_mult', wd_mult)):
                    v = group.get(name, getattr(p, name, 1.0))
                    if v != 1.0:
                        table[i] = float(v)
        if not self._params:
            raise _pskv.InvalidArgument('Trainer needs parameters')
        self._param_names = [names.get(id(p), 'parameter %d' % i) for i, p in enumerate(self._params)]
        # Replicas (devices): replica 0 is self._params; the others have the same shapes.
        self._devs = devices
        self._replicas = [self._params]
        self._rep_buffers = []  # the other replicas' module buffers, kept equal to replica 0's
        if replicas is not None:
            for r, rep in enumerate(replicas[1:], 1):
                ps = _plain_params(rep)
                if [tuple(p.shape) for p in ps] != [tuple(p.shape) for p in self._params]:
                    raise _pskv.InvalidArgument('replica %d has other parameters than replica 0: every replica '
                                                'must be the same model (one per device)' % r)
                self._replicas.append(ps)
                if isinstance(rep, _torch.nn.Module):
                    self._rep_buffers.append(list(rep.buffers()))
            if any(self._params[i].requires_grad and i in sparse_ids for i in range(len(self._params))):
                raise _pskv.UsageError(_DEVICES_DENSE_ONLY)
        self._twins = [[None] * len(self._params) for _ in self._replicas]
        self._copy_back = []
        self._warned_stale = set()  # the sets of stale parameters warned about
        for p in self._params:
            if not isinstance(p, _torch.Tensor) or p.device.type != 'cpu' or not p.is_contiguous():
                raise _pskv.InvalidArgument('pskv handles contiguous CPU tensors only on this build')
        if isinstance(optimizer, str):
            optimizer = _opt.create(optimizer, **(optimizer_params or {}))
        elif optimizer_params:
            raise _pskv.InvalidArgument('optimizer_params must be None when optimizer is an Optimizer')
        optimizer = _opt._as_pskv(optimizer, 'Trainer')  # a torch.optim one is translated

        owns_store = isinstance(kvstore, str)
        self.kv = create(kvstore) if owns_store else kvstore
        if not isinstance(self.kv, KVStore):
            raise TypeError('kvstore must be a pskv.KVStore or a type string')
        self._dist = _pskv.store_type(self.kv.type)['dist']
        n = self.kv.num_workers

        # --- loss scaling (see the module docstring; include/pskv/trainer_policy.h)
        if loss_reduction is not None and loss_reduction not in _REDUCTIONS:
            raise _pskv.InvalidArgument("loss_reduction must be 'mean' or 'sum', got %r" % (loss_reduction,))
        if global_batch_size is not None and global_batch_size <= 0:
            raise _pskv.InvalidArgument('global_batch_size must be > 0 (samples per step over all workers)')
        R = len(self._replicas)
        self._loss = _pskv.trainer.LossScale(loss_reduction, global_batch_size or 0, n, R)

        # --- sparse parameters: row_sparse keys, updated on the store
        self._sparse = [i for i, p in enumerate(self._params) if id(p) in sparse_ids]
        for i in self._sparse:
            if self._params[i].dim() < 1:
                raise _pskv.InvalidArgument('a sparse parameter needs rows (at least one dimension)')
        if self._sparse:
            if compression_params:
                raise _pskv.UsageError('gradient compression for row_sparse storage type is not supported '
                                       '(MXNet\'s rule); drop compression_params or the sparse parameters')
        self._sparse_set = set(self._sparse)
        if push_in_backward and self._loss.scale == 0:
            raise _pskv.UsageError('push_in_backward=True needs the loss scale at construction: give '
                                   "loss_reduction='mean' or global_batch_size")

        # --- update_on_kvstore: MXNet's Gluon Trainer policy (include/pskv/trainer_policy.h)
        self._uok = _pskv.trainer.update_on_kvstore(
            update_on_kvstore, self.kv.type, self.kv._kv.update_on_kvstore_default, owns_store,
            max(p.numel() for p in self._params), bool(self._sparse), R)

        # --- keys: this Trainer's range of the store (several Trainers may share one)
        self._buffers = list(buffers) if buffers is not None else module_buffers
        if not broadcast_buffers or n == 1:
            self._buffers = []
        P, B = len(self._params), len(self._buffers)
        # A store runs one optimizer, on all its keys: a Trainer with update_on_kvstore
        # cannot share its store with another Trainer (either order).
        if getattr(self.kv, '_trainer_optimizer', False) or (self._uok and self.kv._next_key > 0):
            raise _pskv.UsageError('this store is used by another Trainer and a store runs one optimizer on all '
                                   'its keys: Trainers share a store only with update_on_kvstore=False; give each '
                                   'Trainer with update_on_kvstore=True its own store')
        # From here the store is marked as this Trainer's: a construction that fails
        # unmarks it (and closes a store it made), so that another Trainer can use it.
        marks = (self.kv._next_key, getattr(self.kv, '_trainer_optimizer', False))
        self._initialised = False
        try:
            self._setup(optimizer, P, B, lr_mult, wd_mult, compression_params, push_in_backward)
        except BaseException:
            if not self._initialised:  # no key of the range was written: it is free again
                self.kv._next_key = marks[0]
            self.kv._trainer_optimizer = marks[1]
            if owns_store:
                try:
                    self.kv.close()
                except Exception:  # noqa: BLE001 - the construction's error is the one to see
                    pass
            raise

    def _setup(self, optimizer, P, B, lr_mult, wd_mult, compression_params, push_in_backward):
        """The construction's part that marks the store (keys, optimizer) and writes it."""
        self._base = self.kv._reserve_keys(P + B)
        self._keys = [self._base + i for i in range(P)]
        self._buf_keys = [self._base + P + j for j in range(B)]

        self._name = optimizer.name
        params_cfg = optimizer.params()
        params_cfg.pop('lr_mult', None)
        params_cfg.pop('wd_mult', None)
        # The optimizer's own multipliers (set_lr_mult/set_wd_mult) are by parameter
        # index, as Gluon's; they multiply those of the groups and attributes.
        for table, opt_table in zip((lr_mult, wd_mult), optimizer._mults()):
            for i, m in opt_table.items():
                if not 0 <= i < P:
                    raise _pskv.InvalidArgument('optimizer multiplier of index %d: the Trainer has %d parameters '
                                                '(indices 0..%d)' % (i, P, P - 1))
                table[i] = table.get(i, 1.0) * m
        # What the store or the local updater runs, rescale_grad included (one
        # definition with the C++ Trainer).
        self._cfg = _pskv.trainer.optimizer_config(self._name, params_cfg, self._loss.shipped, self._base, P,
                                                   lr_mult, wd_mult, B)
        self._compression = bool(compression_params)
        if compression_params:
            self.kv.set_gradient_compression(compression_params)
        self._updater = None
        if self._uok:
            self.kv._trainer_optimizer = True
            self._ship_optimizer()
        else:
            self._updater = _pskv.Optimizer(self._name, self._config())

        # Rank 0's initial weights and buffers become everyone's.
        self._initialised = True  # from here keys of the range may be written
        with _torch.no_grad(), self.kv.batch() as batch:  # every broadcast in flight together
            for i, (k, p) in enumerate(zip(self._keys, self._params)):
                if i in self._sparse_set:  # every row: rank 0's table becomes everyone's
                    rows = np.arange(p.shape[0], dtype=np.int64)
                    self.kv.init(k, _sparse_mod.RowSparseArray(_np(p), rows, tuple(p.shape)))
                    self._pull_rows(i, rows)
                    continue
                if self._devs is None:
                    batch.broadcast(k, p.data, out=p.data)
                else:  # replica 0's weights become every replica's, on its device
                    batch.broadcast(k, self._in(0, p.data), out=self._outs(i, [rep[i].data for rep in self._replicas]))
            for k, b in zip(self._buf_keys, self._buffers):
                batch.broadcast(k, b.data, out=b.data)
        self._finish_copies()
        self._out = [np.empty(tuple(p.shape), dtype=_np(p).dtype) for p in self._params]
        self._buf_out = [np.empty(tuple(b.shape), dtype=_np(b).dtype) for b in self._buffers]
        self._versions = [p._version for p in self._params]
        self._stepped = False
        self._buf_issued = False

        self._push_in_backward = bool(push_in_backward)
        self._no_sync = False
        self._pushed = [False] * P
        self._hold = {}
        if self._push_in_backward:
            for i, p in enumerate(self._params):
                # frozen parameters have no gradient (and torch refuses hooks); sparse
                # ones are pushed in step()
                if p.requires_grad and i not in self._sparse_set:
                    p.register_hook(self._make_hook(i))

    # ------------------------------------------------------------ configuration
    def _config(self, **override):
        cfg = dict(self._cfg)
        cfg.update({k: str(v) for k, v in override.items()})
        return cfg

    def _ship_optimizer(self):
        self.kv._kv.set_optimizer(self._name, self._config())

    @property
    def update_on_kvstore(self):
        """Whether the store runs the optimizer (True) or the workers do (False).

        Returns
        -------
        bool
        """
        return self._uok

    @property
    def learning_rate(self):
        """The base learning rate (before lr_mult and schedules).

        Returns
        -------
        float
        """
        return float(self._cfg['learning_rate'])

    @property
    def optimizer_config(self):
        """The optimizer parameters the store or the local updater runs.

        Returns
        -------
        dict of str to str
        """
        return self._config()

    # ------------------------------------------------------------ backward hooks
    def _make_hook(self, i):
        def hook(grad):
            if self._no_sync:
                return None
            if self._pushed[i]:
                raise _pskv.UsageError(
                    'a second backward before step() with push_in_backward=True: the gradient was already '
                    'sent. Run the micro-batches but the last inside `with trainer.no_sync():`, or use '
                    'push_in_backward=False to accumulate in .grad')
            p = self._params[i]
            # The hook sees this backward's gradient; earlier micro-batches (no_sync) are in .grad.
            total = grad.detach() if p.grad is None else p.grad.detach() + grad.detach()
            self._push(i, total.contiguous())
            return None
        return hook

    @contextlib.contextmanager
    def no_sync(self):
        """Context manager: backward passes inside accumulate in .grad without
        communication (DDP's no_sync); with push_in_backward the next backward outside
        pushes the sum.
        """
        old, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = old

    def _push(self, i, g):
        self._pushed[i] = True
        self._hold[i] = g
        # uok: the new weights arrive in _out[i]; otherwise the summed gradient
        self.kv._kv.pushpull([self._keys[i]], [_np(g)], [self._keys[i]], [self._out[i]], i)

    # ------------------------------------------------------------ steps
    def _ratio(self, batch_size):
        if batch_size is None:
            return self._loss.ratio(0)
        if batch_size <= 0 and self._loss.reduction != 'mean':
            raise _pskv.InvalidArgument('batch_size must be > 0')
        return self._loss.ratio(max(int(batch_size), 1))  # with 'mean': the gradients are already means

    def _check_weights(self):
        """Weights changed outside the Trainer after a step (e.g. load_state_dict):
        MXNet resets the store (non-dist) or raises (dist)."""
        changed = [i for i, p in enumerate(self._params) if p._version != self._versions[i]]
        if not changed or not self._uok or not self._stepped:
            self._versions = [p._version for p in self._params]
            return
        if self._dist or self._compression:
            raise _pskv.UsageError(
                'Cannot reset %s KVStore: parameter %d was changed outside the Trainer after a step '
                '(e.g. load_state_dict) while the store holds the weights (update_on_kvstore=True). Load '
                'weights before creating the Trainer, then load_states (see docs/coming-from-gluon.md)'
                % ('distributed' if self._dist else 'a compressing', changed[0]))
        # Reset (MXNet re-creates the store): the store's values become the current
        # weights, its optimizer states start afresh.
        self.kv._kv.set_optimizer(self._name, self._config(sum_keys=','.join(str(k) for k in self._keys)))
        self.kv._kv.push(self._keys, [_np(p) for p in self._params], 0)
        self.kv._kv.wait(self._keys)
        self._ship_optimizer()
        with _torch.no_grad():
            for i in range(len(self._params)):
                self._sync_replicas(i)
        self._versions = [p._version for p in self._params]

    def _active(self):
        return [i for i, p in enumerate(self._params) if p.requires_grad]

    def _grad(self, i, ratio=1.0):
        p = self._params[i]
        g = p.grad if p.grad is not None else _torch.zeros_like(p)
        _dense_grad(i, g)
        if ratio != 1.0:
            g = g * ratio
        return g.detach().contiguous()

    def step(self, batch_size=None, ignore_stale_grad=False, row_ids=None):
        """Exchanges the gradients in .grad, updates the parameters and clears .grad.

        Parameters
        ----------
        batch_size : int, optional
            Gluon's: the summed gradients are divided by it (pass the global batch to
            average). Not allowed with ``loss_reduction='mean'``.
        ignore_stale_grad : bool, optional
            Parameters without a gradient since the last step (``.grad`` is None: no
            ``backward()`` reached them) push zeros, and their momentum and weight decay
            still move them; a ``UserWarning`` names them (once per set of parameters),
            where Gluon raised. True: no warning (parameters left out on purpose).
        row_ids : array-like or dict, optional
            Sparse parameters: the rows to pull after the update (the next batch's
            ids), one array (a single sparse parameter) or ``{param: ids}``. Default:
            the rows this worker pushed.

        Raises
        ------
        pskv.UsageError
            The loss scale is unknown or ambiguous (the message says what to pass).
        """
        ratio = self._ratio(batch_size)
        self._check_weights()
        self._check_stale('step', ignore_stale_grad)
        if not self._uok:
            self._allreduce(ratio_for_push=1.0)
            self._update(ratio)
        else:
            if ratio != 1.0 and any(self._pushed):
                raise _pskv.UsageError('step(batch_size) differs from the scale the gradients were pushed with in '
                                       'backward; with push_in_backward=True keep the batch size constant')
            # Everything of the step is issued in one batch, waited for when it ends:
            # the dense push-pulls, the sparse pushes, the buffers and the sparse row
            # pulls (ordered after their key's push by the store).
            # The new weights are pulled straight into the parameters (no buffer, no
            # copy after the wait), and the small parameters (biases, norms) go in one
            # call, which a dist store fuses into few messages; big ones keep one call
            # each with their own priority.
            with self.kv.batch() as batch:
                if self._devs is None:
                    rows_pending, direct = self._issue_step(batch, ratio, row_ids)
                else:
                    rows_pending, direct = self._issue_step_devices(batch, ratio)
            self._finish_copies()
            with _torch.no_grad():
                for i in self._active():
                    if i not in self._sparse_set and i not in direct:
                        self._params[i].data.copy_(_torch.from_numpy(self._out[i]))
            for i, pending in rows_pending.items():
                self._apply_rows(i, pending)
        self._finish_buffers()
        self._finish()

    def _issue_step(self, batch, ratio, row_ids):
        """Issues a uok step's calls in `batch`; returns (the row pulls pending, the
        parameters whose new weights are pulled straight into them)."""
        # Native calls (and those of backward hooks): the batch's end waits for their
        # keys, also when issuing fails half-way.
        batch._issued(self._keys + self._buf_keys)
        pushed_rows = {}
        direct = set()
        small_keys, small_grads, small_outs, small_prio = [], [], [], None
        for i in reversed(self._active()):
            if i in self._sparse_set:
                pushed_rows[i] = self._push_sparse(batch, i, ratio)
            elif not self._pushed[i]:
                g = self._grad(i, ratio)
                w = self._params[i].data
                if not (w.is_contiguous() and w.dtype == g.dtype):
                    self._push(i, g)
                    continue
                self._hold[i] = g
                direct.add(i)
                if g.numel() * g.element_size() <= _small_param_bytes(self.kv._kv):
                    small_keys.append(self._keys[i])
                    small_grads.append(_np(g))
                    small_outs.append(_np(w))
                    small_prio = i if small_prio is None else max(small_prio, i)
                else:
                    self.kv._kv.pushpull([self._keys[i]], [_np(g)], [self._keys[i]], [_np(w)], i)
        if small_keys:
            self.kv._kv.pushpull(small_keys, small_grads, small_keys, small_outs, small_prio)
        self._issue_buffers()
        rows_pending = {}
        for i, rows in pushed_rows.items():
            want = rows
            if isinstance(row_ids, dict):
                want = row_ids.get(self._params[i], rows)
            elif row_ids is not None:
                want = row_ids
            want = _sparse_mod._row_ids(want)  # whole-valued floats too; fractions refused
            rows_pending[i] = self.kv._row_sparse_start(self._keys[i], want, i)
        return rows_pending, direct

    def _issue_step_devices(self, batch, ratio):
        """A uok step with replicas on devices: each replica's gradient on its device,
        the new weights written on every replica's device (copied back by
        _finish_copies after the batch's wait)."""
        batch._issued(self._keys + self._buf_keys)
        R = len(self._replicas)
        for i in reversed(self._active()):
            grads = [self._in(r, self._grad_of(r, i, ratio)) for r in range(R)]
            outs = self._outs(i, [rep[i].data for rep in self._replicas])
            self._hold[i] = grads
            self.kv._kv.pushpull([self._keys[i]] * R, grads, [self._keys[i]] * R, outs, i)
        self._issue_buffers()
        return {}, set(self._active())

    def _grad_of(self, r, i, ratio):
        p = self._replicas[r][i]
        g = p.grad if p.grad is not None else _torch.zeros_like(p)
        _dense_grad(i, g)
        if ratio != 1.0:
            g = g * ratio
        return g.detach().contiguous()

    # ------------------------------------------------------------ devices
    def _in(self, r, t):
        """What the store reads of replica r: a view of the tensor, or a copy of it on
        replica r's device."""
        if self._devs is None or not self._devs[r].startswith('cuda'):
            return _np(t)
        return _pskv.DeviceArray(_np(t), self._devs[r])

    def _outs(self, i, tensors):
        """Where the store writes parameter i of each replica: the tensors themselves,
        or their device twins (one per replica and parameter, kept), copied back into
        the tensors by _finish_copies."""
        if self._devs is None:
            return [_np(t) for t in tensors]
        outs = []
        for r, t in enumerate(tensors):
            if not self._devs[r].startswith('cuda'):
                outs.append(_np(t))
                continue
            twin = self._twins[r][i]
            if twin is None or twin.shape != tuple(t.shape) or np.dtype(twin.dtype) != _np(t).dtype:
                twin = self._twins[r][i] = _pskv.DeviceArray.zeros(tuple(t.shape), str(_np(t).dtype), self._devs[r])
            self._copy_back.append((twin, t))
            outs.append(twin)
        return outs

    def _finish_copies(self):
        """After the store's calls finished: the device results into the tensors."""
        if not self._copy_back:
            return
        with _torch.no_grad():
            for twin, t in self._copy_back:
                t.copy_(_torch.from_numpy(twin.asnumpy()))
        self._copy_back = []

    def _sync_replicas(self, i):
        """Replica 0's parameter i into every other replica (after a local update)."""
        for rep in self._replicas[1:]:
            rep[i].data.copy_(self._params[i].data)

    def allreduce_grads(self, ignore_stale_grad=False):
        """Reduces .grad over all workers, in place (update_on_kvstore=False only); then
        e.g. clip, and call :meth:`update` — or step a ``torch.optim`` optimizer of
        your own (docs/coming-from-ddp.md).

        With ``loss_reduction='mean'`` .grad then holds the average over workers (DDP's),
        with ``global_batch_size=B`` the sum divided by B: the gradient the optimizer
        uses. Without either (Gluon's ``update(batch_size)``), the sum.

        Parameters
        ----------
        ignore_stale_grad : bool, optional
            As in :meth:`step`: no warning about parameters without a gradient (their
            .grad becomes the reduced zeros of this worker and the others' gradients).
        """
        if self._uok:
            raise _pskv.UsageError('allreduce_grads() is for update_on_kvstore=False (the store runs the optimizer '
                                   'otherwise): construct the Trainer with update_on_kvstore=False, or call step()')
        self._check_weights()
        self._check_stale('allreduce_grads', ignore_stale_grad)
        self._allreduce(ratio_for_push=1.0)
        scale = self._loss.scale
        if scale:
            with _torch.no_grad():
                for i in self._active():
                    for rep in self._replicas:
                        rep[i].grad.mul_(scale)
        self._reduced_scale = scale or 1.0
        self._reduced = True
        # What update() would finish: a torch.optim optimizer may step instead.
        self._finish_buffers()
        self._pushed = [False] * len(self._params)
        self._hold.clear()

    def update(self, batch_size=None, ignore_stale_grad=False):
        """Updates the parameters from the reduced .grad (after :meth:`allreduce_grads`).

        Parameters
        ----------
        batch_size : int, optional
            As in :meth:`step`.
        ignore_stale_grad : bool, optional
            Accepted for Gluon compatibility.
        """
        if self._uok:
            raise _pskv.UsageError('update() is for update_on_kvstore=False: call step() instead')
        if not getattr(self, '_reduced', False):
            raise _pskv.UsageError('update() needs allreduce_grads() first (or call step())')
        # .grad holds the reduced gradient times the loss scale, which the updater's
        # rescale_grad applies too: once only.
        self._update(self._ratio(batch_size) / self._reduced_scale)
        self._finish_buffers()
        self._finish()

    def _allreduce(self, ratio_for_push):
        """Non-uok: the summed gradients end up in .grad."""
        with _torch.no_grad(), self.kv.batch() as batch:
            batch._issued(self._keys + self._buf_keys)  # native calls: waited for at the end
            for i in reversed(self._active()):
                if self._pushed[i]:
                    continue  # pushed by the hook: the sum arrives in self._out[i]
                for rep in self._replicas:
                    p = rep[i]
                    if p.grad is None:
                        p.grad = _torch.zeros_like(p)
                    elif _dense_grad(i, p.grad) and not p.grad.is_contiguous():
                        p.grad = p.grad.contiguous()
                if self._devs is None:
                    self._hold[i] = self._params[i].grad
                    g = _np(self._params[i].grad)
                    self.kv._kv.pushpull([self._keys[i]], [g], [self._keys[i]], [g], i)
                    continue
                # replicas: every replica's .grad receives the sum (via its device)
                R = len(self._replicas)
                grads = [self._in(r, rep[i].grad) for r, rep in enumerate(self._replicas)]
                self._hold[i] = grads
                self.kv._kv.pushpull([self._keys[i]] * R, grads, [self._keys[i]] * R,
                                     self._outs(i, [rep[i].grad for rep in self._replicas]), i)
            self._issue_buffers()  # with the gradients: one wait for all, when the batch ends
        self._finish_copies()
        with _torch.no_grad():
            for i in self._active():
                if self._pushed[i]:
                    self._params[i].grad = _torch.from_numpy(self._out[i].copy())

    def _check_stale(self, where, ignore):
        """Warns (once per set of parameters) about parameters with no gradient since
        the last step: zeros are pushed for them (Gluon raised UserWarning here)."""
        if ignore:
            return
        # Sparse parameters are left out: an absent gradient is an empty push (lazy update).
        stale = tuple(i for i in self._active()
                      if self._params[i].grad is None and not self._pushed[i] and i not in self._sparse_set)
        if not stale or stale in self._warned_stale:
            return
        self._warned_stale.add(stale)
        shown = ', '.join(repr(self._param_names[i]) for i in stale[:8])
        if len(stale) > 8:
            shown += ' and %d more' % (len(stale) - 8)
        warnings.warn(
            'pskv: %s() without a gradient for %s: .grad is None, so no backward() reached %s since the last '
            'step. Zeros are pushed for %s, and momentum and weight decay still change %s. Call backward() '
            'before %s(); if they are left out on purpose, pass %s(ignore_stale_grad=True) or set '
            'requires_grad=False' % (
                where, shown, 'them' if len(stale) > 1 else 'it', 'them' if len(stale) > 1 else 'it',
                'them' if len(stale) > 1 else 'it', where, where),
            UserWarning, stacklevel=3)

    def _update(self, ratio):
        with _torch.no_grad():
            for i in self._active():
                p = self._params[i]
                g = p.grad if ratio == 1.0 else p.grad * ratio
                self._updater.update(self._keys[i], _np(g.contiguous()), _np(p.data))
                self._sync_replicas(i)

    def _issue_buffers(self):
        """broadcast_buffers: every worker gets rank 0's buffers (DDP's rule). Issued
        with the step's other calls; _finish_buffers copies them after its wait."""
        if not self._buffers:
            return
        rank0 = self.kv.rank == 0
        vals = [_np(b).copy() if rank0 else np.zeros_like(o) for b, o in zip(self._buffers, self._buf_out)]
        self.kv._kv.pushpull(self._buf_keys, vals, self._buf_keys, self._buf_out, 0)
        self._buf_issued = True

    def _finish_buffers(self):
        if not self._buf_issued:
            return
        self._buf_issued = False
        with _torch.no_grad():
            for b, o in zip(self._buffers, self._buf_out):
                b.data.copy_(_torch.from_numpy(o))
            for bufs in self._rep_buffers:  # replicas: replica 0's buffers
                for b, b0 in zip(bufs, self._buffers):
                    b.data.copy_(b0.data)

    def _finish(self):
        for rep in self._replicas:
            for p in rep:
                p.grad = None
        self._pushed = [False] * len(self._params)
        self._hold.clear()
        self._reduced = False
        self._stepped = True
        self._versions = [p._version for p in self._params]

    def zero_grad(self):
        """Clears .grad of every parameter (sets it to None)."""
        for rep in self._replicas:
            for p in rep:
                p.grad = None


_DEVICES_DENSE_ONLY = ('devices= works with dense parameters exchanged in step(): use push_in_backward=False and '
                       'keep sparse parameters on the CPU (no devices)')


def _plain_params(rep):
    """The parameters of one replica: a module's, or a list of tensors or groups."""
    if isinstance(rep, _torch.nn.Module):
        return list(rep.parameters())
    out, seen = [], set()
    for item in rep:
        ps = item['params'] if isinstance(item, dict) else item
        for p in ([ps] if isinstance(ps, _torch.Tensor) else list(ps)):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def _replicas_on(devices, params, push_in_backward, sparse_params):
    """(device names, replicas) checked: one replica per device, devices that exist."""
    if isinstance(devices, (str, _torch.device)):
        devices = [devices]
    names = [_device_name(d) for d in devices]
    if not names:
        raise _pskv.InvalidArgument('devices= needs at least one device')
    if isinstance(params, _torch.nn.Module) or not isinstance(params, (list, tuple)):
        if len(names) != 1:
            raise _pskv.InvalidArgument(
                'devices= names %d devices: give params as a list of %d replicas (one model per device, e.g. '
                '[copy.deepcopy(model) for _ in devices])' % (len(names), len(names)))
        params = [params]
    replicas = list(params)
    if len(replicas) != len(names):
        raise _pskv.InvalidArgument('devices= names %d devices for %d replicas: give one replica (model) per '
                                    'device' % (len(names), len(replicas)))
    if push_in_backward or sparse_params:
        raise _pskv.UsageError(_DEVICES_DENSE_ONLY)
    for d in names:
        if d.startswith('cuda') and int(d.split(':')[1]) >= _pskv.cuda.device_count():
            raise _pskv.DeviceUnavailable('devices= names %s, but %s (simulated devices: PSKV_SIM_DEVICES=k)'
                                          % (d, _pskv.cuda.status()))
    return names, replicas


def _device_name(d):
    """'cuda:N' or 'cpu' for a device given as MXNet, torch or pskv name it."""
    s = str(d).strip().lower()
    for prefix in ('gpu(', 'cuda('):
        if s.startswith(prefix) and s.endswith(')'):
            s = 'cuda:' + s[len(prefix):-1]
    if s.startswith('gpu:'):
        s = 'cuda:' + s[4:]
    if s == 'cuda':
        s = 'cuda:0'
    if s == 'cpu' or (s.startswith('cuda:') and s[5:].isdigit()):
        return s
    raise _pskv.InvalidArgument("unknown device %r: use 'cuda:N' (MXNet's gpu(N)) or 'cpu'" % (d,))


def _dense_grad(i, g):
    """True; a sparse gradient of a parameter not declared sparse is a UsageError."""
    if g.is_sparse:
        raise _pskv.UsageError(
            'parameter %d has a sparse gradient but is not a sparse parameter of this Trainer: pass the '
            'module (Trainer(model, ...) finds nn.Embedding(sparse=True)) or sparse_params=[...] so that its '
            'key is row_sparse and updated on the store' % i)
    return True


DistributedOptimizer = Trainer
