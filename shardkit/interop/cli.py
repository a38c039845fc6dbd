"""``shardkit export DATASET --to {timm,dali,hf,all}``: other readers' files for an existing
dataset.

Exit codes (:mod:`shardkit.doctor.cli`): 0 with the written files on stdout, one per line; 2 with
one stderr line ``Error: <ErrorType>: <message>`` when it cannot run: no finished dataset, an
``lmdb``/``hdf5`` dataset, shards without the labels a tool reads (e.g. packed with
``--no-wds-cls``), shards that do not match the index, a foreign ``README.md``, a running pack,
a URL (export writes into a local folder). Nothing is written then.
"""
from __future__ import annotations

from pathlib import Path

import click

from shardkit.cli_common import CommandError, one_line_errors

__all__ = ["export_command"]


def _local_dataset(ctx, param, value: str) -> Path:
    """DATASET: a local dataset folder; a URL is refused in one line (export writes files beside
    the shards, which shardkit does not do in object storage)."""
    from shardkit.errors import ConfigError
    from shardkit.storage.urls import is_url

    if is_url(value):
        raise CommandError(ConfigError(
            f"{value}: export writes into a local dataset folder; URL not supported (a `shardkit "
            "pack --format wds` into object storage writes timm's and DALI's files itself; for "
            "the Hugging Face card, export a local copy and upload its README.md)"))
    return click.Path(exists=True, file_okay=False, path_type=Path).convert(value, param, ctx)


@click.command("export")
@click.argument("dataset", metavar="DATASET", callback=_local_dataset)
@click.option("--to", "tools", multiple=True, default=("all",), show_default=True,
              type=click.Choice(["timm", "dali", "hf", "all"]),
              help="Tool whose files to write (repeat for several): timm -> "
                   "shards/_info.json, dali -> shards/<shard>.idx, hf -> README.md.")
@one_line_errors
def export_command(dataset: Path, tools: tuple[str, ...]):
    """Write or refresh the files timm, DALI and Hugging Face datasets need to read the wds
    shards in DATASET, a local folder (derived from DATASET/manifest.json); `shardkit pack
    --format wds` writes them too. Exit 2 with one line when the dataset cannot serve a tool
    (e.g. no .cls members)."""
    from shardkit import interop

    chosen = interop.TOOLS if "all" in tools else tools
    written = interop.export(dataset, chosen)
    root = dataset.resolve()
    for path in written:
        click.echo(path.resolve().relative_to(root).as_posix())
    click.echo(f"export {dataset}: {len(written)} file(s) written for {', '.join(chosen)}")
