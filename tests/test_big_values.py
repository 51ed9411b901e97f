"""Values in overflow runs, read by the core straight into the bytes objects
that the drop-in API returns (one copy, from the kernel into the object).

* Every operation that yields a value, on databases of overflow values of
  many sizes (one page, several, exactly filling their last page and one
  byte over), equals py-lmdb and equals the path that reads a value through
  the cursor's own buffer and copies it (kept for direct=True: O_DIRECT
  needs aligned memory).  With buffers on and off, read-ahead off, on, on
  tiny caches and as from a cold device.
* Damaged runs (another page number, other flags, too few pages, cut off
  by the end of the file) raise what that path raises, message included.
* The path is taken: positioning on such a value reads none of it, asking
  for it reads it in one request, into the object returned (the same
  object when asked again, without another read).
* The object of a value the program dropped takes a later value; values
  the program keeps never change.
* Walking from a device, the runs of the next values are advised to the
  OS, which reads them ahead.
"""

from __future__ import annotations

import bisect
import os
import random
import struct
import sys
import tempfile

import pytest

from lmdb_fixtures import (LmdbFile, patch_page_header, read_all_pylmdb,
                           read_syscalls, truncate, write_items)
from test_cursor_readahead import CONFIGS, check_advice, norm, open_sub
from test_reader import _accepts_o_direct

from conftest import import_subject, require

hypothesis = require("hypothesis", "pip install hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
lmdbio = import_subject("lmdbio")

PS = os.sysconf("SC_PAGESIZE")
HDR = 16                              # an overflow run's page header
# a value filling its run's pages exactly, and one byte more
EXACT = [k * PS - HDR for k in (1, 2, 3, 5)]
BOUNDARY = EXACT + [s + 1 for s in EXACT]

# The reference path: direct=True reads values as before (into the cursor's
# aligned buffer, then copied); skipped where the filesystem refuses it.
OLD_PATH = ("direct-copy", {}, {"direct": True})
# Every value through lio_cursor_get, no batches, no read-ahead: what the
# fast paths' results and errors are compared with.
ONE_AT_A_TIME = ("one-at-a-time", {"LMDBIO_CURSOR_FASTPATH": "0"},
                 {"readahead": False})


def configs(path):
    return CONFIGS + ([OLD_PATH] if _accepts_o_direct(path) else [])


def value_of(i, size):
    return random.Random(i).randbytes(size)


def key_of(i):
    return b"k%05d" % i


def make(path, sizes):
    items = [(key_of(i), value_of(i, s)) for i, s in enumerate(sizes)]
    write_items(path, items, name=b"t")
    return items


def run(env, program, buffers):
    """Apply `program` to a cursor of db b"t" (and its transaction); the
    results, normalised, or what each step raised."""
    out = []
    db = env.open_db(b"t")
    with env.begin(db=db, buffers=buffers) as txn:
        cur = txn.cursor()
        for op, arg in program:
            try:
                if op == "iter":
                    meth, kw, take = arg
                    got = []
                    for x in getattr(cur, meth)(**kw):
                        got.append(norm(x))
                        if len(got) >= take:
                            break
                    out.append(got)
                elif op == "value2":
                    # the same value twice (a second read, or the object
                    # read the first time)
                    out.append((norm(cur.value()), norm(cur.value()),
                                norm(cur.key())))
                elif op in ("set_key", "set_range"):
                    out.append((getattr(cur, op)(arg), norm(cur.item())))
                elif op == "get":
                    out.append(norm(txn.get(arg)))
                elif op == "cget":
                    out.append((norm(cur.get(arg)), norm(cur.item())))
                elif op == "getmulti":
                    out.append(norm(cur.getmulti(arg)))
                else:
                    out.append((getattr(cur, op)(), norm(cur.item())))
            except Exception as e:  # every side must raise the same
                out.append(("raised", type(e).__name__))
    return out


MOVES = ["first", "last", "next", "prev", "next_nodup", "prev_nodup",
         "first_dup", "last_dup"]
ITERS = [("iternext", {}), ("iterprev", {}), ("iternext", {"keys": False}),
         ("iternext", {"values": False}), ("iternext_nodup", {}),
         ("iterprev_nodup", {"values": True})]


@st.composite
def sizes_st(draw):
    size = st.one_of(st.sampled_from(BOUNDARY),
                     st.integers(2100, PS - HDR),          # one page
                     st.integers(PS - HDR + 1, 12 * PS),   # several
                     st.integers(0, 700))                  # in the leaf
    return draw(st.lists(size, min_size=1, max_size=40))


@st.composite
def program_st(draw, n):
    steps = []
    key = st.integers(0, n + 2).map(key_of)
    for _ in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["move"] * 4 + ["iter"] * 2 + [
            "value2", "set_key", "set_range", "get", "cget", "getmulti"]))
        if kind == "move":
            steps.append((draw(st.sampled_from(MOVES)), None))
        elif kind == "iter":
            meth, kw = draw(st.sampled_from(ITERS))
            steps.append(("iter", (meth, kw, draw(st.integers(1, 50)))))
        elif kind == "value2":
            steps.append(("value2", None))
        elif kind == "getmulti":
            steps.append(("getmulti", draw(st.lists(key, max_size=12))))
        else:
            steps.append((kind, draw(key)))
    return steps


def test_every_value_operation_matches_pylmdb_and_the_copying_path(tmp_path):
    count = [0]

    @settings(max_examples=60, deadline=None)
    @given(sizes=sizes_st(), data=st.data())
    def inner(sizes, data):
        count[0] += 1
        path = str(tmp_path / ("e%d" % count[0]))
        items = make(path, sizes)
        program = data.draw(program_st(len(items)))
        buffers = data.draw(st.booleans())
        ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
        try:
            want = run(ref, program, buffers)
            # the whole database both ways, every value whole
            assert run(ref, [("iter", ("iternext", {}, 10 ** 6))],
                       buffers) == [items]
        finally:
            ref.close()
        for cfg in configs(path):
            env = open_sub(path, cfg)
            try:
                assert run(env, program, buffers) == want, cfg[0]
                assert run(env, [("iter", ("iterprev", {}, 10 ** 6))],
                           buffers) == [items[::-1]], cfg[0]
            finally:
                env.close()
    inner()


def test_value_objects_are_bytes_of_their_own(tmp_path):
    """A value read into its own object is a plain bytes object (hashable,
    equal to py-lmdb's), and with buffers=True a read-only view of one that
    stays valid after the cursor moves on."""
    path = str(tmp_path)
    items = make(path, [3 * PS, PS - HDR + 1, 50, 7 * PS])
    env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4,
                      readahead=False)
    try:
        db = env.open_db(b"t")
        with env.begin(db=db) as txn:
            got = list(txn.cursor())
            assert got == items
            assert all(type(v) is bytes for _k, v in got)
            assert hash(got[0][1]) == hash(items[0][1])
            assert txn.get(items[3][0]) == items[3][1]
        with env.begin(db=db, buffers=True) as txn:
            views = [v for _k, v in txn.cursor()]
            assert all(isinstance(v, memoryview) and v.readonly
                       for v in views)
            assert [bytes(v) for v in views] == [v for _k, v in items]
    finally:
        env.close()


# ---------------------------------------------------------------------------
# damaged runs


def _damage_cases():
    """(name, damage(path, f, run first page, run pages))."""
    def pgno(path, f, ov, _n):
        patch_page_header(f.path, ov, f.psize, pgno_field=ov + 1)

    def flags(path, f, ov, _n):
        patch_page_header(f.path, ov, f.psize, flags=0x02)   # a leaf's

    def too_few(path, f, ov, _n):
        patch_page_header(f.path, ov, f.psize, pages=1)

    def cut(path, f, ov, n):
        truncate(f.path, (ov + n - 1) * f.psize + 10)       # in its last page
    return [("page-number", pgno), ("flags", flags), ("too-few-pages", too_few),
            ("cut-by-end-of-file", cut)]


def outcome(fn):
    try:
        return ("ok", norm(fn()))
    except lmdbio.Error as e:
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("name,damage", _damage_cases(),
                         ids=[c[0] for c in _damage_cases()])
def test_damaged_run_raises_as_the_copying_path(tmp_path, name, damage):
    path = str(tmp_path)
    # In the main DB (its leaf comes first in the file) the damaged value's
    # run is the last thing in the file: a cut leaves the rest whole.
    items = [(key_of(i), value_of(i, 3 * PS)) for i in range(12)]
    write_items(path, items)
    f = LmdbFile(path)
    runs = {struct.unpack_from("<Q", f.buf, nd.data_offset)[0]: nd.key
            for nd in f.bigdata_nodes()}
    ov = max(runs)
    bad = items.index((runs[ov], dict(items)[runs[ov]]))
    damage(path, f, ov, 4)

    def scan(txn):
        got = []
        for kv in txn.cursor():
            got.append(norm(kv))
        return got

    def set_key_value(txn):
        cur = txn.cursor()
        cur.set_key(items[bad][0])
        return cur.value()

    results = {}
    for cfg in configs(path):
        env = open_sub(path, cfg)
        try:
            with env.begin() as txn:
                results[cfg[0]] = [outcome(lambda: scan(txn)),
                                   outcome(lambda: txn.get(items[bad][0])),
                                   outcome(lambda: set_key_value(txn)),
                                   outcome(lambda: txn.get(items[0][0]))]
        finally:
            env.close()
    first = results["simple"]
    for kind, msg in first[:3]:
        assert kind in ("CorruptedError", "PageNotFoundError"), (kind, msg)
        assert "page %d" % ov in msg, msg
    assert first[3] == ("ok", items[0][1])
    for cfg_name, res in results.items():
        assert res == first, cfg_name
    if not _accepts_o_direct(path):
        pytest.skip("the copying path (O_DIRECT) is not available here")


# ---------------------------------------------------------------------------
# the path is taken


def _own_reads():
    """Reading /proc/self/io is itself counted."""
    before = read_syscalls()
    return read_syscalls() - before


@pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                    reason="counts reads with /proc/self/io (Linux)")
def test_value_read_once_when_asked_into_its_object(tmp_path):
    own = _own_reads()
    path = str(tmp_path)
    items = make(path, [5 * PS + 100] * 20)      # one leaf, 20 runs

    def reads(fn):
        before = read_syscalls()
        r = fn()
        return r, read_syscalls() - before - own

    def check(direct):
        env = lmdbio.open(path, readonly=True, lock=True, max_dbs=4,
                          readahead=False, direct=direct)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                cur = txn.cursor()
                assert cur.first()                   # the leaf, cached now
                r = {}
                _, r["set_key"] = reads(lambda: cur.set_key(items[7][0]))
                v1, r["value"] = reads(cur.value)
                v2, r["again"] = reads(cur.value)
                assert v1 == v2 == items[7][1]
                keys, r["keys"] = reads(
                    lambda: list(cur.iternext(values=False)))
                assert keys == [k for k, _v in items[7:]]
                _, r["get"] = reads(lambda: txn.get(items[3][0]))
                return r, v1 is v2
        finally:
            env.close()

    r, same = check(False)
    # positioning reads none of the value, asking for it reads it in one
    # request, once; the second time it is the same object
    assert r == {"set_key": 0, "value": 1, "again": 0, "keys": 0, "get": 1}
    assert same
    if _accepts_o_direct(tempfile.mkdtemp(dir=path)):
        # the copying path reads when positioning, and copies each time
        r, same = check(True)
        assert r["set_key"] == 1 and r["value"] == 0 and r["keys"] == 12
        assert not same


# ---------------------------------------------------------------------------
# read-ahead of the runs a walk meets next


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_walk_from_a_device_advises_the_next_runs(tmp_path):
    """Values written in random key order: the runs a scan meets next are
    scattered over the file, out of reach of the OS's own read-ahead.
    Walking from a device (as if: $LMDBIO_READAHEAD_DEVICE=1), the runs of
    the next values in the leaf are advised (WILLNEED) and arrive in the
    OS cache without being read by lmdbio; without read-ahead they do not."""
    path = str(tmp_path)
    n, size = 300, 15 * PS - 100
    order = list(range(n))
    random.Random(3).shuffle(order)
    write_items(path, [(key_of(i), value_of(i, size)) for i in order])
    f = LmdbFile(path)
    run_of = {nd.key: struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
              for nd in f.bigdata_nodes()}
    tree = [p.pgno for p in f.leaves() + f.branches()]
    first = run_of[key_of(0)]

    def far(pgno):
        # not in a block read around a tree page, nor next to the first run
        return all(abs(pgno - q) * PS > (4 << 20) for q in tree + [first])

    ahead = [run_of[key_of(i)] for i in range(1, 40)
             if far(run_of[key_of(i)])][:10]
    assert len(ahead) >= 5

    def scan_start(env):
        with env.begin() as txn:
            cur = txn.cursor()
            assert cur.first() and cur.value() == value_of(0, size)

    runs = [(r * PS, 15 * PS) for r in ahead]
    check_advice(path, runs, runs, scan_start)


# ---------------------------------------------------------------------------
# objects taken again once the program has let go of them


def test_values_kept_by_the_program_are_never_changed(tmp_path):
    """The objects of values the program dropped take later values; those
    it keeps (in a list, as dict keys with their hash computed, behind a
    memoryview) keep their content, and a retaken object's hash is its new
    content's."""
    path = str(tmp_path)
    rnd = random.Random(5)
    sizes = [rnd.choice([3 * PS, 5 * PS + 7, 6 * PS - 16, 40 * PS])
             for _ in range(300)]
    items = make(path, sizes)
    want = dict(items)
    for buffers in (False, True):
        env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4)
        try:
            with env.begin(db=env.open_db(b"t"), buffers=buffers) as txn:
                kept, keys_of = [], {}
                for i, (k, v) in enumerate(txn.cursor()):
                    k = bytes(k)
                    if not buffers:
                        assert {want[k]: 1}.get(v) == 1     # hash == content
                        hash(v)
                    if i % 3 == 0:
                        kept.append((k, v))
                    elif i % 3 == 1 and not buffers:
                        keys_of[v] = k
                    # (the rest is dropped: its object may be taken again)
                for k, v in kept:
                    assert bytes(v) == want[k]
                for v, k in keys_of.items():
                    assert v == want[k] and keys_of[want[k]] == k
                # the same by get
                got = {}
                for i, (k, _v) in enumerate(items):
                    v = txn.get(k)
                    if i % 2:
                        got[k] = v
                assert all(bytes(v) == want[k] for k, v in got.items())
        finally:
            env.close()


def test_a_dropped_value_object_takes_the_next_value(tmp_path):
    """Which object holds a value, as tracemalloc sees it: the memory a
    dropped value's object was allocated with holds the next one.  (Values
    over 1 MiB, which a walk reads one at a time; the objects of values it
    reads ahead come from the same pool.)"""
    import tracemalloc
    path = str(tmp_path)
    mib = 1 << 20
    items = make(path, [mib + 50000, mib + 46000, mib + 46000])
    env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4)
    tracemalloc.start(1)
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            cur = txn.cursor()
            assert cur.first()
            a = cur.value(); line_a = _line()  # noqa: E702
            del a
            assert cur.next()
            b = cur.value(); line_b = _line()  # noqa: E702
            assert b == items[1][1] and line_b != line_a
            assert tracemalloc.get_object_traceback(b)[0].lineno == line_a
            # kept: the next value gets new memory
            assert cur.next()
            c = cur.value(); line_c = _line()  # noqa: E702
            assert c == items[2][1] and b == items[1][1]
            assert tracemalloc.get_object_traceback(c)[0].lineno == line_c
            assert line_c != line_b
    finally:
        tracemalloc.stop()
        env.close()


def test_a_transactions_gets_take_back_the_objects_of_the_one_before(tmp_path):
    """A transaction per get (torchvision's LSUN reads each item so): the
    object of a value the program let go of in an ended transaction takes
    the next transaction's value; one it kept is never touched, and a
    closed environment keeps none."""
    import tracemalloc
    path = str(tmp_path)
    mib = 1 << 20
    items = make(path, [mib + 50000, mib + 46000, mib + 46000, mib + 40000])
    env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4)
    db = env.open_db(b"t")
    tracemalloc.start(1)
    try:
        with env.begin(db=db) as txn:
            a = txn.get(items[0][0]); line_a = _line()  # noqa: E702
            assert a == items[0][1]
        del a
        with env.begin(db=db) as txn:
            b = txn.get(items[1][0]); line_b = _line()  # noqa: E702
        assert b == items[1][1] and line_b != line_a
        assert tracemalloc.get_object_traceback(b)[0].lineno == line_a
        with env.begin(db=db) as txn:   # b kept: new memory
            c = txn.get(items[2][0]); line_c = _line()  # noqa: E702
        assert c == items[2][1] and b == items[1][1]
        assert tracemalloc.get_object_traceback(c)[0].lineno == line_c
        del c
        env.close()
        env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4)
        with env.begin(db=env.open_db(b"t")) as txn:
            d = txn.get(items[3][0]); line_d = _line()  # noqa: E702
        assert d == items[3][1]
        assert tracemalloc.get_object_traceback(d)[0].lineno == line_d
    finally:
        tracemalloc.stop()
        env.close()


def test_a_walks_batches_take_back_the_objects_of_the_batch_before(tmp_path):
    """A forward walk reads values of 150 KiB six a request; once the
    program has let go of a batch, the next batch's values land in its
    objects, all of them (tracemalloc: every later value's object was
    allocated while the first batches were read)."""
    import tracemalloc
    path = str(tmp_path)
    items = make(path, [150 << 10] * 60)
    env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4)

    def first(cur):
        return cur.value() if cur.next() else None

    def later(cur):
        return cur.value() if cur.next() else None

    tracemalloc.start(1)
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            cur = txn.cursor()
            lines = set()
            for i in range(12):             # two batches
                v = first(cur)
                assert v == items[i][1]
                lines.add(tracemalloc.get_object_traceback(v)[0].lineno)
                del v
            for i in range(12, 60):
                v = later(cur)
                assert v == items[i][1]
                assert tracemalloc.get_object_traceback(v)[0].lineno in lines
                del v
    finally:
        tracemalloc.stop()
        env.close()


def _line():
    import sys
    return sys._getframe(1).f_lineno


def test_value_objects_over_32_mib_are_not_kept(tmp_path):
    """A dropped value of more than 32 MiB is freed at once (the cursor
    does not keep it for the next value), where a smaller one is kept."""
    import gc
    import tracemalloc
    path = str(tmp_path)
    big, small = (33 << 20) + 5, 100000
    items = [(key_of(i), value_of(i, s))
             for i, s in enumerate([big, big, small, small])]
    write_items(path, items, name=b"t", map_size=1 << 30)
    env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4)
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            cur = txn.cursor()
            tracemalloc.start(1)
            try:
                for size in (big, small):
                    assert cur.next()
                    v = cur.value()
                    assert len(v) == size
                    before = tracemalloc.get_traced_memory()[0]
                    del v
                    assert cur.next()    # the cursor lets go of it too
                    gc.collect()
                    freed = before - tracemalloc.get_traced_memory()[0]
                    # (other objects come and go meanwhile: a margin)
                    if size == big:
                        assert freed > size - (1 << 16)   # not kept
                    else:
                        assert freed < size // 2   # kept for the next value
                    assert len(cur.value()) == size   # which still reads
            finally:
                tracemalloc.stop()
    finally:
        env.close()


# ---------------------------------------------------------------------------
# a forward walk reads small values in batches


SMALL_RUNS = st.one_of(st.integers(2100, PS - HDR),            # one page
                       st.integers(PS - HDR + 1, 4 * PS),       # a few
                       st.sampled_from(BOUNDARY[:4]),
                       st.integers(0, 700),                     # in the leaf
                       st.integers(5 * PS, 9 * PS))             # too big


def test_batched_values_equal_pylmdb_and_the_one_at_a_time_path(tmp_path):
    """Values of up to 1 MiB that a forward walk meets are read several
    per request: any insertion order (runs in key order, or not), values
    skipped, buffers or not, every cursor configuration, equal to py-lmdb
    and to the reference path that reads one value at a time."""
    count = [0]

    @settings(max_examples=40, deadline=None)
    @given(sizes=st.lists(SMALL_RUNS, min_size=1, max_size=300),
           shuffled=st.booleans(), every=st.integers(1, 4),
           buffers=st.booleans(), seed=st.integers(0, 9))
    def inner(sizes, shuffled, every, buffers, seed):
        count[0] += 1
        path = str(tmp_path / ("b%d" % count[0]))
        items = [(key_of(i), value_of(i, s)) for i, s in enumerate(sizes)]
        put = list(items)
        if shuffled:
            random.Random(seed).shuffle(put)
        write_items(path, put, name=b"t")

        def walk(env):
            # every value of a scan, then every `every`-th of a keys-only
            # walk (values skipped in between), then a backward scan
            db = env.open_db(b"t")
            with env.begin(db=db, buffers=buffers) as txn:
                got = [norm(kv) for kv in txn.cursor()]
                cur = txn.cursor()
                some, i, more = [], 0, cur.first()
                while more:
                    if i % every == 0:
                        some.append(norm(cur.value()))
                    i += 1
                    more = cur.next()
                back = [norm(kv) for kv in txn.cursor().iterprev()]
            return got, some, back

        want = (items, [v for i, (_k, v) in enumerate(items) if i % every == 0],
                items[::-1])
        ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
        try:
            assert walk(ref) == want
        finally:
            ref.close()
        for cfg in configs(path):
            env = open_sub(path, cfg)
            try:
                assert walk(env) == want, cfg[0]
            finally:
                env.close()
    inner()


@pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                    reason="counts reads with /proc/self/io (Linux)")
@pytest.mark.parametrize("size", [PS - HDR - 900, 2 * PS, 3 * PS - HDR])
def test_a_walk_reads_small_values_many_per_request(tmp_path, size):
    """300 values of one to three pages in key order: a scan reads them
    in a handful of requests (read-ahead off: nothing else batches them),
    where the reference path makes one per value."""
    own = _own_reads()
    path = str(tmp_path)
    items = make(path, [size] * 300)

    def scan(cfg):
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                before = read_syscalls()
                got = list(txn.cursor())
                return got, read_syscalls() - before - own
        finally:
            env.close()

    got, batched = scan(("batched", {}, {"readahead": False}))
    assert got == items
    ref, single = scan(ONE_AT_A_TIME)
    assert ref == items
    assert single >= 300
    # a request per leaf and per 85 of its values, the root, and the two
    # meta pages (lock=False: the snapshot is checked at the end of a scan)
    leaves = LmdbFile(path).leaves("t")
    assert 2 <= len(leaves) <= 4
    assert batched <= sum(1 + -(-len(p.nodes) // 85) for p in leaves) + 3


@pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                    reason="counts reads with /proc/self/io (Linux)")
@pytest.mark.parametrize("size,per_request", [(200 << 10, 5), ((1 << 20) + 1, 1)],
                         ids=["200KiB", "over-1MiB"])
def test_a_walk_reads_values_up_to_1_mib_several_per_request(
        tmp_path, size, per_request):
    """Values of 200 KiB in key order: a scan reads five a request (their
    runs span at most 1 MiB); values over 1 MiB one a request."""
    own = _own_reads()
    path = str(tmp_path)
    items = make(path, [size] * 20)
    env = open_sub(path, ("batched", {}, {"readahead": False}))
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            before = read_syscalls()
            got = list(txn.cursor())
            reads = read_syscalls() - before - own
    finally:
        env.close()
    assert got == items
    # the values' requests, the leaf, the root and the two meta pages
    assert 20 // per_request <= reads <= -(-20 // per_request) + 5, reads


def scan_to_error(path, cfg, name=b"t"):
    """A full scan of database `name` (None: the main one) of `path`
    opened with `cfg`: the items before the first lmdbio.Error, and that
    error (class name, message), or None."""
    env = open_sub(path, cfg)
    got = []
    try:
        with env.begin(db=env.open_db(name) if name else None) as txn:
            try:
                for kv in txn.cursor():
                    got.append(kv)
            except lmdbio.Error as e:
                return got, (type(e).__name__, str(e))
            return got, None
    finally:
        env.close()


@pytest.mark.parametrize("field", [dict(pgno_field=1), dict(flags=0x02),
                                   dict(pages=0)],
                         ids=["page-number", "flags", "no-pages"])
def test_a_damaged_run_in_a_batch_raises_when_the_walk_gets_there(
        tmp_path, field):
    """A damaged header read ahead in a batch raises nothing until the
    walk reaches its value; every value before it comes out whole, and
    the error is the reference path's, message included."""
    path = str(tmp_path)
    items = make(path, [3000] * 40)
    f = LmdbFile(path)
    runs = sorted(struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
                  for nd in f.bigdata_nodes("t"))
    patch_page_header(f.path, runs[17], f.psize, **field)

    got, err = scan_to_error(path, ("batched", {}, {"readahead": False}))
    assert got == items[:17]
    assert err is not None and "page %d" % runs[17] in err[1], err
    assert scan_to_error(path, ONE_AT_A_TIME) == (got, err)


def _mixed_sizes(path, n=4000, sizes="stride"):
    """Database t: n values of 100-3000 bytes appended in key order (those
    over half a page in a one-page run each, between the leaves), as a
    dataset of mixed-size records is written.  sizes: "stride" (liblmdb
    puts most values' pages before their leaf) or "random" (after it)."""
    rng = random.Random(5)
    size = ((lambda i: 100 + (i * 7919) % 2900) if sizes == "stride" else
            (lambda i: rng.randrange(100, 3000)))
    items = [(b"%06d" % i, value_of(i, size(i))) for i in range(n)]
    write_items(path, items, name=b"t")
    return items


@pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                    reason="counts reads with /proc/self/io (Linux)")
@pytest.mark.parametrize("sizes", ["stride", "random"])
def test_walk_takes_values_read_with_the_leaves_between_them(tmp_path,
                                                             sizes):
    """From the OS cache, read-ahead reads a batch of leaves in one request
    that spans the one-page values between them: the walk takes those
    values from the cache, not with a read of their own (4000 records,
    1048 leaves: 103 read calls, against 852 before; 300k such records,
    hot: 148 ms against 201 before and py-lmdb's 214).  Equal to py-lmdb
    and to the one-at-a-time path."""
    path = str(tmp_path)
    items = _mixed_sizes(path, sizes=sizes)
    f = LmdbFile(path)
    leaves = f.leaves("t")
    assert len(f.bigdata_nodes("t")) > len(leaves) / 2   # values between
    env = open_sub(path, CONFIGS[2])     # read-ahead on, as lmdbio.open
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            r0 = _io()[0]
            got = list(txn.cursor())
            calls = _io()[0] - r0
    finally:
        env.close()
    assert got == items
    assert calls < len(leaves) / 8, (calls, len(leaves))
    for cfg in CONFIGS[:2]:
        assert scan_to_error(path, cfg) == (items, None), cfg[0]


def _bench_mixed(path, records=8000):
    """The benches' `mixed` dataset (benches/datasets.py: Datums of
    100-3000 bytes appended in key order in commits of 10k, a third in
    one-page runs after their leaf), `records` of it."""
    benches = os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "benches")
    if benches not in sys.path:
        sys.path.insert(0, benches)
    import datasets
    datasets.generate("mixed", path, records=records)
    return read_all_pylmdb(path)[None]


@pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                    reason="counts reads with /proc/self/io (Linux)")
def test_values_read_one_at_a_time_come_from_the_cache_too(tmp_path):
    """Values a walk reads one at a time are taken from the cache when
    they came in with the leaves, as batches of them are: they were read
    again from the file, their copies left unused (8000 records: 462 read
    calls for 19.3 MB of an 18.0 MB file; now 162 for 18.6 MB; 300k, hot:
    192 -> 156 ms, py-lmdb 182).  Equal to py-lmdb and to the
    one-at-a-time path."""
    path = str(tmp_path / "mixed")
    items = _bench_mixed(path)
    leaves = LmdbFile(path).leaves()
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    env = lmdbio.open(path, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            r0 = _io()
            got = list(txn.cursor())
            r1 = _io()
    finally:
        env.close()
    assert got == items
    calls, nbytes = r1[0] - r0[0], r1[1] - r0[1]
    assert calls < len(leaves) / 6, (calls, len(leaves))
    assert nbytes < size * 1.06, (nbytes, size)
    assert scan_to_error(path, ONE_AT_A_TIME, None) == (items, None)


@pytest.mark.parametrize("field", [dict(pgno_field=1), dict(flags=0x02),
                                   dict(pages=0)],
                         ids=["page-number", "flags", "no-pages"])
def test_damaged_values_of_a_walk_raise_as_one_at_a_time(tmp_path, field):
    """Damaged one-page runs among those a walk takes from the cache
    (alone or in batches): the walk raises at the first, with the
    one-at-a-time path's error and the same items before it."""
    path = str(tmp_path / "mixed")
    items = _bench_mixed(path, records=4000)
    f = LmdbFile(path)
    runs = sorted(struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
                  for nd in f.bigdata_nodes())
    for pgno in runs[len(runs) // 3::41]:
        patch_page_header(f.path, pgno, f.psize, **field)
    got, err = scan_to_error(path, CONFIGS[2], None)
    assert err is not None and len(got) < len(items), err
    assert scan_to_error(path, ONE_AT_A_TIME, None) == (got, err)


@pytest.mark.parametrize("field", [dict(pgno_field=1), dict(flags=0x02),
                                   dict(pages=0)],
                         ids=["page-number", "flags", "no-pages"])
def test_a_damaged_value_read_with_the_leaves_raises_when_the_walk_gets_there(
        tmp_path, field):
    """A damaged one-page run that came into the cache with the leaves
    around it raises nothing until the walk reaches its value, with the
    one-at-a-time path's error and the same values before it."""
    path = str(tmp_path)
    items = _mixed_sizes(path)
    f = LmdbFile(path)
    run_of = {nd.key: struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
              for nd in f.bigdata_nodes("t")}
    at = sorted(run_of)[len(run_of) // 2]
    bad = run_of[at]
    patch_page_header(f.path, bad, f.psize, **field)
    ordinal = [k for k, _ in items].index(at)

    got, err = scan_to_error(path, CONFIGS[2])
    assert got == items[:ordinal]
    assert err is not None and "page %d" % bad in err[1], err
    assert scan_to_error(path, ONE_AT_A_TIME) == (got, err)


def _reader_epoch(path, cache, **kw):
    """A Reader's epoch in key order over `path` with the index in
    `cache`: the (key, value) pairs, the error that ended it (or None),
    and the bytes its reads asked for."""
    got, err = [], None
    with lmdbio.Reader(path, batch_size=128, index_cache=cache,
                       **kw) as r:
        before = r.io_stats()[1]
        try:
            for b in r:
                got.extend(zip(b.keys.tolist(), b.values.tolist()))
        except lmdbio.Error as e:
            err = (type(e), str(e))
        return got, err, r.io_stats()[1] - before


def test_reader_takes_values_from_the_pages_read_between_leaves(tmp_path):
    """A later start over one-page values placed after their leaf: the
    window's leaf reads bridge the values between two leaves, and the
    values are copied from there rather than read again, with every leaf
    read again around them (8000 records: 1.70x the file's bytes, now
    within 1.06x; 300k: 1172 -> 680 MB asked for, 41.9k -> 16.2k read
    calls).  Equal to py-lmdb and to reads that bridge nothing."""
    path = str(tmp_path / "mixed")
    items = _bench_mixed(path)
    cache = str(tmp_path / "index")
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    _reader_epoch(path, cache)   # (counts the index: a first start)
    got, err, nbytes = _reader_epoch(path, cache)
    assert err is None and got == items
    assert nbytes < size * 1.06, (nbytes, size)
    apart = _reader_epoch(path, cache, storage=(0, 1e9))   # (no gap)
    assert apart[:2] == (items, None)
    # a first start: the values its counting bridged (1.8x the file)
    got, err, nbytes = _reader_epoch(path, False)
    assert err is None and got == items
    assert nbytes < size * 1.15, (nbytes, size)


@pytest.mark.parametrize("field", [dict(pgno_field=1), dict(flags=0x02),
                                   dict(pages=0)],
                         ids=["page-number", "flags", "no-pages"])
@pytest.mark.parametrize("start", ["first", "later"])
def test_reader_raises_at_a_damaged_value_read_between_leaves(tmp_path,
                                                              field, start):
    """A damaged one-page run among those the leaf reads bridge (a later
    start's windows, or a first start's counting): the epoch raises at
    its batch with the error of reads that bridge nothing, and the same
    records before it."""
    path = str(tmp_path / "mixed")
    items = _bench_mixed(path, records=4000)
    cache = str(tmp_path / "index") if start == "later" else False
    if cache:
        _reader_epoch(path, cache)
    f = LmdbFile(path)
    leaves = sorted(p.pgno for p in f.leaves())
    runs = sorted(struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
                  for nd in f.bigdata_nodes())

    def bridged(p):   # (its leaves' read bridges it: "local" storage)
        i = bisect.bisect(leaves, p)
        return 0 < i < len(leaves) and \
            (leaves[i] - leaves[i - 1] - 1) * f.psize <= 16000
    bad = next(p for p in runs[len(runs) // 2:] if bridged(p))
    patch_page_header(f.path, bad, f.psize, **field)
    got, err, _ = _reader_epoch(path, cache)
    assert err is not None and "page %d" % bad in err[1], err
    assert got == items[:len(got)] and len(got) < len(items)
    assert _reader_epoch(path, cache, storage=(0, 1e9))[:2] == (got, err)


def _io():
    """(read system calls, bytes read) of this process so far."""
    with open("/proc/self/io") as fh:
        kv = dict(line.split(":") for line in fh)
    return int(kv["syscr"]), int(kv["rchar"])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                    reason="counts reads with /proc/self/io (Linux)")
def test_random_gets_read_their_own_value_and_key_order_gets_batch(tmp_path):
    """A lookup of a one-page value reads that value alone (it once read
    the next values of the leaf with it, 17x slower than py-lmdb when the
    file is larger than the cache); gets in key order still read several
    values per request."""
    path = str(tmp_path)
    items = make(path, [3000] * 400)
    keys = [k for k, _v in items]
    shuffled = list(keys)
    random.Random(5).shuffle(shuffled)
    env = lmdbio.open(path, readonly=True, lock=False, max_dbs=4,
                      cache_bytes=0)
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            for k in keys[:3]:      # the branch and leaf pages, cached
                txn.get(k)
            own = _io()
            own = tuple(b - a for a, b in zip(own, _io()))
            before = _io()
            got = [txn.get(k) for k in shuffled]
            calls, nbytes = (b - a - o for a, b, o in
                             zip(before, _io(), own))
            assert got == [dict(items)[k] for k in shuffled]
            # (a leaf read now and then: the cache holds 64 pages)
            assert nbytes <= len(keys) * 2 * PS, nbytes / len(keys)
            before = _io()
            got = [txn.get(k) for k in keys]
            calls = _io()[0] - before[0] - own[0]
            assert got == [v for _k, v in items]
            assert calls <= len(keys) // 4, calls
    finally:
        env.close()
