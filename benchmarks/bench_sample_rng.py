"""The per-sample generator: one re-keyed in place (``SampleRng``) against a new one per sample.

    .venv/bin/python benchmarks/bench_sample_rng.py --data /tmp/flowers-wds [--repeats 8]

Two measurements, same run:

- ``build_us``: microseconds to get one sample's generator, ``sample_rng(seed, epoch, 0, i)``
  (a new ``Philox``, which first seeds itself from OS entropy) against ``SampleRng.at`` (the
  key set in place); best of 5 loops over 20,000 positions.
- ``loader``: ``make_loader`` images/s (thread backend, ``num_workers`` = cores, the default
  transform, ``--augment``) with the batch loop's generators re-keyed (today's loader) and with
  a new generator per sample (``shardkit.stream.datasets.sample_rngs`` forced to
  ``reuse=False``, the loader before the change), interleaved and alternating which goes first;
  the paired ratio is the median of each repeat's ``reused / new``, after one untimed epoch.

The draws are the same either way (tests/test_sharding.py), so the batches are identical.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import click

from _common import write_json


def _build_us(n: int = 20000) -> dict:
    from shardkit.sharding import SampleRng, sample_rng

    reused = SampleRng(0)
    out = {}
    for name, fn in (("new_us", lambda i: sample_rng(0, 1, 0, i)),
                     ("reused_us", lambda i: reused.at(1, 0, i))):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for i in range(n):
                fn(i)
            best = min(best, time.perf_counter() - t0)
        out[name] = best / n * 1e6
    return out


def _loader_rate(data, split, workers, augment, epoch) -> float:
    from shardkit.stream import make_loader

    with make_loader(data, split, 64, num_workers=workers, augment=augment) as loader:
        loader.set_epoch(epoch)
        it = iter(loader)
        next(it)  # threads started, first batch out of the clock
        n, t0 = 0, time.perf_counter()
        for _, labels in it:
            n += len(labels)
        return n / (time.perf_counter() - t0)


@click.command()
@click.option("--data", required=True, help="A packed dataset (shardkit pack output).")
@click.option("--split", default="train", show_default=True)
@click.option("--augment", default="none", show_default=True)
@click.option("--repeats", default=8, show_default=True)
@click.option("--out", default=None, help="Write the results as JSON here.")
def main(data, split, augment, repeats, out):
    import shardkit.stream.datasets as datasets
    from shardkit.bench.env import collect_environment

    workers = len(os.sched_getaffinity(0))
    reuse_as_asked = datasets.sample_rngs

    def new_each_sample(seed, reuse=False):
        return reuse_as_asked(seed, False)

    rows: dict[str, list[float]] = {"reused": [], "new": []}
    _loader_rate(data, split, workers, augment, 0)  # warm-up: page cache, decoders, imports
    try:
        for r in range(repeats):
            order = [("reused", reuse_as_asked), ("new", new_each_sample)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                datasets.sample_rngs = fn
                rows[name].append(_loader_rate(data, split, workers, augment, r))
            click.echo(f"repeat {r}: reused {rows['reused'][-1]:,.0f}, new {rows['new'][-1]:,.0f}"
                       " img/s", err=True)
    finally:
        datasets.sample_rngs = reuse_as_asked
    result = {
        "data": str(data), "split": split, "augment": augment, "workers": workers,
        "repeats": repeats, "build_us": _build_us(),
        "img_per_s": {k: {"median": statistics.median(v), "all": v} for k, v in rows.items()},
        "paired_reused_to_new": statistics.median(
            a / b for a, b in zip(rows["reused"], rows["new"])),
        "environment": collect_environment(decoders=["auto"]),
    }
    click.echo(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))
    if out:
        write_json(out, result, indent=1)


if __name__ == "__main__":
    main()
