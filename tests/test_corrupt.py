"""Damaged files: lmdbio must raise, in every case, a subclass of its Error
whose message names the file and, wherever the damage is on a page, says
"page N" for that page (only damage to the file as a whole: missing, empty,
not LMDB, has none); it must never crash, hang, allocate without bound,
read a damaged file successfully, or raise a foreign exception.

Each case copies a pristine environment written by py-lmdb, patches bytes
at offsets computed by parsing the file (lmdb_fixtures.LmdbFile), and runs
open / begin / stat / full iteration both ways / get / txn.stat / open_db of
named DBs in a *subprocess* (a segfault fails the test instead of killing
pytest) with a timeout and an address-space limit (a 4 GiB allocation fails).

Against py-lmdb (the logic check of this file) the expectations differ: py-lmdb
maps the file and trusts much of it, so for each case we record what py-lmdb
does ("PYLMDB" column): raise a given class, read without noticing, or crash.
A crash there is a real liblmdb weakness, not a test failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pytest

from conftest import import_subject, subject_names
from lmdb_fixtures import (
    COMBOS_BY_ID, DUPFIXED, DUPSORT, F_BIGDATA, F_DUPDATA, F_SUBDATA, MD_DEPTH,
    MD_FLAGS, MD_PAD, MD_ROOT, MM_LAST_PG, MM_MAGIC, MM_PSIZE, MM_VERSION,
    P_BRANCH, P_DIRTY, P_LEAF, P_LEAF2, PAGEHDRSZ, PLAIN, LmdbFile,
    data_file, patch, patch_bytes, patch_dbrec, patch_page_header, sample_ops,
    set_branch_child, set_leaf_dsize, truncate, write_env, write_items,
)

SUBJECTS = subject_names()
TIMEOUT = 60          # seconds per case (they take well under one)
ADDRESS_LIMIT = 3 << 30  # RLIMIT_AS for the child: no 4 GiB buffers


# ---------------------------------------------------------------------------
# the child process


CHILD = r'''
import hashlib, importlib, json, os, resource, sys
cfg = json.loads(sys.argv[1])
lim = cfg["address_limit"]
# Under AddressSanitizer (make test-sanitize) the shadow memory cannot live
# under RLIMIT_AS; ASAN_OPTIONS=max_allocation_size_mb caps allocations.
if not os.environ.get("LMDBIO_SANITIZE"):
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
mod = importlib.import_module(cfg["module"])
results = []

def digest(items):
    h = hashlib.sha256()
    n = 0
    for k, v in items:
        k, v = bytes(k), bytes(v)
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
        n += 1
    return [n, h.hexdigest()]

def record(op, fn):
    try:
        r = fn()
    except BaseException as e:
        results.append(dict(op=op, ok=False, type=type(e).__name__,
                            module=type(e).__module__,
                            is_error=isinstance(e, mod.Error), msg=str(e)[:2000]))
        return None, False
    plain = r if isinstance(r, (list, dict, int, str, type(None))) else None
    results.append(dict(op=op, ok=True, result=plain))
    return r, True

def read_db(env, db, tag):
    txn, ok = record("begin" + tag, lambda: env.begin(db=db))
    if not ok:
        return
    record("iterate" + tag, lambda: digest(txn.cursor()))
    def rev():
        c = txn.cursor()
        return digest(c.iterprev()) if c.last() else digest([])
    record("iterate_rev" + tag, rev)
    for i, k in enumerate(cfg["keys"].get(tag, [])):
        k = bytes.fromhex(k)
        record("get%s#%d" % (tag, i),
               lambda: (lambda v: None if v is None else bytes(v).hex())(txn.get(k)))
    record("txn_stat" + tag, lambda: dict(txn.stat(db)))
    txn.abort()

env, ok = record("open", lambda: mod.open(cfg["path"], subdir=cfg["subdir"],
                                          readonly=True, max_dbs=8))
if ok:
    record("stat", lambda: dict(env.stat()))
    read_db(env, None, "")
    for name in cfg["named"]:
        db, ok = record("open_db:" + name, lambda: env.open_db(bytes.fromhex(name), create=False))
        if ok:
            read_db(env, db, ":" + name)
    env.close()
sys.stdout.write("\n@@RESULTS@@" + json.dumps(results) + "\n")
'''


def run_child(module: str, path: str, subdir: bool, named: Sequence[bytes],
              keys: Dict[str, List[bytes]]) -> Tuple[Optional[list], subprocess.CompletedProcess]:
    cfg = dict(module=module, path=path, subdir=subdir, address_limit=ADDRESS_LIMIT,
               named=[n.hex() for n in named],
               keys={tag: [k.hex() for k in ks] for tag, ks in keys.items()})
    env = dict(os.environ)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)],
                              capture_output=True, timeout=TIMEOUT, env=env,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    except subprocess.TimeoutExpired as exc:
        pytest.fail("%s hung (no answer within %d s) on %s; partial stderr:\n%s" % (
            module, TIMEOUT, path, (exc.stderr or b"").decode(errors="replace")[-3000:]))
    out = proc.stdout.decode(errors="replace")
    if proc.returncode == 0 and "@@RESULTS@@" in out:
        return json.loads(out.rsplit("@@RESULTS@@", 1)[1]), proc
    return None, proc


def describe_crash(proc) -> str:
    rc = proc.returncode
    sig = ""
    if rc < 0:
        try:
            sig = " (%s)" % signal.Signals(-rc).name
        except ValueError:
            pass
    return "child exited %d%s\nstderr:\n%s" % (rc, sig, proc.stderr.decode(errors="replace")[-3000:])


# ---------------------------------------------------------------------------
# pristine environments


@dataclass
class Base:
    path: str           # directory (subdir=True)
    named: List[bytes]


def _tree_items():
    import random
    rnd = random.Random(1)
    # 200-byte keys: depth 3 with a few hundred records; every 10th value
    # spans two overflow pages
    return [((b"%05d" % i) * 40, rnd.randbytes(5000 if i % 10 == 3 else 40))
            for i in range(600)]


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    tree = str(root / "tree")
    write_items(tree, _tree_items())
    out["tree"] = Base(tree, [])
    named = str(root / "named")
    dups = COMBOS_BY_ID["dupsort"]
    fixed = COMBOS_BY_ID["dupsort_dupfixed"]
    ops_dups = [("put", b"many", dups.dup_value(i)) for i in range(600)]
    ops_dups += [("put", b"few%d" % i, b"v%d" % j) for i in range(20) for j in range(3)]
    write_env(named, {
        None: (PLAIN, [("put", b"plainkey%03d" % i, b"x" * 30) for i in range(20)]),
        b"plain": (PLAIN, sample_ops(PLAIN, 150, big_every=10)),
        b"dups": (dups, ops_dups),
        b"fixed": (fixed, [("put", b"k%02d" % i, fixed.dup_value(j))
                           for i in range(3) for j in range(900)]),
    })
    out["named"] = Base(named, [b"plain", b"dups", b"fixed"])
    return out


# ---------------------------------------------------------------------------
# cases


@dataclass
class Made:
    path: str
    subdir: bool = True
    named: Sequence[bytes] = ()
    keys: Dict[str, List[bytes]] = field(default_factory=dict)
    pgnos: Sequence[int] = ()       # the message must name one of these
    path_in_msg: bool = False


@dataclass
class Case:
    id: str
    base: Optional[str]             # "tree", "named" or None (made from scratch)
    make: Callable[[str, LmdbFile], Made]
    allowed: Tuple[str, ...]        # exception class names the subject may raise
    must_fail: str = "read"         # "open": open raises; "read": some op raises
    data_ok: bool = False           # successful reads must equal the pristine file's
    pylmdb: str = "any"             # what py-lmdb does: "raise:Class", "ok", "crash", "any"


PNF = "PageNotFoundError"
COR = "CorruptedError"
INV = "InvalidError"
VER = "VersionMismatchError"
ERR = "Error"


def dfile(made_dir):
    return data_file(made_dir, True)


def copy_base(base: Base, dst: str) -> str:
    os.makedirs(dst)
    shutil.copyfile(data_file(base.path), data_file(dst))
    return dst


def key_of(f: LmdbFile, pgno: int, i: int = 0) -> bytes:
    return f.pages[pgno].nodes[i].key


def some_leaf(f: LmdbFile, db="main", index=None):
    leaves = f.leaves(db)
    return leaves[len(leaves) // 2 if index is None else index]


def depth2_branch(f: LmdbFile):
    """A branch page below the root (level 1) whose children are leaves."""
    return [p for p in f.branches("main") if p.level == 1][0]


# --- file level -------------------------------------------------------------


META_PAGES = (0, 1)


def rec_page(f, rec):
    """The page holding a database record (a meta page or a leaf)."""
    return rec.offset // f.psize


def mk_missing(d, f):
    p = os.path.join(d, "no-such-env")
    return Made(p, path_in_msg=True)


def mk_dir_without_data(d, f):
    os.makedirs(d)
    return Made(d, path_in_msg=True)


def mk_empty_file(d, f):
    os.makedirs(d)
    open(dfile(d), "wb").close()
    return Made(d, path_in_msg=True)


def mk_not_lmdb(d, f):
    os.makedirs(d)
    with open(dfile(d), "wb") as fh:
        fh.write((b"This is not an LMDB file, just some text.\n" * 400)[:16384])
    return Made(d, path_in_msg=True)


def mk_not_lmdb_nosubdir(d, f):
    os.makedirs(d)
    p = os.path.join(d, "file.bin")
    with open(p, "wb") as fh:
        fh.write(bytes(range(256)) * 64)
    return Made(p, subdir=False, path_in_msg=True)


def mk_truncated_leaf(d, f):
    # the last leaf in the file, so the cut leaves the branches intact
    leaf = f.leaves()[-1]
    truncate(dfile(d), leaf.pgno * f.psize + 100)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]},
                pgnos=range(leaf.pgno, f.file_pages()))


def mk_truncated_overflow(d, f):
    ov = max(f.overflows(), key=lambda p: p.pgno)
    truncate(dfile(d), (ov.pgno + 1) * f.psize + 10)  # cut inside its 2nd page
    node = [n for n in f.bigdata_nodes() if struct.unpack_from("<Q", f.buf, n.data_offset)[0] == ov.pgno][0]
    return Made(d, keys={"": [node.key]}, pgnos=range(ov.pgno, f.file_pages()))


def _both_metas(d, f, off, fmt, value):
    for m in (0, 1):
        patch(dfile(d), m * f.psize + off, fmt, value)


def mk_big_endian(d, f):
    for m in (0, 1):
        base = m * f.psize
        magic, version = struct.unpack_from("<II", f.buf, base + MM_MAGIC)
        patch(dfile(d), base + MM_MAGIC, ">II", magic, version)
        psize = struct.unpack_from("<I", f.buf, base + MM_PSIZE)[0]
        patch(dfile(d), base + MM_PSIZE, ">I", psize)
    return Made(d, pgnos=META_PAGES)


def mk_bad_version(d, f):
    _both_metas(d, f, MM_VERSION, "<I", 2)
    return Made(d, pgnos=META_PAGES)


def mk_psize(value):
    def mk(d, f):
        _both_metas(d, f, MM_PSIZE, "<I", value)
        return Made(d, pgnos=META_PAGES)
    return mk


def mk_both_metas_bad(d, f):
    _both_metas(d, f, MM_MAGIC, "<I", 0x12345678)
    return Made(d, pgnos=META_PAGES)


def _current(f):
    return f.meta.index


def mk_meta_flags_bad(d, f):
    for m in (0, 1):
        patch_page_header(dfile(d), m, f.psize, flags=P_LEAF)
    return Made(d, pgnos=META_PAGES)


def mk_one_meta_bad(which):
    def mk(d, f):
        m = _current(f) if which == "current" else 1 - _current(f)
        patch(dfile(d), m * f.psize + MM_MAGIC, "<I", 0xDEADBEEF)
        return Made(d, pgnos=[m])
    return mk


def mk_root_past_file(d, f):
    bad = f.file_pages() + 1000
    patch_dbrec(dfile(d), f.meta.main_db, MD_ROOT, "<Q", bad)
    return Made(d, keys={"": [key_of(f, some_leaf(f).pgno)]}, pgnos=[bad])


def mk_root_beyond_last_pg(d, f):
    # the file is pre-sized past mm_last_pg (as liblmdb may leave it); the root
    # points into that unused tail, at a copy of a real leaf
    bad = f.meta.last_pg + 2
    leaf = some_leaf(f)
    with open(dfile(d), "ab") as fh:
        fh.truncate((bad + 4) * f.psize)
    page = bytearray(f.buf[leaf.pgno * f.psize:(leaf.pgno + 1) * f.psize])
    struct.pack_into("<Q", page, 0, bad)
    patch_bytes(dfile(d), bad * f.psize, bytes(page))
    patch_dbrec(dfile(d), f.meta.main_db, MD_ROOT, "<Q", bad)
    return Made(d, pgnos=[bad])


def mk_last_pg_small(d, f):
    # mm_last_pg says the file ends before the tree's pages
    patch(dfile(d), f.meta.offset + MM_LAST_PG, "<Q", 3)
    return Made(d, pgnos=[f.meta.main_db.root] + list(f.pages))


# --- tree structure -----------------------------------------------------------


def mk_pgno_mismatch(d, f):
    leaf = some_leaf(f)
    patch_page_header(dfile(d), leaf.pgno, f.psize, pgno_field=leaf.pgno + 1)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]}, pgnos=[leaf.pgno])


def mk_cycle_ancestor(d, f):
    br = depth2_branch(f)
    set_branch_child(dfile(d), br.nodes[1], f.meta.main_db.root)
    return Made(d, keys={"": [key_of(f, br.nodes[1].child)]},
                pgnos=[f.meta.main_db.root, br.pgno])


def mk_self_loop(d, f):
    br = depth2_branch(f)
    set_branch_child(dfile(d), br.nodes[2], br.pgno)
    return Made(d, keys={"": [key_of(f, br.nodes[2].child)]}, pgnos=[br.pgno])


def mk_root_self_loop(d, f):
    root = f.pages[f.meta.main_db.root]
    set_branch_child(dfile(d), root.nodes[0], root.pgno)
    return Made(d, pgnos=[root.pgno])


def mk_depth_small(d, f):
    patch_dbrec(dfile(d), f.meta.main_db, MD_DEPTH, "<H", 2)
    leaf = some_leaf(f)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]},
                pgnos=[p.pgno for p in f.branches()] + [p.pgno for p in f.leaves()])


def mk_depth_huge(d, f):
    patch_dbrec(dfile(d), f.meta.main_db, MD_DEPTH, "<H", 60000)
    # the record lives on the meta page
    return Made(d, pgnos=[f.meta.main_db.root, f.meta.index])


def mk_leaf_where_branch(d, f):
    br = depth2_branch(f)
    patch_page_header(dfile(d), br.pgno, f.psize, flags=P_LEAF)
    return Made(d, keys={"": [key_of(f, br.nodes[1].child)]}, pgnos=[br.pgno])


def mk_branch_where_leaf(d, f):
    leaf = some_leaf(f)
    patch_page_header(dfile(d), leaf.pgno, f.psize, flags=P_BRANCH)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]}, pgnos=[leaf.pgno])


def mk_overflow_where_leaf(d, f):
    leaf = some_leaf(f)
    patch_page_header(dfile(d), leaf.pgno, f.psize, flags=0x04)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]}, pgnos=[leaf.pgno])


def mk_lower_gt_upper(d, f):
    leaf = some_leaf(f)
    patch_page_header(dfile(d), leaf.pgno, f.psize, lower=leaf.upper + 2)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]}, pgnos=[leaf.pgno])


def mk_lower_odd(d, f):
    leaf = some_leaf(f)
    patch_page_header(dfile(d), leaf.pgno, f.psize, lower=leaf.lower + 1)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]}, pgnos=[leaf.pgno])


def mk_lower_past_psize(d, f):
    leaf = some_leaf(f)
    patch_page_header(dfile(d), leaf.pgno, f.psize, lower=f.psize + 200, upper=f.psize + 400)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]}, pgnos=[leaf.pgno])


def mk_lower_below_header(d, f):
    br = depth2_branch(f)
    patch_page_header(dfile(d), br.pgno, f.psize, lower=4)
    return Made(d, pgnos=[br.pgno])


def mk_node_offset_past_page(d, f):
    leaf = some_leaf(f)
    patch(dfile(d), leaf.pgno * f.psize + PAGEHDRSZ + 2, "<H", f.psize - 3)
    return Made(d, keys={"": [key_of(f, leaf.pgno, 1)]}, pgnos=[leaf.pgno])


def mk_node_offset_into_header(d, f):
    leaf = some_leaf(f)
    patch(dfile(d), leaf.pgno * f.psize + PAGEHDRSZ, "<H", 4)
    return Made(d, keys={"": [key_of(f, leaf.pgno, 0)]}, pgnos=[leaf.pgno])


def mk_key_size_past_page(d, f):
    leaf = some_leaf(f)
    node = leaf.nodes[-1]
    patch(dfile(d), node.offset + 6, "<H", f.psize)  # mn_ksize
    return Made(d, keys={"": [node.key]}, pgnos=[leaf.pgno])


def mk_branch_key_size_past_page(d, f):
    br = depth2_branch(f)
    node = br.nodes[1]
    patch(dfile(d), node.offset + 6, "<H", 60000)
    return Made(d, keys={"": [key_of(f, node.child)]}, pgnos=[br.pgno])


def mk_inline_data_too_big(d, f):
    # CVE-2019-16226 style: a node's inline data size far larger than a page
    leaf = some_leaf(f)
    node = [n for n in leaf.nodes if not n.flags & F_BIGDATA][0]
    set_leaf_dsize(dfile(d), node, 100000)
    return Made(d, keys={"": [node.key]}, pgnos=[leaf.pgno])


def mk_inline_data_past_page(d, f):
    leaf = some_leaf(f)
    node = [n for n in leaf.nodes if not n.flags & F_BIGDATA][-1]
    set_leaf_dsize(dfile(d), node, f.psize - 20)
    return Made(d, keys={"": [node.key]}, pgnos=[leaf.pgno])


def _big_node(f):
    return f.bigdata_nodes()[len(f.bigdata_nodes()) // 2]


def mk_overflow_pgno_past_file(d, f):
    node = _big_node(f)
    bad = f.file_pages() + 77
    patch(dfile(d), node.data_offset, "<Q", bad)
    return Made(d, keys={"": [node.key]}, pgnos=[bad, node.pgno])


def mk_overflow_not_overflow(d, f):
    node = _big_node(f)
    # point the value at a leaf page instead of an overflow run
    patch(dfile(d), node.data_offset, "<Q", some_leaf(f, index=0).pgno)
    return Made(d, keys={"": [node.key]}, pgnos=[some_leaf(f, index=0).pgno, node.pgno])


def mk_overflow_pages_too_small(d, f):
    node = _big_node(f)
    ov = struct.unpack_from("<Q", f.buf, node.data_offset)[0]
    patch_page_header(dfile(d), ov, f.psize, pages=1)
    return Made(d, keys={"": [node.key]}, pgnos=[ov, node.pgno])


def mk_value_4gib(d, f):
    node = _big_node(f)
    set_leaf_dsize(dfile(d), node, 0xFFFFFFFF)
    ov = struct.unpack_from("<Q", f.buf, node.data_offset)[0]
    return Made(d, keys={"": [node.key]}, pgnos=[ov, node.pgno])


def mk_value_4gib_consistent_run(d, f):
    # size and run length agree, but the run goes far past the file
    node = _big_node(f)
    set_leaf_dsize(dfile(d), node, 0xFFFFFFFF)
    ov = struct.unpack_from("<Q", f.buf, node.data_offset)[0]
    patch_page_header(dfile(d), ov, f.psize, pages=(0xFFFFFFFF + 16) // f.psize + 1)
    return Made(d, keys={"": [node.key]}, pgnos=[ov, node.pgno])


# --- CVE-2019-16224..16228 --------------------------------------------------


def mk_dupfixed_without_dupsort(d, f):
    patch_dbrec(dfile(d), f.meta.main_db, MD_FLAGS, "<H", DUPFIXED)
    return Made(d, keys={"": [key_of(f, some_leaf(f).pgno)]},
                pgnos=[rec_page(f, f.meta.main_db)])


def mk_p_dirty_on_disk(d, f):
    leaf = some_leaf(f)
    patch_page_header(dfile(d), leaf.pgno, f.psize, flags=P_LEAF | P_DIRTY)
    return Made(d, keys={"": [key_of(f, leaf.pgno)]}, pgnos=[leaf.pgno])


def mk_p_dirty_on_branch(d, f):
    br = depth2_branch(f)
    patch_page_header(dfile(d), br.pgno, f.psize, flags=P_BRANCH | P_DIRTY)
    return Made(d, pgnos=[br.pgno])


def mk_dupdata_non_dupsort(d, f):
    leaf = some_leaf(f)
    node = [n for n in leaf.nodes if not n.flags & F_BIGDATA][0]
    patch(dfile(d), node.offset + 4, "<H", F_DUPDATA)
    return Made(d, keys={"": [node.key]}, pgnos=[leaf.pgno])


def mk_subdata_non_dupsort(d, f):
    leaf = some_leaf(f)
    node = [n for n in leaf.nodes if not n.flags & F_BIGDATA][0]
    patch(dfile(d), node.offset + 4, "<H", F_DUPDATA | F_SUBDATA)
    return Made(d, keys={"": [node.key]}, pgnos=[leaf.pgno])


def mk_unknown_db_flags(d, f):
    patch_dbrec(dfile(d), f.meta.main_db, MD_FLAGS, "<H", 0x8000)
    return Made(d, pgnos=[rec_page(f, f.meta.main_db)])


# --- named DBs, duplicates ----------------------------------------------------


def mk_named_root_out_of_range(d, f):
    rec = f.named[b"plain"]
    patch_dbrec(dfile(d), rec, MD_ROOT, "<Q", 1 << 40)
    return Made(d, named=[b"plain"], pgnos=[1 << 40])


def mk_named_record_short(d, f):
    node = f.named_nodes[b"plain"]
    set_leaf_dsize(dfile(d), node, 20)
    return Made(d, named=[b"plain"], pgnos=[node.pgno])


def mk_named_record_huge(d, f):
    node = f.named_nodes[b"plain"]
    set_leaf_dsize(dfile(d), node, 50000)
    return Made(d, named=[b"plain"], pgnos=[node.pgno])


def mk_named_dupfixed_without_dupsort(d, f):
    rec = f.named[b"plain"]
    patch_dbrec(dfile(d), rec, MD_FLAGS, "<H", DUPFIXED)
    return Made(d, named=[b"plain"], pgnos=[rec_page(f, rec)])


def mk_named_integerdup_without_dupsort(d, f):
    rec = f.named[b"plain"]
    patch_dbrec(dfile(d), rec, MD_FLAGS, "<H", 0x20)
    return Made(d, named=[b"plain"], pgnos=[rec_page(f, rec)])


def mk_subdb_root_past_file(d, f):
    node, rec = f.dup_trees[0]
    bad = f.file_pages() + 55
    patch_dbrec(dfile(d), rec, MD_ROOT, "<Q", bad)
    return Made(d, named=[b"dups"], keys={":" + b"dups".hex(): [node.key]}, pgnos=[bad])


def mk_subdb_bad_flags(d, f):
    node, rec = f.dup_trees[0]
    patch_dbrec(dfile(d), rec, MD_FLAGS, "<H", DUPSORT)
    return Made(d, named=[b"dups"], keys={":" + b"dups".hex(): [node.key]},
                pgnos=[rec_page(f, rec)])


def mk_subpage_bad_lower(d, f):
    node, off = [(n, o) for n, o in f.subpages if f.pages[n.pgno].db == "dups"][0]
    patch(dfile(d), off + 12, "<H", 3000)  # sub-page mp_lower far past its size
    return Made(d, named=[b"dups"], keys={":" + b"dups".hex(): [node.key]},
                pgnos=[node.pgno])


def mk_subpage_flags(d, f):
    node, off = [(n, o) for n, o in f.subpages if f.pages[n.pgno].db == "dups"][0]
    patch(dfile(d), off + 10, "<H", P_BRANCH)
    return Made(d, named=[b"dups"], keys={":" + b"dups".hex(): [node.key]},
                pgnos=[node.pgno])


def mk_leaf2_bad_ksize(d, f):
    leaf2 = [p for p in f.pages.values() if p.flags & P_LEAF2][0]
    patch(dfile(d), leaf2.pgno * f.psize + 8, "<H", 5000)  # mp_pad = key size
    # and the md_pad of the "fixed" DB's dup trees, so either source of the
    # LEAF2 key size is out of range
    for node, rec in f.dup_trees:
        if f.pages[node.pgno].db == "fixed":
            patch_dbrec(dfile(d), rec, MD_PAD, "<I", 5000)
    return Made(d, named=[b"fixed"], pgnos=[leaf2.pgno])


def case_params():
    C = Case
    # pylmdb: what py-lmdb 3.0.0 (liblmdb 0.9.3x) does with the same file, as
    # observed; "crash" = SIGSEGV/SIGBUS/SIGABRT, "ok" = reads without noticing
    X = "crash"
    cases = [
        # file level
        C("missing_path", None, mk_missing, (ERR,), "open", pylmdb="raise:Error"),
        C("dir_without_data", None, mk_dir_without_data, (ERR, INV), "open",
          pylmdb="raise:Error"),
        # py-lmdb: Error "...: Bad file descriptor"
        C("empty_file", None, mk_empty_file, (ERR, INV), "open", pylmdb="raise:Error"),
        C("not_lmdb", None, mk_not_lmdb, (INV,), "open", pylmdb="raise:InvalidError"),
        C("not_lmdb_nosubdir", None, mk_not_lmdb_nosubdir, (INV,), "open",
          pylmdb="raise:InvalidError"),
        C("big_endian", "tree", mk_big_endian, (INV, VER), "open", pylmdb="raise:InvalidError"),
        # py-lmdb: plain Error "written with LMDB data format v2 (...)"
        C("bad_version", "tree", mk_bad_version, (VER, INV, ERR), "open", pylmdb="raise:Error"),
        C("psize_0", "tree", mk_psize(0), (INV, COR), "open", pylmdb="raise:InvalidError"),
        C("psize_1000", "tree", mk_psize(1000), (INV, COR), "open", pylmdb="raise:InvalidError"),
        C("psize_65536", "tree", mk_psize(65536), (INV, COR), "open",
          pylmdb="raise:InvalidError"),
        C("psize_256", "tree", mk_psize(256), (INV, COR), "open", pylmdb="raise:InvalidError"),
        C("both_metas_bad", "tree", mk_both_metas_bad, (INV,), "open",
          pylmdb="raise:InvalidError"),
        C("meta_page_flags", "tree", mk_meta_flags_bad, (INV,), "open",
          pylmdb="raise:InvalidError"),
        # liblmdb refuses the file when either meta page is bad, even the older
        C("one_meta_bad_old", "tree", mk_one_meta_bad("old"), (INV,), "open",
          pylmdb="raise:InvalidError"),
        C("one_meta_bad_current", "tree", mk_one_meta_bad("current"), (INV,), "open",
          pylmdb="raise:InvalidError"),
        C("truncated_leaf", "tree", mk_truncated_leaf, (PNF, COR), pylmdb=X),
        # py-lmdb returns the value with zeros for the missing bytes
        C("truncated_overflow", "tree", mk_truncated_overflow, (PNF, COR), pylmdb="ok"),
        C("root_past_file", "tree", mk_root_past_file, (PNF,),
          pylmdb="raise:PageNotFoundError"),
        C("root_beyond_last_pg", "tree", mk_root_beyond_last_pg, (PNF, COR),
          pylmdb="raise:PageNotFoundError"),
        C("last_pg_small", "tree", mk_last_pg_small, (PNF, COR),
          pylmdb="raise:PageNotFoundError"),
        # tree structure
        C("pgno_mismatch", "tree", mk_pgno_mismatch, (COR,), pylmdb="ok"),
        C("cycle_to_ancestor", "tree", mk_cycle_ancestor, (COR,), pylmdb=X),
        C("child_is_itself", "tree", mk_self_loop, (COR,), pylmdb=X),
        C("root_child_is_root", "tree", mk_root_self_loop, (COR,),
          pylmdb="raise:CursorFullError"),
        C("depth_smaller_than_tree", "tree", mk_depth_small, (COR,), pylmdb="ok"),
        # liblmdb reads this file; lmdbio refuses it (pinned: a change reads
        # it correctly or raises, consciously)
        C("depth_huge", "tree", mk_depth_huge, (COR, INV), data_ok=True, pylmdb="ok"),
        C("leaf_where_branch_expected", "tree", mk_leaf_where_branch, (COR,),
          pylmdb="raise:CorruptedError"),
        C("branch_where_leaf_expected", "tree", mk_branch_where_leaf, (COR,), pylmdb=X),
        C("overflow_where_leaf_expected", "tree", mk_overflow_where_leaf, (COR,), pylmdb=X),
        C("lower_gt_upper", "tree", mk_lower_gt_upper, (COR,), pylmdb="raise:CorruptedError"),
        C("lower_odd", "tree", mk_lower_odd, (COR,), pylmdb="ok"),
        C("lower_past_psize", "tree", mk_lower_past_psize, (COR,),
          pylmdb="raise:CorruptedError"),
        C("lower_below_header", "tree", mk_lower_below_header, (COR,),
          pylmdb="raise:CorruptedError"),
        C("node_offset_past_page", "tree", mk_node_offset_past_page, (COR,),
          pylmdb="raise:CorruptedError"),
        C("node_offset_into_header", "tree", mk_node_offset_into_header, (COR,), pylmdb="ok"),
        C("key_size_past_page", "tree", mk_key_size_past_page, (COR,),
          pylmdb="raise:CorruptedError"),
        C("branch_key_size_past_page", "tree", mk_branch_key_size_past_page, (COR,),
          pylmdb="ok"),
        C("inline_data_too_big", "tree", mk_inline_data_too_big, (COR,),
          pylmdb="raise:CorruptedError"),
        C("inline_data_past_page", "tree", mk_inline_data_past_page, (COR,),
          pylmdb="raise:CorruptedError"),
        C("overflow_pgno_past_file", "tree", mk_overflow_pgno_past_file, (PNF,),
          pylmdb="raise:PageNotFoundError"),
        C("overflow_pgno_not_overflow", "tree", mk_overflow_not_overflow, (COR,), pylmdb="ok"),
        C("overflow_pages_too_small", "tree", mk_overflow_pages_too_small, (COR,), pylmdb="ok"),
        C("value_4gib", "tree", mk_value_4gib, (COR, PNF), pylmdb=X),
        C("value_4gib_run_past_file", "tree", mk_value_4gib_consistent_run, (PNF, COR),
          pylmdb=X),
        # CVE-2019-16224..16228
        C("cve_dupfixed_without_dupsort", "tree", mk_dupfixed_without_dupsort, (INV, COR),
          pylmdb="raise:InvalidError"),
        C("cve_p_dirty_on_leaf", "tree", mk_p_dirty_on_disk, (COR,),
          pylmdb="raise:CorruptedError"),
        C("cve_p_dirty_on_branch", "tree", mk_p_dirty_on_branch, (COR,),
          pylmdb="raise:CorruptedError"),
        C("cve_dupdata_on_non_dupsort", "tree", mk_dupdata_non_dupsort, (COR, INV),
          pylmdb="raise:CorruptedError"),
        C("cve_subdata_dupdata_on_non_dupsort", "tree", mk_subdata_non_dupsort, (COR, INV),
          pylmdb="raise:CorruptedError"),
        # bits outside the persistent flags: liblmdb ignores them; lmdbio
        # refuses the record (pinned, as depth_huge)
        C("unknown_db_flags", "tree", mk_unknown_db_flags, (INV, COR), data_ok=True,
          pylmdb="ok"),
        # named DBs and duplicates
        C("named_root_out_of_range", "named", mk_named_root_out_of_range, (PNF,),
          pylmdb="raise:BadTxnError"),
        C("named_record_short", "named", mk_named_record_short,
          (COR, INV, "IncompatibleError"), pylmdb="ok"),
        C("named_record_huge", "named", mk_named_record_huge,
          (COR, INV, "IncompatibleError"), pylmdb="raise:CorruptedError"),
        C("named_dupfixed_without_dupsort", "named", mk_named_dupfixed_without_dupsort,
          (INV, COR, "IncompatibleError"), pylmdb="raise:InvalidError"),
        C("named_integerdup_without_dupsort", "named", mk_named_integerdup_without_dupsort,
          (INV, COR, "IncompatibleError"), pylmdb="raise:InvalidError"),
        C("dup_subdb_root_past_file", "named", mk_subdb_root_past_file, (PNF,),
          pylmdb="raise:PageNotFoundError"),
        C("dup_subdb_bad_flags", "named", mk_subdb_bad_flags, (COR, INV), pylmdb=X),
        C("dup_subpage_bad_lower", "named", mk_subpage_bad_lower, (COR,),
          pylmdb="raise:CorruptedError"),
        C("dup_subpage_not_leaf", "named", mk_subpage_flags, (COR,), pylmdb=X),
        C("leaf2_bad_key_size", "named", mk_leaf2_bad_ksize, (COR,), pylmdb="raise:BadTxnError"),
    ]
    return [pytest.param(c, id=c.id) for c in cases]


# ---------------------------------------------------------------------------
# running and judging


def prepare(case: Case, bases, tmp_path) -> Tuple[Made, LmdbFile]:
    d = str(tmp_path / "case")
    f = None
    if case.base is not None:
        base = bases[case.base]
        copy_base(base, d)
        f = LmdbFile(base.path)
    made = case.make(d, f)
    if case.base == "named" and not made.named:
        made.named = list(bases["named"].named)
    return made, f


def pristine_results(case, bases, made, tmp_path):
    """What reading the undamaged file gives (same ops, same keys)."""
    if case.base is None:
        return None
    d = str(tmp_path / "pristine")
    copy_base(bases[case.base], d)
    res, proc = run_child("lmdb", d, True, made.named, made.keys)
    assert res is not None, describe_crash(proc)
    return {r["op"]: r for r in res}


def names_a_page(msg: str, pgnos: Sequence[int]) -> bool:
    """MSG says "page N" for one of PGNOS (not just the number somewhere)."""
    return any(re.search(r"\bpage %d(?![0-9])" % p, msg) for p in pgnos)


@pytest.mark.parametrize("case", case_params())
@pytest.mark.parametrize("subject_name", SUBJECTS)
def test_corrupt(subject_name, case, bases, tmp_path):
    import_subject(subject_name)  # skip/fail early when it is not importable
    made, _f = prepare(case, bases, tmp_path)
    res, proc = run_child(subject_name, made.path, made.subdir, made.named, made.keys)

    if subject_name == "lmdb":
        return judge_pylmdb(case, res, proc)

    assert res is not None, "no crash allowed: " + describe_crash(proc)
    failures = [r for r in res if not r["ok"]]
    for r in failures:
        assert r["is_error"], "%s raised a foreign exception %s.%s: %s" % (
            r["op"], r["module"], r["type"], r["msg"])
        assert r["type"] != "MemoryError", r
    if case.must_fail == "open":
        assert res[0]["op"] == "open" and not res[0]["ok"], \
            "open must fail: %r" % res[:3]
    elif case.must_fail == "read":
        assert failures, "no operation reported the damage: %r" % res
    for i, r in enumerate(failures):
        # after a first error py-lmdb's transaction is spent (BadTxnError):
        # matching that is allowed
        allowed = case.allowed + (("BadTxnError",) if i else ())
        assert r["type"] in allowed, "%s raised %s (allowed: %s): %s" % (
            r["op"], r["type"], allowed, r["msg"])
    # Every case raises (none may read successfully), naming the file, and
    # the page wherever the damage is on one: only damage to the file as a
    # whole (missing, empty, not LMDB) has no page to name.
    assert failures, "the damage went unnoticed: %r" % res
    assert made.pgnos or made.path_in_msg, "the case must say what the message names"
    assert os.path.basename(made.path) in failures[0]["msg"], failures[0]["msg"]
    if made.pgnos:
        assert names_a_page(failures[0]["msg"], made.pgnos), \
            "message must name the page (one of %s): %r" % (list(made.pgnos)[:8], failures[0]["msg"])
    # Where the damage leaves the data intact (data_ok), whatever succeeded
    # must equal what the undamaged file gives.
    if case.data_ok:
        pristine = pristine_results(case, bases, made, tmp_path)
        for r in res:
            if r["op"].startswith(("stat", "txn_stat")):
                continue  # reports the (patched) record itself
            if r["ok"] and r["op"] in pristine and pristine[r["op"]]["ok"]:
                assert r["result"] == pristine[r["op"]]["result"], r["op"]


def judge_pylmdb(case: Case, res, proc):
    """Logic check: the crafted damage is where we think it is, as far as
    liblmdb can tell.  Records py-lmdb's behaviour in case.pylmdb."""
    if res is None:
        outcome = "crash"
    else:
        failures = [r for r in res if not r["ok"]]
        outcome = "raise:" + failures[0]["type"] if failures else "ok"
    if case.pylmdb == "any":
        return
    assert outcome == case.pylmdb, (outcome, res, describe_crash(proc) if res is None else "")


# ---------------------------------------------------------------------------
# a few checks that need no subprocess


def test_fixture_bases_shape(bases):
    """The pristine files have the structure the cases rely on."""
    f = LmdbFile(bases["tree"].path)
    assert f.meta.main_db.depth == 3
    assert len([p for p in f.branches() if p.level == 1]) >= 2
    assert f.overflows() and all(p.pages >= 2 for p in f.overflows())
    g = LmdbFile(bases["named"].path)
    assert set(g.named) >= {b"plain", b"dups", b"fixed"}
    assert g.dup_trees and g.subpages
    assert [p for p in g.pages.values() if p.flags & P_LEAF2]


def test_meta_pages_read_together_say_what_apart_said(bases, tmp_path):
    """A transaction reads both meta pages in one request; where that
    read comes up short (the file cut after open) they are read again one
    at a time, and the error names the page and offset as before; a meta
    page whose page size differs is named as before."""
    lmdbio = import_subject("lmdbio")
    f = LmdbFile(bases["tree"].path)
    for cut, page in ((f.psize + 100, 1), (f.psize + 151, 1), (100, 0),
                      (f.psize + 152, None)):
        d = tmp_path / ("cut%d" % cut)
        shutil.copytree(bases["tree"].path, d)
        env = lmdbio.open(str(d), readonly=True, lock=False)
        try:
            with env.begin() as txn:
                assert txn.stat()["entries"] == f.meta.main_db.entries
            truncate(dfile(d), cut)
            if page is None:   # both structs still there
                env.begin().abort()
                continue
            with pytest.raises(lmdbio.DiskError,
                               match=r"read failed at offset %d \(page %d\): "
                                     r"end of file \(the file shrank"
                                     % (cut, page)):
                env.begin()
        finally:
            env.close()
    d = tmp_path / "psize"
    shutil.copytree(bases["tree"].path, d)
    env = lmdbio.open(str(d), readonly=True, lock=False)
    try:
        patch(dfile(d), f.psize + MM_PSIZE, "<I", 2 * f.psize)
        with pytest.raises(lmdbio.Error, match="meta page 1: page size"):
            env.begin()
    finally:
        env.close()
