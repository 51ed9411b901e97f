"""The Reader's window path: several batches planned and read together.

The window path must return exactly what reading one batch at a time
returns (``Reader.read`` of the batch's ordinals, which is a window of one
batch) and what py-lmdb's cursor walk says (the oracle), for any window
size, order, shard and drop_last; the planner's requests must cover every
needed range and read nothing outside the gap tolerance; a damaged page
raises at the first batch that needs it, after every batch before it.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_lmdbio, spec_shard
from lmdb_fixtures import (
    COMBOS_BY_ID, LmdbFile, data_file, patch, prefetch_threads,
    read_all_pylmdb, value_of, write_env, write_items, write_sized,
)

try:
    import lmdbio
    from lmdbio._bulk import BulkFile, plan_reads
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

PLAIN = COMBOS_BY_ID["plain"]
DUPSORT = COMBOS_BY_ID["dupsort"]
PAGE = 4096


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def oracle(path, db=None):
    return read_all_pylmdb(path, names=(db,))[db]


@st.composite
def databases(draw):
    """(ops, db name, spec): plain databases with inline and overflow
    values inserted in random order (scattered leaves), or DUPSORT ones
    whose keys have a few or hundreds of duplicates (sub-databases)."""
    if draw(st.booleans()):
        n = draw(st.integers(0, 400))
        order = draw(st.permutations(range(n)))
        size = st.sampled_from([0, 10, 300, 1000, 3 * PAGE + 5])
        ops = [("put", b"k%05d" % i, value_of(i, draw(size))) for i in order]
        return ops, None, PLAIN
    ops = []
    for i in range(draw(st.integers(1, 8))):
        for j in range(draw(st.sampled_from([1, 3, 40, 300]))):
            ops.append(("put", b"d%03d" % i, b"%05d" % j * 3))
    return ops, b"dups", DUPSORT


@settings(max_examples=60, deadline=None)
@given(db=databases(), bs=st.sampled_from([1, 7, 64, 1000]),
       prefetch=st.sampled_from([1, 8192, 1 << 20, 64 << 20]),
       shuffle=st.booleans(), p=st.sampled_from([1, 3]),
       drop_last=st.booleans(), seed=st.integers(0, 3))
def test_windows_equal_batches_and_oracle(db, bs, prefetch, shuffle, p,
                                          drop_last, seed):
    ops, name, spec = db
    with tempfile.TemporaryDirectory() as tmp:
        write_env(tmp, {name: (spec, ops)}, txn_size=50)
        items = oracle(tmp, name)
        n = len(items)
        for r in range(p):
            with lmdbio.Reader(tmp, db=name, batch_size=bs, shuffle=shuffle,
                               seed=seed, rank=r, world_size=p,
                               drop_last=drop_last, prefetch_bytes=prefetch,
                               index_cache=False) as reader:
                # Epoch 1 in key order counts the leaves as it reads them;
                # epoch 2, and a shuffled epoch, read with a whole index.
                for epoch in (1, 2):
                    want = spec_shard(n, p, r, shuffle, seed, epoch,
                                      drop_last, bs)
                    reader.set_epoch(epoch)
                    before = reader.window_stats["pipeline_windows"]
                    got = []
                    for b in reader:
                        got.extend(b.indices.tolist())
                        assert len(b) <= bs
                        # the window path against one batch at a time
                        one = reader.read(b.indices)
                        assert b.keys.tolist() == one.keys.tolist()
                        assert b.values.tolist() == one.values.tolist()
                        # and against py-lmdb
                        assert b.keys.tolist() == [items[i][0]
                                                   for i in b.indices]
                        assert b.values.tolist() == [items[i][1]
                                                     for i in b.indices]
                    assert got == want
                    assert reader.num_records == len(want)
                    piped = reader.window_stats["pipeline_windows"] - before
                    if len(want) > bs:
                        assert piped > 0   # past the first batch: C lanes


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_read_window_any_batch_ends(tmp_path_factory, data):
    """BulkFile.read_window with arbitrary batch boundaries (empty batches
    and repeated ordinals included) equals read() of each batch alone."""
    path = str(tmp_path_factory.mktemp("ends"))
    items = [(b"k%04d" % i, value_of(i, [5, 900, 2 * PAGE][i % 3]))
             for i in range(300)]
    if not os.path.exists(os.path.join(path, "data.mdb")):
        write_items(path, items)
    f = BulkFile(os.path.join(path, "data.mdb"))
    try:
        assert f.snapshot(0)
        f.build_index()
        ords = np.array(data.draw(st.lists(st.integers(0, 299), max_size=200)),
                        dtype=np.int64)
        cuts = sorted(data.draw(st.lists(st.integers(0, len(ords)),
                                         max_size=8)))
        ends = np.array(cuts + [len(ords)], dtype=np.intp)
        keys = data.draw(st.booleans())
        parts, leaf_bytes = f.read_window(ords, ends, keys)
        assert len(parts) == len(ends)
        start = 0
        for (kd, ko, vd, vo), end in zip(parts, ends):
            kd1, ko1, vd1, vo1 = f.read(ords[start:end], keys)
            assert np.array_equal(vo, vo1) and bytes(vd) == bytes(vd1)
            assert vo[0] == 0 and vo[-1] == len(vd)
            if keys:
                assert np.array_equal(ko, ko1) and bytes(kd) == bytes(kd1)
            else:
                assert kd is None and ko is None
            for j, o in enumerate(ords[start:end]):
                assert bytes(vd[vo[j]:vo[j + 1]]) == items[o][1]
            start = end
        # each distinct leaf read once
        assert leaf_bytes % PAGE == 0
        assert leaf_bytes <= PAGE * len(set(ords.tolist())) or len(ords) == 0
    finally:
        f.close()


def test_read_window_advice_and_newest_change_nothing_read(tmp_path):
    """read_window's advice for windows to come and its newest txnid (both
    taken in the window's own steps) leave the batches as they were, and
    the txnid is the one newest_txnid() reads, also after a commit."""
    path = str(tmp_path)
    items = [(b"k%04d" % i, value_of(i, [5, 900, 2 * PAGE][i % 3]))
             for i in range(300)]
    write_items(path, items)
    f = BulkFile(os.path.join(path, "data.mdb"))
    try:
        assert f.snapshot(0)
        f.build_index()
        ords = np.arange(40, 140, dtype=np.int64)
        ends = np.array([30, 60, 100], dtype=np.intp)
        plain, lb = f.read_window(ords, ends, True)
        got = f.read_window(ords, ends, True, advise=np.arange(140, 300),
                            newest=True)
        assert len(got) == 3 and got[1] == lb
        assert got[2] == f.newest_txnid() == f.txnid
        for a, b in zip(plain, got[0]):
            assert all(bytes(x) == bytes(y) for x, y in zip(a, b))
        import lmdb
        with lmdb.open(path) as env, env.begin(write=True) as txn:
            txn.put(b"zzz", b"1")
        assert f.read_window(ords, ends, False, newest=True)[2] == \
            f.txnid + 1 == f.newest_txnid()
    finally:
        f.close()


def test_read_window_rejects_bad_ends(tmp_path):
    write_items(str(tmp_path), [(b"a", b"1"), (b"b", b"2")])
    f = BulkFile(str(tmp_path / "data.mdb"))
    try:
        assert f.snapshot(0)
        f.build_index()
        with pytest.raises(ValueError):
            f.read_window(np.array([0, 1]), np.array([1], dtype=np.intp))
        with pytest.raises(lmdbio.Error):
            f.read_window(np.array([0, 1]), np.array([2, 1, 2], dtype=np.intp))
    finally:
        f.close()


@settings(max_examples=300, deadline=None)
@given(extents=st.lists(st.tuples(st.integers(0, 20000), st.integers(0, 9000)),
                        max_size=60),
       max_gap=st.sampled_from([0, 1, 4096, 16384, 1 << 20]),
       max_read=st.sampled_from([1, 4096, 65536, 8 << 20]))
def test_planner_covers_needed_and_respects_gap(extents, max_gap, max_read):
    """Every needed range lies inside exactly one request; a request only
    bridges holes up to max_gap and grows past max_read only by a single
    extent; two requests are separate only when joining them would break
    one of those bounds."""
    offs, lens, pos = [], [], 0
    for gap, length in extents:
        offs.append(pos + gap)
        lens.append(length)
        pos += gap + length
    reads = plan_reads(offs, lens, max_gap, max_read)
    # requests ascend without overlapping
    for (o1, l1, _), (o2, _, _) in zip(reads, reads[1:]):
        assert o1 + l1 <= o2
    wanted = [(o, l) for o, l in zip(offs, lens) if l]
    ri = 0
    members = [[] for _ in reads]
    for o, l in wanted:
        while ri < len(reads) and reads[ri][0] + reads[ri][1] <= o:
            ri += 1
        assert ri < len(reads), "extent %r not read" % ((o, l),)
        ro, rl, _ = reads[ri]
        assert ro <= o and o + l <= ro + rl, "extent %r split" % ((o, l),)
        members[ri].append((o, l))
    for (ro, rl, _), mem in zip(reads, members):
        assert mem, "a request reads nothing that was asked for"
        assert mem[0][0] == ro and mem[-1][0] + mem[-1][1] == ro + rl
        for (o1, l1), (o2, _) in zip(mem, mem[1:]):
            assert o2 - (o1 + l1) <= max_gap
        if len(mem) > 1:
            assert rl <= max_read
    # bytes read beyond what was asked for: holes of at most max_gap each
    extra = sum(rl for _, rl, _ in reads) - sum(l for _, l in wanted)
    assert extra <= max_gap * max(0, len(wanted) - len(reads))
    for (o1, l1, _), (o2, l2, _) in zip(reads, reads[1:]):
        assert o2 - (o1 + l1) > max_gap or l1 + (o2 - o1 - l1) + l2 > max_read \
            or max_read < 1


def test_planner_rejects_unsorted():
    with pytest.raises(ValueError):
        plan_reads([100, 50], [10, 10], 4096, 1 << 20)


@pytest.fixture(scope="module")
def scattered_env(tmp_path_factory):
    """3,000 records inserted in random key order: key order jumps around
    the file, the layout where windows matter."""
    path = str(tmp_path_factory.mktemp("scattered"))
    rng = np.random.default_rng(5)
    items = [(b"r%06d" % i, value_of(i, 700)) for i in range(3000)]
    write_items(path, [items[i] for i in rng.permutation(len(items))])
    return path, items


@pytest.mark.parametrize("whole_index", [False, True])
def test_damaged_leaf_mid_window_raises_after_earlier_batches(tmp_path,
                                                              whole_index):
    """A leaf in the middle of a large window is damaged: every batch
    before the one that needs it arrives intact, then that batch raises
    naming the page.  Counting the leaves as the epoch reads them or with
    the whole index built first (the C pipeline's lanes both)."""
    items = [(b"r%06d" % i, value_of(i, 500)) for i in range(2000)]
    write_items(str(tmp_path), items)
    lf = LmdbFile(str(tmp_path))
    ordinal = {k: i for i, (k, _) in enumerate(items)}
    leaf = next(p for p in lf.leaves()
                if any(nd.key == items[1000][0] for nd in p.nodes))
    bad = leaf.pgno
    first_bad = min(ordinal[nd.key] for nd in leaf.nodes)
    # the first node pointer aims into the page header: the leaf header
    # (all the index reads) is intact, the node array is not
    patch(lf.path, bad * lf.psize + 16, "<H", 2)
    bs = 50
    with lmdbio.Reader(str(tmp_path), batch_size=bs, index_cache=False,
                       prefetch_bytes=64 << 20) as r:
        if whole_index:
            r.read([0])   # random access builds the whole index
        got = []
        with pytest.raises(lmdbio.CorruptedError, match=str(bad)):
            for b in r:
                assert b.values.tolist() == [items[i][1] for i in b.indices]
                got.extend(b.indices.tolist())
        assert got == list(range(first_bad // bs * bs))
        assert r.window_stats["max_batches"] >= 4  # read in windows
        assert r.window_stats["pipeline_windows"] > 0
        assert not prefetch_threads(settle=5)


def test_windows_grow_and_stay_within_prefetch_bytes(scattered_env):
    path, items = scattered_env
    budget = 256 << 10
    with lmdbio.Reader(path, batch_size=16, prefetch_bytes=budget,
                       index_cache=False) as r:
        n = sum(len(b) for b in r)
        ws = r.window_stats
    assert n == len(items)
    assert ws["max_batches"] > 1          # batches were read together
    one_batch = 16 * (700 + 16) + 16 * PAGE  # values, keys, a leaf each
    assert ws["max_bytes"] <= budget // 4 + one_batch
    with lmdbio.Reader(path, batch_size=16, prefetch_bytes=1,
                       index_cache=False) as r:
        assert sum(len(b) for b in r) == len(items)
        assert r.window_stats["max_batches"] == 1   # never below one batch


@pytest.mark.parametrize("whole_index", [False, True])
def test_big_batches_read_ahead_one_window_per_lane(tmp_path, whole_index):
    """Batches larger than prefetch_bytes: one window per prefetch lane
    ahead of the consumer, not four; small windows keep three.  Counting
    the leaves as the epoch reads them, or with a whole index."""
    items = [(b"%04d" % i, bytes([i % 251]) * (20000 + i % 7))
             for i in range(240)]
    write_items(tmp_path, items)
    with lmdbio.Reader(str(tmp_path), batch_size=20, prefetch_bytes=64 << 10,
                       index_cache=False) as r:
        if whole_index:
            r.read([0])
        got = []
        for b in r:   # a slow consumer: the lanes read as far as allowed
            time.sleep(0.01)
            got += b.values.tolist()
        assert got == [v for _, v in items]
        assert r.window_stats["max_ahead"] == 2     # two lanes
        assert r.window_stats["max_batches"] == 1
        assert r.window_stats["pipeline_windows"] > 0
    with lmdbio.Reader(str(tmp_path), batch_size=1, index_cache=False) as r:
        if whole_index:
            r.read([0])
        n = 0
        for b in r:
            time.sleep(0.002)
            n += len(b)
        assert n == len(items)
        assert r.window_stats["max_ahead"] == 3     # budget for all three
        assert r.window_stats["pipeline_windows"] > 0


def test_shuffled_window_reads_each_leaf_once(scattered_env):
    """A shuffled epoch read in one window reads each leaf it needs once,
    not once per record (records read through their leaves: the index
    without its record map)."""
    path, items = scattered_env
    with lmdbio.Reader(path, batch_size=len(items), shuffle=True,
                       index_cache=False, storage=(0, 1e9)) as r:
        r._file.adopt_index(*r._file.index_arrays())   # no record map
        before = r.io_stats()
        (b,) = list(r)
        requests, nbytes = (x - y for x, y in zip(r.io_stats(), before))
        leaves = r._file.num_leaves
    assert sorted(b.indices.tolist()) == list(range(len(items)))
    assert nbytes == leaves * PAGE            # each leaf once, no holes
    assert requests <= leaves


def test_cached_reads_skip_wide_gaps_and_return_the_same(tmp_path):
    """Read from the page cache, a planned read skips the gaps of 8 KiB or
    more that it merged for the storage (another call costs less than the
    copy): a shuffled epoch through the record map, whose reads bridge such
    gaps, returns exactly what py-lmdb holds, and skipped some."""
    path = str(tmp_path / "db")
    items = write_sized(path, [800] * 3000)
    cache = str(tmp_path / "ic")
    with lmdbio.Reader(path, batch_size=500, shuffle=True,
                       index_cache=cache) as r:
        list(r)                     # the index (and its map) cached
    with open(data_file(path), "rb") as f:   # hot: all of it cached
        f.read()
    with lmdbio.Reader(path, batch_size=500, shuffle=True, seed=3,
                       index_cache=cache, storage=(1e-3, 1e9)) as r:
        assert r.index_from_cache
        seen = 0
        for b in r:
            for i, v in zip(b.indices.tolist(), b.values.tolist()):
                assert v == items[i][1]
                seen += 1
        skipped = r._file.gaps_skipped()
    assert seen == len(items)
    assert skipped > 0


def _descriptions_of(path):
    """This process's open descriptors of the file at path."""
    target = os.path.realpath(path)
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.path.realpath("/proc/self/fd/" + fd) == target:
                fds.append(fd)
        except OSError:
            pass
    return fds


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_lanes_read_the_cache_through_their_own_descriptions(tmp_path):
    """The pipeline's lanes read what the page cache holds through their
    own open file descriptions of the data file (two threads on one
    contend on its reference count): a shuffled epoch through them returns
    exactly what py-lmdb holds, also after the file's path was replaced
    mid-epoch (the lanes reopen the open file, not the path), and closing
    the Reader closes them."""
    path = str(tmp_path / "db")
    items = write_sized(path, [800] * 3000)
    with open(data_file(path), "rb") as f:   # hot: the cached path
        f.read()
    before = len(_descriptions_of(data_file(path)))
    with lmdbio.Reader(path, batch_size=100, shuffle=True, seed=1,
                       index_cache=False) as r:
        got = {}
        for j, b in enumerate(r):
            if j == 1:   # the lanes have opened theirs: replace the path
                os.rename(data_file(path), data_file(path) + ".old")
                with open(data_file(path), "wb") as f:
                    f.write(b"\0" * 8192)
            got.update(zip(b.indices.tolist(), b.values.tolist()))
        assert r._file.lane_descriptions() == [True, True]
        open_now = len(_descriptions_of(data_file(path) + ".old"))
    assert got == {i: v for i, (_, v) in enumerate(items)}
    assert open_now == before + 3            # the file's, and each lane's
    assert len(_descriptions_of(data_file(path) + ".old")) == before


@pytest.mark.parametrize("cache", ["keep", "drop"])
@pytest.mark.parametrize("storage", ["local", "network", (1e-4, 5e8)])
def test_cache_and_storage_policies_read_the_same(scattered_env, cache,
                                                  storage):
    path, items = scattered_env
    with lmdbio.Reader(path, batch_size=100, shuffle=True, cache=cache,
                       storage=storage, index_cache=False) as r:
        got = {}
        for b in r:
            got.update(zip(b.indices.tolist(), b.values.tolist()))
    assert got == {i: v for i, (_, v) in enumerate(items)}


@pytest.mark.parametrize("bad", [dict(cache="off"), dict(storage="tape"),
                                 dict(storage=(1,)), dict(storage=(-1, 5)),
                                 dict(storage=(1e-3, 0))])
def test_bad_policy_is_one_clear_error(scattered_env, bad):
    with pytest.raises(ValueError) as e:
        lmdbio.Reader(scattered_env[0], index_cache=False, **bad)
    assert "\n" not in str(e.value) and list(bad)[0] in str(e.value)


def test_close_mid_window_stops_threads(scattered_env):
    path, items = scattered_env
    r = lmdbio.Reader(path, batch_size=8, shuffle=True, index_cache=False)
    it = iter(r)
    next(it)
    next(it)
    assert prefetch_threads()
    r.close()
    assert not prefetch_threads(settle=5)
    with pytest.raises(lmdbio.Error):
        next(it)


def consumer(batches, out):
    """A thread's target: iterate `batches`, noting each batch's length in
    `out`, then "done" or the lmdbio.Error that ended the iteration."""
    def consume():
        try:
            for b in batches:
                out.append(len(b))
            out.append("done")
        except lmdbio.Error as e:
            out.append(e)
    return consume


def assert_ended_well(out, rest=None):
    """The consumer ended with lmdbio.Error, or with the whole rest of the
    epoch (`rest` records, when given): never short without an error."""
    assert out and (out[-1] == "done" or
                    isinstance(out[-1], lmdbio.Error)), out[-3:]
    if out[-1] == "done" and rest is not None:
        assert sum(out[:-1]) == rest


def test_close_from_another_thread_while_waiting_for_a_window(
        scattered_env):
    """close() from another thread while the consumer may be waiting for
    the pipeline's next window (or wrapping one): the consumer gets
    lmdbio.Error or finishes its epoch, nothing hangs or crashes, and no
    lane is left."""
    import threading
    path, items = scattered_env
    for delay in (0.0, 0.0005, 0.002, 0.005, 0.02):
        r = lmdbio.Reader(path, batch_size=8, shuffle=True,
                          index_cache=False, prefetch_bytes=64 << 10)
        out = []
        t = threading.Thread(target=consumer(r, out))
        t.start()
        time.sleep(delay)
        r.close()
        t.join(30)
        assert not t.is_alive()
        assert_ended_well(out, len(items))
        assert not prefetch_threads(settle=5)


@pytest.fixture(scope="module")
def wide_env(tmp_path_factory):
    """6,000 records of 3 KB in key order: windows of MiBs, which the lanes
    take a while to finish when stopped."""
    path = str(tmp_path_factory.mktemp("wide"))
    write_items(path, [(b"w%06d" % i, value_of(i, 3000)) for i in range(6000)])
    return path


@pytest.mark.parametrize("consumer_thread", [False, True])
@pytest.mark.parametrize("several", [False, True])
def test_close_from_two_threads_at_once(scattered_env, wide_env,
                                        consumer_thread, several):
    """Two threads close the Reader mid-epoch (while a third iterates, or
    nobody does): each close returns once the lanes are joined (the second
    does not free the readers they still use), a consumer gets
    lmdbio.Error or the whole epoch, nothing crashes, no lane is left.
    One environment (C lanes) or several (Python lanes)."""
    import threading
    path = [wide_env, scattered_env[0]] if several else wide_env
    for delay in (0.0, 0.001, 0.005):
        for _ in range(5):
            r = lmdbio.Reader(path, batch_size=64, index_cache=False)
            it = iter(r)
            for _ in range(20):   # the lanes run, their windows grown
                next(it)
            out, failed = [], []

            def close():
                try:
                    r.close()
                except BaseException as e:   # reported below
                    failed.append(e)

            threads = [threading.Thread(target=close) for _ in range(2)]
            if consumer_thread:
                threads.insert(0, threading.Thread(target=consumer(it, out)))
            threads[0].start()
            time.sleep(delay)
            for t in threads[1:]:
                t.start()
            for t in threads:
                t.join(30)
                assert not t.is_alive()
            assert not failed
            if consumer_thread:
                assert_ended_well(out, r.num_records - 20 * 64)
            assert not prefetch_threads(settle=5)


@pytest.mark.parametrize("shard", [(0, 4), (3, 4), (0, 1)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_read_mid_epoch_changes_the_index_and_the_epoch_goes_on(
        scattered_env, shard, shuffle):
    """read() of ordinals a shard's partial index does not cover (it builds
    the whole index), or read() during a first start that counts the index
    as it reads (it finishes the count and loads its record map): the
    window pipeline stops under the change and the epoch goes on from
    where it stopped, every record of the shard once, as an epoch without
    the read() yields."""
    path, items = scattered_env
    rank, size = shard
    kw = dict(batch_size=16, rank=rank, world_size=size, shuffle=shuffle,
              index_cache=False, prefetch_bytes=256 << 10)
    with lmdbio.Reader(path, **kw) as r:
        expect = [(b.indices.tolist(), b.values.tolist()) for b in r]
    with lmdbio.Reader(path, **kw) as r:
        got = []
        for i, b in enumerate(r):
            got.append((b.indices.tolist(), b.values.tolist()))
            if i == 5:
                (v,) = r.read([len(items) - 1]).values.tolist()
                assert v == items[-1][1]
                assert r.window_stats["pipeline_windows"] > 0
        assert not prefetch_threads(settle=5)
    assert got == expect


@pytest.mark.parametrize("several", [False, True])
def test_set_epoch_mid_epoch_keeps_the_order_it_began_with(
        scattered_env, wide_env, several):
    """set_epoch() while an epoch runs selects the next epoch's order; the
    running one keeps its own: in the C lanes, in the Python lanes that
    read several environments, and after read() mid-epoch."""
    path = [scattered_env[0], wide_env] if several else scattered_env[0]
    kw = dict(batch_size=16, rank=1, world_size=2, shuffle=True,
              index_cache=False, prefetch_bytes=256 << 10)
    with lmdbio.Reader(path, **kw) as r:
        epoch0 = [b.indices.tolist() for b in r]
        r.set_epoch(1)
        epoch1 = [b.indices.tolist() for b in r]
    assert epoch0 != epoch1
    with lmdbio.Reader(path, **kw) as r:
        got = []
        for i, b in enumerate(r):
            got.append(b.indices.tolist())
            if i == 3:
                r.set_epoch(1)
                r.read([0])
        assert got == epoch0
        assert [b.indices.tolist() for b in r] == epoch1


def test_read_from_another_thread_during_an_epoch_of_several_files(
        scattered_env, wide_env):
    """read() from a second thread while an epoch over two environments
    runs (a first start: each part counts its index as it reads, and
    read() finishes the count and loads the record map under the lanes):
    every epoch whole and exact, every read() exact, nothing raised."""
    import threading
    items = scattered_env[1] + [(b"w%06d" % i, value_of(i, 3000))
                                for i in range(6000)]
    path = [scattered_env[0], wide_env]
    rng = np.random.default_rng(1)
    for trial in range(6):
        with lmdbio.Reader(path, batch_size=32, index_cache=False,
                           prefetch_bytes=256 << 10) as r:
            errors, started = [], threading.Event()

            def reads():
                try:
                    started.wait()
                    for _ in range(5):
                        want = rng.integers(0, len(items), 30)
                        got = r.read(want).values.tolist()
                        assert got == [items[i][1] for i in want]
                except BaseException as e:   # reported below
                    errors.append(e)

            t = threading.Thread(target=reads)
            t.start()
            seen = []
            for i, b in enumerate(r):
                if i == trial:
                    started.set()
                seen += b.indices.tolist()
                assert b.values.tolist() == [items[j][1] for j in b.indices]
            started.set()
            t.join(60)
            assert not errors, errors[0]
            assert seen == list(range(len(items)))


def test_read_racing_close_is_an_lmdbio_error(wide_env):
    """read() in one thread while another closes the Reader: each read()
    returns its records or raises lmdbio.Error, nothing else."""
    import threading
    for delay in (0.0, 0.0005, 0.002):
        r = lmdbio.Reader(wide_env, batch_size=16, rank=3, world_size=4,
                          index_cache=False)   # a partial index: read()
        errors = []                             # past it rebuilds it

        def reads():
            try:
                for k in range(200):
                    r.read([k, 5999 - k])
            except lmdbio.Error:
                pass
            except BaseException as e:   # reported below
                errors.append(e)

        t = threading.Thread(target=reads)
        t.start()
        time.sleep(delay)
        r.close()
        t.join(30)
        assert not errors, errors[0]


def test_state_after_set_epoch_mid_epoch_is_the_next_epochs_start(
        scattered_env):
    """set_epoch() mid-epoch: the epoch running on does not count as the
    next one's batches; state_dict() then says the next epoch from its
    first batch, and resuming there yields all of it."""
    path = scattered_env[0]
    kw = dict(batch_size=16, shuffle=True, index_cache=False)
    with lmdbio.Reader(path, **kw) as r:
        r.set_epoch(1)
        epoch1 = [b.indices.tolist() for b in r]
    with lmdbio.Reader(path, **kw) as r:
        for i, b in enumerate(r):
            if i == 3:
                r.set_epoch(1)
        state = r.state_dict()
        assert (state["epoch"], state["batches"]) == (1, 0)
    with lmdbio.Reader(path, **kw) as r:
        r.load_state_dict(state)
        assert [b.indices.tolist() for b in r] == epoch1


@pytest.mark.parametrize("shuffle", [False, True])
def test_abandoned_epoch_frees_lanes(scattered_env, shuffle):
    path, _ = scattered_env
    with lmdbio.Reader(path, batch_size=8, index_cache=False,
                       shuffle=shuffle) as r:
        for _ in range(3):
            it = iter(r)
            next(it)
            next(it)
            it.close()   # leaves the epoch early
            assert not prefetch_threads(settle=5)
        assert sum(len(b) for b in r) == r.num_records


def _resident_fraction(path):
    """Share of a file's pages in the page cache: mincore over a mapping
    that is never touched (the test's own probe; the library maps nothing)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        try:
            npages = -(-size // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * npages)()
            assert libc.mincore(addr, size, vec) == 0
            return sum(b & 1 for b in bytes(vec)) / npages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


@pytest.mark.parametrize("shuffle", [False, True])
def test_cache_drop_leaves_the_page_cache_empty(tmp_path, shuffle):
    """cache="drop" gives the same records and leaves (almost) nothing of
    the file in the page cache; cache="keep" leaves it all (the probe
    works)."""
    items = [(b"d%06d" % i, value_of(i, 900)) for i in range(30000)]
    write_items(str(tmp_path), items)
    os.sync()   # dirty pages cannot be dropped
    data = str(tmp_path / "data.mdb")
    got = {}
    for cache in ("keep", "drop"):
        with open(data, "rb") as f:   # the whole file cached first
            while f.read(1 << 20):
                pass
        with lmdbio.Reader(str(tmp_path), batch_size=100, shuffle=shuffle,
                           cache=cache, index_cache=False) as r:
            got[cache] = {i: v for b in r
                          for i, v in zip(b.indices.tolist(),
                                          b.values.tolist())}
            after = _resident_fraction(data)
        if cache == "keep":
            assert after > 0.9, after
        else:
            assert after < 0.1, after
    assert got["keep"] == got["drop"] == {i: v for i, (_, v) in
                                          enumerate(items)}
