# cython: language_level=3, boundscheck=False, wraparound=False
# cython: initializedcheck=False, cdivision=True, binding=True
"""lmdbio's py-lmdb-compatible read API over the C core (csrc/).

``Environment``, ``Transaction``, ``Cursor`` and ``_Database`` mirror py-lmdb's
classes of the same names, read-only: every write raises
:class:`lmdbio.ReadonlyError`.  The data file is never mapped: the C core
reads pages with explicit ``pread`` calls into a bounded page cache.  The GIL
is released around every core call that may read from disk.

Internal hooks (used by lmdbio's ``mdb_stat``/``mdb_dump`` clones)::

    env._free_db()   -> _Database for the free-page DB (FREE_DBI, dbi 0),
                        usable with txn.cursor(db=...) and txn.stat(db).
    env._meta()      -> dict(psize, last_pg, txnid, mapsize, env_flags,
                        free_db, main_db) of the newest committed meta page
                        (free_db / main_db: dicts of the MDB_db fields).
    env._metas()     -> [dict, dict]: both meta pages, as _meta() describes.
    env._data_path() -> path of the data file.

Notes on behaviour:

- A cursor step that stays inside the current leaf (the common case of a
  scan) runs with the GIL held and without locks (lio_cursor_step); the GIL
  is released around every other lio_cursor_get / lio_get, snapshots and
  opens, so a cache miss (a real read) never blocks other threads.
- Read-ahead follows the tree: a cursor entering a leaf that is not cached
  reads the next leaves its parent names with it, several reads in flight
  (a pool of reader threads per environment, joined when it closes); gets
  all over a large tree have a thread of the core note the rest of its
  leaves (csrc/leafdir.c's scan, also joined at close).
  ``readahead=False`` turns both off.  Test hooks: ``$LMDBIO_READAHEAD_BYTES``
  overrides the read-ahead size (0: off), ``$LMDBIO_CURSOR_FASTPATH=0``
  sends every step through lio_cursor_get, ``$LMDBIO_READAHEAD_DEVICE=1``
  reads as if the OS cache never held the file (read-around blocks, reads
  in flight).
- A value in an overflow run that is not in the page cache is read by the
  core straight into the bytes object returned (lio_cursor_defer_values,
  lio_cursor_value_into): one copy, from the kernel into the object, and
  only when the value is asked for (a scan of keys reads no such value).
  A damaged run header is therefore reported by the call that returns the
  value (``value()``, ``item()``, the iterators, ``get()``), not by the
  positioning call before it.  The object of a value that the program has
  let go of takes a later one (_Values): its memory is still mapped, where
  a new object's would be faulted in fresh.
- ``buffers=True`` returns read-only memoryviews onto the page the cursor
  holds (values in overflow pages: onto their own bytes objects).  As py-lmdb
  documents for its own buffers, they are valid until the next operation
  on the cursor (for ``Transaction.get``: on the transaction) and must not
  be used after it: the page may be evicted and reused.
- Database handles follow liblmdb's DBI table as py-lmdb exposes it: a
  handle opened after a transaction began is unknown to that transaction
  (``InvalidParameterError``) unless opened with ``txn=`` it; a handle opened
  with ``txn=`` becomes known to later transactions only through a later
  ``open_db()`` without ``txn=``.
- Ending a transaction (or ``env.close()``) invalidates its cursors; their
  core handles are released on their next use or when they are freed, and
  the core environment lives until the last one is released.
"""

cimport cython
from cpython.bytes cimport (PyBytes_FromStringAndSize, PyBytes_AS_STRING,
                            PyBytes_GET_SIZE, PyBytes_CheckExact)
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release,
                             PyBUF_SIMPLE, PyBUF_READ)
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF, Py_XDECREF
from cpython.unicode cimport PyUnicode_Check
from cpython.memoryview cimport PyMemoryView_FromMemory
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy, memset, memchr, strlen
from libc.stdlib cimport malloc, free
from libc.errno cimport errno, EINTR, EIO

import errno as _errno
import os as _os
import sys as _sys
import weakref as _weakref

from lmdbio import errors as _errors
from lmdbio.errors import (Error, ReadonlyError, make_error as _make_error,
                           invalid_error as _invalid_error)

cdef extern from "<unistd.h>" nogil:
    ssize_t c_write "write"(int fd, const void *buf, size_t count)

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void **memptr, size_t alignment, size_t size)



cdef int _newest_txnid(void *ctx, uint64_t *txnid, lio_error *err) noexcept nogil:
    """lio_txnid_fn for lio_lock_open: the newest committed txnid of the
    data file (ctx: the lio_env)."""
    cdef lio_meta metas[2]
    cdef int rc = lio_env_read_metas(<lio_env *>ctx, metas, err)
    if rc:
        return rc
    txnid[0] = metas[0].txnid if metas[0].txnid > metas[1].txnid else metas[1].txnid
    return 0


# ---------------------------------------------------------------------------
# Constants and helpers
# ---------------------------------------------------------------------------

cdef enum:
    _SNAPSHOT_RETRIES = 1000

# liblmdb return codes py-lmdb reports: from lmdbio.errors, their one table.
cdef int MDB_NOTFOUND = _errors.MDB_NOTFOUND
cdef int MDB_INCOMPATIBLE = _errors.MDB_INCOMPATIBLE
cdef int MDB_BAD_VALSIZE = _errors.MDB_BAD_VALSIZE
cdef int MDB_DBS_FULL = _errors.MDB_DBS_FULL
cdef int MDB_CORRUPTED = _errors.MDB_CORRUPTED
cdef int EACCES_ = 13
cdef int EINVAL_ = 22

# Environment flag liblmdb keeps in mm_dbs[0].md_flags for subdir=False files.
cdef unsigned MDB_NOSUBDIR = 0x4000

#: how far a cursor reads ahead (in leaves of this many bytes) with
#: readahead=True.
READAHEAD_BYTES = 256 * 1024
#: reader threads per environment for the cursors' read-ahead.
READAHEAD_THREADS = 8
#: keys Cursor.getmulti converts and reads ahead for at a time.
cdef Py_ssize_t GETMULTI_CHUNK = 4096

_FSENC = _sys.getfilesystemencoding()

_BAD_FILE_CODES = frozenset([LIO_PAGE_NOTFOUND, LIO_CORRUPTED, LIO_INVALID,
                             LIO_VERSION_MISMATCH, LIO_SYSERR])


cdef object _core_error(what, int rc, const lio_error *err, path):
    """The exception for core return code `rc` (declared in _core.pxd: every
    compiled module raises through it).  Bad-file and I/O errors carry the
    core's message (which names the page), prefixed with `path`; the others
    read like py-lmdb's (``"what: reason"``).  ``what=None``: the core's
    message (prefixed with `path` unless None), whatever the code (the bulk
    reader's errors, where no liblmdb operation names the failure)."""
    cdef int code = rc
    cdef int sys_errno = 0
    msg = None
    if err != NULL and err.msg[0]:
        msg = (<bytes>err.msg).decode('utf-8', 'replace')
    if rc == LIO_SYSERR:
        sys_errno = err.sys_errno if err != NULL and err.sys_errno else EIO
        code = sys_errno
        if err != NULL and err.off != <uint64_t>-1 and path is not None:
            # a read of the data file failed (after the core's retries)
            return _errors.disk_error('%s: %s' % (path, msg), sys_errno,
                                      path, err.off)
    elif rc == LIO_EINVAL:
        code = EINVAL_
    elif rc == LIO_ENOMEM:
        code = _errno.ENOMEM
    if msg is not None and what is None:
        what = msg if path is None else '%s: %s' % (path, msg)
    elif msg is not None and path is not None and rc in _BAD_FILE_CODES:
        what = '%s: %s' % (path, msg)
    return _make_error(what, code, sys_errno=sys_errno)


cdef bytes _to_bytes(obj):
    """A key or value argument as bytes, with py-lmdb's TypeErrors."""
    cdef Py_buffer view
    if PyBytes_CheckExact(obj):
        return <bytes>obj
    if PyUnicode_Check(obj):
        raise TypeError("Won't implicitly convert Unicode to bytes; "
                        "use .encode()")
    PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE)
    try:
        return PyBytes_FromStringAndSize(<char *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


cdef inline object _val_bytes(const lio_val *v):
    if v.size == 0:
        return b''
    return PyBytes_FromStringAndSize(<const char *>v.data, v.size)


cdef inline object _cur_val(lio_cursor *c, const lio_val *v, bint buffers):
    # buffers=True: a read-only view onto the pinned page when the bytes are
    # in it (valid until the cursor's next operation, as py-lmdb's).
    if buffers:
        if v.size and lio_cursor_in_page(c, v):
            return PyMemoryView_FromMemory(<char *>v.data, v.size, PyBUF_READ)
        # elsewhere (an overflow value, the caller's input): a private copy
        return memoryview(_val_bytes(v))
    if v.size == 0:
        return b''
    return PyBytes_FromStringAndSize(<const char *>v.data, v.size)


cdef extern from *:
    """
    /* A bytes object that only lmdbio holds may take a new value (see
     * _Values).  Not in free-threaded builds, where a reference count
     * read by one thread says nothing of the others, nor on PyPy, nor on
     * CPython versions whose bytes objects were not checked (up to 3.14
     * they carry the cached hash ob_shash that is reset here). */
    #if defined(Py_GIL_DISABLED) || defined(PYPY_VERSION) || \
        PY_VERSION_HEX >= 0x030F0000
    #define LIO_REUSE_BYTES 0
    #else
    #define LIO_REUSE_BYTES 1
    #endif
    static void lio_bytes_retarget(PyObject *o, Py_ssize_t n)
    {
        /* length n (its memory holds at least n + 1 bytes), no hash */
        Py_SET_SIZE(o, n);
        PyBytes_AS_STRING(o)[n] = 0;
    #if defined(__GNUC__)
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    #endif
        ((PyBytesObject *)o)->ob_shash = -1;
    #if defined(__GNUC__)
    #pragma GCC diagnostic pop
    #endif
    }
    """
    bint LIO_REUSE_BYTES
    void lio_bytes_retarget(object o, Py_ssize_t n)
    Py_ssize_t Py_REFCNT(PyObject *o)


cdef enum:
    _KEEP_MAX = 32 << 20     # largest value object a _Values keeps
    _KEEP_TOTAL = 96 << 20   # most bytes of objects it keeps
    _KEEP_N = 8              # most objects it keeps
    _KEEP_FEW = 3            # of them, for values under _KEEP_BIG
    _KEEP_BIG = 128 << 10    # (glibc's mmap threshold: smaller ones come
                             # and go in its heap without faults)
    _AHEAD_BYTES = 1 << 20   # most file bytes a walk's batch of values spans
    _WORKER_BYTES = 4 << 20  # most value bytes of a batch for the worker


@cython.final
cdef class _Values:
    """The bytes objects that overflow values are read into, for one cursor
    (or a transaction's get).

    A new object per value would land in fresh memory: glibc's malloc
    returns the top of its heap to the kernel as such values (over 128 KiB)
    are freed, and the kernel faults in and zeroes new pages for the next
    one, which costs as much as reading the value.  So the last objects are
    kept, and one that the program has let go of (this pool holds its only
    reference) takes a later value whose length it can hold without
    wasting more than a quarter of it: its memory is mapped and in the
    CPU's caches.  No one can see the change: an object is reused only when
    nothing else refers to it.  At most _KEEP_N objects of at most
    _KEEP_MAX bytes each, _KEEP_TOTAL in all, are kept: enough for a walk's
    batch of values (a fresh process walking 3k values of 190 KiB, five a
    batch, faulted in 7578 pages keeping three, 564 keeping eight).  For
    values under _KEEP_BIG, the first _KEEP_FEW slots only: the search
    costs more than malloc saves there (50k CIFAR values of 3 KB walked
    10-20% slower over eight)."""
    cdef PyObject *kept[_KEEP_N]     # (references this pool holds; NULL)
    cdef Py_ssize_t cap[_KEEP_N]     # the lengths their memory holds
    cdef Py_ssize_t total            # their sum

    def __dealloc__(self):
        cdef int i
        for i in range(_KEEP_N):
            Py_XDECREF(self.kept[i])
            self.kept[i] = NULL

    cdef inline void _drop(self, int i):
        self.total -= self.cap[i]
        Py_DECREF(<object>self.kept[i])
        self.kept[i] = NULL

    cdef object new(self, Py_ssize_t size):
        """An object of length `size` for the next value."""
        cdef object o = None
        cdef Py_ssize_t cap = size, most = size + size // 4
        cdef int i, j, slot = -1
        cdef int lim = _KEEP_N if size >= _KEEP_BIG else _KEEP_FEW
        # One that only this pool refers to (the casts take no reference)
        # and whose memory holds size bytes, wasting at most a quarter.
        if LIO_REUSE_BYTES:
            for i in range(lim):
                if (self.kept[i] != NULL and size <= self.cap[i] <= most and
                        Py_REFCNT(self.kept[i]) == 1):
                    o, cap = <object>self.kept[i], self.cap[i]
                    self._drop(i)
                    lio_bytes_retarget(o, size)
                    break
        if o is None:
            o = PyBytes_FromStringAndSize(NULL, size)
        # Objects over _KEEP_MAX are not kept: several of them would hold
        # too much memory once the program has let go of them.
        if cap > _KEEP_MAX:
            return o
        # an empty slot, else in place of the smallest kept (if smaller)
        for i in range(lim):
            if self.kept[i] == NULL:
                slot = i
                break
            if self.cap[i] < cap and (slot < 0 or self.cap[i] < self.cap[slot]):
                slot = i
        if slot < 0:
            return o
        if self.kept[slot] != NULL:
            self._drop(slot)
        # within _KEEP_TOTAL: the smallest others go first
        while self.total + cap > _KEEP_TOTAL:
            i = -1
            for j in range(_KEEP_N):
                if self.kept[j] != NULL and (i < 0 or self.cap[j] < self.cap[i]):
                    i = j
            if i < 0:
                break
            self._drop(i)
        Py_INCREF(o)
        self.kept[slot] = <PyObject *>o
        self.cap[slot] = cap
        self.total += cap
        return o


cdef object _value_into(lio_cursor *c, size_t size, _Values pool,
                        Transaction t, what):
    """The value c's last operation left unread (in an overflow run), read
    by the core straight into a bytes object of the pool."""
    cdef object b = pool.new(size)
    cdef void *dst = PyBytes_AS_STRING(b)
    cdef int rc
    with nogil:
        rc = lio_cursor_value_into(c, dst)
    if rc:
        raise t._read_error(what, rc, lio_cursor_error(c))
    return b


cdef dict _dbrec_dict(const lio_dbrec *r):
    return {'pad': r.pad, 'flags': r.flags, 'depth': r.depth,
            'branch_pages': r.branch_pages, 'leaf_pages': r.leaf_pages,
            'overflow_pages': r.overflow_pages, 'entries': r.entries,
            'root': r.root}


cdef dict _meta_dict(const lio_meta *m):
    return {'psize': m.psize, 'last_pg': m.last_pg, 'txnid': m.txnid,
            'mapsize': m.mapsize, 'address': m.address,
            'env_flags': m.env_flags,
            'free_db': _dbrec_dict(&m.free_db),
            'main_db': _dbrec_dict(&m.main_db)}


cdef dict _stat_dict(uint32_t psize, const lio_dbrec *r):
    return {'psize': psize, 'depth': r.depth,
            'branch_pages': r.branch_pages, 'leaf_pages': r.leaf_pages,
            'overflow_pages': r.overflow_pages, 'entries': r.entries}


def _fspath(path):
    """(str for messages and path(), bytes for the OS)."""
    if isinstance(path, bytes):
        return path.decode(_FSENC, 'surrogateescape'), path
    if isinstance(path, str):
        return path, path.encode(_FSENC, 'surrogateescape')
    p = _os.fspath(path)
    return _fspath(p)


class _SignatureOf:
    """``inspect.signature`` of a cdef class, whose ``__init__`` is a slot
    without one: the signature of the named method, less ``self``."""

    def __init__(self, name):
        self.name = name

    def __get__(self, obj, cls):
        import inspect
        sig = inspect.signature(getattr(cls, self.name))
        return sig.replace(parameters=list(sig.parameters.values())[1:])


def _reopen(cls, args, kwargs):
    """Unpickle an Environment: open it again with the same arguments."""
    return cls(*args, **kwargs)


# ---------------------------------------------------------------------------
# _Database
# ---------------------------------------------------------------------------

cdef enum:
    DB_MAIN = 0
    DB_FREE = 1
    DB_NAMED = 2


@cython.final
cdef class _Database:
    """Internal database handle.  This class is opaque, save a single method.

    Should not be constructed directly.  Use
    :py:meth:`Environment.open_db` instead."""
    cdef int kind
    cdef bytes name           # named DBs: the name (up to its first NUL)
    cdef unsigned dbflags     # persistent flags when the handle was opened
    cdef size_t env_id        # address of the owning Environment
    # Visibility, as liblmdb's DBI table: a handle is usable in the
    # transactions begun after it was committed (seq != 0: the env's commit
    # sequence number), and in the transaction that opened it.
    cdef uint64_t seq
    # Record cache: the record depends only on the snapshot's txnid.
    cdef bint rec_ok
    cdef uint64_t rec_txnid
    cdef lio_dbrec rec
    cdef object __weakref__

    def __cinit__(self):
        self.rec_ok = False

    def flags(self, *args):
        """Return the database's associated flags as a dict of
        :py:meth:`Environment.open_db` keyword arguments."""
        if len(args) > 1:
            raise TypeError('flags takes 0 or 1 arguments')
        f = self.dbflags
        return {
            'reverse_key': bool(f & LIO_REVERSEKEY),
            'dupsort': bool(f & LIO_DUPSORT),
            'integerkey': bool(f & LIO_INTEGERKEY),
            'integerdup': bool(f & LIO_INTEGERDUP),
            'dupfixed': bool(f & LIO_DUPFIXED),
        }

    def __repr__(self):
        if self.kind == DB_MAIN:
            return '<lmdbio._Database main>'
        if self.kind == DB_FREE:
            return '<lmdbio._Database free>'
        return '<lmdbio._Database %r>' % (self.name,)


cdef _Database _new_db(Environment env, int kind, bytes name, unsigned flags):
    cdef _Database db = _Database.__new__(_Database)
    db.kind = kind
    db.name = name
    db.dbflags = flags
    db.env_id = <size_t><void *>env
    db.seq = 0
    return db


# ---------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------

cdef int64_t _mpi_read(void *ctx, uint64_t off, void *buf,
                       size_t length) noexcept nogil:
    with gil:
        return (<_MPISource>ctx).read(off, <uint8_t *>buf, length)


cdef int64_t _mpi_size(void *ctx) noexcept nogil:
    with gil:
        return (<_MPISource>ctx).size()


cdef class _MPISource:
    """The data file through MPI-IO (MPI.File.Open on the communicator):
    the pages a cursor misses are independent Read_at calls."""
    cdef object fh
    cdef object MPI
    cdef object error
    cdef lio_source src

    def __init__(self, comm, path):
        from mpi4py import MPI
        self.MPI = MPI
        self.fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
        self.src.ctx = <void *>self
        self.src.read = _mpi_read
        self.src.size = _mpi_size
        self.src.align = 1
        # MPI-IO's reads are not counted as the process's blocks read in:
        # a slow one is the storage's on its time alone (lio_source)
        self.src.counted_reads = 0
        self.src.os_readahead = 0
        self.src.read_cached = NULL   # (MPI-IO keeps no cache of ours)

    cdef int64_t read(self, uint64_t off, uint8_t *buf, size_t length):
        cdef uint8_t[::1] view
        try:
            if length == 0:
                return 0
            view = <uint8_t[:length]>buf
            status = self.MPI.Status()
            self.fh.Read_at(off, [view, self.MPI.BYTE], status)
            return status.Get_count(self.MPI.BYTE)
        except Exception as e:
            self.error = e
            return -5  # EIO

    cdef int64_t size(self):
        try:
            return self.fh.Get_size()
        except Exception as e:
            self.error = e
            return -5

    def close(self):
        if self.fh is not None:
            self.fh.Close()
            self.fh = None


@cython.no_gc_clear
cdef class Environment:
    """
    A read-only LMDB environment, read without mmap.

    ``lmdbio.open(...)`` is ``Environment(...)``, as in py-lmdb, and takes
    py-lmdb's arguments.  The data file is never created, modified or
    mapped.

    Arguments:
        path: A directory holding ``data.mdb`` (``subdir=True``) or the data
            file itself (``subdir=False``); ``str``, ``bytes`` or a path-like.
        map_size: py-lmdb's map size: only what :py:meth:`info` reports
            (raised to the size of the committed data); nothing is mapped.
        subdir: ``path`` is a directory (``True``) or the data file.
        readonly: Accepted for compatibility; ``False`` opens read-only all
            the same, and every write raises ``lmdbio.ReadonlyError``.
        metasync: Accepted for compatibility (a write option); reported by
            :py:meth:`flags`.
        sync: As ``metasync``.
        map_async: As ``metasync``.
        mode: Permissions of the lock file if ``lock=True`` creates it.
        create: Accepted for compatibility: the data file is never created
            (a missing one raises ``lmdbio.Error`` naming the path).
        readahead: A page-cache miss on a tree page reads a 256 KiB block
            (``False``: one page); lookups all over a large tree have a
            thread note the leaves they have not reached (docs/drop-in.md;
            ``False``: no such thread).
        writemap: Accepted for compatibility; ignored (liblmdb ignores it
            for read-only environments).
        meminit: Accepted for compatibility; reported by :py:meth:`flags`.
        max_readers: Size of the reader table if ``lock=True`` creates the
            lock file.
        max_dbs: How many named databases :py:meth:`open_db` may open
            (0: only the main database), as in py-lmdb.
        max_spare_txns: Accepted for compatibility; ignored.
        lock: ``True`` (the default, as in py-lmdb): each transaction holds
            a reader slot in the lock file (``lock.mdb``, or ``PATH-lock``),
            as a liblmdb reader does, so a live writer cannot reuse the
            pages of its snapshot.  ``False`` touches no lock file
            (immutable datasets, network filesystems); then a writer two
            commits past the snapshot raises ``lmdbio.SnapshotChangedError``.
        comm: An mpi4py communicator: every rank opens the file
            collectively with MPI-IO and every transaction reads the
            snapshot rank 0 chose; ``begin()`` and ``close()`` are then
            collective.  Such an environment cannot be pickled.
        engine: ``"auto"`` (MPI-IO with ``comm``, else ``pread``),
            ``"posix"`` (``pread``) or ``"mpiio"`` (MPI-IO; without
            ``comm``, over ``MPI.COMM_WORLD``).
        direct: Open the data file with ``O_DIRECT`` (POSIX engine only; a
            filesystem that refuses it raises).
        cache_bytes: The budget of the page cache that cursors and lookups
            read through.

    Pickling carries the path and these arguments, never open files:
    ``pickle.loads`` opens the environment again in the new process.
    """
    cdef lio_posix *_posix
    cdef lio_pool *_pool      # reader threads of the cursors' read-ahead
    cdef object _mpisrc       # _MPISource with engine="mpiio"
    cdef object _comm         # lmdbio's duplicate of comm=, or None
    cdef public object _coll  # lmdbio.mpi.Collective over _comm
    cdef lio_source _src
    cdef lio_env *_env
    cdef lio_lock *_lock
    cdef str _path            # as given (decoded), for path() and messages
    cdef str _dpath           # data file path
    cdef bytes _dpath_b
    cdef bint _subdir, _readonly, _metasync, _sync, _map_async, _readahead
    cdef bint _writemap, _meminit, _use_lock
    cdef bint _fastpath       # cursors step inside a leaf without the core
    cdef size_t _map_size_arg
    cdef uint64_t _mapsize
    cdef unsigned _max_readers, _max_dbs
    cdef uint32_t _psize
    cdef dict _dbs
    cdef _Database _main
    cdef _Database _free
    cdef uint64_t _seq        # DBI commit sequence (see _Database.seq)
    # Lifetime: close() (or set_mapsize()) bumps _gen, which invalidates
    # every transaction begun before (they check it on each call).  The core
    # env stays allocated while lio_cursors are open (_nopen): a cursor of an
    # ended transaction is closed on its next use or when it is freed.
    cdef uint64_t _gen
    cdef Py_ssize_t _nopen
    cdef bint _closed
    # The snapshot for the lock table's newest txnid (lock=True): a txnid
    # names one committed meta page, so begin() need not re-read it.
    cdef bint _snap_ok
    cdef lio_meta _snap_cache
    # The value objects of an ended transaction's gets, for the next one's:
    # a transaction per get (torchvision's LSUN) otherwise put every value
    # in fresh memory (70 KB values: 20 us a get against 12 in one).
    cdef _Values _spare_values
    cdef object _args         # (args, kwargs) of the constructor, for pickling
    cdef object __weakref__

    def __cinit__(self):
        self._posix = NULL
        self._pool = NULL
        self._env = NULL
        self._lock = NULL

    # The constructor's arguments live in _open (a Python-visible method,
    # so inspect.signature sees them); __init__, a slot without a
    # signature, keeps them for pickling.
    def __init__(self, *args, **kwargs):
        self._open(*args, **kwargs)
        self._args = (args, kwargs)

    __signature__ = _SignatureOf('_open')

    def __reduce__(self):
        """Pickle the path and constructor arguments (never open files):
        unpickling opens the environment again."""
        args, kwargs = self._args
        if kwargs.get('comm') is not None or kwargs.get('engine') == 'mpiio':
            raise TypeError(
                'cannot pickle an Environment opened with comm= or '
                'engine="mpiio": a communicator does not travel; open it '
                'again in each process with lmdbio.open(path, comm=...)')
        return (_reopen, (type(self), args, kwargs))

    def _open(self, path, map_size=10485760, subdir=True, readonly=True,
                 metasync=True, sync=True, map_async=False, mode=0o755,
                 create=True, readahead=True, writemap=False, meminit=True,
                 max_readers=126, max_dbs=0, max_spare_txns=1, lock=True,
                 *, comm=None, engine="auto", direct=False,
                 cache_bytes=64 << 20):
        cdef lio_error err
        cdef int rc
        cdef lio_meta snap
        cdef size_t c_cache, c_ra
        cdef int c_direct
        cdef const char *cpath
        cdef bytes lpath_b
        cdef const char *clpath
        cdef unsigned c_maxr, c_mode
        cdef lio_executor ex
        cdef unsigned c_threads

        if self._env != NULL:
            raise Error('Environment already initialised')
        if engine not in ('auto', 'posix', 'mpiio'):
            raise ValueError('engine must be "auto", "posix" or "mpiio", '
                             'not %r' % (engine,))
        if comm is None and engine == 'mpiio':
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        if comm is not None:
            # Collective: every rank opens, and every transaction reads
            # the snapshot rank 0 chose (broadcast), with independent reads.
            from lmdbio.mpi import Collective
            if not hasattr(comm, 'Dup'):
                raise TypeError('comm must be an mpi4py communicator')
            if engine == 'auto':
                engine = 'mpiio'
            self._comm = comm.Dup()
            self._coll = Collective(self._comm)
        for name, v in (('map_size', map_size), ('max_readers', max_readers),
                        ('max_dbs', max_dbs), ('cache_bytes', cache_bytes)):
            if v < 0:
                raise OverflowError('Integer argument must be >= 0')

        self._path, path_b = _fspath(path)
        self._subdir = bool(subdir)
        self._readonly = True
        self._metasync = bool(metasync)
        self._sync = bool(sync)
        self._map_async = bool(map_async)
        self._readahead = bool(readahead)
        self._writemap = False        # liblmdb drops it for read-only envs
        self._meminit = bool(meminit)
        self._use_lock = bool(lock)
        self._map_size_arg = map_size
        self._max_readers = max_readers
        self._max_dbs = max_dbs
        self._dbs = {}
        self._gen = 1
        self._nopen = 0
        self._closed = False
        self._snap_ok = False

        if self._subdir:
            dpath_b = _os.path.join(path_b, b'data.mdb')
            lpath_b = _os.path.join(path_b, b'lock.mdb')
            if not _os.path.exists(path_b):
                raise _make_error(self._path, _errno.ENOENT)
            if not _os.path.isdir(path_b):
                raise _make_error(self._path, _errno.ENOTDIR)
        else:
            dpath_b = path_b
            lpath_b = path_b + b'-lock'
            if _os.path.isdir(path_b):
                raise _make_error(self._path, _errno.EISDIR)
        self._dpath_b = dpath_b
        self._dpath = dpath_b.decode(_FSENC, 'surrogateescape')
        if not _os.path.exists(dpath_b):
            raise _make_error(self._path, _errno.ENOENT)

        cpath = dpath_b
        c_direct = 1 if direct else 0
        if engine == 'mpiio':
            if direct:
                raise Error('%s: direct=True needs engine="posix"'
                            % self._path)
            self._mpisrc = self._coll.run(_MPISource, self._comm, self._dpath)
            self._src = (<_MPISource>self._mpisrc).src
        else:
            with nogil:
                rc = lio_posix_open(&self._posix, cpath, c_direct, &err)
            if rc:
                if rc == LIO_SYSERR:
                    raise _make_error(self._path, err.sys_errno or EIO,
                                      sys_errno=err.sys_errno or EIO)
                raise _core_error(self._path, rc, &err, self._dpath)
            lio_posix_get_source(self._posix, &self._src)

        c_cache = cache_bytes
        c_ra = READAHEAD_BYTES if self._readahead else 0
        ra_env = _os.environ.get('LMDBIO_READAHEAD_BYTES')
        if ra_env and self._readahead:
            c_ra = int(ra_env)
        with nogil:
            rc = lio_env_open(&self._env, &self._src, c_cache, c_ra, &err)
        if rc:
            self._free_handles()
            raise _core_error(self._path, rc, &err, self._dpath)
        self._psize = lio_env_psize(self._env)
        self._fastpath = _os.environ.get('LMDBIO_CURSOR_FASTPATH') != '0'
        if _os.environ.get('LMDBIO_READAHEAD_DEVICE') == '1':
            lio_env_assume_device(self._env, 1)
        if c_ra and self._posix != NULL:
            c_threads = READAHEAD_THREADS
            with nogil:
                rc = lio_pool_open(&self._pool, self._posix, c_threads, &err)
            if rc == 0:
                lio_pool_get_executor(self._pool, &ex)
                lio_env_set_executor(self._env, &ex)
            # else: read-ahead reads one request at a time

        with nogil:
            rc = lio_env_snapshot(self._env, 0, &snap, &err)
        if rc:
            self._free_handles()
            raise _core_error(self._path, rc, &err, self._dpath)

        # liblmdb: the configured map size (or the file's, for 0), raised to
        # the committed data size.
        self._mapsize = self._map_size_arg or snap.mapsize
        if self._mapsize < (snap.last_pg + 1) * snap.psize:
            self._mapsize = (snap.last_pg + 1) * snap.psize

        if self._use_lock:
            clpath = lpath_b
            c_maxr = max_readers
            c_mode = mode & ~0o111
            with nogil:
                rc = lio_lock_open(&self._lock, clpath, c_mode, c_maxr,
                                   _newest_txnid, <void *>self._env, &err)
            if rc:
                self._free_handles()
                if rc == LIO_SYSERR:
                    raise _make_error(self._path, err.sys_errno or EIO,
                                      sys_errno=err.sys_errno or EIO)
                raise _core_error(self._path, rc, &err,
                                  lpath_b.decode(_FSENC, 'surrogateescape'))

        self._main = _new_db(self, DB_MAIN, None,
                             snap.main_db.flags & LIO_PERSISTENT_FLAGS)
        self._free = _new_db(self, DB_FREE, None, LIO_INTEGERKEY)
        self._dbs[None] = self._main
        self._seq = 0

    cdef void _free_handles(self) noexcept:
        if self._lock != NULL:
            lio_lock_close(self._lock)
            self._lock = NULL
        if self._nopen > 0:
            return          # freed when the last lio_cursor closes
        if self._env != NULL:
            lio_env_close(self._env)
            self._env = NULL
        if self._pool != NULL:
            lio_pool_close(self._pool)
            self._pool = NULL
        if self._posix != NULL:
            lio_posix_close(self._posix)
            self._posix = NULL
        if self._mpisrc is not None:
            self._mpisrc.close()   # collective, as close() is under MPI
            self._mpisrc = None
        if self._comm is not None:
            self._comm.Free()
            self._comm = self._coll = None

    cdef void _cursor_closed(self) noexcept:
        self._nopen -= 1
        if self._closed and self._nopen <= 0:
            self._nopen = 0
            self._free_handles()

    def __dealloc__(self):
        self._nopen = 0
        # Collective MPI calls cannot run at garbage-collection time, which
        # differs between ranks: those handles are left to MPI_Finalize.
        self._mpisrc = None
        self._comm = self._coll = None
        self._free_handles()

    cdef int _check(self) except -1:
        if self._closed or self._env == NULL:
            raise _invalid_error()
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.close()

    def close(self):
        """Close the environment, invalidating any open iterators, cursors,
        and transactions.  Repeat calls to :py:meth:`close` have no effect."""
        if self._closed or self._env == NULL:
            return
        self._closed = True
        self._gen += 1
        self._spare_values = None
        self._free_handles()
        if self._dbs is not None:
            self._dbs.clear()

    def path(self):
        """Directory path or file name prefix where this environment is
        stored."""
        self._check()
        return self._path

    def _data_path(self):
        self._check()
        return self._dpath

    def lib_version(self):
        """The version tuple of the engine servicing this environment
        (lmdbio's; it reads LMDB 0.9.x data files)."""
        from lmdbio import version
        return version()

    def max_key_size(self):
        """The maximum size in bytes of a key (and of a value in a
        ``dupsort`` database): 511, as liblmdb 0.9."""
        self._check()
        return LIO_MAX_KEY_SIZE

    def max_readers(self):
        """Reader slots in the lock file (``max_readers=`` of the first
        process to open the environment)."""
        self._check()
        if self._lock != NULL:
            return lio_lock_max_readers(self._lock)
        return self._max_readers

    cdef int _snapshot(self, lio_meta *snap) except -1:
        cdef lio_error err
        cdef int rc
        with nogil:
            rc = lio_env_snapshot(self._env, 0, snap, &err)
        if rc:
            raise _core_error('mdb_env_info', rc, &err, self._dpath)
        return 0

    def stat(self):
        """stat()

        Statistics of the main database in the newest committed snapshot,
        as a dict: ``psize``, ``depth``, ``branch_pages``, ``leaf_pages``,
        ``overflow_pages``, ``entries``."""
        cdef lio_meta snap
        self._check()
        self._snapshot(&snap)
        return _stat_dict(self._psize, &snap.main_db)

    def info(self):
        """Environment information as a dict: ``map_addr`` (always 0: there
        is no map), ``map_size``, ``last_pgno``, ``last_txnid``,
        ``max_readers``, ``num_readers``."""
        cdef lio_meta snap
        self._check()
        self._snapshot(&snap)
        if self._lock != NULL:
            maxr = lio_lock_max_readers(self._lock)
            numr = lio_lock_num_readers(self._lock)
        else:
            maxr = self._max_readers
            numr = 0
        return {
            'map_addr': 0,
            'map_size': self._mapsize,
            'last_pgno': snap.last_pg,
            'last_txnid': snap.txnid,
            'max_readers': maxr,
            'num_readers': numr,
        }

    def flags(self):
        """A dict of the constructor flags this environment runs with
        (``readonly`` is always True: lmdbio never writes)."""
        self._check()
        return {
            'subdir': self._subdir,
            'readonly': self._readonly,
            'metasync': self._metasync,
            'sync': self._sync,
            'map_async': self._map_async,
            'readahead': self._readahead,
            'writemap': self._writemap,
            'meminit': self._meminit,
            'lock': self._use_lock,
        }

    def readers(self):
        """A multi-line string describing the reader lock table, in
        liblmdb's ``mdb_reader_list`` format."""
        cdef char *buf
        cdef size_t n, cap = 4096
        self._check()
        while True:
            buf = <char *>malloc(cap)
            if buf == NULL:
                raise MemoryError()
            try:
                n = lio_lock_reader_list(self._lock, buf, cap)
                if n < cap:
                    return buf[:n].decode('ascii', 'replace')
            finally:
                free(buf)
            cap = n + 1

    def reader_check(self):
        """Clear stale reader slots (of dead processes); returns how many."""
        cdef int dead = 0
        cdef int rc
        self._check()
        cdef lio_error err
        if self._lock == NULL:
            return 0
        with nogil:
            rc = lio_lock_reader_check(self._lock, &dead, &err)
        if rc:
            raise _core_error('mdb_reader_check', rc, &err, None)
        return dead

    def sync(self, force=False):
        """Flushing is a write: raises ``lmdbio.ReadonlyError``, as py-lmdb does
        on a read-only environment (``force`` or not)."""
        self._check()
        raise _make_error('mdb_env_sync', EACCES_)

    def set_mapsize(self, map_size):
        """Set the map size :py:meth:`info` reports to ``map_size`` (``0``:
        the file's).
        As in py-lmdb, open transactions and cursors are invalidated."""
        cdef lio_meta snap
        self._check()
        if map_size < 0:
            raise OverflowError('Integer argument must be >= 0')
        self._gen += 1
        self._snapshot(&snap)
        self._mapsize = map_size or snap.mapsize
        if self._mapsize < (snap.last_pg + 1) * snap.psize:
            self._mapsize = (snap.last_pg + 1) * snap.psize

    def _free_db(self):
        """A handle for the free-page DB (FREE_DBI)."""
        self._check()
        return self._free

    def _meta(self):
        """The newest committed meta page as a dict."""
        cdef lio_meta snap
        self._check()
        self._snapshot(&snap)
        return _meta_dict(&snap)

    def _metas(self):
        """Both meta pages (0 and 1) as dicts."""
        cdef lio_meta metas[2]
        cdef lio_error err
        cdef int rc
        self._check()
        with nogil:
            rc = lio_env_read_metas(self._env, metas, &err)
        if rc:
            raise _core_error('mdb_env_info', rc, &err, self._dpath)
        return [_meta_dict(&metas[0]), _meta_dict(&metas[1])]

    def _verify(self, name=None, progress=None, progress_every=4096,
                max_problems=0):
        """Check every structural invariant of the newest snapshot (or only
        the named database `name`): ``(problems, stats)``, problems a list of
        ``(pgno or None, message)``.  ``progress(done, total)`` is called every
        `progress_every` pages read.  ``stats['notes']`` lists, in the same
        form, what a healthy file may show but a reader should know (page
        counts that some liblmdb versions keep inexactly).  Used by
        ``lmdbio verify``."""
        cdef Transaction t
        cdef _VerifyCtx vc = _VerifyCtx()
        cdef lio_verify_opts o
        cdef lio_verify_stats st
        cdef lio_error err
        cdef int rc
        cdef bytes bname = None
        self._check()
        memset(&o, 0, sizeof(o))
        vc.problems = []
        vc.notes = []
        vc.progress = progress
        o.report = _verify_report
        o.note = _verify_note
        if progress is not None:
            o.progress = _verify_progress
        o.ctx = <void *>vc
        o.progress_every = progress_every
        o.max_problems = max_problems
        if name is not None:
            bname = _to_bytes(name.encode() if isinstance(name, str) else name)
            o.db_name = PyBytes_AS_STRING(bname)
            o.db_name_len = PyBytes_GET_SIZE(bname)
        t = self.begin()
        try:
            with nogil:
                rc = lio_verify(self._env, &t.snap, &o, &st, &err)
        finally:
            t.abort()
        if vc.exc is not None:
            raise vc.exc
        if rc == LIO_NOTFOUND:
            raise _make_error('mdb_dbi_open', MDB_NOTFOUND)
        if rc:
            raise _core_error('verify', rc, &err, self._dpath)
        return vc.problems, {
            'problems': st.problems, 'notes': vc.notes,
            'pages_read': st.pages_read, 'trees': st.trees, 'named_dbs': st.named_dbs,
            'free_pages': st.free_pages, 'pages_past_eof': st.pages_past_eof,
            'last_pg': t.snap.last_pg, 'txnid': t.snap.txnid,
            'psize': t.snap.psize}

    def begin(self, db=None, parent=None, write=False, buffers=False):
        """A read-only :py:class:`lmdbio.Transaction` of the newest snapshot
        (with ``lock=True`` it holds a reader slot until it ends).

        ``db``: the database that ``get``/``cursor`` use by default (the
        main one if None).  ``parent``: accepted for compatibility (nested
        transactions are write transactions).  ``write=True`` raises
        ``lmdbio.ReadonlyError``.  ``buffers=True``: keys and values come
        back as read-only memoryviews instead of bytes."""
        cdef Transaction t = Transaction.__new__(Transaction)
        t._start(self, db, parent, write, buffers)
        return t

    def open_db(self, key=None, txn=None, reverse_key=False, dupsort=False,
                create=True, integerkey=False, integerdup=False,
                dupfixed=False):
        """Open the named database ``key`` (bytes; None: the main
        database), returning a :py:class:`_Database` handle, in ``txn`` or
        a transaction of its own.  Its flags come from the file: the flag
        arguments ``reverse_key``, ``dupsort``, ``integerkey``,
        ``integerdup`` and ``dupfixed`` are ignored for an existing
        database, as in py-lmdb.  A missing database raises
        ``lmdbio.ReadonlyError`` with ``create=True`` (it cannot be created)
        and :class:`NotFoundError` with ``create=False``; ``max_dbs`` limits
        the named databases open at once, as in liblmdb."""
        cdef Transaction t
        cdef bytes name
        cdef const char *cname
        cdef lio_dbrec rec
        cdef lio_error err
        cdef int rc
        cdef Py_ssize_t n
        cdef const void *nul

        self._check()
        if key is None:
            if reverse_key or dupsort or integerkey or integerdup or dupfixed:
                raise ValueError('May not set flags on the main database')
            return self._main
        if txn is not None and not isinstance(txn, Transaction):
            raise TypeError('invalid type')
        name = _to_bytes(key)
        # liblmdb takes the name as a C string.
        nul = memchr(PyBytes_AS_STRING(name), 0, PyBytes_GET_SIZE(name))
        if nul != NULL:
            name = name[:<const char *>nul - PyBytes_AS_STRING(name)]
        db = self._dbs.get(name)
        if db is not None:
            if txn is not None:
                (<Transaction>txn)._adopt(<_Database>db)
            elif (<_Database>db).seq == 0:
                self._seq += 1
                (<_Database>db).seq = self._seq
            return db
        if len(self._dbs) - 1 >= self._max_dbs:
            raise _make_error('mdb_dbi_open', MDB_DBS_FULL)

        own = txn is None
        t = self.begin() if own else txn
        try:
            t._check()
            if t.snap.main_db.flags & (LIO_DUPSORT | LIO_INTEGERKEY):
                raise _make_error('mdb_dbi_open',
                                  MDB_INCOMPATIBLE if create else MDB_NOTFOUND)
            if len(name) == 0:
                raise _make_error('mdb_dbi_open', MDB_BAD_VALSIZE)
            cname = PyBytes_AS_STRING(name)
            n = PyBytes_GET_SIZE(name)
            with nogil:
                rc = lio_named_db(self._env, &t.snap, cname, n, &rec, &err)
            if rc == LIO_NOTFOUND:
                if create:
                    raise _make_error('mdb_dbi_open', EACCES_)
                raise _make_error('mdb_dbi_open', MDB_NOTFOUND)
            if rc:
                raise _core_error('mdb_dbi_open', rc, &err, self._dpath)
        finally:
            if own:
                t.abort()
        db = _new_db(self, DB_NAMED, name, rec.flags & LIO_PERSISTENT_FLAGS)
        self._dbs[name] = db
        if own:
            # opened in a transaction of its own, which commits
            self._seq += 1
            (<_Database>db).seq = self._seq
        else:
            # usable in `txn` only (py-lmdb never exports a DBI opened in a
            # read-only transaction): open_db() without txn= exports it.
            t._adopt(<_Database>db)
        return db

    def dbs(self, txn=None):
        """The named databases in the main database, as a list of bytes,
        read in ``txn`` (or a transaction of its own); each is opened, so at
        most `max_dbs` names are returned."""
        cdef Transaction t
        own = txn is None
        t = self.begin() if own else txn
        try:
            result = []
            cur = t.cursor()
            try:
                for key in cur.iternext(keys=True, values=False):
                    if not key:
                        continue
                    try:
                        self.open_db(key, txn=t, create=False)
                    except Error:
                        continue
                    if key.endswith(b'\x00'):
                        key = key[:len(key) - 1]
                    result.append(key)
            finally:
                cur.close()
            return result
        finally:
            if own:
                t.abort()

    # ---- copies ---------------------------------------------------------

    def copy(self, path, compact=False, txn=None):
        """Write a consistent copy of the current snapshot (or of `txn`'s,
        with ``compact=True``) to `path`: a new ``data.mdb`` in the existing
        directory `path` (``subdir=False``: the file `path`), which must not
        exist yet.  Both meta pages of the copy describe the snapshot.
        ``compact=True`` writes a compacted copy as ``mdb_copy -c`` does:
        free pages left out, pages renumbered, the free-page DB empty."""
        if txn is not None and not compact:
            raise TypeError('txn argument only compatible with compact=True')
        self._check()
        spath, bpath = _fspath(path)
        if self._subdir:
            bdest = _os.path.join(bpath, b'data.mdb')
        else:
            bdest = bpath
        try:
            fd = _os.open(bdest, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL,
                          0o666)
        except OSError as e:
            raise _make_error('mdb_env_copy3', e.errno or EIO) from None
        try:
            self._copy_fd(fd, compact, txn, 'mdb_env_copy3')
        finally:
            _os.close(fd)

    def copyfd(self, fd, compact=False, txn=None):
        """Write a consistent copy of the current snapshot (or of `txn`'s,
        with ``compact=True``) to the file descriptor `fd`; ``compact``
        as in :py:meth:`copy`."""
        if txn is not None and not compact:
            raise TypeError('txn argument only compatible with compact=True')
        self._check()
        self._copy_fd(fd, compact, txn, 'mdb_env_copyfd3')

    cdef _copy_fd(self, int fd, bint compact, txn, str what):
        cdef Transaction t
        own = txn is None
        if not own and not isinstance(txn, Transaction):
            raise TypeError('invalid type')
        t = self.begin() if own else txn
        try:
            t._check()
            if compact:
                _compact_copy(self, t, fd, what)
            else:
                self._plain_copy(t, fd, what)
        finally:
            if own:
                t.abort()

    cdef bytes _meta_page(self, Transaction t, unsigned pgno):
        """Meta page `pgno` of a copy of t's snapshot."""
        cdef lio_meta *m = &t.snap
        cdef uint32_t psize = m.psize
        raw = bytearray(self._read_range((m.txnid & 1) * psize, psize, what='copy'))
        if len(raw) < psize:
            raw.extend(bytes(psize - len(raw)))
        lio_meta_write(<uint8_t *><char *>raw, pgno, m)
        return bytes(raw)

    cdef bytes _read_range(self, uint64_t off, size_t length, what='read'):
        """Up to `length` bytes of the data file at `off` (fewer at EOF)."""
        cdef size_t align = self._src.align or 1
        cdef uint64_t a_off = off - off % align
        cdef size_t a_len = <size_t>(off - a_off) + length
        cdef void *buf = NULL
        cdef int64_t n
        a_len = (a_len + align - 1) // align * align
        if posix_memalign(&buf, align if align >= sizeof(void*) else sizeof(void*), a_len):
            raise MemoryError()
        try:
            with nogil:
                n = self._src.read(self._src.ctx, a_off, buf, a_len)
            if n < 0:
                raise _make_error('%s: %s' % (self._dpath, what), <int>-n,
                                  sys_errno=<int>-n)
            if <uint64_t>n <= off - a_off:
                return b''
            n -= <int64_t>(off - a_off)
            if <size_t>n > length:
                n = length
            return PyBytes_FromStringAndSize(<char *>buf + (off - a_off), n)
        finally:
            free(buf)

    cdef _plain_copy(self, Transaction t, int fd, str what):
        cdef uint32_t psize = t.snap.psize
        cdef uint64_t end = (t.snap.last_pg + 1) * <uint64_t>psize
        cdef int64_t fsize
        cdef uint64_t off
        cdef size_t chunk = 4 << 20
        cdef size_t align = self._src.align or 1
        cdef void *buf = NULL
        cdef int64_t n
        cdef size_t want, done
        cdef ssize_t w
        cdef int werr = 0
        metas = self._meta_page(t, 0) + self._meta_page(t, 1)
        _write_all(fd, metas, what)
        fsize = self._src.size(self._src.ctx)
        if fsize < 0:
            raise _make_error(what, <int>-fsize, sys_errno=<int>-fsize)
        if end > <uint64_t>fsize:
            end = <uint64_t>fsize
        off = 2 * <uint64_t>psize
        chunk = chunk // align * align if chunk >= align else align
        if posix_memalign(&buf, align if align >= sizeof(void*) else sizeof(void*), chunk):
            raise MemoryError()
        try:
            while off < end:
                want = chunk if end - off > chunk else <size_t>(end - off)
                # O_DIRECT: read whole aligned blocks (off is page-aligned,
                # and pages are multiples of the alignment in practice).
                with nogil:
                    n = self._src.read(self._src.ctx, off, buf,
                                       (want + align - 1) // align * align)
                if n < 0:
                    raise _make_error(what, <int>-n, sys_errno=<int>-n)
                if n == 0:
                    break
                if <size_t>n > want:
                    n = want
                done = 0
                with nogil:
                    while done < <size_t>n:
                        w = c_write(fd, <char *>buf + done, <size_t>n - done)
                        if w < 0:
                            if errno == EINTR:
                                continue
                            werr = errno
                            break
                        done += w
                if werr:
                    raise _make_error(what, werr, sys_errno=werr)
                off += <uint64_t>n
        finally:
            free(buf)


def _write_all(int fd, data, what):
    mv = memoryview(data)
    while len(mv):
        try:
            n = _os.write(fd, mv)
        except InterruptedError:
            continue
        except OSError as e:
            raise _make_error(what, e.errno or EIO, sys_errno=e.errno or EIO) from None
        mv = mv[n:]


cdef class _VerifyCtx:
    cdef list problems
    cdef list notes
    cdef object progress
    cdef object exc


cdef void _verify_report(void *ctx, uint64_t pgno, const char *msg) noexcept nogil:
    with gil:
        (<_VerifyCtx>ctx).problems.append(
            (None if pgno == LIO_EMPTY_ROOT else pgno,
             (<bytes>msg).decode('utf-8', 'replace')))


cdef void _verify_note(void *ctx, uint64_t pgno, const char *msg) noexcept nogil:
    with gil:
        (<_VerifyCtx>ctx).notes.append(
            (None if pgno == LIO_EMPTY_ROOT else pgno,
             (<bytes>msg).decode('utf-8', 'replace')))


cdef int _verify_progress(void *ctx, uint64_t done, uint64_t total) noexcept nogil:
    with gil:
        vc = <_VerifyCtx>ctx
        try:
            vc.progress(done, total)
        except BaseException as e:
            vc.exc = e
            return 1
    return 0


# ---------------------------------------------------------------------------
# Transaction
# ---------------------------------------------------------------------------

@cython.no_gc_clear
cdef class Transaction:
    """
    A read-only transaction: a consistent snapshot of the environment.

    ``Transaction(env, db=None, parent=None, write=False, buffers=False)``,
    or ``env.begin(...)`` (the arguments are :py:meth:`Environment.begin`'s,
    ``env`` the environment).  With ``lock=True`` it holds a reader slot in the
    lock file until :py:meth:`commit` or :py:meth:`abort` (or the context
    manager's exit).  ``write=True`` raises ``lmdbio.ReadonlyError``.
    ``buffers=True``: values and keys are returned as read-only memoryviews.
    """
    cdef readonly Environment env
    cdef _Database _db
    cdef lio_meta snap
    cdef bint _valid
    cdef bint _buffers
    cdef uint64_t _gen         # env._gen at begin (see Environment)
    cdef lio_reader *_slot
    cdef lio_cursor *_scratch
    cdef _Database _scratch_db
    cdef list _cursors         # weakrefs to this transaction's Cursors
    cdef uint64_t _seq         # env._seq at begin: the DBIs it knows
    cdef list _pending         # DBIs opened in this transaction
    cdef unsigned _ops         # reads since the last snapshot check (lock=False)
    cdef _Values _values       # objects of get's overflow values
    cdef object __weakref__

    def __cinit__(self):
        self._valid = False
        self._slot = NULL
        self._scratch = NULL

    def __init__(self, *args, **kwargs):
        self._construct(*args, **kwargs)

    __signature__ = _SignatureOf('_construct')

    def _construct(self, Environment env, db=None, parent=None, write=False,
                   buffers=False):
        if env is None:
            raise TypeError('Transaction requires an Environment')
        self._start(env, db, parent, write, buffers)

    cdef int _start(self, Environment env, db, parent, write,
                    buffers) except -1:
        if env._coll is None:
            return self._init(env, db, parent, write, buffers)
        # Under MPI begin() is collective: every rank takes its own reader
        # slot (if locking), then reads the snapshot rank 0 chose, which
        # rank 0's slot pins on this machine (LMDB's locks do not reach
        # across machines: multi-node reading needs a file nobody writes).
        coll = env._coll
        failure = None
        try:
            self._init(env, db, parent, write, buffers)
        except Exception as e:
            failure = e
        coll.agree(failure)
        snap = coll.bcast((<char *>&self.snap)[:sizeof(lio_meta)]
                          if coll.rank == 0 else None)
        if coll.rank != 0:
            memcpy(&self.snap, <const char *>snap, sizeof(lio_meta))
        return 0

    cdef int _init(self, Environment env, db, parent, write,
                   buffers) except -1:
        cdef lio_error err
        cdef int rc
        cdef uint64_t txnid = 0
        cdef int tries
        if self.env is not None:
            raise Error('Transaction already initialised')
        env._check()
        if db is not None and type(db) is not _Database:
            raise TypeError('invalid type')
        if parent is not None:
            if not isinstance(parent, Transaction):
                raise TypeError('invalid type')
            raise _make_error('Read-only transactions cannot be nested.',
                              EINVAL_)
        if write:
            raise _make_error('Cannot start write transaction with '
                              'read-only environment.', EACCES_)
        self.env = env
        self._db = db if db is not None else env._main
        self._buffers = True if buffers else False
        self._gen = env._gen
        self._seq = env._seq

        if env._lock != NULL:
            with nogil:
                rc = lio_lock_reader_begin(env._lock, &self._slot, &txnid,
                                           &err)
            if rc:
                self._slot = NULL
                raise _core_error('mdb_txn_begin', rc, &err, env._dpath)
            tries = 0
            while True:
                if env._snap_ok and env._snap_cache.txnid == txnid:
                    self.snap = env._snap_cache
                    rc = 0
                    break
                with nogil:
                    rc = lio_env_snapshot(env._env, txnid, &self.snap, &err)
                if rc == 0:
                    env._snap_cache = self.snap
                    env._snap_ok = True
                if rc != LIO_RETRY:
                    break
                tries += 1
                if tries >= _SNAPSHOT_RETRIES:
                    break
                with nogil:
                    rc = lio_lock_reader_refresh(env._lock, self._slot,
                                                 &txnid, &err)
                if rc:
                    break
            if rc:
                lio_lock_reader_end(env._lock, self._slot)
                self._slot = NULL
                if rc == LIO_RETRY:
                    raise _make_error('mdb_txn_begin: the meta page keeps '
                                      'changing', MDB_CORRUPTED)
                raise _core_error('mdb_txn_begin', rc, &err, env._dpath)
        else:
            with nogil:
                rc = lio_env_snapshot(env._env, 0, &self.snap, &err)
            if rc:
                raise _core_error('mdb_txn_begin', rc, &err, env._dpath)
        self._valid = True
        return 0

    cdef int _count_read(self) except -1:
        """lock=False: check the snapshot every 1024 reads."""
        self._ops += 1
        if self._ops >= 1024:
            self._check_snapshot('mdb_cursor_get')
        return 0

    cdef int _check_snapshot(self, what) except -1:
        """lock=False: without a reader slot, a writer may reuse the pages
        of this snapshot once it has committed two transactions past it (it
        reuses what the transaction after the snapshot freed, from the one
        after that on).  Reads done while the newest txnid is at most one
        past the snapshot came from intact pages; later ones may not have:
        SnapshotChangedError."""
        cdef lio_meta metas[2]
        cdef lio_error merr
        cdef int mrc
        cdef uint64_t newest
        self._ops = 0
        if self.env._lock != NULL or self.env._env == NULL:
            return 0
        with nogil:
            mrc = lio_env_read_metas(self.env._env, metas, &merr)
        if mrc:
            return 0
        newest = metas[0].txnid if metas[0].txnid > metas[1].txnid else metas[1].txnid
        if newest < self.snap.txnid + 2:
            return 0
        exc = _errors.SnapshotChangedError(
            '%s: %s: snapshot txn %d was read without a reader slot (lock='
            'False) while a writer committed up to txn %d: pages of the '
            'snapshot may have been reused under the reads since the last '
            'check; use lock=True next to a live writer, or begin a new '
            'transaction' % (self.env._dpath, what, self.snap.txnid, newest))
        exc.what = what
        exc.code = 0
        exc.reason = ''
        exc.txnid = self.snap.txnid
        exc.newest = newest
        raise exc

    cdef object _read_error(self, what, int rc, const lio_error *err):
        """The exception for a failed read in this transaction.  Without a
        reader slot (lock=False) a damaged page is checked against the meta
        pages: if a writer committed past the snapshot meanwhile, it may have
        reused the snapshot's pages, and SnapshotChangedError says so."""
        cdef lio_meta metas[2]
        cdef lio_error merr
        cdef int mrc
        cdef uint64_t newest
        exc = _core_error(what, rc, err, self.env._dpath)
        if (self.env._lock != NULL or self.env._env == NULL or
                (rc != LIO_PAGE_NOTFOUND and rc != LIO_CORRUPTED)):
            return exc
        with nogil:
            mrc = lio_env_read_metas(self.env._env, metas, &merr)
        if mrc:
            return exc
        newest = metas[0].txnid if metas[0].txnid > metas[1].txnid else metas[1].txnid
        if newest <= self.snap.txnid:
            return exc
        new = _errors.SnapshotChangedError(
            '%s: %s: snapshot txn %d was read without a reader slot (lock='
            'False) while a writer committed up to txn %d, so its pages may '
            'have been reused; the damage found: %s' % (
                self.env._dpath, what, self.snap.txnid, newest, exc))
        new.what = what
        new.code = exc.code
        new.reason = exc.reason
        new.txnid = self.snap.txnid
        new.newest = newest
        new.__cause__ = exc
        return new

    cdef inline bint _live(self) noexcept:
        return self._valid and self._gen == self.env._gen

    cdef int _check(self) except -1:
        if not self._valid or self._gen != self.env._gen:
            self._end()
            raise _invalid_error()
        return 0

    cdef void _adopt(self, _Database db) noexcept:
        if db.seq == 0 or db.seq > self._seq:
            if self._pending is None:
                self._pending = []
            self._pending.append(db)

    cdef int _visible(self, _Database db, str what) except -1:
        """liblmdb's TXN_DBI_EXIST: EINVAL for a handle this transaction
        does not know (opened after it began, elsewhere)."""
        if db.kind != DB_NAMED:
            return 0
        if db.seq != 0 and db.seq <= self._seq:
            return 0
        if self._pending is not None:
            for d in self._pending:
                if d is db:
                    return 0
        raise _make_error(what, EINVAL_)

    cdef void _end(self) noexcept:
        """Release the snapshot: give back the reader slot (cursors close
        their core handles on their next use, or when freed)."""
        if self.env is None:
            return
        self._valid = False
        self._pending = None
        self._cursors = None
        if LIO_REUSE_BYTES and self._values is not None and \
                self.env._spare_values is None and not self.env._closed:
            self.env._spare_values = self._values
        self._values = None
        if self._scratch != NULL:
            lio_cursor_close(self._scratch)
            self._scratch = NULL
            self.env._cursor_closed()
        self._scratch_db = None
        if self._slot != NULL:
            # After env.close() the lock table (and the slot) is gone.
            if not self.env._closed and self.env._lock != NULL:
                lio_lock_reader_end(self.env._lock, self._slot)
            self._slot = NULL

    def __dealloc__(self):
        self._end()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if exc_type is not None:
            self.abort()
        elif self._live():
            self.commit()

    def id(self):
        """id()

        The snapshot's transaction ID."""
        self._check()
        return self.snap.txnid

    def commit(self):
        """End the transaction (there is nothing to write)."""
        self._check()
        self._end()

    def abort(self):
        """End the transaction.  Repeat calls have no effect."""
        self._end()

    cdef _Database _dbarg(self, db):
        if db is None:
            return self._db
        if not isinstance(db, _Database):
            raise TypeError('invalid type')
        return <_Database>db

    cdef int _dbrec(self, _Database db, lio_dbrec *out, str what) except -1:
        """This snapshot's record for `db`."""
        cdef lio_error err
        cdef int rc
        cdef const char *cname
        cdef Py_ssize_t n
        if db.env_id != <size_t><void *>self.env:
            raise _make_error(what, _errors.MDB_BAD_DBI)
        self._visible(db, what)
        if db.kind == DB_MAIN:
            out[0] = self.snap.main_db
            return 0
        if db.kind == DB_FREE:
            out[0] = self.snap.free_db
            return 0
        if db.rec_ok and db.rec_txnid == self.snap.txnid:
            out[0] = db.rec
            return 0
        cname = PyBytes_AS_STRING(db.name)
        n = PyBytes_GET_SIZE(db.name)
        with nogil:
            rc = lio_named_db(self.env._env, &self.snap, cname, n, out, &err)
        if rc == LIO_NOTFOUND:
            # Dropped since the handle was opened: an empty tree, as liblmdb
            # then finds nothing.
            memset(out, 0, sizeof(lio_dbrec))
            out.flags = db.dbflags
            out.root = LIO_EMPTY_ROOT
        elif rc:
            raise self._read_error(what, rc, &err)
        elif (out.flags & LIO_PERSISTENT_FLAGS) != db.dbflags:
            raise _make_error(what, MDB_INCOMPATIBLE)
        db.rec = out[0]
        db.rec_txnid = self.snap.txnid
        db.rec_ok = True
        return 0

    cdef lio_cursor *_open_cursor(self, _Database db, str what) except NULL:
        cdef lio_dbrec rec
        cdef lio_cursor *c = NULL
        cdef lio_error err
        cdef int rc
        self._dbrec(db, &rec, what)
        # No I/O here (the core allocates; pages are read on the first op).
        rc = lio_cursor_open(&c, self.env._env, &self.snap, &rec, &err)
        if rc:
            raise _core_error(what, rc, &err, self.env._dpath)
        # overflow values: read into their bytes objects (_value_into)
        lio_cursor_defer_values(c, 1)
        self.env._nopen += 1
        return c

    def stat(self, db=None):
        """stat(db=None)

        Statistics of `db` (default: the transaction's database) in this
        snapshot, like :py:meth:`Environment.stat`."""
        cdef lio_dbrec rec
        cdef _Database d
        self._check()
        d = self._dbarg(db)
        self._dbrec(d, &rec, 'mdb_stat')
        return _stat_dict(self.env._psize, &rec)

    def get(self, key, default=None, db=None):
        """Fetch the first value matching `key` in `db` (default: the
        transaction's database), returning `default` if `key` does not
        exist."""
        cdef _Database d
        cdef bytes k
        cdef lio_val kv, dv
        cdef int rc
        self._check()
        if key is None:
            raise TypeError('key must be given.')
        k = _to_bytes(key)
        d = self._dbarg(db)
        if self._scratch == NULL or self._scratch_db is not d:
            if self._scratch != NULL:
                lio_cursor_close(self._scratch)
                self._scratch = NULL
                self._scratch_db = None
                self.env._cursor_closed()
            self._scratch = self._open_cursor(d, 'mdb_get')
            self._scratch_db = d
        kv.data = <const uint8_t *>PyBytes_AS_STRING(k)
        kv.size = PyBytes_GET_SIZE(k)
        with nogil:
            rc = lio_get(self._scratch, &kv, &dv)
        if rc:
            if rc == LIO_NOTFOUND:
                return default
            raise self._read_error('mdb_get', rc,
                                   lio_cursor_error(self._scratch))
        if dv.data == NULL and dv.size:
            if self._values is None:
                self._values = self.env._spare_values
                self.env._spare_values = None
                if self._values is None:
                    self._values = _Values()
            v = _value_into(self._scratch, dv.size, self._values, self,
                            'mdb_get')
        else:
            v = None
        if self.env._lock == NULL:
            self._count_read()
        if v is not None:
            return memoryview(v) if self._buffers else v
        return _cur_val(self._scratch, &dv, self._buffers)

    def _gets_use_leaf_directory(self):
        """Whether this transaction's `get` calls find their leaf in the
        tree's leaf directory now (tests; see docs/drop-in.md)."""
        return bool(self._scratch != NULL and
                    lio_cursor_has_leafdir(self._scratch))

    def _gets_by_record(self):
        """How many of this transaction's `get` calls read their record
        alone rather than its leaf (tests; see docs/drop-in.md)."""
        return (lio_cursor_gets_by_record(self._scratch)
                if self._scratch != NULL else 0)

    def _leaves_scanned(self):
        """How many leaves of the tree this transaction's `get` calls use
        a scan noted, once the scan has ended (tests; see
        docs/drop-in.md)."""
        cdef uint64_t n = 0
        if self._scratch != NULL:
            with nogil:
                n = lio_cursor_leaves_scanned(self._scratch)
        return n

    def cursor(self, db=None):
        """Shortcut for ``lmdbio.Cursor(db, self)``"""
        cdef Cursor c = Cursor.__new__(Cursor)
        c._init(db if db is not None else self._db, self)
        return c

    # ---- writes: all refused --------------------------------------------

    def put(self, key, value, dupdata=True, overwrite=True, append=False,
            db=None):
        """Writes are refused: raises ``lmdbio.ReadonlyError``; `key`,
        `value`, `dupdata`, `overwrite`, `append` and `db` are py-lmdb's
        arguments."""
        self._check()
        _to_bytes(key)
        _to_bytes(value)
        self._visible(self._dbarg(db), 'mdb_put')
        raise _make_error('mdb_put', EACCES_)

    def replace(self, key, value, db=None):
        """Writes are refused: raises ``lmdbio.ReadonlyError`` (what py-lmdb
        raises after looking the key up); `key`, `value` and `db` are
        py-lmdb's arguments."""
        self._check()
        with Cursor(self._dbarg(db), self) as curs:
            return curs.replace(key, value)

    def pop(self, key, db=None):
        """Returns ``None`` for a missing `key` in `db` (as py-lmdb);
        otherwise the delete is refused with ``lmdbio.ReadonlyError``."""
        self._check()
        with Cursor(self._dbarg(db), self) as curs:
            return curs.pop(key)

    def delete(self, key, value=b'', db=None):
        """Writes are refused: raises ``lmdbio.ReadonlyError``; `key`,
        `value` and `db` are py-lmdb's arguments."""
        self._check()
        _to_bytes(key)
        if value is not None:
            _to_bytes(value)
        self._visible(self._dbarg(db), 'mdb_del')
        raise _make_error('mdb_del', EACCES_)

    def drop(self, db, delete=True):
        """Writes are refused: raises ``lmdbio.ReadonlyError`` (after closing
        this transaction's cursors on `db` when ``delete=True``, as
        py-lmdb)."""
        cdef Cursor c
        self._check()
        if not isinstance(db, _Database):
            raise TypeError('invalid type')
        if delete and self._cursors is not None:
            for ref in self._cursors:
                c = ref()
                if c is not None and c.db is db:
                    c._close()
            self._cursors = [r for r in self._cursors if r() is not None]
        self._visible(<_Database>db, 'mdb_drop')
        raise _make_error('mdb_drop', EACCES_)


# ---------------------------------------------------------------------------
# Cursor
# ---------------------------------------------------------------------------

@cython.no_gc_clear
@cython.final
cdef class Cursor:
    """
    A cursor over one database of a transaction's snapshot
    (``Cursor(db, txn)`` or ``txn.cursor(db)``), with py-lmdb's methods and
    positioned/unpositioned semantics: once a positioning method returns
    ``False`` the cursor is unpositioned and :py:meth:`key` and
    :py:meth:`value` return empty bytestrings.  Write methods raise
    ``lmdbio.ReadonlyError``.
    """
    cdef readonly Transaction txn
    cdef readonly _Database db
    cdef lio_cursor *_c
    cdef bint positioned
    cdef bint _buffers
    cdef bint _fast           # try lio_cursor_step before lio_cursor_get
    cdef unsigned _dbflags
    cdef lio_val _key
    cdef lio_val _val
    cdef object _vobj          # the value read into its own bytes (_fill)
    cdef _Values _values       # objects of the overflow values
    # A forward walk's values read in one request with the one asked for
    # (lio_cursor_plan_values): their runs, and their objects until taken.
    # Or, where the runs lie out of file order, read by the cursor's worker
    # (lio_cursor_values_ahead) while this thread reads from the first on:
    # _worker is then set, and the objects not yet taken may still be
    # written to, so they are kept in _ahead until taken or dropped.
    cdef lio_value_run _runs[LIO_AHEAD_MAX + 1]
    cdef list _ahead
    cdef Py_ssize_t _ahead_i, _ahead_n
    cdef bint _worker          # _ahead[1:] are the worker's batch
    cdef bint _worker_ok       # this cursor may use a worker
    cdef object _kref          # inputs the core may still point at
    cdef object _vref
    cdef object __weakref__

    def __cinit__(self):
        self._c = NULL
        self.positioned = False
        self._key.data = NULL
        self._key.size = 0
        self._val.data = NULL
        self._val.size = 0

    def __init__(self, *args, **kwargs):
        self._construct(*args, **kwargs)

    __signature__ = _SignatureOf('_construct')

    def _construct(self, db=None, txn=None):
        if db is None or txn is None:
            raise TypeError('db and transaction parameters required.')
        self._init(db, txn)

    cdef int _init(self, db, txn) except -1:
        cdef Transaction t
        if type(db) is not _Database or not isinstance(txn, Transaction):
            raise TypeError('invalid type')
        if self.txn is not None:
            raise Error('Cursor already initialised')
        t = <Transaction>txn
        t._check()
        self._c = t._open_cursor(<_Database>db, 'mdb_cursor_open')
        self.txn = t
        self.db = <_Database>db
        self._buffers = t._buffers
        self._fast = t.env._fastpath
        # (a source read through Python, MPI-IO, stays on this thread)
        self._worker_ok = self._fast and t.env._readahead and \
            t.env._mpisrc is None
        self._dbflags = (<_Database>db).dbflags
        if t._cursors is None:
            t._cursors = []
        elif len(t._cursors) >= 64:
            t._cursors = [r for r in t._cursors if r() is not None]
        t._cursors.append(_weakref.ref(self))
        return 0

    cdef void _close(self) noexcept:
        if self._c != NULL:
            lio_cursor_close(self._c)   # (stops the worker: before _ahead)
            self._c = NULL
            self.txn.env._cursor_closed()
        self._worker = False
        self.positioned = False
        self._key.size = 0
        self._val.size = 0
        self._vobj = None
        self._values = None
        self._ahead = None
        self._ahead_n = 0

    def __dealloc__(self):
        if self._c != NULL and self.txn is not None:
            self._close()

    def close(self):
        """Close the cursor, freeing its associated resources."""
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.close()

    cdef inline int _check(self) except -1:
        if self._c == NULL:
            raise _invalid_error()
        if not self.txn._live():
            # The transaction ended: release the core cursor now.
            self._close()
            raise _invalid_error()
        return 0

    cdef int _get_keys_only(self, lio_cursor_op op) except -1:
        """_get for a walk over keys alone: the values ahead are not read
        ahead (a keys-only walk of 8k records among 553 MB of values read
        the whole file, cold)."""
        if self._c != NULL:
            lio_cursor_defer_values(self._c, LIO_VALUES_UNWANTED)
        try:
            return self._get(op)
        finally:
            if self._c != NULL:
                lio_cursor_defer_values(self._c, 1)

    cdef int _get(self, lio_cursor_op op) except -1:
        """One core op; py-lmdb's bookkeeping around mdb_cursor_get."""
        cdef int rc
        cdef Transaction t
        if (self._fast and (op == LIO_NEXT or op == LIO_PREV) and
                lio_cursor_step(self._c, &self._key, &self._val,
                                op == LIO_NEXT)):
            # inside the leaf: no read, no lock, no GIL round trip
            rc = 0
        else:
            with nogil:
                rc = lio_cursor_get(self._c, &self._key, &self._val, op)
        if rc == 0:
            self.positioned = True
            if (self._vobj is not None and self._val.data !=
                    <const uint8_t *>PyBytes_AS_STRING(self._vobj)):
                self._vobj = None   # the op gave another value
            t = self.txn
            if t.env._lock == NULL:
                t._ops += 1
                if t._ops >= 1024:
                    t._check_snapshot('mdb_cursor_get')
            return 0
        self.positioned = False
        self._key.size = 0
        self._val.size = 0
        self._vobj = None
        if rc != LIO_NOTFOUND and not (rc == LIO_EINVAL and
                                       op == LIO_GET_CURRENT):
            raise self.txn._read_error('mdb_cursor_get', rc,
                                       lio_cursor_error(self._c))
        if self.txn.env._lock == NULL and (
                op == LIO_NEXT or op == LIO_PREV or op == LIO_NEXT_NODUP or
                op == LIO_PREV_NODUP):
            # the end of a scan: was all of it read from intact pages?
            self.txn._check_snapshot('mdb_cursor_get')
        return 0

    cdef object _op(self, lio_cursor_op op):
        self._check()
        self._get(op)
        return self.positioned

    cdef object _op_kv(self, lio_cursor_op op, key, value):
        cdef bytes k
        cdef bytes v
        self._check()
        k = _to_bytes(key)
        self._key.data = <const uint8_t *>PyBytes_AS_STRING(k)
        self._key.size = PyBytes_GET_SIZE(k)
        self._kref = k
        if value is not None:
            v = _to_bytes(value)
            self._val.data = <const uint8_t *>PyBytes_AS_STRING(v)
            self._val.size = PyBytes_GET_SIZE(v)
            self._vref = v
        else:
            self._val.data = NULL
            self._val.size = 0
        self._get(op)
        return self.positioned

    cdef int _fill(self) except -1:
        """Read the value the core left unread (an overflow run) into its
        own bytes object, once per position; _val then points into it.
        A forward walk reads the values of the next nodes in the same
        request when their runs follow in the file (small values: one
        request per batch, not one per value), or has the cursor's worker
        read them alongside when they do not; they wait in _ahead."""
        cdef uint32_t size
        cdef uint64_t pgno = lio_cursor_pending(self._c, &size)
        cdef Py_ssize_t i = self._ahead_i
        cdef size_t n, good = 0
        cdef void *dsts[LIO_AHEAD_MAX + 1]
        cdef int rc
        cdef list objs
        if self._worker:
            if i < self._ahead_n and self._runs[i].pgno == pgno and \
                    self._runs[i].size == size:
                with nogil:
                    rc = lio_cursor_value_ahead(self._c, <size_t>(i - 1))
                if rc == 0:
                    o = self._ahead[i]
                    self._ahead[i] = None
                    self._ahead_i = i + 1
                    return self._took(o)
            # elsewhere, or its read failed (read again alone below,
            # which raises if the run is damaged): no more writes first
            with nogil:
                lio_cursor_values_ahead_drop(self._c)
            self._worker = False
            i = self._ahead_n
        while i < self._ahead_n:
            o = self._ahead[i]
            self._ahead[i] = None
            i += 1
            if self._runs[i - 1].pgno == pgno and self._runs[i - 1].size == size:
                self._ahead_i = i
                return self._took(o)
        self._ahead = None
        self._ahead_i = self._ahead_n = 0
        if self._values is None:
            self._values = _Values()
        # (LMDBIO_CURSOR_FASTPATH=0, the reference path: one at a time)
        n = lio_cursor_plan_values(self._c, self._runs, LIO_VALUES_MAX,
                                   _AHEAD_BYTES) if self._fast else 0
        if n > 1:
            objs = [None] * n
            for i in range(<Py_ssize_t>n):
                # (the pool's: a value the program let go of lends its
                # memory, mapped and cached, as to a value read alone)
                o = self._values.new(self._runs[i].size)
                objs[i] = o
                dsts[i] = PyBytes_AS_STRING(o)
            with nogil:
                rc = lio_cursor_values_into(self._c, self._runs, n, dsts,
                                            &good)
            if rc == 0 and good > 0:
                o = objs[0]
                objs[0] = None
                self._ahead = objs
                self._ahead_i = 1
                self._ahead_n = <Py_ssize_t>good
                return self._took(o)
            # a damaged run or a failed read: the value asked for alone,
            # which raises if it is the broken one
        elif n == 1 and self._worker_ok:
            n = lio_cursor_plan_ahead(self._c, self._runs, LIO_AHEAD_MAX + 1,
                                      _WORKER_BYTES)
            if n > 2:
                objs = [None] * n
                for i in range(1, <Py_ssize_t>n):
                    o = self._values.new(self._runs[i].size)
                    objs[i] = o
                    dsts[i] = PyBytes_AS_STRING(o)
                if lio_cursor_values_ahead(self._c, self._runs + 1, n - 1,
                                           dsts + 1) == 0:
                    self._ahead = objs
                    self._ahead_i = 1
                    self._ahead_n = <Py_ssize_t>n
                    self._worker = True
        return self._took(_value_into(self._c, self._val.size, self._values,
                                      self.txn, 'mdb_cursor_get'))

    cdef inline int _took(self, object o) except -1:
        self._vobj = o
        self._val.data = <const uint8_t *>PyBytes_AS_STRING(o)
        return 0

    cdef inline object _k(self):
        return _cur_val(self._c, &self._key, self._buffers)

    cdef inline object _v(self):
        if self._val.data == NULL and self._val.size:
            self._fill()
        if self._vobj is not None:
            # its own object: no copy, valid for as long as it is held
            return memoryview(self._vobj) if self._buffers else self._vobj
        return _cur_val(self._c, &self._val, self._buffers)

    cdef inline object _item(self):
        return (_cur_val(self._c, &self._key, self._buffers), self._v())

    # ---- reading the current position -----------------------------------

    def key(self):
        """Return the current key."""
        self._check()
        return self._k()

    def value(self):
        """Return the current value."""
        self._check()
        return self._v()

    def item(self):
        """Return the current `(key, value)` pair."""
        self._check()
        return self._item()

    def count(self):
        """Return the number of values ("duplicates") for the current key.
        Raises :class:`IncompatibleError` unless the database is
        ``dupsort=True``."""
        cdef uint64_t n = 0
        cdef int rc
        self._check()
        if not (self._dbflags & LIO_DUPSORT):
            raise _make_error('mdb_cursor_count', MDB_INCOMPATIBLE)
        with nogil:
            rc = lio_cursor_count(self._c, &n)
        if rc:
            raise _core_error('mdb_cursor_count', rc,
                              lio_cursor_error(self._c), self.txn.env._dpath)
        return n

    # ---- positioning -----------------------------------------------------

    def first(self):
        """Move to the first key (its first value); ``False`` if empty."""
        return self._op(LIO_FIRST)

    def first_dup(self):
        """Move to the first value of the current key."""
        return self._op(LIO_FIRST_DUP)

    def last(self):
        """Move to the last key (its last value); ``False`` if empty."""
        return self._op(LIO_LAST)

    def last_dup(self):
        """Move to the last value of the current key."""
        return self._op(LIO_LAST_DUP)

    def prev(self):
        """Move to the previous element."""
        return self._op(LIO_PREV)

    def prev_dup(self):
        """Move to the previous value of the current key."""
        return self._op(LIO_PREV_DUP)

    def prev_nodup(self):
        """Move to the last value of the previous key."""
        return self._op(LIO_PREV_NODUP)

    def next(self):
        """Move to the next element."""
        return self._op(LIO_NEXT)

    def next_dup(self):
        """Move to the next value of the current key."""
        return self._op(LIO_NEXT_DUP)

    def next_nodup(self):
        """Move to the first value of the next key."""
        return self._op(LIO_NEXT_NODUP)

    def set_key(self, key):
        """Seek exactly to `key` (its first value)."""
        return self._op_kv(LIO_SET_KEY, key, None)

    def set_key_dup(self, key, value):
        """Seek exactly to `(key, value)`."""
        return self._op_kv(LIO_GET_BOTH, key, value)

    def set_range(self, key):
        """Seek to the first key >= `key`; like :py:meth:`first` for an
        empty `key`."""
        cdef bytes k
        self._check()
        k = _to_bytes(key)
        if not k:
            return self._op(LIO_FIRST)
        return self._op_kv(LIO_SET_RANGE, k, None)

    def set_range_dup(self, key, value):
        """Seek to `key` and its first value >= `value`."""
        rc = self._op_kv(LIO_GET_BOTH_RANGE, key, value)
        if rc:
            # As py-lmdb: refresh key and value from the position.
            self._get(LIO_GET_CURRENT)
        return rc

    def get(self, key, default=None):
        """Position at `key` like :py:meth:`set_key`, returning its first
        value, or `default` if it does not exist."""
        if key is None:
            self._check()
            raise TypeError('key must be given.')
        if self._op_kv(LIO_SET_KEY, key, None):
            return self._v()
        return default

    cdef inline object _kept(self, const lio_val *v):
        # What getmulti returns outlives the cursor's next operation (and
        # the page it was on): a copy, a memoryview of it with buffers=True
        # (a value read into its own object: that object).
        if v == &self._val and (self._vobj is not None or
                                (v.data == NULL and v.size)):
            return self._v()
        if self._buffers:
            return memoryview(_val_bytes(v))
        return _val_bytes(v)

    def getmulti(self, keys, dupdata=False, dupfixed_bytes=None,
                 keyfixed=False, values=True):
        """A list of `(key, value)` pairs for the keys in `keys` that exist
        (all their duplicates with ``dupdata=True``; split into
        `dupfixed_bytes`-sized values of a ``dupfixed`` database; packed into
        one memoryview with ``keyfixed=True``; only the keys with
        ``values=False``), as py-lmdb's ``Cursor.getmulti``.

        Before the lookups (in the order given), the leaves the keys need
        and their overflow values are read ahead, sorted, a batch that fits
        in a quarter of the page cache at a time: from the device all of
        them, several reads in flight; from the OS cache the leaves that
        neighbour each other, one request for several.  ``readahead=False``
        reads each leaf as its key is looked up.  With ``buffers=True`` keys
        and values are memoryviews of copies: they stay valid after the
        call (py-lmdb's point into its map)."""
        cdef lio_cursor_op get_op, next_op
        cdef Py_ssize_t i, n, step, m, pos
        cdef size_t covered
        cdef lio_val *kv
        cdef bytes kbytes
        if dupfixed_bytes and dupfixed_bytes < 0:
            raise OverflowError('Integer argument must be >= 0')
        elif (dupfixed_bytes or keyfixed) and not dupdata:
            raise TypeError('dupdata is required for dupfixed_bytes/keyfixed.')
        elif keyfixed and not dupfixed_bytes:
            raise TypeError('dupfixed_bytes is required for keyfixed.')
        elif not values and dupdata:
            raise TypeError('values=False is incompatible with dupdata.')
        self._check()
        if dupfixed_bytes:
            get_op = LIO_GET_MULTIPLE
            next_op = LIO_NEXT_MULTIPLE
            step = dupfixed_bytes
        else:
            get_op = LIO_GET_CURRENT
            next_op = LIO_NEXT_DUP
            step = 0
        out = bytearray()
        lst = []
        keyfixed_size = None
        it = iter(keys)
        more = True
        pending = None
        kv = <lio_val *>malloc(GETMULTI_CHUNK * sizeof(lio_val))
        if kv == NULL:
            raise MemoryError()
        try:
            while more:
                # A chunk of keys as bytes.  What stops it early happens
                # after the lookups of the keys before, as in a plain loop:
                # the iterator raising (re-raised after them), or a key
                # that is not bytes-like (its own lookup raises).
                chunk = []
                tail = []
                while len(chunk) < GETMULTI_CHUNK:
                    try:
                        key = next(it)
                    except StopIteration:
                        more = False
                        break
                    except BaseException as e:
                        pending = e
                        more = False
                        break
                    try:
                        kbytes = _to_bytes(key)
                    except BaseException:
                        tail.append(key)
                        more = False
                        break
                    m = len(chunk)
                    kv[m].data = <const uint8_t *>PyBytes_AS_STRING(kbytes)
                    kv[m].size = PyBytes_GET_SIZE(kbytes)
                    chunk.append(kbytes)
                m = len(chunk)
                pos = 0
                while pos < m or tail:
                    if pos < m:
                        covered = m - pos
                        if covered > 1:
                            # read the leaves of the next keys together
                            self._check()
                            with nogil:
                                covered = lio_cursor_prefetch(
                                    self._c, kv + pos, covered)
                        batch = chunk[pos:pos + <Py_ssize_t>covered]
                        pos += covered
                    else:
                        batch = tail
                        tail = []
                    for key in batch:
                        if not self._op_kv(LIO_SET_KEY, key, None):
                            continue
                        if not values:
                            lst.append(self._kept(&self._key))
                            continue
                        if keyfixed:
                            if keyfixed_size is None:
                                keyfixed_size = self._key.size
                            elif self._key.size != keyfixed_size:
                                raise ValueError(
                                    'keyfixed=True requires all keys to be '
                                    'the same size')
                        while self.positioned:
                            self._get(get_op)
                            k = self._kept(&self._key)
                            if step:
                                if self._val.data == NULL and self._val.size:
                                    self._fill()
                                vb = _val_bytes(&self._val)
                                n = len(vb)
                                if keyfixed:
                                    kb = _val_bytes(&self._key)
                                    for i in range(0, n, step):
                                        out += kb
                                        out += vb[i:i + step]
                                else:
                                    for i in range(0, n, step):
                                        v = vb[i:i + step]
                                        lst.append((k, memoryview(v)
                                                    if self._buffers else v))
                            else:
                                lst.append((k, self._kept(&self._val)))
                            if dupdata:
                                self._get(next_op)
                            else:
                                break
            if pending is not None:
                raise pending
        finally:
            free(kv)
        if keyfixed:
            return memoryview(out)
        return lst

    # ---- iteration -------------------------------------------------------

    cdef _Iterator _iter(self, int pos_op, lio_cursor_op op, keys, values):
        cdef _Iterator it
        self._check()
        if pos_op >= 0 and not self.positioned:
            if values:
                self._get(<lio_cursor_op>pos_op)
            else:
                self._get_keys_only(<lio_cursor_op>pos_op)
        it = _Iterator.__new__(_Iterator)
        it.curs = self
        it.op = op
        it.started = False
        if not values:
            it.kind = 1
        elif not keys:
            it.kind = 2
        else:
            it.kind = 0
        return it

    def __iter__(self):
        return self._iter(LIO_FIRST, LIO_NEXT, True, True)

    def iternext(self, keys=True, values=True):
        """Forward iterator yielding the current element, then calling
        :py:meth:`next`, until the end (from the first record if
        unpositioned).  It yields ``(key, value)`` tuples, or only keys
        (``values=False``) or only values (``keys=False``)."""
        return self._iter(LIO_FIRST, LIO_NEXT, keys, values)

    def iternext_dup(self, keys=False, values=True):
        """Forward iterator over the current key's values (``keys``,
        ``values``: what to yield, as in :py:meth:`iternext`)."""
        return self._iter(-1, LIO_NEXT_DUP, keys, values)

    def iternext_nodup(self, keys=True, values=False):
        """Forward iterator over keys (first value of each; ``keys``,
        ``values``: what to yield, as in :py:meth:`iternext`)."""
        return self._iter(LIO_FIRST, LIO_NEXT_NODUP, keys, values)

    def iterprev(self, keys=True, values=True):
        """Reverse iterator (from the last record if unpositioned;
        ``keys``, ``values``: what to yield, as in :py:meth:`iternext`)."""
        return self._iter(LIO_LAST, LIO_PREV, keys, values)

    def iterprev_dup(self, keys=False, values=True):
        """Reverse iterator over the current key's values (``keys``,
        ``values``: what to yield, as in :py:meth:`iternext`)."""
        return self._iter(-1, LIO_PREV_DUP, keys, values)

    def iterprev_nodup(self, keys=True, values=False):
        """Reverse iterator over keys (last value of each; ``keys``,
        ``values``: what to yield, as in :py:meth:`iternext`)."""
        return self._iter(LIO_LAST, LIO_PREV_NODUP, keys, values)

    def _iter_from(self, k, reverse):
        """py-lmdb's helper: iterate from the first key >= `k` (backwards
        with `reverse`)."""
        cdef _Iterator it
        cdef bytes kb = _to_bytes(k)
        self._check()
        if not kb and not reverse:
            self._get(LIO_FIRST)
        else:
            self._op_kv(LIO_SET_RANGE, kb, None)
        op = LIO_NEXT
        if reverse:
            op = LIO_PREV
            if not self.positioned:
                self._get(LIO_LAST)
        it = _Iterator.__new__(_Iterator)
        it.curs = self
        it.op = op
        it.started = False
        it.kind = 0
        return it

    # ---- writes: all refused ---------------------------------------------

    def put(self, key, value, dupdata=True, overwrite=True, append=False):
        """Writes are refused: raises ``lmdbio.ReadonlyError``; `key`,
        `value`, `dupdata`, `overwrite` and `append` are py-lmdb's
        arguments."""
        self._check()
        _to_bytes(key)
        _to_bytes(value)
        raise _make_error('mdb_put', EACCES_)

    def putmulti(self, items, dupdata=True, overwrite=True, append=False):
        """Writes are refused: raises ``lmdbio.ReadonlyError`` at the first
        item (an empty `items` returns ``(0, 0)``, as py-lmdb); `dupdata`,
        `overwrite` and `append` are py-lmdb's arguments."""
        self._check()
        for item in items:
            if type(item) is not tuple or len(item) != 2:
                raise TypeError('putmulti() elements must be 2-tuples')
            _to_bytes(item[0])
            _to_bytes(item[1])
            raise _make_error('mdb_cursor_put() element #0', EACCES_)
        return (0, 0)

    def delete(self, dupdata=False):
        """Returns ``False`` when unpositioned; otherwise the delete is
        refused with ``lmdbio.ReadonlyError`` (``dupdata`` or not)."""
        self._check()
        if self.positioned:
            raise _make_error('mdb_cursor_del', EACCES_)
        return False

    def replace(self, key, value):
        """Writes are refused: raises ``lmdbio.ReadonlyError`` (on a
        ``dupsort`` database after looking `key` up, as py-lmdb); `value`
        is py-lmdb's argument."""
        self._check()
        _to_bytes(key)
        _to_bytes(value)
        if self._dbflags & LIO_DUPSORT:
            if self._op_kv(LIO_SET_KEY, key, None):
                raise _make_error('mdb_cursor_del', EACCES_)
        raise _make_error('mdb_put', EACCES_)

    def pop(self, key):
        """Returns ``None`` for a missing `key`; otherwise the delete is
        refused with ``lmdbio.ReadonlyError``."""
        if self._op_kv(LIO_SET_KEY, key, None):
            raise _make_error('mdb_cursor_del', EACCES_)
        return None


@cython.no_gc_clear
@cython.final
cdef class _Iterator:
    """A cursor iterator (py-lmdb's ``_Iterator``): yields the current
    element, then moves with its op."""
    cdef Cursor curs
    cdef lio_cursor_op op
    cdef bint started
    cdef int kind     # 0 item, 1 key, 2 value

    def __iter__(self):
        return self

    def __next__(self):
        cdef Cursor c = self.curs
        if c is None:
            raise StopIteration
        if c._c == NULL or not c.txn._live():
            c._check()
        if not c.positioned:
            raise StopIteration
        if self.started:
            if self.kind == 1:
                c._get_keys_only(self.op)
            else:
                c._get(self.op)
            if not c.positioned:
                raise StopIteration
        self.started = True
        if self.kind == 0:
            return c._item()
        if self.kind == 1:
            return _cur_val(c._c, &c._key, c._buffers)
        return c._v()




def _fault_injected():
    """Faults injected so far in this process by the test-only hook
    ($LMDBIO_FAULT, see csrc/lmdbio.h), or None when this build does not
    have it (only builds compiled with -DLMDBIO_FAULT_INJECTION do)."""
    cdef uint64_t n = 0
    if not lio_fault_injection(&n):
        return None
    return n


def enable_drop_gil():
    """Deprecated (py-lmdb compatibility): the GIL is always released
    around reads."""


# ---------------------------------------------------------------------------
# Compacting copy (csrc/copy.c)
# ---------------------------------------------------------------------------

cdef int _copy_write(void *ctx, const void *buf, size_t length) noexcept nogil:
    """lio_write_fn over a file descriptor: 0, or the errno of write()."""
    cdef int fd = (<int *>ctx)[0]
    cdef ssize_t w
    cdef size_t done = 0
    while done < length:
        w = c_write(fd, <const char *>buf + done, length - done)
        if w < 0:
            if errno == EINTR:
                continue
            return errno or EIO
        done += <size_t>w
    return 0


def _compact_copy(Environment env, Transaction txn, int fd, what):
    """mdb_env_copy with MDB_CP_COMPACT into fd: byte for byte what
    ``mdb_copy -c`` writes (lio_compact_copy)."""
    cdef lio_error err
    cdef int rc
    cdef int cfd = fd
    cdef uint64_t mapsize = env._mapsize
    cdef int nosubdir = not env._subdir
    with nogil:
        rc = lio_compact_copy(env._env, &txn.snap, mapsize, nosubdir,
                              _copy_write, &cfd, &err)
    if rc == LIO_SYSERR and err.off == <uint64_t>-1:
        # the write callback failed
        raise _make_error(what, err.sys_errno or EIO,
                          sys_errno=err.sys_errno or EIO)
    if rc == LIO_SYSERR:
        raise _core_error(what, rc, &err, env._dpath)
    if rc:
        raise _core_error(None, rc, &err, env._dpath)


# ---------------------------------------------------------------------------
# The format's records and the lock file, decoded by the core for lmdbio's
# mdb_stat / mdb_dump (cli.py): lio_read_header, lio_decode_dbrec,
# lio_free_record (format.c, env.c) and lio_lock_inspect (lockfile.c).
# ---------------------------------------------------------------------------

#: The persistent database flags (lmdbio.h's LIO_*), by py-lmdb's names.
_DB_FLAGS = {'reverse_key': LIO_REVERSEKEY, 'dupsort': LIO_DUPSORT,
             'integerkey': LIO_INTEGERKEY, 'dupfixed': LIO_DUPFIXED,
             'integerdup': LIO_INTEGERDUP, 'reversedup': LIO_REVERSEDUP}


def _read_header(path):
    """The meta page liblmdb picks when it opens the data file at `path`
    (mdb_env_read_header: P_META, magic and version checked, the greater
    txnid): a dict as ``Environment._meta()`` gives, plus ``address``."""
    cdef bytes cpath = _os.fsencode(path)
    cdef const char *c = cpath
    cdef lio_posix *px = NULL
    cdef lio_source src
    cdef lio_meta m
    cdef lio_error err
    cdef int rc
    with nogil:
        rc = lio_posix_open(&px, c, 0, &err)
    if rc:
        raise _core_error(_os.fsdecode(cpath), rc, &err, None)
    lio_posix_get_source(px, &src)
    try:
        with nogil:
            rc = lio_read_header(&src, &m, &err)
    finally:
        lio_posix_close(px)
    if rc:
        raise _core_error(None, rc, &err, _os.fsdecode(cpath))
    return _meta_dict(&m)


def _dbrec(rec):
    """A database record (a named DB's 48-byte value in the main DB) as a
    dict of its MDB_db fields, or None when `rec` is not one's size."""
    cdef const uint8_t[::1] b = memoryview(rec).cast('B')
    cdef lio_dbrec r
    if b.shape[0] == 0 or lio_decode_dbrec(&b[0], b.shape[0], &r):
        return None
    return _dbrec_dict(&r)


def _free_record(key, value):
    """A free-DB record: ``(txnid, count, pages)``, the txnid that freed the
    pages (its key), the page count the value records and the page numbers
    its bytes hold (at most count)."""
    cdef const uint8_t[::1] k = memoryview(key).cast('B')
    cdef const uint8_t[::1] b = memoryview(value).cast('B')
    cdef uint64_t txnid = 0, count = 0, have = 0, i
    if k.shape[0]:
        txnid = lio_free_key(&k[0], k.shape[0])
    if b.shape[0] == 0:
        return txnid, 0, ()
    have = lio_free_record(&b[0], b.shape[0], &count)
    return txnid, count, tuple([lio_free_page(&b[0], i) for i in range(have)])


def _lock_inspect(lock_path):
    """What a liblmdb 0.9 opener would find in the lock file at `lock_path`,
    read and probed without taking a lock (lio_lock_inspect; its errors
    name the lock file): a dict of
    exists, live, max_readers, num_readers, slots (a list of (txnid, pid,
    tid, stale)), readers (mdb_reader_list's text) and readers_checked (the
    same without the stale slots, as after mdb_reader_check)."""
    cdef bytes cpath = _os.fsencode(lock_path)
    cdef const char *c = cpath
    cdef lio_lock_info info
    cdef lio_error err
    cdef int rc
    cdef unsigned i
    with nogil:
        rc = lio_lock_inspect(c, &info, &err)
    if rc:
        raise _core_error(None, rc, &err, None)
    try:
        return {
            'exists': bool(info.exists), 'live': bool(info.live),
            'max_readers': info.max_readers,
            'num_readers': info.num_readers,
            'slots': [(info.slots[i].txnid, info.slots[i].pid,
                       info.slots[i].tid, bool(info.slots[i].stale))
                      for i in range(info.nslots)],
            'readers': _info_list(&info, 0),
            'readers_checked': _info_list(&info, 1),
        }
    finally:
        lio_lock_info_free(&info)


cdef bytes _info_list(const lio_lock_info *info, int skip_stale):
    cdef size_t n = lio_lock_info_list(info, skip_stale, NULL, 0)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n + 1)
    lio_lock_info_list(info, skip_stale, PyBytes_AS_STRING(out), n + 1)
    return out[:n]

