/* Structural verifier: walk every tree of a snapshot and check every
 * invariant of the format (docs/format.md), reporting each problem with its page.
 *
 * Trees: the free DB, the main DB, every named DB, every duplicate sub-tree.
 * Checked: page headers and node bounds (lio_check_page), tree depth, page
 * kinds per level, key order within each page and across pages (each child
 * of a branch holds keys >= its separator and < the next one, under the
 * tree's comparator), integer key sizes, node layout (nodes packed from
 * mp_upper to the end, as liblmdb keeps them), overflow runs (flags, page
 * count, within the snapshot), sub-pages, named and duplicate database
 * records, the page / record counts of every MDB_db record (see
 * check_counts for the DUPSORT counts liblmdb versions keep differently:
 * reported as notes), free-list records (sorted largest first), the other
 * meta page's records, and the accounting of pages: every page from 2 to
 * mm_last_pg is reachable exactly once or listed free exactly once (never
 * both), nothing reachable lies past mm_last_pg or the end of the file.
 *
 * Pages are read one at a time into per-level buffers (not the cache); the
 * only memory that grows with the file is two bitmaps (2 bits per page).
 *
 * May call: errors.c, format.c (page checks, key order), pager.c
 * (lio_read_into), env.c (lio_env_read_metas) and cursor.c (lio_named_db). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"

#define VLEVELS (2 * LIO_MAX_DEPTH + 2)

enum { T_MAIN, T_NAMED, T_FREE, T_DUP };

typedef struct named_db {
    uint8_t *name;
    size_t len;
    lio_dbrec rec;
    uint64_t pgno;           /* leaf holding the record */
} named_db;

typedef struct vtree {
    char name[160];          /* for messages */
    int kind;
    lio_dbrec db;
    uint64_t rec_pgno;       /* page holding the record */
    int cmp, dcmp;
    size_t keysize;          /* INTEGERKEY: size of the keys (0: none yet) */
    size_t dupsize;          /* INTEGERDUP: size of the values */
    uint64_t branch, leaf, overflow, entries;  /* the tree's own pages */
    uint64_t sub_branch, sub_leaf;  /* pages of its duplicate sub-trees */
} vtree;

typedef struct vstate {
    lio_env *env;
    const lio_meta *snap;
    const lio_verify_opts *o;
    lio_verify_stats *st;
    lio_error *err;
    uint32_t psize;
    uint64_t map_pages;      /* pages the bitmaps cover */
    uint64_t file_pages;
    uint8_t *used, *freed;
    uint64_t *tail;          /* free pages listed past the end of the file */
    size_t ntail, tail_cap;
    uint8_t *bufs[VLEVELS];
    size_t caps[VLEVELS];
    uint8_t *ovbuf;
    size_t ovcap;
    named_db *named;
    size_t nnamed, named_cap;
    int stop;
    int fatal;
} vstate;

/* ---- reporting ------------------------------------------------------- */

/* One finding, formatted, counted and handed to the caller's callback: a
 * problem (damage) or a note (what a healthy file may show). */
static void vfinding(vstate *v, uint64_t pgno, int is_note, const char *fmt,
                     va_list ap) __attribute__((format(printf, 4, 0)));

static void vfinding(vstate *v, uint64_t pgno, int is_note, const char *fmt,
                     va_list ap)
{
    char msg[512];
    if (v->stop)
        return;
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (is_note) {
        v->st->notes++;
        if (v->o && v->o->note)
            v->o->note(v->o->ctx, pgno, msg);
        return;
    }
    v->st->problems++;
    if (v->o && v->o->report)
        v->o->report(v->o->ctx, pgno, msg);
    if (v->o && v->o->max_problems && v->st->problems >= v->o->max_problems)
        v->stop = 1;
}

static void problem(vstate *v, uint64_t pgno, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void problem(vstate *v, uint64_t pgno, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfinding(v, pgno, 0, fmt, ap);
    va_end(ap);
}

/* Something a healthy file may show that a reader should know about. */
static void note(vstate *v, uint64_t pgno, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void note(vstate *v, uint64_t pgno, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfinding(v, pgno, 1, fmt, ap);
    va_end(ap);
}

static void fatal(vstate *v, int rc, const lio_error *e)
{
    if (!v->fatal) {
        v->fatal = rc;
        if (v->err && e && e != v->err)
            *v->err = *e;
    }
    v->stop = 1;
}

static void count_page(vstate *v)
{
    v->st->pages_read++;
    if (v->o && v->o->progress && v->o->progress_every &&
        v->st->pages_read % v->o->progress_every == 0) {
        if (v->o->progress(v->o->ctx, v->st->pages_read,
                           v->snap->last_pg + 1)) {
            lio_error e;
            lio_fail(&e, LIO_EINVAL, LIO_NO_PAGE, "verification interrupted");
            fatal(v, LIO_EINVAL, &e);
        }
    }
}

/* ---- page accounting ----------------------------------------------------- */

static int bit(const uint8_t *map, uint64_t i) { return (map[i >> 3] >> (i & 7)) & 1; }
static void set_bit(uint8_t *map, uint64_t i) { map[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* Mark page pgno in use.  0: newly marked; -1: a problem was reported
 * (already in use, or outside the snapshot / the file). */
static int mark_used(vstate *v, vtree *t, uint64_t pgno, uint64_t from)
{
    unsigned long long pg = (unsigned long long)pgno;
    if (pgno < 2) {
        problem(v, from, "page %llu (%s) points at meta page %llu",
                (unsigned long long)from, t->name, pg);
        return -1;
    }
    if (pgno > v->snap->last_pg) {
        problem(v, pgno, "page %llu (%s, reached from page %llu) is past the "
                "snapshot's last page %llu", pg, t->name,
                (unsigned long long)from,
                (unsigned long long)v->snap->last_pg);
        return -1;
    }
    if (pgno >= v->map_pages) {
        problem(v, pgno, "page %llu (%s, reached from page %llu) is past the "
                "end of the file (%llu pages)", pg, t->name,
                (unsigned long long)from, (unsigned long long)v->file_pages);
        return -1;
    }
    if (bit(v->used, pgno)) {
        problem(v, pgno, "page %llu (%s, reached from page %llu) is reached "
                "a second time", pg, t->name, (unsigned long long)from);
        return -1;
    }
    set_bit(v->used, pgno);
    return 0;
}

static void mark_free(vstate *v, uint64_t pgno, uint64_t from, uint64_t txn)
{
    unsigned long long pg = (unsigned long long)pgno;
    if (pgno < 2 || pgno > v->snap->last_pg) {
        problem(v, from, "page %llu: the free list of txn %llu lists page "
                "%llu, %s", (unsigned long long)from, (unsigned long long)txn,
                pg, pgno < 2 ? "a meta page" : "past the snapshot's last page");
        return;
    }
    v->st->free_pages++;
    if (pgno >= v->map_pages) {
        if (lio_grow((void **)&v->tail, &v->tail_cap, v->ntail + 1,
                     sizeof *v->tail)) {
            lio_error e;
            lio_fail(&e, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
            fatal(v, LIO_ENOMEM, &e);
            return;
        }
        v->tail[v->ntail++] = pgno;
        return;
    }
    if (bit(v->freed, pgno)) {
        problem(v, pgno, "page %llu is listed free twice (again by txn %llu's "
                "record on page %llu)", pg, (unsigned long long)txn,
                (unsigned long long)from);
        return;
    }
    set_bit(v->freed, pgno);
}

/* Every page 2..last_pg: reachable once or free once, never both. */
static void account(vstate *v)
{
    uint64_t i, start = 0;
    int cur = 0; /* 0 ok, 1 leaked, 2 both */
    for (i = 2; i <= v->map_pages && !v->stop; i++) {
        int s = 0;
        if (i < v->map_pages) {
            int u = bit(v->used, i), f = bit(v->freed, i);
            s = u && f ? 2 : !u && !f ? 1 : 0;
        }
        if (s == cur)
            continue;
        if (cur) {
            if (start == i - 1)
                problem(v, start, cur == 1
                        ? "page %llu is neither reachable nor listed free"
                        : "page %llu is both reachable and listed free",
                        (unsigned long long)start);
            else
                problem(v, start, cur == 1
                        ? "pages %llu..%llu are neither reachable nor listed free"
                        : "pages %llu..%llu are both reachable and listed free",
                        (unsigned long long)start, (unsigned long long)(i - 1));
        }
        cur = s;
        start = i;
    }
    if (v->stop || v->snap->last_pg < v->map_pages)
        return;
    /* Pages past the end of the file, up to last_pg: all must be free. */
    if (v->ntail)
        qsort(v->tail, v->ntail, sizeof *v->tail, lio_cmp_u64);
    {
        uint64_t distinct = 0;
        for (size_t j = 0; j < v->ntail; j++) {
            if (j && v->tail[j] == v->tail[j - 1]) {
                problem(v, v->tail[j], "page %llu is listed free twice",
                        (unsigned long long)v->tail[j]);
                continue;
            }
            distinct++;
        }
        if (distinct != v->snap->last_pg + 1 - v->map_pages)
            problem(v, v->map_pages, "pages %llu..%llu lie past the end of "
                    "the file (%llu pages) but only %llu of them are listed "
                    "free", (unsigned long long)v->map_pages,
                    (unsigned long long)v->snap->last_pg,
                    (unsigned long long)v->file_pages,
                    (unsigned long long)distinct);
    }
}

/* ---- reading ----------------------------------------------------------- */

/* Read page pgno (already checked to lie in the file) into level slot's
 * buffer.  NULL after reporting a problem or a fatal error. */
static const uint8_t *read_page(vstate *v, unsigned slot, uint64_t pgno)
{
    const uint8_t *p;
    lio_error e;
    int rc = lio_read_into(v->env, pgno * v->psize, v->psize, &v->bufs[slot],
                           &v->caps[slot], &p, pgno, &e);
    if (rc == LIO_PAGE_NOTFOUND || rc == LIO_CORRUPTED) {
        problem(v, pgno, "%s", e.msg);
        return NULL;
    }
    if (rc) {
        fatal(v, rc, &e);
        return NULL;
    }
    count_page(v);
    return p;
}

/* ---- trees ------------------------------------------------------------- */

static void walk(vstate *v, vtree *t, uint64_t pgno, unsigned level,
                 unsigned slot, const lio_val *lo, const lio_val *hi,
                 uint64_t parent);

static void get_key(const vtree *t, const uint8_t *p, unsigned i, size_t pad,
                    lio_val *k)
{
    (void)t;
    if (pg_flags(p) & P_LEAF2) {
        k->size = pad;
        k->data = p + PAGEHDRSZ + (size_t)i * pad;
    } else {
        const uint8_t *nd = pg_node(p, i);
        k->size = nd_ksize(nd);
        k->data = nd_key(nd);
    }
}

/* Keys first..n-1 of page p (a tree page or a sub-page): strictly
 * ascending under cmp, inside [lo, hi), integer sizes consistent. */
static void check_keys(vstate *v, vtree *t, const uint8_t *p, unsigned first,
                       size_t pad, int cmp, size_t *intsize, uint64_t pgno,
                       const char *what, const lio_val *lo, const lio_val *hi)
{
    unsigned n = pg_numkeys(p);
    lio_val prev = {NULL, 0}, k;
    unsigned long long pg = (unsigned long long)pgno;
    for (unsigned i = first; i < n && !v->stop; i++) {
        get_key(t, p, i, pad, &k);
        if (cmp == LIO_CMP_INT) {
            if (k.size != 4 && k.size != 8) {
                problem(v, pgno, "page %llu (%s): %s %u is %zu bytes, not a "
                        "4- or 8-byte integer", pg, t->name, what, i, k.size);
                return;
            }
            if (*intsize == 0)
                *intsize = k.size;
            else if (*intsize != k.size) {
                problem(v, pgno, "page %llu (%s): %s %u is a %zu-byte "
                        "integer where the others are %zu bytes", pg, t->name,
                        what, i, k.size, *intsize);
                return;
            }
        }
        if (i > first && lio_cmp(cmp, &prev, &k) >= 0) {
            problem(v, pgno, "page %llu (%s): %s %u is not above %s %u "
                    "(out of order)", pg, t->name, what, i, what, i - 1);
            return;
        }
        if (i == first && lo && lo->data && lio_cmp(cmp, &k, lo) < 0) {
            problem(v, pgno, "page %llu (%s): %s %u is below the separator "
                    "key its parent gives it (children out of key order)",
                    pg, t->name, what, i);
            return;
        }
        prev = k;
    }
    if (n > first && hi && hi->data && !v->stop &&
        lio_cmp(cmp, &prev, hi) >= 0)
        problem(v, pgno, "page %llu (%s): %s %u is not below the next "
                "separator key of its parent (children out of key order)",
                pg, t->name, what, n - 1);
}

/* A tree's record against what the walk counted.
 *
 * md_entries and md_overflow_pages are exact in every liblmdb.  The branch
 * and leaf page counts of a DUPSORT database are not: liblmdb up to 0.9.24
 * at least (Debian's mdb_load) counts only the tree's own pages, later
 * versions (py-lmdb's 0.9.3x) also add every page its duplicate sub-trees
 * allocate and take back only pages freed one by one, not those of a set of
 * duplicates deleted whole.  So for DUPSORT the own pages plus the sub-tree
 * pages is the expected value, the own pages alone is the older writers'
 * value, and any other value is a count that a history of deletions (or of
 * both kinds of writer) leaves behind: a note, never damage.  The counts are
 * statistics only; no reader uses them. */
static void check_counts(vstate *v, vtree *t)
{
    static const char *names[] = {"md_branch_pages", "md_leaf_pages",
                                  "md_overflow_pages", "md_entries"};
    uint64_t want[4] = {t->db.branch_pages, t->db.leaf_pages,
                        t->db.overflow_pages, t->db.entries};
    uint64_t have[4] = {t->branch + t->sub_branch, t->leaf + t->sub_leaf,
                        t->overflow, t->entries};
    uint64_t own[2] = {t->branch, t->leaf};
    int dupsort = t->kind != T_DUP && (t->db.flags & LIO_DUPSORT);
    for (int i = 0; i < 4; i++) {
        unsigned long long w = (unsigned long long)want[i];
        if (want[i] == have[i])
            continue;
        if (dupsort && i < 2 && want[i] == own[i])
            note(v, t->rec_pgno, "the record of %s (page %llu) says %s = %llu: "
                 "its own pages, without the %llu of its duplicate sub-trees, "
                 "as liblmdb 0.9.24 and older count them (not damage)",
                 t->name, (unsigned long long)t->rec_pgno, names[i], w,
                 (unsigned long long)(have[i] - own[i]));
        else if (dupsort && i < 2)
            note(v, t->rec_pgno, "the record of %s (page %llu) says %s = %llu, "
                 "the tree has %llu (%llu of its own, %llu in duplicate "
                 "sub-trees): liblmdb keeps this count inexactly for DUPSORT "
                 "databases where duplicates were deleted (not damage)",
                 t->name, (unsigned long long)t->rec_pgno, names[i], w,
                 (unsigned long long)have[i], (unsigned long long)own[i],
                 (unsigned long long)(have[i] - own[i]));
        else
            problem(v, t->rec_pgno, "page %llu: the record of %s (root %llu) "
                    "says %s = %llu, the tree has %llu",
                    (unsigned long long)t->rec_pgno, t->name,
                    (unsigned long long)t->db.root, names[i], w,
                    (unsigned long long)have[i]);
    }
}

static void walk_tree(vstate *v, vtree *t, unsigned slot)
{
    if (t->db.root == LIO_EMPTY_ROOT) {
        if (t->db.depth || t->db.branch_pages || t->db.leaf_pages ||
            t->db.overflow_pages || t->db.entries)
            problem(v, t->rec_pgno, "page %llu: the record of the empty %s "
                    "has nonzero depth or counts",
                    (unsigned long long)t->rec_pgno, t->name);
        return;
    }
    if (t->db.depth == 0 || t->db.depth > LIO_MAX_DEPTH) {
        problem(v, t->rec_pgno, "page %llu: %s has impossible depth %u",
                (unsigned long long)t->rec_pgno, t->name, t->db.depth);
        return;
    }
    v->st->trees++;
    walk(v, t, t->db.root, 0, slot, NULL, NULL, t->rec_pgno);
    if (!v->stop)
        check_counts(v, t);
}

/* An overflow run: checks, marks its pages; *data gets the whole value
 * when want_data (free-list records), else only the header is read. */
static int check_overflow(vstate *v, vtree *t, uint64_t leafpg, unsigned i,
                          uint64_t ov, uint32_t size, int want_data,
                          const uint8_t **data)
{
    uint64_t need = (PAGEHDRSZ + (uint64_t)size + v->psize - 1) / v->psize;
    uint64_t pages, end;
    const uint8_t *h;
    lio_error e;
    int rc;
    unsigned long long lp = (unsigned long long)leafpg;
    if (ov < 2 || ov > v->snap->last_pg || ov >= v->map_pages) {
        problem(v, leafpg, "page %llu (%s): node %u's overflow page %llu is "
                "%s", lp, t->name, i, (unsigned long long)ov,
                ov < 2 ? "a meta page" : ov > v->snap->last_pg
                ? "past the snapshot's last page" : "past the end of the file");
        return -1;
    }
    rc = lio_read_into(v->env, ov * v->psize,
                       want_data ? PAGEHDRSZ + (size_t)size : PAGEHDRSZ,
                       &v->ovbuf, &v->ovcap, &h, ov, &e);
    if (rc == LIO_PAGE_NOTFOUND) {
        problem(v, ov, "page %llu (%s): the %u-byte value of node %u on page "
                "%llu runs past the end of the file", (unsigned long long)ov,
                t->name, size, i, lp);
        return -1;
    }
    if (rc) {
        fatal(v, rc, &e);
        return -1;
    }
    count_page(v);
    if (pg_pgno(h) != ov || pg_flags(h) != P_OVERFLOW) {
        problem(v, ov, "page %llu (%s, value of node %u on page %llu): not "
                "an overflow page (page number %llu, flags 0x%x)",
                (unsigned long long)ov, t->name, i, lp,
                (unsigned long long)pg_pgno(h), pg_flags(h));
        return -1;
    }
    pages = pg_ovpages(h);
    if (pages < need) {
        problem(v, ov, "page %llu (%s): overflow run of %llu pages cannot "
                "hold the %u-byte value of node %u on page %llu",
                (unsigned long long)ov, t->name, (unsigned long long)pages,
                size, i, lp);
        return -1;
    }
    end = ov + pages - 1;
    if (end > v->snap->last_pg) {
        problem(v, ov, "page %llu (%s): overflow run of %llu pages runs past "
                "the snapshot's last page %llu", (unsigned long long)ov,
                t->name, (unsigned long long)pages,
                (unsigned long long)v->snap->last_pg);
        return -1;
    }
    if (mark_used(v, t, ov, leafpg))
        return -1;
    for (uint64_t pg = ov + 1; pg <= end && !v->stop; pg++) {
        if (pg >= v->map_pages) {
            problem(v, ov, "page %llu (%s): overflow run of %llu pages runs "
                    "past the end of the file", (unsigned long long)ov,
                    t->name, (unsigned long long)pages);
            return -1;
        }
        if (bit(v->used, pg)) {
            problem(v, pg, "page %llu, inside the overflow run at page %llu "
                    "(%s), is reached a second time", (unsigned long long)pg,
                    (unsigned long long)ov, t->name);
            return -1;
        }
        set_bit(v->used, pg);
    }
    t->overflow += pages;
    if (data)
        *data = h + PAGEHDRSZ;
    return 0;
}

static void free_record(vstate *v, vtree *t, uint64_t pgno, unsigned i,
                        const lio_val *key, const uint8_t *data, uint32_t size)
{
    uint64_t txn, count;
    unsigned long long pg = (unsigned long long)pgno;
    if (key->size != 8) {
        problem(v, pgno, "page %llu (%s): key %u is %zu bytes, not an 8-byte "
                "txnid", pg, t->name, i, key->size);
        return;
    }
    txn = ld64(key->data);
    if (txn > v->snap->txnid)
        problem(v, pgno, "page %llu (%s): record %u is keyed by txn %llu, "
                "after the snapshot's txn %llu", pg, t->name, i,
                (unsigned long long)txn, (unsigned long long)v->snap->txnid);
    if (size < 8) {
        problem(v, pgno, "page %llu (%s): record %u of %u bytes holds no page "
                "count", pg, t->name, i, size);
        return;
    }
    count = ld64(data);
    if (count > (size - 8) / 8) {
        problem(v, pgno, "page %llu (%s): record %u lists %llu pages in %u "
                "bytes", pg, t->name, i, (unsigned long long)count, size);
        return;
    }
    for (uint64_t j = 0, said = 0; j < count && !v->stop; j++) {
        uint64_t fp = ld64(data + 8 + 8 * j);
        /* liblmdb keeps page lists sorted, largest first */
        if (j && fp >= ld64(data + 8 * j) && !said++)
            problem(v, pgno, "page %llu (%s): the free list of txn %llu is "
                    "not in descending order (page %llu after %llu)", pg,
                    t->name, (unsigned long long)txn, (unsigned long long)fp,
                    (unsigned long long)ld64(data + 8 * j));
        mark_free(v, fp, pgno, txn);
    }
}

static void add_named(vstate *v, const lio_val *key, const uint8_t *rec,
                      uint64_t pgno)
{
    named_db *nd;
    if (lio_grow((void **)&v->named, &v->named_cap, v->nnamed + 1,
                 sizeof *v->named))
        goto oom;
    nd = &v->named[v->nnamed];
    nd->name = malloc(key->size ? key->size : 1);
    if (!nd->name)
        goto oom;
    memcpy(nd->name, key->data, key->size);
    nd->len = key->size;
    lio_parse_dbrec(rec, &nd->rec);
    nd->pgno = pgno;
    v->nnamed++;
    return;
oom: {
        lio_error e;
        lio_fail(&e, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        fatal(v, LIO_ENOMEM, &e);
    }
}

static void name_tree(char *buf, size_t cap, const uint8_t *name, size_t len)
{
    size_t j = 0;
    int n = snprintf(buf, cap, "named DB '");
    j = n > 0 ? (size_t)n : 0;
    for (size_t i = 0; i < len && j + 8 < cap; i++) {
        uint8_t c = name[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'')
            buf[j++] = (char)c;
        else
            j += (size_t)snprintf(buf + j, cap - j, "\\x%02x", c);
    }
    if (j + 8 >= cap && len)
        j += (size_t)snprintf(buf + j, cap - j, "...");
    snprintf(buf + j, cap - j, "'");
}

/* Node layout of a branch/leaf page or sub-page already through
 * lio_check_page: liblmdb keeps node data packed from mp_upper to the end
 * (each node 8 header bytes, its key, its data or, for an overflow value, 8
 * bytes; rounded up to even; a branch node has no data), so every node
 * starts at or above mp_upper and together they fill that area exactly. */
static void check_layout(vstate *v, vtree *t, const uint8_t *p, uint32_t size,
                         uint64_t pgno, const char *where)
{
    unsigned n = pg_numkeys(p), upper = pg_upper(p);
    int branch = (pg_flags(p) & P_BRANCH) != 0;
    uint64_t total = 0;
    unsigned long long pg = (unsigned long long)pgno;
    if (pg_flags(p) & P_LEAF2)
        return;
    for (unsigned i = 0; i < n; i++) {
        unsigned off = ld16(p + PAGEHDRSZ + 2 * i);
        const uint8_t *nd = p + off;
        uint64_t sz = NODEHDRSZ + (uint64_t)nd_ksize(nd);
        if (!branch)
            sz += (nd_flags(nd) & F_BIGDATA) ? 8 : nd_dsize(nd);
        if (off < upper) {
            problem(v, pgno, "page %llu (%s%s): node %u starts at %u, in the "
                    "free space below mp_upper %u", pg, t->name, where, i,
                    off, upper);
            return;
        }
        total += (sz + 1) & ~(uint64_t)1;
    }
    if (total != size - upper)
        problem(v, pgno, "page %llu (%s%s): its %u nodes take %llu bytes, the "
                "node area from mp_upper %u to the end holds %u", pg, t->name,
                where, n, (unsigned long long)total, upper, size - upper);
}

static void leaf_nodes(vstate *v, vtree *t, const uint8_t *p, uint64_t pgno,
                       unsigned slot)
{
    unsigned n = pg_numkeys(p);
    int dupsort = (t->db.flags & LIO_DUPSORT) != 0;
    unsigned long long pg = (unsigned long long)pgno;
    for (unsigned i = 0; i < n && !v->stop; i++) {
        const uint8_t *nd = pg_node(p, i);
        uint16_t f = nd_flags(nd);
        uint32_t dsize = nd_dsize(nd);
        lio_val key = {nd_key(nd), nd_ksize(nd)};
        if (f & F_BIGDATA) {
            const uint8_t *data = NULL;
            if (dupsort)
                problem(v, pgno, "page %llu (%s): node %u has an overflow "
                        "value in a DUPSORT database", pg, t->name, i);
            t->entries++;
            if (check_overflow(v, t, pgno, i, ld64(nd_data(nd)), dsize,
                               t->kind == T_FREE, &data) == 0 &&
                t->kind == T_FREE)
                free_record(v, t, pgno, i, &key, data, dsize);
            continue;
        }
        if (t->kind == T_FREE) {
            t->entries++;
            if (f)
                problem(v, pgno, "page %llu (%s): node %u has flags 0x%x",
                        pg, t->name, i, f);
            else
                free_record(v, t, pgno, i, &key, nd_data(nd), dsize);
            continue;
        }
        if (f == F_SUBDATA) {
            t->entries++;
            if (t->kind != T_MAIN)
                problem(v, pgno, "page %llu (%s): node %u holds a named "
                        "database record outside the main DB", pg, t->name, i);
            else
                add_named(v, &key, nd_data(nd), pgno);
            continue;
        }
        if (f & F_DUPDATA) {
            if (!dupsort) {
                problem(v, pgno, "page %llu (%s): node %u has F_DUPDATA in a "
                        "database without DUPSORT", pg, t->name, i);
                t->entries++;
                continue;
            }
            if (f & F_SUBDATA) {
                vtree sub;
                uint16_t want = (t->db.flags & LIO_DUPFIXED)
                    ? (LIO_DUPFIXED | ((t->db.flags & LIO_INTEGERDUP)
                                       ? LIO_INTEGERKEY : 0)) : 0;
                memset(&sub, 0, sizeof sub);
                snprintf(sub.name, sizeof sub.name,
                         "duplicates of node %u on page %llu", i, pg);
                sub.kind = T_DUP;
                lio_parse_dbrec(nd_data(nd), &sub.db);
                sub.rec_pgno = pgno;
                sub.cmp = t->dcmp;
                sub.dcmp = t->dcmp;
                t->entries += sub.db.entries;
                if (sub.db.flags != want) {
                    problem(v, pgno, "page %llu (%s): node %u's duplicate "
                            "sub-database has flags 0x%x, expected 0x%x", pg,
                            t->name, i, sub.db.flags, want);
                    continue;
                }
                if (sub.db.root == LIO_EMPTY_ROOT || sub.db.entries == 0) {
                    problem(v, pgno, "page %llu (%s): node %u's duplicate "
                            "sub-database is empty", pg, t->name, i);
                    continue;
                }
                if (slot + 1 + sub.db.depth > VLEVELS) {
                    problem(v, pgno, "page %llu (%s): node %u's duplicate "
                            "sub-database has impossible depth %u", pg,
                            t->name, i, sub.db.depth);
                    continue;
                }
                walk_tree(v, &sub, slot + 1);
                /* for the parent's record (check_counts) */
                t->sub_branch += sub.branch;
                t->sub_leaf += sub.leaf;
                t->overflow += sub.overflow;
                continue;
            } else {
                const uint8_t *sp = nd_data(nd);
                lio_error e;
                int fixed = (t->db.flags & LIO_DUPFIXED) != 0;
                size_t pad = 0;
                if (lio_check_page(sp, dsize, pgno, 1, &e)) {
                    problem(v, pgno, "%s (node %u, %s)", e.msg, i, t->name);
                    t->entries++;
                    continue;
                }
                t->entries += pg_numkeys(sp);
                check_layout(v, t, sp, dsize, pgno, ", a sub-page");
                if (((pg_flags(sp) & P_LEAF2) != 0) != fixed) {
                    problem(v, pgno, "page %llu (%s): node %u's sub-page %s "
                            "LEAF2", pg, t->name, i, fixed ? "is not" : "is");
                    continue;
                }
                if (fixed) {
                    pad = pg_pad(sp);
                    if (pad == 0 ||
                        PAGEHDRSZ + (uint64_t)pg_numkeys(sp) * pad > dsize) {
                        problem(v, pgno, "page %llu (%s): node %u's LEAF2 "
                                "sub-page values (%zu bytes each) run past the "
                                "node", pg, t->name, i, pad);
                        continue;
                    }
                }
                check_keys(v, t, sp, 0, pad, t->dcmp, &t->dupsize, pgno,
                           "duplicate value", NULL, NULL);
                continue;
            }
        }
        if (f) {
            problem(v, pgno, "page %llu (%s): node %u has flags 0x%x", pg,
                    t->name, i, f);
            continue;
        }
        t->entries++;
    }
}

static void walk(vstate *v, vtree *t, uint64_t pgno, unsigned level,
                 unsigned slot, const lio_val *lo, const lio_val *hi,
                 uint64_t parent)
{
    const uint8_t *p;
    lio_error e;
    unsigned n;
    int leaf, want_leaf = level + 1 == t->db.depth;
    int fixed = t->kind == T_DUP && (t->db.flags & LIO_DUPFIXED);
    unsigned long long pg = (unsigned long long)pgno;
    size_t pad = 0;

    if (v->stop)
        return;
    if (slot >= VLEVELS || level >= t->db.depth) {
        problem(v, parent, "page %llu (%s): the tree is deeper than its "
                "recorded depth %u", (unsigned long long)parent, t->name,
                t->db.depth);
        return;
    }
    if (mark_used(v, t, pgno, parent))
        return;
    if (!(p = read_page(v, slot, pgno)))
        return;
    if (pg_pgno(p) != pgno) {
        problem(v, pgno, "page %llu (%s) carries page number %llu in its "
                "header", pg, t->name, (unsigned long long)pg_pgno(p));
        return;
    }
    if (lio_check_page(p, v->psize, pgno, 0, &e)) {
        problem(v, pgno, "%s (%s)", e.msg, t->name);
        return;
    }
    leaf = (pg_flags(p) & P_LEAF) != 0;
    if (leaf != want_leaf) {
        problem(v, pgno, "page %llu (%s): a %s page at level %u where the "
                "tree's depth %u puts a %s", pg, t->name,
                leaf ? "leaf" : "branch", level, t->db.depth,
                want_leaf ? "leaf" : "branch");
        return;
    }
    if (leaf && ((pg_flags(p) & P_LEAF2) != 0) != (fixed != 0)) {
        problem(v, pgno, "page %llu (%s): %s", pg, t->name, fixed
                ? "a leaf of a fixed-size duplicate tree is not LEAF2"
                : "a LEAF2 page outside a fixed-size duplicate tree");
        return;
    }
    n = pg_numkeys(p);
    check_layout(v, t, p, v->psize, pgno, "");
    if (pg_flags(p) & P_LEAF2) {
        pad = t->db.pad;
        if (pad == 0 || pad > LIO_MAX_KEY_SIZE ||
            PAGEHDRSZ + (uint64_t)n * pad > v->psize) {
            problem(v, pgno, "page %llu (%s): LEAF2 keys of %zu bytes run "
                    "past the page", pg, t->name, pad);
            return;
        }
        if (pg_pad(p) != pad)
            problem(v, pgno, "page %llu (%s): LEAF2 key size %u differs from "
                    "the tree's %zu", pg, t->name, pg_pad(p), pad);
    }
    if (!leaf) {
        t->branch++;
        if (nd_ksize(pg_node(p, 0)) != 0)
            problem(v, pgno, "page %llu (%s): branch node 0 has a %u-byte key "
                    "(it must be empty)", pg, t->name,
                    nd_ksize(pg_node(p, 0)));
        check_keys(v, t, p, 1, 0, t->cmp, &t->keysize, pgno, "key", lo, hi);
        for (unsigned i = 0; i < n && !v->stop; i++) {
            lio_val klo, khi;
            const lio_val *clo = lo, *chi = hi;
            if (i > 0) {
                get_key(t, p, i, 0, &klo);
                clo = &klo;
            }
            if (i + 1 < n) {
                get_key(t, p, i + 1, 0, &khi);
                chi = &khi;
            }
            walk(v, t, nd_child(pg_node(p, i)), level + 1, slot + 1, clo, chi,
                 pgno);
        }
        return;
    }
    t->leaf++;
    check_keys(v, t, p, 0, pad, t->cmp, &t->keysize, pgno, "key", lo, hi);
    if (pg_flags(p) & P_LEAF2)
        t->entries += n;
    else
        leaf_nodes(v, t, p, pgno, slot);
}

static void init_tree(vtree *t, int kind, const char *name,
                      const lio_dbrec *db, uint64_t rec_pgno)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->db = *db;
    if (kind == T_FREE)
        t->db.flags = LIO_INTEGERKEY;
    t->rec_pgno = rec_pgno;
    t->cmp = lio_key_cmp_kind(t->db.flags);
    t->dcmp = lio_dup_cmp_kind(t->db.flags);
}

static void walk_named(vstate *v, named_db *nd, unsigned which)
{
    vtree t;
    lio_error e;
    char name[160];
    (void)which;
    name_tree(name, sizeof name, nd->name, nd->len);
    init_tree(&t, T_NAMED, name, &nd->rec, nd->pgno);
    if (lio_check_dbrec(&nd->rec, nd->pgno, &e)) {
        problem(v, nd->pgno, "%s (%s)", e.msg, name);
        return;
    }
    walk_tree(v, &t, 0);
}

/* The other meta page: the snapshot before this one.  Its trees may have
 * been overwritten since, but its own fields must still be sane: a valid
 * main DB record, roots within its last page, which is no later than the
 * current one's (liblmdb only grows mm_last_pg).  A meta page newer than
 * the snapshot is a live writer's commit: not checked. */
static void check_other_meta(vstate *v, uint64_t meta_pg)
{
    lio_meta metas[2];
    lio_error e;
    unsigned o = (unsigned)(meta_pg ^ 1);
    const lio_meta *m;
    int rc = lio_env_read_metas(v->env, metas, &e);
    if (rc) {
        problem(v, o, "%s", e.msg);
        return;
    }
    m = &metas[o];
    if (m->txnid > v->snap->txnid)
        return;  /* a writer committed since the snapshot was taken */
    if (m->last_pg > v->snap->last_pg) {
        problem(v, o, "meta page %u (txn %llu) has last page %llu, past the "
                "current snapshot's %llu (txn %llu)", o,
                (unsigned long long)m->txnid, (unsigned long long)m->last_pg,
                (unsigned long long)v->snap->last_pg,
                (unsigned long long)v->snap->txnid);
        return;
    }
    if (lio_check_dbrec(&m->main_db, o, &e)) {
        problem(v, o, "%s (the main DB record of meta page %u)", e.msg, o);
        return;
    }
    for (int i = 0; i < 2; i++) {
        const lio_dbrec *db = i ? &m->main_db : &m->free_db;
        if (db->root != LIO_EMPTY_ROOT &&
            (db->root < 2 || db->root > m->last_pg || db->depth == 0 ||
             db->depth > LIO_MAX_DEPTH))
            problem(v, o, "meta page %u: the %s DB's root %llu (depth %u) "
                    "lies outside its snapshot (last page %llu)", o,
                    i ? "main" : "free", (unsigned long long)db->root,
                    db->depth, (unsigned long long)m->last_pg);
    }
}

int lio_verify(lio_env *env, const lio_meta *snap, const lio_verify_opts *o,
               lio_verify_stats *st, lio_error *err)
{
    vstate v;
    vtree t;
    uint64_t bytes;
    int64_t fsize;
    uint64_t meta_pg = snap->txnid & 1;

    memset(st, 0, sizeof *st);
    memset(&v, 0, sizeof v);
    v.env = env;
    v.snap = snap;
    v.o = o;
    v.st = st;
    v.err = err;
    v.psize = env->psize;
    fsize = env->src.size(env->src.ctx);
    if (fsize < 0)
        return lio_fail_sys(err, (int)-fsize, 0, "cannot stat the data file");
    pthread_mutex_lock(&env->lock);
    env->file_size = (uint64_t)fsize;
    pthread_mutex_unlock(&env->lock);
    v.file_pages = (uint64_t)fsize / v.psize;
    v.map_pages = snap->last_pg + 1 < v.file_pages ? snap->last_pg + 1
                                                    : v.file_pages;
    bytes = (v.map_pages + 7) / 8 + 1;
    v.used = calloc(bytes, 1);
    v.freed = calloc(bytes, 1);
    if (!v.used || !v.freed) {
        free(v.used);
        free(v.freed);
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    }
    set_bit(v.used, 0);
    set_bit(v.used, 1);

    if (o && o->db_name) {
        lio_dbrec rec;
        char name[160];
        int rc = lio_named_db(env, snap, o->db_name, o->db_name_len, &rec,
                              err);
        if (rc == LIO_SUCCESS) {
            name_tree(name, sizeof name, o->db_name, o->db_name_len);
            init_tree(&t, T_NAMED, name, &rec, LIO_NO_PAGE);
            walk_tree(&v, &t, 0);
        } else {
            v.fatal = rc;
        }
    } else {
        /* The snapshot's own record says nothing is past last_pg. */
        if (snap->last_pg + 1 > v.file_pages)
            st->pages_past_eof = snap->last_pg + 1 - v.file_pages;
        check_other_meta(&v, meta_pg);
        init_tree(&t, T_FREE, "free DB", &snap->free_db, meta_pg);
        walk_tree(&v, &t, 0);
        init_tree(&t, T_MAIN, "main DB", &snap->main_db, meta_pg);
        walk_tree(&v, &t, 0);
        for (size_t i = 0; i < v.nnamed && !v.stop; i++)
            walk_named(&v, &v.named[i], (unsigned)i);
        if (!v.stop)
            account(&v);
    }
    st->named_dbs = v.nnamed;

    for (unsigned i = 0; i < VLEVELS; i++)
        free(v.bufs[i]);
    free(v.ovbuf);
    for (size_t i = 0; i < v.nnamed; i++)
        free(v.named[i].name);
    free(v.named);
    free(v.tail);
    free(v.used);
    free(v.freed);
    if (v.fatal)
        return v.fatal;
    return LIO_SUCCESS;
}
