"""``shardkit pack --engine ray``: steps 3 (check) and 6 (write shards) as Ray tasks.

Only the per-file and per-shard work moves: the scan, the label map, the split plan, the split
files and the manifest stay on the driver (:func:`shardkit.packer.run.pack`), so ``--engine ray``
gives the local engine's answer for the same source, options and seed:

- **check**: :func:`check_all` runs :func:`shardkit.packer.check._check_one` over batches of up to
  :data:`CHECK_BATCH` files per task (remote files read with GETs in flight while earlier ones
  are checked, :func:`shardkit.storage.fetch.iter_read`) and returns the records in input order;
- **write**: :func:`write_splits` cuts every split into the local sink's shards
  (:func:`shardkit.packer.write.shard_ranges` over the stored sizes known after the check) and
  writes each shard in one task through the same :class:`shardkit.formats.ShardSink` code (temp
  name, fsync, atomic rename) and the same :func:`shardkit.packer.write._write_one`, so shards,
  split records and hashes are the local engine's (wds and hdf5 byte for byte; LMDB files differ
  between any two packs, their records and values do not).

Fault tolerance is Ray's: a task whose worker process or node dies is retried
(:data:`MAX_RETRIES` times; a retried write starts its shard again from its temp name). An error
raised by the work itself (a file changed since the check, a full disk) is not retried: it is
re-raised on the driver as the original exception, after the other tasks were cancelled and had
ended, so nothing writes into ``OUT`` after the pack cleaned up. The manifest is written by the
driver last (a driver that dies leaves ``OUT`` without one). Progress (files checked, files and
shards written, with rates) is a tqdm bar on the driver.

Requirements: every Ray node imports the same shardkit and reads the source: local paths at the
driver's paths (one machine, or a shared file system), or fsspec URLs (an object-store prefix or
URL rows: each task reads its own files, with reads in flight). A local ``OUT`` must be at the
driver's path on every node; an ``OUT`` in object storage (``wds``) needs nothing shared: each
task writes its shard in a staging folder of its own node and uploads it
(:mod:`shardkit.packer.outputs.remote`). Ray itself: ``pip install 'shardkit[ray]'``.
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from shardkit.errors import ConfigError, ShardkitError, SourceError

if TYPE_CHECKING:
    from shardkit.packer.options import PackOptions

__all__ = ["check_all", "write_splits", "ensure_ray", "run_ordered", "CHECK_BATCH",
           "MAX_RETRIES"]

logger = logging.getLogger("shardkit.ray")

CHECK_BATCH = 64
"""Most files one check task takes (fewer for small sources, so every CPU gets work): a task
costs Ray ~1-2 ms of scheduling, a file ~10-50 ms of decoding. Remote files: at least 4 x the
reads in flight (:func:`shardkit.packer.check.chunk_size`)."""
MAX_RETRIES = 3
"""Retries of a task whose worker process (or node) died (Ray's ``max_retries``)."""


def ensure_ray(address: str | None = None):
    """The ``ray`` module, connected: the running Ray of this process if there is one, else
    ``ray.init(address)`` (``None``: ``RAY_ADDRESS`` if set, else a new local Ray using every
    CPU, never a cluster another process started here; it stays up for later packs and ends
    with the process, or ``ray.shutdown()``; a kill -9 of this process included: every process
    of that runtime is ended by :mod:`shardkit.ray.reaper`).

    Raises:
        ConfigError: Ray is not installed (names the extra to install).
    """
    try:
        import ray
    except ImportError:
        raise ConfigError("engine='ray' needs Ray: pip install 'shardkit[ray]' (or "
                          "'ray[data]')") from None
    if not ray.is_initialized():
        # "local": a new runtime, never one that another process left running on this machine
        # (plain ray.init() would join the last cluster started here)
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        before = _children()
        context = ray.init(address=address, include_dashboard=False,
                           logging_level=logging.WARNING)
        if address == "local":  # a runtime started here ends with this process, kill -9 too
            from .reaper import start

            start(os.getpid(), context.address_info.get("session_dir"),
                  sorted(_children() - before))
        logger.info("connected to Ray at %s (%s CPUs)", address,
                    ray.cluster_resources().get("CPU"))
    elif address is not None:
        logger.info("Ray is already initialised in this process; ray_address=%s is not used",
                    address)
    return ray


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children()}


def _cluster_cpus(ray) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_ordered(remote_fn, args: Sequence[tuple], *, weights: Sequence[int] | None = None,
                bar=None, max_in_flight: int | None = None,
                describe: Callable[[int], str] = str) -> Iterator:
    """Runs ``remote_fn.remote(*args[i])`` for every ``i`` and yields the results in input
    order, each as soon as it and all before it are done; at most ``max_in_flight`` tasks are
    submitted at once (default: twice the cluster's CPUs). ``bar.update(weights[i])`` (default
    1) when task ``i`` finishes, in completion order.

    Raises:
        the task's own ShardkitError or OSError (unwrapped from Ray's RayTaskError);
        SourceError: a task whose worker died on every retry (``describe(i)`` names its input).
        On any error, and when the generator is closed early, the remaining tasks are
        cancelled and waited for before this returns.
    """
    import ray

    cap = max_in_flight or 2 * _cluster_cpus(ray)
    done: dict[int, object] = {}
    pending: dict = {}  # ObjectRef -> input position
    submitted = emitted = 0
    try:
        while emitted < len(args):
            while submitted < len(args) and len(pending) < cap:
                pending[remote_fn.remote(*args[submitted])] = submitted
                submitted += 1
            if emitted not in done:
                ready, _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(ready[0])
                done[i] = _get(ray, ready[0], describe(i))
                if bar is not None:
                    bar.update(1 if weights is None else weights[i])
                continue
            yield done.pop(emitted)
            emitted += 1
    finally:
        if pending:  # an error, or closed early: no task may go on writing
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.wait(list(pending), num_returns=len(pending), timeout=30)


def _get(ray, ref, what: str):
    """``ray.get(ref)`` with the task's own error re-raised as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, (ShardkitError, OSError)):
            raise cause from None
        raise
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
            ray.exceptions.ObjectLostError) as e:
        raise SourceError(f"a Ray task died {MAX_RETRIES + 1} times ({what}): "
                          f"{type(e).__name__}; a file there may crash the decoder (rerun "
                          "with --engine local --workers 1 to pinpoint it)") from None


# ----------------------------------------------------------------------------- 3: check
def check_all(jobs: list, progress: bool, *, desc: str = "check",
              address: str | None = None, concurrency: int = 16) -> Iterator[dict]:
    """:func:`shardkit.packer.check._check_one` of every job (``(path, relpath, max_pixels,
    strict, want_hash, max_side, jpeg_quality)``), as Ray tasks of up to :data:`CHECK_BATCH`
    files, each with up to ``concurrency`` remote reads in flight
    (:func:`shardkit.packer.check.check_chunk`); yields the records in input order (as the local
    engine), each batch's as soon as it and all before it are done."""
    from tqdm import tqdm

    from shardkit.packer.check import check_chunk, chunk_size

    ray = ensure_ray(address)
    if not jobs:
        return
    cpus = _cluster_cpus(ray)
    size = chunk_size(jobs, max(1, min(CHECK_BATCH, math.ceil(len(jobs) / (4 * cpus)))), cpus,
                      concurrency)
    batches = [jobs[k:k + size] for k in range(0, len(jobs), size)]
    task = ray.remote(max_retries=MAX_RETRIES)(check_chunk)
    with tqdm(total=len(jobs), desc=desc, unit="file", disable=not progress) as bar:
        stream = run_ordered(task, [(b, concurrency) for b in batches],
                             weights=[len(b) for b in batches],
                             bar=bar, describe=lambda i: f"files {batches[i][0][0]} .. "
                                                         f"{batches[i][-1][0]}")
        try:
            for res in stream:
                yield from res
        finally:
            stream.close()


# ----------------------------------------------------------------------------- 6: write
def _write_shard(out: str, split: str, fmt: str, writer_options: dict, index: int,
                 rows: list, classes: list[str], upload_url: str | None = None,
                 concurrency: int = 16) -> tuple[list[dict], dict, object]:
    """Writes shard ``index`` of ``split`` from ``rows`` (``(key, item, result, label)`` in
    split order; sources re-read with up to ``concurrency`` remote reads in flight,
    :func:`shardkit.packer.write.source_reads`); returns its split records, its manifest entry and, with ``upload_url`` (a
    remote OUT), its members (:func:`shardkit.packer.outputs.upload.put_shard`: the shard is written
    in a staging folder of this node, uploaded to ``upload_url`` and deleted; else None)."""
    import shutil

    from shardkit import formats
    from shardkit.packer.write import _write_one, source_reads

    class _OneShard(formats.ShardSink):  # the sink's rules, at a fixed shard index
        def _final_path(self, _):
            return super()._final_path(index)

        def add(self, *a, **k):
            return index, super().add(*a, **k)[1]

    staging, members, records = None, None, []
    if upload_url is not None:  # no file system shared with the driver: this node's own
        from shardkit.packer.outputs.upload import put_shard, staging_folder

        staging = out = staging_folder("shardkit-shard-")

        def on_close(path, record):
            nonlocal members
            members = put_shard(upload_url, path, record, records)

    try:
        sink = _OneShard(out, split, fmt, writer_options=writer_options,
                         on_close=None if upload_url is None else on_close)
        try:
            reads = source_reads(((it.path, res) for _, it, res, _ in rows), concurrency)
            try:
                records += [_write_one(sink, key, it, res, label, classes, _NoBar, got)
                            for (key, it, res, label), got in zip(rows, reads)]
            finally:
                reads.close()
            shards = sink.close()
        except BaseException as e:
            sink.abort()
            if isinstance(e, OSError) and (e.filename is None or Path(str(e.filename)).name
                                           .startswith(".")):
                e.filename = str(sink._final_path(index))
            raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if len(shards) != 1:
        raise AssertionError(f"shard task {split}/{index} wrote {len(shards)} shards")
    return records, shards[0], members


class _NoBar:
    @staticmethod
    def update(n: int = 1) -> None:
        """Progress is counted on the driver."""


def write_splits(out: Path, splits: list[tuple[str, list[int]]], items, label_idx, results,
                 classes: list[str], options: PackOptions, bar=None, upload=None
                 ) -> Iterator[tuple[list[dict], list[dict]]]:
    """Writes the shards of every split (``(name, members in stored order)``) as Ray tasks, one
    per shard, all splits at once; yields ``(split records, shard entries)`` per split, in the
    order of ``splits``, as each split completes. ``bar`` counts files written (its postfix the
    shards). ``upload`` (a :class:`shardkit.packer.outputs.upload.ShardUpload`, remote OUT): each
    task writes its shard in its node's staging folder and uploads it to ``upload.url``
    itself; the shards' members are summed into ``upload.members`` here."""
    from shardkit.packer.write import shard_ranges, stored_size

    ray = ensure_ray(options.ray_address)
    (Path(out) / "shards").mkdir(parents=True, exist_ok=True)  # as ShardSink, for empty splits
    classes_ref = ray.put(list(classes))
    writer_options = dict(options.sink_writer_options)
    url = None if upload is None else upload.url
    args, owner, weights = [], [], []
    for s, (name, members) in enumerate(splits):
        sizes = [stored_size(results[i]) for i in members]
        ranges = shard_ranges(sizes, *options.shard_limits(len(members), sum(sizes)))
        for k, (a, b) in enumerate(ranges):
            rows = [(f"{name}_{n:08d}", items[i], results[i], label_idx[i])
                    for n, i in zip(range(a, b), members[a:b])]
            args.append((str(out), name, options.format, writer_options, k, rows, classes_ref,
                         url, options.read_concurrency))
            owner.append(s)
            weights.append(b - a)
    task = ray.remote(max_retries=MAX_RETRIES)(_write_shard)
    per_split = [0] * len(splits)
    for s in owner:
        per_split[s] += 1
    done_shards = 0
    pending: list = []  # (records, shard, members) of the split being collected
    stream = run_ordered(task, args, weights=weights, bar=bar,
                         describe=lambda i: f"shard {args[i][4]} of split {args[i][1]!r}")
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
