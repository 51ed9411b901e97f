# Declarations of the C core (csrc/lmdbio.h, lockfile.h, datum.h) for every
# Cython module: the one place the C API is declared.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int32_t, int64_t


cdef extern from "lmdbio.h" nogil:
    enum:
        LIO_SUCCESS
        LIO_RETRY
        LIO_NOTFOUND
        LIO_PAGE_NOTFOUND
        LIO_CORRUPTED
        LIO_VERSION_MISMATCH
        LIO_INVALID
        LIO_INCOMPATIBLE
        LIO_BAD_VALSIZE
        LIO_EINVAL
        LIO_ENOMEM
        LIO_SYSERR
        LIO_MAX_KEY_SIZE
        LIO_MAX_DEPTH
        LIO_REVERSEKEY
        LIO_DUPSORT
        LIO_INTEGERKEY
        LIO_DUPFIXED
        LIO_INTEGERDUP
        LIO_REVERSEDUP
        LIO_PERSISTENT_FLAGS

    uint64_t LIO_EMPTY_ROOT

    ctypedef struct lio_error:
        int code
        int sys_errno
        uint64_t pgno
        char msg[256]
        uint64_t off

    ctypedef struct lio_val:
        const uint8_t *data
        size_t size

    ctypedef struct lio_source:
        void *ctx
        int64_t (*read)(void *ctx, uint64_t off, void *buf, size_t len) noexcept nogil
        int64_t (*size)(void *ctx) noexcept nogil
        size_t align
        int counted_reads
        uint64_t os_readahead
        int64_t (*read_cached)(void *ctx, uint64_t off, void *buf, size_t len) noexcept nogil

    ctypedef struct lio_dbrec:
        uint32_t pad
        uint16_t flags
        uint16_t depth
        uint64_t branch_pages
        uint64_t leaf_pages
        uint64_t overflow_pages
        uint64_t entries
        uint64_t root

    ctypedef struct lio_meta:
        uint32_t psize
        uint32_t env_flags
        uint64_t mapsize
        uint64_t address
        uint64_t last_pg
        uint64_t txnid
        lio_dbrec free_db
        lio_dbrec main_db

    ctypedef struct lio_env:
        pass
    ctypedef struct lio_cursor:
        pass

    int lio_env_open(lio_env **out, const lio_source *src, size_t cache_bytes,
                     size_t readahead_bytes, lio_error *err)
    void lio_env_close(lio_env *env)
    uint32_t lio_env_psize(const lio_env *env)
    int lio_env_read_metas(lio_env *env, lio_meta metas[2], lio_error *err)
    int lio_read_header(const lio_source *src, lio_meta *out, lio_error *err)
    int lio_decode_dbrec(const uint8_t *p, size_t len, lio_dbrec *db)
    uint64_t lio_free_record(const uint8_t *p, size_t len, uint64_t *count)
    uint64_t lio_free_page(const uint8_t *p, uint64_t i)
    uint64_t lio_free_key(const uint8_t *p, size_t len)
    int lio_env_snapshot(lio_env *env, uint64_t txnid, lio_meta *out,
                         lio_error *err)
    int lio_named_db(lio_env *env, const lio_meta *snap, const void *name,
                     size_t len, lio_dbrec *out, lio_error *err)
    int lio_check_dbrec(const lio_dbrec *db, uint64_t pgno, lio_error *err)

    ctypedef enum lio_cursor_op:
        LIO_FIRST
        LIO_FIRST_DUP
        LIO_GET_BOTH
        LIO_GET_BOTH_RANGE
        LIO_GET_CURRENT
        LIO_GET_MULTIPLE
        LIO_LAST
        LIO_LAST_DUP
        LIO_NEXT
        LIO_NEXT_DUP
        LIO_NEXT_MULTIPLE
        LIO_NEXT_NODUP
        LIO_PREV
        LIO_PREV_DUP
        LIO_PREV_NODUP
        LIO_SET
        LIO_SET_KEY
        LIO_SET_RANGE
        LIO_PREV_MULTIPLE

    int lio_cursor_open(lio_cursor **out, lio_env *env, const lio_meta *snap,
                        const lio_dbrec *db, lio_error *err)
    void lio_cursor_close(lio_cursor *c)
    int lio_cursor_get(lio_cursor *c, lio_val *key, lio_val *data,
                       lio_cursor_op op)
    int lio_cursor_count(lio_cursor *c, uint64_t *count)
    const lio_error *lio_cursor_error(const lio_cursor *c)
    int lio_get(lio_cursor *c, const lio_val *key, lio_val *data)
    int lio_cursor_has_leafdir(const lio_cursor *c)
    uint64_t lio_cursor_gets_by_record(const lio_cursor *c)
    uint64_t lio_cursor_leaves_scanned(lio_cursor *c)
    size_t lio_cursor_prefetch(lio_cursor *c, const lio_val *keys, size_t n)
    int lio_cursor_step(lio_cursor *c, lio_val *key, lio_val *data,
                        int forward)
    int lio_cursor_in_page(const lio_cursor *c, const lio_val *v)
    void lio_cursor_defer_values(lio_cursor *c, int on)
    enum: LIO_VALUES_UNWANTED
    int lio_cursor_value_into(lio_cursor *c, void *dst)
    uint64_t lio_cursor_pending(const lio_cursor *c, uint32_t *size)
    ctypedef struct lio_value_run:
        uint64_t pgno
        uint32_t size
    enum: LIO_VALUES_MAX
    size_t lio_cursor_plan_values(lio_cursor *c, lio_value_run *runs,
                                  size_t max, size_t max_bytes)
    int lio_cursor_values_into(lio_cursor *c, const lio_value_run *runs,
                               size_t n, void *const *dsts, size_t *good)
    enum: LIO_AHEAD_MAX
    size_t lio_cursor_plan_ahead(lio_cursor *c, lio_value_run *runs,
                                 size_t max, size_t max_bytes)
    int lio_cursor_values_ahead(lio_cursor *c, const lio_value_run *runs,
                                size_t n, void *const *dsts)
    int lio_cursor_value_ahead(lio_cursor *c, size_t i)
    void lio_cursor_values_ahead_drop(lio_cursor *c)

    ctypedef struct lio_posix:
        pass
    int lio_posix_open(lio_posix **out, const char *path, int direct,
                       lio_error *err)
    void lio_posix_get_source(lio_posix *p, lio_source *src)
    void lio_posix_close(lio_posix *p)
    int lio_fault_injection(uint64_t *injected)

    # copies (csrc/copy.c)
    ctypedef int (*lio_write_fn)(void *ctx, const void *buf, size_t len) noexcept nogil
    void lio_meta_write(uint8_t *page, unsigned pgno, const lio_meta *m)
    int lio_compact_copy(lio_env *env, const lio_meta *snap, uint64_t mapsize,
                         int nosubdir, lio_write_fn write, void *ctx,
                         lio_error *err) nogil

    # structural verification (csrc/verify.c)
    ctypedef struct lio_verify_opts:
        void (*report)(void *ctx, uint64_t pgno, const char *msg) noexcept nogil
        void (*note)(void *ctx, uint64_t pgno, const char *msg) noexcept nogil
        int (*progress)(void *ctx, uint64_t pages_done, uint64_t pages_total) noexcept nogil
        void *ctx
        uint64_t progress_every
        uint64_t max_problems
        const void *db_name
        size_t db_name_len
    ctypedef struct lio_verify_stats:
        uint64_t problems
        uint64_t notes
        uint64_t pages_read
        uint64_t trees
        uint64_t named_dbs
        uint64_t free_pages
        uint64_t pages_past_eof
    int lio_verify(lio_env *env, const lio_meta *snap, const lio_verify_opts *o,
                   lio_verify_stats *st, lio_error *err)

    # planned reads, the record index and bulk reads (the Reader's path)
    ctypedef struct lio_read:
        uint64_t off
        size_t first_seg
        size_t nseg
        size_t len
    ctypedef struct lio_seg:
        uint8_t *dst
        size_t len
    ctypedef struct lio_plan:
        lio_read *reads
        size_t nreads
        lio_seg *segs
        size_t nsegs
    void lio_plan_init(lio_plan *plan, size_t max_gap, size_t max_read)
    void lio_plan_free(lio_plan *plan)
    int lio_plan_add(lio_plan *plan, uint64_t off, uint8_t *dst, size_t len)
    ctypedef int (*lio_run_fn)(void *ctx, const lio_plan *plan,
                               lio_error *err) noexcept nogil
    ctypedef void (*lio_advise_fn)(void *ctx, uint64_t off, uint64_t len,
                                   int advice) noexcept nogil
    ctypedef struct lio_executor:
        void *ctx
        lio_run_fn run
        lio_advise_fn advise
    ctypedef struct lio_readahead:
        size_t region
        unsigned min_pages
    ctypedef struct lio_index:
        uint64_t txnid
        uint64_t root
        uint64_t nleaves
        uint64_t *leaf_pgno
        uint64_t *first
        uint64_t pages_read
        uint64_t *recmap
        uint8_t *leafmem
        uint64_t tree_leaves
    ctypedef struct lio_pool:
        pass
    ctypedef struct lio_bulk:
        pass

    int lio_pool_open(lio_pool **out, lio_posix *p, unsigned nthreads,
                      lio_error *err)
    void lio_pool_get_executor(lio_pool *pool, lio_executor *ex)
    void lio_pool_stats(const lio_pool *pool, uint64_t *requests,
                        uint64_t *nbytes)
    void lio_pool_advice(const lio_pool *pool, uint64_t *given,
                         uint64_t *skipped)
    uint64_t lio_pool_gaps_skipped(const lio_pool *pool)
    void lio_pool_close(lio_pool *pool)
    ctypedef struct lio_pool_lane:
        pass
    int lio_pool_lane_open(lio_pool_lane **out, lio_pool *pool,
                           lio_error *err)
    void lio_pool_lane_get_executor(lio_pool_lane *l, lio_executor *ex)
    int lio_pool_lane_own_fd(const lio_pool_lane *l)
    void lio_pool_lane_close(lio_pool_lane *l)
    void lio_env_set_executor(lio_env *env, const lio_executor *ex)
    void lio_env_assume_device(lio_env *env, int on)

    int lio_index_build(lio_index **out, lio_env *env, const lio_meta *snap,
                        const lio_dbrec *db, const lio_executor *ex,
                        const lio_readahead *ra, lio_error *err)
    int lio_index_build_rounds(lio_index **out, lio_env *env,
                               const lio_meta *snap, const lio_dbrec *db,
                               const lio_executor *ex,
                               const lio_readahead *ra, size_t round_bytes,
                               lio_error *err)
    int lio_index_leaves(lio_env *env, const lio_meta *snap,
                         const lio_dbrec *db, const lio_executor *ex,
                         uint64_t **leaves, uint64_t *nleaves, lio_error *err)
    int lio_index_count(lio_env *env, const lio_meta *snap,
                        const lio_dbrec *db, const lio_executor *ex,
                        const uint64_t *leaves, uint64_t n, uint64_t *counts,
                        lio_error *err)
    int lio_index_adopt(lio_index **out, const lio_meta *snap,
                        const lio_dbrec *db, uint64_t nleaves,
                        uint64_t *leaf_pgno, uint64_t *first, int partial,
                        lio_error *err)
    int lio_index_build_part(lio_index **out, lio_env *env,
                             const lio_meta *snap, const lio_dbrec *db,
                             const lio_executor *ex, int from_end,
                             uint64_t need, lio_error *err)
    void lio_index_free(lio_index *idx)
    int lio_index_load_leaves(lio_index *idx, lio_env *env,
                              const lio_dbrec *db, const lio_executor *ex)
    int lio_index_set_map(lio_index *idx, uint32_t psize, uint64_t *map,
                          uint64_t n, lio_error *err)
    int lio_index_begin(lio_index **out, lio_env *env, const lio_meta *snap,
                        const lio_dbrec *db, const lio_executor *ex,
                        const lio_readahead *ra, lio_error *err)
    int lio_index_pending(const lio_index *idx)
    int lio_index_holds(const lio_index *idx, uint64_t ord)
    const uint64_t *lio_index_built_map(const lio_index *idx, uint64_t *n)
    uint64_t lio_checksum(const void *data, size_t n, uint64_t seed)

    int lio_bulk_open(lio_bulk **out, lio_env *env, const lio_meta *snap,
                      const lio_dbrec *db, const lio_index *idx,
                      const lio_executor *ex, lio_error *err)
    int lio_bulk_prepare(lio_bulk *b, const int64_t *ordinals, size_t n,
                         uint64_t *key_bytes, uint64_t *value_bytes)
    int lio_bulk_fill(lio_bulk *b, uint8_t *kdata, int64_t *koff,
                      uint8_t *vdata, int64_t *voff)
    const lio_error *lio_bulk_error(const lio_bulk *b)
    void lio_bulk_close(lio_bulk *b)
    int lio_bulk_extend(lio_bulk *b, lio_index *idx, uint64_t need, int keep)
    int lio_bulk_read_leaves(lio_bulk *b, uint64_t lo, uint64_t hi)
    void lio_bulk_set_policy(lio_bulk *b, size_t max_gap, size_t max_read)
    void lio_bulk_set_collective(lio_bulk *b, int on)
    ctypedef struct lio_batch_out:
        uint8_t *kdata
        int64_t *koff
        uint8_t *vdata
        int64_t *voff
    int lio_bulk_batch_sizes(lio_bulk *b, const size_t *ends, size_t nb,
                             uint64_t *key_bytes, uint64_t *value_bytes)
    int lio_bulk_fill_batches(lio_bulk *b, const size_t *ends, size_t nb,
                              const lio_batch_out *out)
    uint64_t lio_bulk_leaf_bytes(const lio_bulk *b)
    void lio_bulk_set_cache(lio_bulk *b, size_t region, unsigned min_pages,
                            int drop)
    void lio_bulk_new_pass(lio_bulk *b)
    void lio_bulk_advise(lio_bulk *b, const int64_t *ordinals, size_t n)

    void *lio_block_take(size_t need, size_t *cap)
    void lio_block_give(void *p, size_t cap)
    enum: LIO_PIPELINE_LANES
    ctypedef struct lio_pipeline:
        pass
    ctypedef struct lio_pipeline_cfg:
        lio_bulk *lanes[2]
        unsigned nlanes
        lio_env *env
        const int64_t *perm
        uint64_t total
        uint64_t first
        uint64_t start
        uint64_t stop
        size_t batch
        size_t window_bytes
        size_t prefetch_bytes
        size_t nbatch
        unsigned ahead
        int keys
        uint64_t advised
        lio_index *grow
        uint64_t entries
        uint64_t basis[2][2]
    ctypedef struct lio_window:
        uint64_t start
        size_t n
        size_t nb
        uint8_t *block
        size_t cap
        size_t voff_at
        size_t koff_at
        size_t vstart_at
        size_t kstart_at
        size_t keys_at
        uint64_t leaf_bytes
        uint64_t bytes
        uint64_t newest
        int rc
        lio_error err
    ctypedef struct lio_pipeline_stats:
        uint64_t windows
        uint64_t max_bytes
        uint64_t max_batches
        uint64_t max_ahead
    void lio_leaves_ahead(uint64_t first_ord, uint64_t last_ord,
                          uint64_t counted, uint64_t covered, uint64_t leaves,
                          uint64_t records, double err, uint64_t *lo,
                          uint64_t *hi)
    double lio_leaves_ahead_error(uint64_t first_ord, uint64_t last_ord,
                                  uint64_t counted, uint64_t covered,
                                  uint64_t leaves, uint64_t records,
                                  uint64_t true_lo, uint64_t true_hi)
    int lio_pipeline_start(lio_pipeline **out, const lio_pipeline_cfg *cfg,
                           lio_error *err)
    int lio_pipeline_next(lio_pipeline *p, lio_window *w)
    void lio_pipeline_release(lio_pipeline *p)
    void lio_pipeline_get_stats(lio_pipeline *p, lio_pipeline_stats *st)
    void lio_pipeline_stop(lio_pipeline *p)
    void lio_pipeline_free(lio_pipeline *p)


cdef extern from "lockfile.h" nogil:
    ctypedef struct lio_lock:
        pass
    ctypedef struct lio_reader:
        pass
    ctypedef int (*lio_txnid_fn)(void *ctx, uint64_t *txnid, lio_error *err) noexcept nogil
    size_t lio_lock_path(char *buf, size_t cap, const char *env_path,
                         int subdir)
    int lio_lock_open(lio_lock **out, const char *lock_path, unsigned mode,
                      unsigned max_readers, lio_txnid_fn newest_txnid,
                      void *ctx, lio_error *err)
    void lio_lock_close(lio_lock *lk)
    int lio_lock_reader_begin(lio_lock *lk, lio_reader **slot,
                              uint64_t *txnid, lio_error *err)
    int lio_lock_reader_refresh(lio_lock *lk, lio_reader *slot,
                                uint64_t *txnid, lio_error *err)
    void lio_lock_reader_reset(lio_lock *lk, lio_reader *slot)
    void lio_lock_reader_end(lio_lock *lk, lio_reader *slot)
    unsigned lio_lock_max_readers(const lio_lock *lk)
    unsigned lio_lock_num_readers(const lio_lock *lk)
    int lio_lock_reader_check(lio_lock *lk, int *dead, lio_error *err)
    size_t lio_lock_reader_list(const lio_lock *lk, char *buf, size_t cap)

    ctypedef struct lio_lock_slot_info:
        uint64_t txnid
        int32_t pid
        uint64_t tid
        int stale
    ctypedef struct lio_lock_info:
        int exists
        int live
        unsigned max_readers
        unsigned num_readers
        unsigned nslots
        lio_lock_slot_info *slots
    int lio_lock_inspect(const char *lock_path, lio_lock_info *info,
                         lio_error *err)
    void lio_lock_info_free(lio_lock_info *info)
    size_t lio_lock_info_list(const lio_lock_info *info, int skip_stale,
                              char *buf, size_t cap)


cdef extern from "datum.h" nogil:
    int LIO_DATUM_UINT8, LIO_DATUM_FLOAT, LIO_DATUM_ENCODED
    int LIO_DATUM_OK, LIO_DATUM_EMALFORMED, LIO_DATUM_EMISMATCH
    int LIO_BLOB_MAX_DIMS

    ctypedef struct lio_datum:
        int64_t channels, height, width
        int64_t label
        int has_label
        int encoded
        int kind
        uint64_t data_off, data_len
        uint64_t nfloat

    ctypedef struct lio_datum_error:
        int64_t index
        uint64_t offset
        char msg[200]

    ctypedef struct lio_blob:
        int64_t num, channels, height, width
        int has_legacy
        int ndim
        int has_shape
        int64_t dim[32]
        uint64_t ndata
        uint64_t ndouble

    int lio_datum_parse(const uint8_t *buf, size_t len, lio_datum *d,
                        lio_datum_error *err)
    void lio_datum_floats(const uint8_t *buf, size_t len, float *out)
    int lio_datum_decode_batch(const uint8_t *data, const int64_t *offsets,
                               size_t n, int kind, int64_t c, int64_t h,
                               int64_t w, void *out, int64_t *labels,
                               int64_t *data_off, int64_t *data_len,
                               unsigned nthreads, lio_datum_error *err)
    int lio_blob_parse(const uint8_t *buf, size_t len, lio_blob *b,
                       lio_datum_error *err)
    void lio_blob_values(const uint8_t *buf, size_t len, int use_double,
                         float *out)
    int lio_transform(const void *src, int src_float, size_t n, int64_t C,
                      int64_t H, int64_t W, int64_t crop,
                      const int64_t *h_off, const int64_t *w_off,
                      const uint8_t *mirror, const float *mean,
                      const float *mean_values, float scale, float *out)


# Defined in _core.pyx, cimported by every module: the one function that
# turns a C core error into lmdbio's exception.
cdef object _core_error(what, int rc, const lio_error *err, path)
