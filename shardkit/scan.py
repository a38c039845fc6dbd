"""Source discovery: which files are samples, with which label and group.

Three kinds of source:

* **Folder** (:func:`scan_folder`), the torchvision ImageFolder layout ``root/<class>/.../<file>``.
  Each folder directly under ``root`` is a class; files in nested subfolders belong to that class.
  Every other regular file inside a class folder is a sample candidate, whatever its name or
  extension: a non-image is not dropped here but quarantined later by the packer ("not an
  image"). Never samples or classes, at any depth, and listed in ``ScanResult.ignored`` with the
  reason: dot-files and dot-folders (``.DS_Store``, ``.ipynb_checkpoints``, ...), ``__MACOSX``
  folders, ``._*`` AppleDouble resource forks, ``Thumbs.db``, ``desktop.ini`` (case-insensitive),
  files lying directly in ``root`` (``LICENSE.txt``, ``metadata.csv``) and empty class folders.
  A hidden folder is listed once and not entered.
* **Split-first folder** (:func:`scan_folder` with ``layout="split/class"``, or detected with
  ``layout="auto"``): ``root/<split>/<class>/.../<file>``; each item carries its given ``split``
  and ``ScanResult.given_splits`` maps the split folders to split names. Detection, split names,
  the error for a two-level tree that is not split-first and the class order:
  :mod:`shardkit.layout`. Files beside the class folders of a split are ignored (listed); a split
  folder without class folders is ignored with a warning (an unlabelled test set).
* **CSV list** (:func:`scan_csv`) with a header and columns ``path,label[,group]`` (and a given
  split column with ``split_column``).

The CSV functions (:func:`scan_csv`, the metadata joins) live in :mod:`shardkit.csvlist` and are
re-exported here on first use.

Names are taken as they come from the wild (spaces, several dots, upper-case extensions) and
normalised to Unicode NFC in ``relpath`` and ``label`` (a class folder written in NFD by macOS
and one written in NFC are the same class, with a warning naming both spellings in
``ScanResult.warnings``); ``path`` stays the real on-disk path. Two files whose relative paths
become equal after NFC normalisation raise :class:`SourceError`.

Symbolic links are followed: a link to a file is a sample (its ``path`` is the link; reading it
yields the target's bytes); a link to a folder is entered unless it points back into a folder
being walked (a loop, listed in ``ignored``). A broken link is reported in ``ScanResult.missing``
like a missing CSV row, so the packer quarantines it with "file not found". A file link that can
never be followed - a loop of links (``a.jpg -> b.jpg -> a.jpg``, ``ELOOP``) or a path through a
folder that cannot be searched - is in ``missing`` too, with its reason in
``ScanResult.missing_reasons`` (``"symlink loop: a.jpg -> b.jpg -> a.jpg"``, from
:func:`unreachable_reason`), and quarantined with that reason: one such link never stops a scan.

Group rules attach a grouping key (photographer, video, subject) used by the splitter:
:func:`apply_group_regex` (from the relative path) and :func:`apply_group_metadata` (from a
column of a metadata CSV joined on the NFC relative path). An item that gets no group is an
error, never silently put in a group of its own. :func:`match_split_metadata` reads a given split
from a metadata column the same way.

Results are sorted by ``relpath`` (code point order), so scans are deterministic.

The folder rules run over a small listing interface (:func:`scan_tree`, local folders through
:class:`_LocalTree`); :mod:`shardkit.scan_remote` runs the same rules over the one listing of an
object-store prefix (``s3://bucket/flowers``).
"""
from __future__ import annotations

import collections
import dataclasses
import errno
import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field

from shardkit import layout as layout_mod
from shardkit.errors import ConfigError, SourceError

__all__ = ["SourceItem", "ScanResult", "scan_folder", "scan_tree", "scan_csv",
           "compile_group_regex",
           "apply_group_regex", "apply_group_metadata", "match_group_regex",
           "match_group_metadata", "match_split_metadata", "unmatched_regex_error",
           "lacking_metadata_error", "ignore_reason", "unreachable_reason"]

_SYSTEM_FILES = {"thumbs.db": "Windows thumbnail cache (Thumbs.db)",
                 "desktop.ini": "Windows folder settings (desktop.ini)",
                 "__macosx": "macOS archive metadata (__MACOSX)"}
_LIST_LIMIT = 20


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
            like splits (see :mod:`shardkit.layout`).
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


class _LocalTree:
    """The listing interface the folder walk runs over, for a local folder: ``os.scandir`` and
    :func:`_kind`, symbolic links followed (a loop is found by realpath). A handle is a path.

    :mod:`shardkit.scan_remote` gives the same interface over an object-store listing (handles
    are its in-memory folders and objects): ``entries`` (sorted ``(name, handle)``; SourceError
    when a folder cannot be listed), ``kind``, ``path`` (the item's path), ``ident`` (the loop
    check's key), ``raw_rel`` (the relative path as spelled) and ``other_reason``.
    """

    def __init__(self, root: str):
        self.root = root

    def entries(self, folder: str) -> list[tuple[str, str]]:
        try:
            with os.scandir(folder) as it:
                return [(e.name, e.path) for e in sorted(it, key=lambda e: e.name)]
        except OSError as e:
            raise SourceError(f"cannot list folder {folder!r}: {e}") from e

    kind = staticmethod(_kind)
    path = staticmethod(os.path.abspath)
    ident = staticmethod(os.path.realpath)

    def raw_rel(self, handle: str) -> str:
        return os.path.relpath(handle, self.root).replace(os.sep, "/")

    @staticmethod
    def other_reason(handle: str) -> str:
        return "not a regular file (device, socket or pipe)"


def _walk_class(tree, folder, rel: str, label: str, stack: set[str], out: ScanResult,
                split: str | None = None) -> None:
    stack = stack | {tree.ident(folder)}
    for name, handle in tree.entries(folder):
        relpath = _nfc(f"{rel}/{name}")
        reason = ignore_reason(name)
        kind = tree.kind(handle)
        if reason is not None:
            out.ignored.append((relpath, reason))
        elif kind == "file":
            out.items.append(SourceItem(tree.path(handle), relpath, label, None, split))
        elif kind == "dir":
            if tree.ident(handle) in stack:
                out.ignored.append((relpath, "symlink loop (points to a folder being walked)"))
            else:
                _walk_class(tree, handle, relpath, label, stack, out, split)
        elif kind == "broken":
            out.missing.append(SourceItem(tree.path(handle), relpath, label, None, split))
        elif kind == "unreachable":  # only local trees: a symlink loop, say
            out.missing.append(SourceItem(tree.path(handle), relpath, label, None, split))
            out.missing_reasons[relpath] = unreachable_reason(handle)
        else:
            out.ignored.append((relpath, tree.other_reason(handle)))


def _check_unique(items: list[SourceItem], where: str) -> None:
    seen: dict[str, int] = {}
    for item in items:
        seen[item.relpath] = seen.get(item.relpath, 0) + 1
    dups = sorted(r for r, n in seen.items() if n > 1)
    if dups:
        raise SourceError(f"{where}: several entries share one relative path after Unicode NFC "
                          f"normalisation (rename them or remove duplicates), "
                          f"{_listing(dups)}")


def _top_entries(tree, folder, rel: str, beside: str, out: ScanResult) -> list[tuple]:
    """The folders in ``folder`` as ``(name, handle, NFC relpath)``; every other entry goes to
    ``out.ignored`` (files with the reason "file beside ``beside`` (not a sample)")."""
    dirs = []
    for name, handle in tree.entries(folder):
        relname = _nfc(f"{rel}{name}")
        reason = ignore_reason(name)
        kind = tree.kind(handle)
        if reason is not None:
            out.ignored.append((relname, reason))
        elif kind == "dir":
            dirs.append((name, handle, relname))
        elif kind == "file":
            out.ignored.append((relname, f"file beside {beside} (not a sample)"))
        elif kind == "broken":
            out.ignored.append((relname, f"broken symlink beside {beside}"))
        elif kind == "unreachable":
            out.ignored.append((relname, f"{unreachable_reason(handle)}, beside {beside}"))
        else:
            out.ignored.append((relname, tree.other_reason(handle)))
    return dirs


def _walk_classes(tree, dirs, out: ScanResult, spellings: dict, split: str | None = None) -> int:
    """Walks class folders ``dirs`` (from :func:`_top_entries`); returns how many hold files.
    Records each class's folder spellings in ``spellings`` (label -> {raw name: relpath})."""
    classes = 0
    for name, handle, relname in dirs:
        label = _nfc(name).strip()
        if not label:
            raise SourceError(f"class folder {tree.path(handle)!r} has a blank name; rename it")
        before = len(out.items) + len(out.missing)
        _walk_class(tree, handle, relname, label, {tree.root}, out, split)
        if len(out.items) + len(out.missing) == before:
            out.ignored.append((relname, "empty class folder (no files)"))
        else:
            classes += 1
            spellings.setdefault(label, {}).setdefault(name, tree.raw_rel(handle))
    return classes


def _has_subfolder(tree, folder) -> bool:
    try:
        return any(ignore_reason(name) is None and tree.kind(handle) == "dir"
                   for name, handle in tree.entries(folder))
    except (OSError, SourceError):
        return False


def scan_folder(root: str | os.PathLike, layout: str = "auto") -> ScanResult:
    """Scan a folder tree: ``root/<class>/.../<file>`` or ``root/<split>/<class>/.../<file>``
    (rules in the module docstring and :mod:`shardkit.layout`).

    Args:
        root: the source folder.
        layout: ``"auto"`` (detect a split-first tree), ``"class"`` or ``"split/class"``.

    Returns:
        ScanResult with kind "folder", ``layout`` the layout used; ``group`` of every item is
        None; ``split`` is the given split in a split-first tree, else None.

    Raises:
        ConfigError: ``layout`` is not one of :data:`shardkit.layout.LAYOUTS`.
        SourceError: ``root`` is missing or not a folder, holds no class folder or no file in
            any class folder, a folder cannot be listed, two files collide after NFC
            normalisation of their relative paths, a split folder name is not a valid split
            name or two give one split; with ``"auto"``, every top folder holds only
            sub-folders and the tree is not split-first. The message names the root.
    """
    check_layout(layout)
    root_s = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root_s):
        raise SourceError(f"source folder {root_s!r} does not exist or is not a folder")
    return scan_tree(_LocalTree(root_s), root_s, layout, f"source folder {root_s!r}")


def check_layout(layout: str) -> None:
    """Raises ConfigError unless ``layout`` is one of :data:`shardkit.layout.LAYOUTS`."""
    if layout not in layout_mod.LAYOUTS:
        raise ConfigError(f"layout={layout!r}; expected one of {layout_mod.LAYOUTS}")


def scan_tree(tree, top_folder, layout: str, where: str) -> ScanResult:
    """The folder rules of :func:`scan_folder` over a listing interface (see
    :class:`_LocalTree`; :mod:`shardkit.scan_remote` has one for object-store prefixes).

    Args:
        tree: the listing interface; ``tree.root`` is the source root (``ScanResult.root``).
        top_folder: the handle of the source root for ``tree.entries``.
        layout: as :func:`scan_folder` (already checked).
        where: names the source in errors (``"source folder '/data/x'"``).

    Returns / Raises: as :func:`scan_folder`.
    """
    root_s = tree.root
    out = ScanResult(items=[], root=root_s, kind="folder")
    probe = ScanResult(items=[])
    top = _top_entries(tree, top_folder, "", "the class folders", probe)
    split_first = layout == "split/class" or (
        layout == "auto" and bool(top) and all(layout_mod.split_family(rel) for *_, rel in top)
        and any(_has_subfolder(tree, handle) for _, handle, _ in top))
    spellings: dict[str, dict[str, str]] = {}
    if split_first:
        out.layout = "split/class"
        top = _top_entries(tree, top_folder, "", "the split folders", out)
        classes = _scan_splits(tree, top, where, out, spellings)
        expected = "root/<split>/<class>/<image>"
    else:
        out.ignored += probe.ignored
        classes = _walk_classes(tree, top, out, spellings)
        expected = "root/<class>/<image>"
    if classes == 0:
        raise SourceError(f"{where} has no class folder with files (expected "
                          f"{expected}; ignored entries: "
                          f"{_listing([r for r, _ in out.ignored]) if out.ignored else 'none'})")
    if layout == "auto" and not split_first:
        _check_class_tree(root_s, out)
    out.warnings += layout_mod.twin_class_warnings(spellings)
    out.items.sort(key=lambda i: i.relpath)
    out.missing.sort(key=lambda i: i.relpath)
    out.ignored.sort()
    _check_unique(out.items + out.missing, where)
    return out


def _scan_splits(tree, top, where: str, out: ScanResult, spellings: dict) -> int:
    """Walks the split folders ``top`` of a split-first tree; returns the class folders found."""
    mapping = layout_mod.map_split_names([rel for *_, rel in top], where)
    classes = 0
    for _, handle, relname in top:
        split, start = mapping[relname], len(out.ignored)
        dirs = _top_entries(tree, handle, relname + "/",
                            f"the class folders of split folder {relname!r}", out)
        found = _walk_classes(tree, dirs, out, spellings, split)
        if found:
            out.given_splits[relname] = split
            classes += found
            continue
        if len(out.ignored) == start:
            out.ignored.append((relname, "empty split folder"))
        files = sum(why.startswith("file beside") for _, why in out.ignored[start:])
        out.warnings.append(f"split folder {relname!r} holds no class folder with files: not "
                            "packed" + (f"; its {files} files lie directly in it (unlabelled?) "
                                        "and are listed as ignored" if files else ""))
    out.given_splits = {r: s for r, s in mapping.items() if r in out.given_splits}
    return classes


def _check_class_tree(root_s: str, out: ScanResult) -> None:
    """The two-level error (no class folder holds a file directly) and the split-named warning
    of a tree read as ``root/<class>/...`` by ``layout="auto"``."""
    shape: dict[str, collections.Counter] = {}
    direct = False
    for it in out.items + out.missing:
        parts = it.relpath.split("/")
        direct = direct or len(parts) == 2
        shape.setdefault(parts[0], collections.Counter())[parts[1]] += 1
    if not direct:
        raise layout_mod.two_level_error(root_s, dict(sorted(shape.items())))
    warning = layout_mod.split_named_classes_warning({it.label for it in out.items})
    if warning:
        out.warnings.append(warning)


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


_CSV_NAMES = ("scan_csv", "match_group_metadata", "match_split_metadata",
              "lacking_metadata_error", "apply_group_metadata")


def __getattr__(name: str):
    """The CSV source functions live in :mod:`shardkit.csvlist` (imported on first use)."""
    if name in _CSV_NAMES:
        from shardkit import csvlist
        return getattr(csvlist, name)
    raise AttributeError(f"module 'shardkit.scan' has no attribute {name!r}")
