"""Read faults: EINTR is retried, a short read is continued, EIO is retried
twice and then raised as lmdbio.DiskError (with errno, path and offset), a
file that shrinks while it is read raises DiskError, never a crash, a hang
or a wrong answer.

Two ways of causing faults:
* real ones that need no help: the data file truncated under an open
  environment / Reader (it shrinks while being read);
* injected ones: builds compiled with -DLMDBIO_FAULT_INJECTION (the
  sanitizer build, ``make test-sanitize``) read $LMDBIO_FAULT in
  csrc/io_posix.c ("eio|eintr|short|zero[,at=OFF][,after=N][,times=M]").
  These tests are skipped, with the reason shown, in builds without the hook.

Every scenario runs in a subprocess (a crash fails the test instead of
killing pytest) with a timeout, and reports how many faults the hook
injected, so that a test cannot pass because the hook never fired.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import import_subject
from lmdb_fixtures import LmdbFile, data_file, read_all_pylmdb, write_items

TIMEOUT = 120


@pytest.fixture(scope="module")
def lmdbio():
    return import_subject("lmdbio")


@pytest.fixture(scope="module")
def has_hook(lmdbio):
    return lmdbio._core._fault_injected() is not None


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """About 2 MiB: many leaves, some overflow values."""
    d = str(tmp_path_factory.mktemp("faults") / "env")
    items = [(b"key%06d" % i, (b"%d," % i) * (3000 if i % 50 == 7 else 20))
             for i in range(12000)]
    write_items(d, items)
    return d


CHILD = r'''
import hashlib, json, os, sys
cfg = json.loads(sys.argv[1])
import lmdbio, lmdbio._bulk

def injected():
    # one core (liblmdbio_core) behind both modules: one counter
    a, b = lmdbio._core._fault_injected(), lmdbio._bulk._fault_injected()
    assert a == b, (a, b)
    return a

out = {"faults_before": injected()}

def digest(items):
    h = hashlib.sha256()
    n = 0
    for k, v in items:
        k, v = bytes(k), bytes(v)
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
        n += 1
    return [n, h.hexdigest()]

def err(e):
    return {"type": type(e).__name__, "is_error": isinstance(e, lmdbio.Error),
            "msg": str(e)[:500], "errno": getattr(e, "errno", None),
            "offset": getattr(e, "offset", None), "path": getattr(e, "path", None)}

def run():
    what = cfg["what"]
    if what == "cursor":
        env = lmdbio.open(cfg["path"], readonly=True, lock=False,
                          readahead=cfg.get("readahead", True))
        with env.begin() as txn:
            return digest(txn.cursor())
    if what == "get":
        env = lmdbio.open(cfg["path"], readonly=True, lock=False, readahead=False,
                          cache_bytes=cfg.get("cache_bytes", 64 << 20))
        keys = cfg.get("keys") or open(cfg["keys_file"]).read().split()
        with env.begin() as txn:
            return [None if v is None else len(v)
                    for v in (txn.get(bytes.fromhex(k)) for k in keys)]
    if what == "reader":
        with lmdbio.Reader(cfg["path"], batch_size=500, index_cache=False) as r:
            items = []
            for b in r:
                items += zip(b.keys.tolist(), b.values.tolist())
            return digest(items)
    if what == "truncate_cursor":
        env = lmdbio.open(cfg["path"], readonly=True, lock=False, readahead=False)
        with env.begin() as txn:
            cur = txn.cursor()
            n = 0
            for k, v in cur:
                n += 1
                if n == 100:
                    with open(cfg["data"], "r+b") as f:
                        f.truncate(cfg["size"])
            return n
    if what == "truncate_reader":
        with lmdbio.Reader(cfg["path"], batch_size=500, index_cache=False) as r:
            n = 0
            for b in r:
                n += len(b)
                if n == 500:
                    with open(cfg["data"], "r+b") as f:
                        f.truncate(cfg["size"])
            return n
    raise ValueError(what)

try:
    out["result"] = run()
    out["ok"] = True
except BaseException as e:
    out["ok"] = False
    out["error"] = err(e)
out["faults"] = injected()
sys.stdout.write("\n@@" + json.dumps(out) + "\n")
'''


def run_child(cfg, fault=None):
    env = dict(os.environ)
    env.pop("LMDBIO_FAULT", None)
    if fault:
        env["LMDBIO_FAULT"] = fault
    env.setdefault("PYTHONFAULTHANDLER", "1")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)],
                          capture_output=True, timeout=TIMEOUT, env=env,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0 and "@@" in out, \
        "child crashed (%d):\n%s" % (proc.returncode, proc.stderr.decode(errors="replace")[-3000:])
    res = json.loads(out.rsplit("@@", 1)[1])
    if fault:
        print("\n[faults injected: %s] %s %s" % (res["faults"], cfg["what"], fault))
    return res


def expected_digest(path):
    import hashlib
    items = read_all_pylmdb(path)[None]
    h = hashlib.sha256()
    for k, v in items:
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
    return [len(items), h.hexdigest()]


def assert_disk_error(res, path, errno=5):
    assert not res["ok"], res
    e = res["error"]
    assert e["type"] == "DiskError" and e["is_error"], e
    assert e["errno"] == errno, e  # EIO by default
    assert isinstance(e["offset"], int) and e["offset"] >= 0, e
    assert data_file(path) in e["msg"] and str(e["offset"]) in e["msg"], e


# ---------------------------------------------------------------------------
# real faults: the file shrinks under an open reader (any build)


def test_file_shrinks_under_a_cursor(lmdbio, db, tmp_path):
    d = str(tmp_path / "env")
    os.makedirs(d)
    with open(data_file(db), "rb") as f, open(data_file(d), "wb") as g:
        g.write(f.read())
    size = os.path.getsize(data_file(d)) // 3 // 4096 * 4096
    res = run_child(dict(what="truncate_cursor", path=d, data=data_file(d), size=size))
    assert_disk_error(res, d)
    assert "shrank" in res["error"]["msg"]
    assert res["error"]["offset"] >= size


def test_file_shrinks_under_a_reader(lmdbio, db, tmp_path):
    d = str(tmp_path / "env")
    os.makedirs(d)
    with open(data_file(db), "rb") as f, open(data_file(d), "wb") as g:
        g.write(f.read())
    size = os.path.getsize(data_file(d)) // 3 // 4096 * 4096
    res = run_child(dict(what="truncate_reader", path=d, data=data_file(d), size=size))
    assert_disk_error(res, d)
    assert "shrank" in res["error"]["msg"]


def test_truncated_before_open_is_page_not_found(lmdbio, db, tmp_path):
    """A file that is already short is a structural error (docs/drop-in.md), not a
    disk error: the page is past the end of the file."""
    d = str(tmp_path / "env")
    os.makedirs(d)
    with open(data_file(db), "rb") as f, open(data_file(d), "wb") as g:
        g.write(f.read(os.path.getsize(data_file(db)) // 2))
    res = run_child(dict(what="cursor", path=d))
    assert not res["ok"] and res["error"]["type"] == "PageNotFoundError", res


# ---------------------------------------------------------------------------
# injected faults (builds with the hook)


@pytest.fixture
def hook(has_hook):
    if not has_hook:
        pytest.skip("this lmdbio build has no fault-injection hook "
                    "(make test-sanitize builds one with -DLMDBIO_FAULT_INJECTION)")


RETRIED = [
    # (fault spec, operations that must still return the right data)
    ("eintr,times=40", ["cursor", "reader"]),
    ("eintr,after=7,times=999", ["cursor", "reader"]),
    ("short", ["cursor", "reader"]),
    ("short,after=3", ["cursor", "reader"]),
    ("eio,times=2", ["cursor", "reader"]),
    ("eio,after=10,times=2", ["cursor", "reader"]),
    ("zero,after=5,times=2", ["cursor", "reader"]),
]


@pytest.mark.parametrize("fault,whats", RETRIED, ids=[f for f, _ in RETRIED])
def test_retried_faults_read_correctly(hook, db, fault, whats):
    want = expected_digest(db)
    for what in whats:
        res = run_child(dict(what=what, path=db, readahead=False), fault)
        assert res["ok"], (what, res)
        assert res["result"] == want, (what, fault)
        assert res["faults"] > 0, "the hook never fired: %r" % res
        if "times=" in fault:
            assert res["faults"] == int(fault.rsplit("times=", 1)[1])


FATAL = ["eio", "eio,after=20", "zero,after=20", "eio,after=3", "eintr,after=9"]


@pytest.mark.parametrize("fault", FATAL)
@pytest.mark.parametrize("what", ["cursor", "reader"])
def test_persistent_faults_raise_disk_error(hook, db, fault, what):
    """EIO and end-of-file are tried three times, EINTR 1001 times in a row
    (an endless EINTR is an error, not a hang)."""
    res = run_child(dict(what=what, path=db, readahead=False), fault)
    assert_disk_error(res, db, errno=4 if fault.startswith("eintr") else 5)
    assert res["faults"] >= (1001 if fault.startswith("eintr") else 3)


def test_fault_on_one_page_spares_the_others(hook, db):
    f = LmdbFile(db)
    leaves = f.leaves()
    bad, good = leaves[len(leaves) // 2], leaves[0]
    off = bad.pgno * f.psize + 100
    keys = [bad.nodes[0].key, good.nodes[0].key, good.nodes[-1].key]
    res = run_child(dict(what="get", path=db, keys=[keys[1].hex(), keys[2].hex()]),
                    "eio,at=%d" % off)
    assert res["ok"] and all(res["result"]), res
    assert res["faults"] == 0
    res = run_child(dict(what="get", path=db, keys=[k.hex() for k in keys]),
                    "eio,at=%d" % off)
    assert_disk_error(res, db)
    assert res["error"]["offset"] <= off < res["error"]["offset"] + f.psize
    res = run_child(dict(what="cursor", path=db, readahead=False), "eio,at=%d" % off)
    assert_disk_error(res, db)


def test_a_failed_read_of_a_record_alone_raises(hook, db, tmp_path):
    """Lookups whose leaf's records are noted in the leaf directory's
    table read the record alone (csrc/leafdir.c).  Such a read that fails
    raises: it used to answer None, as for an absent key (the table's
    "not in the table" code was LIO_SYSERR's -1)."""
    f = LmdbFile(db)
    keys = sorted(n.key for p in f.leaves() for n in p.nodes)
    leaf = f.leaves()[len(f.leaves()) * 3 // 4]
    first = leaf.nodes[0]
    # the first pass reads first's leaf as a page (the read let through),
    # the second reads first's record alone: that read fails
    (tmp_path / "keys").write_text(" ".join(k.hex() for k in keys + keys))
    res = run_child(dict(what="get", path=db, cache_bytes=1 << 20,
                         keys_file=str(tmp_path / "keys")),
                    "eio,at=%d,after=1" % first.key_offset)
    assert_disk_error(res, db)
    assert res["faults"] >= 1
    # the failing read is the record's (from its node on), not its page's
    assert res["error"]["offset"] == first.offset


def test_open_fails_cleanly(hook, db):
    res = run_child(dict(what="cursor", path=db), "eio")
    assert_disk_error(res, db)
    assert res["error"]["offset"] == 0
