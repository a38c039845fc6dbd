"""Step 3 of :func:`shardkit.pack`: check every file (read, sha256, full decode, pHash).

:func:`check_files` -> :class:`CheckedFiles`; the per-file worker function is
:func:`check_chunk` (what the local process pool and the Ray engine both run).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from shardkit.images import neardup
from shardkit.errors import SourceError
from shardkit.storage.fetch import DEFAULT_CONCURRENCY, iter_read, read_one
from shardkit.storage.urls import is_url, url_protocol
from shardkit.packer.records import CheckRecords

if TYPE_CHECKING:
    from shardkit.packer.options import PackOptions
    from shardkit.packer.scan import ScannedSource

__all__ = ["CheckedFiles", "check_files", "check_chunk", "iter_checks", "chunk_size"]

logger = logging.getLogger("shardkit.pack")


# ----------------------------------------------------------------------------- 3: check
@dataclass
class CheckedFiles:
    """What step 3 found out about every file.

    Attributes:
        results: one record per item (aligned with ``ScannedSource.items``), a
            :class:`~shardkit.packer.records.CheckRecords` (columns inside; each ``results[i]``
            is a dict): ``ok`` and, when the file was readable, ``sha256`` (hex) and ``size``
            (bytes); accepted files add ``ext``,
            ``rule``, ``width``, ``height`` (pixels), ``warnings`` and, when normalised, ``data``
            (the bytes to store), ``degenerate`` (None or the reason from
            :func:`shardkit.images.neardup.degenerate_reason`) and ``phash`` (the 64-bit pHash as an
            int; None when degenerate or ``near_duplicates="off"``); rejected ones add
            ``reason``.
        keep: positions of accepted items, in scan order.
        quarantine: entries for ``quarantine.jsonl`` (``path``, ``reason``[, ``sha256``,
            ``size``]): missing files first, then rejects in scan order.
    """

    results: CheckRecords
    keep: list[int]
    quarantine: list[dict]


def check_files(source: ScannedSource, options: PackOptions, *, engine) -> CheckedFiles:
    """Step 3: reads, hashes and fully decodes every item on ``engine`` (a
    :class:`shardkit.packer.engines.Engine`: ``options.workers`` local processes, or Ray tasks;
    the results are the same, in scan order).

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
    jobs = [(str(it.path), it.relpath, options.max_pixels, options.strict, want_hash,
             options.max_side, options.jpeg_quality) for it in items]
    quarantine = [{"path": m.relpath, "reason": source.missing_reasons.get(m.relpath,
                                                                       "file not found")}
                  for m in source.missing]
    if options.fail_fast and source.missing:  # rejected by the scan: nothing to read
        raise _fail_fast_error(source.missing[0].path, quarantine[0]["reason"])
    results = CheckRecords(len(items))  # columns, not a dict per file (pack_records)

    def check(positions: list[int], desc: str = "check") -> None:
        with contextlib.closing(engine.check([jobs[i] for i in positions],
                                             progress=options.progress, desc=desc)) as checked:
            # closed: the checks not started are cancelled
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
        if e.strerror is None and url_protocol(location) in ("http", "https"):
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
    file's ``(bytes, read error)`` already read by :func:`shardkit.storage.fetch.iter_read` (None: read
    it here)."""
    from shardkit.images.normalize import check_image

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


def iter_checks(jobs: list, concurrency: int = DEFAULT_CONCURRENCY) -> Iterator[dict]:
    """The check record of every job, in order, each as soon as it is checked, with up to
    ``concurrency`` remote reads in flight while earlier files are checked
    (:func:`shardkit.storage.fetch.iter_read`).

    Args:
        jobs: ``(path, relpath, max_pixels, strict, want_hash, max_side, jpeg_quality)`` per
            file: a local path or fsspec URL, its path relative to the source, the pixel limit,
            strict mode, whether to compute the pHash, the ``--max-side`` (pixels, None: off)
            and the JPEG quality of a downscale.

    Yields:
        one dict per job (see :class:`CheckedFiles`' ``results``); a file that cannot be read
        or decoded gives ``ok=False`` and its ``reason``, never an exception.
    """
    reads = iter_read((job[0] for job in jobs), concurrency)
    try:
        for job, got in zip(jobs, reads):
            yield _check_one(job, got)
    finally:
        reads.close()


def check_chunk(jobs: list, concurrency: int = DEFAULT_CONCURRENCY) -> list[dict]:
    """The check records of one chunk of files (``jobs``, see :func:`iter_checks`), in order:
    the worker function of one local check process's chunk and of one Ray task."""
    return list(iter_checks(jobs, concurrency))


def chunk_size(jobs: list, size: int, workers: int, concurrency: int) -> int:
    """Files per check chunk (process pool) or task (Ray): ``size`` for local files (small
    chunks spread the work); for remote ones at least ``4 * concurrency`` (as far as ``jobs``
    spread over ``workers`` allow), since a chunk's reads in flight never cross its end."""
    if concurrency > 1 and any(is_url(job[0]) for job in jobs):
        return max(size, min(4 * concurrency, -(-len(jobs) // workers)))
    return size
