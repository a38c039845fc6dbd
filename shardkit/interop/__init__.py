"""Metadata that other tools' readers look for beside a ``wds`` shardkit dataset (README.md,
"Reading shardkit shards with other tools").

A ``wds`` dataset is plain tar shards with ``<key>.<jpg|png>`` and (by default) ``<key>.cls``
members, which ``webdataset.WebDataset`` reads as they are. Three other readers need a file
beside them; shardkit writes each, derived from ``manifest.json`` and the split index (never a
second source of truth), and checked against the shards' tar headers first
(:mod:`shardkit.interop.shards`):

============  ==============================  ============================================
tool          file (relative to ``OUT``)      module, and what the reader needs
============  ==============================  ============================================
``timm``      ``shards/_info.json``           :mod:`~shardkit.interop.timm_info`: splits,
                                              shard lists and lengths (``root=OUT/shards``)
``dali``      ``shards/<split>-NNNNNN.idx``   DALI ``wds2idx`` index (``v1.2``) of each tar:
                                              every member's data offset and size
``hf``        ``README.md``                   :mod:`~shardkit.interop.hf_card`: the dataset
                                              card ``datasets.load_dataset(OUT)`` reads
============  ==============================  ============================================

Labels: timm, DALI and Hugging Face take them from the ``.cls`` members (class index = the
manifest's label, names from the manifest's ``classes``); timm can instead read the ``label``
field of ``.json`` members (``--wds-json``). A dataset packed with ``--no-wds-cls`` (or before
``.cls`` became the default) lacks what DALI and HF need, and timm's too unless it has ``.json``
members: :func:`write_pack_metadata` then leaves that tool's file out (one INFO line), and
:func:`export` refuses with a :class:`~shardkit.errors.ConfigError` naming what is missing.
Which members every sample has is read from the manifest's ``writer`` record
(:class:`~shardkit.dataset.writer_config.WriterConfig`), so a tool the shards cannot serve is
answered without opening a shard, and the shards scanned for the files written must hold the
recorded members; a manifest without the record (packed before it existed) is answered from
the tar headers.

Split names (:data:`TOOL_SPLIT_NAMES`): shardkit's ``val`` is ``validation`` for Hugging Face
(its only name there) and for timm (both names listed in ``_info.json``, as timm's ``train.py``
asks for ``--val-split validation`` by default); every other split keeps its name.

Files are written atomically (:mod:`shardkit.storage.atomic`); their names are owned names of
:mod:`shardkit.packer.outputs.owned` (a pack replaces or removes them like its other files).
``lmdb`` and ``hdf5`` datasets get nothing: no other tool reads those shards.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

from shardkit.dataset import manifest as manifest_mod
from shardkit.dataset.writer_config import WDS_MEMBER_OPTIONS, WriterConfig
from shardkit.storage.urls import local_path
from shardkit.errors import ConfigError, ShardCorruptError
from shardkit.storage.atomic import atomic_write_bytes
from shardkit.interop.hf_card import CARD_MARKER, CARD_NAME, card_text
from shardkit.interop.shards import DALI_INDEX_NAME, ShardMembers, dali_index_path, scan
from shardkit.interop.timm_info import INFO_NAME, info_dict

__all__ = ["write_pack_metadata", "export", "TOOLS", "TOOL_SPLIT_NAMES", "tool_split_names",
           "INFO_NAME", "CARD_NAME", "missing_for"]

logger = logging.getLogger("shardkit.interop")

TOOLS = ("timm", "dali", "hf")
PACK_TOOLS = ("timm", "dali")
"""What a ``wds`` pack writes by itself: files inside ``shards/`` only. The Hugging Face card is
a ``README.md`` in OUT, a name users often keep their own notes under, so it is written only on
request (``shardkit export OUT --to hf``)."""
TOOL_SPLIT_NAMES = {"val": "validation"}
"""shardkit split name -> the name timm's ``train.py`` and Hugging Face ``datasets`` use."""


def tool_split_names(splits: Iterable[str]) -> dict[str, str]:
    """``{shardkit split: name for timm / HF}``: :data:`TOOL_SPLIT_NAMES` applied where the
    dataset has no split of the target name already (then the split keeps its own name)."""
    splits = list(splits)
    return {s: TOOL_SPLIT_NAMES[s] if s in TOOL_SPLIT_NAMES and TOOL_SPLIT_NAMES[s] not in splits
            else s for s in splits}


def missing_for(tool: str, members: ShardMembers | WriterConfig) -> str | None:
    """The label members ``tool`` needs and the shards lack, e.g. ``".cls members"``; None when
    the shards serve it. ``members``: what the shards hold, scanned (:class:`ShardMembers`) or
    as the manifest records it (a :class:`~shardkit.dataset.writer_config.WriterConfig` with
    its :meth:`~shardkit.dataset.writer_config.WriterConfig.tar_members` recorded)."""
    if members.every_sample_has("cls") or (tool == "timm" and members.every_sample_has("json")):
        return None
    return ".cls members (or .json members, from --wds-json)" if tool == "timm" else \
        ".cls members"


def _lacking_message(lacking: dict[str, str], members: ShardMembers | WriterConfig) -> str:
    """One sentence: which tools read labels from which members, and what the shards hold."""
    by_need: dict[str, list[str]] = {}
    for tool, need in lacking.items():
        by_need.setdefault(need, []).append(_NICE[tool])
    reads = "; ".join(f"{' and '.join(tools)} read{'s' if len(tools) == 1 else ''} labels "
                      f"from {need}" for need, tools in by_need.items())
    if isinstance(members, WriterConfig):
        return (f"{reads}, and the shards have no .cls members (the manifest records a pack "
                "with --no-wds-cls): repack with --wds-cls")
    have = members.other_exts.get("cls", 0)
    held = ("the shards have no .cls members" if not have else
            f"only {have} of the {members.num_samples} samples have a .cls member")
    return (f"{reads}, and {held} (packed with --no-wds-cls, or before .cls members were the "
            "pack default): repack with --wds-cls")


_NICE = {"timm": "timm", "dali": "DALI", "hf": "Hugging Face datasets"}


def write_pack_metadata(root: Path, manifest: dict[str, Any],
                        members: ShardMembers | None = None) -> list[Path]:
    """Writes the :data:`PACK_TOOLS` files (timm's ``_info.json``, DALI's ``.idx``) for the
    dataset being packed at ``root``; returns their paths.

    Called by :func:`shardkit.packer.run.pack` after the shards and split files, just before
    ``manifest.json`` (``root`` is ``OUT``, the staging folder of an overwrite, or the local
    staging folder of a pack into object storage). Returns ``[]`` for ``lmdb`` / ``hdf5``. A
    tool whose labels the shards lack (:func:`missing_for`) is left out with one INFO line on
    the ``shardkit.interop`` logger. ``members``: the shards' members, each shard scanned
    (:func:`shardkit.interop.shards.scan_shard`, with its DALI index) before it left ``root``
    (:mod:`shardkit.packer.outputs.remote` uploads and deletes every shard as it is closed); None
    scans the shards under ``root``.

    Raises:
        ShardCorruptError: the shards just written do not match the split index or the
            members the manifest records, or ``members`` does not cover the manifest's shards
            (a bug). OSError: from writing.
    """
    if manifest.get("format") != "wds":
        return []
    if members is not None:
        want = {dali_index_path(s["path"]) for info in manifest["splits"].values()
                for s in info["shards"]}
        packed = sum(info["num_samples"] for info in manifest["splits"].values())
        if set(members.dali_index) != want or members.num_samples != packed:
            raise ShardCorruptError(f"{root}: the scanned shards ({len(members.dali_index)}, "
                                    f"{members.num_samples} samples) are not the manifest's "
                                    f"({len(want)}, {packed} samples)")
    return _write(Path(root), manifest, PACK_TOOLS, strict=False, members=members)


def export(root: str | Path, tools: Iterable[str] = TOOLS) -> list[Path]:
    """Writes or refreshes the files of ``tools`` for the finished ``wds`` dataset at ``root``
    (any shardkit ``wds`` dataset, packed before or after this module existed); returns the
    written paths. Holds the pack lock of ``root`` meanwhile (a pack cannot swap the dataset
    underneath). DALI index files of shards the manifest no longer lists are removed.

    Raises:
        ConfigError: an unknown tool; a dataset of another format; shards without the labels a
            tool reads (:func:`missing_for`, nothing is written then); a ``README.md`` in
            ``root`` that shardkit did not write (``hf``). ManifestError: no finished dataset
            at ``root``, or a remote URL. ShardCorruptError: shards that do not match the
            split index, or lack (or hold) the members the manifest records
            (:class:`~shardkit.dataset.writer_config.WriterConfig`). OutputLockedError: a pack is writing to ``root``.
    """
    from shardkit.dataset.swap import BRIEF_WAIT_S, DatasetLock

    tools = tuple(dict.fromkeys(tools))
    unknown = [t for t in tools if t not in TOOLS]
    if unknown or not tools:
        raise ConfigError(f"tools {list(tools)}: expected one or more of {list(TOOLS)}")
    root = Path(local_path(root))
    manifest = manifest_mod.load_manifest(root)
    if manifest["format"] != "wds":
        raise ConfigError(f"{root} holds {manifest['format']!r} shards; only 'wds' (tar) shards "
                          "are read by timm, DALI or Hugging Face datasets: repack with "
                          "--format wds")
    card = root / CARD_NAME
    if "hf" in tools and card.exists() and CARD_MARKER not in card.read_text(errors="replace"):
        raise ConfigError(f"{card} exists and was not written by shardkit; move it away first "
                          "(shardkit does not replace files it did not write), or load without "
                          "a card: datasets.load_dataset(\"webdataset\", data_files={\"train\": "
                          f"\"{root}/shards/train-*.tar\", ...}})")
    with DatasetLock(root, "export", wait=BRIEF_WAIT_S, wait_for_pack=False):
        return _write(root, manifest, tools, strict=True)


def _write(root: Path, manifest: dict, tools: tuple[str, ...], strict: bool,
           members: ShardMembers | None = None) -> list[Path]:
    """Writes the files of ``tools``. Which tools the shards serve comes from the manifest's
    writer record when it has one (no shard is opened when none is served), else from the
    scan; the shards are scanned for what is written (DALI offsets, HF image types) and must
    hold the recorded members."""
    config = WriterConfig.from_manifest(manifest)
    recorded = config.tar_members() is not None
    if recorded:
        lacking = _lacking(root, tools, config, strict)
        if len(lacking) == len(tools):
            return []
    if members is None:
        members = scan(root, manifest, dali_index="dali" in tools)
    if recorded:
        _check_recorded_members(root, config, members)
    else:  # packed before the manifest recorded its writer: the tar headers tell
        lacking = _lacking(root, tools, members, strict)
    name = _dataset_name(root, manifest)
    names = tool_split_names(manifest["splits"])
    written: list[Path] = []
    if "timm" in tools and "timm" not in lacking:
        label_field = None if members.every_sample_has("cls") else "label"
        info = info_dict(manifest, name, {s: n for s, n in names.items() if s != n}, label_field)
        written.append(_put(root / "shards" / INFO_NAME,  # a non-UTF-8 name: \udcXX escapes
                            manifest_mod.json_bytes(info, indent=2) + b"\n"))
    if "dali" in tools and "dali" not in lacking:
        written += [_put(root / rel, text) for rel, text in members.dali_index.items()]
        _remove_stale_indexes(root, set(members.dali_index))
    if "hf" in tools and "hf" not in lacking:
        exts = sorted(members.image_exts, key=lambda e: (e != "jpg", e))
        written.append(_put(root / CARD_NAME, card_text(
            manifest, name, names, exts, members.every_sample_has("json"))))
    if written:
        logger.info("wrote the files of %s for %s (%d file(s))",
                    ", ".join(_NICE[t] for t in tools if t not in lacking), root, len(written))
    return written


def _lacking(root: Path, tools: tuple[str, ...], members: ShardMembers | WriterConfig,
             strict: bool) -> dict[str, str]:
    """``{tool: the label members it needs and the shards lack}`` (:func:`missing_for`), said
    in one INFO line; with ``strict`` a non-empty answer raises ConfigError instead."""
    lacking = {t: why for t in tools if (why := missing_for(t, members))}
    if strict and lacking:
        raise ConfigError(f"{root}: {_lacking_message(lacking, members)}")
    if lacking:
        logger.info("no reader files written for %s: %s", ", ".join(
            _NICE[t] for t in lacking), _lacking_message(lacking, members))
    return lacking


def _check_recorded_members(root: Path, config: WriterConfig, members: ShardMembers) -> None:
    """Raises ShardCorruptError when the scanned shards do not hold the tar members the
    manifest records for every sample (``.cls`` with ``wds_cls``, ``.json`` with
    ``wds_json``, and none of them otherwise): files written from the record would lie."""
    for option, ext in WDS_MEMBER_OPTIONS.items():
        want = config.every_sample_has(ext)
        have = members.other_exts.get(ext, 0)
        if have != (members.num_samples if want else 0):
            raise ShardCorruptError(
                f"{root}: the manifest records {option}={str(want).lower()}, and {have} of the "
                f"{members.num_samples} samples have a .{ext} member: the shards are not the "
                "ones this manifest describes (re-copy the dataset or re-pack it)")


def _put(path: Path, text: str | bytes) -> Path:
    atomic_write_bytes(path, text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def _remove_stale_indexes(root: Path, keep: set[str]) -> None:
    """Deletes ``shards/<split>-NNNNNN.idx`` files (shardkit's names) of shards not in ``keep``."""
    folder = root / "shards"
    for p in sorted(folder.iterdir()) if folder.is_dir() else ():
        if DALI_INDEX_NAME.fullmatch(p.name) and f"shards/{p.name}" not in keep and p.is_file():
            p.unlink()
            logger.info("removed %s: its shard is not in the manifest", p)


def _dataset_name(root: Path, manifest: dict) -> str:
    """The dataset's name: its source's (folder name, or the CSV list's name without ``.csv``),
    so the files do not depend on where ``OUT`` lies; ``OUT``'s name when the manifest has no
    source root."""
    source = manifest.get("source") or {}
    if source.get("root"):
        path = Path(source["root"])
        return path.stem if source.get("kind") == "csv" else path.name
    from shardkit.dataset.swap import STAGING_NAME

    root = root.resolve()
    return root.parent.name if root.name == STAGING_NAME else root.name
