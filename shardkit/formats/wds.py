"""WebDataset tar shards (format name ``wds``).

On-disk layout: a plain POSIX (ustar) tar, readable by ``tar`` and ``webdataset.WebDataset``.
One member per sample, ``<key>.<ext>`` with ``ext`` in ``{"jpg", "png"}``, holding the stored
image bytes unchanged; with ``wds_cls=True`` (the pack default) also ``<key>.cls`` (the label
as ASCII decimal, WebDataset's convention), and with ``wds_json=True`` ``<key>.json`` (a UTF-8
JSON object with ``key``, ``label``, ``class``, ``path``; the bytes of a file name that are not
UTF-8 are written as the text ``\\xNN``, so every reader can load it: the exact name is in the
split records), in that order after the image. Member headers are
deterministic: mode 0644, uid/gid 0, mtime 0. shardkit's own readers take labels from the split
index only (field case 5); the ``.cls`` members are for other readers (:mod:`shardkit.interop`,
which finds every member with :func:`sample_members`).

The split index records, for each sample, the byte offset of the member's data in the tar and its
size, so a local reader fetches one sample with a single ``pread`` of its 512-byte ustar header
plus data, without parsing the tar (``pread`` rather than ``mmap``: one copy and no per-page
faults, measurably cheaper here). Before returning bytes it checks that header (member name and
size), so a shifted, truncated or overwritten shard raises :class:`ShardCorruptError` instead of
feeding garbage to the decoder. Remote shards (fsspec URLs) are fetched whole and then sliced
the same way: ahead of the readers by the loaders' prefetcher (:class:`MemoryReader` reads its
bytes, :mod:`shardkit.stream.prefetch`), else by :class:`Reader` on the first read, once per
process.
"""
from __future__ import annotations

import io
import os
import tarfile

from ..errors import ShardCorruptError
from shardkit.dataset.manifest import json_bytes
from shardkit.storage.fetch import fetch_shard
from shardkit.storage.urls import is_url
from .base import FormatReader, FormatWriter

__all__ = ["Writer", "Reader", "MemoryReader", "checked_member", "suffix", "sample_members"]

suffix = ".tar"
BLOCK = tarfile.BLOCKSIZE  # 512


class Writer(FormatWriter):
    suffix = suffix

    def __init__(self, path, wds_cls: bool = False, wds_json: bool = False):
        super().__init__(path)
        self.wds_cls = wds_cls
        self.wds_json = wds_json
        self._file = open(self.path, "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)

    def _member(self, name: str, data: bytes) -> int:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        info.mtime = 0
        self._tar.addfile(info, io.BytesIO(data))
        blocks = -(-len(data) // BLOCK)
        return self._tar.offset - blocks * BLOCK  # start of the member's data

    def add(self, key: str, data: bytes, ext: str, label: int, meta=None) -> int:
        offset = self._member(f"{key}.{ext}", data)
        if self.wds_cls:
            self._member(f"{key}.cls", str(int(label)).encode("ascii"))
        if self.wds_json:
            meta = {k: _utf8_text(v) for k, v in dict(meta or {}).items()}
            self._member(f"{key}.json", json_bytes(meta, sort_keys=True))
        return offset

    def close(self) -> None:
        if self._file.closed:
            return
        self._tar.close()  # writes the end-of-archive blocks
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


def _utf8_text(value):
    """``value``, or for a str holding lone surrogates (a file name that is not UTF-8, read with
    surrogateescape) the text of its bytes with the undecodable ones as ``\\xNN``: JSON that
    strict readers (pyarrow, for Hugging Face datasets) accept."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return os.fsencode(value).decode("utf-8", "backslashreplace")
    return value


class Reader(FormatReader):
    def _identity(self) -> tuple:
        if is_url(self.location):
            return (__name__, self.location)  # fetched whole: no stat, no descriptor
        return super()._identity()

    def _open(self):
        if is_url(self.location):  # bytes: the whole shard, retried, its size checked
            return fetch_shard(self.location, self.name, self.expected_bytes)
        try:
            return os.open(self.location, os.O_RDONLY)  # int: a file descriptor
        except FileNotFoundError:
            raise ShardCorruptError(f"shard {self.name} is missing ({self.location})",
                                    shard=self.name) from None

    @staticmethod
    def _close_handle(handle) -> None:
        if isinstance(handle, int):
            os.close(handle)

    def read(self, key: str, offset: int, size: int) -> bytes:
        return bytes(self.read_into(key, offset, size, None))

    def read_into(self, key: str, offset: int, size: int, buf: bytearray | None):
        """The member's bytes, read with its 512-byte header in one ``pread`` (into ``buf`` when
        given: no allocation, a view valid until ``buf`` is reused); the header is checked."""
        header = offset - BLOCK
        if header < 0:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} has offset {offset}, "
                                    f"before the first tar header: the index is corrupt",
                                    shard=self.name, key=key)
        handle, lease = self._acquire()
        try:
            if not isinstance(handle, int):
                chunk = memoryview(handle)[header:offset + size]
            elif buf is None or len(buf) < BLOCK + size:
                chunk = memoryview(os.pread(handle, BLOCK + size, header))
            else:
                chunk = memoryview(buf)[:BLOCK + size]
                chunk = chunk[:os.preadv(handle, [chunk], header)]
        finally:
            self._release(lease)
        return checked_member(chunk, self.name, key, offset, size)


def checked_member(chunk, shard: str, key: str, offset: int, size: int) -> memoryview:
    """The data of sample ``key`` from ``chunk``, the bytes ``offset - 512 .. offset + size`` of
    tar shard ``shard`` (its 512-byte ustar header, then the member's data), after checking
    that the header names ``key`` and ``size``.

    Raises:
        ShardCorruptError: ``chunk`` is short (a truncated shard), or the header is another
            member's (the shard does not match the index); names shard and key.
    """
    if len(chunk) != BLOCK + size:
        raise ShardCorruptError(f"shard {shard}: sample {key!r} at bytes "
                                f"{offset}..{offset + size} lies outside the shard: "
                                "truncated shard?", shard=shard, key=key)
    head = bytes(chunk[:136])
    name = head[:100].split(b"\0", 1)[0]
    try:
        stored_size = int(head[124:136].split(b"\0", 1)[0].strip() or b"x", 8)
    except ValueError:
        stored_size = -1
    if not name.startswith(key.encode("ascii") + b".") or stored_size != size:
        raise ShardCorruptError(f"shard {shard}: no tar member for sample {key!r} at "
                                f"offset {offset} (found header name {name[:40]!r}, size "
                                f"{stored_size}): the shard does not match the index",
                                shard=shard, key=key)
    return chunk[BLOCK:]


class MemoryReader:
    """The reader of one tar shard whose bytes are in memory (a remote shard the prefetcher
    fetched, :mod:`shardkit.stream.prefetch`): each read is a slice of ``data``, checked as
    :meth:`Reader.read_into` checks a ``pread``. Nothing to open or close.

    Args:
        name: the shard's path in the dataset (named in errors). data: the whole shard.
    """

    def __init__(self, name: str, data: bytes | memoryview):
        self.name = name
        self.data = data

    def read(self, key: str, offset: int, size: int) -> bytes:
        return bytes(self.read_into(key, offset, size, None))

    def read_into(self, key: str, offset: int, size: int, buf=None) -> memoryview:
        """A view of the member's bytes in :attr:`data` (``buf`` is not needed: no copy)."""
        if offset < BLOCK:
            raise ShardCorruptError(f"shard {self.name}: sample {key!r} has offset {offset}, "
                                    f"before the first tar header: the index is corrupt",
                                    shard=self.name, key=key)
        return checked_member(memoryview(self.data)[offset - BLOCK:offset + size], self.name,
                              key, offset, size)

    def close(self) -> None:
        pass


def sample_members(path, keys, offsets, sizes) -> list[list[tuple[str, int, int]]]:
    """Every member of a local tar shard, grouped by sample and checked against the split index.

    Reads the 512-byte ustar headers only (one ``pread`` each, never the data), in tar order,
    and returns, for sample ``i`` of the arguments, its members as ``(name, data_offset, size)``
    in tar order: the indexed image member first, then the ones that follow it with the same
    ``<key>.`` prefix (``.cls``, ``.json``). Offsets and sizes are in bytes from the start of the
    file, as DALI's ``wds2idx`` index records them (:mod:`shardkit.interop`).

    Args:
        path: the shard file. keys: the samples' keys (str). offsets, sizes: the split index's
            data offset and size of each sample's image member (any order; all of this shard).

    Raises:
        ShardCorruptError: a header is damaged or truncated, a member is not a regular file or
            belongs to no indexed sample, or an indexed sample is not where the index says
            (the message names the shard, the member and the offset).
    """
    order = sorted(range(len(keys)), key=lambda i: int(offsets[i]))
    at = {int(offsets[i]): i for i in order}
    found: list[list[tuple[str, int, int]]] = [[] for _ in keys]
    name = os.path.basename(os.fspath(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, current, size_of_file = 0, None, os.fstat(fd).st_size
        while True:
            header = os.pread(fd, BLOCK, pos)
            if len(header) < BLOCK:
                raise ShardCorruptError(f"shard {name}: ends at byte {size_of_file} inside the "
                                        "member list (no end-of-archive block): truncated shard?")
            if header == bytes(BLOCK):
                break
            member, size, regular = _parse_header(header, name, pos)
            data = pos + BLOCK
            i = at.get(data)
            if i is not None:
                if not (member.startswith(keys[i] + ".") and size == int(sizes[i])):
                    raise ShardCorruptError(
                        f"shard {name}: the member at byte {data} is {member!r} ({size} "
                        f"bytes); the index says sample {keys[i]!r} ({int(sizes[i])} bytes)")
                current = i
            elif current is None or not member.startswith(keys[current] + "."):
                raise ShardCorruptError(f"shard {name}: member {member!r} at byte {data} "
                                        "belongs to no sample of the split index")
            if not regular:
                raise ShardCorruptError(f"shard {name}: member {member!r} at byte {data} is "
                                        "not a regular file")
            found[current].append((member, data, size))
            pos = data + -(-size // BLOCK) * BLOCK
    finally:
        os.close(fd)
    missing = [keys[i] for i in order if not found[i]]
    if missing:
        raise ShardCorruptError(f"shard {name}: {len(missing)} indexed sample(s) not found in "
                                f"the tar (first: {missing[0]!r}): the shard does not match "
                                "the index")
    return found


def _parse_header(header: bytes, shard: str, pos: int) -> tuple[str, int, bool]:
    """``(member name, data size, is a regular file)`` of a 512-byte ustar header, after
    checking its checksum (POSIX: the sum of the header's bytes with the checksum field read as
    8 spaces). The few fields :func:`sample_members` needs, ~5x faster than
    ``tarfile.TarInfo.frombuf`` here; ``prefix`` joins a long name as ustar defines it."""
    try:
        stored = int(header[148:156].split(b"\0", 1)[0].strip() or b"x", 8)
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"x", 8)
    except ValueError:
        stored = size = -1
    if stored != sum(header) - sum(header[148:156]) + 256 or size < 0:
        raise ShardCorruptError(f"shard {shard}: damaged tar header at byte {pos} (bad checksum "
                                "or size field)")
    member = header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
    if prefix:
        member = prefix + b"/" + member
    return member.decode("utf-8", "surrogateescape"), size, header[156:157] in (b"0", b"\0")
