"""The seeds' data and model (issue 38): pskv.recordio reading MXNet RecordIO image
files written here (by pskv.recordio and, for the framing, byte by byte from the
format's description), the d2l / Kaggle PNG + trainLabels.csv layout, the example's
Gluon-shaped vgg11, and examples/image_classification.py on both kinds of files."""
import importlib.util
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import pskv.recordio as rio

PIL = pytest.importorskip('PIL.Image')
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
BUILD = os.path.abspath(os.environ.get('PSKV_BUILD_DIR', os.path.join(ROOT, 'build')))
EXAMPLES = os.path.join(ROOT, 'examples')
MAGIC = 0xced7230a


def pattern(i, rows=32, cols=32):
    """A smooth RGB image (JPEG keeps it closely) whose blue channel is 100 + 10 * i (i < 15)."""
    img = np.empty((rows, cols, 3), np.uint8)
    img[:, :, 0] = (i * 20 + 2 * np.arange(rows))[:, None] % 256
    img[:, :, 1] = 255 - 3 * np.arange(cols)[None, :]
    img[:, :, 2] = (100 + 10 * i) % 256
    return img


def write_images(rec, idx, n, rows=32, labels=None):
    """n records, PNG for even i and JPEG for odd; label i % 5 (or labels[i]), id i."""
    with rio.MXIndexedRecordIO(idx, rec, 'w') as w:
        for i in range(n):
            label = float(i % 5) if labels is None else labels[i]
            w.write_idx(i, rio.pack_img(rio.IRHeader(0, label, i, 0), pattern(i, rows),
                                        img_fmt='.jpg' if i % 2 else '.png'))


def record_ids(data):
    """The record numbers of a batch, from the blue channel."""
    return [int(round((float(d[2, 0, 0]) - 100) / 10)) for d in data]


# ---------------------------------------------------------------------------- framing

def test_the_framing_matches_the_format_written_byte_by_byte(tmp_path):
    """A file built here from the format's description (magic, lrecord with the part
    flag in the top 3 bits, payload, padding; a payload holding the magic at an aligned
    offset split into parts) reads back; pskv's writer produces the same bytes."""
    m = struct.pack('<I', MAGIC)
    payloads = [b'abcde', m + b'wxyz' + m, b'', b'12' + m + b'3']   # the last magic is unaligned
    raw = b''
    for p in payloads:
        aligned = [i for i in range(0, len(p) - 3, 4) if p[i:i + 4] == m]
        parts, begin = [], 0
        for i in aligned:
            parts.append(p[begin:i])
            begin = i + 4
        parts.append(p[begin:])
        for k, part in enumerate(parts):
            flag = 0 if len(parts) == 1 else 1 if k == 0 else 3 if k == len(parts) - 1 else 2
            raw += struct.pack('<II', MAGIC, (flag << 29) | len(part)) + part
        raw += b'\0' * (-len(p) % 4)
    (tmp_path / 'hand.rec').write_bytes(raw)
    r = rio.MXRecordIO(str(tmp_path / 'hand.rec'), 'r')
    assert [r.read() for _ in range(5)] == payloads + [None]
    with rio.MXRecordIO(str(tmp_path / 'mine.rec'), 'w') as w:
        for p in payloads:
            w.write(p)
    assert (tmp_path / 'mine.rec').read_bytes() == raw


def test_pack_and_unpack_one_label_or_several():
    s = rio.pack(rio.IRHeader(0, 3.0, 42, 7), b'img')
    assert len(s) == 24 + 3 and struct.unpack('<IfQQ', s[:24]) == (0, 3.0, 42, 7)
    h, img = rio.unpack(s)
    assert h == (0, 3.0, 42, 7) and img == b'img'
    s = rio.pack(rio.IRHeader(0, [1.5, 2.5], 1, 0), b'img')
    h, img = rio.unpack(s)
    assert h.flag == 2 and list(h.label) == [1.5, 2.5] and img == b'img'
    with pytest.raises(rio.RecordIOError, match='announces 2 labels .* labels missing'):
        rio.unpack(s[:28], "'x.rec' record 4")


# ---------------------------------------------------------------------------- images

def test_images_round_trip_png_exactly_and_jpeg_closely(tmp_path):
    rec, idx = str(tmp_path / 'i.rec'), str(tmp_path / 'i.idx')
    write_images(rec, idx, 10)
    it = rio.ImageRecordIter(rec, (3, 32, 32), batch_size=4, path_imgidx=idx)
    assert len(it) == 3
    seen, pads = 0, []
    for data, label, pad in it:
        assert data.shape == (4, 3, 32, 32) and data.dtype == np.float32 and label.shape == (4,)
        pads.append(pad)
        for j in range(4):
            i = (seen + j) % 10                     # round_batch fills from the start
            assert label[j] == i % 5
            err = np.abs(data[j] - pattern(i).transpose(2, 0, 1)).mean()
            assert (err == 0) if i % 2 == 0 else (err < 2.0), (i, err)
        seen += 4
    assert pads == [0, 0, 2]
    it = rio.ImageRecordIter(rec, (3, 32, 32), batch_size=4, path_imgidx=idx, round_batch=False, mean_b=100,
                             std_b=2)
    batches = list(it)
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert batches[-1][0][0, 2, 0, 0] == (180 - 100) / 2
    # without the .idx the file is scanned; the same records come back
    ds = rio.ImageRecordDataset(rec)
    x, y = ds.read_all()
    assert len(ds) == 10 and x.dtype == np.uint8 and (x[0] == pattern(0).transpose(2, 0, 1)).all()
    assert list(y[:, 0]) == [i % 5 for i in range(10)]
    h, img = rio.unpack_img(rio.MXIndexedRecordIO(idx, rec, 'r').read_idx(4))
    assert h.id == 4 and (img == pattern(4)).all()


def test_several_labels_per_record(tmp_path):
    rec, idx = str(tmp_path / 'm.rec'), str(tmp_path / 'm.idx')
    write_images(rec, idx, 3, labels=[[i, 10 + i, 20 + i] for i in range(3)])
    data, label, _ = next(iter(rio.ImageRecordIter(rec, batch_size=3, path_imgidx=idx, label_width=2)))
    assert label.tolist() == [[0, 10], [1, 11], [2, 12]]


def test_parts_cover_the_file_once_and_shuffling_is_seeded(tmp_path):
    rec, idx = str(tmp_path / 'p.rec'), str(tmp_path / 'p.idx')
    write_images(rec, idx, 10)
    assert [rio.record_partition(10, 3, p) for p in range(3)] == [(0, 4), (4, 8), (8, 10)]

    def ids(parts, part, shuffle=False, seed=0, epoch=0):
        it = rio.ImageRecordIter(rec, batch_size=3, path_imgidx=idx, num_parts=parts, part_index=part,
                                 shuffle=shuffle, seed=seed, round_batch=False)
        it.reset(epoch)
        return [i for data, _, _ in it for i in record_ids(data)]
    assert [ids(3, p) for p in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    a = ids(1, 0, True, 7)
    assert a == ids(1, 0, True, 7) and sorted(a) == list(range(10))
    assert a != ids(1, 0, True, 8) and a != ids(1, 0, True, 7, epoch=1)
    assert sorted(ids(3, 1, True, 7)) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match='part 11 of 12 .* is empty'):
        ids(12, 11)


GTEST = os.path.join(BUILD, 'tests', 'pskv_recordio_tests')


@pytest.mark.skipif(not os.path.exists(GTEST), reason='pskv_recordio_tests not built')
def test_python_and_cpp_read_each_others_files(tmp_path):
    """pskv.recordio writes records (PNG and JPEG, two labels, one whose id puts the
    magic at an aligned offset, so it is stored in parts) that the C++ reader checks,
    and reads the records the C++ writer wrote."""
    with rio.MXIndexedRecordIO(str(tmp_path / 'py.idx'), str(tmp_path / 'py.rec'), 'w') as w, \
            open(str(tmp_path / 'py.txt'), 'w') as txt:
        for i in range(6):
            rid = MAGIC if i == 3 else i
            w.write_idx(i, rio.pack_img(rio.IRHeader(0, [i, 10 + i], rid, 0), pattern(i),
                                        img_fmt='.jpg' if i % 2 else '.png'))
            txt.write('%d %d %d %d\n' % (rid, i, 10 + i, 100 + 10 * i))
    raw, flags, off = (tmp_path / 'py.rec').read_bytes(), [], 0
    while off < len(raw):                   # the part flags of every part on disk
        lrec = struct.unpack_from('<I', raw, off + 4)[0]
        flags.append(lrec >> 29)
        off += 8 + -(-(lrec & ((1 << 29) - 1)) // 4) * 4
    assert flags == [0, 0, 0, 1, 3, 0, 0], flags
    p = subprocess.run([GTEST, '--gtest_filter=*CrossCheck*'], env=dict(os.environ, RECORDIO_CROSS_DIR=str(tmp_path)),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = p.stdout.decode()
    assert p.returncode == 0 and '[  PASSED  ] 1 test' in out and 'SKIPPED' not in out, out
    r = rio.MXIndexedRecordIO(str(tmp_path / 'cpp.idx'), str(tmp_path / 'cpp.rec'), 'r')
    assert r.keys == [10, 11, 12, 13, 14]
    for key, line in zip(r.keys, open(str(tmp_path / 'cpp.txt'))):
        rid, i, flag, blue = (int(v) for v in line.split())
        header, img = rio.unpack_img(r.read_idx(key))
        assert (header.id, header.flag) == (rid, flag)
        assert list(np.atleast_1d(header.label)) == ([i, 0.5] if flag else [i])
        assert abs(int(img[5, 5, 2]) - blue) <= 3 and img.shape == (32, 32, 3)


# ---------------------------------------------------------------------------- bad input

def corrupt_copy(tmp_path, name, n=4):
    """A .rec of n 40-byte records (48 bytes each on disk) and its .idx."""
    rec, idx = str(tmp_path / (name + '.rec')), str(tmp_path / (name + '.idx'))
    with rio.MXIndexedRecordIO(idx, rec, 'w') as w:
        for i in range(n):
            w.write_idx(i, bytes([i]) * 40)
    return rec, idx


def patch(path, offset, data):
    with open(path, 'r+b') as f:
        f.seek(offset)
        f.write(data)


def test_a_bad_magic_names_the_file_and_record(tmp_path):
    rec, idx = corrupt_copy(tmp_path, 'm')
    patch(rec, 2 * 48, struct.pack('<I', 0x12345678))
    r = rio.MXIndexedRecordIO(idx, rec, 'r')
    with pytest.raises(rio.RecordIOError, match=r"m\.rec' key 2 \(byte 96\): bad magic 0x12345678"):
        r.read_idx(2)
    with pytest.raises(rio.RecordIOError, match=r"m\.rec' record 2 \(key 2, byte 96\): bad magic"):
        rio.ImageRecordDataset(rec)                     # the scan without an index
    assert isinstance(rio.RecordIOError('x'), OSError)


def test_a_length_past_the_end_and_a_truncated_file_name_the_record(tmp_path):
    rec, idx = corrupt_copy(tmp_path, 't')
    patch(rec, 3 * 48 + 4, struct.pack('<I', 100000))
    with pytest.raises(rio.RecordIOError, match=r"t\.rec' key 3 \(byte 144\): length 100000 at byte 144 runs past "
                                                r"the end of the file \(192 bytes\)"):
        rio.MXIndexedRecordIO(idx, rec, 'r').read_idx(3)
    os.truncate(rec, 3 * 48 + 4)
    with pytest.raises(rio.RecordIOError, match=r"record 3 \(key 3, byte 144\): truncated"):
        rio.ImageRecordDataset(rec)


def test_an_idx_offset_past_the_end_names_the_line_and_key(tmp_path):
    rec, idx = corrupt_copy(tmp_path, 'x')
    with open(idx, 'a') as f:
        f.write('4\t5000\n')
    with pytest.raises(rio.RecordIOError, match=r"x\.idx' line 5: offset 5000 of key 4 is past the end of '.*x\.rec' "
                                                r"\(192 bytes\)"):
        rio.ImageRecordDataset(rec, idx)
    with open(idx, 'w') as f:
        f.write('0 zero\n')
    with pytest.raises(rio.RecordIOError, match=r"line 1: '0 zero' is not 'key<TAB>offset'"):
        rio.MXIndexedRecordIO(idx, rec, 'r')


def test_a_missing_label_a_wrong_size_and_a_bad_image_name_the_record(tmp_path):
    rec, idx = str(tmp_path / 'w.rec'), str(tmp_path / 'w.idx')
    write_images(rec, idx, 3, rows=28)
    with pytest.raises(rio.RecordIOError, match=r"w\.rec' record 0 \(key 0, byte 0\): the image is 28x32 pixels, "
                                                r"data_shape wants 32x32"):
        rio.ImageRecordDataset(rec, idx)[0]
    rec, idx = str(tmp_path / 'l.rec'), str(tmp_path / 'l.idx')
    write_images(rec, idx, 3)
    with pytest.raises(rio.RecordIOError, match=r"l\.rec' record 1 \(key 1, byte \d+\): 1 label\(s\), label_width "
                                                r"is 2: labels missing"):
        rio.ImageRecordDataset(rec, idx, label_width=2)[1]
    rec, idx = str(tmp_path / 'g.rec'), str(tmp_path / 'g.idx')
    png = rio.encode_img(pattern(1), img_fmt='.png')
    with rio.MXIndexedRecordIO(idx, rec, 'w') as w:
        w.write_idx(0, rio.pack(rio.IRHeader(0, 0, 0, 0), png))
        w.write_idx(1, rio.pack(rio.IRHeader(0, 0, 1, 0), png[:len(png) // 2]))
        w.write_idx(2, rio.pack(rio.IRHeader(0, 0, 2, 0), b'not an image at all'))
    ds = rio.ImageRecordDataset(rec, idx)
    ds[0]
    for i in (1, 2):
        with pytest.raises(rio.RecordIOError, match=r"g\.rec' record %d \(key %d, byte \d+\): cannot decode" % (i, i)):
            ds[i]


# ---------------------------------------------------------------------------- the example

def _example_module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + '.py'))
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, EXAMPLES)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(EXAMPLES)
    return mod


def write_png_folder(folder, labels, size=32, skip_label=None):
    """d2l's kaggle_cifar10_tiny layout: train/<id>.png, trainLabels.csv (id,label)."""
    os.makedirs(os.path.join(folder, 'train'))
    with open(os.path.join(folder, 'trainLabels.csv'), 'w') as f:
        f.write('id,label\n')
        for i, name in enumerate(labels, 1):
            if i != skip_label:
                f.write('%d,%s\n' % (i, name))
    for i, name in enumerate(labels, 1):
        PIL.fromarray(pattern(i % 10, size, size)).save(os.path.join(folder, 'train', '%d.png' % i))


def test_the_png_folder_reader_numbers_classes_by_name_and_holds_out_a_tenth(tmp_path):
    data = _example_module('cifar_data')
    names = ['truck', 'cat', 'airplane', 'cat', 'truck', 'airplane'] * 5     # 10 of each
    write_png_folder(str(tmp_path), names)
    (xt, yt), (xv, yv), classes = data.read_png_folder(str(tmp_path))
    assert classes == ['airplane', 'cat', 'truck']
    assert len(yv) == 3 and sorted(yv.tolist()) == [0, 1, 2] and len(yt) == 27
    # ids 1, 2, 3 are the first truck, cat, airplane: the held-out ones; id 4 leads train
    assert yv.tolist() == [2, 1, 0] and (xv[0] == pattern(1).transpose(2, 0, 1)).all()
    assert yt[0] == 1 and (xt[0] == pattern(4).transpose(2, 0, 1)).all()


def test_the_png_folder_reader_names_the_file_on_bad_input(tmp_path):
    data = _example_module('cifar_data')
    write_png_folder(str(tmp_path / 'a'), ['cat', 'dog', 'cat'], skip_label=2)
    with pytest.raises(data.DataError, match=r"train/2\.png: no label for id 2 in .*trainLabels\.csv"):
        data.read_png_folder(str(tmp_path / 'a'))
    write_png_folder(str(tmp_path / 'b'), ['cat', 'dog'], size=28)
    with pytest.raises(data.DataError, match=r"train/1\.png: the image is 28x28 pixels, CIFAR-10 images are 32x32"):
        data.read_png_folder(str(tmp_path / 'b'))
    write_png_folder(str(tmp_path / 'c'), ['cat', 'dog'])
    (tmp_path / 'c' / 'train' / '2.png').write_bytes(b'not a png')
    with pytest.raises(data.DataError, match=r"train/2\.png: cannot read the image"):
        data.read_png_folder(str(tmp_path / 'c'))
    with pytest.raises(data.DataError, match='needs trainLabels.csv and a train/ folder'):
        data.read_png_folder(str(tmp_path))


def test_vgg11_has_gluons_shape_for_32x32_input():
    torch = pytest.importorskip('torch')
    pytest.importorskip('torchvision')
    models = _example_module('cifar_models')
    counts = {name: sum(p.numel() for p in models.MODELS[name](num_classes=10, width=1.0).parameters())
              for name in ('vgg11', 'vgg11_bn', 'vgg11_linear', 'vgg11_imagenet_head')}
    # convolutions 9,220,480 + 512*4096+4096 + 4096*4096+4096 + 4096*10+10
    assert counts == {'vgg11': 28144010, 'vgg11_bn': 28149514, 'vgg11_linear': 9225610,
                      'vgg11_imagenet_head': 128807306}
    m = models.MODELS['vgg11'](num_classes=10, width=1.0)
    assert m.features(torch.zeros(2, 3, 32, 32)).shape == (2, 512, 1, 1)
    dense = [mod for mod in m.classifier if isinstance(mod, torch.nn.Linear)]
    assert [(d.in_features, d.out_features) for d in dense] == [(512, 4096), (4096, 4096), (4096, 10)]
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def run_example(args):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, 'python'))
    env.pop('DMLC_ROLE', None)
    p = subprocess.run(['/usr/bin/python3', os.path.join(EXAMPLES, 'image_classification.py'), '--json',
                        '--kvstore', 'local', '--model', 'resnet18', '--width', '0.125', '--batch-size', '8'] + args,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return p.returncode, p.stdout.decode()


def test_the_example_trains_on_recordio_and_png_folders(tmp_path):
    pytest.importorskip('torch')
    pytest.importorskip('torchvision')
    rec, idx = str(tmp_path / 'train.rec'), str(tmp_path / 'train.idx')
    write_images(rec, idx, 24)
    rc, out = run_example(['--data-train', rec, '--max-batches', '2'])
    assert rc == 0, out
    r = [json.loads(line) for line in out.splitlines() if line.startswith('{')]
    assert r and r[0]['data'] == 'recordio' and r[0]['batches'] == 2, out
    assert 'no --data-val' in out
    write_png_folder(str(tmp_path / 'png'), ['cat', 'dog', 'ship'] * 8)
    rc, out = run_example(['--dataset', 'cifar10-png', '--data-dir', str(tmp_path / 'png'), '--max-batches', '2'])
    assert rc == 0, out
    r = [json.loads(line) for line in out.splitlines() if line.startswith('{')]
    assert r and r[0]['data'] == 'cifar10-png', out
    # a label outside the 10 classes names the record
    write_images(str(tmp_path / 'bad.rec'), str(tmp_path / 'bad.idx'), 3, labels=[0, 12, 1])
    rc, out = run_example(['--data-train', str(tmp_path / 'bad.rec')])
    assert rc == 2 and "bad.rec' record 1 (key 1, byte" in out and 'label 12 is not a class 0..9' in out, out
