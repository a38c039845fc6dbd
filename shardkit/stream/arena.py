"""One file of decoded pixels shared by every process of a machine: :class:`Arena`.

The arena is a plain file memory-mapped ``MAP_SHARED`` (``mmap``): in ``/dev/shm`` (tmpfs, so
RAM) for ``cache="ram"``, in a directory of a local disk for ``cache="disk:DIR"``. Decoding
threads share the mapping; DataLoader worker processes forked from the owner inherit it; spawned
workers and other local DDP ranks open the same file by name. ``multiprocessing.shared_memory``
is not used: on Python 3.11 its resource tracker unlinks a segment when the process that created
it exits (CPython gh-82300), which is wrong for a segment other ranks still read.

Layout (little-endian)::

    0     magic b"SKARENA1" (written last at creation: a file without it is unfinished)
    8     uint64 length of the JSON header
    16    uint64 dirty flag (disk: 1 while attached; 0 after the last clean close)
    24    JSON header (identity, n, data_start), at most HEADER_BYTES - 1048 bytes
    HEADER_BYTES - 1024   uint64 length of the "filling stopped" reason (0: filling), then the
                   reason (UTF-8, at most 1016 bytes): the first process to stop filling writes
                   it, so every process stops and one warning is logged per machine
    HEADER_BYTES   per-sample table, one array each, 64-byte aligned:
                   offset int64 (into the data area), width/height int32 (stored image),
                   cw/ch int32 (cached pixels), xxh3 uint64 (of the cached pixels),
                   warnings uint16 (decoder warnings at fill), state uint8 (1 = ready)
    data (4 KiB aligned)  slot of sample i: ch * cw * 3 bytes of RGB at offset[i]

Trust: an arena file (and its ``.lock``) is used only when it is a regular file, not a symbolic
link (opened with ``O_NOFOLLOW``), owned by the calling user and not writable by group or
others; it is created with ``O_EXCL`` and mode 0600. A file of another user is refused (never
read: its pixels could be anything, and a matching checksum proves nothing about who wrote it);
one of ours that others may write is removed and rebuilt. An existing file's layout (sample
count, data start, file size, and every slot's offset and geometry) must equal the one computed
from this run's split index, else it is damaged: rebuilt, never served.

Lifetime, with ``fcntl.flock`` only (no daemon, no busy-waiting): every process that uses the
arena holds a shared lock on it; attach, create and detach happen under an exclusive lock on
``<arena>.lock``. A process that finds the arena with no shared holder (its exclusive try
succeeds) knows every user is gone: a RAM arena is then a leftover of a run that did not release
it (killed) and is removed and rebuilt; a disk arena is reused when its identity matches (after
checking the pixels of every ready slot if it was not closed cleanly). The last process to
detach a RAM arena removes it (the kernel drops the locks of killed processes, so the next run
sees them as gone). A process that opened the file and exits without :meth:`Arena.detach`
releases it all the same (a ``weakref.finalize``, run at interpreter exit or when the arena is
garbage-collected, in the process that opened it only: never in a forked worker).

Filling: the file is sparse; a slot is written with ``os.pwrite``, which gives it its tmpfs
pages or disk blocks, so a full tmpfs or disk is an ``OSError`` from that call (never a SIGBUS
inside a copy into the mapping; ``pwrite`` also costs about half of fallocate + first-touch
page faults: 0.35 vs 0.61 ms per 330 KB image here). A slot is published by setting its state
byte after its pixels and xxh3 (x86-64 keeps stores in order; readers with ``verify`` check the
xxh3 on every hit anyway). Several processes may fill the same slot at once: they write the same
bytes.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import mmap
import os
import stat
import threading
import weakref

import numpy as np

from ..errors import ArenaUnavailable
from shardkit.dataset.manifest import sample_checksum

__all__ = ["Arena", "HEADER_BYTES", "TABLE", "table_layout", "untrusted"]

log = logging.getLogger("shardkit.stream.cache")

MAGIC = b"SKARENA1"
HEADER_BYTES = 1 << 16
_STOP_AT = HEADER_BYTES - 1024  # the "filling stopped" reason: uint64 length, then UTF-8
_STOP_MAX = 1016
_DATA_ALIGN = 4096
#: The per-sample table's columns ``(name, dtype)``, in file order (see the layout above).
TABLE = (("offset", np.int64), ("width", np.int32), ("height", np.int32), ("cw", np.int32),
          ("ch", np.int32), ("xxh3", np.uint64), ("warnings", np.uint16), ("state", np.uint8))
_GEOMETRY = ("offset", "width", "height", "cw", "ch")
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def table_layout(n: int) -> tuple[dict[str, int], int]:
    """``({field: byte offset}, data start)`` of an arena of ``n`` samples."""
    offsets, pos = {}, HEADER_BYTES
    for name, dtype in TABLE:
        offsets[name] = pos
        pos = _align(pos + n * np.dtype(dtype).itemsize, 64)
    return offsets, _align(pos, _DATA_ALIGN)


def untrusted(st: os.stat_result) -> str | None:
    """Why a cache file with this ``stat`` must not be used, or None: not a regular file, owned
    by another user, or writable by group or others."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.getuid():
        return f"belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _open_nofollow(path: str, flags: int, what: str) -> int:
    """``os.open`` without following a final symbolic link; ArenaUnavailable for a link."""
    try:
        return os.open(path, flags | _OPEN, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ArenaUnavailable(f"{path} is a symbolic link: not followed, not read (a {what} "
                                   "is always a plain file of its user)") from e
        raise


class _LockFile:
    """Exclusive ``flock`` on ``path`` (created 0600 if needed), robust to the file being removed
    by the previous holder: after locking, the path must still name the locked inode. A lock
    file that is a link, of another user or writable by others is refused (ArenaUnavailable)
    before it is locked (another user could otherwise hold it forever)."""

    def __init__(self, path: str):
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_LockFile":
        while True:
            try:
                fd = _open_nofollow(self.path, os.O_CREAT, "lock file")
            except OSError as e:
                raise ArenaUnavailable(f"cannot open the lock file {self.path}: "
                                       f"{e.strerror or e}") from e
            why = untrusted(os.fstat(fd))
            if why is not None:
                os.close(fd)
                raise ArenaUnavailable(f"the lock file {self.path} {why}: not used")
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks in the kernel, no polling
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def remove(self) -> None:
        """Removes the lock file while holding it (waiters then retry on a fresh one)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing drops the flock
        self.fd = -1


def _try_exclusive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _release(path: str, fd: int, persistent: bool, owner: int, hold: bool) -> None:
    """Drops the hold of the process ``owner`` on the arena file open as ``fd``: the last holder
    removes a RAM arena, or marks a disk arena closed cleanly (after an fsync); without ``hold``
    (a worker process that only maps it) it closes ``fd``. Runs from :meth:`Arena.detach`, or
    as the arena's ``weakref.finalize`` at interpreter exit or garbage collection; in any other
    process (a forked worker holding a copy) it does nothing."""
    if os.getpid() != owner:
        return
    if not hold:
        os.close(fd)
        return
    try:
        with _LockFile(path + ".lock") as lock:
            last = _try_exclusive(fd)
            if last and persistent:
                os.fsync(fd)  # the slots (written with pwrite and through the mapping) first
                os.pwrite(fd, bytes(8), 16)
                os.fsync(fd)
            if last and not persistent:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                lock.remove()
    except (OSError, ArenaUnavailable):
        pass  # a lock file replaced under us: leave the file (the next run checks it)
    finally:
        os.close(fd)


class Arena:
    """The mapped file of one cache. Thread-safe; picklable (a copy in another process opens the
    file again by path, lazily). Built by :class:`shardkit.stream.cache.DecodedCache`.

    Args:
        path: the arena file. identity: a JSON-able dict that must match an existing file's to
            reuse it. sizes: ``(width, height, cw, ch)`` int arrays, one row per sample (stored
            image size, cached pixel size): the layout an existing file must have. persistent: a
            disk arena (kept after the last detach, reused across runs); else RAM (removed by
            the last process).
    """

    def __init__(self, path: str, identity: dict, sizes: np.ndarray | None, persistent: bool):
        self.path = str(path)
        self.identity = identity
        self.persistent = bool(persistent)
        self._sizes = None if sizes is None else np.asarray(sizes, dtype=np.int64).reshape(-1, 4)
        #: (n, data bytes, sha256 of the slot offsets and geometry) an existing file must match
        self.layout = None if self._sizes is None else _expected_layout(self._sizes)
        self._pid = None  # the process using the mapping (a forked child inherits it)
        self._owner = None  # the process that opened the file (and holds its lock)
        self._release = None
        self._fd = -1
        self._mm = None
        self._lock = threading.Lock()
        self.table: dict[str, np.ndarray] = {}
        self.n = 0
        self.data_start = 0

    # --- pickling: another process re-opens the file ------------------------------------------
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_pid=None, _owner=None, _release=None, _fd=-1, _mm=None, _lock=None,
                     table={}, _sizes=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def attached(self) -> bool:
        return self._mm is not None and self._pid == os.getpid()

    @property
    def data_bytes(self) -> int:
        """Bytes of the data area when every slot is filled."""
        t = self.table
        if not t or self.n == 0:
            return 0
        return int((t["cw"].astype(np.int64) * t["ch"] * 3).sum())

    def attach(self, hold: bool = True) -> "Arena":
        """Opens (or creates) the arena and holds a shared lock on it until :meth:`detach`.
        In a forked child the parent's mapping (and lock) are used as they are. ``hold=False``
        (a DataLoader worker process of the holder, started by spawn or forkserver): maps the
        existing arena without a lock of its own, so the holder's exit or :meth:`detach`
        releases it whether or not its workers are still alive; never creates or removes it.

        Raises:
            ArenaUnavailable: no space for the header and table, the file is in use by another
                run with a different identity (or damaged while in use), it belongs to another
                user, is writable by others while in use, or is a symbolic link.
        """
        with self._lock:
            if self._mm is not None:
                self._pid = os.getpid()  # forked: the inherited MAP_SHARED mapping stays valid
                return self
            if hold:
                with _LockFile(self.path + ".lock"):
                    self._open_locked()
            else:
                self._open_unheld()
            self._pid = self._owner = os.getpid()
            self._release = weakref.finalize(self, _release, self.path, self._fd,
                                             self.persistent, self._owner, hold)
        return self

    def _open_unheld(self) -> None:
        try:
            fd = _open_nofollow(self.path, 0, "cache file")
        except FileNotFoundError:
            raise ArenaUnavailable(f"{self.path} vanished (the process that holds it detached "
                                   "it)") from None
        try:
            st = os.fstat(fd)
            why = untrusted(st)
            header = _read_header(fd) if why is None else None
            if why is None and (header is None or header.get("identity") != self.identity):
                why = "is not the arena of this loader"
            if why is None:
                fault = self._layout_fault(fd, header)
                why = None if fault is None else f"is damaged ({fault})"
            if why is not None:
                raise ArenaUnavailable(f"{self.path} {why}: not read")
            self._map(fd, header)
        except BaseException:
            os.close(fd)
            raise

    def _open_locked(self) -> None:
        try:
            fd = _open_nofollow(self.path, 0, "cache file")
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            try:
                why = self._check_existing(fd)
            except BaseException:
                os.close(fd)
                raise
            if why is None:
                return
            log.warning("decoded cache %s: removing a stale arena, %s", self.path, why)
            os.unlink(self.path)
            os.close(fd)
        self._create()

    def _check_existing(self, fd: int) -> str | None:
        """Maps the existing file ``fd`` when it can be used (None), or says why it must be
        rebuilt (the caller removes it). Raises ArenaUnavailable (``fd`` left to the caller)
        when it must not be touched: another user's file, or an unusable file in use."""
        st = os.fstat(fd)
        why = untrusted(st)
        if why is not None and (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid()):
            raise ArenaUnavailable(f"{self.path} {why}: not read (another user may have "
                                   "written it); remove it, or point $SHARDKIT_CACHE_SHM (or "
                                   "disk:DIR) at a folder of your own")
        alone = _try_exclusive(fd)
        header = _read_header(fd)
        same = header is not None and header.get("identity") == self.identity
        damage = self._layout_fault(fd, header) if same else None
        if why is None and same and damage is None and (not alone or self.persistent):
            fcntl.flock(fd, fcntl.LOCK_SH)  # holders only ever hold shared locks
            dirty = int.from_bytes(os.pread(fd, 8, 16), "little") != 0
            self._map(fd, header)
            if alone:
                self._mm[_STOP_AT:_STOP_AT + 8] = bytes(8)  # a new run: filling may go on
                if self.persistent and dirty:
                    self._recover()
            return None
        if not alone:
            raise ArenaUnavailable(
                f"{self.path} is in use by another run and " +
                (f"{why} (its pixels cannot be trusted)" if why else
                 "has a different dataset identity" if not same else f"is damaged ({damage})"))
        if why is not None:
            return f"{why}: its pixels cannot be trusted"
        if header is None:
            return "unfinished (its creator was killed) or damaged: no valid header"
        if not same:
            return "for another dataset or resolution"
        if damage is not None:
            return f"damaged ({damage})"
        return ("a leftover of a run that was killed or otherwise ended without releasing it "
                "(no process holds it)")

    def _layout_fault(self, fd: int, header: dict) -> str | None:
        """Why the file's layout is not this split's (read with ``pread``, before any mapping),
        or None. Without an expected layout (an arena built without ``sizes``) only the header
        is checked."""
        n, data_start = header.get("n"), header.get("data_start")
        if type(n) is not int or not 0 <= n < 1 << 40:
            return f"n={n!r}"
        offsets, start = table_layout(n)
        if data_start != start:
            return f"data_start={data_start!r}, the layout of {n} samples puts it at {start}"
        if self.layout is None:
            return None
        want_n, want_bytes, want_digest = self.layout
        if n != want_n:
            return f"{n} slots, the split has {want_n} samples"
        size = os.fstat(fd).st_size
        if size < start + want_bytes:
            return f"{size} bytes, its slots need {start + want_bytes}"
        h = hashlib.sha256()
        for name, dtype in TABLE:
            if name in _GEOMETRY:
                nbytes = n * np.dtype(dtype).itemsize
                got = os.pread(fd, nbytes, offsets[name])
                if len(got) != nbytes:
                    return f"its {name} table is cut short"
                h.update(got)
        if h.hexdigest() != want_digest:
            return ("its slot offsets or sizes differ from the split index's image sizes (a "
                    "slot's width and height would be read wrongly)")
        return None

    def _create(self) -> None:
        if self._sizes is None:
            raise ArenaUnavailable(f"{self.path} vanished and this process cannot rebuild it "
                                   "(the process that built the loader must attach first)")
        sizes = self._sizes
        n = len(sizes)
        offsets, data_start = table_layout(n)
        nbytes = sizes[:, 2] * sizes[:, 3] * 3
        total = data_start + int(nbytes.sum())
        fd = _open_nofollow(self.path, os.O_CREAT | os.O_EXCL, "cache file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, max(total, data_start))  # sparse: slots get space as they fill
            os.posix_fallocate(fd, 0, data_start)
        except OSError as e:
            os.close(fd)
            os.unlink(self.path)
            raise ArenaUnavailable(f"cannot create {self.path} ({total} bytes, sparse): "
                                   f"{e.strerror}") from e
        header = {"identity": self.identity, "n": n, "data_start": data_start}
        body = json.dumps(header, sort_keys=True).encode()
        if 24 + len(body) > _STOP_AT - 24:
            os.close(fd)
            os.unlink(self.path)
            raise ArenaUnavailable(f"{self.path}: identity header too large ({len(body)} bytes)")
        self._map(fd, header, fresh=True)
        t = self.table
        for name, column in zip(_GEOMETRY, _geometry_columns(sizes)):
            t[name][:] = column
        mm = self._mm
        mm[24:24 + len(body)] = body
        mm[8:16] = len(body).to_bytes(8, "little")
        mm[16:24] = (1 if self.persistent else 0).to_bytes(8, "little")
        mm[0:8] = MAGIC  # last: the file is complete
        fcntl.flock(fd, fcntl.LOCK_SH)

    def _map(self, fd: int, header: dict, fresh: bool = False) -> None:
        size = os.fstat(fd).st_size
        self._fd = fd
        self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.n = n = int(header["n"])
        offsets, self.data_start = table_layout(n)
        buf = memoryview(self._mm)
        self.table = {name: np.frombuffer(buf, dtype, n, offsets[name]) for name, dtype in TABLE}
        if self.persistent and not fresh:
            self._mm[16:24] = (1).to_bytes(8, "little")  # dirty until the last clean close

    def _recover(self) -> None:
        """A disk arena attached with no other holder: if its last user did not close it cleanly
        (killed, power loss), every ready slot's pixels are checked against their xxh3 and the
        bad ones are marked empty (refilled on their next read, never served)."""
        state = self.table["state"]
        ready = np.flatnonzero(state == 1)
        bad = [int(i) for i in ready if sample_checksum(self.slot(int(i))) != int(
            self.table["xxh3"][i])]
        state[bad] = 0
        log.warning("decoded cache %s was not closed cleanly: checked %d ready slots, %d bad "
                    "(refilled on their next read)", self.path, len(ready), len(bad))

    def slot(self, i: int) -> np.ndarray:
        """Sample ``i``'s pixels: a writable uint8 ``(ch, cw, 3)`` view into the mapping."""
        t = self.table
        h, w = int(t["ch"][i]), int(t["cw"][i])
        return np.frombuffer(self._mm, np.uint8, h * w * 3,
                             self.data_start + int(t["offset"][i])).reshape(h, w, 3)

    def store(self, i: int, pixels: np.ndarray, warnings: int) -> None:
        """Writes sample ``i``'s pixels (uint8 ``(ch, cw, 3)``, C-contiguous) into its slot with
        ``pwrite`` (the file gets its tmpfs pages or disk blocks here, so a full tmpfs or disk
        is an ``OSError`` from this call, never a SIGBUS inside a copy into the mapping), then
        publishes it: xxh3 and warnings first, state last.

        Raises:
            OSError: ENOSPC (no space), EFBIG, EIO...; the slot stays unpublished.
            ValueError: ``pixels`` does not have the slot's shape.
        """
        t = self.table
        shape = (int(t["ch"][i]), int(t["cw"][i]), 3)
        if pixels.shape != shape or pixels.dtype != np.uint8:
            raise ValueError(f"sample {i}: pixels {pixels.shape} {pixels.dtype}, the slot holds "
                             f"{shape} uint8")
        view = memoryview(np.ascontiguousarray(pixels)).cast("B")
        offset, done = self.data_start + int(t["offset"][i]), 0
        while done < len(view):
            written = os.pwrite(self._fd, view[done:], offset + done)
            if written <= 0:
                raise OSError(errno.ENOSPC, f"short write to {self.path}")
            done += written
        t["xxh3"][i] = sample_checksum(view)
        t["warnings"][i] = min(int(warnings), 65535)
        t["state"][i] = 1  # last: readers take ready slots only

    def filled(self) -> tuple[int, int]:
        """``(ready slots, their bytes)`` as seen now (all processes' fills)."""
        t = self.table
        ready = t["state"] == 1
        return int(ready.sum()), int((t["cw"][ready].astype(np.int64) * t["ch"][ready] * 3).sum())

    @property
    def filling_stopped(self) -> str | None:
        """Why some process stopped filling this arena (:meth:`stop_filling`), or None."""
        mm = self._mm
        if mm is None:
            return None
        n = int.from_bytes(mm[_STOP_AT:_STOP_AT + 8], "little")
        if n == 0:
            return None
        return bytes(mm[_STOP_AT + 8:_STOP_AT + 8 + min(n, _STOP_MAX)]).decode("utf-8", "replace")

    def stop_filling(self, why: str) -> bool:
        """Records that filling stops (for every process of every run attached now; a disk arena
        clears it when the next run attaches it alone). True for the one call that recorded it
        (that process logs the warning), False when another process already had."""
        with self._lock:
            if self._mm is None:
                return False
            with _LockFile(self.path + ".lock"):
                if self.filling_stopped is not None:
                    return False
                body = why.encode("utf-8")[:_STOP_MAX] or b"?"
                self._mm[_STOP_AT + 8:_STOP_AT + 8 + len(body)] = body
                self._mm[_STOP_AT:_STOP_AT + 8] = len(body).to_bytes(8, "little")
                return True

    def detach(self) -> None:
        """Drops this process's hold; the last holder removes a RAM arena, or marks a disk arena
        closed cleanly. A forked child only forgets its inherited mapping."""
        with self._lock:
            if self._mm is None:
                return
            mm, self._mm, self.table = self._mm, None, {}
            if self._owner != os.getpid():  # an inherited mapping: the parent owns the lock
                self._fd = -1
                return
            if self.persistent:
                mm.flush()
            try:
                mm.close()
            except BufferError:  # a view is still alive somewhere: the GC unmaps it
                pass
            release, self._release, self._fd = self._release, None, -1
            release()


def _geometry_columns(sizes: np.ndarray) -> list[np.ndarray]:
    """The table's offset, width, height, cw, ch columns (their dtypes) for ``sizes``."""
    nbytes = sizes[:, 2] * sizes[:, 3] * 3
    offset = np.zeros(len(sizes), np.int64)
    if len(sizes):
        offset[1:] = np.cumsum(nbytes)[:-1]
    cols = [offset] + [sizes[:, j] for j in range(4)]
    return [np.ascontiguousarray(c, dtype=dict(TABLE)[name]) for c, name in zip(cols, _GEOMETRY)]


def _expected_layout(sizes: np.ndarray) -> tuple[int, int, str]:
    h = hashlib.sha256()
    for col in _geometry_columns(sizes):
        h.update(col.tobytes())
    return len(sizes), int((sizes[:, 2] * sizes[:, 3] * 3).sum()), h.hexdigest()


def _read_header(fd: int) -> dict | None:
    """The JSON header of a complete arena file, or None (unfinished, not an arena, or a header
    that is not a JSON object)."""
    head = os.pread(fd, 24, 0)
    if len(head) < 24 or head[:8] != MAGIC:
        return None
    length = int.from_bytes(head[8:16], "little")
    if not 0 < length <= _STOP_AT - 24:
        return None
    try:
        header = json.loads(os.pread(fd, length, 24))
    except (ValueError, RecursionError):
        return None
    return header if isinstance(header, dict) else None
