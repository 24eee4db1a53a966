"""Optimizers run by the store (on the servers in dist mode). They are plain
configuration: the C++ core runs the update rule (see include/pskv/optimizer.h)."""
import difflib
import warnings

from . import _pskv


class Optimizer(object):
    """Base class of the optimizers: a name plus keyword parameters (MXNet's names).

    The C++ core runs the update rule (on the servers in dist mode).

    Parameters
    ----------
    learning_rate : float, optional
        The base learning rate.
    wd : float, optional
        Weight decay.
    rescale_grad : float, optional
        Gradients are multiplied by this first.
    clip_gradient : float, optional
        Clip gradients to [-c, c] (after rescaling).
    multi_precision : bool, optional
        Keep float32 master weights for float16 parameters.
    lr_scheduler : pskv.lr_scheduler.LRScheduler, optional
        A learning-rate schedule.
    param_idx2name : dict of int to str, optional
        Names of the int keys (MXNet's): multipliers given by name apply to the key of
        that name, and the weight decay of every named key whose name ends neither in
        ``_weight`` nor ``_gamma`` (biases, BatchNorm's beta) is zero unless
        :meth:`set_wd_mult` says otherwise. Multipliers travel with the optimizer when
        it is given to a store: set them before ``set_optimizer``.
    **kwargs
        Parameters of the specific optimizer (momentum, ...).
    """
    name = None

    def __init__(self, learning_rate=None, wd=None, rescale_grad=None, clip_gradient=None,
                 multi_precision=False, lr_scheduler=None, param_idx2name=None, **kwargs):
        for k in ('lr_mult', 'wd_mult'):
            if k in kwargs:
                raise _pskv.InvalidArgument('%s is not a constructor parameter: call optimizer.set_%s({key: mult})'
                                            % (k, k))
        _check_names(self.name or 'sgd', kwargs)
        self.kwargs = dict(kwargs)
        self.idx2name = dict(param_idx2name or {})
        self.lr_mult = {}  # key (int) or name (str) -> multiplier of the learning rate
        self.wd_mult = {}  # likewise for the weight decay
        self.set_wd_mult({})  # MXNet's: no decay for named biases and betas from the start
        if 'lr' in kwargs:  # MXNet's alias
            if learning_rate is not None:
                raise _pskv.InvalidArgument('give learning_rate or lr, not both')
            learning_rate = kwargs.pop('lr')
            self.kwargs.pop('lr')
        # Left out (None): the type's defaults, from the C++ core (OptimizerConfig::For).
        kind = self.name or 'sgd'
        self.learning_rate = _default(kind, 'learning_rate') if learning_rate is None else learning_rate
        self.wd = _default(kind, 'wd') if wd is None else wd
        self.rescale_grad = _default(kind, 'rescale_grad') if rescale_grad is None else rescale_grad
        self.clip_gradient = clip_gradient
        self.multi_precision = multi_precision
        self.lr_scheduler = lr_scheduler

    def params(self, key_ids=None):
        """The parameters the C++ core receives.

        Parameters
        ----------
        key_ids : dict of str to int, optional
            A store's string keys and their int ids (for multipliers given by name).

        Returns
        -------
        dict of str to str
        """
        p = {'learning_rate': self.learning_rate, 'wd': self.wd, 'rescale_grad': self.rescale_grad,
             'multi_precision': int(bool(self.multi_precision))}
        if self.clip_gradient is not None:
            p['clip_gradient'] = self.clip_gradient
        p.update(self.kwargs)
        if self.lr_scheduler is not None:
            p.update(self.lr_scheduler.params(self.learning_rate))
        p = {k: _fmt(v) for k, v in p.items()}
        lr, wd = self._mults(key_ids)
        for name, table in (('lr_mult', lr), ('wd_mult', wd)):
            if table:
                p[name] = ','.join('%d:%r' % (k, v) for k, v in sorted(table.items()))
        return p

    @property
    def lr(self):
        """The base learning rate (MXNet's attribute name for ``learning_rate``); a
        non-dist store given this optimizer uses a new value from its next push.

        Returns
        -------
        float
        """
        return self.learning_rate

    @lr.setter
    def lr(self, value):
        self.learning_rate = value

    def set_learning_rate(self, lr):
        """Sets the base learning rate (MXNet's ``set_learning_rate``).

        Parameters
        ----------
        lr : float
            The new learning rate.
        """
        self.learning_rate = lr

    def set_lr_mult(self, args_lr_mult):
        """Per-key multipliers of the learning rate (MXNet's ``set_lr_mult``): key k
        is updated with ``learning_rate * lr_mult[k]``, on the servers too. Replaces the
        multipliers set before.

        Parameters
        ----------
        args_lr_mult : dict
            ``{key: mult}``: keys are the store's keys (ints, or the strs a store was
            initialised with), or names of `param_idx2name`.
        """
        self.lr_mult = _check_mults('lr_mult', args_lr_mult, lambda m: True)

    def set_wd_mult(self, args_wd_mult):
        """Per-key multipliers of the weight decay (MXNet's ``set_wd_mult``). As in
        MXNet, a key named in `param_idx2name` whose name ends neither in ``_weight`` nor
        ``_gamma`` gets 0 unless `args_wd_mult` says otherwise. Replaces the multipliers
        set before.

        Parameters
        ----------
        args_wd_mult : dict
            ``{key: mult}`` (multipliers >= 0), keys as in :meth:`set_lr_mult`.
        """
        mults = {n: 0.0 for n in self.idx2name.values() if not n.endswith(('_weight', '_gamma'))}
        mults.update(_check_mults('wd_mult', args_wd_mult, lambda m: m >= 0))
        self.wd_mult = mults

    def _get_lr(self, index):
        """The learning rate of key `index` before any schedule: ``learning_rate``
        times its multiplier (MXNet's ``_get_lr``)."""
        return self.learning_rate * self._mult(self.lr_mult, index)

    def _get_wd(self, index):
        """The weight decay of key `index`: ``wd`` times its multiplier."""
        return self.wd * self._mult(self.wd_mult, index)

    def _mult(self, table, index):
        if index in table:
            return table[index]
        name = self.idx2name.get(index)
        return table.get(name, 1.0) if name is not None else 1.0

    def _mults(self, key_ids=None):
        """The multipliers by int key: names resolved through `param_idx2name`, then
        `key_ids` (a store's {str key: int id}). A name neither knows is an error: it
        would silently apply to nothing."""
        name_to_idx = {n: i for i, n in self.idx2name.items()}
        ids = dict(key_ids or {})
        out = []
        for what, table in (('lr_mult', self.lr_mult), ('wd_mult', self.wd_mult)):
            resolved = {}
            # Names first, then indices: an index's own entry wins (MXNet's _get_lr).
            for k, m in sorted(table.items(), key=lambda km: not isinstance(km[0], str)):
                if isinstance(k, str):
                    i = name_to_idx.get(k, ids.get(k))
                    if i is None:
                        raise _pskv.UsageError(
                            '%s of %r: no key has that name. Name keys with param_idx2name=, or init the '
                            'string keys before set_optimizer (their multipliers travel with it)' % (what, k))
                    k = i
                resolved[int(k)] = float(m)
            out.append(resolved)
        return out

    def create_updater(self):
        """A local updater running this optimizer on numpy arrays.

        Returns
        -------
        callable
            ``update(key, grad, weight)``, updating `weight` in place.
        """
        opt = _pskv.Optimizer(self.name, self.params())

        def update(key, grad, weight):
            opt.update(int(key), grad, weight)
        return update

    def __repr__(self):
        return '%s(%s)' % (type(self).__name__, self.params())


# Other frameworks' parameter names (PyTorch's mostly) and what pskv calls them.
_HINTS = {
    'weight_decay': 'wd=',
    'betas': 'beta1= and beta2= (betas=(0.9, 0.999) is beta1=0.9, beta2=0.999)',
    'eps': 'epsilon=',
    'alpha': 'rho= (RMSProp\'s decay; MXNet also calls it gamma1)',
    'gamma1': 'rho=',
    'nesterov': 'pskv.optimizer.NAG(momentum=...) (Nesterov momentum is its own optimizer, as in MXNet)',
    'amsgrad': 'nothing: AMSGrad is not implemented; use Adam',
    'dampening': 'nothing: pskv\'s momentum has no dampening (torch\'s dampening=0)',
    'lr_decay': 'a schedule: lr_scheduler=pskv.lr_scheduler.FactorScheduler(...)',
    'maximize': 'nothing: negate the loss instead',
    'momentum_decay': 'nothing',
}
# Fields of the configuration that are not keyword arguments (the multipliers are
# refused before, with their own message).
_INTERNAL = ('type',)


def _check_names(kind, kwargs):
    """Unknown keyword arguments are refused at construction, each with what pskv
    calls it (PyTorch's names, close spellings), rather than when a store runs it."""
    known = set()
    for p in _pskv.optimizer_params(kind):
        known.add(p['name'])
        if p['alias']:
            known.add(p['alias'])
    known.difference_update(_INTERNAL)
    unknown = [k for k in kwargs if k not in known]
    if not unknown:
        return
    parts = []
    for k in unknown:
        if k in _HINTS:
            parts.append('%s=: use %s' % (k, _HINTS[k]))
        else:
            close = difflib.get_close_matches(k, sorted(known | {'learning_rate', 'wd', 'rescale_grad',
                                                                 'clip_gradient', 'multi_precision'}), 3, 0.6)
            parts.append('%s=%s' % (k, ': did you mean %s?' % ' or '.join(c + '=' for c in close) if close
                                    else ''))
    raise _pskv.InvalidArgument(
        '%s: unknown parameter%s %s. Its parameters: pskv.optimizer.params(%r)' % (
            _CLASS_NAMES.get(kind, kind), 's' if len(unknown) > 1 else '', '; '.join(parts), kind))


def _check_mults(what, mults, ok):
    if not isinstance(mults, dict):
        raise TypeError('%s must be a dict {key: multiplier}' % what)
    out = {}
    for k, m in mults.items():
        if isinstance(k, bool) or not isinstance(k, (int, str)):
            raise TypeError('%s: keys are ints or strs, got %r' % (what, k))
        m = float(m)
        if m != m or m in (float('inf'), float('-inf')) or not ok(m):
            raise _pskv.InvalidArgument('%s of %r must be finite%s, got %r' % (
                what, k, ' and >= 0' if what == 'wd_mult' else '', m))
        out[k] = m
    return out


def _default(name, field):
    """The default of `field` for optimizer type `name`, as the C++ core sets it
    (OptimizerConfig::For: the field's initialiser or the rule's own default)."""
    for p in _pskv.optimizer_params(name):
        if p['name'] == field:
            return float(p['default'])
    raise _pskv.InvalidArgument("optimizer '%s' has no parameter '%s'" % (name, field))


def _given(**kwargs):
    """The keyword arguments the caller gave (not None): the others keep the C++
    core's defaults for the optimizer's type, which the core applies itself."""
    return {k: v for k, v in kwargs.items() if v is not None}


def _fmt(v):
    if isinstance(v, bool):
        return '1' if v else '0'
    if isinstance(v, (list, tuple)):
        return ','.join(str(int(x)) for x in v)
    return repr(float(v)) if isinstance(v, float) else str(v)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum.

    Parameters
    ----------
    momentum : float, optional
        Momentum (default 0: none).
    lazy_update : bool, optional
        Row-sparse gradients update only their rows (weight decay and momentum of the
        other rows untouched), as MXNet's ``lazy_update=True`` (the default).
    **kwargs
        See :class:`Optimizer`.
    """
    name = 'sgd'

    def __init__(self, momentum=None, lazy_update=None, **kwargs):
        super().__init__(**_given(momentum=momentum, lazy_update=lazy_update), **kwargs)


class NAG(Optimizer):
    """Nesterov accelerated gradient.

    Parameters
    ----------
    momentum : float, optional
        Momentum.
    **kwargs
        See :class:`Optimizer`.
    """
    name = 'nag'

    def __init__(self, momentum=None, **kwargs):
        super().__init__(**_given(momentum=momentum), **kwargs)


class Adam(Optimizer):
    """Adam.

    Parameters
    ----------
    learning_rate : float, optional
        The base learning rate (default 0.001).
    beta1, beta2 : float, optional
        Decay rates of the first and second moments (0.9, 0.999).
    epsilon : float, optional
        Added to the denominator (1e-8).
    **kwargs
        See :class:`Optimizer`.

    Defaults left out (None) are the C++ core's for the type (``pskv.optimizer.params('adam')``).
    """
    name = 'adam'

    def __init__(self, learning_rate=None, beta1=None, beta2=None, epsilon=None, **kwargs):
        super().__init__(learning_rate=learning_rate, **_given(beta1=beta1, beta2=beta2, epsilon=epsilon),
                         **kwargs)


class AdamW(Adam):
    """Adam with decoupled weight decay (same parameters as :class:`Adam`).

    Parameters
    ----------
    **kwargs
        See :class:`Adam`.
    """
    name = 'adamw'


class RMSProp(Optimizer):
    """RMSProp (Tieleman and Hinton; Graves' centered variant).

    Parameters
    ----------
    learning_rate : float, optional
        The base learning rate (default 0.001).
    rho : float, optional
        Decay rate of the squared-gradient average (0.9).
    epsilon : float, optional
        Added to the denominator (1e-8).
    centered : bool, optional
        Graves' centered variant (False).
    momentum : float, optional
        Momentum (0).
    **kwargs
        See :class:`Optimizer`.

    Defaults left out (None) are the C++ core's for the type (``pskv.optimizer.params('rmsprop')``).
    """
    name = 'rmsprop'

    def __init__(self, learning_rate=None, rho=None, epsilon=None, centered=None, momentum=None, **kwargs):
        super().__init__(learning_rate=learning_rate,
                         **_given(rho=rho, epsilon=epsilon, centered=centered, momentum=momentum), **kwargs)


class AdaGrad(Optimizer):
    """AdaGrad.

    Parameters
    ----------
    epsilon : float, optional
        Added to the denominator (default 1e-7, the C++ core's for the type).
    **kwargs
        See :class:`Optimizer`.
    """
    name = 'adagrad'

    def __init__(self, epsilon=None, **kwargs):
        super().__init__(**_given(epsilon=epsilon), **kwargs)


_REGISTRY = {c.name: c for c in (SGD, NAG, Adam, AdamW, RMSProp, AdaGrad)}
_CLASS_NAMES = {c.name: c.__name__ for c in _REGISTRY.values()}


def _is_torch_optimizer(obj):
    """A torch.optim optimizer, found without importing torch."""
    return any(c.__module__.startswith('torch.optim') and c.__name__ == 'Optimizer' for c in type(obj).__mro__)


def from_torch(torch_optimizer):
    """The pskv optimizer of a ``torch.optim`` optimizer's hyperparameters.

    SGD (momentum, weight_decay, nesterov -> :class:`NAG`), Adam, AdamW, RMSprop and
    Adagrad translate; the update rules are MXNet's, equal to torch's but for where
    epsilon sits (Adam, RMSProp centered, AdaGrad). Its param groups must share their
    hyperparameters (give the Trainer ``{'params': ..., 'lr_mult': x}`` groups
    instead). The torch optimizer itself is not used afterwards: do not call its
    ``step()`` (the store or the Trainer updates the parameters).

    Parameters
    ----------
    torch_optimizer : torch.optim.Optimizer

    Returns
    -------
    Optimizer

    Raises
    ------
    pskv.InvalidArgument
        A torch optimizer or an option with no pskv equivalent (the message says
        what to use).
    """
    kind = type(torch_optimizer).__name__
    groups = list(getattr(torch_optimizer, 'param_groups', []))
    if not groups:
        raise _pskv.InvalidArgument('torch.optim.%s without param groups' % kind)
    g = {k: v for k, v in groups[0].items() if k != 'params'}
    for other in groups[1:]:
        diff = sorted(k for k in g if k != 'params' and other.get(k) != g[k])
        if diff:
            raise _pskv.InvalidArgument(
                'torch.optim.%s: its param groups differ in %s; a pskv optimizer has one set of '
                'hyperparameters: give the Trainer groups {"params": [...], "lr_mult": x, "wd_mult": y} '
                'and one pskv optimizer' % (kind, ', '.join(diff)))

    def refuse(what, use):
        raise _pskv.InvalidArgument('torch.optim.%s(%s) has no pskv equivalent: %s' % (kind, what, use))

    if g.get('maximize'):
        refuse('maximize=True', 'negate the loss instead')
    lr, wd = float(g['lr']), float(g.get('weight_decay', 0.0))
    if kind == 'SGD':
        if g.get('dampening', 0):
            refuse('dampening=%r' % g['dampening'], "pskv's momentum has no dampening")
        mom = float(g.get('momentum', 0.0))
        if g.get('nesterov'):
            return NAG(learning_rate=lr, momentum=mom, wd=wd)
        return SGD(learning_rate=lr, momentum=mom, wd=wd)
    if kind in ('Adam', 'AdamW'):
        if g.get('amsgrad'):
            refuse('amsgrad=True', 'AMSGrad is not implemented; use amsgrad=False')
        b1, b2 = g.get('betas', (0.9, 0.999))
        cls = Adam if kind == 'Adam' else AdamW
        return cls(learning_rate=lr, beta1=float(b1), beta2=float(b2), epsilon=float(g.get('eps', 1e-8)), wd=wd)
    if kind == 'RMSprop':
        centered, mom = bool(g.get('centered', False)), float(g.get('momentum', 0.0))
        if mom and not centered:
            refuse('momentum=%r, centered=False' % mom, "pskv's (MXNet's) RMSProp has momentum only when "
                   'centered=True')
        return RMSProp(learning_rate=lr, rho=float(g.get('alpha', 0.99)), epsilon=float(g.get('eps', 1e-8)),
                       centered=centered, momentum=mom, wd=wd)
    if kind == 'Adagrad':
        if g.get('lr_decay', 0):
            refuse('lr_decay=%r' % g['lr_decay'], 'use lr_scheduler=pskv.lr_scheduler.FactorScheduler(...)')
        if g.get('initial_accumulator_value', 0):
            refuse('initial_accumulator_value=%r' % g['initial_accumulator_value'], 'the accumulator starts at 0')
        return AdaGrad(learning_rate=lr, epsilon=float(g.get('eps', 1e-10)), wd=wd)
    raise _pskv.InvalidArgument(
        'torch.optim.%s cannot be translated to a pskv optimizer (SGD, Adam, AdamW, RMSprop and Adagrad can): '
        'pass one of %s, or keep torch.optim yourself: Trainer(..., update_on_kvstore=False), then '
        'trainer.allreduce_grads() and your optimizer\'s step() (docs/coming-from-ddp.md)'
        % (kind, ', '.join('pskv.optimizer.' + c for c in sorted(_CLASS_NAMES.values()))))


def _as_pskv(optimizer, where):
    """`optimizer` as a pskv Optimizer: a torch.optim one is translated (with a
    warning saying so); anything else but an Optimizer is a TypeError saying what to pass."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    if _is_torch_optimizer(optimizer):
        opt = from_torch(optimizer)
        warnings.warn('pskv: %s got torch.optim.%s; it runs the same hyperparameters as %r. The torch '
                      'optimizer is not used: do not call its step() (pass the pskv optimizer to '
                      'silence this)' % (where, type(optimizer).__name__, opt), UserWarning, stacklevel=3)
        return opt
    raise TypeError('%s needs a pskv.optimizer.Optimizer (e.g. pskv.optimizer.SGD(learning_rate=0.1)) or an '
                    'optimizer name, got %s' % (where, type(optimizer).__name__))


def create(name, **kwargs):
    """Creates an optimizer by name.

    Parameters
    ----------
    name : str
        sgd, nag, adam, adamw, rmsprop or adagrad (any case), or a type whose update
        rule was registered in C++ (``pskv/update_rule.h``; its exact name).
    **kwargs
        The optimizer's parameters (:func:`params` lists them).

    Returns
    -------
    Optimizer

    Raises
    ------
    pskv.InvalidArgument
        An unknown name (the message lists the valid ones).
    """
    cls = _REGISTRY.get(name.lower())
    if cls is not None:
        return cls(**kwargs)
    types = _pskv.optimizer_types()
    if name in types:
        opt = Optimizer.__new__(Optimizer)
        opt.name = name  # before __init__, which reads the type's defaults
        opt.__init__(**kwargs)
        return opt
    raise _pskv.InvalidArgument("unknown optimizer '%s'; valid: %s" % (name, ', '.join(sorted(set(_REGISTRY) | set(types)))))


def params(name=''):
    """The parameters the C++ core accepts, from its one table of optimizer fields.

    Parameters
    ----------
    name : str, optional
        An optimizer type: its rule's own parameters are listed too.

    Returns
    -------
    list of dict
        ``name``, ``alias``, ``type``, ``default`` (text form), ``range`` and ``doc``
        of each parameter, in the order of the configuration's text form.
    """
    return _pskv.optimizer_params(name)
