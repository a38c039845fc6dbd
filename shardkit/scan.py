"""Source discovery: which files are samples, with which label and group.

Two kinds of source:

* **Folder** (:func:`scan_folder`), the torchvision ImageFolder layout ``root/<class>/.../<file>``.
  Each folder directly under ``root`` is a class; files in nested subfolders belong to that class.
  Every other regular file inside a class folder is a sample candidate, whatever its name or
  extension: a non-image is not dropped here but quarantined later by the packer ("not an
  image"). Never samples or classes, at any depth, and listed in ``ScanResult.ignored`` with the
  reason: dot-files and dot-folders (``.DS_Store``, ``.ipynb_checkpoints``, ...), ``__MACOSX``
  folders, ``._*`` AppleDouble resource forks, ``Thumbs.db``, ``desktop.ini`` (case-insensitive),
  files lying directly in ``root`` (``LICENSE.txt``, ``metadata.csv``) and empty class folders.
  A hidden folder is listed once and not entered.
* **CSV list** (:func:`scan_csv`) with a header and columns ``path,label[,group]``.

Names are taken as they come from the wild (spaces, several dots, upper-case extensions) and
normalised to Unicode NFC in ``relpath`` and ``label`` (a class folder written in NFD by macOS
and one written in NFC are the same class); ``path`` stays the real on-disk path. Two files whose
relative paths become equal after NFC normalisation raise :class:`SourceError`.

Symbolic links are followed: a link to a file is a sample (its ``path`` is the link; reading it
yields the target's bytes); a link to a folder is entered unless it points back into a folder
being walked (a loop, listed in ``ignored``). A broken link is reported in ``ScanResult.missing``
like a missing CSV row, so the packer quarantines it with "file not found".

Group rules attach a grouping key (photographer, video, subject) used by the splitter:
:func:`apply_group_regex` (from the relative path) and :func:`apply_group_metadata` (from a
column of a metadata CSV joined on the NFC relative path). An item that gets no group is an
error, never silently put in a group of its own.

Results are sorted by ``relpath`` (code point order), so scans are deterministic.
"""
from __future__ import annotations

import csv
import dataclasses
import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from shardkit.errors import ConfigError, SourceError

__all__ = ["SourceItem", "ScanResult", "scan_folder", "scan_csv", "compile_group_regex",
           "apply_group_regex", "apply_group_metadata", "match_group_regex",
           "match_group_metadata", "unmatched_regex_error", "lacking_metadata_error",
           "ignore_reason"]

_SYSTEM_FILES = {"thumbs.db": "Windows thumbnail cache (Thumbs.db)",
                 "desktop.ini": "Windows folder settings (desktop.ini)",
                 "__macosx": "macOS archive metadata (__MACOSX)"}
_LIST_LIMIT = 20


@dataclass(frozen=True)
class SourceItem:
    """One sample candidate.

    Attributes:
        path: absolute on-disk path (as found on disk, not Unicode-normalised).
        relpath: path relative to the source root, posix separators, NFC-normalised.
        label: raw class name (folder name or CSV value), NFC-normalised and stripped.
        group: grouping key for the split, or None when no group rule was applied.
    """

    path: str
    relpath: str
    label: str
    group: str | None = None


@dataclass
class ScanResult:
    """What a scan found.

    Attributes:
        items: sample candidates, sorted by relpath.
        ignored: (relpath, reason) of entries that are not samples, sorted by relpath.
        missing: candidates whose file does not exist (CSV rows, broken symlinks), sorted by
            relpath; the packer quarantines them with reason "file not found".
        root: absolute source root.
        kind: "folder" or "csv".
    """

    items: list[SourceItem]
    ignored: list[tuple[str, str]] = field(default_factory=list)
    missing: list[SourceItem] = field(default_factory=list)
    root: str = ""
    kind: str = "folder"


def _nfc(s: str) -> str:
    return unicodedata.normalize("NFC", s)


def _listing(names: list[str], limit: int = _LIST_LIMIT) -> str:
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


def _kind(path: str) -> str:
    """'file', 'dir', 'broken' (dangling link) or 'other', following symlinks."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "broken"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "other"


def _entries(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise SourceError(f"cannot list folder {folder!r}: {e}") from e


def _walk_class(folder: str, rel: str, label: str, stack: set[str], out: ScanResult) -> None:
    stack = stack | {os.path.realpath(folder)}
    for entry in _entries(folder):
        relpath = _nfc(f"{rel}/{entry.name}")
        reason = ignore_reason(entry.name)
        kind = _kind(entry.path)
        if reason is not None:
            out.ignored.append((relpath, reason))
        elif kind == "file":
            out.items.append(SourceItem(os.path.abspath(entry.path), relpath, label))
        elif kind == "dir":
            if os.path.realpath(entry.path) in stack:
                out.ignored.append((relpath, "symlink loop (points to a folder being walked)"))
            else:
                _walk_class(entry.path, relpath, label, stack, out)
        elif kind == "broken":
            out.missing.append(SourceItem(os.path.abspath(entry.path), relpath, label))
        else:
            out.ignored.append((relpath, "not a regular file (device, socket or pipe)"))


def _check_unique(items: list[SourceItem], where: str) -> None:
    seen: dict[str, int] = {}
    for item in items:
        seen[item.relpath] = seen.get(item.relpath, 0) + 1
    dups = sorted(r for r, n in seen.items() if n > 1)
    if dups:
        raise SourceError(f"{where}: several entries share one relative path after Unicode NFC "
                          f"normalisation (rename them or remove duplicates), "
                          f"{_listing(dups)}")


def scan_folder(root: str | os.PathLike) -> ScanResult:
    """Scan an ImageFolder tree ``root/<class>/.../<file>`` (rules in the module docstring).

    Returns:
        ScanResult with kind "folder"; ``group`` of every item is None.

    Raises:
        SourceError: ``root`` is missing or not a folder, holds no class folder or no file in
            any class folder, a folder cannot be listed, or two files collide after NFC
            normalisation of their relative paths. The message names the root.
    """
    root_s = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root_s):
        raise SourceError(f"source folder {root_s!r} does not exist or is not a folder")
    out = ScanResult(items=[], root=root_s, kind="folder")
    classes = 0
    for entry in _entries(root_s):
        relname = _nfc(entry.name)
        reason = ignore_reason(entry.name)
        kind = _kind(entry.path)
        if reason is not None:
            out.ignored.append((relname, reason))
        elif kind == "dir":
            if not relname.strip():
                raise SourceError(f"class folder {entry.path!r} has a blank name; rename it")
            before = len(out.items) + len(out.missing)
            _walk_class(entry.path, relname, relname.strip(), {root_s}, out)
            if len(out.items) + len(out.missing) == before:
                out.ignored.append((relname, "empty class folder (no files)"))
            else:
                classes += 1
        elif kind == "file":
            out.ignored.append((relname, "file beside the class folders (not a sample)"))
        elif kind == "broken":
            out.ignored.append((relname, "broken symlink beside the class folders"))
        else:
            out.ignored.append((relname, "not a regular file (device, socket or pipe)"))
    if classes == 0:
        raise SourceError(f"source folder {root_s!r} has no class folder with files (expected "
                          f"root/<class>/<image>; ignored entries: "
                          f"{_listing([r for r, _ in out.ignored]) if out.ignored else 'none'})")
    out.items.sort(key=lambda i: i.relpath)
    out.missing.sort(key=lambda i: i.relpath)
    out.ignored.sort()
    _check_unique(out.items + out.missing, f"source folder {root_s!r}")
    return out


def _read_csv(csv_path: str) -> tuple[list[str], list[dict[str, str]]]:
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = [h.strip() for h in (reader.fieldnames or [])]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SourceError(f"cannot read CSV {csv_path!r}: {e}") from e
    rows = [{(k or "").strip(): (v or "") for k, v in r.items()} for r in rows]
    return header, rows


def _disk_path(base: str, raw: str) -> str:
    """Join; if absent as written, try Windows separators as "/" and the NFC/NFD spellings."""
    joined = os.path.abspath(os.path.join(base, raw))
    primary = joined
    if "\\" in raw and os.sep == "/":
        primary = os.path.abspath(os.path.join(base, raw.replace("\\", "/")))
    candidates = [joined, primary] + [unicodedata.normalize(form, p) for p in (joined, primary)
                                      for form in ("NFC", "NFD")]
    return next((p for p in candidates if os.path.lexists(p)), primary)


def _rel(base: str, path: str) -> str:
    rel = os.path.relpath(path, base)
    if rel == ".." or rel.startswith(".." + os.sep):
        rel = path  # outside the root: keep the absolute path
    return _nfc(PurePosixPath(*Path(rel).parts).as_posix())


def scan_csv(csv_path: str | os.PathLike, root: str | os.PathLike | None = None) -> ScanResult:
    """Read a CSV list with a header and columns ``path,label[,group]`` (extra columns ignored).

    Relative paths resolve against ``root``, or the CSV's folder when ``root`` is None; absolute
    paths are used as they are. A path absent as written is also tried with Windows "\\"
    separators read as "/" and in its NFC and NFD spellings. A row whose file does not exist is not dropped: it goes to
    ``ScanResult.missing`` (the packer quarantines it with "file not found"). An empty ``group``
    cell gives ``group=None``.

    Raises:
        SourceError: the CSV cannot be read, lacks a ``path`` or ``label`` column, has no rows,
            has rows with an empty path or label, lists one file twice, or lists a folder.
    """
    csv_s = os.path.abspath(os.fspath(csv_path))
    base = os.path.abspath(os.fspath(root)) if root is not None else os.path.dirname(csv_s)
    header, rows = _read_csv(csv_s)
    lacking = [c for c in ("path", "label") if c not in header]
    if lacking:
        raise SourceError(f"CSV {csv_s!r} lacks column(s) {lacking}: a header with path,label"
                          f"[,group] is required; found columns {header}")
    if not rows:
        raise SourceError(f"CSV {csv_s!r} has a header but no rows")
    out = ScanResult(items=[], root=base, kind="csv")
    empty, folders = [], []
    for n, row in enumerate(rows, start=2):
        raw, label = row["path"].strip(), _nfc(row["label"]).strip()
        if not raw or not label:
            empty.append(f"line {n}")
            continue
        path = _disk_path(base, raw)
        group = _nfc(row.get("group", "")).strip() or None
        item = SourceItem(path, _rel(base, path), label, group)
        kind = _kind(path)
        if kind == "dir":
            folders.append(raw)
        elif kind == "broken":
            out.missing.append(item)
        elif kind == "other":
            out.ignored.append((item.relpath, "not a regular file (device, socket or pipe)"))
        else:
            out.items.append(item)
    if empty:
        raise SourceError(f"CSV {csv_s!r}: rows with an empty path or label, {_listing(empty)}")
    if folders:
        raise SourceError(f"CSV {csv_s!r}: paths that are folders, not files, {_listing(folders)}")
    out.items.sort(key=lambda i: i.relpath)
    out.missing.sort(key=lambda i: i.relpath)
    _check_unique(out.items + out.missing, f"CSV {csv_s!r}")
    return out


def compile_group_regex(regex: str) -> tuple[re.Pattern, int | str]:
    """Compiles a group regex; returns ``(pattern, which)``, ``which`` being the capture group
    that holds the group value: ``"group"`` if the pattern names one, else ``1``.

    Raises:
        ConfigError: the pattern does not compile or has no capture group.
    """
    try:
        pattern = re.compile(regex)
    except (re.error, TypeError) as e:
        raise ConfigError(f"group regex {regex!r} does not compile: {e}") from e
    if "group" in pattern.groupindex:
        return pattern, "group"
    if pattern.groups >= 1:
        return pattern, 1
    raise ConfigError(f"group regex {regex!r} has no capture group; expected a named group "
                      f"(?P<group>...) or a first group (...)")


def match_group_regex(items: list[SourceItem], regex: str
                      ) -> tuple[list[SourceItem], list[SourceItem]]:
    """Like :func:`apply_group_regex`, but returns ``(grouped, unmatched)`` instead of raising
    for items the pattern gives no group (the packer first checks whether those are images at all).

    Raises:
        ConfigError: the pattern does not compile or has no capture group.
    """
    pattern, which = compile_group_regex(regex)
    out, unmatched = [], []
    for item in items:
        m = pattern.search(item.relpath)
        value = m.group(which) if m else None
        if not value:
            unmatched.append(item)
            continue
        out.append(dataclasses.replace(item, group=value))
    return out, unmatched


def unmatched_regex_error(regex: str, relpaths: list[str]) -> SourceError:
    """The error for relpaths that ``regex`` gives no group (first 20 listed, with the count)."""
    return SourceError(f"group regex {regex!r} gives no group for {_listing(relpaths)} path(s)")


def apply_group_regex(items: list[SourceItem], regex: str) -> list[SourceItem]:
    """Set each item's group from ``re.search(regex, relpath)``.

    The group value is the named group ``group`` if the pattern has one, else the first capture
    group; e.g. ``r"/(?P<group>[^/_]+)_\\d+\\.jpg$"`` groups ``a/subjA_0001.jpg`` as "subjA".

    Returns:
        new items (same order) with ``group`` set.

    Raises:
        ConfigError: the pattern does not compile or has no capture group.
        SourceError: relpaths that do not match, or match with an empty group (first 20 listed,
            with the count).
    """
    out, unmatched = match_group_regex(items, regex)
    if unmatched:
        raise unmatched_regex_error(regex, [i.relpath for i in unmatched])
    return out


def match_group_metadata(items: list[SourceItem], csv_path: str | os.PathLike, column: str,
                         path_column: str = "path") -> tuple[list[SourceItem], list[SourceItem]]:
    """Like :func:`apply_group_metadata`, but returns ``(grouped, lacking)`` instead of raising
    for items without a row or with an empty group value.

    Raises:
        ConfigError: ``column`` or ``path_column`` is not a column (message lists the columns).
        SourceError: the CSV cannot be read; one path has two different groups.
    """
    csv_s = os.path.abspath(os.fspath(csv_path))
    header, rows = _read_csv(csv_s)
    for col in (path_column, column):
        if col not in header:
            raise ConfigError(f"metadata CSV {csv_s!r} has no column {col!r}; columns: {header}")
    groups: dict[str, str] = {}
    conflicts = []
    for row in rows:
        key = _nfc(row[path_column].strip().replace("\\", "/"))
        value = _nfc(row[column]).strip()
        if key in groups and groups[key] != value:
            conflicts.append(key)
        groups[key] = value
    if conflicts:
        raise SourceError(f"metadata CSV {csv_s!r} gives several {column!r} values to "
                          f"{_listing(sorted(set(conflicts)))} path(s)")
    out, lacking = [], []
    for item in items:
        value = groups.get(item.relpath)
        if not value:
            lacking.append(item)
            continue
        out.append(dataclasses.replace(item, group=value))
    return out, lacking


def lacking_metadata_error(csv_path: str | os.PathLike, column: str,
                           relpaths: list[str]) -> SourceError:
    """The error for relpaths without a metadata row or group value (first 20 listed)."""
    csv_s = os.path.abspath(os.fspath(csv_path))
    return SourceError(f"metadata CSV {csv_s!r} has no row or an empty {column!r} for "
                       f"{_listing(relpaths)} file(s)")


def apply_group_metadata(items: list[SourceItem], csv_path: str | os.PathLike, column: str,
                         path_column: str = "path") -> list[SourceItem]:
    """Set each item's group from ``column`` of a metadata CSV, joined on the NFC relpath.

    The CSV's ``path_column`` holds paths relative to the source root (posix or Windows
    separators, any Unicode form). Rows for files that are not items are fine.

    Returns:
        new items (same order) with ``group`` set.

    Raises:
        ConfigError: ``column`` or ``path_column`` is not a column (message lists the columns).
        SourceError: the CSV cannot be read; one path has two different groups; items without a
            row or with an empty group value (first 20 listed, with the count).
    """
    out, lacking = match_group_metadata(items, csv_path, column, path_column)
    if lacking:
        raise lacking_metadata_error(csv_path, column, [i.relpath for i in lacking])
    return out
