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
    """MODULES as written in setup.py (parsed, not executed)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name == "MODULES":
                found[name] = ast.literal_eval(node.value)
    return found


def _sources_txt():
    out = []
    for line in (ROOT / "csrc" / "sources.txt").read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            out.append("csrc/" + name)
    return out


def test_setup_py_and_meson_build_the_same_sources():
    """One list of the C core (csrc/sources.txt), read by both builds."""
    listed = _sources_txt()
    assert listed and len(set(listed)) == len(listed)
    meson = (ROOT / "meson.build").read_text()
    assert "fs.read('csrc/sources.txt')" in meson
    assert not re.findall(r"'(csrc/[^']+\.c)'", meson), \
        "meson.build lists C files itself: keep them in csrc/sources.txt"
    setup_py = (ROOT / "setup.py").read_text()
    assert '"csrc", "sources.txt"' in setup_py
    assert not re.findall(r'"(csrc/[^"]+\.c)"', setup_py)
    lists = _setup_py_lists()
    assert "MODULES" in lists
    # The same extension modules: every .pyx, built by both.
    pyx = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src" / "lmdbio").glob("*.pyx"))
    assert sorted(lists["MODULES"].values()) == pyx
    sub = (ROOT / "src" / "lmdbio" / "meson.build").read_text()
    for name in lists["MODULES"]:
        assert "'%s'" % name.split(".")[-1] in sub
    # Every C file of the core is listed (a new csrc/*.c goes into the list).
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.c"))
    missing = set(on_disk) - set(listed)
    assert not missing, f"csrc files built by neither build: {sorted(missing)}"


def _defined_symbols(path):
    """Dynamic symbols a shared object defines (nm -D --defined-only)."""
    p = subprocess.run(["nm", "-D", "--defined-only", str(path)],
                       capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in p.stdout.splitlines() if line.strip()}


def _undefined_symbols(path):
    p = subprocess.run(["nm", "-D", "--undefined-only", str(path)],
                       capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in p.stdout.splitlines() if line.strip()}


def check_core_built_once(pkg):
    """The C core is one shared library in the package; each extension
    module uses it (its lio_* symbols undefined there, found through an
    $ORIGIN rpath) and carries no copy of it."""
    libs = list(pkg.glob("liblmdbio_core*.so*"))
    assert len(libs) == 1, libs
    core = _defined_symbols(libs[0])
    for sym in ("lio_verify", "lio_lock_open", "lio_datum_parse", "lio_env_open"):
        assert sym in core, sym
    for mod in ("_core", "_bulk", "_datum"):
        (ext,) = pkg.glob(mod + ".*.so")
        text = ext.read_bytes()
        assert b"$ORIGIN" in text, f"{ext.name} has no $ORIGIN rpath"
        assert not {s for s in _defined_symbols(ext) if s.startswith("lio_")}, ext
        # and no private copy either: the verifier's messages live only in the core
        assert b"not in descending order" not in text, f"{ext.name} carries the C core"
    assert b"not in descending order" in libs[0].read_bytes()
    uses = set()
    for mod in ("_core", "_bulk", "_datum"):
        (ext,) = pkg.glob(mod + ".*.so")
        uses |= {s for s in _undefined_symbols(ext) if s.startswith("lio_")}
    assert uses and uses <= core


def test_installed_package_has_one_core():
    """The meson build (pip install .): the same single core."""
    import importlib.util
    from conftest import require_lmdbio
    spec = importlib.util.find_spec("lmdbio")
    if spec is None or "site-packages" not in (spec.origin or ""):
        if require_lmdbio():
            pytest.fail("lmdbio is not installed")
        pytest.skip("lmdbio is not installed")
    check_core_built_once(Path(spec.origin).parent)


def _copy_sources(dst):
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.o", "_core.c", "_bulk.c", "_datum.c", "*.egg-info")
    for name in ("setup.py", "pyproject.toml", "meson.build", "README.md"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, dst / name)
    for name in ("csrc", "src"):  # csrc/ includes sources.txt
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
    check_core_built_once(pkg)
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


def test_one_table_of_error_codes():
    """liblmdb's error numbers are written in two places only: csrc/lmdbio.h
    for the C core and lmdbio/errors.py for Python, and they agree."""
    header = (ROOT / "csrc" / "lmdbio.h").read_text()
    c_codes = {m.group(2): int(m.group(1)) for m in re.finditer(
        r"#define LIO_\w+ \((-30\d\d\d)\)\s*/\* (MDB_\w+)", header)}
    assert len(c_codes) >= 8, c_codes
    tree = ast.parse((ROOT / "src" / "lmdbio" / "errors.py").read_text())
    py_codes = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", "")
            if name.startswith("MDB_"):
                py_codes[name] = ast.literal_eval(node.value)
    for name, code in c_codes.items():
        assert py_codes.get(name) == code, (name, code, py_codes.get(name))
    # nowhere else: no other source spells an MDB error number
    others = [p for p in list((ROOT / "csrc").glob("*.[ch]")) +
              list((ROOT / "src" / "lmdbio").glob("*.py*"))
              if p.name not in ("lmdbio.h", "errors.py")]
    for p in others:
        hits = re.findall(r"-30[78]\d\d\b", p.read_text())
        assert not hits, "%s spells MDB error numbers %s" % (p.name, hits)
