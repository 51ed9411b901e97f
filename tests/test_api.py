"""Focused tests of lmdbio's py-lmdb-compatible API (docs/drop-in.md).

Each test writes a small environment with py-lmdb, then opens it with py-lmdb
(read-only, the reference) and with lmdbio side by side on the same path in
one process, and compares what the two return or raise for the same calls:
every cursor method (dup methods on dupsort / dupfixed databases included),
unpositioned states, end-of-database then prev, iterators, getmulti,
buffers=True, named databases, write methods (ReadonlyError), stat / info /
flags, closed objects, copies (read back by py-lmdb and mdb_dump), lock=False
and a live py-lmdb writer beside an lmdbio reader.

The broader hypothesis-driven differential suite is test_differential.py.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess

import lmdb
import pytest

from conftest import import_subject, require_lmdbio
from lmdb_fixtures import run_threads

MDB_DUMP = shutil.which("mdb_dump")


@pytest.fixture(scope="module")
def lmdbio():
    return import_subject("lmdbio")


# ---------------------------------------------------------------------------
# fixtures: one environment written by py-lmdb, opened by both libraries

MAIN_KEYS = [b"k%03d" % i for i in range(0, 600, 2)]        # k000 k002 ...
DUP_KEYS = [b"d%02d" % i for i in range(0, 40, 2)]
FIXED_KEYS = [b"f0", b"f1", b"f2"]
NAMED = [b"dup", b"fixed", b"empty", b"big"]


def _write(path, max_dbs=10):
    env = lmdb.open(path, max_dbs=max_dbs, map_size=64 << 20)
    dup = env.open_db(b"dup", dupsort=True)
    fixed = env.open_db(b"fixed", dupsort=True, dupfixed=True)
    env.open_db(b"empty")
    big = env.open_db(b"big")
    with env.begin(write=True) as t:
        for k in MAIN_KEYS:
            t.put(k, b"value-" + k)
        for i, k in enumerate(DUP_KEYS):
            for j in range(1 + i % 5):              # 1..5 duplicates
                t.put(k, b"v%d" % (j * 2), db=dup)
        # one key with enough duplicates to spill into a sub-database
        for j in range(300):
            t.put(b"d99", b"w%04d" % j, db=dup)
        for n, k in enumerate(FIXED_KEYS):
            for j in range((5, 1500, 40)[n]):       # 1500 dups span pages
                t.put(k, struct.pack(">I", j * 3), db=fixed)
        for i in range(6):
            t.put(b"b%d" % i, bytes([i]) * (3000 + 5000 * i), db=big)
    # a second transaction that frees and reuses pages
    with env.begin(write=True) as t:
        for k in MAIN_KEYS[10:40]:
            t.delete(k)
        t.put(b"k001", b"new")
    env.close()


@pytest.fixture
def path(tmp_path):
    p = str(tmp_path / "env")
    _write(p)
    return p


class Pair:
    """py-lmdb (reference) and lmdbio on the same path."""

    def __init__(self, lmdbio, path, **kw):
        self.path = path
        self.ref = lmdb.open(path, readonly=True, **kw)
        self.sub = lmdbio.open(path, readonly=True, **kw)

    def close(self):
        self.sub.close()
        self.ref.close()


@pytest.fixture
def pair(lmdbio, path):
    p = Pair(lmdbio, path, max_dbs=10)
    yield p
    p.close()


def norm(x):
    if isinstance(x, memoryview):
        return ("mv", x.tobytes())
    if isinstance(x, (list, tuple)):
        return type(x).__name__, [norm(i) for i in x]
    if type(x).__name__ == "_Database":
        return ("db", x.flags())
    return x


def run(fn, *args, **kw):
    """('ok', result) or ('exc', class name, message) for fn(*args)."""
    try:
        return ("ok", norm(fn(*args, **kw)))
    except Exception as e:  # noqa: BLE001 - comparing what is raised
        return ("exc", type(e).__name__, str(e))


def same(f_ref, f_sub, *args, **kw):
    a = run(f_ref, *args, **kw)
    b = run(f_sub, *args, **kw)
    assert b == a
    return a


# ---------------------------------------------------------------------------
# module surface


def test_exception_classes(lmdbio):
    for name in lmdb.__all__:
        obj = getattr(lmdb, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            mine = getattr(lmdbio, name)
            assert issubclass(mine, lmdbio.Error), name
            for base in obj.__mro__:
                if base.__module__ == "lmdb" and base is not obj:
                    assert issubclass(mine, getattr(lmdbio, base.__name__))
    assert issubclass(lmdbio.Error, Exception)


def test_version_and_aliases(lmdbio):
    v = lmdbio.version()
    assert isinstance(v, tuple) and len(v) == 3
    assert all(isinstance(i, int) for i in v)
    assert ".".join(map(str, v)) == lmdbio.__version__
    assert lmdbio.open is lmdbio.Environment


def test_error_attributes(lmdbio, pair):
    with pair.ref.begin() as rt, pair.sub.begin() as st:
        for t in (rt, st):
            with pytest.raises(Exception) as ei:
                t.put(b"a", b"b")
            e = ei.value
            assert (e.what, e.code, e.reason) == (
                "mdb_put", 13, "Permission denied")
            assert str(e) == "mdb_put: Permission denied"
    assert isinstance(ei.value, lmdbio.ReadonlyError)


# ---------------------------------------------------------------------------
# opening


def test_missing_path(lmdbio, tmp_path):
    missing = str(tmp_path / "nope")
    for subdir in (True, False):
        a = run(lmdb.open, missing, readonly=True, subdir=subdir)
        b = run(lmdbio.open, missing, subdir=subdir)
        assert a == b
        assert b[1] == "Error" and missing in b[2]
    assert not os.path.exists(missing)
    empty = tmp_path / "emptydir"
    empty.mkdir()
    a = run(lmdb.open, str(empty), readonly=True)
    b = run(lmdbio.open, str(empty))
    assert a == b and str(empty) in b[2]
    assert os.listdir(empty) == []         # no lock file left behind
    with pytest.raises(lmdbio.Error, match="nope"):
        lmdbio.open(missing, lock=False)


def test_subdir_false_and_wrong_kind(lmdbio, path):
    data = os.path.join(path, "data.mdb")
    # subdir=True on a file, subdir=False on a directory
    same(lambda: lmdb.open(data, readonly=True),
         lambda: lmdbio.open(data))
    same(lambda: lmdb.open(path, readonly=True, subdir=False),
         lambda: lmdbio.open(path, subdir=False))
    env = lmdbio.open(data, subdir=False, lock=False)
    with env.begin() as t:
        assert t.get(b"k000") == b"value-k000"
    assert env.path() == data
    assert env.flags()["subdir"] is False
    env.close()


def test_bad_files(lmdbio, tmp_path, path):
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"x" * 10000)
    with pytest.raises(lmdbio.InvalidError) as ei:
        lmdbio.open(str(garbage), subdir=False, lock=False)
    assert str(garbage) in str(ei.value)
    # a file cut after its meta pages: the trees point past the end
    cut = tmp_path / "cut"
    with open(os.path.join(path, "data.mdb"), "rb") as f:
        cut.write_bytes(f.read(2 * 4096))
    try:
        env = lmdbio.open(str(cut), subdir=False, lock=False)
    except lmdbio.Error as e:     # the core may check the tree at open
        err = e
    else:
        with pytest.raises(lmdbio.Error) as ei:
            with env.begin() as t:
                list(t.cursor())
        err = ei.value
        env.close()
    assert isinstance(err, (lmdbio.PageNotFoundError, lmdbio.CorruptedError))
    assert str(cut) in str(err) and "page" in str(err)


def test_comm_and_engine(lmdbio, path):
    # engine="mpiio" without comm reads through MPI-IO on COMM_WORLD (a
    # single process here); tests/mpi covers it under mpiexec.
    with lmdbio.open(path, engine="mpiio", lock=False) as env:
        with env.begin() as txn:
            assert txn.get(b"k000") == b"value-k000"
    with pytest.raises(TypeError, match="communicator"):
        lmdbio.open(path, comm=object())
    with pytest.raises(ValueError):
        lmdbio.open(path, engine="bogus")
    for engine in ("auto", "posix"):
        with lmdbio.open(path, engine=engine, lock=False) as env:
            assert env.stat()["entries"] > 0


def test_readonly_false_accepted(lmdbio, path):
    env = lmdbio.open(path, readonly=False, max_dbs=10)
    with env.begin() as t:
        assert t.get(b"k000") == b"value-k000"
        with pytest.raises(lmdbio.ReadonlyError):
            t.put(b"x", b"y")
    with pytest.raises(lmdbio.ReadonlyError):
        env.begin(write=True)
    with pytest.raises(lmdbio.ReadonlyError):
        env.open_db(b"brand-new")
    env.close()


def test_never_writes_data_file(lmdbio, path):
    data = os.path.join(path, "data.mdb")
    before = open(data, "rb").read()
    st = os.stat(data)
    env = lmdbio.open(path, readonly=False, max_dbs=10)
    with env.begin() as t:
        list(t.cursor())
    env.close()
    assert open(data, "rb").read() == before
    assert os.stat(data).st_mtime_ns == st.st_mtime_ns


# ---------------------------------------------------------------------------
# environment methods


def test_env_info_stat_flags(pair):
    r, s = pair.ref, pair.sub
    assert s.stat() == r.stat()
    ri, si = r.info(), s.info()
    for k in ("map_size", "last_pgno", "last_txnid", "max_readers"):
        assert si[k] == ri[k], k
    assert si["map_addr"] == 0
    assert s.flags() == r.flags()
    assert s.path() == r.path()
    assert s.max_key_size() == r.max_key_size() == 511
    assert s.max_readers() == r.max_readers()
    same(r.sync, s.sync)
    assert s.reader_check() == 0
    assert sorted(s.dbs()) == sorted(r.dbs())


def test_info_map_size(lmdbio, path):
    for ms in (12345, 0, 1 << 30):
        r = lmdb.open(path, readonly=True, map_size=ms or 10485760)
        s = lmdbio.open(path, map_size=ms or 10485760)
        assert s.info()["map_size"] == r.info()["map_size"]
        r.close()
        s.close()
    s = lmdbio.open(path, map_size=0, lock=False)
    assert s.info()["map_size"] == s._meta()["mapsize"]
    s.close()


def test_env_flags_lock_false(lmdbio, path):
    r = lmdb.open(path, readonly=True, lock=False, readahead=False)
    s = lmdbio.open(path, lock=False, readahead=False)
    assert s.flags() == r.flags()
    assert s.readers() == r.readers() == "(no reader locks)\n"
    assert s.info()["num_readers"] == 0
    r.close()
    s.close()


def test_closed_objects(lmdbio, path):
    r = lmdb.open(path, readonly=True)
    s = lmdbio.open(path)
    rt, st = r.begin(), s.begin()
    rc, sc = rt.cursor(), st.cursor()
    rc.first()
    sc.first()
    rt.abort()
    st.abort()
    same(rt.abort, st.abort)                       # no effect
    same(rt.commit, st.commit)
    same(rt.get, st.get, b"k000")
    same(rt.cursor, st.cursor)
    same(rt.id, st.id)
    same(rc.next, sc.next)
    same(rc.key, sc.key)
    same(rc.close, sc.close)
    rt, st = r.begin(), s.begin()
    rc, sc = rt.cursor(), st.cursor()
    rc.close()
    sc.close()
    same(rc.first, sc.first)
    same(lambda: iter(rc), lambda: iter(sc))
    # an iterator outliving its cursor
    rc, sc = rt.cursor(), st.cursor()
    ri, si = iter(rc), iter(sc)
    assert norm(next(si)) == norm(next(ri))
    rt.abort()
    st.abort()
    assert run(next, si) == run(next, ri)
    r.close()
    s.close()
    same(r.stat, s.stat)
    same(r.begin, s.begin)
    same(r.close, s.close)
    same(r.path, s.path)


def test_context_managers(pair):
    r, s = pair.ref, pair.sub
    for env in (r, s):
        with env.begin() as t:
            assert t.get(b"k000") == b"value-k000"
        with pytest.raises(Exception, match="closed"):
            t.get(b"k000")
        try:
            with env.begin() as t:
                raise KeyError
        except KeyError:
            pass
        with pytest.raises(Exception, match="closed"):
            t.get(b"k000")
        with env.begin() as t:
            with t.cursor() as c:
                assert c.first()
            with pytest.raises(Exception, match="closed"):
                c.key()


def test_env_context_manager(lmdbio, path):
    with lmdbio.open(path) as env:
        t = env.begin()
        c = t.cursor()
    with pytest.raises(lmdbio.Error, match="closed"):
        env.stat()
    with pytest.raises(lmdbio.Error, match="closed"):
        t.get(b"k000")
    with pytest.raises(lmdbio.Error, match="closed"):
        c.first()


def test_set_mapsize_invalidates(pair):
    rt, st = pair.ref.begin(), pair.sub.begin()
    pair.ref.set_mapsize(1 << 26)
    pair.sub.set_mapsize(1 << 26)
    same(rt.get, st.get, b"k000")
    assert pair.sub.info()["map_size"] == pair.ref.info()["map_size"]


# ---------------------------------------------------------------------------
# named databases


def test_open_db(lmdbio, pair):
    r, s = pair.ref, pair.sub
    for name in NAMED:
        assert s.open_db(name).flags() == r.open_db(name).flags()
    assert s.open_db(b"dup") is s.open_db(b"dup")
    assert s.open_db(b"dup\x00junk").flags()["dupsort"]   # C-string name
    assert s.open_db(bytearray(b"fixed")).flags()["dupfixed"]
    same(r.open_db, s.open_db, b"missing")                 # ReadonlyError
    same(r.open_db, s.open_db, b"missing", create=False)   # NotFoundError
    same(r.open_db, s.open_db, b"k000")                    # IncompatibleError
    same(r.open_db, s.open_db, b"")                        # BadValsizeError
    same(r.open_db, s.open_db, "dup")                      # TypeError
    same(r.open_db, s.open_db, 5)
    same(r.open_db, s.open_db, None, dupsort=True)         # ValueError
    assert s.open_db(None).flags() == r.open_db(None).flags()
    with pytest.raises(lmdbio.ReadonlyError):
        s.open_db(b"missing")
    with pytest.raises(lmdbio.NotFoundError):
        s.open_db(b"missing", create=False)


def test_open_db_max_dbs(lmdbio, path):
    for max_dbs in (0, 2):
        r = lmdb.open(path, readonly=True, max_dbs=max_dbs)
        s = lmdbio.open(path, max_dbs=max_dbs)
        for name in (b"dup", b"dup", b"fixed", b"empty", b"missing"):
            same(r.open_db, s.open_db, name)
        same(r.open_db, s.open_db, None)
        r.close()
        s.close()


def test_open_db_with_txn(pair):
    with pair.ref.begin() as rt, pair.sub.begin() as st:
        rd = pair.ref.open_db(b"dup", txn=rt)
        sd = pair.sub.open_db(b"dup", txn=st)
        assert sd.flags() == rd.flags()
        assert st.get(b"d02", db=sd) == rt.get(b"d02", db=rd)
        assert st.stat(sd) == rt.stat(rd)


def test_txn_default_db(pair):
    rd, sd = pair.ref.open_db(b"dup"), pair.sub.open_db(b"dup")
    rt = pair.ref.begin(db=rd)
    st = pair.sub.begin(db=sd)
    same(rt.get, st.get, b"d04")
    same(rt.stat, st.stat)
    assert norm(list(st.cursor())) == norm(list(rt.cursor()))
    same(lambda: rt.get(b"k000", db=pair.ref.open_db(None)),
         lambda: st.get(b"k000", db=pair.sub.open_db(None)))
    rt.abort()
    st.abort()
    # constructors called directly
    lmdbio_mod = type(pair.sub)
    t = pair.sub.begin()
    assert type(t)(pair.sub, db=sd).get(b"d04") == b"v0"
    c = type(t.cursor())(sd, t)
    assert c.first() and c.key() == b"d00"
    same(lambda: lmdb.Cursor(rd), lambda: type(c)(sd))
    t.abort()
    assert lmdbio_mod is type(pair.sub)


# ---------------------------------------------------------------------------
# transactions


def test_dbi_visibility(pair):
    """liblmdb's DBI table: a handle opened after a transaction began is
    unknown to it (EINVAL) unless opened with txn=; one opened with txn= is
    known to later transactions only once that transaction commits."""
    r, s = pair.ref, pair.sub
    rd, sd = r.open_db(b"dup"), s.open_db(b"dup")
    rt, st = r.begin(), s.begin()
    rf, sf = r.open_db(b"fixed"), s.open_db(b"fixed")
    for f in (lambda t, d: t.get(b"f0", db=d), lambda t, d: t.cursor(d),
              lambda t, d: t.stat(d), lambda t, d: t.put(b"a", b"b", db=d),
              lambda t, d: t.delete(b"a", db=d), lambda t, d: t.drop(d),
              lambda t, d: t.pop(b"a", db=d),
              lambda t, d: t.replace(b"a", b"b", db=d)):
        same(lambda: f(rt, rf), lambda: f(st, sf))
    same(lambda: rt.get(b"d00", db=rd), lambda: st.get(b"d00", db=sd))
    same(lambda: r.begin(db=rf).get(b"f0"), lambda: s.begin(db=sf).get(b"f0"))
    # reopening with txn= makes it known there
    same(lambda: r.open_db(b"fixed", txn=rt).flags(),
         lambda: s.open_db(b"fixed", txn=st).flags())
    same(lambda: rt.get(b"f0", db=rf), lambda: st.get(b"f0", db=sf))
    # opened inside a live transaction: unknown elsewhere until it commits
    rt2, st2 = r.begin(), s.begin()
    rb, sb = r.open_db(b"big", txn=rt2), s.open_db(b"big", txn=st2)
    same(lambda: rt2.get(b"b0", db=rb)[:3], lambda: st2.get(b"b0", db=sb)[:3])
    same(lambda: rt.get(b"b0", db=rb), lambda: st.get(b"b0", db=sb))
    rt3, st3 = r.begin(), s.begin()
    same(lambda: rt3.get(b"b0", db=rb), lambda: st3.get(b"b0", db=sb))
    rt2.commit()
    st2.commit()
    rt4, st4 = r.begin(), s.begin()
    same(lambda: rt4.get(b"b0", db=rb)[:3], lambda: st4.get(b"b0", db=sb)[:3])
    # open_db() without txn= exports it to transactions begun afterwards
    assert s.open_db(b"big") is sb
    r.open_db(b"big")
    rt5, st5 = r.begin(), s.begin()
    same(lambda: rt5.get(b"b0", db=rb)[:3], lambda: st5.get(b"b0", db=sb)[:3])
    same(lambda: rt4.get(b"b0", db=rb)[:3], lambda: st4.get(b"b0", db=sb)[:3])
    for t in (rt, st, rt3, st3, rt4, st4, rt5, st5):
        t.abort()


def test_txn_basics(pair):
    r, s = pair.ref, pair.sub
    for name in NAMED:
        r.open_db(name)
        s.open_db(name)
    rt, st = r.begin(), s.begin()
    assert st.id() == rt.id()
    for name in [None] + NAMED:
        rd, sd = r.open_db(name), s.open_db(name)
        assert st.stat(sd) == rt.stat(rd), name
    assert st.stat() == rt.stat()
    for key in (b"k000", b"k001", b"k020", b"zzz", b"", b"x" * 600,
                bytearray(b"k002"), memoryview(b"k004")):
        same(rt.get, st.get, key)
    same(rt.get, st.get, b"zzz", 5)
    same(rt.get, st.get, b"zzz", default=7)
    same(rt.get, st.get, "k000")
    same(rt.get, st.get, None)
    assert st.get(b"d04", db=s.open_db(b"dup")) == rt.get(
        b"d04", db=r.open_db(b"dup"))
    assert st.get(b"b5", db=s.open_db(b"big")) == rt.get(
        b"b5", db=r.open_db(b"big"))
    same(lambda: rt.get(b"k000", db=3), lambda: st.get(b"k000", db=3))
    same(lambda: r.begin(parent=rt), lambda: s.begin(parent=st))
    same(lambda: r.begin(write=True), lambda: s.begin(write=True))
    rt.abort()
    st.abort()


def test_write_methods_raise(pair):
    r, s = pair.ref, pair.sub
    rd, sd = r.open_db(b"dup"), s.open_db(b"dup")
    rt, st = r.begin(), s.begin()
    calls = [
        ("put", (b"a", b"b"), {}),
        ("put", (b"", b"b"), {}),
        ("put", ("a", b"b"), {}),
        ("put", (b"a", b"b"), {"db": None}),
        ("delete", (b"k000",), {}),
        ("delete", (b"zzz",), {}),
        ("delete", (b"k000", None), {}),
        ("pop", (b"k000",), {}),
        ("pop", (b"zzz",), {}),
        ("replace", (b"k000", b"x"), {}),
        ("replace", (b"zzz", b"x"), {}),
    ]
    for name, args, kw in calls:
        same(getattr(rt, name), getattr(st, name), *args, **kw)
    for name, args in (("pop", (b"d04",)), ("pop", (b"zzz",)),
                       ("replace", (b"d04", b"x")),
                       ("replace", (b"zzz", b"x")),
                       ("put", (b"d04", b"x")), ("delete", (b"d04",))):
        same(lambda: getattr(rt, name)(*args, db=rd),
             lambda: getattr(st, name)(*args, db=sd))
    # cursors
    for (rdb, sdb) in ((None, None), (rd, sd)):
        rc, sc = rt.cursor(rdb), st.cursor(sdb)
        same(rc.delete, sc.delete)                 # unpositioned: False
        same(rc.first, sc.first)
        for name, args in (("put", (b"a", b"b")), ("delete", ()),
                           ("delete", (True,)), ("replace", (b"d04", b"x")),
                           ("replace", (b"zzz", b"x")), ("pop", (b"d04",)),
                           ("pop", (b"zzz",)), ("putmulti", ([],)),
                           ("putmulti", ([(b"a", b"b")],)),
                           ("putmulti", ([1],))):
            same(getattr(rc, name), getattr(sc, name), *args)
    # drop: closes this transaction's cursors on the db first
    rc, sc = rt.cursor(rd), st.cursor(sd)
    rm, sm = rt.cursor(), st.cursor()
    for c in (rc, sc, rm, sm):
        c.first()
    same(lambda: rt.drop(rd, delete=False), lambda: st.drop(sd, delete=False))
    same(rc.item, sc.item)
    same(lambda: rt.drop(rd), lambda: st.drop(sd))
    same(rc.item, sc.item)
    same(rm.item, sm.item)
    rt.abort()
    st.abort()


# ---------------------------------------------------------------------------
# cursors


def _dbs(pair):
    return [(name, pair.ref.open_db(name), pair.sub.open_db(name))
            for name in [None, b"dup", b"fixed", b"empty", b"big"]]


CURSOR_STEPS = ["first", "last", "next", "prev", "first_dup", "last_dup",
                "next_dup", "prev_dup", "next_nodup", "prev_nodup", "count",
                "key", "value", "item"]


def _keypool(name):
    if name is None:
        ks = MAIN_KEYS[:3] + MAIN_KEYS[20:23] + MAIN_KEYS[-3:] + [
            b"k001", b"k0011", b"k5", b"a", b"zzz"]
    elif name == b"dup":
        ks = DUP_KEYS[:3] + DUP_KEYS[-2:] + [b"d99", b"d05", b"d9", b"e"]
    elif name == b"fixed":
        ks = FIXED_KEYS + [b"f", b"f00", b"g"]
    elif name == b"big":
        ks = [b"b0", b"b3", b"b5", b"b", b"c"]
    else:
        ks = [b"a"]
    return ks + [b"", b"x" * 600]


def _valpool(name):
    if name == b"dup":
        return [b"v0", b"v2", b"v8", b"v1", b"v9", b"w0150", b"w9999", b"",
                b"a"]
    if name == b"fixed":
        return [struct.pack(">I", j) for j in (0, 3, 4, 2997, 4497, 9999)] + [
            b"\x00\x00\x00"]
    return [b"value-k000", b"x", b""]


def _walk(rc, sc, name, rng, steps):
    keys, vals = _keypool(name), _valpool(name)
    for i in range(steps):
        op = rng.choice(CURSOR_STEPS + ["set_key", "set_range", "set_key_dup",
                                        "set_range_dup", "get"])
        if op in ("set_key", "set_range", "get"):
            args = (rng.choice(keys),)
        elif op in ("set_key_dup", "set_range_dup"):
            args = (rng.choice(keys), rng.choice(vals))
        else:
            args = ()
        a = run(getattr(rc, op), *args)
        b = run(getattr(sc, op), *args)
        assert b == a, (name, i, op, args)
        assert run(sc.item) == run(rc.item), (name, i, op, args)


def test_cursor_scripted(pair):
    """End of database then prev, unpositioned states, seeks."""
    for name, rd, sd in _dbs(pair):
        with pair.ref.begin() as rt, pair.sub.begin() as st:
            rc, sc = rt.cursor(rd), st.cursor(sd)
            script = [
                ("key", ()), ("value", ()), ("item", ()), ("count", ()),
                ("next", ()), ("item", ()), ("prev", ()), ("item", ()),
                ("last", ()), ("next", ()), ("item", ()), ("count", ()),
                ("prev", ()), ("item", ()), ("next", ()), ("next", ()),
                ("prev", ()), ("first", ()), ("prev", ()), ("next", ()),
                ("item", ()), ("first_dup", ()), ("last_dup", ()),
                ("set_key", (b"",)), ("item", ()), ("set_range", (b"",)),
                ("item", ()), ("set_key", (b"x" * 600,)),
                ("set_range", (b"zzzz",)), ("prev", ()), ("item", ()),
                ("set_range", (b"zzzz",)), ("next", ()), ("item", ()),
                ("next_dup", ()), ("prev_nodup", ()), ("item", ()),
                ("get", (b"nope",)), ("get", (b"nope", 5)), ("get", (None,)),
                ("set_key", (None,)), ("set_key", ("str",)),
                ("set_range", (None,)), ("set_key_dup", (b"a", None)),
            ]
            for i, (op, args) in enumerate(script):
                a = run(getattr(rc, op), *args)
                b = run(getattr(sc, op), *args)
                assert b == a, (name, i, op, args)


@pytest.mark.parametrize("seed", range(4))
def test_cursor_random_walk(pair, seed):
    rng = random.Random(seed)
    for name, rd, sd in _dbs(pair):
        with pair.ref.begin() as rt, pair.sub.begin() as st:
            _walk(rt.cursor(rd), st.cursor(sd), name, rng, 400)


def test_full_scans(pair):
    for name, rd, sd in _dbs(pair):
        with pair.ref.begin() as rt, pair.sub.begin() as st:
            assert list(st.cursor(sd)) == list(rt.cursor(rd)), name
            assert (list(st.cursor(sd).iterprev())
                    == list(rt.cursor(rd).iterprev())), name


ITERS = ["iternext", "iternext_dup", "iternext_nodup", "iterprev",
         "iterprev_dup", "iterprev_nodup"]


def test_iterators(pair):
    kv_args = [(), (True,), (False,), (True, True), (True, False),
               (False, True), ({"keys": False},), ({"values": False},),
               ({"keys": True, "values": True},)]
    for name, rd, sd in _dbs(pair):
        starts = [None, "first", "last", ("set_key", _keypool(name)[1]),
                  ("set_key", b"d99"), ("set_range", b"k5"), "miss"]
        for it in ITERS:
            for args in kv_args:
                kw = args[0] if args and isinstance(args[0], dict) else {}
                pos = () if kw else args
                for start in starts:
                    with pair.ref.begin() as rt, pair.sub.begin() as st:
                        out = []
                        for c in (rt.cursor(rd), st.cursor(sd)):
                            if start == "miss":
                                c.set_key(b"nope")
                            elif isinstance(start, tuple):
                                run(getattr(c, start[0]), start[1])
                            elif start:
                                getattr(c, start)()
                            res = run(lambda: list(
                                getattr(c, it)(*pos, **kw)))
                            out.append((res, run(c.item)))
                        assert out[1] == out[0], (name, it, args, start)


def test_iterator_protocol(pair):
    with pair.ref.begin() as rt, pair.sub.begin() as st:
        for c in (rt.cursor(), st.cursor()):
            it = iter(c)
            assert iter(it) is it
            assert next(it) == (b"big", rt.get(b"big"))
            c.last()                       # moving the cursor moves the iter
            assert next(it, "END") == "END"
            c.first()
            it = iter(c)
            next(it)
            c.set_key(b"nope")             # unpositioned: iteration stops
            assert next(it, "END") == "END"
        rc, sc = rt.cursor(), st.cursor()
        for k, rev in ((b"k100", False), (b"k100", True), (b"zz", True),
                       (b"", False), (b"zz", False)):
            assert (list(sc._iter_from(k, rev))
                    == list(rc._iter_from(k, rev))), (k, rev)


def test_count(pair):
    for name, rd, sd in _dbs(pair):
        with pair.ref.begin() as rt, pair.sub.begin() as st:
            rc, sc = rt.cursor(rd), st.cursor(sd)
            same(rc.count, sc.count)
            while True:
                assert run(sc.count) == run(rc.count), name
                if not (rc.next_nodup() | sc.next_nodup()):
                    break
            same(rc.count, sc.count)


def test_getmulti(pair):
    for name, rd, sd in _dbs(pair):
        keys = _keypool(name)
        keys = [k for k in keys if k] + [keys[0]]
        with pair.ref.begin() as rt, pair.sub.begin() as st:
            rc, sc = rt.cursor(rd), st.cursor(sd)
            for kw in ({}, {"dupdata": True}, {"values": False},
                       {"dupdata": True, "dupfixed_bytes": 4},
                       {"dupdata": True, "dupfixed_bytes": 2},
                       {"dupdata": True, "dupfixed_bytes": 4,
                        "keyfixed": True},
                       {"dupfixed_bytes": 4},
                       {"keyfixed": True, "dupdata": True},
                       {"dupdata": True, "values": False},
                       {"dupdata": True, "dupfixed_bytes": -1}):
                a = run(rc.getmulti, keys, **kw)
                b = run(sc.getmulti, keys, **kw)
                assert b == a, (name, kw)
                same(rc.item, sc.item)
            same(rc.getmulti, sc.getmulti, ["str"])
            same(lambda: rc.getmulti(iter([keys[0], keys[1]])),
                 lambda: sc.getmulti(iter([keys[0], keys[1]])))
            same(rc.getmulti, sc.getmulti, [b"", keys[0]])
    # keyfixed with keys of different sizes
    with pair.ref.begin() as rt, pair.sub.begin() as st:
        rd, sd = pair.ref.open_db(b"fixed"), pair.sub.open_db(b"fixed")
        same(rt.cursor(rd).getmulti, st.cursor(sd).getmulti,
             [b"f0", b"f0", b"f1"], dupdata=True, dupfixed_bytes=4,
             keyfixed=True)


def test_buffers(pair):
    for name, rd, sd in _dbs(pair):
        with pair.ref.begin(buffers=True) as rt, \
                pair.sub.begin(buffers=True) as st:
            rc, sc = rt.cursor(rd), st.cursor(sd)
            assert norm(list(sc)) == norm(list(rc))
            for c in (rc, sc):
                c.first()
            for f in ("key", "value", "item"):
                a, b = getattr(rc, f)(), getattr(sc, f)()
                assert norm(b) == norm(a)
            if name is None:
                v = st.get(b"k000")
                assert isinstance(v, memoryview) and v.readonly
                assert norm(v) == norm(rt.get(b"k000"))
                assert isinstance(sc.key(), memoryview)
                assert st.get(b"nope") is None
            keys = [k for k in _keypool(name) if k]
            assert (norm(sc.getmulti(keys, dupdata=True))
                    == norm(rc.getmulti(keys, dupdata=True)))
            assert (norm(list(sc.iternext(keys=False)))
                    == norm(list(rc.iternext(keys=False))))
            if name == b"fixed":
                for kw in ({"dupfixed_bytes": 4},
                           {"dupfixed_bytes": 4, "keyfixed": True}):
                    assert (norm(sc.getmulti(keys, dupdata=True, **kw))
                            == norm(rc.getmulti(keys, dupdata=True, **kw)))


def test_threads(lmdbio, pair):
    """Cursors of one environment used from several threads at once (the
    GIL is released around core calls; the page cache is shared)."""
    names = [None, b"dup", b"fixed", b"big"]
    dbs = [pair.sub.open_db(n) for n in names]
    rdbs = [pair.ref.open_db(n) for n in names]
    with pair.ref.begin() as rt:
        want = [list(rt.cursor(d)) for d in rdbs]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                with pair.sub.begin() as t:
                    got = list(t.cursor(dbs[i % len(dbs)]))
                    assert got == want[i % len(dbs)]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    run_threads(work, 8)
    assert not errors, errors


# ---------------------------------------------------------------------------
# copies


def _dump(path):
    out = subprocess.run([MDB_DUMP, "-a", path], check=True,
                         capture_output=True).stdout
    # the header's mapsize line describes the opener, not the data
    return [l for l in out.split(b"\n") if not l.startswith(b"mapsize=")]


def _all_records(env, names):
    out = {}
    dbs = [env.open_db(name) for name in names]
    with env.begin() as t:
        for name, db in zip(names, dbs):
            out[name] = list(t.cursor(db))
    return out


@pytest.mark.parametrize("how", ["copy", "copyfd", "copy-lockfree"])
def test_copy(lmdbio, pair, tmp_path, how):
    dest = tmp_path / "copy"
    dest.mkdir()
    env = pair.sub
    if how == "copy-lockfree":
        env = lmdbio.open(pair.path, lock=False, max_dbs=10)
    if how == "copyfd":
        with open(dest / "data.mdb", "wb") as f:
            env.copyfd(f.fileno())
    else:
        env.copy(str(dest))
    assert os.listdir(dest) == ["data.mdb"]
    names = [None] + NAMED
    ref = lmdb.open(str(dest), readonly=True, max_dbs=10)
    try:
        assert _all_records(ref, names) == _all_records(pair.ref, names)
        assert ref.stat() == pair.ref.stat()
        assert ref.info()["last_txnid"] == pair.ref.info()["last_txnid"]
        assert ref.info()["last_pgno"] == pair.ref.info()["last_pgno"]
    finally:
        ref.close()
    if MDB_DUMP:
        assert _dump(str(dest)) == _dump(pair.path)
    # both meta pages describe the snapshot
    with open(dest / "data.mdb", "rb") as f:
        raw = f.read(2 * 4096)
    m0, m1 = raw[16:152], raw[4096 + 16:4096 + 152]
    assert m0 == m1
    assert struct.unpack_from("<Q", raw, 4096)[0] == 1     # page number
    if how == "copy-lockfree":
        env.close()


def test_copy_errors(lmdbio, pair, tmp_path):
    r, s = pair.ref, pair.sub
    missing = str(tmp_path / "missing")
    same(r.copy, s.copy, missing)
    d = tmp_path / "full"
    d.mkdir()
    (d / "data.mdb").write_bytes(b"x")
    same(r.copy, s.copy, str(d))
    assert (d / "data.mdb").read_bytes() == b"x"
    with pytest.raises(TypeError):
        s.copy(str(tmp_path), txn=s.begin())


def test_copy_compact(lmdbio, pair, tmp_path):
    dest = tmp_path / "compact"
    dest.mkdir()
    pair.sub.copy(str(dest), compact=True)
    names = [None] + NAMED
    ref = lmdb.open(str(dest), readonly=True, max_dbs=10)
    try:
        got, want = _all_records(ref, names), _all_records(pair.ref, names)
        # named-DB records in the main DB: same but for the root page
        for recs in (got[None], want[None]):
            recs[:] = [(k, v[:40]) if k in NAMED else (k, v)
                       for k, v in recs]
        assert got == want
        assert ref.info()["last_pgno"] < pair.ref.info()["last_pgno"]
        assert ref.info()["last_txnid"] == 1
        with ref.begin() as t:
            assert t.stat(ref.open_db(b"fixed")) == pair.ref.begin().stat(
                pair.ref.open_db(b"fixed"))
    finally:
        ref.close()
    # the compacted copy of the copy is the same file
    dest2 = tmp_path / "compact2"
    dest2.mkdir()
    with lmdbio.open(str(dest), lock=False) as env:
        env.copy(str(dest2), compact=True)
    assert (dest2 / "data.mdb").read_bytes() == (dest / "data.mdb").read_bytes()
    # and mdb_copy -c writes the same bytes (lmdb-utils: make test needs it)
    mdb_copy = shutil.which("mdb_copy")
    if mdb_copy is None and require_lmdbio():
        pytest.fail("mdb_copy not found: apt-get install lmdb-utils")
    if mdb_copy:
        dest3 = tmp_path / "compact3"
        dest3.mkdir()
        subprocess.run([mdb_copy, "-c", pair.path, str(dest3)], check=True)
        a = (dest3 / "data.mdb").read_bytes()
        b = (dest / "data.mdb").read_bytes()
        assert len(a) == len(b)
        assert a[2 * 4096:] == b[2 * 4096:]
        for m in (0, 4096):         # metas: all but mm_mapsize (the opener's)
            assert a[m:m + 32] == b[m:m + 32]
            assert a[m + 40:m + 4096] == b[m + 40:m + 4096]
    if MDB_DUMP:
        assert _dump(str(dest)) == _dump(pair.path)


# ---------------------------------------------------------------------------
# locks


def test_lock_false_touches_no_lock_file(lmdbio, tmp_path, path):
    d = tmp_path / "nolock"
    d.mkdir()
    shutil.copy(os.path.join(path, "data.mdb"), d / "data.mdb")
    ref = lmdb.open(path, readonly=True)
    with ref.begin() as t:
        expect = list(t.cursor())
    ref.close()
    os.chmod(d, 0o555)          # a read-only directory: nothing can appear
    try:
        env = lmdbio.open(str(d), lock=False, max_dbs=10)
        empty = env.open_db(b"empty")
        with env.begin() as t:
            assert list(t.cursor()) == expect
            assert list(t.cursor(empty)) == []
        assert env.readers() == "(no reader locks)\n"
        env.close()
    finally:
        os.chmod(d, 0o755)
    assert os.listdir(d) == ["data.mdb"]
    f = tmp_path / "single.mdb"
    shutil.copy(os.path.join(path, "data.mdb"), f)
    with lmdbio.open(str(f), subdir=False, lock=False) as env:
        assert env.stat()["entries"] == len(expect)
    assert "single.mdb-lock" not in os.listdir(tmp_path)


def test_lock_with_live_writer(lmdbio, tmp_path):
    """A py-lmdb writer and an lmdbio reader on one path in one process: the
    reader's snapshot stays intact while the writer commits and reuses
    pages, and new transactions see the new data."""
    p = str(tmp_path / "live")
    w = lmdb.open(p, map_size=64 << 20)
    with w.begin(write=True) as t:
        for i in range(2000):
            t.put(b"%06d" % i, b"a" * 100)
    s = lmdbio.open(p)
    old = s.begin()
    old_first = list(old.cursor())[:5]
    for rnd in range(6):
        with w.begin(write=True) as t:
            for i in range(2000):
                t.put(b"%06d" % i, bytes([98 + rnd]) * 100)
    assert [v for _, v in old.cursor()] == [b"a" * 100] * 2000
    assert list(old.cursor())[:5] == old_first
    rd = s.readers()
    assert str(os.getpid()) in rd
    assert s.info()["num_readers"] >= 1
    old.abort()
    with s.begin() as t:
        assert t.id() == w.info()["last_txnid"]
        assert t.get(b"000000") == bytes([98 + 5]) * 100
    with w.begin() as wt, s.begin() as st:
        assert st.id() == wt.id()
        assert list(st.cursor()) == list(wt.cursor())
    s.close()
    w.close()


def test_two_lmdbio_envs_and_pylmdb(lmdbio, path):
    a = lmdbio.open(path)
    b = lmdbio.open(path)
    r = lmdb.open(path, readonly=True)
    with a.begin() as ta, b.begin() as tb, r.begin() as tr:
        assert list(ta.cursor()) == list(tb.cursor()) == list(tr.cursor())
    a.close()
    with b.begin() as tb, r.begin() as tr:
        assert list(tb.cursor()) == list(tr.cursor())
    b.close()
    r.close()


# ---------------------------------------------------------------------------
# internal hooks for the CLI


def test_free_db_and_meta(pair):
    s, r = pair.sub, pair.ref
    meta = s._meta()
    info = r.info()
    assert meta["psize"] == 4096
    assert meta["last_pg"] == info["last_pgno"]
    assert meta["txnid"] == info["last_txnid"]
    assert meta["mapsize"] > 0
    assert isinstance(meta["env_flags"], int)
    free = s._free_db()
    with s.begin() as t:
        st = t.stat(free)
        recs = list(t.cursor(db=free))
    assert st["entries"] == len(recs)
    assert st["psize"] == 4096
    for k, v in recs:
        assert len(k) == 8
        (n,) = struct.unpack_from("<Q", v)
        assert len(v) == 8 * (n + 1)
    assert len(s._metas()) == 2


# ---------------------------------------------------------------------------
# the compacting copy of a damaged file: a clear exception, never a crash

import test_corrupt as _tc  # noqa: E402
from test_corrupt import bases  # noqa: E402,F401  (module-scoped fixture)


@pytest.mark.parametrize("case", [p for p in _tc.case_params()
                                  if p.values[0].base is not None])
def test_compact_copy_of_damaged_file(lmdbio, case, bases, tmp_path):  # noqa: F811
    made, _f = _tc.prepare(case, bases, tmp_path)
    dest = tmp_path / "copy"
    dest.mkdir()
    try:
        env = lmdbio.open(made.path, subdir=made.subdir, readonly=True,
                          lock=False, max_dbs=10)
    except lmdbio.Error:
        return  # refused at open: nothing to copy
    try:
        env.copy(str(dest), compact=True)
    except lmdbio.Error as e:
        assert str(e)
    else:
        # the damage left the trees walkable: where the original's main DB
        # reads, the copy reads the same
        # (named-DB records differ in their root page only: compared
        # without it)
        def records(e):
            with e.begin() as t:
                return [(k, v[:40] if len(v) == 48 else v)
                        for k, v in t.cursor()]
        try:
            want = records(env)
        except lmdbio.Error:
            return
        with lmdbio.open(str(dest), readonly=True, lock=False) as c:
            assert records(c) == want
    finally:
        env.close()
