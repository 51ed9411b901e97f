"""A pycaffe Python layer that replaces Caffe's ``Data`` layer (LMDB backend).

In a prototxt, replace ::

    layer { name: "data" type: "Data" top: "data" top: "label"
      include { phase: TRAIN }
      transform_param { mirror: true crop_size: 28 mean_file: "mean.binaryproto" }
      data_param { source: "train_lmdb" batch_size: 64 backend: LMDB } }

with ::

    layer { name: "data" type: "Python" top: "data" top: "label"
      include { phase: TRAIN }
      python_param { module: "lmdbio.caffe" layer: "DataLayer"
        param_str: '{"source": "train_lmdb", "batch_size": 64, "mirror": true,
                     "crop_size": 28, "mean_file": "mean.binaryproto"}' } }

``param_str`` is JSON or a Python literal (parsed, never evaluated) holding
the ``data_param`` fields (``source``, ``batch_size``, ``backend`` (LMDB
only), ``prefetch``) and the ``transform_param`` fields (``scale``,
``mirror``, ``crop_size``, ``mean_file``, ``mean_value``, ``force_color``,
``force_gray``), flat or nested under ``"transform_param"`` (and
``"data_param"``), plus lmdbio's own: ``shuffle`` (false, as Caffe),
``seed`` (0), ``rank``/``world_size`` (detected), ``decode_threads``.

Like Caffe's Data layer it produces full batches forever, wrapping around
at the end of the database (a batch may straddle two epochs), transforms
them as DataTransformer does for the layer's phase, and writes labels to
the second top as float.  In the TRAIN phase each solver reads its own
share of the database (lmdbio.Reader's sharding, no record read twice per
epoch but for padding): rank and size come from ``caffe.solver_rank()`` /
``caffe.solver_count()`` under pycaffe's multi-GPU driver, else from MPI
when run under ``mpiexec`` (mpi4py's COMM_WORLD when mpi4py is imported,
else the launcher's environment), else 0 and 1.  In the TEST phase every
solver reads the whole database, as Caffe's does.

When pycaffe is importable :class:`DataLayer` subclasses ``caffe.Layer``;
otherwise it works with any driver that follows pycaffe's protocol (set
``param_str`` and ``phase``, call ``setup``, then ``reshape`` and
``forward`` per batch, with blobs that have ``data``, ``reshape()`` and
``shape``).
"""

import ast
import json
import os
import sys

import numpy as np

__all__ = ['DataLayer', 'parse_param_str', 'solver_rank_size']

try:  # pycaffe, when installed: the layer must then be a caffe.Layer
    import caffe as _caffe
    _LayerBase = _caffe.Layer
except Exception:  # ImportError, or a pycaffe that fails to load
    _caffe = None
    _LayerBase = object

DATA_FIELDS = ('source', 'batch_size', 'backend', 'prefetch', 'shuffle',
               'seed', 'rank', 'world_size', 'decode_threads', 'drop_last')
TRANSFORM_FIELDS = ('scale', 'mirror', 'crop_size', 'mean_file',
                    'mean_value', 'force_color', 'force_gray')
_EXAMPLE = '{"source": "train_lmdb", "batch_size": 64}'


class ParamError(ValueError):
    """A bad ``param_str`` (raised at setup)."""


def _fail(msg):
    raise ParamError('lmdbio.caffe.DataLayer param_str: ' + msg)


def _parse_text(text):
    if isinstance(text, bytes):
        text = text.decode('utf-8')
    if text is None or not str(text).strip():
        _fail('empty; it needs at least "source" and "batch_size", e.g. %s'
              % _EXAMPLE)
    text = str(text)
    try:
        return json.loads(text)
    except ValueError as e:
        json_error = e
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError,
            RecursionError) as e:
        _fail('neither JSON (%s) nor a Python literal (%s: %s): %r'
              % (json_error, type(e).__name__, e, text))


def _check_type(name, value, kind):
    ok = {
        'str': isinstance(value, str) and value != '',
        'int': isinstance(value, int) and not isinstance(value, bool),
        'bool': isinstance(value, bool) or value in (0, 1),
        'num': isinstance(value, (int, float)) and not isinstance(value, bool),
    }[kind]
    if not ok:
        want = {'str': 'a non-empty string', 'int': 'an integer',
                'bool': 'true or false', 'num': 'a number'}[kind]
        _fail('"%s" must be %s, not %r' % (name, want, value))


def parse_param_str(text):
    """The layer's settings from ``text`` (the prototxt's ``param_str``,
    JSON or a Python literal, never evaluated as code): a flat dict of the
    data_param and transform_param fields (nested forms merged), validated.
    Raises ValueError with a clear message."""
    raw = _parse_text(text)
    if not isinstance(raw, dict):
        _fail('must be a dict (JSON object), not %s: %r'
              % (type(raw).__name__, text))
    flat = {}

    def merge(d, where):
        for k, v in d.items():
            if not isinstance(k, str):
                _fail('keys must be strings, not %r' % (k,))
            if k in flat and flat[k] != v:
                _fail('"%s" is given twice with different values (%r and %r, '
                      'the second %s)' % (k, flat[k], v, where))
            flat[k] = v

    nested = {}
    for k in ('data_param', 'transform_param'):
        if k in raw:
            v = raw[k]
            if not isinstance(v, dict):
                _fail('"%s" must be a dict, not %r' % (k, v))
            nested[k] = v
    merge({k: v for k, v in raw.items() if k not in nested}, 'flat')
    for k, v in nested.items():
        allowed = DATA_FIELDS if k == 'data_param' else TRANSFORM_FIELDS
        bad = sorted(set(v) - set(allowed))
        if bad:
            _fail('unknown %s field(s) %s (known: %s)'
                  % (k, ', '.join(map(repr, bad)), ', '.join(allowed)))
        merge(v, 'in ' + k)
    bad = sorted(set(flat) - set(DATA_FIELDS) - set(TRANSFORM_FIELDS))
    if bad:
        _fail('unknown field(s) %s (known: %s)'
              % (', '.join(map(repr, bad)),
                 ', '.join(DATA_FIELDS + TRANSFORM_FIELDS + (
                     'data_param', 'transform_param'))))
    if 'source' not in flat:
        _fail('"source" (the LMDB directory) is required, e.g. %s' % _EXAMPLE)
    if 'batch_size' not in flat:
        _fail('"batch_size" is required, e.g. %s' % _EXAMPLE)
    types = dict(source='str', batch_size='int', prefetch='int',
                 shuffle='bool', seed='int', rank='int', world_size='int',
                 decode_threads='int', drop_last='bool', scale='num',
                 mirror='bool', crop_size='int', mean_file='str',
                 force_color='bool', force_gray='bool')
    for k, kind in types.items():
        if k in flat:
            _check_type(k, flat[k], kind)
    if flat['batch_size'] < 1:
        _fail('"batch_size" must be at least 1, not %d' % flat['batch_size'])
    if flat.get('crop_size', 0) < 0:
        _fail('"crop_size" must be >= 0')
    if 'backend' in flat and str(flat['backend']).upper() != 'LMDB':
        _fail('"backend" must be LMDB (lmdbio reads LMDB only), not %r'
              % (flat['backend'],))
    mv = flat.get('mean_value')
    if mv is not None:
        vals = mv if isinstance(mv, (list, tuple)) else [mv]
        for x in vals:
            _check_type('mean_value', x, 'num')
        flat['mean_value'] = [float(x) for x in vals]
    if flat.get('mean_file') and flat.get('mean_value'):
        _fail('Cannot specify mean_file and mean_value at the same time')
    if flat.get('force_color') and flat.get('force_gray'):
        _fail('force_color and force_gray cannot both be set')
    if ('rank' in flat) != ('world_size' in flat):
        _fail('"rank" and "world_size" go together')
    if 'rank' in flat and not 0 <= flat['rank'] < flat['world_size']:
        _fail('need 0 <= rank < world_size')
    return flat


_MPI_ENV = (('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
            ('PMI_RANK', 'PMI_SIZE'),
            ('PMIX_RANK', 'PMIX_SIZE'),
            ('MV2_COMM_WORLD_RANK', 'MV2_COMM_WORLD_SIZE'),
            ('MPI_LOCALRANKID', None))


def solver_rank_size():
    """(rank, size) of this solver: pycaffe's ``solver_rank()`` /
    ``solver_count()`` when they report several solvers, else MPI's (mpi4py
    COMM_WORLD when mpi4py.MPI is imported, else the mpiexec launcher's
    environment), else (0, 1)."""
    caffe = sys.modules.get('caffe') or _caffe
    if caffe is not None and hasattr(caffe, 'solver_count'):
        try:
            count = int(caffe.solver_count())
            if count > 1:
                return int(caffe.solver_rank()), count
        except Exception:
            pass
    mpi = sys.modules.get('mpi4py.MPI')
    if mpi is not None:
        try:
            if mpi.Is_initialized() and not mpi.Is_finalized():
                comm = mpi.COMM_WORLD
                return comm.Get_rank(), comm.Get_size()
        except Exception:
            pass
    for rank_var, size_var in _MPI_ENV:
        if size_var and rank_var in os.environ and size_var in os.environ:
            try:
                rank, size = int(os.environ[rank_var]), int(os.environ[size_var])
            except ValueError:
                continue
            if size >= 1 and 0 <= rank < size:
                return rank, size
    return 0, 1


def _phase_name(phase):
    if isinstance(phase, str):
        return 'test' if phase.strip().lower() == 'test' else 'train'
    train = getattr(_caffe, 'TRAIN', 0) if _caffe is not None else 0
    return 'train' if int(phase) == int(train) else 'test'


class DataLayer(_LayerBase):
    """pycaffe data layer over an LMDB of Datums (see the module doc)."""

    def __init__(self, *args, **kwargs):
        # Caffe constructs a Python layer as ``Class(layer_param)``: pass it
        # on to caffe.Layer; without pycaffe there is nothing to pass it to.
        if _LayerBase is object:
            super().__init__()
        else:
            super().__init__(*args, **kwargs)

    def setup(self, bottom, top):
        """Caffe's layer set-up: read ``param_str``, open the database and
        shape the ``top`` blobs (data, and optionally label); ``bottom``
        must be empty."""
        from lmdbio.datum import DatumReader, Transform

        if len(bottom) != 0:
            raise ValueError('lmdbio.caffe.DataLayer takes no bottom blobs')
        if len(top) not in (1, 2):
            raise ValueError('lmdbio.caffe.DataLayer produces 1 or 2 tops '
                             '(data, and optionally label), not %d' % len(top))
        p = parse_param_str(getattr(self, 'param_str', None))
        self.params = p
        self.phase_name = _phase_name(getattr(self, 'phase', 0))
        if 'rank' in p:
            rank, size = p['rank'], p['world_size']
        elif self.phase_name == 'test':
            rank, size = 0, 1  # every solver tests on the whole set (Caffe)
        else:
            rank, size = solver_rank_size()
        self.rank, self.world_size = rank, size
        self.batch_size = p['batch_size']
        seed = p.get('seed', 0)
        self.transform = Transform(
            scale=p.get('scale', 1.0), mean_file=p.get('mean_file'),
            mean_value=p.get('mean_value'), crop_size=p.get('crop_size', 0),
            mirror=p.get('mirror', False), phase=self.phase_name,
            seed=[seed, rank], force_color=p.get('force_color', False),
            force_gray=p.get('force_gray', False))
        if not os.path.isdir(p['source']):
            raise ValueError('lmdbio.caffe.DataLayer: source %r is not an LMDB '
                             'directory' % p['source'])
        self.reader = DatumReader(
            p['source'], batch_size=self.batch_size,
            shuffle=bool(p.get('shuffle', False)), seed=seed, rank=rank,
            world_size=size, drop_last=bool(p.get('drop_last', False)),
            prefetch=max(1, p.get('prefetch', 4)),
            decode_threads=p.get('decode_threads'),
            force_color=self.transform.force_color,
            force_gray=self.transform.force_gray)
        if self.reader.total_records == 0:
            self.reader.close()
            raise ValueError('lmdbio.caffe.DataLayer: source %r holds no '
                             'records' % p['source'])
        if self.reader.num_records == 0:
            self.reader.close()
            raise ValueError('lmdbio.caffe.DataLayer: rank %d of %d has no '
                             'records (drop_last with fewer records than '
                             'solvers x batch_size)' % (rank, size))
        first, _ = self.reader.read([0])
        self.datum_shape = tuple(first.shape[1:])
        self.top_shape = (self.batch_size,) + \
            self.transform.output_shape(self.datum_shape)
        self._stream = None
        self.epoch = 0
        self._shape_tops(top)

    def _shape_tops(self, top):
        top[0].reshape(*self.top_shape)
        if len(top) > 1:
            top[1].reshape(self.batch_size)

    def reshape(self, bottom, top):
        """Give the ``top`` blobs their batch shapes (``bottom``: none)."""
        self._shape_tops(top)

    def _batches(self):
        """Exactly batch_size records per batch, forever (epochs chained)."""
        bs = self.batch_size
        pend_d, pend_l, have = [], [], 0
        while True:
            self.reader.set_epoch(self.epoch)
            for d, l in self.reader:
                if not have and len(l) == bs:
                    yield d, l
                    continue
                pend_d.append(d)
                pend_l.append(l)
                have += len(l)
                while have >= bs:
                    d_all = np.concatenate(pend_d)
                    l_all = np.concatenate(pend_l)
                    yield d_all[:bs], l_all[:bs]
                    pend_d, pend_l = [d_all[bs:]], [l_all[bs:]]
                    have -= bs
                    if not have:
                        pend_d, pend_l = [], []
            self.epoch += 1

    def next_batch(self):
        """(data [batch, C, H, W] uint8/float32, labels int64) before the
        transform: the records of the next forward pass."""
        if self._stream is None:
            self._stream = self._batches()
        return next(self._stream)

    def forward(self, bottom, top):
        """Fill ``top[0]`` with the next transformed batch and ``top[1]``
        (if present) with its labels (``bottom``: none)."""
        data, labels = self.next_batch()
        out = top[0].data
        if data.shape[1:] != self.datum_shape:
            raise ValueError('lmdbio.caffe.DataLayer: a record of shape %s, '
                             'the first record is %s' % (data.shape[1:],
                                                         self.datum_shape))
        if isinstance(out, np.ndarray) and out.dtype == np.float32 and \
                out.flags.c_contiguous and out.shape == self.top_shape:
            self.transform(data, out=out)
        else:
            out[...] = self.transform(data)
        if len(top) > 1:
            top[1].data[...] = labels.astype(np.float32)

    def backward(self, top, propagate_down, bottom):
        """Nothing: a data layer has no gradient (``top``,
        ``propagate_down`` and ``bottom`` are Caffe's and unused)."""
        pass  # a data layer has nothing to propagate

    def close(self):
        """Stop reading and close the database."""
        stream, self._stream = getattr(self, '_stream', None), None
        if stream is not None:
            stream.close()
        reader = getattr(self, 'reader', None)
        if reader is not None:
            reader.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
