"""Check every structural invariant of an LMDB file (``lmdbio verify``).

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
pages when stderr is a terminal, or always with ``--progress``.  The command
itself lives in lmdbio.cli; this module is the library call it makes.
"""

import os

__all__ = ["verify"]

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
    ``trees``, ``named_dbs``, ``free_pages``, ``notes``, ...).  ``notes``
    lists, as ``(pgno, message)``, what is not damage but worth knowing:
    the page counts of DUPSORT databases, which liblmdb 0.9.24 and older
    keep without their duplicate sub-trees' pages, and later versions keep
    inexactly once duplicates are deleted.  A file that cannot even
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
