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

Per-class hue (:class:`ClassHue`, the ``"hue"`` entry of the result) is read from the same decoded
samples, for ``shardkit check --augment``'s hue warning: see :func:`hue_vector` for the per-image
mean hue and :meth:`ClassHue.result` for the between/within rule (``eta2``).

Saving (:func:`save_stats`) writes into the dataset, so it holds the dataset's lock
(:class:`shardkit.dataset.swap.DatasetLock`, the one ``pack`` and ``export`` hold) meanwhile: under it
the manifest is read again, the split's entry merged into ``stats`` (the other splits' entries,
saved by another ``stats`` meanwhile, are kept), and the file rewritten atomically. The result is
not saved, and the reason returned (the statistics themselves are still returned and printed),
when a pack holds the lock (waited for: another ``stats`` or an ``export``, up to
:data:`shardkit.dataset.swap.BRIEF_WAIT_S`), when the dataset was replaced while they were computed
(its manifest, ``stats`` aside, is no longer the one they were computed on), or when the folder
cannot be written (another user's dataset, a read-only file system).
"""
from __future__ import annotations

import math
from array import array
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from shardkit.doctor.reading import (dataset_max_pixels, decode_rgb, is_downscaled,
                                     iter_sample_bytes, load_manifest_dict, packed_downscaled,
                                     read_rows, save_manifest_dict, split_names,
                                     stored_resolution)
from shardkit.errors import ConfigError, ShardkitError

__all__ = ["ChannelMoments", "ClassHue", "hue_vector", "class_hues", "hue_separates_classes",
           "format_class_hues", "compute_stats", "save_stats", "StatsResult", "HUE_STRIDE",
           "HUE_ETA2_THRESHOLD", "HUE_P_THRESHOLD"]

HUE_STRIDE = 4
"""Pixel stride of the hue statistics: every 4th pixel of every 4th row (1/16 of the pixels; the
class means of the flowers sample move by < 0.2 degrees against every pixel)."""
HUE_ETA2_THRESHOLD = 0.06
"""``eta2`` (the share of the hue dispersion between images that their class explains, see
:meth:`ClassHue.result`) from which the classes count as told apart by hue: Cohen's "medium"
effect size for eta squared (J. Cohen, "Statistical Power Analysis for the Behavioral Sciences",
2nd ed., 1988: 0.01 small, 0.06 medium, 0.14 large). Measured: the flowers sample's train split
0.110, the full flowers train split 0.180; the sample with labels shuffled <= 0.03."""
HUE_P_THRESHOLD = 0.01
"""Largest permutation p-value of ``eta2`` that counts (see :meth:`ClassHue.result`)."""
HUE_PERMUTATIONS = 199


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
        _check_rgb(img, "ChannelMoments.update")
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


def hue_vector(img: np.ndarray, stride: int = HUE_STRIDE) -> complex:
    """The chroma-weighted mean hue direction of one image.

    The mean, over every ``stride``-th pixel of every ``stride``-th row, of
    ``c * exp(2j * pi * h)``, where ``h`` (0-1, a full turn) is the HSV hue as torchvision's
    ``rgb_to_hsv`` (hence ``adjust_hue``) defines it and ``c = (max(R, G, B) - min(R, G, B)) / 255``
    is the chroma: HSV saturation times value, so grey pixels weigh 0 and near-black pixels (whose
    hue and HSV saturation are noise) little.

    Args:
        img: ``(H, W, 3)`` uint8 RGB array. stride: pixel stride (>= 1).

    Returns:
        A complex number: its angle is the mean hue (radians), its modulus lies in [0, 1] (1 only
        for an image of one fully saturated hue; 0 for a grey one).

    Raises:
        ConfigError: ``img`` is not an ``(H, W, 3)`` uint8 array.
    """
    _check_rgb(img, "hue_vector")
    sub = img[::stride, ::stride]
    r, g, b = (sub[..., i].astype(np.float32).ravel() for i in range(3))
    mx, mn = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    c = mx - mn
    safe = np.where(c > 0, c, np.float32(1))
    sixths = np.where(mx == r, (g - b) / safe,
                      np.where(mx == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    theta = sixths * np.float32(np.pi / 3)  # a sixth of a turn per unit; cos/sin wrap negatives
    scale = 255.0 * max(c.size, 1)
    return complex(float(np.sum(c * np.cos(theta), dtype=np.float64)) / scale,
                   float(np.sum(c * np.sin(theta), dtype=np.float64)) / scale)


class ClassHue:
    """Per-class mean hue of a split, from one :func:`hue_vector` per image.

    ``update(img, label)`` adds an image of class index ``label``; :meth:`result` gives the class
    means and the rule that ``shardkit check --augment`` applies before hue jitter.
    """

    def __init__(self, classes: list[str], stride: int = HUE_STRIDE) -> None:
        self.classes = list(classes)
        self.stride = int(stride)
        self._re, self._im, self._labels = array("d"), array("d"), array("q")

    def update(self, img: np.ndarray, label: int) -> None:
        """Add one ``(H, W, 3)`` uint8 RGB image of class ``label`` (an index into ``classes``).

        Raises:
            ConfigError: bad ``img``, or ``label`` outside ``[0, len(classes))``.
        """
        if not 0 <= int(label) < len(self.classes):
            raise ConfigError(f"class index {label!r} is outside [0, {len(self.classes)})")
        v = hue_vector(img, self.stride)
        self._re.append(v.real)
        self._im.append(v.imag)
        self._labels.append(int(label))

    def result(self, permutations: int = HUE_PERMUTATIONS, seed: int = 0) -> dict[str, Any]:
        """Class mean hues and how much of the hue dispersion the class explains.

        With ``v_i`` the images' vectors, ``S_c`` their sum over class ``c`` and ``S`` over all:
        the total dispersion is ``T = sum |v_i| - |S|``, the between-class part
        ``B = sum_c |S_c| - |S|`` and ``eta2 = B / T`` (0-1): the circular one-way analysis of
        variance of Mardia & Jupp, "Directional Statistics" (2000), section 7.4.1, whose
        Watson-Williams test uses ``B / (T - B)`` on unit vectors; here each image weighs its
        chroma. ``eta2_p`` is its permutation p-value: ``(1 + #{eta2 of a shuffled labelling
        >= eta2}) / (1 + permutations)``, shuffles from ``numpy.random.default_rng(seed)``.

        Returns:
            ``{"classes": {name: {"mean_hue_deg": degrees in [0, 360) or None (no chroma),
            "concentration": |S_c| / sum_c |v_i| in [0, 1] or None (1: the class's images share
            one hue), "num_samples": n}}, "eta2": float or None (no chroma at all), "eta2_p",
            "num_samples", "stride", "weight": "chroma"}``; floats rounded to 4 decimals
            (degrees to 2).
        """
        v = np.frombuffer(self._re, dtype=np.float64) + 1j * np.frombuffer(self._im,
                                                                         dtype=np.float64)
        labels = np.frombuffer(self._labels, dtype=np.int64)
        k = len(self.classes)
        sums = _class_sums(v, labels, k)
        norms = np.abs(v)
        per_class = np.bincount(labels, weights=norms, minlength=k)
        counts = np.bincount(labels, minlength=k)
        resultant = abs(v.sum())
        total = float(norms.sum()) - resultant
        eta2 = p = None
        if total > 1e-12:
            eta2 = (float(np.abs(sums).sum()) - resultant) / total
            rng = np.random.default_rng(seed)
            null = [(float(np.abs(_class_sums(v, rng.permutation(labels), k)).sum()) - resultant)
                    / total for _ in range(int(permutations))]
            p = (1 + sum(e >= eta2 - 1e-12 for e in null)) / (1 + int(permutations))
        classes = {}
        for c, name in enumerate(self.classes):
            mod = abs(sums[c])
            classes[name] = {
                "mean_hue_deg": round(math.degrees(np.angle(sums[c])) % 360, 2) if mod > 0
                else None,
                "concentration": round(mod / per_class[c], 4) if per_class[c] > 0 else None,
                "num_samples": int(counts[c])}
        return {"classes": classes, "eta2": None if eta2 is None else round(eta2, 4),
                "eta2_p": None if p is None else round(p, 4), "num_samples": int(len(v)),
                "stride": self.stride, "weight": "chroma"}


def hue_separates_classes(hue: dict[str, Any], eta2_threshold: float = HUE_ETA2_THRESHOLD,
                          p_threshold: float = HUE_P_THRESHOLD) -> bool:
    """The rule of ``shardkit check --augment``: the classes count as told apart by hue when
    ``eta2 >= eta2_threshold`` (the class explains at least that share of the hue dispersion
    between images, see :meth:`ClassHue.result`) and ``eta2_p <= p_threshold`` (a shuffled
    labelling rarely explains as much: guards small splits)."""
    eta2, p = hue.get("eta2"), hue.get("eta2_p")
    return eta2 is not None and p is not None and eta2 >= eta2_threshold and p <= p_threshold


def format_class_hues(hue: dict[str, Any]) -> str:
    """One line: ``class mean hue (deg): daisy 63.2, ...; eta2 0.156 (p 0.005)``."""
    names = ", ".join(f"{name} {_deg(c['mean_hue_deg'])}" for name, c in hue["classes"].items())
    eta2 = "-" if hue["eta2"] is None else f"{hue['eta2']:.3f} (p {hue['eta2_p']:.3f})"
    return f"class mean hue (deg, chroma-weighted): {names}; hue eta2 {eta2}"


def _deg(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _class_sums(v: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    return (np.bincount(labels, weights=v.real, minlength=k)
            + 1j * np.bincount(labels, weights=v.imag, minlength=k))


def _check_rgb(img: Any, where: str) -> None:
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.ndim != 3 \
            or img.shape[2] != 3:
        desc = f"{img.dtype} {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__
        raise ConfigError(f"{where} expects an (H, W, 3) uint8 RGB array; got {desc}")


def class_hues(root: str | Path, split: str = "train", *, max_samples: int | None = None,
               decoder: str = "auto", progress: bool = False,
               manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """:meth:`ClassHue.result` of the first ``max_samples`` samples of ``split`` (all when None;
    the split order is shuffled at pack time, so this is a seeded random subset).

    Raises:
        ConfigError: unknown split, ``max_samples < 1``, or an empty split.
        ManifestError, ShardCorruptError, DecodeError: from reading the dataset.
    """
    from shardkit.dataset.manifest import load_index

    manifest = load_manifest_dict(root) if manifest is None else manifest
    n = _sample_count(root, manifest, split, max_samples)
    hues = ClassHue(list(manifest["classes"]))
    labels = load_index(root, split, manifest).label
    limit = dataset_max_pixels(manifest)
    samples = iter_sample_bytes(root, manifest, split, range(n))
    for pos, data in tqdm(samples, total=n, desc=f"hue {split}", disable=not progress):
        hues.update(decode_rgb(data, decoder, limit), int(labels[pos]))
    return hues.result()


def _sample_count(root, manifest: dict[str, Any], split: str, max_samples: int | None) -> int:
    if max_samples is not None and (isinstance(max_samples, bool) or int(max_samples) < 1):
        raise ConfigError(f"max_samples must be a positive integer or None; got {max_samples!r}")
    split_names(manifest, split)
    total = int(manifest["splits"][split]["num_samples"])
    if total == 0:
        raise ConfigError(f"split {split!r} of {root} has no samples; cannot compute stats")
    return total if max_samples is None else min(total, int(max_samples))


class StatsResult(dict):
    """The dict :func:`compute_stats` returns (its keys are what is saved), plus what became of
    saving it: ``not_saved`` is None when it was saved or not asked to be, else the reason
    (one sentence) it was not."""

    not_saved: str | None = None


def save_stats(root: str | Path, split: str, result: dict[str, Any],
               computed_on: dict[str, Any]) -> str | None:
    """Saves ``result`` as ``manifest["stats"][split]`` of the local dataset ``root`` under the
    dataset's lock (see the module doc). ``computed_on``: the manifest the statistics were
    computed from. Returns None when saved, else the reason it was not (nothing was written
    then); never raises for a dataset that cannot take the result."""
    from shardkit.dataset.manifest import MANIFEST_NAME
    from shardkit.storage.urls import local_path
    from shardkit.dataset.swap import BRIEF_WAIT_S, DatasetLock

    root = Path(local_path(root))
    try:
        with DatasetLock(root, "stats", wait=BRIEF_WAIT_S, wait_for_pack=False):
            fresh = load_manifest_dict(root)  # under the lock: what is on disk now
            if _without_stats(fresh) != _without_stats(computed_on):
                return ("the dataset was replaced while they were computed (a pack finished "
                        "meanwhile): rerun shardkit stats on the new one")
            stats = fresh.get("stats")
            fresh["stats"] = {**(stats if isinstance(stats, dict) else {}), split: dict(result)}
            save_manifest_dict(root, fresh)
    except ShardkitError as e:  # locked by a pack, a folder that cannot be written
        return str(e)
    except OSError as e:  # the manifest cannot be replaced (permissions, read-only, full)
        return f"cannot write {root / MANIFEST_NAME} ({e.strerror or e})"
    return None


def _without_stats(manifest: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in manifest.items() if k != "stats"}


def compute_stats(root: str | Path, split: str = "train", *, max_samples: int | None = None,
                  decoder: str = "auto", save: bool = True,
                  progress: bool = False) -> StatsResult:
    """Per-channel mean/std of ``split``'s decoded pixels, optionally saved in ``manifest.json``.

    Args:
        root: the packed dataset (``OUT`` of ``shardkit pack``).
        split: split name, e.g. ``"train"``.
        max_samples: use only the first N samples in split order (the order is shuffled at pack
            time, so this is a seeded random subset); None = all.
        decoder: decoder registry name (``shardkit.decode.get_decoder``), default ``"auto"``.
        save: write the result to ``manifest["stats"][split]`` (:func:`save_stats`: under the
            dataset's lock, an atomic rewrite of manifest.json that keeps every other field);
            when it cannot be saved, ``result.not_saved`` says why (nothing is raised).
        progress: show a tqdm progress bar on stderr.

    Returns:
        a :class:`StatsResult`, the dict
        ``{"mean": [r, g, b], "std": [r, g, b], "num_samples": k, "hue": {...}}``: floats on the
        0-1 scale, RGB order, population std over all pixels; ``k`` samples were read; ``hue``
        is :meth:`ClassHue.result` of the same ``k`` images (per-class mean hue, ``eta2``). A
        dataset packed with ``--max-side`` (:func:`shardkit.doctor.reading.packed_downscaled`)
        adds ``"max_side"`` (pixels) and ``"num_downscaled"``: how many of the ``k`` were stored
        downscaled.

    Raises:
        ConfigError: unknown split, ``max_samples < 1``, or the split is empty.
        ManifestError, ShardCorruptError, DecodeError: from reading the dataset (the manifest,
            the split index and the shards; ``splits/<split>.jsonl`` is read only for a
            dataset packed with ``--max-side``).
    """
    if max_samples is not None and (isinstance(max_samples, bool) or int(max_samples) < 1):
        raise ConfigError(f"max_samples must be a positive integer or None; got {max_samples!r}")
    manifest = load_manifest_dict(root)
    n = _sample_count(root, manifest, split, max_samples)
    from shardkit.dataset.manifest import load_index

    moments = ChannelMoments()
    hues = ClassHue(list(manifest["classes"]))
    labels = load_index(root, split, manifest).label
    limit = dataset_max_pixels(manifest)
    samples = iter_sample_bytes(root, manifest, split, range(n))
    for pos, data in tqdm(samples, total=n, desc=f"stats {split}", disable=not progress):
        img = decode_rgb(data, decoder, limit)
        moments.update(img)
        hues.update(img, int(labels[pos]))
    result = StatsResult(mean=list(moments.mean()), std=list(moments.std()),
                         num_samples=moments.num_images, hue=hues.result())
    if packed_downscaled(manifest):
        rows = read_rows(root, split, ("key",))
        result["max_side"] = stored_resolution(manifest, {split: rows})["max_side"]
        result["num_downscaled"] = sum(is_downscaled(r) for r in rows[:n])
    if save:
        result.not_saved = save_stats(root, split, result, manifest)
    return result
