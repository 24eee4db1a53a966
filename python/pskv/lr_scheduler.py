"""Learning-rate schedules (MXNet's names); run by the C++ optimizer."""


class LRScheduler(object):
    def __init__(self, warmup_steps=0, warmup_begin_lr=0.0):
        self.warmup_steps = warmup_steps
        self.warmup_begin_lr = warmup_begin_lr

    def params(self, base_lr):
        return {'warmup_steps': self.warmup_steps, 'warmup_begin_lr': self.warmup_begin_lr}


class FactorScheduler(LRScheduler):
    def __init__(self, step, factor=1.0, stop_factor_lr=1e-8, **kw):
        super().__init__(**kw)
        self.step, self.factor, self.stop_factor_lr = step, factor, stop_factor_lr

    def params(self, base_lr):
        p = super().params(base_lr)
        p.update(lr_scheduler='factor', lr_step=self.step, lr_factor=self.factor,
                 stop_factor_lr=self.stop_factor_lr)
        return p


class MultiFactorScheduler(LRScheduler):
    def __init__(self, step, factor=1.0, **kw):
        super().__init__(**kw)
        self.steps, self.factor = list(step), factor

    def params(self, base_lr):
        p = super().params(base_lr)
        p.update(lr_scheduler='multifactor', lr_steps=self.steps, lr_factor=self.factor)
        return p


class CosineScheduler(LRScheduler):
    def __init__(self, max_update, final_lr=0.0, **kw):
        super().__init__(**kw)
        self.max_update, self.final_lr = max_update, final_lr

    def params(self, base_lr):
        p = super().params(base_lr)
        p.update(lr_scheduler='cosine', max_update=self.max_update, final_lr=self.final_lr)
        return p
