"""The read path: packed split -> batches for ``torch.utils.data``.

Seams, one module each:

- :mod:`.source`: :class:`ShardSource`, the split's index and shard readers, shared by threads;
- :mod:`.state`: :class:`Sampling` (one rank's epoch plans) and :class:`EpochState` (epoch,
  resume point and streams in shared memory, seen by worker processes);
- :mod:`.stages`: the per-sample stages every dataset runs (read, verify, cache, decode or
  transform, augment) and the ``on_error`` / ``on_warning`` handlers;
- :mod:`.datasets`: :class:`ShardDataset`, :class:`MapShardDataset` and :class:`BatchDataset`;
- :mod:`.backends`: :class:`ThreadBackend` and :class:`ProcessBackend` (``close()``, ``with``);
- :mod:`.options`: :class:`SamplingOptions`, :class:`WorkerOptions` and the train/eval rule
  (:func:`resolve_train`, :data:`EVAL_SPLITS`);
- :mod:`.loader`: :func:`make_loader` and :class:`ShardLoader`;
- :mod:`.device`: :class:`DeviceNormalizer`.
"""
from .backends import ProcessBackend, ThreadBackend
from .datasets import BatchDataset, BatchReport, MapShardDataset, ShardDataset
from .device import DeviceNormalizer
from .loader import ShardLoader, make_loader
from .options import (BACKENDS, EVAL_SPLITS, ON_ERROR, ON_WARNING, SamplingOptions, WorkerOptions,
                      is_eval_split, resolve_train)
from .source import ShardSource, dist_rank_world, worker_id_count
from .state import EpochState, Sampling

__all__ = [
    "make_loader", "ShardLoader", "DeviceNormalizer", "SamplingOptions", "WorkerOptions",
    "ShardDataset", "MapShardDataset", "BatchDataset", "BatchReport", "ShardSource", "Sampling",
    "EpochState", "ThreadBackend", "ProcessBackend", "dist_rank_world", "worker_id_count",
    "BACKENDS", "ON_ERROR", "ON_WARNING", "EVAL_SPLITS", "is_eval_split", "resolve_train",
]
