from typing import Any, Callable, Optional, Union

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
    idx2name: dict[int, str]
    lr_mult: dict[Union[int, str], float]
    wd_mult: dict[Union[int, str], float]
    def __init__(self, learning_rate: Optional[float] = ..., wd: Optional[float] = ...,
                 rescale_grad: Optional[float] = ...,
                 clip_gradient: Optional[float] = ..., multi_precision: bool = ...,
                 lr_scheduler: Optional[LRScheduler] = ..., param_idx2name: Optional[dict[int, str]] = ...,
                 **kwargs: Any) -> None: ...
    def params(self, key_ids: Optional[dict[str, int]] = ...) -> dict[str, str]: ...
    def set_lr_mult(self, args_lr_mult: dict[Union[int, str], float]) -> None: ...
    def set_wd_mult(self, args_wd_mult: dict[Union[int, str], float]) -> None: ...
    @property
    def lr(self) -> float: ...
    @lr.setter
    def lr(self, value: float) -> None: ...
    def set_learning_rate(self, lr: float) -> None: ...
    def create_updater(self) -> Callable[[int, np.ndarray, np.ndarray], None]: ...

class SGD(Optimizer):
    def __init__(self, momentum: Optional[float] = ..., lazy_update: Optional[bool] = ..., **kwargs: Any) -> None: ...

class NAG(Optimizer):
    def __init__(self, momentum: Optional[float] = ..., **kwargs: Any) -> None: ...

class Adam(Optimizer):
    def __init__(self, learning_rate: Optional[float] = ..., beta1: Optional[float] = ...,
                 beta2: Optional[float] = ..., epsilon: Optional[float] = ..., **kwargs: Any) -> None: ...

class AdamW(Adam): ...

class RMSProp(Optimizer):
    def __init__(self, learning_rate: Optional[float] = ..., rho: Optional[float] = ...,
                 epsilon: Optional[float] = ..., centered: Optional[bool] = ..., momentum: Optional[float] = ...,
                 **kwargs: Any) -> None: ...

class AdaGrad(Optimizer):
    def __init__(self, epsilon: Optional[float] = ..., **kwargs: Any) -> None: ...

def create(name: str, **kwargs: Any) -> Optimizer: ...
def params(name: str = ...) -> list[dict[str, str]]: ...

def from_torch(torch_optimizer: Any) -> Optimizer: ...
