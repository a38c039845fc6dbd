"""Cost of the per-sample read checksum (``verify_reads=True``).

Measured side by side, each repeat in turn (order reversed every other repeat), medians over
``--repeats``, single thread:

- ``xxh3`` (:func:`shardkit.dataset.manifest.sample_checksum`, what shardkit stores) and ``crc32``
  (:func:`zlib.crc32`, the alternative) per sample: over the split's stored bytes, each sample
  once (distinct buffers, mostly not in CPU cache: an upper bound), and over one 60 KB random
  buffer again and again (in cache, as the bytes a read has just copied);
- ``fused``: the fused train transform (``make_transform(TransformConfig(), True)``) on the same
  stored bytes, into one reused output row: the work the checksum is added to;
- ``read_scratch`` with ``verify_reads`` on and off (:class:`shardkit.stream.source.ShardSource`,
  page cache warm): the checksum as the read path pays it.

The target is ``xxh3 / fused < 2%``. Usage::

    .venv/bin/python benchmarks/bench_checksum.py --data PACKED_OR_RAW_DIR [--split train]
        [--repeats 15] [--out FILE]
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardkit.bench.env import collect_environment  # noqa: E402
from shardkit.bench.prepare import ensure_packed  # noqa: E402
from _common import write_json  # noqa: E402


def _per_item_us(fn, items) -> float:
    """Microseconds per item of ``fn`` over ``items`` (one pass)."""
    t0 = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t0) / len(items) * 1e6


def _measure(root: str, split: str, repeats: int, limit: int | None) -> dict:
    from shardkit.dataset.manifest import sample_checksum
    from shardkit.sharding import sample_rng
    from shardkit.stream.source import ShardSource
    from shardkit.transforms import TransformConfig, make_transform

    plain = ShardSource(root, split, verify_reads=False)
    checked = ShardSource(root, split)
    if not checked.verified:
        raise click.ClickException(f"{root}: split {split!r} has no checksums; re-pack it")
    positions = list(range(len(plain)))[:limit]
    datas = [bytes(plain.read(p)) for p in positions]
    hot_60k = [os.urandom(60_000)] * 1000
    cfg = TransformConfig()
    tf = make_transform(cfg, True)
    out = np.empty((cfg.image_size, cfg.image_size, 3), np.uint8)
    tf(datas[0], sample_rng(0, 0, 0, 0), out=out)  # decoder created outside the clock

    def fused(i: int) -> None:
        tf(datas[i], sample_rng(0, 1, 0, i), out=out)

    rows = {
        "xxh3": lambda: _per_item_us(sample_checksum, datas),
        "crc32": lambda: _per_item_us(zlib.crc32, datas),
        "xxh3_60KB_hot": lambda: _per_item_us(sample_checksum, hot_60k),
        "crc32_60KB_hot": lambda: _per_item_us(zlib.crc32, hot_60k),
        "fused": lambda: _per_item_us(fused, range(len(datas))),
        "read_scratch_unverified": lambda: _per_item_us(plain.read_scratch, positions * 3),
        "read_scratch_verified": lambda: _per_item_us(checked.read_scratch, positions * 3),
    }
    for fn in rows.values():
        fn()  # warm-up: page cache, readers, decoder
    runs: dict[str, list[float]] = {k: [] for k in rows}
    for r in range(repeats):  # the order alternates: drift and order effects hit all rows
        for name, fn in (list(rows.items()) if r % 2 == 0 else list(rows.items())[::-1]):
            runs[name].append(fn())
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "data": root, "split": split, "samples": len(datas),
        "mean_stored_bytes": round(float(np.mean([len(d) for d in datas]))),
        "us_per_sample": {k: round(v, 3) for k, v in med.items()},
        "us_per_sample_spread": {k: [round(min(v), 3), round(max(v), 3)]
                                 for k, v in runs.items()},
        "ratios": {
            "xxh3_to_fused": round(med["xxh3"] / med["fused"], 5),
            "crc32_to_fused": round(med["crc32"] / med["fused"], 5),
            "crc32_to_xxh3_60KB_hot": round(med["crc32_60KB_hot"] / med["xxh3_60KB_hot"], 2),
            "verified_read_overhead_to_fused": round(
                (med["read_scratch_verified"] - med["read_scratch_unverified"]) / med["fused"],
                5),
        },
    }


@click.command()
@click.option("--data", required=True, type=click.Path(exists=True, file_okay=False),
              help="Packed dataset, or a raw ImageFolder (packed as wds into a temp dir).")
@click.option("--split", default="train", show_default=True)
@click.option("--repeats", default=15, show_default=True, type=click.IntRange(1))
@click.option("--limit", default=None, type=click.IntRange(1), help="Samples (default all).")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write JSON here.")
def main(data, split, repeats, limit, out):
    """Per-sample cost of the read checksum against the fused decode, single thread."""
    with tempfile.TemporaryDirectory(prefix="shardkit-bench-checksum-") as tmp:
        root = ensure_packed([data], tmp, formats=("wds",))[0]
        result = _measure(str(root), split, repeats, limit)
    result["environment"] = collect_environment()
    us, r = result["us_per_sample"], result["ratios"]
    print(f"{result['samples']} samples, mean {result['mean_stored_bytes']} stored bytes")
    for name, v in us.items():
        print(f"  {name:26s} {v:9.2f} us/sample")
    print(f"  xxh3 / fused = {r['xxh3_to_fused']:.2%}; crc32 / fused = {r['crc32_to_fused']:.2%};"
          f" verified read overhead / fused = {r['verified_read_overhead_to_fused']:.2%}")
    if out:
        write_json(out, result)


if __name__ == "__main__":
    main()
