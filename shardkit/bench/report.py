"""Turns measured rows into the terminal table, the recommendation, the plots and ``bench.json``.

Recommendation rule: among measured shardkit rows, the cheapest setting whose median throughput
(images/s) is within ``tolerance`` (default 5%) of the best one, cheapest meaning fewest workers,
then the thread backend before the process backend (no worker processes, no per-batch
inter-process copy), then no decoded cache before ``ram`` before ``disk`` (a cache costs memory
or disk, and its first epoch is the fill), then lowest prefetch_factor, then pin_memory off, then
persistent_workers off. A cached row's throughput is its steady state from the second epoch on;
the text says so, with the cache's size and its fill epoch's rate. The run is data-bound at the
given step time when that setting's median ``data_wait_fraction`` (loader wait / wall time)
>= ``threshold``.

``bench.json`` schema 2: every row's ``requested`` and ``setting`` carry ``backend`` ("thread" |
"process"; the ImageFolder baseline is a DataLoader, "process"); ``config.backends`` lists the
backends run. Schema 1 had no backend (everything ran as "process"). Schema 3 adds
``setting.cache`` / ``requested.cache`` ("none" | "ram" | "auto" | "disk:DIR"), each shardkit
row's ``cache`` dict (:func:`shardkit.bench.runner.cache_record`: size, hit rate, fill time),
``ratio_to_uncached`` / ``fill_ratio_to_uncached`` on cached rows and ``config.caches``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["recommend", "format_table", "plot_series", "plot_loader_vs_step", "write_plots",
           "write_json", "SCHEMA_VERSION"]

SCHEMA_VERSION = 3

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


def _cache_text(rec: dict) -> str:
    """``"cache=ram"`` (or ``"cache=auto>ram"``), empty without a cache."""
    req = rec["setting"].get("cache", "none")
    ran = _cache_mode(rec)
    if req == "none":
        return ""
    return f"cache={req}" if ran == req or req.startswith("disk:") else f"cache={req}>{ran}"


def _med(rec: dict, metric: str) -> float | None:
    m = rec.get("metrics", {}).get(metric)
    return None if m is None else m["median"]


def _cost(rec: dict) -> tuple:
    s = rec["setting"]
    return (s["num_workers"], _BACKEND_COST.get(s.get("backend"), len(_BACKEND_COST)),
            _CACHE_COST.get(_cache_mode(rec), len(_CACHE_COST)), s["prefetch_factor"] or 0,
            s["pin_memory"], s["persistent_workers"], -_med(rec, "throughput_img_s"))


def _label(rec: dict) -> str:
    s = rec["setting"]
    pf = "-" if s["prefetch_factor"] is None else s["prefetch_factor"]
    cache = _cache_text(rec)
    return (f"{s['format']}/{s['decoder']} backend={s.get('backend', '-')} "
            + (f"{cache} " if cache else "") + f"workers={s['num_workers']} prefetch={pf} "
            f"pin={'on' if s['pin_memory'] else 'off'}"
            + (" persistent" if s["persistent_workers"] else ""))


def _pick(rows: list[dict], tolerance: float) -> tuple[dict, dict]:
    best = max(rows, key=lambda r: _med(r, "throughput_img_s"))
    floor = (1.0 - tolerance) * _med(best, "throughput_img_s")
    cheapest = min((r for r in rows if _med(r, "throughput_img_s") >= floor), key=_cost)
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
        was simulated), "tolerance", "threshold", "text", "per_group": [...]}``; with no measured
        row, ``{"recommended_row": None, "text": ...}``.
    """
    ok = [r for r in results if r["kind"] == "shardkit" and r["status"] == "ok"]
    if not ok:
        return {"recommended_row": None, "best_row": None, "data_bound": None,
                "tolerance": tolerance, "threshold": threshold,
                "text": "no shardkit setting was measured successfully; see the N/A and error rows"}
    best, rec = _pick(ok, tolerance)
    frac = _med(rec, "data_wait_fraction")
    thr = _med(rec, "throughput_img_s")
    text = [f"Recommended: {_label(rec)} (row {rec['id']}): {thr:.0f} img/s, "
            f"{thr / _med(best, 'throughput_img_s'):.0%} of the best ({_label(best)}, row "
            f"{best['id']}, {_med(best, 'throughput_img_s'):.0f} img/s)."]
    text += _cache_advice(rec, ok)
    if step.get("kind") == "none":
        bound = None
        text.append("No step was simulated (--step-ms / --model): this is the loader's own "
                    "throughput, so no data-bound verdict.")
    else:
        bound = frac >= threshold
        step_ms = _med(rec, "step_ms_per_batch")
        demand = (f" (the step alone would consume {rec['batch_size'] / step_ms * 1000:.0f} "
                  f"img/s)" if step_ms >= 0.01 else "")
        text.append(f"At {step_ms:.1f} ms per step the device would wait for data {frac:.0%} of "
                    f"the time{demand}: " + ("DATA-BOUND." if bound else "not data-bound."))
        if bound:
            best_frac = min(_med(r, "data_wait_fraction") for r in ok)
            text.append(f"Even the least-waiting setting waits {best_frac:.0%}: add CPU cores or "
                        f"workers, use a cheaper decoder (DCT-scaled turbojpeg) or smaller "
                        f"images, or pack to a faster format"
                        + ("" if any(_cache_mode(r) != "none" for r in ok) else
                           ", or try a decoded cache (--cache none,ram)") + "."
                        if best_frac >= threshold else
                        f"Some settings wait less ({best_frac:.0%}); prefer throughput over "
                        f"cost here.")
    groups: dict[tuple, list[dict]] = {}
    for r in ok:
        groups.setdefault((r["setting"]["data"], r["setting"]["decoder"]), []).append(r)
    per_group = []
    for (data, dec), rows in groups.items():
        b, c = _pick(rows, tolerance)
        per_group.append({"data": data, "format": c["setting"]["format"], "decoder": dec,
                          "recommended_row": c["id"], "best_row": b["id"],
                          "throughput_img_s": _med(c, "throughput_img_s"),
                          "data_wait_fraction": _med(c, "data_wait_fraction")})
    return {"recommended_row": rec["id"], "best_row": best["id"], "setting": rec["setting"],
            "throughput_img_s": thr, "best_throughput_img_s": _med(best, "throughput_img_s"),
            "data_wait_fraction": frac, "data_bound": bound, "tolerance": tolerance,
            "threshold": threshold, "text": " ".join(text), "per_group": per_group,
            "cache": rec.get("cache")}


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
        top = max(cached, key=lambda r: _med(r, "throughput_img_s"))
        return [f"The fastest cached row ({_label(top)}, row {top['id']}, "
                f"{_med(top, 'throughput_img_s'):.0f} img/s) gains less than the tolerance over "
                f"this one: not worth its memory here."]
    return []


_SHORT_BACKEND = {"thread": "thread", "process": "proc"}


def _fmt(rec: dict, metric: str, spec: str, scale: float = 1.0) -> str:
    m = rec.get("metrics", {}).get(metric)
    if m is None:
        return "-"
    return f"{m['median'] * scale:{spec}}"


def format_table(results: list[dict]) -> str:
    """A fixed-width text table: one line per row, N/A and error rows with their note.

    Columns: ``backend`` ("thread" / "proc"; the baseline is a DataLoader, "proc"), ``nw``
    workers (threads or processes), ``pf`` prefetch_factor ("-" = not passed), ``loader ms`` and
    ``step ms`` per batch, ``img/s`` (median, and min-max over repeats), ``wait`` (fraction of
    wall time waiting for data), ``cpu`` (cores), ``MiB`` (peak PSS), ``x base`` (throughput
    ratio to the ImageFolder baseline at the same setting); "-" = not measured (N/A rows).
    ``cache``: the decoded cache ("none", "ram", "disk", "auto>ram"...); a cached row gets a
    second line with the arena's size, the timed hit rate, its fill epoch and the ratios to its
    uncached twin (``x uncached``, ``fill x``).
    """
    head = (f"{'id':>3} {'kind':<8} {'format':<11} {'decoder':<14} {'backend':<7} "
            f"{'cache':<8} {'nw':>2} {'pf':>2} {'pin':<3} "
            f"{'pers':<4} {'status':<5} {'loader ms':>9} {'step ms':>8} {'img/s':>8} "
            f"{'img/s min-max':>15} {'wait':>5} {'cpu':>5} {'MiB':>6} {'x base':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        s = r["requested"] if r["status"] == "n/a" else r["setting"]
        pf = "-" if s["prefetch_factor"] is None else str(s["prefetch_factor"])
        thr = r.get("metrics", {}).get("throughput_img_s")
        digits = 0 if thr and thr["max"] >= 100 else 1
        spread = f"{thr['min']:.{digits}f}-{thr['max']:.{digits}f}" if thr else "-"
        ratio = f"{r['ratio_to_baseline']:.2f}" if r.get("ratio_to_baseline") else "-"
        dec = s["decoder"]
        if r.get("decoder_ran") and r["decoder_ran"] != dec:
            dec = f"{dec}>{r['decoder_ran']}"  # requested > what really ran
        lines.append(
            f"{r['id']:>3} {r['kind']:<8} {str(s['format'])[:11]:<11} {dec[:14]:<14} "
            f"{_SHORT_BACKEND.get(s.get('backend'), '-'):<7} {_cache_cell(r, s):<8} "
            f"{s['num_workers']:>2} {pf:>2} "
            f"{'on' if s['pin_memory'] else 'off':<3} "
            f"{'on' if s['persistent_workers'] else 'off':<4} {r['status']:<5} "
            f"{_fmt(r, 'loader_ms_per_batch', '9.1f'):>9} "
            f"{_fmt(r, 'step_ms_per_batch', '8.1f'):>8} "
            f"{_fmt(r, 'throughput_img_s', '8.1f'):>8} {spread:>15} "
            f"{_fmt(r, 'data_wait_fraction', '5.0%'):>5} {_fmt(r, 'cpu_util_cores', '5.2f'):>5} "
            f"{_fmt(r, 'memory_mb', '6.0f'):>6} {ratio:>6}")
        c = r.get("cache") or {}
        if c.get("mode", "none") != "none":
            lines.append("      cache: " + _cache_line(r, c))
        if r["note"]:
            lines.append(f"      note: {r['note']}")
    return "\n".join(lines)


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
    if c.get("disabled"):
        parts.append(f"disabled: {c['disabled']}")
    return "; ".join(parts)


def _lines(results: list[dict]) -> dict[str, list[tuple[int, dict]]]:
    """Plot series: one per (kind, data, decoder, backend, cache, prefetch, pin, persistent),
    x = num_workers.

    The num_workers=0 point (measured once, without prefetch or persistent workers, and for the
    process backend as the thread row: the same work) joins every series of the same kind, data,
    decoder, backend, cache and pin; N/A rows that only copy another pin setting (no CUDA) or the
    thread backend without persistent workers (it has none) are left out.
    """
    by_id = {r["id"]: r for r in results}
    series: dict[tuple, dict[int, dict]] = {}
    zero: dict[tuple, dict] = {}
    for r in results:
        src = by_id.get(r["same_as"]) if r["status"] == "n/a" else r
        if src is None or src["status"] != "ok":
            continue
        q = r["requested"] if r is not src else r["setting"]
        if r is not src and q["pin_memory"] != src["setting"]["pin_memory"]:
            continue  # pin_memory N/A (no CUDA): a copy of the pin-off line would mislead
        if (r is not src and q["num_workers"] != 0
                and q["persistent_workers"] != src["setting"]["persistent_workers"]):
            continue  # persistent N/A (thread backend): a copy of the other line would mislead
        base = (r["kind"], q["data"], q["format"], q["decoder"], q.get("backend"),
                q.get("cache", "none"), q["pin_memory"])
        if q["num_workers"] == 0:
            zero[base] = src
            continue
        series.setdefault((*base, q["prefetch_factor"], q["persistent_workers"]),
                          {})[q["num_workers"]] = src
    for base, src in zero.items():
        keys = [k for k in series if k[:7] == base] or [(*base, None, False)]
        for k in keys:
            series.setdefault(k, {})[0] = src
    out = {}
    for (kind, _data, fmt, dec, backend, cache, pin, pf, pers), points in series.items():
        name = (f"{'baseline ' if kind == 'baseline' else ''}{fmt}/{dec} "
                + (f"{backend} " if kind != "baseline" and backend else "")
                + (f"cache={'disk' if cache.startswith('disk:') else cache} "
                   if kind != "baseline" and cache != "none" else "") +
                f"pf={'-' if pf is None else pf} pin={'on' if pin else 'off'}"
                + (" pers" if pers else ""))
        out[name] = sorted(points.items())
    return out


def _figure(figsize: tuple[float, float]):
    """A Figure with the Agg canvas: no pyplot, so no process-wide backend switch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


#: (metric, file name, y label) of the per-num_workers plots.
_SERIES_PLOTS = (
    ("throughput_img_s", "throughput_vs_workers.png", "throughput (images/s)"),
    ("data_wait_fraction", "data_wait_vs_workers.png", "data-wait fraction of wall time"))


def plot_series(results: list[dict], metric: str, ylabel: str = ""):
    """``metric``'s median (error bars: min..max over repeats) against num_workers, one line per
    :func:`_lines` series (baseline lines dashed). The y axis starts at 0 (throughput and wait
    fraction are never negative; a cut axis exaggerates differences); the wait fraction's ends at
    1.05. Returns a ``matplotlib.figure.Figure``, or None when no row was measured."""
    series = _lines(results)
    if not series:
        return None
    fig, ax = _figure((8, 5))
    for name, points in series.items():
        xs = [x for x, _ in points]
        med = [r["metrics"][metric]["median"] for _, r in points]
        lo = [m - r["metrics"][metric]["min"] for m, (_, r) in zip(med, points)]
        hi = [r["metrics"][metric]["max"] - m for m, (_, r) in zip(med, points)]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=name,
                    linestyle="--" if name.startswith("baseline") else "-")
    ax.set_xlabel("num_workers")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel(ylabel or metric)
    if metric == "data_wait_fraction":
        ax.set_ylim(0, 1.05)
    else:
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _bar_label(rec: dict, qualify: bool) -> str:
    """``"thread w2 pf2 pin (#3)"``: backend, decoded cache when there is one
    (``cache=ram``), num_workers, prefetch_factor (left out when not
    passed), pin_memory and persistent workers when on, the row id; ``format/decoder`` first
    when ``qualify``; ImageFolder baseline rows (a DataLoader) start with "baseline"."""
    s = rec["setting"]
    parts = ["baseline"] if rec["kind"] == "baseline" else (
        ([f"{s['format']}/{s['decoder']}"] if qualify else []) + [s.get("backend") or "-"]
        + ([_cache_text(rec)] if _cache_text(rec) else []))
    parts.append(f"w{s['num_workers']}")
    if s["prefetch_factor"] is not None:
        parts.append(f"pf{s['prefetch_factor']}")
    parts += (["pin"] if s["pin_memory"] else []) + (["pers"] if s["persistent_workers"] else [])
    return f"{' '.join(parts)} (#{rec['id']})"


#: Step medians within this fraction of their median are drawn as one line, else per bar.
_STEP_SPREAD = 0.10
#: Below this many ms per batch no step was simulated (``NoStep``): no line, no verdict.
_NO_STEP_MS = 0.01
_BOUND_COLOR, _OK_COLOR, _STEP_COLOR = "tab:red", "tab:blue", "black"


def plot_loader_vs_step(results: list[dict], threshold: float = 0.10):
    """Horizontal bars, one per measured row (top to bottom in row order), labelled with its
    setting (:func:`_bar_label`): the median loader wait in ms per batch, red when the row is
    data-bound (median ``data_wait_fraction`` >= ``threshold``, the rule of :func:`recommend`),
    blue otherwise. The model step time (ms per batch) is one vertical line at the median of the
    rows' step medians when they all lie within 10% of it, else a black marker on each bar; a
    bar reaching past it waits longer for data than the step computes. With no step simulated
    (every step median < 0.01 ms) there is no line and no colour verdict. The x axis starts
    at 0.

    Returns:
        a ``matplotlib.figure.Figure``, or None when no row was measured.
    """
    import statistics

    from matplotlib.patches import Patch

    ok = [r for r in results if r["status"] == "ok"]
    if not ok:
        return None
    qualify = len({(r["setting"]["format"], r["setting"]["decoder"]) for r in ok
                   if r["kind"] == "shardkit"}) > 1
    labels = [_bar_label(r, qualify) for r in ok]
    wait = [_med(r, "loader_ms_per_batch") for r in ok]
    step = [_med(r, "step_ms_per_batch") for r in ok]
    frac = [_med(r, "data_wait_fraction") for r in ok]
    has_step = max(step) >= _NO_STEP_MS
    colors = [_BOUND_COLOR if has_step and f >= threshold else _OK_COLOR for f in frac]
    fig, ax = _figure((9, max(3.0, 0.32 * len(ok) + 1.8)))
    ys = list(range(len(ok)))
    ax.barh(ys, wait, height=0.6, color=colors)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()  # row order top to bottom, as in the table
    handles = []
    if has_step:
        handles += [Patch(color=_BOUND_COLOR, label=f"data-bound: waits for data >= "
                          f"{threshold:.0%} of wall time"),
                    Patch(color=_OK_COLOR, label=f"keeps up: waits < {threshold:.0%}")]
        mid = statistics.median(step)
        if max(step) - min(step) <= _STEP_SPREAD * mid:
            handles.append(ax.axvline(mid, color=_STEP_COLOR, linestyle="--",
                                      label=f"model step {mid:.1f} ms/batch (median)"))
        else:
            handles += ax.plot(step, ys, linestyle="none", marker="|", markersize=14,
                               markeredgewidth=2.5, color=_STEP_COLOR,
                               label="model step ms/batch (this row)")
        title = ("Loader wait vs model step per batch: a red bar is data-bound (the device "
                 f"waits for data >= {threshold:.0%} of the time);\na bar past the step "
                 "waits longer for data than the step computes")
    else:
        handles.append(Patch(color=_OK_COLOR, label="loader wait ms/batch"))
        title = ("Loader wait per batch (no step simulated: pass --step-ms or --model for "
                 "a data-bound verdict)")
    ax.set_xlim(left=0)
    ax.set_xlabel("ms per batch (median over repeats)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def write_plots(results: list[dict], out_dir: str | os.PathLike, *,
                threshold: float = 0.10) -> list[str]:
    """Writes ``throughput_vs_workers.png``, ``data_wait_vs_workers.png``
    (:func:`plot_series`) and ``loader_vs_step.png`` (:func:`plot_loader_vs_step`, data-bound
    from ``threshold``) into ``out_dir`` at 100 dpi; returns their file names (empty with
    nothing measured)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not _lines(results):
        return []
    figs = [(fname, plot_series(results, metric, ylabel))
            for metric, fname, ylabel in _SERIES_PLOTS]
    figs.append(("loader_vs_step.png", plot_loader_vs_step(results, threshold)))
    written = []
    for fname, fig in figs:
        if fig is not None:
            fig.savefig(out_dir / fname, dpi=100)
            written.append(fname)
    return written


def write_json(path: str | os.PathLike, payload: dict) -> None:
    """Writes ``payload`` (plus ``schema_version``) as indented JSON via a temp file + rename."""
    from shardkit.manifest import atomic_write_bytes

    text = json.dumps({"schema_version": SCHEMA_VERSION, **payload}, indent=2, default=str)
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))
