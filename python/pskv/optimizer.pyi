from typing import Any, Callable, Optional

import numpy as np

from .lr_scheduler import LRScheduler

class Optimizer:
    name: Optional[str]
    learning_rate: float
    wd: float
    rescale_grad: float
    clip_gradient: Optional[float]
    multi_precision: bool
    lr_scheduler: Optional[LRScheduler]
    kwargs: dict[str, Any]
    def __init__(self, learning_rate: float = ..., wd: float = ..., rescale_grad: float = ...,
                 clip_gradient: Optional[float] = ..., multi_precision: bool = ...,
                 lr_scheduler: Optional[LRScheduler] = ..., **kwargs: Any) -> None: ...
    def params(self) -> dict[str, str]: ...
    def create_updater(self) -> Callable[[int, np.ndarray, np.ndarray], None]: ...

class SGD(Optimizer):
    def __init__(self, momentum: float = ..., lazy_update: bool = ..., **kwargs: Any) -> None: ...

class NAG(Optimizer):
    def __init__(self, momentum: float = ..., **kwargs: Any) -> None: ...

class Adam(Optimizer):
    def __init__(self, learning_rate: float = ..., beta1: float = ..., beta2: float = ..., epsilon: float = ...,
                 **kwargs: Any) -> None: ...

class AdamW(Adam): ...

class RMSProp(Optimizer):
    def __init__(self, learning_rate: float = ..., rho: float = ..., epsilon: float = ..., centered: bool = ...,
                 momentum: float = ..., **kwargs: Any) -> None: ...

class AdaGrad(Optimizer):
    def __init__(self, epsilon: float = ..., **kwargs: Any) -> None: ...

def create(name: str, **kwargs: Any) -> Optimizer: ...
