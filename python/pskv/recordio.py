"""MXNet's RecordIO image datasets (``.rec`` + ``.idx``, what ``im2rec`` writes and
``mx.io.ImageRecordIter`` reads), in pure Python with numpy; images are decoded
with Pillow (Debian's python3-pil). The C++ ``pskv::data::ImageRecordIter``
(pskv/recordio.h) reads the same files.

    it = pskv.recordio.ImageRecordIter(path_imgrec='train.rec', path_imgidx='train.idx',
                                       data_shape=(3, 32, 32), batch_size=128, shuffle=True,
                                       seed=1, num_parts=kv.num_workers, part_index=kv.rank)
    for epoch in range(n):
        it.reset(epoch)
        for data, label, pad in it:        # float32 [b, 3, 32, 32] (NCHW), float32 [b]
            ...

    with pskv.recordio.MXIndexedRecordIO('x.idx', 'x.rec', 'w') as w:   # as mx.recordio
        w.write_idx(0, pskv.recordio.pack_img(IRHeader(0, 3.0, 0, 0), rgb_uint8_hwc, img_fmt='.png'))

Format: every record is uint32 magic 0xced7230a, uint32 lrecord (upper 3 bits a
part flag, lower 29 bits the length), the payload, zero padding to 4 bytes; a
payload holding the magic at a 4-byte-aligned position is split into parts there.
An image record's payload is the IRHeader (uint32 flag, float32 label, uint64 id,
uint64 id2), ``flag`` float32 labels when flag > 0, then the JPEG or PNG. The .idx
has one ``key<TAB>offset`` line per record; records are read in offset order.

One difference from MXNet: ``pack_img``/``unpack_img`` take and give RGB images
(Pillow's order); MXNet's, built on OpenCV, use BGR. ImageRecordIter gives RGB, as
MXNet's does.

A malformed file raises :class:`RecordIOError` (an ``OSError``) naming the file and
the record (its position, .idx key and byte offset).
"""
import collections
import io
import numbers
import os
import struct

import numpy as np

MAGIC = 0xced7230a
_LEN_MASK = (1 << 29) - 1
_IR_FORMAT = '<IfQQ'
_IR_SIZE = struct.calcsize(_IR_FORMAT)   # 24
_MAGIC_BYTES = struct.pack('<I', MAGIC)

IRHeader = collections.namedtuple('IRHeader', ['flag', 'label', 'id', 'id2'])
IRHeader.__doc__ = """An image record's header (MXNet's): ``flag`` labels follow when > 0
(``label`` then unused), else ``label`` is the one label; ``id``, ``id2`` identify it."""


class RecordIOError(OSError):
    """A RecordIO file (or an image in it) is malformed; the message names the file
    and the record.

    Parameters
    ----------
    message : str
        What is wrong, where.
    """


# ---------------------------------------------------------------------------- framing

def _frame(payload):
    """The bytes of one record: parts split at aligned magics, padded to 4 bytes."""
    out, begin, n = [], 0, len(payload)
    view = memoryview(payload)
    i = payload.find(_MAGIC_BYTES)
    while i != -1 and i + 4 <= n:
        if i % 4 == 0:
            out.append(struct.pack('<II', MAGIC, ((1 if begin == 0 else 2) << 29) | (i - begin)))
            out.append(view[begin:i])
            begin = i + 4
        i = payload.find(_MAGIC_BYTES, i + 1)
    out.append(struct.pack('<II', MAGIC, ((0 if begin == 0 else 3) << 29) | (n - begin)))
    out.append(view[begin:])
    out.append(b'\0' * (-n % 4))
    return b''.join(out)


def _read_record(f, offset, file_size, what, want=True):
    """(payload or None, offset after it) of the record at `offset` of open file `f`."""
    parts, first = [], True
    while True:
        if offset + 8 > file_size:
            raise RecordIOError('%s: truncated: a record header at byte %d runs past the end of the file '
                                '(%d bytes); the file was cut short' % (what, offset, file_size))
        f.seek(offset)
        magic, lrec = struct.unpack('<II', f.read(8))
        if magic != MAGIC:
            raise RecordIOError('%s: bad magic 0x%08x at byte %d (RecordIO records start with 0x%08x): not a '
                                'RecordIO file, corrupt, or its .idx does not belong to it'
                                % (what, magic, offset, MAGIC))
        cflag, length = lrec >> 29, lrec & _LEN_MASK
        if cflag > 3 or (first and cflag >= 2) or (not first and cflag <= 1):
            raise RecordIOError('%s: part flag %d at byte %d is out of sequence (corrupt multi-part record)'
                                % (what, cflag, offset))
        if offset + 8 + length > file_size:
            raise RecordIOError('%s: length %d at byte %d runs past the end of the file (%d bytes): truncated '
                                'or corrupt' % (what, length, offset, file_size))
        if want:
            parts.append(f.read(length))
        offset += 8 + length + (-length % 4)
        if cflag in (0, 3):
            return (_MAGIC_BYTES.join(parts) if want else None), min(offset, file_size)
        first = False


class MXRecordIO:
    """Sequential reading or writing of a .rec file, as ``mx.recordio.MXRecordIO``.

    Parameters
    ----------
    uri : str
        The .rec path.
    flag : str
        ``'r'`` or ``'w'``.
    """

    def __init__(self, uri, flag):
        if flag not in ('r', 'w'):
            raise ValueError("MXRecordIO flag must be 'r' or 'w', got %r" % (flag,))
        self.uri, self.flag = str(uri), flag
        self.open()

    def open(self):
        """Opens the file (done by the constructor)."""
        self._f = open(self.uri, 'rb' if self.flag == 'r' else 'wb')
        self._size = os.fstat(self._f.fileno()).st_size if self.flag == 'r' else 0
        self._pos, self._count = 0, 0

    def close(self):
        """Closes the file."""
        if self._f is not None:
            self._f.close()
            self._f = None

    def reset(self):
        """Back to the first record (reading), as after opening."""
        self.close()
        self.open()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def tell(self):
        """The byte offset of the next record."""
        return self._pos

    def write(self, buf):
        """Appends one record.

        Parameters
        ----------
        buf : bytes
            The payload (less than 2^29 bytes).
        """
        if self.flag != 'w':
            raise ValueError('%s was opened for reading' % self.uri)
        if len(buf) > _LEN_MASK:
            raise ValueError('a RecordIO record holds less than 2^29 bytes; this one has %d' % len(buf))
        data = _frame(bytes(buf))
        self._f.write(data)
        self._pos += len(data)
        self._count += 1

    def read(self):
        """The next record's payload, or None at the end of the file."""
        if self.flag != 'r':
            raise ValueError('%s was opened for writing' % self.uri)
        if self._pos >= self._size:
            return None
        what = "'%s' record %d (byte %d)" % (self.uri, self._count, self._pos)
        payload, self._pos = _read_record(self._f, self._pos, self._size, what)
        self._count += 1
        return payload


class MXIndexedRecordIO(MXRecordIO):
    """Random access through a .idx file, as ``mx.recordio.MXIndexedRecordIO``.

    Parameters
    ----------
    idx_path : str
        The .idx path (``key<TAB>offset`` lines).
    uri : str
        The .rec path.
    flag : str
        ``'r'`` or ``'w'``.
    """

    def __init__(self, idx_path, uri, flag):
        self.idx_path = str(idx_path)
        self.idx, self.keys = {}, []
        super().__init__(uri, flag)

    def open(self):
        """Opens the files and, for reading, loads the index."""
        super().open()
        self.idx, self.keys = {}, []
        if self.flag == 'w':
            self._fidx = open(self.idx_path, 'w')
            return
        self._fidx = None
        for key, offset, lineno in _read_idx(self.idx_path, self.uri, self._size):
            self.idx[key] = offset
            self.keys.append(key)

    def close(self):
        """Closes both files."""
        super().close()
        if getattr(self, '_fidx', None) is not None:
            self._fidx.close()
            self._fidx = None

    def seek(self, key):
        """Makes the record with .idx key `key` the next one :meth:`read` returns.

        Parameters
        ----------
        key : int
            The .idx key.
        """
        self._pos = self.idx[key]

    def read_idx(self, key):
        """The payload of one record.

        Parameters
        ----------
        key : int
            Its .idx key.

        Returns
        -------
        bytes
        """
        if key not in self.idx:
            raise KeyError('%s has no record with key %r' % (self.idx_path, key))
        what = "'%s' key %d (byte %d)" % (self.uri, key, self.idx[key])
        return _read_record(self._f, self.idx[key], self._size, what)[0]

    def write_idx(self, key, buf):
        """Appends a record and its .idx line.

        Parameters
        ----------
        key : int
            The .idx key.
        buf : bytes
            The payload.
        """
        key = int(key)
        self._fidx.write('%d\t%d\n' % (key, self._pos))
        self.idx[key] = self._pos
        self.keys.append(key)
        self.write(buf)


def _read_idx(idx_path, rec_path, rec_size):
    """[(key, offset, line number)] of an .idx file, checked against the .rec's size."""
    out = []
    try:
        f = open(idx_path)
    except OSError as e:
        raise RecordIOError("cannot open RecordIO index '%s': %s" % (idx_path, e.strerror)) from None
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            fields = line.split()
            try:
                key, offset = int(fields[0]), int(fields[1])
                if len(fields) != 2 or key < 0 or offset < 0:
                    raise ValueError
            except (ValueError, IndexError):
                raise RecordIOError("'%s' line %d: %r is not 'key<TAB>offset' (is this the .idx of '%s'?)"
                                    % (idx_path, lineno, line.rstrip('\n'), rec_path)) from None
            if offset + 8 > rec_size:
                raise RecordIOError("'%s' line %d: offset %d of key %d is past the end of '%s' (%d bytes): the "
                                    '.rec is truncated or the .idx belongs to another file'
                                    % (idx_path, lineno, offset, key, rec_path, rec_size))
            out.append((key, offset, lineno))
    return out


# ---------------------------------------------------------------------------- image records

def pack(header, s):
    """An image record's payload, as ``mx.recordio.pack``.

    Parameters
    ----------
    header : IRHeader
        The header; an array `label` is stored after it and sets ``flag`` to its size.
    s : bytes
        The encoded image.

    Returns
    -------
    bytes
    """
    header = IRHeader(*header)
    if isinstance(header.label, numbers.Number):
        if header.flag != 0:
            raise ValueError('IRHeader.flag is %d with a single label: flag counts the labels of an array label'
                             % header.flag)
        extra = b''
    else:
        labels = np.asarray(header.label, dtype='<f4').ravel()
        header = header._replace(flag=labels.size, label=0)
        extra = labels.tobytes()
    return struct.pack(_IR_FORMAT, header.flag, header.label, header.id, header.id2) + extra + bytes(s)


def unpack(s, what='record'):
    """Splits a payload, as ``mx.recordio.unpack``.

    Parameters
    ----------
    s : bytes
        The payload.
    what : str, optional
        Names the record in errors.

    Returns
    -------
    tuple
        (IRHeader, encoded image bytes); the label is a float32 array when flag > 0.
    """
    if len(s) < _IR_SIZE:
        raise RecordIOError('%s: %d bytes, shorter than an image-record header (24 bytes)' % (what, len(s)))
    header = IRHeader(*struct.unpack(_IR_FORMAT, s[:_IR_SIZE]))
    s = s[_IR_SIZE:]
    if header.flag > 0:
        if len(s) < 4 * header.flag:
            raise RecordIOError('%s: the header announces %d labels but the record ends after %d bytes: labels '
                                'missing (corrupt record)' % (what, header.flag, _IR_SIZE + len(s)))
        header = header._replace(label=np.frombuffer(s, '<f4', header.flag).copy())
        s = s[4 * header.flag:]
    return header, s


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("pskv.recordio decodes images with Pillow: install Debian's python3-pil "
                          '(scripts/install-deps.sh)') from None
    return Image


def encode_img(img, quality=95, img_fmt='.jpg'):
    """Encodes an image with Pillow.

    Parameters
    ----------
    img : numpy.ndarray
        RGB (HxWx3) or grey (HxW) uint8.
    quality : int, optional
        JPEG quality 1-100; for PNG a compression level 0-9 (larger: 6).
    img_fmt : str, optional
        ``'.jpg'`` or ``'.png'``.

    Returns
    -------
    bytes
    """
    Image = _pil()
    fmt = img_fmt.lower().lstrip('.')
    buf = io.BytesIO()
    im = Image.fromarray(np.ascontiguousarray(img, dtype=np.uint8))
    if fmt in ('jpg', 'jpeg'):
        im.save(buf, format='JPEG', quality=int(quality))
    elif fmt == 'png':
        im.save(buf, format='PNG', compress_level=min(9, max(0, int(quality))) if quality <= 9 else 6)
    else:
        raise ValueError("img_fmt must be '.jpg' or '.png', got %r" % (img_fmt,))
    return buf.getvalue()


def decode_img(buf, channels=3, what='image'):
    """Decodes a JPEG or PNG with Pillow.

    Parameters
    ----------
    buf : bytes
        The encoded image.
    channels : int, optional
        3 (RGB) or 1 (grey).
    what : str, optional
        Names the record in errors.

    Returns
    -------
    numpy.ndarray
        HxWxC uint8.
    """
    Image = _pil()
    try:
        im = Image.open(io.BytesIO(buf))
        if im.format not in ('JPEG', 'PNG'):
            raise RecordIOError('%s: the image is %s, not JPEG or PNG' % (what, im.format))
        im = im.convert('L' if channels == 1 else 'RGB')
    except RecordIOError:
        raise
    except Exception as e:  # Pillow raises several types for bad data
        raise RecordIOError('%s: cannot decode its image (%d bytes; neither a valid JPEG nor PNG): %s'
                            % (what, len(buf), e)) from None
    a = np.asarray(im, dtype=np.uint8)
    return a.reshape(a.shape[0], a.shape[1], channels)


def pack_img(header, img, quality=95, img_fmt='.jpg'):
    """An image record's payload, as ``mx.recordio.pack_img`` (whose images are BGR).

    Parameters
    ----------
    header : IRHeader
        See :func:`pack`.
    img : numpy.ndarray
        RGB (HxWx3) or grey (HxW) uint8.
    quality, img_fmt
        See :func:`encode_img`.

    Returns
    -------
    bytes
    """
    return pack(header, encode_img(img, quality, img_fmt))


def unpack_img(s, channels=3):
    """Splits and decodes a payload, as ``mx.recordio.unpack_img`` (which gives BGR).

    Parameters
    ----------
    s : bytes
        The payload.
    channels : int, optional
        3 (RGB) or 1 (grey).

    Returns
    -------
    tuple
        (IRHeader, HxWxC uint8 image).
    """
    header, buf = unpack(s)
    return header, decode_img(buf, channels)


# ---------------------------------------------------------------------------- datasets

def record_partition(count, num_parts=1, part_index=0):
    """Records [begin, end) of one part, as MXNet's indexed RecordIO split.

    Parameters
    ----------
    count : int
        Records in the file.
    num_parts, part_index : int, optional
        The parts and this one.

    Returns
    -------
    tuple of int
        With step = ceil(count / num_parts): (p*step, (p+1)*step), both cut at
        `count` (a trailing part can be empty).
    """
    if not 0 <= part_index < num_parts:
        raise ValueError('part_index must be in [0, num_parts): got part %d of %d' % (part_index, num_parts))
    step = -(-count // num_parts)
    return min(count, step * part_index), min(count, step * (part_index + 1))


class ImageRecordDataset:
    """The image records of one part of a .rec file: ``ds[i]`` is (uint8 CxHxW RGB
    image, float32 labels [label_width]); images must have `data_shape` (no resizing).

    Parameters
    ----------
    path_imgrec : str
        The .rec file.
    path_imgidx : str, optional
        Its .idx; without one the .rec is scanned once for record boundaries.
    data_shape : tuple of int, optional
        (channels, height, width); channels 1 or 3.
    label_width : int, optional
        Labels per record.
    num_parts, part_index : int, optional
        This reader's part (see :func:`record_partition`).
    """

    def __init__(self, path_imgrec, path_imgidx=None, data_shape=(3, 32, 32), label_width=1, num_parts=1,
                 part_index=0):
        self.path_imgrec = str(path_imgrec)
        self.data_shape = tuple(int(d) for d in data_shape)
        if len(self.data_shape) != 3 or self.data_shape[0] not in (1, 3) or min(self.data_shape) < 1:
            raise ValueError('data_shape must be (channels 1 or 3, height, width), got %r' % (data_shape,))
        if label_width < 1:
            raise ValueError('label_width must be >= 1, got %d' % label_width)
        self.label_width = int(label_width)
        self._f = open(self.path_imgrec, 'rb')
        try:
            self._load(path_imgidx, num_parts, part_index)
        except BaseException:
            self._f.close()
            raise

    def _load(self, path_imgidx, num_parts, part_index):
        self._size = os.fstat(self._f.fileno()).st_size
        if path_imgidx:
            recs = sorted(((off, key) for key, off, _ in _read_idx(str(path_imgidx), self.path_imgrec, self._size)),
                          key=lambda r: r[0])
        else:
            recs, off = [], 0
            while off < self._size:
                recs.append((off, len(recs)))
                off = _read_record(self._f, off, self._size, self._describe_at(len(recs) - 1, off, recs[-1][1]),
                                   want=False)[1]
        self._count = len(recs)
        lo, hi = record_partition(len(recs), num_parts, part_index)
        if hi <= lo:
            raise ValueError("part %d of %d of '%s' is empty (%d records): use fewer parts"
                             % (part_index, num_parts, self.path_imgrec, len(recs)))
        self._first = lo
        self._records = recs[lo:hi]

    def _describe_at(self, i, offset, key):
        return "'%s' record %d (key %d, byte %d)" % (self.path_imgrec, i, key, offset)

    def describe(self, i):
        """Names an item in messages.

        Parameters
        ----------
        i : int
            The item (0 .. len - 1).

        Returns
        -------
        str
            "'FILE' record I (key K, byte O)"; I counts from the file's first record.
        """
        off, key = self._records[i]
        return self._describe_at(self._first + i, off, key)

    def __len__(self):
        return len(self._records)

    def close(self):
        """Closes the .rec file."""
        self._f.close()

    def record(self, i):
        """The undecoded record.

        Parameters
        ----------
        i : int
            The item.

        Returns
        -------
        tuple
            (IRHeader, encoded image bytes).
        """
        off, _ = self._records[i]
        what = self.describe(i)
        return unpack(_read_record(self._f, off, self._size, what)[0], what)

    def __getitem__(self, i):
        header, buf = self.record(i)
        what = self.describe(i)
        if header.flag == 0:
            labels = np.array([header.label], np.float32)
        else:
            labels = header.label
        if labels.size < self.label_width:
            raise RecordIOError('%s: %d label(s), label_width is %d: labels missing'
                                % (what, labels.size, self.label_width))
        c, h, w = self.data_shape
        img = decode_img(buf, c, what)
        if img.shape[:2] != (h, w):
            raise RecordIOError('%s: the image is %dx%d pixels, data_shape wants %dx%d (this reader does not '
                                'resize: write the records at that size)' % (what, img.shape[0], img.shape[1], h, w))
        return img.transpose(2, 0, 1), labels[:self.label_width]

    def read_all(self):
        """(uint8 images [n, C, H, W], float32 labels [n, label_width]) of the whole part."""
        n = len(self)
        x = np.empty((n,) + self.data_shape, np.uint8)
        y = np.empty((n, self.label_width), np.float32)
        for i in range(n):
            x[i], y[i] = self[i]
        return x, y


class ImageRecordIter:
    """Batches of decoded images, as ``mx.io.ImageRecordIter`` (its argument names).

    Iterating yields (data float32 [batch_size, C, H, W], label float32 [batch_size] or
    [batch_size, label_width], pad): data = (pixel - mean) / std per channel. With
    `round_batch` (MXNet's default) the last batch is filled from the start of the
    epoch's order and `pad` counts those repeats; without it the last batch is short.
    With `shuffle`, epoch e's order is a permutation drawn from (seed, e, part_index):
    the same arguments give the same batches (the C++ reader draws its own order).

    Parameters
    ----------
    path_imgrec, path_imgidx, data_shape, label_width, num_parts, part_index
        See :class:`ImageRecordDataset`.
    batch_size : int, optional
        Records per batch.
    shuffle : bool, optional
        Shuffle each epoch.
    seed : int, optional
        The shuffle's seed.
    round_batch : bool, optional
        Fill the last batch from the epoch's start (True) or leave it short.
    mean_r, mean_g, mean_b, std_r, std_g, std_b : float, optional
        Per-channel normalisation (defaults leave pixels at 0..255).
    """

    def __init__(self, path_imgrec, data_shape=(3, 32, 32), batch_size=128, path_imgidx=None, label_width=1,
                 shuffle=False, seed=0, num_parts=1, part_index=0, round_batch=True, mean_r=0.0, mean_g=0.0,
                 mean_b=0.0, std_r=1.0, std_g=1.0, std_b=1.0):
        self.dataset = ImageRecordDataset(path_imgrec, path_imgidx, data_shape, label_width, num_parts, part_index)
        if batch_size < 1:
            raise ValueError('batch_size must be >= 1, got %d' % batch_size)
        self.batch_size, self.shuffle, self.seed = int(batch_size), bool(shuffle), int(seed)
        self.part_index, self.round_batch = int(part_index), bool(round_batch)
        c = self.dataset.data_shape[0]
        self.mean = np.array([mean_r, mean_g, mean_b][:c], np.float32).reshape(c, 1, 1)
        self.std = np.array([std_r, std_g, std_b][:c], np.float32).reshape(c, 1, 1)
        if (self.std <= 0).any():
            raise ValueError('std_r/std_g/std_b must be positive')
        self.reset(0)

    def __len__(self):
        """Batches per epoch."""
        return -(-len(self.dataset) // self.batch_size)

    def reset(self, epoch=0):
        """Starts an epoch.

        Parameters
        ----------
        epoch : int, optional
            Its number (chooses the shuffled order).
        """
        order = np.arange(len(self.dataset))
        if self.shuffle:
            np.random.default_rng([self.seed, epoch, self.part_index]).shuffle(order)
        self._order, self._pos = order, 0

    def __iter__(self):
        return self

    def __next__(self):
        n = len(self._order)
        if self._pos >= n:
            raise StopIteration
        left = n - self._pos
        size = self.batch_size if self.round_batch else min(self.batch_size, left)
        data = np.empty((size,) + self.dataset.data_shape, np.float32)
        labels = np.empty((size, self.dataset.label_width), np.float32)
        for j in range(size):
            img, lab = self.dataset[int(self._order[(self._pos + j) % n])]
            data[j], labels[j] = img, lab
        self._pos += min(size, left)
        data -= self.mean
        data /= self.std
        return data, (labels[:, 0] if self.dataset.label_width == 1 else labels), max(0, size - left)
