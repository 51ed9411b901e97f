"""What every MPI test module shares: the world communicator, a check that
fails on every rank when any rank failed (so that one rank's failure never
leaves the others hanging in a collective), and a directory every rank sees.
Imported after mpi4py is known to be importable."""

import os
import shutil
import struct
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


def break_last_leaf(path):
    """On rank 0, then a barrier: make the last leaf page of the file give
    an odd first node offset.  The index (leaf headers) does not see it; the
    rank(s) reading the end of the key space meet it mid-epoch."""
    if RANK == 0:
        with open(os.path.join(path, "data.mdb"), "r+b") as f:
            data = f.read()
        psize = struct.unpack_from("<I", data, 16 + 24)[0]  # meta 0's psize
        last = None
        for pg in range(2, len(data) // psize):
            off = pg * psize
            if struct.unpack_from("<H", data, off + 10)[0] == 0x02:
                last = off  # P_LEAF
        with open(os.path.join(path, "data.mdb"), "r+b") as f:
            f.seek(last + 16)
            f.write(struct.pack("<H", 1))  # odd, inside the header
    comm.Barrier()


def outcome(read):
    """What read() ended with: "CorruptedError" (naming a page), "no error",
    or the other exception, for comparing across ranks."""
    import lmdbio
    try:
        read()
        return "no error"
    except lmdbio.CorruptedError as e:
        return "CorruptedError" if "page" in str(e) else "no page: %s" % e
    except Exception as e:  # noqa: BLE001
        return "%s: %s" % (type(e).__name__, e)
