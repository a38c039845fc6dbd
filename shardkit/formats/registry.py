"""The format registry: format name -> module, and :func:`open_reader` for one finished shard.

Imports the format modules (which import only :mod:`shardkit.formats.base`), so ``base`` never
needs the package back: ``formats/__init__`` -> ``registry`` -> ``wds``/``lmdb_format``/``hdf5``
-> ``base``, with no cycle.
"""
from __future__ import annotations

from types import ModuleType

from ..errors import ConfigError, ManifestError
from shardkit.storage.urls import is_url, join
from . import hdf5, lmdb_format, wds
from .base import FormatReader

__all__ = ["FORMATS", "get_format", "open_reader"]

FORMATS: dict[str, ModuleType] = {"wds": wds, "lmdb": lmdb_format, "hdf5": hdf5}


def get_format(name: str) -> ModuleType:
    """The format module registered under ``name``.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown format {name!r}; expected one of {sorted(FORMATS)}") from None


def open_reader(root, manifest: dict, split: str, shard_idx: int) -> FormatReader:
    """A lazy reader for shard ``shard_idx`` of ``split`` (nothing is opened until the first read).

    ``root``: a local folder, a ``file://`` URL of one (all formats), or a remote fsspec URL
    (``wds`` only); :func:`shardkit.storage.urls.is_url` decides which.

    Raises:
        ManifestError: the split or shard index is not in the manifest.
        ConfigError: an ``lmdb`` / ``hdf5`` dataset at a remote URL.
    """
    try:
        record = manifest["splits"][split]["shards"][shard_idx]
    except (KeyError, IndexError):
        raise ManifestError(f"no shard {shard_idx} in split {split!r} of {root}") from None
    fmt = get_format(manifest["format"])
    if manifest["format"] != "wds" and is_url(root):
        raise ConfigError(f"format {manifest['format']!r} needs a local path; only 'wds' tar shards "
                          f"can be read from a URL ({root})")
    reader = fmt.Reader(join(root, record["path"]), name=record["path"])
    reader.expected_bytes = record.get("bytes")  # a remote shard's fetch checks its size
    return reader
