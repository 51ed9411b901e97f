"""lmdbio's PyTorch dataset against torchvision's LSUN dataset, side by side.

    python benches/bench_torch.py [PATH] [--records N] [--rounds 3]
                                  [--modes hot,cold] [--workers 0,2]
                                  [--tv-python PY]

torchvision's ``LSUNClass`` is how many PyTorch users read an LMDB of
images: py-lmdb opened with ``readahead=False``, one ``txn.get`` per item,
the keys listed once and pickled into the working directory.  It runs from
its own virtual environment (``make bench-torch`` creates it: torch's CPU
build and torchvision); ``lmdbio.torch.LMDBDataset`` runs from this one.
Both sit behind the same ``DataLoader`` (``shuffle=True`` with one seed,
``batch_size``, ``num_workers``) and decode each JPEG with the same Pillow
call into a numpy array, so what differs is how the records are read
(lmdbio: one bulk read per batch through ``__getitems__``).

Every run is a fresh process: imports untimed, dataset + DataLoader
creation and one epoch timed.  Both peers run as a *first* start (empty key
cache / record index cache) and a *later* start (cached by an earlier run).
Before the rounds one untimed run of each checks that both return the same
first batches.  Default dataset: PATH, else N (default 10,000) JPEG images
of 64x64 written with py-lmdb under LMDBIO_BENCH_DIR (``lsun-like-N``).
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

DEFAULT_TV_PYTHON = os.path.join(benchlib.REPO, ".venv-torchvision", "bin",
                                 "python")

CHILD = r'''
import io, json, sys, time, zlib
spec = json.loads(sys.argv[1])
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate
if spec["peer"] == "torchvision":
    from torchvision.datasets import LSUNClass
else:
    from lmdbio.torch import LMDBDataset


def to_array(img):                 # torchvision's transform: a PIL image
    return np.asarray(img)


def decode(value):                 # lmdbio's decode: the value's bytes,
    return np.asarray(Image.open(io.BytesIO(value)).convert("RGB"))  # as LSUN


def first_only(batch):             # LSUNClass items are (image, None)
    return default_collate([item[0] for item in batch])


settle()   # numpy's BLAS thread: untimed, as the import is
check, crc, n = spec.get("check", 0), 0, 0
t0, c0 = time.perf_counter(), time.process_time()
if spec["peer"] == "torchvision":
    ds = LSUNClass(root=spec["path"], transform=to_array)
    collate = first_only
else:
    ds = LMDBDataset(spec["path"], decode=decode,
                     index_cache=spec["index_cache"])
    collate = default_collate
loader = DataLoader(ds, batch_size=spec["batch_size"], shuffle=True,
                    generator=torch.Generator().manual_seed(0),
                    num_workers=spec["workers"], collate_fn=collate)
for i, images in enumerate(loader):
    n += len(images)
    if i < check:
        crc = zlib.crc32(images.numpy().tobytes(), crc)
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps(dict(seconds=dt, cpu=cpu, records=n, crc=crc)))
'''


def make_dataset(path, records, seed=0):
    """LSUN-like: 40-hex-digit keys, each value a 64x64 JPEG (smooth
    colours plus noise, ~2-3 KB), written with py-lmdb."""
    import hashlib
    import io

    import lmdb
    import numpy as np
    from PIL import Image
    if os.path.exists(os.path.join(path, "data.mdb")):
        return path
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:64, 0:64]
    env = lmdb.open(path, map_size=1 << 34)
    with env.begin(write=True) as txn:
        for i in range(records):
            c = rng.integers(0, 256, size=(3, 3))
            img = (c[:, 0, None, None] + c[:, 1, None, None] * xx / 64
                   + c[:, 2, None, None] * yy / 64) % 256
            img = img + rng.normal(0, 8, size=img.shape)
            img = np.clip(img, 0, 255).astype(np.uint8).transpose(1, 2, 0)
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=90)
            key = hashlib.sha1(b"%d" % i).hexdigest().encode()
            txn.put(key, buf.getvalue())
    env.close()
    return path


def run_child(python, spec, cwd):
    return benchlib.run_child(python, CHILD, spec, cwd, script="bench_torch")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?")
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="hot,cold" if os.geteuid() == 0
                    else "hot", help="hot,cold (cold needs root)")
    ap.add_argument("--workers", default="0,2",
                    help="DataLoader num_workers values (0,2)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--tv-python", default=os.environ.get(
        "LMDBIO_TORCHVISION_PYTHON", DEFAULT_TV_PYTHON),
        help="python of a venv with torchvision (make bench-torch makes one)")
    a = ap.parse_args(argv)
    a.tv_python = os.path.abspath(a.tv_python)
    if not os.path.exists(a.tv_python):
        raise SystemExit(f"bench_torch: no torchvision python at "
                         f"{a.tv_python}: run `make bench-torch`, or pass "
                         "--tv-python")
    modes = [m for m in a.modes.split(",") if m]
    if "cold" in modes and os.geteuid() != 0:
        raise SystemExit("bench_torch: cold runs drop the page cache, which "
                         "needs root: run as root or pass --modes hot")
    try:
        workers = [int(w) for w in a.workers.split(",")]
    except ValueError:
        raise SystemExit("bench_torch: --workers wants numbers, e.g. 0,2")
    path = os.path.abspath(a.path or make_dataset(os.path.join(
        benchlib.bench_dir(), f"lsun-like-{a.records}"), a.records))
    later = tempfile.mkdtemp(prefix="lmdbio-torch-later-")
    try:
        for w in workers:
            run_workers(path, a, w, modes, later)
    finally:
        shutil.rmtree(later, ignore_errors=True)


def run_workers(path, a, workers, modes, later):
    base = dict(path=path, batch_size=a.batch_size, workers=workers)
    runs = []   # (label, spec, python, "first" or "later")
    for peer, py in (("torchvision", a.tv_python), ("lmdbio", sys.executable)):
        for start in ("first", "later"):
            runs.append((f"{peer}/{start}", dict(base, peer=peer), py, start))

    def one(label, spec, py, start, check=0):
        # first: an empty working directory (LSUN's key cache) and index
        # cache; later: the ones an earlier run filled
        cwd = later if start == "later" else tempfile.mkdtemp(
            prefix="lmdbio-torch-")
        spec = dict(spec, check=check, index_cache=os.path.join(cwd, "idx"))
        try:
            return run_child(py, spec, cwd)
        finally:
            if cwd != later:
                shutil.rmtree(cwd, ignore_errors=True)

    crcs = {label: one(label, *run, check=4)["crc"] for label, *run in runs}
    same = len(set(crcs.values())) == 1
    print(f"# {path}, num_workers={workers}: same first batches in both: "
          f"{'yes' if same else 'NO'}")
    for mode in modes:
        times = {label: [] for label, *_ in runs}
        for r in range(a.rounds):
            for label, *run in (runs if r % 2 == 0 else runs[::-1]):
                if mode == "cold":
                    benchlib.drop_cache(path)   # as root: the whole cache
                res = one(label, *run)
                times[label].append(res["seconds"])
                print(f"  {mode} round {r + 1}/{a.rounds} {label:20s} "
                      f"{res['seconds'] * 1e3:9.1f} ms", flush=True)
        print(f"\n# {os.path.basename(path)} {mode}, num_workers={workers}: "
              f"median of {a.rounds} fresh-process epochs; x torchvision = "
              "median over rounds of t(torchvision, same start)/t(row) in "
              "the same round (> 1: faster)")
        print(benchlib.ratio_table(
            times, lambda label: "torchvision/" + label.split("/")[1],
            "torchvision") + "\n")


if __name__ == "__main__":
    main()
