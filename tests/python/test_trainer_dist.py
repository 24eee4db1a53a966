"""pskv.torch.Trainer in real 2-worker dist_sync jobs under pskv-launch: the
behaviours of test_trainer.py across workers, and the checkpoint recipe."""
import json
import os
import subprocess

import numpy as np
import pytest

pytest.importorskip('torch')
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(os.path.dirname(__file__), '..', '..', 'build')))
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, 'trainer_dist_check.py')


def launch(*args, workers=2):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    cmd = [os.path.join(BUILD, 'pskv-launch'), '-n', str(workers), '-s', '1', '--timeout', '90', '--',
           '/usr/bin/python3', SCRIPT] + [str(a) for a in args]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for w in range(workers):
        assert 'worker %d: %s passed' % (w, args[0]) in out, out


def load(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize('uok', [1, 0])
def test_trainer_features_two_workers(uok, tmp_path):
    launch('features', uok, tmp_path)
    r0, r1 = load(tmp_path / 'features0.json'), load(tmp_path / 'features1.json')
    for r in (r0, r1):
        assert r['uok'] is bool(uok)  # None -> True for dist (MXNet's choice)
        assert r['accumulate'] == -6.0  # both micro-batches of both workers (old: -3)
        assert r['clip'] == -8.0  # clipped to 1 on each worker (old: -26)
        assert r['lr'] == -9.0  # lr 0.5 after set_learning_rate
        assert r['f0'] == 3.0 and r['f'] == 3.0  # frozen: rank 0's, never updated
    if not uok:
        assert r0['mean'] == r1['mean'] == -1.5  # (1 + 2) / 2 workers
        assert r0['allreduced'] == r1['allreduced'] == 1.5  # the mean over workers, as loss_reduction says
        assert r0['update'] == r1['update'] == -3.0
    # BatchNorm buffers equal on both workers (rank 0's)
    assert r0['running_mean'] == r1['running_mean']
    assert r0['num_batches_tracked'] == r1['num_batches_tracked'] == 1
    if uok:
        assert 'Cannot reset distributed KVStore' in r0['reload']
        assert 'another Trainer' in r0['shared']
    else:
        assert r0['reload'] == r1['reload'] == -1.0


@pytest.mark.parametrize('uok', [1, 0])
def test_mean_loss_is_averaged_over_workers(uok, tmp_path):
    launch('mean', uok, tmp_path)
    for r in range(2):  # -(1 + 2) / 2 workers * the optimizer's own rescale_grad 2
        assert load(tmp_path / ('mean%d.json' % r))['mean'] == -3.0


@pytest.mark.parametrize('uok', [1, 0])
def test_checkpoint_resume_matches_uninterrupted_run(uok, tmp_path):
    launch('ckpt', uok, 'full', tmp_path)
    launch('ckpt', uok, 'first', tmp_path)  # stops after epoch 1, checkpoint on rank 0
    assert (tmp_path / 'ckpt.pt').exists() and (tmp_path / 'ckpt.states').exists()
    launch('ckpt', uok, 'resume', tmp_path)
    full, resumed = np.load(tmp_path / 'full0.npy'), np.load(tmp_path / 'resume0.npy')
    assert full.size == resumed.size == 276
    assert np.abs(full - resumed).max() < 1e-6, np.abs(full - resumed).max()
    assert np.array_equal(np.load(tmp_path / 'resume1.npy'), resumed)
    assert load(tmp_path / 'resume0.json')['lr'] == load(tmp_path / 'full0.json')['lr'] == 0.05


def test_gan_two_stores_two_trainers_per_process(tmp_path):
    """Two dist stores in each worker process (sharing its node), each with its own
    Trainer and server optimizer, keys 0.. in both: 2 workers == 1 process."""
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    subprocess.run(['/usr/bin/python3', SCRIPT, 'gan', 'local', tmp_path], env=env, check=True, timeout=60)
    launch('gan', 'dist_sync', tmp_path)
    single, dist = np.load(tmp_path / 'gan_local.npy'), np.load(tmp_path / 'gan_dist_sync.npy')
    assert single.size == dist.size == 3 * 8 + 8 + 8 * 2 + 2 + 2 * 8 + 8 + 8 + 1
    assert np.abs(single - dist).max() < 1e-5, np.abs(single - dist).max()
