"""Augmentation primitives: one pixel operation with concrete arguments, on a uint8 image.

Every primitive has a torch implementation that calls :mod:`torchvision.transforms.v2.functional`
on a ``(3, H, W)`` uint8 tensor of any device (the reference, and the per-sample device path),
and most have a CPU fast path that works in place on a C-contiguous ``(H, W, 3)`` uint8 numpy row
(a row of the loader's batch buffer) with the GIL released: the C kernels of
:mod:`shardkit.augment._kernels`, or a 256-entry lookup table computed in numpy with
torchvision's float32 steps.

What the fast paths guarantee (tests/test_augment_ops.py, on real photos with random
parameters; the reasons are in ``shardkit/augment/_kernels.c``):

- the same bytes on every host (x86-64 with or without AVX2/FMA, aarch64): the kernels use no
  CPU-specific rounding;
- hue equals torchvision's pixels exactly on every host (its float32 HSV steps are divisions,
  floors and single additions and products, correctly rounded everywhere; no multiply-add);
- a run of consecutive pixelwise colour primitives (brightness, contrast, saturation,
  grayscale, posterize, solarize) runs in one pass per contrast primitive, with the bytes of
  one pass per primitive (``_kernels._set_fused``, tests/test_augment_fused.py);
- colour, sharpness, posterize, solarize, autocontrast, equalize, grayscale and erase equal
  torchvision's pixels exactly wherever torch's CPU kernels fuse multiply-adds (AVX2, AVX-512,
  NEON) and on CUDA. On an x86-64 CPU without AVX2, torch rounds twice and a value within float
  rounding of an integer may truncate one level apart (near-grey pixels under saturation: about
  1.3% of a photo's pixels; sharpness 0.02%). The same holds on any CPU in torch's scalar tail,
  the last values (up to 31) of a tensor whose size is not a multiple of its vector step
  (224 x 224 x 3 has none);
- nearest ``affine`` / ``rotate`` / ``shear_origin``: torchvision's own sampling grid differs
  between CPUs (MKL's sgemm kernel is chosen per CPU), so no implementation can equal it on
  every host. Every output pixel whose exact source coordinate is more than 1e-3 px from a
  pixel boundary samples the same source pixel (or fill) as torchvision on any CPU; nearer than
  that, either of the two neighbouring source pixels may be taken. Measured against torchvision
  on 15 million pixels of photos: the same source pixel everywhere on an AVX-512 Intel CPU
  (MKL's AVX-512 path), all but about 1 per million on MKL's AVX2 / SSE4.2 paths (AMD EPYC).

A *program* is a list of ``(name, args)`` pairs drawn by :mod:`shardkit.augment.ops`; it is the
whole randomness of one sample, so the CPU and device paths apply the same one.

If ``_kernels`` was not built (no C compiler at install), one warning at import names why, and
every primitive takes the torch path (the same pixels as the device path, slower); ``make
install`` refuses an install that lost it where it could be built.
"""
from __future__ import annotations

import importlib
import logging
from typing import Callable

import numpy as np
import torch
import torchvision.transforms.v2.functional as F
from torchvision.transforms.v2 import InterpolationMode

from shardkit.augment.vendored import inverse_affine_matrix

logger = logging.getLogger("shardkit.augment")

try:  # by name: a missing module reads "No module named ...", not a circular-import message
    _kernels = importlib.import_module("shardkit.augment._kernels")
except ImportError as _exc:  # not built (no C compiler at install): the torch path everywhere
    _kernels = None
    logger.warning("shardkit.augment._kernels is not available (%s): the CPU augmentation "
                   "fast path is off and every primitive runs torchvision's tensor ops (the same "
                   "pixels, several times slower). Rebuild with a C compiler and Python's "
                   "headers: `pip install -e . -v`", _exc)


def fill3(fill) -> list[float] | None:
    """A fill value (int or 3 ints, 0-255) as the 3-float list torchvision takes; None stays
    None (torchvision: no fill mask, pixels from outside are the zero padding)."""
    if fill is None:
        return None
    if isinstance(fill, (int, float)):
        return [float(fill)] * 3
    return [float(v) for v in fill]


# ------------------------------------------------------------------ torch (any device) versions
def t_brightness(img, factor):
    return F.adjust_brightness(img, factor)


def t_contrast(img, factor):
    return F.adjust_contrast(img, factor)


def t_saturation(img, factor):
    return F.adjust_saturation(img, factor)


def t_hue(img, factor):
    return F.adjust_hue(img, factor)


def t_sharpness(img, factor):
    return F.adjust_sharpness(img, factor)


def t_posterize(img, bits):
    return F.posterize(img, int(bits))


def t_solarize(img, threshold):
    return F.solarize(img, float(threshold))


def t_autocontrast(img):
    return F.autocontrast(img)


def t_equalize(img):
    return F.equalize(img)


def t_grayscale(img):
    return F.rgb_to_grayscale(img, num_output_channels=3)


def t_affine(img, angle, translate, scale, shear, fill, interpolation="nearest"):
    return F.affine(img, angle=float(angle), translate=list(translate), scale=float(scale),
                    shear=list(shear), interpolation=InterpolationMode(interpolation),
                    fill=fill3(fill), center=None)


def t_shear_origin(img, shear, fill, interpolation="nearest"):
    """RandAugment's ShearX/ShearY: an affine shear about the top-left corner
    (torchvision ``_AutoAugmentBase._apply_image_or_video_transform``)."""
    return F.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=list(shear),
                    interpolation=InterpolationMode(interpolation), fill=fill3(fill),
                    center=[0, 0])


def t_rotate(img, angle, fill, interpolation="nearest"):
    return F.rotate(img, float(angle), interpolation=InterpolationMode(interpolation),
                    fill=fill3(fill))


def t_perspective(img, startpoints, endpoints, fill, interpolation="bilinear"):
    return F.perspective(img, startpoints, endpoints,
                         interpolation=InterpolationMode(interpolation), fill=fill3(fill))


def t_gaussian_blur(img, kernel_size, sigma):
    return F.gaussian_blur(img, [int(kernel_size)] * 2, [float(sigma)] * 2)


def t_erase(img, i, j, h, w, value):
    v = torch.tensor(fill3(value), dtype=img.dtype, device=img.device).view(3, 1, 1)
    return F.erase(img, i, j, h, w, v)


def t_augmix(img, weights, chains):
    """torchvision v2 ``AugMix.forward`` on one image with drawn weights and chains:
    ``m0 * image + sum_i w_i * chain_i(image)`` in float32, truncated to uint8.
    ``weights``: ``(m0, w_1..w_k)``; ``chains``: k programs."""
    mix = float(weights[0]) * img
    for w, chain in zip(weights[1:], chains):
        mix.add_(float(w) * apply_torch(img, chain))
    return mix.to(img.dtype)


TORCH: dict[str, Callable] = {
    "brightness": t_brightness, "contrast": t_contrast, "saturation": t_saturation,
    "hue": t_hue, "sharpness": t_sharpness, "posterize": t_posterize, "solarize": t_solarize,
    "autocontrast": t_autocontrast, "equalize": t_equalize, "grayscale": t_grayscale,
    "affine": t_affine, "shear_origin": t_shear_origin, "rotate": t_rotate,
    "perspective": t_perspective, "gaussian_blur": t_gaussian_blur, "erase": t_erase,
    "augmix": t_augmix, "identity": lambda img: img,
}
"""Primitive name -> ``fn(img (3, H, W) uint8 tensor, *args) -> (3, H, W) uint8 tensor``."""


def apply_torch(img: torch.Tensor, program) -> torch.Tensor:
    """Runs ``program`` on ``img`` ((3, H, W) uint8, any device) with the torch primitives;
    returns a new tensor (``img`` is not modified)."""
    for name, args in program:
        img = TORCH[name](img, *args)
    return img


# ------------------------------------------------------------------ CPU fast path (in place)
# Runs of primitives with a C kernel go to ``_kernels.run`` (one call per run, without the
# GIL), which builds its lookup tables with torchvision's float32 steps. torch's
# ``a.add_(b, alpha=k)`` is a fused multiply-add on the CPU, and the kernels compute it exactly.
def _theta(matrix) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(matrix, np.float32))


def _fill_ints(fill) -> tuple[int, int, int]:
    """The fill of the nearest-neighbour kernel: None (the zero padding) is black."""
    return (0, 0, 0) if fill is None else tuple(int(v) for v in fill3(fill))


def _affine_theta(name: str, shape, args) -> tuple[float, ...] | None:
    """The float32 inverse matrix of a nearest-neighbour ``affine`` / ``shear_origin`` /
    ``rotate`` as torchvision builds it, or None where torchvision takes another path
    (bilinear; a rotation by a multiple of 90 degrees: an exact rot90)."""
    if args[-1] != "nearest":
        return None
    h, w = shape[:2]
    if name == "affine":
        angle, translate, scale, shear = args[:4]
        m = inverse_affine_matrix([0.0, 0.0], float(angle), [float(t) for t in translate],
                                  float(scale), [float(s) for s in shear])
    elif name == "shear_origin":  # center=[0, 0] in pixels, relative to the image centre
        m = inverse_affine_matrix([-w * 0.5, -h * 0.5], 0.0, [0.0, 0.0], 1.0,
                                  [float(s) for s in args[0]])
    else:
        if float(args[0]) % 90 == 0:
            return None
        m = inverse_affine_matrix([0.0, 0.0], -float(args[0]), [0.0, 0.0], 1.0, [0.0, 0.0])
    return _theta(m)


def _via_torch(row: np.ndarray, fn, *args) -> None:
    out = fn(torch.from_numpy(row).permute(2, 0, 1), *args)
    row[...] = out.permute(1, 2, 0).numpy()


def fast_path_available() -> bool:
    """Whether the C kernels (``shardkit.augment._kernels``) imported."""
    return _kernels is not None


_OPCODES = {"brightness": 1, "contrast": 2, "saturation": 3, "sharpness": 4, "posterize": 5,
            "solarize": 6, "autocontrast": 7, "equalize": 8, "grayscale": 9, "affine": 10,
            "shear_origin": 10, "rotate": 10, "erase": 11, "hue": 12}
"""Primitive -> opcode of ``_kernels.run`` (a program run in one call without the GIL)."""
C_PRIMITIVES = frozenset(_OPCODES)
"""Primitives with a C kernel (geometry only with nearest interpolation and, for ``rotate``,
angles that are not a multiple of 90 degrees: torchvision's exact rot90 path)."""


def _encode(name: str, args, shape) -> list[float] | None:
    """One ``_kernels.run`` row (opcode, then up to 9 arguments), or None: not in C."""
    code = _OPCODES.get(name)
    if code is None:
        return None
    if code == 10:
        theta = _affine_theta(name, shape, args)
        return None if theta is None else [code, *theta, *_fill_ints(args[-2])]
    if code == 11:
        return [code, *args[:4], *_fill_ints(args[4])]
    return [code, *(float(a) for a in args)]


def apply_hwc(row: np.ndarray, program, *, fast: bool = True) -> None:
    """Runs ``program`` in place on ``row``: a C-contiguous writable ``(H, W, 3)`` uint8 array.
    Runs of primitives with a C kernel go to ``_kernels.run`` in one call each, without the
    GIL (``fast`` and the extension built); the others run the torch primitive on a
    ``(3, H, W)`` view and copy the result back. It is ``run_steps(row, compile_hwc(program,
    row.shape, fast=fast))``."""
    run_steps(row, compile_hwc(program, row.shape, fast=fast))


def compile_hwc(program, shape, *, fast: bool = True) -> list[tuple]:
    """``program``'s steps for an ``(H, W, 3)`` image of ``shape``, for :func:`run_steps`:
    ``(None, rows)`` for a run of C primitives (the float64 ``(n, 10)`` rows of one
    ``_kernels.run`` call), ``(fn, args)`` for a torch primitive. The loader compiles a
    sample's program before decoding it and runs it after, so the Python of both halves runs
    next to the other Python of the sample."""
    use_fast = fast and _kernels is not None
    steps: list[tuple] = []
    rows: list[list[float]] = []
    for name, args in program:
        code = _encode(name, args, shape) if use_fast else None
        if code is not None:
            rows.append(code + [0.0] * (10 - len(code)))
            continue
        if name == "identity":
            continue
        if rows:
            steps.append((None, np.array(rows, dtype=np.float64)))
            rows = []
        steps.append((TORCH[name], args))
    if rows:
        steps.append((None, np.array(rows, dtype=np.float64)))
    return steps


def run_steps(row: np.ndarray, steps: list[tuple]) -> None:
    """Runs :func:`compile_hwc`'s ``steps`` in place on ``row`` (C-contiguous, writable,
    uint8, of the shape they were compiled for; ``_kernels.run`` raises ValueError otherwise,
    writing nothing)."""
    for fn, args in steps:
        if fn is None:
            _kernels.run(row, row.shape[0], row.shape[1], args)
        else:
            _via_torch(row, fn, *args)
