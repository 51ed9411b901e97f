"""A read fault on one rank under mpiexec: that rank's Reader raises
lmdbio.DiskError promptly (from its prefetch thread, without hanging), the
other ranks read their shards correctly, and every rank learns of the
failure through the harness's collective after each batch, so nobody waits
forever.  The fault is real (the failing rank's copy of the file shrinks
under its Reader), so it needs no fault-injection build.

The collective agreement here is the harness's: Readers built with
rank=/world_size= read independently.  Error agreement inside lmdbio's own
collective reads (comm=, the MPI-IO engine) is tested with that engine.
"""

import os
import shutil
import tempfile

import pytest

from conftest import require

require("mpi4py", "pip install mpi4py mpich")
from mpi4py import MPI  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
import lmdbio  # noqa: E402

comm = MPI.COMM_WORLD
N = 4000


@pytest.fixture(scope="module")
def rank_copy():
    """Rank 0 writes the database; every rank reads its own copy."""
    base = os.environ.get("LMDBIO_TEST_SHARED_TMP") or None
    src, err = None, None
    if comm.rank == 0:
        try:
            src = tempfile.mkdtemp(prefix="lmdbio-mpi-faults-", dir=base)
            env = lmdb.open(src, map_size=256 << 20)
            with env.begin(write=True) as txn:
                for i in range(N):
                    txn.put(b"k%06d" % i, b"%d;" % i * (500 if i % 40 == 3 else 30))
            env.close()
        except Exception as e:
            err = "%s: %s" % (type(e).__name__, e)
    src, err = comm.bcast((src, err), root=0)
    if err:
        pytest.fail("rank 0 could not write the database: " + err)
    mine = tempfile.mkdtemp(prefix="lmdbio-mpi-rank%d-" % comm.rank, dir=base)
    shutil.copyfile(os.path.join(src, "data.mdb"), os.path.join(mine, "data.mdb"))
    comm.Barrier()
    yield mine
    comm.Barrier()
    shutil.rmtree(mine, ignore_errors=True)
    if comm.rank == 0:
        shutil.rmtree(src, ignore_errors=True)


def test_fault_on_one_rank_fails_every_rank(rank_copy):
    failing = comm.size - 1
    data = os.path.join(rank_copy, "data.mdb")
    keep = os.path.getsize(data) // 4 // 4096 * 4096
    local_error = None
    seen = 0
    step = 0
    agreed_step = None
    reader = lmdbio.Reader(rank_copy, rank=comm.rank, world_size=comm.size,
                           batch_size=50, lock=False, index_cache=False,
                           prefetch_bytes=1)
    batches = iter(reader)
    try:
        while True:
            failed = 0
            done = 0
            try:
                b = next(batches)
                seen += len(b)
                if comm.rank == failing and step == 1:
                    with open(data, "r+b") as f:
                        f.truncate(keep)
            except StopIteration:
                done = 1
            except lmdbio.Error as e:
                local_error = e
                failed = 1
            # the harness's agreement: one collective per step, on every rank
            nfailed = comm.allreduce(failed, op=MPI.SUM)
            ndone = comm.allreduce(done, op=MPI.SUM)
            step += 1
            if nfailed:
                agreed_step = step
                break
            if ndone == comm.size:
                break
            assert step < 10000
    finally:
        reader.close()
    errors = comm.allgather(None if local_error is None else
                            (type(local_error).__name__, getattr(local_error, "offset", None)))
    steps = comm.allgather(agreed_step)
    assert len(set(steps)) == 1 and steps[0] is not None, steps
    kinds = [e for e in errors if e is not None]
    assert kinds and all(k == "DiskError" and off is not None for k, off in kinds), errors
    assert errors[failing] is not None, errors
