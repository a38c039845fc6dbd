"""Tests of shardkit.images.neardup: the pHash (bit for bit imagehash's), the degenerate-image test on
real photos and made placeholders, the exact multi-index pair search against brute force, and
the clusters (field case 24: near-duplicates must not straddle splits)."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import PIL
import pytest
from PIL import Image

from shardkit.images import neardup, phash
from shardkit.doctor.reading import decode_rgb
from shardkit.errors import ConfigError
from helpers import placeholder


def _decoded(path: Path) -> np.ndarray:
    return decode_rgb(path.read_bytes())


def _sample_photos(sample_dir: Path) -> list[Path]:
    return sorted(sample_dir.glob("*/*.jpg"))


def _imagehash64(rgb: np.ndarray) -> int:
    import imagehash

    bits = imagehash.phash(Image.fromarray(rgb), hash_size=8).hash.reshape(-1)
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def _jpeg(im: Image.Image, quality: int = 85) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


# ------------------------------------------------------------------------------------- pHash

def test_phash64_equals_imagehash_on_every_sample_photo(sample_dir):
    photos = _sample_photos(sample_dir)
    assert len(photos) == 200
    for k, p in enumerate(photos):
        rgb = _decoded(p)
        assert neardup.phash64(rgb) == _imagehash64(rgb), p
        if k % 10 == 0:
            ref = np.asarray(Image.fromarray(rgb).convert("L").resize((32, 32), Image.LANCZOS))
            np.testing.assert_array_equal(neardup.thumbnail32(rgb), ref)


@pytest.mark.parametrize("shape", [(1, 1), (5, 300), (31, 32), (32, 32), (32, 1000), (33, 7),
                                   (64, 64), (100, 60), (100, 70), (1001, 777), (2000, 90)])
def test_phash64_equals_imagehash_on_odd_sizes(sample_dir, shape):
    """Up- and downsampling, skipped passes (a side of 32), portrait and landscape, either pass
    first: the thumbnail is Pillow's to the last level, on noise and on a resized real photo."""
    h, w = shape
    if int(PIL.__version__.split(".")[0]) < 13 and h > 32 and 2 * w < h + 32:
        pytest.skip("Pillow < 13 resamples tall images horizontally first (see thumbnail32)")
    noise = np.random.default_rng(h * 7919 + w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    with Image.open(_sample_photos(sample_dir)[3]) as im:
        photo = np.asarray(im.convert("RGB").resize((w, h), Image.BILINEAR))
    for rgb in (noise, photo, np.ascontiguousarray(photo[:, ::-1])):
        ref = np.asarray(Image.fromarray(rgb).convert("L").resize((32, 32), Image.LANCZOS))
        np.testing.assert_array_equal(neardup.thumbnail32(rgb), ref)
        assert neardup.phash64(rgb) == _imagehash64(rgb)
    assert neardup.phash64(photo[:, ::-1]) == _imagehash64(np.ascontiguousarray(photo[:, ::-1]))


def test_a_48_megapixel_photo_is_checked_and_hashed_in_bounded_memory(tmp_path):
    """The pack's per-file check (decode, degenerate test, pHash) of an 8000x6000 JPEG, in a
    child process: its peak RSS stays under 400 MB (the decoded pixels are 144 MB; the pHash
    used to add 1.1 GB of whole-image float copies)."""
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    path = tmp_path / "48mp.jpg"
    Image.fromarray(blocks.repeat(100, axis=0).repeat(100, axis=1)).save(path, quality=85)
    child = (
        "import resource, sys\n"
        "from shardkit.images.normalize import DEFAULT_MAX_PIXELS\n"
        "from shardkit.packer.check import check_chunk\n"
        "(res,) = check_chunk([(sys.argv[1], '48mp.jpg', DEFAULT_MAX_PIXELS, False, True, None, "
        "95)])\n"
        "assert res['ok'] and (res['width'], res['height']) == (8000, 6000), res\n"
        "peak = [line.split()[1] for line in open('/proc/self/status') if "
        "line.startswith('VmHWM:')]\n"
        "print(res['phash'], peak[0] if peak else "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    # VmHWM: this process's own peak (ru_maxrss would also count the test process it was forked
    # from, whose high-water mark Linux carries across exec); both in KiB
    out = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] != "None" and int(out[0]) >= 0  # hashed (not taken as degenerate)
    assert int(out[1]) < 400 * 1024, f"peak RSS {int(out[1]) // 1024} MB"


@pytest.mark.parametrize("shape", [(1000, 1500), (1500, 1000), (40, 9000), (9000, 40)])
def test_thumbnail_by_bands_of_rows_equals_pillows(shape, monkeypatch):
    """thumbnail32 converts and resamples bands of rows (its memory bound): over many bands,
    wide and tall (vertical pass first), the result is Pillow's convert("L") + LANCZOS resize,
    exactly; and the pHash is imagehash's."""
    rng = np.random.default_rng(sum(shape))
    rgb = np.asarray(Image.fromarray(rng.integers(0, 256, (shape[0] // 20, shape[1] // 20, 3),
                                                  dtype=np.uint8)).resize(shape[::-1]))
    monkeypatch.setattr(phash, "_CHUNK_PIXELS", 50_000)  # 20-1250 bands
    pillow = np.asarray(Image.fromarray(rgb).convert("L").resize((32, 32), Image.LANCZOS))
    assert np.array_equal(neardup.thumbnail32(rgb), pillow)
    assert neardup.phash64(rgb) == _imagehash64(rgb)


def test_phash64_rejects_non_rgb():
    for bad in (np.zeros((8, 8), np.uint8), np.zeros((8, 8, 4), np.uint8),
                np.zeros((8, 8, 3), np.float32)):
        with pytest.raises(ConfigError, match=r"\(H, W, 3\) uint8"):
            neardup.phash64(bad)
    with pytest.raises(ConfigError, match="list"):
        neardup.degenerate_reason([[0, 0, 0]])


def test_resized_reencoded_copy_is_found_and_other_photos_are_not(sample_dir):
    photos = _sample_photos(sample_dir)
    hashes = [neardup.phash64(_decoded(p)) for p in photos]
    with Image.open(photos[10]) as im:
        im = im.convert("RGB")
        small = im.resize((round(im.width * 0.6), round(im.height * 0.6)), Image.LANCZOS)
    copy = neardup.phash64(decode_rgb(_jpeg(small, 70)))
    i, j, d = neardup.near_pairs(np.array(hashes + [copy], np.uint64), neardup.PHASH_THRESHOLD)
    found = {(a, b): c for a, b, c in zip(i.tolist(), j.tolist(), d.tolist())}
    assert found[(10, 200)] <= 2                              # the copy, 0-2 bits away
    assert [pair for pair in found if 200 in pair] == [(10, 200)]
    others = np.bitwise_count(np.array(hashes, np.uint64) ^ np.uint64(copy))
    assert np.median(others) > 20                              # unrelated photos: ~32 bits


# ------------------------------------------------------------------------------- degenerate

def test_no_sample_photo_is_degenerate(sample_dir):
    assert [p for p in _sample_photos(sample_dir) if neardup.degenerate_reason(_decoded(p))] == []


def test_real_dark_and_low_contrast_photos_are_not_degenerate(flowers_dir):
    dark = flowers_dir / "daisy/8710109684_e2c5ef6aeb_n.jpg"       # a daisy on black, 7% of it
    flat = flowers_dir / "daisy/14264136211_9531fbc144.jpg"        # lowest contrast of the set
    for p in (dark, flat):
        assert neardup.degenerate_reason(_decoded(p)) is None, p
    gray = (np.asarray(Image.open(dark).convert("L")).astype(int))
    assert (np.abs(gray - 5) <= 8).mean() > 0.9                    # it really is mostly black
    flagged = [p for p in sorted(flowers_dir.glob("*/*.jpg"))
               if neardup.degenerate_reason(_decoded(p))]
    assert flagged == []


def test_constant_blank_and_placeholder_images_are_degenerate(sample_dir):
    white = np.full((240, 320, 3), 255, np.uint8)
    assert neardup.degenerate_reason(white) == \
        "near-constant: 100.0% of pixels within 8 levels of gray 255"
    noisy = np.clip(np.random.default_rng(0).normal(16, 2, (480, 640, 3)), 0, 255)
    assert neardup.degenerate_reason(noisy.astype(np.uint8)).startswith("near-constant")
    for args in [(400, 300, 24), (500, 374, 20), (640, 480, 48), (300, 300, 30)]:
        reason = neardup.degenerate_reason(decode_rgb(placeholder(*args)))
        assert reason is not None and reason.startswith("near-constant") and \
            reason.endswith("of gray 230"), (args, reason)
    assert neardup.degenerate_reason(np.zeros((400, 20, 3), np.uint8)) == \
        "small: 20x400 px, a side under 32"
    assert neardup.degenerate_reason(np.zeros((31, 500, 3), np.uint8)).startswith("small: 500x31")
    with Image.open(_sample_photos(sample_dir)[0]) as im:    # a side of exactly 32 is fine
        assert neardup.degenerate_reason(np.asarray(im.convert("RGB").resize((32, 200)))) is None


def test_degenerate_placeholders_all_collide_in_phash():
    """Why callers leave degenerate images out: blank frames of different sizes and shades hash
    alike (0-4 bits apart), so merging by pHash would join unrelated samples."""
    blanks = [np.full((h, w, 3), v, np.uint8) for h, w, v in
              [(240, 320, 255), (300, 300, 250), (480, 640, 0), (200, 500, 128)]]
    hashes = np.array([neardup.phash64(b) for b in blanks], np.uint64)
    i, j, _ = neardup.near_pairs(hashes, neardup.PHASH_THRESHOLD)
    assert len(i) >= 3


# ----------------------------------------------------------------------------- near_pairs

def _brute(h: np.ndarray, t: int) -> list[tuple[int, int, int]]:
    n = h.size
    if n < 2:
        return []
    d = np.bitwise_count(h[:, None] ^ h[None, :]).astype(np.int64)
    i, j = np.nonzero(np.triu(d <= t, k=1))
    return list(zip(i.tolist(), j.tolist(), d[i, j].tolist()))


def _clustered(n: int, rng: np.random.Generator) -> np.ndarray:
    """Cluster centres with members at 0-7 random bit flips, plus exact repeats."""
    centres = rng.integers(0, 2**64, size=max(1, n // 6), dtype=np.uint64, endpoint=False)
    h = centres[rng.integers(0, centres.size, n)]
    for k in range(n):
        for b in rng.choice(64, rng.integers(0, 8), replace=False):
            h[k] ^= np.uint64(1) << np.uint64(b)
    return h


def _layouts(t: int) -> list[int | None]:
    """The planned layout, all pairs (0), t + 1 blocks (radius 0), and 1-3 blocks where they
    take few bit flips: together the dense-table and searchsorted lookups, radius 0, 1 and 2."""
    def flips(m):
        return sum(neardup._num_flips(b, r) for _, b, r in neardup._layout(m, t))

    return [None, 0, t + 1] + [m for m in (1, 2, 3) if m < t + 1 and flips(m) <= 800]


@pytest.mark.parametrize("kind", ["random", "clustered"])
@pytest.mark.parametrize("n", [0, 1, 2, 60, 300])
def test_near_pairs_equals_brute_force(kind, n):
    rng = np.random.default_rng(n * 2 + (kind == "clustered"))
    h = (rng.integers(0, 2**64, size=n, dtype=np.uint64) if kind == "random"
         else _clustered(n, rng))
    for t in range(11):
        ref = _brute(h, t)
        for m in _layouts(t):
            i, j, d = neardup.near_pairs(h, t, blocks=m)
            assert i.dtype == j.dtype == d.dtype == np.int64
            assert list(zip(i.tolist(), j.tolist(), d.tolist())) == ref, (kind, n, t, m)
    if kind == "clustered" and n == 300:
        assert len(_brute(h, 4)) > 100                 # the clustered case has real pairs


def test_near_pairs_in_tiny_batches_with_large_buckets(monkeypatch):
    """Batches of 64 pairs (so long ranges are split) and buckets of 40 equal hashes; signed
    int64 input is read as the same bit patterns."""
    rng = np.random.default_rng(7)
    h = np.concatenate([np.full(40, 0xDEADBEEF12345678, np.uint64), _clustered(160, rng),
                        np.full(30, 2**63 + 5, np.uint64)])
    rng.shuffle(h)
    monkeypatch.setattr(neardup, "_CHUNK", 64)
    for t in (0, 1, 3, 4, 7):
        ref = _brute(h, t)
        for m in _layouts(t):
            got = neardup.near_pairs(h.view(np.int64), t, blocks=m)
            assert list(zip(*(x.tolist() for x in got))) == ref, (t, m)


def test_near_pairs_block_plan_and_bad_input():
    assert neardup.plan_blocks(1_000_000, 4) == 3      # 22/21/21 bits, radii 1/1/0
    assert neardup._layout(3, 4) == [(0, 22, 1), (22, 21, 1), (43, 21, 0)]
    assert neardup.plan_blocks(20_000, 4) == 5         # 13/13/13/13/12 bits, radius 0
    assert neardup.plan_blocks(1_000_000, 0) == 1      # equal hashes: one sort
    assert neardup.plan_blocks(10, 4) == 0             # a handful: all pairs
    assert all(neardup.plan_blocks(10**6, t) >= 1 for t in range(11))
    h = np.arange(5, dtype=np.uint64)
    for t in (-1, 65, 2.0, True, "4"):
        with pytest.raises(ConfigError, match="0-64"):
            neardup.near_pairs(h, t)
    with pytest.raises(ConfigError, match="1-D"):
        neardup.near_pairs(h.reshape(1, 5), 2)
    with pytest.raises(ConfigError, match="float64"):
        neardup.near_pairs(h.astype(np.float64), 2)
    with pytest.raises(ConfigError, match="blocks"):
        neardup.near_pairs(h, 2, blocks=4)
    with pytest.raises(ConfigError, match="bit-flip"):
        neardup.near_pairs(h, 10, blocks=1)
    assert all(x.size == 0 for x in neardup.near_pairs(np.array([], np.float64), 3))


# ------------------------------------------------------------------------------- clusters

def test_clusters_are_connected_components():
    i, j = np.array([5, 0, 2, 7, 3]), np.array([6, 2, 9, 8, 3])
    assert neardup.clusters(10, i, j) == [[0, 2, 9], [5, 6], [7, 8]]   # 3-3 alone: no cluster
    assert neardup.clusters(0, np.array([], np.int64), np.array([], np.int64)) == []
    rng = np.random.default_rng(3)
    n = 500
    a, b = rng.integers(0, n, 300), rng.integers(0, n, 300)
    parent = list(range(n))                                   # reference: union-find

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x, y in zip(a, b):
        parent[find(x)] = find(y)
    comps: dict[int, list[int]] = {}
    for x in sorted(set(a) | set(b)):
        comps.setdefault(find(x), []).append(int(x))
    ref = sorted((c for c in comps.values() if len(c) > 1), key=lambda c: c[0])
    assert neardup.clusters(n, a, b) == ref
    with pytest.raises(ConfigError, match=r"outside \[0, 5\)"):
        neardup.clusters(5, np.array([0]), np.array([5]))
    with pytest.raises(ConfigError, match="one length"):
        neardup.clusters(5, np.array([0, 1]), np.array([2]))
    with pytest.raises(ConfigError, match="n >= 0"):
        neardup.clusters(-1, np.array([0]), np.array([1]))
