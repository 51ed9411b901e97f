# cython: language_level=3, boundscheck=False, wraparound=False, binding=True
"""Bindings of the C core's bulk path: record index and batch reads.

One BulkFile is one data file, one snapshot and one tree.  Every call that
reads or parses runs with the GIL released.
"""

cimport cython
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset
from cpython.buffer cimport PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from posix.unistd cimport getpid

import os
import weakref

import numpy as np

from lmdbio.errors import forked_error, make_error

from lmdbio._core cimport *   # the C core's declarations (_core.pxd)


# lio_index_build and lio_index_begin: a new index over a snapshot.
ctypedef int (*_index_open)(lio_index **out, lio_env *env, const lio_meta *snap,
                            const lio_dbrec *db, const lio_executor *ex,
                            const lio_readahead *ra,
                            lio_error *err) noexcept nogil


cdef int _py_run(void *ctx, const lio_plan *plan, lio_error *err) noexcept nogil:
    with gil:
        return (<BulkFile>ctx)._run_in_python(plan, err)


cdef inline object _error(str path, const lio_error *err):
    # the core's message with the path, whatever the code (_core_error)
    return _core_error(None, err.code, err, path)


cdef void _bytes_view(Py_buffer *view, void *buf, size_t n, bint readonly,
                      Py_ssize_t *shape):
    """Fill a buffer request (its obj already set) for n bytes at buf, one
    dimension of unsigned bytes; shape: the exporter's own one-element
    array, which must live as long as the export."""
    shape[0] = <Py_ssize_t>n
    view.buf = buf
    view.len = <Py_ssize_t>n
    view.readonly = readonly
    view.itemsize = 1
    view.format = 'B'
    view.ndim = 1
    view.shape = shape
    view.strides = NULL
    view.suboffsets = NULL
    view.internal = NULL


cdef class _Memory:
    """Page-aligned memory behind a batch's arrays (lio_block_take).  When
    the last array over it goes away it is given back for reuse, so the
    next batch lands in memory that is already mapped (and, at a few MiB,
    still in cache) instead of faulting in a fresh allocation."""
    cdef uint8_t *ptr
    cdef size_t cap
    cdef Py_ssize_t shape[1]

    def __getbuffer__(self, Py_buffer *view, int flags):
        view.obj = self
        _bytes_view(view, self.ptr, self.cap, False, self.shape)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __dealloc__(self):
        lio_block_give(self.ptr, self.cap)


cdef _Memory _memory(uint8_t *ptr, size_t cap):
    """A block taken with lio_block_take, owned from now on by a _Memory."""
    cdef _Memory m = _Memory.__new__(_Memory)
    m.ptr = ptr
    m.cap = cap
    return m


def _fault_injected():
    """Faults the test-only hook injected into this module's reads (see
    lmdbio._core._fault_injected), or None without the hook."""
    cdef uint64_t n = 0
    if not lio_fault_injection(&n):
        return None
    return n


cdef uint64_t _newest_txnid(lio_env *env) noexcept nogil:
    """The newest committed txnid in the file now (both meta pages
    re-read), or 0 if they cannot be read."""
    cdef lio_meta metas[2]
    cdef lio_error err
    if env == NULL or lio_env_read_metas(env, metas, &err):
        return 0
    return metas[0].txnid if metas[0].txnid > metas[1].txnid \
        else metas[1].txnid


def aligned_bytes(size_t n, size_t phase=0):
    """A uint8 array of n bytes whose first byte sits `phase` bytes past a
    4096-byte boundary, from recycled memory (copies from the page cache
    run at full speed when the destination has the file offset's
    alignment, measured)."""
    cdef size_t cap = 0
    cdef void *p = lio_block_take(n + phase, &cap)
    if p == NULL:
        raise MemoryError()
    return np.frombuffer(_memory(<uint8_t *>p, cap), dtype=np.uint8,
                         count=n, offset=phase)


def ragged_items(data, offsets):
    """The items of a Ragged (uint8 data, int64 offsets, both contiguous)
    as a list of bytes, one copy each: Ragged.tolist copied the data whole
    first, then sliced it, 17 of a 64-record batch's 95 us in a map-style
    dataset.  None where the arrays are of another kind, or an offset
    falls outside the data or before the one ahead of it (the caller's
    slicing then says what such offsets mean)."""
    cdef const uint8_t[::1] d
    cdef const int64_t[::1] o
    cdef Py_ssize_t n, i, size
    cdef const char *base
    if not (isinstance(data, np.ndarray) and isinstance(offsets, np.ndarray)
            and data.dtype == np.uint8 and offsets.dtype == np.int64
            and data.ndim == 1 and offsets.ndim == 1
            and data.flags.c_contiguous and offsets.flags.c_contiguous):
        return None
    d = data
    o = offsets
    n = o.shape[0] - 1
    size = d.shape[0]
    if n < 0:
        return []
    for i in range(n + 1):
        if o[i] < 0 or o[i] > size or (i and o[i] < o[i - 1]):
            return None
    if size == 0:
        return [b""] * n
    base = <const char *>&d[0]
    return [PyBytes_FromStringAndSize(base + o[i], o[i + 1] - o[i])
            for i in range(n)]


def ordinal_bounds(const int64_t[::1] ordinals):
    """(least, most) of a non-empty int64 array, in one pass: numpy's min()
    and max() cost 3 us of a one-record read()."""
    cdef Py_ssize_t i, n = ordinals.shape[0]
    cdef int64_t lo, hi
    if n == 0:
        raise ValueError('no ordinals')
    lo = hi = ordinals[0]
    for i in range(1, n):
        if ordinals[i] < lo:
            lo = ordinals[i]
        elif ordinals[i] > hi:
            hi = ordinals[i]
    return lo, hi


# Pipelines whose lanes may be running.  Each is stopped before the
# process forks: no lane is then inside the C core (holding a lock, or
# between a realloc and the store of its result) when the child's copy is
# made.  The parent's consumer starts its epoch's pipeline again from
# where it stopped; the child's is told it was forked (next()).  (It
# starts them under the Reader's lane locks, which reader.py's hook holds
# across the fork; the checks of the process id, and the index lock made
# anew in a child, remain for a fork that runs no hook.)
_running = weakref.WeakSet()


def _stop_before_fork():
    for pipe in list(_running):
        pipe.stop()


os.register_at_fork(before=_stop_before_fork)


cdef class _Pipeline:
    """A running window pipeline (BulkFile.start_pipeline): next() hands
    out its windows in order, stop() ends it (also from another thread
    while one waits in next(), or stops it too)."""
    cdef object __weakref__
    cdef lio_pipeline *p
    cdef BulkFile file
    cdef str path
    cdef long pid                  # the process whose lanes these are
    cdef uint64_t end              # the position after the last window
    cdef object perm               # the order the lanes read from
    cdef size_t batch
    cdef bint keys
    cdef bint stopping             # stop() began: next() returns None
    cdef bint stopped              # the lanes are joined
    cdef int busy                  # threads inside a C call on p (next,
                                   # stop): p is freed when none is
    cdef readonly uint64_t resume_at   # the position after the last
                                       # window handed out

    def next(self):
        """The next window: (first position, records, batches, newest
        txnid), each batch (ordinals, kdata, koff, vdata, voff) views of
        the window's block (kdata, koff None without keys); batches is
        None when the window failed and must be read batch by batch.
        None when no window comes: after the last, or once stopped
        (resume_at short of the end then: the rest was not handed out)."""
        cdef lio_window w
        cdef int rc
        cdef lio_pipeline *p = self.p
        cdef size_t j, first, last, vo, ko
        cdef const int64_t *vst
        cdef const int64_t *kst
        cdef const int64_t *voff
        if self.pid != getpid():
            if self.resume_at < self.end:
                raise forked_error(self.path)
            return None
        if p == NULL or self.stopping:
            return None
        self.busy += 1
        with nogil:
            rc = lio_pipeline_next(p, &w)
        self.busy -= 1
        if self.stopping:
            if rc == 0:
                lio_block_give(w.block, w.cap)
            self._free_if_idle()
            return None
        if rc:
            return None
        self.resume_at = w.start + w.n
        if w.rc:
            return w.start, w.n, None, w.newest
        raw = np.frombuffer(_memory(w.block, w.cap), dtype=np.uint8)
        words = raw[:w.cap & ~(<size_t>7)].view(np.int64)
        vst = <const int64_t *>(w.block + w.vstart_at)
        kst = <const int64_t *>(w.block + w.kstart_at)
        voff = <const int64_t *>(w.block + w.voff_at)
        vo = w.voff_at // 8
        ko = w.koff_at // 8
        batches = []
        for j in range(w.nb):
            first = j * self.batch
            last = min(first + self.batch, w.n)
            ords = words[first:last]
            vdata = raw[vst[j]:vst[j] + voff[last + j]]
            voffs = words[vo + first + j:vo + last + j + 1]
            if self.keys:
                batches.append((ords, raw[kst[j]:kst[j + 1]],
                                words[ko + first + j:ko + last + j + 1],
                                vdata, voffs))
            else:
                batches.append((ords, None, None, vdata, voffs))
        return w.start, w.n, batches, w.newest

    def release(self):
        """What the consumer held before the window it took last is let go
        (lio_pipeline_release): one more window may be read ahead."""
        if self.p != NULL and not self.stopping:
            lio_pipeline_release(self.p)

    cdef _free_if_idle(self):
        """Free p once stopped and no thread is inside a C call on it."""
        if self.stopped and self.busy == 0 and self.p != NULL:
            lio_pipeline_free(self.p)
            self.p = NULL
            self.file = None

    def stats(self):
        """(windows read whole, largest window's bytes, most batches in a
        window, most windows claimed and not taken)."""
        cdef lio_pipeline_stats st
        if self.p == NULL or self.stopping:
            return None
        lio_pipeline_get_stats(self.p, &st)
        return st.windows, st.max_bytes, st.max_batches, st.max_ahead

    def stop(self):
        """Stop the lanes (each finishes its window) and free the pipeline
        (here, or in next() when a thread is waiting there).  Every caller
        returns once the lanes are joined, a second one too: its file may
        then close the readers they used."""
        cdef lio_pipeline *p = self.p
        if p == NULL:
            return
        self.stopping = True
        self.busy += 1
        with nogil:
            lio_pipeline_stop(p)
        self.busy -= 1
        self.stopped = True
        if self.file is not None and self.file.pipe is self:
            self.file.pipe = None
        self._free_if_idle()

    def __dealloc__(self):
        if self.p != NULL:
            lio_pipeline_free(self.p)
            self.p = NULL


cdef class _IndexView


cdef class BulkFile:
    cdef lio_posix *posix
    cdef lio_source src
    cdef lio_env *env
    cdef lio_pool *pool
    cdef lio_executor ex
    cdef lio_meta snap
    cdef lio_dbrec db
    cdef lio_index *idx
    cdef lio_bulk *bulk            # batch reads through ex
    cdef lio_bulk *bulk_ind        # independent reads (posix), if ex differs
    cdef lio_bulk *bulk_lane2      # a second independent reader (pipelining)
    cdef lio_bulk *bulk_pipe[2]    # the window pipeline's lanes' own readers
    cdef lio_pool_lane *lane_io[2] # their own descriptions of the file
    cdef lio_executor lane_ex[2]   # (executors over the pool's threads)
    cdef _Pipeline pipe            # the pipeline running, or None
    cdef size_t max_gap, max_read, region
    cdef unsigned region_min
    cdef bint drop, policy_set, cache_set
    cdef lio_executor posix_ex     # independent reads (index build, cursors)
    cdef readonly str path
    cdef readonly bint has_db
    cdef object executor           # a Python executor (MPI-IO), or None
    cdef object executor_error
    cdef dict idx_views            # index address: index_views alive
    cdef set idx_orphans           # addresses of indexes dropped while viewed

    def __cinit__(self, str path, bint direct=False, unsigned threads=4,
                  size_t cache_bytes=4 << 20, executor=None):
        cdef lio_error err
        cdef int rc
        cdef bytes bpath = path.encode()
        cdef const char *cpath = bpath
        self.path = path
        with nogil:
            rc = lio_posix_open(&self.posix, cpath, direct, &err)
        if rc:
            raise _error(path, &err)
        lio_posix_get_source(self.posix, &self.src)
        with nogil:
            rc = lio_env_open(&self.env, &self.src, cache_bytes, 0, &err)
        if rc:
            raise _error(path, &err)
        with nogil:
            rc = lio_pool_open(&self.pool, self.posix, threads, &err)
        if rc:
            raise _error(path, &err)
        lio_pool_get_executor(self.pool, &self.posix_ex)
        self.ex = self.posix_ex
        if executor is not None:
            # Batch reads go through executor.read_extents(offsets, lengths,
            # out): e.g. one MPI-IO collective read per step.
            self.executor = executor
            self.ex.ctx = <void *>self
            self.ex.run = _py_run
            self.ex.advise = NULL

    cdef int _run_in_python(self, const lio_plan *plan, lio_error *err):
        cdef size_t i, j, pos = 0, total = 0
        cdef const lio_read *r
        cdef const lio_seg *sg
        cdef uint8_t[::1] st
        cdef int64_t[::1] offs
        cdef int64_t[::1] lens
        try:
            offsets = np.empty(plan.nreads, dtype=np.int64)
            lengths = np.empty(plan.nreads, dtype=np.int64)
            offs = offsets
            lens = lengths
            for i in range(plan.nreads):
                offs[i] = <int64_t>plan.reads[i].off
                lens[i] = <int64_t>plan.reads[i].len
                total += plan.reads[i].len
            stage = aligned_bytes(total)
            self.executor.read_extents(offsets, lengths, stage)
            if total:
                st = stage
                for i in range(plan.nreads):
                    r = &plan.reads[i]
                    for j in range(r.nseg):
                        sg = &plan.segs[r.first_seg + j]
                        memcpy(sg.dst, &st[pos], sg.len)
                        pos += sg.len
            return 0
        except BaseException as e:
            self.executor_error = e
            msg = ('%s: %s' % (type(e).__name__, e)).encode('utf-8', 'replace')[:250]
            err.code = LIO_SYSERR
            err.sys_errno = 5  # EIO
            err.pgno = <uint64_t>-1
            err.off = <uint64_t>-1
            memcpy(err.msg, <const char *>msg, len(msg))
            err.msg[len(msg)] = 0
            return LIO_SYSERR

    def snapshot(self, uint64_t txnid=0):
        """Take the snapshot to read (0: the newest).  False when the meta
        page no longer carries txnid (a writer moved on)."""
        cdef lio_error err
        cdef int rc
        with nogil:
            rc = lio_env_snapshot(self.env, txnid, &self.snap, &err)
        if rc == LIO_RETRY:
            return False
        if rc:
            raise _error(self.path, &err)
        self.db = self.snap.main_db
        self.has_db = True
        return True

    def select(self, name):
        """Read the main database (None) or a named one (bytes)."""
        cdef lio_error err
        cdef int rc
        cdef bytes bname
        cdef const char *cname
        cdef size_t n
        if name is None:
            self.db = self.snap.main_db
            return
        bname = name
        cname = bname
        n = len(bname)
        with nogil:
            rc = lio_named_db(self.env, &self.snap, cname, n, &self.db, &err)
        if rc == LIO_NOTFOUND:
            raise make_error('%s: named database %r not found'
                             % (self.path, name), rc)
        if rc:
            raise _error(self.path, &err)

    @property
    def txnid(self):
        return self.snap.txnid

    @property
    def root(self):
        return self.db.root

    @property
    def entries(self):
        return self.db.entries

    @property
    def last_pg(self):
        return self.snap.last_pg

    @property
    def psize(self):
        return self.snap.psize

    cdef _new_index(self, _index_open make, size_t round_bytes=0):
        """Replace the index with one `make` (lio_index_build or
        lio_index_begin) opens over this file's snapshot (a build reading
        rounds of round_bytes, if given)."""
        cdef lio_error err
        cdef int rc
        # the branch levels read ahead as windows are (set_cache)
        cdef lio_readahead ra
        ra.region = self.region if self.cache_set and not self.drop else 0
        ra.min_pages = self.region_min
        self._drop_index()
        with nogil:
            if round_bytes:
                rc = lio_index_build_rounds(&self.idx, self.env, &self.snap,
                                            &self.db, &self.posix_ex, &ra,
                                            round_bytes, &err)
            else:
                rc = make(&self.idx, self.env, &self.snap, &self.db,
                          &self.posix_ex, &ra, &err)
        if rc:
            raise _error(self.path, &err)
        self._open_bulk()

    def build_index(self, size_t round_bytes=0):
        """Build the whole index (every leaf read; round_bytes a round, 0:
        the default 8 MiB); returns the leaves read."""
        self._new_index(lio_index_build, round_bytes)
        return self.idx.pages_read

    def begin_index(self):
        """An index whose leaves are counted as reads need them (from the
        same reads): an epoch in key order then reads each leaf once.
        index_pending until every leaf is counted (finish_index)."""
        self._new_index(lio_index_begin)

    @property
    def index_pending(self):
        """Whether a begun index (begin_index) has leaves not counted."""
        return self.idx != NULL and lio_index_pending(self.idx) != 0

    @property
    def tree_leaves(self):
        """The tree's leaves (those of a partial index: its own)."""
        if self.idx == NULL:
            return 0
        return self.idx.tree_leaves if self.idx.tree_leaves else \
            self.idx.nleaves

    cdef _extend(self, lio_bulk *b, uint64_t need, bint keep):
        """Count a begun index's leaves through ordinal `need` with batch
        reader b (the index lets one extension run at a time, the window
        pipeline's lanes' among them; b keeps what it read)."""
        cdef int rc
        if not lio_index_pending(self.idx) or lio_index_holds(self.idx, need):
            return   # (without waiting for another lane's extension)
        with nogil:
            rc = lio_bulk_extend(b, self.idx, need, keep)
        if rc:
            raise self._step_error(lio_bulk_error(b))

    def extend_index(self, uint64_t need, int lane=0):
        """Count a begun index's leaves through ordinal `need` with lane
        `lane`'s batch reader, which keeps them for its next window."""
        if self.idx != NULL and lio_index_pending(self.idx):
            self._extend(self._independent(lane), need, True)

    def read_leaves(self, uint64_t lo, uint64_t hi, int lane=0):
        """Read leaves lo..hi-1 into lane `lane`'s batch reader without
        counting them (lio_bulk_read_leaves): its next extend_index counts
        them from memory, its next window takes them."""
        cdef lio_bulk *b
        cdef int rc
        if self.idx == NULL:
            return
        b = self._independent(lane)
        with nogil:
            rc = lio_bulk_read_leaves(b, lo, hi)
        if rc:
            raise self._step_error(lio_bulk_error(b))

    def finish_index(self):
        """Count every leaf a begun index has not counted yet."""
        if self.idx != NULL and lio_index_pending(self.idx):
            self._extend(self.bulk, self.db.entries, False)

    def build_index_part(self, bint from_end, uint64_t need):
        """An index of just the leaves holding the first `need` records
        (from_end: the last `need`), counted from that end of the tree."""
        cdef lio_error err
        cdef int rc
        self._drop_index()
        with nogil:
            rc = lio_index_build_part(&self.idx, self.env, &self.snap,
                                      &self.db, &self.posix_ex, from_end, need,
                                      &err)
        if rc:
            raise _error(self.path, &err)
        self._open_bulk()
        return self.idx.pages_read

    @property
    def index_range(self):
        """(first, end) ordinals the index covers: (0, entries) unless it
        is partial (build_index_part)."""
        if self.idx == NULL:
            raise RuntimeError('no record index')
        return self.idx.first[0], self.idx.first[self.idx.nleaves]

    def index_leaves(self):
        """The tree's leaf page numbers in key order (branch pages only)."""
        cdef lio_error err
        cdef int rc
        cdef uint64_t *leaves = NULL
        cdef uint64_t n = 0
        with nogil:
            rc = lio_index_leaves(self.env, &self.snap, &self.db,
                                  &self.posix_ex, &leaves, &n, &err)
        if rc:
            raise _error(self.path, &err)
        out = np.empty(n, dtype=np.uint64)
        cdef uint64_t[::1] o = out
        if n:
            memcpy(&o[0], leaves, n * sizeof(uint64_t))
        free(leaves)
        return out

    def index_count(self, leaves):
        """Record counts of these leaves (their headers)."""
        cdef lio_error err
        cdef int rc
        cdef uint64_t[::1] lv = np.ascontiguousarray(leaves, dtype=np.uint64)
        cdef uint64_t n = lv.shape[0]
        counts = np.zeros(n, dtype=np.uint64)
        cdef uint64_t[::1] c = counts
        if n == 0:
            return counts
        with nogil:
            rc = lio_index_count(self.env, &self.snap, &self.db,
                                 &self.posix_ex, &lv[0], n, &c[0], &err)
        if rc:
            raise _error(self.path, &err)
        return counts

    def adopt_index(self, leaf_pgno, first, recmap=None, bint partial=False):
        """Use a cached index (validated against the snapshot; `partial`:
        one that build_index_part made), with its record map if it has one
        (index_recmap; every entry is checked against the page size)."""
        cdef lio_error err
        cdef int rc
        cdef uint64_t[::1] lp = np.ascontiguousarray(leaf_pgno, dtype=np.uint64)
        cdef uint64_t[::1] fi = np.ascontiguousarray(first, dtype=np.uint64)
        cdef uint64_t n = lp.shape[0]
        cdef uint64_t *a
        cdef uint64_t *b
        if fi.shape[0] != n + 1:
            raise ValueError('index arrays of inconsistent lengths')
        self._drop_index()
        a = <uint64_t *>malloc((n if n else 1) * sizeof(uint64_t))
        b = <uint64_t *>malloc((n + 1) * sizeof(uint64_t))
        if a == NULL or b == NULL:
            free(a)
            free(b)
            raise MemoryError()
        if n:
            memcpy(a, &lp[0], n * sizeof(uint64_t))
        memcpy(b, &fi[0], (n + 1) * sizeof(uint64_t))
        rc = lio_index_adopt(&self.idx, &self.snap, &self.db, n, a, b,
                             partial, &err)
        if rc:
            raise _error(self.path, &err)
        self._open_bulk()
        if recmap is not None:
            try:
                self.set_recmap(recmap)
            except BaseException:
                self._drop_index()
                raise

    def set_recmap(self, recmap):
        """Give the index a record map (index_recmap of this snapshot's
        index, from a cache): every entry is checked first, a damaged one
        raises CorruptedError naming its record and page."""
        cdef lio_error err
        cdef int rc
        cdef uint64_t[::1] rm = np.ascontiguousarray(recmap, dtype=np.uint64)
        cdef uint64_t nm = rm.shape[0]
        cdef uint64_t *m
        if self.idx == NULL:
            raise RuntimeError('no record index')
        self._stop_pipeline()
        m = <uint64_t *>malloc((nm if nm else 1) * sizeof(uint64_t))
        if m == NULL:
            raise MemoryError()
        if nm:
            memcpy(m, &rm[0], nm * sizeof(uint64_t))
        with nogil:
            rc = lio_index_set_map(self.idx, lio_env_psize(self.env), m, nm,
                                   &err)
        if rc:
            raise _error(self.path, &err)

    def index_recmap(self):
        """A copy of the index's record map (where each record sits in its
        leaf), or None when the index has none."""
        cdef uint64_t n = 0
        cdef const uint64_t *m = NULL
        if self.idx == NULL:
            return None
        if self.idx.recmap != NULL:
            m = self.idx.recmap
            n = self.idx.first[self.idx.nleaves] - self.idx.first[0]
        else:   # a begun index's, once whole
            m = lio_index_built_map(self.idx, &n)
        if m == NULL:
            return None
        out = np.empty(n, dtype=np.uint64)
        cdef uint64_t[::1] o = out
        if n:
            memcpy(&o[0], m, n * sizeof(uint64_t))
        return out

    def index_arrays(self):
        """(leaf page numbers, first ordinal of each leaf + total) copies."""
        cdef uint64_t n = self.idx.nleaves
        lp = np.empty(n, dtype=np.uint64)
        fi = np.empty(n + 1, dtype=np.uint64)
        cdef uint64_t[::1] a = lp
        cdef uint64_t[::1] b = fi
        if n:
            memcpy(&a[0], self.idx.leaf_pgno, n * sizeof(uint64_t))
        memcpy(&b[0], self.idx.first, (n + 1) * sizeof(uint64_t))
        return lp, fi

    @property
    def num_records(self):
        if self.idx == NULL:
            raise RuntimeError('no record index')
        return self.db.entries   # what a whole index counts (checked)

    @property
    def num_leaves(self):
        return self.idx.nleaves if self.idx != NULL else 0

    def keep_leaves(self, uint64_t max_bytes):
        """Hold every leaf of the index in memory (read and checked once),
        so that windows read only values, when the leaves take at most
        max_bytes and the index has no record map (which reads records
        without their leaves already).  Whether they are held."""
        cdef int rc
        if self.idx == NULL or lio_index_pending(self.idx):
            return False
        if self.idx.leafmem != NULL:
            return True
        if (self.idx.recmap != NULL or self.idx.nleaves == 0 or
                self.idx.nleaves > max_bytes // lio_env_psize(self.env)):
            return False
        self._stop_pipeline()
        with nogil:
            rc = lio_index_load_leaves(self.idx, self.env, &self.db,
                                       &self.posix_ex)
        return rc == 1

    cdef _open_bulk(self):
        cdef lio_error err
        cdef int rc = lio_bulk_open(&self.bulk, self.env, &self.snap, &self.db,
                                    self.idx, &self.ex, &err)
        if rc:
            raise _error(self.path, &err)
        lio_bulk_set_collective(self.bulk, self.executor is not None)
        if self.policy_set:
            lio_bulk_set_policy(self.bulk, self.max_gap, self.max_read)
        if self.cache_set:
            lio_bulk_set_cache(self.bulk, self.region, self.region_min,
                               self.drop)

    cdef _readers(self, lio_bulk **readers):
        """Every batch reader of this file (NULL where none), the
        pipeline's only while no pipeline runs (its lanes use them)."""
        cdef bint idle = self.pipe is None
        readers[0] = self.bulk
        readers[1] = self.bulk_ind
        readers[2] = self.bulk_lane2
        readers[3] = self.bulk_pipe[0] if idle else NULL
        readers[4] = self.bulk_pipe[1] if idle else NULL

    cdef _stop_pipeline(self):
        """Stop the running pipeline, if any, before the index changes
        under its lanes (its consumer starts another from where it
        stopped)."""
        if self.pipe is not None:
            self.pipe.stop()

    cdef _drop_index(self):
        cdef int i
        self._stop_pipeline()
        for i in range(2):
            if self.bulk_pipe[i] != NULL:
                lio_bulk_close(self.bulk_pipe[i])
                self.bulk_pipe[i] = NULL
        if self.bulk != NULL:
            lio_bulk_close(self.bulk)
            self.bulk = NULL
        if self.bulk_ind != NULL:
            lio_bulk_close(self.bulk_ind)
            self.bulk_ind = NULL
        if self.bulk_lane2 != NULL:
            lio_bulk_close(self.bulk_lane2)
            self.bulk_lane2 = NULL
        if self.idx != NULL:
            if self.idx_views and <size_t>self.idx in self.idx_views:
                self.idx_orphans.add(<size_t>self.idx)  # freed by its last view
            else:
                lio_index_free(self.idx)
            self.idx = NULL

    cdef _view_gone(self, lio_index *idx):
        cdef size_t key = <size_t>idx
        if self.idx_views is None or key not in self.idx_views:
            return   # (the BulkFile torn down by the cycle collector)
        left = self.idx_views.pop(key) - 1
        if left:
            self.idx_views[key] = left
        elif key in self.idx_orphans:
            self.idx_orphans.discard(key)
            lio_index_free(idx)

    cdef _IndexView _view(self, const void *ptr, uint64_t n):
        cdef _IndexView v = _IndexView.__new__(_IndexView)
        cdef size_t key = <size_t>self.idx
        v.ptr = <const uint8_t *>ptr if n else <const uint8_t *>&v.size
        v.size = n * sizeof(uint64_t)
        v.idx = self.idx
        v.owner = self
        if self.idx_views is None:
            self.idx_views, self.idx_orphans = {}, set()
        self.idx_views[key] = self.idx_views.get(key, 0) + 1
        return v

    def index_views(self):
        """(leaf page numbers, first ordinal of each leaf + total, record
        map or None): index_arrays and index_recmap without their copies,
        read-only uint64 arrays over the index's own memory (saving a
        first start's index had spent 4 ms of its 8 copying 5.6 MB into
        fresh pages).  They stay valid after the index is dropped: it is
        freed with the last view.  A record map given by set_recmap, which
        a later set_recmap frees, comes as a copy (index_recmap); the map a
        begun index built lives as long as its index."""
        cdef uint64_t n, nm = 0
        cdef const uint64_t *m = NULL
        if self.idx == NULL:
            raise RuntimeError('no record index')
        n = self.idx.nleaves
        if self.idx.recmap == NULL:
            m = lio_index_built_map(self.idx, &nm)
        u64 = np.dtype(np.uint64)
        return (np.frombuffer(self._view(self.idx.leaf_pgno, n), dtype=u64),
                np.frombuffer(self._view(self.idx.first, n + 1), dtype=u64),
                np.frombuffer(self._view(m, nm), dtype=u64) if m != NULL
                else self.index_recmap())

    def set_policy(self, size_t max_gap, size_t max_read):
        """Coalescing of every batch reader of this file."""
        cdef lio_bulk *readers[5]
        cdef int i
        self.max_gap, self.max_read, self.policy_set = max_gap, max_read, True
        self._readers(readers)
        for i in range(5):
            if readers[i] != NULL:
                lio_bulk_set_policy(readers[i], max_gap, max_read)

    cdef _step_error(self, const lio_error *err):
        e = self.executor_error
        self.executor_error = None
        if e is not None:
            return e
        return _error(self.path, err)

    cdef lio_bulk *_independent(self, int lane=0) except NULL:
        """The batch reader of lane 0 or 1: independent (POSIX) reads; two
        lanes read two windows at once (one reads while the other copies)."""
        if lane:
            if self.bulk_lane2 == NULL:
                self.bulk_lane2 = self._new_bulk()
            return self.bulk_lane2
        if self.executor is None:
            return self.bulk
        if self.bulk_ind == NULL:
            self.bulk_ind = self._new_bulk()
        return self.bulk_ind

    def set_cache(self, size_t region, unsigned min_pages, bint drop):
        """Page-cache policy of batch reads (lio_bulk_set_cache)."""
        cdef lio_bulk *readers[5]
        cdef int i
        self.region, self.region_min, self.drop = region, min_pages, drop
        self.cache_set = True
        self._readers(readers)
        for i in range(5):
            if readers[i] != NULL:
                lio_bulk_set_cache(readers[i], region, min_pages, drop)

    def new_pass(self):
        """A new epoch: regions may be read ahead again."""
        cdef lio_bulk *readers[5]
        cdef int i
        self._readers(readers)
        for i in range(5):
            if readers[i] != NULL:
                lio_bulk_new_pass(readers[i])

    def advise(self, ordinals, int lane=0):
        """Ask the storage for the regions holding these records' leaves
        (read-ahead of windows to come; nothing is read here)."""
        cdef int64_t[::1] ords = np.ascontiguousarray(ordinals, dtype=np.int64)
        cdef size_t n = ords.shape[0]
        cdef lio_bulk *b
        if self.bulk == NULL or n == 0:
            return
        b = self._independent(lane)
        with nogil:
            lio_bulk_advise(b, &ords[0], n)

    cdef lio_bulk *_new_bulk(self, const lio_executor *ex=NULL) except NULL:
        """Another batch reader over the POSIX pool (through ex, one of its
        lanes, if given), with this file's policies."""
        cdef lio_error err
        cdef lio_bulk *b = NULL
        cdef int rc = lio_bulk_open(&b, self.env, &self.snap, &self.db,
                                    self.idx, ex if ex != NULL
                                    else &self.posix_ex, &err)
        if rc:
            raise _error(self.path, &err)
        if self.policy_set:
            lio_bulk_set_policy(b, self.max_gap, self.max_read)
        if self.cache_set:
            lio_bulk_set_cache(b, self.region, self.region_min, self.drop)
        return b

    def read(self, ordinals, bint keys=True, agree=None,
             bint independent=False):
        """Records by ordinal, in the given order: (kdata, koff, vdata, voff)
        numpy arrays (kdata/koff None without keys).

        agree(error or None): called after each of the two steps with this
        step's error; a collective caller makes every rank raise when any
        rank failed, before the next collective step.  independent: read
        with this process's own preads even when batch reads are collective.
        """
        ords = np.ascontiguousarray(ordinals, dtype=np.int64)
        ends = np.array([ords.shape[0]], dtype=np.intp)
        return self.read_window(ords, ends, keys, agree, independent)[0][0]

    def read_record(self, int64_t ordinal, bint keys=True,
                    bint newest=False):
        """One record as read() reads it (the same prepare and fill, with
        this process's own preads), into bytes objects rather than a
        batch's arrays: (key or None, value, the newest committed txnid
        read after it, or 0 without `newest`).  A map-style dataset's item
        cost about 20 us through read()'s arrays."""
        cdef lio_bulk *b
        cdef uint64_t kb = 0, vb = 0, ks = 0, vs = 0, newest_id = 0
        cdef size_t end = 1
        cdef int64_t koff[2]
        cdef int64_t voff[2]
        cdef uint8_t dummy = 0
        cdef lio_batch_out out
        cdef int rc
        if self.bulk == NULL:
            raise RuntimeError('no record index')
        b = self._independent(0)
        if lio_index_pending(self.idx):
            self._extend(b, <uint64_t>max(0, ordinal), True)
        with nogil:
            rc = lio_bulk_prepare(b, &ordinal, 1, &kb, &vb)
        if rc == 0:
            rc = lio_bulk_batch_sizes(b, &end, 1, &ks, &vs)
        if rc:
            raise self._step_error(lio_bulk_error(b))
        value = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>vs)
        key = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>ks) if keys \
            else None
        out.vdata = <uint8_t *>PyBytes_AS_STRING(value) if vs else &dummy
        out.voff = voff
        out.kdata = NULL
        out.koff = NULL
        if keys:
            out.kdata = <uint8_t *>PyBytes_AS_STRING(key) if ks else &dummy
            out.koff = koff
        with nogil:
            rc = lio_bulk_fill_batches(b, &end, 1, &out)
            if newest and rc == 0:
                newest_id = _newest_txnid(self.env)
        if rc:
            raise self._step_error(lio_bulk_error(b))
        return key, value, newest_id

    def read_window(self, ordinals, ends, bint keys=True, agree=None,
                    bint independent=False, int lane=0, advise=None,
                    bint newest=False):
        """Several batches read together: batch j holds the records
        ordinals[ends[j-1]:ends[j]].  Each distinct leaf is read once and
        the overflow values of all batches in one plan.  Returns (batches,
        leaf_bytes): per batch (kdata, koff, vdata, voff) as in read(), the
        arrays views of a few blocks shared by the window.  `advise`:
        ordinals of windows to come, advised first (as advise()); with
        `newest`, the newest committed txnid read after the batches (as
        newest_txnid()) comes third.  Both join the window's own steps
        without the GIL: each release is a chance for another thread to
        take it, and the reader's lanes would wait for it back."""
        cdef int64_t[::1] ords = np.ascontiguousarray(ordinals, dtype=np.int64)
        cdef int64_t[::1] adv
        cdef const int64_t *aptr = NULL
        cdef size_t nadv = 0
        cdef uint64_t newest_id = 0
        cdef Py_ssize_t[::1] ev = np.ascontiguousarray(ends, dtype=np.intp)
        cdef size_t n = ords.shape[0], nb = ev.shape[0], j
        cdef uint64_t kb = 0, vb = 0, leaf_bytes = 0
        cdef int rc
        cdef const int64_t *optr = &ords[0] if n else NULL
        cdef lio_bulk *b
        cdef lio_batch_out *outs = NULL
        cdef uint8_t dummy = 0
        cdef uint64_t *sizes
        cdef uint64_t *ks
        cdef uint64_t *vs
        cdef int64_t *vst
        cdef int64_t *kst
        cdef int64_t pos = 0
        cdef uint8_t[::1] vbv
        cdef int64_t[::1] vo
        cdef uint8_t[::1] kbv
        cdef int64_t[::1] ko
        if self.bulk == NULL:
            raise RuntimeError('no record index')
        if nb == 0 or <size_t>ev[nb - 1] != n:
            raise ValueError('batch ends must finish at the window length')
        b = self._independent(lane) if independent else self.bulk
        if n and lio_index_pending(self.idx):
            self._extend(b, <uint64_t>max(0, int(np.max(ords))), True)
        if advise is not None and len(advise):
            adv = np.ascontiguousarray(advise, dtype=np.int64)
            aptr = &adv[0]
            nadv = adv.shape[0]
        with nogil:
            if nadv:
                lio_bulk_advise(b, aptr, nadv)
            rc = lio_bulk_prepare(b, optr, n, &kb, &vb)
            leaf_bytes = lio_bulk_leaf_bytes(b)
        e = self._step_error(lio_bulk_error(b)) if rc else None
        if agree is not None:
            agree(e)
        elif e is not None:
            raise e
        # Per batch: its key and value bytes, and where its keys and values
        # start (C arrays: as numpy arrays these were a quarter of a
        # one-batch read's 18 us).
        sizes = <uint64_t *>malloc(4 * (nb + 1) * sizeof(uint64_t))
        if sizes == NULL:
            raise MemoryError()
        ks = sizes
        vs = sizes + (nb + 1)
        vst = <int64_t *>(sizes + 2 * (nb + 1))
        kst = <int64_t *>(sizes + 3 * (nb + 1))
        try:
            rc = lio_bulk_batch_sizes(b, <const size_t *>&ev[0], nb, ks, vs)
            if rc:
                raise self._step_error(lio_bulk_error(b))
            # One block each for values, keys and offsets.  Each batch's
            # values start 16 bytes past a 64-byte boundary: overflow values
            # begin 16 bytes into their page, and copies from the page cache
            # run at full speed when the destination has the file offset's
            # alignment.
            for j in range(nb):
                pos = ((pos + 63 - 16) & ~(<int64_t>63)) + 16 if pos else 16
                vst[j] = pos
                pos += <int64_t>vs[j]
            vst[nb] = pos
            kst[0] = 0
            for j in range(nb):
                kst[j + 1] = kst[j] + <int64_t>ks[j]
            vblock = aligned_bytes(<size_t>pos, 0)
            voffs = np.empty(n + nb, dtype=np.int64)
            vbv = vblock
            vo = voffs
            if keys:
                kblock = np.empty(max(kst[nb], 1), dtype=np.uint8)
                koffs = np.empty(n + nb, dtype=np.int64)
                kbv = kblock
                ko = koffs
            outs = <lio_batch_out *>malloc(nb * sizeof(lio_batch_out))
            if outs == NULL:
                raise MemoryError()
            try:
                for j in range(nb):
                    first = ev[j - 1] if j else 0
                    outs[j].vdata = &vbv[vst[j]] if vs[j] else &dummy
                    outs[j].voff = &vo[first + j]
                    if keys:
                        outs[j].kdata = &kbv[kst[j]] if ks[j] else &dummy
                        outs[j].koff = &ko[first + j]
                    else:
                        outs[j].kdata = NULL
                        outs[j].koff = NULL
                with nogil:
                    rc = lio_bulk_fill_batches(b, <const size_t *>&ev[0], nb,
                                               outs)
                    if newest and rc == 0:
                        newest_id = _newest_txnid(self.env)
            finally:
                free(outs)
            e = self._step_error(lio_bulk_error(b)) if rc else None
            if agree is not None:
                agree(e)
            elif e is not None:
                raise e
            batches = []
            for j in range(nb):
                first = ev[j - 1] if j else 0
                last = ev[j]
                vo_j = voffs[first + j:last + j + 1]
                vd_j = vblock[vst[j]:vst[j] + <int64_t>vs[j]]
                if keys:
                    batches.append((kblock[kst[j]:kst[j + 1]],
                                    koffs[first + j:last + j + 1], vd_j, vo_j))
                else:
                    batches.append((None, None, vd_j, vo_j))
        finally:
            free(sizes)
        if newest:
            return batches, leaf_bytes, newest_id
        return batches, leaf_bytes

    def start_pipeline(self, perm, uint64_t total, uint64_t first,
                       uint64_t start, uint64_t stop, size_t batch,
                       size_t window_bytes, size_t prefetch_bytes,
                       size_t nbatch, unsigned ahead, bint keys,
                       bint newest, uint64_t advised, basis=None):
        """Read positions [start, stop) of a share of the epoch's order
        (`perm`, or None for key order; the share begins at position
        `first` and wraps past `total`) a window at a time in two C threads
        (lio_pipeline_start): a _Pipeline, or None when this file cannot
        (no index, batch reads through a Python executor, or a pipeline
        running already).  A begun index is counted by the windows in
        order, given `basis`: ((leaves, records) counted before the window
        ahead of the first, and before the first)."""
        cdef lio_pipeline_cfg cfg
        cdef lio_error err
        cdef lio_pipeline *p = NULL
        cdef int64_t[::1] pv
        cdef int rc, i
        if self.pipe is not None and self.pipe.pid != getpid():
            # forked by a path that ran no at-fork hook: the parent's
            # pipeline, and its lanes' readers, left as they are (their
            # memory may have been mid-change)
            self.pipe = None
            self.bulk_pipe[0] = self.bulk_pipe[1] = NULL
        if (self.idx == NULL or self.executor is not None or
                self.pipe is not None or
                (lio_index_pending(self.idx) and basis is None)):
            return None
        memset(&cfg, 0, sizeof(cfg))
        if lio_index_pending(self.idx):
            cfg.grow = self.idx
            cfg.entries = self.db.entries
            (cfg.basis[0][0], cfg.basis[0][1]), \
                (cfg.basis[1][0], cfg.basis[1][1]) = basis
        for i in range(2):
            if self.bulk_pipe[i] == NULL:
                if self.lane_io[i] == NULL:
                    rc = lio_pool_lane_open(&self.lane_io[i], self.pool, &err)
                    if rc:
                        raise _error(self.path, &err)
                    lio_pool_lane_get_executor(self.lane_io[i],
                                               &self.lane_ex[i])
                self.bulk_pipe[i] = self._new_bulk(&self.lane_ex[i])
            elif self.policy_set:   # (set while the last pipeline ran)
                lio_bulk_set_policy(self.bulk_pipe[i], self.max_gap,
                                    self.max_read)
            if self.cache_set:
                lio_bulk_set_cache(self.bulk_pipe[i], self.region,
                                   self.region_min, self.drop)
            cfg.lanes[i] = self.bulk_pipe[i]
        cdef _Pipeline pipe = _Pipeline.__new__(_Pipeline)
        if perm is not None:
            pipe.perm = np.ascontiguousarray(perm, dtype=np.int64)
            if <uint64_t>pipe.perm.shape[0] < total:
                raise ValueError('the order holds fewer than total records')
            pv = pipe.perm
            cfg.perm = &pv[0] if total else NULL
        cfg.nlanes = 2
        cfg.env = self.env if newest else NULL
        cfg.total = total
        cfg.first = first
        cfg.start = start
        cfg.stop = stop
        cfg.batch = batch
        cfg.window_bytes = window_bytes
        cfg.prefetch_bytes = prefetch_bytes
        cfg.nbatch = nbatch
        cfg.ahead = ahead
        cfg.keys = keys
        cfg.advised = advised
        # (With the GIL held: released, another thread could close this
        # file under the lanes before self.pipe names them.)
        rc = lio_pipeline_start(&p, &cfg, &err)
        if rc:
            raise _error(self.path, &err)
        pipe.p = p
        pipe.file = self
        pipe.path = self.path
        pipe.pid = getpid()
        pipe.end = stop
        pipe.batch = batch
        pipe.keys = keys
        pipe.resume_at = start
        self.pipe = pipe
        _running.add(pipe)
        return pipe

    def newest_txnid(self):
        """The newest committed txnid in the file now (both meta pages
        re-read), or 0 if they cannot be read."""
        cdef uint64_t t
        with nogil:
            t = _newest_txnid(self.env)
        return t

    def stats(self):
        """(read requests, bytes read) by the reader threads so far."""
        cdef uint64_t r = 0, b = 0
        if self.pool != NULL:
            lio_pool_stats(self.pool, &r, &b)
        return r, b

    def advice_stats(self):
        """(read-ahead requests given to the kernel, skipped because the
        region was found cached) by this file's reader threads so far."""
        cdef uint64_t given = 0, skipped = 0
        if self.pool != NULL:
            lio_pool_advice(self.pool, &given, &skipped)
        return given, skipped

    def gaps_skipped(self):
        """Planned gaps that reads from the page cache skipped instead of
        copying them into the plan's sink, so far."""
        return lio_pool_gaps_skipped(self.pool) if self.pool != NULL else 0

    def lane_descriptions(self):
        """For each pipeline lane opened so far: whether it reads the page
        cache through its own open file description (else the pool's)."""
        return [bool(lio_pool_lane_own_fd(self.lane_io[i]))
                for i in range(2) if self.lane_io[i] != NULL]

    def close(self):
        cdef int i
        self._drop_index()
        for i in range(2):
            lio_pool_lane_close(self.lane_io[i])
            self.lane_io[i] = NULL
        if self.pool != NULL:
            lio_pool_close(self.pool)
            self.pool = NULL
        if self.env != NULL:
            lio_env_close(self.env)
            self.env = NULL
        if self.posix != NULL:
            lio_posix_close(self.posix)
            self.posix = NULL

    def __dealloc__(self):
        self.close()


@cython.no_gc_clear   # (its owner must still be there in __dealloc__)
cdef class _IndexView:
    """A read-only byte view of one of an index's arrays (index_views),
    without a copy.  It keeps its BulkFile alive, and while any view
    exists the BulkFile defers freeing that index (_drop_index hands it to
    the view that goes last)."""
    cdef BulkFile owner
    cdef lio_index *idx
    cdef const uint8_t *ptr
    cdef size_t size
    cdef Py_ssize_t shape[1]

    def __getbuffer__(self, Py_buffer *view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError('an index view is read-only')
        view.obj = self
        _bytes_view(view, <void *>self.ptr, self.size, True, self.shape)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __dealloc__(self):
        if self.owner is not None:
            self.owner._view_gone(self.idx)


def checksum(data, uint64_t seed=0):
    """lio_checksum of a contiguous buffer's bytes, chained through seed;
    without the GIL."""
    cdef const uint8_t[::1] b = memoryview(data).cast('B')
    cdef size_t n = b.shape[0]
    cdef uint64_t h
    with nogil:
        h = lio_checksum(&b[0] if n else NULL, n, seed)
    return h


def leaves_ahead(first_ord, last_ord, uint64_t counted, uint64_t covered,
                 uint64_t leaves, uint64_t records, double err=-1):
    """The leaves [lo, hi) that a window of a first start in key order
    (ordinals first_ord..last_ord) will count, expected from the index as
    it stood before the window ahead of it counted (`counted` leaves
    holding `covered` records), its margin narrowed to what the windows
    before erred (`err` leaves, leaves_ahead_error; -1: not known):
    lio_leaves_ahead, the rule the window pipeline's lanes follow.  An
    empty window (last_ord < first_ord) expects none."""
    cdef uint64_t lo = 0, hi = 0
    if last_ord < first_ord:
        return counted, counted
    lio_leaves_ahead(first_ord, last_ord, counted, covered, leaves, records,
                     err, &lo, &hi)
    return lo, hi


def leaves_ahead_error(first_ord, last_ord, uint64_t counted,
                       uint64_t covered, uint64_t leaves, uint64_t records,
                       uint64_t true_lo, uint64_t true_hi):
    """How many leaves leaves_ahead's expectation (before its margin) for
    ordinals first_ord..last_ord lay from the leaves [true_lo, true_hi)
    that hold them; -1 where it expects none.  The lanes keep the largest
    for the margins of the windows after (lio_leaves_ahead_error)."""
    if last_ord < first_ord:
        return -1.0
    return lio_leaves_ahead_error(first_ord, last_ord, counted, covered,
                                  leaves, records, true_lo, true_hi)


def plan_reads(offsets, lengths, size_t max_gap, size_t max_read):
    """The requests the C planner makes of these extents (ascending,
    non-overlapping file ranges), coalesced with a gap tolerance and a
    maximum request size: a list of (offset, length, segments).  For tests
    and for the scale model: the Reader plans every read this way."""
    cdef int64_t[::1] offs = np.ascontiguousarray(offsets, dtype=np.int64)
    cdef int64_t[::1] lens = np.ascontiguousarray(lengths, dtype=np.int64)
    cdef lio_plan plan
    cdef size_t i, n = offs.shape[0]
    cdef int rc = 0
    cdef uint8_t *dst = NULL
    if lens.shape[0] != n:
        raise ValueError('offsets and lengths differ in length')
    lio_plan_init(&plan, max_gap, max_read)
    try:
        for i in range(n):
            if offs[i] < 0 or lens[i] < 0:
                raise ValueError('negative offset or length')
            # the destinations only need to be distinct: never written
            dst = <uint8_t *>(<size_t>1 << 40) + <size_t>offs[i]
            rc = lio_plan_add(&plan, <uint64_t>offs[i], dst, <size_t>lens[i])
            if rc:
                raise ValueError('extent %d overlaps or precedes the one '
                                 'before it' % i)
        return [(plan.reads[i].off, plan.reads[i].len, plan.reads[i].nseg)
                for i in range(plan.nreads)]
    finally:
        lio_plan_free(&plan)


def gather(src, starts, lengths, out, dst):
    """Copies the items src[starts[i]:starts[i] + lengths[i]] to
    out[dst[i]:dst[i] + lengths[i]], without the GIL: the Reader puts the
    records of several environments back into a batch's order with it.
    Every range is checked against its array first (ValueError)."""
    cdef const uint8_t[::1] s = src
    cdef uint8_t[::1] d = out
    cdef int64_t[::1] st = np.ascontiguousarray(starts, dtype=np.int64)
    cdef int64_t[::1] ln = np.ascontiguousarray(lengths, dtype=np.int64)
    cdef int64_t[::1] ds = np.ascontiguousarray(dst, dtype=np.int64)
    cdef Py_ssize_t i, n = st.shape[0]
    cdef int64_t ssize = s.shape[0], dsize = d.shape[0]
    if ln.shape[0] != n or ds.shape[0] != n:
        raise ValueError('starts, lengths and dst differ in length')
    for i in range(n):
        if ln[i] < 0 or st[i] < 0 or ds[i] < 0 or \
                st[i] > ssize - ln[i] or ds[i] > dsize - ln[i]:
            raise ValueError('item %d lies outside its source or '
                             'destination' % i)
    with nogil:
        for i in range(n):
            if ln[i]:
                memcpy(&d[ds[i]], &s[st[i]], <size_t>ln[i])
