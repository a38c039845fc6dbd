"""``shardkit cache build DATASET --split train --cache disk:DIR``: fill a decoded cache ahead of
time (:mod:`shardkit.stream.cache`), with a progress bar; prints the cache's stats as JSON."""
from __future__ import annotations

import json

import click

from shardkit.cli_common import PROGRESS_OPTION, dataset_argument, progress_default

__all__ = ["cache_command", "build_cache"]


def build_cache(root, split: str, cache: str, *, max_side: int | None = None,
                image_size: int = 224, num_workers: int = 2, progress: bool = True) -> dict:
    """Reads every sample of ``split`` once through a cached loader (unshuffled), which fills
    the arena; returns ``loader.cache_stats()``.

    Raises:
        ConfigError: ``cache`` is not a ``disk:DIR`` (a RAM cache lives only as long as the
            processes that hold it: a command that exits would leave nothing), or bad options.
    """
    from ..errors import ConfigError
    from . import SamplingOptions, make_loader
    from .cache import parse_cache

    if parse_cache(cache)[0] != "disk":
        raise ConfigError(f"--cache {cache!r}: `shardkit cache build` fills a disk cache "
                          "(disk:DIR); a RAM cache is removed when its last process exits, so "
                          "it fills during the first epoch of the run that uses it")
    # train=False: the cached pixels do not depend on the mode, and an eval split would warn
    loader = make_loader(root, split, 64, train=False, image_size=image_size,
                         num_workers=num_workers, cache=cache, cache_max_side=max_side,
                         sampling=SamplingOptions(shuffle=False))
    try:
        if loader.cache is None:
            raise ConfigError(f"{cache}: the cache could not be opened (see the warning above)")
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(loader.dataset.source), unit="img", desc=f"cache {split}")
        for images, _ in loader:
            if bar is not None:
                bar.update(len(images))
        if bar is not None:
            bar.close()
        return loader.cache_stats()
    finally:
        loader.close()


@click.group("cache")
def cache_command():
    """Decoded image cache (make_loader cache=...): fill it ahead of time."""


@cache_command.command("build")
@dataset_argument()
@click.option("--split", default="train", show_default=True, help="The split cached.")
@click.option("--cache", "cache", required=True, help="disk:DIR (the folder of the arena file).")
@click.option("--max-side", type=click.IntRange(min=1), default=None,
              help="Cache images resized so that the longer side is at most N px.")
@click.option("--num-workers", type=click.IntRange(min=0), default=2, show_default=True,
              help="Decoding workers of the loader that fills the cache.")
@PROGRESS_OPTION
def build_command(dataset, split, cache, max_side, num_workers, progress):
    """Decode every image of SPLIT of DATASET (a folder, or the URL of a wds dataset in object
    storage) into the cache (a progress bar on stderr when it is a terminal); prints the
    cache's stats as JSON. A run with the same --cache and resolution then starts with every
    sample cached."""
    from shardkit.cli_common import run_command

    stats = run_command(build_cache, dataset, split, cache, max_side=max_side,
                        num_workers=num_workers, progress=progress_default(progress))
    click.echo(json.dumps(stats, indent=2))
