"""The data of examples/image_classification.py: CIFAR-10's binary files (the user's
copy; nothing is downloaded), the Fashion-MNIST stand-in padded to 3x32x32, synthetic
images, and a normalising Dataset over them."""
import gzip
import os

import numpy as np
import torch

CIFAR_TRAIN = ['data_batch_%d.bin' % i for i in range(1, 6)]
CIFAR_TEST = ['test_batch.bin']
CIFAR_RECORD = 1 + 3 * 32 * 32
FMNIST_DIR = '/usr/share/datasets/fashion-mnist'
# per-channel mean and std of the training images (CIFAR-10's usual values)
STATS = {'cifar10': ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
         'fashion-mnist': ((0.2190,) * 3, (0.3318,) * 3),   # of the padded 32x32 images
         'synthetic': ((0.5,) * 3, (0.25,) * 3)}


class DataError(Exception):
    """The data set's files are missing or malformed."""


# ---------------------------------------------------------------------------- data

def read_cifar_file(path):
    """Reads one CIFAR-10 binary file: records of 1 label byte and 3072 pixel bytes
    (1024 red, 1024 green, 1024 blue, rows in order).

    Returns (images uint8 [n, 3, 32, 32], labels int64 [n])."""
    raw = np.fromfile(path, np.uint8)
    if raw.size == 0 or raw.size % CIFAR_RECORD:
        raise DataError('%s: %d bytes is not a whole number of CIFAR-10 records (%d bytes each)'
                        % (path, raw.size, CIFAR_RECORD))
    rec = raw.reshape(-1, CIFAR_RECORD)
    labels = rec[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DataError('%s: label %d out of range 0..9 (is this CIFAR-100?)' % (path, labels.max()))
    return rec[:, 1:].reshape(-1, 3, 32, 32), labels


def cifar_dir(data_dir):
    """The folder holding CIFAR-10's binary files: data_dir or data_dir/cifar-10-batches-bin."""
    for d in (data_dir, os.path.join(data_dir, 'cifar-10-batches-bin')):
        if all(os.path.isfile(os.path.join(d, f)) for f in CIFAR_TRAIN + CIFAR_TEST):
            return d
    return None


def read_cifar10(data_dir):
    """CIFAR-10's binary version from `data_dir`: ((x_train, y_train), (x_test, y_test))."""
    d = cifar_dir(data_dir)
    if d is None:
        missing = [f for f in CIFAR_TRAIN + CIFAR_TEST if not os.path.isfile(os.path.join(data_dir, f))]
        raise DataError('CIFAR-10 binary files not found in %s (nor in its cifar-10-batches-bin/): missing %s. '
                        'Nothing is downloaded: put your copy of cifar-10-binary.tar.gz, unpacked, there and '
                        'pass --data-dir, or train on a stand-in (--stand-in fashion-mnist, --synthetic).'
                        % (data_dir, ', '.join(missing)))
    parts = [read_cifar_file(os.path.join(d, f)) for f in CIFAR_TRAIN]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return train, read_cifar_file(os.path.join(d, CIFAR_TEST[0]))


def read_fashion_mnist(data_dir=FMNIST_DIR):
    """Fashion-MNIST shaped like CIFAR-10: 28x28 padded by 2 to 32x32. One channel is
    stored ([n, 1, 32, 32]); Batches repeats it to 3 per batch (3x less memory)."""
    def idx(prefix):
        try:
            with gzip.open(os.path.join(data_dir, prefix + '-images-idx3-ubyte.gz')) as f:
                x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
            with gzip.open(os.path.join(data_dir, prefix + '-labels-idx1-ubyte.gz')) as f:
                y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
        except FileNotFoundError as e:
            raise DataError('Fashion-MNIST not found (%s): install Debian\'s dataset-fashion-mnist '
                            '(scripts/install-deps.sh --with-data) or pass --fmnist-dir' % e) from None
        return np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2))), y
    return idx('train'), idx('t10k')


def synthetic(n_train=50000, n_test=10000, seed=0):
    """Random 3x32x32 images; each class adds its own fixed pattern, so models can learn it."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(0, 40, (10, 3, 32, 32))

    def make(n):
        y = rng.integers(0, 10, n)
        x = rng.normal(128, 50, (n, 3, 32, 32)) + patterns[y]
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)
    return make(n_train), make(n_test)


class Batches(torch.utils.data.Dataset):
    """uint8 images and labels in memory; indexed by a list of indices (a batch) it
    returns the normalised float batch [b, 3, 32, 32] (one-channel images repeated to
    three), so a DataLoader over a BatchSampler makes one tensor per batch instead of
    stacking samples."""

    def __init__(self, x, y, mean, std):
        self.x, self.y = x, y
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255

    def __len__(self):
        return len(self.y)

    def __getitem__(self, idx):
        idx = np.asarray(idx)
        x = torch.from_numpy(self.x[idx]).float().expand(-1, 3, -1, -1)
        x = (x - self.mean) / self.std
        return x, torch.from_numpy(self.y[idx])
