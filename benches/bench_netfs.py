"""lmdbio against py-lmdb on an emulated network filesystem, cold.

    python benches/bench_netfs.py DIR [--delay-ms 0.5] [--rounds 3] [--gets 20000]

Mounts DIR through benches/fuse_latency.py (a read-only FUSE passthrough
adding DELAY to each read request and counting the requests; needs root,
libfuse2 and fusepy), reads its backing file once so that the emulated
storage costs exactly the delay, then runs each peer in a fresh process per
round, interleaved, with the mount's cached pages dropped before each run
(POSIX_FADV_DONTNEED on the mounted file):

- ``py-lmdb walk`` / ``lmdbio walk``: ``for k, v in txn.cursor()``;
- ``py-lmdb get`` / ``lmdbio get``: ``txn.get`` of GETS keys in a shuffled
  order (the database's keys must be ``b"%08d" % i``, as benches/datasets.py
  writes them);
- ``Reader key order`` / ``Reader shuffled``: one epoch, later start (the
  index cached by a run before the rounds).

Prints the median seconds, the median requests that reached the mount, and
the ratio to py-lmdb's walk (the walks and the Reader) or get (the gets),
per round (>1: faster than py-lmdb).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

WALK = r'''
import sys, time
m = __import__(sys.argv[2])
t0 = time.perf_counter()
env = m.open(sys.argv[1], readonly=True, lock=False)
n = 0
with env.begin() as txn:
    for k, v in txn.cursor():
        n += 1
env.close()
print(time.perf_counter() - t0)
'''

GET = r'''
import random, sys, time
m = __import__(sys.argv[2])
n, gets = int(sys.argv[3]), int(sys.argv[4])
keys = [b"%08d" % i for i in range(n)]
random.Random(0).shuffle(keys)
keys = keys[:gets]
t0 = time.perf_counter()
env = m.open(sys.argv[1], readonly=True, lock=False)
with env.begin() as txn:
    for k in keys:
        if txn.get(k) is None:
            sys.exit("key %r is missing: keys must be b'%%08d' %% i" % k)
env.close()
print(time.perf_counter() - t0)
'''

READER = r'''
import sys, time
import lmdbio
lmdbio.Reader   # (the Reader's modules imported before timing)
t0 = time.perf_counter()
with lmdbio.Reader(sys.argv[1], index_cache=sys.argv[2],
                   shuffle=sys.argv[3] == "1", seed=0) as r:
    for b in r:
        pass
print(time.perf_counter() - t0)
'''


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("dir", help="an LMDB environment directory")
    ap.add_argument("--delay-ms", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gets", type=int, default=20000)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    data = os.path.join(a.dir, "data.mdb")
    if not os.path.isfile(data):
        raise SystemExit(f"bench_netfs: {data}: no such file (give an LMDB "
                         f"environment directory)")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise SystemExit("bench_netfs: mounting needs root and /dev/fuse")
    try:
        from fuse_latency import LatencyMount
        import fuse  # noqa: F401
    except (ImportError, OSError) as exc:
        raise SystemExit(f"bench_netfs: {exc} (pip install fusepy; "
                         f"apt-get install libfuse2 fuse)")
    import lmdb
    env = lmdb.open(a.dir, readonly=True, lock=False)
    n = env.stat()["entries"]
    env.close()
    with open(data, "rb") as f:     # the backing file in the host's cache
        while f.read(8 << 20):
            pass
    work = tempfile.mkdtemp(prefix="bench_netfs-")
    mnt, cache = os.path.join(work, "mnt"), os.path.join(work, "index")
    py = sys.executable
    peers = [
        ("py-lmdb walk", [WALK, "{m}", "lmdb"], "py-lmdb walk"),
        ("lmdbio walk", [WALK, "{m}", "lmdbio"], "py-lmdb walk"),
        ("Reader key order", [READER, "{m}", cache, "0"], "py-lmdb walk"),
        ("Reader shuffled", [READER, "{m}", cache, "1"], "py-lmdb walk"),
        ("py-lmdb get", [GET, "{m}", "lmdb", str(n), str(a.gets)],
         "py-lmdb get"),
        ("lmdbio get", [GET, "{m}", "lmdbio", str(n), str(a.gets)],
         "py-lmdb get"),
    ]
    times = {p: [] for p, _, _ in peers}
    reqs = {p: [] for p, _, _ in peers}
    try:
        with LatencyMount(a.dir, mnt, delay_ms=a.delay_ms) as m:
            mdata = os.path.join(mnt, "data.mdb")

            def run(args):
                drop(mdata)
                r0 = m.stats()["requests"]
                p = subprocess.run([py, "-c"] + [x.format(m=mnt) for x in args],
                                   capture_output=True, text=True)
                if p.returncode:
                    raise SystemExit(f"bench_netfs: {p.stderr.strip()}")
                return float(p.stdout.split()[-1]), m.stats()["requests"] - r0

            for shuffle in ("0", "1"):   # the Reader's index, cached
                run([READER, mnt, cache, shuffle])
            for k in range(a.rounds):
                for name, args, _ in (peers if k % 2 == 0 else peers[::-1]):
                    t, r = run(args)
                    times[name].append(t)
                    reqs[name].append(r)
                print(f"round {k + 1}/{a.rounds}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name, _, base in peers:
        ratio = [b / t for b, t in zip(times[base], times[name])]
        rows.append(dict(peer=name, seconds=statistics.median(times[name]),
                         requests=int(statistics.median(reqs[name])),
                         x=statistics.median(ratio), x_min=min(ratio),
                         x_max=max(ratio), against=base))
    print(f"# {a.dir}: {n} records, cold, FUSE mount adding {a.delay_ms} ms "
          f"a read request; medians of {a.rounds} interleaved rounds, each "
          f"run a fresh process")
    print(f"{'peer':<18} {'seconds':>8} {'requests':>9}  x against (min-max)")
    for r in rows:
        print(f"{r['peer']:<18} {r['seconds']:8.3f} {r['requests']:9d}  "
              f"{r['x']:.2f}x {r['against']} ({r['x_min']:.2f}-{r['x_max']:.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
