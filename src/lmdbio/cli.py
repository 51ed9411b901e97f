"""``python -m lmdbio`` / ``lmdbio``: command-line tools.

``lmdbio stat [mdb_stat options] PATH`` and ``lmdbio dump [mdb_dump options]
PATH`` take the options of LMDB's ``mdb_stat`` and ``mdb_dump`` (parsed as
glibc's getopt does: combined flags ``-ef``, ``-fff``, ``-sNAME`` or ``-s NAME``,
options after the path, ``--``) and print the same bytes on stdout, with the
same exit status, as the lmdb-utils 0.9.24 tools do for the same file. They
read the data file with lmdbio (no mmap) and create no file. The lock file is
inspected by lmdbio's lock layer (pread and lock probes, no lock taken) for
what the tools print from it (``-e``, ``-r``/``-rr`` and the dump header's
``maxreaders``); the format (meta pages, database and free-list records) is
decoded by lmdbio's C core, whichever backend runs the command. Only while another process has the
environment open (a writer may commit during a long dump) does the read
transaction hold a reader slot in it (``lock=True``), as liblmdb's tools do.

Where the tools print something that lmdbio does not have (the lock file's
reader table, the meta page's map address), this module computes what
liblmdb 0.9.24 would print, including its side effects on what it prints: a
tool that finds no other process on the lock file re-initialises the table,
so it reports 0 readers; ``-rr`` reports (but does not clear) the slots of
dead processes that liblmdb would clear; ``mdb_stat -r`` exits with status 1
(liblmdb returns ``fputs``'s result).

Only the standard library is imported at module level; the lmdbio package is
imported when a command runs. ``LMDBIO_CLI_BACKEND=lmdb`` (a development
switch) runs the commands over py-lmdb instead; the freelist (``stat -f``)
then needs a backend that has ``Environment._free_db()``.
"""

import binascii
import errno
import importlib
import os
import re
import sys

__all__ = ["main", "MDB_VERSION_STRING"]

# What `mdb_stat -V` / `mdb_dump -V` print: the output format emulated here
# is that of lmdb-utils 0.9.24 (Debian's).
MDB_VERSION_STRING = "LMDB 0.9.24: (July 24, 2019)"

def _mdb_codes():
    """{exception class name: (liblmdb code, mdb_strerror text)}, from
    lmdbio.errors (the one table of them; imported when first needed)."""
    global _MDB_CODES
    if _MDB_CODES is None:
        from lmdbio import errors
        _MDB_CODES = {cls.__name__: (code, errors.strerror(code))
                      for code, cls in errors.ERROR_MAP.items()
                      if errors.MDB_KEYEXIST <= code <= errors.MDB_ENV_ENCRYPTION}
    return _MDB_CODES


_MDB_CODES = None


def _mdb(name):
    """(code, text) of one liblmdb error, by py-lmdb's class name."""
    return _mdb_codes()[name]

_DBFLAG_LINES = (             # mdb_dump's flag lines, in its order
    ("reverse_key", b"reversekey"),
    ("dupsort", b"dupsort"),
    ("integerkey", b"integerkey"),
    ("dupfixed", b"dupfixed"),
    ("integerdup", b"integerdup"),
    ("reversedup", b"reversedup"),
)

_STAT_USAGE = "usage: %s [-V] [-n] [-e] [-r[r]] [-f[f[f]]] [-a|-s subdb] dbpath\n"
_DUMP_USAGE = "usage: %s [-V] [-f output] [-l] [-n] [-p] [-a|-s subdb] dbpath\n"

_HELP = """\
usage: lmdbio <command> [options] PATH

Read LMDB databases without mmap.

commands:
  stat    environment and database status; the options and output of mdb_stat
          [-V] [-n] [-e] [-r[r]] [-f[f[f]]] [-a|-s subdb] dbpath
  dump    dump databases in mdb_load's text format; the options and output of
          mdb_dump  [-V] [-f output] [-l] [-n] [-p] [-a|-s subdb] dbpath
  verify  check every structural invariant; each problem with its page,
          exit status 0 only for a clean file
          [-n] [-s subdb] [-m max-problems] [--progress] dbpath
  convert build a Caffe LMDB of Datums (written with py-lmdb), as Caffe's
          convert_imageset, or from a .npz of images and labels
          [--gray] [--shuffle] [--resize_height H --resize_width W]
          [--encoded] ROOTFOLDER/ LISTFILE DB_NAME
          --npz [--encoded] FILE.npz DB_NAME      (--help: all options)
  bench   lmdbio side by side with py-lmdb and a raw pread, interleaved
          rounds, hot and cold: records/s, GB/s and ratios
          [--dataset small|big|cifar|shuffled] [--quick] [--rounds N]
          [--modes hot,cold] [--peers ...] [PATH ...]  (--help: all options)

options:
  -h, --help  show this help and exit
  --version   print lmdbio's version and exit
"""


class _Exit(Exception):
    """Stop the command with this exit status (what liblmdb's tools return)."""

    def __init__(self, status):
        Exception.__init__(self, status)
        self.status = status


class _MdbError(Exception):
    """A failure as liblmdb would report it: (code, mdb_strerror text)."""

    def __init__(self, code, text):
        Exception.__init__(self, code, text)
        self.code = code
        self.text = text


# A damaged file: liblmdb's tools usually crash on one (SIGBUS, SIGSEGV);
# lmdbio's message (which names the page and the problem) is worth more than
# the bare mdb_strerror() text.
_DAMAGE = ("PageNotFoundError", "CorruptedError", "InvalidError",
           "VersionMismatchError", "PanicError")


def _error_of(exc):
    """(code, text) that liblmdb would report for an exception."""
    if isinstance(exc, _MdbError):
        return exc.code, exc.text
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno, os.strerror(exc.errno)
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code > 0:  # an errno value (lmdbio.Error)
        return code, os.strerror(code)
    for cls in type(exc).__mro__:
        if cls.__name__ in _mdb_codes():
            code, text = _mdb(cls.__name__)
            if cls.__name__ in _DAMAGE and str(exc):
                text = str(exc)
            return code, text
    return -1, str(exc) or type(exc).__name__


class _IO:
    """The command's output streams (binary), buffered."""

    _FLUSH_AT = 1 << 20

    def __init__(self, stdout, stderr):
        self.out = stdout
        self.err = stderr
        self._buf = []
        self._size = 0
        self._owned = None

    broken = False   # stdout is a closed pipe: output is discarded

    def write(self, data):
        self._buf.append(data)
        self._size += len(data)
        if self._size >= self._FLUSH_AT:
            self.flush()

    def flush(self):
        data = b"".join(self._buf)
        self._buf = []
        self._size = 0
        if self.broken:
            return
        try:
            if data:
                self.out.write(data)
            self.out.flush()
        except BrokenPipeError:
            self.broken = True
            raise

    def error(self, text):
        """Write to stderr (unbuffered, as C's stderr)."""
        try:
            self.flush()
        except BrokenPipeError:
            pass
        if isinstance(text, str):
            text = os.fsencode(text)
        self.err.write(text)
        self.err.flush()

    def reopen(self, filename):
        """freopen(filename, "w", stdout)."""
        self.flush()
        new = open(filename, "wb")
        if self._owned is not None:
            self._owned.close()
        self._owned = new
        self.out = new

    def close(self):
        try:
            self.flush()
        finally:
            if self._owned is not None:
                self._owned.close()
                self._owned = None


def _parse(prog, args, optstring, io, handle):
    """Parse ``args`` as glibc's getopt(3) does with ``optstring`` (options
    may follow operands unless POSIXLY_CORRECT is set; ``--`` ends options;
    an option's argument is the rest of its word or the next word) and call
    ``handle(option, argument)`` for each option in order; an unknown option
    or a missing argument prints getopt's message and calls ``handle('?')``.
    Returns the operands."""
    posix = "POSIXLY_CORRECT" in os.environ or optstring.startswith("+")
    optstring = optstring.lstrip("+")
    operands = []
    i = 0
    n = len(args)
    while i < n:
        word = args[i]
        i += 1
        if word == "--":
            operands.extend(args[i:])
            break
        if not word.startswith("-") or word == "-":
            if posix:
                operands.append(word)
                operands.extend(args[i:])
                break
            operands.append(word)
            continue
        j = 1
        while j < len(word):
            c = word[j]
            j += 1
            k = optstring.find(c) if c != ":" else -1
            if k < 0:
                io.error("%s: invalid option -- '%s'\n" % (prog, c))
                handle("?", None)
                continue
            if optstring[k + 1:k + 2] == ":":
                if j < len(word):
                    arg = word[j:]
                elif i < n:
                    arg = args[i]
                    i += 1
                else:
                    io.error("%s: option requires an argument -- '%s'\n" % (prog, c))
                    handle("?", None)
                    break
                handle(c, arg)
                break
            handle(c, None)
    return operands


# --------------------------------------------------------------------------
# The environment as liblmdb's tools see it.

def _data_path(path, nosubdir):
    return path if nosubdir else os.path.join(path, "data.mdb")


def _lock_path(path, nosubdir):
    return path + "-lock" if nosubdir else os.path.join(path, "lock.mdb")


def _core():
    """lmdbio's compiled core (whichever backend runs the commands, the
    format and the lock file are read by it)."""
    from lmdbio import _core
    return _core


def _core_call(fn, *args):
    """fn(*args), its lmdbio exception turned into what liblmdb's tools
    report: (code, mdb_strerror text)."""
    from lmdbio import errors
    try:
        return fn(*args)
    except errors.Error as exc:
        code = exc.code
        raise _MdbError(code, errors.strerror(code)) from None


def _read_meta(path, nosubdir):
    """The meta page liblmdb picks when it opens the environment
    (lio_read_header).  Raises _MdbError as mdb_env_open would fail."""
    data = _data_path(path, nosubdir)
    # What liblmdb makes of an empty file (a new environment, which a
    # read-only open then fails with EBADF) and of a directory (its read
    # fails with EISDIR), before lio_read_header sees either.
    if os.path.isdir(data):
        raise _MdbError(errno.EISDIR, os.strerror(errno.EISDIR))
    try:
        empty = os.path.getsize(data) == 0
    except OSError:
        empty = False  # lio_read_header reports why
    if empty:
        raise _MdbError(errno.EBADF, os.strerror(errno.EBADF))
    return _core_call(_core()._read_header, data)


class _LockState:
    """What liblmdb would find in (or make of) the lock file, read-only
    (lio_lock_inspect: pread and F_GETLK probes, no lock taken).

    A liblmdb tool that gets the exclusive lock (no other process has the
    environment open) re-initialises the reader table: it reports 0 readers
    used and no readers. Otherwise it reports the live table."""

    def __init__(self, path, nosubdir):
        info = _core_call(_core()._lock_inspect, _lock_path(path, nosubdir))
        self.maxreaders = info["max_readers"]
        self.numreaders = info["num_readers"]
        self.live = info["live"]      # another process has the environment open
        self._info = info

    def reader_list(self, checked=False):
        """mdb_reader_list()'s text (checked: after mdb_reader_check)."""
        return self._info["readers_checked" if checked else "readers"]

    def stale_count(self):
        """The slots mdb_reader_check would clear."""
        return sum(1 for slot in self._info["slots"] if slot[3])


class _Env:
    """An environment opened read-only through the backend, plus what the
    tools print that does not come from a transaction."""

    def __init__(self, backend, path, nosubdir, named=None):
        self.backend = backend
        self.path = path
        self.nosubdir = nosubdir
        # mdb_env_open sets up the lock file first, then reads the meta.
        self.lock = _LockState(path, nosubdir)
        self.meta = _read_meta(path, nosubdir)
        self.env = None
        self.txn = None
        max_dbs = 0
        if named == "one":
            max_dbs = 1
        elif named == "all":
            # Every named database gets a handle (py-lmdb and lmdbio cannot
            # close one, and max_dbs limits them as liblmdb does): a small
            # main DB bounds their number, a large one is counted first.
            entries = self.meta["main_db"]["entries"]
            if entries <= self._PRESCAN_ABOVE:
                max_dbs = entries + 1
            else:
                max_dbs = 1 + self._count_candidates()
        self.env = self._open(max_dbs)
        try:
            hook = getattr(self.env, "_meta", None)
            if hook is not None:
                self.meta.update(hook())
        except BaseException:
            self.close()
            raise

    _PRESCAN_ABOVE = 4096

    def _count_candidates(self):
        """Main-DB records that may be databases (a database record's size,
        no NUL in the key)."""
        count = 0
        dbrec = _core()._dbrec
        env = self._open(0)
        try:
            txn = env.begin()
            try:
                for key, value in txn.cursor().iternext_nodup(keys=True, values=True):
                    if b"\0" not in bytes(key) and dbrec(value) is not None:
                        count += 1
            finally:
                txn.abort()
        finally:
            env.close()
        return count

    def _open(self, max_dbs):
        """Open read-only. While another process has the environment open
        (a writer may commit during a long dump) the transaction holds a
        reader slot, as liblmdb's tools do, so that its pages are not
        recycled; otherwise, or when the lock file cannot be used, no lock
        file is touched."""
        kw = dict(subdir=not self.nosubdir, readonly=True, create=False, max_dbs=max_dbs)
        if self.lock.live:
            try:
                return self.backend.open(self.path, lock=True, **kw)
            except Exception as exc:
                if not _is_lmdb_error(exc, self.backend):
                    raise
        return self.backend.open(self.path, lock=False, **kw)

    @property
    def mapsize(self):
        """me_mapsize: the meta's map size, at least the used pages."""
        m = self.meta
        return max(m["mapsize"], (m["last_pg"] + 1) * m["psize"])

    def begin(self):
        self.txn = self.env.begin()
        return self.txn

    def open_db(self, name):
        """The main DB (name None) or a named one, in this transaction."""
        return self.env.open_db(name, txn=self.txn, create=False)

    def names(self):
        """Main-DB keys that could name a database (no NUL), in key order."""
        for key in self.txn.cursor().iternext_nodup(keys=True, values=False):
            key = bytes(key)
            if b"\0" not in key:
                yield key

    def flags(self, name, db):
        """mdb_dbi_flags(): the names of the database's persistent flags."""
        table = _core()._DB_FLAGS
        if name is None:
            bits = self.meta["main_db"]["flags"]
        else:
            rec = self.txn.get(name)
            rec = _core()._dbrec(rec) if rec is not None else None
            if rec is None:
                return {key for key, on in db.flags(self.txn).items() if on}
            bits = rec["flags"]
        return {key for key, bit in table.items() if bits & bit}

    def close(self):
        try:
            if self.txn is not None:
                self.txn.abort()
        finally:
            self.txn = None
            if self.env is not None:
                self.env.close()
                self.env = None


def _named_mode(o, subname):
    return "all" if o["a"] else ("one" if subname is not None else None)


def _name_bytes(name):
    return os.fsencode(name)


# --------------------------------------------------------------------------
# stat

def _prstat(io, st):
    io.write(b"  Tree depth: %d\n  Branch pages: %d\n  Leaf pages: %d\n"
             b"  Overflow pages: %d\n  Entries: %d\n"
             % (st["depth"], st["branch_pages"], st["leaf_pages"],
                st["overflow_pages"], st["entries"]))


def _freelist_record(io, key, value, level):
    """One free-DB record: its page count, and with -ff/-fff what mdb_stat
    prints about it (same arithmetic, including the [bad sequence] check)."""
    txnid, count, pages = _core()._free_record(key, value)
    if level < 2:
        return count
    avail = len(pages)
    j = count
    bad = b""
    span = 0
    prev = 1
    i = min(j, avail)
    while True:
        i -= 1
        if i < 0:
            break
        pg = pages[i]
        if pg <= prev:
            bad = b" [bad sequence]"
        prev = pg
        pg += span
        while i >= span and pages[i - span] == pg:
            span += 1
            pg += 1
    io.write(b"    Transaction %d, %d pages, maxspan %d%s\n" % (txnid, j, span, bad))
    if level > 2:
        j = min(j, avail) - 1
        while j >= 0:
            pg = pages[j]
            span = 1
            j -= 1
            while j >= 0 and pages[j] == pg + span:
                span += 1
                j -= 1
            if span > 1:
                io.write(b"     %9d[%d]\n" % (pg, span))
            else:
                io.write(b"     %9d\n" % pg)
    return count


def _open_operand(prog, args, optstring, io, handle, usage, o, backend):
    """Parse mdb_stat/mdb_dump style options, then open the one operand as
    they do: (env, subname, path), or the exit status of a usage or open
    error (already reported)."""
    try:
        operands = _parse(prog, args, optstring, io, handle)
        if len(operands) != 1:
            raise _Usage()
    except _Usage:
        io.error(usage)
        return 1
    path = operands[0]
    subname = _name_bytes(o["s"]) if o["s"] is not None else None

    try:
        env = _Env(backend, path, o["n"], named=_named_mode(o, subname))
    except Exception as exc:
        if not _is_lmdb_error(exc, backend):
            raise
        io.error(_open_failure(prog, path, o["n"], exc))
        return 1
    return env, subname, path


def _open_failure(prog, path, nosubdir, exc):
    """One line for an environment that cannot be opened: the path, what is
    wrong and the likely fix (never a traceback)."""
    code, text = _error_of(exc)
    data = _data_path(path, nosubdir)
    try:
        empty = os.path.isfile(data) and os.path.getsize(data) == 0
    except OSError:
        empty = False
    if empty:
        why = "%s is empty: not an LMDB file" % os.path.basename(data)
    elif code == errno.ENOENT:
        if not os.path.lexists(path):
            why = "no such file or directory"
        elif not nosubdir:
            why = ("no data.mdb in this directory: give the directory of an "
                   "LMDB environment, or -n and a data file")
        else:
            why = "no such file"
    elif code == errno.ENOTDIR or (not nosubdir and os.path.isfile(path)):
        why = ("a file, not an environment directory: to read a data file "
               "itself, add -n")
    elif code == errno.EISDIR or (nosubdir and os.path.isdir(path)):
        why = "a directory: without -n, give the environment's directory"
    elif code == errno.EACCES:
        why = "permission denied reading %s" % data
    elif code in (_mdb("InvalidError")[0], _mdb("VersionMismatchError")[0]):
        why = "not an LMDB data file (%s)" % text
    else:
        why = "%s (error %d)" % (text, code)
    return "%s: %s: %s\n" % (prog, path, why)


def _wants_help(args):
    """--help before any "--" (not an mdb_stat/mdb_dump option)."""
    for a in args:
        if a == "--":
            return False
        if a == "--help":
            return True
    return False


_STAT_HELP = """\
Environment and database status, with the options and output of mdb_stat
(lmdb-utils 0.9.24), read without mmap.

  -V        print the version of mdb_stat emulated and exit
  -n        dbpath is the data file itself, not the environment directory
  -e        environment info (map size, pages, readers)
  -r, -rr   the reader table (-rr: and its stale slots)
  -f[f[f]]  free list totals (-ff: per record, -fff: every page)
  -a        every named database;  -s subdb: only that one
"""

_DUMP_HELP = """\
Dump a database in mdb_load's text format, with the options and output of
mdb_dump (lmdb-utils 0.9.24), read without mmap.

  -V         print the version of mdb_dump emulated and exit
  -f output  write to this file instead of stdout
  -l         list the named databases
  -n         dbpath is the data file itself, not the environment directory
  -p         printable characters as they are (else hexadecimal)
  -a         every named database;  -s subdb: only that one
"""


def _cmd_stat(prog, args, io, backend):
    usage = _STAT_USAGE % prog
    if _wants_help(args):
        io.write((usage + "\n" + _STAT_HELP).encode())
        return 0
    if not args:
        io.error(usage)
        return 1
    o = {"a": 0, "e": 0, "f": 0, "n": False, "r": 0, "s": None}

    def handle(c, arg):
        if c == "V":
            io.write(MDB_VERSION_STRING.encode() + b"\n")
            raise _Exit(0)
        if c == "a":
            if o["s"] is not None:
                raise _Usage()
            o["a"] += 1
        elif c == "s":
            if o["a"]:
                raise _Usage()
            o["s"] = arg
        elif c == "n":
            o["n"] = True
        elif c in "efr":
            o[c] += 1
        else:
            raise _Usage()

    opened = _open_operand(prog, args, "Vaefnrs:", io, handle, usage, o, backend)
    if isinstance(opened, int):
        return opened
    env, subname, path = opened
    try:
        return _stat_body(io, env, o, subname)
    finally:
        env.close()


def _fail(io, what, exc):
    io.error("%s failed, error %d %s\n" % ((what,) + _error_of(exc)))
    return 1


def _checked(io, backend, what, fn, *args):
    """fn(*args); an LMDB error stops the command as the tools stop on a
    failed call: "<what> failed, error N text" and exit status 1."""
    try:
        return fn(*args)
    except Exception as exc:
        if not _is_lmdb_error(exc, backend):
            raise
        raise _Exit(_fail(io, what, exc)) from None


def _stat_body(io, env, o, subname):
    backend = env.backend
    meta = env.meta
    lock = env.lock
    if o["e"]:
        psize = meta["psize"]
        addr = b"0x%x" % meta["address"] if meta["address"] else b"(nil)"
        io.write(b"Environment Info\n  Map address: %s\n  Map size: %d\n"
                 b"  Page size: %d\n  Max pages: %d\n  Number of pages used: %d\n"
                 b"  Last transaction ID: %d\n  Max readers: %d\n"
                 b"  Number of readers used: %d\n"
                 % (addr, env.mapsize, psize, env.mapsize // psize if psize else 0,
                    meta["last_pg"] + 1, meta["txnid"], lock.maxreaders,
                    lock.numreaders))
    if o["r"]:
        io.write(b"Reader Table Status\n")
        io.write(lock.reader_list())
        if o["r"] > 1:
            io.write(b"  %d stale readers cleared.\n" % lock.stale_count())
            io.write(lock.reader_list(checked=True))
        if not (subname is not None or o["a"] or o["f"]):
            # mdb_reader_list() returns fputs()'s result (1 with glibc),
            # which mdb_stat returns as its exit status.
            return 1

    txn = _checked(io, backend, "mdb_txn_begin", env.begin)

    if o["f"]:
        io.write(b"Freelist Status\n")
        hook = getattr(env.env, "_free_db", None)
        if hook is None:
            io.error("%s: the freelist needs Environment._free_db(), which %s "
                     "lacks\n" % (_PROG, getattr(backend, "__name__", backend)))
            return 1
        free = _checked(io, backend, "mdb_cursor_open", hook)
        cursor = _checked(io, backend, "mdb_cursor_open", txn.cursor, free)
        st = _checked(io, backend, "mdb_stat", txn.stat, free)
        _prstat(io, st)
        total = 0
        try:
            for key, value in cursor.iternext(keys=True, values=True):
                total += _freelist_record(io, key, value, o["f"])
        except Exception as exc:
            # mdb_stat stops reading the freelist and goes on (its status
            # comes from what follows)
            if not _is_lmdb_error(exc, backend):
                raise
        io.write(b"  Free pages: %d\n" % total)

    db = _checked(io, backend, "mdb_open", env.open_db, subname)
    st = _checked(io, backend, "mdb_stat", txn.stat, db)
    io.write(b"Status of %s\n" % (subname if subname is not None else b"Main DB"))
    _prstat(io, st)

    if o["a"]:
        names = env.names()
        while True:
            try:
                name = next(names, None)
            except Exception as exc:
                if not _is_lmdb_error(exc, backend):
                    raise
                # mdb_stat stops the walk and fails without a word; say why
                io.error("%s: %s: %s\n" % (_PROG + " stat", env.path, _error_of(exc)[1]))
                return 1
            if name is None:
                break
            try:
                db2 = env.open_db(name)
            except Exception as exc:
                if not _is_lmdb_error(exc, backend):
                    raise
                continue
            io.write(b"Status of %s\n" % name)
            st = _checked(io, backend, "mdb_stat", txn.stat, db2)
            _prstat(io, st)
    return 0


class _Usage(Exception):
    pass


def _is_lmdb_error(exc, backend):
    if isinstance(exc, BrokenPipeError):
        return False
    if isinstance(exc, (_MdbError, OSError)):
        return True
    base = getattr(backend, "Error", None)
    return base is not None and isinstance(exc, base)


# --------------------------------------------------------------------------
# dump

_NONPRINT = re.compile(rb"[^\x20-\x7e]")
# mdb_dump -p: isprint() in the C locale passes through, the rest is \xx.
_PRINT_TABLE = [bytes([c]) if 0x20 <= c <= 0x7e else b"\\%02x" % c for c in range(256)]


def _printable(data, _search=_NONPRINT.search, _get=_PRINT_TABLE.__getitem__):
    data = bytes(data)
    if _search(data) is None:
        return data
    return b"".join(map(_get, data))


def _dumpit(io, env, db, name, printable):
    """mdb_dump's dumpit(): header, records, DATA=END."""
    txn = env.txn
    flags = env.flags(name, db)
    st = txn.stat(db)
    meta = env.meta
    head = [b"VERSION=3\n", b"format=print\n" if printable else b"format=bytevalue\n"]
    if name is not None:
        head.append(b"database=%s\n" % name)
    head.append(b"type=btree\n")
    head.append(b"mapsize=%d\n" % env.mapsize)
    if meta["address"]:
        head.append(b"mapaddr=0x%x\n" % meta["address"])
    head.append(b"maxreaders=%d\n" % env.lock.maxreaders)
    if "dupsort" in flags:
        head.append(b"duplicates=1\n")
    for key, line in _DBFLAG_LINES:
        if key in flags:
            head.append(b"%s=1\n" % line)
    head.append(b"db_pagesize=%d\n" % st["psize"])
    head.append(b"HEADER=END\n")
    io.write(b"".join(head))

    write = io.write
    cursor = txn.cursor(db=db)
    if printable:
        for key, value in cursor.iternext(keys=True, values=True):
            write(b" " + _printable(key) + b"\n " + _printable(value) + b"\n")
    else:
        hexlify = binascii.hexlify
        for key, value in cursor.iternext(keys=True, values=True):
            write(b" " + hexlify(key) + b"\n " + hexlify(value) + b"\n")
    write(b"DATA=END\n")


def _cmd_dump(prog, args, io, backend):
    usage = _DUMP_USAGE % prog
    if _wants_help(args):
        io.write((usage + "\n" + _DUMP_HELP).encode())
        return 0
    if not args:
        io.error(usage)
        return 1
    o = {"a": 0, "l": False, "n": False, "p": False, "s": None}

    def handle(c, arg):
        if c == "V":
            io.write(MDB_VERSION_STRING.encode() + b"\n")
            raise _Exit(0)
        if c in "la":
            if c == "l":
                o["l"] = True
            if o["s"] is not None:
                raise _Usage()
            o["a"] += 1
        elif c == "f":
            try:
                io.reopen(arg)
            except OSError as exc:
                io.error("%s: %s: reopen: %s\n" % (prog, arg, os.strerror(exc.errno or errno.EIO)))
                raise _Exit(1)
        elif c == "n":
            o["n"] = True
        elif c == "p":
            o["p"] = True
        elif c == "s":
            if o["a"]:
                raise _Usage()
            o["s"] = arg
        else:
            raise _Usage()

    opened = _open_operand(prog, args, "af:lnps:V", io, handle, usage, o, backend)
    if isinstance(opened, int):
        return opened
    env, subname, path = opened
    try:
        return _dump_body(prog, io, env, o, subname, path)
    finally:
        env.close()


def _dump_body(prog, io, env, o, subname, path):
    backend = env.backend
    txn = _checked(io, backend, "mdb_txn_begin", env.begin)
    db = _checked(io, backend, "mdb_open", env.open_db, subname)

    err = None
    try:
        if o["a"]:
            count = 0
            for name in env.names():
                count += 1
                try:
                    db2 = env.open_db(name)
                except Exception as exc:
                    if not _is_lmdb_error(exc, backend):
                        raise
                    continue
                if o["l"]:
                    io.write(name + b"\n")
                else:
                    _dumpit(io, env, db2, name, o["p"])
            if not count:
                io.error("%s: %s does not contain multiple databases\n" % (prog, path))
                return 1
        else:
            _dumpit(io, env, db, subname, o["p"])
    except (KeyboardInterrupt, BrokenPipeError):
        # mdb_dump catches SIGINT, SIGTERM, SIGPIPE and SIGHUP and stops
        err = (errno.EINTR, os.strerror(errno.EINTR))
    except Exception as exc:
        if not _is_lmdb_error(exc, backend):
            raise
        err = _error_of(exc)
    if err is not None:
        io.error("%s: %s: %s\n" % (prog, path, err[1]))
        return 1
    return 0


# --------------------------------------------------------------------------

_PROG = "lmdbio"
_VERIFY_USAGE = ("usage: %s [-n] [-s subdb] [-m max-problems] "
                 "[--progress|--no-progress] dbpath\n")

_VERIFY_HELP = """\
Check every structural invariant of an LMDB file: every tree (free DB, main
DB, named DBs, duplicate sub-trees) page by page, key order, overflow runs,
database records, the free list, and that every page is in use or free
exactly once.  Each problem is printed with its page; the exit status is 0
only for a clean file.  Notes (not damage) say what some liblmdb versions
write differently.

  -n                dbpath is the data file itself (subdir=False)
  -s subdb          check only this named database (no page accounting)
  -m max-problems   stop after this many problems (default 1000, 0: none)
  --progress        progress on stderr even when it is not a terminal
  --no-progress     no progress (default when stderr is not a terminal)
"""


def _cmd_verify(prog, args, io, backend):
    usage = _VERIFY_USAGE % prog
    opts = {"n": False, "s": None, "m": 1000, "progress": None, "bad": False}
    rest = []
    for a in args:
        if a in ("--help", "-h"):
            io.write((usage + "\n" + _VERIFY_HELP).encode())
            return 0
        if a == "--progress":
            opts["progress"] = True
        elif a == "--no-progress":
            opts["progress"] = False
        elif a.startswith("--") and a != "--":
            io.error("%s: unknown option %s\n%s" % (prog, a, usage))
            return 2
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
        io.error(usage)
        return 2
    path = operands[0]
    from lmdbio import _progress
    show = opts["progress"]
    if show is None:
        show = _progress.is_terminal(io.err)
    progress, end = _progress.bar(io.error, prog, "pages read")

    from lmdbio.verify import verify
    name = os.fsencode(opts["s"]) if opts["s"] is not None else None
    try:
        problems, st = verify(path, subdir=not opts["n"], name=name,
                              progress=progress if show else None,
                              progress_every=1024, max_problems=max(0, opts["m"]))
    except Exception as exc:
        end()
        if not _is_lmdb_error(exc, backend):
            raise
        if type(exc).__name__ == "NotFoundError":
            io.error("%s: %s: no database named %r\n" % (prog, path, opts["s"]))
            return 1
        if _error_of(exc)[0] in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                                 errno.EACCES):
            io.error(_open_failure(prog, path, opts["n"], exc))
        else:  # the file is there but cannot be walked: damage
            io.write(("%s: cannot be read: %s\n" % (path, exc)).encode(
                "utf-8", "replace"))
        return 1
    end()
    for pgno, msg in st["notes"]:
        io.write(("note: " + msg + "\n").encode("utf-8", "replace"))
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
    nn = len(st["notes"])
    io.write(("%s: ok: txn %d, %d trees, %d named DBs, %d pages read, "
              "%d free pages, last page %d%s\n" % (
                  path, st["txnid"], st["trees"], st["named_dbs"],
                  st["pages_read"], st["free_pages"], st["last_pg"],
                  "" if not nn else ", %d note%s" % (nn, "" if nn == 1 else "s"),
              )).encode())
    return 0


def _cmd_convert(prog, args, io, backend):
    from lmdbio.convert import main as convert_main
    return convert_main(prog, args, io, backend)


def _cmd_bench(prog, args, io, backend):
    from lmdbio.bench import main as bench_main
    try:
        return bench_main(args, prog=prog,
                          out=lambda s: (io.write(s.encode()), io.flush()),
                          err=io.error)
    except SystemExit as exc:  # argparse: --help, usage errors
        return exc.code if isinstance(exc.code, int) else 2


_COMMANDS = {
    "stat": _cmd_stat,
    "dump": _cmd_dump,
    "verify": _cmd_verify,
    "convert": _cmd_convert,
    "bench": _cmd_bench,
}


def _load_backend():
    name = os.environ.get("LMDBIO_CLI_BACKEND")
    return importlib.import_module(name or "lmdbio")


def _version_text(backend):
    ver = getattr(backend, "__version__", None)
    if ver is None and hasattr(backend, "version"):
        ver = ".".join(str(p) for p in backend.version())
    return "%s %s\n" % (getattr(backend, "__name__", _PROG), ver)


def main(argv=None, *, backend=None, stdout=None, stderr=None):
    """Run ``lmdbio <command> ...``; returns the exit status.

    ``argv`` excludes the program name (default ``sys.argv[1:]``).
    ``backend`` is the module providing ``open`` (default lmdbio, or the
    module named by ``$LMDBIO_CLI_BACKEND``); ``stdout``/``stderr`` are binary
    streams (default the process's)."""
    if argv is None:
        argv = sys.argv[1:]
    argv = list(argv)
    if stdout is None:
        stdout = sys.stdout.buffer
    if stderr is None:
        stderr = sys.stderr.buffer
    io = _IO(stdout, stderr)
    try:
        if not argv:
            io.error(_HELP)
            return 2
        cmd = argv[0]
        if cmd in ("-h", "--help", "help"):
            io.write(_HELP.encode())
            return 0
        if cmd == "--version":
            if backend is None:
                backend = _load_backend()
            io.write(_version_text(backend).encode())
            return 0
        func = _COMMANDS.get(cmd)
        if func is None:
            io.error("%s: unknown command %r (commands: %s)\n"
                     % (_PROG, cmd, ", ".join(sorted(_COMMANDS))))
            return 2
        if backend is None:
            backend = _load_backend()
        prog = "%s %s" % (_PROG, cmd)
        try:
            return func(prog, argv[1:], io, backend)
        except _Exit as exc:
            return exc.status
        except KeyboardInterrupt:
            return 130
    except BrokenPipeError:
        return 1
    finally:
        try:
            io.close()
        except BrokenPipeError:
            pass
        if io.broken:
            _quiet_stdout(stdout)


def _quiet_stdout(stream):
    """After EPIPE on the process's stdout, point it at /dev/null so that
    Python's final flush does not complain."""
    try:
        if stream is sys.stdout.buffer:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
    except (AttributeError, OSError, ValueError):
        pass
