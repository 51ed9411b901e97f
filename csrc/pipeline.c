/* The Reader's window pipeline: lanes that read windows of batches in C
 * threads, and the recycled memory the batches live in.
 *
 * A lane claims the next window of positions (in order), turns them into
 * ordinals (the share's positions, wrapped past the end of the database,
 * through the epoch's permutation when there is one), advises the storage
 * of the positions two windows ahead, prepares and fills the window's
 * batches into one block and queues it.  The consumer takes the windows in
 * order.  Nothing here takes a lock that Python holds, so two lanes and the
 * consumer run on as many cores as there are: the lanes never wait for the
 * interpreter.
 *
 * A window's block holds, in this order: the ordinals (int64[n]), the value
 * offsets (int64[n + nb]: batch j's n_j + 1 of them start at index
 * first_j + j), the key offsets likewise when keys are wanted, the start
 * of each batch's values and keys inside the block (int64[nb + 1] each),
 * the keys back to back, then each batch's values starting 16 bytes past a
 * 64-byte boundary (overflow values begin 16 bytes into their page, and
 * copies from the page cache run at full speed when the destination has
 * the file offset's alignment).
 *
 * Layer 6 of the core, above the bulk reads.
 * May call: errors.c (lio_fail), env.c (lio_env_read_metas), index.c
 * (lio_index_pending and the counts of a begun index), bulk.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np */
#endif
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core.h"

/* ---- recycled blocks ---------------------------------------------------- */

/* Idle blocks kept for the next windows: a new window lands in memory that
 * is mapped already (a fresh page costs more to fault in than to fill) and,
 * among blocks that fit equally, in the one returned last, whose lines the
 * CPU's caches are likeliest still to hold. */
#define BLOCKS_KEPT 16
#define BLOCKS_KEPT_BYTES ((size_t)256 << 20)
/* Windows grow from one batch: a block at least this big is reused by the
 * next windows instead of faulting in fresh memory (its untouched pages
 * cost nothing). */
#define BLOCK_MIN ((size_t)4 << 20)

static struct {
    pthread_mutex_t lock;
    void *ptr[BLOCKS_KEPT];
    size_t cap[BLOCKS_KEPT];
    unsigned n;
    size_t held;
} blocks = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0, 0};

/* A fork while a lane holds the lock would leave it held in the child
 * (which has no lanes): the fork waits for it, and both sides let go. */
static pthread_once_t blocks_once = PTHREAD_ONCE_INIT;
static void blocks_lock(void) { pthread_mutex_lock(&blocks.lock); }
static void blocks_unlock(void) { pthread_mutex_unlock(&blocks.lock); }
static void blocks_init(void)
{
    pthread_atfork(blocks_lock, blocks_unlock, blocks_unlock);
}

/* Each block is preceded by a page of its own that records how much of
 * it has been written (its pages mapped): the part of a window past that
 * is mapped in one call before the window is read into it.  A fresh page
 * mapped by a write fault costs 2.5-2.7 us here, by MADV_POPULATE_WRITE
 * 1.6 us (a fresh process's first windows land in fresh memory: 8 MB of
 * an epoch of 10k small records).  A kernel without it (before 5.14)
 * maps them as they are written, as before. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define BLOCK_HEAD 4096u
typedef struct {
    size_t mapped;            /* bytes of the block known mapped */
} block_head;
static int populate_off;      /* the kernel refused MADV_POPULATE_WRITE */

static void *map_ahead(void *p, size_t need)
{
    block_head *h = (block_head *)((uint8_t *)p - BLOCK_HEAD);
    size_t end = (need + 4095) & ~(size_t)4095;
    if (end > h->mapped) {
        if (!__atomic_load_n(&populate_off, __ATOMIC_RELAXED) &&
            madvise((uint8_t *)p + h->mapped, end - h->mapped,
                    MADV_POPULATE_WRITE) && errno == EINVAL)
            __atomic_store_n(&populate_off, 1, __ATOMIC_RELAXED);
        h->mapped = end;
    }
    return p;
}

void *lio_block_take(size_t need, size_t *cap)
{
    void *p = NULL;
    unsigned best = BLOCKS_KEPT;
    pthread_once(&blocks_once, blocks_init);
    pthread_mutex_lock(&blocks.lock);
    for (unsigned i = 0; i < blocks.n; i++)
        if (blocks.cap[i] >= need &&
            (best == BLOCKS_KEPT || blocks.cap[i] <= blocks.cap[best]))
            best = i;
    if (best != BLOCKS_KEPT) {
        p = blocks.ptr[best];
        *cap = blocks.cap[best];
        blocks.held -= *cap;
        blocks.n--;
        memmove(&blocks.ptr[best], &blocks.ptr[best + 1],
                (blocks.n - best) * sizeof blocks.ptr[0]);
        memmove(&blocks.cap[best], &blocks.cap[best + 1],
                (blocks.n - best) * sizeof blocks.cap[0]);
    }
    pthread_mutex_unlock(&blocks.lock);
    if (p)
        return map_ahead(p, need);
    /* An eighth more than asked: windows of the same batch count differ
     * by a few percent, and a block a little short of the next is no use. */
    if (need > SIZE_MAX / 2)
        return NULL;
    *cap = need + need / 8 > BLOCK_MIN ? need + need / 8 : BLOCK_MIN;
    *cap = (*cap + 4095) & ~(size_t)4095;
    if (*cap > SIZE_MAX - BLOCK_HEAD ||
        posix_memalign(&p, 4096, BLOCK_HEAD + *cap))
        return NULL;
    ((block_head *)p)->mapped = 0;
    return map_ahead((uint8_t *)p + BLOCK_HEAD, need);
}

void lio_block_give(void *p, size_t cap)
{
    if (!p)
        return;
    pthread_once(&blocks_once, blocks_init);
    pthread_mutex_lock(&blocks.lock);
    if (blocks.n < BLOCKS_KEPT && blocks.held + cap <= BLOCKS_KEPT_BYTES) {
        blocks.ptr[blocks.n] = p;
        blocks.cap[blocks.n++] = cap;
        blocks.held += cap;
        p = NULL;
    }
    pthread_mutex_unlock(&blocks.lock);
    if (p)
        free((uint8_t *)p - BLOCK_HEAD);
}

/* ---- the pipeline -------------------------------------------------------- */

/* Windows claimed and not yet taken: at most ahead + 1 (ahead is at most
 * LIO_PIPELINE_LANES). */
#define RING 16

typedef struct lane {
    struct lio_pipeline *p;
    lio_bulk *bulk;
    pthread_t tid;
    int started;
    int64_t *ords, *adv;      /* scratch: the window's ordinals, advice's */
    size_t ords_cap, adv_cap;
    size_t *ends;             /* batch ends inside the window */
    uint64_t *kb, *vb;        /* bytes of each batch */
    lio_batch_out *outs;
    size_t nb_cap;
} lane;

typedef struct slot {
    int ready;
    uint64_t seq;
    lio_window win;
} slot;

struct lio_pipeline {
    lio_pipeline_cfg cfg;
    pthread_mutex_t lock;
    pthread_cond_t claimable; /* a lane may claim (released moved, stop) */
    pthread_cond_t delivered; /* a window is ready, or a lane ended */
    pthread_mutex_t join_lock;/* one lio_pipeline_stop joins the lanes; the
                               * others wait for it */
    uint64_t pos;             /* next position to claim */
    uint64_t seq, taken;      /* windows claimed, taken by the consumer */
    uint64_t released;        /* windows whose predecessor's memory the
                               * consumer let go (lio_pipeline_release) */
    uint64_t advised;         /* positions advised so far */
    size_t nbatch;            /* batches of the next window */
    unsigned ahead;
    unsigned running;
    int stop;
    pid_t pid;                /* the process whose threads the lanes are */
    slot ring[RING];
    /* counting a begun index (cfg.grow): windows count in order, window k
     * in its turn once turn == k; basis[k % RING]: (leaves counted,
     * records they hold) as window k - 2 left them, what window k reads
     * ahead from while window k - 1 counts; err_before[k % RING]: the
     * largest error of the expectations of windows up to k - 2, or -1
     * (lio_leaves_ahead's err), err_max the largest so far */
    pthread_cond_t turns;
    uint64_t turn;
    uint64_t basis[RING][2];
    double err_before[RING];
    double err_max;
    lane lanes[LIO_PIPELINE_LANES];
    lio_pipeline_stats stats;
};

static uint64_t ordinal_at(const lio_pipeline_cfg *c, uint64_t pos)
{
    uint64_t q = c->first + pos;
    if (q >= c->total)
        q %= c->total;    /* the last ranks wrap to pad their shares */
    return c->perm ? (uint64_t)c->perm[q] : q;
}

/* lio_leaves_ahead's expectation: leaves [*a, *b) for the ordinals at the
 * average records a leaf of the uncounted rest holds, or 0: none. */
static int leaves_expected(uint64_t first_ord, uint64_t last_ord,
                           uint64_t counted, uint64_t covered,
                           uint64_t leaves, uint64_t records,
                           double *a, double *b)
{
    double per;
    if (counted >= leaves || covered >= records || last_ord < first_ord)
        return 0;
    /* (in doubles: the counts a hostile file gives) */
    per = (double)(leaves - counted) / (double)(records - covered);
    *a = (double)counted + ((double)first_ord - (double)covered) * per;
    *b = (double)counted + ((double)last_ord + 1 - (double)covered) * per;
    return 1;
}

void lio_leaves_ahead(uint64_t first_ord, uint64_t last_ord, uint64_t counted,
                      uint64_t covered, uint64_t leaves, uint64_t records,
                      double err, uint64_t *lo, uint64_t *hi)
{
    double a, b, margin, x;
    *lo = *hi = counted;
    if (!leaves_expected(first_ord, last_ord, counted, covered, leaves,
                         records, &a, &b))
        return;
    margin = (b - a) / 32 + 2;
    if (err >= 0 && 2 * err + 2 < margin)
        margin = 2 * err + 2;
    /* lo = max(counted, trunc(a - margin)), at most every leaf */
    x = a - margin;
    if (x >= (double)leaves)
        *lo = leaves;
    else if (x > (double)counted)
        *lo = (uint64_t)x;
    /* hi = max(lo, min(leaves, trunc(b + margin) + 1)) */
    x = b + margin;
    if (x >= (double)leaves)
        *hi = leaves;
    else if (x > -1.0)
        *hi = (uint64_t)(x < 0 ? 0 : x) + 1;
    else
        *hi = 0;
    if (*hi > leaves)
        *hi = leaves;
    if (*hi < *lo)
        *hi = *lo;
}

double lio_leaves_ahead_error(uint64_t first_ord, uint64_t last_ord,
                              uint64_t counted, uint64_t covered,
                              uint64_t leaves, uint64_t records,
                              uint64_t true_lo, uint64_t true_hi)
{
    double a, b, lo_off, hi_off;
    if (!leaves_expected(first_ord, last_ord, counted, covered, leaves,
                         records, &a, &b))
        return -1;
    lo_off = a > (double)true_lo ? a - (double)true_lo : (double)true_lo - a;
    hi_off = b > (double)true_hi ? b - (double)true_hi : (double)true_hi - b;
    return lo_off > hi_off ? lo_off : hi_off;
}

static int fill_ordinals(const lio_pipeline_cfg *c, int64_t **buf,
                         size_t *cap, uint64_t from, size_t n)
{
    if (lio_grow((void **)buf, cap, n ? n : 1, sizeof **buf))
        return -1;
    for (size_t i = 0; i < n; i++)
        (*buf)[i] = (int64_t)ordinal_at(c, from + i);
    return 0;
}

/* The next window in order: its sequence number, first position, records
 * and the positions it advises, or 0 when there is none (or the pipeline
 * stops).  A window advises the positions up to two windows past its own
 * that no window advised before: each position once, a window or two
 * before it is read. */
static int claim(lio_pipeline *p, uint64_t *seq, uint64_t *start,
                 size_t *nrec, uint64_t *adv_lo, uint64_t *adv_hi)
{
    uint64_t end = p->cfg.stop, lo, hi;
    pthread_mutex_lock(&p->lock);
    while (!p->stop && p->pos < end && p->seq - p->released > p->ahead)
        pthread_cond_wait(&p->claimable, &p->lock);
    if (p->stop || p->pos >= end) {
        pthread_mutex_unlock(&p->lock);
        return 0;
    }
    *nrec = (size_t)(end - p->pos < p->nbatch * p->cfg.batch
                     ? end - p->pos : p->nbatch * p->cfg.batch);
    *start = p->pos;
    lo = p->advised > *start + *nrec ? p->advised : *start + *nrec;
    hi = *start + 3 * (uint64_t)*nrec < end ? *start + 3 * (uint64_t)*nrec
                                            : end;
    if (hi < lo)
        hi = lo;
    p->advised = hi;
    *adv_lo = lo;
    *adv_hi = hi;
    *seq = p->seq++;
    p->pos += *nrec;
    if (p->seq - p->released > p->stats.max_ahead)
        p->stats.max_ahead = p->seq - p->released;
    pthread_mutex_unlock(&p->lock);
    return 1;
}

/* Size the next windows from what this one cost (under the lock). */
static void grow(lio_pipeline *p, uint64_t bytes, size_t nrec, size_t nb)
{
    size_t bs = p->cfg.batch, lanes = p->cfg.nlanes, fits, want;
    uint64_t per_batch = nrec ? bytes * bs / nrec : 1;
    if (per_batch == 0)
        per_batch = 1;
    want = (size_t)(p->cfg.window_bytes / per_batch);
    p->nbatch = 2 * p->nbatch < want ? 2 * p->nbatch : want;
    if (p->nbatch == 0)
        p->nbatch = 1;
    /* Windows read ahead of the consumer's: as many as prefetch_bytes
     * holds, one per lane at least (every core works), one more at most:
     * batches of tens of MiB would otherwise keep four windows of fresh
     * memory alive. */
    fits = (size_t)(p->cfg.prefetch_bytes / (p->nbatch * per_batch));
    if (fits > lanes + 1)
        fits = lanes + 1;
    if (fits < lanes)
        fits = lanes;
    p->ahead = (unsigned)fits - 1;
    p->stats.windows++;
    if (bytes > p->stats.max_bytes)
        p->stats.max_bytes = bytes;
    if (nb > p->stats.max_batches)
        p->stats.max_batches = nb;
}

static uint64_t newest_txnid(lio_env *env)
{
    lio_meta m[2];
    lio_error err;
    if (lio_env_read_metas(env, m, &err))
        return 0;
    return m[0].txnid > m[1].txnid ? m[0].txnid : m[1].txnid;
}

/* The first offset at or after v that lies 16 bytes past a 64-byte
 * boundary. */
static size_t phase16(size_t v) { return ((v + 63 - 16) & ~(size_t)63) + 16; }

/* Room in the lane's per-batch arrays for nb batches. */
static int lane_room(lane *ln, size_t nb)
{
    size_t cap = ln->nb_cap ? ln->nb_cap : 16;
    void *q;
    if (nb <= ln->nb_cap)
        return 0;
    while (cap < nb)
        cap *= 2;
    if (!(q = realloc(ln->ends, cap * sizeof *ln->ends)))
        return -1;
    ln->ends = q;
    if (!(q = realloc(ln->kb, cap * sizeof *ln->kb)))
        return -1;
    ln->kb = q;
    if (!(q = realloc(ln->vb, cap * sizeof *ln->vb)))
        return -1;
    ln->vb = q;
    if (!(q = realloc(ln->outs, cap * sizeof *ln->outs)))
        return -1;
    ln->outs = q;
    ln->nb_cap = cap;
    return 0;
}

/* Wait until `turn` windows have counted: 0, or 1 when the pipeline
 * stops. */
static int wait_turn(lio_pipeline *p, uint64_t turn)
{
    int stop;
    pthread_mutex_lock(&p->lock);
    while (p->turn < turn && !p->stop)
        pthread_cond_wait(&p->turns, &p->lock);
    stop = p->stop;
    pthread_mutex_unlock(&p->lock);
    return stop;
}

/* Window k of an epoch that counts a begun index's leaves as it reads
 * them: first read the leaves it expects to count (from the index as
 * window k - 2 left it, at the records a leaf of the rest holds) while
 * window k - 1 counts, then count them from memory in its turn.  The reads
 * of both lanes overlap, the counting runs one window at a time, and
 * every step depends only on what the windows before counted, so an epoch
 * makes the same requests every time (the scale model replays them).  A
 * failure here is left for the window's own read to meet and report. */
static void count_in_turn(lane *ln, uint64_t k, const int64_t *ords, size_t n,
                          uint64_t most)
{
    lio_pipeline *p = ln->p;
    lio_index *idx = p->cfg.grow;
    uint64_t counted, covered, lo, hi, nl, first, last;
    double err_before, err = -1;
    int stop;
    if (k)
        wait_turn(p, k - 1);
    pthread_mutex_lock(&p->lock);
    counted = p->basis[k % RING][0];
    covered = p->basis[k % RING][1];
    err_before = p->err_before[k % RING];
    stop = p->stop;
    pthread_mutex_unlock(&p->lock);
    first = n ? (uint64_t)ords[0] : 0;
    last = n ? (uint64_t)ords[n - 1] : 0;
    if (counted < idx->tree_leaves && !stop && n) {
        lio_leaves_ahead(first, last, counted, covered, idx->tree_leaves,
                         p->cfg.entries, err_before, &lo, &hi);
        lio_bulk_read_leaves(ln->bulk, lo, hi);
    }
    if (!wait_turn(p, k) && n) {
        lio_bulk_extend(ln->bulk, idx, most, 1);
        /* how far the expectation fell from the leaves counted (a
         * window that wrapped, or whose count failed, says nothing) */
        if (counted < idx->tree_leaves && first <= last &&
            idx->first[0] <= first && lio_index_holds(idx, last))
            err = lio_leaves_ahead_error(
                first, last, counted, covered, idx->tree_leaves,
                p->cfg.entries, lio_index_find(idx, first),
                lio_index_find(idx, last) + 1);
    }
    nl = __atomic_load_n(&idx->nleaves, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&p->lock);
    if (err > p->err_max)
        p->err_max = err;
    p->basis[(k + 2) % RING][0] = nl;
    p->basis[(k + 2) % RING][1] = idx->first[nl];
    p->err_before[(k + 2) % RING] = p->err_max;
    if (p->turn < k + 1)
        p->turn = k + 1;
    pthread_cond_broadcast(&p->turns);
    pthread_mutex_unlock(&p->lock);
}

/* Read one window into a block of its own (w->block), or say why not
 * (w->rc, w->err). */
static void read_window(lane *ln, uint64_t seq, uint64_t start, size_t n,
                        uint64_t adv_lo, uint64_t adv_hi, lio_window *w)
{
    lio_pipeline *p = ln->p;
    const lio_pipeline_cfg *c = &p->cfg;
    size_t bs = c->batch, nb = (n + bs - 1) / bs, need, at;
    uint64_t kb = 0, vb = 0;
    int64_t *ords, *voff, *koff = NULL, *vst, *kst;
    uint8_t *blk;
    int rc;

    memset(w, 0, sizeof *w);
    w->start = start;
    w->n = n;
    w->nb = nb;
    if (lane_room(ln, nb) ||
        fill_ordinals(c, &ln->ords, &ln->ords_cap, start, n)) {
        if (c->grow)   /* the windows after it wait for its turn */
            count_in_turn(ln, seq, NULL, 0, 0);
        w->rc = lio_fail(&w->err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        return;
    }
    for (size_t j = 0; j < nb; j++)
        ln->ends[j] = (j + 1) * bs < n ? (j + 1) * bs : n;
    /* Read-ahead: the storage fetches the next windows' regions while
     * this one is read (before a counting turn, which reads too). */
    if (adv_hi > adv_lo &&
        !fill_ordinals(c, &ln->adv, &ln->adv_cap, adv_lo,
                       (size_t)(adv_hi - adv_lo)))
        lio_bulk_advise(ln->bulk, ln->adv, (size_t)(adv_hi - adv_lo));
    if (c->grow) {
        uint64_t most = 0;
        for (size_t i = 0; i < n; i++)
            if ((uint64_t)ln->ords[i] > most)
                most = (uint64_t)ln->ords[i];
        count_in_turn(ln, seq, ln->ords, n, most);
        /* what the turn did not count (it failed, or the pipeline
         * stops): counted here, or the window fails saying why */
        if ((rc = lio_bulk_extend(ln->bulk, c->grow, most, 1))) {
            w->rc = rc;
            w->err = *lio_bulk_error(ln->bulk);
            return;
        }
    }
    if ((rc = lio_bulk_prepare(ln->bulk, ln->ords, n, &kb, &vb)) ||
        (rc = lio_bulk_batch_sizes(ln->bulk, ln->ends, nb, ln->kb, ln->vb))) {
        w->rc = rc;
        w->err = *lio_bulk_error(ln->bulk);
        return;
    }
    w->leaf_bytes = lio_bulk_leaf_bytes(ln->bulk);
    /* the block's layout (the file's head comment) */
    at = n * 8;
    w->voff_at = at;
    at += (n + nb) * 8;
    if (c->keys) {
        w->koff_at = at;
        at += (n + nb) * 8;
    }
    w->vstart_at = at;
    at += (nb + 1) * 8;
    w->kstart_at = at;
    at += (nb + 1) * 8;
    w->keys_at = at;
    if (c->keys)
        at += kb;
    need = at;
    for (size_t j = 0; j < nb; j++)
        need = phase16(need) + ln->vb[j];
    if (!(blk = lio_block_take(need, &w->cap))) {
        w->rc = lio_fail(&w->err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
        return;
    }
    ords = (int64_t *)blk;
    memcpy(ords, ln->ords, n * sizeof *ords);
    voff = (int64_t *)(blk + w->voff_at);
    if (c->keys)
        koff = (int64_t *)(blk + w->koff_at);
    vst = (int64_t *)(blk + w->vstart_at);
    kst = (int64_t *)(blk + w->kstart_at);
    at = w->keys_at;
    kst[0] = (int64_t)at;
    for (size_t j = 0; j < nb; j++) {
        size_t first = j ? ln->ends[j - 1] : 0;
        if (c->keys) {
            ln->outs[j].kdata = blk + at;
            ln->outs[j].koff = koff + first + j;
            at += ln->kb[j];
        } else {
            ln->outs[j].kdata = NULL;
            ln->outs[j].koff = NULL;
        }
        kst[j + 1] = (int64_t)at;
    }
    for (size_t j = 0; j < nb; j++) {
        size_t first = j ? ln->ends[j - 1] : 0;
        at = phase16(at);
        vst[j] = (int64_t)at;
        ln->outs[j].vdata = blk + at;
        ln->outs[j].voff = voff + first + j;
        at += ln->vb[j];
    }
    vst[nb] = (int64_t)at;
    if ((rc = lio_bulk_fill_batches(ln->bulk, ln->ends, nb, ln->outs))) {
        lio_block_give(blk, w->cap);
        w->rc = rc;
        w->err = *lio_bulk_error(ln->bulk);
        return;
    }
    if (c->env)
        w->newest = newest_txnid(c->env);
    w->block = blk;
    w->bytes = w->leaf_bytes + vb + (c->keys ? kb : 0);
}

static void *lane_run(void *arg)
{
    lane *ln = arg;
    lio_pipeline *p = ln->p;
    uint64_t seq, start, adv_lo, adv_hi;
    size_t n;
    lio_window w;

#ifdef __linux__
    pthread_setname_np(pthread_self(), "lmdbio-lane");  /* for ps and tests */
#endif
    while (claim(p, &seq, &start, &n, &adv_lo, &adv_hi)) {
        read_window(ln, seq, start, n, adv_lo, adv_hi, &w);
        pthread_mutex_lock(&p->lock);
        if (w.rc == 0)
            grow(p, w.bytes, w.n, w.nb);
        p->ring[seq % RING].win = w;
        p->ring[seq % RING].seq = seq;
        p->ring[seq % RING].ready = 1;
        pthread_cond_broadcast(&p->delivered);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_lock(&p->lock);
    p->running--;
    pthread_cond_broadcast(&p->delivered);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void drop_windows(lio_pipeline *p)
{
    for (unsigned i = 0; i < RING; i++) {
        if (p->ring[i].ready)
            lio_block_give(p->ring[i].win.block, p->ring[i].win.cap);
        p->ring[i].ready = 0;
    }
}

int lio_pipeline_start(lio_pipeline **out, const lio_pipeline_cfg *cfg,
                       lio_error *err)
{
    lio_pipeline *p;
    sigset_t all, old;
    int rc = 0;
    unsigned started = 0;
    *out = NULL;
    if (cfg->nlanes < 1 || cfg->nlanes > LIO_PIPELINE_LANES ||
        cfg->batch == 0 || cfg->total == 0 || cfg->start > cfg->stop)
        return lio_fail(err, LIO_EINVAL, LIO_NO_PAGE,
                        "bad window pipeline arguments");
    for (unsigned i = 0; i < cfg->nlanes; i++)
        if (!cfg->lanes[i])
            return lio_fail(err, LIO_EINVAL, LIO_NO_PAGE,
                            "a window pipeline lane has no batch reader");
    if (!(p = calloc(1, sizeof *p)))
        return lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "out of memory");
    p->cfg = *cfg;
    p->pos = cfg->start;
    p->advised = cfg->advised > cfg->start ? cfg->advised : cfg->start;
    p->nbatch = cfg->nbatch ? cfg->nbatch : 1;
    p->ahead = cfg->ahead < cfg->nlanes ? cfg->ahead : cfg->nlanes;
    p->pid = getpid();
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->join_lock, NULL);
    pthread_cond_init(&p->claimable, NULL);
    pthread_cond_init(&p->delivered, NULL);
    pthread_cond_init(&p->turns, NULL);
    memcpy(p->basis[0], cfg->basis[0], sizeof p->basis[0]);
    memcpy(p->basis[1], cfg->basis[1], sizeof p->basis[1]);
    p->err_before[0] = p->err_before[1] = p->err_max = -1;
    /* The lanes take no signal: the interpreter's handlers run in its
     * main thread. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (unsigned i = 0; i < cfg->nlanes; i++) {
        lane *ln = &p->lanes[i];
        ln->p = p;
        ln->bulk = cfg->lanes[i];
        pthread_mutex_lock(&p->lock);
        rc = pthread_create(&ln->tid, NULL, lane_run, ln);
        ln->started = rc == 0;
        if (ln->started)
            p->running++;   /* (a lane with nothing to read ends at once) */
        started += ln->started;
        pthread_mutex_unlock(&p->lock);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!started) {
        lio_pipeline_free(p);
        lio_fail(err, LIO_ENOMEM, LIO_NO_PAGE, "cannot start a thread for "
                 "the window pipeline: %s", strerror(rc));
        return LIO_ENOMEM;
    }
    *out = p;
    return LIO_SUCCESS;
}

int lio_pipeline_next(lio_pipeline *p, lio_window *w)
{
    slot *s;
    if (p->pid != getpid())
        return LIO_EINVAL;   /* a forked child: the lanes stayed behind */
    pthread_mutex_lock(&p->lock);
    for (;;) {
        s = &p->ring[p->taken % RING];
        if (s->ready && s->seq == p->taken)
            break;
        if (p->taken == p->seq && p->pos >= p->cfg.stop) {
            pthread_mutex_unlock(&p->lock);
            return LIO_NOTFOUND;   /* every window delivered */
        }
        if (p->stop || p->running == 0) {
            pthread_mutex_unlock(&p->lock);
            return LIO_STOPPED;
        }
        pthread_cond_wait(&p->delivered, &p->lock);
    }
    *w = s->win;
    s->ready = 0;
    p->taken++;
    pthread_mutex_unlock(&p->lock);
    return LIO_SUCCESS;
}

void lio_pipeline_release(lio_pipeline *p)
{
    if (p->pid != getpid())
        return;
    pthread_mutex_lock(&p->lock);
    if (p->released < p->taken)
        p->released++;
    pthread_cond_broadcast(&p->claimable);
    pthread_mutex_unlock(&p->lock);
}

void lio_pipeline_get_stats(lio_pipeline *p, lio_pipeline_stats *st)
{
    if (p->pid != getpid()) {   /* (its lock may be held by a lost lane) */
        memset(st, 0, sizeof *st);
        return;
    }
    pthread_mutex_lock(&p->lock);
    *st = p->stats;
    pthread_mutex_unlock(&p->lock);
}

void lio_pipeline_stop(lio_pipeline *p)
{
    if (p->pid != getpid())
        return;   /* a forked child: no lanes to stop, its lock not ours */
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->claimable);
    pthread_cond_broadcast(&p->delivered);
    pthread_cond_broadcast(&p->turns);
    pthread_mutex_unlock(&p->lock);
    /* each lane finishes the window it is reading, sees the stop and
     * exits; a second caller returns once the first has joined them */
    pthread_mutex_lock(&p->join_lock);
    for (unsigned i = 0; i < LIO_PIPELINE_LANES; i++) {
        lane *ln = &p->lanes[i];
        if (ln->started)
            pthread_join(ln->tid, NULL);
        ln->started = 0;
    }
    pthread_mutex_unlock(&p->join_lock);
}

void lio_pipeline_free(lio_pipeline *p)
{
    if (!p || p->pid != getpid())
        return;   /* (a forked child leaves the parent's copy alone) */
    lio_pipeline_stop(p);
    for (unsigned i = 0; i < LIO_PIPELINE_LANES; i++) {
        lane *ln = &p->lanes[i];
        free(ln->ords);
        free(ln->adv);
        free(ln->ends);
        free(ln->kb);
        free(ln->vb);
        free(ln->outs);
    }
    drop_windows(p);
    pthread_cond_destroy(&p->claimable);
    pthread_cond_destroy(&p->delivered);
    pthread_cond_destroy(&p->turns);
    pthread_mutex_destroy(&p->join_lock);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
