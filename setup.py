"""setuptools + Cython build of lmdbio: the same sources as meson.build.

The supported build is meson-python (``pip install .``, see pyproject.toml).
This file is the fallback for environments without meson, e.g.::

    python setup.py build_ext --inplace
    python setup.py build_py --build-lib OUT build_ext --build-lib OUT

The project metadata (name, dependencies, console script) comes from
pyproject.toml's [project] table, which setuptools reads too; only what is
dynamic or build-specific is given here.  The C core's files are listed once,
in csrc/sources.txt, which meson.build reads too; as with meson, the core is
compiled once into lmdbio/liblmdbio_core.so, which every extension module
links with an $ORIGIN rpath (tests/test_build_setuptools.py checks both).
"""

import os
import re

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

def _core_sources():
    """The C core's files, from csrc/sources.txt (meson.build reads it too)."""
    out = []
    with open(os.path.join(HERE, "csrc", "sources.txt"), encoding="utf-8") as f:
        for line in f:
            name = line.split("#", 1)[0].strip()
            if name:
                out.append("csrc/" + name)
    return out


C_SOURCES = _core_sources()
CORE_LIB = "lmdbio_core"  # lmdbio/liblmdbio_core.so, linked by every module
DEFINES = [
    ("_POSIX_C_SOURCE", "200809L"),
    ("_FILE_OFFSET_BITS", "64"),
    ("NDEBUG", None),
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
        sources=[pyx],
        include_dirs=["csrc"] + _numpy_include(),
        define_macros=DEFINES + [
            ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-std=c99", "-O2", "-pthread"] + extra,
        extra_link_args=["-pthread", "-Wl,-rpath,$ORIGIN"] + extra,
        libraries=[CORE_LIB],
    ) for name, pyx in MODULES.items()
        if not only or name.rsplit(".", 1)[1] in only]
    return cythonize(exts, compiler_directives={"language_level": "3"})


class BuildExtWithCore(build_ext):
    """build_ext that first builds the C core once, as
    lmdbio/liblmdbio_core.so beside the modules (what meson.build does)."""

    def build_extensions(self):
        if self.extensions:
            self._build_core()
        build_ext.build_extensions(self)

    def _build_core(self):
        extra = os.environ.get("LMDBIO_CFLAGS", "").split()
        pkg_dir = os.path.dirname(self.get_ext_fullpath(self.extensions[0].name))
        os.makedirs(pkg_dir, exist_ok=True)
        target = os.path.join(pkg_dir, "lib%s.so" % CORE_LIB)
        objects = self.compiler.compile(
            C_SOURCES, output_dir=self.build_temp, macros=DEFINES,
            include_dirs=["csrc"],
            extra_postargs=["-std=c99", "-O2", "-fPIC", "-pthread"] + extra)
        self.compiler.link_shared_object(
            objects, target, extra_postargs=["-pthread"] + extra)
        for ext in self.extensions:
            if pkg_dir not in ext.library_dirs:
                ext.library_dirs.append(pkg_dir)


setup(
    version=_version(),
    package_dir={"": "src"},
    packages=find_packages("src"),
    ext_modules=_extensions(),
    cmdclass={"build_ext": BuildExtWithCore},
    zip_safe=False,
)
