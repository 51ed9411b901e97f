/* Shared by the fuzz targets: open an environment over the input bytes. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stdlib.h>
#include <string.h>

#include "lmdbio.h"

/* Keys seen during a walk, copied (the core's pointers live one op). */
#define FZ_KEYS 12
#define FZ_KEYLEN 64
typedef struct fz_keys {
    unsigned n;
    size_t len[FZ_KEYS];
    uint8_t key[FZ_KEYS][FZ_KEYLEN];
} fz_keys;

static inline void fz_keep(fz_keys *k, const lio_val *v)
{
    if (k->n < FZ_KEYS && v->size) {
        size_t n = v->size < FZ_KEYLEN ? v->size : FZ_KEYLEN;
        memcpy(k->key[k->n], v->data, n);
        k->len[k->n++] = n;
    }
}

/* Touch every byte of a value the core returned (ASan checks the range). */
static inline unsigned fz_touch(const lio_val *v)
{
    unsigned s = 0;
    for (size_t i = 0; i < v->size; i++)
        s += v->data[i];
    return s;
}

#endif
