"""``lmdbio bench``: the interleaved comparison table, on a tiny database.

Only that the command runs, checks what it times and prints the table:
the figures themselves come from benches/ (see benches/README.md)."""

import io
import os

import pytest

lmdb = pytest.importorskip("lmdb")
lmdbio = pytest.importorskip("lmdbio")
from lmdbio import cli  # noqa: E402


def _make_env(path, n=300, size=200):
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(b"%08d" % i, bytes([i % 251]) * size, append=True)
    env.close()
    return str(path)


def run(argv):
    out, err = io.BytesIO(), io.BytesIO()
    rc = cli.main(argv, stdout=out, stderr=err)
    return rc, out.getvalue().decode(), err.getvalue().decode()


def test_bench_table(tmp_path):
    path = _make_env(tmp_path / "db")
    rc, out, err = run(["bench", path, "--rounds", "2", "--modes", "hot",
                        "--peers", "pread,py-lmdb,lmdbio,lmdbio-reader,"
                                   "py-lmdb-get,lmdbio-shuffled", "-q"])
    assert rc == 0, err
    assert "x py-lmdb" in out and "x pread" in out and "x py-lmdb-get" in out
    for peer in ("pread", "py-lmdb", "lmdbio", "lmdbio-reader",
                 "py-lmdb-get", "lmdbio-shuffled"):
        assert any(line.split()[3:4] == [peer] for line in out.splitlines()), peer
    assert " 300 " in out  # the record count


def test_bench_json_and_batch(tmp_path):
    path = _make_env(tmp_path / "db")
    js = tmp_path / "out.json"
    rc, out, err = run(["bench", path, "--rounds", "1", "--modes", "hot",
                        "--peers", "py-lmdb,lmdbio-reader", "--batch-size", "7",
                        "--json", str(js), "-q"])
    assert rc == 0, err
    import json
    data = json.loads(js.read_text())
    rows = {r["peer"]: r for r in data["results"][0]["rows"]}
    assert rows["lmdbio-reader"]["batch_size"] == 7
    assert rows["py-lmdb"]["vs"]["py-lmdb"]["median"] == 1.0


def test_bench_errors(tmp_path):
    rc, out, err = run(["bench", "--peers", "nope", str(tmp_path)])
    assert rc == 2 and "unknown peer" in err
    rc, out, err = run(["bench", str(tmp_path / "missing")])
    assert rc == 2 and "no data.mdb" in err


def test_auto_batch_size():
    from lmdbio.bench import auto_batch_size
    assert auto_batch_size(dict(records=1000, file_bytes=10 << 20,
                                value_bytes=800_000)) == 256
    # 180 KiB values: about 4 MiB per batch
    assert auto_batch_size(dict(records=100, file_bytes=20 << 20,
                                value_bytes=100 * 180 * 1024)) == 23


def test_compare_is_lmdbio_bench():
    """benches/compare.py runs lmdbio.bench's code, not a copy of it."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = os.path.join(root, "benches", "compare.py")
    if not os.path.exists(p):
        pytest.skip("benches/ not in this tree")
    spec = importlib.util.spec_from_file_location("bench_compare", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.make_peers.__module__ in ("lmdbio.bench", "lmdbio_bench")
