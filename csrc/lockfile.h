/* lmdbio lock-file layer: hold reader slots in LMDB's lock.mdb exactly as a
 * liblmdb 0.9.x reader does, so a live liblmdb writer never reuses the pages
 * of a snapshot lmdbio is reading.  C99 + POSIX + Linux OFD locks; no Python.
 *
 * Target: liblmdb 0.9.x built with MDB_USE_POSIX_MUTEX + MDB_ROBUST_SUPPORTED
 * (Debian's liblmdb, py-lmdb's bundled copy) on Linux.  The lock file is the
 * one file lmdbio maps (mmap, MAP_SHARED) and writes; the data file is never
 * touched here.
 *
 * On-disk layout (MDB_txninfo in mdb.c, mdb.RE/0.9 branch; x86_64 glibc
 * offsets, checked at compile time there):
 *     0  uint32 mti_magic        0xBEEFC0DE
 *     4  uint32 mti_format       0x00010001 = MDB_LOCK_VERSION 1
 *                                  + (MDB_PIDLOCK << 16)
 *     8  pthread_mutex_t mti_rmutex  (40 bytes; robust, process-shared)
 *    48  size_t mti_txnid        newest committed txnid (set by writers)
 *    56  unsigned mti_numreaders high-water mark of used slots
 *    64  pthread_mutex_t mti_wmutex  (writers only; padded to 64 bytes)
 *   128  MDB_reader[maxreaders]  64 bytes each: size_t mr_txnid @0
 *                                (-1 = slot idle), pid_t mr_pid @8
 *                                (0 = slot free), pthread_t mr_tid @16
 *   file size = 128 + 64 * maxreaders  (8192 for the default 126)
 * (liblmdb's mdb.master/1.0 uses another layout and MDB_LOCK_FORMAT with
 * mutex size/kind bits; a lock file of that kind is rejected with
 * LIO_VERSION_MISMATCH, as liblmdb 0.9 would.)
 *
 * Protocol (mdb_env_setup_locks, mdb_txn_renew0, mdb_reader_check0):
 *  - Every user of the environment holds a shared lock on byte 0 of the
 *    lock file while it has the environment open.  An opener that gets byte
 *    0 exclusively is alone and (re)initializes the table (mutexes, magic,
 *    format, mti_txnid = newest committed txnid, numreaders = 0), then
 *    downgrades to shared.  lmdbio takes its byte-0 lock as a Linux
 *    open-file-description lock (F_OFD_SETLK), owned by its own descriptor:
 *    a liblmdb in the same process that tries byte 0 exclusively conflicts
 *    with it and falls back to shared (no re-initialization under us), and
 *    liblmdb closing its descriptor does not drop it.
 *  - A reader takes rmutex, reuses the first slot with mr_pid == 0 (or
 *    appends one and bumps mti_numreaders), sets tid then pid, unlocks, then
 *    publishes mti_txnid into mr_txnid until the two agree.  Ending the
 *    transaction sets mr_txnid = -1 and mr_pid = 0.
 *  - Liveness: each reader process holds a write lock on the byte at
 *    offset getpid(); mdb_reader_check (mdb_stat -rr, py-lmdb reader_check,
 *    robust-mutex recovery) clears slots whose pid byte nobody locks.
 *    lmdbio takes this lock as a traditional (process-owned) fcntl lock, as
 *    liblmdb does, and NOT as an OFD lock: liblmdb in the same process sets
 *    the same byte with F_SETLK, and a process-owned and an OFD write lock
 *    on one byte conflict even inside one process, which would make
 *    py-lmdb's first read transaction fail with EAGAIN.  Process-owned locks
 *    merge, so both libraries share it.  The lock is re-asserted at every
 *    lio_lock_reader_begin/refresh because a py-lmdb Environment.close() in
 *    this process (close() of its descriptor) drops it.
 *  - close() of ANY descriptor on the lock file drops all process-owned
 *    locks of the process on it, i.e. a py-lmdb environment's byte-0 and pid
 *    locks.  So lmdbio keeps one descriptor per lock-file inode for the whole
 *    process (shared by every lio_lock on that file) and, when the last
 *    lio_lock on it closes, closes that descriptor only if /proc/locks shows
 *    no process-owned lock of this process on byte 0 (no liblmdb env open on
 *    the file here).  Otherwise it releases its OFD lock, unmaps and parks
 *    the descriptor for reuse; parked descriptors are closed later, once
 *    safe (checked at every lio_lock_open/close).
 *
 * Known limit (liblmdb's own behaviour): when a liblmdb environment on the
 * same file in this process closes (py-lmdb Environment.close()), liblmdb
 * clears every slot whose mr_pid is this process's pid among the slots it
 * had seen, lmdbio's live slots included; lio_lock_reader_refresh and the
 * next begin take a new slot, but a transaction open across that close is no
 * longer pinned.
 *
 * fork(): handles do not carry over.  In the child, lio_lock_reader_begin/
 * refresh/check on an inherited handle return LIO_EINVAL, reset/end/close
 * of inherited slots and handles touch nothing (they are the parent's),
 * and lio_lock_open opens its own descriptor (an inherited one shares the
 * parent's open file description, so its OFD locks are the parent's).
 * Forking while another thread is inside a lio_lock call is not supported.
 *
 * Threads: every function may be called concurrently from several threads
 * on the same lio_lock (slots are per call, as liblmdb with MDB_NOTLS, which
 * py-lmdb uses), except that a given lio_reader must be used by one thread
 * at a time and lio_lock_close must not race with other calls on that lk.
 */
#ifndef LMDBIO_LOCKFILE_H
#define LMDBIO_LOCKFILE_H

#include <stddef.h>
#include <stdint.h>

#include "lmdbio.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LIO_LOCK_MAGIC 0xBEEFC0DEu
#define LIO_LOCK_FORMAT 0x00010001u  /* liblmdb 0.9.x, MDB_PIDLOCK */
#define LIO_DEFAULT_READERS 126u

typedef struct lio_lock lio_lock;     /* an open lock table */
typedef struct lio_reader lio_reader; /* a held reader slot */

/* Returns the newest committed txnid of the data file (the greater txnid of
 * the two meta pages, as mdb_env_pick_meta), 0 or a negative LIO_* code
 * with *err filled.  Called by lio_lock_open only when it initializes the
 * table, while it holds byte 0 exclusively (so no writer can commit in
 * between).  In the Cython layer: a nogil C function calling
 * lio_env_read_metas on the lio_env passed as ctx.  It runs under
 * lockfile.c's process-wide registry mutex: it must not call lio_lock_*. */
typedef int (*lio_txnid_fn)(void *ctx, uint64_t *txnid, lio_error *err);

/* The lock file's name for an environment, as liblmdb's mdb_fname_init:
 * "<path>/lock.mdb" (subdir != 0) or "<path>-lock".  Writes it into buf
 * (NUL-terminated when it fits) and returns its length, like snprintf. */
size_t lio_lock_path(char *buf, size_t cap, const char *env_path, int subdir);

/* Open (creating it if missing, with permission bits `mode` as given to
 * open(2): py-lmdb passes its mode & ~0111) and attach to the lock table at
 * lock_path, initializing it when this is the only user (then max_readers
 * sizes a new or too small file, 0 = 126, and newest_txnid(ctx) supplies
 * mti_txnid).  Open the data file first: like liblmdb for a read-only env,
 * lmdbio must not create a lock file for a missing environment.
 * Returns:
 *   LIO_SUCCESS, *out set;
 *   LIO_SUCCESS with *out = NULL when the lock file cannot be opened for
 *     writing because the filesystem is read-only (EROFS): read the env
 *     unlocked, as liblmdb does for an MDB_RDONLY env;
 *   LIO_SYSERR (sys_errno = EACCES, ENOENT, ...) naming the path;
 *   LIO_INVALID (bad magic or too short) / LIO_VERSION_MISMATCH (other
 *     format) naming the path, when another process holds the table;
 *   LIO_EINVAL (bad argument, max_readers > 2^24, or newest_txnid NULL
 *     when the table must be initialized);
 *   an error returned by newest_txnid.
 * The table layout is built from this platform's pthread_mutex_t, size_t,
 * pid_t and pthread_t exactly as mdb.c builds it, so it matches a liblmdb
 * compiled for the same platform (offsets above asserted for x86_64
 * glibc).  Several lio_lock_open calls on one file share one descriptor
 * and mapping. */
int lio_lock_open(lio_lock **out, const char *lock_path, unsigned mode,
                  unsigned max_readers, lio_txnid_fn newest_txnid, void *ctx,
                  lio_error *err);

/* Release every slot still held through lk (as mdb_env_close does), detach.
 * NULL is a no-op. */
void lio_lock_close(lio_lock *lk);

/* Take a reader slot and publish the txnid to read (mdb_txn_begin/renew of
 * a read-only txn); also (re)takes this process's pid lock (one fcntl).
 * *slot == NULL: take a new slot.  *slot != NULL: a slot idle after
 * lio_lock_reader_reset, renewed in place (a new slot is taken
 * transparently if someone cleared it).  The caller then reads meta page
 * (*txnid & 1), which must carry *txnid; if it carries another txnid (a
 * writer committed twice meanwhile) call lio_lock_reader_refresh.
 * Errors: LIO_READERS_FULL, LIO_BAD_RSLOT (slot not idle), LIO_SYSERR
 * (pid lock or mutex failure), LIO_ENOMEM. */
int lio_lock_reader_begin(lio_lock *lk, lio_reader **slot, uint64_t *txnid,
                          lio_error *err);

/* Republish the newest txnid in a held slot (the meta page did not carry
 * the txnid returned before).  If *txnid comes back unchanged, the lock
 * table and the data file disagree: give up after a few attempts. */
int lio_lock_reader_refresh(lio_lock *lk, lio_reader *slot, uint64_t *txnid,
                            lio_error *err);

/* mdb_txn_reset: keep the slot (mr_pid) but unpin the snapshot
 * (mr_txnid = -1, shown as "-" by mdb_reader_list); renew with
 * lio_lock_reader_begin(lk, &slot, ...). */
void lio_lock_reader_reset(lio_lock *lk, lio_reader *slot);

/* mdb_txn_abort/commit: release the slot (mr_txnid = -1, mr_pid = 0) and
 * free the handle.  NULL slot is a no-op. */
void lio_lock_reader_end(lio_lock *lk, lio_reader *slot);

/* Index of the slot in the table (for tests and diagnostics). */
unsigned lio_lock_reader_index(const lio_reader *slot);

/* me_maxreaders (from the file size, as liblmdb) and mti_numreaders, as
 * mdb_env_info reports them (py-lmdb info()['num_readers']). */
unsigned lio_lock_max_readers(const lio_lock *lk);
unsigned lio_lock_num_readers(const lio_lock *lk);
/* mti_txnid: the newest committed txnid as the table records it. */
uint64_t lio_lock_txnid(const lio_lock *lk);

/* mdb_reader_check: clear slots of processes that hold no pid lock; *dead
 * (may be NULL) receives the number of slots cleared. */
int lio_lock_reader_check(lio_lock *lk, int *dead, lio_error *err);

/* mdb_reader_list's text (what py-lmdb's Environment.readers() returns):
 * "    pid     thread     txnid\n" then "%10d %zx %zu\n" per used slot
 * ("-" for txnid when idle), or "(no active readers)\n"; lk == NULL (no
 * lock file) gives "(no reader locks)\n".  Writes into buf (NUL-terminated
 * when it fits) and returns the full length, like snprintf; call again
 * with a larger buffer if the result is >= cap. */
size_t lio_lock_reader_list(const lio_lock *lk, char *buf, size_t cap);

/* ---- inspection: what a liblmdb 0.9 opener would find, probe only ------
 * lio_lock_inspect reads a lock file with pread and probes its locks with
 * F_GETLK: it takes no lock, maps nothing, writes nothing, so it never
 * disturbs the environment's users (mdb_stat -e/-r/-rr report the same
 * facts; see lmdbio's `stat`).  It reuses this process's registered
 * descriptor on the file if there is one, and never closes a descriptor
 * whose close would drop a lock of this process (it parks it, as
 * lio_lock_close does). */

typedef struct lio_lock_slot_info {
    uint64_t txnid;          /* mr_txnid (UINT64_MAX: idle) */
    int32_t pid;             /* mr_pid (0: free slot) */
    uint64_t tid;            /* mr_tid */
    int stale;               /* pid != 0, not this process, and no process
                              * holds its pid lock: mdb_reader_check would
                              * clear the slot */
} lio_lock_slot_info;

typedef struct lio_lock_info {
    int exists;              /* the lock file could be opened for reading */
    int live;                /* another process holds a lock on byte 0: it
                              * has the environment open */
    unsigned max_readers;    /* me_maxreaders a liblmdb opener would get */
    unsigned num_readers;    /* mti_numreaders (0 unless live) */
    unsigned nslots;         /* slots read: min(num_readers, max_readers) */
    lio_lock_slot_info *slots; /* malloc'd; lio_lock_info_free */
} lio_lock_info;

/* Fill *info for the lock file at lock_path.  A missing or unreadable file
 * is not an error (exists = 0, max_readers = 126: what liblmdb would create).
 * When no other process has the environment open (live = 0) a liblmdb
 * opener re-initializes the table, so nothing else is read: num_readers = 0,
 * no slots, and max_readers comes from the file size unless the file is
 * smaller than a default table.  When live: LIO_INVALID (shorter than the
 * table header, bad magic), LIO_VERSION_MISMATCH (another lock format),
 * LIO_SYSERR (read error), LIO_ENOMEM; the slots of numreaders are read and
 * each pid's liveness probed. */
int lio_lock_inspect(const char *lock_path, lio_lock_info *info,
                     lio_error *err);
void lio_lock_info_free(lio_lock_info *info);

/* mdb_reader_list's text (as lio_lock_reader_list) for the inspected slots;
 * skip_stale: without the stale slots (what mdb_reader_list prints after
 * mdb_reader_check). */
size_t lio_lock_info_list(const lio_lock_info *info, int skip_stale,
                          char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
