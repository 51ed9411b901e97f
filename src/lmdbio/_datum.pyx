# cython: language_level=3, boundscheck=False, wraparound=False, binding=True
"""Bindings of the C core's Caffe Datum / BlobProto decoder and batch
transformer (csrc/datum.h).  Every call that parses or copies runs with the
GIL released.  The Python API is lmdbio.datum."""

from libc.stdint cimport uint8_t, int64_t, uint64_t

import numpy as np

from lmdbio.errors import DatumError

from lmdbio._core cimport *   # the C core's declarations (_core.pxd)

UINT8 = LIO_DATUM_UINT8
FLOAT = LIO_DATUM_FLOAT
ENCODED = LIO_DATUM_ENCODED

cdef uint8_t EMPTY[1]


cdef object _raise(int rc, const lio_datum_error *err, what, index=None):
    """Raise DatumError (malformed) or ValueError (another shape or kind)
    for err; the exception's ``index`` is the record's."""
    msg = err.msg.decode('utf-8', 'replace')
    if err.index >= 0:
        index = err.index
        where = 'record %d' % err.index
        if what:
            where = '%s %s' % (what, where)
    else:
        where = what or 'Datum'
    if rc == LIO_DATUM_EMISMATCH:
        exc = ValueError('%s %s' % (where, msg))
    else:
        exc = DatumError('%s: malformed at byte %d: %s'
                         % (where, err.offset, msg))
    exc.index = index
    exc.offset = err.offset
    raise exc


def parse(const uint8_t[::1] buf, what=None, index=None):
    """Parse and validate one Datum: a dict of its fields (``data_off`` /
    ``data_len`` locate the pixels or the image file within buf)."""
    cdef lio_datum d
    cdef lio_datum_error err
    cdef int rc
    cdef size_t n = buf.shape[0]
    cdef const uint8_t *p = &buf[0] if n else EMPTY
    with nogil:
        rc = lio_datum_parse(p, n, &d, &err)
    if rc:
        _raise(rc, &err, what, index)
    return dict(channels=d.channels, height=d.height, width=d.width,
                label=d.label, has_label=bool(d.has_label),
                encoded=bool(d.encoded), kind=d.kind,
                data_off=d.data_off, data_len=d.data_len, nfloat=d.nfloat)


def floats(const uint8_t[::1] buf, float[::1] out):
    """Copy a parsed float Datum's float_data into out."""
    cdef size_t n = buf.shape[0]
    if n == 0:
        return
    with nogil:
        lio_datum_floats(&buf[0], n, &out[0] if out.shape[0] else NULL)


def decode_batch(const uint8_t[::1] data, const int64_t[::1] offsets,
                 int kind, int64_t c, int64_t h, int64_t w, out,
                 int64_t[::1] labels, data_off=None, data_len=None,
                 what=None, unsigned nthreads=1):
    """Decode len(offsets)-1 records of `kind` and shape (c, h, w) into out
    (uint8 or float32, n*c*h*w elements, C-contiguous) and labels; for
    encoded records fill data_off/data_len instead.  One GIL-free call
    (nthreads > 1: that many threads share the batch)."""
    cdef size_t n = offsets.shape[0] - 1
    cdef lio_datum_error err
    cdef int rc
    cdef const uint8_t *pdata = &data[0] if data.shape[0] else EMPTY
    cdef void *pout = NULL
    cdef int64_t *poff = NULL
    cdef int64_t *plen = NULL
    cdef uint8_t[::1] o8
    cdef float[::1] of
    cdef int64_t[::1] doff
    cdef int64_t[::1] dlen
    if offsets.shape[0] < 1:
        raise ValueError('offsets must hold n+1 entries')
    if n == 0:
        return
    if labels.shape[0] < <Py_ssize_t>n:
        raise ValueError('labels too short')
    cdef size_t k
    cdef bint ok = offsets[0] >= 0 and offsets[n] <= data.shape[0]
    if ok:
        with nogil:
            for k in range(n):
                if offsets[k + 1] < offsets[k]:
                    ok = False
                    break
    if not ok:
        raise ValueError('offsets must rise from >= 0 to at most the data '
                         'length (%d bytes)' % data.shape[0])
    if kind == LIO_DATUM_UINT8:
        o8 = out.reshape(-1)
        if o8.shape[0] < <Py_ssize_t>(n * c * h * w):
            raise ValueError('output too small')
        if o8.shape[0]:
            pout = &o8[0]
    elif kind == LIO_DATUM_FLOAT:
        of = out.reshape(-1)
        if of.shape[0] < <Py_ssize_t>(n * c * h * w):
            raise ValueError('output too small')
        if of.shape[0]:
            pout = &of[0]
    elif kind == LIO_DATUM_ENCODED:
        doff = data_off
        dlen = data_len
        if doff.shape[0] < <Py_ssize_t>n or dlen.shape[0] < <Py_ssize_t>n:
            raise ValueError('data_off/data_len too short')
        poff = &doff[0]
        plen = &dlen[0]
    else:
        raise ValueError('unknown kind %r' % kind)
    with nogil:
        rc = lio_datum_decode_batch(pdata, &offsets[0], n, kind, c, h, w,
                                    pout, &labels[0], poff, plen, nthreads,
                                    &err)
    if rc:
        _raise(rc, &err, what)


def parse_blob(const uint8_t[::1] buf, what=None):
    """Parse a BlobProto: (legacy (num, c, h, w) or None, shape dims or
    None, values as float32)."""
    cdef lio_blob b
    cdef lio_datum_error err
    cdef int rc, i
    cdef size_t n = buf.shape[0]
    cdef const uint8_t *p = &buf[0] if n else EMPTY
    cdef float[::1] vals
    cdef int use_double
    with nogil:
        rc = lio_blob_parse(p, n, &b, &err)
    if rc:
        _raise(rc, &err, what or 'BlobProto')
    use_double = b.ndouble > 0
    count = b.ndouble if use_double else b.ndata
    values = np.empty(count, dtype=np.float32)
    vals = values
    if count:
        with nogil:
            lio_blob_values(p, n, use_double, &vals[0])
    legacy = (b.num, b.channels, b.height, b.width) if b.has_legacy else None
    shape = tuple(b.dim[i] for i in range(b.ndim)) if b.has_shape else None
    return legacy, shape, values


def transform(src, float[:, :, :, ::1] out, int64_t crop, h_off, w_off,
              mirror, mean, mean_values, float scale):
    """Caffe's DataTransformer over a batch (csrc/datum.h lio_transform).
    src: uint8 or float32 [n, C, H, W] C-contiguous."""
    cdef uint8_t[:, :, :, ::1] s8
    cdef float[:, :, :, ::1] sf
    cdef const void *psrc = NULL
    cdef int src_float = src.dtype == np.float32
    cdef int64_t n, C, H, W
    cdef int64_t[::1] ho
    cdef int64_t[::1] wo
    cdef uint8_t[::1] mi
    cdef float[:, :, ::1] mf
    cdef float[::1] mv
    cdef const int64_t *pho = NULL
    cdef const int64_t *pwo = NULL
    cdef const uint8_t *pmi = NULL
    cdef const float *pmean = NULL
    cdef const float *pmv = NULL
    cdef int rc
    if src_float:
        sf = src
        n, C, H, W = sf.shape[0], sf.shape[1], sf.shape[2], sf.shape[3]
        if n * C * H * W:
            psrc = &sf[0, 0, 0, 0]
    else:
        s8 = src
        n, C, H, W = s8.shape[0], s8.shape[1], s8.shape[2], s8.shape[3]
        if n * C * H * W:
            psrc = &s8[0, 0, 0, 0]
    cdef int64_t ch = crop if crop > 0 else H
    cdef int64_t cw = crop if crop > 0 else W
    if (out.shape[0] != n or out.shape[1] != C or out.shape[2] != ch or
            out.shape[3] != cw):
        raise ValueError('output shape does not match')
    if n == 0 or out.shape[0] * out.shape[1] * out.shape[2] * out.shape[3] == 0:
        return
    for arr in (h_off, w_off, mirror):
        if arr is not None and len(arr) < n:
            raise ValueError('per-datum arrays too short')
    if mean is not None and tuple(mean.shape) != (C, H, W):
        raise ValueError('mean shape does not match')
    if mean_values is not None and len(mean_values) < C:
        raise ValueError('too few mean values')
    if h_off is not None:
        ho = h_off
        pho = &ho[0]
    if w_off is not None:
        wo = w_off
        pwo = &wo[0]
    if mirror is not None:
        mi = mirror
        pmi = &mi[0]
    if mean is not None:
        mf = mean
        pmean = &mf[0, 0, 0]
    if mean_values is not None:
        mv = mean_values
        pmv = &mv[0]
    with nogil:
        rc = lio_transform(psrc, src_float, n, C, H, W, crop, pho, pwo, pmi,
                           pmean, pmv, scale, &out[0, 0, 0, 0])
    if rc:
        raise ValueError('crop offsets out of range')
