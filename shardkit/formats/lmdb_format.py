"""LMDB shards (format name ``lmdb``).

On-disk layout: one single-file LMDB environment per shard (``subdir=False``), a single unnamed
database mapping the sample key (ASCII bytes) to the stored image bytes, unchanged. Labels and
counts live in the manifest and split index, so a reader never needs a transaction in the parent.

Writing (field case 9): puts are committed in batches; on ``MapFullError`` the map size is doubled
and the batch retried, so no size guess can fail a pack. After the last batch the environment is
copied with compaction to a tight file, and the working copy is removed. LMDB reports a full disk
during a commit as an "Input/output error" without an errno: a failed commit with less free space
left than it needed, or a ``DiskError``, raises ``OSError(ENOSPC, ..., <shard file>)``, any other
failure an ``OSError(EIO, ...)`` naming the file; either way the writer's files are removed
first.

Reading (field cases 8 and 9): opened lazily per process (reopened after fork), with
``readonly=True, readahead=False, meminit=False`` and ``lock=False``. Lock-free reading is safe
only because shards are immutable once packed (nothing ever writes them again), and it removes the
whole class of reader-slot failures at once: no ``lock.mdb`` to create (works on read-only mounts
and ``chmod 0555`` copies), no 126-slot reader table to fill (``ReadersFullError`` after many
epochs of re-created workers), and no stale slots left by SIGKILLed workers. This is the usual
recipe for training data (BasicSR and most PyTorch LMDB datasets open with ``lock=False``).
"""
from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path

import lmdb

from ..errors import ShardCorruptError
from .base import FormatReader, FormatWriter

__all__ = ["Writer", "Reader", "suffix", "INITIAL_MAP_SIZE"]

suffix = ".lmdb"
INITIAL_MAP_SIZE = 64 << 20   # bytes; grows by doubling on MapFullError
BATCH_BYTES = 16 << 20        # commit every 16 MiB of image bytes


class Writer(FormatWriter):
    suffix = suffix

    def __init__(self, path, initial_map_size: int = INITIAL_MAP_SIZE):
        super().__init__(path)
        self._work = self.path.with_name(self.path.name + ".work")
        for p in (self._work, Path(str(self._work) + "-lock")):
            p.unlink(missing_ok=True)
        self._map_size = int(initial_map_size)
        self._env = lmdb.open(str(self._work), subdir=False, map_size=self._map_size, lock=False,
                              sync=False, metasync=False, readahead=False, meminit=False)
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0
        self.map_growths = 0

    def add(self, key: str, data: bytes, ext: str, label: int, meta=None) -> int:
        self._batch.append((key.encode("ascii"), bytes(data)))
        self._batch_bytes += len(data)
        if self._batch_bytes >= BATCH_BYTES:
            self._commit()
        return 0

    def _commit(self) -> None:
        while self._batch:
            try:
                with self._env.begin(write=True) as txn:
                    for k, v in self._batch:
                        txn.put(k, v, overwrite=True)
            except lmdb.MapFullError:
                self._map_size *= 2
                self._env.set_mapsize(self._map_size)
                self.map_growths += 1
                continue
            except lmdb.Error as e:
                self._fail(e, self._batch_bytes + (1 << 20))
            self._batch, self._batch_bytes = [], 0

    def close(self) -> None:
        if self._env is None:
            return
        try:
            self._commit()
            self._env.sync(True)
            self.path.unlink(missing_ok=True)
            needed = self._work.stat().st_size
            try:
                self._env.copy(str(self.path), compact=True)
            except lmdb.Error as e:
                self._fail(e, needed)
            self._env.close()
            self._env = None
            self._work.unlink(missing_ok=True)
            with open(self.path, "rb+") as f:
                os.fsync(f.fileno())
        except BaseException:
            self.abort()
            raise

    def _fail(self, exc: lmdb.Error, needed: int):
        """Raises the OSError for a failed LMDB write (see the module doc); files removed."""
        try:
            free = shutil.disk_usage(self.path.parent).free
        except OSError:
            free = None
        self.abort()
        if isinstance(exc, lmdb.DiskError) or (free is not None and free < needed):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path)) from exc
        raise OSError(errno.EIO, f"LMDB write failed ({exc})", str(self.path)) from exc

    def abort(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            except lmdb.Error:
                pass
            self._env = None
        for p in (self._work, Path(str(self._work) + "-lock"), self.path):
            p.unlink(missing_ok=True)


_ENVS: dict[tuple, lmdb.Environment] = {}  # per process: py-lmdb allows one Environment per file
_ENVS_PID = os.getpid()
_ENVS_LOCK = threading.Lock()  # decoding threads (make_loader backend="thread") share the cache


class _ForkGate:
    """Lets no fork happen while a thread of this process is inside an LMDB read transaction.

    A child forked during one (a DataLoader worker process started beside a thread-backend
    loader) inherits an environment whose transaction never ends there: py-lmdb's
    ``Environment.close()``, which the child needs before it may reopen the file, then waits
    for it forever (seen as a worker hang, 1 run in 10). Reads enter and leave the gate (two
    uncontended lock operations per sample); ``os.fork`` waits at the gate until no read is
    in flight and holds it shut across the fork; the child starts with a fresh gate.
    """

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._active = 0

    def enter(self) -> None:
        with self._cond:
            self._active += 1

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()
        while self._active:
            self._cond.wait()

    def after_fork_in_parent(self) -> None:
        self._cond.release()


_GATE = _ForkGate()


def _after_fork_in_child() -> None:
    global _ENVS_LOCK, _GATE
    _ENVS_LOCK = threading.Lock()  # a decoding thread may have held it at the fork
    _GATE = _ForkGate()


os.register_at_fork(before=lambda: _GATE.before_fork(),
                    after_in_parent=lambda: _GATE.after_fork_in_parent(),
                    after_in_child=_after_fork_in_child)


class Reader(FormatReader):
    def _open(self):
        with _ENVS_LOCK:
            return self._open_locked()

    def _open_locked(self):
        global _ENVS_PID
        if _ENVS_PID != os.getpid():
            # Forked child: close this process's copies of the parent's environments before any
            # reopen. py-lmdb keeps a per-process "already open" registry that the child inherits,
            # so a reopen fails until the inherited handle is closed. Lock-free read-only
            # environments hold no reader slot, so this releases nothing the parent uses (case 8).
            for env in _ENVS.values():
                try:
                    env.close()
                except lmdb.Error:
                    pass
            _ENVS.clear()
            _ENVS_PID = os.getpid()
        path = os.path.realpath(self.location)
        try:
            st = os.stat(path)
        except OSError as e:
            raise ShardCorruptError(f"shard {self.name}: cannot open LMDB: {e}") from e
        cache_key = (path, st.st_ino, st.st_mtime_ns, st.st_size)  # a rewritten file is a new env
        env = _ENVS.get(cache_key)
        if env is None:
            # the file was rewritten: py-lmdb refuses a second environment on one path in a
            # process, so the stale one is closed first
            for old in [k for k in _ENVS if k[0] == path]:
                _ENVS.pop(old).close()
            try:
                env = lmdb.open(path, subdir=False, readonly=True, lock=False,
                                readahead=False, meminit=False)
            except lmdb.Error as e:
                raise ShardCorruptError(f"shard {self.name}: cannot open LMDB: {e}") from e
            _ENVS[cache_key] = env
        return env

    def close(self) -> None:
        self._handle = None  # the environment is shared within the process; it stays open

    def read(self, key: str, offset: int, size: int) -> bytes:
        env = self._get()
        gate = _GATE
        gate.enter()
        try:
            with env.begin(buffers=False) as txn:
                data = txn.get(key.encode("ascii"))
        except lmdb.Error as e:
            raise ShardCorruptError(f"shard {self.name}: reading sample {key!r} failed: {e}") from e
        finally:
            gate.leave()
        if data is None:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} not found")
        if len(data) != size:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} has {len(data)} bytes, "
                                    f"the index says {size}")
        return data
