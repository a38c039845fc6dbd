"""Given splits in a pack: which splits a source gives (step 1) and the plan keeping them (4).

A source *gives* splits when it is a split-first tree (``SRC/<split>/<class>/...``, a folder or
an object-store prefix, see :mod:`shardkit.sources.layouts`) or when ``split_column`` names a column of
the ``.csv`` source (local or remote) or of ``metadata``. With ``split`` unset
(``PackOptions.split_auto``) or ``"given"`` the packer keeps them
(:func:`given_splits`: nothing moves; identical bytes and shared groups across
them are warnings, and ``shardkit check`` still fails on them); with ratios it pools every file
and re-splits by group, and says so. Used by :mod:`shardkit.packer.scan`. ``src`` is a local
path or, for a remote source, its URL (``str``).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from shardkit.sources import csvlist, layouts as layout
from shardkit.errors import ConfigError, ShardkitError, SplitError
from shardkit.storage.urls import is_url
from shardkit.packer.assign import SPLIT_NAME_RE, SplitPlan, as_sample, dedup, sort_key

if TYPE_CHECKING:
    from shardkit.packer.options import PackOptions
    from shardkit.sources.items import ScanResult, SourceItem

__all__ = ["read_given", "lacking_rule_error", "split_mode", "plan_given", "given_notes",
           "split_fields", "given_splits"]


def read_given(src, result: ScanResult, options: PackOptions
               ) -> tuple[list[SourceItem], dict | None, bool]:
    """Step 1: the given splits of a scanned source.

    Returns:
        ``(items, given, lacking)``: the items with ``split`` set where given; ``given`` the
        manifest's ``split.given`` description (``{"from": "folders", "mapping": {folder:
        split}}`` or ``{"from": "column", "csv", "column", "mapping": {value: split}}``), None
        when the source gives no splits; ``lacking`` True when a metadata split column has no
        value for some items (their ``split`` is None).

    Raises:
        ConfigError: ``split_column`` on a folder source without ``metadata``, or on a
            split-first tree; ``split="given"`` for a source that gives no splits.
        SourceError: from reading the metadata CSV.
    """
    items, column = list(result.items), options.split_column
    given, lacking = None, False
    if column is not None and result.layout == "split/class":
        raise ConfigError(f"--split-column {column!r}: {src} is split-first (its folders give "
                          f"the splits: {layout.describe_mapping(result.given_splits)}); drop "
                          "--split-column")
    if column is not None and options.metadata is not None:
        with_split, missing, mapping = csvlist.match_split_metadata(items, options.metadata, column)
        by_rel = {it.relpath: it for it in with_split}
        items = [by_rel.get(it.relpath, it) for it in items]
        given = {"from": "column", "csv": csvlist.csv_location(options.metadata),
                 "column": column, "mapping": mapping}
        lacking = bool(missing)
    elif column is not None and result.kind != "csv":
        what = "an object-store prefix" if is_url(src) else "a folder"
        raise ConfigError(f"--split-column {column!r} reads a column of a .csv SRC or of "
                          f"--metadata; {src} is {what}: pass --metadata CSV")
    elif result.given_splits:
        given = ({"from": "column", "csv": str(src), "column": column} if column else
                 {"from": "folders"})
        given["mapping"] = dict(result.given_splits)
    if options.split == "given" and given is None:
        raise ConfigError(f"--split given: {src} gives no splits (not a split-first tree "
                          "SRC/<split>/<class>/..., no --split-column); pass split ratios")
    return items, given, lacking


def lacking_rule_error(items: list[SourceItem], options: PackOptions,
                       group_error: Callable[[list[str]], ShardkitError] | None
                       ) -> Callable[[list[str]], ShardkitError]:
    """The error builder for items without a group (the group rule's error, first) or without
    a given split (the metadata split column's error)."""
    def error(rels: list[str]) -> ShardkitError:
        by_rel = {it.relpath: it for it in items}
        no_group = [r for r in rels if by_rel[r].group is None]
        if no_group and group_error is not None:
            return group_error(no_group)
        return csvlist.lacking_metadata_error(options.metadata, options.split_column,
                                           [r for r in rels if by_rel[r].split is None],
                                           known=list(by_rel))
    return error


def split_mode(given: dict | None, options: PackOptions) -> str:
    """``"given"`` when the given splits are kept (``split="given"``, or unset and the source
    gives splits), else ``"ratios"``."""
    keep = options.split == "given" or (options.split_auto and given is not None)
    return "given" if keep else "ratios"


def plan_given(items: list[SourceItem], samples: list[tuple], idx: list[int],
               given: dict) -> SplitPlan:
    """Step 4: the plan keeping the given splits of ``items[i] for i in idx`` (``samples`` are
    their ``(group, label, sha256)``); every split of ``given`` is listed, in split order."""
    return given_splits(samples, [items[i].split for i in idx],
                        names=layout.order_splits(given["mapping"].values()),
                        paths=[items[i].relpath for i in idx])


def given_notes(given: dict | None, mode: str, options: PackOptions) -> list[str]:
    """The summary notes saying what happened to the given splits (none without them)."""
    if given is None:
        return []
    where = ("split-first SRC" if given["from"] == "folders" else
             f"column {given['column']!r} of {given['csv']}")
    mapping = layout.describe_mapping(given["mapping"])
    if mode == "given":
        return [f"given splits kept ({where}: {mapping}); pass --split NAME=FRACTION,... to "
                "pool the files and re-split them by group"]
    ratios = ",".join(f"{k}={v:g}" for k, v in options.split.items())
    return [f"given splits pooled ({where}: {mapping}) and re-split by group to {ratios}; "
            "--split given keeps them"]


def split_fields(given: dict | None, mode: str, plan: SplitPlan, paths: list[str],
                 options: PackOptions) -> dict:
    """The keys of the manifest's ``split`` section that depend on the split mode (schema in
    ``docs/DESIGN.md``): ``mode``, ``ratios`` (None for given splits) and ``given`` (None when
    the source gives no splits; else its description plus ``kept`` and, when kept,
    ``shared_bytes`` ``[{"sha256", "paths": {split: [relpath, ...]}}]`` and ``shared_groups``
    ``[{"group", "splits": {split: count}}]``). ``paths`` are the plan's sample relpaths."""
    fields = {"mode": mode, "ratios": None if mode == "given" else dict(options.split),
              "given": None}
    if given is not None:
        shared = []
        for e in plan.shared_bytes:
            where: dict[str, list[str]] = {}
            for i in e["indices"]:
                where.setdefault(plan.assignment[i], []).append(paths[i])
            shared.append({"sha256": e["sha256"], "paths": where})
        fields["given"] = {**given, "kept": mode == "given", "shared_bytes": shared,
                           "shared_groups": list(plan.shared_groups)}
    return fields


def given_splits(samples: Iterable[Any], splits: Sequence[str],
                 names: Sequence[str] | None = None,
                 paths: Sequence[str] | None = None) -> SplitPlan:
    """The plan of splits given by the source (split folders, a split column): nothing moves.

    Args:
        samples: as for :func:`assign_splits`.
        splits: the given split name of every sample, aligned with ``samples``.
        names: split order (may name splits without samples, reported as empty); default:
            the names in ``splits`` in first-seen order.
        paths: optional name of every sample (source relpaths), used in the warnings; default
            ``"sample <i>"``.

    Returns:
        a :class:`SplitPlan` with ``mode="given"``, ``assignment == splits``, ``ratios ==
        achieved``, ``tolerance`` 0.0, no ``merged_groups``; identical bytes and groups in more
        than one split in ``shared_bytes`` / ``shared_groups`` and each kind named in one
        warning (the first 5 listed); label conflicts as in :func:`assign_splits`.

    Raises:
        SplitError: ``splits`` or ``paths`` not aligned with ``samples``, a split not in
            ``names``, a bad or repeated name, or a bad sample.
    """
    items = [as_sample(s, i) for i, s in enumerate(samples)]
    splits = [str(s) for s in splits]
    for what, seq in (("splits", splits), ("paths", paths)):
        if seq is not None and len(seq) != len(items):
            raise SplitError(f"{what} has {len(seq)} entries for {len(items)} samples")
    names = tuple(dict.fromkeys(splits)) if names is None else tuple(names)
    bad = [x for x in names if not isinstance(x, str) or not SPLIT_NAME_RE.fullmatch(x)]
    unknown = sorted(set(splits) - set(names))
    if bad or unknown or len(set(names)) != len(names):
        raise SplitError(f"given split names {list(names)} are invalid or repeated, or miss "
                         f"{unknown}; expected unique names of letters, digits or '_'")
    n = len(items)
    group_ids, _, by_sha, conflicts = dedup(items)
    label_of = [s.label for s in items]
    class_keys = sorted(set(label_of), key=sort_key)
    counts = Counter(splits)
    class_counts = {x: {c: 0 for c in class_keys} for x in names}
    class_total = Counter(label_of)
    for split, label in zip(splits, label_of):
        class_counts[split][label] += 1
    achieved = {x: (counts[x] / n if n else 0.0) for x in names}

    def where(idx: Iterable[int]) -> dict[str, int]:
        c = Counter(splits[i] for i in idx)
        return {x: c[x] for x in names if c[x]}

    group_members: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(items):
        group_members[s.group].append(i)
    shared_groups = [{"group": g, "splits": where(idx)}
                     for g, idx in sorted(group_members.items()) if len(where(idx)) > 1]
    shared_bytes = [{"sha256": h, "indices": list(idx), "splits": where(idx)}
                    for h, idx in sorted(by_sha.items()) if len(where(idx)) > 1]
    shared = {g["group"] for g in shared_groups}
    group_to_split = {g: splits[idx[0]] for g, idx in group_members.items() if g not in shared}
    warnings = [f"given split {x!r} is empty: none of its files was packed"
                for x in names if n and not counts[x]]
    warnings += _given_leak_warnings(shared_bytes, shared_groups, splits, paths)
    return SplitPlan(names=names, ratios=dict(achieved), seed=0, tolerance=0.0,
                     assignment=splits, group_to_split=group_to_split,
                     counts={x: counts[x] for x in names}, class_counts=class_counts,
                     achieved=achieved,
                     class_achieved={x: {c: class_counts[x][c] / class_total[c]
                                         for c in class_keys} for x in names},
                     label_conflicts=conflicts, num_duplicates=n - len(by_sha),
                     warnings=warnings, mode="given", shared_bytes=shared_bytes,
                     shared_groups=shared_groups, method="given")


_GIVEN_NOTE = "left where they are (the splits are given; `shardkit check` fails on them)"


def _given_leak_warnings(shared_bytes: list[dict], shared_groups: list[dict], splits: list[str],
                         paths: Sequence[str] | None, shown: int = 5) -> list[str]:
    """One warning for identical bytes and one for groups found in more than one given split."""
    def name(i: int) -> str:
        return repr(paths[i]) if paths is not None else f"sample {i}"

    def more(k: int) -> str:
        return f"; ... and {k - shown} more" if k > shown else ""

    out = []
    if shared_bytes:
        listing = "; ".join(" = ".join(f"{name(i)} ({splits[i]})" for i in e["indices"])
                            for e in shared_bytes[:shown])
        out.append(f"given splits share identical bytes: {len(shared_bytes)} file content(s) "
                   f"in more than one split, {_GIVEN_NOTE}: {listing}"
                   f"{more(len(shared_bytes))}")
    if shared_groups:
        listing = "; ".join(f"{e['group']!r} (" + ", ".join(f"{x} {c}" for x, c in
                                                             e["splits"].items()) + ")"
                            for e in shared_groups[:shown])
        out.append(f"given splits share groups: {len(shared_groups)} group(s) with samples in "
                   f"more than one split, {_GIVEN_NOTE}: {listing}{more(len(shared_groups))}")
    return out
