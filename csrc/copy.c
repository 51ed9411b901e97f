/* Compacting copy of a snapshot (what mdb_env_copy2 with MDB_CP_COMPACT
 * does): every reachable page is written once, renumbered densely from
 * page 2 in post-order (so a tree's root is its last page), and the
 * free-page DB is left empty.  Pages go out through a positioned-write
 * callback, the meta pages last. */
#include <stdlib.h>

#include "core.h"

typedef struct copier {
    lio_env *env;
    const lio_meta *snap;
    lio_copy_write_fn write_at;
    void *ctx;
    uint64_t next_pgno;
    uint8_t *ovbuf;
    size_t ovcap;
    lio_error *err;
} copier;

static void st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void st16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static int emit(copier *cp, uint8_t *pages, uint64_t count, uint64_t *pgno)
{
    int rc;
    *pgno = cp->next_pgno;
    st64(pages, *pgno); /* the run's (or page's) own number */
    rc = cp->write_at(cp->ctx, *pgno * cp->env->psize, pages,
                      (size_t)(count * cp->env->psize));
    if (rc)
        return lio_fail_sys(cp->err, rc, *pgno * cp->env->psize,
                            "cannot write the copy");
    cp->next_pgno += count;
    return LIO_SUCCESS;
}

/* Copy an overflow run, all its pages (the database record counts them);
 * returns its new first page. */
static int copy_overflow(copier *cp, uint64_t pgno, uint32_t size,
                         uint64_t *out)
{
    lio_env *env = cp->env;
    uint64_t need = (PAGEHDRSZ + (uint64_t)size + env->psize - 1) / env->psize;
    uint64_t count;
    const uint8_t *p;
    int rc;
    if (pgno < 2 || pgno > cp->snap->last_pg ||
        need > cp->snap->last_pg - pgno + 1)
        return lio_fail(cp->err, LIO_PAGE_NOTFOUND, pgno,
                        "page %llu: overflow value runs past the snapshot",
                        (unsigned long long)pgno);
    rc = lio_read_into(env, pgno * env->psize, PAGEHDRSZ, &cp->ovbuf,
                       &cp->ovcap, &p, pgno, cp->err);
    if (rc)
        return rc;
    count = pg_ovpages(p);
    if (pg_pgno(p) != pgno || pg_flags(p) != P_OVERFLOW || count < need ||
        count > cp->snap->last_pg - pgno + 1)
        return lio_fail(cp->err, LIO_CORRUPTED, pgno,
                        "page %llu: not an overflow run that holds %u bytes",
                        (unsigned long long)pgno, size);
    rc = lio_read_into(env, pgno * env->psize, (size_t)(count * env->psize),
                       &cp->ovbuf, &cp->ovcap, &p, pgno, cp->err);
    if (rc)
        return rc;
    return emit(cp, (uint8_t *)p, count, out);
}

static int copy_tree(copier *cp, const lio_dbrec *db, int is_main,
                     unsigned level, uint64_t pgno, uint64_t *out);

/* Copy the tree a database record names and point the record at it. */
static int copy_dbrec(copier *cp, uint8_t *rec, int is_main)
{
    lio_dbrec db;
    uint64_t root;
    int rc;
    lio_parse_dbrec(rec, &db);
    if (db.root == LIO_EMPTY_ROOT)
        return LIO_SUCCESS;
    if (db.depth == 0 || db.depth > LIO_MAX_DEPTH)
        return lio_fail(cp->err, LIO_CORRUPTED, db.root,
                        "page %llu: tree has impossible depth %u",
                        (unsigned long long)db.root, db.depth);
    if ((rc = copy_tree(cp, &db, is_main, 0, db.root, &root)))
        return rc;
    st64(rec + 40, root);
    return LIO_SUCCESS;
}

static int copy_tree(copier *cp, const lio_dbrec *db, int is_main,
                     unsigned level, uint64_t pgno, uint64_t *out)
{
    lio_env *env = cp->env;
    lio_page *pg;
    uint8_t *buf;
    unsigned n;
    int leaf, rc;

    if (level >= db->depth)
        return lio_fail(cp->err, LIO_CORRUPTED, pgno,
                        "page %llu: tree is deeper than its recorded depth",
                        (unsigned long long)pgno);
    if ((rc = lio_page_get(env, cp->snap, pgno, 1, &pg, cp->err)))
        return rc;
    buf = malloc(env->psize);
    if (!buf) {
        lio_page_unpin(env, pg);
        return lio_fail(cp->err, LIO_ENOMEM, pgno, "out of memory");
    }
    memcpy(buf, pg->data, env->psize);
    lio_page_unpin(env, pg);
    leaf = (pg_flags(buf) & P_LEAF) != 0;
    if (leaf != (level + 1 == db->depth)) {
        rc = lio_fail(cp->err, LIO_CORRUPTED, pgno,
                      "page %llu: a %s where the tree's depth puts a %s",
                      (unsigned long long)pgno, leaf ? "leaf" : "branch",
                      leaf ? "branch" : "leaf");
        goto out;
    }
    n = pg_numkeys(buf);
    for (unsigned i = 0; i < n && !(pg_flags(buf) & P_LEAF2); i++) {
        uint8_t *nd = (uint8_t *)pg_node(buf, i);
        uint16_t f = nd_flags(nd);
        uint64_t np;
        if (!leaf) {
            if ((rc = copy_tree(cp, db, is_main, level + 1, nd_child(nd),
                                &np)))
                goto out;
            st16(nd, (uint16_t)np);
            st16(nd + 2, (uint16_t)(np >> 16));
            st16(nd + 4, (uint16_t)(np >> 32));
        } else if (f & F_BIGDATA) {
            if ((rc = copy_overflow(cp, ld64(nd_data(nd)), nd_dsize(nd), &np)))
                goto out;
            st64((uint8_t *)nd_data(nd), np);
        } else if ((f & F_SUBDATA) && ((f & F_DUPDATA) || is_main)) {
            /* a named database (main DB) or a duplicate sub-tree */
            if ((rc = copy_dbrec(cp, (uint8_t *)nd_data(nd),
                                 0)))
                goto out;
        }
    }
    rc = emit(cp, buf, 1, out);
out:
    free(buf);
    return rc;
}

int lio_copy_compact(lio_env *env, const lio_meta *snap,
                     lio_copy_write_fn write_at, void *ctx, lio_error *err)
{
    copier cp;
    uint8_t *metas;
    uint64_t root = LIO_EMPTY_ROOT;
    uint32_t psize = env->psize;
    int rc;

    memset(&cp, 0, sizeof cp);
    cp.env = env;
    cp.snap = snap;
    cp.write_at = write_at;
    cp.ctx = ctx;
    cp.next_pgno = 2;
    cp.err = err;
    metas = calloc(2, psize);
    if (!metas)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    if (snap->main_db.root != LIO_EMPTY_ROOT) {
        rc = copy_tree(&cp, &snap->main_db, 1, 0, snap->main_db.root, &root);
        if (rc) {
            free(cp.ovbuf);
            free(metas);
            return rc;
        }
    }
    free(cp.ovbuf);
    for (int i = 0; i < 2; i++) {
        uint8_t *m = metas + (size_t)i * psize;
        memset(m, 0, psize);
        st64(m, (uint64_t)i);
        st16(m + 10, P_META);
        st32(m + 16, LMDB_MAGIC);
        st32(m + 20, LMDB_DATA_VERSION);
        st64(m + 32, snap->mapsize);
        /* free DB: empty, keeps the environment flags and page size */
        st32(m + 40, psize);
        st16(m + 44, (uint16_t)snap->env_flags);
        st64(m + 40 + 40, LIO_EMPTY_ROOT);
        if (i == 1) {
            /* main DB as in the snapshot, with its new root */
            const lio_dbrec *d = &snap->main_db;
            st32(m + 88, d->pad);
            st16(m + 92, d->flags);
            st16(m + 94, d->depth);
            st64(m + 96, d->branch_pages);
            st64(m + 104, d->leaf_pages);
            st64(m + 112, d->overflow_pages);
            st64(m + 120, d->entries);
            st64(m + 128, root);
            st64(m + 136, cp.next_pgno - 1);
            st64(m + 144, 1);
        } else {
            st64(m + 88 + 40, LIO_EMPTY_ROOT);
            st64(m + 136, 1);
            st64(m + 144, 0);
        }
    }
    rc = write_at(ctx, 0, metas, 2 * (size_t)psize);
    free(metas);
    if (rc)
        return lio_fail_sys(err, rc, 0, "cannot write the copy's meta pages");
    return LIO_SUCCESS;
}
