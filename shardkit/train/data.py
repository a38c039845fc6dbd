"""Loaders for training: one ``TransformConfig`` for train (RandomResizedCrop + flip) and
val / test (resize + center crop), normalisation on the device, and fixed overfit batches.

Mean / std, the resize interpolation and the eval crop fraction are resolved once per run
(:func:`resolve_data_fields`): explicit values, else the model's pretrained config (timm's
``resolve_data_config``) when the run starts from weights, else shardkit's defaults.

The data location is ``config.data`` and nothing else: shard paths come from its manifest
(field case 23: HRNet-Image-Classification rebuilt the data path from other config fields).
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..transforms import IMAGENET_MEAN, IMAGENET_STD
from .config import TrainConfig
from .dist import DistInfo

__all__ = ["resolve_mean_std", "resolve_data_fields", "model_data_config", "transform_config",
           "train_loader", "eval_loader", "fixed_batches", "make_normalizer"]


def model_data_config(model: str) -> dict:
    """The preprocessing of timm model ``model``'s default pretrained weights, from its
    pretrained config alone (nothing is downloaded): ``{"mean": (3 floats), "std": (3 floats),
    "interpolation": str, "crop_pct": float, "crop_mode": str}`` from
    ``timm.data.resolve_data_config`` (what ``resolve_model_data_config`` gives for the built
    model).

    Raises:
        ConfigError: timm has no pretrained config for ``model``.
    """
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(model)
    if cfg is None:
        raise ConfigError(f"model {model!r} has no timm pretrained config to take mean/std, "
                          "interpolation and crop_pct from; give --mean-std imagenet|dataset, "
                          "--interpolation and --crop-pct")
    data = resolve_data_config(pretrained_cfg=cfg.to_dict())
    return {k: data[k] for k in ("mean", "std", "interpolation", "crop_pct", "crop_mode")}


def resolve_data_fields(config: TrainConfig, manifest: dict) -> dict:
    """The preprocessing values of a run, as ``TrainConfig`` fields: ``{"mean_std": source,
    "mean": [3 floats], "std": [3 floats], "interpolation": str, "crop_pct": float}``.

    Each comes from the config when it is set (``mean`` / ``std`` win over ``mean_std``); else
    from ``mean_std`` (``auto``: ``model`` when the run starts from weights, ``pretrained`` or
    ``initial_checkpoint``, else ``imagenet``); interpolation and crop_pct from the model's
    pretrained config (:func:`model_data_config`) when the run starts from weights, else
    ``bilinear`` and ``0.875`` (:class:`shardkit.transforms.TransformConfig`'s defaults).
    ``config.replace(**result)`` is the run's config as ``config.yaml`` records it.

    Raises:
        ConfigError: ``mean_std=dataset`` without manifest stats, no timm pretrained config, or
            a pretrained interpolation shardkit's resize has no filter for.
    """
    from ..transforms import TransformConfig

    pretrained = config.uses_pretrained_config
    source = config.mean_std
    if source == "auto":
        source = "model" if pretrained else "imagenet"
    model = (model_data_config(config.model)
             if pretrained or (source == "model" and config.mean is None) else None)
    if config.mean is not None:
        mean, std = list(config.mean), list(config.std)
    elif source == "model":
        mean, std = list(model["mean"]), list(model["std"])
    else:
        mean, std = map(list, resolve_mean_std(config.replace(mean_std=source), manifest))
    defaults = TransformConfig()
    interpolation = config.interpolation or (model["interpolation"] if model and pretrained
                                             else defaults.interpolation)
    crop_pct = config.crop_pct or (model["crop_pct"] if model and pretrained
                                   else defaults.crop_pct)
    from .config import INTERPOLATIONS

    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"the pretrained config of {config.model!r} resizes with "
                          f"{interpolation!r}, which shardkit's resize does not have; give "
                          f"--interpolation (one of {list(INTERPOLATIONS)})")
    return {"mean_std": source, "mean": [float(v) for v in mean],
            "std": [float(v) for v in std], "interpolation": interpolation,
            "crop_pct": float(crop_pct)}


def resolve_mean_std(config: TrainConfig, manifest: dict) -> tuple[tuple, tuple]:
    """RGB ``(mean, std)`` on the 0-1 scale: ``config.mean`` / ``std`` when set, else
    ImageNet's (:data:`shardkit.transforms.IMAGENET_MEAN` / ``IMAGENET_STD``, from timm), the
    train split's manifest ``stats`` (``mean_std=dataset``), or the model's pretrained config
    (``model``, and ``auto`` for a run from weights; :func:`resolve_data_fields`).

    Raises:
        ConfigError: ``mean_std=dataset`` and the manifest has no stats for the train split.
    """
    if config.mean is not None:
        return tuple(config.mean), tuple(config.std)
    if config.mean_std in ("model", "auto"):
        fields = resolve_data_fields(config, manifest)
        return tuple(fields["mean"]), tuple(fields["std"])
    if config.mean_std == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    stats = (manifest.get("stats") or {}).get(config.train_split)
    if not stats or "mean" not in stats or "std" not in stats:
        raise ConfigError(f"--mean-std dataset: the manifest of {config.data} has no stats for "
                          f"split {config.train_split!r}; run `shardkit stats {config.data} "
                          f"--split {config.train_split}` first, or use --mean-std imagenet")
    mean, std = tuple(float(v) for v in stats["mean"]), tuple(float(v) for v in stats["std"])
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ConfigError(f"manifest stats of {config.train_split!r} are not 3 RGB means and 3 "
                          f"positive stds: mean={mean}, std={std}")
    return mean, std


def transform_config(config: TrainConfig, mean, std):
    """The one :class:`shardkit.transforms.TransformConfig` shared by train and eval loaders:
    ``config.image_size``, ``mean`` / ``std``, and ``config.interpolation`` / ``crop_pct``
    (resolved as :func:`resolve_data_fields` does when unset)."""
    from ..transforms import TransformConfig

    interpolation, crop_pct = config.interpolation, config.crop_pct
    if interpolation is None or crop_pct is None:
        fields = resolve_data_fields(config.replace(mean=list(mean), std=list(std)), {})
        interpolation, crop_pct = fields["interpolation"], fields["crop_pct"]
    return TransformConfig(image_size=config.image_size, mean=tuple(mean), std=tuple(std),
                           interpolation=interpolation, crop_pct=crop_pct)


def _loader(config: TrainConfig, info: DistInfo, tc, split: str, *, train: bool, even,
            balance=None, mode: str = "exact", samples_per_epoch: int | None = None,
            num_workers: int | None = None, drop_last: bool = False, cached: bool = True,
            augment=None):
    from ..stream import SamplingOptions, WorkerOptions, make_loader

    workers = config.num_workers if num_workers is None else num_workers
    # the decoded cache: train and eval loaders of a run share one arena per split
    cache = config.cache if cached else "none"
    final = cache != "none" and not train and config.cache_eval == "final"
    sampling = SamplingOptions(drop_last=drop_last, even=even, mode=mode, balance=balance,
                               samples_per_epoch=samples_per_epoch, rank=info.rank,
                               world_size=info.world_size)
    return make_loader(
        config.data, split, config.batch_size, train=train, image_size=config.image_size,
        num_workers=workers, prefetch_factor=config.prefetch_factor if workers != 0 else None,
        pin_memory=torch.cuda.is_available() and config.device != "cpu", seed=config.seed,
        transform=tc, sampling=sampling,
        workers=WorkerOptions(persistent_workers=workers != 0), cache=cache,
        cache_max_side=config.cache_max_side if cache != "none" and not final else None,
        cache_eval="final" if final else "pixels", augment=augment,
        augment_device=config.augment_device if augment is not None else None)


def train_loader(config: TrainConfig, info: DistInfo, tc):
    """Shuffled, augmented train loader; every rank yields the same number of batches
    (``even="pad"``). With ``balance="class"`` or ``samples_per_epoch`` an epoch is
    ``samples_per_epoch`` (default: the split size) draws with replacement (``mode="stream"``),
    class-balanced or uniform. The last short batch is
    dropped (a 1-image batch breaks BatchNorm in train mode). With mixup / cutmix in
    ``config.augment`` the loader mixes each batch and yields float32 ``(N, K)`` soft targets
    (the trainer adds label smoothing to them)."""
    if config.balance == "class" or config.samples_per_epoch:  # draws with replacement
        return _loader(config, info, tc, config.train_split, train=True, even="pad",
                       balance="class" if config.balance == "class" else None, mode="stream",
                       samples_per_epoch=config.samples_per_epoch, drop_last=True,
                       augment=config.augment)
    return _loader(config, info, tc, config.train_split, train=True, even="pad", drop_last=True,
                   augment=config.augment)


def eval_loader(config: TrainConfig, info: DistInfo, tc, split: str):
    """Unshuffled resize + center-crop loader of ``split``; ranks split the samples exactly once
    (``even=None``), so merging every rank's predictions counts each sample once."""
    return _loader(config, info, tc, split, train=False, even=None)


def fixed_batches(config: TrainConfig, info: DistInfo,
                  tc) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``config.overfit_batches`` train-split batches with the *eval* transform
    (no augmentation), as uint8 ``(N, 3, S, S)`` images and int64 ``(N,)`` labels on the CPU.

    Raises:
        ConfigError: the train split has fewer batches than asked for.
    """
    loader = _loader(config, info, tc, config.train_split, train=False, even=None,
                     num_workers=0, cached=False)
    batches = []
    for images, labels in loader:
        batches.append((images.clone(), labels.clone()))
        if len(batches) == config.overfit_batches:
            return batches
    raise ConfigError(f"overfit_batches={config.overfit_batches} but split "
                      f"{config.train_split!r} gives only {len(batches)} batches of "
                      f"{config.batch_size} on this rank")


def make_normalizer(mean, std, device: torch.device, channels_last: bool):
    """``wrap(batches)``: an iterable of uint8 ``(N, 3, S, S)`` images and labels (int64
    ``(N,)``, or float32 ``(N, K)`` soft targets) -> :class:`shardkit.stream.DeviceNormalizer`
    yielding float32 ``(x / 255 - mean) / std`` images and the labels on ``device``
    (channels_last when asked; side-stream copies on CUDA)."""
    from ..stream import DeviceNormalizer

    def wrap(batches):
        return DeviceNormalizer(batches, device, mean=mean, std=std, channels_last=channels_last)

    return wrap
