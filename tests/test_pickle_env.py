"""Pickling an Environment carries its path and constructor arguments, never
open files: ``pickle.loads`` opens it again, here and in a spawn-started
process.  (Under ``comm=`` pickling raises TypeError: tests/mpi.)"""

import multiprocessing
import os
import pickle

import pytest

lmdb = pytest.importorskip("lmdb")
import lmdbio  # noqa: E402

N = 300


def _items(i):
    # a few values past a page, so overflow runs are read too
    return b"k%05d" % i, (b"v%d-" % i) * (1 + (i % 7) * (700 if i % 50 == 0 else 1))


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "db")
    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(*_items(i))
    env.close()
    return path


@pytest.fixture
def db_file(tmp_path):
    path = str(tmp_path / "file.mdb")
    env = lmdb.open(path, map_size=1 << 26, subdir=False)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(*_items(i))
    env.close()
    return path


def _scan(env):
    with env.begin() as txn:
        return [(bytes(k), bytes(v)) for k, v in txn.cursor()]


def _expected():
    return sorted(_items(i) for i in range(N))


def test_round_trip_reopens(db):
    env = lmdbio.open(db, readonly=True, lock=False, readahead=False,
                      cache_bytes=1 << 20)
    blob = pickle.dumps(env)
    clone = pickle.loads(blob)
    try:
        assert clone is not env
        assert clone.path() == env.path()
        assert clone.flags() == env.flags()
        assert clone.flags()["readahead"] is False
        assert _scan(clone) == _scan(env) == _expected()
        # nothing open travelled: closing one leaves the other readable
        env.close()
        assert _scan(clone) == _expected()
    finally:
        clone.close()
        env.close()


def test_options_travel(db_file):
    os.remove(db_file + "-lock")        # py-lmdb's writer made it
    env = lmdbio.Environment(db_file, subdir=False, lock=False, max_dbs=3)
    clone = pickle.loads(pickle.dumps(env))
    try:
        assert clone.flags()["subdir"] is False
        assert _scan(clone) == _expected()
        # lock=False travelled: no lock file appears next to the data file
        assert not os.path.exists(db_file + "-lock")
    finally:
        env.close()
        clone.close()


def test_closed_environment_pickles_its_arguments(db):
    env = lmdbio.open(db, lock=False)
    env.close()
    clone = pickle.loads(pickle.dumps(env))
    try:
        assert _scan(clone) == _expected()
    finally:
        clone.close()


def test_unpickling_a_vanished_path_raises(db, tmp_path):
    import shutil
    env = lmdbio.open(db, lock=False)
    blob = pickle.dumps(env)
    env.close()
    shutil.rmtree(db)
    with pytest.raises(lmdbio.Error, match="No such file"):
        pickle.loads(blob)


def _child_scan(env):
    try:
        return _scan(env)
    finally:
        env.close()


def test_spawn_started_process_reads_the_same(db):
    env = lmdbio.open(db, lock=False)
    try:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            got = pool.apply(_child_scan, (env,))
        assert got == _scan(env) == _expected()
    finally:
        env.close()


def test_signature_is_visible():
    import inspect
    sig = inspect.signature(lmdbio.open)
    assert list(sig.parameters)[:3] == ["path", "map_size", "subdir"]
    assert sig.parameters["lock"].default is True
    assert sig.parameters["comm"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(lmdbio.Environment) == sig
    # the signature is the constructor's: an argument outside it is refused
    with pytest.raises(TypeError):
        lmdbio.open("x", no_such_argument=1)
