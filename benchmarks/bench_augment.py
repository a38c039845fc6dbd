"""Augmentation cost in the loader: shardkit presets against torchvision ImageFolder + PIL
with the same augmentation, same files, same run.

Rows (each repeat runs every row in turn, so drift of the machine hits all alike; medians over
``--repeats``), consumer images/s over one epoch of the train split, batch ``--batch-size``,
``--workers`` workers, RandomResizedCrop 224 + horizontal flip in every row:

- ``shardkit/<preset>``: ``make_loader(root, split, B, num_workers=W, augment=preset)`` (thread
  backend: decoding threads; the augmentation runs in them on the uint8 rows);
- ``imagefolder/<preset>``: ``DataLoader(ImageFolder(source, baseline_transform(224, preset)),
  B, num_workers=W)`` over the split's files: ``RandomResizedCrop(224), RandomHorizontalFlip(),
  <aug>, PILToTensor()`` with ``<aug>`` the preset's torchvision transform on the PIL image
  (:data:`shardkit.bench.baseline.BASELINE_AUGMENT`: ``ColorJitter(0.4, 0.4, 0.4)`` for
  standard, ``RandAugment(2, 9)`` for randaugment, ...), as a torchvision user writes it.

Ratios printed: ``shardkit/X / imagefolder/X`` (issue target for randaugment: >= 2.0) and
``shardkit/X / shardkit/none`` (target for standard: >= 0.8, i.e. within 25% in time).

Usage::

    .venv/bin/python benchmarks/bench_augment.py --data OUT [--split train] [--repeats 3] \\
        [--presets none,standard,randaugment,trivialaugment] [--out FILE]
"""
from __future__ import annotations

import json
import statistics
import time

import click

def _rate(loader) -> float:
    n, t0 = 0, time.perf_counter()
    for images, _ in loader:
        n += len(images)
    return n / (time.perf_counter() - t0)


def _imagefolder(root, paths, batch, workers, preset, size):
    import torch
    from torchvision.datasets import ImageFolder

    from shardkit.bench.baseline import InSplit, baseline_transform

    ds = ImageFolder(str(root), transform=baseline_transform(size, preset),
                     is_valid_file=InSplit(root, paths))
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                       prefetch_factor=2 if workers else None)


@click.command()
@click.option("--data", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--split", default="train", show_default=True)
@click.option("--presets", default="none,standard,randaugment,trivialaugment", show_default=True)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--workers", default=2, show_default=True)
@click.option("--image-size", default=224, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="JSON results file.")
def main(data, split, presets, batch_size, workers, image_size, repeats, out):
    from shardkit.augment import fast_path_available
    from shardkit.bench.env import collect_environment
    from shardkit.dataset.manifest import load_manifest, read_split_records
    from shardkit.stream import make_loader

    names = [p.strip() for p in presets.split(",") if p.strip()]
    manifest = load_manifest(data)
    source = manifest["source"]["root"]
    paths = [r["path"] for r in read_split_records(data, split)]
    rates: dict[str, list[float]] = {}
    for rep in range(repeats):
        for preset in names:
            with make_loader(data, split, batch_size, num_workers=workers, augment=preset,
                             image_size=image_size, seed=rep) as loader:
                loader.set_epoch(rep)
                rates.setdefault(f"shardkit/{preset}", []).append(_rate(loader))
            rates.setdefault(f"imagefolder/{preset}", []).append(
                _rate(_imagefolder(source, paths, batch_size, workers, preset, image_size)))
        print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratios = {}
    for preset in names:
        ratios[f"shardkit/{preset} vs imagefolder/{preset}"] = (
            med[f"shardkit/{preset}"] / med[f"imagefolder/{preset}"])
        if preset != "none" and "none" in names:
            ratios[f"shardkit/{preset} vs shardkit/none"] = (
                med[f"shardkit/{preset}"] / med["shardkit/none"])
    print("\nmedian images/s:")
    for k, v in med.items():
        print(f"  {k:28s} {v:8.0f}   (runs: {', '.join(f'{x:.0f}' for x in rates[k])})")
    print("ratios:")
    for k, v in ratios.items():
        print(f"  {k:48s} {v:.2f}x")
    result = {"rates": rates, "median": med, "ratios": ratios, "samples": len(paths),
              "fast_path": fast_path_available(), "environment": collect_environment(),
              "settings": {"batch_size": batch_size, "workers": workers,
                           "image_size": image_size, "repeats": repeats, "split": split}}
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
