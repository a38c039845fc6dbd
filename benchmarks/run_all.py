"""Runs every benchmark suite on one image folder; ``make bench`` runs ``--quick``.

    python benchmarks/run_all.py --quick                          # embedded sample, small runs
    python benchmarks/run_all.py --data ../shared/data/flowers    # the full set

Packs the folder into a temp dir in each format with ``shardkit pack`` (a metadata.csv with
``group_flickr_user`` beside the class folders gives the photographer-grouped split), then runs
each suite as a subprocess with ``--data`` and ``--out FILE``:

* ``bench_loader.py`` and ``bench_formats.py`` on the packed datasets,
* ``bench_decode.py`` and ``bench_pack.py`` on the original folder,

and writes ``OUT_DIR/summary.json`` (command, exit status and duration per suite). A suite that
is missing or fails is reported and makes the exit status 1; the others still run.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from shardkit.bench.prepare import FORMAT_NAMES, pack_with_cli  # noqa: E402
from _common import write_json  # noqa: E402

SUITES = ("bench_loader", "bench_formats", "bench_decode", "bench_pack")
PACKED_INPUT = {"bench_loader", "bench_formats"}  # the others read the original folder


def _supports(script: Path, option: str) -> bool:
    """Whether ``script --help`` lists ``option`` (so --quick reaches suites that have it)."""
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                          timeout=120)
    return option in proc.stdout


def _quick_args(script: Path) -> list[str]:
    if _supports(script, "--quick"):
        return ["--quick"]
    args = []
    if _supports(script, "--repeat"):
        args += ["--repeat", "1"]
    if _supports(script, "--limit"):
        args += ["--limit", "100"]
    return args


@click.command()
@click.option("--quick", is_flag=True, help="Embedded sample (unless --data), short runs.")
@click.option("--data", type=click.Path(exists=True, file_okay=False), default=None,
              help="ImageFolder to benchmark (default with --quick: examples/flowers-sample).")
@click.option("--out-dir", default=None, type=click.Path(file_okay=False),
              help="Default bench-results/quick or bench-results/full.")
@click.option("--suite", "suites", multiple=True, type=click.Choice(SUITES),
              help="Only these suites (repeatable; default all).")
def main(quick, data, out_dir, suites):
    """Pack the folder in every format and run every benchmark suite on it."""
    if data is None and not quick:
        raise click.UsageError("give --data DIR (e.g. ../shared/data/flowers) or --quick")
    src = Path(data) if data else ROOT / "examples" / "flowers-sample"
    out_dir = Path(out_dir or ROOT / "bench-results" / ("quick" if quick else "full"))
    out_dir.mkdir(parents=True, exist_ok=True)
    suites = suites or SUITES
    summary = {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "command": [Path(sys.executable).name, *sys.argv], "source": str(src.resolve()),
               "quick": quick, "suites": {}}
    failed = []
    with tempfile.TemporaryDirectory(prefix="shardkit-bench-") as tmp:
        packed = []
        t0 = time.perf_counter()
        for fmt in FORMAT_NAMES:
            click.echo(f"packing {src} as {fmt} ...")
            packed.append(pack_with_cli(src, Path(tmp) / fmt, fmt,
                                        shard_samples=64 if quick else 256))
        summary["pack_s"] = time.perf_counter() - t0
        for name in suites:
            script = HERE / f"{name}.py"
            out = out_dir / f"{name.removeprefix('bench_')}.json"
            if not script.is_file():
                summary["suites"][name] = {"status": "missing", "script": str(script)}
                failed.append(name)
                click.echo(f"[{name}] MISSING: {script}")
                continue
            inputs = packed if name in PACKED_INPUT else [src]
            cmd = [sys.executable, str(script)]
            for p in inputs:
                cmd += ["--data", str(p)]
            cmd += ["--out", str(out)] + (_quick_args(script) if quick else [])
            click.echo(f"[{name}] {' '.join(cmd)}")
            t1 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT)
            status = "ok" if proc.returncode == 0 else "failed"
            summary["suites"][name] = {"status": status, "returncode": proc.returncode,
                                       "command": cmd, "seconds": time.perf_counter() - t1,
                                       "out": str(out)}
            if status != "ok":
                failed.append(name)
    write_json(out_dir / "summary.json", summary, echo=False)
    for name, info in summary["suites"].items():
        secs = f" in {info['seconds']:.0f} s" if "seconds" in info else ""
        click.echo(f"{name:>14}: {info['status']}{secs}")
    click.echo(f"wrote {out_dir / 'summary.json'}")
    if failed:
        click.echo(f"failed or missing suites: {failed}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
