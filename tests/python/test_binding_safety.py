"""The binding refuses bad input with typed errors instead of crashing or silently
misreading: out-of-range int keys, read-only outputs, non-native byte order."""
import os
import subprocess
import sys

import numpy as np
import pytest

import pskv

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))


def run_isolated(code):
    """Runs code in a fresh interpreter (a crash there fails the test, not pytest)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    return subprocess.run([sys.executable, '-c', code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=60)


@pytest.mark.parametrize('key', [-1, 2 ** 31, 2 ** 40, 2 ** 70])
@pytest.mark.parametrize('op', ['init', 'push', 'pull', 'pushpull', 'wait'])
def test_out_of_range_int_key_is_a_key_error(key, op):
    code = '''
import numpy as np, pskv
kv = pskv.create('local')
kv.init(3, np.ones(2, np.float32))
a = np.ones(2, np.float32)
try:
    if '{op}' == 'init': kv.init({key}, a)
    elif '{op}' == 'push': kv.push({key}, a)
    elif '{op}' == 'pull': kv.pull({key}, out=a)
    elif '{op}' == 'pushpull': kv.pushpull({key}, a)
    else: kv.wait({key})
except pskv.KeyError as e:
    print('KeyError:', e)
'''.format(op=op, key=key)
    p = run_isolated(code)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert 'KeyError:' in out and str(key) in out, out


def test_key_error_in_process_and_store_still_usable():
    kv = pskv.create('local')
    kv.init(3, np.ones(2, np.float32))
    with pytest.raises(pskv.KeyError, match='out of range'):
        kv.push(2 ** 31, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    kv.pull(3, out=out)
    kv.wait_all()
    assert (out == 1).all()


@pytest.mark.parametrize('kvtype', ['local', 'device'])
def test_read_only_output_is_refused(kvtype):
    kv = pskv.create(kvtype)
    kv.init(0, np.full(2, 5, np.float32))
    ro = np.frombuffer(bytes(8), np.float32)
    assert not ro.flags.writeable
    with pytest.raises(pskv.InvalidArgument, match='read-only'):
        kv.pull(0, out=ro)
    with pytest.raises(pskv.InvalidArgument, match='read-only'):
        kv.pushpull(0, np.ones(2, np.float32), out=ro)
    with pytest.raises(pskv.InvalidArgument, match='read-only'):
        kv.pushpull(0, ro)  # in place into a read-only array
    assert (ro == 0).all()  # the immutable bytes were not written
    kv.push(0, ro)  # reading a read-only array is fine
    out = np.zeros(2, np.float32)
    kv.pull(0, out=out)
    kv.wait_all()
    assert (out == 0).all()


@pytest.mark.parametrize('dtype', ['>f4', '>f8', '>i4', '>i8'])
def test_big_endian_is_refused(dtype):
    kv = pskv.create('local')
    kv.init(0, np.zeros(3, np.dtype(dtype).newbyteorder('=')))
    be = np.arange(3).astype(dtype)
    with pytest.raises(pskv.InvalidArgument, match='byte order'):
        kv.push(0, be)
    with pytest.raises(pskv.InvalidArgument, match='byte order'):
        kv.init(1, be)
    with pytest.raises(pskv.InvalidArgument, match='byte order'):
        kv.pull(0, out=np.zeros(3, dtype))
    # converted, it works
    kv.push(0, be.astype(be.dtype.newbyteorder('=')))
    out = np.zeros(3, np.dtype(dtype).newbyteorder('='))
    kv.pull(0, out=out)
    kv.wait_all()
    assert out.tolist() == [0, 1, 2]
