"""lmdbio: read LMDB data files without mmap, from one process or thousands.

``import lmdbio as lmdb`` works for read-only code written against py-lmdb:
:func:`open` / :class:`Environment`, :class:`Transaction`, :class:`Cursor`
and every py-lmdb exception class, with the same arguments, results and
errors.  The data file is read with explicit ``pread`` calls (never mapped,
never written).
"""

__version__ = '0.1.0'

from lmdbio.errors import (  # noqa: F401
    Error, KeyExistsError, NotFoundError, PageNotFoundError, CorruptedError,
    PanicError, VersionMismatchError, InvalidError, MapFullError,
    DbsFullError, ReadersFullError, TlsFullError, TxnFullError,
    CursorFullError, PageFullError, MapResizedError, IncompatibleError,
    BadRslotError, BadDbiError, BadTxnError, BadValsizeError, ReadonlyError,
    InvalidParameterError, LockError, MemoryError, DiskError, ProblemError,
    BadChecksumError, CryptoFailError, EnvEncryptionError, DatumError,
    SnapshotChangedError,
)
from lmdbio._core import (  # noqa: F401
    Environment, Transaction, Cursor, _Database, enable_drop_gil,
)


def version(subpatch=False):
    """lmdbio's version as a tuple of integers ``(major, minor, patch)``
    (``subpatch=True`` appends a 0, as py-lmdb's 4-tuple)."""
    v = tuple(int(x) for x in __version__.split('.')[:3])
    return v + (0,) if subpatch else v


#: ``lmdbio.open(...)`` is ``lmdbio.Environment(...)``, as in py-lmdb.
open = Environment


# Parts written elsewhere in the package, imported on first use so that
# ``import lmdbio`` stays light (and works before they exist).
_LAZY = {
    'Reader': 'lmdbio.reader',
    'Batch': 'lmdbio.reader',
    'Ragged': 'lmdbio.reader',
    'DatumReader': 'lmdbio.datum',
}
_SUBMODULES = ('datum', 'caffe', 'torch', 'reader', 'mpi', 'cli', 'verify')


def __getattr__(name):
    import importlib
    mod = _LAZY.get(name)
    if mod is not None:
        value = getattr(importlib.import_module(mod), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module('lmdbio.' + name)
    raise AttributeError("module 'lmdbio' has no attribute %r" % (name,))


__all__ = [
    'Environment', 'Transaction', 'Cursor', 'open', 'version',
    'enable_drop_gil', 'Reader', 'Batch', 'Ragged', 'DatumReader',
    'Error', 'KeyExistsError', 'NotFoundError', 'PageNotFoundError',
    'CorruptedError', 'PanicError', 'VersionMismatchError', 'InvalidError',
    'MapFullError', 'DbsFullError', 'ReadersFullError', 'TlsFullError',
    'TxnFullError', 'CursorFullError', 'PageFullError', 'MapResizedError',
    'IncompatibleError', 'BadRslotError', 'BadDbiError', 'BadTxnError',
    'BadValsizeError', 'ReadonlyError', 'InvalidParameterError', 'LockError',
    'MemoryError', 'DiskError', 'ProblemError', 'BadChecksumError',
    'CryptoFailError', 'EnvEncryptionError', 'DatumError',
    'SnapshotChangedError',
]
