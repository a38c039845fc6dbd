"""What :func:`~shardkit.stream.make_loader` makes of its arguments, one step per function, in
its order: the option objects (:func:`check_options`), train or eval (:func:`resolve_mode`), the
transform (:func:`resolve_transform`), the augmentation (:func:`resolve_augment`), this
process's rank (:func:`rank_sampling`), ``device_decode`` (:func:`check_device_decode`) and the
thread warning (:func:`warn_torch_threads`). Each raises the error a user sees for a wrong
combination, naming the values; none builds anything.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import torch

from ..errors import ConfigError, LoaderError
from .cache import parse_cache
from .options import (SamplingOptions, WorkerOptions, is_eval_split, resolve_train,
                      resolve_transform_input)
from .source import dist_rank_world

__all__ = ["check_options", "resolve_mode", "rank_sampling", "resolve_transform",
           "check_device_decode", "resolve_augment", "warn_torch_threads"]

log = logging.getLogger("shardkit.stream")


def warn_torch_threads(spec, aug_device, backend: str, num_workers: int) -> None:
    """One warning when ops without a C kernel would run torch's tensor functions inside
    decoding threads while torch's intra-op pool has several threads: the two compete for the
    cores (measured: adjust_hue at 2 torch threads on a busy 2-core host, 70x its one-thread
    time). DataLoader worker processes run torch with one thread each."""
    slow = [] if aug_device is not None or backend != "thread" else spec.torch_path_ops()
    if slow and num_workers > 0 and torch.get_num_threads() > 1:
        log.warning("augment ops %s run torchvision tensor functions in %d decoding threads "
                    "while torch uses %d intra-op threads; they compete for the cores: use "
                    "WorkerOptions(backend='process'), augment_device='cuda', or "
                    "torch.set_num_threads(1) if the process does nothing else on the CPU",
                    slow, num_workers, torch.get_num_threads())


def resolve_transform(transform, train: bool, image_size: int | None):
    """``(callable, S)`` from a ``TransformConfig``, a callable, or None (the default config):
    :func:`~shardkit.stream.options.resolve_transform_input`, a config made into its
    transform."""
    from ..transforms import TransformConfig, make_transform

    transform, size = resolve_transform_input(transform, image_size)
    if isinstance(transform, TransformConfig):
        return make_transform(transform, train), size
    return transform, size


def check_options(sampling, workers) -> tuple[SamplingOptions, WorkerOptions]:
    """``(sampling, workers)`` with None as the defaults.

    Raises:
        ConfigError: either is not of its option class.
    """
    sampling = sampling or SamplingOptions()
    workers = workers or WorkerOptions()
    if not isinstance(sampling, SamplingOptions) or not isinstance(workers, WorkerOptions):
        raise ConfigError("sampling= takes a SamplingOptions and workers= a WorkerOptions "
                          f"(got {type(sampling).__name__}, {type(workers).__name__})")
    return sampling, workers


def resolve_mode(train, split: str, sampling: SamplingOptions) -> tuple[bool, str]:
    """``(train, why)``: the mode (:func:`~shardkit.stream.options.resolve_train`) and, for the
    errors of an eval loader, how it came to be one.

    Raises:
        LoaderError: ``even`` or a resampling ``mode`` in evaluation (exactly once, always).
    """
    train_given = train is not None
    train = resolve_train(train, split, "make_loader")
    why = "train=False" if train_given else f"train unset: {split!r} is an eval split by its name"
    if not train and sampling.even is not None:
        raise LoaderError(f"even={sampling.even!r} is for training; evaluation ({why}) reads "
                          "every sample exactly once")
    if not train and sampling.mode != "exact":
        raise LoaderError(f"mode={sampling.mode!r} resamples; evaluation (split {split!r}, "
                          f"{why}) needs mode='exact'")
    return train, why


def rank_sampling(sampling: SamplingOptions, train: bool, split: str) -> SamplingOptions:
    """``sampling`` with this process's ``rank`` and ``world_size``
    (:func:`~shardkit.stream.source.dist_rank_world`) and ``even="pad"`` by default when a
    training split is read by several ranks."""
    rank, world_size = dist_rank_world(sampling.rank, sampling.world_size)
    if sampling.even is None and train and world_size > 1 and not is_eval_split(split):
        sampling = replace(sampling, even="pad")
    return replace(sampling, rank=rank, world_size=world_size)


def check_device_decode(tf, device_decode, cache) -> None:
    """Raises ConfigError when ``device_decode`` is given with a transform that cannot be split
    into crop drawing and batched decoding (a custom callable), or with a decoded cache."""
    if device_decode is None:
        return
    if not hasattr(tf, "crop_box"):
        raise ConfigError("device_decode needs a TransformConfig transform (a custom callable "
                          "cannot be split into crop drawing and batched decoding)")
    if parse_cache(cache)[0] != "none":
        raise ConfigError(f"cache={cache!r} and device_decode={device_decode!r}: the cache "
                          "holds CPU pixels; use one or the other")


def resolve_augment(augment, augment_device, device_decode, train: bool, split: str,
                    why: str = "train=False"):
    """``(AugmentSpec, device or None)``: None means the ops run on the CPU rows; ``why``: how
    the loader came to be an eval loader (for the error)."""
    from ..augment import AugmentSpec

    spec = AugmentSpec.parse(augment)
    if not train and (spec.ops or spec.batch_ops):
        raise ConfigError(f"augment={spec.describe()} on an eval loader ({why}, split "
                          f"{split!r}): evaluation never augments (per-sample ops and the batch "
                          "ops mixup/cutmix run in training loaders only)")
    if augment_device is None:
        device = device_decode
    elif str(augment_device) == "cpu":
        if device_decode is not None and not spec.is_identity:
            raise ConfigError(f"augment_device='cpu' with device_decode={device_decode!r}: the "
                              "pixels are decoded on the device; augment there (leave "
                              "augment_device unset)")
        device = None
    else:
        device = torch.device(augment_device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"augment_device={augment_device!r}, but torch sees no CUDA "
                              "device here; leave it unset to augment in the decoding threads")
    return spec, (None if spec.is_identity or device is None else torch.device(device))
