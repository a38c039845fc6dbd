"""torchvision internals shardkit's augmentation needs, copied so that shardkit uses only public
torchvision API.

Copied from torchvision 0.29.1 (BSD 3-Clause License, Copyright (c) Soumith Chintala 2016), the
version ``pyproject.toml`` pins; these are private there (leading underscore) and may change
without notice in another release:

- :func:`inverse_affine_matrix`: ``_get_inverse_affine_matrix`` (``inverted=True``) of
  ``torchvision/transforms/v2/functional/_geometry.py``;
- :func:`affine_grid` and :func:`grid_transform`: ``_affine_grid`` (output size = input size)
  and ``_apply_grid_transform`` of the same file, which ``affine_image`` / ``rotate_image``
  run; :mod:`shardkit.augment.batched` calls them with one matrix per sample;
- :data:`RAND_AUGMENT_SPACE`, :data:`TRIVIAL_AUGMENT_SPACE`, :data:`AUGMIX_SPACE` and
  :data:`AUGMIX_PARTIAL_SPACE`: the ``_AUGMENTATION_SPACE`` / ``_PARTIAL_AUGMENTATION_SPACE``
  class attributes of ``RandAugment``, ``TrivialAugmentWide`` and ``AugMix`` in
  ``torchvision/transforms/v2/_auto_augment.py`` (same keys in the same order: an op is drawn by
  its index).

The arithmetic is torchvision's, operation for operation (the same float32 tensor ops in the same
order), so the pixels are the same bytes as torchvision's on the same host.
tests/test_augment_vendored.py asserts that on real photos against the public
``torchvision.transforms.v2.functional.affine`` / ``rotate``, and the tables against
torchvision's.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch.nn.functional import grid_sample

__all__ = ["inverse_affine_matrix", "affine_grid", "grid_transform", "RAND_AUGMENT_SPACE",
           "TRIVIAL_AUGMENT_SPACE", "AUGMIX_PARTIAL_SPACE", "AUGMIX_SPACE"]


def inverse_affine_matrix(center: list[float], angle: float, translate: list[float],
                          scale: float, shear: list[float]) -> list[float]:
    """The inverse of ``M = T * C * RotateScaleShear * C^-1`` as 6 Python floats (row-major
    2x3), torchvision's ``_get_inverse_affine_matrix(..., inverted=True)``.

    ``center`` and ``translate``: ``[x, y]`` in pixels (``center`` relative to the image centre,
    as ``affine_image`` passes it); ``angle`` and ``shear`` (``[x, y]``) in degrees, clockwise
    as torchvision's; ``scale`` > 0 (not checked: the ops check their parameters)."""
    rot = math.radians(angle)
    sx = math.radians(shear[0])
    sy = math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy = math.cos(sy)
    tan_sx = math.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx = cx + tx
    cy_plus_ty = cy + ty
    # RotateScaleShear without scaling; det([[a, b], [c, d]]) == 1
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    matrix = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    # RSS^-1 * C^-1 * T^-1, then the centre translation: C * RSS^-1 * C^-1 * T^-1
    matrix[2] += cx - matrix[0] * cx_plus_tx - matrix[1] * cy_plus_ty
    matrix[5] += cy - matrix[3] * cx_plus_tx - matrix[4] * cy_plus_ty
    return matrix


def affine_grid(theta: torch.Tensor, w: int, h: int) -> torch.Tensor:
    """The ``grid_sample`` grid ``(1, h, w, 2)`` (normalised, ``align_corners=False``) of the
    inverse matrix ``theta`` (float32 ``(1, 2, 3)``, pixels about the image centre) for an
    output the size of the ``h x w`` input; torchvision's ``_affine_grid`` with ``ow=w, oh=h``.
    As there, ``theta`` is rescaled in place (pass a tensor used once)."""
    dtype, device = theta.dtype, theta.device
    base_grid = torch.empty(1, h, w, 3, dtype=dtype, device=device)
    x_grid = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device)
    base_grid[..., 0].copy_(x_grid)
    y_grid = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h,
                            device=device).unsqueeze_(-1)
    base_grid[..., 1].copy_(y_grid)
    base_grid[..., 2].fill_(1)
    rescaled_theta = theta.transpose(1, 2).div_(torch.tensor([0.5 * w, 0.5 * h], dtype=dtype,
                                                             device=device))
    output_grid = base_grid.view(1, h * w, 3).bmm(rescaled_theta)
    return output_grid.view(1, h, w, 2)


def grid_transform(img: torch.Tensor, grid: torch.Tensor, mode: str,
                   fill: Optional[list[float]]) -> torch.Tensor:
    """Samples ``img`` (``(..., C, H, W)``, uint8 or float) at ``grid`` (float ``(N, oh, ow, 2)``:
    N = 1 for every image, or one grid per image of a ``(N, C, H, W)`` batch) with
    ``mode`` ``"nearest"`` or ``"bilinear"``; pixels from outside the image get ``fill`` (C
    floats, 0-255 for uint8) or, for None, the zero padding. Returns ``img``'s dtype, shape
    ``(..., C, oh, ow)`` (integer images rounded). torchvision's ``_apply_grid_transform``."""
    input_shape = img.shape
    output_height, output_width = grid.shape[1], grid.shape[2]
    num_channels, input_height, input_width = input_shape[-3:]
    output_shape = input_shape[:-3] + (num_channels, output_height, output_width)
    if img.numel() == 0:
        return img.reshape(output_shape)
    img = img.reshape(-1, num_channels, input_height, input_width)
    squashed_batch_size = img.shape[0]
    fp = img.dtype == grid.dtype
    float_img = img if fp else img.to(grid.dtype)
    if squashed_batch_size > 1:
        grid = grid.expand(squashed_batch_size, -1, -1, -1)
    # a mask channel for the fill colour: cheaper than a second grid_sample
    if fill is not None:
        mask = torch.ones((squashed_batch_size, 1, input_height, input_width),
                          dtype=float_img.dtype, device=float_img.device)
        float_img = torch.cat((float_img, mask), dim=1)
    float_img = grid_sample(float_img, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if fill is not None:
        float_img, mask = torch.tensor_split(float_img, indices=(-1,), dim=-3)
        mask = mask.expand_as(float_img)
        fill_img = torch.tensor(fill, dtype=float_img.dtype,
                                device=float_img.device).view(1, -1, 1, 1)
        if mode == "nearest":
            float_img = torch.where(mask < 0.5, fill_img.expand_as(float_img), float_img)
        else:  # bilinear: img * mask + (1 - mask) * fill = mask * (img - fill) + fill
            float_img = float_img.sub_(fill_img).mul_(mask).add_(fill_img)
    img = float_img.round_().to(img.dtype) if not fp else float_img
    return img.reshape(output_shape)


Space = dict[str, tuple[Callable[[int, int, int], Optional[torch.Tensor]], bool]]
"""Op name -> ``(magnitudes(num_bins, height, width) -> tensor of num_bins or None, signed)``."""

RAND_AUGMENT_SPACE: Space = {
    "Identity": (lambda num_bins, height, width: None, False),
    "ShearX": (lambda num_bins, height, width: torch.linspace(0.0, 0.3, num_bins), True),
    "ShearY": (lambda num_bins, height, width: torch.linspace(0.0, 0.3, num_bins), True),
    "TranslateX": (
        lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * width, num_bins),
        True),
    "TranslateY": (
        lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * height, num_bins),
        True),
    "Rotate": (lambda num_bins, height, width: torch.linspace(0.0, 30.0, num_bins), True),
    "Brightness": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
    "Color": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
    "Contrast": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
    "Sharpness": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
    "Posterize": (
        lambda num_bins, height, width:
            (8 - (torch.arange(num_bins) / ((num_bins - 1) / 4))).round().int(),
        False),
    "Solarize": (lambda num_bins, height, width: torch.linspace(1.0, 0.0, num_bins), False),
    "AutoContrast": (lambda num_bins, height, width: None, False),
    "Equalize": (lambda num_bins, height, width: None, False),
}
"""``RandAugment._AUGMENTATION_SPACE``."""

TRIVIAL_AUGMENT_SPACE: Space = {
    "Identity": (lambda num_bins, height, width: None, False),
    "ShearX": (lambda num_bins, height, width: torch.linspace(0.0, 0.99, num_bins), True),
    "ShearY": (lambda num_bins, height, width: torch.linspace(0.0, 0.99, num_bins), True),
    "TranslateX": (lambda num_bins, height, width: torch.linspace(0.0, 32.0, num_bins), True),
    "TranslateY": (lambda num_bins, height, width: torch.linspace(0.0, 32.0, num_bins), True),
    "Rotate": (lambda num_bins, height, width: torch.linspace(0.0, 135.0, num_bins), True),
    "Brightness": (lambda num_bins, height, width: torch.linspace(0.0, 0.99, num_bins), True),
    "Color": (lambda num_bins, height, width: torch.linspace(0.0, 0.99, num_bins), True),
    "Contrast": (lambda num_bins, height, width: torch.linspace(0.0, 0.99, num_bins), True),
    "Sharpness": (lambda num_bins, height, width: torch.linspace(0.0, 0.99, num_bins), True),
    "Posterize": (
        lambda num_bins, height, width:
            (8 - (torch.arange(num_bins) / ((num_bins - 1) / 6))).round().int(),
        False),
    "Solarize": (lambda num_bins, height, width: torch.linspace(1.0, 0.0, num_bins), False),
    "AutoContrast": (lambda num_bins, height, width: None, False),
    "Equalize": (lambda num_bins, height, width: None, False),
}
"""``TrivialAugmentWide._AUGMENTATION_SPACE``."""

AUGMIX_PARTIAL_SPACE: Space = {
    "ShearX": (lambda num_bins, height, width: torch.linspace(0.0, 0.3, num_bins), True),
    "ShearY": (lambda num_bins, height, width: torch.linspace(0.0, 0.3, num_bins), True),
    "TranslateX": (
        lambda num_bins, height, width: torch.linspace(0.0, width / 3.0, num_bins), True),
    "TranslateY": (
        lambda num_bins, height, width: torch.linspace(0.0, height / 3.0, num_bins), True),
    "Rotate": (lambda num_bins, height, width: torch.linspace(0.0, 30.0, num_bins), True),
    "Posterize": (
        lambda num_bins, height, width:
            (4 - (torch.arange(num_bins) / ((num_bins - 1) / 4))).round().int(),
        False),
    "Solarize": (lambda num_bins, height, width: torch.linspace(1.0, 0.0, num_bins), False),
    "AutoContrast": (lambda num_bins, height, width: None, False),
    "Equalize": (lambda num_bins, height, width: None, False),
}
"""``AugMix._PARTIAL_AUGMENTATION_SPACE`` (``all_ops=False``)."""

AUGMIX_SPACE: Space = {
    **AUGMIX_PARTIAL_SPACE,
    "Brightness": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
    "Color": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
    "Contrast": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
    "Sharpness": (lambda num_bins, height, width: torch.linspace(0.0, 0.9, num_bins), True),
}
"""``AugMix._AUGMENTATION_SPACE`` (``all_ops=True``)."""
