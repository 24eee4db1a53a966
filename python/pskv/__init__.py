"""pskv: a parameter server for data-parallel training, with MXNet's ``mx.kv`` API.

    import pskv
    kv = pskv.create('dist_sync')          # 'local', 'device', 'dist_async', ...
    kv.init(3, numpy.ones((2, 3)))
    kv.push(3, [grad_dev0, grad_dev1])     # summed
    kv.pull(3, out=weights)                # written in place

Values are numpy arrays or PyTorch CPU tensors (shared, never copied).
"""
from ._pskv import (Error, InvalidArgument, KeyError, ShapeError, UsageError, ConfigError,  # noqa: F401
                    TimeoutError, ProtocolError, NodeFailure, IOError)
from .kvstore import KVStore, create  # noqa: F401
from . import optimizer  # noqa: F401
from . import lr_scheduler  # noqa: F401
from . import data  # noqa: F401

__all__ = ["create", "KVStore", "optimizer", "lr_scheduler", "data", "Error", "InvalidArgument", "KeyError",
           "ShapeError", "UsageError", "ConfigError", "TimeoutError", "ProtocolError", "NodeFailure",
           "IOError"]
