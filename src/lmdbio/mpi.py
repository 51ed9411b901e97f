"""MPI for the bulk path: the MPI-IO executor, agreement between ranks, the
cooperative record index, one reader per node and staggered reading.

Everything here is collective over lmdbio's own duplicate of the user's
communicator, so lmdbio's traffic never interleaves with the user's.  Every
rank has the same number of batches (the sharding rule guarantees it) and
reads them a window of batches at a time; window sizes follow from values
every rank agrees on, so the ranks stay in step.  A window is two steps
(leaves, then overflow values), each one collective read (a dense window)
or this rank's own concurrent reads (a sparse one), and after each step the
ranks agree on the outcome: a corrupt page or a failed read on one rank
raises the same exception, naming that rank, on every rank.
"""

import time

import numpy as np

from lmdbio.errors import MDB_CORRUPTED, Error, make_error

__all__ = ['MPIFile', 'Collective', 'NodeShare']

_NONE = np.iinfo(np.int64).max  # "no rank failed" in first_failure


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - mpi4py is a dependency
        raise Error('comm= needs mpi4py (pip install mpi4py mpich): %s' % e)
    return MPI


class MPIFile:
    """The MPI-IO executor: each planned step is one collective read.

    The file is opened with ``MPI.File.Open`` on the communicator; a step's
    extents (sorted, disjoint) become an hindexed file view, read with one
    ``Read_all`` so ROMIO's two-phase I/O can aggregate across ranks.  A rank
    with nothing to read still joins with an empty view."""

    def __init__(self, comm, path, hints=None):
        MPI = _mpi()
        self.MPI = MPI
        self.path = path
        info = MPI.Info.Create()
        for k, v in (hints or {}).items():
            info.Set(str(k), str(v))
        try:
            self.fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY, info)
        finally:
            info.Free()
        self.requests = 0
        self.bytes = 0

    def read_extents(self, offsets, lengths, out):
        MPI = self.MPI
        total = int(lengths.sum()) if len(lengths) else 0
        status = MPI.Status()
        if total == 0:
            self.fh.Set_view(0, MPI.BYTE, MPI.BYTE)
            self.fh.Read_all([out, 0, MPI.BYTE], status)
            return
        ftype = MPI.BYTE.Create_hindexed(lengths.tolist(), offsets.tolist())
        ftype.Commit()
        try:
            self.fh.Set_view(0, MPI.BYTE, ftype)
            self.fh.Read_all([out, total, MPI.BYTE], status)
        finally:
            ftype.Free()
        got = status.Get_count(MPI.BYTE)
        self.requests += 1
        self.bytes += got
        if got != total:
            raise Error('%s: MPI-IO read %d of %d bytes (the file ends early)'
                        % (self.path, got, total))

    def close(self):
        if self.fh is not None:
            self.fh.Close()
            self.fh = None


def _wait(req):
    """Wait for a non-blocking MPI request with short sleeps (a polling
    wait would take the core of the rank being waited for when ranks
    outnumber cores)."""
    pause = 2e-5
    while not req.Test():
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def barrier(comm):
    """comm.Barrier(), waited on sleeping."""
    _wait(comm.Ibarrier())


class Collective:
    """Agreement helpers over lmdbio's communicator."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()

    def agree(self, exc):
        """Collective: raise on every rank if any rank failed (the first
        failing rank's exception, named), else return."""
        if isinstance(exc, BaseException) and not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt and friends are not agreed on
        if self.first_failure(exc, 0) is None:
            return None
        mine = None
        if exc is not None:
            mine = (type(exc).__name__, getattr(exc, 'code', None) or MDB_CORRUPTED,
                    str(exc))
        everyone = self.comm.allgather(mine)
        for r, failed in enumerate(everyone):
            if failed is None:
                continue
            if r == self.rank and isinstance(exc, Error):
                raise exc
            name, code, msg = failed
            raise make_error('rank %d: %s' % (r, msg), code) from exc
        return None

    def first_failure(self, exc, where):
        """Collective: the smallest `where` (an int >= 0) of the ranks whose
        exc is not None, or None when no rank failed."""
        got = self.reduce(where if exc is not None else _NONE, 'MIN')
        return None if got == _NONE else got

    def reduce(self, value, op):
        """Collective: MIN or MAX of every rank's int64.  A rank that
        arrives early waits sleeping, not polling: with more ranks than
        cores a polling wait takes the core from the rank it waits for
        (MPICH's own waits poll; see the README on oversubscribing)."""
        MPI = _mpi()
        send = np.array([value], dtype=np.int64)
        recv = np.empty(1, dtype=np.int64)
        _wait(self.comm.Iallreduce(send, recv, op=getattr(MPI, op)))
        return int(recv[0])

    def run(self, fn, *args):
        """fn(*args) on every rank, agreeing on failure; returns its result."""
        try:
            result, exc = fn(*args), None
        except Exception as e:
            result, exc = None, e
        self.agree(exc)
        return result

    def bcast(self, obj, root=0):
        return self.comm.bcast(obj, root=root)




def pin_snapshot(coll, bulk, txn_source=None):
    """Every rank takes the same snapshot: rank 0's newest, broadcast (lock
    off), or the transaction every rank's reader slot pins (lock on; retried
    until the slots agree).  Returns the txnid."""
    for _ in range(100):
        if txn_source is None:
            def newest():
                if coll.rank == 0:
                    bulk.snapshot(0)
                    return bulk.txnid
                return None
            txnid = coll.bcast(coll.run(newest))
            # rank 0 holds it; the others take the meta page that carries it
            ok = coll.run(lambda: coll.rank == 0 or bulk.snapshot(txnid))
        else:
            txnid = txn_source.begin()
            same = len(set(coll.comm.allgather(txnid))) == 1
            ok = same and coll.run(lambda: bulk.snapshot(txnid))
        if all(coll.comm.allgather(bool(ok))):
            return txnid
        if txn_source is not None:
            txn_source.abort()
    raise Error('%s: the ranks could not agree on a snapshot: the writer '
                'keeps moving' % bulk.path)


def cooperative_index(coll, bulk, load_cached, save_cached):
    """The record index, built with each rank counting a share of the leaf
    headers (counts exchanged with Allgatherv), or rank 0's cached copy
    broadcast.  load_cached() -> (leaves, first, record map or None) or None;
    save_cached(l, f) (a cooperative build keeps no record map)."""
    MPI = _mpi()
    cached = coll.bcast(coll.run(
        lambda: load_cached() if coll.rank == 0 else None))
    if cached is not None:
        coll.run(bulk.adopt_index, *cached)
        return True
    leaves = coll.run(bulk.index_leaves)
    n = len(leaves)
    lo = n * coll.rank // coll.size
    hi = n * (coll.rank + 1) // coll.size
    mine = coll.run(bulk.index_count, leaves[lo:hi])
    counts = np.empty(n, dtype=np.uint64)
    sizes = [n * (r + 1) // coll.size - n * r // coll.size
             for r in range(coll.size)]
    displs = [n * r // coll.size for r in range(coll.size)]
    coll.comm.Allgatherv([np.ascontiguousarray(mine), MPI.UINT64_T],
                         [counts, (sizes, displs), MPI.UINT64_T])
    first = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(counts, out=first[1:])
    coll.run(bulk.adopt_index, leaves, first)
    if coll.rank == 0:
        save_cached(leaves, first)
    return False


class NodeShare:
    """One reader per node (LMDBIO's LMM): the node's leader reads every
    local rank's batch into an MPI shared-memory window; each rank gets
    zero-copy views of its own records, valid until it asks for the next
    batch."""

    def __init__(self, comm, node_size=None):
        MPI = _mpi()
        self.MPI = MPI
        rank = comm.Get_rank()
        if node_size:
            self.node = comm.Split(rank // int(node_size), rank)
        else:
            self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        self.local_rank = self.node.Get_rank()
        self.members = self.node.allgather(rank)  # global ranks, in order
        self.is_leader = self.local_rank == 0
        self.leaders = comm.Split(0 if self.is_leader else MPI.UNDEFINED, rank)
        self.win = None
        self.capacity = -1
        self.buf = None

    def _ensure(self, nbytes):
        """Collective over the node: a window of at least nbytes."""
        if nbytes <= self.capacity:
            return
        MPI = self.MPI
        if self.win is not None:
            self.win.Free()
        cap = max(int(nbytes * 1.25), 1 << 20)
        self.win = MPI.Win.Allocate_shared(cap if self.is_leader else 0, 1,
                                           comm=self.node)
        mem, _ = self.win.Shared_query(0)
        self.buf = np.frombuffer(mem, dtype=np.uint8)
        self.capacity = cap

    def exchange(self, parts):
        """Collective over the node.  The leader passes parts: a list, one
        per local rank, of (kdata, koff, vdata, voff); every rank gets its own
        (kdata view or None, koff, vdata view, voff)."""
        if self.is_leader:
            layout, pos = [], 0
            for kd, ko, vd, vo in parts:
                ent = []
                for arr in (kd, vd):
                    if arr is None:
                        ent.append(None)
                        continue
                    pos = (pos + 63) & ~63
                    ent.append((pos, len(arr)))
                    pos += len(arr)
                layout.append((ent, ko, vo))
            header = (pos, layout)
        else:
            header = None
        barrier(self.node)  # everyone is done with the previous batch
        header = self.node.bcast(header, root=0)
        total, layout = header
        self._ensure(total)
        if self.is_leader:
            for (ent, _ko, _vo), (kd, _k, vd, _v) in zip(layout, parts):
                for place, arr in zip(ent, (kd, vd)):
                    if place is not None:
                        self.buf[place[0]:place[0] + place[1]] = arr
        barrier(self.node)
        ent, koff, voff = layout[self.local_rank]
        views = [None if p is None else self.buf[p[0]:p[0] + p[1]]
                 for p in ent]
        return views[0], koff, views[1], voff

    def close(self):
        if self.win is not None:
            self.win.Free()
            self.win = None
        self.buf = None
        for c in (self.node, self.leaders):
            if c is not None and c != self.MPI.COMM_NULL:
                c.Free()
        self.node = self.leaders = None
