"""``shardkit check``: re-check a packed dataset's splits for leakage and its transforms for drift.

Findings are *errors* (the command exits 1) or *warnings* (exit 0 unless ``strict``):

- error: a group with samples in two splits; identical source bytes (sha256) in two splits;
  train/eval transform drift (see :mod:`shardkit.doctor.drift`);
- warning: near-duplicates across splits (pHash Hamming distance <= threshold, see
  :mod:`shardkit.doctor.leaks`), degenerate images (a side under 32 px, or near-constant pixels:
  blank frames, "image not found" placeholders; :func:`shardkit.images.neardup.degenerate_reason`),
  a class missing from a split, a split whose max/min class-count ratio exceeds the imbalance
  threshold; with ``augment=SPEC``: hue jitter on while the classes differ in hue
  (:func:`augment_hue_report`). ``strict=True`` turns every warning into an error.

Cost: the group and sha256 checks are dictionary passes, O(N) in the N samples of all splits. The
near-duplicate search uses the pHashes and degenerate list that ``shardkit pack`` recorded
(``phash`` in the split files, ``source.degenerate``), decoding nothing; a dataset without them
(packed before, or with ``--near-duplicates off``), or ``recompute_hashes=True``, decodes every
sample once instead (the bulk of the run time: the pHash and the degenerate test come from that
one decode). It then finds the pairs within the threshold among all
splits' hashes at once by multi-index hashing (:func:`shardkit.images.neardup.near_pairs`: exact,
sub-quadratic; ~1-3 s for a million hashes at distance 4, see benchmarks/README.md) and keeps
those whose samples lie in different splits. Degenerate images are left out of that search
(their pHashes are meaningless: every blank image hashes alike); the report lists them.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from shardkit.doctor import leaks
from shardkit.doctor.reading import (format_stored_resolution, load_manifest_dict, read_rows,
                                     stored_resolution)
from shardkit.doctor.shards import check_shards
from shardkit.errors import ConfigError, ManifestError

__all__ = ["check_dataset", "format_check_report", "check_headline",
           "write_json_report", "augment_hue_report", "HUE_SAMPLES"]

HUE_SAMPLES = 2000
"""Samples of the train split decoded for the per-class hue when the manifest holds no
``shardkit stats`` result with ``hue`` for it (the first ones: a seeded random subset)."""

log = logging.getLogger(__name__)


def check_dataset(root: str | Path, *, strict: bool = False, near_duplicates: bool = True,
                  phash_threshold: int | None = None, imbalance_threshold: float | None = None,
                  transforms: bool = True, transform_config: Any = None, transform_samples: int = 4,
                  decoder: str = "auto", seed: int = 0, progress: bool = False,
                  recompute_hashes: bool = False, augment: Any = None) -> dict[str, Any]:
    """Run every leak and drift check on the dataset at ``root``.

    Args:
        root: the packed dataset (``OUT`` of ``shardkit pack``).
        strict: treat warnings (near-duplicates, degenerate images, missing classes, imbalance)
            as errors.
        near_duplicates: run the pHash near-duplicate search and the degenerate-image test
            (decodes every sample once); when False the report says ``"near_duplicates": null``
            and ``"degenerate": null``, and a warning says the search did not run.
        phash_threshold: max Hamming distance (0-64) of a near-duplicate pair; default
            :data:`shardkit.doctor.leaks.PHASH_THRESHOLD` (4).
        imbalance_threshold: max/min class-count ratio above which a split is flagged; default
            :data:`shardkit.doctor.leaks.IMBALANCE_THRESHOLD` (10.0); must be >= 1.
        transforms: run the transform-drift check; when False a warning says it did not run.
        transform_config: a ``shardkit.transforms.TransformConfig`` for the drift check
            (default ``TransformConfig()``; see :func:`shardkit.doctor.drift.load_transform_config`
            for reading one from a YAML file or a train run's ``config.yaml``).
        transform_samples: samples used for the drift check (the first ones of ``val``, else
            ``test``, else the first non-empty split).
        decoder: decoder registry name used for pHashes.
        recompute_hashes: decode every sample for its pHash even when the pack recorded them
            (by default a split whose records all carry ``phash`` uses those, decoding
            nothing; the report's ``hashes`` says ``"stored"`` or ``"decoded"`` per split).
        seed: seed of the train-transform randomness in the drift check.
        progress: tqdm bars on stderr (pHash search and drift check).
        augment: an augmentation spec (anything :meth:`shardkit.augment.AugmentSpec.parse`
            takes): adds ``"augment"`` (:func:`augment_hue_report`) and an ``augment_hue``
            warning when its hue jitter meets classes told apart by hue; None: ``"augment"`` is
            None and nothing is decoded for it.

    Returns:
        A JSON-serialisable report: ``{"root", "ok", "strict", "thresholds", "errors": [{"check",
        "message"}], "warnings": [...], "group_overlap", "sha_overlap", "near_duplicates",
        "degenerate", "missing_classes", "imbalance", "transform", "stored_resolution",
        "augment"}`` (see
        :func:`shardkit.doctor.reading.stored_resolution` for the last, and the functions of
        :mod:`shardkit.doctor.leaks` and :mod:`shardkit.doctor.drift` for each part), where
        ``degenerate`` is ``[{"split", "key", "path", "reason"}]``, the samples left out of the
        near-duplicate search. ``ok`` is True when ``errors`` is empty.

    Raises:
        ConfigError: a threshold is out of range, or a bad ``augment`` spec.
        ShardCorruptError: a shard listed in the manifest is missing, has another size or
            cannot be opened (:func:`check_shards`, before any other check: with the hashes the
            pack recorded, or ``near_duplicates=False``, no shard is read otherwise).
        ManifestError: unreadable manifest or split file, or a ``splits/<split>.jsonl`` whose row
            count differs from the manifest's ``num_samples``.
        ShardCorruptError, DecodeError: from reading the samples.
    """
    phash_threshold, imbalance_threshold, spec = _options(phash_threshold, imbalance_threshold,
                                                          augment)
    manifest, rows = _load_checked(root)
    found = _Findings(strict)
    report: dict[str, Any] = {
        "root": str(root), "strict": bool(strict),
        "thresholds": {"phash_hamming": int(phash_threshold),
                       "imbalance_ratio": imbalance_threshold},
        "stored_resolution": stored_resolution(manifest, rows),
    }
    report.update(_split_leaks(rows, found))
    report.update(_near_duplicates(near_duplicates, root, manifest, rows, found, phash_threshold,
                                   recompute_hashes, decoder=decoder, progress=progress))
    report.update(_class_balance(rows, manifest["classes"], found, imbalance_threshold))
    report["transform"] = _transform_drift(transforms, root, manifest, found, transform_config,
                                           transform_samples, seed=seed, progress=progress)
    report["augment"] = None
    if spec is not None:
        report["augment"] = aug = augment_hue_report(root, manifest, spec, decoder=decoder,
                                                     progress=progress)
        if aug["warning"]:
            found.warn("augment_hue", aug["warning"])
    report["errors"], report["warnings"] = found.errors, found.warnings
    report["ok"] = not found.errors
    return report


class _Findings:
    """The errors and warnings of one check run, in the order found; with ``strict`` every
    warning but a "not run" note is an error."""

    def __init__(self, strict: bool):
        self.errors: list[dict[str, str]] = []
        self.warnings: list[dict[str, str]] = []
        self._warned = self.errors if strict else self.warnings

    def error(self, check: str, message: str) -> None:
        self.errors.append({"check": check, "message": message})

    def warn(self, check: str, message: str) -> None:
        self._warned.append({"check": check, "message": message})

    def not_run(self, check: str, what: str) -> None:
        """A check the caller switched off: logged, and a warning even with ``strict``."""
        log.info("%s not run (disabled by the caller)", what)
        self.warnings.append({"check": check, "message": f"{what} not run (disabled by the "
                              "caller)"})


def _options(phash_threshold: int | None, imbalance_threshold: float | None, augment: Any
             ) -> tuple[int, float, Any]:
    """The thresholds with their defaults, and the parsed augment spec (None without one): a
    bad value fails before anything is read. ConfigError otherwise."""
    phash_threshold = leaks.PHASH_THRESHOLD if phash_threshold is None else phash_threshold
    imbalance_threshold = (leaks.IMBALANCE_THRESHOLD if imbalance_threshold is None
                           else float(imbalance_threshold))
    if not imbalance_threshold >= 1.0:
        raise ConfigError(f"imbalance threshold is a max/min count ratio and must be >= 1; "
                          f"got {imbalance_threshold!r}")
    spec = None
    if augment is not None:
        from shardkit.augment import AugmentSpec

        spec = AugmentSpec.parse(augment)  # a bad spec fails before any reading
    return phash_threshold, imbalance_threshold, spec


def _load_checked(root: str | Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """``(manifest, {split: rows})``, each split file's row count checked against the manifest
    (ManifestError) and every shard against its record (:func:`check_shards`)."""
    manifest = load_manifest_dict(root)
    rows = {split: read_rows(root, split) for split in manifest["splits"]}
    for split, split_rows in rows.items():
        expected = manifest["splits"][split]["num_samples"]
        if len(split_rows) != expected:
            raise ManifestError(f"{root}/splits/{split}.jsonl has {len(split_rows)} rows, the "
                                f"manifest says {expected} (truncated or edited?); run "
                                "`shardkit verify` on the dataset to list every damaged file")
    check_shards(root, manifest)  # before any verdict: a leak check of data it cannot see
    return manifest, rows


def _split_leaks(rows: dict[str, list[dict[str, Any]]], found: _Findings) -> dict[str, Any]:
    """``group_overlap`` and ``sha_overlap`` of the report; each one an error."""
    groups = leaks.group_overlap(rows)
    for g in groups:
        found.error("group_overlap", f"group {g['group']!r} has samples in "
                    + ", ".join(f"{s} ({n})" for s, n in g["splits"].items()))
    shas = leaks.sha_overlap(rows)
    for h in shas:
        found.error("sha_overlap", f"identical bytes (sha256 {h['sha256'][:12]}...) in "
                    + ", ".join(f"{r['split']}:{r['key']} ({r['path']})" for r in h["samples"]))
    return {"group_overlap": groups, "sha_overlap": shas}


def _near_duplicates(run: bool, root: str | Path, manifest: dict[str, Any],
                     rows: dict[str, list[dict[str, Any]]], found: _Findings, threshold: int,
                     recompute: bool, *, decoder: str, progress: bool) -> dict[str, Any]:
    """``degenerate``, ``hashes`` and ``near_duplicates`` of the report (warnings): the pHashes
    the pack stored, or (``recompute``, or a split without them) decoded from the shards.
    Without ``run``: both None and a "not run" warning."""
    if not run:
        found.not_run("near_duplicates", "near-duplicate search")
        return {"near_duplicates": None, "degenerate": None}
    hashes, skip, degenerate, source = {}, {}, [], {}
    for s in rows:
        checks = None if recompute else leaks.stored_image_checks(manifest, rows[s])
        if checks is None:  # decoding reads every shard: a missing one fails there
            checks = leaks.split_image_checks(root, manifest, s, decoder=decoder,
                                              progress=progress)
            source[s] = "decoded"
        else:
            source[s] = "stored"
        hashes[s], skip[s] = checks
        degenerate += [{"split": s, "key": rows[s][pos]["key"],
                        "path": rows[s][pos].get("path"), "reason": reason}
                       for pos, reason in skip[s].items()]
    if degenerate:
        found.warn("degenerate", _degenerate_message(degenerate))
    pairs = leaks.near_duplicate_pairs(hashes, rows, threshold, skip=skip)
    for p in pairs:
        a, b = p["a"], p["b"]
        found.warn("near_duplicates", f"near-duplicate (pHash distance {p['distance']} <= "
                   f"{threshold}): {a['split']}:{a['key']} ({a['path']}) ~ "
                   f"{b['split']}:{b['key']} ({b['path']})")
    return {"degenerate": degenerate, "hashes": source, "near_duplicates": pairs}


def _transform_drift(run: bool, root: str | Path, manifest: dict[str, Any], found: _Findings,
                     config: Any, num_samples: int, *, seed: int, progress: bool
                     ) -> dict[str, Any] | None:
    """The report's ``transform`` (:func:`shardkit.doctor.drift.check_transform_drift`; each
    problem an error), or None and a "not run" warning without ``run``."""
    if not run:
        found.not_run("transform_drift", "transform drift check")
        return None
    from shardkit.doctor.drift import check_transform_drift

    drift = check_transform_drift(root, manifest, config, num_samples=num_samples, seed=seed,
                                  progress=progress)
    for problem in drift["problems"]:
        found.error("transform_drift", problem)
    return drift


def _class_balance(rows: dict[str, list[dict[str, Any]]], classes: list[str], found: _Findings,
                   imbalance_threshold: float) -> dict[str, Any]:
    """``missing_classes`` and ``imbalance`` of the report (warnings)."""
    classes = list(classes)
    counts = {s: leaks.class_counts(r, len(classes)) for s, r in rows.items()}
    missing = leaks.missing_classes(counts, classes)
    for split, names in missing.items():
        found.warn("missing_classes", f"split {split!r} has no sample of class(es) {names}")
    imbalance = {s: leaks.imbalance(c, classes) for s, c in counts.items()}
    for split, imb in imbalance.items():
        ratio = imb["ratio"]
        if ratio is not None and ratio != float("inf") and ratio > imbalance_threshold:
            found.warn("imbalance", f"split {split!r} is imbalanced: {imb['max_class']} has "
                       f"{imb['max_count']} samples, {imb['min_class']} {imb['min_count']} "
                       f"(ratio {ratio:.1f} > {imbalance_threshold:g})")
    return {"missing_classes": missing, "imbalance": imbalance}


def augment_hue_report(root: str | Path, manifest: dict[str, Any], spec: Any, *,
                       split: str | None = None, max_samples: int | None = HUE_SAMPLES,
                       decoder: str = "auto", progress: bool = False) -> dict[str, Any]:
    """Whether ``spec``'s hue jitter meets classes that differ in hue (``check --augment``).

    Hue jitter is on when ``spec.uses_hue(e)`` at epoch 0 or at ``spec.last_scheduled_epoch()``
    (a schedule moves monotonically between the two). Only then is the per-class hue read: the
    ``hue`` of ``manifest["stats"][split]`` when ``shardkit stats`` saved one, else
    :func:`shardkit.doctor.stats.class_hues` of the first ``max_samples`` samples. The warning
    is raised by :func:`shardkit.doctor.stats.hue_separates_classes` (``eta2 >= 0.06``, the class
    explains at least a medium share of the hue dispersion, and permutation ``p <= 0.01``).

    Args:
        split: the split whose classes are compared (default ``train``, else the first split).

    Returns:
        ``{"spec": str, "uses_hue": bool, "max_hue": float (the largest ``|hue|`` factor, in
        turns: the jitter shifts hue by up to ``max_hue * 360`` degrees), "split", "hue": the
        class hue stats or None (jitter off), "hue_source": "manifest" | "decoded" | None,
        "separates": bool, "warning": str or None}``.

    Raises:
        ConfigError: a bad spec; ManifestError, ShardCorruptError, DecodeError: from reading.
    """
    from shardkit.augment import AugmentSpec
    from shardkit.doctor import stats as st

    spec = AugmentSpec.parse(spec)
    epochs = sorted({0, spec.last_scheduled_epoch()})
    uses = [e for e in epochs if spec.uses_hue(e)]
    max_hue = max([_max_hue(spec, e) for e in uses], default=0.0)
    if split is None:
        split = "train" if "train" in manifest["splits"] else next(iter(manifest["splits"]))
    out = {"spec": spec.describe(), "uses_hue": bool(uses), "max_hue": max_hue, "split": split,
           "hue": None, "hue_source": None, "separates": False, "warning": None}
    if not uses:
        return out
    saved = ((manifest.get("stats") or {}).get(split) or {}).get("hue")
    if isinstance(saved, dict) and "eta2" in saved and "classes" in saved:
        out["hue"], out["hue_source"] = saved, "manifest"
    else:
        out["hue"] = st.class_hues(root, split, max_samples=max_samples, decoder=decoder,
                                   progress=progress, manifest=manifest)
        out["hue_source"] = "decoded"
    out["separates"] = st.hue_separates_classes(out["hue"])
    if out["separates"]:
        hue = out["hue"]
        named = sorted(((c["mean_hue_deg"], name) for name, c in hue["classes"].items()
                        if c["mean_hue_deg"] is not None))
        when = " and ".join(str(e) for e in uses)
        out["warning"] = (
            f"hue jitter is on (up to +/-{max_hue * 360:.0f} degrees at epoch {when}) and the "
            f"classes of split {split!r} differ in hue: mean hue "
            + ", ".join(f"{name} {deg:.0f}" for deg, name in named)
            + f" degrees (eta2 {hue['eta2']:.3f} >= {st.HUE_ETA2_THRESHOLD}, permutation p "
            f"{hue['eta2_p']:.3f}); the jitter can make one class look like another: set "
            "`hue: 0` in the color_jitter op")
    return out


def _max_hue(spec: Any, epoch: int) -> float:
    """The largest ``|hue|`` of ``spec``'s color_jitter ops at ``epoch`` (a float or a range)."""
    out = 0.0
    for name, params in spec.resolved(epoch):
        hue = params.get("hue", 0.0) if name == "color_jitter" else 0.0
        values = [hue] if isinstance(hue, (int, float)) else list(hue)
        out = max([out, *(abs(float(v)) for v in values)])
    return out


def _degenerate_message(degenerate: list[dict[str, Any]], shown: int = 10) -> str:
    listed = "; ".join(f"{d['split']}:{d['key']} ({d['path']}): {d['reason']}"
                       for d in degenerate[:shown])
    more = (f"; ... and {len(degenerate) - shown} more (the --json report lists all)"
            if len(degenerate) > shown else "")
    return (f"{len(degenerate)} degenerate image(s) (a side under 32 px or near-constant), left "
            f"out of the near-duplicate search: {listed}{more}")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_json_report(report: dict[str, Any], path: str | Path) -> Path:
    """Write ``report`` as UTF-8 JSON (an infinite ratio is written as the string ``"inf"``;
    see :func:`shardkit.dataset.manifest.json_bytes` for names that are not valid UTF-8)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from shardkit.dataset.manifest import (  # text that is not UTF-8 (file names): escaped
        json_bytes)

    path.write_bytes(json_bytes(_json_safe(report), indent=2) + b"\n")
    return path


def format_check_report(report: dict[str, Any]) -> str:
    """The report of :func:`check_dataset` as text: one line per finding, then a verdict."""
    lines = [f"shardkit check {report['root']}"]
    near = report["near_duplicates"]
    lines.append(f"  groups in two splits: {len(report['group_overlap'])}; identical bytes across "
                 f"splits: {len(report['sha_overlap'])}; near-duplicates across splits (pHash <= "
                 f"{report['thresholds']['phash_hamming']}): "
                 f"{'not run' if near is None else len(near)}; degenerate images (left out of "
                 f"the near-duplicate search): "
                 f"{'not run' if near is None else len(report.get('degenerate') or [])}")
    if report.get("stored_resolution") is not None:
        lines.append(f"  {format_stored_resolution(report['stored_resolution'])}")
    for split, imb in report["imbalance"].items():
        ratio = imb["ratio"]
        lines.append(f"  {split}: imbalance max/min = "
                     + ("-" if ratio is None else "inf" if ratio == float("inf")
                        else f"{ratio:.2f}"))
    if report["transform"] is not None:
        lines.append(f"  transforms: {report['transform']['summary']}")
    aug = report.get("augment")
    if aug is not None:
        if not aug["uses_hue"]:
            lines.append(f"  augment {aug['spec']}: hue jitter off")
        else:
            from shardkit.doctor.stats import format_class_hues

            lines.append(f"  augment {aug['spec']}: hue jitter up to +/-"
                         f"{aug['max_hue'] * 360:.0f} degrees; {aug['split']} "
                         f"({aug['hue_source']}, {aug['hue']['num_samples']} samples) "
                         f"{format_class_hues(aug['hue'])}")
    for level in ("errors", "warnings"):
        for f in report[level]:
            lines.append(f"{level[:-1].upper()} [{f['check']}] {f['message']}")
    lines.append(check_headline(report))
    return "\n".join(lines)


def check_headline(report: dict[str, Any]) -> str:
    """The verdict line: ``FAILED`` on errors, plain ``OK`` only when there is no warning either.

    Warnings (near-duplicates, missing classes, imbalance, checks not run) keep exit code 0
    without ``--strict`` but never read as a plain OK: the line says what was ruled out (shared
    groups and identical bytes) and what still needs review.
    """
    if not report["ok"]:
        return f"FAILED: {len(report['errors'])} error(s)"
    warnings = report["warnings"]
    if not warnings:
        return "OK: no leak found"
    near = sum(w["check"] == "near_duplicates" for w in warnings) if report[
        "near_duplicates"] is not None else 0
    degenerate = sum(w["check"] == "degenerate" for w in warnings)
    num_degenerate = len(report.get("degenerate") or []) if degenerate else 0
    parts = []
    if near:
        parts.append(f"{near} near-duplicate pair(s) across splits: review them "
                     "(--strict fails on them)")
    if degenerate:
        parts.append(f"{num_degenerate} degenerate image(s) (tiny or near-constant): review them "
                     "(--strict fails on them)")
    not_run = [w["check"] for w in warnings if w["message"].endswith("(disabled by the caller)")]
    others = len(warnings) - near - degenerate - len(not_run)
    if others:
        parts.append(f"{others} other warning(s) (--strict fails on them)")
    if not_run:
        parts.append("not run: " + ", ".join(not_run))
    return "NO EXACT LEAK (groups, identical bytes); " + "; ".join(parts)
