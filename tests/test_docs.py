"""The documentation: every public callable says what each of its arguments
is, and nothing in the repository's documentation points outside it.

(`make docs` builds the site with warnings as errors; CI runs it.)
"""

import importlib
import inspect
import os
import re

import pytest

import lmdbio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The public API: lmdbio's names and the documented submodules' __all__.
MODULES = ["lmdbio.reader", "lmdbio.datum", "lmdbio.caffe", "lmdbio.torch"]
EXTRA = ["lmdbio.verify.verify"]


def _public():
    objs = {}
    for name in lmdbio.__all__:
        obj = getattr(lmdbio, name)
        if name.startswith("_") or (isinstance(obj, type) and issubclass(obj, BaseException)):
            continue
        objs["lmdbio." + name] = obj
    objs["lmdbio.DatumReader"] = lmdbio.DatumReader
    for m in MODULES:
        try:
            mod = importlib.import_module(m)
        except ImportError as e:       # lmdbio.torch without torch
            if "torch" not in str(e):
                raise
            continue
        for name in mod.__all__:
            obj = getattr(mod, name)
            if not (isinstance(obj, type) and issubclass(obj, BaseException)):
                objs[m + "." + name] = obj
    for path in EXTRA:
        m, _, name = path.rpartition(".")
        objs[path] = getattr(importlib.import_module(m), name)
    return objs


def _callables():
    """(qualified name, callable, docstring that must name its arguments)."""
    out = []
    for name, obj in sorted(_public().items()):
        if isinstance(obj, type):
            init_doc = vars(obj).get("__init__") and obj.__init__.__doc__
            out.append((name, obj, (obj.__doc__ or "") + (init_doc or "")))
            for k, v in sorted(vars(obj).items()):
                if k.startswith("_") or not callable(v):
                    continue
                out.append((name + "." + k, v, v.__doc__ or ""))
        elif callable(obj):
            out.append((name, obj, obj.__doc__ or ""))
    return out


CALLABLES = _callables()


def test_the_public_api_is_found():
    names = {n for n, _, _ in CALLABLES}
    for must in ["lmdbio.open", "lmdbio.Environment.begin", "lmdbio.Cursor.set_range",
                 "lmdbio.datum.decode", "lmdbio.DatumReader", "lmdbio.verify.verify"]:
        assert must in names


@pytest.mark.parametrize("name,fn,doc", CALLABLES, ids=[c[0] for c in CALLABLES])
def test_every_argument_is_documented(name, fn, doc):
    assert doc.strip(), "%s has no docstring" % name
    sig = inspect.signature(fn)      # also: signatures are visible to inspect
    missing = [p.name for p in sig.parameters.values()
               if p.name not in ("self", "cls")
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               and not re.search(r"\b%s\b" % re.escape(p.name), doc)]
    assert not missing, "%s: arguments not in its docstring: %s" % (name, missing)


# Files the project keeps elsewhere, which nothing in the repository may name.
OUTSIDE = re.compile(r"\b(api|design|lmdb-format|benchmarks|caffe-formats)\.md\b"
                     r"|issue notes|\.\./shared|shared/docs")


def _doc_texts():
    """(path, text) of the README, mkdocs.yml, docs/ pages and the
    package's sources, the C core's included."""
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "mkdocs.yml")]
    for base in ("docs", os.path.join("src", "lmdbio"), "csrc"):
        for d, _, names in os.walk(os.path.join(ROOT, base)):
            files += [os.path.join(d, n) for n in names
                      if n.endswith((".md", ".py", ".pyx", ".pyi", ".pxd",
                                     ".c", ".h"))]
    for f in sorted(files):
        yield os.path.relpath(f, ROOT), open(f, encoding="utf-8").read()


def _outside_refs(text):
    """Lines naming a file outside the repository (docs/benchmarks.md is
    the repository's own page of that name)."""
    return [line.strip() for line in text.splitlines()
            if OUTSIDE.search(line)
            and not re.search(r"docs/benchmarks\.md|\(benchmarks\.md\)|: benchmarks\.md$", line)]


def test_nothing_points_outside_the_repository():
    bad = []
    for rel, text in _doc_texts():
        bad += ["%s: %s" % (rel, r) for r in _outside_refs(text)]
    assert not bad, "\n".join(bad)


def test_local_links_resolve():
    """Every relative Markdown link in the README and docs/ names a file
    that exists (the docs build checks docs/; this checks the README too)."""
    bad = []
    for rel, text in _doc_texts():
        if not rel.endswith(".md"):
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(rel),
                                                 target.split("#")[0]))
            if not os.path.exists(path):
                bad.append("%s: %s" % (rel, target))
    assert not bad, bad


def test_mkdocs_nav_lists_existing_pages():
    text = open(os.path.join(ROOT, "mkdocs.yml")).read()
    pages = re.findall(r":\s*([\w/.-]+\.md)\s*$", text, re.M)
    assert "index.md" in pages and "reference/lmdbio.md" in pages
    missing = [p for p in pages if not os.path.exists(os.path.join(ROOT, "docs", p))]
    assert not missing, missing
