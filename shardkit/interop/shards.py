"""What the tar shards of a ``wds`` dataset hold, member by member, checked against the index.

:func:`scan` walks every shard's ustar headers (:func:`shardkit.formats.wds.sample_members`, one
``pread`` of 512 bytes per member, no data read) in the order of the split index, and returns a
:class:`ShardMembers`: which image extensions and which other members (``.cls``, ``.json``) the
samples have, and, when asked, the DALI index text of every shard. The image members' offsets
and sizes come from the split index; only the members the index does not list (``.cls``,
``.json``: the index records one member per sample) are learnt from their headers, which also
checks that the shards match the index before any metadata is written from it.
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardkit.dataset import manifest as manifest_mod
from shardkit.errors import ShardCorruptError
from shardkit.formats.wds import sample_members

__all__ = ["ShardMembers", "scan", "scan_shard", "DALI_INDEX_VERSION", "DALI_INDEX_NAME",
           "dali_index_path"]

logger = logging.getLogger("shardkit.interop")

DALI_INDEX_VERSION = "v1.2"
"""First token of a DALI webdataset index file, as DALI's ``wds2idx`` writes it (DALI's
``tools/wds2idx.py``, ``IndexCreator.index_file_version``)."""

DALI_INDEX_NAME = re.compile(r"[A-Za-z0-9_]+-\d{6}\.idx")
"""The names of the DALI index files shardkit writes (``train-000000.idx``; owned names of
:mod:`shardkit.packer.outputs.owned`)."""


def dali_index_path(shard_path: str) -> str:
    """The index file of a shard, relative to the dataset root like the manifest's shard path:
    ``shards/train-000000.tar`` -> ``shards/train-000000.idx`` (``wds2idx``'s default name: the
    archive's name up to its first dot, plus ``.idx``)."""
    folder, _, name = shard_path.rpartition("/")
    stem = name.split(".", 1)[0]
    return f"{folder}/{stem}.idx" if folder else f"{stem}.idx"


@dataclass
class ShardMembers:
    """The members of every sample of a ``wds`` dataset.

    Attributes:
        num_samples: samples in all splits.
        image_exts: ``{ext: samples}`` of the image members (``"jpg"``, ``"png"``).
        other_exts: ``{ext: samples}`` of the other members (``"cls"``, ``"json"``).
        dali_index: ``{index path relative to root: index file text}`` (``wds2idx`` format
            ``v1.2``), one per shard; empty unless :func:`scan` was asked for it.
    """

    num_samples: int = 0
    image_exts: Counter = field(default_factory=Counter)
    other_exts: Counter = field(default_factory=Counter)
    dali_index: dict[str, str] = field(default_factory=dict)

    def update(self, other: ShardMembers) -> None:
        """Adds the counts and index texts of ``other`` (another shard's) to these."""
        self.num_samples += other.num_samples
        self.image_exts.update(other.image_exts)
        self.other_exts.update(other.other_exts)
        self.dali_index.update(other.dali_index)

    def every_sample_has(self, ext: str) -> bool:
        """True when every sample (and at least one) has a ``<key>.<ext>`` member."""
        return self.num_samples > 0 and self.other_exts.get(ext, 0) == self.num_samples


def scan_shard(path: str | Path, shard_path: str, keys, offsets, sizes, *,
               dali_index: bool = False) -> ShardMembers:
    """The members of one local tar shard, checked against the split index's rows of it.

    Args:
        path: the shard file. shard_path: its path relative to the dataset root, as the
            manifest lists it (``shards/train-000000.tar``; names the DALI index file).
        keys, offsets, sizes: the split index's key, data offset and size (bytes) of every
            sample in the shard (any order).
        dali_index: also build the shard's DALI index text (see :func:`scan`).

    Raises:
        FileNotFoundError: no file at ``path``. ShardCorruptError: see
            :func:`shardkit.formats.wds.sample_members`.
    """
    order = np.argsort(np.asarray(offsets, dtype=np.int64), kind="stable")  # tar order
    keys = [keys[int(i)] for i in order]
    members = sample_members(path, keys, np.asarray(offsets)[order], np.asarray(sizes)[order])
    out = ShardMembers(num_samples=len(members))
    lines = [f"{DALI_INDEX_VERSION} {len(members)}"]
    for sample in members:
        image, *others = sample
        out.image_exts[image[0].partition(".")[2]] += 1
        out.other_exts.update(name.partition(".")[2] for name, _, _ in others)
        if dali_index:
            lines.append(" ".join(f"{name.partition('.')[2]} {offset} {size} {name}"
                                  for name, offset, size in sample))
    if dali_index:
        out.dali_index[dali_index_path(shard_path)] = "\n".join(lines) + "\n"
    return out


def scan(root: str | Path, manifest: dict, *, dali_index: bool = False) -> ShardMembers:
    """Walks the shards of every split of the local ``wds`` dataset at ``root``.

    Args:
        root: the dataset folder (``OUT``, or the staging folder during a pack).
        manifest: its manifest (the dict :func:`shardkit.dataset.manifest.load_manifest` returns).
        dali_index: also build each shard's DALI index text (one line per sample, in tar order:
            ``<ext> <data offset> <size> <member name>`` for each of its members).

    Raises:
        ManifestError: a split index cannot be read. ShardCorruptError: a shard is missing,
            does not match the index, or holds another number of samples than the manifest says.
    """
    root = Path(root)
    out = ShardMembers()
    for split, info in manifest["splits"].items():
        index = manifest_mod.load_index(root, split, manifest)
        for k, shard in enumerate(info.get("shards", [])):
            rows = (index.shard == k).nonzero()[0]
            keys = [index.key_at(int(i)) for i in rows]
            if len(keys) != shard["num_samples"]:
                raise ShardCorruptError(f"shard {shard['path']}: the split index of {split!r} "
                                        f"lists {len(keys)} samples in it, the manifest "
                                        f"{shard['num_samples']}")
            try:
                out.update(scan_shard(root / shard["path"], shard["path"], keys,
                                      index.offset[rows], index.size[rows],
                                      dali_index=dali_index))
            except FileNotFoundError:
                raise ShardCorruptError(f"shard {shard['path']} of split {split!r} is missing "
                                        f"in {root}") from None
    logger.debug("scanned %d samples: images %s, other members %s", out.num_samples,
                 dict(out.image_exts), dict(out.other_exts))
    return out
