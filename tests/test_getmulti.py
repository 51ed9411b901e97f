"""Cursor.getmulti reads the leaves its keys need together, then looks each
key up in the caller's order: read-ahead never changes a result.

* Differential against py-lmdb over random key lists (missing keys,
  repeated keys, any order, bytes-like keys) with every getmulti option, on
  trees of several levels of every kind (duplicates, fixed-size duplicates,
  integer and reversed keys, overflow values of one page and of several),
  with read-ahead off, on, on a tiny cache (many small batches) and as from
  a cold device.
* Keys that are not bytes-like, and iterators that raise, fail as a plain
  loop of lookups would: after the lookups of the keys before them.
* A damaged page that only read-ahead reached (a neighbour read in the same
  request, a branch no key needs) raises nothing; a key that needs it
  raises, as without read-ahead.
* The leaves of a shuffled key list are read in few requests.
"""

from __future__ import annotations

import random
import struct

import pytest

from lmdb_fixtures import (COMBOS_BY_ID, PLAIN, LmdbFile, patch,
                           read_syscalls, sample_ops, write_env, write_items)

from conftest import import_subject, require
from test_cursor_readahead import CONFIGS, build_trees, norm, open_sub

hypothesis = require("hypothesis", "pip install hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
lmdbio = import_subject("lmdbio")

N_KEYS = 700
SPECS = ["plain", "onepage", "dupsort", "dupsort_dupfixed", "reversekey",
         "integerkey4", "integerkey8"]


def build(path, spec_id):
    """A tree of 3 levels on 4 KiB pages written in a scattered key order.
    "plain" has values of several overflow pages, "onepage" values of one
    overflow page (just over half a page) between small ones."""
    spec = COMBOS_BY_ID["plain" if spec_id == "onepage" else spec_id]
    if spec_id == "onepage":
        ops = [("put", spec.make_key(i),
                spec.make_value(i, 2100 + i * 13 % 900 if i % 3 else 20))
               for i in range(N_KEYS)]
    else:
        ops = sample_ops(spec, n_keys=N_KEYS, dups=40 if spec.dupsort else 1,
                         big_every=0 if spec.dupsort else 29)
    order = sorted(range(len(ops)), key=lambda i: (i * 7919) % len(ops))
    write_env(path, {b"t": (spec, [ops[i] for i in order])})
    return spec


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    return build_trees(tmp_path_factory, build, SPECS)


def getmulti(env, keys, kw, buffers):
    """getmulti on db b"t" and the cursor's item afterwards, normalised;
    or what it raised."""
    db = env.open_db(b"t")
    with env.begin(db=db, buffers=buffers) as txn:
        cur = txn.cursor()
        try:
            got = cur.getmulti(keys, **kw)
        except Exception as e:  # both sides must raise the same
            return ("raised", type(e).__name__)
        return norm(got), norm(cur.item())


def expected(path, keys):
    """py-lmdb's getmulti of `keys` on db b"t" of the environment at path."""
    ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
    try:
        return getmulti(ref, keys, {}, False)
    finally:
        ref.close()


@st.composite
def call_st(draw, spec):
    """A key list and getmulti's options for a database of `spec`."""
    n = draw(st.sampled_from([0, 1, 2, 5, 40, 300, 2 * N_KEYS]))
    idx = draw(st.lists(st.integers(0, N_KEYS + 60), min_size=n, max_size=n))
    if n == 2 * N_KEYS:          # every key (and some missing), shuffled
        idx = list(range(N_KEYS + 60)) + idx[:N_KEYS - 60]
        draw(st.randoms()).shuffle(idx)
    kinds = draw(st.lists(st.sampled_from(["bytes"] * 6 + ["bytearray",
                                                           "memoryview"]),
                          min_size=len(idx), max_size=len(idx)))
    keys = []
    for i, kind in zip(idx, kinds):
        k = spec.make_key(i)
        keys.append(bytearray(k) if kind == "bytearray"
                    else memoryview(k) if kind == "memoryview" else k)
    kw = {}
    if draw(st.booleans()):
        kw["values"] = False
    elif spec.dupsort and draw(st.booleans()):
        kw["dupdata"] = True
        if spec.kwargs.get("dupfixed") and draw(st.booleans()):
            w = spec.val_width
            kw["dupfixed_bytes"] = draw(st.sampled_from([w, 2 * w]
                                                        if w > 1 else [w]))
            kw["keyfixed"] = draw(st.booleans())
    return keys, kw


@pytest.mark.parametrize("spec_id", SPECS)
def test_getmulti_matches_pylmdb_every_config(trees, spec_id):
    path, spec = trees[spec_id]
    ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
    subs = [(c[0], open_sub(path, c)) for c in CONFIGS]
    try:
        @settings(max_examples=20)
        @given(call=call_st(spec), buffers=st.booleans())
        def inner(call, buffers):
            keys, kw = call
            want = getmulti(ref, keys, kw, buffers)
            assert want[0] != "raised"
            for name, env in subs:
                assert getmulti(env, keys, kw, buffers) == want, name
        inner()
    finally:
        ref.close()
        for _name, env in subs:
            env.close()


def test_long_key_lists_cross_chunks(trees):
    """More keys than one chunk of conversion and read-ahead: every key of
    the tree several times over, shuffled, through an iterator."""
    path, spec = trees["plain"]
    keys = [spec.make_key(i) for i in range(N_KEYS + 30)] * 7
    random.Random(5).shuffle(keys)
    want = expected(path, keys)
    assert len(want[0]) == N_KEYS * 7
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            assert getmulti(env, iter(keys), {}, False) == want, cfg[0]
        finally:
            env.close()


def raising_iter(keys, exc):
    yield from keys
    raise exc


@pytest.mark.parametrize("bad", ["text", 7, None])
def test_key_not_bytes_like_raises_as_a_lookup(trees, bad):
    path, spec = trees["plain"]
    good = [spec.make_key(i) for i in range(0, 600, 3)]
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                cur = txn.cursor()
                with pytest.raises(TypeError) as want:
                    cur.set_key(bad)
                with pytest.raises(TypeError) as got:
                    cur.getmulti(good + [bad] + good)
                assert str(got.value) == str(want.value), cfg[0]
                # an iterator that raises: after the lookups before it
                with pytest.raises(KeyError, match="from the iterator"):
                    cur.getmulti(raising_iter(good,
                                              KeyError("from the iterator")))
                assert cur.key() == good[-1], cfg[0]
        finally:
            env.close()
    ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
    try:
        with ref.begin(db=ref.open_db(b"t")) as txn:
            with pytest.raises(TypeError):
                txn.cursor().getmulti(good + [bad])
    finally:
        ref.close()


def _leaves_in_key_order(path):
    f = LmdbFile(path)
    return f, sorted(f.leaves("t"), key=lambda p: p.nodes[0].key)


def _appended(path, n=3000):
    items = [(b"%06d" % i, b"v%d" % i * 40) for i in range(n)]
    write_items(path, items, name=b"t")
    return dict(items)


def _damage(f, pgno):
    patch(f.path, pgno * f.psize + 10, "<H", 0)   # neither branch nor leaf


def test_damaged_leaf_reached_only_by_readahead(tmp_path):
    """An appended layout: the leaves around a damaged one are read in the
    same request (or block) as it, yet only a key in it raises."""
    path = str(tmp_path)
    items = _appended(path)
    f, leaves = _leaves_in_key_order(path)
    assert len(leaves) > 40
    bad = leaves[20]
    _damage(f, bad.pgno)
    near = [nd.key for p in leaves[15:26] if p is not bad for nd in p.nodes]
    far = [nd.key for p in leaves[30:] for nd in p.nodes]
    random.Random(3).shuffle(near)
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                cur = txn.cursor()
                keys = near + far[:50]
                assert cur.getmulti(keys) == [(k, items[k]) for k in keys], \
                    cfg[0]
                with pytest.raises(lmdbio.CorruptedError):
                    cur.getmulti(near[:5] + [bad.nodes[3].key] + far[:5])
                # the damaged page in the cache poisons nothing else
                assert cur.getmulti(near[:9]) == \
                    [(k, items[k]) for k in near[:9]], cfg[0]
                with pytest.raises(lmdbio.CorruptedError):
                    txn.get(bad.nodes[0].key)
        finally:
            env.close()


def test_damaged_branch_fails_only_the_keys_below_it(tmp_path):
    path = str(tmp_path)
    items = _appended(path, n=60000)
    f = LmdbFile(path)
    branches = [p for p in f.branches("t") if p.level > 0]
    assert len(branches) >= 2, "needs a tree of 3 levels"
    bad = branches[0]
    below = {c.child for c in bad.nodes}
    under, other = [], []
    for leaf in f.leaves("t"):
        (under if leaf.pgno in below else other).extend(
            nd.key for nd in leaf.nodes)
    _damage(f, bad.pgno)
    rnd = random.Random(4)
    keys = rnd.sample(other, 500)
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                cur = txn.cursor()
                assert cur.getmulti(keys) == [(k, items[k]) for k in keys], \
                    cfg[0]
                with pytest.raises(lmdbio.CorruptedError):
                    cur.getmulti(keys[:50] + [under[7]] + keys[50:])
                assert cur.getmulti(keys[:20]) == \
                    [(k, items[k]) for k in keys[:20]], cfg[0]
        finally:
            env.close()


def test_damaged_one_page_overflow_value(trees, tmp_path):
    """An overflow page read ahead for a key is checked when the lookup
    reads it: that key raises, the others are read."""
    src, spec = trees["onepage"]
    path = str(tmp_path)
    with open(LmdbFile(src).path, "rb") as fh:
        data = fh.read()
    with open(path + "/data.mdb", "wb") as fh:
        fh.write(data)
    f = LmdbFile(path)
    node = [nd for p in f.leaves("t") for nd in p.nodes
            if nd.key == spec.make_key(31)][0]
    ov = struct.unpack_from("<Q", f.buf, node.data_offset)[0]
    patch(f.path, ov * f.psize + 10, "<H", 0x02)    # a leaf's flags
    keys = [spec.make_key(i) for i in range(N_KEYS) if i != 31]
    random.Random(6).shuffle(keys)
    want = expected(src, keys)
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            assert getmulti(env, keys, {}, False) == want, cfg[0]
            assert getmulti(env, keys[:40] + [spec.make_key(31)], {},
                            False) == ("raised", "CorruptedError"), cfg[0]
        finally:
            env.close()


def test_leaves_of_a_shuffled_key_list_read_together(tmp_path):
    """Every key of an appended layout in a shuffled order: with read-ahead
    the leaves come in fewer, larger requests, without it one per leaf."""
    path = str(tmp_path)
    items = [(b"%07d" % i, b"x" * 200) for i in range(20000)]
    write_items(path, items, name=b"t")
    nleaves = len(_leaves_in_key_order(path)[1])
    keys = [k for k, _v in items]
    random.Random(2).shuffle(keys)
    counts, first = {}, {}
    for cfg in (CONFIGS[1], CONFIGS[2], CONFIGS[5]):
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                cur = txn.cursor()
                r0 = read_syscalls()
                got = cur.getmulti(keys[:1024], values=False)
                first[cfg[0]] = read_syscalls() - r0
                for i in range(1024, len(keys), 1024):
                    got += cur.getmulti(keys[i:i + 1024], values=False)
                counts[cfg[0]] = read_syscalls() - r0
                assert got == keys
        finally:
            env.close()
    # The first 1024 keys need most leaves.  From the OS cache the runs of
    # neighbouring leaves are read in one request each (a leaf alone is
    # left to its lookup); from the device every leaf is read ahead, a
    # block around each.
    assert first["fast-no-readahead"] >= nleaves // 2
    assert first["fast-readahead"] * 3 < first["fast-no-readahead"], first
    assert first["readahead-device"] * 10 < nleaves, first
    # later calls find most leaves cached; the holes between them are read
    # one request each (in flight from the device), never more requests
    assert counts["fast-no-readahead"] >= nleaves
    assert counts["fast-readahead"] < counts["fast-no-readahead"], counts
    assert counts["readahead-device"] < counts["fast-no-readahead"], counts
