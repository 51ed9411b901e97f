# lmdbio developer entry points.  Everything runs inside ./.venv, which is
# created and populated here from scratch (needs only python3.11, gcc, make
# and the package index).
#
#   make demo        build, then compare lmdbio with py-lmdb on a sample Caffe LMDB
#   make test        all tests: pytest (no MPI), then tests/mpi under mpiexec -n 1, 2, 4
#   make test-fast   pytest without the MPI runs
#   make test-mpi    only the MPI runs
#   make install     (re)build and install lmdbio into .venv (non-editable)
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

DEPS_STAMP := $(VENV)/.lmdbio-deps.stamp
INSTALL_STAMP := $(VENV)/.lmdbio-install.stamp

.PHONY: all venv deps install demo test test-fast test-mpi check-installed clean distclean

all: install

venv: $(VPY)

$(VPY):
	$(PYTHON) -m venv $(VENV)

deps: $(DEPS_STAMP)

$(DEPS_STAMP): requirements-dev.txt | $(VPY)
	$(PIP) install --upgrade pip
	$(PIP) install -r requirements-dev.txt
	touch $@

install: $(INSTALL_STAMP)

# Non-editable install with the build requirements from requirements-dev.txt
# (no isolated build env: faster, and the same compiler inputs every time).
$(INSTALL_STAMP): $(DEPS_STAMP) $(SOURCES)
	$(PIP) install --no-build-isolation --no-deps --force-reinstall .
	touch $@

# pytest must import the INSTALLED lmdbio, not src/lmdbio: check where
# `import lmdbio` resolves from the directory pytest runs in (without
# executing the package).
check-installed: $(INSTALL_STAMP)
	@$(VPY) -c "import importlib.util as u, os, sys; \
	s = u.find_spec('lmdbio'); o = s and s.origin; \
	ok = bool(o) and os.sep + 'site-packages' + os.sep in o; \
	print('lmdbio resolves to', o); sys.exit(0 if ok else 'lmdbio does not resolve to the installed package')"
	@if command -v mdb_stat >/dev/null 2>&1; then \
		echo "lmdb-utils: found (tests against mdb_load/mdb_dump/mdb_stat run)"; \
	else \
		echo "lmdb-utils: absent (tests that need mdb_load/mdb_dump/mdb_stat are skipped; apt-get install lmdb-utils)"; \
	fi

demo: $(INSTALL_STAMP)
	$(VPY) scripts/demo.py

test: test-fast test-mpi

test-fast: check-installed
	$(VPY) -m pytest tests --ignore=tests/mpi $(PYTEST_ARGS)

# One pytest per rank; the mpiexec is MPICH's hydra from the mpich wheel in
# .venv (oversubscribing the cores is fine).  No pytest cache: the ranks share
# the directory.  `timeout` turns a collective that never completes into a failure.
test-mpi: check-installed
	@for n in $(MPI_SIZES); do \
		echo "== mpiexec -n $$n python -m pytest tests/mpi"; \
		LMDBIO_TEST_MPI_SIZE=$$n timeout -k 10 $(MPI_TIMEOUT) $(MPIEXEC) -n $$n $(abspath $(VPY)) -m pytest \
			-p no:cacheprovider -q tests/mpi $(PYTEST_ARGS) || exit $$?; \
	done

clean:
	rm -rf build builddir dist .pytest_cache .hypothesis .benchmarks src/lmdbio/_core.c
	find src tests scripts -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
	find src -name '*.so' -delete 2>/dev/null || true
	rm -f $(INSTALL_STAMP)

distclean: clean
	rm -rf $(VENV)
