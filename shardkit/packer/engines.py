"""Where steps 3 (check) and 6 (write shards) of :func:`shardkit.pack` run: the engines.

An engine is chosen once, from ``PackOptions.engine``, by :func:`shardkit.packer.run.pack`, and
handed to :func:`shardkit.packer.check.check_files` and :func:`shardkit.packer.write.write_shards`,
which never ask which one they got. Every engine runs the same public worker functions, so the
answer does not depend on the engine:

- check: :func:`shardkit.packer.check.check_chunk` (one chunk of files; the in-process path
  streams the same checks, :func:`shardkit.packer.check.iter_checks`);
- write: :func:`shardkit.packer.write.write_shard` (one shard of
  :func:`shardkit.packer.write.split_ranges`).

:class:`LocalEngine` runs them in this process and a process pool, :class:`RayEngine` as Ray
tasks (``pip install 'shardkit[ray]'``; the Ray plumbing is :mod:`shardkit.ray.engine`, and
importing this module does not import Ray). Both have the methods of :class:`Engine`.
"""
from __future__ import annotations

import logging
import math
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol

from tqdm import tqdm

from shardkit.errors import SourceError
from shardkit.packer.check import check_chunk, chunk_size, iter_checks
from shardkit.packer.outputs.upload import put_shard, staging_folder
from shardkit.packer.write import shard_rows, source_reads, split_ranges, write_shard
from shardkit.ray.engine import MAX_RETRIES, cluster_cpus, ensure_ray, run_ordered
from shardkit.storage.fetch import DEFAULT_CONCURRENCY
from shardkit.storage.procs import exit_with_parent

if TYPE_CHECKING:
    from shardkit.packer.options import PackOptions
    from shardkit.packer.outputs.upload import ShardUpload

__all__ = ["Engine", "LocalEngine", "RayEngine", "CHECK_CHUNK_MAX", "CHECK_BATCH"]

logger = logging.getLogger("shardkit.pack")

CHECK_CHUNK_MAX = 32
"""Most local files one check process takes at a time (fewer for small sources, so every
process gets work; remote files: at least 4 x the reads in flight,
:func:`shardkit.packer.check.chunk_size`)."""
CHECK_BATCH = 64
"""Most files one Ray check task takes (fewer for small sources, so every CPU gets work): a task
costs Ray ~1-2 ms of scheduling, a file ~10-50 ms of decoding. Remote files: at least 4 x the
reads in flight (:func:`shardkit.packer.check.chunk_size`)."""


class Engine(Protocol):
    """What the pack steps need from an engine.

    ``name``: the ``PackOptions.engine`` value it serves (``"local"``, ``"ray"``).
    """

    name: str

    def check(self, jobs: list, *, progress: bool, desc: str = "check") -> Iterator[dict]:
        """The check record of every job (see :func:`shardkit.packer.check.iter_checks`), in
        input order, each as soon as it and those before it are done; closing the iterator
        early cancels the checks not started.

        Raises:
            SourceError: a worker that died (a decoder crashing its process)."""

    def write_splits(self, out: Path, splits: list[tuple[str, list[int]]], items, label_idx,
                     results, classes: list[str], options: PackOptions, *, bar=None,
                     upload: ShardUpload | None = None
                     ) -> Iterator[tuple[list[dict], list[dict]]]:
        """Writes the shards of every split (``(name, item positions in stored order)``), each
        with :func:`shardkit.packer.write.write_shard`, and yields ``(split records, shard
        entries)`` per split in the order of ``splits``. ``items``, ``label_idx``,
        ``results``: the scanned items, their labels and check records
        (:class:`~shardkit.packer.records.CheckRecords`); ``bar`` counts the files written;
        ``upload``: see :func:`shardkit.packer.write.write_shards`. Closing the iterator early
        stops the writes (nothing writes into ``out`` after it returns).

        Raises:
            SourceError: a source file changed since its check; a worker that died.
            OSError: from the shard writers."""


class LocalEngine:
    """Steps 3 and 6 on this machine: the checks in this process (``workers`` 1) or a pool of
    ``workers`` processes, the shards written one after the other in this process.

    Args:
        workers: check processes (>= 1).
        concurrency: remote reads in flight per check process and while writing.
    """

    name = "local"

    def __init__(self, workers: int = 1, concurrency: int = DEFAULT_CONCURRENCY):
        self.workers = int(workers)
        self.concurrency = int(concurrency)

    @classmethod
    def from_options(cls, options: PackOptions) -> LocalEngine:
        """The engine of ``options`` (``workers``, ``read_concurrency``)."""
        return cls(options.workers, options.read_concurrency)

    def check(self, jobs: list, *, progress: bool, desc: str = "check") -> Iterator[dict]:
        """See :meth:`Engine.check`: :func:`~shardkit.packer.check.iter_checks` in this
        process for ``workers`` 1 (or a single job), else
        :func:`~shardkit.packer.check.check_chunk` over chunks of up to
        :data:`CHECK_CHUNK_MAX` files in ``workers`` processes (an ordered ``map``, so the
        result does not depend on ``workers``).

        A pool that loses a process (a decoder crashing it) raises instead of hanging:
        ``ProcessPoolExecutor`` reports ``BrokenProcessPool``, turned into a SourceError naming
        the files near the crash.
        """
        done = 0
        bar = tqdm(total=len(jobs), desc=desc, unit="file", disable=not progress)
        try:
            if self.workers <= 1 or len(jobs) < 2:
                checks = iter_checks(jobs, self.concurrency)
                try:
                    for res in checks:
                        yield res
                        bar.update()
                finally:
                    checks.close()
                return
            size = chunk_size(jobs, max(1, min(CHECK_CHUNK_MAX, len(jobs) // (self.workers * 8))),
                              self.workers, self.concurrency)
            chunks = [jobs[k:k + size] for k in range(0, len(jobs), size)]
            pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context(),
                                       initializer=exit_with_parent, initargs=(os.getpid(),))
            try:
                for res in pool.map(check_chunk, chunks, [self.concurrency] * len(chunks)):
                    yield from res
                    done += len(res)
                    bar.update(len(res))
            finally:  # also when the caller stops early (fail_fast): chunks not started dropped
                pool.shutdown(wait=True, cancel_futures=True)
        except BrokenProcessPool:
            raise SourceError(f"a check worker process died near file {done} of {len(jobs)} "
                              f"({jobs[min(done, len(jobs) - 1)][0]} or one of the next "
                              "files crashed a decoder); rerun with workers=1 to pinpoint "
                              "it") from None
        finally:
            bar.close()

    def write_splits(self, out: Path, splits: list[tuple[str, list[int]]], items, label_idx,
                     results, classes: list[str], options: PackOptions, *, bar=None,
                     upload: ShardUpload | None = None
                     ) -> Iterator[tuple[list[dict], list[dict]]]:
        """See :meth:`Engine.write_splits`: split after split, shard after shard, in this
        process; the sources of a split are read ahead across its shards (up to
        ``concurrency`` remote reads in flight)."""
        for name, members in splits:
            yield self._write_split(out, name, members, items, label_idx, results, classes,
                                    options, bar, upload)

    def _write_split(self, out: Path, name: str, members: list[int], items, label_idx,
                     results, classes, options: PackOptions, bar, upload
                     ) -> tuple[list[dict], list[dict]]:
        """Every shard of one split; returns ``(split records, shard entries)``."""
        records: list[dict] = []
        shards: list[dict] = []
        reads = source_reads(((items[i].path, results.meta(i)) for i in members),
                             self.concurrency)
        try:
            for k, (start, stop) in enumerate(split_ranges(members, results, options)):
                rows = shard_rows(name, members, start, stop, items, label_idx, results)
                shard_records, shard = write_shard(
                    out, name, k, rows, classes, options.format, options.sink_writer_options,
                    reads=reads, on_close=upload, bar=bar)
                records += shard_records
                shards.append(shard)
        finally:
            reads.close()
        return records, shards


class RayEngine:
    """Steps 3 and 6 of a pack as Ray tasks: the :class:`Engine` of ``engine="ray"``.

    Only the per-file and per-shard work moves: the scan, the label map, the split plan, the
    split files and the manifest stay on the driver (:func:`shardkit.packer.run.pack`), so the
    answer is the local engine's for the same source, options and seed:

    - check: :func:`~shardkit.packer.check.check_chunk` over batches of up to
      :data:`CHECK_BATCH` files per task, remote files read with GETs in flight while earlier
      ones are checked; the records come back in input order;
    - write: the local engine's shards (:func:`~shardkit.packer.write.split_ranges`), each
      written in one task by :func:`~shardkit.packer.write.write_shard`, so shards, split
      records and hashes are the local engine's (wds and hdf5 byte for byte; LMDB files differ
      between any two packs, their records and values do not).

    Ray is started or joined (:func:`shardkit.ray.engine.ensure_ray`) at the first check or
    write, not when the engine is made; retries, errors and what every node needs:
    :mod:`shardkit.ray.engine`. The manifest is written by the driver last (a driver that dies
    leaves ``OUT`` without one). Progress (files checked, files and shards written, with rates)
    is a tqdm bar on the driver.

    Args:
        address: the Ray cluster (None: see :func:`shardkit.ray.engine.ensure_ray`).
        concurrency: remote reads in flight per task.
    """

    name = "ray"

    def __init__(self, address: str | None = None, concurrency: int = DEFAULT_CONCURRENCY):
        self.address = address
        self.concurrency = int(concurrency)

    @classmethod
    def from_options(cls, options: PackOptions) -> RayEngine:
        """The engine of ``options`` (``ray_address``, ``read_concurrency``; ``workers`` does
        not apply, which is logged when it is > 1)."""
        if options.workers > 1:
            logger.info("workers=%d does not apply to engine='ray': the cluster's CPUs run the "
                        "checks", options.workers)
        return cls(options.ray_address, options.read_concurrency)

    def check(self, jobs: list, *, progress: bool, desc: str = "check") -> Iterator[dict]:
        """:func:`shardkit.packer.check.check_chunk` over batches of up to :data:`CHECK_BATCH`
        files, one Ray task each, each with up to ``concurrency`` remote reads in flight; yields
        the records in input order (as the local engine), each batch's as soon as it and all
        before it are done (:meth:`Engine.check`)."""
        ray = ensure_ray(self.address)
        if not jobs:
            return
        cpus = cluster_cpus(ray)
        size = chunk_size(jobs, max(1, min(CHECK_BATCH, math.ceil(len(jobs) / (4 * cpus)))),
                          cpus, self.concurrency)
        batches = [jobs[k:k + size] for k in range(0, len(jobs), size)]
        task = ray.remote(max_retries=MAX_RETRIES)(check_chunk)
        with tqdm(total=len(jobs), desc=desc, unit="file", disable=not progress) as bar:
            stream = run_ordered(task, [(b, self.concurrency) for b in batches],
                                 weights=[len(b) for b in batches],
                                 bar=bar, describe=lambda i: f"files {batches[i][0][0]} .. "
                                                             f"{batches[i][-1][0]}")
            try:
                for res in stream:
                    yield from res
            finally:
                stream.close()

    def write_splits(self, out: Path, splits: list[tuple[str, list[int]]], items, label_idx,
                     results, classes: list[str], options: PackOptions, *, bar=None,
                     upload: ShardUpload | None = None
                     ) -> Iterator[tuple[list[dict], list[dict]]]:
        """Writes the shards of every split (``(name, members in stored order)``) as Ray tasks,
        one :func:`shardkit.packer.write.write_shard` per shard of
        :func:`shardkit.packer.write.split_ranges`, all splits at once; yields ``(split
        records, shard entries)`` per split, in the order of ``splits``, as each split
        completes (:meth:`Engine.write_splits`). ``bar`` counts files
        written (its postfix the shards). ``upload`` (remote OUT): each task writes its shard
        in its node's staging folder and uploads it to ``upload.url`` itself; the shards'
        members are summed into ``upload.members`` here."""
        ray = ensure_ray(self.address)
        classes_ref = ray.put(list(classes))
        writer_options = dict(options.sink_writer_options)
        url = None if upload is None else upload.url
        args, owner, weights = [], [], []
        for s, (name, members) in enumerate(splits):
            for k, (a, b) in enumerate(split_ranges(members, results, options)):
                rows = list(shard_rows(name, members, a, b, items, label_idx, results))
                args.append((write_shard, str(out), name, k, rows, classes_ref, options.format,
                             writer_options, url, self.concurrency))
                owner.append(s)
                weights.append(b - a)
        task = ray.remote(max_retries=MAX_RETRIES)(_shard_task)
        per_split = [0] * len(splits)
        for s in owner:
            per_split[s] += 1
        done_shards = 0
        stream = run_ordered(task, args, weights=weights, bar=bar,
                             describe=lambda i: f"shard {args[i][3]} of split {args[i][2]!r}")
        try:
            for s in range(len(splits)):
                pending = [next(stream) for _ in range(per_split[s])]
                done_shards += len(pending)
                if bar is not None:
                    bar.set_postfix(shards=done_shards, refresh=False)
                if upload is not None:
                    for _, _, members in pending:
                        upload.members.update(members)
                yield ([r for recs, _, _ in pending for r in recs],
                       [shard for _, shard, _ in pending])
        finally:
            stream.close()


def _shard_task(worker, out: str, split: str, index: int, rows: list, classes: list[str],
                fmt: str, writer_options: dict, upload_url: str | None = None,
                concurrency: int = DEFAULT_CONCURRENCY) -> tuple[list[dict], dict, object]:
    """The Ray task of one shard: ``worker`` (:func:`shardkit.packer.write.write_shard`, passed
    by the driver) writes shard ``index`` of ``split`` from ``rows``; returns its split records,
    its manifest entry and, with ``upload_url`` (a remote OUT), its members
    (:func:`shardkit.packer.outputs.upload.put_shard`: the shard is written in a staging folder
    of this node, uploaded to ``upload_url`` and deleted; else None)."""
    staging, members = None, None

    def upload(path, record, records):
        nonlocal members
        members = put_shard(upload_url, path, record, records)

    if upload_url is not None:  # no file system shared with the driver: this node's own
        staging = out = staging_folder("shardkit-shard-")
    try:
        records, shard = worker(Path(out), split, index, rows, classes, fmt, writer_options,
                                concurrency=concurrency,
                                on_close=None if upload_url is None else upload)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return records, shard, members
