"""Stored resolution: ``shardkit pack --max-side N [--jpeg-quality Q]``.

Real photos from the embedded sample (longer sides 240-500 px, so ``--max-side 320`` downscales
some and keeps others), and camera-size JPEGs made by upscaling one of them to 4000 px (there are
no real camera-size photos in the test data).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, JpegImagePlugin

from shardkit.images import normalize as images
from shardkit.cli import main
from shardkit.doctor.check import check_dataset, format_check_report
from shardkit.doctor.reading import decode_rgb, iter_sample_bytes
from shardkit.doctor.stats import compute_stats
from shardkit.errors import ConfigError
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.images.neardup import PHASH_THRESHOLD, phash64
from shardkit.doctor.verify import verify

from conftest import SAMPLE, SAMPLE_PHOTO

MAX_SIDE = 320


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0 ** 2 / mse))


def reference(data: bytes, size: tuple[int, int]) -> np.ndarray:
    """Pillow's decode of the source resized to ``size`` with exact Lanczos (no reducing gap)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB").resize(size, Image.Resampling.LANCZOS))


def quant_tables(quality: int) -> dict:
    """Pillow's quantisation tables for ``quality`` (they depend on the quality only)."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 120, 30)).save(buf, "JPEG", quality=quality, subsampling=0)
    return Image.open(buf).quantization


def camera_size(orientation: int = 1) -> bytes:
    """A 4000 x 3050 px JPEG (q92) made by upscaling the sample photo (320 x 244) bicubically,
    with EXIF orientation ``orientation`` when it is not 1."""
    with Image.open(SAMPLE_PHOTO) as im:
        big = im.convert("RGB").resize((4000, 3050), Image.Resampling.BICUBIC)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    big.save(buf, "JPEG", quality=92, exif=exif.tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The sample packed by the CLI with ``--max-side 320 --jpeg-quality 90``."""
    out = tmp_path_factory.mktemp("maxside") / "out"
    res = CliRunner().invoke(main, ["pack", str(SAMPLE), str(out), "--max-side", str(MAX_SIDE),
                                    "--jpeg-quality", "90", "--no-progress"])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def sources() -> dict[str, dict]:
    with open(SAMPLE / "metadata.csv", newline="") as f:
        return {row["path"]: row for row in csv.DictReader(f)}


def stored_samples(root):
    """(record, stored bytes) of every sample of every split."""
    man = load_manifest(root)
    for split in man["splits"]:
        recs = read_split_records(root, split)
        for pos, data in iter_sample_bytes(root, man, split):
            yield recs[pos], data


def test_downscaled_size_is_torchvisions_max_size_rule():
    from torchvision.transforms.v2.functional._geometry import _compute_resized_output_size

    for w, h in [(4000, 3050), (3050, 4000), (500, 333), (333, 500), (512, 512), (513, 2),
                 (6000, 1), (1000, 999), (4032, 3024), (321, 320)]:
        th, tw = _compute_resized_output_size((h, w), None, max_size=320)
        assert images.downscaled_size(w, h, 320) == (max(1, tw), max(1, th))
    assert images.downscaled_size(320, 240, 320) == (320, 240)  # at the limit: unchanged
    assert images.downscaled_size(4000, 3000, 512) == (512, 384)


def test_pack_downscales_only_images_over_max_side(packed, sources):
    q90 = quant_tables(90)
    counted = {"downscaled+jpeg": 0, "original": 0}
    psnrs = []
    for rec, data in stored_samples(packed):
        src_bytes = (SAMPLE / rec["path"]).read_bytes()
        row = sources[rec["path"]]
        w0, h0 = int(row["width"]), int(row["height"])
        assert rec["sha256"] == hashlib.sha256(src_bytes).hexdigest() == row["sha256"]
        assert rec["size"] == len(data)
        counted[rec["rule"]] += 1
        if max(w0, h0) <= MAX_SIDE:
            assert rec["rule"] == "original" and data == src_bytes
            assert "original_width" not in rec and (rec["width"], rec["height"]) == (w0, h0)
            continue
        assert rec["rule"] == "downscaled+jpeg" and rec["ext"] == "jpg"
        assert (rec["original_width"], rec["original_height"]) == (w0, h0)
        size = images.downscaled_size(w0, h0, MAX_SIDE)
        assert (rec["width"], rec["height"]) == size and max(size) == MAX_SIDE
        with Image.open(io.BytesIO(data)) as im:
            assert im.format == "JPEG" and im.size == size and im.mode == "RGB"
            assert JpegImagePlugin.get_sampling(im) == 0  # 4:4:4
            assert im.quantization == q90
            assert not im.info.get("exif") and not im.info.get("icc_profile")
            stored = np.asarray(im.convert("RGB"))
        psnrs.append(psnr(stored, reference(src_bytes, size)))
        # the pHash pack recorded is the stored pixels' and still matches the full-size photo's
        pixels = decode_rgb(data)
        assert rec["phash"] == f"{phash64(pixels):016x}"
        full = phash64(decode_rgb(src_bytes))
        assert bin(full ^ int(rec["phash"], 16)).count("1") <= PHASH_THRESHOLD
    over = sum(max(int(r["width"]), int(r["height"])) > MAX_SIDE for r in sources.values())
    assert counted == {"downscaled+jpeg": over, "original": len(sources) - over}
    assert 0 < over < len(sources)
    # q90 against an exact Lanczos resize of Pillow's decode: measured 31.5-43.5 dB, median 37.5
    assert min(psnrs) > 30.0 and np.median(psnrs) > 36.0
    norm = load_manifest(packed)["normalization"]
    assert norm["transcoded"] == {"downscaled+jpeg": over}
    assert "downscaled" in norm["rules"] and "jpeg" in norm["rules"]


def test_verify_check_and_stats_report_the_stored_resolution(packed, sources):
    over = sum(max(int(r["width"]), int(r["height"])) > MAX_SIDE for r in sources.values())
    report = verify(packed)
    assert report.ok, report.problems
    assert report.stored["max_side"] == MAX_SIDE
    assert sum(report.stored["downscaled"].values()) == over
    assert f"--max-side {MAX_SIDE}" in report.format_text()
    res = CliRunner().invoke(main, ["verify", str(packed)])
    assert res.exit_code == 0 and "stored resolution: --max-side 320" in res.output

    checked = check_dataset(packed, transforms=False)
    assert checked["stored_resolution"]["downscaled"] == report.stored["downscaled"]
    assert "stored resolution: --max-side 320" in format_check_report(checked)

    stats = compute_stats(packed, "train", save=False)
    train = read_split_records(packed, "train")
    assert stats["max_side"] == MAX_SIDE
    assert stats["num_downscaled"] == sum(r["rule"] == "downscaled+jpeg" for r in train) > 0


def test_verify_fails_a_downscaled_sample_whose_record_lies(packed, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(packed, root)
    path = root / "splits" / "train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    bad = next(r for r in rows if r["rule"] == "downscaled+jpeg")
    bad["width"] += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = verify(root)
    assert report.bad_keys == [bad["key"]]
    assert f"decodes to {bad['width'] - 1}x" in report.problems[0]


def test_without_max_side_the_pack_reports_full_resolution(packed_sample):
    report = verify(packed_sample("wds"))
    assert report.ok and report.stored["max_side"] is None
    assert "stored resolution: full (no --max-side)" in report.format_text()


def test_camera_size_jpeg_is_stored_at_max_side():
    data = camera_size()
    res = images.check_image(data, max_side=512, keep_pixels=True)
    assert res.ok and res.rule == "downscaled+jpeg" and res.original_size == (4000, 3050)
    assert (res.width, res.height) == (512, 390)  # floor(512 * 3050 / 4000) = 390
    assert len(res.data) < len(data) / 8  # measured 107 KB of 1,148 KB
    with Image.open(io.BytesIO(res.data)) as im:
        assert im.size == (512, 390) and JpegImagePlugin.get_sampling(im) == 0
        assert im.quantization == quant_tables(95)  # the default quality
    assert np.array_equal(res.pixels, decode_rgb(res.data))  # pixels = what readers decode
    assert psnr(res.pixels, reference(data, (512, 390))) > 38.0
    low = images.check_image(data, max_side=512, jpeg_quality=60)
    assert len(low.data) < len(res.data) * 0.6
    assert psnr(decode_rgb(low.data), reference(data, (512, 390))) < psnr(res.pixels, reference(
        data, (512, 390)))


def test_camera_size_rotated_jpeg_is_measured_upright():
    res = images.check_image(camera_size(orientation=6), max_side=512, keep_pixels=True)
    assert res.rule == "exif-transpose+downscaled+jpeg"
    assert res.original_size == (3050, 4000) and (res.width, res.height) == (390, 512)
    upright = images.check_image(camera_size(), max_side=512, keep_pixels=True).pixels
    # orientation 6 = rotate 90 degrees clockwise to display
    assert psnr(res.pixels, np.rot90(upright, k=-1)) > 35.0


def test_other_formats_over_max_side_become_jpegs_and_small_ones_stay_lossless():
    with Image.open(SAMPLE_PHOTO) as im:
        rgb = np.asarray(im.convert("RGB"))
    alpha = np.full(rgb.shape[:2], 255, np.uint8)
    alpha[:, :40] = 0  # a transparent band: white after compositing
    buf = io.BytesIO()
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(buf, "PNG")
    res = images.check_image(buf.getvalue(), max_side=160, keep_pixels=True)
    assert res.rule == "alpha-over-white+downscaled+jpeg" and res.ext == "jpg"
    assert (res.width, res.height) == (160, 122) and res.original_size == (320, 244)
    assert res.pixels[:, :15].min() >= 250  # the band is white, not black
    kept = images.check_image(buf.getvalue(), max_side=320)
    assert kept.rule == "alpha-over-white+png" and kept.original_size is None

    gray = io.BytesIO()
    Image.fromarray(rgb).convert("L").save(gray, "JPEG", quality=90)
    res = images.check_image(gray.getvalue(), max_side=100)
    with Image.open(io.BytesIO(res.data)) as im:
        assert res.rule == "downscaled+jpeg" and im.mode == "L" and im.size == (100, 76)


def test_jpegs_within_max_side_stay_byte_identical():
    data = SAMPLE_PHOTO.read_bytes()
    for max_side in (320, 321, 10_000):
        res = images.check_image(data, max_side=max_side)
        assert res.rule == "original" and res.data == data and res.original_size is None


@pytest.mark.parametrize("kwargs, fragment", [
    ({"max_side": 0}, "max_side=0: expected None or an int >= 1"),
    ({"max_side": True}, "max_side=True"),
    ({"max_side": 12.5}, "max_side=12.5"),
    ({"max_side": 64, "jpeg_quality": 101}, "jpeg_quality=101: expected an int from 1 to 100"),
    ({"max_side": 64, "jpeg_quality": 0}, "jpeg_quality=0"),
])
def test_bad_max_side_or_quality_is_refused_in_one_line(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        images.check_image(SAMPLE_PHOTO.read_bytes(), **kwargs)


def test_a_wide_photo_downscaled_under_32_px_is_not_degenerate():
    """A 1024x198 panorama stored at --max-side 128 becomes 128x24: the side rule judges the
    source (198 px), so it is neither flagged nor quarantined by --strict."""
    from shardkit.images.neardup import degenerate_reason

    photo = np.array(Image.open(next(iter(sorted(SAMPLE.rglob("*.jpg"))))).convert("RGB"))
    wide = np.ascontiguousarray(np.tile(photo[:198], (1, 4, 1))[:, :1024])
    small = np.array(Image.fromarray(wide).resize((128, 24), Image.Resampling.LANCZOS))
    assert degenerate_reason(small) == "small: 128x24 px, a side under 32"
    assert degenerate_reason(small, (1024, 198)) is None
    assert degenerate_reason(small, (1024, 20)) == "small: 1024x20 px, a side under 32"
