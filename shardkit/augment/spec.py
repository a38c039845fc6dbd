"""The augmentation spec: a preset name or a list of op dicts, with strength schedules.

One spec is used everywhere: ``make_loader(augment=SPEC)``, ``shardkit train --augment SPEC``,
the ``augment:`` key of ``configs/train/*.yaml``, ``shardkit bench --augment`` and
``shardkit inspect --augment``. Examples::

    "standard"
    [{op: color_jitter, brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.0},
     {op: rand_augment, num_ops: 2, magnitude: {start: 5, end: 12, schedule: linear, epochs: 30}},
     {op: random_erasing, p: 0.25},
     {op: mixup, alpha: 0.8}, {op: cutmix, alpha: 1.0}]

Any numeric parameter may be a schedule ``{start, end, schedule, epochs}``: its value at epoch
``e`` (0-based) is ``start + (end - start) * f(t)`` with ``t = min(e / (epochs - 1), 1)`` and
``f(t) = t`` (linear), ``(1 - cos(pi t)) / 2`` (cosine); ``step`` holds ``start`` for epochs
``< epochs`` and ``end`` from then on. Integer parameters (``num_ops``, ``bits``,
``kernel_size``, ...) are rounded to the nearest integer, halves to even (Python's ``round``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardkit.augment import ops as ops_mod
from shardkit.errors import ConfigError

PRESETS: dict[str, list[dict]] = {
    "none": [],
    "light": [{"op": "color_jitter", "brightness": 0.2, "contrast": 0.2, "saturation": 0.2}],
    "standard": [{"op": "color_jitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4}],
    "randaugment": [{"op": "rand_augment", "num_ops": 2, "magnitude": 9}],
    "trivialaugment": [{"op": "trivial_augment"}],
}
"""Preset specs. ``standard`` is timm's default colour jitter (0.4, no hue); ``randaugment`` is
torchvision's ``RandAugment()`` defaults (2 ops at magnitude 9 of 31 bins); the crop and flip of
the train transform come in every preset."""

SCHEDULES = ("linear", "cosine", "step")
_INT_PARAMS = {"num_ops", "bits", "kernel_size", "num_magnitude_bins", "severity",
               "mixture_width", "chain_depth"}


def scheduled_value(value: Any, epoch: int, name: str = "value") -> Any:
    """``value`` at ``epoch``: a schedule dict is evaluated (see the module doc), anything else
    is returned as it is. Raises ConfigError on a malformed schedule."""
    if not isinstance(value, dict):
        return value
    missing = {"start", "end", "epochs"} - set(value)
    extra = set(value) - {"start", "end", "epochs", "schedule"}
    if missing or extra:
        raise ConfigError(f"schedule of {name}: {value!r}; expected keys start, end, epochs "
                          f"and optional schedule ({'/'.join(SCHEDULES)})")
    kind = value.get("schedule", "linear")
    if kind not in SCHEDULES:
        raise ConfigError(f"schedule of {name}: {kind!r}; expected one of {SCHEDULES}")
    try:
        start, end = float(value["start"]), float(value["end"])
        epochs = int(value["epochs"])
    except (TypeError, ValueError):
        raise ConfigError(f"schedule of {name}: {value!r}; start and end must be numbers and "
                          "epochs an integer") from None
    if epochs < 1:
        raise ConfigError(f"schedule of {name}: epochs={epochs}; expected >= 1")
    if kind == "step":
        return end if epoch >= epochs else start
    t = min(max(epoch, 0) / max(epochs - 1, 1), 1.0)
    f = t if kind == "linear" else (1.0 - math.cos(math.pi * t)) / 2.0
    return start + (end - start) * f


def _load_text(text: str) -> Any:
    """A spec given as text: a preset name, a path to a YAML/JSON file, or inline YAML (flow
    ``[{op: ...}]`` or block ``- {op: ...}`` style)."""
    import yaml

    stripped = text.strip()
    if stripped in PRESETS:
        return stripped
    try:
        if stripped.endswith((".yaml", ".yml", ".json")):
            path = Path(stripped)
            if not path.is_file():
                raise ConfigError(f"augment spec file {path} does not exist")
            loaded = yaml.safe_load(path.read_text())
            return loaded.get("augment", loaded) if isinstance(loaded, dict) else loaded
        loaded = yaml.safe_load(stripped)
    except yaml.YAMLError as e:
        raise ConfigError(f"augment={text!r} is not valid YAML: "
                          f"{' '.join(str(e).split())}") from None
    if isinstance(loaded, (list, dict)):
        return loaded
    raise ConfigError(f"augment={text!r}; expected a preset ({', '.join(PRESETS)}), a list of "
                      "op dicts (YAML), or a .yaml file")


@dataclass(frozen=True)
class AugmentSpec:
    """A parsed, validated augmentation spec.

    Attributes:
        ops: per-sample ops, in order: ``(name, params)`` (params may hold schedules).
        batch_ops: ``mixup`` / ``cutmix`` entries: ``(name, params)``.
        preset: the preset name it came from, or None.
    """

    ops: tuple[tuple[str, dict], ...] = ()
    batch_ops: tuple[tuple[str, dict], ...] = ()
    preset: str | None = None

    @classmethod
    def parse(cls, spec: Any) -> "AugmentSpec":
        """From a preset name, a list of op dicts, YAML text / file, an AugmentSpec or None
        (``none``). Raises ConfigError naming the op or parameter that is wrong."""
        if isinstance(spec, AugmentSpec):
            return spec
        if spec is None:
            spec = "none"
        if isinstance(spec, str):
            spec = _load_text(spec)
        preset = None
        if isinstance(spec, str):
            preset, spec = spec, PRESETS[spec]
        if isinstance(spec, dict):
            spec = [spec]
        if not isinstance(spec, (list, tuple)):
            raise ConfigError(f"augment={spec!r}; expected a preset name or a list of op dicts")
        per_sample, batch = [], []
        for k, entry in enumerate(spec):
            if not isinstance(entry, dict) or "op" not in entry:
                raise ConfigError(f"augment entry {k}: {entry!r}; expected a dict with 'op'")
            params = {key: v for key, v in entry.items() if key != "op"}
            name = str(entry["op"])
            if name in ops_mod.BATCH_OPS:
                from shardkit.augment.mix import check_batch_params

                check_batch_params(name, params)
                batch.append((name, params))
            elif name in ops_mod.OPS:
                ops_mod.check_params(name, params)
                per_sample.append((name, params))
            else:
                raise ConfigError(f"augment op {name!r} is unknown; expected one of "
                                  f"{sorted(ops_mod.OPS) + list(ops_mod.BATCH_OPS)}")
        out = cls(tuple(per_sample), tuple(batch), preset)
        out._validate()
        return out

    def _validate(self) -> None:
        """Draws every op once at its schedules' first and last epoch and applies the draws to
        a small image with the torch primitives, so a bad value (a range, an interpolation, a
        sigma) fails at parse time, not in a worker hours later."""
        import torch

        from shardkit.augment.mix import check_batch_values
        from shardkit.augment.prims import apply_torch

        rng = np.random.default_rng(0)
        image = torch.zeros(3, 48, 48, dtype=torch.uint8)
        for epoch in sorted({0, self.last_scheduled_epoch()}):
            for name, params in self.resolved(epoch):
                try:
                    for _ in range(4):
                        apply_torch(image, ops_mod.OPS[name](rng, 48, 48, **params))
                except ConfigError as e:
                    raise ConfigError(f"augment op {name!r} (epoch {epoch}): {e}") from None
                except (TypeError, ValueError, IndexError, KeyError, RuntimeError) as e:
                    raise ConfigError(f"augment op {name!r} with {params} (epoch {epoch}): "
                                      f"{e}") from None
            for name, params in self.resolved(epoch, batch=True):
                check_batch_values(name, params, epoch)

    @property
    def is_identity(self) -> bool:
        """No per-sample op (the batch ops may still be set)."""
        return not self.ops

    def last_scheduled_epoch(self) -> int:
        """The epoch from which every schedule holds its ``end`` (0 without schedules)."""
        last = 0
        for _, params in self.ops + self.batch_ops:
            for v in params.values():
                if isinstance(v, dict) and "epochs" in v:
                    last = max(last, int(v["epochs"]) - (0 if v.get("schedule") == "step" else 1))
        return last

    def resolved(self, epoch: int, batch: bool = False) -> list[tuple[str, dict]]:
        """The ops with every schedule evaluated at ``epoch`` (ints rounded)."""
        out = []
        for name, params in (self.batch_ops if batch else self.ops):
            values = {}
            for key, v in params.items():
                v = scheduled_value(v, epoch, f"{name}.{key}")
                values[key] = int(round(v)) if key in _INT_PARAMS and v is not None else v
            out.append((name, values))
        return out

    def scheduled_values(self, epoch: int) -> dict[str, float]:
        """``{"<index>.<op>.<param>": value}`` of the scheduled parameters at ``epoch`` (for
        TensorBoard and metrics.json)."""
        out = {}
        for k, (name, params) in enumerate(self.ops + self.batch_ops):
            for key, v in params.items():
                if isinstance(v, dict):
                    out[f"{k}.{name}.{key}"] = float(scheduled_value(v, epoch))
        return out

    def batch_values(self, epoch: int) -> dict[str, float]:
        """``{"<index>.<op>.<param>": value}`` of every batch op's ``alpha`` and ``p`` at
        ``epoch``, scheduled or not, defaults filled in (mixup alpha 0.8, cutmix alpha 1.0,
        p 1.0); indexed as :meth:`scheduled_values`. Empty without batch ops."""
        from shardkit.augment.mix import BATCH_DEFAULTS

        out = {}
        for k, (name, params) in enumerate(self.resolved(epoch, batch=True), len(self.ops)):
            for key, value in {**BATCH_DEFAULTS[name], **params}.items():
                out[f"{k}.{name}.{key}"] = float(value)
        return out

    def draw(self, rng: np.random.Generator, height: int, width: int, epoch: int) -> list:
        """The program of one sample (see :mod:`shardkit.augment.prims`): every op's draw from
        ``rng``, in spec order, with the schedules at ``epoch``."""
        program: list = []
        for name, params in self.resolved_cached(epoch):
            program += ops_mod.OPS[name](rng, height, width, **params)
        return program

    def resolved_cached(self, epoch: int) -> list[tuple[str, dict]]:
        cache = self.__dict__.setdefault("_resolved", {})
        if epoch not in cache:
            cache[epoch] = self.resolved(epoch)
        return cache[epoch]

    def to_config(self) -> Any:
        """JSON-serialisable form: the preset name, or the list of op dicts."""
        if self.preset is not None:
            return self.preset
        return [{"op": n, **p} for n, p in self.ops + self.batch_ops]

    def describe(self) -> str:
        return self.preset or json.dumps(self.to_config(), sort_keys=True)

    def torch_path_ops(self) -> list[str]:
        """Ops that run torchvision's tensor functions on the CPU path (no C kernel):
        perspective, gaussian_blur, aug_mix, and rotation/affine with an interpolation other
        than nearest (hue jitter has a C kernel)."""
        out = []
        for epoch in sorted({0, self.last_scheduled_epoch()}):
            for name, params in self.resolved(epoch):
                slow = (name in ("perspective", "gaussian_blur", "aug_mix")
                        or params.get("interpolation", "nearest") != "nearest")
                if slow and name not in out:
                    out.append(name)
        return out

    def uses_hue(self, epoch: int = 0) -> bool:
        """Whether hue jitter is on at ``epoch`` (a colour_jitter with a non-zero hue)."""
        for name, params in self.resolved(epoch):
            hue = params.get("hue", 0.0) if name == "color_jitter" else 0.0
            if (hue if isinstance(hue, (int, float)) else max(abs(h) for h in hue)) > 0:
                return True
        return False
