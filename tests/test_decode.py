"""Decoder contract (every registered decoder), field case 12, ROI exactness, Pillow-exact resize,
the auto choice and its log, the one pixel limit (the batched GPU path: test_decode_batch.py).

Documented bounds: every decoder's full decode of a baseline flowers JPEG matches Pillow within a
mean absolute difference of 1.0 (all backends use libjpeg-turbo's islow IDCT and fancy
upsampling; measured 0.0 here); grayscale comes out as three equal channels.

The ROI decoder (the headline path) never skips where it can be built: ``_decoder_or_skip``
fails instead (see ``shardkit.decode.extensions.build_prerequisites``).
"""
from __future__ import annotations

import io
import logging
import struct
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import shardkit.decode as decode_pkg
from shardkit.decode import (
    DCT_REDUCTIONS, DECODERS, FAST_DCT_REDUCTIONS, DecodeWarningError, PixelLimitError,
    apply_warning_policy, available_decoders, choose_scale, decoder_environment, get_decoder,
    pil_flavor, resize_into, scaled_size,
)
from shardkit.decode import extensions as _ext
from shardkit.decode import roi as roi_module
from shardkit.errors import ConfigError, DecodeError
from shardkit.images.normalize import check_image

from conftest import made_photo

PIL_MEAN_ABS_BOUND = 1.0
#: nvJPEG's chroma upsampling is not libjpeg's: on a 4:2:0 JPEG its full decode is further from
#: Pillow (measured 1.38 on the made progressive file, H200); the bound of test_decode_batch.py.
NVJPEG_SUBSAMPLED_BOUND = 2.0
STOCK_PILLOW = ".post" not in Image.__version__  # Pillow-SIMD rounds its resize differently

CPU_DECODERS = [n for n in DECODERS if n != "nvjpeg"]
ALL_DECODERS = list(DECODERS)  # contract tests: every registered one (skips name the reason)


def _decoder_or_skip(name: str, **kwargs):
    """The decoder, or a skip naming why it is unavailable; for "roi" a FAILURE wherever the
    extension can be built (compiler + jpeglib.h + Python.h) and libjpeg-turbo is at the ROI
    floor (``_ext.roi_floor_ok``), so the fast path never vanishes behind green skips."""
    cls = DECODERS[name]
    if not cls.available():
        if name == "roi" and _ext.build_prerequisites()["roi_expected"]:
            pytest.fail(f"the roi decoder must be available where it can be built: "
                        f"{cls.unavailable_reason()}")
        pytest.skip(f"decoder {name!r} is not available here: {cls.unavailable_reason()}")
    return get_decoder(name, **kwargs)


def _jpeg(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _flower_files(sample_dir: Path, n: int) -> list[Path]:
    files = sorted(sample_dir.rglob("*.jpg"))
    return files[:: max(1, len(files) // n)][:n]


@pytest.fixture(scope="module")
def case12(sample_dir):
    """Field case 12 fixtures from a real flowers photo resized to 333x250 with Pillow."""
    src = sorted(sample_dir.rglob("*.jpg"))[0]
    photo = Image.open(src).convert("RGB").resize((333, 250), Image.Resampling.BICUBIC)
    valid = _jpeg(photo)
    sos = valid.index(b"\xff\xda")
    return {
        "photo": photo,
        "valid": valid,
        "junk": valid[:sos] + b"\x00\x11junk" + valid[sos:],   # 6 stray bytes before SOS
        "cut": valid[: int(len(valid) * 0.7)],
        "gray": _jpeg(photo.convert("L")),
    }


# ---------------------------------------------------------------- registry ------------------

def test_registry_and_environment(monkeypatch, caplog):
    _decoder_or_skip("roi")
    assert set(DECODERS) == {"roi", "turbojpeg", "pil", "nvjpeg"}
    monkeypatch.setattr(decode_pkg, "_said", set())  # "once per process": start afresh
    with caplog.at_level(logging.INFO, logger="shardkit.decode"):
        assert get_decoder("auto").name == available_decoders()[0] == "roi"
        get_decoder("auto")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "shardkit.decode"]
    assert said == [(logging.INFO, "decoder 'auto' -> 'roi' (the preferred one)")]
    env = decoder_environment()
    assert env["auto"] == "roi" and env["auto_reason"] is None
    assert set(env["backends"]) == set(DECODERS)
    assert env["pil"]["simd"] == pil_flavor()["simd"]
    assert env["resize_simd"]["in_use"] in ("scalar", "sse4.1", "avx2")
    for name, entry in env["backends"].items():
        assert entry["available"] == DECODERS[name].available()
        assert ("unavailable_reason" in entry) != entry["available"]
    with pytest.raises(ConfigError, match="unknown decoder 'bmp'"):
        get_decoder("bmp")


def test_no_import_cycle_inside_decode():
    """Every import between shardkit.decode's modules, top-level or inside a function, forms no
    cycle (base used to import roi lazily while roi imports base)."""
    import ast

    pkg = Path(decode_pkg.__file__).parent
    mods = {p.stem for p in pkg.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for m in mods:
        edges = graph.setdefault(m, set())
        for node in ast.walk(ast.parse((pkg / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("shardkit.decode."):
                    edges.add(node.module.rsplit(".", 1)[1])
                elif node.module == "shardkit.decode":  # from shardkit.decode import extensions as _ext
                    edges.update(a.name for a in node.names if a.name in mods)
    assert "roi" not in graph["base"] and graph["resize"] <= {"extensions"}

    def reach(start: str, seen: set[str]) -> set[str]:
        for nxt in graph.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen

    assert not [m for m in mods if m in reach(m, set())], graph


def test_pillow_simd_rule():
    assert pil_flavor("9.5.0.post1", [])["simd"] is True
    assert pil_flavor("13.0.0", ["pillow"])["simd"] is False
    assert pil_flavor("10.4.0", ["Pillow-SIMD", "pillow"])["simd"] is True  # overwritten install
    assert pil_flavor("10.4.0.postfix", ["pillow"])["simd"] is False  # ".post" needs a number


def test_auto_fallback_warns_once_naming_why(monkeypatch, caplog):
    why = "_jpegroi not built: No module named 'shardkit.decode._jpegroi' (missing: jpeglib.h)"
    monkeypatch.setattr(roi_module, "_jpegroi", None)
    monkeypatch.setattr(roi_module, "_JPEGROI_REASON", why)
    monkeypatch.setattr(decode_pkg, "_said", set())
    with pytest.raises(ConfigError, match="decoder 'roi' is not available: _jpegroi not built"):
        get_decoder("roi")
    with caplog.at_level(logging.INFO, logger="shardkit.decode"):
        assert get_decoder("auto").name == "turbojpeg"
        assert get_decoder("auto").name == "turbojpeg"
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "shardkit.decode"]
    assert said == [(logging.WARNING, f"decoder 'auto' -> 'turbojpeg', not the preferred 'roi': "
                                      f"roi unavailable: {why}")]
    env = decoder_environment()
    assert env["auto"] == "turbojpeg" and env["auto_reason"] == f"roi unavailable: {why}"
    assert env["backends"]["roi"] == {"available": False, "unavailable_reason": why}


# ---------------------------------------------------------------- contract ------------------

@pytest.mark.parametrize("name", ALL_DECODERS)
def test_contract_real_flowers(name, sample_dir):
    dec = _decoder_or_skip(name)
    assert dec.info()["name"] == name
    for path in _flower_files(sample_dir, 6):
        data = path.read_bytes()
        arr = dec.decode(data)
        ref = np.asarray(Image.open(path).convert("RGB"))
        assert arr.dtype == np.uint8 and arr.flags.c_contiguous and arr.flags.writeable
        assert arr.shape == ref.shape
        assert np.abs(arr.astype(np.int16) - ref).mean() <= PIL_MEAN_ABS_BOUND
        assert dec.last_warnings == 0
        assert dec.probe(data)[:2] == (ref.shape[1], ref.shape[0])


@pytest.mark.parametrize("name", ALL_DECODERS)
def test_contract_gray_png_and_rgb_order(name, made_awkward_dir, sample_dir):
    dec = _decoder_or_skip(name)
    data = (made_awkward_dir / "grayscale.jpg").read_bytes()
    gray = dec.decode(data)
    ref = np.asarray(Image.open(io.BytesIO(data)))  # Pillow's own "L" decode of the same bytes
    assert ref.ndim == 2 and gray.shape == (*ref.shape, 3) == (150, 200, 3)
    assert gray.dtype == np.uint8
    assert np.array_equal(gray[..., 0], gray[..., 1]) and np.array_equal(gray[..., 0], gray[..., 2])
    assert np.abs(gray[..., 0].astype(np.int16) - ref).mean() <= PIL_MEAN_ABS_BOUND
    assert gray.std() > 5  # a real picture, not a constant fill

    photo = Image.open(_flower_files(sample_dir, 1)[0]).convert("RGB")
    png = io.BytesIO()
    photo.save(png, "PNG")
    arr = dec.decode(png.getvalue())
    assert np.array_equal(arr, np.asarray(photo))  # PNG is lossless: exact

    red = dec.decode(_jpeg(Image.new("RGB", (64, 48), (255, 0, 0))))
    assert red.shape == (48, 64, 3)
    r, g, b = (red[..., c].astype(int).mean() for c in range(3))
    assert r > 200 and b < 60 and g < 60, f"{name} is not RGB: mean R={r} G={g} B={b}"


@pytest.mark.parametrize("name", ALL_DECODERS)
def test_cmyk_jpeg_decodes_to_rgb(name, made_awkward_dir):
    """Pillow writes CMYK JPEGs with an Adobe APP14 marker and inverted ink values: the decode
    equals Pillow's and is the source photo again (JPEG loss only; measured mean 0.56), not its
    negative."""
    dec = _decoder_or_skip(name)
    data = (made_awkward_dir / "cmyk_adobe.jpg").read_bytes()
    arr = dec.decode(data)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert arr.shape == (150, 200, 3) and np.array_equal(arr, ref)
    assert np.abs(arr.astype(np.int16) - made_photo()).mean() < 2.0


@pytest.mark.parametrize("name", ALL_DECODERS)
def test_garbage_raises_named_decode_error(name, made_awkward_dir):
    dec = _decoder_or_skip(name)
    with pytest.raises(DecodeError):
        dec.decode(b"")
    with pytest.raises(DecodeError):
        dec.decode(b"\xff\xd8\xff\xe0 this is not a jpeg")
    with pytest.raises(DecodeError, match="PNG"):
        dec.decode((made_awkward_dir / "corrupt_header.png").read_bytes())


# ---------------------------------------------------------------- field case 12 -------------

@pytest.mark.parametrize("name", CPU_DECODERS)
def test_case12_valid_and_gray(name, case12):
    dec = _decoder_or_skip(name)
    arr = dec.decode(case12["valid"])
    assert arr.shape == (250, 333, 3) and dec.last_warnings == 0
    ref = np.asarray(Image.open(io.BytesIO(case12["valid"])).convert("RGB"))
    assert np.abs(arr.astype(np.int16) - ref).mean() <= PIL_MEAN_ABS_BOUND
    gray = dec.decode(case12["gray"])
    assert gray.shape == (250, 333, 3)
    assert np.array_equal(gray[..., 0], gray[..., 2])


@pytest.mark.parametrize("name", ["roi", "turbojpeg"])
def test_case12_junk_counted_not_printed(name, case12, capfd):
    dec = _decoder_or_skip(name)
    arr = dec.decode(case12["junk"])
    assert arr.shape == (250, 333, 3)
    assert dec.last_warnings == 1
    assert "6 extraneous bytes before marker 0xda" in dec.last_warning
    # the image itself is intact: stray bytes before SOS do not touch the scan
    assert np.array_equal(arr, dec.decode(case12["valid"]))
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    assert apply_warning_policy(1, "keep") is True
    assert apply_warning_policy(1, "skip") is False
    with pytest.raises(DecodeWarningError, match="key-7: 1 decoder warning"):
        apply_warning_policy(1, "raise", "key-7", dec.last_warning)
    with pytest.raises(ConfigError, match="'ignore' is not one of"):
        apply_warning_policy(1, "ignore")
    with pytest.raises(ConfigError, match="n_warnings must be an int >= 0"):
        apply_warning_policy(-1, "keep")


def test_case12_junk_pil_cannot_count(case12):
    """Pillow drops libjpeg warnings: the image is returned with 0 counted (documented)."""
    dec = get_decoder("pil")
    assert dec.decode(case12["junk"]).shape == (250, 333, 3) and dec.last_warnings == 0


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_case12_cut_at_70_percent(name, case12, capfd):
    """libjpeg-based decoders return the picture with a counted warning (grey fill below the
    cut); Pillow raises a DecodeError that names the truncation."""
    dec = _decoder_or_skip(name)
    if name == "pil":
        with pytest.raises(DecodeError, match="truncated"):
            dec.decode(case12["cut"])
    else:
        arr = dec.decode(case12["cut"])
        n, msg = dec.last_warnings, dec.last_warning
        assert arr.shape == (250, 333, 3) and n >= 1
        assert "end" in msg.lower()
        ok = dec.decode(case12["valid"])
        assert np.abs(arr[:100].astype(int) - ok[:100]).mean() < 1.0  # top part intact
        assert np.abs(arr[-20:].astype(int) - ok[-20:]).mean() > 5.0  # bottom is filler
        with pytest.raises(DecodeWarningError):
            apply_warning_policy(n, "raise", "cut.jpg", msg)
    assert capfd.readouterr().err == ""


def test_case12_scale_choice():
    assert Fraction(1, 3) not in DCT_REDUCTIONS
    assert set(FAST_DCT_REDUCTIONS) <= set(DCT_REDUCTIONS)
    # 333x250 crop to 100x100: 1/4 gives 83x62 (too small), so 1/2
    assert choose_scale(333, 250, 100, 100) == Fraction(1, 2)
    assert choose_scale(333, 250, 100, 100, FAST_DCT_REDUCTIONS) == Fraction(1, 2)
    assert choose_scale(333, 250, 40, 30) == Fraction(1, 8)          # 41.6 x 31.25
    assert choose_scale(333, 250, 120, 90) == Fraction(3, 8)         # 124.9 x 93.75
    assert choose_scale(333, 250, 120, 90, FAST_DCT_REDUCTIONS) == Fraction(1, 2)
    assert choose_scale(200, 150, 224, 224) == 1                     # never upscale by DCT
    with pytest.raises(ValueError, match="> 0"):
        choose_scale(0, 10, 5, 5)


@settings(max_examples=200, deadline=None)
@given(cw=st.integers(1, 4000), ch=st.integers(1, 4000), tw=st.integers(1, 600),
       th=st.integers(1, 600), fast=st.booleans())
def test_choose_scale_is_largest_sufficient_reduction(cw, ch, tw, th, fast):
    factors = FAST_DCT_REDUCTIONS if fast else DCT_REDUCTIONS
    f = choose_scale(cw, ch, tw, th, factors)
    assert f in factors
    if f < 1:
        assert cw * f >= tw and ch * f >= th
    assert not any(g < f and cw * g >= tw and ch * g >= th for g in factors)


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_case12_scaled_sizes_are_ceil_and_checked(name, case12, monkeypatch):
    dec = _decoder_or_skip(name)
    probe = dec.probe(case12["valid"])
    assert Fraction(1, 3) not in probe.factors
    with pytest.raises(DecodeError, match="1/3 not supported"):
        dec.decode_scaled(case12["valid"], Fraction(1, 3))
    want = {Fraction(1, 2): (167, 125), Fraction(1, 4): (84, 63), Fraction(1, 8): (42, 32)}
    for f, (w, h) in want.items():
        assert scaled_size(333, 250, f) == (w, h)
        assert dec.decode_scaled(case12["valid"], f).shape == (h, w, 3)
    # the check is real: a backend returning the wrong size is caught
    monkeypatch.setattr(type(dec), "_decode_scaled", lambda self, data, f: np.zeros((1, 1, 3),
                                                                                   np.uint8))
    with pytest.raises(DecodeError, match=r"expected \(125, 167, 3\)"):
        dec.decode_scaled(case12["valid"], Fraction(1, 2))


# ---------------------------------------------------------------- ROI exactness -------------

def _windows(w: int, h: int, rng: np.random.Generator, step: int = 16):
    """Edge windows, two with the left edge on a multiple of ``step`` (the scaled iMCU width, 16
    at full scale for 4:2:x) and an even width, then 12 random windows, as (x0, y0, x1, y1)."""
    yield 0, 0, w, h                       # whole image
    yield 0, 0, 1, h                       # 1 px wide, left edge
    yield w - 1, 0, w, h                   # 1 px wide, right edge
    yield 0, h - 1, w, h                   # 1 px high, bottom edge
    yield w - 1, h - 1, w, h               # bottom-right pixel
    # where cropped fancy upsampling would replicate chroma (see ROI_EDGE_CONTEXT)
    a, c = w // 3 // step * step, h // 2 // step * step
    yield a, 0, min(w, a + 2 * max(1, (w - a) // 4)), h
    yield a, c, min(w, a + 2), min(h, c + 3)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        yield x0, y0, int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))


def _roi_windows_exact(dec, data: bytes, factor: Fraction, rng: np.random.Generator) -> None:
    """Every window of :func:`_windows` decoded on its own equals the same window cut from the
    whole image decoded at ``factor``."""
    full = dec._run(data, (0, 0, 0, 0), factor)  # whole image at this scale
    assert full.shape[:2] == scaled_size(*dec.probe(data)[:2], factor)[::-1]
    h, w = full.shape[:2]
    for x0, y0, x1, y1 in _windows(w, h, rng, 2 * int(factor * 8)):  # iMCU of 4:2:x at M/8
        part = dec._run(data, (x0, y0, x1, y1), factor)
        assert np.array_equal(part, full[y0:y1, x0:x1]), (factor, (x0, y0, x1, y1))


def _reencode(path: Path, subsampling: int, progressive: bool = False) -> bytes:
    """``path`` saved again by Pillow at quality 90; ``subsampling``: Pillow's code, 0 = 4:4:4,
    1 = 4:2:2, 2 = 4:2:0."""
    buf = io.BytesIO()
    Image.open(path).save(buf, "JPEG", quality=90, subsampling=subsampling,
                          progressive=progressive)
    return buf.getvalue()


@pytest.mark.parametrize("fast", [(False, False), (True, True)], ids=["exact", "fast"])
@pytest.mark.parametrize("factor", DCT_REDUCTIONS)
def test_roi_equals_full_decode_then_crop(factor, fast, sample_dir):
    """Exact equality, also with fast IDCT + merged (non-fancy) upsampling (the sample photos
    are 4:4:4: chroma subsampling is the next test)."""
    _decoder_or_skip("roi")
    dec = get_decoder("roi", fast_dct=fast[0], fast_upsample=fast[1])
    rng = np.random.default_rng(int(factor * 8))
    for path in _flower_files(sample_dir, 5):
        _roi_windows_exact(dec, path.read_bytes(), factor, rng)


@pytest.mark.parametrize("sub, fast", [
    pytest.param(0, False, id="444-exact"), pytest.param(0, True, id="444-fast"),
    pytest.param(1, False, id="422-exact"), pytest.param(1, True, id="422-fast"),
    pytest.param(2, False, id="420-exact"), pytest.param(2, True, id="420-fast"),
])
def test_roi_exact_on_chroma_subsampled_jpegs(sub, fast, sample_dir):
    """Most JPEGs in the wild are 4:2:0, the flowers sample is all 4:4:4: two sample photos
    saved again by Pillow at each subsampling, every DCT scale, every window exact.

    Regression guard: with fancy upsampling (the default), jpeg_crop_scanline() makes
    libjpeg-turbo upsample chroma as if the crop were the whole image, so a window's first or
    last column differed from the full decode on 4:2:2 (scales > 1/8) and 4:2:0 (scale 1) by up
    to 36 levels, at an iMCU-aligned left edge or an even right edge (windows _windows()
    yields). _jpegroi.c decodes 1 more column on each side and cuts (ROI_EDGE_CONTEXT)."""
    _decoder_or_skip("roi")
    dec = get_decoder("roi", fast_dct=fast, fast_upsample=fast)
    for path in _flower_files(sample_dir, 2):
        data = _reencode(path, sub)
        assert Image.open(io.BytesIO(data)).layer[0][1:3] == ((1, 1), (2, 1), (2, 2))[sub]
        for factor in DCT_REDUCTIONS:
            _roi_windows_exact(dec, data, factor, np.random.default_rng(int(factor * 8)))


def test_roi_window_outside_image_is_an_error(case12):
    dec = _decoder_or_skip("roi")
    with pytest.raises(DecodeError, match="outside the 333x250"):
        dec.decode_region(case12["valid"], (300, 0, 334, 10), Fraction(1))
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(DecodeError, match="1/3 is not one of"):
        dec.decode_resize(case12["valid"], (0, 0, 10, 10), Fraction(1, 3), (0, 0, 10, 10), out)
    with pytest.raises(DecodeError, match="1/3 is not one of"):
        dec.decode_region(case12["valid"], (0, 0, 10, 10), Fraction(1, 3))


@pytest.mark.parametrize("name", ALL_DECODERS)
def test_progressive_full_decode_matches_pillow(name, made_awkward_dir):
    dec = _decoder_or_skip(name)
    data = (made_awkward_dir / "progressive_photo.jpg").read_bytes()
    assert Image.open(io.BytesIO(data)).info.get("progressive")  # really a progressive file
    arr = dec.decode(data)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert arr.shape == ref.shape == (150, 200, 3) and dec.last_warnings == 0
    bound = NVJPEG_SUBSAMPLED_BOUND if name == "nvjpeg" else PIL_MEAN_ABS_BOUND  # 4:2:0 file
    assert np.abs(arr.astype(np.int16) - ref).mean() <= bound


def test_progressive_roi_matches_full(made_awkward_dir):
    """The made progressive file is 4:2:0 (Pillow's default subsampling), decoded with fancy
    upsampling: windows at iMCU-aligned edges included."""
    dec = _decoder_or_skip("roi")
    data = (made_awkward_dir / "progressive_photo.jpg").read_bytes()
    full = dec.decode(data)
    for x0, y0, x1, y1 in [(101, 57, 199, 149), *_windows(200, 150, np.random.default_rng(5))]:
        assert np.array_equal(dec.decode_region(data, (x0, y0, x1, y1), Fraction(1)),
                              full[y0:y1, x0:x1]), (x0, y0, x1, y1)


# ---------------------------------------------------------------- resize --------------------

@pytest.mark.parametrize("interp", ["bilinear", "bicubic", "box", "nearest"])
def test_resize_into_matches_pillow(interp, sample_dir):
    rng = np.random.default_rng(1)
    code = {"bilinear": 2, "bicubic": 3, "box": 4, "nearest": 0}[interp]
    for path in _flower_files(sample_dir, 8):
        img = Image.open(path).convert("RGB")
        src = np.asarray(img)
        h, w = src.shape[:2]
        for _ in range(6):
            x0, y0 = rng.uniform(0, w / 2), rng.uniform(0, h / 2)
            box = (x0, y0, rng.uniform(x0 + 1, w), rng.uniform(y0 + 1, h))
            ow, oh = int(rng.integers(1, 300)), int(rng.integers(1, 300))
            flip = bool(rng.random() < 0.5)
            out = resize_into(src, box, np.empty((oh, ow, 3), np.uint8), flip, interp)
            ref = np.asarray(img.resize((ow, oh), code, box=box))
            ref = ref[:, ::-1] if flip else ref
            if STOCK_PILLOW:
                assert np.array_equal(out, ref), (path.name, box, ow, oh, flip)
            else:
                assert np.abs(out.astype(int) - ref).mean() < 1.0


def test_resize_rejects_bad_box():
    src = np.zeros((10, 10, 3), np.uint8)
    with pytest.raises(ValueError, match="box"):
        resize_into(src, (0, 0, 11, 10), np.empty((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="interpolation 'lanczos'"):
        resize_into(src, (0, 0, 10, 10), np.empty((4, 4, 3), np.uint8), interpolation="lanczos")


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_decode_resize_equals_region_then_resize(name, sample_dir):
    dec = _decoder_or_skip(name)
    path = _flower_files(sample_dir, 3)[1]
    data = path.read_bytes()
    region, box = (13, 21, 180, 150), (0.5, 1.25, 166.0, 128.5)
    fused = dec.decode_resize(data, region, Fraction(1), box, np.empty((64, 80, 3), np.uint8),
                              True)
    arr = dec.decode_region(data, region, Fraction(1))
    ref = resize_into(arr, box, np.empty((64, 80, 3), np.uint8), True)
    assert np.array_equal(fused, ref)


@pytest.mark.parametrize("sub", [1, 2], ids=["422", "420"])
def test_roi_fused_resize_exact_on_chroma_subsampled_jpegs(sub, sample_dir):
    """The fused crop + resize (the train transform's path) reads the same window pixels as a
    full decode on 4:2:2 / 4:2:0 with fancy upsampling: equal to resize_into() of the window cut
    from the full decode, at scales 1 and 1/2, edge, iMCU-aligned and random windows."""
    dec = _decoder_or_skip("roi")
    rng = np.random.default_rng(sub)
    for path in _flower_files(sample_dir, 2):
        data = _reencode(path, sub)
        for factor in (Fraction(1), Fraction(1, 2)):
            full = dec.decode_scaled(data, factor)
            for x0, y0, x1, y1 in _windows(full.shape[1], full.shape[0], rng, int(factor * 16)):
                rw, rh = x1 - x0, y1 - y0
                box = (rw * rng.uniform(0, 0.25), rh * rng.uniform(0, 0.25),
                       rw * rng.uniform(0.75, 1), rh * rng.uniform(0.75, 1))
                flip = bool(rng.random() < 0.5)
                fused = dec.decode_resize(data, (x0, y0, x1, y1), factor, box,
                                          np.empty((24, 32, 3), np.uint8), flip)
                ref = resize_into(np.ascontiguousarray(full[y0:y1, x0:x1]), box,
                                  np.empty((24, 32, 3), np.uint8), flip)
                assert np.array_equal(fused, ref), (path.name, factor, (x0, y0, x1, y1), box)


# ---------------------------------------------------------------- pixel limit ---------------

def _png_header_bomb(width: int, height: int) -> bytes:
    """A real, valid 1-bit black PNG of width x height: tiny on disk (zlib), width*height/8
    bytes while decoding row by row, and 3 * width * height bytes as RGB."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))
    raw = bytes((width // 8 + 1) * height)  # filter byte 0 + packed row, all black
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("name", CPU_DECODERS)
def test_one_pixel_limit_at_pack_and_read(name, monkeypatch, tmp_path, case12):
    """Pack and read use the same limit and never Pillow's global: with Pillow's global cut to
    1000 pixels (Image.open would refuse these images), an image exactly at the limit packs
    AND decodes, one pixel over is refused on both sides."""
    _decoder_or_skip(name)
    png_path = tmp_path / "wide.png"
    png_path.write_bytes(_png_header_bomb(3000, 2000))  # 6 Mpx, 18 MB as RGB, 1 KB on disk
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(Image.DecompressionBombError):
        Image.open(png_path)
    for data, (w, h) in ((png_path.read_bytes(), (3000, 2000)), (case12["valid"], (333, 250))):
        limit = w * h
        assert check_image(data, max_pixels=limit).ok
        arr = get_decoder(name, max_pixels=limit).decode(data)
        assert arr.shape == (h, w, 3)
        assert check_image(data, max_pixels=limit - 1).reason.startswith("over --max-pixels")
        with pytest.raises(PixelLimitError,
                           match=f"{w}x{h} = {limit} pixels .*max_pixels={limit - 1} "):
            get_decoder(name, max_pixels=limit - 1).decode(data)
    assert Image.MAX_IMAGE_PIXELS == 1000  # nothing reset it behind our back


def test_default_limit_refuses_before_decoding():
    """200 Mpx declared (600 MB as RGB, 25 KB on disk): refused from the header by every
    decoder under the default limit (Pillow's value, 89,478,485), without allocating."""
    bomb = _png_header_bomb(20000, 10000)
    for name in CPU_DECODERS:
        dec = _decoder_or_skip(name)
        assert dec.max_pixels == 89_478_485
        with pytest.raises(PixelLimitError, match="20000x10000 = 200000000 pixels"):
            dec.decode(bomb)
    with pytest.raises(ConfigError, match="max_pixels must be a positive int, got 0"):
        get_decoder("pil", max_pixels=0)
