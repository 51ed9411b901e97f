"""``lmdbio bench``: lmdbio side by side with its peers, interleaved.

    lmdbio bench PATH [PATH ...] [--fresh] [--modes hot,cold] [--rounds N]
                 [--peers pread,py-lmdb,lmdbio,...] [--plot FILE.png]

For each database and mode every peer runs once per round, the order
alternating A B C / C B A between rounds; hot runs follow one untimed
warm-up run of every peer, cold runs each follow a page-cache drop (``echo 3
> /proc/sys/vm/drop_caches`` as root, else ``posix_fadvise(DONTNEED)`` on
data.mdb and the index cache files; untimed).  Only ratios measured side by
side in one run are worth quoting.

Where the peers run:

  (default)   every run in this process, one after the other
  --fresh     every run of every peer in a new ``python`` process, as users'
              jobs run: the child imports its modules (untimed, until the
              process is idle: numpy's BLAS thread spins ~0.1 s after the
              import), then times open + the read + close and reports its
              timing as JSON

Peers (``--peers``):

  pread            the limit: sequential pread of data.mdb in page-aligned
                   4 MiB blocks into one reused buffer
  py-lmdb          open, ``for k, v in txn.cursor()``, close (py-lmdb)
  lmdbio           the same code with ``import lmdbio as lmdb`` (drop-in)
  lmdbio-reader    every record through ``lmdbio.Reader`` (one epoch)
  py-lmdb-get      ``txn.get(key)`` for every record in a shuffled order
                   (the permutation ``Reader(shuffle=True)`` uses, epoch 0)
  lmdbio-get       the same loop with ``import lmdbio as lmdb`` (drop-in)
  lmdbio-shuffled  ``lmdbio.Reader(shuffle=True)``: the same order
  dali-shard       shard start, DALI-style: open, step a py-lmdb cursor from
                   the first record to shard RANK's start, read one batch
  caffe-shard      shard start, Caffe-style: walk the cursor from the first
                   record keeping records i % WORLD == RANK until one batch
  reader-shard     shard start: ``Reader(rank=RANK, world_size=WORLD)``,
                   open + first batch
  (shard peers: RANK/WORLD from ``--shard``, default 7/8, the last shard;
  their time is open to first batch, closing untimed)

Every Reader peer is measured in two forms, side by side:

  NAME/first   a first start: an empty index cache (a new temporary
               index_cache directory per run), so the record index is built
               from data.mdb inside the timed run (and written)
  NAME/later   a later start: the index cache was filled by an untimed run
               before the rounds (what a second epoch or job sees); cold
               runs evict the cache file too

Before timing, an untimed check compares what each lmdbio peer yields with
py-lmdb's records (count and CRC32 of keys and values, in the order the peer
yields them; Reader peers in both forms); ``--no-verify`` skips it.

Reported per row: median records/s and GB/s (data.mdb bytes / s), cpu/wall
(process CPU time, all threads, over wall time), and ratios ``x PEER`` = the
median over rounds of t(PEER) / t(row) measured in the same round (> 1: the
row is faster), with the min-max over rounds; ``cpu x py-lmdb`` the same
with CPU time (the steadier measure on a busy machine).  Cold rows add the
MB read from storage per run (``/proc/self/io`` read_bytes of the process
that ran it).  Reader peers use ``--batch-size`` (default ``auto``: 256
records, fewer for big values so that a batch is about 4 MiB).

``--plot FILE.png`` draws the ratios (needs matplotlib: ``pip install
matplotlib`` or ``pip install 'lmdbio[plot]'``).  ``--dataset NAME``
(small, cifar, big, shuffled) is the benchmark datasets of lmdbio's source
checkout: it runs the checkout's ``benches/compare.py`` (found in
``./benches`` or at ``$LMDBIO_BENCHES``), which generates and caches them.

Environment: ``LMDBIO_BENCH_IMPL=lmdb`` makes py-lmdb stand in for the lmdbio
peers (to debug the suite).
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

__all__ = ["main", "compare", "format_table", "RawPread", "cursor_walk",
           "reader_walk", "drop_cache", "proc_io", "describe", "plot"]

BLOCK = 4 << 20          # raw pread block size (page-aligned buffer)
BATCH_BYTES = 4 << 20    # target batch size in bytes for --batch-size auto
DEFAULT_BATCH = 256
DEFAULT_SHARD = (7, 8)   # rank, world size of the shard-start peers

# How every cursor peer opens the environment: read-only, no lock file
# (immutable dataset), py-lmdb's default readahead (its best case for a
# sequential walk).
OPEN_KW = dict(readonly=True, lock=False, readahead=True)

ALL_PEERS = ["pread", "py-lmdb", "lmdbio", "lmdbio-reader", "py-lmdb-get",
             "lmdbio-get", "lmdbio-shuffled", "dali-shard", "caffe-shard",
             "reader-shard"]
DEFAULT_PEERS = ["pread", "py-lmdb", "lmdbio", "lmdbio-reader"]
READER_PEERS = ("lmdbio-reader", "lmdbio-shuffled", "reader-shard")
SHARD_PEERS = ("dali-shard", "caffe-shard", "reader-shard")
FORMS = ("first", "later")
# Ratio columns, in this order, for the baselines present in a run.
BASELINES = ["py-lmdb", "pread", "py-lmdb-get", "dali-shard"]


class BenchError(Exception):
    """Bad input or a failed check: reported as one line, no traceback."""


# --------------------------------------------------------------------------
# cold cache and accounting
# --------------------------------------------------------------------------


def data_file(path: str) -> str:
    return os.path.join(path, "data.mdb") if os.path.isdir(path) else path


def _fadvise_dontneed(path: str):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_cache(*paths: str, method: str = "auto") -> str:
    """Evict PATHS (files, or environment directories: their data.mdb) from
    the page cache.  method "auto": ``echo 3 > /proc/sys/vm/drop_caches``
    when permitted (root), else ``posix_fadvise(DONTNEED)`` on each file.
    Returns the method used: "drop_caches" or "fadvise".

    Pages mapped by a live mmap (an open py-lmdb environment) survive both:
    close environments before dropping.
    """
    files = [data_file(p) for p in paths]
    os.sync()
    if method in ("auto", "drop_caches"):
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return "drop_caches"
        except OSError:
            if method == "drop_caches":
                raise
    for f in files:
        _fadvise_dontneed(f)
    return "fadvise"


def proc_io() -> dict:
    """/proc/self/io (read_bytes: bytes this process caused to be read from
    storage, page faults and threads included)."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (ln.split(":") for ln in f)}
    except OSError:
        return {}


def machine_info(repo: str | None = None) -> dict:
    info = dict(python=platform.python_version(), kernel=platform.release(),
                cpus=os.cpu_count(), time=time.strftime("%Y-%m-%d %H:%M:%S %z"))
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    info["cpu"] = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if repo:
        try:
            info["commit"] = subprocess.run(
                ["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                capture_output=True, text=True, timeout=5).stdout.strip()
        except Exception:
            pass
    return info


# --------------------------------------------------------------------------
# the peers (what is timed)
# --------------------------------------------------------------------------

def impl_name() -> str:
    return os.environ.get("LMDBIO_BENCH_IMPL", "lmdbio")


_lmdbio = None


def lmdbio_module():
    """The module behind the "lmdbio" peers (lmdbio, or py-lmdb with
    LMDBIO_BENCH_IMPL=lmdb).  Raises ImportError when unavailable."""
    global _lmdbio
    if _lmdbio is None:
        name = impl_name()
        if name not in ("lmdbio", "lmdb"):
            raise ValueError(f"LMDBIO_BENCH_IMPL must be lmdbio or lmdb, not {name!r}")
        _lmdbio = __import__(name)
    return _lmdbio


def pylmdb_module():
    import lmdb
    return lmdb


def cursor_walk(mod, path: str, open_kw=None) -> int:
    """The drop-in benchmark, as users write it: open, begin, iterate the
    cursor yielding (key, value), close.  Returns the record count."""
    kw = dict(OPEN_KW)
    if open_kw:
        kw.update(open_kw)
    n = 0
    env = mod.open(path, **kw)
    try:
        with env.begin() as txn:
            for k, v in txn.cursor():
                n += 1
    finally:
        env.close()
    return n


def reader_epoch(mod, path: str, batch_size: int = DEFAULT_BATCH, **kw):
    """lmdbio's bulk path: every record of one epoch through Reader (open,
    iterate, close; ``kw``: more Reader arguments, e.g. shuffle=True).
    Returns (records, whether the index came from the cache)."""
    n = 0
    kw.setdefault("lock", False)
    with mod.Reader(path, batch_size=batch_size, **kw) as r:
        for b in r:
            n += len(b.indices)
        cached = bool(getattr(r, "index_from_cache", False))
    return n, cached


def reader_walk(mod, path: str, batch_size: int = DEFAULT_BATCH, **kw) -> int:
    """:func:`reader_epoch`'s record count."""
    return reader_epoch(mod, path, batch_size, **kw)[0]


def shard_start(n: int, rank: int, world: int) -> tuple:
    """(first ordinal, records) of shard RANK of WORLD in key order: the
    Reader's sharding rule (contiguous shards of ceil(n / world) records,
    the last wrapping around to the start), written out here on its own so
    that the bench checks the Reader against the rule, not against itself."""
    if n == 0:
        return 0, 0
    per = -(-n // world)
    return rank * per, per


def dali_first_batch(mod, path, rank, world, batch_size, open_kw=None):
    """DALI-style shard start: open, step the cursor from the first record to
    this rank's shard start, then read one batch.  The steps run inside
    py-lmdb's C iterator (keys only, consumed by a C-level deque), the
    cheapest walk py-lmdb offers: close to DALI's C++ loop of
    mdb_cursor_get(MDB_NEXT).  Returns (batch, seconds to the batch); the
    environment is closed after the clock stops."""
    import collections
    import itertools
    kw = dict(OPEN_KW)
    kw.update(open_kw or {})
    t0 = time.perf_counter()
    env = mod.open(path, **kw)
    try:
        with env.begin() as txn:
            n = txn.stat()["entries"]
            start, per = shard_start(n, rank, world)
            cur = txn.cursor()
            cur.first()
            collections.deque(itertools.islice(
                cur.iternext(keys=True, values=False), start % max(n, 1)),
                maxlen=0)
            need = min(batch_size, per)
            batch = list(itertools.islice(cur.iternext(), need))
            if len(batch) < need and cur.first():  # the last shard wraps
                batch += itertools.islice(cur.iternext(), need - len(batch))
            dt = time.perf_counter() - t0
    finally:
        env.close()
    return batch, dt


def caffe_first_batch(mod, path, rank, world, batch_size, open_kw=None):
    """Caffe-style shard start (Caffe's DataReader with WORLD solvers): walk
    the cursor from the first record, keeping records i % WORLD == RANK,
    until one batch is full.  Returns (batch, seconds to the batch)."""
    kw = dict(OPEN_KW)
    kw.update(open_kw or {})
    t0 = time.perf_counter()
    env = mod.open(path, **kw)
    batch = []
    try:
        with env.begin() as txn:
            for i, kv in enumerate(txn.cursor()):
                if i % world == rank:
                    batch.append(kv)
                    if len(batch) == batch_size:
                        break
            dt = time.perf_counter() - t0
    finally:
        env.close()
    return batch, dt


def reader_first_batch(mod, path, rank, world, batch_size, **kw):
    """Reader shard start: open (index from the cache, or built), first
    batch of shard RANK.  Returns (batch, seconds to it, index from cache);
    closing (stopping the prefetch thread) is not timed."""
    kw.setdefault("lock", False)
    t0 = time.perf_counter()
    r = mod.Reader(path, rank=rank, world_size=world, batch_size=batch_size,
                   **kw)
    try:
        b = next(iter(r), None)
        dt = time.perf_counter() - t0
        return b, dt, bool(getattr(r, "index_from_cache", False))
    finally:
        r.close()


def walk_digest(mod, path: str, open_kw=None):
    """(count, crc32 of all keys and values) of a cursor walk: correctness
    check of one peer against another (untimed)."""
    kw = dict(OPEN_KW)
    if open_kw:
        kw.update(open_kw)
    n, crc = 0, 0
    env = mod.open(path, **kw)
    try:
        with env.begin() as txn:
            for k, v in txn.cursor():
                crc = zlib.crc32(v, zlib.crc32(k, crc))
                n += 1
    finally:
        env.close()
    return n, crc


def _items(values):
    """A batch's values (or keys) as a list of bytes."""
    if hasattr(values, "tolist") and hasattr(values, "offsets"):
        return values.tolist()
    return [bytes(memoryview(v)) for v in values]


def batch_digest(batches, n=0, crc=0):
    """(count, crc32) over the (key, value) pairs of Reader batches, in the
    order they come."""
    for b in batches:
        if b is None:
            continue
        if b.keys is None:
            raise BenchError("the Reader gave no keys: cannot check its content")
        for k, v in zip(_items(b.keys), _items(b.values)):
            crc = zlib.crc32(v, zlib.crc32(k, crc))
            n += 1
    return n, crc


def pairs_digest(pairs, n=0, crc=0):
    for k, v in pairs:
        crc = zlib.crc32(v, zlib.crc32(k, crc))
        n += 1
    return n, crc


class RawPread:
    """The limit: sequential pread of data.mdb in page-aligned BLOCK-byte
    blocks into one reused anonymous-mmap buffer (page aligned: a copy from
    the page cache runs fastest into an aligned destination)."""

    def __init__(self, block: int = BLOCK):
        self.block = block
        self.buf = mmap.mmap(-1, block)  # used only as an aligned buffer
        self.mv = memoryview(self.buf)
        self.buf[:] = b"\0" * block  # fault the buffer in once

    def __call__(self, path: str) -> int:
        fd = os.open(data_file(path), os.O_RDONLY)
        try:
            off, mv, preadv = 0, [self.mv], os.preadv
            while True:
                n = preadv(fd, mv, off)
                if n <= 0:
                    break
                off += n
        finally:
            os.close(fd)
        return off


def shuffled_order(n: int, seed: int = 0, epoch: int = 0):
    """The permutation of ``Reader(shuffle=True, seed=seed)`` in ``epoch``
    (the documented rule: numpy's PCG64 seeded with [seed, epoch])."""
    import numpy as np
    return np.random.default_rng([seed, epoch]).permutation(n)


def all_keys(mod, path: str, open_kw=None) -> list:
    """Every key in order (untimed setup of the get-loop peer)."""
    kw = dict(OPEN_KW)
    if open_kw:
        kw.update(open_kw)
    env = mod.open(path, **kw)
    try:
        with env.begin() as txn:
            return list(txn.cursor().iternext(keys=True, values=False))
    finally:
        env.close()


def save_keys(keys, file):
    """Keys (a list of bytes) to FILE: lengths (uint32), then the bytes."""
    import numpy as np
    lens = np.fromiter((len(k) for k in keys), dtype=np.uint32, count=len(keys))
    with open(file, "wb") as f:
        f.write(len(keys).to_bytes(8, "little"))
        f.write(lens.tobytes())
        f.write(b"".join(keys))


def load_keys(file):
    import numpy as np
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        lens = np.frombuffer(f.read(4 * n), dtype=np.uint32)
        data = f.read()
    ends = np.cumsum(lens, dtype=np.int64).tolist()
    out, start = [], 0
    for e in ends:
        out.append(data[start:e])
        start = e
    return out


class GetLoop:
    """``txn.get(key)`` for every key in a given order (py-lmdb, or lmdbio
    as a drop-in): what a map-style dataset does in a shuffled epoch."""

    def __init__(self, mod, keys, open_kw=None):
        self.mod = mod
        self.keys = keys
        self.open_kw = dict(OPEN_KW)
        if open_kw:
            self.open_kw.update(open_kw)

    def __call__(self, path: str) -> int:
        n = 0
        env = self.mod.open(path, **self.open_kw)
        try:
            with env.begin() as txn:
                get = txn.get
                for k in self.keys:
                    if get(k) is not None:
                        n += 1
        finally:
            env.close()
        return n


def prepare(spec, keys=None):
    """Untimed setup of one run of a peer; returns fn() -> (count, info).
    ``info`` may hold "seconds" (a peer timing only part of its call, the
    shard starts) and "index_from_cache" (Reader peers).  SPEC (JSON-able,
    so that a child process gets the same): peer, path, batch, open_kw,
    index_cache, shard, keys_file."""
    peer, path = spec["peer"], spec["path"]
    okw = spec.get("open_kw") or {}
    bs = spec.get("batch") or DEFAULT_BATCH
    rank, world = spec.get("shard") or DEFAULT_SHARD
    if peer == "pread":
        raw = RawPread()
        return lambda: (raw(path), {})
    if peer in ("py-lmdb", "lmdbio"):
        mod = pylmdb_module() if peer == "py-lmdb" else lmdbio_module()
        return lambda: (cursor_walk(mod, path, okw), {})
    if peer in ("py-lmdb-get", "lmdbio-get"):
        loop = GetLoop(pylmdb_module() if peer == "py-lmdb-get" else lmdbio_module(),
                       keys if keys is not None else load_keys(spec["keys_file"]),
                       okw)
        return lambda: (loop(path), {})
    if peer in ("dali-shard", "caffe-shard"):
        mod = pylmdb_module()
        walk = dali_first_batch if peer == "dali-shard" else caffe_first_batch

        def shard():
            batch, dt = walk(mod, path, rank, world, bs, okw)
            return len(batch), dict(seconds=dt)
        return shard
    mod = lmdbio_module()
    mod.Reader  # noqa: B018  (import the Reader's modules before timing)
    kw = dict(index_cache=spec.get("index_cache") or False)
    if peer == "reader-shard":
        def first():
            b, dt, cached = reader_first_batch(mod, path, rank, world, bs, **kw)
            return (0 if b is None else len(b)), dict(seconds=dt,
                                                       index_from_cache=cached)
        return first
    if peer == "lmdbio-shuffled":
        kw.update(shuffle=True, seed=0)

    def epoch():
        n, cached = reader_epoch(mod, path, bs, **kw)
        return n, dict(index_from_cache=cached)
    return epoch


# --------------------------------------------------------------------------
# one timed run: in this process, or in a fresh one
# --------------------------------------------------------------------------

def _timed(fn):
    io0 = proc_io().get("read_bytes", 0)
    c0 = time.process_time()
    t0 = time.perf_counter()
    n, info = fn()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    res = dict(count=n, seconds=dt, cpu=cpu, pid=os.getpid(),
               read_bytes=proc_io().get("read_bytes", 0) - io0)
    res.update(info)
    return res


# The child: load this file by path (works for the installed module and for
# benches/ loading a checkout's copy) and run _child on the spec.
_CHILD = ("import importlib.util as u, sys; "
          "s = u.spec_from_file_location('lmdbio_bench_child', sys.argv[1]); "
          "m = u.module_from_spec(s); s.loader.exec_module(m); "
          "sys.exit(m._child(sys.argv[2]))")


def _child(spec_json: str) -> int:
    """In a fresh process: imports and setup untimed, then one timed run;
    prints its result as one JSON line."""
    spec = json.loads(spec_json)
    import numpy  # noqa: F401  (every peer's imports happen before timing)
    fn = prepare(spec)
    settle()
    print(json.dumps(_timed(fn)), flush=True)
    return 0


def settle(step=0.02, idle=0.2, limit=2.0):
    """Wait until this process is idle: numpy's OpenBLAS thread spins on a
    core for ~0.1 s after the import, which would land in the timed run of
    whichever peer comes first (and take a core from a threaded one).  The
    import is untimed, so is its tail.  (Self-contained: child_source runs
    it in other interpreters.)"""
    import time
    end = time.perf_counter() + limit
    while time.perf_counter() < end:
        c0 = time.process_time()
        time.sleep(step)
        if time.process_time() - c0 < idle * step:
            return


def child_source(body: str) -> str:
    """Source of a timed child for any interpreter (lmdbio need not be
    installed there): settle() defined, then `body`."""
    import inspect
    return inspect.getsource(settle) + "\n\n" + body


def run_fresh(spec, timeout=3600):
    """One run of SPEC's peer in a new python process; its JSON result."""
    flags = ["-P"] if sys.version_info >= (3, 11) else []
    cmd = [sys.executable, *flags, "-c", _CHILD, os.path.abspath(__file__),
           json.dumps(spec)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BenchError(f"{spec['peer']}: the child process failed "
                         f"(exit {p.returncode}): {last}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_inproc(spec, keys=None):
    return _timed(prepare(spec, keys))


# --------------------------------------------------------------------------
# databases
# --------------------------------------------------------------------------

def check_path(path: str):
    """Bad input as one line: not a directory, no data.mdb."""
    if not os.path.exists(path):
        raise BenchError(f"{path}: no such file or directory (give the "
                         "directory of an LMDB environment)")
    if not os.path.isdir(path):
        raise BenchError(f"{path}: not a directory (give the directory that "
                         "holds the environment's data.mdb)")
    if not os.path.isfile(os.path.join(path, "data.mdb")):
        raise BenchError(f"{path}: no data.mdb in this directory (give the "
                         "directory of an LMDB environment)")


def describe(path: str) -> dict:
    """name, records, file_bytes, value_bytes of an environment directory:
    from the benchmark dataset's meta.json when there is one, else counted
    (entries from the main database's stat, value bytes not known)."""
    path = os.fspath(path)
    meta_file = os.path.join(path, "meta.json")
    if os.path.exists(meta_file):
        with open(meta_file) as f:
            m = json.load(f)
        if "records" in m and "file_bytes" in m:
            m.setdefault("name", os.path.basename(os.path.normpath(path)))
            m["path"] = path
            return m
    mod = lmdbio_module()
    try:
        env = mod.open(path, **OPEN_KW)
        try:
            n = env.stat()["entries"]
        finally:
            env.close()
    except Exception as e:  # lmdbio.Error, lmdb.Error: not an LMDB file
        raise BenchError(f"{path}: cannot be read as an LMDB environment "
                         f"({str(e).strip() or type(e).__name__}); give the "
                         "directory of an LMDB environment") from None
    return dict(name=os.path.basename(os.path.normpath(path)), records=n,
                file_bytes=os.path.getsize(data_file(path)), path=path)


def auto_batch_size(desc: dict) -> int:
    """256 records, or fewer when that would exceed about BATCH_BYTES
    (big values: about 4 MiB per batch, e.g. 22 records of 180 KiB)."""
    per = None
    if desc.get("value_bytes") and desc.get("records"):
        per = desc["value_bytes"] / desc["records"]
    elif desc.get("records"):
        per = desc["file_bytes"] / desc["records"]
    if not per:
        return DEFAULT_BATCH
    return int(max(1, min(DEFAULT_BATCH, round(BATCH_BYTES / per))))


class Row:
    """One line of the table: a peer, in a form for Reader peers."""

    def __init__(self, peer, form, spec, expect, unit):
        self.peer = peer
        self.form = form
        self.name = peer if form is None else f"{peer}/{form}"
        self.spec = spec
        self.expect = expect
        self.unit = unit
        self.batch = spec.get("batch") if peer in READER_PEERS else None


class Suite:
    """The rows of one database, with what their runs need: the get-loop's
    keys (in memory and in a file for child processes), the index cache
    directories of the Reader forms."""

    def __init__(self, names, desc, open_kw=None, batch_size=None,
                 shard=DEFAULT_SHARD, workdir=None, log=None):
        self.desc = desc
        self.path = desc["path"]
        self.workdir = workdir or tempfile.mkdtemp(prefix="lmdbio-bench-")
        self._own_workdir = workdir is None
        self.later_dir = os.path.join(self.workdir, "index-later")
        self.keys = None
        self.rows = []
        try:
            self._add_rows(names, open_kw, batch_size or auto_batch_size(desc),
                           shard, log)
        except BaseException:
            self.close()
            raise

    def _add_rows(self, names, open_kw, bs, shard, log):
        desc = self.desc
        n = desc["records"]
        rank, world = shard
        base = dict(path=self.path, open_kw=dict(open_kw or {}),
                    shard=[rank, world])
        has_reader = True
        for name in names:
            if name not in ALL_PEERS:
                raise BenchError(f"unknown peer {name!r} (known: "
                                 f"{', '.join(ALL_PEERS)})")
            spec = dict(base, peer=name, batch=bs)
            if name == "pread":
                self.rows.append(Row(name, None, spec, desc["file_bytes"], "bytes"))
                continue
            if name == "caffe-shard":
                expect = min(bs, len(range(rank, n, world)))
            elif name in SHARD_PEERS:
                expect = min(bs, shard_start(n, rank, world)[1])
            else:
                expect = n
            if name in READER_PEERS:
                if has_reader and not hasattr(lmdbio_module(), "Reader"):
                    has_reader = False
                    if log:
                        log(f"[bench] {impl_name()} has no Reader: skipping "
                            "the Reader peers")
                if not has_reader:
                    continue
                for form in FORMS:
                    s = dict(spec)
                    s["index_cache"] = self.later_dir if form == "later" else None
                    self.rows.append(Row(name, form, s, expect, "records"))
                continue
            if name in ("py-lmdb-get", "lmdbio-get"):
                if self.keys is None:
                    ks = all_keys(pylmdb_module(), self.path, open_kw)
                    self.keys = [ks[i] for i in shuffled_order(len(ks)).tolist()]
                    save_keys(self.keys, os.path.join(self.workdir, "keys.bin"))
                spec["keys_file"] = os.path.join(self.workdir, "keys.bin")
            self.rows.append(Row(name, None, spec, expect, "records"))

    def run_spec(self, row):
        """The spec of one run: a first start gets a new, empty index cache
        directory (removed by :meth:`done`)."""
        spec = dict(row.spec)
        if row.form == "first":
            spec["index_cache"] = tempfile.mkdtemp(prefix="index-first-",
                                                   dir=self.workdir)
        return spec

    def done(self, spec):
        if spec.get("index_cache") and spec["index_cache"] != self.later_dir:
            shutil.rmtree(spec["index_cache"], ignore_errors=True)

    def prime(self):
        """Fill the later-start index cache (untimed).  A shuffled Reader
        builds and saves the whole index at its open; one in key order
        would count the leaves only as an epoch reads them."""
        if any(r.form == "later" for r in self.rows):
            os.makedirs(self.later_dir, exist_ok=True)
            mod = lmdbio_module()
            with mod.Reader(self.path, batch_size=DEFAULT_BATCH, lock=False,
                            shuffle=True, seed=0,
                            index_cache=self.later_dir):
                pass

    def cache_files(self):
        if not os.path.isdir(self.later_dir):
            return []
        return [os.path.join(self.later_dir, f) for f in os.listdir(self.later_dir)]

    def close(self):
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


# --------------------------------------------------------------------------
# the content check (untimed)
# --------------------------------------------------------------------------

def reference_digest(path, positions=None, keys=None, open_kw=None):
    """py-lmdb's (count, crc32) of the records at ordinals POSITIONS (None:
    every record in key order)."""
    lmdb = pylmdb_module()
    if positions is None:
        return walk_digest(lmdb, path, open_kw)
    keys = keys if keys is not None else all_keys(lmdb, path, open_kw)
    kw = dict(OPEN_KW)
    kw.update(open_kw or {})
    env = lmdb.open(path, **kw)
    try:
        with env.begin() as txn:
            return pairs_digest((keys[p], txn.get(keys[p])) for p in positions)
    finally:
        env.close()


def verify(suite, open_kw=None, log=None):
    """Untimed: every lmdbio row yields exactly py-lmdb's records, in the
    order it promises (count and CRC32 of keys and values).  The py-lmdb
    rows are the oracle itself, pread is checked by its byte count."""
    rows = [r for r in suite.rows if r.peer in ("lmdbio",) + READER_PEERS]
    if not rows:
        return {}
    path, n = suite.path, suite.desc["records"]
    rank, world = rows[0].spec["shard"]
    ref, keys, checked = {}, None, {}

    def expected(peer, bs):
        nonlocal keys
        if peer in ("lmdbio", "lmdbio-reader"):
            if "scan" not in ref:
                ref["scan"] = reference_digest(path, open_kw=open_kw)
            return ref["scan"]
        if keys is None:
            keys = all_keys(pylmdb_module(), path, open_kw)
        if peer == "lmdbio-shuffled":
            if "shuffled" not in ref:
                ref["shuffled"] = reference_digest(
                    path, shuffled_order(n).tolist(), keys, open_kw)
            return ref["shuffled"]
        start, per = shard_start(n, rank, world)
        pos = [(start + j) % n for j in range(min(bs, per))]
        return reference_digest(path, pos, keys, open_kw)

    mod = lmdbio_module()
    for row in rows:
        spec = suite.run_spec(row)
        try:
            if row.peer == "lmdbio":
                got = walk_digest(mod, path, open_kw)
            else:
                kw = dict(index_cache=spec.get("index_cache") or False,
                          lock=False)
                if row.peer == "reader-shard":
                    b, _, cached = reader_first_batch(
                        mod, path, rank, world, row.spec["batch"], **kw)
                    got = batch_digest([b])
                else:
                    if row.peer == "lmdbio-shuffled":
                        kw.update(shuffle=True, seed=0)
                    with mod.Reader(path, batch_size=row.spec["batch"], **kw) as r:
                        got = batch_digest(r)
        finally:
            suite.done(spec)
        want = expected(row.peer, row.spec["batch"])
        if got != want:
            raise BenchError(f"MISMATCH on {path}: {row.name} gave (count, crc32) "
                             f"{got}, py-lmdb {want}")
        checked[row.name] = got
        if log:
            log(f"[bench] {row.name}: {got[0]} records, same content as py-lmdb")
    return checked


# --------------------------------------------------------------------------
# the interleaved runs
# --------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr (only when it is a terminal)."""

    def __init__(self, total, err, enabled):
        self.total = max(total, 1)
        self.done = 0
        self.err = err
        self.enabled = enabled

    def step(self, what):
        self.done += 1
        if not self.enabled:
            return
        width = 24
        fill = width * self.done // self.total
        self.err(f"\r[{'#' * fill}{'.' * (width - fill)}] "
                 f"{self.done}/{self.total} {what[:60]:60s}")
        if self.done >= self.total:
            self.err("\n")


def run_rounds(suite, mode, rounds, fresh=False, drop_method="auto",
               log=None, progress=None):
    """{row name: [run, ...]}: every row once per round, order alternating."""
    path = suite.path
    rows = suite.rows
    runs = {r.name: [] for r in rows}
    cold = mode == "cold"

    def one(row, timed):
        spec = suite.run_spec(row)
        try:
            method = None
            if cold and timed:
                method = drop_cache(path, *suite.cache_files(), method=drop_method)
            res = run_fresh(spec) if fresh else run_inproc(spec, suite.keys)
        finally:
            suite.done(spec)
        if res["count"] != row.expect:
            raise BenchError(f"{path}: {row.name} read {res['count']} "
                             f"{row.unit}, expected {row.expect}")
        if row.form is not None and res.get("index_from_cache") != (row.form == "later"):
            raise BenchError(f"{path}: {row.name}: the index "
                             + ("was not loaded from the cache" if row.form == "later"
                                else "came from a cache on a first start"))
        res["method"] = method
        return res

    suite.prime()
    if not cold:
        for row in rows:  # warm-up pass of every row, untimed
            one(row, False)
            if progress:
                progress.step(f"{suite.desc['name']} {mode} warm-up {row.name}")
    for r in range(rounds):
        order = rows if r % 2 == 0 else rows[::-1]
        for row in order:
            res = one(row, True)
            runs[row.name].append(res)
            what = (f"{suite.desc['name']} {mode} round {r + 1}/{rounds} "
                    f"{row.name}")
            if progress:
                progress.step(what)
            if log:
                log(f"  {what:45s} {res['seconds'] * 1e3:9.1f} ms")
    return runs


def _ratio(ref, mine, key="seconds"):
    if ref is None:
        return None
    rs = [a[key] / b[key] for a, b in zip(ref, mine) if b[key] > 0]
    if not rs:
        return None
    return dict(median=statistics.median(rs), min=min(rs), max=max(rs))


def _is_shard(name):
    return name.split("/")[0] in SHARD_PEERS


def summarize(runs, desc, suite=None):
    """One dict per row.  Ratios compare like with like: shard-start rows
    with dali-shard, whole-epoch rows with the whole-epoch baselines."""
    rows = []
    info = {r.name: r for r in suite.rows} if suite else {}
    for n, rs in runs.items():
        t = statistics.median(r["seconds"] for r in rs)
        row = info.get(n)
        bases = [b for b in BASELINES if b in runs and _is_shard(b) == _is_shard(n)]
        rows.append(dict(
            peer=n, seconds_median=t, seconds=[r["seconds"] for r in rs],
            cpu=[r["cpu"] for r in rs], pids=[r.get("pid") for r in rs],
            form=row.form if row else None,
            index_start=(None if row is None or row.form is None else
                         "first start (empty index cache)" if row.form == "first"
                         else "later start (index cache filled)"),
            cpu_median=statistics.median(r["cpu"] for r in rs),
            batch_size=row.batch if row else None,
            records_per_s=(row.expect if row and row.unit == "records"
                           else desc["records"]) / t,
            file_GBps=None if _is_shard(n) else desc["file_bytes"] / t / 1e9,
            vs={b: _ratio(runs[b], rs) for b in bases},
            cpu_vs_pylmdb=(None if _is_shard(n) else
                           _ratio(runs.get("py-lmdb"), rs, "cpu")),
            read_MB=statistics.median(r["read_bytes"] for r in rs) / 1e6,
            cold_method=sorted({r["method"] for r in rs if r.get("method")}) or None,
        ))
        rows[-1]["vs_pylmdb"] = rows[-1]["vs"].get("py-lmdb")
        rows[-1]["vs_pread"] = rows[-1]["vs"].get("pread")
    return rows


def fmt_ratio(r):
    if r is None:
        return "-"
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def _gbps(x):
    return "-" if x is None else f"{x:.2f}"


def fmt_cpu(r):
    return "-" if r is None else f"{r['median']:.2f}"


def format_table(results) -> str:
    bases = [b for b in BASELINES
             if any(b in row["vs"] for res in results for row in res["rows"])]
    hdr = (f"{'dataset':12s} {'records':>8s} {'mode':4s} {'peer':21s} "
           f"{'batch':>5s} {'records/s':>11s} {'GB/s':>6s} {'cpu/wall':>8s} "
           + " ".join(f"{'x ' + b + ' (min-max)':>22s}" for b in bases)
           + f" {'read MB':>8s} {'cpu x py-lmdb':>13s}")
    out = [hdr, "-" * len(hdr)]
    for res in results:
        for row in res["rows"]:
            cpu = row["cpu_median"] / row["seconds_median"]
            rmb = f"{row['read_MB']:.0f}" if res["mode"] == "cold" else "-"
            bs = str(row["batch_size"]) if row.get("batch_size") else "-"
            out.append(
                f"{res['dataset']:12s} {res['records']:>8d} {res['mode']:4s} "
                f"{row['peer']:21s} {bs:>5s} {row['records_per_s']:>11,.0f} "
                f"{_gbps(row['file_GBps']):>6s} {cpu:>8.2f} "
                + " ".join(f"{fmt_ratio(row['vs'].get(b)):>22s}" for b in bases)
                + f" {rmb:>8s} {fmt_cpu(row['cpu_vs_pylmdb']):>13s}")
        out.append("")
    return "\n".join(out) + "\n"


def format_header(info, results) -> str:
    cold_methods = sorted({mth for r in results for row in r["rows"]
                           for mth in (row["cold_method"] or [])})
    kw = info.get("open_kw", {})
    forms = any(row.get("form") for r in results for row in r["rows"])
    shards = any(row["peer"] in SHARD_PEERS or row["peer"].startswith("reader-shard")
                 for r in results for row in r["rows"])
    lines = [
        f"# lmdbio bench: {info.get('time')}  commit {info.get('commit', '?')}  "
        f"cpu {info.get('cpu', '?')} x{info.get('cpus')}  kernel {info.get('kernel')}",
        "# " + ("FRESH PROCESS per run (imports untimed; open + read + close "
                "timed in the child)" if info.get("fresh")
                else "IN-PROCESS (every run in this one process)"),
        f"# lmdbio peer = {info['lmdbio_impl']}"
        + (f" {info['lmdbio_version']}" if "lmdbio_version" in info else "")
        + f"; open({', '.join(f'{k}={v}' for k, v in kw.items())}, readonly=True)"
        + f"; rounds hot {info['rounds']} cold {info['cold_rounds']}, interleaved"
        + (f"; cold via {','.join(cold_methods)}" if cold_methods else ""),
        "# GB/s = data.mdb bytes / median time; x peer = median over rounds of "
        "t(peer)/t(row) in the same round (>1 = row faster); cpu x py-lmdb "
        "likewise with process CPU time; batch = Reader batch_size",
    ]
    if forms:
        lines.append("# NAME/first = first start: empty index cache (a new "
                     "index_cache directory per run), the index built inside "
                     "the timed run; NAME/later = later start: index cache "
                     "filled before the rounds (evicted too when cold)")
    if shards:
        r, w = info.get("shard", DEFAULT_SHARD)
        lines.append(f"# *-shard rows: open to the first batch of shard {r} of "
                     f"{w}; records/s = that batch's records / time")
    lines.append(f"# load average at the end: {os.getloadavg()[0]:.2f} "
                 "(cpu/wall << 1 in hot rows = the process was waiting for a "
                 "core; a shared machine: quote ratios, not times)")
    return "\n".join(lines) + "\n"


def compare(paths, modes=("hot", "cold"), peers=DEFAULT_PEERS, rounds=5,
            cold_rounds=None, open_kw=None, batch_size=None,
            drop_method="auto", check=True, no_gc=False, log=None,
            fresh=False, shard=DEFAULT_SHARD, progress=None):
    """Run the interleaved comparison on each environment in PATHS; returns
    a list of result dicts (dataset, records, mode, path, file_bytes, rows)."""
    for m in modes:
        if m not in ("hot", "cold"):
            raise BenchError(f"unknown mode {m!r} (known: hot, cold)")
    results = []
    if no_gc:
        gc.disable()
    try:
        for path in paths:
            desc = describe(path)
            suite = Suite(list(peers), desc, open_kw, batch_size, shard, log=log)
            try:
                if check:
                    verify(suite, open_kw, log)
                for mode in modes:
                    n = rounds if mode == "hot" else (cold_rounds or rounds)
                    runs = run_rounds(suite, mode, n, fresh, drop_method, log,
                                      progress)
                    results.append(dict(
                        dataset=desc["name"], records=desc["records"], mode=mode,
                        path=path, file_bytes=desc["file_bytes"], fresh=fresh,
                        rows=summarize(runs, desc, suite)))
            finally:
                suite.close()
    finally:
        gc.enable()
    return results


def plot(results, file, title=None):
    """A bar chart of each row's ratio to its baseline, min-max as error
    bars, one panel per dataset and mode.  Needs matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.2 + 0.45 * max(
        len(r["rows"]) for r in results) * n), squeeze=False)
    for ax, res in zip(axes[:, 0], results):
        names, med, lo, hi = [], [], [], []
        for row in res["rows"]:
            # each row against its own baseline: py-lmdb (else the first
            # present) for whole epochs, dali-shard for shard starts
            base = next((b for b in BASELINES if b in row["vs"]), None)
            r = row["vs"].get(base) if base else None
            if r is None:
                continue
            names.append(f"{row['peer']}  (x {base})")
            med.append(r["median"])
            lo.append(r["median"] - r["min"])
            hi.append(r["max"] - r["median"])
        y = list(range(len(names)))
        ax.barh(y, med, xerr=[lo, hi], color="#4c72b0", capsize=3)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_xlabel("x BASE = t(BASE) / t(row), same round (> 1: row "
                      "faster); median, min-max over rounds")
        ax.set_title(f"{res['dataset']} ({res['records']:,} records), {res['mode']}, "
                     + ("fresh process per run" if res.get("fresh") else "in-process"))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------
# command line (lmdbio bench, benches/compare.py)
# --------------------------------------------------------------------------

def find_benches():
    """The source checkout's benches/ directory, or None: $LMDBIO_BENCHES,
    else ./benches (where benches/compare.py is)."""
    for c in (os.environ.get("LMDBIO_BENCHES"), os.path.join(os.getcwd(), "benches")):
        if c and os.path.isfile(os.path.join(c, "compare.py")):
            return c
    return None


def parse_records(items):
    out = {}
    for it in items or []:
        name, _, n = it.partition("=")
        if not n or not n.isdigit():
            raise BenchError(f"--records wants NAME=N, got {it!r}")
        out[name] = int(n)
    return out


def build_parser(prog="lmdbio bench"):
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("paths", nargs="*", metavar="PATH",
                    help="LMDB environment directories to measure")
    ap.add_argument("--fresh", action="store_true",
                    help="every run of every peer in a new python process")
    ap.add_argument("--dataset", "--datasets", dest="datasets", default=None,
                    help="comma-separated benchmark datasets (small, big, cifar, "
                         "shuffled; needs lmdbio's source checkout)")
    ap.add_argument("--modes", default="hot,cold", help="hot,cold")
    ap.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                    help=f"comma-separated from {','.join(ALL_PEERS)}")
    ap.add_argument("--shard", default="%d/%d" % DEFAULT_SHARD, metavar="RANK/WORLD",
                    help="the shard of the *-shard peers (default 7/8)")
    ap.add_argument("--rounds", type=int, default=5, help="hot rounds (default 5)")
    ap.add_argument("--cold-rounds", type=int, default=None,
                    help="cold rounds (default: --rounds)")
    ap.add_argument("--records", action="append", metavar="NAME=N",
                    help="record count of a dataset (repeatable)")
    ap.add_argument("--quick", action="store_true", help="quick dataset sizes")
    ap.add_argument("--lock", type=int, default=0, help="open(lock=) for the cursors")
    ap.add_argument("--readahead", type=int, default=1,
                    help="open(readahead=) for the cursors")
    ap.add_argument("--batch-size", default="auto",
                    help="Reader batch size, or auto (256; ~4 MiB for big values)")
    ap.add_argument("--drop", default="auto", choices=["auto", "drop_caches", "fadvise"],
                    help="cold-cache method")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the untimed lmdbio == py-lmdb content check")
    ap.add_argument("--no-gc", action="store_true", help="disable the GC while timing")
    ap.add_argument("--json", help="also write all measurements here")
    ap.add_argument("--plot", metavar="FILE.png",
                    help="draw the ratios (needs matplotlib)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-run log")
    return ap


def _parse_shard(text):
    r, _, w = text.partition("/")
    if not (r.isdigit() and w.isdigit()) or not 0 <= int(r) < int(w):
        raise BenchError(f"--shard wants RANK/WORLD with 0 <= RANK < WORLD, "
                         f"got {text!r}")
    return int(r), int(w)


def _is_tty(err):
    if err is None:
        return sys.stderr.isatty()
    stream = getattr(getattr(err, "__self__", None), "err", None)
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


def main(argv=None, prog="lmdbio bench", out=None, err=None,
         resolve_dataset=None, repo=None):
    """Run the comparison; print the table.  Returns the exit status.

    ``resolve_dataset(name, records) -> path`` (benches/compare.py passes
    the checkout's) turns --dataset names into paths; without it, --dataset
    runs the checkout's benches/compare.py when there is one."""
    tty = _is_tty(err)
    out = out or (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    err = err or (lambda s: (sys.stderr.write(s), sys.stderr.flush()))
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser(prog).parse_args(argv)
    try:
        return _main(a, argv, prog, out, err, tty, resolve_dataset, repo)
    except BenchError as e:
        err(f"{prog}: {e}\n")
        return 2 if not str(e).startswith("MISMATCH") else 1
    except KeyboardInterrupt:
        err(f"\n{prog}: interrupted\n")
        return 130


def _main(a, argv, prog, out, err, tty, resolve_dataset, repo):
    def log(msg):
        if not a.quiet and not tty:
            err(msg + "\n")

    peers = [p for p in a.peers.split(",") if p]
    for p in peers:
        if p not in ALL_PEERS:
            raise BenchError(f"unknown peer {p!r} (known: {', '.join(ALL_PEERS)})")
    shard = _parse_shard(a.shard)
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in ("hot", "cold"):
            raise BenchError(f"unknown mode {m!r} (known: hot, cold)")
    if a.batch_size != "auto" and not (a.batch_size.isdigit() and int(a.batch_size) > 0):
        raise BenchError(f"--batch-size wants a positive number or auto, "
                         f"got {a.batch_size!r}")
    if a.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BenchError("--plot needs matplotlib: pip install matplotlib "
                             "(or pip install 'lmdbio[plot]')") from None
    paths = list(a.paths)
    names = [d for d in (a.datasets or "").split(",") if d]
    if not paths and not names:
        if resolve_dataset is None:
            raise BenchError("give the PATH of an LMDB environment (or "
                             "--dataset NAME from lmdbio's source checkout)")
        names = ["small", "big"]
    if names:
        if resolve_dataset is None:
            benches = find_benches()
            if benches is None:
                raise BenchError("--dataset needs lmdbio's source checkout: "
                                 "run from its root (benches/compare.py) or set "
                                 "LMDBIO_BENCHES=/path/to/benches; or give the "
                                 "PATH of an LMDB environment")
            # the checkout's own command generates the datasets: run it
            return subprocess.call([sys.executable,
                                    os.path.join(benches, "compare.py"), *argv])
        if a.quick:
            os.environ["LMDBIO_BENCH_QUICK"] = "1"
        records = parse_records(a.records)
        for d in names:
            try:
                paths.append(resolve_dataset(d, records.get(d)))
            except ValueError as e:
                raise BenchError(str(e)) from None
    for p in paths:
        check_path(p)
    try:
        pylmdb_module()
    except ImportError:
        raise BenchError("the py-lmdb peers and the content check need py-lmdb: "
                         "pip install lmdb") from None
    open_kw = dict(lock=bool(a.lock), readahead=bool(a.readahead))
    batch = None if a.batch_size == "auto" else int(a.batch_size)
    try:
        mod = lmdbio_module()
    except ImportError as e:
        raise BenchError(f"cannot import the lmdbio peer ({impl_name()}): "
                         f"{e} (LMDBIO_BENCH_IMPL=lmdb runs the suite with "
                         "py-lmdb standing in)") from None

    info = machine_info(repo)
    info.update(lmdbio_impl=impl_name(), open_kw=open_kw, peers=peers,
                rounds=a.rounds, cold_rounds=a.cold_rounds or a.rounds,
                batch_size=a.batch_size, fresh=a.fresh, shard=list(shard))
    if mod is not None and hasattr(mod, "version"):
        try:
            info["lmdbio_version"] = ".".join(map(str, mod.version()))
        except Exception:
            pass
    progress = None
    if tty and not a.quiet:
        per_mode = {"hot": a.rounds + 1, "cold": a.cold_rounds or a.rounds}
        nrows = sum(2 if p in READER_PEERS else 1 for p in peers)
        total = len(paths) * nrows * sum(per_mode[m] for m in modes)
        progress = Progress(total, err, True)
    results = compare(paths, modes, peers, a.rounds, a.cold_rounds, open_kw,
                      batch, a.drop, not a.no_verify, a.no_gc, log,
                      fresh=a.fresh, shard=shard, progress=progress)
    out("\n" + format_header(info, results) + "\n" + format_table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(info=info, results=results), f, indent=1)
    if a.plot:
        plot(results, a.plot, title=f"lmdbio bench ({'fresh process' if a.fresh else 'in-process'})")
        out(f"plot: {a.plot}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
