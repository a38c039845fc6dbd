"""One split of a packed dataset as a Ray Data datasource (:class:`SplitDatasource`); importing
this module imports Ray (:func:`shardkit.ray.read_split` does it only when called).

Planning (:meth:`SplitDatasource.get_read_tasks`) happens on the driver from the manifest and
the split index alone: one read task per shard, whose ``BlockMetadata`` carries the task's row
count and its in-memory size from the index (stored sizes for ``decode="bytes"``, ``S x S x 3``
per row decoded). The epoch order is computed once, there; each task gets only its rows
(:mod:`shardkit.ray.tasks`).
"""
from __future__ import annotations

import functools
import os

import ray
import ray.data
from ray.data.block import BlockAccessor, BlockMetadata

from .tasks import ReadSpec, TaskRows, make_spec, plan_tasks, read_rows

__all__ = ["SplitDatasource"]


@ray.remote(num_cpus=0)
class _LeftOut:
    """The keys the read tasks of one datasource left out (``on_error`` / ``on_warning="skip"``),
    each once (a retried task or a second pass over the dataset reports them again)."""

    def __init__(self):
        self.keys: dict[str, None] = {}

    def add(self, keys: list[str]) -> None:
        self.keys.update(dict.fromkeys(keys))

    def get(self) -> list[str]:
        return list(self.keys)


class _Report:
    """What a read task calls with the keys it left out: blocks until the actor has them, so a
    block's skipped keys are counted before the block is consumed."""

    def __init__(self, actor):
        self.actor = actor

    def __call__(self, keys: list[str]) -> None:
        ray.get(self.actor.add.remote(keys))


def _read_blocks(spec: ReadSpec, rows: TaskRows, report):
    for batch in read_rows(spec, rows, report):
        if len(batch["index"]):
            yield BlockAccessor.batch_to_block(batch)


class SplitDatasource(ray.data.Datasource):
    """Split ``split`` of the packed dataset at ``root``, read by one Ray task per shard.

    ``ray.data.read_datasource(SplitDatasource(root, split, **options))`` is
    :func:`shardkit.ray.read_split` (the options, rows and errors are described there); build it
    yourself to read :attr:`skipped` afterwards.

    Raises (when built, on the driver): as :func:`shardkit.ray.read_split`.
    """

    def __init__(self, root, split: str, **options):
        super().__init__()
        from shardkit.stream.source import ShardSource

        self.spec = make_spec(root, split, **options)
        source = ShardSource(self.spec.root, split, self.spec.on_error, self.spec.verify_reads)
        #: :class:`shardkit.ray.tasks.TaskRows` of each read task, in epoch order of their
        #: first sample
        self.tasks: list[TaskRows] = plan_tasks(source, self.spec)
        self.num_rows = len(source)
        self.num_shards = source.num_shards
        drops = self.spec.on_error == "skip" or (self.spec.on_warning == "skip"
                                                 and self.spec.decode != "bytes")
        self._left_out = _LeftOut.remote() if drops else None

    @property
    def skipped(self) -> list[str]:
        """Keys of the samples the read tasks left out so far (``on_error="skip"``, or
        ``on_warning="skip"`` for a decode with libjpeg warnings), each once; empty when neither
        policy skips. Complete once the dataset has been consumed."""
        if self._left_out is None:
            return []
        return ray.get(self._left_out.get.remote())

    def get_name(self) -> str:
        return "ShardkitSplit"

    def estimate_inmemory_data_size(self) -> int:
        """Bytes of the split's rows in memory (the sum of the read tasks' metadata)."""
        return sum(t.inmemory_bytes(self.spec) for t in self.tasks)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context=None) -> list[ray.data.ReadTask]:
        """One task per shard that holds samples of the split, whatever ``parallelism`` (a
        task reads its shard front to back: one open, or one fetch of a remote tar shard)."""
        report = _Report(self._left_out) if self._left_out is not None else None
        out = []
        for t in self.tasks:
            meta = BlockMetadata(num_rows=len(t.positions), size_bytes=t.inmemory_bytes(self.spec),
                                 input_files=(_shard_location(self.spec.root, t.path),),
                                 exec_stats=None)
            out.append(ray.data.ReadTask(functools.partial(_read_blocks, self.spec, t, report),
                                         meta, per_task_row_limit=per_task_row_limit))
        return out


def _shard_location(root: str, path: str) -> str:
    from shardkit.storage.urls import is_url

    return f"{root.rstrip('/')}/{path}" if is_url(root) else os.path.join(root, path)
