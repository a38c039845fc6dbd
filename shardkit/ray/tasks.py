"""The Ray-free half of :func:`shardkit.ray.read_split`: the options of one read
(:func:`make_spec`), its shard-aligned read tasks (:func:`plan_tasks`) and the rows of one task
(:func:`read_rows`). :mod:`shardkit.ray.datasource` wraps them as a Ray Data datasource.

Planning reads the manifest and ``splits/<split>.index.npz`` only (no shard is opened): the
epoch order is :func:`shardkit.sharding.epoch_order` of ``(seed, epoch)``, computed once, and
each task gets the split positions of one shard with their places in that order. A task reads
its rows through :class:`shardkit.stream.MapShardDataset` (read, xxh3 check, key, label), whose
transform is shardkit's :func:`~shardkit.transforms.make_transform` followed by the
augmentation, both drawing from ``sample_rng(seed, epoch, 0, place)`` in the order
:func:`~shardkit.stream.make_loader` draws them (crop, flip, then the augmentation program;
field case 17). So a row holds the pixels ``make_loader`` yields for that sample, and, when the
place is the split position (``shuffle=False``), those of ``MapShardDataset`` with the same
transform.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from shardkit.errors import SAMPLE_ERRORS, ConfigError

__all__ = ["DECODE_MODES", "ROWS_PER_BATCH", "ReadSpec", "TaskRows", "make_spec", "plan_tasks",
           "read_rows"]

log = logging.getLogger("shardkit.ray")

DECODE_MODES = ("bytes", "train", "eval")
"""``image`` of a row: the stored bytes, or uint8 ``(S, S, 3)`` after the train transform
(RandomResizedCrop + flip, then ``augment``) or the eval transform (resize + center crop)."""
ROWS_PER_BATCH = 64
"""Rows per output block of a read task: 64 x 224 x 224 x 3 B = 9.6 MB decoded."""
#: In-memory bytes of a row besides ``image`` and ``key``: ``label`` and ``index`` (int64).
ROW_OVERHEAD = 16


@dataclass(frozen=True)
class ReadSpec:
    """The validated options of one read (what every read task gets, pickled).

    ``transform``: a :class:`~shardkit.transforms.TransformConfig`, a callable ``(data, rng,
    out=None) -> (S, S, 3) uint8``, or None (``decode="bytes"``); ``image_size``: ``S`` (0 for
    bytes); ``augment``: an :class:`~shardkit.augment.AugmentSpec` with per-sample ops, or None;
    ``max_pixels``: the resolved decode limit (width x height).
    """

    root: str
    split: str
    decode: str
    transform: Any
    image_size: int
    augment: Any
    seed: int
    epoch: int
    shuffle: bool
    on_error: str
    on_warning: str
    verify_reads: bool
    max_pixels: int

    @property
    def row_bytes(self) -> int:
        """In-memory bytes of one decoded ``image`` (0 for ``decode="bytes"``)."""
        return 3 * self.image_size * self.image_size


def make_spec(root, split: str, *, decode: str = "bytes", transform=None,
              image_size: int | None = None, augment=None, seed: int = 0, epoch: int = 0,
              shuffle: bool | None = None, on_error: str = "raise", on_warning: str = "keep",
              verify_reads: bool = True, max_pixels: int | None = None) -> ReadSpec:
    """A :class:`ReadSpec` from :func:`shardkit.ray.read_split`'s arguments (see there).

    Raises:
        ConfigError: any invalid option, naming it (the ones :func:`shardkit.stream.make_loader`
            refuses, and ``transform`` / ``augment`` with ``decode="bytes"``, an augmentation
            with ``decode="eval"``, the batch ops ``mixup`` / ``cutmix``).
    """
    from shardkit.images.sniff import resolve_max_pixels
    from shardkit.storage.urls import is_url, local_path
    from shardkit.stream.options import ON_ERROR, ON_WARNING
    from shardkit.stream.state import check_epoch

    if decode not in DECODE_MODES:
        raise ConfigError(f"decode={decode!r}; expected one of {list(DECODE_MODES)}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed={seed!r}; expected an int >= 0")
    epoch = check_epoch(epoch)
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r} is not one of {list(ON_ERROR)}")
    if on_warning not in ON_WARNING:
        raise ConfigError(f"on_warning={on_warning!r} is not one of {list(ON_WARNING)}")
    max_pixels = resolve_max_pixels(max_pixels)
    spec = _augment_spec(augment, decode)
    if decode == "bytes":
        if transform is not None:
            raise ConfigError(f"transform={transform!r} with decode='bytes': the stored bytes are "
                              "not decoded; use decode='train' or 'eval'")
        if image_size is not None:
            _check_size(image_size)  # validated, unused: the bytes have no fixed size
        size = 0
    else:
        transform, size = _resolve_transform(transform, image_size)
    root = os.fspath(root)
    if not is_url(root):
        root = os.path.abspath(local_path(root))  # Ray workers do not share the driver's cwd
    return ReadSpec(root, split, decode, transform, size, spec, int(seed), epoch,
                    decode == "train" if shuffle is None else bool(shuffle), on_error, on_warning,
                    bool(verify_reads), max_pixels)


def _check_size(image_size) -> int:
    from shardkit.transforms import TransformConfig

    return TransformConfig(image_size=image_size).image_size  # ConfigError naming it


def _resolve_transform(transform, image_size):
    """``(transform, S)`` as :func:`shardkit.stream.make_loader` resolves them
    (:func:`~shardkit.stream.options.resolve_transform_input`); a callable's S is checked here."""
    from shardkit.stream.options import resolve_transform_input
    from shardkit.transforms import TransformConfig

    transform, size = resolve_transform_input(transform, image_size)
    if isinstance(transform, TransformConfig):
        return transform, size
    return transform, _check_size(size)


def _augment_spec(augment, decode: str):
    """The :class:`~shardkit.augment.AugmentSpec` with per-sample ops, or None."""
    if augment is None:
        return None
    from shardkit.augment import AugmentSpec

    spec = AugmentSpec.parse(augment)
    if spec.batch_ops:
        raise ConfigError(f"augment={spec.describe()}: the batch ops mixup / cutmix mix whole "
                          "batches, and a Ray dataset is made of rows; mix the batches in the "
                          "trainer (shardkit.augment.BatchMix)")
    if spec.is_identity:
        return None
    if decode != "train":
        raise ConfigError(f"augment={spec.describe()} with decode={decode!r}: only "
                          "decode='train' augments (evaluation never does)")
    return spec


@dataclass(frozen=True)
class TaskRows:
    """The rows of one read task: the samples of one shard, in epoch order.

    ``shard``: the shard's number in the split; ``path``: its path relative to the dataset root;
    ``positions``: int64 ``(m,)`` split positions; ``places``: int64 ``(m,)`` their places in
    the epoch order (increasing); ``stored_bytes``: the sum of their stored sizes (bytes);
    ``key_bytes``: bytes of their keys (the index's fixed width).
    """

    shard: int
    path: str
    positions: np.ndarray
    places: np.ndarray
    stored_bytes: int
    key_bytes: int

    def inmemory_bytes(self, spec: ReadSpec) -> int:
        """Estimated bytes of this task's rows in memory (the decoded images, or the stored
        bytes, plus keys, labels and positions)."""
        m = len(self.positions)
        image = self.stored_bytes if spec.decode == "bytes" else m * spec.row_bytes
        return image + self.key_bytes + m * ROW_OVERHEAD


def plan_tasks(source, spec: ReadSpec) -> list[TaskRows]:
    """One :class:`TaskRows` per shard of the split that holds samples, listed in the order of
    their first sample in the epoch order (for the shard-block order of a remote root: the epoch
    order itself). ``source``: the split's :class:`shardkit.stream.ShardSource` (only its index
    and shard list are used; nothing is read)."""
    from shardkit.sharding import epoch_order

    idx = source.index
    order = epoch_order(len(idx), seed=spec.seed, epoch=spec.epoch, shuffle=spec.shuffle,
                        shards=idx.shard, block=source.remote)
    shard_of = idx.shard[order].astype(np.int64)
    places = np.argsort(shard_of, kind="stable")  # grouped by shard, increasing inside each
    counts = np.bincount(shard_of, minlength=source.num_shards)
    ends = np.cumsum(counts)
    width = idx.key.dtype.itemsize
    tasks = []
    for s in np.flatnonzero(counts).tolist():
        mine = places[ends[s] - counts[s]:ends[s]].astype(np.int64)
        positions = order[mine]
        tasks.append(TaskRows(s, source.shards[s]["path"], positions, mine,
                              int(idx.size[positions].sum()), width * len(positions)))
    tasks.sort(key=lambda t: int(t.places[0]))
    return tasks


class _PlacedTransform:
    """The transform :class:`~shardkit.stream.MapShardDataset` runs for a read task: the task's
    transform, then its augmentation program, both drawn from ``sample_rng(seed, epoch, 0,
    place)`` (make_loader's RNG: the sample's place in the epoch order, which
    ``MapShardDataset``'s own ``rng``, keyed by split position, is only when unshuffled).
    ``place`` is set before each item; ``last_warnings`` / ``last_warning`` are the
    transform's after it."""

    def __init__(self):
        self.fn: Callable | None = None
        self.augment = None
        self.seed = self.epoch = self.size = self.place = 0
        self.last_warnings, self.last_warning = 0, None

    def start(self, spec: ReadSpec) -> None:
        """Builds the task's transform (a fresh one per task: it keeps per-call state)."""
        fn = spec.transform
        if not callable(fn):
            from shardkit.transforms import make_transform

            fn = make_transform(fn, spec.decode == "train")
        if hasattr(fn, "max_pixels"):
            fn.max_pixels = spec.max_pixels  # as make_loader: the reader's limit, not the data's
        self.fn, self.augment, self.size = fn, spec.augment, spec.image_size
        self.seed, self.epoch = spec.seed, spec.epoch

    def __call__(self, data, _rng=None) -> np.ndarray:
        from shardkit.augment import apply_hwc
        from shardkit.sharding import sample_rng

        rng = sample_rng(self.seed, self.epoch, 0, self.place)
        image = np.ascontiguousarray(self.fn(data, rng))
        self.last_warnings = int(getattr(self.fn, "last_warnings", 0) or 0)
        self.last_warning = getattr(self.fn, "last_warning", None)
        if self.augment is not None:  # after the crop's draws, as make_loader
            if not image.flags.writeable:
                image = image.copy()
            apply_hwc(image, self.augment.draw(rng, self.size, self.size, self.epoch))
        return image


class _Reader:
    """What one thread of a Ray worker keeps per ``(root, split, verify_reads, on_error,
    decoded)``, across tasks and epochs: the MapShardDataset (its ``seed`` unused: the slot
    draws from the place), the split's ShardSource and the ``on_error`` handler
    (:func:`shardkit.stream.stages.error_handler`, the one make_loader uses), and the transform
    slot."""

    def __init__(self, spec: ReadSpec):
        from shardkit.stream import MapShardDataset
        from shardkit.stream.source import ShardSource
        from shardkit.stream.stages import error_handler

        self.stage = _PlacedTransform() if spec.decode != "bytes" else None
        self.dataset = MapShardDataset(spec.root, spec.split, decode=False, transform=self.stage,
                                       seed=spec.seed, verify_reads=spec.verify_reads)
        self.source = ShardSource(spec.root, spec.split, spec.on_error, spec.verify_reads)
        self.on_error = error_handler(spec.on_error)


_LOCAL = threading.local()


def _reader(spec: ReadSpec) -> _Reader:
    readers = getattr(_LOCAL, "readers", None)
    if readers is None:
        readers = _LOCAL.readers = {}
    key = (spec.root, spec.split, spec.verify_reads, spec.on_error, spec.decode != "bytes")
    reader = readers.get(key)
    if reader is None:
        if len(readers) >= 4:  # a worker serving many datasets keeps the latest few
            readers.pop(next(iter(readers)))
        reader = readers[key] = _Reader(spec)
    return reader


def read_rows(spec: ReadSpec, rows: TaskRows,
              report: Callable[[list[str]], None] | None = None) -> Iterator[dict]:
    """The rows of one read task, as column batches of up to :data:`ROWS_PER_BATCH` rows:
    ``{"key": object (n,) str, "label": int64 (n,), "index": int64 (n,), "image": object (n,)
    bytes | uint8 (n, S, S, 3)}``, in ``rows``' order, with every row ``on_error`` or
    ``on_warning`` left out removed (its key handed to ``report`` before the batch is yielded;
    logged at WARNING). A batch may be empty.

    Raises:
        ShardCorruptError, DecodeError, ...: a sample failed and ``on_error="raise"`` (naming
            shard and key; :func:`shardkit.stream.stages.error_handler`);
            DecodeWarningError: libjpeg warnings and ``on_warning="raise"``;
            ResourceLimitError: the OS ran out of open files or memory (either policy).
    """
    from shardkit.decode import DecodeWarningError, apply_warning_policy

    reader = _reader(spec)
    ds, stage = reader.dataset, reader.stage
    if stage is not None:
        stage.start(spec)
    warned: list[str] = []
    for start in range(0, len(rows.positions), ROWS_PER_BATCH):
        keys, labels, index, images, skipped = [], [], [], [], []
        for pos, place in zip(rows.positions[start:start + ROWS_PER_BATCH].tolist(),
                              rows.places[start:start + ROWS_PER_BATCH].tolist()):
            try:
                if stage is not None:
                    stage.place = place
                item = ds[pos]
                if stage is not None and stage.last_warnings:
                    where = f"shard {rows.path}: sample {item['key']!r}"
                    if not apply_warning_policy(stage.last_warnings, spec.on_warning, where,
                                                stage.last_warning):
                        log.warning("on_warning='skip': skipped %s (%d libjpeg warning(s))",
                                    where, stage.last_warnings)
                        skipped.append(item["key"])
                        continue
                    warned.append(item["key"])
            except DecodeWarningError:
                raise  # on_warning="raise" is the user's choice: on_error does not apply
            except SAMPLE_ERRORS as e:
                skipped.append(reader.on_error(e, reader.source, pos))
                continue
            keys.append(item["key"])
            labels.append(item["label"])
            index.append(pos)
            images.append(item["image"])
        if skipped and report is not None:
            report(skipped)
        yield _batch(keys, labels, index, images, spec)
    if warned:
        log.warning("%d sample(s) of shard %s decoded with libjpeg warnings and were kept "
                    "(on_warning='keep'), the first %r", len(warned), rows.path, warned[0])


def _batch(keys: list, labels: list, index: list, images: list, spec: ReadSpec) -> dict:
    if spec.decode == "bytes":
        image = np.empty(len(images), dtype=object)
        image[:] = images
    elif images:
        image = np.stack(images)
    else:
        image = np.zeros((0, spec.image_size, spec.image_size, 3), np.uint8)
    return {"key": np.array(keys, dtype=object), "label": np.array(labels, dtype=np.int64),
            "index": np.array(index, dtype=np.int64), "image": image}
