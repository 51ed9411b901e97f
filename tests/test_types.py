"""Types: the package ships py.typed and stubs for its compiled modules,
the stubs agree with the built modules (mypy's stubtest, what `make
stubtest` runs), and inspect sees the public classes' signatures."""

import inspect
import os
import subprocess
import sys

import pytest

import lmdbio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.dirname(lmdbio.__file__)
COMPILED = ["_core", "_bulk", "_datum"]


def test_installed_package_ships_types():
    assert os.path.exists(os.path.join(PKG, "py.typed"))
    for m in COMPILED:
        assert os.path.exists(os.path.join(PKG, m + ".pyi")), m


def test_stubtest_passes():
    pytest.importorskip("mypy")
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--allowlist",
         os.path.join(ROOT, "tests", "stubtest-allowlist.txt")]
        + ["lmdbio." + m for m in COMPILED],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("cls,first", [
    (lmdbio.Environment, ["path", "map_size"]),
    (lmdbio.Transaction, ["env", "db", "parent", "write", "buffers"]),
    (lmdbio.Cursor, ["db", "txn"]),
])
def test_class_signatures_are_the_constructors(cls, first):
    params = list(inspect.signature(cls).parameters)
    assert params[:len(first)] == first
    # and the constructor refuses what the signature does not list
    with pytest.raises(TypeError):
        cls(*([None] * (len(params) + 1)))


def test_signature_matches_behaviour(tmp_path):
    lmdb = pytest.importorskip("lmdb")
    env = lmdb.open(str(tmp_path), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"a", b"1")
    env.close()
    sig = inspect.signature(lmdbio.Environment)
    bound = sig.bind(str(tmp_path), lock=False, cache_bytes=1 << 20)
    e = lmdbio.Environment(*bound.args, **bound.kwargs)
    try:
        txn = lmdbio.Transaction(e, buffers=True)
        assert bytes(txn.get(b"a")) == b"1"
        c = lmdbio.Cursor(e.open_db(), txn)
        assert c.first() and bytes(c.key()) == b"a"
        txn.abort()
    finally:
        e.close()
