"""The bulk path: :class:`Reader` yields numpy batches of records.

Records are addressed by ordinal (their position in key order, duplicates
counted as ``Cursor.next()`` sees them).  A record index built from the leaf
headers maps an ordinal to its leaf without walking, so a shard, a shuffled
batch or a single record starts in O(log leaves); each batch is read with
few, large, concurrent reads (leaves coalesced in page order, overflow
values read straight into the output).
"""

import hashlib
import math
import os
import queue
import threading

import numpy as np

from lmdbio._bulk import BulkFile
from lmdbio.errors import Error

__all__ = ['Reader', 'Batch', 'Ragged', 'shard_order']

_INDEX_MAGIC = 0x6C6D6462696F6978  # "lmdbioix"
_INDEX_VERSION = 1
_STOPPED = object()  # the prefetch thread was stopped by close()


class Ragged:
    """Variable-length byte strings stored back to back.

    ``data`` holds every item (``np.uint8``), ``offsets`` (``np.int64[n+1]``)
    where each starts; ``self[i]`` is item i as bytes."""

    __slots__ = ('data', 'offsets')

    def __init__(self, data, offsets):
        self.data = data
        self.offsets = offsets

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError('Ragged index out of range')
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes()

    def __iter__(self):
        return iter(self.tolist())

    def tolist(self):
        data = self.data.tobytes()
        off = self.offsets.tolist()
        return [data[off[i]:off[i + 1]] for i in range(len(off) - 1)]

    def lengths(self):
        return np.diff(self.offsets)

    def fixed(self):
        """A ``np.uint8[n, width]`` view of equal-length items (no copy)."""
        n = len(self)
        if n == 0:
            return self.data[:0].reshape(0, 0)
        width = int(self.offsets[1] - self.offsets[0])
        if n * width != int(self.offsets[-1] - self.offsets[0]) or \
                np.any(np.diff(self.offsets) != width):
            raise ValueError('items have different lengths')
        start = int(self.offsets[0])
        return self.data[start:start + n * width].reshape(n, width)

    def copy(self):
        return Ragged(self.data.copy(), self.offsets.copy())

    def __repr__(self):
        return 'Ragged(n=%d, bytes=%d)' % (len(self), len(self.data))


class Batch:
    """Records of one batch: ``indices`` (ordinals), ``keys``, ``values``."""

    __slots__ = ('indices', 'keys', 'values')

    def __init__(self, indices, keys, values):
        self.indices = indices
        self.keys = keys
        self.values = values

    def __len__(self):
        return len(self.indices)

    def copy(self):
        return Batch(self.indices.copy(),
                     self.keys.copy() if self.keys is not None else None,
                     self.values.copy())

    def __repr__(self):
        return 'Batch(n=%d)' % len(self)


def shard_order(n, rank, world_size, shuffle=False, seed=0, epoch=0,
                drop_last=False, batch_size=1):
    """The ordinals rank `rank` reads in epoch `epoch` (api.md's rule)."""
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(n)
    else:
        order = np.arange(n, dtype=np.int64)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if drop_last:
        per = n // world_size
        mine = order[rank * per:(rank + 1) * per]
        keep = (per // batch_size) * batch_size
        return np.ascontiguousarray(mine[:keep], dtype=np.int64)
    per = -(-n // world_size)
    pos = (rank * per + np.arange(per, dtype=np.int64)) % n
    return np.ascontiguousarray(order[pos], dtype=np.int64)


def _cache_dir(index_cache):
    if index_cache is True:
        base = os.environ.get('XDG_CACHE_HOME') or \
            os.path.join(os.path.expanduser('~'), '.cache')
        return os.path.join(base, 'lmdbio')
    return os.fspath(index_cache)


def _data_path(path, subdir):
    path = os.fspath(path)
    if subdir:
        if not os.path.exists(path):
            raise Error('%s: No such file or directory' % path)
        if not os.path.isdir(path):
            raise Error('%s: not a directory (subdir=True)' % path)
        data = os.path.join(path, 'data.mdb')
        if not os.path.exists(data):
            raise Error('%s: no data.mdb in this directory' % path)
        return data
    if not os.path.exists(path):
        raise Error('%s: No such file or directory' % path)
    return path


class Reader:
    """Bulk reader of one LMDB database: numpy batches, sharded, shuffled,
    prefetched.  See api.md section 2 for the arguments and the sharding
    rule.  ``len(reader)`` is the number of batches per epoch on this rank.
    """

    def __init__(self, path, *, db=None, subdir=True, batch_size=256,
                 comm=None, rank=None, world_size=None, shuffle=False,
                 seed=0, drop_last=False, engine="auto", node_local=False,
                 node_size=None, io_groups=None, hints=None,
                 prefetch_bytes=64 << 20, direct=False, lock=False,
                 index_cache=True, keys=True, threads=4):
        if comm is not None or engine == 'mpiio' or node_local:
            raise Error('%s: the MPI-IO engine (comm=, engine="mpiio", '
                        'node_local=) is not available in this version of '
                        'lmdbio; use rank=/world_size= with the POSIX engine'
                        % (path,))
        if engine not in ('auto', 'posix'):
            raise ValueError('engine must be "auto", "posix" or "mpiio"')
        if batch_size < 1:
            raise ValueError('batch_size must be at least 1')
        self.rank = 0 if rank is None else int(rank)
        self.world_size = 1 if world_size is None else int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError('need 0 <= rank < world_size')
        self.path = os.fspath(path)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.prefetch_bytes = int(prefetch_bytes)
        self.keys_wanted = bool(keys)
        self.epoch = 0
        self._io_lock = threading.Lock()
        self._workers = []
        self._env = self._txn = None
        self._file = None
        if isinstance(db, str):
            db = db.encode()
        self.db = db
        data = _data_path(self.path, subdir)
        self._file = BulkFile(data, direct=bool(direct), threads=threads)
        try:
            self._pin_snapshot(lock, subdir)
            self._file.select(db)
            self._load_index(index_cache, data)
        except BaseException:
            self.close()
            raise
        self.total_records = self._file.num_records
        self._order = None

    # -- snapshot and index ---------------------------------------------
    def _pin_snapshot(self, lock, subdir):
        if not lock:
            self._file.snapshot(0)
            return
        # Hold a reader slot in lock.mdb for the reader's life (as a liblmdb
        # reader does), then read exactly the snapshot it pins.
        from lmdbio import Environment
        self._env = Environment(self.path, subdir=subdir, lock=True,
                                readonly=True, max_dbs=0)
        for _ in range(100):
            self._txn = self._env.begin()
            if self._file.snapshot(self._txn.id()):
                return
            self._txn.abort()
        raise Error('%s: could not pin a snapshot: the writer keeps moving'
                    % self.path)

    def _cache_file(self, index_cache, data):
        st = os.stat(data)
        key = '%s|%d|%d|%r|%d|%d' % (os.path.realpath(data), st.st_dev,
                                      st.st_ino, self.db, self._file.txnid,
                                      self._file.root)
        name = hashlib.sha1(key.encode()).hexdigest() + '.npy'
        head = np.array([_INDEX_MAGIC, _INDEX_VERSION, st.st_dev, st.st_ino,
                         self._file.txnid, self._file.root,
                         self._file.entries], dtype=np.uint64)
        return os.path.join(_cache_dir(index_cache), name), head

    def _load_index(self, index_cache, data):
        self.index_from_cache = False
        self.index_pages_read = 0
        if index_cache is False or index_cache is None:
            self.index_pages_read = self._file.build_index()
            return
        path, head = self._cache_file(index_cache, data)
        try:
            arr = np.load(path, allow_pickle=False)
            if arr.dtype == np.uint64 and len(arr) >= len(head) + 1 and \
                    np.array_equal(arr[:len(head)], head):
                n = int(arr[len(head)])
                body = arr[len(head) + 1:]
                if len(body) == 2 * n + 1:
                    self._file.adopt_index(body[:n], body[n:])
                    self.index_from_cache = True
                    return
        except (OSError, ValueError, Error):
            pass  # missing, unreadable or stale: rebuild
        self.index_pages_read = self._file.build_index()
        lp, fi = self._file.index_arrays()
        blob = np.concatenate([head, np.array([len(lp)], dtype=np.uint64),
                               lp, fi])
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = '%s.%d.tmp' % (path, os.getpid())
            with open(tmp, 'wb') as f:
                np.save(f, blob, allow_pickle=False)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache directory only costs the rebuild

    # -- sizes ----------------------------------------------------------
    def _ordinals(self):
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, shard_order(
                self.total_records, self.rank, self.world_size, self.shuffle,
                self.seed, self.epoch, self.drop_last, self.batch_size))
        return self._order[1]

    @property
    def num_records(self):
        return len(self._ordinals())

    def __len__(self):
        return -(-self.num_records // self.batch_size)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    # -- reading --------------------------------------------------------
    def _read(self, ordinals):
        if self._file is None:
            raise Error('%s: the Reader is closed' % self.path)
        ordinals = np.ascontiguousarray(ordinals, dtype=np.int64)
        with self._io_lock:
            kdata, koff, vdata, voff = self._file.read(ordinals,
                                                       self.keys_wanted)
        keys = Ragged(kdata, koff) if kdata is not None else None
        return Batch(ordinals, keys, Ragged(vdata, voff))

    def read(self, indices):
        """One Batch holding the records at these ordinals, in this order."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or
                             indices.max() >= self.total_records):
            raise IndexError('record ordinal out of range (%d records)'
                             % self.total_records)
        return self._read(indices)

    def __iter__(self):
        ordinals = self._ordinals()
        bs = self.batch_size
        starts = range(0, len(ordinals), bs)
        if not len(ordinals):
            return
        stop = threading.Event()
        q = queue.Queue()
        budget = threading.Semaphore(1)
        state = {'depth': 1}

        def produce():
            try:
                for s in starts:
                    budget.acquire()
                    if stop.is_set():
                        q.put(_STOPPED)
                        return
                    b = self._read(ordinals[s:s + bs])
                    # Keep about prefetch_bytes of batches in flight.
                    size = len(b.values.data) + (
                        len(b.keys.data) if b.keys is not None else 0)
                    want = max(1, min(16, self.prefetch_bytes // max(size, 1)))
                    while state['depth'] < want:
                        state['depth'] += 1
                        budget.release()
                    q.put(b)
            except BaseException as e:  # raised again in the consumer
                q.put(e)

        t = threading.Thread(target=produce, name='lmdbio-prefetch',
                             daemon=True)
        self._workers.append((t, stop, budget))
        t.start()
        try:
            for _ in starts:
                item = q.get()
                if item is _STOPPED:
                    raise Error('%s: the Reader was closed' % self.path)
                if isinstance(item, BaseException):
                    raise item
                budget.release()
                yield item
        finally:
            stop.set()
            budget.release()
            t.join()
            self._workers.remove((t, stop, budget))

    # -- statistics and lifetime ----------------------------------------
    def io_stats(self):
        """(read requests, bytes read) by this reader's I/O threads."""
        return self._file.stats() if self._file is not None else (0, 0)

    def close(self):
        for t, stop, budget in list(self._workers):
            stop.set()
            budget.release()
            t.join()
        self._workers = []
        if self._file is not None:
            with self._io_lock:
                self._file.close()
                self._file = None
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        if self._env is not None:
            self._env.close()
            self._env = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
