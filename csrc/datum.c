/* Caffe Datum / BlobProto wire-format decoding and Caffe's DataTransformer
 * over a batch (datum.h, docs/caffe-pytorch.md).
 *
 * The protobuf wire format: a message is a sequence of fields, each a tag
 * varint (field number << 3 | wire type) followed by a payload: 0 varint,
 * 1 eight bytes, 2 a length varint and that many bytes, 5 four bytes,
 * 3/4 start/end of a (deprecated) group.  Varints are little-endian base 128,
 * at most 10 bytes; an int32 field keeps the low 32 bits (negative values are
 * written as 10-byte varints).
 *
 * As protobuf does, a known field number that arrives with a wire type other
 * than its own is an unknown field: skipped, not an error.
 *
 * Independent of the LMDB layers (it sees only value bytes).
 * May call: the C library and pthreads only.
 */
#include "datum.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define WT_VARINT 0
#define WT_I64 1
#define WT_LEN 2
#define WT_SGROUP 3
#define WT_EGROUP 4
#define WT_I32 5

#define MAX_GROUP_DEPTH 64

static int fail(lio_datum_error *err, int code, uint64_t off, const char *fmt,
                ...)
{
    va_list ap;
    if (err) {
        err->offset = off;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

#define MALFORMED(off, ...) \
    fail(err, LIO_DATUM_EMALFORMED, (uint64_t)(off), __VA_ARGS__)

/* A varint at *pp (< end).  0 and *pp advanced, 1 truncated, 2 longer than
 * ten bytes.  Bits past 64 are dropped, as protobuf does. */
static inline int get_varint(const uint8_t **pp, const uint8_t *end,
                             uint64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int i;
    if (p < end && !(*p & 0x80)) {  /* one byte: most tags and small values */
        *out = *p;
        *pp = p + 1;
        return 0;
    }
    for (i = 0; i < 10; i++) {
        uint8_t b;
        if (p >= end)
            return 1;
        b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            *pp = p;
            return 0;
        }
    }
    return 2;
}

static int varint_error(lio_datum_error *err, int rc, uint64_t off,
                        const char *what)
{
    if (rc == 1)
        return MALFORMED(off, "truncated varint (%s)", what);
    return MALFORMED(off, "varint longer than 10 bytes (%s)", what);
}

static inline uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline uint64_t load_le64(const uint8_t *p)
{
    return (uint64_t)load_le32(p) | (uint64_t)load_le32(p + 4) << 32;
}

static inline float f32_of(const uint8_t *p)
{
    uint32_t u = load_le32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline double f64_of(const uint8_t *p)
{
    uint64_t u = load_le64(p);
    double f;
    memcpy(&f, &u, 8);
    return f;
}

/* Read a tag at *pp.  Checks the field number and the wire type's range. */
static int get_tag(const uint8_t **pp, const uint8_t *base, const uint8_t *end,
                   uint32_t *field, unsigned *wt, lio_datum_error *err)
{
    uint64_t tag;
    const uint8_t *start = *pp;
    int rc;
    *field = 0;
    *wt = 0;
    rc = get_varint(pp, end, &tag);
    if (rc)
        return varint_error(err, rc, start - base, "field tag");
    if (tag > 0xffffffffu)
        return MALFORMED(start - base, "field tag %llu out of range",
                         (unsigned long long)tag);
    *field = (uint32_t)(tag >> 3);
    *wt = (unsigned)(tag & 7);
    if (*field == 0)
        return MALFORMED(start - base, "field number 0");
    if (*wt == 6 || *wt == 7)
        return MALFORMED(start - base, "invalid wire type %u (field %u)", *wt,
                         *field);
    return 0;
}

/* The payload of a length-delimited field: *len bytes from *pp. */
static int get_len(const uint8_t **pp, const uint8_t *base, const uint8_t *end,
                   uint64_t *len, const char *what, lio_datum_error *err)
{
    const uint8_t *start = *pp;
    int rc = get_varint(pp, end, len);
    if (rc)
        return varint_error(err, rc, start - base, what);
    if (*len > (uint64_t)(end - *pp))
        return MALFORMED(start - base,
                         "%s: length %llu past the end of the record "
                         "(%llu bytes left)",
                         what, (unsigned long long)*len,
                         (unsigned long long)(end - *pp));
    return 0;
}

/* Skip the payload of an unknown field of wire type wt. */
static int skip_field(const uint8_t **pp, const uint8_t *base,
                      const uint8_t *end, uint32_t field, unsigned wt,
                      int depth, lio_datum_error *err)
{
    uint64_t v;
    int rc;
    const uint8_t *start = *pp;
    switch (wt) {
    case WT_VARINT:
        rc = get_varint(pp, end, &v);
        return rc ? varint_error(err, rc, start - base, "unknown field") : 0;
    case WT_I64:
        if (end - *pp < 8)
            return MALFORMED(start - base,
                             "truncated fixed64 (unknown field %u)", field);
        *pp += 8;
        return 0;
    case WT_I32:
        if (end - *pp < 4)
            return MALFORMED(start - base,
                             "truncated fixed32 (unknown field %u)", field);
        *pp += 4;
        return 0;
    case WT_LEN:
        rc = get_len(pp, base, end, &v, "unknown field", err);
        if (rc)
            return rc;
        *pp += v;
        return 0;
    case WT_SGROUP:
        if (depth >= MAX_GROUP_DEPTH)
            return MALFORMED(start - base, "groups nested too deeply");
        for (;;) {
            uint32_t f;
            unsigned t;
            const uint8_t *ts = *pp;
            if (*pp >= end)
                return MALFORMED(start - base,
                                 "group (field %u) not closed", field);
            rc = get_tag(pp, base, end, &f, &t, err);
            if (rc)
                return rc;
            if (t == WT_EGROUP) {
                if (f != field)
                    return MALFORMED(ts - base,
                                     "end of group %u inside group %u", f,
                                     field);
                return 0;
            }
            rc = skip_field(pp, base, end, f, t, depth + 1, err);
            if (rc)
                return rc;
        }
    default: /* WT_EGROUP outside a group */
        return MALFORMED(start - base, "unexpected end-group (field %u)",
                         field);
    }
}

static const char *const DATUM_FIELDS[8] = {
    "?", "channels", "height", "width", "data", "label", "float_data",
    "encoded"};

int lio_datum_parse(const uint8_t *buf, size_t len, lio_datum *d,
                    lio_datum_error *err)
{
    const uint8_t *p = buf, *end = buf + len;
    uint64_t v, size;
    int rc;

    memset(d, 0, sizeof *d);
    if (err)
        err->index = -1;
    while (p < end) {
        const uint8_t *fs = p;
        uint32_t field;
        unsigned wt;
        int other;
        rc = get_tag(&p, buf, end, &field, &wt, err);
        if (rc)
            return rc;
        /* a known field with another wire type is an unknown field */
        other = ((field <= 3 || field == 5 || field == 7) && wt != WT_VARINT) ||
                (field == 4 && wt != WT_LEN) ||
                (field == 6 && wt != WT_I32 && wt != WT_LEN);
        switch (other ? 0 : field) {
        case 1: case 2: case 3: case 5: case 7:
            {
                const uint8_t *vs = p;
                rc = get_varint(&p, end, &v);
                if (rc)
                    return varint_error(err, rc, vs - buf,
                                        DATUM_FIELDS[field]);
            }
            switch (field) {
            case 1: d->channels = (int32_t)(uint32_t)v; break;
            case 2: d->height = (int32_t)(uint32_t)v; break;
            case 3: d->width = (int32_t)(uint32_t)v; break;
            case 5: d->label = (int32_t)(uint32_t)v; d->has_label = 1; break;
            default: d->encoded = v != 0; break;
            }
            break;
        case 4:
            rc = get_len(&p, buf, end, &v, "data", err);
            if (rc)
                return rc;
            d->data_off = (uint64_t)(p - buf);
            d->data_len = v;
            p += v;
            break;
        case 6:
            if (wt == WT_I32) {
                if (end - p < 4)
                    return MALFORMED(fs - buf, "truncated float_data value");
                p += 4;
                d->nfloat++;
            } else if (wt == WT_LEN) {
                rc = get_len(&p, buf, end, &v, "packed float_data", err);
                if (rc)
                    return rc;
                if (v % 4)
                    return MALFORMED(fs - buf,
                                     "packed float_data of %llu bytes, not "
                                     "a multiple of 4",
                                     (unsigned long long)v);
                d->nfloat += v / 4;
                p += v;
            }
            break;
        default:
            rc = skip_field(&p, buf, end, field, wt, 0, err);
            if (rc)
                return rc;
        }
    }

    if (d->encoded) {
        d->kind = LIO_DATUM_ENCODED;
        if (d->data_len == 0)
            return MALFORMED(len, "encoded Datum without image data");
        return LIO_DATUM_OK;
    }
    if (d->channels < 0 || d->height < 0 || d->width < 0)
        return MALFORMED(len, "negative size %lldx%lldx%lld",
                         (long long)d->channels, (long long)d->height,
                         (long long)d->width);
    /* each < 2^31: c*h < 2^62 cannot overflow, the last product can */
    size = (uint64_t)d->channels * (uint64_t)d->height;
    if (d->width && size > UINT64_MAX / (uint64_t)d->width)
        return MALFORMED(len, "size %lldx%lldx%lld overflows",
                         (long long)d->channels, (long long)d->height,
                         (long long)d->width);
    size *= (uint64_t)d->width;
    if (d->data_len == 0 && d->nfloat > 0) {
        d->kind = LIO_DATUM_FLOAT;
        if (d->nfloat != size)
            return MALFORMED(len,
                             "float_data has %llu values, %lldx%lldx%lld "
                             "needs %llu",
                             (unsigned long long)d->nfloat,
                             (long long)d->channels, (long long)d->height,
                             (long long)d->width, (unsigned long long)size);
        return LIO_DATUM_OK;
    }
    d->kind = LIO_DATUM_UINT8;
    if (d->data_len != size)
        return MALFORMED(len, "data has %llu bytes, %lldx%lldx%lld needs %llu",
                         (unsigned long long)d->data_len,
                         (long long)d->channels, (long long)d->height,
                         (long long)d->width, (unsigned long long)size);
    return LIO_DATUM_OK;
}

void lio_datum_floats(const uint8_t *buf, size_t len, float *out)
{
    /* The record was validated by lio_datum_parse: only walk it. */
    const uint8_t *p = buf, *end = buf + len;
    size_t k = 0;
    while (p < end) {
        uint32_t field;
        unsigned wt;
        uint64_t v;
        if (get_tag(&p, buf, end, &field, &wt, NULL))
            return;
        if (field == 6 && wt == WT_I32) {
            out[k++] = f32_of(p);
            p += 4;
        } else if (field == 6 && wt == WT_LEN) {
            const uint8_t *q;
            if (get_varint(&p, end, &v))
                return;
            q = p + v;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            memcpy(out + k, p, v);
            k += v / 4;
            p = q;
#else
            for (; p < q; p += 4)
                out[k++] = f32_of(p);
#endif
        } else if (skip_field(&p, buf, end, field, wt, 0, NULL)) {
            return;
        }
    }
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case LIO_DATUM_UINT8: return "a raw uint8";
    case LIO_DATUM_FLOAT: return "a float_data";
    case LIO_DATUM_ENCODED: return "an encoded";
    default: return "an unknown";
    }
}

/* Records [lo, hi) of a batch (indices are the batch's). */
static int decode_range(const uint8_t *data, const int64_t *offsets,
                        size_t lo_i, size_t hi_i, int kind, int64_t c,
                        int64_t h, int64_t w, void *out, int64_t *labels,
                        int64_t *data_off, int64_t *data_len,
                        lio_datum_error *err)
{
    size_t i;
    uint64_t size = (uint64_t)c * (uint64_t)h * (uint64_t)w;
    lio_datum d;
    int rc;

    for (i = lo_i; i < hi_i; i++) {
        int64_t lo = offsets[i], hi = offsets[i + 1];
        const uint8_t *rec = data + lo;
        size_t len;
        if (lo < 0 || hi < lo) {
            err->index = (int64_t)i;
            return fail(err, LIO_DATUM_EMALFORMED, 0,
                        "bad offsets [%lld, %lld)", (long long)lo,
                        (long long)hi);
        }
        len = (size_t)(hi - lo);
        rc = lio_datum_parse(rec, len, &d, err);
        if (rc) {
            err->index = (int64_t)i;
            return rc;
        }
        if (d.kind != kind) {
            err->index = (int64_t)i;
            return fail(err, LIO_DATUM_EMISMATCH, 0,
                        "is %s Datum, the batch's first record is %s one",
                        kind_name(d.kind), kind_name(kind));
        }
        labels[i] = d.label;
        if (kind == LIO_DATUM_ENCODED) {
            data_off[i] = lo + (int64_t)d.data_off;
            data_len[i] = (int64_t)d.data_len;
            continue;
        }
        if (d.channels != c || d.height != h || d.width != w) {
            err->index = (int64_t)i;
            return fail(err, LIO_DATUM_EMISMATCH, 0,
                        "has shape %lldx%lldx%lld, the batch's first record "
                        "%lldx%lldx%lld",
                        (long long)d.channels, (long long)d.height,
                        (long long)d.width, (long long)c, (long long)h,
                        (long long)w);
        }
        if (kind == LIO_DATUM_UINT8) {
            if (size)
                memcpy((uint8_t *)out + i * size, rec + d.data_off, size);
        } else {
            lio_datum_floats(rec, len, (float *)out + i * size);
        }
    }
    return LIO_DATUM_OK;
}

typedef struct decode_job {
    const uint8_t *data;
    const int64_t *offsets;
    size_t lo, hi;
    int kind;
    int64_t c, h, w;
    void *out;
    int64_t *labels, *data_off, *data_len;
    int rc;
    lio_datum_error err;
} decode_job;

static void *decode_job_run(void *arg)
{
    decode_job *j = (decode_job *)arg;
    j->err.index = -1;
    j->rc = decode_range(j->data, j->offsets, j->lo, j->hi, j->kind, j->c,
                         j->h, j->w, j->out, j->labels, j->data_off,
                         j->data_len, &j->err);
    return NULL;
}

#define MAX_DECODE_THREADS 16

int lio_datum_decode_batch(const uint8_t *data, const int64_t *offsets,
                           size_t n, int kind, int64_t c, int64_t h,
                           int64_t w, void *out, int64_t *labels,
                           int64_t *data_off, int64_t *data_len,
                           unsigned nthreads, lio_datum_error *err)
{
    decode_job jobs[MAX_DECODE_THREADS];
    pthread_t tids[MAX_DECODE_THREADS];
    int started[MAX_DECODE_THREADS];
    unsigned k, t;

    err->index = -1;
    if (nthreads > MAX_DECODE_THREADS)
        nthreads = MAX_DECODE_THREADS;
    if (nthreads > n)
        nthreads = (unsigned)n;
    if (nthreads <= 1)
        return decode_range(data, offsets, 0, n, kind, c, h, w, out, labels,
                            data_off, data_len, err);
    /* contiguous ranges; the caller's thread takes the first */
    for (k = 0; k < nthreads; k++) {
        decode_job *j = &jobs[k];
        j->data = data;
        j->offsets = offsets;
        j->lo = n * k / nthreads;
        j->hi = n * (k + 1) / nthreads;
        j->kind = kind;
        j->c = c;
        j->h = h;
        j->w = w;
        j->out = out;
        j->labels = labels;
        j->data_off = data_off;
        j->data_len = data_len;
        started[k] = 0;
    }
    for (k = 1; k < nthreads; k++)
        started[k] = pthread_create(&tids[k], NULL, decode_job_run,
                                    &jobs[k]) == 0;
    decode_job_run(&jobs[0]);
    for (k = 1; k < nthreads; k++) {
        if (started[k])
            pthread_join(tids[k], NULL);
        else
            decode_job_run(&jobs[k]);  /* no thread: do it here */
    }
    /* the first bad record is in the first range that has one */
    for (t = 0; t < nthreads; t++) {
        if (jobs[t].rc) {
            *err = jobs[t].err;
            return jobs[t].rc;
        }
    }
    return LIO_DATUM_OK;
}

/* ---- BlobProto --------------------------------------------------------- */

static const char *const BLOB_FIELDS[10] = {
    "?", "num", "channels", "height", "width", "data", "diff", "shape",
    "double_data", "double_diff"};

/* Repeated float (wt 5 / packed) or double (wt 1 / packed): count values. */
static int blob_repeated(const uint8_t **pp, const uint8_t *base,
                         const uint8_t *end, const char *name, unsigned wt,
                         unsigned width, uint64_t *count,
                         lio_datum_error *err)
{
    const uint8_t *fs = *pp;
    uint64_t v;
    int rc;
    unsigned fixed = width == 4 ? WT_I32 : WT_I64;
    if (wt == fixed) {
        if ((uint64_t)(end - *pp) < width)
            return MALFORMED(fs - base, "truncated %s value", name);
        *pp += width;
        ++*count;
        return 0;
    }
    if (wt == WT_LEN) {
        rc = get_len(pp, base, end, &v, name, err);
        if (rc)
            return rc;
        if (v % width)
            return MALFORMED(fs - base,
                             "packed %s of %llu bytes, not a multiple of %u",
                             name, (unsigned long long)v, width);
        *pp += v;
        *count += v / width;
        return 0;
    }
    return MALFORMED(fs - base, "%s: unexpected wire type %u", name, wt);
}

static int blob_shape(const uint8_t *p, const uint8_t *end,
                      const uint8_t *base, lio_blob *b, lio_datum_error *err)
{
    int rc;
    while (p < end) {
        const uint8_t *fs = p;
        uint32_t field;
        unsigned wt;
        uint64_t v;
        rc = get_tag(&p, base, end, &field, &wt, err);
        if (rc)
            return rc;
        if (field != 1) {
            rc = skip_field(&p, base, end, field, wt, 0, err);
            if (rc)
                return rc;
            continue;
        }
        if (wt == WT_VARINT) {
            rc = get_varint(&p, end, &v);
            if (rc)
                return varint_error(err, rc, fs - base, "shape.dim");
            if (b->ndim >= LIO_BLOB_MAX_DIMS)
                return MALFORMED(fs - base, "more than %d shape dims",
                                 LIO_BLOB_MAX_DIMS);
            b->dim[b->ndim++] = (int64_t)v;
        } else if (wt == WT_LEN) {
            const uint8_t *q;
            rc = get_len(&p, base, end, &v, "packed shape.dim", err);
            if (rc)
                return rc;
            q = p + v;
            while (p < q) {
                const uint8_t *vs = p;
                uint64_t x;
                rc = get_varint(&p, q, &x);
                if (rc)
                    return varint_error(err, rc, vs - base, "shape.dim");
                if (b->ndim >= LIO_BLOB_MAX_DIMS)
                    return MALFORMED(vs - base, "more than %d shape dims",
                                     LIO_BLOB_MAX_DIMS);
                b->dim[b->ndim++] = (int64_t)x;
            }
        } else {  /* another wire type: an unknown field */
            rc = skip_field(&p, base, end, field, wt, 0, err);
            if (rc)
                return rc;
        }
    }
    return 0;
}

int lio_blob_parse(const uint8_t *buf, size_t len, lio_blob *b,
                   lio_datum_error *err)
{
    const uint8_t *p = buf, *end = buf + len;
    uint64_t v, scratch = 0;
    int rc, i, other;

    memset(b, 0, sizeof *b);
    if (err)
        err->index = -1;
    while (p < end) {
        const uint8_t *fs = p;
        uint32_t field;
        unsigned wt;
        rc = get_tag(&p, buf, end, &field, &wt, err);
        if (rc)
            return rc;
        /* a known field with another wire type is an unknown field */
        other = (field <= 4 && wt != WT_VARINT) ||
                ((field == 5 || field == 6) && wt != WT_I32 && wt != WT_LEN) ||
                (field == 7 && wt != WT_LEN) ||
                ((field == 8 || field == 9) && wt != WT_I64 && wt != WT_LEN);
        switch (other ? 0 : field) {
        case 1: case 2: case 3: case 4:
            rc = get_varint(&p, end, &v);
            if (rc)
                return varint_error(err, rc, fs - buf, BLOB_FIELDS[field]);
            b->has_legacy = 1;
            if (field == 1) b->num = (int32_t)(uint32_t)v;
            else if (field == 2) b->channels = (int32_t)(uint32_t)v;
            else if (field == 3) b->height = (int32_t)(uint32_t)v;
            else b->width = (int32_t)(uint32_t)v;
            break;
        case 5:
            rc = blob_repeated(&p, buf, end, "data", wt, 4, &b->ndata, err);
            if (rc)
                return rc;
            break;
        case 6:
            rc = blob_repeated(&p, buf, end, "diff", wt, 4, &scratch, err);
            if (rc)
                return rc;
            break;
        case 7:
            rc = get_len(&p, buf, end, &v, "shape", err);
            if (rc)
                return rc;
            /* a repeated embedded message merges: dims accumulate */
            b->has_shape = 1;
            rc = blob_shape(p, p + v, buf, b, err);
            if (rc)
                return rc;
            p += v;
            break;
        case 8:
            rc = blob_repeated(&p, buf, end, "double_data", wt, 8,
                               &b->ndouble, err);
            if (rc)
                return rc;
            break;
        case 9:
            rc = blob_repeated(&p, buf, end, "double_diff", wt, 8, &scratch,
                               err);
            if (rc)
                return rc;
            break;
        default:
            rc = skip_field(&p, buf, end, field, wt, 0, err);
            if (rc)
                return rc;
        }
    }
    if (b->num < 0 || b->channels < 0 || b->height < 0 || b->width < 0)
        return MALFORMED(len, "negative legacy shape %lldx%lldx%lldx%lld",
                         (long long)b->num, (long long)b->channels,
                         (long long)b->height, (long long)b->width);
    for (i = 0; i < b->ndim; i++)
        if (b->dim[i] < 0 || b->dim[i] > INT32_MAX)
            return MALFORMED(len, "shape dim %d is %lld", i,
                             (long long)b->dim[i]);
    return 0;
}

void lio_blob_values(const uint8_t *buf, size_t len, int use_double,
                     float *out)
{
    const uint8_t *p = buf, *end = buf + len;
    uint32_t want = use_double ? 8 : 5;
    size_t k = 0;
    while (p < end) {
        uint32_t field;
        unsigned wt;
        uint64_t v;
        if (get_tag(&p, buf, end, &field, &wt, NULL))
            return;
        if (field == want && wt == WT_LEN) {
            const uint8_t *q;
            if (get_varint(&p, end, &v))
                return;
            q = p + v;
            if (use_double)
                for (; p < q; p += 8)
                    out[k++] = (float)f64_of(p);
            else
                for (; p < q; p += 4)
                    out[k++] = f32_of(p);
        } else if (field == want && wt == (use_double ? WT_I64 : WT_I32)) {
            out[k++] = use_double ? (float)f64_of(p) : f32_of(p);
            p += use_double ? 8 : 4;
        } else if (skip_field(&p, buf, end, field, wt, 0, NULL)) {
            return;
        }
    }
}

/* ---- DataTransformer --------------------------------------------------- */

/* One output row of cw values: e = (float)src[x] - mean (mrow[x] for a
 * mean file, mv for a mean value, nothing for mode 0), out = e * scale, at
 * x or, mirrored, at cw - 1 - x.  Exactly Caffe's float arithmetic (IEEE
 * single precision, subtraction then multiplication, no fused multiply-add)
 * whether the SSE2 path or the scalar one computes it. */
#if defined(__SSE2__)
#include <emmintrin.h>
#define LIO_SSE2 1
#endif

#if defined(__GNUC__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE static inline
#endif

#ifdef LIO_SSE2
ALWAYS_INLINE void put4(__m128 e, const float *mrow, __m128 vm, __m128 vs,
                        int mode, int mir, int64_t x, int64_t cw, float *o)
{
    if (mode == 1)
        e = _mm_sub_ps(e, _mm_loadu_ps(mrow + x));
    else if (mode == 2)
        e = _mm_sub_ps(e, vm);
    e = _mm_mul_ps(e, vs);
    if (mir)
        _mm_storeu_ps(o + cw - x - 4, _mm_shuffle_ps(e, e, _MM_SHUFFLE(0, 1, 2, 3)));
    else
        _mm_storeu_ps(o + x, e);
}
#endif

ALWAYS_INLINE void put1(float v, const float *mrow, float mv, float scale,
                        int mode, int mir, int64_t x, int64_t cw, float *o)
{
    float e;
    if (mode == 1) {
        e = v - mrow[x];
        e = e * scale;
    } else if (mode == 2) {
        e = v - mv;
        e = e * scale;
    } else {
        e = v * scale;
    }
    o[mir ? cw - 1 - x : x] = e;
}

ALWAYS_INLINE void row_u8(const uint8_t *s, const float *mrow, float mv,
                          float scale, int mode, int mir, int64_t cw,
                          float *o)
{
    int64_t x = 0;
#ifdef LIO_SSE2
    const __m128i zero = _mm_setzero_si128();
    const __m128 vm = _mm_set1_ps(mv), vs = _mm_set1_ps(scale);
    for (; x + 16 <= cw; x += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(s + x));
        __m128i lo = _mm_unpacklo_epi8(b, zero);
        __m128i hi = _mm_unpackhi_epi8(b, zero);
        put4(_mm_cvtepi32_ps(_mm_unpacklo_epi16(lo, zero)), mrow, vm, vs,
             mode, mir, x, cw, o);
        put4(_mm_cvtepi32_ps(_mm_unpackhi_epi16(lo, zero)), mrow, vm, vs,
             mode, mir, x + 4, cw, o);
        put4(_mm_cvtepi32_ps(_mm_unpacklo_epi16(hi, zero)), mrow, vm, vs,
             mode, mir, x + 8, cw, o);
        put4(_mm_cvtepi32_ps(_mm_unpackhi_epi16(hi, zero)), mrow, vm, vs,
             mode, mir, x + 12, cw, o);
    }
    for (; x + 4 <= cw; x += 4) {
        int32_t w4;
        __m128i b;
        memcpy(&w4, s + x, 4);
        b = _mm_unpacklo_epi8(_mm_cvtsi32_si128(w4), zero);
        put4(_mm_cvtepi32_ps(_mm_unpacklo_epi16(b, zero)), mrow, vm, vs,
             mode, mir, x, cw, o);
    }
#endif
    for (; x < cw; x++)
        put1((float)s[x], mrow, mv, scale, mode, mir, x, cw, o);
}

ALWAYS_INLINE void row_f32(const float *s, const float *mrow, float mv,
                           float scale, int mode, int mir, int64_t cw,
                           float *o)
{
    int64_t x = 0;
#ifdef LIO_SSE2
    const __m128 vm = _mm_set1_ps(mv), vs = _mm_set1_ps(scale);
    for (; x + 4 <= cw; x += 4)
        put4(_mm_loadu_ps(s + x), mrow, vm, vs, mode, mir, x, cw, o);
#endif
    for (; x < cw; x++)
        put1(s[x], mrow, mv, scale, mode, mir, x, cw, o);
}

/* The rows of one channel of one datum, specialised on (mode, mirror). */
#define CHANNEL_LOOP(ROW, T, MODE, MIR)                                     \
    for (y = 0; y < ch; y++) {                                              \
        size_t in = cbase + (size_t)(y + ho) * W + wo;                      \
        ROW((const T *)src + i * img_in + in, MODE == 1 ? mean + in : NULL, \
            mv, scale, MODE, MIR, cw, o + (size_t)y * cw);                  \
    }

static void transform_channel(const void *src, int src_float, size_t i,
                              size_t img_in, size_t cbase, int64_t ho,
                              int64_t wo, int64_t W, int64_t ch, int64_t cw,
                              const float *mean, float mv, int mode, int mir,
                              float scale, float *o)
{
    int64_t y;
    switch ((src_float ? 8 : 0) | mode << 1 | (mir != 0)) {
    case 0: CHANNEL_LOOP(row_u8, uint8_t, 0, 0); break;
    case 1: CHANNEL_LOOP(row_u8, uint8_t, 0, 1); break;
    case 2: CHANNEL_LOOP(row_u8, uint8_t, 1, 0); break;
    case 3: CHANNEL_LOOP(row_u8, uint8_t, 1, 1); break;
    case 4: CHANNEL_LOOP(row_u8, uint8_t, 2, 0); break;
    case 5: CHANNEL_LOOP(row_u8, uint8_t, 2, 1); break;
    case 8: CHANNEL_LOOP(row_f32, float, 0, 0); break;
    case 9: CHANNEL_LOOP(row_f32, float, 0, 1); break;
    case 10: CHANNEL_LOOP(row_f32, float, 1, 0); break;
    case 11: CHANNEL_LOOP(row_f32, float, 1, 1); break;
    case 12: CHANNEL_LOOP(row_f32, float, 2, 0); break;
    default: CHANNEL_LOOP(row_f32, float, 2, 1); break;
    }
}

int lio_transform(const void *src, int src_float, size_t n, int64_t C,
                  int64_t H, int64_t W, int64_t crop, const int64_t *h_off,
                  const int64_t *w_off, const uint8_t *mirror,
                  const float *mean, const float *mean_values, float scale,
                  float *out)
{
    int64_t ch = crop > 0 ? crop : H, cw = crop > 0 ? crop : W;
    size_t plane_in = (size_t)H * (size_t)W, img_in = (size_t)C * plane_in;
    size_t plane_out = (size_t)ch * (size_t)cw;
    size_t img_out = (size_t)C * plane_out;
    int mode = mean ? 1 : mean_values ? 2 : 0;
    size_t i;
    int64_t c;

    if (ch > H || cw > W)
        return -1;
    for (i = 0; i < n; i++) {
        int64_t ho = h_off ? h_off[i] : 0, wo = w_off ? w_off[i] : 0;
        if (ho < 0 || wo < 0 || ho + ch > H || wo + cw > W)
            return -1;
    }
    for (i = 0; i < n; i++) {
        int64_t ho = h_off ? h_off[i] : 0, wo = w_off ? w_off[i] : 0;
        int mir = mirror ? mirror[i] != 0 : 0;
        float *oimg = out + i * img_out;
        for (c = 0; c < C; c++) {
            float mv = mode == 2 ? mean_values[c] : 0.0f;
            transform_channel(src, src_float, i, img_in,
                              (size_t)c * plane_in, ho, wo, W, ch, cw, mean,
                              mv, mode, mir, scale,
                              oimg + (size_t)c * plane_out);
        }
    }
    return 0;
}
