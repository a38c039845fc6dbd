"""Augmentation pixels and sampling against torchvision v2 (and timm for mixup / cutmix).

Every primitive's CPU fast path (:func:`shardkit.augment.prims.apply_hwc`, C kernels and
torchvision-built tables on ``(H, W, 3)`` rows) and its torch path (:func:`apply_torch`, the code
the device runs) equal ``torchvision.transforms.v2.functional`` on the same arguments, exactly
(max difference 0), on 224x224 crops of real photos from examples/flowers-sample. Every op's
program equals the torchvision v2 transform of the same name applied with the same draws: the
test replays the draws from a copy of the sample's generator in torchvision's order (ops.py maps
``torch.rand``/``randint``/``randperm`` to numpy) and calls the class's own ``transform`` (or,
for the policies, ``_apply_image_or_video_transform``, the one method RandAugment,
TrivialAugmentWide and AugMix apply each drawn op with).

Two things in torch itself depend on the CPU, and the comparisons account for them the same way
on every host, so no test depends on which CPU runs it (checked with ``ATEN_CPU_CAPABILITY``
``default`` / ``avx2`` / ``avx512`` and ``MKL_ENABLE_INSTRUCTIONS`` ``SSE4_2`` / ``AVX2``):

- torch's ``add_(b, alpha=k)`` is fused on AVX2 / AVX-512 / NEON and rounded twice by its scalar
  DEFAULT kernels (an x86-64 CPU without AVX2). :func:`torch_fuses` probes it; where torch rounds
  twice the kernels are switched to the same rounding (``_set_separate_rounding``), and
  :func:`test_separate_rounding_moves_pixels_by_a_level_at_most` bounds what that changes.
- torchvision's nearest affine grid is a float32 bmm whose MKL kernel (AVX-512, AVX2, SSE4.2) is
  chosen per CPU, so torchvision's own output moves between CPUs at sampling boundaries.
  :class:`NearestSampling` wraps torchvision's ``_affine_grid`` / ``_apply_grid_transform``:
  for every output pixel it checks that both the kernel and torchvision sample the exact nearest
  source pixel (or the fill) wherever the exact coordinate is more than ``BOUNDARY_PX`` from a
  pixel boundary, one of the two neighbours nearer than that, and that they disagree on at most
  ``MAX_FLIPS_PER_MILLION`` pixels; then it hands torchvision a grid with those boundary pixels
  resolved as the kernel did, so that everything downstream (fill, later ops of a program) is
  compared exactly.
"""
from __future__ import annotations

import copy
import hashlib
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T
import torchvision.transforms.v2.functional as F
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2.functional import _geometry
from torchvision.transforms.v2.functional._color import _rgb_to_grayscale_image
from torchvision.transforms.v2.functional._geometry import (
    _get_inverse_affine_matrix, _get_perspective_coeffs,
)

from shardkit.augment import BatchMix, apply_hwc, apply_torch, mix_rng, ops, prims
from shardkit.sharding import sample_rng

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"
NEAREST, BILINEAR = InterpolationMode.NEAREST, InterpolationMode.BILINEAR


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Single-threaded torch for this module (restored after): the reference ops run on one
    224 px image at a time, where an intra-op pool on a busy 2-core host costs 20-30x."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def torch_fuses() -> bool:
    """Whether torch's vectorised ``a.add_(b, alpha=k)`` here is one fused multiply-add (AVX2,
    AVX-512, NEON) or rounds twice (the scalar DEFAULT kernels): for b = k = 1 + 2**-12 and
    a = -(1 + 2**-11), ``b * k`` rounds to ``-a`` (a tie, to even), so only the fused form
    leaves 2**-24."""
    a = torch.full((64,), -1.00048828125)
    out = a.add_(torch.full((64,), 1.000244140625), alpha=1.000244140625)
    assert bool((out == out[0]).all()) and float(out[0]) in (0.0, 2.0 ** -24), out
    return float(out[0]) != 0.0


@pytest.fixture(scope="module", autouse=True)
def torch_rounding():
    """The kernels round as torch does here (fused unless torch's kernels are the scalar DEFAULT
    ones); restored to fused after the module."""
    separate = not torch_fuses()
    prims._kernels._set_separate_rounding(separate)
    yield separate
    prims._kernels._set_separate_rounding(False)


BOUNDARY_PX = 1e-3
"""Distance (px) of an exact sampling coordinate from a pixel boundary (.5) within which either
neighbour may be sampled. float32 rounding of a 224 px grid moves a coordinate by at most
~1e-4 px in any summation order (4.4e-5 measured on MKL's AVX-512, AVX2 and SSE4.2 paths)."""
MAX_FLIPS_PER_MILLION = 100
"""Bound on output pixels where the kernel and torchvision sample different neighbours. Measured on
15 million pixels: 0 (MKL AVX-512), 1.1 per million (MKL AVX2 / SSE4.2, the AMD EPYC case)."""


def exact_source(theta: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact (float64) source coordinates ``(fx, fy)``, each ``(h, w)`` px, of every output pixel
    of torchvision's nearest affine with the float32 inverse matrix ``theta`` (6 values): the
    grid ``base @ rescaled`` (rescaled theta in float32, as torchvision divides it) unnormalised
    as ``grid_sample(align_corners=False)``."""
    t = torch.tensor(np.asarray(theta, np.float32).reshape(1, 2, 3))
    r = t.transpose(1, 2).div_(torch.tensor([0.5 * w, 0.5 * h]))[0].double().numpy()
    bx, by = np.meshgrid(np.arange(w) - w * 0.5 + 0.5, np.arange(h) - h * 0.5 + 0.5)
    gx = bx * r[0, 0] + by * r[1, 0] + r[2, 0]
    gy = bx * r[0, 1] + by * r[1, 1] + r[2, 1]
    return ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2


def coordinate_image(h: int, w: int) -> np.ndarray:
    """``(h, w, 3)`` uint8 with pixel ``(y, x) = (x, y, 255)``: sampled, it shows which source
    pixel each output pixel took (blue 0: the fill)."""
    assert h <= 256 and w <= 256, (h, w)
    img = np.empty((h, w, 3), np.uint8)
    img[..., 0] = np.arange(w)[None, :]
    img[..., 1] = np.arange(h)[:, None]
    img[..., 2] = 255
    return img


def kernel_choice(theta, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sx, sy, inside)`` (each ``(h, w)``) the C kernel samples with ``theta``."""
    img = coordinate_image(h, w)
    row = np.zeros((1, 10))
    row[0, :7] = [10, *np.asarray(theta, np.float32).astype(np.float64)]
    prims._kernels.run(img, h, w, row)
    return img[..., 0].astype(int), img[..., 1].astype(int), img[..., 2] == 255


def check_choice(fx, fy, sx, sy, inside, who: str) -> np.ndarray:
    """Asserts ``(sx, sy, inside)`` (each ``(h, w)``) is the exact nearest source pixel (or the
    fill) of ``(fx, fy)`` wherever both coordinates are more than ``BOUNDARY_PX`` from a pixel
    boundary, and one of the two neighbours (a pixel inside the image, or the fill) nearer than
    that. Returns the boolean ``(h, w)`` mask of pixels near a boundary."""
    h, w = fx.shape
    near, cands = np.zeros((h, w), bool), []
    for f, size in ((fx, w), (fy, h)):
        lo = np.floor(f)
        at = np.abs(f - lo - 0.5) < BOUNDARY_PX
        near |= at
        first = np.where(at, lo, np.rint(f))
        second = np.where(at, lo + 1, first)
        cands.append([(c, (c >= 0) & (c < size)) for c in (first, second)])
    good = np.zeros((h, w), bool)
    for cx, in_x in cands[0]:
        for cy, in_y in cands[1]:
            good |= np.where(in_x & in_y, inside & (sx == cx) & (sy == cy), ~inside)
    bad = ~good
    assert not bad.any(), (
        f"{who}: {int(bad.sum())} of {bad.size} pixels sample neither the exact nearest source "
        f"pixel nor a neighbour at a boundary, e.g. output {np.argwhere(bad)[0].tolist()} "
        f"(fx, fy = {fx[bad][0]!r}, {fy[bad][0]!r}) took {(sx[bad][0], sy[bad][0])}, inside "
        f"{bool(inside[bad][0])}")
    return near


class NearestSampling:
    """Wraps torchvision's ``_affine_grid`` / ``_apply_grid_transform`` (see the module
    docstring): checks both samplings of every nearest affine grid torchvision builds, counts
    the pixels where they disagree, and resolves the boundary pixels as the kernel does."""

    def __init__(self):
        self.pixels = self.near = self.flips = 0
        self._grid_of: dict[int, tuple] = {}
        self._affine_grid = _geometry._affine_grid
        self._apply = _geometry._apply_grid_transform

    def affine_grid(self, theta, w, h, ow, oh):
        matrix = theta[0].reshape(6).cpu().numpy().copy()  # before: _affine_grid divides it
        grid = self._affine_grid(theta, w=w, h=h, ow=ow, oh=oh)
        if (ow, oh) == (w, h) and grid.device.type == "cpu":
            self._grid_of[id(grid)] = (grid, matrix, h, w)
        return grid

    def apply_grid_transform(self, img, grid, mode, fill):
        known = self._grid_of.pop(id(grid), None)
        if mode == "nearest" and known is not None and known[0] is grid:
            grid = self.resolve(grid, *known[1:])
        return self._apply(img, grid, mode, fill)

    def resolve(self, grid, theta, h, w):
        fx, fy = exact_source(theta, h, w)
        sx, sy, inside = kernel_choice(theta, h, w)
        near = check_choice(fx, fy, sx, sy, inside, "C kernel")
        coords = torch.from_numpy(coordinate_image(h, w)).permute(2, 0, 1)[None].float()
        coords[:, 2] = 1.0
        took = torch.nn.functional.grid_sample(coords, grid, mode="nearest",
                                               padding_mode="zeros", align_corners=False)[0]
        tx, ty = took[0].numpy().astype(int), took[1].numpy().astype(int)
        t_inside = took[2].numpy() > 0.5
        check_choice(fx, fy, tx, ty, t_inside, "torchvision")
        differ = (t_inside != inside) | (inside & ((tx != sx) | (ty != sy)))
        assert not (differ & ~near).any()  # implied by both checks: only at boundaries
        self.pixels += h * w
        self.near += int(near.sum())
        self.flips += int(differ.sum())
        out = grid.clone()
        gx = torch.from_numpy(np.where(inside, (2 * sx + 1) / w - 1, -3.0)).float()
        gy = torch.from_numpy(np.where(inside, (2 * sy + 1) / h - 1, -3.0)).float()
        nm = torch.from_numpy(near)
        out[0, ..., 0] = torch.where(nm, gx, out[0, ..., 0])
        out[0, ..., 1] = torch.where(nm, gy, out[0, ..., 1])
        return out


@pytest.fixture(autouse=True)
def nearest_sampling(monkeypatch):
    check = NearestSampling()
    monkeypatch.setattr(_geometry, "_affine_grid", check.affine_grid)
    monkeypatch.setattr(_geometry, "_apply_grid_transform", check.apply_grid_transform)
    yield check
    # a small test has a few pixels' allowance: a flip is a property of the host's BLAS, not a rate
    assert check.flips <= 3 + check.pixels * MAX_FLIPS_PER_MILLION / 1e6, (
        f"the kernel and torchvision sampled different neighbours at {check.flips} of "
        f"{check.pixels} pixels ({check.near} within {BOUNDARY_PX} px of a boundary)")


@pytest.fixture(scope="module")
def photos() -> list[np.ndarray]:
    """Centre 224x224 crops (no resampling) of the first 2 photos of each class that are at
    least 224 px on both sides: 10 (224, 224, 3) uint8 arrays."""
    from PIL import Image

    out = []
    for cls in sorted(p for p in SAMPLE.iterdir() if p.is_dir()):
        crops = []
        for path in sorted(cls.glob("*.jpg")):
            a = np.asarray(Image.open(path).convert("RGB"))
            h, w = a.shape[:2]
            if h >= 224 and w >= 224 and len(crops) < 2:
                y, x = (h - 224) // 2, (w - 224) // 2
                crops.append(np.ascontiguousarray(a[y:y + 224, x:x + 224]))
        out += crops
    assert len(out) == 10
    return out


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.copy()).permute(2, 0, 1).contiguous()


def _fast(a: np.ndarray, program) -> np.ndarray:
    row = a.copy()
    apply_hwc(row, program)
    return row


def _same(got: np.ndarray, ref: torch.Tensor, what: str) -> None:
    ref = ref.permute(1, 2, 0).numpy()
    diff = np.abs(got.astype(int) - ref.astype(int))
    n, worst = int((diff > 0).any(-1).sum()), int(diff.max())
    assert n == 0, f"{what}: {n} pixels differ, by up to {worst}"


# ---------------------------------------------------------------- primitives: (args, reference)
_g = np.random.default_rng(7)
_GEOM = [(float(_g.uniform(-45, 45)), (int(_g.integers(-40, 41)), int(_g.integers(-40, 41))),
          float(_g.uniform(0.7, 1.3)), (float(_g.uniform(-20, 20)), float(_g.uniform(-20, 20))),
          tuple(int(v) for v in _g.integers(0, 256, 3))) for _ in range(12)]
_FACTORS = (0.0, 0.31, 0.77, 1.0, 1.43, 1.9, 2.6)


def _fl(fill):
    return [float(v) for v in fill]


PRIMS: dict[str, list] = {
    "brightness": [((f,), lambda t, f=f: F.adjust_brightness(t, f)) for f in _FACTORS],
    "contrast": [((f,), lambda t, f=f: F.adjust_contrast(t, f)) for f in _FACTORS],
    "saturation": [((f,), lambda t, f=f: F.adjust_saturation(t, f)) for f in _FACTORS],
    "sharpness": [((f,), lambda t, f=f: F.adjust_sharpness(t, f)) for f in _FACTORS],
    "hue": [((f,), lambda t, f=f: F.adjust_hue(t, f)) for f in (-0.5, -0.13, 0.07, 0.4)],
    "posterize": [((b,), lambda t, b=b: F.posterize(t, b)) for b in range(9)],
    "solarize": [((v,), lambda t, v=v: F.solarize(t, v)) for v in (0.0, 1.0, 77.5, 128.0, 255.0)],
    "autocontrast": [((), F.autocontrast)],
    "equalize": [((), F.equalize)],
    "grayscale": [((), lambda t: F.rgb_to_grayscale(t, num_output_channels=3))],
    "identity": [((), lambda t: t)],
    "rotate": [((a, fill, "nearest"), lambda t, a=a, fill=fill: F.rotate(
        t, a, interpolation=NEAREST, fill=_fl(fill))) for a, _, _, _, fill in _GEOM]
    + [((a, 0, "nearest"), lambda t, a=a: F.rotate(t, a, interpolation=NEAREST, fill=[0.0] * 3))
       for a in (90.0, -180.0, 30.0)]
    + [((12.5, 9, "bilinear"),
        lambda t: F.rotate(t, 12.5, interpolation=BILINEAR, fill=[9.0] * 3))],
    "affine": [((a, tr, s, sh, fill, "nearest"),
                lambda t, a=a, tr=tr, s=s, sh=sh, fill=fill: F.affine(
                    t, angle=a, translate=list(tr), scale=s, shear=list(sh),
                    interpolation=NEAREST, fill=_fl(fill))) for a, tr, s, sh, fill in _GEOM]
    + [((7.0, (3, -2), 1.1, (4.0, 0.0), 0, "bilinear"), lambda t: F.affine(
        t, angle=7.0, translate=[3, -2], scale=1.1, shear=[4.0, 0.0], interpolation=BILINEAR,
        fill=[0.0] * 3))],
    "shear_origin": [((sh, fill, "nearest"), lambda t, sh=sh, fill=fill: F.affine(
        t, angle=0.0, translate=[0, 0], scale=1.0, shear=list(sh), interpolation=NEAREST,
        fill=_fl(fill), center=[0, 0])) for _, _, _, sh, fill in _GEOM],
    "perspective": [(([[0, 0], [223, 0], [223, 223], [0, 223]],
                      [[20, 5], [200, 31], [219, 190], [3, 222]], 40, interp),
                     lambda t, interp=interp: F.perspective(
                         t, [[0, 0], [223, 0], [223, 223], [0, 223]],
                         [[20, 5], [200, 31], [219, 190], [3, 222]],
                         interpolation=InterpolationMode(interp), fill=[40.0] * 3))
                    for interp in ("nearest", "bilinear")],
    "gaussian_blur": [((k, s), lambda t, k=k, s=s: F.gaussian_blur(t, [k, k], [s, s]))
                      for k, s in ((3, 0.4), (5, 1.3), (9, 2.0))],
    "erase": [((i, j, h, w, v), lambda t, i=i, j=j, h=h, w=w, v=v: F.erase(
        t, i, j, h, w, torch.tensor(v, dtype=torch.uint8).view(-1, 1, 1)))
              for i, j, h, w, v in ((10, 20, 50, 60, (1, 2, 3)), (0, 0, 224, 7, 255))],
    "augmix": [(((0.5, 0.3, 0.2), [[("rotate", (10.0, 0, "bilinear"))], [("equalize", ())]]),
                lambda t: (0.5 * t).add_(0.3 * F.rotate(t, 10.0, interpolation=BILINEAR,
                                                         fill=[0.0] * 3))
                .add_(0.2 * F.equalize(t)).to(torch.uint8))],
}


def test_every_primitive_and_op_has_a_case():
    assert set(PRIMS) == set(prims.TORCH)
    assert set(OPS) == set(ops.OPS)
    assert prims.fast_path_available()  # the C kernels were built: the fast paths are tested


@pytest.mark.parametrize("name", sorted(PRIMS))
def test_primitive_equals_torchvision(photos, name, nearest_sampling):
    for a in photos:
        for args, ref in PRIMS[name]:
            expected = ref(_t(a))
            _same(_fast(a, [(name, args)]), expected, f"apply_hwc {name}{args}")
            _same(apply_torch(_t(a), [(name, args)]).permute(1, 2, 0).numpy(), expected,
                  f"apply_torch {name}{args}")
    if name in ("rotate", "affine", "shear_origin"):  # torchvision's grid went through the check
        assert nearest_sampling.pixels >= 2 * len(photos) * 224 * 224 * 10


@pytest.mark.parametrize("shape", ["16x16", "2x224", "224x150", "flat red"])
def test_fast_paths_on_awkward_shapes(photos, shape):
    """Small (equalize keeps a channel whose non-mode pixels are < 255), too thin for the
    sharpness kernel (kept as is), non-square (affine's two half sizes), a constant channel
    (autocontrast's min == max)."""
    a = photos[3]
    a = {"16x16": a[:16, :16], "2x224": a[:2], "224x150": a[:, :150]}.get(shape, a).copy()
    if shape == "flat red":
        a[..., 0] = 77
    a = np.ascontiguousarray(a)
    for name in sorted(prims.C_PRIMITIVES):
        for args, _ in PRIMS[name][:4]:
            if name == "erase":
                args = (0, 1, 1, 2, (9, 8, 7))
            _same(_fast(a, [(name, args)]), prims.TORCH[name](_t(a), *args), f"{shape} {name}")


_TABLE_PROGRAMS = {  # the ops that run as a 256-entry table per channel, alone and chained
    "brightness": ([("brightness", (1.37,))], lambda t: F.adjust_brightness(t, 1.37)),
    "contrast": ([("contrast", (0.61,))], lambda t: F.adjust_contrast(t, 0.61)),
    "solarize": ([("solarize", (99.5,))], lambda t: F.solarize(t, 99.5)),
    "autocontrast": ([("autocontrast", ())], F.autocontrast),
    "equalize": ([("equalize", ())], F.equalize),
    "saturation contrast brightness": (
        [("saturation", (1.3,)), ("contrast", (0.8,)), ("brightness", (1.2,))],
        lambda t: F.adjust_brightness(F.adjust_contrast(F.adjust_saturation(t, 1.3), 0.8), 1.2)),
    "brightness solarize posterize": (
        [("brightness", (1.4,)), ("solarize", (100.0,)), ("posterize", (3,))],
        lambda t: F.posterize(F.solarize(F.adjust_brightness(t, 1.4), 100.0), 3)),
}


@pytest.mark.parametrize("wide", [0, 1, 2])
def test_table_ops_on_odd_sizes_equal_torchvision_at_every_vector_level(photos, wide):
    """Lookup-table ops (a 64-byte vector lookup with AVX-512 VBMI, ``_set_wide`` level 2;
    bytes otherwise) and autocontrast's channel range (blocks of 192 bytes) on images whose
    3 x H x W bytes are no multiple of 64 or 192, so the last vector and block are partial;
    each photo's channels clipped to [12, 240] with the extremes (0, 255, 5) and (250, 3, 1)
    only in its last two pixels, so autocontrast is right only if the partial block is read."""
    before = prims._kernels._set_wide(wide)
    try:
        if prims._kernels._set_wide(wide) != wide:
            pytest.skip(f"this CPU has no _set_wide level {wide} (AVX-512 / VBMI)")
        for k, (h, w) in enumerate([(1, 2), (5, 7), (37, 41), (224, 223), (3, 65)]):
            a = np.clip(photos[k][:h, :w], 12, 240)
            a.reshape(-1, 3)[-2:] = [(0, 255, 5), (250, 3, 1)]
            a = np.ascontiguousarray(a)
            assert (3 * h * w) % 64 and (3 * h * w) % 192
            for name, (program, ref) in _TABLE_PROGRAMS.items():
                _same(_fast(a, program), ref(_t(a)), f"{h}x{w} {name} (wide {wide})")
    finally:
        prims._kernels._set_wide(before)


def test_gray_kernel_equals_torchvision_on_every_rgb_colour():
    """All 2**24 colours in one 4096x4096 image: floor of torchvision's float grayscale."""
    v = np.arange(1 << 24, dtype=np.uint32).reshape(4096, 4096)
    img = np.stack([v >> 16, (v >> 8) & 255, v & 255], axis=-1).astype(np.uint8)
    gray = np.empty((4096, 4096), np.uint8)
    total = prims._kernels.gray(img, 4096, 4096, gray)
    ref = _rgb_to_grayscale_image(torch.from_numpy(img).permute(2, 0, 1), 1, False).floor_()
    ref = ref[0].to(torch.uint8).numpy()
    assert np.array_equal(gray, ref), f"{int((gray != ref).sum())} of 2**24 colours differ"
    assert total == int(ref.sum(dtype=np.int64))


def test_separate_rounding_moves_pixels_by_a_level_at_most(photos):
    """What a torch without fused multiply-adds (x86-64 without AVX2) changes: single colour
    primitives differ from the fused result by at most one level (saturation moves near-grey
    pixels, whose value sits on an integer, on ~1.3% of pixels; sharpness ~0.02%)."""
    kernels, moved = prims._kernels, {}
    before = kernels._set_separate_rounding(False)
    try:
        for name in ("contrast", "saturation", "sharpness", "grayscale"):
            moved[name] = 0
            for a in photos[:4]:
                for args, _ in PRIMS[name]:
                    fused = _fast(a, [(name, args)])
                    kernels._set_separate_rounding(True)
                    separate = _fast(a, [(name, args)])
                    kernels._set_separate_rounding(False)
                    diff = np.abs(fused.astype(int) - separate.astype(int))
                    assert diff.max() <= 1, (name, args, int(diff.max()))
                    moved[name] += int((diff > 0).any(-1).sum())
    finally:
        kernels._set_separate_rounding(before)
    assert moved["saturation"] > 0 and moved["saturation"] < 0.05 * 4 * 7 * 224 * 224, moved


def _digest_image(h: int, w: int) -> np.ndarray:
    """A deterministic (h, w, 3) uint8 test card: gradients plus hash noise (no RNG library)."""
    raw = b"".join(hashlib.sha256(b"shardkit %d" % i).digest() for i in range(h * w * 3 // 32 + 1))
    noise = np.frombuffer(raw[:h * w * 3], np.uint8).reshape(h, w, 3).astype(int)
    yy, xx = np.mgrid[0:h, 0:w]
    base = xx * 200 // max(w - 1, 1) + yy * 90 // max(h - 1, 1)
    return ((base[..., None] * np.array([1, 2, 3]) + (noise >> 2)) % 256).astype(np.uint8)


# one row per opcode, every argument a literal (no libm, no torchvision in the way)
_DIGEST_ROWS = [[1, 1.37], [2, 0.61], [3, 1.83], [3, 0.0], [4, 2.2], [4, 0.3], [5, 3], [6, 140.0],
                [7], [8], [9], [10, 0.9659258, -0.258819, 3.25, 0.258819, 0.9659258, -2.5, 5, 6, 7],
                [10, 1.1, 0.35, -7.0, -0.1, 0.8, 4.0, 0, 0, 0], [11, 3, 4, 20, 9, 1, 2, 3]]
KERNEL_DIGEST = "8a18054a17515620010c269a4fdf74231176033503172459a8b65b4536d0fe63"
"""sha256 of the kernels' output on the test cards: the same on every host (x86-64 portable and
AVX2+FMA paths, aarch64). Recompute it only when the kernels' arithmetic changes on purpose."""


def _kernel_digest() -> str:
    out = hashlib.sha256()
    for h, w in ((61, 47), (224, 224), (3, 3), (1, 5), (150, 224)):
        card = _digest_image(h, w)
        for rows in [[r] for r in _DIGEST_ROWS] + [_DIGEST_ROWS]:
            img = card.copy()
            ops = np.zeros((len(rows), 10))
            for k, r in enumerate(rows):
                ops[k, :len(r)] = r
            prims._kernels.run(img, h, w, ops)
            out.update(img.tobytes())
        gray = np.empty((h, w), np.uint8)
        out.update(str(prims._kernels.gray(card, h, w, gray)).encode() + gray.tobytes())
    return out.hexdigest()


def test_kernels_give_the_same_bytes_on_every_code_path_and_host():
    """The portable C path and the AVX2+FMA clones give the same bytes here, and both equal the
    digest recorded on another host: the kernels' pixels do not depend on the CPU."""
    kernels = prims._kernels
    used, best = kernels.path()
    rounding = kernels._set_separate_rounding(False)
    digests = {}
    try:
        for level in sorted({kernels.PATH_PORTABLE, best}):
            assert kernels._set_path(level) == level
            digests[level] = _kernel_digest()
    finally:
        kernels._set_path(used)
        kernels._set_separate_rounding(rounding)
    assert set(digests.values()) == {KERNEL_DIGEST}, digests


@pytest.mark.parametrize("h,w", [(224, 224), (150, 224), (224, 97), (16, 16), (2, 224), (1, 1)])
def test_nearest_affine_samples_the_exact_nearest_source_pixel(h, w):
    """Without torch: for random rotations, shears, scales and translations, every output pixel
    samples the source pixel nearest to its exact coordinate (or the fill outside), except within
    BOUNDARY_PX of a pixel boundary (about 0.4% of pixels), where it takes one of the two."""
    rng = np.random.default_rng(h * 1000 + w)
    near = total = 0
    for _ in range(12):
        u = lambda lo, hi: float(rng.uniform(lo, hi))  # noqa: E731
        m = _get_inverse_affine_matrix([u(-w / 2, w / 2), u(-h / 2, h / 2)], u(-180, 180),
                                       [u(-w / 4, w / 4), u(-h / 4, h / 4)], u(0.5, 2.0),
                                       [u(-30, 30), u(-30, 30)])
        theta = np.asarray(m, np.float32)
        fx, fy = exact_source(theta, h, w)
        sx, sy, inside = kernel_choice(theta, h, w)
        near += int(check_choice(fx, fy, sx, sy, inside, f"{h}x{w} {theta}").sum())
        total += h * w
    assert near <= 0.02 * total + 2, (near, total)


def _row(*values) -> np.ndarray:
    ops = np.zeros((1, 10))
    ops[0, :len(values)] = values
    return ops


@pytest.mark.parametrize("bad,message", [
    (dict(h=0), "image size h=0"), (dict(w=-3), "image size h=8, w=-3"),
    (dict(h=1 << 25), "image size"), (dict(image=np.zeros((8, 9, 3), np.uint8)), "expected 192"),
    (dict(image=np.zeros((8, 8, 3), np.int8)), "format b"),
    (dict(image=np.zeros((8, 8, 6), np.uint8)[..., :3]), "contiguous"),
    (dict(ops=np.zeros((1, 9))), "float64 (n, 10)"), (dict(ops=np.zeros((1, 10), np.float32)),
                                                      "float64 (n, 10)"),
    (dict(ops=_row(0)), "unknown opcode"), (dict(ops=_row(13)), "unknown opcode"),
    (dict(ops=_row(1.5, 1.0)), "unknown opcode"), (dict(ops=_row(np.nan)), "unknown opcode"),
    (dict(ops=_row(1, -0.5)), "factor must be"), (dict(ops=_row(3, np.inf)), "factor must be"),
    (dict(ops=_row(4, np.nan)), "factor must be"), (dict(ops=_row(5, 9)), "posterize bits"),
    (dict(ops=_row(5, -1)), "posterize bits"), (dict(ops=_row(5, 2.5)), "posterize bits"),
    (dict(ops=_row(6, np.nan)), "solarize threshold"),
    (dict(ops=_row(6, 255.5)), "solarize threshold"), (dict(ops=_row(6, -np.inf)), "solarize"),
    (dict(ops=_row(10, 1, 0, np.nan, 0, 1, 0)), "affine matrix"),
    (dict(ops=_row(10, 1, 0, 1e39, 0, 1, 0)), "affine matrix"),
    (dict(ops=_row(10, 1, 0, 0, 0, 1, 0, 256, 0, 0)), "affine fill"),
    (dict(ops=_row(10, 1, 0, 0, 0, 1, 0, 0, -1, 0)), "affine fill"),
    (dict(ops=_row(11, -2, 0, 4, 4, 1, 2, 3)), "erase i, j, h, w"),
    (dict(ops=_row(11, 0, -1, 4, 4, 1, 2, 3)), "erase i, j, h, w"),
    (dict(ops=_row(11, 0, 0, -4, 4, 1, 2, 3)), "erase i, j, h, w"),
    (dict(ops=_row(11, 0, 0, 4, 1e12, 1, 2, 3)), "erase i, j, h, w"),
    (dict(ops=_row(11, 0, 0, 4, 4, 1, 300, 3)), "erase value"),
])
def test_kernels_refuse_bad_arguments_and_write_nothing(bad, message):
    """Every C entry point checks sizes, buffers and each op row before touching a pixel
    (the old erase with a negative corner wrote before the buffer)."""
    args = dict(image=_digest_image(8, 8), h=8, w=8,
                ops=np.vstack([_row(11, 0, 0, 8, 8, 9, 9, 9), _row(1, 2.0)]))
    if "ops" in bad and bad["ops"].shape == (1, 10) and bad["ops"].dtype == np.float64:
        # the bad row comes after a good one: nothing runs
        bad = dict(ops=np.vstack([_row(11, 0, 0, 8, 8, 9, 9, 9), bad["ops"]]))
    args.update(bad)
    before = np.array(args["image"], copy=True)
    with pytest.raises(ValueError, match=re.escape(message)):
        prims._kernels.run(args["image"], args["h"], args["w"], args["ops"])
    assert np.array_equal(args["image"], before)


def test_gray_refuses_bad_arguments():
    img = _digest_image(4, 5)
    for h, w, out, message in ((0, 5, np.empty(0, np.uint8), "image size h=0"),
                               (4, 5, np.empty(21, np.uint8), "expected 20 uint8"),
                               (4, 5, np.empty(20, np.uint16), "format H"),
                               (5, 5, np.empty(25, np.uint8), "expected 75")):
        with pytest.raises(ValueError, match=re.escape(message)):
            prims._kernels.gray(img, h, w, out)
    with pytest.raises(BufferError, match="not writable"):
        prims._kernels.gray(img, 4, 5, bytes(20))  # read-only out


def test_erase_clips_at_the_far_edges_as_torchvision():
    """A box past the bottom-right edge is clipped (torchvision's slicing); one wholly outside
    changes nothing; the bytes around the image buffer are never touched."""
    guard = np.full(16 + 6 * 7 * 3 + 16, 77, np.uint8)
    img = guard[16:-16].reshape(6, 7, 3)
    img[...] = _digest_image(6, 7)
    for i, j, eh, ew in ((4, 5, 10, 10), (0, 0, 6, 7), (9, 0, 3, 3), (0, 7, 2, 2), (5, 6, 1, 1)):
        expected = F.erase(_t(img), i, j, eh, ew, torch.tensor([1, 2, 3], dtype=torch.uint8)
                           .view(3, 1, 1)).permute(1, 2, 0).numpy()
        prims._kernels.run(img, 6, 7, _row(11, i, j, eh, ew, 1, 2, 3))
        assert np.array_equal(img, expected), (i, j, eh, ew)
    assert (guard[:16] == 77).all() and (guard[-16:] == 77).all()


# ---------------------------------------------------------------- ops: replayed torchvision draws
def _fires(rng, p):
    return p >= 1.0 or (p > 0.0 and rng.random() < p)


def _jitter(img, rng, h, w, **kw):
    tv = T.ColorJitter(**kw)
    order = torch.from_numpy(rng.permutation(4))  # torch.randperm(4)
    f = [None if r is None else float(rng.uniform(*r))
         for r in (tv.brightness, tv.contrast, tv.saturation, tv.hue)]
    return tv.transform(img, dict(fn_idx=order, brightness_factor=f[0], contrast_factor=f[1],
                                  saturation_factor=f[2], hue_factor=f[3]))


def _affine(img, rng, h, w, **kw):
    tv = T.RandomAffine(**kw)
    angle = float(rng.uniform(*tv.degrees))
    dx, dy = tv.translate[0] * w, tv.translate[1] * h
    tr = (int(round(rng.uniform(-dx, dx))), int(round(rng.uniform(-dy, dy))))
    scale = float(rng.uniform(*tv.scale))
    sx = float(rng.uniform(tv.shear[0], tv.shear[1]))
    sy = float(rng.uniform(tv.shear[2], tv.shear[3])) if len(tv.shear) == 4 else 0.0
    return tv.transform(img, dict(angle=angle, translate=tr, scale=scale, shear=(sx, sy)))


def _perspective(img, rng, h, w, distortion_scale, p, fill):
    tv = T.RandomPerspective(distortion_scale, p, fill=fill)
    if not _fires(rng, p):
        return img
    bw, bh = int(distortion_scale * (w // 2)) + 1, int(distortion_scale * (h // 2)) + 1
    ri = rng.integers
    end = [[ri(0, bw), ri(0, bh)], [ri(w - bw, w), ri(0, bh)], [ri(w - bw, w), ri(h - bh, h)],
           [ri(0, bw), ri(h - bh, h)]]
    start = [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
    end = [[int(x), int(y)] for x, y in end]
    return tv.transform(img, dict(coefficients=_get_perspective_coeffs(start, end)))


def _erasing(img, rng, h, w, p, scale, ratio, value):
    tv = T.RandomErasing(p, scale, ratio, value=value)
    if not _fires(rng, p):
        return img
    for _ in range(10):
        area = h * w * float(rng.uniform(*tv.scale))
        aspect = math.exp(float(rng.uniform(*tv._log_ratio)))
        eh, ew = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if eh < h and ew < w:
            i, j = int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1))
            return tv.transform(img, dict(i=i, j=j, h=eh, w=ew, v=torch.tensor(value)[:, None,
                                                                                       None]))
    return img


def _policy_op(tv, img, rng, h, w, space, bins, magnitude):
    """One op as RandAugment / TrivialAugmentWide.forward draws and applies it."""
    op = tuple(space)[int(rng.integers(len(space)))]  # _get_random_item
    table_fn, signed = space[op]
    if magnitude is None:
        magnitude = int(rng.integers(bins))
    table = table_fn(bins, h, w)
    m = 0.0
    if table is not None:
        m = float(table[magnitude])
        if signed and rng.random() <= 0.5:
            m = -m
    return tv._apply_image_or_video_transform(img, op, m, interpolation=tv.interpolation,
                                              fill=tv._fill)


def _rand_augment(img, rng, h, w, num_ops, magnitude, fill):
    tv = T.RandAugment(num_ops, magnitude, fill=fill)
    for _ in range(num_ops):
        img = _policy_op(tv, img, rng, h, w, tv._AUGMENTATION_SPACE, 31, magnitude)
    return img


def _trivial(img, rng, h, w, fill):
    tv = T.TrivialAugmentWide(fill=fill)
    return _policy_op(tv, img, rng, h, w, tv._AUGMENTATION_SPACE, 31, None)


def _aug_mix(img, rng, h, w, severity, mixture_width, alpha, fill):
    """AugMix.forward's arithmetic, with the Dirichlet draws taken from ``rng`` (as
    torchvision's own tests override ``_sample_dirichlet``)."""
    tv = T.AugMix(severity, mixture_width, alpha=alpha, fill=fill)
    m = rng.dirichlet([alpha, alpha])
    weights = rng.dirichlet([alpha] * mixture_width) * m[1]
    mix = torch.tensor(m[0], dtype=torch.float32) * img
    for k in range(mixture_width):
        aug = img
        for _ in range(int(rng.integers(1, 4))):
            op = tuple(tv._AUGMENTATION_SPACE)[int(rng.integers(len(tv._AUGMENTATION_SPACE)))]
            table_fn, signed = tv._AUGMENTATION_SPACE[op]
            table, mag = table_fn(tv._PARAMETER_MAX, h, w), 0.0
            if table is not None:
                mag = float(table[int(rng.integers(severity))])
                if signed and rng.random() <= 0.5:
                    mag = -mag
            aug = tv._apply_image_or_video_transform(aug, op, mag, interpolation=tv.interpolation,
                                                     fill=tv._fill)
        mix.add_(torch.tensor(weights[k], dtype=torch.float32) * aug)
    return mix.to(torch.uint8)


def _p_op(cls, *args, **kw):
    """A torchvision ``_RandomApplyTransform``: fires with ``rand() < p``, then ``transform``."""
    def ref(img, rng, h, w):
        tv = cls(*args, **kw)
        params = {"num_input_channels": 3} if cls is T.RandomGrayscale else {}
        return tv.transform(img, params) if _fires(rng, tv.p) else img
    return ref


# op name -> (spec params, reference(img (3, H, W) uint8, rng, h, w) -> (3, H, W) uint8)
OPS = {
    "color_jitter": (dict(brightness=0.4, contrast=0.3, saturation=[0.5, 1.2], hue=0.1),
                     lambda i, r, h, w: _jitter(i, r, h, w, brightness=0.4, contrast=0.3,
                                                saturation=[0.5, 1.2], hue=0.1)),
    "grayscale": (dict(p=0.5), _p_op(T.RandomGrayscale, p=0.5)),
    "sharpness": (dict(sharpness_factor=1.7, p=0.5), _p_op(T.RandomAdjustSharpness, 1.7, p=0.5)),
    "posterize": (dict(bits=3, p=0.5), _p_op(T.RandomPosterize, 3, p=0.5)),
    "solarize": (dict(threshold=100.0, p=0.5), _p_op(T.RandomSolarize, 100.0, p=0.5)),
    "autocontrast": (dict(p=0.5), _p_op(T.RandomAutocontrast, p=0.5)),
    "equalize": (dict(p=0.5), _p_op(T.RandomEqualize, p=0.5)),
    "gaussian_blur": (dict(kernel_size=7, sigma=[0.1, 2.0]), lambda i, r, h, w: T.GaussianBlur(
        7, (0.1, 2.0)).transform(i, dict(sigma=[float(r.uniform(0.1, 2.0))] * 2))),
    "rotation": (dict(degrees=25.0, fill=[10, 20, 30]), lambda i, r, h, w: T.RandomRotation(
        25.0, fill=[10, 20, 30]).transform(i, dict(angle=float(r.uniform(-25.0, 25.0))))),
    "affine": (dict(degrees=15.0, translate=[0.1, 0.2], scale=[0.8, 1.2], shear=[-5, 5, -3, 3],
                    fill=7),
               lambda i, r, h, w: _affine(i, r, h, w, degrees=15.0, translate=(0.1, 0.2),
                                          scale=(0.8, 1.2), shear=(-5, 5, -3, 3), fill=7)),
    "perspective": (dict(distortion_scale=0.4, p=0.5, fill=3),
                    lambda i, r, h, w: _perspective(i, r, h, w, 0.4, 0.5, 3)),
    "random_erasing": (dict(p=0.5, value=[255, 0, 128]),
                       lambda i, r, h, w: _erasing(i, r, h, w, 0.5, (0.02, 0.33), (0.3, 3.3),
                                                   [255, 0, 128])),
    "rand_augment": (dict(num_ops=2, magnitude=9, fill=128),
                     lambda i, r, h, w: _rand_augment(i, r, h, w, 2, 9, 128)),
    "trivial_augment": (dict(), lambda i, r, h, w: _trivial(i, r, h, w, None)),
    "aug_mix": (dict(severity=3, mixture_width=3, alpha=1.0, fill=0),
                lambda i, r, h, w: _aug_mix(i, r, h, w, 3, 3, 1.0, 0)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_equals_torchvision_transform_with_the_same_draws(photos, name):
    params, reference = OPS[name]
    fired = 0
    for k in range(40):
        rng = sample_rng(5, 1, 0, k)
        replay = copy.deepcopy(rng)
        a = photos[k % len(photos)]
        program = ops.OPS[name](rng, 224, 224, **params)
        fired += bool(program)
        expected = reference(_t(a), replay, 224, 224)
        assert rng.integers(1 << 62) == replay.integers(1 << 62), f"{name}: draws differ"
        _same(_fast(a, program), expected, f"{name} draw {k}: {program}")
    assert 8 <= fired <= 40  # p=0.5 ops fire 20 +- 12 times (4 sigma); the others every time


def test_aug_mix_defaults_equal_torchvisions(photos):
    """With its defaults (fill None: bilinear edges blend with the zero padding, as AugMix)."""
    for k in range(10):
        rng = sample_rng(5, 1, 0, k)
        replay = copy.deepcopy(rng)
        expected = _aug_mix(_t(photos[k]), replay, 224, 224, 3, 3, 1.0, None)
        _same(_fast(photos[k], ops.aug_mix(rng, 224, 224)), expected, f"aug_mix draw {k}")


def test_color_jitter_sampling():
    """Factors uniform in torchvision's ranges, every order of the four equally likely, hue
    off unless asked."""
    rng = np.random.default_rng(0)
    orders, got = {}, {"brightness": [], "contrast": [], "saturation": [], "hue": []}
    for _ in range(4800):
        program = ops.color_jitter(rng, 224, 224, 0.4, 0.3, [0.5, 1.2], 0.1)
        orders[tuple(n for n, _ in program)] = orders.get(tuple(n for n, _ in program), 0) + 1
        for n, (f,) in program:
            got[n].append(f)
    assert len(orders) == 24 and 130 <= min(orders.values()) <= max(orders.values()) <= 270
    for n, (lo, hi) in {"brightness": (0.6, 1.4), "contrast": (0.7, 1.3),
                        "saturation": (0.5, 1.2), "hue": (-0.1, 0.1)}.items():
        v = np.asarray(got[n])
        assert lo <= v.min() < lo + 0.01 and hi - 0.01 < v.max() <= hi, n
        assert abs(np.median(v) - (lo + hi) / 2) < 0.02 * (hi - lo) * 5, n
    assert [n for n, _ in ops.color_jitter(rng, 224, 224, 0.4, 0.4, 0.4)] != [] and all(
        n != "hue" for _ in range(50) for n, _ in ops.color_jitter(rng, 224, 224, 0.4, 0.4, 0.4))


def test_random_erasing_boxes_within_scale_and_ratio():
    rng = np.random.default_rng(1)
    areas, ratios = [], []
    for _ in range(3000):
        (name, (i, j, eh, ew, _)), = ops.random_erasing(rng, 224, 224, p=1.0)
        assert 0 <= i <= i + eh <= 224 and 0 <= j <= j + ew <= 224 and max(eh, ew) < 224
        # rounded from an area in scale * 224**2 and an aspect in ratio: +- half a pixel
        assert (eh - 0.5) * (ew - 0.5) <= 0.33 * 224 ** 2 <= 224 ** 2
        assert (eh + 0.5) * (ew + 0.5) >= 0.02 * 224 ** 2
        assert 0.3 <= (eh + 0.5) / (ew - 0.5) and (eh - 0.5) / (ew + 0.5) <= 3.3
        areas.append(eh * ew / 224 ** 2)
        ratios.append(math.log(eh / ew))
    assert 0.15 < np.mean(areas) < 0.20  # uniform area in [0.02, 0.33]: mean 0.175
    assert abs(np.mean(ratios)) < 0.05  # log-uniform aspect in [0.3, 3.3] is ~symmetric


def test_policies_cover_their_spaces_and_interpolate_fractional_magnitudes():
    rng = np.random.default_rng(2)
    seen = {tuple(n for n, _ in ops.rand_augment(rng, 224, 224, num_ops=1)) for _ in range(3000)}
    # 14 ops -> 11 primitives (Identity is empty; shears share one, translates affine)
    assert seen == {(), ("shear_origin",), ("affine",), ("rotate",), ("brightness",),
                    ("saturation",), ("contrast",), ("sharpness",), ("posterize",),
                    ("solarize",), ("autocontrast",), ("equalize",)}
    table = T.RandAugment._AUGMENTATION_SPACE["Brightness"][0](31, 224, 224)
    mid = (float(table[9]) + float(table[10])) / 2
    factors = {round(abs(args[0] - 1.0), 6) for _ in range(400) for n, args in
               ops.rand_augment(rng, 224, 224, num_ops=1, magnitude=9.5) if n == "brightness"}
    assert factors == {round(mid, 6)}


# ---------------------------------------------------------------- mixup / cutmix (timm)
class _NumpyGlobal:
    """BatchMix's generator interface on numpy's global state, the one timm's Mixup draws from."""
    random = staticmethod(lambda: np.random.rand())
    beta = staticmethod(np.random.beta)
    integers = staticmethod(np.random.randint)


@pytest.mark.parametrize("mixup,cutmix,prob,smoothing", [(0.8, 1.0, 1.0, 0.1), (0.8, 0.0, 0.7, 0.0),
                                                         (0.0, 1.0, 1.0, 0.2)])
def test_batch_mix_equals_timm_mixup(photos, mixup, cutmix, prob, smoothing):
    from timm.data.mixup import Mixup

    x = torch.stack([_t(a) for a in photos[:8]]).float().div_(255)
    y = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    state = np.random.get_state()
    try:
        for seed in range(40):
            np.random.seed(seed)
            got, got_t = BatchMix(5, mixup, cutmix, prob, label_smoothing=smoothing)(
                x.clone(), y, _NumpyGlobal)
            np.random.seed(seed)
            ref, ref_t = Mixup(mixup, cutmix, prob=prob, label_smoothing=smoothing,
                               num_classes=5)(x.clone(), y)
            assert torch.equal(got, ref) and torch.equal(got_t, ref_t), seed
            torch.testing.assert_close(got_t.sum(1), torch.ones(8))
    finally:
        np.random.set_state(state)


def test_cutmix_lam_is_the_box_area(photos):
    x = torch.stack([_t(a) for a in photos[:8]]).float()
    labels = torch.arange(8)
    mix = BatchMix(8, cutmix_alpha=1.0)
    for step in range(30):
        rng = mix_rng(0, 2, 0, step)
        lam0, use_cutmix = mix.draw(rng)
        (y0, y1, x0, x1), lam = BatchMix.box(224, 224, lam0, rng)
        out, targets = mix(x.clone(), labels, mix_rng(0, 2, 0, step))
        assert use_cutmix and lam == 1 - (y1 - y0) * (x1 - x0) / 224 ** 2
        inside = torch.zeros(224, 224, dtype=torch.bool)
        inside[y0:y1, x0:x1] = True
        assert torch.equal(out[..., inside], x.flip(0)[..., inside])
        assert torch.equal(out[..., ~inside], x[..., ~inside])
        assert torch.allclose(targets[labels, labels], torch.full((8,), lam))
        assert torch.allclose(targets.sum(1), torch.ones(8))
