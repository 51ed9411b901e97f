#!/usr/bin/env python3
"""Build a Caffe-style LMDB with `lmdbio convert`, read it with py-lmdb and
with lmdbio, and show they agree.

Creates ./data/demo_lmdb (unless it is there already): random 3x32x32 uint8
images and labels are saved to data/demo_source.npz, then
`lmdbio convert --npz` writes them (through py-lmdb) as serialized Caffe
Datum records keyed "%08d".  Then reads the whole database with a cursor,
once with py-lmdb and once with lmdbio, checks that both give the same
(key, value) sequence, decodes every record back with lmdbio.DatumReader
(Datum -> numpy batches) and checks it against the source arrays.  Exits 1
if anything differs.

The speed comparison runs `for k, v in txn.cursor()` (open included) in a
fresh process per run, the two libraries interleaved A B B A after a
warm-up run of each, and reports the median of each: the page cache is
warm for both, and neither gets an order or a first-run advantage.

    python scripts/demo.py [--records N] [--path DIR] [--force]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import lmdb
import numpy as np

import lmdbio
from lmdbio.bench import child_source

# --- the sample database -----------------------------------------------------


def source_path(path):
    return os.path.join(os.path.dirname(os.path.abspath(path)) or ".",
                        "demo_source.npz")


def make_sample(path, records, shape=(3, 32, 32), seed=0):
    """Random images + labels -> .npz -> `lmdbio convert --npz` -> path."""
    from lmdbio.cli import main as lmdbio_main
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(records,) + tuple(shape), dtype=np.uint8)
    labels = rng.integers(0, 10, size=records)
    src = source_path(path)
    os.makedirs(os.path.dirname(src), exist_ok=True)
    np.savez(src, data=data, labels=labels)
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"  $ lmdbio convert --npz {src} {path}")
    rc = lmdbio_main(["convert", "--npz", "-q", src, tmp])
    if rc != 0:
        raise SystemExit(f"lmdbio convert failed with status {rc}")
    shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)


def check_datums(path):
    """Decode every record with DatumReader; compare with the source arrays.
    Returns (ok, records, seconds)."""
    src = source_path(path)
    if not os.path.exists(src):
        return None, 0, 0.0
    with np.load(src) as f:
        data, labels = f["data"], f["labels"]
    t0 = time.perf_counter()
    got_d, got_l = [], []
    with lmdbio.DatumReader(path, batch_size=1024) as r:
        for d, lab in r:
            got_d.append(d)
            got_l.append(lab)
    secs = time.perf_counter() - t0
    got_d = np.concatenate(got_d) if got_d else np.zeros((0,) + data.shape[1:], np.uint8)
    got_l = np.concatenate(got_l) if got_l else np.zeros(0, np.int64)
    ok = (got_d.shape == data.shape and np.array_equal(got_d, data)
          and np.array_equal(got_l, labels))
    return ok, len(got_l), secs


# --- reading -----------------------------------------------------------------


def read_all(module, path):
    """Every (key, value) in key order via cursor iteration, and the seconds taken."""
    t0 = time.perf_counter()
    env = module.open(path, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()
    return items, time.perf_counter() - t0


# One timed walk in a fresh process: the import is not timed, opening is.
# "reader": the same records as numpy batches through lmdbio.Reader (its
# record index cached by the untimed warm-up walk, as in a later epoch).
# settle(): numpy's BLAS thread spins on a core for ~0.1 s after its import;
# the import is untimed, so is that tail (it would take a core from the
# Reader's threads).
WALK = child_source(r"""
import sys, time
if sys.argv[1] == "reader":
    from lmdbio import Reader  # imports numpy: not timed, as for py-lmdb
    settle()
    t0 = time.perf_counter()
    with Reader(sys.argv[2]) as r:
        n = sum(len(b) for b in r)
    print(time.perf_counter() - t0, n)
    sys.exit()
if sys.argv[1] == "lmdbio":
    import lmdbio as lmdb
else:
    import lmdb
settle()
t0 = time.perf_counter()
env = lmdb.open(sys.argv[2], readonly=True, lock=False)
n = 0
with env.begin() as txn:
    for k, v in txn.cursor():
        n += 1
env.close()
print(time.perf_counter() - t0, n)
""")


def timed_walk(name, path):
    out = subprocess.run([sys.executable, "-c", WALK, name, path], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), int(out[1])


def compare_speed(path, runs):
    """Median seconds per library over `runs` fresh-process walks each,
    interleaved A B B A after one warm-up walk each."""
    names = ["py-lmdb", "lmdbio", "Reader"]
    mods = {"py-lmdb": "lmdb", "lmdbio": "lmdbio", "Reader": "reader"}
    for name in names:
        timed_walk(mods[name], path)
    times = {name: [] for name in names}
    for i in range(runs):
        for name in (names if i % 2 == 0 else names[::-1]):
            times[name].append(timed_walk(mods[name], path)[0])
    return {name: statistics.median(t) for name, t in times.items()}


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default=os.path.join("data", "demo_lmdb"))
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--force", action="store_true", help="rewrite the sample database")
    ap.add_argument("--runs", type=int, default=5,
                    help="timed fresh-process walks per library (default 5)")
    args = ap.parse_args(argv)

    if args.force or not os.path.exists(os.path.join(args.path, "data.mdb")) \
            or not os.path.exists(source_path(args.path)):
        print(f"writing {args.records} Caffe Datum records (3x32x32 uint8) "
              f"into {args.path} with lmdbio convert (py-lmdb writes) ...",
              flush=True)
        t0 = time.perf_counter()
        make_sample(args.path, args.records)
        print(f"  done in {time.perf_counter() - t0:.2f} s")
    else:
        print(f"using existing {args.path} (--force rewrites it)")

    size = os.path.getsize(os.path.join(args.path, "data.mdb"))
    version = ".".join(map(str, lmdbio.version())) if hasattr(lmdbio, "version") else "?"
    print(f"lmdbio {version} from {os.path.dirname(lmdbio.__file__)}")
    print(f"data.mdb: {size / 2**20:.1f} MiB\n")

    items = {}
    for name, module in (("py-lmdb", lmdb), ("lmdbio", lmdbio)):
        items[name], _secs = read_all(module, args.path)
    n = len(items["py-lmdb"])
    nbytes = sum(len(k) + len(v) for k, v in items["py-lmdb"])

    med = compare_speed(args.path, args.runs)
    print(f"`for k, v in txn.cursor()` over {n:,} records ({nbytes:,} bytes), "
          f"open included: median of {args.runs} fresh-process runs each, "
          f"interleaved, page cache warm")
    print(f"(Reader: the same records as numpy batches, lmdbio.Reader(path))")
    print(f"{'reader':<10} {'seconds':>9} {'records/s':>12}")
    for name in ("py-lmdb", "lmdbio", "Reader"):
        secs = med[name]
        rate = n / secs if secs > 0 else float("inf")
        print(f"{name:<10} {secs:>9.4f} {rate:>12,.0f}")
    for name, what in (("lmdbio", "drop-in cursor"), ("Reader", "Reader")):
        ratio = med["py-lmdb"] / med[name] if med[name] > 0 else float("inf")
        print(f"{'' if name == 'Reader' else chr(10)}lmdbio {what} / py-lmdb "
              f"throughput: {ratio:.2f}x")
    print("(wall time on this machine, which may be shared; "
          "`lmdbio bench --fresh` measures more cases, cold cache included)")

    ok, n, secs = check_datums(args.path)
    if ok is not None:
        rate = n / secs if secs > 0 else float("inf")
        print(f"\nDatumReader: {n:,} Datums decoded to numpy in {secs:.3f} s "
              f"({rate:,.0f} records/s); same pixels and labels as the "
              f"source arrays: {'yes' if ok else 'NO'}")

    ref, got = items["py-lmdb"], items["lmdbio"]
    identical = ref == got and len(ref) > 0 and ok is not False
    print(f"identical: {'yes' if identical else 'NO'}")
    if not identical:
        i = first_difference(ref, got)
        if i is not None:
            print(f"first difference at record {i}: py-lmdb "
                  f"{ref[i][0] if i < len(ref) else 'END'!r}, lmdbio "
                  f"{got[i][0] if i < len(got) else 'END'!r}", file=sys.stderr)
        elif not ref:
            print("the database is empty", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
