"""A first start in key order counts the leaves as its windows read them.

With no cached index, a Reader that reads in key order (no shuffle, a whole
index) does not read every leaf at open to count it: it reads the branch
levels, and each window counts the leaves it reads for its records (one
read of each leaf instead of two).  That path must return exactly what a
start with the index built first returns and what py-lmdb says, on every
database flag combination; it must really read each leaf about once; the
index it saves once every leaf is counted must be the one a build at open
saves, record map included; an epoch left early saves nothing and leaves no
thread; read() counts the rest first; a damaged leaf fails the batch that
needs it after every batch before it (tests/test_reader.py).
"""

from __future__ import annotations

import glob
import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_lmdbio
from lmdb_fixtures import (COMBOS_BY_ID, FLAG_COMBOS, MD_ENTRIES, LmdbFile,
                           data_file, make_all_flags_env, patch_dbrec,
                           prefetch_threads, read_all_pylmdb,
                           set_branch_child, value_of, write_env,
                           write_items, write_sized)

try:
    import lmdbio
    from lmdbio import reader as reader_mod
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)


def epoch(path, cache, **kw):
    """(batches as lists, index from the cache, bytes read) of one epoch."""
    with lmdbio.Reader(path, index_cache=cache, **kw) as r:
        got = [(b.indices.tolist(),
                None if b.keys is None else b.keys.tolist(),
                b.values.tolist()) for b in r]
        return got, r.index_from_cache, r.io_stats()[1]


def cached_index(cache):
    """(leaves, first, map) of the one index file in `cache`."""
    (path,) = glob.glob(os.path.join(cache, "*.npy"))
    leaves, first, pending = reader_mod._load_index_file(
        path, np.load(path)[:9])
    return leaves, first, \
        None if pending is None else reader_mod._read_recmap(pending)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 10, 300, 800, 2100, 4080, 9000]),
                      min_size=1, max_size=900),
       scattered=st.booleans(), bs=st.sampled_from([1, 7, 64, 1000]),
       prefetch=st.sampled_from([1, 64 << 10, 64 << 20]),
       keys=st.booleans(), seed=st.integers(0, 3))
def test_first_start_reads_what_a_built_index_reads(sizes, scattered, bs,
                                                    prefetch, keys, seed):
    with tempfile.TemporaryDirectory() as tmp:
        order = np.random.default_rng(seed).permutation(len(sizes)) \
            if scattered else None
        items = write_sized(tmp, sizes, order)
        kw = dict(batch_size=bs, prefetch_bytes=prefetch, keys=keys)
        first, from_cache, _ = epoch(tmp, os.path.join(tmp, "c1"), **kw)
        assert not from_cache
        later, from_cache, _ = epoch(tmp, os.path.join(tmp, "c1"), **kw)
        assert from_cache and later == first
        # the index saved by the first start is the one a build at open
        # (a shuffled start) saves, record map included
        with lmdbio.Reader(tmp, shuffle=True,
                           index_cache=os.path.join(tmp, "c2")):
            pass
        a, b = cached_index(os.path.join(tmp, "c1")), \
            cached_index(os.path.join(tmp, "c2"))
        for x, y in zip(a, b):
            assert (x is None) == (y is None)
            if x is not None:
                assert np.array_equal(x, y)
    want = [(k, v) for k, v in items]
    got = [(k, v) for ind, ks, vs in first
           for k, v in zip(ks or [b""] * len(vs), vs)]
    assert [v for _, v in got] == [v for _, v in want]
    if keys:
        assert [k for k, _ in got] == [k for k, _ in want]
    assert [i for ind, _, _ in first for i in ind] == list(range(len(items)))


@pytest.mark.parametrize("name", [s.id.encode() for s in FLAG_COMBOS])
def test_every_flag_combination(tmp_path, name):
    path = str(tmp_path / "env")
    os.makedirs(path)
    make_all_flags_env(path, n_keys=150, dups=4)
    want = read_all_pylmdb(path, names=[name])[name]
    for cache in (str(tmp_path / "c"), str(tmp_path / "c")):  # first, later
        with lmdbio.Reader(path, db=name, batch_size=16,
                           index_cache=cache) as r:
            got = [(k, v) for b in r
                   for k, v in zip(b.keys.tolist(), b.values.tolist())]
        assert got == want


def test_each_leaf_is_read_about_once(tmp_path):
    """The first start's epoch reads about what a later start's reads (its
    windows' leaves, a few re-read at window edges: each window reads
    1/32 of its leaves and two more on each side beyond those expected,
    about 10% over a cached file's 1 MiB windows), where building the
    index first had read every leaf twice."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    write_sized(path, [700] * 20000)
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    cache = str(tmp_path / "c")
    _, _, first = epoch(path, cache)
    _, from_cache, later = epoch(path, cache)
    assert from_cache
    assert later <= first < 1.15 * later, (first, later)
    assert first < 1.2 * size


PLAIN = COMBOS_BY_ID["plain"]


@pytest.mark.parametrize("small_tree", [False, True])
def test_a_leaf_list_is_checked_the_same_with_a_bitmap_or_sorted(
        tmp_path, small_tree):
    """A first start checks the leaf list before reading a leaf: a bitmap of
    the file's pages where that is small, a sorted copy of the list where
    the tree is a small part of a large file; both find a leaf reached
    twice and name it, and a clean tree opens."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    if small_tree:   # 120 records in a file of some 4,000 pages
        write_env(path, {
            b"big": (PLAIN, [("put", b"b%06d" % i, value_of(i, 500))
                             for i in range(30000)]),
            b"small": (PLAIN, [("put", b"s%06d" % i, value_of(i, 500))
                               for i in range(120)]),
        })
        name, db = "small", b"small"
    else:
        write_sized(path, [500] * 6000)
        name, db = "main", None
    f = LmdbFile(path)
    leaves = f.leaves(name)
    assert (f.file_pages() // 64 > len(leaves)) == small_tree
    with lmdbio.Reader(path, db=db, batch_size=64,
                       index_cache=str(tmp_path / "ok")) as r:
        assert sum(len(b) for b in r) == (120 if small_tree else 6000)
    parents = [p for p in f.branches(name) if len(p.nodes) > 3]
    twice = parents[-1].nodes[1].child
    set_branch_child(data_file(path), parents[-1].nodes[2], twice)
    with pytest.raises(lmdbio.CorruptedError,
                       match="page %d is reached twice" % twice):
        with lmdbio.Reader(path, db=db, batch_size=64,
                           index_cache=str(tmp_path / "c")) as r:
            for _ in r:
                pass


def test_reads_are_the_same_every_time(tmp_path):
    """The windows count their leaves in window order (two lanes): a first
    start with windows of one batch each (prefetch_bytes=1; larger windows
    grow with the order in which the lanes finish) reads the same requests
    every time."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    write_sized(path, [300, 2100, 9000, 10] * 3000)
    for bs in (16, 64):
        seen = set()
        for _ in range(4):
            with lmdbio.Reader(path, batch_size=bs, prefetch_bytes=1,
                               index_cache=False) as r:
                n = sum(len(b) for b in r)
                seen.add(r.io_stats())
        assert n == 12000 and len(seen) == 1, seen


def test_epoch_left_early_saves_nothing(tmp_path):
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = write_sized(path, [500] * 5000)
    cache = str(tmp_path / "c")
    with lmdbio.Reader(path, batch_size=100, index_cache=cache) as r:
        for i, b in enumerate(r):
            if i == 3:
                break
        assert r._file.index_pending
    assert not glob.glob(os.path.join(cache, "*.npy"))
    assert not prefetch_threads(settle=5)
    # the next start is a first start again, and complete
    got, from_cache, _ = epoch(path, cache, batch_size=100)
    assert not from_cache
    assert [v for _, _, vs in got for v in vs] == [v for _, v in items]
    assert glob.glob(os.path.join(cache, "*.npy"))


def test_read_counts_the_rest_first(tmp_path):
    """read() after part of an epoch (or before any) needs the whole index:
    it counts the rest, and reads the right records."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = write_sized(path, [500] * 5000)
    with lmdbio.Reader(path, batch_size=100, index_cache=False) as r:
        it = iter(r)
        assert next(it).values.tolist() == [v for _, v in items[:100]]
        picks = [4999, 0, 2500, 101]
        assert r.read(picks).values.tolist() == [items[i][1] for i in picks]
        assert not r._file.index_pending
        assert r._file.index_recmap() is not None   # as a cached start has
        rest = [v for b in it for v in b.values.tolist()]
        assert rest == [v for _, v in items[100:]]


def test_empty_tree(tmp_path):
    path = str(tmp_path / "db")
    os.makedirs(path)
    write_items(path, [])
    with lmdbio.Reader(path, index_cache=str(tmp_path / "c")) as r:
        assert list(r) == [] and len(r) == 0


@pytest.mark.parametrize("delta", [1, -1])
def test_record_count_that_disagrees(tmp_path, delta):
    """A database record whose count disagrees with the leaves is found
    where the counting reaches the last leaf, after every batch before it;
    the index stays uncounted (nothing saved), so read() fails the same
    way instead of reading a wrong index."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = write_sized(path, [500] * 3000)
    f = LmdbFile(path)
    patch_dbrec(data_file(path), f.meta.main_db, MD_ENTRIES, "<Q",
                3000 + delta)
    cache = str(tmp_path / "c")
    got = []
    with pytest.raises(lmdbio.CorruptedError, match="database record"):
        with lmdbio.Reader(path, batch_size=100, index_cache=cache) as r:
            for b in r:
                got += b.values.tolist()
    assert 2800 <= len(got) < 3000
    assert got == [v for _, v in items[:len(got)]]
    with lmdbio.Reader(path, batch_size=100, index_cache=cache) as r:
        for _ in range(2):
            with pytest.raises(lmdbio.CorruptedError,
                               match="database record"):
                r.read([0])
    assert not glob.glob(os.path.join(cache, "*.npy"))


@given(first=st.integers(0, 10 ** 6), span=st.integers(-5, 10 ** 5),
       counted=st.integers(0, 10 ** 4), covered=st.integers(0, 10 ** 6),
       leaves=st.integers(0, 2 * 10 ** 4), records=st.integers(0, 2 * 10 ** 6))
def test_leaves_ahead_is_a_run_of_uncounted_leaves(first, span, counted,
                                                   covered, leaves, records):
    lo, hi = reader_mod.leaves_ahead(first, first + span, counted, covered,
                                     leaves, records)
    assert lo <= hi
    if lo < hi:
        assert counted <= lo and hi <= leaves


def _leaves_ahead_spec(first_ord, last_ord, counted, covered, leaves, records,
                       err=-1.0):
    """The rule as the scale model's notes state it, in Python floats: the
    reference for lio_leaves_ahead."""
    if counted >= leaves or covered >= records or last_ord < first_ord:
        return counted, counted
    per = (leaves - counted) / (records - covered)
    lo = counted + (first_ord - covered) * per
    hi = counted + (last_ord + 1 - covered) * per
    margin = (hi - lo) / 32 + 2
    if err >= 0:
        margin = min(margin, 2 * err + 2)
    lo = max(counted, int(lo - margin))
    return lo, max(lo, min(leaves, int(hi + margin) + 1))


@given(first=st.integers(0, 10 ** 7), span=st.integers(-5, 10 ** 6),
       counted=st.integers(0, 10 ** 5), covered=st.integers(0, 10 ** 7),
       leaves=st.integers(0, 2 * 10 ** 5), records=st.integers(0, 2 * 10 ** 7),
       err=st.one_of(st.just(-1.0), st.floats(0, 10 ** 4)))
def test_leaves_ahead_in_c_follows_the_rule(first, span, counted, covered,
                                            leaves, records, err):
    """The lanes' rule (C, in doubles) gives what the rule gives in Python
    floats wherever the window lies before the tree's end: a margin of
    1/32 and two leaves, narrowed to twice the error measured before and
    two leaves where that is less."""
    want = _leaves_ahead_spec(first, first + span, counted, covered, leaves,
                              records, err)
    if want[0] > leaves:
        return   # (past every leaf: C stops at the last, reading nothing)
    assert reader_mod.leaves_ahead(first, first + span, counted, covered,
                                   leaves, records, err) == want


@given(first=st.integers(0, 10 ** 6), span=st.integers(0, 10 ** 5),
       counted=st.integers(0, 10 ** 4), covered=st.integers(0, 10 ** 6),
       leaves=st.integers(1, 2 * 10 ** 4), records=st.integers(1, 2 * 10 ** 6),
       shift=st.integers(-50, 50))
def test_leaves_ahead_error_is_the_distance_to_the_true_leaves(
        first, span, counted, covered, leaves, records, shift):
    """The error the lanes keep: how far the expectation (before its
    margin) lay from the leaves that hold the window, at either end; where
    the margin narrows to it (2 err + 2), it covers those leaves again."""
    last = first + span
    got = reader_mod.leaves_ahead_error(first, last, counted, covered, leaves,
                                        records, 0, 0)
    if counted >= leaves or covered >= records:
        assert got == -1
        return
    per = (leaves - counted) / (records - covered)
    a = counted + (first - covered) * per
    b = counted + (last + 1 - covered) * per
    true_lo = max(0, int(a) + shift)
    true_hi = max(true_lo, int(b) + shift)
    err = reader_mod.leaves_ahead_error(first, last, counted, covered, leaves,
                                        records, true_lo, true_hi)
    assert err == pytest.approx(max(abs(a - true_lo), abs(b - true_hi)))
    lo, hi = reader_mod.leaves_ahead(first, last, counted, covered, leaves,
                                     records, err)
    if counted <= true_lo and true_hi <= leaves and \
            2 * err + 2 <= (b - a) / 32 + 2:   # (the narrowed margin)
        assert lo <= true_lo and true_hi <= hi


@pytest.mark.parametrize("scattered", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_leaf_reached_twice_is_corruption(tmp_path, scattered, shuffle):
    """Two branch nodes pointing at one leaf (its neighbour orphaned): the
    index, built at open or counted by the windows, sorts each level's
    pages by page number and refuses a page met twice, leaves in key order
    on disk or scattered (the sort then reorders them)."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    n = 6000
    order = np.random.default_rng(1).permutation(n) if scattered else None
    write_sized(path, [500] * n, order)
    f = LmdbFile(path)
    parents = [p for p in f.branches("main")
               if p.level + 2 == f.meta.main_db.depth and len(p.nodes) > 3]
    assert len(parents) >= 2
    # far apart in key order: only sorted by page number do the two
    # meet
    twice = parents[0].nodes[1].child
    set_branch_child(data_file(path), parents[-1].nodes[2], twice)
    with pytest.raises(lmdbio.CorruptedError,
                       match="page %d is reached twice" % twice):
        with lmdbio.Reader(path, batch_size=64, shuffle=shuffle,
                           index_cache=str(tmp_path / "c")) as r:
            for _ in r:
                pass
    assert not prefetch_threads(settle=5)
