"""HDF5 shards (format name ``hdf5``).

On-disk layout (``shardkit_layout = 2``): one HDF5 file per shard with four datasets; row ``i`` is
sample ``i`` of the shard (the ``offset`` recorded in the split index is the row):

- ``images``: one contiguous, uncompressed, unchunked 1-D ``uint8`` dataset holding the stored
  image bytes of every sample back to back, unchanged (JPEG data contains NUL bytes, so never a
  string type; no pickles - field case 11).
- ``offsets``: ``int64`` ``(n + 1,)``; sample ``i`` is ``images[offsets[i]:offsets[i + 1]]``.
- ``labels``: ``int64`` ``(n,)``.
- ``keys``: fixed-width ASCII bytes ``(n,)`` (``S<max key length>``).

Why one blob plus offsets rather than a variable-length ``uint8`` dataset (field case 11 allows
both): reading one vlen element through h5py costs ~0.26 ms here (a third of the whole
decode-and-augment budget per image) and holds h5py's global lock, so decoding threads queue on
it. A contiguous blob has a fixed position in the file (``DatasetID.get_offset``), so the reader
fetches a sample with one ``pread`` - the same cost as a tar shard - and h5py is used only to open
the shard and read its small ``offsets``/``keys`` arrays once per process. The file stays a plain
HDF5 file: ``h5py.File(path)["images"][offsets[i]:offsets[i + 1]]`` gives sample ``i`` too.

Shards are write-once (written under a temporary name, then renamed); shardkit neither needs nor
uses SWMR. Readers open lazily per process, read-only, after any fork (field case 10), and check
the layout above on open (:func:`read_layout`: a group where a dataset belongs, another dtype or
a short ``offsets`` is a :class:`ShardCorruptError` naming the shard and the field).
"""
from __future__ import annotations

import errno
import os
import threading

import h5py
import numpy as np

from ..errors import ShardCorruptError
from .base import FormatReader, FormatWriter, resource_errno, resource_error

__all__ = ["Writer", "Reader", "suffix", "LAYOUT_VERSION", "read_layout"]

suffix = ".h5"
LAYOUT_VERSION = 2


class Writer(FormatWriter):
    suffix = suffix

    def __init__(self, path):
        super().__init__(path)
        self._images: list[bytes] | None = []
        self._labels: list[int] = []
        self._keys: list[bytes] = []

    def add(self, key: str, data: bytes, ext: str, label: int, meta=None) -> int:
        self._images.append(bytes(data))
        self._labels.append(int(label))
        self._keys.append(key.encode("ascii"))
        return len(self._images) - 1

    def close(self) -> None:
        """Writes the shard file. On failure the file is removed and an OSError naming it is
        raised, one line (``ENOSPC`` "No space left on device" for a full disk)."""
        if self._images is None:
            return
        try:
            self._write()
        except OSError as e:
            self.abort()
            self.path.unlink(missing_ok=True)
            if e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e):
                raise OSError(e.errno or errno.ENOSPC, "No space left on device",
                              str(self.path)) from None
            raise OSError(e.errno, f"HDF5 write failed: {' '.join(str(e).split())}",
                          str(self.path)) from None
        self._images = self._labels = self._keys = None

    def _write(self) -> None:
        sizes = np.fromiter((len(b) for b in self._images), dtype=np.int64, count=len(self._images))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        blob = np.frombuffer(b"".join(self._images), dtype=np.uint8)
        with h5py.File(self.path, "w") as f:
            f.attrs["shardkit_layout"] = LAYOUT_VERSION
            f.create_dataset("images", data=blob)  # contiguous: no chunks, no filters
            f.create_dataset("offsets", data=offsets)
            f.create_dataset("labels", data=np.asarray(self._labels, dtype=np.int64))
            width = max((len(k) for k in self._keys), default=1)
            f.create_dataset("keys", data=np.asarray(self._keys, dtype=f"S{width}"))
        with open(self.path, "rb+") as fh:
            os.fsync(fh.fileno())

    def abort(self) -> None:
        self._images = self._labels = self._keys = None


#: Parsed shard metadata by file identity (path, device, inode, mtime, size), per process:
#: a handle closed to make room reopens with one ``open`` instead of re-reading the arrays
#: (``offsets`` and ``keys``: ~(8 + key length) bytes per sample); ``Reader.close`` drops them.
_META: dict[tuple, tuple] = {}
_META_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _META_LOCK
    _META_LOCK = threading.Lock()  # the parsed arrays stay valid; only the lock is replaced


os.register_at_fork(after_in_child=_after_fork_in_child)


def read_layout(path, name: str | None = None) -> tuple[int | None, np.ndarray, np.ndarray]:
    """Opens an HDF5 shard with h5py and checks its layout (the module docstring) before use.

    Checks: ``shardkit_layout`` is 2; ``images``, ``offsets``, ``labels`` and ``keys`` are
    datasets (not groups); ``images`` is 1-D ``uint8``; ``offsets`` is 1-D integer of length
    ``n + 1``, ``labels`` 1-D integer of length ``n`` and ``keys`` 1-D fixed-width bytes
    (``S<k>``) of length ``n``, where ``n = len(keys)``; no dataset declares more bytes than
    the file holds; ``offsets`` starts at 0, never decreases and ends within ``images``.

    Args:
        path: the shard file. name: how to name it in errors (default: ``path``).

    Returns:
        ``(base, offsets, keys)``: the byte position of the ``images`` blob in the file (None
        when it is chunked or filtered, then reads go through h5py), ``offsets`` as int64
        ``(n + 1,)`` and ``keys`` as ``S<k>`` ``(n,)``.

    Raises:
        ShardCorruptError: the file is not an HDF5 file or does not have this layout (the
            message names the shard and the field, what was found and what was expected).
        OSError: EMFILE and the other resource errors, unchanged (the caller reports them).
    """
    name = name or os.fspath(path)
    try:
        file_size = os.stat(path).st_size
        with h5py.File(path, "r") as f:
            layout = f.attrs.get("shardkit_layout")
            if layout != LAYOUT_VERSION:
                raise ShardCorruptError(
                    f"shard {name}: HDF5 layout {layout!r}, this shardkit reads layout "
                    f"{LAYOUT_VERSION} (repack with `shardkit pack`)")
            fields = {}
            for field in ("images", "offsets", "labels", "keys"):
                obj = f.get(field)
                if not isinstance(obj, h5py.Dataset):
                    found = "missing" if obj is None else f"a {type(obj).__name__}"
                    raise ShardCorruptError(f"shard {name}: HDF5 field {field!r} is {found}, "
                                            "expected a dataset")
                if obj.ndim != 1:
                    raise ShardCorruptError(f"shard {name}: HDF5 field {field!r} has shape "
                                            f"{obj.shape}, expected one dimension")
                if obj.size * obj.dtype.itemsize > file_size:
                    raise ShardCorruptError(
                        f"shard {name}: HDF5 field {field!r} declares {obj.size} elements of "
                        f"{obj.dtype.itemsize} bytes, more than the file's {file_size} bytes")
                fields[field] = obj
            images, offsets, labels, keys = (fields[k] for k in ("images", "offsets",
                                                                  "labels", "keys"))
            _check_dtype(name, "images", images.dtype, images.dtype == np.uint8, "uint8")
            _check_dtype(name, "offsets", offsets.dtype, offsets.dtype.kind in "iu", "int64")
            _check_dtype(name, "labels", labels.dtype, labels.dtype.kind in "iu", "int64")
            _check_dtype(name, "keys", keys.dtype, keys.dtype.kind == "S", "fixed-width bytes")
            n = keys.shape[0]
            for field, obj, want in (("offsets", offsets, n + 1), ("labels", labels, n)):
                if obj.shape[0] != want:
                    raise ShardCorruptError(
                        f"shard {name}: HDF5 field {field!r} has {obj.shape[0]} entries, "
                        f"expected {want} ({n} keys)")
            base = images.id.get_offset()
            contiguous = images.chunks is None and not images.compression
            offs = offsets[:].astype(np.int64)
            key_rows = keys[:]
            blob = images.shape[0]
    except ShardCorruptError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        if isinstance(e, OSError) and resource_errno(e) is not None:
            raise
        raise ShardCorruptError(f"shard {name}: cannot open HDF5 shard: "
                                f"{' '.join(str(e).split())}") from e
    falls = np.flatnonzero(np.diff(offs) < 0)
    if offs[0] != 0 or falls.size or offs[-1] > blob:
        bad = 0 if offs[0] != 0 else int(falls[0]) + 1 if falls.size else len(offs) - 1
        raise ShardCorruptError(
            f"shard {name}: HDF5 field 'offsets' is not a valid table of {n} samples in "
            f"{blob} bytes of 'images' (entry {bad} is {int(offs[bad])}; expected to start at "
            "0, never decrease and end within 'images')")
    if base is not None and contiguous and base + blob > file_size:
        raise ShardCorruptError(f"shard {name}: HDF5 field 'images' lies at bytes "
                                f"{base}..{base + blob}, past the end of the file "
                                f"({file_size} bytes): truncated shard?")
    return (base if contiguous else None), offs, key_rows


def _check_dtype(name: str, field: str, dtype, ok: bool, expected: str) -> None:
    if not ok:
        raise ShardCorruptError(f"shard {name}: HDF5 field {field!r} has dtype {dtype}, "
                                f"expected {expected}")


class Reader(FormatReader):
    def _open(self):
        """Returns ``(fd, base, offsets, keys)`` (:func:`read_layout`; parsed once per file
        and process) with a descriptor of the file for ``pread``."""
        ident = self._table_key()
        with _META_LOCK:
            meta = _META.get(ident)
        if meta is None:
            meta = read_layout(self.location, self.name)
            with _META_LOCK:
                _META[ident] = meta
        try:
            fd = os.open(self.location, os.O_RDONLY)
        except OSError as e:
            if resource_errno(e) is not None:
                raise
            raise ShardCorruptError(f"shard {self.name}: cannot open HDF5 shard: "
                                    f"{e.strerror} ({self.location})") from None
        return (fd, *meta)

    @staticmethod
    def _close_handle(handle) -> None:
        os.close(handle[0])

    def close(self) -> None:
        """As :meth:`FormatReader.close`, and forgets the parsed arrays (a handle closed to make
        room keeps them, so its reopen is one ``open``)."""
        key = self._key
        super().close()
        if key is not None and key[0] == os.getpid():
            with _META_LOCK:
                _META.pop(key[1], None)

    def read(self, key: str, offset: int, size: int) -> bytes:
        return bytes(self.read_into(key, offset, size, None))

    def read_into(self, key: str, offset: int, size: int, buf: bytearray | None):
        """The sample's bytes with one ``pread`` (into ``buf`` when given: no allocation, a view
        valid until ``buf`` is reused); the key stored in the shard's row is checked."""
        (fd, base, offsets, keys), lease = self._acquire()
        try:
            if not 0 <= offset < len(keys) or keys[offset] != key.encode("ascii"):
                found = repr(bytes(keys[offset])) if 0 <= offset < len(keys) else "nothing"
                raise ShardCorruptError(f"shard {self.name}: row {offset} holds {found}, "
                                        f"expected sample {key!r}: the shard does not match "
                                        "the index", shard=self.name, key=key)
            start, stop = int(offsets[offset]), int(offsets[offset + 1])
            if stop - start != size:
                raise ShardCorruptError(f"shard {self.name}: sample {key!r} has "
                                        f"{stop - start} bytes, the index says {size}",
                                        shard=self.name, key=key)
            if base is not None and buf is not None and len(buf) >= size:
                data = memoryview(buf)[:size]
                data = data[:os.preadv(fd, [data], base + start)]
            elif base is not None:
                data = os.pread(fd, size, base + start)
            else:
                data = self._read_chunked(key, start, stop)
        finally:
            self._release(lease)
        if len(data) != size:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} at bytes {start}..{stop} "
                                    "lies outside the file: truncated shard?",
                                    shard=self.name, key=key)
        return data

    def _read_chunked(self, key: str, start: int, stop: int) -> bytes:
        """Bytes ``start..stop`` of a chunked or filtered ``images`` dataset, through h5py."""
        try:
            with h5py.File(self.location, "r") as f:
                return f["images"][start:stop].tobytes()
        except OSError as e:
            err = resource_error(e, f"shard {self.name}: reading sample {key!r}", self.location)
            raise (err or ShardCorruptError(f"shard {self.name}: reading sample {key!r} failed: "
                                            f"{' '.join(str(e).split())}",
                                            shard=self.name, key=key)) from e
