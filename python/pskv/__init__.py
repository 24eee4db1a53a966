"""pskv: a parameter server for data-parallel training, with MXNet's ``mx.kv`` API.

Examples
--------
>>> import numpy as np, pskv
>>> kv = pskv.create('local')              # 'device', 'dist_sync', 'dist_async', ...
>>> kv.init(3, np.ones((2, 3), np.float32))
>>> kv.push(3, [np.ones((2, 3), np.float32)] * 2)   # the values of one key are summed
>>> out = np.zeros((2, 3), np.float32)
>>> kv.pull(3, out=out)                    # written in place: out holds the value now
>>> float(out[0, 0])
2.0

Values are numpy arrays or PyTorch CPU tensors (shared, never copied), or arrays on
devices (:class:`pskv.DeviceArray`, or any ``__cuda_array_interface__`` array; see
:mod:`pskv.cuda`, and ``PSKV_SIM_DEVICES=k`` for simulated devices). Every call is
complete when it returns; ``with kv.batch():`` issues many calls that travel together
and are waited for once, at the end of the block (see :meth:`pskv.KVStore.batch`). Submodules:
:mod:`pskv.optimizer`, :mod:`pskv.lr_scheduler`, :mod:`pskv.data`, :mod:`pskv.process`
(:func:`pskv.configure_process`: logging, metrics and the allocator are the program's)
and :mod:`pskv.torch` (imported on demand: it needs PyTorch), :mod:`pskv.cuda` (the device runtime).
"""
import sys as _sys

from ._version import __version__  # noqa: F401

try:
    import numpy as _np  # noqa: F401
except ImportError as _e:
    raise ImportError(
        'pskv %s needs numpy, which this interpreter (%s) does not have. Use the interpreter pskv was '
        'installed for: a venv made with `/usr/bin/python3 -m venv --system-site-packages` sees Debian\'s '
        'python3-numpy and python3-torch (see python/README.md)' % (__version__, _sys.executable)) from _e

try:
    from ._pskv import (Error, InvalidArgument, KeyError, ShapeError, UsageError, ConfigError,  # noqa: F401
                        TimeoutError, ProtocolError, NodeFailure, IOError, DeviceUnavailable, DeviceError,
                        DeviceArray)
except ImportError as _e:  # the extension was built for another interpreter, or not at all
    raise ImportError(
        'pskv %s: cannot load its C++ extension (%s). It must be built for this interpreter (%s, Python %d.%d): '
        'install with `%s -m pip install --no-build-isolation .` from the pskv source tree (in a venv made with '
        '`/usr/bin/python3 -m venv --system-site-packages`, where Debian\'s numpy and torch are visible), or '
        'build with CMake and use the interpreter CMake built for (/usr/bin/python3 by default)'
        % (__version__, _e, _sys.executable, _sys.version_info[0], _sys.version_info[1], _sys.executable)) from _e
from .kvstore import KVStore, create  # noqa: F401
from . import kvstore as kv  # noqa: F401  (MXNet's mx.kv: `import pskv as mx; mx.kv.create('local')`)
from . import optimizer  # noqa: F401
from . import lr_scheduler  # noqa: F401
from . import data  # noqa: F401
from . import sparse  # noqa: F401
from . import embedding  # noqa: F401
from .sparse import RowSparseArray, row_sparse_array  # noqa: F401
from . import process  # noqa: F401
from .process import configure_process  # noqa: F401
from . import cuda  # noqa: F401

__all__ = ["__version__", "create", "KVStore", "configure_process", "process", "RowSparseArray", "row_sparse_array", "embedding", "optimizer", "lr_scheduler", "data", "Error", "InvalidArgument",
           "KeyError", "ShapeError", "UsageError", "ConfigError", "TimeoutError", "ProtocolError", "NodeFailure",
           "IOError", "DeviceUnavailable", "DeviceError", "DeviceArray", "cuda"]
