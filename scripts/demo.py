#!/usr/bin/env python3
"""Read a Caffe-style LMDB with py-lmdb and with lmdbio; show they agree.

Creates ./data/demo_lmdb (unless it is there already): records keyed "%08d"
whose values are serialized Caffe Datum messages (3x32x32 random uint8 pixels
and a label), written with py-lmdb.  Then reads the whole database with a
cursor, once with py-lmdb and once with lmdbio, checks that both give the same
(key, value) sequence and prints a comparison.  Exits 1 if they differ.

    python scripts/demo.py [--records N] [--path DIR] [--force]
"""

import argparse
import os
import shutil
import sys
import time

import lmdb
import numpy as np

import lmdbio

# --- a tiny protobuf wire-format encoder for caffe.Datum -------------------
# (docs: caffe-formats.md).  field numbers: channels=1 height=2 width=3
# data=4 label=5; wire types: 0 varint, 2 length-delimited.


def _varint(n):
    if n < 0:  # int32 negatives are sign-extended to 64 bits: 10 bytes
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field_varint(number, value):
    return _varint(number << 3 | 0) + _varint(value)


def _field_bytes(number, value):
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def encode_datum(pixels, label):
    """Serialize a (C, H, W) uint8 array and an int label as caffe.Datum."""
    c, h, w = pixels.shape
    return b"".join((
        _field_varint(1, c),
        _field_varint(2, h),
        _field_varint(3, w),
        _field_bytes(4, pixels.tobytes()),
        _field_varint(5, label),
    ))


# --- the sample database -----------------------------------------------------


def make_sample(path, records, shape=(3, 32, 32), seed=0):
    """Write `records` Datums with py-lmdb into `path` (built beside, then renamed)."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(seed)
    per = int(np.prod(shape))
    map_size = max(1 << 26, records * (per + 4096) * 2)
    env = lmdb.open(tmp, map_size=map_size, subdir=True)
    chunk = 4096
    for start in range(0, records, chunk):
        n = min(chunk, records - start)
        pixels = rng.integers(0, 256, size=(n,) + tuple(shape), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n)
        with env.begin(write=True) as txn:
            for i in range(n):
                key = b"%08d" % (start + i)
                txn.put(key, encode_datum(pixels[i], int(labels[i])), append=True)
    env.close()
    shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)


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
    args = ap.parse_args(argv)

    if args.force or not os.path.exists(os.path.join(args.path, "data.mdb")):
        print(f"writing {args.records} Caffe Datum records (3x32x32 uint8) "
              f"with py-lmdb into {args.path} ...", flush=True)
        t0 = time.perf_counter()
        make_sample(args.path, args.records)
        print(f"  done in {time.perf_counter() - t0:.2f} s")
    else:
        print(f"using existing {args.path} (--force rewrites it)")

    size = os.path.getsize(os.path.join(args.path, "data.mdb"))
    version = ".".join(map(str, lmdbio.version())) if hasattr(lmdbio, "version") else "?"
    print(f"lmdbio {version} from {os.path.dirname(lmdbio.__file__)}")
    print(f"data.mdb: {size / 2**20:.1f} MiB\n")

    results = []
    items = {}
    for name, module in (("py-lmdb", lmdb), ("lmdbio", lmdbio)):
        it, secs = read_all(module, args.path)
        items[name] = it
        nbytes = sum(len(k) + len(v) for k, v in it)
        results.append((name, len(it), nbytes, secs))

    print(f"{'reader':<10} {'records':>10} {'bytes':>14} {'seconds':>9} {'records/s':>12}")
    for name, n, nbytes, secs in results:
        rate = n / secs if secs > 0 else float("inf")
        print(f"{name:<10} {n:>10,} {nbytes:>14,} {secs:>9.3f} {rate:>12,.0f}")
    (_, _, _, t_ref), (_, _, _, t_io) = results
    ratio = t_ref / t_io if t_io > 0 else float("inf")
    print(f"\nlmdbio / py-lmdb throughput: {ratio:.2f}x  (both from the page cache; "
          f"this checks exactness, the benchmarks measure speed)")

    ref, got = items["py-lmdb"], items["lmdbio"]
    identical = ref == got and len(ref) > 0
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
