/* Cursors over a B+tree, with liblmdb's positioning semantics.
 *
 * py-lmdb's answers depend on liblmdb's cursor state (C_INITIALIZED, C_EOF,
 * the key index left behind by a failed search, the dup sub-cursor), so the
 * state machine here follows mdb_cursor_get's documented behaviour step by
 * step.  Unlike liblmdb, every page is validated before use, every index is
 * checked against its page, and a descent deeper than the tree's recorded
 * depth is corruption, so a hostile file cannot make a walk loop.
 *
 * Layer 5 of the core (after errors, page format, page cache and env).
 * May call: errors.c (lio_fail), format.c (checks, key order, records),
 * pager.c (pages, read-ahead and its device hint, lio_read_into and
 * lio_read_segs for overflow values), leafdir.c (lio_get's leaf), ahead.c
 * (values read ahead by a worker). */
#include <stdlib.h>

#include "core.h"

#define C_INITIALIZED 0x01
#define C_EOF 0x02


typedef struct tcursor {
    struct lio_cursor *cur;
    struct tcursor *x;           /* dup sub-cursor, NULL if none */
    lio_dbrec db;
    int cmp;
    int flags;
    int subpage;                 /* root is a sub-page inside a leaf */
    unsigned snum, top;
    lio_page *pin[LIO_MAX_DEPTH];/* pinned cache page per level (lazy unpin) */
    const uint8_t *pg[LIO_MAX_DEPTH];
    uint64_t pgno[LIO_MAX_DEPTH];
    uint32_t pgsize[LIO_MAX_DEPTH];
    unsigned ki[LIO_MAX_DEPTH];
    const lio_leafdir *dir;      /* during lio_get only: go to the leaf the
                                  * directory names (the levels above it
                                  * are left as they were): */
    size_t dir_leaf;             /* this one */
} tcursor;

struct lio_cursor {
    lio_env *env;
    lio_meta snap;
    tcursor mc, mx;
    int dcmp;
    lio_error err;
    uint8_t *ovbuf;              /* the last overflow value read */
    size_t ovcap;
    uint64_t ov_pgno;            /* its first page, or 0 */
    uint32_t ov_size;            /* its size */
    const uint8_t *ov_data;
    lio_page *ov_pin;            /* the cache page ov_data points into */
    int defer;                   /* lio_cursor_defer_values */
    uint64_t pend_pgno;          /* the last value left unread, for
                                  * lio_cursor_value_into (its run's first
                                  * page), or 0 */
    uint32_t pend_size;
    uint8_t *gapbuf;             /* lio_cursor_values_into's scratch */
    size_t gapcap;
    uint64_t seek_leaf;          /* where the last seek to a one-page */
    unsigned seek_ki;            /* value landed */
    int walk;                    /* the current op starts or continues a
                                  * walk forward (1), backward (-1), or
                                  * seeks (0) */
    uint64_t adv_leaf;           /* runs advised so far: in this leaf, */
    unsigned adv_ki;             /* up to this node, */
    int adv_dir;                 /* walking this way */
    size_t ahead;                /* leaves past a read-ahead batch whose
                                  * blocks a walk asks for (0: the walk
                                  * has just begun) */
    lio_leafdir *dir;            /* the main tree's leaf directory, once
                                  * built (a reference) */
    int dir_ask;                 /* lio_get may still get one */
    uint8_t *nodebuf;            /* the last record lio_get read alone */
    size_t nodecap;
    uint64_t record_gets;        /* lio_cursor_gets_by_record */
    lio_ahead *worker;           /* reads values ahead, once a walk wanted it */
    int page_values;             /* a walk met a value in a one-page run */
};

static int fail(tcursor *c, int code, uint64_t pgno, const char *what)
{
    return lio_fail(&c->cur->err, code, pgno, "page %llu: %s",
                    (unsigned long long)pgno, what);
}

/* Pages of the overflow run of a size-byte value. */
static uint64_t run_pages(const lio_cursor *cur, uint32_t size)
{
    return (PAGEHDRSZ + (uint64_t)size + cur->env->psize - 1) /
           cur->env->psize;
}

/* ---- page stack ---------------------------------------------------------- */

static const uint8_t *top_page(const tcursor *c) { return c->pg[c->top]; }

static int is_leaf2(const uint8_t *p) { return (pg_flags(p) & P_LEAF2) != 0; }

static void node_key(const tcursor *c, const uint8_t *p, unsigned i,
                     lio_val *key)
{
    if (is_leaf2(p)) {
        key->size = c->db.pad;
        key->data = p + PAGEHDRSZ + (size_t)i * c->db.pad;
    } else {
        const uint8_t *nd = pg_node(p, i);
        key->size = nd_ksize(nd);
        key->data = nd_key(nd);
    }
}

static void release_levels(tcursor *c, unsigned from)
{
    for (unsigned i = from; i < LIO_MAX_DEPTH; i++) {
        if (c->pin[i]) {
            lio_page_unpin(c->cur->env, c->pin[i]);
            c->pin[i] = NULL;
        }
    }
}

/* Checks of a page that depend on where it sits in its tree. */
static int check_in_tree(tcursor *c, const uint8_t *p, uint32_t size,
                         unsigned level, uint64_t pgno)
{
    int want_leaf = level + 1 == c->db.depth;
    int leaf = (pg_flags(p) & P_LEAF) != 0;
    int fixed = (c->db.flags & (LIO_DUPSORT | LIO_DUPFIXED)) == LIO_DUPFIXED;
    if (level >= c->db.depth)
        return fail(c, LIO_CORRUPTED, pgno,
                    "tree is deeper than its recorded depth");
    if (leaf != want_leaf)
        return fail(c, LIO_CORRUPTED, pgno, want_leaf
                    ? "branch page where the tree's depth puts a leaf"
                    : "leaf page above the tree's recorded depth");
    if (leaf && is_leaf2(p) != fixed)
        return fail(c, LIO_CORRUPTED, pgno, fixed
                    ? "leaf of a fixed-size duplicate tree is not LEAF2"
                    : "LEAF2 page outside a fixed-size duplicate tree");
    if (leaf && fixed) {
        if (c->db.pad == 0 || c->db.pad > LIO_MAX_KEY_SIZE ||
            PAGEHDRSZ + (uint64_t)pg_numkeys(p) * c->db.pad > size)
            return fail(c, LIO_CORRUPTED, pgno,
                        "LEAF2 keys run past the page");
    }
    return LIO_SUCCESS;
}

/* Up to max children of `parent` from slot *i on in direction dir into
 * list; *more: whether any remain (then *i is the next). */
static size_t children_from(const uint8_t *parent, unsigned *i, int *more,
                            int dir, size_t max, uint64_t *list)
{
    unsigned n = pg_numkeys(parent);
    size_t m = 0;
    while (m < max && *more) {
        list[m++] = nd_child(pg_node(parent, *i));
        if (dir < 0 ? *i == 0 : *i + 1 >= n)
            *more = 0;
        else
            *i = dir < 0 ? *i - 1 : *i + 1;
    }
    return m;
}

/* Is page pg after page prev in file order, within the OS's read-ahead
 * window of it (a walk reading from prev to pg in file order has the OS
 * read pg ahead of it)? */
static int in_window(const lio_env *env, uint64_t prev, uint64_t pg)
{
    uint64_t reach = lio_os_window_pages(env);
    return reach && pg > prev && pg - prev <= reach;
}

/* Does a walk forward into leaf pgno read its way there through the file:
 * are the values of the leaf it leaves (still held at `level`) in overflow
 * runs that lie between that leaf and pgno, as an appending writer puts
 * them?  Then its reads go through the file in order, and the OS's
 * read-ahead follows them.  Where the walk starts (no leaf held), taken as
 * so: the next leaf it enters tells. */
static int reads_through(const tcursor *c, unsigned level, uint64_t pgno,
                         int dir)
{
    const uint8_t *p = c->pg[level], *nd;
    uint64_t prev = c->pgno[level], first;
    unsigned n;
    if (dir > 0 && !c->pin[level])
        return 1;
    if (dir <= 0 || p != c->pin[level]->data ||
        !(pg_flags(p) & P_LEAF) || is_leaf2(p) || prev >= pgno ||
        !(n = pg_numkeys(p)))
        return 0;
    nd = pg_node(p, n - 1);
    if (!(nd_flags(nd) & F_BIGDATA))
        return 0;
    first = ld64(nd_data(nd));
    return first > prev && first < pgno;
}

/* How far ahead of a walk in file order the blocks are asked for: at
 * least 8 MiB (with a small window, 4 and 16 MiB measured no different),
 * and twice the OS's own window where that is large (16 and 32 MiB
 * measured no different with an 8 MiB window), up to 32 MiB (a network
 * filesystem's window may be larger, and what a walk that stops early
 * asked for is read for nothing). */
#define WALK_LEAD_BYTES (8u << 20)
#define WALK_LEAD_MAX_BYTES (32u << 20)

/* Read-ahead that follows the tree: entering leaf pgno (not cached) from
 * slot ki of its parent, walking in direction dir, read it together with
 * the parent's next leaves that way.  In key order, wherever they sit in
 * the file: neighbours are read in one request, the rest concurrently. */
static void tree_prefetch(tcursor *c, unsigned level, uint64_t pgno, int dir)
{
    lio_cursor *cur = c->cur;
    lio_env *env = cur->env;
    const uint8_t *parent = c->pg[level - 1];
    unsigned i = c->ki[level - 1];
    int more = i < pg_numkeys(parent);
    uint64_t list[LIO_PREFETCH_MAX], after;
    size_t m, want = env->readahead_pages;
    int through, in_order;
    if (want < 2 || lio_page_cached(env, &cur->snap, pgno))
        return;
    if (want > LIO_PREFETCH_MAX)
        want = LIO_PREFETCH_MAX;
    m = children_from(parent, &i, &more, dir, want, list);
    /* (the next leaves follow this one in the file, few pages apart) */
    in_order = dir > 0 && m > 1 && list[m - 1] > pgno &&
               list[m - 1] - pgno < 2 * m;
    through = reads_through(c, level, pgno, dir);
    if (through && m > 1 && in_window(env, pgno, list[1])) {
        /* The OS's window brings these leaves as the walk reads toward
         * them.  From the device, read now only those next to this one
         * (one request): a read of its own for each of the others put 64
         * small requests among the window's large ones (leaves 630 KiB
         * apart, 3 KiB values between them: cold walks 10% slower).
         * Where the device score says the OS cache, those within its
         * window: the OS's read-ahead serving every read may be what
         * keeps the score there, and the 64 leaves reached 40 MiB past
         * the window (cold, that walk stalled 5-7 ms every 64 leaves);
         * leaves a few pages apart still come in one request (one a leaf
         * made a hot walk of 300k values of 100-3000 bytes 12% slower). */
        size_t k = 1;
        int device = lio_env_from_device(env);
        while (k < m && (device ? list[k] == list[k - 1] + 1
                                : in_window(env, pgno, list[k])))
            k++;
        /* (the leaves after these are the next ones to ask for) */
        i = c->ki[level - 1];
        more = i < pg_numkeys(parent);
        m = children_from(parent, &i, &more, dir, k, list);
    }
    /* A walk over keys alone where values fill most of the file: the
     * blocks around its leaves would be mostly values (8k keys among 553
     * MB of values in random key order, cold: 553 MB read for 0.7 MB of
     * leaves, 150 MB once the value runs were not read ahead); it reads
     * the leaves alone, the next ones with the next batch.  Leaves under
     * a fifth of the pages: a 2 MiB block costs about a hundred leaves
     * read alone, several in flight (a third of the values in runs next
     * to their leaves, 1.6 runs a leaf: 0.35 s with the blocks, 0.55 s
     * without). */
    if (cur->defer == LIO_VALUES_UNWANTED &&
        c->db.overflow_pages > 4 * c->db.leaf_pages) {
        lio_page_prefetch_alone(env, &cur->snap, list, m);
        return;
    }
    /* (where a walk meets values in one-page runs, the pages between
     * leaves that a request spans are likely more of them) */
    if (cur->page_values)
        lio_page_prefetch_with_gaps(env, &cur->snap, list, m);
    else
        lio_page_prefetch(env, &cur->snap, list, m);
    /* From the device, the leaves after these are asked for too, in the
     * background (lio_page_advise_around: the blocks around them), twice
     * as many each time the walk gets here, up to LIO_PREFETCH_MAX.
     * Where key order is not file order a parent's leaves lie all over
     * the file, and the walk read them a block at a time while it waited
     * (cold, 200k records of 800 bytes inserted in random key order,
     * fresh processes, medians of 5: 0.56 s against 0.67 before and
     * py-lmdb's 0.59). */
    if (!lio_env_from_device(env))
        return;
    /* Leaves in file order: keep the blocks up to the lead past this leaf
     * asked for.  With a small window (the OS reads 128 KiB ahead of reads
     * in file order by default) the parent's next leaves alone reached 1
     * MiB past it at best and nothing past the parent's last leaf: a cold
     * walk of 500k records of 800 bytes waited for the device at every
     * block (1.2-1.5 s against py-lmdb's 0.9-1.4, the device idle 70% of
     * the time).  With a large window the OS asks for its next window
     * only when the walk reaches the current one; 2 MiB blocks asked for
     * as the walk goes, twice that far, made the same walk 5-12% faster
     * (8 MiB window, 40 interleaved cold runs). */
    if (in_order) {
        uint64_t lead = 2 * lio_os_window_pages(env);
        if (lead < WALK_LEAD_BYTES / env->psize)
            lead = WALK_LEAD_BYTES / env->psize;
        if (lead > WALK_LEAD_MAX_BYTES / env->psize)
            lead = WALK_LEAD_MAX_BYTES / env->psize;
        lio_page_advise_ahead(env, &cur->snap, pgno, lead);
    }
    after = m ? list[m - 1] : pgno;
    cur->ahead = cur->ahead ? 2 * cur->ahead : want;
    if (cur->ahead > LIO_PREFETCH_MAX)
        cur->ahead = LIO_PREFETCH_MAX;
    m = children_from(parent, &i, &more, dir, cur->ahead, list);
    if (through) {
        /* Only the leaves the walk jumps to: those it reads its way to,
         * the OS's window brings (asking for their blocks put 40 MB of
         * reads ahead of the ones the walk waited for). */
        uint64_t prev = after, pg;
        size_t k = 0;
        for (size_t j = 0; j < m; j++, prev = pg)
            if (!in_window(env, prev, pg = list[j]))
                list[k++] = pg;
        m = k;
    }
    if (m)
        lio_page_advise_around(env, &cur->snap, pgno, list, m);
}

/* Put page pgno at stack slot `level` and make it the top.  dir: the walk
 * moves forward (1) or backward (-1) through the leaves, or seeks (0). */
static int push_page(tcursor *c, unsigned level, uint64_t pgno, int dir)
{
    lio_page *pg;
    int rc;
    if (level >= LIO_MAX_DEPTH || level >= c->db.depth)
        return fail(c, LIO_CORRUPTED, pgno,
                    "tree is deeper than its recorded depth");
    /* The page this level holds already (lookups in random order share
     * the upper branch pages): checked when it was pushed, still pinned. */
    if (c->pin[level] && c->pgno[level] == pgno && !c->subpage &&
        c->pg[level] == c->pin[level]->data) {
        c->ki[level] = 0;
        c->top = level;
        c->snum = level + 1;
        return LIO_SUCCESS;
    }
    /* Read ahead leaves only (branch pages are few and stay cached). */
    if (dir && level > 0 && level + 1 == c->db.depth && !c->subpage)
        tree_prefetch(c, level, pgno, dir);
    /* From a slow device, read around branch pages and the leaves a seek
     * lands on (tree_prefetch took care of a walk's leaves). */
    rc = lio_page_get(c->cur->env, &c->cur->snap, pgno,
                      (!dir || level + 1 < c->db.depth ? LIO_GET_AROUND : 0) |
                      (!dir && level > 0 && level + 1 == c->db.depth &&
                       !c->subpage ? LIO_GET_ONCE : 0) |
                      (c->dir && lio_leafdir_has_records(c->dir)
                       ? LIO_GET_SPARSE : 0),
                      &pg, &c->cur->err);
    if (rc)
        return rc;
    if ((rc = check_in_tree(c, pg->data, c->cur->env->psize, level, pgno))) {
        lio_page_unpin(c->cur->env, pg);
        return rc;
    }
    if (c->pin[level])
        lio_page_unpin(c->cur->env, c->pin[level]);
    c->pin[level] = pg;
    c->pg[level] = pg->data;
    c->pgno[level] = pgno;
    c->pgsize[level] = c->cur->env->psize;
    c->ki[level] = 0;
    c->top = level;
    c->snum = level + 1;
    return LIO_SUCCESS;
}

static void pop_page(tcursor *c)
{
    if (c->snum) {
        c->snum--;
        if (c->snum)
            c->top--;
    }
}

/* Binary search of the top page: the smallest entry >= key.  Sets ki[top];
 * returns 1 if such an entry exists. */
static int node_search(tcursor *c, const lio_val *key, int *exactp)
{
    const uint8_t *p = top_page(c);
    unsigned n = pg_numkeys(p), i = 0;
    int low = (pg_flags(p) & P_LEAF) ? 0 : 1, high = (int)n - 1, rc = 0;
    lio_val nk;
    while (low <= high) {
        i = (unsigned)(low + high) >> 1;
        node_key(c, p, i, &nk);
        rc = lio_cmp(c->cmp, key, &nk);
        if (rc == 0)
            break;
        if (rc > 0)
            low = (int)i + 1;
        else
            high = (int)i - 1;
    }
    if (rc > 0)
        i++;
    if (exactp)
        *exactp = rc == 0 && n > 0;
    c->ki[c->top] = i;
    return i < n;
}

/* From the current top page down to a leaf. */
static int search_from_top(tcursor *c, const lio_val *key, int first,
                           int last, int dir)
{
    int rc;
    for (;;) {
        const uint8_t *p = top_page(c);
        unsigned i, n = pg_numkeys(p);
        if (pg_flags(p) & P_LEAF)
            break;
        if (first || last) {
            i = last ? n - 1 : 0;
        } else {
            int exact;
            if (!node_search(c, key, &exact))
                i = n - 1;
            else {
                i = c->ki[c->top];
                if (!exact)
                    i--;
            }
        }
        c->ki[c->top] = i;
        if ((rc = push_page(c, c->top + 1, nd_child(pg_node(p, i)),
                            dir))) {
            c->flags &= ~(C_INITIALIZED | C_EOF);
            return rc;
        }
    }
    c->flags |= C_INITIALIZED;
    c->flags &= ~C_EOF;
    return LIO_SUCCESS;
}

/* mdb_page_search: from the root (reused if already at slot 0). */
static int page_search(tcursor *c, const lio_val *key, int first, int last)
{
    int rc;
    if (c->subpage) {
        c->snum = 1;
        c->top = 0;
    } else {
        if (c->db.root == LIO_EMPTY_ROOT)
            return LIO_NOTFOUND;
        if (c->dir && !first && !last) {
            /* the leaf the descent would reach, no branch page searched */
            if ((rc = push_page(c, c->db.depth - 1,
                                lio_leafdir_pgno(c->dir, c->dir_leaf), 0))) {
                c->flags &= ~(C_INITIALIZED | C_EOF);
                return rc;
            }
            c->flags |= C_INITIALIZED;
            c->flags &= ~C_EOF;
            return LIO_SUCCESS;
        }
        if (!(c->pin[0] && c->pgno[0] == c->db.root)) {
            if ((rc = push_page(c, 0, c->db.root, 0))) {
                c->flags &= ~(C_INITIALIZED | C_EOF);
                return rc;
            }
        }
        c->snum = 1;
        c->top = 0;
    }
    return search_from_top(c, key, first, last, first ? 1 : last ? -1 : 0);
}

/* Move the top page to its left or right neighbour through the parents. */
static int sibling(tcursor *c, int right)
{
    const uint8_t *parent;
    int rc;
    if (c->snum < 2)
        return LIO_NOTFOUND;
    pop_page(c);
    parent = top_page(c);
    if (right ? c->ki[c->top] + 1u >= pg_numkeys(parent)
              : c->ki[c->top] == 0) {
        if ((rc = sibling(c, right)) != LIO_SUCCESS) {
            c->top++;
            c->snum++;
            return rc;
        }
        parent = top_page(c);
    } else if (right) {
        c->ki[c->top]++;
    } else {
        c->ki[c->top]--;
    }
    rc = push_page(c, c->top + 1,
                   nd_child(pg_node(parent, c->ki[c->top])), right ? 1 : -1);
    if (rc) {
        c->flags &= ~(C_INITIALIZED | C_EOF);
        return rc;
    }
    if (!right)
        c->ki[c->top] = pg_numkeys(top_page(c)) - 1;
    return LIO_SUCCESS;
}

/* ---- node data ----------------------------------------------------------- */

/* A value in one overflow page, through the page cache: when the page is
 * not there, the one-page values of the leaf's next nodes (in the walk's
 * direction) are read with it (a scan of values just over half a page:
 * one read per batch instead of one per record).  NULL: read it
 * directly. */
static lio_page *one_page_value(tcursor *c, uint64_t pgno)
{
    lio_env *env = c->cur->env;
    lio_page *pg;
    if (env->readahead_pages < 2 || c->subpage)
        return NULL;
    if (!(pg = lio_page_peek(env, &c->cur->snap, pgno))) {
        const uint8_t *p = top_page(c);
        uint64_t list[LIO_PREFETCH_MAX];
        size_t m = 0, want = env->readahead_pages;
        unsigned n = pg_numkeys(p);
        if (want > LIO_PREFETCH_MAX)
            want = LIO_PREFETCH_MAX;
        list[m++] = pgno;
        /* the nodes this way (backward walks: those before) */
        for (unsigned i = c->ki[c->top]; m < want; ) {
            const uint8_t *nd;
            if (c->cur->walk < 0 ? i == 0 : i + 1 >= n)
                break;
            i = c->cur->walk < 0 ? i - 1 : i + 1;
            nd = pg_node(p, i);
            if ((nd_flags(nd) & F_BIGDATA) &&
                PAGEHDRSZ + (uint64_t)nd_dsize(nd) <= env->psize)
                list[m++] = ld64(nd_data(nd));
        }
        lio_page_prefetch(env, &c->cur->snap, list, m);
        pg = lio_page_peek(env, &c->cur->snap, pgno);
    }
    return pg;
}

/* A batch's runs may have this many pages between them (leaf and branch
 * pages that an appending writer put between values): read and dropped,
 * cheaper than a request of their own. */
#define BATCH_GAP_PAGES 8

/* From a device, a walk over values in overflow runs reads each run when
 * the value is asked for: one read in flight at a time, and no read-ahead
 * by the OS when the runs are not in file order.  So the runs of the
 * values the walk meets next in this leaf, up to RUNS_AHEAD_BYTES, are
 * advised to the storage (WILLNEED: the OS reads them in the background,
 * several at once), each once.  Runs out of file order (keys inserted in
 * random order) are asked for with the block around them, as a leaf is
 * (lio_page_advise_around), where the OS can keep what it reads: each
 * block holds values the walk reads later, as a mapping's page fault reads
 * around itself (cold, 50k values of 3 KB in random order, a 198 MB file,
 * fresh processes: 0.21 s against 0.49 s advising the runs alone, py-lmdb
 * 0.21 s). */
#define RUNS_AHEAD_BYTES (4u << 20)
#define RUNS_LISTED 256
static void advise_runs(tcursor *c)
{
    lio_cursor *cur = c->cur;
    lio_env *env = cur->env;
    const uint8_t *p = top_page(c);
    unsigned n = pg_numkeys(p), i = c->ki[c->top];
    uint64_t leaf = c->pgno[c->top], bytes = 0, reach, end;
    uint64_t listed[RUNS_LISTED];
    size_t m = 0;
    int dir = cur->walk, blocks;
    lio_executor ex;
    if (!dir || c->subpage || env->readahead_pages < 2 ||
        cur->defer == LIO_VALUES_UNWANTED || !lio_env_from_device(env))
        return;
    pthread_mutex_lock(&env->ra_lock);
    ex = env->ex;
    pthread_mutex_unlock(&env->ra_lock);
    if (!ex.advise)
        return;
    if (cur->adv_leaf != leaf || cur->adv_dir != dir ||
        (dir > 0 ? cur->adv_ki < i : cur->adv_ki > i))
        cur->adv_ki = i;        /* nothing ahead of i advised yet */
    /* Runs that follow each other in file order, with at most a batch's
     * gap between two (values_into reads through such gaps), are read in
     * file order: the OS's window follows them. */
    reach = dir > 0 && i < n && lio_os_window_pages(env) ? BATCH_GAP_PAGES
                                                         : 0;
    blocks = lio_env_fits_memory(env, &cur->snap);
    end = leaf + 1;
    if (reach) {
        const uint8_t *here = pg_node(p, i);
        if (nd_flags(here) & F_BIGDATA)
            end = ld64(nd_data(here)) + run_pages(cur, nd_dsize(here));
    }
    for (unsigned j = i; bytes < RUNS_AHEAD_BYTES; ) {
        const uint8_t *nd;
        uint64_t first, np;
        if (dir > 0 ? j + 1 >= n : j == 0)
            break;
        j = dir > 0 ? j + 1 : j - 1;
        nd = pg_node(p, j);
        if (!(nd_flags(nd) & F_BIGDATA))
            continue;
        first = ld64(nd_data(nd));
        np = run_pages(cur, nd_dsize(nd));
        bytes += np * env->psize;
        if (reach && first >= end && first - end <= reach) {
            end = first + np;
            continue;
        }
        reach = 0;   /* out of order once: advise the rest */
        if ((dir > 0 ? j <= cur->adv_ki : j >= cur->adv_ki) || first < 2 ||
            first > cur->snap.last_pg || np > cur->snap.last_pg - first + 1)
            continue;
        if (blocks && np <= BATCH_GAP_PAGES) {
            listed[m++] = first;
            if (m == RUNS_LISTED) {
                lio_page_advise_around(env, &cur->snap, leaf, listed, m);
                m = 0;
            }
        } else {
            ex.advise(ex.ctx, first * env->psize, np * env->psize,
                      LIO_ADVISE_WILLNEED);
        }
        cur->adv_ki = j;
    }
    if (m)
        lio_page_advise_around(env, &cur->snap, leaf, listed, m);
    cur->adv_leaf = leaf;
    cur->adv_dir = dir;
}

/* The checks of an overflow run's first page p (its header), which must
 * hold a value of `size` bytes. */
static int check_run(lio_cursor *cur, const uint8_t *p, uint64_t pgno,
                     uint32_t size)
{
    uint64_t need = run_pages(cur, size);
    if (pg_pgno(p) != pgno)
        return lio_fail(&cur->err, LIO_CORRUPTED, pgno, "page %llu: overflow "
                        "page carries another page number",
                        (unsigned long long)pgno);
    if ((pg_flags(p) & ~P_DIRTY) != P_OVERFLOW || (pg_flags(p) & P_DIRTY))
        return lio_fail(&cur->err, LIO_CORRUPTED, pgno,
                        "page %llu: flags 0x%x where an overflow page was "
                        "expected", (unsigned long long)pgno, pg_flags(p));
    if (pg_ovpages(p) < need)
        return lio_fail(&cur->err, LIO_CORRUPTED, pgno,
                        "page %llu: overflow run of %u pages cannot hold a "
                        "value of %u bytes", (unsigned long long)pgno,
                        pg_ovpages(p), size);
    return LIO_SUCCESS;
}

/* The value of node `leaf`, in an overflow run.  lazy: when the cursor
 * defers values (lio_cursor_defer_values) and the value is neither in the
 * page cache nor the last one read, leave it for lio_cursor_value_into
 * (data->data NULL); the checks that need no read are made now. */
static int read_overflow(tcursor *c, const uint8_t *leaf, lio_val *data,
                         int lazy)
{
    lio_cursor *cur = c->cur;
    lio_env *env = cur->env;
    uint64_t pgno = ld64(nd_data(leaf));
    uint32_t size = nd_dsize(leaf);
    uint64_t need = run_pages(cur, size);
    const uint8_t *p;
    int rc, batch = 1;

    /* Reuse the last value only for the same run and size: two nodes of a
     * damaged file may claim one run with different sizes (fuzzing). */
    if (cur->ov_pgno == pgno && cur->ov_pgno && cur->ov_size == size) {
        data->data = cur->ov_data;
        data->size = size;
        return LIO_SUCCESS;
    }
    cur->ov_pgno = 0;
    if (pgno < 2 || pgno > cur->snap.last_pg ||
        need > cur->snap.last_pg - pgno + 1)
        return lio_fail(&cur->err, pgno < 2 ? LIO_CORRUPTED
                        : LIO_PAGE_NOTFOUND, pgno,
                        "page %llu: overflow value of %u bytes (%llu pages) "
                        "runs past the snapshot's last page %llu",
                        (unsigned long long)pgno, size,
                        (unsigned long long)need,
                        (unsigned long long)cur->snap.last_pg);
    lio_page_unpin(env, cur->ov_pin);
    cur->ov_pin = NULL;
    if (need == 1 && cur->walk)
        cur->page_values = 1;
    if (need == 1 && cur->walk == 0) {
        /* A seek reads its neighbours' values with its own only when seeks
         * go key after key (a get loop in key order): a random lookup that
         * read a batch for one value was 17x slower than py-lmdb's. */
        unsigned ki = c->ki[c->top];
        /* (no leaf held: lio_get read the record alone) */
        batch = c->snum && cur->seek_leaf == c->pgno[c->top] &&
                ki == cur->seek_ki + 1;
        cur->seek_leaf = c->pgno[c->top];
        cur->seek_ki = ki;
    }
    /* (a walk that defers values reads them in batches of its own,
     * lio_cursor_values_into: one copy, not two through the cache) */
    if (need == 1 && batch && !(lazy && cur->defer && cur->walk > 0) &&
        (cur->ov_pin = one_page_value(c, pgno))) {
        p = cur->ov_pin->data;
    } else if (need == 1 && lazy && cur->defer && cur->walk > 0 &&
               (cur->ov_pin = lio_page_peek(env, &cur->snap, pgno))) {
        /* (read with the leaves, between them: lio_page_prefetch) */
        p = cur->ov_pin->data;
    } else if (lazy && cur->defer && size) {
        advise_runs(c);
        cur->pend_pgno = pgno;
        cur->pend_size = size;
        data->data = NULL;
        data->size = size;
        return LIO_SUCCESS;
    } else if ((rc = lio_read_into(env, pgno * env->psize,
                                   PAGEHDRSZ + (size_t)size, &cur->ovbuf,
                                   &cur->ovcap, &p, pgno, &cur->err))) {
        return rc;
    }
    if ((rc = check_run(cur, p, pgno, size)))
        return rc;
    cur->ov_pgno = pgno;
    cur->ov_size = size;
    cur->ov_data = p + PAGEHDRSZ;
    data->data = cur->ov_data;
    data->size = size;
    return LIO_SUCCESS;
}

/* A node's value; an overflow value may be left for the caller (lazy, as
 * read_overflow). */
static int node_read(tcursor *c, const uint8_t *leaf, lio_val *data,
                     int lazy)
{
    if (nd_flags(leaf) & F_BIGDATA)
        return read_overflow(c, leaf, data, lazy);
    data->size = nd_dsize(leaf);
    data->data = nd_data(leaf);
    return LIO_SUCCESS;
}

static void get_key(const uint8_t *leaf, lio_val *key)
{
    if (key) {
        key->size = nd_ksize(leaf);
        key->data = nd_key(leaf);
    }
}

/* The leaf node under the cursor, or NULL where liblmdb would read past the
 * page's nodes (after a failed search left ki == numkeys). */
static const uint8_t *cur_leaf(const tcursor *c)
{
    const uint8_t *p = top_page(c);
    if (is_leaf2(p) || c->ki[c->top] >= pg_numkeys(p))
        return NULL;
    return pg_node(p, c->ki[c->top]);
}

/* mdb_xcursor_init1: point the dup cursor at this node's duplicates. */
static int xcursor_init(tcursor *c, const uint8_t *leaf)
{
    tcursor *x = c->x;
    lio_cursor *cur = c->cur;
    uint64_t pgno = c->pgno[c->top];
    if (!x)
        return fail(c, LIO_CORRUPTED, pgno,
                    "node has F_DUPDATA in a database without DUPSORT");
    /* Until this succeeds the dup cursor points nowhere: a failed init must
     * not leave it on the previous node's duplicates with this node's
     * value size (GET_MULTIPLE read past the page; fuzzing). */
    release_levels(x, 0);
    x->flags = 0;
    x->snum = x->top = 0;
    x->subpage = 0;
    x->db.root = LIO_EMPTY_ROOT;
    if (nd_flags(leaf) & F_SUBDATA) {
        lio_dbrec rec;
        uint16_t want = (c->db.flags & LIO_DUPFIXED)
            ? (LIO_DUPFIXED | ((c->db.flags & LIO_INTEGERDUP) ? LIO_INTEGERKEY : 0))
            : 0;
        lio_parse_dbrec(nd_data(leaf), &rec);
        if (rec.flags != want || rec.root == LIO_EMPTY_ROOT || rec.depth == 0 ||
            rec.depth > LIO_MAX_DEPTH || rec.root < 2)
            return fail(c, LIO_CORRUPTED, pgno,
                        "duplicate sub-database record is impossible");
        release_levels(x, 0);
        x->db = rec;
        x->subpage = 0;
        x->snum = x->top = 0;
        x->flags = 0;
    } else {
        const uint8_t *fp = nd_data(leaf);
        uint32_t size = nd_dsize(leaf);
        int rc = lio_check_page(fp, size, pgno, 1, &cur->err);
        int fixed = (c->db.flags & LIO_DUPFIXED) != 0;
        if (rc)
            return rc;
        if (is_leaf2(fp) != fixed)
            return fail(c, LIO_CORRUPTED, pgno, fixed
                        ? "sub-page of a DUPFIXED database is not LEAF2"
                        : "LEAF2 sub-page in a database without DUPFIXED");
        release_levels(x, 0);
        memset(&x->db, 0, sizeof x->db);
        x->db.pad = pg_pad(top_page(c));
        x->db.depth = 1;
        x->db.leaf_pages = 1;
        x->db.entries = pg_numkeys(fp);
        x->db.root = pgno;
        if (fixed) {
            x->db.flags = LIO_DUPFIXED;
            x->db.pad = pg_pad(fp);
            if (c->db.flags & LIO_INTEGERDUP)
                x->db.flags |= LIO_INTEGERKEY;
            if (x->db.pad == 0 ||
                PAGEHDRSZ + (uint64_t)pg_numkeys(fp) * x->db.pad > size)
                return fail(c, LIO_CORRUPTED, pgno,
                            "LEAF2 sub-page keys run past the node");
        }
        /* Hold the leaf that contains the sub-page for as long as the dup
         * cursor points into it. */
        x->pin[0] = c->pin[c->top];
        if (x->pin[0]) {
            pthread_mutex_lock(&cur->env->lock);
            x->pin[0]->pins++;
            pthread_mutex_unlock(&cur->env->lock);
        }
        x->subpage = 1;
        x->snum = 1;
        x->top = 0;
        x->flags = C_INITIALIZED;
        x->pg[0] = fp;
        x->pgno[0] = pgno;
        x->pgsize[0] = size;
        x->ki[0] = 0;
    }
    return LIO_SUCCESS;
}

static void x_reset(tcursor *c)
{
    if (c->x)
        c->x->flags &= ~(C_INITIALIZED | C_EOF);
}

/* ---- movements ----------------------------------------------------------- */

static int cursor_first(tcursor *c, lio_val *key, lio_val *data);
static int cursor_last(tcursor *c, lio_val *key, lio_val *data);

static int leaf2_key(tcursor *c, lio_val *key)
{
    if (key)
        node_key(c, top_page(c), c->ki[c->top], key);
    return LIO_SUCCESS;
}

/* After landing on a node: set up its duplicates (first or last), read
 * its data and key. */
static int land(tcursor *c, const uint8_t *leaf, lio_val *key, lio_val *data,
                int dup_last)
{
    int rc;
    if (nd_flags(leaf) & F_DUPDATA) {
        if ((rc = xcursor_init(c, leaf)))
            return rc;
        rc = dup_last ? cursor_last(c->x, data, NULL)
                      : cursor_first(c->x, data, NULL);
        if (rc)
            return rc;
    } else if (data && (rc = node_read(c, leaf, data, 1))) {
        return rc;
    }
    get_key(leaf, key);
    return LIO_SUCCESS;
}

static int cursor_next(tcursor *c, lio_val *key, lio_val *data,
                       lio_cursor_op op)
{
    const uint8_t *p, *leaf;
    int rc;
    if (!(c->flags & C_INITIALIZED))
        return cursor_first(c, key, data);
    p = top_page(c);
    if (c->flags & C_EOF) {
        if (c->ki[c->top] + 1u >= pg_numkeys(p))
            return LIO_NOTFOUND;
        c->flags &= ~C_EOF;
    }
    if (c->db.flags & LIO_DUPSORT) {
        /* Past the last node liblmdb reads stale memory; we read it as a
         * node without duplicates. */
        leaf = cur_leaf(c);
        if (leaf && (nd_flags(leaf) & F_DUPDATA)) {
            if (op == LIO_NEXT || op == LIO_NEXT_DUP) {
                rc = cursor_next(c->x, data, NULL, LIO_NEXT);
                if (op != LIO_NEXT || rc != LIO_NOTFOUND) {
                    if (rc == LIO_SUCCESS)
                        get_key(leaf, key);
                    return rc;
                }
            }
        } else {
            x_reset(c);
            if (op == LIO_NEXT_DUP)
                return LIO_NOTFOUND;
        }
    }
    if (c->ki[c->top] + 1u >= pg_numkeys(p)) {
        if ((rc = sibling(c, 1)) != LIO_SUCCESS) {
            c->flags |= C_EOF;
            return rc;
        }
        p = top_page(c);
    } else {
        c->ki[c->top]++;
    }
    if (is_leaf2(p))
        return leaf2_key(c, key);
    return land(c, pg_node(p, c->ki[c->top]), key, data, 0);
}

static int cursor_prev(tcursor *c, lio_val *key, lio_val *data,
                       lio_cursor_op op)
{
    const uint8_t *p, *leaf;
    int rc;
    if (!(c->flags & C_INITIALIZED)) {
        if ((rc = cursor_last(c, key, data)))
            return rc;
        c->ki[c->top]++;
    }
    p = top_page(c);
    if ((c->db.flags & LIO_DUPSORT) && (leaf = cur_leaf(c))) {
        if (nd_flags(leaf) & F_DUPDATA) {
            if (op == LIO_PREV || op == LIO_PREV_DUP) {
                rc = cursor_prev(c->x, data, NULL, LIO_PREV);
                if (op != LIO_PREV || rc != LIO_NOTFOUND) {
                    if (rc == LIO_SUCCESS) {
                        get_key(leaf, key);
                        c->flags &= ~C_EOF;
                    }
                    return rc;
                }
            }
        } else {
            x_reset(c);
            if (op == LIO_PREV_DUP)
                return LIO_NOTFOUND;
        }
    }
    c->flags &= ~C_EOF;
    if (c->ki[c->top] == 0) {
        if ((rc = sibling(c, 0)) != LIO_SUCCESS)
            return rc;
        p = top_page(c);
        c->ki[c->top] = pg_numkeys(p) - 1;
    } else {
        c->ki[c->top]--;
    }
    if (c->ki[c->top] >= pg_numkeys(p))
        return fail(c, LIO_CORRUPTED, c->pgno[c->top],
                    "cursor index past the page's nodes");
    if (is_leaf2(p))
        return leaf2_key(c, key);
    return land(c, pg_node(p, c->ki[c->top]), key, data, 1);
}

static int cursor_first(tcursor *c, lio_val *key, lio_val *data)
{
    const uint8_t *p;
    int rc;
    x_reset(c);
    if (!(c->flags & C_INITIALIZED) || c->top) {
        if ((rc = page_search(c, NULL, 1, 0)))
            return rc;
    }
    p = top_page(c);
    c->flags |= C_INITIALIZED;
    c->flags &= ~C_EOF;
    c->ki[c->top] = 0;
    if (is_leaf2(p))
        return leaf2_key(c, key);
    return land(c, pg_node(p, 0), key, data, 0);
}

static int cursor_last(tcursor *c, lio_val *key, lio_val *data)
{
    const uint8_t *p;
    int rc;
    x_reset(c);
    if (!(c->flags & C_INITIALIZED) || c->top) {
        if ((rc = page_search(c, NULL, 0, 1)))
            return rc;
    }
    p = top_page(c);
    c->ki[c->top] = pg_numkeys(p) - 1;
    c->flags |= C_INITIALIZED | C_EOF;
    if (is_leaf2(p))
        return leaf2_key(c, key);
    return land(c, pg_node(p, c->ki[c->top]), key, data, 1);
}

/* mdb_cursor_set.  exactp NULL for SET_RANGE. */
static int cursor_set(tcursor *c, lio_val *key, lio_val *data,
                      lio_cursor_op op, int *exactp)
{
    const uint8_t *p, *leaf = NULL;
    int rc;
    lio_val nk;

    if (key->size == 0)
        return LIO_BAD_VALSIZE;
    x_reset(c);
    if (c->flags & C_INITIALIZED) {
        unsigned n;
        p = top_page(c);
        n = pg_numkeys(p);
        node_key(c, p, 0, &nk);
        rc = lio_cmp(c->cmp, key, &nk);
        if (rc == 0) {
            c->ki[c->top] = 0;
            if (exactp)
                *exactp = 1;
            goto set1;
        }
        if (rc > 0) {
            unsigned i;
            if (n > 1) {
                node_key(c, p, n - 1, &nk);
                rc = lio_cmp(c->cmp, key, &nk);
                if (rc == 0) {
                    c->ki[c->top] = n - 1;
                    if (exactp)
                        *exactp = 1;
                    goto set1;
                }
                if (rc < 0) {
                    if (c->ki[c->top] < n) {
                        node_key(c, p, c->ki[c->top], &nk);
                        if (lio_cmp(c->cmp, key, &nk) == 0) {
                            if (exactp)
                                *exactp = 1;
                            goto set1;
                        }
                    }
                    c->flags &= ~C_EOF;
                    goto set2;
                }
            }
            for (i = 0; i < c->top; i++)
                if (c->ki[i] < pg_numkeys(c->pg[i]) - 1)
                    break;
            if (i == c->top) {
                c->ki[c->top] = n;
                return LIO_NOTFOUND;
            }
        }
        if (!c->top) {
            c->ki[c->top] = 0;
            if (op == LIO_SET_RANGE && !exactp)
                goto set1;
            return LIO_NOTFOUND;
        }
    }
    if ((rc = page_search(c, key, 0, 0)))
        return rc;
    p = top_page(c);

set2:
    if (!node_search(c, key, exactp)) {
        if (exactp && !*exactp)
            return LIO_NOTFOUND;
        if ((rc = sibling(c, 1)) != LIO_SUCCESS) {
            c->flags |= C_EOF;
            return rc;
        }
        p = top_page(c);
        c->ki[c->top] = 0;
    } else if (exactp && !*exactp) {
        return LIO_NOTFOUND;
    }

set1:
    p = top_page(c);
    c->flags |= C_INITIALIZED;
    c->flags &= ~C_EOF;
    if (is_leaf2(p)) {
        if (op == LIO_SET_RANGE || op == LIO_SET_KEY)
            node_key(c, p, c->ki[c->top], key);
        return LIO_SUCCESS;
    }
    leaf = pg_node(p, c->ki[c->top]);
    rc = LIO_SUCCESS;
    if (nd_flags(leaf) & F_DUPDATA) {
        if ((rc = xcursor_init(c, leaf)))
            return rc;
        if (op == LIO_SET || op == LIO_SET_KEY || op == LIO_SET_RANGE) {
            rc = cursor_first(c->x, data, NULL);
        } else {
            int ex2 = 0;
            rc = cursor_set(c->x, data, NULL, LIO_SET_RANGE,
                            op == LIO_GET_BOTH ? &ex2 : NULL);
            if (rc)
                return rc;
        }
    } else if (data) {
        if (op == LIO_GET_BOTH || op == LIO_GET_BOTH_RANGE) {
            lio_val d2;
            /* (compared here: read now) */
            if ((rc = node_read(c, leaf, &d2, 0)))
                return rc;
            rc = lio_cmp(c->cur->dcmp, data, &d2);
            if (rc) {
                if (op == LIO_GET_BOTH || rc > 0)
                    return LIO_NOTFOUND;
                rc = 0;
            }
            *data = d2;
        } else {
            x_reset(c);
            if ((rc = node_read(c, leaf, data, 1)))
                return rc;
        }
    }
    if (op == LIO_SET_RANGE || op == LIO_SET_KEY)
        get_key(leaf, key);
    return rc;
}

/* GET_CURRENT for one tree level (recurses into the dup cursor). */
static int cursor_current(tcursor *c, lio_val *key, lio_val *data)
{
    const uint8_t *p, *leaf;
    unsigned n;
    if (!(c->flags & C_INITIALIZED))
        return LIO_EINVAL;
    p = top_page(c);
    n = pg_numkeys(p);
    if (!n || c->ki[c->top] >= n) {
        c->ki[c->top] = n;
        return LIO_NOTFOUND;
    }
    if (is_leaf2(p))
        return leaf2_key(c, key);
    leaf = pg_node(p, c->ki[c->top]);
    get_key(leaf, key);
    if (data) {
        if (nd_flags(leaf) & F_DUPDATA) {
            if (!c->x)
                return fail(c, LIO_CORRUPTED, c->pgno[c->top],
                            "node has F_DUPDATA in a database without "
                            "DUPSORT");
            return cursor_current(c->x, data, NULL);
        }
        return node_read(c, leaf, data, 1);
    }
    return LIO_SUCCESS;
}

/* The dup cursor's page as one block of fixed-size values. */
static int fetch_multiple(tcursor *c, lio_val *data)
{
    tcursor *x = c->x;
    const uint8_t *p = top_page(x);
    data->size = (size_t)pg_numkeys(p) * x->db.pad;
    data->data = p + PAGEHDRSZ;
    x->ki[x->top] = pg_numkeys(p) - 1;
    return LIO_SUCCESS;
}

static int dup_move(tcursor *c, lio_val *key, lio_val *data, int last)
{
    const uint8_t *p, *leaf;
    if (!data || !(c->flags & C_INITIALIZED))
        return LIO_EINVAL;
    if (!c->x)
        return LIO_INCOMPATIBLE;
    p = top_page(c);
    if (c->ki[c->top] >= pg_numkeys(p)) {
        c->ki[c->top] = pg_numkeys(p);
        return LIO_NOTFOUND;
    }
    c->flags &= ~C_EOF;
    leaf = cur_leaf(c);
    if (!(nd_flags(leaf) & F_DUPDATA)) {
        get_key(leaf, key);
        return node_read(c, leaf, data, 1);
    }
    if (!(c->x->flags & C_INITIALIZED))
        return LIO_EINVAL;
    return last ? cursor_last(c->x, data, NULL)
                : cursor_first(c->x, data, NULL);
}

int lio_cursor_get(lio_cursor *cur, lio_val *key, lio_val *data,
                   lio_cursor_op op)
{
    tcursor *c = &cur->mc;
    int rc, exact = 0;

    cur->err.code = 0;
    /* (a scan starts with FIRST or LAST) */
    cur->walk = op == LIO_NEXT || op == LIO_NEXT_NODUP || op == LIO_FIRST ? 1
                : op == LIO_PREV || op == LIO_PREV_NODUP || op == LIO_LAST
                ? -1 : 0;
    if (cur->walk == 0 || op == LIO_FIRST || op == LIO_LAST)
        cur->ahead = 0;
    switch (op) {
    case LIO_GET_CURRENT:
        rc = cursor_current(c, key, data);
        break;
    case LIO_GET_BOTH:
    case LIO_GET_BOTH_RANGE:
        if (!data) {
            rc = LIO_EINVAL;
            break;
        }
        if (!c->x) {
            rc = LIO_INCOMPATIBLE;
            break;
        }
        /* fall through */
    case LIO_SET:
    case LIO_SET_KEY:
    case LIO_SET_RANGE:
        if (!key)
            rc = LIO_EINVAL;
        else
            rc = cursor_set(c, key, data, op,
                            op == LIO_SET_RANGE ? NULL : &exact);
        break;
    case LIO_GET_MULTIPLE:
        if (!data || !(c->flags & C_INITIALIZED)) {
            rc = LIO_EINVAL;
            break;
        }
        if (!(c->db.flags & LIO_DUPFIXED)) {
            rc = LIO_INCOMPATIBLE;
            break;
        }
        rc = LIO_SUCCESS;
        if ((c->x->flags & (C_INITIALIZED | C_EOF)) == C_INITIALIZED)
            rc = fetch_multiple(c, data);
        break;
    case LIO_NEXT_MULTIPLE:
    case LIO_PREV_MULTIPLE:
        if (!data) {
            rc = LIO_EINVAL;
            break;
        }
        if (!(c->db.flags & LIO_DUPFIXED)) {
            rc = LIO_INCOMPATIBLE;
            break;
        }
        if (op == LIO_NEXT_MULTIPLE) {
            rc = cursor_next(c, key, data, LIO_NEXT_DUP);
        } else {
            rc = (c->flags & C_INITIALIZED) ? LIO_SUCCESS
                                            : cursor_last(c, key, data);
            if (rc == LIO_SUCCESS && (c->x->flags & C_INITIALIZED)) {
                rc = sibling(c->x, 0);
                if (rc == LIO_SUCCESS)
                    rc = fetch_multiple(c, data);
                break;
            }
        }
        if (rc == LIO_SUCCESS) {
            if (c->x->flags & C_INITIALIZED)
                rc = fetch_multiple(c, data);
            else
                rc = LIO_NOTFOUND;
        }
        break;
    case LIO_NEXT:
    case LIO_NEXT_DUP:
    case LIO_NEXT_NODUP:
        rc = cursor_next(c, key, data, op);
        break;
    case LIO_PREV:
    case LIO_PREV_DUP:
    case LIO_PREV_NODUP:
        rc = cursor_prev(c, key, data, op);
        break;
    case LIO_FIRST:
        rc = cursor_first(c, key, data);
        break;
    case LIO_LAST:
        rc = cursor_last(c, key, data);
        break;
    case LIO_FIRST_DUP:
        rc = dup_move(c, key, data, 0);
        break;
    case LIO_LAST_DUP:
        rc = dup_move(c, key, data, 1);
        break;
    default:
        rc = LIO_EINVAL;
    }
    if (rc < 0 && rc != LIO_NOTFOUND && cur->err.code == 0) {
        /* Argument errors carry no page: describe them anyway. */
        lio_fail(&cur->err, rc, LIO_NO_PAGE, "%s",
                 rc == LIO_BAD_VALSIZE ? "key size is zero or too large"
                 : rc == LIO_INCOMPATIBLE ? "operation needs a DUPSORT / "
                   "DUPFIXED database"
                 : "invalid cursor operation for the cursor's state");
    }
    return rc;
}

/* The common step of a scan, for callers that keep their own lock held
 * (the Python binding keeps the GIL): NEXT or PREV to a neighbour inside
 * the current leaf whose value sits in the page.  Everything cursor_next /
 * cursor_prev would do beyond that (another page, duplicates, an overflow
 * run, the end) is left to lio_cursor_get: this answers 0 and changes
 * nothing.  No lock is taken and no byte is read. */
int lio_cursor_step(lio_cursor *cur, lio_val *key, lio_val *data, int forward)
{
    tcursor *c = &cur->mc;
    const uint8_t *p, *nd;
    unsigned n, ki, to;
    if ((c->flags & (C_INITIALIZED | C_EOF)) != C_INITIALIZED || !c->snum)
        return 0;
    p = top_page(c);
    if (is_leaf2(p) || !(pg_flags(p) & P_LEAF))
        return 0;
    n = pg_numkeys(p);
    ki = c->ki[c->top];
    if (ki >= n)
        return 0;
    if (forward) {
        if (ki + 1u >= n)
            return 0;
        to = ki + 1;
    } else {
        if (ki == 0)
            return 0;
        to = ki - 1;
    }
    if ((c->db.flags & LIO_DUPSORT) &&
        (nd_flags(pg_node(p, ki)) & F_DUPDATA))
        return 0;
    nd = pg_node(p, to);
    if (nd_flags(nd) & F_DUPDATA)
        return 0;
    if (nd_flags(nd) & F_BIGDATA) {
        /* What read_overflow does for a walk that defers values, when the
         * run passes the checks that need no read; the rest (and every
         * error) is lio_cursor_get's. */
        uint64_t pgno = ld64(nd_data(nd)), need;
        uint32_t size = nd_dsize(nd);
        if (!cur->defer || !forward || c->subpage || cur->ov_pin || !size)
            return 0;
        need = run_pages(cur, size);
        if (pgno < 2 || pgno > cur->snap.last_pg ||
            need > cur->snap.last_pg - pgno + 1)
            return 0;
        x_reset(c);
        c->ki[c->top] = to;
        cur->err.code = 0;
        cur->walk = 1;
        cur->ov_pgno = 0;
        advise_runs(c);
        cur->pend_pgno = pgno;
        cur->pend_size = size;
        key->size = nd_ksize(nd);
        key->data = nd_key(nd);
        data->size = size;
        data->data = NULL;
        return 1;
    }
    x_reset(c);
    c->ki[c->top] = to;
    cur->err.code = 0;
    key->size = nd_ksize(nd);
    key->data = nd_key(nd);
    data->size = nd_dsize(nd);
    data->data = nd_data(nd);
    return 1;
}

static int in_top_page(const tcursor *c, const lio_val *v)
{
    const uint8_t *p;
    if (!c->snum)
        return 0;
    p = c->pg[c->top];
    return v->data >= p && v->size <= c->pgsize[c->top] &&
           v->data + v->size <= p + c->pgsize[c->top];
}

int lio_cursor_in_page(const lio_cursor *cur, const lio_val *v)
{
    return v->data && (in_top_page(&cur->mc, v) ||
                       (cur->mc.x && in_top_page(cur->mc.x, v)));
}

int lio_cursor_count(lio_cursor *cur, uint64_t *count)
{
    tcursor *c = &cur->mc;
    const uint8_t *leaf;
    cur->err.code = 0;
    if (!c->x)
        return LIO_INCOMPATIBLE;
    if (!(c->flags & C_INITIALIZED))
        return LIO_EINVAL;
    if (!c->snum)
        return LIO_NOTFOUND;
    if (c->flags & C_EOF) {
        /* liblmdb 0.9.3x: at the end, count the last item (and forget EOF) */
        if (c->ki[c->top] >= pg_numkeys(top_page(c)))
            return LIO_NOTFOUND;
        c->flags &= ~C_EOF;
    }
    leaf = cur_leaf(c); /* NULL past the last node: as in cursor_next */
    if (!leaf || !(nd_flags(leaf) & F_DUPDATA)) {
        *count = 1;
    } else {
        if (!(c->x->flags & C_INITIALIZED))
            return LIO_EINVAL;
        *count = c->x->db.entries;
    }
    return LIO_SUCCESS;
}

/* get_by_record found no record of the key in the table.  (Above every
 * LIO_ code: as LIO_SYSERR's -1, it took a failed read of the record for
 * an absent key.) */
#define NOT_IN_TABLE 1
/* Read the page: a record read did not match its slot, or its leaf is
 * part of a working set. */
#define READ_THE_PAGE 2

/* lio_get from the directory's record table: one read of the record.  The
 * leaf's page, read by the lookup that noted its records, was checked;
 * the record read now is checked against its slot (a file changed under a
 * reader without a lock reads the page instead). */
static int get_by_record(lio_cursor *cur, const lio_val *key, lio_val *data)
{
    lio_env *env = cur->env;
    uint64_t h = lio_key_hash(key);
    size_t pos = (size_t)-1;
    lio_recspan r;
    while (lio_leafdir_next_record(cur->dir, h, &pos, &r)) {
        const uint8_t *nd;
        uint16_t flags;
        int rc;
        if (lio_leafdir_working_set(cur->dir, pos))
            return READ_THE_PAGE;   /* the page cache keeps those */
        if ((rc = lio_read_into(env, r.pgno * env->psize + r.off, r.len,
                                &cur->nodebuf, &cur->nodecap, &nd, r.pgno,
                                &cur->err)))
            return rc;
        flags = nd_flags(nd);
        if ((flags & ~F_BIGDATA) || nd_span(nd) != r.len)
            return READ_THE_PAGE;
        if (nd_ksize(nd) != key->size ||
            memcmp(nd_key(nd), key->data, key->size))
            continue;               /* another key with the same print */
        if (flags & F_BIGDATA)
            return read_overflow(&cur->mc, nd, data, 1);
        data->data = nd_data(nd);
        data->size = nd_dsize(nd);
        return LIO_SUCCESS;
    }
    return NOT_IN_TABLE;
}

int lio_get(lio_cursor *cur, const lio_val *key, lio_val *data)
{
    tcursor *c = &cur->mc;
    lio_val k = *key;
    int exact = 0, rc;
    cur->err.code = 0;
    cur->walk = 0;
    /* mdb_get starts from a fresh cursor; the pinned root stays usable. */
    c->flags = 0;
    c->snum = c->top = 0;
    x_reset(c);
    if (!cur->dir && cur->dir_ask)
        cur->dir_ask = lio_leafdir_get(cur->env, &cur->snap, &c->db,
                                       &cur->dir);
    c->dir = cur->dir;
    if (c->dir && key->size) {
        int table = data && lio_leafdir_has_records(c->dir);
        rc = table ? get_by_record(cur, key, data) : NOT_IN_TABLE;
        if (rc != NOT_IN_TABLE && rc != READ_THE_PAGE) {
            c->dir = NULL;
            cur->record_gets += rc == LIO_SUCCESS;
            return rc;
        }
        c->dir_leaf = lio_leafdir_find(c->dir, key);
        if (table && rc == NOT_IN_TABLE &&
            lio_leafdir_noted(c->dir, c->dir_leaf)) {
            /* its leaf's records are all in the table: no such key, unless
             * they were noted since the probe above (by another thread, or
             * the scan): the tag is published after its slots */
            rc = get_by_record(cur, key, data);
            if (rc != READ_THE_PAGE) {
                c->dir = NULL;
                cur->record_gets += rc == LIO_SUCCESS || rc == NOT_IN_TABLE;
                return rc == NOT_IN_TABLE ? LIO_NOTFOUND : rc;
            }
        }
        cur->err.code = 0;
    } else {
        c->dir = NULL;          /* (an empty key: cursor_set says so) */
    }
    rc = cursor_set(c, &k, data, LIO_SET, &exact);
    if (c->dir) {
        /* note where the leaf's records sit, for the next lookups */
        if ((rc == LIO_SUCCESS || rc == LIO_NOTFOUND) && !c->subpage &&
            c->snum == c->db.depth &&
            c->pgno[c->top] == lio_leafdir_pgno(c->dir, c->dir_leaf))
            lio_leafdir_note(cur->env, cur->dir, c->dir_leaf, c->pg[c->top],
                             cur->env->psize);
        /* the levels above the leaf are stale: the next positioning
         * descends from the root */
        c->dir = NULL;
        c->flags &= ~C_INITIALIZED;
    }
    return rc;
}

int lio_cursor_has_leafdir(const lio_cursor *cur) { return cur->dir != NULL; }

uint64_t lio_cursor_leaves_scanned(lio_cursor *cur)
{
    return cur->dir ? lio_leafdir_scan_wait(cur->env, cur->dir) : 0;
}

uint64_t lio_cursor_gets_by_record(const lio_cursor *cur)
{
    return cur->record_gets;
}

const lio_error *lio_cursor_error(const lio_cursor *cur) { return &cur->err; }

void lio_cursor_defer_values(lio_cursor *cur, int on)
{
    /* Under O_DIRECT reads need aligned memory, which the caller's is not:
     * there values are read as before (into the cursor's aligned buffer,
     * then copied by the caller). */
    cur->defer = cur->env->align <= 1 ? on : 0;
}

int lio_cursor_value_into(lio_cursor *cur, void *dst)
{
    uint8_t hdr[PAGEHDRSZ];
    lio_seg segs[2];
    uint64_t pgno = cur->pend_pgno;
    int rc;
    cur->err.code = 0;
    if (!pgno)
        return lio_fail(&cur->err, LIO_EINVAL, LIO_NO_PAGE,
                        "no value is waiting to be read");
    /* A one-page run read with the leaves (lio_page_prefetch_with_gaps),
     * from the cache.  Values a walk reads one at a time come here; read
     * again from the file, their copies stayed in the cache unused: a hot
     * walk over 300k Datums of 100-3000 bytes (678 MB) made 13.0k read
     * calls for 703 MB and took 192 ms, now 2.9k calls for 678 MB and
     * 156 ms (py-lmdb 182), its cache 10.5k pages smaller (fresh memory,
     * a page fault each). */
    if (cur->page_values && PAGEHDRSZ + (uint64_t)cur->pend_size <=
        cur->env->psize) {
        lio_page *pg = lio_page_peek(cur->env, &cur->snap, pgno);
        if (pg) {
            rc = check_run(cur, pg->data, pgno, cur->pend_size);
            if (rc == LIO_SUCCESS)
                memcpy(dst, pg->data + PAGEHDRSZ, cur->pend_size);
            lio_page_unpin(cur->env, pg);
            return rc;
        }
    }
    /* The run's header and the value in one request: the value straight
     * into dst, the header beside it to be checked. */
    segs[0].dst = hdr;
    segs[0].len = PAGEHDRSZ;
    segs[1].dst = dst;
    segs[1].len = cur->pend_size;
    if ((rc = lio_read_segs(cur->env, pgno * cur->env->psize, segs, 2, pgno,
                            &cur->err)))
        return rc;
    return check_run(cur, hdr, pgno, cur->pend_size);
}

uint64_t lio_cursor_pending(const lio_cursor *cur, uint32_t *size)
{
    *size = cur->pend_size;
    return cur->pend_pgno;
}


/* The leaf a forward walk's pending value was left in, and the node it
 * belongs to (*i of *n): 0, or -1 when a batch of values cannot follow it
 * (no forward walk, a sub-page, another node). */
static int pending_leaf(lio_cursor *cur, size_t max_value, const uint8_t **p,
                        unsigned *i, unsigned *n)
{
    tcursor *c = &cur->mc;
    if (cur->walk <= 0 || c->subpage || !c->snum ||
        cur->pend_size > max_value)
        return -1;
    *p = top_page(c);
    if (!(pg_flags(*p) & P_LEAF) || is_leaf2(*p))
        return -1;
    *n = pg_numkeys(*p);
    *i = c->ki[c->top];
    if (*i >= *n || !(nd_flags(pg_node(*p, *i)) & F_BIGDATA) ||
        ld64(nd_data(pg_node(*p, *i))) != cur->pend_pgno)
        return -1;
    return 0;
}

/* Whether a node's run lies inside the snapshot. */
static int run_inside(const lio_cursor *cur, uint64_t pgno, uint64_t need)
{
    return pgno >= 2 && pgno <= cur->snap.last_pg &&
           need <= cur->snap.last_pg - pgno + 1;
}

size_t lio_cursor_plan_values(lio_cursor *cur, lio_value_run *runs,
                              size_t max, size_t max_bytes)
{
    const uint8_t *p;
    uint64_t psize = cur->env->psize, end, first;
    unsigned n, i;
    size_t m = 0;
    if (!cur->pend_pgno || !max)
        return 0;
    runs[m].pgno = cur->pend_pgno;
    runs[m++].size = cur->pend_size;
    if (max > LIO_VALUES_MAX)
        max = LIO_VALUES_MAX;
    if (pending_leaf(cur, LIO_BATCH_VALUE_MAX, &p, &i, &n))
        return m;
    first = cur->pend_pgno;
    end = cur->pend_pgno + run_pages(cur, cur->pend_size);
    while (m < max && ++i < n) {
        const uint8_t *nd = pg_node(p, i);
        uint64_t pgno, need;
        uint32_t size;
        if (!(nd_flags(nd) & F_BIGDATA))
            continue;   /* in the leaf: no read */
        pgno = ld64(nd_data(nd));
        size = nd_dsize(nd);
        need = run_pages(cur, size);
        /* in order, close behind, within the snapshot, and the span */
        if (!size || size > LIO_BATCH_VALUE_MAX || pgno < end ||
            pgno - end > BATCH_GAP_PAGES || !run_inside(cur, pgno, need) ||
            (pgno + need - first) * psize > max_bytes)
            break;
        runs[m].pgno = pgno;
        runs[m++].size = size;
        end = pgno + need;
    }
    return m;
}

size_t lio_cursor_plan_ahead(lio_cursor *cur, lio_value_run *runs,
                             size_t max, size_t max_bytes)
{
    const uint8_t *p;
    unsigned n, i;
    size_t m = 0;
    uint64_t bytes;
    if (!cur->pend_pgno || !max)
        return 0;
    runs[m].pgno = cur->pend_pgno;
    runs[m++].size = cur->pend_size;
    if (max > LIO_AHEAD_MAX + 1)
        max = LIO_AHEAD_MAX + 1;
    if (cur->env->align > 1 ||
        pending_leaf(cur, LIO_BATCH_VALUE_MAX, &p, &i, &n))
        return m;
    bytes = cur->pend_size;
    while (m < max && ++i < n) {
        const uint8_t *nd = pg_node(p, i);
        uint64_t pgno, end;
        uint32_t size;
        if (!(nd_flags(nd) & F_BIGDATA))
            continue;
        pgno = ld64(nd_data(nd));
        size = nd_dsize(nd);
        if (!size || size > LIO_BATCH_VALUE_MAX || bytes + size > max_bytes ||
            !run_inside(cur, pgno, run_pages(cur, size)))
            break;
        /* Runs back in file order (one just after the last): from the
         * last on, lio_cursor_plan_values reads them several a request
         * (a layout in file order but for a run here and there: the
         * worker reading them one by one made a walk 8% slower). */
        end = runs[m - 1].pgno + run_pages(cur, runs[m - 1].size);
        if (pgno >= end && pgno - end <= BATCH_GAP_PAGES) {
            if (m > 1)
                m--;
            break;
        }
        runs[m].pgno = pgno;
        runs[m++].size = size;
        bytes += size;
    }
    return m;
}

int lio_cursor_values_ahead(lio_cursor *cur, const lio_value_run *runs,
                            size_t n, void *const *dsts)
{
    if (!cur->worker && !(cur->worker = lio_ahead_new(cur->env)))
        return -1;
    return lio_ahead_post(cur->worker, runs, n, dsts);
}

int lio_cursor_value_ahead(lio_cursor *cur, size_t i)
{
    const uint8_t *hdr;
    const lio_value_run *run;
    lio_error err;
    if (!cur->worker || !(run = lio_ahead_run(cur->worker, i)) ||
        !(hdr = lio_ahead_take(cur->worker, i, &err)))
        return -1;
    return check_run(cur, hdr, run->pgno, run->size) ? -1 : 0;
}

void lio_cursor_values_ahead_drop(lio_cursor *cur)
{
    lio_ahead_drop(cur->worker);
}

/* The batch's values when each is a one-page run the cache holds (read
 * with the leaves around it: lio_page_prefetch_with_gaps), copied from
 * there; 0 (nothing done) if any is not.  *good as lio_cursor_values_into
 * sets it. */
static int values_from_cache(lio_cursor *cur, const lio_value_run *runs,
                             size_t n, void *const *dsts, size_t *good)
{
    lio_page *pg[LIO_VALUES_MAX];
    size_t k;
    for (k = 0; k < n; k++)
        if (PAGEHDRSZ + (uint64_t)runs[k].size > cur->env->psize ||
            !(pg[k] = lio_page_peek(cur->env, &cur->snap, runs[k].pgno)))
            break;
    if (k < n) {
        while (k--)
            lio_page_unpin(cur->env, pg[k]);
        return 0;
    }
    for (k = 0; k < n; k++) {
        if (check_run(cur, pg[k]->data, runs[k].pgno, runs[k].size)) {
            cur->err.code = 0;   /* raised when the cursor gets there */
            break;
        }
        memcpy(dsts[k], pg[k]->data + PAGEHDRSZ, runs[k].size);
        *good = k + 1;
    }
    for (k = 0; k < n; k++)
        lio_page_unpin(cur->env, pg[k]);
    return 1;
}

int lio_cursor_values_into(lio_cursor *cur, const lio_value_run *runs,
                           size_t n, void *const *dsts, size_t *good)
{
    uint64_t psize = cur->env->psize, pos;
    uint8_t hdrs[LIO_VALUES_MAX][PAGEHDRSZ];
    lio_seg segs[LIO_READV_MAX];
    size_t nseg = 0, gap_most = 0;
    int rc;
    *good = 0;
    cur->err.code = 0;
    if (n == 0 || n > LIO_VALUES_MAX)
        return lio_fail(&cur->err, LIO_EINVAL, LIO_NO_PAGE,
                        "a batch of %zu values", n);
    if (cur->page_values && values_from_cache(cur, runs, n, dsts, good))
        return LIO_SUCCESS;
    /* gaps (the end of a run's last page and the pages up to the next
     * run) go to one scratch buffer, overwritten */
    for (size_t i = 1; i < n; i++) {
        uint64_t from = runs[i - 1].pgno * psize + PAGEHDRSZ +
                        runs[i - 1].size;
        if (runs[i].pgno * psize < from)
            return lio_fail(&cur->err, LIO_EINVAL, runs[i].pgno,
                            "page %llu: batched runs out of order",
                            (unsigned long long)runs[i].pgno);
        if (runs[i].pgno * psize - from > gap_most)
            gap_most = runs[i].pgno * psize - from;
    }
    if (gap_most > cur->gapcap) {
        uint8_t *b = realloc(cur->gapbuf, gap_most);
        if (!b)
            return lio_fail(&cur->err, LIO_ENOMEM, runs[0].pgno,
                            "out of memory");
        cur->gapbuf = b;
        cur->gapcap = gap_most;
    }
    pos = runs[0].pgno * psize;
    for (size_t i = 0; i < n; i++) {
        uint64_t at = runs[i].pgno * psize;
        if (at > pos) {
            segs[nseg].dst = cur->gapbuf;
            segs[nseg++].len = (size_t)(at - pos);
        }
        segs[nseg].dst = hdrs[i];
        segs[nseg++].len = PAGEHDRSZ;
        segs[nseg].dst = dsts[i];
        segs[nseg++].len = runs[i].size;
        pos = at + PAGEHDRSZ + runs[i].size;
    }
    if ((rc = lio_read_segs(cur->env, runs[0].pgno * psize, segs, nseg,
                            runs[0].pgno, &cur->err)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (check_run(cur, hdrs[i], runs[i].pgno, runs[i].size)) {
            cur->err.code = 0;   /* raised when the cursor gets there */
            break;
        }
        *good = i + 1;
    }
    return LIO_SUCCESS;
}

static void tcursor_init(tcursor *c, lio_cursor *cur, const lio_dbrec *db,
                         int cmp, tcursor *x)
{
    memset(c, 0, sizeof *c);
    c->cur = cur;
    c->x = x;
    c->db = *db;
    c->cmp = cmp;
}

int lio_cursor_open(lio_cursor **out, lio_env *env, const lio_meta *snap,
                    const lio_dbrec *db, lio_error *err)
{
    lio_cursor *cur;
    lio_dbrec rec = *db;
    int dupsort;
    *out = NULL;
    rec.flags &= LIO_PERSISTENT_FLAGS; /* the free DB's also has env flags */
    dupsort = (rec.flags & LIO_DUPSORT) != 0;
    cur = calloc(1, sizeof *cur);
    if (!cur)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    cur->env = env;
    cur->snap = *snap;
    cur->dcmp = lio_dup_cmp_kind(rec.flags);
    cur->dir_ask = 1;
    tcursor_init(&cur->mc, cur, &rec, lio_key_cmp_kind(rec.flags),
                 dupsort ? &cur->mx : NULL);
    if (dupsort) {
        lio_dbrec none;
        memset(&none, 0, sizeof none);
        none.root = LIO_EMPTY_ROOT;
        tcursor_init(&cur->mx, cur, &none, cur->dcmp, NULL);
    }
    *out = cur;
    return LIO_SUCCESS;
}

void lio_cursor_close(lio_cursor *cur)
{
    if (!cur)
        return;
    release_levels(&cur->mc, 0);
    release_levels(&cur->mx, 0);
    lio_page_unpin(cur->env, cur->ov_pin);
    lio_leafdir_release(cur->env, cur->dir);
    lio_ahead_free(cur->worker);   /* (first: it may be reading) */
    free(cur->ovbuf);
    free(cur->gapbuf);
    free(cur->nodebuf);
    free(cur);
}

int lio_named_db(lio_env *env, const lio_meta *snap, const void *name,
                 size_t len, lio_dbrec *out, lio_error *err)
{
    lio_cursor *cur;
    lio_val key = {name, len}, data;
    const uint8_t *leaf;
    int rc = lio_cursor_open(&cur, env, snap, &snap->main_db, err);
    if (rc)
        return rc;
    rc = lio_get(cur, &key, &data);
    if (rc == LIO_SUCCESS) {
        leaf = cur_leaf(&cur->mc);
        if (!leaf || (nd_flags(leaf) & (F_DUPDATA | F_SUBDATA)) != F_SUBDATA) {
            rc = lio_fail(err, LIO_INCOMPATIBLE, cur->mc.pgno[cur->mc.top],
                          "page %llu: key is not a named database",
                          (unsigned long long)cur->mc.pgno[cur->mc.top]);
        } else {
            lio_parse_dbrec(data.data, out);
            rc = lio_check_dbrec(out, cur->mc.pgno[cur->mc.top], err);
            if (rc == LIO_SUCCESS && out->root != LIO_EMPTY_ROOT &&
                out->root > snap->last_pg)
                rc = lio_fail(err, LIO_PAGE_NOTFOUND, out->root,
                              "page %llu: named database root is past the "
                              "snapshot's last page %llu",
                              (unsigned long long)out->root,
                              (unsigned long long)snap->last_pg);
        }
    } else if (rc != LIO_NOTFOUND && err) {
        *err = cur->err;
    }
    lio_cursor_close(cur);
    return rc;
}

/* ---- read-ahead for a batch of lookups -------------------------------- */

/* The leaf a search for key lands on, found through the branch pages that
 * the scratch cursor t holds (a branch page not held is fetched: cached,
 * or read now).  0 when a branch page cannot be had: the exact lookup will
 * report it. */
static uint64_t leaf_of(tcursor *t, const lio_val *key)
{
    unsigned level, lv;
    if (t->db.depth < 2)
        return t->db.root;
    lv = t->db.depth - 2u;
    if (t->pin[lv]) {
        /* The leaf of the last key (in slot ki of the lowest branch page
         * held) when the key lies between that slot's separators: keys in
         * order need two comparisons, not a descent. */
        const uint8_t *p = t->pg[lv];
        unsigned i = t->ki[lv];
        lio_val lo, hi;
        if (i > 0 && i + 1u < pg_numkeys(p)) {
            node_key(t, p, i, &lo);
            node_key(t, p, i + 1, &hi);
            if (lio_cmp(t->cmp, key, &lo) >= 0 &&
                lio_cmp(t->cmp, key, &hi) < 0)
                return nd_child(pg_node(p, i));
        }
    }
    if (!(t->pin[0] && t->pgno[0] == t->db.root) &&
        push_page(t, 0, t->db.root, 0))
        return 0;
    for (level = 0;; level++) {
        const uint8_t *p = t->pg[level];
        uint64_t child;
        unsigned i;
        int exact;
        /* as search_from_top */
        t->top = level;
        if (!node_search(t, key, &exact))
            i = pg_numkeys(p) - 1;
        else
            i = t->ki[level] - (exact ? 0 : 1);
        child = nd_child(pg_node(p, i));
        t->ki[level] = i;
        if (level + 2u >= t->db.depth)
            return child;
        if (!(t->pin[level + 1] && t->pgno[level + 1] == child) &&
            push_page(t, level + 1, child, 0))
            return 0;
    }
}

/* Bring pgnos[0..n) (sorted, distinct) into the cache through the env's
 * read-ahead, a batch of at most readahead_pages at a time.  A batch may
 * bring fewer (read-around from a device opens a few blocks per batch):
 * the rest goes into the next one, for as long as batches make progress. */
static void prefetch_sorted(lio_env *env, const lio_meta *snap,
                            uint64_t *pgnos, size_t n)
{
    size_t limit = env->readahead_pages < LIO_PREFETCH_MAX
                   ? env->readahead_pages : LIO_PREFETCH_MAX;
    size_t before = SIZE_MAX;
    for (;;) {
        size_t left = 0, batch;
        for (size_t i = 0; i < n; i++)
            if (!lio_page_cached(env, snap, pgnos[i]))
                pgnos[left++] = pgnos[i];
        /* done, or the last pass brought nothing (a read failed) */
        if (left == 0 || left >= before)
            return;
        before = n = left;
        for (size_t i = 0; i < n; i += batch) {
            batch = n - i < limit ? n - i : limit;
            lio_page_prefetch(env, snap, pgnos + i, batch);
        }
    }
}

/* The overflow value of key in leaf pg (checked) if it has one: its
 * first page and the pages it spans.  The search uses the scratch cursor's
 * slot for the leaf level, which leaf_of never reads. */
static int overflow_of(tcursor *t, const uint8_t *p, const lio_val *key,
                       uint64_t *first, uint64_t *npages)
{
    unsigned lv = t->db.depth - 1u;
    const uint8_t *nd;
    int exact = 0;
    if (!(pg_flags(p) & P_LEAF) || is_leaf2(p))
        return 0;
    t->top = lv;
    t->pg[lv] = p;
    if (!node_search(t, key, &exact) || !exact)
        return 0;
    nd = pg_node(p, t->ki[lv]);
    if ((nd_flags(nd) & (F_BIGDATA | F_DUPDATA)) != F_BIGDATA)
        return 0;
    *first = ld64(nd_data(nd));
    *npages = run_pages(t->cur, nd_dsize(nd));
    return 1;
}

/* Sort and drop repeats; the new count. */
static size_t sort_distinct(uint64_t *v, size_t n)
{
    size_t d = 0;
    qsort(v, n, sizeof *v, lio_cmp_u64);
    for (size_t i = 0; i < n; i++)
        if (!d || v[d - 1] != v[i])
            v[d++] = v[i];
    return d;
}

/* The overflow values of the keys in their (cached) leaves: one-page
 * values read into the cache (where read_overflow looks for them), up to
 * `budget` pages; longer runs advised to the storage.  The leaves stay
 * pinned until the values are read, so that the cache does not recycle
 * them for the values. */
static void prefetch_overflow(lio_cursor *s, const lio_val *keys, size_t n,
                              size_t budget, uint64_t *ov, lio_page **held)
{
    lio_env *env = s->env;
    const lio_meta *snap = &s->snap;
    size_t nov = 0, nheld = 0;
    lio_executor ex;
    pthread_mutex_lock(&env->ra_lock);
    ex = env->ex;
    pthread_mutex_unlock(&env->ra_lock);
    for (size_t i = 0; i < n && nov < budget && nheld < budget; i++) {
        lio_page *pg;
        uint64_t leaf, first, np;
        lio_error err;
        if (keys[i].size == 0 || !(leaf = leaf_of(&s->mc, &keys[i])) ||
            !lio_page_cached(env, snap, leaf) ||
            lio_page_get(env, snap, leaf, 0, &pg, &err))
            continue;
        held[nheld++] = pg;
        if (!overflow_of(&s->mc, pg->data, &keys[i], &first, &np) ||
            first < 2 || first > snap->last_pg ||
            np > snap->last_pg - first + 1)
            continue;
        if (np == 1)
            ov[nov++] = first;
        else if (ex.advise)
            ex.advise(ex.ctx, first * env->psize, np * env->psize,
                      LIO_ADVISE_WILLNEED);
    }
    prefetch_sorted(env, snap, ov, sort_distinct(ov, nov));
    while (nheld)
        lio_page_unpin(env, held[--nheld]);
}

/* Would the leaves of keys[0..n) be too far apart to be read together?
 * Judged from an even sample of the keys: the pages their leaves spread
 * over outnumber the keys several times (keys in random order over a
 * tree much larger than them), rather than holding a few keys each (keys
 * in order in an appended layout, or most of a small tree). */
#define SAMPLE_KEYS 16
static int sparse(tcursor *t, const lio_val *keys, size_t n)
{
    uint64_t v[SAMPLE_KEYS];
    size_t m = 0, d;
    for (size_t i = 0; i < SAMPLE_KEYS; i++) {
        const lio_val *k = &keys[i * n / SAMPLE_KEYS];
        if (k->size && (v[m] = leaf_of(t, k)))
            m++;
    }
    if ((d = sort_distinct(v, m)) < 2)
        return 0;
    return v[d - 1] - v[0] > 4 * (uint64_t)n;
}

/* Of sorted distinct pgnos, those next to another one; the new count. */
static size_t keep_neighbours(uint64_t *v, size_t n)
{
    size_t d = 0;
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t p = v[i];
        if ((i > 0 && prev + 1 == p) || (i + 1 < n && p + 1 == v[i + 1]))
            v[d++] = p;
        prev = p;
    }
    return d;
}

size_t lio_cursor_prefetch(lio_cursor *cur, const lio_val *keys, size_t n)
{
    lio_env *env = cur->env;
    lio_cursor s;               /* scratch: cur is left as it is */
    uint64_t *pgnos;
    lio_page **held;
    size_t budget = env->max_pages / 4, covered, m = 0, nheld = 0, toread = 0;
    int device = lio_env_from_device(env);

    if (n == 0 || env->readahead_pages < 2 ||
        cur->mc.db.root == LIO_EMPTY_ROOT || cur->mc.db.depth == 0)
        return n;
    if (budget < 2)
        budget = 2;
    /* leaves, overflow pages, and the leaves held by each step */
    if (!(pgnos = malloc(2 * budget * (sizeof *pgnos + sizeof *held))))
        return n;
    held = (lio_page **)(pgnos + 2 * budget);
    memset(&s, 0, sizeof s);
    s.env = env;
    s.snap = cur->snap;
    s.dcmp = cur->dcmp;
    tcursor_init(&s.mc, &s, &cur->mc.db, cur->mc.cmp, NULL);
    if (!device && n > SAMPLE_KEYS && sparse(&s.mc, keys, n)) {
        release_levels(&s.mc, 0);
        free(pgnos);
        return n;
    }

    /* The keys' leaves, up to the budget: each key's leaf counts (a
     * repeated one too), so that the leaves of the keys covered fit in a
     * fraction of the cache whatever their order.  A key whose branch
     * pages cannot be read is left to its lookup. */
    for (covered = 0; covered < n && m < budget; covered++) {
        uint64_t leaf;
        if (keys[covered].size && (leaf = leaf_of(&s.mc, &keys[covered])))
            pgnos[m++] = leaf;
    }
    /* From the OS cache a read costs no more than a lookup's own read: only
     * leaves next to each other are worth reading ahead (one request for
     * several).  From the device, all of them: several reads in flight. */
    m = sort_distinct(pgnos, m);
    if (!device)
        m = keep_neighbours(pgnos, m);
    /* The leaves already cached are held while the others are read: the
     * cache would otherwise recycle those that a lookup used once (its
     * scan resistance) for the new ones.  Held, they count as used twice
     * and stay. */
    for (size_t i = 0; i < m; i++) {
        if ((held[nheld] = lio_page_peek(env, &s.snap, pgnos[i])))
            nheld++;
        else
            pgnos[toread++] = pgnos[i];
    }
    prefetch_sorted(env, &s.snap, pgnos, toread);
    if (cur->mc.db.overflow_pages)
        prefetch_overflow(&s, keys, covered, budget, pgnos + budget,
                          held + budget);
    while (nheld)
        lio_page_unpin(env, held[--nheld]);
    release_levels(&s.mc, 0);
    free(pgnos);
    return covered;
}
