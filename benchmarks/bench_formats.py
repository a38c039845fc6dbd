"""Raw-bytes read throughput: original files vs tar (wds) vs LMDB vs HDF5 shards.

Reads every stored image of a split as bytes (no decoding) through shardkit's format readers,
and the same images from the original files (the manifest's ``source.root``), in two orders:
``index`` (split order) and ``shuffled`` (a fixed random permutation, like a training epoch).

Page cache: ``warm`` passes follow an untimed pass that loads everything into the cache. ``cold``
passes first evict it: ``echo 3 > /proc/sys/vm/drop_caches`` after ``sync`` when that is
possible (root, writable /proc/sys), else ``posix_fadvise(POSIX_FADV_DONTNEED)`` on each file
read (evicts clean, unmapped pages without root; may do nothing on some filesystems, e.g. some
overlay mounts, so compare cold with warm), and the JSON says which method ran and why the other
did not. Every pass runs in a freshly forked child so that no file or LMDB map stays open (mapped
pages cannot be evicted) between passes.

Usage:
    python benchmarks/bench_formats.py --data PACKED_OR_RAW_DIR [--data ...] --out FILE [--quick]
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardkit.bench.env import collect_environment  # noqa: E402
from shardkit.bench.prepare import ensure_packed  # noqa: E402
from _common import write_json  # noqa: E402


def _raw_items(packed: Path, split: str) -> tuple[list[str], str | None]:
    from shardkit.dataset.manifest import load_manifest

    src = load_manifest(packed).get("source", {}).get("root")
    if not src or not Path(src).is_dir():
        return [], f"source.root {src!r} of {packed} is not reachable"
    with open(packed / "splits" / f"{split}.jsonl", encoding="utf-8") as fh:
        paths = [str(Path(src) / json.loads(line)["path"]) for line in fh if line.strip()]
    return paths, None


def _files_of(kind: str, target: str, split: str, limit: int | None) -> list[str]:
    if kind == "raw":
        return _raw_items(Path(target), split)[0][:limit]
    from shardkit.dataset.manifest import load_manifest

    m = load_manifest(target)
    return [str(Path(target) / s["path"]) for s in m["splits"][split]["shards"]]


def _read_pass(kind: str, target: str, split: str, order: str, limit: int | None, q) -> None:
    """Child process: read every sample once, put ``(images, bytes, seconds)`` on ``q``.

    The clock starts after imports, manifest and index loading (per-run setup, not per-sample
    cost) and includes opening each shard.
    """
    try:
        n = nbytes = 0
        if kind == "raw":
            paths = _raw_items(Path(target), split)[0][:limit]
            idx = np.arange(len(paths))
            if order == "shuffled":
                idx = np.random.default_rng(0).permutation(len(paths))
            t0 = time.perf_counter()
            for i in idx:
                with open(paths[i], "rb") as fh:
                    nbytes += len(fh.read())
                n += 1
        else:
            from shardkit.formats import open_reader
            from shardkit.dataset.manifest import load_index, load_manifest

            m = load_manifest(target)
            index = load_index(target, split, m)
            count = len(index) if limit is None else min(limit, len(index))
            idx = np.arange(count)
            if order == "shuffled":
                idx = np.random.default_rng(0).permutation(count)
            readers = {}
            t0 = time.perf_counter()  # opening the shards counts: it is part of reading them
            for i in idx:
                s = int(index.shard[i])
                if s not in readers:
                    readers[s] = open_reader(target, m, split, s)
                nbytes += len(readers[s].read(index.key_at(int(i)), int(index.offset[i]),
                                              int(index.size[i])))
                n += 1
        q.put((n, nbytes, time.perf_counter() - t0))
    except Exception as exc:  # noqa: BLE001 - sent to the parent, which raises it
        q.put(f"{type(exc).__name__}: {exc}")


def _run_child(*args) -> tuple[int, int, float]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_read_pass, args=(*args, q))
    p.start()
    res = q.get(timeout=600)
    p.join()
    if isinstance(res, str):
        raise RuntimeError(f"read pass {args[:4]} failed: {res}")
    return res


def try_drop_caches() -> str | None:
    """Drops the page cache system-wide; returns None on success, else why it was not possible."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
    except OSError as exc:
        return f"cannot write /proc/sys/vm/drop_caches ({exc.strerror}; uid {os.getuid()})"
    return None


def fadvise_evict(files: list[str]) -> int:
    """``posix_fadvise(DONTNEED)`` on each file; returns how many files it was applied to."""
    done = 0
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        finally:
            os.close(fd)
    return done


def _stats(passes: list[tuple[int, int, float]]) -> dict:
    img = [n / s for n, _, s in passes]
    mb = [b / s / 1e6 for _, b, s in passes]
    return {"img_s": statistics.median(img), "img_s_min": min(img), "img_s_max": max(img),
            "mb_s": statistics.median(mb), "mb_s_min": min(mb), "mb_s_max": max(mb),
            "images": passes[0][0], "bytes": passes[0][1], "repeats": len(passes)}


@click.command()
@click.option("--data", multiple=True, required=True, type=click.Path(exists=True, file_okay=False),
              help="Packed dataset, or a raw ImageFolder (packed into every format first).")
@click.option("--out", default="bench-results/formats.json", show_default=True,
              type=click.Path(dir_okay=False))
@click.option("--quick", is_flag=True, help="One repeat, at most 200 images.")
@click.option("--split", default="train", show_default=True)
@click.option("--repeats", default=None, type=int, help="Default 3 (quick: 1).")
@click.option("--limit", default=None, type=int, help="Images per pass (default all; quick 200).")
@click.option("--cold/--no-cold", default=True, show_default=True)
def main(data, out, quick, split, repeats, limit, cold):
    """Raw-bytes read throughput per storage format, warm and cold page cache."""
    repeats = repeats or (1 if quick else 3)
    limit = limit or (200 if quick else None)
    results, notes = [], []
    drop_reason = None
    with tempfile.TemporaryDirectory(prefix="shardkit-bench-formats-") as tmp:
        packed = ensure_packed(list(data), tmp)
        targets = []
        raw, why = _raw_items(packed[0], split)
        if raw:
            targets.append(("raw", "files", str(packed[0])))
        else:
            notes.append(f"raw files not measured: {why}")
        from shardkit.dataset.manifest import load_manifest

        targets += [("shards", load_manifest(p)["format"], str(p)) for p in packed]
        cache_modes = ["warm"] + (["cold"] if cold else [])
        if cold:
            drop_reason = try_drop_caches()
            if drop_reason:
                notes.append(f"cold: drop_caches not possible ({drop_reason}); evicting each "
                             f"file with posix_fadvise(DONTNEED) instead")
        cold_method = "drop_caches" if cold and drop_reason is None else "fadvise_dontneed"
        for kind, name, target in targets:
            kind_key = "raw" if kind == "raw" else "shards"
            files = _files_of(kind_key, target, split, limit)
            for order in ("index", "shuffled"):
                for cache in cache_modes:
                    passes = []
                    if cache == "warm":
                        _run_child(kind_key, target, split, order, limit)  # fills the cache
                    for _ in range(repeats):
                        if cache == "cold":
                            if cold_method == "drop_caches":
                                try_drop_caches()
                            else:
                                fadvise_evict(files)
                        passes.append(_run_child(kind_key, target, split, order, limit))
                    row = {"source": name, "path": target, "order": order, "cache": cache,
                           **_stats(passes)}
                    if cache == "cold":
                        row["cold_method"] = cold_method
                    results.append(row)
                    click.echo(f"{name:>6} {order:>8} {cache:>4}: {row['img_s']:9.0f} img/s "
                               f"{row['mb_s']:8.1f} MB/s ({row['images']} images)")
    base = {(r["order"], r["cache"]): r["img_s"] for r in results if r["source"] == "files"}
    for r in results:
        b = base.get((r["order"], r["cache"]))
        r["ratio_to_raw_files"] = r["img_s"] / b if b else None
    env = collect_environment()
    payload = {"suite": "bench_formats", "split": split, "repeats": repeats, "limit": limit,
               "cold_method": cold_method if cold else None, "drop_caches_error": drop_reason,
               "notes": notes, "results": results,
               "environment": {k: env[k] for k in ("cpu", "platform", "python", "shardkit")}}
    write_json(out, payload, echo=False)
    for n in notes:
        click.echo(f"note: {n}")
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
