"""setup.py (setuptools + Cython) builds the same lmdbio as meson, and it works.

The sources are copied to a temporary directory and built there with
`setup.py build_py build_ext` (the repository is left untouched); the result
is imported from that directory in a fresh interpreter, which reads a small
database written by py-lmdb and must see exactly what py-lmdb sees.
"""

import ast
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not (ROOT / "setup.py").is_file() or not (ROOT / "csrc").is_dir(),
    reason="needs the source tree (setup.py, csrc/), not an installed copy",
)


def _setup_py_lists():
    """C_SOURCES and MODULES as written in setup.py (parsed, not executed)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name in ("C_SOURCES", "MODULES"):
                found[name] = ast.literal_eval(node.value)
    return found


def test_setup_py_and_meson_build_the_same_sources():
    lists = _setup_py_lists()
    assert "C_SOURCES" in lists and "MODULES" in lists
    meson = (ROOT / "meson.build").read_text()
    meson_c = re.findall(r"'(csrc/[^']+\.c)'", meson)
    assert meson_c, "no csrc/*.c listed in meson.build"
    assert sorted(lists["C_SOURCES"]) == sorted(meson_c)
    assert len(set(meson_c)) == len(meson_c)
    # The same extension modules: every .pyx, built by both.
    pyx = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src" / "lmdbio").glob("*.pyx"))
    assert sorted(lists["MODULES"].values()) == pyx
    sub = (ROOT / "src" / "lmdbio" / "meson.build").read_text()
    for name in lists["MODULES"]:
        assert "'%s'" % name.split(".")[-1] in sub
    # Every C file of the core is built by both (a new csrc/*.c must be added to both).
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.c"))
    missing = set(on_disk) - set(lists["C_SOURCES"])
    assert not missing, f"csrc files built by neither build: {sorted(missing)}"


def _copy_sources(dst):
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "_core.c", "_bulk.c", "_datum.c", "*.egg-info")
    for name in ("setup.py", "pyproject.toml", "meson.build", "README.md"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, dst / name)
    for name in ("csrc", "src"):
        shutil.copytree(ROOT / name, dst / name, ignore=ignore)


def _sample_items():
    """Small but not trivial: several leaf and branch pages, overflow values, empty values."""
    items = {}
    for i in range(1500):
        key = b"%08d" % (i * 7919 % 100003)
        if i % 97 == 0:
            val = bytes(range(256)) * 40  # 10 KiB: overflow pages
        elif i % 31 == 0:
            val = b""
        else:
            val = (b"v%d-" % i) * (1 + i % 13)
        items[key] = val
    items[b"\x00"] = b"lowest key"
    items[b"\xff" * 200] = b"long high key"
    return items


@pytest.fixture(scope="module")
def setuptools_build(tmp_path_factory):
    pytest.importorskip("setuptools")
    pytest.importorskip("Cython")
    tmp = tmp_path_factory.mktemp("setuptools_build")
    src = tmp / "src_copy"
    src.mkdir()
    _copy_sources(src)
    lib = tmp / "lib"
    cmd = [
        sys.executable, "setup.py", "-q",
        "build_py", "--build-lib", str(lib),
        "build_ext", "--build-lib", str(lib), "--build-temp", str(tmp / "temp"),
    ]
    proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (
        f"setup.py build failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return lib


def test_setuptools_build_produces_the_package(setuptools_build):
    pkg = setuptools_build / "lmdbio"
    assert (pkg / "__init__.py").is_file()
    for mod in ("_core", "_bulk"):
        exts = list(pkg.glob(mod + "*.so"))
        assert len(exts) == 1, f"expected one compiled {mod}, found {exts}"
    # every pure-Python module of the source tree is in the build
    want = sorted(p.name for p in (ROOT / "src" / "lmdbio").glob("*.py"))
    have = sorted(p.name for p in pkg.glob("*.py"))
    assert have == want


def test_setuptools_build_reads_like_pylmdb(setuptools_build, tmp_path):
    lmdb = pytest.importorskip("lmdb")
    db = tmp_path / "db"
    items = _sample_items()
    env = lmdb.open(str(db), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for k, v in items.items():
            txn.put(k, v)
    env.close()

    env = lmdb.open(str(db), readonly=True, lock=False)
    with env.begin() as txn:
        expected = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    env.close()
    assert expected == sorted(items.items())  # the oracle itself is sane

    out = tmp_path / "out.pickle"
    probe_keys = [k for k, _ in expected[::50]] + [b"no such key", b"\x00\x00"]
    script = textwrap.dedent(
        """
        import os, pickle, sys
        lib, db, out, keys = sys.argv[1], sys.argv[2], sys.argv[3], pickle.loads(bytes.fromhex(sys.argv[4]))
        sys.path.insert(0, lib)
        import lmdbio, lmdbio._core
        env = lmdbio.open(db, readonly=True, lock=False)
        with env.begin() as txn:
            items = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
            gets = [txn.get(k) for k in keys]
            gets = [None if g is None else bytes(g) for g in gets]
        env.close()
        with open(out, "wb") as f:
            pickle.dump({
                "file": lmdbio.__file__, "core": lmdbio._core.__file__,
                "items": items, "gets": gets,
            }, f)
        """
    )
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(setuptools_build), str(db), str(out),
         pickle.dumps(probe_keys).hex()],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"reading with the setuptools build failed:\n{proc.stderr[-8000:]}"
    with open(out, "rb") as f:
        res = pickle.load(f)

    # The import really came from the setuptools build, not the installed package.
    assert Path(res["file"]).resolve().parent == (setuptools_build / "lmdbio").resolve()
    assert Path(res["core"]).resolve().parent == (setuptools_build / "lmdbio").resolve()

    got = res["items"]
    assert len(got) == len(expected)
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert got == expected
    assert res["gets"] == [items.get(k) for k in probe_keys]
