"""The page cache's policy for the leaves of lookups (``txn.get``).

Once the cache is full, a leaf that a lookup read is recycled first, unless
the same leaf was missed recently too (then it is kept like any page).
Where the tree has a record table (csrc/leafdir.c), lookups read their
record alone and come to the page cache once the record is part of a
working set (looked up three times lately).  So
random lookups over a file larger than the cache do not evict the pages a
program keeps coming back to, and a working set that is looked up again
and again ends up cached.  Counted with the process's read system calls
(``/proc/self/io``), with read-ahead off so that each miss is one read,
and lock=True (no periodic re-read of the meta pages).
"""

from __future__ import annotations

import os
import random

import pytest

from lmdb_fixtures import read_syscalls, write_items

from conftest import import_subject, require

lmdb = require("lmdb", "pip install lmdb")
lmdbio = import_subject("lmdbio")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/io"),
                                reason="counts reads with /proc/self/io (Linux)")

N_KEYS = 6000          # 1000 leaves of 4 KiB: far more than the cache
CACHE = 64 * 4096      # the smallest cache: 64 pages


def _own_reads():
    """Reading /proc/self/io is itself counted."""
    before = read_syscalls()
    return read_syscalls() - before


_OWN_READS = _own_reads()


def key(i):
    return b"k%08d" % i


@pytest.fixture(scope="module")
def env_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cache"))
    write_items(path, [(key(i), bytes([i % 251]) * 500) for i in range(N_KEYS)])
    return path


def gets(txn, keys):
    before = read_syscalls()
    for k in keys:
        assert txn.get(k) == bytes([int(k[1:]) % 251]) * 500
    return read_syscalls() - before - _OWN_READS


def test_random_lookups_do_not_evict_a_working_set(env_path):
    hot = [key(i) for i in range(0, N_KEYS, N_KEYS // 8)]   # 8 leaves
    sweep = [key(i) for i in range(N_KEYS)]
    random.Random(0).shuffle(sweep)
    env = lmdbio.open(env_path, readonly=True, lock=True, readahead=False,
                      cache_bytes=CACHE)
    try:
        with env.begin() as txn:
            gets(txn, sweep)                 # fills the cache
            # A tree this much larger than the cache has a record table:
            # lookups read their record alone until it has been looked up
            # three times lately, then their leaf's page is missed twice
            # and kept.  So a few rounds read, then none.
            gets(txn, sweep)
            assert txn._gets_by_record() > len(sweep) // 2
            reads = [gets(txn, hot) for _ in range(6)]
            assert reads[0] > 0 and reads[-2:] == [0, 0], reads
            # 100 random lookups between two uses of the working set:
            # about 100 leaves read, more than the cache holds, so plain
            # LRU would read the 8 hot leaves again every time (~8 x 30).
            swept = hot_reads = 0
            for i in range(0, 3000, 100):
                swept += gets(txn, sweep[i:i + 100])
                hot_reads += gets(txn, hot)
            assert swept >= 3000 // 2
            assert hot_reads <= 8
    finally:
        env.close()


def test_a_file_that_fits_is_cached_after_one_pass(env_path):
    keys = [key(i) for i in range(N_KEYS)]
    random.Random(1).shuffle(keys)
    env = lmdbio.open(env_path, readonly=True, lock=True, readahead=False,
                      cache_bytes=64 << 20)
    try:
        with env.begin() as txn:
            assert gets(txn, keys) > 0
            assert gets(txn, keys) == 0
    finally:
        env.close()
