"""Peers that run on torch's DataLoader, and shardkit, on one ImageFolder (see common.py).

Usage (the project's own interpreter; shardkit must be importable)::

    .venv/bin/python benchmarks/peers/peerbench.py SRC WORK [PIPELINE ...] [--workers N]
        [--epochs N] [--out FILE.jsonl]

Pipelines (default: every one whose package is installed; a requested one that is missing is an
error):

- ``imagefolder_pil``: ``torchvision.datasets.ImageFolder`` + PIL, RandomResizedCrop(224) +
  RandomHorizontalFlip + ToTensor + Normalize (ImageNet mean/std): float32 batches.
- ``imagefolder_pil_uint8``: the same with ``PILToTensor``: uint8 batches (the baseline).
- ``webdataset_pil``: tar shards of 256 samples (fewer when the folder is too small to give
  every worker two shards) written with ``webdataset.ShardWriter`` in a seeded random order,
  read with node and worker splitting, a 1,000-sample shuffle buffer, PIL decode and the float
  transform, batched in the workers (``WebLoader(batch_size=None)``).
- ``litdata_pil``: ``litdata.optimize`` into 16 MB chunks, then ``StreamingDataLoader`` with the
  float transform (``pip install litdata``).
- ``mosaic_pil``: ``streaming.MDSWriter`` (16 MiB shards), then ``StreamingDataset`` with the
  float transform (``pip install mosaicml-streaming``).
- ``shardkit``: ``shardkit pack SRC WORK/shardkit-<fmt> --split train=1.0`` for each format
  (wds, lmdb, hdf5), then ``shardkit.make_loader(..., train=True, image_size=224)`` with its
  defaults (thread backend, prefetch 2): uint8 channels-last batches.
- ``shardkit_cached``: the wds pack only, ``make_loader(..., cache="ram")``: the
  untimed warm-up epoch decodes every image once into the shared-memory arena (its time is
  reported as ``fill_s``), the timed epochs crop from the cached pixels (original JPEG bytes
  stay on disk). The side-by-side peer is FFCV's ``MODE=raw`` (``peer_ffcv.py``).

Every DataLoader peer uses ``shuffle`` (or its own shuffling), ``--workers`` worker processes and
``persistent_workers=True`` (when ``--workers`` > 0), so no peer pays worker start-up per epoch.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader

from common import BATCH, IMAGE_SIZE, emit, list_images, parse_args, time_epochs

PIPELINES = ["imagefolder_pil", "imagefolder_pil_uint8", "webdataset_pil", "litdata_pil",
             "mosaic_pil", "shardkit", "shardkit_cached"]
NEEDS = {"webdataset_pil": "webdataset", "litdata_pil": "litdata", "mosaic_pil": "streaming",
         "shardkit": "shardkit", "shardkit_cached": "shardkit"}
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # ImageNet, as torchvision's examples
FLOAT_TF = T.Compose([T.RandomResizedCrop(IMAGE_SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])
UINT8_TF = T.Compose([T.RandomResizedCrop(IMAGE_SIZE), T.RandomHorizontalFlip(),
                      T.PILToTensor()])


def _counter(loader):
    """One epoch of ``loader`` -> the number of images (labels are the batch's second item)."""
    return lambda: sum(len(batch[1]) for batch in loader)


def _worker_kwargs(workers: int) -> dict:
    return {"num_workers": workers, "persistent_workers": workers > 0}


def _decode_float(data: bytes) -> torch.Tensor:
    return FLOAT_TF(Image.open(io.BytesIO(data)).convert("RGB"))


def _fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    return path


def imagefolder(args, files, uint8: bool):
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(args.src, transform=UINT8_TF if uint8 else FLOAT_TF)
    return DataLoader(ds, batch_size=BATCH, shuffle=True, **_worker_kwargs(args.workers))


def webdataset_pil(args, files):
    import webdataset as wds

    out = _fresh(os.path.join(args.work, "wds"))
    os.makedirs(out)
    # 256 per shard; fewer for a small folder, so every worker gets at least two shards
    per_shard = min(256, -(-len(files) // (2 * max(1, args.workers))))
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=per_shard,
                         verbose=0) as sink:
        for i in np.random.default_rng(0).permutation(len(files)):
            path, label = files[i]
            with open(path, "rb") as f:
                sink.write({"__key__": f"{i:07d}", "jpg": f.read(), "cls": str(label).encode()})
    urls = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tar"))
    ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node,
                         workersplitter=wds.split_by_worker)
          .shuffle(1000).decode("pil").to_tuple("jpg", "cls").map_tuple(FLOAT_TF, int)
          .batched(BATCH))
    return wds.WebLoader(ds, batch_size=None, **_worker_kwargs(args.workers))


def _litdata_item(item):
    path, label = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": label}


def litdata_pil(args, files):
    import litdata

    out = _fresh(os.path.join(args.work, "litdata"))
    # fork: a spawn start method set here would stick for the whole process
    litdata.optimize(fn=_litdata_item, inputs=list(files), output_dir=out, chunk_bytes="16MB",
                     num_workers=1, start_method="fork")
    ds = _peer_class("litdata")(out, shuffle=True)
    return litdata.StreamingDataLoader(ds, batch_size=BATCH, **_worker_kwargs(args.workers))


def mosaic_pil(args, files):
    from streaming import MDSWriter

    out = _fresh(os.path.join(args.work, "mds"))
    with MDSWriter(out=out, columns={"jpg": "bytes", "cls": "int"}, size_limit=1 << 24) as w:
        for path, label in files:
            with open(path, "rb") as f:
                w.write({"jpg": f.read(), "cls": label})
    ds = _peer_class("streaming")(local=out, shuffle=True, batch_size=BATCH)
    return DataLoader(ds, batch_size=BATCH, **_worker_kwargs(args.workers))


def _peer_class(package: str):
    """The peer's dataset class with the float PIL transform in ``__getitem__``."""
    return {"litdata": LitDataPIL, "streaming": MosaicPIL}[package]


try:  # module level, so the classes pickle under any start method
    import litdata as _litdata

    class LitDataPIL(_litdata.StreamingDataset):
        def __getitem__(self, idx):
            sample = super().__getitem__(idx)
            return _decode_float(sample["jpg"]), sample["cls"]
except ImportError:
    LitDataPIL = None
try:
    import streaming as _streaming

    class MosaicPIL(_streaming.StreamingDataset):
        def __getitem__(self, idx):
            sample = super().__getitem__(idx)
            return _decode_float(sample["jpg"]), sample["cls"]
except ImportError:
    MosaicPIL = None


def run_shardkit(args):
    import shardkit

    for fmt in ("wds", "lmdb", "hdf5"):
        out = _fresh(os.path.join(args.work, f"shardkit-{fmt}"))
        subprocess.run([sys.executable, "-m", "shardkit.cli", "pack", args.src, out, "--format",
                        fmt, "--split", "train=1.0", "--no-progress"], check=True,
                       capture_output=True)
        loader = shardkit.make_loader(out, "train", BATCH, num_workers=args.workers,
                                      prefetch_factor=2, pin_memory=False, train=True,
                                      image_size=IMAGE_SIZE)
        time_epochs(f"shardkit_{fmt}", _counter(loader), args,
                    "uint8 (N, 3, 224, 224) channels-last",
                    backend=getattr(loader, "backend_name", loader.backend))


def run_shardkit_cached(args):
    """As :func:`common.time_epochs` (one untimed warm-up epoch, here the fill, then
    ``--epochs`` timed ones), with the fill epoch's seconds and the cache's size in the row."""
    import time

    import shardkit

    out = _fresh(os.path.join(args.work, "shardkit-wds-cached"))
    subprocess.run([sys.executable, "-m", "shardkit.cli", "pack", args.src, out, "--format",
                    "wds", "--split", "train=1.0", "--no-progress"], check=True,
                   capture_output=True)
    with shardkit.make_loader(out, "train", BATCH, num_workers=args.workers, prefetch_factor=2,
                              pin_memory=False, train=True, image_size=IMAGE_SIZE,
                              cache="ram") as loader:
        count = _counter(loader)
        t0 = time.perf_counter()
        filled = count()
        fill_s = time.perf_counter() - t0
        start = time.perf_counter()
        images = sum(count() for _ in range(args.epochs))
        seconds = time.perf_counter() - start
        stats = loader.cache_stats()
        row = {"pipeline": "shardkit_cached", "output": "uint8 (N, 3, 224, 224) channels-last",
               "images": images, "seconds": round(seconds, 2),
               "img_per_s": round(images / seconds, 1), "workers": args.workers,
               "epochs": args.epochs, "batch": BATCH, "backend": loader.backend_name,
               "fill_s": round(fill_s, 2), "fill_img_per_s": round(filled / fill_s, 1),
               "cache_bytes": stats["size_bytes"], "hit_rate": round(stats["hit_rate"], 4)}
    emit(row, args.out)
    return row


def _installed(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], pipelines=PIPELINES)
    wanted = args.pipelines or [p for p in PIPELINES if _installed(NEEDS.get(p, "torchvision"))]
    missing = [p for p in wanted if not _installed(NEEDS.get(p, "torchvision"))]
    if missing:
        raise SystemExit(f"not installed for {missing}: "
                         f"{sorted({NEEDS[p] for p in missing})} (see benchmarks/peers/README.md)")
    os.makedirs(args.work, exist_ok=True)
    _, files = list_images(args.src)
    float_out = "float32 (N, 3, 224, 224), normalized"
    for name in [p for p in PIPELINES if p in wanted]:  # always in the same order
        if name == "shardkit":
            run_shardkit(args)
        elif name == "shardkit_cached":
            run_shardkit_cached(args)
        elif name.startswith("imagefolder"):
            uint8 = name.endswith("uint8")
            time_epochs(name, _counter(imagefolder(args, files, uint8)), args,
                        "uint8 (N, 3, 224, 224)" if uint8 else float_out)
        else:
            build = {"webdataset_pil": webdataset_pil, "litdata_pil": litdata_pil,
                     "mosaic_pil": mosaic_pil}[name]
            time_epochs(name, _counter(build(args, files)), args, float_out)


if __name__ == "__main__":
    main()
