"""kv.batch() under a real dist job (run by pskv-launch as every worker;
test_async.py starts it with PSKV_TEST_REPLY_DELAY, so the servers hold every reply
for a while and the calls of a batch are surely in flight inside it)."""
import gc
import os
import sys
import time
import weakref

import numpy as np
import torch

import pskv

N = 1 << 14  # floats per key: 64 KiB (one message: the servers delay each reply)


def check(cond, msg):
    if not cond:
        print('CHECK FAILED:', msg, flush=True)
        os._exit(1)  # at once: closing the store would wait for the other workers


def released(kv):
    """True once the store dropped the arrays of every finished call. A wait returns
    when the operations completed; pskv's threads drop their handles on the arrays
    right after, so this may take a moment (bounded: 10 s)."""
    for _ in range(200):
        if kv.pending == 0:
            return True
        time.sleep(0.05)
    return False


def returns_at_once(kv):
    """In a batch, pull returns while its reply is held by the server; the out is
    read-only inside the batch, and holds the result when the batch ends. Outside a
    batch the same pull returns with the result."""
    n = kv.num_workers
    kv.init('a', np.zeros(N, np.float32))
    out = np.full(N, -1, np.float32)
    with kv.batch() as b:
        b.push('a', np.ones(N, np.float32))
        b.pull('a', out=out)
        check(kv.pending >= 1, 'pull in a batch waited: nothing in flight after it returned')
        check(not out.flags.writeable, 'an out in flight is writable')
        try:
            out[0] = 5
            check(False, 'writing an out in flight did not raise')
        except ValueError:
            pass
    check(out.flags.writeable, 'the out stayed read-only after the batch')
    check((out == n).all(), 'after the batch: %s, want %s' % (out[:3], n))
    kv.push('a', np.full(N, 2, np.float32))  # no optimizer: the sum of the round is stored
    kv.pull('a', out=out)
    check(released(kv), 'a call outside a batch left arrays in flight')
    check((out == 2 * n).all(), 'outside a batch: %s, want %s' % (out[:3], 2 * n))


def ordering(kv):
    """Calls on one key run in issue order; results are there after wait_all."""
    n = kv.num_workers
    kv.init(['o', 'p'], [np.zeros(N, np.float32), np.zeros(4, np.float32)])
    outs = []
    q = np.zeros(4, np.float32)
    with kv.batch() as b:
        for i in range(1, 4):  # push, pull, push, pull, ... without waiting
            b.push('o', np.full(N, i, np.float32))
            o = np.zeros(N, np.float32)
            b.pull('o', out=o)
            outs.append(o)
            b.pushpull('p', np.full(4, i, np.float32), out=o[:4].copy())
        b.pull('p', out=q)
    for i, o in enumerate(outs, 1):
        check((o == i * n).all(), 'pull %d of the same key saw %s, want %s' % (i, o[0], i * n))
    check((q == 3 * n).all(), 'pull after pushpulls: %s' % q)


def lifetime(kv):
    """Arrays of calls in flight stay alive when the caller drops them (numpy outs,
    torch tensors, temporaries), and freed memory is not written afterwards."""
    n = kv.num_workers
    kv.init(['l1', 'l2', 'l3'], [np.zeros(N, np.float32)] * 3)
    batch = kv.batch()
    b = batch.__enter__()
    b.push('l1', np.full(N, 2, np.float32))  # a temporary input, dropped at once
    out = np.zeros(N, np.float32)
    t_out = torch.zeros(N)
    b.pull('l1', out=out)
    b.pushpull('l2', torch.ones(N), out=t_out)
    b.pushpull('l3', np.ones(N, np.float32))  # in place into a temporary
    # numpy: the array object itself is kept; torch: its storage (pskv holds a detached
    # alias of the tensor, so the tensor object may go, its memory may not).
    w_np, t_ptr = weakref.ref(out), t_out.data_ptr()
    check(kv.pending >= 3, 'calls finished before the server replied: %d pending' % kv.pending)
    del out, t_out
    gc.collect()
    check(w_np() is not None, 'a numpy out in flight was freed')
    # Memory a wrongly freed out would have given back: the late replies must not land here.
    churn = [np.full(N, 7, np.float32) for _ in range(8)]
    churn_t = [torch.full((N,), 7.0) for _ in range(8)]
    check(all(c.data_ptr() != t_ptr for c in churn_t), "a torch out's memory in flight was reused")
    batch.__exit__(None, None, None)
    check(all((c == 7).all() for c in churn), 'a reply was written into freed memory (numpy)')
    check(all(bool((c == 7).all()) for c in churn_t), 'a reply was written into freed memory (torch)')
    check(released(kv), '%d calls still held after wait_all' % kv.pending)
    gc.collect()
    check(w_np() is None, 'an out kept after its call finished (a leak)')
    got = np.zeros(N, np.float32)
    kv.pull(['l1'], out=[got])
    check((got == 2 * n).all(), 'pull after the lifetime checks: %s' % got[0])


def close_first(kv):
    """The store is closed inside a batch while calls are in flight and the caller
    dropped their arrays: close waits, then releases them; the batch's end is quiet."""
    kv.init('c', np.zeros(N, np.float32))
    with kv.batch() as b:
        out = np.zeros(N, np.float32)
        b.pushpull('c', np.ones(N, np.float32), out=out)
        w = weakref.ref(out)
        del out
        gc.collect()
        check(w() is not None, 'an out in flight was freed before close')
        kv.close()
    gc.collect()
    check(w() is None, 'close kept the out of a finished call')


class Recorder(object):
    """Forwards to the real native store and records its push/pull/wait calls."""

    def __init__(self, native):
        self._native, self.calls = native, []

    def __getattr__(self, name):
        f = getattr(self._native, name)
        if name in ('push', 'pull', 'pushpull', 'wait', 'wait_all', 'row_sparse_pull_start'):
            def rec(*a, **k):
                self.calls.append(name)
                return f(*a, **k)
            return rec
        return f


def trainer_step_calls(kv, uok):
    """A Trainer's step issues its push-pulls in one batch (update_on_kvstore: one
    call for all the small parameters, which a dist store fuses; otherwise one per
    parameter), one for the buffers with several workers, then waits once."""
    import pskv.torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2))
    trainer = pskv.torch.Trainer(model, pskv.optimizer.SGD(learning_rate=0.1), kv, loss_reduction='mean',
                                 update_on_kvstore=uok)
    rec = Recorder(kv._kv)
    kv._kv = rec
    try:
        for _ in range(2):
            model(torch.randn(6, 4)).sum().backward()
            rec.calls.clear()
            trainer.step()
            # every parameter of this model is small (<= 128 bytes): one call, unless the
            # store fuses nothing (PSKV_FUSION_KEY_BYTES=0)
            fused = uok and kv._kv.fusion_key_bytes >= 128
            want = (1 if fused else len(list(model.parameters()))) + (1 if kv.num_workers > 1 else 0)
            check(rec.calls == ['pushpull'] * want + ['wait'], 'step made the calls %s' % rec.calls)
    finally:
        kv._kv = rec._native


def trainer_in_a_batch(kv, uok):
    """Trainer.step inside a user's open batch still waits for its own calls, and a
    step that fails half-way leaves nothing of it in flight."""
    import pskv.torch
    q = torch.zeros(3, 2, requires_grad=True)  # gets a sparse gradient: not declared sparse
    big = 4 * N  # above the fusion limit: its own call, issued before q fails
    p = torch.zeros(big, requires_grad=True)  # issued first (steps go backwards)
    trainer = pskv.torch.Trainer([q, p], pskv.optimizer.SGD(learning_rate=0.1), kv, loss_reduction='mean',
                                 update_on_kvstore=uok)
    with kv.batch():
        p.grad = torch.ones(big)
        trainer.step()
        check(bool((p == -0.1).all()), 'a step inside a batch read %s, want -0.1 (uok=%s)' % (p[0], uok))
    if not uok:
        return
    p.grad = torch.ones(big)
    q.grad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, 2), (3, 2))
    try:
        trainer.step()
        check(False, 'a sparse gradient of an undeclared parameter did not raise')
    except pskv.UsageError:
        pass
    # The weights pulled straight into p are there: nothing of the step is in flight.
    check(bool((p == -0.2).all()), 'right after a failed step p is %s, want -0.2' % p[0])


def trainer(kv):
    for uok in (True, False):
        kv2 = pskv.create('dist_sync')  # int keys (kv has str keys); one optimizer per store
        trainer_step_calls(kv2, uok)
        kv2.close()
        kv3 = pskv.create('dist_sync')
        trainer_in_a_batch(kv3, uok)
        kv3.close()


SCENARIOS = {'returns_at_once': returns_at_once, 'ordering': ordering, 'lifetime': lifetime,
             'trainer': trainer, 'close_first': close_first}

if __name__ == '__main__':
    names = sys.argv[1].split(',')
    kv = pskv.create('dist_sync')
    rank = kv.rank
    for name in names:
        SCENARIOS[name](kv)
        print('worker %d: %s passed' % (rank, name), flush=True)
    kv.close()
