"""GPU check of ``shardkit train``: a few hundred steps of hrnet_w18_small at 224 px with bf16.

Packs the embedded sample (``examples/flowers-sample``) unless ``--data`` names a packed dataset,
trains on the GPU (``--amp bf16``, channels_last, TF32), and prints the measured images/s and the
data-wait fraction of every epoch, plus the whole-run figures, as one JSON line at the end.
It also reloads ``last.pt`` with ``weights_only=True`` (the CUDA RNG states must load safely) and
reports the process settings the run made (seed, cudnn.benchmark, TF32).

``--sync-timing`` synchronises around every step (exact GPU wait/compute split);
``--compare-sync`` runs twice, without and with it, and reports both and the images/s ratio.

Run on a CUDA machine: ``python scripts/gpu_train_check.py [--steps 300] [--batch-size 64]``.
Importing this module does nothing (no CUDA needed); ``main()`` raises SystemExit without CUDA
unless ``--device cpu`` is given (for a dry run of the script itself).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "flowers-sample"

__all__ = ["main", "summarize"]


def summarize(metrics: dict) -> dict:
    """Whole-run images/s (images / seconds) and data-wait fraction (weighted by epoch time) from a
    ``metrics.json`` dict; the first epoch (warm-up, cudnn autotune) is left out when there are at
    least three."""
    epochs = [h["train"] for h in metrics["history"] if h["train"]["steps"] > 0]
    steady = epochs[1:] if len(epochs) >= 3 else epochs
    images = sum(e["images"] for e in steady)
    seconds = sum(e["seconds"] for e in steady)
    wait = sum(e["data_wait_fraction"] * e["seconds"] for e in steady)
    return {"epochs_counted": len(steady), "images": images, "seconds": round(seconds, 3),
            "images_per_s": round(images / seconds, 1) if seconds else None,
            "data_wait_fraction": round(wait / seconds, 4) if seconds else None}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="packed dataset (default: pack the embedded sample)")
    parser.add_argument("--out", help="folder for the run folder(s) run/ and run-sync/ "
                        "(default: a temporary folder)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-workers", type=int, default=8)
    parser.add_argument("--amp", default="bf16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--sync-timing", action="store_true",
                        help="torch.cuda.synchronize around each step (exact data-wait split)")
    parser.add_argument("--compare-sync", action="store_true",
                        help="run twice, without and with --sync-timing, and compare")
    args = parser.parse_args(argv)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_train_check: CUDA is not available (use --device cpu for a dry run)")

    work = Path(tempfile.mkdtemp(prefix="shardkit-gpu-check-"))
    data = Path(args.data) if args.data else work / "data"
    if not args.data:
        from shardkit.packer.run import pack

        t0 = time.perf_counter()
        pack(SAMPLE, data, format="wds", split={"train": 0.8, "val": 0.2}, seed=0,
             metadata=SAMPLE / "metadata.csv", group_column="group_flickr_user",
             shard_samples=64, workers=4)
        print(f"packed {SAMPLE} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    runs = [False, True] if args.compare_sync else [args.sync_timing]
    summaries = [_run(args, data, Path(args.out) if args.out else work, sync) for sync in runs]
    summary = summaries[0] if len(summaries) == 1 else {
        "no_sync": summaries[0], "sync": summaries[1],
        "sync_vs_no_sync_images_per_s": round(summaries[1]["images_per_s"]
                                              / summaries[0]["images_per_s"], 3)}
    print(json.dumps(summary))
    return summary


def _run(args, data: Path, work: Path, sync_timing: bool) -> dict:
    import logging

    import torch

    from shardkit.train import load_config, train
    from shardkit.train.checkpoint import load_checkpoint

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = work / ("run-sync" if sync_timing else "run")
    # three long epochs of uniform draws (the sample is tiny, so short epochs would measure epoch
    # restarts); the first epoch (worker start, cudnn autotune) is left out of the summary
    config = load_config("default", data=str(data), out=str(out), model="hrnet_w18_small",
                         epochs=3, samples_per_epoch=-(-args.steps // 3) * args.batch_size,
                         max_steps=args.steps, batch_size=args.batch_size,
                         image_size=args.image_size, amp=args.amp, device=args.device,
                         num_workers=args.num_workers, compile=args.compile,
                         patience=None, warmup_steps=min(50, args.steps // 5), progress=False,
                         sync_timing=sync_timing)
    t0 = time.perf_counter()
    metrics = train(config)
    wall = time.perf_counter() - t0
    for h in metrics["history"]:
        t = h["train"]
        print(f"sync_timing={sync_timing} epoch {h['epoch']:4d} steps {t['steps']:3d} "
              f"images/s {t['images_per_s']:8.1f} data_wait {t['data_wait_fraction']:.3f}",
              file=sys.stderr)
    ckpt = load_checkpoint(out / "checkpoints" / "last.pt")      # weights_only=True
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "amp": metrics["run"]["amp"], "steps": metrics["step"], "wall_s": round(wall, 1),
            "batch_size": args.batch_size, "image_size": args.image_size,
            "num_workers": args.num_workers, "compile": args.compile,
            "sync_timing": sync_timing, **summarize(metrics),
            "checkpoint_safe_load": {"step": ckpt["step"], "cuda_rng_states":
                                     len(ckpt["rng"].get("cuda", []))},
            "tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_benchmark": torch.backends.cudnn.benchmark, "run": str(out)}


if __name__ == "__main__":
    main()
