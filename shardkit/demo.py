"""``make demo``: the main job end to end on the embedded sample of real flower photos.

Packs ``examples/flowers-sample`` (200 CC-BY photos, 5 classes, 120 photographers) with photographer
groups into all three formats, verifies them, prints the split report and leakage check, computes the
train split's mean/std, trains ``hrnet_w18_small`` from the shards for a short run sized for a CPU
(a GPU is used when present), evaluates it with per-class metrics, runs a small loader benchmark and
ends with a short report. Every step runs the public ``shardkit`` CLI, exactly as a user would.

Run: ``python -m shardkit.demo [--out out/demo] [--epochs N]``.

``--out`` (:func:`prepare_out`): a new or empty folder, or the folder of an earlier demo run
(it holds :data:`MARKER`), whose demo outputs (:data:`OUTPUTS`) are replaced; anything else in
it is kept. A folder with other content and no marker is refused (exit 2, one ``Error:`` line):
the demo deletes only what it wrote.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from shardkit.errors import ConfigError

__all__ = ["main", "prepare_out", "MARKER", "OUTPUTS"]

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "flowers-sample"
FORMATS = ("wds", "lmdb", "hdf5")
MARKER = ".shardkit-demo"
"""The file the demo writes into its ``--out`` folder: the folder's demo outputs are its own."""
OUTPUTS = (*FORMATS, "inspect", "run", "bench")
"""The entries of ``--out`` the demo writes (and so replaces on the next run)."""


def prepare_out(out: Path) -> Path:
    """Makes ``out`` ready for a demo run (see the module doc) and returns it.

    Raises:
        ConfigError: ``out`` is a file, or a folder with content and without :data:`MARKER`
            (nothing is deleted then).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a new or empty folder")
    if out.is_dir():
        if (out / MARKER).is_file():  # an earlier demo run's folder: replace its outputs only
            for name in OUTPUTS:
                path = out / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.exists() or path.is_symlink():
                    path.unlink()
        elif any(out.iterdir()):
            raise ConfigError(f"--out {out} is not empty and is not the folder of an earlier "
                              f"demo run (no {MARKER} file in it); the demo deletes only what it "
                              "wrote: give a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file on the way, no permission: one line, nothing written
        raise ConfigError(f"--out {out}: cannot create the folder ({e.strerror or e})") from None
    (out / MARKER).write_text("written by `python -m shardkit.demo`: the next demo run into "
                              f"this folder replaces {', '.join(OUTPUTS)} and keeps the rest\n")
    return out


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
    parser.add_argument("--out", default=str(REPO / "out" / "demo"),
                        help="output folder: new, empty, or an earlier demo run's (only the "
                             "demo's outputs are replaced)")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (CPU-sized default)")
    parser.add_argument("--image-size", type=int, default=96, help="training image size")
    args = parser.parse_args(argv)

    try:
        out = prepare_out(Path(args.out))
    except ConfigError as e:
        print(f"Error: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    import torch

    gpu = torch.cuda.is_available()
    timings = {}

    for fmt in FORMATS:
        timings[f"pack_{fmt}"] = _run(f"pack ({fmt})", [
            "pack", str(SAMPLE), str(out / fmt), "--format", fmt,
            "--metadata", str(SAMPLE / "metadata.csv"), "--group-column", "group_flickr_user",
            "--split-ratios", "train=0.7,val=0.15,test=0.15", "--seed", "0", "--shard-samples",
            "64", "--workers", "2"])
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
        "bench", str(data), "--split", "train", "--num-workers", "0,2",
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
    best = metrics.get("best") or {}
    print(f"training: {epochs} epochs of hrnet_w18_small at {image_size}px on "
          f"{'GPU' if gpu else 'CPU'}; last epoch ({last['epoch']}): val top1 "
          f"{val.get('top1', float('nan')):.3f}, macro-F1 {val.get('macro_f1', float('nan')):.3f}; "
          f"best epoch: {best.get('epoch', 'none')} by {best.get('monitor', '-')} "
          f"{best.get('value', float('nan')):.3f}; "
          f"data-wait fraction {last.get('train', {}).get('data_wait_fraction', float('nan')):.2f}")
    print(f"loader: {bench_json['recommendation']['text']}")
    for name, seconds in timings.items():
        print(f"  {name}: {seconds:.1f} s")


if __name__ == "__main__":
    main()
