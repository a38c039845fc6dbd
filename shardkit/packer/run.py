"""The packer (scan, check, split, write shards, split files, manifest) and ``shardkit pack``.

Every option of a pack is one :class:`PackOptions`, validated once when it is built (a bad option
raises before anything is read or written). Steps of :func:`pack`, each a function of
:mod:`shardkit.packer.scan` (1-2), :mod:`shardkit.packer.check` (3), :mod:`shardkit.packer.split` (4) or :mod:`shardkit.packer.write` (5-7); on-disk layout and manifest
schema: ``docs/DESIGN.md``:

1. **Scan** (:mod:`shardkit.sources.folder`) an ImageFolder tree or a ``.csv`` list, then apply the group
   rule (``group_by`` regex on the relative path, or ``metadata`` CSV + ``group_column``; a CSV
   list's own ``group`` column counts as a rule). Without a rule every file is its own group and
   the summary warns about leakage of near-duplicates. Files the rule gives no group are checked
   (step 3) first: those that are not images are quarantined with that reason like any reject;
   real images without a group raise the rule's error (listing them) before the rest is checked.
   Entries the scanner ignores (hidden/system files, files beside the class folders, empty class
   folders) are listed with their reason in ``manifest.source.ignored``.
2. **Labels** are resolved through :class:`shardkit.sources.labels.LabelMap`; all unknown names are
   reported at once (:class:`~shardkit.errors.UnknownLabelError`) before any file is read.
3. **Check** every file: read, sha256, full decode (:func:`shardkit.images.normalize.check_image`), in a
   process pool of ``workers`` processes (ordered ``map``, so the result does not depend on
   ``workers``), or as Ray tasks with ``engine="ray"`` (the engine, chosen once:
   :mod:`shardkit.packer.engines`). Rejects go to ``OUT/quarantine.jsonl`` (``path``,
   ``reason``, ``sha256``, ``size``). With ``fail_fast`` the first reject (in scan order; missing files first, before
   anything is read) raises SourceError and the checks not yet started are cancelled.
4. **Split** (:func:`shardkit.packer.assign.assign_splits`): group-atomic after dedup, stratified by class.
   ``split_method="hash"`` (default) decides each group's split by a keyed hash of its name, so
   re-packing a grown source with the same seed moves no old group; ``"balanced"`` meets the
   ratios more closely but may move groups when data is added. ``split_from=PREV_OUT`` keeps every
   group where the earlier pack PREV_OUT put it and places only new groups (balanced toward the
   ratios; unset ``split`` takes PREV_OUT's ratios). **Near-duplicates**
   (``near_duplicates="merge"``, default): the 64-bit pHash of every checked image (computed in
   step 3 from the same decode) links samples within ``near_threshold`` bits (Hamming), searched
   sub-quadratically (:func:`shardkit.images.neardup.near_pairs`); linked samples' groups become one
   atomic set, and the clusters are listed in ``split.near_duplicates``. ``"report"`` lists
   clusters found in several splits without moving anything (as given splits always do);
   ``"off"`` skips the hash. Degenerate images (a side under 32 px, near-constant pixels, e.g. an
   "image not found" placeholder; :func:`shardkit.images.neardup.degenerate_reason`) take no part in the
   near-duplicate search (their hashes collide), are listed in ``source.degenerate`` and the
   summary, and are quarantined with ``strict``.
   Identical bytes under different labels: ``on_label_conflict="error"`` (default) raises
   :class:`~shardkit.errors.LabelError` listing the files; ``"quarantine"`` moves every copy to the
   quarantine (reason ``label_conflict``); ``"keep"`` packs them all (one split) and reports them.
5. **Output folder** (:mod:`shardkit.packer.outputs`; its rules are checked before step 1, OUT is
   written only now, so a bad option or source changes nothing on disk). ``OUT/manifest.json``
   present -> :class:`~shardkit.errors.OutputExistsError` unless ``overwrite``; one packer per
   OUT (an exclusive lock, :class:`~shardkit.errors.OutputLockedError` for the second); OUT
   that is a file or cannot be written, OUT inside the source and the source inside OUT are
   refused before the scan. Only names shardkit writes are ever deleted (leftovers of a killed
   run are removed and listed; a user's ``splits/fold0.txt`` stays). With ``overwrite`` the new
   dataset is built in ``OUT/.shardkit-new`` and swapped in at the end, so the old one stays
   valid until then. A run that fails removes what it wrote; a full disk raises
   :class:`~shardkit.errors.DiskFullError` naming the file. A source where nothing can be
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
   shards than :data:`shardkit.packer.shards.READER_PARALLELISM` (a note on reading them).
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

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

from shardkit import interop
from shardkit.dataset import manifest as manifest_mod
from shardkit.storage.urls import is_url, local_path
import shardkit.packer.check as pack_check
import shardkit.packer.scan as pack_scan
import shardkit.packer.shards as pack_shards
import shardkit.packer.split as pack_split
from shardkit.packer import write
from shardkit.errors import ConfigError, SourceError
from shardkit.packer.engines import Engine, LocalEngine, RayEngine
from shardkit.packer.outputs import open_output
from shardkit.packer.summary import PackSummary, printable, reason_kind
from shardkit.packer.options import PackOptions

__all__ = ["pack"]

logger = logging.getLogger("shardkit.pack")


def pack(src, out, *, options: PackOptions | None = None, **kwargs: Any) -> PackSummary:
    """Packs an ImageFolder tree or a ``.csv`` list into shards with leak-free split manifests.

    Args:
        src: folder (``<class>/<file>``) or ``.csv`` list (see :func:`shardkit.sources.csvlist.scan_csv`),
            local or as an fsspec URL: an object-store prefix (``s3://bucket/flowers``, listed
            once, :func:`shardkit.sources.remote.scan_url`) or a remote ``.csv``.
        out: output folder (layout in ``docs/DESIGN.md``), or an fsspec URL for ``wds``
            (``s3://bucket/ds``: shards uploaded as they are written, ``manifest.json`` last;
            :mod:`shardkit.packer.outputs.remote`).
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
            previous = pack_split.load_previous(Path(opts.split_from))
        source = pack_scan.scan_source(src, opts)                                         # 1
        if previous is not None and opts.split_auto:
            opts = pack_split.ratios_from_previous(previous, source, opts)
        label_map, label_idx = pack_scan.resolve_labels(source.items, opts.labels)        # 2
        engine = _engine(opts)  # where steps 3 and 6 run, chosen once
        checked = pack_check.check_files(source, opts, engine=engine)                      # 3
        _fail_if_nothing_to_pack(src, source, checked.keep, checked.quarantine)
        outcome = pack_split.plan_split(source, label_map, label_idx, checked, opts,       # 4
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
                                    label_map.classes, opts, engine=engine,
                                    upload=target.upload)
        packed_warnings = write.class_warnings(label_map.classes, splits)            # 7
        shard_warnings = pack_shards.few_shards_warning(splits)  # the summary's, not the manifest's
        manifest = write.build_manifest(source, label_map, outcome, quarantine, splits,
                                        packed_warnings, opts,
                                        write.transcoded_counts(checked, outcome.keep))
        interop.write_pack_metadata(  # what timm / DALI / HF readers look for
            root, manifest, members=target.shard_members)
        with write.naming_file(root / manifest_mod.MANIFEST_NAME):
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


def _engine(opts: PackOptions) -> Engine:
    """The engine of ``opts.engine`` (:mod:`shardkit.packer.engines`): a
    :class:`~shardkit.packer.engines.RayEngine` for ``"ray"``, else a
    :class:`~shardkit.packer.engines.LocalEngine`."""
    if opts.engine == "ray":
        return RayEngine.from_options(opts)
    return LocalEngine.from_options(opts)


def _location(path) -> Path | str:
    """A local path, resolved, or a remote fsspec URL (``s3://``, ``gs://``, ``https://``) as
    its text without a trailing ``/``."""
    if is_url(path):
        return os.fspath(path).rstrip("/")
    return Path(local_path(path)).resolve()


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


