"""Every option of one pack: :class:`PackOptions`, validated once, and :func:`parse_size`."""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import shardkit.packer.shards as pack_shards
from shardkit.errors import ConfigError
from shardkit.validate import check_int, is_int
from shardkit.sources.layouts import LAYOUTS
from shardkit.sources.groups import compile_group_regex
from shardkit.packer.assign import SPLIT_METHODS, parse_split_spec, validate_ratios


__all__ = ["PackOptions", "parse_size", "LABEL_CONFLICT_POLICIES", "NEAR_DUPLICATE_MODES",
           "ENGINES", "DEFAULT_SPLIT", "KNOWN_SPLIT_NAMES", "DEFAULT_SHARD_BYTES"]

logger = logging.getLogger("shardkit.pack")

LABEL_CONFLICT_POLICIES = ("error", "quarantine", "keep")
NEAR_DUPLICATE_MODES = ("merge", "report", "off")
ENGINES = ("local", "ray")
"""Where the per-file check (step 3) and the shard writes (step 6) run: this machine's processes,
or Ray tasks (``pip install shardkit[ray]``; :mod:`shardkit.ray`)."""
DEFAULT_SPLIT = {"train": 0.8, "val": 0.1, "test": 0.1}
"""Split ratios when none are given."""
KNOWN_SPLIT_NAMES = ("train", "val", "test")
"""Split names that ``shardkit train`` uses by default; other names get a warning."""
DEFAULT_SHARD_BYTES = pack_shards.DEFAULT_SHARD_BYTES
"""Largest average shard of the default shard plan (256 MiB; see :class:`PackOptions`)."""


@dataclass(frozen=True)
class PackOptions:
    """Every option of one :func:`pack` run, validated once, here (``None`` = unset).

    Built from keyword arguments (``pack(src, out, format="lmdb", ...)``), directly
    (``pack(src, out, options=PackOptions(...))``), or by ``shardkit pack`` from its flags.
    Construction resolves ``split`` to the ``{name: fraction}`` dict or ``"given"``,
    ``shard_bytes`` to an int of bytes (or None) and ``max_pixels`` to an int; the bool options
    to ``bool``. An unset ``split`` (None) becomes :data:`DEFAULT_SPLIT` with ``split_auto``
    True: the splits a source gives (a split-first tree, ``split_column``) are kept, and only a
    source without given splits is split to ``split``. ``split="given"`` requires given splits;
    ratios pool a split-first tree's files and re-split them (the summary says so). Defaults
    that depend on two options are properties (:attr:`sink_writer_options`) or methods
    (:meth:`shard_limits`). :meth:`replace` re-validates.

    **Shard plan.** ``shard_samples`` and/or ``shard_bytes`` roll a shard over at that count or
    size. With neither (the default), each split gets ``S`` shards of ``ceil(n / S)`` samples
    (the last holds the rest; :func:`shardkit.packer.shards.default_shard_count`): ``S`` is the
    largest power of two up to 32 that leaves at least 64 samples per shard (a split under 128
    samples is one shard, 1,483 samples -> 16, 2,048 or more -> 32), raised for a split over
    8 GiB to a multiple of 32 that keeps the average shard at or under 256 MiB. Readers that
    hand whole shards to ``world_size x num_workers`` processes (timm, webdataset, DALI) need at
    least that many shards per split, equal in length: the summary warns about splits with
    fewer than :data:`shardkit.packer.shards.READER_PARALLELISM` (8) shards.

    Raises:
        ConfigError: a value outside its allowed set or range, or a bad group option combination
            (the message names the value and what was expected). SplitError: a bad split.
    """

    format: str = "wds"                         # "wds" (tar), "lmdb" or "hdf5" (formats.FORMATS)
    split: Mapping[str, float] | str | None = None  # {name: fraction}, "train=0.8,val=0.2",
    #                                             "given", or None: given splits, else defaults
    seed: int = 0                               # split tie-break and per-split shuffle, >= 0
    group_by: str | None = None                 # regex on the relpath; group = capture group
    metadata: str | os.PathLike | None = None   # CSV with "path" and the group column
    group_column: str | None = None             # column of `metadata` holding the group
    labels: str | os.PathLike | None = None     # LabelMap YAML; None: the sorted source labels
    shard_samples: int | None = None            # roll over after this many samples per shard
    shard_bytes: int | str | None = None        # roll over at this size (int or "64MB");
    #                                             neither: the default plan (class doc)
    workers: int = 1                            # check processes, >= 1
    strict: bool = False                        # reject images with decoder warnings
    max_pixels: int | None = None               # width*height limit; None: images' default
    overwrite: bool = False                     # replace a finished dataset in OUT
    progress: bool = True                       # tqdm progress bars
    wds_cls: bool = True                        # also write "<key>.cls" tar members (wds)
    wds_json: bool = False                      # also write "<key>.json" (key, label, class, path)
    on_label_conflict: str = "error"            # one of LABEL_CONFLICT_POLICIES
    fail_fast: bool = False                     # raise at the first reject, write nothing
    writer_options: Mapping[str, Any] | None = None  # kwargs of the format's Writer (a key
    #                                             wins over wds_cls/wds_json); in the manifest
    layout: str = "auto"                        # folder layout, one of shardkit.sources.layouts.LAYOUTS
    split_column: str | None = None             # given split column (CSV source or metadata)
    split_method: str = "hash"                  # one of shardkit.packer.assign.SPLIT_METHODS
    split_from: str | os.PathLike | None = None  # earlier pack whose placements are kept
    near_duplicates: str = "merge"              # one of NEAR_DUPLICATE_MODES
    near_threshold: int = 4                     # max pHash Hamming distance of near-duplicates
    max_side: int | None = None                 # downscale + re-encode images longer than this
    jpeg_quality: int = 95                      # JPEG quality of those re-encoded images, 1-100
    engine: str = "local"                       # one of ENGINES: where steps 3 and 6 run
    ray_address: str | None = None              # Ray cluster address (engine="ray"); None: auto
    read_concurrency: int = 16                  # remote reads in flight per check worker/task
    split_auto: bool = field(default=False, init=False)  # split was unset (see the class doc)
    shard_bytes_note: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from shardkit import formats
        from shardkit.images import normalize as images

        formats.get_format(self.format)
        self._set("split_auto", self.split is None)
        split = DEFAULT_SPLIT if self.split is None else self.split
        if isinstance(split, str) and split.strip().lower() == "given":
            self._set("split", "given")
        else:
            self._set("split", parse_split_spec(split) if isinstance(split, str) else
                      validate_ratios(split))
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout={self.layout!r}; expected one of {LAYOUTS}")
        if self.split_column is not None and (not isinstance(self.split_column, str)
                                              or not self.split_column.strip()):
            raise ConfigError(f"split_column={self.split_column!r}; expected a column name")
        if self.split_column is not None and isinstance(self.split, dict) and not self.split_auto:
            raise ConfigError(f"--split-column {self.split_column!r} keeps the given splits; it "
                              "cannot be combined with --split ratios (drop one of them)")
        if self.split_method not in SPLIT_METHODS:
            raise ConfigError(f"split_method={self.split_method!r}; expected one of "
                              f"{SPLIT_METHODS}")
        if self.near_duplicates not in NEAR_DUPLICATE_MODES:
            raise ConfigError(f"near_duplicates={self.near_duplicates!r}; expected one of "
                              f"{NEAR_DUPLICATE_MODES}")
        self._set("near_threshold", _integer("near_threshold", self.near_threshold, 0,
                                             "a Hamming distance in 0-64"))
        if self.near_threshold > 64:
            raise ConfigError(f"near_threshold={self.near_threshold}; expected a Hamming "
                              "distance in 0-64 (bits of the pHash)")
        if self.split == "given" and self.split_from is not None:
            raise ConfigError("--split-from keeps an earlier pack's placements; it cannot be "
                              "combined with --split given (drop one of them)")
        if self.max_side is not None:
            self._set("max_side", _integer("max_side", self.max_side, 16, "a side in pixels"))
        self._set("jpeg_quality", _integer("jpeg_quality", self.jpeg_quality, 1,
                                           "a JPEG quality in 1-100"))
        if self.jpeg_quality > 100:
            raise ConfigError(f"jpeg_quality={self.jpeg_quality}; expected a JPEG quality in "
                              "1-100")
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r}; expected one of {ENGINES}")
        if self.engine == "ray":
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise ConfigError("engine='ray' needs Ray: pip install 'shardkit[ray]' (or use "
                                  "--engine local)")
        if self.ray_address is not None and self.engine != "ray":
            raise ConfigError(f"ray_address={self.ray_address!r} needs engine='ray'")
        if self.on_label_conflict not in LABEL_CONFLICT_POLICIES:
            raise ConfigError(f"on_label_conflict={self.on_label_conflict!r}; expected one of "
                              f"{LABEL_CONFLICT_POLICIES}")
        if self.shard_samples is not None:
            self._set("shard_samples", _integer("shard_samples", self.shard_samples, 1))
        self._set("workers", _integer("workers", self.workers, 1))
        self._set("read_concurrency", _integer("read_concurrency", self.read_concurrency, 1))
        self._set("seed", _integer("seed", self.seed, 0))
        self._set("shard_bytes_note", _unitless_size_note(self.shard_bytes))
        self._set("shard_bytes", parse_size(self.shard_bytes))
        pixels = images.DEFAULT_MAX_PIXELS if self.max_pixels is None else self.max_pixels
        self._set("max_pixels", _integer("max_pixels", pixels, 1, "a pixel count"))
        for name in ("strict", "overwrite", "progress", "wds_cls", "wds_json", "fail_fast"):
            self._set(name, bool(getattr(self, name)))
        if self.writer_options is not None:
            self._set("writer_options", _writer_options(self.format, self.writer_options))
        self._check_group_rule()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_group_rule(self) -> None:
        if self.metadata is not None and self.group_column is None and self.split_column is None:
            raise ConfigError(f"--metadata {self.metadata} needs --group-column (which column "
                              "holds the group) and/or --split-column (the given split)")
        if self.group_column is not None and self.metadata is None:
            raise ConfigError(f"--group-column {self.group_column!r} needs --metadata CSV")
        if self.group_by is not None and self.group_column is not None:
            raise ConfigError("use either --group-by REGEX or --metadata/--group-column, not both")
        if self.group_by is not None:
            compile_group_regex(self.group_by)

    def shard_limits(self, num_samples: int, num_bytes: int) -> tuple[int | None, int | None]:
        """``(max_samples, max_bytes)`` of the shard sink for a split of ``num_samples`` samples
        and ``num_bytes`` stored bytes: ``shard_samples`` / ``shard_bytes`` when either is set,
        else the default plan (class doc; :func:`shardkit.packer.shards.shard_limits`)."""
        return pack_shards.shard_limits(self.shard_samples, self.shard_bytes, num_samples, num_bytes)

    @property
    def sink_writer_options(self) -> dict:
        """The format Writer's keyword arguments, as the manifest's ``writer.options`` records
        them: for ``wds`` ``{"wds_cls": ..., "wds_json": ...}`` from those options, then the
        ``writer_options`` given (a key there wins: ``writer_options={"wds_cls": False}``
        writes no ``.cls`` members); for the other formats ``writer_options`` or ``{}``."""
        named = {"wds_cls": self.wds_cls, "wds_json": self.wds_json} if self.format == "wds" \
            else {}
        return {**named, **(self.writer_options or {})}

    def replace(self, **changes: Any) -> PackOptions:
        """A copy with ``changes`` applied (validated again); an unset ``split`` stays unset."""
        if "split" not in changes and self.split_auto:
            changes["split"] = None
        new = dataclasses.replace(self, **changes)
        if "shard_bytes" not in changes:  # the note of the text this size was parsed from
            new._set("shard_bytes_note", self.shard_bytes_note)
        return new

    def warnings(self) -> list[str]:
        """Warnings about accepted but suspicious options: split names other than
        :data:`KNOWN_SPLIT_NAMES` (with the closest one, e.g. ``'vali'`` -> ``'val'``,
        ``'Train'`` -> ``'train'``), and a ``shard_bytes`` text without a unit."""
        import difflib

        out = []
        for name in self.split if isinstance(self.split, Mapping) else ():
            if name in KNOWN_SPLIT_NAMES:
                continue
            close = [k for k in KNOWN_SPLIT_NAMES if k == name.casefold()] or \
                difflib.get_close_matches(name.casefold(), KNOWN_SPLIT_NAMES, n=1, cutoff=0.6)
            out.append(f"split name {name!r} is not one of {list(KNOWN_SPLIT_NAMES)}"
                       + (f" (did you mean {close[0]!r}?)" if close else "")
                       + "; `shardkit train` uses 'train', 'val' and 'test' unless told "
                       "otherwise (--train-split/--val-split/--test-split)")
        if self.shard_bytes_note:
            out.append(self.shard_bytes_note)
        if self.max_side is None and self.jpeg_quality != 95:
            out.append(f"--jpeg-quality {self.jpeg_quality} has no effect without --max-side "
                       "(only downscaled images are re-encoded)")
        return out


def _unitless_size_note(text: Any) -> str | None:
    """The warning for a ``shard_bytes`` text given without a unit (``"256"``), else None."""
    if not isinstance(text, str) or not text.strip().isdigit():
        return None
    value = int(text.strip())
    hint = f"; did you mean {value}MB or {value}MiB?" if value < (1 << 20) else ""
    return (f"shard_bytes {text.strip()!r} has no unit: read as {value:,} bytes per shard"
            f"{hint} (units: B, KB, MB, GB, KiB, MiB, GiB)")


def _integer(name: str, value: Any, minimum: int, what: str = "an integer") -> int:
    """``value`` as an int >= ``minimum``; ConfigError naming ``name`` otherwise (bools too)."""
    return check_int(name, value, minimum, message=f"{{name}}={{value!r}}; expected {what} >= "
                     "{minimum}")


def _writer_options(fmt: str, given: Any) -> dict:
    """``given`` as the keyword arguments of format ``fmt``'s Writer, checked before anything is
    written (the manifest records them, so they must be JSON): each key a parameter of the
    Writer's ``__init__`` after ``path``, each value of its default's type (a bool for a bool,
    an int for an int) or, for a parameter without a scalar default, a JSON scalar.

    Raises:
        ConfigError: not a mapping; an unknown key (the message lists the Writer's options); a
            value of another type.
    """
    import inspect

    from shardkit import formats

    if not isinstance(given, Mapping):
        raise ConfigError(f"writer_options={given!r}; expected a mapping of keyword arguments "
                          "or None")
    params = dict(list(inspect.signature(formats.get_format(fmt).Writer.__init__)
                       .parameters.items())[2:])  # after self, path
    out = {}
    for key, value in given.items():
        if key not in params:
            raise ConfigError(f"writer_options key {key!r} is not an option of the {fmt!r} "
                              "writer; " + (f"expected one of {sorted(params)}" if params else
                                            "it takes none"))
        default = params[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"writer_options[{key!r}]={value!r}; expected True or False")
        elif isinstance(default, int):
            value = _integer(f"writer_options[{key!r}]", value, 1)
        elif not (value is None or isinstance(value, (str, bool, int))
                  or (isinstance(value, float) and math.isfinite(value))):
            raise ConfigError(f"writer_options[{key!r}]={value!r}; expected a JSON scalar "
                              "(str, finite number, bool or None: the manifest records it)")
        out[key] = value
    return out


def parse_size(text: str | int | None) -> int | None:
    """Parses a byte size: ``123``, ``"64MB"`` (10^6), ``"64MiB"`` (2^20), ``"1.5GB"``, ``"512k"``.

    Units (case-insensitive): B, K/KB, M/MB, G/GB, T/TB (powers of 1000); KiB, MiB, GiB, TiB
    (powers of 1024). Returns an int >= 1 or None for None. Raises ConfigError naming the text.
    """
    if text is None:
        return None
    if is_int(text):
        return check_int("size", text, 1, message="size {value} must be >= 1 byte")
    s = str(text).strip().lower().replace(" ", "")
    units = {"tib": 1 << 40, "gib": 1 << 30, "mib": 1 << 20, "kib": 1 << 10, "tb": 10**12,
             "gb": 10**9, "mb": 10**6, "kb": 10**3, "t": 10**12, "g": 10**9, "m": 10**6,
             "k": 10**3, "b": 1}
    for unit, mult in units.items():
        if s.endswith(unit):
            s, factor = s[: -len(unit)], mult
            break
    else:
        factor = 1
    try:
        value = int(float(s) * factor)
    except (ValueError, OverflowError):
        raise ConfigError(f"size {text!r} is not a size; expected e.g. 64MB, 512MiB or "
                          "1000000") from None
    if value < 1:
        raise ConfigError(f"size {text!r} must be >= 1 byte")
    return value


