"""Augmentation with torchvision v2 semantics, drawn from shardkit's per-sample RNG.

- :mod:`~shardkit.augment.spec`: the spec (presets, op lists, strength schedules).
- :mod:`~shardkit.augment.ops`: each op's parameter sampling -> a *program* per sample.
- :mod:`~shardkit.augment.prims`: the pixel primitives: torchvision's functional ops on
  ``(3, H, W)`` uint8 tensors of any device, and in-place C fast paths on ``(H, W, 3)`` rows.
- :mod:`~shardkit.augment.mix`: batch-level mixup / cutmix with soft targets (timm semantics),
  applied by the loader to each whole batch (:func:`shardkit.stream.make_loader`).
- :mod:`~shardkit.augment.batched`: programs applied to a whole batch on a device.
- :mod:`~shardkit.augment.vendored`: the torchvision 0.29.1 internals these need (affine matrix
  and grid, policy magnitude tables), copied so that only public torchvision API is used.

Where they run: ``augment_device="cpu"`` applies each sample's program inside the loader's
decoding threads, on the uint8 row the fused crop just wrote; ``"cuda"`` (any torch device)
carries the programs with the batch and applies them after the transfer
(:class:`shardkit.stream.DeviceNormalizer`). Both apply the same program, so the pixels agree
(exactly, or within the tolerances stated in :mod:`~shardkit.augment.prims`).
"""
from shardkit.augment.mix import NO_MIX, BatchMix, MixDraw, apply_mix, mix_rng, soft_targets
from shardkit.augment.prims import apply_hwc, apply_torch, fast_path_available
from shardkit.augment.spec import PRESETS, AugmentSpec, scheduled_value

__all__ = ["AugmentSpec", "PRESETS", "scheduled_value", "apply_hwc", "apply_torch",
           "fast_path_available", "BatchMix", "MixDraw", "NO_MIX", "apply_mix", "mix_rng",
           "soft_targets"]
