#!/usr/bin/env python3
"""lmdbio.Reader (the bulk path) against its peers.

pytest-benchmark (``pytest benches/bench_reader.py --benchmark-only``):

- ``reader-<dataset>-<hot|cold>``: one epoch through ``Reader`` (first
  start: empty index cache; later start: cache filled) next to the raw
  sequential pread of data.mdb and py-lmdb's ``for k, v in txn.cursor()``,
  on small, big (batch_size auto: about 4 MiB batches) and shuffled;
- ``shuffled-epoch-<hot|cold>``: ``Reader(shuffle=True)`` (both starts)
  next to a py-lmdb ``txn.get`` loop in the same order (small);
- ``shard-start-<N>``: the first batch of the last shard (rank 7 of 8),
  hot: DALI-style, Caffe-style and the Reader (both starts);
- ``rss-<dataset>``: peak RSS of a full scan, in a fresh subprocess.

The peers are lmdbio.bench's (``lmdbio bench``): one home for what is timed.
pytest-benchmark runs one peer's rounds back to back; the ratios quoted in
the notes come from interleaved runs:

    python benches/compare.py --fresh ...           # scans, shuffled, shard starts
    python benches/bench_reader.py shard-start [--records 10000,100000,1000000] [--fresh]
    python benches/bench_reader.py rss [--datasets big-300,big,small-50000,small]
    python benches/bench_reader.py page-cache [--dataset small] [--records N]
    python benches/bench_reader.py ceiling [--dataset small | --dir DIR] [--rounds 5]

``shard-start`` is ``lmdbio bench --peers dali-shard,caffe-shard,reader-shard``
on the small dataset at each N; ``rss`` runs every (peer, dataset) in a
fresh subprocess and prints peak RSS next to the file size; ``page-cache``
measures how much of data.mdb one epoch leaves in the page cache, with
``Reader(cache="keep")`` and ``cache="drop"`` (where the Reader has that
argument) next to py-lmdb's cursor walk.  ``ceiling`` measures how close a
hot epoch in key order comes to the machine, in one process, interleaved:
raw pread, the Reader's C path of a window alone (``read_window`` over
consecutive windows, one thread, then two threads over the two halves: no
Python between windows, no hand-offs) and a Reader epoch (later start).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import benchlib  # noqa: E402

bench = benchlib.bench

SHARD_PEERS = ["dali-shard", "caffe-shard", "reader-shard"]

# --------------------------------------------------------------------------
# shard start: lmdbio bench's shard peers at several N
# --------------------------------------------------------------------------


def shard_start(records=(10_000, 100_000, 1_000_000), rounds=5, fresh=False,
                modes=("hot",), log=None):
    paths = [benchlib.dataset_path("small", n) for n in records]
    return bench.compare(paths, modes, SHARD_PEERS, rounds, fresh=fresh,
                         log=log)


# --------------------------------------------------------------------------
# the page cache over an epoch: Reader(cache="keep" | "drop")
# --------------------------------------------------------------------------


def reader_cache_modes(mod=None):
    """The Reader's ``cache=`` choices when it has that argument, else []
    (an lmdbio without it: only its default is measured)."""
    mod = mod or bench.lmdbio_module()
    try:
        params = inspect.signature(mod.Reader).parameters
    except (TypeError, ValueError):
        return []
    return ["keep", "drop"] if "cache" in params else []


def meminfo_cached_kib():
    """/proc/meminfo's Cached (the whole machine's page cache, KiB)."""
    with open("/proc/meminfo") as f:
        for ln in f:
            if ln.startswith("Cached:"):
                return int(ln.split()[1])
    return 0


def page_cache_epoch(path, peer, cache=None, batch=None, samples=50,
                     index_cache=None):
    """Drop the page cache, run one epoch of PEER, and sample data.mdb's
    resident share (mincore, benchlib.cached_fraction) as it goes.
    Returns resident MB before / peak / after, the machine's Cached growth
    and the time.  PEER: "reader" (``cache=`` passed only when given) or
    "py-lmdb" (cursor walk; its residency is sampled every 1/samples of the
    records)."""
    desc = bench.describe(path)
    n = desc["records"]
    mb = desc["file_bytes"] / 1e6
    bench.drop_cache(path, *(index_cache and [os.path.join(index_cache, f)
                                              for f in os.listdir(index_cache)] or []))
    before = benchlib.cached_fraction(path) * mb
    m0 = meminfo_cached_kib()
    peak = before
    every = max(1, n // samples)
    t0 = time.perf_counter()
    seen = 0
    if peer == "reader":
        mod = bench.lmdbio_module()
        kw = dict(lock=False, index_cache=index_cache or False)
        if cache is not None:
            kw["cache"] = cache
        bs = batch or bench.auto_batch_size(desc)
        with mod.Reader(path, batch_size=bs, **kw) as r:
            nxt = every
            for b in r:
                seen += len(b)
                if seen >= nxt:
                    peak = max(peak, benchlib.cached_fraction(path) * mb)
                    nxt += every
    else:
        lmdb = bench.pylmdb_module()
        env = lmdb.open(path, **bench.OPEN_KW)
        try:
            with env.begin() as txn:
                for _ in txn.cursor():
                    seen += 1
                    if seen % every == 0:
                        peak = max(peak, benchlib.cached_fraction(path) * mb)
        finally:
            env.close()
    dt = time.perf_counter() - t0
    after = benchlib.cached_fraction(path) * mb
    if seen != n:
        raise RuntimeError(f"{peer}: {seen} records, expected {n}")
    return dict(peer=peer, cache=cache, file_MB=mb, before_MB=before,
                peak_MB=max(peak, after), after_MB=after,
                meminfo_growth_MB=(meminfo_cached_kib() - m0) * 1024 / 1e6,
                seconds=dt)


def page_cache(path, rounds=1, log=None):
    """Interleaved: py-lmdb, the Reader by default, and with each cache=
    mode the Reader accepts; index cache filled first (a later start: the
    figure is the epoch's reads, not the index build's)."""
    modes = reader_cache_modes()
    runs = [("py-lmdb", None), ("reader", None)] + [("reader", m) for m in modes]
    idx = tempfile.mkdtemp(prefix="lmdbio-bench-index-")
    try:
        with bench.lmdbio_module().Reader(path, lock=False, index_cache=idx):
            pass
        rows = []
        for r in range(rounds):
            for peer, mode in (runs if r % 2 == 0 else runs[::-1]):
                res = page_cache_epoch(path, peer, mode, index_cache=idx)
                rows.append(res)
                if log:
                    log(f"  round {r + 1} {peer:8s} cache={mode}: peak "
                        f"{res['peak_MB']:.0f} MB, after {res['after_MB']:.0f} MB")
    finally:
        shutil.rmtree(idx, ignore_errors=True)
    return rows, modes


def format_page_cache(rows, modes) -> str:
    hdr = (f"{'peer':8s} {'cache=':9s} {'file MB':>8s} {'peak MB':>8s} "
           f"{'after MB':>8s} {'after/file':>10s} {'Cached +MB':>10s} {'s':>7s}")
    out = [hdr, "-" * len(hdr)]
    for r in rows:
        out.append(f"{r['peer']:8s} {str(r['cache'] or '(default)'):9s} "
                   f"{r['file_MB']:>8.0f} {r['peak_MB']:>8.0f} "
                   f"{r['after_MB']:>8.0f} {r['after_MB'] / r['file_MB']:>10.2f} "
                   f"{r['meminfo_growth_MB']:>10.0f} {r['seconds']:>7.2f}")
    if not modes:
        out.append("# this lmdbio's Reader has no cache= argument: only its "
                   "default is measured")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# peak RSS (each scan in a fresh interpreter)
# --------------------------------------------------------------------------

RSS_PEERS = ["reader", "lmdbio", "py-lmdb", "pread"]


def _rss_child(peer, path, batch):
    """In the child: baseline RSS after the imports, then one full scan;
    prints JSON (KiB)."""
    import lmdbio  # noqa: F401  (imports counted in the baseline)
    import numpy  # noqa: F401
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if peer == "reader":
        n = bench.reader_walk(bench.lmdbio_module(), path, batch)
    elif peer == "lmdbio":
        n = bench.cursor_walk(bench.lmdbio_module(), path)
    elif peer == "py-lmdb":
        n = bench.cursor_walk(bench.pylmdb_module(), path)
    elif peer == "pread":
        n = bench.RawPread()(path)
    else:
        raise SystemExit(f"unknown peer {peer}")
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(peer=peer, count=n, base_kib=base, peak_kib=peak,
                          seconds=dt)))


def rss_run(peer, path, batch=None):
    desc = bench.describe(path)
    batch = batch or bench.auto_batch_size(desc)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in sys.path if p and os.path.isdir(p)])
    out = subprocess.run([sys.executable, os.path.abspath(__file__),
                          "_rss_child", peer, path, str(batch)],
                         capture_output=True, text=True, env=env, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res.update(file_bytes=desc["file_bytes"], records=desc["records"],
               dataset=desc["name"], batch=batch if peer == "reader" else None)
    return res


def rss(datasets=("big-300", "big", "small-50000", "small"), peers=RSS_PEERS,
        log=None):
    rows = []
    for ds in datasets:
        name, _, n = ds.partition("-")
        path = benchlib.dataset_path(name, int(n) if n.isdigit() else None)
        for p in peers:
            res = rss_run(p, path)
            rows.append(res)
            if log:
                log(f"  {res['dataset']:14s} {p:8s} peak {res['peak_kib'] / 1024:8.1f} MB")
    return rows


def format_rss(rows) -> str:
    hdr = (f"{'dataset':14s} {'file MB':>8s} {'peer':8s} {'batch':>5s} "
           f"{'peak RSS MB':>11s} {'growth MB':>9s} {'growth/file':>11s}")
    out = [hdr, "-" * len(hdr)]
    for r in rows:
        g = (r["peak_kib"] - r["base_kib"]) * 1024
        out.append(f"{r['dataset']:14s} {r['file_bytes'] / 1e6:>8.0f} "
                   f"{r['peer']:8s} {str(r['batch'] or '-'):>5s} "
                   f"{r['peak_kib'] * 1024 / 1e6:>11.1f} {g / 1e6:>9.1f} "
                   f"{g / r['file_bytes']:>11.3f}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# pytest-benchmark
# --------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # running the command line without pytest
    pytest = None

if pytest is not None:

    SCAN_ROWS = ["pread", "py-lmdb", "lmdbio-reader/first", "lmdbio-reader/later"]

    def _run_row(benchmark, cold_cache, rounds, path, row_name, cond, group):
        """One row of lmdbio.bench's suite under pytest-benchmark: a first
        start gets a new empty index cache before every round (untimed)."""
        desc = bench.describe(path)
        suite = bench.Suite([row_name.split("/")[0]], desc)
        try:
            row = next(r for r in suite.rows if r.name == row_name)
            suite.prime()
            benchmark.group = group
            benchmark.extra_info.update(peer=row_name, cond=cond,
                                        records=desc["records"],
                                        file_bytes=desc["file_bytes"],
                                        batch_size=row.batch)
            specs = []

            def setup():
                if specs:
                    suite.done(specs.pop())
                specs.append(suite.run_spec(row))
                if cond == "cold":
                    benchmark.extra_info["cold_method"] = cold_cache.drop(
                        path, *suite.cache_files())
                return (bench.prepare(specs[-1], suite.keys),), {}

            def run(fn):
                return fn()[0]

            if cond == "hot":
                args, _ = setup()
                assert run(*args) == row.expect
            result = benchmark.pedantic(run, setup=setup,
                                        rounds=rounds[cond], iterations=1)
            assert result == row.expect
        finally:
            suite.close()

    @pytest.mark.parametrize("cond", ["hot", "cold"])
    @pytest.mark.parametrize("dataset", ["small", "big", "shuffled"])
    @pytest.mark.parametrize("row", SCAN_ROWS)
    def test_reader_scan(benchmark, lmdbio_mod, bench_dataset, cold_cache,
                         rounds, row, dataset, cond):
        _run_row(benchmark, cold_cache, rounds, bench_dataset(dataset), row,
                 cond, f"reader-{dataset}-{cond}")

    @pytest.mark.parametrize("cond", ["hot", "cold"])
    @pytest.mark.parametrize("row", ["py-lmdb-get", "lmdbio-shuffled/first",
                                     "lmdbio-shuffled/later"])
    def test_shuffled_epoch(benchmark, lmdbio_mod, bench_dataset, cold_cache,
                            rounds, row, cond):
        _run_row(benchmark, cold_cache, rounds, bench_dataset("small"), row,
                 cond, f"shuffled-epoch-{cond}")

    @pytest.mark.parametrize("size", ["10k", "100k", "1M"])
    @pytest.mark.parametrize("row", ["dali-shard", "caffe-shard",
                                     "reader-shard/first", "reader-shard/later"])
    def test_shard_start(benchmark, lmdbio_mod, bench_dataset, cold_cache,
                         rounds, row, size):
        records = {"10k": 10_000, "100k": 100_000, "1M": 1_000_000}[size]
        if benchlib.quick():  # 10k, 30k, 100k
            records = {"10k": 10_000, "100k": 30_000, "1M": 100_000}[size]
        _run_row(benchmark, cold_cache, rounds, bench_dataset("small", records),
                 row, "hot", f"shard-start-{records}")

    @pytest.mark.parametrize("dataset", ["big", "small"])
    @pytest.mark.parametrize("peer", RSS_PEERS)
    def test_peak_rss(benchmark, lmdbio_mod, bench_dataset, peer, dataset):
        path = bench_dataset(dataset)
        benchmark.group = f"rss-{dataset}"
        res = benchmark.pedantic(rss_run, args=(peer, path), rounds=1,
                                 iterations=1)
        benchmark.extra_info.update(
            peer=peer, file_MB=res["file_bytes"] / 1e6,
            peak_rss_MB=res["peak_kib"] * 1024 / 1e6,
            growth_MB=(res["peak_kib"] - res["base_kib"]) * 1024 / 1e6,
            batch_size=res["batch"])
        if peer == "reader":
            # bounded by prefetch_bytes (64 MiB) and the batch, not the file
            assert (res["peak_kib"] - res["base_kib"]) * 1024 < 256 << 20


# --------------------------------------------------------------------------
# ceiling: the C path of a window alone, next to raw pread and the Reader
# --------------------------------------------------------------------------

def _window_pass(f, lo, hi, window, batch, lane):
    """read_window over records [lo, hi) in windows of `window` records,
    each result dropped at once (its memory block reused)."""
    import numpy as np
    for s in range(lo, hi, window):
        e = min(hi, s + window)
        ends = np.arange(s + batch, e + batch, batch, dtype=np.intp) - s
        ends[-1] = e - s
        f.read_window(np.arange(s, e, dtype=np.int64), ends, False,
                      independent=True, lane=lane)


def ceiling(path, rounds=5, window_batches=10, log=None):
    """Seconds per hot epoch of each way of reading `path` in key order
    (medians of `rounds`, the ways interleaved A B C D / D C B A)."""
    import threading
    lmdbio = bench.lmdbio_module()
    cache = tempfile.mkdtemp(prefix="ceiling-index-")
    raw = bench.RawPread()
    try:
        bench.reader_epoch(lmdbio, path, index_cache=cache)  # index cached
        r = lmdbio.Reader(path, lock=False, index_cache=cache)
        next(iter(r))        # policies set, the file open
        f, n, bs = r._file, r.total_records, r.batch_size
        window = window_batches * bs

        def one():
            _window_pass(f, 0, n, window, bs, 0)

        def two():
            half = (n // 2 // bs) * bs
            t = threading.Thread(target=_window_pass,
                                 args=(f, half, n, window, bs, 1))
            t.start()
            _window_pass(f, 0, half, window, bs, 0)
            t.join()

        ways = [("raw pread", lambda: raw(path)),
                ("C path, 1 thread", one),
                ("C path, 2 threads", two),
                ("Reader, later start",
                 lambda: bench.reader_epoch(lmdbio, path, index_cache=cache))]
        for _, fn in ways:
            fn()     # warm: the file and the blocks
        times = {name: [] for name, _ in ways}
        for k in range(rounds):
            for name, fn in (ways if k % 2 == 0 else ways[::-1]):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            if log:
                log(f"ceiling round {k + 1}/{rounds}")
        r.close()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    med = {name: sorted(v)[len(v) // 2] for name, v in times.items()}
    return [dict(way=name, seconds=med[name],
                 x_pread=med["raw pread"] / med[name]) for name, _ in ways]


def format_ceiling(rows) -> str:
    out = [f"{'way':<22} {'ms':>8} {'x raw pread':>12}", "-" * 44]
    for row in rows:
        out.append(f"{row['way']:<22} {row['seconds'] * 1e3:8.1f} "
                   f"{row['x_pread']:11.2f}x")
    return "\n".join(out)


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_rss_child":
        _rss_child(argv[1], argv[2], int(argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shard-start", help="last shard's first batch vs N")
    s.add_argument("--records", default="10000,100000,1000000")
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--modes", default="hot")
    s.add_argument("--fresh", action="store_true",
                   help="every run in a fresh process")
    s.add_argument("--json")
    s.add_argument("-q", "--quiet", action="store_true")
    c = sub.add_parser("page-cache", help="page cache left by one epoch, "
                                          "Reader cache=keep/drop")
    c.add_argument("--dataset", default="small")
    c.add_argument("--records", type=int, default=None)
    c.add_argument("--rounds", type=int, default=1)
    c.add_argument("--json")
    c.add_argument("-q", "--quiet", action="store_true")
    r = sub.add_parser("rss", help="peak RSS of a full scan vs file size")
    r.add_argument("--datasets", default="big-300,big,small-50000,small",
                   help="NAME or NAME-RECORDS, comma-separated")
    r.add_argument("--peers", default=",".join(RSS_PEERS))
    r.add_argument("--json")
    r.add_argument("-q", "--quiet", action="store_true")
    e = sub.add_parser("ceiling", help="a hot epoch's C path alone vs raw "
                                       "pread and the Reader")
    e.add_argument("--dataset", default="small")
    e.add_argument("--records", type=int, default=None)
    e.add_argument("--dir", help="an existing environment instead")
    e.add_argument("--rounds", type=int, default=5)
    e.add_argument("--json")
    e.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    info = benchlib.machine_info()
    if a.cmd == "shard-start":
        recs = [int(x) for x in a.records.split(",") if x]
        res = shard_start(recs, a.rounds, a.fresh,
                          [m for m in a.modes.split(",") if m], log)
        info.update(lmdbio_impl=bench.impl_name(), rounds=a.rounds,
                    cold_rounds=a.rounds, fresh=a.fresh,
                    shard=list(bench.DEFAULT_SHARD))
        print("\n" + bench.format_header(info, res) + "\n"
              + bench.format_table(res))
        data = res
    elif a.cmd == "page-cache":
        path = benchlib.dataset_path(a.dataset, a.records)
        rows, modes = page_cache(path, a.rounds, log)
        print(f"\n# page cache over one epoch of {os.path.basename(path)} "
              f"(dropped before each run; index cache filled first): "
              f"data.mdb resident MB by mincore, peak while reading and "
              f"after; Cached +MB = /proc/meminfo Cached growth (whole "
              f"machine: other work adds to it); {info['time']} commit "
              f"{info.get('commit', '?')}\n")
        print(format_page_cache(rows, modes))
        data = rows
    elif a.cmd == "ceiling":
        path = a.dir or benchlib.dataset_path(a.dataset, a.records)
        rows = ceiling(path, a.rounds, log=log)
        print(f"\n# hot epoch in key order of {os.path.basename(path)}, one "
              f"process, medians of {a.rounds} interleaved rounds; C path = "
              f"the Reader's read_window over consecutive windows of 10 "
              f"batches, no Python between them; {info['time']} commit "
              f"{info.get('commit', '?')}\n")
        print(format_ceiling(rows))
        data = rows
    else:
        rows = rss([d for d in a.datasets.split(",") if d],
                   [p for p in a.peers.split(",") if p], log)
        print(f"\n# peak RSS of one full scan, each in a fresh process "
              f"(ru_maxrss); growth = peak - RSS after the imports; "
              f"{info['time']} commit {info.get('commit', '?')}\n")
        print(format_rss(rows))
        data = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(info=info, results=data), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
