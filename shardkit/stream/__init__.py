"""The read path: packed split -> batches for ``torch.utils.data``.

Stable API, exported here (``__all__``) and kept compatible:

- :func:`make_loader` and :class:`ShardLoader`: batches of a split (threads or worker
  processes), exactly once per epoch, resumable;
- :class:`ShardDataset` (iterable, per sample) and :class:`MapShardDataset` (map-style, per
  sample) for a ``torch.utils.data.DataLoader`` of your own;
- :class:`DeviceNormalizer`: moves a loader's uint8 batches to a device and normalises them;
- :class:`SamplingOptions` and :class:`WorkerOptions`: the option groups these take;
- :class:`BatchReport`: the per-batch accounting a loader's batches carry.

Everything else is internal: importable from its own module (below), where it may change
between releases without notice.

Seams, one module each:

- :mod:`.source`: ``ShardSource``, the split's index and shard readers, shared by threads;
- :mod:`.prefetch`: ``ShardPrefetcher``, remote shards fetched whole ahead of the readers in
  the epoch plan's order, within a memory bound;
- :mod:`.state`: ``Sampling`` (one rank's epoch plans) and ``EpochState`` (epoch, resume point
  and streams in shared memory, seen by worker processes);
- :mod:`.stages`: the per-sample stages every dataset runs (read, verify, cache, decode or
  transform, augment) and the ``on_error`` / ``on_warning`` handlers;
- :mod:`.datasets`: :class:`ShardDataset`, :class:`MapShardDataset` and ``BatchDataset``
  (a batch whole, or in row ranges built by several threads);
- :mod:`.buffers`: batch memory (``batch_buffer``, the thread backend's ``BufferPool``);
- :mod:`.backends`: ``ThreadBackend`` and ``ProcessBackend`` (``close()``, ``with``);
- :mod:`.tuning`: ``num_workers="auto"`` / ``prefetch_factor="auto"`` (``AutoTuner``, the
  ``Tuning`` record in ``loader.tuning``);
- :mod:`.options`: :class:`SamplingOptions`, :class:`WorkerOptions` and the train/eval rule
  (``resolve_train``, ``EVAL_SPLITS``);
- :mod:`.loader`: :func:`make_loader` and :class:`ShardLoader`;
- :mod:`.device`: :class:`DeviceNormalizer`;
- :mod:`.cache` and :mod:`.arena`: the decoded cache (``make_loader(cache=...)``).
"""
from .datasets import BatchReport, MapShardDataset, ShardDataset
from .device import DeviceNormalizer
from .loader import ShardLoader, make_loader
from .options import SamplingOptions, WorkerOptions

__all__ = [
    "make_loader", "ShardLoader", "ShardDataset", "MapShardDataset", "DeviceNormalizer",
    "SamplingOptions", "WorkerOptions", "BatchReport",
]
