"""torchrun script for tests/test_distributed.py (field case 2): each rank reads one epoch of a
packed split with 2 DataLoader workers, through ShardDataset and through make_loader, and rank 0
writes what every rank saw to ``--out`` (JSON).

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

from shardkit.dataset import ShardDataset
from shardkit.loader import make_loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    ds = ShardDataset(args.root, "train", decode=False, shuffle=True, seed=7,
                      batch_size=args.batch_size)
    keys = [s["key"] for s in DataLoader(ds, batch_size=None, num_workers=2, timeout=60)]

    loader = make_loader(args.root, "train", args.batch_size, num_workers=2, image_size=8,
                         return_meta=True, timeout=60)
    batches, index, valid = 0, [], []
    for images, labels, meta in loader:
        batches += 1
        index += meta["index"].tolist()
        valid += meta["valid"].tolist()
    mine = {"rank": rank, "world_size": world, "dataset_keys": keys,
            "dataset_world": [ds.rank, ds.world_size], "loader_len": len(loader),
            "loader_batches": batches, "loader_index": index, "loader_valid": valid,
            "even": loader.dataset.even}
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
