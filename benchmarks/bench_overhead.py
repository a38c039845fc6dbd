"""Where the loader's time goes: make_loader against the fused transform's own rate, same run.

The target: ``make_loader`` (default thread backend, ``num_workers = cores``) reaches
>= 95% of the fused transform's single-thread rate times the cores. Measured side by side, each
repeat in turn (so drift of the machine hits every row alike), medians over ``--repeats``:

- ``fused_1thread``: :class:`shardkit.transforms.SampleTransform` on bytes already in memory, one
  thread, into one reused output row, each sample's generator re-keyed as the loader does
  (:class:`shardkit.sharding.SampleRng`): the per-core rate of the work itself;
- ``fused_Nthreads``: the same in ``cores`` bare threads (each its own transform): the parallel
  decode limit of this host without any loader machinery (< cores x the single rate when the
  cores share caches or memory bandwidth, or are SMT siblings);
- ``read``: :meth:`ShardSource.read` (allocating) vs :meth:`ShardSource.read_scratch` (reused
  buffer), per sample; ``batch_memory``: filling a fresh batch tensor vs a reused one, per batch;
- ``loader_thread`` / ``loader_process``: ``make_loader`` batches of ``--batch-size`` at
  ``num_workers = cores`` (images/s of the consumer, no step in between);
  ``loader_thread_last_whole``: the thread backend with its epoch's last batch built whole by
  one thread (``ThreadBackend.split_last = False``) instead of in parts by every thread.

Besides images/s, CPU milliseconds per image (``time.process_time``: all threads of this
process; not for worker processes) show the loader's own cost per image independently of what
else the machine runs: ``ratio_cpu_loader_thread_to_fused_1thread`` is 1 + the overhead.

Ratios in the JSON: ``loader / (fused_1thread x cores)`` (the target) and ``loader /
fused_Nthreads``, of the medians (``ratio_*``) and repeat by repeat (``paired_*``, the median of
each repeat's ratio). Usage::

    .venv/bin/python benchmarks/bench_overhead.py --data OUT [--split train] [--repeats 5]
"""
from __future__ import annotations

import json
import os
import statistics
import threading
import time

import click
import numpy as np

from _common import write_json


def _fused_rate(datas, cfg, threads: int) -> float:
    from shardkit.sharding import SampleRng
    from shardkit.transforms import make_transform

    tfs = [make_transform(cfg, True) for _ in range(threads)]
    for tf in tfs:
        tf(datas[0], SampleRng(0).at(0, 0, 0))  # decoder created outside the clock

    def work(j: int) -> None:
        out = np.empty((cfg.image_size, cfg.image_size, 3), np.uint8)
        rng = SampleRng(0)  # the loader's per-thread generator, re-keyed per sample
        for i in range(j, len(datas), threads):
            tfs[j](datas[i], rng.at(1, 0, i), out=out)

    t0, c0 = time.perf_counter(), time.process_time()
    pool = [threading.Thread(target=work, args=(j,)) for j in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return len(datas) / (time.perf_counter() - t0), (time.process_time() - c0) / len(datas) * 1e3


def _loader_rate(root, split, batch_size, size, workers, backend, epoch,
                 split_last: bool = True) -> float:
    from shardkit.stream import WorkerOptions, make_loader
    from shardkit.stream.backends import ThreadBackend

    ThreadBackend.split_last = split_last
    with make_loader(root, split, batch_size, num_workers=workers, image_size=size,
                     workers=WorkerOptions(backend=backend)) as loader:
        loader.set_epoch(epoch)
        it = iter(loader)
        next(it)  # threads / workers started, first batch out of the clock
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        for _, labels in it:
            n += len(labels)
        cpu = (time.process_time() - c0) / n * 1e3 if backend == "thread" else float("nan")
        return n / (time.perf_counter() - t0), cpu


def _batch_memory_cost(batch_size: int, size: int, n: int = 30) -> dict:
    """ms per batch to fill a fresh ``(B, 3, S, S)`` uint8 channels_last batch (allocation, page
    faults and zeroing by the kernel included) vs to fill one reused buffer (the thread
    backend's :class:`~shardkit.stream.datasets.BufferPool`)."""
    import torch

    def fill(t):
        t.permute(0, 2, 3, 1).numpy()[...] = 7

    shape = (batch_size, 3, size, size)
    t0 = time.perf_counter()
    for _ in range(n):
        fill(torch.empty(shape, dtype=torch.uint8, memory_format=torch.channels_last))
    fresh = (time.perf_counter() - t0) / n * 1e3
    buf = torch.empty(shape, dtype=torch.uint8, memory_format=torch.channels_last)
    t0 = time.perf_counter()
    for _ in range(n):
        fill(buf)
    return {"fresh_batch_ms": fresh, "reused_batch_ms": (time.perf_counter() - t0) / n * 1e3}


def _read_cost(source, n: int) -> dict:
    res = {}
    for name, fn in (("read_us", source.read), ("read_scratch_us", source.read_scratch)):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        res[name] = (time.perf_counter() - t0) / n * 1e6
    return res


@click.command()
@click.option("--data", required=True, help="A packed dataset (shardkit pack output).")
@click.option("--split", default="train", show_default=True)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--image-size", default=224, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--workers", default=0, help="Threads/workers (0 = the number of cores).")
@click.option("--out", default=None, help="Write the results as JSON here.")
def main(data, split, batch_size, image_size, repeats, workers, out):
    from shardkit.bench.env import collect_environment
    from shardkit.stream.source import ShardSource
    from shardkit.transforms import TransformConfig

    cores = len(os.sched_getaffinity(0))
    workers = workers or cores
    source = ShardSource(data, split)
    datas = [bytes(source.read(i)) for i in range(len(source))]
    cfg = TransformConfig(image_size=image_size)
    rows: dict[str, list[float]] = {k: [] for k in ("fused_1thread", "fused_Nthreads",
                                                    "loader_thread", "loader_thread_last_whole",
                                                    "loader_process")}
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    reads: list[dict] = []

    def add(name, rate_cpu):
        rows[name].append(rate_cpu[0])
        cpu[name].append(rate_cpu[1])

    for r in range(repeats):
        add("fused_1thread", _fused_rate(datas, cfg, 1))
        add("fused_Nthreads", _fused_rate(datas, cfg, workers))
        for backend in ("thread", "process"):
            add(f"loader_{backend}",
                _loader_rate(data, split, batch_size, image_size, workers, backend, r))
        add("loader_thread_last_whole",
            _loader_rate(data, split, batch_size, image_size, workers, "thread", r, False))
        reads.append({**_read_cost(source, min(len(source), 2000)),
                      **_batch_memory_cost(batch_size, image_size)})
        click.echo(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rows.items()),
                   err=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    limit = med["fused_1thread"] * cores
    result = {
        "data": str(data), "split": split, "samples": len(datas), "cores": cores,
        "workers": workers, "batch_size": batch_size, "image_size": image_size,
        "repeats": repeats, "img_per_s": {k: {"median": med[k], "all": v} for k, v in rows.items()},
        "cpu_ms_per_img": {k: statistics.median(v) for k, v in cpu.items()
                           if k != "loader_process"},
        "ratio_cpu_loader_thread_to_fused_1thread": (statistics.median(cpu["loader_thread"])
                                                     / statistics.median(cpu["fused_1thread"])),
        "read_us_per_sample": {k: statistics.median(d[k] for d in reads)
                               for k in ("read_us", "read_scratch_us")},
        "batch_memory_ms": {k: statistics.median(d[k] for d in reads)
                            for k in ("fresh_batch_ms", "reused_batch_ms")},
        "ratio_loader_thread_to_cores_x_fused": med["loader_thread"] / limit,
        "ratio_loader_process_to_cores_x_fused": med["loader_process"] / limit,
        "ratio_loader_thread_to_fused_Nthreads": med["loader_thread"] / med["fused_Nthreads"],
        "ratio_loader_thread_last_whole_to_cores_x_fused": med["loader_thread_last_whole"] / limit,
        "ratio_fused_Nthreads_to_cores_x_fused": med["fused_Nthreads"] / limit,
        # the same ratios repeat by repeat (each row against the fused rows of its own repeat):
        # the host's speed drifts by up to 20% within one run, and this cancels it
        "paired_loader_thread_to_cores_x_fused": statistics.median(
            a / (b * cores) for a, b in zip(rows["loader_thread"], rows["fused_1thread"])),
        "paired_loader_thread_to_fused_Nthreads": statistics.median(
            a / b for a, b in zip(rows["loader_thread"], rows["fused_Nthreads"])),
        "paired_fused_Nthreads_to_cores_x_fused": statistics.median(
            a / (b * cores) for a, b in zip(rows["fused_Nthreads"], rows["fused_1thread"])),
        "environment": collect_environment(decoders=["auto"]),
    }
    click.echo(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=1))
    if out:
        write_json(out, result, indent=1)


if __name__ == "__main__":
    main()
