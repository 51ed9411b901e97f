"""lmdbio.torch: LMDBDataset (map-style) and LMDBIterableDataset under
torch.utils.data.DataLoader with 2 workers and explicit rank/world_size:
every record exactly once per epoch (no duplicates, nothing missed).

Needs PyTorch (CPU build; requirements-dev.txt installs it).  Without it
these tests skip, with the reason, except under CI (CI=true) or
LMDBIO_REQUIRE=1 (``make test``) where they fail: there requirements-dev.txt
was installed, so a missing torch is a broken setup.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from conftest import require, require_lmdbio

torch = require("torch", "pip install 'lmdbio[torch]'")
from torch.utils.data import DataLoader  # noqa: E402

try:
    import lmdbio
    from lmdbio import datum as ld
    from lmdbio.torch import LMDBDataset, LMDBIterableDataset, partition
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 203  # not a multiple of anything used below


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def db(tmp_path):
    """N Datums 1x4x4 whose label is their ordinal, written with py-lmdb."""
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (N, 1, 4, 4), dtype=np.uint8)
    path = str(tmp_path / "db")
    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(b"%08d_img" % i, ld.encode(imgs[i], i))
    env.close()
    return path, imgs


def test_map_style_items(db):
    path, imgs = db
    ds = LMDBDataset(path)
    assert len(ds) == N
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        ref = list(txn.cursor())
    env.close()
    for i in (0, 1, 57, N - 1):
        assert ds[i] == ref[i]
    assert ds[-1] == ref[-1]
    assert ds[np.int64(3)] == ref[3] and ds[torch.tensor(4)] == ref[4]
    assert ds[2:5] == ref[2:5]
    with pytest.raises(IndexError):
        ds[N]
    dd = LMDBDataset(path, decode=ld.decode_one)
    arr, label = dd[17]
    assert label == 17 and np.array_equal(arr, imgs[17])
    # a DataLoader's whole batch (__getitems__): any order, repeats, and
    # indices from the end, as ds[i] one at a time
    for ix in ([5, 0, N - 1, 5], [-1, 3, -N], [N - 1], []):
        assert ds.__getitems__(ix) == [ds[i] for i in ix]
    for bad in ([N], [0, -N - 1], [2 ** 62]):
        with pytest.raises(IndexError):
            ds.__getitems__(bad)
    ds.close()


def test_map_style_under_dataloader(db):
    path, imgs = db
    ds = LMDBDataset(path, decode=ld.decode_one)
    ds[0]  # the parent has an open Reader when the workers fork
    dl = DataLoader(ds, batch_size=16, num_workers=2, shuffle=True,
                    generator=torch.Generator().manual_seed(0))
    seen = []
    for x, y in dl:
        assert x.dtype == torch.uint8 and x.shape[1:] == (1, 4, 4)
        for i, lab in enumerate(y.tolist()):
            assert np.array_equal(x[i].numpy(), imgs[lab])
        seen.extend(y.tolist())
    assert sorted(seen) == list(range(N))


def test_map_style_with_distributed_sampler(db):
    path, _ = db
    from torch.utils.data.distributed import DistributedSampler
    ds = LMDBDataset(path, decode=ld.decode_one)
    got = []
    for rank in range(3):
        s = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=1,
                               drop_last=True)
        for _, y in DataLoader(ds, batch_size=10, sampler=s, num_workers=2):
            got.extend(y.tolist())
    assert len(got) == len(set(got)) == (N // 3) * 3


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_two_workers_every_record_once(db, world_size, shuffle):
    path, imgs = db
    for epoch in (0, 1):
        seen = []
        per_rank = []
        for rank in range(world_size):
            ds = LMDBIterableDataset(path, decode=ld.decode_one, shuffle=shuffle, seed=4,
                                     rank=rank, world_size=world_size, read_size=7)
            ds.set_epoch(epoch)
            mine = []
            for x, y in DataLoader(ds, batch_size=5, num_workers=2):
                for i, lab in enumerate(y.tolist()):
                    assert np.array_equal(x[i].numpy(), imgs[lab])
                mine.extend(y.tolist())
            assert len(mine) == len(ds)
            per_rank.append(mine)
            seen.extend(mine)
        assert len(seen) == len(set(seen)), "a record was read twice"
        assert sorted(seen) == list(range(N)), "a record was missed"
        sizes = [len(m) for m in per_rank]
        assert max(sizes) - min(sizes) <= 1
        if shuffle and epoch == 0:
            first = seen
        elif shuffle:
            assert seen != first  # set_epoch changed the order


def test_iterable_batches_and_drop_last(db):
    path, imgs = db
    seen = []
    for rank in range(2):
        ds = LMDBIterableDataset(path, batch_size=16, decode=ld.decode, rank=rank,
                                 world_size=2, shuffle=True, seed=9)
        n = 0
        for x, y in DataLoader(ds, batch_size=None, num_workers=2):
            assert x.dtype == torch.uint8 and x.ndim == 4 and x.shape[0] <= 16
            assert np.array_equal(x.numpy(), imgs[y.numpy()])
            seen.extend(y.tolist())
            n += 1
        assert n == len(ds)
    assert sorted(seen) == list(range(N))
    # without decode a batch is (keys, values)
    ds = LMDBIterableDataset(path, batch_size=50)
    keys, values = next(iter(ds))
    assert keys[0] == b"00000000_img" and len(values) == 50
    # drop_last: every rank reads N // P, the rest is left out
    counts = []
    for rank in range(4):
        ds = LMDBIterableDataset(path, rank=rank, world_size=4, drop_last=True)
        counts.append(sum(1 for _ in DataLoader(ds, batch_size=None, num_workers=2)))
    assert counts == [N // 4] * 4


def test_iterable_ordinals_partition():
    assert [partition(10, i, 3) for i in range(3)] == [(0, 3), (3, 6), (6, 10)]
    assert partition(0, 0, 2) == (0, 0)


def test_rank_from_environment(db, monkeypatch):
    path, _ = db
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = LMDBIterableDataset(path)
    assert ds.ordinals().tolist() == list(range(N // 2, N))
    with pytest.raises(ValueError):
        LMDBIterableDataset(path, rank=2, world_size=2)
    with pytest.raises(ValueError):
        LMDBIterableDataset(path, rank=0)


def test_datasets_pickle_without_open_files(db):
    path, imgs = db
    ds = LMDBDataset(path, decode=ld.decode_one)
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._reader is None and clone[5][1] == 5
    it = LMDBIterableDataset(path, decode=ld.decode_one, shuffle=True)
    it.set_epoch(3)
    clone = pickle.loads(pickle.dumps(it))
    assert clone.epoch == 3 and clone.ordinals().tolist() == it.ordinals().tolist()
    ds.close()
    clone.close()


def test_spawn_workers(db):
    path, _ = db
    ds = LMDBIterableDataset(path, decode=ld.decode_one, rank=0, world_size=1)
    dl = DataLoader(ds, batch_size=32, num_workers=2, multiprocessing_context="spawn")
    seen = [y for _, ys in dl for y in ys.tolist()]
    assert sorted(seen) == list(range(N))


def _readme_block(title):
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- test: %s -->\s*```python\n(.*?)```" % re.escape(title), text, re.S)
    return m.group(1) if m else None


def test_readme_torch_example_runs_as_written(tmp_path):
    code = _readme_block("torch-example")
    if code is None:
        pytest.skip("README has no torch example block")
    # the example reads data/demo_lmdb (what `make demo` writes): make one
    rng = np.random.default_rng(0)
    npz = tmp_path / "sample.npz"
    np.savez(npz, data=rng.integers(0, 256, (300, 3, 32, 32), dtype=np.uint8),
             labels=rng.integers(0, 10, 300))
    os.makedirs(tmp_path / "data")
    from lmdbio.cli import main
    assert main(["convert", "--npz", str(npz), str(tmp_path / "data" / "demo_lmdb")]) == 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(lmdbio.__file__))] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
