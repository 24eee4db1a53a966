"""The distributed kvstore checks, from Python: run by pskv-launch as every worker
(and, with --server-command, as the servers: pskv.create runs their role)."""
import sys

import numpy as np

import pskv

SMALL, BIG = (3, 3), (50, 40)  # BIG is above the test's MXNET_KVSTORE_BIGARRAY_BOUND of 1000
RATE = 2.0


def full(v, shape):
    return np.full(shape, v, dtype=np.float32)


def check(cond, msg):
    if not cond:
        print('CHECK FAILED:', msg, flush=True)
        sys.exit(1)


def sync(kv, rounds=4):
    n, r = kv.num_workers, kv.rank
    tri = n * (n + 1) / 2
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-RATE))
    kv.init([3, 99], [full(1, SMALL), full(1, BIG)])
    for i in range(rounds):
        kv.push([3, 99], [[full(r + 1, SMALL)] * 2, full(r + 1, BIG)])
        a, b = full(0, SMALL), full(0, BIG)
        kv.pull([3, 99], out=[a, b])
        kv.wait_all()
        check((a == 1 + RATE * (i + 1) * tri * 2).all(), 'small key round %d: %s' % (i, a[0, 0]))
        check((b == 1 + RATE * (i + 1) * tri).all(), 'big key round %d: %s' % (i, b[0, 0]))
    kv.init(11, full(1, BIG))
    for i in range(rounds):
        d = full(r + 1, BIG)
        kv.pushpull(11, d)
        kv.wait_all()
        check((d == 1 + RATE * (i + 1) * tri).all(), 'pushpull round %d' % i)


def sync_str(kv, rounds=3):
    n, r = kv.num_workers, kv.rank
    tri = n * (n + 1) / 2
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-RATE))
    kv.init(['w', 'big'], [full(1, SMALL), full(1, BIG)])
    for i in range(rounds):
        kv.push(['w', 'big'], [full(r + 1, SMALL), full(r + 1, BIG)])
        a, b = full(0, SMALL), full(0, BIG)
        kv.pull(['w', 'big'], out=[a, b])
        kv.wait_all()
        check((a == 1 + RATE * (i + 1) * tri).all() and (b == a[0, 0]).all(), 'str keys round %d' % i)


def async_(kv, rounds=10):
    n, r = kv.num_workers, kv.rank
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-1.0))
    kv.init([3, 99], [full(1, SMALL), full(1, BIG)])
    for _ in range(rounds):
        kv.push([3, 99], [full(r + 1, SMALL), full(r + 1, BIG)])
    kv.wait()
    kv.barrier()
    a, b = full(0, SMALL), full(0, BIG)
    kv.pull([3, 99], out=[a, b])
    kv.wait_all()
    want = 1 + rounds * n * (n + 1) / 2
    check((a == want).all() and (b == want).all(), 'async: %s %s vs %s' % (a[0, 0], b[0, 0], want))
    kv.barrier()


def compression(kv):
    n, r = kv.num_workers, kv.rank
    kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-1.0))
    kv.init([3, 99], [full(0, SMALL), full(0, BIG)])
    residual = np.zeros(n, np.float32)
    expect = np.float32(0)
    for base in [0.4, 0.1, 0.5, 0.7, -0.3, -0.3, -2.0, 0.25]:
        for w in range(n):  # MXNet's 2-bit formula, per worker, float32
            residual[w] += np.float32(base) * np.float32(w + 1)
            if residual[w] >= 0.5:
                residual[w] -= np.float32(0.5)
                expect += np.float32(0.5)
            elif residual[w] <= -0.5:
                residual[w] += np.float32(0.5)
                expect -= np.float32(0.5)
        kv.push(3, full(np.float32(base) * np.float32(r + 1), SMALL))
        a = full(0, SMALL)
        kv.pull(3, out=a)
        kv.wait_all()
        b = full(np.float32(base) * np.float32(r + 1), BIG)
        kv.pushpull(99, b)
        kv.wait_all()
        check((a == expect).all() and (b == expect).all(), 'compression: %s %s vs %s' % (a[0, 0], b[0, 0], expect))


SCENARIOS = {'sync': sync, 'sync_str': sync_str, 'async': async_, 'compression': compression}

if __name__ == '__main__':
    name = sys.argv[1]
    kind = 'dist_async' if name == 'async' else 'dist_sync'
    kv = pskv.create(kind)  # servers started with this script never return from here
    SCENARIOS[name](kv)
    print('worker %d: %s passed' % (kv.rank, name), flush=True)
