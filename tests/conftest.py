"""Shared pytest configuration for lmdbio's tests (kept small and generic).

* Hypothesis profiles: "default" (deadline=None), "ci" (derandomized, no
  example database, no shrinking; loaded automatically when CI is set) and
  "dev" (more examples).  Pick one with HYPOTHESIS_PROFILE=name.
* `subject_name` / `subject`: the module under test.  Differential and
  corruption tests run against "lmdbio" and, as a check of the tests' own
  logic, against py-lmdb ("lmdb").  LMDBIO_TEST_SUBJECTS=lmdbio (or =lmdb)
  restricts the list.  When lmdbio cannot be imported its cases are skipped
  locally but FAIL under CI (CI=true) or LMDBIO_REQUIRE=1, so a broken build
  can never pass as "skipped".
* `require(name)`: importorskip that fails under CI / LMDBIO_REQUIRE.
* `spec_shard(...)`: the ordinals a rank reads, from the documented
  sharding rule, written here independently of lmdbio's own shard_order
  (tests compare the Reader, DatumReader, the Caffe layer and the MPI
  reader against it).
* The tests/ directory is importable (pytest puts it on sys.path), so test
  modules do `from lmdb_fixtures import ...`.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

try:
    from hypothesis import HealthCheck, Phase, settings

    _common = dict(
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
    )
    settings.register_profile("default", **_common)
    # CI: no shrinking (a failure is reported unshrunk, in seconds rather
    # than minutes; reproduce and shrink it locally from the printed blob)
    settings.register_profile("ci", derandomize=True, database=None,
                              print_blob=True,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate],
                              **_common)
    settings.register_profile("dev", max_examples=1000, **_common)
    settings.load_profile(os.environ.get(
        "HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass

ALL_SUBJECTS = ("lmdbio", "lmdb")


def subject_names():
    raw = os.environ.get("LMDBIO_TEST_SUBJECTS")
    if not raw:
        return list(ALL_SUBJECTS)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if n not in ALL_SUBJECTS]
    if bad:
        raise ValueError("LMDBIO_TEST_SUBJECTS: unknown %r" % bad)
    return names


def require_lmdbio() -> bool:
    return bool(os.environ.get("CI") or os.environ.get("LMDBIO_REQUIRE"))


def require(name: str, hint: str = ""):
    """Import module NAME for a test module, like ``pytest.importorskip``,
    except that under CI or LMDBIO_REQUIRE=1 (``make test``) a missing
    module FAILS: there the test dependencies were installed, so a missing
    one is a broken setup, never a reason to skip."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        msg = "%s cannot be imported (%s)%s" % (
            name, exc, "; " + hint if hint else "")
        if require_lmdbio():
            pytest.fail(msg + " [CI / LMDBIO_REQUIRE: a missing test "
                        "dependency fails]", pytrace=False)
        pytest.skip(msg, allow_module_level=True)


def import_subject(name: str):
    """Import the module under test, or skip/fail (see the module doc)."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ImportError, or a broken extension module
        msg = "%s cannot be imported: %s: %s" % (name, type(exc).__name__, exc)
        if name == "lmdbio" and not require_lmdbio():
            pytest.skip(msg)
        pytest.fail(msg)


@pytest.fixture(params=subject_names())
def subject_name(request) -> str:
    return request.param


@pytest.fixture
def subject(subject_name):
    return import_subject(subject_name)


def spec_shard(n, p, r, shuffle=False, seed=0, epoch=0, drop_last=False, bs=1):
    """The ordinals rank R of P reads in EPOCH, from the documented rule and
    not from lmdbio: the epoch's order is ``0..n-1``, or with shuffle
    ``np.random.default_rng([seed, epoch]).permutation(n)``; drop_last=False:
    ``per = ceil(n / p)`` and rank r takes positions ``(r * per + j) % n``
    for j < per (the last shards wrap around); drop_last=True: ``per = n //
    p``, positions ``r * per + j``, cut to a multiple of the batch size."""
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(n).tolist()
    else:
        order = list(range(n))
    if drop_last:
        per = n // p
        mine = [order[r * per + j] for j in range(per)]
        mine = mine[:len(mine) // bs * bs]
    else:
        per = -(-n // p)
        mine = [order[(r * per + j) % n] for j in range(per)] if n else []
    return mine
