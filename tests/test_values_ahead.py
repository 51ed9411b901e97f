"""Values read ahead by a cursor's worker thread (csrc/ahead.c).

A forward walk over values in overflow runs out of file order (keys put in
random order) hands the runs of the next values in the leaf to a worker,
which reads them from the last back while the walk reads from the first.

* Any program of cursor operations over such a database equals py-lmdb and
  the reference path (one value at a time, no worker), whatever the worker
  has read when the cursor moves elsewhere.
* The worker runs while a walk needs it and ends with its cursor (closed,
  its transaction ended, its environment closed), or after a moment
  without work (a walk paused), when the walk's next batch starts
  another.
* A damaged run that the worker read raises nothing until the walk gets
  there, and then what the reference path raises; every value before it
  comes out whole.
* Values the program keeps never change, however the batch they came from
  ends.
* A child forked in the middle of a batch walks on, reading what the
  parent's worker had not.
* From a device, the runs ahead are asked for with the 2 MiB blocks around
  them (each block holds values the walk reads later).
"""

from __future__ import annotations

import os
import random
import struct
import time

import pytest

from lmdb_fixtures import LmdbFile, patch_page_header, write_items
from test_big_values import (ONE_AT_A_TIME, PS, configs, key_of, program_st,
                             run, scan_to_error, sizes_st, value_of)
from test_cursor_readahead import CONFIGS, check_advice, norm, open_sub

from conftest import import_subject, require

hypothesis = require("hypothesis", "pip install hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

lmdb = require("lmdb", "pip install lmdb")
lmdbio = import_subject("lmdbio")

WORKER = CONFIGS[2]   # read-ahead on, as lmdbio.open gives it


def scattered(path, sizes, seed=0):
    """Database t: values of `sizes` put in random key order (their runs
    out of file order); the items in key order."""
    items = [(key_of(i), value_of(i, s)) for i, s in enumerate(sizes)]
    put = list(items)
    random.Random(seed).shuffle(put)
    write_items(path, put, name=b"t")
    return items


def workers():
    """Threads of this process that are value workers."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % t) as fh:
                n += fh.read().strip() == "lmdbio-values"
        except FileNotFoundError:   # (ended meanwhile)
            pass
    return n


def test_programs_over_scattered_runs_match_pylmdb_and_the_reference(
        tmp_path):
    count = [0]

    @settings(max_examples=60, deadline=None)
    @given(sizes=sizes_st(), seed=st.integers(0, 99), data=st.data())
    def inner(sizes, seed, data):
        count[0] += 1
        path = str(tmp_path / ("p%d" % count[0]))
        items = scattered(path, sizes, seed)
        program = data.draw(program_st(len(items)))
        buffers = data.draw(st.booleans())
        ref = lmdb.open(path, readonly=True, lock=False, max_dbs=4)
        try:
            want = run(ref, program, buffers)
        finally:
            ref.close()
        for cfg in configs(path) + [ONE_AT_A_TIME]:
            env = open_sub(path, cfg)
            try:
                assert run(env, program, buffers) == want, cfg[0]
                assert run(env, [("iter", ("iternext", {}, 10 ** 6))],
                           buffers) == [items], cfg[0]
            finally:
                env.close()
    inner()


def test_the_worker_runs_for_a_walk_and_ends_with_its_cursor(tmp_path):
    path = str(tmp_path)
    items = scattered(path, [3000] * 400)
    base = workers()
    env = open_sub(path, WORKER)
    db = env.open_db(b"t")
    txn = env.begin(db=db)
    cur = txn.cursor()
    it = iter(cur)
    assert [next(it) for _ in range(10)] == items[:10]
    assert workers() == base + 1        # the walk's values: read by it
    cur.close()
    assert workers() == base

    # a walk paused: its worker ends, and the walk goes on with another
    cur = txn.cursor()
    it = iter(cur)
    assert [next(it) for _ in range(10)] == items[:10]
    assert workers() == base + 1
    deadline = time.monotonic() + 10
    while workers() > base and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workers() == base
    assert list(it) == items[10:]
    cur.close()
    assert workers() == base

    # a transaction ended mid-walk, then its environment closed (a new
    # environment: the last one's cache holds values the walks read)
    cur = txn = None
    env.close()
    env = open_sub(path, WORKER)
    txn2 = env.begin(db=env.open_db(b"t"))
    it = iter(txn2.cursor())
    assert [next(it) for _ in range(10)] == items[:10]
    assert workers() == base + 1
    txn2.abort()
    with pytest.raises(lmdbio.Error):
        next(it)
    env.close()
    del it
    assert workers() == base

    # no worker where the runs are in file order: they are read several
    # a request (here a run out of order every 40 values)
    inorder = str(tmp_path / "inorder")
    sizes = [3000] * 400
    put = [(key_of(i), value_of(i, s)) for i, s in enumerate(sizes)]
    for i in range(0, 400, 40):    # (its run lands after the next ones)
        put[i], put[i + 1] = put[i + 1], put[i]
    write_items(inorder, put, name=b"t")
    env = open_sub(inorder, WORKER)
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            got, most = [], 0
            for kv in txn.cursor():
                got.append(kv)
                most = max(most, workers())
            assert got == sorted(put)
            assert most == base
    finally:
        env.close()

    # no worker without read-ahead (nor for the reference path)
    for cfg in (CONFIGS[1], ONE_AT_A_TIME):
        env = open_sub(path, cfg)
        try:
            with env.begin(db=env.open_db(b"t")) as txn:
                it = iter(txn.cursor())
                assert [next(it) for _ in range(10)] == items[:10]
                assert workers() == base, cfg[0]
        finally:
            env.close()


@pytest.mark.parametrize("field", [dict(pgno_field=1), dict(flags=0x02),
                                   dict(pages=0)],
                         ids=["page-number", "flags", "no-pages"])
@pytest.mark.parametrize("at", [1, 17, 39])
def test_a_damaged_run_read_by_the_worker_raises_when_the_walk_gets_there(
        tmp_path, field, at):
    """The worker reads the batch's last runs first: a damaged run near the
    end of the leaf was read (and found damaged) long before the walk
    gets there."""
    path = str(tmp_path)
    items = scattered(path, [3000] * 40)
    f = LmdbFile(path)
    run_of = {nd.key: struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
              for nd in f.bigdata_nodes("t")}
    bad = run_of[key_of(at)]
    patch_page_header(f.path, bad, f.psize, **field)

    got, err = scan_to_error(path, WORKER)
    assert got == items[:at]
    assert err is not None and "page %d" % bad in err[1], err
    assert scan_to_error(path, ONE_AT_A_TIME) == (got, err)


def test_values_kept_by_the_program_never_change(tmp_path):
    """Values taken from a batch, then the batch left in every way: the
    cursor sent back, elsewhere, closed with its batch half read."""
    path = str(tmp_path)
    items = scattered(path, [3000] * 300 + [5000] * 100, seed=4)
    env = open_sub(path, WORKER)
    kept = []
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            cur = txn.cursor()
            for k, v in cur:
                kept.append((k, v))
                if len(kept) == 25:
                    break
            assert cur.set_range(key_of(3))
            kept.append((cur.key(), cur.value()))
            assert cur.set_range(key_of(250))
            for _ in range(7):
                kept.append((cur.key(), cur.value()))
                assert cur.next()
            back = [norm(kv) for kv in txn.cursor().iterprev()]
            cur.close()
    finally:
        env.close()
    want = dict(items)
    assert all(v == want[k] for k, v in kept)
    assert len(kept) == 33
    assert back == items[::-1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_mid_batch_walks_on(tmp_path):
    path = str(tmp_path)
    items = scattered(path, [3000] * 600, seed=2)
    env = open_sub(path, WORKER)
    try:
        with env.begin(db=env.open_db(b"t")) as txn:
            it = iter(txn.cursor())
            head = [next(it) for _ in range(5)]
            pid = os.fork()
            if pid == 0:   # the child: the rest, without the parent's worker
                ok = head + list(it) == items
                os._exit(0 if ok else 1)
            rest = list(it)
        _, status = os.waitpid(pid, 0)
    finally:
        env.close()
    assert head + rest == items
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def compact_tree(path, sizes, seed=0, key=key_of):
    """Database t with its tree pages together and its values' runs after
    them in random key order: the keys put in random order with 8-byte
    values, then in a second transaction every leaf rewritten in key order
    (the same node sizes: no split) and the values put in random key order.
    The items in key order."""
    items = [(key(i), value_of(i, s)) for i, s in enumerate(sizes)]
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    env = lmdb.open(path, map_size=1 << 30, max_dbs=4)
    try:
        db = env.open_db(b"t")
        with env.begin(write=True, db=db) as txn:
            for i in order:
                txn.put(items[i][0], b"\0" * 8)
        with env.begin(write=True, db=db) as txn:
            for k, _v in items:
                txn.put(k, b"\1" * 8)
            for i in order:
                txn.put(*items[i])
    finally:
        env.close()
    return items


@pytest.mark.skipif(os.uname().machine != "x86_64",
                    reason="cachestat(2) called by its x86-64 number")
def test_from_a_device_the_blocks_around_runs_ahead_are_asked_for(tmp_path):
    """16,000 one-page values in random key order after a compact tree (a
    74 MB file; keys of 206 bytes, 18 a leaf): walking to the first value
    as from a device brings the whole 2 MiB blocks of the runs that the
    leaf's next values use into the OS cache, pages far from any of those
    runs included (the runs alone, and what the OS reads around them,
    left those pages out); without read-ahead, nothing."""
    path = str(tmp_path)
    items = compact_tree(path, [3000] * 16000, seed=5,
                         key=lambda i: key_of(i) + b"." * 200)
    f = LmdbFile(path)
    leaves = f.leaves("t")
    tree_end = max(p.pgno for p in leaves + f.branches("t"))
    first = min(leaves, key=lambda p: p.nodes[0].key)
    runs = [struct.unpack_from("<Q", f.buf, nd.data_offset)[0]
            for nd in first.nodes]
    per_block = (2 << 20) // PS
    near = (10 << 20) // PS     # the OS's own read-ahead: up to 8 MiB
    pages = []
    for r in runs[1:]:
        if r - tree_end <= near or abs(r - runs[0]) <= near:
            continue
        b = r // per_block * per_block
        pages += [p for p in range(b, b + per_block)
                  if all(abs(p - q) * PS > (768 << 10) for q in runs)]
    assert len(pages) >= 100

    def walk_to_first(env):
        with env.begin(db=env.open_db(b"t")) as txn:
            cur = txn.cursor()
            assert cur.first() and cur.value() == items[0][1]

    size = f.file_pages() * f.psize
    check_advice(path, [(0, size)], [(p * PS, PS) for p in pages],
                 walk_to_first)
