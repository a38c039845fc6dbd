"""What every shard format shares: rollover, temporary names, fsync, atomic rename, hashing.

A format module only moves bytes: its :class:`FormatWriter` appends ``(key, data, ext, label)``
to one open shard file and returns the offset to record in the split index; its
:class:`FormatReader` returns the stored bytes of one sample. :class:`ShardSink` owns everything
else, so every format gets the same crash safety (field case 5):

- a shard is written as ``shards/.<split>-NNNNNN<suffix>.tmp``, flushed, fsynced, then renamed to
  ``shards/<split>-NNNNNN<suffix>``; a killed run leaves only ``*.tmp`` files, which
  :func:`remove_partial` deletes;
- a shard is opened only when its first sample arrives, so there are never empty shards;
- rollover happens before a sample that would exceed ``max_samples`` or ``max_bytes`` (a single
  sample larger than ``max_bytes`` gets a shard of its own).
"""
from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from pathlib import Path

from ..errors import ConfigError

__all__ = ["FormatWriter", "FormatReader", "ShardSink", "sha256_file", "remove_partial",
           "shard_name"]

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
    def add(self, key: str, data: bytes, ext: str, label: int) -> int:
        """Appends one sample; returns its offset for the index (format-specific meaning)."""

    @abstractmethod
    def close(self) -> None:
        """Flushes and fsyncs the file. After this the file at ``self.path`` is complete."""

    def abort(self) -> None:
        """Releases resources after a failure (the sink deletes the temporary file)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort on an already failing path
            pass


class FormatReader(ABC):
    """Reads samples from one finished shard. Opens lazily, once per process (after fork it
    reopens; field cases 8 and 10), and pickles without its handle (spawn start method).
    """

    def __init__(self, location: str, name: str | None = None):
        self.location = str(location)
        self.name = name or self.location
        self._handle = None
        self._pid = None

    def _get(self):
        if self._handle is None or self._pid != os.getpid():
            self._handle = None  # never use (or close) a handle inherited through fork
            self._handle = self._open()
            self._pid = os.getpid()
        return self._handle

    @abstractmethod
    def _open(self):
        """Opens the shard for reading in this process and returns the handle."""

    @abstractmethod
    def read(self, key: str, offset: int, size: int) -> bytes:
        """Returns the stored bytes of sample ``key``.

        Raises:
            ShardCorruptError: the shard is truncated or the sample is missing or malformed;
                the message names the shard and the key.
        """

    def close(self) -> None:
        """Closes this process's handle, if any."""
        handle, self._handle = self._handle, None
        if handle is not None and self._pid == os.getpid() and hasattr(handle, "close"):
            handle.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_handle"] = None
        state["_pid"] = None
        return state


class ShardSink:
    """Writes the samples of one split into rolled-over shards of one format.

    Args:
        out_dir: the dataset folder (``OUT``); shards go to ``OUT/shards/``.
        split: split name, used in shard file names.
        fmt: a format name registered in :data:`shardkit.formats.FORMATS`.
        max_samples: roll over after this many samples per shard (``None``: no limit).
        max_bytes: roll over before a shard's stored image bytes would exceed this (``None``: no limit).
    """

    def __init__(self, out_dir, split: str, fmt: str, max_samples: int | None = None,
                 max_bytes: int | None = None, writer_options: dict | None = None):
        from . import FORMATS

        if fmt not in FORMATS:
            raise ConfigError(f"unknown format {fmt!r}; expected one of {sorted(FORMATS)}")
        for name, value in (("max_samples", max_samples), ("max_bytes", max_bytes)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        self.out_dir = Path(out_dir)
        self.split = split
        self.writer_cls = FORMATS[fmt].Writer
        self.writer_options = writer_options or {}
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.records: list[dict] = []
        self._writer: FormatWriter | None = None
        self._count = 0
        self._bytes = 0
        (self.out_dir / "shards").mkdir(parents=True, exist_ok=True)

    def _final_path(self, index: int) -> Path:
        return self.out_dir / "shards" / shard_name(self.split, index, self.writer_cls.suffix)

    def _tmp_path(self, index: int) -> Path:
        final = self._final_path(index)
        return final.with_name("." + final.name + TMP_SUFFIX)

    def add(self, key: str, data: bytes, ext: str, label: int) -> tuple[int, int]:
        """Appends one sample; returns ``(shard_index, offset)`` for the split index."""
        if self._writer is not None and (
            (self.max_samples is not None and self._count >= self.max_samples)
            or (self.max_bytes is not None and self._bytes + len(data) > self.max_bytes)
        ):
            self._finish()
        if self._writer is None:
            tmp = self._tmp_path(len(self.records))
            tmp.unlink(missing_ok=True)
            self._writer = self.writer_cls(tmp, **self.writer_options)
            self._count = 0
            self._bytes = 0
        try:
            offset = self._writer.add(key, data, ext, label)
        except BaseException:
            self.abort()
            raise
        self._count += 1
        self._bytes += len(data)
        return len(self.records), offset

    def _finish(self) -> None:
        writer, self._writer = self._writer, None
        writer.close()
        index = len(self.records)
        final = self._final_path(index)
        os.replace(writer.path, final)
        self.records.append({
            "path": final.relative_to(self.out_dir).as_posix(),
            "num_samples": self._count,
            "bytes": final.stat().st_size,
            "sha256": sha256_file(final),
        })

    def close(self) -> list[dict]:
        """Finishes the open shard; returns the shard records (``path`` relative to OUT,
        ``num_samples``, ``bytes``, ``sha256``) in shard order."""
        if self._writer is not None:
            self._finish()
        return self.records

    def abort(self) -> None:
        """Drops the shard being written (after an error); finished shards stay on disk."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.abort()
            writer.path.unlink(missing_ok=True)
            for extra in writer.path.parent.glob(writer.path.name + "*"):
                extra.unlink(missing_ok=True)


def remove_partial(out_dir: str | os.PathLike) -> list[str]:
    """Deletes the temporary files a killed pack run left under ``OUT/shards``; returns their names."""
    shards = Path(out_dir) / "shards"
    removed = []
    if shards.is_dir():
        for p in sorted(shards.iterdir()):
            if p.name.startswith(".") and (TMP_SUFFIX in p.name):
                p.unlink()
                removed.append(p.name)
    return removed
