"""``lmdbio convert``: build a Caffe-style LMDB of Datums.

From a folder of images and a list file, as Caffe's ``convert_imageset``::

    lmdbio convert [--gray] [--shuffle] [--resize_height H --resize_width W]
                   [--check_size] [--encoded] [--encode_type png|jpg]
                   ROOTFOLDER/ LISTFILE DB_NAME

Each LISTFILE line is ``path label`` (the label after the last space, so a
path may contain spaces).  Images are read from ROOTFOLDER + path (OpenCV,
else Pillow), colour (3 channels, BGR) unless ``--gray``, resized with
bilinear interpolation when both sizes are given, and stored as raw Datums
(channels/height/width/data/label) under the keys ``"%08d_%s" % (line,
path)``, committed every 1000 records.  ``--encoded`` stores compressed
images instead (the file itself when it needs no resize and has the
encode type's extension, else re-encoded), as convert_imageset does;
``--encode_type`` alone implies it (as in Caffe).  Unreadable images are
reported and skipped, as Caffe does.

From numpy arrays::

    lmdbio convert --npz [--data-key K] [--label-key K] [--nhwc] [--rgb]
                   [--encoded] [--shuffle] FILE.npz DB_NAME

FILE.npz holds the images, ``[N, C, H, W]`` (``--nhwc``: ``[N, H, W, C]``;
``[N, H, W]``: grey) uint8 (or float: float_data Datums) in BGR order
(``--rgb`` flips RGB to BGR), and the labels ``[N]``; keys ``"%08d" % i``.

The database is written with py-lmdb (lmdbio itself never writes) into a
new directory DB_NAME; its map grows as needed.
"""

import argparse
import os
import sys
import time
import zipfile

import numpy as np

__all__ = ['main', 'convert_imageset', 'convert_arrays']


class UsageError(Exception):
    pass


class ConvertError(Exception):
    pass


_USAGE = """\
usage: lmdbio convert [options] ROOTFOLDER/ LISTFILE DB_NAME
       lmdbio convert --npz [options] FILE.npz DB_NAME
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)

    def exit(self, status=0, message=None):
        raise SystemExit(status)


def _parser():
    p = _Parser(
        prog='lmdbio convert', add_help=True,
        description='Build a Caffe LMDB of Datums from a folder of images '
                    'and a list file (as Caffe\'s convert_imageset), or from '
                    'a .npz of arrays and labels.',
        usage=_USAGE[len('usage: '):])
    p.add_argument('inputs', nargs='+',
                   help='ROOTFOLDER LISTFILE DB_NAME, or with --npz: '
                        'FILE.npz DB_NAME')
    p.add_argument('--npz', action='store_true',
                   help='convert a .npz of images and labels')
    p.add_argument('--gray', action='store_true',
                   help='read images as grey (1 channel); default colour')
    p.add_argument('--shuffle', action='store_true',
                   help='randomly shuffle the order of the records')
    p.add_argument('--seed', type=int, default=0,
                   help='seed of --shuffle (numpy PCG64); default 0')
    p.add_argument('--resize_height', '--resize-height', type=int, default=0,
                   dest='resize_height', metavar='H')
    p.add_argument('--resize_width', '--resize-width', type=int, default=0,
                   dest='resize_width', metavar='W',
                   help='resize to H x W (both > 0) before storing')
    p.add_argument('--check_size', '--check-size', action='store_true',
                   dest='check_size',
                   help='fail when the records differ in size')
    p.add_argument('--encoded', action='store_true',
                   help='store compressed images (encoded Datums)')
    p.add_argument('--encode_type', '--encode-type', default='',
                   dest='encode_type', metavar='png|jpg',
                   help='format of encoded images (default: the file\'s own '
                        'for images, png for --npz)')
    p.add_argument('--data-key', default=None,
                   help='array of images in the .npz (default: data, x, '
                        'images, X)')
    p.add_argument('--label-key', default=None,
                   help='array of labels in the .npz (default: labels, '
                        'label, y, targets)')
    p.add_argument('--nhwc', action='store_true',
                   help='the .npz images are [N, H, W, C]')
    p.add_argument('--rgb', action='store_true',
                   help='the .npz images are RGB: store them as BGR')
    p.add_argument('--map-size', type=int, default=1 << 30,
                   help='initial LMDB map size in bytes (doubled as needed)')
    p.add_argument('--commit-every', type=int, default=1000)
    p.add_argument('--threads', type=int, default=None,
                   help='image decoding threads (default: the cores, <= 8)')
    p.add_argument('-q', '--quiet', action='store_true')
    return p


# --------------------------------------------------------------------------
# writing


class _Writer:
    """Records into a new LMDB with py-lmdb, committed in chunks, the map
    doubled whenever it fills."""

    def __init__(self, path, map_size, commit_every):
        try:
            import lmdb
        except ImportError:
            raise ConvertError('writing an LMDB needs py-lmdb, which is not '
                               'installed: pip install "lmdbio[convert]" '
                               '(or pip install lmdb)') from None
        self.lmdb = lmdb
        path = os.fspath(path)
        if os.path.exists(path) and (not os.path.isdir(path) or
                                     os.listdir(path)):
            raise ConvertError('%s already exists (convert writes a new '
                               'database)' % path)
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.env = lmdb.open(path, map_size=max(1 << 20, int(map_size)),
                             subdir=True, readahead=False, meminit=False,
                             max_dbs=0)
        self.commit_every = max(1, int(commit_every))
        self.pending = []
        self.count = 0
        self.value_bytes = 0

    def put(self, key, value):
        self.pending.append((key, value))
        if len(self.pending) >= self.commit_every:
            self.commit()

    def commit(self):
        if not self.pending:
            return
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for k, v in self.pending:
                        txn.put(k, v)
                break
            except self.lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()['map_size'] * 2)
        self.count += len(self.pending)
        self.value_bytes += sum(len(v) for _, v in self.pending)
        self.pending = []

    def close(self):
        try:
            self.commit()
            self.env.sync(True)
        finally:
            self.env.close()


# --------------------------------------------------------------------------
# images (convert_imageset)


def read_list(listfile):
    """[(path, label)] of a convert_imageset list file."""
    lines = []
    with open(listfile, encoding='utf-8') as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip('\r\n')
            if not line.strip():
                continue
            pos = line.rfind(' ')
            if pos <= 0:
                raise ConvertError('%s:%d: expected "path label", got %r'
                                   % (listfile, no, line))
            try:
                label = int(line[pos + 1:])
            except ValueError:
                raise ConvertError('%s:%d: the label %r is not an integer'
                                   % (listfile, no, line[pos + 1:])) from None
            lines.append((line[:pos], label))
    return lines


def _resize(img, height, width):
    from lmdbio._images import image_backend
    if image_backend() == 'cv2':
        import cv2
        return cv2.resize(img, (width, height), interpolation=cv2.INTER_LINEAR)
    from PIL import Image
    if img.ndim == 2:
        return np.asarray(Image.fromarray(img).resize((width, height),
                                                      Image.BILINEAR))
    rgb = Image.fromarray(np.ascontiguousarray(img[:, :, ::-1]))
    return np.asarray(rgb.resize((width, height), Image.BILINEAR))[:, :, ::-1]


def _image_record(path, label, is_color, height, width, enc):
    """convert_imageset's ReadImageToDatum: the serialized Datum, or None
    when the image cannot be read."""
    from lmdbio._images import imdecode, chw
    from lmdbio.datum import encode, encode_file
    try:
        with open(path, 'rb') as f:
            raw = f.read()
        img = imdecode(np.frombuffer(raw, np.uint8), is_color, not is_color)
    except Exception:
        return None
    if height > 0 and width > 0:
        img = _resize(img, height, width)
    if enc:
        channels = 3 if img.ndim == 3 else 1
        lower = path.lower()
        ext_ok = lower.endswith('.' + enc) or (enc == 'jpg' and
                                               lower.endswith('.jpeg'))
        if (channels == 3) == is_color and not height and not width and \
                ext_ok:
            # the file itself (ReadFileToDatum): data, label, encoded
            return encode_file(raw, label)
        return encode(chw(img), label,
                      encoded='jpg' if enc in ('jpg', 'jpeg') else enc)
    return encode(np.ascontiguousarray(chw(img)), label)


def _size_of(value):
    from lmdbio import _datum
    d = _datum.parse(np.frombuffer(value, np.uint8))
    return d['data_len'] if d['kind'] != _datum.FLOAT else d['nfloat']


def convert_imageset(root, listfile, db, *, gray=False, shuffle=False, seed=0,
                     resize_height=0, resize_width=0, check_size=False,
                     encoded=False, encode_type='', map_size=1 << 30,
                     commit_every=1000, threads=None, log=None,
                     progress=None):
    """What ``convert_imageset`` does; returns (written, skipped).
    ``progress(done, total)``, when given, is called after each chunk of
    images."""
    from lmdbio._images import default_threads, pool
    lines = read_list(listfile)
    if shuffle:
        perm = np.random.default_rng(seed).permutation(len(lines))
        lines = [lines[i] for i in perm]
    if log:
        log('A total of %d images.' % len(lines))
    enc_type = encode_type.lower().lstrip('.')
    if enc_type == 'jpeg':
        enc_type = 'jpg'
    if enc_type not in ('', 'png', 'jpg'):
        raise ConvertError('--encode_type must be png or jpg, not %r'
                           % encode_type)
    if (resize_height > 0) != (resize_width > 0) and log:
        log('warning: only one of resize_height/resize_width is set: not '
            'resizing (as Caffe)')
    threads = default_threads() if threads is None else max(1, threads)
    w = _Writer(db, map_size, commit_every)
    skipped = 0
    data_size = None

    def work(item):
        line_id, (name, label) = item
        enc = enc_type
        if (encoded or enc_type) and not enc:
            p = name.rfind('.')
            enc = name[p + 1:].lower() if p >= 0 else ''
            enc = 'jpg' if enc == 'jpeg' else enc
            if enc not in ('png', 'jpg'):
                enc = 'png'
        value = _image_record(os.path.join(root, name), label, not gray,
                              resize_height, resize_width, enc)
        return line_id, name, value

    try:
        chunk = 256
        for lo in range(0, len(lines), chunk):
            items = list(enumerate(lines[lo:lo + chunk], lo))
            if threads > 1:
                results = list(pool(threads).map(work, items))
            else:
                results = [work(it) for it in items]
            for line_id, name, value in results:
                if value is None:
                    skipped += 1
                    if log:
                        log('Could not open or find file %s'
                            % os.path.join(root, name))
                    continue
                if check_size:
                    size = _size_of(value)
                    if data_size is None:
                        data_size = size
                    elif size != data_size:
                        raise ConvertError(
                            'Incorrect data field size %d (line %d: %s; the '
                            'first image has %d)' % (size, line_id + 1, name,
                                                     data_size))
                key = ('%08d_%s' % (line_id, name)).encode('utf-8')
                w.put(key, value)
            if progress:
                progress(min(len(lines), lo + chunk), len(lines))
            elif log and (lo + chunk) % 1000 < chunk:
                log('Processed %d files.' % min(len(lines), lo + chunk))
    finally:
        w.close()
    return w.count, skipped


# --------------------------------------------------------------------------
# arrays (.npz)


def _pick(npz, key, names, what):
    if key is not None:
        if key not in npz.files:
            raise ConvertError('no array %r in the .npz (it has: %s)'
                               % (key, ', '.join(npz.files)))
        return npz[key]
    for k in names:
        if k in npz.files:
            return npz[k]
    raise ConvertError('cannot tell which array holds the %s (tried %s; it '
                       'has: %s): use --%s-key' % (
                           what, ', '.join(names), ', '.join(npz.files),
                           'data' if what == 'images' else 'label'))


def convert_arrays(data, labels, db, *, nhwc=False, rgb=False, encoded=False,
                   encode_type='', shuffle=False, seed=0, map_size=1 << 30,
                   commit_every=1000, log=None, progress=None):
    """Images [N, C, H, W] (or [N, H, W]) and labels [N] into an LMDB of
    Datums keyed "%08d"; returns the record count.  ``progress(done,
    total)``, when given, is called every 256 records and at the end."""
    from lmdbio.datum import encode
    data = np.asarray(data)
    labels = np.asarray(labels).reshape(-1) if labels is not None else None
    if data.ndim == 3:
        data = data[:, None]
    elif data.ndim == 4 and nhwc:
        data = data.transpose(0, 3, 1, 2)
    elif data.ndim != 4:
        raise ConvertError('images must be [N, C, H, W] (or [N, H, W]), not '
                           'shape %s' % (data.shape,))
    if rgb:
        if data.shape[1] not in (3, 4):
            raise ConvertError('--rgb needs 3 or 4 channels, not %d'
                               % data.shape[1])
        data = data[:, [2, 1, 0, 3][:data.shape[1]]]
    n = len(data)
    if labels is not None and len(labels) != n:
        raise ConvertError('%d images but %d labels' % (n, len(labels)))
    if labels is not None and labels.dtype.kind not in 'iub':
        if not np.all(labels == np.round(labels)):
            raise ConvertError('labels must be integers')
        labels = labels.astype(np.int64)
    if data.dtype.kind == 'b':
        data = data.astype(np.uint8)
    if data.dtype.kind in 'iu' and data.dtype != np.uint8:
        if data.size and (data.min() < 0 or data.max() > 255):
            raise ConvertError('integer images must be in 0..255 (uint8)')
        data = data.astype(np.uint8)
    fmt = False
    if encoded or encode_type:
        fmt = (encode_type or 'png').lower().lstrip('.')
        fmt = 'jpg' if fmt == 'jpeg' else fmt
        if fmt not in ('png', 'jpg'):
            raise ConvertError('--encode_type must be png or jpg')
        if data.dtype != np.uint8:
            raise ConvertError('--encoded needs uint8 images, not %s'
                               % data.dtype)
    order = (np.random.default_rng(seed).permutation(n) if shuffle
             else range(n))
    w = _Writer(db, map_size, commit_every)
    try:
        for pos, i in enumerate(order):
            label = None if labels is None else int(labels[i])
            w.put(b'%08d' % pos, encode(data[i], label, encoded=fmt))
            if progress and ((pos + 1) % 256 == 0 or pos + 1 == n):
                progress(pos + 1, n)
            elif log and not progress and (pos + 1) % 10000 == 0:
                log('Processed %d records.' % (pos + 1))
    finally:
        w.close()
    return w.count


# --------------------------------------------------------------------------


def main(prog='lmdbio convert', args=None, io=None, backend=None):
    """Run the command; returns the exit status.  `io`: lmdbio.cli's
    output object (``error(text)``), else stderr."""
    args = sys.argv[1:] if args is None else list(args)

    def err(text):
        if io is not None:
            io.error(text)
        else:
            sys.stderr.write(text)
            sys.stderr.flush()

    try:
        o = _parser().parse_args(args)
    except UsageError as e:
        err('%s%s: %s\n' % (_USAGE, prog, e))
        return 2
    except SystemExit as e:  # --help
        return e.code or 0
    log = None if o.quiet else (lambda s: err('%s: %s\n' % (prog, s)))
    from lmdbio import _progress
    stream = io.err if io is not None else sys.stderr
    progress = end = None
    if not o.quiet and _progress.is_terminal(stream):
        progress, end = _progress.bar(err, prog, 'records')
    t0 = time.perf_counter()
    try:
        if o.npz:
            if len(o.inputs) != 2:
                err('%s%s: --npz takes FILE.npz DB_NAME\n' % (_USAGE, prog))
                return 2
            src, db = o.inputs
            if not zipfile.is_zipfile(src):
                raise ConvertError('%s is not a .npz file (numpy.savez or '
                                   'savez_compressed writes one)' % src)
            with np.load(src, allow_pickle=False) as npz:
                data = _pick(npz, o.data_key, ('data', 'x', 'images', 'X'),
                             'images')
                try:
                    labels = _pick(npz, o.label_key,
                                   ('labels', 'label', 'y', 'targets'),
                                   'labels')
                except ConvertError:
                    if o.label_key is not None:
                        raise
                    labels = None
            n = convert_arrays(data, labels, db, nhwc=o.nhwc, rgb=o.rgb,
                               encoded=o.encoded, encode_type=o.encode_type,
                               shuffle=o.shuffle, seed=o.seed,
                               map_size=o.map_size,
                               commit_every=o.commit_every, log=log,
                               progress=progress)
            skipped = 0
        else:
            if len(o.inputs) != 3:
                err('%s%s: takes ROOTFOLDER LISTFILE DB_NAME (or --npz FILE '
                    'DB_NAME)\n' % (_USAGE, prog))
                return 2
            root, listfile, db = o.inputs
            n, skipped = convert_imageset(
                root, listfile, db, gray=o.gray, shuffle=o.shuffle,
                seed=o.seed, resize_height=o.resize_height,
                resize_width=o.resize_width, check_size=o.check_size,
                encoded=o.encoded, encode_type=o.encode_type,
                map_size=o.map_size, commit_every=o.commit_every,
                threads=o.threads, log=log, progress=progress)
    except (ConvertError, OSError, ValueError, ImportError) as e:
        if end:
            end()
        err('%s: %s\n' % (prog, e))
        return 1
    if end:
        end()
    if log:
        log('wrote %d records to %s in %.2f s%s'
            % (n, db, time.perf_counter() - t0,
               ' (%d unreadable images skipped)' % skipped if skipped else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
