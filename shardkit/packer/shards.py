"""The default shard plan: how many shards a split gets, and the limits one shard rolls over at.

Pure arithmetic (no I/O), used by :class:`shardkit.packer.options.PackOptions` and step 6.
"""
from __future__ import annotations

# ----------------------------------------------------------------------------- shard plan
DEFAULT_SHARD_BYTES = 256 << 20
"""Largest average shard of the default plan (256 MiB): a split of more than
``SHARDS_PER_SPLIT x 256 MiB`` (8 GiB) gets more shards (a multiple of 32) so that each holds at
most this on average; big enough that per-shard overhead vanishes, small enough that a writer
buffering a shard (HDF5) stays modest."""
SHARDS_PER_SPLIT = 32
"""Shards the default plan gives a split that is big enough: 32 = world_size x num_workers of
e.g. 4 GPUs x 8 workers, and every power of two up to it divides it."""
MIN_SHARD_SAMPLES = 64
"""Fewest samples per shard of the default plan: a small split is cut into fewer shards (a
power of two) rather than shattered, e.g. 100 samples -> 1 shard, 1,483 -> 16, 2,048 -> 32."""
READER_PARALLELISM = 8
"""Reader processes (world_size x num_workers) that pack expects a split to feed: a split with
fewer shards gets a warning (see :func:`few_shards_warning`)."""


def default_shard_count(num_samples: int, num_bytes: int) -> int:
    """Shards the default plan (neither ``shard_samples`` nor ``shard_bytes`` given) aims at for
    a split of ``num_samples`` samples holding ``num_bytes`` stored bytes.

    The largest power of two ``S <= SHARDS_PER_SPLIT`` (32) with at least
    ``MIN_SHARD_SAMPLES`` (64) samples per shard (1 for splits under 128 samples); raised, for a
    split over ``S x DEFAULT_SHARD_BYTES``, to the smallest power of two (up to 32), then
    multiple of 32, that keeps the average shard at or under :data:`DEFAULT_SHARD_BYTES`; never
    more than ``num_samples``. 0 for an empty split.

    Why: readers that hand whole shards to each of ``world_size x num_workers`` processes
    (timm's ``ReaderWds``, webdataset's ``split_by_worker``, DALI's shard split) give nothing to
    a process beyond the shard count; a power of two (or multiple of 32) of equal shards splits
    evenly over any power-of-two reader count up to it.
    """
    if num_samples <= 0:
        return 0
    count = 1
    while count < SHARDS_PER_SPLIT and num_samples // (2 * count) >= MIN_SHARD_SAMPLES:
        count *= 2
    by_bytes = -(-int(num_bytes) // DEFAULT_SHARD_BYTES)
    if by_bytes > count:
        count = 1 << (by_bytes - 1).bit_length() if by_bytes <= SHARDS_PER_SPLIT else \
            SHARDS_PER_SPLIT * -(-by_bytes // SHARDS_PER_SPLIT)
    return min(count, num_samples)


def shard_limits(shard_samples: int | None, shard_bytes: int | None, num_samples: int,
                 num_bytes: int) -> tuple[int | None, int | None]:
    """``(max_samples, max_bytes)`` of :class:`shardkit.formats.ShardSink` for one split of
    ``num_samples`` samples and ``num_bytes`` stored bytes: the given ``shard_samples`` /
    ``shard_bytes`` as they are when either is set; else the default plan,
    ``ceil(num_samples / S)`` samples per shard for ``S = default_shard_count(...)`` (so ``S``
    shards of equal length, the last one holding the rest; fewer only where a shard would hold
    fewer samples than there are shards), with ``2 x DEFAULT_SHARD_BYTES`` (512 MiB) as a cap
    that only very uneven file sizes reach. Both engines cut a split with the same limits."""
    if shard_samples is not None or shard_bytes is not None:
        return shard_samples, shard_bytes
    count = default_shard_count(num_samples, num_bytes)
    return (max(1, -(-num_samples // max(1, count))), 2 * DEFAULT_SHARD_BYTES)


def few_shards_warning(split_manifest: dict[str, dict],
                       parallelism: int = READER_PARALLELISM) -> list[str]:
    """One warning naming the non-empty splits with fewer than ``parallelism`` shards (and
    their shard counts), or none: what shard-level readers with more processes do with them."""
    few = [f"{name} ({len(sm['shards'])})" for name, sm in split_manifest.items()
           if sm["num_samples"] and len(sm["shards"]) < parallelism]
    if not few:
        return []
    return [f"split(s) with fewer than {parallelism} shards: {', '.join(few)}. Readers that hand "
            "whole shards to each of world_size x num_workers processes (timm's wds reader, "
            "webdataset's split_by_worker, DALI) leave the processes beyond a split's shard "
            "count without data, and timm's training reader then repeats some samples and "
            "skips others every epoch; use at most that many processes for these splits, or "
            "pack more shards (--shard-samples N). shardkit's own loader splits shards by "
            "sample and is not affected"]
