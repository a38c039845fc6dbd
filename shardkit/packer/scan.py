"""Steps 1-2 of :func:`shardkit.pack`: scan the source and resolve its labels.

:func:`scan_source` (1) -> :class:`ScannedSource`; :func:`resolve_labels` (2) -> label map and
per-item class index. Notes go to the ``shardkit.pack`` logger.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable


from shardkit.sources import csvlist, layouts as layout
from shardkit.packer import given as pack_given
import shardkit.sources.folder as folder_scan
import shardkit.sources.groups as group_rules
from shardkit.humanize import count_text
from shardkit.errors import ConfigError, ShardkitError, SourceError
from shardkit.sources.labels import LabelMap
from shardkit.storage.urls import is_url

if TYPE_CHECKING:
    from shardkit.packer.options import PackOptions
    from shardkit.sources.items import SourceItem

__all__ = ["ScannedSource", "scan_source", "resolve_labels"]

logger = logging.getLogger("shardkit.pack")


# ----------------------------------------------------------------------------- 1: scan
@dataclass(frozen=True)
class ScannedSource:
    """What step 1 found in the source.

    Attributes:
        items: sample candidates sorted by relpath. ``group`` is set on every item except those
            at the positions in ``ungrouped`` (None there); without a group rule each item is its
            own group (its relpath), unless a CSV list gave it one.
        missing: CSV rows and broken links whose file does not exist, and links that cannot be
            followed (quarantined later, with ``missing_reasons[relpath]`` or "file not found").
        ignored: ``(relpath, reason)`` of entries that are not samples.
        kind, root: ``"folder"`` or ``"csv"``, and the absolute source root.
        group_rule: the manifest's ``split.group_rule``: ``{"kind": "none"}``,
            ``{"kind": "regex", "regex"}`` or ``{"kind": "column", "csv", "column"}``.
        ungrouped: positions in ``items`` that the group rule gives no group (or the metadata
            split column no split).
        no_group_error: builds the rule's SourceError for a list of relpaths (None without rule).
        given: the splits the source gives, as the manifest's ``split.given`` describes them
            (:func:`shardkit.packer.given.read_given`), or None; each item's ``split`` is its own.
        layout: ``"class"``, ``"split/class"`` or ``"csv"``.
        warnings: the scanner's warnings (twin class folders, split folders without classes,
            class folders named like splits).
    """

    items: list[SourceItem]
    missing: list[SourceItem]
    ignored: list[tuple[str, str]]
    kind: str
    root: str
    group_rule: dict
    ungrouped: list[int] = field(default_factory=list)
    no_group_error: Callable[[list[str]], ShardkitError] | None = None
    given: dict | None = None
    layout: str = "class"
    warnings: list[str] = field(default_factory=list)
    missing_reasons: dict[str, str] = field(default_factory=dict)

    @property
    def num_files(self) -> int:
        """Files the source lists: candidates plus missing ones."""
        return len(self.items) + len(self.missing)


def scan_source(src: Path, options: PackOptions) -> ScannedSource:
    """Step 1: scans ``src`` (folder in ``options.layout``, or ``.csv`` list), reads its given
    splits (:func:`shardkit.packer.given.read_given`) and applies the group rule of ``options``.

    Raises:
        SourceError: ``src`` is neither a folder nor a ``.csv`` file, or holds no files; the
            scanner's and the metadata CSV's own errors. ConfigError: a bad metadata or split
            column, ``layout`` other than ``"auto"`` for a ``.csv`` source, ``split="given"``
            for a source that gives no splits.
    """
    if is_url(src):  # an object-store prefix (a tree of objects) or a remote .csv list
        from shardkit.sources.remote import scan_url

        result = scan_url(src, layout=options.layout, split_column=(
            options.split_column if options.metadata is None else None))
    elif src.is_file() and src.suffix.lower() == ".csv":
        if options.layout != "auto":
            raise ConfigError(f"--layout {options.layout} is for folder sources; {src} is a "
                              ".csv list")
        result = csvlist.scan_csv(src, split_column=(options.split_column if options.metadata is
                                                  None else None))
    elif src.is_dir():
        result = folder_scan.scan_folder(src, layout=options.layout)
    else:
        raise SourceError(f"source {src} is neither a folder nor a .csv file")
    items, given, lacking_split = pack_given.read_given(src, result, options)
    items, rule, ungrouped, no_group_error = _apply_group_rule(src, items, options)
    if lacking_split:  # checked with the ungrouped files: a notes.txt needs no split either
        ungrouped = sorted(set(ungrouped) | {i for i, it in enumerate(items) if it.split is None})
        no_group_error = pack_given.lacking_rule_error(items, options, no_group_error)
    if not items and not result.missing:
        raise SourceError(f"no image files found in {src}")
    logger.info("scanned %s (layout %s): %s, %d missing, %s, group rule %s, %s", src,
                result.layout, count_text(len(items), "file"), len(result.missing),
                count_text(len(result.ignored), "ignored entry", "ignored entries"), rule["kind"],
                f"given splits {given['mapping']}" if given and given.get("mapping")
                else "no given splits")
    return ScannedSource(items=items, missing=list(result.missing), ignored=list(result.ignored),
                         kind=result.kind, root=result.root, group_rule=rule, ungrouped=ungrouped,
                         no_group_error=no_group_error, given=given, layout=result.layout,
                         warnings=list(result.warnings),
                         missing_reasons=dict(result.missing_reasons))


def _apply_group_rule(src: Path, items: list[SourceItem], options: PackOptions):
    """``(items, group_rule, ungrouped, no_group_error)`` for the rule of ``options``."""
    group_by, metadata, column = options.group_by, options.metadata, options.group_column
    grouped = no_group_error = None
    if group_by is not None:
        grouped, _ = group_rules.match_group_regex(items, group_by)
        rule = {"kind": "regex", "regex": group_by}
        no_group_error = lambda rels: group_rules.unmatched_regex_error(group_by, rels)  # noqa: E731
    elif column is not None:
        grouped, _ = csvlist.match_group_metadata(items, metadata, column, root=src)
        rule = {"kind": "column", "csv": csvlist.csv_location(metadata), "column": column}
        no_group_error = lambda rels: csvlist.lacking_metadata_error(  # noqa: E731
            metadata, column, rels, root=src, known=[it.relpath for it in items])
    elif any(it.group for it in items):  # a CSV list with its own group column
        rule = {"kind": "column", "csv": str(src), "column": "group"}
    else:
        rule = {"kind": "none"}
    if grouped is None:  # no rule: each file is its own group (the summary warns about leakage)
        items = [it if it.group else dataclasses.replace(it, group=it.relpath) for it in items]
        return items, rule, [], None
    # a file the rule gives no group is not an error yet: step 3 first checks whether it is an
    # image at all (a notes.txt is quarantined as "not an image", not a group error)
    by_rel = {it.relpath: it for it in grouped}
    ungrouped = [i for i, it in enumerate(items) if it.relpath not in by_rel]
    items = [by_rel.get(it.relpath, dataclasses.replace(it, group=None)) for it in items]
    return items, rule, ungrouped, no_group_error


# ----------------------------------------------------------------------------- 2: labels
def resolve_labels(items: list[SourceItem], labels_yaml) -> tuple[LabelMap, list[int]]:
    """Step 2: the label map (from ``labels_yaml``, else the item labels in
    :func:`shardkit.sources.layouts.class_order`: by code point, or by value when all are numbers; the
    union over given splits) and each item's class index, aligned with ``items``. Reads no
    image.

    Raises:
        UnknownLabelError: every label that matches no class, at once. LabelError: a bad YAML.
    """
    label_map = (LabelMap.from_yaml(labels_yaml) if labels_yaml is not None else
                 LabelMap(layout.class_order(it.label for it in items)))
    name_to_idx = label_map.resolve_all([it.label for it in items])  # all unknowns at once
    return label_map, [name_to_idx[it.label] for it in items]


