"""row_sparse keys from Python (issue 15): pairs of numpy arrays, RowSparseArray,
torch sparse COO gradients of nn.Embedding(sparse=True); local and dist stores."""
import os
import subprocess

import numpy as np
import pytest

import pskv

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize('store', ['local', 'device'])
def test_row_sparse_pull_semantics(store):
    kv = pskv.create(store)
    kv.init('emb', pskv.row_sparse_array(np.ones((4, 4), np.float32)))
    # MXNet's test_row_sparse_pull: repeating, unsorted 2-D row ids -> exactly those rows
    ids = np.array([[3, 0], [3, 3]])
    out = kv.row_sparse_pull('emb', row_ids=ids)
    assert out.indices.tolist() == [0, 3]
    dense = out.asnumpy()
    assert (dense[[0, 3]] == 1).all() and (dense[[1, 2]] == 0).all()
    # two outputs, one row_ids array: both get the rows; empty ids -> empty result
    a, b = pskv.RowSparseArray(np.zeros((0, 4), np.float32), [], (4, 4)), None
    outs = kv.row_sparse_pull('emb', out=[a, pskv.RowSparseArray(np.zeros((0, 4), np.float32), [], (4, 4))],
                              row_ids=np.array([2]))
    assert [o.indices.tolist() for o in outs] == [[2], [2]] and outs[0] is a
    assert len(kv.row_sparse_pull('emb', row_ids=np.array([], np.int64)).indices) == 0
    kv.close()


def test_push_pairs_and_updater_sum():
    kv = pskv.create('local')
    kv.init(3, pskv.row_sparse_array((np.ones((4, 2), np.float32), [0, 1, 2, 3]), shape=(4, 2)))
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-1.0))  # w += g
    # a (data, indices) pair with unsorted, repeated ids; two values summed
    kv.push(3, [(np.full((3, 2), 2, np.float32), np.array([3, 1, 3])),
                (np.ones((1, 2), np.float32), np.array([1]))])
    out = kv.row_sparse_pull(3, row_ids=np.arange(4))
    assert out.asnumpy()[:, 0].tolist() == [1, 4, 1, 5]
    kv.close()


def test_storage_type_errors():
    kv = pskv.create('local')
    kv.init(0, pskv.row_sparse_array(np.ones((3, 2), np.float32)))
    kv.init(1, np.ones((3, 2), np.float32))
    with pytest.raises(pskv.UsageError, match='row_sparse_pull'):
        kv.pull(0, out=np.zeros((3, 2), np.float32))
    with pytest.raises(pskv.UsageError):
        kv.push(0, np.zeros((3, 2), np.float32))
    with pytest.raises(pskv.UsageError, match='storage type'):
        kv.push(1, pskv.row_sparse_array(np.ones((3, 2), np.float32)))
    with pytest.raises(pskv.UsageError):
        kv.row_sparse_pull(1, row_ids=np.array([0]))
    with pytest.raises(pskv.KeyError, match='out of range'):
        kv.row_sparse_pull(0, row_ids=np.array([3]))
    kv.close()


def test_torch_embedding_sparse_gradient():
    torch = pytest.importorskip('torch')
    emb = torch.nn.Embedding(10, 3, sparse=True)
    with torch.no_grad():
        emb.weight.zero_()
    emb(torch.tensor([4, 1, 4])).sum().backward()  # uncoalesced: ids 4, 1, 4
    g = emb.weight.grad
    assert g.is_sparse
    kv = pskv.create('local')
    kv.init('e', pskv.row_sparse_array(emb.weight.detach().numpy() + 1))
    kv.set_optimizer(pskv.optimizer.SGD(learning_rate=-1.0))  # w += g
    kv.push('e', g)
    out = kv.row_sparse_pull('e', row_ids=torch.tensor([4, 1, 7]))
    assert out.indices.tolist() == [1, 4, 7]
    assert out.data[:, 0].tolist() == [2.0, 3.0, 1.0]  # row 4 appeared twice
    t = pskv.sparse.to_torch(out)
    assert t.is_sparse and t.shape == (10, 3)
    kv.close()


def test_dist_sync_4_workers_2_servers():
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'), MXNET_KVSTORE_BIGARRAY_BOUND='100')
    cmd = [os.path.join(BUILD, 'pskv-launch'), '-n', '4', '-s', '2', '--timeout', '120', '--',
           '/usr/bin/python3', os.path.join(HERE, 'sparse_dist_check.py')]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for w in range(4):
        assert 'worker %d: sparse passed' % w in out, out
