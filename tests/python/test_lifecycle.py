"""A store's last reference dropped on one of pskv's own threads (inside its
updater, on the store's engine thread) must neither hang nor abort: closing there
waited for the running operation from inside it (a hang until the timeout), and
the engine joined its own thread (an abort of the whole test run, seen once)."""
import os
import subprocess
import sys
import textwrap

from conftest import BUILD


def test_store_dropped_inside_its_own_updater_does_not_abort():
    code = textwrap.dedent('''
        import gc, sys
        import numpy as np
        import pskv
        holder = [pskv.create('local')]
        done = []
        def upd(key, grad, weight):
            holder.clear()  # the last reference to the store goes away on its engine thread
            gc.collect()
            weight[:] += grad
            done.append(1)
        holder[0].set_updater(upd)
        holder[0].init(0, np.zeros(2, dtype=np.float32))
        holder[0].push(0, np.ones(2, dtype=np.float32))  # the updater runs on the engine
        import time
        for _ in range(100):  # bounded: 10 s
            if done:
                break
            time.sleep(0.1)
        assert done, 'the updater never finished: closing the store inside it blocked'
        kv2 = pskv.create('local')  # closes the dropped store on this (main) thread
        kv2.init(1, np.ones(3, dtype=np.float32))
        out = np.zeros(3, dtype=np.float32)
        kv2.pull(1, out)
        kv2.wait_all()
        assert out.tolist() == [1, 1, 1]
        print('ok')
    ''')
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    r = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'ok' in r.stdout
