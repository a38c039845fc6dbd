"""Whether the reader files beside a ``wds`` dataset still describe its shards (``shardkit verify``).

timm, DALI and Hugging Face read a dataset through the files :mod:`shardkit.interop` writes; a
stale copy (an ``.idx`` or ``_info.json`` copied in from another pack, a dataset re-packed
without them) makes those tools read wrong offsets, miss shards or mislabel samples while
shardkit's own reads stay right. :func:`check_reader_files` compares each file that is there
with the one shardkit would write now:

- DALI ``shards/<split>-NNNNNN.idx``: equal to the index regenerated from its tar's headers
  (:func:`shardkit.interop.shards.scan_shard`; in object storage, where shards are not scanned,
  every sample's line must hold its image member at the split index's offset and size). A
  shard without its ``.idx`` while others have one, and a shardkit-named ``.idx`` whose shard
  the manifest does not list (DALI and glob one-liners would take it), are problems too (not
  over ``http(s)://``, where folders cannot be listed: each shard's ``.idx`` is fetched instead);
- timm ``shards/_info.json``: the number of classes and each split's sample count, shard files
  and shard lengths (and the ``alt_label`` field, when every shard could be scanned or the
  manifest records the writer's options: :class:`~shardkit.dataset.writer_config.WriterConfig`);
- the Hugging Face card ``README.md``, when shardkit wrote it: its YAML block's ``configs``
  (the split's shard files) and, when every shard could be scanned, its ``features``.

A dataset packed before these files existed has none of them: nothing is reported. Damage to
the shards, split files or index themselves is :func:`shardkit.doctor.verify.verify`'s finding; a
shard or split that cannot be read is skipped here (verify names it).
"""
from __future__ import annotations

import json
import posixpath
from pathlib import Path

import yaml

from shardkit.dataset import manifest as manifest_mod
from shardkit.dataset.writer_config import WriterConfig
from shardkit.storage.urls import is_url, join, local_path, read_location
from shardkit.errors import ShardkitError
from shardkit.interop.hf_card import CARD_MARKER, CARD_NAME, card_text
from shardkit.interop.shards import (DALI_INDEX_NAME, DALI_INDEX_VERSION, ShardMembers,
                                     dali_index_path, scan_shard)
from shardkit.interop.timm_info import INFO_NAME, info_dict

__all__ = ["check_reader_files"]



class _Store:
    """Reads the dataset's small files, local or in object storage."""

    def __init__(self, root):
        self.remote = is_url(root)
        self.root = str(root).rstrip("/") if self.remote else Path(local_path(root))
        self.fs = self.base = None
        self.listable = True
        if self.remote:
            import fsspec

            self.fs, self.base = fsspec.core.url_to_fs(self.root)
            protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) \
                else (self.fs.protocol,)
            self.listable = not {"http", "https"} & set(protocols)  # a web server need not list

    def hint(self, tool: str) -> str:
        """How to rewrite the files of ``tool``."""
        if self.remote:
            return ("a `shardkit pack --overwrite` into its URL rewrites it (export writes into "
                    "a local dataset folder)")
        return f"`shardkit export {self.root} --to {tool}` rewrites it"

    def read_text(self, rel: str) -> str | None:
        """The file's text (undecodable bytes replaced), None when it does not exist."""
        try:
            data = read_location(join(self.root, rel))
        except FileNotFoundError:
            return None
        return data.decode("utf-8", "replace")

    def names(self, folder: str) -> list[str]:
        """File names in ``folder`` (relative to the root); [] when it does not exist."""
        if not self.remote:
            path = self.root / folder
            return sorted(p.name for p in path.iterdir() if p.is_file()) if path.is_dir() else []
        path = posixpath.join(self.base, folder)
        self.fs.invalidate_cache(path)  # the store now, not an earlier listing
        try:
            found = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(str(p).rstrip("/")) for p in found)


def check_reader_files(root, manifest: dict | None = None) -> list[str]:
    """Problems of the timm, DALI and Hugging Face files beside the ``wds`` dataset at ``root``
    (a folder or an object-store URL), one line each naming the file; ``[]`` when every file
    that is there matches (see the module docstring), or for ``lmdb`` / ``hdf5``.

    Raises:
        ManifestError: ``manifest.json`` cannot be read (when ``manifest`` is None). OSError
            or the store's own error: a file cannot be read or listed.
    """
    store = _Store(root)
    if manifest is None:
        manifest = manifest_mod.load_manifest(store.root)
    if manifest.get("format") != "wds":
        return []
    problems: list[str] = []
    members, complete = _check_dali(store, manifest, problems)
    _check_timm(store, manifest, members if complete else None, problems)
    _check_card(store, manifest, members if complete else None, problems)
    return problems


def _check_dali(store: _Store, manifest: dict, problems: list[str]
                ) -> tuple[ShardMembers, bool]:
    """Compares every ``.idx``; returns the members of the scanned shards and whether every
    shard was scanned."""
    members, complete = ShardMembers(), not store.remote
    expected: list[str] = []
    present: set[str] = set()
    for folder in sorted({posixpath.dirname(dali_index_path(s["path"]))
                          for info in manifest["splits"].values() for s in info.get("shards", [])}
                         | {"shards"}) if store.listable else ():
        present |= {posixpath.join(folder, n) for n in store.names(folder)
                    if DALI_INDEX_NAME.fullmatch(n)}
    for split, info in manifest["splits"].items():
        try:
            index = manifest_mod.load_index(store.root, split, manifest)
        except ShardkitError:
            complete = False  # verify names the split; its .idx files are not leftovers
            expected.extend(dali_index_path(s["path"]) for s in info.get("shards", []))
            continue
        for k, shard in enumerate(info.get("shards", [])):
            rel = dali_index_path(shard["path"])
            expected.append(rel)
            rows = (index.shard == k).nonzero()[0]
            keys = [index.key_at(int(i)) for i in rows]
            offsets, sizes = index.offset[rows], index.size[rows]
            have = store.read_text(rel) if rel in present or not store.listable else None
            if store.remote:
                if have is not None and (why := _idx_disagrees(have, keys, offsets, sizes)):
                    problems.append(f"{rel}: {why}, not those of {shard['path']} (a stale "
                                    f"index from another pack?); {store.hint('dali')}")
                continue
            try:
                scanned = scan_shard(store.root / shard["path"], shard["path"], keys, offsets,
                                     sizes, dali_index=True)
            except (ShardkitError, OSError):
                complete = False  # a missing or damaged shard: verify names it
                continue
            members.update(scanned)
            if have is not None and have != scanned.dali_index[rel]:
                problems.append(f"{rel} does not match {shard['path']}: "
                                f"{_first_difference(have, scanned.dali_index[rel])} (a stale "
                                f"index from another pack?); {store.hint('dali')}")
    if present:
        for rel in expected:
            if rel not in present:
                problems.append(f"{rel} is missing while other shards have their DALI index; "
                                f"{store.hint('dali')}")
    for rel in sorted(present - set(expected)):
        problems.append(f"{rel}: no shard of the manifest has this DALI index (a leftover of "
                        "another pack: readers that glob shards/*.idx take it); delete it"
                        + ("" if store.remote else
                           f" (`shardkit export {store.root} --to dali` removes such files)"))
    return members, complete


def _idx_disagrees(text: str, keys, offsets, sizes) -> str | None:
    """Why a DALI index does not fit the split index's rows of its shard (None: it fits)."""
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] != DALI_INDEX_VERSION or not head[1].isdigit():
        return f"its first line is {lines[0][:40] if lines else ''!r}, not " \
               f"'{DALI_INDEX_VERSION} <samples>'"
    if int(head[1]) != len(keys) or len(lines) - 1 != len(keys):
        return f"it lists {head[1]} samples in {len(lines) - 1} lines, the split index {len(keys)}"
    order = sorted(range(len(keys)), key=lambda i: int(offsets[i]))
    for line_no, i in enumerate(order, 2):
        fields = lines[line_no - 1].split()
        entries = {(int(fields[j + 1]), int(fields[j + 2]), fields[j + 3])
                   for j in range(0, len(fields) - 3, 4)
                   if fields[j + 1].isdigit() and fields[j + 2].isdigit()}
        if not any(o == int(offsets[i]) and s == int(sizes[i]) and n.startswith(f"{keys[i]}.")
                   for o, s, n in entries):
            return (f"line {line_no} has no member of sample {keys[i]!r} at offset "
                    f"{int(offsets[i])} with {int(sizes[i])} bytes")
    return None


def _first_difference(have: str, want: str) -> str:
    a, b = have.splitlines(), want.splitlines()
    for n, (x, y) in enumerate(zip(a, b), 1):
        if x != y:
            return f"line {n} is {x[:60]!r}, the tar gives {y[:60]!r}"
    return f"{len(a)} lines, the tar gives {len(b)}"


def _check_timm(store: _Store, manifest: dict, members: ShardMembers | None,
                problems: list[str]) -> None:
    rel = f"shards/{INFO_NAME}"
    text = store.read_text(rel)
    if text is None:
        return
    try:
        have = json.loads(text)
        have_splits = have["splits"]
        if not isinstance(have_splits, dict):
            raise TypeError("splits is not an object")
    except (ValueError, KeyError, TypeError) as e:
        problems.append(f"{rel} is not timm's split file ({type(e).__name__}: {e}); "
                        + store.hint("timm"))
        return
    from shardkit.interop import tool_split_names

    names = tool_split_names(manifest["splits"])
    members = _members_known(manifest, members)
    label = (None if members.every_sample_has("cls") else "label") if members is not None \
        else None
    want = info_dict(manifest, "", {s: n for s, n in names.items() if s != n}, label)
    fields = ("name", "num_samples", "filenames", "shard_lengths")
    if members is not None:
        fields += ("alt_label",)
    if have.get("num_classes") != want["num_classes"]:
        problems.append(f"{rel} says {have.get('num_classes')!r} classes, the manifest "
                        f"{want['num_classes']}; " + store.hint("timm"))
    for split in sorted(set(want["splits"]) | set(have_splits)):
        got, exp = have_splits.get(split), want["splits"].get(split)
        if exp is None or got is None:
            problems.append(f"{rel} {'lists' if exp is None else 'lacks'} split {split!r}, "
                            f"which the manifest {'does not have' if exp is None else 'has'} "
                            "(or has empty); " + store.hint("timm"))
            continue
        wrong = [f for f in fields if (got.get(f) if isinstance(got, dict) else None)
                 != exp.get(f)]
        if wrong:
            problems.append(f"{rel}: split {split!r} has other {', '.join(wrong)} than the "
                            "manifest (a copy from another pack?); " + store.hint("timm"))


def _members_known(manifest: dict, members: ShardMembers | None
                   ) -> ShardMembers | WriterConfig | None:
    """What tells which members every sample has: the scanned ``members`` when every shard was
    scanned, else the manifest's writer record (object storage, a damaged shard), else None."""
    if members is not None:
        return members
    config = WriterConfig.from_manifest(manifest)
    return config if config.tar_members() is not None else None


def _front_matter(text: str) -> dict | None:
    """The YAML block at the top of a card (None: none, or not a mapping)."""
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---\n", 4)
    if end < 0:
        return None
    meta = yaml.safe_load(text[4:end])
    return meta if isinstance(meta, dict) else None


def _check_card(store: _Store, manifest: dict, members: ShardMembers | None,
                problems: list[str]) -> None:
    text = store.read_text(CARD_NAME)
    if text is None or CARD_MARKER not in text:
        return  # no card, or the user's own README.md
    hint = store.hint("hf")
    try:
        have = _front_matter(text)
    except yaml.YAMLError as e:
        problems.append(f"{CARD_NAME}: its YAML block cannot be read ({type(e).__name__}); {hint}")
        return
    from shardkit.interop import tool_split_names

    exts = sorted(members.image_exts, key=lambda e: (e != "jpg", e)) if members else ["jpg"]
    want = _front_matter(card_text(manifest, "", tool_split_names(manifest["splits"]), exts,
                                   bool(members and members.every_sample_has("json"))))
    if have is None:
        problems.append(f"{CARD_NAME} has no YAML block; {hint}")
        return
    if have.get("configs") != want["configs"]:
        problems.append(f"{CARD_NAME}: its data_files are not the manifest's splits and shards "
                        f"(Hugging Face datasets would read other files); {hint}")
    if members is not None and (have.get("dataset_info") or {}).get("features") != \
            want["dataset_info"]["features"]:
        problems.append(f"{CARD_NAME}: its features (columns, class names) are not those of the "
                        f"manifest and shards; {hint}")
