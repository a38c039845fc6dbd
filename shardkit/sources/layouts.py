"""Source layouts: which folders are splits, which are classes, and in which order classes go.

Two folder layouts (:func:`shardkit.sources.folder.scan_folder`, ``layout=``):

* ``"class"``: ``SRC/<class>/.../<file>`` (torchvision ImageFolder).
* ``"split/class"``: ``SRC/<split>/<class>/.../<file>``, the split-first tree most public
  datasets ship (``train/``, ``val/``, ``test/``).

``"auto"`` (the default) picks ``"split/class"`` when every top folder is named like a split
(:data:`SPLIT_FOLDER_NAMES`, case-insensitive) and at least one of them holds a sub-folder;
otherwise ``"class"``, except that a tree whose every top folder holds only sub-folders and no
file is an error (:func:`two_level_error`): the top folders would silently become the classes.

Given split names (split folders, or the values of a ``--split-column``) map to split names with
:func:`map_split_names`: ``train``/``training`` -> ``train``; ``val``/``valid``/``validation``/
``dev``/``eval`` -> ``val``; ``test``/``testing`` -> ``test``, when one name of that family is
present; when several are (``val`` and ``dev``), each keeps its lower-cased name. Other names are
kept as written (they must match ``[A-Za-z0-9_]+``). Splits are ordered train, val, test, then
the rest by name (:func:`order_splits`).

Classes found in a source are sorted by code point (torchvision's order), except when every
name is a decimal number (``1``, ``2``, ``10``): then by value (:func:`class_order`).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Mapping

from shardkit.errors import SourceError

__all__ = ["LAYOUTS", "SPLIT_FOLDER_NAMES", "split_family", "map_split_names", "order_splits",
           "class_order", "numeric_order_note", "twin_class_warnings", "two_level_error",
           "split_named_classes_warning", "describe_mapping"]

LAYOUTS = ("auto", "class", "split/class")
"""Values of ``layout`` (``--layout``)."""

SPLIT_FOLDER_NAMES = {"train": "train", "training": "train", "val": "val", "valid": "val",
                      "validation": "val", "dev": "val", "eval": "val", "test": "test",
                      "testing": "test"}
"""Lower-cased folder name (or split column value) -> split family."""

_FAMILY_RANK = {"train": 0, "val": 1, "test": 2}
_SPLIT_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
_NUMBER_RE = re.compile(r"[0-9]+")
_SHOWN = 5


def split_family(name: str) -> str | None:
    """``"train"``, ``"val"`` or ``"test"`` for a split-like ``name`` (case-insensitive), else
    None."""
    return SPLIT_FOLDER_NAMES.get(name.strip().lower())


def map_split_names(raw: Iterable[str], where: str) -> dict[str, str]:
    """Maps given split names (folder names or column values) to split names (rules in the
    module docstring). Returns ``{raw: split}`` in the order of :func:`order_splits`.

    Raises:
        SourceError: a name that is not a valid split name (``[A-Za-z0-9_]+``) and not
            split-like, or two names that give one split (``Train`` and ``train``); the message
            names ``where`` and the names.
    """
    names = list(dict.fromkeys(raw))
    families = Counter(split_family(n) for n in names if split_family(n))
    out: dict[str, str] = {}
    for n in names:
        fam = split_family(n)
        split = fam if fam and families[fam] == 1 else (n.strip().lower() if fam else n.strip())
        if not _SPLIT_NAME_RE.fullmatch(split):
            raise SourceError(f"{where}: split name {n!r} is not a valid split name (letters, "
                              "digits or '_'); rename it")
        out[n] = split
    clash = {s: sorted(n for n in out if out[n] == s) for s in set(out.values())}
    clash = {s: ns for s, ns in clash.items() if len(ns) > 1}
    if clash:
        raise SourceError(f"{where}: " + "; ".join(f"{ns} all name split {s!r}"
                                                  for s, ns in sorted(clash.items())) +
                          "; merge or rename them")
    order = {s: k for k, s in enumerate(order_splits(out.values()))}
    return dict(sorted(out.items(), key=lambda kv: order[kv[1]]))


def order_splits(names: Iterable[str]) -> list[str]:
    """Unique split names ordered train, val, test (by family), then the others by name."""
    return sorted(set(names), key=lambda s: (_FAMILY_RANK.get(split_family(s) or "", 3), s))


def describe_mapping(mapping: Mapping[str, str]) -> str:
    """``'Train' -> train, 'VALID' -> val`` for a ``{raw: split}`` mapping."""
    return ", ".join(f"{raw!r} -> {split}" for raw, split in mapping.items())


def class_order(labels: Iterable[str]) -> list[str]:
    """Unique ``labels`` sorted by value when all are decimal numbers (``[0-9]+``; ties such as
    ``"01"``/``"1"`` by text), else by code point."""
    names = set(labels)
    if names and all(_NUMBER_RE.fullmatch(n) for n in names):
        return sorted(names, key=lambda n: (int(n), n))
    return sorted(names)


def numeric_order_note(classes: list[str]) -> str | None:
    """The summary note for classes sorted as numbers in an order that differs from the text
    order (torchvision's ImageFolder), else None."""
    text = sorted(classes)
    if list(classes) == text or not all(_NUMBER_RE.fullmatch(c) for c in classes):
        return None
    return (f"class names are all numbers: sorted as numbers ({_short(classes)}), not as text "
            f"({_short(text)}, torchvision ImageFolder's order); pass --labels to choose "
            "another order")


def _short(names: list[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def twin_class_warnings(spellings: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Warnings for classes spelled by several folder names (NFC/NFD twins, surrounding spaces).

    Args:
        spellings: class label -> {raw folder name: the first relative path shown for it}.
    Returns:
        one warning per class with two or more spellings, naming every spelled path with
        ``ascii()`` escapes so that the twins look different.
    """
    out = []
    for label, raw in sorted(spellings.items()):
        if len(raw) > 1:
            shown = " and ".join(ascii(path) for _, path in sorted(raw.items()))
            out.append(f"class folders {shown} are one class {label!r} after Unicode NFC "
                       "normalisation and stripping spaces: their files are merged")
    return out


def split_named_classes_warning(classes: Iterable[str]) -> str | None:
    """The warning for class folders named like splits in a ``"class"`` layout, or None."""
    named = sorted(c for c in classes if split_family(c))
    if not named:
        return None
    return (f"class folder(s) {named} are named like splits; if SRC is split-first "
            "(SRC/<split>/<class>/...), pass --layout split/class")


def two_level_error(root: str, shape: Mapping[str, Counter]) -> SourceError:
    """The error for a tree whose top folders hold only sub-folders (no file directly).

    Args:
        root: the source folder, or the URL of an object-store prefix.
        shape: top folder -> Counter of files per sub-folder.
    """
    from shardkit.storage.urls import is_url

    parts = []
    for top, subs in list(shape.items())[:_SHOWN]:
        inner = ", ".join(f"{s}/ ({n} files)" for s, n in list(subs.items())[:_SHOWN])
        more = f", ... {len(subs) - _SHOWN} more" if len(subs) > _SHOWN else ""
        parts.append(f"{top}/{{{inner}{more}}}")
    more_top = f", ... {len(shape) - _SHOWN} more" if len(shape) > _SHOWN else ""
    return SourceError(
        f"source {'prefix' if is_url(root) else 'folder'} {root!r} is two levels deep and not split-first (top folders not all "
        f"named train/val/test...): its top folders hold only sub-folders, no files, so they "
        f"would become the classes; shape: {', '.join(parts)}{more_top}. Say which it is: "
        "--layout class (layout='class') makes each top folder a class holding the files of "
        "its sub-folders, --layout split/class (layout='split/class') reads the top folders as "
        "splits holding class folders; or point SRC at a folder whose sub-folders are the "
        "classes")
