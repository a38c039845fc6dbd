"""The ``shardkit`` command line: a click group whose commands load lazily from their modules."""
from __future__ import annotations

import importlib

import click

__all__ = ["main"]

# name -> "module:attribute"; each module defines its own click.Command.
COMMANDS = {
    "pack": "shardkit.pack:pack_command",
    "verify": "shardkit.verify:verify_command",
    "train": "shardkit.train.cli:train_command",
    "bench": "shardkit.bench.cli:bench_command",
    "stats": "shardkit.doctor:stats_command",
    "inspect": "shardkit.doctor:inspect_command",
    "check": "shardkit.doctor:check_command",
}


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (keeps ``--help`` fast)."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup)
@click.version_option(package_name="shardkit")
def main():
    """shardkit: pack image folders into shards, stream them fast, train, and measure."""


if __name__ == "__main__":  # main guard: spawn-started workers re-import this module (case 19)
    main()
