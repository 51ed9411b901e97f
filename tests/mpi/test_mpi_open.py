"""lmdbio.open(comm=...): the drop-in API over a communicator (mpiexec -n
1, 2, 4 via make test).  begin() is collective and every rank reads the
snapshot rank 0 chose; pages come through MPI-IO (engine="mpiio", the
default with comm) or pread."""

import os
import shutil
import tempfile

import pytest

from conftest import require

require("mpi4py", "pip install mpi4py mpich")

lmdb = require("lmdb", "pip install lmdb")
import lmdbio  # noqa: E402

from mpi_support import RANK, all_ok, comm  # noqa: E402


@pytest.fixture(scope="module")
def db():
    path = tempfile.mkdtemp(prefix="lmdbio-mpi-open-") if RANK == 0 else None
    path = comm.bcast(path)
    if RANK == 0:
        env = lmdb.open(path, map_size=1 << 26, max_dbs=2)
        named = env.open_db(b"n", dupsort=True)
        with env.begin(write=True) as txn:
            for i in range(2000):
                txn.put(b"k%05d" % i, os.urandom(20 if i % 50 else 9000))
                txn.put(b"d%03d" % (i % 300), b"v%05d" % i, db=named)
        env.close()
    comm.Barrier()
    yield path
    comm.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def _oracle(path, name=None):
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=2)
    d = env.open_db(name, create=False) if name else None
    with env.begin() as txn:
        items = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=d)]
    env.close()
    return items


@pytest.mark.parametrize("engine", ["mpiio", "posix"])
@pytest.mark.parametrize("lock", [False, True])
def test_reads_like_pylmdb(db, engine, lock):
    want = _oracle(db)
    want_named = _oracle(db, b"n")

    def run():
        with lmdbio.open(db, comm=comm, engine=engine, lock=lock,
                         max_dbs=2) as env:
            named = env.open_db(b"n", create=False)
            with env.begin() as txn:
                assert list(txn.cursor()) == want
                assert list(txn.cursor(db=named)) == want_named
                assert txn.get(b"k00049") == want[49][1]
                ids = comm.allgather(txn.id())
                assert len(set(ids)) == 1

    all_ok(run)


def test_every_rank_reads_rank0s_snapshot(db):
    def run():
        with lmdbio.open(db, comm=comm, lock=False) as env:
            for round_ in range(3):
                if RANK == 0:  # a writer moves on between transactions
                    w = lmdb.open(db, map_size=1 << 26, max_dbs=2)
                    with w.begin(write=True) as t:
                        t.put(b"round", b"%d" % round_)
                    w.close()
                with env.begin() as txn:
                    seen = comm.allgather((txn.id(), txn.get(b"round")))
                    assert len(set(seen)) == 1, seen

    all_ok(run)


def test_missing_path_raises_everywhere():
    outcome = None
    try:
        lmdbio.open("/nonexistent/lmdbio-mpi", comm=comm)
    except lmdbio.Error as e:
        outcome = "Error" if "/nonexistent" in str(e) else str(e)
    assert comm.allgather(outcome) == ["Error"] * comm.Get_size()
