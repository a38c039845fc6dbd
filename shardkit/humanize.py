"""Numbers as a person reads them in a command's output: sizes in binary units and counts with
the right plural. Pure functions of their arguments; nothing else of shardkit is imported.
"""
from __future__ import annotations

__all__ = ["size_text", "count_text"]

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def size_text(num_bytes: int | float) -> str:
    """A byte count in binary units, 3 significant digits from KiB on: ``512`` -> ``"512 B"``,
    ``1536`` -> ``"1.50 KiB"``, ``100034560`` -> ``"95.4 MiB"``, ``2**40`` -> ``"1.00 TiB"``.

    Raises:
        ValueError: a negative count (a size is never negative).
    """
    if num_bytes < 0:
        raise ValueError(f"a size in bytes must be >= 0; got {num_bytes!r}")
    if num_bytes < 1024:
        return f"{int(num_bytes)} B"
    value = float(num_bytes)
    for unit in _UNITS:
        value /= 1024.0
        if value < 999.5 or unit == _UNITS[-1]:
            break
    digits = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return f"{value:.{digits}f} {unit}"


def count_text(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n == 1``: ``count_text(1, "shard")`` -> ``"1 shard"``,
    ``count_text(3, "shard")`` -> ``"3 shards"``; ``plural`` for an irregular one (default
    ``noun + "s"``). Thousands are comma-separated (``"1,839 samples"``)."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"
