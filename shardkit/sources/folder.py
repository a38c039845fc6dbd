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
  :mod:`shardkit.sources.layouts`. Files beside the class folders of a split are ignored (listed); a split
  folder without class folders is ignored with a warning (an unlabelled test set).
* **CSV list** (:func:`scan_csv`) with a header and columns ``path,label[,group]`` (and a given
  split column with ``split_column``).

The CSV functions (:func:`scan_csv`, the metadata joins) live in :mod:`shardkit.sources.csvlist` and are
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
:func:`shardkit.sources.groups.match_group_regex` (from the relative path) and
:func:`shardkit.sources.csvlist.match_group_metadata` (from a column of a metadata CSV joined on
the NFC relative path). An item that gets no group is an error (raised by the packer once it
knows the item is an image), never silently put in a group of its own.
:func:`shardkit.sources.csvlist.match_split_metadata` reads a given split from a metadata column
the same way.

Results are sorted by ``relpath`` (code point order), so scans are deterministic.

The folder rules run over a small listing interface (:func:`scan_tree`, local folders through
:class:`_LocalTree`); :mod:`shardkit.sources.remote` runs the same rules over the one listing of an
object-store prefix (``s3://bucket/flowers``).
"""
from __future__ import annotations

import collections
import os

from shardkit.errors import ConfigError, SourceError
from shardkit.sources import layouts as layout_mod
from shardkit.sources.items import (ScanResult, SourceItem, check_unique, ignore_reason, listing,
                                    nfc, path_kind, unreachable_reason)

__all__ = ["scan_folder", "scan_tree", "check_layout"]


class _LocalTree:
    """The listing interface the folder walk runs over, for a local folder: ``os.scandir`` and
    :func:`path_kind`, symbolic links followed (a loop is found by realpath). A handle is a path.

    :mod:`shardkit.sources.remote` gives the same interface over an object-store listing (handles
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

    kind = staticmethod(path_kind)
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
        relpath = nfc(f"{rel}/{name}")
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


def _top_entries(tree, folder, rel: str, beside: str, out: ScanResult) -> list[tuple]:
    """The folders in ``folder`` as ``(name, handle, NFC relpath)``; every other entry goes to
    ``out.ignored`` (files with the reason "file beside ``beside`` (not a sample)")."""
    dirs = []
    for name, handle in tree.entries(folder):
        relname = nfc(f"{rel}{name}")
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
        label = nfc(name).strip()
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
    (rules in the module docstring and :mod:`shardkit.sources.layouts`).

    Args:
        root: the source folder.
        layout: ``"auto"`` (detect a split-first tree), ``"class"`` or ``"split/class"``.

    Returns:
        ScanResult with kind "folder", ``layout`` the layout used; ``group`` of every item is
        None; ``split`` is the given split in a split-first tree, else None.

    Raises:
        ConfigError: ``layout`` is not one of :data:`shardkit.sources.layouts.LAYOUTS`.
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
    """Raises ConfigError unless ``layout`` is one of :data:`shardkit.sources.layouts.LAYOUTS`."""
    if layout not in layout_mod.LAYOUTS:
        raise ConfigError(f"layout={layout!r}; expected one of {layout_mod.LAYOUTS}")


def scan_tree(tree, top_folder, layout: str, where: str) -> ScanResult:
    """The folder rules of :func:`scan_folder` over a listing interface (see
    :class:`_LocalTree`; :mod:`shardkit.sources.remote` has one for object-store prefixes).

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
                          f"{listing([r for r, _ in out.ignored]) if out.ignored else 'none'})")
    if layout == "auto" and not split_first:
        _check_class_tree(root_s, out)
    out.warnings += layout_mod.twin_class_warnings(spellings)
    out.items.sort(key=lambda i: i.relpath)
    out.missing.sort(key=lambda i: i.relpath)
    out.ignored.sort()
    check_unique(out.items + out.missing, where)
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
