"""shardkit.augment.vendored (torchvision 0.29.1 internals copied here) against torchvision.

The affine maths must give torchvision's bytes: the inverse matrix, grid and sampling, composed as
``affine_image`` / ``rotate_image`` compose them, equal the public ``F.affine`` / ``F.rotate`` on
crops of real photos (examples/flowers-sample), exactly, for nearest and bilinear sampling and
every kind of fill, on square and non-square images, one image at a time and as a batch with one
grid per image. The policy tables equal torchvision's (same ops in the same order, same signs,
same magnitudes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as T
import torchvision.transforms.v2.functional as F
from PIL import Image
from torchvision.transforms.v2 import InterpolationMode

from shardkit.augment import vendored
from shardkit.augment.batched import b_saturation

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"
FILLS = [None, 0, 128, (255, 40, 7)]


@pytest.fixture(scope="module")
def crops() -> list[torch.Tensor]:
    """(3, H, W) uint8 crops (no resampling) of the first photo of each class: 96x96 and
    80x120 (h x w) of each, 10 in all."""
    out = []
    for cls in sorted(p for p in SAMPLE.iterdir() if p.is_dir()):
        a = np.asarray(Image.open(sorted(cls.glob("*.jpg"))[0]).convert("RGB"))
        assert a.shape[0] >= 120 and a.shape[1] >= 120, a.shape
        for h, w in ((96, 96), (80, 120)):
            out.append(torch.from_numpy(np.ascontiguousarray(a[:h, :w])).permute(2, 0, 1)
                       .contiguous())
    assert len(out) == 10
    return out


def _fill(fill) -> list[float] | None:
    if fill is None:
        return None
    return [float(v) for v in (fill if isinstance(fill, tuple) else (fill,) * 3)]


def _vendored(img: torch.Tensor, matrix: list[float], mode: str, fill) -> torch.Tensor:
    """``affine_image``'s composition with the vendored functions."""
    h, w = img.shape[-2:]
    theta = torch.tensor(matrix, dtype=torch.float32).reshape(1, 2, 3)
    return vendored.grid_transform(img, vendored.affine_grid(theta, w=w, h=h), mode, _fill(fill))


def _draws(n: int, seed: int):
    """``n`` draws of ``(angle, translate, scale, shear, fill, mode, center)``."""
    rng = np.random.default_rng(seed)
    u = rng.uniform
    for k in range(n):
        yield (float(u(-180, 180)), [int(rng.integers(-20, 21)), int(rng.integers(-20, 21))],
               float(u(0.6, 1.5)), [float(u(-30, 30)), float(u(-30, 30))],
               FILLS[k % len(FILLS)], ("nearest", "bilinear")[(k // len(FILLS)) % 2],
               None if k % 3 else [float(u(0, 40)), float(u(0, 40))])


def test_affine_equals_torchvision_on_real_photos(crops):
    """Random angle, translation, scale, shear, centre (None or a pixel), fill and sampling."""
    checked = 0
    for img, (angle, translate, scale, shear, fill, mode, center) in zip(
            crops * 4, _draws(len(crops) * 4, seed=7)):
        h, w = img.shape[-2:]
        center_f = [0.0, 0.0] if center is None else [c - s * 0.5 for c, s in zip(center, (w, h))]
        matrix = vendored.inverse_affine_matrix(center_f, angle, [float(t) for t in translate],
                                                scale, shear)
        want = F.affine(img, angle=angle, translate=translate, scale=scale, shear=shear,
                        interpolation=InterpolationMode(mode), fill=_fill(fill), center=center)
        got = _vendored(img, matrix, mode, fill)
        assert got.dtype == torch.uint8 and got.shape == img.shape
        assert torch.equal(got, want), (angle, translate, scale, shear, fill, mode, center)
        assert not torch.equal(got, img)  # every draw moves the pixels
        checked += 1
    assert checked == 40


def test_rotate_equals_torchvision_on_real_photos(crops):
    """``rotate_image``: the matrix of ``-(angle % 360)`` about the centre (angles that are not
    a multiple of 90 degrees: those take torchvision's exact rot90 path)."""
    rng = np.random.default_rng(11)
    for k, img in enumerate(crops * 2):
        angle, fill = float(rng.uniform(-170, 170)), FILLS[k % 4]
        mode = ("nearest", "bilinear")[k % 2]
        matrix = vendored.inverse_affine_matrix([0.0, 0.0], -(angle % 360), [0.0, 0.0], 1.0,
                                                [0.0, 0.0])
        want = F.rotate(img, angle, interpolation=InterpolationMode(mode), fill=_fill(fill))
        assert torch.equal(_vendored(img, matrix, mode, fill), want), (angle, fill, mode)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_one_grid_per_image_of_a_batch_equals_each_image_alone(crops, mode):
    """The batched form :mod:`shardkit.augment.batched` uses: N grids for N images."""
    batch = torch.stack([c for c in crops if c.shape[-1] == 96])  # 5 x (3, 96, 96)
    draws = list(_draws(len(batch), seed=3))
    matrices = [vendored.inverse_affine_matrix([0.0, 0.0], a, [float(t) for t in tr], s, sh)
                for a, tr, s, sh, *_ in draws]
    theta = torch.tensor(matrices, dtype=torch.float32).reshape(-1, 2, 3)
    grid = torch.cat([vendored.affine_grid(theta[i:i + 1], w=96, h=96) for i in range(len(batch))])
    got = vendored.grid_transform(batch, grid, mode, [10.0, 20.0, 30.0])
    for i, (angle, translate, scale, shear, *_rest) in enumerate(draws):
        want = F.affine(batch[i], angle=angle, translate=translate, scale=scale, shear=shear,
                        interpolation=InterpolationMode(mode), fill=[10.0, 20.0, 30.0])
        assert torch.equal(got[i], want), i


def test_batched_grayscale_is_the_floor_of_torchvisions_float_grayscale():
    """Saturation 0 is the grayscale the batched contrast / saturation blend with: the floor of
    torchvision's float ``0.2989 r + 0.587 g + 0.114 b``, here on 2**20 colours (every r and g,
    b in steps of 16) against the formula and against torchvision's ``adjust_saturation``."""
    r, g, b = torch.meshgrid(torch.arange(256), torch.arange(256), torch.arange(0, 256, 16),
                             indexing="ij")
    img = torch.stack([r, g, b]).reshape(1, 3, 1024, 1024).to(torch.uint8)
    got = b_saturation(img, [(0.0,)])
    rf, gf, bf = img.float().unbind(dim=-3)
    floor = rf.mul(0.2989).add_(gf, alpha=0.587).add_(bf, alpha=0.114).floor_()
    assert torch.equal(got, floor.to(torch.uint8).unsqueeze(-3).expand_as(img))
    assert torch.equal(got, F.adjust_saturation(img, 0.0))


SPACES = [("RAND_AUGMENT_SPACE", T.RandAugment, "_AUGMENTATION_SPACE"),
          ("TRIVIAL_AUGMENT_SPACE", T.TrivialAugmentWide, "_AUGMENTATION_SPACE"),
          ("AUGMIX_SPACE", T.AugMix, "_AUGMENTATION_SPACE"),
          ("AUGMIX_PARTIAL_SPACE", T.AugMix, "_PARTIAL_AUGMENTATION_SPACE")]


@pytest.mark.parametrize("name,cls,attr", SPACES, ids=[s[0] for s in SPACES])
def test_policy_tables_equal_torchvisions(name, cls, attr):
    ours, theirs = getattr(vendored, name), getattr(cls, attr)
    assert list(ours) == list(theirs)  # ops are drawn by index: the order matters
    for op, (fn, signed) in ours.items():
        their_fn, their_signed = theirs[op]
        assert signed is their_signed, op
        for bins, h, w in ((2, 224, 224), (10, 97, 160), (31, 224, 224), (31, 331, 500)):
            a, b = fn(bins, h, w), their_fn(bins, h, w)
            assert (a is None) == (b is None), op
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a, b), (op, bins, h, w)
