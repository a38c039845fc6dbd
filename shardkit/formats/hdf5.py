"""HDF5 shards (format name ``hdf5``).

On-disk layout: one HDF5 file per shard with three datasets of equal length ``n`` (row ``i`` is
sample ``i`` of the shard, the ``offset`` recorded in the split index):

- ``images``: variable-length ``uint8`` (``h5py.vlen_dtype(np.uint8)``), the stored image bytes
  unchanged. Not a string type: JPEG data contains NUL bytes (field case 11). No pickles.
- ``labels``: ``int64``.
- ``keys``: fixed-width ASCII bytes (``S<max key length>``).

File attribute ``shardkit_layout = 1``. Shards are write-once (written under a temporary name,
then renamed); shardkit neither needs nor uses SWMR. Readers open lazily per process, read-only,
after any fork (field case 10).
"""
from __future__ import annotations

import os

import h5py
import numpy as np

from ..errors import ShardCorruptError
from .base import FormatReader, FormatWriter

__all__ = ["Writer", "Reader", "suffix"]

suffix = ".h5"
LAYOUT_VERSION = 1


class Writer(FormatWriter):
    suffix = suffix

    def __init__(self, path):
        super().__init__(path)
        self._images: list[np.ndarray] = []
        self._labels: list[int] = []
        self._keys: list[bytes] = []

    def add(self, key: str, data: bytes, ext: str, label: int) -> int:
        self._images.append(np.frombuffer(bytes(data), dtype=np.uint8))
        self._labels.append(int(label))
        self._keys.append(key.encode("ascii"))
        return len(self._images) - 1

    def close(self) -> None:
        if self._images is None:
            return
        n = len(self._images)
        with h5py.File(self.path, "w") as f:
            f.attrs["shardkit_layout"] = LAYOUT_VERSION
            images = f.create_dataset("images", (n,), dtype=h5py.vlen_dtype(np.uint8))
            for i, arr in enumerate(self._images):
                images[i] = arr
            f.create_dataset("labels", data=np.asarray(self._labels, dtype=np.int64))
            width = max((len(k) for k in self._keys), default=1)
            f.create_dataset("keys", data=np.asarray(self._keys, dtype=f"S{width}"))
        with open(self.path, "rb+") as fh:
            os.fsync(fh.fileno())
        self._images = self._labels = self._keys = None

    def abort(self) -> None:
        self._images = self._labels = self._keys = None


class Reader(FormatReader):
    def _open(self):
        try:
            f = h5py.File(self.location, "r")
            return f, f["images"], f["keys"]
        except (OSError, KeyError) as e:
            raise ShardCorruptError(f"shard {self.name}: cannot open HDF5 shard: {e}") from e

    def read(self, key: str, offset: int, size: int) -> bytes:
        _, images, keys = self._get()
        try:
            if keys[offset].decode("ascii") != key:
                raise ShardCorruptError(f"shard {self.name}: row {offset} holds "
                                        f"{keys[offset]!r}, expected sample {key!r}")
            data = images[offset].tobytes()
        except (OSError, IndexError, ValueError) as e:
            raise ShardCorruptError(f"shard {self.name}: reading sample {key!r} (row {offset}) "
                                    f"failed: {e}") from e
        if len(data) != size:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} has {len(data)} bytes, "
                                    f"the index says {size}")
        return data

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None and self._pid == os.getpid():
            handle[0].close()
