/* lmdbio lock-file layer: liblmdb 0.9.x reader slots in lock.mdb.
 * See lockfile.h for the layout, the protocol and why each lock is of the
 * kind it is.  Facts come from liblmdb's mdb.c (mdb.RE/0.9); the code is
 * lmdbio's own.
 *
 * Independent of the data-file layers: it shares only lmdbio.h's codes and
 * lio_error, and learns the newest txnid through the caller's callback.
 * May call: the C library (fcntl, mmap of the lock file, pthreads) only. */
#define _GNU_SOURCE 1 /* F_OFD_SETLK / F_OFD_SETLKW / F_OFD_GETLK */

#include "lockfile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if !defined(F_OFD_SETLK) || !defined(F_OFD_SETLKW) || !defined(F_OFD_GETLK)
#error "lockfile.c needs Linux open file description locks (F_OFD_SETLK)"
#endif

/* ---- the table, as liblmdb 0.9 lays it out ------------------------------
 * Built from the platform's own types exactly as mdb.c builds MDB_txninfo,
 * so the layout matches a liblmdb compiled for the same platform; the
 * x86_64 glibc offsets are asserted below. */

typedef size_t lk_txnid;            /* txnid_t = MDB_ID = size_t in 0.9 */
#define LK_IDLE ((lk_txnid)-1)      /* mr_txnid of a slot not in a txn */
#define LK_LINE 64                  /* CACHELINE */
#define LK_ROUND(n) (((n) + LK_LINE - 1) & ~(size_t)(LK_LINE - 1))

typedef struct lk_head {            /* MDB_txbody */
    uint32_t magic;
    uint32_t format;
    pthread_mutex_t rmutex;
    lk_txnid txnid;
    unsigned numreaders;
} lk_head;

typedef struct lk_slot_body {       /* MDB_rxbody */
    lk_txnid txnid;
    pid_t pid;
    pthread_t tid;
} lk_slot_body;

typedef union lk_slot {             /* MDB_reader */
    lk_slot_body b;
    char pad[LK_ROUND(sizeof(lk_slot_body))];
} lk_slot;

typedef struct lk_table {           /* MDB_txninfo */
    union { lk_head h; char pad[LK_ROUND(sizeof(lk_head))]; } u1;
    union {
        pthread_mutex_t wmutex;
        char pad[LK_ROUND(sizeof(pthread_mutex_t))];
    } u2;
    lk_slot slots[1];
} lk_table;

#define LK_STATIC_ASSERT(name, cond) \
    typedef char lk_static_assert_##name[(cond) ? 1 : -1]
#if defined(__x86_64__) && defined(__GLIBC__)
LK_STATIC_ASSERT(mutex_size, sizeof(pthread_mutex_t) == 40);
LK_STATIC_ASSERT(rmutex_at_8, offsetof(lk_head, rmutex) == 8);
LK_STATIC_ASSERT(txnid_at_48, offsetof(lk_head, txnid) == 48);
LK_STATIC_ASSERT(numreaders_at_56, offsetof(lk_head, numreaders) == 56);
LK_STATIC_ASSERT(wmutex_at_64, offsetof(lk_table, u2) == 64);
LK_STATIC_ASSERT(slots_at_128, offsetof(lk_table, slots) == 128);
LK_STATIC_ASSERT(slot_is_64, sizeof(lk_slot) == 64);
LK_STATIC_ASSERT(pid_at_8, offsetof(lk_slot_body, pid) == 8);
LK_STATIC_ASSERT(tid_at_16, offsetof(lk_slot_body, tid) == 16);
LK_STATIC_ASSERT(table_192, sizeof(lk_table) == 192);
#endif

/* Shared-memory accesses: sequentially consistent, so the publish loop of
 * a reader and a writer's scan of the slots cannot pass each other. */
#define LD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

/* ---- process-wide registry: one descriptor per lock-file inode --------- */

typedef struct lk_file {
    struct lk_file *next;
    dev_t dev;
    ino_t ino;
    int fd;
    unsigned refs;          /* open lio_lock handles; 0 = parked */
    int inherited;          /* from the parent across fork(): never reuse */
    int rdonly;             /* opened O_RDONLY by lio_lock_inspect: never
                             * attached (a table needs O_RDWR) */
    int posix0;             /* scratch: /proc/locks shows our byte-0 lock */
    lk_table *t;            /* mapping, NULL while parked */
    size_t mapsize;
    unsigned maxreaders;
    pid_t pid;
    char *path;
} lk_file;

struct lio_reader {
    lio_reader *prev, *next; /* lio_lock.live */
    unsigned idx;
};

struct lio_lock {
    lk_file *f;
    pthread_mutex_t mu;     /* guards live */
    lio_reader *live;
};

static pthread_mutex_t g_reg = PTHREAD_MUTEX_INITIALIZER;
static lk_file *g_files;
static pid_t g_reg_pid;     /* the process the registry belongs to */

/* ---- small helpers ------------------------------------------------------ */

static int set_err(lio_error *err, int code, int sys, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        err->sys_errno = sys;
        err->pgno = UINT64_MAX;
        err->off = UINT64_MAX; /* not a read of the data file */
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}

static int sys_err(lio_error *err, int e, const char *path, const char *what)
{
    return set_err(err, LIO_SYSERR, e, "lock file %s: %s: %s", path, what,
                   strerror(e));
}

/* One-byte fcntl lock operation; returns 0 or an errno value. */
static int lk_fcntl(int fd, int cmd, short type, off_t start)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl)); /* l_pid must be 0 for the OFD commands */
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = 1;
    while (fcntl(fd, cmd, &fl) != 0) {
        if (errno != EINTR)
            return errno;
    }
    return 0;
}

/* mdb_reader_pid(Pidcheck): nonzero unless the process is certainly dead
 * (nobody holds a lock on byte `pid`). */
static int pid_alive(int fd, pid_t pid)
{
    struct flock fl;
    for (;;) {
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = pid;
        fl.l_len = 1;
        if (fcntl(fd, F_GETLK, &fl) == 0)
            return fl.l_type != F_UNLCK;
        if (errno != EINTR)
            return 1; /* unknown: keep the slot */
    }
}

static unsigned used_slots(const lk_file *f)
{
    unsigned nr = LD(&f->t->u1.h.numreaders);
    return nr < f->maxreaders ? nr : f->maxreaders;
}

/* ---- reader mutex and stale-slot recovery ------------------------------ */

static int rmutex_lock(lk_file *f, int *recovered, lio_error *err);

/* mdb_reader_check0.  rlocked: the caller holds rmutex. */
static int check_stale(lk_file *f, int rlocked, int *dead, lio_error *err)
{
    lk_slot *s = f->t->slots;
    unsigned n = used_slots(f), i, j, nseen = 0;
    pid_t *seen;
    int rc = 0, count = 0;

    seen = malloc(((size_t)n + 1) * sizeof(*seen));
    if (!seen)
        return set_err(err, LIO_ENOMEM, ENOMEM,
                       "lock file %s: out of memory", f->path);
    for (i = 0; i < n; i++) {
        pid_t pid = LD(&s[i].b.pid);
        unsigned k;
        if (pid == 0 || pid == f->pid)
            continue;
        for (k = 0; k < nseen && seen[k] != pid; k++)
            ;
        if (k < nseen)
            continue;
        seen[nseen++] = pid;
        if (pid_alive(f->fd, pid))
            continue;
        /* Stale: clear every slot of that pid, under rmutex. */
        j = i;
        if (!rlocked) {
            int recovered = 0;
            rc = rmutex_lock(f, &recovered, err);
            if (rc)
                break;
            if (recovered) {
                /* the recovery just checked every slot */
                j = n;
                n = 0;
            } else if (pid_alive(f->fd, pid)) {
                j = n; /* the pid was reused meanwhile */
            }
        }
        for (; j < n; j++) {
            if (LD(&s[j].b.pid) == pid) {
                ST(&s[j].b.pid, 0);
                count++;
            }
        }
        if (!rlocked)
            pthread_mutex_unlock(&f->t->u1.h.rmutex);
    }
    free(seen);
    if (dead)
        *dead = count;
    return rc;
}

/* LOCK_MUTEX + mdb_mutex_failed: on EOWNERDEAD (the previous owner died
 * holding it) clear the slots of dead processes, then mark the mutex
 * consistent.  Returns 0 with rmutex held; *recovered says a recovery ran. */
static int rmutex_lock(lk_file *f, int *recovered, lio_error *err)
{
    pthread_mutex_t *m = &f->t->u1.h.rmutex;
    int rc = pthread_mutex_lock(m);
    if (recovered)
        *recovered = 0;
    if (rc == EOWNERDEAD) {
        if (recovered)
            *recovered = 1;
        rc = check_stale(f, 1, NULL, err);
        if (rc == 0) {
            int r2 = pthread_mutex_consistent(m);
            if (r2)
                rc = sys_err(err, r2, f->path,
                             "reader table mutex (owner died)");
        }
        if (rc)
            pthread_mutex_unlock(m);
        return rc;
    }
    if (rc)
        return sys_err(err, rc, f->path, "reader table mutex");
    return 0;
}

/* ---- /proc/locks: does this process hold a process-owned lock on byte 0
 * of a registered inode (i.e. is a liblmdb env open on it here)? --------- */

/* Sets posix0 on every registry entry.  Matching is by inode number only
 * (st_dev and /proc/locks' device can differ on btrfs/overlayfs); a false
 * match only parks a descriptor, which is harmless.  If /proc/locks cannot
 * be read, every entry counts as held. */
static void scan_proc_locks(void)
{
    lk_file *f;
    FILE *fp;
    char line[512];
    long me = (long)getpid();

    fp = fopen("/proc/locks", "re");
    for (f = g_files; f; f = f->next)
        f->posix0 = fp ? 0 : 1;
    if (!fp)
        return;
    while (fgets(line, sizeof(line), fp)) {
        char type[16], adv[16], rw[16], end[32];
        unsigned maj, min;
        unsigned long long ino;
        long pid;
        long long start;
        const char *p = strchr(line, ':');
        if (!p || strstr(line, "->")) /* "->": a blocked waiter */
            continue;
        if (sscanf(p + 1, " %15s %15s %15s %ld %x:%x:%llu %lld %31s", type,
                   adv, rw, &pid, &maj, &min, &ino, &start, end) != 9)
            continue;
        if (strcmp(type, "POSIX") != 0 || pid != me || start != 0)
            continue;
        for (f = g_files; f; f = f->next)
            if ((unsigned long long)f->ino == ino)
                f->posix0 = 1;
    }
    fclose(fp);
}

/* The registered descriptor on this inode that a handle may use. */
static lk_file *reg_find(const struct stat *st)
{
    lk_file *f;
    for (f = g_files; f; f = f->next)
        if (!f->inherited && !f->rdonly && f->dev == st->st_dev &&
            f->ino == st->st_ino)
            return f;
    return NULL;
}

/* Register descriptor fd (parked: no handle yet); NULL if out of memory. */
static lk_file *reg_add(int fd, const struct stat *st, const char *path,
                        int rdonly)
{
    lk_file *f = calloc(1, sizeof(*f));
    if (f)
        f->path = strdup(path);
    if (!f || !f->path) {
        free(f);
        return NULL;
    }
    f->fd = fd;
    f->dev = st->st_dev;
    f->ino = st->st_ino;
    f->rdonly = rdonly;
    f->next = g_files;
    g_files = f;
    return f;
}

static void reg_unlink(lk_file *f)
{
    lk_file **pp;
    for (pp = &g_files; *pp; pp = &(*pp)->next) {
        if (*pp == f) {
            *pp = f->next;
            break;
        }
    }
    free(f->path);
    free(f);
}

/* Closing the descriptor is safe only if no liblmdb env of this process
 * holds its byte-0 lock on the file: close() would drop it.  (Closing an
 * inherited descriptor never releases the parent's OFD lock while the
 * parent still has the description open.) */
static void sweep_parked(void)
{
    lk_file *f, *next;
    int any = 0;
    for (f = g_files; f; f = f->next)
        any |= (f->refs == 0);
    if (!any)
        return;
    scan_proc_locks();
    for (f = g_files; f; f = next) {
        next = f->next;
        if (f->refs == 0 && !f->posix0) {
            close(f->fd);
            reg_unlink(f);
        }
    }
}

/* After fork() the child must neither use nor release what it inherited:
 * the descriptors share the parent's open file descriptions, so an OFD
 * lock taken through one is the parent's lock (a child could even "win"
 * byte 0 exclusively and re-initialize the parent's table), and unlocking
 * would drop the parent's.  Mark everything inherited: unmapped, never
 * reused, closed once that is safe and the inherited handles (refs) are
 * closed; they still point at the entry. */
static void reg_check_fork(void)
{
    pid_t me = getpid();
    lk_file *f;
    if (g_reg_pid == me)
        return;
    if (g_reg_pid != 0) {
        for (f = g_files; f; f = f->next) {
            if (f->inherited)
                continue;
            f->inherited = 1;
            if (f->t)
                munmap((void *)f->t, f->mapsize);
            f->t = NULL;
        }
    }
    g_reg_pid = me;
}

/* Take the registry (the caller unlocks g_reg), settle what fork() and
 * parked descriptors left, and find the registered file at path. */
static lk_file *reg_enter(const char *path)
{
    struct stat st;
    pthread_mutex_lock(&g_reg);
    reg_check_fork();
    sweep_parked();
    return stat(path, &st) == 0 ? reg_find(&st) : NULL;
}

/* The last handle on f went away (or attaching failed): unmap, release the
 * OFD byte-0 lock, park; then close whatever is safe to close. */
static void release_file(lk_file *f)
{
    if (f->t) {
        munmap((void *)f->t, f->mapsize);
        f->t = NULL;
    }
    (void)lk_fcntl(f->fd, F_OFD_SETLK, F_UNLCK, 0);
    sweep_parked();
}

/* mdb_env_setup_locks + mdb_env_share_locks, on a registered, parked f. */
static int attach(lk_file *f, unsigned max_readers, lio_txnid_fn newest,
                  void *ctx, lio_error *err)
{
    int excl = 0, rc;
    struct stat st;
    off_t size, rsize;
    unsigned maxr = max_readers ? max_readers : LIO_DEFAULT_READERS;
    void *m = NULL;
    lk_table *t;

    if (maxr > (1u << 24))
        return set_err(err, LIO_EINVAL, EINVAL,
                       "lock file %s: max_readers %u is too large", f->path,
                       maxr);
    /* Alone?  Then (re)initialize; else share. */
    rc = lk_fcntl(f->fd, F_OFD_SETLK, F_WRLCK, 0);
    if (rc == 0) {
        excl = 1;
    } else if (rc == EAGAIN || rc == EACCES) {
        rc = lk_fcntl(f->fd, F_OFD_SETLKW, F_RDLCK, 0);
        if (rc)
            return sys_err(err, rc, f->path, "shared lock on byte 0");
    } else {
        return sys_err(err, rc, f->path,
                       rc == EINVAL ? "lock on byte 0 (kernel without "
                                      "open file description locks?)"
                                    : "lock on byte 0");
    }

    if (fstat(f->fd, &st) != 0) {
        rc = sys_err(err, errno, f->path, "fstat");
        goto fail_unlock;
    }
    size = st.st_size;
    rsize = (off_t)(maxr - 1) * (off_t)sizeof(lk_slot) +
            (off_t)sizeof(lk_table);
    if (size < rsize && excl) {
        if (ftruncate(f->fd, rsize) != 0) {
            rc = sys_err(err, errno, f->path, "ftruncate");
            goto fail_unlock;
        }
    } else {
        rsize = size;
        if (size < (off_t)sizeof(lk_table)) {
            rc = set_err(err, LIO_INVALID, 0,
                         "lock file %s: %lld bytes, too short for an LMDB "
                         "lock file (at least %u)",
                         f->path, (long long)size, (unsigned)sizeof(lk_table));
            goto fail_unlock;
        }
        maxr = (unsigned)((size - (off_t)sizeof(lk_table)) /
                          (off_t)sizeof(lk_slot)) + 1;
    }
    m = mmap(NULL, (size_t)rsize, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd,
             0);
    if (m == MAP_FAILED) {
        rc = sys_err(err, errno, f->path, "mmap");
        goto fail_unlock;
    }
    t = m;
    f->t = t;
    f->mapsize = (size_t)rsize;
    f->maxreaders = maxr;

    if (excl) {
        uint64_t newest_id = 0;
        pthread_mutexattr_t a;
        if (!newest) {
            rc = set_err(err, LIO_EINVAL, EINVAL,
                         "lock file %s: no way to read the newest txnid",
                         f->path);
            goto fail_unmap;
        }
        rc = newest(ctx, &newest_id, err);
        if (rc)
            goto fail_unmap;
        memset(&t->u1.h.rmutex, 0, sizeof(t->u1.h.rmutex));
        memset(&t->u2.wmutex, 0, sizeof(t->u2.wmutex));
        rc = pthread_mutexattr_init(&a);
        if (rc) {
            rc = sys_err(err, rc, f->path, "pthread_mutexattr_init");
            goto fail_unmap;
        }
        rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        if (!rc)
            rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        if (!rc)
            rc = pthread_mutex_init(&t->u1.h.rmutex, &a);
        if (!rc)
            rc = pthread_mutex_init(&t->u2.wmutex, &a);
        pthread_mutexattr_destroy(&a);
        if (rc) {
            rc = sys_err(err, rc, f->path, "initializing the mutexes");
            goto fail_unmap;
        }
        t->u1.h.magic = LIO_LOCK_MAGIC;
        t->u1.h.format = LIO_LOCK_FORMAT;
        ST(&t->u1.h.numreaders, 0u);
        ST(&t->u1.h.txnid, (lk_txnid)newest_id);
        /* Downgrade: the shared lock replaces the exclusive one. */
        rc = lk_fcntl(f->fd, F_OFD_SETLK, F_RDLCK, 0);
        if (rc) {
            rc = sys_err(err, rc, f->path, "downgrading the byte-0 lock");
            goto fail_unmap;
        }
    } else {
        uint32_t magic = t->u1.h.magic, format = t->u1.h.format;
        if (magic != LIO_LOCK_MAGIC) {
            rc = set_err(err, LIO_INVALID, 0,
                         "lock file %s: not an LMDB lock file (magic "
                         "0x%08x, expected 0x%08x)",
                         f->path, (unsigned)magic, LIO_LOCK_MAGIC);
            goto fail_unmap;
        }
        if (format != LIO_LOCK_FORMAT) {
            rc = set_err(err, LIO_VERSION_MISMATCH, 0,
                         "lock file %s: lock format 0x%08x, expected "
                         "0x%08x (LMDB 0.9.x with POSIX robust mutexes); "
                         "another LMDB build is using it",
                         f->path, (unsigned)format, LIO_LOCK_FORMAT);
            goto fail_unmap;
        }
    }
    f->pid = getpid();
    return 0;

fail_unmap:
    munmap(m, (size_t)rsize);
    f->t = NULL;
fail_unlock:
    (void)lk_fcntl(f->fd, F_OFD_SETLK, F_UNLCK, 0);
    return rc;
}

/* ---- public API ---------------------------------------------------------- */

size_t lio_lock_path(char *buf, size_t cap, const char *env_path, int subdir)
{
    int n = snprintf(buf, cap, subdir ? "%s/lock.mdb" : "%s-lock",
                     env_path ? env_path : "");
    return n < 0 ? 0 : (size_t)n;
}

int lio_lock_open(lio_lock **out, const char *lock_path, unsigned mode,
                  unsigned max_readers, lio_txnid_fn newest_txnid, void *ctx,
                  lio_error *err)
{
    lio_lock *lk;
    lk_file *f = NULL;
    struct stat st;
    int rc;

    if (!out || !lock_path)
        return set_err(err, LIO_EINVAL, EINVAL, "lio_lock_open: bad argument");
    *out = NULL;
    lk = calloc(1, sizeof(*lk));
    if (!lk)
        return set_err(err, LIO_ENOMEM, ENOMEM,
                       "lock file %s: out of memory", lock_path);
    if (pthread_mutex_init(&lk->mu, NULL) != 0) {
        free(lk);
        return set_err(err, LIO_ENOMEM, ENOMEM,
                       "lock file %s: cannot create a mutex", lock_path);
    }

    f = reg_enter(lock_path);
    if (!f) {
        lk_file *g;
        int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, (mode_t)mode);
        if (fd < 0) {
            int e = errno;
            if (e == EROFS) { /* read-only env on a read-only filesystem */
                rc = LIO_SUCCESS;
                if (err) {
                    set_err(err, 0, EROFS, "lock file %s: %s: reading "
                            "without a lock", lock_path, strerror(EROFS));
                }
            } else {
                rc = sys_err(err, e, lock_path, "cannot open");
            }
            goto fail;
        }
        if (fstat(fd, &st) != 0) {
            rc = sys_err(err, errno, lock_path, "fstat");
            close(fd); /* not registered: no lock of ours on it */
            goto fail;
        }
        g = reg_find(&st);
        if (g) {
            /* The path was replaced under us by a file we already hold.
             * Closing this descriptor would drop our locks on it: keep it
             * open (rare; one descriptor). */
            f = g;
        } else {
            f = reg_add(fd, &st, lock_path, 0);
            if (!f) {
                close(fd);
                rc = set_err(err, LIO_ENOMEM, ENOMEM,
                             "lock file %s: out of memory", lock_path);
                goto fail;
            }
        }
    }
    if (f->refs == 0) {
        rc = attach(f, max_readers, newest_txnid, ctx, err);
        if (rc) {
            release_file(f);
            goto fail;
        }
    }
    f->refs++;
    lk->f = f;
    pthread_mutex_unlock(&g_reg);
    *out = lk;
    return LIO_SUCCESS;

fail:
    pthread_mutex_unlock(&g_reg);
    pthread_mutex_destroy(&lk->mu);
    free(lk);
    return rc;
}

/* Release slot s if it is still ours (someone may have cleared it and
 * another reader taken it; then it is not ours to touch). */
static void drop_slot(lk_file *f, unsigned idx, int keep)
{
    lk_slot *s;
    pid_t me = f->pid;
    if (!f->t || me != getpid()) /* a handle inherited across fork() */
        return;
    s = &f->t->slots[idx];
    if (LD(&s->b.pid) != me)
        return;
    ST(&s->b.txnid, LK_IDLE);
    if (!keep)
        (void)__atomic_compare_exchange_n(&s->b.pid, &me, (pid_t)0, 0,
                                          __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

void lio_lock_close(lio_lock *lk)
{
    lk_file *f;
    lio_reader *r, *next;
    if (!lk)
        return;
    f = lk->f;
    pthread_mutex_lock(&lk->mu);
    for (r = lk->live; r; r = next) {
        next = r->next;
        drop_slot(f, r->idx, 0);
        free(r);
    }
    lk->live = NULL;
    pthread_mutex_unlock(&lk->mu);
    pthread_mutex_destroy(&lk->mu);

    pthread_mutex_lock(&g_reg);
    reg_check_fork();
    if (--f->refs == 0) {
        if (f->inherited)
            sweep_parked();
        else
            release_file(f);
    }
    pthread_mutex_unlock(&g_reg);
    free(lk);
}

static int forked_err(const lk_file *f, lio_error *err)
{
    return set_err(err, LIO_EINVAL, EINVAL,
                   "lock file %s: lock handle inherited across fork(); "
                   "open the environment again in this process", f->path);
}

/* mdb_reader_pid(Pidset).  Process-owned, shared with any liblmdb env of
 * this process; re-asserted each time because a liblmdb close() drops it. */
static int assert_pid_lock(lk_file *f, lio_error *err)
{
    int rc = lk_fcntl(f->fd, F_SETLK, F_WRLCK, (off_t)f->pid);
    if (rc)
        return set_err(err, LIO_SYSERR, rc,
                       "lock file %s: cannot lock byte %ld (this process's "
                       "reader liveness lock): %s",
                       f->path, (long)f->pid, strerror(rc));
    return 0;
}

/* Claim a free slot under rmutex (mdb_txn_renew0). */
static int claim_slot(lk_file *f, unsigned *idx, lio_error *err)
{
    lk_table *t = f->t;
    unsigned nr, i;
    lk_slot *s;
    int rc = rmutex_lock(f, NULL, err);
    if (rc)
        return rc;
    nr = used_slots(f);
    for (i = 0; i < nr; i++)
        if (LD(&t->slots[i].b.pid) == 0)
            break;
    if (i == f->maxreaders) {
        pthread_mutex_unlock(&t->u1.h.rmutex);
        return set_err(err, LIO_READERS_FULL, 0,
                       "lock file %s: reader table full (%u slots; "
                       "MDB_READERS_FULL)",
                       f->path, f->maxreaders);
    }
    s = &t->slots[i];
    /* Reset, publish in numreaders, then claim (the order liblmdb uses,
     * since other code reads the table without the mutex). */
    ST(&s->b.pid, (pid_t)0);
    ST(&s->b.txnid, LK_IDLE);
    s->b.tid = pthread_self();
    if (i == nr)
        ST(&t->u1.h.numreaders, nr + 1);
    ST(&s->b.pid, f->pid);
    pthread_mutex_unlock(&t->u1.h.rmutex);
    *idx = i;
    return 0;
}

/* Publish mti_txnid in the slot until it is stable (ITS#7970). */
static uint64_t publish(lk_file *f, unsigned idx)
{
    lk_slot *s = &f->t->slots[idx];
    lk_txnid v;
    do {
        v = LD(&f->t->u1.h.txnid);
        ST(&s->b.txnid, v);
    } while (v != LD(&f->t->u1.h.txnid));
    return (uint64_t)v;
}

int lio_lock_reader_begin(lio_lock *lk, lio_reader **slot, uint64_t *txnid,
                          lio_error *err)
{
    lk_file *f;
    lio_reader *r;
    int rc, fresh = 0;
    unsigned idx;

    if (!lk || !slot || !txnid)
        return set_err(err, LIO_EINVAL, EINVAL,
                       "lio_lock_reader_begin: bad argument");
    f = lk->f;
    if (!f->t || f->pid != getpid())
        return forked_err(f, err);
    r = *slot;
    if (r) {
        lk_slot *s = &f->t->slots[r->idx];
        if (LD(&s->b.pid) == f->pid) {
            if (LD(&s->b.txnid) != LK_IDLE)
                return set_err(err, LIO_BAD_RSLOT, 0,
                               "lock file %s: reader slot %u is in use "
                               "(MDB_BAD_RSLOT)", f->path, r->idx);
            rc = assert_pid_lock(f, err);
            if (rc)
                return rc;
            *txnid = publish(f, r->idx);
            return 0;
        }
        /* Cleared by someone else: take a new one below. */
    } else {
        r = calloc(1, sizeof(*r));
        if (!r)
            return set_err(err, LIO_ENOMEM, ENOMEM,
                           "lock file %s: out of memory", f->path);
        fresh = 1;
    }
    rc = assert_pid_lock(f, err);
    if (!rc)
        rc = claim_slot(f, &idx, err);
    if (rc) {
        if (fresh)
            free(r);
        return rc;
    }
    r->idx = idx;
    if (fresh) {
        pthread_mutex_lock(&lk->mu);
        r->prev = NULL;
        r->next = lk->live;
        if (lk->live)
            lk->live->prev = r;
        lk->live = r;
        pthread_mutex_unlock(&lk->mu);
    }
    *txnid = publish(f, idx);
    *slot = r;
    return 0;
}

int lio_lock_reader_refresh(lio_lock *lk, lio_reader *slot, uint64_t *txnid,
                            lio_error *err)
{
    lk_file *f;
    int rc;
    if (!lk || !slot || !txnid)
        return set_err(err, LIO_EINVAL, EINVAL,
                       "lio_lock_reader_refresh: bad argument");
    f = lk->f;
    if (!f->t || f->pid != getpid())
        return forked_err(f, err);
    rc = assert_pid_lock(f, err);
    if (rc)
        return rc;
    if (LD(&f->t->slots[slot->idx].b.pid) != f->pid) {
        unsigned idx;
        rc = claim_slot(f, &idx, err);
        if (rc)
            return rc;
        slot->idx = idx;
    }
    *txnid = publish(f, slot->idx);
    return 0;
}

void lio_lock_reader_reset(lio_lock *lk, lio_reader *slot)
{
    if (lk && slot)
        drop_slot(lk->f, slot->idx, 1);
}

void lio_lock_reader_end(lio_lock *lk, lio_reader *slot)
{
    if (!lk || !slot)
        return;
    drop_slot(lk->f, slot->idx, 0);
    pthread_mutex_lock(&lk->mu);
    if (slot->prev)
        slot->prev->next = slot->next;
    else
        lk->live = slot->next;
    if (slot->next)
        slot->next->prev = slot->prev;
    pthread_mutex_unlock(&lk->mu);
    free(slot);
}

unsigned lio_lock_reader_index(const lio_reader *slot)
{
    return slot ? slot->idx : 0;
}

unsigned lio_lock_max_readers(const lio_lock *lk)
{
    return lk ? lk->f->maxreaders : 0;
}

unsigned lio_lock_num_readers(const lio_lock *lk)
{
    return lk && lk->f->t ? LD(&lk->f->t->u1.h.numreaders) : 0;
}

uint64_t lio_lock_txnid(const lio_lock *lk)
{
    return lk && lk->f->t ? (uint64_t)LD(&lk->f->t->u1.h.txnid) : 0;
}

int lio_lock_reader_check(lio_lock *lk, int *dead, lio_error *err)
{
    if (dead)
        *dead = 0;
    if (!lk)
        return 0;
    if (!lk->f->t || lk->f->pid != getpid())
        return forked_err(lk->f, err);
    return check_stale(lk->f, 0, dead, err);
}

/* Append s to buf (bounded), counting the full length in *len. */
static void put(char *buf, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (*len < cap) {
        size_t room = cap - *len - 1; /* keep a byte for the NUL */
        memcpy(buf + *len, s, n < room ? n : room);
    }
    *len += n;
}

/* One line of mdb_reader_list (after its heading, for the first one). */
static void put_reader(char *buf, size_t cap, size_t *len, int *first,
                       pid_t pid, size_t tid, size_t txnid)
{
    char line[80];
    if (txnid == LK_IDLE)
        snprintf(line, sizeof(line), "%10d %zx -\n", (int)pid, tid);
    else
        snprintf(line, sizeof(line), "%10d %zx %zu\n", (int)pid, tid, txnid);
    if (*first) {
        put(buf, cap, len, "    pid     thread     txnid\n");
        *first = 0;
    }
    put(buf, cap, len, line);
}

static size_t end_list(char *buf, size_t cap, size_t len, int first)
{
    if (first)
        put(buf, cap, &len, "(no active readers)\n");
    if (cap)
        buf[len < cap ? len : cap - 1] = '\0';
    return len;
}

size_t lio_lock_reader_list(const lio_lock *lk, char *buf, size_t cap)
{
    size_t len = 0;
    int first = 1;
    if (!buf)
        cap = 0;
    if (!lk || !lk->f->t) {
        put(buf, cap, &len, "(no reader locks)\n");
        if (cap)
            buf[len < cap ? len : cap - 1] = '\0';
        return len;
    }
    {
        const lk_file *f = lk->f;
        unsigned n = used_slots(f), i;
        for (i = 0; i < n; i++) {
            const lk_slot *s = &f->t->slots[i];
            pid_t pid = LD(&s->b.pid);
            if (pid)
                put_reader(buf, cap, &len, &first, pid, (size_t)s->b.tid,
                           (size_t)LD(&s->b.txnid));
        }
    }
    return end_list(buf, cap, len, first);
}

/* ---- inspection (probe only) --------------------------------------------- */

/* Does a process other than this one (or an open file description other
 * than this process's own) hold a lock on byte 0?  An error counts as no. */
static int byte0_held(int fd)
{
    struct flock fl;
    for (;;) {
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = 0;
        fl.l_len = 1;
        if (fcntl(fd, F_GETLK, &fl) == 0)
            return fl.l_type != F_UNLCK;
        if (errno != EINTR)
            return 0;
    }
}

/* pread all of len bytes at off: 0, 1 (the file ends first) or an errno. */
static int pread_all(int fd, void *buf, size_t len, off_t off)
{
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (n == 0)
            return -1;
        p += n;
        len -= (size_t)n;
        off += n;
    }
    return 0;
}

static int cmp_pid(const void *a, const void *b)
{
    pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
    return (x > y) - (x < y);
}

/* The table as lio_lock_inspect reports it, read from fd. */
static int inspect_fd(int fd, const char *path, lio_lock_info *info,
                      lio_error *err)
{
    struct stat st;
    off_t size, rsize;
    lk_head h;
    pid_t me = getpid(), *dead = NULL;
    size_t ndead = 0, i, n;
    unsigned count;
    int rc;

    if (fstat(fd, &st) != 0)
        return sys_err(err, errno, path, "fstat");
    size = st.st_size;
    info->live = byte0_held(fd);
    rsize = (off_t)(LIO_DEFAULT_READERS - 1) * (off_t)sizeof(lk_slot) +
            (off_t)sizeof(lk_table);
    if (info->live || size >= rsize) {
        off_t maxr;
        if (size < (off_t)sizeof(lk_table))
            return set_err(err, LIO_INVALID, 0,
                           "lock file %s: %lld bytes, too short for an LMDB "
                           "lock file (at least %u)", path, (long long)size,
                           (unsigned)sizeof(lk_table));
        maxr = (size - (off_t)sizeof(lk_table)) / (off_t)sizeof(lk_slot) + 1;
        info->max_readers = maxr > (off_t)UINT32_MAX ? UINT32_MAX
                                                     : (unsigned)maxr;
    }
    if (!info->live)
        return LIO_SUCCESS; /* an opener would re-initialize the table */

    rc = pread_all(fd, &h, sizeof(h), 0);
    if (rc > 0)
        return sys_err(err, rc, path, "read");
    if (rc < 0 || h.magic != LIO_LOCK_MAGIC)
        return set_err(err, LIO_INVALID, 0,
                       "lock file %s: not an LMDB lock file (magic 0x%08x, "
                       "expected 0x%08x)", path,
                       rc < 0 ? 0u : (unsigned)h.magic, LIO_LOCK_MAGIC);
    if (h.format != LIO_LOCK_FORMAT)
        return set_err(err, LIO_VERSION_MISMATCH, 0,
                       "lock file %s: lock format 0x%08x, expected 0x%08x "
                       "(LMDB 0.9.x with POSIX robust mutexes)", path,
                       (unsigned)h.format, LIO_LOCK_FORMAT);
    info->num_readers = h.numreaders;
    count = h.numreaders < info->max_readers ? h.numreaders
                                             : info->max_readers;
    if (!count)
        return LIO_SUCCESS;
    info->slots = malloc((size_t)count * sizeof(*info->slots));
    dead = malloc((size_t)count * sizeof(*dead));
    if (!info->slots || !dead) {
        free(dead);
        return set_err(err, LIO_ENOMEM, ENOMEM,
                       "lock file %s: out of memory", path);
    }
    /* The slots, a chunk at a time (stops where the file ends). */
    for (n = 0; n < count;) {
        lk_slot chunk[256];
        size_t want = count - n < 256 ? count - n : 256, got;
        ssize_t r = pread(fd, chunk, want * sizeof(lk_slot),
                          (off_t)offsetof(lk_table, slots) +
                              (off_t)(n * sizeof(lk_slot)));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = sys_err(err, errno, path, "read");
            free(dead);
            return rc;
        }
        got = (size_t)r / sizeof(lk_slot);
        for (i = 0; i < got; i++) {
            lio_lock_slot_info *o = &info->slots[n + i];
            o->txnid = (uint64_t)chunk[i].b.txnid;
            o->pid = (int32_t)chunk[i].b.pid;
            o->tid = (uint64_t)chunk[i].b.tid;
            o->stale = 0;
        }
        n += got;
        if (got < want)
            break;
    }
    info->nslots = (unsigned)n;
    /* Each other process once (sorted, distinct), probed as
     * mdb_reader_check does. */
    for (i = 0; i < n; i++)
        if (info->slots[i].pid && info->slots[i].pid != me)
            dead[ndead++] = info->slots[i].pid;
    qsort(dead, ndead, sizeof(*dead), cmp_pid);
    {
        size_t k = 0;
        for (i = 0; i < ndead; i++) {
            pid_t pid = dead[i];
            if (i && pid == dead[i - 1])
                continue; /* dead[i - 1] is still the input: k < i */
            if (!pid_alive(fd, pid))
                dead[k++] = pid;
        }
        ndead = k;
    }
    for (i = 0; i < n; i++) {
        pid_t pid = info->slots[i].pid;
        if (pid && pid != me &&
            bsearch(&pid, dead, ndead, sizeof(*dead), cmp_pid))
            info->slots[i].stale = 1;
    }
    free(dead);
    return LIO_SUCCESS;
}

int lio_lock_inspect(const char *lock_path, lio_lock_info *info,
                     lio_error *err)
{
    struct stat st;
    lk_file *f = NULL;
    int fd, rdonly = 0, rc;

    if (!info || !lock_path)
        return set_err(err, LIO_EINVAL, EINVAL,
                       "lio_lock_inspect: bad argument");
    memset(info, 0, sizeof(*info));
    info->max_readers = LIO_DEFAULT_READERS;
    f = reg_enter(lock_path);
    if (!f) {
        /* O_RDWR when allowed, so that lio_lock_open can reuse the
         * descriptor while it stays parked. */
        fd = open(lock_path, O_RDWR | O_CLOEXEC);
        if (fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
            fd = open(lock_path, O_RDONLY | O_CLOEXEC);
            rdonly = 1;
        }
        if (fd < 0) {
            /* liblmdb would create it (as an idle one) or, on a
             * read-only filesystem, run without locks */
            pthread_mutex_unlock(&g_reg);
            return LIO_SUCCESS;
        }
        /* Closing fd would drop this process's locks on the file (a
         * liblmdb environment open here): register it, parked, and let
         * sweep_parked close it once that is safe. */
        if (fstat(fd, &st) == 0 && !reg_find(&st)) {
            if (!reg_add(fd, &st, lock_path, rdonly)) {
                close(fd);
                pthread_mutex_unlock(&g_reg);
                return set_err(err, LIO_ENOMEM, ENOMEM,
                               "lock file %s: out of memory", lock_path);
            }
        }
        /* else: fstat failed, or the path was just replaced by a file this
         * process holds: keep fd open (rare; one descriptor), as
         * lio_lock_open does. */
    } else {
        fd = f->fd;
    }
    info->exists = 1;
    rc = inspect_fd(fd, lock_path, info, err);
    if (rc) {
        free(info->slots);
        info->slots = NULL;
        info->nslots = 0;
    }
    sweep_parked();
    pthread_mutex_unlock(&g_reg);
    return rc;
}

void lio_lock_info_free(lio_lock_info *info)
{
    if (info) {
        free(info->slots);
        info->slots = NULL;
        info->nslots = 0;
    }
}

size_t lio_lock_info_list(const lio_lock_info *info, int skip_stale,
                          char *buf, size_t cap)
{
    size_t len = 0;
    int first = 1;
    unsigned i;
    if (!buf)
        cap = 0;
    for (i = 0; info && i < info->nslots; i++) {
        const lio_lock_slot_info *s = &info->slots[i];
        if (s->pid && !(skip_stale && s->stale))
            put_reader(buf, cap, &len, &first, (pid_t)s->pid,
                       (size_t)s->tid, (size_t)s->txnid);
    }
    return end_list(buf, cap, len, first);
}
