"""Metadata that other tools' readers look for beside a shardkit dataset (issue 14, in progress).

:func:`write_pack_metadata` is called by :func:`shardkit.pack.pack` just before ``manifest.json``
is written; it derives everything from the manifest (never a second source of truth).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_pack_metadata"]


def write_pack_metadata(root: Path, manifest: dict[str, Any]) -> list[Path]:
    """Writes the readers' metadata files of the dataset at ``root``; returns their paths.

    Not written yet for any format: returns ``[]``.
    """
    return []
