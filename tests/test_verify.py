"""``lmdbio verify``: exit 0 with no output but the summary on every clean
layout; on every damaged file, exit 1 and report a problem that names the
damaged page.

Damaged files come from two sources: every case of test_corrupt.py (the
same makers, so the two files try the same corruptions), and cases only a
verifier can find because liblmdb, py-lmdb and lmdbio's readers all read
them without complaint (two branch children pointing at one leaf, children
out of key order, keys out of order in a leaf, wrong counts in a database
record, leaked pages, a page both in use and free, ...).  The command runs
in a subprocess (a crash fails the test) with a timeout.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import subprocess
import sys

import pytest

from conftest import import_subject
from lmdb_fixtures import (
    COMBOS_BY_ID, FLAG_COMBOS, MD_BRANCH, MD_ENTRIES, MD_LEAF, MD_OVERFLOW,
    MM_LAST_PG, PAGEHDRSZ, PLAIN, LmdbFile, data_file, make_all_flags_env,
    mdb_load_create, MDB_LOAD, patch, patch_dbrec, sample_ops,
    set_branch_child, write_env, write_items,
)
import test_corrupt
from test_corrupt import bases  # noqa: F401  (the module-scoped fixture)

TIMEOUT = 120


def run_verify(path, *args):
    proc = subprocess.run([sys.executable, "-m", "lmdbio", "verify"] + list(args)
                          + [path], capture_output=True, timeout=TIMEOUT,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    return proc.returncode, proc.stdout.decode(errors="replace"), \
        proc.stderr.decode(errors="replace")


def names_page(text, pgnos):
    return any(re.search(r"(?<![0-9])%d(?![0-9])" % p, text) for p in pgnos)


@pytest.fixture(autouse=True)
def _lmdbio():
    import_subject("lmdbio")


# ---------------------------------------------------------------------------
# clean files: many layouts


def _churn(spec, seed, n=2500, keys=300, big=True):
    r = random.Random(seed)
    ops = []
    for i in range(n):
        k = spec.make_key(r.randrange(keys))
        if r.random() < 0.3:
            ops.append(("del", k, None))
        elif spec.dupsort:
            ops.append(("put", k, spec.dup_value(r.randrange(3000))))
        else:
            ops.append(("put", k, spec.make_value(
                i, r.choice([10, 200, 6000] if big else [10, 200]))))
    return ops


def _bigdups(spec, seed):
    r = random.Random(seed)
    ops = []
    for i in range(6000):
        k = spec.make_key(r.randrange(4))
        kind = "del" if r.random() < 0.2 else "put"
        ops.append((kind, k, spec.dup_value(r.randrange(3000))))
    return ops


CLEAN = ["all_flags", "all_flags_nosubdir", "empty", "empty_named",
         "mdb_load_main_flags", "presized", "big_plain_random"] + \
    ["churn_" + s.id for s in FLAG_COMBOS] + \
    ["bigdups_" + s.id for s in FLAG_COMBOS if s.dupsort]


def make_clean(kind, d):
    """Write a clean environment of this kind at d; (path, args)."""
    if kind == "all_flags":
        make_all_flags_env(d)
    elif kind == "all_flags_nosubdir":
        os.makedirs(d)
        p = os.path.join(d, "file.mdb")
        make_all_flags_env(p, subdir=False)
        return p, ["-n"]
    elif kind == "empty":
        write_env(d, {None: (PLAIN, [])})
    elif kind == "empty_named":
        write_env(d, {None: (PLAIN, []), b"a": (PLAIN, []), b"b": (PLAIN, [])})
    elif kind == "mdb_load_main_flags":
        if MDB_LOAD is None:
            pytest.skip("mdb_load (lmdb-utils) is not installed")
        spec = COMBOS_BY_ID["integerkey4_dupsort"]
        write_env(d, {None: (spec, _churn(spec, 7, n=1500))})
    elif kind == "presized":
        write_items(d, [(b"k%04d" % i, b"v" * (i % 50)) for i in range(500)],
                    map_size=64 << 20)
        with open(data_file(d), "ab") as f:  # pre-sized past mm_last_pg
            f.truncate(os.path.getsize(data_file(d)) + (1 << 20))
    elif kind == "big_plain_random":
        r = random.Random(5)
        ops = []
        for i in range(20000):
            k = b"%d" % r.randrange(6000)
            ops.append(("del", k, None) if r.random() < 0.4 else
                       ("put", k, r.randbytes(r.choice([5, 50, 300, 5000]))))
        write_env(d, {None: (PLAIN, ops)}, txn_size=301, map_size=256 << 20)
    elif kind.startswith("churn_"):
        spec = COMBOS_BY_ID[kind[6:]]
        if spec.needs_mdb_load and MDB_LOAD is None:
            pytest.skip("mdb_load (lmdb-utils) is not installed")
        write_env(d, {None: (PLAIN, []), b"x": (spec, _churn(spec, kind)),
                      b"y": (PLAIN, sample_ops(PLAIN, 50))}, txn_size=37)
    elif kind.startswith("bigdups_"):
        spec = COMBOS_BY_ID[kind[8:]]
        if spec.needs_mdb_load and MDB_LOAD is None:
            pytest.skip("mdb_load (lmdb-utils) is not installed")
        write_env(d, {None: (PLAIN, []), b"x": (spec, _bigdups(spec, kind))},
                  txn_size=499)
    else:
        raise ValueError(kind)
    return d, []


@pytest.mark.parametrize("kind", CLEAN)
def test_clean_file(kind, tmp_path):
    path, args = make_clean(kind, str(tmp_path / "env"))
    rc, out, err = run_verify(path, *args)
    assert rc == 0, out + err
    assert out.count("\n") == 1 and ": ok: " in out, out
    if kind.startswith(("churn_", "big_plain")):
        assert not re.search(r" 0 free pages", out), out  # the free DB was walked


def test_clean_named_db_only(tmp_path):
    d = str(tmp_path / "env")
    make_all_flags_env(d)
    for name in ("dupsort", "dupsort_dupfixed", "empty"):
        rc, out, err = run_verify(d, "-s", name)
        assert rc == 0, out + err
    rc, out, err = run_verify(d, "-s", "no-such-db")
    assert rc == 1 and "no-such-db" in err


def test_api_and_progress(tmp_path):
    d = str(tmp_path / "env")
    write_items(d, [(b"%06d" % i, b"x" * 100) for i in range(50000)])
    from lmdbio.verify import verify
    seen = []
    problems, st = verify(d, progress=lambda done, total: seen.append(done),
                          progress_every=50)
    assert problems == [] and st["pages_read"] > 1100
    assert seen and seen == sorted(seen) and seen[0] == 50
    rc, out, err = run_verify(d, "--progress")
    assert rc == 0 and "pages read" in err, err
    rc, out, err = run_verify(d)  # not a terminal: no progress
    assert rc == 0 and err == "", err


def test_usage(tmp_path):
    rc, out, err = run_verify(str(tmp_path), "-x")
    assert rc == 2 and "usage" in err
    rc, out, err = run_verify(str(tmp_path / "nothing-here"))
    assert rc == 1 and "nothing-here" in err and err.count("\n") == 1, err
    rc, out, err = run_verify(str(tmp_path))  # a directory without data.mdb
    assert rc == 1 and "no data.mdb" in err and err.count("\n") == 1, err
    f = tmp_path / "file"
    f.write_bytes(b"x" * 100)
    rc, out, err = run_verify(str(f))  # a file without -n
    assert rc == 1 and "-n" in err and err.count("\n") == 1, err
    rc, out, err = run_verify(str(f), "-n")  # not an LMDB file: said on stdout
    assert rc == 1 and "not an LMDB file" in out and "Traceback" not in err
    for h in ("--help", "-h"):
        rc, out, err = run_verify(str(tmp_path), h)
        assert rc == 0 and out.startswith("usage:") and "-m max-problems" in out
    rc, out, err = run_verify(str(tmp_path), "--frobnicate")
    assert rc == 2 and "--frobnicate" in err and "Traceback" not in err


# ---------------------------------------------------------------------------
# every corruption case of test_corrupt.py


@pytest.mark.parametrize("case", test_corrupt.case_params())
def test_corrupt_case(case, bases, tmp_path):  # noqa: F811
    made, _f = test_corrupt.prepare(case, bases, tmp_path)
    args = [] if made.subdir else ["-n"]
    rc, out, err = run_verify(made.path, *args)
    assert rc == 1, "verify passed a damaged file (%s):\n%s%s" % (case.id, out, err)
    assert "Traceback" not in err, err
    if made.pgnos:
        assert names_page(out, made.pgnos), \
            "no problem names one of pages %s:\n%s" % (list(made.pgnos)[:8], out)


# ---------------------------------------------------------------------------
# damage only a verifier finds (readers go on without noticing)


def _copy(src, dst):
    os.makedirs(dst)
    shutil.copyfile(data_file(src), data_file(dst))
    return dst


@pytest.fixture(scope="module")
def churned(tmp_path_factory):
    """A tree of depth 3 with overflow values, written in many transactions
    so that the free DB holds records."""
    d = str(tmp_path_factory.mktemp("churned") / "env")
    r = random.Random(3)
    ops = [("put", (b"%05d" % i) * 40, r.randbytes(5000 if i % 10 == 3 else 40))
           for i in range(600)]
    ops += [("del", (b"%05d" % i) * 40, None) for i in range(0, 600, 7)]
    ops += [("put", (b"%05d" % i) * 40, r.randbytes(60)) for i in range(1, 600, 11)]
    write_env(d, {None: (PLAIN, ops)}, txn_size=50)
    f = LmdbFile(d)
    assert f.meta.main_db.depth == 3 and f.overflows() and f.of_db("free")
    return d


def _level1(f):
    return [p for p in f.branches("main") if p.level == 1]


def _free_records(f):
    """(node, count, [pgnos]) of the free DB's inline records."""
    out = []
    for p in f.leaves("free"):
        for nd in p.nodes:
            if nd.flags == 0:
                n = struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
                pg = list(struct.unpack_from("<%dQ" % n, f.buf, nd.data_offset + 8))
                out.append((nd, n, pg))
    return out


def v_two_children_one_leaf(d, f):
    br = _level1(f)[0]
    set_branch_child(data_file(d), br.nodes[2], br.nodes[1].child)
    # the leaf is reached twice; the orphaned one is neither used nor free
    return [br.nodes[1].child, br.nodes[2].child], r"second time|neither"


def v_children_swapped(d, f):
    br = _level1(f)[0]
    a, b = br.nodes[1], br.nodes[2]
    set_branch_child(data_file(d), a, b.child)
    set_branch_child(data_file(d), b, a.child)
    return [a.child, b.child], r"key order"


def v_leaf_keys_swapped(d, f):
    leaf = f.leaves("main")[3]
    off = leaf.pgno * f.psize + PAGEHDRSZ
    p0, p1 = struct.unpack_from("<HH", f.buf, off)
    patch(data_file(d), off, "<HH", p1, p0)
    return [leaf.pgno], r"out of order"


def v_branch_keys_swapped(d, f):
    root = f.pages[f.meta.main_db.root]
    off = root.pgno * f.psize + PAGEHDRSZ + 2
    p1, p2 = struct.unpack_from("<HH", f.buf, off)
    patch(data_file(d), off, "<HH", p2, p1)
    return [root.pgno], r"out of order|key order"


def _main_rec(f):
    return f.meta.main_db


def v_entries(d, f):
    patch_dbrec(data_file(d), _main_rec(f), MD_ENTRIES, "<Q", _main_rec(f).entries + 1)
    return [f.meta.index], r"md_entries"


def v_leaf_pages(d, f):
    patch_dbrec(data_file(d), _main_rec(f), MD_LEAF, "<Q", _main_rec(f).leaf_pages - 1)
    return [f.meta.index], r"md_leaf_pages"


def v_branch_pages(d, f):
    patch_dbrec(data_file(d), _main_rec(f), MD_BRANCH, "<Q", 0)
    return [f.meta.index], r"md_branch_pages"


def v_overflow_pages(d, f):
    patch_dbrec(data_file(d), _main_rec(f), MD_OVERFLOW, "<Q",
                _main_rec(f).overflow_pages + 2)
    return [f.meta.index], r"md_overflow_pages"


def v_free_entry_dropped(d, f):
    nd, n, pgs = [r for r in _free_records(f) if r[1] >= 2][0]
    patch(data_file(d), nd.data_offset, "<Q", n - 1)
    return [pgs[-1]], r"neither reachable nor listed free"


def v_free_lists_used_page(d, f):
    nd, n, pgs = _free_records(f)[0]
    leaf = f.leaves("main")[2]
    patch(data_file(d), nd.data_offset + 8, "<Q", leaf.pgno)
    return [leaf.pgno], r"both reachable and listed free"


def v_free_lists_page_twice(d, f):
    nd, n, pgs = [r for r in _free_records(f) if r[1] >= 2][0]
    patch(data_file(d), nd.data_offset + 16, "<Q", pgs[0])
    return [pgs[0]], r"listed free twice"


def v_free_count_huge(d, f):
    nd, n, pgs = _free_records(f)[0]
    patch(data_file(d), nd.data_offset, "<Q", 1 << 60)
    return [nd.pgno], r"lists \d+ pages in"


def v_overflow_shared(d, f):
    nodes = f.bigdata_nodes()
    a, b = nodes[0], nodes[1]
    ov = struct.unpack_from("<Q", f.buf, a.data_offset)[0]
    patch(data_file(d), b.data_offset, "<Q", ov)
    return [ov], r"second time"


def v_last_pg_grown(d, f):
    last = f.meta.last_pg
    with open(data_file(d), "ab") as fh:
        fh.truncate(max(os.path.getsize(data_file(d)), (last + 10) * f.psize))
    patch(data_file(d), f.meta.offset + MM_LAST_PG, "<Q", last + 5)
    return [last + 1], r"neither reachable nor listed free"


def v_last_pg_past_file(d, f):
    last = f.meta.last_pg
    patch(data_file(d), f.meta.offset + MM_LAST_PG, "<Q", last + 1000)
    return [last + 1], r"past the end of the file"


def v_free_txnid_future(d, f):
    nd, n, pgs = _free_records(f)[0]
    patch(data_file(d), nd.key_offset, "<Q", f.meta.txnid + 100)
    return [nd.pgno], r"after the snapshot"


VCASES = {k[2:]: v for k, v in dict(globals()).items() if k.startswith("v_")}


@pytest.mark.parametrize("name", sorted(VCASES))
def test_verifier_only_damage(name, churned, tmp_path):
    d = _copy(churned, str(tmp_path / "case"))
    f = LmdbFile(churned)
    pgnos, pattern = VCASES[name](d, f)
    rc, out, err = run_verify(d)
    assert rc == 1, "damage %s not found:\n%s%s" % (name, out, err)
    assert re.search(pattern, out), out
    assert names_page(out, pgnos), "no problem names pages %s:\n%s" % (pgnos, out)


def test_pristine_churned_is_clean(churned):
    rc, out, err = run_verify(churned)
    assert rc == 0, out + err


def test_many_problems_are_bounded(churned, tmp_path):
    """Every leaf damaged: one line per problem, stopped at -m."""
    d = _copy(churned, str(tmp_path / "case"))
    f = LmdbFile(churned)
    for leaf in f.leaves("main"):
        off = leaf.pgno * f.psize + PAGEHDRSZ
        p0, p1 = struct.unpack_from("<HH", f.buf, off)
        patch(data_file(d), off, "<HH", p1, p0)
    rc, out, err = run_verify(d, "-m", "0")
    assert rc == 1 and out.count("out of order") == len(f.leaves("main"))
    rc, out, err = run_verify(d, "-m", "5")
    assert rc == 1 and out.count("\n") == 6 and "stopped at the limit" in out


# ---------------------------------------------------------------------------
# what every liblmdb 0.9.x writes passes: the page counts of DUPSORT records
#
# liblmdb 0.9.24 (Debian's mdb_load) counts only a DUPSORT tree's own pages
# in its record; later versions (py-lmdb's) add the pages of its duplicate
# sub-trees and do not take back those of a set of duplicates deleted whole.
# Both are healthy files: verify passes them and says so in a note.

needs_mdb_load = pytest.mark.skipif(
    MDB_LOAD is None, reason="Debian lmdb-utils (mdb_load) not installed")


def _load_text(items, spec, name=None):
    lines = ["VERSION=3", "format=bytevalue", "type=btree",
             "mapsize=%d" % (256 << 20), "maxreaders=126"]
    if name is not None:
        lines.insert(2, "database=%s" % name)
    lines += spec.mdb_load_flags + ["HEADER=END"]
    for k, v in items:
        lines += [" " + k.hex(), " " + v.hex()]
    return ("\n".join(lines + ["DATA=END"]) + "\n").encode()


def mdb_load_items(path, items, spec, name=None):
    os.makedirs(path, exist_ok=True)
    cmd = [MDB_LOAD] + (["-s", name] if name else []) + [path]
    subprocess.run(cmd, input=_load_text(items, spec), check=True,
                   capture_output=True)


def _dup_items(spec, seed, keys, per_key, deep=0):
    """Sorted (key, value) pairs: `keys` keys with 1..per_key duplicates,
    plus one key with `deep` duplicates (a sub-tree of depth >= 2)."""
    r = random.Random(seed)
    items = set()
    for k in range(keys):
        for i in r.sample(range(50000), r.choice([1, 2, 5, per_key])):
            items.add((spec.make_key(k), spec.dup_value(i)))
    for i in range(deep):
        items.add((spec.make_key(keys), spec.dup_value(i)))
    return sorted(items)


MDB_LOAD_KINDS = ["dupsort_main", "dupsort_named", "dupsort_dupfixed_named",
                  "dupsort_integerdup4_named", "deep_dups", "reloaded"]


@needs_mdb_load
@pytest.mark.parametrize("kind", MDB_LOAD_KINDS)
def test_files_written_by_mdb_load_pass(kind, tmp_path):
    d = str(tmp_path / "env")
    spec = COMBOS_BY_ID["dupsort"]
    if kind == "dupsort_main":
        mdb_load_items(d, _dup_items(spec, 1, 60, 400), spec)
    elif kind == "deep_dups":
        mdb_load_items(d, _dup_items(spec, 2, 5, 50, deep=60000), spec, "tdups")
    elif kind == "reloaded":
        # several loads into one environment: the later ones reuse freed pages
        for seed in range(4):
            mdb_load_items(d, _dup_items(spec, seed, 40, 600), spec, "tdups")
            mdb_load_items(d, [(b"p%05d" % i, b"v" * (i % 700))
                               for i in range(seed * 300, seed * 300 + 400)],
                           PLAIN, "plain")
    else:
        spec = COMBOS_BY_ID[kind[:-len("_named")]]
        mdb_load_items(d, _dup_items(spec, 3, 60, 400), spec, "tdups")
    rc, out, err = run_verify(d)
    assert rc == 0, out + err
    assert ": ok: " in out and "Traceback" not in err
    # the sub-trees' pages are left out of the record: a note, naming why
    assert re.search(r"^note: .*0\.9\.24", out, re.M), out
    assert "problem" not in out


def _pylmdb_dups(d, spec, whole_deletes):
    import lmdb
    env = lmdb.open(d, max_dbs=2, map_size=256 << 20)
    db = env.open_db(b"tdups", **spec.pylmdb_kwargs)
    with env.begin(write=True) as txn:
        for k, v in _dup_items(spec, 5, 12, 3000, deep=20000):
            txn.put(k, v, db=db)
    if whole_deletes:
        with env.begin(write=True) as txn:
            for k in range(0, 12, 2):
                txn.delete(spec.make_key(k), db=db)
            txn.delete(spec.make_key(12), db=db)
    env.close()


@pytest.mark.parametrize("whole_deletes", [False, True])
@pytest.mark.parametrize("spec_id", ["dupsort", "dupsort_dupfixed"])
def test_files_written_by_pylmdb_pass(spec_id, whole_deletes, tmp_path):
    d = str(tmp_path / "env")
    _pylmdb_dups(d, COMBOS_BY_ID[spec_id], whole_deletes)
    rc, out, err = run_verify(d)
    assert rc == 0, out + err
    notes = re.findall(r"^note: .*", out, re.M)
    if whole_deletes:
        # the deleted sets' pages stay in the count: said, not flagged
        assert notes and all("deleted" in n for n in notes), out
    else:
        assert notes == [], out  # the count is exact: nothing to say


@needs_mdb_load
def test_dupsort_counts_do_not_hide_damage(tmp_path):
    """The notes cover only md_branch_pages / md_leaf_pages of DUPSORT
    records; md_entries there and every count elsewhere stay exact."""
    d = str(tmp_path / "env")
    spec = COMBOS_BY_ID["dupsort"]
    mdb_load_items(d, _dup_items(spec, 1, 60, 400), spec, "tdups")
    mdb_load_items(d, [(b"p%05d" % i, b"v" * 300) for i in range(400)],
                   PLAIN, "plain")
    f = LmdbFile(d)
    for name, field in ((b"tdups", MD_ENTRIES), (b"plain", MD_LEAF)):
        case = str(tmp_path / ("case_" + name.decode()))
        _copy(d, case)
        rec = f.named[name]
        patch_dbrec(data_file(case), rec, field, "<Q",
                    (rec.entries if field == MD_ENTRIES else rec.leaf_pages) + 1)
        rc, out, err = run_verify(case)
        assert rc == 1, out + err
        assert names_page(out, [f.named_nodes[name].pgno]), out


# ---------------------------------------------------------------------------
# invariants added by the review of the format notes


def v_node_in_free_space(d, f):
    """Node 0 copied into the free space and its pointer moved there: every
    key is still in place and in order, the page reads the same."""
    for leaf in f.leaves("main"):
        base = leaf.pgno * f.psize
        lower, upper = struct.unpack_from("<HH", f.buf, base + 12)
        nd = leaf.nodes[0]
        size = 8 + nd.ksize + (8 if nd.flags & 1 else nd.dsize)
        at = (lower + 2) & ~1
        if at + size <= upper:
            break
    else:
        raise AssertionError("no leaf with room for a copy of its node 0")
    patch_bytes_at = nd.offset
    node = f.buf[patch_bytes_at:patch_bytes_at + size]
    with open(data_file(d), "r+b") as fh:
        fh.seek(base + at)
        fh.write(node)
    patch(data_file(d), base + PAGEHDRSZ, "<H", at)
    return [leaf.pgno], r"free space"


def v_node_area_gap(d, f):
    leaf = f.leaves("main")[5]
    off = leaf.pgno * f.psize + 14  # mp_upper two bytes lower: a gap
    upper = struct.unpack_from("<H", f.buf, off)[0]
    patch(data_file(d), off, "<H", upper - 2)
    return [leaf.pgno], r"node area"


def v_free_list_unsorted(d, f):
    nd, n, pgs = [r for r in _free_records(f) if r[1] >= 2][0]
    patch(data_file(d), nd.data_offset + 8, "<Q", pgs[1])
    patch(data_file(d), nd.data_offset + 16, "<Q", pgs[0])
    return [nd.pgno], r"descending order"


def v_other_meta_root(d, f):
    other = 1 - f.meta.index
    base = other * f.psize
    last = struct.unpack_from("<Q", f.buf, base + MM_LAST_PG)[0]
    patch(data_file(d), base + 88 + 40, "<Q", last + 3)  # main DB root
    return [other], r"meta page %d" % other


REVIEWED = {fn.__name__[2:]: fn for fn in (
    v_node_in_free_space, v_node_area_gap, v_free_list_unsorted,
    v_other_meta_root)}


@pytest.mark.parametrize("name", sorted(REVIEWED))
def test_reviewed_invariants(name, churned, tmp_path):
    """Damage that liblmdb and the readers go on with; verify finds it."""
    d = _copy(churned, str(tmp_path / "case"))
    f = LmdbFile(churned)
    pgnos, pattern = REVIEWED[name](d, f)
    rc, out, err = run_verify(d)
    assert rc == 1, "damage %s not found:\n%s%s" % (name, out, err)
    assert re.search(pattern, out), out
    assert names_page(out, pgnos), "no problem names pages %s:\n%s" % (pgnos, out)
