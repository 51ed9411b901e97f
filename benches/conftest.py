"""pytest fixtures for the lmdbio benchmarks (run: pytest benches/ --benchmark-only).

Benchmark files are named bench_*.py so that ``pytest tests/`` (and the
default python_files = test_*.py) never collects them; this conftest collects
them only when benches/ (or a file in it) is named on the command line, or
with LMDBIO_BENCH=1.

Fixtures
--------
bench_dataset   function(name, records=None) -> environment directory; each
                dataset is generated once and cached under $LMDBIO_BENCH_DIR
                (default <repo>/data/bench); LMDBIO_BENCH_QUICK=1 for the
                quick sizes.
cold_cache      helper: cold_cache.drop(path) evicts the file from the page
                cache (drop_caches as root, else posix_fadvise DONTNEED) and
                returns the method used; cold_cache.method is the last one,
                cold_cache.cached(path) the fraction still cached.
lmdbio_mod      the module behind the "lmdbio" peer (skips when it does not
                import; LMDBIO_BENCH_IMPL=lmdb makes py-lmdb stand in).
rounds          {"hot": N, "cold": M} from LMDBIO_BENCH_ROUNDS /
                LMDBIO_BENCH_COLD_ROUNDS (defaults 5 and 3).
"""

from __future__ import annotations

import fnmatch
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import benchlib  # noqa: E402


def _benches_requested(config) -> bool:
    if os.environ.get("LMDBIO_BENCH", "") == "1":
        return True
    base = Path(config.invocation_params.dir)
    for a in config.args:
        p = (base / a.split("::")[0]).resolve()
        if p == HERE or HERE in p.parents:
            return True
    return False


def pytest_collect_file(file_path, parent):
    name = file_path.name
    if file_path.suffix != ".py" or not name.startswith("bench_"):
        return None
    config = parent.config
    if any(fnmatch.fnmatch(name, pat) for pat in config.getini("python_files")):
        return None  # the project's own config collects it already
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest collects it already
    if not _benches_requested(config):
        return None
    return pytest.Module.from_parent(parent, path=file_path)


def pytest_report_header(config):
    return (f"lmdbio benches: data in {benchlib.bench_dir()}, "
            f"quick={benchlib.quick()}, lmdbio peer = {benchlib.impl_name()}")


@pytest.fixture(scope="session")
def bench_dataset():
    cache = {}

    def get(name: str, records: int | None = None) -> str:
        k = (name, records)
        if k not in cache:
            cache[k] = benchlib.dataset_path(name, records)
        return cache[k]

    return get


class ColdCache:
    def __init__(self):
        self.method = None

    def drop(self, *paths: str) -> str:
        self.method = benchlib.drop_cache(*paths)
        return self.method

    @staticmethod
    def cached(path: str) -> float:
        if os.path.isdir(path):
            path = os.path.join(path, "data.mdb")
        return benchlib.cached_fraction(path)


@pytest.fixture(scope="session")
def cold_cache():
    return ColdCache()


@pytest.fixture(scope="session")
def lmdbio_mod():
    try:
        return benchlib.lmdbio_module()
    except ImportError as e:
        pytest.skip(f"lmdbio peer unavailable ({benchlib.impl_name()}): {e}")


@pytest.fixture(scope="session")
def pylmdb_mod():
    return benchlib.pylmdb_module()


@pytest.fixture(scope="session")
def rounds():
    return {"hot": int(os.environ.get("LMDBIO_BENCH_ROUNDS", "5")),
            "cold": int(os.environ.get("LMDBIO_BENCH_COLD_ROUNDS", "3"))}
