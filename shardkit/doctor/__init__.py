"""The data doctor: ``shardkit inspect``, ``shardkit check`` and ``shardkit stats``.

Python API (each reads a packed dataset ``OUT`` through the contracts of docs/DESIGN.md):

- :func:`inspect_dataset` - per-split class counts, class-imbalance ratio, groups, shard sizes, and
  PNG grids of decoded samples and of the same samples after the train transform
  (``inspect --augment SPEC``: a per-class grid of the augmentation at the schedule's first and
  last strength);
- :func:`check_dataset` - leakage between splits (shared groups, identical bytes, pHash
  near-duplicates), missing classes, extreme imbalance, train/eval transform drift, and
  (``augment=``) hue jitter on classes told apart by hue;
- :func:`compute_stats` - exact per-channel mean/std of a split's decoded pixels (0-1, RGB) and
  the per-class mean hue, saved under ``manifest["stats"][split]``.

One module per concern: :mod:`~shardkit.doctor.reading` (manifest, split rows, sample bytes),
:mod:`~shardkit.doctor.leaks`, :mod:`~shardkit.doctor.shards` and :mod:`~shardkit.doctor.check`
(``check``), :mod:`~shardkit.doctor.drift` (transform drift), :mod:`~shardkit.doctor.inspection`
(``inspect``), :mod:`~shardkit.doctor.stats` (``stats``) and :mod:`~shardkit.doctor.cli` (the
click commands and their exit codes). Notes go to the ``shardkit.doctor`` logger; nothing is
printed by the library functions.
"""
from __future__ import annotations

from shardkit.doctor.check import check_dataset, format_check_report, write_json_report
from shardkit.doctor.drift import check_transform_drift, load_transform_config
from shardkit.doctor.inspection import format_summary, inspect_dataset
from shardkit.doctor.stats import ChannelMoments, compute_stats

__all__ = ["inspect_dataset", "format_summary", "check_dataset", "format_check_report",
           "write_json_report", "check_transform_drift", "load_transform_config", "compute_stats",
           "ChannelMoments", "inspect_command", "check_command", "stats_command"]

_COMMANDS = ("inspect_command", "check_command", "stats_command")


def __getattr__(name: str):
    if name in _COMMANDS:  # imports click and the CLI only when asked
        from shardkit.doctor import cli

        return getattr(cli, name)
    raise AttributeError(f"module 'shardkit.doctor' has no attribute {name!r}")
