"""``shardkit pack``: the command line of :func:`shardkit.pack`."""
from __future__ import annotations

from pathlib import Path

import click

from shardkit.cli_common import PROGRESS_OPTION, dataset_argument, progress_default
from shardkit.storage.urls import is_url
from shardkit.errors import ShardkitError
from shardkit.formats import FORMATS  # the registry decides the --format choices
from shardkit.packer.assign import SPLIT_METHODS
from shardkit.packer.options import (ENGINES, LABEL_CONFLICT_POLICIES, NEAR_DUPLICATE_MODES,
                                     PackOptions)
from shardkit.packer.run import pack
from shardkit.packer.summary import printable
from shardkit.sources.layouts import LAYOUTS

__all__ = ["pack_command", "command_error"]


def _source_arg(ctx, param, value: str) -> Path | str:
    """SRC: a remote fsspec URL as it is, else a local path that must exist."""
    if is_url(value):
        return value
    return click.Path(exists=True, path_type=Path).convert(value, param, ctx)


def _metadata_arg(ctx, param, value: str | None) -> Path | str | None:
    """--metadata: a remote fsspec URL as it is (read with one GET), else a local file that
    must exist."""
    if value is None or is_url(value):
        return value
    return click.Path(exists=True, dir_okay=False, path_type=Path).convert(value, param, ctx)


@click.command("pack")
@click.argument("src", callback=_source_arg)
@dataset_argument(exists=False)
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), default="wds",
              show_default=True, help="Shard format.")
@click.option("--split-ratios", "--split", "split_spec", default=None,
              metavar="given|NAME=FRACTION,...",
              help="'given' keeps the splits of a split-first SRC (train/, val/, ...) or of "
                   "--split-column; fractions (train=0.8,val=0.2) pool every file and re-split "
                   "by group [default: given when SRC has given splits, else "
                   "train=0.8,val=0.1,test=0.1]. --split is the old spelling, kept for one "
                   "release (elsewhere --split names one split).")
@click.option("--layout", type=click.Choice(LAYOUTS), default="auto", show_default=True,
              help="Folder layout: SRC/<class>/... or SRC/<split>/<class>/...; auto detects "
                   "split folders (train, val, valid, validation, dev, test, testing, eval).")
@click.option("--split-column", metavar="COL",
              help="Column holding each file's given split: of --metadata if given, else of "
                   "the .csv SRC.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Split hash key / tie-break and shuffle seed.")
@click.option("--split-method", type=click.Choice(SPLIT_METHODS), default="hash",
              show_default=True,
              help="hash: a group's split follows a keyed hash of its name, so re-packing a "
                   "grown source moves no old group; balanced: closest to the ratios, but "
                   "added data can move old groups.")
@click.option("--split-from", type=click.Path(exists=True, file_okay=False, path_type=Path),
              metavar="PREV_DATASET",
              help="Keep every group where the earlier pack PREV_DATASET put it; only new groups "
                   "are assigned (balanced toward the ratios; without --split-ratios, "
                   "PREV_DATASET's).")
@click.option("--near-duplicates", type=click.Choice(NEAR_DUPLICATE_MODES), default="merge",
              show_default=True,
              help="merge: images whose pHashes differ in <= --near-threshold bits share a "
                   "split (their groups join); report: list those found in several splits; "
                   "off: no pHash.")
@click.option("--near-threshold", type=click.IntRange(0, 64), default=4, show_default=True,
              metavar="BITS", help="Largest pHash Hamming distance of near-duplicates (of 64).")
@click.option("--group-by", metavar="REGEX",
              help="Group = first capture group of REGEX on the path.")
@click.option("--metadata", callback=_metadata_arg,
              help="CSV with a 'path' column and the group and/or split column: a local file "
                   "or an object-store URL (s3://, gs://, https://).")
@click.option("--group-column", metavar="COL", help="Column of --metadata holding the group.")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="LABELS.yaml: classes and aliases.")
@click.option("--shard-samples", type=click.IntRange(min=1), metavar="N",
              help="Samples per shard [default: see --shard-bytes].")
@click.option("--shard-bytes", metavar="SIZE",
              help="Bytes per shard, e.g. 64MB or 512MiB [default, when neither limit is set: "
                   "each split in S equal shards, S the largest power of two up to 32 leaving "
                   ">= 64 samples per shard (1 under 128 samples, 32 from 2,048), more for "
                   "splits over 8 GiB (a multiple of 32, <= 256MiB per shard on average), so "
                   "shard-level readers (timm, webdataset, DALI) can split it over world_size x "
                   "num_workers; the summary warns about splits of fewer than 8 shards].")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Check processes.")
@click.option("--strict", is_flag=True,
              help="Quarantine images that decode only with warnings, and degenerate images "
                   "(a side under 32 px, near-constant pixels).")
@click.option("--max-pixels", type=click.IntRange(min=1), metavar="N",
              help="Pixel limit per image.")
@click.option("--max-side", type=click.IntRange(min=16), metavar="PX",
              help="Store images whose longer side exceeds PX downscaled to PX (antialiased) "
                   "and re-encoded as JPEG; each sample keeps its original size and sha256 in "
                   "the index [default: original bytes].")
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=95, show_default=True,
              metavar="Q", help="JPEG quality of images re-encoded by --max-side (4:4:4).")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True,
              help="Where files are checked and shards written: local processes, or Ray tasks "
                   "(pip install 'shardkit[ray]').")
@click.option("--ray-address", metavar="ADDR",
              help="Ray cluster to join (engine ray) [default: RAY_ADDRESS, else a local Ray].")
@click.option("--read-concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              metavar="N",
              help="Reads of remote files (s3://, gs://, https:// rows or prefixes) kept in "
                   "flight per check process or Ray task, while earlier files are checked.")
@click.option("--overwrite", is_flag=True,
              help="Replace a finished dataset in DATASET: the new one is built beside it (in "
                   "DATASET/.shardkit-new, so the disk needs room for both) and swapped in at "
                   "the end; until then the old one stays valid. A DATASET in object storage has "
                   "no swap: its old manifest.json is deleted when writing starts.")
@click.option("--wds-cls/--no-wds-cls", default=True, show_default=True,
              help="Write a '<key>.cls' tar member (the label) beside each image (wds), as "
                   "timm, DALI and webdataset readers expect.")
@click.option("--wds-json", is_flag=True,
              help="Also write '<key>.json' (key, label, class, source path) per sample (wds).")
@click.option("--on-label-conflict", type=click.Choice(LABEL_CONFLICT_POLICIES), default="error",
              show_default=True, help="Identical bytes under different labels.")
@click.option("--fail-fast", is_flag=True,
              help="Stop at the first rejected file (missing, unreadable, not an image, "
                   "damaged; degenerate with --strict; a label conflict with "
                   "--on-label-conflict quarantine): exit 2 with its path and reason, nothing "
                   "written. Files are checked in scan order and the check stops there (checks "
                   "already running in other --workers finish).")
@PROGRESS_OPTION
def pack_command(src, dataset, fmt, split_spec, layout, split_column, seed, split_method,
                 split_from, near_duplicates, near_threshold, group_by, metadata,
                 group_column, labels,
                 shard_samples, shard_bytes, workers, strict, max_pixels, max_side, jpeg_quality,
                 engine, ray_address, read_concurrency, overwrite, wds_cls, wds_json,
                 on_label_conflict, fail_fast,
                 progress):
    """Pack SRC (an ImageFolder tree or a .csv list; local, or an s3:// / gs:// / https://
    prefix or .csv) into the dataset DATASET (a folder, or an object-store URL for wds).

    Progress bars on stderr (the summary is printed either way) are on when stderr is a
    terminal. Exit 0 with the summary on stdout; 2 with one "Error: <ErrorType>: <message>" line
    on stderr when the pack cannot run or nothing could be packed (DATASET is left as it was)."""
    try:
        options = PackOptions(
            format=fmt, split=split_spec, seed=seed, group_by=group_by, metadata=metadata,
            group_column=group_column, labels=labels, shard_samples=shard_samples,
            shard_bytes=shard_bytes, workers=workers, strict=strict, max_pixels=max_pixels,
            overwrite=overwrite, progress=progress_default(progress), wds_cls=wds_cls,
            wds_json=wds_json,
            on_label_conflict=on_label_conflict, fail_fast=fail_fast, layout=layout,
            split_column=split_column, split_method=split_method, split_from=split_from,
            near_duplicates=near_duplicates, near_threshold=near_threshold, max_side=max_side,
            jpeg_quality=jpeg_quality, engine=engine, ray_address=ray_address,
            read_concurrency=read_concurrency)
        summary = pack(src, dataset, options=options)
    except (ShardkitError, OSError) as e:  # bad input, unwritable DATASET, full disk: no traceback
        raise command_error(e) from None
    click.echo(summary.format_text())


def command_error(exc: BaseException) -> click.ClickException:
    """The CLI convention of :mod:`shardkit.cli_common` for a command that could not run: exit
    code 2 and one stderr line ``Error: <ErrorType>: <message>`` (printable: lone surrogates of
    non-UTF-8 file names escaped)."""
    from shardkit.cli_common import CommandError

    err = CommandError(exc)
    err.message = printable(err.message)
    return err

