"""What every shard format shares: the writer and reader interfaces, shard names, hashing.

A format module only moves bytes: its :class:`FormatWriter` appends ``(key, data, ext, label)``
to one open shard file and returns the offset to record in the split index; its
:class:`FormatReader` returns the stored bytes of one sample. ``ShardSink``
(:mod:`shardkit.formats.sink`) owns everything else, so every format gets the same crash safety
(field case 5):

- a shard is written as ``shards/.<split>-NNNNNN<suffix>.tmp``, flushed, fsynced, then renamed to
  ``shards/<split>-NNNNNN<suffix>``; a killed run leaves only ``*.tmp`` files, which
  the next pack into that folder deletes (:func:`shardkit.packer.outputs.owned.owned_entries`);
- a shard is opened only when its first sample arrives, so there are never empty shards;
- rollover happens before a sample that would exceed ``max_samples`` or ``max_bytes`` (a single
  sample larger than ``max_bytes`` gets a shard of its own);
- after the last rename the ``shards/`` folder is fsynced, before the caller writes the manifest.

Readers (field cases 8, 10 and 14): every process keeps at most :func:`max_open_shards` shard
files open, least recently used closed first (one table shared by all readers of the process);
an OS error that means "out of a resource" (EMFILE, ENFILE, ENOMEM, EAGAIN, ENOBUFS) is raised
as :class:`~shardkit.errors.ResourceLimitError` naming the limit, never as damage.

This module imports only :mod:`shardkit.errors` from the package (format modules import it; the
registry in :mod:`shardkit.formats.registry` imports the format modules), so there is no import
cycle.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import resource
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping

from ..errors import ResourceLimitError, ShardCorruptError

__all__ = ["FormatWriter", "FormatReader", "sha256_file", "shard_name",
           "TMP_SUFFIX", "max_open_shards", "open_shard_count", "close_all_shards",
           "resource_errno", "resource_error", "RESOURCE_ERRNOS"]

TMP_SUFFIX = ".tmp"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def shard_name(split: str, index: int, suffix: str) -> str:
    """``<split>-NNNNNN<suffix>``, e.g. ``train-000003.tar``."""
    return f"{split}-{index:06d}{suffix}"


class FormatWriter(ABC):
    """Writes one shard file at ``path`` (a temporary name; :class:`ShardSink` renames it)."""

    suffix: str = ""

    def __init__(self, path: Path):
        self.path = Path(path)

    @abstractmethod
    def add(self, key: str, data: bytes, ext: str, label: int,
            meta: Mapping[str, Any] | None = None) -> int:
        """Appends one sample; returns its offset for the index (format-specific meaning).

        ``meta`` is the sample's ``{"key", "label", "class", "path"}`` (source relpath); a
        format stores it only when asked to (wds ``wds_json``), the others ignore it."""

    @abstractmethod
    def close(self) -> None:
        """Flushes and fsyncs the file. After this the file at ``self.path`` is complete."""

    def abort(self) -> None:
        """Releases resources after a failure (the sink deletes the temporary file)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort on an already failing path
            pass


#: Errors of the operating system that mean "out of a resource", never "bad data".
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN,
                             errno.ENOBUFS})

#: Bounds of :func:`max_open_shards` (shards open at once per process).
MIN_OPEN_SHARDS, MAX_OPEN_SHARDS = 4, 4096


def max_open_shards() -> int:
    """How many shard files one process keeps open at once: a quarter of the soft
    ``RLIMIT_NOFILE`` (``ulimit -n``), between 4 and 4096 (16 under ``ulimit -n 64``, 256 under
    the common 1024, 4096 from 16384 up); ``SHARDKIT_MAX_OPEN_SHARDS`` overrides it (at least
    1). The other three quarters stay for everything else a training process opens (DataLoader
    worker pipes, shared-memory handles of batches in flight, logs, checkpoints). Read at each
    shard open, so a limit changed at run time applies. Reading more shards than this in random
    order reopens them: one ``open`` for a tar or HDF5 shard (its parsed arrays are kept), a
    meta-page check and a new map for an LMDB shard (~60 us here)."""
    env = os.environ.get("SHARDKIT_MAX_OPEN_SHARDS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    soft = _nofile()[0]
    return max(MIN_OPEN_SHARDS, min(MAX_OPEN_SHARDS, soft // 4))


def _nofile() -> tuple[int, int]:
    """``(soft, hard)`` RLIMIT_NOFILE; an unlimited value reads as 1 << 20."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    return (1 << 20 if soft == unlimited else soft), (1 << 20 if hard == unlimited else hard)


def resource_errno(exc: BaseException) -> int | None:
    """The errno of ``exc`` when it is in :data:`RESOURCE_ERRNOS` (an ``OSError``, h5py's
    ``OSError`` whose text says ``errno = N``, py-lmdb's ``MemoryError``, or a
    :class:`ResourceLimitError`), else None."""
    if isinstance(exc, ResourceLimitError):
        return exc.errno
    if isinstance(exc, OSError):
        code = exc.errno
        if code is None:
            found = re.search(r"errno = (\d+)", str(exc))
            code = int(found.group(1)) if found else None
        return code if code in RESOURCE_ERRNOS else None
    if type(exc).__name__ == "MemoryError":  # builtins.MemoryError, lmdb.MemoryError (ENOMEM)
        return errno.ENOMEM
    return None


def resource_error(exc: BaseException, what: str, path: str | None = None
                   ) -> ResourceLimitError | None:
    """The :class:`ResourceLimitError` for ``exc`` when the OS ran out of a resource (see
    :func:`resource_errno`), else None. ``what`` names the work that failed
    ("opening shard shards/train-000003.tar"); the message says which limit and what to do."""
    code = resource_errno(exc)
    if code is None:
        return None
    if isinstance(exc, ResourceLimitError):
        return exc
    soft, hard = _nofile()
    if code == errno.EMFILE:
        why = (f"this process has too many open files (EMFILE): its limit RLIMIT_NOFILE is "
               f"{soft} (hard {hard}); shardkit keeps at most {max_open_shards()} shards open "
               "per process. Raise the limit (`ulimit -n 4096` in the shell that starts the "
               "job, or resource.setrlimit(resource.RLIMIT_NOFILE, ...)) or open fewer files "
               "beside the loader")
    elif code == errno.ENFILE:
        why = ("the system's table of open files is full (ENFILE): close other programs' files "
               "or raise the system limit (`sysctl fs.file-max`)")
    elif code == errno.ENOMEM:
        as_soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        limit = "unlimited" if as_soft == resource.RLIM_INFINITY else f"{as_soft} bytes"
        why = ("out of memory or address space for the shard's buffers or memory map (ENOMEM; "
               f"RLIMIT_AS, `ulimit -v`, is {limit}; see also `sysctl vm.max_map_count`): free "
               "memory, raise the limit, or use fewer DataLoader workers")
    else:
        why = (f"a resource of the operating system is exhausted ({errno.errorcode[code]}: "
               f"{os.strerror(code)}): retry when the system is less loaded, or raise the "
               "process limits (`ulimit -a` lists them)")
    return ResourceLimitError(f"{what}: {why}. This is not data damage: no sample was found "
                              "wrong", errno=code, path=path)


class _Open:
    """One open shard file of this process: its handle, the reads in flight on it, the lock its
    (re)open holds, and whether it closes when the last read in flight ends (``doomed``:
    :meth:`FormatReader.close` was called during a read)."""

    __slots__ = ("key", "handle", "users", "lock", "closer", "doomed")

    def __init__(self, key, closer):
        self.key = key
        self.handle = None
        self.users = 0
        self.lock = threading.Lock()
        self.closer = closer
        self.doomed = False


class _OpenShards:
    """The shard files open in this process, least recently used first (one table per process,
    shared by every reader: loaders, verify, the doctor commands).

    At most :func:`max_open_shards` handles are open; opening one more closes the least
    recently used handle that no read is using (never one in use: a thread's ``pread`` never
    meets a closed or reused descriptor). When every open handle is in use (more decoding
    threads than the bound) the table holds one more until a read ends. Readers of the same
    file (same path and stat identity) share one handle, which LMDB requires (py-lmdb refuses a
    second environment on one file in a process)."""

    def __init__(self, inherited=()):
        self.lock = threading.Lock()
        self.entries: OrderedDict[tuple, _Open] = OrderedDict()
        self.num_open = 0
        #: ``(closer, handle)`` copies a forked child inherited: closed before its first open
        self.inherited = list(inherited)

    def victims(self, limit: int, spare: _Open | None = None) -> list[tuple[Any, Any]]:
        """Under ``self.lock``: detaches least recently used unused handles until at most
        ``limit`` are open (and any inherited through a fork); returns ``(closer, handle)``
        pairs to close outside the lock. Walks from the least recently used end and stops as
        soon as enough are found."""
        out, self.inherited = self.inherited, []
        excess = self.num_open - limit
        if excess <= 0:
            return out
        doomed = []
        for key, entry in self.entries.items():
            if entry.users == 0 and entry.handle is not None and entry is not spare:
                doomed.append(key)
                if len(doomed) == excess:
                    break
        for key in doomed:
            entry = self.entries.pop(key)
            out.append((entry.closer, entry.handle))
            entry.handle = None
            self.num_open -= 1
        return out


_TABLE = _OpenShards()


def open_shard_count() -> int:
    """Shard handles open in this process now (at most :func:`max_open_shards` between reads)."""
    return _TABLE.num_open


def close_all_shards() -> int:
    """Closes every shard handle of this process that no read is using; they reopen lazily.
    Returns how many were closed."""
    with _TABLE.lock:
        victims = _TABLE.victims(0)
    _close(victims)
    return len(victims)


def _close(victims) -> None:
    for closer, handle in victims:
        try:
            closer(handle)
        except Exception:  # noqa: BLE001 - closing a read-only handle: nothing to save
            pass


def _fresh_table_in_child() -> None:
    """A forked child starts with an empty table and fresh locks (a decoding thread may have
    held one at the fork). Its copies of the parent's handles are closed at its first shard
    open, after every fork hook has run (the parent's stay open: a fork duplicates them), so
    they do not count against the child's own limit."""
    global _TABLE
    old = _TABLE
    _TABLE = _OpenShards(old.inherited + [(e.closer, e.handle) for e in old.entries.values()
                                          if e.handle is not None])


os.register_at_fork(after_in_child=_fresh_table_in_child)


class FormatReader(ABC):
    """Reads samples from one finished shard. Opens lazily, per process (after fork it
    reopens; field cases 8 and 10), and pickles without any handle (spawn start method).

    Handles live in the process's table of open shards (see :func:`max_open_shards`), so a
    reader may find its file closed between reads (another shard was opened) and reopens it;
    an open that the OS refuses for lack of a resource raises :class:`ResourceLimitError`,
    never :class:`ShardCorruptError`. Subclasses read through :meth:`_acquire` /
    :meth:`_release`.
    """

    def __init__(self, location: str, name: str | None = None):
        self.location = str(location)
        self.name = name or self.location
        #: the manifest's size of the shard in bytes, or None (unchecked); set by open_reader
        self.expected_bytes: int | None = None
        self._key = None  # (pid, table key), computed on first use in a process

    def _identity(self) -> tuple:
        """The table key of this reader's file: its path and ``(dev, inode, mtime_ns, size)``,
        so a file replaced on disk (a re-pack) is a new entry. Formats override it (remote
        URLs have no stat; LMDB keys on the real path)."""
        try:
            st = os.stat(self.location)
        except OSError:
            return (type(self).__module__, self.location)
        return (type(self).__module__, self.location, st.st_dev, st.st_ino, st.st_mtime_ns,
                st.st_size)

    def _table_key(self) -> tuple:
        pid = os.getpid()
        cached = self._key
        if cached is None or cached[0] != pid:
            cached = self._key = (pid, self._identity())
        return cached[1]

    def _acquire(self) -> tuple[Any, _Open]:
        """``(handle, lease)``: this process's open handle of the shard, opened if need be and
        in use until ``self._release(lease)`` (pair them with try/finally). Opening closes least
        recently used handles past :func:`max_open_shards`.

        Raises:
            ShardCorruptError: from :meth:`_open` (a missing or malformed shard).
            ResourceLimitError: the OS refused the open for lack of a resource, even after
                this process's unused shard handles were closed.
        """
        key = self._table_key()
        table = _TABLE
        with table.lock:
            entry = table.entries.get(key)
            if entry is None:
                entry = table.entries[key] = _Open(key, type(self)._close_handle)
            else:
                table.entries.move_to_end(key)
            entry.users += 1
            handle = entry.handle
        if handle is not None:
            return handle, entry
        try:
            with entry.lock:  # one thread opens; the others wait for its handle
                if entry.handle is None:
                    with table.lock:
                        inherited, table.inherited = table.inherited, []
                    _close(inherited)
                    handle = self._open_or_free(table, entry)
                    with table.lock:
                        entry.handle = handle
                        table.num_open += 1
                        victims = table.victims(max_open_shards(), spare=entry)
                    _close(victims)
                return entry.handle, entry
        except BaseException:
            self._release(entry)
            raise

    def _open_named(self):
        """:meth:`_open`; a :class:`ShardCorruptError` it raises is about this whole shard, so
        it carries ``shard=self.name`` (the read path tells it from a sample's error by that)."""
        try:
            return self._open()
        except ShardCorruptError as e:
            if e.shard is None:
                e.shard = self.name
            raise

    def _open_or_free(self, table: _OpenShards, entry: _Open):
        """:meth:`_open`; when the OS is out of a resource, closes this process's unused shard
        handles and tries once more, then raises :class:`ResourceLimitError`."""
        try:
            return self._open_named()
        except Exception as exc:  # noqa: BLE001 - only resource errors are retried
            if resource_errno(exc) is None:
                raise
        with table.lock:
            victims = table.victims(0, spare=entry)
        _close(victims)
        try:
            return self._open_named()
        except Exception as exc:  # noqa: BLE001 - classified below, else re-raised as is
            err = resource_error(exc, f"opening shard {self.name}", self.location)
            if err is None:
                raise
            raise err from exc

    @staticmethod
    def _release(lease: _Open) -> None:
        """Ends a read begun with :meth:`_acquire` (``lease`` is what it returned)."""
        table = _TABLE
        handle = None
        with table.lock:
            lease.users -= 1
            if lease.users:
                return
            if lease.doomed and lease.handle is not None:  # closed while in use: close now
                handle, lease.handle = lease.handle, None
                table.num_open -= 1
            if lease.handle is None and table.entries.get(lease.key) is lease:
                del table.entries[lease.key]  # closed, or a failed open: nothing to keep
        if handle is not None:
            _close([(lease.closer, handle)])

    @abstractmethod
    def _open(self):
        """Opens the shard for reading in this process and returns the handle."""

    @staticmethod
    def _close_handle(handle) -> None:
        """Closes a handle that :meth:`_open` returned (called once, with no read using it)."""
        if hasattr(handle, "close"):
            handle.close()

    @abstractmethod
    def read(self, key: str, offset: int, size: int) -> bytes:
        """Returns the stored bytes of sample ``key``.

        Raises:
            ShardCorruptError: the shard is truncated or the sample is missing or malformed;
                the message names the shard and the key.
            ResourceLimitError: the OS refused to open the shard (open files, memory).
        """

    def read_into(self, key: str, offset: int, size: int, buf: bytearray) -> bytes | memoryview:
        """As :meth:`read`, but may return a view into ``buf`` (a caller-owned scratch buffer of
        at least ``size + 512`` bytes) instead of allocating; valid until ``buf`` is reused.
        The default allocates (``read``); formats that ``pread`` override it."""
        return self.read(key, offset, size)

    def close(self) -> None:
        """Closes this process's handle of the shard (when a read is using it, as that read
        ends). Reading again reopens it."""
        if self._key is None or self._key[0] != os.getpid():
            return
        table = _TABLE
        with table.lock:
            entry = table.entries.get(self._key[1])
            if entry is None:
                return
            if entry.users:
                entry.doomed = True  # the last read in flight closes it (_release)
                return
            del table.entries[self._key[1]]
            handle, entry.handle = entry.handle, None
            if handle is not None:
                table.num_open -= 1
        if handle is not None:
            _close([(entry.closer, handle)])

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_key"] = None
        return state
