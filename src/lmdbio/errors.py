"""lmdbio's exception classes: py-lmdb's names and hierarchy.

Every class py-lmdb (the ``lmdb`` package) defines exists here under the same
name, all derived from :class:`Error`.  As in py-lmdb's C extension, an
exception raised by lmdbio carries a message of the form ``"what: reason"``
and the attributes ``what`` (the operation, or for a bad file the path and the
problem), ``code`` (liblmdb's error number, or an ``errno`` value) and
``reason`` (liblmdb's ``mdb_strerror(code)`` text).

Exceptions for a structurally bad file (``PageNotFoundError``,
``CorruptedError``, ``InvalidError``, ``VersionMismatchError``) name the data
file and the page.  An I/O error reading the file raises :class:`Error` (or
the subclass py-lmdb uses for that errno, e.g. ``ReadonlyError`` for
``EACCES``) with ``code`` and ``errno`` set to the errno value.
"""

import errno as _errno
import os as _os

__all__ = [
    'Error',
    'KeyExistsError', 'NotFoundError', 'PageNotFoundError', 'CorruptedError',
    'PanicError', 'VersionMismatchError', 'InvalidError', 'MapFullError',
    'DbsFullError', 'ReadersFullError', 'TlsFullError', 'TxnFullError',
    'CursorFullError', 'PageFullError', 'MapResizedError',
    'IncompatibleError', 'BadRslotError', 'BadDbiError', 'BadTxnError',
    'BadValsizeError', 'ReadonlyError', 'InvalidParameterError', 'LockError',
    'MemoryError', 'DiskError',
    'ProblemError', 'BadChecksumError', 'CryptoFailError',
    'EnvEncryptionError',
]
# lmdbio's own (not in py-lmdb); kept out of ERROR_MAP.
__all__.append('DatumError')
__all__.append('SnapshotChangedError')

# liblmdb's return codes (lmdb.h).
MDB_KEYEXIST = -30799
MDB_NOTFOUND = -30798
MDB_PAGE_NOTFOUND = -30797
MDB_CORRUPTED = -30796
MDB_PANIC = -30795
MDB_VERSION_MISMATCH = -30794
MDB_INVALID = -30793
MDB_MAP_FULL = -30792
MDB_DBS_FULL = -30791
MDB_READERS_FULL = -30790
MDB_TLS_FULL = -30789
MDB_TXN_FULL = -30788
MDB_CURSOR_FULL = -30787
MDB_PAGE_FULL = -30786
MDB_MAP_RESIZED = -30785
MDB_INCOMPATIBLE = -30784
MDB_BAD_RSLOT = -30783
MDB_BAD_TXN = -30782
MDB_BAD_VALSIZE = -30781
MDB_BAD_DBI = -30780
MDB_PROBLEM = -30779
MDB_BAD_CHECKSUM = -30778
MDB_CRYPTO_FAIL = -30777
MDB_ENV_ENCRYPTION = -30776

# mdb_strerror() texts for liblmdb's own codes.
_MDB_STRINGS = {
    0: 'Successful return: 0',
    MDB_KEYEXIST: 'MDB_KEYEXIST: Key/data pair already exists',
    MDB_NOTFOUND: 'MDB_NOTFOUND: No matching key/data pair found',
    MDB_PAGE_NOTFOUND: 'MDB_PAGE_NOTFOUND: Requested page not found',
    MDB_CORRUPTED: 'MDB_CORRUPTED: Located page was wrong type',
    MDB_PANIC: 'MDB_PANIC: Update of meta page failed or environment had '
               'fatal error',
    MDB_VERSION_MISMATCH: 'MDB_VERSION_MISMATCH: Database environment '
                          'version mismatch',
    MDB_INVALID: 'MDB_INVALID: File is not an LMDB file',
    MDB_MAP_FULL: 'MDB_MAP_FULL: Environment mapsize limit reached',
    MDB_DBS_FULL: 'MDB_DBS_FULL: Environment maxdbs limit reached',
    MDB_READERS_FULL: 'MDB_READERS_FULL: Environment maxreaders limit '
                      'reached',
    MDB_TLS_FULL: 'MDB_TLS_FULL: Thread-local storage keys full - too many '
                  'environments open',
    MDB_TXN_FULL: 'MDB_TXN_FULL: Transaction has too many dirty pages - '
                  'transaction too big',
    MDB_CURSOR_FULL: 'MDB_CURSOR_FULL: Internal error - cursor stack limit '
                     'reached',
    MDB_PAGE_FULL: 'MDB_PAGE_FULL: Internal error - page has no more space',
    MDB_MAP_RESIZED: 'MDB_MAP_RESIZED: Database contents grew beyond '
                     'environment mapsize',
    MDB_INCOMPATIBLE: 'MDB_INCOMPATIBLE: Operation and DB incompatible, or '
                      'DB flags changed',
    MDB_BAD_RSLOT: 'MDB_BAD_RSLOT: Invalid reuse of reader locktable slot',
    MDB_BAD_TXN: 'MDB_BAD_TXN: Transaction must abort, has a child, or is '
                 'invalid',
    MDB_BAD_VALSIZE: 'MDB_BAD_VALSIZE: Unsupported size of key/DB name/data, '
                     'or wrong DUPFIXED size',
    MDB_BAD_DBI: 'MDB_BAD_DBI: The specified DBI handle was closed/changed '
                 'unexpectedly',
    MDB_PROBLEM: 'MDB_PROBLEM: Unexpected problem - txn should abort',
    MDB_BAD_CHECKSUM: 'MDB_BAD_CHECKSUM: Page checksum mismatch',
    MDB_CRYPTO_FAIL: 'MDB_CRYPTO_FAIL: Page encryption or decryption failed',
    MDB_ENV_ENCRYPTION: 'MDB_ENV_ENCRYPTION: Environment encryption mismatch',
}

# Mapping hints py-lmdb appends to some messages.
_HINTS = {
    MDB_MAP_FULL: 'Please use a larger Environment(map_size=) parameter',
    MDB_DBS_FULL: 'Please use a larger Environment(max_dbs=) parameter',
    MDB_READERS_FULL: 'Please use a larger Environment(max_readers=) '
                      'parameter',
    MDB_TXN_FULL: 'Please do less work within your transaction',
}


def strerror(code):
    """liblmdb's ``mdb_strerror(code)``: its own text for LMDB codes, the C
    library's for ``errno`` values."""
    s = _MDB_STRINGS.get(code)
    if s is not None:
        return s
    try:
        return _os.strerror(code)
    except (ValueError, OverflowError):
        return 'Unknown error %d' % (code,)


class Error(Exception):
    """Raised when an LMDB-related error occurs, and no more specific
    :py:class:`lmdbio.Error` subclass exists.

    Attributes (set on every exception lmdbio raises): ``what``, ``code``,
    ``reason``; ``errno`` as well for operating-system errors."""


class KeyExistsError(Error):
    """Key/data pair already exists."""
    MDB_NAME = 'MDB_KEYEXIST'


class NotFoundError(Error):
    """No matching key/data pair found.

    Normally lmdbio indicates a missing key by returning ``None``, or a
    user-supplied default value, however it may raise this error where
    py-lmdb raises it (e.g. ``open_db(name, create=False)`` on a missing
    database)."""
    MDB_NAME = 'MDB_NOTFOUND'


class PageNotFoundError(Error):
    """Request page not found: a page number past the end of the file."""
    MDB_NAME = 'MDB_PAGE_NOTFOUND'


class CorruptedError(Error):
    """Located page was of the wrong type, or is otherwise malformed."""
    MDB_NAME = 'MDB_CORRUPTED'


class PanicError(Error):
    """Update of meta page failed."""
    MDB_NAME = 'MDB_PANIC'


class VersionMismatchError(Error):
    """Database environment version mismatch."""
    MDB_NAME = 'MDB_VERSION_MISMATCH'


class InvalidError(Error):
    """File is not an MDB file."""
    MDB_NAME = 'MDB_INVALID'


class MapFullError(Error):
    """Environment map_size= limit reached."""
    MDB_NAME = 'MDB_MAP_FULL'


class DbsFullError(Error):
    """Environment max_dbs= limit reached."""
    MDB_NAME = 'MDB_DBS_FULL'


class ReadersFullError(Error):
    """Environment max_readers= limit reached."""
    MDB_NAME = 'MDB_READERS_FULL'


class TlsFullError(Error):
    """Thread-local storage keys full - too many environments open."""
    MDB_NAME = 'MDB_TLS_FULL'


class TxnFullError(Error):
    """Transaction has too many dirty pages - transaction too big."""
    MDB_NAME = 'MDB_TXN_FULL'


class CursorFullError(Error):
    """Internal error - cursor stack limit reached."""
    MDB_NAME = 'MDB_CURSOR_FULL'


class PageFullError(Error):
    """Internal error - page has no more space."""
    MDB_NAME = 'MDB_PAGE_FULL'


class MapResizedError(Error):
    """Database contents grew beyond environment mapsize."""
    MDB_NAME = 'MDB_MAP_RESIZED'


class IncompatibleError(Error):
    """Operation and DB incompatible, or DB flags changed."""
    MDB_NAME = 'MDB_INCOMPATIBLE'


class BadRslotError(Error):
    """Invalid reuse of reader locktable slot."""
    MDB_NAME = 'MDB_BAD_RSLOT'


class BadDbiError(Error):
    """The specified DBI was changed unexpectedly."""
    MDB_NAME = 'MDB_BAD_DBI'


class BadTxnError(Error):
    """Transaction must abort, has a child, or is invalid."""
    MDB_NAME = 'MDB_BAD_TXN'


class BadValsizeError(Error):
    """Too big key/data, key is empty, or wrong DUPFIXED size."""
    MDB_NAME = 'MDB_BAD_VALSIZE'


class ReadonlyError(Error):
    """An attempt was made to modify a read-only database.  lmdbio never
    writes a data file: every write method raises this."""
    MDB_NAME = 'EACCES'


class InvalidParameterError(Error):
    """An invalid parameter was specified."""
    MDB_NAME = 'EINVAL'


class LockError(Error):
    """The environment was locked by another process."""
    MDB_NAME = 'EAGAIN'


class MemoryError(Error):
    """Out of memory."""
    MDB_NAME = 'ENOMEM'


class DiskError(Error):
    """No more disk space (py-lmdb's meaning), and in lmdbio: reading the
    data file failed (EIO that persists after retries, or the file shrank
    while being read).  ``errno``, ``path`` and ``offset`` (the file offset
    of the failed read) are set for read errors."""
    MDB_NAME = 'ENOSPC'


class ProblemError(Error):
    """Unexpected problem - transaction should abort."""
    MDB_NAME = 'MDB_PROBLEM'


class BadChecksumError(Error):
    """Page checksum incorrect."""
    MDB_NAME = 'MDB_BAD_CHECKSUM'


class CryptoFailError(Error):
    """Encryption/decryption failed."""
    MDB_NAME = 'MDB_CRYPTO_FAIL'


class EnvEncryptionError(Error):
    """Environment encryption mismatch."""
    MDB_NAME = 'MDB_ENV_ENCRYPTION'


class DatumError(Error, ValueError):
    """Malformed Caffe Datum / BlobProto bytes (lmdbio.datum).  Not a
    py-lmdb class: lmdbio's own, a ValueError too."""


class SnapshotChangedError(Error):
    """A read without a reader slot (``lock=False``) may have met pages that a
    live writer reused: the newest committed txnid is two or more past the
    snapshot being read (a writer reuses a snapshot's pages from then on),
    or a damaged page was met after the writer moved past it.  Raised at the
    end of a cursor scan, every 1024 reads of a transaction, after every
    ``Reader`` batch (before it is returned) and in place of the
    ``CorruptedError`` / ``PageNotFoundError`` such pages cause.  Begin a new
    transaction (or open a new Reader), or use ``lock=True`` next to a live
    writer.  Attributes: ``txnid`` (the snapshot read), ``newest`` (the
    newest committed txnid when it was detected).  Not a py-lmdb class."""


def disk_error(what, sys_errno, path=None, offset=None):
    """The :class:`DiskError` for a failed read of the data file."""
    exc = make_error(what, sys_errno, cls=DiskError, sys_errno=sys_errno)
    exc.path = path
    exc.offset = offset
    return exc


def forked_error(path):
    """The :class:`Error` for an epoch a forked child goes on with: its
    prefetch threads stayed in the parent."""
    return make_error('%s: this epoch was begun before the process forked '
                      'and its prefetch threads stayed in the parent; begin a '
                      'new epoch (iter(reader)) in this process' % (path,), 0)


_ERRNO_NAMES = {'EACCES', 'EINVAL', 'EAGAIN', 'ENOMEM', 'ENOSPC'}

#: error code -> exception class, as py-lmdb maps them.
ERROR_MAP = {}
DatumError.__module__ = 'lmdbio'
SnapshotChangedError.__module__ = 'lmdbio'
for _name in __all__:
    _cls = globals()[_name]
    _cls.__module__ = 'lmdbio'
    if _cls is Error or not hasattr(_cls, 'MDB_NAME'):
        continue
    if _cls.MDB_NAME in _ERRNO_NAMES:
        ERROR_MAP[getattr(_errno, _cls.MDB_NAME)] = _cls
    else:
        ERROR_MAP[globals()[_cls.MDB_NAME]] = _cls
# LMDB 1.0's MDB_IS_READONLY.
ERROR_MAP[-30770] = ReadonlyError
del _name, _cls


def make_error(what, code, cls=None, sys_errno=0):
    """Build the exception py-lmdb raises for ``(what, code)``: the class for
    `code` (or `cls`), message ``"what: reason"``, attributes ``what``,
    ``code``, ``reason`` (and ``errno`` for an operating-system error)."""
    if cls is None:
        cls = ERROR_MAP.get(code, Error) if code else Error
    reason = strerror(code)
    msg = '%s: %s' % (what, reason) if code else what
    hint = _HINTS.get(code)
    if hint:
        msg = '%s (%s)' % (msg, hint)
    exc = cls(msg)
    exc.what = what
    exc.code = code
    exc.reason = reason
    if sys_errno:
        exc.errno = sys_errno
    return exc


def invalid_error():
    """The error py-lmdb raises for an operation on a closed, finished or
    dropped object."""
    return make_error('Attempt to operate on closed/deleted/dropped object.',
                      0)
