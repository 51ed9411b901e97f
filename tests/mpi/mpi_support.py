"""What every MPI test module shares: the world communicator, a check that
fails on every rank when any rank failed (so that one rank's failure never
leaves the others hanging in a collective), and a directory every rank sees.
Imported after mpi4py is known to be importable."""

import shutil
import tempfile

import pytest
from mpi4py import MPI

comm = MPI.COMM_WORLD
RANK, SIZE = comm.Get_rank(), comm.Get_size()


def all_ok(fn):
    """Run fn on every rank; fail everywhere if it failed anywhere."""
    try:
        fn()
        err = None
    except Exception as e:  # noqa: BLE001 - reported on every rank
        err = "rank %d: %s: %s" % (RANK, type(e).__name__, e)
    errs = [e for e in comm.allgather(err) if e]
    assert not errs, "\n".join(errs)


@pytest.fixture(scope="module")
def shared_dir():
    """A temporary directory made by rank 0, the same path on every rank."""
    path = tempfile.mkdtemp(prefix="lmdbio-mpi-") if RANK == 0 else None
    path = comm.bcast(path)
    yield path
    comm.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)
