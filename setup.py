"""setuptools + Cython build of lmdbio: the same sources as meson.build.

The supported build is meson-python (``pip install .``, see pyproject.toml).
This file is the fallback for environments without meson, e.g.::

    python setup.py build_ext --inplace
    python setup.py build_py --build-lib OUT build_ext --build-lib OUT

The project metadata (name, dependencies, console script) comes from
pyproject.toml's [project] table, which setuptools reads too; only what is
dynamic or build-specific is given here.  Keep C_SOURCES equal to the list in
meson.build (tests/test_build_setuptools.py checks it).
"""

import os
import re

from setuptools import Extension, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

C_SOURCES = [
    "csrc/format.c",
    "csrc/pager.c",
    "csrc/cursor.c",
    "csrc/io_posix.c",
    "csrc/lockfile.c",
    "csrc/plan.c",
    "csrc/index.c",
    "csrc/bulk.c",
    "csrc/datum.c",
    "csrc/verify.c",
    "csrc/memsrc.c",
]
# Extension modules: the drop-in API, the bulk path and the Datum decoder,
# each over the core.
MODULES = {
    "lmdbio._core": "src/lmdbio/_core.pyx",
    "lmdbio._bulk": "src/lmdbio/_bulk.pyx",
    "lmdbio._datum": "src/lmdbio/_datum.pyx",
}


def _version():
    """The version is kept once, in meson.build's project() call."""
    with open(os.path.join(HERE, "meson.build"), encoding="utf-8") as f:
        m = re.search(r"\bversion\s*:\s*'([^']+)'", f.read())
    if not m:
        raise RuntimeError("no version: '...' found in meson.build")
    return m.group(1)


def _numpy_include():
    try:
        import numpy
    except ImportError:  # numpy headers are not needed by the core yet
        return []
    return [numpy.get_include()]


def _extensions():
    from Cython.Build import cythonize

    # Test builds (make test-sanitize): $LMDBIO_CFLAGS is appended to the
    # compile and link flags (so its -O wins), $LMDBIO_MODULES limits the
    # modules built (e.g. "_core,_bulk").
    extra = os.environ.get("LMDBIO_CFLAGS", "").split()
    only = [m for m in os.environ.get("LMDBIO_MODULES", "").split(",") if m]
    exts = [Extension(
        name,
        sources=[pyx] + C_SOURCES,
        include_dirs=["csrc"] + _numpy_include(),
        define_macros=[
            ("_POSIX_C_SOURCE", "200809L"),
            ("_FILE_OFFSET_BITS", "64"),
            ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
            ("NDEBUG", None),
        ],
        extra_compile_args=["-std=c99", "-O2", "-pthread"] + extra,
        extra_link_args=["-pthread"] + extra,
    ) for name, pyx in MODULES.items()
        if not only or name.rsplit(".", 1)[1] in only]
    return cythonize(exts, compiler_directives={"language_level": "3"})


setup(
    version=_version(),
    package_dir={"": "src"},
    packages=find_packages("src"),
    ext_modules=_extensions(),
    zip_safe=False,
)
