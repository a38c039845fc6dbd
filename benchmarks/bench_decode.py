"""Decode + train-transform throughput, single process, images/s per core.

Compares full decodes (Pillow, PyTurboJPEG, torchvision.io.decode_jpeg on CPU, shardkit's ROI
extension) and the RandomResizedCrop(224) + flip train transform (torchvision v2 on PIL as the
ImageFolder-style baseline; shardkit's fused transform per decoder, with and without DCT scaling
/ ROI; libjpeg fast-DCT / fast-upsample variants with their pixel difference). All JPEG bytes
are read into memory first; each case warms up, runs ``--repeat`` timed passes over all images,
and reports the median rate (images per CPU-second of the process, i.e. per core; wall rate
too) and its ratio to Pillow full decode measured in the same run. The "step" rows show the
payoff of each idea: ROI decoding, DCT scaling, the fused C crop+resize+flip.

``--subsampling 420`` (or 422, 444) re-encodes every photo with Pillow at quality 90 and that
chroma subsampling before timing (the flowers sample is all 4:4:4, most camera JPEGs are 4:2:0);
``--only TEXT`` (repeatable) runs only the cases whose name contains one of the texts.

``--compare-ext OTHER.so`` instead times the roi train transform (dct_scaling off and on) with
the built ``_jpegroi`` and with another build of it (e.g. the previous commit's), for a change
that moves the cost by ~1%: per-pass rates on a shared machine swing by 10-30%, so each sample
runs 7 times per build, interleaved, on the same crop, and the minima are summed; each line
gives the time ratio built/other (``x1.005``: the built one is 0.5% slower).

Usage: python benchmarks/bench_decode.py [--data DIR] [--limit N] [--repeat R] [--out JSON]
           [--subsampling keep|444|422|420] [--only TEXT ...] [--compare-ext OTHER.so]
"""
from __future__ import annotations

import io
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import click
import numpy as np

from _common import write_json

ROOT = Path(__file__).resolve().parents[1]


_SUBSAMPLING = {"444": 0, "422": 1, "420": 2}  # Pillow's JPEG ``subsampling`` codes


def _load(data: Path, limit: int, subsampling: str = "keep") -> list[bytes]:
    """The first ``limit`` JPEGs under ``data`` (sorted paths), as stored or, unless
    ``subsampling`` is "keep", saved again by Pillow at quality 90 with that subsampling."""
    files = sorted(p for p in data.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise click.UsageError(f"no JPEG files under {data}")
    blobs = [p.read_bytes() for p in files[:limit]]
    if subsampling == "keep":
        return blobs
    from PIL import Image

    out = []
    for b in blobs:
        buf = io.BytesIO()
        with Image.open(io.BytesIO(b)) as im:
            im.convert("RGB").save(buf, "JPEG", quality=90, subsampling=_SUBSAMPLING[subsampling])
        out.append(buf.getvalue())
    return out


def _time(fn, blobs: list[bytes], repeat: int) -> dict:
    """Median over ``repeat`` passes of images per CPU-second of this process (per core: the
    machine is shared, so CPU time, not wall time, is the stable measure) and per wall second."""
    for b in blobs[: max(1, len(blobs) // 10)]:  # warm-up
        fn(b)
    cpu_rates, wall_rates = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        for b in blobs:
            fn(b)
        cpu_rates.append(len(blobs) / (time.process_time() - c0))
        wall_rates.append(len(blobs) / (time.perf_counter() - w0))
    med = statistics.median(cpu_rates)
    return {"images_per_s": med, "ms_per_image": 1000.0 / med, "cpu_rates": cpu_rates,
            "wall_images_per_s": statistics.median(wall_rates)}


def _cases(blobs: list[bytes]):
    """Yield (name, group, callable(bytes)) for every benchmark case available here."""
    import torch
    from PIL import Image
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    from shardkit.decode import DECODERS, available_decoders, get_decoder
    from shardkit.transforms import TransformConfig, make_transform

    def pil_full(b):
        with Image.open(io.BytesIO(b)) as im:
            return np.asarray(im.convert("RGB"))

    yield "pil full decode", "full", pil_full
    for name in available_decoders():
        if name in ("pil", "nvjpeg"):
            continue
        dec = get_decoder(name)
        yield f"{name} full decode", "full", dec.decode
    torch.set_num_threads(1)
    # torch.frombuffer on immutable bytes warns once; the decoder only reads the buffer
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
    yield "torchvision.io.decode_jpeg (cpu) full decode", "full", \
        lambda b: decode_jpeg(torch.frombuffer(b, dtype=torch.uint8))

    if "nvjpeg" in available_decoders():  # batched GPU decode; per-image time, synchronised
        nv = get_decoder("nvjpeg")
        pending: list[bytes] = []

        def nv_batched(b, batch=64):
            pending.append(b)
            if len(pending) == batch:
                nv.decode_batch(list(pending))
                torch.cuda.synchronize()
                pending.clear()

        yield "nvjpeg decode_batch(64) full decode (GPU; CPU time per image)", "full", nv_batched

    ref = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])

    def pil_tv_train(b):  # ImageFolder + PIL + torchvision v2 transform, uint8 output
        with Image.open(io.BytesIO(b)) as im:
            return np.asarray(ref(im.convert("RGB")))

    yield "torchvision v2 RRC224+flip on PIL (ImageFolder baseline)", "train", pil_tv_train
    rng = np.random.default_rng(0)
    out = np.empty((224, 224, 3), np.uint8)
    cfg = TransformConfig()

    def stepwise(dec, use_roi: bool, dct: bool):
        """Steps 0-2 with Pillow doing crop+resize: full or ROI decode, DCT scaling or not."""
        from fractions import Fraction

        from shardkit.decode import choose_scale, scaled_size
        from shardkit.transforms import sample_crop_params

        def run(b):
            probe = dec.probe(b)
            p = sample_crop_params(probe.width, probe.height, cfg, rng)
            f = choose_scale(p.width, p.height, 224, 224, probe.factors) if dct else Fraction(1)
            fl = float(f)
            box = (p.left * fl, p.top * fl, (p.left + p.width) * fl, (p.top + p.height) * fl)
            if use_roi:
                sw, sh = scaled_size(probe.width, probe.height, f)
                reg = (int(box[0]), int(box[1]), min(sw, -int(-box[2] // 1)),
                       min(sh, -int(-box[3] // 1)))
                arr = dec.decode_region(b, reg, f, probe)
                box = (box[0] - reg[0], box[1] - reg[1], box[2] - reg[0], box[3] - reg[1])
            else:
                arr = dec.decode_scaled(b, f, probe)
            img = Image.frombuffer("RGB", (arr.shape[1], arr.shape[0]), arr, "raw", "RGB", 0, 1)
            res = np.asarray(img.resize((224, 224), Image.Resampling.BILINEAR, box=box))
            np.copyto(out, res[:, ::-1] if p.flip else res)
            return out
        return run

    avail = available_decoders()
    if "turbojpeg" in avail:
        tj = get_decoder("turbojpeg")
        yield ("step0 turbojpeg full decode + PIL crop/resize/flip", "train",
               stepwise(tj, False, False))
    if "roi" in avail:
        rd = get_decoder("roi")
        yield "step1 roi ROI decode + PIL resize/flip", "train", stepwise(rd, True, False)
        yield "step2 roi ROI + DCT scaling + PIL resize/flip", "train", stepwise(rd, True, True)
    for name in avail:
        if name == "nvjpeg":
            continue
        for dct in (False, True):
            t = make_transform(TransformConfig(decoder=name, dct_scaling=dct), train=True)
            roi = " ROI+fused C resize" if DECODERS[name].supports_roi else " + C resize"
            yield (f"shardkit train {name}{roi} dct_scaling={dct}", "train",
                   lambda b, t=t: t(b, rng, out))
    yield from _batched_cases(cfg, rng, "cuda" if "nvjpeg" in avail else None)
    if "roi" in avail:
        for fd, fu in ((True, False), (False, True), (True, True)):
            t = make_transform(TransformConfig(decoder="roi", fast_dct=fd, fast_upsample=fu),
                               train=True)
            yield (f"shardkit train roi fast_dct={fd} fast_upsample={fu}",
                   "train-fast", lambda b, t=t: t(b, rng, out))
    t = make_transform(TransformConfig(), train=False)
    yield "shardkit eval (resize 256 + center crop 224), auto decoder", "eval", \
        lambda b: t(b, None, out)
    ev = v2.Compose([v2.Resize(256, antialias=True), v2.CenterCrop(224)])

    def pil_tv_eval(b):
        with Image.open(io.BytesIO(b)) as im:
            return np.asarray(ev(im.convert("RGB")))

    yield "torchvision v2 Resize256+CenterCrop224 on PIL", "eval", pil_tv_eval


def _batched_cases(cfg, rng, gpu: str | None):
    """The batched path (``shardkit.decode.nvjpeg.decode_crop_batch``: one decode_jpeg call per
    batch, crop + resize + flip with torchvision v2 on tensors) on the CPU and, with CUDA, on the
    GPU (nvJPEG; synchronised per batch). Time per image; the last partial batch is flushed by
    the next pass."""
    import torch

    from shardkit.decode.nvjpeg import decode_crop_batch, probe_batch
    from shardkit.transforms import sample_crop_params

    def batched(device: str, batch: int):
        pending: list[bytes] = []

        def run(b):
            pending.append(b)
            if len(pending) == batch:
                probes = probe_batch(pending)
                params = [sample_crop_params(p.width, p.height, cfg, rng) for p in probes]
                boxes = [(q.left, q.top, q.left + q.width, q.top + q.height) for q in params]
                decode_crop_batch(pending, boxes, [q.flip for q in params], cfg.image_size,
                                  device, probes=probes)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                pending.clear()
        return run

    yield ("batched decode_crop_batch(8) RRC224+flip, CPU (tv decode+v2)",
           "train", batched("cpu", 8))
    if gpu:
        yield ("batched decode_crop_batch(64) RRC224+flip, GPU nvJPEG",
               "train", batched(gpu, 64))


def _compare_ext(blobs: list[bytes], other: Path, rounds: int = 7) -> dict:
    """Seconds per sample of the roi train transform with the built ``_jpegroi`` ("built") and
    the extension file ``other`` ("other"): the sum over samples of the fastest of ``rounds``
    interleaved runs per build (same seed, hence the same crop, for both)."""
    import importlib.util

    import shardkit.decode.roi as roi
    from shardkit.transforms import TransformConfig, make_transform

    spec = importlib.util.spec_from_file_location("other._jpegroi", other)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    builds = {"built": roi._jpegroi, "other": mod}
    out = np.empty((224, 224, 3), np.uint8)
    res = {}
    try:
        for dct in (False, True):
            t = make_transform(TransformConfig(decoder="roi", dct_scaling=dct), train=True)
            total = dict.fromkeys(builds, 0.0)
            for i, b in enumerate(blobs):
                best = dict.fromkeys(builds, float("inf"))
                for r in range(rounds):
                    for k in (("built", "other") if r % 2 else ("other", "built")):
                        roi._jpegroi = builds[k]
                        rng = np.random.default_rng(i)
                        t0 = time.perf_counter()
                        t(b, rng, out)
                        best[k] = min(best[k], time.perf_counter() - t0)
                for k in builds:
                    total[k] += best[k]
            res[f"dct_scaling={dct}"] = {k: v / len(blobs) for k, v in total.items()}
    finally:
        roi._jpegroi = builds["built"]
    return res


def _fast_flag_diff(blobs: list[bytes]) -> dict:
    """Mean / max abs pixel difference of fast_dct / fast_upsample full decodes vs exact."""
    from shardkit.decode import available_decoders, get_decoder
    if "roi" not in available_decoders():
        return {}
    exact = get_decoder("roi")
    res = {}
    for fd, fu in ((True, False), (False, True), (True, True)):
        fast = get_decoder("roi", fast_dct=fd, fast_upsample=fu)
        diffs = [np.abs(exact.decode(b).astype(np.int16) - fast.decode(b)) for b in blobs]
        res[f"fast_dct={fd},fast_upsample={fu}"] = {
            "mean_abs_diff": float(np.mean([d.mean() for d in diffs])),
            "max_abs_diff": int(max(d.max() for d in diffs))}
    return res


def _environment() -> dict:
    import torch
    import torchvision

    from shardkit.decode import decoder_environment
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"python": sys.version.split()[0], "cpu": cpu, "cores": os.cpu_count(),
            "torch": torch.__version__, "torchvision": torchvision.__version__,
            "decoders": decoder_environment()}


@click.command()
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=ROOT / "examples" / "flowers-sample", show_default=True)
@click.option("--limit", type=int, default=400, show_default=True, help="max images")
@click.option("--repeat", type=int, default=3, show_default=True, help="timed passes")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench-results/decode.json"), show_default=True)
@click.option("--subsampling", type=click.Choice(["keep", *_SUBSAMPLING]), default="keep",
              show_default=True, help="re-encode every photo (Pillow, quality 90) first")
@click.option("--only", multiple=True, help="run only cases whose name contains this text "
              "(repeatable; the Pillow baseline always runs)")
@click.option("--compare-ext", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="only compare the roi train transform with this other _jpegroi build")
def main(data: Path, limit: int, repeat: int, out: Path, subsampling: str,
         only: tuple[str, ...], compare_ext: Path | None) -> None:
    """Benchmark decoders and the train transform; print a table, write JSON."""
    blobs = _load(data, limit, subsampling)
    if compare_ext is not None:
        res = _compare_ext(blobs, compare_ext)
        for case, sec in res.items():
            click.echo(f"shardkit train roi {case:<18} built {1000 * sec['built']:.4f} ms  "
                       f"other {1000 * sec['other']:.4f} ms  built/other "
                       f"x{sec['built'] / sec['other']:.4f}")
        write_json(out, {"data": str(data), "subsampling": subsampling,
                         "num_images": len(blobs), "other_extension": str(compare_ext),
                         "seconds_per_sample": res, "environment": _environment()}, indent=1)
        return
    results = []
    base = None
    for name, group, fn in _cases(blobs):
        if only and base is not None and not any(t in name for t in only):
            continue
        r = _time(fn, blobs, repeat)
        if base is None:
            base = r["images_per_s"]
        r.update(name=name, group=group, ratio_vs_pil_full=r["images_per_s"] / base)
        results.append(r)
        click.echo(f"{name:<66} {r['images_per_s']:7.0f} img/s/core {r['ms_per_image']:6.3f} ms"
                   f"  x{r['ratio_vs_pil_full']:.2f}  (wall {r['wall_images_per_s']:.0f}/s)")
    report = {"data": str(data), "subsampling": subsampling, "num_images": len(blobs),
              "repeat": repeat,
              "mean_bytes": float(np.mean([len(b) for b in blobs])),
              "baseline": "pil full decode", "results": results,
              "fast_flags_pixel_diff": _fast_flag_diff(blobs[:50]),
              "environment": _environment()}
    click.echo(json.dumps({"fast_flags_pixel_diff": report["fast_flags_pixel_diff"]}, indent=1))
    click.echo(json.dumps(report["environment"], indent=1))
    write_json(out, report, indent=1)


if __name__ == "__main__":
    main()
