"""lmdbio against the real NVIDIA DALI reading a Caffe LMDB, side by side.

    python benches/bench_dali.py [PATH ...] [--rounds 3] [--modes hot,cold]
                                 [--shard 7/8] [--dali-python PY]

DALI (``nvidia-dali-cuda120``) runs ``fn.readers.caffe`` in a CPU-only
pipeline (``device_id=None``) from its own virtual environment (``make
bench-dali`` creates it: a 1.1 GB download); lmdbio runs
``lmdbio.datum.DatumReader`` from this one.  Both produce the same thing:
batches of pixel arrays and labels decoded from the Datums (DALI's are HWC,
lmdbio's NCHW, as Caffe's).  Every run is a fresh process: imports untimed
(until the process is idle), pipeline build / Reader open and the reading
timed.  Peers, interleaved A B C D / D C B A:

  dali-epoch      build a pipeline of batch_size records, run() until every
                  record of the database was returned, each output as numpy
  datum-epoch     ``for data, labels in DatumReader(path, batch_size=...)``
  dali-shard      shard RANK of WORLD (``shard_id``/``num_shards``): build,
                  first run() (DALI walks its cursor to the shard's start)
  datum-shard     ``DatumReader(path, rank=RANK, world_size=WORLD)``: open,
                  first batch (closing untimed)

lmdbio peers run twice: /first with an empty index cache (the index is
built inside the run) and /later with the index cached by an earlier run.
Before the rounds one untimed run of each peer checks that DALI and lmdbio
return the same pixels and labels (a CRC of the first batches in HWC order).
Only ratios measured in one run are worth quoting.  Datasets must hold raw
(not encoded) Datums of one shape: ``benches/datasets.py`` ``small`` or
``cifar`` (default: the ``small`` dataset under LMDBIO_BENCH_DIR).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import benchlib  # noqa: E402

DEFAULT_DALI_PYTHON = os.path.join(benchlib.REPO, ".venv-dali", "bin",
                                   "python")

# One timed run, in a fresh process of either interpreter.
CHILD = r'''
import json, sys, time, zlib
spec = json.loads(sys.argv[1])
peer, path, bs = spec["peer"], spec["path"], spec["batch_size"]
rank, world = spec["rank"], spec["world"]
import numpy as np
if peer.startswith("dali"):
    from nvidia.dali import fn, pipeline_def
else:
    from lmdbio.datum import DatumReader


def dali_pipe(shard, shards):
    @pipeline_def(batch_size=bs, num_threads=spec["threads"], device_id=None)
    def pipe():
        images, labels = fn.readers.caffe(path=path, shard_id=shard,
                                          num_shards=shards, name="reader")
        return images, labels
    p = pipe()
    p.build()
    return p


def dali_batch(p):
    images, labels = p.run()
    return images.as_array(), labels.as_array().reshape(-1)


def crc_of(data, labels, crc):
    # pixels in HWC order whatever the reader's layout, then the labels
    crc = zlib.crc32(np.ascontiguousarray(data).tobytes(), crc)
    return zlib.crc32(np.asarray(labels, dtype=np.int64).tobytes(), crc)


settle()   # numpy's BLAS thread: untimed, as the import is
check = spec.get("check", 0)   # untimed runs: CRC of this many batches
crc, n = 0, 0
t0, c0 = time.perf_counter(), time.process_time()
if peer == "dali-epoch":
    p = dali_pipe(0, 1)
    total = p.epoch_size("reader")
    while n < total:
        data, labels = dali_batch(p)
        take = min(len(labels), total - n)   # DALI pads the last batch
        if check and n // bs < check:
            crc = crc_of(data[:take], labels[:take], crc)
        n += take
elif peer == "dali-shard":
    p = dali_pipe(rank, world)
    data, labels = dali_batch(p)
    n = len(labels)
    if check:
        crc = crc_of(data, labels, crc)
elif peer == "datum-shard":
    r = DatumReader(path, batch_size=bs, index_cache=spec["index_cache"],
                    rank=rank, world_size=world)
    data, labels = next(iter(r))
    n = len(labels)
    if check:
        crc = crc_of(data.transpose(0, 2, 3, 1), labels, crc)
else:
    with DatumReader(path, batch_size=bs,
                     index_cache=spec["index_cache"]) as r:
        for data, labels in r:
            if check and n // bs < check:
                crc = crc_of(data.transpose(0, 2, 3, 1), labels, crc)
            n += len(labels)
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
if peer == "datum-shard":
    r.close()   # untimed, as DALI's pipeline is never torn down
print(json.dumps(dict(seconds=dt, cpu=cpu, records=n, crc=crc)))
'''

PEERS = ("dali-epoch", "datum-epoch", "dali-shard", "datum-shard")


def run_child(python, spec):
    return benchlib.run_child(python, CHILD, spec, script="bench_dali")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", metavar="PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="hot,cold" if os.geteuid() == 0
                    else "hot", help="hot,cold (cold needs root)")
    ap.add_argument("--shard", default="7/8", help="RANK/WORLD (7/8)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2,
                    help="DALI num_threads (default 2)")
    ap.add_argument("--dali-python", default=os.environ.get(
        "LMDBIO_DALI_PYTHON", DEFAULT_DALI_PYTHON),
        help="python of a venv with nvidia-dali (make bench-dali makes one)")
    a = ap.parse_args(argv)
    a.dali_python = os.path.abspath(a.dali_python)
    if not os.path.exists(a.dali_python):
        raise SystemExit(f"bench_dali: no DALI python at {a.dali_python}: run "
                         "`make bench-dali`, or pass --dali-python")
    try:
        rank, world = (int(x) for x in a.shard.split("/"))
    except ValueError:
        raise SystemExit("bench_dali: --shard wants RANK/WORLD, e.g. 7/8")
    modes = [m for m in a.modes.split(",") if m]
    if "cold" in modes and os.geteuid() != 0:
        raise SystemExit("bench_dali: cold runs drop the page cache, which "
                         "needs root: run as root or pass --modes hot")
    paths = a.paths or [benchlib.dataset_path("small")]
    for path in paths:
        run_path(os.path.abspath(path), a, rank, world, modes)


def run_path(path, a, rank, world, modes):
    later_cache = tempfile.mkdtemp(prefix="lmdbio-dali-later-")
    try:
        base = dict(path=path, batch_size=a.batch_size, rank=rank,
                    world=world, threads=a.threads)
        pythons = {p: a.dali_python if p.startswith("dali") else sys.executable
                   for p in PEERS}
        runs = []   # (peer label, spec, python)
        for peer in PEERS:
            if peer.startswith("dali"):
                runs.append((peer, dict(base, peer=peer), pythons[peer]))
            else:
                runs.append((peer + "/first", dict(base, peer=peer,
                                                   index_cache=None),
                             pythons[peer]))
                runs.append((peer + "/later", dict(base, peer=peer,
                                                   index_cache=later_cache),
                             pythons[peer]))
        # untimed: same records (CRC of the first batches), cache filled
        crcs = {}
        for label, spec, py in runs:
            spec = dict(spec, check=4)
            if spec.get("index_cache", "") is None:
                spec["index_cache"] = tempfile.mkdtemp(prefix="lmdbio-dali-")
            res = run_child(py, spec)
            crcs[label] = (res["crc"], res["records"])
        same_epoch = crcs["dali-epoch"] == crcs["datum-epoch/later"]
        same_shard = crcs["dali-shard"] == crcs["datum-shard/later"]
        print(f"# {path}: same pixels and labels as DALI: epoch "
              f"{'yes' if same_epoch else 'NO'}, shard {rank}/{world} first "
              f"batch {'yes' if same_shard else 'NO'}")
        for mode in modes:
            times = {label: [] for label, _, _ in runs}
            for r in range(a.rounds):
                order = runs if r % 2 == 0 else runs[::-1]
                for label, spec, py in order:
                    fresh = None
                    if spec.get("index_cache", "") is None:
                        fresh = tempfile.mkdtemp(prefix="lmdbio-dali-")
                        spec = dict(spec, index_cache=fresh)
                    if mode == "cold":
                        benchlib.drop_cache(path)  # as root: the whole cache
                    res = run_child(py, spec)
                    times[label].append(res["seconds"])
                    if fresh:
                        shutil.rmtree(fresh, ignore_errors=True)
                    print(f"  {mode} round {r + 1}/{a.rounds} {label:20s} "
                          f"{res['seconds'] * 1e3:9.1f} ms", flush=True)
            report(path, mode, times, a.rounds)
    finally:
        shutil.rmtree(later_cache, ignore_errors=True)


def report(path, mode, times, rounds):
    print(f"\n# {os.path.basename(path)} {mode}: median of {rounds} fresh-"
          "process runs; x DALI = median over rounds of t(DALI)/t(row) in "
          "the same round (> 1: faster than DALI)")
    print(benchlib.ratio_table(times, lambda label: "dali-epoch" if "epoch"
                               in label else "dali-shard", "DALI") + "\n")


if __name__ == "__main__":
    main()
