"""The record map: a shuffled window reads just the records' bytes.

For trees whose leaves hold few records (at most LIO_RECMAP_PER_LEAF on
average), the record index also keeps where each record's key and value
sit in its leaf, and a window reads them straight into the batch instead of
reading the leaf.  That path must return exactly what the leaf path returns
(the same index without its map) and what py-lmdb says, for any database,
order, shard, batch size and key choice; it must really skip the leaves;
and a map loaded from the index cache is input: a damaged one fails with a
clear error naming the record and page.
"""

from __future__ import annotations

import glob
import os
import tempfile

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from conftest import require_lmdbio, spec_shard
from lmdb_fixtures import (
    COMBOS_BY_ID, LmdbFile, read_all_pylmdb, read_syscalls, value_of,
    write_env, write_items,
)

try:
    import lmdbio
    from lmdbio import reader as reader_mod
    from lmdbio._bulk import BulkFile, checksum
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

PLAIN = COMBOS_BY_ID["plain"]
DUPSORT = COMBOS_BY_ID["dupsort"]
PAGE = 4096
PER_LEAF = 8   # LIO_RECMAP_PER_LEAF


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def whole_index(path, **kw):
    """(leaves, first, map) of the whole index, saved to the cache the way
    a first start in key order saves it: after an epoch has counted every
    leaf."""
    with lmdbio.Reader(path, **kw) as r:
        assert sum(len(b) for b in r) == r.total_records
        return (*r._file.index_arrays(), r._file.index_recmap())


def open_file(path, db=None, recmap=True):
    """A BulkFile with the built index (and its record map, if the tree
    gets one), or with the same index adopted without a map (leaf path)."""
    f = BulkFile(os.path.join(path, "data.mdb"))
    assert f.snapshot(0)
    f.select(db)
    f.build_index()
    if not recmap:
        f.adopt_index(*f.index_arrays())
        assert f.index_recmap() is None
    return f


@st.composite
def databases(draw):
    """(ops, db name, spec): plain databases with values of every kind
    (empty, small, near a page, overflow) and keys from 1 to 400 bytes,
    inserted in random order; or DUPSORT ones (which get no map)."""
    if draw(st.integers(0, 4)) == 0:
        ops = []
        for i in range(draw(st.integers(1, 6))):
            for j in range(draw(st.sampled_from([1, 3, 40]))):
                ops.append(("put", b"d%03d" % i, b"%05d" % j * 3))
        return ops, b"dups", DUPSORT
    n = draw(st.integers(0, 300))
    order = draw(st.permutations(range(n)))
    # mostly records big enough for a map (a few per leaf), with empty,
    # small and overflow values among them
    sizes = draw(st.lists(st.sampled_from([700, 1500, 3000]), min_size=1,
                          max_size=3))
    sizes += draw(st.lists(st.sampled_from([0, 1, 200, 2 * PAGE + 9]),
                           max_size=2))
    ksizes = draw(st.lists(st.sampled_from([1, 6, 60, 400]), min_size=1,
                           max_size=2))
    ops = []
    for i in order:
        klen = ksizes[i % len(ksizes)]
        key = (b"%06d" % i * (klen // 6 + 1))[:klen] if klen >= 6 \
            else bytes([i % 256])[:klen] + b"%d" % i
        ops.append(("put", key, value_of(i, sizes[i % len(sizes)])))
    return ops, None, PLAIN


def windows_equal(f, g, ords, ends, keys):
    a, _ = f.read_window(ords, ends, keys)
    b, _ = g.read_window(ords, ends, keys)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            if u is None or v is None:
                assert u is None and v is None
            else:
                assert np.array_equal(u, v)
    return a


@settings(max_examples=200, deadline=None)
@given(db=databases(), data=st.data())
def test_map_path_equals_leaf_path_and_pylmdb(db, data):
    ops, name, spec = db
    with tempfile.TemporaryDirectory() as tmp:
        write_env(tmp, {name: (spec, ops)}, txn_size=60)
        items = read_all_pylmdb(tmp, names=(name,))[name]
        n = len(items)
        f, g = open_file(tmp, name), open_file(tmp, name, recmap=False)
        try:
            m = f.index_recmap()
            event("record map" if m is not None else "no record map")
            if m is not None and m.all():
                event("every record mapped")
            if spec is DUPSORT or n == 0 or n > PER_LEAF * f.num_leaves:
                assert m is None                # the rule: no map
            else:
                assert m is not None and len(m) == n
                big = [i for i, (_, v) in enumerate(items)
                       if len(v) > PAGE // 2]
                assert all(m[i] == 0 for i in big)   # overflow: leaf path
            if n == 0:
                return
            ords = np.array(data.draw(st.lists(st.integers(0, n - 1),
                                               min_size=1, max_size=400)),
                            dtype=np.int64)
            cuts = sorted(data.draw(st.lists(st.integers(0, len(ords)),
                                             max_size=5)))
            ends = np.array(cuts + [len(ords)], dtype=np.intp)
            keys = data.draw(st.booleans())
            parts = windows_equal(f, g, ords, ends, keys)
            start = 0
            for (kd, ko, vd, vo), end in zip(parts, ends):
                for j, o in enumerate(ords[start:end]):
                    assert bytes(vd[vo[j]:vo[j + 1]]) == items[o][1]
                    if keys:
                        assert bytes(kd[ko[j]:ko[j + 1]]) == items[o][0]
                start = end
        finally:
            f.close()
            g.close()


@settings(max_examples=30, deadline=None)
@given(db=databases(), bs=st.sampled_from([1, 5, 64, 1000]),
       shuffle=st.booleans(), p=st.sampled_from([1, 3]),
       drop_last=st.booleans(), keys=st.booleans(), seed=st.integers(0, 3))
def test_reader_with_map_equals_pylmdb(db, bs, shuffle, p, drop_last, keys,
                                       seed):
    """Whole epochs (shards, shuffles, drop_last) and read(indices) through
    the Reader, the map path in use where the tree has one."""
    ops, name, spec = db
    with tempfile.TemporaryDirectory() as tmp:
        write_env(tmp, {name: (spec, ops)}, txn_size=60)
        items = read_all_pylmdb(tmp, names=(name,))[name]
        n = len(items)
        for r in range(p):
            want = spec_shard(n, p, r, shuffle, seed, 0, drop_last, bs)
            with lmdbio.Reader(tmp, db=name, batch_size=bs, shuffle=shuffle,
                               seed=seed, rank=r, world_size=p,
                               drop_last=drop_last, keys=keys,
                               index_cache=False) as reader:
                got = []
                for b in reader:
                    got.extend(b.indices.tolist())
                    assert b.values.tolist() == [items[i][1]
                                                 for i in b.indices]
                    if keys:
                        assert b.keys.tolist() == [items[i][0]
                                                   for i in b.indices]
                    else:
                        assert b.keys is None
                assert got == want
                if n:
                    idx = np.random.default_rng(seed).integers(0, n, 50)
                    one = reader.read(idx)
                    assert one.values.tolist() == [items[i][1] for i in idx]


def scattered(path, n=600, size=700):
    rng = np.random.default_rng(3)
    items = [(b"r%06d" % i, value_of(i, size)) for i in range(n)]
    write_items(path, [items[i] for i in rng.permutation(n)])
    return items


def read_bytes():
    """Bytes this process read through read system calls (rchar)."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_map_skips_the_leaves(tmp_path):
    """read(indices) of scattered records: one read per record of exactly
    its key and value (counted by the reader threads and by the kernel),
    where the leaf path reads a page per record."""
    path = str(tmp_path)
    items = scattered(path)
    idx = np.arange(0, 600, 37)
    need = sum(len(items[i][0]) + len(items[i][1]) for i in idx)
    with lmdbio.Reader(path, index_cache=False, storage=(0, 1e9)) as r:
        r.read(idx[:1])           # the index counted, first-use costs paid
        assert r._file.index_recmap() is not None
        s0, c0, (q0, b0) = read_syscalls(), read_bytes(), r.io_stats()
        got = r.read(idx)
        s1, c1, (q1, b1) = read_syscalls(), read_bytes(), r.io_stats()
        assert got.values.tolist() == [items[i][1] for i in idx]
        assert got.keys.tolist() == [items[i][0] for i in idx]
        assert b1 - b0 == need
        assert q1 - q0 == len(idx)
        # the same without the map: a whole leaf per record
        r._file.adopt_index(*r._file.index_arrays())
        r.read(idx[:1])
        s2, c2, (q2, b2) = read_syscalls(), read_bytes(), r.io_stats()
        assert r.read(idx).values.tolist() == got.values.tolist()
        s3, c3, (q3, b3) = read_syscalls(), read_bytes(), r.io_stats()
        assert b3 - b2 == PAGE * len(idx)
    # the kernel saw as many requests (and the same snapshot checks),
    # carrying a leaf each on one path and just the record on the other
    # (give or take a read of /proc/self/io)
    assert abs((s1 - s0) - (s3 - s2)) <= 2
    assert abs((c3 - c2) - (c1 - c0) - (PAGE * len(idx) - need)) < PAGE


def test_map_without_keys_reads_only_values(tmp_path):
    path = str(tmp_path)
    items = scattered(path)
    idx = np.arange(5, 600, 41)
    with lmdbio.Reader(path, index_cache=False, keys=False,
                       storage=(0, 1e9)) as r:
        r.read([0])   # the first read() counts the whole index
        q0, b0 = r.io_stats()
        got = r.read(idx)
        q1, b1 = r.io_stats()
    assert got.values.tolist() == [items[i][1] for i in idx]
    assert b1 - b0 == sum(len(items[i][1]) for i in idx)


def test_dense_and_dupsort_trees_get_no_map(tmp_path):
    dense = str(tmp_path / "dense")
    os.makedirs(dense)
    write_items(dense, [(b"k%05d" % i, b"v%d" % i) for i in range(2000)])
    dups = str(tmp_path / "dups")
    os.makedirs(dups)
    write_env(dups, {b"d": (DUPSORT, [("put", b"k%d" % (i % 7), b"%04d" % i * 100)
                                      for i in range(300)])})
    for path, db in ((dense, None), (dups, b"d")):
        f = open_file(path, db)
        try:
            assert f.index_recmap() is None
        finally:
            f.close()


def cache_files(tmp_path):
    return glob.glob(str(tmp_path / "xdg-cache" / "**" / "*.npy"),
                     recursive=True)


def expected_bytes(first, items, ords):
    """What a window of these ordinals reads with the map: the key and
    value of each record whose leaf it needs sparsely (at most half the
    leaf's records), a whole page for each leaf it needs densely."""
    leaf = np.searchsorted(first, ords, side="right") - 1
    need = {}
    for o, lf in zip(ords, leaf):
        need.setdefault(int(lf), []).append(int(o))
    total = 0
    for lf, recs in need.items():
        if 2 * len(recs) > first[lf + 1] - first[lf]:
            total += PAGE
        else:
            total += sum(len(items[o][0]) + len(items[o][1])
                         for o in set(recs))
    return total


def test_shuffled_window_reads_records_of_sparse_leaves(tmp_path):
    """A shuffled window over a tenth of the records: leaves it needs one
    or two records of are skipped (just those records read), leaves it
    needs more than half of are read whole."""
    path = str(tmp_path)
    items = scattered(path, n=3000)
    with lmdbio.Reader(path, index_cache=False, storage=(0, 1e9)) as r:
        r.read([0])   # the first read() counts the whole index
        first = r._file.index_arrays()[1]
        ords = np.random.default_rng(2).permutation(3000)[:300]
        q0, b0 = r.io_stats()
        got = r.read(ords)
        q1, b1 = r.io_stats()
    assert got.values.tolist() == [items[i][1] for i in ords]
    assert b1 - b0 == expected_bytes(first, items, ords)
    assert b1 - b0 < 300 * PAGE // 3
    # the whole epoch in one window needs every leaf whole
    assert expected_bytes(first, items, np.arange(3000)) == \
        PAGE * (len(first) - 1)


def test_map_is_cached_for_later_starts(tmp_path):
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = scattered(path)
    with lmdbio.Reader(path, shuffle=True, batch_size=64) as r:
        assert not r.index_from_cache
        m = r._file.index_recmap()
        assert m is not None
    idx = np.arange(3, 600, 29)
    with lmdbio.Reader(path, shuffle=True, batch_size=64,
                       storage=(0, 1e9)) as r:
        assert r.index_from_cache
        assert np.array_equal(r._file.index_recmap(), m)
        q0, b0 = r.io_stats()
        assert r.read(idx).values.tolist() == [items[i][1] for i in idx]
        q1, b1 = r.io_stats()
        got = {}
        for b in r:
            got.update(zip(b.indices.tolist(), b.values.tolist()))
    assert b1 - b0 == sum(len(items[i][0]) + len(items[i][1]) for i in idx)
    assert got == {i: v for i, (_, v) in enumerate(items)}


def test_views_equal_the_copies_and_outlive_their_index(tmp_path):
    """index_views (what a first start saves) hold exactly what the copies
    hold, are read-only, and stay readable when the index they show is
    dropped meanwhile (a new index, the file closed): it is freed with the
    last view, not before.  A record map given by set_recmap (a built
    index's) comes as a copy: the next set_recmap frees it."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    scattered(path)
    f = open_file(path)
    want = (*f.index_arrays(), f.index_recmap())
    built = f.index_views()
    assert want[2] is not None
    assert built[2].flags.writeable and np.array_equal(built[2], want[2])
    f.set_recmap(want[2])          # frees the map the copy was taken of
    assert np.array_equal(built[2], want[2])
    f.begin_index()                # drops the index the views show
    again = f.index_views()        # (the begun one: none counted yet)
    assert len(again[0]) == 0 and again[2] is None
    f.finish_index()               # counted whole: its map is viewed too
    views = f.index_views()
    assert len(views) == 3 and views[2] is not None
    for v, w in zip(views + built[:2], want + want[:2]):
        assert np.array_equal(v, w) and not v.flags.writeable
        with pytest.raises(ValueError):
            v[0] = 1
    f.begin_index()                # drops the counted index: views hold it
    f.close()
    for v, w in zip(views + built, want + want):
        assert np.array_equal(v, w)
    del views, built, again, v


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.data())
def test_checksum_tells_any_flipped_bit_and_length(data, draw):
    """The cached index's checksum changes with any one bit flipped and
    with the length (lengths around its 8- and 32-byte rounds), and chains
    through its seed."""
    h = checksum(data)
    assert h == checksum(bytearray(data))
    assert checksum(data + b"\0") != h
    if data:
        bit = draw.draw(st.integers(0, 8 * len(data) - 1))
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << bit % 8
        assert checksum(flipped) != h
        assert checksum(data[:-1]) != h
    assert checksum(data, 1) != h
    assert checksum(np.frombuffer(data + bytes(-len(data) % 8),
                                  dtype=np.uint64)) == \
        checksum(data + bytes(-len(data) % 8))


def rewrite_cache(path, edit):
    """Apply edit(leaves, first, recmap) -> (leaves, first, recmap) to the
    one cache file, keeping its header and a valid digest (so only the
    map's own checks can catch the damage)."""
    arr = np.load(path)
    h = 9
    n, m = int(arr[h]), int(arr[h + 1])
    body = arr[h + 4:]
    leaves, first, recmap = edit(body[:n].copy(), body[n:2 * n + 1].copy(),
                                 body[2 * n + 1:].copy())
    reader_mod._save_index(path, arr[:h], leaves, first, recmap)
    assert len(np.load(path)) == h + 4 + 2 * n + 1 + len(recmap)


@pytest.mark.parametrize("damage", ["past_page", "odd_offset", "in_header",
                                    "huge_value", "short"])
def test_damaged_cached_map_is_a_clear_error(tmp_path, damage):
    path = str(tmp_path / "db")
    os.makedirs(path)
    scattered(path)
    leaves, first, _ = whole_index(path)
    (cache,) = cache_files(tmp_path)
    rec = 123
    leaf = int(np.searchsorted(first, rec, side="right") - 1)
    pg = int(leaves[leaf])

    def edit(lv, fi, m):
        e = int(m[rec])
        off, ks = e & 0xffff, (e >> 16) & 0xffff
        if damage == "past_page":
            m[rec] = (PAGE - 100) | ks << 16 | 700 << 32
        elif damage == "odd_offset":
            m[rec] = (off + 1) | ks << 16 | 10 << 32
        elif damage == "in_header":
            m[rec] = 4 | ks << 16 | 10 << 32
        elif damage == "huge_value":
            m[rec] = off | ks << 16 | (1 << 31) << 32
        else:
            m = m[:-1]
        return lv, fi, m

    rewrite_cache(cache, edit)
    with pytest.raises(lmdbio.CorruptedError) as e:
        lmdbio.Reader(path, shuffle=True)   # a shuffled start loads the map
    msg = str(e.value)
    assert "record map" in msg
    assert cache in msg and "index_cache=False" in msg   # what to do
    assert "\n" not in msg
    if damage != "short":
        assert "record %d" % rec in msg and "page %d" % pg in msg
    # an unshuffled start never loads it; read() does, and says the same
    with lmdbio.Reader(path) as r:
        assert r.index_from_cache
        assert sum(len(b) for b in r) == r.total_records
        with pytest.raises(lmdbio.CorruptedError, match="record map"):
            r.read([rec])


def test_overlapping_map_entries_fail_at_read(tmp_path):
    """Two records the map puts in overlapping places (each inside its
    page, so the load-time checks pass) fail when a window reads both,
    instead of writing one record over another."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = scattered(path)
    leaves, first, _ = whole_index(path)
    (cache,) = cache_files(tmp_path)
    # the first two records of one leaf
    leaf = next(i for i in range(len(leaves)) if first[i + 1] - first[i] >= 2)
    a, b = int(first[leaf]), int(first[leaf] + 1)

    def edit(lv, fi, m):
        m[b] = m[a] + 2 - (2 << 32)    # two bytes further, as far
        return lv, fi, m

    rewrite_cache(cache, edit)
    with lmdbio.Reader(path) as r:
        assert r.read([a]).values.tolist() == [items[a][1]]
        with pytest.raises(lmdbio.CorruptedError, match="record map"):
            r.read([a, b])


def test_old_cache_format_is_rebuilt(tmp_path):
    """A cache file of the previous format (no record map, version 3) at
    the same name is not misread: the index is rebuilt, map included."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = scattered(path)
    leaves, first, _ = whole_index(path)
    (cache,) = cache_files(tmp_path)
    head = np.load(cache)[:9].copy()
    head[1] = 3
    body = np.concatenate([leaves, first]).astype(np.uint64)
    old = np.concatenate([head, np.array([len(leaves),
                                          reader_mod._digest(body)],
                                         dtype=np.uint64), body])
    np.save(cache, old, allow_pickle=False)
    with lmdbio.Reader(path, shuffle=True) as r:
        assert not r.index_from_cache
        assert r._file.index_recmap() is not None
        got = {}
        for b in r:
            got.update(zip(b.indices.tolist(), b.values.tolist()))
    assert got == {i: v for i, (_, v) in enumerate(items)}


def test_damaged_leaf_keeps_its_records_on_the_leaf_path(tmp_path):
    """A leaf whose node array is damaged (its header intact) gets no map
    entries at the build: the open succeeds and the batch that needs the
    leaf raises naming it, as without a map; other records read fine."""
    path = str(tmp_path)
    items = [(b"r%06d" % i, value_of(i, 500)) for i in range(400)]
    write_items(path, items)
    lf = LmdbFile(path)
    leaf = next(p for p in lf.leaves()
                if any(nd.key == items[200][0] for nd in p.nodes))
    with open(lf.path, "r+b") as fh:   # first node pointer into the header
        fh.seek(leaf.pgno * lf.psize + 16)
        fh.write((2).to_bytes(2, "little"))
    with lmdbio.Reader(path, index_cache=False, shuffle=True) as r:
        m = r._file.index_recmap()          # (built at open when shuffled)
        leaves, first = r._file.index_arrays()
        i = list(leaves).index(leaf.pgno)
        assert not m[first[i]:first[i + 1]].any()
        assert m[:first[i]].all()
        assert r.read([0, 399]).values.tolist() == [items[0][1],
                                                    items[399][1]]
        with pytest.raises(lmdbio.CorruptedError, match=str(leaf.pgno)):
            r.read([200])


def test_direct_io_reads_mapped_records(tmp_path):
    """O_DIRECT reads whole aligned blocks and copies out the record: the
    map path works there too (where the filesystem allows O_DIRECT)."""
    path = str(tmp_path)
    items = scattered(path)
    try:
        r = lmdbio.Reader(path, direct=True, shuffle=True, batch_size=50,
                          index_cache=False)
    except lmdbio.Error as e:
        if "O_DIRECT" in str(e) or "direct" in str(e):
            pytest.skip("no O_DIRECT on this filesystem: %s" % e)
        raise
    with r:
        assert r._file.index_recmap() is not None
        got = {}
        for b in r:
            got.update(zip(b.indices.tolist(), b.values.tolist()))
    assert got == {i: v for i, (_, v) in enumerate(items)}


class _PreadExecutor:
    """A collective-style executor (as MPI-IO's): every step's plan
    arrives as one read_extents call, here served with os.pread."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)
        self.calls = 0

    def read_extents(self, offsets, lengths, out):
        self.calls += 1
        pos = 0
        for off, ln in zip(offsets.tolist(), lengths.tolist()):
            out[pos:pos + ln] = np.frombuffer(os.pread(self.fd, ln, off),
                                              dtype=np.uint8)
            pos += ln

    def close(self):
        os.close(self.fd)


def test_collective_executor_runs_once_per_step_with_the_map(tmp_path):
    """Through an executor that must run exactly once per step (MPI-IO's
    collective reads), a window of mapped records still makes two calls
    (prepare reads no leaf: an empty plan; fill reads the records), and
    returns what the leaf path returns."""
    path = str(tmp_path)
    items = scattered(path)
    data = os.path.join(path, "data.mdb")
    ex = _PreadExecutor(data)
    f = BulkFile(data, executor=ex)
    g = open_file(path, recmap=False)
    try:
        assert f.snapshot(0)
        f.select(None)
        f.build_index()
        assert f.index_recmap() is not None
        ords = np.array([5, 300, 77, 5, 599, 0, 1, 2, 3], dtype=np.int64)
        ends = np.array([4, 9], dtype=np.intp)
        for keys in (True, False):
            before = ex.calls
            windows_equal(f, g, ords, ends, keys)
            assert ex.calls - before == 2
        sparse = np.arange(0, 600, 50)
        before = ex.calls
        (kd, ko, vd, vo), = f.read_window(sparse, [len(sparse)], True)[0]
        assert ex.calls - before == 2
        assert [bytes(vd[vo[j]:vo[j + 1]]) for j in range(len(sparse))] == \
            [items[i][1] for i in sparse]
    finally:
        f.close()
        g.close()
        ex.close()


def test_map_is_loaded_only_by_a_start_that_reads_with_it(tmp_path):
    """A later start in key order (or a shard) checks the index part of the
    cache file only: the map (8 bytes a record) is loaded and checked by a
    shuffled start or the first read(); a map whose bytes no longer match
    their own checksum is a clear error there, never a silent misread."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = scattered(path)
    m = whole_index(path)[2]
    assert m is not None                      # built with the index
    with lmdbio.Reader(path) as r:
        assert r.index_from_cache
        assert r._file.index_recmap() is None   # not loaded
        idx = [5, 77, 3]
        assert r.read(idx).values.tolist() == [items[i][1] for i in idx]
        assert np.array_equal(r._file.index_recmap(), m)
    with lmdbio.Reader(path, shuffle=True) as r:
        assert np.array_equal(r._file.index_recmap(), m)
    (cache,) = cache_files(tmp_path)
    arr = np.load(cache)
    arr[-1] ^= np.uint64(1 << 40)            # the map's last entry: no new digest
    np.save(cache, arr, allow_pickle=False)
    with lmdbio.Reader(path) as r:           # in key order: unaffected
        assert r.index_from_cache
        got = [v for b in r for v in b.values.tolist()]
        assert got == [v for _, v in items]
        with pytest.raises(lmdbio.CorruptedError, match="checksum") as e:
            r.read([0])
        assert cache in str(e.value) and "index_cache=False" in str(e.value)
    with pytest.raises(lmdbio.CorruptedError, match="checksum"):
        lmdbio.Reader(path, shuffle=True)


def test_open_reads_only_the_index_part_of_the_cache(tmp_path):
    """The map's bytes stay on disk at open: a cache file whose map was cut
    off still serves an unshuffled start from the cache, and read() then
    goes through the leaves (the map only makes reads cheaper)."""
    path = str(tmp_path / "db")
    os.makedirs(path)
    items = scattered(path)
    assert whole_index(path)[2] is not None
    (cache,) = cache_files(tmp_path)
    size = os.path.getsize(cache)
    with open(cache, "r+b") as f:
        f.truncate(size - 8 * 100)           # the last 100 map entries
    with lmdbio.Reader(path) as r:
        assert r.index_from_cache
        got = [v for b in r for v in b.values.tolist()]
        assert got == [v for _, v in items]
        idx = [9, 1, 400]
        assert r.read(idx).values.tolist() == [items[i][1] for i in idx]
        assert r._file.index_recmap() is None   # no map: the leaf path


@settings(max_examples=60, deadline=None)
@given(db=databases(), round_pages=st.sampled_from([1, 2, 3, 7, 64, 513]))
def test_a_build_in_rounds_of_any_size_is_the_same_index(db, round_pages):
    """build_index(round_bytes) (rounds of any size; a Reader builds in
    the default 8 MiB) makes the index, record map and all, that the
    default rounds make: rounds of one page, of a few, of an odd count, of
    more than the file."""
    ops, name, spec = db
    with tempfile.TemporaryDirectory() as tmp:
        write_env(tmp, {name: (spec, ops)}, txn_size=60)
        f = open_file(tmp, name)
        try:
            want = (*f.index_arrays(), f.index_recmap())
            f.build_index(round_pages * PAGE + (5 if round_pages > 2 else 0))
            got = (*f.index_arrays(), f.index_recmap())
        finally:
            f.close()
    assert (want[2] is None) == (got[2] is None)
    for a, b in zip(want, got):
        if a is not None:
            assert np.array_equal(a, b)


def build_both_ways(path, name, round_bytes):
    """The index built by the pool's threads, each counting and mapping
    the leaves it copied (the plan's done hook), and by an executor that
    never calls the hook (the core counts every read after it): both as
    (leaves, first, map), or the error each build raised."""
    data = os.path.join(path, "data.mdb")
    ex = _PreadExecutor(data)
    got = []
    for f in (BulkFile(data, threads=4), BulkFile(data, executor=ex)):
        try:
            assert f.snapshot(0)
            f.select(name)
            try:
                f.build_index(round_bytes)
            except lmdbio.Error as e:
                got.append((type(e), str(e)))
            else:
                got.append((*f.index_arrays(), f.index_recmap()))
        finally:
            f.close()
    ex.close()
    return got


def same_index(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert np.array_equal(x, y)
        else:
            assert x == y


@settings(max_examples=60, deadline=None)
@given(db=databases(), round_pages=st.sampled_from([0, 2, 7, 64]))
def test_the_threads_count_the_leaves_as_the_core_does(db, round_pages):
    """Leaves counted and mapped by the threads that read them, in any
    order and concurrently, make the index a count after the reads makes:
    plain trees with their record map, DUPSORT ones counting duplicates."""
    ops, name, spec = db
    with tempfile.TemporaryDirectory() as tmp:
        write_env(tmp, {name: (spec, ops)}, txn_size=60)
        pooled, serial = build_both_ways(tmp, name, round_pages * PAGE)
    same_index(pooled, serial)


@pytest.mark.parametrize("round_pages", [0, 16])
def test_the_first_damaged_leaf_in_page_order_fails_the_build(
        tmp_path, round_pages):
    """Two leaves with damaged headers, far apart: the pool's threads and
    a count after the reads fail the build with one error, naming the
    damaged leaf a count in page order meets first."""
    path = str(tmp_path)
    scattered(path, n=3000)
    lf = LmdbFile(path)
    leaves = sorted(p.pgno for p in lf.leaves())
    damaged = [leaves[len(leaves) // 2], leaves[-3]]
    with open(lf.path, "r+b") as fh:
        for pg in damaged:          # the header's page number
            fh.seek(pg * lf.psize)
            fh.write((pg + 1).to_bytes(8, "little"))
    pooled, serial = build_both_ways(path, None, round_pages * PAGE)
    assert pooled == serial
    assert pooled[0] is lmdbio.CorruptedError
    assert "page %d " % damaged[0] in pooled[1]
