"""A worker (and, through --server-command, a server) of the cluster tests, run by
pskv-launch on the namespace hosts.  Every process first records where it runs, seen
from inside its host: $PSKV_CLUSTER_REC/<role>-<task id>.txt with its network
namespace's inode and its addresses (`ip -4 -o addr`).

    cluster_worker.py sum ELEMENTS ROUNDS [SECONDS]
        dist_sync: every round each worker pushpulls ELEMENTS float32 of value rank+1 on
        key 0 (the store keeps the round's sum: n(n+1)/2, checked exactly); with
        SECONDS, rounds go on (20 ms apart) until that much time has passed on any
        worker (the workers vote on key 1 after each round, so all end together).
        Creates $PSKV_TEST_MARKER_DIR/worker<rank> once initialised.
    cluster_worker.py loop
        pushpull until the store fails; prints the error and exits 1.
"""
import os
import subprocess
import sys
import time


def record(role):
    d = os.environ.get('PSKV_CLUSTER_REC')
    if not d:
        return
    task = os.environ.get('DMLC_TASK_ID', 'x')
    ino = os.stat('/proc/self/ns/net').st_ino
    addrs = subprocess.run(['ip', '-4', '-o', 'addr'], capture_output=True, text=True).stdout
    with open(os.path.join(d, '%s-%s.txt' % (role, task)), 'w') as f:
        f.write('%d\n%s' % (ino, addrs))


def main(argv):
    role = os.environ.get('DMLC_ROLE', 'worker')
    record(role)
    import numpy as np
    import pskv
    kv = pskv.create('dist_sync')  # servers and the scheduler serve inside create
    if role != 'worker':
        return 0
    n, r = kv.num_workers, kv.rank
    elements = int(argv[2]) if len(argv) > 2 else 1000
    kv.init(0, np.zeros(elements, np.float32))
    marker = os.environ.get('PSKV_TEST_MARKER_DIR')
    if marker:
        open(os.path.join(marker, 'worker%d' % r), 'w').close()
    want = n * (n + 1) / 2
    if argv[1] == 'sum':
        rounds = int(argv[3])
        end = time.time() + float(argv[4]) if len(argv) > 4 else None
        kv.init(1, np.zeros(1, np.float32))  # the workers' votes to stop
        i = 0
        while True:
            v = np.full(elements, r + 1, np.float32)
            kv.pushpull(0, v)
            kv.wait_all()
            if not (v == want).all():
                print('worker %d: round %d: got %s, want %s' % (r, i, v[v != want][:3], want), flush=True)
                return 1
            i += 1
            # Every worker ends after the same round: each votes, and the sum says
            # whether any of them is done (each clock alone could differ by a round).
            vote = np.full(1, 1.0 if i >= rounds and (end is None or time.time() >= end) else 0.0, np.float32)
            kv.pushpull(1, vote)
            kv.wait_all()
            if vote[0] > 0:
                break
            if end:
                time.sleep(0.02)
        print('worker %d: %d rounds of %d elements, all sums exact' % (r, i, elements), flush=True)
    elif argv[1] == 'loop':
        end = time.time() + 90
        try:
            while time.time() < end:
                v = np.full(elements, r + 1, np.float32)
                kv.pushpull(0, v)
                kv.wait_all()
        except pskv.Error as e:
            print('worker %d: %s: %s' % (r, type(e).__name__, e), flush=True)
            return 1
        print('worker %d: no failure within 90 s' % r, flush=True)
        return 2
    kv.close()
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
