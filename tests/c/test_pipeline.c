/* Tests of the window pipeline (csrc/pipeline.c) against files the real
 * liblmdb writes (-llmdb), in C so that ThreadSanitizer and
 * AddressSanitizer see the lanes without Python in the way.
 *
 * Two environments of NREC records (keys "%08u", values of varied sizes,
 * every 50th on overflow pages, a few of 40 KB, a few empty; each value
 * byte a function of its record number): one written in key order
 * (MDB_APPEND: full leaves in file order), one in a seeded random order
 * over several commits (half-full leaves scattered over the file, pages
 * reused).  Each is opened as lmdbio's BulkFile opens it (posix source,
 * env, pool of 4 threads, the newest snapshot, the main DB's record), and
 * every window every pipeline delivers is checked record by record and
 * byte by byte: its block's layout, ordinals, key and value offsets, keys
 * and values.
 *
 *   whole        a whole index (lio_index_build): key order, a shuffled
 *                order, shares that wrap past the record count, keys on
 *                and off, batches of 1, 7 and 256, windows of 1 byte (one
 *                batch a window) and 4 MiB, read-ahead advice and
 *                drop-behind, the newest txnid
 *   begun        a begun index (lio_index_begin) counted by the lanes in
 *                turn, from position 0 and after a first window read
 *                outside the pipeline as reader.py does; the index then
 *                equals a whole build
 *   stop         lio_pipeline_stop/free from the consumer's thread while
 *                the lanes are mid-window
 *   stop_thread  lio_pipeline_stop from a second thread (or from two at
 *                once) while the consumer waits in lio_pipeline_next
 *                (which must return a window, LIO_STOPPED, or
 *                LIO_NOTFOUND once every window was taken; never hang)
 *   fork         a forked child extends a begun index whose lock a
 *                thread of the parent held at the fork
 *   device       slow reads of a source the OS does not count as blocks
 *                read in (NFS, FUSE) make lookups read around; of one it
 *                counts, without the count moving, they do not
 *   values       a cursor's worker (csrc/ahead.c) reads the runs of the
 *                next values of a walk while the walk takes them: every
 *                value, batches dropped midway, the cursor closed
 *                mid-batch; runs in file order never go to the worker
 *
 *   make -C tests/c test      (or: tests/c/test_pipeline [name ...]; a
 *                             name "whole/shuf" runs the cases of whole
 *                             whose names hold "shuf")
 *   make -C tests/c asan      (AddressSanitizer + UBSan)
 *   make -C tests/c tsan      (ThreadSanitizer)
 */
#define _DEFAULT_SOURCE /* mincore, MAP_ANONYMOUS (test: blocks) */
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lmdbio.h"
#include "core.h"   /* lio_page_get, lio_env_from_device (test: device) */

#define NREC 20000u
#define KEYLEN 8
#define MIB ((size_t)1 << 20)
#define STRESS_ITERS 40
#define WATCHDOG_SECONDS 120

/* ---- tiny framework ----------------------------------------------------- */

static char g_base[128];
static char g_case[160] = "?";   /* what runs now: named by every message */
static const char *g_only[8];    /* "test/part": cases whose name has part */
static int g_failed;             /* failures of the current test */

static void fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "  FAIL %s: ", g_case);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    g_failed++;
}

static void note(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "    ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

static void set_case(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_case, sizeof g_case, fmt, ap);
    va_end(ap);
}

/* A pipeline that hangs (a consumer never woken) ends the run naming the
 * case, instead of hanging make. */
static void on_alarm(int sig)
{
    static const char head[] = "\nTIMEOUT (a hang?) in ";
    size_t n = strlen(g_case);
    (void)sig;
    (void)!write(2, head, sizeof head - 1);
    (void)!write(2, g_case, n);
    (void)!write(2, "\n", 1);
    _exit(3);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_us(long us)
{
    struct timespec ts;
    if (us <= 0)
        return;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000;
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* splitmix64: the seeded orders */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---- the records ----------------------------------------------------------- */

/* Value size of record i: mostly 70..609 bytes (inline), every 50th about
 * 9000 (a 3-page overflow run), every 2500th about 40000 (10 pages: past
 * the bulk path's batch value limit), every 1000th empty. */
static size_t vsize_of(uint32_t i)
{
    if (i % 2500 == 1249)
        return 40000 + i % 97;
    if (i % 50 == 49)
        return 9000 + (i * 7u) % 300;
    if (i % 1000 == 500)
        return 0;
    return 70 + (size_t)(((i + 1) * 2654435761u) >> 20) % 540;
}

static uint8_t vbyte(uint32_t i, size_t j)
{
    uint32_t x = (i + 1) * 0x9E3779B1u + (uint32_t)j * 0x85EBCA77u;
    x ^= x >> 13;
    x *= 0xC2B2AE3Du;
    x ^= x >> 16;
    return (uint8_t)x;
}

static void key_of(uint32_t i, char out[16])
{
    snprintf(out, 16, "%08u", (unsigned)(i % 100000000u));
}

static uint8_t *g_vals;        /* every value back to back */
static size_t g_voff[NREC + 1];
static int64_t g_perm[NREC];   /* the shuffled epoch's order */

static int make_records(void)
{
    uint64_t s = 0x5eed0001;
    g_voff[0] = 0;
    for (uint32_t i = 0; i < NREC; i++)
        g_voff[i + 1] = g_voff[i] + vsize_of(i);
    if (!(g_vals = malloc(g_voff[NREC])))
        return -1;
    for (uint32_t i = 0; i < NREC; i++)
        for (size_t j = 0; j < vsize_of(i); j++)
            g_vals[g_voff[i] + j] = vbyte(i, j);
    for (uint32_t i = 0; i < NREC; i++)
        g_perm[i] = i;
    for (uint32_t i = NREC - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rng_next(&s) % (i + 1));
        int64_t t = g_perm[i];
        g_perm[i] = g_perm[j];
        g_perm[j] = t;
    }
    return 0;
}

#define MDB_OK(expr)                                                         \
    do {                                                                     \
        int rc_ = (expr);                                                    \
        if (rc_) {                                                           \
            fprintf(stderr, "  %s: %s: %s\n", path, #expr,                  \
                    mdb_strerror(rc_));                                      \
            return -1;                                                       \
        }                                                                    \
    } while (0)

/* Write the records with liblmdb: in key order (MDB_APPEND, one commit),
 * or scattered (a seeded random order, a commit every 2500 puts so that
 * freed pages are reused). */
/* Write nrec records with liblmdb to `path`: keys key_of(i), values
 * value(i) (given `scratch` of scratch_size bytes to fill, or not), in key
 * order (MDB_APPEND) or, if scattered, in the order of a shuffle seeded
 * with `seed`, committed every commit_every puts (0: once). */
typedef const uint8_t *(*value_fn)(uint32_t i, size_t *size,
                                   uint8_t *scratch);

static int write_records(const char *path, uint32_t nrec, int scattered,
                         uint64_t seed, value_fn value, size_t scratch_size,
                         uint32_t commit_every)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    uint32_t *order = malloc(nrec * sizeof *order);
    uint8_t *scratch = scratch_size ? malloc(scratch_size) : NULL;
    uint64_t s = seed;
    if (!order || (scratch_size && !scratch)) {
        free(order);
        free(scratch);
        return -1;
    }
    for (uint32_t i = 0; i < nrec; i++)
        order[i] = i;
    for (uint32_t i = nrec - 1; scattered && i > 0; i--) {
        uint32_t j = (uint32_t)(rng_next(&s) % (i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    MDB_OK(mdb_env_create(&env));
    MDB_OK(mdb_env_set_mapsize(env, (size_t)256 << 20));
    MDB_OK(mdb_env_open(env, path, MDB_NOSUBDIR, 0644));
    MDB_OK(mdb_txn_begin(env, NULL, 0, &txn));
    MDB_OK(mdb_dbi_open(txn, NULL, 0, &dbi));
    for (uint32_t n = 0; n < nrec; n++) {
        uint32_t i = order[n];
        char kb[16];
        MDB_val k, v;
        key_of(i, kb);
        k.mv_size = KEYLEN;
        k.mv_data = kb;
        v.mv_data = (void *)value(i, &v.mv_size, scratch);
        MDB_OK(mdb_put(txn, dbi, &k, &v, scattered ? 0 : MDB_APPEND));
        if (scattered && commit_every && (n + 1) % commit_every == 0 &&
            n + 1 < nrec) {
            MDB_OK(mdb_txn_commit(txn));
            MDB_OK(mdb_txn_begin(env, NULL, 0, &txn));
        }
    }
    MDB_OK(mdb_txn_commit(txn));
    mdb_env_close(env);
    free(order);
    free(scratch);
    return 0;
}

static const uint8_t *record_value(uint32_t i, size_t *size,
                                   uint8_t *scratch)
{
    (void)scratch;
    *size = vsize_of(i);
    return g_vals + g_voff[i];
}

static int make_file(const char *path, int scattered)
{
    return write_records(path, NREC, scattered, 0x5eed0002, record_value, 0,
                         2500);
}

/* ---- the files, opened as BulkFile opens them -------------------------- */

typedef struct lfile {
    const char *label;
    char path[256];
    lio_posix *posix;
    lio_source src;          /* (must outlive the env: never moves) */
    lio_env *env;
    lio_pool *pool;
    lio_executor ex;
    lio_meta snap;
    lio_dbrec db;
    lio_index *idx;          /* whole (lio_index_build) */
    lio_bulk *lane[2];       /* the pipeline's readers over idx */
    lio_pool_lane *lane_io[2];  /* their own descriptions of the file */
    lio_executor lane_ex[2];
} lfile;

static lfile g_files[2];

#define LIO_OK(expr, what)                                                   \
    do {                                                                     \
        int rc_ = (expr);                                                    \
        if (rc_) {                                                           \
            fail("%s returned %d: %s", #expr, rc_, (what)->msg);             \
            return -1;                                                       \
        }                                                                    \
    } while (0)

/* BulkFile.__cinit__ (posix, env with a 4 MiB cache, pool of 4 threads,
 * its executor), snapshot(0) (the newest txn, its main DB), build_index()
 * (through the pool's executor), then the pipeline's two readers
 * (start_pipeline: lio_bulk_open over a lane of the pool each). */
static int lf_open(lfile *f)
{
    lio_error err;
    set_case("%s/open", f->label);
    LIO_OK(lio_posix_open(&f->posix, f->path, 0, &err), &err);
    lio_posix_get_source(f->posix, &f->src);
    LIO_OK(lio_env_open(&f->env, &f->src, (size_t)4 << 20, 0, &err), &err);
    LIO_OK(lio_pool_open(&f->pool, f->posix, 4, &err), &err);
    lio_pool_get_executor(f->pool, &f->ex);
    LIO_OK(lio_env_snapshot(f->env, 0, &f->snap, &err), &err);
    f->db = f->snap.main_db;
    if (f->db.entries != NREC) {
        fail("the main DB holds %llu records, %u written",
             (unsigned long long)f->db.entries, NREC);
        return -1;
    }
    LIO_OK(lio_index_build(&f->idx, f->env, &f->snap, &f->db, &f->ex, NULL, &err),
           &err);
    for (int i = 0; i < 2; i++) {
        LIO_OK(lio_pool_lane_open(&f->lane_io[i], f->pool, &err), &err);
        if (!lio_pool_lane_own_fd(f->lane_io[i])) {
            fail("lane %d reads through the pool's description", i);
            return -1;
        }
        lio_pool_lane_get_executor(f->lane_io[i], &f->lane_ex[i]);
        LIO_OK(lio_bulk_open(&f->lane[i], f->env, &f->snap, &f->db, f->idx,
                             &f->lane_ex[i], &err), &err);
    }
    note("%s: txnid %llu, %u-byte pages, %llu leaves (%.1f records a "
         "leaf), %llu overflow pages, record map %s", f->label,
         (unsigned long long)f->snap.txnid, (unsigned)f->snap.psize,
         (unsigned long long)f->idx->nleaves,
         (double)NREC / (double)f->idx->nleaves,
         (unsigned long long)f->db.overflow_pages,
         f->idx->recmap ? "yes" : "no");
    return 0;
}

static void lf_close(lfile *f)
{
    for (int i = 0; i < 2; i++) {
        lio_bulk_close(f->lane[i]);
        f->lane[i] = NULL;
        lio_pool_lane_close(f->lane_io[i]);
        f->lane_io[i] = NULL;
    }
    lio_index_free(f->idx);
    f->idx = NULL;
    if (f->pool)
        lio_pool_close(f->pool);
    if (f->env)
        lio_env_close(f->env);
    if (f->posix)
        lio_posix_close(f->posix);
    f->pool = NULL;
    f->env = NULL;
    f->posix = NULL;
}

/* ---- checking a window ------------------------------------------------------ */

typedef struct pcase {
    const char *name;
    int shuffled;            /* cfg.perm = g_perm */
    uint64_t first, start, stop;
    size_t batch, window, prefetch, nbatch;
    unsigned ahead;
    int keys;
    int newest;              /* cfg.env set: each window reads the txnid */
    int cache;               /* 0 none, 1 read-ahead regions, 2 drop-behind */
    int hold;                /* keep window k-1 until k is taken (as the
                              * Reader does), re-checking it then */
} pcase;

static uint64_t expect_ordinal(const lio_pipeline_cfg *cfg, uint64_t pos)
{
    /* the share's positions from `first`, wrapped past the record count,
     * through the epoch's order */
    uint64_t q = (cfg->first + pos) % cfg->total;
    return cfg->perm ? (uint64_t)cfg->perm[q] : q;
}

static int phase16_ok(int64_t at) { return ((uint64_t)at & 63) == 16; }

/* Every record of window w (number k, expected at position `pos`). */
static int check_window(const lio_pipeline_cfg *cfg, const lio_window *w,
                        uint64_t k, uint64_t pos, uint64_t txnid)
{
    size_t n = w->n, nb = w->nb, bs = cfg->batch, at;
    const uint8_t *blk = w->block;
    const int64_t *ords, *voff, *koff = NULL, *vst, *kst;
    uint64_t vbytes = 0, kbytes = 0;

    if (w->rc) {
        fail("window %llu (position %llu) failed: rc %d: %s",
             (unsigned long long)k, (unsigned long long)w->start, w->rc,
             w->err.msg);
        return -1;
    }
    if (w->start != pos) {
        fail("window %llu starts at position %llu, expected %llu",
             (unsigned long long)k, (unsigned long long)w->start,
             (unsigned long long)pos);
        return -1;
    }
    if (n == 0 || pos + n > cfg->stop || nb != (n + bs - 1) / bs) {
        fail("window %llu at position %llu: %zu records in %zu batches "
             "(batch %zu, share ends at %llu)", (unsigned long long)k,
             (unsigned long long)pos, n, nb, bs,
             (unsigned long long)cfg->stop);
        return -1;
    }
    if (!blk || ((uintptr_t)blk & 4095) || w->cap == 0) {
        fail("window %llu: block %p of %zu bytes is not page-aligned memory",
             (unsigned long long)k, (const void *)blk, w->cap);
        return -1;
    }
    /* the layout of the head comment: ordinals, value offsets, key
     * offsets (keys), batch starts of values and keys, the keys */
    at = n * 8;
    if (w->voff_at != at ||
        (cfg->keys && w->koff_at != at + (n + nb) * 8) ||
        w->vstart_at != at + (n + nb) * 8 * (cfg->keys ? 2 : 1) ||
        w->kstart_at != w->vstart_at + (nb + 1) * 8 ||
        w->keys_at != w->kstart_at + (nb + 1) * 8 || w->keys_at > w->cap) {
        fail("window %llu (%zu records, %zu batches): layout voff_at %zu "
             "koff_at %zu vstart_at %zu kstart_at %zu keys_at %zu cap %zu",
             (unsigned long long)k, n, nb, w->voff_at, w->koff_at,
             w->vstart_at, w->kstart_at, w->keys_at, w->cap);
        return -1;
    }
    ords = (const int64_t *)blk;
    voff = (const int64_t *)(blk + w->voff_at);
    if (cfg->keys)
        koff = (const int64_t *)(blk + w->koff_at);
    vst = (const int64_t *)(blk + w->vstart_at);
    kst = (const int64_t *)(blk + w->kstart_at);
    if (kst[0] != (int64_t)w->keys_at) {
        fail("window %llu: keys start at %lld, expected %zu",
             (unsigned long long)k, (long long)kst[0], w->keys_at);
        return -1;
    }
    for (size_t j = 0; j < nb; j++) {
        size_t first = j * bs, last = first + bs < n ? first + bs : n;
        const int64_t *vo = voff + first + j;
        const int64_t *ko = koff ? koff + first + j : NULL;
        int64_t vlim = j + 1 < nb ? vst[j + 1] : (int64_t)w->cap;
        if (kst[j + 1] != kst[j] + (cfg->keys ? (int64_t)(last - first) *
                                                    KEYLEN : 0)) {
            fail("window %llu batch %zu: keys [%lld, %lld) for %zu records",
                 (unsigned long long)k, j, (long long)kst[j],
                 (long long)kst[j + 1], last - first);
            return -1;
        }
        if (!phase16_ok(vst[j]) || vst[j] < kst[nb] ||
            (j && vst[j] < vst[j - 1])) {
            fail("window %llu batch %zu: values start at %lld (keys end at "
                 "%lld; not 16 past a 64-byte boundary, or overlapping)",
                 (unsigned long long)k, j, (long long)vst[j],
                 (long long)kst[nb]);
            return -1;
        }
        if (vo[0] != 0 || (ko && ko[0] != 0)) {
            fail("window %llu batch %zu: first offsets %lld / %lld, not 0",
                 (unsigned long long)k, j, (long long)vo[0],
                 ko ? (long long)ko[0] : 0LL);
            return -1;
        }
        for (size_t r = first; r < last; r++) {
            size_t i = r - first;
            uint64_t p = pos + r, want = expect_ordinal(cfg, p);
            uint32_t ord;
            size_t vs;
            const uint8_t *got, *exp;
            if (ords[r] != (int64_t)want) {
                fail("window %llu batch %zu record %zu (position %llu): "
                     "ordinal %lld, expected %llu", (unsigned long long)k, j,
                     r, (unsigned long long)p, (long long)ords[r],
                     (unsigned long long)want);
                return -1;
            }
            ord = (uint32_t)want;
            vs = vsize_of(ord);
            if (vo[i + 1] - vo[i] != (int64_t)vs ||
                vst[j] + vo[i + 1] > vlim) {
                fail("window %llu batch %zu record %zu (ordinal %u): value "
                     "at [%lld, %lld) of the batch's values at %lld, "
                     "expected %zu bytes before %lld",
                     (unsigned long long)k, j, r, ord, (long long)vo[i],
                     (long long)vo[i + 1], (long long)vst[j], vs,
                     (long long)vlim);
                return -1;
            }
            got = blk + vst[j] + vo[i];
            exp = g_vals + g_voff[ord];
            if (vs && memcmp(got, exp, vs) != 0) {
                size_t b = 0;
                while (got[b] == exp[b])
                    b++;
                fail("window %llu batch %zu record %zu (position %llu, "
                     "ordinal %u): value byte %zu of %zu is 0x%02x, "
                     "expected 0x%02x", (unsigned long long)k, j, r,
                     (unsigned long long)p, ord, b, vs, got[b], exp[b]);
                return -1;
            }
            vbytes += vs;
            if (ko) {
                char kb[16];
                const uint8_t *kg = blk + kst[j] + ko[i];
                if (ko[i + 1] - ko[i] != KEYLEN ||
                    kst[j] + ko[i + 1] > kst[j + 1]) {
                    fail("window %llu batch %zu record %zu (ordinal %u): "
                         "key at [%lld, %lld), expected %d bytes",
                         (unsigned long long)k, j, r, ord, (long long)ko[i],
                         (long long)ko[i + 1], KEYLEN);
                    return -1;
                }
                key_of(ord, kb);
                for (size_t b = 0; b < KEYLEN; b++)
                    if (kg[b] != (uint8_t)kb[b]) {
                        fail("window %llu batch %zu record %zu (ordinal "
                             "%u): key byte %zu is 0x%02x, expected 0x%02x "
                             "('%s')", (unsigned long long)k, j, r, ord, b,
                             kg[b], (uint8_t)kb[b], kb);
                        return -1;
                    }
                kbytes += KEYLEN;
            }
        }
        if (j + 1 == nb && vst[nb] != vst[j] + vo[last - first]) {
            fail("window %llu: values end at %lld, the last batch's at %lld",
                 (unsigned long long)k, (long long)vst[nb],
                 (long long)(vst[j] + vo[last - first]));
            return -1;
        }
    }
    if ((uint64_t)vst[nb] > w->cap) {
        fail("window %llu: values end at %lld, past the block's %zu bytes",
             (unsigned long long)k, (long long)vst[nb], w->cap);
        return -1;
    }
    if (w->bytes != w->leaf_bytes + vbytes + kbytes) {
        fail("window %llu: bytes %llu, expected leaves %llu + values %llu + "
             "keys %llu", (unsigned long long)k,
             (unsigned long long)w->bytes, (unsigned long long)w->leaf_bytes,
             (unsigned long long)vbytes, (unsigned long long)kbytes);
        return -1;
    }
    if (w->newest != (cfg->env ? txnid : 0)) {
        fail("window %llu: newest txnid %llu, expected %llu",
             (unsigned long long)k, (unsigned long long)w->newest,
             (unsigned long long)(cfg->env ? txnid : 0));
        return -1;
    }
    return 0;
}

/* ---- running a pipeline ------------------------------------------------------- */

static void make_cfg(lio_pipeline_cfg *cfg, lfile *f, lio_bulk *const *lanes,
                     lio_index *grow, const uint64_t basis[2][2],
                     const pcase *c)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->lanes[0] = lanes[0];
    cfg->lanes[1] = lanes[1];
    cfg->nlanes = 2;
    cfg->env = c->newest ? f->env : NULL;
    cfg->perm = c->shuffled ? g_perm : NULL;
    cfg->total = f->db.entries;
    cfg->first = c->first;
    cfg->start = c->start;
    cfg->stop = c->stop;
    cfg->batch = c->batch;
    cfg->window_bytes = c->window;
    cfg->prefetch_bytes = c->prefetch;
    cfg->nbatch = c->nbatch;
    cfg->ahead = c->ahead;
    cfg->keys = c->keys;
    cfg->advised = c->start;
    if (grow) {   /* start_pipeline over a pending index */
        cfg->grow = grow;
        cfg->entries = f->db.entries;
        memcpy(cfg->basis, basis, sizeof cfg->basis);
    }
    for (int i = 0; i < 2; i++) {   /* BulkFile.set_cache / new_pass */
        if (c->cache == 1)
            lio_bulk_set_cache(lanes[i], (size_t)1 << 20, 1, 0);
        else if (c->cache == 2)
            lio_bulk_set_cache(lanes[i], (size_t)1 << 20, 1, 1);
        else
            lio_bulk_set_cache(lanes[i], 0, 0, 0);
    }
}

/* Run case c to its end, checking every window; 0 when all is well. */
static int run_case(lfile *f, lio_bulk *const *lanes, lio_index *grow,
                    const uint64_t basis[2][2], const pcase *c)
{
    lio_pipeline_cfg cfg;
    lio_pipeline *p;
    lio_pipeline_stats st;
    lio_window w, held;
    lio_error err;
    uint64_t pos = c->start, k = 0, batches = 0;
    int rc, bad = 0, holding = 0;
    double t0 = now();

    make_cfg(&cfg, f, lanes, grow, basis, c);
    LIO_OK(lio_pipeline_start(&p, &cfg, &err), &err);
    while ((rc = lio_pipeline_next(p, &w)) == 0) {
        if (check_window(&cfg, &w, k, pos, f->snap.txnid)) {
            bad = 1;
            lio_block_give(w.block, w.cap);
            break;
        }
        if (holding) {   /* window k-1 untouched while k was read */
            if (check_window(&cfg, &held, k - 1, held.start, f->snap.txnid)) {
                note("(window %llu changed after it was delivered)",
                     (unsigned long long)(k - 1));
                bad = 1;
            }
            lio_block_give(held.block, held.cap);
            holding = 0;
        }
        if (c->hold) {
            held = w;
            holding = 1;
        } else {
            lio_block_give(w.block, w.cap);
        }
        lio_pipeline_release(p);
        if (k % 16 == 0)
            lio_pipeline_get_stats(p, &st);   /* (beside the lanes) */
        pos += w.n;
        batches += w.nb;
        k++;
        if (bad)
            break;
        if (c->window == 1 && c->nbatch == 1 && w.nb != 1) {
            fail("window %llu holds %zu batches with a 1-byte budget",
                 (unsigned long long)k - 1, w.nb);
            bad = 1;
            break;
        }
    }
    if (holding)
        lio_block_give(held.block, held.cap);
    if (!bad && rc != LIO_NOTFOUND) {
        fail("lio_pipeline_next returned %d after %llu windows", rc,
             (unsigned long long)k);
        bad = 1;
    }
    if (!bad && pos != c->stop) {
        fail("the windows ended at position %llu, the share at %llu",
             (unsigned long long)pos, (unsigned long long)c->stop);
        bad = 1;
    }
    lio_pipeline_get_stats(p, &st);
    if (!bad && st.windows != k) {
        fail("stats: %llu windows read whole, %llu taken",
             (unsigned long long)st.windows, (unsigned long long)k);
        bad = 1;
    }
    lio_pipeline_free(p);
    if (!bad)
        note("%-34s %6llu records %5llu windows %6llu batches, largest "
             "%7.1f KiB / %4llu batches, ahead %llu  %.2fs", c->name,
             (unsigned long long)(c->stop - c->start), (unsigned long long)k,
             (unsigned long long)batches, (double)st.max_bytes / 1024.0,
             (unsigned long long)st.max_batches,
             (unsigned long long)st.max_ahead, now() - t0);
    return bad ? -1 : 0;
}

/* ---- whole index ------------------------------------------------------------------ */

#define N ((uint64_t)NREC)
#define M4 (4 * MIB)
#define P64 (64 * MIB)

static const pcase whole_cases[] = {
    /* name                 shuf first start stop batch window prefetch
     *                      nbatch ahead keys newest cache hold */
    {"key_keys_b256_4M", 0, 0, 0, N, 256, M4, P64, 1, 2, 1, 1, 0, 1},
    {"key_nokeys_b256_1B", 0, 0, 0, N, 256, 1, P64, 1, 2, 0, 0, 1, 0},
    {"key_keys_b7_1B", 0, 0, 0, N, 7, 1, P64, 1, 2, 1, 0, 0, 1},
    {"key_nokeys_b7_4M", 0, 0, 0, N, 7, M4, 16 * MIB, 1, 2, 0, 1, 2, 1},
    {"key_keys_b1_4M", 0, 0, 0, N, 1, M4, P64, 1, 2, 1, 0, 1, 0},
    {"key_nokeys_b1_1B_part", 0, 0, 1000, 3500, 1, 1, P64, 1, 2, 0, 0, 0,
     1},
    {"shuf_keys_b256_4M", 1, 0, 0, N, 256, M4, P64, 1, 2, 1, 1, 1, 1},
    {"shuf_nokeys_b256_1B", 1, 0, 0, N, 256, 1, P64, 1, 2, 0, 0, 0, 0},
    {"shuf_keys_b7_4M", 1, 0, 0, N, 7, M4, 8 * MIB, 1, 2, 1, 0, 2, 0},
    {"shuf_nokeys_b7_1B", 1, 0, 0, N, 7, 1, P64, 1, 2, 0, 1, 1, 1},
    {"shuf_keys_b1_4M", 1, 0, 0, N, 1, M4, P64, 1, 2, 1, 0, 0, 1},
    {"shuf_keys_b1_1B_part", 1, 0, 0, 2500, 1, 1, P64, 1, 2, 1, 0, 1, 0},
    {"shuf_keys_b256_4M_nbatch4_ahead0", 1, 0, 0, N, 256, M4, 1, 4, 0, 1,
     0, 0, 1},
    {"key_keys_b7_4M_prefetch1", 0, 0, 0, N, 7, M4, 1, 1, 1, 1, 0, 0, 0},
    /* shares that wrap past the record count */
    {"wrap_key_keys_b256_4M", 0, N - 1234, 0, N, 256, M4, P64, 1, 2, 1, 1,
     0, 1},
    {"wrap_key_nokeys_b7_1B", 0, N - 1234, 0, N, 7, 1, P64, 1, 2, 0, 0, 1,
     0},
    {"wrap_shuf_keys_b7_1B", 1, N - 1234, 0, N, 7, 1, P64, 1, 2, 1, 0, 0,
     1},
    {"wrap_shuf_nokeys_b256_4M_mid", 1, N - 500, 300, 300 + N / 2, 256, M4,
     P64, 1, 2, 0, 1, 2, 0},
    {"wrap_key_keys_b7_4M_past_total", 0, N - 3, 0, N + 777, 7, M4, P64, 1,
     2, 1, 0, 0, 1},
    {"wrap_shuf_keys_b256_1B_first_3N", 1, 3 * N + 11, 0, 5000, 256, 1,
     P64, 1, 2, 1, 0, 1, 0},
    {"wrap_shuf_keys_b1_1B_part", 1, N - 700, 0, 1500, 1, 1, P64, 1, 2, 1,
     1, 0, 1},
    /* edges */
    {"empty_share", 0, 0, 500, 500, 7, M4, P64, 1, 2, 1, 0, 0, 0},
    {"last_record", 0, 0, N - 1, N, 256, M4, P64, 1, 2, 1, 0, 0, 0},
    {"one_short_batch", 1, 0, 0, 5, 256, M4, P64, 1, 2, 1, 1, 0, 1},
};

/* Whether case `name` of test `test` is to run (all of them unless an
 * argument "test/part" names some). */
static int case_wanted(const char *test, const char *name)
{
    size_t n = strlen(test);
    int any = 0;
    for (int i = 0; i < 8 && g_only[i]; i++)
        if (strncmp(g_only[i], test, n) == 0 && g_only[i][n] == '/') {
            any = 1;
            if (strstr(name, g_only[i] + n + 1))
                return 1;
        }
    return !any;
}

static int t_whole(lfile *f)
{
    for (size_t i = 0; i < sizeof whole_cases / sizeof *whole_cases; i++) {
        if (!case_wanted("whole", whole_cases[i].name))
            continue;
        set_case("%s/whole/%s", f->label, whole_cases[i].name);
        alarm(WATCHDOG_SECONDS);
        run_case(f, f->lane, NULL, NULL, &whole_cases[i]);
    }
    return 0;
}

/* ---- begun index ------------------------------------------------------------------ */

/* What a begun index counted is a prefix of a whole build (all of it
 * after a whole epoch, stop == N), holding at least the records before
 * `need` (the positions [0, need) of windows delivered in key order). */
static void check_counted(lfile *f, const lio_index *gi, uint64_t need,
                          uint64_t stop)
{
    const lio_index *wi = f->idx;
    uint64_t nl = gi->nleaves;
    if (gi->tree_leaves != wi->nleaves || nl > wi->nleaves ||
        memcmp(gi->leaf_pgno, wi->leaf_pgno,
               gi->tree_leaves * sizeof *gi->leaf_pgno)) {
        fail("the begun index's leaves (%llu counted of %llu) differ from a "
             "whole build's (%llu)", (unsigned long long)nl,
             (unsigned long long)gi->tree_leaves,
             (unsigned long long)wi->nleaves);
        return;
    }
    if (stop >= N && lio_index_pending(gi)) {
        fail("after the whole epoch %llu of %llu leaves are counted",
             (unsigned long long)nl, (unsigned long long)gi->tree_leaves);
        return;
    }
    if (need && !lio_index_holds(gi, need - 1)) {
        fail("after windows through position %llu the index holds only "
             "%llu records", (unsigned long long)need,
             (unsigned long long)gi->first[nl]);
        return;
    }
    for (uint64_t i = 0; i <= nl; i++)
        if (gi->first[i] != wi->first[i]) {
            fail("the begun index's first[%llu] = %llu, a whole build's "
                 "%llu", (unsigned long long)i,
                 (unsigned long long)gi->first[i],
                 (unsigned long long)wi->first[i]);
            return;
        }
    if (stop >= N && wi->recmap) {
        uint64_t n = 0;
        const uint64_t *m = lio_index_built_map(gi, &n);
        if (!m || n != N || memcmp(m, wi->recmap, N * sizeof *m))
            fail("the begun index's record map (%s, %llu entries) differs "
                 "from a whole build's", m ? "made" : "none",
                 (unsigned long long)n);
    }
}

/* A begun index and the pipeline's two readers over it (_new_index with
 * lio_index_begin, then _new_bulk twice), and a third reader (the file's
 * own, _open_bulk) for a first window read outside the pipeline. */
static int open_begun(lfile *f, lio_index **gi, lio_bulk *lanes[3])
{
    lio_error err;
    lanes[0] = lanes[1] = lanes[2] = NULL;
    LIO_OK(lio_index_begin(gi, f->env, &f->snap, &f->db, &f->ex, NULL, &err),
           &err);
    if (!lio_index_pending(*gi)) {
        fail("a begun index has no leaf pending");
        return -1;
    }
    for (int i = 0; i < 3; i++)
        LIO_OK(lio_bulk_open(&lanes[i], f->env, &f->snap, &f->db, *gi,
                             i < 2 ? &f->lane_ex[i] : &f->ex, &err), &err);
    return 0;
}

static void close_begun(lio_index *gi, lio_bulk *lanes[3])
{
    for (int i = 0; i < 3; i++)
        lio_bulk_close(lanes[i]);
    lio_index_free(gi);
}

/* reader.py's first window: one batch of positions [0, n) read by the
 * file's reader (extend_index through its last ordinal, then read()),
 * then the pipeline from position n with basis ((0, 0), (leaves counted,
 * records they hold)). */
static int first_window(lfile *f, lio_bulk *b, lio_index *gi, size_t n,
                        int keys)
{
    int64_t ords[256], koff[257], voff[257];
    uint64_t kb = 0, vb = 0;
    uint8_t *kd, *vd;
    int rc = 0;
    if (n > 256)
        n = 256;
    for (size_t i = 0; i < n; i++)
        ords[i] = (int64_t)i;
    if (lio_bulk_extend(b, gi, n - 1, 1) ||
        lio_bulk_prepare(b, ords, n, &kb, &vb)) {
        fail("first window: %s", lio_bulk_error(b)->msg);
        return -1;
    }
    kd = malloc(kb + 1);
    vd = malloc(vb + 1);
    if (!kd || !vd ||
        lio_bulk_fill(b, keys ? kd : NULL, koff, vd, voff)) {
        fail("first window: %s", kd && vd ? lio_bulk_error(b)->msg : "oom");
        rc = -1;
    }
    for (size_t i = 0; !rc && i < n; i++) {
        size_t vs = vsize_of((uint32_t)i);
        char k[16];
        key_of((uint32_t)i, k);
        if (voff[i + 1] - voff[i] != (int64_t)vs ||
            memcmp(vd + voff[i], g_vals + g_voff[i], vs) ||
            (keys && (koff[i + 1] - koff[i] != KEYLEN ||
                      memcmp(kd + koff[i], k, KEYLEN)))) {
            fail("first window: record %zu differs", i);
            rc = -1;
        }
    }
    free(kd);
    free(vd);
    return rc;
}

static const pcase begun_cases[] = {
    {"begun_keys_b256_4M", 0, 0, 0, N, 256, M4, P64, 1, 2, 1, 1, 0, 1},
    {"begun_nokeys_b256_1B", 0, 0, 0, N, 256, 1, P64, 1, 2, 0, 0, 1, 0},
    {"begun_keys_b7_1B", 0, 0, 0, N, 7, 1, P64, 1, 2, 1, 0, 2, 1},
    {"begun_nokeys_b7_4M", 0, 0, 0, N, 7, M4, 8 * MIB, 1, 2, 0, 1, 1, 0},
    {"begun_keys_b1_4M", 0, 0, 0, N, 1, M4, P64, 1, 2, 1, 0, 0, 1},
    {"begun_keys_b7_1B_third", 0, 0, 0, N / 3, 7, 1, P64, 1, 2, 1, 0, 0, 0},
    {"begun_keys_b256_4M_nbatch3_ahead0", 0, 0, 0, N, 256, M4, 1, 3, 0, 1,
     0, 1, 1},
    /* after a first window read outside (start = batch: first_window) */
    {"begun_after_first_b256_4M", 0, 0, 256, N, 256, M4, P64, 2, 1, 1, 1, 1,
     1},
    {"begun_after_first_b7_1B", 0, 0, 7, N, 7, 1, P64, 2, 1, 0, 0, 0, 0},
    {"begun_after_first_b1_4M", 0, 0, 1, N, 1, M4, P64, 2, 1, 1, 0, 2, 1},
};

static int t_begun(lfile *f)
{
    for (size_t i = 0; i < sizeof begun_cases / sizeof *begun_cases; i++) {
        const pcase *c = &begun_cases[i];
        uint64_t basis[2][2] = {{0, 0}, {0, 0}};
        lio_index *gi = NULL;
        lio_bulk *lanes[3];
        if (!case_wanted("begun", c->name))
            continue;
        set_case("%s/begun/%s", f->label, c->name);
        alarm(WATCHDOG_SECONDS);
        if (open_begun(f, &gi, lanes)) {
            close_begun(gi, lanes);
            continue;
        }
        if (c->start) {
            if (first_window(f, lanes[2], gi, c->start, c->keys)) {
                close_begun(gi, lanes);
                continue;
            }
            basis[1][0] = gi->nleaves;
            basis[1][1] = gi->first[gi->nleaves];
        }
        if (run_case(f, lanes, gi, (const uint64_t(*)[2])basis, c) == 0)
            check_counted(f, gi, c->stop, c->stop);
        close_begun(gi, lanes);
    }
    return 0;
}

/* ---- stop stress ---------------------------------------------------------------- */

/* Iteration `it` of a stress test: a case of varied order, keys, batch and
 * window, and whether it counts a begun index. */
static pcase stress_case(unsigned it, int *begun)
{
    pcase c;
    memset(&c, 0, sizeof c);
    c.name = "stress";
    *begun = it % 4 == 3;
    c.shuffled = !*begun && (it & 1);
    c.first = *begun ? 0 : (uint64_t)it * 997 % N;
    c.start = 0;
    c.stop = N;
    c.batch = it % 3 == 0 ? 7 : it % 3 == 1 ? 64 : 256;
    c.window = it % 5 == 0 ? 1 : it % 5 == 1 ? 64 * 1024 : M4;
    c.prefetch = 16 * MIB;
    c.nbatch = 1 + it % 2;
    c.ahead = it % 3;
    c.keys = (it >> 1) & 1;
    c.newest = it % 5 == 2;
    c.cache = it % 7 == 1 ? 1 : it % 7 == 4 ? 2 : 0;
    return c;
}

static long stress_delay_us(unsigned it)
{
    static const long d[] = {0, 0, 20, 100, 300, 1000, 3000};
    return d[(it * 5 + it / 7) % 7];
}

/* Start the pipeline of a stress case (over a begun index of its own when
 * `begun`, whose readers go to gl): 0, or 1 after saying why not (nothing
 * is left open then). */
static int start_stress(lfile *f, int begun, lio_index **gi, lio_bulk *gl[3],
                        uint64_t basis[2][2], const pcase *c,
                        lio_pipeline_cfg *cfg, lio_pipeline **p)
{
    lio_bulk *const *lanes = f->lane;
    lio_error err;
    if (begun) {
        if (open_begun(f, gi, gl)) {
            close_begun(*gi, gl);
            return 1;
        }
        lanes = gl;
    }
    make_cfg(cfg, f, lanes, begun ? *gi : NULL,
             (const uint64_t(*)[2])basis, c);
    if (lio_pipeline_start(p, cfg, &err)) {
        fail("lio_pipeline_start: %s", err.msg);
        if (begun)
            close_begun(*gi, gl);
        return 1;
    }
    return 0;
}

/* Start a pipeline, take a few windows, then stop and free it (or free
 * it, which stops it) from this thread while the lanes are reading. */
static int t_stop(lfile *f)
{
    for (unsigned it = 0; it < STRESS_ITERS; it++) {
        int begun;
        pcase c = stress_case(it, &begun);
        lio_index *gi = NULL;
        lio_bulk *gl[3] = {NULL, NULL, NULL};
        uint64_t basis[2][2] = {{0, 0}, {0, 0}}, pos = 0;
        int release = it % 8 < 5, rc = 0;
        /* windows are read ahead of those released: without a release
         * the lanes read ahead + 1 >= 2 windows and wait */
        unsigned take = release ? it % 5 : it % 3, k;
        lio_pipeline_cfg cfg;
        lio_pipeline *p;
        lio_window w;
        set_case("%s/stop/%u (%s, %s, batch %zu, window %zu, take %u%s, "
                 "delay %ldus, %s)", f->label, it,
                 begun ? "begun" : c.shuffled ? "shuffled" : "key order",
                 c.keys ? "keys" : "no keys", c.batch, c.window, take,
                 release ? "" : " unreleased", stress_delay_us(it),
                 it % 2 ? "stop+free" : "free");
        alarm(WATCHDOG_SECONDS);
        if (start_stress(f, begun, &gi, gl, basis, &c, &cfg, &p))
            continue;
        for (k = 0; k < take; k++) {
            if ((rc = lio_pipeline_next(p, &w)))
                break;
            if (check_window(&cfg, &w, k, pos, f->snap.txnid))
                take = 0;
            pos += w.n;
            lio_block_give(w.block, w.cap);
            if (release)
                lio_pipeline_release(p);
        }
        if (rc) {
            fail("lio_pipeline_next returned %d at window %u", rc, k);
        }
        sleep_us(stress_delay_us(it));
        if (it % 2)
            lio_pipeline_stop(p);
        lio_pipeline_free(p);
        if (begun) {
            /* what the lanes counted before the stop is a prefix of the
             * whole build's */
            check_counted(f, gi, pos, 0);
            close_begun(gi, gl);
        }
    }
    return 0;
}

typedef struct stopper {
    lio_pipeline *p;
    long delay_us;
} stopper;

static void *stopper_main(void *arg)
{
    stopper *s = arg;
    sleep_us(s->delay_us);
    lio_pipeline_stop(s->p);
    return NULL;
}

/* Second threads stop the pipeline while this one takes windows or waits
 * in lio_pipeline_next: that returns a window, LIO_STOPPED with windows
 * untaken, or LIO_NOTFOUND once all were taken.  With two stoppers each
 * returns once the lanes are joined (freeing after both must be safe).
 * Modes: 0 the consumer never releases (the lanes stop claiming after a
 * few windows, so the consumer surely waits in next when the stop comes);
 * 1 it releases each window; 2 it releases and is slow. */
static int t_stop_thread(lfile *f)
{
    for (unsigned it = 0; it < STRESS_ITERS; it++) {
        int begun, mode = (int)(it % 3), nstop = 1 + (int)((it / 3) % 2);
        pcase c = stress_case(it + 1, &begun);
        lio_index *gi = NULL;
        lio_bulk *gl[3] = {NULL, NULL, NULL};
        uint64_t basis[2][2] = {{0, 0}, {0, 0}}, pos = 0, k = 0;
        lio_pipeline_cfg cfg;
        lio_pipeline *p;
        lio_window w;
        pthread_t tid[2];
        stopper s;
        int rc, started = 0;
        set_case("%s/stop_thread/%u (%s, %s, batch %zu, window %zu, mode "
                 "%d, delay %ldus, %d stopper%s)", f->label, it,
                 begun ? "begun" : c.shuffled ? "shuffled" : "key order",
                 c.keys ? "keys" : "no keys", c.batch, c.window, mode,
                 stress_delay_us(it + 3), nstop, nstop > 1 ? "s" : "");
        alarm(WATCHDOG_SECONDS);
        if (start_stress(f, begun, &gi, gl, basis, &c, &cfg, &p))
            continue;
        s.p = p;
        s.delay_us = stress_delay_us(it + 3);
        for (; started < nstop; started++)
            if (pthread_create(&tid[started], NULL, stopper_main, &s)) {
                fail("pthread_create failed");
                break;
            }
        if (started < nstop) {
            lio_pipeline_stop(p);
            for (int i = 0; i < started; i++)
                pthread_join(tid[i], NULL);
            lio_pipeline_free(p);
            if (begun)
                close_begun(gi, gl);
            continue;
        }
        while ((rc = lio_pipeline_next(p, &w)) == 0) {
            if (check_window(&cfg, &w, k, pos, f->snap.txnid)) {
                lio_block_give(w.block, w.cap);
                break;
            }
            pos += w.n;
            k++;
            lio_block_give(w.block, w.cap);
            if (mode)
                lio_pipeline_release(p);
            if (mode == 2)
                sleep_us(50);
        }
        if (rc != 0 && rc != LIO_NOTFOUND && rc != LIO_STOPPED)
            fail("lio_pipeline_next returned %d after %llu windows", rc,
                 (unsigned long long)k);
        if (rc == LIO_NOTFOUND && pos != c.stop)
            fail("LIO_NOTFOUND at position %llu, the share ends at %llu",
                 (unsigned long long)pos, (unsigned long long)c.stop);
        if (rc == LIO_STOPPED && pos >= c.stop)
            fail("LIO_STOPPED after every window was taken");
        for (int i = 0; i < nstop; i++)
            pthread_join(tid[i], NULL);
        /* after the stop, next hands out what was read before it, then
         * says LIO_STOPPED (or LIO_NOTFOUND, all taken) at once */
        while ((rc = lio_pipeline_next(p, &w)) == 0)
            lio_block_give(w.block, w.cap);
        if (rc != LIO_NOTFOUND && rc != LIO_STOPPED)
            fail("lio_pipeline_next after the stop returned %d", rc);
        lio_pipeline_free(p);
        if (begun)
            close_begun(gi, gl);
    }
    return 0;
}

/* The parent holds a begun index's lock (as a lane counting leaves does)
 * when the process forks: the child's extension (its new epoch's first
 * window) must count the leaves, not wait forever for a lock whose
 * holder is not in the child. */
static int t_fork(lfile *f)
{
    lio_index *gi = NULL;
    lio_bulk *gl[3];
    pid_t pid;
    int status = 0;
    set_case("%s/fork", f->label);
    alarm(WATCHDOG_SECONDS);
    if (open_begun(f, &gi, gl)) {
        close_begun(gi, gl);
        return 0;
    }
    pthread_mutex_lock(&gi->grow);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        alarm(10);
        if (lio_bulk_extend(gl[0], gi, N / 2, 1) ||
            !lio_index_holds(gi, N / 2)) {
            fail("the child's extension: %s", lio_bulk_error(gl[0])->msg);
            _exit(1);
        }
        _exit(0);
    }
    pthread_mutex_unlock(&gi->grow);
    if (pid < 0)
        fail("fork failed");
    else if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
             WEXITSTATUS(status) != 0)
        fail("the child %s %d", WIFEXITED(status) ? "exited with" :
             "was killed by signal", WIFEXITED(status) ? WEXITSTATUS(status)
             : WTERMSIG(status));
    close_begun(gi, gl);
    return 0;
}

/* ---- device: which slow reads mean storage ------------------------------ */

/* A source that answers like f's file, each read 300 us late: storage
 * behind a network or FUSE filesystem, or a busy machine's descheduled
 * reads.  counted: what the posix source would say of a file on a block
 * device (the OS counts its storage reads as blocks read in). */
typedef struct slow_src {
    lio_source inner;
    int fast_left;          /* reads served at once before the slow ones */
} slow_src;

static int64_t slow_read(void *ctx, uint64_t off, void *buf, size_t len)
{
    slow_src *s = ctx;
    if (s->fast_left > 0)
        s->fast_left--;
    else
        sleep_us(300);
    return s->inner.read(s->inner.ctx, off, buf, len);
}

static int64_t slow_size(void *ctx)
{
    slow_src *s = ctx;
    return s->inner.size(s->inner.ctx);
}

/* Lookups of leaves not in lmdbio's cache, each read late.  Where the OS
 * does not count the source's reads (counted 0: NFS, FUSE, MPI-IO), the
 * time alone decides: the env takes its reads as the storage's and reads
 * around the pages it misses.  Where it counts them (counted 1) and its
 * count did not move (this file sits in the OS's cache: slow only because
 * late), they are a busy machine's, not storage: no read-around. */
static int t_device(lfile *f)
{
    for (int counted = 0; counted < 2; counted++) {
        slow_src s;
        lio_source src;
        lio_env *env = NULL;
        lio_meta snap;
        lio_error err;
        struct rusage ru0, ru1;
        int device = 0;
        s.inner = f->src;
        memset(&src, 0, sizeof src);
        src.ctx = &s;
        src.read = slow_read;
        src.size = slow_size;
        src.align = 1;
        src.counted_reads = counted;
        s.fast_left = 0;
        set_case("device/%s/counted=%d", f->label, counted);
        LIO_OK(lio_env_open(&env, &src, (size_t)4 << 20, 0, &err), &err);
        if (lio_env_snapshot(env, 0, &snap, &err)) {
            fail("snapshot: %s", err.msg);
            lio_env_close(env);
            return 0;
        }
        getrusage(RUSAGE_SELF, &ru0);
        /* leaves far apart: none read around by another's miss */
        for (uint64_t k = 0; k < 6 && !device; k++) {
            uint64_t leaf = f->idx->leaf_pgno[k * (f->idx->nleaves - 1) / 5];
            lio_page *pg;
            if (lio_page_get(env, &snap, leaf, LIO_GET_AROUND, &pg, &err)) {
                fail("page %llu: %s", (unsigned long long)leaf, err.msg);
                break;
            }
            lio_page_unpin(env, pg);
            device = lio_env_from_device(env);
        }
        getrusage(RUSAGE_SELF, &ru1);
        if (counted && ru1.ru_inblock != ru0.ru_inblock)
            /* (the process read blocks meanwhile: its code's pages under
             * a sanitizer, say; then they may well be the storage's) */
            note("device/%s/counted=1: %ld blocks read in meanwhile, not "
                 "decided", f->label, ru1.ru_inblock - ru0.ru_inblock);
        else if (device != !counted)
            fail("slow reads of a source the OS %s count: %s", counted
                 ? "does" : "does not", device ? "taken as the storage's"
                 : "not taken as the storage's");
        lio_env_close(env);
    }
    return 0;
}

/* Storage that turns slow after many fast reads (a network filesystem's
 * cache dropping the file, say): once the env times only some of its
 * reads, it still takes the slow ones as the storage's within a few. */
static int t_device_later(lfile *f)
{
    slow_src s;
    lio_source src;
    lio_env *env = NULL;
    lio_meta snap;
    lio_error err;
    uint64_t nl = f->idx->nleaves, k, slow_reads = 0;
    const uint64_t fast = 200;
    s.inner = f->src;
    s.fast_left = 1 << 20;
    memset(&src, 0, sizeof src);
    src.ctx = &s;
    src.read = slow_read;
    src.size = slow_size;
    src.align = 1;
    src.counted_reads = 0;
    set_case("device_later/%s", f->label);
    if (nl < fast + 40) {
        fail("%llu leaves: too few for the test", (unsigned long long)nl);
        return 0;
    }
    LIO_OK(lio_env_open(&env, &src, (size_t)4 << 20, 0, &err), &err);
    if (lio_env_snapshot(env, 0, &snap, &err)) {
        fail("snapshot: %s", err.msg);
        lio_env_close(env);
        return 0;
    }
    s.fast_left = (int)fast;     /* one read a leaf from here on */
    /* distinct leaves, each read once: the first `fast` reads fast (past
     * the env's first reads, which are all timed), then slow ones */
    for (k = 0; k < fast + 40; k++) {
        lio_page *pg;
        uint64_t leaf = f->idx->leaf_pgno[k * (nl - 1) / (fast + 40)];
        if (k == fast && lio_env_from_device(env)) {
            /* a busy machine made fast reads late: nothing to decide */
            note("device_later/%s: fast reads taken as the storage's, not "
                 "decided", f->label);
            lio_env_close(env);
            return 0;
        }
        if (k >= fast && lio_env_from_device(env))
            break;
        if (lio_page_get(env, &snap, leaf, LIO_GET_AROUND, &pg, &err)) {
            fail("page %llu: %s", (unsigned long long)leaf, err.msg);
            break;
        }
        lio_page_unpin(env, pg);
        if (k >= fast)
            slow_reads++;
    }
    if (!lio_env_from_device(env) || slow_reads > 12)
        fail("storage slow after %llu fast reads: %s after %llu slow ones "
             "(at most 12 wanted)", (unsigned long long)fast,
             lio_env_from_device(env) ? "taken as the storage's"
                                      : "not taken as the storage's",
             (unsigned long long)slow_reads);
    else
        note("device_later/%s: the storage's after %llu slow reads",
             f->label, (unsigned long long)slow_reads);
    lio_env_close(env);
    return 0;
}

/* Recycled blocks (lio_block_take/give): each holds at least what was
 * asked, writable, and the part asked for is mapped in before it is
 * returned (mincore: resident), on a block recycled larger too; the
 * block returned last that fits is reused.  Mapping ahead is a
 * MADV_POPULATE_WRITE (Linux 5.14): where the kernel refuses it, only
 * the sizes and the reuse are checked, and the note says so. */
static int resident(const uint8_t *p, size_t n, size_t *first_out)
{
    size_t pages = (n + 4095) / 4096;
    unsigned char *vec = malloc(pages ? pages : 1);
    int all = 1;
    if (!vec || mincore((void *)p, pages * 4096, vec)) {
        free(vec);
        return -1;
    }
    for (size_t i = 0; i < pages; i++)
        if (!(vec[i] & 1)) {
            *first_out = i;
            all = 0;
            break;
        }
    free(vec);
    return all;
}

static int t_blocks(lfile *f)
{
    static const size_t sizes[] = {1, 4096, 200000, 1u << 20, 3u << 20,
                                   5u << 20};
    int can_populate;
    void *probe;
    set_case("blocks/%s", f->label);
    probe = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED) {
        fail("mmap: %s", strerror(errno));
        return 0;
    }
    can_populate = madvise(probe, 4096, 23 /* MADV_POPULATE_WRITE */) == 0;
    munmap(probe, 4096);
    if (!can_populate)
        note("blocks/%s: the kernel refuses MADV_POPULATE_WRITE: residency "
             "not checked", f->label);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t need = sizes[i], cap = 0, cap2 = 0, at = 0, more;
        uint8_t *p = lio_block_take(need, &cap), *q;
        int r;
        if (!p || cap < need || ((uintptr_t)p & 4095)) {
            fail("take(%zu): block %p of %zu bytes", need, (void *)p, cap);
            lio_block_give(p, cap);
            continue;
        }
        if (can_populate && (r = resident(p, need, &at)) != 1)
            fail("take(%zu): page %zu of the block not mapped in (%d)",
                 need, at, r);
        memset(p, 0xa5, need);
        lio_block_give(p, cap);
        /* the same block again, asked for more of it than was written */
        more = cap - cap / 8 > need ? cap - cap / 8 : need;
        q = lio_block_take(more, &cap2);
        if (q != p)
            fail("take(%zu) after giving back %p (%zu bytes): %p, not it",
                 more, (void *)p, cap, (void *)q);
        else if (can_populate && (r = resident(q, more, &at)) != 1)
            fail("take(%zu) of a recycled block: page %zu not mapped in "
                 "(%d)", more, at, r);
        if (q)
            memset(q, 0x5a, more);
        lio_block_give(q, cap2);
    }
    return 0;
}

/* ---- values: a cursor's worker reads value runs ahead ------------------- */

/* One forward walk of every record through a cursor that defers values, as
 * the drop-in Cursor does: a pending value starts a batch (the runs of the
 * leaf's next values, lio_cursor_plan_ahead) that the worker reads from the
 * last back while this thread reads the first; the next values are taken
 * from it.  mode 0 takes every value; mode 1 drops every third batch after
 * two values; mode 2 closes the cursor mid-batch after 1000 records.
 * Every value is compared byte by byte. */
static void free_bufs(uint8_t **bufs, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        free(bufs[j]);
        bufs[j] = NULL;
    }
}

#define VREC 3000u
static size_t vsize_big(uint32_t i) { return 2100 + (i * 37u) % 6000; }

static int walk_values(lfile *f, lio_env *env, const lio_meta *snap,
                       int scattered, int mode)
{
    static lio_value_run runs[LIO_AHEAD_MAX + 1];
    static uint8_t *bufs[LIO_AHEAD_MAX + 1];
    lio_cursor *cur;
    lio_error err;
    lio_val k, v;
    size_t at = 0, n = 0, nbufs = 0;
    uint32_t seen = 0;
    int rc, batches = 0;
    set_case("%s/values/mode%d", f->label, mode);
    LIO_OK(lio_cursor_open(&cur, env, snap, &snap->main_db, &err), &err);
    lio_cursor_defer_values(cur, 1);
    rc = lio_cursor_get(cur, &k, &v, LIO_FIRST);
    while (rc == LIO_SUCCESS) {
        char kb[16] = "";
        const uint8_t *got = v.data;
        uint32_t rec;
        if (k.size == KEYLEN)
            memcpy(kb, k.data, KEYLEN);
        rec = (uint32_t)strtoul(kb, NULL, 10);
        if (!got && v.size) {
            uint32_t size;
            uint64_t pgno = lio_cursor_pending(cur, &size);
            if (at < n && runs[at].pgno == pgno && runs[at].size == size) {
                if (lio_cursor_value_ahead(cur, at - 1)) {
                    fail("record %u: the worker's value failed: %s", rec,
                         lio_cursor_error(cur)->msg);
                    break;
                }
                got = bufs[at++];
            } else {
                size_t m;
                if (n)
                    lio_cursor_values_ahead_drop(cur);
                free_bufs(bufs, nbufs);
                n = at = 0;
                m = lio_cursor_plan_ahead(cur, runs, LIO_AHEAD_MAX + 1,
                                          4 * MIB);
                nbufs = m ? m : 1;
                for (size_t j = 0; j < nbufs; j++)
                    if (!(bufs[j] = malloc(j ? runs[j].size : size))) {
                        fail("out of memory");
                        return -1;
                    }
                if (m > 2 && !lio_cursor_values_ahead(
                                 cur, runs + 1, m - 1,
                                 (void *const *)(bufs + 1))) {
                    n = m;
                    at = 1;
                    batches++;
                }
                if (lio_cursor_value_into(cur, bufs[0])) {
                    fail("record %u: %s", rec, lio_cursor_error(cur)->msg);
                    break;
                }
                got = bufs[0];
            }
        }
        if (rec >= VREC || v.size != vsize_big(rec) || !got) {
            fail("record %u (the %uth): a value of %zu bytes", rec, seen,
                 v.size);
            break;
        }
        for (size_t j = 0; j < v.size; j++)
            if (got[j] != vbyte(rec, j)) {
                fail("record %u: byte %zu differs", rec, j);
                goto end;
            }
        seen++;
        if (mode == 1 && n && at == 3 && batches % 3 == 0) {
            lio_cursor_values_ahead_drop(cur);
            n = at = 0;
        }
        if (mode == 2 && seen >= 1000 && at < n)
            break;
        rc = lio_cursor_get(cur, &k, &v, LIO_NEXT);
    }
end:
    if (mode != 2 && (rc != LIO_NOTFOUND || seen != VREC))
        fail("the walk ended after %u records: %d %s", seen, rc,
             lio_cursor_error(cur)->msg);
    if (mode == 2 && scattered && at >= n)
        fail("no batch was half read after 1000 records");
    lio_cursor_close(cur);     /* (mode 2: the worker mid-batch) */
    free_bufs(bufs, nbufs);
    /* runs in file order are read several a request, not by the worker */
    if (scattered ? !batches : batches)
        fail("%d batches went to the worker", batches);
    return 0;
}

/* VREC records of 2100..8099-byte values (one or two overflow pages each,
 * a dozen runs a leaf), in key order in "seq", in a random order in "rnd"
 * (the runs of a leaf all over the file). */
static const uint8_t *big_value(uint32_t i, size_t *size, uint8_t *scratch)
{
    *size = vsize_big(i);
    for (size_t j = 0; j < *size; j++)
        scratch[j] = vbyte(i, j);
    return scratch;
}

static int make_values_file(const char *path, int scattered)
{
    return write_records(path, VREC, scattered, 0x5eed0003, big_value, 8192,
                         0);
}

static int t_values(lfile *f)
{
    char path[300];
    lio_posix *px = NULL;
    lio_source src;
    lio_env *env = NULL;
    lio_meta snap;
    lio_error err;
    alarm(WATCHDOG_SECONDS);
    set_case("%s/values/setup", f->label);
    snprintf(path, sizeof path, "%s/values-%s.mdb", g_base, f->label);
    if (make_values_file(path, f == &g_files[1])) {
        fail("could not write %s", path);
        return -1;
    }
    LIO_OK(lio_posix_open(&px, path, 0, &err), &err);
    lio_posix_get_source(px, &src);
    if (lio_env_open(&env, &src, (size_t)4 << 20, 0, &err) ||
        lio_env_snapshot(env, 0, &snap, &err))
        fail("%s: %s", path, err.msg);
    else
        for (int mode = 0; mode < 3; mode++)
            walk_values(f, env, &snap, f == &g_files[1], mode);
    lio_env_close(env);
    lio_posix_close(px);
    return 0;
}

/* ---- driver ---------------------------------------------------------------------- */

static const struct {
    const char *name;
    int (*fn)(lfile *);
} tests[] = {
    {"whole", t_whole},
    {"begun", t_begun},
    {"stop", t_stop},
    {"stop_thread", t_stop_thread},
    {"fork", t_fork},
    {"device", t_device},
    {"device_later", t_device_later},
    {"blocks", t_blocks},
    {"values", t_values},
};
#define NTESTS (sizeof tests / sizeof *tests)

int main(int argc, char **argv)
{
    int want[NTESTS], any = 0, failed = 0, ran = 0, setup_bad = 0;
    char cmd[300];
    struct sigaction sa;
    double t0 = now(), t;

    for (size_t i = 0, o = 0; i < NTESTS; i++) {
        size_t n = strlen(tests[i].name);
        want[i] = argc < 2;
        for (int a = 1; a < argc; a++)
            if (strncmp(argv[a], tests[i].name, n) == 0 &&
                (argv[a][n] == 0 || argv[a][n] == '/')) {
                want[i] = 1;
                if (argv[a][n] == '/' && o < 8)
                    g_only[o++] = argv[a];
            }
        any |= want[i];
    }
    if (!any) {
        fprintf(stderr, "test_pipeline: no test named (tests: whole begun "
                "stop stop_thread fork device device_later blocks values)\n0/0 "
                "passed\n");
        return 0;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);

    snprintf(g_base, sizeof g_base, "/tmp/lio_pipeline_test.XXXXXX");
    if (!mkdtemp(g_base)) {
        perror("mkdtemp");
        return 2;
    }
    set_case("setup");
    alarm(WATCHDOG_SECONDS);
    if (make_records()) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    g_files[0].label = "seq";
    g_files[1].label = "rnd";
    for (int i = 0; i < 2; i++) {
        snprintf(g_files[i].path, sizeof g_files[i].path, "%s/%s.mdb", g_base,
                 g_files[i].label);
        if (make_file(g_files[i].path, i) || lf_open(&g_files[i]))
            setup_bad = 1;
    }
    fprintf(stderr, "setup: %u records x 2 files, %.1f MB of values  %.2fs\n",
            NREC, (double)g_voff[NREC] / 1e6, now() - t0);
    for (size_t i = 0; !setup_bad && i < NTESTS; i++) {
        if (!want[i])
            continue;
        for (int fi = 0; fi < 2; fi++) {
            lfile *f = &g_files[fi];
            g_failed = 0;
            fprintf(stderr, "%s/%s ...\n", tests[i].name, f->label);
            fflush(stderr);
            t = now();
            tests[i].fn(f);
            ran++;
            if (g_failed) {
                failed++;
                fprintf(stderr, "FAIL %s/%s (%d failures)  %.2fs\n",
                        tests[i].name, f->label, g_failed, now() - t);
            } else {
                fprintf(stderr, "ok   %s/%s  %.2fs\n", tests[i].name,
                        f->label, now() - t);
            }
        }
    }
    alarm(0);
    for (int i = 0; i < 2; i++)
        lf_close(&g_files[i]);
    free(g_vals);
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_base);
    if (!failed && !setup_bad)
        (void)!system(cmd);
    else
        fprintf(stderr, "(left %s for inspection)\n", g_base);
    if (setup_bad) {
        fprintf(stderr, "FAIL setup\n");
        return 1;
    }
    fprintf(stderr, "%d/%d passed  %.2fs\n", ran - failed, ran, now() - t0);
    return failed ? 1 : 0;
}
