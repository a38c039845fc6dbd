"""The summary of one :func:`shardkit.packer.run.pack` run (:class:`PackSummary`), as returned and as
printed by ``shardkit pack``, and the text helpers shared with the packer's messages."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from shardkit.humanize import count_text
from shardkit.storage.urls import join

__all__ = ["PackSummary", "printable", "reason_kind"]


@dataclass
class PackSummary:
    """What :func:`shardkit.packer.run.pack` did.

    ``splits`` maps split -> {"samples", "fraction" (achieved, 0..1), "groups", "shards",
    "class_counts" (list aligned with ``classes``)}; ``quarantine_reasons`` counts rejects by reason
    kind (text before the first ``':'`` or ``' ('``); ``ignored`` lists ``[relpath, reason]`` of
    scanner-ignored entries; ``cleaned`` the leftovers of an unfinished run removed from OUT
    before writing and ``replaced`` the files of the previous dataset removed by an overwrite
    (paths relative to OUT); ``num_with_warnings`` packed samples whose decode gave warnings
    (listed per sample in the split files' ``warnings``); ``transcoded`` packed samples stored
    transcoded, by normalisation rule (the manifest's ``normalization.transcoded``);
    ``split_method`` the assignment rule; ``near_duplicates`` the manifest's
    ``split.near_duplicates``; ``degenerate`` the packed degenerate images (``path``,
    ``reason``); ``kept_from`` the manifest's ``split.kept_from`` (``--split-from``) or None.
    """

    out: Path | str  # a local folder, or the URL of a pack into object storage
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
    transcoded: dict[str, int] = field(default_factory=dict)
    replaced: list[str] = field(default_factory=list)
    split_method: str = "hash"
    near_duplicates: dict | None = None
    degenerate: list[dict] = field(default_factory=list)
    kept_from: dict | None = None

    @classmethod
    def from_manifest(cls, out: Path | str, manifest: dict, quarantine: list[dict], *,
                      warnings: list[str], cleaned: list[str], num_with_warnings: int,
                      replaced: list[str] | None = None) -> PackSummary:
        """The summary of a pack that wrote ``manifest`` and ``quarantine`` to ``out``."""
        src, split = manifest["source"], manifest["split"]
        return cls(
            out=out, format=manifest["format"], classes=list(manifest["classes"]),
            num_files=src["num_files"], num_packed=src["num_packed"],
            num_quarantined=src["num_quarantined"], num_duplicates=src["num_duplicates"],
            num_ignored=src["num_ignored"], splits={
                name: {"samples": sm["num_samples"],
                       "fraction": split["achieved"]["samples"][name],
                       "groups": sm["num_groups"], "shards": len(sm["shards"]),
                       "class_counts": sm["class_counts"]}
                for name, sm in manifest["splits"].items()},
            quarantine_reasons=dict(Counter(reason_kind(q["reason"]) for q in quarantine)),
            ignored=[[e["path"], e["reason"]] for e in src["ignored"]],
            label_conflicts=split["label_conflicts"], warnings=warnings, cleaned=cleaned,
            num_with_warnings=num_with_warnings, replaced=list(replaced or []),
            transcoded=dict(manifest["normalization"].get("transcoded", {})),
            split_method=split.get("method", ""), near_duplicates=split.get("near_duplicates"),
            degenerate=list(src.get("degenerate", [])), kept_from=split.get("kept_from"))

    def format_text(self) -> str:
        """The human-readable summary (printed by ``shardkit pack``)."""
        lines = [f"packed {self.out} (format {self.format}, {len(self.classes)} classes)"]
        for name, s in self.splits.items():
            counts = _class_counts_text(self.classes, s["class_counts"])
            lines.append(f"  {name}: {count_text(s['samples'], 'sample')} ({s['fraction']:.3f}), "
                         f"{count_text(s['groups'], 'group')}, "
                         f"{count_text(s['shards'], 'shard')} [{counts}]")
        reasons = ", ".join(f"{r}={n}" for r, n in sorted(self.quarantine_reasons.items()))
        lines.append(f"  scanned {self.num_files} = packed {self.num_packed} + quarantined "
                     f"{self.num_quarantined}" + (f" ({reasons})" if reasons else ""))
        if self.num_quarantined:
            lines.append(f"    rejected files, one reason each: {join(self.out, 'quarantine.jsonl')}")
        rules = ", ".join(f"{r}={n}" for r, n in self.transcoded.items())
        lines.append(f"  transcoded: {sum(self.transcoded.values())} samples"
                     + (f" ({rules})" if rules else "") + "; the others are stored as the "
                     "source bytes")
        lines.append(f"  duplicates (identical bytes): {self.num_duplicates}; label conflicts: "
                     f"{len(self.label_conflicts)}; packed with decoder warnings: "
                     f"{self.num_with_warnings}; ignored entries: {self.num_ignored}")
        lines += [f"    ignored {path}: {why}" for path, why in self.ignored[:10]]
        if self.kept_from:
            lines.append(f"  split rule: placements kept from {self.kept_from['root']}, new "
                         "groups balanced toward the ratios (pass --split-from again next time "
                         "to keep these placements)")
        else:
            lines.append(f"  split rule: {self.split_method}" + {
                "hash": " (a keyed hash of each group: re-packing a grown source moves no group, "
                        "unless new identical or near-duplicate files join it to a group of a "
                        "held-out split)",
                "balanced": " (closest to the ratios; added data may move groups)"}.get(
                    self.split_method, ""))
        if self.kept_from:
            k = self.kept_from
            lines.append(f"  kept from {k['root']}: {k['kept_groups']} groups where they were, "
                         f"{len(k['moved_groups'])} moved, {k['new_groups']} new groups "
                         f"assigned, {k['gone_groups']} no longer in the source")
        near = self.near_duplicates
        if near and near["mode"] != "off":
            lines.append(f"  near-duplicates (pHash distance <= {near['threshold']}, "
                         f"{near['mode']}): {count_text(near['num_clusters'], 'cluster')} of "
                         f"{sum(len(c['paths']) for c in near['clusters'])} images, "
                         f"{near['num_across_splits']} across splits")
        elif near:
            lines.append("  near-duplicates: not searched (--near-duplicates off)")
        if self.degenerate:
            lines.append(f"  degenerate images (packed; --strict quarantines them): "
                         f"{len(self.degenerate)}")
            lines += [f"    {d['path']}: {d['reason']}" for d in self.degenerate[:10]]
            if len(self.degenerate) > 10:
                lines.append(f"    ... and {len(self.degenerate) - 10} more (manifest "
                             "source.degenerate)")
        if len(self.ignored) > 10:
            lines.append(f"    ... and {len(self.ignored) - 10} more ignored entries")
        if self.cleaned:
            shown = ", ".join(self.cleaned[:10]) + (f" and {len(self.cleaned) - 10} more"
                                                    if len(self.cleaned) > 10 else "")
            lines.append(f"  removed from OUT before writing (left by an unfinished run): {shown}")
        if self.replaced:
            lines.append(f"  replaced the previous dataset in OUT ({len(self.replaced)} of its "
                         "files overwritten or removed)")
        lines += [f"  warning: {w}" for w in self.warnings]
        return printable("\n".join(lines))


SUMMARY_CLASSES = 20
"""Per-class counts the summary line of a split shows at most (the manifest has them all)."""


def _class_counts_text(classes: list[str], counts: list[int]) -> str:
    """``daisy=29, roses=28, ...``: every class when there are at most :data:`SUMMARY_CLASSES`,
    else the first of those with samples and how many more there are, with and without."""
    pairs = list(zip(classes, counts))
    if len(pairs) <= SUMMARY_CLASSES:
        return ", ".join(f"{c}={n}" for c, n in pairs)
    shown = [(c, n) for c, n in pairs if n][:SUMMARY_CLASSES]
    empty = sum(1 for n in counts if not n)
    more = len(pairs) - len(shown) - empty
    rest = ([f"{more} more classes with samples"] if more else []) + \
        ([f"{empty} classes without samples"] if empty else [])
    return (", ".join(f"{c}={n}" for c, n in shown) + (", " if shown else "")
            + f"... and {' and '.join(rest)} (the manifest's class_counts has every count)")


def printable(text: str) -> str:
    """``text`` with lone surrogates (from file names that are not valid UTF-8) written as
    ``\\udcXX`` escapes, so printing it never raises UnicodeEncodeError."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def reason_kind(reason: str) -> str:
    """The kind of a quarantine reason: its text before the first ``':'`` or ``' ('``."""
    return reason.split(":", 1)[0].split(" (", 1)[0].strip()
