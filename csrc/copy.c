/* Copies of a snapshot (mdb_env_copy): the meta pages of a copy, and the
 * compacting copy (MDB_CP_COMPACT), which writes byte for byte what
 * liblmdb's `mdb_copy -c` writes.
 *
 * May call: error reporting (lio_fail), the page format (core.h's accessors,
 * lio_parse_dbrec) and the page cache (lio_page_get, lio_read_range).  The
 * bytes go out through the caller's write callback: this file knows no file
 * descriptors.
 *
 * The compacting copy walks every tree of the snapshot (main DB, named DBs,
 * duplicate sub-DBs, overflow runs) and writes its pages renumbered from 2
 * in post-order (children before parents, so the main DB's root is the last
 * page), leaving out the free-page DB and free pages.  Every page number
 * read from the file is checked before use, and no page may be reached
 * twice.  Output goes through two 1 MiB buffers used as liblmdb's copy
 * thread uses them (a tree page copies only its used parts into the buffer,
 * a multi-page overflow run switches buffers), so the bytes a page leaves
 * unused are those liblmdb leaves too. */
#include <stdlib.h>

#include "core.h"

#define WBUF (1024 * 1024)   /* liblmdb's MDB_WBUF */
#define NOSUBDIR 0x4000      /* MDB_NOSUBDIR, kept in the free DB's flags */

static void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static void st_dbrec(uint8_t *p, const lio_dbrec *db)
{
    st32(p, db->pad);
    st16(p + 4, db->flags);
    st16(p + 6, db->depth);
    st64(p + 8, db->branch_pages);
    st64(p + 16, db->leaf_pages);
    st64(p + 24, db->overflow_pages);
    st64(p + 32, db->entries);
    st64(p + 40, db->root);
}

void lio_meta_write(uint8_t *page, unsigned pgno, const lio_meta *m)
{
    st64(page, pgno);
    st16(page + 8, 0);
    st16(page + 10, P_META);
    st32(page + 16, LMDB_MAGIC);
    st32(page + 20, LMDB_DATA_VERSION);
    st64(page + 32, m->mapsize);
    st_dbrec(page + 40, &m->free_db);
    st_dbrec(page + 88, &m->main_db);
    st64(page + 136, m->last_pg);
    st64(page + 144, m->txnid);
}

typedef struct copier {
    lio_env *env;
    const lio_meta *snap;
    uint32_t psize;
    uint64_t next_pgno;
    uint8_t *buf[2];
    size_t wlen[2];
    int t;
    uint8_t *seen;            /* one bit per page up to last_pg */
    lio_write_fn write;
    void *ctx;
    lio_error *err;
} copier;

static int bad(copier *c, int code, uint64_t pgno, const char *what)
{
    return lio_fail(c->err, code, pgno, "page %llu: %s",
                    (unsigned long long)pgno, what);
}

static int put(copier *c, const uint8_t *p, size_t len)
{
    int e = len ? c->write(c->ctx, p, len) : 0;
    if (e)
        return lio_fail_sys(c->err, e, LIO_NO_PAGE, "cannot write the copy");
    return 0;
}

/* mdb_env_cthr_toggle: write out the current buffer (and an overflow run's
 * tail), switch to the other buffer. */
static int toggle(copier *c, const uint8_t *over, size_t over_len)
{
    int rc;
    if ((rc = put(c, c->buf[c->t], c->wlen[c->t])) ||
        (rc = put(c, over, over_len)))
        return rc;
    c->t ^= 1;
    c->wlen[c->t] = 0;
    return 0;
}

/* npages pages from pgno, each reached for the first time, into *out
 * (malloc'ed, freed by the caller). */
static int read_pages(copier *c, uint64_t pgno, uint64_t npages,
                      uint8_t **out)
{
    const uint8_t *data;
    uint64_t last = c->snap->last_pg;
    int rc;
    *out = NULL;
    if (pgno < 2 || pgno > last || npages > last - pgno + 1)
        return lio_fail(c->err, LIO_PAGE_NOTFOUND, pgno, "page %llu: page "
                        "number out of range (last page %llu)",
                        (unsigned long long)pgno, (unsigned long long)last);
    for (uint64_t j = 0; j < npages; j++) {
        uint64_t q = pgno + j;
        if (c->seen[q >> 3] & (1u << (q & 7)))
            return bad(c, LIO_CORRUPTED, q, "page referenced twice");
        c->seen[q >> 3] |= (uint8_t)(1u << (q & 7));
    }
    rc = lio_read_range(c->env, pgno * c->psize, npages * c->psize, out,
                        &data, pgno, c->err);
    if (rc)
        return rc;
    if (data != *out)
        memmove(*out, data, npages * c->psize);
    if (pg_pgno(*out) != pgno) {
        lio_fail(c->err, LIO_CORRUPTED, pgno, "page %llu: page header "
                 "names page %llu", (unsigned long long)pgno,
                 (unsigned long long)pg_pgno(*out));
        free(*out);
        *out = NULL;
        return LIO_CORRUPTED;
    }
    return 0;
}

/* Place a branch/leaf page (mdb_page_copy into the buffer). */
static int emit_tree_page(copier *c, const uint8_t *src, uint64_t *pgno)
{
    uint8_t *dst;
    unsigned lower = pg_lower(src), upper = pg_upper(src);
    unsigned unused = (upper - lower) & ~7u;
    int rc;
    if (c->wlen[c->t] >= WBUF && (rc = toggle(c, NULL, 0)))
        return rc;
    dst = c->buf[c->t] + c->wlen[c->t];
    if (unused && !(pg_flags(src) & P_LEAF2)) {
        unsigned n1 = (lower + 7) & ~7u, up = upper & ~7u;
        memcpy(dst, src, n1);
        memcpy(dst + up, src + up, c->psize - up);
    } else {
        memcpy(dst, src, c->psize - unused);
    }
    *pgno = c->next_pgno++;
    st64(dst, *pgno);
    c->wlen[c->t] += c->psize;
    return 0;
}

static int emit_overflow(copier *c, const uint8_t *run, uint64_t npages,
                         uint64_t *pgno)
{
    uint8_t *dst;
    int rc;
    if (c->wlen[c->t] >= WBUF && (rc = toggle(c, NULL, 0)))
        return rc;
    dst = c->buf[c->t] + c->wlen[c->t];
    memcpy(dst, run, c->psize);
    *pgno = c->next_pgno;
    st64(dst, *pgno);
    c->wlen[c->t] += c->psize;
    c->next_pgno += npages;
    if (npages > 1)
        return toggle(c, run + c->psize, (npages - 1) * c->psize);
    return 0;
}

/* Copy the tree under page pgno (a duplicate sub-DB if dup); *out gets its
 * new page number (mdb_env_cwalk). */
static int copy_page(copier *c, uint64_t pgno, int dup, int depth,
                     uint64_t *out)
{
    uint8_t *p = NULL;
    uint16_t flags, lower, upper;
    uint32_t psize = c->psize;
    unsigned n;
    int rc;
    if (depth >= LIO_MAX_DEPTH)
        return bad(c, LIO_CORRUPTED, pgno, "tree deeper than 32 levels");
    if ((rc = read_pages(c, pgno, 1, &p)))
        return rc;
    flags = pg_flags(p);
    lower = pg_lower(p);
    upper = pg_upper(p);
    if (!(flags & (P_BRANCH | P_LEAF)) ||
        (flags & (P_BRANCH | P_LEAF)) == (P_BRANCH | P_LEAF) ||
        ((flags & P_LEAF2) && !(flags & P_LEAF))) {
        rc = lio_fail(c->err, LIO_CORRUPTED, pgno, "page %llu: not a branch "
                      "or leaf page (flags 0x%x)", (unsigned long long)pgno,
                      flags);
        goto done;
    }
    if (lower < PAGEHDRSZ || lower > upper || upper > psize) {
        rc = lio_fail(c->err, LIO_CORRUPTED, pgno, "page %llu: bad "
                      "lower/upper bounds %u/%u", (unsigned long long)pgno,
                      lower, upper);
        goto done;
    }
    n = (flags & P_LEAF2) ? 0 : (unsigned)(lower - PAGEHDRSZ) / 2;
    for (unsigned i = 0; i < n; i++) {
        unsigned off = ld16(p + PAGEHDRSZ + 2 * i);
        uint8_t *nd = p + off;
        uint16_t nflags, ksize;
        uint64_t child;
        uint32_t dsize;
        if (off < upper || off + NODEHDRSZ > psize) {
            rc = lio_fail(c->err, LIO_CORRUPTED, pgno, "page %llu: node %u "
                          "at bad offset %u", (unsigned long long)pgno, i,
                          off);
            goto done;
        }
        nflags = nd_flags(nd);
        ksize = nd_ksize(nd);
        if (off + NODEHDRSZ + ksize > psize) {
            rc = lio_fail(c->err, LIO_CORRUPTED, pgno, "page %llu: node %u "
                          "key runs past the page", (unsigned long long)pgno,
                          i);
            goto done;
        }
        if (flags & P_BRANCH) {             /* the child's page number */
            if ((rc = copy_page(c, nd_child(nd), dup, depth + 1, &child)))
                goto done;
            st16(nd, (uint16_t)child);       /* lo, hi, flags: 48 bits */
            st16(nd + 2, (uint16_t)(child >> 16));
            st16(nd + 4, (uint16_t)(child >> 32));
            continue;
        }
        if (dup)
            continue;
        dsize = nd_dsize(nd);
        if (nflags & F_BIGDATA) {           /* an overflow run */
            uint8_t *run = NULL;
            const uint8_t *head;
            uint8_t *hbuf = NULL;
            uint64_t ov, npages;
            if (off + NODEHDRSZ + ksize + 8 > psize) {
                rc = lio_fail(c->err, LIO_CORRUPTED, pgno, "page %llu: node "
                              "%u overflow number runs past the page",
                              (unsigned long long)pgno, i);
                goto done;
            }
            ov = ld64(nd + NODEHDRSZ + ksize);
            if (ov < 2 || ov > c->snap->last_pg) {
                rc = bad(c, LIO_PAGE_NOTFOUND, ov, "overflow page out of range");
                goto done;
            }
            rc = lio_read_range(c->env, ov * psize, PAGEHDRSZ, &hbuf, &head,
                                ov, c->err);
            if (rc == LIO_PAGE_NOTFOUND)
                rc = bad(c, LIO_PAGE_NOTFOUND, ov, "overflow page out of range");
            if (rc)
                goto done;
            npages = pg_ovpages(head);
            if (!(pg_flags(head) & P_OVERFLOW)) {
                free(hbuf);
                rc = bad(c, LIO_CORRUPTED, ov, "not an overflow page");
                goto done;
            }
            free(hbuf);
            if (npages == 0 ||
                (PAGEHDRSZ + (uint64_t)dsize + psize - 1) / psize > npages) {
                rc = lio_fail(c->err, LIO_CORRUPTED, ov, "page %llu: overflow "
                              "run of %llu pages too short for %u bytes",
                              (unsigned long long)ov,
                              (unsigned long long)npages, dsize);
                goto done;
            }
            if ((rc = read_pages(c, ov, npages, &run)))
                goto done;
            rc = emit_overflow(c, run, npages, &ov);
            free(run);
            if (rc)
                goto done;
            st64(nd + NODEHDRSZ + ksize, ov);
        } else if (nflags & F_SUBDATA) {    /* an MDB_db */
            if (dsize != DBREC_SIZE ||
                off + NODEHDRSZ + ksize + DBREC_SIZE > psize) {
                rc = lio_fail(c->err, LIO_CORRUPTED, pgno, "page %llu: node "
                              "%u: bad sub-database record",
                              (unsigned long long)pgno, i);
                goto done;
            }
            child = ld64(nd + NODEHDRSZ + ksize + 40);
            if (child != LIO_EMPTY_ROOT) {
                if ((rc = copy_page(c, child, (nflags & F_DUPDATA) != 0, 0,
                                    &child)))
                    goto done;
                st64(nd + NODEHDRSZ + ksize + 40, child);
            }
        }
    }
    rc = emit_tree_page(c, p, out);
done:
    free(p);
    return rc;
}

/* Pages the free DB lists (the first u64 of each record) plus its own. */
static int count_free(lio_env *env, const lio_meta *snap, uint64_t pgno,
                      int depth, uint64_t *count, lio_error *err)
{
    lio_page *pg;
    const uint8_t *p;
    unsigned n;
    int rc;
    if (depth >= LIO_MAX_DEPTH)
        return lio_fail(err, LIO_CORRUPTED, pgno, "page %llu: free-page DB "
                        "deeper than 32 levels", (unsigned long long)pgno);
    if ((rc = lio_page_get(env, snap, pgno, 0, &pg, err)))
        return rc;
    p = pg->data;
    n = pg_numkeys(p);
    for (unsigned i = 0; i < n && !rc; i++) {
        const uint8_t *nd = pg_node(p, i);
        uint32_t size = nd_dsize(nd);
        if (pg_flags(p) & P_BRANCH) {
            rc = count_free(env, snap, nd_child(nd), depth + 1, count, err);
            continue;
        }
        if (size < 8) {
            rc = lio_fail(err, LIO_CORRUPTED, pgno, "page %llu: free-page DB "
                          "record of %u bytes", (unsigned long long)pgno,
                          size);
        } else if (nd_flags(nd) & F_BIGDATA) {
            uint64_t ov = ld64(nd_data(nd));
            uint8_t *buf = NULL;
            const uint8_t *data;
            if (ov < 2 || ov > snap->last_pg)
                rc = lio_fail(err, LIO_PAGE_NOTFOUND, ov, "page %llu: "
                              "overflow page out of range",
                              (unsigned long long)ov);
            else if (!(rc = lio_read_range(env, ov * snap->psize + PAGEHDRSZ,
                                           8, &buf, &data, ov, err)))
                *count += ld64(data);
            free(buf);
        } else {
            *count += ld64(nd_data(nd));
        }
    }
    lio_page_unpin(env, pg);
    return rc;
}

int lio_compact_copy(lio_env *env, const lio_meta *snap, uint64_t mapsize,
                     int nosubdir, lio_write_fn write, void *ctx,
                     lio_error *err)
{
    copier c;
    lio_meta m0;
    uint64_t root = snap->main_db.root, new_root = LIO_EMPTY_ROOT;
    uint64_t freecount = 0, got;
    uint8_t *metas;
    int rc = 0;

    if (root != LIO_EMPTY_ROOT) {
        const lio_dbrec *f = &snap->free_db;
        if (f->root != LIO_EMPTY_ROOT &&
            (rc = count_free(env, snap, f->root, 0, &freecount, err)))
            return rc;
        freecount += f->branch_pages + f->leaf_pages + f->overflow_pages;
        if (freecount > snap->last_pg - 1)
            return lio_fail(err, LIO_CORRUPTED, LIO_NO_PAGE, "the free-page "
                            "DB lists %llu pages of %llu",
                            (unsigned long long)freecount,
                            (unsigned long long)(snap->last_pg + 1));
        /* as liblmdb: the old last page less the free pages */
        new_root = snap->last_pg - freecount;
    }

    memset(&c, 0, sizeof c);
    c.env = env;
    c.snap = snap;
    c.psize = snap->psize;
    c.next_pgno = 2;
    c.write = write;
    c.ctx = ctx;
    c.err = err;
    c.buf[0] = calloc(2, WBUF);
    c.seen = calloc(snap->last_pg / 8 + 1, 1);
    if (!c.buf[0] || !c.seen || 2 * (size_t)c.psize > WBUF) {
        free(c.buf[0]);
        free(c.seen);
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    }
    c.buf[1] = c.buf[0] + WBUF;

    /* Meta page 0: an empty environment (txn 0); page 1: the snapshot's
     * main DB under its new root (txn 1). */
    memset(&m0, 0, sizeof m0);
    m0.mapsize = mapsize;
    m0.free_db.pad = c.psize;
    m0.free_db.flags = LIO_INTEGERKEY | (nosubdir ? NOSUBDIR : 0);
    m0.free_db.root = LIO_EMPTY_ROOT;
    m0.main_db.root = LIO_EMPTY_ROOT;
    m0.last_pg = 1;
    metas = c.buf[0];
    lio_meta_write(metas, 0, &m0);
    if (root != LIO_EMPTY_ROOT) {
        m0.main_db = snap->main_db;
        m0.main_db.root = new_root;
        m0.last_pg = new_root;
        m0.txnid = 1;
    } else if (snap->main_db.flags) {
        m0.main_db.flags = snap->main_db.flags;
        m0.txnid = 1;
    }
    lio_meta_write(metas + c.psize, 1, &m0);
    c.wlen[0] = 2 * (size_t)c.psize;

    got = new_root;
    if (root != LIO_EMPTY_ROOT)
        rc = copy_page(&c, root, 0, 0, &got);
    if (!rc)
        rc = toggle(&c, NULL, 0);
    if (!rc && got != new_root)
        /* liblmdb: MDB_INCOMPATIBLE, "page leak or corrupt DB" */
        rc = lio_fail(err, LIO_INCOMPATIBLE, LIO_NO_PAGE, "compact copy: the "
                      "trees hold %llu pages, the free-page DB accounts for "
                      "%llu of %llu (page leak or corrupt DB)",
                      (unsigned long long)(got - 1),
                      (unsigned long long)freecount,
                      (unsigned long long)(snap->last_pg + 1));
    free(c.buf[0]);
    free(c.seen);
    return rc;
}
