"""Turns measured rows into the terminal table, the recommendation, the plots and ``bench.json``.

Recommendation rule: among measured shardkit rows, the cheapest setting whose median throughput
(images/s) is within ``tolerance`` (default 5%) of the best one, cheapest meaning fewest workers,
then the thread backend before the process backend (no worker processes, no per-batch
inter-process copy), then lowest prefetch_factor, then pin_memory off, then persistent_workers
off. The run is data-bound at the given step time when that setting's median
``data_wait_fraction`` (loader wait / wall time) >= ``threshold``.

``bench.json`` schema 2: every row's ``requested`` and ``setting`` carry ``backend`` ("thread" |
"process"; the ImageFolder baseline is a DataLoader, "process"); ``config.backends`` lists the
backends run. Schema 1 had no backend (everything ran as "process").
"""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["recommend", "format_table", "write_plots", "write_json", "SCHEMA_VERSION"]

SCHEMA_VERSION = 2

#: Cheapest first, for the recommendation (unknown / missing backend: last).
_BACKEND_COST = {"thread": 0, "process": 1}


def _med(rec: dict, metric: str) -> float | None:
    m = rec.get("metrics", {}).get(metric)
    return None if m is None else m["median"]


def _cost(rec: dict) -> tuple:
    s = rec["setting"]
    return (s["num_workers"], _BACKEND_COST.get(s.get("backend"), len(_BACKEND_COST)),
            s["prefetch_factor"] or 0, s["pin_memory"], s["persistent_workers"],
            -_med(rec, "throughput_img_s"))


def _label(rec: dict) -> str:
    s = rec["setting"]
    pf = "-" if s["prefetch_factor"] is None else s["prefetch_factor"]
    return (f"{s['format']}/{s['decoder']} backend={s.get('backend', '-')} "
            f"workers={s['num_workers']} prefetch={pf} "
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
                        f"images, or pack to a faster format." if best_frac >= threshold else
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
            "threshold": threshold, "text": " ".join(text), "per_group": per_group}


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
    """
    head = (f"{'id':>3} {'kind':<8} {'format':<11} {'decoder':<14} {'backend':<7} {'nw':>2} "
            f"{'pf':>2} {'pin':<3} "
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
            f"{_SHORT_BACKEND.get(s.get('backend'), '-'):<7} {s['num_workers']:>2} {pf:>2} "
            f"{'on' if s['pin_memory'] else 'off':<3} "
            f"{'on' if s['persistent_workers'] else 'off':<4} {r['status']:<5} "
            f"{_fmt(r, 'loader_ms_per_batch', '9.1f'):>9} {_fmt(r, 'step_ms_per_batch', '8.1f'):>8} "
            f"{_fmt(r, 'throughput_img_s', '8.1f'):>8} {spread:>15} "
            f"{_fmt(r, 'data_wait_fraction', '5.0%'):>5} {_fmt(r, 'cpu_util_cores', '5.2f'):>5} "
            f"{_fmt(r, 'memory_mb', '6.0f'):>6} {ratio:>6}")
        if r["note"]:
            lines.append(f"      note: {r['note']}")
    return "\n".join(lines)


def _lines(results: list[dict]) -> dict[str, list[tuple[int, dict]]]:
    """Plot series: one per (kind, data, decoder, backend, prefetch, pin, persistent),
    x = num_workers.

    The num_workers=0 point (measured once, without prefetch or persistent workers, and for the
    process backend as the thread row: the same work) joins every series of the same kind, data,
    decoder, backend and pin; N/A rows that only copy another pin setting (no CUDA) or the
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
                q["pin_memory"])
        if q["num_workers"] == 0:
            zero[base] = src
            continue
        series.setdefault((*base, q["prefetch_factor"], q["persistent_workers"]),
                          {})[q["num_workers"]] = src
    for base, src in zero.items():
        keys = [k for k in series if k[:6] == base] or [(*base, None, False)]
        for k in keys:
            series.setdefault(k, {})[0] = src
    out = {}
    for (kind, _data, fmt, dec, backend, pin, pf, pers), points in series.items():
        name = (f"{'baseline ' if kind == 'baseline' else ''}{fmt}/{dec} "
                + (f"{backend} " if kind != "baseline" and backend else "") +
                f"pf={'-' if pf is None else pf} pin={'on' if pin else 'off'}"
                + (" pers" if pers else ""))
        out[name] = sorted(points.items())
    return out


def write_plots(results: list[dict], out_dir: str | os.PathLike) -> list[str]:
    """Writes ``throughput_vs_workers.png``, ``data_wait_vs_workers.png`` and
    ``loader_vs_step.png`` into ``out_dir``; returns their file names (empty with nothing measured).

    One series per format/decoder/backend/prefetch/pin/persistent setting (x = num_workers);
    error bars are the min..max over repeats; baseline series are dashed.
    """
    # Figure + the Agg canvas: no pyplot, so no process-wide backend switch (matplotlib.use)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def subplots(figsize):
        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        return fig, fig.add_subplot()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    series = _lines(results)
    if not series:
        return []
    written = []
    for metric, fname, ylabel in (
            ("throughput_img_s", "throughput_vs_workers.png", "throughput (images/s)"),
            ("data_wait_fraction", "data_wait_vs_workers.png", "data-wait fraction of wall time")):
        fig, ax = subplots((8, 5))
        for name, points in series.items():
            xs = [x for x, _ in points]
            med = [r["metrics"][metric]["median"] for _, r in points]
            lo = [m - r["metrics"][metric]["min"] for m, (_, r) in zip(med, points)]
            hi = [r["metrics"][metric]["max"] - m for m, (_, r) in zip(med, points)]
            ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=name,
                        linestyle="--" if name.startswith("baseline") else "-")
        ax.set_xlabel("num_workers")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel(ylabel)
        if metric == "data_wait_fraction":
            ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=100)
        written.append(fname)
    ok = [r for r in results if r["status"] == "ok"]
    fig, ax = subplots((max(6, 0.5 * len(ok) + 2), 5))
    xs = range(len(ok))
    ax.bar([x - 0.2 for x in xs], [r["metrics"]["loader_ms_per_batch"]["median"] for r in ok],
           width=0.4, label="loader wait (ms/batch)")
    ax.bar([x + 0.2 for x in xs], [r["metrics"]["step_ms_per_batch"]["median"] for r in ok],
           width=0.4, label="step (ms/batch)")
    ax.set_xticks(list(xs), [f"{r['id']}" for r in ok])
    ax.set_xlabel("row id (see bench.json / table)")
    ax.set_ylabel("ms per batch (median over repeats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "loader_vs_step.png", dpi=100)
    written.append("loader_vs_step.png")
    return written


def write_json(path: str | os.PathLike, payload: dict) -> None:
    """Writes ``payload`` (plus ``schema_version``) as indented JSON via a temp file + rename."""
    from shardkit.manifest import atomic_write_bytes

    text = json.dumps({"schema_version": SCHEMA_VERSION, **payload}, indent=2, default=str)
    atomic_write_bytes(path, (text + "\n").encode("utf-8"))
