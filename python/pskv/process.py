"""Process-wide settings of a program that uses pskv: its log lines, the timeline and
metrics (``PSKV_LOG_LEVEL``, ``PSKV_TIMELINE``, ``PSKV_METRICS_PORT``,
``PSKV_METRICS_FILE``) and glibc's allocator.

``import pskv`` changes none of them, and neither does the C++ library when it creates
a store (include/pskv/process.h). They are the program's: call :func:`configure_process`
at the start of a training script. A script that does not gets the logging, timeline
and metrics the environment asks for when it creates its first dist store (the
package's one implicit call, :func:`pskv.create`), but never a tuned allocator.

Examples
--------
>>> import pskv
>>> pskv.configure_process()              # the PSKV_* variables take effect
"""
import threading

from . import _pskv

_lock = threading.Lock()
_configured = False


def configure_process(tune_allocator=False):
    """Configures this process as the ``PSKV_*`` environment variables say:
    log levels per module (``PSKV_LOG_LEVEL``); log lines named after the process's
    node (``[worker[1]]``) once it has joined its job; the timeline
    (``PSKV_TIMELINE``) and the metrics (``PSKV_METRICS_PORT``, served by a thread of
    the process, and ``PSKV_METRICS_FILE``, written at exit). The first call sets up
    the timeline and metrics; later calls only change the log levels.

    Parameters
    ----------
    tune_allocator : bool, optional
        Also make glibc serve large messages from its heaps and keep freed memory
        for reuse (``M_MMAP_THRESHOLD`` 8 MiB, ``M_TRIM_THRESHOLD`` 512 MiB): faster
        for tensors of megabytes, at the cost of a larger resident heap. Off unless
        asked: it changes every allocation of the process, PyTorch's too.

    Raises
    ------
    pskv.ConfigError
        A malformed ``PSKV_LOG_LEVEL``.
    pskv.IOError
        The timeline cannot be written, or no port near ``PSKV_METRICS_PORT`` is free.
    """
    global _configured
    with _lock:
        _pskv.configure_process()
        _configured = True
    if tune_allocator:
        _pskv.tune_allocator()


def _configure_once():
    """configure_process(), unless the program called it already (pskv.create of a
    dist store)."""
    with _lock:
        if _configured:
            return
    configure_process()
