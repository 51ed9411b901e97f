/* Leaf directories: a tree's leaf for a key found in one array.
 *
 * A lookup descends the tree through its branch pages, each a binary search
 * over keys the node offsets point to, scattered over pages that outgrow the
 * CPU's caches (a 500k-record tree has hundreds).  Random gets pay more for
 * those searches than for reading the leaf.  A directory lists the tree's
 * leaves in key order, each with its lower bound: the separator its parent
 * holds for it (for the first child of a page, the bound the page itself
 * inherited).  The 8 key bytes after the prefix every bound shares are kept
 * in one array as integers, so most steps of the search compare two
 * integers in memory the search touched recently; the full bound decides
 * only where those 8 bytes tie.
 *
 * The directory gives the leaf the descent would reach: the descent picks, on
 * each level, the child with the largest bound <= key, and when the
 * bounds listed in key order are strictly increasing (checked while
 * building; otherwise no directory) that is the leaf with the largest
 * bound <= key.  A build reads every branch page, checked as a descent checks
 * them; any failure only means no directory (a descent then reports what it
 * finds).  Only trees in memcmp key order have one.
 *
 * Layer 4 of the core (after errors, page format and page cache).
 * May call: errors.c, format.c (lio_cmp, lio_sort_u64, lio_lock_here),
 * pager.c (branch pages, lio_read_into), pthreads. */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "core.h"

struct lio_leafdir {
    size_t n;               /* leaves */
    uint64_t *leaf;         /* [2n]: for leaf j, [2j] its bound's bytes
                             * skip..skip+8, big-endian, zero-padded ([0]:
                             * 0, for minus infinity), and [2j+1] its page
                             * number (read with them: no second miss) as
                             * pgno << 2 | LEAF_* */
    uint64_t *pgno;         /* [n], while building */
    uint32_t *koff;         /* [n+1]: bound j is keys[koff[j]..koff[j+1]) */
    uint8_t *keys;
    uint64_t *sample;       /* [nsample]: the bound bytes of leaf
                             * b * DIR_BLOCK (a small array the CPU keeps
                             * cached) */
    size_t nsample;
    size_t skip;            /* bytes every bound 1..n-1 starts with */
    unsigned refs;          /* env slot + cursors (under env->lock) */
    /* The record table (NULL: the tree's leaves fit in the page cache,
     * or O_DIRECT reads whole pages anyway): where the records of the
     * leaves lookups have read sit, by a hash of their keys, open
     * addressing.  Slots are written once, under rec_lock, and read
     * without it. */
    struct rec_slot *recs;
    size_t rec_slots;
    size_t rec_room;        /* records that may still be added (the table
                             * stays at most 3/4 full) */
    pthread_mutex_t rec_lock;
    pid_t rec_pid;          /* the process that made rec_lock */
    size_t noted;           /* leaves noted (under rec_lock) */
    int whole;              /* the table has room for every record */
    int scan_asked;         /* a scan was started for it (under rec_lock) */
    pid_t scan_pid;         /* the process whose scan runs now, or 0
                             * (atomic): lookups there leave the noting
                             * to it */
    uint64_t last_pg;       /* the snapshot's last page */
    uint64_t scanned;       /* leaves a scan noted (atomic) */
    uint64_t clock;         /* lookups answered from the table (relaxed:
                             * a count that may lose a few) */
};

/* A slot: w0 = print << 32 | len << 16 | off (0: empty), w1 = the
 * leaf's page number | SLOT_ERA its era << 48 | SLOT_HITS its hits << 60.
 * w1 is written first, w0 published after it. */
#define SLOT_PGNO ((1ull << 48) - 1)
#define SLOT_ERA_BITS 12
#define SLOT_HITS_MAX 15u
/* A record looked up this many times in an era (as many lookups as a
 * quarter of the table's slots) is part of a working set: its lookups go
 * through the page cache, which keeps its leaf once missed twice and then
 * serves it without a read.  Lookups spread over the whole tree rarely
 * do: about a third of a lookup per record and era (the table holds 3/4
 * as many records as slots), so a few records in a thousand reach 3 by
 * chance. */
#define WORKING_SET_HITS 3u
struct rec_slot {
    uint64_t w0, w1;
};

/* The tag of a page number in leaf[2j+1]. */
#define LEAF_UNNOTED 0u     /* no lookup has noted its records yet */
#define LEAF_NOTED 1u       /* every record of it is in the table */
#define LEAF_PAGE_ONLY 2u   /* it holds a record lookups must not read
                             * alone (duplicates, a named tree), or the
                             * table was full */
#define LEAF_TAGS 3u

/* Lookups through the tree's descent before a directory is built: about
 * twice its branch pages, so the build's reads are mostly cache hits by
 * then and cost a few percent of what the lookups cost; and a program that
 * looks up a handful of keys never builds one. */
#define LEAFDIR_MIN_LOOKUPS 64u
#define LEAFDIR_PER_BRANCH 2u
/* A search first picks a block of this many bounds among the samples, then
 * the bound within it: two searches in a few cache lines each, where one
 * over the whole array touches a line far from the last at every step. */
#define DIR_BLOCK 16u

static uint64_t be_prefix(const uint8_t *p, size_t len)
{
    uint64_t v = 0;
    for (size_t i = 0; i < 8; i++)
        v = (v << 8) | (i < len ? p[i] : 0);
    return v;
}

static void dir_free(lio_leafdir *d)
{
    if (!d)
        return;
    if (d->recs) {
        free(d->recs);
        pthread_mutex_destroy(&d->rec_lock);
    }
    free(d->leaf);
    free(d->sample);
    free(d->pgno);
    free(d->koff);
    free(d->keys);
    free(d);
}

typedef struct {
    lio_env *env;
    const lio_meta *snap;
    unsigned depth;
    size_t budget;          /* bytes the directory may take */
    size_t cap, kocap, kcap;   /* pgno[], koff[] and keys[] allocated */
    lio_leafdir *d;
    uint64_t list[LIO_PREFETCH_MAX];   /* children to read together */
    lio_error err;
} builder;

/* Bytes a directory takes per leaf, besides its bound's bytes. */
#define ENTRY_BYTES (3 * sizeof(uint64_t) + sizeof(uint32_t))

static int add_leaf(builder *b, const lio_val *bound, uint64_t child)
{
    lio_leafdir *d = b->d;
    size_t n = d->n, used = d->koff[n], ks = bound ? bound->size : 0;
    /* the first bound is minus infinity, and only the first; the others
     * increase strictly */
    if ((n == 0) != (bound == NULL))
        return -1;
    if (n > 1) {
        lio_val prev = {d->keys + d->koff[n - 1], d->koff[n] - d->koff[n - 1]};
        if (lio_cmp(LIO_CMP_MEMN, &prev, bound) >= 0)
            return -1;
    }
    if ((n + 2) * ENTRY_BYTES + used + ks > b->budget)
        return -1;
    if (lio_grow((void **)&d->pgno, &b->cap, n + 1, sizeof *d->pgno) ||
        lio_grow((void **)&d->koff, &b->kocap, n + 2, sizeof *d->koff))
        return -1;
    if (ks) {
        if (lio_grow((void **)&d->keys, &b->kcap, used + ks, 1))
            return -1;
        memcpy(d->keys + used, bound->data, ks);
    }
    d->pgno[n] = child;
    d->koff[n + 1] = (uint32_t)(used + ks);
    d->n = n + 1;
    return 0;
}

/* The branch page pgno at `level`, whose first child's bound is `low`
 * (NULL: minus infinity): its children, or the leaves under them. */
static int visit(builder *b, uint64_t pgno, unsigned level, const lio_val *low)
{
    lio_page *pg;
    const uint8_t *p;
    unsigned n;
    int rc = 0;
    if (lio_page_get(b->env, b->snap, pgno, LIO_GET_AROUND, &pg, &b->err))
        return -1;
    p = pg->data;
    n = pg_numkeys(p);
    if (!(pg_flags(p) & P_BRANCH) || (pg_flags(p) & P_LEAF) || n == 0) {
        lio_page_unpin(b->env, pg);
        return -1;
    }
    if (level + 2 < b->depth) {
        /* read the children together (from the device, in parallel) */
        for (unsigned i = 0; i < n; i += LIO_PREFETCH_MAX) {
            size_t m = 0;
            for (unsigned j = i; j < n && m < LIO_PREFETCH_MAX; j++)
                b->list[m++] = nd_child(pg_node(p, j));
            lio_page_prefetch(b->env, b->snap, b->list, m);
        }
    }
    for (unsigned i = 0; i < n && rc == 0; i++) {
        const uint8_t *nd = pg_node(p, i);
        lio_val key = {nd_key(nd), nd_ksize(nd)};
        const lio_val *bound = i == 0 ? low : &key;
        if (level + 2 < b->depth)
            rc = visit(b, nd_child(nd), level + 1, bound);
        else
            rc = add_leaf(b, bound, nd_child(nd));
    }
    lio_page_unpin(b->env, pg);
    return rc;
}

static lio_leafdir *build(lio_env *env, const lio_meta *snap,
                          const lio_dbrec *db, size_t budget)
{
    builder *bp = calloc(1, sizeof *bp);
    lio_leafdir *d = calloc(1, sizeof *d);
    size_t lo, hi, common, used;
    int rc;
    if (!bp || !d || !(d->koff = calloc(1, sizeof *d->koff))) {
        free(bp);
        dir_free(d);
        return NULL;
    }
    bp->env = env;
    bp->snap = snap;
    bp->depth = db->depth;
    bp->budget = budget < UINT32_MAX ? budget : UINT32_MAX;   /* koff */
    bp->kocap = 1;
    bp->d = d;
    rc = visit(bp, db->root, 0, NULL);
    free(bp);
    if (rc || d->n < 2) {
        dir_free(d);
        return NULL;
    }
    /* bounds 1..n-1 are sorted: they all share the prefix the first and
     * the last share */
    lo = d->koff[1];
    hi = d->koff[d->n - 1];
    common = 0;
    while (common < d->koff[2] - lo && common < d->koff[d->n] - hi &&
           d->keys[lo + common] == d->keys[hi + common])
        common++;
    d->skip = common;
    if (!(d->leaf = malloc(2 * d->n * sizeof *d->leaf))) {
        dir_free(d);
        return NULL;
    }
    d->leaf[0] = 0;
    for (size_t j = 0; j < d->n; j++) {
        if (j)
            d->leaf[2 * j] = be_prefix(d->keys + d->koff[j] + common,
                                       d->koff[j + 1] - d->koff[j] - common);
        d->leaf[2 * j + 1] = d->pgno[j] << 2 | LEAF_UNNOTED;
    }
    free(d->pgno);
    d->pgno = NULL;
    d->nsample = (d->n + DIR_BLOCK - 1) / DIR_BLOCK;
    if (!(d->sample = malloc(d->nsample * sizeof *d->sample))) {
        dir_free(d);
        return NULL;
    }
    for (size_t b = 0; b < d->nsample; b++)
        d->sample[b] = d->leaf[2 * b * DIR_BLOCK];
    /* A record table where a lookup's leaf is mostly not in the page
     * cache: then reading the record alone (about 0.4 us less than its
     * page, hot) beats reading the page.  Slots for the tree's records
     * at 3/4 full at most, within the rest of the budget (a larger tree
     * fills it, and lookups in the leaves left out read their pages). */
    used = d->n * ENTRY_BYTES + d->koff[d->n];
    if (env->align <= 1 && d->n > env->max_pages && used < budget) {
        uint64_t slots = db->entries / 3 * 4 + 64;
        if (slots > (budget - used) / sizeof *d->recs)
            slots = (budget - used) / sizeof *d->recs;
        if (slots >= 64 && (d->recs = calloc(slots, sizeof *d->recs))) {
            if (pthread_mutex_init(&d->rec_lock, NULL)) {
                free(d->recs);
                d->recs = NULL;
            }
            d->rec_pid = getpid();
            d->rec_slots = slots;
            d->rec_room = slots / 4 * 3;
            d->whole = d->rec_room >= db->entries;
        }
    }
    d->last_pg = snap->last_pg;
    d->refs = 1;
    return d;
}

/* Is bound j <= the key, whose bytes after the common prefix are `tail`
 * and their first 8 `kp` (as the directory holds them; p: bound j's)? */
static int bound_le(const lio_leafdir *d, size_t j, uint64_t p, uint64_t kp,
                    const lio_val *tail)
{
    lio_val b;
    if (j == 0)
        return 1;                   /* minus infinity */
    if (kp != p)
        return kp > p;
    b.data = d->keys + d->koff[j] + d->skip;
    b.size = d->koff[j + 1] - d->koff[j] - d->skip;
    return lio_cmp(LIO_CMP_MEMN, tail, &b) >= 0;
}

size_t lio_leafdir_find(const lio_leafdir *d, const lio_val *key)
{
    const uint8_t *first = d->keys + d->koff[1];
    size_t s = d->skip, lo, hi;
    size_t m = key->size < s ? key->size : s;
    int c = m ? memcmp(key->data, first, m) : 0;
    uint64_t kp;
    lio_val tail;
    if (c < 0 || (c == 0 && key->size < s))
        return 0;                   /* before every bound but the first */
    if (c > 0)
        return d->n - 1;            /* after every bound */
    tail.data = key->data + s;
    tail.size = key->size - s;
    kp = be_prefix(tail.data, tail.size);
    /* the last block whose first bound is <= key, then the last bound in
     * it that is: bound[lo] <= key < bound[hi] (bound[n]: plus infinity) */
    lo = 0;
    for (size_t len = d->nsample; len > 1; len -= len / 2) {
        /* (a conditional move, not a branch the CPU would guess wrong
         * half the time; 8 bytes rarely tie) */
        size_t mid = lo + len / 2;
        uint64_t p = d->sample[mid];
        int le = kp > p;
        if (__builtin_expect(kp == p, 0))
            le = bound_le(d, mid * DIR_BLOCK, p, kp, &tail);
        lo = le ? mid : lo;
    }
    /* In the block, count the bounds whose 8 bytes are below the key's
     * and those equal to them (no branch to mispredict; the block's few
     * cache lines load together): the former are <= key, the latter
     * tie and their full bounds decide.  Bound lo is <= key. */
    lo *= DIR_BLOCK;
    hi = lo + DIR_BLOCK < d->n ? lo + DIR_BLOCK : d->n;
    {
        size_t lt = 0, le = 0, j;
        for (j = lo; j < hi; j++) {
            lt += d->leaf[2 * j] < kp;
            le += d->leaf[2 * j] <= kp;
        }
        for (j = lo + le; j > lo + lt; j--)
            if (bound_le(d, j - 1, kp, kp, &tail))
                return j - 1;
        lo += lt ? lt - 1 : 0;
    }
    return lo;
}

static uint64_t leaf_word(const lio_leafdir *d, size_t j)
{
    return __atomic_load_n(&d->leaf[2 * j + 1], __ATOMIC_ACQUIRE);
}

uint64_t lio_leafdir_pgno(const lio_leafdir *d, size_t j)
{
    return leaf_word(d, j) >> 2;
}

uint64_t lio_key_hash(const lio_val *key)
{
    /* 8 bytes at a time, multiplied and folded: a few cycles a key */
    const uint8_t *p = key->data;
    size_t n = key->size;
    uint64_t h = 0x9e3779b97f4a7c15u ^ n;
    for (; n >= 8; n -= 8, p += 8)
        h = (h ^ ld64(p)) * 0xff51afd7ed558ccdu;
    if (n) {
        uint64_t w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0xff51afd7ed558ccdu;
    }
    h ^= h >> 29;
    h *= 0xc4ceb9fe1a85ec53u;
    return h ^ (h >> 32);
}

/* The print a slot keeps of hash h (never 0: 0 marks an empty slot). */
static uint64_t print_of(uint64_t h)
{
    return (h >> 32 | 1) << 32;
}

/* Where a probe for hash h starts: h's low 32 bits scaled to the table
 * (a multiply, where a modulo would divide). */
static size_t first_slot(const lio_leafdir *d, uint64_t h)
{
    return (size_t)(((h & UINT32_MAX) * d->rec_slots) >> 32);
}

static size_t next_slot(const lio_leafdir *d, size_t i)
{
    return i + 1 < d->rec_slots ? i + 1 : 0;
}

int lio_leafdir_has_records(const lio_leafdir *d) { return d->recs != NULL; }

int lio_leafdir_next_record(const lio_leafdir *d, uint64_t h, size_t *pos,
                            lio_recspan *out)
{
    uint64_t print = print_of(h);
    size_t i = *pos == (size_t)-1 ? first_slot(d, h) : next_slot(d, *pos);
    /* (never full: an empty slot ends every probe; the count bounds it
     * anyway) */
    for (size_t tries = 0; tries < d->rec_slots; tries++) {
        uint64_t w0 = __atomic_load_n(&d->recs[i].w0, __ATOMIC_ACQUIRE);
        if (w0 == 0)
            return 0;
        if ((w0 & ~(uint64_t)UINT32_MAX) == print) {
            out->pgno = __atomic_load_n(&d->recs[i].w1, __ATOMIC_RELAXED) &
                        SLOT_PGNO;
            out->off = (uint16_t)w0;
            out->len = (uint16_t)(w0 >> 16);
            *pos = i;
            return 1;
        }
        i = next_slot(d, i);
    }
    return 0;
}

int lio_leafdir_working_set(lio_leafdir *d, size_t pos)
{
    /* (races lose a count now and then: a heuristic) */
    uint64_t w1 = __atomic_load_n(&d->recs[pos].w1, __ATOMIC_RELAXED);
    uint64_t t = __atomic_load_n(&d->clock, __ATOMIC_RELAXED);
    uint64_t era = t / (d->rec_slots / 4 + 1) & ((1u << SLOT_ERA_BITS) - 1);
    uint64_t was = w1 >> 48 & ((1u << SLOT_ERA_BITS) - 1);
    unsigned hits = (unsigned)(w1 >> 60);
    __atomic_store_n(&d->clock, t + 1, __ATOMIC_RELAXED);
    if (was != era)     /* halved an era on, forgotten later */
        hits = ((era - was) & ((1u << SLOT_ERA_BITS) - 1)) == 1 ? hits / 2 : 0;
    if (hits < SLOT_HITS_MAX)
        hits++;
    __atomic_store_n(&d->recs[pos].w1, (w1 & SLOT_PGNO) | era << 48 |
                     (uint64_t)hits << 60, __ATOMIC_RELAXED);
    return hits >= WORKING_SET_HITS;
}

int lio_leafdir_noted(const lio_leafdir *d, size_t j)
{
    return (leaf_word(d, j) & LEAF_TAGS) == LEAF_NOTED;
}

/* May every record of leaf page p (checked by the pager) be read alone? */
static int records_readable(const uint8_t *p, uint32_t psize)
{
    unsigned n = pg_numkeys(p);
    if (!(pg_flags(p) & P_LEAF) || (pg_flags(p) & P_LEAF2))
        return 0;
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *nd = pg_node(p, i);
        size_t off = (size_t)(nd - p), len = nd_span(nd);
        /* (a plain value, or an overflow run's page number) */
        if ((nd_flags(nd) & ~F_BIGDATA) || off + len > psize ||
            len > UINT16_MAX)
            return 0;
    }
    return 1;
}

/* ---- the scan: the rest of a tree's leaves, noted in file order ------ */

/* Lookups that have noted this share of a tree's leaves reach all over it
 * (its directory exists only after two lookups per branch page): a thread
 * of the env then reads the leaves not noted yet, in file order and large
 * reads, and notes their records, so that the lookups still to come read
 * their record alone instead of its page (hot, 500k records of 800 B in
 * shuffled order: a leaf's first lookup cost 2.4-6.3 us, a record's
 * 1.5 us; cold, the scan's large reads fill the OS cache the lookups read
 * from).  Only where the table has room for every record of the tree, the
 * env reads ahead, and the leaves fit in half the memory: the scan is
 * worth its reads when the OS keeps what it read for the lookups. */
#define SCAN_SHARE 32u
#define SCAN_READ_BYTES (1u << 20)  /* hot reads of 1-2 MiB copy fastest */
#define SCAN_GAP_PAGES 8u           /* a hole read over, not a new read */

struct lio_leafscan {
    pthread_t tid;
    pid_t pid;                  /* the process the thread runs in */
    lio_env *env;
    lio_leafdir *dir;           /* a reference */
    int stop;                   /* atomic */
    pthread_mutex_t mu;         /* guards done */
    pthread_cond_t ended;
    int done;
};

/* What note_locked did. */
#define NOTED 1
#define SCAN_NOW 2

/* The records of leaf j into the table, once (its page read and checked;
 * rec_lock held).  hashes: their keys' lio_key_hash, from a caller that
 * found them readable alone (records_readable), or NULL. */
static int note_locked(lio_leafdir *d, size_t j, const uint8_t *page,
                       uint32_t psize, const uint64_t *hashes)
{
    uint64_t w = d->leaf[2 * j + 1], pgno = w >> 2;
    unsigned n = pg_numkeys(page);
    int did = 0;
    if ((w & LEAF_TAGS) != LEAF_UNNOTED)
        return 0;
    if (n <= d->rec_room && (hashes || records_readable(page, psize))) {
        for (unsigned i = 0; i < n; i++) {
            const uint8_t *nd = pg_node(page, i);
            lio_val key = {nd_key(nd), nd_ksize(nd)};
            uint64_t h = hashes ? hashes[i] : lio_key_hash(&key);
            uint64_t len = nd_span(nd);
            size_t k = first_slot(d, h);
            while (d->recs[k].w0)
                k = next_slot(d, k);
            __atomic_store_n(&d->recs[k].w1, pgno, __ATOMIC_RELAXED);
            __atomic_store_n(&d->recs[k].w0, print_of(h) | len << 16 |
                             (uint64_t)(nd - page), __ATOMIC_RELEASE);
        }
        d->rec_room -= n;
        w = pgno << 2 | LEAF_NOTED;
    } else {
        w = pgno << 2 | LEAF_PAGE_ONLY;
    }
    __atomic_store_n(&d->leaf[2 * j + 1], w, __ATOMIC_RELEASE);
    did = NOTED;
    if (++d->noted >= d->n / SCAN_SHARE && d->whole && !d->scan_asked) {
        d->scan_asked = 1;
        did |= SCAN_NOW;
    }
    return did;
}

/* Bits of a todo entry's leaf number: its page failed a check; its
 * records may be read alone (their hashes are in the scan's array). */
#define SCAN_SKIP (1ull << 63)
#define SCAN_HASHED (1ull << 62)

/* Note the leaves todo[a..b) (pgno, leaf pairs), read at data from page
 * `first` on: first the checks and their keys' hashes, with their table
 * slots prefetched, so that the notes after them find the slots cached
 * (a table of tens of MiB misses the CPU's caches at every insert). */
static void scan_note(lio_leafdir *d, uint64_t *todo, size_t a, size_t b,
                      const uint8_t *data, uint64_t first, uint32_t psize,
                      uint64_t **hash, size_t *hash_cap)
{
    size_t nh = 0;
    lio_error err;
    for (size_t i = a; i < b; i++) {
        const uint8_t *p = data + (todo[2 * i] - first) * psize;
        unsigned n = pg_numkeys(p);
        /* the checks a lookup's fetch makes (pager.c's validate) */
        if (pg_pgno(p) != todo[2 * i] ||
            lio_check_page(p, psize, todo[2 * i], 0, &err) != LIO_SUCCESS) {
            todo[2 * i + 1] |= SCAN_SKIP;
            continue;
        }
        if (!records_readable(p, psize))
            continue;           /* (noted as read by pages) */
        if (lio_grow((void **)hash, hash_cap, nh + n, sizeof **hash)) {
            todo[2 * i + 1] |= SCAN_SKIP;
            continue;
        }
        todo[2 * i + 1] |= SCAN_HASHED;
        for (unsigned k = 0; k < n; k++) {
            const uint8_t *nd = pg_node(p, k);
            lio_val key = {nd_key(nd), nd_ksize(nd)};
            uint64_t h = lio_key_hash(&key);
            (*hash)[nh++] = h;
            __builtin_prefetch(&d->recs[first_slot(d, h)], 1);
        }
    }
    nh = 0;
    for (size_t i = a; i < b; i++) {
        const uint8_t *p = data + (todo[2 * i] - first) * psize;
        uint64_t leaf = todo[2 * i + 1];
        int did;
        if (leaf & SCAN_SKIP)
            continue;
        pthread_mutex_lock(&d->rec_lock);
        did = note_locked(d, leaf & ~SCAN_HASHED, p, psize,
                          leaf & SCAN_HASHED ? *hash + nh : NULL);
        pthread_mutex_unlock(&d->rec_lock);
        if (leaf & SCAN_HASHED)
            nh += pg_numkeys(p);
        if (did & NOTED)
            __atomic_add_fetch(&d->scanned, 1, __ATOMIC_RELAXED);
    }
}

static void *scan_run(void *arg)
{
    struct lio_leafscan *s = arg;
    lio_leafdir *d = s->dir;
    lio_env *env = s->env;
    size_t psize = env->psize, m = 0, cap = 0, hash_cap = 0;
    size_t per_read = SCAN_READ_BYTES > psize ? SCAN_READ_BYTES / psize : 1;
    uint64_t *todo = malloc(2 * d->n * sizeof *todo);  /* pgno, leaf */
    uint64_t *hash = NULL;
    uint8_t *buf = NULL;
    lio_error err;
    /* (then plain locks: the lock is this process's) */
    lio_lock_here(&d->rec_lock, &d->rec_pid);
    pthread_mutex_unlock(&d->rec_lock);
    for (size_t j = 0; todo && j < d->n; j++) {
        uint64_t w = __atomic_load_n(&d->leaf[2 * j + 1], __ATOMIC_ACQUIRE);
        /* (a page a lookup could not fetch is left to that lookup) */
        if ((w & LEAF_TAGS) == LEAF_UNNOTED && w >> 2 >= 2 &&
            w >> 2 <= d->last_pg) {
            todo[2 * m] = w >> 2;
            todo[2 * m + 1] = j;
            m++;
        }
    }
    lio_sort_u64(todo, m, 2);
    for (size_t a = 0, b; a < m; a = b) {
        uint64_t first = todo[2 * a];
        const uint8_t *data;
        if (__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE))
            break;
        for (b = a + 1; b < m && todo[2 * b] - todo[2 * b - 2] <=
                                     SCAN_GAP_PAGES + 1 &&
                        todo[2 * b] - first < per_read; b++)
            ;
        /* a read that fails is the lookups' to report, if they need it */
        if (lio_read_into(env, first * psize,
                          (size_t)(todo[2 * b - 2] - first + 1) * psize,
                          &buf, &cap, &data, first, &err) == LIO_SUCCESS)
            scan_note(d, todo, a, b, data, first, psize, &hash, &hash_cap);
    }
    free(hash);
    free(buf);
    free(todo);
    /* (the leaves it left, the lookups note again) */
    __atomic_store_n(&d->scan_pid, 0, __ATOMIC_RELAXED);
    pthread_mutex_lock(&s->mu);
    s->done = 1;
    pthread_cond_broadcast(&s->ended);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void scan_free(struct lio_leafscan *s)
{
    pthread_cond_destroy(&s->ended);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void scan_start(lio_env *env, lio_leafdir *d)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    struct lio_leafscan *s;
    sigset_t all, old;
    if (env->readahead_pages < 2 || pages <= 0 || size <= 0 ||
        (uint64_t)d->n * env->psize > (uint64_t)pages * (uint64_t)size / 2 ||
        !(s = calloc(1, sizeof *s)))
        return;
    s->env = env;
    s->dir = d;
    s->pid = getpid();
    if (pthread_mutex_init(&s->mu, NULL)) {
        free(s);
        return;
    }
    if (pthread_cond_init(&s->ended, NULL)) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return;
    }
    pthread_mutex_lock(&env->lock);
    if (env->scan) {                /* one scan at a time */
        pthread_mutex_unlock(&env->lock);
        scan_free(s);
        return;
    }
    d->refs++;
    /* (signals stay with the program's own threads) */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    __atomic_store_n(&d->scan_pid, s->pid, __ATOMIC_RELAXED);
    if (pthread_create(&s->tid, NULL, scan_run, s)) {
        __atomic_store_n(&d->scan_pid, 0, __ATOMIC_RELAXED);
        d->refs--;
        scan_free(s);
    } else {
        env->scan = s;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_mutex_unlock(&env->lock);
}

void lio_leafdir_note(lio_env *env, lio_leafdir *d, size_t j,
                      const uint8_t *page, uint32_t psize)
{
    pid_t scan;
    int did;
    if (!d->recs || (leaf_word(d, j) & LEAF_TAGS) != LEAF_UNNOTED)
        return;
    /* While a scan runs, the lookups leave it the noting: the leaves it
     * had not reached when it began are its own to note, and a lookup
     * noting a leaf of 40 records paid 4 us (a table slot missing the
     * CPU's caches for each) for the few of them the lookups to come would
     * find before the scan does. */
    scan = __atomic_load_n(&d->scan_pid, __ATOMIC_RELAXED);
    if (scan && scan == getpid())
        return;
    lio_lock_here(&d->rec_lock, &d->rec_pid);
    did = note_locked(d, j, page, psize, NULL);
    pthread_mutex_unlock(&d->rec_lock);
    if (did & SCAN_NOW)
        scan_start(env, d);
}

uint64_t lio_leafdir_scan_wait(lio_env *env, const lio_leafdir *d)
{
    struct lio_leafscan *s;
    pthread_mutex_lock(&env->lock);
    s = env->scan && env->scan->dir == d && env->scan->pid == getpid()
        ? env->scan : NULL;
    pthread_mutex_unlock(&env->lock);
    if (s) {                    /* (it lives until lio_env_close) */
        pthread_mutex_lock(&s->mu);
        while (!s->done)
            pthread_cond_wait(&s->ended, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    return __atomic_load_n(&d->scanned, __ATOMIC_RELAXED);
}

void lio_leafdir_scan_stop(lio_env *env)
{
    struct lio_leafscan *s;
    pthread_mutex_lock(&env->lock);
    s = env->scan;
    env->scan = NULL;
    pthread_mutex_unlock(&env->lock);
    if (!s)
        return;
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    if (s->pid == getpid()) {
        pthread_join(s->tid, NULL);
        pthread_cond_destroy(&s->ended);
        pthread_mutex_destroy(&s->mu);
    }   /* (else a forked child: no such thread, mu as the fork left it) */
    lio_leafdir_release(env, s->dir);
    free(s);
}

int lio_leafdir_get(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                    lio_leafdir **out)
{
    lio_leafdir_slot *s, *pick = NULL;
    uint64_t need;
    size_t budget;
    lio_leafdir *d;
    *out = NULL;
    /* (a recorded depth past LIO_MAX_DEPTH is corrupt: the descent says
     * so, and the build's recursion stays bounded) */
    if (db->depth < 2 || db->depth > LIO_MAX_DEPTH ||
        db->root == LIO_EMPTY_ROOT ||
        lio_key_cmp_kind(db->flags) != LIO_CMP_MEMN)
        return 0;
    need = db->branch_pages * LEAFDIR_PER_BRANCH;
    if (need < LEAFDIR_MIN_LOOKUPS)
        need = LEAFDIR_MIN_LOOKUPS;
    pthread_mutex_lock(&env->lock);
    for (unsigned i = 0; i < LIO_LEAFDIR_SLOTS; i++) {
        s = &env->leafdirs[i];
        if (s->root == db->root && s->txnid == snap->txnid && s->used) {
            pick = s;
            break;
        }
        /* else replace the least used slot that is not being built */
        if (!s->building && (!pick || !s->used ||
                             (pick->used && s->lookups < pick->lookups)))
            pick = s;
    }
    if (!pick) {                    /* every slot is being built */
        pthread_mutex_unlock(&env->lock);
        return 1;
    }
    s = pick;
    if (!(s->used && s->root == db->root && s->txnid == snap->txnid)) {
        if (s->dir && --s->dir->refs == 0)
            dir_free(s->dir);
        memset(s, 0, sizeof *s);
        s->used = 1;
        s->root = db->root;
        s->txnid = snap->txnid;
    }
    if (s->dir) {
        s->dir->refs++;
        *out = s->dir;
        pthread_mutex_unlock(&env->lock);
        return 1;
    }
    if (s->failed) {
        pthread_mutex_unlock(&env->lock);
        return 0;
    }
    if (s->building || ++s->lookups < need) {
        pthread_mutex_unlock(&env->lock);
        return 1;
    }
    s->building = 1;
    budget = env->max_pages * env->psize / 2;
    pthread_mutex_unlock(&env->lock);

    d = build(env, snap, db, budget);

    pthread_mutex_lock(&env->lock);
    /* the slot stays ours while building (never replaced meanwhile) */
    s->building = 0;
    if (d) {
        s->dir = d;
        d->refs++;
        *out = d;
    } else {
        s->failed = 1;
    }
    pthread_mutex_unlock(&env->lock);
    return d != NULL;
}

void lio_leafdir_release(lio_env *env, lio_leafdir *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&env->lock);
    if (--d->refs == 0)
        dir_free(d);
    pthread_mutex_unlock(&env->lock);
}

void lio_leafdirs_free(lio_env *env)
{
    for (unsigned i = 0; i < LIO_LEAFDIR_SLOTS; i++) {
        lio_leafdir *d = env->leafdirs[i].dir;
        if (d && --d->refs == 0)
            dir_free(d);
        env->leafdirs[i].dir = NULL;
    }
}
