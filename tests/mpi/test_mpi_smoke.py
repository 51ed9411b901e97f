"""MPI smoke test: every rank reads the same LMDB with lmdbio and gets what
py-lmdb gets.  Run under mpiexec (`make test-mpi` runs -n 1, 2 and 4):

    mpiexec -n 4 python -m pytest tests/mpi

Collectives are reached on every rank whatever happens locally (errors are
gathered first and asserted after), so a failure on one rank fails the test
on all ranks instead of hanging the others.
"""

import hashlib
import os
import shutil
import tempfile

import pytest

from conftest import require

require("mpi4py", "pip install mpi4py mpich")
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
import lmdbio  # noqa: E402

comm = MPI.COMM_WORLD


def _items(n=3000, seed=1234):
    """Deterministic records: varied key lengths, empty and overflow values."""
    rng = np.random.default_rng(seed)
    out = {}
    while len(out) < n:
        klen = int(rng.integers(1, 64))
        key = rng.integers(0, 256, size=klen, dtype=np.uint8).tobytes()
        r = rng.random()
        vlen = 0 if r < 0.05 else int(rng.integers(9000, 20000)) if r < 0.15 else int(rng.integers(1, 400))
        out[key] = rng.integers(0, 256, size=vlen, dtype=np.uint8).tobytes()
    return out


def _digest(items):
    h = hashlib.sha256()
    for k, v in items:
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
    return np.frombuffer(h.digest(), dtype=np.uint8).copy()


def _read_pylmdb(path):
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def _read_lmdbio(path, lock):
    env = lmdbio.open(path, readonly=True, lock=lock)
    try:
        with env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def _local(fn, *args):
    """(result, None) or (None, 'ExcType: message'), never raising."""
    try:
        return fn(*args), None
    except Exception as e:  # gathered and asserted after the collective
        return None, f"{type(e).__name__}: {e}"


@pytest.fixture(scope="module")
def shared_db():
    """Rank 0 writes the database into a fresh temp dir and broadcasts the path."""
    path, err = None, None
    if comm.rank == 0:
        try:
            base = os.environ.get("LMDBIO_TEST_SHARED_TMP") or None
            path = tempfile.mkdtemp(prefix="lmdbio-mpi-", dir=base)
            env = lmdb.open(path, map_size=256 << 20)
            with env.begin(write=True) as txn:
                for k, v in _items().items():
                    txn.put(k, v)
            env.close()
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
    path, err = comm.bcast((path, err), root=0)
    comm.Barrier()
    if err:
        pytest.fail(f"rank 0 could not write the test database: {err}")
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def test_world_size_is_what_mpiexec_was_asked_for():
    # Catches an mpi4py that does not talk to the mpiexec that launched it (every
    # process would then be rank 0 of a world of size 1).
    want = os.environ.get("LMDBIO_TEST_MPI_SIZE")
    if want is None:
        pytest.skip("LMDBIO_TEST_MPI_SIZE not set (make test-mpi sets it)")
    assert comm.size == int(want)
    ranks = comm.allgather(comm.rank)
    assert sorted(ranks) == list(range(int(want)))


@pytest.mark.parametrize("lock", [True, False], ids=["lock", "nolock"])
def test_every_rank_reads_what_pylmdb_reads(shared_db, lock):
    expected = _read_pylmdb(shared_db)
    assert len(expected) == 3000
    got, err = _local(_read_lmdbio, shared_db, lock)

    errors = comm.allgather(err)
    mine = _digest(got) if got is not None else np.zeros(32, np.uint8)
    digests = np.empty((comm.size, 32), dtype=np.uint8)
    comm.Allgather(mine, digests)

    failed = {r: e for r, e in enumerate(errors) if e is not None}
    assert not failed, f"lmdbio.open(lock={lock}) failed on ranks: {failed}"
    assert len(got) == len(expected)
    assert got == expected
    want = _digest(expected)
    disagree = [r for r in range(comm.size) if not np.array_equal(digests[r], want)]
    assert not disagree, f"ranks {disagree} read different bytes than py-lmdb"


def test_each_rank_gets_its_share_of_keys(shared_db):
    """Point lookups, the keys split round-robin over the ranks."""
    items = sorted(_items().items())
    mine = items[comm.rank::comm.size]

    def lookups():
        env = lmdbio.open(shared_db, readonly=True, lock=True)
        try:
            with env.begin() as txn:
                found = [txn.get(k) for k, _ in mine]
                missing = txn.get(b"\xff" * 70, default=b"<none>")
            return found, missing
        finally:
            env.close()

    res, err = _local(lookups)
    bad = 0
    if res is not None:
        found, missing = res
        bad = sum(1 for (k, v), f in zip(mine, found) if f is None or bytes(f) != v)
        bad += missing != b"<none>"
    counts = comm.allgather((err, bad))
    assert all(e is None for e, _ in counts), counts
    assert [b for _, b in counts] == [0] * comm.size
