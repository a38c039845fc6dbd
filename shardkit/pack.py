"""The packer: scan -> check -> split -> write shards -> split files -> manifest, and ``shardkit pack``.

Steps of :func:`pack` (on-disk layout and manifest schema: ``docs/DESIGN.md``):

1. **Scan** (:mod:`shardkit.scan`) an ImageFolder tree or a ``.csv`` list, then apply the group rule
   (``group_by`` regex on the relative path, or ``metadata`` CSV + ``group_column``; a CSV list's own
   ``group`` column counts as a rule). Without a rule every file is its own group and the summary
   warns about leakage of near-duplicates. Files the rule gives no group are checked (step 3)
   first: those that are not images are quarantined with that reason like any reject; real images
   without a group raise the rule's error (listing them) before the rest is checked. Entries the
   scanner ignores (hidden/system files, files beside the class folders, empty class folders) are
   listed with their reason in ``manifest.source.ignored``.
2. **Labels** are resolved through :class:`shardkit.labels.LabelMap`; all unknown names are reported
   at once (:class:`~shardkit.errors.UnknownLabelError`) before any file is read.
3. **Check** every file: read, sha256, full decode (:func:`shardkit.images.check_image`), in a
   ``multiprocessing`` pool of ``workers`` processes (ordered ``imap``, so the result does not depend
   on ``workers``). Rejects go to ``OUT/quarantine.jsonl`` (``path``, ``reason``, ``sha256``, ``size``).
4. **Split** (:func:`shardkit.split.assign_splits`): group-atomic after dedup, stratified by class.
   Identical bytes under different labels: ``on_label_conflict="error"`` (default) raises
   :class:`~shardkit.errors.LabelError` listing the files; ``"quarantine"`` moves every copy to the
   quarantine (reason ``label_conflict``); ``"keep"`` packs them all (one split) and reports them.
5. **Output folder** (touched only now, so a bad option or source changes nothing on disk).
   ``OUT/manifest.json`` present -> :class:`~shardkit.errors.OutputExistsError` (checked first
   thing, too) unless ``overwrite``. Otherwise shardkit's own names (``manifest.json`` first, then
   ``shards/``, ``splits/``, ``quarantine.jsonl``) are deleted: a folder without a manifest holds the
   remains of a killed run (temporary and finished-but-unlisted shards), and the job is redone.
   Other files in OUT are left alone.
6. **Write**: each split is shuffled with a generator seeded by ``(seed, split position, crc32 of
   the name)`` so shards are not class-sorted (field case 7); keys are ``f"{split}_{i:08d}"``;
   shards go through :class:`shardkit.formats.ShardSink` (temp name, fsync, atomic rename; field
   case 5). Stored bytes are the source bytes (re-read and re-hashed) unless ``check_image``
   normalised them (``rule`` != ``"original"``).
7. ``splits/<split>.jsonl`` + ``.index.npz``, then ``manifest.json`` **last**. The invariant
   ``scanned == packed + quarantined`` is checked (raises :class:`PackInvariantError`).
   ``split.group_to_split`` is null when there is no group rule (each file its own group; the
   per-sample ``group`` in the split files says the same without a manifest entry per file).
   ``split.warnings`` (and the summary) also name classes without samples in a split and a
   dataset with fewer than two classes.

File names that are not valid UTF-8 (read as str with lone surrogates, Python's surrogateescape)
are packed: the bytes are read by path, keys do not depend on names, ``path`` metadata keeps the
name as a ``\\udcXX`` JSON escape (``os.fsencode`` of the loaded str gives the original bytes), and
the printed summary shows such names with backslash escapes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import shutil
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np
from tqdm import tqdm

from shardkit import __version__
from shardkit.errors import ConfigError, LabelError, OutputExistsError, ShardkitError, SourceError
from shardkit.split import SplitPlan, assign_splits, parse_split_spec, validate_ratios

__all__ = ["pack", "PackSummary", "PackInvariantError", "pack_command", "parse_size",
           "LABEL_CONFLICT_POLICIES", "DEFAULT_SHARD_BYTES"]

LABEL_CONFLICT_POLICIES = ("error", "quarantine", "keep")
DEFAULT_SHARD_BYTES = 256 << 20
"""Rollover size when neither ``shard_samples`` nor ``shard_bytes`` is given (256 MiB): big enough
that per-shard overhead vanishes, small enough that a writer buffering a shard (HDF5) stays modest
and a split has several shards to spread over loader workers."""
QUARANTINE_NAME = "quarantine.jsonl"
_OWNED = ("manifest.json", "shards", "splits", QUARANTINE_NAME)


class PackInvariantError(ShardkitError):
    """The packer's own bookkeeping does not add up (scanned != packed + quarantined); a bug."""


@dataclass
class PackSummary:
    """What :func:`pack` did.

    ``splits`` maps split -> {"samples", "fraction" (achieved, 0..1), "groups", "shards",
    "class_counts" (list aligned with ``classes``)}; ``quarantine_reasons`` counts rejects by reason
    kind (text before the first ``':'`` or ``' ('``); ``ignored`` lists ``[relpath, reason]`` of
    scanner-ignored entries; ``cleaned`` what was removed from OUT before writing;
    ``num_with_warnings`` packed samples whose decode gave warnings (listed per sample in the
    split files' ``warnings``).
    """

    out: Path
    format: str
    classes: list[str]
    num_files: int
    num_packed: int
    num_quarantined: int
    num_duplicates: int
    num_ignored: int
    splits: dict[str, dict]
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    ignored: list = field(default_factory=list)
    label_conflicts: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    num_with_warnings: int = 0

    def format_text(self) -> str:
        """The human-readable summary printed at the end of a pack."""
        lines = [f"packed {self.out} (format {self.format}, {len(self.classes)} classes)"]
        for name, s in self.splits.items():
            counts = ", ".join(f"{c}={n}" for c, n in zip(self.classes, s["class_counts"]))
            lines.append(f"  {name}: {s['samples']} samples ({s['fraction']:.3f}), {s['groups']} "
                         f"groups, {s['shards']} shards [{counts}]")
        reasons = ", ".join(f"{r}={n}" for r, n in sorted(self.quarantine_reasons.items()))
        lines.append(f"  scanned {self.num_files} = packed {self.num_packed} + quarantined "
                     f"{self.num_quarantined}" + (f" ({reasons})" if reasons else ""))
        lines.append(f"  duplicates (identical bytes): {self.num_duplicates}; label conflicts: "
                     f"{len(self.label_conflicts)}; packed with decoder warnings: "
                     f"{self.num_with_warnings}; ignored entries: {self.num_ignored}")
        lines += [f"    ignored {path}: {why}" for path, why in self.ignored[:10]]
        if len(self.ignored) > 10:
            lines.append(f"    ... and {len(self.ignored) - 10} more ignored entries")
        lines += [f"  warning: {w}" for w in self.warnings]
        return _printable("\n".join(lines))


def _printable(text: str) -> str:
    """``text`` with lone surrogates (from file names that are not valid UTF-8) written as
    ``\\udcXX`` escapes, so printing it never raises UnicodeEncodeError."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# ----------------------------------------------------------------------------- helpers
def parse_size(text: str | int | None) -> int | None:
    """Parses a byte size: ``123``, ``"64MB"`` (10^6), ``"64MiB"`` (2^20), ``"1.5GB"``, ``"512k"``.

    Units (case-insensitive): B, K/KB, M/MB, G/GB, T/TB (powers of 1000); KiB, MiB, GiB, TiB
    (powers of 1024). Returns an int >= 1 or None for None. Raises ConfigError naming the text.
    """
    if text is None or isinstance(text, int):
        if isinstance(text, int) and text < 1:
            raise ConfigError(f"size {text} must be >= 1 byte")
        return text
    s = str(text).strip().lower().replace(" ", "")
    units = {"tib": 1 << 40, "gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "tb": 10**12,
             "gb": 10**9, "mb": 10**6, "kb": 10**3, "t": 10**12, "g": 10**9, "m": 10**6,
             "k": 10**3, "b": 1}
    for unit, mult in units.items():
        if s.endswith(unit):
            s, factor = s[: -len(unit)], mult
            break
    else:
        factor = 1
    try:
        value = int(float(s) * factor)
    except (ValueError, OverflowError):
        raise ConfigError(f"size {text!r} is not a size; expected e.g. 64MB, 512MiB or 1000000") from None
    if value < 1:
        raise ConfigError(f"size {text!r} must be >= 1 byte")
    return value


def _check_one(job: tuple[str, str, int, bool]) -> dict:
    """Worker: read + sha256 + full decode check of one file. Keeps bytes only when normalised."""
    from shardkit.images import check_image

    path, relpath, max_pixels, strict = job
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return {"ok": False, "reason": f"unreadable: {e.strerror or e}"}
    out = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    try:
        res = check_image(data, max_pixels=max_pixels, strict=strict)
    except Exception as e:  # noqa: BLE001 - a checker crash on one file must not stop the pack
        return {**out, "ok": False, "reason": f"check_failed: {type(e).__name__}: {e}"}
    if not res.ok:
        return {**out, "ok": False, "reason": res.reason}
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
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context()) as pool:
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


def _prepare_out(out: Path, overwrite: bool) -> list[str]:
    """Applies the crash-safety rules to OUT; returns what was removed."""
    if (out / "manifest.json").exists() and not overwrite:
        raise OutputExistsError(f"{out} already holds a packed dataset (manifest.json); "
                                "pass --overwrite (overwrite=True) to replace it")
    removed = []
    for name in _OWNED:  # manifest first: from here on no reader takes OUT as finished
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
            removed.append(name + "/")
        elif p.exists():
            p.unlink()
            removed.append(name)
    for p in out.glob(".*.tmp") if out.is_dir() else []:
        p.unlink()
        removed.append(p.name)
    out.mkdir(parents=True, exist_ok=True)
    return removed


def _scan(src: Path, group_by, metadata, group_column):
    from shardkit import scan

    if metadata is not None and group_column is None:
        raise ConfigError(f"--metadata {metadata} needs --group-column (which column holds the group)")
    if group_column is not None and metadata is None:
        raise ConfigError(f"--group-column {group_column!r} needs --metadata CSV")
    if group_by is not None and group_column is not None:
        raise ConfigError("use either --group-by REGEX or --metadata/--group-column, not both")
    if src.is_file() and src.suffix.lower() == ".csv":
        result = scan.scan_csv(src)
    elif src.is_dir():
        result = scan.scan_folder(src)
    else:
        raise SourceError(f"source {src} is neither a folder nor a .csv file")
    items = list(result.items)
    grouped = unmatched = None
    group_error = None
    if group_by is not None:
        grouped, unmatched = scan.match_group_regex(items, group_by)
        rule = {"kind": "regex", "regex": group_by}
        group_error = lambda rels: scan.unmatched_regex_error(group_by, rels)  # noqa: E731
    elif group_column is not None:
        grouped, unmatched = scan.match_group_metadata(items, metadata, group_column)
        rule = {"kind": "column", "csv": str(Path(metadata).resolve()), "column": group_column}
        group_error = lambda rels: scan.lacking_metadata_error(metadata, group_column, rels)  # noqa: E731
    elif any(it.group for it in items):  # a CSV list with its own group column
        rule = {"kind": "column", "csv": str(src), "column": "group"}
    else:
        rule = {"kind": "none"}
    ungrouped: list[int] = []
    if grouped is not None:
        # a file the rule gives no group is not an error yet: the packer first checks whether it
        # is an image at all (a notes.txt is quarantined as "not an image", not a group error)
        by_rel = {it.relpath: it for it in grouped}
        ungrouped = [i for i, it in enumerate(items) if it.relpath not in by_rel]
        items = [by_rel.get(it.relpath, dataclasses.replace(it, group=None)) for it in items]
    else:
        # no group: the file is its own group (the summary warns about leakage)
        items = [it if it.group else dataclasses.replace(it, group=it.relpath) for it in items]
    return (items, list(result.ignored), list(result.missing), result.kind, result.root, rule,
            ungrouped, group_error)


def _write_one(sink, key: str, it, res: dict, label: int, bar) -> dict:
    """Stores one checked sample through ``sink``; returns its split record (docs/DESIGN.md)."""
    data = res.get("data")
    if data is None:  # stored as the original bytes: re-read, and make sure they did not change
        data = Path(it.path).read_bytes()
        if hashlib.sha256(data).hexdigest() != res["sha256"]:
            raise SourceError(f"{it.path} changed while packing (its sha256 differs from the "
                              "checked file); rerun the pack")
    shard_idx, offset = sink.add(key, data, res["ext"], int(label))
    bar.update()
    return {"key": key, "path": it.relpath, "label": int(label), "group": it.group,
            "sha256": res["sha256"], "shard": shard_idx, "offset": int(offset), "size": len(data),
            "ext": res["ext"], "rule": res["rule"], "width": res["width"], "height": res["height"],
            "warnings": res["warnings"]}


def _class_warnings(classes, split_manifest: dict[str, dict]) -> list[str]:
    """Warnings about what was packed: a class without samples in a (non-empty) split, and a
    dataset with fewer than two classes that have samples."""
    out = []
    for name, sm in split_manifest.items():
        if sm["num_samples"]:  # an empty split has its own warning from the splitter
            out += [f"class {c!r} has no samples in split {name!r}"
                    for c, n in zip(classes, sm["class_counts"]) if n == 0]
    totals = [sum(sm["class_counts"][k] for sm in split_manifest.values())
              for k in range(len(classes))]
    with_samples = [c for c, n in zip(classes, totals) if n]
    if len(with_samples) < 2:
        head = "only one class" if with_samples else "no class has packed samples"
        out.append(f"{head}: classification needs at least 2 (classes with packed samples: "
                   f"{with_samples} of {len(classes)} in the label map)")
    return out


def _reason_kind(reason: str) -> str:
    """The kind of a quarantine reason: its text before the first ``':'`` or ``' ('``."""
    return reason.split(":", 1)[0].split(" (", 1)[0].strip()


# ----------------------------------------------------------------------------- pack
def pack(src, out, *, format: str = "wds", split: Mapping[str, float] | str | None = None,
         seed: int = 0, group_by: str | None = None, metadata=None, group_column: str | None = None,
         labels=None, shard_samples: int | None = None, shard_bytes: int | str | None = None,
         workers: int = 1, strict: bool = False, max_pixels: int | None = None,
         overwrite: bool = False, progress: bool = True, wds_cls: bool = False,
         on_label_conflict: str = "error", fail_fast: bool = False,
         writer_options: dict | None = None) -> PackSummary:
    """Packs an ImageFolder tree or a ``.csv`` list into shards with leak-free split manifests.

    Args:
        src: folder (``<class>/<file>``) or ``.csv`` list (see :func:`shardkit.scan.scan_csv`).
        out: output folder (layout in ``docs/DESIGN.md``).
        format: ``"wds"`` (tar), ``"lmdb"`` or ``"hdf5"``.
        split: ``{name: fraction}`` or a spec ``"train=0.8,val=0.1,test=0.1"`` (the default).
        seed: seeds the split tie-break and the per-split shuffle.
        group_by: regex on the relative path; group = first capture group (or the whole match).
        metadata, group_column: CSV with ``path`` and the group column.
        labels: LabelMap YAML (classes + aliases); default: the sorted folder names.
        shard_samples, shard_bytes: rollover limits (bytes: int or ``"64MB"``, see :func:`parse_size`);
            with neither given, shards roll over at :data:`DEFAULT_SHARD_BYTES`.
        workers: check processes (>= 1). strict: reject images with decoder warnings.
        max_pixels: pixel limit of ``check_image`` (default ``images.DEFAULT_MAX_PIXELS``).
        overwrite: replace a finished dataset in ``out``. progress: tqdm bars + printed summary.
        wds_cls: also write ``<key>.cls`` tar members. on_label_conflict: one of
            :data:`LABEL_CONFLICT_POLICIES`. fail_fast: after the check pass, raise on the first
            rejected file (in scan order) instead of quarantining; nothing is written then.
        writer_options: extra keyword arguments of the format's Writer (e.g. lmdb ``initial_map_size``).

    Returns:
        a :class:`PackSummary`.

    Raises:
        ConfigError, SplitError: bad options. SourceError: unusable source, or a reject with
        ``fail_fast``. UnknownLabelError / LabelError: unknown labels / label conflicts.
        OutputExistsError: ``out`` holds a finished dataset and ``overwrite`` is False.
    """
    from shardkit import formats, images, labels as labels_mod, manifest as manifest_mod

    src, out = Path(src).resolve(), Path(out).resolve()
    formats.get_format(format)
    ratios = (parse_split_spec(split) if isinstance(split, str) else
              validate_ratios(split or {"train": 0.8, "val": 0.1, "test": 0.1}))
    if on_label_conflict not in LABEL_CONFLICT_POLICIES:
        raise ConfigError(f"on_label_conflict={on_label_conflict!r}; expected one of "
                          f"{LABEL_CONFLICT_POLICIES}")
    if shard_samples is not None and int(shard_samples) < 1:
        raise ConfigError(f"shard_samples={shard_samples}; expected an integer >= 1")
    if int(workers) < 1:
        raise ConfigError(f"workers={workers}; expected an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r}; expected an integer >= 0")
    shard_bytes = parse_size(shard_bytes)
    if shard_samples is None and shard_bytes is None:
        shard_bytes = DEFAULT_SHARD_BYTES
    max_pixels = images.DEFAULT_MAX_PIXELS if max_pixels is None else int(max_pixels)
    if max_pixels < 1:
        raise ConfigError(f"max_pixels={max_pixels}; expected a pixel count >= 1")
    if (out / "manifest.json").exists() and not overwrite:  # fail before the long scan
        _prepare_out(out, overwrite)
    if src.is_dir() and (out == src or src in out.parents):
        raise ConfigError(f"output {out} lies inside the source {src}; choose a folder outside it")

    items, ignored, missing, kind, root, group_rule, ungrouped, group_error = _scan(
        src, group_by, metadata, group_column)
    if not items and not missing:
        raise SourceError(f"no image files found in {src}")
    label_map = (labels_mod.LabelMap.from_yaml(labels) if labels is not None else
                 labels_mod.LabelMap.from_names(sorted({it.label for it in items})))
    name_to_idx = label_map.resolve_all([it.label for it in items])  # all unknowns at once
    label_idx = [name_to_idx[it.label] for it in items]

    jobs = [(str(it.path), it.relpath, max_pixels, bool(strict)) for it in items]
    results: list = [None] * len(items)
    if ungrouped:
        # files the group rule gives no group are checked first: those that fail the image check
        # are quarantined below with their real reason; a real image without a group is an error,
        # raised before the long check of everything else
        for i, res in zip(ungrouped, _check_all([jobs[i] for i in ungrouped], int(workers),
                                                progress, desc="check (no group)")):
            results[i] = res
        images_without_group = [items[i].relpath for i in ungrouped if results[i]["ok"]]
        if images_without_group:
            raise group_error(images_without_group)
    rest = [i for i, res in enumerate(results) if res is None]
    for i, res in zip(rest, _check_all([jobs[i] for i in rest], int(workers), progress)):
        results[i] = res
    quarantine = [{"path": m.relpath, "reason": "file not found"} for m in missing]
    keep: list[int] = []
    for i, (it, res) in enumerate(zip(items, results)):
        if res["ok"]:
            keep.append(i)
            continue
        entry = {"path": it.relpath, "reason": res["reason"]}
        entry.update({k: res[k] for k in ("sha256", "size") if k in res})
        quarantine.append(entry)
        if fail_fast:
            raise SourceError(f"{it.path}: rejected ({res['reason']}); fail_fast is on, nothing "
                              "was written")

    warnings: list[str] = []

    def plan_for(idx):
        return assign_splits([(items[i].group, int(label_idx[i]), results[i]["sha256"]) for i in idx],
                             ratios, seed=seed)

    plan: SplitPlan = plan_for(keep)
    conflicts = [{"sha256": c.sha256, "labels": [label_map.classes[k] for k in c.labels],
                  "paths": [items[keep[j]].relpath for j in c.indices]} for c in plan.label_conflicts]
    if conflicts and on_label_conflict == "error":
        listing = "; ".join(f"{c['paths']} labelled {c['labels']}" for c in conflicts[:10])
        raise LabelError(f"{len(conflicts)} set(s) of identical bytes carry different labels: "
                         f"{listing}. Fix the labels, or pass --on-label-conflict quarantine|keep")
    if conflicts and on_label_conflict == "quarantine":
        bad = {keep[j] for c in plan.label_conflicts for j in c.indices}
        for i in sorted(bad):
            others = sorted({label_map.classes[label_idx[j]] for j in bad
                             if results[j]["sha256"] == results[i]["sha256"]})
            quarantine.append({"path": items[i].relpath, "sha256": results[i]["sha256"],
                               "size": results[i]["size"],
                               "reason": f"label_conflict: identical bytes labelled {others}"})
        keep = [i for i in keep if i not in bad]
        plan = plan_for(keep)
    warnings += plan.warnings
    if group_rule["kind"] == "none":
        warnings.append("no group rule (--group-by or --metadata/--group-column): every file is its "
                        "own group, so near-duplicates (same subject, burst shots) can leak across splits")
    cleaned = _prepare_out(out, overwrite)  # nothing in OUT is touched before this point
    manifest_mod.atomic_write_bytes(out / QUARANTINE_NAME, b"".join(manifest_mod.json_bytes(q, sort_keys=True) + b"\n" for q in quarantine))

    if writer_options is None:
        writer_options = {"wds_cls": True} if (format == "wds" and wds_cls) else {}
    split_manifest: dict[str, dict] = {}
    bar = tqdm(total=len(keep), desc="write", unit="file", disable=not progress)
    for pos, name in enumerate(plan.names):
        members = [keep[j] for j in plan.indices(name)]
        rng = np.random.default_rng([int(seed), pos, zlib.crc32(name.encode())])
        members = [members[int(k)] for k in rng.permutation(len(members))]  # case 7
        sink = formats.ShardSink(out, name, format, max_samples=shard_samples, max_bytes=shard_bytes,
                                 writer_options=writer_options)
        try:
            records = [_write_one(sink, f"{name}_{n:08d}", items[i], results[i], label_idx[i], bar)
                       for n, i in enumerate(members)]
            shards = sink.close()
        except BaseException:
            sink.abort()
            bar.close()
            raise
        manifest_mod.write_split_files(out, name, records)
        split_manifest[name] = {
            "num_samples": len(records),
            "class_counts": np.bincount([r["label"] for r in records],
                                        minlength=len(label_map.classes)).tolist(),
            "num_groups": len({items[i].group for i in members}), "shards": shards}
    bar.close()

    num_packed = sum(s["num_samples"] for s in split_manifest.values())
    num_files = len(items) + len(missing)
    if num_files != num_packed + len(quarantine):
        raise PackInvariantError(f"scanned {num_files} != packed {num_packed} + quarantined "
                                 f"{len(quarantine)}")
    class_warnings = _class_warnings(label_map.classes, split_manifest)
    warnings += class_warnings
    manifest = {
        "format": format,
        "created_by": f"shardkit {__version__}",
        "classes": list(label_map.classes),
        "label_aliases": dict(label_map.aliases),
        "split": {"seed": int(seed), "ratios": ratios, "group_rule": group_rule,
                  "group_to_split": plan.group_to_split if group_rule["kind"] != "none" else None,
                  "tolerance": plan.tolerance,
                  "achieved": {"samples": plan.achieved,
                               "classes": {s: {label_map.classes[c]: round(v, 6) for c, v in cv.items()}
                                           for s, cv in plan.class_achieved.items()}},
                  "merged_groups": plan.merged_groups, "label_conflicts": conflicts,
                  "warnings": plan.warnings + class_warnings},
        "source": {"root": str(root), "kind": kind, "num_files": num_files, "num_packed": num_packed,
                   "num_quarantined": len(quarantine), "num_duplicates": plan.num_duplicates,
                   "num_ignored": len(ignored),
                   "ignored": [{"path": path, "reason": why} for path, why in ignored]},
        "normalization": {"rules": dict(images.RULES), "max_pixels": max_pixels,
                          "strict": bool(strict)},
        "splits": split_manifest,
    }
    manifest_mod.write_manifest(out, manifest)  # LAST: its presence means "finished"
    summary = PackSummary(
        out=out, format=format, classes=list(label_map.classes), num_files=num_files,
        num_packed=num_packed, num_quarantined=len(quarantine), num_duplicates=plan.num_duplicates,
        num_ignored=len(ignored), splits={
            name: {"samples": sm["num_samples"], "fraction": plan.achieved[name],
                   "groups": sm["num_groups"], "shards": len(sm["shards"]),
                   "class_counts": sm["class_counts"]} for name, sm in split_manifest.items()},
        quarantine_reasons=dict(Counter(_reason_kind(q["reason"]) for q in quarantine)),
        ignored=[list(e) for e in ignored], label_conflicts=conflicts, warnings=warnings,
        cleaned=cleaned, num_with_warnings=sum(bool(results[i]["warnings"]) for i in keep))
    if progress:
        print(summary.format_text())
    return summary


# ----------------------------------------------------------------------------- CLI
import click  # noqa: E402

from shardkit.formats import FORMATS  # noqa: E402  (the registry decides the --format choices)


@click.command("pack")
@click.argument("src", type=click.Path(exists=True, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), default="wds",
              show_default=True, help="Shard format.")
@click.option("--split", "split_spec", default="train=0.8,val=0.1,test=0.1", show_default=True,
              help="Split names and sample fractions.")
@click.option("--seed", type=int, default=0, show_default=True, help="Split tie-break and shuffle seed.")
@click.option("--group-by", metavar="REGEX", help="Group = first capture group of REGEX on the path.")
@click.option("--metadata", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CSV with a 'path' column and the group column.")
@click.option("--group-column", metavar="COL", help="Column of --metadata holding the group.")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="LABELS.yaml: classes and aliases.")
@click.option("--shard-samples", type=click.IntRange(min=1), metavar="N", help="Samples per shard.")
@click.option("--shard-bytes", metavar="SIZE", help="Bytes per shard, e.g. 64MB or 512MiB [default: 256MiB when neither limit is set].")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Check processes.")
@click.option("--strict", is_flag=True, help="Reject images with decoder warnings.")
@click.option("--max-pixels", type=click.IntRange(min=1), metavar="N", help="Pixel limit per image.")
@click.option("--overwrite", is_flag=True, help="Replace a finished dataset in OUT.")
@click.option("--wds-cls", is_flag=True, help="Also write '<key>.cls' tar members (wds).")
@click.option("--on-label-conflict", type=click.Choice(LABEL_CONFLICT_POLICIES), default="error",
              show_default=True, help="Identical bytes under different labels.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first rejected file.")
@click.option("--no-progress", is_flag=True, help="No progress bars (the summary is still printed).")
def pack_command(src, out, fmt, split_spec, seed, group_by, metadata, group_column, labels,
                 shard_samples, shard_bytes, workers, strict, max_pixels, overwrite, wds_cls,
                 on_label_conflict, fail_fast, no_progress):
    """Pack SRC (an ImageFolder tree or a .csv list) into shards in OUT."""
    try:
        summary = pack(src, out, format=fmt, split=split_spec, seed=seed, group_by=group_by,
                       metadata=metadata, group_column=group_column, labels=labels,
                       shard_samples=shard_samples, shard_bytes=shard_bytes, workers=workers,
                       strict=strict, max_pixels=max_pixels, overwrite=overwrite,
                       progress=not no_progress, wds_cls=wds_cls,
                       on_label_conflict=on_label_conflict, fail_fast=fail_fast)
    except ShardkitError as e:
        raise click.ClickException(_printable(str(e))) from None
    except OSError as e:  # unwritable OUT, full disk, unreadable CSV: no traceback either
        raise click.ClickException(_printable(f"{type(e).__name__}: {e}")) from None
    if no_progress:
        click.echo(summary.format_text())
