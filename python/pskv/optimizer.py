"""Optimizers run by the store (on the servers in dist mode). They are plain
configuration: the C++ core runs the update rule (see include/pskv/optimizer.h)."""
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
