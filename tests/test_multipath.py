"""Several environments read as one dataset: ``Reader([a, b, ...])``.

Ordinals run through the first environment's records in key order, then the
second's, and so on.  Every output is compared with the concatenation of
py-lmdb's cursor walks (the oracle) and with single-path Readers: iteration
shuffled and sharded, drop_last both ways, windows of many batches, random
``read(indices)``, keys on and off, pickling and state_dict, DatumReader and
the torch datasets.
"""

from __future__ import annotations

import json
import os
import pickle
import threading

import lmdb
import numpy as np
import pytest

from conftest import require, require_lmdbio

try:
    import lmdbio
    from lmdbio import Reader
    from lmdbio import datum as ld
    from lmdbio.reader import shard_order
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

SIZES = [60, 0, 37, 91, 1]  # an empty environment and a one-record one


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def envs(tmp_path):
    """Environments of SIZES records (some values overflow pages; keys
    repeat across environments, as chunked writes do)."""
    paths = []
    for j, n in enumerate(SIZES):
        p = str(tmp_path / ("env%d" % j))
        env = lmdb.open(p, map_size=1 << 26)
        with env.begin(write=True) as txn:
            for i in range(n):
                reps = 3000 if i % 13 == 5 else 1 + (i * 7 + j) % 11
                txn.put(b"k%05d" % i, (b"%d.%d;" % (j, i)) * reps)
        env.close()
        paths.append(p)
    return paths


def oracle(paths):
    items = []
    for p in paths:
        env = lmdb.open(p, readonly=True, lock=False)
        with env.begin() as txn:
            items += [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        env.close()
    return items


def check(batch, items, keys=True):
    idx = batch.indices.tolist()
    assert batch.values.tolist() == [items[i][1] for i in idx]
    if keys:
        assert batch.keys.tolist() == [items[i][0] for i in idx]
    else:
        assert batch.keys is None


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("rank,world_size", [(0, 1), (0, 3), (2, 3)])
def test_iteration_equals_the_oracle(envs, shuffle, drop_last, rank,
                                     world_size):
    items = oracle(envs)
    n = len(items)
    with Reader(envs, batch_size=7, shuffle=shuffle, seed=11, rank=rank,
                world_size=world_size, drop_last=drop_last,
                prefetch_bytes=1 << 20) as r:
        assert r.total_records == n == sum(SIZES)
        for epoch in (0, 1):
            r.set_epoch(epoch)
            got = list(r)
            assert len(got) == len(r)
            seen = np.concatenate([b.indices for b in got])
            assert seen.tolist() == shard_order(
                n, rank, world_size, shuffle, 11, epoch, drop_last,
                7).tolist()
            for b in got:
                check(b, items)
        assert r.window_stats["max_batches"] > 1  # windows of several batches


def test_equals_the_concatenation_of_single_readers(envs):
    singles = []
    for p in envs:
        with Reader(p, batch_size=1000) as r:
            for b in r:
                singles.append((b.keys.tolist(), b.values.tolist()))
    keys = [k for ks, _ in singles for k in ks]
    values = [v for _, vs in singles for v in vs]
    with Reader(envs, batch_size=1000) as r:
        (b,) = list(r)
        assert b.keys.tolist() == keys and b.values.tolist() == values
        assert b.indices.tolist() == list(range(len(keys)))
    # a shuffled batch: each record is its environment's record
    with Reader(envs, batch_size=1000, shuffle=True, seed=5) as r:
        (b,) = list(r)
        assert b.values.tolist() == [values[i] for i in b.indices]


def test_read_random_ordinals(envs):
    items = oracle(envs)
    n = len(items)
    rng = np.random.default_rng(0)
    with Reader(envs, batch_size=16) as r, \
            Reader(envs, batch_size=16, keys=False) as rk:
        for size in (0, 1, 5, 64, 3 * n):
            idx = rng.integers(0, n, size)  # duplicates included
            check(r.read(idx), items)
            check(rk.read(idx), items, keys=False)
        check(r.read([n - 1, 0, SIZES[0], SIZES[0] - 1]), items)
        with pytest.raises(IndexError):
            r.read([n])


def test_keys_false_iteration(envs):
    items = oracle(envs)
    with Reader(envs, batch_size=9, shuffle=True, keys=False) as r:
        for b in r:
            check(b, items, keys=False)


def test_single_element_list_is_the_single_path(envs):
    with Reader([envs[0]], batch_size=8) as a, Reader(envs[0], batch_size=8) as b:
        assert a.path == b.path == envs[0]
        assert [x.values.tolist() for x in a] == [x.values.tolist() for x in b]


def test_io_stats_and_close(envs):
    before = threading.active_count()
    r = Reader(envs, batch_size=8)
    list(r)
    reqs, nbytes = r.io_stats()
    assert reqs > 0 and nbytes > 0
    r.close()
    assert r.io_stats() == (0, 0)
    with pytest.raises(lmdbio.Error, match="closed"):
        list(r)
    assert threading.active_count() <= before


def test_bad_lists(envs, tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        Reader([])
    with pytest.raises(lmdbio.Error, match="missing"):
        Reader([envs[0], str(tmp_path / "missing")])


def test_under_mpi_refused(envs):
    MPI = require("mpi4py.MPI", "pip install mpi4py mpich")
    with pytest.raises(ValueError, match="several environments"):
        Reader(envs, comm=MPI.COMM_SELF)


def test_state_and_pickle(envs):
    cfg = dict(batch_size=6, shuffle=True, seed=2, rank=1, world_size=2)
    with Reader(envs, **cfg) as r:
        r.set_epoch(3)
        full = [b.indices.tolist() for b in r]
        r.set_epoch(0)
        r.set_epoch(3)
        it = iter(r)
        head = [next(it).indices.tolist() for _ in range(4)]
        state = json.loads(json.dumps(r.state_dict()))
        assert state["records"] == SIZES and state["batches"] == 4
        clone = pickle.loads(pickle.dumps(r))
        it.close()
    assert head == full[:4]
    assert [b.indices.tolist() for b in clone] == full[4:]
    clone.close()
    with Reader(envs, **cfg) as r2:
        r2.load_state_dict(state)
        assert [b.indices.tolist() for b in r2] == full[4:]
    # the same total split differently is another dataset
    with Reader(envs[::-1], **cfg) as r3:
        with pytest.raises(ValueError, match="records"):
            r3.load_state_dict(state)


def test_datum_reader_several_paths(tmp_path):
    rng = np.random.default_rng(1)
    paths, imgs = [], []
    for j, n in enumerate((30, 45)):
        p = str(tmp_path / ("d%d" % j))
        env = lmdb.open(p, map_size=1 << 26)
        with env.begin(write=True) as txn:
            for i in range(n):
                img = rng.integers(0, 256, (1, 2, 3), dtype=np.uint8)
                imgs.append(img)
                txn.put(b"%06d" % i, ld.encode(img, len(imgs) - 1))
        env.close()
        paths.append(p)
    with ld.DatumReader(paths, batch_size=8, shuffle=True) as r:
        assert r.total_records == 75
        labels = []
        for data, lab in r:
            assert data.tolist() == [imgs[k].tolist() for k in lab]
            labels += lab.tolist()
        assert sorted(labels) == list(range(75))
        clone = pickle.loads(pickle.dumps(r))
        assert clone.total_records == 75
        clone.close()


def test_torch_datasets_several_paths(envs):
    try:
        from lmdbio.torch import LMDBDataset, LMDBIterableDataset
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("PyTorch is not installed")
    items = oracle(envs)
    ds = LMDBDataset(envs)
    assert len(ds) == len(items)
    assert [ds[i] for i in range(len(items))] == items
    assert ds[-1] == items[-1]
    it = LMDBIterableDataset(envs, shuffle=True, seed=4, rank=0, world_size=1)
    got = list(it)
    assert sorted(got) == sorted(items) and got != items
    ds.close()
    it.close()


def test_gather_copies_and_checks_bounds():
    from lmdbio._bulk import gather
    src = np.frombuffer(b"abcdefghij", dtype=np.uint8)
    out = np.zeros(6, dtype=np.uint8)
    gather(src, [7, 0, 3], [3, 2, 0], out, [2, 0, 5])
    assert out.tobytes() == b"abhij\x00"
    for starts, lengths, dst in (([8], [3], [0]), ([0], [7], [0]),
                                 ([-1], [1], [0]), ([0], [-1], [0]),
                                 ([0], [1], [6])):
        with pytest.raises(ValueError, match="outside"):
            gather(src, starts, lengths, out, dst)
    with pytest.raises(ValueError, match="differ"):
        gather(src, [0, 1], [1], out, [0, 1])
