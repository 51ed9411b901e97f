"""Files written by Debian's mdb_load (liblmdb's own loader, an independent
writer), read back with the subject and compared with the source data and
with py-lmdb.

Debian lmdb-utils 0.9.24's mdb_load has no -a (append) option (added in
later releases); when it is missing, the "appended" layouts load sorted
input with plain puts instead, and py-lmdb's put(append=True) provides the
truly appended layout.  Neither tool can choose the page size: every file
here has the OS page size.
"""

from __future__ import annotations

import os
import random
import subprocess
from typing import Dict, List, Optional, Sequence, Tuple

import lmdb
import pytest

from conftest import import_subject, subject_names
from lmdb_fixtures import (
    COMBOS_BY_ID, FLAG_COMBOS, MDB_DUMP, MDB_LOAD, OS_PAGE_SIZE, PLAIN, DBSpec,
    LmdbFile, Model, read_all_pylmdb, strip_named,
)

pytestmark = pytest.mark.skipif(MDB_LOAD is None,
                                reason="Debian lmdb-utils (mdb_load) not installed")

SUBJECTS = subject_names()


def _mdb_load_has_append() -> bool:
    if MDB_LOAD is None:
        return False
    r = subprocess.run([MDB_LOAD, "-a", "-V"], capture_output=True)
    return b"invalid option" not in r.stderr


HAS_APPEND = _mdb_load_has_append()

Items = List[Tuple[bytes, bytes]]


# ---------------------------------------------------------------------------
# writing dumps


def _print_escape(b: bytes) -> str:
    out = []
    for c in b:
        if c == 0x5C:
            out.append("\\\\")
        elif 0x20 <= c < 0x7F:
            out.append(chr(c))
        else:
            out.append("\\%02x" % c)
    return "".join(out)


def dump_text(items: Sequence[Tuple[bytes, bytes]], spec: DBSpec = PLAIN,
              fmt: str = "bytevalue", database: Optional[bytes] = None,
              mapsize: int = 64 << 20) -> str:
    """An mdb_dump-format text dump of `items` (in the given order)."""
    lines = ["VERSION=3", "format=%s" % fmt]
    if database is not None:
        lines.append("database=%s" % database.decode("latin-1"))
    lines += ["type=btree", "mapsize=%d" % mapsize, "maxreaders=126"]
    lines += spec.mdb_load_flags
    lines.append("HEADER=END")
    enc = (lambda b: b.hex()) if fmt == "bytevalue" else _print_escape
    for k, v in items:
        lines.append(" " + enc(k))
        lines.append(" " + enc(v))
    lines.append("DATA=END")
    return "\n".join(lines) + "\n"


def plaintext(items: Sequence[Tuple[bytes, bytes]]) -> str:
    """mdb_load -T input: key line, value line; backslash escapes."""
    def esc(b: bytes) -> str:
        out = []
        for c in b:
            if c == 0x5C:
                out.append("\\\\")
            elif 0x20 <= c < 0x7F:
                out.append(chr(c))
            else:
                out.append("\\%02x" % c)
        return "".join(out)

    return "".join(esc(k) + "\n" + esc(v) + "\n" for k, v in items)


def mdb_load(path, text: str, name: Optional[bytes] = None, subdir: bool = True,
             append: bool = False, plain: bool = False) -> None:
    if subdir:
        os.makedirs(path, exist_ok=True)
    cmd = [MDB_LOAD]
    if not subdir:
        cmd.append("-n")
    if append and HAS_APPEND:
        cmd.append("-a")
    if plain:
        cmd.append("-T")
    if name is not None:
        cmd += ["-s", name.decode("latin-1")]
    cmd.append(str(path))
    r = subprocess.run(cmd, input=text.encode("latin-1"), capture_output=True)
    assert r.returncode == 0, (cmd, r.stderr.decode(errors="replace"))


def model_items(spec: DBSpec, items: Sequence[Tuple[bytes, bytes]]) -> Items:
    m = Model(spec)
    for k, v in items:
        m.apply(("put", k, v))
    return m.items()


# ---------------------------------------------------------------------------
# reading back


def read_subject(subject, path, subdir, names) -> Dict[Optional[bytes], dict]:
    env = subject.open(str(path), subdir=subdir, readonly=True, max_dbs=max(1, len(names)))
    try:
        out = {}
        for name in names:
            db = env.open_db(name, create=False) if name is not None else env.open_db(None)
            with env.begin(db=db) as txn:
                items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
                cur = txn.cursor()
                rev = [(bytes(k), bytes(v)) for k, v in cur.iterprev()] if cur.last() else []
                gets = {k: txn.get(k) for k, _ in items}
                out[name] = dict(items=items, rev=rev, gets=gets, stat=txn.stat(db))
        out["__env_stat__"] = env.stat()
        return out
    finally:
        env.close()


def read_ref_stats(path, subdir, names):
    env = lmdb.open(str(path), subdir=subdir, readonly=True, lock=False,
                    max_dbs=max(1, len(names)))
    try:
        stats = {}
        for name in names:
            db = env.open_db(name, create=False) if name is not None else env.open_db(None)
            with env.begin() as txn:
                stats[name] = txn.stat(db)
        return stats, env.stat()
    finally:
        env.close()


def check_env(subject_name, path, subdir, expected: Dict[Optional[bytes], Items]):
    """Source data == py-lmdb == subject, for every database in `expected`."""
    names = list(expected)
    ref = read_all_pylmdb(path, subdir=subdir, names=names)
    ref_stats, ref_env_stat = read_ref_stats(path, subdir, names)
    for name, items in expected.items():
        got = strip_named(ref[name], names) if name is None else ref[name]
        assert got == items, "py-lmdb disagrees with the source data (test logic)"
    subject = import_subject(subject_name)
    sub = read_subject(subject, path, subdir, names)
    for name, items in expected.items():
        s = sub[name]
        assert s["items"] == ref[name], name
        assert s["rev"] == ref[name][::-1], name
        first_vals = {}
        for k, v in ref[name]:
            first_vals.setdefault(k, v)
        assert s["gets"] == first_vals, name
        assert s["stat"] == ref_stats[name], name
    assert sub["__env_stat__"] == ref_env_stat


def where(tmp_path, subdir):
    return tmp_path / ("env" if subdir else "env.mdb")


# ---------------------------------------------------------------------------
# data sets


def plain_items(n, seed=1, big_every=0, key_len=None) -> Items:
    rnd = random.Random(seed)
    items = []
    for i in range(n):
        k = b"%08d" % (i * 7919 % 1000003) if key_len is None else \
            (b"%08d" % i).ljust(key_len, b"k")
        size = rnd.choice([0, 1, 5, 40, 100, 400])
        if big_every and i % big_every == 0:
            size = rnd.choice([OS_PAGE_SIZE, 3 * OS_PAGE_SIZE + 17, 70000])
        items.append((k, rnd.randbytes(size)))
    return items


def dup_items(spec: DBSpec, n_keys, dups, seed=2) -> Items:
    rnd = random.Random(seed)
    items = []
    for i in range(n_keys):
        k = spec.make_key(i)
        nd = dups if i % 5 else dups * 40  # every 5th key: hundreds of dups
        for d in range(nd):
            items.append((k, spec.dup_value(rnd.randrange(1 << 20) if d % 3 else d)))
    return items


# ---------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("subject_name", SUBJECTS)
@pytest.mark.parametrize("subdir", [True, False])
def test_appended_sorted(tmp_path, subject_name, subdir):
    items = sorted(plain_items(3000, big_every=97))
    items = list(dict(items).items())
    p = where(tmp_path, subdir)
    mdb_load(p, dump_text(items), subdir=subdir, append=True)
    check_env(subject_name, p, subdir, {None: model_items(PLAIN, items)})


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_random_order_with_overflow(tmp_path, subject_name):
    items = plain_items(2500, seed=5, big_every=31)
    random.Random(3).shuffle(items)
    p = where(tmp_path, True)
    mdb_load(p, dump_text(items), subdir=True)
    exp = model_items(PLAIN, items)
    check_env(subject_name, p, True, {None: exp})
    f = LmdbFile(p)
    assert f.overflows("main"), "the data set should use overflow pages"
    assert f.branches("main"), "the data set should have branch pages"


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_max_size_keys(tmp_path, subject_name):
    rnd = random.Random(11)
    items = [(bytes([i % 256]) + rnd.randbytes(510), rnd.randbytes(i % 3 * 700))
             for i in range(400)]
    items += [(bytes([i]), b"one-byte key") for i in range(0, 256, 3)]
    p = where(tmp_path, True)
    mdb_load(p, dump_text(items), subdir=True)
    check_env(subject_name, p, True, {None: model_items(PLAIN, items)})


@pytest.mark.parametrize("subject_name", SUBJECTS)
@pytest.mark.parametrize("spec_id", [s.id for s in FLAG_COMBOS])
@pytest.mark.parametrize("where_", ["main", "named"])
def test_every_flag_combination(tmp_path, subject_name, spec_id, where_):
    """Every flag combination, in the main DB (flags py-lmdb cannot set) and
    in a named DB, loaded in random order."""
    spec = COMBOS_BY_ID[spec_id]
    if spec.dupsort:
        items = dup_items(spec, 60, 4)
    else:
        items = [(spec.make_key(i), spec.make_value(i, 5 + i % 300)) for i in range(700)]
    random.Random(spec_id).shuffle(items)
    name = None if where_ == "main" else spec_id.encode()
    p = where(tmp_path, True)
    mdb_load(p, dump_text(items, spec), name=name)
    check_env(subject_name, p, True, {name: model_items(spec, items)})


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_dupsort_appended(tmp_path, subject_name):
    spec = COMBOS_BY_ID["dupsort"]
    exp = model_items(spec, dup_items(spec, 200, 6))  # sorted: append-ready
    p = where(tmp_path, True)
    mdb_load(p, dump_text(exp, spec), append=True)
    check_env(subject_name, p, True, {None: exp})
    f = LmdbFile(p)
    assert f.dup_trees, "hundreds of dups should spill into sub-databases"
    assert f.subpages, "few dups should stay in sub-pages"


@pytest.mark.parametrize("subject_name", SUBJECTS)
@pytest.mark.parametrize("subdir", [True, False])
def test_named_dbs_several_loads(tmp_path, subject_name, subdir):
    """Several named DBs (one mdb_load -s each) plus data in the main DB."""
    p = where(tmp_path, subdir)
    expected = {}
    for i, spec in enumerate([COMBOS_BY_ID[x] for x in
                              ("plain", "dupsort_dupfixed", "integerkey8", "reversekey",
                               "dupsort_reversedup")]):
        name = b"db-%d-%s" % (i, spec.id.encode())
        items = dup_items(spec, 30, 3) if spec.dupsort else \
            [(spec.make_key(j), spec.make_value(j, 20 + j % 3000)) for j in range(300)]
        mdb_load(p, dump_text(items, spec), name=name, subdir=subdir)
        expected[name] = model_items(spec, items)
    main = [(b"main-%04d" % j, b"m" * (j % 50)) for j in range(200)]
    mdb_load(p, dump_text(main), subdir=subdir)
    expected[None] = model_items(PLAIN, main)
    empty = b"empty-db"
    mdb_load(p, dump_text([]), name=empty, subdir=subdir)
    expected[empty] = []
    check_env(subject_name, p, subdir, expected)


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_multi_section_dump(tmp_path, subject_name):
    """One input holding several `database=` sections (as mdb_dump -a writes)."""
    a = [(b"a%03d" % i, b"x" * i) for i in range(100)]
    b_spec = COMBOS_BY_ID["dupsort_integerdup4"]
    b = dup_items(b_spec, 20, 5)
    text = dump_text(a, database=b"alpha") + dump_text(b, b_spec, database=b"beta")
    p = where(tmp_path, True)
    mdb_load(p, text)
    check_env(subject_name, p, True, {b"alpha": model_items(PLAIN, a),
                                      b"beta": model_items(b_spec, b)})


# mdb_load 0.9.24 decodes "\\\\" (an escaped backslash) in format=print and -T
# input wrongly once an earlier escape has shortened the line (it skips the
# output byte instead of writing a backslash), so these data sets contain no
# backslashes.


def _no_backslash(b: bytes) -> bytes:
    return b.replace(b"\\", b"/")


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_print_format(tmp_path, subject_name):
    rnd = random.Random(9)
    items = [(_no_backslash(rnd.randbytes(rnd.randrange(1, 30))) + b"\n ",
              _no_backslash(rnd.randbytes(rnd.randrange(0, 60))))
             for _ in range(500)]
    p = where(tmp_path, True)
    mdb_load(p, dump_text(items, fmt="print"), name=b"printed")
    check_env(subject_name, p, True, {b"printed": model_items(PLAIN, items)})


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_plaintext_T(tmp_path, subject_name):
    rnd = random.Random(10)
    items = [(b"key/%d\x01" % i,
              _no_backslash(rnd.randbytes(rnd.randrange(0, 3000))).replace(b"\n", b"n"))
             for i in range(300)]
    p = where(tmp_path, True)
    mdb_load(p, plaintext(items), name=b"plain-T", plain=True)
    mdb_load(p, plaintext(items[:50]), plain=True)  # and the main DB
    check_env(subject_name, p, True, {b"plain-T": model_items(PLAIN, items),
                                      None: model_items(PLAIN, items[:50])})


@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_big_values(tmp_path, subject_name):
    rnd = random.Random(12)
    sizes = [OS_PAGE_SIZE - 16, OS_PAGE_SIZE - 15, OS_PAGE_SIZE, 2 * OS_PAGE_SIZE - 16,
             2 * OS_PAGE_SIZE - 15, 1 << 20, 3 << 20, 2040, 2041, 2100, 0, 1]
    items = [(b"big%03d" % i, rnd.randbytes(s)) for i, s in enumerate(sizes)]
    rnd.shuffle(items)
    p = where(tmp_path, False)
    mdb_load(p, dump_text(items, mapsize=256 << 20), subdir=False)
    check_env(subject_name, p, False, {None: model_items(PLAIN, items)})


@pytest.mark.skipif(MDB_DUMP is None, reason="mdb_dump not installed")
def test_dump_roundtrip_fixture_logic(tmp_path):
    """Check of this file's dump writer: mdb_dump gives back what we loaded."""
    spec = COMBOS_BY_ID["dupsort_reversedup"]
    items = model_items(spec, dup_items(spec, 10, 3))
    p = where(tmp_path, True)
    mdb_load(p, dump_text(items, spec), name=b"rt")
    out = subprocess.run([MDB_DUMP, "-s", "rt", str(p)], capture_output=True,
                         check=True).stdout.decode()
    body = out.split("HEADER=END\n", 1)[1].split("DATA=END", 1)[0].split()
    got = [(bytes.fromhex(body[i]), bytes.fromhex(body[i + 1]))
           for i in range(0, len(body), 2)]
    assert got == items
    assert "reversedup=1" in out and "dupsort=1" in out
