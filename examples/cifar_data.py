"""The data of examples/image_classification.py: CIFAR-10's binary files (the user's
copy; nothing is downloaded), the d2l/Kaggle layout of PNG files + trainLabels.csv,
MXNet RecordIO files (.rec + .idx), the Fashion-MNIST stand-in padded to 3x32x32,
synthetic images, and a normalising Dataset over them."""
import csv
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
STATS['cifar10-png'] = STATS['cifar10']


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


def read_png_folder(data_dir, valid_ratio=0.1):
    """The d2l / Kaggle CIFAR-10 layout (d2l's kaggle_cifar10_tiny, Kaggle's
    cifar-10): `data_dir`/train/<id>.png images and `data_dir`/trainLabels.csv with
    `id,label` rows naming the class.

    Classes are numbered in sorted order of the names in the CSV (for CIFAR-10 that is
    its usual order, airplane = 0 ... truck = 9), whatever subset of the files is
    present. As d2l's reorg_train_valid, max(1, floor(n * valid_ratio)) images of each
    class, n being the smallest class's count, are held out for validation: the first
    ones of the class in id order. Kaggle's unlabelled test/ folder is not read.

    Returns ((x_train, y_train), (x_valid, y_valid), class names): uint8 images
    [n, 3, 32, 32] and int64 labels. DataError names the file for a missing label, an
    unreadable image or one that is not 32x32."""
    from PIL import Image
    labels_csv = os.path.join(data_dir, 'trainLabels.csv')
    train_dir = os.path.join(data_dir, 'train')
    if not os.path.isfile(labels_csv) or not os.path.isdir(train_dir):
        raise DataError('%s is not the d2l/Kaggle CIFAR-10 layout: it needs trainLabels.csv and a train/ folder '
                        'of <id>.png files (d2l\'s kaggle_cifar10_tiny, Kaggle\'s cifar-10)' % data_dir)
    names = {}
    with open(labels_csv, newline='') as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or [h.strip().lower() for h in header[:2]] != ['id', 'label']:
            raise DataError('%s: the first line must be the header "id,label", got %r' % (labels_csv, header))
        for lineno, row in enumerate(rows, 2):
            if not row:
                continue
            if len(row) != 2 or not row[0].strip() or not row[1].strip():
                raise DataError('%s line %d: %r is not "id,label"' % (labels_csv, lineno, ','.join(row)))
            names[row[0].strip()] = row[1].strip()
    classes = sorted(set(names.values()))
    index = {c: i for i, c in enumerate(classes)}
    files = [f for f in os.listdir(train_dir) if f.lower().endswith('.png')]
    if not files:
        raise DataError('%s holds no .png files' % train_dir)
    files.sort(key=lambda f: (len(os.path.splitext(f)[0]), f))   # 1, 2, ..., 10: numeric ids in order
    x = np.empty((len(files), 3, 32, 32), np.uint8)
    y = np.empty(len(files), np.int64)
    for i, f in enumerate(files):
        path = os.path.join(train_dir, f)
        key = os.path.splitext(f)[0]
        if key not in names:
            raise DataError('%s: no label for id %s in %s' % (path, key, labels_csv))
        try:
            with Image.open(path) as im:
                im = im.convert('RGB')
                img = np.asarray(im, np.uint8)
        except Exception as e:   # Pillow raises several types for bad files
            raise DataError('%s: cannot read the image: %s' % (path, e)) from None
        if img.shape[:2] != (32, 32):
            raise DataError('%s: the image is %dx%d pixels, CIFAR-10 images are 32x32'
                            % (path, img.shape[1], img.shape[0]))
        x[i], y[i] = img.transpose(2, 0, 1), index[names[key]]
    counts = np.bincount(y, minlength=len(classes))
    per_class = max(1, int(np.floor(counts[counts > 0].min() * valid_ratio)))
    valid = np.zeros(len(y), bool)
    taken = np.zeros(len(classes), np.int64)
    for i, c in enumerate(y):
        if taken[c] < per_class:
            valid[i], taken[c] = True, taken[c] + 1
    return (x[~valid], y[~valid]), (x[valid], y[valid]), classes


def read_recordio(rec_path, num_classes=10):
    """(uint8 images [n, 3, 32, 32], int64 labels [n]) of an MXNet RecordIO file
    (its .idx beside it is used when present), read with pskv.recordio. DataError
    naming the file and record for a corrupt file, an image that is not 32x32 or a
    label that is not a class 0 .. num_classes - 1."""
    import pskv.recordio as rio
    idx = os.path.splitext(rec_path)[0] + '.idx'
    try:
        ds = rio.ImageRecordDataset(rec_path, idx if os.path.isfile(idx) else None, data_shape=(3, 32, 32))
        try:
            x, y = ds.read_all()
        finally:
            ds.close()
    except OSError as e:   # RecordIOError, or a missing file
        raise DataError(str(e)) from None
    y = y[:, 0]
    bad = np.flatnonzero((y != np.round(y)) | (y < 0) | (y >= num_classes))
    if bad.size:
        raise DataError('%s: label %g is not a class 0..%d (this example trains %d-class models)'
                        % (ds.describe(int(bad[0])), y[bad[0]], num_classes - 1, num_classes))
    return x, y.astype(np.int64)


def channel_stats(x):
    """Per-channel (mean, std) of uint8 images [n, 3, H, W], scaled to 0..1."""
    v = x.reshape(x.shape[0], x.shape[1], -1).astype(np.float64) / 255
    return tuple(v.mean(axis=(0, 2))), tuple(np.maximum(v.std(axis=(0, 2)), 1e-3))


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
