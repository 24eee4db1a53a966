"""Optimizers run by the store (on the servers in dist mode). They are plain
configuration: the C++ core runs the update rule (see include/pskv/optimizer.h)."""
from . import _pskv


class Optimizer(object):
    """Base class: a name plus keyword parameters (MXNet's names)."""
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
        """The string parameters the C++ core receives."""
        p = {'learning_rate': self.learning_rate, 'wd': self.wd, 'rescale_grad': self.rescale_grad,
             'multi_precision': int(bool(self.multi_precision))}
        if self.clip_gradient is not None:
            p['clip_gradient'] = self.clip_gradient
        p.update(self.kwargs)
        if self.lr_scheduler is not None:
            p.update(self.lr_scheduler.params(self.learning_rate))
        return {k: _fmt(v) for k, v in p.items()}

    def create_updater(self):
        """A local updater(key, grad, weight) running this optimizer on numpy arrays."""
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
    name = 'sgd'

    def __init__(self, momentum=0.0, **kwargs):
        super().__init__(momentum=momentum, **kwargs)


class NAG(Optimizer):
    name = 'nag'

    def __init__(self, momentum=0.0, **kwargs):
        super().__init__(momentum=momentum, **kwargs)


class Adam(Optimizer):
    name = 'adam'

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, **kwargs):
        super().__init__(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon, **kwargs)


class AdamW(Adam):
    name = 'adamw'


class RMSProp(Optimizer):
    name = 'rmsprop'

    def __init__(self, learning_rate=0.001, rho=0.9, epsilon=1e-8, centered=False, momentum=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, rho=rho, epsilon=epsilon, centered=centered,
                         momentum=momentum, **kwargs)


class AdaGrad(Optimizer):
    name = 'adagrad'

    def __init__(self, epsilon=1e-7, **kwargs):
        super().__init__(epsilon=epsilon, **kwargs)


_REGISTRY = {c.name: c for c in (SGD, NAG, Adam, AdamW, RMSProp, AdaGrad)}


def create(name, **kwargs):
    """Creates an optimizer by name: sgd, nag, adam, adamw, rmsprop, adagrad."""
    try:
        cls = _REGISTRY[name.lower()]
    except KeyError:
        raise _pskv.InvalidArgument("unknown optimizer '%s'; valid: %s" % (name, ', '.join(sorted(_REGISTRY))))
    return cls(**kwargs)
