"""Cold reads from a filesystem with no device of its own (NFS, FUSE, a
parallel filesystem's client), through benches/fuse_latency.py's mount: a
read-only FUSE passthrough that counts the read requests reaching it.

Such a filesystem's reads are not counted as blocks read in, so slow reads
are the storage's on their time alone (lookups and walks then read around
the pages they miss), and it may drop read-ahead advice (FUSE does while
its queue is busy), so the Reader reads the regions it would advise.  Each
test checks the records against py-lmdb's and the requests against the
pages read: without these, a cold lookup or a Reader's leaf was a request
of its own (53.6k requests for a 320 MB walk).  Hot, a probe finds the
regions in the OS cache, and no request reaches the mount."""

from __future__ import annotations

import ctypes.util
import os
import random
import sys

import pytest

from conftest import require

lmdb = require("lmdb", "pip install lmdb")
lmdbio = require("lmdbio")

# The system's side first (as tests/test_mdb_load.py with Debian's tools):
# fusepy loads libfuse 2 when imported, and mounting needs /dev/fuse and root.
if ctypes.util.find_library("fuse") is None:
    pytest.skip("libfuse 2 is not installed (apt-get install libfuse2 fuse)",
                allow_module_level=True)
if not (os.path.exists("/dev/fuse") and os.geteuid() == 0):
    pytest.skip("mounting the FUSE emulation of a network filesystem needs "
                "/dev/fuse and root", allow_module_level=True)
require("fuse", "pip install fusepy")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benches"))
from fuse_latency import LatencyMount  # noqa: E402

N = 6000


@pytest.fixture(scope="module")
def scattered(tmp_path_factory):
    """A database of N records of 400-600 bytes put in random key order
    (leaves scattered over the file), and its records by py-lmdb."""
    path = str(tmp_path_factory.mktemp("scattered"))
    rng = random.Random(5)
    items = [(b"%08d" % i, bytes([i % 251]) * rng.randrange(400, 600))
             for i in range(N)]
    order = items[:]
    rng.shuffle(order)
    env = lmdb.open(path, map_size=1 << 28)
    with env.begin(write=True) as txn:
        for k, v in order:
            txn.put(k, v)
    env.close()
    return path, items


@pytest.fixture
def mount(scattered, tmp_path):
    path, items = scattered
    with LatencyMount(path, str(tmp_path / "mnt"), delay_ms=0.2) as m:
        yield m, items


def _drop(mnt):
    """Drop the mount's cached pages of data.mdb (the next reads are
    requests again)."""
    fd = os.open(os.path.join(mnt.mountpoint, "data.mdb"), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _requests(mnt):
    return mnt.stats()["requests"]


def _file_pages(mnt):
    return os.path.getsize(os.path.join(mnt.mountpoint, "data.mdb")) // 4096


def _in_flight(mnt):
    """The most requests the mount has served at once so far."""
    return mnt.stats()["max_inflight"]


def test_cold_lookups_read_around(mount):
    m, items = mount
    keys = [k for k, _ in items]
    random.Random(1).shuffle(keys)
    keys = keys[:1500]
    want = dict(items)
    _drop(m)
    r0 = _requests(m)
    env = lmdbio.open(m.mountpoint, readonly=True, lock=False)
    with env.begin() as txn:
        got = [txn.get(k) for k in keys]
    env.close()
    used = _requests(m) - r0
    assert got == [want[k] for k in keys]
    # a request per lookup without read-around
    assert used < len(keys) / 5, used
    # the blocks read around are requests of the filesystem's own size,
    # several in flight (one large read is served as those requests one
    # after the other: a round trip each)
    # (8-10 in flight measured, 2-3 before: the kernel's own read-ahead)
    assert _in_flight(m) >= 5, m.stats()


def test_cold_walk_reads_around(mount):
    m, items = mount
    _drop(m)
    r0 = _requests(m)
    env = lmdbio.open(m.mountpoint, readonly=True, lock=False)
    with env.begin() as txn:
        got = list(txn.cursor())
    env.close()
    used = _requests(m) - r0
    assert got == items
    assert used < _file_pages(m) / 5, used


@pytest.mark.parametrize("shuffle", [False, True])
def test_reader_reads_the_regions_it_needs(mount, tmp_path, shuffle):
    m, items = mount
    cache = str(tmp_path / "index")
    kw = dict(batch_size=100, shuffle=shuffle, seed=3, index_cache=cache)
    with lmdbio.Reader(m.mountpoint, **kw) as r:   # the index, cached
        first = [(b.indices.tolist(), b.values.tolist()) for b in r]
    _drop(m)
    r0 = _requests(m)
    with lmdbio.Reader(m.mountpoint, **kw) as r:   # cold, a later start
        got = [(b.indices.tolist(), b.values.tolist()) for b in r]
        assert r.index_from_cache
    used = _requests(m) - r0
    assert got == first
    assert sorted(i for ind, _ in got for i in ind) == list(range(N))
    values = {i: v for ind, vs in got for i, v in zip(ind, vs)}
    assert [values[i] for i in range(N)] == [v for _, v in items]
    # a request per leaf when the regions were only advised
    assert used < _file_pages(m) / 5, used
    # hot: the regions probed as cached, nothing read from the storage
    r0 = _requests(m)
    with lmdbio.Reader(m.mountpoint, **kw) as r:
        again = [(b.indices.tolist(), b.values.tolist()) for b in r]
        given, skipped = r._file.advice_stats()
    assert again == got
    assert _requests(m) == r0
    # (a probe the scheduler delayed past its 20 us reads one region
    # again from the cache; the old code read every one: skipped 0)
    assert skipped > 3 * given, (given, skipped)
