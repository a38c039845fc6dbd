"""Uploads into object storage, below :mod:`shardkit.packer.outputs.remote`: the fsspec
filesystem of a URL, local staging folders, one file's upload with its size checked, and the
per-shard worker :func:`put_shard` (called by the sink's ``on_close`` hook through
:class:`ShardUpload`, and inside each Ray task by :mod:`shardkit.ray.engine`).

- **Exact bytes.** A shard is uploaded from the very file whose sha256 the manifest records; the
  object's size (``fs.info``) must be the file's, else :class:`UploadError` names both. Before it
  leaves, its tar headers are checked against its split records and its DALI index is built
  (:func:`shardkit.interop.shards.scan_shard`), which is what :mod:`shardkit.interop` needs
  later, the shards being gone from the staging folder.
- **Staging folders** (:func:`staging_folder`, in ``$TMPDIR``) hold a marker file naming their
  process; the staging folder of a killed pack is removed by the next pack into object storage
  on this machine, and a folder without the marker is never touched, whatever its name.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from shardkit.dataset.manifest import json_bytes
from shardkit.errors import ConfigError, ShardCorruptError, UploadError
from shardkit.interop.shards import ShardMembers, scan_shard
from shardkit.storage.procs import pid_alive

__all__ = ["UploadError", "ShardUpload", "put_shard", "remote_fs", "upload_file",
           "staging_folder", "STAGING_MARKER"]

logger = logging.getLogger("shardkit.pack")

STAGING_MARKER = ".shardkit-staging.json"
"""The file :func:`staging_folder` writes into each local staging folder it creates:
``{"pid", "host", "token", "started"}``."""


def remote_fs(url: str):
    """``(filesystem, path)`` of an fsspec URL (fsspec caches the filesystem per process).

    Raises:
        ConfigError: the URL's filesystem package is not installed (names it).
    """
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise ConfigError(f"output {url}: {e} (for s3:// pip install s3fs, for gs:// gcsfs)"
                          ) from None


def staging_folder(prefix: str = "shardkit-pack-") -> Path:
    """A new local staging folder ``<prefix><pid>-<token>-<random>`` (``tempfile.mkdtemp``: in
    ``$TMPDIR``, else ``/tmp``; mode 0700) holding :data:`STAGING_MARKER` with this process's
    pid, host name and a random token. Before it is made, the staging folders of this machine's
    earlier packs whose process is gone (killed: a ``with`` block never removed them) are
    removed and logged: a folder counts as one only when it is a real folder of this user
    holding a marker (a regular file of this user) whose token is the one in the folder's name,
    whose host is this one and whose pid is not running. Any other folder, whatever its name
    (a user's ``shardkit-pack-2024-holiday-photos``), is left alone."""
    root = Path(tempfile.gettempdir())
    for old in sorted(root.glob(f"{prefix}*")):
        owner = _dead_staging(old, prefix)
        if owner is not None:
            shutil.rmtree(old, ignore_errors=True)
            logger.info("removed %s, the staging folder of a killed pack (pid %s)", old, owner)
    token = secrets.token_hex(8)
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{token}-"))
    marker = {"pid": os.getpid(), "host": socket.gethostname(), "token": token,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / STAGING_MARKER).write_bytes(json_bytes(marker))
    return folder


def _dead_staging(folder: Path, prefix: str) -> int | None:
    """The pid of the killed pack whose staging folder ``folder`` is (see
    :func:`staging_folder`), else None."""
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        mark = os.lstat(folder / STAGING_MARKER)
        if not stat.S_ISREG(mark.st_mode) or mark.st_uid != os.getuid() or mark.st_size > 4096:
            return None
        info = json.loads((folder / STAGING_MARKER).read_bytes())
        pid, token = info["pid"], info["token"]
        if not (isinstance(pid, int) and isinstance(token, str) and token
                and folder.name.startswith(f"{prefix}{pid}-{token}-")
                and info["host"] == socket.gethostname()):
            return None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return None if pid_alive(pid) else pid


def upload_file(fs, local: Path, rpath: str, url: str) -> None:
    """Uploads the local file ``local`` to ``rpath`` of ``fs`` (``url`` names it in errors) and
    checks the object's size against the file's.

    Raises:
        UploadError: the upload failed (the filesystem's error, named), or the sizes differ.
    """
    size = os.stat(local).st_size
    try:
        fs.put_file(os.fspath(local), rpath)
        got = fs.info(rpath)["size"]
    except Exception as e:  # s3fs/gcsfs/botocore errors alike: one line naming both ends
        raise UploadError(f"cannot upload {local} to {url}: {type(e).__name__}: {e}") from None
    if got != size:
        raise UploadError(f"{url} holds {got} bytes after the upload, the local file {local} "
                          f"{size}: the object store did not keep the exact bytes; the pack "
                          "was stopped and its objects deleted")


def put_shard(url: str, path: Path, record: dict, records: list[dict]) -> ShardMembers:
    """Checks one finished shard against its split records, uploads it to
    ``url/<record["path"]>`` (:func:`upload_file`) and deletes the local file.

    Args:
        url: the remote ``OUT``. path: the local shard file (from the sink's ``on_close``).
        record: its manifest entry (``path`` relative to OUT, ``num_samples``, ``bytes``,
            ``sha256``). records: the split records of its samples (``key``, ``offset``,
            ``size``).

    Returns:
        its members with its DALI index text (:func:`shardkit.interop.shards.scan_shard`).

    Raises:
        ShardCorruptError: the shard does not match the records (a bug). UploadError.
    """
    if len(records) != record["num_samples"]:
        raise ShardCorruptError(f"shard {record['path']}: {len(records)} split records for "
                                f"{record['num_samples']} samples")
    members = scan_shard(path, record["path"], [r["key"] for r in records],
                         [r["offset"] for r in records], [r["size"] for r in records],
                         dali_index=True)
    fs, base = remote_fs(url)
    upload_file(fs, path, f"{base}/{record['path']}", f"{url}/{record['path']}")
    os.unlink(path)
    logger.debug("uploaded %s to %s", record["path"], url)
    return members


@dataclass
class ShardUpload:
    """The ``on_close`` work of a pack into ``url``: :func:`put_shard`, the members summed in
    :attr:`members` (for :func:`shardkit.interop.write_pack_metadata`)."""

    url: str
    members: ShardMembers = field(default_factory=ShardMembers)

    def __call__(self, path: Path, record: dict, records: list[dict]) -> None:
        self.members.update(put_shard(self.url, path, record, records))
