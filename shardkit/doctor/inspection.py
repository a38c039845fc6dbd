"""``shardkit inspect``: per-split counts, imbalance, groups, shard sizes and sample grids.

The grids are PNG files drawn through matplotlib's object-oriented API on an Agg canvas
(``Figure`` + ``FigureCanvasAgg``: no display needed, and the process-wide pyplot backend is
neither read nor switched):
``inspect_<split>_samples.png`` shows decoded samples titled with their class name, and
``inspect_<split>_train_transform.png`` the same samples after the train transform, so a person
can look at what the model will see before training.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from shardkit.doctor.drift import train_transform
from shardkit.doctor.leaks import class_counts, imbalance
from shardkit.doctor.reading import (dataset_max_pixels, decode_rgb, iter_sample_bytes,
                                     load_manifest_dict, read_rows, split_names)
from shardkit.errors import ConfigError

__all__ = ["split_summary", "pick_samples", "save_grid", "inspect_dataset", "format_summary",
           "default_inspect_dir"]

log = logging.getLogger(__name__)


def split_summary(manifest: dict[str, Any], split: str,
                  rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of one split, from its jsonl rows, compared with the manifest.

    Returns:
        ``{"num_samples", "class_counts": {class: n}, "imbalance": {...} (see
        :func:`shardkit.doctor.leaks.imbalance`), "num_groups", "shards": {"count",
        "bytes_min", "bytes_median",
        "bytes_max", "samples_min", "samples_max"}, "manifest_mismatch": [str, ...]}``; bytes
        are file sizes recorded in the manifest; ``manifest_mismatch`` is empty when the rows
        agree with ``manifest["splits"][split]`` (sample count, class counts, group count).
    """
    classes = list(manifest["classes"])
    entry = manifest["splits"][split]
    counts = class_counts(rows, len(classes))
    groups = len({str(r["group"]) for r in rows})
    shards = entry.get("shards", [])
    sizes = np.array([s["bytes"] for s in shards], dtype=np.int64)
    per_shard = np.array([s["num_samples"] for s in shards], dtype=np.int64)
    mismatch = []
    if entry.get("num_samples") != len(rows):
        mismatch.append(f"num_samples: manifest {entry.get('num_samples')}, jsonl {len(rows)}")
    if "class_counts" in entry and list(entry["class_counts"]) != counts.tolist():
        mismatch.append(f"class_counts: manifest {list(entry['class_counts'])}, "
                        f"jsonl {counts.tolist()}")
    if "num_groups" in entry and entry["num_groups"] != groups:
        mismatch.append(f"num_groups: manifest {entry['num_groups']}, jsonl {groups}")
    if per_shard.sum() != len(rows):
        mismatch.append(f"shards hold {int(per_shard.sum())} samples, jsonl lists {len(rows)}")
    return {
        "num_samples": len(rows),
        "class_counts": dict(zip(classes, counts.tolist())),
        "imbalance": imbalance(counts, classes),
        "num_groups": groups,
        "shards": {"count": len(shards),
                   "bytes_min": int(sizes.min()) if len(sizes) else None,
                   "bytes_median": float(np.median(sizes)) if len(sizes) else None,
                   "bytes_max": int(sizes.max()) if len(sizes) else None,
                   "samples_min": int(per_shard.min()) if len(sizes) else None,
                   "samples_max": int(per_shard.max()) if len(sizes) else None},
        "manifest_mismatch": mismatch,
    }


def pick_samples(labels: np.ndarray, n: int, seed: int = 0) -> list[int]:
    """``min(n, len(labels))`` sample positions, drawn class by class in turn so that every class
    shows up (random order within a class, from ``numpy.random.default_rng(seed)``), sorted by
    label then position.

    Raises:
        ConfigError: ``n < 1``.
    """
    if isinstance(n, bool) or int(n) < 1:
        raise ConfigError(f"number of samples to show must be >= 1; got {n!r}")
    rng = np.random.default_rng(seed)
    per_class = [list(rng.permutation(np.flatnonzero(labels == c))) for c in np.unique(labels)]
    picked: list[int] = []
    while len(picked) < min(n, len(labels)):
        for queue in per_class:
            if queue and len(picked) < n:
                picked.append(int(queue.pop(0)))
    return sorted(picked, key=lambda p: (int(labels[p]), p))


def save_grid(images: list[np.ndarray], titles: list[str], path: str | Path, suptitle: str) -> Path:
    """Draw ``images`` (each ``(H, W, 3)`` uint8 RGB) in a near-square grid with ``titles`` and
    save a PNG at ``path``. Returns the path.

    Draws on a ``matplotlib.figure.Figure`` with its own ``FigureCanvasAgg``: no pyplot, no
    global backend switch, nothing kept after the call.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = max(1, math.ceil(math.sqrt(len(images))))
    rows = max(1, math.ceil(len(images) / cols))
    fig = Figure(figsize=(2.4 * cols, 2.6 * rows + 0.4), dpi=80)
    FigureCanvasAgg(fig)  # attaches itself: savefig renders with Agg, no backend lookup
    fig.suptitle(suptitle, fontsize=10)
    for i, (img, title) in enumerate(zip(images, titles)):
        ax = fig.add_subplot(rows, cols, i + 1)
        ax.imshow(img)
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def default_inspect_dir(root: str | Path) -> Path:
    """``./inspect-<dataset folder name>`` in the current working directory: outside the dataset,
    which stays immutable (``shardkit verify`` re-hashes it)."""
    return Path.cwd() / f"inspect-{Path(root).resolve().name}"


def inspect_dataset(root: str | Path, split: str | None = None, *,
                    out_dir: str | Path | None = None, n: int = 16, seed: int = 0,
                    decoder: str = "auto", transform_config: Any = None,
                    progress: bool = False) -> dict[str, Any]:
    """Summarise a packed dataset and draw sample grids.

    Args:
        root: the packed dataset (``OUT`` of ``shardkit pack``).
        split: one split, or None for all splits.
        out_dir: where the PNGs go (default :func:`default_inspect_dir`: ``./inspect-<name>`` in
            the current directory, never inside the dataset, which ``verify`` re-hashes).
        n: samples per grid (class by class, see :func:`pick_samples`).
        seed: seed of the sample choice and of the train-transform randomness.
        decoder: decoder registry name for the plain grid.
        transform_config: a ``shardkit.transforms.TransformConfig`` for the train transform
            (default: ``TransformConfig()``).
        progress: a tqdm bar on stderr (one step per grid sample, per split).

    Returns:
        ``{"root", "classes", "splits": {split: split_summary(...)}, "images": {split:
        {"samples": png path, "train_transform": png path, "keys": [...]}}}``.

    Raises:
        ConfigError: unknown split or ``n < 1``.
        ManifestError, ShardCorruptError, DecodeError: from reading the dataset.
    """
    manifest = load_manifest_dict(root)
    classes = list(manifest["classes"])
    limit = dataset_max_pixels(manifest)
    out_dir = Path(out_dir) if out_dir is not None else default_inspect_dir(root)
    report: dict[str, Any] = {"root": str(root), "classes": classes, "splits": {}, "images": {}}
    transform = None
    for name in split_names(manifest, split):
        rows = read_rows(root, name)
        report["splits"][name] = split_summary(manifest, name, rows)
        if not rows:
            report["images"][name] = {"samples": None, "train_transform": None, "keys": []}
            continue
        if transform is None:
            transform = train_transform(transform_config)
        picked = pick_samples(np.array([r["label"] for r in rows]), n, seed)
        data = dict(iter_sample_bytes(root, manifest, name, picked))
        rng = np.random.default_rng(seed)
        plain, augmented, titles = [], [], []
        for p in tqdm(picked, desc=f"inspect {name}", disable=not progress):
            plain.append(decode_rgb(data[p], decoder, limit))
            augmented.append(transform(data[p], rng))
            titles.append(f"{classes[rows[p]['label']]}\n{rows[p]['key']}")
        report["images"][name] = {
            "samples": str(save_grid(plain, titles, out_dir / f"inspect_{name}_samples.png",
                                     f"{name}: decoded samples")),
            "train_transform": str(save_grid(augmented, titles,
                                             out_dir / f"inspect_{name}_train_transform.png",
                                             f"{name}: after the train transform")),
            "keys": [rows[p]["key"] for p in picked],
        }
    return report


def format_summary(report: dict[str, Any]) -> str:
    """The report of :func:`inspect_dataset` as a plain-text table."""
    splits = list(report["splits"])
    classes = report["classes"]
    width = max([len("imbalance (max/min)"), *(len(c) for c in classes)])
    head = f"{'class':<{width}}" + "".join(f"{s:>10}" for s in splits) + f"{'total':>10}"
    lines = [head, "-" * len(head)]
    for c in classes:
        counts = [report["splits"][s]["class_counts"][c] for s in splits]
        lines.append(f"{c:<{width}}" + "".join(f"{v:>10}" for v in counts) + f"{sum(counts):>10}")
    lines.append("-" * len(head))
    totals = [report["splits"][s]["num_samples"] for s in splits]
    lines.append(f"{'samples':<{width}}" + "".join(f"{v:>10}" for v in totals)
                 + f"{sum(totals):>10}")
    lines.append(f"{'groups':<{width}}"
                 + "".join(f"{report['splits'][s]['num_groups']:>10}" for s in splits))
    ratios = [report["splits"][s]["imbalance"]["ratio"] for s in splits]
    lines.append(f"{'imbalance (max/min)':<{width}}"
                 + "".join(f"{'-' if r is None else f'{r:.2f}':>10}" for r in ratios))
    lines.append("")
    for s in splits:
        sh = report["splits"][s]["shards"]
        if sh["count"]:
            lines.append(f"{s}: {sh['count']} shard(s), {sh['samples_min']}-{sh['samples_max']} "
                         f"samples, bytes min/median/max {sh['bytes_min']}/"
                         f"{sh['bytes_median']:.0f}/{sh['bytes_max']}")
        else:
            lines.append(f"{s}: no shards")
        for problem in report["splits"][s]["manifest_mismatch"]:
            lines.append(f"  MISMATCH with manifest: {problem}")
    for s, img in report["images"].items():
        if img["samples"]:
            lines.append(f"{s}: wrote {img['samples']} and {img['train_transform']}")
    return "\n".join(lines)
