"""``shardkit export OUT --to {timm,dali,hf,all}``: other readers' files for an existing dataset.

Exit codes (:mod:`shardkit.doctor.cli`): 0 with the written files on stdout, one per line; 2 with
one stderr line ``Error: <ErrorType>: <message>`` when it cannot run: no finished dataset, an
``lmdb``/``hdf5`` dataset, shards without the labels a tool reads (e.g. packed with
``--no-wds-cls``), shards that do not match the index, a foreign ``README.md``, a running pack.
Nothing is written then.
"""
from __future__ import annotations

from pathlib import Path

import click

from shardkit.errors import ShardkitError

__all__ = ["export_command"]


@click.command("export")
@click.argument("out", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--to", "tools", multiple=True, default=("all",), show_default=True,
              type=click.Choice(["timm", "dali", "hf", "all"]),
              help="Tool whose files to write (repeat for several): timm -> "
                   "shards/_info.json, dali -> shards/<shard>.idx, hf -> README.md.")
def export_command(out: Path, tools: tuple[str, ...]):
    """Write or refresh the files timm, DALI and Hugging Face datasets need to read the wds
    shards in OUT (derived from OUT/manifest.json); `shardkit pack --format wds` writes them
    too. Exit 2 with one line when the dataset cannot serve a tool (e.g. no .cls members)."""
    from shardkit import interop
    from shardkit.pack import command_error

    chosen = interop.TOOLS if "all" in tools else tools
    try:
        written = interop.export(out, chosen)
    except (ShardkitError, OSError) as e:
        raise command_error(e) from None
    root = out.resolve()
    for path in written:
        click.echo(path.resolve().relative_to(root).as_posix())
    click.echo(f"export {out}: {len(written)} file(s) written for {', '.join(chosen)}")
