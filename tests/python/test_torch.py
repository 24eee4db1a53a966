"""pskv.torch: 2 workers (dist_sync) with batch b == 1 process with batch 2b."""
import os
import subprocess
import tempfile

import numpy as np
import pytest

pytest.importorskip('torch')
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = '/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz'


@pytest.mark.skipif(not os.path.exists(DATA), reason='dataset-fashion-mnist not installed')
@pytest.mark.parametrize('uok', ['1', '0'])
def test_two_workers_match_one_with_double_batch(uok):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    script = os.path.join(HERE, 'torch_check.py')
    with tempfile.TemporaryDirectory() as d:
        single, dist = os.path.join(d, 'single'), os.path.join(d, 'dist')
        subprocess.run(['/usr/bin/python3', script, single, 'local', uok, '32', '5'], env=env, check=True, timeout=120)
        p = subprocess.run([os.path.join(BUILD, 'pskv-launch'), '-n', '2', '-s', '1', '--timeout', '150', '--',
                            '/usr/bin/python3', script, dist, 'dist_sync', uok, '16', '5'],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=200)
        assert p.returncode == 0, p.stdout.decode()
        a, b = np.fromfile(single, np.float32), np.fromfile(dist, np.float32)
        assert a.size == b.size > 50000
        assert np.abs(a - b).max() < 2e-5


def test_shard_matches_gluon():
    import torch
    import pskv.torch
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    parts = [list(pskv.torch.shard(ds, r, 3).indices) for r in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
