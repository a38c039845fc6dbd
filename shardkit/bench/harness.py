"""Times any iterable of batches against a step: loader wait, step time, throughput, data wait.

The loop, per batch after ``warmup`` batches (warm-up excluded from every number, case 20)::

    t0 = clock(); batch = next(it); t1 = clock()    # loader time: blocked waiting for the batch
    step(batch)                                     # returns after device synchronisation
    t2 = clock()                                    # step time = t2 - t1

``data_wait_fraction`` = sum of loader times / wall time of the timed window: the share of time a
device running ``step`` would sit idle waiting for data. ``clock`` is ``time.perf_counter``.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from shardkit.bench.monitor import ProcessMonitor
from shardkit.bench.steps import NoStep, Step, batch_images
from shardkit.errors import BenchError, ConfigError

__all__ = ["RunResult", "time_batches", "measure", "summarize", "METRICS"]

# Metrics summarised over repeats (name -> unit), in table order.
METRICS = {
    "loader_ms_per_batch": "ms", "step_ms_per_batch": "ms", "throughput_img_s": "img/s",
    "data_wait_fraction": "", "cpu_util_cores": "cores", "cpu_util_percent": "%",
    "memory_mb": "MiB", "loader_ms_p90": "ms", "system_cpu_percent": "%",
    "img_per_cpu_s": "img/CPU-s",
}


@dataclass
class RunResult:
    """One timed window (one repeat): per-batch times in ms and the process monitor's summary."""

    loader_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    images: int = 0
    wall_s: float = 0.0
    resources: dict = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """``{metric: value}`` for :data:`METRICS` (per-batch means; fraction in [0, 1]; the
        resource metrics only when a monitor ran)."""
        n = len(self.loader_ms)
        loader_total = sum(self.loader_ms) / 1000.0
        loader_sorted = sorted(self.loader_ms)
        out = {
            "loader_ms_per_batch": sum(self.loader_ms) / n,
            "step_ms_per_batch": sum(self.step_ms) / n,
            "throughput_img_s": self.images / self.wall_s,
            "data_wait_fraction": min(1.0, loader_total / self.wall_s),
            "loader_ms_p90": loader_sorted[min(n - 1, int(0.9 * n))],
        }
        for key in ("cpu_util_cores", "cpu_util_percent", "memory_mb", "system_cpu_percent"):
            if key in self.resources:
                out[key] = self.resources[key]
        if self.resources.get("cpu_util_cores"):
            # images per CPU-second used by main + workers: the pipeline's cost per image, which
            # (unlike img/s) does not shrink when other users load the machine
            out["img_per_cpu_s"] = out["throughput_img_s"] / self.resources["cpu_util_cores"]
        return out


def _num_images(batch) -> int:
    images = batch_images(batch)
    if images is not None:
        return int(images.shape[0])
    try:
        return len(batch)
    except TypeError:
        return 1


def time_batches(batches: Iterable, step: Step | None = None, *, warmup: int = 2,
                 max_batches: int | None = None, monitor: ProcessMonitor | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> RunResult:
    """Time one pass over ``batches`` (see the module docstring for what is measured).

    Args:
        batches: any iterable of batches; a batch is ``(images, labels)`` with images
            ``(N, 3, S, S)`` uint8, or anything with ``len()`` (N images).
        step: the per-batch step (default :class:`NoStep`); must return after synchronising.
        warmup: batches consumed (and stepped) before timing starts, >= 0.
        max_batches: timed batches at most (default: until the iterable ends), >= 1.
        monitor: CPU/memory sampler started after warm-up and stopped before the iterator is
            released (so DataLoader workers are still alive when their CPU time is read).

    Returns:
        :class:`RunResult` with one loader and one step time per timed batch, in ms.

    Raises:
        ConfigError: ``warmup`` < 0 or ``max_batches`` < 1.
        BenchError: the iterable ends before warm-up is done or before one timed batch.
    """
    if warmup < 0:
        raise ConfigError(f"warmup={warmup}; expected >= 0")
    if max_batches is not None and max_batches < 1:
        raise ConfigError(f"max_batches={max_batches}; expected >= 1")
    step = step or NoStep()
    it = iter(batches)
    for i in range(warmup):
        try:
            batch = next(it)
        except StopIteration:
            raise BenchError(f"the loader ended after {i} batch(es), during warm-up "
                             f"(warmup={warmup}); use a smaller --warmup or --batch-size") from None
        step(batch)
    result = RunResult()
    if monitor is not None:
        monitor.start()
    try:
        start = clock()
        while max_batches is None or len(result.loader_ms) < max_batches:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = clock()
            step(batch)
            t2 = clock()
            result.loader_ms.append((t1 - t0) * 1000.0)
            result.step_ms.append((t2 - t1) * 1000.0)
            result.images += _num_images(batch)
        result.wall_s = clock() - start
    finally:
        if monitor is not None:
            result.resources = monitor.stop()
    del it  # releases DataLoader workers (non-persistent) only after the monitor read them
    if not result.loader_ms:
        raise BenchError(f"the loader yielded no batch after warm-up (warmup={warmup}); it needs "
                         f"more than {warmup} batches: use a smaller --warmup or --batch-size")
    return result


def summarize(values: list[float]) -> dict:
    """``{"median", "min", "max", "q1", "q3", "values"}`` of a non-empty list of numbers."""
    ordered = sorted(values)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "q1": q1, "q3": q3, "values": list(values)}


def measure(make_batches: Callable[[int], Iterable], step: Step | None = None, *,
            repeats: int = 3, warmup: int = 2, max_batches: int | None = None,
            monitor: bool = True, monitor_interval: float = 0.5) -> dict:
    """Run :func:`time_batches` ``repeats`` times and summarise every metric over the repeats.

    Args:
        make_batches: ``repeat_index -> iterable`` (for a loader: ``set_epoch(i)`` then the
            loader itself; a fresh ``iter()`` is taken per repeat).
        repeats: timed passes, >= 1.
        monitor: sample CPU and PSS of this process and its workers.

    Returns:
        ``{"metrics": {name: summarize(...)}, "batches_timed": [int per repeat],
        "images_timed": [int], "memory_kind": str | None}``.

    Raises:
        ConfigError: ``repeats`` < 1 (and see :func:`time_batches`).
    """
    if repeats < 1:
        raise ConfigError(f"repeats={repeats}; expected >= 1")
    runs = []
    for r in range(repeats):
        mon = ProcessMonitor(monitor_interval) if monitor else None
        runs.append(time_batches(make_batches(r), step, warmup=warmup, max_batches=max_batches,
                                 monitor=mon))
    per_run = [run.metrics() for run in runs]
    names = [m for m in METRICS if all(m in pr for pr in per_run)]
    return {"metrics": {m: summarize([pr[m] for pr in per_run]) for m in names},
            "batches_timed": [len(run.loader_ms) for run in runs],
            "images_timed": [run.images for run in runs],
            "memory_kind": runs[0].resources.get("memory_kind") if monitor else None}
