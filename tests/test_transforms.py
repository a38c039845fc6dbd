"""TransformConfig + make_transform: train/eval outputs, determinism, crop statistics, drift
against the torchvision v2 reference, pickling, device normalisation."""
from __future__ import annotations

import io
import math
import pickle
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit.decode import DECODERS, get_decoder
from shardkit.errors import ConfigError
from shardkit.decode import extensions as _ext
from shardkit.transforms import (
    CropParams, TransformConfig, TransformInputError, eval_crop_box, make_transform,
    normalize_on_device, sample_crop_params, torchvision_reference,
)

STOCK_PILLOW = ".post" not in Image.__version__
CPU_DECODERS = [n for n in DECODERS if n != "nvjpeg" and DECODERS[n].available()]
if "roi" not in CPU_DECODERS and _ext.build_prerequisites()["roi_expected"]:
    # the fused path must never vanish behind a shorter parameter list (see test_cext.py)
    raise RuntimeError(f"the roi decoder must be available where it can be built: "
                       f"{DECODERS['roi'].unavailable_reason()}")
EVAL_MEAN_ABS_BOUND = 0.1  # fused box resize vs resize-then-crop: float rounding of the grid


def _files(sample_dir: Path, n: int) -> list[Path]:
    files = sorted(sample_dir.rglob("*.jpg"))
    return files[:: max(1, len(files) // n)][:n]


@pytest.fixture(scope="module")
def large_jpeg(sample_dir) -> bytes:
    """A 2000x1072 JPEG (4:2:0, quality 90): 16 real 500x333 sample photos pasted side by side
    (4 x 4, no resampling, bottom row cut): big crops of it decode at 1/2 or 1/4."""
    files = [p for p in sorted(sample_dir.rglob("*.jpg")) if Image.open(p).size == (500, 333)]
    assert len(files) >= 16, f"{sample_dir}: {len(files)} photos of 500x333, expected >= 16"
    canvas = Image.new("RGB", (2000, 1332))
    for i, path in enumerate(files[:16]):
        with Image.open(path) as im:
            canvas.paste(im.convert("RGB"), ((i % 4) * 500, (i // 4) * 333))
    buf = io.BytesIO()
    canvas.crop((0, 0, 2000, 1072)).save(buf, "JPEG", quality=90, subsampling=2)
    return buf.getvalue()


# ---------------------------------------------------------------- config --------------------

def test_config_defaults_and_round_trip():
    cfg = TransformConfig()
    assert cfg.image_size == 224 and cfg.crop_pct == 0.875 and cfg.hflip == 0.5
    assert cfg.mean == (0.485, 0.456, 0.406) and cfg.std == (0.229, 0.224, 0.225)
    d = cfg.to_dict()
    assert d["scale"] == [0.08, 1.0] and isinstance(d["mean"], list)
    assert TransformConfig.from_dict(d) == cfg
    with pytest.raises(AttributeError):
        cfg.image_size = 128  # frozen


@pytest.mark.parametrize("bad, match", [
    ({"image_size": 0}, "image_size"), ({"scale": (0.5, 0.2)}, "scale"),
    ({"ratio": (0, 1)}, "ratio"), ({"hflip": 1.5}, "hflip"), ({"crop_pct": 0}, "crop_pct"),
    ({"interpolation": "lanczos"}, "'lanczos'"), ({"std": (1, 0, 1)}, "std"),
])
def test_config_rejects_bad_values(bad, match):
    with pytest.raises(ConfigError, match=match):
        TransformConfig(**bad)


def test_config_from_dict_names_unknown_keys():
    with pytest.raises(ConfigError, match=r"\['img_size'\]"):
        TransformConfig.from_dict({"img_size": 224})


# ---------------------------------------------------------------- crop params ---------------

def test_crop_params_distribution_matches_torchvision():
    from torchvision.transforms import RandomResizedCrop

    cfg = TransformConfig()
    rng = np.random.default_rng(0)
    ours = [sample_crop_params(320, 240, cfg, rng) for _ in range(4000)]
    torch.manual_seed(0)
    img = torch.zeros(3, 240, 320)
    theirs = [RandomResizedCrop.get_params(img, list(cfg.scale), list(cfg.ratio))
              for _ in range(4000)]
    area = np.array([p.width * p.height / (320 * 240) for p in ours])
    area_tv = np.array([h * w / (320 * 240) for _, _, h, w in theirs])
    aspect = np.array([p.width / p.height for p in ours])
    assert 0.075 <= area.min() and area.max() <= 1.0
    assert abs(area.mean() - area_tv.mean()) < 0.02
    assert np.all((aspect > 0.74) & (aspect < 1.35))
    assert all(0 <= p.left <= 320 - p.width and 0 <= p.top <= 240 - p.height for p in ours)
    flips = np.mean([p.flip for p in ours])
    assert 0.47 < flips < 0.53
    cx = np.array([p.left + p.width / 2 for p in ours])
    assert abs(cx.mean() - 160) < 4  # crops centred on average


def test_crop_params_fallback_is_center_crop():
    # a 1000x10 strip: no attempt fits the ratio range, so torchvision falls back to a
    # center crop clamped to ratio 4/3: w = round(10 * 4/3) = 13
    p = sample_crop_params(1000, 10, TransformConfig(scale=(0.9, 1.0)), np.random.default_rng(3))
    assert (p.top, p.left, p.height, p.width) == (0, (1000 - 13) // 2, 10, 13)


def test_eval_crop_box_is_timm_resize_center_crop():
    # 320x240: short side -> 256, long int(256*320/240)=341; anchor round((341-224)/2)=58
    x0, y0, x1, y1 = eval_crop_box(320, 240, TransformConfig())
    r = 240 / 256
    assert math.isclose(x0, 58 * 320 / 341) and math.isclose(y0, 16 * r)
    assert math.isclose(x1 - x0, 224 * 320 / 341) and math.isclose(y1 - y0, 224 * r)


# ---------------------------------------------------------------- train / eval -------------

@pytest.mark.parametrize("decoder", CPU_DECODERS)
def test_train_output_deterministic_and_exact_vs_torchvision(decoder, sample_dir):
    cfg = TransformConfig(decoder=decoder)
    t = make_transform(cfg, train=True)
    ref = torchvision_reference(cfg, train=True)
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    buf = np.zeros((224, 224, 3), np.uint8)
    flips = 0
    for path in _files(sample_dir, 12):
        data = path.read_bytes()
        out = t(data, rng_a, buf)
        assert out is buf and out.dtype == np.uint8 and out.shape == (224, 224, 3)
        params = t.last_params
        again = t(data, rng_b)
        assert np.array_equal(again, buf)  # same seed -> identical output
        expect = ref(Image.open(path).convert("RGB"), params)
        diff = np.abs(expect.astype(np.int16) - out).mean()
        if STOCK_PILLOW:
            assert diff == 0, (path.name, params, diff)
        else:
            assert diff < 1.0
        flips += params.flip
    assert 0 < flips < 12


@pytest.mark.parametrize("decoder", CPU_DECODERS)
def test_train_exact_vs_torchvision_on_420(decoder, sample_dir):
    """Most camera JPEGs are 4:2:0 and every flowers photo is 4:4:4: 12 photos saved again at
    4:2:0 (fancy chroma upsampling), 4 crops each, bit for bit equal to torchvision on Pillow's
    decode (the roi decoder decodes chroma context beyond the crop: _jpegroi.c
    ROI_EDGE_CONTEXT; without it crop edges were off by up to 18 levels)."""
    cfg = TransformConfig(decoder=decoder)
    t = make_transform(cfg, train=True)
    ref = torchvision_reference(cfg, train=True)
    rng = np.random.default_rng(11)
    for path in _files(sample_dir, 12):
        buf = io.BytesIO()
        Image.open(path).save(buf, "JPEG", quality=90, subsampling=2)
        data = buf.getvalue()
        img = Image.open(io.BytesIO(data)).convert("RGB")
        for _ in range(4):
            out = t(data, rng)
            expect = ref(img, t.last_params)
            diff = np.abs(expect.astype(np.int16) - out)
            if STOCK_PILLOW:
                assert diff.max() == 0, (path.name, t.last_params, diff.max())
            else:
                assert diff.mean() < 1.0


def test_train_flip_is_a_mirror(sample_dir):
    t = make_transform(TransformConfig(hflip=0.0), train=True)
    tf = make_transform(TransformConfig(hflip=1.0), train=True)
    data = _files(sample_dir, 1)[0].read_bytes()
    a = t(data, np.random.default_rng(5))
    b = tf(data, np.random.default_rng(5))
    assert t.last_params[:4] == tf.last_params[:4]
    assert np.array_equal(a[:, ::-1], b)


def test_train_dct_scaling_on_a_large_photo(large_jpeg):
    """A 2000x1072 photo: big crops decode at 1/2 or 1/4 and stay close to the full-size path."""
    data = large_jpeg
    fast = make_transform(TransformConfig(dct_scaling=True, scale=(0.5, 1.0)), train=True)
    exact = make_transform(TransformConfig(dct_scaling=False, scale=(0.5, 1.0)), train=True)
    diffs = []
    for seed in range(4):
        a = fast(data, np.random.default_rng(seed))
        b = exact(data, np.random.default_rng(seed))
        assert fast.last_params == exact.last_params
        diffs.append(np.abs(a.astype(np.int16) - b).mean())
    assert 0 < np.mean(diffs) < 3.0  # DCT reduction used (not identical), drift small


@pytest.mark.parametrize("decoder", CPU_DECODERS)
def test_eval_matches_torchvision_reference(decoder, sample_dir):
    cfg = TransformConfig(decoder=decoder)
    t = make_transform(cfg, train=False)
    ref = torchvision_reference(cfg, train=False)
    for path in _files(sample_dir, 10):
        data = path.read_bytes()
        a = t(data, None)
        assert np.array_equal(a, t(data, np.random.default_rng(1)))  # eval ignores rng
        expect = ref(Image.open(path).convert("RGB"))
        assert expect.shape == a.shape == (224, 224, 3)
        assert np.abs(expect.astype(np.int16) - a).mean() < EVAL_MEAN_ABS_BOUND


def test_gray_and_png_inputs(made_awkward_dir, sample_dir):
    """A single-channel JPEG and a PNG give what torchvision gives on Pillow's RGB of the same
    bytes (train: same crop parameters; eval: fixed crop)."""
    cfg = TransformConfig(image_size=96)
    t = make_transform(cfg, train=True)
    path = made_awkward_dir / "grayscale.jpg"
    gray = t(path.read_bytes(), np.random.default_rng(0))
    assert gray.shape == (96, 96, 3)
    assert np.array_equal(gray[..., 0], gray[..., 1]) and np.array_equal(gray[..., 0], gray[..., 2])
    expect = torchvision_reference(cfg, train=True)(Image.open(path).convert("RGB"),
                                                    t.last_params)
    diff = np.abs(expect.astype(np.int16) - gray).mean()
    assert diff == 0 if STOCK_PILLOW else diff < 1.0, diff

    photo = Image.open(_files(sample_dir, 1)[0]).convert("RGB")
    png = io.BytesIO()
    photo.save(png, "PNG")
    out = make_transform(cfg, train=False)(png.getvalue())
    expect = torchvision_reference(cfg, train=False)(photo)
    assert out.shape == expect.shape == (96, 96, 3)
    assert np.abs(expect.astype(np.int16) - out).mean() < EVAL_MEAN_ABS_BOUND


def test_bad_out_buffer_is_named(sample_dir):
    t = make_transform(TransformConfig(), train=True)
    data = _files(sample_dir, 1)[0].read_bytes()
    with pytest.raises(TransformInputError, match=r"\(224, 224, 3\) uint8.*\(224, 224, 4\)"):
        t(data, np.random.default_rng(0), np.zeros((224, 224, 4), np.uint8))


def test_transform_counts_decoder_warnings(sample_dir):
    photo = Image.open(_files(sample_dir, 1)[0]).convert("RGB")
    buf = io.BytesIO()
    photo.save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    sos = data.index(b"\xff\xda")
    junk = data[:sos] + b"\x00\x11junk" + data[sos:]
    t = make_transform(TransformConfig(), train=False)
    t(data)
    assert t.last_warnings == 0
    t(junk)
    expect = 0 if t.decoder.name == "pil" else 1  # Pillow cannot report warnings
    assert t.last_warnings == expect


def test_transform_pickles_without_decoder(sample_dir):
    t = make_transform(TransformConfig(), train=True)
    data = _files(sample_dir, 1)[0].read_bytes()
    a = t(data, np.random.default_rng(2))
    assert t._decoder is not None
    t2 = pickle.loads(pickle.dumps(t))
    assert t2._decoder is None and t2.cfg == t.cfg
    assert np.array_equal(t2(data, np.random.default_rng(2)), a)
    assert t2.decoder.name == get_decoder(t.cfg.decoder).name


def test_reference_train_needs_params(sample_dir):
    ref = torchvision_reference(TransformConfig(), train=True)
    img = Image.open(_files(sample_dir, 1)[0]).convert("RGB")
    with pytest.raises(TransformInputError, match="CropParams"):
        ref(img)
    out = ref(img, CropParams(0, 0, 100, 120, True))
    assert out.shape == (224, 224, 3)
    assert len(ref.pipeline.transforms) == 2  # RandomResizedCrop + RandomHorizontalFlip


# ---------------------------------------------------------------- device normalisation ------

def test_normalize_on_device_values_and_layout():
    batch = torch.randint(0, 256, (4, 3, 8, 6), dtype=torch.uint8)
    batch = batch.contiguous(memory_format=torch.channels_last)
    cfg = TransformConfig()
    out = normalize_on_device(batch, cfg.mean, cfg.std)
    assert out.dtype == torch.float32 and out.shape == batch.shape
    assert out.is_contiguous(memory_format=torch.channels_last)
    mean = torch.tensor(cfg.mean).view(1, 3, 1, 1)
    std = torch.tensor(cfg.std).view(1, 3, 1, 1)
    expect = (batch.float() / 255 - mean) / std
    assert torch.allclose(out, expect, atol=1e-5)
    white = normalize_on_device(torch.full((1, 3, 1, 1), 255, dtype=torch.uint8), cfg.mean, cfg.std)
    assert torch.allclose(white.flatten(), (1 - mean.flatten()) / std.flatten(), atol=1e-6)
    with pytest.raises(TransformInputError, match="uint8"):
        normalize_on_device(batch.float(), cfg.mean, cfg.std)


def test_dct_choice_uses_only_fast_factors(large_jpeg):
    t = make_transform(TransformConfig(), train=False)
    data = large_jpeg
    probe = t.decoder.probe(data)
    assert Fraction(3, 8) not in probe.factors and Fraction(1, 3) not in probe.factors
    out = t(data)
    assert out.shape == (224, 224, 3)
    # 2000x1072 -> eval box 938 px square -> 1/4 reduction (234.5 >= 224); drift vs torchvision
    # (full-size decode, antialiased resize) stays small; without DCT scaling it vanishes
    ref = torchvision_reference(TransformConfig(), train=False)(
        Image.open(io.BytesIO(data)).convert("RGB"))
    assert 0.2 < np.abs(out.astype(np.int16) - ref).mean() < 3.0
    exact = make_transform(TransformConfig(dct_scaling=False), train=False)(data)
    assert np.abs(exact.astype(np.int16) - ref).mean() < EVAL_MEAN_ABS_BOUND


def test_without_c_extension_falls_back_to_same_pixels(monkeypatch, sample_dir):
    """No _jpegroi: 'auto' resolves to turbojpeg and Pillow resizes; pixels are unchanged
    (the C resize is Pillow-exact on stock Pillow)."""
    from shardkit.decode import roi as roi_module

    data = _files(sample_dir, 2)[1].read_bytes()
    fast = make_transform(TransformConfig(), train=True)(data, np.random.default_rng(4))
    monkeypatch.setattr(roi_module, "_jpegroi", None)
    t = make_transform(TransformConfig(), train=True)
    slow = t(data, np.random.default_rng(4))
    assert t.decoder.name in ("turbojpeg", "pil")
    if STOCK_PILLOW:
        assert np.array_equal(fast, slow)
    else:
        assert np.abs(fast.astype(np.int16) - slow).mean() < 1.0


@pytest.mark.parametrize("decoder", CPU_DECODERS)
def test_memoryview_input_and_strided_out(decoder, sample_dir):
    """Shard readers hand out memoryviews; a strided ``out`` (e.g. a view into an NCHW batch)
    takes the generic path and gets the same pixels."""
    data = _files(sample_dir, 3)[2].read_bytes()
    t = make_transform(TransformConfig(decoder=decoder, image_size=64), train=True)
    a = t(memoryview(data), np.random.default_rng(9))
    batch = np.zeros((2, 3, 64, 64), np.uint8)
    strided = batch[1].transpose(1, 2, 0)  # (64, 64, 3) view, not C-contiguous
    b = t(data, np.random.default_rng(9), strided)
    assert b is strided and np.array_equal(a, b)
    assert np.array_equal(batch[1].transpose(1, 2, 0), a) and not batch[0].any()
