"""Read-side helpers shared by ``shardkit inspect``, ``check``, ``stats`` and ``verify``.

Everything here goes through the public contracts of docs/DESIGN.md: ``shardkit.dataset.manifest``
(``load_manifest``, ``load_index``, ``read_split_records``, ``write_manifest``),
``shardkit.formats.open_reader`` and ``shardkit.decode.get_decoder``. Per-sample metadata (path,
group, sha256) comes from ``splits/<split>.jsonl``; byte locations come from the split index.
Every failure to read the dataset is raised as a :class:`~shardkit.errors.ShardkitError` whose
one-line message names the file (the commands turn it into ``Error: <ErrorType>: ...``, exit 2).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, ManifestError, ShardCorruptError

__all__ = ["ROW_FIELDS", "load_manifest_dict", "split_names", "read_rows", "iter_sample_bytes",
           "decode_rgb", "save_manifest_dict", "is_downscaled", "packed_downscaled",
           "stored_resolution", "format_stored_resolution"]

ROW_FIELDS = ("key", "label", "group", "sha256")
"""Fields of a ``splits/<split>.jsonl`` row that the doctor commands read."""

_VERIFY_HINT = "run `shardkit verify` on the dataset to list every damaged file"


def load_manifest_dict(root: str | Path) -> dict[str, Any]:
    """The manifest of the dataset at ``root`` (a dict, schema of docs/DESIGN.md).

    Raises:
        ManifestError: ``root/manifest.json`` is missing, unreadable, not a JSON object, or of an
            unknown schema.
    """
    from shardkit.dataset.manifest import load_manifest

    return load_manifest(root)


def save_manifest_dict(root: str | Path, manifest: dict[str, Any]) -> None:
    """Rewrite ``root/manifest.json`` atomically through ``shardkit.dataset.manifest.write_manifest``."""
    from shardkit.dataset.manifest import write_manifest

    write_manifest(root, manifest)


def split_names(manifest: dict[str, Any], split: str | None = None) -> list[str]:
    """The split names to look at: all splits of the manifest, or ``[split]``.

    Raises:
        ConfigError: ``split`` is not a split of this dataset (the message lists the splits).
    """
    names = list(manifest.get("splits", {}))
    if split is None:
        return names
    if split not in names:
        raise ConfigError(f"split {split!r} is not in this dataset; expected one of {names}")
    return [split]


def read_rows(root: str | Path, split: str,
              required: Sequence[str] = ROW_FIELDS) -> list[dict[str, Any]]:
    """The rows of ``root/splits/<split>.jsonl`` (one dict per sample, in split order).

    Args:
        required: fields every row must have (default :data:`ROW_FIELDS`).

    Raises:
        ManifestError: the file is missing or unreadable, holds a line that is not JSON (a
            truncated file), or a row is not an object or lacks one of ``required`` (names the
            file and row number).
    """
    from shardkit.dataset.manifest import read_split_records

    where = f"{root}/splits/{split}.jsonl"
    rows = read_split_records(root, split)  # ManifestError naming a line that is not JSON
    for i, row in enumerate(rows, 1):
        missing = [k for k in required if k not in row] if isinstance(row, dict) \
            else ["<JSON object>"]
        if missing:
            raise ManifestError(f"{where} row {i} lacks {missing}; expected the fields of "
                                "docs/DESIGN.md (key, path, label, group, sha256, ...)")
    return rows


def iter_sample_bytes(root: str | Path, manifest: Any, split: str,
                      positions: Sequence[int] | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(position, encoded image bytes)`` for samples of ``split``, shard by shard.

    ``positions`` are indices into the split order (all samples when None); they are read grouped
    by shard and by offset, so the order of the output may differ from ``positions``. Each shard
    reader is opened once and closed after its samples are read.

    Raises:
        ConfigError: a position is outside ``[0, num_samples)``.
        ManifestError: from the index loader (missing or unreadable index).
        ShardCorruptError: a shard is missing, unreadable or does not match the index (names the
            shard and the sample key).
    """
    from shardkit.formats import open_reader
    from shardkit.dataset.manifest import load_index

    index = load_index(root, split, manifest)
    n = len(index.key)
    pos = np.arange(n) if positions is None else np.asarray(positions, dtype=np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= n):
        raise ConfigError(f"sample positions must lie in [0, {n}) for split {split!r}; "
                          f"got min {pos.min()}, max {pos.max()}")
    order = np.lexsort((np.asarray(index.offset)[pos], np.asarray(index.shard)[pos]))
    shards = manifest["splits"][split].get("shards", [])
    reader, reader_shard = None, None
    try:
        for p in pos[order]:
            shard = int(index.shard[p])
            if shard != reader_shard:
                if reader is not None:
                    reader.close()
                reader, reader_shard = open_reader(root, manifest, split, shard), shard
            key = index.key[p]
            key = key.decode("utf-8") if isinstance(key, bytes) else str(key)
            try:
                data = reader.read(key, int(index.offset[p]), int(index.size[p]))
            except OSError as exc:  # a deleted or unreadable shard file
                path = shards[shard]["path"] if shard < len(shards) else f"#{shard}"
                raise ShardCorruptError(f"shard {path} of split {split!r} cannot be read for "
                                        f"sample {key!r}: {type(exc).__name__}: {exc}; "
                                        f"{_VERIFY_HINT}") from exc
            yield int(p), bytes(data)
    finally:
        if reader is not None:
            reader.close()


_DECODERS: dict[tuple, Any] = {}


def decode_rgb(data: bytes, decoder: str = "auto", max_pixels: int | None = None) -> np.ndarray:
    """Decode encoded image bytes with the shardkit decoder registry, under ``max_pixels``
    (:func:`dataset_max_pixels`; None = the default limit).

    Returns:
        ``(H, W, 3)`` uint8 RGB array, values 0-255, C-contiguous (the decoding contract).

    Raises:
        ConfigError: unknown or unavailable decoder. DecodeError: the bytes do not decode.
    """
    dec = _DECODERS.get((decoder, max_pixels))
    if dec is None:
        from shardkit.decode import get_decoder

        dec = _DECODERS[(decoder, max_pixels)] = get_decoder(decoder, max_pixels=max_pixels)
    return dec.decode(data)


def dataset_max_pixels(manifest: dict) -> int | None:
    """The pixel limit the doctor commands decode ``manifest``'s dataset under: None, shardkit's
    default (:data:`shardkit.images.sniff.DEFAULT_MAX_PIXELS`). Never the manifest's
    ``normalization.max_pixels``: that records what pack applied, and a crafted manifest must
    not lift a reader's safety limit (see :mod:`shardkit.images.sniff`)."""
    return None


def is_downscaled(row: dict[str, Any]) -> bool:
    """Whether a split-file row was stored downscaled (``shardkit pack --max-side``): its rule
    holds the step ``downscaled`` (see ``shardkit.images.normalize.RULES``)."""
    return "downscaled" in str(row.get("rule", "original")).split("+")


def packed_downscaled(manifest: dict[str, Any]) -> bool:
    """Whether the manifest says the pack used ``--max-side``: ``normalization.max_side`` is set,
    or a ``normalization.transcoded`` rule holds ``downscaled`` (decided without the split
    files)."""
    norm = manifest.get("normalization") or {}
    return norm.get("max_side") is not None or any(
        "downscaled" in rule.split("+") for rule in (norm.get("transcoded") or {}))


def stored_resolution(manifest: dict[str, Any],
                      rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """How each split was stored with respect to ``shardkit pack --max-side N``.

    Args:
        manifest: the dataset's manifest. rows: ``{split: split-file rows}`` (:func:`read_rows`).

    Returns:
        ``{"max_side", "jpeg_quality", "max_side_from", "downscaled": {split: count},
        "num_samples": {split: count}}``. ``max_side`` (pixels) and ``jpeg_quality`` (1-100) are
        the manifest's ``normalization`` fields when recorded (``max_side_from`` ``"manifest"``);
        otherwise ``max_side`` is the largest stored longer side among downscaled rows
        (``"records"``: that is N, since each is stored with its longer side N), and None with
        ``max_side_from`` None when no row was downscaled. ``jpeg_quality`` None when unrecorded.
    """
    norm = manifest.get("normalization") or {}
    down = {s: [r for r in split_rows if is_downscaled(r)] for s, split_rows in rows.items()}
    max_side, source = norm.get("max_side"), "manifest"
    if max_side is None:
        sides = [max(int(r.get("width", 0)), int(r.get("height", 0)))
                 for split_rows in down.values() for r in split_rows]
        max_side, source = (max(sides), "records") if sides else (None, None)
    quality = norm.get("jpeg_quality") if norm.get("max_side") is not None else None
    return {"max_side": max_side, "jpeg_quality": quality, "max_side_from": source,
            "downscaled": {s: len(d) for s, d in down.items()},
            "num_samples": {s: len(r) for s, r in rows.items()}}


def format_stored_resolution(info: dict[str, Any]) -> str:
    """One line for :func:`stored_resolution`'s result, e.g. ``stored resolution: --max-side 512
    (JPEG q95): downscaled train 161/161, val 20/20`` or ``stored resolution: full (no
    --max-side)``."""
    if info["max_side"] is None:
        return "stored resolution: full (no --max-side)"
    quality = "" if info["jpeg_quality"] is None else f" (JPEG q{info['jpeg_quality']})"
    inferred = " [inferred from the records]" if info["max_side_from"] == "records" else ""
    counts = ", ".join(f"{s} {n}/{info['num_samples'][s]}" for s, n in info["downscaled"].items())
    return f"stored resolution: --max-side {info['max_side']}{quality}{inferred}: downscaled " \
           f"{counts or 'none'}"
