/* Internal definitions shared by the core's translation units.  Not part of
 * the public interface (lmdbio.h). */
#ifndef LMDBIO_CORE_H
#define LMDBIO_CORE_H

#include <pthread.h>
#include <string.h>

#include "lmdbio.h"

/* ---- on-disk layout (docs/format.md) ---------------------------------- */
#define PAGEHDRSZ 16
#define NODEHDRSZ 8
#define DBREC_SIZE 48

#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define P_META 0x08
#define P_DIRTY 0x10
#define P_LEAF2 0x20
#define P_SUBP 0x40

#define F_BIGDATA 0x01
#define F_SUBDATA 0x02
#define F_DUPDATA 0x04

#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_DATA_VERSION 1u
#define META_TXNID_OFF 144
#define META_END 152 /* bytes of a meta page that hold the meta struct */

/* Little-endian loads from possibly unaligned bytes. */
static inline uint16_t ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Page header fields. */
static inline uint64_t pg_pgno(const uint8_t *p) { return ld64(p); }
static inline uint16_t pg_pad(const uint8_t *p) { return ld16(p + 8); }
static inline uint16_t pg_flags(const uint8_t *p) { return ld16(p + 10); }
static inline uint16_t pg_lower(const uint8_t *p) { return ld16(p + 12); }
static inline uint16_t pg_upper(const uint8_t *p) { return ld16(p + 14); }
static inline uint32_t pg_ovpages(const uint8_t *p) { return ld32(p + 12); }
static inline unsigned pg_numkeys(const uint8_t *p) { return (pg_lower(p) - PAGEHDRSZ) >> 1; }
static inline const uint8_t *pg_node(const uint8_t *p, unsigned i) {
    return p + ld16(p + PAGEHDRSZ + 2 * i);
}

/* Node fields. */
static inline uint32_t nd_dsize(const uint8_t *n) { return (uint32_t)ld16(n) | ((uint32_t)ld16(n + 2) << 16); }
static inline uint64_t nd_child(const uint8_t *n) {
    return (uint64_t)ld16(n) | ((uint64_t)ld16(n + 2) << 16) | ((uint64_t)ld16(n + 4) << 32);
}
static inline uint16_t nd_flags(const uint8_t *n) { return ld16(n + 4); }
static inline uint16_t nd_ksize(const uint8_t *n) { return ld16(n + 6); }
static inline const uint8_t *nd_key(const uint8_t *n) { return n + NODEHDRSZ; }
static inline const uint8_t *nd_data(const uint8_t *n) { return n + NODEHDRSZ + nd_ksize(n); }
/* A leaf node's bytes in its page: header, key, and its value or (in an
 * overflow run) the run's page number. */
static inline size_t nd_span(const uint8_t *n) {
    return NODEHDRSZ + (size_t)nd_ksize(n) + (nd_flags(n) & F_BIGDATA ? 8 : nd_dsize(n));
}

/* ---- page format (format.c): bytes in, no I/O --------------------------- */

void lio_parse_dbrec(const uint8_t *p, lio_dbrec *db);

/* A meta page's header and struct (avail bytes at p) into *m, checked as
 * liblmdb checks it when it opens an environment (P_META, magic, version). */
int lio_parse_meta_header(const uint8_t *p, size_t avail, uint64_t pgno,
                          lio_meta *m, lio_error *err);
/* The same, and a page size lmdbio reads (a power of two, 512..32768). */
int lio_parse_meta(const uint8_t *p, size_t avail, uint64_t pgno,
                   lio_meta *m, lio_error *err);

/* Checks of a meta that need the whole snapshot: record flags, roots. */
int lio_check_snapshot(const lio_meta *m, uint64_t pgno, lio_error *err);

/* The checks of a leaf read for a bulk read (index.c): its header, the
 * page, and the record count the index gave it (`want`). */
int lio_check_index_leaf(const uint8_t *p, uint32_t psize, uint64_t pgno,
                         uint64_t want, int dupsort, lio_error *err);

/* Checks of a leaf's 16-byte header alone (the index reads no more). */
int lio_check_leaf_header(const uint8_t *p, uint32_t psize, uint64_t pgno,
                          lio_error *err);

/* Records a leaf holds when duplicates count (DUPSORT trees). */
int lio_leaf_dup_records(const uint8_t *p, uint32_t psize, uint64_t pgno,
                         uint64_t *count, lio_error *err);

/* Structural checks of a branch/leaf page that need no tree context. */
int lio_check_page(const uint8_t *p, uint32_t size, uint64_t pgno, int subpage,
                   lio_error *err);

/* qsort order of uint64_t values. */
int lio_cmp_u64(const void *a, const void *b);
/* Sort n elements of `words` (1..4) uint64_t each by their first word,
 * stably (a radix sort over the bits in use: offsets and page numbers of
 * a window sort in a few linear passes, where qsort's comparisons cost
 * more than the rest of planning the window). */
void lio_sort_u64(uint64_t *a, size_t n, size_t words);
/* Grow *arr (*cap elements of elem bytes) to hold at least need elements,
 * doubling; 0, or -1 (nothing changed) when memory runs out. */
int lio_grow(void **arr, size_t *cap, size_t need, size_t elem);
/* Lock m, made anew first in a process other than *made_by's: a forked
 * child lacks the thread that may have held it at the fork. */
void lio_lock_here(pthread_mutex_t *m, pid_t *made_by);

/* ---- key order (docs/format.md) --------------------------------------- */
enum { LIO_CMP_MEMN, LIO_CMP_MEMNR, LIO_CMP_INT };
/* liblmdb's comparators: memcmp then length, the same from the end, or
 * native unsigned integers compared over a's size. */
int lio_cmp(int kind, const lio_val *a, const lio_val *b);
int lio_key_cmp_kind(uint16_t db_flags);
int lio_dup_cmp_kind(uint16_t db_flags);

/* ---- errors (errors.c) -------------------------------------------------- */
int lio_fail(lio_error *err, int code, uint64_t pgno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int lio_fail_sys(lio_error *err, int sys_errno, uint64_t off, const char *what);
#define LIO_NO_PAGE UINT64_MAX

/* ---- page cache (pager.c) ---------------------------------------------- */
typedef struct lio_page {
    uint64_t pgno;
    uint64_t txnid;          /* snapshot the page was read for */
    struct lio_page *hnext;  /* hash chain */
    struct lio_page *prev, *next; /* LRU list (unpinned pages only) */
    unsigned pins;
    int checked;             /* passed lio_check_page() */
    int ra;                  /* RA_*: how read-ahead brought it (pager.c) */
    uint8_t *data;           /* psize bytes, aligned */
} lio_page;

struct lio_slab {            /* cache entries allocated together */
    struct lio_slab *next;
    void *data;              /* n page buffers */
    size_t n;
    lio_page pages[];
};

/* A worker thread reading value runs into the caller's memory (ahead.c,
 * for lio_cursor_values_ahead): post a batch, take each run in order,
 * or drop the rest. */
typedef struct lio_ahead lio_ahead;
lio_ahead *lio_ahead_new(lio_env *env);
/* 0, or -1 when no thread can start (or n is out of range). */
int lio_ahead_post(lio_ahead *a, const lio_value_run *runs, size_t n,
                   void *const *dsts);
/* Run i read into its dst: its header, or NULL when its read failed. */
const uint8_t *lio_ahead_take(lio_ahead *a, size_t i, lio_error *err);
const lio_value_run *lio_ahead_run(const lio_ahead *a, size_t i);
void lio_ahead_drop(lio_ahead *a);
void lio_ahead_free(lio_ahead *a);

/* The leaf directory of one tree (leafdir.c), keyed by snapshot and root:
 * lookups counted until one is built, then shared by every cursor on it. */
typedef struct lio_leafdir lio_leafdir;
#define LIO_LEAFDIR_SLOTS 4
typedef struct lio_leafdir_slot {
    uint64_t txnid, root;
    uint64_t lookups;        /* descents counted so far */
    lio_leafdir *dir;        /* built (a reference), or NULL */
    int used, building, failed;
} lio_leafdir_slot;

struct lio_env {
    lio_source src;
    uint32_t psize;
    size_t align;            /* read alignment: max(src.align, 1) */
    uint64_t file_size;      /* refreshed when a read would pass it */
    pthread_mutex_t lock;    /* guards the cache and file_size */
    lio_page **table;
    size_t table_size;
    size_t npages, max_pages;
    lio_page lru;            /* sentinel: lru.next is the least recent */
    struct lio_slab *slabs;  /* every entry's memory; slabs->pages[slab_used
                              * ..] not handed out yet */
    size_t slab_used;
    size_t readahead_pages;   /* leaves a cursor reads ahead (0/1: none) */
    /* Tree-following read-ahead (lio_page_prefetch), one batch at a time
     * under ra_lock: */
    pthread_mutex_t ra_lock;
    lio_executor ex;          /* several reads in flight; ex.run NULL: serial */
    lio_plan plan;            /* reused for every batch */
    int plan_ready;
    lio_page *spare;          /* entries of dropped batches (hnext chain) */
    int device_reads;         /* slow-read score (pager.c; no lock: a
                               * hint) */
    int assume_device;        /* lio_env_assume_device */
    unsigned reads_seen;      /* reads of single pages and of overflow
                               * values, for the choice of those timed
                               * (pager.c; no lock: a hint) */
    long inblock;             /* the process's blocks read in, last seen */
    uint8_t *around_map;      /* blocks read around (pager.c) */
    uint8_t *around_sink;     /* where their unwanted pages are read */
    uint64_t around_bits;
    uint64_t sweep;           /* the next block lookups may ask the OS for
                               * (pager.c's sweep_ahead) */
    int fits_memory;          /* lio_env_fits_memory: 1 yes, -1 no, 0 not
                               * asked yet */
    uint64_t *ghost;          /* pgnos of lookup leaves recycled at once
                               * (pager.c; ghost_size slots, hashed) */
    size_t ghost_size;
    lio_leafdir_slot leafdirs[LIO_LEAFDIR_SLOTS];  /* under lock */
    struct lio_leafscan *scan;   /* leafdir.c's thread noting a tree's
                                  * leaves (one at a time; under lock) */
};

/* Fetch page pgno of snapshot `snap`, validated as a tree page and pinned.
 * A miss reads that page alone (read-ahead is lio_page_prefetch), except
 * with LIO_GET_AROUND while reads come from the device rather than the OS
 * cache: then the aligned block around it too.  LIO_GET_ONCE: the leaf of
 * a lookup, likely not wanted again soon (random gets over a file larger
 * than the cache): once the cache is full it is recycled first, unless it
 * was missed recently too (then it is kept like any page).  With
 * LIO_GET_SPARSE (a tree whose leaves outnumber the cache's pages, the
 * leaf directory's record table answering most lookups) that holds from
 * the first miss on, not once the cache is full: a lookup then reuses one
 * entry, cached by the CPU, instead of new memory the kernel must zero. */
#define LIO_GET_AROUND 1
#define LIO_GET_ONCE 2
#define LIO_GET_SPARSE 4
int lio_page_get(lio_env *env, const lio_meta *snap, uint64_t pgno,
                 int how, lio_page **out, lio_error *err);
void lio_page_unpin(lio_env *env, lio_page *pg);

/* Page pgno of snapshot `snap` pinned if it is in the cache, unchecked
 * (an overflow page: the caller checks it), else NULL.  No read. */
lio_page *lio_page_peek(lio_env *env, const lio_meta *snap, uint64_t pgno);

/* Is page pgno of snapshot `snap` in the cache?  (No read.) */
int lio_page_cached(lio_env *env, const lio_meta *snap, uint64_t pgno);

/* Do reads come from the device now, rather than from the OS cache?  (A
 * hint from the timing of recent reads, or lio_env_assume_device.) */
int lio_env_from_device(lio_env *env);

/* The read size for storage with no device of its own (a network or FUSE
 * filesystem: lio_source.counted_reads is 0): it serves a larger read as
 * requests of this size one after the other, a round trip each, so the
 * page cache's read-around (pager.c) and a source's read of an advised
 * region (io_posix.c) issue reads of this size, all in flight at once.
 * 128 KiB: what the kernel's read-ahead asks such a filesystem for. */
#define LIO_NET_READ (128u << 10)

/* Read-ahead: bring the pages pgnos[0..n) that are not cached yet into the
 * cache, in one plan run by the env's executor (several reads in flight,
 * neighbours coalesced).  At most readahead_pages of them, and never a
 * check: a damaged page is reported only when a cursor fetches it.  A read
 * that fails drops the batch and reports nothing (the cursor's own read of
 * the page it needs reports the error). */
#define LIO_PREFETCH_MAX 256
void lio_page_prefetch(lio_env *env, const lio_meta *snap,
                       const uint64_t *pgnos, size_t n);
/* lio_page_prefetch, also reading and keeping in the cache the pages
 * between those wanted, where they are up to 16 pages apart (from the OS
 * cache only): the one-page values an appending writer put next to the
 * leaves. */
void lio_page_prefetch_with_gaps(lio_env *env, const lio_meta *snap,
                                 const uint64_t *pgnos, size_t n);
/* lio_page_prefetch without the blocks around the pages (from a device,
 * a page is otherwise read with its aligned block, as a mapping's fault
 * reads around itself): for pages among others nobody will want. */
void lio_page_prefetch_alone(lio_env *env, const lio_meta *snap,
                             const uint64_t *pgnos, size_t n);

/* From the device: ask the OS to read, in the background, the blocks
 * around pages pgnos[0..n) that were not read around yet, except those
 * near page `at` (where a walk is: the OS reads ahead of it there). */
void lio_page_advise_around(lio_env *env, const lio_meta *snap, uint64_t at,
                            const uint64_t *pgnos, size_t n);
/* How far, in pages, the OS reads ahead of reads in file order when that
 * reaches past lio_page_advise_around's blocks (2 MiB); else 0 (a small
 * window: read-ahead in file order is then lmdbio's to ask for). */
uint64_t lio_os_window_pages(const lio_env *env);
/* From the device: ask the OS, in the background, for the blocks after
 * page `at`'s up to the one holding page at + pages, those not read around
 * yet (the lead of a walk in file order). */
void lio_page_advise_ahead(lio_env *env, const lio_meta *snap, uint64_t at,
                           uint64_t pages);
/* Whether the data file fits in half the memory, so that the OS keeps
 * blocks read ahead of their use (the file's size at snap; asked once). */
int lio_env_fits_memory(lio_env *env, const lio_meta *snap);

/* Read len bytes at file offset off into a buffer that the caller frees
 * with free(); *data points at the first wanted byte.  Fails (without
 * allocating) when the range passes the end of the file. */
int lio_read_range(lio_env *env, uint64_t off, size_t len, uint8_t **buf,
                   const uint8_t **data, uint64_t pgno, lio_error *err);
/* len bytes at off into buf, through the OS's cache where the source
 * has a way around its bypass (lio_source.read_cached): small reads made
 * again and again, as the meta pages.  Fails when the range passes the
 * end of the file. */
int lio_read_small(lio_env *env, uint64_t off, size_t len, uint8_t *buf,
                   uint64_t pgno, lio_error *err);
/* Like lio_read_range into a caller-kept growing buffer (reused). */
int lio_read_into(lio_env *env, uint64_t off, size_t len, uint8_t **buf,
                  size_t *cap, const uint8_t **data, uint64_t pgno,
                  lio_error *err);

/* Read consecutive file bytes at off into segs[0..nseg) (at most
 * LIO_READV_MAX), in one request where the source can scatter (an
 * overflow run's header and its value into different buffers).  Fails
 * when the range passes the end of the file.  Sources with align 1 only. */
int lio_read_segs(lio_env *env, uint64_t off, const lio_seg *segs,
                  size_t nseg, uint64_t pgno, lio_error *err);

/* Is [off, off+len) inside the data file?  LIO_PAGE_NOTFOUND naming pgno
 * if not (the size is re-read once: a live writer grows the file). */
int lio_check_extent(lio_env *env, uint64_t off, size_t len, uint64_t pgno,
                     lio_error *err);


/* Free the page cache and the env (the env's layer frees what it added
 * first: lio_env_close). */
void lio_cache_close(lio_env *env);

/* ---- leaf directories (leafdir.c) ------------------------------------- */

/* The leaf directory of tree `db` in snapshot `snap`, referenced, in *out
 * once the tree's lookups have paid for building it (NULL until then).
 * Each call counts a lookup.  Returns 0 when the tree never has one (not
 * memcmp key order, a single page, too large for half the cache budget,
 * or bounds out of order): the caller stops asking. */
int lio_leafdir_get(lio_env *env, const lio_meta *snap, const lio_dbrec *db,
                    lio_leafdir **out);
/* The leaf (its index in key order) a descent from the root would reach
 * for `key`, and that leaf's page number. */
size_t lio_leafdir_find(const lio_leafdir *d, const lio_val *key);
uint64_t lio_leafdir_pgno(const lio_leafdir *d, size_t j);

/* The record table: where the records of the leaves lookups have read
 * sit, found by a hash of the key, so that a lookup reads the record
 * alone (and nothing, for a key absent from a leaf whose records are all
 * noted). */
typedef struct lio_recspan {
    uint64_t pgno;           /* its leaf */
    uint16_t off, len;       /* its node there: header, key and value (an
                              * overflow run's page number) */
} lio_recspan;
uint64_t lio_key_hash(const lio_val *key);
/* Does d keep a record table? */
int lio_leafdir_has_records(const lio_leafdir *d);
/* The next record (from *pos = (size_t)-1 on) whose key's hash may be h:
 * 1 and *out, or 0 when there is none left.  Lock-free. */
int lio_leafdir_next_record(const lio_leafdir *d, uint64_t h, size_t *pos,
                            lio_recspan *out);
/* Count a lookup of the record in slot pos (from lio_leafdir_next_record):
 * is it part of a working set, looked up often lately?  Then its lookups
 * go through the page cache. */
int lio_leafdir_working_set(lio_leafdir *d, size_t pos);
/* Are all the records of leaf j in the table? */
int lio_leafdir_noted(const lio_leafdir *d, size_t j);
/* Note the records of leaf j from its page, read and checked by a lookup
 * (thread-safe; once per leaf).  A leaf holding a record that is not a
 * plain value, or more than the table has room for, is left to page
 * reads.  Once lookups have noted a share of the tree's leaves, a thread
 * of env's notes the rest (leafdir.c's scan). */
void lio_leafdir_note(lio_env *env, lio_leafdir *d, size_t j,
                      const uint8_t *page, uint32_t psize);
/* Wait for d's scan, if one runs; the leaves it noted. */
uint64_t lio_leafdir_scan_wait(lio_env *env, const lio_leafdir *d);
/* Stop and join env's scan (lio_env_close, before the directories go). */
void lio_leafdir_scan_stop(lio_env *env);
/* Drop a reference from lio_leafdir_get. */
void lio_leafdir_release(lio_env *env, lio_leafdir *d);
/* Drop the env's own references (lio_env_close). */
void lio_leafdirs_free(lio_env *env);

#endif
