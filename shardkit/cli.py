"""The ``shardkit`` command line: a click group whose commands load lazily from their modules."""
from __future__ import annotations

import importlib

import click

__all__ = ["main"]

# name -> "module:attribute"; each module defines its own click.Command.
COMMANDS = {
    "pack": ("shardkit.pack:pack_command",
             "Pack an image folder or CSV list into shards."),
    "verify": ("shardkit.verify:verify_command",
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

    def format_commands(self, ctx, formatter):
        """Lists commands from their one-line help, without importing their modules."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup)
@click.version_option(package_name="shardkit")
def main():
    """shardkit: pack image folders into shards, stream them fast, train, and measure."""


if __name__ == "__main__":  # main guard: spawn-started workers re-import this module (case 19)
    main()
