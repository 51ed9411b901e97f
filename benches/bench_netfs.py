"""lmdbio against py-lmdb on an emulated network filesystem, cold.

    python benches/bench_netfs.py DIR [--delay-ms 0.5] [--rounds 3] [--gets 20000]

Mounts DIR through benches/fuse_latency.py (a read-only FUSE passthrough
adding DELAY to each read request and counting the requests; needs root,
libfuse2 and fusepy), reads its backing file once so that the emulated
storage costs exactly the delay, then runs each peer in a fresh process per
round, interleaved, with the mount's cached pages dropped before each run
(POSIX_FADV_DONTNEED on the mounted file).  The peers are ``lmdbio
bench``'s, run as it runs them (src/lmdbio/bench.py: imports untimed, open
included):

- ``py-lmdb walk`` / ``lmdbio walk``: ``for k, v in txn.cursor()``;
- ``py-lmdb get`` / ``lmdbio get``: ``txn.get`` of the first GETS keys of
  the Reader's shuffled order;
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
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import benchlib  # noqa: E402

bench = benchlib.bench   # the peers and fresh-process runs of lmdbio bench

# (name, lmdbio bench's peer, the peer it is compared with)
PEERS = [
    ("py-lmdb walk", "py-lmdb", "py-lmdb walk"),
    ("lmdbio walk", "lmdbio", "py-lmdb walk"),
    ("Reader key order", "lmdbio-reader", "py-lmdb walk"),
    ("Reader shuffled", "lmdbio-shuffled", "py-lmdb walk"),
    ("py-lmdb get", "py-lmdb-get", "py-lmdb get"),
    ("lmdbio get", "lmdbio-get", "py-lmdb get"),
]


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
    n = bench.describe(a.dir)["records"]
    with open(data, "rb") as f:     # the backing file in the host's cache
        while f.read(8 << 20):
            pass
    work = tempfile.mkdtemp(prefix="bench_netfs-")
    mnt = os.path.join(work, "mnt")
    keys = bench.all_keys(bench.pylmdb_module(), a.dir)
    keys = [keys[i] for i in bench.shuffled_order(len(keys)).tolist()]
    keys_file = os.path.join(work, "keys.bin")
    bench.save_keys(keys[:a.gets], keys_file)
    expect = {"py-lmdb-get": min(a.gets, n), "lmdbio-get": min(a.gets, n)}
    times = {name: [] for name, _, _ in PEERS}
    reqs = {name: [] for name, _, _ in PEERS}
    try:
        with LatencyMount(a.dir, mnt, delay_ms=a.delay_ms) as m:

            def run(peer):
                # only the mount's pages: the backing file stays cached
                bench.drop_cache(mnt, method="fadvise")
                r0 = m.stats()["requests"]
                res = bench.run_fresh(dict(
                    peer=peer, path=mnt, index_cache=os.path.join(
                        work, "index"), keys_file=keys_file))
                if res["count"] != expect.get(peer, n):
                    raise SystemExit(f"bench_netfs: {peer} read "
                                     f"{res['count']} records, expected "
                                     f"{expect.get(peer, n)}")
                return res["seconds"], m.stats()["requests"] - r0

            for peer in ("lmdbio-reader", "lmdbio-shuffled"):
                run(peer)   # the Reader's index, cached: later starts
            for k in range(a.rounds):
                for name, peer, _ in (PEERS if k % 2 == 0 else PEERS[::-1]):
                    t, r = run(peer)
                    times[name].append(t)
                    reqs[name].append(r)
                print(f"round {k + 1}/{a.rounds}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name, _, base in PEERS:
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
