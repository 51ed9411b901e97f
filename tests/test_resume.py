"""Pickling and resuming: Reader, DatumReader and the torch datasets.

A pickled Reader carries its path(s), arguments and position, never open
files or threads: it reopens in the new process (spawn-started ones here)
and yields what the original would have.  ``state_dict()`` counts the
batches the caller received (not those prefetched), and a new Reader given
``load_state_dict(state)`` yields exactly the rest of that epoch; a state
of another order raises ValueError naming the field.  py-lmdb is the
oracle for the records.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import threading

import lmdb
import numpy as np
import pytest

from conftest import require_lmdbio

try:
    import lmdbio
    from lmdbio import Reader
    from lmdbio import datum as ld
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

N = 103  # records: not a multiple of the batch sizes below
BS = 10


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def _write(path, n=N, big_every=0):
    """n records; every big_every-th value an overflow value."""
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(n):
            size = 20000 if big_every and i % big_every == 0 else 5 + i % 30
            txn.put(b"key%05d" % i, (b"%d:" % i) * (size // 4 + 1))
    env.close()
    return str(path)


@pytest.fixture
def db(tmp_path):
    return _write(tmp_path / "db", big_every=11)


def oracle(path):
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    env.close()
    return items


def batches(reader, limit=None):
    """(ordinals, keys, values) of the batches of one iteration."""
    out = []
    for b in reader:
        out.append((b.indices.tolist(),
                    b.keys.tolist() if b.keys is not None else None,
                    b.values.tolist()))
        if limit is not None and len(out) == limit:
            break
    return out


CONFIGS = [
    dict(shuffle=False, drop_last=False),
    dict(shuffle=True, seed=7, drop_last=False),
    dict(shuffle=True, seed=7, drop_last=True),
    dict(shuffle=False, drop_last=True),
    dict(shuffle=True, seed=3, rank=1, world_size=3, drop_last=False),
    dict(shuffle=True, seed=3, rank=2, world_size=3, drop_last=True),
    dict(shuffle=False, rank=0, world_size=2, drop_last=True),
]


def _ids(c):
    return "-".join("%s=%s" % kv for kv in sorted(c.items()))


# ---------------------------------------------------------------------------
# state_dict / load_state_dict


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_state_round_trip_at_every_batch(db, cfg):
    items = oracle(db)
    with Reader(db, batch_size=BS, **cfg) as ref:
        ref.set_epoch(2)
        full = batches(ref)
        ref.set_epoch(3)
        next_epoch = batches(ref)
    assert len(full) == len(ref) > 2
    for idx, keys, values in full:  # the records themselves: py-lmdb's
        assert keys == [items[i][0] for i in idx]
        assert values == [items[i][1] for i in idx]
    for k in range(len(full) + 1):
        with Reader(db, batch_size=BS, **cfg) as r:
            r.set_epoch(2)
            got = batches(r, limit=k) if k else []
            state = r.state_dict()
        assert got == full[:k]
        assert state["epoch"] == 2 and state["batches"] == k
        state = json.loads(json.dumps(state))  # plain ints, strings, lists
        with Reader(db, batch_size=BS, **cfg) as r2:
            r2.load_state_dict(state)
            r2.set_epoch(2)  # the same epoch again keeps the position
            assert r2.state_dict() == state
            assert batches(r2) == full[k:]
            assert r2.state_dict()["batches"] == len(full)
            r2.set_epoch(3)  # then epochs go on
            assert batches(r2) == next_epoch


def test_state_counts_received_batches_not_prefetched(db):
    # The prefetcher reads windows ahead of the caller: the state counts
    # only what the caller took.
    with Reader(db, batch_size=4, prefetch_bytes=1 << 20) as r:
        it = iter(r)
        for k in range(1, 8):
            next(it)
            assert r.state_dict()["batches"] == k
        assert r.window_stats["windows"] >= 2  # it did read ahead
        it.close()


def test_iterating_again_starts_the_epoch_over(db):
    with Reader(db, batch_size=BS) as r:
        full = batches(r)
        part = batches(r, limit=3)
        assert part == full[:3]
        assert batches(r) == full
        r.set_epoch(1)
        assert r.state_dict()["batches"] == 0


def test_state_at_end_of_epoch_yields_nothing_more(db):
    with Reader(db, batch_size=BS, shuffle=True) as r:
        batches(r)
        state = r.state_dict()
    with Reader(db, batch_size=BS, shuffle=True) as r:
        r.load_state_dict(state)
        assert batches(r) == []
        assert len(batches(r)) == len(r)  # the next iteration is whole


@pytest.mark.parametrize("field,value", [
    ("batch_size", 11), ("seed", 8), ("shuffle", False), ("rank", 1),
    ("world_size", 2), ("drop_last", True), ("total_records", N + 1),
    ("records", [N + 1]), ("txnids", [99]), ("batches", 10 ** 6),
    ("batches", -1), ("epoch", -1), ("epoch", "x"),
])
def test_wrong_state_names_the_field(db, field, value):
    with Reader(db, batch_size=BS, shuffle=True, seed=7) as r:
        state = r.state_dict()
        state[field] = value
        with pytest.raises(ValueError, match=field):
            r.load_state_dict(state)
        assert r.state_dict()["batches"] == 0  # unchanged


def test_state_from_another_database_or_missing_fields(db, tmp_path):
    other = _write(tmp_path / "other", n=N - 1)
    with Reader(other, batch_size=BS) as r:
        state = r.state_dict()
    with Reader(db, batch_size=BS) as r:
        with pytest.raises(ValueError, match="total_records"):
            r.load_state_dict(state)
        with pytest.raises(ValueError, match="seed"):
            r.load_state_dict({k: v for k, v in r.state_dict().items()
                               if k != "seed"})
        with pytest.raises(ValueError, match="dict"):
            r.load_state_dict([1, 2])


def test_state_changes_with_the_snapshot(db):
    with Reader(db, batch_size=BS) as r:
        state = r.state_dict()
    env = lmdb.open(db, map_size=1 << 26)
    with env.begin(write=True) as txn:  # same count, new snapshot
        txn.put(b"key00000", b"changed")
    env.close()
    with Reader(db, batch_size=BS) as r:
        with pytest.raises(ValueError, match="txnids"):
            r.load_state_dict(state)


# ---------------------------------------------------------------------------
# pickling


def test_pickle_carries_arguments_and_position(db):
    cfg = dict(batch_size=BS, shuffle=True, seed=5, rank=1, world_size=2,
               keys=False, prefetch_bytes=1 << 20)
    with Reader(db, **cfg) as r:
        r.set_epoch(4)
        full = batches(r)
        r.set_epoch(5)
        nxt = batches(r)
        for k in (0, 1, 4, len(full)):
            r.set_epoch(0)
            r.set_epoch(4)  # a new epoch: from its start
            got = batches(r, limit=k) if k else []
            blob = pickle.dumps(r)
            clone = pickle.loads(blob)
            try:
                assert clone.epoch == 4 and clone.keys_wanted is False
                assert clone.state_dict() == r.state_dict()
                assert got + batches(clone) == full
                clone.set_epoch(5)
                assert batches(clone) == nxt
            finally:
                clone.close()


def test_pickle_carries_no_open_state(db):
    r = Reader(db, batch_size=BS)
    it = iter(r)
    next(it)  # threads running, buffers held
    blob = pickle.dumps(r)
    assert len(blob) < 2000  # arguments and position, no buffers
    it.close()
    r.close()
    clone = pickle.loads(blob)  # reopens from the path
    assert clone.state_dict()["batches"] == 1
    clone.close()


def test_pickle_under_comm_raises_type_error(db):
    MPI = pytest.importorskip("mpi4py.MPI")
    r = Reader(db, batch_size=BS, comm=MPI.COMM_SELF)
    try:
        with pytest.raises(TypeError, match="communicator"):
            pickle.dumps(r)
    finally:
        r.close()
    d = ld.DatumReader(db, batch_size=BS, comm=MPI.COMM_SELF)
    try:
        with pytest.raises(TypeError, match="communicator"):
            pickle.dumps(d)
    finally:
        d.close()


def _spawn_run(obj):
    """Pickle obj into a spawn-started process, which unpickles it (the
    arguments travel, the files reopen) and iterates it there.  The child
    runs `list` only: it imports nothing of the tests."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply_async(list, (obj,)).get(timeout=240)


def test_reader_in_spawned_process(db):
    with Reader(db, batch_size=BS, shuffle=True, seed=2) as r:
        r.set_epoch(1)
        full = batches(r)
        r.set_epoch(1)
        head = batches(r, limit=3)
        got = _spawn_run(r)
        assert [(b.indices.tolist(), b.keys.tolist(), b.values.tolist())
                for b in got] == full[3:]
    assert head == full[:3]


def _datum_db(path, n=N):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (n, 1, 3, 2), dtype=np.uint8)
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(b"%08d" % i, ld.encode(imgs[i], i))
    env.close()
    return str(path), imgs


def _datum_batches(reader, limit=None):
    out = []
    for data, labels in reader:
        out.append((data.tolist(), labels.tolist()))
        if limit is not None and len(out) == limit:
            break
    return out


@pytest.mark.parametrize("prefetch", [0, 2])
def test_datum_reader_state_round_trip(tmp_path, prefetch):
    path, imgs = _datum_db(tmp_path / "datum")
    cfg = dict(batch_size=BS, shuffle=True, seed=1, prefetch=prefetch)
    with ld.DatumReader(path, **cfg) as ref:
        ref.set_epoch(1)
        full = _datum_batches(ref)
    for data, labels in full:
        assert data == imgs[labels].tolist()
    for k in range(len(full) + 1):
        with ld.DatumReader(path, **cfg) as r:
            r.set_epoch(1)
            got = _datum_batches(r, limit=k) if k else []
            state = json.loads(json.dumps(r.state_dict()))
        assert got == full[:k] and state["batches"] == k
        with ld.DatumReader(path, **cfg) as r2:
            r2.load_state_dict(state)
            assert _datum_batches(r2) == full[k:]


def test_datum_reader_pickles_into_spawned_process(tmp_path):
    path, _ = _datum_db(tmp_path / "datum")
    with ld.DatumReader(path, batch_size=BS, shuffle=True, seed=4) as r:
        full = _datum_batches(r)
        head = _datum_batches(r, limit=2)
        clone = pickle.loads(pickle.dumps(r))
        assert clone.state_dict() == r.state_dict()
        clone.close()
        got = _spawn_run(r)
        assert [(d.tolist(), l.tolist()) for d, l in got] == full[2:]
    assert head == full[:2]


# ---------------------------------------------------------------------------
# torch datasets


def _torch():
    try:
        import torch  # noqa: F401
        from torch.utils.data import DataLoader  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("PyTorch is not installed")
    from lmdbio.torch import LMDBDataset, LMDBIterableDataset
    return LMDBDataset, LMDBIterableDataset


def test_torch_datasets_in_spawn_workers_equal_the_parent(tmp_path):
    LMDBDataset, LMDBIterableDataset = _torch()
    from torch.utils.data import DataLoader
    path, imgs = _datum_db(tmp_path / "datum")
    ds = LMDBIterableDataset(path, batch_size=8, shuffle=True, seed=3,
                             decode=ld.decode)
    ds.set_epoch(2)

    def run(workers):
        kw = dict(multiprocessing_context="spawn") if workers else {}
        dl = DataLoader(ds, batch_size=None, num_workers=workers, **kw)
        return [(d.tolist(), l.tolist()) for d, l in dl]

    parent, spawned = run(0), run(2)
    assert sorted(spawned, key=lambda b: b[1]) == \
        sorted(parent, key=lambda b: b[1])
    assert sorted(l for _, ls in spawned for l in ls) == list(range(N))
    mds = LMDBDataset(path, decode=ld.decode_one)
    dl = DataLoader(mds, batch_size=16, num_workers=2,
                    multiprocessing_context="spawn")
    labels = [l for _, ls in dl for l in ls.tolist()]
    assert labels == list(range(N))
    ds.close()
    mds.close()


@pytest.mark.parametrize("batch_size", [None, 8])
@pytest.mark.parametrize("shuffle", [False, True])
def test_iterable_dataset_state_round_trip(tmp_path, batch_size, shuffle):
    _, LMDBIterableDataset = _torch()
    path, _ = _datum_db(tmp_path / "datum")
    cfg = dict(batch_size=batch_size, shuffle=shuffle, seed=9, rank=1,
               world_size=2, decode=ld.decode_one if batch_size is None
               else ld.decode)

    def items(ds, limit=None):
        out = []
        for x in ds:
            out.append(pickle.dumps(x))
            if limit is not None and len(out) == limit:
                break
        return out

    ds = LMDBIterableDataset(path, **cfg)
    ds.set_epoch(1)
    full = items(ds)
    assert len(full) == len(ds)
    for k in range(0, len(full) + 1, 7 if batch_size is None else 1):
        ds.set_epoch(0)
        ds.set_epoch(1)
        if k:
            assert items(ds, limit=k) == full[:k]
        state = json.loads(json.dumps(ds.state_dict()))
        assert state["items"] == k and state["epoch"] == 1
        fresh = LMDBIterableDataset(path, **cfg)
        fresh.load_state_dict(state)
        fresh.set_epoch(1)
        assert items(pickle.loads(pickle.dumps(fresh))) == full[k:]
        assert items(fresh) == full[k:]
        fresh.close()
    bad = ds.state_dict()
    bad["world_size"] = 3
    with pytest.raises(ValueError, match="world_size"):
        LMDBIterableDataset(path, **cfg).load_state_dict(bad)
    ds.close()


def test_map_dataset_state_is_its_record_count(tmp_path):
    LMDBDataset, _ = _torch()
    path, _ = _datum_db(tmp_path / "datum")
    ds = LMDBDataset(path)
    state = json.loads(json.dumps(ds.state_dict()))
    assert state == {"total_records": N}
    ds.load_state_dict(state)
    with pytest.raises(ValueError, match="total_records"):
        ds.load_state_dict({"total_records": N + 1})
    ds.close()


def test_stateful_dataloader_with_workers(tmp_path):
    _, LMDBIterableDataset = _torch()
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("torchdata is not installed")
    path, _ = _datum_db(tmp_path / "datum")

    def loader(ds):
        return StatefulDataLoader(ds, batch_size=None, num_workers=2,
                                  multiprocessing_context="spawn")

    ds = LMDBIterableDataset(path, batch_size=8, shuffle=True, seed=3,
                             decode=ld.decode)
    full = [l.tolist() for _, l in loader(ds)]
    assert sorted(x for b in full for x in b) == list(range(N))
    for k in (3, len(full) - 1):
        dl = loader(ds)
        it = iter(dl)
        head = [next(it)[1].tolist() for _ in range(k)]
        state = json.loads(json.dumps(dl.state_dict()))
        del it
        assert head == full[:k]
        # the workers' own states (not a replay) count what was yielded
        workers = state["_snapshot"]["_worker_snapshots"].values()
        assert sum(w["dataset_state"]["items"] for w in workers) == k
        dl2 = loader(LMDBIterableDataset(path, batch_size=8, shuffle=True,
                                         seed=3, decode=ld.decode))
        dl2.load_state_dict(state)
        assert [l.tolist() for _, l in dl2] == full[k:]
