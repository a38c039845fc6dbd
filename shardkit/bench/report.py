"""Turns measured rows into the terminal table, the recommendation and ``bench.json`` (the plots:
:mod:`shardkit.bench.plots`).

Recommendation rule: among measured shardkit rows, the cheapest setting whose median throughput
(images/s) is within ``tolerance`` (default 5%) of the best one, cheapest meaning fewest workers,
then the thread backend before the process backend (no worker processes, no per-batch
inter-process copy), then no decoded cache before ``ram`` before ``disk`` (a cache costs memory
or disk, and its first epoch is the fill), then lowest prefetch_factor, then pin_memory off, then
persistent_workers off. A cached row's throughput is its steady state from the second epoch on;
the text says so, with the cache's size and its fill epoch's rate. The run is data-bound at the
given step time when that setting's median ``data_wait_fraction`` (loader wait / wall time)
>= ``threshold``. Augmentation (``--augment``) is what the model trains on, not a cost to save:
with several augment specs in the grid, each gets its own recommendation (``per_augment``), the
top-level one is that of the first spec other than ``none``, and the text says what the
augmentation costs against ``none`` at that setting and whether it makes it data-bound.

``bench.json`` schema 2: every row's ``requested`` and ``setting`` carry ``backend`` ("thread" |
"process"; the ImageFolder baseline is a DataLoader, "process"); ``config.backends`` lists the
backends run. Schema 1 had no backend (everything ran as "process"). Schema 3 adds
``setting.cache`` / ``requested.cache`` ("none" | "ram" | "auto" | "disk:DIR"), each shardkit
row's ``cache`` dict (:func:`shardkit.bench.runner.cache_record`: size, hit rate, fill time),
``ratio_to_uncached`` / ``fill_ratio_to_uncached`` on cached rows and ``config.caches``.
Schema 4 adds ``setting.augment`` / ``requested.augment`` (a preset name or an op list as JSON
text), ``ratio_to_none`` / ``none_row`` on augmented rows (shardkit and baseline), the baseline
rows' ``baseline_transform`` (the torchvision pipeline, text), ``config.augments``, and
``recommendation.augment`` / ``recommendation.per_augment``.
"""
from __future__ import annotations

import json
import os

from shardkit.bench.augment import augment_cost_brief, augment_cost_text, augment_label

__all__ = ["recommend", "format_table", "format_not_run", "write_json", "SCHEMA_VERSION"]

SCHEMA_VERSION = 4

#: Cheapest first, for the recommendation (unknown / missing backend: last).
_BACKEND_COST = {"thread": 0, "process": 1}
#: Decoded cache modes that ran (``auto`` resolved), cheapest first.
_CACHE_COST = {"none": 0, "ram": 1, "disk": 2}


def _cache_mode(rec: dict) -> str:
    """The cache mode that ran: ``"none"``, ``"ram"`` or ``"disk"`` (``auto`` resolved)."""
    c = rec.get("cache")
    if c is not None:
        return c.get("mode", "none")
    req = rec["setting"].get("cache", "none")
    return "disk" if req.startswith("disk:") else req


def cache_text(rec: dict) -> str:
    """``"cache=ram"`` (or ``"cache=auto>ram"``), empty without a cache."""
    req = rec["setting"].get("cache", "none")
    ran = _cache_mode(rec)
    if req == "none":
        return ""
    return f"cache={req}" if ran == req or req.startswith("disk:") else f"cache={req}>{ran}"


def median_of(rec: dict, metric: str) -> float | None:
    """The median of ``metric`` in a bench record, None when the row did not measure it."""
    m = rec.get("metrics", {}).get(metric)
    return None if m is None else m["median"]


def _cost(rec: dict) -> tuple:
    s = rec["setting"]
    return (s["num_workers"], _BACKEND_COST.get(s.get("backend"), len(_BACKEND_COST)),
            _CACHE_COST.get(_cache_mode(rec), len(_CACHE_COST)), s["prefetch_factor"] or 0,
            s["pin_memory"], s["persistent_workers"], -median_of(rec, "throughput_img_s"))


def _label(rec: dict) -> str:
    s = rec["setting"]
    pf = "-" if s["prefetch_factor"] is None else s["prefetch_factor"]
    cache = cache_text(rec)
    aug = s.get("augment", "none")
    return (f"{s['format']}/{s['decoder']} backend={s.get('backend', '-')} "
            + (f"{cache} " if cache else "")
            + (f"augment={augment_label(aug)} " if aug != "none" else "")
            + f"workers={s['num_workers']} prefetch={pf} "
            f"pin={'on' if s['pin_memory'] else 'off'}"
            + (" persistent" if s["persistent_workers"] else ""))


def _pick(rows: list[dict], tolerance: float) -> tuple[dict, dict]:
    best = max(rows, key=lambda r: median_of(r, "throughput_img_s"))
    floor = (1.0 - tolerance) * median_of(best, "throughput_img_s")
    cheapest = min((r for r in rows if median_of(r, "throughput_img_s") >= floor), key=_cost)
    return best, cheapest


def recommend(results: list[dict], step: dict, *, tolerance: float = 0.05,
              threshold: float = 0.10) -> dict:
    """The recommended setting and the data-bound verdict (see the module docstring).

    Args:
        results: row dicts from :func:`shardkit.bench.runner.run_rows`.
        step: the step's ``info()`` (``kind`` "none" | "sleep" | "model").
        tolerance: fraction of the best throughput a cheaper setting may lose, in [0, 1).
        threshold: data_wait_fraction from which the run counts as data-bound, in (0, 1].

    Returns:
        ``{"recommended_row", "best_row", "setting", "throughput_img_s",
        "best_throughput_img_s", "data_wait_fraction", "data_bound" (bool, or None when no step
        was simulated), "tolerance", "threshold", "text", "per_group": [...] (per data, decoder
        and augment), "cache", "augment" (the spec it was made for), "per_augment": [{"augment",
        "recommended_row", "best_row", "throughput_img_s", "data_wait_fraction", "data_bound",
        "ratio_to_none"}, ...] (grid order)}``; with no measured row,
        ``{"recommended_row": None, "text": ...}``.
    """
    ok = [r for r in results if r["kind"] == "shardkit" and r["status"] == "ok"]
    if not ok:
        return {"recommended_row": None, "best_row": None, "data_bound": None,
                "tolerance": tolerance, "threshold": threshold,
                "text": "no shardkit setting was measured successfully; see the N/A and error rows"}
    by_id = {r["id"]: r for r in results}
    by_aug: dict[str, list[dict]] = {}
    for r in ok:
        by_aug.setdefault(r["setting"].get("augment", "none"), []).append(r)
    main = next((a for a in by_aug if a != "none"), "none")
    out = _recommend_rows(by_aug[main], step, tolerance, threshold, by_id)
    per_augment = []
    for aug, rows in by_aug.items():
        one = out if aug == main else _recommend_rows(rows, step, tolerance, threshold, by_id)
        rec = by_id[one["recommended_row"]]
        per_augment.append({k: one[k] for k in ("recommended_row", "best_row", "throughput_img_s",
                                                "data_wait_fraction", "data_bound")}
                           | {"augment": aug, "ratio_to_none": rec.get("ratio_to_none")})
    if len(by_aug) > 1:
        others = [f"augment={augment_label(p['augment'])}: row {p['recommended_row']} "
                  f"({_label(by_id[p['recommended_row']])}), {p['throughput_img_s']:.0f} img/s"
                  + augment_cost_brief(by_id[p["recommended_row"]],
                                       by_id.get(by_id[p["recommended_row"]].get("none_row")),
                                       p["data_bound"], threshold)
                  for p in per_augment if p["augment"] != main]
        out["text"] = (f"Augmentation is a training choice, not a loader cost: each --augment "
                       f"spec gets its own recommendation; for augment={augment_label(main)}: "
                       + out["text"] + " Other specs: " + "; ".join(others) + ".")
    groups: dict[tuple, list[dict]] = {}
    for r in ok:
        groups.setdefault((r["setting"]["data"], r["setting"]["decoder"],
                           r["setting"].get("augment", "none")), []).append(r)
    per_group = []
    for (data, dec, aug), rows in groups.items():
        b, c = _pick(rows, tolerance)
        per_group.append({"data": data, "format": c["setting"]["format"], "decoder": dec,
                          "augment": aug, "recommended_row": c["id"], "best_row": b["id"],
                          "throughput_img_s": median_of(c, "throughput_img_s"),
                          "data_wait_fraction": median_of(c, "data_wait_fraction")})
    return out | {"per_group": per_group, "augment": main, "per_augment": per_augment}


def _recommend_rows(ok: list[dict], step: dict, tolerance: float, threshold: float,
                    by_id: dict[int, dict]) -> dict:
    """:func:`recommend` among ``ok`` (measured shardkit rows of one augment spec), without
    ``per_group`` / ``per_augment``."""
    best, rec = _pick(ok, tolerance)
    frac = median_of(rec, "data_wait_fraction")
    thr = median_of(rec, "throughput_img_s")
    text = [f"Recommended: {_label(rec)} (row {rec['id']}): {thr:.0f} img/s, "
            + ("the fastest row." if rec is best else
               f"{thr / median_of(best, 'throughput_img_s'):.0%} of the fastest ({_label(best)}, "
               f"row {best['id']}, {median_of(best, 'throughput_img_s'):.0f} img/s), with fewer "
               "resources.")]
    text += _cache_advice(rec, ok)
    if step.get("kind") == "none":
        bound = None
        text.append("No step was simulated (--step-ms / --model): this is the loader's own "
                    "throughput, so no data-bound verdict.")
    else:
        bound = frac >= threshold
        step_ms = median_of(rec, "step_ms_per_batch")
        demand = (f" (the step alone would consume {rec['batch_size'] / step_ms * 1000:.0f} "
                  f"img/s)" if step_ms >= 0.01 else "")
        text.append(f"At {step_ms:.1f} ms per step the device would wait for data {frac:.0%} of "
                    f"the time{demand}: " + ("DATA-BOUND." if bound else "not data-bound."))
        if bound:
            best_frac = min(median_of(r, "data_wait_fraction") for r in ok)
            text.append(f"Even the least-waiting setting waits {best_frac:.0%}: add CPU cores or "
                        f"workers, use a cheaper decoder (DCT-scaled turbojpeg) or smaller "
                        f"images, or pack to a faster format"
                        + ("" if any(_cache_mode(r) != "none" for r in ok) else
                           ", or try a decoded cache (--cache none,ram)") + "."
                        if best_frac >= threshold else
                        f"Some settings wait less ({best_frac:.0%}); prefer throughput over "
                        f"cost here.")
    text += augment_cost_text(rec, by_id.get(rec.get("none_row")), bound, threshold)
    return {"recommended_row": rec["id"], "best_row": best["id"], "setting": rec["setting"],
            "throughput_img_s": thr, "best_throughput_img_s": median_of(best, "throughput_img_s"),
            "data_wait_fraction": frac, "data_bound": bound, "tolerance": tolerance,
            "threshold": threshold, "text": " ".join(text), "cache": rec.get("cache")}


def _cache_advice(rec: dict, ok: list[dict]) -> list[str]:
    """Sentences on the recommended row's decoded cache: its size, that its rate is the steady
    state from the second epoch on, and its fill epoch's rate (and ratio to uncached); or, when
    a cheaper uncached row was picked over a cached one, that the cache did not pay."""
    c = rec.get("cache") or {}
    if c.get("mode", "none") != "none":
        size = c.get("size_bytes") or 0
        per = c.get("bytes_per_image")
        out = [f"Its decoded cache ({c['mode']}, {size / 2**20:.0f} MiB"
               + (f", {per / 1024:.0f} KiB per image" if per else "") + ") serves this rate "
               "from the second epoch on"]
        if c.get("fill_img_s"):
            ratio = rec.get("fill_ratio_to_uncached")
            out[0] += (f"; the first epoch fills it at {c['fill_img_s']:.0f} img/s"
                       + (f" ({ratio:.2f}x uncached)" if ratio else ""))
        if c.get("hit_rate") is not None and c["hit_rate"] < 1.0:
            out[0] += f"; only {c['hit_rate']:.0%} of the timed reads were hits"
        return [out[0] + "."]
    cached = [r for r in ok if _cache_mode(r) != "none"]
    if cached:
        top = max(cached, key=lambda r: median_of(r, "throughput_img_s"))
        return [f"The fastest cached row ({_label(top)}, row {top['id']}, "
                f"{median_of(top, 'throughput_img_s'):.0f} img/s) gains less than the tolerance over "
                f"this one: not worth its memory here."]
    return []


_SHORT_BACKEND = {"thread": "thread", "process": "proc"}


def _fmt(rec: dict, metric: str, spec: str) -> str:
    m = rec.get("metrics", {}).get(metric)
    return "-" if m is None else f"{m['median']:{spec}}"


def _columns(results: list[dict]) -> list[tuple[str, str, object]]:
    """The table's columns as ``(header, format spec, cell function)``: ``cache`` only when a
    row has a decoded cache, ``augment`` and ``x none`` only when a row augments, ``x base``
    only with baseline rows (a column of ``none`` or ``-`` in every row tells nothing)."""
    def setting(r):
        return r["requested"] if r["status"] == "n/a" else r["setting"]

    def spread(r):
        thr = r.get("metrics", {}).get("throughput_img_s")
        digits = 0 if thr and thr["max"] >= 100 else 1
        return f"{thr['min']:.{digits}f}-{thr['max']:.{digits}f}" if thr else "-"

    def decoder(r):
        dec = setting(r)["decoder"]
        ran = r.get("decoder_ran")
        return (f"{dec}>{ran}" if ran and ran != dec else dec)[:14]  # requested > what ran

    def ratio(key):
        return lambda r: f"{r[key]:.2f}" if r.get(key) else "-"

    cached = any(setting(r).get("cache", "none") != "none" for r in results)
    augmented = any(setting(r).get("augment", "none") != "none" for r in results)
    baseline = any(r["kind"] == "baseline" for r in results)
    cols = [("id", ">3", lambda r: r["id"]), ("kind", "<8", lambda r: r["kind"]),
            ("format", "<11", lambda r: str(setting(r)["format"])[:11]),
            ("decoder", "<14", decoder),
            ("backend", "<7", lambda r: _SHORT_BACKEND.get(setting(r).get("backend"), "-"))]
    cols += [("cache", "<8", lambda r: _cache_cell(r, setting(r)))] if cached else []
    cols += ([("augment", "<14", lambda r: augment_label(setting(r).get("augment"))[:14])]
             if augmented else [])
    cols += [("nw", ">2", lambda r: setting(r)["num_workers"]),
             ("pf", ">2", lambda r: "-" if setting(r)["prefetch_factor"] is None
              else str(setting(r)["prefetch_factor"])),
             ("pin", "<3", lambda r: "on" if setting(r)["pin_memory"] else "off"),
             ("pers", "<4", lambda r: "on" if setting(r)["persistent_workers"] else "off"),
             ("status", "<6", lambda r: r["status"]),
             ("loader ms", ">9", lambda r: _fmt(r, "loader_ms_per_batch", ".1f")),
             ("step ms", ">8", lambda r: _fmt(r, "step_ms_per_batch", ".1f")),
             ("img/s", ">8", lambda r: _fmt(r, "throughput_img_s", ".1f")),
             ("img/s min-max", ">15", spread),
             ("wait", ">5", lambda r: _fmt(r, "data_wait_fraction", ".0%")),
             ("cpu", ">5", lambda r: _fmt(r, "cpu_util_cores", ".2f")),
             ("MiB", ">6", lambda r: _fmt(r, "memory_mb", ".0f"))]
    cols += [("x base", ">6", ratio("ratio_to_baseline"))] if baseline else []
    cols += [("x none", ">6", ratio("ratio_to_none"))] if augmented else []
    return cols


def format_table(results: list[dict]) -> str:
    """A fixed-width text table of the rows that ran (measured, or failed with their note),
    then the N/A rows in a few lines (:func:`format_not_run`; every row stays in
    ``bench.json``).

    Columns: ``backend`` ("thread" / "proc"; the baseline is a DataLoader, "proc"), ``nw``
    workers (threads or processes), ``pf`` prefetch_factor ("-" = not passed), ``loader ms`` and
    ``step ms`` per batch, ``img/s`` (median, and min-max over repeats), ``wait`` (fraction of
    wall time waiting for data), ``cpu`` (cores), ``MiB`` (peak PSS), ``x base`` (throughput
    ratio to the ImageFolder baseline at the same setting; only with baseline rows); "-" = not
    measured. ``cache`` (only when a row has one): the decoded cache ("none", "ram", "disk",
    "auto>ram"...); a cached row gets a second line with the arena's size, the timed hit rate,
    its fill epoch and the ratios to its uncached twin (``x uncached``, ``fill x``).
    ``augment`` (only when a row augments): the augment spec (preset name, or ``ops:`` and the
    op names of a list; cut at 14 characters), ``x none`` its throughput ratio to the same
    setting with ``augment=none``.
    """
    cols = _columns(results)
    head = " ".join(f"{name:{spec}}" for name, spec, _ in cols)
    lines = [head, "-" * len(head)]
    for r in results:
        if r["status"] == "n/a":
            continue
        lines.append(" ".join(f"{str(cell(r)):{spec}}" for _, spec, cell in cols))
        c = r.get("cache") or {}
        if c.get("mode", "none") != "none":
            lines.append("      cache: " + _cache_line(r, c))
        if r["note"]:
            lines.append(f"      note: {r['note']}")
    return "\n".join(lines + format_not_run(results))


def _id_ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 8]`` -> ``"1-3, 8"``."""
    out, start = [], None
    for i, x in enumerate(ids):
        start = x if start is None else start
        if i + 1 == len(ids) or ids[i + 1] != x + 1:
            out.append(f"{start}" if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def format_not_run(results: list[dict]) -> list[str]:
    """Lines on the N/A rows (empty without any): how many, each distinct reason once with the
    rows it applies to, and which measured row did their work (``same_as``)."""
    na = [r for r in results if r["status"] == "n/a"]
    if not na:
        return []
    reasons: dict[str, list[int]] = {}
    same: dict[int, list[int]] = {}
    for r in na:
        for part in (r["note"] or "").split("; "):
            if part and not part.startswith(("measured as row", "duplicate of row")):
                reasons.setdefault(part, []).append(r["id"])
        if r.get("same_as") is not None:
            same.setdefault(r["same_as"], []).append(r["id"])
    n = len(na)
    lines = [f"not run: {n} requested setting{'s' if n != 1 else ''} that do not apply here "
             f"(every row is in bench.json):" if n != 1 else
             "not run: 1 requested setting that does not apply here (every row is in "
             "bench.json):"]
    for why, ids in reasons.items():
        lines.append(f"  {'rows' if len(ids) > 1 else 'row'} {_id_ranges(ids)}: {why}")
    if same:
        lines.append("  the same work as a measured row: " + "; ".join(
            f"{_id_ranges(ids)} as row {src}" for src, ids in same.items()))
    return lines


def _cache_cell(rec: dict, s: dict) -> str:
    req = s.get("cache", "none")
    if rec["kind"] == "baseline":
        return "-"
    ran = (rec.get("cache") or {}).get("mode")
    short = "disk" if req.startswith("disk:") else req
    return (f"{short}>{ran}" if ran and ran != short else short)[:8]


def _cache_line(rec: dict, c: dict) -> str:
    hit = "-" if c.get("hit_rate") is None else f"{c['hit_rate']:.0%}"
    parts = [f"{(c.get('size_bytes') or 0) / 2**20:.1f} MiB "
             f"({c.get('filled_samples')} images), hit rate {hit}"]
    if c.get("fill_s") is not None:
        parts.append(f"fill epoch {c['fill_s']:.2f} s ({(c.get('fill_img_s') or 0):.0f} img/s"
                     + (", reused" if (c.get("fill_hit_rate") or 0) >= 0.999 else "") + ")")
    if rec.get("ratio_to_uncached"):
        parts.append(f"{rec['ratio_to_uncached']:.2f}x uncached (row {rec['uncached_row']})")
    if rec.get("fill_ratio_to_uncached"):
        parts.append(f"fill {rec['fill_ratio_to_uncached']:.2f}x uncached")
    if c.get("huge_pages") is not None:  # "never": a page allocation per 4 KiB stored
        parts.append(f"tmpfs huge pages: {c['huge_pages']}")
    if c.get("disabled"):
        parts.append(f"disabled: {c['disabled']}")
    return "; ".join(parts)


def write_json(path: str | os.PathLike, payload: dict) -> None:
    """Writes ``payload`` (plus ``schema_version``) as indented JSON via a temp file + rename."""
    from shardkit.dataset.manifest import atomic_write_bytes

    text = json.dumps({"schema_version": SCHEMA_VERSION, **payload}, indent=2, default=str)
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))
