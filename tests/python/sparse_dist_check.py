"""A worker of test_sparse.py's dist job: MXNet's check_big_row_sparse_keys with
w <- w + rate*g, through the Python API (4 workers, 2 servers, rows sliced)."""
import numpy as np

import pskv

kv = pskv.create('dist_sync')
r, n = kv.rank, kv.num_workers
rate, rounds, shape = 2.0, 3, (60, 5)  # 300 elements >= the job's bound of 100: sliced
kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-rate))
kv.init('big', pskv.row_sparse_array(np.ones(shape, np.float32)))
rng = np.random.RandomState(123)  # the same rows on every worker
rows = np.flatnonzero(rng.rand(shape[0]) < 0.3)
update = [rows[::(k + 1) * 2] for k in range(n)]
for _ in range(rounds):
    kv.push('big', (np.full((len(update[r]), shape[1]), r + 1, np.float32), update[r]))
ids = np.random.RandomState(r).randint(shape[0], size=shape[0]).reshape(30, 2)
out = kv.row_sparse_pull('big', row_ids=ids)
want = np.ones(shape, np.float32)
for k in range(n):
    want[update[k]] += (k + 1) * rate * rounds
assert out.indices.tolist() == sorted(set(ids.ravel().tolist())), out.indices
np.testing.assert_allclose(out.data, want[out.indices])
kv.barrier()
print('worker %d: sparse passed' % r, flush=True)
kv.close()
