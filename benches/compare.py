#!/usr/bin/env python3
"""Side-by-side, interleaved comparison of lmdbio with its peers.  This is
``lmdbio bench`` (src/lmdbio/bench.py: the same code, options and table),
with the benchmark datasets of benches/datasets.py as the default databases
(``--dataset``: generated and cached here; the installed ``lmdbio bench``
runs this script for ``--dataset``).

    python benches/compare.py                       # small + big, hot + cold
    python benches/compare.py --datasets small --modes hot --rounds 7
    python benches/compare.py --records small=200000 --records big=1000
    python benches/compare.py --quick               # quick dataset sizes
    python benches/compare.py --datasets small --modes cold \\
        --peers py-lmdb-get,lmdbio-shuffled         # shuffled epoch
    python benches/compare.py --fresh --quick       # a fresh process per run
    python benches/compare.py /path/to/any/lmdb     # any environment
    LMDBIO_BENCH_IMPL=lmdb python benches/compare.py   # py-lmdb stands in
                                                       # for lmdbio (debug)

See ``python benches/compare.py --help`` for the peers and the columns.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

# Re-exported for scripts that imported them from here.
ALL_PEERS = benchlib.bench.ALL_PEERS
DEFAULT_PEERS = benchlib.bench.DEFAULT_PEERS
summarize = benchlib.bench.summarize
format_table = benchlib.bench.format_table


def main(argv=None):
    return benchlib.bench.main(argv, prog="compare.py",
                               resolve_dataset=benchlib.dataset_path,
                               repo=benchlib.REPO)


if __name__ == "__main__":
    sys.exit(main())
