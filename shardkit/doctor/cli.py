"""The click commands of the data doctor: ``shardkit inspect``, ``check`` and ``stats``.

Exit codes, shared with ``shardkit verify`` (the convention of ``diff`` and ``grep``: 1 is a
verdict, 2 is trouble):

- 0: fine;
- 1: the command ran and its verdict is negative: ``check`` found a leak or drift (or, with
  ``--strict``, any warning); ``verify`` found damage (one ``FAIL`` line per problem on stdout);
- 2: the command could not run: a bad option, or a dataset that cannot be read (no
  ``manifest.json``, a manifest that is not a JSON object, a truncated ``splits/<split>.jsonl``, a
  deleted, truncated or unreadable shard: ``check`` gives no leak verdict on data it cannot see,
  and damage is ``verify``'s verdict), or a store that cannot be reached (no credentials, an
  unreachable endpoint, access denied). One line on stderr, ``Error: <ErrorType>: <message>``,
  where ``<ErrorType>`` is the :mod:`shardkit.errors` class (``ManifestError``,
  ``ShardCorruptError``, ``ConfigError``, ...) and the message names the file, or for a store's
  error ``Error: <URL>: <StoreErrorType>: <the store's message>``
  (:mod:`shardkit.cli_common`); never a traceback.

Progress bars (tqdm, on stderr) are on by default when stderr is a terminal and off otherwise
(pipes, CI logs); ``--progress`` / ``--no-progress`` force them.
"""
from __future__ import annotations

import os
from pathlib import Path

import click

from shardkit.cli_common import (PROGRESS_OPTION, CommandError, alias_help, dataset_argument,
                                 decoder_choice, one_line_errors, printable_text,
                                 progress_default, run_command)
from shardkit.doctor.check import check_dataset, format_check_report, write_json_report
from shardkit.doctor.inspection import (augment_grid, format_augment_grid, format_summary,
                                        inspect_dataset)
from shardkit.doctor.reading import load_manifest_dict
from shardkit.doctor.stats import compute_stats, format_class_hues
from shardkit.errors import ConfigError

__all__ = ["inspect_command", "check_command", "stats_command"]


def _check_json_path(ctx, param, value: Path | None) -> Path | None:
    """``--json PATH`` checked before any work: its nearest existing folder must be a writable
    folder (a file on the way would only fail once the report is computed)."""
    if value is None:
        return None
    folder = value.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise click.BadParameter(f"{value}: {folder} is a file, not a folder", ctx, param)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{value}: cannot write in {folder}", ctx, param)
    return value


def _echo_report(text: str, report: dict, json_path) -> None:
    """Prints a command's report (printable: names that are not UTF-8 as ``\\xNN``), and writes
    it as JSON to ``json_path`` when given."""
    click.echo(printable_text(text))
    if json_path is not None:
        write_json_report(report, json_path)
        click.echo(f"wrote {json_path}")


def _load_transform_config(path: Path | None, root: Path):
    if path is None:
        return None
    from shardkit.doctor.drift import load_transform_config

    return run_command(load_transform_config, path, run_command(load_manifest_dict, root))


_DATASET = dataset_argument()
_DECODER = click.option("--decoder", type=decoder_choice(), default="auto", show_default=True,
                        help="Decoder (shardkit.decode registry; auto: the fastest that runs "
                        "here).")
_SEED = click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the samples drawn and of the train crops' randomness.")
_TCFG = click.option("--transform-config", type=click.Path(exists=True, path_type=Path),
                     default=None, help="YAML file of TransformConfig fields (top level or under "
                     "'transform'), or a `shardkit train` run folder / its config.yaml (the "
                     "transform that run used); default: TransformConfig().")
_PROGRESS = PROGRESS_OPTION


@click.command("inspect")
@_DATASET
@click.option("--split", default=None, help="Only this split (default: all; with --augment: "
              "train).")
@click.option("--out", "--out-dir", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Folder for the PNG grids (default: ./inspect-<DATASET folder "
              "name> in the current directory; never inside DATASET, which stays immutable). "
              "--out-dir is the old spelling, kept for one release.")
@click.option("--n", "n", type=click.IntRange(min=1), default=16, show_default=True,
              help="Samples per grid (every class shown in turn).")
@click.option("--augment", "augment", default=None, metavar="SPEC",
              help="Draw only the augmentation grid of SPEC (preset, YAML list of ops or a "
              ".yaml file): a row per class, each sample as the train loader makes it at the "
              "schedules' first and last epoch, next to its plain crop.")
@click.option("--per-class", "per_class", type=click.IntRange(min=1), default=4,
              show_default=True, help="Samples per class in the --augment grid.")
@_SEED
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=_check_json_path,
              help="Also write the summary as JSON.")
@_PROGRESS
@_DECODER
@_TCFG
@one_line_errors
def inspect_command(dataset, split, out_dir, n, augment, per_class, seed, json_path, progress,
                    decoder, transform_config):
    """Counts per class and split, imbalance, groups, shard sizes and sample grids of DATASET
    (the PNG grids in --out).

    With --augment SPEC: only the augmentation grid of one split (default train), its PNG path
    printed (--decoder and --n do not apply: the grid decodes as the loader does, with the
    --transform-config decoder).
    """
    if augment is not None:
        grid = run_command(augment_grid, dataset, augment, split or "train",
                           per_class=per_class, out_dir=out_dir, seed=seed,
                           transform_config=_load_transform_config(transform_config, dataset),
                           progress=progress_default(progress))
        _echo_report(format_augment_grid(grid), grid, json_path)
        return
    report = run_command(inspect_dataset, dataset, split, out_dir=out_dir, n=n, seed=seed,
                         decoder=decoder,
                         transform_config=_load_transform_config(transform_config, dataset),
                         progress=progress_default(progress))
    _echo_report(format_summary(report), report, json_path)


@click.command("check")
@_DATASET
@click.option("--strict", is_flag=True, help="Fail on warnings too (near-duplicates, degenerate "
              "images, missing classes, imbalance).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=_check_json_path,
              help="Write the full report as JSON.")
@click.option("--near-threshold", "--phash-threshold", "near_threshold",
              type=click.IntRange(0, 64), default=None, metavar="BITS",
              help="Largest pHash Hamming distance of near-duplicates (of 64) [default: 4]. "
              "--phash-threshold is the old spelling, kept for one release.")
@click.option("--imbalance-threshold", type=click.FloatRange(min=1.0), default=None,
              help="Max/min class-count ratio flagged as extreme (default 10).")
@click.option("--near-duplicates", type=click.Choice(["report", "off"]), default=None,
              help="report: list near-duplicate pairs across splits and degenerate images "
              "(decoding the samples whose pHash the pack did not record); off: skip the pHash "
              "search and the degenerate-image test, reported as not run [default: report].")
@click.option("--no-near-duplicates", is_flag=True, help=alias_help("--near-duplicates off"))
@click.option("--recompute-hashes", is_flag=True,
              help="Decode every sample for its pHash even where the pack recorded them (by "
              "default recorded hashes are used and nothing is decoded).")
@click.option("--no-transforms", is_flag=True,
              help="Skip the transform drift check; reported as not run.")
@_SEED
@click.option("--augment", "augment", default=None, metavar="SPEC",
              help="The augmentation spec training will use (preset, YAML list of ops or a "
              ".yaml file): warn when its hue jitter is on and the train classes differ in hue "
              "(per-class mean hue from `shardkit stats`, else from up to 2000 decoded samples).")
@_PROGRESS
@_DECODER
@_TCFG
@one_line_errors
def check_command(dataset, strict, json_path, near_threshold, imbalance_threshold,
                  near_duplicates, no_near_duplicates, recompute_hashes, no_transforms, seed,
                  augment, progress, decoder, transform_config):
    """Check DATASET's splits for leakage and its transforms for drift; exit 1 on a leak.

    The last line is the verdict: FAILED (exit 1) on shared groups, identical bytes or transform
    drift; "OK: no leak found" only when nothing was flagged; otherwise "NO EXACT LEAK ..." with
    the warnings to review (near-duplicate pairs, degenerate images such as blank frames or
    placeholders, missing classes, imbalance), exit 0 unless --strict. A dataset that cannot be
    read exits 2 with one "Error: ..." line on stderr.
    """
    if no_near_duplicates and near_duplicates == "report":
        raise CommandError(ConfigError("--no-near-duplicates (the old spelling of "
                                       "--near-duplicates off) contradicts --near-duplicates "
                                       "report: give one"))
    near = "off" if no_near_duplicates else (near_duplicates or "report")
    report = run_command(check_dataset, dataset, strict=strict, near_duplicates=near == "report",
                         phash_threshold=near_threshold,
                         imbalance_threshold=imbalance_threshold, transforms=not no_transforms,
                         transform_config=_load_transform_config(transform_config, dataset),
                         decoder=decoder, seed=seed, progress=progress_default(progress),
                         recompute_hashes=recompute_hashes, augment=augment)
    _echo_report(format_check_report(report), report, json_path)
    if not report["ok"]:
        raise SystemExit(1)


@click.command("stats")
@_DATASET
@click.option("--split", default="train", show_default=True, help="The split measured.")
@click.option("--max-samples", type=click.IntRange(min=1), default=None,
              help="Use only the first N samples of the split (pack-time shuffled order).")
@click.option("--save/--no-save", default=None,
              help="Store the result in manifest.json under stats/<split> [default: save, "
                   "except for a dataset in object storage, whose manifest is not rewritten].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=_check_json_path,
              help="Also write the result as JSON.")
@_PROGRESS
@_DECODER
@one_line_errors
def stats_command(dataset, split, max_samples, save, json_path, progress, decoder):
    """Per-channel mean/std (0-1, RGB) of a split's decoded pixels and each class's mean hue,
    saved in the manifest."""
    from shardkit.dataset.manifest import MANIFEST_NAME
    from shardkit.storage.urls import is_url

    if save and is_url(dataset):
        raise CommandError(ConfigError(f"--save rewrites manifest.json, which shardkit does not "
                                       f"do in object storage ({dataset}): drop --save (the "
                                       "statistics are printed)"))
    save = not is_url(dataset) if save is None else save
    result = run_command(compute_stats, dataset, split, max_samples=max_samples, decoder=decoder,
                         save=save, progress=progress_default(progress))
    lines = [f"{split}: {result['num_samples']} samples"]
    if "max_side" in result:
        lines.append(f"stored resolution: {result['num_downscaled']} of them stored downscaled "
                     f"(--max-side {result['max_side']}): statistics of the stored pixels")
    lines.append("mean (R, G, B): " + ", ".join(f"{v:.6f}" for v in result["mean"]))
    lines.append("std  (R, G, B): " + ", ".join(f"{v:.6f}" for v in result["std"]))
    lines.append(format_class_hues(result["hue"]))
    if save:
        lines.append(f"saved to {Path(dataset) / MANIFEST_NAME} under stats/{split}"
                     if result.not_saved is None else f"not saved in "
                     f"{Path(dataset) / MANIFEST_NAME}: {result.not_saved}")
    _echo_report("\n".join(lines), {"dataset": str(dataset), "split": split, **result},
                 json_path)
