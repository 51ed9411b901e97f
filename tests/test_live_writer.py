"""Readers next to a live writer.

A py-lmdb writer in a subprocess commits continuously: inserts, deletes and
overwrites (small values and overflow values of changing sizes, so freed
pages are reused), and logs, after each commit, the txnid and a digest of
the whole database as of that commit.

* lock=True (drop-in cursor and Reader): each read, slowed down so that the
  writer commits many times while it runs, must see exactly the snapshot of
  its txnid: its digest equals the writer's for that txnid.
* lock=False over the changing file: the reader may meet pages the writer
  reused.  It must never crash or hang (it runs in a subprocess with a
  timeout) and may only raise lmdbio errors; a deterministic case checks
  that a damaged page met after the writer moved past the snapshot raises
  lmdbio.SnapshotChangedError.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import import_subject
from lmdb_fixtures import data_file

WRITER = r'''
import hashlib, os, random, sys, time
import lmdb
path, log, stop, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
max_commits = int(sys.argv[5])
rnd = random.Random(seed)
env = lmdb.open(path, map_size=256 << 20, sync=False, metasync=False)
model = {}

def val(i):
    n = rnd.choice([8, 40, 120, 300, 300, 300, 300, 300, 2500, 6000, 9000])
    return (b"%d:" % i) * (n // 4) + rnd.randbytes(n % 7)

def digest():
    h = hashlib.sha256()
    for k in sorted(model):
        v = model[k]
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
    return h.hexdigest()

with open(log, "w") as lg:
    n = 0
    while n < max_commits and not os.path.exists(stop):
        with env.begin(write=True) as txn:
            t = txn.id()
            for j in range(rnd.randrange(1, 30) if n else 800):
                r = rnd.random() if n else 0
                if r < 0.4 or not model:
                    k = b"key%05d" % rnd.randrange(1000)
                    model[k] = v = val(n)
                    txn.put(k, v)
                elif r < 0.75:
                    k = rnd.choice(list(model))
                    del model[k]
                    txn.delete(k)
                else:
                    k = rnd.choice(list(model))
                    model[k] = v = val(n)
                    txn.put(k, v)
        n += 1
        lg.write("%d %d %s %d\n" % (t, len(model), digest(), env.info()["last_pgno"]))
        lg.flush()
env.close()
'''


class Writer:
    def __init__(self, tmp_path, seed=1, max_commits=10 ** 9):
        self.path = str(tmp_path / "env")
        os.makedirs(self.path)
        self.log = str(tmp_path / "writer.log")
        self.stop_file = str(tmp_path / "stop")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, self.path, self.log, self.stop_file,
             str(seed), str(max_commits)], stderr=subprocess.PIPE)
        self.wait_commits(20)

    def entries(self):
        out = {}
        try:
            with open(self.log) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 4:
                        out[int(parts[0])] = (int(parts[1]), parts[2], int(parts[3]))
        except FileNotFoundError:
            pass
        return out

    def wait_commits(self, n, timeout=60):
        end = time.time() + timeout
        while len(self.entries()) < n:
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            assert time.time() < end, "the writer does not commit"
            time.sleep(0.02)

    def expect(self, txnid, timeout=30):
        end = time.time() + timeout
        while True:
            e = self.entries()
            if txnid in e:
                return e[txnid]
            assert time.time() < end, "txn %d never logged" % txnid
            time.sleep(0.01)

    def newest(self):
        e = self.entries()
        return max(e) if e else 0

    def stop(self):
        open(self.stop_file, "w").close()
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert self.proc.returncode == 0, self.proc.stderr.read().decode()


def digest(items):
    h = hashlib.sha256()
    n = 0
    for k, v in items:
        k, v = bytes(k), bytes(v)
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
        n += 1
    return n, h.hexdigest()


def slow(items, every=20, pause=0.002):
    for i, kv in enumerate(items):
        if i % every == 0:
            time.sleep(pause)
        yield kv


@pytest.fixture
def lmdbio():
    return import_subject("lmdbio")


READS = int(os.environ.get("LMDBIO_LIVE_READS", "12"))


def _check_reuse(w, lmdbio, require_reuse=True):
    """The final file verifies clean; and (short reads) the writer committed
    far more page writes than the file grew: freed pages were reused.  A
    Reader that holds its snapshot for long keeps the writer from reusing
    what was freed after it (that is the point of its reader slot)."""
    w.stop()
    e = w.entries()
    commits = len(e)
    txns = sorted(e)
    mid = txns[len(txns) // 2]
    grown = e[txns[-1]][2] - e[mid][2]
    # every commit writes at least two new pages (copy-on-write): over the
    # second half, the file grew by fewer pages than there were commits
    assert commits >= 60, commits
    if require_reuse:
        assert grown < len(txns) - len(txns) // 2, (commits, grown)
    from lmdbio.verify import verify
    problems, _ = verify(w.path)
    assert problems == []
    return commits


def test_lock_true_cursor_sees_one_snapshot(lmdbio, tmp_path):
    w = Writer(tmp_path, seed=1)
    moved = []
    try:
        env = lmdbio.open(w.path, readonly=True, lock=True)
        for i in range(READS):
            with env.begin() as txn:
                t = txn.id()
                got = digest(slow(txn.cursor()))
            n, dg, _ = w.expect(t)
            assert got == (n, dg), "read %d at txn %d saw another snapshot" % (i, t)
            moved.append(w.newest() - t)
            # a fresh transaction moves on to a newer snapshot
        env.close()
    finally:
        commits = _check_reuse(w, lmdbio)
    # the writer committed while the reads ran (else this proved nothing)
    assert sum(moved) >= READS and max(moved) >= 3, moved
    print("lock=True cursor: %d reads, %d commits during reads, %d commits"
          % (READS, sum(moved), commits))


def test_lock_true_reader_sees_one_snapshot(lmdbio, tmp_path):
    w = Writer(tmp_path, seed=2)
    moved = []
    try:
        for i in range(READS // 2):
            with lmdbio.Reader(w.path, lock=True, batch_size=97,
                               index_cache=False) as r:
                t = r._file.txnid
                items = []
                for b in r:
                    items += zip(b.keys.tolist(), b.values.tolist())
                    time.sleep(0.002)
                # and random access in the same snapshot
                again = r.read(list(range(len(items) - 1, -1, -3)))
            n, dg, _ = w.expect(t)
            assert digest(items) == (n, dg), "Reader at txn %d" % t
            assert again.values.tolist() == [v for _, v in items][::-1][::3]
            moved.append(w.newest() - t)
    finally:
        commits = _check_reuse(w, lmdbio, require_reuse=False)
    assert sum(moved) >= READS // 2 and max(moved) >= 3, moved
    print("lock=True Reader: %d reads, %d commits during reads, %d commits"
          % (READS // 2, sum(moved), commits))


UNLOCKED = r'''
import hashlib, json, sys, time
import lmdbio
path, seconds = sys.argv[1], float(sys.argv[2])
res = {"complete": [], "errors": {}, "foreign": []}

def digest(items):
    h = hashlib.sha256()
    n = 0
    for k, v in items:
        k, v = bytes(k), bytes(v)
        h.update(len(k).to_bytes(4, "little") + k + len(v).to_bytes(8, "little") + v)
        n += 1
    return [n, h.hexdigest()]

def slow(it):
    for i, x in enumerate(it):
        if i % 25 == 0:
            time.sleep(0.001)
        yield x

end = time.time() + seconds
i = 0
while time.time() < end:
    i += 1
    try:
        if i % 2:
            env = lmdbio.open(path, readonly=True, lock=False)
            try:
                with env.begin() as txn:
                    t = txn.id()
                    res["complete"].append([t] + digest(slow(txn.cursor())))
            finally:
                env.close()
        else:
            with lmdbio.Reader(path, lock=False, batch_size=64, index_cache=False) as r:
                t = r._file.txnid
                items = []
                for b in r:
                    items += zip(b.keys.tolist(), b.values.tolist())
                    time.sleep(0.001)
                res["complete"].append([t] + digest(items))
    except lmdbio.Error as e:
        name = type(e).__name__
        res["errors"][name] = res["errors"].get(name, 0) + 1
    except Exception as e:
        res["foreign"].append("%s: %s" % (type(e).__name__, e))
print("@@" + json.dumps(res))
'''


def test_lock_false_never_crashes_or_hangs(lmdbio, tmp_path):
    w = Writer(tmp_path, seed=3)
    try:
        proc = subprocess.run([sys.executable, "-c", UNLOCKED, w.path, "8"],
                              capture_output=True, timeout=120)
    finally:
        commits = _check_reuse(w, lmdbio, require_reuse=False)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0 and "@@" in out, \
        "reader died (%d): %s" % (proc.returncode, proc.stderr.decode()[-3000:])
    res = json.loads(out.rsplit("@@", 1)[1])
    assert res["foreign"] == [], res["foreign"]
    assert res["complete"] or res["errors"]
    log = w.entries()
    consistent = sum(1 for t, n, dg in res["complete"] if log.get(t)[:2] == (n, dg))
    print("lock=False: %d reads completed (%d consistent), errors %s, %d commits"
          % (len(res["complete"]), consistent, res["errors"], commits))
    # a scan that completed was checked against the meta pages: it never
    # mixes two snapshots (a scan that might have raised SnapshotChangedError)
    assert consistent == len(res["complete"]), res["complete"]
    assert set(res["errors"]) <= {"SnapshotChangedError"}, res["errors"]


def test_lock_false_snapshot_changed_error(lmdbio, tmp_path):
    """The writer rewrites everything after the snapshot was taken: the
    unlocked transaction meets reused pages and says why."""
    import lmdb
    path = str(tmp_path / "env")
    wenv = lmdb.open(path, map_size=64 << 20)
    with wenv.begin(write=True) as txn:
        for i in range(3000):
            txn.put(b"k%05d" % i, b"v" * 50)
    renv = lmdbio.open(path, readonly=True, lock=False, readahead=False)
    rtxn = renv.begin()
    cur = rtxn.cursor()
    assert cur.first()
    # delete everything, then fill the freed pages with overflow values
    with wenv.begin(write=True) as txn:
        txn.drop(wenv.open_db(None), delete=False)
    for j in range(6):
        with wenv.begin(write=True) as txn:
            for i in range(40):
                txn.put(b"big%d-%d" % (j, i), bytes([j + 1]) * 9000)
    wenv.close()
    with pytest.raises(lmdbio.Error) as ei:
        for _ in cur:
            pass
        rtxn.get(b"k02999")
    e = ei.value
    assert isinstance(e, lmdbio.SnapshotChangedError), repr(e)
    assert e.txnid == rtxn.id() and e.newest > e.txnid
    assert "lock=False" in str(e)
    rtxn.abort()
    # a new transaction reads the new snapshot
    with renv.begin() as txn:
        assert txn.get(b"big0-0") == b"\x01" * 9000
    renv.close()


@pytest.mark.parametrize("commits,raises", [(0, False), (1, False), (2, True), (5, True)])
def test_lock_false_txnid_check(lmdbio, tmp_path, commits, raises):
    """A reader without a slot may go on while the writer is at most one
    commit past its snapshot (nothing of the snapshot can be reused yet);
    from two on, the end of a scan, the next Reader batch and every 1024th
    read raise SnapshotChangedError instead of returning bytes that may come
    from reused pages."""
    import lmdb
    path = str(tmp_path / "env")
    wenv = lmdb.open(path, map_size=64 << 20)
    with wenv.begin(write=True) as txn:
        for i in range(3000):
            txn.put(b"k%05d" % i, b"v%d" % i)
    env = lmdbio.open(path, readonly=True, lock=False)
    txn = env.begin()
    reader = lmdbio.Reader(path, lock=False, batch_size=100, index_cache=False)
    batches = iter(reader)
    first = next(batches)
    for j in range(commits):
        with wenv.begin(write=True) as w:
            w.put(b"k%05d" % j, b"new")
    wenv.close()

    def scan():
        return sum(1 for _ in txn.cursor())

    def gets():
        return sum(1 for i in range(2000) if txn.get(b"k%05d" % i) is not None)

    def rest():
        return len(first) + sum(len(b) for b in batches)

    for fn, n in ((scan, 3000), (gets, 2000), (rest, 3000)):
        if raises:
            with pytest.raises(lmdbio.SnapshotChangedError) as ei:
                fn()
            # The Reader's prefetch thread may meet the writer mid-way
            # (any newest from two past the snapshot on raises).
            assert (ei.value.txnid + 2 <= ei.value.newest
                    <= ei.value.txnid + commits)
        else:
            assert fn() == n
    txn.abort()
    reader.close()
    env.close()
