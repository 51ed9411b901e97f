"""The bulk path: :class:`Reader` yields numpy batches of records.

Records are addressed by ordinal (their position in key order, duplicates
counted as ``Cursor.next()`` sees them).  A record index built from the leaf
headers maps an ordinal to its leaf without walking, so a shard, a shuffled
batch or a single record starts in O(log leaves); each batch is read with
few, large, concurrent reads (leaves coalesced in page order, overflow
values read straight into the output).
"""

import hashlib
import logging
import os
import threading
import weakref

import numpy as np
# numpy loads numpy.random on first use (17 ms here): a shuffled epoch's
# first batch paid it; it belongs with the imports.
import numpy.random  # noqa: F401

from lmdbio._bulk import (BulkFile, checksum, gather, ordinal_bounds,
                          ragged_items)
# the rule of a first start's reads ahead of its counting (the C lanes'
# own, which the scale model follows too)
from lmdbio._bulk import leaves_ahead, leaves_ahead_error  # noqa: F401
from lmdbio._state import check_state
from lmdbio.errors import (Error, CorruptedError, PageNotFoundError,
                           SnapshotChangedError, forked_error, make_error)

__all__ = ['Reader', 'Batch', 'Ragged', 'shard_order']

_INDEX_MAGIC = 0x6C6D6462696F6978  # "lmdbioix"
_INDEX_VERSION = 6  # 4: the record map; 5: its own digest; 6: lio_checksum
_log = logging.getLogger('lmdbio')
# A window's bytes at most (leaves, values, keys): windows of a few MiB stay
# in the CPU's cache between the read and the copy into the batches, and a
# fresh process faults in less new memory (measured: a hot 80 MB epoch in a
# new process took 2x as long with 16 MiB windows as with 2-4 MiB ones).
# In key order 2 MiB (the C lanes' per-window cost is small: fresh
# processes, 7-11 interleaved rounds, 2 against 4 MiB: the demo's 20 ms
# epoch 20 vs 23-27 ms, 500k small records 96-104 vs 108-118 ms, scattered
# 117 vs 134 ms, big 184 vs 187 ms); shuffled 4 MiB, where a larger window
# holds records nearer each other in the file (500k small records 715 vs
# 801 ms).
# The same 2 MiB when the OS cache holds the whole file.  Each window costs
# a fixed hand-over between the lanes and the consumer (a wake-up, a
# context switch: ~50 us on a 2-vCPU VM), so a smaller window loses more
# than the CPU cache gives back.  Fresh processes over 500k small records,
# hot, later start: on an AMD EPYC (1 MiB L2 a core) 2 MiB windows took
# 0.045 s in-process against 0.053 s with 1 MiB and 0.043 s with 4 MiB,
# and 0.69-0.74x raw pread in fresh processes against 0.52-0.57x with 1
# MiB; on an Intel Xeon (2 MiB L2), 1 MiB took 0.121 s against 0.131 s.
_WINDOW_BYTES = 4 << 20
_ORDERED_WINDOW_BYTES = 2 << 20


def _window_budget(prefetch_bytes, shuffle, lanes=2):
    """What a window may hold: a share of prefetch_bytes (one window being
    read per lane, one consumed, one waiting), at most a few MiB."""
    most = _WINDOW_BYTES if shuffle else _ORDERED_WINDOW_BYTES
    return max(1, min(prefetch_bytes // (lanes + 2), most))
# Leaves held in memory for random access (_random_access), at most this
# many bytes: a million CIFAR-like records have 26 MB of leaves, a million
# 100-byte records 120 MB.
_LEAVES_HELD = 128 << 20
_STATE_VERSION = 1  # state_dict()'s layout


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
        """The items as a list of bytes."""
        items = ragged_items(self.data, self.offsets)
        if items is not None:
            return items
        data = self.data.tobytes()
        off = self.offsets.tolist()
        return [data[off[i]:off[i + 1]] for i in range(len(off) - 1)]

    def lengths(self):
        """The items' lengths, ``np.int64[n]``."""
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
        """A Ragged owning copies of ``data`` and ``offsets`` (a
        ``node_local`` batch's views are reused at the next batch)."""
        return Ragged(self.data.copy(), self.offsets.copy())

    def __repr__(self):
        return 'Ragged(n=%d, bytes=%d)' % (len(self), len(self.data))


class Batch:
    """Records of one batch: ``indices`` (``np.int64[n]``, their ordinals),
    ``keys`` (a :class:`Ragged`, or None with ``keys=False``) and
    ``values`` (a :class:`Ragged`)."""

    __slots__ = ('indices', 'keys', 'values')

    def __init__(self, indices, keys, values):
        self.indices = indices
        self.keys = keys
        self.values = values

    def __len__(self):
        return len(self.indices)

    def copy(self):
        """A Batch owning copies of its arrays (see :meth:`Ragged.copy`)."""
        return Batch(self.indices.copy(),
                     self.keys.copy() if self.keys is not None else None,
                     self.values.copy())

    def __repr__(self):
        return 'Batch(n=%d)' % len(self)


def shard_order(n, rank, world_size, shuffle=False, seed=0, epoch=0,
                drop_last=False, batch_size=1):
    """The ordinals rank ``rank`` of ``world_size`` reads in epoch
    ``epoch`` of ``n`` records: the sharding rule of :class:`Reader`
    (``shuffle``, ``seed``, ``drop_last`` and ``batch_size`` as there)."""
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


def _digest(*parts):
    """A checksum of a cached index, over its parts in turn (lio_checksum,
    chained: it guards against a damaged or truncated file at memory
    speed, so that opening with a cached index costs little more than
    reading it; zlib's CRC-32 ran at 1.6 GB/s, 3.5 ms of a first start's
    save)."""
    h = 0
    for arr in parts:
        h = checksum(np.ascontiguousarray(arr), h)
    return np.uint64(h)


def _save_index(path, head, leaves, first, recmap=None):
    """Write an index (and its record map, if any) to the cache
    (atomically; a read-only cache directory only costs the next start a
    rebuild).  One .npy array of uint64: head, (leaves, map entries, index
    digest, map digest), leaves, first, map; written part by part (a
    first start saves while its epoch runs: joining the parts first had
    cost three copies of them in fresh memory)."""
    u64 = np.dtype(np.uint64)
    parts = [np.ascontiguousarray(a, dtype=u64) for a in
             (leaves, first, () if recmap is None else recmap)]
    leaves, first, recmap = parts
    # Two digests: a start that needs no map (an unshuffled epoch, a
    # shard) checks only the index part.
    fixed = np.concatenate([np.asarray(head, dtype=u64),
                            np.array([len(leaves), len(recmap),
                                      _digest(leaves, first),
                                      _digest(recmap)], dtype=u64)])
    total = len(fixed) + len(leaves) + len(first) + len(recmap)
    header = {'descr': np.lib.format.dtype_to_descr(u64),
              'fortran_order': False, 'shape': (total,)}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = '%s.%d.tmp' % (path, os.getpid())
        with open(tmp, 'wb') as f:
            np.lib.format.write_array_header_1_0(f, header)
            for part in (fixed, leaves, first, recmap):
                f.write(memoryview(part).cast('B'))
        os.replace(tmp, path)
    except OSError:
        pass


def _load_index_file(path, head):
    """(leaves, first, map) from a cache file that _save_index wrote for
    this snapshot (`head`), or None.  Only the index part is read and
    checked; `map` is None or (offset, entries, digest, path) for
    _read_recmap: its 8 bytes a record stay on disk until a start reads
    with them."""
    u64 = np.dtype(np.uint64)
    with open(path, 'rb') as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            return None
        h = len(head)
        if dtype != u64 or fortran or len(shape) != 1 or shape[0] < h + 4:
            return None
        fixed = np.fromfile(f, dtype=u64, count=h + 4)
        if len(fixed) != h + 4 or not np.array_equal(fixed[:h], head):
            return None
        n, m = int(fixed[h]), int(fixed[h + 1])
        if shape[0] != h + 4 + 2 * n + 1 + m:
            return None
        index = np.fromfile(f, dtype=u64, count=2 * n + 1)
        if len(index) != 2 * n + 1 or \
                fixed[h + 2] != _digest(index[:n], index[n:]):
            return None
        recmap = (f.tell(), m, fixed[h + 3], path) if m else None
    return index[:n], index[n:], recmap


_CACHE_FIX = 'delete it, or open with index_cache=False'


def _read_recmap(pending):
    """The record map a cache file holds (pending: from _load_index_file),
    its checksum checked; None if the file no longer holds it (the map only
    makes reads cheaper: the leaves serve without it)."""
    offset, m, digest, path = pending
    try:
        recmap = np.fromfile(path, dtype=np.uint64, count=m, offset=offset)
    except (OSError, ValueError):
        return None
    if len(recmap) != m:
        return None
    if _digest(recmap) != digest:
        raise CorruptedError('the record map of the cached index %s does '
                             'not match its checksum: %s' % (path, _CACHE_FIX))
    return recmap


def _split(arrays, counts):
    """Per-part (kdata, koff, vdata, voff) of a concatenated batch."""
    kdata, koff, vdata, voff = arrays
    parts, start = [], 0
    for n in counts:
        part = []
        for data, off in ((kdata, koff), (vdata, voff)):
            if data is None:
                part += [None, None]
                continue
            o = off[start:start + n + 1]
            part += [data[o[0]:o[-1]], o - o[0]]
        parts.append(tuple(part))
        start += n
    return parts


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


# Readers whose lane locks (and Python lanes' conditions) a fork must not
# copy held: a thread holds them while it reads without the GIL, and the
# child, which has not that thread, would wait for them forever.  The
# fork waits for each (at most _FORK_WAIT seconds: a lock it cannot get
# is left as it is), which also keeps a consumer from starting its C
# lanes again between their stop (_bulk's hook, which runs after this
# one) and the fork.
_open_readers = weakref.WeakSet()
_FORK_WAIT = 10.0
_held_for_fork = []


def _lanes_before_fork():
    # a Reader over several environments before its parts, in the order
    # its own code takes them (_random_access)
    for r in sorted(_open_readers, key=lambda r: r.__dict__.get('_parts')
                    is None):
        locks = list(getattr(r, '_lane_locks', ()))
        for w in list(getattr(r, '_workers', ())):
            if isinstance(w, tuple):   # Python lanes: their conditions
                locks += w[2]
        for lock in locks:
            if lock.acquire(timeout=_FORK_WAIT):
                _held_for_fork.append(lock)


def _lanes_after_fork():
    while _held_for_fork:
        _held_for_fork.pop().release()


os.register_at_fork(before=_lanes_before_fork,
                    after_in_parent=_lanes_after_fork,
                    after_in_child=_lanes_after_fork)


def _stop_worker(worker):
    """Stop prefetch threads: each finishes the window it is reading (a C
    call cannot be interrupted), sees the stop and exits; what they read
    and nobody took is dropped.  A worker is a window pipeline (its C
    lanes) or (threads, stop event, conditions to wake)."""
    if not isinstance(worker, tuple):
        worker.stop()
        return
    threads, stop, conds = worker
    stop.set()
    for cond in conds:
        with cond:
            cond.notify_all()
    for t in threads:
        if t.ident is not None:   # (another thread may close before start)
            t.join()


def _io_policy(storage):
    """(max_gap, max_read, region, region_min) for a storage model.

    A hole between two needed ranges is read when reading it costs less
    than a request of its own: gap = cost per request x bandwidth, the cost
    being what a request adds with the reader's many requests in flight
    (latency / queue depth).  Dense regions are handed to the page cache
    whole (WILLNEED).  "local": a local disk or SSD (about 8 us a request,
    2 GB/s); "network": a parallel or network filesystem (0.5 ms a request
    with 16 in flight, 1 GB/s per client), or (seconds per request, bytes
    per second).  A larger gap reads more of a sparse (shuffled, sharded)
    window's holes: at 0.5 ms x 1 GB/s unshared, a shuffled epoch at four
    ranks read the file 17 times over."""
    if storage == 'local':
        latency, bandwidth = 8e-6, 2e9
    elif storage == 'network':
        latency, bandwidth = 5e-4 / 16, 1e9
    else:
        try:
            latency, bandwidth = (float(x) for x in storage)
        except (TypeError, ValueError):
            raise ValueError('storage must be "local", "network" or '
                             '(seconds per request, bytes per second), '
                             'not %r' % (storage,)) from None
        if latency < 0 or bandwidth <= 0:
            raise ValueError('storage: need a request cost >= 0 and a '
                             'bandwidth > 0, not %r' % (storage,))
    gap = int(min(max(latency * bandwidth, 0), 16 << 20))
    max_read = int(min(max(64 * gap, 1 << 20), 64 << 20))
    region = 1 << 20 if gap < (1 << 20) else 1 << (gap.bit_length())
    return gap, max_read, region, 16


def _reopen(cls, path, args, state):
    """Unpickle a Reader (or a DatumReader: cls): reopen with its
    arguments, resume its position."""
    reader = cls(path, **args)
    try:
        reader.load_state_dict(state)
    except BaseException:
        reader.close()
        raise
    return reader


class _Parts:
    """Several environments read as one: global ordinals run through the
    first environment's records, then the second's...  Each part is a
    single-environment Reader (its own snapshot, index and lock); a window
    is split per environment, each part reads its records with one
    read_window, and each batch's records are merged back into the
    window's order."""

    def __init__(self, readers):
        self.readers = readers
        counts = [r.total_records for r in readers]
        self.starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self.num_records = int(self.starts[-1])

    def read(self, ordinals, keys, independent=True):
        parts, _ = self.read_window(ordinals, [len(ordinals)], keys)
        return parts[0]

    def advise(self, ordinals, lane=0):
        ordinals = np.asarray(ordinals, dtype=np.int64)
        part_of = np.searchsorted(self.starts, ordinals, side='right') - 1
        for p, r in enumerate(self.readers):
            mine = ordinals[part_of == p]
            if len(mine):
                r._file.advise(mine - self.starts[p], lane)

    def read_window(self, ordinals, ends, keys=True, independent=True,
                    lane=0, advise=None, newest=False):
        # (newest: each part checks its own snapshot below)
        if advise is not None:
            self.advise(advise, lane)
        ordinals = np.ascontiguousarray(ordinals, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.intp)
        nb, n = len(ends), len(ordinals)
        counts = np.diff(ends, prepend=0)
        batch_of = np.repeat(np.arange(nb), counts)
        part_of = np.searchsorted(self.starts, ordinals, side='right') - 1
        # Records grouped by part (stable: each part's records stay in the
        # window's order), then by batch within the part.
        order = np.argsort(part_of, kind='stable')
        bounds = np.searchsorted(part_of[order], np.arange(len(self.readers)
                                                           + 1))
        got = []  # per part: (positions in the window, per-batch arrays)
        leaf_bytes = 0
        for p, r in enumerate(self.readers):
            sel = order[bounds[p]:bounds[p + 1]]
            if not len(sel):
                continue
            local = ordinals[sel] - self.starts[p]
            pb = np.bincount(batch_of[sel], minlength=nb)
            nonempty = np.nonzero(pb)[0]
            pends = np.cumsum(pb[nonempty])
            try:
                arrays, lb = r._file.read_window(local, pends, keys,
                                                 independent=True, lane=lane)
            except (CorruptedError, PageNotFoundError) as e:
                raise r._snapshot_changed(e) from e
            if r._env is None:
                r._check_snapshot()
            leaf_bytes += lb
            got.append((sel, nonempty, arrays))
        # Per batch: each part's items copied to their places in the batch.
        per_batch = [[] for _ in range(nb)]
        for sel, nonempty, arrays in got:
            start = 0
            for j, a in zip(nonempty.tolist(), arrays):
                k = len(a[3]) - 1
                per_batch[j].append((sel[start:start + k], a))
                start += k
        out = []
        first = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        for j in range(nb):
            pieces = per_batch[j]
            if len(pieces) == 1:
                out.append(pieces[0][1])
                continue
            if not pieces:  # an empty read
                empty = (np.zeros(0, dtype=np.uint8),
                         np.zeros(1, dtype=np.int64))
                out.append((empty if keys else (None, None)) + empty)
                continue
            res = []
            for d, o in ((0, 1), (2, 3)):
                if pieces[0][1][d] is None:
                    res += [None, None]
                    continue
                lens = np.empty(ends[j] - first[j], dtype=np.int64)
                for sel, a in pieces:
                    lens[sel - first[j]] = np.diff(a[o])
                offsets = np.zeros(len(lens) + 1, dtype=np.int64)
                np.cumsum(lens, out=offsets[1:])
                data = np.empty(int(offsets[-1]), dtype=np.uint8)
                for sel, a in pieces:  # a copy per environment, no GIL
                    gather(a[d], a[o][:-1], np.diff(a[o]), data,
                           offsets[sel - first[j]])
                res += [data, offsets]
            out.append(tuple(res))
        return out, leaf_bytes

    # Each part's own read counts its begun index as it needs (under that
    # file's lock): no turns to take across parts.
    index_pending = False

    def stats(self):
        reqs = nbytes = 0
        for r in self.readers:
            a, b = r.io_stats()
            reqs += a
            nbytes += b
        return reqs, nbytes

    def close(self):
        for r in self.readers:
            r.close()


class _SlotSource:
    """Transactions of a lock=True Environment: the txnid a slot pins."""

    def __init__(self, reader):
        self.reader = reader

    def begin(self):
        self.reader._txn = self.reader._env.begin()
        return self.reader._txn.id()

    def abort(self):
        if self.reader._txn is not None:
            self.reader._txn.abort()
            self.reader._txn = None


class Reader:
    """Bulk reader of an LMDB database: numpy batches of records addressed
    by ordinal (position in key order), sharded, shuffled, prefetched.

    ``len(reader)`` is the number of batches per epoch on this rank; iterate
    for :class:`Batch` objects, call :meth:`set_epoch` before each epoch and
    :meth:`read` for random access.  The epoch's order is
    ``np.random.default_rng([seed, epoch]).permutation(n)`` with
    ``shuffle=True``, key order otherwise; rank ``r`` of ``world_size``
    reads the ``r``-th contiguous block of ``ceil(n / world_size)``
    positions of that order (wrapping around to the start), or with
    ``drop_last=True`` of ``floor(n / world_size)`` positions cut to a
    multiple of ``batch_size`` (:func:`shard_order`).

    :meth:`state_dict` and :meth:`load_state_dict` save and restore the
    position within an epoch; a Reader pickles as its arguments and that
    position (never open files or threads) and reopens where it is
    unpickled, e.g. in a spawn-started DataLoader worker.

    Arguments:
        path: The environment: a directory holding ``data.mdb``
            (``subdir=True``) or the data file.  A list of environments
            reads them as one dataset: ordinals run through the first
            one's records in key order, then the second's, and so on;
            ``total_records`` is the sum, sharding, shuffling and
            :meth:`read` use these ordinals, and each environment keeps its
            own snapshot and record index (not under MPI).
        db: A named database (bytes or str); None: the main database.
        subdir: ``path`` is a directory (True) or the data file.
        batch_size: Records per batch (the last one of an epoch may be
            smaller unless ``drop_last``).
        comm: An mpi4py communicator: rank and world size come from it and
            reads are collective MPI-IO (``engine="mpiio"``); iteration and
            :meth:`close` are then collective.  Such a Reader cannot be
            pickled (a communicator does not travel).
        rank: This process's rank without ``comm`` (default 0).
        world_size: The number of ranks without ``comm`` (default 1).
        shuffle: Shuffle each epoch's order (seeded by ``seed`` and the
            epoch).
        seed: The shuffle's seed.
        drop_last: Equal shares of whole batches only (the rest unread)
            instead of padding by wrapping around.
        engine: ``"auto"`` (MPI-IO with ``comm``, else ``pread``),
            ``"posix"`` or ``"mpiio"``.
        node_local: Under MPI, one leader per node reads the node's batches
            into shared memory; its ranks get zero-copy views, valid until
            they request the next batch.
        node_size: Ranks per emulated node for ``node_local`` (default:
            the ranks sharing memory).
        io_groups: Under MPI, the reading ranks take turns in this many
            groups (staggering).
        hints: MPI-IO hints (a dict of str to str) for ``MPI.File.Open``.
        prefetch_bytes: How many bytes of batches background threads read
            ahead (no thread under MPI).
        direct: Read with ``O_DIRECT`` (an error where the filesystem
            refuses it).
        lock: False (the default): take no reader slot; a writer two
            commits past the snapshot makes the next batch raise
            :class:`lmdbio.SnapshotChangedError`.  True: hold a reader slot
            in the lock file for the Reader's lifetime, as a liblmdb reader
            does, so a live writer cannot reuse the snapshot's pages.
        index_cache: Where the record index is cached per snapshot: True
            (``$XDG_CACHE_HOME/lmdbio``), a directory, or False (no cache).
        keys: Return the keys too (``Batch.keys``); False saves reading
            them.
        threads: I/O threads reading a batch's extents in parallel.
        cache: ``"keep"`` (default) leaves what was read in the page cache;
            ``"drop"`` tells the kernel to drop the pages consumed behind
            the reads (``POSIX_FADV_DONTNEED``), so an epoch over a dataset
            larger than memory does not evict the machine's working set.
        storage: How reads are planned: ``"local"`` (a local disk or SSD),
            ``"network"`` (a parallel or network filesystem), or a pair
            (seconds per request, bytes per second): a hole between needed
            ranges is read through when that costs less than a request.
    """

    def __init__(self, path, *, db=None, subdir=True, batch_size=256,
                 comm=None, rank=None, world_size=None, shuffle=False,
                 seed=0, drop_last=False, engine="auto", node_local=False,
                 node_size=None, io_groups=None, hints=None,
                 prefetch_bytes=64 << 20, direct=False, lock=False,
                 index_cache=True, keys=True, threads=16, cache="keep",
                 storage="local"):
        # close() from two threads at once: the second waits for the first
        self._closing = threading.RLock()
        self._args = dict(
            db=db, subdir=subdir, batch_size=batch_size, rank=rank,
            world_size=world_size, shuffle=shuffle, seed=seed,
            drop_last=drop_last, engine=engine, node_local=node_local,
            node_size=node_size, io_groups=io_groups, hints=hints,
            prefetch_bytes=prefetch_bytes, direct=direct, lock=lock,
            index_cache=index_cache, keys=keys, threads=threads, cache=cache,
            storage=storage)
        if isinstance(path, (list, tuple)):
            paths = [os.fspath(p) for p in path]
            if not paths:
                raise ValueError('path: give at least one environment')
        else:
            paths = [os.fspath(path)]
        self.paths = paths
        self._parts = None  # several environments: one Reader each
        if len(paths) > 1 and (comm is not None or engine == 'mpiio' or
                               node_local):
            raise ValueError('several environments are not supported under '
                             'MPI (comm=, engine="mpiio", node_local) yet: '
                             'give one path')
        if engine not in ('auto', 'posix', 'mpiio'):
            raise ValueError('engine must be "auto", "posix" or "mpiio"')
        if batch_size < 1:
            raise ValueError('batch_size must be at least 1')
        if cache not in ('keep', 'drop'):
            raise ValueError('cache must be "keep" or "drop", not %r'
                             % (cache,))
        self._policy = _io_policy(storage)
        self.cache = cache
        self.path = paths[0] if len(paths) == 1 else paths
        self._io_lock = threading.Lock()  # lane 0: iteration and read()
        self._lane_locks = (self._io_lock, threading.Lock())
        _open_readers.add(self)
        self._recmap_pending = None  # a cached record map not yet loaded
        self._leaves_tried = False   # _random_access asked for the leaves
        self._unsaved_index = None   # a begun index's save, once whole
        self._save_lock = threading.Lock()   # (a lane or the consumer)
        self._workers = []
        self._env = self._txn = None
        self._file = None
        self._comm = self._coll = self._readers = self._mpifile = None
        self._group = None
        self._share = None
        self._leaf_first = None  # the index's first ordinals (MPI windows)
        # Under comm=: windows read, and how (collective MPI-IO or
        # independent reads); a debug line on the "lmdbio" logger each.
        self.mpi_stats = dict(windows=0, collective=0, independent=0)
        if comm is None and (engine == 'mpiio' or node_local):
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        self._owned = []  # communicators this Reader created and frees
        if comm is not None:
            from lmdbio.mpi import Collective
            if not hasattr(comm, 'Dup') or not hasattr(comm, 'Get_rank'):
                raise TypeError('comm must be an mpi4py communicator, not %r'
                                % type(comm).__name__)
            # lmdbio's own duplicate: its collectives never interleave with
            # the caller's traffic on the same communicator.
            self._comm = comm.Dup()
            self._owned.append(self._comm)
            self._coll = Collective(self._comm)
            crank, csize = self._coll.rank, self._coll.size
            if (rank is not None and int(rank) != crank) or \
                    (world_size is not None and int(world_size) != csize):
                raise ValueError('rank/world_size disagree with comm')
            rank, world_size = crank, csize
            if engine == 'auto':
                # Measured fastest under comm=, on a local disk and on an
                # emulated shared filesystem (0.5 ms a request): windows of
                # independent concurrent preads, the ranks agreeing once per
                # window.  engine="mpiio" reads dense windows with MPI-IO's
                # collective two-phase I/O instead.
                engine = 'posix'
        else:
            engine = 'posix'
        self.engine = engine
        self.node_local = bool(node_local)
        self.rank = 0 if rank is None else int(rank)
        self.world_size = 1 if world_size is None else int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError('need 0 <= rank < world_size')
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.prefetch_bytes = int(prefetch_bytes)
        self.keys_wanted = bool(keys)
        self.epoch = 0
        self._start = 0  # the batch the next iteration starts at
        self._received = 0  # batches the caller received this epoch
        # epochs selected so far (set_epoch, load_state_dict): a running
        # epoch stops counting _received once the next one is selected
        self._epoch_count = 0
        if isinstance(db, str):
            db = db.encode()
        self.db = db
        try:
            if len(paths) > 1:
                self._open_parts()
            else:
                self._open(subdir, direct, threads, lock, index_cache,
                           node_size, io_groups, hints)
        except BaseException:
            self.close()
            raise
        self.total_records = self._file.num_records
        self._order = None
        self._perm = None
        # Windows read so far, and the largest (bytes of leaves, values and
        # keys; batches): prefetching stays within prefetch_bytes.
        self.window_stats = {'windows': 0, 'max_bytes': 0, 'max_batches': 0,
                             'max_ahead': 0, 'leaves_held': False,
                             'pipeline_windows': 0, 'window_budget': 0}
        if self._parts is None:
            self._records = [self.total_records]
            self._txnids = [int(self._file.txnid)]
        else:
            self._records = [r.total_records for r in self._parts]
            self._txnids = [t for r in self._parts for t in r._txnids]
            self.index_from_cache = all(r.index_from_cache
                                        for r in self._parts)

    def _open_parts(self):
        """Several environments: a Reader each (its own snapshot, index
        and lock), read together through _Parts."""
        kw = dict(self._args, rank=None, world_size=None, shuffle=False,
                  drop_last=False, batch_size=1)
        self._parts = []
        for p in self.paths:
            self._parts.append(Reader(p, **kw))
            if self.shuffle:   # shuffled windows read with the record map
                self._parts[-1]._adopt_recmap()
        self._file = _Parts(self._parts)

    def _collective(self, fn, *args):
        """fn on every rank, all raising if any failed (no MPI: just fn)."""
        if self._coll is None:
            return fn(*args)
        return self._coll.run(fn, *args)

    def _open(self, subdir, direct, threads, lock, index_cache, node_size,
              io_groups, hints):
        data = self._collective(_data_path, self.path, subdir)
        self._io_groups = max(1, int(io_groups or 1))
        if self._comm is not None:
            from lmdbio.mpi import Collective, MPIFile, NodeShare
            if self.node_local:
                self._share = NodeShare(self._comm, node_size)
                readers = self._share.leaders if self._share.is_leader else None
            else:
                readers = self._comm
            # Staggering (STAG): readers take turns in io_groups groups.
            if readers is not None:
                self._readers = Collective(readers)
                group = self._readers.rank % self._io_groups
                self._group = Collective(readers.Split(group,
                                                       self._readers.rank))
                self._owned.append(self._group.comm)
                self._my_turn = group
            executor = None
            if readers is not None and self.engine == 'mpiio':
                self._mpifile = self._group.run(
                    MPIFile, self._group.comm, data, hints)
                executor = self._mpifile
            self._file = self._collective(
                lambda: BulkFile(data, direct=bool(direct), threads=threads,
                                 executor=executor))
        else:
            self._file = BulkFile(data, direct=bool(direct), threads=threads)
        # (before the index: a first start reads its branch levels by it)
        max_gap, max_read, region, region_min = self._policy
        self._file.set_policy(max_gap, max_read)
        self._file.set_cache(region, region_min, self.cache == 'drop')
        self._pin_snapshot(lock, subdir)
        try:
            self._collective(self._file.select, self.db)
            self.total_records = self._file.entries  # the shares need it
            self._load_index(index_cache, data)
        except (CorruptedError, PageNotFoundError) as e:
            raise self._snapshot_changed(e) from e
        if self._env is None and self._coll is None:
            self._check_snapshot()

    # -- snapshot and index ---------------------------------------------
    def _pin_snapshot(self, lock, subdir):
        source = None
        if lock:
            # Hold a reader slot in lock.mdb for the reader's life (as a
            # liblmdb reader does) and read exactly the snapshot it pins.
            # LMDB's locks do not reach across machines: multi-node reading
            # needs a file nobody writes.
            from lmdbio import Environment
            self._env = self._collective(
                lambda: Environment(self.path, subdir=subdir, lock=True,
                                    readonly=True, max_dbs=0))
            source = _SlotSource(self)
        if self._coll is not None:
            from lmdbio.mpi import pin_snapshot
            pin_snapshot(self._coll, self._file, source)
            return
        for _ in range(100):
            if self._file.snapshot(source.begin() if source else 0):
                return
            source.abort()
        raise Error('%s: could not pin a snapshot: the writer keeps moving'
                    % self.path)

    def _cache_file(self, index_cache, data, part=None):
        # The snapshot (txnid, root) within this file: identity, size and
        # modification time catch a file replaced in place.  A partial
        # index (part: (from_end, need)) has a name of its own.
        st = os.stat(data)
        key = '%s|%d|%d|%d|%d|%r|%d|%d' % (
            os.path.realpath(data), st.st_dev, st.st_ino, st.st_size,
            st.st_mtime_ns, self.db, self._file.txnid, self._file.root)
        if part is not None:
            key += '|part|%d|%d' % part
        name = hashlib.sha1(key.encode()).hexdigest() + '.npy'
        head = np.array([_INDEX_MAGIC, _INDEX_VERSION, st.st_dev, st.st_ino,
                         st.st_size, st.st_mtime_ns, self._file.txnid,
                         self._file.root, self._file.entries],
                        dtype=np.uint64)
        return os.path.join(_cache_dir(index_cache), name), head

    def _part_wanted(self):
        """(from_end, need) when this rank's share of an unshuffled epoch
        lies nearer one end of the tree: counting the leaves from that end
        finds it after reading that share of the leaf headers, not all of
        them.  None: the whole index (one rank, a shuffled order, a share
        that wraps around, MPI's cooperative build)."""
        n = self.total_records
        if self._coll is not None or self.shuffle or self.world_size == 1:
            return None
        first, count = self._span()
        if count == 0 or first + count > n:
            return None
        prefix, suffix = first + count, n - first
        if min(prefix, suffix) >= n:
            return None
        return (1, suffix) if suffix < prefix else (0, prefix)


    def _load_index(self, index_cache, data):
        self.index_from_cache = False
        self._index_cache = (index_cache, data)
        use_cache = index_cache is not False and index_cache is not None
        path = head = None
        part = self._part_wanted()
        if use_cache:
            path, head = self._collective(self._cache_file, index_cache, data)

        def load(path=path):
            if not use_cache:
                return None
            try:
                return _load_index_file(path, head)
            except Exception:  # missing, truncated, not an .npy: rebuild
                return None

        def save(leaves, first, recmap=None, path=path):
            if use_cache:
                _save_index(path, head, leaves, first, recmap)

        if self._coll is not None:
            from lmdbio.mpi import cooperative_index

            def load_with_map():   # rank 0's copy is broadcast, map and all
                got = load()
                if got is None or got[2] is None:
                    return got
                return got[0], got[1], _read_recmap(got[2])

            self.index_from_cache = cooperative_index(self._coll, self._file,
                                                      load_with_map, save)
            return
        cached = load()
        if cached is not None:
            try:
                self._file.adopt_index(cached[0], cached[1])
            except Error:
                pass  # inconsistent with the snapshot: rebuild
            else:
                # The record map serves shuffled windows and read(): a
                # Reader that iterates in order never loads it (8 bytes a
                # record to check would cost its open).
                self._recmap_pending = cached[2]
                if self.shuffle:
                    self._adopt_recmap()
                self.index_from_cache = True
                return
        if part is not None:
            ppath = self._cache_file(index_cache, data, part)[0] \
                if use_cache else None
            cached = load(ppath)
            if cached is not None:
                try:
                    self._file.adopt_index(cached[0], cached[1], partial=True)
                    self.index_from_cache = True
                    return
                except Error:
                    pass
            self._file.build_index_part(*part)
            save(*self._file.index_arrays(), path=ppath)
            return
        if not self.shuffle:
            # An epoch in key order counts the leaves as its windows read
            # them (one read of each leaf, not one for the index and one
            # for the records); the index is saved once every leaf is
            # counted.  A shuffled epoch needs all of it first.
            self._file.begin_index()
            self._unsaved_index = save
            self._save_if_whole()
            return
        self._file.build_index()
        save(*self._file.index_views())

    def _save_if_whole(self):
        """Save a begun index (_load_index) once every leaf is counted."""
        if self._parts is not None:
            for r in self._parts:
                r._save_if_whole()
            return
        with self._save_lock:
            save, f = self._unsaved_index, self._file
            if save is None or f is None or f.index_pending:
                return
            # The index's own arrays, not copies, taken under the lanes'
            # locks (nothing replaces the index meanwhile) and written
            # after them: the views keep its memory, and the lanes read on
            # (both had waited for the save, 4 ms of a 130 ms first start).
            with self._lane_locks[0], self._lane_locks[1]:
                if f.index_pending:
                    return
                views = f.index_views()
            self._unsaved_index = None
            save(*views)

    def _finish_index(self):
        """Count the rest of a begun index before reads in random order
        (read(), which a map-style dataset makes): they need all of it,
        with the record map a cached index would bring them."""
        f = self._file
        if f is None or not f.index_pending:
            return
        with self._lane_locks[0], self._lane_locks[1]:
            f = self._live_file()
            f.finish_index()
            recmap = f.index_recmap()
            if recmap is not None:
                f.set_recmap(recmap)
        self._save_if_whole()

    def _adopt_recmap(self):
        """Give the index the record map its cache file holds (once).  A
        damaged map fails here (CorruptedError naming its record and page),
        not silently rebuilt: the cache passed its digest, or the digest
        of the map itself fails, so something wrote it wrong."""
        if self._recmap_pending is None or self._file is None:
            return
        pending, self._recmap_pending = self._recmap_pending, None
        recmap = _read_recmap(pending)
        if recmap is None:
            return
        with self._lane_locks[0], self._lane_locks[1]:
            try:
                self._live_file().set_recmap(recmap)
            except CorruptedError as e:
                raise make_error('%s; the cached index %s is damaged: %s'
                                 % (e.what, pending[3], _CACHE_FIX),
                                 e.code) from None

    def _random_access(self):
        """Before reads in random order (a shuffled epoch, read()): the
        cached record map, and, for a tree without one (more than
        LIO_RECMAP_PER_LEAF records a leaf, or values in overflow runs),
        its leaves held in memory (read and checked once; at most
        _LEAVES_HELD bytes; window_stats['leaves_held']).  Without them a
        shuffled window reads a whole leaf for the one or two of its records
        it needs, and the next window most of the same leaves again: a
        window of CIFAR-like records read most leaves, a value each, and an
        epoch of 100-byte records (34 a leaf) read its leaves 19 times over
        (2.7x slower hot).  Not under MPI (its reads are collective, window
        by window), nor for a partial index.  Several environments: each
        part's own."""
        if self._parts is not None:
            # (the outer Reader's lanes read the parts' files under its
            # locks, not theirs: their indexes change under these)
            with self._lane_locks[0], self._lane_locks[1]:
                for r in self._parts:
                    r._random_access()
            return
        if self._coll is None:
            self._finish_index()
        self._adopt_recmap()
        if self._leaves_tried or self._file is None or self._coll is not None:
            return
        self._leaves_tried = True
        with self._lane_locks[0], self._lane_locks[1]:
            f = self._live_file()
            if f.index_range != (0, self.total_records):
                return   # a shard's partial index: its in-order epoch
            self.window_stats['leaves_held'] = f.keep_leaves(_LEAVES_HELD)

    def _index_all(self, least, most):
        """A partial index (_part_wanted) widened to the whole tree when
        read() asks for ordinals least..most past it."""
        f = self._live_file()
        if f.index_pending:
            self._finish_index()
            return
        try:
            lo, end = f.index_range
            if lo <= least and most < end:
                return
        except RuntimeError:   # (another thread replaces it, or closed)
            pass
        with self._lane_locks[0], self._lane_locks[1]:
            f = self._live_file()
            lo, end = f.index_range
            if lo <= least and most < end:
                return
            f.build_index()
            self._leaves_tried = False   # (a new index holds none)
            index = f.index_arrays() + (f.index_recmap(),)
        index_cache, data = self._index_cache
        if index_cache is not False and index_cache is not None:
            _save_index(*self._cache_file(index_cache, data), *index)

    # -- sizes ----------------------------------------------------------
    def _ordinals(self):
        if self._order is None or self._order[0] != self.epoch:
            self._order = (self.epoch, shard_order(
                self.total_records, self.rank, self.world_size, self.shuffle,
                self.seed, self.epoch, self.drop_last, self.batch_size))
        return self._order[1]

    def _span(self, rank=None):
        """(first position, records) of this rank's (or `rank`'s) share of
        the order: the sharding rule (shard_order) without materialising the
        order."""
        n, p = self.total_records, self.world_size
        r = self.rank if rank is None else rank
        if n == 0:
            return 0, 0
        if self.drop_last:
            per = n // p
            return r * per, (per // self.batch_size) * self.batch_size
        per = -(-n // p)
        return r * per, per

    def _window_ordinals(self, start, stop, rank=None, order=None):
        """Ordinals at positions [start, stop) of this rank's (or `rank`'s)
        share in the current epoch, or in the permutation `order` an epoch
        began with (_epoch_order)."""
        first, _ = self._span(rank)
        pos = np.arange(first + start, first + stop, dtype=np.int64)
        if not self.drop_last and first + stop > self.total_records:
            pos %= self.total_records  # the last ranks wrap to pad
        if not self.shuffle:
            return pos
        return (self._epoch_order() if order is None else order)[pos]

    def _epoch_order(self):
        """The current epoch's permutation of the records (drawn once per
        epoch), or None in key order.  An epoch keeps the one it began
        with, though set_epoch() be called meanwhile."""
        if not self.shuffle:
            return None
        if self._perm is None or self._perm[0] != self.epoch:
            self._perm = (self.epoch, np.random.default_rng(
                [self.seed, self.epoch]).permutation(self.total_records))
        return self._perm[1]

    @property
    def num_records(self):
        return self._span()[1]

    def __len__(self):
        return -(-self.num_records // self.batch_size)

    def set_epoch(self, epoch):
        """Select epoch ``epoch``'s shuffle for the next iteration (the
        same epoch again keeps a position restored by
        :meth:`load_state_dict`)."""
        epoch = int(epoch)
        if epoch != self.epoch:
            self._start = self._received = 0
            self._epoch_count += 1
        self.epoch = epoch

    # -- resuming and pickling ------------------------------------------
    def state_dict(self):
        """Where this Reader is: a small JSON-serialisable dict of the
        epoch, the batches received this epoch (not those the prefetcher
        read ahead) and what defines the order.  A Reader built with the
        same arguments resumes there with :meth:`load_state_dict`."""
        if self._coll is not None:
            raise TypeError('state_dict() is not available under comm= yet')
        seed = self.seed
        if isinstance(seed, np.integer):
            seed = int(seed)
        return {'version': _STATE_VERSION, 'epoch': int(self.epoch),
                'batches': int(self._received), 'seed': seed,
                'shuffle': self.shuffle, 'rank': self.rank,
                'world_size': self.world_size, 'drop_last': self.drop_last,
                'batch_size': self.batch_size,
                'total_records': int(self.total_records),
                'records': [int(n) for n in self._records],
                'txnids': list(self._txnids)}

    def load_state_dict(self, state):
        """Resume at ``state`` (from :meth:`state_dict`): the next
        iteration yields the rest of that epoch, batch for batch.  A state
        of another order (record count, sharding, batch size, seed,
        snapshot...) raises ValueError naming the field."""
        if self._coll is not None:
            raise TypeError('load_state_dict() is not available under comm= '
                            'yet')
        epoch, batches = check_state(state, self.state_dict(), 'Reader',
                                     ('epoch', 'batches'))
        if not 0 <= batches <= len(self):
            raise ValueError('state field "batches" is %d: this Reader has '
                             '%d batches per epoch' % (batches, len(self)))
        self.epoch = epoch
        self._start = self._received = batches
        self._epoch_count += 1

    def __reduce__(self):
        # The path(s), the arguments and the position travel; open files,
        # threads and buffers do not: the copy reopens.
        if self._comm is not None:
            raise TypeError('a Reader under MPI (comm=, engine="mpiio", '
                            'node_local) cannot be pickled: a communicator '
                            'does not travel; open a Reader in each process')
        return (_reopen, (Reader, self.paths if self._parts is not None
                          else self.path, self._args, self.state_dict()))

    # -- reading --------------------------------------------------------
    def _live_file(self):
        """The open file (a BulkFile, or _Parts), or lmdbio.Error when the
        Reader was closed (another thread may close it while one reads)."""
        f = self._file
        if f is None:
            raise Error('%s: the Reader is closed' % self.path)
        return f

    def _read(self, ordinals, independent=True):
        """One batch.  independent: this rank alone (pread); else a
        collective step of every rank (MPI-IO, node sharing, staggering)."""
        self._live_file()
        ordinals = np.array(ordinals, dtype=np.int64)  # the Batch's own

        def read(f, newest):
            if self._parts is not None:
                return f.read(ordinals, self.keys_wanted,
                              independent=True), None
            got = f.read_window(ordinals, (len(ordinals),), self.keys_wanted,
                                independent=True, newest=newest)
            return got[0][0], (got[2] if newest else None)

        kdata, koff, vdata, voff = self._checked_read(read)
        keys = Ragged(kdata, koff) if kdata is not None else None
        return Batch(ordinals, keys, Ragged(vdata, voff))

    def _checked_read(self, read):
        """read(file, newest) -> (what it read, the newest txnid read after
        it when `newest`, else None), under lane 0's lock.  A damaged page
        met without a reader slot while a writer committed past the
        snapshot raises SnapshotChangedError; lock=False checks the
        snapshot after the read (with the txnid read in the same step,
        without the GIL)."""
        check = self._env is None and self._coll is None
        with self._io_lock:
            try:
                result, newest = read(self._live_file(), check)
            except (CorruptedError, PageNotFoundError) as e:
                raise self._snapshot_changed(e) from e
            if check:
                self._check_snapshot(newest)
        return result

    def _check_snapshot(self, newest=None):
        """lock=False: after each batch, the newest txnid must be at most
        one past the snapshot.  A writer reuses the pages of a snapshot only
        from the second transaction after it on, so a batch read before that
        came from intact pages; otherwise SnapshotChangedError, never a
        batch that may mix two snapshots.  `newest`: the txnid read after
        the batch (else read here)."""
        if self._parts is not None:
            return  # each environment was checked by its own Reader
        f = self._live_file()
        snap = f.txnid
        if newest is None:
            newest = f.newest_txnid()
        if newest >= snap + 2:
            exc = SnapshotChangedError(
                '%s: snapshot txn %d was read without a reader slot '
                '(lock=False) while a writer committed up to txn %d: its '
                'pages may have been reused under this batch; use lock=True '
                'next to a live writer, or open a new Reader'
                % (self.path, snap, newest))
            exc.txnid, exc.newest = snap, newest
            raise exc

    def _snapshot_changed(self, exc):
        """Without a reader slot (lock=False) a damaged page met after a
        writer committed past the snapshot is most likely a page the writer
        reused: SnapshotChangedError says so (else exc itself)."""
        if self._env is not None or self._file is None or \
                self._parts is not None:
            return exc
        snap = self._file.txnid
        newest = self._file.newest_txnid()
        if newest <= snap:
            return exc
        new = SnapshotChangedError(
            '%s: snapshot txn %d was read without a reader slot (lock=False) '
            'while a writer committed up to txn %d, so its pages may have '
            'been reused; the damage found: %s' % (self.path, snap, newest,
                                                   exc))
        new.txnid, new.newest = snap, newest
        return new

    # -- reading under MPI (comm=) ---------------------------------------
    def _read_in_turns(self, ordinals, ends, collective):
        """This reader's window, its io_group taking its turn: collective
        MPI-IO (one Read_all per phase over the group) or this process's
        own concurrent preads; returns (per-part arrays, leaf bytes,
        exception)."""
        from lmdbio.mpi import barrier
        result, exc = (None, 0), None
        for turn in range(self._io_groups):
            if turn == self._my_turn:
                try:
                    result = self._file.read_window(
                        ordinals, ends, self.keys_wanted,
                        agree=self._group.agree if collective else None,
                        independent=not collective)
                except Exception as e:
                    exc = e
            if self._io_groups > 1:
                barrier(self._readers.comm)
        return result[0], result[1], exc

    def _window_mode(self, ordinals):
        """Collective: how to read the coming window.  Dense windows (an
        ordered epoch: leaves next to each other) take MPI-IO's two-phase
        collective reads with engine="mpiio"; sparse ones (a shuffled epoch:
        a few records per leaf, leaves spread over the file), or any window
        with engine="posix", independent preads with many in flight (a
        collective read of scattered extents would read the gaps between
        them).  Density: the share of the touched leaves' records the
        window wants (of the first and last leaf: what it wants of them),
        the smallest over the ranks (engine="mpiio"; the ranks then agree
        on it).  Returns (collective, density)."""
        density = 1.0
        if ordinals is not None and len(ordinals):
            # the share of the touched leaves' records that the window wants
            first = self._leaf_first
            if first is None:
                first = self._leaf_first = \
                    self._file.index_arrays()[1].astype(np.int64)
            # (the first and last leaves count only what is wanted of them:
            # a window of an ordered epoch starts and ends mid-leaf)
            leaf, wanted = np.unique(np.searchsorted(first, ordinals,
                                                     'right') - 1,
                                     return_counts=True)
            held = first[leaf + 1] - first[leaf]
            held[0], held[-1] = wanted[0], wanted[-1]
            density = min(1.0, len(ordinals) / float(max(held.sum(), 1)))
        if self.engine != 'mpiio':
            return False, density  # (this rank's, for the debug line)
        # (as an int: Collective.reduce agrees on int64s)
        density = self._coll.reduce(int(density * 1e6), 'MIN') / 1e6
        return density >= 0.5, density

    def _collective_step(self, start, stop, order):
        """The batches at positions [start, stop) of every rank's share, as
        one collective window: the ranks agree how to read it, read it (one
        collective read per phase, or independent reads), agree on the
        outcome, then cut batches locally.  With node_local the node's
        leader reads every local rank's records and shares them through the
        node's shared memory.  Returns (batches, bytes this reader read per
        batch)."""
        bs = self.batch_size
        share = self._share
        mine = self._window_ordinals(start, stop, order=order)
        nrec = stop - start
        if share is None:
            ordinals = mine
            ends = np.arange(bs, nrec + bs, bs, dtype=np.intp)
            ends[-1] = nrec
        elif share.is_leader:
            # the node's window: each local rank's records, one part each
            parts = [mine if g == self.rank else
                     self._window_ordinals(start, stop, g, order)
                     for g in share.members]
            ordinals = np.concatenate(parts)
            ends = np.cumsum([len(p) for p in parts]).astype(np.intp)
        else:
            ordinals = ends = None
        collective, density = self._window_mode(ordinals)
        st = self.mpi_stats
        st['windows'] += 1
        st['collective' if collective else 'independent'] += 1
        _log.debug('rank %d: window of %d records at %d: %s (leaf density '
                   '%.3f)', self.rank, nrec, start,
                   'collective MPI-IO' if collective else 'independent reads',
                   density)
        arrays, leaf_bytes, exc = [], 0, None
        if ordinals is not None:
            arrays, leaf_bytes, exc = self._read_in_turns(ordinals, ends,
                                                          collective)
        self._coll.agree(exc)
        size = leaf_bytes + sum(
            len(a[2]) + (len(a[0]) if a[0] is not None else 0)
            for a in arrays)
        if share is not None:
            parts = None
            if share.is_leader:
                parts = arrays
            arrays = _split(share.exchange(parts),
                            [min(bs, nrec - s) for s in range(0, nrec, bs)])
        out, s = [], 0
        for kdata, koff, vdata, voff in arrays:
            n = len(voff) - 1
            keys = Ragged(kdata, koff) if kdata is not None else None
            out.append(Batch(mine[s:s + n], keys, Ragged(vdata, voff)))
            s += n
        return out, size * bs // max(nrec, 1)

    def _iter_agreed(self, total):
        """Under MPI with independent reads (engine="posix", no node
        sharing, no staggering): the batches come from the prefetching
        windows of the single-process path (no MPI call in its threads),
        and the ranks agree on the outcome once per chunk of batches, in the
        consumer's thread.  Chunk sizes follow from inputs every rank shares
        (1, 2, 4, ... batches, at most what half of prefetch_bytes holds at
        the file's bytes per record), so the ranks stay in step.  When any
        rank failed within a chunk, every rank yields the batches before
        the first failed one and raises."""
        bs = self.batch_size
        nbatches = -(-total // bs)
        per_record = self._file.last_pg * self._file.psize / max(
            self.total_records, 1)
        if self.shuffle:  # a leaf read for about every record
            per_record += self._file.psize
        most = max(1, int(self.prefetch_bytes // 2 // (bs * per_record)))
        batches = self._iter_windows(total)
        pos, chunk, exc = 0, 1, None
        try:
            while pos < nbatches:
                n = min(chunk, nbatches - pos)
                got = []
                if exc is None:
                    try:
                        for _ in range(n):
                            got.append(next(batches))
                    except StopIteration:
                        exc = Error('%s: the epoch ended early' % self.path)
                    except Exception as e:
                        exc = e
                first = self._coll.first_failure(exc, pos + len(got))
                if first is not None:
                    yield from got[:first - pos]
                    self._coll.agree(exc)  # raises on every rank
                self.mpi_stats['windows'] += 1
                self.mpi_stats['independent'] += 1
                yield from got
                pos += n
                chunk = min(2 * chunk, most)
        finally:
            batches.close()

    def _iter_collective(self, total):
        """Under MPI: windows of batches, each one collective step taken in
        order on every rank (every rank has the same number of batches, and
        the window sizes follow from values agreed by all, so the ranks stay
        in step).  A window is at most half of prefetch_bytes on its reader
        (a node's leader reads the node's window); the first is one batch,
        so that the first batch comes quickly, and each is at most twice the
        last.  A damaged window is read again batch by batch, so that every
        batch before the damaged one is delivered."""
        bs = self.batch_size
        budget = max(1, self.prefetch_bytes // 2)
        order = self._epoch_order()
        pos, nbatch = 0, 1
        while pos < total:
            stop = min(total, pos + nbatch * bs)
            try:
                batches, per_batch = self._collective_step(pos, stop, order)
            except Error:
                if stop - pos <= bs:
                    raise
                for s in range(pos, stop, bs):  # every rank does the same
                    yield from self._collective_step(
                        s, min(stop, s + bs), order)[0]
                pos = stop
                continue
            per_batch = max(1, self._coll.reduce(int(per_batch), 'MAX'))
            nbatch = max(1, min(2 * nbatch, budget // per_batch))
            pos = stop
            for b in batches:
                if self._file is None:  # closed while iterating
                    raise Error('%s: the Reader was closed' % self.path)
                yield b

    def read(self, indices):
        """A :class:`Batch` of the records at the ordinals ``indices``, in
        that order (random access; independent of the epoch and shard, and
        not collective even under MPI)."""
        indices = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if len(indices):
            least, most = ordinal_bounds(indices)
            if least < 0 or most >= self.total_records:
                raise IndexError('record ordinal out of range (%d records)'
                                 % self.total_records)
            if self._file is not None and self._parts is None and \
                    self._coll is None:
                self._index_all(least, most)
            self._random_access()   # once: a no-op after the first
        return self._read(indices)

    def _record(self, ordinal):
        """Record `ordinal` as (key, value) bytes (key None without keys):
        what read([ordinal]) holds, without a Batch's arrays, whose making
        cost a map-style dataset's item about 20 us of its 33.  Several
        environments and MPI go through read()."""
        ordinal = int(ordinal)
        if not 0 <= ordinal < self.total_records:
            raise IndexError('record ordinal out of range (%d records)'
                             % self.total_records)
        if self._parts is not None or self._coll is not None:
            b = self.read([ordinal])
            return (b.keys[0] if b.keys is not None else None), b.values[0]
        self._index_all(ordinal, ordinal)
        self._random_access()

        def read(f, newest):
            key, value, txnid = f.read_record(ordinal, self.keys_wanted,
                                              newest)
            return (key, value), (txnid if newest else None)

        return self._checked_read(read)

    def __iter__(self):
        if self._file is None:
            raise Error('%s: the Reader is closed' % self.path)
        total = self.num_records
        if not total:
            return
        if self._coll is not None:
            # Under MPI the ranks agree every few batches, in order on every
            # rank; leaving an epoch early is collective too.
            if self.engine == 'posix' and self._share is None and \
                    self._io_groups == 1:
                yield from self._iter_agreed(total)
            else:
                yield from self._iter_collective(total)
            return
        start, self._start = self._start, 0
        self._received = start
        if start * self.batch_size >= total:
            return
        if self.shuffle:
            self._random_access()
        epoch = self._epoch_count
        batches = self._iter_windows(total, start * self.batch_size)
        try:
            for b in batches:
                if self._epoch_count == epoch:   # (else set_epoch() came:
                    self._received += 1          # the next epoch's count)
                yield b
        finally:
            batches.close()
        self._save_if_whole()

    def _window_batches(self, ordinals, lane=0, advise=None):
        """The batches of one window, read together (leaves once each,
        overflow values in one plan) by batch reader `lane`: (batches,
        leaf bytes read), or (None, 0) when the window failed and must be
        read batch by batch (so that every batch before a damaged one is
        delivered intact).  `advise`: ordinals of windows to come, whose
        regions the storage is asked for first."""
        bs = self.batch_size
        ends = np.arange(bs, len(ordinals) + bs, bs, dtype=np.intp)
        ends[-1] = len(ordinals)
        check = self._env is None and self._coll is None and \
            self._parts is None
        try:
            with self._lane_locks[lane]:
                if self._file is None:
                    raise Error('%s: the Reader was closed' % self.path)
                try:
                    got = self._file.read_window(
                        ordinals, ends, self.keys_wanted, independent=True,
                        lane=lane, advise=advise, newest=check)
                except (CorruptedError, PageNotFoundError) as e:
                    raise self._snapshot_changed(e) from e
                parts, leaf_bytes = got[0], got[1]
                if check:
                    self._check_snapshot(got[2])
        except Error:
            if len(ends) == 1:
                raise
            return None, 0
        out, start = [], 0
        for (kdata, koff, vdata, voff), end in zip(parts, ends):
            keys = Ragged(kdata, koff) if kdata is not None else None
            out.append(Batch(ordinals[start:end], keys, Ragged(vdata, voff)))
            start = end
        return out, leaf_bytes

    def _new_pass(self):
        """Before an epoch: regions may be read ahead again.  Where this
        rank will need a good part of the file's leaves this epoch (the
        whole epoch, or a shard with several records per leaf), every region
        it touches is read whole on first touch (later windows find the
        rest cached); otherwise only regions a window needs densely."""
        files = [r._file for r in self._parts] \
            if self._parts is not None else [self._file]
        share = self.num_records / max(1, self.total_records)
        region = self._policy[2]
        with self._lane_locks[0], self._lane_locks[1]:
            if self._file is None:
                return   # closed (under both locks) meanwhile
            for f in files:
                if f is None:
                    continue
                lo, end = f.index_range   # (a partial index: its leaves)
                per_leaf = (end - lo) / max(1, f.num_leaves)
                if f.index_pending:   # (counted so far: a few, or none)
                    per_leaf = f.entries / max(1, f.tree_leaves)
                need = 1 - (1 - min(share, 1.0)) ** per_leaf
                f.set_cache(region, 1 if need >= 1 / 16 else 16,
                            self.cache == 'drop')

    def _iter_windows(self, total, first_pos=0):
        """Batches of this rank's share, read a window at a time by two
        prefetch threads (lanes): while one reads its window the other
        copies records out of its own, so both cores work.  A window is as
        many batches as fit in a quarter of prefetch_bytes (two being read,
        one consumed, one waiting) and a few MiB (_window_budget); the first is one
        batch, so that the first batch comes quickly, and each is at most
        twice the last.  Windows bigger than that (batches of big values)
        are read at most one per lane ahead of the consumer.  The lanes are
        the C window pipeline's (lio_pipeline: no GIL, and a begun index
        counted in order as the windows read, in the pipeline); Python
        threads read for several environments (_Parts) and for a second
        epoch begun while another runs on the same file."""
        bs = self.batch_size
        lanes = len(self._lane_locks)
        order = self._epoch_order()
        self._new_pass()
        budget = _window_budget(self.prefetch_bytes, self.shuffle, lanes)
        self.window_stats['window_budget'] = budget
        cond = threading.Condition(threading.RLock())
        stop = threading.Event()
        st = {'pos': first_pos, 'nbatch': 1, 'seq': 0, 'taken': 0, 'done': {},
              'running': lanes, 'ahead': lanes, 'advised': first_pos}

        def claim(advising=True):
            """(seq, start, records, advise from, advise to) of the next
            window, or None.  Each window advises the storage of the
            positions up to two windows past it not advised yet (by either
            lane): every position once, not once per lane.  A claimer not
            advising leaves the positions past its window to the next."""
            with cond:
                while not stop.is_set() and st['pos'] < total and \
                        st['seq'] - st['taken'] > st['ahead']:
                    cond.wait(0.1)
                if stop.is_set() or st['pos'] >= total:
                    return None
                nrec = min(total - st['pos'], st['nbatch'] * bs)
                start = st['pos']
                lo = max(st['advised'], start + nrec)
                hi = min(total, start + 3 * nrec) if advising else lo
                st['advised'] = max(st['advised'], hi)
                claimed = st['seq'], start, nrec, lo, hi
                st['seq'] += 1
                st['pos'] += nrec
                ws = self.window_stats
                ws['max_ahead'] = max(ws['max_ahead'], st['seq'] - st['taken'])
                return claimed

        def deliver(seq, batches, exc):
            with cond:
                st['done'][seq] = (batches, exc)
                cond.notify_all()

        def grow(batches, leaf_bytes, nrec):
            """Size the next windows from what this one cost (as the
            pipeline's lanes do)."""
            size = leaf_bytes + sum(
                len(b.values.data) + (len(b.keys.data) if b.keys is not None
                                      else 0) for b in batches)
            per_batch = max(1, size * bs // nrec)
            with cond:
                st['nbatch'] = max(1, min(2 * st['nbatch'],
                                          budget // per_batch))
                # Windows read ahead of the consumer's: as many as
                # prefetch_bytes holds, one per lane at least (both cores
                # work), one more at most.  Batches of tens of MiB would
                # otherwise keep four windows of fresh memory alive.
                fits = self.prefetch_bytes // (st['nbatch'] * per_batch)
                st['ahead'] = max(lanes, min(lanes + 1, fits)) - 1
                ws = self.window_stats
                ws['windows'] += 1
                ws['max_bytes'] = max(ws['max_bytes'], size)
                ws['max_batches'] = max(ws['max_batches'], len(batches))

        def produce(lane):
            try:
                while True:
                    claimed = claim()
                    if claimed is None:
                        return
                    seq, start, nrec, adv_lo, adv_hi = claimed
                    batches = None
                    try:
                        # Read-ahead: the storage fetches the next windows'
                        # regions while this one is read.
                        advice = self._window_ordinals(
                            adv_lo, adv_hi, order=order) \
                            if adv_hi > adv_lo else None
                        ordinals = self._window_ordinals(start, start + nrec,
                                                         order=order)
                        batches, leaf_bytes = self._window_batches(
                            ordinals, lane, advice)
                        if batches is None:  # damaged: batch by batch
                            batches = []
                            for s in range(0, nrec, bs):
                                batches.append(self._read(ordinals[s:s + bs]))
                        else:
                            grow(batches, leaf_bytes, nrec)
                    except BaseException as e:  # raised in the consumer
                        deliver(seq, batches or [], e)
                        return
                    deliver(seq, batches, None)
            finally:
                with cond:
                    st['running'] -= 1
                    cond.notify_all()

        # The first window (one batch) is read here and handed out before
        # any thread starts: a Reader opened for one batch (a map-style
        # dataset, a shard's first batch) starts no thread.
        counting = self._parts is None and self._live_file().index_pending
        seq, start, nrec, _, _ = claim(advising=False)   # (the lanes do)
        first, leaf_bytes = self._window_batches(
            self._window_ordinals(start, start + nrec, order=order))
        if counting:   # what the pipeline's windows 0 and 1 expect to count
            f = self._live_file()
            basis = ((0, 0), (f.num_leaves, f.index_range[1]))
        grow(first, leaf_bytes, nrec)
        st['taken'] = 1
        for b in first:
            if self._file is None:  # closed while iterating
                raise Error('%s: the Reader was closed' % self.path)
            yield b
        if st['pos'] >= total:
            return
        if self._parts is None:
            # The lanes are C threads that never take the GIL, counting a
            # begun index in order as they read; this thread only wraps
            # their windows.
            pipe = self._start_pipeline(order, st['pos'], total, budget,
                                        st['nbatch'], st['ahead'],
                                        st['advised'],
                                        basis if counting else None)
            if pipe is not None:
                yield from self._iter_pipelines(pipe, order, total, budget,
                                                st['nbatch'], st['ahead'])
                return
        threads = []
        for lane in range(lanes):
            t = threading.Thread(target=produce, args=(lane,),
                                 name='lmdbio-prefetch', daemon=True)
            threads.append(t)
        worker = (threads, stop, (cond,))
        self._workers.append(worker)
        pid = os.getpid()
        for t in threads:
            t.start()
        try:
            seq = 1
            while True:
                with cond:
                    while seq not in st['done']:
                        if self._file is None:
                            raise Error('%s: the Reader was closed'
                                        % self.path)
                        if os.getpid() != pid:
                            raise forked_error(self.path)
                        if st['running'] == 0 and seq not in st['done']:
                            if stop.is_set():   # close() stopped them
                                raise Error('%s: the Reader was closed'
                                            % self.path)
                            return  # every window delivered
                        cond.wait(0.1)
                    batches, exc = st['done'].pop(seq)
                    st['taken'] = seq + 1
                    cond.notify_all()
                for b in batches:
                    if self._file is None:  # closed while iterating
                        raise Error('%s: the Reader was closed' % self.path)
                    yield b
                if exc is not None:
                    raise exc
                seq += 1
        finally:
            _stop_worker(worker)
            if worker in self._workers:
                self._workers.remove(worker)
            if self.cache == 'drop' and self._file is not None:
                self._new_pass()  # drops what the last windows read

    def _start_pipeline(self, order, start, total, budget, nbatch, ahead,
                        advised, basis):
        """A window pipeline reading positions [start, total) of this
        rank's share in `order`, or None where one cannot run
        (BulkFile.start_pipeline).  Under the lane locks: an index being
        replaced (read() past a partial one) is replaced first."""
        with self._lane_locks[0], self._lane_locks[1]:
            return self._live_file().start_pipeline(
                order, self.total_records, self._span()[0], start, total,
                self.batch_size, budget, self.prefetch_bytes, nbatch, ahead,
                self.keys_wanted, self._env is None, advised, basis)

    def _iter_pipelines(self, pipe, order, total, budget, nbatch, ahead):
        """The batches of positions from where `pipe` starts to `total`.
        A pipeline stopped short (the index changed under it: read() past
        a partial index, a record map or leaves loaded) is followed by
        another from where it stopped, or by batches read one at a time
        where none can start; closing the Reader ends the epoch with
        lmdbio.Error.  An epoch never ends short without an error."""
        bs = self.batch_size
        try:
            while True:
                pos = yield from self._iter_pipeline(pipe, order)
                if pos >= total:
                    return
                f = self._live_file()   # (closed: Error)
                basis = None
                if f.index_pending:   # counted so far, by windows before
                    basis = ((f.num_leaves, f.index_range[1]),) * 2
                pipe = self._start_pipeline(order, pos, total, budget, nbatch,
                                            ahead, pos, basis)
                if pipe is None:
                    for s in range(pos, total, bs):
                        yield self._read(self._window_ordinals(
                            s, min(s + bs, total), order=order))
                    return
        finally:
            if self.cache == 'drop' and self._file is not None:
                self._new_pass()  # drops what the last windows read

    def _iter_pipeline(self, pipe, order):
        """The batches of the windows a running pipeline reads, in order;
        returns the position after the last window it handed out.  A
        window that failed is read again batch by batch here, so that
        every batch before a damaged one is delivered and the damage is
        raised at the batch that needs it."""
        bs = self.batch_size
        ws = self.window_stats
        base = ws['windows'], ws['pipeline_windows']

        def note():
            """window_stats with the pipeline's counts so far."""
            counts = pipe.stats()
            if counts is not None:
                ws['windows'] = base[0] + counts[0]
                ws['pipeline_windows'] = base[1] + counts[0]
                ws['max_bytes'] = max(ws['max_bytes'], counts[1])
                ws['max_batches'] = max(ws['max_batches'], counts[2])
                ws['max_ahead'] = max(ws['max_ahead'], counts[3])

        self._workers.append(pipe)
        try:
            while True:
                note()
                got = pipe.next()
                if self._file is None:
                    raise Error('%s: the Reader was closed' % self.path)
                if got is None:
                    return pipe.resume_at   # the end, or stopped there
                start, n, batches, newest = got
                got = None
                if batches is None:
                    ordinals = self._window_ordinals(start, start + n,
                                                     order=order)
                    for s in range(0, n, bs):
                        yield self._read(ordinals[s:s + bs])
                        if not s:
                            pipe.release()
                    continue
                if self._env is None:
                    self._check_snapshot(newest)
                if self._unsaved_index is not None:
                    # whole: saved here, while the lanes read on, not after
                    # the epoch's last batch
                    self._save_if_whole()
                for j, (ords, kdata, koff, vdata, voff) in enumerate(batches):
                    if self._file is None:  # closed while iterating
                        raise Error('%s: the Reader was closed' % self.path)
                    yield Batch(ords, Ragged(kdata, koff)
                                if kdata is not None else None,
                                Ragged(vdata, voff))
                    if not j:
                        # Back for a second batch: the caller let go of
                        # the batches before this window (a loop's
                        # variable moved on), so their block can be reused
                        # by the window the lanes read next.
                        pipe.release()
                ords = kdata = koff = vdata = voff = batches = None
        finally:
            note()
            _stop_worker(pipe)
            if pipe in self._workers:
                self._workers.remove(pipe)

    # -- statistics and lifetime ----------------------------------------
    def io_stats(self):
        """(read requests, bytes) that this reader's plans asked of the
        storage, each request as planned, the holes it bridges included.
        From the OS cache a request may take several calls and skip its
        holes of 8 KiB or more, so the process's own counters
        (/proc/self/io) can show more calls and fewer bytes."""
        return self._file.stats() if self._file is not None else (0, 0)

    def close(self):
        """Stop the prefetch thread and free the buffers.  Under MPI this is
        collective (it frees lmdbio's communicators and the MPI file)."""
        closing = self.__dict__.get('_closing')
        if closing is None:
            return   # (__init__ failed before it opened anything)
        with closing:
            self._close()

    def _close(self):
        for worker in list(self._workers):
            _stop_worker(worker)
        self._workers = []
        if self._file is not None:
            self._save_if_whole()   # an epoch left after its last window
            with self._lane_locks[0], self._lane_locks[1]:
                self._file.close()
                self._file = None
        for part in getattr(self, '_parts', None) or []:
            part.close()
        if self._mpifile is not None:
            self._mpifile.close()
            self._mpifile = None
        if self._share is not None:
            self._share.close()
            self._share = None
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        if self._env is not None:
            self._env.close()
            self._env = None
        for c in reversed(getattr(self, '_owned', [])):
            c.Free()
        self._owned = []
        self._group = self._readers = None
        self._comm = self._coll = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
