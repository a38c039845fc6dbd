"""``shardkit inspect``: per-split counts, imbalance, groups, shard sizes and sample grids.

The grids are PNG files drawn through matplotlib's object-oriented API on an Agg canvas
(``Figure`` + ``FigureCanvasAgg``: no display needed, and the process-wide pyplot backend is
neither read nor switched):
``inspect_<split>_samples.png`` shows decoded samples titled with their class name, and
``inspect_<split>_transformed.png`` the same samples after the train transform, so a person
can look at what the model will see before training (no name repeats a word: the split is
often ``train``).

``shardkit inspect OUT --augment SPEC`` draws :func:`augment_grid` instead: a row per class, K
samples each, every sample as the loader makes it at the schedule's first and last strength.
"""
from __future__ import annotations

import logging
import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from shardkit.cli_common import printable_text
from shardkit.doctor.drift import train_transform
from shardkit.doctor.leaks import class_counts, imbalance
from shardkit.doctor.reading import (dataset_max_pixels, decode_rgb, iter_sample_bytes,
                                     load_manifest_dict, read_rows, split_names)
from shardkit.errors import ConfigError
from shardkit.humanize import count_text, size_text

__all__ = ["split_summary", "pick_samples", "save_grid", "inspect_dataset", "format_summary",
           "default_inspect_dir", "augment_grid", "pick_per_class", "format_augment_grid"]

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
        {"samples": png path, "train_transform": png path (``inspect_<split>_transformed.png``),
        "keys": [...]}}}``.

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
            titles.append(printable_text(f"{classes[rows[p]['label']]}\n{rows[p]['key']}"))
        report["images"][name] = {
            "samples": str(save_grid(plain, titles, out_dir / f"inspect_{name}_samples.png",
                                     f"{name}: decoded samples")),
            "train_transform": str(save_grid(augmented, titles,
                                             out_dir / f"inspect_{name}_transformed.png",
                                             f"{name}: after the train transform")),
            "keys": [rows[p]["key"] for p in picked],
        }
    return report


def format_summary(report: dict[str, Any]) -> str:
    """The report of :func:`inspect_dataset` as a plain-text table (class names that are not
    valid UTF-8 shown with their bytes as ``\\xNN``, as in the grids' titles), then a line per
    split on its shards (counts with their plural, sizes in binary units:
    :func:`shardkit.humanize.size_text`) and the PNGs written."""
    splits = list(report["splits"])
    classes = report["classes"]
    shown = {c: printable_text(c) for c in classes}  # a non-UTF-8 folder name: \xNN escapes
    width = max([len("imbalance (max/min)"), *(len(c) for c in shown.values())])
    head = f"{'class':<{width}}" + "".join(f"{s:>10}" for s in splits) + f"{'total':>10}"
    lines = [head, "-" * len(head)]
    for c in classes:
        counts = [report["splits"][s]["class_counts"][c] for s in splits]
        lines.append(f"{shown[c]:<{width}}" + "".join(f"{v:>10}" for v in counts)
                     + f"{sum(counts):>10}")
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
            lines.append(f"{s}: {_shards_text(sh)}")
        else:
            lines.append(f"{s}: no shards")
        for problem in report["splits"][s]["manifest_mismatch"]:
            lines.append(f"  MISMATCH with manifest: {problem}")
    for s, img in report["images"].items():
        if img["samples"]:
            lines.append(f"{s}: wrote {img['samples']} and {img['train_transform']}")
    return "\n".join(lines)


def _shards_text(sh: dict[str, Any]) -> str:
    """``"3 shards, 12-64 samples per shard, 510 KiB / 3.57 MiB / 3.88 MiB (min / median /
    max)"``;
    one shard: ``"1 shard, 32 samples, 1.21 MiB"``."""
    if sh["count"] == 1:
        return (f"1 shard, {count_text(sh['samples_min'], 'sample')}, "
                f"{size_text(sh['bytes_min'])}")
    samples = (count_text(sh["samples_min"], "sample") + " per shard"
               if sh["samples_min"] == sh["samples_max"]
               else f"{sh['samples_min']:,}-{sh['samples_max']:,} samples per shard")
    return (f"{count_text(sh['count'], 'shard')}, {samples}, {size_text(sh['bytes_min'])} / "
            f"{size_text(sh['bytes_median'])} / {size_text(sh['bytes_max'])} "
            f"(min / median / max)")


# ------------------------------------------------------------------------ augmentation grid
_DPI = 100
_LINE = 12         # pixels per title line (7 pt at 100 dpi, with leading)
_GAP = 4           # pixels between the tiles of one sample
_SAMPLE_GAP = 14   # pixels between samples (and around the grid)


def pick_per_class(labels: np.ndarray, num_classes: int, k: int, seed: int = 0) -> list[list[int]]:
    """For each class ``0 .. num_classes - 1``, up to ``k`` sample positions of that class
    (random without replacement, from ``numpy.random.default_rng(seed)``; sorted).

    Raises:
        ConfigError: ``k < 1``.
    """
    if isinstance(k, bool) or int(k) < 1:
        raise ConfigError(f"samples per class must be >= 1; got {k!r}")
    rng = np.random.default_rng(seed)
    out = []
    for c in range(num_classes):
        where = np.flatnonzero(labels == c)
        out.append(sorted(int(p) for p in rng.choice(where, min(int(k), len(where)),
                                                     replace=False)))
    return out


def _tile_title(name: str, epoch: int, augmented: bool, values: dict[str, float],
                chars: int) -> list[str]:
    """A tile's title lines, wrapped at ``chars`` characters: the class, the epoch and, on an
    augmented tile, the scheduled values (``{"1.rand_augment.magnitude": 5.0}`` reads
    ``magnitude=5``; the op, then its index, are kept only where two entries would read alike)."""
    keys = {key: key.rsplit(".", 1)[1] for key in values}
    if len(set(keys.values())) < len(keys):
        keys = {key: key.split(".", 1)[1] for key in values}
    if len(set(keys.values())) < len(keys):
        keys = {key: key for key in values}
    parts = [name, f"epoch {epoch}, {'augmented' if augmented else 'plain crop'}"]
    parts += [f"{keys[key]}={v:.3g}" for key, v in values.items()] if augmented else []
    return [line for part in parts
            for line in textwrap.wrap(part, chars, break_long_words=True) or [""]]


def augment_grid(root: str | Path, augment: Any, split: str = "train", *, per_class: int = 4,
                 out_dir: str | Path | None = None, seed: int = 0, transform_config: Any = None,
                 progress: bool = False) -> dict[str, Any]:
    """A PNG grid of augmented samples: one row per class, ``per_class`` samples in each.

    Every sample (split position ``p``) is made as the train loader makes it
    (:meth:`shardkit.stream.datasets.BatchDataset.build`; its RNG depends on ``(seed, epoch,
    rank, position)`` only, field case 17): ``rng = sample_rng(seed, epoch, 0, p)``
    draws the crop of the train transform (``make_transform(transform_config, train=True)``),
    then ``spec.draw(rng, S, S, epoch)`` the augmentation program, applied by
    :func:`shardkit.augment.apply_hwc`; this is the loader's row ``p`` of an unshuffled epoch.
    Tiles per sample, left to right: the plain crop and the augmented crop at epoch 0 (the
    schedules' first strength), then the same at ``spec.last_scheduled_epoch()`` (their last
    strength) when the spec has schedules. Each title gives the class, the epoch and, on
    augmented tiles, the scheduled values (``spec.scheduled_values(epoch)``).

    Tiles are drawn at 1:1 (``S x S`` pixels each, ``S = transform_config.image_size``) on a
    matplotlib ``Figure`` with its own Agg canvas (no pyplot, no backend switch); the text is
    matplotlib's.

    Args:
        root: the packed dataset. augment: anything :meth:`AugmentSpec.parse` takes.
        split: the split to draw from. per_class: samples per class (``K``, >= 1).
        out_dir: folder of the PNG (default :func:`default_inspect_dir`).
        seed: the sample choice (``default_rng(seed)``) and the loader seed of ``sample_rng``.
        transform_config: a ``TransformConfig`` (default ``TransformConfig()``).
        progress: a tqdm bar on stderr (one step per sample).

    Returns:
        ``{"path": PNG path, "split", "spec": str, "epochs": [0] or [0, last], "scheduled":
        {epoch: {name: value}}, "tile": S, "size": [width, height] (pixels), "rows": classes,
        "cols": K * tiles per sample, "tiles": [[{"box": [left, top, right, bottom] (pixels of
        the PNG), "key", "position", "epoch", "augmented": bool}, ...] per class row]}``; a class
        with fewer samples in the split has fewer tiles (none: an empty row).

    Raises:
        ConfigError: a bad spec (before anything is read), an unknown split or ``per_class < 1``.
        ManifestError, ShardCorruptError, DecodeError: from reading the dataset.
    """
    from shardkit.augment import AugmentSpec, apply_hwc
    from shardkit.sharding import sample_rng

    spec = AugmentSpec.parse(augment)
    manifest = load_manifest_dict(root)
    split_names(manifest, split)
    classes = list(manifest["classes"])
    rows = read_rows(root, split, ("key", "label"))
    picked = pick_per_class(np.array([int(r["label"]) for r in rows], dtype=np.int64),
                            len(classes), per_class, seed)
    transform = train_transform(transform_config)
    size = transform.cfg.image_size
    last = spec.last_scheduled_epoch()
    epochs = [0] if last == 0 else [0, last]
    scheduled = {e: spec.scheduled_values(e) for e in epochs}
    data = dict(iter_sample_bytes(root, manifest, split, [p for ps in picked for p in ps]))
    chars = max(8, size // 6)  # 7 pt text at 100 dpi: ~6 pixels per character
    titles = {(c, e, aug): _tile_title(printable_text(name), e, aug, scheduled[e], chars)
              for c, name in enumerate(classes) for e in epochs for aug in (False, True)}
    lines = max(map(len, titles.values()))
    per_sample = 2 * len(epochs)
    cols = int(per_class) * per_sample
    tile_h = lines * _LINE + size
    width = 2 * _SAMPLE_GAP + cols * size + (cols - int(per_class)) * _GAP \
        + (int(per_class) - 1) * _SAMPLE_GAP
    header = textwrap.wrap(
        f"shardkit inspect --augment: split {split}, seed {seed}, S={size} px; per sample: "
        + ", ".join(f"plain crop and augmented at epoch {e}" for e in epochs), width // 6)
    header += textwrap.wrap(f"augment: {spec.describe()}", width // 6,
                            max_lines=3, placeholder=" ...")
    top = len(header) * _LINE + _SAMPLE_GAP
    height = top + len(classes) * (tile_h + _SAMPLE_GAP) + _SAMPLE_GAP // 2

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    FigureCanvasAgg(fig)  # attaches itself: savefig renders with Agg, no backend lookup

    def text(x: int, y: int, s: str, **kw) -> None:  # (x, y): pixels from the top left
        fig.text(x / width, 1 - y / height, s, fontsize=7, va="top", ha="left", **kw)

    text(_SAMPLE_GAP, _SAMPLE_GAP // 2, "\n".join(header), linespacing=1.2)
    tiles: list[list[dict[str, Any]]] = []
    bar = tqdm(total=sum(map(len, picked)), desc=f"inspect --augment {split}",
               disable=not progress)
    for c, positions in enumerate(picked):
        y0 = top + c * (tile_h + _SAMPLE_GAP)
        row_tiles = []
        if not positions:
            text(_SAMPLE_GAP, y0, printable_text(f"{classes[c]}: no sample in split {split!r}"))
        for j, p in enumerate(positions):
            x = _SAMPLE_GAP + j * (per_sample * (size + _GAP) - _GAP + _SAMPLE_GAP)
            for e in epochs:
                rng = sample_rng(seed, e, 0, p)
                crop = np.ascontiguousarray(transform(data[p], rng))
                augmented = crop.copy()
                apply_hwc(augmented, spec.draw(rng, size, size, e))
                for img, aug in ((crop, False), (augmented, True)):
                    text(x, y0, "\n".join(titles[c, e, aug]), linespacing=1.2)
                    y_img = y0 + lines * _LINE
                    fig.figimage(img, xo=x, yo=height - y_img - size, origin="upper")
                    row_tiles.append({"box": [x, y_img, x + size, y_img + size],
                                      "key": rows[p]["key"], "position": p, "epoch": e,
                                      "augmented": aug})
                    x += size + _GAP
            bar.update(1)
        tiles.append(row_tiles)
    bar.close()
    out_dir = Path(out_dir) if out_dir is not None else default_inspect_dir(root)
    path = out_dir / f"inspect_{split}_augment.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.canvas.draw()
    from PIL import Image  # RGB, not savefig's RGBA: a quarter fewer bytes to compress

    Image.fromarray(np.asarray(fig.canvas.buffer_rgba())[..., :3]).save(path, format="PNG")
    log.info("wrote %s (%d x %d pixels)", path, width, height)
    return {"path": str(path), "split": split, "spec": spec.describe(), "epochs": epochs,
            "scheduled": scheduled, "tile": size, "size": [width, height], "rows": classes,
            "cols": cols, "tiles": tiles}


def format_augment_grid(grid: dict[str, Any]) -> str:
    """The result of :func:`augment_grid` as text: what was drawn, then the PNG path (last)."""
    counts = ", ".join(f"{name} {sum(t['augmented'] for t in row) // len(grid['epochs'])}"
                       for name, row in zip(grid["rows"], grid["tiles"]))
    lines = [f"augment {grid['spec']} on split {grid['split']}: samples per class: {counts}"]
    for e in grid["epochs"]:
        values = ", ".join(f"{k}={v:.4g}" for k, v in grid["scheduled"][e].items())
        lines.append(f"  epoch {e}: {values or 'no scheduled parameter'}")
    lines.append(f"wrote {grid['path']} ({grid['size'][0]} x {grid['size'][1]} pixels, "
                 f"{count_text(len(grid['rows']), 'row')} x {count_text(grid['cols'], 'tile')} "
                 f"of {grid['tile']} px)")
    return "\n".join(lines)
