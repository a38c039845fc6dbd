"""timm's ``_info.json``: what timm's WebDataset reader needs to find the splits of a dataset.

timm's ``ReaderWds`` (``timm/data/readers/reader_wds.py``: ``_load_info``, ``_parse_split_info``,
used by ``timm.data.create_dataset("wds/<name>", root=..., split=...)`` and ``train.py
--dataset wds/<name> --data-dir ...``) reads ``<root>/_info.json`` and, for a split name, takes
``info["splits"][split]`` with ``name``, ``num_samples``, ``filenames`` (relative to ``root``),
``shard_lengths`` and the optional ``alt_label`` (a field of the ``.json`` member to take the
label from instead of the ``.cls`` member). Without the file it fails with "split train not
found in info".

shardkit writes it as ``OUT/shards/_info.json`` (so ``root`` is ``OUT/shards``), from the
manifest: one entry per non-empty split under its shardkit name, plus the name timm's
``train.py`` asks for by default where it differs (``--val-split validation``: the entry
``validation`` is the ``val`` split; see :data:`shardkit.interop.TOOL_SPLIT_NAMES`).
"""
from __future__ import annotations

import posixpath

__all__ = ["INFO_NAME", "info_dict"]

INFO_NAME = "_info.json"
"""timm's file name (``_load_info`` tries ``_info.json``, then ``info.json``)."""


def info_dict(manifest: dict, name: str, aliases: dict[str, str],
              label_field: str | None = None) -> dict:
    """The ``_info.json`` content for the dataset of ``manifest``.

    Args:
        manifest: the dataset's manifest (shards listed as ``shards/<file>``).
        name: the dataset's name (timm shows it; ``wds/<name>`` does not have to match it).
        aliases: ``{shardkit split: timm name}`` of splits timm knows by another name; each is
            listed under both names (unless a split already has the other name).
        label_field: None when the shards have ``.cls`` members (timm's default); else the
            ``.json`` member's field holding the label (``"label"``), written as ``alt_label``.

    Returns:
        ``{"name", "num_classes", "splits": {split: {"name", "num_samples", "filenames",
        "shard_lengths"[, "alt_label"]}}}``; splits without samples are left out.
    """
    splits: dict[str, dict] = {}
    for split, info in manifest["splits"].items():
        if not info["num_samples"]:
            continue
        shards = info["shards"]
        entry = {"name": split, "num_samples": int(info["num_samples"]),
                 "filenames": [posixpath.relpath(s["path"], "shards") for s in shards],
                 "shard_lengths": [int(s["num_samples"]) for s in shards]}
        if label_field is not None:
            entry["alt_label"] = label_field
        splits[split] = entry
    for split, alias in aliases.items():
        if split in splits and alias not in manifest["splits"]:
            splits[alias] = {**splits[split], "name": alias}
    return {"name": name, "num_classes": len(manifest["classes"]), "splits": splits}
