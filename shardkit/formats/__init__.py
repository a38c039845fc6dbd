"""Shard formats: a registry of modules, each with a ``Writer`` and a ``Reader`` that move bytes.

``FORMATS`` maps a format name (``wds``, ``lmdb``, ``hdf5``) to its module. Every module documents
its on-disk layout in its docstring. :class:`~shardkit.formats.sink.ShardSink` owns rollover and
crash safety for all of them; :func:`open_reader` opens one finished shard of a packed dataset.

Import order (no cycle): :mod:`.base` (interfaces, imports nothing from the package) <- the format
modules <- :mod:`.registry` (``FORMATS``, ``get_format``, ``open_reader``) <- :mod:`.sink`
(``ShardSink``) <- this package, which only re-exports.
"""
from __future__ import annotations

from .base import (FormatReader, FormatWriter, close_all_shards, max_open_shards,
                   open_shard_count, resource_error, sha256_file)
from .registry import FORMATS, get_format, open_reader
from .sink import ShardSink

__all__ = ["FORMATS", "ShardSink", "FormatReader", "FormatWriter", "open_reader", "sha256_file",
           "get_format", "max_open_shards", "open_shard_count",
           "close_all_shards", "resource_error"]
