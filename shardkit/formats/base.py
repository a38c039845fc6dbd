"""What every shard format shares: the writer and reader interfaces, shard names, hashing.

A format module only moves bytes: its :class:`FormatWriter` appends ``(key, data, ext, label)``
to one open shard file and returns the offset to record in the split index; its
:class:`FormatReader` returns the stored bytes of one sample. ``ShardSink``
(:mod:`shardkit.formats.sink`) owns everything else, so every format gets the same crash safety
(field case 5):

- a shard is written as ``shards/.<split>-NNNNNN<suffix>.tmp``, flushed, fsynced, then renamed to
  ``shards/<split>-NNNNNN<suffix>``; a killed run leaves only ``*.tmp`` files, which
  :func:`remove_partial` deletes;
- a shard is opened only when its first sample arrives, so there are never empty shards;
- rollover happens before a sample that would exceed ``max_samples`` or ``max_bytes`` (a single
  sample larger than ``max_bytes`` gets a shard of its own);
- after the last rename the ``shards/`` folder is fsynced, before the caller writes the manifest.

This module imports nothing from the rest of the package (format modules import it; the registry
in :mod:`shardkit.formats.registry` imports the format modules), so there is no import cycle.
"""
from __future__ import annotations

import hashlib
import os
import threading
from abc import ABC, abstractmethod
from typing import Any, Mapping
from pathlib import Path

__all__ = ["FormatWriter", "FormatReader", "sha256_file", "remove_partial", "shard_name",
           "TMP_SUFFIX"]

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
    def add(self, key: str, data: bytes, ext: str, label: int,
            meta: Mapping[str, Any] | None = None) -> int:
        """Appends one sample; returns its offset for the index (format-specific meaning).

        ``meta`` is the sample's ``{"key", "label", "class", "path"}`` (source relpath); a
        format stores it only when asked to (wds ``wds_json``), the others ignore it."""

    @abstractmethod
    def close(self) -> None:
        """Flushes and fsyncs the file. After this the file at ``self.path`` is complete."""

    def abort(self) -> None:
        """Releases resources after a failure (the sink deletes the temporary file)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort on an already failing path
            pass


#: Guards the lazy open of every reader (rare: once per shard and process).
_OPEN_LOCK = threading.Lock()


def _new_open_lock_in_child() -> None:
    """A child forked while a decoding thread held the lock would inherit it locked forever:
    it starts with a fresh one (as CPython's logging module does for its locks)."""
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_open_lock_in_child)


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
        pid = os.getpid()
        if self._handle is None or self._pid != pid:
            with _OPEN_LOCK:  # decoding threads share readers: open once, never leak a handle
                if self._handle is None or self._pid != pid:
                    self._handle = None  # never use (or close) a handle inherited through fork
                    self._handle = self._open()
                    self._pid = pid
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

    def read_into(self, key: str, offset: int, size: int, buf: bytearray) -> bytes | memoryview:
        """As :meth:`read`, but may return a view into ``buf`` (a caller-owned scratch buffer of
        at least ``size + 512`` bytes) instead of allocating; valid until ``buf`` is reused.
        The default allocates (``read``); formats that ``pread`` override it."""
        return self.read(key, offset, size)

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
