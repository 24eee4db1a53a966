from typing import Any, Optional, Tuple, Union

import numpy as np

from .kvstore import KVStore

class EmbeddingTable:
    @property
    def key(self) -> int: ...
    @property
    def width(self) -> int: ...
    def pull(self, ids: Any, timeout: float = ...,
             versions: bool = ...) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]: ...
    def push(self, ids: Any, grads: Any, timeout: float = ...) -> None: ...

def create(kv: KVStore, key: int, width: int, name: Optional[str] = ..., optimizer: str = ...,
           optimizer_params: Optional[dict[str, Any]] = ..., init: str = ...,
           init_range: Tuple[float, float] = ..., seed: int = ..., admit_after: int = ...,
           bloom_ids: Optional[int] = ..., bloom_fpr: float = ..., unadmitted: str = ...,
           ttl_steps: int = ..., capacity: int = ..., max_bytes: int = ...) -> EmbeddingTable: ...
def EmbeddingBag(table: EmbeddingTable, mode: str = ...) -> Any: ...
