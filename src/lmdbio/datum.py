"""Caffe ``Datum`` records as numpy batches, Caffe's DataTransformer, and
:class:`DatumReader` (the documentation's "Caffe and PyTorch" guide).

* :func:`decode` turns a whole batch of serialized Datums (a
  :class:`lmdbio.Ragged` or a sequence of bytes) into one
  ``np.uint8[n, C, H, W]`` (``np.float32`` for ``float_data`` Datums) and
  ``np.int64[n]`` labels, in a single C call that runs without the GIL.
  Encoded (JPEG/PNG) Datums are decoded by OpenCV (``cv2``) when it is
  installed, else by Pillow, in parallel threads, to Caffe's channel order
  (BGR for colour, one channel for grey).
* :func:`decode_one`, :func:`encode` (what Caffe writes), :func:`read_mean`
  (a ``mean.binaryproto`` BlobProto).
* :class:`Transform`: crop (random in TRAIN, centre in TEST), mirror
  (probability 1/2 per datum whenever set), mean file or mean values, scale,
  exactly as Caffe's DataTransformer computes them, over a whole batch.
* :class:`DatumReader`: :class:`lmdbio.Reader` batches, decoded (and
  transformed) in a background thread, as ``(data, labels)``.

Malformed bytes raise :class:`lmdbio.DatumError` (a ``ValueError``) naming
the record; a batch whose records differ in shape or kind raises
``ValueError`` naming the first one that differs from record 0.
"""

import os
import queue
import struct
import threading
import zlib

import numpy as np

from lmdbio import _datum
from lmdbio.errors import DatumError, forked_error
from lmdbio.reader import Reader

__all__ = ['decode', 'decode_one', 'encode', 'encode_file', 'read_mean',
           'Transform', 'DatumReader', 'DatumError', 'image_backend']


# --------------------------------------------------------------------------
# input normalisation
# --------------------------------------------------------------------------

def _as_ragged(values):
    """(data: contiguous np.uint8, offsets: np.int64[n+1]) of a batch."""
    if isinstance(values, (bytes, bytearray, memoryview, str)):
        raise TypeError('decode() takes a batch (a Ragged or a sequence of '
                        'bytes); use decode_one() for a single Datum')
    if hasattr(values, 'data') and hasattr(values, 'offsets') and \
            not isinstance(values, np.ndarray):
        data = np.ascontiguousarray(values.data, dtype=np.uint8).reshape(-1)
        offsets = np.ascontiguousarray(values.offsets, dtype=np.int64)
        return data, offsets
    if isinstance(values, np.ndarray):
        if values.ndim != 2:
            raise ValueError('an array of Datums must be 2-D (n, bytes)')
        n, width = values.shape
        data = np.ascontiguousarray(values, dtype=np.uint8).reshape(-1)
        return data, np.arange(n + 1, dtype=np.int64) * width
    values = list(values)
    lengths = np.fromiter((len(memoryview(v).cast('B')) for v in values),
                          dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b''.join(values), dtype=np.uint8)
    return data, offsets


def _as_buffer(buf):
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf, dtype=np.uint8).reshape(-1)
    return np.frombuffer(buf, dtype=np.uint8)


def _renamed(exc, indices):
    """exc with its record index replaced by the ordinal indices[i]."""
    i = getattr(exc, 'index', None)
    if indices is None or i is None or i < 0 or i >= len(indices):
        return exc
    text = str(exc)
    old = 'record %d' % i
    if text.startswith(old):
        text = 'record %d%s' % (int(indices[i]), text[len(old):])
    new = type(exc)(text)
    new.index = int(indices[i])
    return new


# --------------------------------------------------------------------------
# images
# --------------------------------------------------------------------------

from lmdbio._images import (  # noqa: E402  (one home, shared with convert)
    image_backend, imdecode as _imdecode, chw as _chw, pool as _pool,
    default_threads as _default_threads,
)


def _decode_images(data, doff, dlen, force_color, force_gray, threads):
    n = len(doff)

    def image(i):
        buf = data[doff[i]:doff[i] + dlen[i]]
        try:
            return _chw(_imdecode(buf, force_color, force_gray))
        except Exception as e:
            err = DatumError('record %d: cannot decode its encoded image '
                             '(%d bytes): %s' % (i, dlen[i], e))
            err.index = i
            raise err from e

    first = image(0)
    out = np.empty((n,) + first.shape, dtype=np.uint8)
    out[0] = first
    problems = []  # (index, exception)

    def run(lo, hi):
        for i in range(lo, hi):
            try:
                img = image(i)
            except DatumError as e:
                problems.append((i, e))
                return
            if img.shape != first.shape:
                e = ValueError('record %d has shape %s, the batch\'s first '
                               'record %s' % (i, 'x'.join(map(str, img.shape)),
                                              'x'.join(map(str, first.shape))))
                e.index = i
                problems.append((i, e))
                return
            out[i] = img

    threads = _default_threads() if threads is None else max(1, int(threads))
    if threads == 1 or n <= 2:
        run(1, n)
    else:
        step = max(1, -(-(n - 1) // (threads * 4)))
        futures = [_pool(threads).submit(run, lo, min(n, lo + step))
                   for lo in range(1, n, step)]
        for f in futures:
            f.result()
    if problems:
        raise min(problems, key=lambda p: p[0])[1]
    return out


# --------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------

_THREADED_BYTES = 8 << 20  # raw batches this large decode in threads


def _check_color(color):
    if color not in ('bgr', 'rgb'):
        raise ValueError('color must be "bgr" (Caffe\'s order) or "rgb", '
                         'not %r' % (color,))


def _to_rgb(arr):
    """Images [..., C, H, W] stored BGR(A) -> RGB(A), in place: channels 0
    and 2 swapped (the reversal of B, G, R); one channel stays as it is."""
    c = arr.shape[-3]
    if c == 1:
        return arr
    if c not in (3, 4):
        raise ValueError('color="rgb" needs 1, 3 or 4 channels, the Datums '
                         'have %d' % c)
    blue = arr[..., 0, :, :].copy()
    arr[..., 0, :, :] = arr[..., 2, :, :]
    arr[..., 2, :, :] = blue
    return arr


def decode(values, *, force_color=False, force_gray=False, threads=None,
           indices=None, out=None, color='bgr'):
    """A batch of serialized Datums -> ``(data, labels)``.

    ``values``: the batch: an :class:`lmdbio.Ragged` (a Reader batch's
    ``values``), a sequence of bytes-like records, or a 2-D uint8 array of
    equal-length records.  ``data``: ``np.uint8[n, C, H, W]`` for raw and encoded Datums,
    ``np.float32[n, C, H, W]`` for ``float_data`` Datums; ``labels``:
    ``np.int64[n]``.  Raw and float Datums are decoded in one C call without
    the GIL (in ``threads`` threads; default: up to 4 for batches of 8 MiB
    or more, else one).  Encoded (JPEG/PNG) Datums are decoded in
    ``threads`` threads (default: the usable cores, at most 8) to BGR
    (colour) or one channel
    (grey), each keeping its file's channel count unless ``force_color``
    (three channels) or ``force_gray`` (one), as Caffe's transform_param.

    ``indices``: names to use for the records in error messages (e.g. the
    database ordinals of a Reader batch); default their position.
    ``out``: an array to decode raw or float Datums into (C-contiguous, of
    the result's dtype and shape), to reuse one buffer across batches.
    ``color``: ``"bgr"`` (default, the order Caffe stores and decodes) or
    ``"rgb"`` (channels 0 and 2 swapped: what PyTorch models expect).
    """
    if force_color and force_gray:
        raise ValueError('force_color and force_gray cannot both be set')
    _check_color(color)
    data, offsets = _as_ragged(values)
    n = len(offsets) - 1
    if n <= 0:
        return np.zeros((0, 0, 0, 0), np.uint8), np.zeros(0, np.int64)
    try:
        first = _datum.parse(data[offsets[0]:offsets[1]], 'record 0', 0)
        kind = first['kind']
        labels = np.empty(n, dtype=np.int64)
        c, h, w = first['channels'], first['height'], first['width']
        if kind == _datum.ENCODED:
            doff = np.empty(n, dtype=np.int64)
            dlen = np.empty(n, dtype=np.int64)
            _datum.decode_batch(data, offsets, kind, 0, 0, 0, None, labels,
                                doff, dlen)
            out = _decode_images(data, doff, dlen, force_color, force_gray,
                                 threads)
            return (_to_rgb(out) if color == 'rgb' else out), labels
        dtype = np.float32 if kind == _datum.FLOAT else np.uint8
        if out is None:
            out = np.empty((n, c, h, w), dtype=dtype)
        elif (not isinstance(out, np.ndarray) or out.dtype != dtype or
              out.shape != (n, c, h, w) or not out.flags.c_contiguous or
              not out.flags.writeable):
            raise ValueError('out must be a writable C-contiguous %s array '
                             'of shape %s' % (np.dtype(dtype).name,
                                              (n, c, h, w)))
        if threads is None:
            # threads pay off on big batches (copies and page faults of a
            # fresh output array run in parallel)
            big = int(offsets[-1] - offsets[0]) >= _THREADED_BYTES
            nthreads = min(4, _default_threads()) if big else 1
        else:
            nthreads = max(1, int(threads))
        if color == 'rgb' and c not in (1, 3, 4):
            _to_rgb(np.empty((c, 0, 0), dtype))  # raises: no such channels
        _datum.decode_batch(data, offsets, kind, c, h, w, out, labels,
                            nthreads=nthreads)
        return (_to_rgb(out) if color == 'rgb' else out), labels
    except (DatumError, ValueError) as e:
        if indices is not None and getattr(e, 'index', None) is not None:
            raise _renamed(e, indices) from e
        raise


def decode_one(buf, *, force_color=False, force_gray=False, color='bgr'):
    """One serialized Datum -> ``(array[C, H, W], label)``: uint8 pixels
    (raw or encoded Datums) or float32 (float_data); ``label`` an int.

    ``buf``: the record (bytes-like or a uint8 array).  ``force_color`` /
    ``force_gray``: decode an encoded image to three channels / one, as in
    :func:`decode`.  ``color``: ``"bgr"`` (default, Caffe's order) or
    ``"rgb"``."""
    if force_color and force_gray:
        raise ValueError('force_color and force_gray cannot both be set')
    _check_color(color)
    if color == 'rgb':
        arr, label = decode_one(buf, force_color=force_color,
                                force_gray=force_gray)
        return _to_rgb(arr), label
    b = _as_buffer(buf)
    d = _datum.parse(b, 'Datum')
    kind = d['kind']
    if kind == _datum.ENCODED:
        img = b[d['data_off']:d['data_off'] + d['data_len']]
        try:
            arr = _chw(_imdecode(img, force_color, force_gray))
        except Exception as e:
            raise DatumError('Datum: cannot decode its encoded image '
                             '(%d bytes): %s' % (d['data_len'], e)) from e
        return np.ascontiguousarray(arr), int(d['label'])
    shape = (d['channels'], d['height'], d['width'])
    if kind == _datum.FLOAT:
        arr = np.empty(d['nfloat'], dtype=np.float32)
        _datum.floats(b, arr)
        return arr.reshape(shape), int(d['label'])
    lo = d['data_off']
    arr = b[lo:lo + d['data_len']].copy().reshape(shape)
    return arr, int(d['label'])


# --------------------------------------------------------------------------
# encoding (what Caffe's serializer writes)
# --------------------------------------------------------------------------

def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _int32(field, v):
    v = int(v)
    if not -(1 << 31) <= v < (1 << 31):
        raise ValueError('%d does not fit an int32 Datum field' % v)
    return _varint(field << 3) + _varint(v & 0xFFFFFFFFFFFFFFFF)


def encode_file(image, label=None):
    """A Datum holding an image file's bytes as they are (JPEG, PNG, ...):
    ``data``, ``label`` and ``encoded: true``, what Caffe's
    ``convert_imageset --encoded`` stores for a file it need not re-encode."""
    image = bytes(image)
    parts = [b'\x22', _varint(len(image)), image]
    if label is not None:
        parts.append(_int32(5, label))
    parts.append(b'\x38\x01')
    return b''.join(parts)


def _png(chw):
    """PNG file of a (C, H, W) uint8 array in Caffe's order (BGR / BGRA /
    grey), written without an image library."""
    c, h, w = chw.shape
    if c == 1:
        hwc, ctype = chw[0][:, :, None], 0
    elif c == 3:
        hwc, ctype = chw[::-1].transpose(1, 2, 0), 2
    elif c == 4:
        hwc, ctype = chw[[2, 1, 0, 3]].transpose(1, 2, 0), 6
    else:
        raise ValueError('PNG needs 1, 3 or 4 channels, not %d' % c)
    rows = np.zeros((h, 1 + w * c), dtype=np.uint8)  # filter byte 0: none
    rows[:, 1:] = hwc.reshape(h, w * c)

    def chunk(kind, body):
        return (struct.pack('>I', len(body)) + kind + body +
                struct.pack('>I', zlib.crc32(kind + body) & 0xFFFFFFFF))

    return (b'\x89PNG\r\n\x1a\n' +
            chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, ctype, 0, 0, 0)) +
            chunk(b'IDAT', zlib.compress(rows.tobytes(), 6)) +
            chunk(b'IEND', b''))


def _jpeg(chw, quality):
    c = chw.shape[0]
    if c not in (1, 3):
        raise ValueError('JPEG needs 1 or 3 channels, not %d' % c)
    if image_backend() == 'cv2':
        import cv2
        img = chw[0] if c == 1 else chw.transpose(1, 2, 0)
        ok, buf = cv2.imencode('.jpg', np.ascontiguousarray(img),
                               [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        if not ok:
            raise ValueError('OpenCV could not encode the JPEG')
        return buf.tobytes()
    import io
    from PIL import Image
    img = chw[0] if c == 1 else chw[::-1].transpose(1, 2, 0)
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).save(out, format='JPEG',
                                                    quality=int(quality))
    return out.getvalue()


def encode(array, label=None, encoded=False, *, quality=95):
    """The serialized Datum Caffe writes for ``array`` (C, H, W) and
    ``label`` (an int32; None leaves it unset).

    * uint8, ``encoded=False``: channels, height, width, data, label and
      ``encoded: false``, as ``convert_imageset`` (``CVMatToDatum``) writes;
    * float arrays: channels, height, width, label and unpacked float_data,
      as pycaffe's ``array_to_datum``;
    * ``encoded=True`` (or ``"png"``): data is a PNG of the pixels (BGR
      order in, so a decoder gives them back), label, ``encoded: true``,
      no size fields, as ``convert_imageset --encoded``; ``"jpg"`` writes a
      JPEG (lossy) of the given ``quality`` with OpenCV or Pillow.

    A 2-D array is one channel.  ``protobuf``'s parser reads the result back
    to the same fields."""
    a = np.asarray(array)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise ValueError('a Datum holds a (C, H, W) array, not shape %s'
                         % (a.shape,))
    c, h, w = a.shape
    parts = []
    fmt = {False: None, None: None, True: 'png', 'png': 'png', 'jpg': 'jpg',
           'jpeg': 'jpg'}.get(encoded.lower() if isinstance(encoded, str)
                              else bool(encoded), 'bad')
    if fmt == 'bad':
        raise ValueError('encoded must be False, True, "png" or "jpg"')
    if fmt is not None:
        if a.dtype != np.uint8:
            raise ValueError('an encoded Datum holds uint8 pixels, not %s'
                             % a.dtype)
        a = np.ascontiguousarray(a)
        return encode_file(_png(a) if fmt == 'png' else _jpeg(a, quality),
                           label)
    parts += [_int32(1, c), _int32(2, h), _int32(3, w)]
    if a.dtype == np.uint8:
        raw = np.ascontiguousarray(a).tobytes()
        parts += [b'\x22', _varint(len(raw)), raw]
        if label is not None:
            parts.append(_int32(5, label))
        parts.append(b'\x38\x00')
        return b''.join(parts)
    if a.dtype.kind not in 'fiub':
        raise ValueError('cannot store %s values in a Datum' % a.dtype)
    if label is not None:
        parts.append(_int32(5, label))
    if a.size:
        # unpacked repeated float: tag 0x35 + 4 little-endian bytes each
        rec = np.empty((a.size, 5), dtype=np.uint8)
        rec[:, 0] = 0x35
        rec[:, 1:] = np.ascontiguousarray(a, dtype='<f4').reshape(-1, 1) \
            .view(np.uint8)
        parts.append(rec.tobytes())
    return b''.join(parts)


# --------------------------------------------------------------------------
# mean file
# --------------------------------------------------------------------------

def read_mean(path):
    """The Caffe mean file at ``path`` (``mean.binaryproto``, a BlobProto) as
    ``np.float32[C, H, W]``.  The shape comes from num/channels/height/width
    when set (older writers, ``compute_image_mean``), else from ``shape``;
    values from ``double_data`` when present, else ``data`` (as Caffe's
    ``Blob::FromProto``)."""
    with open(os.fspath(path), 'rb') as f:
        raw = f.read()
    what = '%s: BlobProto' % os.fspath(path)
    legacy, shape, values = _datum.parse_blob(np.frombuffer(raw, np.uint8),
                                              what)
    if legacy is not None:
        num, c, h, w = legacy
        if num != 1:
            raise DatumError('%s: holds %d blobs (num), a mean file holds 1'
                             % (what, num))
        dims = (c, h, w)
    elif shape is not None:
        dims = list(shape)
        while len(dims) > 3 and dims[0] == 1:
            dims.pop(0)
        if len(dims) > 3:
            raise DatumError('%s: shape %s is not a single (C, H, W) mean'
                             % (what, tuple(shape)))
        dims = (1,) * (3 - len(dims)) + tuple(dims)
    else:
        dims = (1, 1, len(values))
    count = int(np.prod(dims, dtype=np.int64))
    if count != len(values):
        raise DatumError('%s: shape %s needs %d values, the file holds %d'
                         % (what, 'x'.join(map(str, dims)), count,
                            len(values)))
    return values.reshape(dims)


# --------------------------------------------------------------------------
# DataTransformer
# --------------------------------------------------------------------------

def _phase(phase):
    if isinstance(phase, str):
        p = phase.strip().lower()
        if p in ('train', 'test'):
            return p
    elif phase in (0, 1) and not isinstance(phase, float):
        return ('train', 'test')[int(phase)]
    raise ValueError('phase must be "train" or "test" (or Caffe\'s TRAIN=0 / '
                     'TEST=1), not %r' % (phase,))


class Transform:
    """Caffe's DataTransformer over a whole batch.

    ``transform(data)``: ``data`` ``[n, C, H, W]`` (uint8 or float) ->
    ``np.float32[n, C, h, w]`` with, for each datum as Caffe does:

    * crop: ``crop_size`` c > 0 takes a c x c window at a random offset in
      ``[0, H - c] x [0, W - c]`` in the TRAIN phase, at the centre
      ``((H - c) // 2, (W - c) // 2)`` in TEST;
    * mirror: when ``mirror`` is set, a horizontal flip with probability 1/2
      (in either phase, as Caffe);
    * ``(pixel - mean) * scale`` in float32, the mean being the mean file's
      value at the same source position (``mean_file``: a path to a
      BlobProto or a ``[C, H, W]`` array of the datum's full size) or
      ``mean_value`` (one value, or one per channel).

    Random draws come from ``numpy.random.default_rng(seed)``, per call:
    the mirror flags ``integers(0, 2, n)`` (when mirror), then the row
    offsets ``integers(0, H - c + 1, n)`` and the column offsets
    ``integers(0, W - c + 1, n)`` (when cropping in TRAIN).  So a Transform
    built with the same seed and given the same batches repeats itself;
    ``transform(data, rng=g)`` draws from another Generator.

    ``force_color``/``force_gray`` are Caffe's transform_param fields for
    encoded Datums: readers (DatumReader, the Caffe layer) pass them to
    :func:`decode`.
    """

    def __init__(self, scale=1.0, mean_file=None, mean_value=None,
                 crop_size=0, mirror=False, phase="train", seed=0,
                 force_color=False, force_gray=False):
        self.scale = float(scale)
        self.crop_size = int(crop_size or 0)
        if self.crop_size < 0:
            raise ValueError('crop_size must be >= 0')
        self.mirror = bool(mirror)
        self.phase = _phase(phase)
        self.seed = seed
        self.force_color = bool(force_color)
        self.force_gray = bool(force_gray)
        if self.force_color and self.force_gray:
            raise ValueError('force_color and force_gray cannot both be set')
        if mean_value is not None and not isinstance(mean_value, (list, tuple,
                                                                   np.ndarray)):
            mean_value = [mean_value]
        if mean_value is not None and len(mean_value) == 0:
            mean_value = None
        if mean_file is not None and mean_value is not None:
            raise ValueError('Cannot specify mean_file and mean_value at the '
                             'same time')
        self.mean_file = None
        self.mean = None
        if mean_file is not None:
            if isinstance(mean_file, np.ndarray):
                mean = mean_file
            else:
                self.mean_file = os.fspath(mean_file)
                mean = read_mean(self.mean_file)
            mean = np.ascontiguousarray(mean, dtype=np.float32)
            if mean.ndim == 4 and mean.shape[0] == 1:
                mean = mean[0]
            if mean.ndim != 3:
                raise ValueError('the mean must be [C, H, W], not shape %s'
                                 % (mean.shape,))
            self.mean = mean
        self.mean_value = (None if mean_value is None else
                           np.asarray(mean_value, dtype=np.float32).reshape(-1))
        self.rng = np.random.default_rng(seed)

    def output_shape(self, shape):
        """(C, h, w) of a transformed datum of shape (C, H, W)."""
        c, h, w = shape[-3:]
        if self.crop_size:
            return (c, self.crop_size, self.crop_size)
        return (c, h, w)

    def reseed(self, seed):
        """Restart the random draws from ``numpy.random.default_rng(seed)``."""
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def __call__(self, data, rng=None, out=None):
        """Transform ``data`` [n, C, H, W] (or one datum [C, H, W]) into a
        new float32 array (the random draws from ``rng``, a numpy Generator,
        instead of the Transform's own when given), or into ``out`` (float32, C-contiguous, of the
        output shape: e.g. a Caffe top blob's ``data``)."""
        data = np.asarray(data)
        if data.ndim == 3:
            return self(data[None], rng,
                        None if out is None else out[None])[0]
        if data.ndim != 4:
            raise ValueError('transform takes data [n, C, H, W], not shape %s'
                             % (data.shape,))
        if data.dtype != np.uint8:
            data = data.astype(np.float32, copy=False)
        data = np.ascontiguousarray(data)
        n, c, h, w = data.shape
        crop = self.crop_size
        if crop and (crop > h or crop > w):
            raise ValueError('crop_size %d is larger than the datum (%dx%d)'
                             % (crop, h, w))
        mean = self.mean
        if mean is not None and mean.shape != (c, h, w):
            raise ValueError('the mean is %s, the data %s: they must match'
                             % ('x'.join(map(str, mean.shape)),
                                'x'.join(map(str, (c, h, w)))))
        mv = self.mean_value
        if mv is not None:
            if len(mv) == 1 and c != 1:
                mv = np.repeat(mv, c)
            elif len(mv) != c:
                raise ValueError('Specify either 1 mean_value or as many as '
                                 'channels: %d' % c)
        rng = self.rng if rng is None else rng
        mirror = (rng.integers(0, 2, n).astype(np.uint8) if self.mirror
                  else None)
        h_off = w_off = None
        if crop:
            if self.phase == 'train':
                h_off = rng.integers(0, h - crop + 1, n).astype(np.int64)
                w_off = rng.integers(0, w - crop + 1, n).astype(np.int64)
            else:
                h_off = np.full(n, (h - crop) // 2, dtype=np.int64)
                w_off = np.full(n, (w - crop) // 2, dtype=np.int64)
        shape = (n,) + self.output_shape((c, h, w))
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif (not isinstance(out, np.ndarray) or out.dtype != np.float32 or
              out.shape != shape or not out.flags.c_contiguous or
              not out.flags.writeable):
            raise ValueError('out must be a writable C-contiguous float32 '
                             'array of shape %s' % (shape,))
        _datum.transform(data, out, crop, h_off, w_off, mirror, mean, mv,
                         self.scale)
        return out

    transform = __call__

    def __repr__(self):
        parts = ['scale=%r' % self.scale]
        if self.mean_file:
            parts.append('mean_file=%r' % self.mean_file)
        elif self.mean is not None:
            parts.append('mean=<array %s>' % (self.mean.shape,))
        if self.mean_value is not None:
            parts.append('mean_value=%r' % self.mean_value.tolist())
        parts += ['crop_size=%d' % self.crop_size, 'mirror=%r' % self.mirror,
                  'phase=%r' % self.phase, 'seed=%r' % (self.seed,)]
        return 'Transform(%s)' % ', '.join(parts)


# --------------------------------------------------------------------------
# DatumReader
# --------------------------------------------------------------------------

_END = object()


def prefetched(make_items, depth, name, running=None):
    """The items of make_items(), produced in a thread up to `depth` ahead.
    An exception in the thread is raised in the consumer; when the consumer
    stops (or the producer's iterator ends) the thread is stopped and
    joined.  running: a list that holds (thread, stop event) while it runs,
    so an owner's close() can stop it."""
    q = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item):
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        items = make_items()
        try:
            for item in items:
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # raised again in the consumer
            put(e)
        finally:
            close = getattr(items, 'close', None)
            if close is not None:
                close()

    t = threading.Thread(target=produce, name=name, daemon=True)
    entry = (t, stop)
    if running is not None:
        running.append(entry)
    t.start()
    pid = os.getpid()
    try:
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                if os.getpid() != pid:   # the thread stayed in the parent
                    raise forked_error(name) from None
                continue
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join()
        if running is not None and entry in running:
            running.remove(entry)


class DatumReader:
    """Batches of a Caffe LMDB as ``(data, labels)`` numpy arrays.

    ``DatumReader(path, transform=None, **Reader_kwargs)``: the records come
    from :class:`lmdbio.Reader` (same arguments: ``batch_size``, ``shuffle``,
    ``seed``, ``rank``/``world_size``, ``drop_last``, ...), are decoded with
    :func:`decode` and, given a :class:`Transform`, transformed to float32.
    Decoding runs in a background thread ``prefetch`` batches ahead (0: in
    the caller's thread).  ``decode_threads``: threads for encoded images.
    ``force_color`` / ``force_gray``: decode encoded images to three
    channels / one (default: the ``transform``'s fields of those names).
    ``color``: ``"bgr"`` (default, Caffe's order) or ``"rgb"``, decoded
    before the transform (whose mean values follow the same order).
    ``path`` may be a list of environments read as one dataset.
    ``len()``, ``num_records``, ``total_records``, ``set_epoch()``,
    ``read(indices)`` and ``close()`` are the Reader's; ``state_dict()`` /
    ``load_state_dict()`` resume mid-epoch, and a DatumReader pickles as
    its arguments and position.
    """

    def __init__(self, path, *, transform=None, prefetch=2,
                 decode_threads=None, force_color=None, force_gray=None,
                 color='bgr', **reader_kwargs):
        self._path = ([os.fspath(p) for p in path]
                      if isinstance(path, (list, tuple)) else os.fspath(path))
        self._args = dict(transform=transform, prefetch=prefetch,
                          decode_threads=decode_threads,
                          force_color=force_color, force_gray=force_gray,
                          color=color, **reader_kwargs)
        reader_kwargs.setdefault('keys', False)  # values are enough
        _check_color(color)
        self.color = color
        self.transform = transform
        self.prefetch = int(prefetch)
        self.decode_threads = decode_threads
        t = transform
        self.force_color = bool(force_color if force_color is not None else
                                getattr(t, 'force_color', False))
        self.force_gray = bool(force_gray if force_gray is not None else
                               getattr(t, 'force_gray', False))
        self.reader = Reader(path, **reader_kwargs)
        self._threads = []
        self._received = 0  # batches the caller received this epoch

    # -- the Reader's sizes and controls ---------------------------------
    def __len__(self):
        return len(self.reader)

    @property
    def num_records(self):
        return self.reader.num_records

    @property
    def total_records(self):
        return self.reader.total_records

    @property
    def batch_size(self):
        return self.reader.batch_size

    @property
    def epoch(self):
        return self.reader.epoch

    def set_epoch(self, epoch):
        """Select the shuffle of epoch ``epoch`` (see Reader.set_epoch)."""
        if int(epoch) != self.reader.epoch:
            self._received = 0
        self.reader.set_epoch(epoch)

    # -- resuming and pickling ---------------------------------------------
    def state_dict(self):
        """The Reader's :meth:`~lmdbio.Reader.state_dict`, counting the
        batches this DatumReader handed out (not those decoded ahead)."""
        state = self.reader.state_dict()
        state['batches'] = int(self._received)
        return state

    def load_state_dict(self, state):
        """Resume at ``state``: see :meth:`lmdbio.Reader.load_state_dict`."""
        self.reader.load_state_dict(state)
        self._received = self.reader._received

    def __reduce__(self):
        # arguments, transform and position travel; threads do not
        if self.reader._comm is not None:
            raise TypeError('a DatumReader under MPI (comm=) cannot be '
                            'pickled: a communicator does not travel; open '
                            'one in each process')
        from lmdbio.reader import _reopen
        return (_reopen, (DatumReader, self._path, self._args,
                          self.state_dict()))

    # -- decoding ---------------------------------------------------------
    def _convert(self, batch):
        data, labels = decode(batch.values, force_color=self.force_color,
                              force_gray=self.force_gray,
                              threads=self.decode_threads,
                              indices=batch.indices, color=self.color)
        if self.transform is not None:
            data = self.transform(data)
        return data, labels

    def read(self, indices):
        """``(data, labels)`` of the records at the ordinals ``indices``
        (in that order)."""
        return self._convert(self.reader.read(indices))

    def __iter__(self):
        self._received = self.reader._start
        epoch = self.reader._epoch_count   # (see Reader.__iter__)
        if self.prefetch <= 0:
            for batch in self.reader:
                data = self._convert(batch)
                if self.reader._epoch_count == epoch:
                    self._received += 1
                yield data
            return
        def batches():
            it = iter(self.reader)
            try:
                for batch in it:
                    yield self._convert(batch)
            finally:
                it.close()  # stops the Reader's own prefetch at once

        for item in prefetched(batches, self.prefetch, 'lmdbio-datum',
                               self._threads):
            if self.reader._epoch_count == epoch:
                self._received += 1
            yield item

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Stop the decoding thread and close the Reader."""
        for t, stop in list(self._threads):
            stop.set()
            t.join()
        self._threads = []
        self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return 'DatumReader(%r, batch_size=%d, transform=%r)' % (
            self.reader.path, self.reader.batch_size, self.transform)
