"""Read-ahead advice: the Reader asks the kernel to read ahead the regions
its next windows need (WILLNEED) unless a probe finds them cached; asking
for a cached region costs the kernel a lookup of each of its pages.

A hot epoch gives no advice, an epoch over an evicted file gives some, and
the batches are the same either way.  Values in overflow runs out of file
order get the regions around their runs asked for, as leaves do.
"""

from __future__ import annotations

import os
import struct
import time

import numpy as np
import pytest

from conftest import require_lmdbio
from lmdb_fixtures import LmdbFile, cached_pages, value_of, write_sized

try:
    import lmdbio
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

RECORDS = 24000   # 800-byte values: about 20 MB, many 1 MiB regions


@pytest.fixture(scope="module")
def env_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("advice") / "db")
    write_sized(path, [800] * RECORDS)
    return path


def _data(path):
    return os.path.join(path, "data.mdb")


def _warm(path):
    with open(_data(path), "rb") as f:
        while f.read(1 << 20):
            pass


def _evict(path):
    """Drop the file's clean pages from the page cache (fsynced first)."""
    fd = os.open(_data(path), os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _epoch(path, cache_dir, **kw):
    with lmdbio.Reader(path, batch_size=256, lock=False, index_cache=cache_dir,
                       **kw) as r:
        batches = [(b.indices.copy(), bytes(b.values.data), b.values.offsets.copy())
                   for b in r]
        given, skipped = r._file.advice_stats()
    return batches, given, skipped


def _cached_fraction(path):
    """How much of the file the OS cache holds: counted (cachestat), else
    as 8 probes spread over it find it (a probe that misses starts a read
    and may find its page in by then).  None: cannot tell."""
    fd = os.open(_data(path), os.O_RDONLY)
    try:
        size, hit, probes = os.fstat(fd).st_size, 0, 8
        counted = cached_pages(fd, 0, size)
        if counted is not None:
            return min(1.0, counted * os.sysconf("SC_PAGE_SIZE") / size)
        for i in range(probes):
            try:
                if os.preadv(fd, [bytearray(1)], size * i // probes,
                             os.RWF_NOWAIT) == 1:
                    hit += 1
            except BlockingIOError:
                pass
            except OSError:
                return None   # no RWF_NOWAIT here
        return hit / probes
    finally:
        os.close(fd)


@pytest.mark.parametrize("shuffle", [False, True])
def test_hot_epoch_gives_no_advice(env_path, tmp_path, shuffle):
    cache = str(tmp_path / "ic")
    _epoch(env_path, cache, shuffle=shuffle)   # the index cached
    _warm(env_path)
    frac = _cached_fraction(env_path)
    if frac is None:
        pytest.skip("this kernel cannot probe the page cache (RWF_NOWAIT)")
    if frac < 1:
        pytest.skip("the page cache did not keep the file (memory pressure)")
    _, given, skipped = _epoch(env_path, cache, shuffle=shuffle)
    assert skipped > 0
    assert given == 0


@pytest.mark.parametrize("shuffle", [False, True])
def test_evicted_file_gets_advice_and_the_same_batches(env_path, tmp_path,
                                                       shuffle):
    cache = str(tmp_path / "ic")
    hot, _, _ = _epoch(env_path, cache, shuffle=shuffle)
    _evict(env_path)
    frac = _cached_fraction(env_path)
    if frac is None:
        pytest.skip("this kernel cannot probe the page cache (RWF_NOWAIT)")
    if frac > 0.5:
        pytest.skip("the page cache kept the file (cannot evict it here)")
    # The kernel's own read-ahead sometimes fetches the whole 20 MB file
    # while the first window is read (about one run in twenty here), so
    # that every region is then found cached: advice must be given
    # in one of three evicted epochs, and every epoch's batches must match.
    given = []
    for attempt in range(3):
        _evict(env_path)   # (a probe by reading brings a few pages in)
        cold, g, _ = _epoch(env_path, cache, shuffle=shuffle)
        given.append(g)
        assert len(cold) == len(hot)
        for (ia, va, oa), (ib, vb, ob) in zip(cold, hot):
            assert np.array_equal(ia, ib)
            assert va == vb
            assert np.array_equal(oa, ob)
        if g > 0:
            break
    assert max(given) > 0, given


def test_advice_for_records_not_counted_names_the_leaves_counted_would(
        env_path):
    """A first start advises its windows before their leaves are counted,
    each record's leaf estimated from an even spread of the records left
    and a run of consecutive ordinals skipped a leaf's worth at a time.
    Over a file of equal records the estimate is exact: with one page a
    region, every range names as many leaves as the counted index does."""
    from lmdbio._bulk import BulkFile
    env = lmdbio.open(env_path, readonly=True, lock=False)
    psize = env.stat()["psize"]
    env.close()
    f = BulkFile(_data(env_path))
    try:
        assert f.snapshot(0)
        f.select(None)
        ranges = [(0, RECORDS), (1001, 5003), (1003, 1011), (17, 18),
                  (RECORDS - 7, RECORDS)]

        def named(start, stop):
            f.set_cache(psize, 1, False)   # (a new pass: nothing advised)
            before = sum(f.advice_stats())
            f.advise(np.arange(start, stop))
            return sum(f.advice_stats()) - before

        f.build_index()
        per_leaf = RECORDS // f.tree_leaves
        assert per_leaf > 1 and RECORDS % f.tree_leaves == 0
        counted = [named(a, b) for a, b in ranges]
        assert counted[0] == f.tree_leaves
        f.begin_index()
        assert f.index_pending
        assert [named(a, b) for a, b in ranges] == counted
    finally:
        f.close()


def test_cached_and_evicted_files_get_the_same_windows_and_batches(
        env_path, tmp_path):
    """An epoch in key order gets 2 MiB windows whether the OS cache holds
    the file or not (at most a quarter of prefetch_bytes; shuffled epochs
    4 MiB), and the batches are the same either way."""
    from lmdbio import reader as reader_mod
    budget = reader_mod._window_budget(64 << 20, False, 2)
    assert budget == reader_mod._ORDERED_WINDOW_BYTES == 2 << 20
    assert reader_mod._window_budget(1 << 20, False, 2) == (1 << 20) // 4
    assert reader_mod._window_budget(64 << 20, True, 2) == \
        reader_mod._WINDOW_BYTES == 4 << 20
    cache = str(tmp_path / "ic")
    _warm(env_path)
    frac = _cached_fraction(env_path)
    if frac is None or frac < 1:
        pytest.skip("cannot probe the page cache, or it did not keep the file")
    with lmdbio.Reader(env_path, lock=False, index_cache=cache) as r:
        hot = [(b.indices.copy(), bytes(b.values.data)) for b in r]
        assert r.window_stats["window_budget"] == budget
    _evict(env_path)
    frac = _cached_fraction(env_path)
    if frac is None or frac > 0.5:
        pytest.skip("the page cache kept the file (cannot evict it here)")
    with lmdbio.Reader(env_path, lock=False, index_cache=cache) as r:
        cold = [(b.indices.copy(), bytes(b.values.data)) for b in r]
        assert r.window_stats["window_budget"] == budget
    assert len(cold) == len(hot)
    for (ia, va), (ib, vb) in zip(cold, hot):
        assert np.array_equal(ia, ib) and va == vb


def _drop_pages(path, offsets):
    """Read the file into the OS cache in single pages, then drop one page
    at each offset; False where the cache keeps one of them.  (Read-ahead
    and writes cache a file in large folios, which DONTNEED drops only
    whole; reads advised RANDOM cache it page by page.)"""
    _evict(path)
    fd = os.open(_data(path), os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        at = 0
        while os.pread(fd, 1 << 20, at):
            at += 1 << 20
        for off in offsets:
            os.posix_fadvise(fd, off, 4096, os.POSIX_FADV_DONTNEED)
        return all(cached_pages(fd, off, 4096) == 0 for off in offsets)
    finally:
        os.close(fd)


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
@pytest.mark.parametrize("where,advised", [(160 << 10, False),
                                           (0, True)])
def test_regions_are_checked_by_sampling_their_pages(env_path, tmp_path,
                                                     where, advised):
    """Where the kernel counts cached pages (cachestat), a region's check
    counts a few ranges spread over it, its first page among them (a whole
    1 MiB count costs the kernel a walk of every page).  With one page of
    every region gone from the OS cache, between the samples the region
    passes for cached and the window reads the page itself; at its start
    the region is advised.  The batches are the same either way."""
    path, cache = env_path, str(tmp_path / "ic")
    hot, _, _ = _epoch(path, cache)
    fd = os.open(_data(path), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if cached_pages(fd, 0, size) is None:
            pytest.skip("no cachestat(2) here (Linux < 6.5): regions are "
                        "probed page by page")
    finally:
        os.close(fd)
    dropped = [r + where for r in range(0, size - (1 << 20), 1 << 20)]
    if not _drop_pages(path, dropped):
        pytest.skip("the OS cache kept a page DONTNEED named")
    fd = os.open(_data(path), os.O_RDONLY)
    try:
        cached = cached_pages(fd, 0, size)
    finally:
        os.close(fd)
    if cached * 4096 != size - 4096 * len(dropped):
        pytest.skip("the OS cache did not keep the rest of the file")
    got, given, _ = _epoch(path, cache)
    assert (given > 0) == advised, given
    assert len(got) == len(hot)
    for (ia, va, oa), (ib, vb, ob) in zip(got, hot):
        assert np.array_equal(ia, ib)
        assert va == vb
        assert np.array_equal(oa, ob)


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_a_window_asks_for_the_regions_of_its_values_runs(tmp_path):
    """Values of one overflow page put in random key order after a compact
    tree (compact_tree): the first batch's values lie all over the file.
    From an evicted file, the window that reads them asks for the 1 MiB
    regions around their runs, so pages of those regions far from any of
    the runs arrive in the OS cache too (a region holds values that later
    windows read); the batch is py-lmdb's."""
    from test_values_ahead import compact_tree   # (needs hypothesis)
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = compact_tree(path, [3000] * 8000, seed=7)
    f = LmdbFile(path)
    run_of = {nd.key: struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
              for nd in f.bigdata_nodes("t")}
    del f
    ps = os.sysconf("SC_PAGE_SIZE")
    runs = [run_of[k] for k, _v in items[:8]]
    per_region = (1 << 20) // ps
    pages = sorted({p for r in runs
                    for p in range(r // per_region * per_region,
                                   (r // per_region + 1) * per_region)
                    if all(abs(p - q) * ps > (384 << 10) for q in runs)})
    assert len(pages) >= 50
    fd = os.open(_data(path), os.O_RDONLY)
    try:
        _evict(path)
        if any(cached_pages(fd, p * ps, ps) for p in pages):
            pytest.skip("the page cache kept the file (cannot evict it here)")
        with lmdbio.Reader(path, db="t", batch_size=8, lock=False,
                           index_cache=False) as r:
            first = next(iter(r))
            assert [bytes(v) for v in first.values] == \
                [v for _k, v in items[:8]]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and \
                    not all(cached_pages(fd, p * ps, ps) for p in pages):
                time.sleep(0.05)
            missing = [p for p in pages if not cached_pages(fd, p * ps, ps)]
            assert not missing, (len(missing), len(pages))
    finally:
        os.close(fd)


def test_first_start_asks_for_the_regions_dense_in_branch_pages(env_path,
                                                                tmp_path):
    """Long keys make branch pages that hold few children, one every few
    leaves of an appended tree: a first start asks for the regions where
    a branch level is dense before reading it, so that the storage reads
    them whole rather than a request a page.  Short keys (branch pages far
    apart) and cache="drop" ask for none.  The epoch is the same."""
    from lmdb_fixtures import write_items
    long_path = str(tmp_path / "long_keys")
    items = [((b"%08d" % i) * 50, value_of(i, 300)) for i in range(12000)]
    write_items(long_path, items)
    size = os.path.getsize(_data(long_path))
    regions = -(-size // (1 << 20))

    def at_open(path, **kw):
        cache = str(tmp_path / ("ic%d" % len(os.listdir(tmp_path))))
        r = lmdbio.Reader(path, batch_size=500, lock=False,
                          index_cache=cache, **kw)
        with r:
            assert not r.index_from_cache
            asked = sum(r._file.advice_stats())
            got = [(k, v) for b in r for k, v in zip(b.keys.tolist(),
                                                     b.values.tolist())]
        return asked, got

    asked, got = at_open(long_path)
    assert got == items
    # (every region holds branch pages; the top levels' few pages none)
    assert regions // 2 <= asked <= regions
    asked, got = at_open(long_path, cache="drop")
    assert asked == 0 and got == items
    asked, got = at_open(env_path)
    assert asked == 0 and len(got) == RECORDS
