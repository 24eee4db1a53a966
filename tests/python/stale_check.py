"""Stale-read scenarios of a real dist job (run by pskv-launch as every worker;
test_stale_reads.py starts it with PSKV_TEST_REPLY_DELAY, so the servers hold every
reply for a while: a call that returned before its result landed would leave old
bytes in its output, and these checks read the outputs right after each call)."""
import os
import sys

import numpy as np
import torch

import pskv

N = 1 << 12


def check(cond, msg):
    if not cond:
        print('CHECK FAILED:', msg, flush=True)
        os._exit(1)  # at once: closing the store would wait for the other workers


def pull_after_init(kv):
    kv.init('i', np.ones(4, np.float32))
    a = np.zeros(4, np.float32)
    kv.pull('i', out=a)
    check(a.tolist() == [1, 1, 1, 1], 'pull after init read %s' % a)


def rounds(kv):
    """MXNet's loop: push, pull, read; every round, on every worker."""
    n = kv.num_workers
    kv.init('r', np.zeros(N, np.float32))
    out = np.zeros(N, np.float32)
    for r in range(1, 8):
        kv.push('r', np.full(N, r, np.float32))
        kv.pull('r', out=out)
        check((out == n * r).all(), 'round %d: pull read %s, want %s' % (r, out[0], n * r))


def pushpull_in_place(kv):
    n = kv.num_workers
    kv.init(['p', 'q'], [np.zeros(N, np.float32), np.zeros(N, np.float32)])
    for r in range(1, 4):
        g = np.full(N, r, np.float32)
        kv.pushpull('p', g)
        check((g == n * r).all(), 'pushpull in place, round %d: %s' % (r, g[0]))
        t, o = torch.full((N,), float(r)), torch.zeros(N)
        kv.pushpull('q', t, out=o)
        check(bool((o == n * r).all()), 'pushpull into a torch out, round %d: %s' % (r, o[0]))
        t.fill_(-1)  # the input may be reused at once: it was read
    got = np.zeros(N, np.float32)
    kv.pull('q', out=got)
    check((got == n * 3).all(), 'the inputs were changed after the calls returned: %s' % got[0])


def lists(kv):
    """Lists of keys, several outputs per key, several values per key (summed)."""
    n = kv.num_workers
    keys = ['l%d' % i for i in range(5)]
    kv.init(keys, [np.zeros(8, np.float32) for _ in keys])
    kv.push(keys, [[np.full(8, i, np.float32), np.ones(8, np.float32)] for i in range(5)])
    outs = [[np.zeros(8, np.float32), torch.zeros(8)] for _ in keys]
    kv.pull(keys, out=outs)
    for i, (a, b) in enumerate(outs):
        check((a == n * (i + 1)).all() and bool((b == n * (i + 1)).all()), 'key %d of a list: %s %s'
              % (i, a[0], b[0]))


def broadcast(kv):
    v = np.full(6, 3.0 + kv.rank, np.float32)  # rank 0's value wins
    out = [np.zeros(6, np.float32), torch.zeros(6)]
    kv.broadcast('b', v, out=out)
    check((out[0] == 3).all() and bool((out[1] == 3).all()), 'broadcast read %s %s' % (out[0], out[1]))


def row_sparse(kv):
    n = kv.num_workers
    kv.init('s', pskv.row_sparse_array(np.zeros((10, 3), np.float32)))
    kv.push('s', pskv.RowSparseArray(np.ones((2, 3), np.float32), [1, 4], (10, 3)))
    got = kv.row_sparse_pull('s', row_ids=np.array([4, 1, 7]))
    check(got.indices.tolist() == [1, 4, 7], 'row_sparse_pull rows %s' % got.indices)
    check(got.data[:2].tolist() == [[n] * 3] * 2 and got.data[2].tolist() == [0] * 3,
          'row_sparse_pull read %s' % got.data)


def two_stores(kv):
    """Two stores of the job in one process, used in turn."""
    n = kv.num_workers
    kv2 = pskv.create('dist_sync')
    kv.init('t', np.zeros(4, np.float32))
    kv2.init('t', np.full(4, 100, np.float32))
    a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
    for r in range(1, 3):
        kv.push('t', np.full(4, r, np.float32))
        kv2.pull('t', out=b)
        kv.pull('t', out=a)
        check((a == n * r).all() and (b == 100).all(), 'two stores, round %d: %s %s' % (r, a[0], b[0]))
    kv2.close()


def threads(kv):
    """Plain calls of several threads on one key: each is complete and right (a wait
    that found the key busy again because of another thread once broke the store)."""
    import threading
    kv.init('th', np.full(1024, 3, np.float32))
    errors = []

    def loop():
        x = np.zeros(1024, np.float32)
        for _ in range(300):
            try:
                kv.pull('th', out=x)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e)[:200])
                return
            if not (x == 3).all():
                errors.append('read %s' % x[0])
                return
    ts = [threading.Thread(target=loop) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    check(not errors, 'plain calls of 3 threads: %s' % errors[:3])


SCENARIOS = {'threads': threads, 'pull_after_init': pull_after_init, 'rounds': rounds, 'pushpull_in_place': pushpull_in_place,
             'lists': lists, 'broadcast': broadcast, 'row_sparse': row_sparse, 'two_stores': two_stores}

if __name__ == '__main__':
    kv = pskv.create('dist_sync')
    for name in sys.argv[1].split(','):
        SCENARIOS[name](kv)
        print('worker %d: %s passed' % (kv.rank, name), flush=True)
    kv.close()
