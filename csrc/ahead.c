/* Values read ahead on a thread of their own, for a cursor walking forward.
 *
 * A walk over values kept in overflow runs that are not in file order
 * (keys inserted in random order) reads one run per value, and that read
 * is the whole cost of a hot step: the kernel's page-cache lookup and copy.
 * The cursor hands the runs of the values next in its leaf, with the
 * objects they go into, to a worker thread.  The worker reads them from the
 * last backwards while the caller takes them from the first, reading a run
 * itself when the worker has not claimed it.  So neither waits for the
 * other except where the two meet, and both cores read.
 *
 * Each run's state moves FREE -> WORKER or CALLER (whoever claims it) ->
 * DONE or FAILED; a failed read is only noted (the caller reads that
 * value again alone, which reports why).  The worker writes to a run's
 * destination only between claiming it and marking it done, so once the
 * caller has taken a run, or dropped the batch (lio_ahead_drop), nothing
 * writes to its memory any more.  A worker left without a batch for
 * IDLE_MS ends (a cursor kept open after its walk keeps no thread); the
 * next batch starts another.
 *
 * Layer 4 of the core (beside the page cache).
 * May call: errors.c, pager.c (lio_read_segs), pthreads. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np */
#endif
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

#define IDLE_MS 200

enum { FREE, WORKER, CALLER, DONE, FAILED };

struct lio_ahead {
    lio_env *env;
    pthread_t tid;
    pid_t pid;                /* the process that made the mutex's state */
    int running;              /* a worker waits for batches or reads one */
    int joinable;             /* tid: a worker that ran (join it) */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* a batch posted, a batch ended, a run read */
    int stop;
    uint64_t posted, begun;   /* batches posted; the worker's last begun */
    int busy;                 /* the worker is within a batch */
    int waiting;              /* the caller waits for a run */
    size_t n;
    lio_value_run runs[LIO_AHEAD_MAX];
    uint8_t *dsts[LIO_AHEAD_MAX];
    uint8_t hdrs[LIO_AHEAD_MAX][PAGEHDRSZ];
    int state[LIO_AHEAD_MAX];
};

/* Run i's header and value, in one request. */
static int read_run(lio_ahead *a, size_t i, lio_error *err)
{
    lio_seg segs[2];
    uint64_t pgno = a->runs[i].pgno;
    segs[0].dst = a->hdrs[i];
    segs[0].len = PAGEHDRSZ;
    segs[1].dst = a->dsts[i];
    segs[1].len = a->runs[i].size;
    return lio_read_segs(a->env, pgno * a->env->psize, segs, 2, pgno, err);
}

static int claim(lio_ahead *a, size_t i, int who)
{
    int free_ = FREE;
    return __atomic_compare_exchange_n(&a->state[i], &free_, who, 0,
                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static void *worker(void *arg)
{
    lio_ahead *a = arg;
    lio_error err;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        size_t i;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += IDLE_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!a->stop && a->begun == a->posted)
            if (pthread_cond_timedwait(&a->cv, &a->mu, &until) == ETIMEDOUT &&
                a->begun == a->posted)
                a->stop = 2;   /* idle: ends (lio_ahead_post starts one) */
        if (a->stop)
            break;
        a->begun = a->posted;
        a->busy = 1;
        i = a->n;
        pthread_mutex_unlock(&a->mu);
        /* from the last run back, until one the caller claimed: the
         * caller claims from the first on, so the rest are its */
        while (i-- > 0 && claim(a, i, WORKER)) {
            int rc = read_run(a, i, &err);
            __atomic_store_n(&a->state[i], rc ? FAILED : DONE,
                             __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&a->waiting, __ATOMIC_SEQ_CST)) {
                pthread_mutex_lock(&a->mu);
                pthread_cond_broadcast(&a->cv);
                pthread_mutex_unlock(&a->mu);
            }
        }
        pthread_mutex_lock(&a->mu);
        a->busy = 0;
        pthread_cond_broadcast(&a->cv);
    }
    if (a->stop == 2)
        a->stop = 0;
    a->running = 0;
    pthread_mutex_unlock(&a->mu);   /* (the last use of a) */
    return NULL;
}

lio_ahead *lio_ahead_new(lio_env *env)
{
    lio_ahead *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->env = env;
    a->pid = getpid();
    if (pthread_mutex_init(&a->mu, NULL)) {
        free(a);
        return NULL;
    }
    if (pthread_cond_init(&a->cv, NULL)) {
        pthread_mutex_destroy(&a->mu);
        free(a);
        return NULL;
    }
    return a;
}

/* A fork's child: the worker stayed with the parent, and the lock and
 * condition may have been copied mid-use. */
static void after_fork(lio_ahead *a)
{
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    a->running = a->joinable = a->busy = a->waiting = 0;
    a->stop = 0;
    a->begun = a->posted;
    a->pid = getpid();
}

/* Start a worker (none runs): 0, or -1. */
static int start_worker(lio_ahead *a)
{
    sigset_t all, old;
    int rc;
    if (a->joinable)   /* (one that ended idle) */
        pthread_join(a->tid, NULL);
    a->joinable = 0;
    a->running = 1;
    /* (signals stay with the program's own threads) */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    rc = pthread_create(&a->tid, NULL, worker, a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        a->running = 0;
        return -1;
    }
    /* (named here, before any caller can look: for ps and tests) */
    pthread_setname_np(a->tid, "lmdbio-values");
    a->joinable = 1;
    return 0;
}

int lio_ahead_post(lio_ahead *a, const lio_value_run *runs, size_t n,
                   void *const *dsts)
{
    int rc = 0;
    if (n == 0 || n > LIO_AHEAD_MAX)
        return -1;
    if (a->pid != getpid())
        after_fork(a);
    pthread_mutex_lock(&a->mu);
    while (a->busy)   /* (the end of the last batch: it found no more) */
        pthread_cond_wait(&a->cv, &a->mu);
    for (size_t i = 0; i < n; i++) {
        a->runs[i] = runs[i];
        a->dsts[i] = dsts[i];
        a->state[i] = FREE;
    }
    a->n = n;
    a->posted++;
    if (!a->running && start_worker(a)) {
        a->n = 0;
        a->begun = a->posted;
        rc = -1;
    }
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    return rc;
}

const uint8_t *lio_ahead_take(lio_ahead *a, size_t i, lio_error *err)
{
    int st;
    if (i >= a->n)
        return NULL;
    if (claim(a, i, CALLER))
        return read_run(a, i, err) ? NULL : a->hdrs[i];
    st = __atomic_load_n(&a->state[i], __ATOMIC_ACQUIRE);
    if (st == WORKER) {
        if (a->pid != getpid()) {
            /* a fork's child: the worker that claimed it stayed with
             * the parent (asked only here: getpid is a system call) */
            a->state[i] = CALLER;
            return read_run(a, i, err) ? NULL : a->hdrs[i];
        }
        pthread_mutex_lock(&a->mu);
        __atomic_store_n(&a->waiting, 1, __ATOMIC_SEQ_CST);
        while ((st = __atomic_load_n(&a->state[i], __ATOMIC_SEQ_CST)) ==
               WORKER)
            pthread_cond_wait(&a->cv, &a->mu);
        __atomic_store_n(&a->waiting, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&a->mu);
    }
    return st == DONE ? a->hdrs[i] : NULL;
}

const lio_value_run *lio_ahead_run(const lio_ahead *a, size_t i)
{
    return i < a->n ? &a->runs[i] : NULL;
}

void lio_ahead_drop(lio_ahead *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++)
        claim(a, i, CALLER);   /* the worker stops at the first it loses */
    if (a->pid != getpid()) {   /* (a fork's child: no worker here) */
        a->n = 0;
        return;
    }
    pthread_mutex_lock(&a->mu);
    while (a->busy)
        pthread_cond_wait(&a->cv, &a->mu);
    a->n = 0;
    pthread_mutex_unlock(&a->mu);
}

void lio_ahead_free(lio_ahead *a)
{
    if (!a)
        return;
    if (a->pid == getpid()) {
        lio_ahead_drop(a);
        pthread_mutex_lock(&a->mu);
        a->stop = 1;
        pthread_cond_broadcast(&a->cv);
        pthread_mutex_unlock(&a->mu);
        if (a->joinable)
            pthread_join(a->tid, NULL);
        pthread_cond_destroy(&a->cv);
        pthread_mutex_destroy(&a->mu);
    }
    free(a);
}
