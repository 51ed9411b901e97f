"""Every input the fuzzers (fuzz/) ever found a problem with is kept under
fuzz/regressions/<target>/; the C targets re-run them (make fuzz-regress).
Here the same files go through the Python surface: the drop-in API, the
Reader and the verifier, in a subprocess (a crash fails the test), which
may raise lmdbio errors only.  The committed seed corpus (fuzz/corpus/lmdb:
small real files) must read exactly as py-lmdb reads it and verify clean.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import import_subject, require

FUZZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "fuzz")
REGRESSIONS = sorted(p for t in ("tree", "verify", "bulk")
                     for p in glob.glob(os.path.join(FUZZ, "regressions", t, "*")))
DATUM_REGRESSIONS = sorted(glob.glob(os.path.join(FUZZ, "regressions", "datum", "*")))
SEEDS = sorted(glob.glob(os.path.join(FUZZ, "corpus", "lmdb", "*")))

CHILD = r'''
import json, sys
import lmdbio
path = sys.argv[1]
out = {"errors": [], "foreign": []}

def attempt(what, fn):
    try:
        return fn()
    except lmdbio.Error as e:
        out["errors"].append("%s: %s: %s" % (what, type(e).__name__, e))
    except Exception as e:
        out["foreign"].append("%s: %s: %s" % (what, type(e).__name__, e))

def read_all():
    env = lmdbio.open(path, subdir=False, readonly=True, lock=False, max_dbs=16)
    try:
        names = []
        with env.begin() as txn:
            items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
            c = txn.cursor()
            if c.last():
                rev = [(bytes(k), bytes(v)) for k, v in c.iterprev()]
                assert rev[::-1] == items, "reverse scan differs"
        for k, v in items:
            if len(v) == 48:
                db = attempt("open_db", lambda: env.open_db(k, create=False))
                if db is not None:
                    with env.begin(db=db) as txn:
                        attempt("named", lambda: [1 for _ in txn.cursor()])
                        if db.flags()["dupfixed"]:
                            attempt("getmulti", lambda: multi(txn))
                        if db.flags()["dupsort"]:
                            attempt("dups", lambda: dup_moves(txn))
        return len(items)
    finally:
        env.close()

def multi(txn):
    # GET_MULTIPLE / NEXT_MULTIPLE over every key of a DUPFIXED database
    c = txn.cursor()
    if not c.first():
        return 0
    width = len(c.value())
    keys = list(c.iternext_nodup(keys=True, values=False))
    return len(c.getmulti(keys, dupdata=True, dupfixed_bytes=width))

def dup_moves(txn):
    # every duplicate move, also right after a move that failed
    c = txn.cursor()
    ok = c.first()
    for _ in range(1000):
        if not ok:
            break
        for move in (c.next_dup, c.prev_dup, c.last_dup, c.first_dup, c.count,
                     c.value):
            r = attempt("dup move", move)
            if isinstance(r, bytes):
                bytes(r)
        ok = attempt("next_nodup", c.next_nodup)
        if ok is None:  # failed: go on from where the cursor is
            ok = True
            attempt("after failure", c.next_dup)
            attempt("after failure", c.value)
            ok = attempt("next", c.next)
    return 0

def reader():
    with lmdbio.Reader(path, subdir=False, batch_size=7, index_cache=False) as r:
        return sum(len(b) for b in r)

def verify():
    from lmdbio.verify import verify
    problems, st = verify(path, subdir=False)
    return len(problems)

out["items"] = attempt("read", read_all)
out["reader"] = attempt("reader", reader)
out["problems"] = attempt("verify", verify)
print("@@" + json.dumps(out))
'''


def run(path):
    proc = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True,
                          timeout=120, cwd=os.path.dirname(os.path.abspath(__file__)))
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0 and "@@" in out, \
        "crashed (%d): %s" % (proc.returncode, proc.stderr.decode(errors="replace")[-3000:])
    return json.loads(out.rsplit("@@", 1)[1])


@pytest.fixture(autouse=True)
def _lmdbio():
    import_subject("lmdbio")


@pytest.mark.parametrize("path", REGRESSIONS, ids=[os.path.relpath(p, FUZZ) for p in REGRESSIONS])
def test_finding_is_handled(path, tmp_path):
    copy = str(tmp_path / "data.mdb")
    shutil.copyfile(path, copy)
    res = run(copy)
    assert res["foreign"] == [], res["foreign"]
    # each finding is a damaged file: the verifier must not call it clean
    assert res["problems"] != 0, res


def test_there_are_regressions():
    assert REGRESSIONS, "fuzz/regressions/ is empty"


@pytest.mark.parametrize("path", SEEDS, ids=[os.path.basename(p) for p in SEEDS])
def test_seed_reads_like_pylmdb(path, tmp_path):
    import lmdb
    copy = str(tmp_path / "data.mdb")
    shutil.copyfile(path, copy)
    res = run(copy)
    assert res["foreign"] == [] and res["errors"] == [], res
    env = lmdb.open(copy, subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        n = sum(1 for _ in txn.cursor())
    env.close()
    assert res["items"] == n and res["reader"] == n and res["problems"] == 0, res


# The datum target's findings (none kept yet) and its seed corpus: decoded,
# or rejected with DatumError, never a crash or a foreign exception.
DATUM_INPUTS = DATUM_REGRESSIONS + sorted(
    glob.glob(os.path.join(FUZZ, "corpus", "datum", "*")))


@pytest.mark.parametrize("path", DATUM_INPUTS,
                         ids=[os.path.relpath(p, FUZZ) for p in DATUM_INPUTS])
def test_datum_finding_is_handled(path):
    datum = require("lmdbio.datum")
    data = open(path, "rb").read()
    try:
        datum.decode_one(data)
    except (datum.DatumError if hasattr(datum, "DatumError") else ValueError):
        pass
