"""Steps 1-4 of :func:`shardkit.pack.pack`: everything decided before ``OUT`` is touched.

Each step takes what the earlier ones returned plus the validated
:class:`~shardkit.pack.PackOptions` and returns a value: :func:`scan_source` (1) ->
:class:`ScannedSource`; :func:`resolve_labels` (2) -> label map and per-item class index;
:func:`check_files` (3) -> :class:`CheckedFiles`; :func:`plan_split` (4, pure: no I/O) ->
:class:`SplitOutcome`. Steps 5-7 (writing) are in :mod:`shardkit.pack_write`. Notes go to the
``shardkit.pack`` logger.
"""
from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from tqdm import tqdm

from shardkit import layout, pack_given, scan
from shardkit.errors import ConfigError, LabelError, ShardkitError, SourceError, SplitError
from shardkit.labels import LabelMap
from shardkit import manifest as manifest_mod
from shardkit import neardup
from shardkit.split import SplitPlan, assign_splits

if TYPE_CHECKING:
    from shardkit.pack import PackOptions
    from shardkit.scan import SourceItem

__all__ = ["ScannedSource", "CheckedFiles", "SplitOutcome", "PreviousSplits", "scan_source",
           "resolve_labels", "check_files", "plan_split", "load_previous",
           "ratios_from_previous",
           "NO_GROUP_RULE_WARNING"]

logger = logging.getLogger("shardkit.pack")

_GIANT_CLUSTER_MIN = 10
_GIANT_CLUSTER_FRACTION = 0.05
"""A near-duplicate cluster larger than both (images; share of the packed images) is warned
about: bursts and copies make clusters of a handful, a chain across unrelated images makes a
giant one."""

NO_GROUP_RULE_WARNING = ("no group rule (--group-by or --metadata/--group-column): every file is "
                         "its own group, so near-duplicates (same subject, burst shots) can leak "
                         "across splits")


# ----------------------------------------------------------------------------- 1: scan
@dataclass(frozen=True)
class ScannedSource:
    """What step 1 found in the source.

    Attributes:
        items: sample candidates sorted by relpath. ``group`` is set on every item except those
            at the positions in ``ungrouped`` (None there); without a group rule each item is its
            own group (its relpath), unless a CSV list gave it one.
        missing: CSV rows and broken links whose file does not exist (quarantined later).
        ignored: ``(relpath, reason)`` of entries that are not samples.
        kind, root: ``"folder"`` or ``"csv"``, and the absolute source root.
        group_rule: the manifest's ``split.group_rule``: ``{"kind": "none"}``,
            ``{"kind": "regex", "regex"}`` or ``{"kind": "column", "csv", "column"}``.
        ungrouped: positions in ``items`` that the group rule gives no group (or the metadata
            split column no split).
        no_group_error: builds the rule's SourceError for a list of relpaths (None without rule).
        given: the splits the source gives, as the manifest's ``split.given`` describes them
            (:func:`shardkit.pack_given.read_given`), or None; each item's ``split`` is its own.
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

    @property
    def num_files(self) -> int:
        """Files the source lists: candidates plus missing ones."""
        return len(self.items) + len(self.missing)


def scan_source(src: Path, options: PackOptions) -> ScannedSource:
    """Step 1: scans ``src`` (folder in ``options.layout``, or ``.csv`` list), reads its given
    splits (:func:`shardkit.pack_given.read_given`) and applies the group rule of ``options``.

    Raises:
        SourceError: ``src`` is neither a folder nor a ``.csv`` file, or holds no files; the
            scanner's and the metadata CSV's own errors. ConfigError: a bad metadata or split
            column, ``layout`` other than ``"auto"`` for a ``.csv`` source, ``split="given"``
            for a source that gives no splits.
    """
    if src.is_file() and src.suffix.lower() == ".csv":
        if options.layout != "auto":
            raise ConfigError(f"--layout {options.layout} is for folder sources; {src} is a "
                              ".csv list")
        result = scan.scan_csv(src, split_column=(options.split_column if options.metadata is
                                                  None else None))
    elif src.is_dir():
        result = scan.scan_folder(src, layout=options.layout)
    else:
        raise SourceError(f"source {src} is neither a folder nor a .csv file")
    items, given, lacking_split = pack_given.read_given(src, result, options)
    items, rule, ungrouped, no_group_error = _apply_group_rule(src, items, options)
    if lacking_split:  # checked with the ungrouped files: a notes.txt needs no split either
        ungrouped = sorted(set(ungrouped) | {i for i, it in enumerate(items) if it.split is None})
        no_group_error = pack_given.lacking_rule_error(items, options, no_group_error)
    if not items and not result.missing:
        raise SourceError(f"no image files found in {src}")
    logger.info("scanned %s (layout %s): %d files, %d missing, %d ignored entries, group rule "
                "%s, given splits %s", src, result.layout, len(items), len(result.missing),
                len(result.ignored), rule["kind"], given and given["mapping"])
    return ScannedSource(items=items, missing=list(result.missing), ignored=list(result.ignored),
                         kind=result.kind, root=result.root, group_rule=rule, ungrouped=ungrouped,
                         no_group_error=no_group_error, given=given, layout=result.layout,
                         warnings=list(result.warnings))


def _apply_group_rule(src: Path, items: list[SourceItem], options: PackOptions):
    """``(items, group_rule, ungrouped, no_group_error)`` for the rule of ``options``."""
    group_by, metadata, column = options.group_by, options.metadata, options.group_column
    grouped = no_group_error = None
    if group_by is not None:
        grouped, _ = scan.match_group_regex(items, group_by)
        rule = {"kind": "regex", "regex": group_by}
        no_group_error = lambda rels: scan.unmatched_regex_error(group_by, rels)  # noqa: E731
    elif column is not None:
        grouped, _ = scan.match_group_metadata(items, metadata, column, root=src)
        rule = {"kind": "column", "csv": str(Path(metadata).resolve()), "column": column}
        no_group_error = lambda rels: scan.lacking_metadata_error(  # noqa: E731
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
    :func:`shardkit.layout.class_order`: by code point, or by value when all are numbers; the
    union over given splits) and each item's class index, aligned with ``items``. Reads no
    image.

    Raises:
        UnknownLabelError: every label that matches no class, at once. LabelError: a bad YAML.
    """
    label_map = (LabelMap.from_yaml(labels_yaml) if labels_yaml is not None else
                 LabelMap(layout.class_order(it.label for it in items)))
    name_to_idx = label_map.resolve_all([it.label for it in items])  # all unknowns at once
    return label_map, [name_to_idx[it.label] for it in items]


# ----------------------------------------------------------------------------- 3: check
@dataclass
class CheckedFiles:
    """What step 3 found out about every file.

    Attributes:
        results: one dict per item (aligned with ``ScannedSource.items``): ``ok`` and, when the
            file was readable, ``sha256`` (hex) and ``size`` (bytes); accepted files add ``ext``,
            ``rule``, ``width``, ``height`` (pixels), ``warnings`` and, when normalised, ``data``
            (the bytes to store), ``degenerate`` (None or the reason from
            :func:`shardkit.neardup.degenerate_reason`) and ``phash`` (the 64-bit pHash as an
            int; None when degenerate or ``near_duplicates="off"``); rejected ones add
            ``reason``.
        keep: positions of accepted items, in scan order.
        quarantine: entries for ``quarantine.jsonl`` (``path``, ``reason``[, ``sha256``,
            ``size``]): missing files first, then rejects in scan order.
    """

    results: list[dict]
    keep: list[int]
    quarantine: list[dict]


def check_files(source: ScannedSource, options: PackOptions) -> CheckedFiles:
    """Step 3: reads, hashes and fully decodes every item in ``options.workers`` processes.

    Items the group rule gives no group are checked first: a real image among them raises the
    rule's error before the long check of the rest; non-images among them are quarantined.

    Raises:
        SourceError: an image without a group; a reject while ``options.fail_fast``; a check
            process that died.
    """
    items = source.items
    want_hash = options.near_duplicates != "off"
    jobs = [(str(it.path), it.relpath, options.max_pixels, options.strict, want_hash)
            for it in items]
    results: list = [None] * len(items)
    if source.ungrouped:
        checked = _check_all([jobs[i] for i in source.ungrouped], options.workers,
                             options.progress, desc="check (no group)")
        for i, res in zip(source.ungrouped, checked):
            results[i] = res
        images_without_group = [items[i].relpath for i in source.ungrouped if results[i]["ok"]]
        if images_without_group:
            raise source.no_group_error(images_without_group)
    rest = [i for i, res in enumerate(results) if res is None]
    for i, res in zip(rest, _check_all([jobs[i] for i in rest], options.workers,
                                       options.progress)):
        results[i] = res
    quarantine = [{"path": m.relpath, "reason": "file not found"} for m in source.missing]
    keep: list[int] = []
    for i, (it, res) in enumerate(zip(items, results)):
        if res["ok"]:
            keep.append(i)
            continue
        entry = {"path": it.relpath, "reason": res["reason"]}
        entry.update({k: res[k] for k in ("sha256", "size") if k in res})
        quarantine.append(entry)
        if options.fail_fast:
            raise SourceError(f"{it.path}: rejected ({res['reason']}); fail_fast is on, nothing "
                              "was written")
    logger.info("checked %d files: %d accepted, %d quarantined", len(items), len(keep),
                len(quarantine))
    return CheckedFiles(results=results, keep=keep, quarantine=quarantine)


def _check_one(job: tuple[str, str, int, bool, bool]) -> dict:
    """Worker: read + sha256 + full decode check of one file, then the degenerate-image test and
    (``want_hash``) the pHash, both from the check's own decode. Keeps bytes only when
    normalised; never returns pixels (they would cross the process boundary)."""
    from shardkit import neardup
    from shardkit.images import check_image

    path, relpath, max_pixels, strict, want_hash = job
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return {"ok": False, "reason": f"unreadable: {e.strerror or e}"}
    out = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    try:
        res = check_image(data, max_pixels=max_pixels, strict=strict, keep_pixels=True)
        if res.ok:
            degenerate = neardup.degenerate_reason(res.pixels)
            phash = neardup.phash64(res.pixels) if want_hash and not degenerate else None
    except Exception as e:  # noqa: BLE001 - a checker crash on one file must not stop the pack
        return {**out, "ok": False, "reason": f"check_failed: {type(e).__name__}: {e}"}
    if not res.ok:
        return {**out, "ok": False, "reason": res.reason}
    if degenerate and strict:
        return {**out, "ok": False, "reason": f"degenerate image (strict): {degenerate}"}
    out.update(degenerate=degenerate, phash=phash)
    out.update(ok=True, ext=res.ext, rule=res.rule, width=int(res.width), height=int(res.height),
               warnings=list(res.warnings or []))
    if res.rule != "original":
        out["data"] = bytes(res.data)
    return out


def _check_all(jobs: list, workers: int, progress: bool, desc: str = "check") -> list[dict]:
    """Runs :func:`_check_one` over ``jobs`` in input order, in ``workers`` processes.

    A process pool that loses a worker (a decoder crashing the process) raises instead of hanging:
    ``ProcessPoolExecutor`` reports ``BrokenProcessPool``, turned into a SourceError here.
    """
    results: list[dict] = []
    bar = tqdm(total=len(jobs), desc=desc, unit="file", disable=not progress)
    try:
        if workers <= 1 or len(jobs) < 2:
            for job in jobs:
                results.append(_check_one(job))
                bar.update()
            return results
        chunk = max(1, min(32, len(jobs) // (workers * 8)))
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(),
                                 initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
            for res in pool.map(_check_one, jobs, chunksize=chunk):
                results.append(res)
                bar.update()
        return results
    except BrokenProcessPool:
        raise SourceError(f"a check worker process died near file {len(results)} of {len(jobs)} "
                          f"({jobs[min(len(results), len(jobs) - 1)][0]} or one of the next "
                          "files crashed a decoder); rerun with workers=1 to pinpoint it") from None
    finally:
        bar.close()


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent(parent_pid: int) -> None:
    """Initializer of the check processes: they end when the packer (``parent_pid``) dies, even
    by SIGKILL, instead of waiting forever on the pool's queue.

    On Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (through ``ctypes``) has the kernel kill the
    worker when its parent exits; elsewhere, or if that call fails, a daemon thread polls every
    0.5 s and exits the worker once its parent changed or ``parent_pid`` is gone.
    """
    first_parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != first_parent or not _alive(parent_pid):
                    os._exit(1)  # the parent died before the prctl took effect
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid, first_parent), daemon=True,
                     name="shardkit-parent-watch").start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch_parent(parent_pid: int, first_parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != first_parent or not _alive(parent_pid):
            os._exit(1)


# ----------------------------------------------------------------------------- 4: split
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
            ``given``; :func:`shardkit.pack_given.split_fields`), plus ``method``,
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
    """Step 4 (pure): splits the accepted items with :func:`shardkit.split.assign_splits`, or
    keeps the source's given splits (:func:`shardkit.pack_given.split_mode`), and applies
    ``options.on_label_conflict``. Near-duplicates (pHash within ``options.near_threshold``
    bits, degenerate images left out) are linked (``"merge"``) or reported; ``previous``
    placements are kept.

    Raises:
        LabelError: identical bytes under different labels with policy ``"error"``.
        ConfigError: ``previous`` with a source whose given splits are kept.
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
        samples = [(items[i].group, int(label_idx[i]), results[i]["sha256"]) for i in idx]
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
                             if results[j]["sha256"] == results[i]["sha256"]})
            quarantined.append({"path": items[i].relpath, "sha256": results[i]["sha256"],
                                "size": results[i]["size"],
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
    degenerate = [{"path": items[i].relpath, "reason": results[i]["degenerate"]}
                  for i in keep if results[i].get("degenerate")]
    return SplitOutcome(plan=plan, keep=keep, quarantined=quarantined, conflicts=conflicts,
                        warnings=warnings, split_fields=fields, degenerate=degenerate)


def _near_pairs(idx: list[int], results: list[dict], options: PackOptions):
    """``(k, 3)`` int64 array of near-duplicate pairs ``(a, b, distance)``, ``a < b`` positions
    in ``idx``, over the hashed (non-degenerate) items, leaving out pairs of identical bytes
    (those are joined anyway); empty when ``near_duplicates="off"``."""
    import numpy as np

    hashed = [j for j, i in enumerate(idx) if results[i].get("phash") is not None]
    if options.near_duplicates == "off" or len(hashed) < 2:
        return np.zeros((0, 3), np.int64)
    hashes = np.array([results[idx[j]]["phash"] for j in hashed], dtype=np.uint64)
    a, b, d = neardup.near_pairs(hashes, options.near_threshold)
    pos = np.asarray(hashed, dtype=np.int64)
    pairs = np.stack([pos[a], pos[b], d], axis=1) if len(a) else np.zeros((0, 3), np.int64)
    same = [results[idx[x]]["sha256"] == results[idx[y]]["sha256"] for x, y, _ in pairs]
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
