"""Meta's SPDL (0.8) thread pipeline on the same ImageFolder (see common.py).

Usage (in SPDL's own venv, see README.md)::

    /tmp/spdl-venv/bin/python benchmarks/peers/peer_spdl.py SRC

How SPDL's examples build an ImageNet-style CPU loader: a shuffled ``(path, label)`` source ->
``pipe(decode, concurrency=--workers)`` -> ``aggregate(64)`` (last partial batch kept) ->
``pipe(collate)`` -> sink, built once with ``--workers`` threads and reused every epoch
(``add_source(continuous=True)``, the counterpart of persistent workers).

``decode`` demuxes the JPEG with ``spdl.io.demux_image``, draws the crop box with the same
algorithm as torchvision's ``RandomResizedCrop.get_params`` (scale 0.08..1, log-uniform ratio
3/4..4/3, 10 tries, then a centre crop) and a flip with p = 0.5, and lets FFmpeg crop, scale
(bilinear) and flip while decoding. ``collate`` copies the frames into one batch buffer:
``(N, 3, 224, 224)`` uint8 (a channels-last view), labels int64.
Differences from the PIL peers: FFmpeg's decoder and swscale instead of libjpeg-turbo + PIL
(same geometry; pixel values differ slightly), and Python's ``random.Random(0)`` draws.
"""
from __future__ import annotations

import math
import random

import spdl.io
import torch
from spdl.pipeline import PipelineBuilder
from spdl.source.utils import embed_shuffle

from common import BATCH, IMAGE_SIZE, list_images, parse_args, time_epochs

SCALE, RATIO = (0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0)
RNG = random.Random(0)


class Source:
    """``(path, label)`` items, reshuffled by SPDL's ``embed_shuffle`` with the epoch as seed."""

    def __init__(self, items):
        self.items = list(items)

    def shuffle(self, seed: int) -> None:
        random.Random(seed).shuffle(self.items)

    def __iter__(self):
        return iter(list(self.items))

    def __len__(self) -> int:
        return len(self.items)


def crop_box(height: int, width: int) -> tuple[int, int, int, int]:
    """(top, left, h, w) drawn as torchvision's ``RandomResizedCrop.get_params`` does."""
    area = height * width
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * RNG.uniform(*SCALE)
        aspect = math.exp(RNG.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return RNG.randint(0, height - h), RNG.randint(0, width - w), h, w
    ratio = width / height
    if ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif ratio > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def decode(item):
    path, label = item
    packets = spdl.io.demux_image(path)
    top, left, h, w = crop_box(packets.height, packets.width)
    graph = (f"crop=w={w}:h={h}:x={left}:y={top}:exact=1,"
             f"scale=w={IMAGE_SIZE}:h={IMAGE_SIZE}:flags=bilinear")
    if RNG.random() < 0.5:
        graph += ",hflip"
    desc = spdl.io.get_video_filter_desc(filter_desc=graph, pix_fmt="rgb24")
    return spdl.io.decode_packets(packets, filter_desc=desc), label


def collate(items):
    frames, labels = zip(*items)
    batch = spdl.io.to_torch(spdl.io.convert_frames(list(frames))).permute(0, 3, 1, 2)
    return batch, torch.tensor(labels, dtype=torch.int64)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], work=False)
    _, files = list_images(args.src)
    workers = max(1, args.workers)
    pipeline = (PipelineBuilder()
                .add_source(embed_shuffle(Source(files)), continuous=True)
                .pipe(decode, concurrency=workers)
                .aggregate(BATCH)
                .pipe(collate)
                .add_sink(2 * workers)
                .build(num_threads=workers, max_failures=0))  # a failed decode ends the run
    with pipeline.auto_stop():
        time_epochs("spdl_cpu", lambda: sum(len(y) for _, y in pipeline.get_iterator()), args,
                    "uint8 (N, 3, 224, 224) channels-last view")


if __name__ == "__main__":
    main()
