"""Shared fixtures.

Real data comes from two places. ``examples/flowers-sample`` (200 photos) ships in the repository,
so tests that need a real photo use it and run everywhere (CI included). The full flowers set and
the 27 awkward files live in ``../shared/data`` (or ``$SHARDKIT_SHARED_DATA``), which CI does not
have: tests that need those exact files skip with a reason when the folder is absent. Awkward
files that Pillow can make from a sample photo (EXIF rotation, CMYK, alpha, 16-bit, palette,
truncated, WebP, TIFF, GIF, AVIF...) come from :func:`make_awkward` in a temp folder instead.
"""
from __future__ import annotations

import csv
import io
import os
import random
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms, features

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SHARDKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
FLOWERS = SHARED_DATA / "flowers"
AWKWARD = SHARED_DATA / "awkward"
SAMPLE = ROOT / "examples" / "flowers-sample"
#: One real photo from the embedded sample: baseline 8-bit YCbCr JPEG, 320x244, no ICC profile.
SAMPLE_PHOTO = SAMPLE / "daisy" / "538920244_59899a78f8_n.jpg"
SAMPLE_PHOTO_SIZE = (320, 244)


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real test data not found at {path} (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="session")
def flowers_dir() -> Path:
    """The full flowers set (1,839 photos, 5 classes, metadata.csv with group_flickr_user)."""
    return _need(FLOWERS)


@pytest.fixture(scope="session")
def awkward_dir() -> Path:
    """27 awkward real-world files with EXPECTED.csv."""
    return _need(AWKWARD)


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """The embedded sample shipped in the repo (whole photographer groups, 5 classes)."""
    assert SAMPLE.is_dir(), f"{SAMPLE} is missing: the checkout is incomplete"
    return SAMPLE


@pytest.fixture(scope="session")
def sample_photo() -> Path:
    """:data:`SAMPLE_PHOTO`, one real flowers photo that is always present."""
    assert SAMPLE_PHOTO.is_file(), f"{SAMPLE_PHOTO} is missing: the checkout is incomplete"
    return SAMPLE_PHOTO


# ---- awkward files made from one sample photo ----------------------------------------------
# (file, expect, upright_size, what): the columns of ../shared/data/awkward/EXPECTED.csv. Where a
# made file plays the same part as a shared one it has the same name.
MADE_AWKWARD = [
    ("truncated_half_photo.jpg", "reject", "", "the sample photo cut at half its bytes"),
    ("truncated_progressive.jpg", "reject", "", "progressive JPEG cut at 60% of its bytes"),
    ("corrupt_header.png", "reject", "", "PNG signature followed by 72 random bytes"),
    ("zero_bytes.jpg", "reject", "", "empty file"),
    ("junk_bytes_after_comment.jpg", "accept", "200x150",
     "COM segment, then 5 junk bytes before each of the two DQT markers"),
    ("cmyk_adobe.jpg", "accept", "200x150", "CMYK JPEG (Pillow writes Adobe APP14, inverted)"),
    ("grayscale.jpg", "accept", "200x150", "single-channel JPEG"),
    ("progressive_photo.jpg", "accept", "200x150", "progressive JPEG"),
    ("exif_orientation_6.jpg", "accept", "150x200", "JPEG stored 200x150 with EXIF orientation 6"),
    ("png_exif_orientation_3.png", "accept", "200x150", "PNG with eXIf orientation 3"),
    ("png_16bit_rgb_icc.png", "accept", "200x150",
     "16-bit RGB PNG (written chunk by chunk) with an sRGB iCCP profile"),
    ("png_palette_trns.png", "accept", "200x150", "16-colour palette PNG, index 0 transparent"),
    ("png_rgba.png", "accept", "200x150", "RGBA PNG, alpha ramp 0..255 left to right"),
    ("png_gray_alpha_LA.png", "accept", "200x150", "LA PNG, same alpha ramp"),
    ("png_disguised_as.jpg", "accept", "200x150", "PNG bytes behind a .jpg name"),
    ("jpeg_disguised_as.png", "accept", "200x150", "JPEG bytes behind a .png name"),
    ("webp_lossy.webp", "accept", "200x150", "lossy WebP"),
    ("webp_alpha.webp", "accept", "200x150", "lossy WebP with the alpha ramp"),
    ("gif_animated.gif", "accept", "200x150", "2-frame GIF (second frame flipped)"),
    ("tiff_rgb.tif", "accept", "200x150", "uncompressed RGB TIFF"),
    ("tiff_16bit_gray.tiff", "accept", "200x150", "16-bit grayscale (I;16) TIFF"),
    ("tiff_multipage.tiff", "accept", "200x150", "2-page palette TIFF"),
    ("avif.avif", "either", "200x150", "AVIF still (needs Pillow's AVIF codec to decode)"),
]

#: The alpha channel of the made RGBA/LA/WebP files: 0 at the left edge, 255 at the right.
MADE_ALPHA = np.tile(np.linspace(0, 255, 200).astype(np.uint8), (150, 1))


def _save(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, type, body, CRC-32 of type + body."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_16bit_rgb(arr: np.ndarray, icc: bytes | None = None) -> bytes:
    """A 16-bit RGB PNG of ``arr`` (H, W, 3) uint16; Pillow cannot write this mode itself."""
    h, w, _ = arr.shape
    rows = arr.astype(">u2")
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(h))  # filter 0 on every row
    head = png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
    if icc is not None:
        head += png_chunk(b"iCCP", b"sRGB\x00\x00" + zlib.compress(icc))
    return (b"\x89PNG\r\n\x1a\n" + head + png_chunk(b"IDAT", zlib.compress(raw))
            + png_chunk(b"IEND", b""))


def made_photo(photo: Path = SAMPLE_PHOTO) -> np.ndarray:
    """The top-left 200x150 of ``photo`` as (150, 200, 3) uint8: real pixels, no resampling."""
    with Image.open(photo) as im:
        return np.ascontiguousarray(np.asarray(im.convert("RGB"))[:150, :200])


def made_deep(rgb: np.ndarray) -> np.ndarray:
    """16-bit version of ``rgb`` for the made 16-bit PNG: ``v * 257 + (index % 200)`` (uint16)."""
    return (rgb.astype(np.uint16) * 257 + (np.arange(rgb.size).reshape(rgb.shape) % 200)).astype(
        np.uint16)


def make_awkward(photo: Path = SAMPLE_PHOTO) -> dict[str, bytes]:
    """Every file of :data:`MADE_AWKWARD` as bytes, made with Pillow from ``photo``."""
    rgb = made_photo(photo)
    im = Image.fromarray(rgb)
    gray = im.convert("L")
    rgba = Image.fromarray(np.dstack([rgb, MADE_ALPHA]))
    flipped = im.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    jpeg = _save(im, "JPEG", quality=90)
    progressive = _save(im, "JPEG", quality=90, progressive=True)
    dqt = [i for i in range(len(jpeg) - 1) if jpeg[i:i + 2] == b"\xff\xdb"]
    comment = b"\xff\xfe\x00\x06note"  # COM segment: marker, length 6 (itself + 4 bytes)
    junk = (jpeg[:dqt[0]] + comment + b"junk!" + jpeg[dqt[0]:dqt[1]] + b"junk!"
            + jpeg[dqt[1]:])
    orient6, orient3 = Image.Exif(), Image.Exif()
    orient6[0x0112], orient3[0x0112] = 6, 3
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    png = _save(im, "PNG")
    files = {
        "truncated_half_photo.jpg": photo.read_bytes()[: photo.stat().st_size // 2],
        "truncated_progressive.jpg": progressive[: int(len(progressive) * 0.6)],
        "corrupt_header.png": b"\x89PNG\r\n\x1a\n" + random.Random(0).randbytes(72),
        "zero_bytes.jpg": b"",
        "junk_bytes_after_comment.jpg": junk,
        "cmyk_adobe.jpg": _save(im.convert("CMYK"), "JPEG", quality=95),
        "grayscale.jpg": _save(gray, "JPEG", quality=90),
        "progressive_photo.jpg": progressive,
        "exif_orientation_6.jpg": _save(im, "JPEG", quality=90, exif=orient6.tobytes()),
        "png_exif_orientation_3.png": _save(im, "PNG", exif=orient3.tobytes()),
        "png_16bit_rgb_icc.png": png_16bit_rgb(made_deep(rgb), srgb),
        "png_palette_trns.png": _save(im.quantize(16), "PNG", transparency=0),
        "png_rgba.png": _save(rgba, "PNG"),
        "png_gray_alpha_LA.png": _save(Image.fromarray(np.dstack([gray, MADE_ALPHA]), "LA"), "PNG"),
        "png_disguised_as.jpg": png,
        "jpeg_disguised_as.png": jpeg,
        "webp_lossy.webp": _save(im, "WEBP", quality=80),
        "webp_alpha.webp": _save(rgba, "WEBP", quality=80),
        "gif_animated.gif": _save(im, "GIF", save_all=True, append_images=[flipped], duration=100),
        "tiff_rgb.tif": _save(im, "TIFF"),
        "tiff_16bit_gray.tiff": _save(Image.fromarray(np.asarray(gray).astype(np.uint16) * 257),
                                      "TIFF"),
        "tiff_multipage.tiff": _save(im.quantize(64), "TIFF", save_all=True,
                                     append_images=[flipped.quantize(64)]),
        "avif.avif": _save(im, "AVIF", quality=80) if features.check("avif") else
        b"\0\0\0\x1cftypavif\0\0\0\0avifmif1miaf" + bytes(64),  # header only: rejected anyway
    }
    assert list(files) == [row[0] for row in MADE_AWKWARD]
    return files


@pytest.fixture(scope="session")
def made_awkward_dir(tmp_path_factory) -> Path:
    """A folder like ../shared/data/awkward made by :func:`make_awkward`, with EXPECTED.csv."""
    out = tmp_path_factory.mktemp("made-awkward")
    for name, data in make_awkward().items():
        (out / name).write_bytes(data)
    with open(out / "EXPECTED.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "expect", "upright_size", "what"])
        writer.writerows(MADE_AWKWARD)
    return out


def _pack_factory(tmp_path_factory, name: str, src: Path, defaults: dict):
    """Session-cached ``make(fmt, **kwargs) -> Path``: ``src`` packed by ``shardkit.packer.run.pack``."""
    cache: dict[tuple, Path] = {}

    def make(fmt: str = "wds", **kwargs) -> Path:
        from shardkit.packer.run import pack

        key = (fmt, tuple(sorted(kwargs.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{name}-{fmt}") / "out"
            pack(_need(src), out, format=fmt, **{**defaults, **kwargs})
            cache[key] = out
        return cache[key]

    return make


@pytest.fixture
def shm(tmp_path, monkeypatch) -> Path:
    """A private folder for RAM arenas (``SHM_DIR_ENV``, inherited by child processes), so
    tests never meet another test's arena; removed afterwards."""
    import shutil
    import time

    from shardkit.stream.cache import SHM_DIR_ENV

    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    folder = folder / f"shardkit-test-{os.getpid()}-{time.monotonic_ns()}"
    folder.mkdir()
    monkeypatch.setenv(SHM_DIR_ENV, str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def packed_sample(tmp_path_factory):
    """Factory: the embedded sample packed once per format (train/val/test by photographer).

    Usage: ``out = packed_sample("lmdb")`` -> Path of the packed dataset (session-cached).
    The balanced split rule pins the per-split counts the tests expect (the default hash rule
    is tested in test_pack_stable.py and test_split_stable.py).
    """
    return _pack_factory(tmp_path_factory, "packed", SAMPLE, dict(
        split={"train": 0.7, "val": 0.15, "test": 0.15}, seed=0, split_method="balanced",
        metadata=SAMPLE / "metadata.csv", group_column="group_flickr_user", shard_samples=32,
        workers=1))


@pytest.fixture(scope="session")
def packed_flowers(tmp_path_factory):
    """Factory: the full flowers set packed once per format, grouped by group_flickr_user, by the
    balanced split rule (80/10/10 within tolerance; the hash rule misses it by chance here,
    see test_split.py)."""
    return _pack_factory(tmp_path_factory, "flowers", FLOWERS, dict(
        split={"train": 0.8, "val": 0.1, "test": 0.1}, seed=0, split_method="balanced",
        metadata=FLOWERS / "metadata.csv", group_column="group_flickr_user", shard_samples=256,
        workers=2))


class S3Server:
    """A local S3 API (moto's server in a thread of the test process) that fsspec's ``s3://``
    (s3fs) and every Ray worker started after it reach through the standard ``AWS_*``
    environment variables, as a user's cluster would reach real S3 or MinIO."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        self._buckets = 0

    def bucket(self) -> str:
        """A new empty bucket's URL, ``s3://bucket-N``."""
        import boto3

        self._buckets += 1
        name = f"bucket-{self._buckets}"
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing"
                     ).create_bucket(Bucket=name)
        return f"s3://{name}"

    def fs(self):
        """The fsspec S3 filesystem of this server (fresh instance, no listing cache)."""
        import fsspec

        return fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False)

    def upload_tree(self, folder: Path, url: str) -> list[str]:
        """Uploads every file under ``folder`` to ``url/<relpath>``; returns the relpaths."""
        rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        self.fs().pipe({f"{url}/{r}": (folder / r).read_bytes() for r in rels})
        return rels

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture(scope="session")
def s3_server():
    """A local S3 server for the whole session (moto), its ``AWS_*`` variables set in
    ``os.environ`` while it runs (so Ray workers started later inherit them)."""
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    server = S3Server()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pytest_addoption(parser):
    parser.addoption("--fuzz-mutants", type=int, default=None,
                     help="mutants for tests/test_fuzz.py (default: its CI count)")
