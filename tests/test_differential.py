"""Differential tests: lmdbio against py-lmdb on files written by py-lmdb.

Hypothesis generates environments (every flag combination, named DBs plus
the main DB, empty DBs, subdir=False, random inserts and deletes over several
transactions so pages are freed and reused, overflow values, 1- and 511-byte
keys, empty values, hundreds of duplicates of one key so sub-pages spill into
sub-databases), then drives random sequences of every read-only cursor method
on a py-lmdb cursor and on the subject's cursor in lockstep, comparing every
return value and every exception type.  Full iteration both ways, txn.get,
stat, open_db, db flags and txn ids are compared too.

Page size: py-lmdb (and mdb_load) cannot choose psize; liblmdb always uses the
OS page size (4096 here).  That dimension is not covered here: it would need
hand-written files (see test_corrupt.py for psize handling on bad files).

The subject is lmdbio, and py-lmdb itself as a check of this file's logic
(conftest.subject_names).  lmdbio opens the *same path* the py-lmdb reference
has open, with the default lock=True, as the drop-in API promises; py-lmdb refuses a
second handle on one path in one process, so when the subject is py-lmdb it
reads a byte copy of the environment instead.

Integer keys/values of the wrong width are never used as arguments on
INTEGERKEY / INTEGERDUP databases: liblmdb's integer comparators read
sizeof(int)/sizeof(size_t) bytes unconditionally, so the reference's answer is
undefined there.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import struct
import tempfile
from typing import List

import lmdb
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from conftest import import_subject, subject_names
from lmdb_fixtures import (
    COMBOS_BY_ID, FLAG_COMBOS, MDB_LOAD, OS_PAGE_SIZE, PLAIN, DBSpec, Model,
    data_file, lock_file, strip_named, write_env,
)

SUBJECTS = subject_names()

# Fewer examples when the subject is py-lmdb: that run only checks the logic.
EXAMPLES = {"lmdbio": 150, "lmdb": 25}
if os.environ.get("LMDBIO_DIFF_EXAMPLES"):  # e.g. 2000 for a long local run
    EXAMPLES = dict.fromkeys(EXAMPLES, int(os.environ["LMDBIO_DIFF_EXAMPLES"]))

if MDB_LOAD:
    SPECS = FLAG_COMBOS
else:  # REVERSEDUP and main-DB flags need mdb_load to be created
    SPECS = [s for s in FLAG_COMBOS if not s.needs_mdb_load]
MAIN_SPECS = SPECS if MDB_LOAD else [PLAIN]


def _settings(subject_name, n=None):
    return settings(
        max_examples=EXAMPLES[subject_name] if n is None or os.environ.get(
            "LMDBIO_DIFF_EXAMPLES") else n, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much])


# ---------------------------------------------------------------------------
# strategies: database contents


def _bytes_from(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@st.composite
def key_st(draw, spec: DBSpec):
    if spec.key_kind == "int4":
        return struct.pack("=I", draw(st.one_of(st.integers(0, 300),
                                                st.integers(0, 2**32 - 1))))
    if spec.key_kind == "int8":
        return struct.pack("=Q", draw(st.one_of(st.integers(0, 300),
                                                st.integers(0, 2**64 - 1))))
    kind = draw(st.sampled_from(["short", "short", "short", "one", "long", "max"]))
    if kind == "one":
        return draw(st.binary(min_size=1, max_size=1))
    if kind == "short":
        return draw(st.binary(min_size=1, max_size=12))
    head = draw(st.binary(min_size=1, max_size=6))
    size = 511 if kind == "max" else draw(st.integers(100, 511))
    return (head + _bytes_from(size, size))[:size]


@st.composite
def value_st(draw, spec: DBSpec):
    if spec.val_kind in ("int4", "int8", "fixed"):
        w = spec.max_value_size
        if spec.val_kind == "int4":
            return struct.pack("=I", draw(st.one_of(st.integers(0, 50),
                                                    st.integers(0, 2**32 - 1))))
        if spec.val_kind == "int8":
            return struct.pack("=Q", draw(st.one_of(st.integers(0, 50),
                                                    st.integers(0, 2**64 - 1))))
        return draw(st.binary(min_size=w, max_size=w))
    if spec.dupsort:
        kind = draw(st.sampled_from(["small", "small", "small", "max"]))
        if kind == "max":
            return _bytes_from(draw(st.integers(0, 10)), 511)
        return draw(st.binary(min_size=1, max_size=16))
    kind = draw(st.sampled_from(["small", "small", "small", "empty", "mid", "big"]))
    if kind == "empty":
        return b""
    if kind == "small":
        return draw(st.binary(max_size=20))
    # around nodemax (values move to overflow pages at ~psize/2) and beyond
    size = (draw(st.integers(1900, 2200)) if kind == "mid"
            else draw(st.integers(OS_PAGE_SIZE - 100, 5 * OS_PAGE_SIZE)))
    return _bytes_from(draw(st.integers(0, 1000)), size)


@st.composite
def ops_st(draw, spec: DBSpec, forbidden_keys=frozenset(), max_ops=60):
    keys = draw(st.lists(key_st(spec), min_size=1, max_size=30, unique=True))
    keys = [k for k in keys if k not in forbidden_keys] or [spec.make_key(999)]
    kidx = st.integers(0, len(keys) - 1)
    ops = []
    bucket = draw(st.sampled_from(["small", "mid", "mid", "big", "big", "big",
                                   "big", "empty"]))
    n = {"empty": 0, "small": draw(st.integers(1, 8)),
         "mid": draw(st.integers(8, max_ops // 2)),
         "big": draw(st.integers(max_ops // 2, max_ops))}[bucket]
    many_dups_done = False
    if spec.dupsort and draw(st.integers(0, 9)) < 4:
        many_dups_done = True
        ops.append(("manydups", keys[draw(kidx)], (draw(st.integers(0, 1000)),
                                                  draw(st.integers(100, 700)))))
    for _ in range(n):
        kind = draw(st.sampled_from(
            ["put"] * 6 + ["del"] * 2 + (["deldup", "manydups"] if spec.dupsort else [])))
        k = keys[draw(kidx)]
        if kind == "put":
            ops.append(("put", k, draw(value_st(spec))))
        elif kind == "del":
            ops.append(("del", k, None))
        elif kind == "deldup":
            # delete one existing duplicate when there is one
            mine = [v for (o, kk, v) in expand_ops(spec, ops) if o == "put" and kk == k]
            if mine:
                ops.append(("del", k, draw(st.sampled_from(mine))))
        elif kind == "manydups" and not many_dups_done:
            # kept compact for hypothesis' reports; expand_ops() expands it
            many_dups_done = True
            ops.append(("manydups", k, (draw(st.integers(0, 1000)),
                                        draw(st.integers(100, 700)))))
    return ops


def expand_ops(spec: DBSpec, ops):
    out = []
    for op in ops:
        if op[0] == "manydups":
            start, count = op[2]
            out.extend(("put", op[1], spec.dup_value(start + i)) for i in range(count))
        else:
            out.append(op)
    return out


MAIN_KEY_PREFIX = b"main:"


@st.composite
def layout_st(draw):
    """(subdir, {name: (spec, ops)}, txn_size, focus name)."""
    subdir = draw(st.booleans())
    txn_size = draw(st.sampled_from([0, 0, 1, 5, 40]))
    if draw(st.booleans()):
        spec = draw(st.sampled_from(MAIN_SPECS))
        dbs = {None: (spec, draw(ops_st(spec)))}
    else:
        n = draw(st.integers(1, 3))
        names = draw(st.lists(st.sampled_from(
            [b"db", b"a", b"\x01named", b"z" * 100, b"dbs-" + b"x" * 20]),
            min_size=n, max_size=n, unique=True))
        dbs = {}
        for name in names:
            spec = draw(st.sampled_from(SPECS))
            dbs[name] = (spec, draw(ops_st(spec)))
        if draw(st.booleans()):  # data in the main DB too, never a DB's name
            main_ops = draw(ops_st(PLAIN, forbidden_keys=frozenset(names), max_ops=20))
            dbs[None] = (PLAIN, main_ops)
    focus = draw(st.sampled_from(sorted(dbs, key=lambda n: n or b"")))
    return subdir, dbs, txn_size, focus


# ---------------------------------------------------------------------------
# opening the pair


class Pair:
    """A py-lmdb reference and a subject environment on the same file."""

    def __init__(self, subject_name, path, subdir, max_dbs, tmp):
        self.subject = import_subject(subject_name)
        self.ref = lmdb.open(path, subdir=subdir, readonly=True, max_dbs=max_dbs)
        sub_path = path
        if subject_name == "lmdb":
            # py-lmdb refuses a second handle on one path: read a byte copy
            sub_path = os.path.join(tmp, "copy" if subdir else "copy.mdb")
            if subdir:
                os.mkdir(sub_path)
            shutil.copyfile(data_file(path, subdir), data_file(sub_path, subdir))
        self.sub = self.subject.open(sub_path, subdir=subdir, readonly=True,
                                     max_dbs=max_dbs)

    def close(self):
        self.sub.close()
        self.ref.close()


def with_env(subdir, dbs, txn_size, subject_name, fn, max_dbs=None):
    tmp = tempfile.mkdtemp(prefix="lmdbio-diff-")
    try:
        path = os.path.join(tmp, "env" if subdir else "env.mdb")
        dbs = {n: (spec, expand_ops(spec, ops)) for n, (spec, ops) in dbs.items()}
        models = write_env(path, dbs, subdir=subdir, txn_size=txn_size)
        pair = Pair(subject_name, path, subdir,
                    max(1, len(dbs)) if max_dbs is None else max_dbs, tmp)
        try:
            return fn(pair, models)
        finally:
            pair.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------
# normalising results


class Raised:
    def __init__(self, exc, lmdb_base):
        self.name = type(exc).__name__
        self.is_lmdb_error = isinstance(exc, lmdb_base)
        self.exc = exc

    def __eq__(self, other):
        return (isinstance(other, Raised) and self.name == other.name
                and self.is_lmdb_error == other.is_lmdb_error)

    def __repr__(self):
        return "Raised(%s%s: %s)" % (self.name, "" if self.is_lmdb_error else " [not an Error]",
                                     self.exc)


def norm(x):
    """Make a result comparable (bytes-like -> ('buf' or 'bytes', bytes))."""
    if isinstance(x, bytes):
        return ("bytes", x)
    if isinstance(x, (bool, int, type(None), str, float)):
        return (type(x).__name__, x)
    if isinstance(x, tuple):
        return ("tuple",) + tuple(norm(i) for i in x)
    if isinstance(x, list):
        return ["list"] + [norm(i) for i in x]
    if isinstance(x, dict):
        return ("dict", tuple(sorted((k, norm(v)) for k, v in x.items())))
    try:  # memoryview, or another buffer-protocol object (buffers=True)
        return ("buf", bytes(memoryview(x)))
    except TypeError:
        return ("other", repr(x))


def call(fn, lmdb_base):
    try:
        return norm(fn())
    except Exception as exc:  # every exception type is compared
        return Raised(exc, lmdb_base)


# ---------------------------------------------------------------------------
# cursor programs

NULLARY = ["first", "last", "next", "prev", "first_dup", "last_dup", "next_dup",
           "next_nodup", "prev_dup", "prev_nodup", "key", "value", "item", "count"]
ITERS = ["iternext", "iternext_dup", "iternext_nodup", "iterprev", "iterprev_dup",
         "iterprev_nodup"]


def arg_keys(spec: DBSpec, keys: List[bytes]):
    opts = []
    if spec.key_kind == "bytes":
        opts.append(st.binary(min_size=1, max_size=14))
        opts.append(st.sampled_from([b"\x00", b"\xff", b"\xff" * 511, b"x" * 512, b"y" * 600]))
        if keys:
            ks = st.sampled_from(keys)
            opts.append(ks.map(lambda k: k + b"\x00"))
            opts.append(ks.map(lambda k: k[:-1] or b"\x00"))
            opts.append(ks.map(lambda k: k[:-1] + bytes([(k[-1] + 1) & 255])))
            opts.append(ks.map(lambda k: k[:-1] + bytes([(k[-1] - 1) & 255])))
    elif spec.key_kind == "int4":
        opts.append(st.integers(0, 2**32 - 1).map(lambda i: struct.pack("=I", i)))
        opts.append(st.integers(0, 310).map(lambda i: struct.pack("=I", i)))
    else:
        opts.append(st.integers(0, 2**64 - 1).map(lambda i: struct.pack("=Q", i)))
        opts.append(st.integers(0, 310).map(lambda i: struct.pack("=Q", i)))
    # b"" is safe for every key kind: set_range(b"") is first(), set_key(b"")
    # and get(b"") raise BadValsizeError before any comparison.
    opts.append(st.just(b""))
    if keys:  # about half of the time a key that exists
        return _mostly(st.sampled_from(keys), st.one_of(opts))
    return st.one_of(opts)


@st.composite
def _mostly(draw, preferred, other):
    return draw(preferred if draw(st.integers(0, 9)) < 5 else other)


def arg_values(spec: DBSpec, values: List[bytes]):
    opts = []
    if spec.val_kind == "int4":
        opts.append(st.integers(0, 2**32 - 1).map(lambda i: struct.pack("=I", i)))
    elif spec.val_kind == "int8":
        opts.append(st.integers(0, 2**64 - 1).map(lambda i: struct.pack("=Q", i)))
    else:
        opts.append(st.binary(min_size=1, max_size=12))
        if values:
            vs = st.sampled_from(values)
            opts.append(vs.map(lambda v: v + b"\x00"))
            opts.append(vs.map(lambda v: v[:-1] + bytes([(v[-1] + 1) & 255]) if v else b"\x01"))
    if values:
        return _mostly(st.sampled_from(values), st.one_of(opts))
    return st.one_of(opts)


@st.composite
def program_st(draw, spec: DBSpec, keys: List[bytes], values: List[bytes]):
    K = arg_keys(spec, keys)
    V = arg_values(spec, values)
    dupfixed_w = spec.max_value_size if spec.kwargs.get("dupfixed") else None
    prog = []
    for _ in range(draw(st.one_of(st.integers(1, 10), st.integers(10, 60)))):
        kind = draw(st.sampled_from(
            ["nullary"] * 12 + ["set_key", "set_range", "set_key", "set_range",
                                "set_key_dup", "set_range_dup", "get", "getmulti",
                                "iter", "iter", "txn_get", "new_cursor", "close"]))
        if kind == "nullary":
            prog.append((draw(st.sampled_from(NULLARY)),))
        elif kind in ("set_key", "set_range"):
            prog.append((kind, draw(K)))
        elif kind in ("set_key_dup", "set_range_dup"):
            prog.append((kind, draw(K), draw(V)))
        elif kind == "get":
            prog.append(("get", draw(K), draw(st.sampled_from([None, b"DEFAULT"]))))
        elif kind == "txn_get":
            prog.append(("txn_get", draw(K), draw(st.sampled_from([None, b"DEFAULT"]))))
        elif kind == "getmulti":
            ks = draw(st.lists(K, max_size=5))
            mode = draw(st.sampled_from(["plain", "dupdata", "nvalues", "fixed", "keyfixed"]))
            kw = {}
            if mode == "dupdata":
                kw = dict(dupdata=True)
            elif mode == "nvalues":
                kw = dict(values=False)
            elif mode in ("fixed", "keyfixed"):
                # GET_MULTIPLE: IncompatibleError unless DUPFIXED
                kw = dict(dupdata=True, dupfixed_bytes=dupfixed_w or 4)
                if mode == "keyfixed":
                    kw["keyfixed"] = True
            prog.append(("getmulti", ks, kw))
        elif kind == "iter":
            name = draw(st.sampled_from(ITERS + ["__iter__"]))
            kw = {}
            if name != "__iter__" and draw(st.booleans()):
                kw = dict(keys=draw(st.booleans()), values=draw(st.booleans()))
            take = draw(st.sampled_from([0, 1, 2, 3, 5, 20, None]))
            prog.append(("iter", name, kw, take))
        else:
            prog.append((kind,))
    return prog


ITER_CAP = 100_000


def run_step(state, step, lmdb_base):
    """Run one program step on one side; state = dict(txn, db, cur)."""
    cur = state["cur"]
    name = step[0]
    if name in NULLARY:
        return call(getattr(cur, name), lmdb_base)
    if name in ("set_key", "set_range"):
        return call(lambda: getattr(cur, name)(step[1]), lmdb_base)
    if name in ("set_key_dup", "set_range_dup"):
        return call(lambda: getattr(cur, name)(step[1], step[2]), lmdb_base)
    if name == "get":
        if step[2] is None:
            return call(lambda: cur.get(step[1]), lmdb_base)
        return call(lambda: cur.get(step[1], step[2]), lmdb_base)
    if name == "txn_get":
        txn, db = state["txn"], state["db"]
        if step[2] is None:
            return call(lambda: txn.get(step[1], db=db), lmdb_base)
        return call(lambda: txn.get(step[1], step[2], db=db), lmdb_base)
    if name == "getmulti":
        return call(lambda: cur.getmulti(step[1], **step[2]), lmdb_base)
    if name == "iter":
        _, meth, kw, take = step

        def consume():
            it = iter(cur) if meth == "__iter__" else getattr(cur, meth)(**kw)
            out = []
            # normalise each item as it comes: buffers are only valid until
            # the cursor moves
            for item in itertools.islice(it, ITER_CAP if take is None else take):
                out.append(norm(item))
            return out

        return call(consume, lmdb_base)
    if name == "new_cursor":
        old = state["cur"]
        state["cur"] = state["txn"].cursor(db=state["db"])
        return call(old.close, lmdb_base)
    if name == "close":
        # close, use the closed cursor, then carry on with a fresh one
        out = (call(cur.close, lmdb_base), call(cur.next, lmdb_base),
               call(cur.key, lmdb_base), call(lambda: cur.set_key(b"k"), lmdb_base))
        state["cur"] = state["txn"].cursor(db=state["db"])
        return out
    raise AssertionError(step)


def db_handles(pair, name):
    if name is None:
        return pair.ref.open_db(None), pair.sub.open_db(None)
    return (pair.ref.open_db(name, create=False),
            pair.sub.open_db(name, create=False))


# py-lmdb's liblmdb has a bug on DUPSORT databases: after a positioning op
# that does not find its target (set_key/get/set_key_dup/set_range_dup miss,
# ...), the main cursor counts as positioned but its duplicate sub-cursor is
# left uninitialised; a following next/prev/next_dup/prev_dup then descends
# into stale or zeroed sub-cursor state: "MDB_CORRUPTED: Located page was
# wrong type" on a valid file, wrong data, or SIGBUS/SIGSEGV/abort (seen with
# py-lmdb 3.0.0, liblmdb 0.9.3x).  The reference is undefined there, so in
# that "poisoned" state the steps that would touch the sub-cursor are skipped
# on both sides until an op re-positions the cursor.  (Non-DUPSORT databases
# are deterministic after a miss and are compared as usual: e.g. after a
# failed set_key, next() lands on the key AFTER the insertion point.)
SKIP_WHEN_POISONED = {"next", "prev", "next_dup", "prev_dup", "first_dup",
                      "last_dup", "count"}
RESETTING_ITERS = {"iternext", "iterprev", "iternext_nodup", "iterprev_nodup",
                   "__iter__"}


def skipped(step, poisoned):
    if not poisoned:
        return False
    if step[0] == "iter":
        return step[1] not in RESETTING_ITERS
    return step[0] in SKIP_WHEN_POISONED


def next_poison(step, want, poisoned, keyset):
    name = step[0]
    if name in ("set_key", "set_range", "set_key_dup", "set_range_dup"):
        return want != ("bool", True)
    if name == "get":
        return isinstance(want, Raised) or step[1] not in keyset
    if name == "getmulti":
        if isinstance(want, Raised):
            return True
        return poisoned if not step[1] else step[1][-1] not in keyset
    if name in ("first", "last", "new_cursor", "close"):
        return False
    if name in ("next_nodup", "prev_nodup"):
        return poisoned and want != ("bool", True)
    if name == "iter" and step[1] in RESETTING_ITERS:
        # py-lmdb re-positions an invalid cursor with first()/last()
        return False
    return poisoned


# getmulti() that raises ValueError midway (keyfixed=True with keys of
# different sizes) leaves the cursor wherever that implementation stopped:
# py-lmdb's C extension has already run MDB_GET_MULTIPLE on the offending key
# (value() is then the whole multi-value chunk), its cffi twin checks first.
# py-lmdb has no single answer there, so until the cursor is re-positioned
# only re-positioning steps are compared.
REPOSITIONING = {"first", "last", "set_key", "set_range", "set_key_dup",
                 "set_range_dup", "get", "getmulti", "new_cursor", "close"}


def lockstep(pair, name, program, buffers, dupsort=False, keyset=frozenset()):
    ref_db, sub_db = db_handles(pair, name)
    rtxn = pair.ref.begin(db=ref_db, buffers=buffers)
    stxn = pair.sub.begin(db=sub_db, buffers=buffers)
    poisoned = False
    undefined = False
    try:
        rs = dict(txn=rtxn, db=ref_db, cur=rtxn.cursor(db=ref_db))
        ss = dict(txn=stxn, db=sub_db, cur=stxn.cursor(db=sub_db))
        for i, step in enumerate(program):
            if undefined and step[0] not in REPOSITIONING and step[0] != "txn_get":
                continue
            if skipped(step, poisoned):
                continue
            want = run_step(rs, step, lmdb.Error)
            got = run_step(ss, step, pair.subject.Error)
            assert got == want, "step %d %r of %r:\n  py-lmdb: %r\n  subject: %r" % (
                i, step, program[:i + 1], want, got)
            if step[0] in REPOSITIONING:
                undefined = (step[0] == "getmulti" and isinstance(want, Raised)
                             and not want.is_lmdb_error)
            if dupsort:
                poisoned = next_poison(step, want, poisoned, keyset)
    finally:
        stxn.abort()
        rtxn.abort()


def check_whole(pair, models, name):
    """Full iteration both ways, txn.get of every key, stat, flags, id."""
    ref_db, sub_db = db_handles(pair, name)
    with pair.ref.begin(db=ref_db) as rtxn, pair.sub.begin(db=sub_db) as stxn:
        ref_items = list(rtxn.cursor())
        sub_items = list(stxn.cursor())
        assert sub_items == ref_items
        expect = models[name].items()
        if name is None:
            assert strip_named(ref_items, models) == expect  # checks the test logic
        else:
            assert ref_items == expect
        rc, sc = rtxn.cursor(), stxn.cursor()
        rev_ref = list(rc.iterprev()) if rc.last() else []
        rev_sub = list(sc.iterprev()) if sc.last() else []
        assert rev_sub == rev_ref == ref_items[::-1]
        for k in sorted({k for k, _ in ref_items}):
            assert stxn.get(k) == rtxn.get(k)
            if models[name].spec.dupsort:
                assert rc.set_key(k) and sc.set_key(k)
                assert sc.count() == rc.count(), k
                assert list(sc.iternext_dup()) == list(rc.iternext_dup()), k
                assert sc.last_dup() and rc.last_dup()
                assert list(sc.iterprev_dup()) == list(rc.iterprev_dup()), k
        assert stxn.stat(sub_db) == rtxn.stat(ref_db)
        assert stxn.id() == rtxn.id()
        assert sub_db.flags(stxn) == ref_db.flags(rtxn)
    assert pair.sub.stat() == pair.ref.stat()


# ---------------------------------------------------------------------------
# the tests


def _values_of(model: Model) -> List[bytes]:
    vals = []
    for k, v in model.items():
        vals.append(v)
    return sorted(set(vals))[:200]


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_cursor_lockstep(subject_name):
    @_settings(subject_name)
    @given(layout=layout_st(), data=st.data(), buffers=st.booleans())
    def inner(layout, data, buffers):
        subdir, dbs, txn_size, focus = layout
        spec = dbs[focus][0]
        note("focus db %r spec %s subdir=%s txn_size=%d" % (focus, spec.id, subdir, txn_size))

        def body(pair, models):
            model = models[focus]
            keys = sorted({k for k, _ in model.items()})
            if focus is None:
                keys += [n for n in dbs if n is not None]  # named DB records
            program = data.draw(program_st(spec, keys, _values_of(model)), label="program")
            lockstep(pair, focus, program, buffers, dupsort=spec.dupsort,
                     keyset=frozenset(keys))
            check_whole(pair, models, focus)

        with_env(subdir, dbs, txn_size, subject_name, body)

    inner()


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_every_db_whole(subject_name):
    """Every database of a random layout: iteration, gets, stats, flags."""
    @_settings(subject_name, n=60 if subject_name == "lmdbio" else 15)
    @given(layout=layout_st())
    def inner(layout):
        subdir, dbs, txn_size, _focus = layout

        def body(pair, models):
            for name in dbs:
                check_whole(pair, models, name)

        with_env(subdir, dbs, txn_size, subject_name, body)

    inner()


def _open_outcome(env, lmdb_base, *a, **kw):
    try:
        db = env.open_db(*a, **kw)
    except Exception as exc:
        return Raised(exc, lmdb_base)
    with env.begin() as txn:
        return ("ok", db.flags(txn), txn.stat(db))


@pytest.mark.parametrize("subject_name", SUBJECTS)
@pytest.mark.parametrize("subdir", [True, False])
def test_open_db(subject_name, subdir):
    specs = {s.id.encode(): (s, [("put", s.make_key(i), s.make_value(i)) for i in range(30)])
             for s in SPECS}
    specs[b"empty"] = (PLAIN, [])
    specs[None] = (PLAIN, [("put", b"plain-key", b"v")])

    def body(pair, models):
        names = [n for n in specs if n is not None]
        cases = []
        for n in names:
            cases += [((n,), {}), ((n,), dict(create=False)),
                      ((n,), dict(create=False, dupsort=True)),
                      ((n,), dict(create=False, integerkey=True, reverse_key=True))]
        cases += [((None,), {}), ((), {}), ((b"missing",), {}),
                  ((b"missing",), dict(create=False)),
                  ((b"plain-key",), dict(create=False)),   # a key, not a DB
                  ((b"plain-key",), {}),
                  (("dupsort",), dict(create=False)),      # str name
                  ((b"x" * 600,), dict(create=False))]
        for a, kw in cases:
            want = _open_outcome(pair.ref, lmdb.Error, *a, **kw)
            got = _open_outcome(pair.sub, pair.subject.Error, *a, **kw)
            assert got == want, (a, kw)
        for n in names:
            check_whole(pair, models, n)
        check_whole(pair, models, None)

    with_env(subdir, specs, 0, subject_name, body)


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_empty_environment(subject_name):
    def body(pair, models):
        assert pair.sub.stat() == pair.ref.stat()
        with pair.ref.begin() as r, pair.sub.begin() as s:
            assert list(s.cursor()) == list(r.cursor()) == []
            for m in ("first", "last", "next", "prev", "key", "item"):
                assert call(getattr(s.cursor(), m), pair.subject.Error) == \
                    call(getattr(r.cursor(), m), lmdb.Error), m
            assert s.get(b"x") is None and s.get(b"x", b"d") == b"d"
            assert s.id() == r.id()

    with_env(True, {None: (PLAIN, [])}, 0, subject_name, body)


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_environment_methods(subject_name):
    dbs = {b"one": (PLAIN, [("put", b"k", b"v")]), None: (PLAIN, [("put", b"a", b"b")])}

    def body(pair, models):
        r, s = pair.ref, pair.sub
        assert s.max_key_size() == r.max_key_size()
        assert s.max_readers() == r.max_readers()
        assert s.flags() == r.flags()
        ri, si = r.info(), s.info()
        for k in ("last_pgno", "last_txnid", "map_size", "max_readers"):
            assert si[k] == ri[k], k
        with r.begin() as rt, s.begin() as st_:
            assert st_.id() == rt.id()
            assert st_.stat(s.open_db(None)) == rt.stat(r.open_db(None))

    with_env(True, dbs, 0, subject_name, body)


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_readonly_writes_raise(subject_name):
    """Writes through every route raise what py-lmdb raises (ReadonlyError)."""
    dbs = {None: (PLAIN, [("put", b"k%d" % i, b"v") for i in range(5)])}

    def body(pair, models):
        steps = [
            lambda t, c: t.put(b"k", b"v"),
            lambda t, c: t.replace(b"k1", b"v"),
            lambda t, c: t.pop(b"k1"),
            lambda t, c: t.delete(b"k1"),
            lambda t, c: (c.first(), c.put(b"k", b"v"))[1],
            lambda t, c: (c.first(), c.delete())[1],
            lambda t, c: (c.first(), c.replace(b"k1", b"z"))[1],
            lambda t, c: (c.first(), c.pop(b"k1"))[1],
        ]
        for i, step in enumerate(steps):
            with pair.ref.begin() as rt, pair.sub.begin() as stx:
                want = call(lambda: step(rt, rt.cursor()), lmdb.Error)
                got = call(lambda: step(stx, stx.cursor()), pair.subject.Error)
                assert got == want, i
        # a write transaction on a read-only environment
        want = call(lambda: pair.ref.begin(write=True), lmdb.Error)
        got = call(lambda: pair.sub.begin(write=True), pair.subject.Error)
        assert isinstance(want, Raised) and got == want

    with_env(True, dbs, 0, subject_name, body)


def test_lmdbio_opened_readwrite_rejects_writes(tmp_path):
    """readonly=False is accepted, reads work, every write raises ReadonlyError."""
    lmdbio = import_subject("lmdbio")
    path = str(tmp_path / "env")
    write_env(path, {None: (PLAIN, [("put", b"a", b"1"), ("put", b"b", b"2")])})
    env = lmdbio.open(path, readonly=False)
    try:
        with env.begin() as txn:
            assert list(txn.cursor()) == [(b"a", b"1"), (b"b", b"2")]
            with pytest.raises(lmdbio.ReadonlyError):
                txn.put(b"c", b"3")
        with pytest.raises(lmdbio.ReadonlyError):
            with env.begin(write=True) as txn:
                txn.put(b"c", b"3")
    finally:
        env.close()


# ---------------------------------------------------------------------------
# side by side with a live py-lmdb writer (lock=True pins the snapshot)


@pytest.mark.parametrize("subdir", [True, False])
def test_snapshot_pinned_against_live_writer(tmp_path, subdir):
    """lmdbio (lock=True) reads a consistent snapshot while a py-lmdb writer
    in the same process deletes and rewrites everything: the reader slot in
    the lock file keeps liblmdb from reusing the snapshot's pages."""
    lmdbio = import_subject("lmdbio")
    path = str(tmp_path / ("env" if subdir else "env.mdb"))
    rnd = random.Random(7)
    old = {b"k%05d" % i: rnd.randbytes(rnd.choice([10, 100, 3000, 9000]))
           for i in range(600)}
    writer = lmdb.open(path, subdir=subdir, map_size=256 << 20)
    try:
        with writer.begin(write=True) as t:
            for k, v in old.items():
                t.put(k, v)
        reader = lmdbio.open(path, subdir=subdir)  # lock=True by default
        try:
            rtxn = reader.begin()
            cur = rtxn.cursor()
            assert cur.first()
            first_half = []
            for _ in range(300):
                first_half.append(cur.item())
                cur.next()
            # The writer rewrites every value and deletes half the keys, over
            # many transactions, so freed pages would be reused at once.
            for rnd_round in range(20):
                with writer.begin(write=True) as t:
                    for i, k in enumerate(old):
                        if (i + rnd_round) % 2:
                            t.delete(k)
                        else:
                            t.put(k, rnd.randbytes(len(old[k])))
            rest = list(cur.iternext())  # starts with the current item
            assert dict(first_half + rest) == old
            assert [k for k, _ in first_half + rest] == sorted(old)
            assert rtxn.get(b"k00001") == old[b"k00001"]
            rtxn.abort()
            with reader.begin() as t2:  # a new transaction sees the new data
                with writer.begin() as wt:
                    assert list(t2.cursor()) == list(wt.cursor())
        finally:
            reader.close()
    finally:
        writer.close()


def test_lock_false_touches_no_lock_file(tmp_path):
    lmdbio = import_subject("lmdbio")
    path = str(tmp_path / "env")
    write_env(path, {None: (PLAIN, [("put", b"a", b"1")])})
    os.unlink(lock_file(path))
    env = lmdbio.open(path, lock=False)
    try:
        with env.begin() as txn:
            assert txn.get(b"a") == b"1"
    finally:
        env.close()
    assert not os.path.exists(lock_file(path))
    assert os.listdir(path) == ["data.mdb"]


def test_missing_path_names_it(tmp_path):
    lmdbio = import_subject("lmdbio")
    p = str(tmp_path / "does-not-exist")
    with pytest.raises(lmdbio.Error) as ei:
        lmdbio.open(p, readonly=True)
    assert p in str(ei.value) or "does-not-exist" in str(ei.value)
    assert not os.path.exists(p), "lmdbio must never create the data file"


def test_exception_classes_exist():
    lmdbio = import_subject("lmdbio")
    for name in dir(lmdb):
        obj = getattr(lmdb, name)
        if isinstance(obj, type) and issubclass(obj, lmdb.Error):
            mine = getattr(lmdbio, name, None)
            assert isinstance(mine, type), name
            assert issubclass(mine, lmdbio.Error), name


# ---------------------------------------------------------------------------
# larger deterministic layouts (deeper trees than the hypothesis examples)


def _big_layout(kind):
    rnd = random.Random(kind)
    if kind == "deep_plain":      # 200-byte keys: depth 3+
        items = [(b"%06d" % i * 34, rnd.randbytes(rnd.choice([0, 10, 100, 3000, 9000])))
                 for i in range(3000)]
        rnd.shuffle(items)
        return PLAIN, [("put", k, v) for k, v in items]
    if kind == "many_small":
        spec = COMBOS_BY_ID["integerkey8"]
        return spec, [("put", spec.make_key(i), b"%d" % i) for i in range(20000)]
    if kind == "dups_spill":
        spec = COMBOS_BY_ID["reversekey_dupsort"]
        ops = []
        for i in range(200):
            n = 700 if i % 25 == 0 else rnd.randrange(1, 6)
            ops += [("put", spec.make_key(i), spec.dup_value(rnd.randrange(1 << 20)))
                    for _ in range(n)]
        ops += [("del", spec.make_key(i), None) for i in range(0, 200, 7)]
        return spec, ops
    if kind == "dupfixed_spill":
        spec = COMBOS_BY_ID["dupsort_integerdup8_dupfixed"]
        ops = [("put", spec.make_key(i % 40), spec.dup_value(i)) for i in range(12000)]
        return spec, ops
    raise ValueError(kind)


def _appended_env(path, subdir):
    """A truly appended layout (MDB_APPEND / MDB_APPENDDUP through py-lmdb):
    full pages laid out in key order, as dataset writers produce."""
    env = lmdb.open(path, subdir=subdir, map_size=256 << 20, max_dbs=2)
    rnd = random.Random(5)
    items = [(b"%08d" % i, rnd.randbytes(rnd.choice([5, 50, 500, 5000])))
             for i in range(5000)]
    with env.begin(write=True) as t:
        cur = t.cursor()
        for k, v in items:
            assert cur.put(k, v, append=True)
    # created afterwards: its record b"dups" sorts after the digits
    dups = env.open_db(b"dups", dupsort=True)
    with env.begin(write=True) as t:
        dc = t.cursor(db=dups)
        for i in range(300):
            for j in range(400 if i % 50 == 0 else 3):
                assert dc.put(b"d%05d" % i, b"%06d" % j, append=True)
    env.close()


RANDOM_SEEKS = 400


def _seek_compare(pair, name, keys, seed):
    rnd = random.Random(seed)
    ref_db, sub_db = db_handles(pair, name)
    with pair.ref.begin(db=ref_db) as rt, pair.sub.begin(db=sub_db) as stx:
        rc, sc = rt.cursor(), stx.cursor()
        for _ in range(RANDOM_SEEKS):
            k = rnd.choice(keys)
            if rnd.random() < 0.3:
                k = k[:-1] + bytes([(k[-1] + rnd.choice([1, 255])) & 255])
            op = rnd.choice(["set_range", "get"])
            if op == "set_range":
                assert sc.set_range(k) == rc.set_range(k)
                assert sc.item() == rc.item()
                for _ in range(rnd.randrange(0, 5)):
                    m = rnd.choice(["next", "prev", "next_nodup", "prev_nodup"])
                    assert getattr(sc, m)() == getattr(rc, m)(), m
                    assert sc.item() == rc.item(), m
            else:
                assert stx.get(k) == rt.get(k)


@pytest.mark.parametrize("subject_name", SUBJECTS)
@pytest.mark.parametrize("kind", ["deep_plain", "many_small", "dups_spill", "dupfixed_spill"])
def test_large_layouts(subject_name, kind):
    spec, ops = _big_layout(kind)
    name = b"big" if spec.flags else None

    def body(pair, models):
        check_whole(pair, models, name)
        keys = sorted({k for k, _ in models[name].items()})
        _seek_compare(pair, name, keys, kind)

    with_env(True, {name: (spec, ops)}, 1000, subject_name, body)


@pytest.mark.parametrize("subject_name", SUBJECTS)
@pytest.mark.parametrize("subdir", [True, False])
def test_appended_layout(subject_name, subdir):
    tmp = tempfile.mkdtemp(prefix="lmdbio-diff-")
    try:
        path = os.path.join(tmp, "env" if subdir else "env.mdb")
        _appended_env(path, subdir)
        pair = Pair(subject_name, path, subdir, 2, tmp)
        try:
            for name in (None, b"dups"):
                ref_db, sub_db = db_handles(pair, name)
                with pair.ref.begin(db=ref_db) as rt, pair.sub.begin(db=sub_db) as stx:
                    ref_items = list(rt.cursor())
                    assert list(stx.cursor()) == ref_items
                    assert stx.stat(sub_db) == rt.stat(ref_db)
                keys = sorted({k for k, _ in ref_items})
                _seek_compare(pair, name, keys, 1)
        finally:
            pair.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_open_db_inside_read_txn(subject_name):
    """open_db(name, txn=read_txn) and using the handle in that txn."""
    dbs = {b"a": (PLAIN, [("put", b"k%d" % i, b"v") for i in range(10)]),
           b"b": (COMBOS_BY_ID["dupsort"], [("put", b"k", b"%d" % i) for i in range(5)])}

    def body(pair, models):
        for name in (b"a", b"b", b"missing"):
            outs = []
            for env, base in ((pair.ref, lmdb.Error), (pair.sub, pair.subject.Error)):
                txn = env.begin()
                try:
                    def go():
                        db = env.open_db(name, txn=txn, create=False)
                        return list(txn.cursor(db=db)), txn.stat(db)
                    outs.append(call(go, base))
                finally:
                    txn.abort()
            assert outs[1] == outs[0], name

    with_env(True, dbs, 0, subject_name, body, max_dbs=8)


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_max_dbs_limit(subject_name):
    """py-lmdb counts opened named DBs against max_dbs: once they are all
    used, opening another (even a missing one) raises DbsFullError."""
    dbs = {b"a": (PLAIN, [("put", b"k", b"v")]), b"b": (PLAIN, [("put", b"k", b"w")]),
           b"c": (PLAIN, [])}

    def body(pair, models):
        for name in (b"a", b"b", b"c", b"missing", b"a"):
            want = _open_outcome(pair.ref, lmdb.Error, name, create=False)
            got = _open_outcome(pair.sub, pair.subject.Error, name, create=False)
            assert got == want, name

    with_env(True, dbs, 0, subject_name, body, max_dbs=2)
