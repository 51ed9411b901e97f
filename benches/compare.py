#!/usr/bin/env python3
"""Side-by-side, interleaved comparison of lmdbio with its peers (the numbers
that go into the notes; rules in docs/benchmarks.md).

    python benches/compare.py                       # small + big, hot + cold
    python benches/compare.py --datasets small --modes hot --rounds 7
    python benches/compare.py --records small=200000 --records big=1000
    python benches/compare.py --quick               # quick dataset sizes
    LMDBIO_BENCH_IMPL=lmdb python benches/compare.py   # py-lmdb stands in
                                                       # for lmdbio (debug)

For each (dataset, mode) every peer runs once per round, in one process, the
order alternating A B C / C B A between rounds; hot runs follow one untimed
warm-up pass of every peer, cold runs each follow a page-cache drop (untimed).
Peers:

  pread          sequential pread of data.mdb, page-aligned 4 MiB blocks
  py-lmdb        open, ``for k, v in txn.cursor()``, close (py-lmdb)
  lmdbio         the same code with ``import lmdbio as lmdb``
  lmdbio-reader  every record through ``lmdbio.Reader`` (when available;
                 add with --peers)

Reported per peer: median records/s and GB/s (data.mdb bytes / s) over the
rounds, and speed ratios: ``x py-lmdb`` is the median over rounds of
t(py-lmdb) / t(peer) within the same round (> 1: faster than py-lmdb), with
its min-max; ``x pread`` likewise against the raw pread.  Cold rows add the
MB this process read from storage per run (/proc/self/io read_bytes).
``cpu/wall`` is the process CPU time (all threads) over wall time, and
``cpu x py-lmdb`` the median of cpu(py-lmdb)/cpu(row): on a machine busy
with other work (cpu/wall well below 1 in hot rows) it is the steadier
measure of the hot cursor cost.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

ALL_PEERS = ["pread", "py-lmdb", "lmdbio", "lmdbio-reader"]
DEFAULT_PEERS = ["pread", "py-lmdb", "lmdbio"]


def make_peers(names, open_kw, batch_size):
    """name -> (callable(path) -> count, unit) where unit is 'bytes' or
    'records' (what the count must equal)."""
    peers = {}
    for name in names:
        if name == "pread":
            raw = benchlib.RawPread()
            peers[name] = (raw, "bytes")
        elif name == "py-lmdb":
            mod = benchlib.pylmdb_module()
            peers[name] = ((lambda p, mod=mod: benchlib.cursor_walk(mod, p, open_kw)),
                           "records")
        elif name == "lmdbio":
            mod = benchlib.lmdbio_module()
            peers[name] = ((lambda p, mod=mod: benchlib.cursor_walk(mod, p, open_kw)),
                           "records")
        elif name == "lmdbio-reader":
            mod = benchlib.lmdbio_module()
            if not hasattr(mod, "Reader"):
                print(f"[compare] {benchlib.impl_name()} has no Reader: "
                      "skipping lmdbio-reader", file=sys.stderr)
                continue
            peers[name] = ((lambda p, mod=mod: benchlib.reader_walk(mod, p, batch_size)),
                           "records")
        else:
            raise SystemExit(f"unknown peer {name!r} (known: {', '.join(ALL_PEERS)})")
    return peers


def verify(peers, path, open_kw):
    """Untimed: the lmdbio walk must yield exactly py-lmdb's records."""
    if "lmdbio" not in peers:
        return None
    ref = benchlib.walk_digest(benchlib.pylmdb_module(), path, open_kw)
    got = benchlib.walk_digest(benchlib.lmdbio_module(), path, open_kw)
    if ref != got:
        raise SystemExit(f"[compare] MISMATCH on {path}: py-lmdb (count, crc) "
                         f"{ref}, lmdbio {got}")
    return ref


def run_one(fn, path, expect, cold, drop_method):
    method = None
    if cold:
        method = benchlib.drop_cache(path, method=drop_method)
    io0 = benchlib.proc_io().get("read_bytes", 0)
    c0 = time.process_time()
    t0 = time.perf_counter()
    n = fn(path)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    rb = benchlib.proc_io().get("read_bytes", 0) - io0
    if n != expect:
        raise SystemExit(f"[compare] {path}: got {n}, expected {expect}")
    return dict(seconds=dt, cpu=cpu, read_bytes=rb, method=method)


def bench(peers, path, mode, rounds, drop_method, log):
    m = benchlib.meta(path)
    expect = {"bytes": m["file_bytes"], "records": m["records"]}
    names = list(peers)
    runs = {n: [] for n in names}
    cold = mode == "cold"
    if not cold:
        for n in names:  # warm-up pass of every peer, untimed
            fn, unit = peers[n]
            run_one(fn, path, expect[unit], False, drop_method)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            fn, unit = peers[n]
            res = run_one(fn, path, expect[unit], cold, drop_method)
            runs[n].append(res)
            log(f"  {m['name']:8s} {mode:4s} round {r + 1}/{rounds} {n:13s} "
                f"{res['seconds'] * 1e3:9.1f} ms")
    return runs


def summarize(runs, m, mode):
    rows = []
    base = runs.get("py-lmdb")
    lim = runs.get("pread")

    def ratio(ref, mine, key="seconds"):
        if ref is None:
            return None
        rs = [a[key] / b[key] for a, b in zip(ref, mine) if b[key] > 0]
        if not rs:
            return None
        return dict(median=statistics.median(rs), min=min(rs), max=max(rs))

    for n, rs in runs.items():
        t = statistics.median(r["seconds"] for r in rs)
        rows.append(dict(
            peer=n, seconds_median=t, seconds=[r["seconds"] for r in rs],
            cpu_median=statistics.median(r["cpu"] for r in rs),
            records_per_s=m["records"] / t,
            file_GBps=m["file_bytes"] / t / 1e9,
            vs_pylmdb=ratio(base, rs), vs_pread=ratio(lim, rs),
            cpu_vs_pylmdb=ratio(base, rs, "cpu"),
            read_MB=statistics.median(r["read_bytes"] for r in rs) / 1e6,
            cold_method=sorted({r["method"] for r in rs if r["method"]}) or None,
        ))
    return rows


def fmt_ratio(r):
    if r is None:
        return "-"
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def print_table(results, out=sys.stdout):
    hdr = (f"{'dataset':9s} {'records':>8s} {'mode':4s} {'peer':13s} "
           f"{'records/s':>11s} {'GB/s':>6s} {'cpu/wall':>8s} "
           f"{'x py-lmdb (min-max)':>20s} {'x pread (min-max)':>20s} {'read MB':>8s} "
           f"{'cpu x py-lmdb':>13s}")
    print(hdr, file=out)
    print("-" * len(hdr), file=out)
    for res in results:
        for row in res["rows"]:
            cpu = row["cpu_median"] / row["seconds_median"]
            rmb = f"{row['read_MB']:.0f}" if res["mode"] == "cold" else "-"
            print(f"{res['dataset']:9s} {res['records']:>8d} {res['mode']:4s} "
                  f"{row['peer']:13s} {row['records_per_s']:>11,.0f} "
                  f"{row['file_GBps']:>6.2f} {cpu:>8.2f} "
                  f"{fmt_ratio(row['vs_pylmdb']):>20s} "
                  f"{fmt_ratio(row['vs_pread']):>20s} {rmb:>8s} "
                  f"{fmt_cpu(row['cpu_vs_pylmdb']):>13s}", file=out)
        print(file=out)


def fmt_cpu(r):
    return "-" if r is None else f"{r['median']:.2f}"


def parse_records(items):
    out = {}
    for it in items or []:
        name, _, n = it.partition("=")
        if not n:
            raise SystemExit(f"--records wants NAME=N, got {it!r}")
        out[name] = int(n)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--datasets", default="small,big",
                    help="comma-separated (small, big, cifar, shuffled)")
    ap.add_argument("--modes", default="hot,cold", help="hot,cold")
    ap.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                    help=f"comma-separated from {','.join(ALL_PEERS)}")
    ap.add_argument("--rounds", type=int, default=5, help="hot rounds")
    ap.add_argument("--cold-rounds", type=int, default=None,
                    help="cold rounds (default: --rounds)")
    ap.add_argument("--records", action="append", metavar="NAME=N",
                    help="record count of a dataset (repeatable)")
    ap.add_argument("--quick", action="store_true", help="quick dataset sizes")
    ap.add_argument("--lock", type=int, default=0, help="open(lock=) for both cursors")
    ap.add_argument("--readahead", type=int, default=1,
                    help="open(readahead=) for both cursors")
    ap.add_argument("--batch-size", type=int, default=256, help="Reader batch size")
    ap.add_argument("--drop", default="auto", choices=["auto", "drop_caches", "fadvise"],
                    help="cold-cache method")
    ap.add_argument("--no-verify", action="store_true",
                    help="skip the untimed lmdbio == py-lmdb content check")
    ap.add_argument("--no-gc", action="store_true", help="disable the GC while timing")
    ap.add_argument("--json", help="also write all measurements here")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-run log")
    a = ap.parse_args(argv)

    if a.quick:
        os.environ["LMDBIO_BENCH_QUICK"] = "1"
    records = parse_records(a.records)
    open_kw = dict(lock=bool(a.lock), readahead=bool(a.readahead))
    names = [p for p in a.peers.split(",") if p]
    try:
        peers = make_peers(names, open_kw, a.batch_size)
    except ImportError as e:
        raise SystemExit(f"[compare] cannot import the lmdbio peer "
                         f"({benchlib.impl_name()}): {e}\n"
                         "  (LMDBIO_BENCH_IMPL=lmdb runs the suite with py-lmdb "
                         "standing in)")

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    info = benchlib.machine_info()
    info.update(lmdbio_impl=benchlib.impl_name(), open_kw=open_kw,
                peers=list(peers), rounds=a.rounds,
                cold_rounds=a.cold_rounds or a.rounds)
    try:
        mod = benchlib.lmdbio_module() if any(p.startswith("lmdbio") for p in peers) else None
        if mod is not None and hasattr(mod, "version"):
            info["lmdbio_version"] = ".".join(map(str, mod.version()))
    except Exception:
        pass

    results = []
    if a.no_gc:
        gc.disable()
    for ds in [d for d in a.datasets.split(",") if d]:
        path = benchlib.dataset_path(ds, records.get(ds))
        m = benchlib.meta(path)
        if not a.no_verify:
            log(f"[compare] verifying {benchlib.impl_name()} against py-lmdb on {path}")
            verify(peers, path, open_kw)
        for mode in [x for x in a.modes.split(",") if x]:
            if mode not in ("hot", "cold"):
                raise SystemExit(f"unknown mode {mode!r}")
            n = a.rounds if mode == "hot" else (a.cold_rounds or a.rounds)
            runs = bench(peers, path, mode, n, a.drop, log)
            results.append(dict(dataset=m["name"], records=m["records"], mode=mode,
                                path=path, file_bytes=m["file_bytes"],
                                rows=summarize(runs, m, mode)))
    gc.enable()

    print()
    print(f"# lmdbio compare: {info.get('time')}  commit {info.get('commit', '?')}  "
          f"cpu {info.get('cpu', '?')} x{info.get('cpus')}  kernel {info.get('kernel')}")
    cold_methods = sorted({mth for r in results for row in r["rows"]
                           for mth in (row["cold_method"] or [])})
    print(f"# lmdbio peer = {info['lmdbio_impl']}"
          + (f" {info['lmdbio_version']}" if "lmdbio_version" in info else "")
          + f"; open({', '.join(f'{k}={v}' for k, v in open_kw.items())}, readonly=True)"
          + f"; rounds hot {info['rounds']} cold {info['cold_rounds']}, interleaved"
          + (f"; cold via {','.join(cold_methods)}" if cold_methods else ""))
    print("# GB/s = data.mdb bytes / median time; x peer = median over rounds of "
          "t(peer)/t(row) in the same round (>1 = row faster); cpu x py-lmdb "
          "likewise with process CPU time")
    print(f"# load average at the end: {os.getloadavg()[0]:.2f} "
          f"(cpu/wall << 1 in hot rows = the process was waiting for a core)")
    print()
    print_table(results)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(info=info, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
