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
    **kwargs
        Parameters of the specific optimizer (momentum, ...).
    """
    name = None

    def __init__(self, learning_rate=0.01, wd=0.0, rescale_grad=1.0, clip_gradient=None,
                 multi_precision=False, lr_scheduler=None, **kwargs):
        self.kwargs = dict(kwargs)
        self.learning_rate = learning_rate
        self.wd = wd
        self.rescale_grad = rescale_grad
        self.clip_gradient = clip_gradient
        self.multi_precision = multi_precision
        self.lr_scheduler = lr_scheduler

    def params(self):
        """The parameters the C++ core receives.

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
        return {k: _fmt(v) for k, v in p.items()}

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
        Momentum (0: none).
    lazy_update : bool, optional
        Row-sparse gradients update only their rows (weight decay and momentum of the
        other rows untouched), as MXNet's ``lazy_update=True`` (the default).
    **kwargs
        See :class:`Optimizer`.
    """
    name = 'sgd'

    def __init__(self, momentum=0.0, lazy_update=True, **kwargs):
        super().__init__(momentum=momentum, lazy_update=lazy_update, **kwargs)


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

    def __init__(self, momentum=0.0, **kwargs):
        super().__init__(momentum=momentum, **kwargs)


class Adam(Optimizer):
    """Adam.

    Parameters
    ----------
    learning_rate : float, optional
        The base learning rate.
    beta1, beta2 : float, optional
        Decay rates of the first and second moments.
    epsilon : float, optional
        Added to the denominator.
    **kwargs
        See :class:`Optimizer`.
    """
    name = 'adam'

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, **kwargs):
        super().__init__(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, **kwargs)


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
        The base learning rate.
    rho : float, optional
        Decay rate of the squared-gradient average.
    epsilon : float, optional
        Added to the denominator.
    centered : bool, optional
        Graves' centered variant.
    momentum : float, optional
        Momentum.
    **kwargs
        See :class:`Optimizer`.
    """
    name = 'rmsprop'

    def __init__(self, learning_rate=0.001, rho=0.9, epsilon=1e-8, centered=False, momentum=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, rho=rho, epsilon=epsilon, centered=centered,
                         momentum=momentum, **kwargs)


class AdaGrad(Optimizer):
    """AdaGrad.

    Parameters
    ----------
    epsilon : float, optional
        Added to the denominator.
    **kwargs
        See :class:`Optimizer`.
    """
    name = 'adagrad'

    def __init__(self, epsilon=1e-7, **kwargs):
        super().__init__(epsilon=epsilon, **kwargs)


_REGISTRY = {c.name: c for c in (SGD, NAG, Adam, AdamW, RMSProp, AdaGrad)}


def create(name, **kwargs):
    """Creates an optimizer by name.

    Parameters
    ----------
    name : str
        sgd, nag, adam, adamw, rmsprop or adagrad (any case).
    **kwargs
        The optimizer's parameters.

    Returns
    -------
    Optimizer

    Raises
    ------
    pskv.InvalidArgument
        An unknown name (the message lists the valid ones).
    """
    try:
        cls = _REGISTRY[name.lower()]
    except KeyError:
        raise _pskv.InvalidArgument("unknown optimizer '%s'; valid: %s" % (name, ', '.join(sorted(_REGISTRY))))
    return cls(**kwargs)
