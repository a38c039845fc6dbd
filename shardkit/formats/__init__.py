"""Shard formats: a registry of modules, each with a ``Writer`` and a ``Reader`` that move bytes.

``FORMATS`` maps a format name (``wds``, ``lmdb``, ``hdf5``) to its module. Every module documents
its on-disk layout in its docstring. :class:`~shardkit.formats.base.ShardSink` owns rollover and
crash safety for all of them; :func:`open_reader` opens one finished shard of a packed dataset.
"""
from __future__ import annotations

from types import ModuleType

from ..errors import ConfigError, ManifestError
from ..manifest import join
from . import hdf5, lmdb_format, wds
from .base import FormatReader, FormatWriter, ShardSink, remove_partial, sha256_file

__all__ = ["FORMATS", "ShardSink", "FormatReader", "FormatWriter", "open_reader", "sha256_file",
           "remove_partial", "get_format"]

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

    Raises:
        ManifestError: the split or shard index is not in the manifest.
    """
    try:
        record = manifest["splits"][split]["shards"][shard_idx]
    except (KeyError, IndexError):
        raise ManifestError(f"no shard {shard_idx} in split {split!r} of {root}") from None
    fmt = get_format(manifest["format"])
    if manifest["format"] != "wds" and "://" in str(root):
        raise ConfigError(f"format {manifest['format']!r} needs a local path; only 'wds' tar shards "
                          f"can be read from a URL ({root})")
    return fmt.Reader(join(root, record["path"]), name=record["path"])
