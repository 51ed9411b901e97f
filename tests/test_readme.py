"""The README's Python examples run as written.

Every ```python block in README.md must carry a `<!-- test: NAME -->` marker
on the line before it (so none escapes this test).  Each block runs in a
fresh interpreter from a directory holding `data/demo_lmdb`, made the way
`make demo` makes it (`lmdbio convert --npz` of random 3x32x32 images).
The datum and torch examples run in tests/test_datum.py and
tests/test_torch.py (they need their own libraries); the MPI example runs
under the venv's mpiexec with 2 ranks.
"""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import lmdbio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
ELSEWHERE = {"datum-example", "torch-example"}   # run by their own test files


def _blocks():
    """[(name or None, code)] of every ```python block, in order."""
    text = open(README).read()
    out = []
    for m in re.finditer(r"(?:<!-- test: ([\w-]+) -->\s*)?```python\n(.*?)```", text, re.S):
        out.append((m.group(1), m.group(2)))
    return out


def test_every_python_block_is_tested():
    blocks = _blocks()
    assert blocks, "README.md has no python examples"
    untested = [code.splitlines()[0] for name, code in blocks if name is None]
    assert not untested, "python blocks without a <!-- test: NAME --> marker: %r" % untested
    names = [name for name, _ in blocks]
    assert len(names) == len(set(names)), names
    assert ELSEWHERE <= set(names)


def test_readme_opens_with_demo_and_test():
    text = open(README).read()
    first = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first and first.group(1).split("\n")[:2] == ["make demo", "make test"]
    assert text.index(first.group(0)) < text.index("\n## ")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """A directory with data/demo_lmdb as `make demo` writes it."""
    from lmdbio.cli import main
    d = tmp_path_factory.mktemp("readme")
    rng = np.random.default_rng(0)
    npz = d / "demo_source.npz"
    np.savez(npz, data=rng.integers(0, 256, (600, 3, 32, 32), dtype=np.uint8),
             labels=rng.integers(0, 10, 600))
    os.makedirs(d / "data")
    assert main(["convert", "--npz", "-q", str(npz), str(d / "data" / "demo_lmdb")]) == 0
    return d


def _env():
    site = os.path.dirname(os.path.dirname(lmdbio.__file__))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def _run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, "%s\n%s" % (r.stdout, r.stderr)
    return r


CASES = [name for name, _ in _blocks() if name and name not in ELSEWHERE]


@pytest.mark.parametrize("name", CASES)
def test_readme_example_runs_as_written(name, demo_dir, tmp_path):
    code = dict(_blocks())[name]
    script = tmp_path / ("%s.py" % name)
    script.write_text(code)
    shutil.rmtree(demo_dir / ".cache", ignore_errors=True)
    if "mpi4py" in code:
        pytest.importorskip("mpi4py")
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        if not os.path.exists(mpiexec):
            mpiexec = shutil.which("mpiexec")
        assert mpiexec, "mpiexec is missing (requirements-test.txt's mpich wheel brings it)"
        _run(["timeout", "-k", "10", "240", mpiexec, "-n", "2", sys.executable,
              str(script)], demo_dir)
    else:
        r = _run([sys.executable, str(script)], demo_dir)
        if name == "quick-use":
            assert r.stdout.startswith("600 records;")
