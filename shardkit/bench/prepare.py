"""Benchmark inputs: pack a raw ImageFolder into every format with the public ``shardkit pack`` CLI.

Used by ``benchmarks/run_all.py`` and by the suites when ``--data`` is a raw folder rather than a
packed dataset. Packing goes through the CLI (a subprocess) so the benchmarks exercise exactly
what users run. A ``metadata.csv`` beside the class folders with a ``group_flickr_user`` column
(the layout of ``../shared/data/flowers`` and ``examples/flowers-sample``) is used for the
photographer-grouped split.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

from shardkit.dataset.manifest import MANIFEST_NAME
from shardkit.errors import PackFailed

__all__ = ["FORMAT_NAMES", "is_packed", "pack_with_cli", "ensure_packed"]

FORMAT_NAMES = ("wds", "lmdb", "hdf5")
GROUP_COLUMN = "group_flickr_user"


def is_packed(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a finished shardkit dataset (``manifest.json`` present)."""
    return (Path(path) / MANIFEST_NAME).is_file()


def _group_args(src: Path) -> list[str]:
    meta = src / "metadata.csv"
    if not meta.is_file():
        return []
    with open(meta, newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    return ["--metadata", str(meta), "--group-column", GROUP_COLUMN] if GROUP_COLUMN in header \
        else []


def pack_with_cli(src: str | os.PathLike, out: str | os.PathLike, fmt: str, *,
                  shard_samples: int = 256, workers: int = 1, extra: list[str] = ()) -> Path:
    """Runs ``python -m shardkit.cli pack SRC OUT --format FMT ...``; returns ``OUT``.

    Raises:
        PackFailed: the command exited non-zero (its stderr tail is in the message).
    """
    src, out = Path(src), Path(out)
    cmd = [sys.executable, "-m", "shardkit.cli", "pack", str(src), str(out), "--format", fmt,
           "--shard-samples", str(shard_samples), "--workers", str(workers), "--no-progress",
           *_group_args(src), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PackFailed(f"`{' '.join(cmd)}` exited {proc.returncode}: {proc.stderr[-2000:]}")
    return out


def ensure_packed(data: list[str | os.PathLike], tmp: str | os.PathLike,
                  formats: tuple[str, ...] = FORMAT_NAMES, **pack_kw) -> list[Path]:
    """Packed dataset folders for ``data``: packed ones as given, raw folders packed into
    ``tmp/<name>-<fmt>`` once per format in ``formats``.

    Raises:
        PackFailed: see :func:`pack_with_cli`.
    """
    out: list[Path] = []
    for d in data:
        d = Path(d)
        if is_packed(d):
            out.append(d)
            continue
        for fmt in formats:
            dest = Path(tmp) / f"{d.name}-{fmt}"
            out.append(dest if is_packed(dest) else pack_with_cli(d, dest, fmt, **pack_kw))
    return out
