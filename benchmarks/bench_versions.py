"""Pack and loader throughput of two checkouts of shardkit, side by side in one run.

Proves that a change which should not touch speed (a refactor) did not: each round packs the same
source with the OLD checkout and the NEW one, in alternating order, and reads the same packed
split with each one's ``make_loader`` (one process per measurement, so neither sees the other's
imports or caches). The loader figure is measured inside the process, over whole epochs after a
warm-up epoch; the pack figure is the wall time of ``shardkit pack`` (start-up included, the
same for both).

    .venv/bin/python benchmarks/bench_versions.py --old /path/to/old/checkout --new . \\
        --data ../shared/data/flowers --rounds 3

Output: one line per measurement, then the medians and the NEW/OLD ratio of each (1.0 = the
same; pack time is inverted so that above 1 is faster), and JSON at ``--out``. The dataset the
loaders read is packed once by OLD, which NEW must read as it is.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_json

ROOT = Path(__file__).resolve().parents[1]

LOADER = r"""
import json, sys, time
from shardkit.stream import make_loader
root, epochs, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
loader = make_loader(root, "train", batch_size=64, num_workers=workers, seed=0,
                     augment="none")
n = 0
for epoch in range(epochs + 1):  # epoch 0 warms up (page cache, worker start, decoders)
    if epoch == 1:
        t0, n = time.perf_counter(), 0
    loader.set_epoch(epoch)
    for images, labels in loader:
        n += len(labels)
print(json.dumps({"samples": n, "seconds": time.perf_counter() - t0}))
"""


def _env(checkout: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(checkout)}


def time_pack(checkout: Path, data: Path, out: Path, workers: int) -> float:
    cmd = [sys.executable, "-m", "shardkit.cli", "pack", str(data), str(out), "--no-progress",
           "--workers", str(workers)]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=_env(checkout), check=True, capture_output=True)
    return time.perf_counter() - t0


def loader_rate(checkout: Path, root: Path, epochs: int, workers: int) -> float:
    proc = subprocess.run([sys.executable, "-c", LOADER, str(root), str(epochs), str(workers)],
                          env=_env(checkout), check=True, capture_output=True, text=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["samples"] / result["seconds"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="checkout of the baseline")
    ap.add_argument("--new", type=Path, default=ROOT, help="checkout under test [this one]")
    ap.add_argument("--data", type=Path, default=ROOT / "examples" / "flowers-sample")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2, help="timed loader epochs per measurement")
    ap.add_argument("--workers", type=int, default=2, help="pack --workers and num_workers")
    ap.add_argument("--out", type=Path, default=Path("bench-results/versions.json"))
    a = ap.parse_args()
    old, new = a.old.resolve(), a.new.resolve()
    times: dict[str, dict[str, list[float]]] = {"pack_s": {"old": [], "new": []},
                                                "loader_img_s": {"old": [], "new": []}}
    with tempfile.TemporaryDirectory(prefix="shardkit-versions-") as tmp:
        dataset = Path(tmp) / "dataset"
        time_pack(old, a.data, dataset, a.workers)
        for r in range(a.rounds):
            order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
            for name, checkout in order:
                out = Path(tmp) / f"pack-{name}-{r}"
                t = time_pack(checkout, a.data, out, a.workers)
                times["pack_s"][name].append(t)
                rate = loader_rate(checkout, dataset, a.epochs, a.workers)
                times["loader_img_s"][name].append(rate)
                print(f"round {r} {name}: pack {t:.2f} s, loader {rate:,.0f} img/s", flush=True)
    result = {"data": str(a.data), "rounds": a.rounds, "workers": a.workers,
              "cpus": os.cpu_count(), "raw": times}
    for metric, by in times.items():
        o, n = statistics.median(by["old"]), statistics.median(by["new"])
        ratio = o / n if metric == "pack_s" else n / o
        result[metric] = {"old": o, "new": n, "new_vs_old": ratio}
        print(f"{metric}: old {o:,.2f}, new {n:,.2f}, new/old speed {ratio:.3f}")
    write_json(a.out, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
