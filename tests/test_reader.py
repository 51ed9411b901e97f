"""The bulk path (docs/reader.md): lmdbio.Reader, Batch, Ragged, sharding.

py-lmdb is the oracle: every Reader output is compared with py-lmdb's cursor
walk of the same file (ordinal = position in that walk).  Files are written
with py-lmdb (tests/lmdb_fixtures.py); corrupt files are made by patching
them.  Scenarios that could crash or hang (corrupt pages, huge claimed sizes)
run in a subprocess with a timeout.

Every test sets XDG_CACHE_HOME to a temporary directory, so the default
index_cache=True never writes to the real user cache.
"""

from __future__ import annotations

import faulthandler
import gc
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import lmdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_lmdbio, spec_shard
from lmdb_fixtures import (
    COMBOS_BY_ID, F_BIGDATA, FLAG_COMBOS, MDB_LOAD, OS_PAGE_SIZE, P_LEAF,
    LmdbFile, data_file, make_all_flags_env, patch, patch_page_header,
    prefetch_threads, read_all_pylmdb, set_leaf_dsize, write_env,
    write_items,
)

try:
    import lmdbio
    from lmdbio import Batch, Ragged, Reader  # noqa: F401
except Exception as exc:  # pragma: no cover - a broken build
    if require_lmdbio():
        raise
    pytest.skip("lmdbio cannot be imported: %r" % (exc,), allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
LMDBIO_PATH = os.path.dirname(os.path.dirname(os.path.abspath(lmdbio.__file__)))
DUPSORT = COMBOS_BY_ID["dupsort"]
DUPFIXED = COMBOS_BY_ID["dupsort_dupfixed"]
PLAIN = COMBOS_BY_ID["plain"]


# ---------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(autouse=True)
def _isolated_cache_and_watchdog(tmp_path, monkeypatch):
    """Default index_cache=True writes under $XDG_CACHE_HOME/lmdbio: keep it
    in tmp.  A watchdog turns a hang into a traceback and a failure."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    faulthandler.dump_traceback_later(240, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def os_threads():
    """Threads of this process, C threads included (the pread pool)."""
    return len(os.listdir("/proc/self/task"))


def settle(baseline, timeout=10.0):
    """Wait (briefly) until no prefetch thread is left and the OS thread
    count is back to at most `baseline`; return the final counts."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        pf, n = prefetch_threads(), os_threads()
        if (not pf and n <= baseline) or time.monotonic() > deadline:
            return pf, n
        time.sleep(0.02)


def oracle(path, db=None, subdir=True):
    """py-lmdb's cursor walk: [(key, value)] in ordinal order."""
    if isinstance(db, str):
        db = db.encode()
    return read_all_pylmdb(path, subdir=subdir, names=(db,))[db]


def check_ragged(rg, n):
    assert isinstance(rg.data, np.ndarray) and rg.data.dtype == np.uint8
    assert rg.data.ndim == 1
    assert isinstance(rg.offsets, np.ndarray) and rg.offsets.dtype == np.int64
    assert rg.offsets.shape == (n + 1,)
    assert rg.offsets[0] == 0
    assert np.all(np.diff(rg.offsets) >= 0)
    assert rg.offsets[-1] == len(rg.data)
    assert len(rg) == n


def check_batch(b):
    assert isinstance(b.indices, np.ndarray) and b.indices.dtype == np.int64
    assert b.indices.ndim == 1
    n = len(b.indices)
    check_ragged(b.keys, n)
    check_ragged(b.values, n)
    return n


def collect(reader):
    """Iterate one epoch: (ordinals, keys, values, batch sizes)."""
    idx, ks, vs, sizes = [], [], [], []
    for b in reader:
        sizes.append(check_batch(b))
        idx.extend(b.indices.tolist())
        ks.extend(b.keys.tolist())
        vs.extend(b.values.tolist())
    return idx, ks, vs, sizes


def expected_sizes(n, bs):
    return [bs] * (n // bs) + ([n % bs] if n % bs else [])


def assert_epoch_equals(reader, items, batch_size):
    """One unshuffled single-rank epoch equals py-lmdb's walk."""
    n = len(items)
    assert len(reader) == math.ceil(n / batch_size)
    assert reader.num_records == n
    assert reader.total_records == n
    idx, ks, vs, sizes = collect(reader)
    assert idx == list(range(n))
    assert sizes == expected_sizes(n, batch_size)
    assert list(zip(ks, vs)) == items


def val_of(key, size):
    """A deterministic value of `size` bytes derived from `key`."""
    if size == 0:
        return b""
    unit = key + b"#"
    return (unit * (size // len(unit) + 1))[:size]


def run_py(code, *args, timeout=120, env_extra=None):
    """Run code in a fresh interpreter that imports this lmdbio build."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [LMDBIO_PATH, HERE] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["OPENBLAS_NUM_THREADS"] = "1"
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)] + [str(a) for a in args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=HERE)
    return proc


# ---------------------------------------------------------------------------
# Reader output == py-lmdb's cursor walk


@st.composite
def plain_dbs(draw):
    """(ops in order, txn_size): random keys (1..511 bytes, including
    exactly 1 and 511), values empty / small / on overflow pages, random
    insertion order, then deletes spread over several transactions."""
    key = st.one_of(st.binary(min_size=1, max_size=1),
                    st.binary(min_size=511, max_size=511),
                    st.binary(min_size=1, max_size=40))
    keys = draw(st.lists(key, min_size=0, max_size=160, unique=True))
    size = st.one_of(st.just(0), st.integers(1, 100), st.integers(101, 1500),
                     st.integers(OS_PAGE_SIZE - 100, 3 * OS_PAGE_SIZE + 7))
    ops = [("put", k, val_of(k, draw(size))) for k in keys]
    if keys:
        dels = draw(st.lists(st.sampled_from(keys), max_size=len(keys) // 2,
                             unique=True))
        ops += [("del", k, None) for k in dels]
        # some deleted keys come back with a new value
        ops += [("put", k, val_of(k[::-1], draw(size))) for k in dels[::3]]
    txn_size = draw(st.sampled_from([0, 5, 37]))
    return ops, txn_size


@settings(max_examples=80, deadline=None)
@given(db=plain_dbs(), bs=st.sampled_from([1, 3, 64, 10000]),
       subdir=st.booleans())
def test_plain_matches_pylmdb(db, bs, subdir):
    ops, txn_size = db
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "env" if subdir else "env.mdb")
        model = write_env(path, {None: (PLAIN, ops)}, subdir=subdir,
                          txn_size=txn_size)[None]
        items = oracle(path, subdir=subdir)
        assert items == model.items()  # the fixture's own sanity
        with lmdbio.Reader(path, subdir=subdir, batch_size=bs,
                           index_cache=False) as r:
            assert_epoch_equals(r, items, bs)


@st.composite
def dup_dbs(draw):
    """Dupsort ops: a few keys, each with 1..700 duplicates (hundreds spill
    a key's sub-page into a sub-database) of 1..511 bytes."""
    nkeys = draw(st.integers(0, 12))
    ops = []
    for i in range(nkeys):
        k = draw(st.sampled_from([b"", b"\xff" * 510])) + b"%02d" % i
        k = k[-511:]
        ndup = draw(st.sampled_from([1, 2, 7, 60, 300, 700]))
        width = draw(st.sampled_from([2, 8, 100, 511]))
        for j in range(ndup):
            v = (j.to_bytes(2, "big") * 256)[:width]
            ops.append(("put", k, v))
    if draw(st.booleans()) and ops:
        # delete a few single duplicates and one whole key
        picks = draw(st.lists(st.sampled_from(ops), max_size=20))
        ops += [("del", k, v) for _, k, v in picks]
        ops.append(("del", ops[0][1], None))
    return ops, draw(st.sampled_from([0, 50]))


@settings(max_examples=50, deadline=None)
@given(db=dup_dbs(), bs=st.sampled_from([1, 5, 128, 100000]))
def test_dupsort_matches_pylmdb(db, bs):
    ops, txn_size = db
    with tempfile.TemporaryDirectory() as tmp:
        model = write_env(tmp, {b"d": (DUPSORT, ops)}, txn_size=txn_size)[b"d"]
        items = oracle(tmp, b"d")
        assert items == model.items()
        with lmdbio.Reader(tmp, db=b"d", batch_size=bs, index_cache=False) as r:
            assert_epoch_equals(r, items, bs)


def _many_dups_env(path, spec, widths=None):
    """Keys with 1, 3, 300 and 700 duplicates: both sub-pages and
    sub-databases (asserted on the file)."""
    ops = []
    for i, ndup in enumerate([1, 3, 300, 2, 700, 1]):
        k = b"key-%d" % i
        for j in range(ndup):
            ops.append(("put", k, spec.dup_value(j + 1000 * i)))
    model = write_env(path, {b"d": (spec, ops)})[b"d"]
    f = LmdbFile(path)
    assert f.dup_trees, "no duplicate sub-database in the fixture"
    assert f.subpages, "no duplicate sub-page in the fixture"
    return model


@pytest.mark.parametrize("spec", [DUPSORT, DUPFIXED,
                                  COMBOS_BY_ID["dupsort_integerdup8_dupfixed"]],
                         ids=lambda s: s.id)
def test_hundreds_of_dups(tmp_path, spec):
    model = _many_dups_env(tmp_path, spec)
    items = oracle(tmp_path, b"d")
    assert items == model.items() and len(items) == 1007
    for bs in (1, 64, 5000):
        with lmdbio.Reader(tmp_path, db="d", batch_size=bs) as r:
            assert_epoch_equals(r, items, bs)
    if spec.val_kind in ("fixed", "int8"):
        with lmdbio.Reader(tmp_path, db=b"d", batch_size=400) as r:
            for b in r:
                fx = b.values.fixed()
                assert fx.shape == (len(b), spec.max_value_size)
                assert [bytes(row) for row in fx] == b.values.tolist()


@pytest.fixture(scope="module")
def all_flags_env(tmp_path_factory):
    if not MDB_LOAD:
        pytest.skip("mdb_load (lmdb-utils) is needed for REVERSEDUP databases")
    path = tmp_path_factory.mktemp("allflags")
    make_all_flags_env(path, n_keys=120, dups=4)
    return path


@pytest.mark.parametrize("name", [None, b"empty"] +
                         [s.id.encode() for s in FLAG_COMBOS],
                         ids=lambda n: "main" if n is None else n.decode())
def test_every_flag_combination(all_flags_env, name):
    items = oracle(all_flags_env, name)
    for db in ([name, name.decode()] if name is not None else [None]):
        for bs in (1, 17):
            with lmdbio.Reader(all_flags_env, db=db, batch_size=bs,
                               index_cache=False) as r:
                assert_epoch_equals(r, items, bs)


@pytest.mark.parametrize("spec", ["integerkey4", "integerkey8", "dupsort",
                                  "integerkey4_dupsort"])
def test_main_db_with_flags(tmp_path, spec):
    """Flags on the main database (set through mdb_load)."""
    if not MDB_LOAD:
        pytest.skip("mdb_load (lmdb-utils) is needed to set main-DB flags")
    spec = COMBOS_BY_ID[spec]
    ops = [("put", spec.make_key(i * 7919 % 1000),
            spec.make_value(i, 5 + i % 300)) for i in range(600)]
    if spec.dupsort:
        ops += [("put", spec.make_key(3), spec.dup_value(j)) for j in range(400)]
    model = write_env(tmp_path, {None: (spec, ops)})[None]
    items = oracle(tmp_path)
    assert items == model.items()
    with lmdbio.Reader(tmp_path, batch_size=100) as r:
        assert_epoch_equals(r, items, 100)


def test_scattered_pages_and_overflow(tmp_path):
    """Random inserts and deletes over many transactions: leaves are not in
    key order on disk, overflow values are scattered too."""
    import random
    rnd = random.Random(7)
    keys = [b"%08d" % rnd.randrange(10 ** 8) for _ in range(3000)]
    ops = []
    for i, k in enumerate(keys):
        size = 9000 if i % 41 == 0 else rnd.randrange(0, 300)
        ops.append(("put", k, val_of(k, size)))
        if i % 3 == 0:
            ops.append(("del", keys[rnd.randrange(i + 1)], None))
    model = write_env(tmp_path, {None: (PLAIN, ops)}, txn_size=97)[None]
    items = oracle(tmp_path)
    assert items == model.items()
    f = LmdbFile(tmp_path)
    by_key = [p.pgno for p in sorted(f.leaves(), key=lambda p: p.nodes[0].key)]
    assert by_key != sorted(by_key), "fixture failed to scatter the leaves"
    assert f.overflows()
    for bs in (1, 256, len(items) + 5):
        with lmdbio.Reader(tmp_path, batch_size=bs) as r:
            assert_epoch_equals(r, items, bs)


def test_large_tree_many_leaves_and_branches(tmp_path):
    """More than 8192 leaves (several rounds of leaf-header reads) and more
    than 256 pages on one branch level (several rounds of branch reads),
    depth >= 4 (long keys make branch pages narrow)."""
    n = 17000
    write_items(tmp_path, [(b"%06d" % i + b"." * 394, (b"%d;" % i * 500)[:1500])
                           for i in range(n)], map_size=256 << 20)
    f = LmdbFile(tmp_path)
    levels = {}
    for pg in f.pages.values():
        if pg.db == "main" and pg.flags & 0x01:
            levels[pg.level] = levels.get(pg.level, 0) + 1
    assert len(f.leaves()) > 8192 and max(levels.values()) > 256, levels
    items = oracle(tmp_path)
    with lmdbio.Reader(tmp_path, batch_size=4096, index_cache=False) as r:
        assert_epoch_equals(r, items, 4096)
        ix = [n - 1, 0, 8191, 8192, 12345, n // 2]
        assert r.read(ix).keys.tolist() == [items[i][0] for i in ix]


def test_dupsort_large_leaf_count(tmp_path):
    """A DUPSORT tree with hundreds of leaves (the index reads whole leaves
    for it, 256 pages per round)."""
    ops = [("put", b"key%05d" % i, b"%03d" % d + b"v" * 200)
           for i in range(3000) for d in range(3)]
    write_env(tmp_path, {b"d": (DUPSORT, ops)}, map_size=128 << 20)
    assert len(LmdbFile(tmp_path).leaves("d")) > 300
    items = oracle(tmp_path, b"d")
    with lmdbio.Reader(tmp_path, db=b"d", batch_size=1000, shuffle=True) as r:
        idx, ks, vs, _ = collect(r)
        assert idx == np.random.default_rng([0, 0]).permutation(9000).tolist()
        assert list(zip(ks, vs)) == [items[i] for i in idx]


def test_many_dups_of_one_key_read_in_linear_time(tmp_path):
    """24000 duplicates of one key live in a sub-database.  An epoch must
    not walk from the key's first duplicate for every record (quadratic:
    many seconds); py-lmdb's cursor walk takes milliseconds."""
    nd = 24000
    ops = [("put", b"k", b"%06d" % j) for j in range(nd)] + [("put", b"z", b"1")]
    write_env(tmp_path, {b"d": (DUPSORT, ops)})
    items = oracle(tmp_path, b"d")
    with lmdbio.Reader(tmp_path, db=b"d", batch_size=4096) as r:
        t0 = time.perf_counter()
        got = epoch_items(r)
        elapsed = time.perf_counter() - t0
    assert got == items
    assert elapsed < 2.5, "an epoch over %d dups took %.1f s" % (nd, elapsed)


def test_key_and_value_size_extremes(tmp_path):
    """1-byte and 511-byte keys; empty, page-sized and overflow values."""
    items = [(bytes([i]), b"") for i in range(0, 256, 3)]
    items += [(b"\x80" + b"%03d" % i * 170, val_of(b"%d" % i, s))
              for i, s in enumerate([0, 1, 511, 2000, 4080, 4096, 4097, 40000])]
    write_items(tmp_path, items)
    got = oracle(tmp_path)
    assert sorted(items) == got
    assert {len(k) for k, _ in got} == {1, 511}
    for bs in (1, 4, 1000):
        with lmdbio.Reader(tmp_path, batch_size=bs) as r:
            assert_epoch_equals(r, got, bs)


def test_named_db_str_bytes_and_missing(tmp_path):
    write_env(tmp_path, {b"alpha": (PLAIN, [("put", b"a%d" % i, b"A%d" % i)
                                            for i in range(50)]),
                         b"beta": (PLAIN, [("put", b"b", b"B")]),
                         None: (PLAIN, [("put", b"main", b"M")])})
    for db in (b"alpha", "alpha"):
        with lmdbio.Reader(tmp_path, db=db, batch_size=8) as r:
            assert_epoch_equals(r, oracle(tmp_path, b"alpha"), 8)
    # the main DB holds the named DBs' records too, as py-lmdb walks it
    main = oracle(tmp_path)
    assert [k for k, _ in main] == [b"alpha", b"beta", b"main"]
    with lmdbio.Reader(tmp_path, batch_size=2) as r:
        assert_epoch_equals(r, main, 2)
    with pytest.raises(lmdbio.Error):
        lmdbio.Reader(tmp_path, db=b"gamma")
    with pytest.raises(lmdbio.Error):
        lmdbio.Reader(tmp_path, db=b"main")          # a plain key, not a DB
    assert not prefetch_threads(settle=5)


def test_subdir_false(tmp_path):
    path = tmp_path / "single.mdb"
    write_items(path, [(b"k%04d" % i, b"v" * (i % 50)) for i in range(700)],
                subdir=False)
    items = oracle(path, subdir=False)
    with lmdbio.Reader(path, subdir=False, batch_size=99) as r:
        assert_epoch_equals(r, items, 99)
    with pytest.raises(lmdbio.Error):
        lmdbio.Reader(path)  # subdir=True on a file


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(lmdbio.Error) as ei:
        lmdbio.Reader(missing)
    assert str(missing) in str(ei.value)


@pytest.mark.parametrize("how", ["never-written", "emptied", "empty-named"])
def test_empty_database(tmp_path, how):
    if how == "never-written":
        write_env(tmp_path, {None: (PLAIN, [])})
        db = None
    elif how == "emptied":
        ops = [("put", b"k%d" % i, b"v" * 5000) for i in range(30)]
        ops += [("del", b"k%d" % i, None) for i in range(30)]
        write_env(tmp_path, {None: (PLAIN, ops)}, txn_size=30)
        db = None
    else:
        write_env(tmp_path, {b"e": (PLAIN, []),
                             None: (PLAIN, [("put", b"x", b"y")])})
        db = b"e"
    assert oracle(tmp_path, db) == []
    for kw in ({}, {"shuffle": True}, {"rank": 1, "world_size": 3},
               {"drop_last": True, "rank": 2, "world_size": 3}):
        with lmdbio.Reader(tmp_path, db=db, batch_size=4, **kw) as r:
            assert len(r) == 0
            assert r.num_records == 0 and r.total_records == 0
            assert list(r) == []
            b = r.read([])
            assert len(b.indices) == 0 and b.indices.dtype == np.int64
            assert b.keys.offsets.tolist() == [0] == b.values.offsets.tolist()
            with pytest.raises(IndexError):
                r.read([0])


def test_batches_stay_valid_and_prefetch_budget(tmp_path):
    """A Batch owns its arrays: holding every batch of an epoch (prefetched
    far ahead or not at all) still gives the right bytes at the end."""
    items = [(b"%06d" % i, val_of(b"%d" % i, 5000 if i % 10 == 0 else 100))
             for i in range(600)]
    write_items(tmp_path, items)
    items = oracle(tmp_path)
    for pb in (1, 64 << 20):
        with lmdbio.Reader(tmp_path, batch_size=32, prefetch_bytes=pb) as r:
            held = list(r)
            gc.collect()
            got = [kv for b in held for kv in zip(b.keys.tolist(),
                                                  b.values.tolist())]
            assert got == items


def test_concurrent_reads_while_iterating(tmp_path):
    items = [(b"%05d" % i, val_of(b"%d" % i, 7000 if i % 13 == 0 else i % 200))
             for i in range(1500)]
    write_items(tmp_path, items)
    items = oracle(tmp_path)
    errors = []
    with lmdbio.Reader(tmp_path, batch_size=50, shuffle=True) as r:
        def hammer(seed):
            try:
                rng = np.random.default_rng(seed)
                for _ in range(40):
                    ix = rng.integers(0, len(items), 20)
                    b = r.read(ix)
                    assert list(zip(b.keys.tolist(), b.values.tolist())) == \
                        [items[i] for i in ix]
            except BaseException as e:  # reported below
                errors.append(e)
        ts = [threading.Thread(target=hammer, args=(s,)) for s in range(3)]
        for t in ts:
            t.start()
        idx, ks, vs, _ = collect(r)
        for t in ts:
            t.join(60)
        assert not any(t.is_alive() for t in ts)
    assert not errors, errors
    assert list(zip(ks, vs)) == [items[i] for i in idx]
    assert sorted(idx) == list(range(len(items)))


# ---------------------------------------------------------------------------
# the sharding rule


SHARD_NS = (0, 1, 2, 5, 12, 37, 64)


@pytest.fixture(scope="module")
def shard_envs(tmp_path_factory):
    """One database per record count N; record i's value is b"v<i>"."""
    envs = {}
    for n in SHARD_NS:
        path = tmp_path_factory.mktemp("shard%d" % n)
        write_items(path, [(b"k%05d" % i, b"v%d" % i) for i in range(n)])
        envs[n] = str(path)
    return envs


@settings(max_examples=120, deadline=None)
@given(n=st.sampled_from(SHARD_NS), p=st.integers(1, 6), bs=st.integers(1, 9),
       shuffle=st.booleans(), drop_last=st.booleans(),
       seed=st.one_of(st.integers(0, 3), st.integers(0, 2 ** 63)),
       epoch=st.integers(0, 4))
def test_sharding_rule(shard_envs, n, p, bs, shuffle, drop_last, seed, epoch):
    per_rank, lens = [], set()
    for rank in range(p):
        kw = dict(rank=rank, world_size=p, batch_size=bs, shuffle=shuffle,
                  seed=seed, drop_last=drop_last)
        with lmdbio.Reader(shard_envs[n], index_cache=False, **kw) as r:
            r.set_epoch(epoch)
            idx, ks, vs, sizes = collect(r)
            assert vs == [b"v%d" % i for i in idx]
            want = spec_shard(n, p, rank, shuffle, seed, epoch, drop_last, bs)
            assert idx == want
            assert r.num_records == len(want)
            assert r.total_records == n
            assert len(r) == len(sizes) == math.ceil(len(want) / bs)
            assert sizes == expected_sizes(len(want), bs)
            if drop_last:
                assert all(s == bs for s in sizes)
            lens.add((len(r), r.num_records))
            per_rank.append(idx)
    assert len(lens) == 1, "ranks disagree on the batch count: %r" % lens
    union = [i for idx in per_rank for i in idx]
    if drop_last:
        assert len(set(union)) == len(union)          # nobody reads twice
        assert len(union) == p * (n // p // bs * bs)
        assert set(union) <= set(range(n))
    elif n:
        per = -(-n // p)
        assert set(union) == set(range(n))            # everything is covered
        assert len(union) == p * per and len(union) - n <= p - 1
        if n >= p:                                    # padding: each at most twice
            assert np.bincount(union, minlength=n).max() <= 2


def test_shuffle_is_exactly_numpy_permutation(shard_envs):
    path = shard_envs[64]
    for seed, epoch in [(0, 0), (0, 1), (12345, 3), (2 ** 40 + 1, 7)]:
        with lmdbio.Reader(path, batch_size=10, shuffle=True, seed=seed,
                           index_cache=False) as r:
            r.set_epoch(epoch)
            got = collect(r)[0]
        assert got == np.random.default_rng([seed, epoch]).permutation(64).tolist()


def test_set_epoch_changes_order_only_when_shuffling(shard_envs):
    path = shard_envs[64]
    with lmdbio.Reader(path, batch_size=8, shuffle=True, seed=5,
                       index_cache=False) as r:
        e0 = collect(r)[0]
        assert collect(r)[0] == e0                    # same epoch, same order
        r.set_epoch(1)
        e1 = collect(r)[0]
        r.set_epoch(0)
        assert collect(r)[0] == e0
    assert e0 != e1 and sorted(e0) == sorted(e1) == list(range(64))
    with lmdbio.Reader(path, batch_size=8, index_cache=False) as r:
        a = collect(r)[0]
        r.set_epoch(3)
        assert collect(r)[0] == a == list(range(64))


def test_shuffle_depends_only_on_seed_epoch_n(tmp_path, shard_envs):
    """Another database with the same N (other keys, values, layout), other
    batch sizes: the same permutation."""
    other = tmp_path / "other"
    write_items(other, [(b"z%09d" % (i * 7), b"x" * (i * 97 % 6000))
                        for i in range(37)])
    orders = []
    for path, bs in [(shard_envs[37], 1), (shard_envs[37], 6), (str(other), 40)]:
        with lmdbio.Reader(path, batch_size=bs, shuffle=True, seed=9,
                           index_cache=False) as r:
            r.set_epoch(2)
            orders.append(collect(r)[0])
    assert orders[0] == orders[1] == orders[2] == \
        np.random.default_rng([9, 2]).permutation(37).tolist()


def test_bad_rank_world_size(shard_envs):
    for kw in ({"rank": 2, "world_size": 2}, {"rank": -1, "world_size": 2},
               {"rank": 0, "world_size": 0}):
        with pytest.raises((ValueError, lmdbio.Error)):
            lmdbio.Reader(shard_envs[5], **kw)


# ---------------------------------------------------------------------------
# random access and the Ragged / Batch API


@pytest.fixture(scope="module")
def mixed_env(tmp_path_factory):
    """Plain records with empty, small, large and overflow values."""
    path = tmp_path_factory.mktemp("mixed")
    sizes = [0, 1, 10, 300, 2000, 5000, 13000]
    write_items(path, [(b"key%04d" % i, val_of(b"%d" % i, sizes[i % 7]))
                       for i in range(400)])
    return str(path)


@pytest.fixture(scope="module")
def dup_env(tmp_path_factory):
    path = tmp_path_factory.mktemp("dups")
    _many_dups_env(path, DUPSORT)
    return str(path)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), which=st.sampled_from(["mixed", "dup"]))
def test_read_random_access(mixed_env, dup_env, data, which):
    path, db = (mixed_env, None) if which == "mixed" else (dup_env, b"d")
    items = oracle(path, db)
    n = len(items)
    ix = data.draw(st.lists(st.integers(0, n - 1), max_size=300))
    if ix and data.draw(st.booleans()):
        ix = ix + ix[::-1] + [ix[0]] * 3                 # repeats
    as_array = data.draw(st.booleans())
    with lmdbio.Reader(path, db=db, batch_size=7) as r:
        b = r.read(np.array(ix, dtype=np.int64) if as_array else ix)
        assert check_batch(b) == len(ix)
        assert b.indices.tolist() == ix
        assert list(zip(b.keys.tolist(), b.values.tolist())) == \
            [items[i] for i in ix]
        assert [b.values[i] for i in range(len(ix))] == [items[i][1] for i in ix]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), which=st.sampled_from(["mixed", "dup"]),
       keys=st.booleans(), start=st.sampled_from(["cached", "begun", "part"]))
def test_one_record_equals_read_of_one(mixed_env, dup_env, tmp_path_factory,
                                       data, which, keys, start):
    """Reader._record (a map-style dataset's item: bytes, no arrays)
    returns what read([i]) holds, over every kind of index a Reader may
    have when it is asked: cached, begun by a key-order open (counted up
    to the record by the read), or a shard's partial one (widened)."""
    path, db = (mixed_env, None) if which == "mixed" else (dup_env, b"d")
    items = oracle(path, db)
    n = len(items)
    ix = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=40))
    cache = str(tmp_path_factory.mktemp("ic"))
    kw = dict(db=db, keys=keys, index_cache=cache)
    if start == "cached":
        with lmdbio.Reader(path, shuffle=True, **kw):
            pass
    elif start == "part":
        kw.update(rank=3, world_size=4)
    with lmdbio.Reader(path, **kw) as r, \
            lmdbio.Reader(path, db=db, keys=keys, index_cache=False) as ref:
        for i in ix:
            b = ref.read([i])
            want = (b.keys[0] if keys else None, b.values[0])
            assert want == (items[i][0] if keys else None, items[i][1])
            got = r._record(i)
            assert got == want and all(type(x) is bytes for x in got if x
                                       is not None)
        for bad in (n, -1, 2 ** 62):
            with pytest.raises(IndexError):
                r._record(bad)


def test_one_record_of_several_environments_and_direct(mixed_env, dup_env,
                                                       tmp_path):
    """Several environments as one Reader go through read(); direct=True
    reads the record as read() does."""
    items = oracle(mixed_env)
    with lmdbio.Reader([mixed_env, mixed_env], index_cache=False) as r:
        for i in (0, 5, len(items) - 1, len(items), 2 * len(items) - 1):
            assert r._record(i) == items[i % len(items)]
    base = _o_direct_base(tmp_path)
    try:
        path = os.path.join(base, "db")
        shutil.copytree(mixed_env, path)
        with lmdbio.Reader(path, direct=True, index_cache=False) as r:
            for i in (0, 6, 13, len(items) - 1):
                assert r._record(i) == items[i]
    finally:
        shutil.rmtree(base)


def test_one_record_raises_what_read_raises(tmp_path):
    """A damaged record's leaf raises the same error through _record as
    through read(), and lock=False sees a writer two commits on."""
    path = str(tmp_path / "db")
    items = [(b"k%05d" % i, val_of(b"%d" % i, 700)) for i in range(300)]
    write_items(path, items)
    with lmdbio.Reader(path, index_cache=False, lock=False) as r:
        assert r._record(7) == items[7]
        wenv = lmdb.open(path, map_size=64 << 20)
        for j in range(2):
            with wenv.begin(write=True) as w:
                w.put(b"z%05d" % j, b"new")
        wenv.close()
        with pytest.raises(lmdbio.SnapshotChangedError):
            r._record(7)
        with pytest.raises(lmdbio.SnapshotChangedError):
            r.read([7])
    path2 = str(tmp_path / "db2")
    write_items(path2, items)
    with lmdbio.Reader(path2, index_cache=False) as r:
        leaf = r._file.index_leaves()[0]
    patch_page_header(data_file(path2), int(leaf), OS_PAGE_SIZE, flags=0x7)
    errors = []
    for how in ("read", "record"):
        with lmdbio.Reader(path2, index_cache=False) as r:
            with pytest.raises(lmdbio.Error) as ei:
                r.read([0]) if how == "read" else r._record(0)
            errors.append((type(ei.value), str(ei.value)))
    assert errors[0] == errors[1]


def test_read_out_of_range(mixed_env):
    with lmdbio.Reader(mixed_env) as r:
        n = r.total_records
        assert n == 400
        for bad in ([n], [-1], [0, 1, n + 10], [2 ** 62]):
            with pytest.raises(IndexError):
                r.read(bad)
        # the reader still works after a rejected request
        assert r.read([n - 1, 0]).indices.tolist() == [n - 1, 0]


def test_read_same_overflow_value_many_times(mixed_env):
    items = oracle(mixed_env)
    big = [i for i, (_, v) in enumerate(items) if len(v) >= 5000]
    ix = [big[0], big[1], big[0], big[0], big[2], big[1]]
    with lmdbio.Reader(mixed_env) as r:
        b = r.read(ix)
        assert b.values.tolist() == [items[i][1] for i in ix]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_ragged_tolist_is_slicing(data):
    """Ragged.tolist's C path (one copy an item) returns what slicing the
    data's bytes at the offsets returns, for any arrays: offsets out of
    order or past the data, other dtypes, strided data (the slicing path
    answers those)."""
    raw = data.draw(st.binary(max_size=64))
    offs = data.draw(st.lists(st.integers(-3, len(raw) + 3), max_size=12))
    arr = np.frombuffer(raw, dtype=np.uint8)
    kind = data.draw(st.sampled_from(["plain", "strided", "int32", "sorted"]))
    if kind == "sorted":
        offs = sorted(max(0, min(o, len(raw))) for o in offs)
    offsets = np.array(offs, dtype=np.int32 if kind == "int32" else np.int64)
    if kind == "strided":
        arr = np.frombuffer(raw + raw, dtype=np.uint8)[::2]
    flat = arr.tobytes()
    want = [flat[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
    got = lmdbio.Ragged(arr, offsets).tolist()
    assert got == want and all(type(x) is bytes for x in got)


def test_ragged_api(mixed_env):
    items = oracle(mixed_env)
    with lmdbio.Reader(mixed_env) as r:
        b = r.read([3, 0, 6, 1])
        v = b.values
        assert isinstance(v, lmdbio.Ragged) and isinstance(b, lmdbio.Batch)
        assert len(v) == 4 and len(b.keys) == 4
        want = [items[i][1] for i in [3, 0, 6, 1]]
        assert [bytes(v[i]) for i in range(4)] == want
        assert bytes(v[-1]) == want[-1] and bytes(v[-4]) == want[0]
        for bad in (4, -5):
            with pytest.raises(IndexError):
                v[bad]
        assert v.tolist() == want
        assert all(isinstance(x, bytes) for x in v.tolist())
        assert v.data.tobytes() == b"".join(want)
        assert v.offsets.tolist() == [0] + list(np.cumsum([len(w) for w in want]))
        with pytest.raises(ValueError):
            v.fixed()                                       # lengths differ
        keys = b.keys                                       # all 7 bytes
        fx = keys.fixed()
        assert fx.shape == (4, 7) and fx.dtype == np.uint8
        assert [bytes(row) for row in fx] == [items[i][0] for i in [3, 0, 6, 1]]
        assert np.shares_memory(fx, keys.data)              # a view, no copy
        # equal (zero) lengths: a (n, 0) view
        e = r.read([0, 7, 14]).values                       # three empty values
        assert e.tolist() == [b"", b"", b""]
        assert e.fixed().shape == (3, 0)
        empty = r.read([])
        assert len(empty.values) == 0 and empty.values.tolist() == []
        assert empty.indices.dtype == np.int64


def test_batch_owns_its_indices(shard_envs):
    """A Batch owns its arrays (docs/reader.md): changing one in place affects
    neither the caller's input nor the reader's later epochs."""
    path = shard_envs[37]
    with lmdbio.Reader(path, batch_size=5, shuffle=True, seed=3,
                       index_cache=False) as r:
        want = np.random.default_rng([3, 0]).permutation(37).tolist()
        for b in r:
            b.indices[:] = 0                        # user code, e.g. +=
            b.values.offsets[:] = 0
        idx, ks, vs, _ = collect(r)                 # the same epoch again
        assert idx == want
        assert vs == [b"v%d" % i for i in want]
        ix = np.array([4, 5, 6], dtype=np.int64)
        b = r.read(ix)
        ix[:] = 9
        assert b.indices.tolist() == [4, 5, 6]
        assert b.values.tolist() == [b"v4", b"v5", b"v6"]


def test_two_iterators_interleaved(shard_envs):
    with lmdbio.Reader(shard_envs[64], batch_size=6, shuffle=True,
                       index_cache=False) as r:
        pairs = list(zip(iter(r), iter(r)))
        assert len(pairs) == len(r)
        for a, b in pairs:
            assert a.indices.tolist() == b.indices.tolist()
            assert a.values.tolist() == b.values.tolist() == \
                [b"v%d" % i for i in a.indices]
    assert not settle(10 ** 6)[0]


FORK_SCRIPT = r"""
import os, signal, sys
import lmdbio
r = lmdbio.Reader(sys.argv[1], batch_size=64, index_cache=False)
r.read([0, 1500, 2999])                 # the parent used it before forking
pid = os.fork()
if pid == 0:
    signal.alarm(8)
    try:
        b = r.read(list(range(0, 3000, 7)))
        ok = b.keys.tolist() == [b"k%05d" % i for i in range(0, 3000, 7)]
        n = sum(len(x) for x in r)
        os._exit(0 if ok and n == 3000 else 3)
    except BaseException as e:
        sys.stderr.write("child: %r" % (e,))
        os._exit(4)
_, status = os.waitpid(pid, 0)
print(status)
r.close()
"""


def test_forked_child_can_read(tmp_path):
    """A map-style dataset holding a Reader is forked into DataLoader
    workers (fork is the default start method on Linux): reading in the
    child must work, not wait forever for I/O threads that did not survive
    the fork."""
    write_items(tmp_path, [(b"k%05d" % i, b"v" * (6000 if i % 3 == 0 else 100))
                           for i in range(3000)])
    proc = run_py(FORK_SCRIPT, tmp_path, timeout=90)
    assert proc.returncode == 0, proc.stderr
    status = int(proc.stdout.split()[-1])
    assert os.WIFEXITED(status), "child killed by signal %d (hang: SIGALRM=14)" \
        % os.WTERMSIG(status)
    assert os.WEXITSTATUS(status) == 0, proc.stderr


def test_reads_leave_the_access_time_alone(tmp_path):
    """The data file is opened with O_NOATIME where the reader owns it: a
    read otherwise makes the kernel check (and, past a day, update) the
    file's access time, a cost on every read of a shuffled epoch."""
    write_items(tmp_path, [(b"k%05d" % i, b"v" * 300) for i in range(2000)])
    data = data_file(tmp_path)
    old = 1_000_000_000     # 2001: "relatime" updates anything that old
    st = os.stat(data)
    os.utime(data, (old, st.st_mtime))
    with open(data, "rb") as f:   # does a plain read update it here?
        f.read(4096)
    if os.stat(data).st_atime == old:
        pytest.skip("this filesystem does not update access times on reads")
    os.utime(data, (old, st.st_mtime))
    with lmdbio.Reader(str(tmp_path), batch_size=100, index_cache=False,
                       shuffle=True) as r:
        assert sum(len(b) for b in r) == 2000
    env = lmdbio.open(str(tmp_path), readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"k00042") == b"v" * 300
    env.close()
    assert os.stat(data).st_atime == old


FORK_MID_EPOCH_SCRIPT = r"""
import os, signal, sys
import lmdbio
shuffle, trials = sys.argv[2] == "1", int(sys.argv[3])
for trial in range(trials):
    r = lmdbio.Reader(sys.argv[1], batch_size=16, index_cache=False,
                      shuffle=shuffle, prefetch_bytes=64 << 10)
    it = iter(r)
    seen = [next(it) for _ in range(2 + trial)]
    while not r.window_stats["pipeline_windows"]:   # the C lanes read ahead
        seen.append(next(it))      # (past a first window read in this thread)
    pid = os.fork()
    if pid == 0:
        signal.alarm(8)
        try:
            try:
                for _ in it:               # the window in hand, then the
                    pass                   # parent's epoch: its lanes
                os._exit(5)                # stayed in the parent
            except lmdbio.Error as e:
                if "forked" not in str(e):
                    raise
            before = r.window_stats["pipeline_windows"]
            n = sum(len(x) for x in r)     # a new epoch works here,
            if r.window_stats["pipeline_windows"] == before:
                os._exit(6)                # with C lanes of its own
            os._exit(0 if n == 3000 else 3)
        except BaseException as e:
            sys.stderr.write("child: %r" % (e,))
            os._exit(4)
    n = sum(len(b) for b in seen) + sum(len(b) for b in it)
    _, status = os.waitpid(pid, 0)
    print(n, status)
    if n != 3000 or status:
        break
    r.close()
"""


@pytest.mark.parametrize("shuffle", [True, False])
def test_forked_child_mid_epoch_is_told_and_can_start_anew(tmp_path, shuffle):
    """A process forks while a Reader's epoch is read ahead by C lanes:
    the child continuing that epoch gets, past the batches of the window it
    holds, a clear error (the lanes stayed in the parent) instead of waiting
    forever, a new epoch works there,
    and the parent's epoch is whole (its lanes are stopped before the fork
    and started again after).  In key order the lanes count the index as
    they read: forks at several points of the epoch."""
    write_items(tmp_path, [(b"k%05d" % i, b"v" * 300) for i in range(3000)])
    trials = 1 if shuffle else 12
    proc = run_py(FORK_MID_EPOCH_SCRIPT, tmp_path, int(shuffle), trials,
                  timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")[:-1]
    assert len(lines) == trials, (proc.stdout, proc.stderr)
    for line in lines:
        n, status = map(int, line.split())
        assert n == 3000
        assert os.WIFEXITED(status), "child killed by signal %d (hang: " \
            "SIGALRM=14)" % os.WTERMSIG(status)
        assert os.WEXITSTATUS(status) == 0, proc.stderr


FORK_LANES_SCRIPT = r"""
import os, signal, sys, threading, time
import lmdbio
from lmdbio.datum import prefetched
paths, totals = sys.argv[1:4], [int(x) for x in sys.argv[4:7]]


def child(fn):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        try:
            code = fn()
        except BaseException as e:
            sys.stderr.write("child: %r\n" % (e,))
            code = 4
        os._exit(code)
    return os.waitpid(pid, 0)[1]


def forked(e):
    if "forked" not in str(e):
        raise e


# several environments (Python lanes): the child going on with the epoch
# it inherited is told so, and a new epoch works there
r = lmdbio.Reader(paths, batch_size=64, shuffle=True, index_cache=False,
                  prefetch_bytes=1 << 20)
it = iter(r)
seen = [len(next(it)) for _ in range(5)]


def go_on():
    try:
        sum(len(b) for b in it)
        return 5
    except lmdbio.Error as e:
        forked(e)
    r.set_epoch(7)
    return 0 if sum(len(b) for b in r) == sum(totals) else 3


print("several", child(go_on), sum(seen) + sum(len(b) for b in it))

# a decoding thread (prefetched) left in the parent
items = prefetched(lambda: (time.sleep(0.02) or i for i in range(200)), 2,
                   "lmdbio-test")
got = [next(items) for _ in range(3)]


def go_on_decoding():
    try:
        next(items)
        return 5
    except lmdbio.Error as e:
        forked(e)
    return 0


print("prefetched", child(go_on_decoding), len(got) + sum(1 for _ in items))

# forks from another thread while this one reads epoch after epoch: each
# child's own epoch is whole
r2 = lmdbio.Reader(paths[0], batch_size=16, index_cache=False,
                   prefetch_bytes=64 << 10)
statuses = []


def forker():
    for _ in range(10):
        time.sleep(0.01)
        statuses.append(child(
            lambda: 0 if sum(len(b) for b in r2) == totals[0] else 3))


t = threading.Thread(target=forker)
t.start()
epochs = 0
while t.is_alive() or not epochs:
    assert sum(len(b) for b in r2) == totals[0]
    epochs += 1
t.join()
print("thread", max(statuses), epochs)
"""


def test_forked_child_never_waits_for_threads_left_in_the_parent(tmp_path):
    """A fork while prefetch threads run: over several environments (Python
    lanes) the child going on with the inherited epoch gets lmdbio.Error
    (it waited forever), a new epoch works there (the lanes' locks could be
    copied held); a DatumReader's decoding thread likewise; forks from a
    second thread while the first reads (a held lane lock hung 1 child in
    60) give children whose own epochs are whole.  The parent's epochs
    stay whole throughout."""
    paths, totals = [], []
    for i, n in enumerate((3000, 1200, 800)):
        path = tmp_path / ("p%d" % i)
        write_items(path, [(b"k%05d" % j, b"v" * (200 + 100 * i))
                           for j in range(n)])
        paths.append(path)
        totals.append(n)
    proc = run_py(FORK_LANES_SCRIPT, *paths, *totals, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = {line.split()[0]: list(map(int, line.split()[1:]))
           for line in proc.stdout.splitlines()}
    assert out["several"] == [0, sum(totals)], proc.stderr
    assert out["prefetched"] == [0, 200], proc.stderr
    assert out["thread"][0] == 0 and out["thread"][1] >= 1, proc.stderr


def test_len_num_records_total_records(shard_envs):
    with lmdbio.Reader(shard_envs[37], batch_size=5, rank=2, world_size=4) as r:
        assert r.total_records == 37
        assert r.num_records == 10                          # ceil(37/4)
        assert len(r) == 2
    with lmdbio.Reader(shard_envs[37], batch_size=4, rank=3, world_size=4,
                       drop_last=True) as r:
        assert r.total_records == 37
        assert r.num_records == 8                           # 9 -> 2 whole batches
        assert len(r) == 2


# ---------------------------------------------------------------------------
# the index cache


def cache_files(d):
    return sorted(glob.glob(os.path.join(str(d), "**", "*"), recursive=True))


def listing(path):
    return sorted(os.listdir(path))


@pytest.fixture
def cache_env(tmp_path):
    path = tmp_path / "env"
    write_items(path, [(b"k%06d" % i, b"x" * (40 + i % 9)) for i in range(3000)])
    return path


def epoch_items(r):
    idx, ks, vs, _ = collect(r)
    assert idx == list(range(len(idx)))
    return list(zip(ks, vs))


def test_cache_default_xdg(tmp_path, cache_env):
    xdg = tmp_path / "xdg-cache"
    before = listing(cache_env)
    items = oracle(cache_env)
    with lmdbio.Reader(cache_env, batch_size=500) as r:
        assert r.index_from_cache is False
        assert epoch_items(r) == items
    written = cache_files(xdg / "lmdbio")
    assert written, "index_cache=True wrote nothing under $XDG_CACHE_HOME/lmdbio"
    assert all(f.startswith(str(xdg / "lmdbio")) for f in cache_files(xdg))
    with lmdbio.Reader(cache_env, batch_size=500) as r:
        assert r.index_from_cache is True
        assert epoch_items(r) == items
    assert listing(cache_env) == before              # never beside the data


def test_cache_home_fallback(tmp_path, cache_env, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with lmdbio.Reader(cache_env) as r:
        r.read([0])
    assert cache_files(tmp_path / "home" / ".cache" / "lmdbio")


def test_cache_explicit_dir_and_false(tmp_path, cache_env):
    xdg = tmp_path / "xdg-cache"
    mine = tmp_path / "my" / "cache"                 # does not exist yet
    before = listing(cache_env)
    items = oracle(cache_env)
    with lmdbio.Reader(cache_env, index_cache=str(mine)) as r:
        assert epoch_items(r) == items
    assert cache_files(mine)
    with lmdbio.Reader(cache_env, index_cache=mine) as r:   # a Path works too
        assert r.index_from_cache is True
        assert epoch_items(r) == items
    with lmdbio.Reader(cache_env, index_cache=False) as r:
        assert r.index_from_cache is False
        assert epoch_items(r) == items
    assert not os.path.exists(xdg)                   # False and path: no XDG
    assert listing(cache_env) == before


def test_cache_subdir_false_never_beside_data(tmp_path):
    parent = tmp_path / "data"
    parent.mkdir()
    path = parent / "one.mdb"
    write_items(path, [(b"%d" % i, b"v") for i in range(100)], subdir=False)
    before = listing(parent)
    for _ in range(2):
        with lmdbio.Reader(path, subdir=False) as r:
            assert epoch_items(r) == oracle(path, subdir=False)
    assert listing(parent) == before
    assert cache_files(tmp_path / "xdg-cache" / "lmdbio")


def test_cache_other_snapshot_not_used(tmp_path, cache_env):
    with lmdbio.Reader(cache_env) as r:
        r.read([0])
    env = lmdb.open(str(cache_env), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for i in range(3000, 4000):
            txn.put(b"k%06d" % i, b"new" * 20)
        txn.delete(b"k000005")
    env.close()
    items = oracle(cache_env)
    assert len(items) == 3999
    with lmdbio.Reader(cache_env, batch_size=1000) as r:
        assert r.index_from_cache is False
        assert r.total_records == 3999
        assert epoch_items(r) == items
    with lmdbio.Reader(cache_env, batch_size=1000) as r:
        assert r.index_from_cache is True
        assert epoch_items(r) == items


def test_cache_per_database(tmp_path):
    write_env(tmp_path, {b"a": (PLAIN, [("put", b"%04d" % i, b"a") for i in range(900)]),
                         b"b": (PLAIN, [("put", b"%04d" % i, b"bb" * 30) for i in range(500)])})
    for rnd in range(2):
        for name in (b"a", b"b"):
            with lmdbio.Reader(tmp_path, db=name) as r:
                assert r.index_from_cache is bool(rnd)
                assert epoch_items(r) == oracle(tmp_path, name)
    assert len(cache_files(tmp_path / "xdg-cache" / "lmdbio")) == 2


def test_cache_dir_unusable_still_reads(tmp_path, cache_env):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a directory")
    with lmdbio.Reader(cache_env, index_cache=blocker / "sub") as r:
        assert epoch_items(r) == oracle(cache_env)


def test_cache_file_replaced_in_place(tmp_path):
    """`cp new/data.mdb old/data.mdb` keeps the inode; the new file has the
    same txnid, root page and record count as the old one, but other
    leaves.  The old cache must not be used (or not trusted)."""
    old, new = tmp_path / "old", tmp_path / "new"
    write_items(old, [(b"k%06d" % i, b"a" * 60) for i in range(2000)])
    write_items(new, [(b"k%06d" % i, b"b" * 100) for i in range(2000)])
    with lmdbio.Reader(old) as r:
        assert epoch_items(r) == oracle(old)
    ino = os.stat(old / "data.mdb").st_ino
    shutil.copyfile(new / "data.mdb", old / "data.mdb")
    assert os.stat(old / "data.mdb").st_ino == ino
    with lmdbio.Reader(old, batch_size=700) as r:
        assert epoch_items(r) == oracle(new)


def _bitflip(raw, fractions=(0.55, 0.7, 0.85)):
    data = bytearray(raw)
    for fr in fractions:
        data[int(len(data) * fr)] ^= 0x01
    return bytes(data)


def _swap_leaves(path, env):
    """Swap, in the cache file, the page numbers of two leaves holding the
    same number of records: a cache that still looks consistent.  Works on
    any numpy-saved integer layout holding leaf page numbers; a bit flip
    otherwise."""
    raw = open(path, "rb").read()
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception:
        return _bitflip(raw)
    leaves = sorted(LmdbFile(env).leaves(), key=lambda p: p.nodes[0].key)
    flat = arr.reshape(-1)
    once = [p for p in leaves if np.count_nonzero(flat == p.pgno) == 1]
    for i, a in enumerate(once):
        for b in once[i + 1:]:
            if len(a.nodes) == len(b.nodes):
                ia = int(np.flatnonzero(flat == a.pgno)[0])
                ib = int(np.flatnonzero(flat == b.pgno)[0])
                flat[ia], flat[ib] = flat[ib], flat[ia]
                with open(path, "wb") as f:
                    np.save(f, arr, allow_pickle=False)
                return None
    return _bitflip(raw)


def _corrupt_cache(kind, path, env):
    raw = open(path, "rb").read()
    if kind == "empty":
        data = b""
    elif kind == "truncated":
        data = raw[:len(raw) // 2]
    elif kind == "garbage":
        data = bytes((i * 37 + 11) % 256 for i in range(len(raw)))
    elif kind == "header-only":
        data = raw[:128]
    elif kind == "bitflips":
        data = _bitflip(raw)
    elif kind == "swapped-leaves":
        data = _swap_leaves(path, env)
        if data is None:
            return
    else:
        raise ValueError(kind)
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("kind", ["empty", "truncated", "garbage",
                                  "header-only", "bitflips",
                                  "swapped-leaves"])
def test_cache_corrupted_is_ignored(tmp_path, cache_env, kind):
    """The cache layout is the implementation's (reader.py); whatever is
    broken in it, results stay right."""
    cdir = tmp_path / "c"
    items = oracle(cache_env)
    with lmdbio.Reader(cache_env, index_cache=cdir) as r:
        assert epoch_items(r) == items
    files = cache_files(cdir)
    assert len(files) == 1
    _corrupt_cache(kind, files[0], cache_env)
    with lmdbio.Reader(cache_env, index_cache=cdir, batch_size=333) as r:
        assert epoch_items(r) == items
        assert r.read([2999, 0, 1500]).keys.tolist() == \
            [items[2999][0], items[0][0], items[1500][0]]
    # rebuilt: the next reader finds a good cache again
    with lmdbio.Reader(cache_env, index_cache=cdir) as r:
        assert epoch_items(r) == items


# ---------------------------------------------------------------------------
# direct=True (O_DIRECT)


def _accepts_o_direct(d):
    try:
        fd, p = tempfile.mkstemp(dir=d)
    except OSError:
        return False
    try:
        os.write(fd, b"\0" * 8192)
        os.close(fd)
        try:
            fd2 = os.open(p, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            return False
        os.close(fd2)
        return True
    finally:
        os.unlink(p)


def _o_direct_base(tmp_path, block_device=False):
    """A new directory on a filesystem that accepts O_DIRECT (the caller
    removes it), on a block device if asked; skips the test where none is
    available."""
    dirs = [str(tmp_path), "/var/tmp", "/dev/shm", "/tmp"]
    usable = [d for d in dirs if os.path.isdir(d) and _accepts_o_direct(d)
              and (not block_device or os.major(os.stat(d).st_dev) != 0)]
    if not usable:
        pytest.skip("no filesystem available to the test accepts O_DIRECT%s "
                    "(tried %s)" % (" on a block device" if block_device
                                    else "", ", ".join(dirs)))
    return tempfile.mkdtemp(dir=usable[0])


def test_direct_equals(tmp_path):
    base = _o_direct_base(tmp_path)
    try:
        plain = os.path.join(base, "plain")
        sizes = [0, 3, 700, 4096 - 16, 4097, 20000]
        write_items(plain, [(b"k%05d" % i, val_of(b"%d" % i, sizes[i % 6]))
                            for i in range(500)])
        dups = os.path.join(base, "dups")
        _many_dups_env(dups, DUPSORT)
        for path, db in ((plain, None), (dups, b"d")):
            items = oracle(path, db)
            for bs in (1, 100):
                with lmdbio.Reader(path, db=db, direct=True, batch_size=bs,
                                   index_cache=False) as r:
                    assert_epoch_equals(r, items, bs)
            with lmdbio.Reader(path, db=db, direct=True, shuffle=True) as r:
                ix = [len(items) - 1, 0, 3, 3, len(items) // 2]
                b = r.read(ix)
                assert list(zip(b.keys.tolist(), b.values.tolist())) == \
                    [items[i] for i in ix]
    finally:
        shutil.rmtree(base)


def _read_bytes():
    """Bytes this process has had read from storage (/proc/self/io)."""
    with open("/proc/self/io") as f:
        return dict(ln.split(": ") for ln in f.read().splitlines()
                    )["read_bytes"]


def test_direct_meta_checks_read_through_the_os_cache(tmp_path):
    """Without a reader slot the Reader re-reads both meta pages after
    every window (to see a writer's commits).  With O_DIRECT those reads
    go through the OS cache: the storage sees the windows' own reads and
    a few pages of the open, not two more pages a window; and the check
    still sees a writer's commits."""
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io to count the bytes read from storage")
    # (a filesystem without a device, tmpfs, counts no bytes read)
    base = _o_direct_base(tmp_path, block_device=True)
    try:
        path = os.path.join(base, "env")
        items = [(b"k%05d" % i, val_of(b"%d" % i, 300)) for i in range(3000)]
        write_items(path, items)
        cdir = os.path.join(base, "cache")
        with lmdbio.Reader(path, direct=True, lock=False,
                           index_cache=cdir) as r:
            assert_epoch_equals(r, items, r.batch_size)  # (index cached)
        with lmdbio.Reader(path, direct=True, lock=False, batch_size=10,
                           prefetch_bytes=64 << 10, index_cache=cdir) as r:
            assert r.index_from_cache
            before = int(_read_bytes())
            assert_epoch_equals(r, items, 10)
            read = int(_read_bytes()) - before
            _, window_bytes = r._file.stats()
            windows = r.window_stats["windows"]
        assert windows >= 50, r.window_stats
        # two 4 KiB meta pages a window from storage would be 8 KiB x
        # windows (>= 400 KiB) more; the margin is for code pages the
        # process may fault in meanwhile
        assert window_bytes <= read <= window_bytes + (256 << 10), \
            (read, window_bytes, windows)
        # the check still sees commits: two past the snapshot raise
        r = lmdbio.Reader(path, direct=True, lock=False, batch_size=10,
                          prefetch_bytes=64 << 10, index_cache=cdir)
        try:
            batches = iter(r)
            next(batches)
            wenv = lmdb.open(path, map_size=64 << 20)
            for j in range(2):
                with wenv.begin(write=True) as w:
                    w.put(b"k%05d" % j, b"new")
            wenv.close()
            with pytest.raises(lmdbio.SnapshotChangedError) as ei:
                for _ in batches:
                    pass
            assert ei.value.newest == ei.value.txnid + 2
        finally:
            r.close()
    finally:
        shutil.rmtree(base)


def test_direct_refused_is_a_clear_error(tmp_path):
    """tmpfs refused O_DIRECT before Linux 6.6; newer kernels accept it.
    Failing that, procfs (or sysfs) refuses it: data.mdb is made a symlink
    to a file there (what is read does not matter: opening fails first)."""
    target = None
    if os.path.isdir("/dev/shm") and not _accepts_o_direct("/dev/shm"):
        base = tempfile.mkdtemp(dir="/dev/shm")
        try:
            write_items(base, [(b"a", b"b")])
            _expect_direct_error(base, os.path.join(base, "data.mdb"))
        finally:
            shutil.rmtree(base)
        return
    for cand in ("/proc/version", "/proc/self/cmdline",
                 "/sys/kernel/mm/transparent_hugepage/enabled"):
        try:
            fd = os.open(cand, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            if os.path.exists(cand):
                target = cand
                break
        else:
            os.close(fd)
    if target is None:
        pytest.skip("no filesystem available to the test refuses O_DIRECT "
                    "(tmpfs accepts it on Linux >= 6.6; no procfs/sysfs)")
    env = tmp_path / "env"
    env.mkdir()
    os.symlink(target, env / "data.mdb")
    _expect_direct_error(env, str(env / "data.mdb"))


def _expect_direct_error(path, data_path):
    with pytest.raises(lmdbio.Error) as ei:
        lmdbio.Reader(path, direct=True, index_cache=False)
    msg = str(ei.value)
    assert "O_DIRECT" in msg
    assert data_path in msg or str(path) in msg
    assert not prefetch_threads(settle=5)


# ---------------------------------------------------------------------------
# lock=True: a reader slot pins the snapshot against a live writer


LOCK_WRITER = r"""
import sys, lmdb
path, rounds = sys.argv[1], int(sys.argv[2])
env = lmdb.open(path, map_size=64 << 20)
print(env.readers().replace("\n", "|"))
for g in range(rounds):
    with env.begin(write=True) as txn:
        for i in range(400):
            k = b"k%04d" % i
            if (i + g) % 3 == 0:
                txn.delete(k)
            else:
                txn.put(k, (b"%d:%d;" % (g, i)) * (600 if i % 40 == 0 else 20))
print(env.info()["last_txnid"])
env.close()
"""


def _lock_env(path):
    env = lmdb.open(str(path), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for i in range(400):
            txn.put(b"k%04d" % i, (b"base%d;" % i) * (700 if i % 40 == 0 else 15))
    env.close()


def _reader_rows(text):
    rows = []
    for line in text.split("|"):
        f = line.split()
        if len(f) == 3 and f[0].isdigit():
            rows.append((int(f[0]), f[2]))
    return rows


def test_lock_true_pins_snapshot(tmp_path):
    path = tmp_path / "env"
    _lock_env(path)
    snap = oracle(path)
    r = lmdbio.Reader(path, lock=True, batch_size=37, index_cache=False)
    try:
        txnid = LmdbFile(path).meta.txnid
        proc = run_py(LOCK_WRITER, path, 30)
        assert proc.returncode == 0, proc.stderr
        readers, last = proc.stdout.splitlines()
        assert (os.getpid(), str(txnid)) in _reader_rows(readers), readers
        assert int(last) == txnid + 30
        assert oracle(path) != snap                   # the writer moved on
        assert r.total_records == len(snap)
        assert epoch_items(r) == snap
        b = r.read([len(snap) - 1, 0])
        assert b.values.tolist() == [snap[-1][1], snap[0][1]]
    finally:
        r.close()
    # the slot is released on close
    proc = run_py("import sys, lmdb; e = lmdb.open(sys.argv[1], readonly=True);"
                  "print(e.readers().replace('\\n', '|'))", path)
    assert proc.returncode == 0, proc.stderr
    assert os.getpid() not in [pid for pid, _ in _reader_rows(proc.stdout)]


def test_lock_false_is_not_pinned(tmp_path):
    """Control for the test above: without the slot the writer recycles the
    snapshot's pages, so the same scenario does not read the old snapshot."""
    path = tmp_path / "env"
    _lock_env(path)
    snap = oracle(path)
    with lmdbio.Reader(path, lock=False, batch_size=37, index_cache=False) as r:
        proc = run_py(LOCK_WRITER, path, 30)
        assert proc.returncode == 0, proc.stderr
        assert os.getpid() not in [p for p, _ in _reader_rows(proc.stdout.splitlines()[0])]
        try:
            same = epoch_items(r) == snap
        except lmdbio.Error:
            same = False
    assert not same


def test_lock_true_subdir_false(tmp_path):
    path = tmp_path / "one.mdb"
    write_items(path, [(b"%03d" % i, b"v%d" % i) for i in range(300)], subdir=False)
    with lmdbio.Reader(path, subdir=False, lock=True, batch_size=64) as r:
        assert epoch_items(r) == oracle(path, subdir=False)


# ---------------------------------------------------------------------------
# early close, lifetime, threads


NO_UNRAISABLE = pytest.mark.filterwarnings(
    "error::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def big_env(tmp_path):
    path = tmp_path / "big"
    write_items(path, [(b"k%06d" % i, val_of(b"%d" % i, 6000 if i % 25 == 0 else 80))
                       for i in range(4000)])
    return path


@NO_UNRAISABLE
def test_break_midway(big_env):
    base = os_threads()
    items = oracle(big_env)
    r = lmdbio.Reader(big_env, batch_size=16)
    for i, b in enumerate(r):
        if i == 3:
            break
    pf, _ = settle(base + 100)
    assert not pf, "prefetch thread left running after break"
    assert epoch_items(r) == items                   # the reader still works
    r.close()
    pf, n = settle(base)
    assert not pf and n <= base


def test_exception_in_loop_body_stops_prefetch(big_env):
    r = lmdbio.Reader(big_env, batch_size=16)
    with pytest.raises(KeyError):
        for i, b in enumerate(r):
            if i == 2:
                raise KeyError("user code")
    assert not settle(10 ** 6)[0]
    r.close()


@NO_UNRAISABLE
def test_close_mid_epoch(big_env):
    base = os_threads()
    r = lmdbio.Reader(big_env, batch_size=16)
    it = iter(r)
    next(it)
    next(it)
    assert prefetch_threads()
    r.close()
    pf, n = settle(base)
    assert not pf and n <= base, (pf, n, base)
    with pytest.raises(lmdbio.Error):
        for _ in it:          # the epoch in progress ends with lmdbio.Error
            pass
    with pytest.raises(lmdbio.Error):
        r.read([0])
    with pytest.raises(lmdbio.Error):
        next(iter(r))
    r.close()                 # twice is fine
    assert not prefetch_threads(settle=5)


def test_close_mid_epoch_next_raises_error_immediately(big_env):
    """After close(), the suspended iterator does not hand out more batches
    (they were prefetched from a reader the user has closed)."""
    r = lmdbio.Reader(big_env, batch_size=16)
    it = iter(r)
    next(it)
    r.close()
    with pytest.raises(lmdbio.Error):
        next(it)


@NO_UNRAISABLE
def test_with_block_exit_mid_epoch(big_env):
    base = os_threads()
    with lmdbio.Reader(big_env, batch_size=16) as r:
        it = iter(r)
        next(it)
    pf, n = settle(base)
    assert not pf and n <= base
    with pytest.raises(lmdbio.Error):
        r.read([1])
    del it          # finalising the suspended epoch raises nothing either
    gc.collect()


@NO_UNRAISABLE
def test_with_block_exit_then_drop_iterator(big_env):
    with lmdbio.Reader(big_env, batch_size=16) as r:
        it = iter(r)
        next(it)
    del it
    gc.collect()
    assert not prefetch_threads(settle=5)


def test_close_from_another_thread(big_env):
    """The consumer is blocked or busy in another thread; close() must not
    hang and the consumer ends (normally or with lmdbio.Error)."""
    r = lmdbio.Reader(big_env, batch_size=8, prefetch_bytes=1)
    seen, outcome = [], []
    started = threading.Event()

    def consume():
        try:
            for b in r:
                seen.append(len(b))
                started.set()
                time.sleep(0.001)
            outcome.append("done")
        except lmdbio.Error:
            outcome.append("error")
        except BaseException as e:  # anything else is a failure
            outcome.append(e)

    t = threading.Thread(target=consume)
    t.start()
    assert started.wait(30)
    closer = threading.Thread(target=r.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "close() hangs"
    t.join(30)
    assert not t.is_alive(), "consumer hangs after close()"
    assert outcome in (["done"], ["error"]), outcome
    assert not settle(10 ** 6)[0]


@NO_UNRAISABLE
def test_dropping_the_reader(big_env):
    base = os_threads()
    r = lmdbio.Reader(big_env, batch_size=16)
    it = iter(r)
    next(it)              # the first batch is read without a thread
    next(it)              # the second starts the prefetch lanes
    assert os_threads() > base
    del r, it
    pf, n = settle(base)
    assert not pf and n <= base, (pf, n, base)
    # and dropping a reader that never iterated
    r = lmdbio.Reader(big_env)
    del r
    pf, n = settle(base)
    assert not pf and n <= base


def test_closed_reader_fresh(big_env):
    r = lmdbio.Reader(big_env)
    r.close()
    with pytest.raises(lmdbio.Error):
        r.read([0])
    with pytest.raises(lmdbio.Error):
        list(r)
    assert not prefetch_threads(settle=5)


# ---------------------------------------------------------------------------
# corrupt files: errors come from the iterator, name the page, no crash,
# no hang, no leaked thread (each scenario runs in a subprocess)


CORRUPT_SCRIPT = r"""
import json, os, sys, threading, time, resource
limit = int(sys.argv[4])
# (under ASan, make test-sanitize, max_allocation_size_mb caps allocations:
# its shadow memory cannot live under RLIMIT_AS)
if limit and not os.environ.get("LMDBIO_SANITIZE"):
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import lmdbio
path, bs, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
out = {"records": 0, "batches": 0}
t0 = time.time()
try:
    r = lmdbio.Reader(path, batch_size=bs, index_cache=(mode == "cached"),
                      shuffle=(mode == "shuffle"))
    if mode == "read":
        r.read(json.loads(sys.argv[5]))
    else:
        for b in r:
            out["records"] += len(b)
            out["batches"] += 1
    out["exc"] = None
except BaseException as e:
    out["exc"] = type(e).__name__
    out["bases"] = [c.__name__ for c in type(e).__mro__]
    out["msg"] = str(e)
out["seconds"] = time.time() - t0
# prefetch threads left: Python lanes and C lanes (lmdb_fixtures's
# prefetch_threads, which this child does not import)
out["threads"] = [t.name for t in threading.enumerate()
                  if t.name == "lmdbio-prefetch"]
for task in os.listdir("/proc/self/task"):
    try:
        with open("/proc/self/task/%s/comm" % task) as fh:
            if fh.read().strip() == "lmdbio-lane":
                out["threads"].append("lmdbio-lane")
    except OSError:
        pass
try:
    r.close()
except NameError:
    pass
print(json.dumps(out))
"""


def run_corrupt(path, bs=64, mode="iter", limit=0, extra=None):
    args = [path, bs, mode, limit] + ([json.dumps(extra)] if extra else [])
    proc = run_py(CORRUPT_SCRIPT, *args, timeout=60)
    assert proc.returncode == 0, "crashed: rc=%d\n%s" % (proc.returncode,
                                                          proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env_with_overflow(path, n=600):
    items = [(b"k%05d" % i, val_of(b"%d" % i, 9000 if i % 10 == 0 else 60))
             for i in range(n)]
    write_items(path, items)
    return LmdbFile(path)


def _late(nodes_or_pages, key):
    """The element holding the largest keys (read late in the epoch)."""
    return sorted(nodes_or_pages, key=key)[-2]


def _assert_mid_epoch(out, cls, page, total):
    assert out["exc"] == cls, out
    assert "Error" in out["bases"] and out["bases"][0] == cls
    assert "page %d" % page in out["msg"], out["msg"]
    assert 0 < out["records"] < total, out          # first batches were fine
    assert not out["threads"], out


@pytest.mark.parametrize("damage", ["branch-past-file", "leaf-pgno",
                                    "leaf-bounds"])
def test_corrupt_found_at_open(tmp_path, damage):
    """Damage on the index's path (branch pages, leaf headers) is found by
    Reader() itself, as a subclass of lmdbio.Error naming the page, when it
    builds the whole index first (a shuffled epoch); an epoch in key order
    counts the leaves as it reads them, so a damaged leaf header fails the
    batch that needs it, after every batch before it."""
    f = _env_with_overflow(tmp_path, n=3000)
    assert f.meta.main_db.depth >= 2
    leaf = _late(f.leaves(), lambda p: p.nodes[0].key)
    if damage == "branch-past-file":
        branch = f.pages[leaf.parent]
        nd = [x for x in branch.nodes if x.child == leaf.pgno][0]
        patch(data_file(tmp_path), nd.offset, "<HHH", 0xFFFF, 0x00FF, 0)
        page, cls = 0xFFFFFF, "PageNotFoundError"
    elif damage == "leaf-pgno":
        patch_page_header(data_file(tmp_path), leaf.pgno, f.psize,
                          pgno_field=leaf.pgno + 1)
        page, cls = leaf.pgno, "CorruptedError"
    else:
        patch_page_header(data_file(tmp_path), leaf.pgno, f.psize, lower=9)
        page, cls = leaf.pgno, "CorruptedError"
    out = run_corrupt(str(tmp_path), mode="shuffle")
    assert out["exc"] == cls, out
    assert "page %d" % page in out["msg"], out["msg"]
    assert out["records"] == 0
    assert not out["threads"], out
    out = run_corrupt(str(tmp_path))
    if damage == "branch-past-file":   # the branch levels: read at open
        assert out["exc"] == cls and out["records"] == 0, out
        assert "page %d" % page in out["msg"], out["msg"]
    else:
        _assert_mid_epoch(out, cls, page, 3000)


def test_corrupt_leaf_node_offset_mid_epoch(tmp_path):
    f = _env_with_overflow(tmp_path)
    leaf = _late(f.leaves(), lambda p: p.nodes[0].key)
    patch(data_file(tmp_path), leaf.pgno * f.psize + 16, "<H", 3)
    out = run_corrupt(str(tmp_path))
    _assert_mid_epoch(out, "CorruptedError", leaf.pgno, 600)


def test_corrupt_leaf_node_dsize_mid_epoch(tmp_path):
    f = _env_with_overflow(tmp_path)
    leaf = _late(f.leaves(), lambda p: p.nodes[0].key)
    nd = [x for x in leaf.nodes if not x.flags & F_BIGDATA][0]
    set_leaf_dsize(data_file(tmp_path), nd, 60000)   # inline value > page
    out = run_corrupt(str(tmp_path))
    _assert_mid_epoch(out, "CorruptedError", leaf.pgno, 600)


def test_corrupt_leaf_flags_with_cached_index(tmp_path):
    """The index (leaf headers) comes from the cache, built before the
    damage (on-disk damage changes neither size nor mtime): the broken
    header is met mid-epoch."""
    f = _env_with_overflow(tmp_path)
    with lmdbio.Reader(tmp_path) as r:               # writes the cache
        r.read([0])
    leaf = _late(f.leaves(), lambda p: p.nodes[0].key)
    st = os.stat(data_file(tmp_path))
    patch_page_header(data_file(tmp_path), leaf.pgno, f.psize, flags=0x01)
    # bit rot changes neither size nor mtime
    os.utime(data_file(tmp_path), ns=(st.st_atime_ns, st.st_mtime_ns))
    out = run_corrupt(str(tmp_path), mode="cached")
    _assert_mid_epoch(out, "CorruptedError", leaf.pgno, 600)


def test_corrupt_overflow_header_mid_epoch(tmp_path):
    f = _env_with_overflow(tmp_path)
    nd = _late(f.bigdata_nodes(), lambda n: n.key)
    ov = struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
    patch_page_header(data_file(tmp_path), ov, f.psize, flags=P_LEAF)
    out = run_corrupt(str(tmp_path), bs=16)
    _assert_mid_epoch(out, "CorruptedError", ov, 600)


def test_overflow_page_past_the_file_mid_epoch(tmp_path):
    f = _env_with_overflow(tmp_path)
    nd = _late(f.bigdata_nodes(), lambda n: n.key)
    patch(data_file(tmp_path), nd.data_offset, "<Q", 10 ** 6)
    out = run_corrupt(str(tmp_path), bs=16)
    _assert_mid_epoch(out, "PageNotFoundError", 10 ** 6, 600)


@pytest.mark.parametrize("mode", ["iter", "read"])
def test_huge_claimed_overflow_size_fails_fast(tmp_path, mode):
    """~4 GiB claimed on a small file: an lmdbio.Error, no MemoryError, no
    huge allocation (the subprocess's address space is capped at 1 GiB)."""
    f = _env_with_overflow(tmp_path)
    nd = _late(f.bigdata_nodes(), lambda n: n.key)
    set_leaf_dsize(data_file(tmp_path), nd, 0xFFFFFFF0)
    ordinal = [k for k, _ in oracle_keys(tmp_path)].index(nd.key)
    out = run_corrupt(str(tmp_path), bs=16, mode=mode, limit=1 << 30,
                      extra=[0, ordinal])
    assert out["exc"] in ("PageNotFoundError", "CorruptedError"), out
    assert "Error" in out["bases"]
    assert out["seconds"] < 10
    if mode == "iter":
        assert 0 < out["records"] < 600


def oracle_keys(path):
    """Keys and sizes of a file whose values may be damaged (never read)."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return [(bytes(k), None) for k in txn.cursor().iternext(values=False)]
    finally:
        env.close()


def test_aliased_overflow_pages(tmp_path):
    """Two leaf nodes point at one overflow run, the second claiming a value
    larger than the run holds: a CorruptedError naming the page, whatever
    the order the two records are requested in (never bytes from outside
    the run)."""
    items = [(b"k%05d" % i, val_of(b"%d" % i, 9000 if i % 10 == 0 else
                                   (5000 if i % 10 == 5 else 60)))
             for i in range(300)]
    write_items(tmp_path, items)
    f = LmdbFile(tmp_path)
    nodes = sorted(f.bigdata_nodes(), key=lambda n: n.key)
    small = [n for n in nodes if n.dsize == 5000][0]
    big = [n for n in nodes if n.dsize == 9000][-1]
    sov = struct.unpack_from("<Q", f.buf, small.data_offset)[0]
    patch(data_file(tmp_path), big.data_offset, "<Q", sov)
    keys = [k for k, _ in items]
    a, b = keys.index(small.key), keys.index(big.key)
    for order in ([b], [b, a], [a, b], [a, b, a, b]):
        out = run_corrupt(str(tmp_path), mode="read", extra=order)
        assert out["exc"] == "CorruptedError", (order, out)
        assert "page %d" % sov in out["msg"]


# ---------------------------------------------------------------------------
# comm= / engine="mpiio" / node_local=True in one process (a world of one
# rank): each must do what it says (the MPI-IO engine reads through MPI-IO,
# node_local shares one reader per node) and give the records of the
# posix Reader, in the documented shuffled order.  tests/mpi covers several
# ranks.  Run in a subprocess: initialising MPI is not something to do
# inside pytest.


MPI_SCRIPT = r"""
import json, sys
import lmdbio
path, how = sys.argv[1], sys.argv[2]
kw = {"posix": {}, "mpiio": {"engine": "mpiio"},
      "node_local": {"node_local": True}}.get(how)
if how == "comm":
    from mpi4py import MPI
    kw = {"comm": MPI.COMM_WORLD}
if how == "bogus-comm":
    kw = {"comm": object()}
out = {}
try:
    with lmdbio.Reader(path, batch_size=7, shuffle=True, seed=1,
                       index_cache=False, **kw) as r:
        out["total"] = r.total_records
        out["n"] = len(r)
        out["engine"] = r.engine
        out["node_local"] = r.node_local
        out["pairs"] = [[i, b.values[j].decode()] for b in r
                        for j, i in enumerate(b.indices.tolist())]
        mf = getattr(r, "_mpifile", None)
        out["mpiio_requests"] = None if mf is None else mf.requests
        out["node_share"] = getattr(r, "_share", None) is not None
    if how == "mpiio":  # an ordered epoch: dense windows, read via MPI-IO
        with lmdbio.Reader(path, batch_size=7, index_cache=False, **kw) as r:
            out["ordered"] = [i for b in r for i in b.indices.tolist()]
            out["ordered_mpiio_requests"] = r._mpifile.requests
except BaseException as e:
    out["exc"] = [c.__name__ for c in type(e).__mro__]
    out["msg"] = str(e)
print(json.dumps(out))
"""


def _has_mpi4py():
    try:
        import importlib.util
        return importlib.util.find_spec("mpi4py") is not None
    except Exception:
        return False


@pytest.mark.parametrize("how", ["comm", "mpiio", "node_local"])
def test_mpi_arguments_single_process(shard_envs, how):
    if not _has_mpi4py():
        msg = "comm=, engine='mpiio' and node_local=True need mpi4py"
        if os.environ.get("CI") or os.environ.get("LMDBIO_REQUIRE"):
            pytest.fail(msg + " (install it: pip install mpi4py mpich)")
        pytest.skip(msg)
    proc = run_py(MPI_SCRIPT, shard_envs[37], how, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "exc" not in out, out
    # the documented order, computed here: PCG64 seeded with [seed, epoch]
    want = np.random.default_rng([1, 0]).permutation(37).tolist()
    assert out["total"] == 37 and out["n"] == 6
    assert out["pairs"] == [[i, "v%d" % i] for i in want]
    # what each argument does
    # comm= defaults to independent reads (measured fastest); engine="mpiio"
    # reads dense windows (an ordered epoch) through MPI-IO collectives,
    # sparse ones (this shuffled epoch) with independent reads
    assert out["engine"] == ("mpiio" if how == "mpiio" else "posix")
    if how == "mpiio":
        assert out["ordered"] == list(range(37))
        assert out["ordered_mpiio_requests"] > 0
    else:
        assert out["mpiio_requests"] is None
    assert out["node_local"] == (how == "node_local")
    assert out["node_share"] == (how == "node_local")
    posix = json.loads(run_py(MPI_SCRIPT, shard_envs[37], "posix",
                              timeout=60).stdout.strip().splitlines()[-1])
    assert posix["engine"] == "posix" and posix["mpiio_requests"] is None
    assert posix["pairs"] == out["pairs"]


def test_comm_that_is_not_a_communicator(shard_envs):
    """comm=<not a communicator>: a clear error (TypeError, ValueError or an
    lmdbio.Error), not an AttributeError from deep inside."""
    proc = run_py(MPI_SCRIPT, shard_envs[5], "bogus-comm", timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "exc" in out, out
    assert {"TypeError", "ValueError", "Error"} & set(out["exc"]), out
    assert "AttributeError" not in out["exc"], out


def test_posix_engine_explicit(shard_envs):
    for engine in ("auto", "posix"):
        with lmdbio.Reader(shard_envs[12], engine=engine, batch_size=5) as r:
            assert collect(r)[0] == list(range(12))
