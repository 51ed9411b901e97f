#!/usr/bin/env python3
"""Deterministic LMDB benchmark datasets.

    python benches/datasets.py NAME PATH [--records N] [--seed S] [--quick]
    python benches/datasets.py --list

or from Python::

    from datasets import generate
    generate("small", "/tmp/small_lmdb")            # -> "/tmp/small_lmdb"
    generate("big", "/tmp/big_lmdb", records=500)

Datasets (``records`` default, ``quick`` size for fast runs):

==============  =======  =====  ===============================================
name            records  quick  content
==============  =======  =====  ===============================================
small           500000   50000  MNIST-like Datum 1x28x28 (797 B), appended
cifar           50000    10000  CIFAR-like Datum 3x32x32 (3087 B, one overflow
                                page each on 4 KiB pages), appended
big             3000     300    ImageNet-like raw Datum 3xHx256, H in
                                [200, 266] (150-200 KiB, overflow runs),
                                appended
shuffled        200000   20000  like ``small``, inserted in random key order
                                (leaves scattered through the file)
shuffled-cifar  50000    10000  like ``cifar``, inserted in random key order
                                (the values' overflow pages out of file order)
tiny            1000000  100000 feature-vector Datum 1x8x8 (~80 B, about 43 a
                                leaf: no record map), appended
mixed           300000   30000  Datum 1xHx32, H in [3, 93] (100-3000 B; the
                                third over half a page in an overflow page
                                each, between the leaves), appended
==============  =======  =====  ===============================================

``NAME-quick`` (e.g. ``small-quick``) selects the quick size.

Keys are ``b"%08d" % i`` and record ``i`` is the same bytes whatever order it
was inserted in (its content depends only on ``seed``, the dataset name and
``i``), so ``shuffled`` and ``small`` hold byte-identical records with
different page layouts.  Files are generated with py-lmdb (liblmdb) into
``PATH.tmp-<pid>`` and renamed into place when complete; ``PATH/meta.json``
describes what was generated (name, records, seed, bytes).

Values are serialized Caffe ``Datum`` messages written by a small hand-written
protobuf encoder (:func:`encode_datum`) that produces the bytes Caffe's own
(proto2, C++) serializer writes: fields in number order, set fields only,
``encoded`` written (as Caffe's ``CVMatToDatum`` sets it), ``float_data``
unpacked by default (proto2's default) or packed with ``packed=True``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import time

import numpy as np

FORMAT_VERSION = 1  # bump when the bytes a (name, records, seed) produce change

# --------------------------------------------------------------------------
# Caffe Datum encoder (proto2 wire format, hand-written)
# --------------------------------------------------------------------------

_WT_VARINT, _WT_I64, _WT_LEN, _WT_I32 = 0, 1, 2, 5


def _varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int (< 2**64)."""
    if n < 0:
        raise ValueError("varint of a negative number: use _int32")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _int32(v: int) -> bytes:
    """An int32 field value: negative numbers are sign-extended to 64 bits
    (10-byte varints), as protobuf does."""
    v = int(v)
    if not -(2**31) <= v < 2**31:
        raise ValueError(f"int32 out of range: {v}")
    return _varint(v & 0xFFFFFFFFFFFFFFFF)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


_TAG_CHANNELS = _tag(1, _WT_VARINT)  # 0x08
_TAG_HEIGHT = _tag(2, _WT_VARINT)  # 0x10
_TAG_WIDTH = _tag(3, _WT_VARINT)  # 0x18
_TAG_DATA = _tag(4, _WT_LEN)  # 0x22
_TAG_LABEL = _tag(5, _WT_VARINT)  # 0x28
_TAG_FLOAT_PACKED = _tag(6, _WT_LEN)  # 0x32
_TAG_FLOAT = _tag(6, _WT_I32)  # 0x35
_TAG_ENCODED = _tag(7, _WT_VARINT)  # 0x38


def encode_datum(
    data=None,
    label=None,
    channels=None,
    height=None,
    width=None,
    float_data=None,
    encoded=False,
    packed=False,
) -> bytes:
    """Serialize a Caffe ``Datum``.

    ``data``: bytes-like (C*H*W uint8, channel-major) or a numpy uint8 array
    of shape (C, H, W) (then channels/height/width default to its shape).
    ``float_data``: sequence of floats (field 6; unpacked fixed32 each unless
    ``packed``).  ``encoded``: True/False writes field 7, None omits it.
    Fields left as None are not written (proto2 "not set").
    """
    if isinstance(data, np.ndarray):
        if data.ndim == 3:
            c, h, w = data.shape
            channels = c if channels is None else channels
            height = h if height is None else height
            width = w if width is None else width
        data = np.ascontiguousarray(data, dtype=np.uint8).tobytes()
    parts = []
    if channels is not None:
        parts += (_TAG_CHANNELS, _int32(channels))
    if height is not None:
        parts += (_TAG_HEIGHT, _int32(height))
    if width is not None:
        parts += (_TAG_WIDTH, _int32(width))
    if data is not None:
        data = bytes(data)
        parts += (_TAG_DATA, _varint(len(data)), data)
    if label is not None:
        parts += (_TAG_LABEL, _int32(label))
    if float_data is not None and len(float_data):
        fd = np.asarray(float_data, dtype="<f4")
        if packed:
            raw = fd.tobytes()
            parts += (_TAG_FLOAT_PACKED, _varint(len(raw)), raw)
        else:
            parts += [_TAG_FLOAT + struct.pack("<f", x) for x in fd.tolist()]
    if encoded is not None:
        parts += (_TAG_ENCODED, b"\x01" if encoded else b"\x00")
    return b"".join(parts)


def datum_header(channels, height, width) -> bytes:
    """The constant prefix of a raw Datum up to the data length (fast path
    for the generators: header + varint(len) + pixels + label + encoded)."""
    return (
        _TAG_CHANNELS + _int32(channels) + _TAG_HEIGHT + _int32(height)
        + _TAG_WIDTH + _int32(width) + _TAG_DATA
    )


# --------------------------------------------------------------------------
# Dataset specifications
# --------------------------------------------------------------------------

DATASETS = {
    "small": dict(records=500_000, quick=50_000, kind="mnist", order="append",
                  doc="MNIST-like Datum 1x28x28 (~800 B), appended in key order"),
    "cifar": dict(records=50_000, quick=10_000, kind="cifar", order="append",
                  doc="Datum 3x32x32 (~3 KiB), appended in key order"),
    "big": dict(records=3_000, quick=300, kind="imagenet", order="append",
                doc="Datum 3xHx256, 150-200 KiB (overflow pages), appended"),
    "shuffled": dict(records=200_000, quick=20_000, kind="mnist", order="random",
                     doc="MNIST-like Datum (~800 B) inserted in random key order"),
    "shuffled-cifar": dict(records=50_000, quick=10_000, kind="cifar",
                           order="random",
                           doc="CIFAR-like Datum (~3 KiB, one overflow page "
                               "each) inserted in random key order"),
    "tiny": dict(records=1_000_000, quick=100_000, kind="features",
                 order="append",
                 doc="Datum 1x8x8 (~80 B, dozens a leaf), appended in key order"),
    "mixed": dict(records=300_000, quick=30_000, kind="mixed", order="append",
                  doc="Datum 1xHx32, H in [3, 93] (100-3000 B; a third over "
                      "half a page, each in an overflow page after its "
                      "leaf), appended in key order"),
}

# records generated per batch (record i's bytes depend on its chunk's rng, so
# these are part of the format: changing them changes the data)
_CHUNK = {"mnist": 10_000, "cifar": 10_000, "imagenet": 64,
          "features": 10_000, "mixed": 10_000}


def _chunk(base):
    return _CHUNK[DATASETS[base]["kind"]]


def resolve(name: str, records: int | None = None):
    """(base name, spec, record count) for NAME or NAME-quick."""
    base, quick = name, False
    if name.endswith("-quick"):
        base, quick = name[: -len("-quick")], True
    if base not in DATASETS:
        raise ValueError(
            f"unknown dataset {name!r}; known: "
            + ", ".join(sorted(DATASETS)) + " (and NAME-quick)")
    spec = DATASETS[base]
    if records is None:
        records = spec["quick"] if quick else spec["records"]
    records = int(records)
    if records < 0:
        raise ValueError("records must be >= 0")
    return base, spec, records


def _chunk_rng(seed: int, base: str, chunk: int):
    # Depends on (seed, dataset kind, chunk number) only: record i's bytes are
    # independent of the record count and of the insertion order.
    kind = DATASETS[base]["kind"]
    tag = int.from_bytes(kind.encode()[:8].ljust(8, b"\0"), "little")
    return np.random.default_rng([seed, tag, chunk])


def _values_mnist(rng, n):
    # sparse "digit" images: ~20% non-zero pixels, like MNIST's ink density
    px = rng.integers(0, 256, size=(n, 784), dtype=np.uint8)
    px[rng.random((n, 784)) > 0.2] = 0
    labels = rng.integers(0, 10, size=n)
    head = datum_header(1, 28, 28) + _varint(784)
    enc = _TAG_ENCODED + b"\x00"
    return [head + px[j].tobytes() + _TAG_LABEL + _int32(int(labels[j])) + enc
            for j in range(n)]


def _dense_datums(rng, n, channels, height, width):
    # uniform random pixels and labels 0-9 (drawn in this order: the bytes
    # are part of the format)
    size = channels * height * width
    px = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n)
    head = datum_header(channels, height, width) + _varint(size)
    enc = _TAG_ENCODED + b"\x00"
    return [head + px[j].tobytes() + _TAG_LABEL + _int32(int(labels[j])) + enc
            for j in range(n)]


def _values_cifar(rng, n):
    return _dense_datums(rng, n, 3, 32, 32)


def _values_imagenet(rng, n):
    heights = rng.integers(200, 267, size=n)  # 3*200*256=150 KiB .. 3*266*256
    labels = rng.integers(0, 1000, size=n)
    enc = _TAG_ENCODED + b"\x00"
    out = []
    for j in range(n):
        size = 3 * int(heights[j]) * 256
        px = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        out.append(datum_header(3, int(heights[j]), 256) + _varint(size) + px
                   + _TAG_LABEL + _int32(int(labels[j])) + enc)
    return out


def _values_features(rng, n):
    return _dense_datums(rng, n, 1, 8, 8)


def _values_mixed(rng, n):
    heights = rng.integers(3, 94, size=n)   # 96 .. 2976 bytes of pixels
    labels = rng.integers(0, 10, size=n)
    enc = _TAG_ENCODED + b"\x00"
    out = []
    for j in range(n):
        size = int(heights[j]) * 32
        px = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        out.append(datum_header(1, int(heights[j]), 32) + _varint(size) + px
                   + _TAG_LABEL + _int32(int(labels[j])) + enc)
    return out


_MAKERS = {"mnist": _values_mnist, "cifar": _values_cifar,
           "imagenet": _values_imagenet, "features": _values_features,
           "mixed": _values_mixed}


def record_values(name: str, start: int, stop: int, seed: int = 0):
    """Values of records [start, stop) of dataset NAME (any record count)."""
    base, spec, _ = resolve(name, 0)
    maker = _MAKERS[spec["kind"]]
    ch = _chunk(base)
    out = []
    for c in range(start // ch, (stop + ch - 1) // ch):
        vals = maker(_chunk_rng(seed, base, c), ch)
        lo = max(start, c * ch) - c * ch
        hi = min(stop, (c + 1) * ch) - c * ch
        out.extend(vals[lo:hi])
    return out


def key(i: int) -> bytes:
    return b"%08d" % i


def _estimate_bytes(spec, records):
    per = {"mnist": 820, "cifar": 4096, "imagenet": 204_800 + 4096,
           "features": 128, "mixed": 2600}[spec["kind"]]
    factor = 2.2 if spec["order"] == "random" else 1.3
    return int(records * per * factor) + (64 << 20)


def generate(name: str, path: str, records: int | None = None, seed: int = 0,
             verbose: bool = False) -> str:
    """Write dataset NAME (``small``, ``cifar``, ``big``, ``shuffled``,
    ``shuffled-cifar``, ``tiny``, ``mixed``, or
    ``NAME-quick``) as an LMDB environment directory at PATH and return PATH.

    Deterministic: the same (name, records, seed) gives the same records and,
    with the same liblmdb, the same file.  An existing PATH is replaced.
    """
    import lmdb  # py-lmdb writes the files (lmdbio is read-only)

    base, spec, records = resolve(name, records)
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    env = lmdb.open(tmp, map_size=_estimate_bytes(spec, records), subdir=True,
                    sync=False, metasync=False, lock=True, readahead=False,
                    max_dbs=0)
    key_bytes = value_bytes = 0
    CHUNK = _chunk(base)
    try:
        if spec["order"] == "append":
            for c0 in range(0, records, CHUNK):
                c1 = min(records, c0 + CHUNK)
                vals = record_values(base, c0, c1, seed)
                with env.begin(write=True) as txn:
                    put = txn.put
                    for i, v in zip(range(c0, c1), vals):
                        if not put(key(i), v, append=True):
                            raise RuntimeError(f"append failed at {i}")
                        value_bytes += len(v)
                key_bytes += 8 * (c1 - c0)
                if verbose:
                    print(f"\r{name}: {c1}/{records}", end="", file=sys.stderr)
        else:
            # insertion order: a seeded permutation of all keys; each record's
            # value is still a function of its key only.
            perm = np.random.default_rng([seed, 0x5348554646]).permutation(records)
            cache = {}
            for p0 in range(0, records, CHUNK):
                idx = perm[p0:p0 + CHUNK]
                with env.begin(write=True) as txn:
                    put = txn.put
                    for i in idx.tolist():
                        c = i // CHUNK
                        vals = cache.get(c)
                        if vals is None:
                            lo = c * CHUNK
                            vals = record_values(base, lo, min(records, lo + CHUNK), seed)
                            cache[c] = vals  # holds the dataset: keep it modest
                        v = vals[i - c * CHUNK]
                        if not put(key(i), v, overwrite=False):
                            raise RuntimeError(f"duplicate key {i}")
                        value_bytes += len(v)
                key_bytes += 8 * len(idx)
                if verbose:
                    print(f"\r{name}: {min(records, p0 + CHUNK)}/{records}",
                          end="", file=sys.stderr)
        env.sync(True)
        stat = env.stat()
        info = env.info()
    finally:
        env.close()
    if verbose:
        print(file=sys.stderr)
    assert stat["entries"] == records, (stat, records)
    data_mdb = os.path.join(tmp, "data.mdb")
    meta = dict(
        name=base, requested=name, records=records, seed=seed,
        format_version=FORMAT_VERSION, lmdb_version=".".join(map(str, lmdb.version())),
        order=spec["order"], kind=spec["kind"], doc=spec["doc"],
        key_bytes=key_bytes, value_bytes=value_bytes,
        file_bytes=os.path.getsize(data_mdb), psize=stat["psize"],
        depth=stat["depth"], leaf_pages=stat["leaf_pages"],
        branch_pages=stat["branch_pages"], overflow_pages=stat["overflow_pages"],
        last_pgno=info["last_pgno"], seconds=round(time.perf_counter() - t0, 2),
    )
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    # the lock file is not part of the dataset (readers may create their own)
    try:
        os.remove(os.path.join(tmp, "lock.mdb"))
    except FileNotFoundError:
        pass
    if os.path.lexists(path):
        shutil.rmtree(path)
    os.rename(tmp, path)
    return path


def read_meta(path: str):
    """meta.json of a generated dataset, or None."""
    try:
        with open(os.path.join(os.fspath(path), "meta.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ensure(name: str, path: str, records: int | None = None, seed: int = 0,
           verbose: bool = False) -> str:
    """generate() unless PATH already holds exactly this dataset."""
    base, _, n = resolve(name, records)
    m = read_meta(path)
    if (m and m.get("name") == base and m.get("records") == n
            and m.get("seed") == seed and m.get("format_version") == FORMAT_VERSION
            and os.path.exists(os.path.join(path, "data.mdb"))
            and os.path.getsize(os.path.join(path, "data.mdb")) == m.get("file_bytes")):
        return os.fspath(path)
    return generate(name, path, records=records, seed=seed, verbose=verbose)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", nargs="?",
                    help="small, cifar, big, shuffled, shuffled-cifar, tiny "
                         "(or NAME-quick)")
    ap.add_argument("path", nargs="?", help="environment directory to create")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="use the quick size")
    ap.add_argument("--list", action="store_true", help="list the datasets")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.list or not a.name:
        for k, s in DATASETS.items():
            print(f"{k:9s} {s['records']:>8d} records (quick {s['quick']:>6d}): {s['doc']}")
        return 0
    if not a.path:
        ap.error("PATH is required")
    name = a.name + "-quick" if a.quick and not a.name.endswith("-quick") else a.name
    p = generate(name, a.path, records=a.records, seed=a.seed, verbose=not a.quiet)
    m = read_meta(p)
    print(f"{p}: {m['records']} records, {m['file_bytes'] / 1e6:.1f} MB data.mdb, "
          f"depth {m['depth']}, {m['leaf_pages']} leaf / {m['overflow_pages']} "
          f"overflow pages, {m['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
