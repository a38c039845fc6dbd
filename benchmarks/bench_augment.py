"""Augmentation cost in the loader: each preset against ``augment="none"`` in the same loader,
same run (and, with ``--baseline``, against torchvision ImageFolder + PIL with the same
augmentation). Command::

    .venv/bin/python benchmarks/bench_augment.py --data /tmp/flowers-wds --repeats 5 \
        --out benchmarks/results/augment-loader-flowers.json

Rows (each repeat runs every row in turn, the order rotated each repeat, so drift of the machine
hits all alike; medians over ``--repeats``), consumer images/s over one epoch of the train
split, batch ``--batch-size``, ``--workers`` workers, RandomResizedCrop 224 + horizontal flip in
every row:

- ``shardkit/<preset>``: ``make_loader(root, split, B, num_workers=W, augment=preset)`` (thread
  backend: decoding threads; the augmentation runs in them on the uint8 rows);
- with ``--baseline``, ``imagefolder/<preset>``: ``DataLoader(ImageFolder(source,
  baseline_transform(224, preset)), B, num_workers=W)`` over the split's files:
  ``RandomResizedCrop(224), RandomHorizontalFlip(), <aug>, PILToTensor()`` with ``<aug>`` the
  preset's torchvision transform on the PIL image
  (:data:`shardkit.bench.baseline.BASELINE_AUGMENT`: ``ColorJitter(0.4, 0.4, 0.4)`` for
  standard, ``RandAugment(2, 9)`` for randaugment, ...), as a torchvision user writes it.

CPU ms per image (``time.process_time`` of the loader process over the epoch, every thread) is
printed beside each shardkit row: on a busy host it moves less than the rates.

Ratios printed: ``shardkit/X / shardkit/none`` (targets: standard >= 0.90, randaugment >= 0.85),
the ratio of the medians and the median of the per-repeat ratios (each repeat's rows ran side by
side); with ``--baseline`` also ``shardkit/X / imagefolder/X`` (target for randaugment: >= 2.0).
The JSON result goes to ``--out`` (default ``benchmarks/results/augment-loader.json``).
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import click

from _common import write_json

RESULTS = Path(__file__).resolve().parent / "results"


def _rate(loader, cpu: list | None = None) -> float:
    """Consumer images/s over one epoch; appends the process's CPU ms per image to ``cpu``."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    for images, _ in loader:
        n += len(images)
    if cpu is not None:
        cpu.append((time.process_time() - c0) / max(n, 1) * 1e3)
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
@click.option("--presets", default="none,standard,randaugment", show_default=True)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--workers", default=2, show_default=True)
@click.option("--image-size", default=224, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--baseline/--no-baseline", default=False, show_default=True,
              help="Also run ImageFolder + PIL with the same augmentation.")
@click.option("--out", type=click.Path(dir_okay=False),
              default=str(RESULTS / "augment-loader.json"), show_default=True,
              help="JSON results file.")
def main(data, split, presets, batch_size, workers, image_size, repeats, baseline, out):
    from shardkit.augment import fast_path_available
    from shardkit.bench.env import collect_environment
    from shardkit.dataset.manifest import load_manifest, read_split_records
    from shardkit.stream import make_loader

    names = [p.strip() for p in presets.split(",") if p.strip()]
    manifest = load_manifest(data)
    source = manifest["source"]["root"]
    paths = [r["path"] for r in read_split_records(data, split)]
    rows = [f"shardkit/{p}" for p in names] + ([f"imagefolder/{p}" for p in names]
                                               if baseline else [])
    rates: dict[str, list[float]] = {r: [] for r in rows}
    cpu_ms: dict[str, list[float]] = {r: [] for r in rows}
    for rep in range(repeats):
        for row in rows[rep % len(rows):] + rows[:rep % len(rows)]:
            kind, preset = row.split("/")
            if kind == "shardkit":
                with make_loader(data, split, batch_size, num_workers=workers, augment=preset,
                                 image_size=image_size, seed=rep) as loader:
                    loader.set_epoch(rep)
                    rates[row].append(_rate(loader, cpu_ms[row]))
            else:
                rates[row].append(_rate(_imagefolder(source, paths, batch_size, workers, preset,
                                                     image_size)))
        print(f"repeat {rep}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratios, paired = {}, {}
    for preset in names:
        if baseline:
            ratios[f"shardkit/{preset} vs imagefolder/{preset}"] = (
                med[f"shardkit/{preset}"] / med[f"imagefolder/{preset}"])
        if preset != "none" and "none" in names:
            key = f"shardkit/{preset} vs shardkit/none"
            ratios[key] = med[f"shardkit/{preset}"] / med["shardkit/none"]
            paired[key] = statistics.median(
                a / b for a, b in zip(rates[f"shardkit/{preset}"], rates["shardkit/none"]))
    cpu_med = {k: statistics.median(v) for k, v in cpu_ms.items() if v}
    print("\nmedian images/s (and the loader process's CPU ms per image):")
    for k, v in med.items():
        cpu = f"  cpu {cpu_med[k]:.3f} ms/img" if k in cpu_med else ""
        print(f"  {k:28s} {v:8.0f}   (runs: {', '.join(f'{x:.0f}' for x in rates[k])}){cpu}")
    print("ratios (of the medians; median of the per-repeat ratios):")
    for k, v in ratios.items():
        extra = f"   {paired[k]:.3f}x" if k in paired else ""
        print(f"  {k:48s} {v:.3f}x{extra}")
    result = {"rates": rates, "median": med, "ratios": ratios, "paired_ratios": paired,
              "cpu_ms_per_image": cpu_ms, "cpu_ms_per_image_median": cpu_med,
              "samples": len(paths), "fast_path": fast_path_available(),
              "environment": collect_environment(),
              "settings": {"batch_size": batch_size, "workers": workers,
                           "image_size": image_size, "repeats": repeats, "split": split,
                           "baseline": baseline}}
    if out:
        write_json(out, result)


if __name__ == "__main__":
    main()
