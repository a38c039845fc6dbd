"""Steps 1-4 of :func:`shardkit.pack.pack`: everything decided before ``OUT`` is touched.

Each step takes what the earlier ones returned plus the validated
:class:`~shardkit.pack.PackOptions` and returns a value: :func:`scan_source` (1) ->
:class:`ScannedSource`; :func:`resolve_labels` (2) -> label map and per-item class index;
:func:`check_files` (3) -> :class:`CheckedFiles`; :func:`plan_split` (4, pure: no I/O; in
:mod:`shardkit.pack_split`, re-exported here) -> :class:`SplitOutcome`. Steps 5-7 (writing) are
in :mod:`shardkit.pack_write`. Notes go to the ``shardkit.pack`` logger.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from tqdm import tqdm

from shardkit import csvlist, layout, neardup, pack_given, scan
from shardkit.errors import ConfigError, ShardkitError, SourceError
from shardkit.labels import LabelMap
from shardkit.fetch import DEFAULT_CONCURRENCY, iter_read, read_one
from shardkit.manifest import is_url
from shardkit.pack_records import CheckRecords

if TYPE_CHECKING:
    from shardkit.pack import PackOptions
    from shardkit.scan import SourceItem

__all__ = ["ScannedSource", "CheckedFiles", "SplitOutcome", "PreviousSplits", "scan_source",
           "resolve_labels", "check_files", "plan_split", "load_previous",
           "ratios_from_previous", "NO_GROUP_RULE_WARNING", "DEFAULT_SHARD_BYTES",
           "SHARDS_PER_SPLIT", "MIN_SHARD_SAMPLES", "READER_PARALLELISM", "default_shard_count",
           "shard_limits", "few_shards_warning"]

logger = logging.getLogger("shardkit.pack")



# ----------------------------------------------------------------------------- 1: scan
@dataclass(frozen=True)
class ScannedSource:
    """What step 1 found in the source.

    Attributes:
        items: sample candidates sorted by relpath. ``group`` is set on every item except those
            at the positions in ``ungrouped`` (None there); without a group rule each item is its
            own group (its relpath), unless a CSV list gave it one.
        missing: CSV rows and broken links whose file does not exist, and links that cannot be
            followed (quarantined later, with ``missing_reasons[relpath]`` or "file not found").
        ignored: ``(relpath, reason)`` of entries that are not samples.
        kind, root: ``"folder"`` or ``"csv"``, and the absolute source root.
        group_rule: the manifest's ``split.group_rule``: ``{"kind": "none"}``,
            ``{"kind": "regex", "regex"}`` or ``{"kind": "column", "csv", "column"}``.
        ungrouped: positions in ``items`` that the group rule gives no group (or the metadata
            split column no split).
        no_group_error: builds the rule's SourceError for a list of relpaths (None without rule).
        given: the splits the source gives, as the manifest's ``split.given`` describes them
            (:func:`shardkit.pack_given.read_given`), or None; each item's ``split`` is its own.
        layout: ``"class"``, ``"split/class"`` or ``"csv"``.
        warnings: the scanner's warnings (twin class folders, split folders without classes,
            class folders named like splits).
    """

    items: list[SourceItem]
    missing: list[SourceItem]
    ignored: list[tuple[str, str]]
    kind: str
    root: str
    group_rule: dict
    ungrouped: list[int] = field(default_factory=list)
    no_group_error: Callable[[list[str]], ShardkitError] | None = None
    given: dict | None = None
    layout: str = "class"
    warnings: list[str] = field(default_factory=list)
    missing_reasons: dict[str, str] = field(default_factory=dict)

    @property
    def num_files(self) -> int:
        """Files the source lists: candidates plus missing ones."""
        return len(self.items) + len(self.missing)


def scan_source(src: Path, options: PackOptions) -> ScannedSource:
    """Step 1: scans ``src`` (folder in ``options.layout``, or ``.csv`` list), reads its given
    splits (:func:`shardkit.pack_given.read_given`) and applies the group rule of ``options``.

    Raises:
        SourceError: ``src`` is neither a folder nor a ``.csv`` file, or holds no files; the
            scanner's and the metadata CSV's own errors. ConfigError: a bad metadata or split
            column, ``layout`` other than ``"auto"`` for a ``.csv`` source, ``split="given"``
            for a source that gives no splits.
    """
    if is_url(src):  # an object-store prefix (a tree of objects) or a remote .csv list
        from shardkit.scan_remote import scan_url

        result = scan_url(src, layout=options.layout, split_column=(
            options.split_column if options.metadata is None else None))
    elif src.is_file() and src.suffix.lower() == ".csv":
        if options.layout != "auto":
            raise ConfigError(f"--layout {options.layout} is for folder sources; {src} is a "
                              ".csv list")
        result = scan.scan_csv(src, split_column=(options.split_column if options.metadata is
                                                  None else None))
    elif src.is_dir():
        result = scan.scan_folder(src, layout=options.layout)
    else:
        raise SourceError(f"source {src} is neither a folder nor a .csv file")
    items, given, lacking_split = pack_given.read_given(src, result, options)
    items, rule, ungrouped, no_group_error = _apply_group_rule(src, items, options)
    if lacking_split:  # checked with the ungrouped files: a notes.txt needs no split either
        ungrouped = sorted(set(ungrouped) | {i for i, it in enumerate(items) if it.split is None})
        no_group_error = pack_given.lacking_rule_error(items, options, no_group_error)
    if not items and not result.missing:
        raise SourceError(f"no image files found in {src}")
    logger.info("scanned %s (layout %s): %d files, %d missing, %d ignored entries, group rule "
                "%s, given splits %s", src, result.layout, len(items), len(result.missing),
                len(result.ignored), rule["kind"], given and given["mapping"])
    return ScannedSource(items=items, missing=list(result.missing), ignored=list(result.ignored),
                         kind=result.kind, root=result.root, group_rule=rule, ungrouped=ungrouped,
                         no_group_error=no_group_error, given=given, layout=result.layout,
                         warnings=list(result.warnings),
                         missing_reasons=dict(result.missing_reasons))


def _apply_group_rule(src: Path, items: list[SourceItem], options: PackOptions):
    """``(items, group_rule, ungrouped, no_group_error)`` for the rule of ``options``."""
    group_by, metadata, column = options.group_by, options.metadata, options.group_column
    grouped = no_group_error = None
    if group_by is not None:
        grouped, _ = scan.match_group_regex(items, group_by)
        rule = {"kind": "regex", "regex": group_by}
        no_group_error = lambda rels: scan.unmatched_regex_error(group_by, rels)  # noqa: E731
    elif column is not None:
        grouped, _ = scan.match_group_metadata(items, metadata, column, root=src)
        rule = {"kind": "column", "csv": csvlist.csv_location(metadata), "column": column}
        no_group_error = lambda rels: scan.lacking_metadata_error(  # noqa: E731
            metadata, column, rels, root=src, known=[it.relpath for it in items])
    elif any(it.group for it in items):  # a CSV list with its own group column
        rule = {"kind": "column", "csv": str(src), "column": "group"}
    else:
        rule = {"kind": "none"}
    if grouped is None:  # no rule: each file is its own group (the summary warns about leakage)
        items = [it if it.group else dataclasses.replace(it, group=it.relpath) for it in items]
        return items, rule, [], None
    # a file the rule gives no group is not an error yet: step 3 first checks whether it is an
    # image at all (a notes.txt is quarantined as "not an image", not a group error)
    by_rel = {it.relpath: it for it in grouped}
    ungrouped = [i for i, it in enumerate(items) if it.relpath not in by_rel]
    items = [by_rel.get(it.relpath, dataclasses.replace(it, group=None)) for it in items]
    return items, rule, ungrouped, no_group_error


# ----------------------------------------------------------------------------- 2: labels
def resolve_labels(items: list[SourceItem], labels_yaml) -> tuple[LabelMap, list[int]]:
    """Step 2: the label map (from ``labels_yaml``, else the item labels in
    :func:`shardkit.layout.class_order`: by code point, or by value when all are numbers; the
    union over given splits) and each item's class index, aligned with ``items``. Reads no
    image.

    Raises:
        UnknownLabelError: every label that matches no class, at once. LabelError: a bad YAML.
    """
    label_map = (LabelMap.from_yaml(labels_yaml) if labels_yaml is not None else
                 LabelMap(layout.class_order(it.label for it in items)))
    name_to_idx = label_map.resolve_all([it.label for it in items])  # all unknowns at once
    return label_map, [name_to_idx[it.label] for it in items]


# ----------------------------------------------------------------------------- 3: check
@dataclass
class CheckedFiles:
    """What step 3 found out about every file.

    Attributes:
        results: one record per item (aligned with ``ScannedSource.items``), a
            :class:`~shardkit.pack_records.CheckRecords` (columns inside; each ``results[i]``
            is a dict): ``ok`` and, when the file was readable, ``sha256`` (hex) and ``size``
            (bytes); accepted files add ``ext``,
            ``rule``, ``width``, ``height`` (pixels), ``warnings`` and, when normalised, ``data``
            (the bytes to store), ``degenerate`` (None or the reason from
            :func:`shardkit.neardup.degenerate_reason`) and ``phash`` (the 64-bit pHash as an
            int; None when degenerate or ``near_duplicates="off"``); rejected ones add
            ``reason``.
        keep: positions of accepted items, in scan order.
        quarantine: entries for ``quarantine.jsonl`` (``path``, ``reason``[, ``sha256``,
            ``size``]): missing files first, then rejects in scan order.
    """

    results: CheckRecords
    keep: list[int]
    quarantine: list[dict]


def check_files(source: ScannedSource, options: PackOptions) -> CheckedFiles:
    """Step 3: reads, hashes and fully decodes every item in ``options.workers`` processes (or
    Ray tasks with ``options.engine == "ray"``; the results are the same, in scan order).

    Items the group rule gives no group are checked first: a real image among them raises the
    rule's error before the long check of the rest; non-images among them are quarantined.

    With ``options.fail_fast`` the first rejected file ends the step: a missing or unreachable
    file (known from the scan) before anything is read, else the first reject in scan order as
    its result arrives; the checks not started yet are cancelled (those in flight in the other
    ``workers`` finish first, at most one chunk of :func:`chunk_size` files each).

    Raises:
        SourceError: an image without a group; the first reject while ``options.fail_fast``
            (naming the file and its reason); a check process that died.
    """
    items = source.items
    want_hash = options.near_duplicates != "off"
    if options.engine == "ray" and options.workers > 1:
        logger.info("workers=%d does not apply to engine='ray': the cluster's CPUs run the "
                    "checks", options.workers)
    jobs = [(str(it.path), it.relpath, options.max_pixels, options.strict, want_hash,
             options.max_side, options.jpeg_quality) for it in items]
    quarantine = [{"path": m.relpath, "reason": source.missing_reasons.get(m.relpath,
                                                                       "file not found")}
                  for m in source.missing]
    if options.fail_fast and source.missing:  # rejected by the scan: nothing to read
        raise _fail_fast_error(source.missing[0].path, quarantine[0]["reason"])
    results = CheckRecords(len(items))  # columns, not a dict per file (pack_records)

    def check(positions: list[int], desc: str = "check") -> None:
        with contextlib.closing(_check_all(
                [jobs[i] for i in positions], options.workers, options.progress, desc=desc,
                engine=options.engine, ray_address=options.ray_address,
                concurrency=options.read_concurrency)) as checked:  # closed: pending cancelled
            for i, res in zip(positions, checked):
                results[i] = res
                if options.fail_fast and not res["ok"]:
                    raise _fail_fast_error(items[i].path, res["reason"])

    if source.ungrouped:
        check(source.ungrouped, desc="check (no group)")
        images_without_group = [items[i].relpath for i in source.ungrouped
                                if results.meta(i)["ok"]]
        if images_without_group:
            raise source.no_group_error(images_without_group)
    check(results.unset)
    keep: list[int] = []
    for i, it in enumerate(items):
        res = results.meta(i)
        if res["ok"]:
            keep.append(i)
            continue
        entry = {"path": it.relpath, "reason": res["reason"]}
        entry.update({k: res[k] for k in ("sha256", "size") if k in res})
        quarantine.append(entry)
    logger.info("checked %d files: %d accepted, %d quarantined", len(items), len(keep),
                len(quarantine))
    return CheckedFiles(results=results, keep=keep, quarantine=quarantine)


def _fail_fast_error(path: str, reason: str) -> SourceError:
    """The error of ``fail_fast`` for the first rejected file (``path``, its quarantine reason)."""
    return SourceError(f"{path}: rejected ({reason}); --fail-fast stops at the first rejected "
                       "file, nothing was written")


def _unreadable(e: BaseException, location: str) -> str:
    """The quarantine reason of a read of ``location`` that raised ``e``."""
    if isinstance(e, FileNotFoundError):  # fsspec may raise it for other failures: say which
        cause = e.__cause__ or e.__context__
        if cause is not None and not isinstance(cause, FileNotFoundError):
            return f"unreadable: {type(cause).__name__}: {cause}"
        if e.strerror is None and location.lower().startswith(("http://", "https://")):
            return "unreadable: not found (HTTP 404)"  # fsspec's HTTP: a bare one is a 404
        return f"unreadable: {e.strerror or 'not found'}"
    if isinstance(e, OSError) and type(e).__module__ == "builtins" and e.strerror:
        return f"unreadable: {e.strerror}"  # a local file: "Permission denied"
    return f"unreadable: {type(e).__name__}: {e}"  # a remote filesystem's own error


def _check_one(job: tuple[str, str, int, bool, bool, int | None, int],
               got: tuple[bytes | None, BaseException | None] | None = None) -> dict:
    """Worker: read + sha256 + full decode check of one file, then the degenerate-image test and
    (``want_hash``) the pHash, both from the check's own decode. Keeps bytes only when
    normalised; never returns pixels (they would cross the process boundary). ``got``: the
    file's ``(bytes, read error)`` already read by :func:`shardkit.fetch.iter_read` (None: read
    it here)."""
    from shardkit.images import check_image

    path, relpath, max_pixels, strict, want_hash, max_side, jpeg_quality = job
    data, error = read_one(path) if got is None else got  # a local file, or an fsspec URL
    if error is not None:
        reason = _unreadable(error, path)
        if path != relpath and is_url(path) and path not in reason:  # which URL was tried
            reason += f" ({path})"
        return {"ok": False, "reason": reason}
    out = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    try:
        res = check_image(data, max_pixels=max_pixels, strict=strict, keep_pixels=True,
                          max_side=max_side, jpeg_quality=jpeg_quality)
        if res.ok:
            degenerate = neardup.degenerate_reason(res.pixels, res.original_size)
            phash = neardup.phash64(res.pixels) if want_hash and not degenerate else None
    except Exception as e:  # noqa: BLE001 - a checker crash on one file must not stop the pack
        return {**out, "ok": False, "reason": f"check_failed: {type(e).__name__}: {e}"}
    if not res.ok:
        return {**out, "ok": False, "reason": res.reason}
    if degenerate and strict:
        return {**out, "ok": False, "reason": f"degenerate image (strict): {degenerate}"}
    out.update(degenerate=degenerate, phash=phash)
    out.update(ok=True, ext=res.ext, rule=res.rule, width=int(res.width), height=int(res.height),
               warnings=list(res.warnings or []))
    if res.original_size is not None:  # stored downscaled (--max-side): the source's size
        out["original_width"], out["original_height"] = map(int, res.original_size)
    if res.rule != "original":
        out["data"] = bytes(res.data)
    return out


def check_chunk(jobs: list, concurrency: int = DEFAULT_CONCURRENCY) -> list[dict]:
    """:func:`_check_one` of every job, in order, with up to ``concurrency`` remote reads in
    flight while earlier files are checked (:func:`shardkit.fetch.iter_read`): the work of one
    check process's chunk or of one Ray task."""
    reads = iter_read((job[0] for job in jobs), concurrency)
    return [_check_one(job, got) for job, got in zip(jobs, reads)]


def chunk_size(jobs: list, size: int, workers: int, concurrency: int) -> int:
    """Files per check chunk (process pool) or task (Ray): ``size`` for local files (small
    chunks spread the work); for remote ones at least ``4 * concurrency`` (as far as ``jobs``
    spread over ``workers`` allow), since a chunk's reads in flight never cross its end."""
    if concurrency > 1 and any(is_url(job[0]) for job in jobs):
        return max(size, min(4 * concurrency, -(-len(jobs) // workers)))
    return size


def _check_all(jobs: list, workers: int, progress: bool, desc: str = "check", *,
               engine: str = "local", ray_address: str | None = None,
               concurrency: int = DEFAULT_CONCURRENCY) -> Iterator[dict]:
    """Runs :func:`_check_one` over ``jobs`` and yields the records in input order (as they
    complete, so the caller stores each at once), in ``workers`` processes, or with
    ``engine="ray"`` as Ray tasks of a few dozen files each (:func:`shardkit.ray.engine.check_all`,
    on the cluster at ``ray_address``; ``workers`` does not apply). Each process or task keeps
    up to ``concurrency`` remote reads in flight (:func:`check_chunk`).

    A process pool that loses a worker (a decoder crashing the process) raises instead of hanging:
    ``ProcessPoolExecutor`` reports ``BrokenProcessPool``, turned into a SourceError here (Ray
    retries a task whose worker died, and raises SourceError when every retry died).
    """
    if engine == "ray":
        from shardkit.ray import engine as ray_engine

        yield from ray_engine.check_all(jobs, progress, desc=desc, address=ray_address,
                                        concurrency=concurrency)
        return
    done = 0
    bar = tqdm(total=len(jobs), desc=desc, unit="file", disable=not progress)
    try:
        if workers <= 1 or len(jobs) < 2:
            reads = iter_read((job[0] for job in jobs), concurrency)
            for job, got in zip(jobs, reads):
                yield _check_one(job, got)
                bar.update()
            return
        size = chunk_size(jobs, max(1, min(32, len(jobs) // (workers * 8))), workers,
                          concurrency)
        chunks = [jobs[k:k + size] for k in range(0, len(jobs), size)]
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(),
                                   initializer=exit_with_parent, initargs=(os.getpid(),))
        try:
            for res in pool.map(check_chunk, chunks, [concurrency] * len(chunks)):
                yield from res
                done += len(res)
                bar.update(len(res))
        finally:  # also when the caller stops early (fail_fast): chunks not started are dropped
            pool.shutdown(wait=True, cancel_futures=True)
    except BrokenProcessPool:
        raise SourceError(f"a check worker process died near file {done} of {len(jobs)} "
                          f"({jobs[min(done, len(jobs) - 1)][0]} or one of the next "
                          "files crashed a decoder); rerun with workers=1 to pinpoint it") from None
    finally:
        bar.close()


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent(parent_pid: int) -> None:
    """Initializer of the check processes: they end when the packer (``parent_pid``) dies, even
    by SIGKILL, instead of waiting forever on the pool's queue.

    On Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (through ``ctypes``) has the kernel kill the
    worker when its parent exits; elsewhere, or if that call fails, a daemon thread polls every
    0.5 s and exits the worker once its parent changed or ``parent_pid`` is gone.
    """
    first_parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != first_parent or not pid_alive(parent_pid):
                    os._exit(1)  # the parent died before the prctl took effect
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid, first_parent), daemon=True,
                     name="shardkit-parent-watch").start()


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists on this machine (also when it is another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch_parent(parent_pid: int, first_parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != first_parent or not pid_alive(parent_pid):
            os._exit(1)


# ----------------------------------------------------------------------------- shard plan
DEFAULT_SHARD_BYTES = 256 << 20
"""Largest average shard of the default plan (256 MiB): a split of more than
``SHARDS_PER_SPLIT x 256 MiB`` (8 GiB) gets more shards (a multiple of 32) so that each holds at
most this on average; big enough that per-shard overhead vanishes, small enough that a writer
buffering a shard (HDF5) stays modest."""
SHARDS_PER_SPLIT = 32
"""Shards the default plan gives a split that is big enough: 32 = world_size x num_workers of
e.g. 4 GPUs x 8 workers, and every power of two up to it divides it."""
MIN_SHARD_SAMPLES = 64
"""Fewest samples per shard of the default plan: a small split is cut into fewer shards (a
power of two) rather than shattered, e.g. 100 samples -> 1 shard, 1,483 -> 16, 2,048 -> 32."""
READER_PARALLELISM = 8
"""Reader processes (world_size x num_workers) that pack expects a split to feed: a split with
fewer shards gets a warning (see :func:`few_shards_warning`)."""


def default_shard_count(num_samples: int, num_bytes: int) -> int:
    """Shards the default plan (neither ``shard_samples`` nor ``shard_bytes`` given) aims at for
    a split of ``num_samples`` samples holding ``num_bytes`` stored bytes.

    The largest power of two ``S <= SHARDS_PER_SPLIT`` (32) with at least
    ``MIN_SHARD_SAMPLES`` (64) samples per shard (1 for splits under 128 samples); raised, for a
    split over ``S x DEFAULT_SHARD_BYTES``, to the smallest power of two (up to 32), then
    multiple of 32, that keeps the average shard at or under :data:`DEFAULT_SHARD_BYTES`; never
    more than ``num_samples``. 0 for an empty split.

    Why: readers that hand whole shards to each of ``world_size x num_workers`` processes
    (timm's ``ReaderWds``, webdataset's ``split_by_worker``, DALI's shard split) give nothing to
    a process beyond the shard count; a power of two (or multiple of 32) of equal shards splits
    evenly over any power-of-two reader count up to it.
    """
    if num_samples <= 0:
        return 0
    count = 1
    while count < SHARDS_PER_SPLIT and num_samples // (2 * count) >= MIN_SHARD_SAMPLES:
        count *= 2
    by_bytes = -(-int(num_bytes) // DEFAULT_SHARD_BYTES)
    if by_bytes > count:
        count = 1 << (by_bytes - 1).bit_length() if by_bytes <= SHARDS_PER_SPLIT else \
            SHARDS_PER_SPLIT * -(-by_bytes // SHARDS_PER_SPLIT)
    return min(count, num_samples)


def shard_limits(shard_samples: int | None, shard_bytes: int | None, num_samples: int,
                 num_bytes: int) -> tuple[int | None, int | None]:
    """``(max_samples, max_bytes)`` of :class:`shardkit.formats.ShardSink` for one split of
    ``num_samples`` samples and ``num_bytes`` stored bytes: the given ``shard_samples`` /
    ``shard_bytes`` as they are when either is set; else the default plan,
    ``ceil(num_samples / S)`` samples per shard for ``S = default_shard_count(...)`` (so ``S``
    shards of equal length, the last one holding the rest; fewer only where a shard would hold
    fewer samples than there are shards), with ``2 x DEFAULT_SHARD_BYTES`` (512 MiB) as a cap
    that only very uneven file sizes reach. Both engines cut a split with the same limits."""
    if shard_samples is not None or shard_bytes is not None:
        return shard_samples, shard_bytes
    count = default_shard_count(num_samples, num_bytes)
    return (max(1, -(-num_samples // max(1, count))), 2 * DEFAULT_SHARD_BYTES)


def few_shards_warning(split_manifest: dict[str, dict],
                       parallelism: int = READER_PARALLELISM) -> list[str]:
    """One warning naming the non-empty splits with fewer than ``parallelism`` shards (and
    their shard counts), or none: what shard-level readers with more processes do with them."""
    few = [f"{name} ({len(sm['shards'])})" for name, sm in split_manifest.items()
           if sm["num_samples"] and len(sm["shards"]) < parallelism]
    if not few:
        return []
    return [f"split(s) with fewer than {parallelism} shards: {', '.join(few)}. Readers that hand "
            "whole shards to each of world_size x num_workers processes (timm's wds reader, "
            "webdataset's split_by_worker, DALI) leave the processes beyond a split's shard "
            "count without data, and timm's training reader then repeats some samples and "
            "skips others every epoch; use at most that many processes for these splits, or "
            "pack more shards (--shard-samples N). shardkit's own loader splits shards by "
            "sample and is not affected"]


# step 4 lives in its own module; its names stay importable from here
from shardkit.pack_split import (  # noqa: E402  (after steps 1-3: it imports their types)
    NO_GROUP_RULE_WARNING, PreviousSplits, SplitOutcome, load_previous, plan_split,
    ratios_from_previous)
