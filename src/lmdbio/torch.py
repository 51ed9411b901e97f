"""PyTorch datasets over an LMDB (``pip install lmdbio[torch]``).

* :class:`LMDBDataset`: map-style, ``dataset[i]`` is record ``i`` (its
  ordinal: position in key order); works with any sampler, including
  ``DistributedSampler``.  A DataLoader batch is fetched with one bulk read
  (``__getitems__``).
* :class:`LMDBIterableDataset`: streams the records (optionally shuffled per
  epoch with :meth:`~LMDBIterableDataset.set_epoch`), split across
  distributed ranks and DataLoader workers so that every record is read by
  exactly one (rank, worker) per epoch.

Items are ``(key, value)`` bytes, or ``decode(value)`` when a ``decode``
callable is given, e.g. :func:`lmdbio.datum.decode_one` for Caffe Datums
(``(array[C, H, W], label)``, which the DataLoader collates to tensors).
``color="rgb"`` (or ``"bgr"``) is passed on to such a decoder: Caffe stores
colour images BGR, PyTorch models expect RGB.

Each process (each DataLoader worker) opens its own :class:`lmdbio.Reader`
on first use: datasets pickle without open files and are safe to use with
both ``fork`` and ``spawn`` workers.
"""

import os

import numpy as np

from lmdbio._bulk import ordinal_bounds
from lmdbio._state import check_state

try:
    import torch
    from torch.utils.data import Dataset, IterableDataset, get_worker_info
except ImportError as _e:  # pragma: no cover - exercised without torch
    raise ImportError('lmdbio.torch needs PyTorch: pip install lmdbio[torch] '
                      '(or torch)  [%s]' % _e) from _e

__all__ = ['LMDBDataset', 'LMDBIterableDataset', 'partition']


def _with_color(decode, color):
    """`decode` called with ``color=color`` (lmdbio.datum's decoders take
    it); unchanged when color is None."""
    if color is None:
        return decode
    if decode is None:
        raise ValueError('color=%r needs a decode callable (e.g. '
                         'lmdbio.datum.decode_one)' % (color,))
    from lmdbio.datum import _check_color
    import functools
    _check_color(color)
    return functools.partial(decode, color=color)


def _dist_rank_size(rank, world_size):
    """Explicit values, else torch.distributed's, else torchrun's
    environment (RANK, WORLD_SIZE), else (0, 1)."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError('give both rank and world_size, or neither')
        rank, world_size = int(rank), int(world_size)
    else:
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except Exception:
            pass
        env = os.environ
        if 'RANK' in env and 'WORLD_SIZE' in env:
            rank, world_size = int(env['RANK']), int(env['WORLD_SIZE'])
        else:
            return 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError('need 0 <= rank < world_size, got rank=%d '
                         'world_size=%d' % (rank, world_size))
    return rank, world_size


def partition(n, part, parts):
    """``[lo, hi)``: the part-th of `parts` near-equal contiguous pieces of
    range(n) (sizes differ by at most one; together exactly range(n))."""
    return n * part // parts, n * (part + 1) // parts


# Readers inherited from a parent process (fork): kept, never closed.
_INHERITED = []


def _reader_takes(name):
    import inspect
    from lmdbio.reader import Reader
    try:
        return name in inspect.signature(Reader).parameters
    except (TypeError, ValueError):
        return False


class _ReaderHolder:
    """One lmdbio.Reader per process, opened on first use; not pickled."""

    def _init_reader(self, path, reader_kwargs, need_keys=True):
        if not need_keys and _reader_takes('keys'):
            reader_kwargs.setdefault('keys', False)
        self.path = ([os.fspath(p) for p in path]
                     if isinstance(path, (list, tuple)) else os.fspath(path))
        self.reader_kwargs = dict(reader_kwargs)
        self._reader = None
        self._pid = None
        self._len = None

    def _open(self):
        from lmdbio.reader import Reader
        kw = dict(self.reader_kwargs)
        kw.setdefault('lock', False)
        return Reader(self.path, **kw)

    def _drop_inherited(self):
        """A Reader inherited across fork() belongs to the parent: its I/O
        threads do not exist here, so it must never be closed (joined) in
        this process.  Keep it alive, unused."""
        if self._reader is not None and self._pid != os.getpid():
            _INHERITED.append(self._reader)
            self._reader = None

    def _get_reader(self):
        self._drop_inherited()
        if self._reader is None:
            self._reader = self._open()
            self._pid = os.getpid()
        return self._reader

    def _record_count(self):
        if self._len is None:
            self._drop_inherited()
            if self._reader is not None:
                self._len = self._reader.total_records
            else:
                # a short-lived Reader: no I/O threads left running in a
                # process that may fork DataLoader workers next
                r = self._open()
                try:
                    self._len = r.total_records
                finally:
                    r.close()
        return self._len

    def __getstate__(self):
        state = self.__dict__.copy()
        state['_reader'] = None
        state['_pid'] = None
        return state

    def close(self):
        """Close this process's Reader (reopened on next use)."""
        self._drop_inherited()
        if self._reader is not None:
            self._reader.close()
        self._reader = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class LMDBDataset(_ReaderHolder, Dataset):
    """Map-style dataset: ``ds[i]`` is record ``i`` in key order.

    ``LMDBDataset(path, *, db=None, decode=None, color=None,
    **Reader_kwargs)``: items are ``(key, value)`` bytes, or
    ``decode(value)`` (``decode(value, color=color)`` when color is given).  ``len(ds)`` is the
    number of records.  Negative indices count from the end.

    ``path`` (or a list of paths: several environments as one dataset),
    ``db``, ``subdir``, ``lock`` (default ``False``: no reader
    slot), ``index_cache`` and the other keyword arguments go to the
    :class:`lmdbio.Reader` that each process opens on first use (the
    dataset pickles without it, for DataLoader workers).
    """

    def __init__(self, path, *, db=None, decode=None, subdir=True,
                 lock=False, index_cache=True, color=None, **reader_kwargs):
        reader_kwargs.update(db=db, subdir=subdir, lock=lock,
                             index_cache=index_cache)
        decode = _with_color(decode, color)
        self._init_reader(path, reader_kwargs, need_keys=decode is None)
        self.decode = decode

    def __len__(self):
        return self._record_count()

    def _ordinals(self, indices):
        n = len(self)
        idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if not len(idx):
            return idx
        least, most = ordinal_bounds(idx)
        if least < 0:   # from the end
            idx = np.where(idx < 0, idx + n, idx)
            least, most = ordinal_bounds(idx)
        if least < 0 or most >= n:
            raise IndexError('record index out of range (%d records)' % n)
        return idx

    def _items(self, batch):
        values = batch.values.tolist()
        if self.decode is not None:
            return [self.decode(v) for v in values]
        return list(zip(batch.keys.tolist(), values))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.__getitems__(range(*i.indices(len(self))))
        if not isinstance(i, (int, np.integer)):
            try:
                i = int(i)  # a 0-d tensor
            except (TypeError, ValueError):
                raise TypeError('index must be an int, not %s'
                                % type(i).__name__) from None
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError('record index out of range (%d records)' % n)
        key, value = self._get_reader()._record(i)
        if self.decode is not None:
            return self.decode(value)
        return key, value

    def state_dict(self):
        """A map-style dataset has no position (the sampler has): the
        record count, checked by :meth:`load_state_dict`."""
        return {'total_records': int(len(self))}

    def load_state_dict(self, state):
        """Check that ``state`` comes from a dataset of as many records."""
        check_state(state, self.state_dict(), 'LMDBDataset')

    def __getitems__(self, indices):
        """The items at these indices with one bulk read (the DataLoader
        calls this for a whole batch)."""
        idx = self._ordinals(list(indices))
        if not len(idx):
            return []
        return self._items(self._get_reader().read(idx))




class LMDBIterableDataset(_ReaderHolder, IterableDataset):
    """Streams the records, split across ranks and DataLoader workers.

    ``LMDBIterableDataset(path, *, batch_size=None, shuffle=False, seed=0,
    db=None, decode=None, rank=None, world_size=None, drop_last=False,
    **Reader_kwargs)``.

    The epoch's order is ``range(N)`` or, with ``shuffle``, lmdbio's
    ``numpy.random.default_rng([seed, epoch]).permutation(N)`` (set the
    epoch with :meth:`set_epoch` before iterating, as with
    ``DistributedSampler``).  Rank r of P gets the r-th of P contiguous
    near-equal pieces of that order, and its DataLoader worker w of W the
    w-th piece of that (with ``batch_size``: the batches w, w + W, ...):
    every record goes to exactly one (rank, worker), none twice.  ``drop_last=True`` makes every rank's share equal (``N // P``
    records, the rest unread), for collectives that need equal steps.
    Rank and world size: explicit, else ``torch.distributed`` when
    initialised, else ``$RANK``/``$WORLD_SIZE`` (torchrun), else 0 and 1.

    ``batch_size=None``: items are ``(key, value)`` or ``decode(value)``;
    use ``DataLoader(ds, batch_size=k)``.  ``batch_size=k``: items are whole
    batches of up to k records read in one bulk request: ``decode`` is then
    called once per batch with the values (a :class:`lmdbio.Ragged`, e.g.
    ``decode=lmdbio.datum.decode`` gives ``(data[k, C, H, W], labels[k])``),
    without it a batch is ``(keys, values)`` lists; use
    ``DataLoader(ds, batch_size=None)``.  ``color``: ``"rgb"`` or ``"bgr"``,
    passed to ``decode`` as ``decode(values, color=color)`` (lmdbio.datum's
    decoders take it); None (default) passes nothing.

    ``read_size``: records per bulk read when ``batch_size`` is None.
    ``prefetch``: how many reads a background thread runs ahead (0: none).
    ``path`` (or a list of paths: several environments as one dataset),
    ``db``, ``subdir``, ``lock`` (default ``False``: no reader
    slot), ``index_cache`` and the other keyword arguments go to the
    :class:`lmdbio.Reader` each process opens on first use.
    """

    def __init__(self, path, *, batch_size=None, shuffle=False, seed=0,
                 db=None, decode=None, rank=None, world_size=None,
                 drop_last=False, read_size=256, prefetch=2, subdir=True,
                 lock=False, index_cache=True, color=None, **reader_kwargs):
        reader_kwargs.update(db=db, subdir=subdir, lock=lock,
                             index_cache=index_cache)
        decode = _with_color(decode, color)
        self._init_reader(path, reader_kwargs, need_keys=decode is None)
        if batch_size is not None and int(batch_size) < 1:
            raise ValueError('batch_size must be at least 1 (or None)')
        self.batch_size = None if batch_size is None else int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.decode = decode
        self.drop_last = bool(drop_last)
        self.read_size = max(1, int(read_size))
        self.prefetch = int(prefetch)
        self.epoch = 0
        self._rank, self._world_size = rank, world_size
        _dist_rank_size(rank, world_size)  # validate now
        self._skip = 0  # items the next iteration skips (load_state_dict)
        self._yielded = 0  # items this process yielded this epoch

    def set_epoch(self, epoch):
        """The epoch whose order the next iteration follows (the same
        epoch again keeps a position restored by :meth:`load_state_dict`)."""
        epoch = int(epoch)
        if epoch != self.epoch:
            self._skip = self._yielded = 0
        self.epoch = epoch

    def state_dict(self):
        """Where this process's iteration is (in a DataLoader worker: that
        worker's): a JSON-serialisable dict of the epoch, the items yielded
        this epoch and what defines the order.  torchdata's
        ``StatefulDataLoader`` saves it from each worker and hands it back
        with :meth:`load_state_dict`."""
        rank, world, wid, nworkers = self._where()
        seed = self.seed
        if isinstance(seed, np.integer):
            seed = int(seed)
        return {'epoch': int(self.epoch), 'items': int(self._yielded),
                'seed': seed, 'shuffle': self.shuffle, 'rank': rank,
                'world_size': world, 'worker': wid, 'num_workers': nworkers,
                'drop_last': self.drop_last, 'batch_size': self.batch_size,
                'total_records': int(self._record_count())}

    def load_state_dict(self, state):
        """Resume at ``state``: the next iteration yields the rest of that
        epoch.  A state of another order (record count, sharding, worker
        count, batch size...) raises ValueError naming the field."""
        epoch, items = check_state(state, self.state_dict(),
                                   'LMDBIterableDataset', ('epoch', 'items'))
        self.epoch = epoch
        self._skip = self._yielded = items

    def _where(self):
        rank, world = _dist_rank_size(self._rank, self._world_size)
        info = get_worker_info()
        wid, nworkers = (info.id, info.num_workers) if info else (0, 1)
        return rank, world, wid, nworkers

    def ordinals(self, rank=None, world_size=None, worker=0, num_workers=1):
        """The record ordinals that rank ``rank`` of ``world_size``, worker
        ``worker`` of ``num_workers``, reads this epoch, in order (default
        rank and world size: as iteration would find them)."""
        if rank is None and world_size is None:
            rank, world_size = _dist_rank_size(self._rank, self._world_size)
        else:
            rank, world_size = _dist_rank_size(rank, world_size)
        n = self._record_count()
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        if self.drop_last:
            per = n // world_size
            mine = order[rank * per:(rank + 1) * per]
        else:
            lo, hi = partition(n, rank, world_size)
            mine = order[lo:hi]
        if self.batch_size is not None:
            # whole batches, dealt round robin: the DataLoader, which takes
            # one item from each worker in turn, yields them in order
            bs = self.batch_size
            starts = range(worker * bs, len(mine), num_workers * bs)
            if not len(starts):
                return np.zeros(0, dtype=np.int64)
            return np.ascontiguousarray(np.concatenate(
                [mine[s:s + bs] for s in starts]), dtype=np.int64)
        lo, hi = partition(len(mine), worker, num_workers)
        return np.ascontiguousarray(mine[lo:hi], dtype=np.int64)

    def __len__(self):
        """Items this rank yields per epoch, all its DataLoader workers
        together: records, or with batch_size, batches."""
        rank, world, _, _ = self._where()
        if self.batch_size is None:
            return len(self.ordinals(rank, world))
        bs, self.batch_size = self.batch_size, None
        try:
            n = len(self.ordinals(rank, world))
        finally:
            self.batch_size = bs
        return -(-n // bs)

    def _chunks(self, ordinals):
        step = self.batch_size or self.read_size
        for s in range(0, len(ordinals), step):
            yield ordinals[s:s + step]

    def _reads(self, ordinals):
        """Batches of the reader, read one step ahead in a thread."""
        reader = self._get_reader()
        if self.prefetch <= 0:
            for chunk in self._chunks(ordinals):
                yield reader.read(chunk)
            return
        from lmdbio.datum import prefetched
        yield from prefetched(
            lambda: (reader.read(c) for c in self._chunks(ordinals)),
            self.prefetch, 'lmdbio-torch')

    def __iter__(self):
        rank, world, wid, nworkers = self._where()
        ordinals = self.ordinals(rank, world, wid, nworkers)
        skip, self._skip = self._skip, 0
        self._yielded = skip
        ordinals = ordinals[skip * (self.batch_size or 1):]
        decode = self.decode
        for batch in self._reads(ordinals):
            if self.batch_size is not None:
                if decode is not None:
                    item = decode(batch.values)
                else:
                    item = batch.keys.tolist(), batch.values.tolist()
                self._yielded += 1
                yield item
                continue
            values = batch.values.tolist()
            items = (map(decode, values) if decode is not None
                     else zip(batch.keys.tolist(), values))
            for item in items:
                self._yielded += 1
                yield item
