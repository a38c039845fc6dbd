"""The fused CPU augmentation gives the pixels of the per-op path, byte for byte.

``_kernels.run`` applies a run of consecutive pixelwise colour ops (brightness, contrast,
saturation, grayscale, posterize, solarize) in one pass per contrast op (``do_chain``); with
``_kernels._set_fused(False)`` it runs them one pass per op, the code that the per-op tests of
tests/test_augment_ops.py compare with torchvision. Here the two are compared on real photos:
random chains on the kernel, and whole loader epochs of the ``standard`` and ``randaugment``
presets (the batches a training run sees), on every code path of this host (portable C and the
AVX2+FMA clones, torch's fused and separate rounding)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shardkit.augment import AugmentSpec, apply_hwc, prims
from shardkit.stream import make_loader

kernels = prims._kernels
pytestmark = pytest.mark.skipif(kernels is None, reason="shardkit.augment._kernels not built")
SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"
CHAINABLE = (1, 2, 3, 5, 6, 9)  # brightness, contrast, saturation, posterize, solarize, gray


@pytest.fixture(scope="module")
def photos():
    from PIL import Image

    out = []
    for path in sorted(SAMPLE.glob("*/*.jpg"))[::12]:
        a = np.asarray(Image.open(path).convert("RGB"))
        out.append(np.ascontiguousarray(a[:200, :189]))  # odd sizes: partial blocks of 64 and 16
    return out


class _Mode:
    """Sets the kernels' flags for a block and restores them (``wide``: the ``_set_wide``
    level, capped at this CPU's best)."""

    def __init__(self, fused=None, path=None, separate=None, wide=None):
        self.want = (fused, path, separate, wide)

    def __enter__(self):
        fused, path, separate, wide = self.want
        self.before = (kernels._set_fused(True), kernels.path()[0],
                       kernels._set_separate_rounding(False), kernels._set_wide(0))
        kernels._set_fused(self.before[0] if fused is None else fused)
        kernels._set_path(self.before[1] if path is None else path)
        kernels._set_separate_rounding(self.before[2] if separate is None else separate)
        kernels._set_wide(self.before[3] if wide is None else wide)
        return self

    def __exit__(self, *exc):
        kernels._set_fused(self.before[0])
        kernels._set_path(self.before[1])
        kernels._set_separate_rounding(self.before[2])
        kernels._set_wide(self.before[3])


def _fused_and_reference(img, ops, path, wide, separate=None):
    """``ops`` run on copies of ``img``: fused at ``(path, wide)``, and one pass per op."""
    with _Mode(fused=True, path=path, wide=wide, separate=separate):
        got = img.copy()
        kernels.run(got, *img.shape[:2], ops)
    with _Mode(fused=False, path=path, separate=separate):
        want = img.copy()
        kernels.run(want, *img.shape[:2], ops)
    return got, want


def _random_ops(rng) -> np.ndarray:
    rows = []
    for _ in range(int(rng.integers(1, 6))):
        code = int(rng.choice(CHAINABLE))
        args = {1: [rng.uniform(0, 2.5)], 2: [rng.uniform(0, 2.5)], 3: [rng.uniform(0, 2.5)],
                5: [int(rng.integers(0, 9))], 6: [rng.uniform(-10, 255)], 9: []}[code]
        if code in (1, 2, 3) and rng.random() < 0.1:
            args = [float(rng.choice([0.0, 1.0, 40.0]))]  # edge factors: black, identity, huge
        if code == 6 and rng.random() < 0.2:
            args = [float(rng.integers(0, 256))]  # integral threshold: the >= boundary
        rows.append([code, *args] + [0.0] * (9 - len(args)))
    return np.array(rows, np.float64)


def _wide_level_here(level: int) -> int:
    """The ``_set_wide`` level this CPU runs when ``level`` is asked (it caps at its best)."""
    before = kernels._set_wide(level)
    return kernels._set_wide(before)


def _skip_without_level(path, wide):
    if path and _wide_level_here(wide) != wide:
        pytest.skip(f"this CPU has no _set_wide level {wide} (AVX-512 / VBMI)")


@pytest.mark.parametrize("path, wide", [(0, 0), (1, 0), (1, 1), (1, 2)])
@pytest.mark.parametrize("separate", [False, True])
def test_chains_equal_the_per_op_kernels(photos, path, wide, separate):
    """Portable C, the AVX2+FMA clone and, where the CPU has them, the AVX-512 intrinsics
    (level 1: dword permutes) and their VBMI form (level 2: byte permutes)."""
    _skip_without_level(path, wide)
    rng = np.random.default_rng(7 + path + 2 * separate + 4 * wide)
    checked = 0
    for trial in range(120):
        img = photos[trial % len(photos)]
        ops = _random_ops(rng)
        got, want = _fused_and_reference(img, ops, path, wide, separate)
        assert np.array_equal(got, want), (
            f"ops {ops[:, :2].tolist()}: {(got != want).sum()} values differ")
        checked += int((want != img).any())
    assert checked > 100  # the chains changed the photos: the comparison is not vacuous


@pytest.mark.parametrize("path, wide", [(0, 0), (1, 0), (1, 1), (1, 2)])
def test_chains_on_tiny_and_large_images_equal_the_per_op_kernels(photos, path, wide):
    """Images of fewer pixels than one vector (the tail path alone) and of one vector plus
    some, and a 1100 x 1000 one: more than 65536 vectors of 16 pixels, where the contrast's
    gray sum is carried out of its int32 lanes. Contrast first, in the middle and last."""
    _skip_without_level(path, wide)
    big = np.ascontiguousarray(np.tile(photos[0], (6, 6, 1))[:1100, :1000])
    images = [photos[1][:1, :1], photos[1][:3, :5], photos[2][:1, :17], photos[3][:2, :25], big]
    programs = [[[2, 1.7], [3, 0.4], [1, 1.3]], [[3, 1.6], [2, 0.3], [6, 200.0]],
                [[1, 0.8], [9], [2, 2.2]]]
    for img in images:
        img = np.ascontiguousarray(img)
        for rows in programs:
            ops = np.array([r + [0.0] * (10 - len(r)) for r in rows], np.float64)
            got, want = _fused_and_reference(img, ops, path, wide)
            assert np.array_equal(got, want), (
                f"{img.shape} ops {rows}: {(got != want).sum()} values differ")
            assert (got != img).any()


@pytest.mark.parametrize("path, wide", [(0, 0), (1, 0), (1, 1), (1, 2)])
@pytest.mark.parametrize("separate", [False, True])
def test_chains_with_factors_near_float_max_equal_the_per_op_kernels(photos, path, wide,
                                                                     separate):
    """A contrast or saturation factor near FLT_MAX: rounded twice (``separate``, torch's
    scalar kernels), v * f + mean * (1 - f) is inf - inf = NaN where both products overflow
    (fused, the exact product keeps it inf). The per-op kernels give 0 for NaN; the chains gave
    255 until their clamp took the per-op order (found by a reviewer)."""
    _skip_without_level(path, wide)
    programs = [[[2, 3.4e38]], [[3, 3.4e38]], [[1, 1.3], [2, 3.4e38], [3, 0.5]],
                [[3, 2.9e38], [2, 3.0e38]]]
    for img in photos[:3]:
        for rows in programs:
            ops = np.array([r + [0.0] * (10 - len(r)) for r in rows], np.float64)
            got, want = _fused_and_reference(img, ops, path, wide, separate)
            assert np.array_equal(got, want), (
                f"ops {rows}: {(got != want).sum()} values differ")


@pytest.mark.parametrize("preset", ["standard", "randaugment", "trivialaugment"])
def test_programs_of_a_preset_equal_the_per_op_path(photos, preset):
    """apply_hwc of drawn programs (the runs of C primitives, as the loader applies them)."""
    spec = AugmentSpec.parse(preset)
    for k, img in enumerate(photos * 4):
        program = spec.draw(np.random.default_rng(k), *img.shape[:2], 0)
        got, want = img.copy(), img.copy()
        with _Mode(fused=True):
            apply_hwc(got, program)
        with _Mode(fused=False):
            apply_hwc(want, program)
        assert np.array_equal(got, want), f"{program}: {(got != want).sum()} values differ"


@pytest.fixture(scope="module")
def root(packed_sample):
    return packed_sample("wds")


def _epoch(root, preset, fused):
    with _Mode(fused=fused):
        loader = make_loader(root, "train", 16, image_size=224, num_workers=0, seed=11,
                             augment=preset)
        loader.set_epoch(2)
        with loader:
            return [(x.clone(), y.clone()) for x, y in loader]


@pytest.mark.parametrize("preset", ["standard", "randaugment"])
def test_loader_batches_equal_the_per_op_path(root, preset):
    got, want = _epoch(root, preset, True), _epoch(root, preset, False)
    plain = _epoch(root, "none", True)
    assert len(got) == len(want) == len(plain) >= 8
    for k, ((x, y), (wx, wy), (px, _)) in enumerate(zip(got, want, plain)):
        assert torch.equal(y, wy)
        assert torch.equal(x, wx), f"batch {k}: {(x != wx).sum().item()} values differ"
        assert not torch.equal(x, px), f"batch {k}: {preset} left the batch as it was"


def _reference_color_jitter(rng, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0):
    """color_jitter's draw as it was before its ranges were cached (the same RNG calls)."""
    from shardkit.augment.ops import _range  # noqa: PLC2701 (the op's own helper, a test)

    ranges = [_range(brightness, "brightness", 1.0), _range(contrast, "contrast", 1.0),
              _range(saturation, "saturation", 1.0), _range(hue, "hue", None)]
    names = ("brightness", "contrast", "saturation", "hue")
    order = rng.permutation(4)
    factors = [None if r == ((1.0, 1.0) if k < 3 else (0.0, 0.0)) else rng.uniform(*r)
               for k, r in enumerate(ranges)]
    return [(names[k], (float(factors[k]),)) for k in order if factors[k] is not None]


@pytest.mark.parametrize("params", [dict(brightness=0.4, contrast=0.4, saturation=0.4),
                                    dict(brightness=[0.5, 1.2], saturation=0.3, hue=0.1),
                                    dict(contrast=0.0, hue=[-0.2, 0.05])])
def test_cached_colour_jitter_draws_the_same_programs(params):
    from shardkit.augment import ops

    for seed in range(200):
        got = ops.color_jitter(np.random.default_rng(seed), 224, 224, **params)
        want = _reference_color_jitter(np.random.default_rng(seed), **params)
        assert got == want


def test_cached_magnitudes_equal_torchvisions_tables():
    """Every cached magnitude (and AugMix table) is the float of torchvision's tensor entry."""
    from shardkit.augment import ops, vendored

    for space in (vendored.RAND_AUGMENT_SPACE, vendored.TRIVIAL_AUGMENT_SPACE,
                  vendored.AUGMIX_SPACE):
        for name, (table_fn, _) in space.items():
            for bins, h, w in ((31, 224, 224), (10, 160, 192)):
                table = table_fn(bins, h, w)
                cached = ops._table(table_fn, bins, h, w)
                if table is None:
                    assert cached is None and ops._magnitude(table_fn, bins, h, w, 3.0) is None
                    continue
                assert cached == tuple(float(v) for v in table), name
                for m in range(bins):
                    assert ops._magnitude(table_fn, bins, h, w, float(m)) == float(table[m])
                frac = ops._magnitude(table_fn, bins, h, w, 2.25)
                assert frac == float(table[2]) * 0.75 + float(table[3]) * 0.25, name


@pytest.mark.parametrize("path, wide", [(0, 0), (1, 0), (1, 1)])
def test_hue_kernel_equals_torchvision_exactly(photos, path, wide):
    """The C hue kernel (portable, AVX2 and AVX-512 clones) against torchvision's adjust_hue
    (float32 HSV): equal bytes, with random factors and the range's ends (no tolerance: max
    difference 0)."""
    import torchvision.transforms.v2.functional as F

    rng = np.random.default_rng(5)
    for img in photos:
        for factor in [*rng.uniform(-0.5, 0.5, 2), -0.5, 0.5, 0.0]:
            got = img.copy()
            with _Mode(path=path, wide=wide):
                kernels.run(got, *img.shape[:2], np.array([[12, factor] + [0.0] * 8]))
            want = F.adjust_hue(torch.from_numpy(img.copy()).permute(2, 0, 1), float(factor))
            want = want.permute(1, 2, 0).numpy()
            assert np.array_equal(got, want), (
                f"factor {factor}: {(got != want).sum()} values differ, max "
                f"{np.abs(got.astype(int) - want).max()}")
            if factor != 0.0:
                assert (got != img).mean() > 0.2  # the hue moved: not vacuous


def test_hue_factor_out_of_range_is_refused(photos):
    img = photos[0].copy()
    with pytest.raises(ValueError, match=r"hue factor must be in \[-0.5, 0.5\]"):
        kernels.run(img, *img.shape[:2], np.array([[12, 0.6] + [0.0] * 8]))
    assert np.array_equal(img, photos[0])  # nothing written


def test_colour_jitter_with_hue_takes_the_c_path():
    spec = AugmentSpec.parse([{"op": "color_jitter", "brightness": 0.4, "hue": 0.1}])
    assert spec.torch_path_ops() == []
    assert "hue" in prims.C_PRIMITIVES


def test_whole_pixel_translations_equal_the_affine_grid(photos):
    """RandAugment's TranslateX / TranslateY take a row-copy path: the bytes of the nearest
    affine grid (``_set_fused(False)``), at every shift, inside and past the edges."""
    rng = np.random.default_rng(3)
    changed = 0
    for img in photos:
        h, w = img.shape[:2]
        shifts = [(0, 0), (5, 0), (0, -7), (-100, 3), (w, 0), (0, -h), (1 - w, h - 1)]
        shifts += [tuple(int(v) for v in rng.integers(-250, 250, 2)) for _ in range(6)]
        for tx, ty in shifts:
            fill = [int(v) for v in rng.integers(0, 256, 3)]
            program = [("affine", (0.0, (tx, ty), 1.0, (0.0, 0.0), fill, "nearest"))]
            got, want = img.copy(), img.copy()
            with _Mode(fused=True):
                apply_hwc(got, program)
            with _Mode(fused=False):
                apply_hwc(want, program)
            assert np.array_equal(got, want), f"shift {(tx, ty)}: {(got != want).sum()} differ"
            changed += int((tx, ty) != (0, 0) and (got != img).any())
    assert changed >= 6 * len(photos)


@pytest.mark.parametrize("factor", [0.0, 0.1, 1.9, 2.6])
def test_sharpness_clones_give_the_same_bytes(photos, factor):
    """Sharpness on the AVX-512 clone (where the CPU has it), the AVX2+FMA one and portable C:
    the same bytes, and torchvision's (on a host with fused multiply-adds in torch)."""
    import torchvision.transforms.v2.functional as F

    row = np.array([[4, factor] + [0.0] * 8])
    for img in photos[:6]:
        outs = []
        for path, wide in ((1, 1), (1, 0), (0, 0)):
            got = img.copy()
            with _Mode(path=path, wide=wide):
                kernels.run(got, *img.shape[:2], row)
            outs.append(got)
        assert all(np.array_equal(outs[0], o) for o in outs[1:])
        if _torch_fuses():  # else torch rounds twice: tests/test_augment_ops.py covers it
            want = F.adjust_sharpness(torch.from_numpy(img.copy()).permute(2, 0, 1), factor)
            assert np.array_equal(outs[0], want.permute(1, 2, 0).numpy())


def _torch_fuses() -> bool:
    """Whether torch's ``a.add_(b, alpha=k)`` is one fused multiply-add on this host (as
    tests/test_augment_ops.py ``torch_fuses``)."""
    a = torch.full((64,), -1.00048828125)
    out = a.add_(torch.full((64,), 1.000244140625), alpha=1.000244140625)
    return float(out[0]) != 0.0
