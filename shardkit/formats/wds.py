"""WebDataset tar shards (format name ``wds``).

On-disk layout: a plain POSIX (ustar) tar, readable by ``tar`` and ``webdataset.WebDataset``. One
member per sample, ``<key>.<ext>`` with ``ext`` in ``{"jpg", "png"}``, holding the stored image bytes
unchanged; with ``wds_cls=True`` also ``<key>.cls`` (the label as ASCII decimal, as WebDataset's
convention). Member headers are deterministic: mode 0644, uid/gid 0, mtime 0. Labels normally live
only in the split index, not in one extra 1 KiB tar member per sample (field case 5).

The split index records, for each sample, the byte offset of the member's data in the tar and its
size, so a local reader memory-maps the shard and slices the bytes out without parsing the tar.
Before returning bytes it checks the 512-byte ustar header in front of them (member name and size),
so a shifted, truncated or overwritten shard raises :class:`ShardCorruptError` instead of feeding
garbage to the decoder. Remote shards (fsspec URLs) are fetched whole, once per process, and then
sliced the same way.
"""
from __future__ import annotations

import io
import mmap
import tarfile

from ..errors import ShardCorruptError
from ..manifest import is_url
from .base import FormatReader, FormatWriter

__all__ = ["Writer", "Reader", "suffix"]

suffix = ".tar"
BLOCK = tarfile.BLOCKSIZE  # 512


class Writer(FormatWriter):
    suffix = suffix

    def __init__(self, path, wds_cls: bool = False):
        super().__init__(path)
        self._file = open(self.path, "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)
        self.wds_cls = wds_cls

    def _member(self, name: str, data: bytes) -> int:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        info.mtime = 0
        self._tar.addfile(info, io.BytesIO(data))
        blocks = -(-len(data) // BLOCK)
        return self._tar.offset - blocks * BLOCK  # start of the member's data

    def add(self, key: str, data: bytes, ext: str, label: int) -> int:
        offset = self._member(f"{key}.{ext}", data)
        if self.wds_cls:
            self._member(f"{key}.cls", str(int(label)).encode("ascii"))
        return offset

    def close(self) -> None:
        if self._file.closed:
            return
        self._tar.close()  # writes the end-of-archive blocks
        self._file.flush()
        import os

        os.fsync(self._file.fileno())
        self._file.close()


class Reader(FormatReader):
    def _open(self):
        if is_url(self.location):
            import fsspec

            with fsspec.open(self.location, "rb") as f:
                return f.read()
        with open(self.location, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def read(self, key: str, offset: int, size: int) -> bytes:
        buf = self._get()
        header = offset - BLOCK
        if header < 0 or offset + size > len(buf):
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} at bytes {offset}..{offset + size} "
                                    f"lies outside the shard ({len(buf)} bytes): truncated shard?")
        name = bytes(buf[header:header + 100]).split(b"\0", 1)[0]
        try:
            stored_size = int(bytes(buf[header + 124:header + 136]).split(b"\0", 1)[0].strip() or b"x", 8)
        except ValueError:
            stored_size = -1
        if not name.startswith(key.encode("ascii") + b".") or stored_size != size:
            raise ShardCorruptError(f"shard {self.name}: no tar member for sample {key!r} at offset "
                                    f"{offset} (found header name {name[:40]!r}, size {stored_size}): "
                                    "the shard does not match the index")
        return buf[offset:offset + size]

    def close(self) -> None:
        handle = self._handle
        if isinstance(handle, mmap.mmap):
            super().close()
        else:
            self._handle = None
