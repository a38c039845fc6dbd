"""The Hugging Face dataset card ``OUT/README.md``: ``datasets.load_dataset(OUT)`` reads the shards.

``datasets`` reads the YAML block at the top of a local folder's ``README.md``: ``configs``
(``data_files`` per split: the split's tar shards, listed by name) makes it use its
``webdataset`` builder on exactly those files, and ``dataset_info.features`` gives the columns'
types, so the ``cls`` column is a ``ClassLabel`` with the manifest's class names (label ``i`` is
``classes[i]``) instead of a bare integer. Formats: the Hub's dataset card metadata
(``configs``, ``dataset_info``; ``datasets.Features._to_yaml_list`` for the features) and the
``webdataset`` builder of ``datasets`` (``packaged_modules/webdataset``: one column per member
extension, ``__key__`` and ``__url__`` besides, a member a sample lacks is ``None``).

Columns: ``__key__`` (the shardkit key, str), ``__url__`` (the shard file, str), one image
column per stored image extension (``jpg``, ``png``: a dataset holding both has both columns, one
of them ``None`` in each row), ``cls`` (ClassLabel) and, for shards packed with ``--wds-json``,
``json`` (struct ``class``, ``key``, ``label``, ``path``). Split names: ``val`` is published as
``validation`` (the name ``datasets`` and the Hub use), others keep their names; empty splits
are left out. The body under the YAML block says what the dataset holds and how to load it.
"""
from __future__ import annotations

import yaml

from shardkit.cli_common import printable_text

__all__ = ["CARD_NAME", "CARD_MARKER", "card_text", "features_yaml"]

CARD_NAME = "README.md"
CARD_MARKER = "<!-- shardkit dataset card: written from manifest.json by shardkit -->"
"""Line that marks a card shardkit wrote (``shardkit export`` replaces only such a card)."""

JSON_FIELDS = (("class", "string"), ("key", "string"), ("label", "int64"), ("path", "string"))
"""The ``.json`` member's fields (:class:`shardkit.formats.wds.Writer`) and their HF types."""


def features_yaml(classes: list[str], image_exts: list[str], with_json: bool) -> list[dict]:
    """``dataset_info.features`` as the list ``datasets`` reads from a card (column order:
    ``__key__``, ``__url__``, image columns, ``cls``, ``json``)."""
    features = [{"name": "__key__", "dtype": "string"}, {"name": "__url__", "dtype": "string"}]
    features += [{"name": ext, "dtype": "image"} for ext in image_exts]
    features.append({"name": "cls", "dtype": {"class_label": {
        "names": {str(i): name for i, name in enumerate(classes)}}}})
    if with_json:
        features.append({"name": "json", "struct": [{"name": n, "dtype": t}
                                                    for n, t in JSON_FIELDS]})
    return features


def card_text(manifest: dict, name: str, split_names: dict[str, str], image_exts: list[str],
              with_json: bool) -> str:
    """The whole ``README.md``: YAML metadata block, then a short description. Text that is
    not valid Unicode (a class or dataset name from a folder name that is not UTF-8, read as
    lone surrogates) is written as its bytes' ``\\xNN`` escapes, as the ``class`` field of the
    ``.json`` members, so the card is UTF-8 and ``cls`` names match those fields.

    Args:
        manifest: the dataset's manifest. name: the dataset's name (the card's title).
        split_names: ``{shardkit split: HF split name}`` for every split.
        image_exts: the image extensions the shards hold (``["jpg"]``, ``["jpg", "png"]``).
        with_json: the shards have ``.json`` members.
    """
    name = printable_text(name)  # a name from a non-UTF-8 folder: its bytes as \xNN
    classes = [printable_text(str(c)) for c in manifest["classes"]]
    splits = {s: info for s, info in manifest["splits"].items() if info["num_samples"]}
    meta = {
        "pretty_name": name,
        "task_categories": ["image-classification"],
        "size_categories": [_size_category(sum(i["num_samples"] for i in splits.values()))],
        "configs": [{"config_name": "default", "data_files": [
            {"split": split_names[s], "path": [sh["path"] for sh in info["shards"]]}
            for s, info in splits.items()]}],
        "dataset_info": {  # no "splits": datasets wants their Arrow num_bytes there
            "features": features_yaml(classes, image_exts, with_json)},
    }
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1000)
    empty = [s for s, info in manifest["splits"].items() if not info["num_samples"]]
    images = ", ".join(f"`{e}`" for e in image_exts)
    images += (" (images; each row has one of them, the others are None)"
               if len(image_exts) > 1 else " (the image)")
    lines = [
        "---", front.rstrip("\n"), "---", CARD_MARKER, "", f"# {name}", "",
        f"Image classification shards written by {manifest.get('created_by', 'shardkit')} "
        "(format `wds`: plain tar files holding a `<key>.<ext>` image and a `<key>.cls` label "
        "per sample). This card is derived from `manifest.json`, the dataset's source of "
        "truth: `shardkit export . --to hf` rewrites it, so edits here are lost.", "",
        f"{len(classes)} classes (label `i` is the `i`-th): "
        + ", ".join(f"`{c}`" for c in classes) + ".", "",
        "| split (Hugging Face) | split (shardkit) | samples | shards |", "|---|---|---|---|",
        *(f"| `{split_names[s]}` | `{s}` | {info['num_samples']} | {len(info['shards'])} |"
          for s, info in splits.items()), "",
        *([f"Empty splits, left out: {', '.join(empty)}.", ""] if empty else []),
        "Columns: `__key__` (the shardkit sample key, as in `splits/<split>.jsonl`), "
        f"`__url__` (the shard file), {images}, `cls` (the class label)"
        + (", `json` (key, label, class, source path)." if with_json else "."), "",
        "```python", "from datasets import load_dataset",
        'ds = load_dataset("path/to/this/folder")  # DatasetDict: '
        + ", ".join(split_names[s] for s in splits), "```", "",
        "Other readers: timm (`shards/_info.json`), NVIDIA DALI (`shards/*.idx`), webdataset "
        "and shardkit itself; see shardkit's README, \"Reading shardkit shards with other "
        "tools\".",
    ]
    return printable_text("\n".join(lines) + "\n")  # split and file names are shardkit's


def _size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket of ``n`` samples (``n<1K``, ``1K<n<10K``, ...)."""
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
              (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")]
    return next((label for bound, label in bounds if n < bound), "100M<n<1B")
