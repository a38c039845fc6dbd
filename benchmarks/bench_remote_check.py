"""The pack's check step on remote files: GETs in flight (``--read-concurrency``) against one at
a time, same files, same run (benchmarks/README.md, "Packing on Ray").

The files are served over HTTP by a separate process on localhost that answers each GET after
``--latency-ms`` (an object store's time to first byte; S3 in-region is ~20-50 ms, none can be
reached here). The check (:meth:`shardkit.packer.engines.LocalEngine.check`: read, sha256, full
decode, pHash) runs on a CSV list of their URLs with ``read_concurrency`` 1 (each file read when its
turn comes, as before reads were kept in flight) and the concurrent settings, in 1 and in all cores'
processes; rows interleaved ``--repeat`` times, medians reported, plus the same files read from
the local disk as the bound that no latency hiding can beat.

    .venv/bin/python benchmarks/bench_remote_check.py --data ../shared/data/flowers --n 600 \\
        --out benchmarks/results/remote-check.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import slow_http_server, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SAMPLE = ROOT / "examples" / "flowers-sample"


def serve(folder: str, latency_ms: float) -> None:
    """Serves ``folder`` on a free port of 127.0.0.1, each GET after ``latency_ms``; prints the
    port and runs until killed (the subprocess of :func:`main`)."""
    httpd = slow_http_server(folder, latency_ms, head=False)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


def _jobs(locations: list[str]) -> list[tuple]:
    return [(loc, loc, 178_956_970, False, True, None, 95) for loc in locations]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SAMPLE, help="ImageFolder (default: sample)")
    ap.add_argument("--n", type=int, default=200, help="files (the first N by path)")
    ap.add_argument("--latency-ms", type=float, default=30.0)
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "remote-check.json")
    args = ap.parse_args(argv)

    from shardkit.packer.engines import LocalEngine

    files = sorted(p for p in args.data.rglob("*.jpg"))[:args.n]
    rel = [p.relative_to(args.data).as_posix() for p in files]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(args.data),
                               str(args.latency_ms)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        urls = [f"http://127.0.0.1:{port}/{r}" for r in rel]
        cores = os.cpu_count() or 1
        levels = [int(c) for c in args.concurrency.split(",")]
        rows = {f"local disk, workers {w}": (w, 1, [str(p) for p in files])
                for w in sorted({1, cores})}
        rows.update({f"http, workers {w}, read_concurrency {c}": (w, c, urls)
                     for w in sorted({1, cores}) for c in levels})
        times: dict[str, list[float]] = {name: [] for name in rows}
        want = None
        for r in range(args.repeat + 1):  # round 0 warms the page cache and the server
            for name, (workers, conc, locs) in rows.items():
                if r == 0 and "concurrency 1" in name:
                    continue  # the slow serial rows need no warm-up
                t0 = time.perf_counter()
                res = list(LocalEngine(workers, conc).check(_jobs(locs), progress=False))
                dt = time.perf_counter() - t0
                got = [x.get("sha256") for x in res]
                want = want or got
                assert got == want, f"{name}: other results than the first row"
                if r:
                    times[name].append(dt)
    finally:
        server.kill()
    n = len(files)
    base = {w: statistics.median(times[f"http, workers {w}, read_concurrency 1"])
            for w in sorted({1, cores})}
    print(f"{n} files from {args.data}, GET latency {args.latency_ms} ms, {cores} cores, "
          f"median of {args.repeat}, load avg {os.getloadavg()[0]:.1f}")
    print(f"{'row':<44} {'s':>7} {'files/s':>8} {'vs concurrency 1':>17}")
    results = []
    for name, ts in times.items():
        med = statistics.median(ts)
        workers = rows[name][0]
        results.append({"row": name, "workers": workers, "read_concurrency": rows[name][1],
                        "remote": name.startswith("http"), "seconds_median": med,
                        "seconds_all": ts, "files_per_s": n / med,
                        "speed_vs_serial": base[workers] / med})
        print(f"{name:<44} {med:7.2f} {n / med:8.1f} {base[workers] / med:16.2f}x")
    report = {"benchmark": "remote_check", "data": str(args.data), "num_files": n,
              "latency_ms": args.latency_ms, "cores": cores, "repeat": args.repeat,
              "results": results, "python": sys.version.split()[0],
              "load_avg_1m": os.getloadavg()[0]}
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], float(sys.argv[3]))
    else:
        main()
