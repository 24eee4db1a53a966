"""Dynamic embedding tables from Python (issue 41): pskv.embedding on a local store,
pskv.torch.EmbeddingBag, and a dist_sync job of 2 workers and 2 servers whose rows
equal a local table's bit for bit (embedding_check.py)."""
import os
import subprocess

import numpy as np
import pytest

import pskv

BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
HERE = os.path.dirname(os.path.abspath(__file__))


def test_local_table_pull_push_and_u64_ids():
    kv = pskv.create('local')
    t = pskv.embedding.create(kv, 7, width=4, optimizer='sgd', optimizer_params={'learning_rate': 1})
    ids = np.array([3, 2**63 + 5, 3], np.uint64)
    rows, versions = t.pull(ids, versions=True)
    assert rows.shape == (3, 4) and rows.dtype == np.float32 and (rows[0] == rows[2]).all()
    assert versions.tolist() == [-1, -1, -1]
    t.push(ids, np.ones((3, 4), np.float32))  # id 3 twice: its gradients are summed
    after, versions = t.pull(ids, versions=True)
    assert np.allclose(after[0] - rows[0], -2) and np.allclose(after[1] - rows[1], -1)
    assert versions.tolist() == [0, 0, 0]
    kv.close()


def test_errors_name_the_fix():
    kv = pskv.create('local')
    t = pskv.embedding.create(kv, 1, width=4, admit_after=2, max_bytes=4096)
    with pytest.raises(pskv.InvalidArgument, match='int64'):
        t.pull(np.array([1.5]))
    with pytest.raises(pskv.ShapeError, match='width is 4'):
        t.push(np.array([1], np.int64), np.ones((1, 5), np.float32))
    with pytest.raises(pskv.UsageError, match='max_bytes'):
        t.push(np.arange(5000, dtype=np.int64), np.ones((5000, 4), np.float32))
    with pytest.raises(pskv.InvalidArgument, match='width'):
        pskv.embedding.create(kv, 2, width=0)
    kv.close()


def test_embedding_bag_sum_pushes_counts():
    torch = pytest.importorskip('torch')
    import pskv.torch
    kv = pskv.create('local')
    t = pskv.embedding.create(kv, 3, width=2, optimizer='sgd', optimizer_params={'learning_rate': 1},
                              init='zeros')
    bag = pskv.torch.EmbeddingBag(t, mode='sum')
    out = bag(torch.tensor([[1, 2, 1], [2, 2, 9]]))
    assert out.shape == (2, 2) and float(out.abs().sum()) == 0
    out.sum().backward()  # d/d row = occurrences: 1 -> 2, 2 -> 3, 9 -> 1
    rows = t.pull(np.array([1, 2, 9]))
    assert rows[:, 0].tolist() == [-2, -3, -1]
    with pytest.raises(ValueError):
        pskv.torch.EmbeddingBag(t, mode='max')
    kv.close()


def test_dist_sync_embedding_bag_equals_a_local_table():
    pytest.importorskip('torch')
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    cmd = [os.path.join(BUILD, 'pskv-launch'), '-n', '2', '-s', '2', '--timeout', '90', '--',
           '/usr/bin/python3', os.path.join(HERE, 'embedding_check.py')]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for w in range(2):
        assert 'worker %d: embedding passed' % w in out, out


def test_local_table_save_delta_restore_export_and_stats(tmp_path):
    kv = pskv.create('local')
    t = pskv.embedding.create(kv, 5, width=3, optimizer='adagrad', admit_after=2, ttl_steps=4)
    ids = np.array([1, 2, 3, 2**63 + 1, 1, 2], np.uint64)
    every = np.unique(ids)
    for step in range(3):
        t.push(ids, np.full((6, 3), step + 1, np.float32))
    assert t.save(tmp_path, 'full') > 0
    t.push(ids[:2], np.ones((2, 3), np.float32))
    assert t.save(tmp_path, 'delta') > 0
    want, want_versions = t.pull(every, versions=True)
    s = t.stats()
    assert s['live'] == 4 and s['step'] == 4 and s['dropped_grads'] > 0 and s['admitted'] == 4
    t.push(ids, np.ones((6, 3), np.float32))  # changes every row, then restored away
    t.restore(tmp_path)
    got, got_versions = t.pull(every, versions=True)
    assert np.array_equal(got.view(np.int32), want.view(np.int32)) and np.array_equal(got_versions, want_versions)
    assert t.stats()['step'] == 4
    assert t.export(tmp_path / 'serve') > 0
    eids, values = pskv.embedding.read_export(tmp_path / 'serve', 5)
    order = np.argsort(eids)
    assert np.array_equal(eids[order], every) and np.array_equal(values[order], want)
    # A corrupt delta: IOError naming the file, the table as it was.
    delta = sorted(tmp_path.glob('emb5-*.delta'))[-1]
    raw = bytearray(delta.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    delta.write_bytes(bytes(raw))
    with pytest.raises(pskv.IOError, match=delta.name):
        t.restore(tmp_path)
    assert np.array_equal(t.pull(every).view(np.int32), want.view(np.int32))
    with pytest.raises(pskv.IOError, match='no save of embedding table 5'):
        t.restore(tmp_path / 'nothing')
    with pytest.raises(pskv.InvalidArgument, match="'full' or 'delta'"):
        t.save(tmp_path, 'incremental')
    kv.close()


def test_dist_cache_checkpoint_and_export_from_python(tmp_path):
    pytest.importorskip('torch')
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    cmd = [os.path.join(BUILD, 'pskv-launch'), '-n', '2', '-s', '2', '--timeout', '90', '--',
           '/usr/bin/python3', os.path.join(HERE, 'embedding_io_check.py'), str(tmp_path)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for w in range(2):
        assert 'worker %d: embedding io passed' % w in out, out
