"""``lmdbio stat`` / ``lmdbio dump`` against lmdb-utils' mdb_stat / mdb_dump.

Every generated database is checked with every option combination: stdout
must be byte-identical, the exit status the same, and stderr the same once
the program names are swapped. The commands run in-process
(``lmdbio.cli.main``) over two backends:

* ``lmdbio``: the real thing (skipped while the package does not import);
* ``pylmdb``: py-lmdb plus a small pure-Python free-DB reader standing in for
  lmdbio's ``Environment._free_db()`` (py-lmdb cannot open dbi 0). This keeps
  the command code testable on its own.

Plus a few end-to-end ``python -m lmdbio`` runs, mdb_load round trips of
lmdbio's dumps, live and stale readers in the lock file (-e, -r, -rr), and
hypothesis-generated contents.

The tools always run after lmdbio's command on the same state: liblmdb
re-initialises or extends the lock file and takes a reader slot, lmdbio
does not.
"""

import importlib
import importlib.util
import io
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

if os.environ.get("CI") or os.environ.get("LMDBIO_REQUIRE"):
    import lmdb  # the oracle: under make test its absence fails, not skips
else:
    lmdb = pytest.importorskip("lmdb")

ROOT = Path(__file__).resolve().parents[1]
CLI_FILE = ROOT / "src" / "lmdbio" / "cli.py"

TOOLS = {t: shutil.which(t) for t in ("mdb_stat", "mdb_dump", "mdb_load")}
needs_utils = pytest.mark.skipif(
    not all(TOOLS.values()),
    reason="lmdb-utils (mdb_stat, mdb_dump, mdb_load) are not installed")


# ---------------------------------------------------------------------------
# The module under test and its backends.

try:
    from conftest import require_lmdbio, subject_names
except ImportError:  # run outside pytest's rootdir conftest
    def require_lmdbio():
        return bool(os.environ.get("CI") or os.environ.get("LMDBIO_REQUIRE"))

    def subject_names():
        raw = os.environ.get("LMDBIO_TEST_SUBJECTS", "lmdbio,lmdb")
        return [n.strip() for n in raw.split(",") if n.strip()]


def _import_lmdbio():
    try:
        return importlib.import_module("lmdbio"), None
    except Exception as exc:  # the package is being written
        return None, "lmdbio cannot be imported: %s: %s" % (type(exc).__name__, exc)


LMDBIO, LMDBIO_WHY = _import_lmdbio()


def _need_lmdbio():
    """Skip (locally) or fail (CI, LMDBIO_REQUIRE=1) without lmdbio."""
    if LMDBIO is None:
        if require_lmdbio():
            pytest.fail(LMDBIO_WHY)
        pytest.skip(LMDBIO_WHY)
    return LMDBIO


def _load_cli():
    """The installed lmdbio.cli; the source tree's only while lmdbio is not
    required (under ``make test``, LMDBIO_REQUIRE=1, a CLI that does not
    import fails the tests instead)."""
    if LMDBIO is not None or require_lmdbio():
        try:
            return importlib.import_module("lmdbio.cli")
        except Exception:
            if require_lmdbio():
                raise
    spec = importlib.util.spec_from_file_location("lmdbio_cli_under_test", CLI_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cli = _load_cli()


def _free_db_records(datafile):
    """Read the free DB of an LMDB file: (stat dict, [(key, value)])."""
    with open(datafile, "rb") as f:
        data = f.read()
    psize = struct.unpack_from("<I", data, 40)[0]
    metas = [0, psize]
    meta = max(metas, key=lambda off: struct.unpack_from("<Q", data, off + 144)[0])
    _pad, _flags, depth, branch, leaf, overflow, entries, root = struct.unpack_from(
        "<IHHQQQQQ", data, meta + 40)
    stat = {"psize": psize, "depth": depth, "branch_pages": branch,
            "leaf_pages": leaf, "overflow_pages": overflow, "entries": entries}
    records = []

    def walk(pgno, level):
        assert level < 32
        base = pgno * psize
        pflags, lower = struct.unpack_from("<HH", data, base + 10)
        for i in range((lower - 16) // 2):
            off = base + struct.unpack_from("<H", data, base + 16 + 2 * i)[0]
            lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, off)
            if pflags & 0x01:
                walk(lo | hi << 16 | nflags << 32, level + 1)
                continue
            key = data[off + 8:off + 8 + ksize]
            size = lo | hi << 16
            if nflags & 0x01:
                ov = struct.unpack_from("<Q", data, off + 8 + ksize)[0]
                value = data[ov * psize + 16:ov * psize + 16 + size]
            else:
                value = data[off + 8 + ksize:off + 8 + ksize + size]
            records.append((key, value))

    if root != 0xFFFFFFFFFFFFFFFF:
        walk(root, 0)
    return stat, records


class _FreeDB:
    pass


class _ListCursor:
    def __init__(self, records):
        self._records = records

    def iternext(self, keys=True, values=True):
        for k, v in self._records:
            yield (k, v) if keys and values else (k if keys else v)


class _ShimTxn:
    def __init__(self, env, txn):
        self._env = env
        self._txn = txn

    def __getattr__(self, name):
        return getattr(self._txn, name)

    def cursor(self, db=None):
        if isinstance(db, _FreeDB):
            return _ListCursor(self._env._free[1])
        return self._txn.cursor(db=db)

    def stat(self, db):
        if isinstance(db, _FreeDB):
            return dict(self._env._free[0])
        return self._txn.stat(db)


class _ShimEnv:
    """py-lmdb Environment plus the free-DB hook that lmdbio provides."""

    def __init__(self, path, subdir=True, **kw):
        self._env = lmdb.open(path, subdir=subdir, **kw)
        datafile = os.path.join(path, "data.mdb") if subdir else path
        self._free = _free_db_records(datafile)

    def __getattr__(self, name):
        return getattr(self._env, name)

    def begin(self, *a, **kw):
        return _ShimTxn(self, self._env.begin(*a, **kw))

    def open_db(self, key=None, txn=None, **kw):
        if isinstance(txn, _ShimTxn):
            txn = txn._txn
        return self._env.open_db(key, txn=txn, **kw)

    def _free_db(self):
        return _FreeDB()


def _make_pylmdb_backend():
    mod = types.ModuleType("pylmdb_shim")
    for name in dir(lmdb):
        if name.endswith("Error"):
            setattr(mod, name, getattr(lmdb, name))
    mod.open = _ShimEnv
    mod.version = lmdb.version
    return mod


# conftest's subjects: "lmdbio", and "lmdb" = py-lmdb plus the free-DB shim.
BACKENDS = ["pylmdb" if n == "lmdb" else n for n in subject_names()]


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "pylmdb":
        return _make_pylmdb_backend()
    return _need_lmdbio()


# ---------------------------------------------------------------------------
# Databases (written by py-lmdb, closed before any command runs).

def _rand(seed):
    return random.Random(seed)


def _bin(r, lo, hi):
    return bytes(r.getrandbits(8) for _ in range(r.randint(lo, hi)))


def _text(r, lo, hi):
    alphabet = b"abc xyz\\\t\n\x00\x7f\xff~!"
    return bytes(r.choice(alphabet) for _ in range(r.randint(lo, hi)))


def build_empty(path):
    lmdb.open(path, map_size=1 << 20).close()


def build_plain(path):
    r = _rand(1)
    env = lmdb.open(path, map_size=64 << 20)
    with env.begin(write=True) as t:
        for i in range(3000):
            key = _bin(r, 1, 40) if i % 3 else _text(r, 1, 30)
            t.put(key, _bin(r, 0, 300) if i % 2 else _text(r, 0, 100))
        t.put(b"k", b"")
    env.close()


def build_dupsort(path):
    r = _rand(3)
    env = lmdb.open(path, map_size=64 << 20, max_dbs=2)
    d = env.open_db(b"dups", dupsort=True)
    with env.begin(write=True) as t:
        for k in range(60):
            for _ in range(r.choice([1, 2, 5, 50, 400])):
                t.put(b"key%03d" % k, _bin(r, 1, 60), db=d)
    env.close()


def build_overflow(path):
    r = _rand(2)
    env = lmdb.open(path, map_size=64 << 20)
    with env.begin(write=True) as t:
        for i in range(40):
            t.put(b"big%03d" % i, _bin(r, 2000, 120000))
        t.put(b"small", b"x")
    env.close()


def build_dupfixed(path):
    r = _rand(4)
    env = lmdb.open(path, map_size=64 << 20, max_dbs=3)
    d = env.open_db(b"fixed", dupsort=True, dupfixed=True)
    i = env.open_db(b"intdup", dupsort=True, dupfixed=True, integerdup=True)
    with env.begin(write=True) as t:
        for k in range(40):
            for _ in range(r.choice([1, 3, 900])):
                t.put(b"k%02d" % k, _bin(r, 8, 8), db=d)
                t.put(b"k%02d" % k, struct.pack("=I", r.getrandbits(32)), db=i)
    env.close()


def build_integerkey(path):
    r = _rand(5)
    env = lmdb.open(path, map_size=64 << 20, max_dbs=3)
    q = env.open_db(b"int64", integerkey=True)
    w = env.open_db(b"int32", integerkey=True)
    with env.begin(write=True) as t:
        for _ in range(2000):
            t.put(struct.pack("=Q", r.getrandbits(64)), _bin(r, 0, 20), db=q)
            t.put(struct.pack("=I", r.getrandbits(32)), _bin(r, 0, 20), db=w)
    env.close()


def build_named(path):
    r = _rand(6)
    env = lmdb.open(path, map_size=64 << 20, max_dbs=16)
    dbs = {
        b"alpha": {},
        b"beta": {"dupsort": True},
        b"gamma space": {},
        "\u00e9t\u00e9".encode(): {},
        b"rev": {"reverse_key": True},
        b"empty": {},
        b"int": {"integerkey": True},
    }
    handles = {name: env.open_db(name, **kw) for name, kw in dbs.items()}
    with env.begin(write=True) as t:
        for name, h in handles.items():
            if name == b"empty":
                continue
            for i in range(r.choice([1, 50, 700])):
                key = struct.pack("=Q", i) if name == b"int" else _bin(r, 1, 20)
                t.put(key, _bin(r, 1 if name == b"beta" else 0, 80), db=h)
        # main-DB records that are not databases
        t.put(b"plain", b"value")
        t.put(b"fake48", b"\x00" * 48)  # looks like an MDB_db, is not one
        t.put(b"nul\x00name", b"v")     # skipped by -a (contains NUL)
    env.close()


def build_freelist(path):
    r = _rand(7)
    env = lmdb.open(path, map_size=256 << 20)
    keys = [b"rec%06d" % i for i in range(6000)]
    with env.begin(write=True) as t:
        for k in keys:
            t.put(k, _bin(r, 100, 1500))
    for start in (0, 1, 2):
        with env.begin(write=True) as t:
            for k in keys[start::7]:
                t.delete(k)
    with env.begin(write=True) as t:  # a long run of free pages at once
        for k in keys[3000:]:
            t.delete(k)
    env.close()


def build_reverse(path):
    r = _rand(8)
    env = lmdb.open(path, map_size=16 << 20, max_dbs=1)
    d = env.open_db(b"rk", reverse_key=True)
    with env.begin(write=True) as t:
        for _ in range(500):
            t.put(_text(r, 1, 12), _bin(r, 0, 10), db=d)
            t.put(_text(r, 1, 12), _bin(r, 0, 10))
    env.close()


def build_nosubdir(path):
    r = _rand(9)
    env = lmdb.open(path, subdir=False, map_size=16 << 20, max_dbs=2)
    d = env.open_db(b"inner", dupsort=True)
    with env.begin(write=True) as t:
        for i in range(800):
            t.put(b"k%05d" % i, _bin(r, 0, 200))
            t.put(b"k%02d" % (i % 30), _bin(r, 1, 10), db=d)
        for i in range(0, 800, 2):
            t.delete(b"k%05d" % i)
    env.close()


def build_bigmain(path):
    """More main-DB records than the CLI opens handles for blindly: the
    named databases are counted first."""
    r = _rand(10)
    env = lmdb.open(path, map_size=64 << 20, max_dbs=4)
    handles = [env.open_db(n) for n in (b"one", b"two", b"three")]
    with env.begin(write=True) as t:
        for i in range(6000):
            t.put(b"main%05d" % i, _bin(r, 40, 56))
        for h in handles:
            t.put(b"x", b"y", db=h)
    env.close()


def build_readers500(path):
    env = lmdb.open(path, map_size=1 << 30, max_readers=500)
    with env.begin(write=True) as t:
        t.put(b"a", b"b")
    env.close()


def build_nolock(path):
    build_overflow(path)
    os.unlink(os.path.join(path, "lock.mdb"))


def _patch_metas(datafile, patch):
    with open(datafile, "r+b") as f:
        psize = struct.unpack("<I", os.pread(f.fileno(), 4, 40))[0]
        for off in (0, psize):
            patch(f, off)


def build_fixedmap(path):
    """A meta carrying a map address (as MDB_FIXEDMAP writes) and a stale
    map size smaller than the used pages."""
    build_named(path)

    def patch(f, off):
        f.seek(off + 24)
        f.write(struct.pack("<QQ", 0x7F0012340000, 4096))
    _patch_metas(os.path.join(path, "data.mdb"), patch)


def build_reversedup(path):
    """A main DB whose flags carry DUPSORT|REVERSEDUP (py-lmdb cannot write
    REVERSEDUP): one duplicate per key, so the order is unaffected."""
    env = lmdb.open(path, map_size=16 << 20)
    with env.begin(write=True) as t:
        for i in range(100):
            t.put(b"k%03d" % i, b"v%d" % i)
    env.close()

    def patch(f, off):
        f.seek(off + 92)
        f.write(struct.pack("<H", 0x04 | 0x40))
    _patch_metas(os.path.join(path, "data.mdb"), patch)


# name: (builder, nosubdir, named DBs)
DATABASES = {
    "empty": (build_empty, False, []),
    "plain": (build_plain, False, []),
    "overflow": (build_overflow, False, []),
    "dupsort": (build_dupsort, False, [b"dups"]),
    "dupfixed": (build_dupfixed, False, [b"fixed", b"intdup"]),
    "integerkey": (build_integerkey, False, [b"int64", b"int32"]),
    "named": (build_named, False, [b"alpha", b"beta", b"gamma space",
                                   "\u00e9t\u00e9".encode(), b"rev", b"empty", b"int"]),
    "freelist": (build_freelist, False, []),
    "reverse": (build_reverse, False, [b"rk"]),
    "nosubdir": (build_nosubdir, True, [b"inner"]),
    "bigmain": (build_bigmain, False, [b"one", b"two", b"three"]),
    "readers500": (build_readers500, False, []),
    "nolock": (build_nolock, False, []),
    "fixedmap": (build_fixedmap, False, [b"alpha", b"beta"]),
    "reversedup": (build_reversedup, False, []),
}


def _build(root, name):
    builder, nosubdir, _names = DATABASES[name]
    path = os.path.join(root, name + (".mdb" if nosubdir else ""))
    builder(path)
    return path


@pytest.fixture(scope="session")
def dbroot(tmp_path_factory):
    root = tmp_path_factory.mktemp("clidbs")
    return {name: _build(str(root), name) for name in DATABASES}


# ---------------------------------------------------------------------------
# Running both sides.

def run_ours(backend, argv):
    out, err = io.BytesIO(), io.BytesIO()
    rc = cli.main(argv, backend=backend, stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def run_tool(tool, args):
    p = subprocess.run([tool] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout, p.stderr


def compare(backend, cmd, args, check_stderr=True):
    tool = "mdb_" + cmd
    ours = run_ours(backend, [cmd] + args)
    theirs = run_tool(tool, args)
    assert ours[1] == theirs[1], "stdout differs for %s %s" % (tool, args)
    assert ours[0] == theirs[0], "exit status differs for %s %s: %r" % (tool, args, ours[2])
    if check_stderr and theirs[2].startswith(b"mdb_env_open failed"):
        # the one place lmdbio's words differ: an environment that cannot be
        # opened gets one line naming the path, the problem and the fix
        assert ours[2].startswith(b"lmdbio " + cmd.encode() + b": "), ours[2]
        assert ours[2].count(b"\n") == 1 and b"Traceback" not in ours[2]
    elif check_stderr:
        mine = ours[2].replace(b"lmdbio " + cmd.encode(), tool.encode())
        assert mine == theirs[2], "stderr differs for %s %s" % (tool, args)
    return ours


def _name_arg(name):
    return os.fsdecode(name)


def stat_combos(name):
    _b, nosubdir, names = DATABASES[name]
    n = ["-n"] if nosubdir else []
    combos = [[], ["-e"], ["-f"], ["-ff"], ["-fff"], ["-a"], ["-r"], ["-rr"],
              ["-ef"], ["-e", "-ff", "-a"], ["-efffa"], ["-r", "-a"], ["-rr", "-f"],
              ["-e", "-f", "-f"], ["-s", "no such db"], ["-fa", "-e"],
              ["-V"], ["-e", "-V"]]
    for db in names:
        combos += [["-s", _name_arg(db)], ["-es" + _name_arg(db)], ["-fff", "-s", _name_arg(db)],
                   ["-r", "-s", _name_arg(db)]]
    out = [n + c for c in combos]
    out.append(["-e"] + n + ["PATH", "-f"])        # options after the path
    out.append(n + ["--", "PATH"])
    return out


def dump_combos(name):
    _b, nosubdir, names = DATABASES[name]
    n = ["-n"] if nosubdir else []
    combos = [[], ["-p"], ["-a"], ["-l"], ["-ap"], ["-pa"], ["-lp"], ["-s", "no such db"],
              ["-V"], ["-p", "-V"]]
    for db in names:
        combos += [["-s", _name_arg(db)], ["-ps" + _name_arg(db)]]
    return [n + c for c in combos] + [n + ["PATH", "-p"]]


def _with_path(args, path):
    if "PATH" in args:
        return [path if a == "PATH" else a for a in args]
    return args + [path]


STAT_CASES = [(db, c) for db in DATABASES for c in stat_combos(db)]
DUMP_CASES = [(db, c) for db in DATABASES for c in dump_combos(db)]


@needs_utils
@pytest.mark.parametrize("db,args", STAT_CASES, ids=["%s:%s" % (d, " ".join(a)) for d, a in STAT_CASES])
def test_stat_matches_mdb_stat(backend, dbroot, db, args):
    compare(backend, "stat", _with_path(args, dbroot[db]))


@needs_utils
@pytest.mark.parametrize("db,args", DUMP_CASES, ids=["%s:%s" % (d, " ".join(a)) for d, a in DUMP_CASES])
def test_dump_matches_mdb_dump(backend, dbroot, db, args):
    compare(backend, "dump", _with_path(args, dbroot[db]))


@needs_utils
@pytest.mark.parametrize("args", [
    [], ["-x"], ["-s"], ["-a", "-s", "x"], ["-s", "x", "-a"], ["-ex"], ["--foo"],
    ["-e"], ["A", "B"], ["-V", "-x"], ["-x", "-V"], ["--", "-e"],
])
def test_stat_usage_errors(backend, dbroot, args):
    args = [dbroot["named"] if a in ("A", "B") else a for a in args]
    compare(backend, "stat", args)


@needs_utils
@pytest.mark.parametrize("args", [
    [], ["-x"], ["-s"], ["-f"], ["-a", "-s", "x"], ["-l", "-s", "x"], ["-s", "x", "-l"],
    ["A", "B"], ["-V", "-x"], ["-p"],
])
def test_dump_usage_errors(backend, dbroot, args):
    args = [dbroot["plain"] if a in ("A", "B") else a for a in args]
    compare(backend, "dump", args)


def one_line(err, *words):
    """stderr is one line naming each of `words`, with no traceback."""
    text = err.decode(errors="replace")
    assert text.count("\n") == 1 and text.endswith("\n"), text
    assert "Traceback" not in text
    for w in words:
        assert w in text, (w, text)


@needs_utils
@pytest.mark.parametrize("cmd", ["stat", "dump"])
def test_open_errors(backend, dbroot, tmp_path, cmd):
    """Same stdout and exit status as the tools; stderr one line naming the
    path, what is wrong and the fix (where mdb_stat prints only
    "mdb_env_open failed, error 2 No such file or directory")."""
    def check(args, *words):
        rc, out, err = compare(backend, cmd, args, check_stderr=False)
        assert rc == 1
        one_line(err, "lmdbio " + cmd, args[-1], *words)

    check([str(tmp_path / "missing")], "no such file or directory")
    check(["-n", os.path.join(dbroot["named"], "data.mdb", "x")])
    # a file where a directory is expected (the fix: -n)
    check([dbroot["nosubdir"]], "-n")
    # an empty directory: no data.mdb
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    check([str(nothing)], "no data.mdb")
    empty = tmp_path / "emptyfile"
    empty.mkdir()
    (empty / "data.mdb").write_bytes(b"")
    check([str(empty)], "not an LMDB")
    # not an LMDB file
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "data.mdb").write_bytes(b"\x01" * 16384)
    check([str(junk)], "not an LMDB")


@pytest.mark.parametrize("cmd", ["stat", "dump", "verify", "convert"])
def test_every_command_has_help(cmd):
    _need_lmdbio()
    p = subprocess.run([sys.executable, "-m", "lmdbio", cmd, "--help"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(b"usage: lmdbio " + cmd.encode()), p.stdout
    assert p.stderr == b""


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "lmdbio"] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_bad_input_is_one_line(dbroot, tmp_path):
    """Bad input: one line naming the path and the likely fix, a non-zero
    exit, never a traceback (subprocess, as a user runs it)."""
    _need_lmdbio()
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    afile = tmp_path / "afile"
    afile.write_bytes(b"not an lmdb " * 100)
    for cmd in ("stat", "dump", "verify"):
        p = _cli(cmd, str(nothing))  # a missing data.mdb
        assert p.returncode == 1
        one_line(p.stderr, str(nothing), "no data.mdb")
        p = _cli(cmd, str(afile))  # a file given without -n
        assert p.returncode == 1
        one_line(p.stderr, str(afile), "-n")
        p = _cli(cmd, str(tmp_path / "missing"))
        assert p.returncode == 1
        one_line(p.stderr, "missing")
    # a bad npz, a missing npz, a missing list file
    p = _cli("convert", "--npz", str(afile), str(tmp_path / "out"))
    assert p.returncode == 1
    one_line(p.stderr, str(afile), "not a .npz")
    assert b"allow_pickle" not in p.stderr
    p = _cli("convert", "--npz", str(tmp_path / "no.npz"), str(tmp_path / "out"))
    assert p.returncode == 1
    one_line(p.stderr, "no.npz")
    p = _cli("convert", str(tmp_path) + "/", str(tmp_path / "nolist"),
             str(tmp_path / "out"))
    assert p.returncode == 1
    one_line(p.stderr, "nolist")


def test_convert_without_pylmdb_says_what_to_install(tmp_path):
    """py-lmdb is needed only by convert's writer: without it, one line."""
    _need_lmdbio()
    import numpy as np
    npz = tmp_path / "a.npz"
    np.savez(npz, data=np.zeros((2, 1, 2, 2), np.uint8), labels=[0, 1])
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "lmdb.py").write_text("raise ImportError('no py-lmdb here')\n")
    env = dict(os.environ, PYTHONPATH=str(blocker))
    p = _cli("convert", "--npz", str(npz), str(tmp_path / "out"), env=env)
    assert p.returncode == 1
    one_line(p.stderr, "py-lmdb", "pip install")
    # reading needs no py-lmdb: the package imports without it
    p = subprocess.run([sys.executable, "-c", "import lmdbio, lmdbio.datum, "
                        "lmdbio.reader, lmdbio.cli, lmdbio.verify"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.returncode == 0, p.stderr


def test_package_all_lists_the_public_names():
    lm = _need_lmdbio()
    assert "Reader" in lm.__all__ and "DatumReader" in lm.__all__
    assert not [n for n in lm.__all__ if n.startswith("_")]
    for name in lm.__all__:
        assert getattr(lm, name) is not None


@needs_utils
def test_dump_to_file(backend, dbroot, tmp_path):
    for db in ("named", "overflow"):
        for extra in ([], ["-p"], ["-a"], ["-l"]):
            ours_file, their_file = tmp_path / "ours.txt", tmp_path / "theirs.txt"
            ours = run_ours(backend, ["dump", "-f", str(ours_file)] + extra + [dbroot[db]])
            theirs = run_tool("mdb_dump", ["-f", str(their_file)] + extra + [dbroot[db]])
            assert ours[:2] == theirs[:2] == (0, b"")
            assert ours_file.read_bytes() == their_file.read_bytes()
    # -f before -V: the version goes to the file
    ours = run_ours(backend, ["dump", "-f%s" % ours_file, "-V"])
    theirs = run_tool("mdb_dump", ["-f%s" % their_file, "-V"])
    assert ours[:2] == theirs[:2]
    assert ours_file.read_bytes() == their_file.read_bytes() == b"LMDB 0.9.24: (July 24, 2019)\n"
    # an unwritable output
    bad = str(tmp_path / "no" / "dir" / "out")
    compare(backend, "dump", ["-f", bad, dbroot["plain"]])


def _records(path, name=None, nosubdir=False):
    env = lmdb.open(path, subdir=not nosubdir, readonly=True, lock=False,
                    max_dbs=1 if name else 0)
    try:
        db = env.open_db(name, create=False) if name else None
        with env.begin(db=db) as t:
            flags = db.flags(t) if db is not None else None
            return flags, list(t.cursor().iternext())
    finally:
        env.close()


@needs_utils
@pytest.mark.parametrize("db", sorted(DATABASES))
def test_mdb_load_reproduces_data(backend, dbroot, tmp_path, db):
    _b, nosubdir, names = DATABASES[db]
    n = ["-n"] if nosubdir else []
    path = dbroot[db]
    jobs = [(None, [])] + [(name, ["-s", _name_arg(name)]) for name in names]
    for name, sel in jobs:
        rc, out, err = run_ours(backend, ["dump"] + n + sel + [path])
        assert rc == 0, err
        dump = tmp_path / "dump.txt"
        dump.write_bytes(out)
        target = tmp_path / ("load-%s" % len(os.listdir(tmp_path)))
        target.mkdir()
        p = subprocess.run(["mdb_load", "-f", str(dump)] + sel + [str(target)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.returncode == 0, p.stderr
        want = _records(path, name, nosubdir)
        got = _records(str(target), name)
        if name is None and names:
            # the main DB's named-DB records are re-created by mdb_load's
            # own databases only with -a; compare the plain records
            want = (want[0], [r for r in want[1] if r[0] not in names])
            got = (got[0], [r for r in got[1] if r[0] not in names])
        assert got == want
    if names:
        # one -a dump loads every named database
        rc, out, err = run_ours(backend, ["dump", "-a"] + n + [path])
        assert rc == 0, err
        dump = tmp_path / "all.txt"
        dump.write_bytes(out)
        target = tmp_path / "load-all"
        target.mkdir()
        p = subprocess.run(["mdb_load", "-f", str(dump), str(target)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.returncode == 0, p.stderr
        for name in names:
            assert _records(str(target), name) == _records(path, name, nosubdir)


# ---------------------------------------------------------------------------
# The reader table: live and stale readers of another process.

_HOLDER = r"""
import lmdb, os, sys, time
env = lmdb.open(sys.argv[1], readonly=True, max_readers=int(sys.argv[3]))
txn = env.begin()
print("ready", flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), 9)
sys.stdin.read()
"""


def _holder(path, mode, readers=126):
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, path, mode, str(readers)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    if mode == "die":
        p.wait()
    return p


@needs_utils
def test_reader_table_live_and_stale(backend, dbroot, tmp_path):
    path = str(tmp_path / "env")
    shutil.copytree(dbroot["plain"], path)
    os.unlink(os.path.join(path, "lock.mdb"))
    live = _holder(path, "live")
    try:
        _holder(path, "die")            # leaves a stale slot
        second = _holder(path, "live")
        try:
            # A reader that comes and goes leaves a free slot behind, which
            # the next reader reuses: after one, "Number of readers used"
            # (a high-water mark) is the same for every later run, whether
            # it is lmdbio's (which reads in a reader slot while the
            # environment is live) or liblmdb's.
            run_tool("mdb_stat", [path])
            for args in (["-e"], ["-r"], ["-er"], ["-r", "-a"], ["-e", "-f"]):
                compare(backend, "stat", args + [path])
            compare(backend, "dump", [path])
            # -rr reports (and liblmdb clears) the stale slot; run it last
            compare(backend, "stat", ["-rr", path])
            compare(backend, "stat", ["-rr", "-e", path])
        finally:
            second.stdin.close()
            second.wait()
    finally:
        live.stdin.close()
        live.wait()


@needs_utils
def test_reader_table_large_lock_file(backend, tmp_path):
    path = str(tmp_path / "env")
    build_readers500(path)
    live = _holder(path, "live", readers=500)
    try:
        run_tool("mdb_stat", [path])  # see test_reader_table_live_and_stale
        for args in (["-e"], ["-r"], ["-rr", "-e"]):
            compare(backend, "stat", args + [path])
        compare(backend, "dump", [path])
    finally:
        live.stdin.close()
        live.wait()


# ---------------------------------------------------------------------------
# Generated contents.

try:
    from hypothesis import given, settings, strategies as st, HealthCheck
except ImportError:  # pragma: no cover
    given = None

if given is not None:
    @needs_utils
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(records=st.lists(st.tuples(st.binary(min_size=1, max_size=64),
                                      st.binary(max_size=600)), max_size=60),
           dupsort=st.booleans(), deletes=st.integers(0, 30))
    def test_generated_contents(backend, records, dupsort, deletes):
        be = backend
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "env")
            env = lmdb.open(path, map_size=16 << 20, max_dbs=1)
            db = env.open_db(b"db", dupsort=dupsort)
            with env.begin(write=True) as t:
                for k, v in records:
                    t.put(k, v)
                    t.put(k, v or b"-", db=db)
            with env.begin(write=True) as t:
                for k, _v in records[:deletes]:
                    t.delete(k)
            env.close()
            for args in ([], ["-p"], ["-s", "db"], ["-a", "-p"]):
                compare(be, "dump", args + [path])
            for args in (["-efff"], ["-a"]):
                compare(be, "stat", args + [path])


    _STAT_TOKENS = ["-a", "-e", "-f", "-n", "-r", "-s", "-V", "-x", "--", "-", "-ef",
                    "-fff", "-sbeta", "beta", "alpha", "PATH", "PATH", "-rr", "-ae",
                    "-sa", "-Ve", "-es", "-h"]
    _DUMP_TOKENS = ["-a", "-l", "-n", "-p", "-s", "-V", "-x", "--", "-", "-ap", "-lp",
                    "-sbeta", "beta", "PATH", "PATH", "-pl", "-ps", "-pV", "-h", "-al"]

    @needs_utils
    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def test_option_syntax_fuzz(backend, dbroot, data):
        """Random command lines: getopt's permutation, clusters, arguments,
        usage errors and their order against -V, as the tools see them."""
        cmd = data.draw(st.sampled_from(["stat", "dump"]))
        tokens = _STAT_TOKENS if cmd == "stat" else _DUMP_TOKENS
        args = data.draw(st.lists(st.sampled_from(tokens), max_size=6))
        args = [dbroot["named"] if a == "PATH" else a for a in args]
        compare(backend, cmd, args)


# ---------------------------------------------------------------------------
# The command itself.

def test_top_level_help_and_errors():
    rc, out, err = run_ours(_make_pylmdb_backend(), ["--help"])
    assert rc == 0 and b"stat" in out and b"dump" in out
    rc, out, err = run_ours(_make_pylmdb_backend(), [])
    assert rc == 2 and b"stat" in err and out == b""
    rc, out, err = run_ours(_make_pylmdb_backend(), ["frobnicate"])
    assert rc == 2 and b"frobnicate" in err


def test_version(backend):
    rc, out, err = run_ours(backend, ["--version"])
    assert rc == 0 and out.startswith(backend.__name__.encode())


def test_getopt_parsing():
    seen = []
    errs = io.BytesIO()
    ios = cli._IO(io.BytesIO(), errs)
    ops = cli._parse("p", ["-efff", "path", "-sNAME", "-s", "-x", "--", "-e"],
                     "Vaefnrs:", ios, lambda c, a: seen.append((c, a)))
    assert seen == [("e", None), ("f", None), ("f", None), ("f", None),
                    ("s", "NAME"), ("s", "-x")]
    assert ops == ["path", "-e"]


def test_damaged_file_fails_cleanly(dbroot, tmp_path):
    """liblmdb's tools die of SIGBUS on a truncated file (the map runs past
    its end): lmdbio reports the page instead, with status 1."""
    backend = _need_lmdbio()
    path = tmp_path / "env"
    shutil.copytree(dbroot["plain"], str(path))
    data = path / "data.mdb"
    os.truncate(str(data), data.stat().st_size // 3)
    for cmd, args in (("dump", []), ("dump", ["-p"]), ("dump", ["-a"]), ("stat", ["-a"])):
        rc, out, err = run_ours(backend, [cmd] + args + [str(path)])
        assert rc == 1, (cmd, args, err)
        assert b"page" in err and b"Traceback" not in err
    rc, out, err = run_ours(backend, ["stat", "-efff", str(path)])
    assert rc == 0 and out.startswith(b"Environment Info\n")


def test_dev_switch_runs_over_pylmdb(dbroot, monkeypatch):
    monkeypatch.setenv("LMDBIO_CLI_BACKEND", "lmdb")
    out, err = io.BytesIO(), io.BytesIO()
    rc = cli.main(["dump", "-a", dbroot["named"]], stdout=out, stderr=err)
    assert rc == 0 and out.getvalue().count(b"HEADER=END") == 7
    rc = cli.main(["stat", "-f", dbroot["named"]], stdout=out, stderr=err)
    assert rc == 1 and b"_free_db" in err.getvalue()


def _python_m_works():
    p = subprocess.run([sys.executable, "-c", "import lmdbio.cli"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode == 0


@needs_utils
def test_python_m_lmdbio(dbroot):
    _need_lmdbio()
    if not _python_m_works():
        pytest.skip("python -m lmdbio: lmdbio.cli does not import in a fresh interpreter")
    for cmd, args in (("stat", ["-efffa"]), ("dump", ["-a"]), ("dump", ["-p"]),
                      ("stat", ["-s", "beta"])):
        for db in ("named", "freelist"):
            ours = subprocess.run([sys.executable, "-m", "lmdbio", cmd] + args + [dbroot[db]],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            theirs = run_tool("mdb_" + cmd, args + [dbroot[db]])
            assert (ours.returncode, ours.stdout) == theirs[:2]
    # a closed pipe: mdb_dump stops and reports EINTR
    p = subprocess.Popen([sys.executable, "-m", "lmdbio", "dump", dbroot["overflow"]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait() == 1
    assert b"Interrupted system call" in err and b"Traceback" not in err
