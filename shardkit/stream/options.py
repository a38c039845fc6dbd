"""Option objects of :func:`shardkit.stream.make_loader`: what each rank reads per epoch
(:class:`SamplingOptions`) and how batches are built (:class:`WorkerOptions`).

Both are frozen dataclasses validated once, in ``__post_init__`` (as ``TrainConfig``), so a bad
value fails when the loader is built, with a message naming it, never inside a worker.
``make_loader(root, split, batch_size)`` needs neither: the defaults follow the split's mode,
training or evaluation (:func:`resolve_train`).
"""
from __future__ import annotations

import logging
import multiprocessing
from dataclasses import dataclass

from ..errors import ConfigError
from ..validate import check_int
from ..sharding import BALANCE, EVEN_RULES, MODES

__all__ = ["SamplingOptions", "WorkerOptions", "BACKENDS", "ON_ERROR", "ON_WARNING",
           "resolve_transform_input",
           "EVAL_SPLITS", "is_eval_split", "resolve_train"]

log = logging.getLogger("shardkit.stream")

#: Split names (compared in lower case) that are evaluation splits: with ``train=None`` they get
#: the eval transform and a fixed order, and they are always read exactly once (never resampled,
#: never padded). Any other name is a training split.
EVAL_SPLITS = frozenset({"val", "valid", "validation", "test", "dev", "eval"})

#: ``make_loader`` backends: decoding threads in the calling process, or DataLoader processes.
BACKENDS = ("thread", "process")
#: What to do with a sample that fails to read or decode (webdataset's vocabulary: reraise /
#: warn-and-continue): ``"raise"`` names shard and key; ``"skip"`` leaves it out and counts it.
ON_ERROR = ("raise", "skip")
#: What to do with a sample whose decode gave libjpeg warnings (a JPEG accepted at pack time with
#: "Corrupt JPEG data" warnings, field case 12): keep it (counted, logged once), skip it (as
#: ``on_error="skip"``) or raise :class:`shardkit.decode.DecodeWarningError`.
ON_WARNING = ("keep", "skip", "raise")


def is_eval_split(split: str) -> bool:
    """Whether ``split`` names an evaluation split (:data:`EVAL_SPLITS`, any letter case)."""
    return str(split).lower() in EVAL_SPLITS


def resolve_train(train, split: str, what: str = "loader") -> bool:
    """The train/eval mode of a reader of ``split``: ``train`` itself when given, else from the
    split's name (:data:`EVAL_SPLITS`: eval; any other name: train), logged at INFO once (one
    line per reader built). An explicit ``train=True`` on an eval split is honoured, with one
    warning (the seeds' train/eval drift trap: validation augmented and shuffled).

    Raises:
        ConfigError: ``train`` is neither None nor a bool.
    """
    if train is None:
        resolved = not is_eval_split(split)
        log.info("%s of split %r: train=%s from the split's name (%s); pass train= to choose",
                 what, split, resolved, "the random crop, flip and shuffle" if resolved else
                 "eval transform, fixed order, exactly once")
        return resolved
    if not isinstance(train, bool):
        raise ConfigError(f"train={train!r}: expected True, False or None (None: from the "
                          "split's name)")
    if train and is_eval_split(split):
        log.warning("%s of split %r with train=True: %r is an evaluation split, and it gets the "
                    "training crop, flip, augmentation and shuffle; leave train unset (or "
                    "False) to evaluate on it", what, split, split)
    return train


@dataclass(frozen=True)
class SamplingOptions:
    """Which samples each rank reads in an epoch, in which order (see :mod:`shardkit.sharding`).

    Attributes:
        shuffle: reshuffle every epoch; ``None`` (default) = on in training mode, off in
            evaluation mode (``train``, or the split's name: :func:`resolve_train`), the same rule
            in :func:`~shardkit.stream.make_loader` and :class:`~shardkit.stream.ShardDataset`.
            Exactly-once either way.
        drop_last: drop a final short batch.
        even: ``None`` (auto: ``"pad"`` for training with ``world_size > 1``, else exactly-once),
            ``"pad"`` (wrap around, as ``DistributedSampler``) or ``"drop"``; refused for
            ``train=False``.
        mode: ``"exact"`` (every sample once per epoch) or ``"stream"`` (resampled with
            replacement; refused in evaluation mode and on every :data:`EVAL_SPLITS` split).
        balance: ``None`` or ``"class"`` (class-balanced draws; needs ``mode="stream"``).
        samples_per_epoch: epoch length in ``mode="stream"`` (all ranks together).
        block: shard-block order (default: on for remote tar shards): each worker reads one
            contiguous range of the epoch, so a remote shard is fetched by about one worker.
        rank, world_size: default to the initialised ``torch.distributed`` group, else ``(0, 1)``.

    Raises:
        ConfigError: a value outside the documented set.
    """

    shuffle: bool | None = None
    drop_last: bool = False
    even: str | None = None
    mode: str = "exact"
    balance: str | None = None
    samples_per_epoch: int | None = None
    block: bool | None = None
    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("even", EVEN_RULES), ("mode", MODES), ("balance", BALANCE)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}={getattr(self, name)!r} is not one of {list(allowed)}")
        for name, minimum in (("samples_per_epoch", 1), ("rank", 0), ("world_size", 1)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum,
                                                     optional=True))
        if (self.rank is None) != (self.world_size is None):
            raise ConfigError(f"give both rank and world_size or neither (got rank={self.rank!r}, "
                              f"world_size={self.world_size!r})")


@dataclass(frozen=True)
class WorkerOptions:
    """How batches are built (``num_workers``, ``prefetch_factor`` and ``pin_memory`` are
    :func:`~shardkit.stream.make_loader` arguments of their own, as in ``DataLoader``).

    Attributes:
        backend: ``"thread"`` (default: ``num_workers`` decoding threads in this process; the fused
            decode releases the GIL and batches land in this process's memory) or ``"process"``
            (``torch.utils.data.DataLoader`` worker processes; for a custom transform that holds
            the GIL). Both yield identical batches.
        persistent_workers: keep worker processes between epochs (``"process"`` only; threads
            always live as long as the loader).
        multiprocessing_context: start method name (``"fork"``, ``"forkserver"``, ``"spawn"``) or
            context; default ``"forkserver"`` with ``pin_memory`` under DDP (field case 19), else
            the platform's.
        timeout: seconds to wait for one batch before failing loudly (field case 19); > 0.
        shard_prefetch_bytes: memory bound, in bytes, of the remote shards fetched ahead of
            the readers (an fsspec URL root; :mod:`shardkit.stream.prefetch`): None (default)
            is :data:`~shardkit.stream.prefetch.DEFAULT_SHARD_PREFETCH_BYTES` (1 GiB), split
            evenly between worker processes; 0 fetches each shard on its first read instead.
            Local datasets ignore it.

    Raises:
        ConfigError: a value outside the documented set.
    """

    backend: str = "thread"
    persistent_workers: bool = False
    multiprocessing_context: object = None
    timeout: float = 120.0
    shard_prefetch_bytes: int | None = None

    def __post_init__(self) -> None:
        check_int("shard_prefetch_bytes", self.shard_prefetch_bytes, 0, optional=True)
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}: expected one of {list(BACKENDS)}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) \
                or not self.timeout > 0:
            raise ConfigError(f"timeout={self.timeout!r}: expected seconds > 0 (a hang must fail "
                              "loudly)")
        ctx = self.multiprocessing_context
        if isinstance(ctx, str) and ctx not in multiprocessing.get_all_start_methods():
            raise ConfigError(f"multiprocessing_context={ctx!r}: expected one of "
                              f"{multiprocessing.get_all_start_methods()}")


def resolve_transform_input(transform, image_size: int | None):
    """``(transform, S)`` from a reader's ``transform`` and ``image_size`` arguments: a
    :class:`~shardkit.transforms.TransformConfig` (None: ``TransformConfig(image_size=224 or
    image_size)``) with its ``image_size`` as S, or a callable with ``image_size`` as S. The
    rule of :func:`shardkit.stream.make_loader` and :func:`shardkit.ray.read_split`.

    Raises:
        ConfigError: ``image_size`` disagrees with the config's; an unknown decoder name; a
            transform that is neither; a callable without ``image_size``.
    """
    from ..decode import DECODERS
    from ..transforms import TransformConfig

    if transform is None:
        transform = TransformConfig(image_size=224 if image_size is None else image_size)
    if isinstance(transform, TransformConfig):
        if image_size is not None and image_size != transform.image_size:
            raise ConfigError(f"image_size={image_size} disagrees with transform.image_size="
                              f"{transform.image_size}; give one of them")
        if transform.decoder != "auto" and transform.decoder not in DECODERS:
            raise ConfigError(f"decoder={transform.decoder!r}: expected 'auto' or one of "
                              f"{sorted(DECODERS)}")
        return transform, transform.image_size
    if not callable(transform):
        raise ConfigError(f"transform={transform!r}: expected a TransformConfig, a callable "
                          "(data, rng, out=None) -> (S, S, 3) uint8, or None")
    if image_size is None:
        raise ConfigError("a custom transform callable needs image_size= (its output side S)")
    return transform, image_size
