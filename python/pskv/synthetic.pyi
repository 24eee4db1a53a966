from typing import Iterator, Optional, Sequence

import numpy as np

CRITEO_VOCAB_SIZES: tuple[int, ...]

def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float: ...

class CriteoSynthetic:
    num_dense: int
    num_sparse: int
    num_samples: int
    seed: int
    zipf: float
    vocab_sizes: tuple[int, ...]
    begin: int
    end: int
    def __init__(self, num_samples: int, seed: int = ..., num_parts: int = ..., part_index: int = ...,
                 zipf: float = ..., vocab_sizes: Optional[Sequence[int]] = ..., weight_scale: float = ...) -> None: ...
    def __len__(self) -> int: ...
    def ids_of(self, feature: int, ranks: np.ndarray) -> np.ndarray: ...
    def read(self, begin: int, end: int, with_probability: bool = ...) -> tuple[np.ndarray, ...]: ...
    def batches(self, batch_size: int, with_probability: bool = ...) -> Iterator[tuple[np.ndarray, ...]]: ...
