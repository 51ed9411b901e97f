#!/usr/bin/env python3
"""Caffe Datum benchmarks, side by side and
interleaved in one process:

1. decode: one CIFAR-like batch of 50k Datums (3x32x32) already in memory
   (a Ragged, as Reader batches carry) into np.uint8[n, 3, 32, 32] + labels:
     protobuf   per record ``Datum.ParseFromString`` + ``np.frombuffer`` +
                reshape, then ``np.stack`` (what pycaffe users write)
     lmdbio     ``lmdbio.datum.decode(values)`` (fresh output array; default
                threads), and with ``threads=1``, and into a preallocated
                array (``out=``)
     copy       the limit: a bare copy of the same pixel bytes into a
                preallocated array (numpy, from the batch buffer)
   targets: lmdbio >= 10x protobuf, within 2x of the bare copy.
2. end to end on the ``cifar`` dataset (50k records, benches/datasets.py):
   ready, transformed float32 batches (crop 28, mirror, mean values, scale;
   batch 256) per second:
     py-lmdb+pb+np  py-lmdb cursor, protobuf parse, np.frombuffer, np.stack,
                    numpy crop/mirror/mean/scale per batch
     DatumReader    ``lmdbio.DatumReader(path, transform=Transform(...))``
   target: DatumReader >= 8x.
3. encoded JPEG Datums (generated: --jpeg-records of 3 x S x S): decoded
   BGR batches per second, single-threaded Pillow (py-lmdb + protobuf +
   PIL) next to DatumReader with 1 and 2 decode threads, per image library.

    python benches/bench_datum.py                       # everything
    python benches/bench_datum.py --only decode --rounds 9
    python benches/bench_datum.py --quick               # small sizes
    python benches/bench_datum.py --json /tmp/datum.json

Datasets are cached under $LMDBIO_BENCH_DIR (default data/bench).  The
machine is shared and noisy: quote the median ratio with its range.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import benchlib  # noqa: E402
import datasets  # noqa: E402

MEAN = np.array([104.0, 117.0, 123.0], dtype=np.float32)
SCALE = 0.00390625
CROP = 28
BATCH = 256


def _datum_class():
    try:
        from caffe_pb import Datum  # tests/caffe_pb.py: descriptor-built
        return Datum
    except ImportError:
        sys.exit("needs tests/caffe_pb.py (protobuf's Datum) on sys.path")


# --------------------------------------------------------------------------
# timing


def interleaved(peers, rounds, warmup=1):
    """{name: [seconds per round]}; order alternates A B C / C B A.  A peer
    with a ``setup`` attribute has it called, untimed, before each call."""
    names = list(peers)
    for _ in range(warmup):
        for n in names:
            getattr(peers[n], "setup", lambda: None)()
            peers[n]()
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            getattr(peers[n], "setup", lambda: None)()
            gc.collect()
            t0 = time.perf_counter()
            peers[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def ratios(times, ref, row):
    """median and range over rounds of t(ref)/t(row) in the same round."""
    r = [a / b for a, b in zip(times[ref], times[row])]
    return statistics.median(r), min(r), max(r)


def fmt_ratio(x):
    med, lo, hi = x
    return "%.2fx (%.2f-%.2f)" % (med, lo, hi)


# --------------------------------------------------------------------------
# 1. decode


def bench_decode(values, rounds):
    from lmdbio import datum as ld
    from lmdbio.reader import Ragged
    Datum = _datum_class()
    n = len(values)
    lens = np.fromiter(map(len, values), np.int64, n)
    offs = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    rag = Ragged(np.frombuffer(b"".join(values), np.uint8), offs)
    first, _ = ld.decode_one(values[0])
    shape = first.shape
    size = first.size
    # where the pixels are in each record (all the same layout here)
    from lmdbio import _datum
    poff = _datum.parse(np.frombuffer(values[0], np.uint8))["data_off"]
    fixed = rag.fixed()
    assert fixed[0, poff:poff + size].tobytes() == first.tobytes()
    pre = np.empty((n,) + shape, np.uint8)
    pre2 = np.empty((n,) + shape, np.uint8)
    pre.fill(0)
    pre2.fill(0)

    def protobuf():
        arrs, labels = [], []
        for v in values:
            d = Datum()
            d.ParseFromString(v)
            arrs.append(np.frombuffer(d.data, np.uint8).reshape(
                d.channels, d.height, d.width))
            labels.append(d.label)
        return np.stack(arrs), np.array(labels, np.int64)

    def lmdbio_decode():
        return ld.decode(rag)

    def lmdbio_1thread():
        return ld.decode(rag, threads=1)

    def lmdbio_out():
        return ld.decode(rag, out=pre2)

    def copy():
        np.copyto(pre.reshape(n, size), fixed[:, poff:poff + size])

    ref_d, ref_l = protobuf()
    got_d, got_l = lmdbio_decode()
    assert np.array_equal(ref_d, got_d) and np.array_equal(ref_l, got_l)
    peers = {"protobuf+np": protobuf, "lmdbio decode": lmdbio_decode,
             "lmdbio decode, 1 thread": lmdbio_1thread,
             "lmdbio decode(out=)": lmdbio_out, "bare copy": copy}
    times = interleaved(peers, rounds)
    rows = []
    for name in peers:
        t = statistics.median(times[name])
        rows.append(dict(
            peer=name, seconds=t, records_per_s=n / t,
            x_protobuf=ratios(times, "protobuf+np", name),
            vs_copy=ratios(times, name, "bare copy")))
    return dict(records=n, shape=shape, rows=rows)


def print_decode(res, out):
    out("\n### decode: one batch of %d Datums %s, in memory\n"
        % (res["records"], "x".join(map(str, res["shape"]))))
    out("| peer | median s | records/s | x protobuf+np | time / bare copy |")
    out("|---|---|---|---|---|")
    for r in res["rows"]:
        out("| %s | %.4f | %s | %s | %s |" % (
            r["peer"], r["seconds"], "{:,.0f}".format(r["records_per_s"]),
            fmt_ratio(r["x_protobuf"]), fmt_ratio(r["vs_copy"])))


# --------------------------------------------------------------------------
# 2. end to end


def numpy_transform(x, rng):
    """What a pycaffe user writes: random crop, mirror, mean, scale."""
    n, c, h, w = x.shape
    hs = rng.integers(0, h - CROP + 1, n)
    ws = rng.integers(0, w - CROP + 1, n)
    flips = rng.integers(0, 2, n)
    out = np.empty((n, c, CROP, CROP), np.float32)
    for i in range(n):
        img = x[i, :, hs[i]:hs[i] + CROP, ws[i]:ws[i] + CROP].astype(np.float32)
        img -= MEAN[:, None, None]
        img *= SCALE
        out[i] = img[:, :, ::-1] if flips[i] else img
    return out


def bench_e2e(path, rounds):
    import lmdb
    import lmdbio
    from lmdbio import datum as ld
    Datum = _datum_class()
    n = benchlib.meta(path)["records"]

    def pipeline():
        rng = np.random.default_rng(0)
        env = lmdb.open(path, readonly=True, lock=False, readahead=True)
        count = 0
        try:
            with env.begin() as txn:
                arrs, labels = [], []
                for _, v in txn.cursor():
                    d = Datum()
                    d.ParseFromString(v)
                    arrs.append(np.frombuffer(d.data, np.uint8).reshape(
                        d.channels, d.height, d.width))
                    labels.append(d.label)
                    if len(arrs) == BATCH:
                        numpy_transform(np.stack(arrs), rng)
                        np.array(labels, np.float32)
                        count += len(arrs)
                        arrs, labels = [], []
                if arrs:
                    numpy_transform(np.stack(arrs), rng)
                    count += len(arrs)
        finally:
            env.close()
        assert count == n
        return count

    work = tempfile.mkdtemp(prefix="lmdbio-bench-datum-")
    later = os.path.join(work, "later")

    def datum_reader(prefetch, start):
        """start "first": a new empty index cache before each run (untimed),
        the index built in the run; "later": the cache filled by the
        warm-up run, loaded in the run."""
        cache = [later]

        def run():
            t = ld.Transform(crop_size=CROP, mirror=True,
                             mean_value=MEAN.tolist(), scale=SCALE, seed=0)
            count = 0
            with lmdbio.DatumReader(path, transform=t, batch_size=BATCH,
                                    prefetch=prefetch,
                                    index_cache=cache[0]) as r:
                for data, labels in r:
                    labels.astype(np.float32)
                    count += len(labels)
            assert count == n
            return count

        if start == "first":
            def setup():
                cache[0] = tempfile.mkdtemp(prefix="first-", dir=work)
            run.setup = setup
        return run

    peers = {"py-lmdb+protobuf+numpy": pipeline,
             "lmdbio DatumReader, first start": datum_reader(2, "first"),
             "lmdbio DatumReader, later start": datum_reader(2, "later"),
             "lmdbio DatumReader, prefetch=0, later start": datum_reader(0, "later")}
    try:
        times = interleaved(peers, rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name in peers:
        t = statistics.median(times[name])
        rows.append(dict(peer=name, seconds=t, batches_per_s=(n / BATCH) / t,
                         records_per_s=n / t,
                         x_pipeline=ratios(times, "py-lmdb+protobuf+numpy", name)))
    return dict(records=n, rows=rows)


def print_e2e(res, out):
    out("\n### end to end: `cifar` (%d records), transformed float32 batches of %d "
        "(crop %d, mirror, mean values, scale), hot\n" % (res["records"], BATCH, CROP))
    out("first start = an empty index cache (a new directory per run): the "
        "record index built in the run; later start = the index cache filled "
        "by the warm-up run\n")
    out("| peer | median s | batches/s | records/s | x py-lmdb+protobuf+numpy |")
    out("|---|---|---|---|---|")
    for r in res["rows"]:
        out("| %s | %.3f | %.1f | %s | %s |" % (
            r["peer"], r["seconds"], r["batches_per_s"],
            "{:,.0f}".format(r["records_per_s"]), fmt_ratio(r["x_pipeline"])))


# --------------------------------------------------------------------------
# 3. encoded JPEG


def jpeg_dataset(records, size, seed=0):
    """An LMDB of JPEG-encoded Datums (quality 90), cached."""
    import lmdb
    from lmdbio import datum as ld
    path = os.path.join(benchlib.bench_dir(), "jpeg-%d-%d" % (records, size))
    if os.path.exists(os.path.join(path, "done")):
        return path
    import shutil
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    env = lmdb.open(path, map_size=1 << 32)
    with env.begin(write=True) as txn:
        for i in range(records):
            a, b, c = rng.integers(1, 9, 3)
            base = np.stack([(x * a + y * b) % 256, (x * b + y * c) % 256,
                             (x * c + y * a) % 256]).astype(np.int16)
            img = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255)
            txn.put(b"%08d" % i, ld.encode(img.astype(np.uint8), int(i % 1000),
                                           encoded="jpg", quality=90))
    env.close()
    open(os.path.join(path, "done"), "w").close()
    return path


def bench_jpeg(path, records, rounds, threads_list):
    import lmdb
    import lmdbio
    from lmdbio import datum as ld
    # later start: the index cache (a private directory) is filled by the
    # warm-up run; decoding dominates here, the e2e table has both starts
    index_dir = tempfile.mkdtemp(prefix="lmdbio-bench-jpeg-")
    Datum = _datum_class()
    from PIL import Image

    def pillow():
        env = lmdb.open(path, readonly=True, lock=False)
        count = 0
        try:
            with env.begin() as txn:
                arrs = []
                for _, v in txn.cursor():
                    d = Datum()
                    d.ParseFromString(v)
                    with Image.open(io.BytesIO(d.data)) as im:
                        rgb = np.asarray(im.convert("RGB"))
                    arrs.append(rgb[:, :, ::-1].transpose(2, 0, 1))
                    if len(arrs) == BATCH:
                        np.stack(arrs)
                        count += len(arrs)
                        arrs = []
                if arrs:
                    np.stack(arrs)
                    count += len(arrs)
        finally:
            env.close()
        assert count == records
        return count

    def reader(backend, threads):
        def run():
            old = ld._BACKEND
            ld._BACKEND = backend
            try:
                count = 0
                with lmdbio.DatumReader(path, batch_size=BATCH,
                                        decode_threads=threads,
                                        index_cache=index_dir) as r:
                    for data, labels in r:
                        count += len(labels)
                assert count == records
            finally:
                ld._BACKEND = old
        return run

    peers = {"Pillow, 1 thread (py-lmdb+protobuf+PIL)": pillow}
    backends = []
    for b, mod in (("pil", "PIL"), ("cv2", "cv2")):
        try:
            __import__(mod)
            backends.append(b)
        except ImportError:
            pass
    for b in backends:
        for t in threads_list:
            peers["DatumReader, %s, %d thread%s" % (
                "Pillow" if b == "pil" else "OpenCV", t, "s" if t > 1 else "")] = reader(b, t)
    try:
        times = interleaved(peers, rounds)
    finally:
        shutil.rmtree(index_dir, ignore_errors=True)
    ref = "Pillow, 1 thread (py-lmdb+protobuf+PIL)"
    rows = []
    for name in peers:
        t = statistics.median(times[name])
        rows.append(dict(peer=name, seconds=t, records_per_s=records / t,
                         x_pillow=ratios(times, ref, name)))
    return dict(records=records, rows=rows)


def print_jpeg(res, out, size):
    out("\n### encoded JPEG Datums: %d records of 3x%dx%d, decoded to BGR uint8 "
        "batches of %d (%d cores); DatumReader: later start (index cache "
        "filled by the warm-up)\n" % (res["records"], size, size, BATCH,
                                      os.cpu_count()))
    out("| peer | median s | records/s | x Pillow 1 thread |")
    out("|---|---|---|---|")
    for r in res["rows"]:
        out("| %s | %.3f | %s | %s |" % (r["peer"], r["seconds"],
                                         "{:,.0f}".format(r["records_per_s"]),
                                         fmt_ratio(r["x_pillow"])))


# --------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["decode", "e2e", "jpeg"], action="append")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--records", type=int, default=None,
                    help="cifar records (default 50000, quick 10000)")
    ap.add_argument("--jpeg-records", type=int, default=None,
                    help="default 2000, quick 500")
    ap.add_argument("--jpeg-size", type=int, default=160)
    ap.add_argument("--threads", default="1,2", help="decode threads for jpeg")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.quick:
        os.environ["LMDBIO_BENCH_QUICK"] = "1"
    only = set(a.only or ["decode", "e2e", "jpeg"])
    import lmdbio
    out = print
    info = benchlib.machine_info()
    out("lmdbio %s, %s, %s cores, %s, rounds %d (median, range over rounds)"
        % (".".join(map(str, lmdbio.version())), info.get("cpu", "?"),
           info.get("cpus"), info.get("time"), a.rounds))
    results = {"machine": info}
    cifar = None
    if only & {"decode", "e2e"}:
        cifar = benchlib.dataset_path("cifar", a.records)
    if "decode" in only:
        n = benchlib.meta(cifar)["records"]
        values = datasets.record_values("cifar", 0, n)
        res = bench_decode(values, a.rounds)
        print_decode(res, out)
        results["decode"] = res
        del values
    if "e2e" in only:
        res = bench_e2e(cifar, a.rounds)
        print_e2e(res, out)
        results["e2e"] = res
    if "jpeg" in only:
        recs = a.jpeg_records or (500 if a.quick else 2000)
        path = jpeg_dataset(recs, a.jpeg_size)
        threads = [int(t) for t in a.threads.split(",") if t]
        res = bench_jpeg(path, recs, max(3, a.rounds // 2), threads)
        print_jpeg(res, out, a.jpeg_size)
        results["jpeg"] = res
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
