/* lmdbio C core: Caffe Datum and BlobProto wire-format decoding, and
 * Caffe's DataTransformer over a whole batch (docs/caffe-pytorch.md).
 *
 * No Python, no allocation: the caller sizes the outputs (a first parse
 * tells the shape), then one call decodes a whole batch of records stored
 * back to back (the Reader's Ragged layout) and can run without the GIL.
 *
 * Trust nothing: every varint, length and size is checked against the
 * record's bounds before use; a malformed record yields LIO_DATUM_EMALFORMED
 * with the record index, the byte offset and the problem in the error.
 */
#ifndef LMDBIO_DATUM_H
#define LMDBIO_DATUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a Datum holds. */
#define LIO_DATUM_UINT8 1    /* raw pixels: `data`, C*H*W bytes (C, H, W order) */
#define LIO_DATUM_FLOAT 2    /* `float_data` (data empty), C*H*W values */
#define LIO_DATUM_ENCODED 3  /* `encoded` set: `data` is a JPEG/PNG/... file */

/* Return codes. */
#define LIO_DATUM_OK 0
#define LIO_DATUM_EMALFORMED (-1)  /* bad wire format or inconsistent sizes */
#define LIO_DATUM_EMISMATCH (-2)   /* a record differs from the batch's shape
                                      or kind (first record's) */

typedef struct lio_datum {
    int64_t channels, height, width;  /* int32 fields, 0 when absent */
    int64_t label;                    /* int32, 0 when absent */
    int has_label;
    int encoded;                      /* bool field 7 */
    int kind;                         /* LIO_DATUM_* */
    uint64_t data_off, data_len;      /* last `data` field's payload */
    uint64_t nfloat;                  /* float_data values (packed+unpacked) */
} lio_datum;

typedef struct lio_datum_error {
    int64_t index;      /* record index within the batch, -1 for none */
    uint64_t offset;    /* byte offset within the record */
    char msg[200];      /* the problem (without the index) */
} lio_datum_error;

/* Parse and validate one serialized Datum: wire format (truncated varints,
 * lengths past the end, wrong wire types of known fields, invalid wire types
 * and field numbers), sizes (negative or overflowing C*H*W) and, for raw
 * Datums, len(data) == C*H*W, for float Datums nfloat == C*H*W.  Unknown
 * fields are skipped (groups included); the last occurrence of a singular
 * field wins; repeated float_data accumulates packed and unpacked chunks.
 * err->index is set to -1. */
int lio_datum_parse(const uint8_t *buf, size_t len, lio_datum *d,
                    lio_datum_error *err);

/* Copy the float_data values of a Datum that lio_datum_parse accepted into
 * out (d->nfloat values, in order). */
void lio_datum_floats(const uint8_t *buf, size_t len, float *out);

/* Decode n records stored back to back (record i is
 * data[offsets[i] .. offsets[i+1])) that must all be of `kind` and, unless
 * encoded, of shape (c, h, w):
 *   LIO_DATUM_UINT8: out is uint8[n][c*h*w];
 *   LIO_DATUM_FLOAT: out is float[n][c*h*w];
 *   LIO_DATUM_ENCODED: out is unused; data_off/data_len (n each) receive
 *     where each record's image file lies within `data`.
 * labels: int64[n].  Returns LIO_DATUM_OK, or an error for the first bad
 * record (err->index): EMALFORMED for bytes that are not a valid Datum,
 * EMISMATCH for a valid one of another kind or shape.  nthreads > 1 splits
 * the batch into that many contiguous ranges decoded by short-lived
 * threads (the caller's among them); the error is still the first bad
 * record's. */
int lio_datum_decode_batch(const uint8_t *data, const int64_t *offsets,
                           size_t n, int kind, int64_t c, int64_t h,
                           int64_t w, void *out, int64_t *labels,
                           int64_t *data_off, int64_t *data_len,
                           unsigned nthreads, lio_datum_error *err);

/* BlobProto (the mean file). */
#define LIO_BLOB_MAX_DIMS 32
typedef struct lio_blob {
    int64_t num, channels, height, width;  /* legacy 4-D shape */
    int has_legacy;                        /* any of the four present */
    int ndim;                              /* shape.dim count (BlobShape) */
    int has_shape;
    int64_t dim[LIO_BLOB_MAX_DIMS];
    uint64_t ndata;                        /* data (float) values */
    uint64_t ndouble;                      /* double_data values */
} lio_blob;

int lio_blob_parse(const uint8_t *buf, size_t len, lio_blob *b,
                   lio_datum_error *err);
/* Copy the blob's values (double_data when present, as Caffe's
 * Blob::FromProto, else data) into out as float: ndouble or ndata values. */
void lio_blob_values(const uint8_t *buf, size_t len, int use_double,
                     float *out);

/* Caffe's DataTransformer over a batch of n datums of shape (C, H, W),
 * uint8 (src_float 0) or float (src_float 1), into out, float[n][C][ch][cw]
 * where (ch, cw) = (crop, crop) when crop > 0 else (H, W):
 *   out[i][c][y][x'] = (src[i][c][y + h_off[i]][x + w_off[i]] - m) * scale
 * with x' = cw - 1 - x when mirror[i] (else x), m = mean[c][y + h_off[i]]
 * [x + w_off[i]] (mean file, C*H*W), or mean_values[c], or nothing (both
 * NULL).  h_off, w_off, mirror may be NULL (all zero).  Float arithmetic
 * exactly as Caffe's (float subtraction, then float multiplication).
 * Returns 0, or -1 for offsets that do not fit (checked first). */
int lio_transform(const void *src, int src_float, size_t n, int64_t C,
                  int64_t H, int64_t W, int64_t crop, const int64_t *h_off,
                  const int64_t *w_off, const uint8_t *mirror,
                  const float *mean, const float *mean_values, float scale,
                  float *out);

#ifdef __cplusplus
}
#endif

#endif /* LMDBIO_DATUM_H */
