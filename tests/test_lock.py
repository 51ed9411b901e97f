"""lock=True: lmdbio holds reader slots in lock.mdb exactly as a liblmdb
reader does, side by side with py-lmdb (the writer here).

Tests taking the ``subject`` fixture run against lmdbio and, as a check of
the tests' own logic, against py-lmdb (conftest.py).  Tests that put lmdbio
and py-lmdb on one path in one process are lmdbio-only (py-lmdb refuses a
second handle of its own).  Writers and "other programs" run in
subprocesses with py-lmdb, because fcntl locks belong to processes.

Linux only (fcntl lock layout, /proc).  The C-level protocol is tested
against liblmdb itself in tests/c/test_lockfile.c.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading

import lmdb
import pytest

from conftest import import_subject

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="LMDB lock-file protocol on Linux")

LOCK_MAGIC = 0xBEEFC0DE
LOCK_FORMAT = 0x00010001      # liblmdb 0.9.x with POSIX robust mutexes
NKEYS = 400


def key(i):
    return b"key%06d" % i


def value(i, gen):
    n = 3000 if i % 50 == 0 else 120       # some values on overflow pages
    return (b"%d:%d:" % (gen, i) * (n // 8 + 1))[:n]


def written(i, gen):
    """Key i's value after WRITER's commit of generation gen (None: deleted)."""
    return None if (i + gen) % 3 == 0 else value(i, gen)


def make_env(path, subdir=True, gen=0, commits=1):
    env = lmdb.open(str(path), subdir=subdir, map_size=64 << 20)
    for g in range(gen, gen + commits):
        with env.begin(write=True) as txn:
            for i in range(NKEYS):
                txn.put(key(i), value(i, g))
    env.close()


def lock_file(path, subdir=True):
    return os.path.join(str(path), "lock.mdb") if subdir else str(path) + "-lock"


def read_lock_header(lock_path):
    """The first 64 bytes of a lock file, read by another process: a close()
    of any descriptor on lock.mdb in this process would drop every
    process-owned fcntl lock this process holds on it (py-lmdb's)."""
    return bytes.fromhex(run_py("""
        import sys
        with open(sys.argv[1], "rb") as f:
            print(f.read(64).hex())
        """, lock_path).strip())


def patch_lock_file(lock_path, offset, data):
    """Overwrite bytes of a lock file from another process (see above)."""
    run_py("""
        import os, sys
        fd = os.open(sys.argv[1], os.O_RDWR)
        os.pwrite(fd, bytes.fromhex(sys.argv[3]), int(sys.argv[2]))
        os.close(fd)
        """, lock_path, offset, data.hex())


def run_py(code, *args, timeout=120):
    """Run Python code in a subprocess (py-lmdb available as lmdb)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)] + [str(a) for a in args],
        capture_output=True, text=True, timeout=timeout,
        cwd=os.path.dirname(os.path.abspath(__file__)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


WRITER = """
import sys, lmdb
from test_lock import key, value, NKEYS
path, subdir, gen0, commits = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
expect_pid = int(sys.argv[5]) if len(sys.argv) > 5 else 0
expect_txnid = sys.argv[6] if len(sys.argv) > 6 else None
env = lmdb.open(path, subdir=subdir, map_size=64 << 20)
if expect_pid:
    rows = [l.split() for l in env.readers().splitlines()[1:]]
    assert [str(expect_pid), expect_txnid] in [[r[0], r[2]] for r in rows], env.readers()
    assert env.reader_check() == 0          # a live lmdbio slot is kept
    assert str(expect_pid) in env.readers()
for g in range(gen0, gen0 + commits):
    with env.begin(write=True) as txn:
        for i in range(NKEYS):
            if (i + g) % 3 == 0:
                txn.delete(key(i))
            else:
                txn.put(key(i), value(i, g))
print(env.info()["last_txnid"])
env.close()
"""


def write(path, gen0, commits, subdir=True, expect=None):
    args = [path, "1" if subdir else "0", gen0, commits]
    if expect:
        args += [expect[0], expect[1]]
    return int(run_py(WRITER, *args))


def reader_rows(text):
    """[(pid, txnid or '-')] from a readers() text (or several)."""
    return [(int(f[0]), f[2]) for f in map(str.split, text.splitlines())
            if len(f) == 3 and f[0].isdigit()]


# struct flock on Linux x86_64/aarch64: short, short, off_t, off_t, pid_t.
FLOCK = "hhxxxxqqixxxx"


def other_process_view(lock_path, pid):
    """From another process: (can take byte 0 exclusively, byte pid locked)."""
    out = run_py("""
        import fcntl, os, struct, sys
        fd = os.open(sys.argv[1], os.O_RDWR)
        pid = int(sys.argv[2])
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            excl = 1
        except OSError:
            excl = 0
        r = fcntl.fcntl(fd, fcntl.F_GETLK,
                        struct.pack(sys.argv[3], fcntl.F_WRLCK, 0, pid, 1, 0))
        print(excl, int(struct.unpack(sys.argv[3], r)[0] != fcntl.F_UNLCK))
        """, lock_path, pid, FLOCK)
    excl, alive = out.split()
    return excl == "1", alive == "1"


class SharedHolder:
    """Another process holding a shared lock on byte 0 (as any env user)."""

    def __init__(self, lock_path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent("""
                import fcntl, os, sys
                fd = os.open(sys.argv[1], os.O_RDWR)
                fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0)
                print("ready", flush=True)
                sys.stdin.read()
                """), lock_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def lmdbio_mod():
    return import_subject("lmdbio")


@pytest.fixture
def envdir(tmp_path):
    path = tmp_path / "env"
    make_env(path, commits=2)
    return path


def open_reader(subject, path, **kw):
    kw.setdefault("subdir", True)
    return subject.open(str(path), readonly=True, **kw)


# ---------------------------------------------------------------------------
# lock=False / lock file creation


def test_lock_false_touches_no_lock_file(subject, envdir):
    os.unlink(lock_file(envdir))
    env = open_reader(subject, envdir, lock=False)
    with env.begin() as txn:
        assert txn.get(key(1)) == value(1, 1)
        assert env.readers() == "(no reader locks)\n"
        assert env.info()["num_readers"] == 0
    env.close()
    assert not os.path.exists(lock_file(envdir))


@pytest.mark.parametrize("subdir", [True, False])
def test_creates_compatible_lock_file(subject, tmp_path, subdir):
    path = tmp_path / ("env" if subdir else "env.mdb")
    make_env(path, subdir=subdir, commits=3)
    lp = lock_file(path, subdir)
    os.unlink(lp)
    env = open_reader(subject, path, subdir=subdir)
    assert os.path.exists(lp)
    head = read_lock_header(lp)
    assert struct.unpack_from("<II", head, 0) == (LOCK_MAGIC, LOCK_FORMAT)
    assert struct.unpack_from("<Q", head, 48)[0] == 3     # mti_txnid
    assert os.path.getsize(lp) == 128 + 64 * env.max_readers()
    with env.begin() as txn:
        assert txn.id() == 3
        # a py-lmdb writer process joins the table, sees us, commits
        assert write(path, 10, 2, subdir, (os.getpid(), "3")) == 5
        assert txn.get(key(1)) == value(1, 2)              # still snapshot 3
    with env.begin() as txn:
        assert txn.id() == 5
        assert txn.get(key(1)) == written(1, 11)
        assert txn.get(key(2)) == written(2, 11)
    env.close()


# ---------------------------------------------------------------------------
# the pin


def test_snapshot_pinned_against_live_writer(subject, envdir):
    env = open_reader(subject, envdir)
    txn = env.begin()
    tid = txn.id()
    assert (os.getpid(), str(tid)) in reader_rows(env.readers())
    assert env.info()["num_readers"] >= 1
    before = list(txn.cursor())
    assert len(before) == NKEYS
    # 40 commits rewriting and deleting keys: without the pin, the pages of
    # snapshot `tid` would be reused many times over.
    assert write(envdir, 100, 40, expect=(os.getpid(), str(tid))) == tid + 40
    assert list(txn.cursor()) == before
    assert [txn.get(k) for k, _ in before] == [v for _, v in before]
    txn.abort()
    with env.begin() as txn2:
        assert txn2.id() == tid + 40
        assert txn2.get(key(1)) == written(1, 139)
    env.close()


def test_readers_lists_slot_and_releases_it(subject, envdir):
    env = open_reader(subject, envdir)
    with env.begin() as txn:
        rows = reader_rows(env.readers())
        assert (os.getpid(), str(txn.id())) in rows
        out = run_py("""
            import sys, lmdb
            env = lmdb.open(sys.argv[1], readonly=True)
            print(env.readers(), end="")
            """, envdir)
        assert (os.getpid(), str(txn.id())) in reader_rows(out)
    rows = reader_rows(env.readers())
    assert (os.getpid(), "2") not in rows
    env.close()


def test_reader_check_keeps_live_clears_dead(subject, subject_name, envdir):
    script = """
        import os, sys, signal
        import %s as m
        env = m.open(sys.argv[1], readonly=True)
        txn = env.begin()
        print(txn.id(), flush=True)
        if sys.argv[2] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stdin.read()
        """ % subject_name
    live = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script),
                             str(envdir), "live"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert live.stdout.readline().strip() == "2"
    dead = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script),
                             str(envdir), "die"], stdout=subprocess.PIPE,
                            text=True)
    assert dead.stdout.readline().strip() == "2"
    assert dead.wait(timeout=60) == -signal.SIGKILL
    try:
        out = run_py("""
            import sys, lmdb
            env = lmdb.open(sys.argv[1], readonly=True)
            before = env.readers()
            n = env.reader_check()
            print(n); print(before, end=""); print("--"); print(env.readers(), end="")
            """, envdir)
        n, rest = out.split("\n", 1)
        before, after = rest.split("--\n")
        assert int(n) == 1
        assert {(live.pid, "2"), (dead.pid, "2")} <= set(reader_rows(before))
        assert (live.pid, "2") in reader_rows(after)
        assert dead.pid not in [p for p, _ in reader_rows(after)]
        assert other_process_view(lock_file(envdir), live.pid)[1]
    finally:
        live.stdin.close()
        live.wait(timeout=60)


def test_threads_share_the_table(subject, envdir):
    env = open_reader(subject, envdir, max_spare_txns=0)
    errors = []

    def work():
        try:
            for _ in range(50):
                with env.begin() as txn:
                    assert txn.get(key(2)) is not None
        except Exception as exc:          # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    write(envdir, 300, 10)
    for t in threads:
        t.join()
    assert not errors
    assert env.info()["num_readers"] <= 7
    env.close()


# ---------------------------------------------------------------------------
# bad lock files (another process holds the table, so nobody re-initializes)


def test_bad_magic_and_format(subject, envdir):
    lp = lock_file(envdir)
    holder = SharedHolder(lp)
    try:
        patch_lock_file(lp, 0, struct.pack("<I", 0x12345678))
        with pytest.raises(subject.InvalidError) as exc:
            env = open_reader(subject, envdir)
            env.begin().abort()
        if subject.__name__ == "lmdbio":
            assert lp in str(exc.value)
        patch_lock_file(lp, 0, struct.pack("<II", LOCK_MAGIC, 0x5AA02002))
        with pytest.raises(subject.VersionMismatchError) as exc:
            env = open_reader(subject, envdir)
            env.begin().abort()
        if subject.__name__ == "lmdbio":
            assert lp in str(exc.value)
    finally:
        holder.close()
    # alone, the file is re-initialized, as liblmdb does
    env = open_reader(subject, envdir)
    with env.begin() as txn:
        assert txn.id() == 2
    env.close()


# ---------------------------------------------------------------------------
# lmdbio and py-lmdb on one path in one process


def test_same_process_lmdbio_first(lmdbio_mod, envdir):
    lp = lock_file(envdir)
    env = lmdbio_mod.open(str(envdir), readonly=True)
    txn = env.begin()
    assert txn.id() == 2
    before = list(txn.cursor())
    penv = lmdb.open(str(envdir), map_size=64 << 20)   # joins, no re-init
    assert (os.getpid(), "2") in reader_rows(penv.readers())
    assert penv.readers() == env.readers()             # one table
    with penv.begin() as ptxn:
        assert ptxn.id() == 2
    for g in range(20):                                  # writes in-process
        with penv.begin(write=True) as w:
            for i in range(NKEYS):
                w.put(key(i), value(i, 500 + g))
    assert list(txn.cursor()) == before                  # still pinned
    txn.abort()
    env.close()
    # py-lmdb's locks survive lmdbio's close
    excl, alive = other_process_view(lp, os.getpid())
    assert not excl and alive
    with penv.begin() as ptxn:
        assert ptxn.get(key(1)) == value(1, 519)
    assert write(envdir, 600, 1) == 23                  # another writer
    penv.close()
    assert other_process_view(lp, os.getpid()) == (True, False)


def test_same_process_pylmdb_first(lmdbio_mod, envdir):
    lp = lock_file(envdir)
    penv = lmdb.open(str(envdir), readonly=True)
    ptxn = penv.begin()
    env = lmdbio_mod.open(str(envdir), readonly=True)    # shares, no re-init
    assert env.info()["num_readers"] == penv.info()["num_readers"] >= 1
    with env.begin() as txn:
        assert txn.id() == 2
        assert env.readers() == penv.readers()
        assert write(envdir, 700, 5, expect=(os.getpid(), "2")) == 7
        assert txn.get(key(1)) == value(1, 1)
    ptxn.abort()
    env.close()
    excl, alive = other_process_view(lp, os.getpid())
    assert not excl and alive                             # py-lmdb's, kept
    with penv.begin() as ptxn:
        assert ptxn.id() == 7
    penv.close()
    assert other_process_view(lp, os.getpid()) == (True, False)


def test_same_process_pylmdb_closes_first(lmdbio_mod, envdir):
    lp = lock_file(envdir)
    penv = lmdb.open(str(envdir), readonly=True)
    with penv.begin():
        pass
    env = lmdbio_mod.open(str(envdir), readonly=True)
    penv.close()               # drops process-owned locks; lmdbio's byte 0 stays
    assert not other_process_view(lp, os.getpid())[0]
    with env.begin() as txn:   # the pid lock is taken again
        assert other_process_view(lp, os.getpid())[1]
        assert write(envdir, 800, 3, expect=(os.getpid(), str(txn.id()))) == 5
        assert txn.get(key(1)) == value(1, 1)
    env.close()
    assert other_process_view(lp, os.getpid()) == (True, False)


# ---------------------------------------------------------------------------
# one lock registry per process: a Reader, a drop-in Environment and py-lmdb
# on one path, closed in every order

SEEN_BY_WRITER = """
import sys, lmdb
from test_lock import key, value, NKEYS
path, pid, gen0 = sys.argv[1], sys.argv[2], int(sys.argv[3])
want = sorted(sys.argv[4].split(",")) if sys.argv[4] else []
env = lmdb.open(path, map_size=64 << 20)
assert env.reader_check() == 0, env.readers()   # no slot of ours looks dead
rows = [l.split() for l in env.readers().splitlines()[1:]]
mine = sorted(r[2] for r in rows if r[0] == pid)
for t in want:                                   # every live reader is there
    assert t in mine, (want, env.readers())
for g in range(gen0, gen0 + 3):                  # and pins its snapshot
    with env.begin(write=True) as txn:
        for i in range(NKEYS):
            if (i + g) % 3 == 0:
                txn.delete(key(i))
            else:
                txn.put(key(i), value(i, g))
env.close()
"""


@pytest.mark.parametrize("order", ["REP", "RPE", "ERP", "EPR", "PRE", "PER"])
def test_one_lock_registry_per_process(lmdbio_mod, envdir, order):
    """R (Reader, lock=True), E (drop-in Environment, lock=True) and P
    (py-lmdb) on one path in this process; after each close a writer in
    another process still sees every live lmdbio reader (reader_check clears
    none of them) and cannot overwrite what they read.  liblmdb's close
    (P) clears the slots of this process it knows of (its known behaviour):
    E takes a new one at its next transaction; R's snapshot is checked while
    P is open."""
    lp = lock_file(envdir)
    pid = os.getpid()
    snap = [(key(i), value(i, 1)) for i in range(NKEYS)]

    def read_reader(r):
        items = []
        for b in r:
            items += zip(b.keys.tolist(), b.values.tolist())
        return items

    reader = lmdbio_mod.Reader(str(envdir), lock=True, batch_size=64,
                               index_cache=False)
    env = lmdbio_mod.open(str(envdir), readonly=True, lock=True)
    txn = env.begin()
    penv = lmdb.open(str(envdir), readonly=True)
    ptxn = penv.begin()
    assert read_reader(reader) == sorted(snap)
    open_ = set("REP")
    gen = 100
    for step, who in enumerate(order):
        if who == "R":
            reader.close()
        elif who == "E":
            txn.abort()
            env.close()
        else:
            ptxn.abort()
            penv.close()
        open_.discard(who)
        want = []
        if "E" in open_:
            txn.abort()
            txn = env.begin()           # a fresh slot (see the docstring)
            want.append(str(txn.id()))
            before = list(txn.cursor())
        if "R" in open_ and "P" in open_:
            want.append("2")            # the Reader's pinned snapshot
        run_py(SEEN_BY_WRITER, envdir, pid, gen, ",".join(want))
        gen += 10
        if "E" in open_:
            assert list(txn.cursor()) == before
        if "R" in open_ and "P" in open_:
            assert read_reader(reader) == sorted(snap)
    # everything closed: no lock of this process is left on the file
    assert other_process_view(lp, pid) == (True, False)
