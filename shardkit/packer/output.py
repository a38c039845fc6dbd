"""The output folder of one pack run: what shardkit owns in it, the run lock, staging, the swap.

Rules (a pack never destroys what it did not write):

- **Owned names.** In ``OUT`` shardkit writes, and so deletes or replaces, only: ``manifest.json``,
  ``quarantine.jsonl``, ``splits/<split>.jsonl``, ``splits/<split>.index.npz``,
  ``shards/<split>-NNNNNN<suffix>`` (``<suffix>`` of a registered format: ``.tar``, ``.lmdb``,
  ``.h5``), their temporary names (``.<name>.<random>.tmp`` of :mod:`shardkit.storage.atomic`,
  ``shards/.<shard>.tmp`` and LMDB's ``.tmp.work`` of :class:`shardkit.formats.ShardSink`), the
  staging folder :data:`STAGING_NAME` and the lock file :data:`LOCK_NAME`; for ``wds`` datasets
  also the other readers' files of :mod:`shardkit.interop`: timm's ``shards/_info.json``, DALI's
  ``shards/<split>-NNNNNN.idx`` and the Hugging Face card ``README.md`` of ``shardkit export``,
  the latter only while it carries the card's marker line (a user's own ``README.md`` is never
  touched), and the swap journal :data:`~shardkit.dataset.swap.JOURNAL_NAME` of :mod:`shardkit.dataset.swap`.
  Every other entry, in
  ``OUT``, ``OUT/shards`` or ``OUT/splits`` (a user's ``splits/fold0.txt``), is left alone;
  ``shards/`` and ``splits/`` are removed only when nothing else is left in them. Whatever is
  removed is logged (INFO, ``shardkit.pack``) and listed in the summary.
- **Checked before the scan** (:meth:`PackOutput.open`, nothing is written): ``OUT`` is not a file,
  its nearest existing folder is writable, ``OUT`` is not inside the source and the source
  (folder or CSV) is not inside ``OUT``; a ``manifest.json`` needs ``overwrite``.
- **One packer per OUT.** The lock of :mod:`shardkit.dataset.swap` (:class:`~shardkit.dataset.swap.DatasetLock`,
  an exclusive ``fcntl.flock`` on ``OUT/.shardkit-pack.lock``) is held for the whole run (from
  the start when ``OUT`` exists, else from the moment the run creates it). The file holds the
  holder's command, pid, host and start time; a second packer fails at once with
  :class:`OutputLockedError` naming them (a ``stats`` or ``export`` holding it is waited for,
  up to :data:`~shardkit.dataset.swap.BRIEF_WAIT_S`). The file is removed when the run ends. A swap
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
  :meth:`PackOutput.commit` writes the swap journal (the commit point), then rolls forward: the
  old ``manifest.json`` and the old files the new dataset lacks are removed, the new files
  renamed into place, the new ``manifest.json`` last. A kill or a full disk before the journal
  leaves the old dataset untouched (the staging folder is removed on errors, or by the next run
  after a kill); after it, the next shardkit command that opens ``OUT`` finishes the swap, so it
  always finds one whole dataset, old or new, never a mix.

Disk-full errors (``ENOSPC``, ``EDQUOT``) while writing become :class:`DiskFullError`: one line
naming the file, after the run's files were removed.

A remote ``OUT`` (an fsspec URL, ``wds`` only; :func:`open_output`) follows the same rules by
name in :mod:`shardkit.packer.remote_output`, except that no lock is possible there and an overwrite
deletes the old ``manifest.json`` when writing starts instead of building beside it.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from pathlib import Path

from shardkit.dataset import swap
from shardkit.errors import ConfigError, DiskFullError, OutputExistsError
from shardkit.storage.atomic import fsync_dir
from shardkit.storage.urls import is_url
from shardkit.dataset.manifest import MANIFEST_NAME
from shardkit.dataset.swap import LOCK_NAME, STAGING_NAME, DatasetLock

__all__ = ["PackOutput", "open_output", "owned_entries",
           "owned_name", "LOCK_NAME", "STAGING_NAME", "QUARANTINE_NAME"]

logger = logging.getLogger("shardkit.pack")

QUARANTINE_NAME = "quarantine.jsonl"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_SPLIT = r"[A-Za-z0-9_]+"  # shardkit.packer.assign.SPLIT_NAME_RE


def _shard_suffixes() -> str:
    from shardkit.formats import FORMATS

    return "|".join(re.escape(m.suffix) for m in FORMATS.values())


def _owned_patterns() -> dict[str, re.Pattern]:
    """Folder (``""`` for OUT) -> regex of the names shardkit writes there.

    Besides the files of the module doc, the other readers' files of :mod:`shardkit.interop`
    (``wds`` datasets): the Hugging Face card ``README.md`` in OUT, timm's
    ``shards/_info.json`` and DALI's ``shards/<split>-NNNNNN.idx``, and their fsio temp names.
    """
    tmp = r"\..+\.tmp"  # fsio's mkstemp names: .<name>.<random>.tmp
    sfx = _shard_suffixes()
    top = rf"{re.escape(MANIFEST_NAME)}|{re.escape(QUARANTINE_NAME)}|README\.md"
    shard_meta = rf"_info\.json|{_SPLIT}-\d{{6}}\.idx"  # shardkit.interop: timm, DALI
    journal = re.escape(swap.JOURNAL_NAME)  # only its temporary name: the journal is the swap's
    return {
        "": re.compile(rf"(?:{top}|\.(?:{top}|{journal}){tmp})"),
        "splits": re.compile(rf"{_SPLIT}\.(?:jsonl|index\.npz)|"
                             rf"\.{_SPLIT}\.(?:jsonl|index\.npz){tmp}"),
        "shards": re.compile(rf"{_SPLIT}-\d{{6}}(?:{sfx})|"
                             rf"\.{_SPLIT}-\d{{6}}(?:{sfx})\.tmp(?:\.work(?:-lock)?)?|"
                             rf"(?:{shard_meta})|\.(?:{shard_meta}){tmp}"),
    }


_CARD_NAME = "README.md"


def _is_our_card(path: str) -> bool:
    """Whether ``path`` is the Hugging Face card shardkit wrote (its marker line is in the first
    64 KiB); an unreadable file counts as the user's."""
    from shardkit.interop.hf_card import CARD_MARKER

    try:
        with open(path, "rb") as f:
            return CARD_MARKER.encode() in f.read(1 << 16)
    except OSError:
        return False


def owned_entries(out: str | os.PathLike) -> list[str]:
    """The entries of ``out`` that a pack writes (see the module doc), as posix paths relative to
    ``out``: ``manifest.json`` first (deleting it first makes the folder visibly unfinished), the
    staging folder's parts (:func:`shardkit.dataset.swap.staging_parts`: ``.shardkit-new/``,
    ``shards/.shardkit-new/``, ``splits/.shardkit-new/``), then files in ``shards/``,
    ``splits/``, ``OUT``. The lock file and the swap journal are not listed, nor a ``README.md``
    without the marker of shardkit's card."""
    out = Path(out)
    patterns = _owned_patterns()
    found = []
    for folder, pattern in patterns.items():
        where = out / folder if folder else out
        if not where.is_dir():
            continue
        for entry in sorted(os.scandir(where), key=lambda e: e.name):
            if pattern.fullmatch(entry.name) and not entry.is_dir(follow_symlinks=False):
                if not folder and entry.name == _CARD_NAME and not _is_our_card(entry.path):
                    continue
                found.append(f"{folder}/{entry.name}" if folder else entry.name)
    found[:0] = swap.staging_parts(out)
    if MANIFEST_NAME in found:
        found.insert(0, found.pop(found.index(MANIFEST_NAME)))
    return found


def remove_owned(out: Path, entries: list[str], prune: bool = True) -> list[str]:
    """Deletes ``entries`` (from :func:`owned_entries`) and then, with ``prune``, ``shards/`` and
    ``splits/`` when empty; fsyncs ``out``; returns what was removed."""
    removed = []
    for rel in entries:
        p = out / rel.rstrip("/")
        try:
            if rel.endswith("/"):
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue
        removed.append(rel)
    for folder in ("shards", "splits") if prune else ():
        try:
            (out / folder).rmdir()
            removed.append(folder + "/")
        except OSError:  # absent, or holds the user's files: left alone
            pass
    if removed:
        fsync_dir(out)
    return removed


# ----------------------------------------------------------------------------- the run
def open_output(src: Path | str, out: Path | str, options) -> PackOutput:
    """The output side of a pack into ``out``: a local folder (:class:`PackOutput`) or a remote
    fsspec URL (:class:`shardkit.packer.remote_output.RemoteOutput`, ``wds`` only; its rules mirror
    the ones above, without the lock).

    Raises:
        ConfigError: a remote ``out`` for a format other than ``wds``.
    """
    if is_url(out):
        from shardkit.packer.remote_output import RemoteOutput

        return RemoteOutput(src, str(out), options)
    return PackOutput(src, Path(out), options.overwrite)


def owned_name(rel: str) -> bool:
    """Whether ``rel`` (a posix path relative to ``OUT``) has the name of a file a pack writes
    (the module doc's owned names, by name alone: the lock file and the staging folder are not
    included, and ``README.md`` matches whoever wrote it)."""
    folder, _, name = rel.rpartition("/")
    pattern = _owned_patterns().get(folder)
    return pattern is not None and pattern.fullmatch(name) is not None


class OutputRun:
    """The ``with`` protocol of a pack's output side (:class:`PackOutput`, and
    :class:`shardkit.packer.remote_output.RemoteOutput`): ``open()`` on entry; on an exception,
    ``rollback()`` then ``close()``, a full disk re-raised as ``_disk_full(exc)``."""

    def __enter__(self):
        return self.open()

    def __exit__(self, kind, exc, tb) -> None:
        full = (self._disk_full(exc) if isinstance(exc, OSError) and exc.errno in _DISK_FULL
                and not isinstance(exc, DiskFullError) else None)
        try:
            if exc is not None:
                self.rollback()
        finally:
            self.close()
        if full is not None:
            raise full from exc


class PackOutput(OutputRun):
    """The output side of one pack run; a context manager around the whole run.

    ``open()`` (``__enter__``) checks the rules before the scan and locks an existing ``OUT``;
    :meth:`prepare` (step 5) returns the folder to write into; :meth:`commit` (after
    ``manifest.json`` was written there) swaps a staged dataset into place; leaving the ``with``
    block with an exception deletes what the run wrote and turns a full disk into
    :class:`DiskFullError`; the lock is released in every case.

    Attributes:
        root: where the run writes (``OUT``, or ``OUT/.shardkit-new`` of
            :func:`shardkit.dataset.swap.make_staging`); None before prepare.
        cleaned: owned leftovers of unfinished runs removed (relative to ``OUT``): before
            writing, and (temporary names beside an old dataset) after the swap.
        replaced: files of the previous dataset overwritten or removed by the swap (overwrite).
        upload: None: shards stay where the sink writes them (a remote output's is a
            :class:`shardkit.packer.remote_output.ShardUpload`).
    """

    upload = None

    def __init__(self, src: Path | str, out: Path, overwrite: bool):
        # a remote source (an fsspec URL) can neither hold OUT nor lie inside it
        self.src = None if is_url(src) else Path(src)
        self.out, self.overwrite = Path(out), bool(overwrite)
        self.root: Path | None = None
        self.cleaned: list[str] = []
        self.replaced: list[str] = []
        self._lock = DatasetLock(self.out, "pack")
        self._created_out = False
        self._committed = False  # the swap journal is written: the new dataset is the dataset

    @property
    def staging(self) -> bool:
        """True when the run writes beside a finished dataset (overwrite)."""
        return self.root is not None and self.root != self.out

    # ------------------------------------------------------------------ before the scan
    def open(self) -> PackOutput:
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
        try:  # OUT exists and is locked before the long scan, so a second packer fails at once
            out.mkdir(parents=True)
            self._created_out = True
        except FileExistsError:
            pass
        try:
            self._lock_and_finish()
            self._check_finished()
        except BaseException:
            self.close()  # removes an OUT this run created
            raise
        return self

    def _lock_and_finish(self) -> None:
        """Takes the lock (a stats or export holding it is waited for, a pack is not), then
        finishes a swap that a killed overwrite left (:func:`shardkit.dataset.swap.roll_forward`)."""
        self._lock.acquire(swap.BRIEF_WAIT_S, wait_for_pack=False)
        if os.path.lexists(self.out / swap.JOURNAL_NAME):
            swap.roll_forward(self.out, resumed=True)

    def _check_finished(self) -> None:
        if (self.out / MANIFEST_NAME).exists() and not self.overwrite:
            self.close()
            raise OutputExistsError(f"{self.out} already holds a packed dataset "
                                    f"({MANIFEST_NAME}); pass --overwrite (overwrite=True) to "
                                    "replace it")

    # ------------------------------------------------------------------ step 5
    def prepare(self) -> Path:
        """Step 5: creates and locks ``OUT`` if needed, removes owned leftovers, and returns the
        folder to write the dataset into (``OUT``, or a fresh staging folder for overwrite)."""
        try:
            self.out.mkdir(parents=True)
            self._created_out = True
        except FileExistsError:
            pass
        if self._lock.fd is None:
            self._lock_and_finish()
        self._check_finished()  # a run that finished meanwhile, before we held the lock
        if (self.out / MANIFEST_NAME).exists():  # overwrite: build beside the old dataset
            self.cleaned += swap.remove_staging(self.out)  # an unfinished run's (no journal)
            self.root = swap.make_staging(self.out)
        else:
            self.cleaned += remove_owned(self.out, owned_entries(self.out), prune=False)
            self.root = self.out
        if self.cleaned:
            logger.info("removed from %s before writing (left by an unfinished run): %s",
                        self.out, ", ".join(self.cleaned))
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
            self._committed = True
            return
        out = self.out
        old = [e for e in owned_entries(out) if not e.endswith("/")]  # files, manifest first
        moves = [e for e in owned_entries(self.root)
                 if e != MANIFEST_NAME and not _hidden(e) and not e.endswith("/")]
        hidden = [e for e in old if _hidden(e)]  # not seen by readers: removed after the swap
        removes = [e for e in old if e not in moves and e != MANIFEST_NAME and not _hidden(e)]
        swap.write_journal(out, moves, removes)  # the commit point
        self._committed = True
        swap.roll_forward(out)
        self.cleaned += remove_owned(out, hidden, prune=False)
        self.replaced = [e for e in old if not _hidden(e)]  # each overwritten or removed
        logger.info("replaced the dataset in %s: %d file(s) of the old one overwritten or "
                    "removed", out, len(self.replaced))

    def rollback(self) -> list[str]:
        """Deletes what this run wrote (the staging folder, or the owned files of a fresh OUT,
        and OUT itself when the run created it and nothing else is in it). Nothing once the
        swap journal is written."""
        if self.root is None or self._committed:
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
        if self._created_out and not self._committed:
            try:
                self.out.rmdir()
            except OSError:
                pass

    def _disk_full(self, exc: OSError) -> DiskFullError:
        kept = ("the previous dataset in OUT is unchanged" if self.staging else
                "nothing was kept")
        return DiskFullError(exc.errno, f"no space left on device while writing "
                             f"{exc.filename or 'a file in ' + str(self.out)}; the files of this "
                             f"run were removed and {kept}: free some space there and rerun",
                             exc.filename)


def _hidden(rel: str) -> bool:
    return rel.rpartition("/")[2].startswith(".")


def _read_only_fs(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
