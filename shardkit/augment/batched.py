"""Programs applied to a whole batch on a device: one batched tensor op per primitive and step.

``augment_device="cuda"`` gets a batch of uint8 ``(N, 3, H, W)`` images and N programs (each
sample's own parameters). Applying them sample by sample would cost ~10 kernel launches per op
per sample on the training thread; here step ``k`` of every program is grouped by primitive, and
each group runs as one torchvision-equivalent tensor op over its samples with per-sample
parameters (factors, thresholds, masks and affine grids as tensors). Primitives without a
batched form (hue, perspective, gaussian blur, AugMix, erase) run per sample with
:data:`shardkit.augment.prims.TORCH`.

The arithmetic is torchvision v2's (``_color.py``, ``_geometry.py``), with the per-sample
parameter as a tensor instead of a Python float. torchvision's blend
``a.mul(r).add_(b, alpha=1 - r)`` takes a scalar ``alpha`` and is a fused multiply-add; with a
per-sample ``1 - r`` it is computed in float64 and rounded once, which is the same value
(tests/test_augment_batched.py compares with the per-sample path on real photos).
"""
from __future__ import annotations

from typing import Callable

import torch
import torchvision.transforms.v2.functional as F

from shardkit.augment.prims import TORCH, fill3
from shardkit.augment.vendored import affine_grid, grid_transform, inverse_affine_matrix


def _per_sample(x: torch.Tensor, values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=x.device).view(-1, 1, 1, 1)


def _fused_add(a: torch.Tensor, b: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """float32 ``a + b * k`` rounded once, as torch's ``a.add_(b, alpha=k)`` (a fused
    multiply-add) computes it with a scalar ``k``: in float64 (exact products of float32
    values), then rounded to float32."""
    return torch.addcmul(a.double(), b.double(), k.double()).float()


def _blend(x: torch.Tensor, other: torch.Tensor, ratios: list[float]) -> torch.Tensor:
    """torchvision ``_blend`` with per-sample ratios (``alpha = 1.0 - ratio`` computed in
    Python floats, then float32, as torch converts a scalar ``alpha``)."""
    return _fused_add(x.mul(_per_sample(x, ratios)), other,
                      _per_sample(x, [1.0 - r for r in ratios])).clamp_(0, 255).to(torch.uint8)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """float32 ``(N, 1, H, W)``: the floor of torchvision's float grayscale, as
    ``adjust_contrast`` / ``adjust_saturation`` take it for uint8 images. The public uint8
    ``rgb_to_grayscale`` truncates the same float values (all in [0, 255]), which is the floor."""
    return F.rgb_to_grayscale(x, num_output_channels=1).to(torch.float32)


def b_brightness(x, args):
    return x.mul(_per_sample(x, [a[0] for a in args])).clamp_(0, 255).to(torch.uint8)


def b_contrast(x, args):
    mean = torch.mean(_gray(x), dim=(-3, -2, -1), keepdim=True)
    return _blend(x, mean, [float(a[0]) for a in args])


def b_saturation(x, args):
    return _blend(x, _gray(x), [float(a[0]) for a in args])


def b_sharpness(x, args):
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = torch.tensor([[a, a, a], [a, b, a], [a, a, a]], dtype=torch.float32,
                          device=x.device).expand(3, 1, 3, 3)
    out = x.to(torch.float32, copy=True)
    blurred = torch.nn.functional.conv2d(out, kernel, groups=3).round_()
    view = out[..., 1:-1, 1:-1]
    view.copy_(_fused_add(view, blurred.sub_(view), _per_sample(x, [1.0 - q[0] for q in args])))
    return out.clamp_(0, 255).to(torch.uint8)


def b_posterize(x, args):
    masks = [(((1 << int(a[0])) - 1) << (8 - int(a[0]))) if int(a[0]) < 8 else 255 for a in args]
    return x & _per_sample(x, masks, torch.uint8)


def b_solarize(x, args):
    return torch.where(x >= _per_sample(x, [float(a[0]) for a in args]), 255 - x, x)


def _grid_transform(x, matrices, fill, interpolation) -> torch.Tensor:
    """torchvision's ``affine_image`` for a batch with one inverse matrix per sample."""
    n, _, h, w = x.shape
    theta = torch.tensor(matrices, dtype=torch.float32, device=x.device).reshape(n, 2, 3)
    grid = torch.cat([affine_grid(theta[i:i + 1], w=w, h=h) for i in range(n)])
    return grid_transform(x, grid, interpolation, fill=fill3(fill))


def b_affine(x, args):
    matrices = [inverse_affine_matrix([0.0, 0.0], float(a[0]), [float(t) for t in a[1]],
                                      float(a[2]), [float(s) for s in a[3]]) for a in args]
    return _grid_transform(x, matrices, args[0][4], args[0][5])


def b_shear_origin(x, args):
    h, w = x.shape[-2:]
    center = [-w * 0.5, -h * 0.5]  # center=[0, 0]: the top-left corner
    matrices = [inverse_affine_matrix(center, 0.0, [0.0, 0.0], 1.0,
                                      [float(s) for s in a[0]]) for a in args]
    return _grid_transform(x, matrices, args[0][1], args[0][2])


def b_rotate(x, args):
    matrices = [inverse_affine_matrix([0.0, 0.0], -float(a[0]), [0.0, 0.0], 1.0, [0.0, 0.0])
                for a in args]
    return _grid_transform(x, matrices, args[0][1], args[0][2])


BATCHED: dict[str, Callable] = {
    "brightness": b_brightness, "contrast": b_contrast, "saturation": b_saturation,
    "sharpness": b_sharpness, "posterize": b_posterize, "solarize": b_solarize,
    "autocontrast": lambda x, args: F.autocontrast(x), "equalize": lambda x, args: F.equalize(x),
    "grayscale": lambda x, args: F.rgb_to_grayscale(x, num_output_channels=3),
    "affine": b_affine, "shear_origin": b_shear_origin, "rotate": b_rotate,
    "identity": lambda x, args: x,
}
"""Primitive -> ``fn(images (n, 3, H, W) uint8, [args of each sample]) -> images``."""


def _group_key(name: str, args: tuple):
    """Samples share a batched call when the primitive and its non-per-sample arguments (fill,
    interpolation of the geometric ops) agree; rotations by a multiple of 90 degrees take
    torchvision's exact rot90 path per sample."""
    if name in ("affine", "shear_origin", "rotate"):
        fill, interp = args[-2], args[-1]
        if interp != "nearest" and interp != "bilinear":
            return None
        if name == "rotate" and float(args[0]) % 90 == 0:
            return None
        return (name, str(fill), interp)
    return (name,) if name in BATCHED else None


def apply_batch(images: torch.Tensor, programs: list) -> torch.Tensor:
    """Runs ``programs[i]`` on ``images[i]`` for every sample; returns the batch (a new tensor
    or ``images`` modified in place). ``images``: uint8 ``(N, 3, H, W)`` on any device."""
    if len(programs) != images.shape[0]:
        raise ValueError(f"{len(programs)} programs for a batch of {images.shape[0]} images")
    steps = max((len(p) for p in programs), default=0)
    for k in range(steps):
        groups: dict = {}
        for i, program in enumerate(programs):
            if k < len(program):
                name, args = program[k]
                key = _group_key(name, args)
                if key is None:  # per sample, as prims.apply_torch
                    images[i] = TORCH[name](images[i], *args)
                else:
                    groups.setdefault(key, []).append((i, args))
        for key, items in groups.items():
            idx = torch.tensor([i for i, _ in items], device=images.device)
            images[idx] = BATCHED[key[0]](images[idx], [args for _, args in items])
    return images
