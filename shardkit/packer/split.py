"""Step 4 of :func:`shardkit.packer.run.pack` (pure: no I/O but :func:`load_previous`): the split plan.

:func:`plan_split` splits the accepted items with :func:`shardkit.packer.assign.assign_splits` (or keeps
the source's given splits), links near-duplicates (:mod:`shardkit.images.neardup`), keeps an earlier
pack's placements (``--split-from``: :func:`load_previous`, :func:`ratios_from_previous`) and
applies the label-conflict policy. Steps 1-3 are in :mod:`shardkit.packer.scan` and :mod:`shardkit.packer.check`, 5-7 in
:mod:`shardkit.packer.write`. Notes go to the ``shardkit.pack`` logger.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shardkit.sources import layouts as layout
from shardkit.images import neardup
from shardkit.packer import given as pack_given
from shardkit.dataset import manifest as manifest_mod
from shardkit.errors import ConfigError, LabelError, SplitError
from shardkit.sources.labels import LabelMap
from shardkit.packer.assign import SplitPlan, assign_splits

if TYPE_CHECKING:
    from shardkit.packer.options import PackOptions
    from shardkit.packer.check import CheckedFiles
    from shardkit.packer.scan import ScannedSource
    from shardkit.packer.records import CheckRecords

__all__ = ["SplitOutcome", "PreviousSplits", "plan_split", "load_previous",
           "ratios_from_previous", "NO_GROUP_RULE_WARNING"]

logger = logging.getLogger("shardkit.pack")

_GIANT_CLUSTER_MIN = 10
_GIANT_CLUSTER_FRACTION = 0.05
"""A near-duplicate cluster larger than both (images; share of the packed images) is warned
about: bursts and copies make clusters of a handful, a chain across unrelated images makes a
giant one."""

NO_GROUP_RULE_WARNING = ("no group rule (--group-by or --metadata/--group-column): every file is "
                         "its own group, so near-duplicates (same subject, burst shots) can leak "
                         "across splits")


@dataclass(frozen=True)
class PreviousSplits:
    """Where an earlier pack (``--split-from PREV_OUT``) put each group.

    Attributes:
        root: PREV_OUT, absolute. ratios: its ``split.ratios`` (None when it kept given splits).
        group_to_split: every group of its split files -> its split (a group found in several
            splits, possible only with given splits: the split holding most of its samples).
        group_rule: its ``split.group_rule`` (groups are matched by name, so the rule should be
            the same; a different rule is warned about).
    """

    root: str
    ratios: dict | None
    group_to_split: dict[str, str]
    group_rule: dict


def load_previous(prev: Path) -> PreviousSplits:
    """Reads the placements of the finished dataset at ``prev`` (its manifest and split files).

    Raises:
        ConfigError: ``prev`` holds no finished shardkit dataset (no ``manifest.json``).
        ManifestError: a damaged manifest or split file (names the file).
    """
    from collections import Counter

    root = Path(prev).resolve()
    if not (root / manifest_mod.MANIFEST_NAME).is_file():
        raise ConfigError(f"--split-from {root}: no finished shardkit dataset there (no "
                          f"{manifest_mod.MANIFEST_NAME}); expected the OUT of an earlier pack")
    manifest = manifest_mod.load_manifest(root)
    votes: dict[str, Counter] = {}
    for split in manifest["splits"]:
        for row in manifest_mod.read_split_records(root, split):
            votes.setdefault(str(row["group"]), Counter())[split] += 1
    order = list(manifest["splits"])
    placed = {g: max(order, key=lambda x: (c[x], -order.index(x))) for g, c in votes.items()}
    split = manifest.get("split") or {}
    logger.info("--split-from %s: %d groups in splits %s", root, len(placed), order)
    return PreviousSplits(root=str(root), ratios=split.get("ratios"), group_to_split=placed,
                          group_rule=split.get("group_rule") or {})


def ratios_from_previous(previous: PreviousSplits, source: ScannedSource,
                         options: PackOptions) -> PackOptions:
    """``options`` with ``split`` set to the previous pack's ratios, for ``--split-from``
    without ``--split``.

    Raises:
        ConfigError: the source gives its own splits (they would be kept as given, so nothing
            would be kept from the previous pack), or the previous pack kept given splits (it
            has no ratios to reuse).
    """
    if source.given is not None:
        raise ConfigError(f"--split-from {previous.root}: {source.root} gives its own splits "
                          f"({layout.describe_mapping(source.given['mapping'])}), which are kept "
                          "as given, so nothing would be kept from the earlier pack; pass --split "
                          "NAME=FRACTION,... to pool and re-split them with its placements kept, "
                          "or drop --split-from")
    if previous.ratios is None:
        raise ConfigError(f"--split-from {previous.root}: that pack kept given splits, so it has "
                          "no ratios to reuse; pass --split NAME=FRACTION,... with its split names")
    return options.replace(split=previous.ratios)


def _rule_key(rule: dict) -> dict:
    """A group rule without the metadata file's location: a grown dataset's CSV may live
    elsewhere and still group by the same column."""
    return {k: v for k, v in (rule or {}).items() if k != "csv"}


@dataclass
class SplitOutcome:
    """What step 4 decided.

    Attributes:
        plan: the split plan over ``keep`` (plan position ``j`` is item ``keep[j]``).
        keep: positions of the items to pack, in scan order.
        quarantined: ``quarantine.jsonl`` entries of label conflicts (policy ``"quarantine"``).
        conflicts: identical bytes under different labels, as in the manifest's
            ``split.label_conflicts`` (``sha256``, ``labels``, ``paths``).
        warnings: the scanner's warnings, the notes on given splits and numeric class order,
            the plan's warnings, then the one about a missing group rule (not for given splits).
        split_fields: the manifest ``split`` keys that depend on the mode (``mode``, ``ratios``,
            ``given``; :func:`shardkit.packer.given.split_fields`), plus ``method``,
            ``near_duplicates`` (see :func:`plan_split`) and, with ``--split-from``,
            ``kept_from``.
        degenerate: ``{"path", "reason"}`` of the packed degenerate images, in scan order.
    """

    plan: SplitPlan
    keep: list[int]
    quarantined: list[dict]
    conflicts: list[dict]
    warnings: list[str]
    split_fields: dict = field(default_factory=dict)
    degenerate: list[dict] = field(default_factory=list)


def plan_split(source: ScannedSource, label_map: LabelMap, label_idx: list[int],
               checked: CheckedFiles, options: PackOptions,
               previous: PreviousSplits | None = None) -> SplitOutcome:
    """Step 4 (pure): splits the accepted items with :func:`shardkit.packer.assign.assign_splits`, or
    keeps the source's given splits (:func:`shardkit.packer.given.split_mode`), and applies
    ``options.on_label_conflict``. Near-duplicates (pHash within ``options.near_threshold``
    bits, degenerate images left out) are linked (``"merge"``) or reported; ``previous``
    placements are kept.

    Raises:
        LabelError: identical bytes under different labels with policy ``"error"``.
        ConfigError: ``previous`` with a source whose given splits are kept, with another
            group rule (the metadata file's path aside), or sharing no group with the source.
        SplitError: ``previous`` names splits that are not among the requested ones.
    """
    items, results, keep = source.items, checked.results, checked.keep
    mode = pack_given.split_mode(source.given, options)
    if previous is not None and mode == "given":
        raise ConfigError(f"--split-from {previous.root}: {source.root} gives its own splits, "
                          "which are kept as given; pass --split NAME=FRACTION,... to re-split "
                          "it with the earlier placements kept")
    fixed = previous.group_to_split if previous is not None else None
    if previous is not None and previous.group_rule and \
            _rule_key(previous.group_rule) != _rule_key(source.group_rule):
        raise ConfigError(f"--split-from {previous.root} grouped files by "
                          f"{_rule_key(previous.group_rule)}, this pack by "
                          f"{_rule_key(source.group_rule)}: placements are kept by group name, "
                          "so use the same group rule (otherwise every group looks new and old "
                          "validation files could land in training)")
    if fixed and not set(fixed) & {items[i].group for i in keep}:
        raise ConfigError(f"--split-from {previous.root}: none of its {len(fixed)} groups is "
                          f"among this source's groups (its first: {sorted(fixed)[:3]}); check "
                          "the source and the group rule")
    if fixed is not None and set(fixed.values()) - set(options.split):
        raise SplitError(f"--split-from {previous.root} has splits "
                         f"{sorted(set(fixed.values()))} but the requested splits are "
                         f"{list(options.split)}; use the same split names")

    def plan_for(idx):
        samples = [(items[i].group, int(label_idx[i]), results.meta(i)["sha256"]) for i in idx]
        pairs = _near_pairs(idx, results, options)
        if mode == "given":
            return pack_given.plan_given(items, samples, idx, source.given), pairs
        links = pairs[:, :2].tolist() if options.near_duplicates == "merge" else ()
        return assign_splits(samples, options.split, seed=options.seed,
                             method=options.split_method, links=links, fixed=fixed), pairs

    plan, pairs = plan_for(keep)
    conflicts = [{"sha256": c.sha256, "labels": [label_map.classes[k] for k in c.labels],
                  "paths": [items[keep[j]].relpath for j in c.indices]}
                 for c in plan.label_conflicts]
    quarantined: list[dict] = []
    if conflicts and options.on_label_conflict == "error":
        listing = "; ".join(f"{c['paths']} labelled {c['labels']}" for c in conflicts[:10])
        raise LabelError(f"{len(conflicts)} set(s) of identical bytes carry different labels: "
                         f"{listing}. Fix the labels, or pass --on-label-conflict quarantine|keep")
    if conflicts and options.on_label_conflict == "quarantine":
        bad = {keep[j] for c in plan.label_conflicts for j in c.indices}
        for i in sorted(bad):
            others = sorted({label_map.classes[label_idx[j]] for j in bad
                             if results.meta(j)["sha256"] == results.meta(i)["sha256"]})
            quarantined.append({"path": items[i].relpath, "sha256": results.meta(i)["sha256"],
                                "size": results.meta(i)["size"],
                                "reason": f"label_conflict: identical bytes labelled {others}"})
        keep = [i for i in keep if i not in bad]
        plan, pairs = plan_for(keep)
    near, near_warnings = _near_section(plan, pairs, keep, items, mode, options)
    numeric = None if options.labels is not None else layout.numeric_order_note(label_map.classes)
    warnings = (source.warnings + pack_given.given_notes(source.given, mode, options)
                + ([numeric] if numeric else []) + list(plan.warnings) + near_warnings)
    if source.group_rule["kind"] == "none" and mode != "given":
        warnings.append(NO_GROUP_RULE_WARNING)
    fields = pack_given.split_fields(source.given, mode, plan, [items[i].relpath for i in keep],
                                     options)
    fields["method"] = plan.method
    fields["near_duplicates"] = near
    if previous is not None:
        present = set(plan.group_to_split)
        fields["kept_from"] = {
            "root": previous.root, "kept_groups": plan.kept_groups,
            "moved_groups": plan.moved_groups,
            "new_groups": len(present - set(previous.group_to_split)),
            "gone_groups": len(set(previous.group_to_split) - present)}
    degenerate = [{"path": items[i].relpath, "reason": results.meta(i)["degenerate"]}
                  for i in keep if results.meta(i).get("degenerate")]
    return SplitOutcome(plan=plan, keep=keep, quarantined=quarantined, conflicts=conflicts,
                        warnings=warnings, split_fields=fields, degenerate=degenerate)


def _near_pairs(idx: list[int], results: CheckRecords, options: PackOptions):
    """``(k, 3)`` int64 array of near-duplicate pairs ``(a, b, distance)``, ``a < b`` positions
    in ``idx``, over the hashed (non-degenerate) items, leaving out pairs of identical bytes
    (those are joined anyway); empty when ``near_duplicates="off"``."""
    import numpy as np

    hashed = [j for j, i in enumerate(idx) if results.meta(i).get("phash") is not None]
    if options.near_duplicates == "off" or len(hashed) < 2:
        return np.zeros((0, 3), np.int64)
    hashes = np.array([results.meta(idx[j])["phash"] for j in hashed], dtype=np.uint64)
    a, b, d = neardup.near_pairs(hashes, options.near_threshold)
    pos = np.asarray(hashed, dtype=np.int64)
    pairs = np.stack([pos[a], pos[b], d], axis=1) if len(a) else np.zeros((0, 3), np.int64)
    same = [results.meta(idx[x])["sha256"] == results.meta(idx[y])["sha256"] for x, y, _ in pairs]
    return pairs[~np.asarray(same, dtype=bool)] if len(pairs) else pairs


def _near_section(plan: SplitPlan, pairs, keep: list[int], items, mode: str,
                  options: PackOptions) -> tuple[dict, list[str]]:
    """The manifest's ``split.near_duplicates`` and the warning about clusters that span
    splits (given splits or ``"report"``: they stay where they are)."""
    section = {"mode": options.near_duplicates if mode != "given" or
               options.near_duplicates == "off" else "report",
               "threshold": options.near_threshold,
               "hash": "pHash, 64 bits (imagehash.phash), Hamming distance",
               "num_clusters": 0, "num_across_splits": 0, "clusters": []}
    if options.near_duplicates == "off":
        return section, []
    clusters = neardup.clusters(len(keep), pairs[:, 0], pairs[:, 1])
    listed, across = [], []
    for members in clusters:
        where: dict[str, int] = {}
        for j in members:
            where[plan.assignment[j]] = where.get(plan.assignment[j], 0) + 1
        entry = {"paths": [items[keep[j]].relpath for j in members],
                 "splits": {x: where[x] for x in plan.names if x in where}}
        listed.append(entry)
        if len(where) > 1:
            across.append(entry)
    section.update(num_clusters=len(listed), num_across_splits=len(across), clusters=listed)
    notes = []
    largest = max((len(c["paths"]) for c in listed), default=0)
    if largest > max(_GIANT_CLUSTER_MIN, _GIANT_CLUSTER_FRACTION * len(keep)):
        notes.append(f"the largest near-duplicate cluster holds {largest} of {len(keep)} images "
                     f"(pHash distance <= {options.near_threshold}): at this --near-threshold "
                     "unrelated images chain together into one atomic group, which decides the "
                     "split fractions; lower --near-threshold (default 4)")
    if not across:
        return section, notes
    why = ("given splits keep them where they are" if mode == "given" else
           "--near-duplicates report moves nothing; merge keeps each cluster in one split")
    listing = "; ".join(" ~ ".join(repr(p) for p in e["paths"][:3])
                        + " (" + ", ".join(f"{x} {c}" for x, c in e["splits"].items()) + ")"
                        for e in across[:5])
    more = f"; ... and {len(across) - 5} more" if len(across) > 5 else ""
    return section, notes + [f"{len(across)} near-duplicate cluster(s) (pHash distance <= "
                             f"{options.near_threshold}) span several splits ({why}): "
                             f"{listing}{more}"]
