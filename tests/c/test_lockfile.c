/* Tests of csrc/lockfile.c against the real liblmdb (-llmdb).
 *
 * Every test runs in its own forked process, because fcntl locks and
 * lockfile.c's descriptor registry are per process.  Processes that play
 * "another program" (a liblmdb writer, a lock prober, a reader that dies)
 * are forked from the test process.
 *
 *   make -C tests/c test        (or: tests/c/test_lockfile [name ...])
 */
#define _GNU_SOURCE 1

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lockfile.h"

/* ---- tiny framework ----------------------------------------------------- */

static char g_base[128];
static const char *g_test = "?";

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "  %s: CHECK failed at %s:%d: %s\n", g_test,   \
                    __FILE__, __LINE__, #cond);                            \
            _exit(1);                                                      \
        }                                                                  \
    } while (0)
#define CHECK_RC(expr, want)                                               \
    do {                                                                   \
        int rc_ = (expr);                                                  \
        if (rc_ != (want)) {                                               \
            fprintf(stderr, "  %s: %s returned %d (%s), expected %d at "   \
                    "%s:%d\n", g_test, #expr, rc_,                         \
                    rc_ > 0 || rc_ < -30000 ? mdb_strerror(rc_) : "",      \
                    (want), __FILE__, __LINE__);                           \
            _exit(1);                                                      \
        }                                                                  \
    } while (0)
#define CHECK_LIO(expr, e)                                                 \
    do {                                                                   \
        int rc_ = (expr);                                                  \
        if (rc_ != 0) {                                                    \
            fprintf(stderr, "  %s: %s returned %d: %s at %s:%d\n", g_test, \
                    #expr, rc_, (e).msg, __FILE__, __LINE__);              \
            _exit(1);                                                      \
        }                                                                  \
    } while (0)

static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "    ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static int wait_child(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

/* Run fn(arg) in a child process; return its exit status. */
static int in_child(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(arg));
    return wait_child(pid);
}

static void mkpath(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_base, name);
}

/* ---- LMDB helpers -------------------------------------------------------- */

#define VAL_SMALL 100
#define VAL_BIG 5000

static void fill_val(char *v, size_t n, unsigned key, unsigned gen)
{
    size_t i;
    for (i = 0; i < n; i++)
        v[i] = (char)('a' + (key * 7 + gen * 13 + i) % 26);
}

/* One write txn putting nkeys keys (every 100th one big) with generation
 * gen's values. */
static void put_all(MDB_env *env, unsigned nkeys, unsigned gen)
{
    MDB_txn *txn;
    MDB_dbi dbi;
    static char v[VAL_BIG];
    unsigned k;
    CHECK_RC(mdb_txn_begin(env, NULL, 0, &txn), 0);
    CHECK_RC(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    for (k = 0; k < nkeys; k++) {
        char kb[16];
        MDB_val key, data;
        size_t n = (k % 100 == 0) ? VAL_BIG : VAL_SMALL;
        snprintf(kb, sizeof(kb), "key%06u", k);
        fill_val(v, n, k, gen);
        key.mv_size = strlen(kb);
        key.mv_data = kb;
        data.mv_size = n;
        data.mv_data = v;
        CHECK_RC(mdb_put(txn, dbi, &key, &data, 0), 0);
    }
    CHECK_RC(mdb_txn_commit(txn), 0);
}

static MDB_env *env_open(const char *path, unsigned flags)
{
    MDB_env *env;
    CHECK_RC(mdb_env_create(&env), 0);
    CHECK_RC(mdb_env_set_mapsize(env, 64u << 20), 0);
    CHECK_RC(mdb_env_open(env, path, flags, 0644), 0);
    return env;
}

/* Create a fresh environment with `commits` commits of nkeys keys. */
static void make_env(const char *path, unsigned nkeys, unsigned commits,
                     int subdir)
{
    MDB_env *env;
    unsigned i;
    if (subdir)
        mkdir(path, 0755);
    env = env_open(path, subdir ? 0 : MDB_NOSUBDIR);
    for (i = 0; i < commits; i++)
        put_all(env, nkeys, i);
    mdb_env_close(env);
}

static void data_path(char *buf, size_t cap, const char *env, int subdir)
{
    snprintf(buf, cap, subdir ? "%s/data.mdb" : "%s", env);
}

static void lock_path(char *buf, size_t cap, const char *env, int subdir)
{
    size_t n = lio_lock_path(buf, cap, env, subdir);
    CHECK(n < cap);
}

/* The lio_txnid_fn: newest txnid from the data file's two meta pages. */
static int newest_cb(void *ctx, uint64_t *txnid, lio_error *err)
{
    const char *p = ctx;
    unsigned char m[160];
    uint32_t magic, psize;
    uint64_t t0, t1;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    (void)err;
    if (fd < 0)
        return LIO_SYSERR;
    if (pread(fd, m, sizeof(m), 0) != (ssize_t)sizeof(m))
        goto bad;
    memcpy(&magic, m + 16, 4);
    memcpy(&psize, m + 40, 4);
    memcpy(&t0, m + 144, 8);
    if (magic != 0xBEEFC0DEu || psize < 512 || psize > 65536)
        goto bad;
    if (pread(fd, m, sizeof(m), psize) != (ssize_t)sizeof(m))
        goto bad;
    memcpy(&t1, m + 144, 8);
    close(fd);
    *txnid = t0 > t1 ? t0 : t1;
    return 0;
bad:
    close(fd);
    return LIO_INVALID;
}

/* mdb_reader_list into a buffer. */
struct strbuf { char s[8192]; size_t n; };
static int sb_cb(const char *msg, void *ctx)
{
    struct strbuf *b = ctx;
    size_t n = strlen(msg);
    if (b->n + n < sizeof(b->s)) {
        memcpy(b->s + b->n, msg, n + 1);
        b->n += n;
    }
    return 0;
}
static void mdb_list(MDB_env *env, struct strbuf *b)
{
    b->n = 0;
    b->s[0] = 0;
    mdb_reader_list(env, sb_cb, b);
}

/* Does text (a reader list) have a line for pid with txnid (or "-" when
 * txnid == UINT64_MAX)? */
static int list_has(const char *text, long pid, uint64_t txnid)
{
    const char *p = text;
    while (p && *p) {
        long lp;
        char tid[32], tx[32];
        if (sscanf(p, "%ld %31s %31s", &lp, tid, tx) == 3 && lp == pid) {
            if (txnid == UINT64_MAX ? strcmp(tx, "-") == 0
                                    : strtoull(tx, NULL, 10) == txnid)
                return 1;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return 0;
}

/* Another process's view of the locks on lock file `lp`:
 * what = 0: can it take byte 0 exclusively (1 = yes)?
 * what = 1: does it see a lock on byte `pid` (1 = yes, alive)? */
static int probe(const char *lp, int what, pid_t pid)
{
    pid_t c = fork();
    if (c == 0) {
        struct flock fl;
        int fd = open(lp, O_RDWR);
        if (fd < 0)
            _exit(99);
        memset(&fl, 0, sizeof(fl));
        fl.l_whence = SEEK_SET;
        fl.l_len = 1;
        if (what == 0) {
            fl.l_type = F_WRLCK;
            fl.l_start = 0;
            _exit(fcntl(fd, F_SETLK, &fl) == 0 ? 1 : 0);
        }
        fl.l_type = F_WRLCK;
        fl.l_start = pid;
        if (fcntl(fd, F_GETLK, &fl) != 0)
            _exit(98);
        _exit(fl.l_type != F_UNLCK ? 1 : 0);
    }
    return wait_child(c);
}

/* ---- a minimal B-tree walker to fingerprint a snapshot's pages ---------- */

struct pageset {
    int fd;
    unsigned psize;
    uint64_t last_pg;
    uint64_t *pg;
    unsigned char **bytes;
    size_t n, cap;
    unsigned char *seen;
};

static void ps_add(struct pageset *ps, uint64_t pgno, unsigned npages)
{
    size_t sz = (size_t)npages * ps->psize;
    CHECK(pgno + npages - 1 <= ps->last_pg);
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? 2 * ps->cap : 256;
        ps->pg = realloc(ps->pg, ps->cap * sizeof(*ps->pg));
        ps->bytes = realloc(ps->bytes, ps->cap * sizeof(*ps->bytes));
        CHECK(ps->pg && ps->bytes);
    }
    ps->pg[ps->n] = pgno | ((uint64_t)npages << 48);
    ps->bytes[ps->n] = malloc(sz);
    CHECK(ps->bytes[ps->n]);
    CHECK(pread(ps->fd, ps->bytes[ps->n], sz, (off_t)(pgno * ps->psize)) ==
          (ssize_t)sz);
    ps->n++;
}

static void walk(struct pageset *ps, uint64_t pgno, int depth)
{
    unsigned char *p = malloc(ps->psize);
    uint16_t flags, lower, i, nkeys;
    CHECK(p && depth < 32 && pgno >= 2 && pgno <= ps->last_pg);
    CHECK(!ps->seen[pgno]);
    ps->seen[pgno] = 1;
    CHECK(pread(ps->fd, p, ps->psize, (off_t)(pgno * ps->psize)) ==
          (ssize_t)ps->psize);
    ps_add(ps, pgno, 1);
    memcpy(&flags, p + 10, 2);
    memcpy(&lower, p + 12, 2);
    nkeys = (uint16_t)((lower - 16) >> 1);
    for (i = 0; i < nkeys; i++) {
        uint16_t off, lo, hi, nf, ks;
        unsigned char *node;
        memcpy(&off, p + 16 + 2 * i, 2);
        CHECK(off + 8u <= ps->psize);
        node = p + off;
        memcpy(&lo, node, 2);
        memcpy(&hi, node + 2, 2);
        memcpy(&nf, node + 4, 2);
        memcpy(&ks, node + 6, 2);
        if (flags & 0x01) { /* branch */
            walk(ps, lo | ((uint64_t)hi << 16) | ((uint64_t)nf << 32),
                 depth + 1);
        } else if (nf & 0x01) { /* leaf node with F_BIGDATA */
            uint64_t ov;
            uint32_t npages;
            unsigned char hdr[16];
            memcpy(&ov, node + 8 + ks, 8);
            CHECK(pread(ps->fd, hdr, 16, (off_t)(ov * ps->psize)) == 16);
            memcpy(&npages, hdr + 12, 4);
            ps_add(ps, ov, npages);
        }
    }
    free(p);
}

/* All pages of the snapshot in meta page (txnid & 1), which must carry
 * txnid. */
static void snapshot_pages(struct pageset *ps, const char *dpath,
                           uint64_t txnid)
{
    unsigned char m[160];
    uint64_t mt, free_root, main_root;
    memset(ps, 0, sizeof(*ps));
    ps->fd = open(dpath, O_RDONLY);
    CHECK(ps->fd >= 0);
    CHECK(pread(ps->fd, m, sizeof(m), 0) == (ssize_t)sizeof(m));
    memcpy(&ps->psize, m + 40, 4);
    CHECK(pread(ps->fd, m, sizeof(m), (off_t)((txnid & 1) * ps->psize)) ==
          (ssize_t)sizeof(m));
    memcpy(&mt, m + 144, 8);
    CHECK(mt == txnid);
    memcpy(&ps->last_pg, m + 136, 8);
    memcpy(&free_root, m + 80, 8);
    memcpy(&main_root, m + 128, 8);
    ps->seen = calloc(ps->last_pg + 1, 1);
    CHECK(ps->seen);
    if (free_root != UINT64_MAX)
        walk(ps, free_root, 0);
    if (main_root != UINT64_MAX)
        walk(ps, main_root, 0);
}

/* Number of the snapshot's pages whose bytes changed since. */
static size_t pages_changed(const struct pageset *ps)
{
    size_t i, changed = 0;
    for (i = 0; i < ps->n; i++) {
        uint64_t pgno = ps->pg[i] & ((1ull << 48) - 1);
        size_t sz = (size_t)(ps->pg[i] >> 48) * ps->psize;
        unsigned char *now = malloc(sz);
        CHECK(now);
        CHECK(pread(ps->fd, now, sz, (off_t)(pgno * ps->psize)) ==
              (ssize_t)sz);
        if (memcmp(now, ps->bytes[i], sz) != 0)
            changed++;
        free(now);
    }
    return changed;
}

/* ---- liblmdb child programs --------------------------------------------- */

struct writer_job {
    const char *env;
    unsigned nkeys, commits, gen0;
    long reader_pid;        /* expect this reader in the table, 0: none */
    uint64_t reader_txnid;
};

/* A liblmdb writer: check it sees the reader (mdb_reader_list, and
 * mdb_reader_check does not clear it), then commit `commits` times. */
static int writer_main(void *arg)
{
    struct writer_job *j = arg;
    MDB_env *env = env_open(j->env, 0);
    struct strbuf b;
    unsigned i;
    int dead = -1;
    if (j->reader_pid) {
        mdb_list(env, &b);
        if (!list_has(b.s, j->reader_pid, j->reader_txnid)) {
            fprintf(stderr, "  writer: reader %ld/%llu not in:\n%s",
                    j->reader_pid, (unsigned long long)j->reader_txnid, b.s);
            return 2;
        }
        CHECK_RC(mdb_reader_check(env, &dead), 0);
        CHECK(dead == 0);
        mdb_list(env, &b);
        CHECK(list_has(b.s, j->reader_pid, j->reader_txnid));
    }
    for (i = 0; i < j->commits; i++)
        put_all(env, j->nkeys, j->gen0 + i);
    mdb_env_close(env);
    return 0;
}

/* ---- tests ---------------------------------------------------------------- */

/* Our initialization of a lock table is byte-identical to liblmdb's, and
 * liblmdb works with a table we initialized. */
static int t_layout(void *unused)
{
    char env[256], lp[256], dp[256];
    unsigned char ref[128], ours[128];
    MDB_env *e;
    lio_lock *lk;
    lio_error err;
    int fd;
    struct stat st;
    (void)unused;
    mkpath(env, sizeof(env), "layout");
    make_env(env, 50, 3, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);

    /* liblmdb's table right after mdb_env_open (no txn yet). */
    unlink(lp);
    e = env_open(env, MDB_RDONLY);
    fd = open(lp, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, ref, 128, 0) == 128);
    close(fd);
    mdb_env_close(e);

    /* Ours. */
    unlink(lp);
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK(lk != NULL);
    fd = open(lp, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, ours, 128, 0) == 128);
    CHECK(fstat(fd, &st) == 0);
    close(fd);
    CHECK(st.st_size == 8192);
    CHECK((st.st_mode & 0777) == 0644);
    CHECK(lio_lock_max_readers(lk) == 126);
    CHECK(lio_lock_num_readers(lk) == 0);
    CHECK(lio_lock_txnid(lk) == 3);
    {
        uint32_t magic, format;
        memcpy(&magic, ours, 4);
        memcpy(&format, ours + 4, 4);
        CHECK(magic == 0xBEEFC0DEu && format == 0x10001u);
    }
    if (memcmp(ref, ours, 128) != 0) {
        int i;
        for (i = 0; i < 128; i++)
            if (ref[i] != ours[i])
                note("byte %d: liblmdb %02x, lmdbio %02x", i, ref[i],
                     ours[i]);
        CHECK(!"header differs from liblmdb's");
    }
    note("lock header (128 bytes) identical to liblmdb's; format 0x%x",
         LIO_LOCK_FORMAT);
    lio_lock_close(lk);
    return 0;
}

/* (1) A live writer does not reuse the pages of our pinned snapshot; it
 * lists our slot; mdb_reader_check keeps it; without the pin, it reuses. */
static int t_pin(void *unused)
{
    char env[256], lp[256], dp[256], cmd[600];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid, t2;
    struct pageset ps;
    struct writer_job j;
    size_t changed;
    FILE *p;
    char line[256];
    int found = 0;
    (void)unused;
    mkpath(env, sizeof(env), "pin");
    make_env(env, 3000, 2, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);

    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    CHECK(txnid == 2);
    snapshot_pages(&ps, dp, txnid);
    note("snapshot %llu: %zu pages (tree + overflow)",
         (unsigned long long)txnid, ps.n);

    /* mdb_stat -r (a separate liblmdb program) shows our slot. */
    snprintf(cmd, sizeof(cmd), "mdb_stat -r %s", env);
    p = popen(cmd, "r");
    CHECK(p);
    while (fgets(line, sizeof(line), p))
        if (list_has(line, (long)getpid(), txnid))
            found = 1;
    pclose(p); /* mdb_stat -r exits 1 even when it worked */
    CHECK(found);

    j.env = env;
    j.nkeys = 3000;
    j.commits = 30;
    j.gen0 = 100;
    j.reader_pid = getpid();
    j.reader_txnid = txnid;
    CHECK_RC(in_child(writer_main, &j), 0);
    changed = pages_changed(&ps);
    note("pinned: %zu of %zu pages changed after 30 commits", changed, ps.n);
    CHECK(changed == 0);
    CHECK(lio_lock_txnid(lk) == txnid + 30);

    /* refresh republishes the newest txnid */
    CHECK_LIO(lio_lock_reader_refresh(lk, r, &t2, &err), err);
    CHECK(t2 == txnid + 30);

    /* Control: release the pin; now the writer does reuse those pages. */
    lio_lock_reader_end(lk, r);
    r = NULL;
    j.gen0 = 200;
    j.reader_pid = 0;
    CHECK_RC(in_child(writer_main, &j), 0);
    changed = pages_changed(&ps);
    note("control, unpinned: %zu of %zu pages changed", changed, ps.n);
    CHECK(changed > 0);
    lio_lock_close(lk);
    return 0;
}

/* A reader process that takes a slot and dies holding it. */
static int dying_reader(void *arg)
{
    const char **a = arg;
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    CHECK_LIO(lio_lock_open(&lk, a[0], 0644, 0, newest_cb, (void *)a[1],
                            &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    kill(getpid(), SIGKILL);
    return 3;
}

struct check_job { const char *env; long pid; int expect_dead; };

static int checker_main(void *arg)
{
    struct check_job *c = arg;
    MDB_env *env = env_open(c->env, MDB_RDONLY);
    struct strbuf b;
    int dead = -1;
    mdb_list(env, &b);
    CHECK(list_has(b.s, c->pid, UINT64_MAX) || strstr(b.s, "txnid"));
    CHECK_RC(mdb_reader_check(env, &dead), 0);
    if (dead != c->expect_dead) {
        fprintf(stderr, "  reader_check cleared %d, expected %d\n%s", dead,
                c->expect_dead, b.s);
        return 2;
    }
    mdb_list(env, &b);
    {
        char pidtxt[32];
        snprintf(pidtxt, sizeof(pidtxt), " %ld ", c->pid);
        if (c->expect_dead)
            CHECK(strstr(b.s, pidtxt) == NULL);
    }
    mdb_env_close(env);
    return 0;
}

/* (1b) mdb_reader_check keeps a live lmdbio slot, clears a dead one. */
static int t_stale(void *unused)
{
    char env[256], lp[256], dp[256];
    const char *a[2];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    pid_t dpid;
    struct check_job c;
    int dead;
    (void)unused;
    mkpath(env, sizeof(env), "stale");
    make_env(env, 100, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    a[0] = lp;
    a[1] = dp;

    /* Keep the table alive in this process (else each opener reinits). */
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);

    dpid = fork();
    if (dpid == 0)
        _exit(dying_reader(a));
    CHECK(wait_child(dpid) == 128 + SIGKILL);
    {
        char buf[4096];
        lio_lock_reader_list(lk, buf, sizeof(buf));
        CHECK(list_has(buf, dpid, txnid));     /* the dead slot remains */
        CHECK(list_has(buf, getpid(), txnid)); /* and ours */
    }
    CHECK(probe(lp, 1, getpid()) == 1);  /* our pid lock is visible */
    CHECK(probe(lp, 1, dpid) == 0);      /* the dead one's is gone */

    c.env = env;
    c.pid = dpid;
    c.expect_dead = 1;
    CHECK_RC(in_child(checker_main, &c), 0); /* liblmdb clears only it */
    {
        char buf[4096];
        lio_lock_reader_list(lk, buf, sizeof(buf));
        CHECK(!list_has(buf, dpid, txnid));
        CHECK(list_has(buf, getpid(), txnid));
    }
    /* lio's own reader_check: nothing stale left, ours kept */
    CHECK_LIO(lio_lock_reader_check(lk, &dead, &err), err);
    CHECK(dead == 0);
    lio_lock_reader_end(lk, r);
    lio_lock_close(lk);
    return 0;
}

/* (2a) lmdbio first, then liblmdb in the same process. */
static int t_order_lio_first(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    MDB_env *e;
    MDB_txn *txn;
    struct strbuf b;
    char ours[8192];
    (void)unused;
    mkpath(env, sizeof(env), "order1");
    make_env(env, 200, 2, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);

    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    CHECK(txnid == 2);

    e = env_open(env, 0); /* must not re-initialize: our slot survives */
    mdb_list(e, &b);
    CHECK(list_has(b.s, getpid(), 2));
    CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0); /* pid lock */
    CHECK(mdb_txn_id(txn) == 2);
    lio_lock_reader_list(lk, ours, sizeof(ours));
    mdb_list(e, &b);
    CHECK(strcmp(ours, b.s) == 0); /* same text as mdb_reader_list */
    mdb_txn_abort(txn);
    put_all(e, 200, 50); /* a write in this process while we pin */
    CHECK(lio_lock_txnid(lk) == 3);

    /* closing lmdbio keeps liblmdb's locks */
    lio_lock_reader_end(lk, r);
    lio_lock_close(lk);
    CHECK(probe(lp, 0, 0) == 0);         /* byte 0 still held (shared) */
    CHECK(probe(lp, 1, getpid()) == 1);  /* liblmdb's pid lock still there */
    CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0);
    mdb_txn_abort(txn);
    put_all(e, 200, 51);
    mdb_env_close(e);
    CHECK(probe(lp, 0, 0) == 1);         /* all released now */

    /* reopen: the parked descriptor is reused */
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK(lio_lock_txnid(lk) == 4);
    lio_lock_close(lk);
    CHECK(probe(lp, 0, 0) == 1);
    return 0;
}

/* (2b) liblmdb first, then lmdbio; close lmdbio first, then liblmdb. */
static int t_order_mdb_first(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    MDB_env *e;
    MDB_txn *txn;
    struct strbuf b;
    char ours[8192];
    (void)unused;
    mkpath(env, sizeof(env), "order2");
    make_env(env, 200, 2, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);

    e = env_open(env, 0);
    CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0);
    CHECK(mdb_txn_id(txn) == 2);

    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    CHECK(txnid == 2);
    mdb_list(e, &b);
    CHECK(strstr(b.s, "txnid") != NULL);
    CHECK(lio_lock_num_readers(lk) == 2); /* liblmdb's slot kept: no reinit */
    lio_lock_reader_list(lk, ours, sizeof(ours));
    CHECK(strcmp(ours, b.s) == 0);
    mdb_txn_abort(txn);

    put_all(e, 200, 7); /* writer in this process while lmdbio pins */
    CHECK(lio_lock_txnid(lk) == 3);

    lio_lock_reader_end(lk, r);
    lio_lock_close(lk);
    /* liblmdb's locks survive lmdbio's close */
    CHECK(probe(lp, 0, 0) == 0);
    CHECK(probe(lp, 1, getpid()) == 1);
    CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0);
    CHECK(mdb_txn_id(txn) == 3);
    mdb_txn_abort(txn);
    put_all(e, 200, 8);
    mdb_env_close(e);
    CHECK(probe(lp, 0, 0) == 1);
    return 0;
}

/* (2c) liblmdb first, lmdbio second; close liblmdb first.  lmdbio's byte-0
 * OFD lock survives; its pid lock (dropped by liblmdb's close()) comes back
 * at the next begin. */
static int t_order_mdb_closes_first(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    MDB_env *e;
    MDB_txn *txn;
    (void)unused;
    mkpath(env, sizeof(env), "order3");
    make_env(env, 200, 2, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);

    e = env_open(env, MDB_RDONLY);
    CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0);
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    mdb_txn_abort(txn);
    mdb_env_close(e);
    CHECK(probe(lp, 0, 0) == 0); /* our OFD shared lock on byte 0 holds */
    lio_lock_reader_end(lk, r);
    r = NULL;
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    CHECK(probe(lp, 1, getpid()) == 1); /* re-asserted */

    /* A liblmdb writer in another process keeps our pinned slot. */
    {
        struct writer_job j = {env, 200, 3, 30, (long)getpid(), 2};
        CHECK_RC(in_child(writer_main, &j), 0);
    }
    lio_lock_reader_end(lk, r);
    lio_lock_close(lk);
    CHECK(probe(lp, 0, 0) == 1);
    return 0;
}

/* Two lmdbio handles and a liblmdb env on one file, interleaved closes. */
static int t_two_handles(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *a, *b2;
    lio_reader *ra = NULL, *rb = NULL;
    lio_error err;
    uint64_t t1, t2;
    MDB_env *e;
    (void)unused;
    mkpath(env, sizeof(env), "two");
    make_env(env, 100, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    CHECK_LIO(lio_lock_open(&a, lp, 0644, 0, newest_cb, dp, &err), err);
    e = env_open(env, MDB_RDONLY);
    CHECK_LIO(lio_lock_open(&b2, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(a, &ra, &t1, &err), err);
    CHECK_LIO(lio_lock_reader_begin(b2, &rb, &t2, &err), err);
    CHECK(lio_lock_reader_index(ra) != lio_lock_reader_index(rb));
    lio_lock_close(a); /* releases ra, keeps the shared descriptor */
    CHECK(probe(lp, 1, getpid()) == 1);
    {
        char buf[4096];
        lio_lock_reader_list(b2, buf, sizeof(buf));
        CHECK(list_has(buf, getpid(), t2));
        CHECK(lio_lock_num_readers(b2) == 2);
    }
    mdb_env_close(e); /* drops process-owned locks */
    CHECK(probe(lp, 0, 0) == 0); /* b2's OFD lock remains */
    lio_lock_close(b2);
    CHECK(probe(lp, 0, 0) == 1);
    return 0;
}

/* (3) A missing lock file is created and initialized with the newest
 * txnid; a liblmdb process then opens the env and commits. */
static int t_create(void *arg)
{
    int subdir = *(int *)arg;
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    struct stat st;
    mkpath(env, sizeof(env), subdir ? "create" : "create.mdb");
    make_env(env, 300, 5, subdir);
    lock_path(lp, sizeof(lp), env, subdir);
    data_path(dp, sizeof(dp), env, subdir);
    CHECK(unlink(lp) == 0);

    CHECK_LIO(lio_lock_open(&lk, lp, 0600, 0, newest_cb, dp, &err), err);
    CHECK(stat(lp, &st) == 0 && st.st_size == 8192);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    CHECK(txnid == 5);
    {
        /* A liblmdb process opens, sees txnid 5 and us, commits twice. */
        struct writer_job j = {env, 300, 2, 40, (long)getpid(), 5};
        pid_t c = fork();
        if (c == 0) {
            MDB_env *e;
            MDB_txn *txn;
            MDB_envinfo info;
            e = env_open(env, subdir ? 0 : MDB_NOSUBDIR);
            CHECK_RC(mdb_env_info(e, &info), 0);
            CHECK(info.me_last_txnid == 5);
            CHECK(info.me_numreaders == 1);
            CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0);
            CHECK(mdb_txn_id(txn) == 5);
            mdb_txn_abort(txn);
            mdb_env_close(e);
            if (subdir)
                _exit(writer_main(&j));
            e = env_open(env, MDB_NOSUBDIR);
            put_all(e, 300, 40);
            put_all(e, 300, 41);
            mdb_env_close(e);
            _exit(0);
        }
        CHECK(wait_child(c) == 0);
    }
    CHECK(lio_lock_txnid(lk) == 7);
    lio_lock_reader_end(lk, r);
    r = NULL;
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    CHECK(txnid == 7);
    lio_lock_reader_end(lk, r);
    lio_lock_close(lk);
    return 0;
}

/* A process that holds a shared lock on byte 0 (as any env user does)
 * until its stdin pipe closes. */
static pid_t hold_shared(const char *lp, int *wfd)
{
    int pfd[2], rfd[2];
    pid_t c;
    char ch;
    CHECK(pipe(pfd) == 0 && pipe(rfd) == 0);
    c = fork();
    if (c == 0) {
        struct flock fl;
        int fd = open(lp, O_RDWR);
        close(pfd[1]);
        close(rfd[0]);
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_RDLCK;
        fl.l_whence = SEEK_SET;
        fl.l_len = 1;
        if (fd < 0 || fcntl(fd, F_SETLK, &fl) != 0)
            _exit(9);
        (void)!write(rfd[1], "x", 1);
        (void)!read(pfd[0], &ch, 1);
        _exit(0);
    }
    close(pfd[0]);
    close(rfd[1]);
    CHECK(read(rfd[0], &ch, 1) == 1);
    close(rfd[0]);
    *wfd = pfd[1];
    return c;
}

static void release_holder(pid_t c, int wfd)
{
    close(wfd);
    CHECK(wait_child(c) == 0);
}

static void patch32(const char *lp, off_t off, uint32_t v)
{
    int fd = open(lp, O_RDWR);
    CHECK(fd >= 0 && pwrite(fd, &v, 4, off) == 4);
    close(fd);
}

/* Bad magic / format / size, when another user holds the table. */
static int t_bad_files(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk = (lio_lock *)1;
    lio_error err;
    int wfd, fd;
    pid_t h;
    (void)unused;
    mkpath(env, sizeof(env), "bad");
    make_env(env, 10, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);

    h = hold_shared(lp, &wfd);
    patch32(lp, 0, 0x12345678u);
    CHECK(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err) == LIO_INVALID);
    CHECK(lk == NULL && err.code == LIO_INVALID);
    CHECK(strstr(err.msg, lp) != NULL);
    note("%s", err.msg);

    patch32(lp, 0, 0xBEEFC0DEu);
    patch32(lp, 4, 0x5AA02002u); /* an mdb.master-style format word */
    CHECK(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err) ==
          LIO_VERSION_MISMATCH);
    CHECK(strstr(err.msg, lp) != NULL);
    note("%s", err.msg);

    fd = open(lp, O_RDWR);
    CHECK(fd >= 0 && ftruncate(fd, 100) == 0);
    close(fd);
    CHECK(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err) == LIO_INVALID);
    CHECK(strstr(err.msg, lp) != NULL);
    note("%s", err.msg);
    release_holder(h, wfd);

    /* Alone, lmdbio re-initializes such a file, as liblmdb does. */
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    lio_lock_close(lk);
    {
        MDB_env *e = env_open(env, 0);
        put_all(e, 10, 3);
        mdb_env_close(e);
    }
    return 0;
}

/* EACCES (as an unprivileged user) is an error naming the path. */
static int t_eacces(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk = (lio_lock *)1;
    lio_error err;
    (void)unused;
    mkpath(env, sizeof(env), "eacces");
    make_env(env, 10, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    CHECK(chmod(lp, 0644) == 0 && chmod(dp, 0644) == 0);
    if (getuid() == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) {
            note("SKIP: cannot drop privileges");
            return 0;
        }
    }
    CHECK(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err) == LIO_SYSERR);
    CHECK(lk == NULL && err.sys_errno == EACCES);
    CHECK(strstr(err.msg, lp) != NULL);
    note("%s", err.msg);
    /* same in a read-only dir without a lock file */
    return 0;
}

/* EROFS: no lock, success, *out == NULL (liblmdb reads unlocked too). */
static int t_erofs(void *unused)
{
    char mnt[256], env[300], lp[300], dp[300];
    lio_lock *lk = (lio_lock *)1;
    lio_error err;
    (void)unused;
    mkpath(mnt, sizeof(mnt), "rofs");
    mkdir(mnt, 0755);
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("lio_test", mnt, "tmpfs", 0, "size=16m") != 0) {
        note("SKIP: cannot mount a filesystem here (%s)", strerror(errno));
        return 0;
    }
    snprintf(env, sizeof(env), "%s/env", mnt);
    make_env(env, 10, 2, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    CHECK(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0);
    CHECK(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err) == 0);
    CHECK(lk == NULL && err.sys_errno == EROFS);
    {
        char buf[64];
        lio_lock_reader_list(NULL, buf, sizeof(buf));
        CHECK(strcmp(buf, "(no reader locks)\n") == 0);
    }
    {
        /* liblmdb agrees: a read-only env opens without locks */
        MDB_env *e = env_open(env, MDB_RDONLY);
        struct strbuf b;
        mdb_list(e, &b);
        CHECK(strcmp(b.s, "(no reader locks)\n") == 0);
        mdb_env_close(e);
    }
    /* also when the lock file does not exist */
    CHECK(mount(NULL, mnt, NULL, MS_REMOUNT, NULL) == 0);
    CHECK(unlink(lp) == 0);
    CHECK(mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0);
    lk = (lio_lock *)1;
    CHECK(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err) == 0);
    CHECK(lk == NULL);
    umount(mnt);
    return 0;
}

/* Readers full, small table, liblmdb agrees on max_readers. */
static int t_full(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_reader *r[5] = {0};
    lio_error err;
    uint64_t txnid;
    int i;
    pid_t c;
    (void)unused;
    mkpath(env, sizeof(env), "full");
    make_env(env, 10, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    CHECK(unlink(lp) == 0);
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 4, newest_cb, dp, &err), err);
    CHECK(lio_lock_max_readers(lk) == 4);
    for (i = 0; i < 4; i++)
        CHECK_LIO(lio_lock_reader_begin(lk, &r[i], &txnid, &err), err);
    CHECK(lio_lock_reader_begin(lk, &r[4], &txnid, &err) == LIO_READERS_FULL);
    CHECK(r[4] == NULL);
    note("%s", err.msg);
    c = fork();
    if (c == 0) {
        MDB_env *e = env_open(env, MDB_RDONLY);
        MDB_txn *txn;
        unsigned mr;
        CHECK_RC(mdb_env_get_maxreaders(e, &mr), 0);
        CHECK(mr == 4);
        CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), MDB_READERS_FULL);
        mdb_env_close(e);
        _exit(0);
    }
    CHECK(wait_child(c) == 0);
    lio_lock_reader_end(lk, r[2]);
    c = fork();
    if (c == 0) {
        MDB_env *e = env_open(env, MDB_RDONLY);
        MDB_txn *txn;
        CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0);
        mdb_txn_abort(txn);
        mdb_env_close(e);
        _exit(0);
    }
    CHECK(wait_child(c) == 0);
    lio_lock_close(lk); /* releases the other three */
    return 0;
}

/* reset / renew, and a slot cleared under us. */
static int t_reset_renew(void *unused)
{
    char env[256], lp[256], dp[256], buf[4096];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    unsigned idx;
    int fd;
    (void)unused;
    mkpath(env, sizeof(env), "renew");
    make_env(env, 10, 2, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    idx = lio_lock_reader_index(r);
    CHECK(lio_lock_reader_begin(lk, &r, &txnid, &err) == LIO_BAD_RSLOT);
    lio_lock_reader_reset(lk, r);
    lio_lock_reader_list(lk, buf, sizeof(buf));
    CHECK(list_has(buf, getpid(), UINT64_MAX)); /* "-" as liblmdb prints */
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    CHECK(lio_lock_reader_index(r) == idx && txnid == 2);
    lio_lock_reader_reset(lk, r);
    /* Someone (a py-lmdb close in this process) clears our slot. */
    fd = open(lp, O_RDWR);
    {
        int32_t zero = 0;
        CHECK(pwrite(fd, &zero, 4, 128 + 64 * (off_t)idx + 8) == 4);
    }
    close(fd);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    lio_lock_reader_list(lk, buf, sizeof(buf));
    CHECK(list_has(buf, getpid(), 2));
    lio_lock_reader_end(lk, r);
    lio_lock_reader_list(lk, buf, sizeof(buf));
    CHECK(strcmp(buf, "(no active readers)\n") == 0);
    CHECK(lio_lock_reader_list(lk, buf, 5) == strlen("(no active readers)\n"));
    CHECK(strcmp(buf, "(no ") == 0);
    lio_lock_close(lk);
    return 0;
}

/* A process dies holding the reader mutex: the next reader recovers it
 * (EOWNERDEAD), clears the dead process's slot; liblmdb works after. */
static int t_owner_dead(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    pid_t c;
    const char *a[2];
    (void)unused;
    mkpath(env, sizeof(env), "ownerdead");
    make_env(env, 10, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    a[0] = lp;
    a[1] = dp;
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    c = fork();
    if (c == 0) {
        /* take a slot with lmdbio, then die holding rmutex */
        lio_lock *l2;
        lio_reader *r2 = NULL;
        uint64_t t;
        int fd;
        void *m;
        CHECK_LIO(lio_lock_open(&l2, a[0], 0644, 0, newest_cb, (void *)a[1],
                                &err), err);
        CHECK_LIO(lio_lock_reader_begin(l2, &r2, &t, &err), err);
        fd = open(a[0], O_RDWR);
        m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        CHECK(m != MAP_FAILED);
        CHECK(pthread_mutex_lock((pthread_mutex_t *)((char *)m + 8)) == 0);
        _exit(0);
    }
    CHECK(wait_child(c) == 0);
    CHECK(lio_lock_num_readers(lk) == 1);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    {
        char buf[4096];
        lio_lock_reader_list(lk, buf, sizeof(buf));
        CHECK(!list_has(buf, c, txnid)); /* cleared by the recovery */
        CHECK(list_has(buf, getpid(), txnid));
        CHECK(lio_lock_reader_index(r) == 0); /* the dead slot, reused */
    }
    c = fork();
    if (c == 0) {
        MDB_env *e = env_open(env, 0);
        MDB_txn *txn;
        CHECK_RC(mdb_txn_begin(e, NULL, MDB_RDONLY, &txn), 0);
        mdb_txn_abort(txn);
        put_all(e, 10, 9);
        mdb_env_close(e);
        _exit(0);
    }
    CHECK(wait_child(c) == 0);
    lio_lock_reader_end(lk, r);
    lio_lock_close(lk);
    return 0;
}

/* Threads begin/end concurrently; slots held at once are distinct. */
#define NTHREADS 8
#define NITER 3000
static lio_lock *g_tlk;
static volatile int g_owner[1024];

static void *thread_main(void *arg)
{
    int id = (int)(intptr_t)arg, i;
    lio_error err;
    for (i = 0; i < NITER; i++) {
        lio_reader *r = NULL;
        uint64_t txnid;
        unsigned idx;
        if (lio_lock_reader_begin(g_tlk, &r, &txnid, &err) != 0) {
            fprintf(stderr, "  thread: %s\n", err.msg);
            return (void *)1;
        }
        idx = lio_lock_reader_index(r);
        if (__sync_val_compare_and_swap(&g_owner[idx], 0, id + 1) != 0)
            return (void *)2;
        if (i % 7 == 0)
            sched_yield();
        g_owner[idx] = 0;
        if (i % 3 == 0) {
            lio_lock_reader_reset(g_tlk, r);
            if (lio_lock_reader_begin(g_tlk, &r, &txnid, &err) != 0)
                return (void *)3;
        }
        lio_lock_reader_end(g_tlk, r);
    }
    return NULL;
}

static int t_threads(void *unused)
{
    char env[256], lp[256], dp[256], buf[4096];
    lio_error err;
    pthread_t th[NTHREADS];
    int i;
    struct writer_job j;
    pid_t w;
    (void)unused;
    mkpath(env, sizeof(env), "threads");
    make_env(env, 500, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    CHECK_LIO(lio_lock_open(&g_tlk, lp, 0644, 0, newest_cb, dp, &err), err);
    /* a liblmdb writer commits meanwhile */
    j.env = env;
    j.nkeys = 500;
    j.commits = 40;
    j.gen0 = 1;
    j.reader_pid = 0;
    w = fork();
    if (w == 0)
        _exit(writer_main(&j));
    for (i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&th[i], NULL, thread_main,
                             (void *)(intptr_t)i) == 0);
    for (i = 0; i < NTHREADS; i++) {
        void *res;
        CHECK(pthread_join(th[i], &res) == 0);
        CHECK(res == NULL);
    }
    CHECK(wait_child(w) == 0);
    CHECK(lio_lock_num_readers(g_tlk) <= NTHREADS);
    lio_lock_reader_list(g_tlk, buf, sizeof(buf));
    CHECK(strcmp(buf, "(no active readers)\n") == 0);
    CHECK(lio_lock_txnid(g_tlk) == 41);
    lio_lock_close(g_tlk);
    return 0;
}

/* fork() after open: the child must not touch the parent's slots or locks
 * through what it inherited, and a fresh open in the child must join the
 * table (shared), never re-initialize it. */
static int t_fork(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_reader *r = NULL;
    lio_error err;
    uint64_t txnid;
    pid_t c;
    (void)unused;
    mkpath(env, sizeof(env), "fork");
    make_env(env, 10, 2, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    CHECK_LIO(lio_lock_reader_begin(lk, &r, &txnid, &err), err);
    c = fork();
    if (c == 0) {
        lio_lock *l2;
        lio_reader *r2 = NULL;
        uint64_t t;
        char buf[4096];
        pid_t parent = getppid();
        CHECK(lio_lock_reader_begin(lk, &r2, &t, &err) == LIO_EINVAL);
        lio_lock_reader_reset(lk, r);   /* must be no-ops here */
        CHECK_LIO(lio_lock_open(&l2, lp, 0644, 0, newest_cb, dp, &err), err);
        lio_lock_reader_list(l2, buf, sizeof(buf));
        CHECK(list_has(buf, parent, 2)); /* joined, not re-initialized */
        CHECK_LIO(lio_lock_reader_begin(l2, &r2, &t, &err), err);
        CHECK(probe(lp, 1, getpid()) == 1);
        lio_lock_close(lk);             /* inherited: releases nothing */
        lio_lock_close(l2);
        _exit(0);
    }
    CHECK(wait_child(c) == 0);
    {
        char buf[4096];
        lio_lock_reader_list(lk, buf, sizeof(buf));
        CHECK(list_has(buf, getpid(), 2)); /* still pinned */
        CHECK(!list_has(buf, c, 2));
    }
    CHECK(probe(lp, 0, 0) == 0);        /* our byte-0 lock survived */
    CHECK(probe(lp, 1, getpid()) == 1);
    lio_lock_reader_end(lk, r);
    lio_lock_close(lk);
    CHECK(probe(lp, 0, 0) == 1);
    return 0;
}

static int count_fds(void)
{
    char path[64];
    int fd, n = 0;
    for (fd = 0; fd < 4096; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        if (access(path, F_OK) == 0)
            n++;
    }
    return n;
}

/* No descriptor leak without liblmdb; parked (not closed) while a liblmdb
 * env of this process is open on the file; swept after it closes. */
static int t_fds(void *unused)
{
    char env[256], lp[256], dp[256];
    lio_lock *lk;
    lio_error err;
    MDB_env *e;
    int base, i, with_mdb;
    (void)unused;
    mkpath(env, sizeof(env), "fds");
    make_env(env, 10, 1, 1);
    lock_path(lp, sizeof(lp), env, 1);
    data_path(dp, sizeof(dp), env, 1);
    base = count_fds();
    for (i = 0; i < 50; i++) {
        CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
        lio_lock_close(lk);
    }
    CHECK(count_fds() == base);
    e = env_open(env, MDB_RDONLY);
    with_mdb = count_fds();
    for (i = 0; i < 50; i++) {
        CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
        lio_lock_close(lk);
        CHECK(probe(lp, 0, 0) == 0); /* liblmdb's byte-0 lock kept */
    }
    CHECK(count_fds() == with_mdb + 1); /* one parked, reused each time */
    mdb_env_close(e);
    CHECK_LIO(lio_lock_open(&lk, lp, 0644, 0, newest_cb, dp, &err), err);
    lio_lock_close(lk);
    CHECK(count_fds() == base);          /* swept */
    CHECK(probe(lp, 0, 0) == 1);
    return 0;
}

/* ---- driver ---------------------------------------------------------------- */

static int one = 1, zero = 0;
static const struct {
    const char *name;
    int (*fn)(void *);
    void *arg;
} tests[] = {
    {"layout", t_layout, NULL},
    {"pin", t_pin, NULL},
    {"stale", t_stale, NULL},
    {"order_lio_first", t_order_lio_first, NULL},
    {"order_mdb_first", t_order_mdb_first, NULL},
    {"order_mdb_closes_first", t_order_mdb_closes_first, NULL},
    {"two_handles", t_two_handles, NULL},
    {"create_subdir", t_create, &one},
    {"create_nosubdir", t_create, &zero},
    {"bad_files", t_bad_files, NULL},
    {"eacces", t_eacces, NULL},
    {"erofs", t_erofs, NULL},
    {"full", t_full, NULL},
    {"reset_renew", t_reset_renew, NULL},
    {"owner_dead", t_owner_dead, NULL},
    {"threads", t_threads, NULL},
    {"fork", t_fork, NULL},
    {"fds", t_fds, NULL},
};

int main(int argc, char **argv)
{
    size_t i;
    int failed = 0, ran = 0, a;
    char cmd[300];
    snprintf(g_base, sizeof(g_base), "/tmp/lio_lock_test.XXXXXX");
    if (!mkdtemp(g_base)) {
        perror("mkdtemp");
        return 2;
    }
    chmod(g_base, 0755);
    for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        int st, want = argc < 2;
        for (a = 1; a < argc; a++)
            if (strcmp(argv[a], tests[i].name) == 0)
                want = 1;
        if (!want)
            continue;
        g_test = tests[i].name;
        fprintf(stderr, "%s ...\n", tests[i].name);
        fflush(stderr);
        st = in_child(tests[i].fn, tests[i].arg);
        ran++;
        if (st != 0) {
            failed++;
            fprintf(stderr, "FAIL %s (status %d)\n", tests[i].name, st);
        } else {
            fprintf(stderr, "ok   %s\n", tests[i].name);
        }
    }
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_base);
    if (!failed)
        (void)!system(cmd);
    else
        fprintf(stderr, "(left %s for inspection)\n", g_base);
    fprintf(stderr, "%d/%d passed\n", ran - failed, ran);
    return failed ? 1 : 0;
}
