"""The shards a dataset's manifest lists are there: each with its recorded size and openable,
in a local folder or in object storage (``shardkit check`` runs this before any verdict).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from shardkit.storage.urls import is_url
from shardkit.errors import ShardCorruptError
from shardkit.stream.source import check_shard_files

__all__ = ["check_shards"]


def check_shards(root: str | Path, manifest: dict[str, Any]) -> None:
    """Every shard the manifest lists is there, has its recorded size in bytes and can be
    opened for reading; in object storage: one listing per shard folder, every object there
    with its size. Contents are not hashed (``shardkit verify`` does).

    Raises:
        ShardCorruptError: naming every missing, wrong-sized or unopenable (no permission, a
            folder) shard of the first split that has one. OSError or the store's own error:
            the shards cannot be listed or opened for another reason (no file handle left).
    """
    if is_url(root):
        _check_remote_shards(str(root), manifest)
        return
    for split, info in manifest["splits"].items():
        shards = info.get("shards", [])
        check_shard_files(root, split, shards)  # missing, truncated, grown
        unreadable = []
        for rec in shards:
            try:
                with open(Path(root) / rec["path"], "rb"):
                    pass
            except (PermissionError, IsADirectoryError) as e:  # others (EMFILE): the OS's
                unreadable.append(f"{rec['path']}: cannot be opened ({type(e).__name__}: "
                                  f"{e.strerror or e})")
        if unreadable:
            raise ShardCorruptError(f"{root}: {len(unreadable)} of {len(shards)} shard(s) of "
                                    f"split {split!r} cannot be read: "
                                    + "; ".join(unreadable[:10])
                                    + (f"; ... {len(unreadable) - 10} more"
                                       if len(unreadable) > 10 else ""))


def _check_remote_shards(root: str, manifest: dict[str, Any]) -> None:
    """:func:`check_shards` in object storage: one listing per shard folder (``https://``:
    one HEAD per shard, as a web server need not list folders)."""
    import posixpath

    import fsspec

    from shardkit.storage.urls import join

    fs, base = fsspec.core.url_to_fs(root)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    http = bool({"http", "https"} & set(protocols))
    listed: dict[str, dict[str, int | None]] = {}  # folder -> {object path: size}

    def size_of(path: str) -> int | None | bool:
        """The object's size (None: unknown), False when there is no object."""
        if http:
            try:
                return fs.info(path).get("size")
            except FileNotFoundError:
                return False
        folder = path.rpartition("/")[0]
        if folder not in listed:
            fs.invalidate_cache(folder)  # the store now, not a listing an earlier call cached
            try:
                found = fs.ls(folder, detail=True)
            except FileNotFoundError:
                found = []
            listed[folder] = {o["name"].rstrip("/"): o.get("size") for o in found}
        return listed[folder].get(path, False)

    for split, info in manifest["splits"].items():
        problems = []
        shards = info.get("shards", [])
        for rec in shards:
            size = size_of(posixpath.join(base, rec["path"]))
            if size is False:
                problems.append(f"{rec['path']}: missing (no object at {join(root, rec['path'])})")
            elif None not in (size, rec.get("bytes")) and int(size) != rec["bytes"]:
                problems.append(f"{rec['path']}: {size} bytes, the manifest says {rec['bytes']}")
        if problems:
            raise ShardCorruptError(f"{root}: {len(problems)} of {len(shards)} shard(s) of split "
                                    f"{split!r} do not match the manifest: "
                                    + "; ".join(problems[:10])
                                    + (f"; ... {len(problems) - 10} more"
                                       if len(problems) > 10 else "")
                                    + " (shardkit verify checks every shard)")
