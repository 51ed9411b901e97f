/* Fuzz target: the Caffe Datum / BlobProto decoder (csrc/datum.c).  The
 * input is one serialized record; it is parsed as a Datum (and decoded as a
 * batch of itself, twice, when it parses) and as a BlobProto. */
#include <stdlib.h>
#include <string.h>

#include "datum.h"

static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lio_datum d;
    lio_blob b;
    lio_datum_error err;

    if (lio_datum_parse(data, size, &d, &err) == LIO_DATUM_OK) {
        int64_t chw = d.channels * d.height * d.width;
        int64_t offs[3] = {0, (int64_t)size, 2 * (int64_t)size};
        uint8_t *two = malloc(2 * size + 1);
        int64_t labels[2], doff[2], dlen[2];
        if (d.kind == LIO_DATUM_FLOAT && d.nfloat) {
            float *f = malloc(d.nfloat * sizeof *f);
            if (f) {
                lio_datum_floats(data, size, f);
                for (uint64_t i = 0; i < d.nfloat; i++)
                    sink += f[i] > 0.0f;
                free(f);
            }
        }
        if (two) {
            void *out = NULL;
            memcpy(two, data, size);
            memcpy(two + size, data, size);
            if (d.kind == LIO_DATUM_UINT8 && chw >= 0)
                out = malloc(2 * (size_t)chw + 1);
            else if (d.kind == LIO_DATUM_FLOAT && chw >= 0)
                out = malloc(2 * (size_t)chw * sizeof(float) + 1);
            if (out || d.kind == LIO_DATUM_ENCODED)
                lio_datum_decode_batch(two, offs, 2, d.kind, d.channels,
                                       d.height, d.width, out, labels, doff,
                                       dlen, 1 + (size & 1), &err);
            free(out);
            free(two);
        }
    }
    if (lio_blob_parse(data, size, &b, &err) == LIO_DATUM_OK) {
        uint64_t n = b.ndouble ? b.ndouble : b.ndata;
        float *f = malloc((n ? n : 1) * sizeof *f);
        if (f) {
            lio_blob_values(data, size, b.ndouble != 0, f);
            for (uint64_t i = 0; i < n; i++)
                sink += f[i] > 0.0f;
            free(f);
        }
    }
    return 0;
}
