"""`shardkit pack --engine local` vs `--engine ray` on this machine, and the per-file costs that
a model of packing 100 M files on N nodes needs (benchmarks/README.md, "Packing on Ray").

Same run, same files, same options: local packs with ``--workers 1`` and ``--workers C`` (C =
cores) and Ray packs on a local Ray runtime of C CPUs started once beforehand (its start-up is
reported apart: a cluster is started once, not per pack). The rows are interleaved ``--repeat``
times, each into a fresh temporary folder; medians are reported, and ``ray / local(C)`` is the
engine's overhead at this scale. Then, single process, the per-file costs: the check
(:func:`shardkit.packer.check._check_one`: read, sha256, full decode, pHash), the shard write
(``ShardSink`` of the stored bytes, sha256 and fsync included), the driver's share (scan, labels,
split plan) and its memory per file record, and Ray's cost per task (a no-op round trip).

    .venv/bin/python benchmarks/bench_pack_engine.py --data ../shared/data/flowers \\
        --out benchmarks/results/pack-engine-flowers.json

The 100 M model printed at the end takes the measured costs plus three assumptions about object
storage (options ``--get-ms``, ``--list-ms``, ``--node-gbps``; none can be measured here).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from _common import write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "examples" / "flowers-sample"


def _pack_options(src: Path, **kw):
    from shardkit.packer.options import PackOptions

    meta = src / "metadata.csv"
    group = dict(metadata=meta, group_column="group_flickr_user") if meta.exists() else {}
    return PackOptions(format="wds", seed=0, shard_samples=256, progress=False, **group, **kw)


def engine_rows(src: Path, cores: int, repeat: int) -> dict[str, list[float]]:
    from shardkit.packer.run import pack

    rows = {"local --workers 1": dict(workers=1), f"local --workers {cores}": dict(workers=cores),
            "ray (local runtime)": dict(engine="ray")}
    times: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(repeat + 1):  # round 0 warms the page cache and Ray's worker processes
        for name, kw in rows.items():
            with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
                t0 = time.perf_counter()
                pack(src, Path(tmp) / "out", options=_pack_options(src, **kw))
                if r:
                    times[name].append(time.perf_counter() - t0)
    return times


def per_file_costs(src: Path, ray) -> dict:
    """Single-process costs per file (ms) and driver memory per file record (bytes)."""
    from shardkit import formats
    import shardkit.packer.check as pack_check
    import shardkit.packer.scan as pack_scan
    from shardkit.packer import split as pack_split
    from shardkit.packer.records import CheckRecords
    from shardkit.packer.write import stored_size

    opts = _pack_options(src)
    t0 = time.perf_counter()
    source = pack_scan.scan_source(src, opts)
    label_map, label_idx = pack_scan.resolve_labels(source.items, opts.labels)
    t_scan = time.perf_counter() - t0
    n = len(source.items)
    jobs = [(str(it.path), it.relpath, opts.max_pixels, opts.strict, True, opts.max_side,
             opts.jpeg_quality) for it in source.items]
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        results = [pack_check._check_one(j) for j in jobs]
        best = min(best, time.perf_counter() - t0)
    del results
    dicts = [pack_check._check_one(j) for j in jobs]
    tracemalloc.start()  # what the driver holds per file: the scanned item and its record
    results = CheckRecords(len(dicts))
    for i, rec in enumerate(dicts):
        results[i] = rec
    items = pack_scan.scan_source(src, opts).items
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del items
    tracemalloc.start()  # the same records as the check's dicts (as held before CheckRecords)
    as_dicts = [pack_check._check_one(j) for j in jobs]
    held_dicts, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del as_dicts
    checked = pack_check.CheckedFiles(results=results, keep=[i for i, r in enumerate(dicts)
                                                            if r["ok"]], quarantine=[])
    t0 = time.perf_counter()
    pack_split.plan_split(source, label_map, label_idx, checked, opts, None)
    t_plan = time.perf_counter() - t0
    nbytes = sum(stored_size(r) for r in dicts if r["ok"])
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        t0 = time.perf_counter()
        sink = formats.ShardSink(tmp, "train", "wds", max_samples=256,
                                 writer_options={"wds_cls": True})
        for k, (it, r) in enumerate(zip(source.items, dicts)):
            if r["ok"]:
                sink.add(f"train_{k:08d}", Path(it.path).read_bytes(), r["ext"], 0)
        sink.close()
        t_write = time.perf_counter() - t0

    @ray.remote
    def noop(x):
        return x

    ray.get([noop.remote(i) for i in range(50)])  # warm
    t0 = time.perf_counter()
    ray.get([noop.remote(i) for i in range(500)])
    t_task = (time.perf_counter() - t0) / 500
    return {"files": n, "mean_stored_bytes": nbytes / max(1, len(checked.keep)),
            "check_ms": 1e3 * best / n, "write_ms": 1e3 * t_write / len(checked.keep),
            "driver_scan_labels_ms": 1e3 * t_scan / n, "driver_split_plan_ms": 1e3 * t_plan / n,
            "driver_record_bytes": held / n, "check_dict_bytes": held_dicts / n,
            "ray_task_ms": 1e3 * t_task}


def model_100m(costs: dict, nodes: list[int], cores: int, get_ms: float, list_ms: float,
               node_gbps: float, files: float = 1e8, read_concurrency: int = 16,
               list_chains: int = 16) -> list[dict]:
    """Hours per bound for ``files`` on each node count (see benchmarks/README.md)."""
    out = []
    per_core_s = (costs["check_ms"] + costs["write_ms"]) / 1e3
    for n in nodes:
        listing = files / 1000 * list_ms / 1e3 / list_chains  # top folders listed in parallel
        # every file is read twice (check, then write), each with reads in flight per task
        get = 2 * files * get_ms / 1e3 / (n * cores * read_concurrency)
        cpu = files * per_core_s / (n * cores)
        upload = files * costs["mean_stored_bytes"] * 8 / (n * node_gbps * 1e9)
        driver = files * (costs["driver_scan_labels_ms"] + costs["driver_split_plan_ms"]) / 1e3
        tasks = files / 64 * costs["ray_task_ms"] / 1e3  # driver-side task submission
        row = {"nodes": n, "listing_h": listing / 3600, "get_latency_h": get / 3600,
               "check_write_cpu_h": cpu / 3600, "upload_h": upload / 3600,
               "driver_serial_h": (driver + tasks) / 3600,
               "driver_memory_gb": files * costs["driver_record_bytes"] / 1e9}
        row["bound"] = max((k for k in row if k.endswith("_h")), key=row.get)
        out.append(row)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SAMPLE, help="ImageFolder (default: sample)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "pack-engine.json")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--get-ms", type=float, default=30.0,
                    help="assumed time to first byte of one object-storage GET")
    ap.add_argument("--list-ms", type=float, default=200.0,
                    help="assumed time of one 1000-key listing page")
    ap.add_argument("--node-gbps", type=float, default=10.0, help="assumed upload per node")
    ap.add_argument("--model-cores", type=int, default=32, help="cores per node in the model")
    ap.add_argument("--read-concurrency", type=int, default=16,
                    help="reads in flight per check/write task (pack --read-concurrency)")
    ap.add_argument("--list-chains", type=int, default=16,
                    help="listing chains at once (scan_remote.LIST_CONCURRENCY; needs at least "
                         "as many top folders, e.g. classes)")
    args = ap.parse_args(argv)

    import ray

    cores = os.cpu_count() or 1
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=cores, include_dashboard=False, logging_level="WARNING")
    t_start = time.perf_counter() - t0
    try:
        times = engine_rows(args.data, cores, args.repeat)
        costs = per_file_costs(args.data, ray)
    finally:
        ray.shutdown()
    n = costs["files"]
    base = statistics.median(times[f"local --workers {cores}"])
    print(f"{n} files from {args.data}; {cores} cores; Ray start-up {t_start:.1f} s (not in "
          f"the rows); median of {args.repeat}")
    print(f"{'engine':<24} {'s':>7} {'files/s':>8} {'vs local --workers ' + str(cores):>22}")
    results = []
    for name, ts in times.items():
        med = statistics.median(ts)
        results.append({"engine": name, "seconds_median": med, "seconds_all": ts,
                        "files_per_s": n / med, "speed_vs_local_all_cores": base / med})
        print(f"{name:<24} {med:7.2f} {n / med:8.1f} {base / med:21.2f}x")
    print("per file (one core): " + ", ".join(f"{k} {v:.3g}" for k, v in costs.items()))
    model = model_100m(costs, [1, 10, 100], args.model_cores, args.get_ms, args.list_ms,
                       args.node_gbps, read_concurrency=args.read_concurrency,
                       list_chains=args.list_chains)
    print(f"100 M files, {args.model_cores} cores/node (hours per bound; GET {args.get_ms} ms, "
          f"list {args.list_ms} ms/1000 keys, {args.node_gbps} Gb/s per node assumed):")
    for row in model:
        print("  " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in row.items()))
    report = {"benchmark": "pack_engine", "data": str(args.data), "num_files": n,
              "cores": cores, "ray_startup_s": t_start, "repeat": args.repeat,
              "results": results, "per_file": costs,
              "model_assumptions": {"get_ms": args.get_ms, "list_ms": args.list_ms,
                                    "read_concurrency": args.read_concurrency,
                                    "list_chains": args.list_chains,
                                    "node_gbps": args.node_gbps, "cores": args.model_cores},
              "model_100m": model, "python": sys.version.split()[0],
              "ray": ray.__version__, "load_avg_1m": os.getloadavg()[0]}
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
