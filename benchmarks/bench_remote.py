"""Remote tar shards at local speed: one epoch of make_loader over HTTP with 30 ms of latency per
request, against the same dataset on local disk, same run, rows interleaved, medians.

    .venv/bin/python benchmarks/bench_remote.py --data /tmp/flowers-wds \\
        --out benchmarks/results/remote-flowers.json

The dataset folder is served by a separate process on 127.0.0.1 (``http.server``, threads) that
answers every GET and HEAD after ``--latency-ms`` (an object store's time to first byte; S3
in-region is ~20-50 ms; nothing outside the machine is reached). Each repetition builds a fresh
loader per row and times one whole epoch, from ``iter()`` to its last batch (a cold epoch: the
prefetcher holds nothing yet; building the loader, which reads the manifest and split index,
is not timed), default settings (``make_loader(root, "train", 64)``: 2 decoding threads, the
train crop 224 + flip, shuffled; the URL gets shard-block order, its default) unless
``--workers`` / ``--batch`` say otherwise. Rows:

- ``local``: the folder on disk;
- ``http``: the URL, default settings (shards prefetched ahead, ``shard_prefetch_bytes`` 1 GiB);
- ``http, prefetch off``: the URL with ``WorkerOptions(shard_prefetch_bytes=0)``, each shard
  fetched on its first read (the read path before the prefetcher);
- ``http, bound 1/3``: the URL with ``shard_prefetch_bytes`` a third of the split (held
  memory below the dataset; the schedule needs about two shards per stream).

The ratio of each row's median images/s to ``local``'s is the result (the goal: ``http`` >= 0.8x).
/tmp/flowers-wds is 16 shards of ~7.5 MB (115 photos each), enough shards for prefetching to
matter (the first shard's fetch is the only wait it cannot hide). With smaller shards the
prefetcher matters more (each lazily fetched shard costs a stream one round trip):
``shardkit pack /work/shared/data/flowers /tmp/remote-flowers64 --split train=1.0
--shard-samples 29 --near-duplicates off`` gives 64 shards of ~1.9 MB
(``--data /tmp/remote-flowers64 --out benchmarks/results/remote-flowers64.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import slow_http_server, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def serve(folder: str, latency_ms: float) -> None:
    """Serves ``folder`` on a free port of 127.0.0.1, every GET and HEAD after ``latency_ms``;
    prints the port and runs until killed (the subprocess of :func:`main`)."""
    httpd = slow_http_server(folder, latency_ms)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


def epoch(root: str, batch: int, num_workers: int, **kw) -> dict:
    """One cold epoch of a fresh loader: ``{"images", "seconds", "images_per_s", "prefetch"}``."""
    from shardkit.stream import make_loader

    loader = make_loader(root, "train", batch, num_workers=num_workers, **kw)
    try:
        n = 0
        t0 = time.perf_counter()
        for images, _ in loader:
            n += images.shape[0]
        dt = time.perf_counter() - t0
        pf = loader.dataset.source.prefetcher
        stats = pf.stats() if pf is not None else None
    finally:
        loader.close()
    return {"images": n, "seconds": dt, "images_per_s": n / dt, "prefetch": stats}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/flowers-wds"),
                    help="a packed wds dataset folder with a 'train' split")
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                    "remote-flowers.json")
    args = ap.parse_args(argv)

    from shardkit.stream import WorkerOptions

    manifest = json.loads((args.data / "manifest.json").read_text())
    shards = manifest["splits"]["train"]["shards"]
    total = sum(s["bytes"] for s in shards)
    avg = total // len(shards)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(args.data),
                               str(args.latency_ms)], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/"
        rows = {
            "local": (str(args.data), {}),
            "http": (url, {}),
            "http, prefetch off": (url, {"workers": WorkerOptions(shard_prefetch_bytes=0)}),
            "http, bound 1/3": (url, {"workers": WorkerOptions(
                shard_prefetch_bytes=total // 3)}),
        }
        epoch(str(args.data), args.batch, args.workers)  # warm the page cache and imports
        runs: dict[str, list] = {name: [] for name in rows}
        for r in range(args.repeat):
            names = list(rows) if r % 2 == 0 else list(reversed(rows))
            for name in names:
                root, kw = rows[name]
                res = epoch(root, args.batch, args.workers, **kw)
                runs[name].append(res)
                print(f"rep {r} {name:22s} {res['images_per_s']:7.0f} img/s "
                      f"({res['seconds']:.2f} s)", flush=True)
    finally:
        server.terminate()
        server.wait()
    med = {name: statistics.median(x["images_per_s"] for x in rs) for name, rs in runs.items()}
    out = {
        "command": " ".join([os.path.relpath(sys.executable, ROOT), "benchmarks/bench_remote.py"]
                            + (argv if argv is not None else sys.argv[1:])),
        "data": str(args.data), "num_shards": len(shards), "avg_shard_bytes": avg,
        "split_bytes": total,
        "num_samples": sum(s["num_samples"] for s in shards),
        "latency_ms": args.latency_ms, "batch": args.batch, "workers": args.workers,
        "repeat": args.repeat, "cpus": os.cpu_count(),
        "median_images_per_s": med,
        "ratio_to_local": {name: med[name] / med["local"] for name in med},
        "runs": runs,
    }
    for name in med:
        print(f"{name:22s} median {med[name]:7.0f} img/s  {med[name] / med['local']:.2f}x local")
    write_json(args.out, out, indent=1)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], float(sys.argv[3]))
    else:
        main()
