"""The schema of a dataset's metadata, checked once where :mod:`shardkit.dataset.manifest` loads it.

A dataset folder is untrusted input (downloaded, copied over a flaky link, edited by hand), so
every field a reader uses is checked for type and range before any reader sees it: later code
never meets ``num_samples: "53"``, ``classes: "abcde"``, a shard path outside the dataset or a
``width`` of ``"abc"``. Fields shardkit does not read are left alone (forward compatibility).
The full schema is in ``docs/DESIGN.md``; the rules here:

* split names match :data:`SPLIT_NAME` (``[A-Za-z0-9_]+``, at most 128 characters), as pack
  writes them: they become file names (``splits/<split>.jsonl``);
* shard paths are relative posix paths of the characters ``[A-Za-z0-9._-]`` and ``/``, with no
  empty, ``.`` or ``..`` component (:func:`check_relative_path`), so every shard path resolves
  inside the dataset folder (lexically: a symlink inside the folder, such as a ``shards`` folder
  the user moved to another disk, is followed as the user made it) and joins onto a URL
  unchanged; no two shards share a path;
* counts are ints (never bool) in range, hashes lowercase hex of the right length, class names
  a list of distinct non-empty strings;
* the ``writer`` section, when present (:mod:`shardkit.dataset.writer_config`; absent in
  datasets packed before it existed), holds every field pack writes, of the right type: the
  members of a ``wds`` sample (``options.wds_cls``, ``options.wds_json``) are read from it.

Every violation raises :class:`~shardkit.errors.ManifestError` naming the file, the field (as
``splits['train'].shards[3].path``), its value as JSON and its type, and what was expected,
e.g. ``manifest.json: field splits['train'].num_samples is "53" (str); expected an int in
[0, 1099511627776]``.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable

from shardkit.dataset.writer_config import WDS_MEMBER_OPTIONS
from shardkit.errors import ManifestError
from shardkit.validate import is_int

__all__ = ["MANIFEST_NAME", "FORMATS", "SPLIT_NAME", "KEY", "MAX_SAMPLES", "MAX_DIMENSION", "MAX_INT64",
           "RECORD_INDEX_FIELDS", "WRITER_REQUIRED_OPTIONS",
           "check_manifest", "check_split_name", "check_relative_path", "check_record"]

#: The manifest's file name in a dataset folder (``OUT/manifest.json``); also
#: :data:`shardkit.dataset.manifest.MANIFEST_NAME`.
MANIFEST_NAME = "manifest.json"
#: Shard formats a manifest may name (``shardkit.formats.FORMATS``; not imported here, which
#: would be an import running back up: the formats import :mod:`shardkit.dataset.manifest`).
FORMATS = ("hdf5", "lmdb", "wds")
#: Split names: they become file names, ``splits/<split>.jsonl``.
SPLIT_NAME = re.compile(r"[A-Za-z0-9_]{1,128}")
#: Sample keys (pack writes ``f"{split}_{i:08d}"``): no dot, no path separator.
KEY = re.compile(r"[A-Za-z0-9_-]{1,255}")
_PATH_PART = re.compile(r"[A-Za-z0-9_.-]{1,255}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: Largest sample count of a split or shard (2**40: far above any dataset, far below int64).
MAX_SAMPLES = 1 << 40
#: Largest image side in a record (pixels): PNG's limit, 2**31 - 1.
MAX_DIMENSION = (1 << 31) - 1
#: Largest byte count or offset (the index holds them as int64).
MAX_INT64 = (1 << 63) - 1
#: Fields every record of ``splits/<split>.jsonl`` holds (the index holds the same).
RECORD_INDEX_FIELDS = ("key", "label", "shard", "offset", "size")


def _show(value) -> str:
    """``value`` as JSON (at most 60 characters) and its JSON type, for an error message."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = {dict: "object", list: "array", str: "str", bool: "bool", int: "int", float: "float",
            type(None): "null"}.get(type(value), type(value).__name__)
    return f"{text} ({kind})"


def _fail(where: str, field: str, value, expected: str):
    raise ManifestError(f"{where}: field {field} is {_show(value)}; expected {expected}")


def _missing(where: str, field: str, expected: str):
    raise ManifestError(f"{where}: required field {field} is missing; expected {expected}")


def _int(where, field, value, lo: int = 0, hi: int | None = None) -> int:
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        _fail(where, field, value, f"an int >= {lo}" if hi is None else
              f"an int in [{lo}, {hi}]")
    return value


def _opt_int(where, field, value, lo: int = 0, hi: int | None = None) -> None:
    if value is not None:
        _int(where, field, value, lo, hi)


def _number(where, field, value) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)):
        _fail(where, field, value, "a finite number")


def _opt_number(where, field, value) -> None:
    if value is not None:
        _number(where, field, value)


def _str(where, field, value, nonempty: bool = False) -> str:
    if not isinstance(value, str) or (nonempty and not value):
        _fail(where, field, value, "a non-empty str" if nonempty else "a str")
    return value


def _hex(where, field, value, digits: int) -> None:
    if not (isinstance(value, str) and (_HEX16 if digits == 16 else _HEX64).fullmatch(value)):
        _fail(where, field, value, f"{digits} lowercase hex digits")


def _dict(where, field, value, nullable: bool = True) -> dict:
    """``value`` when it is an object; ``{}`` for null when ``nullable``."""
    if value is None and nullable:
        return {}
    if not isinstance(value, dict):
        _fail(where, field, value, "an object" + (" or null" if nullable else ""))
    return value


def _list(where, field, value) -> list:
    if not isinstance(value, list):
        _fail(where, field, value, "an array")
    return value


def _str_map(where, field, value) -> None:
    for k, v in _dict(where, field, value).items():
        _str(where, f"{field}[{k!r}]", v)


def check_split_name(split, where: str = "split name") -> str:
    """``split`` when it is a valid split name (:data:`SPLIT_NAME`), else ManifestError naming
    ``where`` (a split name becomes the file name ``splits/<split>.jsonl``)."""
    if not (isinstance(split, str) and SPLIT_NAME.fullmatch(split)):
        raise ManifestError(f"{where}: split name {_show(split)} is not a valid split name "
                            "(1-128 of the characters A-Z a-z 0-9 _)")
    return split


def check_relative_path(where: str, field: str, value) -> str:
    """``value`` when it is a safe relative posix path (the module docstring's rule), else
    ManifestError naming the field: an absolute path, a ``..`` component, a backslash or any
    other character would let a dataset name a file outside its folder."""
    parts = value.split("/") if isinstance(value, str) and len(value) <= 4096 else None
    if not parts or not all(_PATH_PART.fullmatch(p) and p not in (".", "..") for p in parts):
        _fail(where, field, value, "a relative path inside the dataset folder (components of "
              "A-Z a-z 0-9 . _ -, separated by '/'; no absolute path, no '.' or '..')")
    return value


def check_manifest(manifest: dict, where: str) -> None:
    """Checks every field of a ``manifest.json`` object that shardkit reads (``where``: the
    file, for messages). ``schema_version`` is checked by the caller.

    Raises:
        ManifestError: the first field that breaks the schema, named with its value.
    """
    fmt = manifest.get("format")
    if fmt not in FORMATS:
        _fail(where, "format", fmt, f"one of {list(FORMATS)}")
    if "classes" not in manifest:
        _missing(where, "classes", "a list of class names")
    classes = _list(where, "classes", manifest["classes"])
    if not classes:
        _fail(where, "classes", classes, "at least one class name")
    seen: set[str] = set()
    for i, name in enumerate(classes):
        _str(where, f"classes[{i}]", name, nonempty=True)
        if name in seen:
            _fail(where, f"classes[{i}]", name, "distinct class names (this one is repeated)")
        seen.add(name)
    if manifest.get("created_by") is not None:
        _str(where, "created_by", manifest["created_by"])
    _str_map(where, "label_aliases", manifest.get("label_aliases"))
    if "splits" not in manifest:
        _missing(where, "splits", "an object of split name -> split entry")
    splits = _dict(where, "splits", manifest["splits"], nullable=False)
    if not splits:
        _fail(where, "splits", splits, "at least one split")
    paths: dict[str, str] = {}
    for split, entry in splits.items():
        check_split_name(split, f"{where}: splits")
        _check_split_entry(where, f"splits[{split!r}]", entry, len(classes), paths)
    _check_normalization(where, manifest.get("normalization"))
    if "writer" in manifest:  # absent in datasets packed before it existed
        _check_writer(where, manifest["writer"], fmt, manifest.get("normalization"))
    _check_stats(where, manifest.get("stats"))
    near = _dict(where, "split", manifest.get("split")).get("near_duplicates")
    mode = _dict(where, "split.near_duplicates", near).get("mode")
    if mode is not None:
        _str(where, "split.near_duplicates.mode", mode)
    source = _dict(where, "source", manifest.get("source"))
    for name in ("root", "kind"):
        if source.get(name) is not None:
            _str(where, f"source.{name}", source[name])
    for i, item in enumerate(_list(where, "source.degenerate", source.get("degenerate", []))):
        _str(where, f"source.degenerate[{i}].path",
             _dict(where, f"source.degenerate[{i}]", item, nullable=False).get("path"))
        _str(where, f"source.degenerate[{i}].reason", item.get("reason"))


def _check_split_entry(where, field, entry, num_classes: int, paths: dict[str, str]) -> None:
    entry = _dict(where, field, entry, nullable=False)
    for name in ("num_samples", "shards"):
        if name not in entry:
            _missing(where, f"{field}.{name}", "the split's sample count and shard list")
    _int(where, f"{field}.num_samples", entry["num_samples"], 0, MAX_SAMPLES)
    if "class_counts" in entry:
        counts = _list(where, f"{field}.class_counts", entry["class_counts"])
        if len(counts) != num_classes:
            _fail(where, f"{field}.class_counts", counts, f"{num_classes} counts, one per class")
        for i, c in enumerate(counts):
            _int(where, f"{field}.class_counts[{i}]", c, 0, MAX_SAMPLES)
    if "num_groups" in entry:
        _int(where, f"{field}.num_groups", entry["num_groups"], 0, MAX_SAMPLES)
    for name in ("index_sha256", "records_sha256"):
        if name in entry:
            _hex(where, f"{field}.{name}", entry[name], 64)
    for i, shard in enumerate(_list(where, f"{field}.shards", entry["shards"])):
        at = f"{field}.shards[{i}]"
        shard = _dict(where, at, shard, nullable=False)
        for name in ("path", "num_samples", "bytes", "sha256"):
            if name not in shard:
                _missing(where, f"{at}.{name}", "path, num_samples, bytes and sha256 of a shard")
        path = check_relative_path(where, f"{at}.path", shard["path"])
        if path in paths:
            _fail(where, f"{at}.path", path, f"a path of its own (also {paths[path]})")
        paths[path] = at
        _int(where, f"{at}.num_samples", shard["num_samples"], 0, MAX_SAMPLES)
        _int(where, f"{at}.bytes", shard["bytes"], 0, MAX_INT64)
        _hex(where, f"{at}.sha256", shard["sha256"], 64)


def _check_normalization(where, value) -> None:
    norm = _dict(where, "normalization", value)
    _opt_int(where, "normalization.max_pixels", norm.get("max_pixels"), 1)
    _opt_int(where, "normalization.max_side", norm.get("max_side"), 1)
    _opt_int(where, "normalization.jpeg_quality", norm.get("jpeg_quality"), 1, 100)
    if "strict" in norm and not isinstance(norm["strict"], bool):
        _fail(where, "normalization.strict", norm["strict"], "true or false")
    _str_map(where, "normalization.rules", norm.get("rules"))
    for rule, n in _dict(where, "normalization.transcoded", norm.get("transcoded")).items():
        _int(where, f"normalization.transcoded[{rule!r}]", n, 0)


#: Writer options a manifest's ``writer.options`` must hold, per format (bools): what a reader
#: needs to know a shard's layout without opening it (the tar members of a ``wds`` sample).
WRITER_REQUIRED_OPTIONS = {"wds": tuple(WDS_MEMBER_OPTIONS)}


def _check_writer(where, value, fmt: str, normalization) -> None:
    """The ``writer`` section (:mod:`shardkit.dataset.writer_config`): ``options`` an object of
    JSON scalars holding :data:`WRITER_REQUIRED_OPTIONS` as bools; ``max_side`` null or an int
    >= 1 (equal to ``normalization.max_side`` when that is recorded), ``jpeg_quality`` an int
    in [1, 100], ``shard_samples`` and ``shard_bytes`` null or ints >= 1."""
    section = _dict(where, "writer", value, nullable=False)
    for name in ("options", "max_side", "jpeg_quality", "shard_samples", "shard_bytes"):
        if name not in section:
            _missing(where, f"writer.{name}", "the writer's options as pack records them "
                     "(docs/DESIGN.md)")
    options = _dict(where, "writer.options", section["options"], nullable=False)
    for name, option in options.items():
        if not (option is None or isinstance(option, (str, bool, int))
                or (isinstance(option, float) and math.isfinite(option))):
            _fail(where, f"writer.options[{name!r}]", option, "a JSON scalar (a keyword "
                  "argument of the format's Writer)")
    for name in WRITER_REQUIRED_OPTIONS.get(fmt, ()):
        if name not in options:
            _missing(where, f"writer.options[{name!r}]", f"true or false (the {fmt} writer's "
                     "option)")
        if not isinstance(options[name], bool):
            _fail(where, f"writer.options[{name!r}]", options[name], "true or false")
    _opt_int(where, "writer.max_side", section["max_side"], 1, MAX_DIMENSION)
    _int(where, "writer.jpeg_quality", section["jpeg_quality"], 1, 100)
    _opt_int(where, "writer.shard_samples", section["shard_samples"], 1, MAX_SAMPLES)
    _opt_int(where, "writer.shard_bytes", section["shard_bytes"], 1, MAX_INT64)
    norm = normalization if isinstance(normalization, dict) else {}
    if "max_side" in norm and norm["max_side"] != section["max_side"]:
        _fail(where, "writer.max_side", section["max_side"], f"the max_side of normalization "
              f"({_show(norm['max_side'])}): one pack, one --max-side")


def _check_stats(where, value) -> None:
    for split, stats in _dict(where, "stats", value).items():
        at = f"stats[{split!r}]"
        stats = _dict(where, at, stats)
        for name in ("mean", "std"):
            if name in stats:
                values = _list(where, f"{at}.{name}", stats[name])
                if len(values) != 3:
                    _fail(where, f"{at}.{name}", values, "3 numbers (R, G, B)")
                for i, v in enumerate(values):
                    _number(where, f"{at}.{name}[{i}]", v)
        _opt_int(where, f"{at}.num_samples", stats.get("num_samples"), 0)
        hue = _dict(where, f"{at}.hue", stats.get("hue"))
        for name in ("eta2", "eta2_p"):
            _opt_number(where, f"{at}.hue.{name}", hue.get(name))
        for name, c in _dict(where, f"{at}.hue.classes", hue.get("classes")).items():
            c = _dict(where, f"{at}.hue.classes[{name!r}]", c, nullable=False)
            for f in ("mean_hue_deg", "concentration"):
                _opt_number(where, f"{at}.hue.classes[{name!r}].{f}", c.get(f))
            _opt_int(where, f"{at}.hue.classes[{name!r}].num_samples", c.get("num_samples"), 0)


def _hex16_or_null(where, field, value) -> None:
    if value is not None:
        _hex(where, field, value, 16)


def _str_list(where, field, value) -> None:
    for i, v in enumerate(_list(where, field, value)):
        _str(where, f"{field}[{i}]", v)


def _dimension(where, field, value) -> None:
    _int(where, field, value, 1, MAX_DIMENSION)


#: field of a split record -> checker(where, field, value); fields not listed are not read.
_RECORD_CHECKS = {
    "key": lambda w, f, v: v if isinstance(v, str) and KEY.fullmatch(v) else _fail(
        w, f, v, "a sample key (1-255 of A-Z a-z 0-9 _ -)"),
    "offset": lambda w, f, v: _int(w, f, v, 0, MAX_INT64),
    "size": lambda w, f, v: _int(w, f, v, 1, MAX_INT64),
    "sha256": lambda w, f, v: _hex(w, f, v, 64),
    "xxh3": lambda w, f, v: _hex(w, f, v, 16),
    "phash": _hex16_or_null,
    "path": _str, "group": _str, "rule": _str, "ext": _str,
    "width": _dimension, "height": _dimension,
    "original_width": _dimension, "original_height": _dimension,
    "warnings": _str_list,
}


def check_record(record, where: str, num_classes: int, num_shards: int,
                 required: Iterable[str] = RECORD_INDEX_FIELDS) -> dict:
    """Checks one record of ``splits/<split>.jsonl`` (``where``: file and line, for messages):
    a JSON object holding ``required`` (default :data:`RECORD_INDEX_FIELDS`), every known field
    of the right type and range (``label`` in ``[0, num_classes)``, ``shard`` in
    ``[0, num_shards)``, ``width``/``height`` ints in ``[1, 2**31 - 1]``, ...). Returns it.

    Raises:
        ManifestError: naming the field and its value.
    """
    if not isinstance(record, dict):
        raise ManifestError(f"{where}: is {_show(record)}; expected a JSON object (a record)")
    for name in required:
        if name not in record:
            _missing(where, name, "the fields of docs/DESIGN.md (key, label, shard, offset, "
                     "size, ...)")
    for name, value in record.items():
        check = _RECORD_CHECKS.get(name)
        if check is not None:
            check(where, name, value)
    if "label" in record and not (is_int(record["label"]) and 0 <= record["label"] < num_classes):
        _fail(where, "label", record["label"], f"a class number in [0, {num_classes}) (the "
              "manifest's classes)")
    if "shard" in record:
        if num_shards == 0 or not is_int(record["shard"]) or not \
                0 <= record["shard"] < num_shards:
            _fail(where, "shard", record["shard"], f"a shard number in [0, {num_shards}) (the "
                  "split's shards in the manifest)")
    return record
