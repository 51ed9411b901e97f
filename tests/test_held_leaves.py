"""Leaves held in memory for reads in random order.

A shuffled epoch (or read()) over a tree without a record map (values in
overflow runs, CIFAR-like Datums: a hundred records a leaf, the leaves a
small part of the file; or many small records a leaf, the leaves the file)
needs most leaves in every window.  The Reader then reads every leaf
once, checks it, and holds it, and windows read only the values.  That path
must return exactly what the leaf-reading path returns and what py-lmdb
says; it must really stop reading leaves; a damaged leaf must fail the
batch that needs it, after every batch before it, as without it; and it is
only taken where it pays (no record map, leaves at most _LEAVES_HELD
bytes).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_lmdbio, spec_shard
from lmdb_fixtures import LmdbFile, patch, write_sized

try:
    import lmdbio
    from lmdbio import reader as reader_mod
    from lmdbio._bulk import BulkFile
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

PAGE = 4096


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def epoch(path, held, **kw):
    """Every batch of a shuffled epoch, and read() of a few ordinals, with
    leaves held (when the Reader holds them) or never held."""
    old = reader_mod._LEAVES_HELD
    if not held:
        reader_mod._LEAVES_HELD = 0
    try:
        with lmdbio.Reader(path, shuffle=True, index_cache=False, **kw) as r:
            got = [(b.indices.tolist(),
                    None if b.keys is None else b.keys.tolist(),
                    b.values.tolist()) for b in r]
            n = r.total_records
            picks = [i % n for i in (7, 0, n - 1, 3 * n // 4, 5)] if n else []
            one = r.read(picks)
            got.append((one.indices.tolist(), None, one.values.tolist()))
            return got, r.window_stats["leaves_held"]
    finally:
        reader_mod._LEAVES_HELD = old


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.sampled_from([2100, 3000, PAGE - 16, 3 * PAGE + 5,
                                       9000, 0, 10, 300]),
                      min_size=1, max_size=700),
       scattered=st.booleans(), bs=st.sampled_from([1, 7, 64, 1000]),
       keys=st.booleans(), seed=st.integers(0, 3))
def test_held_leaves_read_what_the_leaf_path_reads(sizes, scattered, bs,
                                                   keys, seed):
    with tempfile.TemporaryDirectory() as tmp:
        order = np.random.default_rng(seed).permutation(len(sizes)) \
            if scattered else None
        items = write_sized(tmp, sizes, order)
        kw = dict(batch_size=bs, keys=keys, seed=seed)
        held, was_held = epoch(tmp, True, **kw)
        plain, not_held = epoch(tmp, False, **kw)
        assert not not_held
        assert held == plain
        want = spec_shard(len(items), 1, 0, True, seed, 0, False, bs)
        assert [i for ids, _k, _v in held[:-1] for i in ids] == want
        for ids, ks, vs in held:
            assert vs == [items[i][1] for i in ids]
            if ks is not None:
                assert ks == [items[i][0] for i in ids]
        if len(items) >= 100 and sum(s > 2000 for s in sizes) > 0.9 * len(
                sizes):
            assert was_held      # a CIFAR-like tree


def _bulk(path):
    f = BulkFile(os.path.join(path, "data.mdb"))
    assert f.snapshot(0)
    f.select(None)
    f.build_index()
    return f


def test_held_leaves_are_not_read_again(tmp_path):
    """With the leaves held a window reads no leaf (its leaf bytes: 0);
    without, a shuffled window reads most of them."""
    path = str(tmp_path)
    items = write_sized(path, [3000] * 3000)
    f = _bulk(path)
    try:
        ords = np.random.default_rng(1).permutation(len(items))[:640]
        ends = np.arange(64, 641, 64)
        parts, leaf_bytes = f.read_window(ords, ends, True)
        assert leaf_bytes >= 0.8 * f.num_leaves * PAGE
        assert f.keep_leaves(1 << 30)
        held, leaf_bytes = f.read_window(ords, ends, True)
        assert leaf_bytes == 0
        flat = [v for p in held for v in _values(p)]
        assert flat == [v for p in parts for v in _values(p)]
        assert flat == [items[i][1] for i in ords]
    finally:
        f.close()


def _values(part):
    _kd, _ko, vdata, voff = part
    return [bytes(vdata[voff[j]:voff[j + 1]]) for j in range(len(voff) - 1)]


def test_leaves_are_held_only_where_they_pay(tmp_path):
    """Not for a tree with a record map (it reads records without their
    leaves already), not when the leaves are more than the budget, and not
    for an in-order epoch.  A tree of many small records a leaf, whose
    leaves are the file, holds them: its windows read the same leaves over
    and over otherwise."""
    cifar, mnist, small = (str(tmp_path / d) for d in ("c", "m", "s"))
    write_sized(cifar, [3000] * 2000)
    write_sized(mnist, [800] * 2000)      # <= 8 a leaf: a record map
    write_sized(small, [100] * 2000)      # the leaves are the file
    for path, want in ((cifar, True), (mnist, False), (small, True)):
        assert epoch(path, True, batch_size=64)[1] == want, path
    old = reader_mod._LEAVES_HELD
    reader_mod._LEAVES_HELD = (2000 * 100) // 2   # under the leaves' bytes
    try:
        assert not epoch(small, True, batch_size=64)[1]
    finally:
        reader_mod._LEAVES_HELD = old
    assert not epoch(cifar, False, batch_size=64)[1]
    f = _bulk(cifar)
    try:
        assert not f.keep_leaves(f.num_leaves * PAGE - 1)
        assert f.keep_leaves(f.num_leaves * PAGE)
    finally:
        f.close()
    with lmdbio.Reader(cifar, index_cache=False) as r:
        assert sum(len(b) for b in r) == 2000
        assert not r.window_stats["leaves_held"]


def test_a_damaged_leaf_fails_the_batch_that_needs_it(tmp_path):
    """The held leaves leave a damaged one out: every batch before the
    first that needs one of its records arrives intact, then that batch
    raises naming the page, as when windows read the leaves."""
    path = str(tmp_path)
    items = write_sized(path, [3000] * 2000)
    lf = LmdbFile(path)
    ordinal = {k: i for i, (k, _) in enumerate(items)}
    leaf = lf.leaves()[len(lf.leaves()) // 2]
    bad = {ordinal[nd.key] for nd in leaf.nodes}
    # the first node pointer aims into the page header: the leaf header
    # (all the index reads) is intact, the node array is not
    patch(lf.path, leaf.pgno * lf.psize + 16, "<H", 2)
    bs, seed = 4, 3
    order = spec_shard(len(items), 1, 0, True, seed, 0, False, bs)
    first_bad = min(order.index(i) for i in bad)
    for held in (True, False):
        old = reader_mod._LEAVES_HELD
        reader_mod._LEAVES_HELD = (1 << 30) if held else 0
        try:
            with lmdbio.Reader(path, batch_size=bs, shuffle=True, seed=seed,
                               index_cache=False) as r:
                got = []
                with pytest.raises(lmdbio.CorruptedError,
                                   match=str(leaf.pgno)):
                    for b in r:
                        assert b.values.tolist() == [items[i][1]
                                                     for i in b.indices]
                        got.extend(b.indices.tolist())
                assert r.window_stats["leaves_held"] == held
                assert got == order[:first_bad // bs * bs]
                ok = [i for i in range(len(items)) if i not in bad][:50]
                assert r.read(ok).values.tolist() == [items[i][1] for i in ok]
                with pytest.raises(lmdbio.CorruptedError,
                                   match=str(leaf.pgno)):
                    r.read([min(bad)])
        finally:
            reader_mod._LEAVES_HELD = old
