"""Stored resolution: ``shardkit pack --max-side 512`` on camera-size photos.

There are no real camera-size photos in the test data, so the script makes them: ``--n`` real
flower photos (every k-th file of ``--src``, sorted, all classes) upscaled bicubically to a longer
side of ``--side`` px (default 4000) and saved as JPEG quality 92 in ``WORK/camera`` (kept between
runs). Their detail is that of the 240-500 px originals, so they compress and downscale more
kindly than real 12-MP photos: the quality figures below are optimistic for real cameras, the
speed figures are not (decode cost depends on the pixel count, not on the detail).

Rows (one run, same machine; compare ratios):

- ``pack``: ``shardkit pack WORK/camera`` into ``full`` (original bytes), ``max512``
  (``--max-side 512``, q95 default) and ``max512_q90`` (``--jpeg-quality 90``, FFCV's quality in
  benchmarks/peers/peer_ffcv.py): wall seconds (``--workers`` check processes) and shard bytes;
- ``loader``: ``make_loader(root, "train", 64, num_workers=--workers)`` (RandomResizedCrop 224 +
  flip, the default transform, thread workers), one untimed warm-up epoch, then ``--epochs``
  timed epochs, consumer images/s; the three datasets in turn for ``--rounds`` rounds (machine
  drift hits every row alike), medians;
- ``ffcv`` (with ``--ffcv-python``, FFCV's own venv: ``benchmarks/peers/make_venv.sh
  ffcv-shared``): ``benchmarks/peers/peer_ffcv.py`` on the same folder, ``MODE=jpg``:
  ``RGBImageField(max_resolution=512, jpeg_quality=90)`` (cv2 ``INTER_AREA``, 4:2:0 chroma),
  its Loader with ``RandomResizedCropRGBImageDecoder`` 224 + flip, run between the rounds, each
  run: write, one warm-up and ``--epochs`` timed epochs;
- ``quality``: PSNR (dB) of each stored 512-px image (decoded) against a float reference: the
  source decoded by Pillow and resized per channel in mode ``F`` (float32, no rounding) with the
  same exact Lanczos filter to the same size; the loss of the uint8 rounding, the reducing gap
  and the JPEG coding. Also on the real (not upscaled) photos at ``--max-side 256``.

Usage::

    .venv/bin/python benchmarks/bench_max_side.py --work /tmp/maxside \\
        [--src ../shared/data/flowers] [--n 300] [--rounds 5] [--epochs 1] \\
        [--ffcv-python /tmp/ffcv-venv/bin/python] [--out FILE]
"""
from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import click
import numpy as np

HERE = Path(__file__).resolve().parent
DATASETS = {"full": [], "max512": ["--max-side", "512"],
            "max512_q90": ["--max-side", "512", "--jpeg-quality", "90"]}


def _sources(src: Path, n: int) -> list[Path]:
    files = sorted(p for p in src.glob("*/*.jpg"))
    step = max(1, len(files) // n)
    return files[::step][:n]


def _make_one(job: tuple[str, str, int]) -> int:
    from PIL import Image

    src, dst, side = job
    with Image.open(src) as im:
        rgb = im.convert("RGB")
    scale = side / max(rgb.size)
    big = rgb.resize((round(rgb.width * scale), round(rgb.height * scale)),
                     Image.Resampling.BICUBIC)
    tmp = dst + ".tmp"
    big.save(tmp, "JPEG", quality=92)
    os.replace(tmp, dst)
    return os.path.getsize(dst)


def make_camera(src: Path, work: Path, n: int, side: int, workers: int) -> Path:
    """``WORK/camera/<class>/<name>.jpg``: ``n`` photos of ``src`` upscaled to ``side`` px."""
    out = work / "camera"
    jobs = []
    for path in _sources(src, n):
        dst = out / path.parent.name / path.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            jobs.append((str(path), str(dst), side))
    if jobs:
        with ProcessPoolExecutor(max(1, workers)) as pool:
            list(pool.map(_make_one, jobs, chunksize=4))
    return out


def _pack(camera: Path, root: Path, extra: list[str], workers: int) -> dict:
    cmd = [sys.executable, "-m", "shardkit.cli", "pack", str(camera), str(root), "--split",
           "train=1", "--workers", str(workers), "--no-progress", "--overwrite", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    man = json.loads((root / "manifest.json").read_text())
    shards = man["splits"]["train"]["shards"]
    return {"seconds": round(seconds, 1), "bytes": sum(s["bytes"] for s in shards),
            "num_samples": man["splits"]["train"]["num_samples"]}


def _epochs(root: Path, workers: int, epochs: int, round_: int) -> float:
    from shardkit.stream import make_loader

    with make_loader(root, "train", 64, num_workers=workers, seed=round_) as loader:
        loader.set_epoch(0)
        for _ in loader:
            pass
        n, t0 = 0, time.perf_counter()
        for e in range(epochs):
            loader.set_epoch(e + 1)
            for images, _ in loader:
                n += len(images)
        return n / (time.perf_counter() - t0)


def _ffcv(python: str, camera: Path, work: Path, workers: int, epochs: int) -> dict:
    env = dict(os.environ, MODE="jpg")
    cmd = [python, str(HERE / "peers" / "peer_ffcv.py"), str(camera), str(work / "ffcv"),
           "--workers", str(workers), "--epochs", str(epochs)]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env,
                          cwd=HERE / "peers")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {**rows[0], **rows[-1]}


def _float_reference(rgb: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    from shardkit.images.normalize import DOWNSCALE_FILTER

    return np.stack([np.asarray(Image.fromarray(rgb[..., c].astype(np.float32), "F").resize(
        size, DOWNSCALE_FILTER)) for c in range(3)], axis=-1)


def _psnr(a: np.ndarray, ref: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - ref.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0 ** 2 / mse)


def _quality_one(job: tuple[str, int, int]) -> float | None:
    from PIL import Image

    from shardkit.doctor.reading import decode_rgb
    from shardkit.images.normalize import check_image

    path, max_side, quality = job
    data = Path(path).read_bytes()
    res = check_image(data, max_side=max_side, jpeg_quality=quality)
    if res.original_size is None:  # within max_side: stored as it is
        return None
    with Image.open(io.BytesIO(data)) as im:
        rgb = np.asarray(im.convert("RGB"))
    return _psnr(decode_rgb(res.data), _float_reference(rgb, (res.width, res.height)))


def quality(files: list[Path], max_side: int, quality_: int, workers: int) -> dict:
    with ProcessPoolExecutor(max(1, workers)) as pool:
        values = [v for v in pool.map(_quality_one, [(str(f), max_side, quality_) for f in files])
                  if v is not None]
    return {"max_side": max_side, "jpeg_quality": quality_, "images": len(values),
            "psnr_db_min": round(min(values), 2),
            "psnr_db_median": round(statistics.median(values), 2),
            "psnr_db_max": round(max(values), 2)}


def _emit(row: dict, out: str | None) -> None:
    line = json.dumps(row)
    click.echo(line)
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@click.command()
@click.option("--work", type=click.Path(path_type=Path), required=True,
              help="Scratch folder (camera photos kept, datasets rewritten).")
@click.option("--src", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=HERE.parent.parent / "shared" / "data" / "flowers", show_default=True)
@click.option("--n", default=300, show_default=True, help="Camera-size photos to make.")
@click.option("--side", default=4000, show_default=True, help="Their longer side, px.")
@click.option("--workers", default=2, show_default=True)
@click.option("--rounds", default=5, show_default=True)
@click.option("--epochs", default=1, show_default=True, help="Timed epochs per measurement.")
@click.option("--ffcv-python", default=None, help="FFCV venv's python (skip FFCV if unset).")
@click.option("--skip-quality", is_flag=True)
@click.option("--out", default=None, help="Also append the JSON rows to this file.")
def main(work, src, n, side, workers, rounds, epochs, ffcv_python, skip_quality, out):
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    camera = make_camera(src, work, n, side, workers)
    files = sorted(camera.glob("*/*.jpg"))
    _emit({"row": "camera", "images": len(files), "bytes": sum(f.stat().st_size for f in files),
           "seconds": round(time.perf_counter() - t0, 1), "side": side}, out)
    for name, extra in DATASETS.items():
        _emit({"row": "pack", "dataset": name, **_pack(camera, work / name, extra, workers)}, out)
    rates: dict[str, list[float]] = {name: [] for name in DATASETS}
    ffcv_rows = []
    for r in range(rounds):
        for name in DATASETS:
            rates[name].append(_epochs(work / name, workers, epochs, r))
        if ffcv_python and r in (0, rounds // 2, rounds - 1):
            ffcv_rows.append(_ffcv(ffcv_python, camera, work, workers, epochs))
            _emit({"row": "ffcv_run", **ffcv_rows[-1]}, out)
    med = {name: statistics.median(v) for name, v in rates.items()}
    for name, v in rates.items():
        _emit({"row": "loader", "dataset": name, "img_per_s_median": round(med[name], 1),
               "img_per_s": [round(x, 1) for x in v], "ratio_to_full": round(
                   med[name] / med["full"], 2)}, out)
    if ffcv_rows:
        ffcv = statistics.median(row["img_per_s"] for row in ffcv_rows)
        _emit({"row": "ffcv", "img_per_s_median": ffcv, "bytes": ffcv_rows[0]["bytes"],
               "max512_over_ffcv": round(med["max512"] / ffcv, 2),
               "max512_q90_over_ffcv": round(med["max512_q90"] / ffcv, 2)}, out)
    if not skip_quality:
        _emit({"row": "quality", "source": f"camera (upscaled to {side})",
               **quality(files, 512, 95, workers)}, out)
        _emit({"row": "quality", "source": f"camera (upscaled to {side})",
               **quality(files, 512, 90, workers)}, out)
        real = _sources(src, n)
        _emit({"row": "quality", "source": "real flowers (240-500 px)",
               **quality(real, 256, 95, workers)}, out)


if __name__ == "__main__":
    main()
