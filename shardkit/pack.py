"""The packer (scan, check, split, write shards, split files, manifest) and ``shardkit pack``.

Every option of a pack is one :class:`PackOptions`, validated once when it is built (a bad option
raises before anything is read or written). Steps of :func:`pack`, each a function of
:mod:`shardkit.pack_plan` (1-4) or :mod:`shardkit.pack_write` (5-7); on-disk layout and manifest
schema: ``docs/DESIGN.md``:

1. **Scan** (:mod:`shardkit.scan`) an ImageFolder tree or a ``.csv`` list, then apply the group
   rule (``group_by`` regex on the relative path, or ``metadata`` CSV + ``group_column``; a CSV
   list's own ``group`` column counts as a rule). Without a rule every file is its own group and
   the summary warns about leakage of near-duplicates. Files the rule gives no group are checked
   (step 3) first: those that are not images are quarantined with that reason like any reject;
   real images without a group raise the rule's error (listing them) before the rest is checked.
   Entries the scanner ignores (hidden/system files, files beside the class folders, empty class
   folders) are listed with their reason in ``manifest.source.ignored``.
2. **Labels** are resolved through :class:`shardkit.labels.LabelMap`; all unknown names are
   reported at once (:class:`~shardkit.errors.UnknownLabelError`) before any file is read.
3. **Check** every file: read, sha256, full decode (:func:`shardkit.images.check_image`), in a
   process pool of ``workers`` processes (ordered ``map``, so the result does not depend on
   ``workers``). Rejects go to ``OUT/quarantine.jsonl`` (``path``, ``reason``, ``sha256``,
   ``size``). With ``fail_fast`` the first reject (in scan order; missing files first, before
   anything is read) raises SourceError and the checks not yet started are cancelled.
4. **Split** (:func:`shardkit.split.assign_splits`): group-atomic after dedup, stratified by class.
   ``split_method="hash"`` (default) decides each group's split by a keyed hash of its name, so
   re-packing a grown source with the same seed moves no old group; ``"balanced"`` meets the
   ratios more closely but may move groups when data is added. ``split_from=PREV_OUT`` keeps every
   group where the earlier pack PREV_OUT put it and places only new groups (balanced toward the
   ratios; unset ``split`` takes PREV_OUT's ratios). **Near-duplicates**
   (``near_duplicates="merge"``, default): the 64-bit pHash of every checked image (computed in
   step 3 from the same decode) links samples within ``near_threshold`` bits (Hamming), searched
   sub-quadratically (:func:`shardkit.neardup.near_pairs`); linked samples' groups become one
   atomic set, and the clusters are listed in ``split.near_duplicates``. ``"report"`` lists
   clusters found in several splits without moving anything (as given splits always do);
   ``"off"`` skips the hash. Degenerate images (a side under 32 px, near-constant pixels, e.g. an
   "image not found" placeholder; :func:`shardkit.neardup.degenerate_reason`) take no part in the
   near-duplicate search (their hashes collide), are listed in ``source.degenerate`` and the
   summary, and are quarantined with ``strict``.
   Identical bytes under different labels: ``on_label_conflict="error"`` (default) raises
   :class:`~shardkit.errors.LabelError` listing the files; ``"quarantine"`` moves every copy to the
   quarantine (reason ``label_conflict``); ``"keep"`` packs them all (one split) and reports them.
5. **Output folder** (:mod:`shardkit.pack_out`; its rules are checked before step 1, OUT is
   written only now, so a bad option or source changes nothing on disk). ``OUT/manifest.json``
   present -> :class:`~shardkit.errors.OutputExistsError` unless ``overwrite``; one packer per
   OUT (an exclusive lock, :class:`~shardkit.pack_out.OutputLockedError` for the second); OUT
   that is a file or cannot be written, OUT inside the source and the source inside OUT are
   refused before the scan. Only names shardkit writes are ever deleted (leftovers of a killed
   run are removed and listed; a user's ``splits/fold0.txt`` stays). With ``overwrite`` the new
   dataset is built in ``OUT/.shardkit-new`` and swapped in at the end, so the old one stays
   valid until then. A run that fails removes what it wrote; a full disk raises
   :class:`~shardkit.pack_out.DiskFullError` naming the file. A source where nothing can be
   packed raises :class:`~shardkit.errors.SourceError` (reasons counted) and writes nothing.
6. **Write**: each split is shuffled with a generator seeded by ``(seed, split position, crc32 of
   the name)`` so shards are not class-sorted (field case 7); keys are ``f"{split}_{i:08d}"``;
   shards go through :class:`shardkit.formats.ShardSink` (temp name, fsync, atomic rename; field
   case 5). Stored bytes are the source bytes (re-read and re-hashed) unless ``check_image``
   normalised them (``rule`` != ``"original"``).
7. ``splits/<split>.jsonl`` + ``.index.npz``, then ``manifest.json`` **last**. The invariant
   ``scanned == packed + quarantined`` is checked (raises :class:`PackInvariantError`).
   ``split.group_to_split`` is null when there is no group rule (each file its own group; the
   per-sample ``group`` in the split files says the same without a manifest entry per file).
   ``split.warnings`` (and the summary) also name classes without samples in a split and a
   dataset with fewer than two classes; the summary alone also names the splits with fewer
   shards than :data:`shardkit.pack_plan.READER_PARALLELISM` (a note on reading them).
   ``normalization.transcoded`` counts the packed samples stored transcoded, by rule
   (``{"exif-transpose+png": 3}``); the summary repeats it and names ``quarantine.jsonl`` when
   files were rejected.

File names that are not valid UTF-8 (read as str with lone surrogates, Python's surrogateescape)
are packed: the bytes are read by path, keys do not depend on names, ``path`` metadata keeps the
name as a ``\\udcXX`` JSON escape (``os.fsencode`` of the loaded str gives the original bytes), and
the summary text shows such names with backslash escapes.

:func:`pack` logs its notes to the ``shardkit.pack`` logger (INFO) and returns the summary
(also logged at DEBUG); the ``shardkit pack`` command prints it.
"""
from __future__ import annotations

import dataclasses
import logging
import numbers
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from shardkit import interop
from shardkit import manifest as manifest_mod
from shardkit import pack_plan as plan
from shardkit import pack_write as write
from shardkit.errors import ConfigError, ShardkitError, SourceError
from shardkit.pack_out import open_output
from shardkit.pack_summary import PackSummary, printable, reason_kind
from shardkit.pack_write import PackInvariantError
from shardkit.layout import LAYOUTS
from shardkit.scan import compile_group_regex
from shardkit.split import SPLIT_METHODS, parse_split_spec, validate_ratios

__all__ = ["pack", "PackOptions", "PackSummary", "PackInvariantError", "pack_command",
           "parse_size", "LABEL_CONFLICT_POLICIES", "NEAR_DUPLICATE_MODES", "DEFAULT_SHARD_BYTES",
           "DEFAULT_SPLIT"]

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
DEFAULT_SHARD_BYTES = plan.DEFAULT_SHARD_BYTES
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
    (the last holds the rest; :func:`shardkit.pack_plan.default_shard_count`): ``S`` is the
    largest power of two up to 32 that leaves at least 64 samples per shard (a split under 128
    samples is one shard, 1,483 samples -> 16, 2,048 or more -> 32), raised for a split over
    8 GiB to a multiple of 32 that keeps the average shard at or under 256 MiB. Readers that
    hand whole shards to ``world_size x num_workers`` processes (timm, webdataset, DALI) need at
    least that many shards per split, equal in length: the summary warns about splits with
    fewer than :data:`shardkit.pack_plan.READER_PARALLELISM` (8) shards.

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
    writer_options: Mapping[str, Any] | None = None  # extra kwargs of the format's Writer
    layout: str = "auto"                        # folder layout, one of shardkit.layout.LAYOUTS
    split_column: str | None = None             # given split column (CSV source or metadata)
    split_method: str = "hash"                  # one of shardkit.split.SPLIT_METHODS
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
        from shardkit import formats, images

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
            if not isinstance(self.writer_options, Mapping):
                raise ConfigError(f"writer_options={self.writer_options!r}; expected a mapping "
                                  "of keyword arguments or None")
            self._set("writer_options", dict(self.writer_options))
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
        else the default plan (class doc; :func:`shardkit.pack_plan.shard_limits`)."""
        return plan.shard_limits(self.shard_samples, self.shard_bytes, num_samples, num_bytes)

    @property
    def sink_writer_options(self) -> dict:
        """The format Writer's keyword arguments: ``writer_options`` if given, else
        ``{"wds_cls": ..., "wds_json": ...}`` for ``wds``, else ``{}``."""
        if self.writer_options is not None:
            return self.writer_options
        return {"wds_cls": self.wds_cls, "wds_json": self.wds_json} if self.format == "wds" else {}

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
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{name}={value!r}; expected {what} >= {minimum}")
    return int(value)


def parse_size(text: str | int | None) -> int | None:
    """Parses a byte size: ``123``, ``"64MB"`` (10^6), ``"64MiB"`` (2^20), ``"1.5GB"``, ``"512k"``.

    Units (case-insensitive): B, K/KB, M/MB, G/GB, T/TB (powers of 1000); KiB, MiB, GiB, TiB
    (powers of 1024). Returns an int >= 1 or None for None. Raises ConfigError naming the text.
    """
    if text is None or isinstance(text, int):
        if isinstance(text, int) and text < 1:
            raise ConfigError(f"size {text} must be >= 1 byte")
        return text
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


# ----------------------------------------------------------------------------- pack
def pack(src, out, *, options: PackOptions | None = None, **kwargs: Any) -> PackSummary:
    """Packs an ImageFolder tree or a ``.csv`` list into shards with leak-free split manifests.

    Args:
        src: folder (``<class>/<file>``) or ``.csv`` list (see :func:`shardkit.scan.scan_csv`),
            local or as an fsspec URL: an object-store prefix (``s3://bucket/flowers``, listed
            once, :func:`shardkit.scan_remote.scan_url`) or a remote ``.csv``.
        out: output folder (layout in ``docs/DESIGN.md``), or an fsspec URL for ``wds``
            (``s3://bucket/ds``: shards uploaded as they are written, ``manifest.json`` last;
            :mod:`shardkit.pack_remote_out`).
        options: a :class:`PackOptions`; default ``PackOptions()``.
        **kwargs: fields of :class:`PackOptions` (``format``, ``split``, ``seed``, ``group_by``,
            ``metadata``, ``group_column``, ``labels``, ``shard_samples``, ``shard_bytes``,
            ``workers``, ``strict``, ``max_pixels``, ``overwrite``, ``progress``, ``wds_cls``,
            ``on_label_conflict``, ``fail_fast``, ``writer_options``, ``max_side``,
            ``jpeg_quality``, ``engine``, ``ray_address``, ``read_concurrency``, ...); with
            ``options`` they replace its values. An unknown name raises TypeError.

    Returns:
        a :class:`PackSummary` (also logged at INFO to the ``shardkit.pack`` logger).

    Raises:
        ConfigError, SplitError: bad options (``options`` not a PackOptions); an output folder
        that is a file, cannot be written, lies inside the source or holds it. SourceError:
        unusable source, a reject with ``fail_fast``, or nothing that could be packed.
        UnknownLabelError / LabelError: unknown labels / label conflicts.
        OutputExistsError: ``out`` holds a finished dataset and ``overwrite`` is False.
        OutputLockedError: another pack is writing to ``out``. DiskFullError: no space left
        (the files of the run are removed; an overwritten dataset stays as it was).
    """
    if options is not None and not isinstance(options, PackOptions):
        raise ConfigError(f"options={options!r}; expected a PackOptions or None")
    opts = options.replace(**kwargs) if options is not None else PackOptions(**kwargs)
    src, out = _location(src), _location(out)  # a local path resolved, or an fsspec URL
    option_warnings = opts.warnings()
    for w in option_warnings:
        logger.warning("%s", w)
    with open_output(src, out, opts) as target:  # OUT checked (and locked) first
        previous = None
        if opts.split_from is not None:  # read before anything is written (PREV may be OUT)
            previous = plan.load_previous(Path(opts.split_from))
        source = plan.scan_source(src, opts)                                         # 1
        if previous is not None and opts.split_auto:
            opts = plan.ratios_from_previous(previous, source, opts)
        label_map, label_idx = plan.resolve_labels(source.items, opts.labels)        # 2
        checked = plan.check_files(source, opts)                                     # 3
        _fail_if_nothing_to_pack(src, source, checked.keep, checked.quarantine)
        outcome = plan.plan_split(source, label_map, label_idx, checked, opts,       # 4
                                  previous)
        if opts.fail_fast and outcome.quarantined:  # on_label_conflict="quarantine"
            first = outcome.quarantined[0]
            raise SourceError(printable(
                f"{first['path']}: rejected ({first['reason']}); --fail-fast stops at the "
                "first rejected file, nothing was written"))
        quarantine = checked.quarantine + outcome.quarantined
        _fail_if_nothing_to_pack(src, source, outcome.keep, quarantine)
        root = target.prepare()  # 5: OUT is written from here on
        write.write_quarantine(root, quarantine)
        splits = write.write_shards(root, source, label_idx, checked, outcome,       # 6
                                    label_map.classes, opts, upload=target.upload)
        packed_warnings = write.class_warnings(label_map.classes, splits)            # 7
        shard_warnings = plan.few_shards_warning(splits)  # the summary's, not the manifest's
        manifest = write.build_manifest(source, label_map, outcome, quarantine, splits,
                                        packed_warnings, opts,
                                        write.transcoded_counts(checked, outcome.keep))
        interop.write_pack_metadata(  # what timm / DALI / HF readers look for
            root, manifest, members=None if target.upload is None else target.upload.members)
        with write.naming_file(root / "manifest.json"):
            manifest_mod.write_manifest(root, manifest)  # LAST: its presence means "finished"
        target.commit()
    summary = PackSummary.from_manifest(
        out, manifest, quarantine,
        warnings=option_warnings + outcome.warnings + packed_warnings + shard_warnings,
        cleaned=target.cleaned, replaced=target.replaced,
        num_with_warnings=sum(bool(checked.results.meta(i)["warnings"]) for i in outcome.keep))
    checked.results.close()  # its temporary file of normalised bytes (a failed run: at GC)
    logger.debug("%s", summary.format_text())  # the command prints it; callers get it returned
    return summary


def _location(path) -> Path | str:
    """A local path, resolved, or a remote fsspec URL (``s3://``, ``gs://``, ``https://``) as
    its text without a trailing ``/``."""
    if manifest_mod.is_url(path):
        return os.fspath(path).rstrip("/")
    return Path(manifest_mod.local_path(path)).resolve()


def _fail_if_nothing_to_pack(src: Path, source, keep: list[int], quarantine: list[dict]) -> None:
    """Raises SourceError when no file is left to pack, naming the rejection reasons with
    their counts and the first rejected files (nothing has been written at this point)."""
    if keep:
        return
    reasons = Counter(reason_kind(q["reason"]) for q in quarantine)
    counted = ", ".join(f"{r}={n}" for r, n in reasons.most_common())
    first = "; ".join(f"{q['path']}: {q['reason']}" for q in quarantine[:3])
    raise SourceError(printable(
        f"nothing to pack in {src}: all {source.num_files} file(s) were rejected ({counted}); "
        f"first: {first}; nothing was written"))


# ----------------------------------------------------------------------------- CLI
import click  # noqa: E402

from shardkit.formats import FORMATS  # noqa: E402  (the registry decides the --format choices)


def _source_arg(ctx, param, value: str) -> Path | str:
    """SRC: a remote fsspec URL as it is, else a local path that must exist."""
    if manifest_mod.is_url(value):
        return value
    return click.Path(exists=True, path_type=Path).convert(value, param, ctx)


def _metadata_arg(ctx, param, value: str | None) -> Path | str | None:
    """--metadata: a remote fsspec URL as it is (read with one GET), else a local file that
    must exist."""
    if value is None or manifest_mod.is_url(value):
        return value
    return click.Path(exists=True, dir_okay=False, path_type=Path).convert(value, param, ctx)


@click.command("pack")
@click.argument("src", callback=_source_arg)
@click.argument("out", callback=lambda ctx, param, v: v if manifest_mod.is_url(v) else Path(v))
@click.option("--format", "fmt", type=click.Choice(sorted(FORMATS)), default="wds",
              show_default=True, help="Shard format.")
@click.option("--split", "split_spec", default=None, metavar="given|NAME=FRACTION,...",
              help="'given' keeps the splits of a split-first SRC (train/, val/, ...) or of "
                   "--split-column; fractions (train=0.8,val=0.2) pool every file and re-split "
                   "by group [default: given when SRC has given splits, else "
                   "train=0.8,val=0.1,test=0.1].")
@click.option("--layout", type=click.Choice(LAYOUTS), default="auto", show_default=True,
              help="Folder layout: SRC/<class>/... or SRC/<split>/<class>/...; auto detects "
                   "split folders (train, val, valid, validation, dev, test, testing, eval).")
@click.option("--split-column", metavar="COL",
              help="Column holding each file's given split: of --metadata if given, else of "
                   "the .csv SRC.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Split hash key / tie-break and shuffle seed.")
@click.option("--split-method", type=click.Choice(SPLIT_METHODS), default="hash",
              show_default=True,
              help="hash: a group's split follows a keyed hash of its name, so re-packing a "
                   "grown source moves no old group; balanced: closest to the ratios, but "
                   "added data can move old groups.")
@click.option("--split-from", type=click.Path(exists=True, file_okay=False, path_type=Path),
              metavar="PREV_OUT",
              help="Keep every group where the earlier pack PREV_OUT put it; only new groups "
                   "are assigned (balanced toward the ratios; without --split, PREV_OUT's).")
@click.option("--near-duplicates", type=click.Choice(NEAR_DUPLICATE_MODES), default="merge",
              show_default=True,
              help="merge: images whose pHashes differ in <= --near-threshold bits share a "
                   "split (their groups join); report: list those found in several splits; "
                   "off: no pHash.")
@click.option("--near-threshold", type=click.IntRange(0, 64), default=4, show_default=True,
              metavar="BITS", help="Largest pHash Hamming distance of near-duplicates (of 64).")
@click.option("--group-by", metavar="REGEX",
              help="Group = first capture group of REGEX on the path.")
@click.option("--metadata", callback=_metadata_arg,
              help="CSV with a 'path' column and the group and/or split column: a local file "
                   "or an object-store URL (s3://, gs://, https://).")
@click.option("--group-column", metavar="COL", help="Column of --metadata holding the group.")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="LABELS.yaml: classes and aliases.")
@click.option("--shard-samples", type=click.IntRange(min=1), metavar="N",
              help="Samples per shard [default: see --shard-bytes].")
@click.option("--shard-bytes", metavar="SIZE",
              help="Bytes per shard, e.g. 64MB or 512MiB [default, when neither limit is set: "
                   "each split in S equal shards, S the largest power of two up to 32 leaving "
                   ">= 64 samples per shard (1 under 128 samples, 32 from 2,048), more for "
                   "splits over 8 GiB (a multiple of 32, <= 256MiB per shard on average), so "
                   "shard-level readers (timm, webdataset, DALI) can split it over world_size x "
                   "num_workers; the summary warns about splits of fewer than 8 shards].")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Check processes.")
@click.option("--strict", is_flag=True,
              help="Quarantine images that decode only with warnings, and degenerate images "
                   "(a side under 32 px, near-constant pixels).")
@click.option("--max-pixels", type=click.IntRange(min=1), metavar="N",
              help="Pixel limit per image.")
@click.option("--max-side", type=click.IntRange(min=16), metavar="PX",
              help="Store images whose longer side exceeds PX downscaled to PX (antialiased) "
                   "and re-encoded as JPEG; each sample keeps its original size and sha256 in "
                   "the index [default: original bytes].")
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=95, show_default=True,
              metavar="Q", help="JPEG quality of images re-encoded by --max-side (4:4:4).")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True,
              help="Where files are checked and shards written: local processes, or Ray tasks "
                   "(pip install 'shardkit[ray]').")
@click.option("--ray-address", metavar="ADDR",
              help="Ray cluster to join (engine ray) [default: RAY_ADDRESS, else a local Ray].")
@click.option("--read-concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              metavar="N",
              help="Reads of remote files (s3://, gs://, https:// rows or prefixes) kept in "
                   "flight per check process or Ray task, while earlier files are checked.")
@click.option("--overwrite", is_flag=True,
              help="Replace a finished dataset in OUT: the new one is built beside it (in "
                   "OUT/.shardkit-new, so the disk needs room for both) and swapped in at the "
                   "end; until then the old one stays valid. An OUT in object storage has no "
                   "swap: its old manifest.json is deleted when writing starts.")
@click.option("--wds-cls/--no-wds-cls", default=True, show_default=True,
              help="Write a '<key>.cls' tar member (the label) beside each image (wds), as "
                   "timm, DALI and webdataset readers expect.")
@click.option("--wds-json", is_flag=True,
              help="Also write '<key>.json' (key, label, class, source path) per sample (wds).")
@click.option("--on-label-conflict", type=click.Choice(LABEL_CONFLICT_POLICIES), default="error",
              show_default=True, help="Identical bytes under different labels.")
@click.option("--fail-fast", is_flag=True,
              help="Stop at the first rejected file (missing, unreadable, not an image, "
                   "damaged; degenerate with --strict; a label conflict with "
                   "--on-label-conflict quarantine): exit 2 with its path and reason, nothing "
                   "written. Files are checked in scan order and the check stops there (checks "
                   "already running in other --workers finish).")
@click.option("--no-progress", is_flag=True,
              help="No progress bars (the summary is still printed).")
def pack_command(src, out, fmt, split_spec, layout, split_column, seed, split_method, split_from,
                 near_duplicates, near_threshold, group_by, metadata,
                 group_column, labels,
                 shard_samples, shard_bytes, workers, strict, max_pixels, max_side, jpeg_quality,
                 engine, ray_address, read_concurrency, overwrite, wds_cls, wds_json,
                 on_label_conflict, fail_fast,
                 no_progress):
    """Pack SRC (an ImageFolder tree or a .csv list; local, or an s3:// / gs:// / https://
    prefix or .csv) into shards in OUT (a folder, or an object-store URL for wds).

    Exit 0 with the summary on stdout; 2 with one "Error: <ErrorType>: <message>" line on
    stderr when the pack cannot run or nothing could be packed (OUT is left as it was)."""
    try:
        options = PackOptions(
            format=fmt, split=split_spec, seed=seed, group_by=group_by, metadata=metadata,
            group_column=group_column, labels=labels, shard_samples=shard_samples,
            shard_bytes=shard_bytes, workers=workers, strict=strict, max_pixels=max_pixels,
            overwrite=overwrite, progress=not no_progress, wds_cls=wds_cls, wds_json=wds_json,
            on_label_conflict=on_label_conflict, fail_fast=fail_fast, layout=layout,
            split_column=split_column, split_method=split_method, split_from=split_from,
            near_duplicates=near_duplicates, near_threshold=near_threshold, max_side=max_side,
            jpeg_quality=jpeg_quality, engine=engine, ray_address=ray_address,
            read_concurrency=read_concurrency)
        summary = pack(src, out, options=options)
    except (ShardkitError, OSError) as e:  # bad input, unwritable OUT, full disk: no traceback
        raise command_error(e) from None
    click.echo(summary.format_text())


def command_error(exc: BaseException) -> click.ClickException:
    """The CLI convention of :mod:`shardkit.doctor.cli` for a command that could not run: exit
    code 2 and one stderr line ``Error: <ErrorType>: <message>`` (printable: lone surrogates of
    non-UTF-8 file names escaped)."""
    from shardkit.doctor.cli import CommandError

    err = CommandError(exc)
    err.message = printable(err.message)
    return err
