"""pskv's device runtime: which devices there are, whether they are simulated, and
the bytes its copies moved (include/pskv/device.h, docs/gpu.md).

With ``PSKV_SIM_DEVICES=k`` in the environment (or :func:`use_simulated_devices` before
the first device use) the devices ``cuda:0 .. cuda:k-1`` are pskv's simulated devices:
multi-device code runs on a machine without a GPU, with device memory the host cannot
read (a host read faults) and exact copy counters::

    PSKV_SIM_DEVICES=4 python3 train.py

Arrays on devices are :class:`pskv.DeviceArray`; the stores take them in their value
lists (one key, k devices: ``kv.push(k, [g0, g1])`` sums them).
"""
from . import _pskv

_c = _pskv.cuda


def built():
    """Whether pskv was compiled with CUDA (does not touch the driver).

    Returns
    -------
    bool
    """
    return _c.built()


def simulated():
    """Whether the devices are pskv's simulated ones (``PSKV_SIM_DEVICES``).

    Initialises the device runtime on the first call.

    Returns
    -------
    bool
    """
    return _c.simulated()


def available():
    """Whether a real GPU is usable: False with simulated devices or none.

    Returns
    -------
    bool
    """
    return _c.device_count() > 0 and not _c.simulated()


def device_count():
    """The number of usable devices (simulated or real); 0 when there is none.

    Returns
    -------
    int
    """
    return _c.device_count()


def status():
    """One line about the devices, for messages and test skips: ``'3 simulated
    devices (...)'``, ``'1 device: NVIDIA H200'``, or why there is none.

    Returns
    -------
    str
    """
    return _c.status()


def device_name(device_id):
    """The name of device `device_id` (``'simulated device 1'``, ``'NVIDIA H200'``).

    Parameters
    ----------
    device_id : int
        The device.

    Returns
    -------
    str

    Raises
    ------
    pskv.DeviceUnavailable
        No such device.
    """
    return _c.device_name(int(device_id))


def use_simulated_devices(devices, jitter_seed=0):
    """Switches this process to `devices` simulated devices (as ``PSKV_SIM_DEVICES``).

    Parameters
    ----------
    devices : int
        How many, 1 .. 64.
    jitter_seed : int, optional
        Nonzero: random delays on every simulated stream (as ``PSKV_SIM_JITTER``), so
        that a missing wait shows up as a wrong value.

    Raises
    ------
    pskv.UsageError
        A device was used before (the runtime is chosen once per process), unless it
        already simulates that many.
    """
    _c.use_simulated_devices(int(devices), int(jitter_seed))


def stats():
    """The bytes and counts of the copies the device runtime made since the start
    (or :func:`reset_stats`), and its kernel launches.

    Returns
    -------
    dict
        ``d2h_bytes``, ``d2h_count``, ``h2d_bytes``, ``h2d_count``, ``d2d_bytes``,
        ``d2d_count`` (within a device), ``peer_bytes``, ``peer_count`` (between
        devices), ``kernel_launches``.
    """
    return _c.stats()


def reset_stats():
    """Sets the counters of :func:`stats` to zero."""
    _c.reset_stats()
