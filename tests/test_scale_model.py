"""benches/scale_model.py: the model's byte and request counts are the ones
the Reader really issues (its own counters), at P = 1, 2, 4, on small
databases; the fast planner replay equals the simple one; a projection runs
in seconds."""

import dataclasses
import importlib.util
import os
import random
import sys
import time

import numpy as np
import pytest

lmdb = pytest.importorskip("lmdb")
import lmdbio  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benches", "scale_model.py")
if not os.path.exists(SCRIPT):  # pragma: no cover - an sdist without benches/
    pytest.skip("benches/ not in this tree", allow_module_level=True)


def _load():
    spec = importlib.util.spec_from_file_location("scale_model", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


sm = _load()


def _write(path, sizes, order=None):
    """An environment of len(sizes) records, record i holding sizes[i]
    bytes, put in `order` (default: key order)."""
    n = len(sizes)
    env = lmdb.open(str(path), map_size=1 << 30, subdir=True)
    idx = list(range(n)) if order is None else order
    with env.begin(write=True) as txn:
        for i in idx:
            txn.put(b"%08d" % i, bytes([i % 251]) * sizes[i])
    env.close()
    return str(path)


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    rng = random.Random(7)
    base = tmp_path_factory.mktemp("scale")
    out = {}
    # inline values in key order
    out["small"] = _write(base / "small", [rng.randrange(50, 900)
                                           for _ in range(3000)])
    # overflow values (one page and several), some inline between them
    out["mixed"] = _write(base / "mixed", [
        rng.choice([300, 3085, 3085, 9000, 70000]) for _ in range(700)])
    # keys inserted in random order: leaves scattered in the file
    order = list(range(2500))
    rng.shuffle(order)
    out["scattered"] = _write(base / "scattered",
                              [rng.randrange(100, 3000) for _ in range(2500)],
                              order)
    return out


def test_layout_matches_pylmdb(dbs):
    """The layout read through lmdbio and the page parser: one entry per
    record, the value sizes py-lmdb returns, overflow exactly where the
    node does not fit in half a page."""
    for path in dbs.values():
        lay = sm.layout_from_file(path)
        env = lmdb.open(path, readonly=True, lock=False)
        with env.begin() as txn:
            sizes = [len(v) for _, v in txn.cursor()]
        env.close()
        assert lay.n_records == len(sizes)
        assert lay.vsize.tolist() == sizes
        nodemax = (((lay.psize - 16) // 2) & ~1) - 2  # LMDB me_nodemax
        big = (8 + lay.ksize + lay.vsize) > nodemax
        assert ((lay.ovpg > 0) == big).all()
        assert len(np.unique(lay.ovpg[lay.ovpg > 0])) == int(big.sum())


@pytest.mark.parametrize("name", ["small", "mixed", "scattered"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_model_counts_equal_reader_counters(dbs, name, shuffle):
    """Per rank, P = 1, 2, 4: the Reader's own counters (read requests,
    bytes) equal the model's for building the index, for an epoch iterated
    with windows held to one batch, for the same batches read with read(),
    and for windows grown as the Reader grows them."""
    path = dbs[name]
    lay = sm.layout_from_file(path)
    bs = 64 if name != "mixed" else 16
    win = sm.reader_policy()
    one = dataclasses.replace(win, window_bytes=0)  # every window one batch
    per_batch = dataclasses.replace(win, unit="batch")
    for P in (1, 2, 4):
        # (index_cache=False below: every start is a first start)
        job = sm.Job(P=P, batch_size=bs, shuffle=shuffle, index_cached=False)
        for rank in range(P):
            mapped = sm.reader_has_map(lay, job, rank)
            idx = sm.reader_open(lay, job, rank)
            kw = dict(batch_size=bs, rank=rank, world_size=P, shuffle=shuffle,
                      index_cache=False)
            # prefetch_bytes=1: the Reader's windows stay one batch each
            with lmdbio.Reader(path, prefetch_bytes=1, **kw) as r:
                opened = r.io_stats()
                n = sum(len(b) for b in r)
                req, nbytes = r.io_stats()
            ords = sm.shard(lay, rank, P, shuffle, batch_size=bs)
            assert n == len(ords)
            assert opened == (idx["requests"], idx["bytes"]), (name, P, rank)
            m = sm.model_lmdbio_rank(lay, job, one, rank,
                                     random_access=shuffle)
            got = (req - opened[0], nbytes - opened[1])
            assert got == (m["requests"], m["bytes"]), (name, P, rank)
            with lmdbio.Reader(path, **kw) as r:
                base = r.io_stats()
                for b in sm.batches(ords, bs):
                    r.read(b)
                req, nbytes = r.io_stats()
                m = sm.model_lmdbio_rank(lay, job, per_batch, rank,
                                         random_access=True)
                got = (req - base[0], nbytes - base[1])
                assert got == (m["requests"], m["bytes"]), (name, P, rank)
                read_window = getattr(r._file, "read_window", None)
                if read_window is None or win.unit != "window":
                    continue  # a Reader that plans per batch only
                base = r.io_stats()
                for w in sm.steps_of(lay, sm.batches(ords, bs), win, mapped):
                    ends = np.minimum(np.arange(bs, len(w) + bs, bs), len(w))
                    read_window(w, ends, True, independent=True)
                req, nbytes = r.io_stats()
                m = sm.model_lmdbio_rank(lay, job, win, rank,
                                         random_access=True, load=False)
                got = (req - base[0], nbytes - base[1])
                assert got == (m["requests"], m["bytes"]), (name, P, rank)


def _coalesce_simple(offs, lens, contig, max_gap, max_read, max_segs):
    """csrc/plan.c's lio_plan_add, one extent at a time."""
    reads, cur, cur_len, nseg = [], None, 0, 0
    for o, ln, c in zip(offs, lens, contig):
        if ln == 0:
            continue
        if cur is not None:
            gap = o - (cur + cur_len)
            if gap <= max_gap and cur_len + gap + ln <= max_read and \
                    nseg + 2 <= max_segs:
                nseg += 2 if gap > 0 else (0 if c else 1)
                cur_len += gap + ln
                continue
            reads.append((cur, cur_len))
        cur, cur_len, nseg = o, ln, 1
    if cur is not None:
        reads.append((cur, cur_len))
    return reads


def _first_start_as_modelled(path, bs, records):
    """A first start in key order, one batch a window (prefetch_bytes=1):
    the (requests, bytes) the Reader counted, asserted equal to the
    model's."""
    lay = sm.layout_from_file(path)
    job = sm.Job(P=1, batch_size=bs, shuffle=False, index_cached=False)
    one = dataclasses.replace(sm.reader_policy(), window_bytes=0)
    with lmdbio.Reader(path, batch_size=bs, prefetch_bytes=1,
                       index_cache=False) as r:
        opened = r.io_stats()
        assert sum(len(b) for b in r) == records
        req, nbytes = r.io_stats()
    got = (req - opened[0], nbytes - opened[1])
    m = sm.model_lmdbio_rank(lay, job, one, 0, random_access=False)
    assert got == (m["requests"], m["bytes"])
    return got


def test_first_start_reads_its_leaves_about_once(tmp_path):
    """A first start in key order over leaves that hold an even count of
    records, windows of a few hundred leaves: each window reads ahead the
    leaves it expects to count with a margin that narrows to the error the
    expectations made before (lio_leaves_ahead), so the margins' leaves,
    read by both neighbours, stay few.  The fixed margin of 1/32 read 9.1%
    more than the leaves; the model replays the same requests."""
    path = _write(tmp_path / "even", [60] * 120000)
    got = _first_start_as_modelled(path, 8192, 120000)
    lay = sm.layout_from_file(path)
    leaf_bytes = lay.n_leaves * lay.psize
    assert got[1] < 1.075 * leaf_bytes, got[1] / leaf_bytes


def test_first_start_takes_values_from_the_counting_reads(tmp_path):
    """A first start over one-page values written after their leaf (the
    benches' mixed, 8000 records): the counting reads the leaves with the
    values between them bridged, and those are copied from there rather
    than read again (1.83x the file's bytes before, 1.11x now); the model
    replays the same requests."""
    if os.path.dirname(SCRIPT) not in sys.path:
        sys.path.insert(0, os.path.dirname(SCRIPT))
    import datasets   # (benches/datasets.py)
    path = str(tmp_path / "mixed")
    datasets.generate("mixed", path, records=8000)
    got = _first_start_as_modelled(path, 256, 8000)
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    assert got[1] < 1.2 * size, got[1] / size


def test_coalesce_fast_equals_simple():
    rng = np.random.default_rng(3)
    for trial in range(300):
        n = int(rng.integers(0, 400))
        lens = rng.integers(0, 20000, n)
        gaps = rng.choice([0, 0, 0, 16, 4000, 70000, 1 << 20], n)
        offs = np.cumsum(gaps + np.r_[0, lens[:-1]]) if n else np.zeros(0)
        contig = rng.random(n) < 0.5
        max_gap = int(rng.choice([0, 4096, 64 << 10]))
        max_read = int(rng.choice([16384, 1 << 20, 8 << 20]))
        max_segs = int(rng.choice([4, 16, 1024]))
        want = _coalesce_simple(offs.tolist(), lens.tolist(), contig.tolist(),
                                max_gap, max_read, max_segs)
        got = sm.coalesce(offs, lens, contig, max_gap, max_read, max_segs)
        assert got == want, trial


def test_coalesce_equals_the_c_planner():
    """Against lmdbio's own planner (csrc/plan.c through _bulk.plan_reads,
    whose destinations follow each other exactly when the extents do)."""
    from lmdbio import _bulk
    if not hasattr(_bulk, "plan_reads"):
        pytest.skip("this lmdbio has no _bulk.plan_reads")
    rng = np.random.default_rng(5)
    for trial in range(200):
        n = int(rng.integers(0, 3000))
        lens = rng.integers(1, 20000, n)
        gaps = rng.choice([0, 0, 16, 4000, 20000, 70000, 600000], n)
        offs = np.cumsum(gaps + np.r_[0, lens[:-1]]) if n else np.zeros(0)
        contig = np.r_[False, gaps[1:] == 0] if n else np.zeros(0, bool)
        max_gap = int(rng.choice([0, 16000, 64 << 10, 500000]))
        max_read = int(rng.choice([1 << 20, 8 << 20, 8_000_000]))
        want = [(o, ln) for o, ln, _ in
                _bulk.plan_reads(offs, lens, max_gap, max_read)]
        assert sm.coalesce(offs, lens, contig, max_gap, max_read) == want, trial


def test_romio_sieve_covers_every_extent_once():
    reads = [(0, 100), (150, 50), (10 << 20, 4096), ((10 << 20) + 8192, 10)]
    out = sm.romio_sieve(reads, 4 << 20)
    # the first buffer spans the first two extents and the hole between
    assert out[0] == (0, 4 << 20)
    assert out[1][0] == 10 << 20
    assert out[-1][0] + out[-1][1] == (10 << 20) + 8192 + 10
    for off, ln in reads:
        assert any(o <= off and off + ln <= o + n for o, n in out)
    assert sm.romio_sieve(reads, 0) == reads


def test_per_window_reads_each_leaf_once():
    """A window plans its leaves once: never more requests than per batch,
    the same bytes on an appended layout read in order."""
    lay = sm.synthetic_layout("t", 20000, 3087, key_bytes=8)
    job = sm.Job(P=2, batch_size=256)
    b = sm.model_lmdbio_rank(lay, job, sm.Policy(unit="batch"), 0)
    w = sm.model_lmdbio_rank(lay, job, sm.Policy(unit="window"), 0)
    g = sm.model_lmdbio_rank(lay, job, sm.reader_policy(), 0)
    assert g["steps"] < b["steps"]
    assert w["requests"] < b["requests"]
    assert w["steps"] < b["steps"]
    per = lay.file_bytes / 2
    assert 0.9 * per < w["bytes"] <= b["bytes"] < 1.1 * per


def test_projection_runs_in_seconds():
    t0 = time.perf_counter()
    lay = sm.cifar_layout()
    rows = sm.project(lay, sm.PFS, {"batch": sm.Policy()}, Ps=[1, 36, 1024])
    assert time.perf_counter() - t0 < 60
    by = {(r["reader"], r["P"]): r for r in rows}
    # Caffe-style: every node reads the whole file; lmdbio: the job reads
    # it about once whatever P
    for P in (36, 1024):
        nodes = -(-P // 36)
        assert by["caffe", P]["machine_bytes"] >= nodes * lay.file_bytes * 0.99
        assert by["posix", P]["machine_bytes"] < 1.2 * lay.file_bytes
        assert by["posix", P]["epoch_s"] < by["caffe", P]["epoch_s"]
    lim = sm.limits(lay, sm.PFS)
    assert lim["index_bytes_per_rank"] == 16 * lay.n_leaves
