#!/usr/bin/env python3
"""Distributed reading under MPI: lmdbio against Caffe- and DALI-style
sharding over py-lmdb, on the local disk (cold) and on an emulated shared
filesystem (benches/fuse_latency.py: a FUSE passthrough adding a fixed delay
per read request, mounted once per emulated node).

    python benches/bench_mpi.py                        # everything (driver)
    python benches/bench_mpi.py --sizes 1,2,4 --storage local,fuse --rounds 3 \\
        --records 200000 --delay-ms 1 --ranks-per-node 1,2 --json /tmp/mpi.json

The driver (this script without --worker) launches, for every storage,
ranks-per-node, P, round and peer (peers interleaved, order alternating
between rounds), ``mpiexec -n P python bench_mpi.py --worker ...`` from the
venv's mpich wheel, after making the storage cold, and prints one table.

Peers (one epoch each, every record of the database read once overall;
each lmdbio peer in two forms, side by side: PEER/first = a first start,
the record index built inside the timed run from an empty index cache (a
new directory per run), its reads going through the same storage as the
data's and counted with them (under a communicator the build is
cooperative: each rank parses part of the leaves); PEER/later = a later
start, the index cache filled before the rounds and loaded in the run: on
fuse from a directory read through the same mount (a shared home), on the
local disk from a local directory evicted with data.mdb before each run):

  caffe       each rank walks the whole py-lmdb cursor and keeps i % P == rank
              (Caffe's DataReader with P solvers)
  dali        each rank steps next() from the first record to its shard start
              (rank * ceil(N / P); keys only, in py-lmdb's C iterator), then
              reads its contiguous shard (NVIDIA DALI's LMDB reader)
  posix       lmdbio.Reader(rank=, world_size=) per rank, no communicator
              (pread, 4 reader threads)
  mpiio       lmdbio.Reader(comm=COMM_WORLD, engine="mpiio"): windows of
              batches, dense ones through MPI-IO collective reads, sparse
              ones through independent preads
  comm_posix  lmdbio.Reader(comm=COMM_WORLD, engine="posix"): windows agreed
              over the communicator, every one read with independent preads
  default     lmdbio.Reader(comm=COMM_WORLD): the default engine
  node_local  lmdbio.Reader(comm=, node_local=True, node_size=ranks per node):
              one reader per (emulated) node, shared-memory window (LMM)

Storage:

  local  the dataset on the local disk, data.mdb evicted from the page cache
         before each run (posix_fadvise DONTNEED); one page cache serves every rank, so every peer reads
         the file from the disk about once (lmdbio's gain there: each rank
         parses 1/P of the file)
  fuse   one FUSE mount of the dataset per emulated node (ranks-per-node
         ranks each), adding --delay-ms per read request; node k's ranks
         read through mount k, nodes share no page cache (each mount's cache
         is evicted before each run; the backing file stays in the host's
         cache, so the emulated storage costs the delay, not the disk)

Columns: wall = epoch wall time (barrier to barrier, open and the index
(built or loaded) included; max over ranks), x caffe / x dali = t(peer)/t(row) in the
same round, median over rounds; storage MB = bytes that reached storage,
summed over ranks: /proc/self/io read_bytes on local disk, the FUSE daemons'
byte counters on fuse; "x file" = that / data.mdb size; requests = read
requests that reached storage (fuse: the daemons' counters, at most 128 KiB
each, libfuse 2's limit; local: the block device's completed reads, system
wide, so other work on the machine adds to it); app requests = what the
ranks issued: lmdbio's io_stats() (pread calls) plus MPI-IO Read_all calls,
or for py-lmdb the major page faults of its mmap (each a synchronous read).

The machine has 2 vCPUs: P = 4 oversubscribes it (wall times include the
ranks waiting for a core; MPICH is told to yield while it waits).  Bytes
and request counts do not depend on that.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEERS = ["caffe", "dali", "posix", "mpiio", "node_local"]
RESULT_TAG = "BENCH_MPI_RESULT "
READER_PEERS = ("posix", "mpiio", "default", "comm_posix", "node_local",
                "node_local_posix")
FORMS = ("first", "later")
LATER_DIR = ".lmdbio-bench-index"  # the later start's cache, next to the data (fuse)

# MPICH busy-polls while waiting; on an oversubscribed machine make it yield.
MPI_ENV = {"MPIR_CVAR_POLLS_BEFORE_YIELD": "10",
           "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1"}


# --------------------------------------------------------------------------
# worker (one rank)
# --------------------------------------------------------------------------

def _majflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _read_bytes():
    try:
        with open("/proc/self/io") as f:
            for ln in f:
                if ln.startswith("read_bytes:"):
                    return int(ln.split(":")[1])
    except OSError:
        pass
    return 0


def _open_kw():
    # Caffe and DALI open read-only with readahead (no MDB_NORDAHEAD); an
    # immutable dataset on a shared filesystem: no lock file.
    return dict(readonly=True, lock=False, readahead=True, max_readers=512)


def peer_caffe(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdb
    env = lmdb.open(path, **_open_kw())
    kept = 0
    nbytes = 0
    try:
        with env.begin() as txn:
            for i, (k, v) in enumerate(txn.cursor()):
                if i % size == rank:
                    kept += 1
                    nbytes += len(v)
    finally:
        env.close()
    return kept, dict(value_bytes=nbytes)


def peer_dali(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdb
    env = lmdb.open(path, **_open_kw())
    kept = 0
    nbytes = 0
    try:
        with env.begin() as txn:
            n = txn.stat()["entries"]
            per = -(-n // size)
            start = rank * per
            cur = txn.cursor()
            cur.first()
            collections.deque(itertools.islice(
                cur.iternext(keys=True, values=False), start), maxlen=0)
            for k, v in itertools.islice(cur.iternext(), min(per, n - start)):
                kept += 1
                nbytes += len(v)
    finally:
        env.close()
    return kept, dict(value_bytes=nbytes)


def _reader_epoch(r):
    kept = 0
    nbytes = 0
    for b in r:
        kept += len(b.indices)
        nbytes += len(b.values.data)
    req, rb = r.io_stats()
    mf = getattr(r, "_mpifile", None)
    extra = dict(value_bytes=nbytes, io_requests=req, io_bytes=rb,
                 index_from_cache=bool(r.index_from_cache))
    if mf is not None:
        extra.update(mpi_requests=mf.requests, mpi_bytes=mf.bytes)
    return kept, extra


def peer_posix(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdbio
    with lmdbio.Reader(path, batch_size=bs, rank=rank, world_size=size,
                       lock=False, index_cache=index_cache) as r:
        return _reader_epoch(r)


def peer_mpiio(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdbio
    with lmdbio.Reader(path, batch_size=bs, comm=comm, engine="mpiio",
                       lock=False, index_cache=index_cache) as r:
        return _reader_epoch(r)


def peer_default(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdbio
    with lmdbio.Reader(path, batch_size=bs, comm=comm, lock=False,
                       index_cache=index_cache) as r:
        return _reader_epoch(r)


def peer_comm_posix(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdbio
    with lmdbio.Reader(path, batch_size=bs, comm=comm, engine="posix",
                       lock=False, index_cache=index_cache) as r:
        return _reader_epoch(r)


def peer_node_local(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdbio
    with lmdbio.Reader(path, batch_size=bs, comm=comm, engine="mpiio",
                       node_local=True, node_size=rpn, lock=False,
                       index_cache=index_cache) as r:
        return _reader_epoch(r)


def peer_node_local_posix(path, rank, size, n_total, bs, comm, rpn, index_cache):
    import lmdbio
    with lmdbio.Reader(path, batch_size=bs, comm=comm, engine="posix",
                       node_local=True, node_size=rpn, lock=False,
                       index_cache=index_cache) as r:
        return _reader_epoch(r)


WORKERS = dict(caffe=peer_caffe, dali=peer_dali, posix=peer_posix,
               mpiio=peer_mpiio, default=peer_default,
               comm_posix=peer_comm_posix, node_local=peer_node_local,
               node_local_posix=peer_node_local_posix)


def worker(a):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    paths = a.paths.split(",")
    path = paths[min(rank // a.rpn, len(paths) - 1)]
    fn = WORKERS[a.peer]
    import lmdbio  # noqa: F401  (import before timing)
    import lmdbio.reader  # noqa: F401  (lmdbio.Reader is imported lazily,
    import lmdbio.mpi  # noqa: F401   with numpy: not the peer's epoch)
    import lmdb  # noqa: F401
    comm.Barrier()
    rb0, mf0, c0 = _read_bytes(), _majflt(), time.process_time()
    t0 = time.perf_counter()
    caches = (a.index_cache or "").split(",")
    index_cache = caches[min(rank // a.rpn, len(caches) - 1)] or False
    if index_cache and a.per_rank_cache:
        # independent ranks on a first start: each builds its own index
        # (with one shared empty directory the later ranks could load the
        # first one's, which would no longer be a first start)
        index_cache = os.path.join(index_cache, f"rank{rank}")
    kept, extra = fn(path, rank, size, a.records, a.batch_size, comm, a.rpn,
                     index_cache)
    t_rank = time.perf_counter() - t0
    comm.Barrier()
    wall = time.perf_counter() - t0
    mine = dict(rank=rank, path=path, kept=kept, seconds=t_rank, wall=wall,
                cpu=time.process_time() - c0, read_bytes=_read_bytes() - rb0,
                majflt=_majflt() - mf0, **extra)
    everyone = comm.gather(mine, root=0)
    if rank == 0:
        print(RESULT_TAG + json.dumps(everyone), flush=True)


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------

def _block_dev_of(path):
    """/sys/block/<dev>/stat of the disk holding PATH (or None)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    p = f"/sys/dev/block/{major}:{minor}"
    if not os.path.exists(p):
        return None
    real = os.path.realpath(p)
    # a partition's stat is its own; the disk's is one level up
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)
    f = os.path.join(real, "stat")
    return f if os.path.exists(f) else None


def _dev_reads(statfile):
    if statfile is None:
        return (0, 0)
    with open(statfile) as f:
        v = f.read().split()
    return int(v[0]), int(v[2]) * 512  # reads completed, bytes read


def _venv_bin(name):
    cand = os.path.join(os.path.dirname(sys.executable), name)
    return cand if os.path.exists(cand) else shutil.which(name)


def launch(a, peer, size, paths, rpn, index_cache, timeout=900, per_rank=False):
    mpiexec = _venv_bin("mpiexec")
    if mpiexec is None:
        raise SystemExit("no mpiexec (pip install mpich)")
    cmd = [mpiexec, "-n", str(size), sys.executable, os.path.abspath(__file__),
           "--worker", "--peer", peer, "--paths", ",".join(paths),
           "--rpn", str(rpn), "--records", str(a.n_records),
           "--batch-size", str(a.batch_size)]
    if index_cache:
        cmd += ["--index-cache", index_cache]
    if per_rank:
        cmd += ["--per-rank-cache"]
    env = dict(os.environ)
    env.update(MPI_ENV)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in sys.path if p and os.path.isdir(p)])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                         timeout=timeout)
    for ln in out.stdout.splitlines():
        if ln.startswith(RESULT_TAG):
            return json.loads(ln[len(RESULT_TAG):])
    raise RuntimeError(f"{peer} P={size} failed (exit {out.returncode}):\n"
                       f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


class Storage:
    """local: one path, cold by drop_caches.  fuse: one mount per node."""

    def __init__(self, kind, source, nodes, delay_ms, mbps, base):
        self.kind = kind
        self.source = source
        self.mounts = []
        self.devstat = None
        if kind == "local":
            self.devstat = _block_dev_of(os.path.join(source, "data.mdb"))
        else:
            sys.path.insert(0, HERE)
            from fuse_latency import LatencyMount
            try:
                for k in range(nodes):
                    m = LatencyMount(source, os.path.join(base, f"node{k}"),
                                     delay_ms=delay_ms, mbps=mbps)
                    m.__enter__()
                    self.mounts.append(m)
            except BaseException:
                self.close()
                raise

    def paths(self, nodes):
        if self.kind == "local":
            return [self.source]
        return [m.mountpoint for m in self.mounts[:nodes]]

    def index_caches(self, nodes, work):
        """Per node: (directory the later start loads the index cache from,
        directory an untimed run writes it to).  fuse: a directory next to
        the data, read through node k's mount (a shared home directory);
        local: a local directory."""
        if self.kind == "local":
            d = os.path.join(work, "index-later")
            return [(d, d)]
        d = os.path.join(self.source, LATER_DIR)
        return [(os.path.join(m.mountpoint, LATER_DIR), d)
                for m in self.mounts[:nodes]]

    def make_cold(self, extra_files=()):
        if self.kind == "local":
            # Only the data file and the index cache: drop_caches would also
            # evict Python's and the libraries' files, whose re-reading
            # would be counted as the ranks' storage reads (and time).
            for f in [os.path.join(self.source, "data.mdb"), *extra_files]:
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            return
        # keep the backing file hot on the host; empty every node's cache
        with open(os.path.join(self.source, "data.mdb"), "rb") as f:
            while f.read(8 << 20):
                pass
        for m in self.mounts:
            m.drop_cache()

    def counters(self):
        """(requests, bytes) that reached storage so far."""
        if self.kind == "local":
            return _dev_reads(self.devstat)
        r = b = 0
        for m in self.mounts:
            s = m.stats()
            r += s["requests"]
            b += s["bytes"]
        return r, b

    def close(self):
        for m in self.mounts:
            try:
                m.close()
            except Exception as e:  # keep unmounting the others
                print(f"[bench_mpi] unmounting {m.mountpoint}: {e}",
                      file=sys.stderr)
        self.mounts = []


def prime_later(paths, later):
    """Untimed: write the later start's index cache of each node's path
    (through that node's mount on fuse: the cache names the file it
    indexes)."""
    import lmdbio
    for path, (_, write_dir) in zip(paths, later):
        os.makedirs(write_dir, exist_ok=True)
        with lmdbio.Reader(path, lock=False, index_cache=write_dir):
            pass


def summarize(run, file_bytes):
    ranks = run["ranks"]
    app_req = 0
    for r in ranks:
        if "io_requests" in r:
            app_req += r.get("io_requests", 0) + r.get("mpi_requests", 0)
        else:
            app_req += r["majflt"]
    return dict(
        wall=max(r["wall"] for r in ranks),
        cpu=sum(r["cpu"] for r in ranks),
        kept=sum(r["kept"] for r in ranks),
        proc_read_bytes=sum(r["read_bytes"] for r in ranks),
        storage_bytes=run["storage_bytes"],
        storage_requests=run["storage_requests"],
        app_requests=app_req,
        majflt=sum(r["majflt"] for r in ranks),
        x_file=run["storage_bytes"] / file_bytes,
    )


def driver(a):
    sys.path.insert(0, HERE)
    import benchlib
    src = benchlib.dataset_path(a.dataset, a.n_records)
    desc = benchlib.bench.describe(src)
    a.n_records = desc["records"]
    file_bytes = desc["file_bytes"]
    sizes = [int(x) for x in a.sizes.split(",")]
    peers = [p for p in a.peers.split(",") if p]
    rpns = [int(x) for x in a.ranks_per_node.split(",")]
    work = tempfile.mkdtemp(prefix="lmdbio-bench-mpi-")
    results = []

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    try:
        for kind in a.storage.split(","):
            nodes_max = max(sizes) if kind == "fuse" else 1
            st = Storage(kind, src, nodes_max, a.delay_ms, a.mbps,
                         os.path.join(work, "mnt"))
            try:
                if kind == "local":  # one real node: node_size = P
                    configs = [(size, size, 1) for size in sizes]
                else:
                    configs = [(size, rpn, -(-size // rpn)) for rpn in rpns
                               for size in sizes if rpn <= size]
                for size, rpn, nodes in configs:
                    paths = st.paths(nodes)
                    # one reader per node only where a node has ranks to share
                    base = [p for p in peers
                            if rpn > 1 or not p.startswith("node_local")]
                    ps = [f"{p}/{form}" if p in READER_PEERS else p
                          for p in base
                          for form in (FORMS if p in READER_PEERS else (None,))]
                    later = st.index_caches(nodes, work)
                    if any(p.endswith("/later") for p in ps):
                        prime_later(paths, later)
                    later_files = [os.path.join(w, f) for _, w in later
                                   for f in os.listdir(w)] if kind == "local" else []
                    runs = {p: [] for p in ps}
                    for rnd in range(a.rounds):
                        for p in (ps if rnd % 2 == 0 else ps[::-1]):
                            peer, _, form = p.partition("/")
                            cache = None
                            if form == "first":
                                cache = tempfile.mkdtemp(prefix="first-", dir=work)
                            elif form == "later":
                                cache = ",".join(r for r, _ in later)
                            st.make_cold(later_files)
                            r0, b0 = st.counters()
                            try:
                                ranks = launch(a, peer, size, paths, rpn, cache,
                                               per_rank=(form == "first" and
                                                         peer == "posix"))
                            finally:
                                if form == "first":
                                    shutil.rmtree(cache, ignore_errors=True)
                            r1, b1 = st.counters()
                            run = dict(ranks=ranks, storage_requests=r1 - r0,
                                       storage_bytes=(b1 - b0) if kind == "fuse"
                                       else sum(x["read_bytes"] for x in ranks))
                            run["dev_bytes"] = b1 - b0
                            s = summarize(run, file_bytes)
                            if s["kept"] < a.n_records:
                                raise RuntimeError(f"{p}: {s['kept']} of "
                                                   f"{a.n_records} records")
                            hits = {x.get("index_from_cache") for x in ranks}
                            if form and hits != {form == "later"}:
                                raise RuntimeError(
                                    f"{p}: index_from_cache {sorted(hits)} on a "
                                    f"{form} start")
                            run["summary"] = s
                            runs[p].append(run)
                            log(f"  {kind:5s} rpn={rpn} P={size} round {rnd + 1} "
                                f"{p:18s} wall {s['wall']:7.3f} s  storage "
                                f"{s['storage_bytes'] / 1e6:8.1f} MB "
                                f"req {s['storage_requests']:7d} "
                                f"app req {s['app_requests']:7d}")
                    results.append(dict(storage=kind, rpn=rpn, size=size,
                                        nodes=nodes, runs=runs))
            finally:
                st.close()
                shutil.rmtree(os.path.join(src, LATER_DIR), ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info = benchlib.machine_info()
    info.update(dataset=desc["name"], records=a.n_records,
                file_bytes=file_bytes, delay_ms=a.delay_ms, mbps=a.mbps,
                batch_size=a.batch_size, rounds=a.rounds, mpi_env=MPI_ENV)
    print(format_header(info))
    print(format_table(results, file_bytes))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(info=info, results=results), f, indent=1)
    return 0


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def format_header(info):
    return (f"\n# bench_mpi: {info['time']} commit {info.get('commit', '?')}; "
            f"{info.get('cpu', '?')} x{info['cpus']} (P > {info['cpus']} is "
            f"oversubscribed: wall times include waiting for a core)\n"
            f"# dataset {info['dataset']}: {info['records']} records, data.mdb "
            f"{info['file_bytes'] / 1e6:.1f} MB; Reader batch_size "
            f"{info['batch_size']} per rank; fuse: "
            f"{info['delay_ms']} ms per read request"
            + (f", {info['mbps']} MB/s per mount" if info['mbps'] else "")
            + f"; {info['rounds']} rounds interleaved, cold before each run; "
            f"load {os.getloadavg()[0]:.2f}\n"
            f"# median over rounds; x caffe / x dali = median of "
            f"t(peer)/t(row) in the same round (>1 = row faster)\n"
            f"# PEER/first = first start: the index built in the run from an "
            f"empty cache, its reads through the same storage, counted; "
            f"PEER/later = later start: the index cache loaded"
            f" (fuse: through the mount; local: evicted before each run)\n")


def format_table(results, file_bytes):
    hdr = (f"{'storage':7s} {'nodes':>5s} {'P':>2s} {'peer':22s} "
           f"{'wall s':>7s} {'x caffe':>15s} {'x dali':>15s} "
           f"{'storage MB':>10s} {'x file':>6s} {'requests':>9s} "
           f"{'app req':>8s} {'cpu s':>6s}")
    out = [hdr, "-" * len(hdr)]
    for res in results:
        runs = res["runs"]

        def ratio(ref, p):
            if ref not in runs:
                return "-"
            rs = [x["summary"]["wall"] / y["summary"]["wall"]
                  for x, y in zip(runs[ref], runs[p])]
            return f"{_med(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"

        for p, rs in runs.items():
            s = [r["summary"] for r in rs]
            out.append(
                f"{res['storage']:7s} {res['nodes']:>5d} {res['size']:>2d} {p:22s} "
                f"{_med([x['wall'] for x in s]):>7.3f} {ratio('caffe', p):>15s} "
                f"{ratio('dali', p):>15s} "
                f"{_med([x['storage_bytes'] for x in s]) / 1e6:>10.1f} "
                f"{_med([x['x_file'] for x in s]):>6.2f} "
                f"{_med([x['storage_requests'] for x in s]):>9.0f} "
                f"{_med([x['app_requests'] for x in s]):>8.0f} "
                f"{_med([x['cpu'] for x in s]):>6.2f}")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--paths", help=argparse.SUPPRESS)
    ap.add_argument("--rpn", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--index-cache", help=argparse.SUPPRESS)
    ap.add_argument("--per-rank-cache", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dataset", default="small")
    ap.add_argument("--records", type=int, default=200_000, dest="n_records",
                    help="records of the dataset (default 200000)")
    ap.add_argument("--sizes", default="1,2,4", help="P values (default 1,2,4)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"from {','.join(WORKERS)}")
    ap.add_argument("--storage", default="local,fuse")
    ap.add_argument("--ranks-per-node", default="1,2",
                    help="fuse: ranks per emulated node, comma-separated; "
                         "local disk: one node of P ranks (node_local runs "
                         "only where a node has more than one rank)")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--mbps", type=float, default=0.0,
                    help="fuse: also a per-mount bandwidth (0: off)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.worker:
        a.records = a.n_records
        worker(a)
        return 0
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
