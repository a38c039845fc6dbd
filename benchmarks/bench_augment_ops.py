"""Per-op cost of the augmentation: shardkit's CPU path vs torchvision v2. Command::

    .venv/bin/python benchmarks/bench_augment_ops.py --images 64 --repeats 5 \
        --out benchmarks/results/augment-ops.json

For every op of :data:`shardkit.augment.ops.OPS` (each made to fire: ``p=1``), on 224x224
centre crops of real photos (no resampling), single thread (``torch.set_num_threads(1)``),
milliseconds per image, in the same run:

- ``shardkit``: the op's draw (``ops.OPS[name](rng, 224, 224, **params)``) plus
  :func:`shardkit.augment.apply_hwc` in place on a ``(224, 224, 3)`` uint8 row, as the decoding
  threads run it (a 150 KB copy of the source image into the row is included, ~0.01 ms); the
  ``path`` column says whether every primitive drawn took a C fast path (``C``) or some took
  torchvision's tensor op on a view (``torch``);
- ``tv tensor``: the torchvision v2 transform of the same name and parameters on a
  ``(3, 224, 224)`` uint8 tensor;
- ``tv PIL``: the same transform on a 224x224 RGB ``PIL.Image`` (torchvision's PIL kernels).

Each repeat runs the three variants in turn over the same images (order rotated each repeat);
the table gives the median over repeats of the mean per image. Absolute numbers depend on the
host; only the ratios of one run mean anything. Column ``per-op ms`` times shardkit's path
with ``_kernels._set_fused(0)``: one pass per colour primitive instead of one pass per
contrast op for a run of them (the same bytes; the code before the runs were fused).
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import click
import numpy as np

from _common import write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "examples" / "flowers-sample"


def _cases():
    """``[(row name, op name, shardkit params, torchvision transform)]``."""
    import torchvision.transforms.v2 as T

    return [
        ("color_jitter", "color_jitter", dict(brightness=0.4, contrast=0.4, saturation=0.4),
         T.ColorJitter(0.4, 0.4, 0.4)),
        ("hue 0.1", "color_jitter", dict(hue=0.1), T.ColorJitter(hue=0.1)),
        ("color_jitter +hue 0.1", "color_jitter",
         dict(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
         T.ColorJitter(0.4, 0.4, 0.4, 0.1)),
        ("grayscale", "grayscale", dict(p=1.0), T.RandomGrayscale(p=1.0)),
        ("rotation 15", "rotation", dict(degrees=15.0), T.RandomRotation(15.0)),
        ("affine", "affine", dict(degrees=10.0, translate=[0.1, 0.1], scale=[0.9, 1.1], shear=5.0),
         T.RandomAffine(10.0, (0.1, 0.1), (0.9, 1.1), 5.0)),
        ("perspective 0.5", "perspective", dict(distortion_scale=0.5, p=1.0),
         T.RandomPerspective(0.5, p=1.0)),
        ("gaussian_blur 5", "gaussian_blur", dict(kernel_size=5, sigma=[0.1, 2.0]),
         T.GaussianBlur(5, (0.1, 2.0))),
        ("sharpness 2", "sharpness", dict(sharpness_factor=2.0, p=1.0),
         T.RandomAdjustSharpness(2.0, p=1.0)),
        ("posterize 4", "posterize", dict(bits=4, p=1.0), T.RandomPosterize(4, p=1.0)),
        ("solarize 128", "solarize", dict(threshold=128.0, p=1.0), T.RandomSolarize(128.0, p=1.0)),
        ("autocontrast", "autocontrast", dict(p=1.0), T.RandomAutocontrast(p=1.0)),
        ("equalize", "equalize", dict(p=1.0), T.RandomEqualize(p=1.0)),
        ("rand_augment 2, 9", "rand_augment", dict(num_ops=2, magnitude=9), T.RandAugment(2, 9)),
        ("trivial_augment", "trivial_augment", dict(), T.TrivialAugmentWide()),
        ("aug_mix", "aug_mix", dict(), T.AugMix()),
        ("random_erasing", "random_erasing", dict(p=1.0), T.RandomErasing(p=1.0, value=0)),
    ]


def _photos(n: int) -> list[np.ndarray]:
    from PIL import Image

    out = []
    for path in sorted(SAMPLE.glob("*/*.jpg")):
        a = np.asarray(Image.open(path).convert("RGB"))
        h, w = a.shape[:2]
        if h >= 224 and w >= 224:
            y, x = (h - 224) // 2, (w - 224) // 2
            out.append(np.ascontiguousarray(a[y:y + 224, x:x + 224]))
        if len(out) == n:
            break
    return out


def _measure(images: int, repeats: int) -> dict:
    import torch
    from PIL import Image

    from shardkit.augment import apply_hwc, fast_path_available, ops, prims
    from shardkit.sharding import sample_rng

    torch.set_num_threads(1)
    torch.manual_seed(0)
    photos = _photos(images)
    tensors = [torch.from_numpy(a.copy()).permute(2, 0, 1).contiguous() for a in photos]
    pils = [Image.fromarray(a) for a in photos]
    row = np.empty_like(photos[0])
    rows = []
    for label, name, params, tv in _cases():
        draw = ops.OPS[name]
        c_only = True

        def shardkit_run(epoch: int) -> None:
            nonlocal c_only
            for k, a in enumerate(photos):
                program = draw(sample_rng(0, epoch, 0, k), 224, 224, **params)
                np.copyto(row, a)
                apply_hwc(row, program)
                c_only &= all(n in prims.C_PRIMITIVES for n, _ in program)

        def per_op_run(epoch: int) -> None:
            before = prims._kernels._set_fused(False) if prims._kernels else None
            try:
                shardkit_run(epoch)
            finally:
                if prims._kernels:
                    prims._kernels._set_fused(before)

        variants = {"shardkit": shardkit_run, "shardkit_per_op": per_op_run,
                    "tv_tensor": lambda epoch: [tv(t) for t in tensors],
                    "tv_pil": lambda epoch: [tv(p) for p in pils]}
        names = list(variants)
        for v in names:  # warm-up: tables, allocations, lazy imports
            variants[v](0)
        times: dict[str, list[float]] = {v: [] for v in names}
        for r in range(repeats):
            for v in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                variants[v](r + 1)
                times[v].append((time.perf_counter() - t0) / len(photos) * 1e3)
        med = {v: statistics.median(ts) for v, ts in times.items()}
        rows.append({"op": label, "path": "C" if c_only and fast_path_available() else "torch",
                     "ms": med, "spread_ms": {v: [min(ts), max(ts)] for v, ts in times.items()},
                     "tv_tensor_over_shardkit": med["tv_tensor"] / med["shardkit"],
                     "tv_pil_over_shardkit": med["tv_pil"] / med["shardkit"]})
        click.echo(f"{label:24s} {rows[-1]['path']:5s} " + "  ".join(
            f"{v} {med[v]:7.3f}" for v in names), err=True)
    return {"images": len(photos), "repeats": repeats, "size": 224, "threads": 1, "rows": rows}


def _table(result: dict) -> str:
    lines = ["| op | shardkit path | shardkit ms | per-op ms | tv tensor ms | tv PIL ms "
             "| tensor / shardkit | PIL / shardkit |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        ms = r["ms"]
        lines.append(f"| {r['op']} | {r['path']} | {ms['shardkit']:.3f} "
                     f"| {ms['shardkit_per_op']:.3f} | {ms['tv_tensor']:.3f} "
                     f"| {ms['tv_pil']:.3f} | {r['tv_tensor_over_shardkit']:.1f}x "
                     f"| {r['tv_pil_over_shardkit']:.1f}x |")
    return "\n".join(lines)


@click.command()
@click.option("--images", default=64, show_default=True, help="224 px crops of sample photos")
@click.option("--repeats", default=5, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False),
              default=str(ROOT / "benchmarks" / "results" / "augment-ops.json"),
              show_default=True, help="JSON result file")
def main(images: int, repeats: int, out: str | None) -> None:
    from shardkit.bench.env import collect_environment

    result = _measure(images, repeats)
    result["environment"] = collect_environment()
    if out:
        write_json(out, result)
    click.echo(_table(result))


if __name__ == "__main__":
    main()
