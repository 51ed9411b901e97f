#!/usr/bin/env python3
"""An emulated shared (network) filesystem: a read-only FUSE passthrough that
adds a fixed delay to every read request and counts requests and bytes.

    python benches/fuse_latency.py SOURCE_DIR MOUNTPOINT [--delay-ms 1.0]
                                   [--mbps 0] [--threads-note]
    cat MOUNTPOINT/.fuse_stats          # {"requests": ..., "bytes": ..., ...}
    umount MOUNTPOINT                   # (or fusermount -u) ends the daemon

from Python (what benches/bench_mpi.py does)::

    from fuse_latency import LatencyMount
    with LatencyMount("/data/small", "/tmp/node0", delay_ms=1.0) as m:
        ...  # read /tmp/node0/data.mdb
        m.stats()  # -> dict(requests=..., bytes=..., sizes={...},
                   #            max_inflight=...)

Why: on one machine every process shares one page cache, so a local disk
hides the seed paper's cost (every process's reads reaching storage, each a
network round trip).  Mount the same directory once per emulated node: each
mount is its own FUSE inode with its own page cache, so ranks of node k
share node k's cache (the data files are opened with keep_cache, as a
node's kernel would keep them), and nothing is shared between nodes.  What
reaches the daemon is what would cross the network: ``requests`` and
``bytes`` count it, and each request waits ``delay_ms`` (+ bytes / ``mbps``)
before the daemon's pread of the backing file, in its own thread (libfuse's
multi-threaded loop), so concurrent requests overlap as they would on a
parallel filesystem.  The kernel splits reads into requests of at most
128 KiB (libfuse 2's limit; ``sizes`` in the stats is the histogram).

Needs libfuse 2 (``apt-get install libfuse2 fuse``) and fusepy (``pip
install fusepy``); mounting needs root or a usable fusermount.  The backing
file is best kept in the host's page cache (read it once) so that the
emulated storage costs exactly the added delay.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

STATS_NAME = ".fuse_stats"


def _make_ops(source: str, delay: float, mbps: float):
    """The fusepy Operations object (imported lazily: fusepy is optional)."""
    from fuse import FuseOSError, Operations

    class LatencyFS(Operations):
        def __init__(self):
            self.root = os.path.realpath(source)
            self._mu = threading.Lock()
            self.requests = 0
            self.bytes = 0
            self.opens = 0
            self.sizes = {}
            self.busy_s = 0.0
            self.inflight = 0        # requests being served now
            self.max_inflight = 0    # the most served at once so far
            self.started = time.time()

        def _full(self, path):
            return os.path.join(self.root, path.lstrip("/"))

        def _stats_blob(self):
            with self._mu:
                d = dict(requests=self.requests, bytes=self.bytes,
                         opens=self.opens, sizes=dict(self.sizes),
                         delay_ms=delay * 1e3, mbps=mbps, pid=os.getpid(),
                         source=self.root, busy_s=self.busy_s,
                         max_inflight=self.max_inflight)
            return (json.dumps(d) + "\n").encode()

        # -- metadata ----------------------------------------------------
        def getattr(self, path, fh=None):
            if path == "/" + STATS_NAME:
                now = time.time()
                return dict(st_mode=stat.S_IFREG | 0o444, st_nlink=1,
                            st_size=1 << 16, st_mtime=now, st_ctime=now,
                            st_atime=now)
            try:
                st = os.lstat(self._full(path))
            except OSError as e:
                raise FuseOSError(e.errno)
            return {k: getattr(st, k) for k in (
                "st_mode", "st_nlink", "st_size", "st_uid", "st_gid",
                "st_atime", "st_mtime", "st_ctime")}

        def readdir(self, path, fh):
            names = [".", ".."] + os.listdir(self._full(path))
            if path == "/":
                names.append(STATS_NAME)
            return names

        def access(self, path, mode):
            if mode & os.W_OK:
                raise FuseOSError(errno.EROFS)
            if path != "/" + STATS_NAME and not os.access(self._full(path), mode):
                raise FuseOSError(errno.EACCES)

        def statfs(self, path):
            sv = os.statvfs(self.root)
            return {k: getattr(sv, k) for k in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        # -- data --------------------------------------------------------
        def open(self, path, fi):
            if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
                raise FuseOSError(errno.EROFS)
            if path == "/" + STATS_NAME:
                fi.fh = 0
                fi.direct_io = 1  # never cached: every read is fresh
                return 0
            try:
                fi.fh = os.open(self._full(path), os.O_RDONLY)
            except OSError as e:
                raise FuseOSError(e.errno)
            fi.keep_cache = 1  # the node's page cache survives reopening
            with self._mu:
                self.opens += 1
            return 0

        def read(self, path, size, offset, fi):
            if fi.fh == 0:
                return self._stats_blob()[offset:offset + size]
            t0 = time.perf_counter()
            with self._mu:
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
            wait = delay + (size / (mbps * 1e6) if mbps > 0 else 0.0)
            if wait > 0:
                time.sleep(wait)
            data = os.pread(fi.fh, size, offset)
            dt = time.perf_counter() - t0
            with self._mu:
                self.inflight -= 1
                self.requests += 1
                self.bytes += len(data)
                k = str(size)
                self.sizes[k] = self.sizes.get(k, 0) + 1
                self.busy_s += dt
            return data

        def release(self, path, fi):
            if fi.fh:
                os.close(fi.fh)
            return 0

        def readlink(self, path):
            return os.readlink(self._full(path))

    return LatencyFS()


def serve(source: str, mountpoint: str, delay_ms: float = 1.0,
          mbps: float = 0.0) -> None:
    """Mount and serve in the foreground until unmounted."""
    from fuse import FUSE
    ops = _make_ops(source, delay_ms / 1e3, mbps)
    FUSE(ops, mountpoint, foreground=True, nothreads=False, ro=True,
         raw_fi=True, default_permissions=True, fsname="lmdbio-latency",
         subtype="latency")


def unmount(mountpoint: str) -> None:
    for cmd in (["fusermount", "-u", "-z", mountpoint],
                ["umount", "-l", mountpoint]):
        if shutil.which(cmd[0]) is None:
            continue
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            return


class LatencyMount:
    """Context manager: mount SOURCE at MOUNTPOINT through a daemon
    subprocess (this file, foreground), wait for the mount, unmount and reap
    the daemon on exit."""

    def __init__(self, source: str, mountpoint: str, delay_ms: float = 1.0,
                 mbps: float = 0.0, python: str | None = None):
        self.source = os.path.realpath(source)
        self.mountpoint = mountpoint
        self.delay_ms = delay_ms
        self.mbps = mbps
        self.python = python or sys.executable
        self.proc = None
        self.log = None

    def __enter__(self):
        os.makedirs(self.mountpoint, exist_ok=True)
        if os.path.ismount(self.mountpoint):
            raise RuntimeError(f"{self.mountpoint} is already a mount point")
        # The daemon's messages go to a file, never to a pipe nobody reads
        # (a full pipe would block the daemon, and every reader with it).
        self.log = tempfile.NamedTemporaryFile(
            prefix="fuse_latency-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [self.python, os.path.abspath(__file__), self.source,
             self.mountpoint, "--delay-ms", str(self.delay_ms),
             "--mbps", str(self.mbps)],
            stdout=subprocess.DEVNULL, stderr=self.log)
        t0 = time.time()
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None:
                err = self.messages()
                self.close()
                raise RuntimeError(f"FUSE mount of {self.mountpoint} failed: {err}")
            if time.time() - t0 > 20:
                self.close()
                raise RuntimeError(f"FUSE mount of {self.mountpoint} timed out")
            time.sleep(0.02)
        return self

    def messages(self) -> str:
        """What the daemon printed so far (fusepy's error reports)."""
        try:
            with open(self.log.name, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stats(self) -> dict:
        with open(os.path.join(self.mountpoint, STATS_NAME), "rb") as f:
            return json.loads(f.read())

    def drop_cache(self) -> None:
        """Evict the mount's page cache of every regular file (the backing
        files stay cached on the host: only the emulated node goes cold)."""
        for name in os.listdir(self.mountpoint):
            p = os.path.join(self.mountpoint, name)
            if name == STATS_NAME or not os.path.isfile(p):
                continue
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def close(self):
        if self.proc is None:
            return
        unmount(self.mountpoint)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        msgs = self.messages()
        self.log.close()
        os.unlink(self.log.name)
        if msgs.strip():
            print(f"[fuse_latency] {self.mountpoint}: {msgs[-2000:]}",
                  file=sys.stderr)
        try:
            os.rmdir(self.mountpoint)
        except OSError:
            pass

    def __exit__(self, *exc):
        self.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--delay-ms", type=float, default=1.0,
                    help="added latency per read request (default 1.0)")
    ap.add_argument("--mbps", type=float, default=0.0,
                    help="also wait bytes / (MBPS * 1e6) s per request (0: off)")
    a = ap.parse_args(argv)
    serve(a.source, a.mountpoint, a.delay_ms, a.mbps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
