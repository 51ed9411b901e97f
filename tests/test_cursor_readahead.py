"""The drop-in cursor's fast paths never change a result.

* The in-leaf step (lio_cursor_step, taken with the GIL held) against the
  simple path (every step through lio_cursor_get, $LMDBIO_CURSOR_FASTPATH=0)
  and against py-lmdb, on trees of several levels and every kind of node
  (duplicates, sub-pages, sub-databases, overflow values).
* Read-ahead that follows the tree, forced off, on, on with a tiny cache
  (read-ahead batches evicted before they are used), and as from a cold
  device (blocks read around each leaf, reads in flight).
* A damaged leaf that only read-ahead reached raises nothing until the
  cursor needs it.
* Walking from a device, the blocks of the leaves after a read-ahead
  batch are asked of the OS (WILLNEED) and arrive in its cache.
* Reader threads and cursors: a scan abandoned midway, a transaction ended
  mid-scan, then the environment closed leave no thread behind.
* buffers=True: views onto the page, equal to the copies.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time

import pytest

from lmdb_fixtures import (COMBOS_BY_ID, LmdbFile, cached_after, cached_pages,
                           device_queue, evict, patch, read_syscalls,
                           sample_ops,
                           wait_cached, write_env, write_items)

from conftest import import_subject, require

hypothesis = require("hypothesis", "pip install hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
lmdbio = import_subject("lmdbio")

SPECS = ["plain", "dupsort", "dupsort_dupfixed", "reversekey", "integerkey4"]

# (name, environment variables, open() keywords)
CONFIGS = [
    ("simple", {"LMDBIO_CURSOR_FASTPATH": "0"}, {"readahead": False}),
    ("fast-no-readahead", {}, {"readahead": False}),
    ("fast-readahead", {}, {}),
    ("readahead-tiny-cache", {"LMDBIO_READAHEAD_BYTES": str(1 << 20)},
     {"cache_bytes": 0}),
    ("readahead-2-leaves", {"LMDBIO_READAHEAD_BYTES": "8192"},
     {"cache_bytes": 0}),
    # as from a cold device: aligned blocks read around, reads in flight
    ("readahead-device", {"LMDBIO_READAHEAD_DEVICE": "1"}, {}),
    ("readahead-device-tiny-cache", {"LMDBIO_READAHEAD_DEVICE": "1"},
     {"cache_bytes": 0}),
]


@contextlib.contextmanager
def environ(**kv):
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update(kv)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def open_sub(path, cfg):
    _name, env_vars, kw = cfg
    with environ(**env_vars):
        return lmdbio.open(path, readonly=True, lock=False, max_dbs=4, **kw)


def check_advice(path, evict_ranges, ranges, read):
    """read(env) reads from the environment at path: without read-ahead
    `ranges` of its data file stay out of the OS cache (0.3 s); as from a
    device (LMDBIO_READAHEAD_DEVICE=1) the advice brings them within
    10 s.  evict_ranges: what must leave the OS cache first."""
    def act(cfg):
        env = open_sub(path, cfg)
        try:
            read(env)
        finally:
            env.close()

    fd = os.open(LmdbFile(path).path, os.O_RDONLY)
    try:
        for cfg in (CONFIGS[1], ("device", {"LMDBIO_READAHEAD_DEVICE": "1"},
                                 {})):
            device = cfg[0] == "device"
            cached = cached_after(fd, evict_ranges, ranges,
                                  lambda: act(cfg), 10 if device else 0.3,
                                  2 if device else 1)
            assert all(cached) if device else not any(cached), \
                (cfg[0], sum(map(bool, cached)), len(cached))
    finally:
        os.close(fd)


def build(path, spec_id, n_keys=700):
    """A tree of 3 levels on 4 KiB pages: many leaves, written in a
    scattered key order so that key order jumps around the file."""
    spec = COMBOS_BY_ID[spec_id]
    ops = sample_ops(spec, n_keys=n_keys, dups=40 if spec.dupsort else 1,
                     big_every=0 if spec.dupsort else 29)
    order = sorted(range(len(ops)), key=lambda i: (i * 7919) % len(ops))
    ops = [ops[i] for i in order]
    write_env(path, {b"t": (spec, ops)})
    return spec


def build_trees(tmp_path_factory, build, specs=SPECS):
    """{spec id: (path, spec)}: one environment per spec, made by build."""
    out = {}
    for sid in specs:
        p = str(tmp_path_factory.mktemp(sid))
        out[sid] = (p, build(p, sid))
    return out


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    return build_trees(tmp_path_factory, build)


def norm(x):
    if isinstance(x, tuple):
        return tuple(norm(i) for i in x)
    if isinstance(x, list):
        return [norm(i) for i in x]
    if isinstance(x, memoryview):
        return x.tobytes()
    return x


def run(env, program, buffers):
    """Apply `program` to a cursor of db b"t"; the results, normalised."""
    out = []
    db = env.open_db(b"t")
    with env.begin(db=db, buffers=buffers) as txn:
        cur = txn.cursor()
        for step in program:
            op = step[0]
            try:
                if op == "iter":
                    _, meth, take = step
                    it = getattr(cur, meth)()
                    got = []
                    for item in it:
                        got.append(norm(item))
                        if len(got) >= take:
                            break
                    out.append(got)
                elif op in ("set_key", "set_range"):
                    out.append((getattr(cur, op)(step[1]), norm(cur.item())))
                elif op == "get":
                    out.append(norm(txn.get(step[1])))
                else:
                    r = getattr(cur, op)()
                    out.append((r, norm(cur.item())))
            except Exception as e:  # both sides must raise the same
                out.append(("raised", type(e).__name__))
    return out


MOVES = ["first", "last", "next", "prev", "next_nodup", "prev_nodup",
         "next_dup", "prev_dup", "first_dup", "last_dup"]
ITERS = ["iternext", "iterprev", "iternext_nodup", "iterprev_nodup",
         "iternext_dup", "iterprev_dup"]


@st.composite
def program_st(draw, spec):
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["move"] * 5 + ["iter"] * 3 +
                                    ["seek", "get"]))
        if kind == "move":
            steps.append((draw(st.sampled_from(MOVES)),))
        elif kind == "iter":
            steps.append(("iter", draw(st.sampled_from(ITERS)),
                          draw(st.integers(1, 3000))))
        else:
            # keys 0..699 exist.  On DUPSORT a seek that misses leaves
            # py-lmdb's dup sub-cursor undefined (see test_differential's
            # "poisoned" state): there only existing keys are sought.
            key = spec.make_key(draw(st.integers(0, 699 if spec.dupsort
                                                 else 760)))
            op = draw(st.sampled_from(["set_key", "set_range"])) \
                if kind == "seek" else "get"
            steps.append((op, key))
    return steps


@pytest.mark.parametrize("spec_id", SPECS)
def test_fast_and_readahead_match_simple_and_pylmdb(trees, spec_id):
    path, spec = trees[spec_id]
    ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
    subs = [(c[0], open_sub(path, c)) for c in CONFIGS]
    try:
        @settings(max_examples=25)
        @given(program=program_st(spec), buffers=st.booleans())
        def inner(program, buffers):
            want = run(ref, program, buffers)
            for name, env in subs:
                assert run(env, program, buffers) == want, name
        inner()
    finally:
        ref.close()
        for _name, env in subs:
            env.close()


@pytest.mark.parametrize("spec_id", SPECS)
def test_full_walks_every_config(trees, spec_id):
    """Whole scans both ways, with and without buffers: every config gives
    py-lmdb's sequence."""
    path, _spec = trees[spec_id]
    ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
    try:
        for buffers in (False, True):
            want = {m: run(ref, [("iter", m, 10 ** 6)], buffers)
                    for m in ("iternext", "iterprev")}
            assert len(want["iternext"][0]) > 500
            for cfg in CONFIGS:
                env = open_sub(path, cfg)
                try:
                    for m, w in want.items():
                        assert run(env, [("iter", m, 10 ** 6)], buffers) == w, \
                            (cfg[0], m)
                finally:
                    env.close()
    finally:
        ref.close()


def _threads():
    return len(os.listdir("/proc/self/task"))


def test_no_thread_or_cursor_left_behind(trees):
    path, _spec = trees["plain"]
    base = _threads()
    env = open_sub(path, CONFIGS[2])
    db = env.open_db(b"t")
    txn = env.begin(db=db)
    cur = txn.cursor()
    it = iter(cur)
    for _ in range(50):          # stop mid-scan, read-ahead done
        next(it)
    txn2 = env.begin(db=db)
    for _i, _kv in zip(range(300), txn2.cursor()):
        pass
    txn2.abort()                 # transaction ends mid-scan
    with pytest.raises(lmdbio.Error):
        txn2.cursor()
    assert _threads() >= base
    env.close()                  # with a cursor still open
    with pytest.raises(lmdbio.Error):
        next(it)
    del it, cur, txn
    assert _threads() == base


def _leaves_in_key_order(path, db=b"t"):
    f = LmdbFile(path)
    leaves = f.leaves(db.decode())
    return f, sorted(leaves, key=lambda p: p.nodes[0].key)


def _appended(path, n):
    """n records of 900 bytes appended to database t (4 a leaf, leaves in
    file order): its file, leaves in key order and size in bytes."""
    write_items(path, [(b"%06d" % i, b"v" * 900) for i in range(n)],
                name=b"t")
    f, leaves = _leaves_in_key_order(path)
    assert [p.pgno for p in leaves] == sorted(p.pgno for p in leaves)
    return f, leaves, f.file_pages() * f.psize


def _walk(txn, records):
    """A cursor of txn stepped from its first record `records` times."""
    cur = txn.cursor()
    assert cur.first()
    for _ in range(records):
        assert cur.next()
    return cur


def _check_blocks_past_leaf_64(path, leaves, size, blocks, queue,
                               before=None):
    """check_advice over database t of `path` (`leaves` in key order,
    `size` bytes) with the device's queue set to `queue`: a cursor walked
    to leaf 64's first record (after before(), if given) brings the 2 MiB
    `blocks` whole into the OS cache with read-ahead, not without."""
    block = 2 << 20
    records = sum(len(p.nodes) for p in leaves[:64])

    def walk(env):
        if before is not None:
            before()
        with env.begin(db=env.open_db(b"t")) as txn:
            cur = _walk(txn, records)
            assert cur.key() == leaves[64].nodes[0].key

    with device_queue(path, **queue):
        check_advice(path, [(0, size)], [(b * block, block) for b in blocks],
                     walk)


def scan_to_damage(txn):
    """The records a full cursor scan yields before CorruptedError."""
    got = []
    with pytest.raises(lmdbio.CorruptedError):
        for k, v in txn.cursor():
            got.append((k, v))
    return got


def test_damaged_leaf_reached_only_by_readahead(tmp_path):
    """Leaf 6 in key order is damaged: a read-ahead batch holds it, yet the
    first five leaves read cleanly; the error comes when the cursor gets
    there, as without read-ahead."""
    path = str(tmp_path)
    items = [(b"%06d" % i, b"v" * 300) for i in range(2000)]
    write_items(path, items, name=b"t")
    f, leaves = _leaves_in_key_order(path)
    assert len(leaves) > 20
    bad = leaves[6]
    before = sum(len(p.nodes) for p in leaves[:6])
    # flags 0x00: neither branch nor leaf
    patch(f.path, bad.pgno * f.psize + 10, "<H", 0)
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                assert scan_to_damage(txn) == items[:before], cfg[0]
                # lookups in the healthy leaves still work
                assert txn.get(items[0][0]) == items[0][1]
                assert txn.get(items[before - 1][0]) == items[before - 1][1]
        finally:
            env.close()


def test_readahead_reads_neighbouring_leaves_together(tmp_path):
    """An appended layout: the leaves a scan meets next are read in few
    large requests with read-ahead, one request per leaf without."""
    path = str(tmp_path)
    write_items(path, [(b"%07d" % i, b"x" * 200) for i in range(20000)],
                name=b"t")
    nleaves = len(_leaves_in_key_order(path)[1])
    counts = {}
    for cfg in (CONFIGS[1], CONFIGS[2]):
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                r0 = read_syscalls()
                n = sum(1 for _ in txn.cursor())
                counts[cfg[0]] = read_syscalls() - r0
                assert n == 20000
        finally:
            env.close()
    assert counts["fast-no-readahead"] >= nleaves
    assert counts["fast-readahead"] * 4 < nleaves


# The device's queue as the machine has it, and as many do: Linux's
# default read-ahead window (128 KiB), where the kernel also cuts a
# WILLNEED advice to 128 KiB when the device's requests are that small.
QUEUES = {"as-is": {}, "small": {"read_ahead_kb": 128, "max_sectors_kb": 128}}


@pytest.fixture(params=sorted(QUEUES))
def queue(request, tmp_path):
    with device_queue(str(tmp_path), **QUEUES[request.param]):
        yield request.param


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_walk_from_a_device_asks_for_the_blocks_of_later_leaves(tmp_path,
                                                                queue):
    """Three runs of 64 leaves in key order, 16 MiB of other pages between
    them in the file.  Walking from a device (as if:
    $LMDBIO_READAHEAD_DEVICE=1), the cursor's first leaf brings a batch of
    the next 64 (read around, in the first run) and asks the OS for the
    blocks around the 64 after those: the second run arrives, whole, in
    the OS cache without a read by lmdbio.  Without read-ahead it does
    not."""
    path = str(tmp_path)
    w = lmdb.open(path, map_size=1 << 30, max_dbs=2)
    t, pad = w.open_db(b"t"), w.open_db(b"pad")
    with w.begin(write=True) as txn:
        for g in range(3):
            for i in range(g * 256, (g + 1) * 256):   # 4 a leaf: 64 leaves
                assert txn.put(b"%06d" % i, b"v" * 900, db=t, append=True)
            for j in range(16 if g < 2 else 0):
                txn.put(b"%d-%02d" % (g, j), b"p" * (1 << 20), db=pad)
    w.close()
    f, leaves = _leaves_in_key_order(path)
    block = 2 << 20
    near = {p.pgno * f.psize // block
            for p in leaves[:64] + f.branches("t") + f.branches("main")}
    targets = [p.pgno for p in leaves[64:128]
               if p.pgno * f.psize // block not in near]
    assert len(targets) >= 32
    ranges = [(p * f.psize, f.psize) for p in targets]
    blocks = [(b * block, block)
              for b in sorted({p * f.psize // block for p in targets})]

    def first(env):
        with env.begin(db=env.open_db(b"t")) as txn:
            cur = txn.cursor()
            assert cur.first() and cur.key() == b"000000"

    # (whole blocks evicted: advice skips a block whose pages it finds
    # cached already)
    check_advice(path, blocks, ranges, first)


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_lookups_from_a_device_sweep_the_file_ahead(tmp_path, queue):
    """A lookup that misses its leaf from a device (as if:
    $LMDBIO_READAHEAD_DEVICE=1) reads the 2 MiB block around it and asks
    the OS, in the background, for the first four blocks of the file in
    file order that nothing read yet: lookups in random order reach all of
    it.  Without read-ahead they stay out of the OS cache."""
    path = str(tmp_path)
    n = 24000                       # 4 a leaf: 23 MiB, 12 blocks
    write_items(path, [(b"%06d" % i, b"v" * 900) for i in range(n)],
                name=b"t")
    f, leaves = _leaves_in_key_order(path)
    block = 2 << 20
    # the pages a lookup of the last key reads: the main tree's (the name
    # "t"), then its tree's root down to the last leaf
    page = {p.pgno: p for p in f.of_db("t")}
    chain, at = [], leaves[-1].pgno
    while at != -1:
        chain.append(at)
        at = page[at].parent
    touched = {pg * f.psize // block
               for pg in chain + [p.pgno for p in f.of_db("main")]}
    size = f.file_pages() * f.psize
    sweep = [b for b in range(size // block) if b not in touched][:4]
    assert len(sweep) == 4 and max(touched) > max(sweep) + 1
    ranges = [(b * block, block) for b in sweep]

    def lookup(env):
        with env.begin(db=env.open_db(b"t")) as txn:
            assert txn.get(b"%06d" % (n - 1)) == b"v" * 900

    check_advice(path, ranges, ranges, lookup)


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_walk_in_file_order_asks_for_the_next_block_past_a_small_window(
        tmp_path):
    """An appended layout on a device whose read-ahead window is 128 KiB:
    the OS reads little ahead of a walk in file order, so the walk asks it
    for the blocks (2 MiB) after its own once the leaves it reads ahead
    reach them.  Entering a parent whose first batch of leaves (64, read
    around) lies in one block and whose next 256 leaves (asked for) reach
    the next block, that block arrives whole in the OS cache; without
    read-ahead it does not.  (With an 8 MiB window the OS's own read-ahead
    covers it and nothing is asked.)"""
    path = str(tmp_path)
    f, leaves, size = _appended(path, 12000)
    block = 2 << 20

    def blk(leaf):
        return leaf.pgno * f.psize // block

    # the first parent starting at leaf 192 or later (by then a walk asks
    # for 256 leaves after each batch) whose batch and asked-for leaves
    # qualify
    target = first = None
    for first in range(1, len(leaves)):
        if leaves[first].parent == leaves[first - 1].parent:
            continue
        kin = [p for p in leaves[first:first + 64 + 256]
               if p.parent == leaves[first].parent]
        seen = {blk(p) for p in leaves[:first + 64]}
        later = {blk(p) for p in kin[64:]} - seen
        if first >= 3 * 64 and len(kin) > 64 and later:
            target = min(later)
            break
    assert target is not None
    records = sum(len(p.nodes) for p in leaves[:first])

    def walk(env):
        with env.begin(db=env.open_db(b"t")) as txn:
            _walk(txn, records)

    with device_queue(path, read_ahead_kb=128, max_sectors_kb=128):
        check_advice(path, [(0, size)], [(target * block, block)], walk)


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_walk_in_file_order_keeps_blocks_asked_for_well_ahead(tmp_path):
    """An appended layout on a device whose read-ahead window is 128 KiB,
    walked from a device (as if: $LMDBIO_READAHEAD_DEVICE=1).  Entering
    its second batch of leaves (leaf 64, 256 KiB into the file), the walk
    has asked the OS for the blocks up to 8 MiB past that leaf, where the
    parent's next leaves reach 1 MiB at most: blocks 2 to 4 of the file
    arrive whole in the OS cache; without read-ahead they do not."""
    path = str(tmp_path)
    f, leaves, size = _appended(path, 12000)
    block = 2 << 20
    at = leaves[64].pgno * f.psize
    targets = list(range(at // block + 2, (at + (8 << 20)) // block + 1))
    assert targets == [2, 3, 4] and size > 5 * block
    _check_blocks_past_leaf_64(path, leaves, size, targets,
                               dict(read_ahead_kb=128, max_sectors_kb=128))


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_a_block_with_a_few_pages_cached_is_still_asked_for(tmp_path):
    """The walk of test_walk_in_file_order_keeps_blocks_asked_for_well_ahead
    where 4 pages spread over each of blocks 2 to 4 (the first, the last
    and two between) are in the OS cache already.  The blocks are not, and
    the advice brings them whole.  (Sampling a few pages with reads took
    such a block for cached and never asked for it; a read that misses
    starts one of its own, so the sample found pages a moment later.)"""
    path = str(tmp_path)
    f, leaves, size = _appended(path, 12000)
    block = 2 << 20
    targets = [2, 3, 4]
    spread = [b * block + (block - 1) // 3 * i for b in targets
              for i in range(4)]

    def cache_spread_pages():
        fd = os.open(f.path, os.O_RDONLY)
        try:
            # (one page each: no read-ahead for this descriptor)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for at in spread:
                os.pread(fd, 1, at)
            assert all(cached_pages(fd, at, 1) for at in spread)
        finally:
            os.close(fd)

    _check_blocks_past_leaf_64(path, leaves, size, targets,
                               dict(read_ahead_kb=128, max_sectors_kb=128),
                               before=cache_spread_pages)


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_walk_in_file_order_asks_twice_a_large_window_ahead(tmp_path):
    """The same walk where the OS's read-ahead window is 8 MiB: the OS
    reads its next window only when the walk reaches the current one, so
    the walk keeps the blocks up to twice the window past the leaf it
    enters asked for.  Entering leaf 64, the blocks 12 to 16 MiB into the
    file (past anything the OS's own read-ahead of the first 256 KiB
    reaches) arrive whole in the OS cache; without read-ahead they do
    not."""
    path = str(tmp_path)
    f, leaves, size = _appended(path, 30000)
    block = 2 << 20
    at = leaves[64].pgno * f.psize
    targets = list(range((at + (10 << 20)) // block + 1,
                         (at + (16 << 20)) // block))
    assert targets == [6, 7] and size > 9 * block
    _check_blocks_past_leaf_64(path, leaves, size, targets,
                               dict(read_ahead_kb=8192))


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_cold_walk_from_the_disk_keeps_asking_ahead(tmp_path):
    """A cold walk of a 48 MiB appended layout from the machine's own disk
    (nothing forced), its window 128 KiB.  The walk tells the device from
    the OS cache by how long its reads take; the blocks it asked for ahead
    arrive fast because it asked.  Taken as the OS cache's, they made it
    stop asking after a few batches (and wait for the device at every
    block after).  Stopped three quarters in, the blocks 2-8 MiB past it
    are in the OS cache: it still asks."""
    path = str(tmp_path)
    f, leaves, size = _appended(path, 48000)
    block = 2 << 20
    stop = len(leaves) * 3 // 4
    at = leaves[stop].pgno * f.psize
    ahead = [(b * block, block)
             for b in range(at // block + 2, (at + (8 << 20)) // block)]
    assert len(ahead) >= 2 and (at + (8 << 20)) < size
    records = sum(len(p.nodes) for p in leaves[:stop])
    fd = os.open(f.path, os.O_RDONLY)
    try:
        with device_queue(path, read_ahead_kb=128, max_sectors_kb=128):
            evict(fd, [(0, size)])
            t0 = time.perf_counter()
            os.pread(fd, 4096, size // 2)
            if time.perf_counter() - t0 < 50e-6:
                pytest.skip("the disk serves a page as fast as the OS cache")
            evict(fd, [(0, size)])
            env = lmdbio.open(path, readonly=True, lock=False, max_dbs=2)
            try:
                with env.begin(db=env.open_db(b"t")) as txn:
                    cur = _walk(txn, records)
                    assert cur.key() == leaves[stop].nodes[0].key
                    cached = wait_cached(fd, ahead, 10)
            finally:
                env.close()
    finally:
        os.close(fd)
    assert all(cached), (sum(map(bool, cached)), len(cached))


@pytest.mark.parametrize("window", ["8 MiB", "128 KiB"])
def test_walk_leaves_spread_by_values_to_the_os_window(tmp_path, window):
    """A CIFAR-like appended layout (one 3 KiB value to an overflow page,
    so 680 KiB of values between two leaves), walked from a device (as if:
    $LMDBIO_READAHEAD_DEVICE=1).  Past its first batch of leaves (64), the
    walk reads its way to each next leaf through the values before it:
    with the OS reading 8 MiB ahead, that leaf is read alone, the ones
    after it left to the OS's window; with a 128 KiB window the walk reads
    the 2 MiB blocks around its batches.  Either way the step into leaf 64
    makes a few read calls, not one for each leaf or advice after it (the
    code before r15 made 673)."""
    path = str(tmp_path)
    items = [(b"%06d" % i, bytes([i % 251]) * 3000) for i in range(14000)]
    write_items(path, items, name=b"t")
    f, leaves = _leaves_in_key_order(path)
    fd = os.open(f.path, os.O_RDONLY)
    try:
        if window == "128 KiB" and cached_pages(fd, 0, 1) is None:
            pytest.skip("no cachestat(2): advice probes the OS cache by "
                        "reading (4 calls a region)")
    finally:
        os.close(fd)
    pgnos = [p.pgno for p in leaves]
    assert pgnos == sorted(pgnos) and len(pgnos) >= 64 + 10
    assert max(b - a for a, b in zip(pgnos, pgnos[1:])) * f.psize < 2 << 20
    # the records before leaf 64 (the first leaf past the first batch)
    before = sum(len(p.nodes) for p in leaves[:64])
    queue = ({"read_ahead_kb": 8192} if window == "8 MiB" else
             {"read_ahead_kb": 128, "max_sectors_kb": 128})
    with device_queue(path, **queue):
        env = open_sub(path, CONFIGS[5])     # readahead-device
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                cur = txn.cursor()
                assert cur.first()
                for _ in range(before - 1):
                    assert cur.next()
                r0 = read_syscalls()
                assert cur.next() and cur.key() == items[before][0]
                reads = read_syscalls() - r0
                assert list(cur) == items[before:]   # (from this record)
        finally:
            env.close()
    # (With 128 KiB the leaf came with the blocks an earlier batch read
    # around.  This once asserted 18 calls or more there: what it counted
    # were the advice's probes of the OS cache, 4 reads a region, which
    # cachestat(2) replaced.)
    assert reads < 5, reads


def test_walk_through_values_from_the_os_cache_reads_within_its_window(
        tmp_path):
    """The same CIFAR-like layout, walked from the OS cache with an 8 MiB
    window: a step into a leaf reads at most the leaves within the OS's
    window of it.  The code before read the parent's next 64 leaves there
    (40 MiB of file ahead): cold, with the device score still at "cache"
    because the OS's read-ahead served every read, those reads waited for
    the device one by one (5-7 ms stalls every 64 leaves in a 50k-record
    walk)."""
    path = str(tmp_path)
    items = [(b"%06d" % i, bytes([i % 251]) * 3000) for i in range(14000)]
    write_items(path, items, name=b"t")
    f, leaves = _leaves_in_key_order(path)
    pgnos = [p.pgno for p in leaves]
    assert pgnos == sorted(pgnos) and len(pgnos) >= 64 + 10
    window = (8192 << 10) // f.psize
    # the leaves from each one on within the window (itself included)
    within = {p.nodes[0].key: sum(1 for q in pgnos[j:] if q - p.pgno <= window)
              for j, p in enumerate(leaves) if j}
    assert max(within.values()) < 20
    steps = []
    with device_queue(path, read_ahead_kb=8192):
        env = open_sub(path, CONFIGS[2])     # fast-readahead
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                cur = txn.cursor()
                assert cur.first()
                got = [(cur.key(), cur.value())]
                while True:
                    r0 = read_syscalls()
                    if not cur.next():
                        break
                    if cur.key() in within:
                        # (one more: reading /proc/self/io)
                        steps.append((read_syscalls() - r0 - 1,
                                      within[cur.key()]))
                    got.append((cur.key(), cur.value()))
        finally:
            env.close()
    assert got == items
    assert len(steps) == len(leaves) - 1
    over = [(j, n, w) for j, (n, w) in enumerate(steps) if n > w]
    assert not over, over[:3]


def test_buffers_view_the_page(tmp_path):
    path = str(tmp_path)
    items = [(b"%05d" % i, b"%d" % i * (1 + i % 50)) for i in range(3000)]
    items.append((b"zbig", b"B" * 20000))   # an overflow value
    write_items(path, items)
    env = lmdbio.open(path, readonly=True, lock=False)
    try:
        with env.begin(buffers=True) as txn:
            got = []
            for k, v in txn.cursor():
                assert isinstance(k, memoryview) and k.readonly
                assert isinstance(v, memoryview) and v.readonly
                got.append((bytes(k), bytes(v)))
            assert got == sorted(items)
            v = txn.get(b"zbig")
            assert isinstance(v, memoryview) and bytes(v) == b"B" * 20000
            assert bytes(txn.get(b"00007")) == items[7][1]
    finally:
        env.close()


def test_one_page_overflow_values_read_ahead(tmp_path):
    """Values just over half a page (one overflow page each, as a CIFAR-like
    Caffe LMDB): read ahead with their leaf, equal to py-lmdb both ways and
    by get; a damaged overflow page that a batch read ahead raises only
    when its record is reached."""
    path = str(tmp_path)
    items = [(b"%05d" % i, bytes([i % 251]) * (2100 + i % 900))
             for i in range(1500)]
    write_items(path, items, name=b"t")
    ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
    try:
        want = {m: run(ref, [("iter", m, 10 ** 6)], False)
                for m in ("iternext", "iterprev")}
        gets = [("get", items[i][0]) for i in range(0, 1500, 7)]
        want_gets = run(ref, gets, False)
    finally:
        ref.close()
    assert want["iternext"][0] == items
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            for m, w in want.items():
                assert run(env, [("iter", m, 10 ** 6)], False) == w, cfg[0]
            assert run(env, gets, False) == want_gets, cfg[0]
        finally:
            env.close()

    f = LmdbFile(path)
    node = [nd for p in f.leaves("t") for nd in p.nodes if nd.key == b"00030"][0]
    ov = struct.unpack_from("<Q", f.buf, node.data_offset)[0]
    patch(f.path, ov * f.psize + 10, "<H", 0x02)   # a leaf's flags
    for cfg in CONFIGS:
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                assert scan_to_damage(txn) == items[:30], cfg[0]
        finally:
            env.close()


def test_keys_only_walk_reads_its_leaves_not_the_values(tmp_path):
    """A walk over keys alone (iternext(values=False), iternext_nodup) of
    a tree whose values fill the file (torchvision's LSUN lists its keys
    so): as from a device, it reads its leaves, not the blocks around
    them nor the value runs ahead, so most of the file stays out of the
    OS cache (before: all of it came in).  The keys are py-lmdb's, and a
    value asked for on the way is read then."""
    import random
    path = str(tmp_path)
    rng = random.Random(3)
    items = [(b"%06d" % i, bytes([i % 251]) * rng.randrange(6000, 20000))
             for i in range(2000)]
    write_items(path, rng.sample(items, len(items)), map_size=1 << 30)
    with lmdb.open(path, readonly=True, lock=False) as w:
        st_ = w.stat()
    assert st_["overflow_pages"] > 4 * st_["leaf_pages"]
    fd = os.open(LmdbFile(path).path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pages = size // 4096
        if cached_pages(fd, 0, size) is None:
            pytest.skip("cachestat(2) is not available to count cached pages")
        keys = [k for k, _ in items]
        for meth, kw, want in (("iternext", {"values": False}, keys),
                               ("iternext_nodup", {}, keys),
                               ("iterprev", {"values": False}, keys[::-1])):
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if cached_pages(fd, 0, size) > pages // 20:
                pytest.skip("the OS cache kept the file (cannot evict it)")
            env = open_sub(path, ("device", {"LMDBIO_READAHEAD_DEVICE": "1"},
                                  {}))
            try:
                with env.begin() as txn:
                    cur = txn.cursor()
                    got = []
                    for k in getattr(cur, meth)(**kw):
                        got.append(k)
                        if len(got) == 1000:   # a value on the way
                            assert cur.value() == dict(items)[k]
                    assert got == want
            finally:
                env.close()
            time.sleep(0.5)   # (advice would have been read by now)
            cached = cached_pages(fd, 0, size)
            assert cached < pages // 4, (meth, cached, pages)
    finally:
        os.close(fd)
