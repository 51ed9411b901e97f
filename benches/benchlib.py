"""Shared pieces of the lmdbio benchmarks: dataset locations, the cold-cache
helper and the peers (what is timed).  Used by conftest.py / bench_*.py
(pytest-benchmark) and by compare.py (interleaved side-by-side runs).  The
peers, the cold-cache helper and the accounting live in lmdbio.bench
(src/lmdbio/bench.py, also ``lmdbio bench``) and are re-exported here.

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
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import datasets  # noqa: E402  (benches/datasets.py)

REPO = os.path.dirname(HERE)


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
# cold cache, peers, accounting: shared with ``lmdbio bench``
# (src/lmdbio/bench.py), so that benches/ and the CLI time the same code
# --------------------------------------------------------------------------

def _load_bench():
    """lmdbio.bench, or the checkout's src/lmdbio/bench.py loaded by path
    (when lmdbio does not import, or an older lmdbio without it is
    installed: LMDBIO_BENCH_IMPL=lmdb still works)."""
    try:
        from lmdbio import bench
        return bench
    except ImportError:
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "lmdbio_bench", os.path.join(REPO, "src", "lmdbio", "bench.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod


bench = _load_bench()
drop_cache = bench.drop_cache
impl_name = bench.impl_name
lmdbio_module = bench.lmdbio_module
pylmdb_module = bench.pylmdb_module
cursor_walk = bench.cursor_walk
reader_walk = bench.reader_walk
walk_digest = bench.walk_digest
RawPread = bench.RawPread
proc_io = bench.proc_io
BLOCK = bench.BLOCK      # raw pread block size (page-aligned buffer)
OPEN_KW = bench.OPEN_KW  # how every cursor peer opens the environment


def machine_info() -> dict:
    return bench.machine_info(REPO)


# Page-cache residency for checking cold runs: mincore() over a mapping that
# is never touched.  Kept here, out of the library, which never maps data.
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def cached_fraction(path: str) -> float:
    """Fraction of PATH's pages in the page cache (mincore on a read-only
    mapping that is never touched, so nothing is read or faulted in)."""
    fd = os.open(bench.data_file(path), os.O_RDONLY)
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


# --------------------------------------------------------------------------
# real peers in their own interpreters (bench_dali.py, bench_torch.py)
# --------------------------------------------------------------------------

def run_child(python: str, body: str, spec: dict, cwd: str | None = None,
              script: str = "bench") -> dict:
    """One timed run: `body` (after lmdbio.bench.settle) in a fresh `python`
    process with the JSON spec as argv[1]; its last stdout line, as JSON.
    A failure exits with one line naming the peer."""
    import json
    import subprocess
    p = subprocess.run([python, "-c", bench.child_source(body),
                        json.dumps(spec)], cwd=cwd, capture_output=True,
                       text=True, timeout=3600)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"{script}: {spec['peer']} failed: {last}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ratio_table(times: dict, base_of, peer_name: str) -> str:
    """Median time and median per-round ratio t(base)/t(row) of each row of
    `times` (label -> seconds per round); base_of(label) names the row it
    is compared with."""
    import statistics
    lines = [f"{'peer':22s} {'median ms':>10s} {'x ' + peer_name:>14s} "
             f"{'(min-max)':>14s}"]
    for label, ts in times.items():
        ratios = [b / t for b, t in zip(times[base_of(label)], ts)]
        lines.append(f"{label:22s} {statistics.median(ts) * 1e3:10.1f} "
                     f"{statistics.median(ratios):14.2f} "
                     f"{'(%.2f-%.2f)' % (min(ratios), max(ratios)):>14s}")
    return "\n".join(lines)
