from . import data as data, lr_scheduler as lr_scheduler, optimizer as optimizer
from ._pskv import (ConfigError as ConfigError, Error as Error, InvalidArgument as InvalidArgument,
                    IOError as IOError, KeyError as KeyError, NodeFailure as NodeFailure,
                    ProtocolError as ProtocolError, ShapeError as ShapeError, TimeoutError as TimeoutError,
                    UsageError as UsageError, DeviceUnavailable as DeviceUnavailable, DeviceError as DeviceError,
                    DeviceArray as DeviceArray)
from . import cuda as cuda
from .kvstore import KVStore as KVStore, create as create
from . import kvstore as kv
from . import sparse as sparse
from . import embedding as embedding
from .sparse import RowSparseArray as RowSparseArray, row_sparse_array as row_sparse_array
from . import process as process
from .process import configure_process as configure_process

__version__: str
__all__: list[str]
