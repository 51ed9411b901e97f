/* Bulk record reads: records by ordinal, as few and as large reads as the
 * layout allows.
 *
 * Step 1 (prepare) maps ordinals to leaves through the index, reads the
 * distinct leaves in page order (coalesced), and sizes every record.
 * Step 2 (fill) copies inline keys and values out of the leaves and reads
 * overflow values straight into their place in the caller's buffer, the
 * 16-byte page header of each run landing in a side buffer to be checked.
 * Records the index maps (lio_index.recmap) skip the leaf: prepare sizes
 * them from the map and fill reads their key and value (adjacent in the
 * node) straight into the batch, in the same plan as the overflow values.
 *
 * Layer 5 of the core, beside the cursors.
 * May call: errors.c (lio_fail), format.c (page and leaf checks, records,
 * lio_grow, lio_sort_u64), pager.c (lio_check_extent,
 * lio_env_fits_memory), plan.c, index.c (ordinal -> leaf, the record map)
 * and cursor.c (the records of a leaf's duplicate sub-trees). */
#include <stdlib.h>
#include <unistd.h>

#include "core.h"

typedef struct rec {
    uint64_t ordinal;
    uint32_t slot;            /* loaded leaf */
    const uint8_t *key;
    uint32_t ksize;
    const uint8_t *val;       /* inline value, NULL for overflow */
    uint64_t vsize;
    uint64_t ovpg;            /* first overflow page, 0 if inline */
    uint64_t at;              /* mapped: file offset of the key, else 0 */
    int64_t arena_at;         /* value copied to the arena, else -1 */
    uint8_t *kdst;            /* where fill puts a mapped record's key */
    uint8_t *vdst;            /* where fill puts the value */
} rec;

/* Pages a read of leaves bridged between two of them, kept where the
 * tree has overflow values: those are mostly its values, which fill then
 * copies rather than reads again.  list: (file offset, length, offset in
 * buf) triples, sorted by file offset. */
typedef struct gap_store {
    uint64_t *list;
    size_t n, cap;
    uint8_t *buf;
    size_t used, room;
} gap_store;

struct lio_bulk {
    lio_env *env;
    lio_meta snap;
    lio_dbrec db;
    const lio_index *idx;
    lio_executor ex;
    lio_error err;
    lio_plan plan;
    size_t max_gap, max_read;
    int dupsort;
    int collective;           /* every step runs the executor exactly once */
    int ran;                  /* the current step has run it */
    /* leaves of the current batch */
    uint64_t *leaves;         /* leaf numbers (index positions), sorted */
    size_t nleaves, leaves_cap;
    uint8_t *leafbuf;
    size_t leafbuf_pages;
    const uint8_t **slotp;    /* each slot's leaf: in leafbuf or the index */
    size_t leaves_read;       /* of them, read (not in the index) */
    gap_store gaps;           /* bridged by the reads of these leaves */
    /* leaves pre_lo .. pre_lo+pre_n-1 (index positions), as the last
     * lio_bulk_extend read them to count them: the next prepare (only)
     * takes them from here */
    uint8_t *pre;
    uint64_t pre_lo, pre_n, pre_cap;
    uint8_t *pre_ok;          /* kept leaves the count checked whole */
    gap_store pre_gaps;       /* bridged by the reads of kept leaves: the
                               * step after them only, as those leaves */
    int pre_gaps_served;
    /* records of the current batch */
    rec *recs;
    size_t nrecs, recs_cap;
    /* duplicates that live in a sub-database are copied out here */
    uint8_t *arena;
    size_t arena_len, arena_cap;
    size_t arena_recs;        /* records of the current batch in it */
    lio_cursor *dupcur;       /* walks duplicates kept in sub-databases */
    uint8_t dup_key[LIO_MAX_KEY_SIZE];
    uint32_t dup_klen;
    uint64_t dup_pos;         /* dupcur is on this duplicate of dup_key */
    int dup_valid;
    /* direct reads (overflow values, mapped records): (file offset,
     * record) pairs sorted by offset */
    uint64_t *ov_order;
    uint8_t *ov_hdr;
    uint64_t *pairs;          /* (leaf, record) pairs of a window */
    size_t pairs_cap;
    size_t ov_cap;
    /* cache policy (lio_bulk_set_cache) */
    lio_readahead ra;         /* regions read ahead (region 0: none) */
    int drop;                 /* drop what was read once consumed */
    uint64_t drop_lo, drop_hi, drop_bytes; /* read since the last drop */
    uint8_t *advised;         /* one bit per region advised this pass */
    size_t advised_bytes;
    uint64_t advised_count;   /* bits set: all of the file's = nothing to do */
};

static void gaps_clear(gap_store *g)
{
    g->n = g->used = 0;
}

static void gaps_free(gap_store *g)
{
    free(g->list);
    free(g->buf);
    memset(g, 0, sizeof *g);
}

static int oom(lio_bulk *b)
{
    return lio_fail(&b->err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
}

int lio_bulk_open(lio_bulk **out, lio_env *env, const lio_meta *snap,
                  const lio_dbrec *db, const lio_index *idx,
                  const lio_executor *ex, lio_error *err)
{
    lio_bulk *b = calloc(1, sizeof *b);
    *out = NULL;
    if (!b)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    if (idx->txnid != snap->txnid || idx->root != db->root) {
        free(b);
        return lio_fail(err, LIO_EINVAL, LIO_NO_PAGE,
                        "the record index describes another snapshot");
    }
    b->env = env;
    b->snap = *snap;
    b->db = *db;
    b->idx = idx;
    b->ex = *ex;
    b->dupsort = (db->flags & LIO_DUPSORT) != 0;
    b->max_gap = 64u << 10;
    b->max_read = 8u << 20;
    lio_plan_init(&b->plan, b->max_gap, b->max_read);
    *out = b;
    return LIO_SUCCESS;
}

void lio_bulk_set_policy(lio_bulk *b, size_t max_gap, size_t max_read)
{
    lio_plan_free(&b->plan);
    b->max_gap = max_gap;
    b->max_read = max_read;
    lio_plan_init(&b->plan, max_gap, max_read);
}

const lio_error *lio_bulk_error(const lio_bulk *b) { return &b->err; }

void lio_bulk_set_collective(lio_bulk *b, int on) { b->collective = on; }

/* Drop what was read since the last drop, as one span.  Dropping each
 * read as soon as it was consumed leaves most pages cached (measured: 126
 * of 157 MB after an epoch): the page cache holds files in large folios,
 * which a drop frees only when it covers them whole.  A span of 16 MiB
 * covers them; in a scattered order it also drops pages a later window
 * needs, which that window then reads again (what cache="drop" asks). */
#define DROP_SPAN (16u << 20)

static void drop_read(lio_bulk *b)
{
    if (b->drop_bytes && b->ex.advise)
        b->ex.advise(b->ex.ctx, b->drop_lo, b->drop_hi - b->drop_lo,
                     LIO_ADVISE_DONTNEED);
    b->drop_lo = b->drop_hi = b->drop_bytes = 0;
}

static int run_plan(lio_bulk *b)
{
    int rc;
    b->ran = 1;
    rc = b->ex.run(b->ex.ctx, &b->plan, &b->err);
    if (rc == 0 && b->drop) {
        for (size_t i = 0; i < b->plan.nreads; i++) {
            uint64_t lo = b->plan.reads[i].off, hi = lo + b->plan.reads[i].len;
            if (!b->drop_bytes || lo < b->drop_lo)
                b->drop_lo = lo;
            if (!b->drop_bytes || hi > b->drop_hi)
                b->drop_hi = hi;
            b->drop_bytes += hi - lo;
        }
        if (b->drop_bytes >= DROP_SPAN)
            drop_read(b);
    }
    return rc;
}

void lio_bulk_set_cache(lio_bulk *b, size_t region, unsigned min_pages,
                        int drop)
{
    b->ra.region = drop ? 0 : region;
    b->ra.min_pages = min_pages ? min_pages : 1;
    b->drop = drop;
    lio_bulk_new_pass(b);
}

void lio_bulk_new_pass(lio_bulk *b)
{
    drop_read(b);
    b->advised_count = 0;
    if (b->advised)
        memset(b->advised, 0, b->advised_bytes);
}

uint64_t lio_bulk_leaf_bytes(const lio_bulk *b)
{
    return (uint64_t)b->leaves_read * b->env->psize;
}

/* Ask for whole regions where the window's leaves (page numbers sorted,
 * each inside the file) are dense: the storage then reads them in large
 * requests, and later windows find the rest of each region cached. */
static void advise_regions(lio_bulk *b, const uint64_t *pages, size_t n)
{
    size_t at = 0;
    uint64_t reg;
    if (!b->ex.advise)
        return;
    while (lio_next_dense_region(&b->ra, b->env->psize, pages, n, &at,
                                 &reg)) {
        size_t byte = (size_t)(reg / 8);
        if (byte >= b->advised_bytes) { /* regions lie inside the file */
            size_t ncap = byte + 1 + (byte >> 1);
            uint8_t *nb = realloc(b->advised, ncap);
            if (!nb)
                return; /* advice is optional */
            memset(nb + b->advised_bytes, 0, ncap - b->advised_bytes);
            b->advised = nb;
            b->advised_bytes = ncap;
        }
        if (!(b->advised[byte] & (1u << (reg % 8)))) {
            b->advised[byte] |= (uint8_t)(1u << (reg % 8));
            b->advised_count++;
            b->ex.advise(b->ex.ctx, reg * b->ra.region, b->ra.region,
                         LIO_ADVISE_WILLNEED);
        }
    }
}

/* Every region of the file asked for this pass already: no advice left
 * to give. */
static int all_advised(const lio_bulk *b)
{
    return b->advised_count >=
           (b->env->file_size + b->ra.region - 1) / b->ra.region;
}

/* The leaf an even spread of the records not counted yet puts record
 * `ord` in (total <= ord < entries; leaves counted..tree_leaves-1 left). */
static uint64_t spread_leaf(const lio_bulk *b, uint64_t counted,
                            uint64_t total, uint64_t ord)
{
    const lio_index *idx = b->idx;
    double at = (double)(ord - total) / (double)(b->db.entries - total);
    uint64_t est = counted +
                   (uint64_t)(at * (double)(idx->tree_leaves - counted));
    return est < idx->tree_leaves ? est : idx->tree_leaves - 1;
}

void lio_bulk_advise(lio_bulk *b, const int64_t *ordinals, size_t n)
{
    const lio_index *idx = b->idx;
    uint64_t counted = __atomic_load_n(&idx->nleaves, __ATOMIC_ACQUIRE);
    uint64_t lo = idx->first[0], total = idx->first[counted];
    uint64_t leaf = UINT64_MAX, *pages, per_leaf;
    size_t np = 0;
    int sorted = 1;
    if (!b->ra.region || !b->ex.advise || !n || all_advised(b))
        return;
    pages = malloc(n * sizeof *pages);
    if (!pages)
        return; /* advice is optional */
    /* records a leaf of those not counted holds, at least (their even
     * spread: spread_leaf) */
    per_leaf = idx->tree_leaves > counted && b->db.entries > total
               ? (b->db.entries - total) / (idx->tree_leaves - counted) : 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t ord = (uint64_t)ordinals[i], pg;
        if (ord >= total && ordinals[i] >= 0 && ord < b->db.entries &&
            idx->tree_leaves > counted) {
            /* not counted yet: where an even spread of the records left
             * puts it (advice may miss) */
            uint64_t est = spread_leaf(b, counted, total, ord);
            pg = idx->leaf_pgno[est];
            /* A run of consecutive ordinals that ends a leaf's worth of
             * records on, on the same leaf, names only it (the estimate
             * never falls as the ordinal grows): skip it (a first start
             * estimated every record, 3 ms of small's 500k). */
            if (per_leaf > 1 && per_leaf - 1 < n - i &&
                (uint64_t)ordinals[i + per_leaf - 1] == ord + per_leaf - 1 &&
                spread_leaf(b, counted, total, ord + per_leaf - 1) == est)
                i += per_leaf - 1;
        } else {
            if (ordinals[i] < 0 || ord < lo || ord >= total)
                continue;
            if (leaf == UINT64_MAX || ord < idx->first[leaf] ||
                ord >= idx->first[leaf + 1])
                leaf = lio_index_find(idx, ord);
            pg = idx->leaf_pgno[leaf];
            {
                /* Consecutive ordinals (key order): the rest of this
                 * leaf's records name the same page; skip them when the
                 * one at the leaf's end is where a run puts it (advice
                 * may miss, so a coincidence costs nothing worse). */
                uint64_t left = idx->first[leaf + 1] - 1 - ord;
                if (left && left < n - i &&
                    (uint64_t)ordinals[i + left] == ord + left)
                    i += left;
            }
        }
        if (np && pages[np - 1] == pg)
            continue;
        if (pg * b->env->psize >= b->env->file_size)
            continue; /* past the file: the read will say so */
        if (np && pg < pages[np - 1])
            sorted = 0;
        pages[np++] = pg;
    }
    if (!sorted)
        lio_sort_u64(pages, np, 1);
    advise_regions(b, pages, np);
    free(pages);
}

/* Advise the leaves of the mapped records (their offsets sorted in
 * ov_order[0..n)) as load_leaves advises the leaves it reads; and the
 * overflow runs shorter than a region, where the file fits in half the
 * memory (the OS keeps what a region brings): values written out of key
 * order lie all over the file, and reading them one request each left a
 * cold device waiting on two requests at a time (cold, 50k values of 3
 * KB in random key order, key order: 0.53x py-lmdb's walk before). */
static void advise_mapped(lio_bulk *b, size_t n)
{
    uint64_t *pages;
    size_t np = 0;
    int runs;
    if (all_advised(b))
        return;
    if (!(pages = malloc((n ? n : 1) * sizeof *pages)))
        return; /* advice is optional */
    runs = lio_env_fits_memory(b->env, &b->snap);
    for (size_t j = 0; j < n; j++) {
        const rec *r = &b->recs[b->ov_order[2 * j + 1]];
        uint64_t pg = b->ov_order[2 * j] / b->env->psize;
        if (!(r->at || (runs && r->ovpg &&
                        r->vsize + PAGEHDRSZ <= b->ra.region)) ||
            (np && pages[np - 1] == pg))
            continue;
        pages[np++] = pg;
    }
    advise_regions(b, pages, np);
    free(pages);
}

/* A collective executor needs every rank in every step: a step that failed
 * before reading, or has nothing to read, still joins with an empty plan.
 * Its own error is kept; the caller agrees on the outcome afterwards. */
static int end_step(lio_bulk *b, int rc)
{
    if (b->collective && !b->ran) {
        lio_error ignored;
        lio_plan_reset(&b->plan);
        b->ran = 1;
        b->ex.run(b->ex.ctx, &b->plan, &ignored);
    }
    return rc;
}

void lio_bulk_close(lio_bulk *b)
{
    if (!b)
        return;
    lio_plan_free(&b->plan);
    free(b->leaves);
    free(b->leafbuf);
    gaps_free(&b->gaps);
    gaps_free(&b->pre_gaps);
    free(b->slotp);
    free(b->recs);
    free(b->arena);
    free(b->ov_order);
    free(b->ov_hdr);
    free(b->pairs);
    free(b->advised);
    free(b->pre);
    free(b->pre_ok);
    drop_read(b);
    lio_cursor_close(b->dupcur);
    free(b);
}

/* Load the distinct leaves of the batch, in page order: where the index
 * holds the leaves (lio_index_load_leaves), point at them; read the rest. */
/* Whether leaf (index position) is among the leaves kept by this step's
 * extension (b->pre). */
static int kept(const lio_bulk *b, uint64_t leaf)
{
    return leaf >= b->pre_lo && leaf - b->pre_lo < b->pre_n;
}

/* The most a gap store holds (beside the leaves read with it). */
#define GAPS_KEPT_MAX (16u << 20)

/* The bytes a read of leaf page pg right after page prev (ascending,
 * both planned) bridges, or 0. */
static uint64_t bridged(const lio_bulk *b, uint64_t prev, uint64_t pg)
{
    uint64_t psize = b->env->psize;
    return pg > prev + 1 && pg - prev - 1 <= b->plan.max_gap / psize
           ? (pg - prev - 1) * psize : 0;
}

/* Room in g for `bytes` more of gaps, at most `n` more of them, made
 * before planning (the plan points into it); 0: keep none this time (the
 * tree has no overflow value, or the gaps would outgrow GAPS_KEPT_MAX). */
static gap_store *gaps_room(lio_bulk *b, gap_store *g, uint64_t bytes,
                            size_t n)
{
    if (!b->db.overflow_pages || !bytes ||
        bytes > GAPS_KEPT_MAX - g->used)
        return NULL;
    if (g->used + bytes > g->room) {
        uint8_t *nb = realloc(g->buf, g->used + (size_t)bytes);
        if (!nb)
            return NULL;   /* (read them into the sink, as ever) */
        g->buf = nb;
        g->room = g->used + (size_t)bytes;
    }
    if (lio_grow((void **)&g->list, &g->cap, 3 * (g->n + n),
                 sizeof *g->list))
        return NULL;
    return g;
}

/* Plan the read of leaf page pg into dst, keeping in g (if any) the gap
 * it bridges. */
static int plan_leaf(lio_bulk *b, gap_store *g, uint64_t pg, uint8_t *dst)
{
    uint64_t psize = b->env->psize;
    size_t gap;
    int rc = lio_plan_add_keeping_gap(&b->plan, pg * psize, dst, psize,
                                      g ? g->buf + g->used : NULL,
                                      g ? g->room - g->used : 0, &gap);
    if (rc)
        return lio_fail(&b->err, rc, pg, "page %llu: cannot plan its read",
                        (unsigned long long)pg);
    if (gap) {
        uint64_t *t = g->list + 3 * g->n++;
        t[0] = pg * psize - gap;
        t[1] = gap;
        t[2] = g->used;
        g->used += gap;
    }
    return LIO_SUCCESS;
}

/* Where g holds file bytes [off, off + len), or NULL. */
static const uint8_t *gap_holding(const gap_store *g, uint64_t off,
                                  uint64_t len)
{
    size_t lo = 0, hi = g->n;
    while (hi - lo > 1) {   /* the last gap starting at or before off */
        size_t mid = (lo + hi) / 2;
        if (g->list[3 * mid] <= off)
            lo = mid;
        else
            hi = mid;
    }
    if (!g->n || g->list[3 * lo] > off ||
        off - g->list[3 * lo] >= g->list[3 * lo + 1] ||
        len > g->list[3 * lo + 1] - (off - g->list[3 * lo]))
        return NULL;
    return g->buf + g->list[3 * lo + 2] + (off - g->list[3 * lo]);
}

static int load_leaves(lio_bulk *b)
{
    lio_env *env = b->env;
    const lio_index *idx = b->idx;
    size_t *by_page;
    uint64_t *pages;
    size_t nread = 0, npre = 0;
    gap_store *gaps;
    int rc;

    gaps_clear(&b->gaps);
    if (b->nleaves > b->leafbuf_pages) {
        uint8_t *nb;
        const uint8_t **np;
        if (posix_memalign((void **)&nb, 4096, b->nleaves * env->psize))
            return oom(b);
        if (!(np = malloc(b->nleaves * sizeof *np))) {
            free(nb);
            return oom(b);
        }
        free(b->leafbuf);
        free(b->slotp);
        b->leafbuf = nb;
        b->slotp = np;
        b->leafbuf_pages = b->nleaves;
    }
    /* Read order: by page number; buffer slot: by key order. */
    by_page = malloc(b->nleaves * sizeof *by_page);
    pages = malloc(b->nleaves * sizeof *pages);
    if (!by_page || !pages) {
        free(by_page);
        free(pages);
        return oom(b);
    }
    {
        uint64_t *keyed = malloc(b->nleaves * 2 * sizeof *keyed);
        if (!keyed) {
            free(by_page);
            free(pages);
            return oom(b);
        }
        int sorted = 1;
        for (size_t i = 0; i < b->nleaves; i++) {
            keyed[2 * i] = idx->leaf_pgno[b->leaves[i]];
            keyed[2 * i + 1] = i;
            if (i && keyed[2 * i] < keyed[2 * i - 2])
                sorted = 0;
        }
        if (!sorted) /* appended databases keep key order on disk */
            lio_sort_u64(keyed, b->nleaves, 2);
        for (size_t i = 0; i < b->nleaves; i++) {
            pages[i] = keyed[2 * i];
            by_page[i] = (size_t)keyed[2 * i + 1];
        }
        free(keyed);
    }
    {   /* room for the gaps the leaves' reads bridge */
        uint64_t bytes = 0, prev = 0;
        size_t nplan = 0;
        for (size_t i = 0; i < b->nleaves; i++) {
            uint64_t leaf = b->leaves[by_page[i]], pg = idx->leaf_pgno[leaf];
            if ((idx->leafmem && idx->leaf_ok[leaf]) || kept(b, leaf))
                continue;
            if (nplan++)
                bytes += bridged(b, prev, pg);
            prev = pg;
        }
        gaps = gaps_room(b, &b->gaps, bytes, nplan);
    }
    lio_plan_reset(&b->plan);
    for (size_t i = 0; i < b->nleaves; i++) {
        size_t slot = by_page[i];
        uint64_t leaf = b->leaves[slot], pg = idx->leaf_pgno[leaf];
        if (idx->leafmem && idx->leaf_ok[leaf]) {
            b->slotp[slot] = idx->leafmem + leaf * env->psize;
            continue;
        }
        if (kept(b, leaf)) {
            b->slotp[slot] = b->pre + (leaf - b->pre_lo) * env->psize;
            npre++;   /* read by this step's extension */
            continue;
        }
        b->slotp[slot] = b->leafbuf + slot * env->psize;
        if ((rc = lio_check_extent(env, pg * env->psize, env->psize, pg,
                                   &b->err)))
            goto out;
        if ((rc = plan_leaf(b, gaps, pg, b->leafbuf + slot * env->psize)))
            goto out;
        pages[nread++] = pg;
    }
    b->leaves_read = nread + npre;
    advise_regions(b, pages, nread);
    if ((nread || b->collective) && (rc = run_plan(b)))
        goto out;
    for (size_t slot = 0; slot < b->nleaves; slot++) {
        uint64_t leaf = b->leaves[slot];
        if (idx->leafmem && idx->leaf_ok[leaf])
            continue;   /* checked when the index loaded it */
        if (kept(b, leaf) && b->pre_ok[leaf - b->pre_lo])
            continue;   /* checked whole when this step's extension
                         * counted it (a first start checked every leaf
                         * twice: 8 ms of its lanes' CPU over small) */
        if ((rc = lio_check_index_leaf(b->slotp[slot], env->psize,
                                       idx->leaf_pgno[leaf],
                                       idx->first[leaf + 1] -
                                       idx->first[leaf], b->dupsort,
                                       &b->err)))
            goto out;
    }
    rc = LIO_SUCCESS;
out:
    if (rc)   /* (what a failed read left there is no value) */
        gaps_clear(&b->gaps);
    free(by_page);
    free(pages);
    return rc;
}

static int arena_put(lio_bulk *b, const lio_val *v, uint64_t *at)
{
    /* at least one byte: the arena is never NULL once a value is in it
     * (an empty value would otherwise make NULL + 0 pointers; fuzzing) */
    if (lio_grow((void **)&b->arena, &b->arena_cap,
                b->arena_len + (v->size ? v->size : 1), 1))
        return oom(b);
    memcpy(b->arena + b->arena_len, v->data, v->size);
    *at = b->arena_len;
    b->arena_len += v->size;
    return LIO_SUCCESS;
}

/* Duplicate number `dup` of the key in a sub-database, via a cursor that
 * stays where it was: reading a key's duplicates in order costs one step
 * each; elsewhere it seeks to the key and steps forward. */
static int subdb_dup(lio_bulk *b, const uint8_t *key, uint32_t ksize,
                     uint64_t dup, rec *r)
{
    lio_val k = {key, ksize}, v;
    uint64_t at = 0;
    int rc = LIO_SUCCESS;
    if (!b->dupcur &&
        (rc = lio_cursor_open(&b->dupcur, b->env, &b->snap, &b->db, &b->err)))
        return rc;
    if (!(b->dup_valid && b->dup_klen == ksize && ksize <= LIO_MAX_KEY_SIZE &&
          !memcmp(b->dup_key, key, ksize) && b->dup_pos <= dup)) {
        b->dup_valid = 0;
        if ((rc = lio_cursor_get(b->dupcur, &k, &v, LIO_SET_KEY)))
            goto done;
        b->dup_pos = 0;
        if (ksize <= LIO_MAX_KEY_SIZE) {
            memcpy(b->dup_key, key, ksize);
            b->dup_klen = ksize;
            b->dup_valid = 1;
        }
    }
    while (b->dup_pos < dup) {
        if ((rc = lio_cursor_get(b->dupcur, &k, &v, LIO_NEXT_DUP)))
            goto done;
        b->dup_pos++;
    }
    rc = lio_cursor_get(b->dupcur, &k, &v, LIO_GET_CURRENT);
done:
    if (rc) {
        b->dup_valid = 0;
        if (rc == LIO_NOTFOUND)
            return lio_fail(&b->err, LIO_CORRUPTED, LIO_NO_PAGE,
                            "a duplicate sub-database holds fewer values "
                            "than its record counts");
        b->err = *lio_cursor_error(b->dupcur);
        return rc;
    }
    if ((rc = arena_put(b, &v, &at)))
        return rc;
    r->val = NULL;
    r->vsize = v.size;
    r->arena_at = (int64_t)at; /* a pointer once the arena stops moving */
    b->arena_recs++;
    return LIO_SUCCESS;
}

/* Find the node (and duplicate) holding record `rank` of a loaded leaf. */
static int locate(lio_bulk *b, const uint8_t *p, uint64_t pg, uint64_t rank,
                  rec *r)
{
    lio_env *env = b->env;
    unsigned n = pg_numkeys(p), i = 0;
    uint64_t dup = 0;
    const uint8_t *nd;
    uint16_t f;

    r->arena_at = -1;
    if (!b->dupsort) {
        i = (unsigned)rank;
    } else {
        for (i = 0; i < n; i++) {
            uint64_t c = 1;
            nd = pg_node(p, i);
            if (nd_flags(nd) & F_DUPDATA) {
                if (nd_flags(nd) & F_SUBDATA) {
                    lio_dbrec rec;
                    lio_parse_dbrec(nd_data(nd), &rec);
                    c = rec.entries;
                } else {
                    c = pg_numkeys(nd_data(nd));
                }
            }
            if (rank < c) {
                dup = rank;
                break;
            }
            rank -= c;
        }
    }
    if (i >= n)
        return lio_fail(&b->err, LIO_CORRUPTED, pg,
                        "page %llu: record past the leaf's nodes",
                        (unsigned long long)pg);
    nd = pg_node(p, i);
    f = nd_flags(nd);
    r->key = nd_key(nd);
    r->ksize = nd_ksize(nd);
    r->ovpg = 0;
    if ((f & F_DUPDATA) && !b->dupsort)
        return lio_fail(&b->err, LIO_CORRUPTED, pg,
                        "page %llu: node has F_DUPDATA in a database without "
                        "DUPSORT", (unsigned long long)pg);
    if (f & F_BIGDATA) {
        uint64_t ov = ld64(nd_data(nd)), size = nd_dsize(nd);
        uint64_t need = (PAGEHDRSZ + size + env->psize - 1) / env->psize;
        if (ov < 2 || ov > b->snap.last_pg ||
            need > b->snap.last_pg - ov + 1)
            return lio_fail(&b->err, ov < 2 ? LIO_CORRUPTED
                            : LIO_PAGE_NOTFOUND, ov,
                            "page %llu: overflow value of %llu bytes runs past "
                            "the snapshot's last page %llu",
                            (unsigned long long)ov, (unsigned long long)size,
                            (unsigned long long)b->snap.last_pg);
        /* Before anyone allocates for it: a bogus size must fail here. */
        if (lio_check_extent(env, ov * env->psize, PAGEHDRSZ + (size_t)size,
                             ov, &b->err))
            return b->err.code;
        r->val = NULL;
        r->vsize = size;
        r->ovpg = ov;
    } else if (f & F_DUPDATA) {
        if (f & F_SUBDATA) {
            int rc = subdb_dup(b, r->key, r->ksize, dup, r);
            if (rc)
                return rc;
        } else {
            const uint8_t *sp = nd_data(nd);
            if (pg_flags(sp) & P_LEAF2) {
                r->vsize = pg_pad(sp);
                r->val = sp + PAGEHDRSZ + dup * pg_pad(sp);
                if (PAGEHDRSZ + (dup + 1) * pg_pad(sp) > nd_dsize(nd))
                    return lio_fail(&b->err, LIO_CORRUPTED, pg,
                                    "page %llu: LEAF2 sub-page keys run past "
                                    "the node", (unsigned long long)pg);
            } else {
                const uint8_t *sn = pg_node(sp, (unsigned)dup);
                r->vsize = nd_ksize(sn);
                r->val = nd_key(sn);
            }
        }
    } else {
        r->val = nd_data(nd);
        r->vsize = nd_dsize(nd);
    }
    return LIO_SUCCESS;
}

/* Which records of the window skip their leaf: those the map knows whose
 * leaf the window needs sparsely (at most half its records; a leaf needed
 * more densely is read whole, one large read instead of many small ones).
 * Sizes them from the map and adds their bytes to *kb, *vb. */
static int choose_mapped(lio_bulk *b, const uint64_t *leafof, size_t n,
                         int ascending, uint64_t *kb, uint64_t *vb,
                         size_t *nmapped)
{
    const lio_index *idx = b->idx;
    uint64_t lo = idx->first[0], psize = b->env->psize;
    uint64_t *pairs;   /* (leaf, record) sorted by leaf */
    int rc = LIO_SUCCESS;
    if (lio_grow((void **)&b->pairs, &b->pairs_cap, 2 * (n ? n : 1),
                 sizeof *b->pairs))
        return oom(b);
    pairs = b->pairs;
    for (size_t i = 0; i < n; i++) {
        pairs[2 * i] = leafof[i];
        pairs[2 * i + 1] = i;
    }
    if (!ascending)
        lio_sort_u64(pairs, n, 2);
    for (size_t s = 0, e; s < n; s = e) {
        uint64_t leaf = pairs[2 * s], pg = idx->leaf_pgno[leaf];
        for (e = s + 1; e < n && pairs[2 * e] == leaf; e++)
            ;
        if (2 * (e - s) > idx->first[leaf + 1] - idx->first[leaf])
            continue;   /* dense: read the leaf */
        for (size_t k = s; k < e; k++) {
            rec *r = &b->recs[pairs[2 * k + 1]];
            uint64_t m = idx->recmap[r->ordinal - lo];
            if (!m)   /* checked by lio_index_set_map */
                continue;
            r->at = pg * psize + (m & 0xffff) + NODEHDRSZ;
            r->ksize = (uint32_t)((m >> 16) & 0xffff);
            r->vsize = m >> 32;
            r->key = r->val = NULL;
            r->ovpg = 0;
            r->arena_at = -1;
            (*nmapped)++;
            if ((rc = lio_check_extent(b->env, r->at, r->ksize + r->vsize,
                                       pg, &b->err)))
                return rc;
            *kb += r->ksize;
            *vb += r->vsize;
        }
    }
    return rc;
}

/* A begun index's leaves are counted in rounds of at most EXTEND_ROUND
 * bytes (the index build's round), and at most EXTEND_KEPT bytes of them
 * stay for the next prepare (a window's leaves, not a whole file's). */
#define EXTEND_ROUND (8u << 20)
#define EXTEND_KEPT (32u << 20)

static int keep_room(lio_bulk *b, uint64_t pages)
{
    uint64_t psize = b->env->psize;
    uint8_t *nb, *ok;
    if (pages <= b->pre_cap)
        return 0;
    if (posix_memalign((void **)&nb, 4096, pages * psize))
        return -1;
    if (!(ok = realloc(b->pre_ok, pages))) {
        free(nb);
        return -1;
    }
    b->pre_ok = ok;
    if (b->pre_n)
        memcpy(nb, b->pre, b->pre_n * psize);
    free(b->pre);
    b->pre = nb;
    b->pre_cap = pages;
    return 0;
}

/* How many of leaves first..first+k-1 (index positions) lie inside the
 * file, counted from the first: a leaf past the end ends the run (err:
 * what the first one's check said, when it is past the end). */
static uint64_t leaves_in_file(lio_bulk *b, uint64_t first, uint64_t k,
                               lio_error *err)
{
    uint64_t psize = b->env->psize, n;
    for (n = 0; n < k; n++) {
        uint64_t pg = b->idx->leaf_pgno[first + n];
        lio_error ignored;
        if (lio_check_extent(b->env, pg * psize, psize, pg,
                             n ? &ignored : err))
            break;
    }
    return n;
}

/* Read leaves first..first+k-1 (index positions) into the kept leaves
 * from slot `at` on, in key order, reading in page order (keyed: room for
 * 2k words). */
static int read_kept(lio_bulk *b, uint64_t first, uint64_t k, uint64_t at,
                     uint64_t *keyed)
{
    const uint64_t *pgno = b->idx->leaf_pgno + first;
    uint64_t psize = b->env->psize, bytes = 0;
    gap_store *gaps;
    size_t had;
    int sorted = 1, rc;
    if (keep_room(b, at + k))
        return oom(b);
    memset(b->pre_ok + at, 0, k);   /* not checked: not counted yet */
    for (uint64_t j = 0; j < k; j++) {
        keyed[2 * j] = pgno[j];
        keyed[2 * j + 1] = j;
        if (j && keyed[2 * j] < keyed[2 * j - 2])
            sorted = 0;
    }
    if (!sorted)
        lio_sort_u64(keyed, k, 2);
    if (!at) {   /* (kept anew: so are the gaps) */
        gaps_clear(&b->pre_gaps);
        b->pre_gaps_served = 0;
    }
    for (uint64_t j = 1; j < k; j++)
        bytes += bridged(b, keyed[2 * j - 2], keyed[2 * j]);
    gaps = gaps_room(b, &b->pre_gaps, bytes, (size_t)k);
    had = b->pre_gaps.n;
    lio_plan_reset(&b->plan);
    for (uint64_t j = 0; j < k; j++) {
        uint64_t pg = keyed[2 * j];
        uint8_t *dst = b->pre + (at + keyed[2 * j + 1]) * psize;
        if ((rc = plan_leaf(b, gaps, pg, dst)))
            goto fail;
    }
    if ((rc = run_plan(b)))
        goto fail;
    if (had && b->pre_gaps.n > had &&
        b->pre_gaps.list[3 * had] < b->pre_gaps.list[3 * had - 3])
        lio_sort_u64(b->pre_gaps.list, b->pre_gaps.n, 3);
    return LIO_SUCCESS;
fail:   /* (what a failed read left there is no value) */
    gaps_clear(&b->pre_gaps);
    return rc;
}

static int extend(lio_bulk *b, lio_index *idx, uint64_t need, int keep);

int lio_bulk_extend(lio_bulk *b, lio_index *idx, uint64_t need, int keep)
{
    int rc;

    b->err.code = 0;
    b->ran = 0;
    if (idx != b->idx)
        return end_step(b, lio_fail(&b->err, LIO_EINVAL, LIO_NO_PAGE,
                                    "the reader was opened with another "
                                    "index"));
    if (!lio_index_pending(idx) || lio_index_holds(idx, need))
        return end_step(b, LIO_SUCCESS);   /* counted: keep what is kept */
    /* (a forked child's first extension makes the lock anew: the thread
     * that may have held it at the fork, a read() of the parent's, is not
     * in the child) */
    lio_lock_here(&idx->grow, &idx->grow_pid);
    rc = extend(b, idx, need, keep);
    pthread_mutex_unlock(&idx->grow);
    return rc;
}

/* lio_bulk_extend under the index's lock (another extension may have
 * counted what this one needs meanwhile: the loop checks first). */
static int extend(lio_bulk *b, lio_index *idx, uint64_t need, int keep)
{
    uint64_t psize = b->env->psize;
    uint64_t round_max = EXTEND_ROUND / psize ? EXTEND_ROUND / psize : 1;
    uint64_t kept_max = EXTEND_KEPT / psize ? EXTEND_KEPT / psize : 1;
    uint64_t *keyed = NULL;
    int rc = LIO_SUCCESS;

    if (!keep) {
        b->pre_n = 0;
        b->pre_lo = idx->nleaves;
    }
    if (!(keyed = malloc(2 * round_max * sizeof *keyed)))
        return end_step(b, oom(b));
    while (lio_index_pending(idx) && !lio_index_holds(idx, need)) {
        uint64_t n = idx->nleaves, have = idx->first[n];
        uint64_t left = idx->tree_leaves - n, k;
        uint64_t left_recs = b->db.entries > have ? b->db.entries - have : 0;
        int fresh = 0;   /* read by this round (not read ahead) */
        /* Leaves enough for the records wanted at the average of the
         * records left, one more for the spread: a round reads little past
         * what the step needs. */
        if (need >= b->db.entries || left_recs == 0) {
            k = left;
        } else {   /* (in doubles: the counts a hostile file gives) */
            double x = (double)(need + 1 - have) * (double)left /
                       (double)left_recs;
            k = x < (double)left ? (uint64_t)x : left;
            k += ((double)k < x) + 1;   /* rounded up, one more */
        }
        if (k > round_max)
            k = round_max;
        if (k > left)
            k = left;
        if (keep && kept(b, n)) {
            /* read ahead of this turn (lio_bulk_read_leaves) */
            if (k > b->pre_lo + b->pre_n - n)
                k = b->pre_lo + b->pre_n - n;
        } else {
            if (!(k = leaves_in_file(b, n, k, &b->err))) {
                rc = b->err.code;
                goto out;
            }
            if (!keep || b->pre_lo + b->pre_n != n ||
                b->pre_n + k > kept_max) {
                b->pre_lo = n;   /* (appended to what is kept if it ends here) */
                b->pre_n = 0;
            }
            if ((rc = read_kept(b, n, k, b->pre_n, keyed)))
                goto out;
            fresh = 1;
        }
        rc = lio_index_count_more(idx, (uint32_t)psize, &b->db,
                                  b->pre + (n - b->pre_lo) * psize, k, need,
                                  b->pre_ok + (n - b->pre_lo), &b->err);
        if (rc)
            goto out;
        if (fresh)
            b->pre_n += idx->nleaves - n;   /* the leaves counted */
        if (idx->nleaves - n < k)
            break;   /* stopped at a damaged leaf past the one needed */
    }
out:
    free(keyed);
    if (!keep || rc) {
        b->pre_n = 0;
        gaps_clear(&b->pre_gaps);   /* (as the leaves) */
    }
    return end_step(b, rc);
}

int lio_bulk_read_leaves(lio_bulk *b, uint64_t lo, uint64_t hi)
{
    const lio_index *idx = b->idx;
    uint64_t psize = b->env->psize, n, *keyed;
    uint64_t all = idx->tree_leaves ? idx->tree_leaves : idx->nleaves;
    uint64_t kept_max = EXTEND_KEPT / psize ? EXTEND_KEPT / psize : 1;
    lio_error ignored;   /* a leaf past the file: nothing read ahead */
    int rc;

    b->err.code = 0;
    b->ran = 0;
    b->pre_n = 0;
    if (hi > all)
        hi = all;
    if (hi > lo && hi - lo > kept_max)
        hi = lo + kept_max;
    if (lo >= hi)
        return end_step(b, LIO_SUCCESS);
    if (!(n = leaves_in_file(b, lo, hi - lo, &ignored)))
        return end_step(b, LIO_SUCCESS);
    if (!(keyed = malloc(2 * n * sizeof *keyed)))
        return end_step(b, oom(b));
    rc = read_kept(b, lo, n, 0, keyed);
    free(keyed);
    if (rc)
        return end_step(b, rc);
    b->pre_lo = lo;
    b->pre_n = n;
    return end_step(b, LIO_SUCCESS);
}

/* How many records ahead prepare asks for a node (a few misses' worth of
 * work on). */
#define LOCATE_AHEAD 8u

/* Where record r's node pointer sits in its leaf (slot set), leaf its
 * index position, or NULL past the page (a guess only: duplicates make the
 * rank no node number). */
static const uint8_t *node_pointer(const lio_bulk *b, const rec *r,
                                   uint64_t leaf)
{
    uint64_t rank = r->ordinal - b->idx->first[leaf];
    return rank < (b->env->psize - PAGEHDRSZ) / 2
           ? b->slotp[r->slot] + PAGEHDRSZ + 2 * rank : NULL;
}

/* Ask the CPU for record r's node (its pointer asked for already). */
static void prefetch_node(const lio_bulk *b, const rec *r, uint64_t leaf)
{
    const uint8_t *ptr = node_pointer(b, r, leaf);
    if (ptr) {
        uint16_t at = ld16(ptr);
        if (at < b->env->psize)
            __builtin_prefetch(b->slotp[r->slot] + at);
    }
}

int lio_bulk_prepare(lio_bulk *b, const int64_t *ordinals, size_t n,
                     uint64_t *key_bytes, uint64_t *value_bytes)
{
    const lio_index *idx = b->idx;
    const uint64_t *map = idx->recmap;
    uint64_t lo = idx->first[0];
    /* the leaves counted when the step began (a begun index may be
     * counted further meanwhile; first[0..nl] is written before nl) */
    uint64_t nl = __atomic_load_n(&idx->nleaves, __ATOMIC_ACQUIRE);
    uint64_t total = idx->first[nl];
    uint64_t kb = 0, vb = 0, *leafof, prev = 0;
    size_t nleafy = 0;        /* records read through their leaf */
    size_t nmapped = 0;       /* records the map reads straight */
    int ascending = 1;
    int rc = LIO_SUCCESS;

    b->err.code = 0;
    b->ran = 0;
    if (b->pre && !b->pre_n && !lio_index_pending(idx)) {
        free(b->pre);   /* every leaf counted: no extension needs it */
        free(b->pre_ok);
        gaps_free(&b->pre_gaps);
        b->pre = NULL;
        b->pre_ok = NULL;
        b->pre_cap = 0;
    }
    if (b->pre_gaps_served) {
        gaps_clear(&b->pre_gaps);
        b->pre_gaps_served = 0;
    }
    b->nrecs = 0;
    b->nleaves = 0;
    b->leaves_read = 0;
    b->arena_len = 0;
    b->arena_recs = 0;
    if (lio_grow((void **)&b->recs, &b->recs_cap, n ? n : 1, sizeof *b->recs))
        return end_step(b, oom(b));
    leafof = malloc((n ? n : 1) * sizeof *leafof);
    if (!leafof)
        return end_step(b, oom(b));
    for (size_t i = 0; i < n; i++) {
        uint64_t ord = (uint64_t)ordinals[i], leaf;
        rec *r = &b->recs[i];
        if (ordinals[i] < 0 || ord < lo || ord >= total) {
            if (lo || total != b->db.entries)   /* a partial index */
                rc = lio_fail(&b->err, LIO_EINVAL, LIO_NO_PAGE,
                              "record ordinal %lld is outside the records "
                              "indexed (%llu..%llu)", (long long)ordinals[i],
                              (unsigned long long)lo,
                              (unsigned long long)total - 1);
            else
                rc = lio_fail(&b->err, LIO_EINVAL, LIO_NO_PAGE,
                              "record ordinal %lld is out of range (%llu "
                              "records)", (long long)ordinals[i],
                              (unsigned long long)total);
            goto out;
        }
        /* Consecutive ordinals mostly stay on the previous leaf or step
         * to the next one: try those before searching. */
        if (i && ord >= idx->first[prev] && ord < idx->first[prev + 1])
            leaf = prev;
        else if (i && prev + 1 < nl &&
                 ord >= idx->first[prev + 1] && ord < idx->first[prev + 2])
            leaf = prev + 1;
        else
            leaf = lio_index_find(idx, ord);
        if (i && leaf < prev)
            ascending = 0;
        prev = leaf;
        leafof[i] = leaf;
        r->ordinal = ord;
        r->at = 0;
    }
    if (map && (rc = choose_mapped(b, leafof, n, ascending, &kb, &vb,
                                   &nmapped)))
        goto out;
    /* The leaves of the other records (all of them: as they are). */
    if (nmapped == 0) {
        nleafy = n;
    } else {
        ascending = 1;
        for (size_t i = 0; i < n; i++) {
            if (b->recs[i].at)
                continue;
            if (nleafy && leafof[i] < leafof[nleafy - 1])
                ascending = 0;
            leafof[nleafy++] = leafof[i];   /* (nleafy <= i) */
        }
    }
    /* Distinct leaves, in key order (a sequential batch is sorted already). */
    if (lio_grow((void **)&b->leaves, &b->leaves_cap, n ? n : 1,
                sizeof *b->leaves)) {
        rc = oom(b);
        goto out;
    }
    memcpy(b->leaves, leafof, nleafy * sizeof *leafof);
    if (!ascending)
        lio_sort_u64(b->leaves, nleafy, 1);
    for (size_t i = 0; i < nleafy; i++)
        if (!b->nleaves || b->leaves[b->nleaves - 1] != b->leaves[i])
            b->leaves[b->nleaves++] = b->leaves[i];
    rc = b->nleaves ? load_leaves(b) : LIO_SUCCESS;
    b->pre_n = 0;   /* an extension's leaves serve the prepare after it
                     * only (fill still copies from them) */
    b->pre_gaps_served = 1;
    if (rc)
        goto out;
    /* Each record's slot first, asking for its leaf's header and node
     * pointer; then each record located, asking for the node of the one
     * LOCATE_AHEAD on.  In a shuffled window every record is on another
     * leaf, and the leaves held in memory outgrow the CPU's caches: the
     * two misses a record would wait for come in while others are found
     * (CIFAR-like, hot, shuffled: 72% of prepare's samples were on those
     * two loads). */
    for (size_t i = 0, j = 0, lo = 0; i < n; i++) {
        rec *r = &b->recs[i];
        uint64_t leaf;
        if (r->at)
            continue;
        leaf = leafof[j++];
        if (ascending) { /* slots advance with the leaves */
            while (b->leaves[lo] != leaf)
                lo++;
        } else {
            size_t hi = b->nleaves;
            lo = 0;
            while (hi - lo > 1) { /* slot of leaf */
                size_t mid = (lo + hi) / 2;
                if (b->leaves[mid] <= leaf)
                    lo = mid;
                else
                    hi = mid;
            }
        }
        r->slot = (uint32_t)lo;
        if (!ascending) {
            const uint8_t *ptr = node_pointer(b, r, leaf);
            __builtin_prefetch(b->slotp[lo]);
            if (ptr)
                __builtin_prefetch(ptr);
        }
    }
    for (size_t i = 0, j = 0, ai = 0, aj = 0; i < n; i++) {
        rec *r = &b->recs[i];
        uint64_t leaf;
        if (r->at)
            continue;
        /* (ai, aj): the next record read through its leaf not asked
         * for yet, and its place in leafof */
        while (!ascending && aj < nleafy && aj <= j + LOCATE_AHEAD) {
            while (b->recs[ai].at)
                ai++;
            prefetch_node(b, &b->recs[ai], leafof[aj]);
            ai++;
            aj++;
        }
        leaf = leafof[j++];
        rc = locate(b, b->slotp[r->slot], idx->leaf_pgno[leaf],
                    r->ordinal - idx->first[leaf], r);
        if (rc)
            goto out;
        kb += r->ksize;
        vb += r->vsize;
    }
    /* Arena offsets become pointers now that it has stopped growing. */
    for (size_t i = 0; b->arena_recs && i < n; i++)
        if (b->recs[i].arena_at >= 0)
            b->recs[i].val = b->arena + b->recs[i].arena_at;
    b->nrecs = n;
    *key_bytes = kb;
    *value_bytes = vb;
out:
    free(leafof);
    return end_step(b, rc);
}

/* Batch boundaries must cover the prepared records exactly. */
static int check_ends(lio_bulk *b, const size_t *ends, size_t nb)
{
    size_t prev = 0;
    for (size_t j = 0; j < nb; j++) {
        if (ends[j] < prev || ends[j] > b->nrecs)
            return lio_fail(&b->err, LIO_EINVAL, LIO_NO_PAGE,
                            "batch %zu ends at record %zu: not within the "
                            "%zu prepared records", j, ends[j], b->nrecs);
        prev = ends[j];
    }
    if (prev != b->nrecs)
        return lio_fail(&b->err, LIO_EINVAL, LIO_NO_PAGE,
                        "batches cover %zu of %zu prepared records", prev,
                        b->nrecs);
    return LIO_SUCCESS;
}

int lio_bulk_batch_sizes(lio_bulk *b, const size_t *ends, size_t nb,
                         uint64_t *key_bytes, uint64_t *value_bytes)
{
    int rc;
    b->err.code = 0;
    if ((rc = check_ends(b, ends, nb)))
        return rc;
    for (size_t j = 0, i = 0; j < nb; j++) {
        uint64_t kb = 0, vb = 0;
        for (; i < ends[j]; i++) {
            kb += b->recs[i].ksize;
            vb += b->recs[i].vsize;
        }
        key_bytes[j] = kb;
        value_bytes[j] = vb;
    }
    return LIO_SUCCESS;
}

int lio_bulk_fill(lio_bulk *b, uint8_t *kdata, int64_t *koff, uint8_t *vdata,
                  int64_t *voff)
{
    lio_batch_out out = {kdata, koff, vdata, voff};
    size_t end = b->nrecs;
    return lio_bulk_fill_batches(b, &end, 1, &out);
}

int lio_bulk_fill_batches(lio_bulk *b, const size_t *ends, size_t nb,
                          const lio_batch_out *out)
{
    lio_env *env = b->env;
    size_t n = b->nrecs, nov = 0;
    int rc;

    b->err.code = 0;
    b->ran = 0;
    if ((rc = check_ends(b, ends, nb)))
        return end_step(b, rc);
    /* Inline keys and values now; overflow values and mapped records get
     * their destinations. */
    for (size_t j = 0, i = 0; j < nb; j++) {
        const lio_batch_out *o = &out[j];
        int64_t kpos = 0, vpos = 0;
        size_t first = i;
        if (o->kdata)
            o->koff[0] = 0;
        o->voff[0] = 0;
        for (; i < ends[j]; i++) {
            rec *r = &b->recs[i];
            r->kdst = NULL;
            if (o->kdata) {
                r->kdst = o->kdata + kpos;
                if (!r->at)
                    memcpy(r->kdst, r->key, r->ksize);
                kpos += r->ksize;
                o->koff[i - first + 1] = kpos;
            }
            r->vdst = o->vdata + vpos;
            if (r->ovpg || r->at)
                nov++;
            else
                memcpy(r->vdst, r->val, (size_t)r->vsize);
            vpos += (int64_t)r->vsize;
            o->voff[i - first + 1] = vpos;
        }
    }
    if (!nov)
        return end_step(b, LIO_SUCCESS);
    if (nov > b->ov_cap) {
        uint64_t *o = realloc(b->ov_order, nov * 2 * sizeof *o);
        uint8_t *h = o ? realloc(b->ov_hdr, nov * PAGEHDRSZ) : NULL;
        if (o)
            b->ov_order = o;
        if (!h)
            return end_step(b, oom(b));
        b->ov_hdr = h;
        b->ov_cap = nov;
    }
    nov = 0;
    for (size_t i = 0; i < n; i++) {
        rec *r = &b->recs[i];
        if (r->ovpg || r->at) {
            b->ov_order[2 * nov] = r->ovpg ? r->ovpg * env->psize : r->at;
            b->ov_order[2 * nov + 1] = i;
            nov++;
        }
    }
    lio_sort_u64(b->ov_order, nov, 2);
    if (b->ra.region)
        advise_mapped(b, nov);
    lio_plan_reset(&b->plan);
    for (size_t j = 0; j < nov; j++) {
        size_t i = (size_t)b->ov_order[2 * j + 1];
        rec *r = &b->recs[i];
        uint64_t off = b->ov_order[2 * j];
        if (j && b->ov_order[2 * (j - 1)] == off)
            continue; /* the same record twice: copied after the reads */
        if (!r->at) {   /* read already, between two leaves? */
            const uint8_t *at = gap_holding(&b->gaps, off,
                                            PAGEHDRSZ + r->vsize);
            if (!at)
                at = gap_holding(&b->pre_gaps, off, PAGEHDRSZ + r->vsize);
            if (at) {
                memcpy(b->ov_hdr + j * PAGEHDRSZ, at, PAGEHDRSZ);
                memcpy(r->vdst, at + PAGEHDRSZ, (size_t)r->vsize);
                continue;
            }
        }
        if (r->at) {  /* the key (if wanted), then the value after it */
            if ((r->kdst && (rc = lio_plan_add(&b->plan, off, r->kdst,
                                               r->ksize))) ||
                (rc = lio_plan_add(&b->plan, off + r->ksize, r->vdst,
                                   (size_t)r->vsize))) {
                uint64_t pg = off / env->psize;
                if (rc == LIO_ENOMEM)
                    return end_step(b, oom(b));
                return end_step(b, lio_fail(&b->err, LIO_CORRUPTED, pg,
                                            "page %llu: the record map puts "
                                            "record %llu over another",
                                            (unsigned long long)pg,
                                            (unsigned long long)r->ordinal));
            }
            continue;
        }
        if ((rc = lio_plan_add(&b->plan, off, b->ov_hdr + j * PAGEHDRSZ,
                               PAGEHDRSZ)) ||
            (rc = lio_plan_add(&b->plan, off + PAGEHDRSZ, r->vdst,
                               (size_t)r->vsize)))
            return end_step(b, lio_fail(&b->err, rc, r->ovpg,
                                        "page %llu: overflow runs overlap",
                                        (unsigned long long)r->ovpg));
    }
    if ((rc = run_plan(b)))
        return rc;
    for (size_t j = 0; j < nov; j++) {
        size_t i = (size_t)b->ov_order[2 * j + 1];
        rec *r = &b->recs[i];
        const uint8_t *h = b->ov_hdr + j * PAGEHDRSZ;
        uint64_t need = (PAGEHDRSZ + r->vsize + env->psize - 1) / env->psize;
        if (r->at) {
            if (j && b->ov_order[2 * (j - 1)] == r->at) {
                const rec *p = &b->recs[b->ov_order[2 * (j - 1) + 1]];
                if (p->ksize != r->ksize || p->vsize != r->vsize)
                    return lio_fail(&b->err, LIO_CORRUPTED,
                                    r->at / env->psize, "page %llu: the "
                                    "record map gives records %llu and %llu "
                                    "one place but different sizes",
                                    (unsigned long long)(r->at / env->psize),
                                    (unsigned long long)p->ordinal,
                                    (unsigned long long)r->ordinal);
                if (r->kdst)
                    memcpy(r->kdst, p->kdst, r->ksize);
                memcpy(r->vdst, p->vdst, (size_t)r->vsize);
            }
            continue;
        }
        if (j && b->ov_order[2 * (j - 1)] == r->ovpg * env->psize) {
            size_t prev = (size_t)b->ov_order[2 * (j - 1) + 1];
            if (b->recs[prev].vsize != r->vsize)
                return lio_fail(&b->err, LIO_CORRUPTED, r->ovpg,
                                "page %llu: two values of %llu and %llu bytes "
                                "share one overflow run",
                                (unsigned long long)r->ovpg,
                                (unsigned long long)b->recs[prev].vsize,
                                (unsigned long long)r->vsize);
            memcpy(r->vdst, b->recs[prev].vdst, (size_t)r->vsize);
            memcpy(b->ov_hdr + j * PAGEHDRSZ, h - PAGEHDRSZ, PAGEHDRSZ);
            continue;
        }
        if (pg_pgno(h) != r->ovpg || pg_flags(h) != P_OVERFLOW ||
            pg_ovpages(h) < need)
            return lio_fail(&b->err, LIO_CORRUPTED, r->ovpg,
                            "page %llu: not an overflow run that can hold a "
                            "%llu-byte value (page number %llu, flags 0x%x, "
                            "%u pages)", (unsigned long long)r->ovpg,
                            (unsigned long long)r->vsize,
                            (unsigned long long)pg_pgno(h), pg_flags(h),
                            pg_ovpages(h));
    }
    return LIO_SUCCESS;
}
