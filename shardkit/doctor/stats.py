"""``shardkit stats``: per-channel mean and std of a split's decoded pixels, saved in the manifest.

The statistics are taken over every pixel of every sample (each pixel weighs the same, so large
images weigh more than small ones), on the decoded uint8 RGB pixels *before* any resize, crop or
normalisation, scaled to 0-1. The std is the population std (ddof = 0). They are the *stored*
pixels: in a dataset packed with ``--max-side N`` the samples stored downscaled count at their
stored size (the result says how many were read, and N).

Accumulation is exact: per channel the pixel count, the sum and the sum of squares are kept as
Python integers (unbounded), so the result does not depend on the order of the samples and
suffers no float cancellation; it is converted to float64 once, at the end
(var = (n * sum_sq - sum**2) / n**2).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from shardkit.doctor.reading import (dataset_max_pixels, decode_rgb, is_downscaled,
                                     iter_sample_bytes, load_manifest_dict, packed_downscaled,
                                     read_rows, save_manifest_dict, split_names,
                                     stored_resolution)
from shardkit.errors import ConfigError

__all__ = ["ChannelMoments", "compute_stats"]


class ChannelMoments:
    """Exact streaming per-channel moments of uint8 RGB images.

    ``update(img)`` takes an ``(H, W, 3)`` uint8 array (RGB, 0-255); ``mean`` / ``std`` return
    3-tuples of floats on the 0-1 scale, RGB order.
    """

    def __init__(self) -> None:
        self.num_pixels = 0
        self.num_images = 0
        self._sum = [0, 0, 0]
        self._sum_sq = [0, 0, 0]

    def update(self, img: np.ndarray) -> None:
        """Add one image.

        Raises:
            ConfigError: ``img`` is not an ``(H, W, 3)`` uint8 array.
        """
        if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 \
                or img.shape[2] != 3:
            desc = f"{img.dtype} {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__
            raise ConfigError(f"ChannelMoments.update expects an (H, W, 3) uint8 RGB array; "
                              f"got {desc}")
        flat = img.reshape(-1, 3).astype(np.int64)
        sums = flat.sum(axis=0)                          # <= 255 * H * W: exact in int64
        sum_sq = np.einsum("ij,ij->j", flat, flat)       # <= 65025 * H * W: exact in int64
        for c in range(3):
            self._sum[c] += int(sums[c])
            self._sum_sq[c] += int(sum_sq[c])
        self.num_pixels += flat.shape[0]
        self.num_images += 1

    def mean(self) -> tuple[float, float, float]:
        """Per-channel mean, 0-1 scale, RGB order.

        Raises:
            ConfigError: no pixels were added.
        """
        n = self._need_pixels()
        return tuple(s / (255 * n) for s in self._sum)  # type: ignore[return-value]

    def std(self) -> tuple[float, float, float]:
        """Per-channel population std (ddof = 0), 0-1 scale, RGB order.

        Raises:
            ConfigError: no pixels were added.
        """
        n = self._need_pixels()
        # n * sum_sq - sum**2 is an exact integer >= 0; Python's int / int rounds correctly.
        return tuple(math.sqrt((n * q - s * s) / (n * n * 255 * 255))  # type: ignore[return-value]
                     for s, q in zip(self._sum, self._sum_sq))

    def _need_pixels(self) -> int:
        if self.num_pixels == 0:
            raise ConfigError("no pixels were accumulated; expected at least one image")
        return self.num_pixels


def compute_stats(root: str | Path, split: str = "train", *, max_samples: int | None = None,
                  decoder: str = "auto", save: bool = True,
                  progress: bool = False) -> dict[str, Any]:
    """Per-channel mean/std of ``split``'s decoded pixels, optionally saved in ``manifest.json``.

    Args:
        root: the packed dataset (``OUT`` of ``shardkit pack``).
        split: split name, e.g. ``"train"``.
        max_samples: use only the first N samples in split order (the order is shuffled at pack
            time, so this is a seeded random subset); None = all.
        decoder: decoder registry name (``shardkit.decode.get_decoder``), default ``"auto"``.
        save: write the result to ``manifest["stats"][split]`` with an atomic rewrite of
            manifest.json that keeps every other field.
        progress: show a tqdm progress bar on stderr.

    Returns:
        ``{"mean": [r, g, b], "std": [r, g, b], "num_samples": k}``: floats on the 0-1 scale, RGB
        order, population std over all pixels; ``k`` samples were read. A dataset packed with
        ``--max-side`` (:func:`shardkit.doctor.reading.packed_downscaled`) adds ``"max_side"``
        (pixels) and ``"num_downscaled"``: how many of the ``k`` were stored downscaled.

    Raises:
        ConfigError: unknown split, ``max_samples < 1``, or the split is empty.
        ManifestError, ShardCorruptError, DecodeError: from reading the dataset (the manifest,
            the split index and the shards; ``splits/<split>.jsonl`` is read only for a
            dataset packed with ``--max-side``).
    """
    if max_samples is not None and (isinstance(max_samples, bool) or int(max_samples) < 1):
        raise ConfigError(f"max_samples must be a positive integer or None; got {max_samples!r}")
    manifest = load_manifest_dict(root)
    split_names(manifest, split)
    total = int(manifest["splits"][split]["num_samples"])
    if total == 0:
        raise ConfigError(f"split {split!r} of {root} has no samples; cannot compute stats")
    n = total if max_samples is None else min(total, int(max_samples))
    moments = ChannelMoments()
    limit = dataset_max_pixels(manifest)
    samples = iter_sample_bytes(root, manifest, split, range(n))
    for _, data in tqdm(samples, total=n, desc=f"stats {split}", disable=not progress):
        moments.update(decode_rgb(data, decoder, limit))
    result = {"mean": list(moments.mean()), "std": list(moments.std()),
              "num_samples": moments.num_images}
    if packed_downscaled(manifest):
        rows = read_rows(root, split, ("key",))
        result["max_side"] = stored_resolution(manifest, {split: rows})["max_side"]
        result["num_downscaled"] = sum(is_downscaled(r) for r in rows[:n])
    if save:
        fresh = load_manifest_dict(root)  # re-read: keep fields written since we started
        fresh.setdefault("stats", {})[split] = result
        save_manifest_dict(root, fresh)
    return result
