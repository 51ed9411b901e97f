#!/usr/bin/env python3
"""A measured model of distributed LMDB reading: requests, bytes and
start-up work per rank, for five readers, validated against the emulated
shared filesystem and projected to thousands of ranks.

    python benches/scale_model.py                 # validate + project + plots
    python benches/scale_model.py --project-only  # projection and plots only
    python benches/scale_model.py --quick         # a shorter validation
    python benches/scale_model.py --layout DIR    # the model of one database

Readers (one epoch, every record read once over all ranks):

  caffe       every rank walks the whole cursor (py-lmdb, mmap) and keeps
              i % P == rank
  dali        every rank steps next() from the first record to its shard
              start (keys only), then reads its contiguous shard
  posix       lmdbio.Reader(rank=, world_size=): planned preads per rank
  mpiio       lmdbio.Reader(comm=): one MPI-IO collective per planned step
  node_local  lmdbio.Reader(comm=, node_local=True): one reader per node

The model is built from the database's real layout, read through lmdbio
(the record index gives leaf page numbers and records per leaf) and a small
parser of the leaf pages read here with os.pread (overflow page numbers and
value sizes).  lmdbio's planner is replayed exactly: the distinct leaves of a
step sorted by page, then the distinct overflow runs, coalesced with a gap
tolerance (max_gap), a maximum request size (max_read) and at most 1024
segments per request, per batch (what the Reader does today) or per window
of batches (prefetch_bytes).  Its counts must equal what the Reader counts
(Reader.io_stats(), the MPI file's counters); tests/test_scale_model.py
checks that.

Readers built on mmap (caffe, dali) are modelled at the page level: the
pages each rank touches, turned into storage requests by the kernel's
read-around (one request per 128 KiB window touched), shared by the ranks
of a node (one page cache per node).

Time is a roofline: the slowest of (a) the latency path, sum over the
rank's synchronous steps of ceil(requests / in flight) x latency, plus the
node's bytes over its bandwidth, (b) the machine's bytes over the shared
bandwidth cap, (c) the machine's requests over the filesystem's request
rate; plus start-up (opening, the record index).  It is a model of I/O,
not of training: compute, decode and the network are left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

PAGEHDRSZ = 16
F_BIGDATA = 0x01
P_BRANCH, P_LEAF = 0x01, 0x02
MAX_SEGS_PER_READ = 1024      # csrc/plan.c (IOV_MAX)
INDEX_CHUNK_HEADERS = 8192    # csrc/index.c: leaf headers per round
INDEX_HEADER_GAP = 4          # csrc/index.c: pages read over between headers
INDEX_CHUNK_BYTES = 8 << 20   # csrc/index.c CHUNK_BYTES: whole pages per round
INDEX_READ_MAX = 1 << 20      # csrc/index.c COUNT_READ_MAX: leaf-level requests
LEAVES_HELD = 128 << 20       # lmdbio.reader._LEAVES_HELD
LOAD_CHUNK = 2048             # csrc/index.c: leaves per round of holding them
EXTEND_ROUND = 8 << 20        # csrc/bulk.c: bytes of leaves a counting round
EXTEND_KEPT = 32 << 20        # csrc/bulk.c: counted leaves kept for a window
GAPS_KEPT_MAX = 16 << 20      # csrc/bulk.c: bridged pages kept, a store
RECMAP_PER_LEAF = 8           # csrc/lmdbio.h LIO_RECMAP_PER_LEAF
NODEHDRSZ = 8
FUSE_MAX_REQUEST = 128 << 10  # libfuse 2: the kernel splits reads to this
READ_AROUND = 128 << 10       # the kernel's mmap read-around window


# --------------------------------------------------------------------------
# the database's layout
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Layout:
    """What the model needs of a database, in key order."""
    name: str
    psize: int
    file_bytes: int
    leaf_pgno: np.ndarray      # uint64[L], leaves in key order
    first: np.ndarray          # uint64[L+1], first ordinal of each leaf
    branch_levels: list        # page numbers per branch level, root first
    ovpg: np.ndarray           # int64[N], first overflow page (0: inline)
    vsize: np.ndarray          # int64[N], value bytes
    ksize: np.ndarray          # int64[N], key bytes
    synthetic: bool = False
    nodeoff: np.ndarray = None  # int64[N], node offset in its leaf

    def has_recmap(self):
        """Whether a whole record index of this (plain) tree keeps the
        record map: at most RECMAP_PER_LEAF records per leaf on average."""
        return 0 < self.n_records <= RECMAP_PER_LEAF * self.n_leaves

    @property
    def n_records(self):
        return int(self.first[-1])

    @functools.cached_property
    def has_overflow(self):
        """Whether any value is on overflow pages (the tree's
        overflow_pages; a GapStore of every step asks)."""
        return bool((self.ovpg > 0).any())

    @property
    def n_leaves(self):
        return len(self.leaf_pgno)

    @property
    def n_branch(self):
        return sum(len(x) for x in self.branch_levels)

    @property
    def depth(self):
        return len(self.branch_levels) + 1

    def ov_pages(self):
        """Pages of each record's overflow run (0 for inline values)."""
        v = self.__dict__.get("_ov_pages")
        if v is None:
            v = self.__dict__["_ov_pages"] = np.where(
                self.ovpg > 0,
                (PAGEHDRSZ + self.vsize + self.psize - 1) // self.psize, 0)
        return v

    def leaf_of(self):
        """The leaf (index position) of every record."""
        counts = np.diff(self.first.astype(np.int64))
        return np.repeat(np.arange(self.n_leaves), counts)

    def summary(self):
        ov = self.ovpg > 0
        return dict(name=self.name, records=self.n_records,
                    leaves=self.n_leaves, branch_pages=self.n_branch,
                    depth=self.depth, psize=self.psize,
                    file_bytes=self.file_bytes,
                    records_per_leaf=self.n_records / max(1, self.n_leaves),
                    overflow_records=int(ov.sum()),
                    mean_value=float(self.vsize.mean()) if self.n_records else 0,
                    key_order_jumps=self.key_order_jumps(),
                    synthetic=self.synthetic)

    def key_order_jumps(self):
        """How scattered key order is: the fraction of consecutive leaves
        (in key order) whose page numbers go backwards."""
        if self.n_leaves < 2:
            return 0.0
        d = np.diff(self.leaf_pgno.astype(np.int64))
        return float((d < 0).mean())


def _branch_children(page, psize):
    """Child page numbers of a branch page, in key order."""
    lower = struct.unpack_from("<H", page, 12)[0]
    n = (lower - PAGEHDRSZ) >> 1
    out = []
    for i in range(n):
        off = struct.unpack_from("<H", page, PAGEHDRSZ + 2 * i)[0]
        lo, hi, fl = struct.unpack_from("<HHH", page, off)
        out.append(lo | (hi << 16) | (fl << 32))
    return out


def _leaf_nodes(page):
    """(ksize, dsize, overflow page or 0, node offset) of each node of a
    leaf page."""
    lower = struct.unpack_from("<H", page, 12)[0]
    n = (lower - PAGEHDRSZ) >> 1
    out = []
    for i in range(n):
        off = struct.unpack_from("<H", page, PAGEHDRSZ + 2 * i)[0]
        lo, hi, fl, ks = struct.unpack_from("<HHHH", page, off)
        ov = 0
        if fl & F_BIGDATA:
            ov = struct.unpack_from("<Q", page, off + 8 + ks)[0]
        out.append((ks, lo | (hi << 16), ov, off))
    return out


def layout_from_file(path):
    """The layout of the main database of the environment at PATH (a
    directory holding data.mdb): the record index through lmdbio, the
    branch levels and the leaves' nodes through os.pread (no mmap).
    Plain (non-DUPSORT) databases only."""
    from lmdbio._bulk import BulkFile
    data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    f = BulkFile(data)
    try:
        f.snapshot(0)
        f.select(None)
        f.build_index()
        leaf_pgno, first = f.index_arrays()
        psize, root = int(f.psize), int(f.root)
    finally:
        f.close()
    fd = os.open(data, os.O_RDONLY)
    try:
        def page(pg):
            return os.pread(fd, psize, pg * psize)
        levels, level = [], [root]
        leafset = set(int(x) for x in leaf_pgno)
        while level and level[0] not in leafset:
            levels.append(np.array(level, dtype=np.uint64))
            nxt = []
            for pg in level:
                nxt.extend(_branch_children(page(pg), psize))
            level = nxt
        ks, vs, ov, no = [], [], [], []
        for pg in leaf_pgno:
            for k, d, o, off in _leaf_nodes(page(int(pg))):
                ks.append(k)
                vs.append(d)
                ov.append(o)
                no.append(off)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return Layout(os.path.basename(os.path.normpath(path)), psize, size,
                  leaf_pgno.astype(np.uint64), first.astype(np.uint64),
                  levels, np.array(ov, dtype=np.int64),
                  np.array(vs, dtype=np.int64), np.array(ks, dtype=np.int64),
                  nodeoff=np.array(no, dtype=np.int64))


def synthetic_layout(name, n, value_bytes, key_bytes=8, psize=4096,
                     leaf_fill=1.0, branch_fill=1.0):
    """An appended database (records put in key order, the way convert
    tools write them): leaves and overflow runs allocated as the records
    arrive, each leaf followed by the overflow runs of its records, the
    branch pages at the end.  LMDB keeps a value inline when its node fits
    in half a page (nodemax), else on its own overflow run."""
    nodemax = (((psize - PAGEHDRSZ) // 2) & ~1) - 2  # me_nodemax
    inline = 8 + key_bytes + value_bytes <= nodemax
    node = 8 + key_bytes + (value_bytes if inline else 8)
    node += node & 1
    per_leaf = max(1, int((psize - PAGEHDRSZ) * leaf_fill) // (node + 2))
    n_leaves = -(-n // per_leaf)
    counts = np.full(n_leaves, per_leaf, dtype=np.int64)
    counts[-1] = n - per_leaf * (n_leaves - 1)
    first = np.zeros(n_leaves + 1, dtype=np.uint64)
    np.cumsum(counts, out=first[1:])
    vsize = np.full(n, value_bytes, dtype=np.int64)
    ksize = np.full(n, key_bytes, dtype=np.int64)
    run = 0 if inline else -(-(PAGEHDRSZ + value_bytes) // psize)
    # leaf i sits at 2 + i + (records before it) * run; its records' runs
    # follow it
    leaf_pgno = (2 + np.arange(n_leaves, dtype=np.int64)
                 + first[:-1].astype(np.int64) * run)
    leaf_of = np.repeat(np.arange(n_leaves), counts)
    slot = np.arange(n) - first[:-1].astype(np.int64)[leaf_of]
    if run:
        ovpg = leaf_pgno[leaf_of] + 1 + slot * run
    else:
        ovpg = np.zeros(n, dtype=np.int64)
    # appended nodes fill a leaf from its end down
    nodeoff = psize - (slot + 1) * node
    last = 2 + n_leaves + n * run
    bnode = 8 + key_bytes + 2
    fan = max(2, int((psize - PAGEHDRSZ) * branch_fill) // bnode)
    levels, width = [], n_leaves
    while width > 1:
        width = -(-width // fan)
        levels.insert(0, np.arange(last, last + width, dtype=np.uint64))
        last += width
    return Layout(name, psize, last * psize, leaf_pgno.astype(np.uint64),
                  first, levels, ovpg, vsize, ksize, synthetic=True,
                  nodeoff=nodeoff)


# --------------------------------------------------------------------------
# lmdbio's planner, replayed
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Policy:
    """How the Reader plans its reads (csrc/bulk.c, csrc/plan.c)."""
    max_gap: int = 64 << 10       # read a hole up to this rather than split
    max_read: int = 8 << 20       # largest request
    unit: str = "batch"           # "batch" (today) or "window"
    window_bytes: int = 64 << 20  # prefetch_bytes: a window's record bytes
    growth: bool = False          # windows as the Reader sizes them: the
                                  # first one batch, each at most twice the
                                  # last, up to window_bytes (leaves, keys
                                  # and values); else window_bytes at once
    threads: int = 4              # requests in flight per rank (pread pool)
    sieve_bytes: int = 4 << 20    # MPI-IO: ROMIO's data sieving buffer
                                  # (ind_rd_buffer_size; 0: romio_ds_read
                                  # disabled)
    max_segs: int = MAX_SEGS_PER_READ


def coalesce(offs, lens, contig, max_gap, max_read, max_segs=MAX_SEGS_PER_READ):
    """lio_plan_add over sorted extents: the (offset, length) of each read.
    contig[i]: extent i's destination follows extent i-1's (their segments
    merge when no hole lies between them).  An extent joins the current
    read when the hole before it is at most max_gap, the read stays within
    max_read, and the read's segments (one per extent that does not merge,
    one per hole) stay within max_segs; otherwise it starts a new read."""
    offs = np.asarray(offs, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    contig = np.asarray(contig, dtype=bool)
    keep = lens > 0
    if not keep.all():
        offs, lens, contig = offs[keep], lens[keep], contig[keep]
    n = len(offs)
    if n == 0:
        return []
    ends = offs + lens
    gap = np.zeros(n, dtype=np.int64)
    gap[1:] = offs[1:] - ends[:-1]
    # segments each extent adds to a read it joins
    add = np.where(gap > 0, 2, np.where(contig, 0, 1))
    add[0] = 0
    cum = np.cumsum(add)                     # cum[k]: adds of extents 1..k
    breaks = np.flatnonzero(gap > max_gap)   # extents that cannot join
    # Most runs between breaks fit one read: take those whole, and split
    # only the others greedily.
    g0 = np.r_[0, breaks]
    g1 = np.r_[breaks, n]
    # (the last extent joins when the segments before it, plus 2, fit)
    fits = ((ends[g1 - 1] - offs[g0]) <= max_read) & (
        (g1 - g0 == 1) | (3 + cum[np.maximum(g1 - 2, 0)] - cum[g0] <= max_segs))
    if fits.all():
        return list(zip(offs[g0].tolist(), (ends[g1 - 1] - offs[g0]).tolist()))
    reads = []
    i = 0
    while i < n:
        k = int(np.searchsorted(g0, i, side="right")) - 1
        if g0[k] == i and fits[k]:
            reads.append((int(offs[i]), int(ends[g1[k] - 1] - offs[i])))
            i = int(g1[k])
            continue
        nb = breaks[np.searchsorted(breaks, i, side="right")] \
            if len(breaks) and breaks[-1] > i else n
        nr = int(np.searchsorted(ends, offs[i] + max_read, side="right"))
        # extent k joins while 1 + cum[k-1] - cum[i] + 2 <= max_segs
        ns = int(np.searchsorted(cum, max_segs - 3 + cum[i], side="right")) + 1
        j = max(i + 1, min(int(nb), nr, ns))
        reads.append((int(offs[i]), int(ends[j - 1] - offs[i])))
        i = j
    return reads


def romio_sieve(reads, buf=4 << 20):
    """What ROMIO's independent strided read (data sieving, MPICH's default
    for a non-contiguous file view) issues for one step's extents: from the
    first extent not yet covered, one buffer of `buf` bytes (or to the last
    extent's end), holes included.  Returns the (offset, length) reads."""
    if not reads or not buf:
        return list(reads)
    end_all = reads[-1][0] + reads[-1][1]
    cur, out = -1, []
    for off, ln in reads:
        s, e = max(off, cur), off + ln
        while s < e:
            if s >= cur:
                n = min(buf, end_all - s)
                out.append((s, n))
                cur = s + n
            s = cur
    return out


def mapped_records(layout, ords):
    """Which of a step's records (ordinals, repeats allowed) the record map
    reads straight from their leaf: inline values in leaves the step needs
    at most half the records of (csrc/bulk.c choose_mapped)."""
    leaf = np.searchsorted(layout.first, ords, side="right") - 1
    lv, inv, cnt = np.unique(leaf, return_inverse=True, return_counts=True)
    per_leaf = (layout.first[lv + 1] - layout.first[lv]).astype(np.int64)
    return (2 * cnt <= per_leaf)[inv] & (layout.ovpg[ords] == 0)


class GapStore:
    """csrc/bulk.c's gap_store: the holes that reads of leaves bridged,
    kept where the tree has overflow values, so that a value lying whole in
    one is copied from there, not read (a read's holes are kept when all
    it may bridge fits in GAPS_KEPT_MAX with what is kept already)."""

    def __init__(self, layout, pol):
        self.ps = layout.psize
        self.max_gap = pol.max_gap
        self.on = layout.has_overflow and pol.max_gap > 0
        self.reset()

    def reset(self):
        self.off, self.len, self.used = [], [], 0

    def keep(self, pages, reads):
        """Leaf pages (ascending) read by `reads` (_leaf_reads)."""
        if not self.on or len(pages) < 2:
            return
        pages = np.asarray(pages, dtype=np.int64)
        d = np.diff(pages) - 1
        can = (d > 0) & (d * self.ps <= self.max_gap)
        bound = int((d[can] * self.ps).sum())
        if not bound or bound > GAPS_KEPT_MAX - self.used:
            return
        starts = np.asarray([r[0] for r in reads], dtype=np.int64)
        read_of = np.searchsorted(starts, pages * self.ps, side="right") - 1
        held = can & (read_of[1:] == read_of[:-1])   # bridged by one read
        off = (pages[:-1][held] + 1) * self.ps
        ln = d[held] * self.ps
        if self.off and len(off) and off[0] < self.off[-1]:
            order = np.argsort(np.r_[self.off, off], kind="stable")
            self.off = np.r_[self.off, off][order].tolist()
            self.len = np.r_[self.len, ln][order].tolist()
        else:
            self.off += off.tolist()
            self.len += ln.tolist()
        self.used += int(ln.sum())

    def holds(self, off, length):
        """Whether the last hole starting at or before each offset holds
        [off, off + length) whole (gap_holding)."""
        off = np.asarray(off, dtype=np.int64)
        if not self.off:
            return np.zeros(len(off), dtype=bool)
        starts = np.asarray(self.off, dtype=np.int64)
        lens = np.asarray(self.len, dtype=np.int64)
        at = np.searchsorted(starts, off, side="right") - 1
        ok = at >= 0
        at = np.maximum(at, 0)
        inside = off - starts[at]
        return ok & (inside < lens[at]) & (length <= lens[at] - inside)


def _leaf_reads(layout, pol, leaves):
    """The reads of these leaves (index positions, ascending) into
    consecutive slots of one buffer: in page order, neighbours in one
    request (a hole between slots is a segment of its own)."""
    ps = layout.psize
    pg = layout.leaf_pgno[leaves].astype(np.int64)
    order = np.argsort(pg, kind="stable")   # read by page; slot by key order
    contig = np.ones(len(pg), dtype=bool)
    contig[1:] = order[1:] == order[:-1] + 1
    return coalesce((pg[order] * ps).tolist(), [ps] * len(pg),
                    contig.tolist(), pol.max_gap, pol.max_read, pol.max_segs)


def plan_step(layout, ordinals, pol, mapped=False, keys=True, held=False,
              counted=(0, 0), kept_gaps=None):
    """The reads of one Reader step (a batch, or a window): leaves (none
    when the Reader holds them: held; none of the leaves counted=(lo, hi)
    that the step's counting read just before), then overflow runs and
    (mapped: the index keeps the record map) the records read straight from
    sparse leaves, in one plan; a value that lies whole in a hole the leaf
    reads bridged, or that the counting's reads did (kept_gaps), is not
    read.  Returns (leaf reads, overflow and record reads)."""
    ps = layout.psize
    ords = np.asarray(ordinals, dtype=np.int64)
    if len(ords) == 0:
        return [], []
    direct = mapped_records(layout, ords) if mapped else \
        np.zeros(len(ords), dtype=bool)
    leaves = np.unique(np.searchsorted(layout.first, ords[~direct],
                                       side="right") - 1)
    if held:
        leaves = leaves[:0]
    leaves = leaves[(leaves < counted[0]) | (leaves >= counted[1])]
    leaf_reads = _leaf_reads(layout, pol, leaves)
    ov = layout.ovpg[ords]
    sel = ov > 0
    ov_reads = []
    offs, lens = [], []
    if sel.any():
        run = np.unique(ov[sel])                 # each run read once
        vs = _vsize_of(layout, run)
        # (bulk.c load_leaves, fill: from the pages read already)
        gaps = GapStore(layout, pol)
        gaps.keep(np.sort(layout.leaf_pgno[leaves].astype(np.int64)),
                  leaf_reads)
        read = ~gaps.holds(run * ps, PAGEHDRSZ + vs)
        if kept_gaps is not None:
            read &= ~kept_gaps.holds(run * ps, PAGEHDRSZ + vs)
        run, vs = run[read], vs[read]
        o = np.empty(2 * len(run), dtype=np.int64)
        ln = np.empty(2 * len(run), dtype=np.int64)
        o[0::2] = run * ps
        o[1::2] = run * ps + PAGEHDRSZ
        ln[0::2] = PAGEHDRSZ
        ln[1::2] = vs
        offs.append(o)
        lens.append(ln)
    if direct.any():
        rec = np.unique(ords[direct])            # each record read once
        leaf = np.searchsorted(layout.first, rec, side="right") - 1
        at = layout.leaf_pgno[leaf].astype(np.int64) * ps + \
            layout.nodeoff[rec] + NODEHDRSZ
        ks, vs = layout.ksize[rec], layout.vsize[rec]
        if keys:   # the key, then the value after it
            o = np.empty(2 * len(rec), dtype=np.int64)
            ln = np.empty(2 * len(rec), dtype=np.int64)
            o[0::2], o[1::2] = at, at + ks
            ln[0::2], ln[1::2] = ks, vs
        else:
            o, ln = at + ks, vs
        offs.append(o)
        lens.append(ln)
    if offs:
        o, ln = np.concatenate(offs), np.concatenate(lens)
        order = np.argsort(o, kind="stable")
        ov_reads = coalesce(o[order].tolist(), ln[order].tolist(),
                            [False] * len(o), pol.max_gap, pol.max_read,
                            pol.max_segs)
    return leaf_reads, ov_reads


def _vsize_of(layout, runs):
    """Value sizes of the records whose overflow runs start at `runs`."""
    tab = layout.__dict__.get("_ov_table")
    if tab is None:
        idx = np.flatnonzero(layout.ovpg > 0)
        o = idx[np.argsort(layout.ovpg[idx], kind="stable")]
        tab = layout.__dict__["_ov_table"] = (layout.ovpg[o], layout.vsize[o])
    return tab[1][np.searchsorted(tab[0], runs)]


def shard(layout, rank, P, shuffle=False, seed=0, epoch=0, batch_size=256):
    """The ordinals a rank reads (lmdbio's sharding rule, from lmdbio)."""
    from lmdbio.reader import shard_order
    return shard_order(layout.n_records, rank, P, shuffle, seed, epoch, False,
                       batch_size)


def reader_policy(storage="local", prefetch_bytes=64 << 20, unit="window",
                  shuffle=False):
    """The planning policy of the installed Reader for its `storage` model
    (lmdbio.reader._io_policy: the gap tolerance and the largest request;
    _window_budget: what a window of an epoch in key order, or shuffled,
    holds); a Reader without one plans per batch with 64 KiB / 8 MiB."""
    try:
        from lmdbio.reader import _io_policy
    except ImportError:
        return Policy(unit="batch")
    gap, max_read, _, _ = _io_policy(storage)
    try:   # the Reader's own window budget
        from lmdbio.reader import _window_budget
        window = _window_budget(prefetch_bytes, shuffle)
    except ImportError:   # (before it had one: a quarter of prefetch_bytes)
        window = prefetch_bytes // 4
    return Policy(max_gap=gap, max_read=max_read, unit=unit,
                  window_bytes=window, growth=True, threads=16)


def steps_of(layout, ords_per_batch, pol, mapped=False):
    """Group a rank's batches into the planner's steps: one per batch, or
    one per window of consecutive batches holding up to window_bytes
    (mapped: leaves the record map skips are not part of a window's
    bytes)."""
    if pol.unit == "batch":
        return ords_per_batch
    if pol.growth:
        out, i, nbatch = [], 0, 1
        first = layout.first
        while i < len(ords_per_batch):
            win = ords_per_batch[i:i + nbatch]
            i += len(win)
            w = np.concatenate(win)
            out.append(w)
            wl = w[~mapped_records(layout, w)] if mapped else w
            leaves = len(np.unique(np.searchsorted(first, wl, side="right")))
            size = leaves * layout.psize + int(layout.vsize[w].sum()) + \
                int(layout.ksize[w].sum())
            bs = len(win[0])
            per_batch = max(1, size * bs // len(w))
            nbatch = max(1, min(2 * nbatch, pol.window_bytes // per_batch))
        return out
    rec = layout.vsize + layout.ksize
    out, cur, size = [], [], 0
    for b in ords_per_batch:
        nb = int(rec[b].sum())
        if cur and size + nb > pol.window_bytes:
            out.append(np.concatenate(cur))
            cur, size = [], 0
        cur.append(b)
        size += nb
    if cur:
        out.append(np.concatenate(cur))
    return out


def batches(ords, bs):
    return [ords[s:s + bs] for s in range(0, len(ords), bs)]


# --------------------------------------------------------------------------
# the five readers
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Job:
    P: int
    ranks_per_node: int = 1
    batch_size: int = 256
    shuffle: bool = False
    index_cached: bool = True

    @property
    def nodes(self):
        return -(-self.P // self.ranks_per_node)


def reader_has_map(layout, job, rank, engine="posix"):
    """Whether a rank's record index keeps the record map: a tree that
    qualifies, indexed whole by the rank itself (lmdbio.Reader._part_wanted:
    one rank, a shuffled order, or a share that wraps around); a partial
    index and the one MPI ranks build together keep none."""
    if engine != "posix" or not layout.has_recmap():
        return False
    return _whole_index(layout, job, rank)


def _whole_index(layout, job, rank):
    """Whether the rank indexes the whole tree (lmdbio.Reader._part_wanted
    is None): one rank, a shuffled order, or a share that wraps around."""
    n, P = layout.n_records, job.P
    if job.shuffle or P == 1:
        return True
    per = -(-n // P)
    first, count = rank * per, per
    if count == 0 or first + count > n:
        return True
    return min(first + count, n - first) >= n


def reader_holds_leaves(layout, job, rank, engine="posix",
                        random_access=True):
    """Whether the Reader holds every leaf in memory
    (lmdbio.Reader._random_access): before reads in random order (a
    shuffled epoch, or read(): random_access), without MPI, a whole index
    without a record map whose leaves take at most LEAVES_HELD bytes."""
    if engine != "posix" or not random_access or \
            not _whole_index(layout, job, rank) or layout.has_recmap():
        return False
    leaf_bytes = layout.n_leaves * layout.psize
    return 0 < leaf_bytes <= LEAVES_HELD


def reader_counts_leaves(layout, job, rank, engine="posix"):
    """Whether the rank starts without counting the leaves and counts
    them as its reads need them (lmdbio.Reader._load_index, a first start:
    lio_index_begin): a whole index without MPI for an epoch in key order.
    Its open reads only the branch levels."""
    return engine == "posix" and not job.shuffle and \
        _whole_index(layout, job, rank)


def _kept_reads(layout, pol, leaves, gaps):
    """csrc/bulk.c read_kept: the reads of these leaves, their holes kept
    in gaps (a GapStore, or None)."""
    reads = _leaf_reads(layout, pol, leaves)
    if gaps is not None:
        gaps.keep(np.sort(layout.leaf_pgno[leaves].astype(np.int64)), reads)
    return reads


def read_ahead(layout, pol, lo, hi, gaps=None):
    """csrc/bulk.c lio_bulk_read_leaves: leaves lo..hi-1 (at most
    EXTEND_KEPT bytes of them) read ahead of a window's turn, kept anew
    (gaps: their GapStore).  Returns (reads, (lo, hi) kept)."""
    kept_max = max(1, EXTEND_KEPT // layout.psize)
    hi = min(hi, layout.n_leaves, lo + kept_max)
    if gaps is not None:
        gaps.reset()
    if lo >= hi:
        return [], (lo, lo)
    return _kept_reads(layout, pol, np.arange(lo, hi), gaps), (lo, hi)


def count_rounds(layout, pol, counted, need, keep=True, ahead=None,
                 gaps=None):
    """The reads of counting a begun index's leaves from `counted` until
    they hold ordinal `need` (csrc/bulk.c lio_bulk_extend): rounds of the
    leaves the records wanted take at the average left, one more, at most
    EXTEND_ROUND bytes; a round of leaves read ahead (ahead: their (lo,
    hi), read_ahead) is counted from memory, any other read in page order,
    neighbours in one request, as a step's leaves (gaps: the GapStore of
    the leaves kept).  Returns (reads, leaves counted now, (lo, hi) the
    leaves kept for the step)."""
    ps = layout.psize
    L, total = layout.n_leaves, layout.n_records
    first = layout.first
    round_max = max(1, EXTEND_ROUND // ps)
    kept_max = max(1, EXTEND_KEPT // ps)
    reads = []
    pre_lo, pre_n = (ahead[0], ahead[1] - ahead[0]) if keep and ahead \
        else (counted, 0)
    n = counted
    while n < L and int(first[n]) <= need:
        have, left = int(first[n]), L - n
        left_recs = max(0, total - have)
        if need >= total or left_recs == 0:
            k = left
        else:   # in doubles, as the C code computes it
            x = float(need + 1 - have) * float(left) / float(left_recs)
            k = int(x) if x < left else left
            k += (k < x) + 1
        k = min(k, round_max, left)
        if keep and pre_lo <= n < pre_lo + pre_n:
            n += min(k, pre_lo + pre_n - n)   # read ahead: no read
            continue
        if not keep or pre_lo + pre_n != n or pre_n + k > kept_max:
            pre_lo, pre_n = n, 0
            if gaps is not None:
                gaps.reset()
        reads.extend(_kept_reads(layout, pol, np.arange(n, n + k), gaps))
        n += k
        pre_n += k
    if not keep:
        pre_n = 0
        if gaps is not None:
            gaps.reset()
    return reads, n, (pre_lo, pre_lo + pre_n)


def leaf_load(layout):
    """The reads of holding every leaf (csrc/index.c
    lio_index_load_leaves): in page order, LOAD_CHUNK leaves a round,
    neighbouring pages in one request of at most 8 MiB."""
    ps = layout.psize
    pg = layout.leaf_pgno.astype(np.int64)
    order = np.argsort(pg, kind="stable")
    reads = []
    for c0 in range(0, len(pg), LOAD_CHUNK):
        sel = order[c0:c0 + LOAD_CHUNK]
        contig = np.ones(len(sel), dtype=bool)
        contig[1:] = sel[1:] == sel[:-1] + 1
        reads.extend(coalesce((pg[sel] * ps).tolist(), [ps] * len(sel),
                              contig.tolist(), 0, 8 << 20))
    return reads


def _reads_summary(reads):
    lens = [ln for _, ln in reads]
    return len(lens), sum(lens), (max(lens) if lens else 0)


def model_lmdbio_rank(layout, job, pol, rank, engine="posix",
                      sample=None, random_access=False, load=True):
    """One lmdbio rank's epoch: its planned steps and their reads.

    engine: posix (the rank's pread pool), mpiio (the same plan, each
    non-empty step one collective read), node_local (MPI-IO; the node's
    leader reads its members' batches, the others read nothing).
    requests/bytes: the plan, as the Reader counts it (pread calls, or the
    MPI file's collective reads and their bytes).  issued_*: what reaches
    the filesystem client: the same for posix; under MPI-IO what ROMIO's
    data sieving makes of each step (pol.sieve_bytes).  reads: the issued
    reads of each non-empty step.  sample: replay at most this many steps,
    evenly spaced, and scale the totals.  random_access: a Reader without
    MPI reading in random order (a shuffled epoch, read()), which may hold
    the leaves (reader_holds_leaves; under comm=, which the projections
    model, it holds none); load: count the reads of holding them, and of a
    first start (not job.index_cached) counting its leaves
    (reader_counts_leaves: window by window in key order, all of them
    before reads in random order) (False: they were held or counted
    before)."""
    bs = job.batch_size
    mpi = engine in ("mpiio", "node_local")
    if engine == "node_local":
        rpn = job.ranks_per_node
        if rank % rpn:
            return dict(steps=_steps_count(layout, job, pol), requests=0,
                        bytes=0, issued_requests=0, issued_bytes=0,
                        max_request=0, step_requests=[], step_scale=1.0,
                        collectives=0, reads=[], sampled=False)
        members = range(rank, min(rank + rpn, job.P))
        per = [batches(shard(layout, m, job.P, job.shuffle, batch_size=bs),
                       bs) for m in members]
        units = [np.concatenate([p[b] for p in per])
                 for b in range(len(per[0]))]
    else:
        units = batches(shard(layout, rank, job.P, job.shuffle,
                              batch_size=bs), bs)
    counting = reader_counts_leaves(layout, job, rank, engine) and load \
        and not job.index_cached
    # a first start in key order counts the leaves window by window, and
    # has no record map until then; read() counts them all first
    mapped = reader_has_map(layout, job, rank, engine) and \
        not (counting and not random_access)
    held = reader_holds_leaves(layout, job, rank, engine, random_access)
    steps = steps_of(layout, units, pol, mapped)
    counted_to = 0
    if counting and random_access:   # (Reader._finish_index)
        finish, counted_to, _ = count_rounds(layout, pol, 0,
                                             layout.n_records, keep=False)
    picked = range(len(steps))
    scale = 1.0
    if sample and len(steps) > sample:
        picked = np.unique(np.linspace(0, len(steps) - 1, sample).astype(int))
        scale = len(steps) / len(picked)
    req = nbytes = ireq = ibytes = mx = coll = 0
    step_req, reads_all = [], []   # per non-empty step
    # (leaves counted, records they hold, the largest error of the
    # expectations so far) after a step
    after = {-1: (0, 0, -1.0)}
    err_max = -1.0
    if counting and not random_access:
        # (the Reader's own rule)
        from lmdbio.reader import leaves_ahead, leaves_ahead_error
    for i in picked:
        parts = []
        kept = (0, 0)
        kept_gaps = None
        if counting and not random_access and len(steps[i]):
            # (Reader._iter_windows count_in_turn: from the second window
            # on, read ahead from the index as two windows back had it)
            if sample:
                raise ValueError("a first start that counts its leaves is "
                                 "replayed whole (sample=None)")
            ahead = None
            kept_gaps = GapStore(layout, pol)   # (a step's own)
            basis = after[i - 2] if i >= 2 else after[-1]
            lo_ord, hi_ord = int(steps[i][0]), int(steps[i][-1])
            expects = i and basis[0] < layout.n_leaves
            if expects:
                lo, hi = leaves_ahead(lo_ord, hi_ord, basis[0], basis[1],
                                      layout.n_leaves, layout.n_records,
                                      basis[2])
                extra, ahead = read_ahead(layout, pol, lo, hi, kept_gaps)
                parts.append(extra)
            extra, counted_to, kept = count_rounds(
                layout, pol, counted_to, int(np.max(steps[i])), ahead=ahead,
                gaps=kept_gaps)
            parts.append(extra)
            if expects and lo_ord <= hi_ord:
                # (count_in_turn: how far the expectation fell from the
                # leaves the step's first and last ordinals lie in)
                leaf = np.searchsorted(layout.first[:layout.n_leaves + 1],
                                       [lo_ord, hi_ord], side="right") - 1
                err_max = max(err_max, leaves_ahead_error(
                    lo_ord, hi_ord, basis[0], basis[1], layout.n_leaves,
                    layout.n_records, int(leaf[0]), int(leaf[1]) + 1))
            after[i] = (counted_to, int(layout.first[counted_to]), err_max)
        parts.extend(plan_step(layout, steps[i], pol, mapped, held=held,
                               counted=kept, kept_gaps=kept_gaps))
        for part in parts:
            if not part:
                continue
            n, b, _ = _reads_summary(part)
            req += n
            nbytes += b
            coll += 1
            if mpi:
                part = romio_sieve(part, pol.sieve_bytes)
            n, b, m = _reads_summary(part)
            ireq += n
            ibytes += b
            mx = max(mx, m)
            step_req.append(n)
            reads_all.append(part)
    lreq = lbytes = 0
    if held and load:
        lreq, lbytes, _ = _reads_summary(leaf_load(layout))
    if counting and random_access:
        freq, fbytes, _ = _reads_summary(finish)
        lreq, lbytes = lreq + freq, lbytes + fbytes
    return dict(steps=len(steps), requests=req * scale + lreq,
                bytes=nbytes * scale + lbytes,
                issued_requests=ireq * scale + lreq,
                issued_bytes=ibytes * scale + lbytes,
                max_request=mx, step_requests=step_req, step_scale=scale,
                collectives=coll * scale, reads=reads_all, sampled=scale != 1)


def _steps_count(layout, job, pol):
    per = -(-layout.n_records // job.P)
    return -(-per // job.batch_size)


def reader_open(layout, job, rank, engine="posix"):
    """The reads of a first start's open: the index build (index_build),
    or only its branch levels for a rank that counts the leaves as it reads
    them (reader_counts_leaves)."""
    if reader_counts_leaves(layout, job, rank, engine):
        return index_build(layout, 1, 0, leaves=False)
    return index_build(layout, 1, 0, reader_has_map(layout, job, rank,
                                                    engine))


def index_build(layout, P=1, rank=0, recmap=False, leaves=True):
    """The reads of building the record index (csrc/index.c): every rank
    reads the branch levels (pages coalesced with no hole, in rounds of
    INDEX_CHUNK_BYTES), then its share of the leaf headers, 16 bytes each,
    headers at most INDEX_HEADER_GAP apart in one request of at most
    INDEX_READ_MAX (the pages between them read over); with the record map
    (recmap: reader_has_map) whole leaves instead, in rounds of
    INDEX_CHUNK_BYTES.  leaves=False: the branch levels only (a start that
    counts the leaves as it reads them: reader_open)."""
    ps = layout.psize
    chunk_pages = max(1, INDEX_CHUNK_BYTES // ps)
    req = nbytes = 0
    reads = []
    for lvl in layout.branch_levels:
        pg = np.sort(lvl.astype(np.int64))
        for c0 in range(0, len(pg), chunk_pages):
            ch = pg[c0:c0 + chunk_pages]
            rd = coalesce((ch * ps).tolist(), [ps] * len(ch),
                          [True] * len(ch), 0, 8 << 20)
            req += len(rd)
            nbytes += sum(x[1] for x in rd)
            reads.extend(rd)
    L = layout.n_leaves if leaves else 0
    lo, hi = L * rank // P, L * (rank + 1) // P
    pg = np.sort(layout.leaf_pgno[lo:hi].astype(np.int64))
    hdr = 0
    chunk = chunk_pages if recmap else INDEX_CHUNK_HEADERS
    for c0 in range(0, len(pg), chunk):
        ch = pg[c0:c0 + chunk]
        rd = coalesce((ch * ps).tolist(), [ps if recmap else PAGEHDRSZ] *
                      len(ch), [bool(recmap)] * len(ch),
                      INDEX_HEADER_GAP * ps, INDEX_READ_MAX)
        hdr += len(rd)
        nbytes += sum(x[1] for x in rd)
        reads.extend(rd)
    return dict(requests=req + hdr, bytes=nbytes,
                reads=reads,
                branch_pages=layout.n_branch, leaf_headers=hi - lo,
                rounds=len(layout.branch_levels) + max(
                    1, -(-(hi - lo) // chunk)))


# -- mmap readers: pages touched, read-around windows -----------------------

def _intervals(layout, leaves_to, values_from, values_to):
    """Sorted page intervals [start, end) touched by a cursor that walks the
    leaves of records [0, leaves_to) and reads the values of records
    [values_from, values_to), plus the branch pages."""
    first = layout.first.astype(np.int64)
    parts_s, parts_n = [], []
    if layout.branch_levels:
        br = np.concatenate(layout.branch_levels).astype(np.int64)
        parts_s.append(br)
        parts_n.append(np.ones(len(br), np.int64))
    if leaves_to > 0:
        l1 = int(np.searchsorted(first, leaves_to - 1, side="right"))
        lv = layout.leaf_pgno[:l1].astype(np.int64)
        parts_s.append(lv)
        parts_n.append(np.ones(len(lv), np.int64))
    if values_to > values_from:
        ov = layout.ovpg[values_from:values_to]
        sel = ov > 0
        parts_s.append(ov[sel])
        parts_n.append(layout.ov_pages()[values_from:values_to][sel])
    s = np.concatenate(parts_s) if parts_s else np.zeros(0, np.int64)
    n = np.concatenate(parts_n) if parts_n else np.zeros(0, np.int64)
    o = np.argsort(s, kind="stable")
    return s[o], s[o] + n[o]


def _windows(starts, ends, ps, ra=READ_AROUND):
    """Distinct read-around windows (aligned ra-byte blocks) holding the
    pages of sorted, disjoint intervals."""
    if len(starts) == 0:
        return 0
    per = max(1, ra // ps)
    sw, ew = starts // per, (ends - 1) // per
    prev = np.maximum.accumulate(np.r_[-1, ew[:-1]])
    return int(np.maximum(0, ew - np.maximum(sw, prev + 1) + 1).sum())


def model_mmap_rank(layout, job, kind, rank, walk_values=False):
    """caffe / dali: storage requests on one rank's path (its synchronous
    page faults, one read-around window each) and its node's storage reads
    (the node's ranks share one page cache).  walk_values: the DALI-style
    walk also touches the values it steps over (py-lmdb's cursor pre-faults
    every value it returns, keys-only iteration included; LMDB's C cursor
    with MDB_NEXT does not)."""
    N, P, rpn = layout.n_records, job.P, job.ranks_per_node
    per = -(-N // P)
    ps = layout.psize
    node0 = (rank // rpn) * rpn
    node1 = min(node0 + rpn, P) - 1
    if kind == "caffe":
        walk = N
        hit = layout.__dict__.get("_caffe_windows")
        if hit is None:
            path = _intervals(layout, N, 0, N)
            hit = layout.__dict__["_caffe_windows"] = _windows(*path, ps)
        return dict(walk_steps=walk, path_requests=hit, node_requests=hit,
                    node_bytes=min(hit * READ_AROUND, layout.file_bytes),
                    max_request=READ_AROUND)
    else:
        start = min(N, rank * per)
        end = min(N, start + per)
        v0 = 0 if walk_values else start
        path = _intervals(layout, end, v0, end)
        n_end = min(N, node1 * per + per)
        nv0 = 0 if walk_values else min(N, node0 * per)
        # values of the walked prefix of later ranks are not read (unless
        # walk_values), but every rank's shard is
        node = _intervals(layout, n_end, nv0, n_end)
        walk = start
    w_path = _windows(*path, ps)
    w_node = _windows(*node, ps)
    return dict(walk_steps=walk, path_requests=w_path,
                node_requests=w_node,
                node_bytes=min(w_node * READ_AROUND, layout.file_bytes),
                max_request=READ_AROUND)


# --------------------------------------------------------------------------
# what reaches the storage under the FUSE emulation
# --------------------------------------------------------------------------

def fuse_requests(reads, ps=4096, cached=None):
    """Storage requests of application reads on a FUSE mount with a page
    cache: the pages not yet cached, in runs split at 128 KiB."""
    cached = set() if cached is None else cached
    req = nbytes = 0
    for off, ln in reads:
        p0, p1 = off // ps, (off + ln - 1) // ps
        run = 0
        for p in range(p0, p1 + 1):
            if p in cached:
                if run:
                    req += -(-run * ps // FUSE_MAX_REQUEST)
                    nbytes += run * ps
                    run = 0
                continue
            cached.add(p)
            run += 1
        if run:
            req += -(-run * ps // FUSE_MAX_REQUEST)
            nbytes += run * ps
    return req, nbytes


# --------------------------------------------------------------------------
# storage and time
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Storage:
    name: str
    latency: float                # seconds per request
    node_bw: float                # bytes/s per node
    fs_bw: float = 0.0            # bytes/s for the whole job (0: no cap)
    fs_iops: float = 0.0          # requests/s for the whole job (0: no cap)
    opens_per_s: float = 0.0      # metadata server: opens per second
    request_split: int = 0        # the client splits requests to this (RPC)
    source: str = ""


def _split(nbytes, nreq, split):
    if not split:
        return nreq
    return max(nreq, -(-int(nbytes) // split))


def project_reader(layout, job, pol, st, kind, sample=64):
    """Per-rank figures and the epoch time of one reader at one P."""
    P, rpn = job.P, job.ranks_per_node
    nodes = job.nodes
    res = dict(reader=kind, P=P)
    if kind in ("caffe", "dali"):
        # the slowest rank: DALI's last (the longest walk)
        worst = P - 1 if kind == "dali" else 0
        m = model_mmap_rank(layout, job, kind, worst)
        node_req, node_bytes = _mmap_machine(layout, job, kind)
        # the rank's path: synchronous page faults, one request each
        lat_path = m["path_requests"] * st.latency + \
            m["node_bytes"] / st.node_bw
        res.update(requests_rank=m["path_requests"],
                   bytes_rank=m["node_bytes"] / rpn,
                   node_bytes=m["node_bytes"], machine_bytes=node_bytes,
                   machine_requests=node_req, request_size=READ_AROUND,
                   max_request=READ_AROUND, in_flight=P,
                   walk_steps=m["walk_steps"], leaf_headers=0,
                   collectives=0, opens=P)
        startup = _open_time(st, P, 3)
    else:
        m = model_lmdbio_rank(layout, job, pol, 0, engine=kind,
                              sample=sample)
        readers = nodes if kind == "node_local" else P
        q = 1 if kind in ("mpiio", "node_local") else pol.threads
        # a request larger than the client's RPC size travels as several
        # RPCs in parallel: one latency, the bytes at the node's bandwidth
        rpcs = _split(m["issued_bytes"], m["issued_requests"],
                      st.request_split)
        lat_path = sum(math.ceil(r / q) for r in m["step_requests"]) * \
            m["step_scale"] * st.latency
        node_bytes = m["issued_bytes"] * (1 if kind == "node_local" else rpn)
        lat_path += node_bytes / st.node_bw
        res.update(requests_rank=m["issued_requests"],
                   bytes_rank=m["issued_bytes"],
                   plan_requests_rank=m["requests"],
                   plan_bytes_rank=m["bytes"],
                   node_bytes=node_bytes,
                   machine_bytes=m["issued_bytes"] * readers,
                   machine_requests=rpcs * readers,
                   request_size=m["issued_bytes"] / max(
                       1, m["issued_requests"]),
                   max_request=m["max_request"],
                   in_flight=readers * min(q, max(m["step_requests"] or [1])),
                   walk_steps=0, steps=m["steps"],
                   collectives=(_collectives(m, kind) if kind != "posix"
                                else 0), opens=P)
        idx = index_build(layout, 1 if kind == "posix" else P, 0,
                          reader_has_map(layout, job, 0, kind))
        res["leaf_headers"] = 0 if job.index_cached else idx["leaf_headers"]
        startup = _open_time(st, P, OPEN_OPS) + \
            _index_time(layout, job, st, kind, idx)
    t_fs = res["machine_bytes"] / st.fs_bw if st.fs_bw else 0.0
    t_iops = res["machine_requests"] / st.fs_iops if st.fs_iops else 0.0
    res.update(t_latency=lat_path, t_fs_bw=t_fs, t_fs_iops=t_iops,
               t_startup=startup)
    res["epoch_s"] = max(lat_path, t_fs, t_iops) + startup
    res["bound"] = ["latency/node", "fs bandwidth", "fs requests",
                    "start-up"][int(np.argmax([lat_path, t_fs, t_iops,
                                               startup]))]
    return res


def _mmap_machine(layout, job, kind, most=5):
    """(storage requests, bytes) of every node together: the nodes' figures
    summed (at most `most` nodes evenly spaced are modelled, the rest
    interpolated: a DALI node's walked prefix grows linearly with its
    position)."""
    rpn, nodes = job.ranks_per_node, job.nodes
    if kind == "caffe":
        m = model_mmap_rank(layout, job, kind, 0)
        return m["node_requests"] * nodes, m["node_bytes"] * nodes
    picked = np.unique(np.linspace(0, nodes - 1, min(nodes, most)).astype(int))
    req = nbytes = 0.0
    for k in picked:
        m = model_mmap_rank(layout, job, kind, int(k) * rpn)
        req += m["node_requests"]
        nbytes += m["node_bytes"]
    return req * nodes / len(picked), nbytes * nodes / len(picked)


def _collectives(m, kind):
    """Collective calls per rank and epoch: per step of the plan one MPI-IO
    read and one agreement (an allgather), plus one agreement per batch;
    node_local adds two barriers and a broadcast per batch."""
    steps = m["steps"]
    c = 2 * steps * 2 + steps
    if kind == "node_local":
        c += 3 * steps
    return c


# Metadata operations each lmdbio rank sends the filesystem when it opens a
# Reader: three lookups of the path (exists, isdir, data.mdb), the open and
# fstat of data.mdb, a stat for the index cache's key, and under MPI-IO the
# MPI file's own open.  py-lmdb's open: a stat, the open, an fstat.
OPEN_OPS = 6


def _open_time(st, P, ops):
    """Every rank's metadata operations, served by one metadata server."""
    return P * ops / st.opens_per_s if st.opens_per_s else 0.0


def _index_time(layout, job, st, kind, idx):
    if job.index_cached:
        # rank 0 loads the cache; a broadcast of 16 bytes per leaf
        return 0.0 if kind == "posix" else 2 * math.log2(max(2, job.P)) * 5e-6
    # reads in rounds: branch levels, then the header chunks, 4 in flight
    return (idx["rounds"] * st.latency
            + idx["requests"] / 4 * st.latency)


# --------------------------------------------------------------------------
# storage figures (approximate, from published descriptions; see the docs)
# --------------------------------------------------------------------------

PFS = Storage(
    name="parallel filesystem (GPFS/Lustre-class)",
    latency=1e-3, node_bw=5e9, fs_bw=250e9, fs_iops=2e6, opens_per_s=50e3,
    request_split=1 << 20,
    source="see docs/scale-model.md: Sources")

PFS_FAST = dataclasses.replace(PFS, name="flash-backed PFS", latency=0.2e-3)
PFS_SLOW = dataclasses.replace(PFS, name="disk-backed PFS, busy",
                               latency=5e-3)

STORAGES = {"pfs": PFS, "fast": PFS_FAST, "slow": PFS_SLOW}

PROJ_P = [1, 4, 16, 36, 64, 256, 1024, 4096, 9216]


def _projection_policies():
    """The Reader's storage="network" policy, per batch (MPI-IO today), per
    window (the POSIX engine today), and per window with ROMIO's data
    sieving off (hint romio_ds_read=disable: lmdbio coalesces its reads
    itself)."""
    win = reader_policy("network")
    return {"batch": dataclasses.replace(win, unit="batch"),
            "window": win,
            "win-nods": dataclasses.replace(win, sieve_bytes=0)}


READERS = ["caffe", "dali", "posix", "mpiio", "node_local"]


def imagenet_layout():
    # Caffe's convert_imageset: keys "%08d_" + file name (about 40 bytes),
    # values a Datum of a resized JPEG, about 110 KB
    return synthetic_layout("imagenet-like", 1_281_167, 110_000, key_bytes=40,
                            leaf_fill=1.0, branch_fill=1.0)


def cifar_layout():
    # a raw 3x32x32 Datum: 3,072 pixel bytes + a 15-byte header
    return synthetic_layout("cifar-like", 50_000, 3_087, key_bytes=8,
                            leaf_fill=1.0, branch_fill=1.0)


def project(layout, st, pols, Ps=PROJ_P, rpn=36, batch_size=256, sample=16,
            readers=READERS, log=None):
    rows = []
    for P in Ps:
        job = Job(P=P, ranks_per_node=min(rpn, P), batch_size=batch_size)
        for kind in readers:
            if kind == "node_local" and job.ranks_per_node == 1:
                continue
            for pname, pol in pols.items():
                if kind in ("caffe", "dali") and pname != next(iter(pols)):
                    continue
                if kind == "posix" and pol.sieve_bytes == 0 and any(
                        p.unit == pol.unit and p.sieve_bytes
                        for p in pols.values()):
                    continue  # sieving is MPI-IO's: the same as "window"
                t0 = time.perf_counter()
                r = project_reader(layout, job, pol, st, kind, sample=sample)
                r["policy"] = pname if kind not in ("caffe", "dali") else "-"
                r["dataset"] = layout.name
                rows.append(r)
                if log:
                    log(f"  {layout.name} P={P} {kind} {r['policy']}: "
                        f"{r['epoch_s']:.2f} s ({time.perf_counter() - t0:.2f}"
                        " s to model)")
    return rows


def limits(layout, st, P=9216, rpn=36, bs=256):
    """The start-up and scale limits, with numbers, at P ranks."""
    L = layout.n_leaves
    nodes = -(-P // rpn)
    out = {}
    out["index_bytes_per_rank"] = 16 * L
    out["index_bytes_per_node"] = 16 * L * rpn
    # cooperative build: each rank reads L/P headers, all read the branches
    idx = index_build(layout, P, 0)
    out["branch_pages_per_rank"] = layout.n_branch
    out["branch_reads_machine"] = layout.n_branch * P
    out["leaf_headers_per_rank"] = idx["leaf_headers"]
    out["allgatherv_bytes_per_rank"] = 8 * L
    out["allgatherv_bytes_machine"] = 8 * L * P
    # recursive doubling / ring: about log2 P latency terms + 8L bytes each
    link = 12.5e9
    out["allgatherv_s"] = math.log2(P) * 5e-6 + 8 * L / link
    # every rank reads every branch page: the machine's start-up reads
    out["index_build_s"] = max(
        (idx["rounds"] + idx["requests"] / 4) * st.latency,
        layout.n_branch * P / st.fs_iops if st.fs_iops else 0,
        layout.n_branch * layout.psize * P / st.fs_bw if st.fs_bw else 0)
    out["index_build_s_branches_bcast"] = (
        (idx["rounds"] + idx["requests"] / 4) * st.latency
        + math.log2(P) * (5e-6 + 8 * L / link))
    out["cached_bcast_s"] = math.log2(P) * (5e-6 + 16 * L / link)
    per = -(-layout.n_records // P)
    steps = -(-per // bs)
    out["batches_per_rank"] = steps
    out["collectives_per_epoch"] = 5 * steps
    for q in (64, 1024):
        out[f"collectives_per_epoch_P{q}"] = 5 * -(-(-(-layout.n_records
                                                        // q)) // bs)
    # an allgather of a few bytes: about log2 P network latencies
    out["collective_s_each"] = math.log2(P) * 5e-6
    out["opens"] = P
    out["metadata_ops"] = P * OPEN_OPS
    out["metadata_s"] = _open_time(st, P, OPEN_OPS)
    out["metadata_s_one_per_node"] = _open_time(st, nodes, OPEN_OPS)
    return out


# --------------------------------------------------------------------------
# validation against the emulated shared filesystem
# --------------------------------------------------------------------------

def validate(args, log):
    """Run benches/bench_mpi.py's peers on FUSE mounts (one per emulated
    node), compare their counters with the model's.  Returns rows."""
    sys.path.insert(0, HERE)
    import bench_mpi
    import benchlib
    rows = []
    for ds, n in args.datasets:
        src = benchlib.dataset_path(ds, n)
        lay = _layout_cached(src)
        log(f"[scale_model] {ds}: {lay.summary()}")
        bs = args.batch_size or (256 if lay.vsize.mean() < 16 << 10 else 16)
        a = argparse.Namespace(n_records=lay.n_records, batch_size=bs)
        import tempfile
        import shutil
        work = tempfile.mkdtemp(prefix="lmdbio-scale-")
        cache = os.path.join(work, "index-cache")
        try:
            for delay in args.delays:
                nodes_max = max(args.sizes)
                st = bench_mpi.Storage("fuse", src, nodes_max, delay, 0,
                                       os.path.join(work, "mnt"))
                try:
                    for P in args.sizes:
                        for rpn in args.rpn:
                            if rpn > P:
                                continue
                            nodes = -(-P // rpn)
                            paths = st.paths(nodes)
                            for peer in args.peers:
                                if peer == "node_local" and rpn == 1:
                                    continue
                                if peer != "node_local" and rpn > 1 and \
                                        not args.all_rpn:
                                    continue
                                if peer in ("posix", "mpiio", "node_local"):
                                    bench_mpi.launch(a, peer, P, paths, rpn,
                                                     cache)  # warm index
                                st.make_cold()
                                r0, b0 = st.counters()
                                ranks = bench_mpi.launch(a, peer, P, paths,
                                                         rpn, cache)
                                r1, b1 = st.counters()
                                raw = dict(dataset=ds, records=n, P=P,
                                           rpn=rpn, batch_size=bs,
                                           peer=peer, delay_ms=delay,
                                           ranks=ranks, storage_req=r1 - r0,
                                           storage_bytes=b1 - b0)
                                rows.append(raw)
                                log("  " + format_row(compare_raw(raw, lay)))
                finally:
                    st.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return rows


_LAYOUTS = {}


def _layout_cached(path):
    if path not in _LAYOUTS:
        _LAYOUTS[path] = layout_from_file(path)
    return _LAYOUTS[path]


def compare_raw(raw, lay=None):
    """The comparison row of one stored run (validate()'s raw record)."""
    if lay is None:
        sys.path.insert(0, HERE)
        import benchlib
        lay = _layout_cached(benchlib.dataset_path(raw["dataset"],
                                                   raw["records"]))
    job = Job(P=raw["P"], ranks_per_node=raw["rpn"],
              batch_size=raw["batch_size"])
    row = compare(lay, job, raw["peer"], raw["ranks"], raw["storage_req"],
                  raw["storage_bytes"], raw["delay_ms"])
    row["dataset"] = f"{raw['dataset']}-{lay.n_records}"
    return row


def _step_time(fuse_reqs, q, d):
    """One step on the FUSE mount: each read becomes consecutive 128 KiB
    requests, served one after the other (the kernel fills the page cache
    in order); up to q reads of the step run side by side."""
    if not fuse_reqs:
        return 0.0
    return max(max(fuse_reqs), math.ceil(sum(fuse_reqs) / q)) * d


def _compare_lmdbio(lay, job, peer, ranks, d, pol):
    """The model's figures for the lmdbio readers' run under policy pol."""
    P, rpn = job.P, job.ranks_per_node
    row = {}
    app_req = app_bytes = model_req = model_bytes = 0
    f_req = f_bytes = 0
    caches = {}
    path = 0.0
    rebuilt = 0
    q = pol.threads if peer == "posix" else 1
    for rank in range(P):
        r = next(x for x in ranks if x["rank"] == rank)
        app_req += r["io_requests"] + r.get("mpi_requests", 0)
        app_bytes += r["io_bytes"] + r.get("mpi_bytes", 0)
        m = model_lmdbio_rank(lay, job, pol, rank, engine=peer)
        model_req += m["collectives"] if peer != "posix" else m["requests"]
        model_bytes += m["bytes"]
        c = caches.setdefault(rank // rpn, set())
        steps = list(m["reads"])
        if not r.get("index_from_cache", True):
            # the cached index was not found (FUSE inode numbers change
            # when the kernel forgets an inode): this rank rebuilt it
            idx = index_build(lay, 1 if peer == "posix" else P, rank,
                              reader_has_map(lay, job, rank, peer))
            model_req += idx["requests"]
            model_bytes += idx["bytes"]
            steps.insert(0, idx["reads"])
            rebuilt += 1
        t = 0.0
        for part in steps:
            per_read = []
            for rd in part:
                fr, fb = fuse_requests([rd], lay.psize, c)
                f_req += fr
                f_bytes += fb
                per_read.append(fr)
            t += _step_time([x for x in per_read if x], q, d)
        path = max(path, t)
    # opening reads the two meta pages (one request per node)
    f_req += job.nodes
    f_bytes += job.nodes * 2 * lay.psize
    row.update(app_req=app_req, model_app_req=int(model_req),
               app_bytes=app_bytes, model_app_bytes=int(model_bytes),
               model_storage_req=f_req, model_storage_bytes=f_bytes,
               model_wall=path, index_rebuilt=rebuilt)
    return row


def _candidates():
    """Plans the installed Reader may have made, the likeliest first: its
    windows, its policy per batch (MPI reads per batch), the older Reader's
    batches (64 KiB / 8 MiB)."""
    win = reader_policy()
    return [("window", win),
            ("batch", dataclasses.replace(win, unit="batch")),
            ("batch", Policy(unit="batch"))]


def compare(lay, job, peer, ranks, st_req, st_bytes, delay):
    """Model against measurement for one run.  app: what the ranks issued
    (lmdbio's own counters: pread requests of its pool, MPI-IO collective
    reads); storage: what reached the FUSE daemons.  The lmdbio readers are
    compared with the planning unit that matches their counters (a plan
    per batch, as the Reader does today, or per window), so the same
    validation serves before and after the Reader plans windows."""
    P, rpn = job.P, job.ranks_per_node
    row = dict(peer=peer, P=P, rpn=rpn, delay_ms=delay,
               wall=max(r["wall"] for r in ranks),
               meas_storage_req=st_req, meas_storage_bytes=st_bytes)
    d = delay * 1e-3
    if peer in ("posix", "mpiio", "node_local"):
        # The first plan whose counts match exactly; else the nearest (the
        # Reader's two prefetch lanes race to size the first windows, so a
        # windowed epoch may differ from the model's by a window or two).
        best = None
        for unit, pol in _candidates():
            got = _compare_lmdbio(lay, job, peer, ranks, d, pol)
            got["unit"] = unit
            err = abs(got["model_app_req"] - got["app_req"]) / max(
                1, got["app_req"])
            if err == 0 and got["app_bytes"] == got["model_app_bytes"]:
                best = (err, got)
                break
            if best is None or err < best[0]:
                got["unit"] = unit + ", nearest"
                best = (err, got)
        row.update(best[1])
    else:
        f_req = f_bytes = 0
        for node in range(job.nodes):
            m = model_mmap_rank(lay, job, peer, node * rpn, walk_values=True)
            f_req += m["node_requests"]
            f_bytes += m["node_bytes"]
        worst = model_mmap_rank(lay, job, peer, P - 1, walk_values=True)
        row.update(app_req=sum(r["majflt"] for r in ranks),
                   model_app_req=None, app_bytes=None, model_app_bytes=None,
                   model_storage_req=f_req, model_storage_bytes=f_bytes,
                   model_wall=worst["path_requests"] * d, index_rebuilt=0)
    return row


def format_validation(raws):
    """The validation table, then the delay-dependent part of wall time:
    d(wall)/d(delay) measured (a fit over the delays run) against the
    model's requests on the slowest rank's path."""
    rows = [compare_raw(r) for r in raws]
    out = ["", "# validation: model against the emulated shared filesystem "
           "(benches/bench_mpi.py peers on benches/fuse_latency.py mounts, "
           "one per emulated node; app = the Reader's own counters)"]
    out += [format_row(r) for r in rows]
    groups = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["peer"], r["P"], r["rpn"]),
                          []).append(r)
    fit = []
    for k, rs in groups.items():
        if len({r["delay_ms"] for r in rs}) < 2:
            continue
        x = np.array([r["delay_ms"] * 1e-3 for r in rs])
        y = np.array([r["wall"] for r in rs])
        ym = np.array([r["model_wall"] for r in rs])
        slope = np.polyfit(x, y, 1)[0]
        mslope = np.polyfit(x, ym, 1)[0]
        fit.append(f"{k[0]:14s} {k[1]:10s} P={k[2]} rpn={k[3]}: "
                   f"d(wall)/d(delay) measured {slope:8.0f}  model "
                   f"{mslope:8.0f}  ({slope / mslope if mslope else float('nan'):.2f}); "
                   f"wall at the smallest delay {y[np.argmin(x)]:.3f} s, "
                   f"model {ym[np.argmin(x)]:.3f} s")
    if fit:
        out += ["", "# wall time: the part that grows with the delay "
                "(requests on the slowest rank's path, in delays)"] + fit
    return "\n".join(out)


def format_row(r):
    def ratio(a, b):
        if a is None or b is None or not b:
            return "    -"
        return f"{a / b:5.2f}"
    unit = f"plan per {r['unit']} " if r.get("unit") else ""
    return (f"{r.get('dataset', ''):14s} {r['peer']:10s} P={r['P']} "
            f"{unit}rpn={r['rpn']} d={r['delay_ms']}ms | app req "
            f"{r['app_req']!s:>7} model {r['model_app_req']!s:>7} | app MB "
            f"{_mb(r['app_bytes']):>8} model {_mb(r['model_app_bytes']):>8} | "
            f"storage req {r['meas_storage_req']:>7} model "
            f"{r['model_storage_req']:>7} ({ratio(r['model_storage_req'], r['meas_storage_req'])}) | "
            f"MB {_mb(r['meas_storage_bytes'])} model "
            f"{_mb(r['model_storage_bytes'])} ({ratio(r['model_storage_bytes'], r['meas_storage_bytes'])}) | "
            f"wall {r['wall']:.3f} model {r['model_wall']:.3f} "
            f"({ratio(r['model_wall'], r['wall'])})"
            + (f" [index rebuilt on {r['index_rebuilt']} ranks]"
               if r.get("index_rebuilt") else ""))


def _mb(x):
    return "-" if x is None else f"{x / 1e6:.2f}"


# --------------------------------------------------------------------------
# plots and the command line
# --------------------------------------------------------------------------

def plot(rows, out_dir, log, tag=""):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("[scale_model] matplotlib is not installed: no plots "
            "(pip install matplotlib)")
        return []
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for ds in sorted({r["dataset"] for r in rows}):
        for what, ylab, fname in (
                ("epoch_s", "modelled epoch time (s)", "epoch"),
                ("machine_requests", "read requests per epoch, whole job",
                 "requests")):
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            for kind in READERS:
                for pol in ("batch", "window", "win-nods", "-"):
                    if pol == "win-nods" and kind == "posix":
                        continue
                    pts = sorted((r["P"], r[what]) for r in rows
                                 if r["dataset"] == ds and r["reader"] == kind
                                 and r["policy"] == pol)
                    if not pts:
                        continue
                    lab = kind if pol == "-" else f"{kind} (per {pol})"
                    ax.plot([p for p, _ in pts], [max(v, 1e-6) for _, v in pts],
                            marker="o", ms=3,
                            ls={"window": "--", "win-nods": ":"}.get(pol, "-"),
                            label=lab)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("ranks P (36 per node)")
            ax.set_ylabel(ylab)
            ax.set_title(f"{ds}: {ylab.split(' (')[0]}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            p = os.path.join(out_dir, f"scale-{ds}-{fname}{tag}.png")
            fig.savefig(p, dpi=110)
            plt.close(fig)
            written.append(p)
    # modelled I/O speedup over Caffe-style, next to the papers' figures
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for ds in sorted({r["dataset"] for r in rows}):
        base = {r["P"]: r["epoch_s"] for r in rows
                if r["dataset"] == ds and r["reader"] == "caffe"}
        for kind, pol in (("posix", "batch"), ("mpiio", "batch"),
                          ("node_local", "win-nods")):
            pts = sorted((r["P"], base[r["P"]] / r["epoch_s"]) for r in rows
                         if r["dataset"] == ds and r["reader"] == kind
                         and r["policy"] == pol and r["P"] in base)
            if pts:
                ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o",
                        ms=3, ls="-" if ds.startswith("imagenet") else "--",
                        label=f"{ds}: {kind} ({pol})")
    for P, x, lab in PAPERS:
        if P is None:  # no core count attached to the figure: a level
            ax.axhline(x, color="k", ls=":", lw=1)
            ax.annotate(lab, (1.2, x), textcoords="offset points",
                        xytext=(0, 3), fontsize=7)
            continue
        ax.scatter([P], [x], marker="*", s=120, color="k", zorder=5)
        ax.annotate(lab, (P, x), textcoords="offset points", xytext=(-150, 8),
                    fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ranks P (36 per node)")
    ax.set_ylabel("Caffe-style epoch time / reader's (I/O only)")
    ax.set_title("modelled I/O speedup over Caffe-style sharding")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    p = os.path.join(out_dir, f"scale-speedup{tag}.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


# The papers' reported speedups of whole Caffe training (not I/O alone):
# Pumma et al., LMDBIO, HPCC 2017 (up to 20x, drawn as a level: its core
# count is not restated here); ACM TOPC 2019 (up to 65x at 9,216 cores).
PAPERS = [(9216, 65, "TOPC 2019: 65x at 9,216 cores"),
          (None, 20, "HPCC 2017: up to 20x")]


def format_projection(rows):
    hdr = (f"{'dataset':13s} {'P':>5s} {'reader':10s} {'plan':8s} "
           f"{'epoch s':>9s} {'bound':12s} {'req/rank':>9s} {'MB/rank':>9s} "
           f"{'req size':>9s} {'in flight':>9s} {'job req':>10s} "
           f"{'job GB':>9s} {'walk':>9s} {'coll/ep':>8s} {'x caffe':>8s}")
    out = [hdr, "-" * len(hdr)]
    base = {(r["dataset"], r["P"]): r["epoch_s"] for r in rows
            if r["reader"] == "caffe"}
    for r in rows:
        x = base.get((r["dataset"], r["P"]))
        out.append(
            f"{r['dataset']:13s} {r['P']:>5d} {r['reader']:10s} "
            f"{r['policy']:8s} {r['epoch_s']:>9.2f} {r['bound']:12s} "
            f"{r['requests_rank']:>9.0f} {r['bytes_rank'] / 1e6:>9.1f} "
            f"{_kib(r['request_size']):>9s} {r['in_flight']:>9d} "
            f"{r['machine_requests']:>10.3g} {r['machine_bytes'] / 1e9:>9.1f} "
            f"{r['walk_steps']:>9d} {r.get('collectives', 0):>8.0f} "
            f"{(x / r['epoch_s']) if x else float('nan'):>8.1f}")
    return "\n".join(out)


def _kib(b):
    return f"{b / 1024:.0f} KiB" if b < (1 << 20) else f"{b / 2**20:.1f} MiB"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--project-only", action="store_true",
                    help="skip the FUSE validation (seconds)")
    ap.add_argument("--quick", action="store_true",
                    help="validate P = 1, 2, 4 at one delay")
    ap.add_argument("--layout", help="print the model of this database")
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--delays", default="0.2,0.5,1")
    ap.add_argument("--peers", default=",".join(READERS))
    ap.add_argument("--rpn", default="1,2",
                    help="ranks per emulated node (node_local needs 2+)")
    ap.add_argument("--all-rpn", action="store_true",
                    help="run every peer at every rpn (default: rpn > 1 only "
                         "for node_local)")
    ap.add_argument("--datasets", default="cifar:20000,big:400",
                    help="name:records,... (benches/datasets.py)")
    ap.add_argument("--batch-size", type=int, default=0,
                    help="0: 256, or 16 for big values")
    ap.add_argument("--plots", default=os.path.join(REPO, "docs", "img"))
    ap.add_argument("--storage", default="pfs", choices=sorted(STORAGES),
                    help="the projection's storage figures: pfs (1 ms per "
                         "request), fast (0.2 ms), slow (5 ms)")
    ap.add_argument("--json", help="write the runs and the projection here")
    ap.add_argument("--from-json", action="append", default=[],
                    help="print the validation of runs stored by --json "
                         "(no new runs); repeatable")
    a = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    if a.layout:
        lay = layout_from_file(a.layout)
        print(json.dumps(lay.summary(), indent=1))
        return 0
    out = {}
    if a.from_json:
        raws = []
        for fn in a.from_json:
            with open(fn) as f:
                raws += json.load(f).get("validation", [])
        print(format_validation(raws))
        if a.project_only:
            return 0
    elif not a.project_only:
        a.sizes = [int(x) for x in a.sizes.split(",")]
        a.delays = [float(x) for x in a.delays.split(",")]
        a.peers = a.peers.split(",")
        a.rpn = [int(x) for x in a.rpn.split(",")]
        try:
            a.datasets = [(x.split(":")[0], int(x.split(":")[1]))
                          for x in a.datasets.split(",")]
        except (IndexError, ValueError):
            raise ValueError(f"--datasets {a.datasets!r}: give NAME:RECORDS"
                             ",... (e.g. cifar:20000,big:400)") from None
        if a.quick:
            a.sizes, a.delays = [1, 2, 4], [0.5]
        raws = validate(a, log)
        out["validation"] = raws
        print(format_validation(raws))
    pols = _projection_policies()
    st = STORAGES[a.storage]
    t0 = time.perf_counter()
    proj = []
    for lay in (imagenet_layout(), cifar_layout()):
        proj += project(lay, st, pols)
    out["projection"] = proj
    print(f"\n# projection: {st.name}, {st.latency * 1e3:g} ms per "
          f"request, {st.node_bw / 1e9:g} GB/s per node, "
          f"{st.fs_bw / 1e9:g} GB/s shared cap, "
          f"{st.fs_iops:g} requests/s cap; 36 ranks per node; batch 256 "
          f"per rank; index cached ({time.perf_counter() - t0:.1f} s)")
    print(format_projection(proj))
    for lay in (imagenet_layout(), cifar_layout()):
        lim = limits(lay, st)
        out.setdefault("limits", {})[lay.name] = lim
        print(f"\n# limits at 9,216 ranks, {lay.name} "
              f"({lay.n_leaves} leaves, {lay.n_branch} branch pages):")
        for k, v in lim.items():
            print(f"  {k:28s} {v:.4g}")
    written = plot(proj, a.plots, log,
                   tag="" if a.storage == "pfs" else "-" + a.storage)
    for p in written:
        print(f"wrote {os.path.relpath(p, REPO)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=lambda o: (
                o.tolist() if hasattr(o, "tolist") else str(o)))
    return 0


def _cli(argv=None):
    """main(), with a one-line message instead of a traceback for what a
    user can fix (a missing database, no FUSE, a malformed option)."""
    try:
        return main(argv)
    except (OSError, RuntimeError, ValueError, IndexError) as e:
        print(f"scale_model: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # lmdbio's errors (not a bug of this script)
        if type(e).__module__.startswith("lmdbio"):
            print(f"scale_model: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(_cli())
