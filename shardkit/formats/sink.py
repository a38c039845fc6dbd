"""``ShardSink``: rollover, temporary names, fsync and atomic rename for every shard format.

See :mod:`shardkit.formats.base` for the crash-safety contract (field case 5). Shards are written
under a temporary name, fsynced and renamed one by one; :meth:`ShardSink.close` then fsyncs the
``shards/`` folder once, so the renames are on disk before the caller writes ``manifest.json``.
The sink is a context manager: the ``with`` block's end closes it, an exception inside the block
aborts it (the shard being written and its temporary files are removed).
"""
from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import ConfigError
from shardkit.storage.atomic import fsync_dir
from .base import TMP_SUFFIX, FormatWriter, sha256_file, shard_name
from .registry import get_format

__all__ = ["ShardSink"]


class ShardSink:
    """Writes the samples of one split into rolled-over shards of one format.

    Use it as a context manager: ``with ShardSink(...) as sink: sink.add(...)`` closes it at the
    end of the block (:meth:`close`; the shard records are then in :attr:`records`) and aborts it
    when the block raises (:meth:`abort`: the shard being written and its temporary files are
    removed, finished shards stay; the exception propagates). An ``OSError`` from the block or
    from the close that names no file or a temporary (``.``-hidden) name is given the final name
    of the shard being written in ``filename``, so a full disk is reported by shard name.

    Args:
        out_dir: the dataset folder (``OUT``); shards go to ``OUT/shards/``.
        split: split name, used in shard file names.
        fmt: a format name registered in :data:`shardkit.formats.FORMATS`.
        max_samples: roll over after this many samples per shard (``None``: no limit).
        max_bytes: roll over before a shard's stored image bytes would exceed this (``None``: no
            limit).
        on_close: called as ``on_close(path, record)`` with each finished shard's final path and
            its record (see :meth:`close`) right after the atomic rename; the sink never reads
            the file again, so the hook may move or delete it (a pack into object storage
            uploads it and deletes the local copy: :mod:`shardkit.packer.outputs.remote`). An
            error it raises propagates from :meth:`add` or :meth:`close`.
        index: fixed-index mode: the sink writes exactly one shard, shard number ``index`` of
            the split (``<split>-<index:06d><suffix>``, the shard a plan of shards gave this
            writer), and :meth:`add` returns ``index`` as the shard index; no rollover, so
            ``max_samples`` and ``max_bytes`` must be None. ``None`` (default): shards are
            numbered from 0 as they roll over.

    Raises:
        ConfigError: an unknown format; ``max_samples`` or ``max_bytes`` < 1; ``index`` not an
            integer >= 0, or given with ``max_samples`` / ``max_bytes``.
    """

    def __init__(self, out_dir, split: str, fmt: str, max_samples: int | None = None,
                 max_bytes: int | None = None, writer_options: dict | None = None,
                 on_close: Callable[[Path, dict], None] | None = None,
                 index: int | None = None):
        for name, value in (("max_samples", max_samples), ("max_bytes", max_bytes)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if index is not None:
            index = _shard_index(index)
            if max_samples is not None or max_bytes is not None:
                raise ConfigError(f"index={index} writes one shard: max_samples and max_bytes "
                                  "(rollover) do not apply to it")
        self.out_dir = Path(out_dir)
        self.split = split
        self.writer_cls = get_format(fmt).Writer
        self.writer_options = writer_options or {}
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.on_close = on_close
        self.index = index
        self.records: list[dict] = []
        self._writer: FormatWriter | None = None
        self._count = 0
        self._bytes = 0
        self._renamed = False  # a shard was renamed since the last fsync of shards/
        (self.out_dir / "shards").mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> ShardSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Closes the sink (no exception) or aborts it (an exception, which propagates)."""
        if exc is None:
            try:
                self.close()
            except BaseException as e:
                self._failed(e)
                raise
        else:
            self._failed(exc)
        return False

    def _failed(self, e: BaseException) -> None:
        """The failed-write path: :meth:`abort`, then an ``OSError`` naming no file or a
        temporary name is given the final name of the shard being written."""
        self.abort()
        if isinstance(e, OSError) and (e.filename is None or
                                       Path(str(e.filename)).name.startswith(".")):
            e.filename = str(self._final_path(self._current_index()))

    def _current_index(self) -> int:
        """The number of the shard being written (or of the next one)."""
        return len(self.records) if self.index is None else self.index

    def _final_path(self, index: int) -> Path:
        return self.out_dir / "shards" / shard_name(self.split, index, self.writer_cls.suffix)

    def _tmp_path(self, index: int) -> Path:
        final = self._final_path(index)
        return final.with_name("." + final.name + TMP_SUFFIX)

    def add(self, key: str, data: bytes, ext: str, label: int,
            meta: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """Appends one sample; returns ``(shard_index, offset)`` for the split index. ``meta``:
        see :meth:`shardkit.formats.base.FormatWriter.add`.

        Raises:
            ConfigError: a fixed-index sink whose shard is already finished (closed).
        """
        if self._writer is not None and (
            (self.max_samples is not None and self._count >= self.max_samples)
            or (self.max_bytes is not None and self._bytes + len(data) > self.max_bytes)
        ):
            self._finish()
        if self._writer is None:
            if self.index is not None and self.records:
                raise ConfigError(f"shard {self.index} of split {self.split!r} is finished: a "
                                  "sink with a fixed index writes one shard")
            tmp = self._tmp_path(self._current_index())
            tmp.unlink(missing_ok=True)
            self._writer = self.writer_cls(tmp, **self.writer_options)
            self._count = 0
            self._bytes = 0
        try:
            offset = self._writer.add(key, data, ext, label, meta)
        except BaseException:
            self.abort()
            raise
        self._count += 1
        self._bytes += len(data)
        return self._current_index(), offset

    def _finish(self) -> None:
        writer, self._writer = self._writer, None
        final = self._final_path(self._current_index())
        try:
            writer.close()
            os.replace(writer.path, final)
        except BaseException:  # the temporary files go (a full disk: no half shard is left)
            _drop(writer)
            raise
        self._renamed = True
        self.records.append({
            "path": final.relative_to(self.out_dir).as_posix(),
            "num_samples": self._count,
            "bytes": final.stat().st_size,
            "sha256": sha256_file(final),
        })
        if self.on_close is not None:
            self.on_close(final, self.records[-1])

    def close(self) -> list[dict]:
        """Finishes the open shard and fsyncs ``OUT/shards/`` (so every rename is durable before
        the caller writes the manifest; a failed folder fsync is logged, see
        :func:`shardkit.storage.atomic.fsync_dir`); returns the shard records (``path`` relative to OUT,
        ``num_samples``, ``bytes``, ``sha256``) in shard order (also :attr:`records`). Closing
        a closed sink returns the same records."""
        if self._writer is not None:
            self._finish()
        if self._renamed:
            fsync_dir(self.out_dir / "shards")  # the renames are durable before the manifest
            self._renamed = False
        return self.records

    def abort(self) -> None:
        """Drops the shard being written and its temporary files (after an error); finished
        shards stay on disk."""
        writer, self._writer = self._writer, None
        if writer is not None:
            _drop(writer)


def _drop(writer: FormatWriter) -> None:
    """Aborts ``writer`` and deletes its temporary file and the files named after it (LMDB's
    ``.tmp.work``)."""
    writer.abort()
    writer.path.unlink(missing_ok=True)
    for extra in writer.path.parent.glob(writer.path.name + "*"):
        extra.unlink(missing_ok=True)


def _shard_index(index) -> int:
    """``index`` as an int >= 0 (numpy integers too; bool refused)."""
    try:
        if isinstance(index, bool):
            raise TypeError
        value = operator.index(index)
    except TypeError:
        raise ConfigError(f"index={index!r}; expected a shard number, an integer >= 0") from None
    if value < 0:
        raise ConfigError(f"index={value}; expected a shard number, an integer >= 0")
    return value
