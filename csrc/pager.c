/* Bounded page cache over a lio_source.
 *
 * Entries are keyed by (page number, snapshot txnid): a page is immutable
 * only while its snapshot is pinned, so a page read for one snapshot is
 * never served to another.  Pages held by cursors are pinned and never
 * evicted; the rest form an LRU list bounded by cache_bytes.
 *
 * Layer 3 of the core (after errors and page format).
 * May call: errors.c (lio_fail*), format.c (page checks, lio_cmp_u64),
 * plan.c (read-ahead plans), and the env's source and executor callbacks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core.h"

/* Scan resistance.  A page that read-ahead brought in (RA_AHEAD) and that
 * a cursor then used once (RA_USED) goes to the cold end of the LRU list
 * when released, and its entry is recycled first, even while the cache is
 * under budget: a long scan cycles through a few entries that stay in the
 * CPU's caches instead of filling the budget with pages it will not visit
 * again (and paying for fresh memory).  A second use makes it an ordinary
 * page (RA_NONE). */
enum { RA_NONE, RA_AHEAD, RA_USED };

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

static void lru_push_cold(lio_env *env, lio_page *pg)
{
    pg->next = env->lru.next;
    pg->prev = &env->lru;
    env->lru.next->prev = pg;
    env->lru.next = pg;
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
/* Cache entries come in slabs: one allocation of up to 2 MiB of page
 * buffers and one of their headers.  (Not madvise(MADV_HUGEPAGE): with
 * the kernel compacting memory on such faults, a fault could stall for
 * milliseconds.) */
#define SLAB_BYTES (2u << 20)
static int new_slab(lio_env *env)
{
    size_t n = SLAB_BYTES / env->psize, align = BUF_ALIGN(env);
    struct lio_slab *sl;
    if (n > env->max_pages)
        n = env->max_pages;
    if (n == 0)
        n = 1;
    if (!(sl = calloc(1, sizeof *sl + n * sizeof *sl->pages)))
        return 0;
    if (posix_memalign(&sl->data, align, n * env->psize)) {
        free(sl);
        return 0;
    }
    sl->n = n;
    for (size_t i = 0; i < n; i++)
        sl->pages[i].data = (uint8_t *)sl->data + i * env->psize;
    sl->next = env->slabs;
    env->slabs = sl;
    env->slab_used = 0;
    return 1;
}

static lio_page *take_entry(lio_env *env)
{
    lio_page *pg;
    if (env->spare) {
        pg = env->spare;
        env->spare = pg->hnext;
        pg->hnext = NULL;
        return pg;
    }
    if (env->lru.next != &env->lru &&
        (env->npages >= env->max_pages || env->lru.next->ra == RA_USED)) {
        pg = env->lru.next;
        lru_unlink(pg);
        table_remove(env, pg);
        return pg;
    }
    if (env->slab_used == (env->slabs ? env->slabs->n : 0) && !new_slab(env))
        return NULL;
    pg = &env->slabs->pages[env->slab_used++];
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

/* Read consecutive file bytes at off into segs[0..nseg) (nseg at most
 * LIO_READV_MAX): at least the first `need` of them (the rest is padding
 * up to an O_DIRECT boundary, which the end of the file may cut).  One
 * request for all the segments where the source can scatter; a short read
 * is continued. */
static int read_segs(lio_env *env, uint64_t off, const lio_seg *segs,
                     size_t nseg, size_t need, uint64_t pgno, int cached,
                     lio_error *err)
{
    size_t align = cached ? 1 : env->align;
    lio_seg s[LIO_READV_MAX];
    size_t done = 0, i = 0;
    int eofs = 0;
    if (nseg > LIO_READV_MAX)
        return lio_fail(err, LIO_EINVAL, pgno, "page %llu: a read of %zu "
                        "segments", (unsigned long long)pgno, nseg);
    memcpy(s, segs, nseg * sizeof *s);
    while (done < need) {
        int64_t n;
        while (i < nseg && s[i].len == 0)
            i++;
        if (i == nseg)
            break;
        if (cached)
            n = env->src.read_cached(env->src.ctx, off + done, s[i].dst,
                                     s[i].len);
        else
            n = nseg - i > 1 && env->src.readv
                ? env->src.readv(env->src.ctx, off + done, s + i, nseg - i)
                : env->src.read(env->src.ctx, off + done, s[i].dst,
                                s[i].len);
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
        while (n > 0 && i < nseg) {
            size_t take = (uint64_t)n < s[i].len ? (size_t)n : s[i].len;
            s[i].dst += take;
            s[i].len -= take;
            n -= (int64_t)take;
            if (s[i].len == 0)
                i++;
        }
        if (done < need && ((off + done) % align || done % align))
            return lio_fail_sys(err, EIO, off + done, "short unaligned read");
    }
    return LIO_SUCCESS;
}

static int read_exact(lio_env *env, uint64_t off, uint8_t *buf, size_t len,
                      size_t need, uint64_t pgno, lio_error *err)
{
    lio_seg seg = {buf, len};
    return read_segs(env, off, &seg, 1, need, pgno, 0, err);
}

int lio_read_small(lio_env *env, uint64_t off, size_t len, uint8_t *buf,
                   uint64_t pgno, lio_error *err)
{
    uint8_t *tmp;
    const uint8_t *data;
    lio_seg seg = {buf, len};
    int rc;
    if (!env->src.read_cached) {
        if ((rc = lio_read_range(env, off, len, &tmp, &data, pgno, err)))
            return rc;
        memcpy(buf, data, len);
        free(tmp);
        return LIO_SUCCESS;
    }
    if ((rc = lio_check_extent(env, off, len, pgno, err)))
        return rc;
    return read_segs(env, off, &seg, 1, len, pgno, 1, err);
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
    pg->ra = pg->ra == RA_AHEAD ? RA_USED : RA_NONE;
}

void lio_page_unpin(lio_env *env, lio_page *pg)
{
    if (!pg)
        return;
    pthread_mutex_lock(&env->lock);
    if (--pg->pins == 0) {
        if (pg->ra == RA_USED)
            lru_push_cold(env, pg);
        else
            lru_push(env, pg);
    }
    pthread_mutex_unlock(&env->lock);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A read slower than this came from the device, not the OS page cache
 * (which serves a page in a microsecond or two). */
#define DEVICE_READ_NS 15000u
/* Which of the two serves the reads: a score that a slow read raises by
 * DEVICE_SLOW and a fast one lowers by 1, the device above DEVICE_SLOW.
 * Two slow reads in a row make it the device, and it stays so through a
 * few reads the OS cache happened to serve; a read slowed down by the
 * scheduler now and then (a busy machine) does not. */
#define DEVICE_SLOW 8

/* Did the process read from a device since the last call?  A slow read
 * may only have been descheduled (a busy machine): the kernel's count of
 * blocks read in tells, where it counts the source's reads at all
 * (lio_source.counted_reads; else the time alone decides). */
static int read_blocks_in(lio_env *env)
{
    struct rusage ru;
    long now, before;
    if (getrusage(RUSAGE_SELF, &ru))
        return 1;
    now = ru.ru_inblock;
    before = __atomic_exchange_n(&env->inblock, now, __ATOMIC_RELAXED);
    return now != before;
}

static void note_read(lio_env *env, int slow)
{
    int d = __atomic_load_n(&env->device_reads, __ATOMIC_RELAXED);
    if (env->assume_device)
        slow = 1;
    else if (slow && env->src.counted_reads)
        slow = read_blocks_in(env);
    d = slow ? d + DEVICE_SLOW : d - 1;
    if (d > 2 * DEVICE_SLOW)
        d = 2 * DEVICE_SLOW;
    __atomic_store_n(&env->device_reads, d < 0 ? 0 : d, __ATOMIC_RELAXED);
}

/* Timing a read takes two clock reads, 0.1 us of a 2.7 us lookup.  The
 * env's first TIME_FIRST reads (of a page, or of a value in an overflow
 * run) are all timed (a cold start is seen as soon as it is now); after
 * that, while the score says the OS cache serves the reads (0: no slow
 * read lately), one in TIME_EVERY is, so a device taking over is seen
 * within that many reads, and after a slow one every read is until the
 * score is back to 0. */
#define TIME_FIRST 64u
#define TIME_EVERY 8u
static int time_this_read(lio_env *env)
{
    unsigned n = __atomic_load_n(&env->reads_seen, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(&env->reads_seen, n, __ATOMIC_RELAXED);
    return n <= TIME_FIRST || n % TIME_EVERY == 0 || env->assume_device ||
           __atomic_load_n(&env->device_reads, __ATOMIC_RELAXED) > 0;
}

static int from_device(lio_env *env)
{
    return __atomic_load_n(&env->device_reads, __ATOMIC_RELAXED) > DEVICE_SLOW;
}

/* A read of several segments (a run's header and its value, a batch of
 * small values) of at most STAGE_BYTES in all goes into a buffer on the
 * stack in one segment and is copied out: the kernel's cost of the second
 * segment is more than the copy.  Measured in C, random one-page runs of
 * a hot file, header and value into a fresh buffer: 1.05 -> 0.81 us for
 * 800 bytes, 1.19 -> 1.02 us for 3 KiB, 1.93 -> 1.84 us for 8 KB; even at
 * 16 KB, 10% slower at 64 KB. */
#define STAGE_BYTES (8u << 10)

int lio_read_segs(lio_env *env, uint64_t off, const lio_seg *segs,
                  size_t nseg, uint64_t pgno, lio_error *err)
{
    uint8_t stage[STAGE_BYTES];
    lio_seg one = {stage, 0};
    size_t len = 0;
    int rc, timed, staged;
    uint64_t t0;
    for (size_t i = 0; i < nseg; i++)
        len += segs[i].len;
    if ((rc = lio_check_extent(env, off, len, pgno, err)))
        return rc;
    staged = nseg > 1 && len <= STAGE_BYTES && env->align <= 1;
    one.len = len;
    /* (sampled as page reads are: the clock was 3% of a hot lookup of a
     * value in an overflow page) */
    timed = time_this_read(env);
    t0 = timed ? now_ns() : 0;
    rc = staged ? read_segs(env, off, &one, 1, len, pgno, 0, err)
                : read_segs(env, off, segs, nseg, len, pgno, 0, err);
    if (staged && rc == LIO_SUCCESS)
        for (size_t i = 0, at = 0; i < nseg; at += segs[i++].len)
            memcpy(segs[i].dst, stage + at, segs[i].len);
    /* (as read-ahead batches: the OS cache serves a page in about a
     * microsecond) */
    if (timed)
        note_read(env, now_ns() - t0 > DEVICE_READ_NS +
                           1000u * (len / env->psize));
    return rc;
}

/* Read-around on a slow device: the aligned block of pages around a page
 * wanted (as a page fault of a mapping reads around the faulting page;
 * the kernel's read-ahead size, often 128 KiB, can be megabytes), and at
 * most AROUND_OPEN new blocks per batch. */
#define AROUND_BYTES (2u << 20)
#define AROUND_OPEN 4
static uint64_t around_pages(const lio_env *env)
{
    return AROUND_BYTES / env->psize ? AROUND_BYTES / env->psize : 1;
}

static int around_done(const lio_env *env, uint64_t b)
{
    return b >= env->around_bits ||
           (env->around_map[b >> 3] & (1u << (b & 7)));
}

/* The admission filter of LIO_GET_ONCE: a lookup leaf missed twice while
 * its pgno stayed in this small hashed table is wanted again; the others
 * are recycled first.  So random lookups over a file larger than the cache
 * reuse one entry that stays in the CPU's caches (instead of evicting
 * useful pages for pages never seen again), while a working set that is
 * looked up repeatedly is kept. */
static int once_admit(lio_env *env, uint64_t pgno, int sparse)
{
    uint64_t *slot;
    if (!env->ghost || (env->npages < env->max_pages && !sparse))
        return 1;   /* room to spare: keep everything */
    /* buckets of two, the more recent first */
    slot = &env->ghost[(pgno * 0x9E3779B97F4A7C15ull >> 17) &
                       (env->ghost_size - 2)];
    if (slot[0] == pgno + 1 || slot[1] == pgno + 1)
        return 1;
    slot[1] = slot[0];
    slot[0] = pgno + 1;
    return 0;
}

static void sweep_ahead(lio_env *env, const lio_meta *snap);

int lio_page_get(lio_env *env, const lio_meta *snap, uint64_t pgno,
                 int how, lio_page **out, lio_error *err)
{
    lio_page *pg, *e;
    uint64_t t0;
    int rc, around = (how & LIO_GET_AROUND) != 0, once = 0, timed;

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
    if (around && env->readahead_pages > 1 && from_device(env)) {
        pthread_mutex_unlock(&env->lock);
        lio_page_prefetch(env, snap, &pgno, 1);   /* reads around it */
        if (how & LIO_GET_ONCE)
            sweep_ahead(env, snap);
        pthread_mutex_lock(&env->lock);
        if ((pg = lookup(env, pgno, snap->txnid))) {
            pin(env, pg);
            pg->ra = RA_NONE;
            rc = validate(env, pg, err);
            pthread_mutex_unlock(&env->lock);
            if (rc) {
                lio_page_unpin(env, pg);
                return rc;
            }
            *out = pg;
            return LIO_SUCCESS;
        }
    }
    if (how & LIO_GET_ONCE)
        once = !once_admit(env, pgno, how & LIO_GET_SPARSE);
    pg = take_entry(env);
    pthread_mutex_unlock(&env->lock);
    if (!pg)
        return lio_fail(err, LIO_ENOMEM, pgno,
                        "page %llu: out of memory for the page cache",
                        (unsigned long long)pgno);

    /* Read straight into the entry (page-aligned: O_DIRECT works too). */
    rc = lio_check_extent(env, pgno * env->psize, env->psize, pgno, err);
    timed = around && time_this_read(env);
    t0 = timed ? now_ns() : 0;
    if (rc == LIO_SUCCESS)
        rc = read_exact(env, pgno * env->psize, pg->data, env->psize,
                        env->psize, pgno, err);
    if (timed)
        note_read(env, now_ns() - t0 > DEVICE_READ_NS);
    pthread_mutex_lock(&env->lock);
    if (rc) {
        pg->hnext = env->spare;
        env->spare = pg;
        pthread_mutex_unlock(&env->lock);
        return rc;
    }
    e = lookup(env, pgno, snap->txnid);
    if (e) {
        /* Another thread read it meanwhile: use that one. */
        pg->hnext = env->spare;
        env->spare = pg;
        pg = e;
    } else {
        pg->pgno = pgno;
        pg->txnid = snap->txnid;
        pg->pins = 0;
        pg->checked = 0;
        pg->ra = RA_NONE;
        pg->hnext = env->table[page_hash(env, pgno)];
        env->table[page_hash(env, pgno)] = pg;
        pg->prev = pg->next = NULL;
    }
    pin(env, pg);
    if (once && pg->pins == 1)
        pg->ra = RA_USED;   /* released to the cold end, recycled first */
    rc = validate(env, pg, err);
    pthread_mutex_unlock(&env->lock);
    if (rc) {
        lio_page_unpin(env, pg);
        return rc;
    }
    *out = pg;
    return LIO_SUCCESS;
}

lio_page *lio_page_peek(lio_env *env, const lio_meta *snap, uint64_t pgno)
{
    lio_page *pg;
    pthread_mutex_lock(&env->lock);
    if ((pg = lookup(env, pgno, snap->txnid)))
        pin(env, pg);
    pthread_mutex_unlock(&env->lock);
    return pg;
}

int lio_page_cached(lio_env *env, const lio_meta *snap, uint64_t pgno)
{
    int hit;
    pthread_mutex_lock(&env->lock);
    hit = lookup(env, pgno, snap->txnid) != NULL;
    pthread_mutex_unlock(&env->lock);
    return hit;
}

int lio_env_from_device(lio_env *env)
{
    return from_device(env);
}

void lio_env_assume_device(lio_env *env, int on)
{
    env->assume_device = on;
    __atomic_store_n(&env->device_reads, on ? 2 * DEVICE_SLOW : 0,
                     __ATOMIC_RELAXED);
}

void lio_env_set_executor(lio_env *env, const lio_executor *ex)
{
    pthread_mutex_lock(&env->ra_lock);
    if (ex)
        env->ex = *ex;
    else
        memset(&env->ex, 0, sizeof env->ex);
    pthread_mutex_unlock(&env->ra_lock);
}

/* Without an executor: each wanted span on its own (gap bytes skipped). */
static int run_serial(lio_env *env, const lio_plan *plan, lio_error *err)
{
    for (size_t r = 0; r < plan->nreads; r++) {
        const lio_read *rd = &plan->reads[r];
        uint64_t off = rd->off;
        for (size_t i = 0; i < rd->nseg; i++) {
            const lio_seg *sg = &plan->segs[rd->first_seg + i];
            int rc;
            if (sg->dst != plan->sink &&
                (rc = read_exact(env, off, sg->dst, sg->len, sg->len,
                                 off / env->psize, err)))
                return rc;
            off += sg->len;
        }
    }
    return LIO_SUCCESS;
}

/* From the device: every read of the plan in flight at once.  From the
 * OS cache: one after the other in this thread (waking reader threads
 * costs more than the copies). */
static int run_plan(lio_env *env, const lio_plan *plan, int device,
                    lio_error *err)
{
    int rc;
    if (!env->ex.run)
        return run_serial(env, plan, err);
    if (device || plan->nreads == 1)
        return env->ex.run(env->ex.ctx, plan, err);
    for (size_t i = 0; i < plan->nreads; i++) {
        lio_plan one = *plan;
        one.reads = &plan->reads[i];
        one.nreads = 1;
        if ((rc = env->ex.run(env->ex.ctx, &one, err)))
            return rc;
    }
    return LIO_SUCCESS;
}

/* The blocks read around so far (a bit each, for snapshot pages up to
 * AROUND_MAP_BYTES * 8 blocks); NULL when unavailable. */
#define AROUND_MAP_BYTES (1u << 20)
static uint8_t *around_map(lio_env *env, const lio_meta *snap)
{
    uint64_t bits = snap->last_pg / around_pages(env) + 1;
    if (bits > env->around_bits) {
        uint64_t bytes = (bits + 7) / 8;
        uint8_t *m;
        if (bytes > AROUND_MAP_BYTES)
            bytes = AROUND_MAP_BYTES;
        if (bytes * 8 > env->around_bits) {
            m = realloc(env->around_map, (size_t)bytes);
            if (!m)
                return env->around_map;
            memset(m + (env->around_bits + 7) / 8, 0,
                   (size_t)(bytes - (env->around_bits + 7) / 8));
            env->around_map = m;
            env->around_bits = bytes * 8;
        }
    }
    return env->around_map;
}

/* Pages this close are read in one request with the bytes between. */
#define PREFETCH_GAP (4u << 12)
/* (an appending writer puts a leaf's one-page values after or before it:
 * up to a dozen pages) */
#define KEPT_GAP_PAGES 16u

/* Plan `npages` pages from `pgno` into the around sink (bytes read only
 * so that the OS keeps them), in pieces of at most the plan's largest
 * read. */
static int plan_sink(lio_env *env, uint64_t pgno, uint64_t npages)
{
    uint64_t step = env->plan.max_read / env->psize;
    int rc = LIO_SUCCESS;
    if (step == 0)
        step = 1;
    while (npages && rc == LIO_SUCCESS) {
        uint64_t n = npages < step ? npages : step;
        rc = lio_plan_add(&env->plan, pgno * env->psize, env->around_sink,
                          (size_t)n * env->psize);
        pgno += n;
        npages -= n;
    }
    return rc;
}


/* The pages between two of want[0..n) (sorted) up to KEPT_GAP_PAGES
 * apart, added to it while it holds at most LIO_PREFETCH_MAX: read with
 * the pages wanted and kept in the cache rather than skipped or read into
 * the sink.  In an appended layout with values of a page or two those
 * are the values of the leaves read (300k records of 100-3000 bytes, hot:
 * a walk read them again, one call a leaf, 45k-64k calls; now 3.6k-12k,
 * 201 -> 148 ms and 208 -> 195 ms in two such layouts, py-lmdb 214 and
 * 205).  Only up to 4 pages apart, the walk measured slower than before
 * (values a dozen pages past their leaf were read anyway, and the cache
 * filled with the others).  Not where the gaps hold no values: leaves
 * out of file order then filled the cache with leaves read for nothing (a
 * walk 8% slower).  Returns the new count; want stays sorted. */
static size_t with_gap_pages(uint64_t *want, size_t n)
{
    uint64_t out[LIO_PREFETCH_MAX];
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        out[m++] = want[i];
        if (i + 1 < n && want[i + 1] > want[i] + 1 &&
            want[i + 1] - want[i] - 1 <= KEPT_GAP_PAGES &&
            m + (want[i + 1] - want[i] - 1) + (n - i - 1) <= LIO_PREFETCH_MAX)
            for (uint64_t p = want[i] + 1; p < want[i + 1]; p++)
                out[m++] = p;
    }
    memcpy(want, out, m * sizeof *want);
    return m;
}

#define PREFETCH_GAPS 1    /* lio_page_prefetch_with_gaps */
#define PREFETCH_ALONE 2   /* lio_page_prefetch_alone */
static void prefetch(lio_env *env, const lio_meta *snap,
                     const uint64_t *pgnos, size_t n, int how);

void lio_page_prefetch(lio_env *env, const lio_meta *snap,
                       const uint64_t *pgnos, size_t n)
{
    prefetch(env, snap, pgnos, n, 0);
}

void lio_page_prefetch_with_gaps(lio_env *env, const lio_meta *snap,
                                 const uint64_t *pgnos, size_t n)
{
    prefetch(env, snap, pgnos, n, PREFETCH_GAPS);
}

void lio_page_prefetch_alone(lio_env *env, const lio_meta *snap,
                             const uint64_t *pgnos, size_t n)
{
    prefetch(env, snap, pgnos, n, PREFETCH_ALONE);
}

static void prefetch(lio_env *env, const lio_meta *snap,
                     const uint64_t *pgnos, size_t n, int how)
{
    uint64_t want[LIO_PREFETCH_MAX];
    lio_page *batch[LIO_PREFETCH_MAX];
    size_t m = 0, k = 0, limit = env->readahead_pages;
    uint64_t file_pages, end_pages, open_end = 0, pos = 0;
    lio_error err;
    int rc = LIO_SUCCESS;
    int device = from_device(env), around;
    int asked = 1;   /* every page's block read around or asked for before */
    uint64_t t0;

    if (limit > LIO_PREFETCH_MAX)
        limit = LIO_PREFETCH_MAX;
    if (n > limit)
        n = limit;
    if (n == 0 || env->align > env->psize || env->psize % env->align)
        return;
    pthread_mutex_lock(&env->ra_lock);
    /* (Under O_DIRECT the OS keeps nothing read into the sink: no block
     * is read around the pages wanted.) */
    around = device && !(how & PREFETCH_ALONE) && env->align <= 1 &&
             around_map(env, snap) &&
             (env->around_sink || !posix_memalign(
                 (void **)&env->around_sink, BUF_ALIGN(env),
                 (size_t)(around_pages(env) * env->psize)));
    if (around) {
        /* The pages of blocks read before, and of the first few new
         * blocks in the walk's order (the first page is the one needed
         * now); the rest waits for a later batch. */
        uint64_t open[AROUND_OPEN];
        size_t nopen = 0, w = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t b = pgnos[i] / around_pages(env);
            size_t j;
            if (!around_done(env, b)) {
                for (j = 0; j < nopen && open[j] != b; j++)
                    ;
                if (j == nopen) {
                    if (nopen == AROUND_OPEN)
                        continue;
                    open[nopen++] = b;
                }
            }
            want[w++] = pgnos[i];
        }
        n = w;
    } else {
        memcpy(want, pgnos, n * sizeof *want);
    }
    qsort(want, n, sizeof *want, lio_cmp_u64);
    if ((how & PREFETCH_GAPS) && !around && env->align <= 1)
        n = with_gap_pages(want, n);

    if (!env->plan_ready) {
        /* (O_DIRECT cannot read gaps into the unaligned sink) */
        size_t gap = env->align > 1 ? 0 : PREFETCH_GAP;
        lio_plan_init(&env->plan, gap, LIO_PREFETCH_MAX * (size_t)env->psize);
        env->plan_ready = 1;
    }
    lio_plan_reset(&env->plan);
    /* From the OS cache, neighbours in one request (an appended layout:
     * one read per batch, no thread hand-off); from the device, spans of
     * at most a block, several in flight. */
    env->plan.max_read = (size_t)((device ? around_pages(env)
                                          : LIO_PREFETCH_MAX) * env->psize);
    if (device && !env->src.counted_reads && env->ex.run &&
        env->plan.max_read > LIO_NET_READ && LIO_NET_READ >= env->psize)
        env->plan.max_read = LIO_NET_READ;   /* (pieces in flight) */

    pthread_mutex_lock(&env->lock);
    file_pages = env->file_size / env->psize;
    end_pages = snap->last_pg + 1 < file_pages ? snap->last_pg + 1
                                               : file_pages;
    for (size_t i = 0; i < n; i++) {
        uint64_t pgno = want[i];
        lio_page *e;
        if (pgno < 2 || pgno >= end_pages ||
            (m && want[m - 1] == pgno) || lookup(env, pgno, snap->txnid))
            continue;
        if (!(e = take_entry(env)))
            break;
        e->pgno = pgno;
        e->txnid = snap->txnid;
        e->pins = 0;
        e->checked = 0;
        e->ra = RA_AHEAD;
        want[m] = pgno;
        batch[m++] = e;
    }
    pthread_mutex_unlock(&env->lock);

    /* From the device, few large requests beat many small ones: the
     * aligned block around each page wanted is read (what a page fault of
     * a mapping reads), its other pages into the sink: the OS keeps them
     * for the leaves after, and only the pages wanted are copied into the
     * cache.  Each block once; later, its pages alone. */
    for (k = 0; k < m && rc == LIO_SUCCESS; k++) {
        uint64_t p = want[k], b = p / around_pages(env);
        if (!around || !around_done(env, b))
            asked = 0;
        if (open_end && p >= open_end) {
            rc = plan_sink(env, pos, open_end - pos);
            open_end = 0;
        }
        if (rc == LIO_SUCCESS && around && !open_end &&
            !around_done(env, b)) {
            env->around_map[b >> 3] |= (uint8_t)(1u << (b & 7));
            pos = b * around_pages(env);
            open_end = pos + around_pages(env) < end_pages
                       ? pos + around_pages(env) : end_pages;
        }
        if (rc == LIO_SUCCESS && open_end)
            rc = plan_sink(env, pos, p - pos);
        if (rc == LIO_SUCCESS)
            rc = lio_plan_add(&env->plan, p * env->psize, batch[k]->data,
                              env->psize);
        pos = p + 1;
    }
    if (rc == LIO_SUCCESS && open_end)
        rc = plan_sink(env, pos, open_end - pos);
    if (rc == LIO_SUCCESS && m) {
        int slow;
        t0 = now_ns();
        rc = run_plan(env, &env->plan, device, &err);
        /* (the OS cache serves a page in about a microsecond) */
        slow = now_ns() - t0 > DEVICE_READ_NS +
               1000u * (env->plan.bytes / env->psize);
        /* Pages of blocks asked for before arrive fast because they were
         * asked for: that says nothing of where the file is.  (Taken as
         * the OS cache's, a walk ahead of which lmdbio asked for every
         * block stopped asking after a few batches, and then waited for
         * the device at each.) */
        if (slow || !asked)
            note_read(env, slow);
    }

    pthread_mutex_lock(&env->lock);
    for (k = 0; k < m; k++) {
        lio_page *e = batch[k];
        if (rc == LIO_SUCCESS && !lookup(env, e->pgno, e->txnid)) {
            e->hnext = env->table[page_hash(env, e->pgno)];
            env->table[page_hash(env, e->pgno)] = e;
            lru_push(env, e);
        } else {
            e->hnext = env->spare;
            env->spare = e;
        }
    }
    pthread_mutex_unlock(&env->lock);
    pthread_mutex_unlock(&env->ra_lock);
}

/* Ask the OS for block b in the background (under ra_lock). */
static void advise_block(lio_env *env, const lio_executor *ex, uint64_t b)
{
    env->around_map[b >> 3] |= (uint8_t)(1u << (b & 7));
    ex->advise(ex->ctx, b * around_pages(env) * env->psize,
               around_pages(env) * env->psize, LIO_ADVISE_WILLNEED);
}

/* Blocks within the OS's own read-ahead of the page a walk is on are left
 * to it: it follows reads in file order (asking for them too made a walk
 * of an appended layout slower with an 8 MiB window).  With a small
 * window (Linux's default, 128 KiB) the walk asks for the blocks after
 * its own. */
static uint64_t near_blocks(const lio_env *env)
{
    return env->src.os_readahead / AROUND_BYTES;
}

/* Can blocks be asked for in the background?  If so (1), with ra_lock
 * held and the executor in *ex.  (A source whose reads the OS does not
 * count has no device to read ahead for it: its advice is a read of the
 * region, made now; under O_DIRECT the OS keeps nothing.) */
static int begin_advice(lio_env *env, const lio_meta *snap, lio_executor *ex)
{
    if (env->align > 1 || !env->src.counted_reads)
        return 0;
    pthread_mutex_lock(&env->ra_lock);
    *ex = env->ex;
    if (ex->advise && around_map(env, snap))
        return 1;
    pthread_mutex_unlock(&env->ra_lock);
    return 0;
}

uint64_t lio_os_window_pages(const lio_env *env)
{
    return near_blocks(env) ? env->src.os_readahead / env->psize : 0;
}

void lio_page_advise_around(lio_env *env, const lio_meta *snap,
                            uint64_t at, const uint64_t *pgnos, size_t n)
{
    lio_executor ex;
    uint64_t here = at / around_pages(env), near = near_blocks(env);
    if (!from_device(env) || !begin_advice(env, snap, &ex))
        return;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = pgnos[i] / around_pages(env);
        if (pgnos[i] > snap->last_pg || around_done(env, b) ||
            (b + near >= here && b <= here + near))
            continue;
        advise_block(env, &ex, b);
    }
    pthread_mutex_unlock(&env->ra_lock);
}

void lio_page_advise_ahead(lio_env *env, const lio_meta *snap, uint64_t at,
                           uint64_t pages)
{
    lio_executor ex;
    uint64_t b = at / around_pages(env) + 1;
    uint64_t last = (at + pages) / around_pages(env);
    if (last > snap->last_pg / around_pages(env))
        last = snap->last_pg / around_pages(env);
    if (!from_device(env) || !begin_advice(env, snap, &ex))
        return;
    for (; b <= last; b++)
        if (!around_done(env, b))
            advise_block(env, &ex, b);
    pthread_mutex_unlock(&env->ra_lock);
}

/* Lookups in random order from the device: each leaf missed also asks the
 * OS, in the background, for the next SWEEP_BLOCKS blocks of the file not
 * read around yet, in file order.  Lookups in random order reach every
 * part of the file; a mapping's page fault reads read_ahead_kb around
 * itself (8 MiB on some machines) while the process waits, this costs the
 * device as many bytes a miss but in large reads in file order, while the
 * lookups go on (cold, 500k lookups in shuffled order, fresh processes:
 * 0.61-0.69x py-lmdb's time against 0.56-0.58x without; 200k in a file
 * written in random order 0.70-0.75x against 0.59-0.65x).  Not for data
 * larger than half the memory: the OS could not keep what was read. */
#define SWEEP_BLOCKS 4

int lio_env_fits_memory(lio_env *env, const lio_meta *snap)
{
    int fits = __atomic_load_n(&env->fits_memory, __ATOMIC_RELAXED);
    if (!fits) {
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        fits = pages > 0 && size > 0 && (snap->last_pg + 1) * env->psize >
                                        (uint64_t)pages * (uint64_t)size / 2
               ? -1 : 1;
        __atomic_store_n(&env->fits_memory, fits, __ATOMIC_RELAXED);
    }
    return fits > 0;
}

static void sweep_ahead(lio_env *env, const lio_meta *snap)
{
    lio_executor ex;
    uint64_t end = snap->last_pg / around_pages(env) + 1;
    size_t given = 0;
    if (!lio_env_fits_memory(env, snap) || !begin_advice(env, snap, &ex))
        return;
    while (given < SWEEP_BLOCKS && env->sweep < end) {
        uint64_t b = env->sweep++;
        if (!around_done(env, b)) {
            advise_block(env, &ex, b);
            given++;
        }
    }
    pthread_mutex_unlock(&env->ra_lock);
}

void lio_cache_close(lio_env *env)
{
    if (!env)
        return;
    free(env->table);
    while (env->slabs) {
        struct lio_slab *next = env->slabs->next;
        free(env->slabs->data);
        free(env->slabs);
        env->slabs = next;
    }
    free(env->around_map);
    free(env->around_sink);
    free(env->ghost);
    if (env->plan_ready)
        lio_plan_free(&env->plan);
    pthread_mutex_destroy(&env->ra_lock);
    pthread_mutex_destroy(&env->lock);
    free(env);
}
