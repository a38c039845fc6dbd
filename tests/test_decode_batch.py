"""The batched (GPU) path, ``shardkit.decode.nvjpeg.decode_crop_batch``: run on the CPU (the
same code but for the decode device) against the CPU fused transform, and on CUDA when there is
one (``@pytest.mark.gpu``).
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit.decode import PixelLimitError, get_decoder
from shardkit.errors import ConfigError, DecodeError


def _flower_files(sample_dir: Path, n: int) -> list[Path]:
    files = sorted(sample_dir.rglob("*.jpg"))
    return files[:: max(1, len(files) // n)][:n]


def _train_refs(datas: list[bytes]):
    """CPU fused train transform outputs and the boxes/flips it drew (same seed)."""
    from shardkit.transforms import TransformConfig, make_transform

    t = make_transform(TransformConfig(), train=True)
    rng = np.random.default_rng(0)
    refs, boxes, flips = [], [], []
    for d in datas:
        refs.append(t(d, rng).copy())
        p = t.last_params
        boxes.append((p.left, p.top, p.left + p.width, p.top + p.height))
        flips.append(p.flip)
    return np.stack(refs), boxes, flips


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torchvision.io's deprecation note
def test_decode_crop_batch_matches_cpu_fused_transform(sample_dir, made_awkward_dir):
    """The batched path on the CPU (same code as on CUDA but for the decode device) against the
    CPU fused transform for the same boxes. Both apply the same antialiased bilinear filter;
    only rounding differs (torch's uint8 resize vs Pillow's 22-bit fixed point), measured 0.008
    mean / max 1 (train) and 0.011 / max 2 (eval) on these photos: bounds 0.05 and 2."""
    import torch

    from shardkit.decode.nvjpeg import decode_crop_batch, probe_batch
    from shardkit.transforms import TransformConfig, eval_crop_box, make_transform

    datas = [p.read_bytes() for p in _flower_files(sample_dir, 24)]
    refs, boxes, flips = _train_refs(datas)
    assert any(flips) and not all(flips)
    out = decode_crop_batch(datas, boxes, flips, 224, "cpu")
    assert out.dtype == torch.uint8 and out.shape == (24, 3, 224, 224) and out.is_contiguous()
    diff = np.abs(out.permute(0, 2, 3, 1).numpy().astype(np.int16) - refs)
    assert diff.mean() < 0.05 and diff.max() <= 2, (diff.mean(), diff.max())
    mirrored = decode_crop_batch(datas, boxes, [not f for f in flips], 224, "cpu")
    assert np.abs(mirrored.permute(0, 2, 3, 1).numpy().astype(np.int16) - refs).mean() > 5

    cfg = TransformConfig()
    ev = make_transform(cfg, train=False)
    probes = probe_batch(datas)
    assert [(p.width, p.height) for p in probes] == [Image.open(io.BytesIO(d)).size
                                                     for d in datas]
    out = decode_crop_batch(datas, [eval_crop_box(p.width, p.height, cfg) for p in probes],
                            [False] * 24, 224, "cpu", crop_first=False, probes=probes)
    diff = np.abs(out.permute(0, 2, 3, 1).numpy().astype(np.int16)
                  - np.stack([ev(d) for d in datas]))
    assert diff.mean() < 0.05 and diff.max() <= 2, (diff.mean(), diff.max())

    # CMYK JPEG and RGBA PNG go through Pillow (probe says not native) and still come out right
    odd = [(made_awkward_dir / name).read_bytes() for name in ("cmyk_adobe.jpg", "png_rgba.png")]
    assert [p.native for p in probe_batch(odd)] == [False, False]
    box = (40, 20, 140, 120)  # a 100x100 window of the 200x150 files
    got = decode_crop_batch(odd, [box] * 2, [False, True], 32, "cpu")
    assert got.shape == (2, 3, 32, 32)
    for i, flip in enumerate((False, True)):
        ref = np.asarray(Image.open(io.BytesIO(odd[i])).convert("RGB")
                         .resize((32, 32), Image.BILINEAR, box=box))
        ref = ref[:, ::-1] if flip else ref
        assert np.abs(got[i].permute(1, 2, 0).numpy().astype(int) - ref).mean() < 1.0, i


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_decode_crop_batch_errors_name_the_image(sample_dir):
    from shardkit.decode.nvjpeg import decode_crop_batch

    good = _flower_files(sample_dir, 1)[0].read_bytes()
    with pytest.raises(DecodeError, match="image 1 of 2"):
        decode_crop_batch([good, b"\xff\xd8\xff\xe0 not a jpeg"], [(0, 0, 9, 9)] * 2,
                          [False] * 2, 8, "cpu")
    with pytest.raises(ConfigError, match="one box and one flip per image: 1 images, 2 boxes"):
        decode_crop_batch([good], [(0, 0, 9, 9)] * 2, [False], 8, "cpu")
    with pytest.raises(ConfigError, match="outside its"):
        decode_crop_batch([good], [(0, 0, 9000, 9)], [False], 8, "cpu")
    with pytest.raises(PixelLimitError):
        decode_crop_batch([good], [(0, 0, 9, 9)], [False], 8, "cpu", max_pixels=100)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_nvjpeg_batch_on_cuda_matches_cpu(sample_dir):
    """nvJPEG decode + resize on the GPU vs the CPU fused transform, same boxes. nvJPEG's IDCT
    and chroma upsampling are not libjpeg-turbo's, and CUDA resizes in float, so the bound is
    the one of the full decode (mean < 2.0), not the CPU path's 0.05."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available")
    from shardkit.decode.nvjpeg import decode_crop_batch

    files = _flower_files(sample_dir, 16)
    datas = [p.read_bytes() for p in files]
    refs, boxes, flips = _train_refs(datas)
    out = decode_crop_batch(datas, boxes, flips, 224, "cuda")
    assert out.is_cuda and out.dtype == torch.uint8 and out.shape == (16, 3, 224, 224)
    assert np.abs(out.permute(0, 2, 3, 1).cpu().numpy().astype(int) - refs).mean() < 2.0
    full = get_decoder("nvjpeg").decode_batch(datas[:4])
    for t, path in zip(full, files):
        ref = np.asarray(Image.open(path).convert("RGB"))
        assert t.is_cuda and t.dtype == torch.uint8 and t.shape == (3, *ref.shape[:2])
        assert np.abs(t.permute(1, 2, 0).cpu().numpy().astype(int) - ref).mean() < 2.0
