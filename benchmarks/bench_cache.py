"""Decoded cache: a cached epoch against an uncached epoch of the same loader, same run.

    .venv/bin/python benchmarks/bench_cache.py --data OUT --repeats 3 \\
        --out benchmarks/results/cache-flowers.json

(OUT: ``shardkit pack ../shared/data/flowers OUT --split-ratios train=0.8,val=0.1,test=0.1``.)
It prints and writes ``ratio_fill_to_uncached`` (target >= 0.9) and
``ratio_cached_to_uncached`` (target >= 2.0), medians over the interleaved repeats.

Rows, each repeat in turn (drift of the machine hits every row alike), medians over ``--repeats``;
``make_loader(root, split, --batch-size, num_workers=--workers)``, RandomResizedCrop 224 + flip,
consumer images/s, no step in between:

- ``uncached``: ``cache="none"``, one epoch;
- ``fill``: ``cache="ram"`` on a fresh arena (its own tmpfs folder per repeat): the first epoch,
  which decodes every image and stores it;
- ``cached``: the next epoch of that loader, every sample from the arena (``verify_reads`` on:
  each hit's pixels checked against their xxh3, the default);
- ``cached_noverify``: the same with ``verify_reads=False``;
- ``cached_max256``: ``cache_max_side=256`` (fill, then this epoch), with the mean absolute
  pixel difference of its batches to the uncached epoch's (same epoch, same crops): the quality
  price of the smaller cache.

Ratios: ``cached / uncached`` (target >= 2.0), ``fill / uncached`` (target >= 0.9, i.e. the fill
epoch within 10%), of the median rates, and the median of each repeat's own ratios (its rows run
back to back, so a busy machine moves both alike). Memory: arena bytes per image and per split, at full size and at 256.

``--memory``: instead, PSS per process (``/proc/PID/smaps`` and ``smaps_rollup``, via
:func:`shardkit.stream.cache.arena_memory`) of a ``cache="ram"`` loader with ``--workers``
DataLoader worker processes (``backend="process"``, fork, persistent), after a fill epoch and
``--repeats`` cached epochs, next to the same loader uncached: the arena's RSS in each process,
its PSS summed over main + workers (one copy), and each process's whole PSS.

``--fill-breakdown``: instead, where the fill epoch's time goes, single thread, per image, each
step timed back to back on the same image and the minimum over ``--repeats`` passes kept (so
load from other processes inflates little): the uncached transform (crop-window decode fused
with the resize), the cache's ``fill`` (a fresh arena each pass), and its parts: the fill's one
C call (``decode_for_cache(..., crop=...)``: whole-image decode into the fill buffer, then the
crop resized from it), the store (``pwrite`` into fresh tmpfs pages + xxh3) and the same store
again into the pages it just allocated (``store_rewrite``: copy + xxh3, so ``store`` minus it is
``store_page_allocation_ms``, the kernel's page allocation); for comparison the
whole-image decode alone, the crop window's decode alone, drawing the crop, and the two-step
fill's resize from decoded pixels (``from_pixels``).
Usage::

    .venv/bin/python benchmarks/bench_cache.py --data OUT [--split train] [--repeats 3] \\
        [--backend thread] [--augment standard] [--out FILE]
    .venv/bin/python benchmarks/bench_cache.py --data OUT --memory [--workers 2] [--out FILE]
    .venv/bin/python benchmarks/bench_cache.py --data OUT --fill-breakdown [--out FILE]

``--shm-dir DIR`` (every mode): the tmpfs each repeat's arena folder is made in (default
``/dev/shm``), e.g. one mounted ``huge=within_size`` to measure the fill with 2 MiB pages; the
output's ``huge_pages`` is that tmpfs's mode (:func:`shardkit.stream.memory.tmpfs_huge`).
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import click

from _common import write_json


def _epoch(loader, epoch: int, keep: bool = False):
    loader.set_epoch(epoch)
    n, t0, kept = 0, time.perf_counter(), []
    for images, _ in loader:
        n += len(images)
        if keep:
            kept.append(images.clone())
    return n / (time.perf_counter() - t0), kept


def _one_repeat(root, split, batch, workers, backend, epoch, augment="none", shm_dir="/dev/shm"):
    import torch

    from shardkit.stream import WorkerOptions, make_loader

    opts = dict(num_workers=workers, workers=WorkerOptions(backend=backend), augment=augment)
    rates, stats = {}, {}
    with make_loader(root, split, batch, **opts) as loader:
        rates["uncached"], plain = _epoch(loader, epoch + 1, keep=True)
    with tempfile.TemporaryDirectory(dir=shm_dir) as shm:
        os.environ["SHARDKIT_CACHE_SHM"] = shm
        with make_loader(root, split, batch, cache="ram", **opts) as loader:
            rates["fill"], _ = _epoch(loader, epoch)
            rates["cached"], _ = _epoch(loader, epoch + 1)
            stats["full"] = loader.cache_stats()
        with make_loader(root, split, batch, cache="ram", verify_reads=False, **opts) as loader:
            _epoch(loader, epoch)
            rates["cached_noverify"], _ = _epoch(loader, epoch + 1)
        with make_loader(root, split, batch, cache="ram", cache_max_side=256, **opts) as loader:
            _epoch(loader, epoch)
            rates["cached_max256"], small = _epoch(loader, epoch + 1, keep=True)
            stats["max256"] = loader.cache_stats()
    diff = (torch.cat(plain).float() - torch.cat(small).float()).abs().mean().item()
    return rates, stats, diff


def _fill_breakdown(root, split, repeats, shm_dir="/dev/shm"):
    """Per-image ms of the uncached transform, the cache fill and the fill's parts (module doc)."""
    from fractions import Fraction

    import numpy as np

    from shardkit.stream.cache import DecodedCache
    from shardkit.stream.source import ShardSource
    from shardkit.transforms import TransformConfig, make_transform, sample_crop_params

    src = ShardSource(root, split)
    datas = [bytes(src.read(i)) for i in range(len(src))]
    tf = make_transform(TransformConfig(image_size=224), True)
    dec, out, clk = tf.decoder, np.empty((224, 224, 3), np.uint8), time.perf_counter
    names = ("uncached", "fill", "fused_decode_crop", "store", "store_rewrite", "decode_whole",
             "decode_window", "crop_params", "resize_from_pixels")
    best = {k: np.full(len(datas), np.inf) for k in names}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(dir=shm_dir) as shm:
            os.environ["SHARDKIT_CACHE_SHM"] = shm
            fresh, other = DecodedCache(src, tf, "ram", None), DecodedCache(src, tf, "ram", None)
            other.path = other.arena.path = os.path.join(shm, "parts.arena")
            fresh.attach()
            other.attach()
            for i, d in enumerate(datas):
                t = [clk()]
                tf(d, np.random.default_rng(i), out=out)
                t.append(clk())
                fresh.fill(i, d, tf, np.random.default_rng(i), out)
                t.append(clk())
                table = fresh.arena.table
                w, h = int(table["width"][i]), int(table["height"][i])
                buf = np.empty((h, w, 3), np.uint8)
                tf.decode_for_cache(d, None, buf, crop=(w, h, np.random.default_rng(i), out))
                t.append(clk())
                other.arena.store(i, buf, 0)  # fresh tmpfs pages, as in the fill
                t.append(clk())
                other.arena.store(i, buf, 0)  # the same slot again: its pages exist now
                t.append(clk())
                pix = dec.decode_scaled(d, Fraction(1))
                t.append(clk())
                p = sample_crop_params(w, h, tf.cfg, np.random.default_rng(i))
                dec.decode_region(d, (p.left, p.top, p.left + p.width, p.top + p.height),
                                  Fraction(1))
                t.append(clk())
                sample_crop_params(w, h, tf.cfg, np.random.default_rng(i))
                t.append(clk())
                tf.from_pixels(pix, w, h, np.random.default_rng(i), out)
                t.append(clk())
                for k, a, b in zip(names, t, t[1:]):
                    best[k][i] = min(best[k][i], b - a)
            fresh.detach()
            other.detach()
    ms = {k: float(v.mean() * 1e3) for k, v in best.items()}
    ms["resize_from_pixels"] -= ms["crop_params"]  # from_pixels draws the crop too
    return {"images": len(datas), "ms_per_image": ms,
            "ratio_fill_to_uncached_speed": ms["uncached"] / ms["fill"],
            "ratio_decode_whole_to_window": ms["decode_whole"] / ms["decode_window"],
            "floor_without_store_speed": ms["uncached"] / (ms["fill"] - ms["store"]),
            # what the store pays for fresh pages: the kernel's allocation inside pwrite
            "store_page_allocation_ms": ms["store"] - ms["store_rewrite"],
            "floor_fused_call_alone_speed": ms["uncached"] / ms["fused_decode_crop"]}


def _memory(root, split, batch, workers, epochs, shm_dir="/dev/shm"):
    """PSS of main + worker processes, cached (ram) and uncached; see the module doc."""
    import psutil

    from shardkit.stream import WorkerOptions, make_loader
    from shardkit.stream.cache import arena_memory

    opts = dict(num_workers=workers, workers=WorkerOptions(
        backend="process", multiprocessing_context="fork", persistent_workers=True))
    out = {}
    for mode in ("none", "ram"):
        with tempfile.TemporaryDirectory(dir=shm_dir) as shm:
            os.environ["SHARDKIT_CACHE_SHM"] = shm
            with make_loader(root, split, batch, cache=mode, **opts) as loader:
                for e in range(epochs + 1):
                    _epoch(loader, e)
                stats = loader.cache_stats()
                pids = [os.getpid(), *(p.pid for p in psutil.Process().children(True))]
                mem = arena_memory(stats["path"] if stats else "/nonexistent", pids)
        roles = ["main"] + [f"worker{i}" for i in range(len(pids) - 1)]
        out[mode] = {
            "processes": {role: {k: v / 2**20 for k, v in mem["pids"][pid].items()}
                          for role, pid in zip(roles, pids)},
            "sum_total_pss_mib": mem["sum_total_pss"] / 2**20,
            "arena_sum_rss_mib": mem["sum_rss"] / 2**20,
            "arena_sum_pss_mib": mem["sum_pss"] / 2**20,
            "arena_sum_anonymous_mib": mem["sum_anonymous"] / 2**20,
            "arena_filled_mib": (stats["filled_bytes"] / 2**20) if stats else 0.0,
            "hit_rate": stats["hit_rate"] if stats else None}
    out["extra_total_pss_mib"] = out["ram"]["sum_total_pss_mib"] - \
        out["none"]["sum_total_pss_mib"]
    return out


@click.command()
@click.option("--data", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--split", default="train", show_default=True)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--workers", default=2, show_default=True)
@click.option("--backend", default="thread", show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--out", default=None, type=click.Path(dir_okay=False))
@click.option("--memory", is_flag=True, help="PSS per process instead of speed (module doc).")
@click.option("--fill-breakdown", is_flag=True, help="Per-image cost of the fill's parts.")
@click.option("--augment", default="none", show_default=True,
              help="Augmentation preset of every loader, e.g. standard: the ops run "
                   "after the cache on the cached pixels' crops, every epoch.")
@click.option("--shm-dir", default="/dev/shm", show_default=True,
              type=click.Path(exists=True, file_okay=False),
              help="tmpfs folder of the arenas (a tmpfs mounted huge=within_size: see README).")
def main(data, split, batch_size, workers, backend, repeats, out, memory, fill_breakdown,
         augment, shm_dir):
    from shardkit.stream.memory import tmpfs_huge

    where = {"shm_dir": shm_dir, "huge_pages": tmpfs_huge(shm_dir)}
    if fill_breakdown:
        return _emit({"data": str(data), "split": split, "repeats": repeats,
                      **where, **_fill_breakdown(data, split, repeats, shm_dir)}, out)
    if memory:
        result = {"data": str(data), "split": split, "batch_size": batch_size,
                  "workers": workers, "epochs_after_fill": repeats,
                  **where, **_memory(data, split, batch_size, workers, repeats, shm_dir)}
        return _emit(result, out)
    runs = [_one_repeat(data, split, batch_size, workers, backend, 2 * r, augment, shm_dir)
            for r in range(repeats)]
    med = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
    full, small = runs[0][1]["full"], runs[0][1]["max256"]
    n = full["num_samples"]
    result = {
        "data": str(data), "split": split, "batch_size": batch_size, "workers": workers,
        "backend": backend, "repeats": repeats, "cores": os.cpu_count(), "augment": augment,
        "shm_dir": shm_dir, "huge_pages": full["huge_pages"],
        "images_per_s": med,
        "ratio_cached_to_uncached": med["cached"] / med["uncached"],
        "ratio_cached_noverify_to_uncached": med["cached_noverify"] / med["uncached"],
        "ratio_fill_to_uncached": med["fill"] / med["uncached"],
        "ratio_cached_max256_to_uncached": med["cached_max256"] / med["uncached"],
        # each repeat's rows ran back to back: their ratios see the same machine load
        "per_repeat_ratio_fill_to_uncached": [r[0]["fill"] / r[0]["uncached"] for r in runs],
        "per_repeat_ratio_cached_to_uncached": [r[0]["cached"] / r[0]["uncached"]
                                                for r in runs],
        "median_per_repeat_ratio_fill_to_uncached": statistics.median(
            r[0]["fill"] / r[0]["uncached"] for r in runs),
        "median_per_repeat_ratio_cached_to_uncached": statistics.median(
            r[0]["cached"] / r[0]["uncached"] for r in runs),
        "memory": {"images": n, "full_bytes": full["size_bytes"],
                   "full_bytes_per_image": full["size_bytes"] / n,
                   "max256_bytes": small["size_bytes"],
                   "max256_bytes_per_image": small["size_bytes"] / n},
        "max256_mean_abs_diff_0_255": statistics.median(r[2] for r in runs),
        "fill_seconds_summed_over_threads": full["fill_seconds"],
        "all_repeats": [r[0] for r in runs],
    }
    _emit(result, out)


def _emit(result: dict, out: str | None) -> None:
    click.echo(json.dumps(result, indent=1))
    if out:
        write_json(out, result, indent=1)


if __name__ == "__main__":
    main()
