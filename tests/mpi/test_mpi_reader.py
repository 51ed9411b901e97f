"""The Reader over a communicator (run under mpiexec -n 1, 2, 4 by make test).

Every rank must get exactly the records the documented sharding rule gives
it, value for value equal to py-lmdb's; engines (POSIX, MPI-IO collective),
one reader per node and staggered reading must agree; a corrupt page must
raise on every rank.  Each test gathers its outcome from every rank before
asserting, so one rank's failure fails all ranks instead of hanging them.
"""

import os

import pytest

from conftest import require, spec_shard

require("mpi4py", "pip install mpi4py mpich")

import numpy as np  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
import lmdbio  # noqa: E402

from mpi_support import (RANK, SIZE, all_ok, break_last_leaf, comm,  # noqa: E402,F401
                         outcome, shared_dir)


def _write(path, n, dupsort=False, seed=7):
    """Rank 0 writes; returns everyone the records in key order."""
    if RANK == 0:
        rng = np.random.default_rng(seed)
        env = lmdb.open(path, map_size=1 << 28, max_dbs=2)
        db = env.open_db(b"d", dupsort=True) if dupsort else None
        with env.begin(write=True) as txn:
            for i in rng.permutation(n):
                key = b"%07d" % i
                big = rng.random() < 0.1 and not dupsort
                # (a duplicate is a sub-database key: never empty)
                size = (rng.integers(9000, 15000) if big
                        else rng.integers(1 if dupsort else 0, 300))
                val = rng.integers(0, 256, int(size), dtype=np.uint8).tobytes()
                txn.put(key, val, db=db)
                if dupsort and i % 7 == 0:
                    for j in range(int(i % 50)):
                        txn.put(key, b"dup%03d" % j, db=db)
        with env.begin() as txn:
            items = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
        env.close()
    else:
        items = None
    comm.Barrier()
    return comm.bcast(items)


@pytest.fixture(scope="module")
def plain(shared_dir):
    path = os.path.join(shared_dir, "plain")
    # 1001 records: not divisible by 2 or 4
    return path, _write(path, 1001)


@pytest.fixture(scope="module")
def dups(shared_dir):
    path = os.path.join(shared_dir, "dups")
    return path, _write(path, 301, dupsort=True)


def _check_epoch(path, items, db=None, **kw):
    bs = kw.setdefault("batch_size", 37)
    with lmdbio.Reader(path, db=db, comm=comm, index_cache=False, **kw) as r:
        for epoch in (0, 3):
            r.set_epoch(epoch)
            want = spec_shard(len(items), SIZE, RANK, kw.get("shuffle", False),
                              kw.get("seed", 0), epoch,
                              kw.get("drop_last", False), bs)
            got = []
            nbatches = 0
            for b in r:
                nbatches += 1
                assert len(b) <= bs
                for i, k, v in zip(b.indices.tolist(), b.keys.tolist(),
                                   b.values.tolist()):
                    assert (k, v) == items[i], "record %d differs" % i
                got.extend(b.indices.tolist())
            assert got == want
            assert nbatches == len(r)
            # every rank has the same number of batches
            assert len(set(comm.allgather(nbatches))) == 1
        assert r.total_records == len(items)


@pytest.mark.parametrize("engine", ["mpiio", "posix"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sharding_rule(plain, engine, shuffle, drop_last):
    path, items = plain
    all_ok(lambda: _check_epoch(path, items, engine=engine, shuffle=shuffle,
                                 seed=11, drop_last=drop_last))


def test_dupsort_named(dups):
    path, items = dups
    all_ok(lambda: _check_epoch(path, items, db=b"d", shuffle=True))


@pytest.mark.parametrize("engine", ["mpiio", "posix"])
def test_node_local_matches(plain, engine):
    path, items = plain
    all_ok(lambda: _check_epoch(path, items, engine=engine, node_local=True,
                                 node_size=2, shuffle=True, seed=3))


def test_staggered_groups(plain):
    path, items = plain
    all_ok(lambda: _check_epoch(path, items, io_groups=2, shuffle=True))
    all_ok(lambda: _check_epoch(path, items, node_local=True, node_size=1,
                                 io_groups=3))


def test_engines_give_identical_batches(plain):
    path, items = plain

    def run():
        outs = []
        for engine in ("posix", "mpiio"):
            with lmdbio.Reader(path, comm=comm, engine=engine, batch_size=64,
                               shuffle=True, seed=5, index_cache=False) as r:
                outs.append([(b.indices.tolist(), b.keys.data.tobytes(),
                              b.keys.offsets.tolist(), b.values.data.tobytes(),
                              b.values.offsets.tolist()) for b in r])
        assert outs[0] == outs[1]

    all_ok(run)


def test_lock_pins_one_snapshot_everywhere(plain):
    path, items = plain

    def run():
        with lmdbio.Reader(path, comm=comm, lock=True, index_cache=False) as r:
            got = [kv for b in r for kv in zip(b.keys.tolist(),
                                               b.values.tolist())]
        assert len(got) == len(spec_shard(len(items), SIZE, RANK))

    all_ok(run)


def test_cooperative_index_and_cache(plain, tmp_path_factory):
    path, items = plain
    cache = comm.bcast(str(tmp_path_factory.mktemp("cache")) if RANK == 0
                       else None)

    def run():
        for expect_cached in (False, True):
            with lmdbio.Reader(path, comm=comm, index_cache=cache) as r:
                assert r.index_from_cache == expect_cached
                assert r.total_records == len(items)
                b = r.read([0, len(items) - 1])  # independent, any rank
                assert b.values.tolist() == [items[0][1], items[-1][1]]

    all_ok(run)


def test_corrupt_page_raises_on_every_rank(shared_dir):
    path = os.path.join(shared_dir, "corrupt")
    items = _write(path, 2000, seed=9)
    break_last_leaf(path)

    def read():
        with lmdbio.Reader(path, comm=comm, batch_size=50,
                           index_cache=False) as r:
            for _ in r:
                pass
    everyone = comm.allgather(outcome(read))
    assert everyone == ["CorruptedError"] * SIZE, everyone
    assert len(items) == 2000
