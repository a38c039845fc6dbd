"""``make demo``: the main job end to end on the embedded sample of real flower photos.

Packs ``examples/flowers-sample`` (200 CC-BY photos, 5 classes, 120 photographers) with photographer
groups into all three formats, verifies them, prints the split report and leakage check, computes the
train split's mean/std, trains ``hrnet_w18_small`` from the shards for a short run sized for a CPU
(a GPU is used when present), evaluates it with per-class metrics, runs a small loader benchmark and
ends with a short report. Every step runs the public ``shardkit`` CLI, exactly as a user would.

Run: ``python -m shardkit.demo [--out out/demo] [--steps N]``.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "flowers-sample"
FORMATS = ("wds", "lmdb", "hdf5")


def _run(step: str, args: list[str]) -> float:
    cmd = [sys.executable, "-m", "shardkit.cli", *args]
    print(f"\n=== {step}: shardkit {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    result = subprocess.run(cmd)
    if result.returncode != 0:
        raise SystemExit(f"demo step '{step}' failed with exit code {result.returncode}: "
                         f"{' '.join(cmd)}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "out" / "demo"), help="output folder")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (CPU-sized default)")
    parser.add_argument("--image-size", type=int, default=96, help="training image size")
    args = parser.parse_args(argv)

    import torch

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    gpu = torch.cuda.is_available()
    timings = {}

    for fmt in FORMATS:
        timings[f"pack_{fmt}"] = _run(f"pack ({fmt})", [
            "pack", str(SAMPLE), str(out / fmt), "--format", fmt,
            "--metadata", str(SAMPLE / "metadata.csv"), "--group-column", "group_flickr_user",
            "--split", "train=0.7,val=0.15,test=0.15", "--seed", "0", "--shard-samples", "64",
            "--workers", "2"])
        _run(f"verify ({fmt})", ["verify", str(out / fmt)])
    data = out / "wds"
    _run("leakage check", ["check", str(data)])
    _run("inspect", ["inspect", str(data), "--split", "train", "--out", str(out / "inspect")])
    _run("stats", ["stats", str(data), "--split", "train"])

    epochs = args.epochs * (10 if gpu else 1)
    image_size = 224 if gpu else args.image_size
    run = out / "run"
    timings["train"] = _run("train", [
        "train", "--data", str(data), "--out", str(run), "--model", "hrnet_w18_small",
        "--epochs", str(epochs), "--batch-size", "16", "--image-size", str(image_size),
        "--num-workers", "2", "--opt", "adamw", "--lr", "1e-3", "--weight-decay", "0.05",
        "--warmup-steps", "3", "--no-progress"])
    bench = out / "bench"
    _run("loader benchmark", [
        "bench", "--data", str(data), "--split", "train", "--num-workers", "0,2",
        "--prefetch-factor", "2", "--pin-memory", "off", "--batch-size", "32",
        "--step-ms", "100", "--repeats", "1", "--warmup", "1", "--baseline", "imagefolder",
        "--out", str(bench)])

    metrics = json.loads((run / "metrics.json").read_text())
    last = metrics["history"][-1]
    bench_json = json.loads((bench / "bench.json").read_text())
    print("\n=== report")
    print(f"outputs: {out}  (shards: {', '.join(str(out / f) for f in FORMATS)}; "
          f"run: {run}; benchmark: {bench})")
    val = last.get("val", {})
    print(f"training: {epochs} epochs of hrnet_w18_small at {image_size}px on "
          f"{'GPU' if gpu else 'CPU'}; val top1 {val.get('top1', float('nan')):.3f}, "
          f"macro-F1 {val.get('macro_f1', float('nan')):.3f}; "
          f"data-wait fraction {last.get('train', {}).get('data_wait_fraction', float('nan')):.2f}")
    print(f"loader: {bench_json['recommendation']['text']}")
    for name, seconds in timings.items():
        print(f"  {name}: {seconds:.1f} s")


if __name__ == "__main__":
    main()
