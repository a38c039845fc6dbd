"""The data doctor: ``shardkit inspect``, ``shardkit check`` and ``shardkit stats``.

Python API (each reads a packed dataset ``OUT`` through the contracts of docs/DESIGN.md):

- :func:`inspect_dataset` - per-split class counts, class-imbalance ratio, groups, shard sizes, and
  PNG grids of decoded samples and of the same samples after the train transform;
- :func:`check_dataset` - leakage between splits (shared groups, identical bytes, pHash
  near-duplicates), missing classes, extreme imbalance, and train/eval transform drift;
- :func:`compute_stats` - exact per-channel mean/std of a split's decoded pixels (0-1, RGB),
  saved under ``manifest["stats"][split]``.

The work is done in ``doctor_io`` (reading), ``doctor_leaks`` and ``doctor_check`` (check),
``doctor_transforms`` (drift), ``doctor_inspect`` and ``doctor_stats``; this module holds the
click commands.

Exit codes of the commands: 0 = fine; 1 = ``check`` found a leak or drift (or, with
``--strict``, any warning); 2 = the dataset or an option could not be used (message on stderr).
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from shardkit.doctor_check import check_dataset, format_check_report, write_json_report
from shardkit.doctor_inspect import format_summary, inspect_dataset
from shardkit.doctor_stats import compute_stats
from shardkit.errors import ShardkitError

__all__ = ["inspect_dataset", "check_dataset", "compute_stats", "inspect_command",
           "check_command", "stats_command"]


class DoctorError(click.ClickException):
    """A shardkit error raised while running a doctor command (exit code 2)."""

    exit_code = 2


def _run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except ShardkitError as exc:
        raise DoctorError(f"{type(exc).__name__}: {exc}") from exc


def _load_transform_config(path: str | None):
    if path is None:
        return None
    from shardkit.doctor_transforms import load_transform_config

    return _run(load_transform_config, path)


_OUT = click.argument("out", type=click.Path(exists=True, file_okay=False, path_type=Path))
_DECODER = click.option("--decoder", default="auto", show_default=True,
                        help="Decoder registry name (shardkit.decode).")
_TCFG = click.option("--transform-config", type=click.Path(exists=True, dir_okay=False),
                     default=None, help="YAML file with TransformConfig fields (or a train "
                     "config.yaml with a 'transform' section); default: the one recorded in the "
                     "manifest, else TransformConfig().")


@click.command("inspect")
@_OUT
@click.option("--split", default=None, help="Only this split (default: all).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the PNG grids (default: ./inspect-<OUT folder name> in the "
              "current directory; never inside OUT, which stays immutable).")
@click.option("--n", "n", type=click.IntRange(min=1), default=16, show_default=True,
              help="Samples per grid (every class shown in turn).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the summary as JSON.")
@_DECODER
@_TCFG
def inspect_command(out, split, out_dir, n, seed, json_path, decoder, transform_config):
    """Counts per class and split, imbalance, groups, shard sizes and sample grids of OUT."""
    report = _run(inspect_dataset, out, split, out_dir=out_dir, n=n, seed=seed, decoder=decoder,
                  transform_config=_load_transform_config(transform_config))
    click.echo(format_summary(report))
    if json_path is not None:
        write_json_report(report, json_path)
        click.echo(f"wrote {json_path}")


@click.command("check")
@_OUT
@click.option("--strict", is_flag=True, help="Fail on warnings too (near-duplicates, missing "
              "classes, imbalance).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full report as JSON.")
@click.option("--phash-threshold", type=click.IntRange(0, 64), default=None,
              help="Max pHash Hamming distance of a near-duplicate pair (default 4).")
@click.option("--imbalance-threshold", type=click.FloatRange(min=1.0), default=None,
              help="Max/min class-count ratio flagged as extreme (default 10).")
@click.option("--no-near-duplicates", is_flag=True,
              help="Skip the pHash search (it decodes every sample); reported as not run.")
@click.option("--no-transforms", is_flag=True,
              help="Skip the transform drift check; reported as not run.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--progress/--no-progress", default=False, show_default=True)
@_DECODER
@_TCFG
def check_command(out, strict, json_path, phash_threshold, imbalance_threshold, no_near_duplicates,
                  no_transforms, seed, progress, decoder, transform_config):
    """Check OUT's splits for leakage and its transforms for drift; exit 1 on a leak.

    The last line is the verdict: FAILED (exit 1) on shared groups, identical bytes or transform
    drift; "OK: no leak found" only when nothing was flagged; otherwise "NO EXACT LEAK ..." with
    the warnings to review (near-duplicate pairs, missing classes, imbalance), exit 0 unless
    --strict.
    """
    report = _run(check_dataset, out, strict=strict, near_duplicates=not no_near_duplicates,
                  phash_threshold=phash_threshold, imbalance_threshold=imbalance_threshold,
                  transforms=not no_transforms,
                  transform_config=_load_transform_config(transform_config), decoder=decoder,
                  seed=seed, progress=progress)
    click.echo(format_check_report(report))
    if json_path is not None:
        write_json_report(report, json_path)
        click.echo(f"wrote {json_path}")
    if not report["ok"]:
        raise SystemExit(1)


@click.command("stats")
@_OUT
@click.option("--split", default="train", show_default=True)
@click.option("--max-samples", type=click.IntRange(min=1), default=None,
              help="Use only the first N samples of the split (pack-time shuffled order).")
@click.option("--save/--no-save", default=True, show_default=True,
              help="Store the result in manifest.json under stats/<split>.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@_DECODER
def stats_command(out, split, max_samples, save, progress, decoder):
    """Per-channel mean/std (0-1, RGB) of a split's decoded pixels, saved in the manifest."""
    result = _run(compute_stats, out, split, max_samples=max_samples, decoder=decoder, save=save,
                  progress=progress)
    click.echo(f"{split}: {result['num_samples']} samples")
    click.echo("mean (R, G, B): " + ", ".join(f"{v:.6f}" for v in result["mean"]))
    click.echo("std  (R, G, B): " + ", ".join(f"{v:.6f}" for v in result["std"]))
    if save:
        click.echo(f"saved to {Path(out) / 'manifest.json'} under stats/{split}")
    click.echo(json.dumps(result))
