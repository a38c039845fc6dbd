"""Steps 5-7 of :func:`shardkit.packer.run.pack`: quarantine list, shards, split files, manifest.

The output folder itself (its rules, the lock, staging for overwrite, cleaning) is
:mod:`shardkit.packer.outputs`; the functions here write into the folder it gives (``root``).
:func:`write_quarantine` (5) writes the quarantine list; :func:`write_shards` (6, with the split
files of 7, on the engine :func:`shardkit.packer.run.pack` chose) returns the manifest's
``splits`` section, each shard written by :func:`write_shard`; :func:`class_warnings` +
:func:`build_manifest` (7) return the manifest, which the caller writes last. Inputs are the
values returned by steps 1-4 (:mod:`shardkit.packer.scan`, :mod:`shardkit.packer.check`,
:mod:`shardkit.packer.split`) and the validated :class:`~shardkit.packer.options.PackOptions`.
An ``OSError`` raised while writing a file carries that file's path in ``filename`` (a full disk
is reported by name). Notes go to the ``shardkit.pack`` logger.
"""
from __future__ import annotations

import hashlib
import logging
import zlib
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from shardkit import __version__, formats
from shardkit.dataset import manifest as manifest_mod
from shardkit.dataset.writer_config import WRITER_FIELD, WriterConfig
from shardkit.humanize import count_text
from shardkit.errors import ConfigError, PackInvariantError, SourceError
from shardkit.storage.fetch import DEFAULT_CONCURRENCY, iter_read, read_one
from shardkit.sources.labels import LabelMap
from shardkit.packer.outputs.owned import QUARANTINE_NAME
from shardkit.packer.check import CheckedFiles
from shardkit.packer.scan import ScannedSource
from shardkit.packer.split import SplitOutcome

if TYPE_CHECKING:
    from shardkit.packer.options import PackOptions
    from shardkit.packer.outputs.upload import ShardUpload

__all__ = ["PackInvariantError", "QUARANTINE_NAME", "write_quarantine", "write_shards",
           "shuffled_members", "shard_ranges", "split_ranges", "shard_rows", "stored_size",
           "write_shard", "source_reads", "class_warnings", "transcoded_counts",
           "build_manifest", "naming_file"]

logger = logging.getLogger("shardkit.pack")


# ----------------------------------------------------------------------------- 5: quarantine
@contextmanager
def naming_file(path):
    """Gives an ``OSError`` raised inside the block ``filename=path`` when it names no file (a
    ``write`` on a full disk names none), so the error says which file could not be written."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


def write_quarantine(out: Path, entries: list[dict]) -> None:
    """Step 5: writes ``OUT/quarantine.jsonl`` (one sorted-key JSON object per line), atomically."""
    with naming_file(out / QUARANTINE_NAME):
        manifest_mod.atomic_write_bytes(out / QUARANTINE_NAME, b"".join(
            manifest_mod.json_bytes(q, sort_keys=True) + b"\n" for q in entries))


# ----------------------------------------------------------------------------- 6: write
def write_shards(out: Path, source: ScannedSource, label_idx: list[int], checked: CheckedFiles,
                 outcome: SplitOutcome, classes: list[str], options: PackOptions, *, engine,
                 upload: ShardUpload | None = None) -> dict[str, dict]:
    """Step 6 (and the split files of step 7): writes every split's shards on ``engine`` (a
    :class:`shardkit.packer.engines.Engine`), then its ``splits/<split>.jsonl`` +
    ``.index.npz``. Returns the manifest's ``splits`` section: ``{split: {"num_samples",
    "class_counts", "num_groups", "shards", "index_sha256", "records_sha256"}}``. ``classes``:
    the label map's class names (label ``k`` is ``classes[k]``).

    Every engine cuts a split into the shards of :func:`split_ranges` and writes each with
    :func:`write_shard`, so the files do not depend on the engine (wds and hdf5 byte for byte;
    LMDB files differ between any two packs, their records and values do not).

    ``upload`` (a pack into object storage, :mod:`shardkit.packer.outputs.remote`): every shard is
    handed to ``upload(path, record, its split records)`` as soon as its sink closes it, which
    uploads it and deletes the local file; None keeps the shards in ``out``.

    Raises:
        SourceError: a source file changed since step 3; a Ray task that died on every retry.
        OSError: from the shard writers (``filename``: the shard's final name).
    """
    split_manifest: dict[str, dict] = {}
    splits = [(name, shuffled_members([outcome.keep[j] for j in outcome.plan.indices(name)],
                                      options.seed, pos, name))
              for pos, name in enumerate(outcome.plan.names)]
    (out / "shards").mkdir(parents=True, exist_ok=True)  # also when every split is empty
    bar = tqdm(total=len(outcome.keep), desc="write", unit="file", disable=not options.progress)
    written = engine.write_splits(out, splits, source.items, label_idx, checked.results,
                                  classes, options, bar=bar, upload=upload)
    try:
        for (name, members), (records, shards) in zip(splits, written):
            with naming_file(out / "splits" / f"{name}.jsonl"):
                hashes = manifest_mod.write_split_files(out, name, records)
            split_manifest[name] = {
                "num_samples": len(records),
                "class_counts": np.bincount([r["label"] for r in records],
                                            minlength=len(classes)).tolist(),
                "num_groups": len({source.items[i].group for i in members}), "shards": shards,
                **hashes}  # index_sha256 (readers check it), records_sha256 (verify does)
            logger.info("split %s: %s in %s", name, count_text(len(records), "sample"),
                        count_text(len(shards), "shard"))
    finally:
        written.close()  # an engine stops (the Ray engine cancels its tasks) when closed early
        bar.close()
    return split_manifest


def shuffled_members(members: list[int], seed: int, pos: int, name: str) -> list[int]:
    """``members`` of split ``name`` (at position ``pos``) in the order they are stored: shuffled
    by a generator seeded with ``(seed, pos, crc32(name))`` so shards are not class-sorted
    (field case 7)."""
    rng = np.random.default_rng([int(seed), pos, zlib.crc32(name.encode())])
    return [members[int(k)] for k in rng.permutation(len(members))]


def shard_ranges(sizes, max_samples: int | None, max_bytes: int | None
                 ) -> list[tuple[int, int]]:
    """The shards :class:`shardkit.formats.ShardSink` cuts a split into, as ``[start, stop)``
    ranges of the split order, from the stored sizes (bytes) alone: a shard is closed before a
    sample when it already holds ``max_samples`` samples, or when the sample's bytes would take
    it past ``max_bytes`` (a sample larger than ``max_bytes`` gets a shard of its own; ``None``:
    no limit). Empty ``sizes`` gives ``[]`` (no empty shards). Every engine writes each range
    with :func:`write_shard`, so its shards are the rolling sink's (tests/test_ray.py)."""
    ranges: list[tuple[int, int]] = []
    start = count = nbytes = 0
    for i, size in enumerate(sizes):
        if count and ((max_samples is not None and count >= max_samples)
                      or (max_bytes is not None and nbytes + size > max_bytes)):
            ranges.append((start, i))
            start, count, nbytes = i, 0, 0
        count += 1
        nbytes += int(size)
    if count:
        ranges.append((start, start + count))
    return ranges


def split_ranges(members: list[int], results, options: PackOptions) -> list[tuple[int, int]]:
    """The shards of one split: :func:`shard_ranges` of its ``members`` (item positions in
    stored order) under the shard plan of ``options``
    (:meth:`~shardkit.packer.options.PackOptions.shard_limits`), from the stored sizes in
    ``results`` (a :class:`~shardkit.packer.records.CheckRecords`; no stored bytes read)."""
    sizes = [results.stored_size(i) for i in members]
    return shard_ranges(sizes, *options.shard_limits(len(members), sum(sizes)))


def shard_rows(name: str, members: list[int], start: int, stop: int, items, label_idx,
               results) -> Iterator[tuple]:
    """The rows of the shard ``[start, stop)`` of split ``name`` (:func:`split_ranges`) for
    :func:`write_shard`, lazily: ``(key, scanned item, check record, label)``, the key
    ``f"{name}_{n:08d}"`` with ``n`` the sample's position in the split."""
    for n in range(start, stop):
        i = members[n]
        yield f"{name}_{n:08d}", items[i], results[i], label_idx[i]


def stored_size(res: dict) -> int:
    """Bytes :func:`write_shard` stores for a checked file (its check record ``res``): its
    normalised ``data``, else the source file (``size``, re-checked by sha256 when it is
    written)."""
    data = res.get("data")
    return res["size"] if data is None else len(data)


def write_shard(out: Path, split: str, index: int, rows: Iterable[tuple], classes: list[str],
                fmt: str, writer_options: dict | None = None, *, reads=None,
                concurrency: int = DEFAULT_CONCURRENCY,
                on_close: Callable[[Path, dict, list[dict]], None] | None = None,
                bar=None) -> tuple[list[dict], dict]:
    """Writes shard number ``index`` of ``split`` (``OUT/shards/<split>-<index:06d><suffix>``):
    the worker function of every engine, one call per shard of :func:`split_ranges`.

    Samples are stored through a :class:`shardkit.formats.ShardSink` with that fixed index
    (temp name, fsync, atomic rename; aborted on any error, the temp files removed): a sample's
    normalised ``data`` from its check record, else the source bytes, re-read and re-hashed.

    Args:
        out: the dataset folder (or a staging folder of this node). split: the split's name.
        index: the shard's number in the split (>= 0).
        rows: ``(key, scanned item, check record, label)`` per sample, in stored order
            (:func:`shard_rows`); at least one.
        classes: the label map's class names. fmt, writer_options: the format and the sink's
            writer options (:attr:`~shardkit.packer.options.PackOptions.sink_writer_options`).
        reads: the ``(bytes, read error)`` of the rows' sources (:func:`source_reads`; an
            iterator that may go on past this shard: one per row is taken); None: read here,
            with up to ``concurrency`` remote reads in flight.
        on_close: called as ``on_close(path, shard entry, split records)`` when the shard is
            renamed (a pack into object storage uploads it there).
        bar: a progress bar, ``bar.update()`` per sample (None: none).

    Returns:
        ``(split records, shard entry)``: the samples' records (docs/DESIGN.md) and the
        manifest's entry of the shard (``path`` relative to ``out``, ``num_samples``,
        ``bytes``, ``sha256``).

    Raises:
        SourceError: a source file changed since its check (sha256).
        ConfigError: no rows. OSError: a read of a source, or from the shard writer
            (``filename``: the shard's final name when the error named none).
    """
    records: list[dict] = []
    hook = None if on_close is None else (lambda path, entry: on_close(path, entry, records))
    own = reads is None
    if own:
        rows = list(rows)
        reads = source_reads(((it.path, res) for _, it, res, _ in rows), concurrency)
    try:
        with formats.ShardSink(out, split, fmt, writer_options=writer_options, index=index,
                               on_close=hook) as sink:
            for (key, it, res, label), got in zip(rows, reads):
                records.append(_store_sample(sink, key, it, res, label, classes, got))
                if bar is not None:
                    bar.update()
    finally:
        if own:
            reads.close()
    if not sink.records:
        raise ConfigError(f"shard {index} of split {split!r}: no rows to write")
    return records, sink.records[0]


def source_reads(pairs, concurrency: int = DEFAULT_CONCURRENCY):
    """The ``(bytes, error)`` of every ``(path, check record)`` in ``pairs`` whose stored bytes
    are the source's (rule ``"original"``), ``(None, None)`` for the others, in order, with up
    to ``concurrency`` remote reads in flight (:func:`shardkit.storage.fetch.iter_read`): the write step
    of a source in object storage is not one GET at a time."""
    return iter_read((path if rec["rule"] == "original" else None for path, rec in pairs),
                     concurrency)


def _store_sample(sink, key: str, it, res: dict, label: int, classes, got=None) -> dict:
    """Stores one checked sample through ``sink``; returns its split record (docs/DESIGN.md).
    ``got``: the source's ``(bytes, read error)`` from :func:`source_reads` (None: read here)."""
    data = res.get("data")
    if data is None:  # stored as the original bytes: re-read, and make sure they did not change
        data, error = got if got is not None else read_one(it.path)
        if error is not None:
            raise error
        if hashlib.sha256(data).hexdigest() != res["sha256"]:
            raise SourceError(f"{it.path} changed while packing (its sha256 differs from the "
                              "checked file); rerun the pack")
    shard_idx, offset = sink.add(key, data, res["ext"], int(label),
                                 {"key": key, "label": int(label), "class": classes[label],
                                  "path": it.relpath})
    return {"key": key, "path": it.relpath, "label": int(label), "group": it.group,
            "sha256": res["sha256"], "shard": shard_idx, "offset": int(offset), "size": len(data),
            "ext": res["ext"], "rule": res["rule"], "width": res["width"], "height": res["height"],
            "warnings": res["warnings"],
            "phash": None if res.get("phash") is None else f"{res['phash']:016x}",
            **({"original_width": res["original_width"],
                "original_height": res["original_height"]} if "original_width" in res else {}),
            manifest_mod.CHECKSUM_FIELD: f"{manifest_mod.sample_checksum(data):016x}"}


# ----------------------------------------------------------------------------- 7: manifest
def class_warnings(classes: list[str], split_manifest: dict[str, dict]) -> list[str]:
    """Step 7: warnings about what was packed: a class without samples in a (non-empty) split,
    and a dataset with fewer than two classes that have samples."""
    out = []
    for name, sm in split_manifest.items():
        if sm["num_samples"]:  # an empty split has its own warning from the splitter
            out += _missing_classes_warning(name, [c for c, n in zip(classes, sm["class_counts"])
                                                   if n == 0], len(classes))
    totals = [sum(sm["class_counts"][k] for sm in split_manifest.values())
              for k in range(len(classes))]
    with_samples = [c for c, n in zip(classes, totals) if n]
    if len(with_samples) < 2:
        head = "only one class" if with_samples else "no class has packed samples"
        out.append(f"{head}: classification needs at least 2 (classes with packed samples: "
                   f"{with_samples} of {len(classes)} in the label map)")
    return out


MISSING_CLASSES_LISTED = 20
"""Classes named in the warning about the classes without samples in a split (the count is
exact; the split's ``class_counts`` in the manifest holds every class's count)."""


def _missing_classes_warning(split: str, missing: list[str], num_classes: int) -> list[str]:
    """One warning (or none) for the classes of a split without samples, naming at most
    :data:`MISSING_CLASSES_LISTED` of them: a 100,000-class label map gives one line per split,
    not one per class."""
    if len(missing) == 1:
        return [f"class {missing[0]!r} has no samples in split {split!r}"]
    if not missing:
        return []
    named = ", ".join(repr(c) for c in missing[:MISSING_CLASSES_LISTED])
    more = len(missing) - MISSING_CLASSES_LISTED
    return [f"{len(missing)} of {num_classes} classes have no samples in split {split!r}: "
            f"{named}" + (f" and {more} more (the split's class_counts has them all)"
                          if more > 0 else "")]


def transcoded_counts(checked: CheckedFiles, keep: list[int]) -> dict[str, int]:
    """``{rule: number of packed samples}`` for the packed samples (``keep``) that were stored
    transcoded, i.e. whose normalisation ``rule`` is not ``"original"``; sorted by rule."""
    counts = Counter(checked.results.meta(i)["rule"] for i in keep)  # no stored bytes read
    counts.pop("original", None)
    return dict(sorted(counts.items()))


def build_manifest(source: ScannedSource, label_map: LabelMap, outcome: SplitOutcome,
                   quarantine: list[dict], split_manifest: dict[str, dict],
                   packed_warnings: list[str], options: PackOptions,
                   transcoded: dict[str, int] | None = None) -> dict:
    """Step 7: the ``manifest.json`` content (schema: ``docs/DESIGN.md``), with the resolved
    ``options`` where the schema has them (format, split seed/ratios, normalization, and the
    ``writer`` section: :class:`~shardkit.dataset.writer_config.WriterConfig`).
    ``normalization.transcoded`` is ``transcoded`` (:func:`transcoded_counts`; ``{}`` if None).

    Raises:
        PackInvariantError: scanned files != packed + quarantined.
    """
    from shardkit.images import normalize as images

    plan, classes = outcome.plan, label_map.classes
    num_packed = sum(s["num_samples"] for s in split_manifest.values())
    if source.num_files != num_packed + len(quarantine):
        raise PackInvariantError(f"scanned {source.num_files} != packed {num_packed} + "
                                 f"quarantined {len(quarantine)}")
    grouped = source.group_rule["kind"] != "none"
    return {
        "format": options.format,
        "created_by": f"shardkit {__version__}",
        "classes": list(classes),
        "label_aliases": dict(label_map.aliases),
        "split": {"mode": outcome.split_fields["mode"], "seed": int(options.seed),
                  "method": outcome.split_fields["method"],
                  "ratios": outcome.split_fields["ratios"], "given": outcome.split_fields["given"],
                  "kept_from": outcome.split_fields.get("kept_from"),
                  "near_duplicates": outcome.split_fields["near_duplicates"],
                  "group_rule": source.group_rule,
                  "group_to_split": plan.group_to_split if grouped else None,
                  "tolerance": plan.tolerance,
                  "achieved": {"samples": plan.achieved,
                               "classes": {s: {classes[c]: round(v, 6) for c, v in cv.items()}
                                           for s, cv in plan.class_achieved.items()}},
                  "merged_groups": plan.merged_groups, "label_conflicts": outcome.conflicts,
                  "warnings": plan.warnings + packed_warnings},
        "source": {"root": str(source.root), "kind": source.kind, "num_files": source.num_files,
                   "num_packed": num_packed, "num_quarantined": len(quarantine),
                   "num_duplicates": plan.num_duplicates, "num_ignored": len(source.ignored),
                   "num_degenerate": len(outcome.degenerate), "degenerate": outcome.degenerate,
                   "ignored": [{"path": path, "reason": why} for path, why in source.ignored]},
        "normalization": {"rules": dict(images.RULES), "max_pixels": options.max_pixels,
                          "strict": options.strict, "transcoded": dict(transcoded or {}),
                          "max_side": options.max_side,
                          "jpeg_quality": options.jpeg_quality if options.max_side else None},
        WRITER_FIELD: WriterConfig(  # what decided the stored bytes, for readers to rebuild from
            options.format, options.sink_writer_options, options.max_side, options.jpeg_quality,
            options.shard_samples, options.shard_bytes).to_json(),
        "splits": split_manifest,
    }
