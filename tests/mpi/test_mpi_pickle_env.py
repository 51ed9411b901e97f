"""An Environment opened with comm= refuses to pickle, with a TypeError
saying why (a communicator does not travel) and what to do instead."""

import pickle
import shutil
import tempfile

import pytest

from conftest import require

require("mpi4py", "pip install mpi4py mpich")
from mpi4py import MPI  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
import lmdbio  # noqa: E402

comm = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def db():
    path = tempfile.mkdtemp(prefix="lmdbio-mpi-pickle-") if comm.rank == 0 else None
    path = comm.bcast(path)
    if comm.rank == 0:
        env = lmdb.open(path, map_size=1 << 24)
        with env.begin(write=True) as txn:
            for i in range(100):
                txn.put(b"k%03d" % i, b"v%d" % i)
        env.close()
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("how", [dict(comm=comm), dict(engine="mpiio")])
def test_comm_environment_refuses_to_pickle(db, how):
    env = lmdbio.open(db, lock=False, **how)
    try:
        with pytest.raises(TypeError, match="communicator does not travel"):
            pickle.dumps(env)
    finally:
        env.close()   # collective: every rank reaches it
    # closed, it still refuses (the arguments name the communicator)
    with pytest.raises(TypeError, match="comm"):
        pickle.dumps(env)
