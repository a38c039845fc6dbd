"""shardkit.images.normalize on real files: awkward files, flowers photos, field cases 12, 14 and 15.

Everything that one real photo can show runs on ``examples/flowers-sample`` and on the awkward
files Pillow makes from it (``made_awkward_dir``, see conftest), so it runs everywhere. Only the
checks that need the exact 27 files of ``../shared/data/awkward`` use ``awkward_dir`` (skipped
when that folder is absent).
"""
from __future__ import annotations

import csv
import io
import random
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps, features

from conftest import (AWKWARD, MADE_ALPHA, MADE_AWKWARD, SAMPLE_PHOTO_SIZE, made_deep,
                      made_photo, png_chunk)
from shardkit.errors import ConfigError, DecodeError
from shardkit.images.normalize import (
    DEFAULT_MAX_PIXELS, RULES, check_image, decode_reference, sniff)

SOURCES = {"made": "made_awkward_dir", "shared": "awkward_dir"}


def _rows() -> list:
    """(source, EXPECTED.csv row) for the made files, then for the shared ones when present."""
    made = [pytest.param("made", dict(zip(["file", "expect", "upright_size", "what"], r)),
                         id=f"made/{r[0]}") for r in MADE_AWKWARD]
    path = AWKWARD / "EXPECTED.csv"
    if not path.exists():
        return made + [pytest.param("shared", None, id="shared", marks=pytest.mark.skip(
            reason=f"real data not found: {path}"))]
    with open(path, newline="") as f:
        return made + [pytest.param("shared", r, id=f"shared/{r['file']}")
                       for r in csv.DictReader(f)]


# The exact decision for every awkward file: rule when accepted, reason prefix when rejected.
RULE = {
    "corrupt_scan_data.jpg": "original",  # "either": accepted, warning recorded (strict rejects)
    "junk_bytes_after_comment.jpg": "original",
    "cmyk_adobe.jpg": "cmyk-to-rgb+png",
    "grayscale.jpg": "original",
    "bad_exif_gray.jpg": "original",
    "progressive_photo.jpg": "original",
    "adobe_rgb_icc_large_xmp.jpg": "original",
    "exif_orientation_6.jpg": "exif-transpose+png",
    "png_exif_orientation_3.png": "exif-transpose+png",
    "png_16bit_rgb_icc.png": "16bit-to-8bit+png",
    "png_palette_trns.png": "alpha-over-white+png",
    "png_rgba.png": "alpha-over-white+png",
    "png_gray_alpha_LA.png": "alpha-over-white+png",
    "png_disguised_as.jpg": "png",
    "jpeg_disguised_as.png": "original",
    "webp_lossy.webp": "png",
    "webp_alpha.webp": "alpha-over-white+png",
    "gif_animated.gif": "first-frame+to-rgb+png",
    "tiff_rgb.tif": "png",
    "tiff_16bit_rgb.tiff": "16bit-to-8bit+png",
    "tiff_16bit_gray.tiff": "16bit-to-8bit+to-rgb+png",  # made only
    "tiff_multipage.tiff": "first-frame+to-rgb+png",
    "avif.avif": "png",  # "either": accepted when Pillow has the AVIF codec
}
REASON = {
    "truncated_progressive.jpg": "truncated JPEG: Premature end of JPEG file (libjpeg-turbo)",
    "truncated_half_photo.jpg": "truncated JPEG: Premature end of JPEG file (libjpeg-turbo)",
    "corrupt_header.png": "corrupt PNG header: SyntaxError: broken PNG file",
    "zero_bytes.jpg": "empty file (0 bytes)",
    # "either": rejected at the default limit (accepted under an explicit one, tested below)
    "huge_10000x10000_gray.png": "over --max-pixels: 10000x10000 = 100000000 > 89478485",
}
MEDIA = {".jpg": "jpeg", ".png": "png", ".webp": "webp", ".gif": "gif", ".tif": "tiff",
         ".tiff": "tiff", ".avif": "avif"}
SNIFF_EXCEPTIONS = {"png_disguised_as.jpg": "png", "jpeg_disguised_as.png": "jpeg",
                    "zero_bytes.jpg": "unknown"}


def _size(text: str) -> tuple[int, int]:
    w, h = text.split("x")
    return int(w), int(h)


def _check_quietly(data: bytes, **kw):
    """check_image with every warning turned into an error: none may escape."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return check_image(data, **kw)


def _pillow_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


@pytest.mark.parametrize("source, row", _rows())
def test_awkward_file_decision(source, row, request, capfd):
    data = (request.getfixturevalue(SOURCES[source]) / row["file"]).read_bytes()
    result = _check_quietly(data)
    name = row["file"]
    assert result.media == SNIFF_EXCEPTIONS.get(name, MEDIA[Path(name).suffix])
    if name == "avif.avif" and not features.check("avif"):
        assert not result.ok and "AVIF" in result.reason
    elif name in REASON:
        assert row["expect"] in ("reject", "either")
        assert not result.ok
        assert result.reason.startswith(REASON[name]), result.reason
        assert result.data == b"" and result.rule == ""
    else:
        assert row["expect"] in ("accept", "either")
        assert result.ok, result.reason
        assert result.reason is None
        assert result.rule == RULE[name]
        assert (result.width, result.height) == _size(row["upright_size"])
        assert result.ext == ("jpg" if result.rule == "original" else "png")
        assert sniff(result.data) == ("jpeg" if result.ext == "jpg" else "png")
        pixels = decode_reference(result.data)
        assert pixels.dtype == np.uint8 and pixels.flags.c_contiguous
        assert pixels.shape == (result.height, result.width, 3)
        if result.rule == "original":
            assert result.data == data
        if result.rule == "png":  # a plain re-encode is lossless
            np.testing.assert_array_equal(pixels, _pillow_rgb(data))
    assert capfd.readouterr().err == ""


def test_every_rule_is_documented():
    used = {step for name in RULE for step in RULE[name].split("+")}
    assert used <= set(RULES)
    assert all(isinstance(v, str) and len(v) > 20 for v in RULES.values())


def test_junk_bytes_warn_once_and_strict_rejects(made_awkward_dir):
    data = (made_awkward_dir / "junk_bytes_after_comment.jpg").read_bytes()
    normal = _check_quietly(data)
    assert normal.ok and normal.rule == "original" and normal.data == data
    # the same 5 junk bytes sit before both DQT markers: one message, recorded once
    assert normal.warnings == ("libjpeg-turbo: Corrupt JPEG data: 5 extraneous bytes before "
                               "marker 0xdb",)
    strict = _check_quietly(data, strict=True)
    assert not strict.ok
    assert strict.reason == ("JPEG decodes only with warnings (strict): libjpeg-turbo: Corrupt "
                             "JPEG data: 5 extraneous bytes before marker 0xdb")
    clean = (made_awkward_dir / "progressive_photo.jpg").read_bytes()
    assert _check_quietly(clean, strict=True).ok


def test_corrupt_exif_block_is_a_recorded_warning(flower_rgb):
    """A grayscale JPEG whose EXIF IFD claims one entry and holds 2 of its 12 bytes."""
    buf = io.BytesIO()
    Image.fromarray(flower_rgb).convert("L").save(
        buf, "JPEG", quality=90, exif=b"Exif\x00\x00II*\x00\x08\x00\x00\x00\x01\x00\x12\x01")
    data = buf.getvalue()
    result = _check_quietly(data)
    assert result.ok and result.rule == "original" and result.data == data
    assert result.warnings == ("pillow: Corrupt EXIF data.  Expecting to read 12 bytes but only "
                               "got 2. ",)
    assert not _check_quietly(data, strict=True).ok


def test_shared_files_warnings_exact(awkward_dir):
    """Real camera files: scan data overwritten, junk after a COM segment, corrupt EXIF."""
    data = (awkward_dir / "corrupt_scan_data.jpg").read_bytes()
    normal = _check_quietly(data)
    assert normal.ok and normal.rule == "original" and normal.data == data
    assert normal.warnings == ("libjpeg-turbo: Corrupt JPEG data: 19 extraneous bytes before "
                               "marker 0xd9",)
    assert _check_quietly(data, strict=True).reason == (
        "JPEG decodes only with warnings (strict): libjpeg-turbo: Corrupt JPEG data: 19 "
        "extraneous bytes before marker 0xd9")
    junk = _check_quietly((awkward_dir / "junk_bytes_after_comment.jpg").read_bytes())
    assert junk.warnings == ("libjpeg-turbo: Corrupt JPEG data: 5 extraneous bytes before "
                             "marker 0xdb",)
    gray = _check_quietly((awkward_dir / "bad_exif_gray.jpg").read_bytes())
    assert gray.warnings[0] == ("libjpeg-turbo: Corrupt JPEG data: 1214 extraneous bytes before "
                                "marker 0xd0")
    assert gray.warnings[1].startswith("pillow: Corrupt EXIF data")


def test_huge_jpeg_rejected_by_default_and_accepted_under_explicit_limit():
    """Field case 15's repro: a solid-colour 100-MP JPEG, small on disk."""
    buf = io.BytesIO()
    Image.new("L", (10000, 10000), 90).save(buf, "JPEG", quality=50)
    data = buf.getvalue()
    assert len(data) < 2_000_000
    assert _check_quietly(data).reason == "over --max-pixels: 10000x10000 = 100000000 > 89478485"
    assert _check_quietly(data, max_pixels=10**8 - 1).reason == (
        "over --max-pixels: 10000x10000 = 100000000 > 99999999")
    result = _check_quietly(data, max_pixels=10**8 + 1)
    assert result.ok and result.rule == "original" and result.data == data
    assert (result.width, result.height) == (10000, 10000)
    assert Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS


# Orientation -> the upright pixels, written out by hand (EXIF 2.3, tag 0x0112).
UPRIGHT = {
    2: lambda a: a[:, ::-1],                        # mirrored left-right
    3: lambda a: a[::-1, ::-1],                     # rotated 180
    4: lambda a: a[::-1],                           # mirrored top-bottom
    5: lambda a: a.transpose(1, 0, 2),              # transposed
    6: lambda a: np.rot90(a, k=-1),                 # rotated 90 clockwise
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # transversed
    8: lambda a: np.rot90(a, k=1),                  # rotated 90 counter-clockwise
}


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_every_exif_orientation_is_stored_upright(orientation):
    raw = made_photo()
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(raw).save(buf, "PNG", exif=exif.tobytes())
    result = _check_quietly(buf.getvalue())
    assert result.ok and result.rule == "exif-transpose+png"
    assert (result.width, result.height) == ((150, 200) if orientation >= 5 else (200, 150))
    stored = decode_reference(result.data)
    np.testing.assert_array_equal(stored, UPRIGHT[orientation](raw))
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        np.testing.assert_array_equal(stored, np.asarray(ImageOps.exif_transpose(im)))


def test_made_exif_files_upright(made_awkward_dir):
    data = (made_awkward_dir / "exif_orientation_6.jpg").read_bytes()
    raw = _pillow_rgb(data)  # Pillow does not rotate on its own
    assert raw.shape == (150, 200, 3)
    np.testing.assert_array_equal(decode_reference(_check_quietly(data).data), np.rot90(raw, k=-1))
    png = (made_awkward_dir / "png_exif_orientation_3.png").read_bytes()
    stored = decode_reference(_check_quietly(png).data)
    np.testing.assert_array_equal(stored, made_photo()[::-1, ::-1])


def test_cmyk_jpeg_matches_pillow_and_is_not_inverted(made_awkward_dir):
    data = (made_awkward_dir / "cmyk_adobe.jpg").read_bytes()
    assert b"Adobe" in data[:200]  # APP14: Adobe-inverted CMYK
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "CMYK"
    stored = decode_reference(_check_quietly(data).data)
    np.testing.assert_array_equal(stored, _pillow_rgb(data))
    # close to the RGB photo it was made from (JPEG loss only); an inversion bug is far off
    diff = np.abs(stored.astype(np.int16) - made_photo().astype(np.int16))
    assert diff.mean() < 2.0
    assert np.abs(255 - stored.astype(np.int16) - made_photo()).mean() > 50


def test_grayscale_jpeg_stays_original_and_expands_to_rgb(made_awkward_dir):
    data = (made_awkward_dir / "grayscale.jpg").read_bytes()
    result = _check_quietly(data)
    assert result.ok and result.rule == "original" and result.data == data
    pixels = decode_reference(result.data)
    assert pixels.shape == (150, 200, 3)
    np.testing.assert_array_equal(pixels[..., 0], pixels[..., 1])
    np.testing.assert_array_equal(pixels[..., 0], pixels[..., 2])
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "L"
        np.testing.assert_array_equal(pixels[..., 0], np.asarray(im))


def test_png_16bit_rgb_scaled_by_high_byte(made_awkward_dir):
    data = (made_awkward_dir / "png_16bit_rgb_icc.png").read_bytes()
    result = _check_quietly(data)
    assert result.icc  # ICC noted, not applied
    stored = decode_reference(result.data)
    np.testing.assert_array_equal(stored, (made_deep(made_photo()) >> 8).astype(np.uint8))
    np.testing.assert_array_equal(stored, _pillow_rgb(data))  # Pillow also keeps the high byte


def test_sixteen_bit_tiff_gray(made_awkward_dir):
    data = (made_awkward_dir / "tiff_16bit_gray.tiff").read_bytes()
    stored = decode_reference(_check_quietly(data).data)
    gray = np.asarray(Image.fromarray(made_photo()).convert("L"))
    for c in range(3):
        np.testing.assert_array_equal(stored[..., c], gray)  # (v * 257) >> 8 == v


# ---- fixtures made from real flower photos (field cases 12, 14, 15) -------------------------

@pytest.fixture(scope="module")
def flower_jpeg(sample_photo) -> bytes:
    return sample_photo.read_bytes()


@pytest.fixture(scope="module")
def flower_rgb(flower_jpeg) -> np.ndarray:
    with Image.open(io.BytesIO(flower_jpeg)) as im:
        return np.asarray(im.convert("RGB"))


def _png(arr: np.ndarray, mode: str | None = None, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, mode).save(buf, "PNG", **save) if mode else Image.fromarray(arr).save(
        buf, "PNG", **save)
    return buf.getvalue()


def test_flower_jpeg_is_byte_identical(flower_jpeg):
    result = _check_quietly(flower_jpeg)
    assert (result.ok, result.rule, result.ext, result.warnings) == (True, "original", "jpg", ())
    assert result.data == flower_jpeg and (result.width, result.height) == SAMPLE_PHOTO_SIZE


def test_flowers_sample_all_original(sample_dir):
    """All 200 sample photos stay byte-identical, with sizes and ICC flags as metadata.csv says."""
    with open(sample_dir / "metadata.csv", newline="") as f:
        meta = {r["path"]: r for r in csv.DictReader(f)}
    files = sorted(sample_dir.rglob("*.jpg"))
    assert len(files) == len(meta) == 200
    results = [_check_quietly(p.read_bytes()) for p in files]
    assert [r.rule for r in results] == ["original"] * len(files)
    assert all(r.data == p.read_bytes() and r.warnings == () for r, p in zip(results, files))
    rows = [meta[p.relative_to(sample_dir).as_posix()] for p in files]
    assert [(r.width, r.height) for r in results] == [(int(m["width"]), int(m["height"]))
                                                      for m in rows]
    assert [r.icc for r in results] == [m["has_icc"] == "1" for m in rows]
    assert 0 < sum(r.icc for r in results) < len(files)  # both kinds are in the sample


def test_case14_truncated_jpeg_at_60_percent(tmp_path, flower_jpeg):
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(flower_jpeg[: int(len(flower_jpeg) * 0.6)])
    result = _check_quietly(cut.read_bytes())
    assert not result.ok
    assert result.reason == "truncated JPEG: Premature end of JPEG file (libjpeg-turbo)"
    assert (result.width, result.height) == SAMPLE_PHOTO_SIZE  # header was readable
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_case14_zero_byte_jpg(tmp_path):
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    result = _check_quietly(empty.read_bytes())
    assert (result.ok, result.reason, result.media) == (False, "empty file (0 bytes)", "unknown")


def test_case14_truncated_png(flower_rgb):
    data = _png(flower_rgb)
    result = _check_quietly(data[: int(len(data) * 0.6)])
    assert not result.ok
    assert result.reason == ("truncated PNG: Pillow cannot decode it: OSError: image file is "
                             "truncated")
    assert _check_quietly(data).ok


def test_case14_not_an_image():
    result = _check_quietly(b"Creative Commons Attribution 2.0\n" * 10)
    assert (result.ok, result.reason) == (False, "not an image (sniffed: unknown)")


def test_case15_jpeg_orientation_6_written_with_pillow(flower_rgb):
    raw = np.ascontiguousarray(flower_rgb[:100, :200])
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(raw).save(buf, "JPEG", quality=95, exif=exif.tobytes())
    result = _check_quietly(buf.getvalue())
    assert result.ok and result.rule == "exif-transpose+png"
    assert (result.width, result.height) == (100, 200)
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        decoded = np.asarray(im.convert("RGB"))
    np.testing.assert_array_equal(decode_reference(result.data), np.rot90(decoded, k=-1))


def test_case15_palette_png_with_trns(flower_rgb):
    pal = Image.fromarray(flower_rgb).quantize(16)
    idx = np.asarray(pal)
    buf = io.BytesIO()
    pal.save(buf, "PNG", transparency=bytes([0] + [255] * 15))  # index 0 fully transparent
    result = _check_quietly(buf.getvalue())
    assert result.ok and result.rule == "alpha-over-white+png"
    out = decode_reference(result.data)
    palette = np.array(pal.getpalette()[:48], dtype=np.uint8).reshape(16, 3)
    assert (idx == 0).any() and (idx != 0).any()
    np.testing.assert_array_equal(out[idx == 0], 255)
    np.testing.assert_array_equal(out[idx != 0], palette[idx[idx != 0]])


def _over_white(color: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha.astype(np.float64)[..., None] / 255.0
    return color.astype(np.float64) * a + 255.0 * (1.0 - a)


def test_case15_rgba_and_la_composited_on_white(flower_rgb):
    h, w, _ = flower_rgb.shape
    alpha = np.tile(np.linspace(0, 255, w).astype(np.uint8), (h, 1))
    rgba = np.dstack([flower_rgb, alpha])
    out = decode_reference(_check_quietly(_png(rgba)).data).astype(np.float64)
    assert np.abs(out - _over_white(flower_rgb, alpha)).max() <= 1.0
    np.testing.assert_array_equal(out[:, 0], 255)  # alpha 0 -> pure background
    np.testing.assert_array_equal(out[:, -1], flower_rgb[:, -1])  # alpha 255 -> colour kept
    gray = np.asarray(Image.fromarray(flower_rgb).convert("L"))
    la = _check_quietly(_png(np.dstack([gray, alpha]), "LA"))
    assert la.rule == "alpha-over-white+png"
    out = decode_reference(la.data).astype(np.float64)
    assert np.abs(out - _over_white(np.dstack([gray] * 3), alpha)).max() <= 1.0


def test_case15_sixteen_bit_gray_png(flower_rgb):
    gray = np.asarray(Image.fromarray(flower_rgb).convert("L")).astype(np.uint16)
    deep = gray * 257 + (np.arange(gray.size, dtype=np.uint16).reshape(gray.shape) % 200)
    result = _check_quietly(_png(deep))
    assert result.ok and result.rule == "16bit-to-8bit+to-rgb+png"
    out = decode_reference(result.data)
    expected = (deep >> 8).astype(np.uint8)
    for c in range(3):
        np.testing.assert_array_equal(out[..., c], expected)


def _patch_sof_size(jpeg: bytes, width: int, height: int) -> bytes:
    """Rewrite the frame header (SOF0/SOF2) size of a JPEG, leaving the scan data as it is."""
    i = 2
    while i < len(jpeg):
        marker, length = jpeg[i + 1], struct.unpack(">H", jpeg[i + 2:i + 4])[0]
        if marker in (0xC0, 0xC2):
            return jpeg[:i + 5] + struct.pack(">HH", height, width) + jpeg[i + 9:]
        i += 2 + length
    raise ValueError("no SOF marker")


def test_case15_pixel_limit_checked_before_decoding(flower_jpeg):
    bomb = _patch_sof_size(flower_jpeg, 10000, 10000)  # 100 MP header, 27 KB of data
    result = _check_quietly(bomb)
    assert result.reason == "over --max-pixels: 10000x10000 = 100000000 > 89478485"
    assert (result.width, result.height) == (10000, 10000)
    small = _check_quietly(flower_jpeg, max_pixels=320 * 244 - 1)
    assert small.reason == "over --max-pixels: 320x244 = 78080 > 78079"
    assert _check_quietly(flower_jpeg, max_pixels=320 * 244).ok
    assert Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS == 89_478_485


def test_case12_rgb_never_bgr(flower_jpeg, flower_rgb):
    from turbojpeg import TJPF_RGB, TurboJPEG

    red = np.zeros((32, 48, 3), np.uint8)
    red[..., 0] = 255
    buf = io.BytesIO()
    Image.fromarray(red).save(buf, "JPEG", quality=95)
    for data in (buf.getvalue(), _png(np.dstack([red, np.full((32, 48), 255, np.uint8)]))):
        result = _check_quietly(data)
        out = decode_reference(result.data)
        assert out[..., 0].min() > 240 and out[..., 2].max() < 15
    turbo = TurboJPEG().decode(flower_jpeg, pixel_format=TJPF_RGB).astype(np.int16)
    ref = decode_reference(flower_jpeg).astype(np.int16)
    assert ref.shape == turbo.shape == (244, 320, 3)
    assert np.abs(ref - turbo).mean() < 1.0  # same colour order, IDCT rounding only
    assert np.abs(ref - turbo[..., ::-1]).mean() > 10.0


def test_sniff_magic_bytes():
    assert sniff(b"\xff\xd8\xff\xe0" + b"\0" * 20) == "jpeg"
    assert sniff(b"GIF87a" + b"\0" * 10) == "gif"
    assert sniff(b"RIFF\0\0\0\0WEBPVP8 ") == "webp"
    assert sniff(b"MM\x00*\0\0\0\x08") == "tiff"
    assert sniff(b"BM" + b"\0" * 12 + struct.pack("<I", 40) + b"\0" * 30) == "bmp"
    assert sniff(b"BM hello world, not a bitmap") == "unknown"
    assert sniff(b"\0\0\0\x18ftypheic\0\0\0\0mif1heic") == "heif"
    assert sniff(b"\0\0\0\x1cftypmif1\0\0\0\0mif1avifmiaf") == "avif"
    assert sniff(b"\0\0\0\x18ftypisom\0\0\0\0isomiso2") == "unknown"  # MP4 video
    assert sniff(b"") == "unknown"


def test_heif_rejected_naming_codec():
    result = _check_quietly(b"\0\0\0\x18ftypheic\0\0\0\0mif1heic" + b"\0" * 64)
    assert not result.ok and result.media == "heif" and "HEIF" in result.reason


def test_bad_arguments_raise_config_error(flower_jpeg):
    with pytest.raises(ConfigError, match="max_pixels must be a positive int, got 0"):
        check_image(flower_jpeg, max_pixels=0)
    with pytest.raises(ConfigError, match="got str"):
        check_image("daisy.jpg")
    with pytest.raises(DecodeError, match="sniffed: unknown"):
        decode_reference(b"not an image")


@pytest.mark.parametrize("source", ["made", "shared"])
def test_no_warning_escapes(source, request, recwarn):
    folder = request.getfixturevalue(SOURCES[source])
    files = [p for p in sorted(folder.iterdir()) if p.suffix != ".csv" and p.is_file()]
    assert len(files) >= len(MADE_AWKWARD)
    for path in files:
        check_image(path.read_bytes())
        check_image(path.read_bytes(), strict=True)
    assert [str(w.message) for w in recwarn] == []


@pytest.mark.parametrize("name", ["webp_lossy.webp", "tiff_rgb.tif", "png_disguised_as.jpg",
                                  "avif.avif"])
def test_reencoded_png_is_lossless(made_awkward_dir, name):
    if name == "avif.avif" and not features.check("avif"):
        pytest.skip("this Pillow has no AVIF codec (the rejection is tested above)")
    data = (made_awkward_dir / name).read_bytes()
    result = _check_quietly(data)
    assert result.rule == "png"
    np.testing.assert_array_equal(decode_reference(result.data), _pillow_rgb(data))
    if name != "png_disguised_as.jpg":  # lossy codecs: near the photo, not equal to it
        diff = np.abs(decode_reference(result.data).astype(np.int16) - made_photo())
        assert diff.mean() < (0.01 if name == "tiff_rgb.tif" else 8.0)
    else:
        np.testing.assert_array_equal(decode_reference(result.data), made_photo())


def test_animated_gif_with_transparency_first_frame(flower_rgb):
    frames = [Image.fromarray(flower_rgb).quantize(8),
              Image.fromarray(np.ascontiguousarray(flower_rgb[::-1])).quantize(8)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], transparency=0,
                   duration=100, disposal=2)
    result = _check_quietly(buf.getvalue())
    assert result.rule == "first-frame+alpha-over-white+png"
    out = decode_reference(result.data)
    idx = np.asarray(frames[0])
    palette = np.array(frames[0].getpalette()[:24], dtype=np.uint8).reshape(8, 3)
    np.testing.assert_array_equal(out[idx == 0], 255)
    np.testing.assert_array_equal(out[idx != 0], palette[idx[idx != 0]])


def test_webp_alpha_composited_on_white(made_awkward_dir):
    result = _check_quietly((made_awkward_dir / "webp_alpha.webp").read_bytes())
    assert result.rule == "alpha-over-white+png"
    out = decode_reference(result.data).astype(np.float64)
    np.testing.assert_array_equal(out[:, 0], 255)  # alpha 0 -> pure background
    assert np.abs(out - _over_white(made_photo(), MADE_ALPHA)).mean() < 4.0  # lossy colour


def test_header_over_twice_pillows_limit_gets_our_reason():
    """Image.open would raise DecompressionBombError here; check_image reports its own limit."""
    width, height = 20000, 10000  # 200 MP, 1-bit gray, all black: 25 KB on disk
    raw = bytes((width // 8 + 1) * height)
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    png = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header)
           + png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b""))
    with pytest.raises(Image.DecompressionBombError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Image.open(io.BytesIO(png))
    result = _check_quietly(png)
    assert result.reason == "over --max-pixels: 20000x10000 = 200000000 > 89478485"
    assert Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS


def test_sixteen_bit_colour_key_becomes_white(flower_rgb):
    gray = np.asarray(Image.fromarray(flower_rgb).convert("L")).astype(np.uint16) * 257
    gray[:10] = 4242  # the transparent colour key
    buf = io.BytesIO()
    Image.fromarray(gray).save(buf, "PNG", transparency=4242)
    result = _check_quietly(buf.getvalue())
    assert result.rule == "16bit-to-8bit+alpha-over-white+png"
    out = decode_reference(result.data)
    np.testing.assert_array_equal(out[:10], 255)
    np.testing.assert_array_equal(out[10:, :, 1], (gray[10:] >> 8).astype(np.uint8))


def test_global_load_truncated_flag_is_refused(monkeypatch, flower_jpeg):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ConfigError, match="LOAD_TRUNCATED_IMAGES is True"):
        check_image(flower_jpeg)


DAMAGED = ["progressive_photo.jpg", "png_palette_trns.png", "gif_animated.gif",
           "tiff_multipage.tiff", "webp_alpha.webp", "cmyk_adobe.jpg"]


def _damage_never_raises(name: str, data: bytes) -> None:
    """Cut or bit-flipped copies are accepted or rejected with a reason; nothing escapes."""
    rng = random.Random(name)
    outcomes = []
    for k in range(24):
        damaged = bytearray(data)
        if k % 2:
            damaged = damaged[: rng.randrange(1, len(damaged))]
        else:
            for _ in range(rng.randrange(1, 8)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        result = _check_quietly(bytes(damaged))
        assert result.ok == (result.reason is None) and result.ok == bool(result.data)
        outcomes.append(result.ok)
    assert not all(outcomes), name  # cutting a file somewhere must get it rejected at least once


@pytest.mark.parametrize("name", DAMAGED)
def test_damaged_files_never_raise(made_awkward_dir, name):
    _damage_never_raises(name, (made_awkward_dir / name).read_bytes())


def test_damaged_shared_files_never_raise(awkward_dir):
    for name in DAMAGED:
        _damage_never_raises(name, (awkward_dir / name).read_bytes())
