"""The ``shardkit`` command line: a click group whose commands load lazily from their modules."""
from __future__ import annotations

import importlib
import logging
import sys

import click

__all__ = ["main"]

# name -> "module:attribute"; each module defines its own click.Command.
COMMANDS = {
    "pack": ("shardkit.packer.cli:pack_command",
             "Pack an image folder or CSV list into shards."),
    "verify": ("shardkit.doctor.verify:verify_command",
               "Re-hash shards and check them against the manifest."),
    "train": ("shardkit.train.cli:train_command",
              "Train a timm classifier from shards."),
    "bench": ("shardkit.bench.cli:bench_command",
              "Benchmark the loader: is training data-bound?"),
    "stats": ("shardkit.doctor.cli:stats_command",
              "Per-channel mean/std of a split, saved in the manifest."),
    "inspect": ("shardkit.doctor.cli:inspect_command",
                "Counts, imbalance, shard sizes and a sample grid."),
    "check": ("shardkit.doctor.cli:check_command",
              "Check splits for leakage and transform drift."),
    "export": ("shardkit.interop.cli:export_command",
               "Write the files timm, DALI and HF datasets need to read wds shards."),
    "cache": ("shardkit.stream.cache_cli:cache_command",
              "Fill a decoded image cache ahead of time (cache build)."),
}


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (keeps ``--help`` fast)."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx):
        """Runs the command; an error it lets through that means "cannot run" (a ShardkitError,
        a store's error) ends it with exit code 2 and one ``Error:`` line, as the commands
        themselves do (:mod:`shardkit.cli_common`)."""
        args = [a.split("=", 1)[-1] for a in ctx.args]  # the command's arguments, as given
        try:
            return super().invoke(ctx)
        except Exception as exc:  # noqa: BLE001 - mapped, or re-raised as it is
            from shardkit.cli_common import cannot_run

            err = cannot_run(exc, args)
            if err is None:
                raise
            raise err from None

    def format_commands(self, ctx, formatter):
        """Lists commands from their one-line help, without importing their modules."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (as logging's last-resort handler), so
    a replaced or captured stderr (click's CliRunner, pytest) is never written after closing."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def show_notes_on_stderr(level: int = logging.INFO) -> None:
    """Shows the ``shardkit`` loggers' records at ``level`` and above on stderr as
    ``LEVEL shardkit.module: message`` lines, unless the application already configured logging
    (a handler on ``shardkit`` or on the root logger). Library code never calls this; the
    command line does, once."""
    logger = logging.getLogger("shardkit")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(level)


@click.group(cls=LazyGroup)
@click.version_option(package_name="shardkit")
@click.option("-q", "--quiet", is_flag=True,
              help="Show warnings and errors only (notes are logged at INFO).")
def main(quiet: bool):
    """shardkit: pack image folders into shards, stream them fast, train, and measure."""
    show_notes_on_stderr(logging.WARNING if quiet else logging.INFO)


if __name__ == "__main__":  # main guard: spawn-started workers re-import this module (case 19)
    main()
