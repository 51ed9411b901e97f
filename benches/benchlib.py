"""Shared pieces of the lmdbio benchmarks: dataset locations, the cold-cache
helper and the peers (what is timed).  Used by conftest.py / bench_*.py
(pytest-benchmark) and by compare.py (interleaved side-by-side runs).

Environment variables
---------------------
LMDBIO_BENCH_DIR    where datasets are generated and cached
                    (default: <repo>/data/bench)
LMDBIO_BENCH_QUICK  1: use the quick dataset sizes (see datasets.py)
LMDBIO_BENCH_IMPL   module behind the "lmdbio" peer: ``lmdbio`` (default) or
                    ``lmdb`` (py-lmdb stands in, to debug the suite itself)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import platform
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import datasets  # noqa: E402  (benches/datasets.py)

REPO = os.path.dirname(HERE)
BLOCK = 4 << 20  # raw pread block size (page-aligned buffer)

# How every cursor peer opens the environment: read-only, no lock file
# (immutable dataset), py-lmdb's default readahead (its best case for a
# sequential walk).  compare.py can override lock/readahead.
OPEN_KW = dict(readonly=True, lock=False, readahead=True)


# --------------------------------------------------------------------------
# datasets
# --------------------------------------------------------------------------

def bench_dir() -> str:
    return os.environ.get("LMDBIO_BENCH_DIR") or os.path.join(REPO, "data", "bench")


def quick() -> bool:
    return os.environ.get("LMDBIO_BENCH_QUICK", "") not in ("", "0", "no", "false")


def dataset_records(name: str, records: int | None = None) -> int:
    if records is None and quick() and not name.endswith("-quick"):
        name += "-quick"
    return datasets.resolve(name, records)[2]


def dataset_path(name: str, records: int | None = None, seed: int = 0,
                 create: bool = True, verbose: bool = True) -> str:
    """Directory of dataset NAME with RECORDS records (generated once, then
    cached under bench_dir() as NAME-RECORDS[-sSEED])."""
    base = datasets.resolve(name, 0)[0]
    n = dataset_records(name, records)
    d = os.path.join(bench_dir(), f"{base}-{n}" + (f"-s{seed}" if seed else ""))
    if create:
        if verbose and datasets.read_meta(d) is None:
            print(f"[bench] generating {base} ({n} records) in {d} ...",
                  file=sys.stderr, flush=True)
        datasets.ensure(base, d, records=n, seed=seed, verbose=False)
    return d


def meta(path: str) -> dict:
    m = datasets.read_meta(path)
    if m is None:
        raise FileNotFoundError(f"{path}: not a generated benchmark dataset")
    return m


# --------------------------------------------------------------------------
# cold cache
# --------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def cached_fraction(path: str) -> float:
    """Fraction of PATH's pages in the page cache (mincore on a read-only
    mapping that is never touched, so nothing is read or faulted in)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0.0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return float("nan")
        try:
            pg = mmap.PAGESIZE
            npages = (size + pg - 1) // pg
            vec = (ctypes.c_ubyte * npages)()
            if _libc.mincore(addr, size, vec) != 0:
                return float("nan")
            return sum(b & 1 for b in bytes(vec)) / npages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


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
    files = []
    for p in paths:
        files.append(os.path.join(p, "data.mdb") if os.path.isdir(p) else p)
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


# --------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------

def impl_name() -> str:
    return os.environ.get("LMDBIO_BENCH_IMPL", "lmdbio")


_lmdbio = None


def lmdbio_module():
    """The module behind the "lmdbio" peer (lmdbio, or py-lmdb with
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


def reader_walk(mod, path: str, batch_size: int = 256) -> int:
    """lmdbio's bulk path: every record of one epoch through Reader."""
    n = 0
    with mod.Reader(path, batch_size=batch_size, lock=False) as r:
        for b in r:
            n += len(b.indices)
    return n


class RawPread:
    """The limit: sequential pread of data.mdb in page-aligned BLOCK-byte
    blocks into one reused anonymous-mmap buffer (page aligned: see the
    alignment facts in benchmarks.md)."""

    def __init__(self, block: int = BLOCK):
        self.block = block
        self.buf = mmap.mmap(-1, block)  # used only as an aligned buffer
        self.mv = memoryview(self.buf)
        self.buf[:] = b"\0" * block  # fault the buffer in once

    def __call__(self, path: str) -> int:
        f = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
        fd = os.open(f, os.O_RDONLY)
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


# --------------------------------------------------------------------------
# accounting
# --------------------------------------------------------------------------

def proc_io() -> dict:
    """/proc/self/io (read_bytes: bytes this process caused to be read from
    storage, page faults and threads included)."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (ln.split(":") for ln in f)}
    except OSError:
        return {}


def machine_info() -> dict:
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
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        pass
    return info
