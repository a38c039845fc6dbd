"""Loader throughput: shardkit ``make_loader`` per format vs torchvision ImageFolder + PIL.

Runs the ``shardkit bench`` grid (backend x num_workers x prefetch x pin) over every packed
dataset given, by default with both ``make_loader`` backends ("thread": decoding threads in the
calling process; "process": DataLoader worker processes), with the ImageFolder+PIL uint8 baseline
over the original files in the same run and the same settings, and measures the bare-decode
limit in the same run: one process decoding the split's JPEG bytes in full with PyTurboJPEG
(RGB), so

    fraction_of_decode_limit = loader img/s / (usable cores x bare decode img/s per core)

says how close the loader comes to what the CPU could decode if it did nothing else (the train
path decodes DCT-scaled crops, so it can exceed 1.0).

The summary has one entry per (format, decoder, backend): the backend's best row, its throughput
ratio to ImageFolder+PIL at the same workers/prefetch/pin and to the best ImageFolder+PIL row, and
``ratio_to_other_backend`` (its best img/s / the other backend's best img/s for the same format
and decoder; None with one backend). With num_workers=0 the process rows are N/A (the same work
as the thread row, which they point at), so the process backend's num_workers=0 candidate is
that thread row.

Usage:
    python benchmarks/bench_loader.py --data PACKED_OR_RAW_DIR [--data ...] --out FILE [--quick]
        [--backend thread,process]

A ``--data`` folder without ``manifest.json`` is packed first into a temp dir in every format.
Writes FILE (JSON: the bench payload, ``bare_decode``, ``summary``) and, in ``FILE``'s stem
folder, ``bench.json`` and the PNG plots.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardkit.bench.cli import run_bench  # noqa: E402
from shardkit.bench.prepare import ensure_packed  # noqa: E402
from shardkit.bench.runner import RunConfig  # noqa: E402
from _common import write_json  # noqa: E402


def split_bytes(root: Path, split: str, limit: int | None = None) -> list[bytes]:
    """The stored image bytes of ``split`` (index order, at most ``limit``), via shardkit's
    format readers."""
    from shardkit.formats import open_reader
    from shardkit.dataset.manifest import load_index, load_manifest

    manifest = load_manifest(root)
    index = load_index(root, split, manifest)
    readers: dict[int, object] = {}
    out = []
    n = len(index) if limit is None else min(limit, len(index))
    for i in range(n):
        s = int(index.shard[i])
        if s not in readers:
            readers[s] = open_reader(root, manifest, split, s)
        out.append(bytes(readers[s].read(index.key_at(i), int(index.offset[i]),
                                         int(index.size[i]))))
    for r in readers.values():
        r.close()
    return out


def bare_decode_rate(blobs: list[bytes], repeats: int = 3) -> dict:
    """Single-process full-image PyTurboJPEG decode rate (RGB) over the JPEGs in ``blobs``.

    The rate is images per second of this process's CPU time (``time.process_time``), i.e. what
    one core decodes when it has the core to itself, so the limit it gives does not shrink when
    other users load the machine; the wall-clock rate is reported beside it.

    Returns ``{"img_s": median per-core rate, "min", "max", "wall_img_s", "images",
    "skipped_non_jpeg", "method"}``.
    """
    from turbojpeg import TJPF_RGB, TurboJPEG

    tj = TurboJPEG()
    jpegs = [b for b in blobs if b[:2] == b"\xff\xd8"]
    for b in jpegs[: max(1, len(jpegs) // 10)]:
        tj.decode(b, pixel_format=TJPF_RGB)
    rates, walls = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for b in jpegs:
            tj.decode(b, pixel_format=TJPF_RGB)
        rates.append(len(jpegs) / max(time.process_time() - c0, 1e-9))
        walls.append(len(jpegs) / (time.perf_counter() - t0))
    return {"img_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            "wall_img_s": statistics.median(walls), "images": len(jpegs),
            "skipped_non_jpeg": len(blobs) - len(jpegs),
            "method": "PyTurboJPEG TurboJPEG.decode(pixel_format=TJPF_RGB), full size, "
                      "1 process, images per CPU-second"}


def summarize(payload: dict, limit_img_s: float) -> list[dict]:
    """Per (format, decoder, backend): the best shardkit row, its ratio to the baseline with the
    same workers/prefetch/pin, its ratio to the best baseline row, its ratio to the other
    backend's best row, and its fraction of the limit (all ratios of median img/s)."""
    rows = payload["rows"]
    base_ok = [r for r in rows if r["kind"] == "baseline" and r["status"] == "ok"]
    best_base = max((r["metrics"]["throughput_img_s"]["median"] for r in base_ok), default=None)
    groups: dict[tuple, list[dict]] = {}
    by_id = {r["id"]: r for r in rows}
    for r in rows:
        if r["kind"] != "shardkit":
            continue
        src = r if r["status"] == "ok" else by_id.get(r["same_as"])
        if src is None or src["status"] != "ok":
            continue
        # a process row at num_workers=0 is N/A and points at the thread row (the same work):
        # that row is the process backend's num_workers=0 candidate too
        backend = r["requested"].get("backend", "process")
        if r is not src and backend == src["setting"].get("backend", "process"):
            continue  # another N/A twin of the same backend: already counted via its source
        group = groups.setdefault((src["setting"]["format"], src["setting"]["decoder"], backend),
                                  [])
        if src not in group:
            group.append(src)
    best_of = {k: max(r["metrics"]["throughput_img_s"]["median"] for r in rs)
               for k, rs in groups.items()}
    out = []
    for (fmt, dec, backend), rs in groups.items():
        best = max(rs, key=lambda r: r["metrics"]["throughput_img_s"]["median"])
        thr = best["metrics"]["throughput_img_s"]["median"]
        s = best["setting"]
        base = next((b for b in base_ok if b["id"] == best.get("baseline_row")), None)
        eff = best["metrics"].get("img_per_cpu_s", {}).get("median")
        base_eff = base["metrics"].get("img_per_cpu_s", {}).get("median") if base else None
        other = [v for (f, d, b), v in best_of.items() if (f, d) == (fmt, dec) and b != backend]
        out.append({"format": fmt, "decoder": dec, "backend": backend, "row": best["id"],
                    "num_workers": s["num_workers"], "prefetch_factor": s["prefetch_factor"],
                    "img_s": thr, "img_s_min": best["metrics"]["throughput_img_s"]["min"],
                    "img_s_max": best["metrics"]["throughput_img_s"]["max"],
                    "ratio_to_baseline_same_setting": best.get("ratio_to_baseline"),
                    "ratio_to_best_baseline": thr / best_base if best_base else None,
                    "ratio_to_other_backend": thr / other[0] if other else None,
                    "fraction_of_decode_limit": thr / limit_img_s,
                    "img_per_cpu_s": eff,
                    "cpu_efficiency_ratio_to_baseline": eff / base_eff if eff and base_eff
                    else None})
    return out


@click.command()
@click.option("--data", multiple=True, required=True, type=click.Path(exists=True, file_okay=False),
              help="Packed dataset, or a raw ImageFolder (packed into every format first).")
@click.option("--out", default="bench-results/loader.json", show_default=True,
              type=click.Path(dir_okay=False))
@click.option("--quick", is_flag=True, help="Small grid, few batches (make bench).")
@click.option("--split", default="train", show_default=True)
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--image-size", default=224, show_default=True, type=int)
@click.option("--num-workers", default=None, help="Default 0,1,2 (quick: 0,2).")
@click.option("--prefetch-factor", default=None, help="Default 2,4 (quick: 2).")
@click.option("--pin-memory", default="both", show_default=True,
              type=click.Choice(["on", "off", "both"]))
@click.option("--decoder", "decoders", multiple=True, default=("auto",), show_default=True)
@click.option("--backend", "backends", default="thread,process", show_default=True,
              help="Comma list of make_loader backends to measure (thread, process).")
@click.option("--warmup", default=None, type=int, help="Default 3 (quick: 1).")
@click.option("--batches", default=None, type=int, help="Default 30 (quick: 4).")
@click.option("--repeats", default=None, type=int, help="Default 3 (quick: 2).")
@click.option("--step-ms", default=None, type=float, help="Simulated step (default: none).")
def main(data, out, quick, split, batch_size, image_size, num_workers, prefetch_factor,
         pin_memory, decoders, backends, warmup, batches, repeats, step_ms):
    """Loader throughput per format vs ImageFolder+PIL, and vs the bare-decode limit."""
    out = Path(out)
    if quick:
        batch_size = min(batch_size, 16)
    cfg = RunConfig(split=split, batch_size=batch_size, image_size=image_size,
                    warmup=warmup if warmup is not None else (1 if quick else 3),
                    batches=batches or (4 if quick else 30),
                    repeats=repeats or (2 if quick else 3))
    with tempfile.TemporaryDirectory(prefix="shardkit-bench-loader-") as tmp:
        packed = ensure_packed(list(data), tmp)
        payload = run_bench([str(p) for p in packed], out.with_suffix(""), decoders=decoders,
                            num_workers=num_workers or ("0,2" if quick else "0,1,2"),
                            prefetch_factor=prefetch_factor or ("2" if quick else "2,4"),
                            pin_memory=pin_memory, backends=backends, cfg=cfg, step_ms=step_ms,
                            baseline="imagefolder")
        blobs = split_bytes(packed[0], split, limit=200 if quick else None)
    bare = bare_decode_rate(blobs, repeats=cfg.repeats)
    cores = payload["environment"]["cpu"]["usable_cores"] or os.cpu_count() or 1
    limit = cores * bare["img_s"]
    for r in payload["rows"]:
        if r["status"] == "ok":
            r["fraction_of_decode_limit"] = r["metrics"]["throughput_img_s"]["median"] / limit
    payload["bare_decode"] = {**bare, "cores": cores, "limit_img_s": limit}
    payload["summary"] = summarize(payload, limit)
    payload["suite"] = "bench_loader"
    write_json(out, payload, echo=False)
    click.echo(f"bare turbojpeg full decode: {bare['img_s']:.0f} img/s per core (CPU time; wall "
               f"{bare['wall_img_s']:.0f}) x {cores} cores = limit {limit:.0f} img/s "
               f"({bare['images']} images)")
    for s in payload["summary"]:
        parts = [f"{s['format']:>5}/{s['decoder']} {s['backend']:<7}: best {s['img_s']:.0f} img/s "
                 f"(workers={s['num_workers']}, prefetch={s['prefetch_factor']})"]
        if s["ratio_to_baseline_same_setting"]:
            parts.append(f"x{s['ratio_to_baseline_same_setting']:.2f} ImageFolder+PIL at the "
                         f"same setting")
        if s["ratio_to_best_baseline"]:
            parts.append(f"x{s['ratio_to_best_baseline']:.2f} the best ImageFolder+PIL row")
        if s["ratio_to_other_backend"]:
            parts.append(f"x{s['ratio_to_other_backend']:.2f} the best "
                         f"{'process' if s['backend'] == 'thread' else 'thread'} row")
        parts.append(f"{s['fraction_of_decode_limit']:.0%} of the bare-decode limit")
        if s["cpu_efficiency_ratio_to_baseline"]:
            parts.append(f"{s['img_per_cpu_s']:.0f} img per CPU-second "
                         f"(x{s['cpu_efficiency_ratio_to_baseline']:.2f} ImageFolder+PIL)")
        click.echo(", ".join(parts))
    click.echo(f"wrote {out}")
    if any(r["status"] == "error" for r in payload["rows"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
