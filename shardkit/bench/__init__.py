"""``shardkit bench``: is training data-bound, and which loader setting to use.

The harness times any iterable of batches (:func:`time_batches`, :func:`measure`) against a step
(:class:`NoStep`, :class:`SleepStep`, :class:`ModelStep`); :func:`expand_grid` turns the requested
sweep into rows, marking settings that do not apply as N/A (case 20); :func:`collect_environment`
records what really ran; :func:`run_bench` is the CLI's whole run.
"""
from __future__ import annotations

from shardkit.bench.env import collect_environment, describe_pil, pil_mismatches
from shardkit.bench.grid import GridRow, Setting, expand_grid
from shardkit.bench.harness import RunResult, measure, summarize, time_batches
from shardkit.bench.monitor import ProcessMonitor
from shardkit.bench.plots import write_plots
from shardkit.bench.report import format_table, recommend
from shardkit.bench.steps import ModelStep, NoStep, SleepStep, Step
from shardkit.errors import BenchError

__all__ = ["collect_environment", "describe_pil", "pil_mismatches", "GridRow", "Setting",
           "expand_grid", "BenchError", "RunResult", "measure", "summarize", "time_batches",
           "ProcessMonitor", "format_table", "recommend", "write_plots", "ModelStep", "NoStep",
           "SleepStep", "Step", "run_bench"]


def __getattr__(name: str):
    if name == "run_bench":  # imports click and the CLI only when asked
        from shardkit.bench.cli import run_bench
        return run_bench
    raise AttributeError(f"module 'shardkit.bench' has no attribute {name!r}")
