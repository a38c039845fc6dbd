"""What a source scan yields: :class:`SourceItem`, :class:`ScanResult`, and the naming rules
shared by every source kind (folder, CSV list, object-store prefix).
"""
from __future__ import annotations

import errno
import os
import stat
import unicodedata
from dataclasses import dataclass, field

from shardkit.errors import SourceError

__all__ = ["SourceItem", "ScanResult", "LIST_LIMIT", "nfc", "listing", "ignore_reason",
           "path_kind", "unreachable_reason", "check_unique"]

_SYSTEM_FILES = {"thumbs.db": "Windows thumbnail cache (Thumbs.db)",
                 "desktop.ini": "Windows folder settings (desktop.ini)",
                 "__macosx": "macOS archive metadata (__MACOSX)"}
LIST_LIMIT = 20


@dataclass(frozen=True, slots=True)
class SourceItem:
    """One sample candidate.

    Attributes:
        path: absolute on-disk path (as found on disk, not Unicode-normalised).
        relpath: path relative to the source root, posix separators, NFC-normalised.
        label: raw class name (folder name or CSV value), NFC-normalised and stripped.
        group: grouping key for the split, or None when no group rule was applied.
        split: the given split (split-first tree, split column), or None.
    """

    path: str
    relpath: str
    label: str
    group: str | None = None
    split: str | None = None


@dataclass
class ScanResult:
    """What a scan found.

    Attributes:
        items: sample candidates, sorted by relpath.
        ignored: (relpath, reason) of entries that are not samples, sorted by relpath.
        missing: candidates whose file does not exist (CSV rows, broken symlinks) or cannot be
            reached (symlink loops), sorted by relpath; the packer quarantines them with reason
            ``missing_reasons[relpath]``, else "file not found".
        missing_reasons: relpath -> quarantine reason of the ``missing`` entries that exist
            but cannot be reached (:func:`unreachable_reason`).
        root: absolute source root.
        kind: "folder" or "csv".
        layout: "class" or "split/class" (folders), "csv" (CSV lists).
        given_splits: given split folder names or split column values -> split names (in
            split order); empty when the source gives no splits.
        warnings: twin class spellings, split folders without classes, class folders named
            like splits (see :mod:`shardkit.sources.layouts`).
    """

    items: list[SourceItem]
    ignored: list[tuple[str, str]] = field(default_factory=list)
    missing: list[SourceItem] = field(default_factory=list)
    missing_reasons: dict[str, str] = field(default_factory=dict)
    root: str = ""
    kind: str = "folder"
    layout: str = "class"
    given_splits: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def nfc(s: str) -> str:
    return unicodedata.normalize("NFC", s)


def listing(names: list[str], limit: int = LIST_LIMIT) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" ... and {len(names) - limit} more" if len(names) > limit else ""
    return f"{len(names)}: {shown}{more}"


def ignore_reason(name: str) -> str | None:
    """Why a file or folder named ``name`` is never a sample or class, or None if it may be."""
    low = name.casefold()
    if low in _SYSTEM_FILES:
        return _SYSTEM_FILES[low]
    if name.startswith("._"):
        return "macOS resource fork (._*)"
    if name == ".ipynb_checkpoints":
        return "Jupyter checkpoint folder"
    if name.startswith("."):
        return "hidden entry (dot-name)"
    return None


def path_kind(path: str) -> str:
    """'file', 'dir', 'broken' (dangling link), 'unreachable' (a symlink loop, a folder on the
    way that cannot be searched: see :func:`unreachable_reason`) or 'other', following
    symlinks."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "broken"
    except OSError:  # ELOOP, EACCES, ENAMETOOLONG...: this entry cannot be used, the scan goes on
        return "unreachable"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "other"


_MAX_LINK_HOPS = 40  # Linux's own limit on symlinks followed in one path lookup


def unreachable_reason(path: str) -> str:
    """The quarantine reason of a path that exists as a directory entry but cannot be opened:
    ``"symlink loop: a.jpg -> b.jpg -> a.jpg"`` (each link's target as written, up to the first
    repeat), ``"symlink chain longer than 40 links: ..."``, or ``"unreachable: <strerror>"``
    (a folder on the way that cannot be searched, a name too long). Reads links only."""
    try:
        os.stat(path)
        return "unreachable when the source was scanned"  # it changed since
    except FileNotFoundError:
        return "file not found"
    except OSError as e:
        if e.errno != errno.ELOOP:
            return f"unreachable: {e.strerror or e}"
    chain, seen, cur = [os.path.basename(path)], {os.path.abspath(path)}, path
    while os.path.islink(cur) and len(chain) <= _MAX_LINK_HOPS:
        try:
            target = os.readlink(cur)
        except OSError:
            break
        chain.append(target)
        cur = os.path.abspath(os.path.join(os.path.dirname(cur), target))
        if cur in seen:
            return "symlink loop: " + " -> ".join(chain)
        seen.add(cur)
    if len(chain) > _MAX_LINK_HOPS:
        return (f"symlink chain longer than {_MAX_LINK_HOPS} links: "
                + " -> ".join(chain[:4]) + " -> ...")
    return "symlink loop in the path to it (Too many levels of symbolic links)"



def check_unique(items: list[SourceItem], where: str) -> None:
    """Raises SourceError listing the relative paths several items share (after NFC)."""
    seen: dict[str, int] = {}
    for item in items:
        seen[item.relpath] = seen.get(item.relpath, 0) + 1
    dups = sorted(r for r, n in seen.items() if n > 1)
    if dups:
        raise SourceError(f"{where}: several entries share one relative path after Unicode NFC "
                          f"normalisation (rename them or remove duplicates), "
                          f"{listing(dups)}")


