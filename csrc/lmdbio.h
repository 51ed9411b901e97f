/* lmdbio C core: parse LMDB 0.9.x data files from explicit reads.
 *
 * Layering: the core never calls Python and never knows where
 * bytes come from.  It asks a lio_source for byte ranges and parses the
 * buffers it gets.  io_posix.c provides a pread/O_DIRECT source.
 *
 * Error convention: functions return 0 on success, LIO_NOTFOUND when a key
 * or position does not exist, or a negative LIO_* code on failure, with the
 * details (page number, problem) written into a lio_error.
 */
#ifndef LMDBIO_H
#define LMDBIO_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes: liblmdb's numbers where liblmdb has the same condition.
 * The C side's one table of them (lmdbio.errors is the Python side's, with
 * every MDB code py-lmdb knows; a test checks that the two agree). */
#define LIO_SUCCESS 0
#define LIO_RETRY 1                  /* internal: meta changed, try again */
#define LIO_NOTFOUND (-30798)        /* MDB_NOTFOUND */
#define LIO_PAGE_NOTFOUND (-30797)   /* MDB_PAGE_NOTFOUND */
#define LIO_CORRUPTED (-30796)       /* MDB_CORRUPTED */
#define LIO_VERSION_MISMATCH (-30794)/* MDB_VERSION_MISMATCH */
#define LIO_INVALID (-30793)         /* MDB_INVALID: not an LMDB file */
#define LIO_READERS_FULL (-30790)    /* MDB_READERS_FULL */
#define LIO_INCOMPATIBLE (-30784)    /* MDB_INCOMPATIBLE */
#define LIO_BAD_RSLOT (-30783)       /* MDB_BAD_RSLOT */
#define LIO_BAD_VALSIZE (-30781)     /* MDB_BAD_VALSIZE */
#define LIO_EINVAL (-22)             /* bad argument (e.g. op needs DUPSORT) */
#define LIO_ENOMEM (-12)
#define LIO_SYSERR (-1)              /* I/O error: lio_error.sys_errno says */

#define LIO_MAX_KEY_SIZE 511
#define LIO_MAX_DEPTH 32             /* deeper trees are corrupt */

/* Persistent database flags (MDB_db.md_flags). */
#define LIO_REVERSEKEY 0x02
#define LIO_DUPSORT 0x04
#define LIO_INTEGERKEY 0x08
#define LIO_DUPFIXED 0x10
#define LIO_INTEGERDUP 0x20
#define LIO_REVERSEDUP 0x40
#define LIO_PERSISTENT_FLAGS 0x7e

#define LIO_EMPTY_ROOT UINT64_MAX

typedef struct lio_error {
    int code;            /* one of LIO_* (negative) */
    int sys_errno;       /* errno for LIO_SYSERR, else 0 */
    uint64_t pgno;       /* page the problem is on, UINT64_MAX if none */
    char msg[256];       /* human-readable, names the page and the problem */
    uint64_t off;        /* LIO_SYSERR: file offset of the failed read, else
                          * UINT64_MAX */
} lio_error;

/* A byte string: key or value.  Pointers returned by the core stay valid
 * until the next operation on the cursor that returned them. */
typedef struct lio_val {
    const uint8_t *data;
    size_t size;
} lio_val;

/* A piece of a scatter read: len bytes to dst. */
typedef struct lio_seg {
    uint8_t *dst;
    size_t len;
} lio_seg;

/* The most segments a source's readv is given at once. */
#define LIO_READV_MAX 256

/* Where bytes come from. */
typedef struct lio_source {
    void *ctx;
    /* Read up to len bytes at off into buf.  Returns bytes read (< len only
     * at end of file) or a negative errno.  buf and off are multiples of
     * `align`. */
    int64_t (*read)(void *ctx, uint64_t off, void *buf, size_t len);
    /* Current size of the file in bytes, or a negative errno. */
    int64_t (*size)(void *ctx);
    size_t align;        /* 1, or the O_DIRECT alignment */
    /* Optional (NULL: one read per segment): read consecutive bytes at off
     * into segs[0..nseg) in order, nseg <= LIO_READV_MAX, in one request.
     * Returns bytes read (fewer than asked only at end of file) or a
     * negative errno.  Used only by sources with align 1. */
    int64_t (*readv)(void *ctx, uint64_t off, const lio_seg *segs,
                     size_t nseg);
    /* Nonzero when the OS counts this source's reads from storage in the
     * process's blocks read in (getrusage's ru_inblock): a file on a
     * block device.  Zero (a network or FUSE filesystem, memory, MPI-IO):
     * a slow read is taken as one from storage on its time alone. */
    int counted_reads;
    /* With counted_reads: the bytes the OS reads ahead of reads in file
     * order (the device's read-ahead window), so that lmdbio asks only for
     * what lies beyond it.  0: none, or not known. */
    uint64_t os_readahead;
    /* Optional (NULL: `read` serves every read): read up to len bytes at
     * off into buf through the OS's cache, at any offset and length, for a
     * source whose `read` bypasses it (O_DIRECT).  Used for the meta
     * pages, which a reader without a reader slot re-reads after every
     * window to see a writer's commits: from the cache that is a copy of
     * a few hundred bytes, from the device a request each time. */
    int64_t (*read_cached)(void *ctx, uint64_t off, void *buf, size_t len);
} lio_source;

/* One B+tree's record (MDB_db, 48 bytes on disk). */
typedef struct lio_dbrec {
    uint32_t pad;
    uint16_t flags;
    uint16_t depth;
    uint64_t branch_pages;
    uint64_t leaf_pages;
    uint64_t overflow_pages;
    uint64_t entries;
    uint64_t root;
} lio_dbrec;

/* One meta page: a snapshot of the environment. */
typedef struct lio_meta {
    uint32_t psize;
    uint32_t env_flags;      /* mm_dbs[0].md_flags (free DB + env flags) */
    uint64_t mapsize;
    uint64_t address;        /* mm_address: fixed map address, 0 if none */
    uint64_t last_pg;
    uint64_t txnid;
    lio_dbrec free_db;       /* FREE_DBI */
    lio_dbrec main_db;       /* MAIN_DBI */
} lio_meta;

typedef struct lio_env lio_env;
typedef struct lio_cursor lio_cursor;

/* ---- environment ---------------------------------------------------- */

/* Validate both meta pages and set up a bounded page cache.
 * cache_bytes: LRU budget (pages pinned by open cursors may exceed it).
 * readahead_bytes: a cache miss on a tree page reads this aligned block
 * (0 = one page at a time).  The source must outlive the env. */
int lio_env_open(lio_env **out, const lio_source *src, size_t cache_bytes,
                 size_t readahead_bytes, lio_error *err);
void lio_env_close(lio_env *env);
uint32_t lio_env_psize(const lio_env *env);

/* Re-read both meta pages (uncached) and return them; index 0 and 1. */
int lio_env_read_metas(lio_env *env, lio_meta metas[2], lio_error *err);

/* Both meta pages as liblmdb reads them when it opens an environment
 * (mdb_env_read_header): 4096 bytes of meta page 0 at offset 0, of meta
 * page 1 at meta page 0's page size; each must have P_META, the magic and
 * data version 1 (nothing more: lio_env_open checks more).  *out: the one
 * with the greater txnid (meta page 0 on a tie), as liblmdb picks it.
 * LIO_INVALID for a short (or empty) file or a bad header,
 * LIO_VERSION_MISMATCH, LIO_SYSERR for a read error. */
int lio_read_header(const lio_source *src, lio_meta *out, lio_error *err);

/* The snapshot to read: txnid 0 = the newest committed one; otherwise the
 * meta page (txnid & 1), which must carry exactly that txnid (else
 * LIO_RETRY: a writer moved on; the lock layer re-reads its txnid). */
int lio_env_snapshot(lio_env *env, uint64_t txnid, lio_meta *out,
                     lio_error *err);

/* Look up a named database in the main DB of `snap`.
 * LIO_NOTFOUND if absent; LIO_INCOMPATIBLE if the key exists but is not a
 * named database (as liblmdb's mdb_dbi_open). */
int lio_named_db(lio_env *env, const lio_meta *snap, const void *name,
                 size_t len, lio_dbrec *out, lio_error *err);

/* Validate a database record's flags (main DB or a named DB). */
int lio_check_dbrec(const lio_dbrec *db, uint64_t pgno, lio_error *err);

/* ---- records of the format (format.c: bytes in, no I/O) ---------------- */

/* A database record (a named DB's value in the main DB, MDB_db): *db from
 * its 48 bytes; LIO_EINVAL (nothing set) when len is not 48. */
int lio_decode_dbrec(const uint8_t *p, size_t len, lio_dbrec *db);

/* A free-DB record's value (its key is the freeing txnid): a uint64 page
 * count, then that many page numbers.  *count: the count it records (0 if
 * len < 8); returns how many page numbers the len bytes hold (at most
 * *count).  lio_free_page(p, i), i below that: the i-th page number. */
uint64_t lio_free_record(const uint8_t *p, size_t len, uint64_t *count);
uint64_t lio_free_page(const uint8_t *p, uint64_t i);
/* Its key: the txnid that freed the pages (a native uint64, MDB_INTEGERKEY;
 * a shorter key reads as if padded with zero bytes). */
uint64_t lio_free_key(const uint8_t *p, size_t len);

/* ---- cursors -------------------------------------------------------- */

/* Same numbering as liblmdb's MDB_cursor_op. */
typedef enum lio_cursor_op {
    LIO_FIRST, LIO_FIRST_DUP, LIO_GET_BOTH, LIO_GET_BOTH_RANGE,
    LIO_GET_CURRENT, LIO_GET_MULTIPLE, LIO_LAST, LIO_LAST_DUP, LIO_NEXT,
    LIO_NEXT_DUP, LIO_NEXT_MULTIPLE, LIO_NEXT_NODUP, LIO_PREV, LIO_PREV_DUP,
    LIO_PREV_NODUP, LIO_SET, LIO_SET_KEY, LIO_SET_RANGE, LIO_PREV_MULTIPLE
} lio_cursor_op;

/* A cursor over one tree of snapshot `snap` (copied).  Pass
 * &snap->free_db to walk the free-page DB. */
int lio_cursor_open(lio_cursor **out, lio_env *env, const lio_meta *snap,
                    const lio_dbrec *db, lio_error *err);
void lio_cursor_close(lio_cursor *c);

/* liblmdb's mdb_cursor_get semantics, state machine included (C_EOF etc.),
 * so that py-lmdb's cursor behaviour follows.  `key`/`data` are inputs for
 * SET*, GET_BOTH* and outputs always.  Errors: lio_cursor_error(c). */
int lio_cursor_get(lio_cursor *c, lio_val *key, lio_val *data,
                   lio_cursor_op op);
/* Values read straight into the caller's memory (one copy from the
 * source, none through the cursor).  With `on`, an operation that lands
 * on a value in an overflow run which is neither in the page cache nor
 * the cursor's last value leaves it unread: data->data NULL, data->size
 * its size.  lio_cursor_value_into then reads it; the checks that need
 * no read (the run within the snapshot) are made by the operation, those
 * of the run's header by lio_cursor_value_into, with the same errors.
 * Off by default; no effect under O_DIRECT (align > 1: the caller's
 * memory is not aligned), where values are read as without it. */
void lio_cursor_defer_values(lio_cursor *c, int on);
/* lio_cursor_defer_values(c, LIO_VALUES_UNWANTED): deferred as with 1, and
 * the caller will likely not ask for them (a walk over keys alone): the
 * value runs ahead are not read ahead. */
#define LIO_VALUES_UNWANTED 2
/* Read the value that the cursor's operations left unread last into dst
 * (its data->size bytes), the run's header in the same request, and
 * check the header.  0, or an error (lio_cursor_error); LIO_EINVAL when
 * no value was left.  Each call reads again. */
int lio_cursor_value_into(lio_cursor *c, void *dst);
/* The value left unread last (lio_cursor_defer_values): its run's first
 * page and its size; 0 when none is waiting. */
uint64_t lio_cursor_pending(const lio_cursor *c, uint32_t *size);

/* A value in an overflow run: the run's first page and the value's size. */
typedef struct lio_value_run {
    uint64_t pgno;
    uint32_t size;
} lio_value_run;
/* The most values lio_cursor_values_into reads in one request (each needs
 * up to three segments: the gap before its run, its header, the value). */
#define LIO_VALUES_MAX ((LIO_READV_MAX + 1) / 3)
/* A batch of values for a forward walk: the value left unread, then those
 * of the next nodes of its leaf whose runs follow in the file (each at
 * most a few pages after the last), up to `max` values (<=
 * LIO_VALUES_MAX) whose runs span at most max_bytes, each value at most
 * LIO_BATCH_VALUE_MAX bytes.  Fills runs[] in walk order (which is file
 * order); returns their number: 0 when no value is waiting, 1 when only
 * that one qualifies (read it with lio_cursor_value_into).  Values of up
 * to 1 MiB: a read request costs more than the copy of a small value
 * (hot, reads of 1 MiB copied 10.3-16.5 GB/s on the test VM, reads of
 * 192 KiB 9.3-11.2 GB/s, of 64 KiB 7.6-10.0 GB/s). */
#define LIO_BATCH_VALUE_MAX (1u << 20)
size_t lio_cursor_plan_values(lio_cursor *c, lio_value_run *runs, size_t max,
                              size_t max_bytes);
/* Read the planned values runs[0..n) into dsts[i] (runs[i].size bytes
 * each) in one request, the runs' headers beside them, and check each
 * header.  *good: how many values from the first on passed (a damaged
 * header stops there: its value is left to lio_cursor_value_into, which
 * raises then, when the cursor gets there).  0, or an error
 * (lio_cursor_error) when the read failed. */
int lio_cursor_values_into(lio_cursor *c, const lio_value_run *runs,
                           size_t n, void *const *dsts, size_t *good);

/* Values read ahead on a thread of the cursor's own (ahead.c), for a
 * forward walk whose values lie in overflow runs out of file order: one
 * request each, which both cores then make.  At most LIO_AHEAD_MAX runs a
 * batch. */
#define LIO_AHEAD_MAX 255
/* The value left unread, then those of the next nodes of its leaf in
 * overflow runs out of file order, up to `max` values whose sizes add up
 * to at most max_bytes, each at most LIO_BATCH_VALUE_MAX: as
 * lio_cursor_plan_values, in walk order.  It stops before two runs that
 * follow each other in file order (lio_cursor_plan_values' batches).
 * 0 or 1 where a batch would not pay: no forward walk, or reads under
 * O_DIRECT (aligned memory only). */
size_t lio_cursor_plan_ahead(lio_cursor *c, lio_value_run *runs, size_t max,
                             size_t max_bytes);
/* Hand runs[0..n) (n <= LIO_AHEAD_MAX) to the cursor's worker, which reads
 * them into dsts[i] from the last back.  The dsts must stay valid until
 * each is taken, the batch dropped or the cursor closed.  0, or -1 when
 * no worker can run (no memory or no thread: read the values alone). */
int lio_cursor_values_ahead(lio_cursor *c, const lio_value_run *runs,
                            size_t n, void *const *dsts);
/* Value i of the batch: read by the worker (waiting for it if it is being
 * read), or here if the worker has not begun it.  0 when it is in its dst
 * and its run's header passed the checks; else -1, and the value must be
 * read alone (lio_cursor_value_into, which reports what is wrong).  No
 * write to dsts[i] follows. */
int lio_cursor_value_ahead(lio_cursor *c, size_t i);
/* Forget the batch: the runs not taken are not read; returns once the
 * worker writes to none of the dsts any more. */
void lio_cursor_values_ahead_drop(lio_cursor *c);

/* Number of duplicates of the current key (1 without DUPSORT). */
int lio_cursor_count(lio_cursor *c, uint64_t *count);
const lio_error *lio_cursor_error(const lio_cursor *c);

/* The common step of a scan without locks or reads: NEXT (forward) or
 * PREV to a neighbour in the current leaf whose value is in the page (or,
 * when the cursor defers values, in an overflow run: left unread).
 * 1 with key/data set; 0 (nothing changed) when lio_cursor_get must do
 * it.  Either way the result is what lio_cursor_get(NEXT / PREV) gives. */
int lio_cursor_step(lio_cursor *c, lio_val *key, lio_val *data, int forward);

/* Does v point into a page the cursor holds (pinned in the cache until
 * the cursor leaves it), rather than into its copy of an overflow value or
 * into the caller's own input? */
int lio_cursor_in_page(const lio_cursor *c, const lio_val *v);

/* mdb_get: a SET on cursor c (reused as scratch).  Once a tree's lookups
 * have paid for it, they find the leaf in a directory of the tree's
 * leaves instead of searching its branch pages (the same leaf). */
int lio_get(lio_cursor *c, const lio_val *key, lio_val *data);
/* Do c's lio_get calls use that directory now? */
int lio_cursor_has_leafdir(const lio_cursor *c);
/* How many of c's lio_get calls read only their record (or nothing, for
 * a key its leaf lacks) rather than the leaf's page. */
uint64_t lio_cursor_gets_by_record(const lio_cursor *c);
/* How many leaves of the tree c's lookups use a scan has noted, after
 * waiting for the scan to end (a scan notes the leaves lookups have not
 * reached, once they reach all over the tree: docs/drop-in.md). */
uint64_t lio_cursor_leaves_scanned(lio_cursor *c);

/* Read-ahead for lookups of keys[0..n) (a batch of gets): the leaves they
 * lead to, found through the branch pages (read when not cached) with the
 * tree's key order, are read together, sorted: while reads come from the
 * device all of them, several in flight (lio_env_set_executor); from the
 * OS cache only leaves next to each other (one request for several), and
 * nothing when a sample of the keys shows them spread thin.  Then their
 * one-page overflow values; longer overflow runs are advised.  Only the
 * first keys whose leaves fit in a quarter of the cache are covered: the
 * number covered (>= 1 when n > 0) is returned, for the caller to look
 * those up before the next call.  The cursor's position is not changed,
 * and nothing is reported: a page that cannot be read or is damaged fails
 * the lookup that needs it.  Without read-ahead (readahead_bytes < 2
 * pages) it reads nothing and covers all n. */
size_t lio_cursor_prefetch(lio_cursor *c, const lio_val *keys, size_t n);

/* ---- planned reads (bulk path) ---------------------------------------- */

/* A read of consecutive file bytes from `off`, scattered into segments
 * segs[first_seg .. first_seg+nseg-1] in order (lio_seg: see the source). */
typedef struct lio_read {
    uint64_t off;
    size_t first_seg;
    size_t nseg;
    size_t len;              /* sum of its segments' lengths */
} lio_read;

typedef struct lio_plan {
    lio_read *reads;
    size_t nreads, reads_cap;
    lio_seg *segs;
    size_t nsegs, segs_cap;
    uint64_t bytes;          /* total bytes the plan reads */
    /* coalescing policy */
    size_t max_gap;          /* merge reads separated by at most this */
    size_t max_read;         /* never build a read longer than this */
    uint8_t *sink;           /* gap bytes land here (max_gap bytes) */
    /* Large reads of cached data may be spread over the executor's
     * threads (each core copies a share) instead of being copied by the
     * calling thread alone: for a plan nothing else reads beside, the
     * index build. */
    int spread;
    /* Optional, set by the plan's maker: an executor that can calls
     * done(done_ctx, i) in the thread that performed read i, once its
     * bytes are in place, so that work on them runs while that core's
     * cache holds them, on every core.  Calls for different reads may run
     * concurrently.  An executor may also never call it: the maker
     * finishes the reads it was not called for once run returns. */
    void (*done)(void *done_ctx, size_t read);
    void *done_ctx;
} lio_plan;

void lio_plan_init(lio_plan *plan, size_t max_gap, size_t max_read);
void lio_plan_reset(lio_plan *plan);
void lio_plan_free(lio_plan *plan);
/* Append `len` file bytes at `off` to go to `dst`.  Offsets must arrive in
 * ascending order; a request that starts at or shortly after the previous
 * one's end joins that read. */
int lio_plan_add(lio_plan *plan, uint64_t off, uint8_t *dst, size_t len);
/* lio_plan_add, but a gap the request bridges is read into gap_dst where
 * it fits in gap_room bytes (else into the sink, as always): *gap its
 * length, or 0 where none was kept.  For a maker that can use the bytes
 * the storage reads anyway. */
int lio_plan_add_keeping_gap(lio_plan *plan, uint64_t off, uint8_t *dst,
                             size_t len, uint8_t *gap_dst, size_t gap_room,
                             size_t *gap);

/* Advice an executor may pass on to the storage's cache. */
#define LIO_ADVISE_WILLNEED 1    /* fetch this range soon, in large reads */
#define LIO_ADVISE_DONTNEED 2    /* this range was consumed: drop it */

/* Read-ahead of dense regions: where at least min_pages of the pages a
 * step reads lie in one aligned region of `region` bytes, the step asks
 * for the whole region (LIO_ADVISE_WILLNEED), so that the storage reads it
 * in a few large requests instead of a request a page.  region 0: never. */
typedef struct lio_readahead {
    size_t region;
    unsigned min_pages;
} lio_readahead;

/* The next region the rule makes dense among pages[*at..n) (page numbers
 * in ascending order, `psize` bytes each): 1 with its number (its offset
 * over ra->region) in *reg, *at moved past its pages; 0 at the end. */
int lio_next_dense_region(const lio_readahead *ra, uint32_t psize,
                          const uint64_t *pages, size_t n, size_t *at,
                          uint64_t *reg);

/* Who performs a plan: the POSIX pool below, or MPI-IO from Python. */
typedef struct lio_executor {
    void *ctx;
    /* Perform every read of the plan.  0, or a negative LIO_* code with err
     * filled in (a short read past the end of the file is LIO_PAGE_NOTFOUND). */
    int (*run)(void *ctx, const lio_plan *plan, lio_error *err);
    /* Optional (NULL: no cache to advise): a hint about [off, off+len). */
    void (*advise)(void *ctx, uint64_t off, uint64_t len, int advice);
} lio_executor;

/* Let the env's cursors read ahead through `ex` (several reads in flight):
 * when a cursor walking its tree enters a leaf that is not cached, the
 * parent's next leaves (in the walk's direction) are read with it.  Without
 * an executor those batches are read one read at a time.  `ex` (copied)
 * must stay usable until lio_env_close, or until a call with NULL. */
void lio_env_set_executor(lio_env *env, const lio_executor *ex);

/* Read as if every read came from the device, never from the OS cache
 * (the timing that tells them apart is then ignored): read-around blocks
 * and every read of a batch in flight.  For tests of that path. */
void lio_env_assume_device(lio_env *env, int on);

/* ---- record index ------------------------------------------------------ */

/* Ordinal <-> (leaf, slot) for one tree of one snapshot, built from the
 * branch levels and the leaf headers (whole leaves for DUPSORT, whose
 * duplicates count as records). */
typedef struct lio_index {
    uint64_t txnid;          /* snapshot it describes */
    uint64_t root;
    uint64_t nleaves;
    uint64_t *leaf_pgno;     /* leaves in key order */
    uint64_t *first;         /* first[i]: ordinal of leaf i's first record;
                              * first[nleaves] = the record count */
    uint64_t pages_read;     /* leaves counted by the build */
    /* Where each record sits in its leaf, or NULL (lio_index_set_map):
     * recmap[ord - first[0]] = node offset (bits 0-15) | key size << 16 |
     * value size << 32 of an inline value, 0 for a record read through its
     * leaf (an overflow value, a node with flags). */
    uint64_t *recmap;
    /* Every leaf in memory, or NULL (lio_index_load_leaves): leaf i at
     * leafmem + i * page size, usable when leaf_ok[i] (it passed the
     * checks a bulk read makes). */
    uint8_t *leafmem;
    uint8_t *leaf_ok;
    /* A build that counts as it goes (lio_index_begin): leaf_pgno holds
     * all tree_leaves leaves of the tree, the first nleaves of them are
     * counted (a partial index from the first record until then), and
     * lio_bulk_extend counts more as reads need them, from the same reads.
     * 0 for an index built or adopted whole. */
    uint64_t tree_leaves;
    /* that build's record map of the counted leaves, in key order, or NULL
     * (a tree that gets none): the index's own map once every leaf is
     * counted (lio_index_built_map), never used for reads before */
    uint64_t *built_map;     /* (entries of the tree: bounded by mapping) */
    int mapping;
    pthread_mutex_t grow;    /* one lio_bulk_extend of it at a time */
    pid_t grow_pid;          /* the process that initialised grow: a forked
                              * child re-initialises it (a parent's lane may
                              * have held it at the fork) */
} lio_index;

/* Read every leaf of the index into memory, with the checks a bulk read
 * makes, so that bulk reads stop reading leaves: for trees whose values
 * live in overflow runs, where the leaves are a small part of the file
 * that shuffled windows would read over and over.  A leaf that fails a
 * check (or its read) is left out: a bulk read that needs it reads it and
 * fails then, as without this.  1 when loaded, 0 when not (out of memory,
 * a failed read, an empty index; nothing changes then). */
int lio_index_load_leaves(lio_index *idx, lio_env *env, const lio_dbrec *db,
                          const lio_executor *ex);

/* A tree gets a record map when its leaves hold at most this many records
 * on average: the map then costs at most 8 bytes x 8 per leaf page, under
 * 2% of the file at 4 KiB pages, and a record is a good share of its leaf. */
#define LIO_RECMAP_PER_LEAF 8

/* ra (NULL: none): the regions where a branch level is dense are asked
 * for whole, where the file fits in half the memory (the leaves around the
 * branch pages are read next). */
int lio_index_build(lio_index **out, lio_env *env, const lio_meta *snap,
                    const lio_dbrec *db, const lio_executor *ex,
                    const lio_readahead *ra, lio_error *err);
/* The same, reading the leaves in rounds of round_bytes (0: 8 MiB).  A
 * round is read, then counted and checked; over a file the OS cache holds,
 * a round the CPU caches keep between the two is faster (the caller knows
 * where its bytes come from: the core does not). */
int lio_index_build_rounds(lio_index **out, lio_env *env,
                           const lio_meta *snap, const lio_dbrec *db,
                           const lio_executor *ex, const lio_readahead *ra,
                           size_t round_bytes, lio_error *err);
/* The two steps of a build, so that ranks can share the second: the leaves
 * in key order (from the branch levels), then the record count of some of
 * them (their headers; whole leaves for DUPSORT). */
int lio_index_leaves(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                     const lio_executor *ex, uint64_t **leaves,
                     uint64_t *nleaves, lio_error *err);
int lio_index_count(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                    const lio_executor *ex, const uint64_t *leaves,
                    uint64_t n, uint64_t *counts, lio_error *err);
/* Index from leaves and first[] = prefix sums of their counts (takes
 * ownership of both arrays; checked against the snapshot).  `partial`: a
 * run of leaves from the first (first[0] = 0) or to the last (first[n] =
 * the record count), as lio_index_build_part makes. */
int lio_index_adopt(lio_index **out, const lio_meta *snap,
                    const lio_dbrec *db, uint64_t nleaves, uint64_t *leaf_pgno,
                    uint64_t *first, int partial, lio_error *err);
/* An index of just the leaves that hold the first `need` records (or,
 * from_end, the last `need`): a shard of the tree counted from its nearer
 * end reads that share of the leaf headers, not all of them.  Ordinals
 * stay those of the whole tree: first[0] is the run's first record.  (A
 * run counted from the end trusts the database record's count.) */
int lio_index_build_part(lio_index **out, lio_env *env, const lio_meta *snap,
                         const lio_dbrec *db, const lio_executor *ex,
                         int from_end, uint64_t need, lio_error *err);
/* An index with every leaf of the tree known (the branch levels read,
 * the leaf list checked) and none counted: bulk reads count leaves as they
 * need them (lio_bulk_extend), so that an epoch in key order reads each
 * leaf once instead of once for the index and once for its records. */
int lio_index_begin(lio_index **out, lio_env *env, const lio_meta *snap,
                    const lio_dbrec *db, const lio_executor *ex,
                    const lio_readahead *ra, lio_error *err);
/* Whether some leaves of a begun index are not counted yet. */
int lio_index_pending(const lio_index *idx);
/* Whether the counted leaves hold ordinal `ord`. */
int lio_index_holds(const lio_index *idx, uint64_t ord);
/* Count the next k leaves of a begun index (leaves nleaves..nleaves+k-1,
 * read into pages[0..k) in key order), checking each header as a build
 * does, and their record-map entries.  Stops without an error at a leaf
 * that fails once the counted leaves hold ordinal `need`; fails with that
 * leaf's error before.  Once the last leaf is counted the total must be
 * the database record's.  checked (NULL, or k flags): set for each leaf
 * counted whose whole page passed lio_check_index_leaf's checks on the
 * way (a tree with a record map checks every node to map it), so that a
 * read of the same bytes need not check them again. */
int lio_index_count_more(lio_index *idx, uint32_t psize, const lio_dbrec *db,
                         const uint8_t *pages, uint64_t k, uint64_t need,
                         uint8_t *checked, lio_error *err);
/* The record map a begun build made, once whole (NULL: none, or not whole
 * yet): *n entries, owned by the index. */
const uint64_t *lio_index_built_map(const lio_index *idx, uint64_t *n);

/* The leaf holding ordinal `ord` (first[0] <= ord < first[nleaves]):
 * O(log leaves). */
uint64_t lio_index_find(const lio_index *idx, uint64_t ord);
/* Give the index a record map of n entries (ownership taken, freed on
 * failure too), as index_build makes or a cache kept it: every entry is
 * checked against the page size and the snapshot's pages first (a damaged
 * map fails naming its record and page). */
int lio_index_set_map(lio_index *idx, uint32_t psize, uint64_t *map,
                      uint64_t n, lio_error *err);
void lio_index_free(lio_index *idx);
/* A 64-bit checksum of n bytes, chained through seed (a checksum of
 * a's bytes then b's: lio_checksum(b, nb, lio_checksum(a, na, 0))).  Not
 * cryptographic: it tells a damaged or truncated cached index (a flipped
 * bit anywhere changes it) at memory speed. */
uint64_t lio_checksum(const void *data, size_t n, uint64_t seed);

/* ---- bulk record reads ------------------------------------------------- */

typedef struct lio_bulk lio_bulk;

int lio_bulk_open(lio_bulk **out, lio_env *env, const lio_meta *snap,
                  const lio_dbrec *db, const lio_index *idx,
                  const lio_executor *ex, lio_error *err);
/* Step 1: read the leaves of these records (any order, repeats allowed)
 * and size them. */
int lio_bulk_prepare(lio_bulk *b, const int64_t *ordinals, size_t n,
                     uint64_t *key_bytes, uint64_t *value_bytes);
/* Step 2: copy keys and values out; overflow values are read straight
 * into vdata.  Offsets arrays hold n+1 entries.  kdata may be NULL to skip
 * keys (then koff is left alone). */
int lio_bulk_fill(lio_bulk *b, uint8_t *kdata, int64_t *koff, uint8_t *vdata,
                  int64_t *voff);

/* Windows: the records prepared in step 1 may be several batches, batch j
 * holding records [ends[j-1], ends[j]) (ends[-1] = 0, ends[nb-1] = n).
 * Each distinct leaf of the window is read once; the window's overflow
 * values are read in one plan, straight into their batches. */
typedef struct lio_batch_out {
    uint8_t *kdata;          /* NULL: no keys for this batch */
    int64_t *koff;           /* records + 1 entries, koff[0] = 0 */
    uint8_t *vdata;
    int64_t *voff;           /* records + 1 entries, voff[0] = 0 */
} lio_batch_out;
/* Key and value bytes of each batch of the prepared window. */
int lio_bulk_batch_sizes(lio_bulk *b, const size_t *ends, size_t nb,
                         uint64_t *key_bytes, uint64_t *value_bytes);
int lio_bulk_fill_batches(lio_bulk *b, const size_t *ends, size_t nb,
                          const lio_batch_out *out);
/* Bytes of leaf pages the last prepare read (each distinct leaf once). */
uint64_t lio_bulk_leaf_bytes(const lio_bulk *b);
/* Count leaves of a begun index (lio_index_begin; the one the reader was
 * opened with) until they hold ordinal `need` (or all of them), reading
 * them through the reader's executor in rounds sized from the records a
 * leaf holds so far; the leaves read stay with the reader (keep) so that
 * the next lio_bulk_prepare takes them instead of reading them again.
 * Extensions of one index run one at a time (its lock; other readers of
 * it may prepare meanwhile). */
int lio_bulk_extend(lio_bulk *b, lio_index *idx, uint64_t need, int keep);
/* Read leaves lo..hi-1 (index positions, counted or not; at most what
 * lio_bulk_extend keeps) into the reader's kept leaves without counting
 * them: a window's leaves read while the window before counts its own, so
 * that its lio_bulk_extend counts them from memory and the next prepare
 * takes them.  A read that fails keeps nothing (the counting reads them
 * again and says what failed). */
int lio_bulk_read_leaves(lio_bulk *b, uint64_t lo, uint64_t hi);

/* Cache policy for executors that have one (advise != NULL).
 * region > 0: a prepare whose leaves fill at least min_pages pages of an
 * aligned region of `region` bytes asks the storage for the whole region
 * (WILLNEED: the kernel reads it in large requests, and later windows find
 * it cached), each region at most once until lio_bulk_new_pass.
 * drop: every range read is dropped from the cache once consumed
 * (DONTNEED), and no region is read ahead. */
void lio_bulk_set_cache(lio_bulk *b, size_t region, unsigned min_pages,
                        int drop);
/* A new pass over the data (an epoch): regions may be advised again. */
void lio_bulk_new_pass(lio_bulk *b);
/* Read-ahead of records to come: advise the regions holding their leaves
 * (by the rule of lio_bulk_set_cache) without reading anything, so the
 * storage fetches them while the current window is read.  Out-of-range
 * ordinals are ignored (they fail when read). */
void lio_bulk_advise(lio_bulk *b, const int64_t *ordinals, size_t n);
const lio_error *lio_bulk_error(const lio_bulk *b);
void lio_bulk_close(lio_bulk *b);
/* For collective executors (MPI-IO): each prepare and each fill runs the
 * executor exactly once, with an empty plan when it has nothing to read or
 * failed before reading, so that every rank joins every collective step. */
void lio_bulk_set_collective(lio_bulk *b, int on);
/* Coalescing policy for both steps (defaults: 64 KiB gap, 8 MiB reads). */
void lio_bulk_set_policy(lio_bulk *b, size_t max_gap, size_t max_read);

/* ---- the window pipeline (pipeline.c) ----------------------------------- */

/* Page-aligned memory of at least `need` bytes (its size in *cap), reused
 * from the blocks given back when one fits, its first `need` bytes mapped
 * in (where the kernel can do that in one call); NULL when memory runs
 * out.  Thread-safe. */
void *lio_block_take(size_t need, size_t *cap);
/* Give a block back for reuse (or free it when enough are idle). */
void lio_block_give(void *p, size_t cap);

#define LIO_PIPELINE_LANES 2
typedef struct lio_pipeline lio_pipeline;

/* What a pipeline reads: positions [start, stop) of a share of an epoch's
 * order, a window of batches at a time. */
typedef struct lio_pipeline_cfg {
    lio_bulk *lanes[LIO_PIPELINE_LANES]; /* a batch reader per lane, used
                                          * only by it while the pipeline
                                          * runs */
    unsigned nlanes;
    lio_env *env;            /* read the newest txnid after each window (a
                              * snapshot read without a reader slot), or
                              * NULL */
    const int64_t *perm;     /* the epoch's order (total ordinals), or NULL:
                              * key order */
    uint64_t total;          /* records in the database */
    uint64_t first;          /* position of the share's first record in the
                              * epoch's order; past total it wraps */
    uint64_t start, stop;    /* positions to read, relative to first */
    size_t batch;            /* records a batch */
    size_t window_bytes;     /* what a window may hold (it grows from
                              * nbatch batches, doubling) */
    size_t prefetch_bytes;   /* what the windows ahead may hold */
    size_t nbatch;           /* batches of the first window */
    unsigned ahead;          /* windows read ahead of the consumer's, until
                              * the first window read here sets it */
    int keys;                /* copy keys out too */
    uint64_t advised;        /* positions before this one were advised */
    /* An epoch in key order over a begun index (lio_index_begin): the
     * windows count its leaves as they read them, in order (the index the
     * lanes' readers were opened with), or NULL: the index is whole. */
    lio_index *grow;
    uint64_t entries;        /* records of the tree (grow) */
    uint64_t basis[2][2];    /* (leaves counted, records they hold) before
                              * the window ahead of window 0, and before
                              * window 0 (grow) */
} lio_pipeline_cfg;

/* A window read: its block (lio_block_give when done), laid out as
 * pipeline.c's head comment says, at these byte offsets.  rc != 0: the
 * window failed (err says why) and has no block; its batches must be read
 * one at a time, so that every batch before a damaged one is delivered. */
typedef struct lio_window {
    uint64_t start;          /* first position */
    size_t n, nb;            /* records, batches */
    uint8_t *block;
    size_t cap;
    size_t voff_at, koff_at, vstart_at, kstart_at, keys_at;
    uint64_t leaf_bytes;     /* leaf pages read */
    uint64_t bytes;          /* leaf pages, keys and values */
    uint64_t newest;         /* the newest txnid after the read (cfg.env) */
    int rc;
    lio_error err;
} lio_window;

typedef struct lio_pipeline_stats {
    uint64_t windows;        /* read whole */
    uint64_t max_bytes;      /* the largest window's bytes */
    uint64_t max_batches;
    uint64_t max_ahead;      /* windows claimed and not taken, at most */
} lio_pipeline_stats;

/* The leaves [*lo, *hi) that a window of a first start in key order
 * (ordinals first_ord..last_ord, ascending) will count, expected from the
 * index as it stood before the window ahead of it counted (`counted`
 * leaves holding `covered` records) at the average records a leaf of the
 * rest holds, with a margin each side: 1/32 of the span and two leaves,
 * or, when the windows before erred by at most `err` leaves (err >= 0;
 * -1: none measured yet), 2 err + 2 leaves if that is less.  The margin's
 * leaves are read by both neighbouring windows: a layout whose leaves
 * hold an even count of records is expected to within a leaf, and a fixed
 * 1/32 read 6% of its leaves twice. */
void lio_leaves_ahead(uint64_t first_ord, uint64_t last_ord, uint64_t counted,
                      uint64_t covered, uint64_t leaves, uint64_t records,
                      double err, uint64_t *lo, uint64_t *hi);

/* How far, in leaves, lio_leaves_ahead's expectation (before its margin)
 * for ordinals first_ord..last_ord fell from the leaves they lie in,
 * [true_lo, true_hi); -1 where it expects nothing. */
double lio_leaves_ahead_error(uint64_t first_ord, uint64_t last_ord,
                              uint64_t counted, uint64_t covered,
                              uint64_t leaves, uint64_t records,
                              uint64_t true_lo, uint64_t true_hi);

/* Start the lanes (threads that block every signal). */
int lio_pipeline_start(lio_pipeline **out, const lio_pipeline_cfg *cfg,
                       lio_error *err);
/* The next window in order, waiting for it; LIO_NOTFOUND after the last,
 * LIO_STOPPED when the pipeline was stopped first (lio_pipeline_stop:
 * the windows not taken are not read), LIO_EINVAL in a forked child (the
 * lanes are the parent's; stop, free and the stats do nothing there). */
#define LIO_STOPPED 2
int lio_pipeline_next(lio_pipeline *p, lio_window *w);
/* The consumer let go of what it held before the window it took last (the
 * batches of the window before, or those read before the pipeline
 * started): one more window may be read ahead.  Windows are read ahead
 * of the ones released, not of the ones taken, so a lane does not take a
 * block while the consumer still holds the one about to come back.  Call
 * it once for each window taken: without it the lanes stop after ahead + 1
 * windows and lio_pipeline_next waits for them. */
void lio_pipeline_release(lio_pipeline *p);
void lio_pipeline_get_stats(lio_pipeline *p, lio_pipeline_stats *st);
/* Stop: each lane finishes the window it is reading and exits (joined
 * here: when several threads stop it at once, each returns only once the
 * lanes are joined); a consumer waiting in lio_pipeline_next returns
 * LIO_STOPPED. */
void lio_pipeline_stop(lio_pipeline *p);
/* Stop, drop the windows not taken and free (no consumer may be inside
 * lio_pipeline_next). */
void lio_pipeline_free(lio_pipeline *p);

/* ---- structural verification (verify.c) -------------------------------- */

typedef struct lio_verify_opts {
    /* Called for each problem found: the page it is on (LIO_NO_PAGE ==
     * UINT64_MAX if none) and a message that names it. */
    void (*report)(void *ctx, uint64_t pgno, const char *msg);
    /* Called (when set) for what a healthy file may show but a reader
     * should know: counts that some liblmdb versions keep inexactly. */
    void (*note)(void *ctx, uint64_t pgno, const char *msg);
    /* Called every progress_every pages read; nonzero stops the walk. */
    int (*progress)(void *ctx, uint64_t pages_done, uint64_t pages_total);
    void *ctx;
    uint64_t progress_every;
    uint64_t max_problems;   /* stop after this many (0: no limit) */
    const void *db_name;     /* only this named DB (NULL: the whole file) */
    size_t db_name_len;
} lio_verify_opts;

typedef struct lio_verify_stats {
    uint64_t problems;
    uint64_t notes;
    uint64_t pages_read;
    uint64_t trees;          /* non-empty trees walked */
    uint64_t named_dbs;
    uint64_t free_pages;     /* pages listed in the free DB */
    uint64_t pages_past_eof; /* pages up to mm_last_pg past the end of file */
} lio_verify_stats;

/* Walk every tree of `snap` (free DB, main DB, named DBs, duplicate
 * sub-trees) and check every invariant of the format, reporting each
 * problem.  0 when the walk finished (st->problems says whether the file is
 * clean), or a negative LIO_* code for what stopped it (I/O error, out of
 * memory, the progress callback, a missing db_name: LIO_NOTFOUND). */
int lio_verify(lio_env *env, const lio_meta *snap, const lio_verify_opts *o,
               lio_verify_stats *st, lio_error *err);

/* ---- copies (copy.c) ------------------------------------------------- */

/* Where a copy's bytes go: 0, or an errno value that stops the copy. */
typedef int (*lio_write_fn)(void *ctx, const void *buf, size_t len);

/* Write meta page pgno (0 or 1) describing m into page (psize bytes): page
 * header, magic, version, mapsize, both database records, last page and
 * txnid.  The other bytes of the page are left as they are. */
void lio_meta_write(uint8_t *page, unsigned pgno, const lio_meta *m);

/* mdb_env_copy with MDB_CP_COMPACT: the snapshot's trees renumbered from
 * page 2, free pages left out, written through `write` byte for byte as
 * liblmdb's `mdb_copy -c` writes them (mapsize: the meta's mm_mapsize;
 * nosubdir: keep MDB_NOSUBDIR in the free DB's flags).  LIO_SYSERR with
 * sys_errno set when `write` fails; LIO_INCOMPATIBLE when the trees and the
 * free-page DB disagree on the page count (a page leak, as liblmdb). */
int lio_compact_copy(lio_env *env, const lio_meta *snap, uint64_t mapsize,
                     int nosubdir, lio_write_fn write, void *ctx,
                     lio_error *err);

/* ---- memory source (memsrc.c): a whole file in a byte buffer ----------- */

typedef struct lio_membuf {
    const uint8_t *data;
    size_t size;
} lio_membuf;
/* A source reading from buf (which must outlive it), and an executor that
 * performs plans by copying from it (fuzzing, tests). */
void lio_mem_source(lio_source *src, lio_membuf *buf);
void lio_mem_executor(lio_executor *ex, lio_membuf *buf);

/* ---- posix source (io_posix.c) --------------------------------------- */

typedef struct lio_posix lio_posix;
/* Open a data file read-only.  direct: O_DIRECT with aligned buffers, an
 * error naming the path where the filesystem refuses it. */
int lio_posix_open(lio_posix **out, const char *path, int direct,
                   lio_error *err);
void lio_posix_get_source(lio_posix *p, lio_source *src);
void lio_posix_close(lio_posix *p);
/* Read errors: EINTR is retried (1000 times in a row at most), a short
 * read is continued, EIO is retried
 * twice, and a read that meets the end of the file inside a range the file
 * size said exists is retried after a new stat (the file shrank): what
 * persists is LIO_SYSERR with sys_errno and off set.
 *
 * Fault injection (test builds compiled with -DLMDBIO_FAULT_INJECTION only):
 * lio_posix_open reads $LMDBIO_FAULT, "MODE[,at=OFF][,after=N][,times=M]"
 * with MODE eio | eintr | short | zero: reads whose range covers byte OFF
 * (any read without at=), after the first N such reads, at most M times,
 * fail with EIO / EINTR, return half the bytes asked for, or return 0 (end
 * of file).  Returns 1 and the number of faults injected so far in this
 * process when compiled in, else 0. */
int lio_fault_injection(uint64_t *injected);

/* A pool of reader threads performing plans with preadv on a posix source
 * (several requests in flight for high-latency storage).  Requests and
 * bytes are counted for the benchmarks, read-ahead advice given and
 * skipped (the region was cached), and planned gaps that reads found cached
 * skipped instead of copying, for the tests. */
typedef struct lio_pool lio_pool;
int lio_pool_open(lio_pool **out, lio_posix *p, unsigned nthreads,
                  lio_error *err);
void lio_pool_get_executor(lio_pool *pool, lio_executor *ex);
void lio_pool_stats(const lio_pool *pool, uint64_t *requests, uint64_t *bytes);
void lio_pool_advice(const lio_pool *pool, uint64_t *given, uint64_t *skipped);
uint64_t lio_pool_gaps_skipped(const lio_pool *pool);
void lio_pool_close(lio_pool *pool);
/* A lane of a pool: an executor that performs the reads the page cache
 * holds in the calling thread through its own open file description of
 * the pool's file (threads sharing one contend on its reference count),
 * and hands the rest to the pool.  Without /proc (or under O_DIRECT or the
 * fault hook) it reads through the pool's description: own_fd says which.
 * Close every lane before its pool. */
typedef struct lio_pool_lane lio_pool_lane;
int lio_pool_lane_open(lio_pool_lane **out, lio_pool *pool, lio_error *err);
void lio_pool_lane_get_executor(lio_pool_lane *l, lio_executor *ex);
int lio_pool_lane_own_fd(const lio_pool_lane *l);
void lio_pool_lane_close(lio_pool_lane *l);

#ifdef __cplusplus
}
#endif
#endif
