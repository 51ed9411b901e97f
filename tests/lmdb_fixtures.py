"""Helpers shared by lmdbio's tests: write LMDB environments with py-lmdb for
every database flag combination, model their expected contents in pure
Python, and parse / patch the on-disk format (for crafting corrupt files).

Nothing here imports lmdbio, so the helpers work while the package is being
built and can be used to check test logic against py-lmdb alone.

Page size: py-lmdb cannot choose the page size (liblmdb uses the OS page
size, 4096 here) and neither can mdb_load, so every file these helpers write
has psize == os.sysconf("SC_PAGESIZE").  Other page sizes can only be
produced by hand-crafting files; the corruption helpers below patch psize to
provoke errors, not to build valid files of another page size.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import lmdb  # py-lmdb: the writer and the reference reader

OS_PAGE_SIZE = os.sysconf("SC_PAGESIZE")
MAX_KEY_SIZE = 511  # liblmdb's default MDB_MAXKEYSIZE; also the dupsort value limit

# ---------------------------------------------------------------------------
# on-disk constants (docs/format.md)

PAGEHDRSZ = 16
NODESZ = 8
META_OFF = 16           # MDB_meta starts at byte 16 of a meta page
MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
P_INVALID = 0xFFFFFFFFFFFFFFFF

P_BRANCH = 0x01
P_LEAF = 0x02
P_OVERFLOW = 0x04
P_META = 0x08
P_DIRTY = 0x10
P_LEAF2 = 0x20
P_SUBP = 0x40

F_BIGDATA = 0x01
F_SUBDATA = 0x02
F_DUPDATA = 0x04

REVERSEKEY = 0x02
DUPSORT = 0x04
INTEGERKEY = 0x08
DUPFIXED = 0x10
INTEGERDUP = 0x20
REVERSEDUP = 0x40

# offsets inside a meta page
MM_MAGIC = 16
MM_VERSION = 20
MM_MAPSIZE = 32
MM_DBS_FREE = 40
MM_DBS_MAIN = 88
MM_LAST_PG = 136
MM_TXNID = 144
MM_PSIZE = MM_DBS_FREE  # mm_dbs[0].md_pad

# offsets inside an MDB_db record (48 bytes)
MD_PAD = 0
MD_FLAGS = 4
MD_DEPTH = 6
MD_BRANCH = 8
MD_LEAF = 16
MD_OVERFLOW = 24
MD_ENTRIES = 32
MD_ROOT = 40
MDB_DB_SIZE = 48
_DB_FMT = "<IHHQQQQQ"


# ---------------------------------------------------------------------------
# database specifications: one per flag combination


@dataclass(frozen=True)
class DBSpec:
    """A database flag combination and the kind of keys/values it holds.

    key_kind: "bytes", "int4" or "int8" (native unsigned ints for INTEGERKEY)
    val_kind: "bytes", "fixed" (all values val_width bytes), "int4", "int8"
    """

    id: str
    flags: Tuple[Tuple[str, bool], ...] = ()
    key_kind: str = "bytes"
    val_kind: str = "bytes"
    val_width: int = 0

    @property
    def kwargs(self) -> dict:
        """py-lmdb open_db keyword arguments."""
        return dict(self.flags)

    @property
    def dupsort(self) -> bool:
        return self.kwargs.get("dupsort", False)

    @property
    def md_flags(self) -> int:
        kw = self.kwargs
        f = 0
        f |= REVERSEKEY if kw.get("reverse_key") else 0
        f |= DUPSORT if kw.get("dupsort") else 0
        f |= INTEGERKEY if kw.get("integerkey") else 0
        f |= DUPFIXED if kw.get("dupfixed") else 0
        f |= INTEGERDUP if kw.get("integerdup") else 0
        f |= REVERSEDUP if kw.get("reverse_dup") else 0
        return f

    @property
    def mdb_load_flags(self) -> List[str]:
        """Header lines for an mdb_load text dump."""
        names = {
            "reverse_key": "reversekey",
            "dupsort": "dupsort",
            "integerkey": "integerkey",
            "dupfixed": "dupfixed",
            "integerdup": "integerdup",
            "reverse_dup": "reversedup",
        }
        return ["%s=1" % names[k] for k, v in self.flags if v]

    @property
    def pylmdb_kwargs(self) -> dict:
        """The open_db kwargs py-lmdb understands (it has no reverse_dup)."""
        kw = self.kwargs
        kw.pop("reverse_dup", None)
        return kw

    @property
    def needs_mdb_load(self) -> bool:
        """py-lmdb cannot create REVERSEDUP databases (open_db has no such
        argument); write_env pre-creates them with mdb_load."""
        return bool(self.kwargs.get("reverse_dup"))

    @property
    def max_value_size(self) -> Optional[int]:
        """None: unbounded (overflow pages allowed)."""
        if self.val_kind == "fixed":
            return self.val_width
        if self.val_kind in ("int4", "int8"):
            return int(self.val_kind[3])
        return MAX_KEY_SIZE if self.dupsort else None

    @property
    def min_value_size(self) -> int:
        if self.val_kind == "fixed":
            return self.val_width
        if self.val_kind in ("int4", "int8"):
            return int(self.val_kind[3])
        # liblmdb (as bundled with py-lmdb) rejects empty duplicate values
        return 1 if self.dupsort else 0

    def key_order(self, k: bytes):
        if self.key_kind == "int4":
            return struct.unpack("=I", k)[0]
        if self.key_kind == "int8":
            return struct.unpack("=Q", k)[0]
        if self.kwargs.get("reverse_key"):
            return k[::-1]
        return k

    def val_order(self, v: bytes):
        if not self.dupsort:
            return 0
        kw = self.kwargs
        if kw.get("integerdup"):
            return struct.unpack("=I" if len(v) == 4 else "=Q", v)[0]
        if kw.get("reverse_dup"):
            return v[::-1]
        return v

    def make_key(self, n: int) -> bytes:
        """A deterministic valid key for integer n >= 0."""
        if self.key_kind == "int4":
            return struct.pack("=I", n & 0xFFFFFFFF)
        if self.key_kind == "int8":
            return struct.pack("=Q", n * 0x9E3779B1 & 0xFFFFFFFFFFFFFFFF)
        return b"key%08d" % n

    def make_value(self, n: int, size: int = 10) -> bytes:
        if self.val_kind == "int4":
            return struct.pack("=I", n & 0xFFFFFFFF)
        if self.val_kind == "int8":
            return struct.pack("=Q", n * 0x9E3779B1 & 0xFFFFFFFFFFFFFFFF)
        if self.val_kind == "fixed":
            size = self.val_width
        size = max(size, self.min_value_size)
        if self.max_value_size is not None:
            size = min(size, self.max_value_size)
        base = b"v%d:" % n
        return (base * (size // len(base) + 1))[:size]


    def dup_value(self, i: int) -> bytes:
        """The i-th of many distinct valid duplicate values (i < 2**24)."""
        if self.val_kind == "int4":
            return struct.pack("=I", i * 2654435761 & 0xFFFFFFFF)
        if self.val_kind == "int8":
            return struct.pack("=Q", i * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF)
        if self.val_kind == "fixed":
            return (i * 40503 & 0xFFFFFF).to_bytes(3, "big").rjust(self.val_width, b"d")
        return b"dup%06d" % i


def _spec(id, key_kind="bytes", val_kind="bytes", val_width=0, **flags):
    return DBSpec(id, tuple(sorted(flags.items())), key_kind, val_kind, val_width)


FLAG_COMBOS: List[DBSpec] = [
    _spec("plain"),
    _spec("reversekey", reverse_key=True),
    _spec("integerkey4", key_kind="int4", integerkey=True),
    _spec("integerkey8", key_kind="int8", integerkey=True),
    _spec("dupsort", dupsort=True),
    _spec("dupsort_dupfixed", val_kind="fixed", val_width=6, dupsort=True, dupfixed=True),
    _spec("dupsort_integerdup4", val_kind="int4", dupsort=True, integerdup=True),
    _spec("dupsort_integerdup8_dupfixed", val_kind="int8", dupsort=True,
          integerdup=True, dupfixed=True),
    _spec("dupsort_reversedup", dupsort=True, reverse_dup=True),
    _spec("dupsort_reversedup_dupfixed", val_kind="fixed", val_width=3,
          dupsort=True, reverse_dup=True, dupfixed=True),
    _spec("reversekey_dupsort", reverse_key=True, dupsort=True),
    _spec("reversekey_dupsort_reversedup", reverse_key=True, dupsort=True, reverse_dup=True),
    _spec("integerkey4_dupsort", key_kind="int4", integerkey=True, dupsort=True),
    _spec("integerkey8_dupsort_integerdup4_dupfixed", key_kind="int8", val_kind="int4",
          integerkey=True, dupsort=True, integerdup=True, dupfixed=True),
]
COMBOS_BY_ID: Dict[str, DBSpec] = {s.id: s for s in FLAG_COMBOS}
PLAIN = COMBOS_BY_ID["plain"]


# ---------------------------------------------------------------------------
# paths


def run_threads(target, n: int) -> None:
    """Run target(0) .. target(n - 1) in n threads at once; return when all
    have ended (the targets record their own failures)."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def read_syscalls() -> int:
    """Read system calls this process made so far (/proc/self/io syscr)."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("syscr:"):
                return int(line.split()[1])
    raise AssertionError("no syscr in /proc/self/io")


def cached_pages(fd: int, off: int, length: int) -> Optional[int]:
    """How many pages of [off, off+length) of file fd the OS cache holds.
    Asked with cachestat(2) (Linux 6.5), which reads nothing (a read, even
    one that may not wait, would start the OS's read-ahead); None where it
    is missing.  Its number is x86-64's: callers skip elsewhere."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    rng = (ctypes.c_uint64 * 2)(off, length)
    st = (ctypes.c_uint64 * 5)()
    if libc.syscall(451, fd, rng, st, 0) != 0:      # SYS_cachestat (x86-64)
        return None
    return st[0]


def os_cached(fd: int, off: int, length: int) -> Optional[bool]:
    """Is all of [off, off+length) of file fd in the OS cache?"""
    n = cached_pages(fd, off, length)
    return None if n is None else n * os.sysconf("SC_PAGE_SIZE") >= length


def evict(fd: int, ranges: Sequence[Tuple[int, int]]) -> None:
    """Drop file fd from the OS cache until no page of the (offset, length)
    ranges is left there (pages written a moment ago may wait in another
    core's batch, out of DONTNEED's reach); skips the test where that
    cannot be seen (no cachestat) or does not happen (a filesystem that
    keeps its pages)."""
    import pytest
    state = []
    for _ in range(20):
        os.fsync(fd)             # (dirty pages are not dropped)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        state = [cached_pages(fd, off, n) for off, n in ranges]
        if None in state:
            pytest.skip("no cachestat(2) here (Linux < 6.5)")
        if not any(state):
            return
        time.sleep(0.05)
    pytest.skip("the OS keeps the file cached (DONTNEED ignored)")


def wait_cached(fd: int, ranges: Sequence[Tuple[int, int]],
                seconds: float) -> List[Optional[bool]]:
    """Which (offset, length) ranges of file fd are in the OS cache, once
    all are or `seconds` have passed (read-ahead advice is asynchronous)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(os_cached(fd, off, n) for off, n in ranges):
            break
        time.sleep(0.01)
    return [os_cached(fd, off, n) for off, n in ranges]


def cached_after(fd: int, evict_ranges: Sequence[Tuple[int, int]],
                 ranges: Sequence[Tuple[int, int]], act, seconds: float,
                 attempts: int = 1) -> List[Optional[bool]]:
    """Evict evict_ranges of file fd from the OS cache, call act() (reads
    that may give read-ahead advice), and wait up to `seconds` for
    `ranges` (wait_cached): which are cached.  With attempts > 1 all of
    it is tried again while some are not: WILLNEED is a hint, which a busy
    machine's kernel may drop."""
    state: List[Optional[bool]] = []
    for _ in range(attempts):
        evict(fd, evict_ranges)
        act()
        state = wait_cached(fd, ranges, seconds)
        if all(state):
            break
    return state


@contextlib.contextmanager
def device_queue(path, **values: int) -> Iterator[None]:
    """The request queue of the block device holding `path` set to
    `values` (its sysfs names: read_ahead_kb, max_sectors_kb) meanwhile,
    then restored: storage as other machines have it.  Skips the test
    where they cannot be set (not root, no device of its own, no /sys)."""
    import pytest
    st = os.stat(path)
    dev = "/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    queue = next((q for q in (os.path.join(dev, "queue"),
                              os.path.join(dev, "..", "queue"))
                  if os.path.isdir(q)), None)
    if os.major(st.st_dev) == 0 or queue is None:
        pytest.skip("%s is not on a block device of its own" % path)
    # The request size first: writing max_sectors_kb makes the kernel
    # derive read_ahead_kb from it anew (6.18: 128 KiB requests gave a
    # 256 KiB window), so the window is set after it and read back.
    names = sorted(values, key=lambda n: n != "max_sectors_kb")
    window = os.path.join(queue, "read_ahead_kb")
    with open(window) as fh:
        window_was = fh.read().strip()
    old = {}
    try:
        for name in names:
            f = os.path.join(queue, name)
            with open(f) as fh:
                was = fh.read().strip()
            try:
                with open(f, "w") as fh:
                    fh.write(str(values[name]))
            except OSError as e:
                pytest.skip("cannot set %s (%s)" % (f, e.strerror))
            old[f] = was
        for name in names:
            with open(os.path.join(queue, name)) as fh:
                got = int(fh.read())
            if got != values[name]:
                pytest.skip("%s reads %d after writing %d"
                            % (name, got, values[name]))
        yield
    finally:
        # (in the order written, then the window as it was: restoring the
        # request size derived it anew)
        for f, value in old.items():
            with open(f, "w") as fh:
                fh.write(value)
        if old:
            with open(window, "w") as fh:
                fh.write(window_was)


def prefetch_threads(settle: float = 0.0) -> List[str]:
    """The Reader's prefetch threads alive in this process: Python lanes
    (threading name lmdbio-prefetch) and the window pipeline's C lanes
    (the OS thread name lmdbio-lane, from /proc/self/task).

    settle: wait up to this many seconds for them to be gone.  A joined
    thread can still be listed in /proc/self/task for a moment: the
    kernel lets pthread_join return before it has removed the task, a
    window that a loaded machine (a sanitizer build) makes visible.  A
    thread that was never stopped stays, and is still returned."""
    import time
    deadline = time.monotonic() + settle
    while True:
        names = _prefetch_threads_now()
        if not names or time.monotonic() >= deadline:
            return names
        time.sleep(0.01)


def _prefetch_threads_now() -> List[str]:
    import threading
    names = [t.name for t in threading.enumerate()
             if t.name == "lmdbio-prefetch" and t.is_alive()]
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % task) as fh:
                comm = fh.read().strip()
        except OSError:   # (it ended meanwhile)
            continue
        if comm == "lmdbio-lane":
            names.append(comm)
    return names


def data_file(path, subdir: bool = True) -> str:
    path = os.fspath(path)
    return os.path.join(path, "data.mdb") if subdir else path


def lock_file(path, subdir: bool = True) -> str:
    path = os.fspath(path)
    return os.path.join(path, "lock.mdb") if subdir else path + "-lock"


# ---------------------------------------------------------------------------
# a pure-Python model of a database's contents

Op = Tuple[str, bytes, Optional[bytes]]  # ("put", k, v) | ("del", k, v or None)


class Model:
    """Expected contents of one database after a sequence of puts/deletes."""

    def __init__(self, spec: DBSpec):
        self.spec = spec
        self.data: Dict[bytes, object] = {}  # key -> value, or set of dups

    def apply(self, op: Op) -> None:
        kind, k, v = op
        if kind == "put":
            if self.spec.dupsort:
                self.data.setdefault(k, set()).add(v)
            else:
                self.data[k] = v
        elif kind == "del":
            if k not in self.data:
                return
            if self.spec.dupsort and v is not None:
                self.data[k].discard(v)
                if not self.data[k]:
                    del self.data[k]
            else:
                del self.data[k]
        else:
            raise ValueError(kind)

    def items(self) -> List[Tuple[bytes, bytes]]:
        out = []
        for k in sorted(self.data, key=self.spec.key_order):
            if self.spec.dupsort:
                for v in sorted(self.data[k], key=self.spec.val_order):
                    out.append((k, v))
            else:
                out.append((k, self.data[k]))
        return out

    def __len__(self):
        return len(self.items())


# ---------------------------------------------------------------------------
# writing environments with py-lmdb

DEFAULT_MAP_SIZE = 64 << 20


def open_writer(path, subdir: bool = True, max_dbs: int = 32,
                map_size: int = DEFAULT_MAP_SIZE) -> "lmdb.Environment":
    return lmdb.open(os.fspath(path), subdir=subdir, max_dbs=max_dbs,
                     map_size=map_size, sync=False, metasync=False)


MDB_LOAD = shutil.which("mdb_load")
MDB_DUMP = shutil.which("mdb_dump")


def mdb_load_create(path, name: Optional[bytes], spec: DBSpec, subdir: bool = True) -> None:
    """Create an empty database with spec's flags using Debian's mdb_load.

    This is how the fixtures get flags py-lmdb cannot set: any flag on the
    main DB (py-lmdb: "May not set flags on the main database") and
    REVERSEDUP anywhere.  Once the record exists on disk, py-lmdb's writes use
    the on-disk flags (liblmdb takes a DB's flags from the file)."""
    if MDB_LOAD is None:
        raise RuntimeError("mdb_load (Debian lmdb-utils) is needed to create %r" % spec.id)
    if subdir:
        os.makedirs(os.fspath(path), exist_ok=True)
    text = "VERSION=3\nformat=bytevalue\ntype=btree\n"
    text += "".join(line + "\n" for line in spec.mdb_load_flags)
    text += "HEADER=END\nDATA=END\n"
    cmd = [MDB_LOAD]
    if not subdir:
        cmd.append("-n")
    if name is not None:
        cmd += ["-s", name.decode("latin-1")]
    cmd.append(os.fspath(path))
    subprocess.run(cmd, input=text.encode(), check=True, capture_output=True)


def write_env(path, dbs: Dict[Optional[bytes], Tuple[DBSpec, Sequence[Op]]],
              subdir: bool = True, txn_size: int = 0,
              map_size: int = DEFAULT_MAP_SIZE) -> Dict[Optional[bytes], Model]:
    """Write an environment at `path` with py-lmdb.

    dbs maps a database name (None = the main DB) to (spec, ops).  Ops run
    in the given order, one database after another.  txn_size > 0 commits
    every txn_size ops (more snapshots, more page reuse).  Named DBs are
    created even with no ops (an empty database).  Flags py-lmdb cannot set
    (main-DB flags, REVERSEDUP) are applied by pre-creating the database with
    mdb_load.  Returns the models of the expected contents.
    """
    models: Dict[Optional[bytes], Model] = {}
    for name, (spec, _ops) in dbs.items():
        if (name is None and spec.flags) or spec.needs_mdb_load:
            mdb_load_create(path, name, spec, subdir=subdir)
    env = open_writer(path, subdir=subdir, map_size=map_size,
                      max_dbs=max(1, len(dbs)))
    try:
        handles = {}
        for name, (spec, _ops) in dbs.items():
            if name is None:
                handles[name] = env.open_db(None)
            else:
                handles[name] = env.open_db(name, **spec.pylmdb_kwargs)
            models[name] = Model(spec)
        txn = env.begin(write=True)
        n = 0
        for name, (spec, ops) in dbs.items():
            db = handles[name]
            model = models[name]
            for op in ops:
                kind, k, v = op
                if kind == "put":
                    txn.put(k, v, db=db)
                else:
                    txn.delete(k, v if v is not None else b"", db=db)
                model.apply(op)
                n += 1
                if txn_size and n % txn_size == 0:
                    txn.commit()
                    txn = env.begin(write=True)
        txn.commit()
    finally:
        env.close()
    return models


def write_items(path, items: Iterable[Tuple[bytes, bytes]], spec: DBSpec = PLAIN,
                name: Optional[bytes] = None, subdir: bool = True,
                **kw) -> Model:
    """Simplest form: one database filled with `items` (put in that order)."""
    ops = [("put", k, v) for k, v in items]
    return write_env(path, {name: (spec, ops)}, subdir=subdir, **kw)[name]


def value_of(i: int, size: int) -> bytes:
    """Record i's value of `size` bytes: its number repeated, so that a
    value read from the wrong record or offset shows."""
    unit = b"%07d|" % i
    return (unit * (size // len(unit) + 1))[:size]


def write_sized(path, sizes: Sequence[int], order=None
                ) -> List[Tuple[bytes, bytes]]:
    """Records r000000, r000001, ... with values of these sizes (value_of),
    put in key order or in `order` (a permutation of their positions);
    returns them in key order."""
    items = [(b"r%06d" % i, value_of(i, s)) for i, s in enumerate(sizes)]
    write_items(path, items if order is None else [items[i] for i in order])
    return items


def sample_ops(spec: DBSpec, n_keys: int = 200, dups: int = 3, big_every: int = 0,
               big_size: int = 3 * OS_PAGE_SIZE, delete_every: int = 0) -> List[Op]:
    """Deterministic put/delete ops for `spec`: n_keys keys, `dups` values per
    key on DUPSORT dbs, every big_every-th value an overflow value (non-dupsort
    only), every delete_every-th op followed by the deletion of an earlier key."""
    ops: List[Op] = []
    for i in range(n_keys):
        k = spec.make_key(i)
        for d in range(dups if spec.dupsort else 1):
            size = 10 + (i * 7 + d) % 40
            if big_every and not spec.dupsort and i % big_every == big_every - 1:
                size = big_size
            ops.append(("put", k, spec.make_value(i * 1000 + d, size)))
        if delete_every and i % delete_every == delete_every - 1:
            ops.append(("del", spec.make_key(i // 2), None))
    return ops


def make_all_flags_env(path, subdir: bool = True, n_keys: int = 120,
                       dups: int = 3) -> Dict[Optional[bytes], Model]:
    """One environment with a named DB for every flag combination (named after
    DBSpec.id), an empty named DB b"empty", and data in the main DB."""
    dbs: Dict[Optional[bytes], Tuple[DBSpec, Sequence[Op]]] = {}
    for spec in FLAG_COMBOS:
        dbs[spec.id.encode()] = (spec, sample_ops(spec, n_keys, dups, big_every=17,
                                                  delete_every=9))
    dbs[b"empty"] = (PLAIN, [])
    dbs[None] = (PLAIN, [("put", b"zz-main-%03d" % i, b"m%d" % i) for i in range(20)])
    return write_env(path, dbs, subdir=subdir)


def read_all_pylmdb(path, subdir: bool = True, names: Sequence[Optional[bytes]] = (None,),
                    ) -> Dict[Optional[bytes], List[Tuple[bytes, bytes]]]:
    """Every (key, value) of the given databases, read with py-lmdb."""
    env = lmdb.open(os.fspath(path), subdir=subdir, readonly=True, lock=False,
                    max_dbs=max(1, len(names)))
    try:
        out = {}
        for name in names:
            db = env.open_db(name, create=False) if name is not None else None
            with env.begin(db=db) as txn:
                out[name] = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        return out
    finally:
        env.close()


def strip_named(items: Sequence[Tuple[bytes, bytes]], names: Iterable[Optional[bytes]]
                ) -> List[Tuple[bytes, bytes]]:
    """The main DB's items without the records of named databases (whose
    values are MDB_db records, not modelled)."""
    names = {n for n in names if n is not None}
    return [(k, v) for k, v in items if k not in names]


# ---------------------------------------------------------------------------
# parsing the file (for crafting corruptions and for structural assertions)


@dataclass
class DBRec:
    pad: int
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int
    offset: int = -1  # file offset of the 48-byte record

    @classmethod
    def parse(cls, buf, off) -> "DBRec":
        return cls(*struct.unpack_from(_DB_FMT, buf, off), offset=off)


@dataclass
class Meta:
    index: int
    offset: int          # file offset of the meta page
    page_flags: int
    magic: int
    version: int
    mapsize: int
    free_db: DBRec
    main_db: DBRec
    last_pg: int
    txnid: int

    @property
    def psize(self) -> int:
        return self.free_db.pad


@dataclass
class Node:
    pgno: int           # page holding the node
    index: int
    offset: int         # file offset of the node header
    lo: int
    hi: int
    flags: int
    ksize: int
    key: bytes
    dsize: int          # leaf: data size; branch: unused
    child: int          # branch: child pgno; leaf: -1

    @property
    def key_offset(self) -> int:
        return self.offset + NODESZ

    @property
    def data_offset(self) -> int:
        return self.offset + NODESZ + self.ksize


@dataclass
class PageInfo:
    pgno: int
    flags: int
    lower: int
    upper: int
    pages: int          # overflow runs
    level: int          # 0 = root
    parent: int         # -1 for the root
    db: str             # "main", "free", a named DB's name, or "dup:<...>"
    nodes: List[Node] = field(default_factory=list)


def page_offset(pgno: int, psize: int) -> int:
    return pgno * psize


def read_meta(buf, index: int, psize: Optional[int] = None) -> Meta:
    if psize is None:
        psize = struct.unpack_from("<I", buf, MM_PSIZE)[0]
    off = index * psize
    page_flags = struct.unpack_from("<H", buf, off + 10)[0]
    magic, version, _addr, mapsize = struct.unpack_from("<IIQQ", buf, off + MM_MAGIC)
    free_db = DBRec.parse(buf, off + MM_DBS_FREE)
    main_db = DBRec.parse(buf, off + MM_DBS_MAIN)
    last_pg, txnid = struct.unpack_from("<QQ", buf, off + MM_LAST_PG)
    return Meta(index, off, page_flags, magic, version, mapsize, free_db, main_db,
                last_pg, txnid)


def page_header(buf, off: int) -> Tuple[int, int, int, int, int, int]:
    """(pgno, pad, flags, lower, upper, pages) of the page header at off."""
    pgno, pad, flags, lower, upper = struct.unpack_from("<QHHHH", buf, off)
    pages = struct.unpack_from("<I", buf, off + 12)[0]
    return pgno, pad, flags, lower, upper, pages


def parse_nodes(buf, page_off: int, pgno: int) -> List[Node]:
    """Nodes of the branch/leaf page (or sub-page) starting at page_off."""
    _pg, _pad, flags, lower, _upper, _ = page_header(buf, page_off)
    n = (lower - PAGEHDRSZ) // 2
    nodes = []
    for i in range(n):
        ptr = struct.unpack_from("<H", buf, page_off + PAGEHDRSZ + 2 * i)[0]
        off = page_off + ptr
        lo, hi, nflags, ksize = struct.unpack_from("<HHHH", buf, off)
        key = bytes(buf[off + NODESZ: off + NODESZ + ksize])
        if flags & P_BRANCH:
            child = lo | hi << 16 | nflags << 32
            nodes.append(Node(pgno, i, off, lo, hi, nflags, ksize, key, 0, child))
        else:
            nodes.append(Node(pgno, i, off, lo, hi, nflags, ksize, key, lo | hi << 16, -1))
    return nodes


class LmdbFile:
    """A parsed LMDB data file (bytes in memory): metas, every reachable page
    of the current snapshot, named DBs, dup sub-trees and overflow runs."""

    def __init__(self, path, subdir: bool = True, meta: Optional[int] = None):
        self.path = data_file(path, subdir)
        with open(self.path, "rb") as f:
            self.buf = f.read()
        self.psize = struct.unpack_from("<I", self.buf, MM_PSIZE)[0]
        self.metas = [read_meta(self.buf, i, self.psize) for i in (0, 1)]
        if meta is None:
            meta = 0 if self.metas[0].txnid > self.metas[1].txnid else 1
        self.meta = self.metas[meta]
        self.pages: Dict[int, PageInfo] = {}
        self.named: Dict[bytes, DBRec] = {}
        self.named_nodes: Dict[bytes, Node] = {}
        self.dup_trees: List[Tuple[Node, DBRec]] = []
        self.subpages: List[Tuple[Node, int]] = []  # (node, file offset of sub-page)
        self._walk(self.meta.main_db, "main", main=True)
        self._walk(self.meta.free_db, "free")

    # -- walking ---------------------------------------------------------
    def _walk(self, db: DBRec, name: str, main: bool = False, dupsub: bool = False):
        if db.root == P_INVALID:
            return
        stack = [(db.root, 0, -1)]
        while stack:
            pgno, level, parent = stack.pop()
            if pgno in self.pages:
                raise ValueError("page %d reached twice" % pgno)
            off = pgno * self.psize
            _p, _pad, flags, lower, upper, pages = page_header(self.buf, off)
            info = PageInfo(pgno, flags, lower, upper, pages, level, parent, name)
            self.pages[pgno] = info
            if flags & P_LEAF2:
                continue
            info.nodes = parse_nodes(self.buf, off, pgno)
            if flags & P_BRANCH:
                for nd in reversed(info.nodes):
                    stack.append((nd.child, level + 1, pgno))
                continue
            for nd in info.nodes:
                if nd.flags & F_BIGDATA:
                    ov = struct.unpack_from("<Q", self.buf, nd.data_offset)[0]
                    _q, _pad2, oflags, _l, _u, opages = page_header(self.buf, ov * self.psize)
                    self.pages[ov] = PageInfo(ov, oflags, 0, 0, opages, level + 1, pgno, name)
                elif nd.flags & F_SUBDATA:
                    rec = DBRec.parse(self.buf, nd.data_offset)
                    if nd.flags & F_DUPDATA:
                        self.dup_trees.append((nd, rec))
                        self._walk(rec, "dup:%s" % name, dupsub=True)
                    elif main:
                        self.named[nd.key] = rec
                        self.named_nodes[nd.key] = nd
                        self._walk(rec, nd.key.decode("latin-1"))
                elif nd.flags & F_DUPDATA:
                    self.subpages.append((nd, nd.data_offset))

    # -- queries ---------------------------------------------------------
    def of_db(self, name: str = "main") -> List[PageInfo]:
        return sorted((p for p in self.pages.values() if p.db == name),
                      key=lambda p: p.pgno)

    def leaves(self, name: str = "main") -> List[PageInfo]:
        return [p for p in self.of_db(name) if p.flags & P_LEAF]

    def branches(self, name: str = "main") -> List[PageInfo]:
        return [p for p in self.of_db(name) if p.flags & P_BRANCH]

    def overflows(self, name: str = "main") -> List[PageInfo]:
        return [p for p in self.of_db(name) if p.flags & P_OVERFLOW]

    def bigdata_nodes(self, name: str = "main") -> List[Node]:
        return [nd for p in self.leaves(name) for nd in p.nodes if nd.flags & F_BIGDATA]

    def file_pages(self) -> int:
        return len(self.buf) // self.psize


# ---------------------------------------------------------------------------
# patching


def patch(path, offset: int, fmt: str, *values) -> None:
    """Overwrite struct.pack(fmt, *values) at `offset` of the file."""
    data = struct.pack(fmt, *values)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def patch_bytes(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def truncate(path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def patch_meta_field(path, meta_index: int, field_off: int, fmt: str, value,
                     psize: int = OS_PAGE_SIZE) -> None:
    patch(path, meta_index * psize + field_off, fmt, value)


def patch_dbrec(path, rec: DBRec, field_off: int, fmt: str, value) -> None:
    patch(path, rec.offset + field_off, fmt, value)


def patch_page_header(path, pgno: int, psize: int, *, pgno_field=None, pad=None,
                      flags=None, lower=None, upper=None, pages=None) -> None:
    base = pgno * psize
    if pgno_field is not None:
        patch(path, base, "<Q", pgno_field)
    if pad is not None:
        patch(path, base + 8, "<H", pad)
    if flags is not None:
        patch(path, base + 10, "<H", flags)
    if lower is not None:
        patch(path, base + 12, "<H", lower)
    if upper is not None:
        patch(path, base + 14, "<H", upper)
    if pages is not None:
        patch(path, base + 12, "<I", pages)


def set_branch_child(path, node: Node, child: int) -> None:
    """Point a branch node at page `child`."""
    patch(path, node.offset, "<HHH", child & 0xFFFF, (child >> 16) & 0xFFFF,
          (child >> 32) & 0xFFFF)


def set_leaf_dsize(path, node: Node, size: int) -> None:
    patch(path, node.offset, "<HH", size & 0xFFFF, (size >> 16) & 0xFFFF)
