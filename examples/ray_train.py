"""Train `shardkit train`'s model from a Ray Data stream on a simulated 2-node Ray cluster.

    .venv/bin/python examples/ray_train.py [--steps 6] [--image-size 32] [--batch-size 16]

What it shows (README.md, "Scaling out on Ray"), on the embedded flowers sample (200 real
photos), in ~45 s on 2 cores:

1. a local multi-node cluster: ``ray.cluster_utils.Cluster`` with 2 nodes of 1 CPU each (on a
   real cluster, ``ray.init(address=...)`` / ``shardkit pack --ray-address ADDR`` instead);
2. ``pack(..., engine="ray")``: files checked and shards written by Ray tasks on both nodes;
3. ``shardkit.ray.read_split(..., decode="train")``: CPU nodes read and decode (shardkit's fused
   RandomResizedCrop + flip, the randomness of ``make_loader``), the trainer consumes uint8
   batches with ``iter_torch_batches`` and normalises them as ``shardkit train`` does;
4. a few SGD steps of ``TrainConfig().model`` (timm's hrnet_w18_small) with a
   ``num_classes``-way head from the manifest. Prints one line per step: loss and images/s.

Exits 0 when the loss is finite and every step got a full batch.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
from pathlib import Path

import ray
import ray.data
import torch
from ray.cluster_utils import Cluster

from shardkit.packer.run import pack
from shardkit.ray import read_split
from shardkit.train.config import TrainConfig
from shardkit.train.model import build_model
from shardkit.transforms import normalize_on_device

SAMPLE = Path(__file__).resolve().parent / "flowers-sample"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    t_start = time.perf_counter()

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False  # this script's own lines
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        print(f"cluster up in {time.perf_counter() - t_start:.1f} s: {len(ray.nodes())} nodes, "
              f"{ray.cluster_resources()['CPU']:.0f} CPUs")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "flowers"
            t0 = time.perf_counter()
            summary = pack(SAMPLE, out, engine="ray", shard_samples=32, progress=False)
            print(f"packed {summary.num_packed} images on Ray in "
                  f"{time.perf_counter() - t0:.1f} s")
            classes = json.loads((out / "manifest.json").read_text())["classes"]
            return train(out, len(classes), args)
    finally:
        ray.shutdown()
        cluster.shutdown()


def train(root: Path, num_classes: int, args) -> int:
    model = build_model(TrainConfig().model, num_classes).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    step, epoch, losses = 0, 0, []
    while step < args.steps:
        ds = read_split(root, "train", decode="train", seed=0, epoch=epoch,
                        image_size=args.image_size)
        t = time.perf_counter()
        # "key" is text (torch takes numbers only); the limit ends the stream where training
        # stops, so no Ray Data executor is left running when Ray shuts down
        rows = ds.select_columns(["image", "label"]).limit((args.steps - step) * args.batch_size)
        for batch in rows.iter_torch_batches(batch_size=args.batch_size, drop_last=True):
            images = batch["image"].permute(0, 3, 1, 2)  # (N, S, S, 3) -> (N, 3, S, S) uint8
            x = normalize_on_device(images, channels_last=True)
            loss = torch.nn.functional.cross_entropy(model(x), batch["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            now = time.perf_counter()
            print(f"epoch {epoch} step {step}: loss {losses[-1]:.3f}, "
                  f"{len(images) / (now - t):.0f} images/s")
            t, step = now, step + 1
        epoch += 1
    ok = len(losses) == args.steps and all(math.isfinite(v) for v in losses)
    mean = sum(losses) / max(1, len(losses))
    print(f"{'ok' if ok else 'FAILED'}: {len(losses)} steps, mean loss {mean:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
