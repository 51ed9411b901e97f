"""``lmdbio bench``: the interleaved comparison, on a tiny database.

That the command runs every peer (in this process and in a fresh process
per run), checks by content what it times, computes its ratios from the
times it measured, and meets bad input with one line and a non-zero exit.
The figures themselves come from benches/ (see benches/README.md)."""

import io
import json
import os
import statistics
import subprocess
import sys

import pytest

from conftest import require

lmdb = require("lmdb", "pip install lmdb")
lmdbio = require("lmdbio")
from lmdbio import bench, cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL = ",".join(bench.ALL_PEERS)


def _make_env(path, n=300, size=200):
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(b"%08d" % i, bytes([i % 251]) * (size + i % 37), append=True)
    env.close()
    return str(path)


def run(argv):
    out, err = io.BytesIO(), io.BytesIO()
    rc = cli.main(argv, stdout=out, stderr=err)
    return rc, out.getvalue().decode(), err.getvalue().decode()


def run_cli(args, cwd, env_extra=None, **kw):
    """The installed command in a subprocess, from CWD (no checkout there)."""
    env = dict(os.environ)
    env.pop("LMDBIO_BENCHES", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "lmdbio", "bench", *args],
                          capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600, **kw)


def _rows(out):
    """peer name -> table line (the peer is the 4th column)."""
    return {ln.split()[3]: ln for ln in out.splitlines()
            if len(ln.split()) > 4 and ln.split()[2] in ("hot", "cold")}


def test_bench_table_every_peer(tmp_path):
    path = _make_env(tmp_path / "db")
    rc, out, err = run(["bench", path, "--rounds", "2", "--modes", "hot",
                        "--peers", ALL, "-q"])
    assert rc == 0, err
    rows = _rows(out)
    want = set()
    for p in bench.ALL_PEERS:
        want |= ({p + "/first", p + "/later"} if p in bench.READER_PEERS else {p})
    assert set(rows) == want
    assert "x py-lmdb" in out and "x pread" in out and "x py-lmdb-get" in out
    assert "x dali-shard" in out
    # the header names the two forms of the Reader rows
    assert "NAME/first = first start: empty index cache" in out
    assert "NAME/later = later start: index cache" in out
    assert "IN-PROCESS" in out
    assert all(" 300 " in ln for ln in rows.values())  # the record count


def test_ratios_come_from_the_measured_times(tmp_path):
    """x py-lmdb of a row is the median over rounds of t(py-lmdb)/t(row) of
    the same round, recomputed here from the seconds in the JSON."""
    path = _make_env(tmp_path / "db")
    js = tmp_path / "out.json"
    rc, out, err = run(["bench", path, "--rounds", "3", "--modes", "hot",
                        "--peers", "pread,py-lmdb,lmdbio-reader,dali-shard,"
                                   "reader-shard", "--batch-size", "7",
                        "--json", str(js), "-q"])
    assert rc == 0, err
    data = json.loads(js.read_text())
    rows = {r["peer"]: r for r in data["results"][0]["rows"]}
    assert rows["lmdbio-reader/first"]["batch_size"] == 7
    assert rows["lmdbio-reader/first"]["index_start"].startswith("first start")
    assert rows["lmdbio-reader/later"]["index_start"].startswith("later start")
    for name, base in (("lmdbio-reader/first", "py-lmdb"),
                       ("lmdbio-reader/later", "pread"),
                       ("pread", "py-lmdb"),
                       ("reader-shard/later", "dali-shard")):
        ratios = [a / b for a, b in zip(rows[base]["seconds"], rows[name]["seconds"])]
        got = rows[name]["vs"][base]
        assert len(ratios) == 3
        assert got["median"] == pytest.approx(statistics.median(ratios))
        assert got["min"] == pytest.approx(min(ratios))
        assert got["max"] == pytest.approx(max(ratios))
    # like with like: a shard start is not compared with a whole epoch
    assert set(rows["reader-shard/first"]["vs"]) == {"dali-shard"}
    assert "dali-shard" not in rows["lmdbio-reader/first"]["vs"]
    # the median time is the median of the runs
    r = rows["lmdbio-reader/later"]
    assert r["seconds_median"] == statistics.median(r["seconds"])
    # every run here was in this process
    assert set(r["pids"]) == {os.getpid()}


def test_fresh_process_per_run(tmp_path):
    path = _make_env(tmp_path / "db")
    js = tmp_path / "out.json"
    rc, out, err = run(["bench", path, "--fresh", "--rounds", "2", "--modes",
                        "hot,cold", "--peers", "py-lmdb,lmdbio,lmdbio-reader,"
                        "py-lmdb-get,reader-shard", "--json", str(js), "-q"])
    assert rc == 0, err
    assert "FRESH PROCESS per run" in out
    data = json.loads(js.read_text())
    assert data["info"]["fresh"] is True
    pids = []
    for res in data["results"]:
        assert res["fresh"] is True
        for row in res["rows"]:
            assert len(row["pids"]) == 2
            pids += row["pids"]
    assert os.getpid() not in pids
    assert len(set(pids)) == len(pids)  # a new process for every run


class _WrongReader:
    """A Reader whose 5th record has one byte changed."""

    def __init__(self, *a, **kw):
        self.r = lmdbio.Reader(*a, **kw)
        self.index_from_cache = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.r.close()

    def close(self):
        self.r.close()

    def __iter__(self):
        for i, b in enumerate(self.r):
            if i == 0 and len(b) > 4:
                vals = b.values.tolist()
                vals[4] = bytes([vals[4][0] ^ 1]) + vals[4][1:]
                b = lmdbio.Batch(b.indices, b.keys, _Values(vals))
            yield b


class _Values(list):
    def tolist(self):
        return list(self)

    offsets = None


@pytest.mark.parametrize("peer", ["lmdbio-reader", "lmdbio-shuffled",
                                  "reader-shard"])
def test_content_check_catches_a_wrong_reader(tmp_path, monkeypatch, peer):
    path = _make_env(tmp_path / "db")

    class Mod:
        open = staticmethod(lmdbio.open)
        Reader = _WrongReader

    desc = bench.describe(path)
    suite = bench.Suite([peer], desc, batch_size=16, shard=(1, 3))
    try:
        bench.verify(suite)  # the real Reader passes
        monkeypatch.setattr(bench, "_lmdbio", Mod)
        with pytest.raises(bench.BenchError, match="MISMATCH.*" + peer):
            bench.verify(suite)
    finally:
        suite.close()


def test_installed_command_needs_no_checkout(tmp_path):
    """From a directory with no benches/: PATH works, --dataset says what it
    needs in one line."""
    path = _make_env(tmp_path / "db")
    p = run_cli([path, "--rounds", "1", "--modes", "hot", "-q",
                 "--peers", "py-lmdb,lmdbio-reader"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "lmdbio-reader/later" in p.stdout
    p = run_cli(["--dataset", "small"], cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "source checkout" in p.stderr
    assert "Traceback" not in p.stderr


def test_later_start_of_a_shuffled_reader_alone(tmp_path):
    """The later-start cache is filled before the rounds even when no
    Reader in key order runs first (that one saves its index only as an
    epoch reads it) and no content check ran a Reader before them."""
    path = _make_env(tmp_path / "db", n=3000)
    p = run_cli([path, "--fresh", "--no-verify", "--rounds", "1",
                 "--modes", "hot", "-q",
                 "--peers", "py-lmdb-get,lmdbio-shuffled"], cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "lmdbio-shuffled/later" in p.stdout
    assert "lmdbio-shuffled/first" in p.stdout


def _one_line_error(p, *words):
    assert p.returncode != 0, p
    assert "Traceback" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)


def test_bad_input_is_one_line(tmp_path):
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0:root:/root:/bin/bash\n")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "data.mdb").write_bytes(os.urandom(3 * 4096))
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ([str(a_file)], [str(a_file), "not a directory", "data.mdb"]),
        ([str(junk)], [str(junk), "cannot be read as an LMDB environment",
                       "give the directory"]),
        ([str(empty)], [str(empty), "no data.mdb"]),
        ([str(tmp_path / "missing")], ["missing", "no such file"]),
        ([str(empty), "--peers", "nope"], ["unknown peer 'nope'", "known:"]),
        ([str(empty), "--modes", "warm"], ["unknown mode 'warm'"]),
        ([str(empty), "--shard", "8/8"], ["--shard", "RANK/WORLD"]),
        ([str(empty), "--batch-size", "0"], ["--batch-size"]),
        ([], ["give the PATH"]),
    ]
    for args, words in cases:
        _one_line_error(run_cli(args, cwd=tmp_path), *words)


def test_bad_dataset_name_in_the_checkout(tmp_path):
    """In a source checkout --dataset runs benches/compare.py: a bad name is
    one line naming it and the known ones."""
    if not os.path.exists(os.path.join(ROOT, "benches", "compare.py")):
        pytest.fail("benches/compare.py is not in this tree")
    p = run_cli(["--dataset", "foo"], cwd=ROOT)
    _one_line_error(p, "'foo'", "known:", "small")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benches", "compare.py"),
                        "--dataset", "foo"], capture_output=True, text=True,
                       timeout=120)
    _one_line_error(p, "'foo'", "known:")


def test_plot(tmp_path):
    require("matplotlib", "pip install matplotlib")
    path = _make_env(tmp_path / "db")
    png = tmp_path / "cmp.png"
    rc, out, err = run(["bench", path, "--rounds", "2", "--modes", "hot", "-q",
                        "--peers", "py-lmdb,lmdbio-reader,dali-shard,reader-shard",
                        "--plot", str(png)])
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000


def test_plot_without_matplotlib(tmp_path):
    """matplotlib is optional: without it --plot is one line, before any
    measuring."""
    path = _make_env(tmp_path / "db")
    code = ("import sys; sys.modules['matplotlib'] = None; "
            "from lmdbio.cli import main; sys.exit(main())")
    p = subprocess.run([sys.executable, "-c", code, "bench", path, "--plot",
                        str(tmp_path / "x.png")], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    _one_line_error(p, "--plot needs matplotlib", "pip install")
    assert not (tmp_path / "x.png").exists()


def test_progress_bar_only_on_a_terminal(tmp_path):
    path = _make_env(tmp_path / "db")
    args = [path, "--rounds", "2", "--modes", "hot", "--peers", "py-lmdb,pread"]
    # not a terminal: the per-run log lines, no bar
    p = run_cli(args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stderr and "round 2/2" in p.stderr
    # a terminal: the bar, redrawn in place
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "lmdbio", "bench", *args],
                                stdout=subprocess.PIPE, stderr=slave,
                                cwd=tmp_path)
        os.close(slave)
        chunks = []
        while True:
            try:
                b = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not b:
                break
            chunks.append(b)
        out = proc.stdout.read().decode()
        assert proc.wait(timeout=120) == 0
    finally:
        os.close(master)
    tty = b"".join(chunks).decode()
    total = 2 * (2 + 1)  # peers x (rounds + warm-up)
    assert "\r[" in tty and f"{total}/{total}" in tty and "#" in tty
    assert "round 2/2" not in out  # the bar never goes to stdout
    assert "py-lmdb" in out


def test_auto_batch_size():
    assert bench.auto_batch_size(dict(records=1000, file_bytes=10 << 20,
                                      value_bytes=800_000)) == 256
    # 180 KiB values: about 4 MiB per batch
    assert bench.auto_batch_size(dict(records=100, file_bytes=20 << 20,
                                      value_bytes=100 * 180 * 1024)) == 23


def test_shard_start_rule():
    """The bench's own statement of the sharding rule against cases worked
    out by hand (it must not come from lmdbio's shard_order)."""
    assert bench.shard_start(300, 7, 8) == (266, 38)
    assert bench.shard_start(16, 3, 4) == (12, 4)
    assert bench.shard_start(3, 7, 8) == (7, 1)   # wraps: ordinal 7 % 3
    assert bench.shard_start(0, 0, 2) == (0, 0)


def _bench_script(name):
    """(path, module) of the script benches/NAME, loaded by path."""
    import importlib.util
    p = os.path.join(ROOT, "benches", name)
    if not os.path.exists(p):
        pytest.fail(f"benches/{name} is not in this tree")
    spec = importlib.util.spec_from_file_location(
        "bench_" + name.rsplit(".", 1)[0], p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return p, mod


def test_compare_is_lmdbio_bench():
    """benches/compare.py runs lmdbio.bench's code, not a copy of it."""
    _, mod = _bench_script("compare.py")
    assert mod.format_table.__module__ in ("lmdbio.bench", "lmdbio_bench")
    assert mod.ALL_PEERS == bench.ALL_PEERS


@pytest.mark.parametrize("script,flag,target", [
    ("bench_dali.py", "--dali-python", "make bench-dali"),
    ("bench_torch.py", "--tv-python", "make bench-torch"),
])
def test_real_peer_benches_say_how_to_get_their_peer(tmp_path, script, flag,
                                                     target):
    """The real-peer benchmarks run their peer from its own venv: without
    it, one line naming the make target that creates it."""
    path = os.path.join(ROOT, "benches", script)
    if not os.path.exists(path):
        pytest.fail(f"benches/{script} is not in this tree")
    p = subprocess.run([sys.executable, path, str(tmp_path), flag,
                        str(tmp_path / "no-venv" / "python"), "--modes", "hot"],
                       capture_output=True, text=True, timeout=120)
    _one_line_error(p, "no-venv", target)


def test_limits_measures_every_limit_it_names(tmp_path):
    """benches/limits.py builds its C loops and measures each limit, on one
    thread and on two, every figure positive, in the unit it names."""
    script, _ = _bench_script("limits.py")
    f = tmp_path / "file.bin"
    f.write_bytes(os.urandom(4 << 20))
    out = tmp_path / "limits.json"
    p = subprocess.run([sys.executable, script, "--dir", str(f), "--sizes",
                        "100,4096", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["rows"]
    got = {(r["name"], r["threads"]): (r["value"], r["unit"]) for r in rows}
    want = [(n, t, "GB/s") for n in ("seq_pread", "seq_pread_out",
                                     "seq_two_copy", "memcpy")
            for t in (1, 2)]
    want += [(f"rand_pread_{s}", t, "us") for s in (100, 4096) for t in (1, 2)]
    want += [("fault", 1, "us")]
    assert sorted(got) == sorted((n, t) for n, t, _ in want)
    for n, t, unit in want:
        value, u = got[(n, t)]
        assert u == unit and value > 0, (n, t, value, u)
    assert "seq_two_copy" in p.stdout and "rand_pread_4096" in p.stdout


def test_limits_rejects_what_it_cannot_read(tmp_path):
    """A missing file or a bad size: one line, no traceback; output it does
    not know is an error, not a figure."""
    script, mod = _bench_script("limits.py")
    p = subprocess.run([sys.executable, script, "--dir",
                        str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=60)
    _one_line_error(p, "no such file", "--dir")
    (tmp_path / "f").write_bytes(b"x" * 65536)
    for sizes in ("12,zero", "0", ","):
        p = subprocess.run([sys.executable, script, "--dir",
                            str(tmp_path / "f"), "--sizes", sizes],
                           capture_output=True, text=True, timeout=60)
        _one_line_error(p, "--sizes", "16,830,4096")
    p = subprocess.run([sys.executable, script, "--dir", str(tmp_path / "f"),
                        "--sizes", "100000"],
                       capture_output=True, text=True, timeout=60)
    _one_line_error(p, "does not fit", "smaller --sizes")
    with pytest.raises(ValueError):
        mod.parse("seq_pread 1 fast\n")
    assert mod.parse("fault 1 1.5 us\n") == [
        dict(name="fault", threads=1, value=1.5, unit="us")]


def _result(mode, rows, path="/db", records=1000, file_bytes=1 << 20):
    return dict(dataset="db", records=records, mode=mode, path=path,
                file_bytes=file_bytes,
                rows=[dict(peer=k, seconds_median=v) for k, v in rows.items()])


def test_bounds_cold_follow_from_the_run():
    """benches/bounds.py's cold bounds: the peer's cold time over
    max(load, hot) and over load + hot, load being the cold pread row's;
    rows without their peer, their hot time or a cold pread are left
    out."""
    _, mod = _bench_script("bounds.py")
    hot = _result("hot", {"pread": 0.1, "py-lmdb": 0.3, "lmdbio": 0.2,
                          "py-lmdb-get": 1.0, "lmdbio-shuffled/later": 0.5,
                          "lmdbio-get": 0.9})
    cold = _result("cold", {"pread": 0.4, "py-lmdb": 0.8, "lmdbio": 0.6,
                            "py-lmdb-get": 1.6, "lmdbio-shuffled/later": 1.0,
                            "lmdbio-reader/first": 0.5})
    got = {b["peer"]: b for b in mod.cold_bounds([hot, cold])}
    assert sorted(got) == ["lmdbio", "lmdbio-shuffled/later"]
    walk, shuf = got["lmdbio"], got["lmdbio-shuffled/later"]
    assert walk["vs"] == "py-lmdb" and shuf["vs"] == "py-lmdb-get"
    assert walk["measured"] == pytest.approx(0.8 / 0.6)
    assert walk["overlap"] == pytest.approx(0.8 / 0.4)
    assert walk["serial"] == pytest.approx(0.8 / 0.6)
    assert shuf["measured"] == pytest.approx(1.6)
    assert shuf["overlap"] == pytest.approx(1.6 / 0.5)
    assert shuf["serial"] == pytest.approx(1.6 / 0.9)
    cold_no_pread = _result("cold", {"py-lmdb": 0.8, "lmdbio": 0.6})
    assert mod.cold_bounds([hot, cold_no_pread]) == []


def test_bounds_hot_floor_is_one_read_a_record():
    """The shuffled floor: records x the two-thread read time, and a first
    start also one two-thread read of the file; the bound is py-lmdb-get's
    time over it (the machine's figures stubbed)."""
    _, mod = _bench_script("bounds.py")
    assert mod.hot_floor(1000, 2.0) == pytest.approx(2e-3)
    assert mod.hot_floor(1000, 2.0, 4 << 30, 4.0) == pytest.approx(
        2e-3 + (4 << 30) / 4e9)
    hot = _result("hot", {"py-lmdb-get": 0.01, "lmdbio-shuffled/first": 0.008,
                          "lmdbio-shuffled/later": 0.005},
                  file_bytes=2_000_000)
    mod.mean_value_bytes = lambda path: 800.0
    seen = []

    def measure(path, size):
        seen.append((path, size))
        return 2.0, 1.0
    got = {b["peer"]: b for b in mod.hot_bounds([hot], measure)}
    assert seen == [("/db", 800)]
    assert got["lmdbio-shuffled/later"]["floor"] == pytest.approx(2e-3)
    assert got["lmdbio-shuffled/later"]["bound"] == pytest.approx(5.0)
    assert got["lmdbio-shuffled/later"]["measured"] == pytest.approx(2.0)
    assert got["lmdbio-shuffled/first"]["floor"] == pytest.approx(4e-3)
    assert got["lmdbio-shuffled/first"]["bound"] == pytest.approx(2.5)


def test_bounds_of_a_real_run(tmp_path):
    """A real bench run, hot and cold, through benches/bounds.py: every
    lmdbio row with its peer gets its bounds, the overlap bound never below
    the serial one, and the hot floors are measured on the run's file."""
    script, _ = _bench_script("bounds.py")
    path = _make_env(tmp_path / "db", n=3000, size=600)
    run_json = tmp_path / "run.json"
    rc, out, err = run(["bench", path, "--rounds", "1", "--modes", "hot,cold",
                        "--peers", "pread,py-lmdb,lmdbio,py-lmdb-get,"
                        "lmdbio-shuffled", "--json", str(run_json), "-q"])
    assert rc == 0, err
    bounds_json = tmp_path / "bounds.json"
    p = subprocess.run([sys.executable, script, str(run_json), "--json",
                        str(bounds_json)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    got = json.loads(bounds_json.read_text())
    assert sorted(b["peer"] for b in got["cold"]) == [
        "lmdbio", "lmdbio-shuffled/first", "lmdbio-shuffled/later"]
    for b in got["cold"]:
        assert 0 < b["serial"] <= b["overlap"], b
    assert sorted(b["peer"] for b in got["hot"]) == [
        "lmdbio-shuffled/first", "lmdbio-shuffled/later"]
    for b in got["hot"]:
        assert 600 <= b["value_bytes"] <= 640 and b["read_us"] > 0, b
        assert b["bound"] == pytest.approx(
            b["measured"] * b["seconds"] / b["floor"])
    assert "serial" in p.stdout and "floor" in p.stdout


def test_bounds_rejects_what_is_not_a_run(tmp_path):
    """Not the JSON of a bench run, or one with nothing to bound: one line."""
    script, _ = _bench_script("bounds.py")
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    p = subprocess.run([sys.executable, script, str(bad)],
                       capture_output=True, text=True, timeout=60)
    _one_line_error(p, "not the JSON of an lmdbio bench run", "--json")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"results": [_result("hot", {"pread": 1.0})]}))
    p = subprocess.run([sys.executable, script, str(empty)],
                       capture_output=True, text=True, timeout=60)
    _one_line_error(p, "nothing to bound", "pread")


def test_bench_netfs_says_what_it_needs(tmp_path):
    """benches/bench_netfs.py on a directory with no database: one line."""
    script, _ = _bench_script("bench_netfs.py")
    p = subprocess.run([sys.executable, script, str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=60)
    _one_line_error(p, "no such file", "LMDB environment directory")
