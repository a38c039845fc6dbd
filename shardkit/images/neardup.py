"""Near-duplicate images: 64-bit pHash, degenerate-image test, and exact sub-quadratic search of
all hash pairs within a Hamming distance (field case 24: near-duplicates on both sides of a split).

- :func:`phash64` - the pHash of ``imagehash.phash(Image.fromarray(rgb), hash_size=8)`` (DCT of a
  32x32 grayscale LANCZOS thumbnail, sign of the 8x8 low-frequency block against its median;
  after Zauner, "Implementation and Benchmarking of Perceptual Image Hash Functions", 2010), bit
  for bit (under Pillow 13), cheaper: the thumbnail is computed with numpy matrix products that
  reproduce Pillow's fixed-point arithmetic exactly (see :func:`thumbnail32`).
- :func:`degenerate_reason` - tiny images and near-constant ones (blank frames, "image not
  found" placeholders), whose pHashes are meaningless: every blank image hashes alike, so
  callers leave them out of near-duplicate merging.
- :func:`near_pairs` - every pair of hashes within ``threshold`` bits, by multi-index hashing
  (Norouzi, Punjani & Fleet, "Fast Search in Hamming Space with Multi-Index Hashing", CVPR 2012),
  exact: no pair missed, none made up (each candidate is verified with a popcount).
- :func:`clusters` - connected components of the pair graph (scipy.sparse.csgraph).

Pure functions of numpy arrays: no I/O, no global state beyond small caches of filter weights.
"""
from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterator
from itertools import combinations

import numpy as np

from shardkit.errors import ConfigError
from shardkit.validate import check_int

__all__ = ["PHASH_THRESHOLD", "MIN_SIDE", "FLAT_LEVELS", "FLAT_FRACTION", "phash64",
           "thumbnail32", "degenerate_reason", "near_pairs", "plan_blocks", "clusters"]

log = logging.getLogger("shardkit.neardup")

PHASH_THRESHOLD = 4
"""Default max Hamming distance (of 64 bits) between pHashes of near-duplicates: a resized or
re-encoded copy of a photo lands at 0-2 bits, two unrelated photos differ in ~32 on average."""

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
_TABLE_BITS = 22  # blocks up to this width use a dense bucket table, wider ones searchsorted
_CHUNK = 1 << 21  # candidate pairs (and probes) handled at once: bounds the working memory
_MAX_FLIPS = 1 << 16  # bit-flip patterns per block beyond which a layout is not considered


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

def _hash_array(hashes) -> np.ndarray:
    h = np.asarray(hashes)
    if h.ndim != 1:
        raise ConfigError(f"near_pairs needs a 1-D array of 64-bit hashes; got shape {h.shape}")
    if h.size == 0:
        return np.zeros(0, np.uint64)
    if h.dtype.kind == "u":
        return h.astype(np.uint64, copy=False)
    if h.dtype.kind == "i":  # two's complement bit patterns, e.g. hashes stored as int64
        return h.astype(np.int64, copy=False).view(np.uint64)
    raise ConfigError(f"near_pairs needs an integer array of 64-bit hashes (uint64); got "
                      f"dtype {h.dtype}")


def _threshold(threshold) -> int:
    return check_int("threshold", threshold, 0, 64, message="near-duplicate threshold must be a "
                     "Hamming distance, an int in 0-64; got {value!r}")


def _layout(m: int, t: int) -> list[tuple[int, int, int]]:
    """``m`` blocks of 64 bits as ``(shift, bits, radius)``: sizes as equal as possible, radius
    ``r`` for the first ``a + 1`` blocks and ``r - 1`` for the rest, where ``t = m r + a``."""
    q, rem = divmod(64, m)
    r, a = divmod(t, m)
    blocks, shift = [], 0
    for k in range(m):
        bits = q + (k < rem)
        blocks.append((shift, bits, r if k <= a else r - 1))
        shift += bits
    return blocks


def _num_flips(bits: int, rho: int) -> int:
    return sum(math.comb(bits, e) for e in range(1, rho + 1))


def _cost(n: int, blocks: list[tuple[int, int, int]]) -> float:
    """Expected work of multi-index hashing on ``n`` uniform random hashes: bucket probes plus
    candidate pairs to verify (each in units of one vectorised element operation)."""
    pairs = n * (n - 1) / 2
    cost = 0.0
    for _, bits, rho in blocks:
        if rho < 0:
            continue
        flips = _num_flips(bits, rho)
        if flips > _MAX_FLIPS:
            return math.inf
        probe = 1.0 if bits <= _TABLE_BITS else 3.0  # dense table vs searchsorted
        cost += n * (1 + flips / 2) * probe + pairs * (1 + flips) / 2.0 ** bits
    return cost


def plan_blocks(n: int, threshold: int) -> int:
    """The number of blocks ``m`` :func:`near_pairs` uses for ``n`` hashes at ``threshold``: the
    ``m`` in ``1..threshold + 1`` of least :func:`_cost`, or 0 (all pairs, in blocks) when that
    is cheaper (tiny ``n`` or large thresholds).

    The cost model: block ``k`` of ``b_k`` bits searched within radius ``rho_k`` costs ``n (1 +
    F_k / 2)`` probes (``F_k = sum_{e=1..rho_k} C(b_k, e)`` bit flips, each bucket pair probed
    from one side) plus ``C(n, 2) (1 + F_k) / 2**b_k`` candidate pairs (uniform hashes). Examples:
    n = 1,000,000, t = 4: m = 3 (22/21/21 bits, radii 1/1/0: ~25 M probes, ~8 M candidates,
    against 5e11 pairs); n = 20,000, t = 4: m = 5 (13/13/13/13/12 bits, radius 0). Real pHashes
    are not uniform (more candidates than modelled), which costs time, never exactness.
    """
    t = _threshold(threshold)
    best, best_cost = 0, n * (n - 1) / 2 * 0.5  # brute force: cheap contiguous XOR + popcount
    for m in range(1, min(t + 1, 64) + 1):
        c = _cost(n, _layout(m, t))
        if c < best_cost:
            best, best_cost = m, c
    return best


def _flips(bits: int, rho: int) -> np.ndarray:
    return np.array([sum(1 << b for b in combo) for e in range(1, rho + 1)
                     for combo in combinations(range(bits), e)], dtype=np.uint64)


def _expand(src: np.ndarray, start: np.ndarray, count: np.ndarray
            ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Pairs ``(src[k], start[k] + o)`` for ``o < count[k]``, in batches of <= _CHUNK pairs."""
    big = count > _CHUNK
    if big.any():  # split huge ranges (a bucket of many equal values) into _CHUNK pieces
        pieces = [(s, st + o, min(_CHUNK, c - o)) for s, st, c in
                  zip(src[big], start[big], count[big]) for o in range(0, int(c), _CHUNK)]
        extra = np.array(pieces, dtype=np.int64).reshape(-1, 3)
        src = np.concatenate([src[~big], extra[:, 0]])
        start = np.concatenate([start[~big], extra[:, 1]])
        count = np.concatenate([count[~big], extra[:, 2]])
    ends = np.cumsum(count)
    k0 = 0
    while k0 < len(count):
        base = ends[k0 - 1] if k0 else 0
        k1 = max(k0 + 1, int(np.searchsorted(ends, base + _CHUNK, side="right")))
        c = count[k0:k1]
        total = int(c.sum())
        if total:
            offs = np.arange(total) - np.repeat(np.cumsum(c) - c, c)
            yield np.repeat(src[k0:k1], c), np.repeat(start[k0:k1], c) + offs
        k0 = k1


def _sort_values(v: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, v[order])``: one int64 sort of ``value << k | position`` when it fits in 63
    bits (SIMD sort, several times faster than ``argsort``), else ``argsort``."""
    n = v.size
    k = max(1, (n - 1).bit_length())
    if bits + k > 63:
        order = np.argsort(v)
        return order, v[order]
    key = np.sort(((v << np.uint64(k)) | np.arange(n, dtype=np.uint64)).view(np.int64))
    key = key.view(np.uint64)
    return (key & np.uint64((1 << k) - 1)).astype(np.int64), key >> np.uint64(k)


def _cross(starts: np.ndarray, counts: np.ndarray, ia: np.ndarray, ib: np.ndarray
           ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Sorted positions of every member of bucket ``ia[k]`` paired with every member of
    ``ib[k]``."""
    ca, cb = counts[ia], counts[ib]
    single = (ca == 1) & (cb == 1)  # the common case: one pair, no expansion
    if single.any():
        yield starts[ia[single]], starts[ib[single]]
    if single.all():
        return
    ia, ib, ca = ia[~single], ib[~single], ca[~single]
    total = int(ca.sum())
    rep = np.repeat(np.arange(ia.size), ca)
    src = np.repeat(starts[ia], ca) + np.arange(total) - np.repeat(np.cumsum(ca) - ca, ca)
    yield from _expand(src, starts[ib][rep], counts[ib][rep])


def _block_candidates(sv: np.ndarray, bits: int, rho: int
                      ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Candidate pairs ``(a, b)`` of positions in the sorted block values ``sv`` (unordered,
    a != b) that differ in at most ``rho`` bits, each such pair exactly once: pairs inside a
    bucket of equal values, then, for each bit-flip pattern ``f`` (1..rho bits), the buckets of
    ``u`` and ``u ^ f``, probed from the bucket whose value has the top bit of ``f`` clear."""
    n = sv.size
    starts = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])
    counts = np.diff(np.r_[starts, n])
    pos = np.arange(n)
    later = np.repeat(starts + counts, counts) - pos - 1  # equal values after each position
    inside = later > 0
    yield from _expand(pos[inside], pos[inside] + 1, later[inside])
    if rho < 1:
        return
    uniq = sv[starts]
    dense = bits <= _TABLE_BITS
    if dense:  # value -> bucket number + 1 (0: no bucket)
        uniq = uniq.astype(np.int64)
        table = np.zeros(1 << bits, np.int32 if uniq.size < 2**31 - 1 else np.int64)
        table[uniq] = np.arange(1, uniq.size + 1)
    by_top: dict[int, list[int]] = {}
    for f in _flips(bits, rho).tolist():
        by_top.setdefault(f.bit_length() - 1, []).append(f)
    for u0 in range(0, uniq.size, _CHUNK):
        chunk = uniq[u0:u0 + _CHUNK]
        for top, flips in by_top.items():
            elig = np.flatnonzero((chunk & uniq.dtype.type(1 << top)) == 0)
            src = chunk[elig]
            elig += u0
            for f in flips:
                probe = src ^ uniq.dtype.type(f)
                if dense:
                    found = table[probe]
                    hit = np.flatnonzero(found)
                    ib = found[hit].astype(np.int64) - 1
                else:
                    k = np.minimum(np.searchsorted(uniq, probe), uniq.size - 1)
                    hit = np.flatnonzero(uniq[k] == probe)
                    ib = k[hit]
                yield from _cross(starts, counts, elig[hit], ib)


def _brute(h: np.ndarray, t: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    n = h.size
    step = max(1, _CHUNK // max(n, 1))
    for s in range(0, n - 1, step):
        e = min(n - 1, s + step)
        d = np.bitwise_count(h[s:e, None] ^ h[None, s + 1:])
        r, c = np.nonzero((d <= t) & (np.arange(s + 1, n)[None, :] > np.arange(s, e)[:, None]))
        yield r + s, c + s + 1


def near_pairs(hashes: np.ndarray, threshold: int = PHASH_THRESHOLD, *,
               blocks: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of hashes within ``threshold`` bits: exact and sub-quadratic.

    Multi-index hashing (Norouzi, Punjani & Fleet, CVPR 2012): the 64 bits are cut into ``m``
    blocks (:func:`plan_blocks`). Write ``t = m r + a`` (``0 <= a < m``); if every one of the first
    ``a + 1`` blocks differed in more than ``r`` bits and every other block in more than ``r - 1``,
    the distance would be at least ``(a + 1)(r + 1) + (m - a - 1) r = t + 1``. So two hashes
    within ``t`` bits agree within radius ``r`` on one of the first ``a + 1`` blocks, or within
    ``r - 1`` on another. For each block the block values are sorted; a position's bucket
    (equal block value) and the buckets of its block value with 1..radius bits flipped (a dense
    table for blocks up to 22 bits, ``searchsorted`` above) give the candidates, which are
    verified with a popcount of the full XOR (``np.bitwise_count``). A pair is kept only by the
    first block within whose radius it falls, so it comes out exactly once; every pair within
    ``t`` falls within some block's radius, so none is missed. Candidates are handled in
    batches of ~2 M pairs: memory is O(n + batch + output).

    Args:
        hashes: ``(n,)`` integer array of 64-bit hashes (uint64; signed ints are taken as their
            two's complement bit patterns).
        threshold: max Hamming distance, an int in 0-64 (default :data:`PHASH_THRESHOLD`).
        blocks: force the number of blocks ``m`` (1..threshold + 1), or 0 for all pairs in
            blocks of rows (a reference, quadratic); default: :func:`plan_blocks`.

    Returns:
        ``(i, j, distance)``: three ``(k,)`` int64 arrays, ``i < j`` positions in ``hashes`` and
        their Hamming distance (0..threshold), sorted by ``(i, j)``.

    Raises:
        ConfigError: ``hashes`` is not a 1-D integer array, ``threshold`` is not an int in 0-64,
            or ``blocks`` is out of range.
    """
    h = _hash_array(hashes)
    t = _threshold(threshold)
    n = h.size
    if blocks is None:
        m = plan_blocks(n, t) if n > 1 else 0
    else:
        m = check_int("blocks", blocks, 0, min(t + 1, 64), message=f"blocks must be 0 (all pairs) "
                      f"or a number of blocks in 1..{t + 1}; got {{value!r}}")
        if m and _cost(n, _layout(m, t)) == math.inf:
            raise ConfigError(f"blocks={m} at threshold {t} needs over {_MAX_FLIPS} bit-flip "
                              "probes per block; use more blocks")
    out_i, out_j, out_d = [], [], []

    def keep(a: np.ndarray, b: np.ndarray, hs: np.ndarray, order: np.ndarray | None,
             earlier: list[tuple[int, int, int]]) -> None:
        x = hs[a] ^ hs[b]
        d = np.bitwise_count(x)
        sel = np.flatnonzero(d <= t)
        x = x[sel]
        for shift, bits, rho in earlier:  # drop the pairs an earlier block yields
            if rho >= 0:
                later = np.bitwise_count((x >> np.uint64(shift)) & np.uint64((1 << bits) - 1)) > rho
                sel, x = sel[later], x[later]
        a, b = a[sel], b[sel]
        if order is not None:
            a, b = order[a], order[b]
        out_i.append(np.minimum(a, b))
        out_j.append(np.maximum(a, b))
        out_d.append(d[sel].astype(np.int64))

    if n > 1 and m == 0:
        for a, b in _brute(h, t):
            keep(a, b, h, None, [])
    elif n > 1:
        layout = _layout(m, t)
        log.debug("near_pairs: n=%d, t=%d, blocks %s", n, t, layout)
        for k, (shift, bits, rho) in enumerate(layout):
            if rho < 0:
                continue
            v = (h >> np.uint64(shift)) & np.uint64((1 << bits) - 1) if bits < 64 else h
            order, sv = _sort_values(v, bits)
            hs = h[order]  # verify in sorted order: bucket members are neighbours in memory
            for a, b in _block_candidates(sv, bits, rho):
                keep(a, b, hs, order, layout[:k])
    if not out_i:
        empty = np.zeros(0, np.int64)
        return empty, empty.copy(), empty.copy()
    i, j, d = (np.concatenate(x).astype(np.int64, copy=False) for x in (out_i, out_j, out_d))
    order = np.argsort(i * n + j, kind="stable")
    return i[order], j[order], d[order]


def clusters(n: int, i: np.ndarray, j: np.ndarray) -> list[list[int]]:
    """Connected components, with at least 2 members, of the graph of ``n`` nodes and the edges
    ``(i[k], j[k])`` (``scipy.sparse.csgraph.connected_components``, undirected).

    Args:
        n: number of nodes (positions ``0..n-1``).
        i, j: ``(k,)`` integer arrays of edge ends (e.g. from :func:`near_pairs`).

    Returns:
        The components as sorted lists of positions, the list sorted by first member.

    Raises:
        ConfigError: ``n`` is negative, ``i`` and ``j`` are not 1-D integer arrays of one length,
            or an edge end is outside ``[0, n)``.
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = check_int("n", n, 0, message="clusters needs a node count n >= 0; got {value!r}")
    i, j = np.asarray(i), np.asarray(j)
    if i.ndim != 1 or j.ndim != 1 or i.shape != j.shape or (
            i.size and (i.dtype.kind not in "iu" or j.dtype.kind not in "iu")):
        raise ConfigError(f"clusters needs two 1-D integer arrays of one length; got {i.dtype} "
                          f"{i.shape} and {j.dtype} {j.shape}")
    if i.size == 0:
        return []
    lo, hi = min(i.min(), j.min()), max(i.max(), j.max())
    if lo < 0 or hi >= n:
        raise ConfigError(f"clusters: an edge end is outside [0, {n}): min {lo}, max {hi}")
    nodes, inv = np.unique(np.concatenate([i, j]).astype(np.int64), return_inverse=True)
    k = i.size
    graph = coo_matrix((np.ones(k, np.int8), (inv[:k], inv[k:])), shape=(nodes.size,) * 2)
    _, labels = connected_components(graph, directed=False)
    order = np.argsort(labels, kind="stable")  # nodes are sorted: members come out sorted
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    groups = [nodes[g].tolist() for g in np.split(order, bounds) if g.size >= 2]
    return sorted(groups, key=lambda g: g[0])
