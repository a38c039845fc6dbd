"""torchrun script for tests/test_distributed.py (field case 2): each rank reads one epoch of a
packed split through ShardDataset (2 DataLoader workers) and through make_loader on both backends
(2 decoding threads; 2 worker processes), and rank 0 writes what every rank saw to ``--out``
(JSON: one object per rank, the loader's results per backend under ``"loaders"``).

Run: ``torchrun --nproc_per_node 2 tests/dist_worker.py --root OUT --out result.json``
(gloo backend, CPU). rank/world_size are NOT passed to shardkit: they come from the initialised
process group.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardkit.stream import SamplingOptions, ShardDataset, WorkerOptions, make_loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    ds = ShardDataset(args.root, "train", decode=False, sampling=SamplingOptions(shuffle=True),
                      seed=7, batch_size=args.batch_size)
    keys = [s["key"] for s in DataLoader(ds, batch_size=None, num_workers=2, timeout=60)]

    loaders = {}
    for backend in ("thread", "process"):
        with make_loader(args.root, "train", args.batch_size, num_workers=2, image_size=8,
                         return_meta=True,
                         workers=WorkerOptions(backend=backend, timeout=60)) as loader:
            batches, index, valid = 0, [], []
            for images, labels, meta in loader:
                batches += 1
                index += meta["index"].tolist()
                valid += meta["valid"].tolist()
            s = loader.dataset.sampling
            loaders[backend] = {"len": len(loader), "batches": batches, "index": index,
                                "valid": valid, "even": s.even, "world": [s.rank, s.world_size]}
    mine = {"rank": rank, "world_size": world, "dataset_keys": keys,
            "dataset_world": [ds.sampling.rank, ds.sampling.world_size], "loaders": loaders}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(gathered, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
