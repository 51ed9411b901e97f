/* Fuzz target: the page parser and the tree walk.
 *
 * The input is a whole data file.  Open it over an in-memory source, take
 * the newest snapshot, and walk cursors over the free DB, the main DB and
 * up to four named DBs: first/next to the end, last/prev to the start,
 * set/set_range/get on keys seen and on mutated keys, and for DUPSORT
 * trees the duplicate moves, count, get_both and the MULTIPLE ops.  Every
 * value returned is read in full.  Any crash, leak, hang or sanitizer
 * report is a finding; errors (LIO_CORRUPTED etc.) are expected. */
#include "fuzz_common.h"

#define MAX_STEPS 4000

static volatile unsigned sink;

static void walk(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                 fz_keys *named)
{
    lio_cursor *c;
    lio_error err;
    lio_val k, v;
    fz_keys seen = {0};
    int rc, steps;
    uint64_t cnt;

    if (lio_cursor_open(&c, env, snap, db, &err))
        return;
    for (rc = lio_cursor_get(c, &k, &v, LIO_FIRST), steps = 0;
         rc == 0 && steps < MAX_STEPS;
         rc = lio_cursor_get(c, &k, &v, LIO_NEXT), steps++) {
        sink += fz_touch(&k) + fz_touch(&v);
        if (steps % 7 == 0)
            fz_keep(&seen, &k);
        if (named && v.size == 48)
            fz_keep(named, &k);
        if ((db->flags & LIO_DUPSORT) && steps % 5 == 0) {
            lio_cursor_count(c, &cnt);
            rc = lio_cursor_get(c, &k, &v, LIO_LAST_DUP);
            if (rc == 0)
                sink += fz_touch(&v);
            lio_cursor_get(c, &k, &v, LIO_FIRST_DUP);
            lio_cursor_get(c, &k, &v, LIO_NEXT_NODUP);
            if (db->flags & LIO_DUPFIXED) {
                /* GET_MULTIPLE leaves data alone when there is nothing to
                 * return (as liblmdb): start from an empty value */
                v.data = NULL;
                v.size = 0;
                if (lio_cursor_get(c, &k, &v, LIO_GET_MULTIPLE) == 0)
                    sink += fz_touch(&v);
                v.data = NULL;
                v.size = 0;
                if (lio_cursor_get(c, &k, &v, LIO_NEXT_MULTIPLE) == 0)
                    sink += fz_touch(&v);
            }
        }
    }
    for (rc = lio_cursor_get(c, &k, &v, LIO_LAST), steps = 0;
         rc == 0 && steps < MAX_STEPS;
         rc = lio_cursor_get(c, &k, &v, LIO_PREV), steps++) {
        sink += fz_touch(&k) + fz_touch(&v);
        if ((db->flags & LIO_DUPSORT) && steps % 5 == 0) {
            lio_cursor_get(c, &k, &v, LIO_PREV_DUP);
            lio_cursor_get(c, &k, &v, LIO_PREV_NODUP);
            if (db->flags & LIO_DUPFIXED) {
                v.data = NULL;
                v.size = 0;
                if (lio_cursor_get(c, &k, &v, LIO_PREV_MULTIPLE) == 0)
                    sink += fz_touch(&v);
            }
        }
    }
    for (unsigned i = 0; i < seen.n; i++) {
        uint8_t buf[FZ_KEYLEN + 1];
        lio_val q = {seen.key[i], seen.len[i]};
        if (lio_cursor_get(c, &q, &v, LIO_SET_RANGE) == 0)
            sink += fz_touch(&q) + fz_touch(&v);
        q.data = seen.key[i];
        q.size = seen.len[i];
        if (lio_cursor_get(c, &q, &v, LIO_SET_KEY) == 0) {
            sink += fz_touch(&v);
            if (db->flags & LIO_DUPSORT) {
                lio_val d = v;
                uint8_t dv[FZ_KEYLEN];
                size_t dn = d.size < FZ_KEYLEN ? d.size : FZ_KEYLEN;
                memcpy(dv, d.data, dn);
                d.data = dv;
                d.size = dn;
                q.data = seen.key[i];
                q.size = seen.len[i];
                lio_cursor_get(c, &q, &d, LIO_GET_BOTH);
                d.data = dv;
                d.size = dn;
                lio_cursor_get(c, &q, &d, LIO_GET_BOTH_RANGE);
            }
            lio_cursor_get(c, &k, &v, LIO_GET_CURRENT);
            lio_cursor_get(c, &k, &v, LIO_NEXT);
            lio_cursor_get(c, &k, &v, LIO_PREV);
        }
        /* a key just after it, and a shorter one */
        memcpy(buf, seen.key[i], seen.len[i]);
        buf[seen.len[i]] = 0x80;
        q.data = buf;
        q.size = seen.len[i] + 1;
        if (lio_cursor_get(c, &q, &v, LIO_SET_RANGE) == 0)
            sink += fz_touch(&q);
        lio_cursor_get(c, &k, &v, LIO_PREV);
        q.data = buf;
        q.size = seen.len[i] > 1 ? seen.len[i] - 1 : 1;
        if (lio_get(c, &q, &v) == 0)
            sink += fz_touch(&v);
        lio_cursor_get(c, &k, &v, LIO_NEXT);
    }
    lio_cursor_close(c);
}

/* A forward walk that defers overflow values, as the drop-in binding does:
 * steps inside a leaf, then each value read alone or in a planned batch
 * with the next ones (lio_cursor_plan_values / lio_cursor_values_into). */
static void walk_deferred(lio_env *env, const lio_meta *snap,
                          const lio_dbrec *db)
{
    lio_cursor *c;
    lio_error err;
    lio_val k, v;
    lio_value_run runs[LIO_VALUES_MAX];
    void *dsts[LIO_VALUES_MAX];
    int rc, steps;

    if (lio_cursor_open(&c, env, snap, db, &err))
        return;
    lio_cursor_defer_values(c, 1);
    for (rc = lio_cursor_get(c, &k, &v, LIO_FIRST), steps = 0;
         rc == 0 && steps < MAX_STEPS; steps++) {
        sink += fz_touch(&k);
        if (v.data == NULL && v.size) {
            size_t n = lio_cursor_plan_values(c, runs, LIO_VALUES_MAX,
                                              1u << 20), good = 0, i;
            for (i = 0; i < n; i++)
                if (!(dsts[i] = malloc(runs[i].size ? runs[i].size : 1)))
                    break;
            if (i == n && n > 1 &&
                lio_cursor_values_into(c, runs, n, dsts, &good) == 0)
                sink += good;
            else if (i == n && n == 1)
                sink += (unsigned)lio_cursor_value_into(c, dsts[0]);
            while (i > 0)
                free(dsts[--i]);
        } else {
            sink += fz_touch(&v);
        }
        if (!lio_cursor_step(c, &k, &v, 1))
            rc = lio_cursor_get(c, &k, &v, LIO_NEXT);
    }
    lio_cursor_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lio_membuf mb = {data, size};
    lio_source src;
    lio_env *env;
    lio_meta snap;
    lio_error err;
    fz_keys named = {0};

    lio_mem_source(&src, &mb);
    /* a small cache (evictions) and some readahead */
    if (lio_env_open(&env, &src, 64 * 4096, 16 * 4096, &err))
        return 0;
    if (lio_env_snapshot(env, 0, &snap, &err) == 0) {
        walk(env, &snap, &snap.free_db, NULL);
        walk(env, &snap, &snap.main_db, &named);
        walk_deferred(env, &snap, &snap.main_db);
        for (unsigned i = 0; i < named.n && i < 4; i++) {
            lio_dbrec rec;
            if (lio_named_db(env, &snap, named.key[i], named.len[i], &rec,
                             &err) == 0)
                walk(env, &snap, &rec, NULL);
        }
    }
    lio_env_close(env);
    return 0;
}
