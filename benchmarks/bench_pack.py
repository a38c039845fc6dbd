"""Packing throughput of `shardkit pack` per format against a plain webdataset.ShardWriter loop.

The baseline, measured in the same run on the same files, is the simplest packer people write:
walk the ImageFolder, read each file and write ``{"__key__", "jpg", "cls"}`` with
``webdataset.ShardWriter`` (no decode check, no hashing, no split, no manifest). shardkit's packer
does much more per file (sha256, a full decode by libjpeg-turbo and Pillow, quarantine, split,
atomic shards, manifest), so its ratio shows what that safety costs.

Each measurement runs ``--repeat`` times after one untimed warm-up of the baseline (page cache
warm), into a fresh temporary folder; the median wall time is reported. Output: a table on stdout
and JSON at ``--out`` (default ``bench-results/pack.json``) with the environment.

    .venv/bin/python benchmarks/bench_pack.py --data ../shared/data/flowers --workers 2
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import write_json

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "flowers-sample"


def image_files(src: Path) -> list[tuple[Path, str]]:
    """(path, class) of every file in ``src/<class>/`` (sorted), as an ImageFolder reader sees it."""
    out = []
    for cls in sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")):
        out += [(p, cls.name) for p in sorted(cls.rglob("*")) if p.is_file()
                and not p.name.startswith(".")]
    return out


def baseline(files: list[tuple[Path, str]], out: Path, shard_samples: int) -> None:
    """The plain loop: read bytes, write {"__key__", "jpg", "cls"} with webdataset.ShardWriter."""
    import webdataset as wds

    classes = {c: i for i, c in enumerate(sorted({c for _, c in files}))}
    out.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(out / "base-%06d.tar"), maxcount=shard_samples, verbose=0) as sink:
        for i, (path, cls) in enumerate(files):
            sink.write({"__key__": f"s{i:08d}", "jpg": path.read_bytes(), "cls": classes[cls]})


def shardkit_pack(src: Path, out: Path, fmt: str, shard_samples: int, workers: int,
                  near: str = "merge") -> None:
    from shardkit.packer.run import pack

    meta = src / "metadata.csv"
    group = dict(metadata=meta, group_column="group_flickr_user") if meta.exists() else {}
    pack(src, out, format=fmt, split={"train": 0.8, "val": 0.1, "test": 0.1}, seed=0,
         shard_samples=shard_samples, workers=workers, progress=False, near_duplicates=near,
         **group)


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
            t0 = time.perf_counter()
            fn(Path(tmp) / "out")
            times.append(time.perf_counter() - t0)
    return times


def environment(workers: int) -> dict:
    import h5py
    import lmdb
    import PIL
    import webdataset
    from PIL import features

    import shardkit

    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0], "workers": workers, "shardkit": shardkit.__version__,
            "pillow": PIL.__version__, "libjpeg_turbo": features.version("libjpeg_turbo"),
            "webdataset": getattr(webdataset, "__version__", "?"), "lmdb": lmdb.version(),
            "h5py": h5py.__version__}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SAMPLE, help="ImageFolder source (default: sample)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "pack.json")
    ap.add_argument("--workers", type=int, default=1, help="shardkit check processes")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per row (median reported)")
    ap.add_argument("--shard-samples", type=int, default=256)
    ap.add_argument("--formats", default="wds,lmdb,hdf5")
    ap.add_argument("--near-duplicates", default="merge",
                    help="comma list of pack --near-duplicates modes, one row each (e.g. "
                         "merge,off: the cost of the pHash)")
    args = ap.parse_args(argv)

    files = image_files(args.data)
    nbytes = sum(p.stat().st_size for p, _ in files)
    timed(lambda out: baseline(files, out, args.shard_samples), 1)  # warm-up: page cache
    rows = {"baseline (wds.ShardWriter loop)":
            timed(lambda out: baseline(files, out, args.shard_samples), args.repeat)}
    modes = args.near_duplicates.split(",")
    for fmt in args.formats.split(","):
        for near in modes:
            name = f"shardkit pack --format {fmt}" + (f" --near-dup {near}" if len(modes) > 1
                                                      else "")
            rows[name] = timed(lambda out, fmt=fmt, near=near: shardkit_pack(
                args.data, out, fmt, args.shard_samples, args.workers, near), args.repeat)

    base = statistics.median(rows["baseline (wds.ShardWriter loop)"])
    results = []
    print(f"{len(files)} files, {nbytes / 1e6:.1f} MB from {args.data}; workers={args.workers}, "
          f"median of {args.repeat}")
    print(f"{'method':<52} {'s':>8} {'files/s':>9} {'MB/s':>8} {'speed vs baseline':>18}")
    for name, times in rows.items():
        med = statistics.median(times)
        row = {"method": name, "seconds_median": med, "seconds_all": times,
               "files_per_s": len(files) / med, "mb_per_s": nbytes / 1e6 / med,
               "speed_ratio_vs_baseline": base / med}
        results.append(row)
        print(f"{name:<52} {med:8.2f} {row['files_per_s']:9.1f} {row['mb_per_s']:8.1f} "
              f"{row['speed_ratio_vs_baseline']:17.3f}x")
    report = {"benchmark": "pack", "data": str(args.data), "num_files": len(files),
              "source_bytes": nbytes, "shard_samples": args.shard_samples, "repeat": args.repeat,
              "environment": environment(args.workers), "results": results}
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
