"""The 64-bit pHash of an image and the degenerate-image test (pure numpy, no I/O).

- :func:`phash64` - the pHash of ``imagehash.phash(Image.fromarray(rgb), hash_size=8)`` (DCT of a
  32x32 grayscale LANCZOS thumbnail, sign of the 8x8 low-frequency block against its median;
  after Zauner, "Implementation and Benchmarking of Perceptual Image Hash Functions", 2010), bit
  for bit (under Pillow 13), cheaper: the thumbnail is computed with numpy matrix products that
  reproduce Pillow's fixed-point arithmetic exactly (see :func:`thumbnail32`).
- :func:`degenerate_reason` - tiny images and near-constant ones (blank frames, "image not
  found" placeholders), whose pHashes are meaningless: every blank image hashes alike, so
  callers leave them out of near-duplicate merging (:mod:`shardkit.images.neardup`).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from shardkit.errors import ConfigError

__all__ = ["MIN_SIDE", "FLAT_LEVELS", "FLAT_FRACTION", "phash64", "thumbnail32",
           "degenerate_reason"]


MIN_SIDE = 32
"""Images with a side under this many pixels are degenerate (icons, spacer GIFs, thumbnails of
thumbnails); 32 is also the side of the pHash's own thumbnail, below which it upsamples."""

FLAT_LEVELS = 8
"""Half-width, in gray levels (0-255), of the band around the most common gray value that counts
as "background" in the near-constant test: wide enough for JPEG ringing and sensor noise on a
flat colour (+-2-5 levels at usual qualities), far narrower than any real edge."""

FLAT_FRACTION = 0.95
"""An image is near-constant when at least this fraction of its sampled pixels lies within
:data:`FLAT_LEVELS` of the most common gray value. Measured (tests/test_neardup.py): on the
1,839 real flower photos of the test data the largest fraction is 0.934 (a daisy filling 7% of a
black background), the median 0.18; "image not found" placeholders (a line of text and an icon
on a flat gray, 200x150 to 640x480, JPEG) reach 0.955-0.99, a blank frame 1.0. The price: a photo
whose subject covers under ~5% of a flat backdrop is flagged too."""

_SAMPLE = 64  # the near-constant test reads a strided grid of 64-127 pixels per side
_OUT = 32  # pHash thumbnail side (hash_size 8 x imagehash's highfreq_factor 4)
_PREC = 22  # Pillow's PRECISION_BITS for 8-bit resampling: 32 - 8 - 2
_LUMA = (np.array([19595, 38470, 7471], np.float32) / 65536).astype(np.float32)  # Pillow L24
_GEMM_MAX = 1 << 16  # multiply-adds per matrix product (OpenBLAS threads above 4 * 65,536)
_GEMV_ROWS = 3000  # pixels per gray product (OpenBLAS gemv threads from 9,216 elements)
_CHUNK_PIXELS = 1 << 18  # pixels of one band of rows turned to gray at once (~6 MB of floats)


# ------------------------------------------------------------------------------------- pHash

def _check_rgb(rgb: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 \
            or rgb.shape[2] != 3:
        desc = (f"{rgb.dtype} {rgb.shape}" if isinstance(rgb, np.ndarray)
                else type(rgb).__name__)
        raise ConfigError(f"{what} needs an (H, W, 3) uint8 RGB array; got {desc}")
    return rgb


def _lanczos(x: float) -> float:
    """Pillow's ``lanczos_filter`` (Resample.c): sinc(x) sinc(x/3) on [-3, 3), in libm doubles."""
    if not -3.0 <= x < 3.0:
        return 0.0
    a = 1.0 if x == 0.0 else math.sin(x * math.pi) / (x * math.pi)
    y = x / 3
    b = 1.0 if y == 0.0 else math.sin(y * math.pi) / (y * math.pi)
    return a * b


@functools.lru_cache(maxsize=1024)
def _weights(in_size: int) -> np.ndarray:
    """``(32, in_size)`` float64 matrix of Pillow's fixed-point LANCZOS weights for resizing
    ``in_size`` pixels to 32 (``precompute_coeffs`` + ``normalize_coeffs_8bpc`` of Pillow's
    Resample.c, step by step in the same double arithmetic), integers times 2**22."""
    scale = in_size / _OUT
    filterscale = max(scale, 1.0)
    support = 3.0 * filterscale
    inv = 1.0 / filterscale
    out = np.zeros((_OUT, in_size))
    for xx in range(_OUT):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), in_size) - xmin
        w = [_lanczos((x + xmin - center + 0.5) * inv) for x in range(count)]
        total = 0.0
        for v in w:  # summed in order, as Pillow does
            total += v
        if total != 0.0:
            w = [v / total for v in w]
        out[xx, xmin:xmin + count] = [int(v * (1 << _PREC) + (-0.5 if v < 0 else 0.5))
                                      for v in w]
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=1024)
def _bands(in_size: int) -> tuple[tuple[int, int, int, int, np.ndarray], ...]:
    """:func:`_weights` cut into column blocks ``(c0, c1, o0, o1, w[o0:o1, c0:c1])`` of about
    one filter length, each with the output rows it reaches: the matrix is banded, so the
    blocks skip its zeros."""
    w = _weights(in_size)
    step = max(8, 2 * math.ceil(3 * max(in_size / _OUT, 1.0)) + 1)
    out = []
    for c0 in range(0, in_size, step):
        c1 = min(in_size, c0 + step)
        rows = np.flatnonzero(w[:, c0:c1].any(axis=1))
        if rows.size:
            o0, o1 = int(rows[0]), int(rows[-1]) + 1
            out.append((c0, c1, o0, o1, np.ascontiguousarray(w[o0:o1, c0:c1])))
    return tuple(out)


def _resample(in_size: int, x: np.ndarray) -> np.ndarray:
    """One Pillow 8-bit resampling pass along axis 0 of ``x`` (``(in_size, m)`` float64 of
    integers 0-255) to 32: ``clip8((2**21 + sum w * x) >> 22)``. The products of 8-bit pixels
    and 22-bit weights are integers below 2**31 and their sums below 2**40, so float64 matrix
    products are exact whatever the summation order. Each product is kept under
    :data:`_GEMM_MAX` multiply-adds, where OpenBLAS stays on the calling thread: its threads,
    woken for a whole-image product, made the pHash 5-20x slower on a loaded 2-core machine."""
    s = np.zeros((_OUT, x.shape[1]))
    for c0, c1, o0, o1, w in _bands(in_size):
        _add_product(s[o0:o1], w, x[c0:c1])
    return _round8(s)


def _add_product(s: np.ndarray, w: np.ndarray, x: np.ndarray) -> None:
    """``s += w @ x`` in column blocks of at most :data:`_GEMM_MAX` multiply-adds (see
    :func:`_resample`); exact, as every sum there is."""
    step = max(1, _GEMM_MAX // (w.shape[0] * w.shape[1]))
    for m0 in range(0, x.shape[1], step):
        s[:, m0:m0 + step] += w @ x[:, m0:m0 + step]


def _round8(s: np.ndarray) -> np.ndarray:
    """Pillow's ``clip8((2**21 + sum) >> 22)`` of the fixed-point sums ``s``, in place."""
    s += 1 << (_PREC - 1)
    s *= 1.0 / (1 << _PREC)
    np.floor(s, out=s)
    return np.clip(s, 0, 255, out=s)


def thumbnail32(rgb: np.ndarray) -> np.ndarray:
    """The 32x32 grayscale thumbnail of the pHash, equal to
    ``np.asarray(Image.fromarray(rgb).convert("L").resize((32, 32), Image.LANCZOS))`` under
    Pillow 13.

    Exact reproduction of Pillow (its Convert.c ``L24`` luma and Resample.c fixed-point two-pass
    LANCZOS), in numpy:

    - gray = ``(19595 R + 38470 G + 7471 B + 2**15) >> 16``, computed as float32 products
      (every partial sum is an integer multiple of 2**-16 below 256: exact in 24 bits);
    - each pass multiplies by the integer weight matrix of :func:`_weights` in float64, block
      by block along its band (exact, see :func:`_resample`), then rounds and clips like
      Pillow's ``clip8``. A pass whose size
      does not change is skipped, as Pillow does. Pass order: Pillow 13 resamples vertically
      first when ``H > 32`` and ``2 W < H + 32`` (measured on 7,000 sizes; Pillow 12 always went
      horizontally first, so for such tall images its thumbnail, and imagehash's hash, differ);
      this function follows Pillow 13 whatever Pillow is installed.

    Memory: the gray conversion and the first pass run over bands of rows of at most
    ``2**18`` pixels, so the working set beyond ``rgb`` is a few MB plus ``32 * max(H, W)``
    floats whatever the size (a 48 MP photo: ~10 MB, where whole-image float copies took
    1.1 GB); the sums are exact in any order, so the result does not depend on the bands.

    Args:
        rgb: ``(H, W, 3)`` uint8 RGB array, any size >= 1x1.

    Returns:
        ``(32, 32)`` float64 array of integers 0-255.

    Raises:
        ConfigError: ``rgb`` is not an ``(H, W, 3)`` uint8 array.
    """
    _check_rgb(rgb, "thumbnail32")
    h, w = rgb.shape[:2]
    rows = max(1, _CHUNK_PIXELS // w)  # gray rows converted at once: the memory bound
    if h > _OUT and 2 * w < h + _OUT:  # vertical pass first, summed over bands of rows
        s = np.zeros((_OUT, w))
        for c0, c1, o0, o1, wb in _bands(h):
            for r0 in range(c0, c1, rows):
                r1 = min(c1, r0 + rows)
                _add_product(s[o0:o1], wb[:, r0 - c0:r1 - c0], _gray(rgb[r0:r1]))
        x = _round8(s)
        return _resample(w, x.T).T if w != _OUT else x
    if w != _OUT:  # horizontal pass first, row band by row band: a (H, 32) result
        x = np.empty((h, _OUT))
        for r0 in range(0, h, rows):
            x[r0:r0 + rows] = _resample(w, _gray(rgb[r0:r0 + rows]).T).T
    else:
        x = _gray(rgb)
    if h != _OUT:
        x = _resample(h, x)
    return x


def _gray(rgb: np.ndarray) -> np.ndarray:
    """Pillow's ``L`` of ``(n, w, 3)`` uint8 rows, as ``(n, w)`` float64 integers 0-255 (float32
    products: every partial sum is a multiple of 2**-16 below 256, exact in 24 bits)."""
    n, w = rgb.shape[:2]
    f = rgb.reshape(-1, 3).astype(np.float32)
    gray = np.empty(n * w, np.float32)
    for s in range(0, n * w, _GEMV_ROWS):  # one-thread products, as in _resample
        np.matmul(f[s:s + _GEMV_ROWS], _LUMA, out=gray[s:s + _GEMV_ROWS])
    gray += 0.5
    return np.floor(gray, out=gray).reshape(n, w).astype(np.float64)


def phash64(rgb: np.ndarray) -> int:
    """64-bit pHash of an RGB image, equal to ``imagehash.phash(Image.fromarray(rgb),
    hash_size=8)`` read as an integer.

    The 32x32 gray thumbnail (:func:`thumbnail32`, Pillow-exact), its 2-D DCT-II
    (``scipy.fftpack.dct`` along each axis, as imagehash does), and the sign of the top-left 8x8
    coefficients against their median; the bits are read row-major, the first bit being the most
    significant. Source: the ``imagehash`` library (``imagehash.phash``, BSD-2), after Zauner
    2010 and pHash.org. Cost on 320x240 photos: ~0.65x their decode, ~0.7x imagehash's
    (benchmarks/README.md, "Near-duplicate search").

    Args:
        rgb: ``(H, W, 3)`` uint8 RGB array.

    Returns:
        Unsigned int in ``[0, 2**64)``.

    Raises:
        ConfigError: ``rgb`` is not an ``(H, W, 3)`` uint8 array.
    """
    import scipy.fftpack

    pixels = thumbnail32(_check_rgb(rgb, "phash64"))
    dct = scipy.fftpack.dct(scipy.fftpack.dct(pixels, axis=0), axis=1)
    low = dct[:8, :8]
    bits = (low > np.median(low)).reshape(-1)
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


# ------------------------------------------------------------------------------ degenerate

def degenerate_reason(rgb: np.ndarray, size: tuple[int, int] | None = None) -> str | None:
    """Why an image is useless for training and for near-duplicate search, or None.

    - ``"small: WxH px, a side under 32"`` when a side is under :data:`MIN_SIDE`;
    - ``"near-constant: 98.2% of pixels within 8 levels of gray 230"`` when at least
      :data:`FLAT_FRACTION` of the pixels of a strided sample grid (64-127 pixels per side, every
      pixel of smaller images) have a gray value (Pillow's ``L`` luma) within
      :data:`FLAT_LEVELS` of the grid's most common gray value: blank or single-colour frames, and
      placeholders ("image not found") whose few text or icon pixels lie on a flat background.
      A photo on a black or white backdrop is not flagged while its subject fills more than
      ~5% of the frame.

    Cost: ~10-40 us whatever the image size (it reads at most 127x127 pixels).

    Args:
        rgb: ``(H, W, 3)`` uint8 RGB array.
        size: the source image's ``(width, height)`` when ``rgb`` is a downscaled copy of it
            (``pack --max-side``): the side rule judges the source, not the copy.

    Returns:
        None for a usable image, else a one-line reason.

    Raises:
        ConfigError: ``rgb`` is not an ``(H, W, 3)`` uint8 array.
    """
    _check_rgb(rgb, "degenerate_reason")
    sw, sh = (rgb.shape[1], rgb.shape[0]) if size is None else (int(size[0]), int(size[1]))
    if min(sw, sh) < MIN_SIDE:
        return f"small: {sw}x{sh} px, a side under {MIN_SIDE}"
    h, w = rgb.shape[:2]
    grid = rgb[::max(1, h // _SAMPLE), ::max(1, w // _SAMPLE)].astype(np.int32)
    gray = (grid[..., 0] * 19595 + grid[..., 1] * 38470 + grid[..., 2] * 7471 + 32768) >> 16
    hist = np.bincount(gray.reshape(-1), minlength=256)
    mode = int(hist.argmax())
    frac = hist[max(0, mode - FLAT_LEVELS):mode + FLAT_LEVELS + 1].sum() / gray.size
    if frac >= FLAT_FRACTION:
        return (f"near-constant: {100 * frac:.1f}% of pixels within {FLAT_LEVELS} levels of "
                f"gray {mode}")
    return None


# --------------------------------------------------------------------------- pair search
