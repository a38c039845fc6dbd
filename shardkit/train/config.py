"""Training configuration: one frozen dataclass, loaded from YAML and overridden by CLI flags.

The resolution order is ``TrainConfig`` defaults < ``configs/train/<name>.yaml`` < CLI flags (timm's
``train.py`` does the same with ``--config``; the resolved config is saved as ``RUN/config.yaml``
next to the results, as timm saves ``args.yaml``). Every value is validated here, once, so the
training engine never sees an invalid combination.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..validate import check_int

__all__ = ["TrainConfig", "CONFIG_DIR", "DEFAULT_WARMUP_EPOCHS", "DEFAULT_WARMUP_MAX_FRACTION",
           "CHOICES", "INTERPOLATIONS", "load_config", "resolve_config_path", "save_config",
           "SCHEDULE_FIELDS"]

log = logging.getLogger("shardkit.train")

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "train"

DEFAULT_WARMUP_EPOCHS = 1.0       # warmup when neither warmup_epochs nor warmup_steps is set
DEFAULT_WARMUP_MAX_FRACTION = 0.1  # ... cut to at most this fraction of a schedule it would fill

CHOICES = {
    "opt": ("sgd", "adamw"),
    "loss": ("ce", "weighted-ce", "focal"),
    "balance": ("none", "class"),
    "amp": ("auto", "bf16", "fp16", "off"),
    "monitor": ("macro_f1", "top1", "loss"),
    "mean_std": ("auto", "imagenet", "dataset", "model"),
}
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # the resize filters of shardkit.transforms

# Fields that define the step count, the LR schedule and "best": a resumed run must keep them.
SCHEDULE_FIELDS = ("model", "epochs", "batch_size", "image_size", "lr", "opt", "momentum",
                   "weight_decay", "warmup_epochs", "warmup_steps", "min_lr", "overfit_batches",
                   "balance", "samples_per_epoch", "seed", "monitor")


@dataclass(frozen=True)
class TrainConfig:
    """Everything one ``shardkit train`` run needs (units in the comments; ``None`` = unset).

    ``data`` is the packed dataset folder (``manifest.json`` lives there; the shard locations come
    from the manifest and nothing else, field case 23). ``out`` is the run folder.
    ``max_steps`` / ``patience`` of 0 mean None (so a CLI flag can switch off a YAML value).

    Raises:
        ConfigError: a value outside its allowed set or range (the message names both).
    """

    data: str | None = None               # packed dataset root (folder with manifest.json)
    out: str | None = None                # run folder: config.yaml, metrics.json, checkpoints/...
    model: str = "hrnet_w18_small"        # any timm model name
    pretrained: bool = False              # timm's pretrained weights of `model` (timm fetches)
    initial_checkpoint: str | None = None # local checkpoint loaded after init (shapes checked)
    # a string `pretrained` (the earlier spelling of initial_checkpoint) is moved there, with a
    # deprecation warning.
    epochs: int = 30                      # planned epochs; defines the LR schedule length
    max_steps: int | None = None          # cut the run short after this many steps (0/None: never)
    batch_size: int = 64                  # per rank
    image_size: int = 224                 # square side, pixels
    lr: float = 0.05                      # peak learning rate (after warmup)
    opt: str = "sgd"                      # sgd (Nesterov momentum) | adamw
    momentum: float = 0.9                 # SGD momentum
    weight_decay: float = 5e-5            # applied to weights only, never to norm layers or biases
    warmup_epochs: float | None = None    # linear warmup in epochs (ignored if warmup_steps set)
    warmup_steps: int | None = None       # linear warmup in steps (wins; 0 = no warmup)
    # both None: the default warmup of DEFAULT_WARMUP_EPOCHS, cut to at most
    # DEFAULT_WARMUP_MAX_FRACTION of the schedule when it would not be shorter (with a note);
    # an explicit value that is not shorter than the schedule is a ConfigError instead.
    min_lr: float = 0.0                   # cosine floor
    label_smoothing: float = 0.1          # 0 <= x < 1
    clip_grad: float | None = None        # max global L2 norm of gradients
    loss: str = "ce"                      # ce | weighted-ce | focal
    focal_gamma: float = 2.0              # focusing parameter of the focal loss (Lin et al. 2017)
    balance: str = "none"                 # none | class (class-balanced sampling in make_loader)
    samples_per_epoch: int | None = None  # draw this many train samples per epoch (replacement)
    amp: str = "auto"                     # auto | bf16 | fp16 | off
    compile: bool = False                 # torch.compile the model
    channels_last: bool = True            # NHWC memory format for model and inputs
    patience: int | None = None           # early stop after N evals without gain (0/None: off)
    monitor: str = "macro_f1"             # macro_f1 | top1 | loss
    mean_std: str = "auto"                # auto | imagenet | dataset | model (see below)
    mean: list[float] | None = None       # explicit RGB mean, 0-1 scale (wins over mean_std)
    std: list[float] | None = None        # explicit RGB std, 0-1 scale (given with mean)
    interpolation: str | None = None      # bilinear | bicubic | nearest; None: see below
    crop_pct: float | None = None         # eval center-crop fraction in (0, 1]; None: see below
    # mean_std: imagenet (timm's constants), dataset (the manifest stats of the train split),
    # model (the model's pretrained config, timm.data.resolve_data_config), auto: model with
    # pretrained / initial_checkpoint, else imagenet. interpolation / crop_pct None: the model's
    # pretrained config with pretrained / initial_checkpoint, else bilinear / 0.875. The run
    # saves the values it resolved (shardkit.train.data.resolve_data_fields) in config.yaml.
    seed: int = 0
    device: str = "auto"                  # auto | cpu | cuda | cuda:N
    num_workers: int | str = "auto"       # loader workers per rank, or auto (measured, settled)
    prefetch_factor: int | str = "auto"   # batches prefetched per worker, or auto
    cache: str = "none"                   # decoded cache: none | ram | auto | disk:DIR
    cache_max_side: int | None = None     # cache images with the longer side at most this
    cache_eval: str = "pixels"            # pixels | final (eval loaders cache their final crops)
    augment: Any = "none"                 # augmentation spec: preset or list of op dicts
    augment_device: str | None = None     # None: decoding threads (CPU); cuda | cuda:N: on the GPU
    overfit_batches: int = 0              # >0: train on N fixed eval-transform batches, repeatedly
    eval_every: int = 1                   # evaluate val every N epochs (and always at the end)
    checkpoint_every: int = 1             # write last.pt every N epochs (and at the end)
    train_split: str = "train"            # must exist in the dataset
    val_split: str | None = None          # None: "val" if the dataset has it, else no validation
    test_split: str | None = None         # None: "test" if the dataset has it, else no test
    resume: str | None = None             # checkpoint file, or a run folder (its last.pt)
    progress: bool = True                 # tqdm bar per epoch on rank 0
    sync_timing: bool = False             # CUDA: synchronise around each step for exact timing
    # data_wait_fraction is the share of step time spent waiting for the next batch. Off
    # (default): no extra synchronisation; the wait is host-side only (time blocked in the
    # loader), which the per-step loss read-out already bounds, and the GPU keeps running
    # backward/optimizer work queued behind the next batch fetch. On: torch.cuda.synchronize
    # before fetching and after each step, so wait and compute split wall-clock GPU time
    # exactly, at the cost of that overlap (slower steps). No effect on the CPU.

    def __post_init__(self) -> None:
        self._move_legacy_pretrained()
        for name in ("max_steps", "patience"):  # 0 means "no limit" (lets a flag undo a YAML value)
            if getattr(self, name) == 0:
                object.__setattr__(self, name, None)
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is not one of {list(allowed)}")
        positive = ("epochs", "batch_size", "image_size", "eval_every", "checkpoint_every")
        for name, minimum in (("num_workers", 0), ("prefetch_factor", 1)):
            if getattr(self, name) != "auto":
                object.__setattr__(self, name, check_int(
                    name, getattr(self, name), minimum, message="{name}={value!r}: expected "
                    "auto or an integer >= {minimum}"))
        for name in positive:
            value = getattr(self, name)
            object.__setattr__(self, name, check_int(name, value, 1,
                                                     message="{name}={value!r}: expected an "
                                                     "integer >= 1"))
        non_negative = ("overfit_batches", "seed")
        for name in non_negative:
            value = getattr(self, name)
            object.__setattr__(self, name, check_int(name, value, 0,
                                                     message="{name}={value!r}: expected an "
                                                     "integer >= 0"))
        object.__setattr__(self, "warmup_steps", check_int(
            "warmup_steps", self.warmup_steps, 0, optional=True,
            message="{name}={value!r}: expected an integer >= 0 or null"))
        from ..stream.cache import CACHE_EVAL, parse_cache

        parse_cache(self.cache)  # ConfigError naming the value
        if self.cache_eval not in CACHE_EVAL:
            raise ConfigError(f"cache_eval={self.cache_eval!r} is not one of {list(CACHE_EVAL)}")
        object.__setattr__(self, "cache_max_side", check_int(
            "cache_max_side", self.cache_max_side, 1, optional=True,
            message="{name}={value!r}: expected an integer >= 1 or null"))
        from ..augment import AugmentSpec

        spec = AugmentSpec.parse(self.augment)  # ConfigError naming the op or parameter
        if spec.batch_ops and self.loss != "ce":
            raise ConfigError(f"augment mixup/cutmix train on soft targets (timm's "
                              f"SoftTargetCrossEntropy); loss={self.loss!r} cannot take them "
                              "(use loss: ce)")
        if self.augment_device is not None and not (
                self.augment_device in ("cpu", "cuda") or self.augment_device.startswith("cuda:")):
            raise ConfigError(f"augment_device={self.augment_device!r}: expected cpu, cuda, "
                              "cuda:N or null")
        for name in ("train_split", "val_split", "test_split"):
            value = getattr(self, name)
            if not (value is None and name != "train_split") and not (
                    isinstance(value, str) and value):
                raise ConfigError(f"{name}={value!r}: expected a split name")
        for name in ("max_steps", "patience", "samples_per_epoch"):
            value = getattr(self, name)
            object.__setattr__(self, name, check_int(name, value, 1, optional=True,
                                                     message="{name}={value!r}: expected an "
                                                     "integer >= 1 or null"))
        for name in ("lr", "momentum", "weight_decay", "warmup_epochs", "min_lr", "focal_gamma"):
            value = getattr(self, name)
            if value is None and name == "warmup_epochs":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name}={value!r}: expected a finite number >= 0")
        if self.lr <= 0:
            raise ConfigError(f"lr={self.lr!r}: expected a number > 0")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr={self.min_lr!r} is above lr={self.lr!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing={self.label_smoothing!r}: expected 0 <= x < 1")
        if self.clip_grad is not None and not self.clip_grad > 0:
            raise ConfigError(f"clip_grad={self.clip_grad!r}: expected a number > 0 or null")
        for name in ("compile", "channels_last", "progress", "sync_timing"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: expected true or false")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        self._check_data_fields()

    def _move_legacy_pretrained(self) -> None:
        """``pretrained: PATH`` (the earlier meaning) -> ``initial_checkpoint: PATH``, warned."""
        if self.pretrained is None:
            object.__setattr__(self, "pretrained", False)
        if not isinstance(self.pretrained, (str, Path)):
            return
        path = str(self.pretrained)
        if self.initial_checkpoint not in (None, path):
            raise ConfigError(f"pretrained={path!r} (a checkpoint path, the earlier spelling) "
                              f"and initial_checkpoint={self.initial_checkpoint!r}: give one")
        log.warning("pretrained: %s (a checkpoint file) is deprecated: use initial_checkpoint "
                    "(--initial-checkpoint FILE); pretrained is now a switch for timm's "
                    "pretrained weights", path)
        object.__setattr__(self, "initial_checkpoint", path)
        object.__setattr__(self, "pretrained", False)

    def _check_data_fields(self) -> None:
        """pretrained / initial_checkpoint, mean / std, interpolation and crop_pct."""
        if not isinstance(self.pretrained, bool):
            raise ConfigError(f"pretrained={self.pretrained!r}: expected true or false")
        if self.initial_checkpoint is not None and not (
                isinstance(self.initial_checkpoint, str) and self.initial_checkpoint):
            raise ConfigError(f"initial_checkpoint={self.initial_checkpoint!r}: expected a "
                              "checkpoint file path or null")
        if (self.mean is None) != (self.std is None):
            raise ConfigError(f"mean={self.mean!r}, std={self.std!r}: give both or neither")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is None:
                continue
            if (not isinstance(value, (list, tuple)) or len(value) != 3 or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    for v in value) or (name == "std" and min(value) <= 0)):
                raise ConfigError(f"{name}={value!r}: expected 3 finite RGB numbers on the 0-1 "
                                  f"scale{' (each > 0)' if name == 'std' else ''}")
            object.__setattr__(self, name, [float(v) for v in value])
        if self.interpolation is not None and self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"interpolation={self.interpolation!r}: expected one of "
                              f"{list(INTERPOLATIONS)} or null")
        if self.crop_pct is not None and not (
                isinstance(self.crop_pct, (int, float)) and not isinstance(self.crop_pct, bool)
                and 0 < self.crop_pct <= 1):
            raise ConfigError(f"crop_pct={self.crop_pct!r}: expected a number in (0, 1] or null")

    @property
    def uses_pretrained_config(self) -> bool:
        """Whether the model starts from weights (``pretrained`` or ``initial_checkpoint``), so
        the unset mean/std, interpolation and crop_pct come from its pretrained config."""
        return bool(self.pretrained or self.initial_checkpoint)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain ``{field: value}`` dict (YAML/JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, *, source: str = "config") -> "TrainConfig":
        """Builds a config from ``values``; unknown keys raise :class:`ConfigError` naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {unknown}; known keys: {sorted(known)}")
        if values.get("amp") is False:  # YAML 1.1 reads a bare `off` as false
            values = {**values, "amp": "off"}
        return cls(**values)


def resolve_config_path(name_or_path: str | Path) -> Path:
    """``"default"`` -> ``configs/train/default.yaml``; an existing path is returned as is.

    Raises:
        ConfigError: neither a file nor a config name under ``configs/train/``.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    named = CONFIG_DIR / f"{name_or_path}.yaml"
    if named.is_file():
        return named
    available = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError(f"config {str(name_or_path)!r} is neither a file nor one of {available} "
                      f"in {CONFIG_DIR}")


def load_config(config: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Defaults < YAML file ``config`` (name or path) < ``overrides`` (``None`` values ignored).

    ``overrides`` may also hold timm's ``aa``, ``mixup`` and ``cutmix``: they are applied to the
    resolved ``augment`` spec (:func:`shardkit.train.timm_flags.compose_augment`, which says
    what replaces what) and logged as notes where the mapping is not exact.

    Raises:
        ConfigError: unreadable YAML, unknown keys, or an invalid value.
    """
    timm_flags = {k: overrides.pop(k, None) for k in ("aa", "mixup", "cutmix")}
    values: dict = {}
    if config is not None:
        path = resolve_config_path(config)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must hold a mapping, got {type(loaded).__name__}")
        values.update(loaded)
        source = str(path)
    else:
        source = "overrides"
    values.update({k: v for k, v in overrides.items() if v is not None})
    if any(v is not None for v in timm_flags.values()):
        from .timm_flags import compose_augment

        values["augment"], notes = compose_augment(values.get("augment", "none"), **timm_flags)
        for note in notes:
            log.warning(note)
    return TrainConfig.from_dict(values, source=source)


def save_config(config: TrainConfig, path: str | Path, comments: tuple[str, ...] = ()) -> None:
    """Writes the resolved config as YAML (keys in field order), atomically, after
    ``comments`` as ``# ...`` lines (``--config`` reads the file back)."""
    from shardkit.storage.atomic import atomic_write_bytes

    head = "".join(f"# {' '.join(str(c).split())}\n" for c in comments)
    atomic_write_bytes(path, (head + yaml.safe_dump(config.to_dict(), sort_keys=False)).encode())
