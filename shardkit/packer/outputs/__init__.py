"""The output of a pack: a local folder or an object-store prefix, behind one interface.

A pack never destroys what it did not write: in ``OUT`` it deletes or replaces only the names
it owns, checks ``OUT`` before the scan, writes ``manifest.json`` last (its presence means
"finished") and removes what a failed run wrote. Modules, each importing only those above it in
this list:

- :mod:`.owned`: the owned names (:func:`~.owned.owned_name`, :func:`~.owned.owned_entries`),
  ``MANIFEST_NAME``, ``QUARANTINE_NAME``, :class:`~.owned.DiskFullError`;
- :mod:`.base`: :class:`~.base.PackOutput`, the interface (open, prepare, the shard hook,
  commit, abort, close, owned) and its ``with`` protocol;
- :mod:`.local`: :class:`~.local.LocalOutput`, a local folder (the run lock, the overwrite swap
  of :mod:`shardkit.dataset.swap`);
- :mod:`.upload`: uploads into object storage, and :func:`~.upload.put_shard`, the per-shard
  worker (also run inside Ray tasks);
- :mod:`.remote`: :class:`~.remote.RemoteOutput`, an fsspec URL (``wds`` only; no lock);
- this package: :func:`open_output`, which picks one.
"""
from __future__ import annotations

from pathlib import Path

from shardkit.storage.urls import is_url
from shardkit.dataset.swap import OutputLockedError
from shardkit.packer.outputs.base import PackOutput
from shardkit.packer.outputs.local import LocalOutput
from shardkit.packer.outputs.owned import (MANIFEST_NAME, QUARANTINE_NAME, DiskFullError,
                                           owned_entries, owned_name)
from shardkit.packer.outputs.remote import RemoteOutput
from shardkit.packer.outputs.upload import UploadError

__all__ = ["open_output", "PackOutput", "LocalOutput", "RemoteOutput", "DiskFullError",
           "OutputLockedError", "UploadError", "owned_entries", "owned_name", "MANIFEST_NAME",
           "QUARANTINE_NAME"]


def open_output(src: Path | str, out: Path | str, options) -> PackOutput:
    """The output side of a pack of ``src`` into ``out`` with ``options`` (a
    :class:`~shardkit.packer.options.PackOptions`: ``overwrite``, ``format``): a
    :class:`RemoteOutput` for an fsspec URL, else a :class:`LocalOutput`. Nothing is checked or
    written until it is entered (``with``).

    Raises:
        ConfigError: a remote ``out`` for a format other than ``wds``.
    """
    if is_url(out):
        return RemoteOutput(src, str(out), options.overwrite, options.format)
    return LocalOutput(src, Path(out), options.overwrite)
