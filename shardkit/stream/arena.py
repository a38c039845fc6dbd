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
    24    JSON header (identity, n, slot sizes), padded to HEADER_BYTES
    HEADER_BYTES   per-sample table, one array each, 64-byte aligned:
                   offset int64 (into the data area), width/height int32 (stored image),
                   cw/ch int32 (cached pixels), xxh3 uint64 (of the cached pixels),
                   warnings uint16 (decoder warnings at fill), state uint8 (1 = ready)
    data (4 KiB aligned)  slot of sample i: ch * cw * 3 bytes of RGB at offset[i]

Lifetime, with ``fcntl.flock`` only (no daemon, no busy-waiting): every process that uses the
arena holds a shared lock on it; attach, create and detach happen under an exclusive lock on
``<arena>.lock``. A process that finds the arena with no shared holder (its exclusive try
succeeds) knows every user is gone: a RAM arena is then a leftover of a killed run and is removed
and rebuilt; a disk arena is reused when its identity matches (after checking the pixels of
every ready slot if it was not closed cleanly). The last process to detach a RAM arena removes
it (the kernel drops the locks of killed processes, so the next run sees them as gone).

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
import json
import logging
import mmap
import os
import threading

import numpy as np

from ..errors import ShardkitError
from ..manifest import sample_checksum

__all__ = ["Arena", "ArenaUnavailable", "HEADER_BYTES"]

log = logging.getLogger("shardkit.stream.cache")

MAGIC = b"SKARENA1"
HEADER_BYTES = 1 << 16
_DATA_ALIGN = 4096
_TABLE = (("offset", np.int64), ("width", np.int32), ("height", np.int32), ("cw", np.int32),
          ("ch", np.int32), ("xxh3", np.uint64), ("warnings", np.uint16), ("state", np.uint8))


class ArenaUnavailable(ShardkitError):
    """The arena cannot be created or attached (no space, in use with another identity)."""


def _align(x: int, a: int) -> int:
    return -(-x // a) * a


def table_layout(n: int) -> tuple[dict[str, int], int]:
    """``({field: byte offset}, data start)`` of an arena of ``n`` samples."""
    offsets, pos = {}, HEADER_BYTES
    for name, dtype in _TABLE:
        offsets[name] = pos
        pos = _align(pos + n * np.dtype(dtype).itemsize, 64)
    return offsets, _align(pos, _DATA_ALIGN)


class _LockFile:
    """Exclusive ``flock`` on ``path`` (created if needed), robust to the file being removed by
    the previous holder: after locking, the path must still name the locked inode."""

    def __init__(self, path: str):
        self.path = path
        self.fd = -1

    def __enter__(self) -> "_LockFile":
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks in the kernel, no polling
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
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


class Arena:
    """The mapped file of one cache. Thread-safe; picklable (a copy in another process opens the
    file again by path, lazily). Built by :class:`shardkit.stream.cache.DecodedCache`.

    Args:
        path: the arena file. identity: a JSON-able dict that must match an existing file's to
            reuse it. sizes: ``(width, height, cw, ch)`` int arrays, one row per sample (stored
            image size, cached pixel size). persistent: a disk arena (kept after the last
            detach, reused across runs); else RAM (removed by the last process).
    """

    def __init__(self, path: str, identity: dict, sizes: np.ndarray | None, persistent: bool):
        self.path = str(path)
        self.identity = identity
        self.persistent = bool(persistent)
        self._sizes = sizes
        self._pid = None
        self._fd = -1
        self._mm = None
        self._lock = threading.Lock()
        self.table: dict[str, np.ndarray] = {}
        self.n = 0
        self.data_start = 0
        self.created = False  # this process built the file (else attached an existing one)
        self.reused = False  # a disk arena from an earlier run was attached with no other holder

    # --- pickling: another process re-opens the file ------------------------------------------
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_pid=None, _fd=-1, _mm=None, _lock=None, table={}, _sizes=None)
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

    def attach(self) -> "Arena":
        """Opens (or creates) the arena and holds a shared lock on it until :meth:`detach`.
        In a forked child the parent's mapping (and lock) are used as they are.

        Raises:
            ArenaUnavailable: no space for the header and table, or the file is in use by
                another run with a different identity.
        """
        with self._lock:
            if self._mm is not None:
                self._pid = os.getpid()  # forked: the inherited MAP_SHARED mapping stays valid
                return self
            with _LockFile(self.path + ".lock"):
                self._open_locked()
            self._pid = os.getpid()
        return self

    def _open_locked(self) -> None:
        fd = -1
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            pass
        if fd >= 0:
            alone = _try_exclusive(fd)
            header = _read_header(fd)
            same = header is not None and header.get("identity") == self.identity
            if same and (not alone or self.persistent):
                fcntl.flock(fd, fcntl.LOCK_SH)  # holders only ever hold shared locks
                dirty = int.from_bytes(os.pread(fd, 8, 16), "little") != 0
                self._map(fd, header)
                self.reused = alone
                if alone and self.persistent and dirty:
                    self._recover()
                return
            if not alone:
                os.close(fd)
                raise ArenaUnavailable(f"{self.path} is in use by another run with a different "
                                       "dataset identity")
            why = ("unfinished (its creator was killed)" if header is None else
                   "for another dataset or resolution" if not same else
                   "a leftover of a run that was killed (no process holds it)")
            log.warning("decoded cache %s: removing a stale arena, %s", self.path, why)
            os.unlink(self.path)
            os.close(fd)
        self._create()

    def _create(self) -> None:
        if self._sizes is None:
            raise ArenaUnavailable(f"{self.path} vanished and this process cannot rebuild it "
                                   "(the process that built the loader must attach first)")
        sizes = np.asarray(self._sizes, dtype=np.int64)
        n = len(sizes)
        offsets, data_start = table_layout(n)
        nbytes = sizes[:, 2] * sizes[:, 3] * 3
        slot = np.zeros(n, np.int64)
        if n:
            slot[1:] = np.cumsum(nbytes)[:-1]
        total = data_start + int(nbytes.sum())
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
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
        self._map(fd, header, fresh=True)
        t = self.table
        t["offset"][:] = slot
        for j, name in enumerate(("width", "height", "cw", "ch")):
            t[name][:] = sizes[:, j]
        body = json.dumps(header, sort_keys=True).encode()
        if 24 + len(body) > HEADER_BYTES:
            raise ArenaUnavailable(f"{self.path}: identity header too large ({len(body)} bytes)")
        mm = self._mm
        mm[24:24 + len(body)] = body
        mm[8:16] = len(body).to_bytes(8, "little")
        mm[16:24] = (1 if self.persistent else 0).to_bytes(8, "little")
        mm[0:8] = MAGIC  # last: the file is complete
        fcntl.flock(fd, fcntl.LOCK_SH)
        self.created = True

    def _map(self, fd: int, header: dict, fresh: bool = False) -> None:
        size = os.fstat(fd).st_size
        self._fd = fd
        self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.n = n = int(header["n"])
        offsets, self.data_start = table_layout(n)
        buf = memoryview(self._mm)
        self.table = {name: np.frombuffer(buf, dtype, n, offsets[name]) for name, dtype in _TABLE}
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

    def detach(self) -> None:
        """Drops this process's hold; the last holder removes a RAM arena, or marks a disk arena
        closed cleanly. A forked child only forgets its inherited mapping."""
        with self._lock:
            if self._mm is None:
                return
            if self._pid != os.getpid():  # an inherited mapping: the parent owns the lock
                self._mm, self._fd, self.table = None, -1, {}
                return
            with _LockFile(self.path + ".lock") as lock:
                last = _try_exclusive(self._fd)
                if last and self.persistent:
                    self._mm.flush()
                    self._mm[16:24] = (0).to_bytes(8, "little")
                    self._mm.flush()
                if last and not self.persistent:
                    try:
                        os.unlink(self.path)
                    except FileNotFoundError:
                        pass
                    lock.remove()
                self.table = {}
                try:
                    self._mm.close()
                except BufferError:  # a view is still alive somewhere: the GC unmaps it
                    pass
                self._mm = None
                os.close(self._fd)
                self._fd = -1


def _read_header(fd: int) -> dict | None:
    """The JSON header of a complete arena file, or None (unfinished or not an arena)."""
    head = os.pread(fd, 24, 0)
    if len(head) < 24 or head[:8] != MAGIC:
        return None
    length = int.from_bytes(head[8:16], "little")
    if not 0 < length <= HEADER_BYTES - 24:
        return None
    try:
        return json.loads(os.pread(fd, length, 24))
    except ValueError:
        return None
