"""Full cursor walk, lmdbio vs py-lmdb, with the raw sequential pread as the
limit peer.  pytest benches/bench_cursor.py --benchmark-only

Groups ``cursor-<dataset>-<hot|cold>`` put the peers of one condition side
by side in pytest-benchmark's table:

- ``pread``: sequential pread of data.mdb in page-aligned 4 MiB blocks;
- ``py-lmdb``: ``for k, v in txn.cursor()`` with py-lmdb;
- ``lmdbio``: the same code with ``import lmdbio as lmdb``.

Each timed call opens the environment, walks every record and closes it
(opening is negligible next to a walk, and closing is what lets the page
cache be dropped: pages a live mmap maps survive drop_caches).
hot: one untimed warm-up pass, then LMDBIO_BENCH_ROUNDS rounds (default 5).
cold: the page cache is dropped before each of LMDBIO_BENCH_COLD_ROUNDS
rounds (default 3), in pedantic mode's setup (untimed).

pytest-benchmark runs the rounds of one peer back to back, so the ratios
quoted in the notes come from compare.py, which interleaves the peers.
"""

import pytest

import benchlib

PEERS = ["pread", "py-lmdb", "lmdbio"]
DATASETS = ["small", "big"]
CONDITIONS = ["hot", "cold"]


def _target(peer, path, request):
    if peer == "pread":
        raw = benchlib.RawPread()
        return lambda: raw(path)
    if peer == "py-lmdb":
        mod = request.getfixturevalue("pylmdb_mod")
    else:
        mod = request.getfixturevalue("lmdbio_mod")
    return lambda: benchlib.cursor_walk(mod, path)


@pytest.mark.parametrize("cond", CONDITIONS)
@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("peer", PEERS)
def test_cursor_walk(benchmark, request, bench_dataset, cold_cache, rounds,
                     peer, dataset, cond):
    path = bench_dataset(dataset)
    m = benchlib.meta(path)
    fn = _target(peer, path, request)
    expect = m["file_bytes"] if peer == "pread" else m["records"]

    benchmark.group = f"cursor-{dataset}-{cond}"
    benchmark.extra_info.update(
        dataset=dataset, cond=cond, peer=peer, records=m["records"],
        file_bytes=m["file_bytes"], payload_bytes=m["key_bytes"] + m["value_bytes"],
        lmdbio_impl=benchlib.impl_name() if peer == "lmdbio" else None)

    if cond == "hot":
        assert fn() == expect  # warm-up pass (and a count check), untimed
        result = benchmark.pedantic(fn, rounds=rounds["hot"], iterations=1)
    else:
        methods = set()

        def setup():
            methods.add(cold_cache.drop(path))

        result = benchmark.pedantic(fn, setup=setup, rounds=rounds["cold"],
                                    iterations=1)
        benchmark.extra_info["cold_method"] = ",".join(sorted(methods))
    assert result == expect
    st = getattr(benchmark.stats, "stats", None)  # None with --benchmark-disable
    if st is not None and st.median > 0:
        benchmark.extra_info["records_per_s_median"] = m["records"] / st.median
        benchmark.extra_info["file_GBps_median"] = m["file_bytes"] / st.median / 1e9
