/* The POSIX executor: pread, optionally with O_DIRECT.
 *
 * A source and an executor for the env (no page format, no cache).
 * May call: errors.c (lio_fail*), the C library and pthreads.  (The
 * test-only fault-injection hook of the reads lives here.) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

#include <sys/uio.h>

/* ---- fault injection (test builds only, see lmdbio.h) ------------------ */

enum { FI_NONE, FI_EIO, FI_EINTR, FI_SHORT, FI_ZERO };

typedef struct fault_spec {
    int mode;
    uint64_t at;          /* UINT64_MAX: any read */
    uint64_t after;       /* eligible reads to let through first */
    uint64_t times;       /* faults at most (UINT64_MAX: unlimited) */
    uint64_t seen;        /* eligible reads so far */
} fault_spec;

static uint64_t faults_injected;

#ifdef LMDBIO_FAULT_INJECTION
static void fault_parse(fault_spec *f)
{
    const char *s = getenv("LMDBIO_FAULT");
    char buf[256], *tok, *save = NULL;
    memset(f, 0, sizeof *f);
    f->at = UINT64_MAX;
    f->times = UINT64_MAX;
    if (!s || !*s || strlen(s) >= sizeof buf)
        return;
    strcpy(buf, s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "eio"))
            f->mode = FI_EIO;
        else if (!strcmp(tok, "eintr"))
            f->mode = FI_EINTR;
        else if (!strcmp(tok, "short"))
            f->mode = FI_SHORT;
        else if (!strcmp(tok, "zero"))
            f->mode = FI_ZERO;
        else if (!strncmp(tok, "at=", 3))
            f->at = strtoull(tok + 3, NULL, 0);
        else if (!strncmp(tok, "after=", 6))
            f->after = strtoull(tok + 6, NULL, 0);
        else if (!strncmp(tok, "times=", 6))
            f->times = strtoull(tok + 6, NULL, 0);
    }
}
#endif

int lio_fault_injection(uint64_t *injected)
{
    *injected = __atomic_load_n(&faults_injected, __ATOMIC_RELAXED);
#ifdef LMDBIO_FAULT_INJECTION
    return 1;
#else
    return 0;
#endif
}

/* The fault for a read of len bytes at off: FI_NONE, or the mode to apply. */
static int fault_for(fault_spec *f, uint64_t off, size_t len)
{
    uint64_t k;
    if (f->mode == FI_NONE || len == 0)
        return FI_NONE;
    if (f->at != UINT64_MAX && (f->at < off || f->at - off >= len))
        return FI_NONE;
    k = __atomic_fetch_add(&f->seen, 1, __ATOMIC_RELAXED);
    if (k < f->after || k - f->after >= f->times)
        return FI_NONE;
    __atomic_fetch_add(&faults_injected, 1, __ATOMIC_RELAXED);
    return f->mode;
}

struct lio_posix {
    int fd;
    int cached_fd;      /* O_DIRECT: the same file through the OS cache */
    size_t align;
    int block_device;   /* the file lives on one (see lio_source) */
    uint64_t os_readahead;  /* the device's read-ahead window, bytes */
    uint64_t advice_max;    /* the most one WILLNEED call reads, bytes */
    fault_spec fault;
};

/* pread / preadv through the fault hook.  FI_SHORT halves the request:
 * whole iovecs are dropped from the end (the callers continue). */
static ssize_t x_preadv(lio_posix *p, struct iovec *iov, int cnt, off_t off)
{
    size_t len = 0;
    for (int i = 0; i < cnt; i++)
        len += iov[i].iov_len;
    switch (fault_for(&p->fault, (uint64_t)off, len)) {
    case FI_EIO:
        errno = EIO;
        return -1;
    case FI_EINTR:
        errno = EINTR;
        return -1;
    case FI_ZERO:
        return 0;
    case FI_SHORT:
        if (len > 1) {
            struct iovec tmp[1];
            size_t want = len / 2;
            if (cnt > 1 && iov[0].iov_len <= want) {
                int k = 0;
                size_t got = 0;
                while (k < cnt && got + iov[k].iov_len <= want)
                    got += iov[k++].iov_len;
                return preadv(p->fd, iov, k, off);
            }
            tmp[0].iov_base = iov[0].iov_base;
            tmp[0].iov_len = want < iov[0].iov_len ? want : iov[0].iov_len;
            return preadv(p->fd, tmp, 1, off);
        }
        break;
    }
    return preadv(p->fd, iov, cnt, off);
}

static ssize_t x_pread(lio_posix *p, void *buf, size_t len, off_t off)
{
    struct iovec iov = {buf, len};
    if (p->fault.mode == FI_NONE)
        return pread(p->fd, buf, len, off);
    return x_preadv(p, &iov, 1, off);
}

#define EIO_RETRIES 2
/* A read interrupted this many times in a row is an error, not a hang. */
#define EINTR_RETRIES 1000

/* One request of the source (pread for one buffer, else preadv), retried
 * on EINTR and EIO. */
static int64_t read_retried(lio_posix *p, struct iovec *iov, int cnt,
                            uint64_t off)
{
    int eio = 0, eintr = 0;
    for (;;) {
        ssize_t n = cnt == 1 ? x_pread(p, iov[0].iov_base, iov[0].iov_len,
                                       (off_t)off)
                             : x_preadv(p, iov, cnt, (off_t)off);
        if (n >= 0)
            return n;
        if ((errno == EINTR && eintr++ < EINTR_RETRIES) ||
            (errno == EIO && eio++ < EIO_RETRIES))
            continue;
        return -errno;
    }
}

static int64_t posix_read(void *ctx, uint64_t off, void *buf, size_t len)
{
    struct iovec iov = {buf, len};
    return read_retried(ctx, &iov, 1, off);
}

static int64_t posix_readv(void *ctx, uint64_t off, const lio_seg *segs,
                           size_t nseg)
{
    struct iovec iov[LIO_READV_MAX];
    if (nseg == 0 || nseg > LIO_READV_MAX)
        return -EINVAL;
    for (size_t i = 0; i < nseg; i++) {
        iov[i].iov_base = segs[i].dst;
        iov[i].iov_len = segs[i].len;
    }
    return read_retried(ctx, iov, (int)nseg, off);
}

/* The meta pages of an O_DIRECT source, re-read after every window of a
 * reader without a reader slot: through the OS cache, not a request to
 * the device each time (lio_source.read_cached). */
static int64_t posix_read_cached(void *ctx, uint64_t off, void *buf,
                                 size_t len)
{
    lio_posix *p = ctx;
    int eintr = 0;
    for (;;) {
        ssize_t n = pread(p->cached_fd, buf, len, (off_t)off);
        if (n >= 0)
            return n;
        if (errno == EINTR && eintr++ < EINTR_RETRIES)
            continue;
        return -errno;
    }
}

/* A second open of path through the OS cache, if it is the file fd has
 * open (else -1: the source reads everything with O_DIRECT). */
static int open_cached(const char *path, int fd)
{
    struct stat a, b;
    int c = -1;
#ifdef O_NOATIME
    c = open(path, O_RDONLY | O_CLOEXEC | O_NOATIME);   /* (as fd) */
#endif
    if (c < 0)
        c = open(path, O_RDONLY | O_CLOEXEC);
    if (c < 0)
        return -1;
    if (fstat(c, &a) < 0 || fstat(fd, &b) < 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        close(c);
        return -1;
    }
    return c;
}

static int64_t posix_size(void *ctx)
{
    lio_posix *p = ctx;
    struct stat st;
    if (fstat(p->fd, &st) < 0)
        return -errno;
    return st.st_size;
}

/* A value in KiB of the request queue of the device dev (a partition's
 * is its disk's), or -1 when /sys does not say. */
static long queue_kb(dev_t dev, const char *name)
{
    char path[128];
    for (int up = 0; up < 2; up++) {
        FILE *f;
        long kb;
        int ok;
        snprintf(path, sizeof path, "/sys/dev/block/%u:%u/%squeue/%s",
                 major(dev), minor(dev), up ? "../" : "", name);
        if (!(f = fopen(path, "re")))
            continue;
        ok = fscanf(f, "%ld", &kb) == 1 && kb >= 0;
        fclose(f);
        if (ok)
            return kb;
    }
    return -1;
}

/* What the OS reads for a file on device dev: ahead of reads in file
 * order, its read-ahead window (read_ahead_kb); for one WILLNEED advice,
 * at most the larger of that and the device's largest request
 * (max_sectors_kb), cutting a larger advice short (measured, kernel 6.18:
 * 2 MiB advised with both at 128 KiB, 128 KiB read).  Not known: Linux's
 * default of 128 KiB for both. */
#define DEFAULT_OS_KB 128
static void device_reads(lio_posix *p, dev_t dev)
{
    long ra = queue_kb(dev, "read_ahead_kb");
    long req = queue_kb(dev, "max_sectors_kb");
    long most = ra > req ? ra : req;
    p->os_readahead = (uint64_t)(ra >= 0 ? ra : DEFAULT_OS_KB) << 10;
    p->advice_max = (uint64_t)(most > 0 ? most : DEFAULT_OS_KB) << 10;
}

int lio_posix_open(lio_posix **out, const char *path, int direct,
                   lio_error *err)
{
    lio_posix *p;
    int flags = O_RDONLY | O_CLOEXEC;
    struct stat st;

    *out = NULL;
    if (direct)
        flags |= O_DIRECT;
    p = calloc(1, sizeof *p);
    if (!p)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    p->align = 1;
    p->cached_fd = -1;
#ifdef LMDBIO_FAULT_INJECTION
    fault_parse(&p->fault);
#endif
#ifdef O_NOATIME
    /* Reads need not touch the file's access time: the kernel otherwise
     * checks whether to update it on every read (3% of a shuffled epoch's
     * CPU, a read per record).  Only the file's owner may ask. */
    p->fd = open(path, flags | O_NOATIME);
    if (p->fd < 0)
#endif
        p->fd = open(path, flags);
    if (p->fd < 0) {
        int e = errno;
        free(p);
        if (direct && e == EINVAL)
            return lio_fail(err, LIO_EINVAL, LIO_NO_PAGE,
                            "%s: the filesystem refuses O_DIRECT", path);
        lio_fail_sys(err, e, 0, "cannot open the data file");
        return LIO_SYSERR;
    }
    if (fstat(p->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        int isdir = S_ISDIR(st.st_mode);
        close(p->fd);
        free(p);
        if (isdir)
            return lio_fail(err, LIO_INVALID, LIO_NO_PAGE,
                            "%s is a directory, not an LMDB data file", path);
        if (e)
            return lio_fail_sys(err, e, 0, "cannot stat the data file");
        return lio_fail(err, LIO_INVALID, LIO_NO_PAGE,
                        "%s is not a regular file", path);
    }
    /* Filesystems without a device of their own (NFS, FUSE, Lustre's
     * client, tmpfs, overlays) have an anonymous device number, major 0:
     * their reads are not counted as blocks read in. */
    p->block_device = major(st.st_dev) != 0;
    if (p->block_device)
        device_reads(p, st.st_dev);
    if (direct) {
        /* O_DIRECT needs offsets, lengths and buffers aligned to the
         * logical block size; 4096 covers every device we meet. */
        p->align = 4096;
        if (st.st_blksize > 4096 && (st.st_blksize & (st.st_blksize - 1)) == 0)
            p->align = (size_t)st.st_blksize;
        /* (the fault hook's reads all go through fd) */
        if (p->fault.mode == FI_NONE)
            p->cached_fd = open_cached(path, p->fd);
    }
    *out = p;
    return LIO_SUCCESS;
}

void lio_posix_get_source(lio_posix *p, lio_source *src)
{
    src->ctx = p;
    src->read = posix_read;
    src->size = posix_size;
    src->align = p->align;
    src->readv = posix_readv;
    src->counted_reads = p->block_device;
    src->os_readahead = p->os_readahead;
    src->read_cached = p->cached_fd >= 0 ? posix_read_cached : NULL;
}

void lio_posix_close(lio_posix *p)
{
    if (!p)
        return;
    close(p->fd);
    if (p->cached_fd >= 0)
        close(p->cached_fd);
    free(p);
}

/* ---- a pool of reader threads performing plans ------------------------- */

#define MAX_IOV 1024

/* Where the gaps a plan merged across land.  Each thread that performs
 * reads of one plan at the same time as others has its own: the bytes are
 * never looked at, but two threads must not write one buffer at once. */
typedef struct sink_buf {
    uint8_t *buf;
    size_t cap;
} sink_buf;

/* The drainer's own sink for this plan's gaps, or the plan's when memory
 * runs out (the gap bytes are never read). */
static uint8_t *own_sink(sink_buf *sk, const lio_plan *plan)
{
    if (plan->max_gap > sk->cap) {
        uint8_t *b = realloc(sk->buf, plan->max_gap);
        if (!b)
            return plan->sink;
        sk->buf = b;
        sk->cap = plan->max_gap;
    }
    return sk->buf ? sk->buf : plan->sink;
}

struct lio_pool {
    lio_posix *p;
    unsigned nthreads;        /* started so far */
    unsigned want_threads;    /* started on the first plan that needs them */
    uint64_t start_generation; /* the generation when they were started */
    const size_t *todo;       /* the reads of the plan left to the threads */
    size_t ntodo;
    int no_nowait;            /* preadv2(RWF_NOWAIT) is not supported here */
    int no_cachestat;         /* nor cachestat(2) (atomic: any thread sets it) */
    pthread_t *threads;
    pthread_mutex_t run_mu;   /* one plan at a time */
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    const lio_plan *plan;     /* the plan being performed */
    size_t next;              /* next read to take */
    unsigned wanted;          /* workers the current plan asks for */
    unsigned joined;          /* of them, those that took it */
    unsigned busy;            /* those still on it */
    unsigned cores;           /* online CPUs */
    uint64_t generation;
    int stop;
    int rc;
    lio_error err;
    uint64_t requests, bytes;
    uint64_t advised, advice_skipped;
    uint64_t gaps_skipped;    /* planned gaps a cached read did not copy */
    pid_t pid;                /* the process whose threads these are */
    sink_buf caller_sink;     /* the calling thread's, under run_mu */
};

/* A planned read (whose extent was checked against the file size) met the
 * end of the file: it shrank while being read. */
static int shrank(lio_posix *p, lio_error *err, uint64_t off)
{
    struct stat st;
    long long size = fstat(p->fd, &st) == 0 ? (long long)st.st_size : -1;
    lio_fail_sys(err, EIO, off, "read failed");
    if (err)
        snprintf(err->msg, sizeof err->msg, "read failed at offset %llu: end "
                 "of file %s; it is %lld bytes now", (unsigned long long)off,
                 size >= 0 && (unsigned long long)size <= off
                 ? "(the file shrank while being read)" : "inside the file",
                 size);
    return LIO_SYSERR;
}

/* One planned read: preadv straight into its segments, or, for O_DIRECT,
 * into an aligned staging buffer that is then scattered.  (Staging reads
 * whose destinations are out of step with the file offsets mod 64 was
 * measured here: it cost more CPU than the slower kernel copy it avoids.) */
/* Counters for the benchmarks: atomic, so that no lock is taken per read
 * (and a forked child, whose copy of the pool's lock may be held, counts
 * its own reads safely). */
static void count_reads(lio_pool *pool, uint64_t requests, uint64_t bytes)
{
    __atomic_fetch_add(&pool->requests, requests, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pool->bytes, bytes, __ATOMIC_RELAXED);
}

/* sink: where this thread puts the plan's gaps (the plan's own sink when
 * no other thread performs the plan meanwhile). */
static int do_read(lio_pool *pool, const lio_plan *plan, const lio_read *r,
                   uint8_t *sink, lio_error *err)
{
    lio_posix *p = pool->p;
    struct iovec iov[MAX_IOV];
    uint64_t requests = 0, bytes = 0;
    size_t nseg = r->nseg, i;
    int rc = 0, eio = 0, eof = 0, eintr = 0;

    if (p->align > 1) {
        uint64_t start = r->off - r->off % p->align;
        uint64_t end = r->off + r->len;
        uint8_t *stage, *src;
        size_t span, got = 0;
        end += (p->align - end % p->align) % p->align;
        span = (size_t)(end - start);
        if (posix_memalign((void **)&stage, p->align, span))
            return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE,
                            "cannot allocate a %zu-byte staging buffer", span);
        while (got < (size_t)(r->off + r->len - start)) {
            ssize_t n = x_pread(p, stage + got, span - got,
                                (off_t)(start + got));
            requests++;
            if (n < 0 && ((errno == EINTR && eintr++ < EINTR_RETRIES) ||
                          (errno == EIO && eio++ < EIO_RETRIES)))
                continue;
            if (n < 0) {
                rc = lio_fail_sys(err, errno, start + got, "read failed");
                break;
            }
            if (n == 0) {
                if (eof++ < EIO_RETRIES)
                    continue;
                rc = shrank(p, err, start + got);
                break;
            }
            bytes += (uint64_t)n;
            got += (size_t)n;
        }
        src = stage + (r->off - start);
        for (i = 0; rc == 0 && i < nseg; i++) {
            const lio_seg *s = &plan->segs[r->first_seg + i];
            if (s->dst != plan->sink)   /* (a gap: nothing to keep) */
                memcpy(s->dst, src, s->len);
            src += s->len;
        }
        free(stage);
    } else {
        uint64_t off = r->off;
        size_t first = 0, cnt = nseg;
        for (i = 0; i < nseg; i++) {
            uint8_t *dst = plan->segs[r->first_seg + i].dst;
            iov[i].iov_base = dst == plan->sink ? sink : dst;
            iov[i].iov_len = plan->segs[r->first_seg + i].len;
        }
        while (cnt) {
            ssize_t n = x_preadv(p, iov + first, (int)cnt, (off_t)off);
            requests++;
            if (n < 0 && ((errno == EINTR && eintr++ < EINTR_RETRIES) ||
                          (errno == EIO && eio++ < EIO_RETRIES)))
                continue;
            if (n < 0) {
                rc = lio_fail_sys(err, errno, off, "read failed");
                break;
            }
            if (n == 0) {
                if (eof++ < EIO_RETRIES)
                    continue;
                rc = shrank(p, err, off);
                break;
            }
            bytes += (uint64_t)n;
            off += (uint64_t)n;
            /* A short read: skip what arrived and go on. */
            while (cnt && (size_t)n >= iov[first].iov_len) {
                n -= (ssize_t)iov[first].iov_len;
                first++;
                cnt--;
            }
            if (cnt && n) {
                iov[first].iov_base = (uint8_t *)iov[first].iov_base + n;
                iov[first].iov_len -= (size_t)n;
            }
        }
    }
    count_reads(pool, requests, bytes);
    return rc;
}

/* Take reads off the current plan until none is left (beside the other
 * threads doing the same, each with its own sink). */
static void drain(lio_pool *pool, const lio_plan *plan, sink_buf *sk)
{
    uint8_t *sink = own_sink(sk, plan);
    for (;;) {
        size_t i;
        lio_error err;
        int rc;
        pthread_mutex_lock(&pool->mu);
        if (pool->rc || pool->next >= pool->ntodo) {
            pthread_mutex_unlock(&pool->mu);
            return;
        }
        i = pool->todo[pool->next++];
        pthread_mutex_unlock(&pool->mu);
        rc = do_read(pool, plan, &plan->reads[i], sink, &err);
        if (rc == LIO_SUCCESS && plan->done)
            plan->done(plan->done_ctx, i);
        if (rc) {
            pthread_mutex_lock(&pool->mu);
            if (!pool->rc) {
                pool->rc = rc;
                pool->err = err;
            }
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

static void *worker(void *arg)
{
    lio_pool *pool = arg;
    sink_buf sink = {NULL, 0};
    /* Started between plans (start_threads): the next plan is new to it,
     * even one published before this thread first takes the lock. */
    uint64_t seen = pool->start_generation;
#ifdef __linux__
    /* (else it keeps the name of the thread that started it: a Reader's
     * lane, say) */
    pthread_setname_np(pthread_self(), "lmdbio-read");
#endif
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->work, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->generation;
        if (pool->joined == pool->wanted)
            continue;           /* enough of them on it */
        pool->joined++;
        pthread_mutex_unlock(&pool->mu);
        drain(pool, pool->plan, &sink);
        pthread_mutex_lock(&pool->mu);
        if (--pool->busy == 0)
            pthread_cond_broadcast(&pool->done);
    }
    pthread_mutex_unlock(&pool->mu);
    free(sink.buf);
    return NULL;
}

/* Threads start lazily: opening a file for one batch or one cursor costs
 * no thread creation.  A thread that cannot start leaves fewer readers. */
static void start_threads(lio_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    pool->start_generation = pool->generation;
    pthread_mutex_unlock(&pool->mu);
    while (pool->nthreads < pool->want_threads) {
        if (pthread_create(&pool->threads[pool->nthreads], NULL, worker, pool))
            break;
        pool->nthreads++;
    }
    pool->want_threads = pool->nthreads;
}

static int run_reads(lio_pool *pool, const lio_plan *plan, const size_t *todo,
                     size_t ntodo, lio_error *err);

/* Read r if the page cache holds all of it, without blocking: 1 when done.
 * Cached data needs no reader thread (a hand-off costs more than the copy);
 * what is not cached goes to the threads, many requests in flight.
 * A gap of HOT_GAP bytes or more is skipped rather than copied into the
 * sink: the plan merged it for the storage, where a request costs far more
 * than the bytes, but from the page cache another call costs less than
 * copying 8 KiB (measured: a call 0.5-0.8 us, the copy about 0.8 us).  The
 * plan, and so what the storage sees and the request counts, stay the
 * same. */
#define HOT_GAP (8u << 10)
/* Read want bytes at off into iov[0..cnt) only if the page cache holds
 * them all (preadv2(RWF_NOWAIT)): 1 when it did.  A kernel or filesystem
 * that refuses the flag (not EAGAIN: nothing cached) turns the probe off
 * for the pool (no_nowait).  The call skips the C library's wrapper,
 * which makes every call a cancellation point: two atomic updates of the
 * thread's state around each read, 3% of a shuffled epoch's CPU (a read
 * per record; no thread of ours is ever cancelled).  The offset goes as
 * the kernel takes it, its low and high halves of a long each. */
static int read_nowait(lio_pool *pool, int fd, const struct iovec *iov,
                       int cnt, uint64_t off, size_t want)
{
    ssize_t n;
#ifdef SYS_preadv2
    const unsigned half = sizeof(long) * 4;
    n = syscall(SYS_preadv2, fd, iov, cnt, (unsigned long)off,
                (unsigned long)(off >> half >> half), RWF_NOWAIT);
#else
    n = preadv2(fd, iov, cnt, (off_t)off, RWF_NOWAIT);
#endif
    if (n < 0 && errno != EAGAIN && errno != EINTR)
        pool->no_nowait = 1; /* EOPNOTSUPP, EINVAL: an old kernel or fs */
    return n == (ssize_t)want;
}

/* A small read of several segments (a mapped record's key and value)
 * goes into a buffer on the stack in one segment, then is copied out: the
 * kernel's cost of a second segment (0.10-0.13 us a read, measured in a C
 * loop of random 830-byte reads) is more than copying a record that the
 * CPU's first-level cache holds.  Not past 1.5 KiB: the copy out then
 * costs more than the segment (random reads of a hot file, 16-byte header
 * and value: staged 1.46 us against 1.50 us for 1 KiB, 1.81-1.89 against
 * 1.70-1.84 us for 2-4 KiB; CIFAR's 3 KB values are overflow runs read
 * this way).  The buffer starts where the file offset does within a cache
 * line (the kernel's copy runs fastest so). */
#define STAGE_MAX 1536u
static int read_staged(lio_pool *pool, int fd, const lio_plan *plan,
                       const lio_read *r)
{
    uint8_t buf[STAGE_MAX + 64] __attribute__((aligned(64)));
    uint8_t *stage = buf + (r->off & 63);
    struct iovec v = {stage, r->len};
    size_t at = 0;
    if (!read_nowait(pool, fd, &v, 1, r->off, r->len))
        return 0; /* not (all) cached: read it the blocking way */
    for (size_t i = 0; i < r->nseg; i++) {
        const lio_seg *sg = &plan->segs[r->first_seg + i];
        if (sg->dst != plan->sink)
            memcpy(sg->dst, stage + at, sg->len);
        at += sg->len;
    }
    return 1;
}

static int read_cached(lio_pool *pool, int fd, const lio_plan *plan,
                       const lio_read *r)
{
    struct iovec iov[MAX_IOV];
    uint64_t off = r->off, at = r->off, skipped = 0;
    size_t k = 0, want = 0;
    if (r->nseg > 1 && r->len <= STAGE_MAX)
        return read_staged(pool, fd, plan, r);
    if (r->nseg > MAX_IOV)
        return 0;
    for (size_t i = 0; i <= r->nseg; i++) {
        const lio_seg *sg = i < r->nseg ? &plan->segs[r->first_seg + i] : NULL;
        if (sg && !(sg->dst == plan->sink && sg->len >= HOT_GAP)) {
            iov[k].iov_base = sg->dst;
            iov[k].iov_len = sg->len;
            k++;
            want += sg->len;
            off += sg->len;
            continue;
        }
        /* what comes before the gap (or the end); if not (all) cached,
         * it is read the blocking way */
        if (k && !read_nowait(pool, fd, iov, (int)k, at, want))
            return 0;
        if (!sg)
            break;
        skipped++;
        off += sg->len;   /* the gap, skipped */
        at = off;
        k = 0;
        want = 0;
    }
    if (skipped)
        __atomic_add_fetch(&pool->gaps_skipped, skipped, __ATOMIC_RELAXED);
    return 1;   /* (the caller counts it) */
}

/* A plan worth copying on several cores even when cached: one that asks
 * for it (lio_plan.spread) and reads at least SPREAD_MIN bytes a request
 * (a hand-off costs a few microseconds; copying 256 KiB costs ~30). */
#define SPREAD_MIN (256u << 10)
static int spread_hot(const lio_plan *plan)
{
    return plan->spread && plan->nreads > 1 &&
           plan->bytes >= (uint64_t)SPREAD_MIN * plan->nreads;
}

/* Perform a plan: what the page cache holds read by the calling thread
 * through fd (the pool's file, or a lane's description of it), the rest
 * by the pool's threads. */
static int run_plan_via(lio_pool *pool, int fd, const lio_plan *plan,
                        lio_error *err)
{
    size_t *todo, ntodo = 0;
    int rc;
    if (plan->nreads == 0)
        return LIO_SUCCESS;
    /* Reads through the fault hook, O_DIRECT and forked children skip the
     * page-cache probe (their paths below are the ones tested). */
    if (!pool->no_nowait && pool->p->align == 1 &&
        pool->p->fault.mode == FI_NONE && plan->nreads > 1 &&
        pool->pid == getpid() && !spread_hot(plan)) {
        todo = malloc(plan->nreads * sizeof *todo);
        if (todo) {
            uint64_t hits = 0, hit_bytes = 0;
            for (size_t i = 0; i < plan->nreads; i++) {
                if (pool->no_nowait ||
                    !read_cached(pool, fd, plan, &plan->reads[i])) {
                    todo[ntodo++] = i;
                } else {
                    hits++;
                    hit_bytes += plan->reads[i].len;
                    if (plan->done)
                        plan->done(plan->done_ctx, i);
                }
            }
            /* once a plan: both lanes adding to the shared counters after
             * every read of a shuffled window kept their line moving
             * between the cores */
            if (hits)
                count_reads(pool, hits, hit_bytes);
            rc = ntodo ? run_reads(pool, plan, todo, ntodo, err) : LIO_SUCCESS;
            free(todo);
            return rc;
        }
    }
    return run_reads(pool, plan, NULL, plan->nreads, err);
}

static int pool_run(void *ctx, const lio_plan *plan, lio_error *err)
{
    lio_pool *pool = ctx;
    return run_plan_via(pool, pool->p->fd, plan, err);
}

/* Perform reads todo[0..ntodo) of the plan (all of them if todo is NULL). */
static int run_reads(lio_pool *pool, const lio_plan *plan, const size_t *todo,
                     size_t ntodo, lio_error *err)
{
    size_t *all = NULL;
    unsigned helpers;
    int rc, mine = pool->pid == getpid();
    /* A forked child has no reader threads (and the pool's locks may have
     * been held by one at the fork): it reads by itself, touching neither. */
    if (ntodo > 1 && pool->nthreads < pool->want_threads && mine) {
        pthread_mutex_lock(&pool->run_mu);
        start_threads(pool);
        pthread_mutex_unlock(&pool->run_mu);
    }
    if (ntodo == 1 || pool->nthreads == 0 || !mine) {
        for (size_t i = 0; i < ntodo; i++) {
            size_t r = todo ? todo[i] : i;
            if ((rc = do_read(pool, plan, &plan->reads[r], plan->sink, err)))
                return rc;
            if (plan->done)
                plan->done(plan->done_ctx, r);
        }
        return LIO_SUCCESS;
    }
    if (!todo) {
        all = malloc(ntodo * sizeof *all);
        if (!all)
            return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        for (size_t i = 0; i < ntodo; i++)
            all[i] = i;
        todo = all;
    }
    pthread_mutex_lock(&pool->run_mu);
    pthread_mutex_lock(&pool->mu);
    pool->plan = plan;
    pool->todo = todo;
    pool->ntodo = ntodo;
    pool->next = 0;
    pool->rc = 0;
    /* As many workers as there are reads beside the caller's (each wakes
     * on its own core, or keeps the caller waiting for one); from the OS
     * cache, where more threads than cores only take turns, one a core. */
    helpers = ntodo - 1 < pool->nthreads ? (unsigned)(ntodo - 1)
                                         : pool->nthreads;
    if (spread_hot(plan) && helpers >= pool->cores)
        helpers = pool->cores > 1 ? pool->cores - 1 : 1;
    pool->wanted = pool->busy = helpers;
    pool->joined = 0;
    pool->generation++;
    if (helpers == pool->nthreads)
        pthread_cond_broadcast(&pool->work);
    else
        for (unsigned k = 0; k < helpers; k++)
            pthread_cond_signal(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    drain(pool, plan, &pool->caller_sink);
    pthread_mutex_lock(&pool->mu);
    while (pool->busy)
        pthread_cond_wait(&pool->done, &pool->mu);
    rc = pool->rc;
    if (rc && err)
        *err = pool->err;
    pthread_mutex_unlock(&pool->mu);
    pthread_mutex_unlock(&pool->run_mu);
    free(all);
    return rc;
}

int lio_pool_open(lio_pool **out, lio_posix *p, unsigned nthreads,
                  lio_error *err)
{
    lio_pool *pool = calloc(1, sizeof *pool);
    *out = NULL;
    if (!pool)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    pool->p = p;
    pool->pid = getpid();
    pool->cores = sysconf(_SC_NPROCESSORS_ONLN) > 0
                  ? (unsigned)sysconf(_SC_NPROCESSORS_ONLN) : 1;
    pthread_mutex_init(&pool->run_mu, NULL);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = calloc(nthreads ? nthreads : 1, sizeof *pool->threads);
    if (!pool->threads) {
        lio_pool_close(pool);
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    }
    pool->want_threads = nthreads;
    *out = pool;
    return LIO_SUCCESS;
}

/* Is the page at `at` in the OS's cache?  Read one byte without blocking
 * (RWF_NOWAIT).  Where the kernel cannot (FUSE: EOPNOTSUPP) and the file
 * has no device of its own, one byte read and timed: a cached page comes
 * in a microsecond or two, the storage's in a round trip (a read that
 * brings it in does what the region's read would do anyway).  Elsewhere
 * without RWF_NOWAIT: taken as not cached (the advice is then cheap). */
#define PROBE_CACHED_NS 20000u
static int page_cached(lio_pool *pool, uint64_t at)
{
    uint8_t byte;
    struct iovec v = {&byte, 1};
    struct timespec t0, t1;
    ssize_t n;
    if (!pool->no_nowait) {
        if (read_nowait(pool, pool->p->fd, &v, 1, at, 1))
            return 1;
        if (!pool->no_nowait)
            return 0;   /* not cached */
    }
    if (pool->p->block_device)
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    n = pread(pool->p->fd, &byte, 1, (off_t)at);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return n == 1 && (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL +
                                (t1.tv_nsec - t0.tv_nsec)) < PROBE_CACHED_NS;
}

/* cachestat(2) (Linux 6.5): how many pages of a range the OS cache
 * holds, counted without reading any.  Its number is the same on every
 * architecture but alpha. */
#if defined(__linux__) && !defined(__alpha__) && !defined(SYS_cachestat)
#define SYS_cachestat 451
#endif
#ifdef SYS_cachestat
struct cachestat_range_arg { uint64_t off, len; };
struct cachestat_counts {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted,
             nr_recently_evicted;
};
#endif

/* 1: every page of [off, off + len) is in the OS cache, 0: not, -1: the
 * kernel cannot count them. */
static int range_cached(lio_pool *pool, uint64_t off, uint64_t len)
{
#ifdef SYS_cachestat
    struct cachestat_range_arg range = {off, len};
    struct cachestat_counts counts;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    if (!__atomic_load_n(&pool->no_cachestat, __ATOMIC_RELAXED)) {
        if (syscall(SYS_cachestat, pool->p->fd, &range, &counts, 0) == 0)
            return counts.nr_cache >=
                   (off + len - 1) / page - off / page + 1;
        __atomic_store_n(&pool->no_cachestat, 1, __ATOMIC_RELAXED);
    }
#else
    (void)pool; (void)off; (void)len;
#endif
    return -1;
}

/* Does the page cache hold [off, off + *len)?  Asking the kernel to read
 * ahead a cached region costs it a lookup of every page (measured: 4-5%
 * of a hot epoch's CPU, for nothing), and reading it for real
 * (read_region) a copy of it.  Where the kernel can count cached pages
 * (cachestat), PROBES ranges of SAMPLE_BYTES spread over the region (its
 * first and last among them) are counted: the count walks every page it
 * covers (8 us for 1 MiB here, 0.4 us for 16 KiB), and a hot key-order
 * epoch spent 4-5% of its CPU counting whole regions.  Elsewhere PROBES
 * of its pages (the part inside the file) are probed (page_cached).
 * Either way a region whose samples are all cached is taken as cached: a
 * page missing between them is read by the window that needs it.  A probe
 * is a read, and a read that misses starts one of its own: where the
 * device answered before the probe looked, an uncached 2 MiB block passed
 * for cached and was never asked for (3 of 115 cold walks here, cachestat
 * showing 7 of its 512 pages in).  1: cached (or past the file's end); 0:
 * not, *len cut to the file's end; -1: not probed (no probe here, or the
 * file cannot be sized), *len as it was. */
#define PROBES 4
#define SAMPLE_BYTES (16u << 10)
static int region_cached(lio_pool *pool, uint64_t off, uint64_t *len)
{
    struct stat st;
    uint64_t n;
    int counted;
    if ((pool->no_nowait && pool->p->block_device) ||
        pool->p->fault.mode != FI_NONE || *len == 0 ||
        pool->pid != getpid() || fstat(pool->p->fd, &st) < 0)
        return -1;
    if (off >= (uint64_t)st.st_size)
        return 1;   /* nothing there to read ahead */
    if (*len > (uint64_t)st.st_size - off)
        *len = (uint64_t)st.st_size - off;
    n = *len;
    if (n <= (uint64_t)PROBES * SAMPLE_BYTES)
        counted = range_cached(pool, off, n);
    else
        for (unsigned i = 0; i < PROBES; i++)
            if ((counted = range_cached(pool, off + (n - SAMPLE_BYTES) /
                                                 (PROBES - 1) * i,
                                        SAMPLE_BYTES)) != 1)
                break;
    if (counted >= 0)
        return counted;
    for (unsigned i = 0; i < PROBES; i++)
        if (!page_cached(pool, off + (n - 1) / (PROBES - 1) * i))
            return 0;
    return 1;
}

/* A region asked for (WILLNEED) of a file with no device of its own,
 * read for real, its requests (LIO_NET_READ each) in flight on the pool's
 * threads.  Such filesystems may drop the advice: FUSE drops read-ahead
 * while its queue is busy (measured: 1 request for 64 MiB advised), and
 * then every page is a request of its own, each a network round trip.
 * The bytes land in the threads' sinks: only the OS's cache keeps them. */
static void read_region(lio_pool *pool, uint64_t off, uint64_t len)
{
    lio_plan plan;
    lio_error err;
    /* (its sink: where a thread reads when it has none of its own) */
    lio_plan_init(&plan, LIO_NET_READ, LIO_NET_READ);
    if (!plan.sink)
        return;   /* out of memory: the advice is optional */
    for (uint64_t at = off; at < off + len; at += LIO_NET_READ) {
        uint64_t n = off + len - at < LIO_NET_READ ? off + len - at
                                                    : LIO_NET_READ;
        if (lio_plan_add(&plan, at, plan.sink, (size_t)n))
            break;   /* (out of memory: the advice is optional) */
    }
    if (plan.nreads)
        (void)run_reads(pool, &plan, NULL, plan.nreads, &err);
    lio_plan_free(&plan);
}

/* The page cache's advice calls (no effect, and no harm, under O_DIRECT). */
static void pool_advise(void *ctx, uint64_t off, uint64_t len, int advice)
{
    lio_pool *pool = ctx;
    if (pool->p->align > 1)
        return;
    if (advice == LIO_ADVISE_WILLNEED) {
        int cached = region_cached(pool, off, &len);
        __atomic_add_fetch(cached == 1 ? &pool->advice_skipped
                                       : &pool->advised,
                           1, __ATOMIC_RELAXED);
        if (cached == 1)
            return;
        /* (probed: this process's file, no fault hook, len within it) */
        if (cached == 0 && !pool->p->block_device) {
            read_region(pool, off, len);
            return;
        }
    }
    if (advice == LIO_ADVISE_DONTNEED) {
        (void)posix_fadvise(pool->p->fd, (off_t)off, (off_t)len,
                            POSIX_FADV_DONTNEED);
        return;
    }
    /* in pieces the kernel reads whole (advice_max) */
    for (uint64_t at = off, step = pool->p->advice_max ? pool->p->advice_max
                                                       : len;
         at < off + len; at += step)
        (void)posix_fadvise(pool->p->fd, (off_t)at,
                            (off_t)(off + len - at < step ? off + len - at
                                                          : step),
                            POSIX_FADV_WILLNEED);
}

void lio_pool_get_executor(lio_pool *pool, lio_executor *ex)
{
    ex->ctx = pool;
    ex->run = pool_run;
    ex->advise = pool_advise;
}

void lio_pool_stats(const lio_pool *pool, uint64_t *requests, uint64_t *bytes)
{
    *requests = __atomic_load_n(&pool->requests, __ATOMIC_RELAXED);
    *bytes = __atomic_load_n(&pool->bytes, __ATOMIC_RELAXED);
}

void lio_pool_advice(const lio_pool *pool, uint64_t *given, uint64_t *skipped)
{
    *given = __atomic_load_n(&pool->advised, __ATOMIC_RELAXED);
    *skipped = __atomic_load_n(&pool->advice_skipped, __ATOMIC_RELAXED);
}

uint64_t lio_pool_gaps_skipped(const lio_pool *pool)
{
    return __atomic_load_n(&pool->gaps_skipped, __ATOMIC_RELAXED);
}

/* ---- a lane's own description of the pool's file ------------------------ */

/* Threads reading the page cache through one open file description share
 * its reference count, which every call takes and drops: one cache line
 * bouncing between their cores (fdget/fput were 7% of a shuffled epoch's
 * CPU; two threads of random 820-byte reads took 0.73-0.78 us a read on
 * one description, 0.64-0.65 us on two).  A lane reopens the file through
 * /proc/self/fd (the same inode, even if the path was replaced since) for
 * the reads it performs itself; what blocks goes to the pool's threads. */
struct lio_pool_lane {
    lio_pool *pool;
    int fd;                   /* -1: the pool's own */
};

static int lane_run(void *ctx, const lio_plan *plan, lio_error *err)
{
    lio_pool_lane *l = ctx;
    return run_plan_via(l->pool, l->fd >= 0 ? l->fd : l->pool->p->fd, plan,
                        err);
}

static void lane_advise(void *ctx, uint64_t off, uint64_t len, int advice)
{
    pool_advise(((lio_pool_lane *)ctx)->pool, off, len, advice);
}

static int reopen(const lio_posix *p)
{
    char name[64];
    struct stat a, b;
    int fd = -1;
    snprintf(name, sizeof name, "/proc/self/fd/%d", p->fd);
#ifdef O_NOATIME
    fd = open(name, O_RDONLY | O_CLOEXEC | O_NOATIME);
    if (fd < 0)
#endif
        fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, &a) < 0 || fstat(p->fd, &b) < 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        close(fd);
        return -1;
    }
    return fd;
}

int lio_pool_lane_open(lio_pool_lane **out, lio_pool *pool, lio_error *err)
{
    lio_pool_lane *l = calloc(1, sizeof *l);
    *out = NULL;
    if (!l)
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    l->pool = pool;
    /* (O_DIRECT and the fault hook read through the pool's description:
     * the cached path is not theirs) */
    l->fd = pool->p->align == 1 && pool->p->fault.mode == FI_NONE
            ? reopen(pool->p) : -1;
    *out = l;
    return LIO_SUCCESS;
}

void lio_pool_lane_get_executor(lio_pool_lane *l, lio_executor *ex)
{
    ex->ctx = l;
    ex->run = lane_run;
    ex->advise = lane_advise;
}

int lio_pool_lane_own_fd(const lio_pool_lane *l) { return l->fd >= 0; }

void lio_pool_lane_close(lio_pool_lane *l)
{
    if (!l)
        return;
    if (l->fd >= 0)
        close(l->fd);
    free(l);
}

void lio_pool_close(lio_pool *pool)
{
    if (!pool)
        return;
    if (pool->pid != getpid()) {
        /* In a forked child the threads are gone: release memory only. */
        free(pool->threads);
        free(pool);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    for (unsigned i = 0; i < pool->nthreads; i++)
        pthread_join(pool->threads[i], NULL);
    free(pool->threads);
    free(pool->caller_sink.buf);
    pthread_cond_destroy(&pool->work);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->mu);
    pthread_mutex_destroy(&pool->run_mu);
    free(pool);
}
