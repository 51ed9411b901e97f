/* Fuzz target: the record index builder and bulk reads (index.c, plan.c,
 * bulk.c) over a whole file in memory, with an executor that copies from
 * the input.  Builds the index of the main DB (and of the first named DB),
 * then reads records by ordinal: all of them in order, a few in reverse
 * and repeated, the last one, with and without keys.  Then the same index
 * with a record map as a cache file could carry one: the built map with
 * entries replaced, flipped or cleared by the input's bytes (a map is
 * input: lio_index_set_map must refuse what would read outside a page,
 * and the reads must stay inside the batch).  Before the build, the same
 * tree counted by its reads (counted_db). */
#include "fuzz_common.h"

static volatile unsigned sink;

static void read_some(lio_bulk *b, const int64_t *ords, size_t n, int keys)
{
    uint64_t kb = 0, vb = 0;
    uint8_t *kd = NULL, *vd = NULL;
    int64_t *ko = NULL, *vo = NULL;
    if (lio_bulk_prepare(b, ords, n, &kb, &vb))
        return;
    /* sizes were checked against the file: allocating them is bounded */
    kd = malloc(kb ? kb : 1);
    vd = malloc(vb ? vb : 1);
    ko = malloc((n + 1) * sizeof *ko);
    vo = malloc((n + 1) * sizeof *vo);
    if (kd && vd && ko && vo &&
        lio_bulk_fill(b, keys ? kd : NULL, ko, vd, vo) == 0) {
        for (uint64_t i = 0; i < vb; i++)
            sink += vd[i];
        if (keys)
            for (uint64_t i = 0; i < kb; i++)
                sink += kd[i];
    }
    free(kd);
    free(vd);
    free(ko);
    free(vo);
}

/* The index again, with a map made from the built one and the input. */
static void damaged_map(lio_env *env, const lio_meta *snap,
                        const lio_dbrec *db, lio_executor *ex,
                        const lio_index *built, const uint8_t *data,
                        size_t size)
{
    uint64_t n = built->nleaves, nrec, *lp, *fi, *map;
    lio_index *idx;
    lio_bulk *b;
    lio_error err;
    int64_t ords[16];
    size_t k = 0;
    lp = malloc((n ? n : 1) * sizeof *lp);
    fi = malloc((n + 1) * sizeof *fi);
    if (!lp || !fi) {
        free(lp);
        free(fi);
        return;
    }
    if (n)
        memcpy(lp, built->leaf_pgno, n * sizeof *lp);
    memcpy(fi, built->first, (n + 1) * sizeof *fi);
    if (lio_index_adopt(&idx, snap, db, n, lp, fi, 0, &err))
        return;
    nrec = idx->first[n] - idx->first[0];
    map = malloc((nrec ? nrec : 1) * sizeof *map);
    if (!map || size < 8) {
        free(map);
        lio_index_free(idx);
        return;
    }
    for (uint64_t i = 0; i < nrec; i++) {
        uint64_t e = built->recmap ? built->recmap[i] : 0;
        uint8_t x = data[(i * 131) % size];
        switch (x % 5) {
        case 1:
            memcpy(&e, data + (i * 8) % (size - 7), 8);
            break;
        case 2:
            e ^= (uint64_t)1 << (x % 64);
            break;
        case 3:
            e = 0;
            break;
        default:
            break;
        }
        map[i] = e;
    }
    if (lio_index_set_map(idx, lio_env_psize(env), map, nrec, &err) == 0 &&
        lio_bulk_open(&b, env, snap, db, idx, ex, &err) == 0) {
        /* sparse (the map path), then dense and repeated (both paths) */
        for (uint64_t i = 0; i < nrec && k < 8; i += 1 + nrec / 8)
            ords[k++] = (int64_t)i;
        if (k)
            read_some(b, ords, k, 1);
        k = 0;
        for (uint64_t i = 0; i < nrec && k < 12; i++)
            ords[k++] = (int64_t)(i / 2);
        if (k)
            read_some(b, ords, k, k & 1);
        lio_bulk_close(b);
    }
    lio_index_free(idx);
}

/* A begun index (lio_index_begin): windows in key order count the leaves
 * as they read them (lio_bulk_extend, with the leaves kept for the next
 * prepare; some read ahead, lio_bulk_read_leaves, from where the count
 * stands or one past it), then the rest is counted at once, and its map is
 * checked as a cached one would be. */
static void counted_db(lio_env *env, const lio_meta *snap,
                       const lio_dbrec *db, lio_executor *ex, size_t step)
{
    lio_index *idx;
    lio_bulk *b;
    lio_error err;
    int64_t ords[64];
    uint64_t n = db->entries, nm = 0;
    const uint64_t *m;
    if (lio_index_begin(&idx, env, snap, db, ex, NULL, &err))
        return;
    if (lio_bulk_open(&b, env, snap, db, idx, ex, &err) == 0) {
        lio_bulk_set_policy(b, 4096, 3 * 4096);
        for (uint64_t at = 0; at < n && at < 4096; at += step) {
            size_t k = 0;
            for (uint64_t o = at; o < n && o < at + step && k < 64; o++)
                ords[k++] = (int64_t)o;
            if (at & 2)   /* leaves read ahead of the count, some missed */
                lio_bulk_read_leaves(b, idx->nleaves + (at & 4 ? 1 : 0),
                                     idx->nleaves + step / 4 + 1);
            if (!k || lio_bulk_extend(b, idx, (uint64_t)ords[k - 1], 1))
                break;
            read_some(b, ords, k, (int)(at & 1));
        }
        if (lio_bulk_extend(b, idx, n ? n - 1 : 0, 0) == 0 &&
            (m = lio_index_built_map(idx, &nm)) != NULL) {
            uint64_t *copy = malloc((nm ? nm : 1) * sizeof *copy);
            if (copy) {
                memcpy(copy, m, nm * sizeof *copy);
                lio_index_set_map(idx, lio_env_psize(env), copy, nm, &err);
            }
        }
        lio_bulk_close(b);
    }
    lio_index_free(idx);
}

static void bulk_db(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                    lio_executor *ex, const uint8_t *data, size_t size)
{
    lio_index *idx;
    lio_bulk *b;
    lio_error err;
    uint64_t n;
    int64_t ords[64];
    size_t k = 0;

    /* A shard's run of leaves from either end: its ordinals are the
     * tree's, and one outside it is refused. */
    for (int from_end = 0; from_end < 2; from_end++) {
        if (lio_index_build_part(&idx, env, snap, db, ex, from_end,
                                 db->entries / 3 + 1, &err) == 0) {
            if (lio_bulk_open(&b, env, snap, db, idx, ex, &err) == 0) {
                ords[0] = (int64_t)idx->first[0];
                ords[1] = (int64_t)idx->first[idx->nleaves] - 1;
                ords[2] = from_end ? 0 : (int64_t)db->entries - 1;
                read_some(b, ords, 3, 1);
                lio_bulk_close(b);
            }
            lio_index_free(idx);
        }
    }
    counted_db(env, snap, db, ex, 1 + (size ? data[size - 1] % 63 : 0));
    if (lio_index_build(&idx, env, snap, db, ex, NULL, &err))
        return;
    n = idx->first[idx->nleaves];
    for (uint64_t i = 0; i < idx->nleaves; i++)
        sink += (unsigned)lio_index_find(idx, idx->first[i]);
    if (lio_bulk_open(&b, env, snap, db, idx, ex, &err) == 0) {
        lio_bulk_set_policy(b, 4096, 3 * 4096);
        for (uint64_t i = 0; i < n && k < 48; i += 1 + n / 48)
            ords[k++] = (int64_t)i;
        if (k)
            read_some(b, ords, k, 1);
        k = 0;
        if (n) {
            ords[k++] = (int64_t)(n - 1);
            ords[k++] = 0;
            ords[k++] = (int64_t)(n / 2);
            ords[k++] = (int64_t)(n - 1);
            ords[k++] = (int64_t)(n / 3);
            read_some(b, ords, k, 0);
            /* out of range: must be refused */
            ords[0] = (int64_t)n;
            read_some(b, ords, 1, 1);
        }
        lio_bulk_close(b);
    }
    /* The same tree with its leaves held in memory (those that pass the
     * checks; a bulk read reads the others as before). */
    if (!idx->recmap && lio_index_load_leaves(idx, env, db, ex) &&
        lio_bulk_open(&b, env, snap, db, idx, ex, &err) == 0) {
        k = 0;
        for (uint64_t i = 0; i < n && k < 48; i += 1 + n / 48)
            ords[k++] = (int64_t)(n - 1 - i);
        if (k)
            read_some(b, ords, k, 0);
        lio_bulk_close(b);
    }
    damaged_map(env, snap, db, ex, idx, data, size);
    lio_index_free(idx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lio_membuf mb = {data, size};
    lio_source src;
    lio_executor ex;
    lio_env *env;
    lio_meta snap;
    lio_error err;

    lio_mem_source(&src, &mb);
    lio_mem_executor(&ex, &mb);
    if (lio_env_open(&env, &src, 64 * 4096, 0, &err))
        return 0;
    if (lio_env_snapshot(env, 0, &snap, &err) == 0) {
        lio_cursor *c;
        lio_val k, v;
        bulk_db(env, &snap, &snap.main_db, &ex, data, size);
        bulk_db(env, &snap, &snap.free_db, &ex, data, size);
        if (lio_cursor_open(&c, env, &snap, &snap.main_db, &err) == 0) {
            uint8_t name[512];
            size_t len = 0;
            if (lio_cursor_get(c, &k, &v, LIO_FIRST) == 0 && v.size == 48 &&
                k.size < sizeof name) {
                memcpy(name, k.data, k.size);
                len = k.size;
            }
            lio_cursor_close(c);
            if (len) {
                lio_dbrec rec;
                if (lio_named_db(env, &snap, name, len, &rec, &err) == 0)
                    bulk_db(env, &snap, &rec, &ex, data, size);
            }
        }
    }
    lio_env_close(env);
    return 0;
}
