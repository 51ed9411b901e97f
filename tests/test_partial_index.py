"""A shard's first start counts the leaves from the nearer end of the tree.

Without a cached index, rank r of W in an unshuffled epoch indexes only
the leaves from the first one to the end of its share, or from the start
of its share to the last one, whichever is shorter: it reads that share
of the leaf headers, not all of them.  Checked here: the records are
py-lmdb's, the index covers the share and no more than it needs, the
partial index has its own cache entry, a whole cached index is preferred,
and ``read()`` of records outside the partial index widens it to the
whole tree.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import import_subject, require

lmdb = require("lmdb", "pip install lmdb")
lmdbio = import_subject("lmdbio")

N = 20000   # 2 records a leaf: 10,000 leaves, more than one counting round


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("partial"))
    env = lmdb.open(path, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(b"k%07d" % i, bytes([i % 251]) * 1500)
    env.close()
    return path


def records(path):
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        out = [v for _, v in txn.cursor()]
    env.close()
    return out


def values(batch):
    return [bytes(batch.values[i]) for i in range(len(batch))]


def share(rank, world):
    per = -(-N // world)
    return rank * per, min(N, (rank + 1) * per)


@pytest.mark.parametrize("rank", [0, 1, 3, 4, 7])
def test_share_from_the_nearer_end(db, rank):
    want = records(db)
    lo, hi = share(rank, 8)
    with lmdbio.Reader(db, batch_size=512, rank=rank, world_size=8,
                       index_cache=False) as r:
        first, end = r._file.index_range
        assert first <= lo and hi <= end
        assert first == 0 or end == N          # a run from one end
        # no more than the nearer end needs, plus at most one leaf
        assert end - first <= min(hi, N - lo) + 2
        got = [v for b in r for v in values(b)]
    assert got == want[lo:hi]


def test_the_far_end_needs_fewer_headers_read(db):
    whole = lmdbio._bulk.BulkFile(os.path.join(db, "data.mdb"))
    whole.snapshot(0)
    whole.select(None)
    leaves = whole.build_index()
    assert leaves >= 10000
    assert whole.build_index_part(True, N // 8) < leaves // 2
    assert whole.index_range == (N - N // 8, N)
    assert whole.build_index_part(False, N // 8) < leaves // 2
    assert whole.index_range[0] == 0 and whole.index_range[1] >= N // 8
    # past it: refused, never another record
    with pytest.raises(lmdbio.Error, match="outside the records indexed"):
        whole.read([N - 1], False)
    whole.close()


def test_read_outside_the_share_widens_the_index(db):
    want = records(db)
    with lmdbio.Reader(db, batch_size=512, rank=7, world_size=8,
                       index_cache=False) as r:
        assert r._file.index_range[0] > 0
        idx = [0, N - 1, 5, N // 2]
        assert values(r.read(idx)) == [want[i] for i in idx]
        assert r._file.index_range == (0, N)
        # the epoch is unchanged
        lo, hi = share(7, 8)
        assert [v for b in r for v in values(b)] == want[lo:hi]


def test_partial_and_whole_cache_entries(db, tmp_path):
    cache = str(tmp_path / "cache")
    with lmdbio.Reader(db, rank=7, world_size=8, index_cache=cache) as r:
        assert not r.index_from_cache
        assert r._file.index_range[0] > 0
    with lmdbio.Reader(db, rank=7, world_size=8, index_cache=cache) as r:
        assert r.index_from_cache              # its own partial entry
        assert r._file.index_range[0] > 0
    with lmdbio.Reader(db, rank=0, world_size=8, index_cache=cache) as r:
        assert not r.index_from_cache          # another share, built anew
    with lmdbio.Reader(db, index_cache=cache) as r:
        assert not r.index_from_cache          # the whole index, counted by
        assert sum(len(b) for b in r) == N     # an epoch and saved
    with lmdbio.Reader(db, rank=3, world_size=8, index_cache=cache) as r:
        assert r.index_from_cache
        assert r._file.index_range == (0, N)   # the whole one is preferred


def test_shuffled_and_single_rank_index_everything(db):
    """A shuffled rank builds the whole index at open; one rank in key
    order counts it as its first epoch reads the leaves."""
    with lmdbio.Reader(db, index_cache=False, rank=7, world_size=8,
                       shuffle=True) as r:
        assert r._file.index_range == (0, N)
    with lmdbio.Reader(db, index_cache=False) as r:
        assert r._file.index_range == (0, 0) and r._file.index_pending
        assert sum(len(b) for b in r) == N
        assert r._file.index_range == (0, N) and not r._file.index_pending


def test_a_damaged_leaf_in_the_run_is_caught(db, tmp_path):
    """The headers counted from the end are checked as a whole build
    checks them."""
    import shutil
    import struct
    path = str(tmp_path / "damaged")
    shutil.copytree(db, path)
    data = os.path.join(path, "data.mdb")
    f = lmdbio._bulk.BulkFile(data)
    f.snapshot(0)
    f.select(None)
    f.build_index()
    last_leaf = int(f.index_arrays()[0][-1])
    f.close()
    with open(data, "r+b") as fh:
        # mp_lower (offset 12 of the page header) past mp_upper
        fh.seek(last_leaf * 4096 + 12)
        fh.write(struct.pack("<HH", 4000, 100))
    with pytest.raises(lmdbio.CorruptedError, match="page %d" % last_leaf):
        lmdbio.Reader(path, rank=7, world_size=8, index_cache=False)
