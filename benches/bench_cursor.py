"""Full cursor walk, lmdbio vs py-lmdb, with the raw sequential pread as the
limit peer.  pytest benches/bench_cursor.py --benchmark-only

Groups ``cursor-<dataset>-<hot|cold>`` put the peers of one condition side
by side in pytest-benchmark's table:

- ``pread``: sequential pread of data.mdb in page-aligned 4 MiB blocks;
- ``py-lmdb``: ``for k, v in txn.cursor()`` with py-lmdb;
- ``lmdbio``: the same code with ``import lmdbio as lmdb``.

Each timed call opens the environment, walks every record and closes it
(opening is negligible next to a walk, and closing is what lets the page
cache be dropped: pages a live mmap maps survive drop_caches).
hot: one untimed warm-up pass, then LMDBIO_BENCH_ROUNDS rounds (default 5).
cold: the page cache is dropped before each of LMDBIO_BENCH_COLD_ROUNDS
rounds (default 3), in pedantic mode's setup (untimed).

pytest-benchmark runs the rounds of one peer back to back, so the ratios
quoted in the notes come from compare.py, which interleaves the peers.

Run as a script, it measures the drop-in API as a user meets it: each run is
a fresh ``python -c`` process (imports excluded, open included), the peers
run the same code except the import, interleaved A B B A, hot after a
warm-up run of each, cold after dropping the page cache before every run;
it prints medians and the lmdbio / py-lmdb ratio per case::

    python benches/bench_cursor.py --dir DATASETS [--runs 5] [--cond hot,cold]

DATASETS holds ``small``, ``big`` and ``shuffled`` (benches/datasets.py).
Cases: ``scan`` (``for k, v in txn.cursor()``), ``scan-buffers`` (the same
with ``begin(buffers=True)``), ``get`` (``txn.get`` of 100k keys in a
shuffled order) and, for ``big``, ``pread`` (the file read sequentially in
4 MiB blocks: the limit of a scan).
"""

import argparse
import os
import statistics
import subprocess
import sys

try:
    import pytest
except ImportError:  # run as a script without pytest
    pytest = None

import benchlib

PEERS = ["pread", "py-lmdb", "lmdbio"]
DATASETS = ["small", "big"]
CONDITIONS = ["hot", "cold"]


def _target(peer, path, request):
    if peer == "pread":
        raw = benchlib.RawPread()
        return lambda: raw(path)
    if peer == "py-lmdb":
        mod = request.getfixturevalue("pylmdb_mod")
    else:
        mod = request.getfixturevalue("lmdbio_mod")
    return lambda: benchlib.cursor_walk(mod, path)


def _param(*a):
    return pytest.mark.parametrize(*a) if pytest else (lambda f: f)


@_param("cond", CONDITIONS)
@_param("dataset", DATASETS)
@_param("peer", PEERS)
def test_cursor_walk(benchmark, request, bench_dataset, cold_cache, rounds,
                     peer, dataset, cond):
    path = bench_dataset(dataset)
    m = benchlib.meta(path)
    fn = _target(peer, path, request)
    expect = m["file_bytes"] if peer == "pread" else m["records"]

    benchmark.group = f"cursor-{dataset}-{cond}"
    benchmark.extra_info.update(
        dataset=dataset, cond=cond, peer=peer, records=m["records"],
        file_bytes=m["file_bytes"], payload_bytes=m["key_bytes"] + m["value_bytes"],
        lmdbio_impl=benchlib.impl_name() if peer == "lmdbio" else None)

    if cond == "hot":
        assert fn() == expect  # warm-up pass (and a count check), untimed
        result = benchmark.pedantic(fn, rounds=rounds["hot"], iterations=1)
    else:
        methods = set()

        def setup():
            methods.add(cold_cache.drop(path))

        result = benchmark.pedantic(fn, setup=setup, rounds=rounds["cold"],
                                    iterations=1)
        benchmark.extra_info["cold_method"] = ",".join(sorted(methods))
    assert result == expect
    st = getattr(benchmark.stats, "stats", None)  # None with --benchmark-disable
    if st is not None and st.median > 0:
        benchmark.extra_info["records_per_s_median"] = m["records"] / st.median
        benchmark.extra_info["file_GBps_median"] = m["file_bytes"] / st.median / 1e9


# --------------------------------------------------------------------------
# fresh-process runs (python benches/bench_cursor.py)
# --------------------------------------------------------------------------

# One run: the module is imported before the clock starts; opening the
# environment is timed.  Prints "seconds cpu-seconds records" (CPU: of all
# the process's threads, steadier than wall time on a shared machine).
CHILD = r"""
import json, os, random, sys, time
peer, path, case = sys.argv[1], sys.argv[2], sys.argv[3]
if peer == "lmdbio":
    import lmdbio as lmdb
elif peer == "py-lmdb":
    import lmdb
keys = None
if case == "get":
    with open(os.path.join(path, "meta.json")) as f:
        n = json.load(f)["records"]
    keys = [b"%08d" % i for i in random.Random(1).sample(range(n), min(n, 100000))]
t0 = time.perf_counter()
c0 = time.process_time()
count = 0
if case == "pread":
    fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY)
    buf = bytearray(4 << 20)
    while True:
        got = os.readv(fd, [buf])
        if not got:
            break
        count += got
    os.close(fd)
else:
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin(buffers=(case == "scan-buffers")) as txn:
        if case == "get":
            for k in keys:
                if txn.get(k) is not None:
                    count += 1
        else:
            for k, v in txn.cursor():
                count += 1
    env.close()
print(time.perf_counter() - t0, time.process_time() - c0, count)
"""


def _drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _run(peer, path, case, cold):
    if cold:
        _drop_caches()
    out = subprocess.run([sys.executable, "-c", CHILD, peer, path, case],
                         check=True, capture_output=True, text=True).stdout
    secs, cpu, count = out.split()
    return float(secs), float(cpu), int(count)


def fresh_compare(path, case, peers, runs, cold):
    """Medians of `runs` fresh-process runs per peer, interleaved A B B A:
    ({peer: wall seconds}, {peer: CPU seconds}, {peer: records})."""
    times = {p: [] for p in peers}
    cpus = {p: [] for p in peers}
    counts = {}
    if not cold:
        for p in peers:              # warm-up (page cache, not timed)
            _run(p, path, case, False)
    for i in range(runs):
        order = peers if i % 2 == 0 else peers[::-1]
        for p in order:
            secs, cpu, n = _run(p, path, case, cold)
            times[p].append(secs)
            cpus[p].append(cpu)
            counts.setdefault(p, n)
            if counts[p] != n:
                raise SystemExit(f"{p} {case}: {n} records, then {counts[p]}")
    return ({p: statistics.median(t) for p, t in times.items()},
            {p: statistics.median(t) for p, t in cpus.items()}, counts)


def main(argv=None):
    ap = argparse.ArgumentParser(description="fresh-process drop-in cursor "
                                 "comparison, lmdbio vs py-lmdb")
    ap.add_argument("--dir", required=True,
                    help="directory holding small/, big/, shuffled/")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cond", default="hot,cold")
    ap.add_argument("--cases", default="small:scan,small:scan-buffers,"
                    "small:get,shuffled:scan,shuffled:get,big:scan,big:pread")
    args = ap.parse_args(argv)
    print(f"# {args.runs} fresh-process runs per peer, interleaved, medians; "
          f"a shared, noisy machine", flush=True)
    print(f"{'case':<24} {'cond':<5} {'py-lmdb s':>10} {'lmdbio s':>10} "
          f"{'ratio':>7}   {'cpu ratio':>9}", flush=True)
    for cond in args.cond.split(","):
        for spec in args.cases.split(","):
            ds, case = spec.split(":")
            path = os.path.join(args.dir, ds)
            if case == "pread":
                med, cpu, _ = fresh_compare(path, "pread", ["pread"],
                                            args.runs, cond == "cold")
                ref, rcpu, _ = fresh_compare(path, "scan", ["lmdbio"],
                                             args.runs, cond == "cold")
                print(f"{ds + ':scan vs pread':<24} {cond:<5} "
                      f"{med['pread']:>10.3f} {ref['lmdbio']:>10.3f} "
                      f"{med['pread'] / ref['lmdbio']:>6.2f}x   "
                      f"{cpu['pread'] / rcpu['lmdbio']:>8.2f}x  "
                      f"(lmdbio scan / raw pread throughput)", flush=True)
                continue
            med, cpu, counts = fresh_compare(path, case, ["py-lmdb", "lmdbio"],
                                             args.runs, cond == "cold")
            if counts["py-lmdb"] != counts["lmdbio"]:
                raise SystemExit(f"{spec}: record counts differ: {counts}")
            print(f"{spec:<24} {cond:<5} {med['py-lmdb']:>10.3f} "
                  f"{med['lmdbio']:>10.3f} "
                  f"{med['py-lmdb'] / med['lmdbio']:>6.2f}x   "
                  f"{cpu['py-lmdb'] / cpu['lmdbio']:>8.2f}x", flush=True)


if __name__ == "__main__":
    sys.exit(main())
