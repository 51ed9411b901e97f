/* The environment: open a data file through a lio_source, read its meta
 * pages, pick a snapshot.
 *
 * Layer 4 of the core (after errors, page format and page cache).
 * May call: errors.c (lio_fail*), format.c (lio_parse_meta,
 * lio_parse_meta_header, lio_check_snapshot), pager.c (lio_read_range,
 * lio_read_small, lio_cache_close), leafdir.c (lio_leafdir_scan_stop,
 * lio_leafdirs_free) and the lio_source it is given. */
#include <stdlib.h>
#include <sys/resource.h>

#include "core.h"

/* Meta page i's struct from its first META_END bytes, which must give
 * the environment's page size. */
static int parse_meta(const lio_env *env, const uint8_t *data, int i,
                      lio_meta *out, lio_error *err)
{
    int rc = lio_parse_meta(data, META_END, i, out, err);
    if (rc == LIO_SUCCESS && out->psize != env->psize)
        rc = lio_fail(err, LIO_INVALID, i,
                      "meta page %d: page size %u differs from meta page "
                      "0's %u", i, out->psize, env->psize);
    return rc;
}

/* The meta pages' structs one at a time: each read's failure names its
 * page. */
static int read_metas_apart(lio_env *env, lio_meta metas[2], lio_error *err)
{
    uint8_t data[META_END];
    int rc;
    for (int i = 0; i < 2; i++) {
        uint64_t off = (uint64_t)i * env->psize;
        if ((rc = lio_read_small(env, off, META_END, data, i, err))) {
            if (rc == LIO_PAGE_NOTFOUND)
                rc = lio_fail(err, LIO_INVALID, i,
                              "meta page %d is past the end of the file "
                              "(%llu bytes): not an LMDB file",
                              i, (unsigned long long)env->file_size);
            return rc;
        }
        if ((rc = parse_meta(env, data, i, &metas[i], err)))
            return rc;
    }
    return LIO_SUCCESS;
}

/* Both structs in one read: every transaction begins here, and two reads
 * of 152 bytes were most of a new transaction's cost (1.5 us against
 * py-lmdb's 0.3, which reads them from its mapping).  Only a whole read
 * of bytes the file is known to hold counts; anything else (a file cut
 * short since, an error) is read again page by page, from the same state,
 * for the same result and error as before. */
static int read_metas(lio_env *env, lio_meta metas[2], lio_error *err)
{
    uint8_t small[4096 + META_END], *data = small;
    size_t span = (size_t)env->psize + META_END;
    int64_t (*read_fn)(void *, uint64_t, void *, size_t) =
        env->src.read_cached ? env->src.read_cached
                             : env->align <= 1 ? env->src.read : NULL;
    int rc = LIO_SUCCESS;
    if (!read_fn || span > env->file_size)
        return read_metas_apart(env, metas, err);
    if (span > sizeof small && !(data = malloc(span)))
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    if (read_fn(env->src.ctx, 0, data, span) != (int64_t)span) {
        rc = read_metas_apart(env, metas, err);
        goto out;
    }
    for (int i = 0; i < 2 && rc == LIO_SUCCESS; i++)
        rc = parse_meta(env, data + (size_t)i * env->psize, i, &metas[i],
                        err);
out:
    if (data != small)
        free(data);
    return rc;
}

/* liblmdb reads this much of each meta page (the page size it assumes
 * before it knows the file's). */
#define HEADER_READ 4096

int lio_read_header(const lio_source *src, lio_meta *out, lio_error *err)
{
    uint8_t *buf;
    lio_meta m[2];
    uint64_t off = 0;
    int rc = LIO_SUCCESS;

    buf = malloc(HEADER_READ);
    if (!buf)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    for (int i = 0; i < 2; i++) {
        int64_t n = src->read(src->ctx, off, buf, HEADER_READ);
        if (n < 0) {
            rc = lio_fail_sys(err, (int)-n, off, "cannot read a meta page");
            break;
        }
        if (n != HEADER_READ) {
            if (n == 0 && i == 0)
                rc = lio_fail(err, LIO_INVALID, 0,
                              "the data file is empty: not an LMDB file");
            else
                rc = lio_fail(err, LIO_INVALID, (uint64_t)i,
                              "meta page %d is cut short by the end of the "
                              "file: not an LMDB file", i);
            break;
        }
        if ((rc = lio_parse_meta_header(buf, HEADER_READ, (uint64_t)i, &m[i],
                                        err)))
            break;
        if (i == 0)
            off = m[0].psize;
    }
    free(buf);
    if (rc)
        return rc;
    *out = m[1].txnid > m[0].txnid ? m[1] : m[0];
    return LIO_SUCCESS;
}

int lio_env_read_metas(lio_env *env, lio_meta metas[2], lio_error *err)
{
    return read_metas(env, metas, err);
}

int lio_env_snapshot(lio_env *env, uint64_t txnid, lio_meta *out,
                     lio_error *err)
{
    lio_meta metas[2];
    int rc, which;
    if ((rc = read_metas(env, metas, err)))
        return rc;
    if (txnid == 0) {
        which = metas[1].txnid > metas[0].txnid;
    } else {
        which = (int)(txnid & 1);
        if (metas[which].txnid != txnid)
            return LIO_RETRY;
    }
    if ((rc = lio_check_snapshot(&metas[which], which, err)))
        return rc;
    *out = metas[which];
    return LIO_SUCCESS;
}

int lio_env_open(lio_env **out, const lio_source *src, size_t cache_bytes,
                 size_t readahead_bytes, lio_error *err)
{
    lio_env *env;
    uint8_t *buf = NULL;
    const uint8_t *data;
    lio_meta m0;
    int64_t size;
    int rc;

    *out = NULL;
    env = calloc(1, sizeof *env);
    if (!env)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    env->src = *src;
    env->align = src->align ? src->align : 1;
    pthread_mutex_init(&env->lock, NULL);
    pthread_mutex_init(&env->ra_lock, NULL);
    env->lru.next = env->lru.prev = &env->lru;
    size = src->size(src->ctx);
    if (size < 0) {
        rc = lio_fail_sys(err, (int)-size, 0, "cannot stat the data file");
        goto fail;
    }
    env->file_size = (uint64_t)size;
    if (env->file_size < META_END) {
        rc = lio_fail(err, LIO_INVALID, 0,
                      "file is %llu bytes, too small for an LMDB meta page: "
                      "not an LMDB file", (unsigned long long)env->file_size);
        goto fail;
    }
    if ((rc = lio_read_range(env, 0, META_END, &buf, &data, 0, err)))
        goto fail;
    rc = lio_parse_meta(data, META_END, 0, &m0, err);
    free(buf);
    if (rc)
        goto fail;
    env->psize = m0.psize;
    {
        lio_meta metas[2];
        if ((rc = read_metas(env, metas, err)))
            goto fail;
    }
    env->max_pages = cache_bytes / env->psize;
    if (env->max_pages < 64)
        env->max_pages = 64;
    env->table_size = 1;
    while (env->table_size < env->max_pages * 2)
        env->table_size <<= 1;
    env->table = calloc(env->table_size, sizeof *env->table);
    if (!env->table) {
        rc = lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        goto fail;
    }
    /* LIO_GET_ONCE's filter remembers about as many pages as the cache
     * holds (pager.c); without it every lookup leaf is kept. */
    env->ghost_size = env->table_size;   /* a power of two >= 128 */
    env->ghost = calloc(env->ghost_size, sizeof *env->ghost);
    env->readahead_pages = readahead_bytes / env->psize;
    if (env->readahead_pages > env->max_pages / 4)
        env->readahead_pages = env->max_pages / 4;
    {
        /* pager.c compares the blocks read in since its last look: the
         * process's reads before this env are not its file's */
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0)
            env->inblock = ru.ru_inblock;
    }
    *out = env;
    return LIO_SUCCESS;
fail:
    lio_env_close(env);
    return rc;
}

uint32_t lio_env_psize(const lio_env *env) { return env->psize; }

void lio_env_close(lio_env *env)
{
    if (!env)
        return;
    lio_leafdir_scan_stop(env);
    lio_leafdirs_free(env);
    lio_cache_close(env);
}
