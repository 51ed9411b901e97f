"""What the machine allows: the limits the benchmarks' ratios run into.

    python benches/limits.py --dir DIR [--sizes 16,830,4096] [--json FILE]

Builds ``benches/limits.c`` with the system C compiler (``$CC``, else
``cc``) into a temporary directory and runs it over DIR's data.mdb (or a
file), hot: the file is read once first so that the page cache holds it
(the loops also hold two buffers the size of the file).
Each figure is the best of 5 rounds, on one thread and on two:

- ``seq_pread``: the file in order into one reused 2 MiB buffer (raw
  pread, the benches' ``pread`` peer);
- ``seq_pread_out``: the same reads straight into an output the size of
  the file (memory that does not stay in the CPU's caches, as batches);
- ``seq_two_copy``: into a 2 MiB buffer, then copied into the output: the
  least a reader that rearranges records does (the Reader in key order
  reads leaves, then copies keys and values into batches);
- ``memcpy``: memory to memory, the same output;
- ``rand_pread_N``: random N-byte reads at page offsets, each into the
  next place of the output (a shuffled record into its batch),
  microseconds a read, with two threads both together: K records read
  one at a time cannot take less than K times this;
- ``fault``: the first touch of a fresh 4 KiB page (every new buffer of a
  fresh process pays it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "limits.c")
UNITS = {"GB/s", "us"}


def build(workdir: str) -> str:
    """The measuring program, compiled into workdir."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("limits: no C compiler (install gcc, or set CC)")
    exe = os.path.join(workdir, "limits")
    p = subprocess.run([cc, "-O2", "-pthread", "-o", exe, SOURCE],
                       capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"limits: {cc} failed:\n{p.stderr.strip()}")
    return exe


def parse(text: str) -> list[dict]:
    """Rows (name, threads, value, unit) of the program's output."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[3] not in UNITS:
            raise ValueError(f"limits: unexpected output line {line!r}")
        rows.append(dict(name=parts[0], threads=int(parts[1]),
                         value=float(parts[2]), unit=parts[3]))
    return rows


def measure(path: str, sizes=(16, 830, 4096)) -> list[dict]:
    """Build the program, warm the file, run it: its rows."""
    with open(path, "rb") as f:    # hot: the page cache holds the file
        while f.read(8 << 20):
            pass
    workdir = tempfile.mkdtemp(prefix="lmdbio-limits-")
    try:
        exe = build(workdir)
        p = subprocess.run([exe, path] + [str(s) for s in sizes],
                           capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(p.stderr.strip() or "limits: failed")
        return parse(p.stdout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def format_rows(rows) -> str:
    out = [f"{'measure':<18} {'threads':>7} {'value':>10}", "-" * 42]
    for r in rows:
        out.append(f"{r['name']:<18} {r['threads']:>7} "
                   f"{r['value']:>10.3f} {r['unit']}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--dir", required=True,
                    help="an LMDB environment directory, or a file")
    ap.add_argument("--sizes", default="16,830,4096",
                    help="random read sizes in bytes (comma-separated)")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    path = a.dir
    if os.path.isdir(path):
        path = os.path.join(path, "data.mdb")
    if not os.path.isfile(path):
        raise SystemExit(f"limits: {path}: no such file (give --dir an LMDB "
                         f"environment directory or a file)")
    try:
        sizes = [int(s) for s in a.sizes.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s <= 0 for s in sizes):
        raise SystemExit(f"limits: --sizes wants byte counts of at least 1, "
                         f"comma-separated (as 16,830,4096), not {a.sizes!r}")
    size = os.path.getsize(path)
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if 3 * size > free:   # the output and memcpy's source, and the cache
        raise SystemExit(f"limits: {path} is {size / 1e9:.1f} GB; the loops "
                         f"hold two buffers of its size in memory and "
                         f"{free / 1e9:.1f} GB is free: use a smaller file")
    room = min(2 << 20, size - 4096)
    if room < 1 or max(sizes) > room:
        raise SystemExit(f"limits: {path}: a random read of {max(sizes)} "
                         f"bytes does not fit (at most {max(room, 0)} here: a "
                         f"larger file or smaller --sizes)")
    rows = measure(path, sizes)
    print(f"# {path}: {os.path.getsize(path) / 1e6:.1f} MB, hot, best of 5 "
          f"rounds (benches/limits.c)")
    print(format_rows(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(file=path, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
