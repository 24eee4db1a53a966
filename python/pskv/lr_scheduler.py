"""Learning-rate schedules (MXNet's names); run by the C++ optimizer."""


class LRScheduler(object):
    """Base class of the learning-rate schedules (run by the C++ optimizer).

    Parameters
    ----------
    warmup_steps : int, optional
        Updates of linear warm-up from `warmup_begin_lr` to the base rate.
    warmup_begin_lr : float, optional
        The learning rate at the first update.
    """
    def __init__(self, warmup_steps=0, warmup_begin_lr=0.0):
        self.warmup_steps = warmup_steps
        self.warmup_begin_lr = warmup_begin_lr

    def params(self, base_lr):
        """The optimizer parameters that select this schedule.

        Parameters
        ----------
        base_lr : float
            The optimizer's base learning rate.

        Returns
        -------
        dict
        """
        p = {'warmup_steps': self.warmup_steps, 'warmup_begin_lr': self.warmup_begin_lr}
        p.update(self._schedule())
        return p

    def _schedule(self):
        """This schedule's own parameters (none for the base class)."""
        return {}


class FactorScheduler(LRScheduler):
    """Multiplies the learning rate by `factor` every `step` updates.

    Parameters
    ----------
    step : int
        Updates between reductions.
    factor : float, optional
        The factor.
    stop_factor_lr : float, optional
        The rate never goes below this.
    **kw
        See :class:`LRScheduler`.
    """
    def __init__(self, step, factor=1.0, stop_factor_lr=1e-8, **kw):
        super().__init__(**kw)
        self.step, self.factor, self.stop_factor_lr = step, factor, stop_factor_lr

    def _schedule(self):
        return dict(lr_scheduler='factor', lr_step=self.step, lr_factor=self.factor,
                    stop_factor_lr=self.stop_factor_lr)


class MultiFactorScheduler(LRScheduler):
    """Multiplies the learning rate by `factor` at each update count in `step`.

    Parameters
    ----------
    step : list of int
        Increasing update counts.
    factor : float, optional
        The factor.
    **kw
        See :class:`LRScheduler`.
    """
    def __init__(self, step, factor=1.0, **kw):
        super().__init__(**kw)
        self.steps, self.factor = list(step), factor

    def _schedule(self):
        return dict(lr_scheduler='multifactor', lr_steps=self.steps, lr_factor=self.factor)


class CosineScheduler(LRScheduler):
    """Cosine decay from the base rate to `final_lr` over `max_update` updates.

    Parameters
    ----------
    max_update : int
        Updates of the decay.
    final_lr : float, optional
        The final learning rate.
    **kw
        See :class:`LRScheduler`.
    """
    def __init__(self, max_update, final_lr=0.0, **kw):
        super().__init__(**kw)
        self.max_update, self.final_lr = max_update, final_lr

    def _schedule(self):
        return dict(lr_scheduler='cosine', max_update=self.max_update, final_lr=self.final_lr)
