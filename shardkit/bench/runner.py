"""Runs the grid: builds each loader (shardkit or the ImageFolder baseline), times it, records it.

A row never crashes the sweep: an option combination the loader rejects at construction is
recorded as ``"n/a"`` with the loader's message (case 20); a failure while iterating is recorded
as ``"error"`` with the exception, and the CLI exits non-zero when any row errored.

A row with a decoded cache (``setting.cache`` not ``"none"``) first runs one whole
untimed epoch that fills the arena (its wall time is the row's ``cache.fill_s``; a disk arena
already filled by an earlier row or run is reused and costs only the reads), then is timed as
any row: the timed repeats read from the cache, as every epoch after the first of a real run.
The row's ``cache`` dict (:func:`cache_record`) holds its size, hit rate and fill time, and the
runner adds ``ratio_to_uncached`` / ``fill_ratio_to_uncached`` against the row with the same
setting and ``cache="none"`` when the grid has it.

A row's ``setting.augment`` (:mod:`shardkit.bench.augment`) is passed to
``make_loader(augment=...)``; the ImageFolder baseline gets the matching torchvision pipeline per
augment spec (:func:`shardkit.bench.baseline.baseline_transform`), and none for an op list.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shardkit.bench.augment import add_augment_ratios, augment_label, batch_ops_note
from shardkit.bench.grid import GridRow, Setting
from shardkit.bench.harness import measure
from shardkit.bench.steps import Step

__all__ = ["RunConfig", "dataset_info", "shardkit_factory", "run_rows", "add_baseline_rows",
           "fill_cache", "cache_record", "add_cache_ratios", "add_augment_ratios",
           "add_auto_rows", "auto_row_count", "format_auto"]


@dataclass(frozen=True)
class RunConfig:
    """What every row shares: split, batch, image size, warm-up, timed batches, repeats."""

    split: str = "train"
    batch_size: int = 32
    image_size: int = 224
    warmup: int = 2
    batches: int = 20
    repeats: int = 3
    train: bool = True
    monitor_interval: float = 0.5


def dataset_info(root: str | Path) -> dict:
    """``{"root", "format", "classes", "source_root", "source_kind", "splits"}`` from the manifest.

    Raises:
        ManifestError: no readable ``manifest.json`` under ``root``.
    """
    from shardkit.dataset.manifest import load_manifest

    m = load_manifest(root)
    source = m.get("source", {})
    return {"root": str(root), "format": m["format"], "classes": m["classes"],
            "source_root": source.get("root"), "source_kind": source.get("kind", "folder"),
            "splits": {k: v.get("num_samples") for k, v in m["splits"].items()}}


def shardkit_factory(setting: Setting, cfg: RunConfig):
    """Builds ``shardkit.make_loader(...)`` with ``WorkerOptions(backend=setting.backend)``,
    ``cache=setting.cache`` and ``augment=setting.augment`` for ``setting`` (construction errors
    propagate).

    ``prefetch_factor=None`` is not passed, so both backends get ``make_loader``'s default
    (2 batches in flight per worker, the DataLoader default too).
    """
    from shardkit.stream import WorkerOptions, make_loader
    from shardkit.transforms import TransformConfig

    extra = {} if setting.prefetch_factor is None else {"prefetch_factor": setting.prefetch_factor}
    return make_loader(setting.data, cfg.split, cfg.batch_size,
                       num_workers=setting.num_workers, pin_memory=setting.pin_memory,
                       train=cfg.train,
                       transform=TransformConfig(image_size=cfg.image_size,
                                                 decoder=setting.decoder),
                       workers=WorkerOptions(backend=setting.backend,
                                             persistent_workers=setting.persistent_workers),
                       cache=getattr(setting, "cache", "none"),
                       augment=getattr(setting, "augment", "none"), **extra)


def fill_cache(loader, epoch: int) -> dict | None:
    """Fills ``loader``'s decoded cache with one whole epoch (``epoch``, not one of the timed
    repeats') when it has one; returns ``{"fill_s" (wall seconds, float), "fill_images" (int),
    "fill_img_s", "stats_after_fill"}`` or None (no cache: ``cache="none"``, or ``"auto"``
    that chose none, or an arena that could not be opened)."""
    cache_stats = getattr(loader, "cache_stats", None)
    if cache_stats is None or cache_stats() is None:
        return None
    loader.set_epoch(epoch)
    n, t0 = 0, time.perf_counter()
    for batch in loader:
        n += len(batch[1])
    fill_s = time.perf_counter() - t0
    return {"fill_s": fill_s, "fill_images": n, "fill_img_s": n / fill_s if fill_s > 0 else None,
            "stats_after_fill": cache_stats()}


def cache_record(requested: str, fill: dict | None, after: dict | None) -> dict:
    """The ``cache`` dict of a bench row: ``{"requested", "mode" ("none" | "ram" | "disk": what
    ran; ``"auto"`` resolves to one of them), "resolution", "path" (the arena file),
    "size_bytes" (every sample at the
    cache resolution, bytes), "filled_samples", "filled_bytes", "bytes_per_image", "fill_s"
    (wall seconds of the untimed fill epoch), "fill_img_s", "fill_hit_rate" (hits during the
    fill epoch: 0.0 for a fresh arena, 1.0 for a reused disk arena), "hits", "misses",
    "hit_rate" (during the timed repeats, warm-up included; None without samples),
    "disabled", "huge_pages" (the arena tmpfs's huge-page mode, None off a tmpfs)}``. ``fill``
    is :func:`fill_cache`'s result, ``after`` the loader's ``cache_stats()`` after timing."""
    if fill is None or after is None:
        return {"requested": requested, "mode": "none"}
    before = fill["stats_after_fill"]
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    n = before["num_samples"] or 0
    return {"requested": requested, "mode": after["mode"], "resolution": after["resolution"],
            "path": after["path"],
            "size_bytes": after["size_bytes"], "filled_samples": after["filled_samples"],
            "filled_bytes": after["filled_bytes"],
            "bytes_per_image": after["size_bytes"] / n if n else None,
            "fill_s": fill["fill_s"], "fill_img_s": fill["fill_img_s"],
            "fill_hit_rate": before["hit_rate"], "hits": hits, "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else None,
            "disabled": after["disabled"], "huge_pages": after.get("huge_pages")}


def add_cache_ratios(results: list[dict]) -> None:
    """Sets ``ratio_to_uncached`` (median throughput, cached / uncached) and
    ``fill_ratio_to_uncached`` (fill-epoch img/s / the uncached row's median img/s) on every
    measured shardkit row with a cache whose twin (same setting, ``cache="none"``) was measured
    too, and ``uncached_row`` (that twin's id)."""
    def key(s: dict) -> tuple:
        return tuple(sorted((k, v) for k, v in s.items() if k != "cache"))

    twins = {key(r["setting"]): r for r in results if r["kind"] == "shardkit"
             and r["status"] == "ok" and r["setting"].get("cache", "none") == "none"}
    for r in results:
        c = r.get("cache")
        if r["kind"] != "shardkit" or r["status"] != "ok" or not c or c["mode"] == "none":
            continue
        twin = twins.get(key(r["setting"]))
        if twin is None:
            continue
        base = twin["metrics"]["throughput_img_s"]["median"]
        r["uncached_row"] = twin["id"]
        r["ratio_to_uncached"] = r["metrics"]["throughput_img_s"]["median"] / base
        if c.get("fill_img_s"):
            r["fill_ratio_to_uncached"] = c["fill_img_s"] / base


def _epochs(loader):
    def make(repeat: int):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(repeat)
        return loader
    return make


def _row_dict(row: GridRow, kind: str) -> dict:
    return {"id": row.id, "kind": kind, "requested": row.requested.as_dict(),
            "setting": row.setting.as_dict(), "status": row.status, "note": row.note,
            "same_as": row.same_as}


def run_rows(rows: list[GridRow], cfg: RunConfig, step: Step, *,
             factory: Callable[[Setting, RunConfig], object] = shardkit_factory,
             kind: str = "shardkit", progress: Callable[[str], None] | None = None) -> list[dict]:
    """Measures every ``"run"`` row; returns one JSON-ready dict per row (N/A rows included).

    Each dict: ``id, kind, requested, setting, status ("ok" | "n/a" | "error"), note, same_as``
    and, when measured, ``batch_size, batches_timed, images_timed, metrics, memory_kind,
    num_batches`` (``len()`` of the loader when it has one) and, for shardkit rows, ``cache``
    (:func:`cache_record`). Call :func:`add_cache_ratios` on the result for the cached rows'
    ratios to their uncached twins, and :func:`add_augment_ratios` for the augmented rows' to
    their unaugmented ones. A shardkit row whose augment spec has batch ops (mixup, cutmix) says
    in its note that the loader mixes (and the bench times) them and baselines do not.
    """
    out = []
    for row in rows:
        rec = _row_dict(row, kind)
        out.append(rec)
        if row.status != "run":
            continue
        if progress:
            s = row.setting
            progress(f"[{kind} row {row.id}] {s.format or ''} decoder={s.decoder} "
                     f"backend={s.backend} workers={s.num_workers} "
                     f"prefetch={'-' if s.prefetch_factor is None else s.prefetch_factor} "
                     f"pin={s.pin_memory} "
                     f"persistent={s.persistent_workers}"
                     + (f" cache={s.cache}" if getattr(s, "cache", "none") != "none" else "")
                     + (f" augment={augment_label(s.augment)}" if s.augment != "none" else ""))
        try:
            loader = factory(row.setting, cfg)
        except ValueError as exc:  # LoaderError/ConfigError or DataLoader's own validation
            rec.update(status="n/a", note=_join(rec["note"], f"rejected by the loader: "
                                                             f"{type(exc).__name__}: {exc}"))
            continue
        n = _len(loader)
        fill = None
        try:
            fill = fill_cache(loader, cfg.repeats)
            res = measure(_epochs(loader), step, repeats=cfg.repeats, warmup=cfg.warmup,
                          max_batches=cfg.batches, monitor_interval=cfg.monitor_interval)
            if kind == "shardkit":
                res["cache"] = cache_record(getattr(row.setting, "cache", "none"), fill,
                                            loader.cache_stats() if fill else None)
        except Exception as exc:  # noqa: BLE001 - recorded as an error row, reported, exit != 0
            rec.update(status="error", note=_join(rec["note"], f"{type(exc).__name__}: {exc}"))
            continue
        finally:
            _shutdown(loader)
            loader = None  # a baseline DataLoader's persistent workers stop with it
        rec.update(status="ok", batch_size=cfg.batch_size, num_batches=n, **res)
        if kind == "shardkit":
            rec["note"] = _join(rec["note"], batch_ops_note(row.setting.augment))
        if n is not None and n - cfg.warmup < cfg.batches:
            rec["note"] = _join(rec["note"], f"loader has {n} batches: {n - cfg.warmup} timed "
                                             f"after {cfg.warmup} warm-up (asked {cfg.batches})")
        s = row.setting
        buffered = (s.num_workers * (s.prefetch_factor or 2)
                    if isinstance(s.num_workers, int) and s.prefetch_factor != "auto" else 0)
        if buffered and min(res["batches_timed"]) < 4 * buffered:
            # Workers fill num_workers x prefetch_factor batches ahead during warm-up; a short
            # window drains that buffer and overstates the steady-state rate.
            rec["note"] = _join(rec["note"], f"only {min(res['batches_timed'])} timed batches "
                                             f"for {buffered} prefetched: throughput may overstate "
                                             f"the steady state (use more --batches)")
    return out


def _len(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _shutdown(loader) -> None:
    """Stops the loader's decoding threads or worker processes, so the next row starts with the
    machine to itself: ``close()`` for a shardkit loader; a plain ``DataLoader`` (the baseline)
    stops its workers when its last reference goes, which the caller drops."""
    close = getattr(loader, "close", None)
    if close is not None:
        close()


def _join(a: str, b: str) -> str:
    """Two notes as one, ``"; "`` between them; an empty one adds nothing (no ``"x; "``)."""
    return "; ".join(part for part in (a, b) if part)


def split_source_paths(root: str | Path, split: str) -> list[str]:
    """Source-relative paths of the samples of ``split`` (from ``splits/<split>.jsonl``, read
    and checked by :func:`shardkit.dataset.manifest.read_split_records`).

    Raises:
        ManifestError: unknown split, or a damaged split file (names the line and field).
    """
    from shardkit.dataset.manifest import read_split_records

    return [r["path"] for r in read_split_records(root, split, required=("key", "path"))]


def add_baseline_rows(results: list[dict], info: dict, cfg: RunConfig, step: Step,
                      progress: Callable[[str], None] | None = None) -> list[dict]:
    """ImageFolder+PIL rows for every distinct worker setting and augment spec measured for
    ``info``'s dataset.

    The baseline is a ``DataLoader`` (its setting says ``backend="process"``); shardkit rows of
    both backends (and every cache mode) with the same num_workers / prefetch / pin / persistent
    / augment share one baseline row, whose transform is the torchvision pipeline matching the
    augment preset (recorded as the row's ``baseline_transform``). Sets ``baseline_row`` and
    ``ratio_to_baseline`` (median throughput ratio, shardkit / baseline) on the shardkit rows of
    every dataset that shares the setting. Returns the baseline rows (status "n/a" with a note
    when the manifest's ``source.root`` is not reachable, or for an augment op list, which has
    no torchvision counterpart).
    """
    from shardkit.bench.baseline import (BASELINE_AUGMENT, describe_baseline,
                                         imagefolder_loader)

    def key(s: dict) -> tuple:
        return (s["num_workers"], s["prefetch_factor"], s["pin_memory"], s["persistent_workers"],
                s.get("augment", "none"))

    keys: dict[tuple, Setting] = {}
    for rec in results:
        if rec["kind"] == "shardkit" and rec["status"] == "ok":
            k = key(rec["setting"])
            keys.setdefault(k, Setting(str(info["source_root"]), "imagefolder", "pil", *k[:4],
                                       backend="process", augment=k[4]))
    src = info.get("source_root")
    start = max((r["id"] for r in results), default=-1) + 1
    rows = [GridRow(start + i, s, s, "run") for i, s in enumerate(keys.values())]
    for r in rows:
        if r.setting.augment not in BASELINE_AUGMENT:
            r.status, r.note = "n/a", (f"no ImageFolder baseline for augment="
                                       f"{augment_label(r.setting.augment)}: an op list has no "
                                       f"torchvision counterpart here (only the presets do)")
    if not src or not Path(src).is_dir():
        for r in rows:
            r.status, r.note = "n/a", _join(r.note, f"baseline needs the original files: "
                                                    f"source.root {src!r} of {info['root']} is "
                                                    f"not reachable here")
        return [_row_dict(r, "baseline") for r in rows]
    paths = split_source_paths(info["root"], cfg.split)

    def factory(setting: Setting, c: RunConfig):
        return imagefolder_loader(src, paths, c.batch_size, num_workers=setting.num_workers,
                                  prefetch_factor=setting.prefetch_factor,
                                  pin_memory=setting.pin_memory,
                                  persistent_workers=setting.persistent_workers,
                                  image_size=c.image_size, augment=setting.augment)

    base = run_rows(rows, cfg, step, factory=factory, kind="baseline", progress=progress)
    for b in base:
        if b["setting"]["augment"] in BASELINE_AUGMENT:
            b["baseline_transform"] = describe_baseline(cfg.image_size, b["setting"]["augment"])
    by_key = {key(b["setting"]): b for b in base}
    for rec in results:
        if rec["kind"] != "shardkit" or rec["status"] != "ok":
            continue
        b = by_key.get(key(rec["setting"]))
        if b is not None and b["status"] == "ok":
            rec["baseline_row"] = b["id"]
            rec["ratio_to_baseline"] = (rec["metrics"]["throughput_img_s"]["median"]
                                        / b["metrics"]["throughput_img_s"]["median"])
    return base


#: The setting fields an ``auto`` row shares with the grid rows it is compared with.
_AUTO_KEY = ("data", "format", "decoder", "backend", "cache", "augment", "pin_memory")


def auto_row_count(rows) -> int:
    """How many rows :func:`add_auto_rows` adds for the grid ``rows`` (``GridRow``s) if every
    row to run is measured: one per distinct :data:`_AUTO_KEY` (a progress bar's total)."""
    return len({tuple(getattr(r.setting, k) for k in _AUTO_KEY) for r in rows
                if r.status == "run"})


def add_auto_rows(results: list[dict], cfg: RunConfig, step: Step,
                  progress: Callable[[str], None] | None = None) -> list[dict]:
    """One ``num_workers="auto"``, ``prefetch_factor="auto"`` row (kind ``"auto"``) per
    distinct (data, format, decoder, backend, cache, augment, pin_memory) among the measured
    shardkit rows, timed as they are (its tuner keeps what it learnt across the repeats, as
    across the epochs of a run). Each gets ``tuning`` (the loader's
    :class:`~shardkit.stream.tuning.Tuning` as a dict after the last repeat), ``best_row`` and
    ``ratio_to_best`` (median throughput, auto / the best grid row with the same fields), and
    ``default_row`` / ``ratio_to_default`` against ``num_workers=2, prefetch_factor=2`` (or
    None: ``make_loader``'s defaults) when the grid measured it. Returns the auto rows."""
    grid = [r for r in results if r["kind"] == "shardkit" and r["status"] == "ok"]
    keys: dict[tuple, Setting] = {}
    for r in grid:
        s = r["setting"]
        keys.setdefault(tuple(s[k] for k in _AUTO_KEY), Setting(**{
            **s, "num_workers": "auto", "prefetch_factor": "auto",
            "persistent_workers": False}))
    start = max((r["id"] for r in results), default=-1) + 1
    rows = [GridRow(start + i, s, s, "run") for i, s in enumerate(keys.values())]
    loaders: dict[Setting, object] = {}

    def factory(setting: Setting, c: RunConfig):
        loaders[setting] = shardkit_factory(setting, c)
        return loaders[setting]

    out = run_rows(rows, cfg, step, factory=factory, kind="auto", progress=progress)
    for rec in out:
        loader = loaders.get(Setting(**rec["setting"]))
        if loader is not None:
            rec["tuning"] = loader.tuning.as_dict()
        if rec["status"] != "ok":
            continue
        key = tuple(rec["setting"][k] for k in _AUTO_KEY)
        twins = [r for r in grid if tuple(r["setting"][k] for k in _AUTO_KEY) == key]
        rate = rec["metrics"]["throughput_img_s"]["median"]
        best = max(twins, key=lambda r: r["metrics"]["throughput_img_s"]["median"])
        rec["best_row"] = best["id"]
        rec["ratio_to_best"] = rate / best["metrics"]["throughput_img_s"]["median"]
        default = next((r for r in twins if r["setting"]["num_workers"] == 2
                        and r["setting"]["prefetch_factor"] in (2, None)), None)
        rec["default_row"] = default["id"] if default else None
        rec["ratio_to_default"] = (rate / default["metrics"]["throughput_img_s"]["median"]
                                   if default else None)
    return out


def format_auto(rows: list[dict]) -> str:
    """The auto rows in a few lines: throughput, its ratio to the best grid row and to the
    default setting, and what the tuner settled on and why."""
    lines = []
    for r in rows:
        s = r["setting"]
        head = (f"auto #{r['id']} ({s['backend']}, {s.get('format') or ''}, cache={s['cache']}, "
                f"augment={augment_label(s['augment'])}):")
        if r["status"] != "ok":
            lines.append(f"{head} {r['status']}: {r['note']}")
            continue
        t = r.get("tuning") or {}
        rate = r["metrics"]["throughput_img_s"]["median"]
        vs_default = (f", {r['ratio_to_default']:.2f}x the default (row {r['default_row']})"
                      if r.get("ratio_to_default") else "")
        lines.append(f"{head} {rate:.0f} img/s = {r['ratio_to_best']:.2f}x the best grid row "
                     f"(row {r['best_row']}){vs_default}; num_workers={t.get('num_workers')} "
                     f"prefetch_factor={t.get('prefetch_factor')}"
                     + (f": {t.get('reason')}" if t.get("settled") else
                        f", not settled within the row's {r.get('num_batches', '?')} batches "
                        "(it compares windows of 8 batches; more with --batches)"))
    return "\n".join(lines)
