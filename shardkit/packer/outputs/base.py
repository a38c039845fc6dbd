""":class:`PackOutput`: the one interface of a pack's output, a local folder or an object-store
prefix (:mod:`.local`, :mod:`.remote`; :func:`shardkit.packer.outputs.open_output` picks one).

The life of an output, driven by :func:`shardkit.packer.run.pack`::

    with open_output(src, out, options) as target:   # open(): the rules, before the scan
        ...                                          # scan, check, split: nothing written
        root = target.prepare()                      # step 5: leftovers removed; where to write
        # the steps write every file of the dataset into the local folder ``root``: shards
        # through a ShardSink whose on_close calls ``target.upload`` (when not None), small
        # files (quarantine list, split files, readers' files) and manifest.json (last) with
        # atomic writes
        target.commit()                              # the dataset becomes OUT's
    # an exception in the block: abort() deletes what the run wrote, close() always

``owned()`` lists what the output owns under ``OUT`` (:mod:`.owned`'s names), ``manifest.json``
first; ``cleaned`` and ``replaced`` say what a run removed (leftovers) and overwrote (the old
dataset), for the summary.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from pathlib import Path

from shardkit.errors import OutputExistsError
from shardkit.packer.outputs.owned import DISK_FULL_ERRNOS, MANIFEST_NAME, DiskFullError

__all__ = ["PackOutput"]

logger = logging.getLogger("shardkit.pack")


class PackOutput(ABC):
    """The output side of one pack run into ``out``; a context manager around the whole run.

    Operations (each subclass implements them for its kind of ``OUT``):

    - :meth:`open` (``__enter__``): checks the output rules before the scan, writes no dataset
      file; returns ``self``.
    - :meth:`prepare` (step 5): removes owned leftovers of an unfinished run and returns
      :attr:`root`, the local folder the run writes the dataset into.
    - writing a shard: the :class:`shardkit.formats.ShardSink` writes it into ``root/shards``;
      its ``on_close`` hands each finished shard to :attr:`upload` when that is not None.
    - writing a small file: the steps write it into ``root`` (atomically); :meth:`commit`
      publishes every owned file found there, ``manifest.json`` last.
    - :meth:`commit`: makes the dataset written into ``root`` the dataset of ``OUT``.
    - :meth:`abort` (leaving the ``with`` with an exception): deletes what the run wrote.
    - :meth:`close` (always, last): releases what the run holds.
    - :meth:`owned`: the owned entries under ``OUT`` now.

    Leaving the ``with`` block with an exception calls :meth:`abort` then :meth:`close`; an
    ``OSError`` of a full disk is re-raised as :meth:`disk_full_error`'s
    :class:`~shardkit.packer.outputs.owned.DiskFullError` (one line naming the file).

    Args:
        src: the pack's source (a local path or an fsspec URL), checked against ``out``.
        out: ``OUT``. overwrite: whether a finished dataset in ``OUT`` may be replaced.

    Attributes:
        root: the local folder the run writes into; None before :meth:`prepare`.
        upload: the shard hook, ``upload(path, record, split records)`` for every shard the
            sink closes (a :class:`shardkit.packer.outputs.upload.ShardUpload`, with ``url``
            and ``members``); None when shards stay where the sink writes them.
        cleaned: owned leftovers of unfinished runs removed (paths relative to ``OUT``).
        replaced: files of the previous dataset overwritten or removed (overwrite).
    """

    def __init__(self, src, out, overwrite: bool):
        self.src, self.out, self.overwrite = src, out, bool(overwrite)
        self.root: Path | None = None
        self.upload = None
        self.cleaned: list[str] = []
        self.replaced: list[str] = []
        self.committed = False  # commit made the new dataset OUT's: abort deletes nothing

    @property
    def shard_members(self):
        """The members of the shards handed to :attr:`upload` (a
        :class:`shardkit.interop.shards.ShardMembers`, for
        :func:`shardkit.interop.write_pack_metadata`); None without an upload hook (the shards
        are in ``root`` to be scanned)."""
        return None if self.upload is None else self.upload.members

    # ------------------------------------------------------------------ the operations
    @abstractmethod
    def open(self) -> PackOutput:
        """Checks the rules before the scan; returns ``self``."""

    @abstractmethod
    def prepare(self) -> Path:
        """Step 5: removes owned leftovers; returns :attr:`root`."""

    @abstractmethod
    def commit(self) -> None:
        """Makes the dataset written into :attr:`root` (``manifest.json`` included) ``OUT``'s."""

    @abstractmethod
    def abort(self) -> list[str]:
        """Deletes what this run wrote (nothing once committed); returns what was removed."""

    @abstractmethod
    def close(self) -> None:
        """Releases what the run holds (a lock, a staging folder)."""

    @abstractmethod
    def owned(self) -> list[str]:
        """The owned entries under ``OUT`` (posix paths relative to it), ``manifest.json``
        first."""

    @abstractmethod
    def holds_manifest(self) -> bool:
        """Whether ``OUT`` holds a ``manifest.json`` (a finished dataset) now."""

    @abstractmethod
    def disk_full_error(self, exc: OSError) -> DiskFullError:
        """The one-line error for ``exc``, a full disk (``ENOSPC``, ``EDQUOT``) while writing."""

    # ------------------------------------------------------------------ shared rules
    def check_finished(self) -> None:
        """Refuses a finished dataset in ``OUT`` without ``overwrite``.

        Raises:
            OutputExistsError: ``OUT`` holds ``manifest.json`` and ``overwrite`` is False.
        """
        if self.holds_manifest() and not self.overwrite:
            raise OutputExistsError(f"{self.out} already holds a packed dataset "
                                    f"({MANIFEST_NAME}); pass --overwrite (overwrite=True) to "
                                    "replace it")

    def log_cleaned(self) -> None:
        """Logs :attr:`cleaned` (INFO), the leftovers removed before writing."""
        if self.cleaned:
            logger.info("removed from %s before writing (left by an unfinished run): %s",
                        self.out, ", ".join(self.cleaned))

    def __enter__(self) -> PackOutput:
        return self.open()

    def __exit__(self, kind, exc, tb) -> None:
        full = (self.disk_full_error(exc) if isinstance(exc, OSError)
                and exc.errno in DISK_FULL_ERRNOS and not isinstance(exc, DiskFullError)
                else None)
        try:
            if exc is not None:
                self.abort()
        finally:
            self.close()
        if full is not None:
            raise full from exc
