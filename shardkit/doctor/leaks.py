"""Split-leakage checks of ``shardkit check``: shared groups, identical bytes, near-duplicates,
degenerate images, missing classes and class imbalance (field case 24).

Near-duplicates use the 64-bit perceptual hash of :func:`shardkit.images.neardup.phash64` (bit for bit
``imagehash.phash``: DCT of a 32x32 grayscale thumbnail, sign of the 8x8 low-frequency block
against its median; after Zauner, "Implementation and Benchmarking of Perceptual Image Hash
Functions", 2010, and pHash.org). Two samples in different splits are reported when the Hamming
distance of their hashes is at most :data:`PHASH_THRESHOLD` (4 of 64 bits): a resized or
re-encoded copy of a photo lands at 0-2, while two unrelated photos differ in ~32 bits on
average. The pairs come from :func:`shardkit.images.neardup.near_pairs` (multi-index hashing, exact and
sub-quadratic) over every split's hashes at once. Degenerate images
(:func:`shardkit.images.neardup.degenerate_reason`: a side under 32 px, or near-constant pixels such as
blank frames and "image not found" placeholders) are left out: their pHashes all look alike.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from shardkit.doctor.reading import dataset_max_pixels, decode_rgb, iter_sample_bytes
from shardkit.errors import ConfigError
from shardkit.validate import check_int, is_int
from shardkit.images.neardup import PHASH_THRESHOLD, degenerate_reason, near_pairs, phash64

__all__ = ["PHASH_THRESHOLD", "IMBALANCE_THRESHOLD", "phash64", "group_overlap", "sha_overlap",
           "near_duplicate_pairs", "class_counts", "missing_classes", "imbalance",
           "split_phashes", "split_image_checks"]

IMBALANCE_THRESHOLD = 10.0
"""Default max/min class-count ratio above which a split is reported as extremely imbalanced."""


def _ref(split: str, row: dict[str, Any]) -> dict[str, Any]:
    return {"split": split, "key": row["key"], "path": row.get("path"), "group": row["group"]}


def group_overlap(rows: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Groups that have samples in more than one split.

    Args:
        rows: split name -> rows of ``splits/<split>.jsonl``.

    Returns:
        One dict per leaking group, sorted by group: ``{"group": g, "splits": {split: count}}``.
    """
    where: dict[str, Counter] = defaultdict(Counter)
    for split, split_rows in rows.items():
        for row in split_rows:
            where[str(row["group"])][split] += 1
    return [{"group": g, "splits": dict(sorted(c.items()))}
            for g, c in sorted(where.items()) if len(c) > 1]


def sha_overlap(rows: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Source files with identical bytes (equal sha256) in more than one split.

    Returns:
        One dict per shared hash, sorted by hash: ``{"sha256": h, "samples": [{"split", "key",
        "path", "group"}, ...]}`` listing every sample with that hash.
    """
    where: dict[str, list] = defaultdict(list)
    for split, split_rows in rows.items():
        for row in split_rows:
            where[row["sha256"]].append(_ref(split, row))
    return [{"sha256": h, "samples": refs} for h, refs in sorted(where.items())
            if len({r["split"] for r in refs}) > 1]


def split_image_checks(root: str | Path, manifest: dict[str, Any], split: str, *,
                       decoder: str = "auto", progress: bool = False
                       ) -> tuple[np.ndarray, dict[int, str]]:
    """Decode every sample of ``split`` once (from the stored shard bytes): its pHash and
    whether it is degenerate.

    Returns:
        ``(hashes, degenerate)``: ``(num_samples,)`` uint64 pHashes in split order (0 for a
        degenerate sample: its hash is not computed), and position -> reason
        (:func:`shardkit.images.neardup.degenerate_reason`) for the degenerate samples.

    Raises:
        ShardCorruptError, DecodeError: a sample cannot be read or decoded.
    """
    hashes = np.zeros(int(manifest["splits"][split]["num_samples"]), dtype=np.uint64)
    degenerate: dict[int, str] = {}
    for pos, rgb in _decoded(root, manifest, split, decoder, progress):
        reason = degenerate_reason(rgb)
        if reason is None:
            hashes[pos] = phash64(rgb)
        else:
            degenerate[pos] = reason
    return hashes, dict(sorted(degenerate.items()))


def stored_image_checks(manifest: dict[str, Any], rows: list[dict[str, Any]]
                        ) -> tuple[np.ndarray, dict[int, str]] | None:
    """The pHashes and degenerate images that ``shardkit pack`` recorded for one split (its
    ``phash`` per split record, its ``source.degenerate`` list), as
    :func:`split_image_checks` returns them, without decoding; None when the pack recorded none
    (an older dataset, or ``--near-duplicates off``)."""
    near = (manifest.get("split") or {}).get("near_duplicates") or {}
    if near.get("mode") in (None, "off") or any("phash" not in r for r in rows):
        return None
    reasons = {d["path"]: d["reason"] for d in (manifest.get("source") or {}).get("degenerate", [])}
    hashes = np.zeros(len(rows), dtype=np.uint64)
    degenerate: dict[int, str] = {}
    for pos, row in enumerate(rows):
        if row["phash"] is None:
            degenerate[pos] = reasons.get(row.get("path"), "degenerate (recorded by pack)")
        else:
            hashes[pos] = int(row["phash"], 16)
    return hashes, degenerate


def split_phashes(root: str | Path, manifest: dict[str, Any], split: str, *, decoder: str = "auto",
                  progress: bool = False) -> np.ndarray:
    """pHashes of every sample of ``split`` (degenerate ones included), decoded from the stored
    shard bytes.

    Returns:
        ``(num_samples,)`` uint64 array in split order.

    Raises:
        ShardCorruptError, DecodeError: a sample cannot be read or decoded.
    """
    out = np.zeros(int(manifest["splits"][split]["num_samples"]), dtype=np.uint64)
    for pos, rgb in _decoded(root, manifest, split, decoder, progress):
        out[pos] = phash64(rgb)
    return out


def _decoded(root, manifest: dict[str, Any], split: str, decoder: str, progress: bool):
    """``(position, (H, W, 3) uint8 RGB)`` of every sample of ``split``, decoded from the stored
    shard bytes with the dataset's pixel limit (tqdm bar ``phash <split>`` with ``progress``)."""
    limit = dataset_max_pixels(manifest)
    for pos, data in tqdm(iter_sample_bytes(root, manifest, split),
                          total=int(manifest["splits"][split]["num_samples"]),
                          desc=f"phash {split}", disable=not progress):
        yield pos, decode_rgb(data, decoder, limit)


def near_duplicate_pairs(hashes: dict[str, np.ndarray], rows: dict[str, list[dict[str, Any]]],
                         threshold: int = PHASH_THRESHOLD, *,
                         skip: dict[str, Iterable[int]] | None = None) -> list[dict[str, Any]]:
    """Pairs of samples in *different* splits whose pHashes differ in at most ``threshold`` bits.

    One :func:`shardkit.images.neardup.near_pairs` search over all splits' hashes concatenated (exact,
    sub-quadratic), keeping the pairs whose samples lie in different splits. Pairs of
    byte-identical files (equal sha256) are left out: :func:`sha_overlap` reports them.

    Args:
        hashes: split -> ``(n,)`` uint64 pHashes in split order (:func:`split_image_checks`).
        rows: split -> jsonl rows in the same order.
        threshold: max Hamming distance, 0-64.
        skip: split -> positions to leave out of the search (degenerate images).

    Returns:
        ``[{"distance": d, "a": ref, "b": ref}, ...]`` sorted by distance then keys, where a ref
        is ``{"split", "key", "path", "group"}`` and ``a`` comes from the earlier split in
        ``hashes`` order.

    Raises:
        ConfigError: ``threshold`` outside 0-64, or a hash array and its rows differ in length.
    """
    threshold = check_int("threshold", threshold, 0, 64, message="near-duplicate threshold "
                          "must be a Hamming distance in 0-64; got {value!r}")
    names = list(hashes)
    where_split, where_pos, parts = [], [], []
    for s, name in enumerate(names):
        h = np.asarray(hashes[name], np.uint64)
        if len(h) != len(rows[name]):
            raise ConfigError(f"split {name!r}: {len(h)} hashes but {len(rows[name])} rows")
        keep = np.ones(len(h), bool)
        keep[list((skip or {}).get(name, ()))] = False
        pos = np.flatnonzero(keep)
        parts.append(h[pos])
        where_pos.append(pos)
        where_split.append(np.full(pos.size, s))
    if not parts:
        return []
    split_of, pos_of = np.concatenate(where_split), np.concatenate(where_pos)
    i, j, d = near_pairs(np.concatenate(parts), int(threshold))
    across = split_of[i] != split_of[j]  # i < j: i's split comes first in ``hashes`` order
    pairs = []
    for x, y, dist in zip(i[across], j[across], d[across]):
        sa, sb = names[split_of[x]], names[split_of[y]]
        ra, rb = rows[sa][pos_of[x]], rows[sb][pos_of[y]]
        if ra["sha256"] != rb["sha256"]:
            pairs.append({"distance": int(dist), "a": _ref(sa, ra), "b": _ref(sb, rb)})
    pairs.sort(key=lambda p: (p["distance"], p["a"]["key"], p["b"]["key"]))
    return pairs


def class_counts(rows: Iterable[dict[str, Any]], num_classes: int) -> np.ndarray:
    """Samples per class, ``(num_classes,)`` int64, from jsonl rows.

    Raises:
        ConfigError: a row's label is outside ``[0, num_classes)`` (names the key).
    """
    counts = np.zeros(num_classes, dtype=np.int64)
    for row in rows:
        label = row["label"]
        if not is_int(label) or not 0 <= label < num_classes:
            raise ConfigError(f"sample {row['key']!r} has label {label!r}; expected an int in "
                              f"[0, {num_classes})")
        counts[label] += 1
    return counts


def missing_classes(counts: dict[str, np.ndarray], classes: list[str]) -> dict[str, list[str]]:
    """Split -> names of the classes with no sample in it (only splits missing any)."""
    return {split: [classes[i] for i in np.flatnonzero(c == 0)]
            for split, c in counts.items() if (c == 0).any()}


def imbalance(counts: np.ndarray, classes: list[str]) -> dict[str, Any]:
    """Class-imbalance summary of one split.

    Returns:
        ``{"ratio": max/min (float; inf when a class has 0 samples; None for an empty split),
        "max_class", "max_count", "min_class", "min_count"}``.
    """
    if counts.sum() == 0:
        return {"ratio": None, "max_class": None, "max_count": 0, "min_class": None, "min_count": 0}
    hi, lo = int(np.argmax(counts)), int(np.argmin(counts))
    ratio = float("inf") if counts[lo] == 0 else float(counts[hi] / counts[lo])
    return {"ratio": ratio, "max_class": classes[hi], "max_count": int(counts[hi]),
            "min_class": classes[lo], "min_count": int(counts[lo])}
