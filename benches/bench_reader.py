#!/usr/bin/env python3
"""lmdbio.Reader (the bulk path) against its peers.

pytest-benchmark (``pytest benches/bench_reader.py --benchmark-only``):

- ``reader-<dataset>-<hot|cold>``: one epoch through ``Reader`` next to
  the raw sequential pread of data.mdb (page-aligned 4 MiB blocks) and
  py-lmdb's ``for k, v in txn.cursor()``, on small, big (batch_size auto:
  about 4 MiB batches, 23 records) and shuffled (scattered leaves);
- ``shuffled-epoch-<hot|cold>``: ``Reader(shuffle=True)`` next to a
  py-lmdb ``txn.get`` loop in the same order (small);
- ``shard-start-<N>``: the first batch of the last shard (rank 7 of 8),
  hot: DALI-style (py-lmdb cursor stepped ``next()`` to the shard start,
  then a batch read), ``Reader`` on a first start (``index_cache=False``:
  every leaf header before the shard is read) and with the cached index;
- ``rss-<dataset>``: peak RSS of a full scan, in a fresh subprocess
  (``extra_info``: peak and growth over the interpreter's baseline, MB).

pytest-benchmark runs one peer's rounds back to back; the ratios quoted in
the notes come from interleaved runs in one process:

    python benches/compare.py ...                  # scans (lmdbio bench)
    python benches/bench_reader.py shard-start [--records 10000,100000,1000000]
    python benches/bench_reader.py rss [--datasets big-300,big,small-50000,small]

``shard-start`` interleaves DALI-style, Reader first start and Reader with
cached index per N and round (hot: one untimed warm-up of each); ``rss``
runs every (peer, dataset) in a fresh subprocess and prints peak RSS next
to the file size.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import benchlib  # noqa: E402

bench = benchlib.bench

SHARD_RANK, SHARD_WORLD, SHARD_BATCH = 7, 8, 256

# --------------------------------------------------------------------------
# peers of the shard-start figure
# --------------------------------------------------------------------------


def dali_first_batch(path, rank=SHARD_RANK, world=SHARD_WORLD,
                     batch_size=SHARD_BATCH):
    """DALI-style: open, step the cursor from the first record to this
    rank's shard start (api.md's rule: start = rank * ceil(N / world)), then
    read one batch.  The steps run inside py-lmdb's C iterator (keys only,
    consumed by a C-level deque), the cheapest walk py-lmdb offers: close to
    DALI's C++ loop of mdb_cursor_get(MDB_NEXT).  Returns the batch size."""
    lmdb = bench.pylmdb_module()
    env = lmdb.open(path, **bench.OPEN_KW)
    try:
        with env.begin() as txn:
            n = txn.stat()["entries"]
            start = rank * -(-n // world)
            cur = txn.cursor()
            cur.first()
            collections.deque(itertools.islice(
                cur.iternext(keys=True, values=False), start), maxlen=0)
            batch = [kv for kv in itertools.islice(cur.iternext(), batch_size)]
    finally:
        env.close()
    return len(batch)


def reader_first_batch(path, index_cache, rank=SHARD_RANK, world=SHARD_WORLD,
                       batch_size=SHARD_BATCH):
    """Reader: open (index from the cache, or built), first batch of the
    shard.  Returns (batch size, seconds to the first batch, index from
    cache); closing (stopping the prefetch thread) is not timed."""
    mod = bench.lmdbio_module()
    t0 = time.perf_counter()
    r = mod.Reader(path, rank=rank, world_size=world, batch_size=batch_size,
                   lock=False, index_cache=index_cache)
    try:
        b = next(iter(r))
        dt = time.perf_counter() - t0
        return len(b.indices), dt, r.index_from_cache
    finally:
        r.close()


def _shard_peers(path, cache_dir):
    """name -> fn() -> (count, seconds)."""
    def dali():
        t0 = time.perf_counter()
        n = dali_first_batch(path)
        return n, time.perf_counter() - t0

    def first():
        n, dt, cached = reader_first_batch(path, False)
        assert not cached
        return n, dt

    def cached():
        n, dt, hit = reader_first_batch(path, cache_dir)
        if not hit:
            raise RuntimeError("the cached index was not used")
        return n, dt

    return {"dali-style": dali, "reader-first": first, "reader-cached": cached}


def shard_start(records=(10_000, 100_000, 1_000_000), rounds=5, log=None):
    """Interleaved: per N, every peer once per round (order alternating);
    one untimed warm-up each (hot; it also writes the cached index)."""
    results = []
    cache_dir = tempfile.mkdtemp(prefix="lmdbio-bench-index-")
    try:
        for n in records:
            path = benchlib.dataset_path("small", n)
            peers = _shard_peers(path, cache_dir)
            for name, fn in peers.items():  # warm-up
                if name == "reader-cached":
                    reader_first_batch(path, cache_dir)
                fn()
            runs = {k: [] for k in peers}
            names = list(peers)
            for r in range(rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    c0 = time.process_time()
                    cnt, dt = peers[name]()
                    cpu = time.process_time() - c0
                    if cnt != SHARD_BATCH:
                        raise RuntimeError(f"{name}: batch of {cnt}")
                    runs[name].append(dict(seconds=dt, cpu=cpu))
                    if log:
                        log(f"  N={n:>8d} round {r + 1}/{rounds} {name:14s} "
                            f"{dt * 1e3:9.2f} ms")
            results.append(dict(records=n, path=path, runs=runs))
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return results


def format_shard_start(results) -> str:
    hdr = (f"{'N':>9s} {'peer':14s} {'ms (median)':>11s} {'cpu ms':>8s} "
           f"{'x dali-style (min-max)':>24s} {'x N=first':>9s}")
    out = [hdr, "-" * len(hdr)]
    first_t = {}
    for res in results:
        dali = res["runs"]["dali-style"]
        for name, rs in res["runs"].items():
            t = statistics.median(x["seconds"] for x in rs)
            cpu = statistics.median(x["cpu"] for x in rs)
            ratios = [a["seconds"] / b["seconds"] for a, b in zip(dali, rs)]
            first_t.setdefault(name, t)
            rt = (f"{statistics.median(ratios):.1f} ({min(ratios):.1f}-"
                  f"{max(ratios):.1f})")
            out.append(f"{res['records']:>9d} {name:14s} {t * 1e3:>11.2f} "
                       f"{cpu * 1e3:>8.2f} {rt:>24s} "
                       f"{t / first_t[name]:>9.2f}")
        out.append("")
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

    SCAN_PEERS = ["pread", "py-lmdb", "lmdbio-reader"]

    def _run_peer(benchmark, cold_cache, rounds, path, desc, peer, cond,
                  group):
        p = bench.make_peers([peer], desc)[peer]
        expect = desc["file_bytes"] if p.unit == "bytes" else desc["records"]
        if p.prime:
            p.prime(path)
        benchmark.group = group
        benchmark.extra_info.update(peer=peer, cond=cond,
                                    records=desc["records"],
                                    file_bytes=desc["file_bytes"],
                                    batch_size=p.batch)
        if cond == "hot":
            assert p.fn(path) == expect
            result = benchmark.pedantic(p.fn, args=(path,),
                                        rounds=rounds["hot"], iterations=1)
        else:
            methods = set()

            def setup():
                methods.add(cold_cache.drop(path))

            result = benchmark.pedantic(p.fn, args=(path,), setup=setup,
                                        rounds=rounds["cold"], iterations=1)
            benchmark.extra_info["cold_method"] = ",".join(sorted(methods))
        assert result == expect
        st = getattr(benchmark.stats, "stats", None)
        if st is not None and st.median > 0:
            benchmark.extra_info["records_per_s_median"] = desc["records"] / st.median
            benchmark.extra_info["file_GBps_median"] = desc["file_bytes"] / st.median / 1e9

    @pytest.mark.parametrize("cond", ["hot", "cold"])
    @pytest.mark.parametrize("dataset", ["small", "big", "shuffled"])
    @pytest.mark.parametrize("peer", SCAN_PEERS)
    def test_reader_scan(benchmark, lmdbio_mod, bench_dataset, cold_cache,
                         rounds, peer, dataset, cond):
        path = bench_dataset(dataset)
        _run_peer(benchmark, cold_cache, rounds, path, bench.describe(path),
                  peer, cond, f"reader-{dataset}-{cond}")

    @pytest.mark.parametrize("cond", ["hot", "cold"])
    @pytest.mark.parametrize("peer", ["py-lmdb-get", "lmdbio-shuffled"])
    def test_shuffled_epoch(benchmark, lmdbio_mod, bench_dataset, cold_cache,
                            rounds, peer, cond):
        path = bench_dataset("small")
        _run_peer(benchmark, cold_cache, rounds, path, bench.describe(path),
                  peer, cond, f"shuffled-epoch-{cond}")

    @pytest.mark.parametrize("size", ["10k", "100k", "1M"])
    @pytest.mark.parametrize("peer", ["dali-style", "reader-first",
                                      "reader-cached"])
    def test_shard_start(benchmark, lmdbio_mod, bench_dataset, rounds,
                         tmp_path, peer, size):
        records = {"10k": 10_000, "100k": 100_000, "1M": 1_000_000}[size]
        if benchlib.quick():  # 10k, 30k, 100k
            records = {"10k": 10_000, "100k": 30_000, "1M": 100_000}[size]
        path = bench_dataset("small", records)
        fn = _shard_peers(path, str(tmp_path))[peer]
        if peer == "reader-cached":
            reader_first_batch(path, str(tmp_path))  # writes the cache
        fn()  # warm-up (hot)
        benchmark.group = f"shard-start-{records}"
        benchmark.extra_info.update(peer=peer, records=records,
                                    rank=SHARD_RANK, world_size=SHARD_WORLD,
                                    batch_size=SHARD_BATCH)
        n, _ = benchmark.pedantic(fn, rounds=rounds["hot"], iterations=1)
        assert n == SHARD_BATCH

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
    s.add_argument("--json")
    s.add_argument("-q", "--quiet", action="store_true")
    r = sub.add_parser("rss", help="peak RSS of a full scan vs file size")
    r.add_argument("--datasets", default="big-300,big,small-50000,small",
                   help="NAME or NAME-RECORDS, comma-separated")
    r.add_argument("--peers", default=",".join(RSS_PEERS))
    r.add_argument("--json")
    r.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    info = benchlib.machine_info()
    if a.cmd == "shard-start":
        recs = [int(x) for x in a.records.split(",") if x]
        res = shard_start(recs, a.rounds, log)
        print(f"\n# last shard's first batch: rank {SHARD_RANK} of "
              f"{SHARD_WORLD}, batch {SHARD_BATCH}, small records, hot; "
              f"{a.rounds} rounds interleaved; {info['time']} commit "
              f"{info.get('commit', '?')}; load {os.getloadavg()[0]:.2f}")
        print("# x dali-style = median over rounds of t(dali)/t(row), same "
              "round; x N=first = t(row at N) / t(same peer at the first N)\n")
        print(format_shard_start(res))
        data = res
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
