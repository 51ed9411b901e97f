/* Bounded page cache over a lio_source.
 *
 * Entries are keyed by (page number, snapshot txnid): a page is immutable
 * only while its snapshot is pinned, so a page read for one snapshot is
 * never served to another.  Pages held by cursors are pinned and never
 * evicted; the rest form an LRU list bounded by cache_bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "core.h"

/* Page-aligned buffers: copies into them run at full speed (benchmarks.md)
 * and they satisfy O_DIRECT. */
#define BUF_ALIGN(env) ((env)->align > 4096 ? (env)->align : 4096)

static size_t page_hash(const lio_env *env, uint64_t pgno)
{
    return (size_t)((pgno * 0x9E3779B97F4A7C15ull) >> 20) & (env->table_size - 1);
}

static void lru_unlink(lio_page *pg)
{
    pg->prev->next = pg->next;
    pg->next->prev = pg->prev;
    pg->prev = pg->next = NULL;
}

static void lru_push(lio_env *env, lio_page *pg)
{
    pg->prev = env->lru.prev;
    pg->next = &env->lru;
    env->lru.prev->next = pg;
    env->lru.prev = pg;
}

static lio_page *lookup(lio_env *env, uint64_t pgno, uint64_t txnid)
{
    lio_page *pg = env->table[page_hash(env, pgno)];
    for (; pg; pg = pg->hnext)
        if (pg->pgno == pgno && pg->txnid == txnid)
            return pg;
    return NULL;
}

static void table_remove(lio_env *env, lio_page *pg)
{
    lio_page **pp = &env->table[page_hash(env, pg->pgno)];
    while (*pp != pg)
        pp = &(*pp)->hnext;
    *pp = pg->hnext;
}

/* A free entry: a new one while under budget, else the least recently used
 * unpinned one.  Over budget with everything pinned, grow anyway (pins are
 * bounded by open cursors times tree depth). */
static lio_page *take_entry(lio_env *env)
{
    lio_page *pg;
    if (env->npages >= env->max_pages && env->lru.next != &env->lru) {
        pg = env->lru.next;
        lru_unlink(pg);
        table_remove(env, pg);
        return pg;
    }
    pg = calloc(1, sizeof *pg);
    if (!pg)
        return NULL;
    if (posix_memalign((void **)&pg->data, BUF_ALIGN(env), env->psize)) {
        free(pg);
        return NULL;
    }
    env->npages++;
    return pg;
}

static int refresh_size(lio_env *env, lio_error *err)
{
    int64_t size = env->src.size(env->src.ctx);
    if (size < 0)
        return lio_fail_sys(err, (int)-size, 0, "cannot stat the data file");
    pthread_mutex_lock(&env->lock);
    env->file_size = (uint64_t)size;
    pthread_mutex_unlock(&env->lock);
    return LIO_SUCCESS;
}

/* Is [off, off+len) inside the file?  Re-stat once: a live writer grows it. */
int lio_check_extent(lio_env *env, uint64_t off, size_t len, uint64_t pgno,
                        lio_error *err)
{
    int rc;
    if (off + len >= off && off + len <= env->file_size)
        return LIO_SUCCESS;
    if ((rc = refresh_size(env, err)))
        return rc;
    if (off + len >= off && off + len <= env->file_size)
        return LIO_SUCCESS;
    if (pgno == LIO_NO_PAGE && env->psize)
        pgno = off / env->psize;
    return lio_fail(err, LIO_PAGE_NOTFOUND, pgno,
                    "page %llu: bytes %llu..%llu are past the end of the "
                    "file (%llu bytes)", (unsigned long long)pgno,
                    (unsigned long long)off, (unsigned long long)(off + len),
                    (unsigned long long)env->file_size);
}

static int read_exact(lio_env *env, uint64_t off, uint8_t *buf, size_t len,
                      size_t need, uint64_t pgno, lio_error *err)
{
    size_t done = 0;
    int eofs = 0;
    while (done < need) {
        int64_t n = env->src.read(env->src.ctx, off + done, buf + done,
                                  len - done);
        if (n < 0)
            return lio_fail_sys(err, (int)-n, off + done, "read failed");
        if (n == 0) {
            /* The size said these bytes exist: the file shrank (or a
             * filesystem hiccup: retried twice after a new stat). */
            int rc = refresh_size(env, err);
            if (rc)
                return rc;
            if (env->file_size >= off + need && ++eofs <= 2)
                continue;
            lio_fail_sys(err, EIO, off + done, "read failed");
            if (err)
                snprintf(err->msg, sizeof err->msg, "read failed at offset "
                         "%llu (page %llu): end of file %s; it is %llu bytes "
                         "now", (unsigned long long)(off + done),
                         (unsigned long long)pgno,
                         env->file_size < off + need
                         ? "(the file shrank while being read)"
                         : "inside the file", (unsigned long long)env->file_size);
            return LIO_SYSERR;
        }
        done += (size_t)n;
        if (done < need && ((off + done) % env->align || done % env->align))
            return lio_fail_sys(err, EIO, off + done, "short unaligned read");
    }
    return LIO_SUCCESS;
}

int lio_read_into(lio_env *env, uint64_t off, size_t len, uint8_t **buf,
                  size_t *cap, const uint8_t **data, uint64_t pgno,
                  lio_error *err)
{
    uint64_t start, end;
    size_t span;
    int rc;
    if ((rc = lio_check_extent(env, off, len, pgno, err)))
        return rc;
    start = off - off % env->align;
    end = off + len;
    end += (env->align - end % env->align) % env->align;
    span = (size_t)(end - start);
    if (span > *cap || !*buf) {
        uint8_t *nb;
        if (posix_memalign((void **)&nb, BUF_ALIGN(env), span ? span : 1))
            return lio_fail(err, LIO_ENOMEM, pgno,
                            "page %llu: cannot allocate %zu bytes",
                            (unsigned long long)pgno, span);
        free(*buf);
        *buf = nb;
        *cap = span;
    }
    if ((rc = read_exact(env, start, *buf, span, (size_t)(off + len - start),
                         pgno, err)))
        return rc;
    *data = *buf + (off - start);
    return LIO_SUCCESS;
}

int lio_read_range(lio_env *env, uint64_t off, size_t len, uint8_t **buf,
                   const uint8_t **data, uint64_t pgno, lio_error *err)
{
    size_t cap = 0;
    int rc;
    *buf = NULL;
    rc = lio_read_into(env, off, len, buf, &cap, data, pgno, err);
    if (rc) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

static int validate(lio_env *env, lio_page *pg, lio_error *err)
{
    if (pg->checked)
        return LIO_SUCCESS;
    if (pg_pgno(pg->data) != pg->pgno)
        return lio_fail(err, LIO_CORRUPTED, pg->pgno,
                        "page %llu carries page number %llu in its header",
                        (unsigned long long)pg->pgno,
                        (unsigned long long)pg_pgno(pg->data));
    if (lio_check_page(pg->data, env->psize, pg->pgno, 0, err))
        return err->code;
    pg->checked = 1;
    return LIO_SUCCESS;
}

static void pin(lio_env *env, lio_page *pg)
{
    (void)env;
    if (pg->pins++ == 0 && pg->next)
        lru_unlink(pg);
}

void lio_page_unpin(lio_env *env, lio_page *pg)
{
    if (!pg)
        return;
    pthread_mutex_lock(&env->lock);
    if (--pg->pins == 0)
        lru_push(env, pg);
    pthread_mutex_unlock(&env->lock);
}

int lio_page_get(lio_env *env, const lio_meta *snap, uint64_t pgno,
                 int readahead, lio_page **out, lio_error *err)
{
    lio_page *pg;
    uint64_t first, count, file_pages;
    const uint8_t *data;
    int rc;

    *out = NULL;
    if (pgno > snap->last_pg || pgno < 2)
        return lio_fail(err, pgno < 2 ? LIO_CORRUPTED : LIO_PAGE_NOTFOUND,
                        pgno, pgno < 2
                        ? "page %llu: a tree points at a meta page"
                        : "page %llu is past the snapshot's last page %llu",
                        (unsigned long long)pgno,
                        (unsigned long long)snap->last_pg);
    pthread_mutex_lock(&env->lock);
    pg = lookup(env, pgno, snap->txnid);
    if (pg) {
        pin(env, pg);
        rc = validate(env, pg, err);
        pthread_mutex_unlock(&env->lock);
        if (rc) {
            lio_page_unpin(env, pg);
            return rc;
        }
        *out = pg;
        return LIO_SUCCESS;
    }
    pthread_mutex_unlock(&env->lock);

    if ((rc = lio_check_extent(env, pgno * env->psize, env->psize, pgno, err)))
        return rc;
    first = pgno;
    count = 1;
    if (readahead && env->readahead_pages > 1) {
        file_pages = env->file_size / env->psize;
        first = pgno - pgno % env->readahead_pages;
        if (first < 2)
            first = 2;
        count = env->readahead_pages - (first % env->readahead_pages);
        if (first + count > snap->last_pg + 1)
            count = snap->last_pg + 1 - first;
        if (first + count > file_pages)
            count = file_pages - first;
    }
    /* One reused buffer: a fresh 256 KiB allocation per miss costs more in
     * mmap/munmap and page faults than the read itself. */
    pthread_mutex_lock(&env->ra_lock);
    rc = lio_read_into(env, first * env->psize, (size_t)(count * env->psize),
                       &env->ra_buf, &env->ra_cap, &data, pgno, err);
    if (rc) {
        pthread_mutex_unlock(&env->ra_lock);
        return rc;
    }

    pthread_mutex_lock(&env->lock);
    for (uint64_t i = 0; i < count; i++) {
        uint64_t n = first + i;
        lio_page *e = lookup(env, n, snap->txnid);
        if (!e) {
            e = take_entry(env);
            if (!e) {
                if (n != pgno)
                    continue;
                pthread_mutex_unlock(&env->lock);
                pthread_mutex_unlock(&env->ra_lock);
                return lio_fail(err, LIO_ENOMEM, pgno,
                                "page %llu: out of memory for the page cache",
                                (unsigned long long)pgno);
            }
            e->pgno = n;
            e->txnid = snap->txnid;
            e->pins = 0;
            e->checked = 0;
            memcpy(e->data, data + i * env->psize, env->psize);
            e->hnext = env->table[page_hash(env, n)];
            env->table[page_hash(env, n)] = e;
            lru_push(env, e);
        }
        if (n == pgno)
            pg = e;
    }
    pin(env, pg);
    rc = validate(env, pg, err);
    pthread_mutex_unlock(&env->lock);
    pthread_mutex_unlock(&env->ra_lock);
    if (rc) {
        lio_page_unpin(env, pg);
        return rc;
    }
    *out = pg;
    return LIO_SUCCESS;
}

void lio_env_close(lio_env *env)
{
    if (!env)
        return;
    if (env->table) {
        for (size_t i = 0; i < env->table_size; i++) {
            lio_page *pg = env->table[i];
            while (pg) {
                lio_page *next = pg->hnext;
                free(pg->data);
                free(pg);
                pg = next;
            }
        }
        free(env->table);
    }
    free(env->ra_buf);
    pthread_mutex_destroy(&env->ra_lock);
    pthread_mutex_destroy(&env->lock);
    free(env);
}
