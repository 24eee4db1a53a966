"""No call corrupts memory or kills the process (issue 22, item 5): each case below
crashed, hung or silently changed memory before its fix; each runs in a fresh
interpreter with glibc's MALLOC_PERTURB_ (freed memory is scribbled over), so a
crash fails the test instead of pytest."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pskv

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(pskv.__file__)))
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR',
                                       os.path.join(os.path.dirname(__file__), '..', '..', 'build')))


def run_isolated(code, timeout=90, env=None):
    """Runs `code` in a fresh interpreter; returns (returncode, output)."""
    e = dict(os.environ, PYTHONPATH=PKG_PARENT, MALLOC_PERTURB_='165', MALLOC_CHECK_='3')
    e.update(env or {})
    p = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode()


def test_row_sparse_shape_whose_bytes_overflow_is_a_shape_error():
    # (2^53, 256) float64: 2^61 elements pass an element-count check, but 2^64 bytes
    # wrapped to 0: a 64-byte table, a 2 KiB row copied before it, a crash at close.
    rc, out = run_isolated('''
        import numpy as np, pskv
        kv = pskv.create('local')
        big = (2 ** 53, 256)
        try:
            kv.init(0, pskv.row_sparse_array((np.ones((1, 256)), np.array([5])), shape=big))
        except pskv.ShapeError as e:
            print('ShapeError:', e)
        kv.init(1, pskv.row_sparse_array((np.ones((1, 4)), np.array([5])), shape=(8, 4)))
        print(kv.row_sparse_pull(1, row_ids=np.array([5])).data.tolist())
        kv.close()
        print('closed')
    ''')
    assert rc == 0, out
    assert 'ShapeError:' in out and 'bytes' in out, out
    assert '[[1.0, 1.0, 1.0, 1.0]]' in out and 'closed' in out, out


def test_close_while_other_threads_wait_in_the_store():
    # Threads blocked in wait_all() while another thread closes the store: close
    # freed the engine under them (SIGSEGV with MALLOC_PERTURB_, every run).
    rc, out = run_isolated('''
        import threading, time
        import numpy as np, pskv
        for it in range(20):
            kv = pskv.create('local')
            kv.init(0, np.zeros(4, np.float32))
            raw = kv._kv
            errors = []
            def waiter():
                while True:
                    try:
                        raw.wait_all()
                    except pskv.UsageError as e:
                        errors.append(str(e))
                        return
            ts = [threading.Thread(target=waiter) for _ in range(4)]
            for t in ts:
                t.start()
            for _ in range(50):
                kv.push(0, np.ones(4, np.float32))
            time.sleep(0.02)
            kv.close()
            for t in ts:
                t.join(30)
            assert not any(t.is_alive() for t in ts), 'a waiter hangs'
            assert len(errors) == 4 and all('closed' in e for e in errors), errors
        print('ok')
    ''', timeout=120)
    assert rc == 0, out
    assert 'ok' in out, out


def test_close_while_another_thread_is_in_barrier(tmp_path):
    # dist_sync, 2 workers: worker 0 has a thread in barrier() (worker 1 comes 2 s
    # later) and closes the store meanwhile. Close waits for the barrier to return.
    script = textwrap.dedent('''
        import threading, time
        import numpy as np, pskv
        kv = pskv.create('dist_sync')
        if kv.rank == 1:
            time.sleep(2.0)
            kv.barrier()
            kv.close()
            print('worker 1 closed', flush=True)
        else:
            result = []
            def in_barrier():
                try:
                    kv._kv.barrier()
                    result.append('returned')
                except pskv.Error as e:
                    result.append('%s: %s' % (type(e).__name__, e))
            t = threading.Thread(target=in_barrier)
            t.start()
            time.sleep(0.5)
            kv.close()
            t.join(30)
            print('worker 0 closed, barrier:', result, flush=True)
    ''')
    path = str(tmp_path / 'close_in_barrier_check.py')
    with open(path, 'w') as f:
        f.write(script)
    env = dict(os.environ, PYTHONPATH=PKG_PARENT, MALLOC_PERTURB_='165')
    cmd = [os.path.join(BUILD, 'pskv-launch'), '-n', '2', '-s', '1', '--timeout', '60', '--',
           sys.executable, path]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert "worker 0 closed, barrier: ['returned']" in out and 'worker 1 closed' in out, out


def test_close_inside_the_updater_is_a_usage_error():
    # The updater runs on the store's engine thread: closing there made that thread
    # wait for itself (a long hang), then join itself (abort).
    rc, out = run_isolated('''
        import numpy as np, pskv
        kv = pskv.create('local')
        kv.init(0, np.zeros(2, np.float32))
        seen = []
        def upd(key, grad, weight):
            for call in (kv.close, kv.wait_all, lambda: kv.wait(0)):
                try:
                    call()
                    seen.append('no error')
                except pskv.UsageError as e:
                    seen.append('UsageError: %s' % e)
            weight[:] += grad
        kv.set_updater(upd)
        kv.push(0, np.ones(2, np.float32))
        out = np.zeros(2, np.float32)
        kv.pull(0, out=out)
        kv.wait_all()
        print(seen)
        print(out.tolist())
        kv.close()
        print('closed')
    ''', timeout=60)
    assert rc == 0, out
    assert out.count('UsageError') == 3 and 'updater' in out, out
    assert '[1.0, 1.0]' in out and 'closed' in out, out


def test_updater_view_kept_after_close_stays_valid():
    # numpy views given to an updater pointed into the store's memory without an
    # owner: a view kept by the updater read freed memory after close.
    rc, out = run_isolated('''
        import gc
        import numpy as np, pskv
        kv = pskv.create('local')
        kv.init(0, np.zeros(1 << 16, np.float32))
        kept = []
        def upd(key, grad, weight):
            weight[:] += grad
            kept.append(weight)
            kept.append(grad)
        kv.set_updater(upd)
        kv.push(0, np.full(1 << 16, 3, np.float32))
        kv.wait_all()
        kv.close()
        del kv
        gc.collect()
        junk = [np.full(1 << 16, 7, np.float32) for _ in range(8)]  # reuse freed memory
        print(float(kept[0].min()), float(kept[0].max()), float(kept[1].max()))
        kept[0][:] = 1  # writing to it is safe as well
        print('ok')
    ''')
    assert rc == 0, out
    assert '3.0 3.0 3.0' in out and 'ok' in out, out


def test_optimizer_update_refuses_read_only_weights(tmp_path):
    # an immutable bytes object was changed in place
    frozen = np.frombuffer(bytes(16), np.float32)
    opt = pskv.optimizer.SGD(learning_rate=0.1)
    upd = opt.create_updater()
    with pytest.raises(pskv.InvalidArgument, match='read-only'):
        upd(0, np.ones(4, np.float32), frozen)
    assert (frozen == 0).all()
    native = pskv._pskv.Optimizer('sgd', {'learning_rate': '0.1'})
    with pytest.raises(pskv.InvalidArgument, match='read-only'):
        native.update(0, np.ones(4, np.float32), frozen)
    assert (frozen == 0).all()
    # A writable weight still works.
    w = np.zeros(4, np.float32)
    upd(0, np.ones(4, np.float32), w)
    assert np.allclose(w, -0.1)


def test_optimizer_update_of_a_read_only_memmap_does_not_crash(tmp_path):
    path = str(tmp_path / 'w.bin')
    np.zeros(4, np.float32).tofile(path)
    rc, out = run_isolated('''
        import numpy as np, pskv
        mm = np.memmap(%r, np.float32, mode='r')
        opt = pskv.optimizer.SGD(learning_rate=0.1)
        try:
            opt.create_updater()(0, np.ones(4, np.float32), mm)
        except pskv.InvalidArgument as e:
            print('InvalidArgument:', e)
    ''' % path)
    assert rc == 0, out
    assert 'InvalidArgument:' in out, out


@pytest.mark.parametrize('dtype', [np.uint64, np.uint32, np.uint16, np.int16, np.uint8, np.int32])
def test_row_ids_of_every_integer_dtype(dtype):
    # uint64 ids were refused although "any integer dtype" is documented
    kv = pskv.create('local')
    kv.init('emb', pskv.row_sparse_array(np.arange(32, dtype=np.float32).reshape(8, 4)))
    ids = np.array([6, 2, 6], dtype)
    out = kv.row_sparse_pull('emb', row_ids=ids)
    assert out.indices.tolist() == [2, 6]
    kv.push('emb', (np.ones((2, 4), np.float32), np.array([1, 3], dtype)))
    assert kv.row_sparse_pull('emb', row_ids=np.array([1, 3], dtype)).data.tolist() == [[1] * 4] * 2
    kv.close()


def test_row_ids_out_of_int64_range_and_floats_are_refused():
    kv = pskv.create('local')
    kv.init('emb', pskv.row_sparse_array(np.ones((8, 4), np.float32)))
    with pytest.raises(pskv.KeyError, match='out of range'):
        kv.row_sparse_pull('emb', row_ids=np.array([2 ** 63 + 5], np.uint64))
    with pytest.raises(pskv.KeyError, match='out of range'):
        kv.push('emb', (np.ones((1, 4), np.float32), np.array([2 ** 64 - 1], np.uint64)))
    # fractional floats were truncated silently (2.7 -> row 2): refused, naming the id
    for ids in (np.array([2.7]), np.array([1.0, 2.5], np.float32)):
        with pytest.raises(pskv.InvalidArgument, match='not a row number'):
            kv.row_sparse_pull('emb', row_ids=ids)
        with pytest.raises(pskv.InvalidArgument, match='not a row number'):
            kv.push('emb', (np.ones((1, 4), np.float32), ids))
        with pytest.raises(pskv.InvalidArgument, match='not a row number'):
            pskv.row_sparse_array((np.ones((1, 4), np.float32), ids), shape=(8, 4))
    # whole-valued floats are row numbers (MXNet's row ids are float32)
    assert kv.row_sparse_pull('emb', row_ids=np.array([2.0], np.float32)).indices.tolist() == [2]
    # empty ids of any dtype (np.array([]) is float64) are fine
    assert len(kv.row_sparse_pull('emb', row_ids=np.array([])).indices) == 0
    kv.close()


def test_split_batch_of_a_negative_size_is_invalid():
    with pytest.raises(pskv.InvalidArgument, match='>= 0'):
        pskv.data.split_batch(-4, 2, even_split=False)
    with pytest.raises(pskv.InvalidArgument, match='>= 0'):
        pskv.data.split_by_workload(-4, [1.0, 1.0])
    assert pskv.data.split_batch(0, 2, even_split=False) == [(0, 0), (0, 0)]


def test_native_store_collected_inside_its_own_updater():
    # The native store's last reference dropped on its engine thread (inside its
    # updater): destroying it there waited for the running operation (itself) until
    # the timeout, then joined its own thread. It is now closed on another thread.
    rc, out = run_isolated('''
        import gc, time
        import numpy as np
        from pskv import _pskv
        holder = [_pskv.KVStore.create('local')]
        done = []
        def upd(key, grad, weight):
            weight[:] += grad
            holder.clear()
            gc.collect()
            done.append(1)
        holder[0].set_updater(upd)
        holder[0].init([0], [np.zeros(2, np.float32)])
        holder[0].push([0], [np.ones(2, np.float32)], 0)
        for _ in range(100):
            if done:
                break
            time.sleep(0.1)
        assert done, 'the updater never finished'
        time.sleep(0.5)
        print('ok')
    ''', timeout=60)
    assert rc == 0, out
    assert 'ok' in out, out
