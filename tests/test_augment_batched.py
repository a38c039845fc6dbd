"""The device path (:func:`shardkit.augment.batched.apply_batch`, one batched op per primitive
and step) against the per-sample torchvision path (:func:`shardkit.augment.apply_torch`) and the
CPU rows' C kernels (:func:`shardkit.augment.apply_hwc`), on real photos."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit.augment import AugmentSpec, apply_hwc, apply_torch, fast_path_available
from shardkit.augment.batched import apply_batch

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"

SPECS = ["standard", "randaugment", "trivialaugment",
         [{"op": "color_jitter", "brightness": 0.5, "contrast": 0.5, "saturation": 0.5},
          {"op": "affine", "degrees": 25, "translate": [0.1, 0.1], "scale": [0.8, 1.2],
           "shear": 10, "fill": [10, 20, 30]},
          {"op": "rotation", "degrees": 40, "fill": 128},
          {"op": "sharpness", "sharpness_factor": 1.8, "p": 1.0},
          {"op": "posterize", "bits": 3, "p": 0.5}, {"op": "solarize", "p": 0.5},
          {"op": "autocontrast"}, {"op": "equalize"}, {"op": "grayscale", "p": 0.3},
          {"op": "random_erasing", "p": 0.7}],
         [{"op": "color_jitter", "hue": 0.1}, {"op": "perspective", "p": 1.0},
          {"op": "gaussian_blur", "kernel_size": 5}, {"op": "aug_mix"}]]


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """(24, 3, 160, 160) uint8: real flowers, resized (not square crops of one size only:
    160 is not the 224 the presets are tuned for)."""
    files = sorted(SAMPLE.rglob("*.jpg"))[:24]
    assert len(files) == 24
    return torch.stack([torch.from_numpy(np.array(Image.open(f).convert("RGB").resize(
        (160, 160)))).permute(2, 0, 1) for f in files])


def _programs(spec, n: int, seed: int = 0) -> list:
    spec = AugmentSpec.parse(spec)
    rng = np.random.default_rng(seed)
    return [spec.draw(rng, 160, 160, 0) for _ in range(n)]


@pytest.mark.parametrize("spec", SPECS, ids=["standard", "randaugment", "trivialaugment",
                                             "many-ops", "torch-only-ops"])
def test_batched_equals_per_sample(photos, spec):
    programs = _programs(spec, len(photos))
    assert sum(len(p) for p in programs) >= len(photos) // 2  # the ops really fire
    ref = torch.stack([apply_torch(photos[i].clone(), p) for i, p in enumerate(programs)])
    out = apply_batch(photos.clone(), programs)
    assert out.dtype == torch.uint8 and out.shape == photos.shape
    assert torch.equal(out, ref)
    assert not torch.equal(out, photos)


@pytest.mark.skipif(not fast_path_available(), reason="C kernels not built")
@pytest.mark.parametrize("spec", SPECS[:4], ids=["standard", "randaugment", "trivialaugment",
                                                 "many-ops"])
def test_batched_equals_cpu_rows(photos, spec):
    """The CPU threads' C kernels and the device path give the same pixels."""
    programs = _programs(spec, len(photos), seed=1)
    rows = photos.permute(0, 2, 3, 1).contiguous().numpy()
    for row, program in zip(rows, programs):
        apply_hwc(row, program)
    out = apply_batch(photos.clone(), programs)
    assert np.array_equal(out.permute(0, 2, 3, 1).numpy(), rows)


def test_batched_rejects_mismatched_programs(photos):
    with pytest.raises(ValueError, match="3 programs for a batch of 24"):
        apply_batch(photos.clone(), [[]] * 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", SPECS[:4], ids=["standard", "randaugment", "trivialaugment",
                                                 "many-ops"])
def test_batched_on_cuda_matches_cpu(photos, spec):
    """On the GPU, against the CPU per-sample result: float rounding of CUDA kernels may move
    a value by one grey level where it lies within rounding of an integer."""
    programs = _programs(spec, len(photos), seed=2)
    ref = torch.stack([apply_torch(photos[i].clone(), p) for i, p in enumerate(programs)])
    out = apply_batch(photos.cuda(), programs).cpu()
    diff = (out.to(torch.int16) - ref.to(torch.int16)).abs()
    assert diff.max().item() <= 1
    assert (diff > 0).float().mean().item() < 0.001
