"""``lmdbio bench``: lmdbio side by side with its peers, interleaved.

    lmdbio bench [PATH ...] [--dataset small,big,...] [--quick] [--rounds N]
                 [--modes hot,cold] [--peers pread,py-lmdb,lmdbio,...]

For each database and mode every peer runs once per round in this process,
the order alternating A B C / C B A between rounds; hot runs follow one
untimed warm-up pass of every peer, cold runs each follow a page-cache drop
(``echo 3 > /proc/sys/vm/drop_caches`` as root, else
``posix_fadvise(DONTNEED)`` on data.mdb; untimed).  The rules are those of
docs/benchmarks.md: only ratios measured side by side in one run are worth
quoting.  Peers (``--peers``):

  pread            the limit: sequential pread of data.mdb in page-aligned
                   4 MiB blocks into one reused buffer
  py-lmdb          open, ``for k, v in txn.cursor()``, close (py-lmdb)
  lmdbio           the same code with ``import lmdbio as lmdb`` (drop-in)
  lmdbio-reader    every record through ``lmdbio.Reader`` (one epoch)
  py-lmdb-get      ``txn.get(key)`` for every record in a shuffled order
                   (the permutation ``Reader(shuffle=True)`` uses, epoch 0)
  lmdbio-shuffled  ``lmdbio.Reader(shuffle=True)``: the same order

Reported per peer: median records/s and GB/s (data.mdb bytes / s), cpu/wall
(process CPU time, all threads, over wall time), and ratios ``x PEER`` = the
median over rounds of t(PEER) / t(row) measured in the same round (> 1: the
row is faster), with the min-max over rounds; ``cpu x py-lmdb`` the same
with CPU time (the steadier measure on a busy machine).  Cold rows add the
MB this process read from storage per run (``/proc/self/io`` read_bytes).
Reader peers use ``--batch-size`` (default ``auto``: 256 records, fewer for
big values so that a batch is about 4 MiB); their record index is built
once, untimed, before the rounds (what a second epoch or run sees).

``--dataset NAME`` (small, cifar, big, shuffled; ``--quick`` for the quick
sizes) generates and caches the benchmark datasets of benches/datasets.py
(needs a source checkout of lmdbio and py-lmdb); a PATH is any LMDB
environment directory.  benches/compare.py is this same command.

Environment: ``LMDBIO_BENCH_IMPL=lmdb`` makes py-lmdb stand in for the lmdbio
peers (to debug the suite); ``LMDBIO_BENCH_DIR`` is the dataset cache.
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import platform
import statistics
import subprocess
import sys
import time
import zlib

__all__ = ["main", "compare", "format_table", "RawPread", "cursor_walk",
           "reader_walk", "drop_cache", "proc_io", "describe"]

BLOCK = 4 << 20          # raw pread block size (page-aligned buffer)
BATCH_BYTES = 4 << 20    # target batch size in bytes for --batch-size auto
DEFAULT_BATCH = 256

# How every cursor peer opens the environment: read-only, no lock file
# (immutable dataset), py-lmdb's default readahead (its best case for a
# sequential walk).
OPEN_KW = dict(readonly=True, lock=False, readahead=True)

ALL_PEERS = ["pread", "py-lmdb", "lmdbio", "lmdbio-reader", "py-lmdb-get",
             "lmdbio-shuffled"]
DEFAULT_PEERS = ["pread", "py-lmdb", "lmdbio", "lmdbio-reader"]
# Ratio columns, in this order, for the baselines present in a run.
BASELINES = ["py-lmdb", "pread", "py-lmdb-get"]


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


def reader_walk(mod, path: str, batch_size: int = DEFAULT_BATCH, **kw) -> int:
    """lmdbio's bulk path: every record of one epoch through Reader
    (``kw``: more Reader arguments, e.g. shuffle=True)."""
    n = 0
    kw.setdefault("lock", False)
    with mod.Reader(path, batch_size=batch_size, **kw) as r:
        for b in r:
            n += len(b.indices)
    return n


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


class RawPread:
    """The limit: sequential pread of data.mdb in page-aligned BLOCK-byte
    blocks into one reused anonymous-mmap buffer (page aligned: see the
    alignment facts in docs/benchmarks.md)."""

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
    (api.md pins it: numpy's PCG64 seeded with [seed, epoch])."""
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


class GetLoop:
    """py-lmdb ``txn.get(key)`` for every key in a given order: what a
    map-style dataset over py-lmdb does in a shuffled epoch."""

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


# --------------------------------------------------------------------------
# databases
# --------------------------------------------------------------------------

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
    mod = pylmdb_module()
    env = mod.open(path, **OPEN_KW)
    try:
        n = env.stat()["entries"]
    finally:
        env.close()
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


class Peer:
    """fn(path) -> count (records or bytes: ``unit``); prime(path), untimed,
    before the rounds (builds a Reader's cached index)."""

    def __init__(self, fn, unit, prime=None, batch=None):
        self.fn = fn
        self.unit = unit
        self.prime = prime
        self.batch = batch


def make_peers(names, desc, open_kw=None, batch_size=None, log=None):
    """name -> Peer for one database."""
    peers = {}
    bs = batch_size or auto_batch_size(desc)
    path = desc["path"]
    keys = None
    for name in names:
        if name == "pread":
            peers[name] = Peer(RawPread(), "bytes")
        elif name in ("py-lmdb", "lmdbio"):
            mod = pylmdb_module() if name == "py-lmdb" else lmdbio_module()
            peers[name] = Peer(lambda p, mod=mod: cursor_walk(mod, p, open_kw),
                               "records")
        elif name in ("lmdbio-reader", "lmdbio-shuffled"):
            mod = lmdbio_module()
            if not hasattr(mod, "Reader"):
                if log:
                    log(f"[bench] {impl_name()} has no Reader: skipping {name}")
                continue
            kw = dict(shuffle=True, seed=0) if name == "lmdbio-shuffled" else {}

            def fn(p, mod=mod, kw=kw):
                return reader_walk(mod, p, bs, **kw)

            def prime(p, mod=mod):
                with mod.Reader(p, batch_size=bs, lock=False):
                    pass

            peers[name] = Peer(fn, "records", prime, batch=bs)
        elif name == "py-lmdb-get":
            mod = pylmdb_module()
            if keys is None:
                ks = all_keys(mod, path, open_kw)
                keys = [ks[i] for i in shuffled_order(len(ks)).tolist()]
            peers[name] = Peer(GetLoop(mod, keys, open_kw), "records")
        else:
            raise ValueError(f"unknown peer {name!r} (known: {', '.join(ALL_PEERS)})")
    return peers


def verify(peers, path, open_kw=None):
    """Untimed: the lmdbio walk must yield exactly py-lmdb's records."""
    if not any(n.startswith("lmdbio") for n in peers):
        return None
    ref = walk_digest(pylmdb_module(), path, open_kw)
    got = walk_digest(lmdbio_module(), path, open_kw)
    if ref != got:
        raise RuntimeError(f"MISMATCH on {path}: py-lmdb (count, crc) {ref}, "
                           f"{impl_name()} {got}")
    return ref


# --------------------------------------------------------------------------
# the interleaved runs
# --------------------------------------------------------------------------

def run_one(fn, path, expect, cold, drop_method="auto"):
    """One timed call (after a page-cache drop when cold)."""
    method = None
    if cold:
        method = drop_cache(path, method=drop_method)
    io0 = proc_io().get("read_bytes", 0)
    c0 = time.process_time()
    t0 = time.perf_counter()
    n = fn(path)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    rb = proc_io().get("read_bytes", 0) - io0
    if expect is not None and n != expect:
        raise RuntimeError(f"{path}: got {n}, expected {expect}")
    return dict(seconds=dt, cpu=cpu, read_bytes=rb, method=method)


def run_rounds(peers, desc, mode, rounds, drop_method="auto", log=None):
    """{peer: [run, ...]}: every peer once per round, order alternating."""
    path = desc["path"]
    expect = {"bytes": desc["file_bytes"], "records": desc["records"]}
    names = list(peers)
    runs = {n: [] for n in names}
    cold = mode == "cold"
    for n in names:
        if peers[n].prime is not None:
            peers[n].prime(path)
    if not cold:
        for n in names:  # warm-up pass of every peer, untimed
            run_one(peers[n].fn, path, expect[peers[n].unit], False)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            p = peers[n]
            res = run_one(p.fn, path, expect[p.unit], cold, drop_method)
            runs[n].append(res)
            if log:
                log(f"  {desc['name']:12s} {mode:4s} round {r + 1}/{rounds} "
                    f"{n:15s} {res['seconds'] * 1e3:9.1f} ms")
    return runs


def _ratio(ref, mine, key="seconds"):
    if ref is None:
        return None
    rs = [a[key] / b[key] for a, b in zip(ref, mine) if b[key] > 0]
    if not rs:
        return None
    return dict(median=statistics.median(rs), min=min(rs), max=max(rs))


def summarize(runs, desc, peers=None):
    rows = []
    for n, rs in runs.items():
        t = statistics.median(r["seconds"] for r in rs)
        rows.append(dict(
            peer=n, seconds_median=t, seconds=[r["seconds"] for r in rs],
            cpu_median=statistics.median(r["cpu"] for r in rs),
            batch_size=peers[n].batch if peers else None,
            records_per_s=desc["records"] / t,
            file_GBps=desc["file_bytes"] / t / 1e9,
            vs={b: _ratio(runs.get(b), rs) for b in BASELINES if b in runs},
            cpu_vs_pylmdb=_ratio(runs.get("py-lmdb"), rs, "cpu"),
            read_MB=statistics.median(r["read_bytes"] for r in rs) / 1e6,
            cold_method=sorted({r["method"] for r in rs if r["method"]}) or None,
        ))
        # the names compare.py's JSON had
        rows[-1]["vs_pylmdb"] = rows[-1]["vs"].get("py-lmdb")
        rows[-1]["vs_pread"] = rows[-1]["vs"].get("pread")
    return rows


def fmt_ratio(r):
    if r is None:
        return "-"
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def format_table(results) -> str:
    bases = [b for b in BASELINES
             if any(b in row["vs"] for res in results for row in res["rows"])]
    hdr = (f"{'dataset':12s} {'records':>8s} {'mode':4s} {'peer':15s} "
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
                f"{row['peer']:15s} {bs:>5s} {row['records_per_s']:>11,.0f} "
                f"{row['file_GBps']:>6.2f} {cpu:>8.2f} "
                + " ".join(f"{fmt_ratio(row['vs'].get(b)):>22s}" for b in bases)
                + f" {rmb:>8s} {fmt_cpu(row['cpu_vs_pylmdb']):>13s}")
        out.append("")
    return "\n".join(out) + "\n"


def fmt_cpu(r):
    return "-" if r is None else f"{r['median']:.2f}"


def format_header(info, results) -> str:
    cold_methods = sorted({mth for r in results for row in r["rows"]
                           for mth in (row["cold_method"] or [])})
    kw = info.get("open_kw", {})
    lines = [
        f"# lmdbio bench: {info.get('time')}  commit {info.get('commit', '?')}  "
        f"cpu {info.get('cpu', '?')} x{info.get('cpus')}  kernel {info.get('kernel')}",
        f"# lmdbio peer = {info['lmdbio_impl']}"
        + (f" {info['lmdbio_version']}" if "lmdbio_version" in info else "")
        + f"; open({', '.join(f'{k}={v}' for k, v in kw.items())}, readonly=True)"
        + f"; rounds hot {info['rounds']} cold {info['cold_rounds']}, interleaved"
        + (f"; cold via {','.join(cold_methods)}" if cold_methods else ""),
        "# GB/s = data.mdb bytes / median time; x peer = median over rounds of "
        "t(peer)/t(row) in the same round (>1 = row faster); cpu x py-lmdb "
        "likewise with process CPU time; batch = Reader batch_size",
        f"# load average at the end: {os.getloadavg()[0]:.2f} "
        f"(cpu/wall << 1 in hot rows = the process was waiting for a core)",
    ]
    return "\n".join(lines) + "\n"


def compare(paths, modes=("hot", "cold"), peers=DEFAULT_PEERS, rounds=5,
            cold_rounds=None, open_kw=None, batch_size=None,
            drop_method="auto", check=True, no_gc=False, log=None):
    """Run the interleaved comparison on each environment in PATHS; returns
    a list of result dicts (dataset, records, mode, path, file_bytes, rows)."""
    results = []
    if no_gc:
        gc.disable()
    try:
        for path in paths:
            desc = describe(path)
            ps = make_peers(list(peers), desc, open_kw, batch_size, log)
            if check:
                if log:
                    log(f"[bench] verifying {impl_name()} against py-lmdb on {path}")
                verify(ps, path, open_kw)
            for mode in modes:
                if mode not in ("hot", "cold"):
                    raise ValueError(f"unknown mode {mode!r}")
                n = rounds if mode == "hot" else (cold_rounds or rounds)
                runs = run_rounds(ps, desc, mode, n, drop_method, log)
                results.append(dict(
                    dataset=desc["name"], records=desc["records"], mode=mode,
                    path=path, file_bytes=desc["file_bytes"],
                    rows=summarize(runs, desc, ps)))
    finally:
        gc.enable()
    return results


# --------------------------------------------------------------------------
# command line (lmdbio bench, benches/compare.py)
# --------------------------------------------------------------------------

def _find_benches():
    """The source checkout's benches/ directory (datasets.py, benchlib.py),
    or None: from $LMDBIO_BENCHES, this file's checkout, or ./benches."""
    cands = [os.environ.get("LMDBIO_BENCHES"),
             os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
                 os.path.abspath(__file__)))), "benches"),
             os.path.join(os.getcwd(), "benches")]
    for c in cands:
        if c and os.path.exists(os.path.join(c, "datasets.py")):
            return c
    return None


def _dataset_resolver():
    """function(name, records) -> path, through benches/benchlib.py."""
    d = _find_benches()
    if d is None:
        return None
    if d not in sys.path:
        sys.path.insert(0, d)
    import benchlib
    return benchlib.dataset_path


def parse_records(items):
    out = {}
    for it in items or []:
        name, _, n = it.partition("=")
        if not n:
            raise SystemExit(f"--records wants NAME=N, got {it!r}")
        out[name] = int(n)
    return out


def build_parser(prog="lmdbio bench"):
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("paths", nargs="*", metavar="PATH",
                    help="LMDB environment directories to measure")
    ap.add_argument("--dataset", "--datasets", dest="datasets", default=None,
                    help="comma-separated benchmark datasets (small, big, cifar, "
                         "shuffled); default small,big when no PATH is given")
    ap.add_argument("--modes", default="hot,cold", help="hot,cold")
    ap.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                    help=f"comma-separated from {','.join(ALL_PEERS)}")
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
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-run log")
    return ap


def main(argv=None, prog="lmdbio bench", out=None, err=None):
    """Run the comparison; print the table.  Returns the exit status."""
    out = out or (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    err = err or (lambda s: (sys.stderr.write(s), sys.stderr.flush()))
    ap = build_parser(prog)
    a = ap.parse_args(argv)

    def log(msg):
        if not a.quiet:
            err(msg + "\n")

    if a.quick:
        os.environ["LMDBIO_BENCH_QUICK"] = "1"
    peers = [p for p in a.peers.split(",") if p]
    for p in peers:
        if p not in ALL_PEERS:
            err(f"{prog}: unknown peer {p!r} (known: {', '.join(ALL_PEERS)})\n")
            return 2
    paths = list(a.paths)
    names = a.datasets if a.datasets is not None else ("" if paths else "small,big")
    names = [d for d in names.split(",") if d]
    if names:
        resolve = _dataset_resolver()
        if resolve is None:
            err(f"{prog}: --dataset needs lmdbio's source checkout (benches/"
                "datasets.py; set LMDBIO_BENCHES=/path/to/benches); or give "
                "the PATH of an LMDB environment\n")
            return 2
        records = parse_records(a.records)
        for d in names:
            paths.append(resolve(d, records.get(d)))
    for p in paths:
        if not os.path.exists(data_file(p)):
            err(f"{prog}: {p}: no data.mdb\n")
            return 2
    open_kw = dict(lock=bool(a.lock), readahead=bool(a.readahead))
    batch = None if a.batch_size == "auto" else int(a.batch_size)
    modes = [m for m in a.modes.split(",") if m]
    if any(p.startswith("lmdbio") for p in peers):
        try:
            mod = lmdbio_module()
        except ImportError as e:
            err(f"{prog}: cannot import the lmdbio peer ({impl_name()}): {e}\n"
                "  (LMDBIO_BENCH_IMPL=lmdb runs the suite with py-lmdb standing in)\n")
            return 2
    else:
        mod = None

    bdir = _find_benches()
    info = machine_info(os.path.dirname(bdir) if bdir else None)
    info.update(lmdbio_impl=impl_name(), open_kw=open_kw, peers=peers,
                rounds=a.rounds, cold_rounds=a.cold_rounds or a.rounds,
                batch_size=a.batch_size)
    if mod is not None and hasattr(mod, "version"):
        try:
            info["lmdbio_version"] = ".".join(map(str, mod.version()))
        except Exception:
            pass
    try:
        results = compare(paths, modes, peers, a.rounds, a.cold_rounds, open_kw,
                          batch, a.drop, not a.no_verify, a.no_gc, log)
    except (RuntimeError, ValueError) as e:
        err(f"{prog}: {e}\n")
        return 1
    out("\n" + format_header(info, results) + "\n" + format_table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(info=info, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
