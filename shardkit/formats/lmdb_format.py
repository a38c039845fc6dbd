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
``readonly=True, readahead=False, meminit=False`` and ``lock=False``, after
:func:`check_structure` has read the file's two meta pages with plain reads: a file shorter than
its meta page says (truncated, even with a manifest edited to match) is a
:class:`ShardCorruptError` naming the shard, never a SIGBUS. One environment per file and
process, shared by every reader of it and closed when the process's table of open shards
(:func:`shardkit.formats.base.max_open_shards`) needs the room. Lock-free reading is safe
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
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import lmdb

from ..errors import ShardCorruptError
from .base import FormatReader, FormatWriter, resource_errno, resource_error

__all__ = ["Writer", "Reader", "suffix", "INITIAL_MAP_SIZE", "check_structure", "LmdbHeader"]

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
        # meminit=True: LMDB zeroes a page's unused bytes before writing it. With False the
        # file would carry whatever the packing process's heap held there (other images, paths),
        # and two packs of one input would differ byte for byte.
        self._env = lmdb.open(str(self._work), subdir=False, map_size=self._map_size, lock=False,
                              sync=False, metasync=False, readahead=False, meminit=True)
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0

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


#: This process's open environments by real path: py-lmdb allows one Environment per file and
#: process, and a forked child must close the ones it inherited before it may reopen them.
_LIVE: dict[str, lmdb.Environment] = {}
_LIVE_PID = os.getpid()
_LIVE_LOCK = threading.Lock()  # decoding threads (make_loader backend="thread") share it


class _ForkGate:
    """Lets no fork happen while a thread of this process is inside LMDB (a read transaction,
    or opening or closing an environment).

    A child forked during a read (a DataLoader worker process started beside a thread-backend
    loader) inherits an environment whose transaction never ends there: py-lmdb's
    ``Environment.close()``, which the child needs before it may reopen the file, then waits
    for it forever (seen as a worker hang, 1 run in 10). Reads enter and leave the gate (two
    uncontended lock operations per sample); ``os.fork`` waits at the gate until no thread is
    inside and holds it shut across the fork; the child starts with a fresh gate.
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
    global _LIVE_LOCK, _GATE
    _LIVE_LOCK = threading.Lock()  # a decoding thread may have held it at the fork
    _GATE = _ForkGate()


os.register_at_fork(before=lambda: _GATE.before_fork(),
                    after_in_parent=lambda: _GATE.after_fork_in_parent(),
                    after_in_child=_after_fork_in_child)


# --- the file's own structure (mdb.c: MDB_page, MDB_meta, MDB_db; 64-bit builds) ---------------
MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
_P_META = 0x08
_P_INVALID = (1 << 64) - 1  # pgno of an empty tree's root
_PAGE_HEADER = struct.Struct("=QHH4x")  # mp_pgno, mp_pad, mp_flags, mp_lower/mp_upper
# mm_magic, mm_version, mm_address, mm_mapsize, mm_dbs[2] (md_pad, md_flags, md_depth,
# md_branch_pages, md_leaf_pages, md_overflow_pages, md_entries, md_root), mm_last_pg, mm_txnid
_META = struct.Struct("=IIQQ" + "IHHQQQQQ" * 2 + "QQ")


@dataclass(frozen=True)
class LmdbHeader:
    """What an LMDB file's meta pages say (the meta page LMDB itself uses: the newer of two).

    Attributes:
        page_size: bytes per page. last_page: number of the last page in use. map_size: bytes
            the writer's map held. entries: records of the main database. txnid: the
            transaction of that meta page. file_size: bytes of the file. required_size:
            ``(last_page + 1) * page_size``, the bytes a reader maps and touches.
    """

    page_size: int
    last_page: int
    map_size: int
    entries: int
    txnid: int
    file_size: int
    required_size: int


def check_structure(path, name: str | None = None) -> LmdbHeader:
    """Checks an LMDB file's own structure with plain reads, before anything maps it.

    A mapped LMDB file shorter than its meta page says ends the process with SIGBUS when a read
    touches a page past the end (a truncated copy, or one whose manifest size and hash were
    made to match). This reads the two meta pages (page 0 and page 1, one ``pread`` each), as
    LMDB's ``mdb_env_read_header`` does, and checks: the page flag and magic ``0xBEEFC0DE`` of
    both, data version 1, a page size that is a power of two in 512..65536 and the same in both,
    and, for the newer meta page (the one LMDB reads), that the file holds all its
    ``last_page + 1`` pages, that its map size covers them and that both tree roots lie within
    them. Every shardkit LMDB reader calls it on each open.

    Args:
        path: the shard file. name: how to name it in errors (default: ``path``).

    Returns:
        an :class:`LmdbHeader`.

    Raises:
        ShardCorruptError: the file is missing, not an LMDB file, or shorter than its data
            (the message names the shard, what was found and what was expected).
        OSError: EMFILE and the other resource errors, unchanged (the caller reports them).
    """
    name = name or os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        if resource_errno(e) is not None:
            raise
        raise ShardCorruptError(f"shard {name}: cannot open LMDB: {e.strerror} ({path})") from None
    try:
        file_size = os.fstat(fd).st_size
        want = _PAGE_HEADER.size + _META.size
        metas, offset = [], 0
        for i in range(2):
            raw = os.pread(fd, want, offset)
            if len(raw) < want:
                raise ShardCorruptError(
                    f"shard {name}: not a complete LMDB file: it ends at byte {file_size}, "
                    f"inside meta page {i} (bytes {offset}..{offset + want}): truncated shard?")
            flags = _PAGE_HEADER.unpack_from(raw)[2]
            meta = _META.unpack_from(raw, _PAGE_HEADER.size)
            magic, version = meta[0], meta[1]
            if not flags & _P_META or magic != MAGIC:
                raise ShardCorruptError(
                    f"shard {name}: page {i} (byte {offset}) is not an LMDB meta page (magic "
                    f"{magic:#010x}, flags {flags:#x}; expected magic {MAGIC:#010x}): not an "
                    "LMDB file, or damaged")
            if version != DATA_VERSION:
                raise ShardCorruptError(f"shard {name}: LMDB data version {version} in meta page "
                                        f"{i}, this reader reads version {DATA_VERSION}")
            page_size = meta[4]  # mm_dbs[FREE_DBI].md_pad holds the page size
            if i == 0:
                if not (512 <= page_size <= 65536 and page_size & (page_size - 1) == 0):
                    raise ShardCorruptError(f"shard {name}: LMDB meta page 0 gives page size "
                                            f"{page_size}, expected a power of two in 512..65536")
                offset = page_size
            elif page_size != metas[0]["page_size"]:
                raise ShardCorruptError(f"shard {name}: the LMDB meta pages disagree on the page "
                                        f"size ({metas[0]['page_size']} and {page_size})")
            metas.append({"page_size": page_size, "map_size": meta[3], "free_root": meta[11],
                          "main_root": meta[19], "entries": meta[18], "last_page": meta[20],
                          "txnid": meta[21]})
    finally:
        os.close(fd)
    m = metas[1] if metas[1]["txnid"] > metas[0]["txnid"] else metas[0]  # as mdb_env_pick_meta
    pages = m["last_page"] + 1
    required = pages * m["page_size"]
    if required > file_size:
        raise ShardCorruptError(
            f"shard {name}: truncated LMDB file: its meta page says {pages} pages of "
            f"{m['page_size']} bytes ({required} bytes), the file has {file_size} bytes; "
            "re-copy the shard or re-pack (reading it would crash the process with SIGBUS)")
    if m["map_size"] < required:
        raise ShardCorruptError(f"shard {name}: damaged LMDB meta page: map size "
                                f"{m['map_size']} is smaller than its {required} bytes of data")
    for root, what in ((m["free_root"], "free-page"), (m["main_root"], "main")):
        if root != _P_INVALID and root > m["last_page"]:
            raise ShardCorruptError(f"shard {name}: damaged LMDB meta page: the {what} tree's "
                                    f"root is page {root}, past the last page {m['last_page']}")
    return LmdbHeader(page_size=m["page_size"], last_page=m["last_page"],
                      map_size=m["map_size"], entries=m["entries"], txnid=m["txnid"],
                      file_size=file_size, required_size=required)


def _forget_inherited() -> None:
    """Under ``_LIVE_LOCK``: in a forked child, closes the environments it inherited (py-lmdb
    keeps a per-process "already open" registry that the child inherits, so a reopen fails
    until the inherited handle is closed; lock-free read-only environments hold no reader slot,
    so this releases nothing the parent uses: case 8)."""
    global _LIVE_PID
    if _LIVE_PID != os.getpid():
        for env in _LIVE.values():
            try:
                env.close()
            except lmdb.Error:
                pass
        _LIVE.clear()
        _LIVE_PID = os.getpid()


class Reader(FormatReader):
    def _identity(self) -> tuple:
        path = os.path.realpath(self.location)  # one environment per file, whatever the name
        try:
            st = os.stat(path)
        except OSError:
            return (__name__, path)
        return (__name__, path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def _open(self):
        """Checks the file (:func:`check_structure`), then maps it read-only."""
        path = os.path.realpath(self.location)
        check_structure(path, self.name)
        with _LIVE_LOCK:
            _forget_inherited()
            stale = _LIVE.pop(path, None)
            if stale is not None:  # the file was replaced on disk: its old map goes first
                stale.close()
            gate = _GATE
            gate.enter()
            try:
                env = lmdb.open(path, subdir=False, readonly=True, lock=False,
                                readahead=False, meminit=False)
            except (lmdb.Error, OSError) as e:
                if resource_errno(e) is not None:
                    raise
                raise ShardCorruptError(f"shard {self.name}: cannot open LMDB: {e}") from e
            finally:
                gate.leave()
            _LIVE[path] = env
        return env

    @staticmethod
    def _close_handle(env) -> None:
        with _LIVE_LOCK:
            for path in [p for p, e in _LIVE.items() if e is env]:
                del _LIVE[path]
            gate = _GATE
            gate.enter()
            try:
                env.close()
            finally:
                gate.leave()

    def read(self, key: str, offset: int, size: int) -> bytes:
        env, lease = self._acquire()
        gate = _GATE
        gate.enter()
        try:
            with env.begin(buffers=False) as txn:
                data = txn.get(key.encode("ascii"))
        except lmdb.Error as e:
            err = resource_error(e, f"shard {self.name}: reading sample {key!r}", self.location)
            raise (err or ShardCorruptError(f"shard {self.name}: reading sample {key!r} failed: "
                                            f"{e}", shard=self.name, key=key)) from e
        finally:
            gate.leave()
            self._release(lease)
        if data is None:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} not found",
                                    shard=self.name, key=key)
        if len(data) != size:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} has {len(data)} bytes, "
                                    f"the index says {size}", shard=self.name, key=key)
        return data
