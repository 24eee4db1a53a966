"""examples/image_classification.py (issue 26): the CIFAR-10 binary reader on files
written here in the real format, and short training runs under pskv-launch (pskv
dist_sync with 1 and 2 workers, DDP-gloo) that must learn."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip('torch')
pytest.importorskip('torchvision')
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))
EXAMPLE = os.path.join(ROOT, 'examples', 'image_classification.py')
FMNIST = '/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz'

spec = importlib.util.spec_from_file_location('image_classification', EXAMPLE)
ic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ic)


def write_cifar(path, images, labels):
    """CIFAR-10's binary format: per record 1 label byte, then the 1024 red, 1024 green
    and 1024 blue bytes of the 32x32 image, rows in order — written byte by byte from
    [n, 32, 32, 3] (HWC) images, independently of the reader's reshape."""
    with open(path, 'wb') as f:
        for img, lab in zip(images, labels):
            f.write(bytes([int(lab)]))
            for c in range(3):
                f.write(bytes(int(v) for v in img[:, :, c].reshape(-1)))


def make_files(folder, n_train=(40, 40, 40, 40, 40), n_test=50, seed=1):
    """Writes the six files with learnable images (each class adds its own pattern);
    returns {file name: (images HWC, labels)}."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(0, 60, (10, 32, 32, 3))
    written = {}
    for name, n in list(zip(ic.CIFAR_TRAIN, n_train)) + [(ic.CIFAR_TEST[0], n_test)]:
        y = rng.integers(0, 10, n)
        x = np.clip(rng.normal(128, 40, (n, 32, 32, 3)) + patterns[y], 0, 255).astype(np.uint8)
        write_cifar(os.path.join(folder, name), x, y)
        written[name] = (x, y)
    return written


def run(cmd, timeout=150):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    env.pop('DMLC_ROLE', None)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode()


def launched(n, s, args):
    return run([os.path.join(BUILD, 'pskv-launch'), '-n', str(n), '-s', str(s), '--timeout', '120', '--',
                '/usr/bin/python3', EXAMPLE, '--json'] + args)


def records(out):
    return [json.loads(line[line.index('{'):]) for line in out.splitlines() if '{"epoch"' in line]


def test_cifar_reader_reads_what_was_written(tmp_path):
    sub = tmp_path / 'cifar-10-batches-bin'      # the tarball's folder is found too
    sub.mkdir()
    written = make_files(str(sub), n_train=(3, 4, 5, 6, 7), n_test=4)
    (x, y), (xt, yt) = ic.read_cifar10(str(tmp_path))
    assert x.shape == (25, 3, 32, 32) and x.dtype == np.uint8 and y.dtype == np.int64
    assert xt.shape == (4, 3, 32, 32)
    want_x = np.concatenate([written[f][0] for f in ic.CIFAR_TRAIN]).transpose(0, 3, 1, 2)
    want_y = np.concatenate([written[f][1] for f in ic.CIFAR_TRAIN])
    assert (x == want_x).all() and (y == want_y).all()
    assert (xt == written['test_batch.bin'][0].transpose(0, 3, 1, 2)).all()
    assert (yt == written['test_batch.bin'][1]).all()
    one, lab = ic.read_cifar_file(str(sub / 'data_batch_2.bin'))
    assert one.shape == (4, 3, 32, 32) and (lab == written['data_batch_2.bin'][1]).all()


def test_cifar_reader_names_missing_and_malformed_files(tmp_path):
    make_files(str(tmp_path), n_train=(1, 1, 1, 1, 1), n_test=1)
    os.remove(tmp_path / 'data_batch_3.bin')
    os.remove(tmp_path / 'test_batch.bin')
    with pytest.raises(ic.DataError, match=r'missing data_batch_3\.bin, test_batch\.bin\. Nothing is downloaded'):
        ic.read_cifar10(str(tmp_path))
    bad = tmp_path / 'data_batch_1.bin'
    bad.write_bytes(bad.read_bytes() + b'\0' * 10)
    with pytest.raises(ic.DataError, match='3083 bytes is not a whole number of CIFAR-10 records'):
        ic.read_cifar_file(str(bad))
    bad.write_bytes(bytes([57]) + b'\0' * 3072)
    with pytest.raises(ic.DataError, match='label 57 out of range'):
        ic.read_cifar_file(str(bad))


def test_command_line_misuse_is_refused(tmp_path):
    rc, out = run(['/usr/bin/python3', EXAMPLE, '--gpus', '0,1'])  # no device: the message says what to do
    assert rc == 2 and '--gpus 0,1: ' in out and 'PSKV_SIM_DEVICES=2' in out, out
    rc, out = run(['/usr/bin/python3', EXAMPLE, '--dataset', 'cifar10', '--data-dir', str(tmp_path)])
    assert rc == 2 and 'missing data_batch_1.bin' in out and '--stand-in fashion-mnist' in out, out


def test_gpus_trains_one_replica_per_device_on_simulated_devices():
    """MXNet's --gpus 0,1: one replica per device, each on half of every batch, the
    `device` store summing on the (simulated) devices."""
    env_sim = dict(os.environ, PSKV_SIM_DEVICES='2')
    p = subprocess.run(['/usr/bin/python3', EXAMPLE, '--json', '--synthetic', '--gpus', '0,1', '--kvstore', 'device',
                        '--model', 'resnet18', '--width', '0.125', '--max-batches', '3', '--batch-size', '16',
                        '--train-samples', '64', '--test-samples', '50'],
                       env=dict(env_sim, PYTHONPATH=os.path.join(BUILD, 'python')), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=150)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert 'replicas on cuda:0, cuda:1' in out and 'simulated' in out, out
    r = records(out)
    assert r and r[0]['mode'] == 'pskv-device' and r[0]['batches'] == 3, out


def test_models_are_the_cifar_variants():
    import torch
    x = torch.zeros(2, 3, 32, 32)
    for name, params in (('resnet18', 11173962), ('vgg11', 28144010), ('vgg11_linear', 9225610),
                         ('vgg11_imagenet_head', 128807306)):
        m = ic.MODELS[name](num_classes=10, width=1.0)
        assert sum(p.numel() for p in m.parameters()) == params
        assert m(x).shape == (2, 10)
    r = ic.MODELS['resnet18'](num_classes=10, width=0.25)
    assert r.conv1.kernel_size == (3, 3) and r.conv1.stride == (1, 1) and isinstance(r.maxpool, torch.nn.Identity)


def test_one_worker_one_server_learns_from_cifar_files(tmp_path):
    """The example reads the files written here and learns them (a reader that mixed up
    labels and images could not): 1 worker + 1 server, dist_sync, VGG-11 with BN."""
    make_files(str(tmp_path), n_train=(160,) * 5, n_test=200)
    rc, out = launched(1, 1, ['--dataset', 'cifar10', '--data-dir', str(tmp_path), '--model', 'vgg11_bn',
                              '--width', '0.125', '--kvstore', 'dist_sync', '--epochs', '2', '--batch-size', '32'])
    assert rc == 0, out
    r = records(out)
    assert [e['epoch'] for e in r] == [1, 2] and r[0]['data'] == 'cifar10' and r[0]['batches'] == 25, out
    assert r[1]['train_loss'] < 0.5 * r[0]['first_loss'], out
    assert r[1]['test_accuracy'] > 0.5, out     # chance: 0.1


@pytest.mark.skipif(not os.path.exists(FMNIST), reason='dataset-fashion-mnist not installed')
def test_seed_command_line_two_workers_on_the_stand_in_and_ddp_side_by_side():
    """The seed's line (--dataset cifar10 --model resnet18 --kvstore dist_sync) with 2
    workers + 1 server on the Fashion-MNIST stand-in learns; --ddp (gloo, rendezvous
    through the pskv job) trains the same model from the same start on the same data."""
    common = ['--dataset', 'cifar10', '--data-dir', '/nonexistent', '--stand-in', 'fashion-mnist',
              '--model', 'resnet18', '--width', '0.25', '--epochs', '1', '--batch-size', '32',
              '--max-batches', '25', '--train-samples', '4000', '--test-samples', '500']
    rc, out = launched(2, 1, common + ['--kvstore', 'dist_sync'])
    assert rc == 0, out
    assert 'training on the fashion-mnist stand-in' in out
    (ps,) = records(out)
    assert ps['mode'] == 'pskv-dist_sync' and ps['workers'] == 2 and ps['data'] == 'fashion-mnist'
    assert ps['train_loss'] < 0.8 * ps['first_loss'] and ps['train_accuracy'] > 0.3, out
    assert ps['samples_per_sec'] > 0
    rc, out = launched(2, 1, common + ['--ddp'])
    assert rc == 0, out
    (ddp,) = records(out)
    assert ddp['mode'] == 'ddp-gloo' and ddp['workers'] == 2
    assert abs(ddp['first_loss'] - ps['first_loss']) < 1e-4   # same model, same first batch
    assert ddp['train_loss'] < 0.8 * ddp['first_loss'] and ddp['train_accuracy'] > 0.3, out


def test_ddp_under_torchrun_environment_on_synthetic_data():
    """--ddp with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), no
    pskv job: 2 processes on loopback learn the synthetic classes in 2 epochs."""
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'), MASTER_ADDR='127.0.0.1',
               MASTER_PORT=str(port), WORLD_SIZE='2')
    env.pop('DMLC_ROLE', None)
    cmd = ['/usr/bin/python3', EXAMPLE, '--ddp', '--synthetic', '--model', 'resnet18', '--width', '0.125',
           '--train-samples', '1024', '--test-samples', '200', '--batch-size', '32', '--epochs', '2', '--json']
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0].decode())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    r = records(outs[0])
    assert records(outs[1]) == []      # rank 0 reports
    assert [e['epoch'] for e in r] == [1, 2] and r[0]['mode'] == 'ddp-gloo' and r[0]['workers'] == 2
    assert r[1]['train_loss'] < 0.8 * r[0]['first_loss'] and r[1]['train_accuracy'] > 0.3, outs[0]
