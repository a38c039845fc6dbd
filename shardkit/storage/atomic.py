"""Crash-safe file writes: the one atomic-write helper of shardkit.

Every file a reader may open while a writer runs (``manifest.json``, split indexes, checkpoints,
``metrics.json``, ``bench.json``) is written the same way: a temporary file in the target's own
folder, written, flushed and fsynced, renamed over the target with :func:`os.replace` (atomic on
POSIX within one file system), then the folder is fsynced so the rename itself survives a power
loss. A reader sees either the old file or the complete new one, never a partial file.

A folder fsync that fails (some network and FUSE file systems refuse ``fsync`` on a directory) is
logged once per process at WARNING on the ``shardkit.storage.atomic`` logger, not raised: the data is
written and renamed, only its durability across a power cut is weaker there.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write_bytes", "atomic_write_with", "fsync_dir"]

log = logging.getLogger("shardkit.fsio")
_warned_dirs = False  # one WARNING per process for failed folder fsyncs


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: str | os.PathLike) -> bool:
    """fsyncs ``folder`` so that renames and new entries in it are durable.

    Returns True on success. On failure (the folder cannot be opened, or the file system does not
    support fsync on a folder) it returns False and logs a WARNING naming the folder and the
    error, once per process (later failures log at DEBUG).
    """
    global _warned_dirs
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        level = logging.DEBUG if _warned_dirs else logging.WARNING
        _warned_dirs = True
        log.log(level, "cannot fsync folder %s (%s): renames in it may not survive a power loss "
                "(later failures are logged at DEBUG)", folder, e)
        return False
    return True


def atomic_write_with(path: str | os.PathLike, writer: Callable) -> None:
    """Writes ``path`` atomically through ``writer(f)``, ``f`` a binary file object open for
    writing on a temporary file in the same folder (``torch.save(obj, f)``, ``np.save(f, a)``,
    ``f.write(data)``...). Then flush, fsync, :func:`os.replace` onto ``path``, fsync the folder.

    The file gets the usual permissions (``0o666`` minus the umask), not ``mkstemp``'s private
    ``0o600``, so a dataset or run folder can be shared with other users or served over HTTP.
    The folder is created if needed. If ``writer`` raises, the temporary file is removed, ``path``
    is left as it was and the exception propagates.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` (bytes-like) to ``path`` atomically; see :func:`atomic_write_with`."""
    atomic_write_with(path, lambda f: f.write(data))
