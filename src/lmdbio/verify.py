"""``lmdbio verify``: check every structural invariant of an LMDB file.

The walk itself is C (csrc/verify.c): every tree (free DB, main DB, named
DBs, duplicate sub-trees) is read page by page and checked against the
format (docs/format.md): page headers and node bounds, depth, key order
within and across pages under each tree's comparator, overflow runs,
sub-pages, database records and their counts, free-list records, and that
every page up to ``mm_last_pg`` is reachable exactly once or listed free
exactly once.  Each problem is reported with its page number; the exit
status is 0 only for a clean file.

    lmdbio verify [-n] [-s subdb] [-m max] [--progress|--no-progress] PATH

``-n``: PATH is the data file itself (``subdir=False``); ``-s``: check only
that named database (no page accounting); ``-m``: stop after this many
problems (default 1000, 0 = no limit).  Progress goes to stderr every 1024
pages when stderr is a terminal, or always with ``--progress``.
"""

import os
import sys

__all__ = ["verify", "main"]

USAGE = ("usage: %s [-n] [-s subdb] [-m max-problems] [--progress] "
         "dbpath\n")


def verify(path, *, subdir=True, name=None, progress=None,
           progress_every=4096, max_problems=0):
    """Verify the newest snapshot of the environment at `path`.

    ``subdir``: `path` is a directory (``True``) or the data file.
    ``name``: check only this named database (bytes or str); default every
    tree.  ``progress``: a callable ``progress(done, total)``, called every
    ``progress_every`` pages read.  ``max_problems``: stop collecting after
    this many problems (0: no limit).

    Returns ``(problems, stats)``: problems a list of ``(pgno, message)``
    (pgno None where no page applies), stats a dict (``pages_read``,
    ``trees``, ``named_dbs``, ``free_pages``, ...).  A file that cannot even
    be opened raises the lmdbio error that says why."""
    import lmdbio
    lock = os.path.exists(os.path.join(path, "lock.mdb") if subdir
                          else os.fspath(path) + "-lock")
    try:
        env = lmdbio.open(path, subdir=subdir, readonly=True, lock=lock,
                          max_dbs=0)
    except lmdbio.Error:
        if not lock:
            raise
        # a lock file we may not use: read without it
        env = lmdbio.open(path, subdir=subdir, readonly=True, lock=False,
                          max_dbs=0)
    try:
        return env._verify(name=name, progress=progress,
                           progress_every=progress_every,
                           max_problems=max_problems)
    finally:
        env.close()


def main(prog, args, io, backend=None):
    """The ``verify`` command of lmdbio's CLI (see cli.py)."""
    from lmdbio.cli import _parse

    opts = {"n": False, "s": None, "m": 1000, "progress": None, "bad": False}
    rest = []
    for a in args:
        if a == "--progress":
            opts["progress"] = True
        elif a == "--no-progress":
            opts["progress"] = False
        else:
            rest.append(a)

    def handle(c, arg):
        if c == "n":
            opts["n"] = True
        elif c == "s":
            opts["s"] = arg
        elif c == "m":
            try:
                opts["m"] = int(arg)
            except ValueError:
                io.error("%s: -m needs a number, not %r\n" % (prog, arg))
                opts["bad"] = True
        else:
            opts["bad"] = True

    operands = _parse(prog, rest, "ns:m:", io, handle)
    if opts["bad"] or len(operands) != 1:
        io.error(USAGE % prog)
        return 2
    path = operands[0]
    show = opts["progress"]
    if show is None:
        try:
            show = os.isatty(io.err.fileno())
        except (AttributeError, OSError, ValueError):
            show = False
    state = {"shown": False}

    def progress(done, total):
        state["shown"] = True
        io.error("\r%s: %d of %d pages read" % (prog, done, total))

    import lmdbio
    name = os.fsencode(opts["s"]) if opts["s"] is not None else None
    try:
        problems, st = verify(path, subdir=not opts["n"], name=name,
                              progress=progress if show else None,
                              progress_every=1024, max_problems=max(0, opts["m"]))
    except lmdbio.NotFoundError:
        if state["shown"]:
            io.error("\n")
        io.error("%s: %s: no database named %r\n" % (prog, path, opts["s"]))
        return 1
    except lmdbio.Error as e:
        if state["shown"]:
            io.error("\n")
        io.write(("%s: cannot be read: %s\n" % (path, e)).encode(
            "utf-8", "replace"))
        return 1
    if state["shown"]:
        io.error("\n")
    for pgno, msg in problems:
        io.write((msg + "\n").encode("utf-8", "replace"))
    what = ("named DB %r" % opts["s"]) if opts["s"] is not None else "file"
    if problems:
        more = " (stopped at the limit, -m)" if (
            opts["m"] and len(problems) >= opts["m"]) else ""
        io.write(("%s: %d problem%s found in the %s%s (%d pages read)\n" % (
            path, len(problems), "" if len(problems) == 1 else "s", what,
            more, st["pages_read"])).encode("utf-8", "replace"))
        return 1
    io.write(("%s: ok: txn %d, %d trees, %d named DBs, %d pages read, "
              "%d free pages, last page %d\n" % (
                  path, st["txnid"], st["trees"], st["named_dbs"],
                  st["pages_read"], st["free_pages"], st["last_pg"])).encode())
    return 0
