"""Where the loader's own time goes per image, beside the transform it runs (goal 5's gap).

``make_loader`` reaches ~0.93-0.96x of bare decoding threads (``bench_overhead.py``); this says
what the rest is. One process, ``num_workers=0`` (every batch built in the calling thread, the
same ``BatchDataset.build`` the worker threads run), wall time per image of each stage, timed by
wrapping the stage's method (``time.perf_counter_ns`` around each call; a wrapper adds ~0.3-0.5
us per call, so a stage's figure includes the wrappers of the stages inside it):

- ``loader``: whole epochs of the loader, per image;
- ``build_part``: the batch loop (every row), ``row``: one row, ``read_scratch``: the read
  (``read_into`` and ``preadv`` inside it: the copy from the page cache), ``checksum``: the
  xxh3 of the read bytes, ``transform``: ``SampleTransform.__call__`` (crop draw, header,
  decode and resize);
- ``start_batch`` + ``finish_batch``: the batch memory, labels and meta;
- ``transform_alone``: the same transform on bytes already in memory, in a tight loop (what
  ``bench_overhead.py``'s baseline runs).

``--stub-decode`` replaces the ROI decoder's one C call (decode + resize) by a no-op: what is
left is the Python and the read of each stage, the part a second thread waits for. Usage::

    .venv/bin/python benchmarks/bench_loader_parts.py --data OUT [--stub-decode] [--epochs 4]
        [--out benchmarks/results/loader-parts.json]

Figures are wall times on one thread of a machine that should be otherwise idle; compare them
within one run.
"""
from __future__ import annotations

import collections
import os
import time

import click
import numpy as np

from _common import write_json


class _Stub:
    """The ``_jpegroi`` module with ``crop_resize`` a no-op (no decode, no resize)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def crop_resize(*args):
        return 0, None


def _timed(acc: collections.Counter, owner, name: str, label: str) -> None:
    f = getattr(owner, name)
    clock = time.perf_counter_ns

    def wrapper(*a, **k):
        t = clock()
        try:
            return f(*a, **k)
        finally:
            acc[label] += clock() - t

    setattr(owner, name, wrapper)


@click.command()
@click.option("--data", required=True, help="A packed wds dataset (shardkit pack output).")
@click.option("--split", default="train", show_default=True)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--epochs", default=4, show_default=True, type=click.IntRange(min=1),
              help="Timed epochs (after one warm-up).")
@click.option("--stub-decode/--real-decode", default=False, show_default=True,
              help="Replace the decode + resize C call by a no-op.")
@click.option("--out", default=None, help="Write the results as JSON here.")
def main(data, split, batch_size, epochs, stub_decode, out):
    from shardkit.bench.env import collect_environment
    from shardkit.decode import roi
    from shardkit.formats import wds
    from shardkit.sharding import SampleRng
    from shardkit.stream import datasets, make_loader, source, stages
    from shardkit.transforms import SampleTransform, TransformConfig, make_transform

    if stub_decode:
        roi._jpegroi = _Stub(roi._jpegroi)
    acc: collections.Counter = collections.Counter()
    parts = [(datasets.BatchDataset, "build_part", "build_part"),
             (datasets.BatchDataset, "start_batch", "start_batch"),
             (datasets.BatchDataset, "finish_batch", "finish_batch"),
             (stages.SampleStages, "row", "row"),
             (source.ShardSource, "read_scratch", "read_scratch"),
             (source.ShardSource, "_checked", "checksum"),
             (wds.Reader, "read_into", "read_into"),
             (SampleTransform, "__call__", "transform")]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in parts]
    for owner, name, label in parts:
        _timed(acc, owner, name, label)
    preadv = os.preadv  # the read's copy from the page cache (wds.Reader calls os.preadv)

    def timed_preadv(*a):
        t = time.perf_counter_ns()
        try:
            return preadv(*a)
        finally:
            acc["preadv"] += time.perf_counter_ns() - t

    os.preadv = timed_preadv
    rates = []
    try:
        with make_loader(data, split, batch_size, num_workers=0) as loader:
            n = 0
            for e in range(epochs + 1):
                if e == 1:
                    acc.clear()
                    n = 0
                    t0 = time.perf_counter()
                loader.set_epoch(e)
                t1, m = time.perf_counter(), 0
                for _, y in loader:
                    m += len(y)
                if e:
                    n += m
                    rates.append(m / (time.perf_counter() - t1))
            loader_us = (time.perf_counter() - t0) / n * 1e6
    finally:
        for owner, name, f in originals:
            setattr(owner, name, f)
        os.preadv = preadv
    per_image = {k: v / n / 1e3 for k, v in acc.items()}
    # the transform alone, on bytes in memory, one reused row, the loader's generator
    src = source.ShardSource(data, split)
    datas = [bytes(src.read(i)) for i in range(min(len(src), 1000))]
    tf = make_transform(TransformConfig(image_size=224), True)
    row = np.empty((224, 224, 3), np.uint8)
    rng = SampleRng(0)
    best = float("inf")
    for rep in range(5):
        t = time.perf_counter()
        for i, d in enumerate(datas):
            tf(d, rng.at(rep, 0, i), out=row)
        best = min(best, (time.perf_counter() - t) / len(datas) * 1e6)
    if stub_decode:
        roi._jpegroi = roi._jpegroi._real
    result = {
        "data": str(data), "split": split, "batch_size": batch_size, "epochs": epochs,
        "stub_decode": stub_decode, "images_per_epoch": n // epochs,
        "us_per_image": {"loader": loader_us, **per_image, "transform_alone": best},
        "loader_minus_transform_alone_us": loader_us - best,
        "epoch_images_per_s": rates,
        "environment": collect_environment(decoders=["auto"]),
    }
    click.echo(f"{'stage':22s} us/image" + ("  (decode stubbed)" if stub_decode else ""))
    for k, v in result["us_per_image"].items():
        click.echo(f"  {k:20s} {v:8.2f}")
    click.echo(f"  loader - transform alone: {result['loader_minus_transform_alone_us']:.2f} us")
    if out:
        write_json(out, result, indent=1)


if __name__ == "__main__":
    main()
