/* The record index: ordinal -> leaf in O(log leaves), without walking.
 *
 * LMDB's branch pages hold no subtree counts, so the index is built once
 * per snapshot from the branch levels (few pages) and the leaves' 16-byte
 * headers (whole leaves for DUPSORT trees, whose duplicates count), level
 * by level, each level read in page order through the executor; headers
 * of neighbouring leaves in one request.  Trees of few records per leaf
 * (LIO_RECMAP_PER_LEAF) are read as whole leaves, checked, and each
 * record's place in its leaf is kept (the record map), so that a bulk read
 * of scattered records reads just their bytes.
 *
 * Above the page cache, beside cursors and bulk reads.
 * May call: errors.c, format.c (page and leaf-header checks,
 * lio_leaf_dup_records, lio_grow), plan.c and pager.c (lio_check_extent,
 * lio_env_fits_memory). */
#include <stdlib.h>
#include <unistd.h>

#include "core.h"

/* Whole pages per executor round: 8 MiB, read as 1 MiB requests that the
 * executor spreads over its threads when cached (lio_plan.spread): one
 * core copying every leaf was most of a first start's index build.  Each
 * round ends waiting for its last request: rounds of 2 MiB made a fresh
 * process's build about 15% slower, 16 MiB ones 10% (first-touch faults
 * of their buffer). */
#define CHUNK_BYTES (8u << 20)
/* Branch pages per round: 1 MiB.  A first start reads small's 892 branch
 * pages before its first batch; 3.6 MB of fresh buffer cost it 892 page
 * faults (1.3 ms here), a reused 1 MiB a quarter of them. */
#define BRANCH_CHUNK_BYTES (1u << 20)
#define COUNT_READ_MAX (1u << 20)
#define CHUNK_HEADERS 8192   /* leaf headers per executor round */

typedef struct {
    uint64_t pgno;
    uint64_t pos;    /* position in key order within the level */
} pg_pos;
/* sorted as records of two words by lio_sort_u64 */
typedef char pg_pos_is_two_words[sizeof(pg_pos) == 2 * sizeof(uint64_t)
                                 ? 1 : -1];

/* Record map entries of the leaves scanned so far, in page order. */
typedef struct {
    uint64_t *ent;
    size_t len, cap;
    uint64_t *start;  /* start[pos]: the leaf's first entry in ent */
} map_acc;

static uint64_t map_entry(const uint8_t *p, unsigned i)
{
    uint16_t off = ld16(p + PAGEHDRSZ + 2 * i);
    const uint8_t *nd = p + off;
    if (nd_flags(nd))
        return 0;   /* overflow value or duplicates: read through the leaf */
    return (uint64_t)off | (uint64_t)nd_ksize(nd) << 16 |
           (uint64_t)nd_dsize(nd) << 32;
}

/* The n = pg_numkeys(p) map entries of a leaf whose header was checked,
 * into out[0..n); whether its nodes pass the page checks.  A leaf that
 * fails them gets no entries (zeros): its records are read through the
 * leaf, which raises when a batch needs them, as without a map. */
static int leaf_entries(const uint8_t *p, uint32_t psize, uint64_t pg,
                        uint64_t *out)
{
    unsigned n = pg_numkeys(p);
    lio_error ignored;
    int ok = lio_check_page(p, psize, pg, 0, &ignored) == LIO_SUCCESS;
    for (unsigned i = 0; i < n; i++)
        out[i] = ok ? map_entry(p, i) : 0;
    return ok;
}

uint64_t lio_index_find(const lio_index *idx, uint64_t ord)
{
    /* (acquired: a begun index may be counted further meanwhile, and
     * first[0..n] is written before n is published) */
    uint64_t n = __atomic_load_n(&idx->nleaves, __ATOMIC_ACQUIRE);
    uint64_t lo = 0, hi = n;   /* first[lo] <= ord < first[hi] */
    /* Leaves hold similar numbers of records: start where an even spread
     * puts ord and widen from there, a few probes where a plain binary
     * search over a large index misses the cache a dozen times. */
    if (n > 64) {
        uint64_t base = idx->first[0];
        uint64_t g = (uint64_t)((double)(ord - base) /
                                (double)(idx->first[n] - base) * (double)n);
        uint64_t step = 1;
        if (g >= n)
            g = n - 1;
        if (idx->first[g] <= ord) {
            lo = g;
            while (lo + step < n && idx->first[lo + step] <= ord) {
                lo += step;
                step *= 2;
            }
            hi = lo + step < n ? lo + step : n;
        } else {
            hi = g;
            while (hi >= step && idx->first[hi - step] > ord) {
                hi -= step;
                step *= 2;
            }
            lo = hi >= step ? hi - step : 0;
        }
    }
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (idx->first[mid] <= ord)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

void lio_index_free(lio_index *idx)
{
    if (!idx)
        return;
    free(idx->leaf_pgno);
    free(idx->first);
    free(idx->recmap);
    free(idx->leafmem);
    free(idx->leaf_ok);
    free(idx->built_map);
    pthread_mutex_destroy(&idx->grow);
    free(idx);
}

int lio_check_index_leaf(const uint8_t *p, uint32_t psize, uint64_t pg,
                         uint64_t want, int dupsort, lio_error *err)
{
    uint64_t have;
    int rc;
    if ((rc = lio_check_leaf_header(p, psize, pg, err)) ||
        (rc = lio_check_page(p, psize, pg, 0, err)))
        return rc;
    if (dupsort) {
        if ((rc = lio_leaf_dup_records(p, psize, pg, &have, err)))
            return rc;
    } else {
        have = pg_numkeys(p);
    }
    if (have != want)
        return lio_fail(err, LIO_CORRUPTED, pg,
                        "page %llu holds %llu records where the index says "
                        "%llu (a stale index, or the file changed)",
                        (unsigned long long)pg, (unsigned long long)have,
                        (unsigned long long)want);
    return LIO_SUCCESS;
}

#define LOAD_CHUNK 2048      /* leaves per executor round */

int lio_index_load_leaves(lio_index *idx, lio_env *env, const lio_dbrec *db,
                          const lio_executor *ex)
{
    uint64_t n = idx->nleaves, psize = env->psize, *order;
    uint8_t *mem = NULL, *ok;
    lio_plan plan;
    lio_error err;
    int dupsort = (db->flags & LIO_DUPSORT) != 0, rc = 0;
    if (idx->leafmem || n == 0 || n > SIZE_MAX / psize)
        return idx->leafmem != NULL;
    if (posix_memalign((void **)&mem, 4096, n * psize))
        return 0;
    ok = calloc(n, 1);
    order = malloc(2 * n * sizeof *order);
    if (!ok || !order) {
        free(mem);
        free(ok);
        free(order);
        return 0;
    }
    /* in page order, in rounds of LOAD_CHUNK leaves */
    for (uint64_t i = 0; i < n; i++) {
        order[2 * i] = idx->leaf_pgno[i];
        order[2 * i + 1] = i;
    }
    lio_sort_u64(order, n, 2);
    lio_plan_init(&plan, 0, 8u << 20);
    for (uint64_t lo = 0; lo < n && rc == 0; lo += LOAD_CHUNK) {
        uint64_t hi = lo + LOAD_CHUNK < n ? lo + LOAD_CHUNK : n;
        lio_plan_reset(&plan);
        for (uint64_t j = lo; j < hi && rc == 0; j++) {
            uint64_t pg = order[2 * j], i = order[2 * j + 1];
            if (lio_check_extent(env, pg * psize, psize, pg, &err))
                continue;   /* past the end: left out */
            if (lio_plan_add(&plan, pg * psize, mem + i * psize, psize))
                rc = 1;
            ok[i] = 1;
        }
        if (rc == 0 && plan.nreads && ex->run(ex->ctx, &plan, &err))
            rc = 1;
        for (uint64_t j = lo; j < hi && rc == 0; j++) {
            uint64_t pg = order[2 * j], i = order[2 * j + 1];
            if (ok[i])
                ok[i] = lio_check_index_leaf(mem + i * psize, (uint32_t)psize,
                                             pg, idx->first[i + 1] -
                                             idx->first[i], dupsort,
                                             &err) == LIO_SUCCESS;
        }
    }
    lio_plan_free(&plan);
    free(order);
    if (rc) {
        free(mem);
        free(ok);
        return 0;
    }
    idx->leafmem = mem;
    idx->leaf_ok = ok;
    return 1;
}

int lio_index_set_map(lio_index *idx, uint32_t psize, uint64_t *map,
                      uint64_t n, lio_error *err)
{
    uint64_t lo = idx->first[0], total = idx->first[idx->nleaves];
    if (n != total - lo) {
        free(map);
        return lio_fail(err, LIO_CORRUPTED, LIO_NO_PAGE,
                        "the record map has %llu entries for %llu records",
                        (unsigned long long)n,
                        (unsigned long long)(total - lo));
    }
    for (uint64_t leaf = 0; leaf < idx->nleaves; leaf++) {
        for (uint64_t ord = idx->first[leaf]; ord < idx->first[leaf + 1];
             ord++) {
            uint64_t e = map[ord - lo];
            uint64_t off = e & 0xffff, ks = (e >> 16) & 0xffff, vs = e >> 32;
            if (e == 0)
                continue;
            /* a node's header and key and value inside its page, past the
             * page header and the first node pointer */
            if (off < PAGEHDRSZ + 2 || (off & 1) ||
                off + NODEHDRSZ + ks + vs > psize) {
                unsigned long long pg = idx->leaf_pgno[leaf];
                free(map);
                return lio_fail(err, LIO_CORRUPTED, pg,
                                "page %llu: the record map puts record %llu "
                                "(node at %llu, key %llu bytes, value %llu "
                                "bytes) outside the %u-byte page", pg,
                                (unsigned long long)ord,
                                (unsigned long long)off,
                                (unsigned long long)ks,
                                (unsigned long long)vs, psize);
            }
        }
    }
    free(idx->recmap);
    idx->recmap = map;
    return LIO_SUCCESS;
}

int lio_index_adopt(lio_index **out, const lio_meta *snap,
                    const lio_dbrec *db, uint64_t nleaves, uint64_t *leaf_pgno,
                    uint64_t *first, int partial, lio_error *err)
{
    lio_index *idx = calloc(1, sizeof *idx);
    *out = NULL;
    if (!idx) {
        free(leaf_pgno);
        free(first);
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    }
    pthread_mutex_init(&idx->grow, NULL);
    idx->grow_pid = getpid();
    idx->txnid = snap->txnid;
    idx->root = db->root;
    idx->nleaves = nleaves;
    idx->leaf_pgno = leaf_pgno;
    idx->first = first;
    for (uint64_t i = 0; i < nleaves; i++) {
        if (first[i + 1] <= first[i] || leaf_pgno[i] < 2 ||
            leaf_pgno[i] > snap->last_pg) {
            lio_index_free(idx);
            return lio_fail(err, LIO_CORRUPTED, LIO_NO_PAGE,
                            "record index entry %llu is inconsistent",
                            (unsigned long long)i);
        }
    }
    if (partial) {
        /* a run of leaves from the first or to the last */
        if ((first[0] != 0 && first[nleaves] != db->entries) ||
            first[nleaves] > db->entries) {
            lio_index_free(idx);
            return lio_fail(err, LIO_CORRUPTED, db->root,
                            "page %llu: a partial record index covers "
                            "records %llu..%llu of %llu",
                            (unsigned long long)db->root,
                            (unsigned long long)first[0],
                            (unsigned long long)first[nleaves],
                            (unsigned long long)db->entries);
        }
    } else if (first[0] != 0 || first[nleaves] != db->entries) {
        unsigned long long counted = first[nleaves];
        lio_index_free(idx);
        return lio_fail(err, LIO_CORRUPTED, db->root,
                        "page %llu: the tree holds %llu records, its database "
                        "record says %llu", (unsigned long long)db->root,
                        counted, (unsigned long long)db->entries);
    }
    *out = idx;
    return LIO_SUCCESS;
}

/* A page of one level of the tree, the level's pages in page order (prev:
 * the one before, NULL for the first): reached once, inside the snapshot. */
static int check_level_page(const uint64_t *prev, uint64_t pg,
                            const lio_meta *snap, lio_error *err)
{
    if (prev && *prev == pg)
        return lio_fail(err, LIO_CORRUPTED, pg,
                        "page %llu is reached twice from the branch pages",
                        (unsigned long long)pg);
    if (pg < 2 || pg > snap->last_pg)
        return lio_fail(err, pg < 2 ? LIO_CORRUPTED : LIO_PAGE_NOTFOUND, pg,
                        "page %llu: a branch points %s",
                        (unsigned long long)pg, pg < 2 ? "at a meta page"
                        : "past the snapshot's last page");
    return LIO_SUCCESS;
}

/* The records of a leaf read for counting (its header only, unless
 * DUPSORT: the whole page, whose duplicates count). */
static int count_leaf(const uint8_t *p, uint32_t psize, uint64_t pg,
                      int dupsort, uint64_t *count, lio_error *err)
{
    int rc;
    if (!dupsort) {
        if ((rc = lio_check_leaf_header(p, psize, pg, err)))
            return rc;
        *count = pg_numkeys(p);
        return LIO_SUCCESS;
    }
    if (pg_pgno(p) != pg)
        return lio_fail(err, LIO_CORRUPTED, pg,
                        "page %llu carries page number %llu in its header",
                        (unsigned long long)pg,
                        (unsigned long long)pg_pgno(p));
    if ((rc = lio_check_page(p, psize, pg, 0, err)))
        return rc;
    if (!(pg_flags(p) & P_LEAF) || (pg_flags(p) & P_LEAF2))
        return lio_fail(err, LIO_CORRUPTED, pg,
                        "page %llu: a %s page where the tree's depth puts a "
                        "leaf", (unsigned long long)pg,
                        (pg_flags(p) & P_LEAF) ? "leaf" : "branch");
    return lio_leaf_dup_records(p, psize, pg, count, err);
}

/* A round of leaves being read, and what is done with each read as it
 * lands (leaf_read_done): counted, checked and mapped by the thread that
 * copied it, while the pages sit in that core's cache, and on every core
 * the executor uses.  One core copying a round and then counting all of
 * it, the pages copied by another core, took most of an index build over
 * a cached file. */
typedef struct {
    const uint8_t *buf;
    size_t sz;               /* bytes of each page in buf */
    const pg_pos *order;     /* the round's pages, in page order */
    size_t *read_first;      /* read r holds pages read_first[r] to
                              * read_first[r + 1] - 1 */
    uint8_t *handled;        /* read r was handled (by the hook, or after) */
    size_t *failed_at;       /* read r: 1 + its page that failed, or 0 */
    uint32_t psize;
    int dupsort;
    uint64_t *counts;
    map_acc *acc;            /* NULL: no record map */
    size_t ent_used;         /* map entries given out past acc->len
                              * (atomic) */
} counting_round;

static void leaf_read_done(void *ctx, size_t r)
{
    counting_round *lr = ctx;
    size_t j0 = lr->read_first[r], j1 = lr->read_first[r + 1], j;
    uint64_t nent = 0, at;
    lio_error ignored;
    for (j = j0; j < j1; j++) {
        uint64_t *count = &lr->counts[lr->order[j].pos];
        if (count_leaf(lr->buf + j * lr->sz, lr->psize, lr->order[j].pgno,
                       lr->dupsort, count, &ignored) != LIO_SUCCESS) {
            lr->failed_at[r] = j + 1;   /* its error is made again, after */
            break;
        }
        nent += *count;
    }
    if (lr->acc && j > j0) {
        map_acc *acc = lr->acc;
        at = acc->len + __atomic_fetch_add(&lr->ent_used, nent,
                                           __ATOMIC_RELAXED);
        for (size_t k = j0; k < j; k++) {
            uint64_t pos = lr->order[k].pos;
            acc->start[pos] = at;
            leaf_entries(lr->buf + k * lr->sz, lr->psize, lr->order[k].pgno,
                         acc->ent + at);
            at += lr->counts[pos];
        }
    }
    lr->handled[r] = 1;
}

/* Read a planned round of cn leaves (order[0..cn), read_first filled by
 * the planning) and count, check and map them: through the executor's
 * threads where it calls the plan's hook, here for the reads it did not.
 * The round's first damaged leaf in page order fails it, with the error a
 * count in page order meets. */
static int read_leaf_round(counting_round *lr, const pg_pos *order,
                           uint64_t cn, const lio_executor *ex,
                           lio_plan *plan, lio_error *err)
{
    size_t nr = plan->nreads;
    int rc;
    lr->order = order;
    lr->read_first[nr] = cn;
    memset(lr->handled, 0, nr);
    memset(lr->failed_at, 0, nr * sizeof *lr->failed_at);
    lr->ent_used = 0;
    /* Room for the round's map entries before any is written: at most
     * (psize - header) / 2 records a leaf whose header passes its check. */
    if (lr->acc && lio_grow((void **)&lr->acc->ent, &lr->acc->cap,
                            lr->acc->len + cn * ((lr->psize - PAGEHDRSZ) / 2),
                            sizeof *lr->acc->ent))
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    plan->done = leaf_read_done;
    plan->done_ctx = lr;
    rc = ex->run(ex->ctx, plan, err);
    plan->done = NULL;
    if (rc)
        return rc;
    for (size_t r = 0; r < nr; r++)
        if (!lr->handled[r])
            leaf_read_done(lr, r);
    if (lr->acc)
        lr->acc->len += lr->ent_used;
    for (size_t r = 0; r < nr; r++)
        if (lr->failed_at[r]) {
            size_t j = lr->failed_at[r] - 1;
            uint64_t ignored;
            rc = count_leaf(lr->buf + j * lr->sz, lr->psize, order[j].pgno,
                            lr->dupsort, &ignored, err);
            /* (the hook saw it fail: it fails the same way again) */
            return rc ? rc : lio_fail(err, LIO_CORRUPTED, order[j].pgno,
                                      "page %llu changed while it was read",
                                      (unsigned long long)order[j].pgno);
        }
    return LIO_SUCCESS;
}

/* Ask for the regions where a branch level's pages are dense (ra's rule).
 * Where keys are long a branch page holds few of them, and an appended
 * tree has one every few leaves: 150k records with 480-byte keys, a tree
 * of depth 7, put 4.7k branch pages over 43k, which a cold first start read
 * a request each (10k device requests where a later start made 240).  The
 * rest of such a region is leaves that the build, or the epoch it begins,
 * reads next: only where the OS can keep the file until then. */
static void advise_level(lio_env *env, const lio_meta *snap,
                         const lio_executor *ex, const lio_readahead *ra,
                         const pg_pos *order, uint64_t n)
{
    uint64_t *pages, reg;
    size_t at = 0;
    if (!ra || !ra->region || !ex->advise || n < ra->min_pages ||
        !lio_env_fits_memory(env, snap))
        return;
    if (!(pages = malloc(n * sizeof *pages)))
        return;   /* advice is optional */
    for (uint64_t i = 0; i < n; i++)
        pages[i] = order[i].pgno;
    while (lio_next_dense_region(ra, env->psize, pages, n, &at, &reg))
        ex->advise(ex->ctx, reg * ra->region, ra->region,
                   LIO_ADVISE_WILLNEED);
    free(pages);
}

/* Read one level's pages (headers only where hdr_only) and collect either
 * the children (branch level) or the record counts (leaf level). */
static int scan_level(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                      const lio_executor *ex, const lio_readahead *ra,
                      lio_plan *plan,
                      const uint64_t *level, uint64_t n, int leaf_level,
                      size_t leaf_round, uint64_t **next_out,
                      uint64_t *next_n, uint64_t *counts, map_acc *acc,
                      lio_error *err)
{
    int dupsort = (db->flags & LIO_DUPSORT) != 0;
    int hdr_only = leaf_level && !dupsort && !acc;
    size_t sz = hdr_only ? PAGEHDRSZ : env->psize;
    size_t bytes = !leaf_level ? BRANCH_CHUNK_BYTES
                   : leaf_round ? leaf_round : CHUNK_BYTES;
    size_t chunk = hdr_only ? CHUNK_HEADERS
                            : (bytes / env->psize ? bytes / env->psize : 1);
    pg_pos *order = malloc(n * sizeof *order);
    uint32_t *nkeys = NULL;
    uint8_t *buf = NULL;
    counting_round lr = {0};
    uint64_t *kids = NULL; /* (pos, index) -> child, placed after the scan */
    uint64_t *kid_pos = NULL, nkids = 0, kids_cap = 0;
    int rc = LIO_SUCCESS;

    if (!order)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        order[i].pgno = level[i];
        order[i].pos = i;
    }
    /* (pg_pos is two words, the page number first: the radix sort) */
    lio_sort_u64((uint64_t *)order, n, 2);
    for (uint64_t i = 0; i < n; i++)
        if ((rc = check_level_page(i ? &order[i - 1].pgno : NULL,
                                   order[i].pgno, snap, err)))
            goto out;
    if (!leaf_level)
        advise_level(env, snap, ex, ra, order, n);
    if (!leaf_level && !(nkeys = calloc(n, sizeof *nkeys))) {
        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        goto out;
    }
    if (chunk > n)
        chunk = n ? n : 1;
    if (posix_memalign((void **)&buf, 4096, chunk * sz)) {
        buf = NULL;
        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        goto out;
    }
    if (leaf_level) {
        lr.buf = buf;
        lr.sz = sz;
        lr.read_first = malloc((chunk + 1) * sizeof *lr.read_first);
        lr.handled = malloc(chunk);
        lr.failed_at = malloc(chunk * sizeof *lr.failed_at);
        lr.psize = env->psize;
        lr.dupsort = dupsort;
        lr.counts = counts;
        lr.acc = acc;
        if (!lr.read_first || !lr.handled || !lr.failed_at) {
            rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
            goto out;
        }
    }
    for (uint64_t c0 = 0; c0 < n; c0 += chunk) {
        uint64_t cn = n - c0 < chunk ? n - c0 : chunk;
        lio_plan_reset(plan);
        for (uint64_t j = 0; j < cn; j++) {
            uint64_t pg = order[c0 + j].pgno;
            size_t reads = plan->nreads;
            if ((rc = lio_check_extent(env, pg * env->psize, sz, pg, err)))
                goto out;
            if ((rc = lio_plan_add(plan, pg * env->psize, buf + j * sz, sz))) {
                rc = lio_fail(err, rc, pg, "cannot plan the read of page %llu",
                              (unsigned long long)pg);
                goto out;
            }
            if (leaf_level && plan->nreads > reads)
                lr.read_first[reads] = j;
        }
        if (leaf_level) {
            if ((rc = read_leaf_round(&lr, order + c0, cn, ex, plan, err)))
                goto out;
            continue;
        }
        if ((rc = ex->run(ex->ctx, plan, err)))
            goto out;
        for (uint64_t j = 0; j < cn; j++) {
            const uint8_t *p = buf + j * sz;
            uint64_t pg = order[c0 + j].pgno, pos = order[c0 + j].pos;
            if (pg_pgno(p) != pg) {
                rc = lio_fail(err, LIO_CORRUPTED, pg,
                              "page %llu carries page number %llu in its "
                              "header", (unsigned long long)pg,
                              (unsigned long long)pg_pgno(p));
                goto out;
            }
            if ((rc = lio_check_page(p, env->psize, pg, 0, err)))
                goto out;
            if ((pg_flags(p) & P_LEAF) || (pg_flags(p) & P_LEAF2)) {
                rc = lio_fail(err, LIO_CORRUPTED, pg,
                              "page %llu: a %s page where the tree's depth "
                              "puts a branch", (unsigned long long)pg,
                              (pg_flags(p) & P_LEAF) ? "leaf" : "branch");
                goto out;
            }
            nkeys[pos] = pg_numkeys(p);
            for (unsigned k = 0; k < nkeys[pos]; k++) {
                if (nkids + 1 > kids_cap) {
                    uint64_t ncap = kids_cap ? kids_cap * 2 : 1024;
                    uint64_t *a = realloc(kids, ncap * sizeof *a);
                    uint64_t *b = a ? realloc(kid_pos, ncap * sizeof *b) : NULL;
                    if (a)
                        kids = a;
                    if (!b) {
                        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE,
                                      "out of memory");
                        goto out;
                    }
                    kid_pos = b;
                    kids_cap = ncap;
                }
                kids[nkids] = nd_child(pg_node(p, k));
                kid_pos[nkids] = pos;
                nkids++;
            }
        }
    }
    if (!leaf_level) {
        /* Children in key order: parents in level order, then node order. */
        uint64_t *start = malloc((n + 1) * sizeof *start), *next;
        if (!start) {
            rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
            goto out;
        }
        start[0] = 0;
        for (uint64_t i = 0; i < n; i++)
            start[i + 1] = start[i] + nkeys[i];
        next = malloc((nkids ? nkids : 1) * sizeof *next);
        if (!next) {
            free(start);
            rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
            goto out;
        }
        for (uint64_t i = 0; i < nkids; i++)
            next[start[kid_pos[i]]++] = kids[i];
        free(start);
        *next_out = next;
        *next_n = nkids;
    }
out:
    plan->done = NULL;
    free(order);
    free(nkeys);
    free(buf);
    free(kids);
    free(kid_pos);
    free(lr.read_first);
    free(lr.handled);
    free(lr.failed_at);
    return rc;
}

static int branch_levels(lio_env *env, const lio_meta *snap,
                         const lio_dbrec *db, const lio_executor *ex,
                         const lio_readahead *ra, uint64_t **leaves,
                         uint64_t *nleaves, lio_error *err)
{
    uint64_t *level, n = 1;
    lio_plan plan;
    int rc = LIO_SUCCESS;

    *leaves = NULL;
    *nleaves = 0;
    if (db->root == LIO_EMPTY_ROOT)
        return LIO_SUCCESS;
    if (db->depth == 0 || db->depth > LIO_MAX_DEPTH)
        return lio_fail(err, LIO_CORRUPTED, db->root,
                        "page %llu: tree has impossible depth %u",
                        (unsigned long long)db->root, db->depth);
    level = malloc(sizeof *level);
    if (!level)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    level[0] = db->root;
    lio_plan_init(&plan, 0, 8u << 20);
    for (unsigned d = 0; d + 1 < db->depth; d++) {
        uint64_t *next = NULL, next_n = 0;
        if (n > snap->last_pg) {
            rc = lio_fail(err, LIO_CORRUPTED, db->root,
                          "page %llu: level %u of the tree has %llu pages, "
                          "more than the file", (unsigned long long)db->root,
                          d, (unsigned long long)n);
            break;
        }
        rc = scan_level(env, snap, db, ex, ra, &plan, level, n, 0, 0, &next,
                        &next_n, NULL, NULL, err);
        if (rc)
            break;
        free(level);
        level = next;
        n = next_n;
    }
    lio_plan_free(&plan);
    if (rc == LIO_SUCCESS && n > snap->last_pg)
        rc = lio_fail(err, LIO_CORRUPTED, db->root,
                      "page %llu: the tree has %llu leaves, more than the "
                      "file's pages", (unsigned long long)db->root,
                      (unsigned long long)n);
    if (rc) {
        free(level);
        return rc;
    }
    *leaves = level;
    *nleaves = n;
    return LIO_SUCCESS;
}

int lio_index_leaves(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                     const lio_executor *ex, uint64_t **leaves,
                     uint64_t *nleaves, lio_error *err)
{
    return branch_levels(env, snap, db, ex, NULL, leaves, nleaves, err);
}

static int count_leaves(lio_env *env, const lio_meta *snap,
                        const lio_dbrec *db, const lio_executor *ex,
                        const uint64_t *leaves, uint64_t n, size_t round,
                        uint64_t *counts, map_acc *acc, lio_error *err)
{
    lio_plan plan;
    int rc;
    if (n == 0)
        return LIO_SUCCESS;
    /* Leaf headers sit a page apart: reading the rest of each page (into
     * the plan's sink) along with the headers turns one request per leaf
     * into one per run of leaves, at most 1 MiB a request (a few branch
     * pages in between are read over too).  200k leaves hot: 2 us a
     * request against about 0.3 us to copy a page.  Cached runs are
     * copied by the executor's threads together (plan.spread), each
     * counting what it copied (read_leaf_round). */
    lio_plan_init(&plan, (db->flags & LIO_DUPSORT) ? 0 : 4 * (size_t)env->psize,
                  COUNT_READ_MAX);
    plan.spread = 1;
    rc = scan_level(env, snap, db, ex, NULL, &plan, leaves, n, 1, round, NULL,
                    NULL, counts, acc, err);
    lio_plan_free(&plan);
    return rc;
}

int lio_index_count(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                    const lio_executor *ex, const uint64_t *leaves,
                    uint64_t n, uint64_t *counts, lio_error *err)
{
    return count_leaves(env, snap, db, ex, leaves, n, 0, counts, NULL, err);
}

int lio_index_build(lio_index **out, lio_env *env, const lio_meta *snap,
                    const lio_dbrec *db, const lio_executor *ex,
                    const lio_readahead *ra, lio_error *err)
{
    return lio_index_build_rounds(out, env, snap, db, ex, ra, 0, err);
}

int lio_index_build_rounds(lio_index **out, lio_env *env,
                           const lio_meta *snap, const lio_dbrec *db,
                           const lio_executor *ex, const lio_readahead *ra,
                           size_t round_bytes, lio_error *err)
{
    uint64_t *leaves, n, *counts = NULL, *first, *map = NULL;
    map_acc acc = {NULL, 0, 0, NULL}, *accp = NULL;
    int rc;

    *out = NULL;
    if ((rc = branch_levels(env, snap, db, ex, ra, &leaves, &n, err)))
        return rc;
    counts = malloc((n ? n : 1) * sizeof *counts);
    first = malloc((n + 1) * sizeof *first);
    if (!counts || !first) {
        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        goto fail;
    }
    /* Few records per leaf (by the database record's count, checked once
     * the leaves are counted): read whole leaves and map their records. */
    if (!(db->flags & LIO_DUPSORT) && n &&
        db->entries <= (uint64_t)LIO_RECMAP_PER_LEAF * n) {
        if (!(acc.start = malloc(n * sizeof *acc.start))) {
            rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
            goto fail;
        }
        accp = &acc;
    }
    if ((rc = count_leaves(env, snap, db, ex, leaves, n, round_bytes, counts,
                           accp, err)))
        goto fail;
    first[0] = 0;
    for (uint64_t i = 0; i < n; i++)
        first[i + 1] = first[i] + counts[i];
    if (accp) {   /* entries from page order to key order */
        if (!(map = malloc((first[n] ? first[n] : 1) * sizeof *map))) {
            rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
            goto fail;
        }
        for (uint64_t i = 0; i < n; i++)
            memcpy(map + first[i], acc.ent + acc.start[i],
                   counts[i] * sizeof *map);
        free(acc.ent);
        free(acc.start);
        acc.ent = acc.start = NULL;
    }
    free(counts);
    rc = lio_index_adopt(out, snap, db, n, leaves, first, 0, err);
    if (rc == LIO_SUCCESS) {
        (*out)->pages_read = n;
        if (map && (rc = lio_index_set_map(*out, env->psize, map, first[n],
                                           err))) {
            lio_index_free(*out);
            *out = NULL;
        }
    } else {
        free(map);
    }
    return rc;
fail:
    free(leaves);
    free(counts);
    free(first);
    free(acc.ent);
    free(acc.start);
    return rc;
}

int lio_index_build_part(lio_index **out, lio_env *env, const lio_meta *snap,
                         const lio_dbrec *db, const lio_executor *ex,
                         int from_end, uint64_t need, lio_error *err)
{
    uint64_t *leaves, n, *counts = NULL, *first = NULL, *part = NULL;
    uint64_t covered = 0, counted = 0, lo = 0, hi = 0, m;
    int rc;

    *out = NULL;
    if ((rc = lio_index_leaves(env, snap, db, ex, &leaves, &n, err)))
        return rc;
    counts = malloc((n ? n : 1) * sizeof *counts);
    if (!counts) {
        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        goto out;
    }
    /* Count leaves a chunk at a time from the chosen end until they hold
     * `need` records, then keep just the leaves that do. */
    if (from_end) {
        lo = hi = n;
        while (lo > 0 && covered < need) {
            uint64_t c0 = lo > CHUNK_HEADERS ? lo - CHUNK_HEADERS : 0;
            if ((rc = lio_index_count(env, snap, db, ex, leaves + c0, lo - c0,
                                      counts + c0, err)))
                goto out;
            counted += lo - c0;
            for (uint64_t i = lo; i-- > c0 && covered < need;) {
                covered += counts[i];
                lo = i;
            }
            if (covered < need)
                lo = c0;
        }
    } else {
        lo = hi = 0;
        while (hi < n && covered < need) {
            uint64_t c1 = n - hi > CHUNK_HEADERS ? hi + CHUNK_HEADERS : n;
            if ((rc = lio_index_count(env, snap, db, ex, leaves + hi, c1 - hi,
                                      counts + hi, err)))
                goto out;
            counted += c1 - hi;
            for (uint64_t i = hi; i < c1 && covered < need; i++) {
                covered += counts[i];
                hi = i + 1;
            }
            if (covered < need)
                hi = c1;
        }
    }
    if (covered > db->entries) {
        rc = lio_fail(err, LIO_CORRUPTED, db->root,
                      "page %llu: the tree's leaves hold more records (%llu) "
                      "than its database record says (%llu)",
                      (unsigned long long)db->root,
                      (unsigned long long)covered,
                      (unsigned long long)db->entries);
        goto out;
    }
    m = hi - lo;
    part = malloc((m ? m : 1) * sizeof *part);
    first = malloc((m + 1) * sizeof *first);
    if (!part || !first) {
        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        goto out;
    }
    if (m)
        memcpy(part, leaves + lo, m * sizeof *part);
    /* Ordinals count from the first record: a run that ends at the last
     * leaf starts at the record count minus what it holds. */
    first[0] = from_end ? db->entries - covered : 0;
    for (uint64_t i = 0; i < m; i++)
        first[i + 1] = first[i] + counts[lo + i];
    rc = lio_index_adopt(out, snap, db, m, part, first, 1, err);
    part = first = NULL;   /* adopted, or freed by adopt */
    if (rc == LIO_SUCCESS)
        (*out)->pages_read = counted;
out:
    free(leaves);
    free(counts);
    free(part);
    free(first);
    return rc;
}

/* What a build's leaf scan checks of the leaf list as a whole, before any
 * leaf is read: every leaf reached once, inside the snapshot, the failure
 * named as a scan in page order meets it (the lowest page below 2, else
 * the lowest reached twice, else the lowest past the snapshot).  With a
 * bitmap of the snapshot's pages where that is no larger than a sorted
 * copy of the list (a first start sorted small's 100k leaves for this:
 * 1-2 ms of its open), else with the sorted copy. */
static int check_leaf_list(const uint64_t *leaves, uint64_t n,
                           const lio_meta *snap, lio_error *err)
{
    uint64_t low = UINT64_MAX, twice = UINT64_MAX, past = UINT64_MAX;
    uint64_t *sorted;
    uint8_t *seen;
    int rc = LIO_SUCCESS;
    if (n == 0)
        return LIO_SUCCESS;   /* (an empty tree has no leaf list) */
    if (snap->last_pg / 64 > n) {
        if (!(sorted = malloc(n * sizeof *sorted)))
            return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        memcpy(sorted, leaves, n * sizeof *sorted);
        lio_sort_u64(sorted, n, 1);
        for (uint64_t i = 0; i < n && rc == LIO_SUCCESS; i++)
            rc = check_level_page(i ? &sorted[i - 1] : NULL, sorted[i], snap,
                                  err);
        free(sorted);
        return rc;
    }
    if (!(seen = calloc(snap->last_pg / 8 + 1, 1)))
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        uint64_t pg = leaves[i];
        if (pg < 2 || pg > snap->last_pg) {
            if (pg < 2 && pg < low)
                low = pg;
            else if (pg > snap->last_pg && pg < past)
                past = pg;
        } else if (seen[pg / 8] & (1u << (pg % 8))) {
            if (pg < twice)
                twice = pg;
        } else {
            seen[pg / 8] |= (uint8_t)(1u << (pg % 8));
        }
    }
    free(seen);
    if (low != UINT64_MAX)
        return check_level_page(NULL, low, snap, err);
    if (twice != UINT64_MAX)
        return check_level_page(&twice, twice, snap, err);
    if (past != UINT64_MAX)
        return check_level_page(NULL, past, snap, err);
    return LIO_SUCCESS;
}

int lio_index_begin(lio_index **out, lio_env *env, const lio_meta *snap,
                    const lio_dbrec *db, const lio_executor *ex,
                    const lio_readahead *ra, lio_error *err)
{
    uint64_t *leaves, n, *first;
    lio_index *idx;
    int rc;

    *out = NULL;
    if ((rc = branch_levels(env, snap, db, ex, ra, &leaves, &n, err)))
        return rc;
    first = malloc((n + 1) * sizeof *first);
    idx = calloc(1, sizeof *idx);
    if (!first || !idx) {
        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        goto fail;
    }
    pthread_mutex_init(&idx->grow, NULL);
    idx->grow_pid = getpid();
    if ((rc = check_leaf_list(leaves, n, snap, err)))
        goto fail;
    first[0] = 0;
    if (n == 0) {   /* an empty tree: whole already */
        free(idx);
        return lio_index_adopt(out, snap, db, 0, leaves, first, 0, err);
    }
    idx->txnid = snap->txnid;
    idx->root = db->root;
    idx->leaf_pgno = leaves;
    idx->first = first;
    idx->nleaves = 0;
    idx->tree_leaves = n;
    idx->mapping = !(db->flags & LIO_DUPSORT) &&
                   db->entries <= (uint64_t)LIO_RECMAP_PER_LEAF * n;
    if (idx->mapping) {   /* entries <= 8 a leaf: a bounded allocation */
        idx->built_map = calloc(db->entries ? db->entries : 1,
                                sizeof *idx->built_map);
        if (!idx->built_map) {
            rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
            goto fail;
        }
    }
    *out = idx;
    return LIO_SUCCESS;
fail:
    free(leaves);
    free(first);
    free(idx);
    return rc;
}

int lio_index_pending(const lio_index *idx)
{
    return idx->tree_leaves >
           __atomic_load_n(&idx->nleaves, __ATOMIC_ACQUIRE);
}

int lio_index_holds(const lio_index *idx, uint64_t ord)
{
    return ord < idx->first[__atomic_load_n(&idx->nleaves, __ATOMIC_ACQUIRE)];
}

int lio_index_count_more(lio_index *idx, uint32_t psize, const lio_dbrec *db,
                         const uint8_t *pages, uint64_t k, uint64_t need,
                         uint8_t *checked, lio_error *err)
{
    uint64_t n = idx->nleaves, n0 = n;
    int dupsort = (db->flags & LIO_DUPSORT) != 0, rc = LIO_SUCCESS;
    if (k > idx->tree_leaves - n)
        k = idx->tree_leaves - n;
    for (uint64_t j = 0; j < k; j++, n++) {
        const uint8_t *p = pages + j * psize;
        uint64_t pg = idx->leaf_pgno[n], count;
        if ((rc = count_leaf(p, psize, pg, dupsort, &count, err)))
            break;
        if (count == 0)
            rc = lio_fail(err, LIO_CORRUPTED, pg, "page %llu: an empty leaf "
                          "in a tree", (unsigned long long)pg);
        else if (idx->first[n] + count > db->entries)
            rc = lio_fail(err, LIO_CORRUPTED, db->root,
                          "page %llu: the tree's leaves hold more records "
                          "(%llu) than its database record says (%llu)",
                          (unsigned long long)db->root,
                          (unsigned long long)(idx->first[n] + count),
                          (unsigned long long)db->entries);
        if (rc)
            break;
        idx->first[n + 1] = idx->first[n] + count;
        idx->pages_read++;
        if (idx->mapping) {   /* (count = its pg_numkeys: not DUPSORT) */
            int ok = leaf_entries(p, psize, pg, idx->built_map + idx->first[n]);
            if (checked)
                checked[j] = (uint8_t)ok;
        }
    }
    if (!rc && n == idx->tree_leaves && n > n0 &&
        idx->first[n] != db->entries) {
        /* The last leaf fails the whole tree's check: it stays uncounted
         * (the index pending, never saved), so every read of its records
         * fails as this one does. */
        rc = lio_fail(err, LIO_CORRUPTED, db->root,
                      "page %llu: the tree holds %llu records, its database "
                      "record says %llu", (unsigned long long)db->root,
                      (unsigned long long)idx->first[n],
                      (unsigned long long)db->entries);
        n--;
        idx->pages_read--;
    }
    /* published after first[] (another reader may prepare meanwhile) */
    __atomic_store_n(&idx->nleaves, n, __ATOMIC_RELEASE);
    if (rc)
        return idx->first[n] > need ? LIO_SUCCESS : rc;
    return LIO_SUCCESS;
}

const uint64_t *lio_index_built_map(const lio_index *idx, uint64_t *n)
{
    *n = 0;
    if (!idx->mapping || lio_index_pending(idx))
        return NULL;
    *n = idx->first[idx->nleaves];
    return idx->built_map;
}

uint64_t lio_checksum(const void *data, size_t n, uint64_t seed)
{
    /* Four independent lanes, 32 bytes a round, so that the multiplies
     * overlap (one chain of them ran at 2 GB/s, zlib's CRC-32 at 1.6):
     * a cached index's parts are checked at memory speed. */
    const uint8_t *p = data;
    uint64_t h[4] = {seed ^ 0x243f6a8885a308d3u, seed ^ 0x13198a2e03707344u,
                     seed ^ 0xa4093822299f31d0u, seed ^ 0x082efa98ec4e6c89u};
    uint64_t tail = 0, out = n;
    for (; n >= 32; n -= 32, p += 32)
        for (int i = 0; i < 4; i++) {
            uint64_t x = (h[i] ^ ld64(p + 8 * i)) * 0xff51afd7ed558ccdu;
            h[i] = x ^ x >> 32;
        }
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t x = (h[0] ^ ld64(p)) * 0xff51afd7ed558ccdu;
        h[0] = x ^ x >> 32;
    }
    if (n)
        memcpy(&tail, p, n);
    h[1] = (h[1] ^ tail) * 0xc4ceb9fe1a85ec53u;
    for (int i = 0; i < 4; i++) {   /* each lane moves every bit of out */
        out = (out ^ h[i]) * 0xc4ceb9fe1a85ec53u;
        out ^= out >> 29;
    }
    return out;
}
