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
    assert rc == 1 and "nothing-here" in out


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
