""":class:`LocalOutput`: a pack into a local folder: the run lock, staging, the swap.

Rules (a pack never destroys what it did not write):

- **Owned names** (:mod:`shardkit.packer.outputs.owned`): only the names shardkit writes are
  ever deleted or replaced; whatever is removed is logged (INFO, ``shardkit.pack``) and listed
  in the summary.
- **Checked before the scan** (:meth:`LocalOutput.open`, nothing is written): ``OUT`` is not a
  file, its nearest existing folder is writable, ``OUT`` is not inside the source and the source
  (folder or CSV) is not inside ``OUT``; a ``manifest.json`` needs ``overwrite``.
- **One packer per OUT.** The lock of :mod:`shardkit.dataset.swap`
  (:class:`~shardkit.dataset.swap.DatasetLock`, an exclusive ``fcntl.flock`` on
  ``OUT/.shardkit-pack.lock``) is held for the whole run (from the start when ``OUT`` exists,
  else from the moment the run creates it). The file holds the holder's command, pid, host and
  start time; a second packer fails at once with :class:`OutputLockedError` naming them (a
  ``stats`` or ``export`` holding it is waited for, up to
  :data:`~shardkit.dataset.swap.BRIEF_WAIT_S`). The file is removed when the run ends. A swap
  that a killed overwrite left half-done is finished first, under the lock
  (:func:`shardkit.dataset.swap.roll_forward`).
- **Fresh OUT** (no ``manifest.json``): owned leftovers of a killed run are deleted, then the run
  writes into ``OUT`` itself, ``manifest.json`` last. If the run fails (an exception, a full disk),
  everything it wrote is deleted again (a SIGKILL leaves only unlisted files and no manifest).
- **overwrite** of a finished dataset: the swap of :mod:`shardkit.dataset.swap`. The new dataset is
  built in the staging folder (``OUT/.shardkit-new/``, its shards in ``OUT/shards/.shardkit-new/``
  and split files in ``OUT/splits/.shardkit-new/``: each on the file system of its final place,
  so the swap is renames only, also when ``OUT/shards`` is a symlink to another disk; the disks
  need room for both datasets) while the old one stays complete and readable.
  :meth:`LocalOutput.commit` writes the swap journal (the commit point), then rolls forward: the
  old ``manifest.json`` and the old files the new dataset lacks are removed, the new files
  renamed into place, the new ``manifest.json`` last. A kill or a full disk before the journal
  leaves the old dataset untouched (the staging folder is removed on errors, or by the next run
  after a kill); after it, the next shardkit command that opens ``OUT`` finishes the swap, so it
  always finds one whole dataset, old or new, never a mix.

Disk-full errors (``ENOSPC``, ``EDQUOT``) while writing become
:class:`~shardkit.packer.outputs.owned.DiskFullError`: one line naming the file, after the run's
files were removed.

A remote ``OUT`` (:mod:`shardkit.packer.outputs.remote`) follows the same rules by name, except
that no lock is possible there and an overwrite deletes the old ``manifest.json`` when writing
starts instead of building beside it.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from shardkit.dataset import swap
from shardkit.storage.urls import is_url
from shardkit.dataset.swap import DatasetLock, OutputLockedError
from shardkit.errors import ConfigError
from shardkit.packer.outputs.base import PackOutput
from shardkit.packer.outputs.owned import (MANIFEST_NAME, DiskFullError, is_hidden,
                                           owned_entries, remove_owned)

__all__ = ["LocalOutput", "OutputLockedError"]

logger = logging.getLogger("shardkit.pack")


class LocalOutput(PackOutput):
    """The output side of one pack run into the local folder ``out`` (see the module doc and
    :class:`~shardkit.packer.outputs.base.PackOutput` for the operations).

    ``open()`` checks the rules before the scan and locks an existing ``OUT``; :meth:`prepare`
    returns the folder to write into; :meth:`commit` (after ``manifest.json`` was written
    there) swaps a staged dataset into place; :meth:`abort` deletes what the run wrote; the lock
    is released by :meth:`close` in every case. :attr:`upload` is None: the shards are written
    where they stay.

    Attributes:
        root: where the run writes (``OUT``, or ``OUT/.shardkit-new`` of
            :func:`shardkit.dataset.swap.make_staging`); None before prepare.
        cleaned: owned leftovers of unfinished runs removed (relative to ``OUT``): before
            writing, and (temporary names beside an old dataset) after the swap.
        replaced: files of the previous dataset overwritten or removed by the swap (overwrite).
    """

    def __init__(self, src: Path | str, out: Path | str, overwrite: bool = False):
        # a remote source (an fsspec URL) can neither hold OUT nor lie inside it
        super().__init__(None if is_url(src) else Path(src), Path(out), overwrite)
        self._lock = DatasetLock(self.out, "pack")
        self._created_out = False

    @property
    def staging(self) -> bool:
        """True when the run writes beside a finished dataset (overwrite)."""
        return self.root is not None and self.root != self.out

    def holds_manifest(self) -> bool:
        return (self.out / MANIFEST_NAME).exists()

    def owned(self) -> list[str]:
        """:func:`~shardkit.packer.outputs.owned.owned_entries` of ``OUT``."""
        return owned_entries(self.out)

    # ------------------------------------------------------------------ before the scan
    def open(self) -> LocalOutput:
        """Checks the output rules, then creates ``OUT`` if needed and locks it (the lock file is
        all it writes; a run that fails before step 5 removes an ``OUT`` it created).

        Raises:
            ConfigError: ``OUT`` is a file, lies inside the source, holds the source, or cannot
                be written. OutputExistsError: a finished dataset and no ``overwrite``.
            OutputLockedError: another run packs into ``OUT``.
        """
        src, out = self.src, self.out
        if src is not None and src.is_dir() and (out == src or src in out.parents):
            raise ConfigError(f"output {out} lies inside the source {src}; choose a folder "
                              "outside it")
        if src is not None and out in src.parents:
            raise ConfigError(f"source {src} lies inside the output folder {out}; a pack may "
                              "delete and replace files there: move the source out of it, or "
                              "choose another output folder")
        if out.exists() and not out.is_dir():
            raise ConfigError(f"output {out} exists and is not a folder; choose a folder path")
        folder = next(p for p in (out, *out.parents) if p.exists())
        if not folder.is_dir():
            raise ConfigError(f"output {out} cannot be created: {folder} is a file, not a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            why = "it is on a read-only file system" if _read_only_fs(folder) else \
                "no write permission"
            raise ConfigError(f"output {out} cannot be written: {folder} is not writable "
                              f"({why})")
        self._make_out()  # OUT exists and is locked before the long scan: a second packer fails
        try:
            self._lock_and_finish()
            self.check_finished()
        except BaseException:
            self.close()  # removes an OUT this run created
            raise
        return self

    def _make_out(self) -> None:
        try:
            self.out.mkdir(parents=True)
            self._created_out = True
        except FileExistsError:
            pass

    def _lock_and_finish(self) -> None:
        """Takes the lock (a stats or export holding it is waited for, a pack is not), then
        finishes a swap that a killed overwrite left
        (:func:`shardkit.dataset.swap.roll_forward`)."""
        self._lock.acquire(swap.BRIEF_WAIT_S, wait_for_pack=False)
        if os.path.lexists(self.out / swap.JOURNAL_NAME):
            swap.roll_forward(self.out, resumed=True)

    # ------------------------------------------------------------------ step 5
    def prepare(self) -> Path:
        """Step 5: creates and locks ``OUT`` if needed, removes owned leftovers, and returns the
        folder to write the dataset into (``OUT``, or a fresh staging folder for overwrite)."""
        self._make_out()
        if self._lock.fd is None:
            self._lock_and_finish()
        self.check_finished()  # a run that finished meanwhile, before we held the lock
        if self.holds_manifest():  # overwrite: build beside the old dataset
            self.cleaned += swap.remove_staging(self.out)  # an unfinished run's (no journal)
            self.root = swap.make_staging(self.out)
        else:
            self.cleaned += remove_owned(self.out, owned_entries(self.out), prune=False)
            self.root = self.out
        self.log_cleaned()
        return self.root

    def commit(self) -> None:
        """Swaps a staged dataset into ``OUT`` (nothing to do for a fresh one): writes the swap
        journal (from here on the new dataset is the dataset), then rolls it forward
        (:func:`shardkit.dataset.swap.roll_forward`) and deletes the old dataset's hidden leftovers
        (temporary names of a killed run). Logs what of the old dataset was replaced.

        Raises:
            ManifestError: the roll forward failed (the new dataset stays staged with its
                journal; the next command that opens OUT finishes the swap).
        """
        if not self.staging:
            self.committed = True
            return
        out = self.out
        old = [e for e in owned_entries(out) if not e.endswith("/")]  # files, manifest first
        moves = [e for e in owned_entries(self.root)
                 if e != MANIFEST_NAME and not is_hidden(e) and not e.endswith("/")]
        hidden = [e for e in old if is_hidden(e)]  # not seen by readers: removed after the swap
        removes = [e for e in old if e not in moves and e != MANIFEST_NAME and not is_hidden(e)]
        swap.write_journal(out, moves, removes)  # the commit point
        self.committed = True
        swap.roll_forward(out)
        self.cleaned += remove_owned(out, hidden, prune=False)
        self.replaced = [e for e in old if not is_hidden(e)]  # each overwritten or removed
        logger.info("replaced the dataset in %s: %d file(s) of the old one overwritten or "
                    "removed", out, len(self.replaced))

    def abort(self) -> list[str]:
        """Deletes what this run wrote (the staging folder, or the owned files of a fresh OUT,
        and OUT itself when the run created it and nothing else is in it). Nothing once the
        swap journal is written."""
        if self.root is None or self.committed:
            return []
        if self.staging:
            removed = swap.remove_staging(self.out)
        else:
            removed = remove_owned(self.out, owned_entries(self.out))
        logger.info("pack failed: removed what it wrote in %s (%d entries)", self.out,
                    len(removed))
        return removed

    def close(self) -> None:
        """Releases the lock; removes ``OUT`` if this run created it and it is empty."""
        self._lock.release()
        if self._created_out and not self.committed:
            try:
                self.out.rmdir()
            except OSError:
                pass

    def disk_full_error(self, exc: OSError) -> DiskFullError:
        kept = ("the previous dataset in OUT is unchanged" if self.staging else
                "nothing was kept")
        return DiskFullError(exc.errno, f"no space left on device while writing "
                             f"{exc.filename or 'a file in ' + str(self.out)}; the files of this "
                             f"run were removed and {kept}: free some space there and rerun",
                             exc.filename)


def _read_only_fs(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
