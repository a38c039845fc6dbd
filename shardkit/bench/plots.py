"""The PNG plots of ``shardkit bench``: throughput and data wait against num_workers (one line
per setting, :func:`plot_series`) and each row's loader wait against the model step
(:func:`plot_loader_vs_step`); :func:`write_plots` writes all three. Matplotlib's Agg canvas is
used directly (no pyplot, no process-wide backend switch).
"""
from __future__ import annotations

import os
from pathlib import Path

from shardkit.bench.augment import augment_label
from shardkit.bench.report import cache_text, median_of

__all__ = ["plot_series", "plot_loader_vs_step", "write_plots", "series_colors", "step_caption",
           "NO_STEP_TEXT"]


def _lines(results: list[dict]) -> dict[str, list[tuple[int, dict]]]:
    """Plot series: one per (kind, data, decoder, backend, cache, augment, prefetch, pin,
    persistent), x = num_workers.

    The num_workers=0 point (measured once, without prefetch or persistent workers, and for the
    process backend as the thread row: the same work) joins every series of the same kind, data,
    decoder, backend, cache, augment and pin; N/A rows that only copy another pin setting (no
    CUDA) or the thread backend without persistent workers (it has none) are left out.
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
                q.get("cache", "none"), q.get("augment", "none"), q["pin_memory"])
        if q["num_workers"] == 0:
            zero[base] = src
            continue
        series.setdefault((*base, q["prefetch_factor"], q["persistent_workers"]),
                          {})[q["num_workers"]] = src
    for base, src in zero.items():
        keys = [k for k in series if k[:len(base)] == base] or [(*base, None, False)]
        for k in keys:
            series.setdefault(k, {})[0] = src
    out = {}
    for (kind, _data, fmt, dec, backend, cache, aug, pin, pf, pers), points in series.items():
        name = (f"{'baseline ' if kind == 'baseline' else ''}{fmt}/{dec} "
                + (f"{backend} " if kind != "baseline" and backend else "")
                + (f"cache={'disk' if cache.startswith('disk:') else cache} "
                   if kind != "baseline" and cache != "none" else "")
                + (f"aug={augment_label(aug)} " if aug != "none" else "") +
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
#: Below this many ms per batch no step was simulated (``NoStep``): no line, no verdict.
_NO_STEP_MS = 0.01
NO_STEP_TEXT = "no step simulated (neither --step-ms nor --model given)"


def series_colors(n: int) -> list[tuple[float, float, float, float]]:
    """``n`` distinct RGBA colours: matplotlib's ``tab10`` up to 10, ``tab20`` up to 20, else
    ``n`` evenly spaced samples of ``turbo`` (the default colour cycle repeats after 10)."""
    from matplotlib import colormaps

    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["turbo"](i / (n - 1)) for i in range(n)]


def step_caption(results: list[dict], step: dict | None = None) -> str:
    """What the bench's step was, for a plot title: ``"step: sleep 100 ms per batch
    (--step-ms)"``, ``"step: hrnet_w18_small on cpu, 412.3 ms per batch (measured median)"``,
    or :data:`NO_STEP_TEXT`. ``step`` is the step's ``info()`` (``bench.json``'s ``"step"``);
    without it the rows' measured ``step_ms_per_batch`` medians decide (all < 0.01 ms: no
    step)."""
    measured = [m for r in results if r["status"] == "ok"
                if (m := median_of(r, "step_ms_per_batch")) is not None]
    mid = sorted(measured)[len(measured) // 2] if measured else 0.0
    kind = (step or {}).get("kind")
    if kind == "none" or (kind is None and mid < _NO_STEP_MS):
        return NO_STEP_TEXT
    if kind == "sleep":
        return f"step: sleep {step['step_ms']:g} ms per batch (--step-ms)"
    if kind == "model":
        return (f"step: {step['model']} on {step.get('device', '?')}, {mid:.1f} ms per batch "
                f"(measured median)")
    return f"step: {mid:.1f} ms per batch (measured median)"


def _worker_axis(ax, xs: list[int]) -> None:
    """num_workers axis: a tick at each measured value, the limits half a step past the ends
    (matplotlib alone gives 1.9..2.1 when every series has the one x)."""
    lo, hi = min(xs), max(xs)
    pad = max(0.5, 0.04 * (hi - lo))
    ax.set_xticks(sorted(set(xs)))
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_xlabel("num_workers")


def _legend_outside(ax, handles=None) -> None:
    """The legend right of the axes, top-aligned: it can never cover a point or a bar."""
    kw = {"handles": handles} if handles is not None else {}
    ax.legend(**kw, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def plot_series(results: list[dict], metric: str, ylabel: str = "", *,
                step: dict | None = None):
    """``metric``'s median (error bars: min..max over repeats) against num_workers, one line per
    :func:`_lines` series, each in its own colour (:func:`series_colors`; baseline lines
    dashed); the legend outside the axes, right of them. The x axis spans the measured
    num_workers (a tick at each, half a step of margin); the y axis starts at 0 (throughput and
    wait fraction are never negative; a cut axis exaggerates differences), the wait fraction's
    ends at 1.05. The title names the metric and the step (:func:`step_caption`; ``step`` is
    the step's ``info()``); the wait fraction without a step says that every point is 1.0 by
    definition. Returns a ``matplotlib.figure.Figure``, or None when no row was measured."""
    series = _lines(results)
    if not series:
        return None
    fig, ax = _figure((10, 5))
    xs_all = []
    for (name, points), color in zip(series.items(), series_colors(len(series))):
        xs = [x for x, _ in points]
        xs_all += xs
        med = [r["metrics"][metric]["median"] for _, r in points]
        lo = [m - r["metrics"][metric]["min"] for m, (_, r) in zip(med, points)]
        hi = [r["metrics"][metric]["max"] - m for m, (_, r) in zip(med, points)]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=name, color=color,
                    linestyle="--" if name.startswith("baseline") else "-")
    _worker_axis(ax, xs_all)
    ax.set_ylabel(ylabel or metric)
    caption = step_caption(results, step)
    title = f"{ylabel or metric} vs num_workers\n{caption}"
    if metric == "data_wait_fraction":
        ax.set_ylim(0, 1.05)
        if caption == NO_STEP_TEXT:
            title += (":\nthe loader alone was timed, so every point is 1.0 by definition; "
                      "pass --step-ms or --model")
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    fig.tight_layout()
    return fig


def _bar_label(rec: dict, qualify: bool) -> str:
    """``"thread w2 pf2 pin (#3)"``: backend, decoded cache when there is one
    (``cache=ram``), augment spec when not none (``aug=standard``), num_workers, prefetch_factor
    (left out when not
    passed), pin_memory and persistent workers when on, the row id; ``format/decoder`` first
    when ``qualify``; ImageFolder baseline rows (a DataLoader) start with "baseline"."""
    s = rec["setting"]
    parts = ["baseline"] if rec["kind"] == "baseline" else (
        ([f"{s['format']}/{s['decoder']}"] if qualify else []) + [s.get("backend") or "-"]
        + ([cache_text(rec)] if cache_text(rec) else []))
    if s.get("augment", "none") != "none":
        parts.append(f"aug={augment_label(s['augment'])}")
    parts.append(f"w{s['num_workers']}")
    if s["prefetch_factor"] is not None:
        parts.append(f"pf{s['prefetch_factor']}")
    parts += (["pin"] if s["pin_memory"] else []) + (["pers"] if s["persistent_workers"] else [])
    return f"{' '.join(parts)} (#{rec['id']})"


#: Step medians within this fraction of their median are drawn as one line, else per bar.
_STEP_SPREAD = 0.10
_BOUND_COLOR, _OK_COLOR, _STEP_COLOR = "tab:red", "tab:blue", "black"


def plot_loader_vs_step(results: list[dict], threshold: float = 0.10, *,
                        step: dict | None = None):
    """Horizontal bars, one per measured row (top to bottom in row order), labelled with its
    setting (:func:`_bar_label`): the median loader wait in ms per batch, red when the row is
    data-bound (median ``data_wait_fraction`` >= ``threshold``, the rule of :func:`recommend`),
    blue otherwise. The model step time (ms per batch) is one vertical line at the median of the
    rows' step medians when they all lie within 10% of it, else a black marker on each bar; a
    bar reaching past it waits longer for data than the step computes. With no step simulated
    (every step median < 0.01 ms) there is no line and no colour verdict. The x axis starts
    at 0; the legend is outside the axes, right of them; the title's last line is
    :func:`step_caption` (``step``: the step's ``info()``).

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
    wait = [median_of(r, "loader_ms_per_batch") for r in ok]
    steps = [median_of(r, "step_ms_per_batch") for r in ok]
    frac = [median_of(r, "data_wait_fraction") for r in ok]
    has_step = max(steps) >= _NO_STEP_MS
    colors = [_BOUND_COLOR if has_step and f >= threshold else _OK_COLOR for f in frac]
    fig, ax = _figure((11, max(3.2, 0.32 * len(ok) + 2.0)))
    ys = list(range(len(ok)))
    ax.barh(ys, wait, height=0.6, color=colors)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()  # row order top to bottom, as in the table
    handles = []
    if has_step:
        handles += [Patch(color=_BOUND_COLOR, label=f"data-bound: waits for data >= "
                          f"{threshold:.0%} of wall time"),
                    Patch(color=_OK_COLOR, label=f"keeps up: waits < {threshold:.0%}")]
        mid = statistics.median(steps)
        if max(steps) - min(steps) <= _STEP_SPREAD * mid:
            handles.append(ax.axvline(mid, color=_STEP_COLOR, linestyle="--",
                                      label=f"model step {mid:.1f} ms/batch (median)"))
        else:
            handles += ax.plot(steps, ys, linestyle="none", marker="|", markersize=14,
                               markeredgewidth=2.5, color=_STEP_COLOR,
                               label="model step ms/batch (this row)")
        title = ("Loader wait vs model step per batch: a red bar is data-bound (the device "
                 f"waits for data >= {threshold:.0%} of the time);\na bar past the step "
                 "waits longer for data than the step computes\n" + step_caption(results, step))
    else:
        handles.append(Patch(color=_OK_COLOR, label="loader wait ms/batch"))
        title = (f"Loader wait per batch\n{NO_STEP_TEXT}: pass --step-ms or --model for a "
                 "data-bound verdict")
    ax.set_xlim(left=0)
    ax.set_xlabel("ms per batch (median over repeats)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    _legend_outside(ax, handles)
    fig.tight_layout()
    return fig


def write_plots(results: list[dict], out_dir: str | os.PathLike, *,
                threshold: float = 0.10, step: dict | None = None) -> list[str]:
    """Writes ``throughput_vs_workers.png``, ``data_wait_vs_workers.png``
    (:func:`plot_series`) and ``loader_vs_step.png`` (:func:`plot_loader_vs_step`, data-bound
    from ``threshold``) into ``out_dir`` at 100 dpi; ``step`` (the step's ``info()``) goes into
    their titles. Returns their file names (empty with nothing measured)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not _lines(results):
        return []
    figs = [(fname, plot_series(results, metric, ylabel, step=step))
            for metric, fname, ylabel in _SERIES_PLOTS]
    figs.append(("loader_vs_step.png", plot_loader_vs_step(results, threshold, step=step)))
    written = []
    for fname, fig in figs:
        if fig is not None:
            fig.savefig(out_dir / fname, dpi=100)
            written.append(fname)
    return written
