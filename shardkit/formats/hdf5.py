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
uses SWMR. Readers open lazily per process, read-only, after any fork (field case 10).
"""
from __future__ import annotations

import errno
import os

import h5py
import numpy as np

from ..errors import ShardCorruptError
from .base import FormatReader, FormatWriter

__all__ = ["Writer", "Reader", "suffix", "LAYOUT_VERSION"]

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


class Reader(FormatReader):
    def _open(self):
        """Returns ``(fd, base, offsets, keys)``: the blob's byte position in the file (None when
        HDF5 cannot give one, then reads go through h5py), its offsets and the shard's keys."""
        try:
            with h5py.File(self.location, "r") as f:
                if f.attrs.get("shardkit_layout") != LAYOUT_VERSION:
                    raise ShardCorruptError(
                        f"shard {self.name}: HDF5 layout {f.attrs.get('shardkit_layout')!r}, this "
                        f"shardkit reads layout {LAYOUT_VERSION} (repack with `shardkit pack`)")
                images = f["images"]
                base = images.id.get_offset()
                contiguous = images.chunks is None and not images.compression
                offsets = f["offsets"][:]
                keys = f["keys"][:]
        except (OSError, KeyError) as e:
            raise ShardCorruptError(f"shard {self.name}: cannot open HDF5 shard: {e}") from e
        fd = os.open(self.location, os.O_RDONLY)
        return fd, (base if contiguous else None), offsets, keys

    def read(self, key: str, offset: int, size: int) -> bytes:
        return bytes(self.read_into(key, offset, size, None))

    def read_into(self, key: str, offset: int, size: int, buf: bytearray | None):
        """The sample's bytes with one ``pread`` (into ``buf`` when given: no allocation, a view
        valid until ``buf`` is reused); the key stored in the shard's row is checked."""
        fd, base, offsets, keys = self._get()
        if not 0 <= offset < len(keys) or keys[offset] != key.encode("ascii"):
            found = repr(bytes(keys[offset])) if 0 <= offset < len(keys) else "nothing"
            raise ShardCorruptError(f"shard {self.name}: row {offset} holds {found}, expected "
                                    f"sample {key!r}: the shard does not match the index")
        start, stop = int(offsets[offset]), int(offsets[offset + 1])
        if stop - start != size:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} has {stop - start} bytes, "
                                    f"the index says {size}")
        if base is not None and buf is not None and len(buf) >= size:
            data = memoryview(buf)[:size]
            data = data[:os.preadv(fd, [data], base + start)]
        elif base is not None:
            data = os.pread(fd, size, base + start)
        else:
            with h5py.File(self.location, "r") as f:
                data = f["images"][start:stop].tobytes()
        if len(data) != size:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} at bytes {start}..{stop} "
                                    "lies outside the file: truncated shard?")
        return data

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None and self._pid == os.getpid():
            os.close(handle[0])
