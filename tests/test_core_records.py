"""The core's decoders of the format and its lock-file inspection, as the
CLI uses them (lmdbio._core._read_header, _dbrec, _free_record,
_lock_inspect), against what liblmdb reports: py-lmdb (its bundled liblmdb)
and Debian's lmdb-utils (mdb_load, mdb_stat) in other processes.

The inspection must be a probe only: it must not take a lock, clear a slot
or drop a lock this process holds through another library."""

import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

from conftest import require
from lmdb_fixtures import (MM_MAGIC, MM_TXNID, MM_VERSION, MDB_DB_SIZE,
                           P_META)

lmdb = require("lmdb")
lmdbio = require("lmdbio")
from lmdbio import _core  # noqa: E402

TOOLS = {t: shutil.which(t) for t in ("mdb_stat", "mdb_load")}
needs_utils = pytest.mark.skipif(
    not all(TOOLS.values()) and not (os.environ.get("CI") or
                                     os.environ.get("LMDBIO_REQUIRE")),
    reason="lmdb-utils (mdb_stat, mdb_load) are not installed")


def _mdb_stat(*args):
    p = subprocess.run(["mdb_stat"] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    return p.stdout.decode()


def _field(text, name):
    return re.search(r"^\s*%s: (.*)$" % re.escape(name), text, re.M).group(1)


def _write(path, commits=3, named=(), nosubdir=False, big=False):
    env = lmdb.open(path, map_size=1 << 24, max_dbs=len(named) + 1,
                    subdir=not nosubdir)
    dbs = [env.open_db(n, dupsort=(i % 2 == 0), integerkey=(i == 1))
           for i, n in enumerate(named)]
    for c in range(commits):
        with env.begin(write=True) as txn:
            for i in range(50):
                txn.put(b"k%05d" % (i + 50 * c),
                        (b"v" * (3000 if big and i % 7 == 0 else 10)))
            for j, db in enumerate(dbs):
                for i in range(20):
                    key = struct.pack("=Q", i) if j == 1 else b"d%03d" % i
                    txn.put(key, b"x%d" % c, db=db)
            if c and c % 2 == 0:  # churn: a free list
                for i in range(0, 50 * c, 3):
                    txn.delete(b"k%05d" % i)
    env.close()
    return path


def _data(path, nosubdir=False):
    return path if nosubdir else os.path.join(path, "data.mdb")


# ---------------------------------------------------------------------------
# meta pages

def _check_meta_against_liblmdb(path, nosubdir=False):
    meta = _core._read_header(_data(path, nosubdir))
    env = lmdb.open(path, readonly=True, lock=False, subdir=not nosubdir)
    try:
        info = env.info()
        st = env.stat()
        assert meta["txnid"] == info["last_txnid"]
        assert meta["last_pg"] == info["last_pgno"]
        assert meta["psize"] == st["psize"]
        assert meta["address"] == (info["map_addr"] if meta["address"] else 0)
        assert meta["main_db"]["entries"] == st["entries"]
        assert meta["main_db"]["depth"] == st["depth"]
        assert meta["main_db"]["leaf_pages"] == st["leaf_pages"]
        assert meta["main_db"]["branch_pages"] == st["branch_pages"]
        assert meta["main_db"]["overflow_pages"] == st["overflow_pages"]
    finally:
        env.close()
    if TOOLS["mdb_stat"]:
        text = _mdb_stat("-e", *(["-n"] if nosubdir else []), path)
        assert int(_field(text, "Last transaction ID")) == meta["txnid"]
        assert int(_field(text, "Number of pages used")) == meta["last_pg"] + 1
        assert int(_field(text, "Page size")) == meta["psize"]
        addr = _field(text, "Map address")
        assert addr == ("0x%x" % meta["address"] if meta["address"]
                        else "(nil)")
    return meta


@pytest.mark.parametrize("commits", [1, 2, 5])
def test_read_header_picks_the_meta_liblmdb_picks(tmp_path, commits):
    """Both meta pages alternate: the newest (by txnid) is the one read."""
    path = _write(str(tmp_path / "env"), commits=commits, big=True)
    meta = _check_meta_against_liblmdb(path)
    assert meta["txnid"] == commits


def test_read_header_nosubdir_and_named(tmp_path):
    path = _write(str(tmp_path / "file.mdb"), named=[b"a", b"b"],
                  nosubdir=True)
    meta = _check_meta_against_liblmdb(path, nosubdir=True)
    assert meta["env_flags"] & 0x4000  # MDB_NOSUBDIR kept in the free DB


@needs_utils
def test_read_header_of_a_file_mdb_load_wrote(tmp_path):
    dump = tmp_path / "dump.txt"
    lines = ["VERSION=3", "format=print", "type=btree", "HEADER=END"]
    for i in range(300):
        lines += [" key%04d" % i, " value%d" % i * (1 + i % 50)]
    dump.write_text("\n".join(lines + ["DATA=END", ""]))
    target = tmp_path / "loaded"
    target.mkdir()
    p = subprocess.run(["mdb_load", "-f", str(dump), str(target)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.returncode == 0, p.stderr
    meta = _check_meta_against_liblmdb(str(target))
    assert meta["main_db"]["entries"] == 300 and meta["main_db"]["flags"] == 0


def _damaged(tmp_path, name, edit):
    src = _write(str(tmp_path / "src"), commits=2)
    raw = bytearray(open(_data(src), "rb").read())
    raw = edit(raw)
    path = tmp_path / name
    path.write_bytes(bytes(raw))
    return str(path)


def test_read_header_rejects_what_liblmdb_rejects(tmp_path):
    def magic(raw):
        raw[MM_MAGIC:MM_MAGIC + 4] = b"\0\0\0\0"
        return raw

    def version(raw):
        raw[MM_VERSION:MM_VERSION + 4] = struct.pack("<I", 2)
        return raw

    def not_meta(raw):
        raw[10:12] = struct.pack("<H", struct.unpack_from("<H", raw, 10)[0]
                                 & ~P_META)
        return raw

    def meta1_cut(raw):
        psize = struct.unpack_from("<I", raw, 40)[0]
        return raw[:psize + 100]

    cases = [("magic", magic, lmdbio.InvalidError),
             ("version", version, lmdbio.VersionMismatchError),
             ("notmeta", not_meta, lmdbio.InvalidError),
             ("cut", meta1_cut, lmdbio.InvalidError),
             ("empty", lambda raw: b"", lmdbio.InvalidError)]
    for name, edit, exc in cases:
        path = _damaged(tmp_path, name, edit)
        with pytest.raises(exc) as info:
            _core._read_header(path)
        assert path in str(info.value), name
        # and liblmdb refuses it too (py-lmdb's own error for the same file)
        with pytest.raises(lmdb.Error):
            lmdb.open(path, subdir=False, readonly=True, lock=False)
    with pytest.raises(lmdbio.Error) as info:
        _core._read_header(str(tmp_path / "missing"))
    assert info.value.code == 2  # ENOENT


def test_read_header_takes_the_older_meta_when_it_is_newer_by_txnid(tmp_path):
    """A meta page 0 with the greater txnid wins even though page 1 was
    written last (liblmdb compares txnids, nothing else)."""
    def bump0(raw):
        struct.pack_into("<Q", raw, MM_TXNID, 1000)
        return raw
    path = _damaged(tmp_path, "bumped", bump0)
    assert _core._read_header(path)["txnid"] == 1000


# ---------------------------------------------------------------------------
# database and free-list records

def test_dbrec_agrees_with_liblmdb(tmp_path):
    names = [b"a", b"b", b"c"]
    path = _write(str(tmp_path / "env"), commits=3, named=names)
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
    try:
        with env.begin() as txn:
            for name in names:
                rec = txn.get(name)
                assert len(rec) == MDB_DB_SIZE
                got = _core._dbrec(rec)
                db = env.open_db(name, txn=txn, create=False)
                st = txn.stat(db)
                for field in ("depth", "branch_pages", "leaf_pages",
                              "overflow_pages", "entries"):
                    assert got[field] == st[field], (name, field)
                on = {k for k, bit in _core._DB_FLAGS.items()
                      if got["flags"] & bit}
                assert on == {k for k, v in db.flags(txn).items() if v}
                # the record as a memoryview decodes the same
                assert _core._dbrec(memoryview(rec)) == got
    finally:
        env.close()
    for bad in (b"", b"x" * 47, b"x" * 49):
        assert _core._dbrec(bad) is None


def test_free_record_decoding():
    pages = [40, 39, 38, 12]
    value = struct.pack("=Q", 4) + struct.pack("=4Q", *pages)
    key = struct.pack("=Q", 77)
    assert _core._free_record(key, value) == (77, 4, tuple(pages))
    # a count larger than the bytes hold: the pages that are there
    assert _core._free_record(key, value[:8 + 16]) == (77, 4, (40, 39))
    # no count at all, a short key (read as if padded with zeros)
    assert _core._free_record(b"\x05", b"abc") == (5, 0, ())
    assert _core._free_record(b"", b"") == (0, 0, ())


@needs_utils
def test_free_records_add_up_to_mdb_stat(tmp_path):
    path = _write(str(tmp_path / "env"), commits=6, big=True)
    env = lmdbio.open(path, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            total = 0
            records = 0
            for key, value in txn.cursor(db=env._free_db()):
                txnid, count, pages = _core._free_record(key, value)
                assert len(pages) == count and 0 < txnid <= txn.id()
                assert list(pages) == sorted(pages, reverse=True)
                total += count
                records += 1
    finally:
        env.close()
    text = _mdb_stat("-ff", path)
    assert records and int(_field(text, "Free pages")) == total
    assert len(re.findall(r"^    Transaction \d+, ", text, re.M)) == records


# ---------------------------------------------------------------------------
# lock file

_HOLDER = r"""
import lmdb, os, sys
env = lmdb.open(sys.argv[1], readonly=True)
txn = env.begin()
print(txn.id(), flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), 9)
sys.stdin.read()
"""


def _holder(path, mode):
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, path, mode],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    txnid = int(p.stdout.readline())
    if mode == "die":
        p.wait()
    return p, txnid


def _lock(path):
    return os.path.join(path, "lock.mdb")


def test_lock_inspect_without_a_lock_file(tmp_path):
    info = _core._lock_inspect(str(tmp_path / "nothing" / "lock.mdb"))
    assert info["exists"] is False and info["live"] is False
    assert info["max_readers"] == 126 and info["num_readers"] == 0
    assert info["slots"] == []
    assert info["readers"] == b"(no active readers)\n"


@needs_utils
def test_lock_inspect_sees_live_and_stale_readers(tmp_path):
    path = _write(str(tmp_path / "env"))
    live, live_txn = _holder(path, "live")
    try:
        dead, _ = _holder(path, "die")        # its slot stays, stale
        info = _core._lock_inspect(_lock(path))
        assert info["exists"] and info["live"]
        pids = {s[1]: s for s in info["slots"] if s[1]}
        assert set(pids) == {live.pid, dead.pid}
        assert pids[live.pid][0] == live_txn and not pids[live.pid][3]
        assert pids[dead.pid][3]              # stale: nobody holds its pid lock
        # what liblmdb reports of the same table (another process)
        text = _mdb_stat("-e", "-r", path)
        assert int(_field(text, "Max readers")) == info["max_readers"]
        assert int(_field(text, "Number of readers used")) == info["num_readers"]
        listing = text[text.index("Reader Table Status\n") + 20:]
        assert listing.encode() == info["readers"]
        assert b"%10d " % dead.pid in info["readers"]
        assert b"%10d " % dead.pid not in info["readers_checked"]
        assert b"%10d " % live.pid in info["readers_checked"]
        # probe only: the stale slot is still there for liblmdb to clear,
        # and inspecting again finds the same
        assert _core._lock_inspect(_lock(path)) == info
        text = _mdb_stat("-rr", path)
        assert "  1 stale readers cleared." in text
        after = _core._lock_inspect(_lock(path))
        assert {s[1] for s in after["slots"] if s[1]} == {live.pid}
    finally:
        live.stdin.close()
        live.wait()
    # nobody has it open now: an opener would re-initialize the table
    info = _core._lock_inspect(_lock(path))
    assert not info["live"] and info["num_readers"] == 0 and not info["slots"]


def _proc_locks(pid):
    with open("/proc/locks") as f:
        return [line for line in f if " %d " % pid in line]


@needs_utils
def test_lock_inspect_keeps_this_process_locks(tmp_path):
    """A py-lmdb reader in this process keeps its byte-0 and pid locks
    across the inspection (closing a descriptor on the lock file would
    drop them, and mdb_stat -rr would then clear the live slot)."""
    path = _write(str(tmp_path / "env"))
    env = lmdb.open(path, readonly=True)
    txn = env.begin()
    try:
        before = _proc_locks(os.getpid())
        assert before
        for _ in range(3):
            info = _core._lock_inspect(_lock(path))
            # only this process uses it: no other holder of byte 0
            assert not info["live"]
        assert _proc_locks(os.getpid()) == before
        text = _mdb_stat("-rr", path)
        assert "  0 stale readers cleared." in text
        assert "%10d " % os.getpid() in text.split("cleared.")[1]
    finally:
        txn.abort()
        env.close()


def _lock_byte0(path):
    code = ("import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_SH, 1, 0)\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code, path],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    return p


@needs_utils
def test_lock_inspect_rejects_a_live_table_liblmdb_rejects(tmp_path):
    path = _write(str(tmp_path / "env"))
    lock = _lock(path)
    good = open(lock, "rb").read()
    cases = [
        (b"\0" * len(good), lmdbio.InvalidError, True),           # magic
        (good[:4] + struct.pack("<I", 0x00020001) + good[8:],
         lmdbio.VersionMismatchError, True),                     # format
        # too short (liblmdb maps past its end: not asked)
        (good[:100], lmdbio.InvalidError, False),
    ]
    for content, exc, ask_liblmdb in cases:
        with open(lock, "wb") as f:
            f.write(content)
        # idle: an opener re-initializes whatever is there
        info = _core._lock_inspect(lock)
        assert not info["live"] and info["slots"] == []
        holder = _lock_byte0(lock)
        try:
            with pytest.raises(exc) as err:
                _core._lock_inspect(lock)
            assert lock in str(err.value)
            if ask_liblmdb:  # liblmdb refuses it too (another process)
                p = subprocess.run(["mdb_stat", "-e", path],
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, timeout=60)
                assert p.returncode != 0 and b"mdb_env_open" in p.stderr
        finally:
            holder.stdin.close()
            holder.wait()


def test_lock_inspect_max_readers_from_the_file_size(tmp_path):
    path = _write(str(tmp_path / "env"))
    env = lmdb.open(path, readonly=True, max_readers=500)
    env.close()
    info = _core._lock_inspect(_lock(path))
    env = lmdb.open(path, readonly=True, max_readers=10)
    try:
        # liblmdb keeps a larger table: its max_readers is the file's
        assert info["max_readers"] == env.max_readers() == 500
    finally:
        env.close()


# ---------------------------------------------------------------------------
# error codes: the C core's (lmdbio.h) and Python's (lmdbio.errors) agree

def test_error_codes_of_the_core_are_liblmdbs():
    """Every LIO_* code lmdbio.h gives liblmdb's name is errors.py's number
    for that name, and _core_error maps it to py-lmdb's class."""
    from lmdbio import errors
    header = os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "csrc", "lmdbio.h")
    pairs = re.findall(r"#define LIO_\w+ \((-\d+)\)\s*/\* (MDB_\w+)",
                       open(header).read())
    assert len(pairs) >= 8
    for number, name in pairs:
        assert getattr(errors, name) == int(number), name
        assert errors.ERROR_MAP[int(number)].MDB_NAME == name
