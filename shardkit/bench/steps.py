"""Training-step stand-ins for the benchmark: none, a fixed sleep, or a real timm model step.

Every step returns only after its work has finished on the device (``torch.cuda.synchronize``),
so the harness's clock readings after it are true wall times; CUDA kernels run asynchronously
and a clock read without synchronising measures only the launch (case 20, pytorch/pytorch#80129).
"""
from __future__ import annotations

import time

import torch

from shardkit.errors import ConfigError

__all__ = ["Step", "NoStep", "SleepStep", "ModelStep", "resolve_device", "batch_images",
           "AMP_CHOICES"]

#: ``ModelStep(amp=...)`` values: float32, or bfloat16 autocast.
AMP_CHOICES = (None, "bf16")


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available else cpu; ``"cpu"``; ``"cuda"`` / ``"cuda:N"``.

    Raises:
        ConfigError: a CUDA device is asked for but ``torch.cuda.is_available()`` is False, or the
            name is not a device.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"device={name!r} is not a torch device; expected auto, cpu or cuda[:N]"
                          ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} but no CUDA device is available; use --device cpu "
                          f"or --step-ms to simulate the step")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r}; expected auto, cpu or cuda[:N]")
    return dev


def batch_images(batch) -> torch.Tensor | None:
    """The images tensor of a batch: ``batch[0]`` of a tuple/list, or the batch itself."""
    if isinstance(batch, (tuple, list)):
        batch = batch[0] if batch else None
    return batch if isinstance(batch, torch.Tensor) else None


class Step:
    """A per-batch training step. ``__call__(batch)`` returns after the work has completed."""

    name = "none"
    device = torch.device("cpu")

    def __call__(self, batch) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def info(self) -> dict:
        """JSON-ready description: ``{"kind", "device", ...}``."""
        return {"kind": self.name, "device": str(self.device)}


class NoStep(Step):
    """No step at all: the loop measures the loader alone (every second spent is loader time)."""

    def __call__(self, batch) -> None:
        return None


class SleepStep(Step):
    """A step that takes a fixed time: CPU ``time.sleep`` or, on CUDA, ``torch.cuda._sleep``.

    Answers "would this loader keep a GPU needing ``ms`` per batch fed?" on any machine. On CUDA
    the batch is first copied to the device (``non_blocking=True``, so pinned memory matters as
    it would in training), then the GPU spins for ``ms`` (cycles calibrated once against CUDA
    events), then the host synchronises.

    Args:
        ms: step time in milliseconds, >= 0.
        device: ``torch.device``; cpu sleeps on the host.

    Raises:
        ConfigError: ``ms`` is negative.
    """

    name = "sleep"

    def __init__(self, ms: float, device: torch.device | str = "cpu"):
        if not ms >= 0:
            raise ConfigError(f"step_ms={ms!r}; expected a number >= 0")
        self.ms = float(ms)
        self.device = torch.device(device)
        self._cycles = self._calibrate() if self.device.type == "cuda" and ms > 0 else 0

    def _calibrate(self) -> int:
        probe = 10_000_000
        torch.cuda._sleep(probe)  # warm up the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
        per_ms = probe / max(start.elapsed_time(end), 1e-6)
        return max(1, int(per_ms * self.ms))

    def __call__(self, batch) -> None:
        if self.device.type == "cuda":
            images = batch_images(batch)
            if images is not None:
                images.to(self.device, non_blocking=True)
            if self._cycles:
                torch.cuda._sleep(self._cycles)
            torch.cuda.synchronize(self.device)
        elif self.ms > 0:
            time.sleep(self.ms / 1000.0)

    def info(self) -> dict:
        return {**super().info(), "step_ms": self.ms}


class ModelStep(Step):
    """One real optimisation step of a timm model: H2D copy, normalise, forward, backward, SGD.

    A uint8 ``(N, 3, S, S)`` batch is copied to ``device``, converted to float32 with ImageNet
    mean/std (timm ``IMAGENET_DEFAULT_MEAN/STD``), channels_last; a floating-point batch is
    taken as already normalised (e.g. by :class:`shardkit.stream.DeviceNormalizer`) and only
    moved and made channels_last. It is fed to
    ``timm.create_model(model_name, num_classes=num_classes)`` (random init: no download) with
    cross-entropy loss against the batch labels (or zeros when the batch has none), under
    ``torch.autocast`` with ``amp="bf16"`` (the loss in float32), then SGD (lr 1e-3, momentum
    0.9).

    Args:
        model_name: a timm model name, e.g. ``"hrnet_w18_small"``.
        num_classes: logits of the head, >= 1.
        device: where to run.
        amp: None (float32) or ``"bf16"`` (bfloat16 autocast, as ``shardkit train --amp bf16``;
            needs no loss scaling).

    Raises:
        ConfigError: unknown timm model name, num_classes < 1 or an ``amp`` not in
            :data:`AMP_CHOICES`.
    """

    name = "model"

    def __init__(self, model_name: str, num_classes: int, device: torch.device | str = "cpu",
                 amp: str | None = None):
        import timm

        if num_classes < 1:
            raise ConfigError(f"num_classes={num_classes}; expected >= 1")
        if amp not in AMP_CHOICES:
            raise ConfigError(f"amp={amp!r}; expected one of {AMP_CHOICES}")
        self.amp = amp
        if not timm.is_model(model_name):
            raise ConfigError(f"model={model_name!r} is not a timm model "
                              f"(see timm.list_models(), e.g. 'hrnet_w18_small')")
        self.model_name = model_name
        self.num_classes = num_classes
        self.device = torch.device(device)
        self.model = timm.create_model(model_name, num_classes=num_classes, pretrained=False)
        self.model.to(self.device, memory_format=torch.channels_last).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        from shardkit.transforms import IMAGENET_MEAN, IMAGENET_STD, scaled_mean_std

        self.mean, self.std = scaled_mean_std(IMAGENET_MEAN, IMAGENET_STD, self.device)

    def __call__(self, batch) -> None:
        images = batch_images(batch)
        if images is None:
            raise ConfigError(f"ModelStep needs (images, labels) batches of tensors; got "
                              f"{type(batch).__name__}")
        labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else None
        from shardkit.transforms import normalize_on_device

        x = images.to(self.device, non_blocking=True)
        if x.is_floating_point():  # normalised already (DeviceNormalizer)
            x = x.contiguous(memory_format=torch.channels_last)
        else:
            x = normalize_on_device(x, self.mean, self.std, channels_last=True)
        if isinstance(labels, torch.Tensor):  # int64 classes, or float (N, K) soft targets
            y = labels.to(self.device, non_blocking=True)  # out of range: torch raises
            y = y if y.is_floating_point() else y.long()
        else:
            y = torch.zeros(len(x), dtype=torch.long, device=self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp == "bf16"):
            logits = self.model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def info(self) -> dict:
        out = {**super().info(), "model": self.model_name, "num_classes": self.num_classes}
        if self.amp is not None:
            out["amp"] = self.amp
        return out
