"""The names a pack owns in ``OUT``, and the error of a full disk: the bottom of the outputs.

**Owned names.** In ``OUT`` shardkit writes, and so deletes or replaces, only: ``manifest.json``,
``quarantine.jsonl``, ``splits/<split>.jsonl``, ``splits/<split>.index.npz``,
``shards/<split>-NNNNNN<suffix>`` (``<suffix>`` of a registered format: ``.tar``, ``.lmdb``,
``.h5``), their temporary names (``.<name>.<random>.tmp`` of :mod:`shardkit.storage.atomic`,
``shards/.<shard>.tmp`` and LMDB's ``.tmp.work`` of :class:`shardkit.formats.ShardSink`), the
staging folder :data:`STAGING_NAME` and the lock file :data:`LOCK_NAME`; for ``wds`` datasets
also the other readers' files of :mod:`shardkit.interop`: timm's ``shards/_info.json``, DALI's
``shards/<split>-NNNNNN.idx`` and the Hugging Face card ``README.md`` of ``shardkit export``,
the latter only while it carries the card's marker line (a user's own ``README.md`` is never
touched), and the swap journal :data:`~shardkit.dataset.swap.JOURNAL_NAME` of
:mod:`shardkit.dataset.swap`. Every other entry, in ``OUT``, ``OUT/shards`` or ``OUT/splits``
(a user's ``splits/fold0.txt``), is left alone; ``shards/`` and ``splits/`` are removed only
when nothing else is left in them. Whatever is removed is logged (INFO, ``shardkit.pack``) and
listed in the summary.

:func:`owned_name` is the rule by name alone (for a local folder and an object-store prefix
alike); :func:`owned_entries` and :func:`remove_owned` apply it to a local folder.

This module imports only the dataset layer (:mod:`shardkit.dataset`), the interop card's names
and the format registry's suffixes; every other module of :mod:`shardkit.packer.outputs` sits
above it.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from shardkit.dataset import swap
from shardkit.dataset.manifest import MANIFEST_NAME
from shardkit.dataset.swap import LOCK_NAME, STAGING_NAME
from shardkit.errors import DiskFullError
from shardkit.formats import FORMATS
from shardkit.interop.hf_card import CARD_MARKER, CARD_NAME
from shardkit.storage.atomic import fsync_dir

__all__ = ["DiskFullError", "DISK_FULL_ERRNOS", "owned_name", "owned_entries", "remove_owned",
           "is_hidden", "is_our_card_head", "manifest_first", "MANIFEST_NAME", "QUARANTINE_NAME",
           "LOCK_NAME", "STAGING_NAME", "CARD_NAME"]

QUARANTINE_NAME = "quarantine.jsonl"
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""The ``errno`` values of a full disk (or quota) that become :class:`DiskFullError`."""
_SPLIT = r"[A-Za-z0-9_]+"  # shardkit.packer.assign.SPLIT_NAME_RE
_CARD_HEAD = 1 << 16  # the card's marker line is in its first 64 KiB


def _owned_patterns() -> dict[str, re.Pattern]:
    """Folder (``""`` for OUT) -> regex of the names shardkit writes there.

    Besides the files of the module doc, the other readers' files of :mod:`shardkit.interop`
    (``wds`` datasets): the Hugging Face card ``README.md`` in OUT, timm's
    ``shards/_info.json`` and DALI's ``shards/<split>-NNNNNN.idx``, and their fsio temp names.
    """
    tmp = r"\..+\.tmp"  # fsio's mkstemp names: .<name>.<random>.tmp
    sfx = "|".join(re.escape(m.suffix) for m in FORMATS.values())
    top = rf"{re.escape(MANIFEST_NAME)}|{re.escape(QUARANTINE_NAME)}|{re.escape(CARD_NAME)}"
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


def owned_name(rel: str) -> bool:
    """Whether ``rel`` (a posix path relative to ``OUT``) has the name of a file a pack writes
    (the module doc's owned names, by name alone: the lock file and the staging folder are not
    included, and ``README.md`` matches whoever wrote it: see :func:`is_our_card_head`)."""
    folder, _, name = rel.rpartition("/")
    pattern = _owned_patterns().get(folder)
    return pattern is not None and pattern.fullmatch(name) is not None


def is_our_card_head(head: bytes) -> bool:
    """Whether ``head``, the first bytes (up to 64 KiB) of a ``README.md`` in ``OUT``, holds the
    marker line of the Hugging Face card shardkit writes (else the file is the user's)."""
    return CARD_MARKER.encode() in head[:_CARD_HEAD]


def _is_our_card(path: str) -> bool:
    """:func:`is_our_card_head` of a local file; an unreadable file counts as the user's."""
    try:
        with open(path, "rb") as f:
            return is_our_card_head(f.read(_CARD_HEAD))
    except OSError:
        return False


def owned_entries(out: str | os.PathLike) -> list[str]:
    """The entries of the local folder ``out`` that a pack writes (see the module doc), as posix
    paths relative to ``out``: ``manifest.json`` first (deleting it first makes the folder
    visibly unfinished), the staging folder's parts (:func:`shardkit.dataset.swap.staging_parts`:
    ``.shardkit-new/``, ``shards/.shardkit-new/``, ``splits/.shardkit-new/``), then files in
    ``OUT``, ``splits/``, ``shards/``, each folder's sorted by name. The lock file and the swap journal are not listed, nor a
    ``README.md`` without the marker of shardkit's card."""
    out = Path(out)
    found = []
    for folder, pattern in _owned_patterns().items():
        where = out / folder if folder else out
        if not where.is_dir():
            continue
        for entry in sorted(os.scandir(where), key=lambda e: e.name):
            if pattern.fullmatch(entry.name) and not entry.is_dir(follow_symlinks=False):
                if not folder and entry.name == CARD_NAME and not _is_our_card(entry.path):
                    continue
                found.append(f"{folder}/{entry.name}" if folder else entry.name)
    found[:0] = swap.staging_parts(out)
    return manifest_first(found)


def manifest_first(entries: list[str]) -> list[str]:
    """``entries`` with ``manifest.json`` (if there) moved to the front, in place; returned."""
    if MANIFEST_NAME in entries:
        entries.insert(0, entries.pop(entries.index(MANIFEST_NAME)))
    return entries


def remove_owned(out: Path, entries: list[str], prune: bool = True) -> list[str]:
    """Deletes ``entries`` (from :func:`owned_entries`) of the local folder ``out`` and then, with
    ``prune``, ``shards/`` and ``splits/`` when empty; fsyncs ``out``; returns what was
    removed (an entry already gone is not listed)."""
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


def is_hidden(rel: str) -> bool:
    """Whether the last part of ``rel`` starts with ``.`` (a temporary name: no reader sees it)."""
    return rel.rpartition("/")[2].startswith(".")
