"""The decoder contract: :class:`Decoder`, DCT scale choice, format sniffing, warning policy.

Every decoder returns RGB ``uint8`` arrays of shape ``(H, W, 3)``, C-contiguous, on the CPU
(HWC, values 0..255), grayscale expanded to three channels. Pixels are returned as stored: EXIF
orientation is *not* applied here, because the packer writes upright pixels (field case 15).

All libjpeg-turbo backends (roi, turbojpeg, Pillow's bundled one) use the accurate integer IDCT
and fancy upsampling by default, so they agree with Pillow within a mean absolute difference of
1.0 per channel (documented bound, asserted by tests/test_decode.py; measured 0.0 on the flowers
photos). ``fast_dct`` (JDCT_IFAST) breaks that: mean 1.01, max 19 on flowers, hence off by
default. ``fast_upsample`` (merged, non-fancy chroma upsampling) changes nothing on 4:4:4 JPEGs
(every flowers photo is 4:4:4) and on 4:2:0 re-encodes of them gives mean 1.10, max 105 and is
no faster (0.37 vs 0.33 ms), so it is off by default too.

Decoder warnings (libjpeg's "Corrupt JPEG data: N extraneous bytes before marker", "Premature end
of JPEG file", ...) are never printed: each decode stores how many it saw in
``decoder.last_warnings`` and the last text in ``decoder.last_warning``; the caller applies its
policy with :func:`apply_warning_policy` (field case 12).

Pixel limit: every decoder refuses images whose header size is over ``max_pixels`` (constructor
option; None = ``shardkit.images.sniff.DEFAULT_MAX_PIXELS``) with a
:class:`~shardkit.errors.PixelLimitError`, whatever the format or backend, and opens
non-JPEG data with :func:`shardkit.images.sniff.open_image`: the function and limit the packer
uses, never Pillow's process-wide ``Image.MAX_IMAGE_PIXELS``.
"""
from __future__ import annotations

from fractions import Fraction
from typing import ClassVar, NamedTuple

import numpy as np

from shardkit.decode.resize import resize_into
from shardkit.errors import ConfigError, DecodeError, DecodeWarningError
from shardkit.validate import check_int
from shardkit.images.sniff import check_pixels, open_image, resolve_max_pixels

__all__ = [
    "Decoder", "ImageProbe", "WARNING_POLICIES", "apply_warning_policy",
    "choose_scale", "scaled_size", "is_jpeg", "pil_decode_rgb", "pil_probe", "DCT_REDUCTIONS",
    "FAST_DCT_REDUCTIONS", "loaded_library_path",
]

#: The DCT reductions libjpeg-turbo implements: M/8 for M = 1..8 (libjpeg-turbo ``jdmaster.c``,
#: ``jpeg_core_output_dimensions``; the same set ``tjGetScalingFactors`` lists below 1). A factor
#: such as 1/3 is not in it and is never used (field case 12).
DCT_REDUCTIONS: tuple[Fraction, ...] = tuple(Fraction(m, 8) for m in range(1, 9))

#: The reductions shardkit actually uses (``ImageProbe.factors``): 1/8, 1/4, 1/2 and 1.
#: libjpeg-turbo has SIMD IDCTs only for 8x8 and the reduced 4x4 / 2x2 / 1x1 outputs; its
#: 3/8, 5/8, 3/4 and 7/8 IDCTs are plain C and measured SLOWER than a full-size decode on the
#: flowers photos (full 0.71 ms; 5/8: 0.79, 3/4: 0.92, 7/8: 1.14, 1/2: 0.62 ms per image, see
#: benchmarks/bench_decode.py), so a choice among them would cost time and pixels for nothing.
FAST_DCT_REDUCTIONS: tuple[Fraction, ...] = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2),
                                             Fraction(1))

#: Policies for decoder warnings: keep the image, skip the sample, or raise.
WARNING_POLICIES = ("keep", "skip", "raise")


class ImageProbe(NamedTuple):
    """What a header read tells: original ``width``, ``height`` (pixels, as stored), whether the
    bytes are a JPEG this decoder decodes itself, and the DCT reductions it may use on them."""

    width: int
    height: int
    is_jpeg: bool
    factors: tuple[Fraction, ...]


def is_jpeg(data: bytes | memoryview) -> bool:
    """True when ``data`` starts with the JPEG SOI marker ``FF D8 FF``."""
    return bytes(data[:3]) == b"\xff\xd8\xff"


def scaled_size(width: int, height: int, factor: Fraction) -> tuple[int, int]:
    """Output size of a DCT-scaled decode: ``(ceil(width * f), ceil(height * f))``, the rounding
    libjpeg-turbo uses (``jdiv_round_up`` in ``jdmaster.c``; TurboJPEG's ``TJSCALED``)."""
    return (-(-width * factor.numerator // factor.denominator),
            -(-height * factor.numerator // factor.denominator))


def choose_scale(crop_w: float, crop_h: float, target_w: int, target_h: int,
                 factors: tuple[Fraction, ...] = DCT_REDUCTIONS) -> Fraction:
    """Pick the largest DCT reduction that still keeps the crop at least the target size.

    Args:
        crop_w, crop_h: crop size in original pixels (> 0).
        target_w, target_h: final output size in pixels (> 0).
        factors: supported reductions (Fractions in (0, 1]); others are ignored.
    Returns:
        the smallest ``f`` in ``factors`` (``f <= 1``) with ``crop_w * f >= target_w`` and
        ``crop_h * f >= target_h``; ``Fraction(1)`` when none qualifies (never upscale by DCT).
    Raises:
        ValueError: a size is not positive.
    """
    if crop_w <= 0 or crop_h <= 0 or target_w <= 0 or target_h <= 0:
        raise ValueError(f"sizes must be > 0, got crop {crop_w}x{crop_h}, "
                         f"target {target_w}x{target_h}")
    best, bn, bd = _ONE, 1, 1  # integer cross-multiplication: Fraction compares are slow
    for f in factors:
        n, d = f.numerator, f.denominator
        if 0 < n and n * bd < bn * d and crop_w * n >= target_w * d and crop_h * n >= target_h * d:
            best, bn, bd = f, n, d
    return best


_ONE = Fraction(1)


def apply_warning_policy(n_warnings: int, policy: str, what: str = "image",
                         message: str | None = None) -> bool:
    """Apply a decoder-warning policy to one decoded sample (field case 12).

    Meant for the read path, right after a decode: ``n_warnings`` is the decoder's (or the
    transform's) ``last_warnings`` of that sample, ``message`` the decoder's ``last_warning``
    when known.

    Args:
        n_warnings: libjpeg warnings counted for this sample (int >= 0; 0 = clean). Pillow does
            not report warnings, so the "pil" decoder always gives 0.
        policy: one of :data:`WARNING_POLICIES`: "keep" (use the pixels), "skip" (drop the
            sample), "raise" (stop).
        what: how to name the sample in the error, e.g. ``"shard-00003.tar:key-7"``.
        message: the last warning's text, quoted in the error (None when unknown).
    Returns:
        True to keep the sample: no warnings, or ``policy="keep"``; False to skip it
        (``policy="skip"`` and ``n_warnings > 0``).
    Raises:
        DecodeWarningError: ``policy="raise"`` and ``n_warnings > 0`` (names ``what``, the count
            and ``message``).
        ConfigError: ``policy`` not in :data:`WARNING_POLICIES`, or ``n_warnings`` not an
            int >= 0.
    """
    if policy not in WARNING_POLICIES:
        raise ConfigError(f"warning policy {policy!r} is not one of {WARNING_POLICIES}")
    n_warnings = check_int("n_warnings", n_warnings, 0, message="n_warnings must be an int >= 0 "
                           "(a decoder's last_warnings), got {value!r}")
    if n_warnings == 0 or policy == "keep":
        return True
    if policy == "skip":
        return False
    raise DecodeWarningError(f"{what}: {n_warnings} decoder warning(s), last: {message!r}")


def loaded_library_path(fragment: str) -> str | None:
    """Absolute path of a shared library mapped into this process whose file name contains
    ``fragment`` (read from ``/proc/self/maps``; None when absent or not on Linux)."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rsplit(None, 1)[-1]
                if fragment in path.rsplit("/", 1)[-1]:
                    return path
    except OSError:
        return None
    return None


def pil_probe(data: bytes | memoryview, max_pixels: int | None = None) -> tuple[int, int]:
    """(width, height) from the header via :func:`shardkit.images.sniff.open_image`.

    Raises DecodeError if unreadable, PixelLimitError (a DecodeError) over ``max_pixels``
    (None = the default limit)."""
    with open_image(data, max_pixels) as im:
        return im.size


def pil_decode_rgb(data: bytes | memoryview, reduce: int = 1,
                   max_pixels: int | None = None) -> np.ndarray:
    """Decode any Pillow-readable image to RGB uint8 (H, W, 3), C-contiguous.

    ``reduce`` (1, 2, 4 or 8) asks libjpeg for a 1/reduce DCT-scaled decode via ``Image.draft``
    (JPEG only); the result is then ``ceil(W / reduce) x ceil(H / reduce)`` (checked).
    Palette/alpha/16-bit inputs are converted with Pillow's ``convert("RGB")``; the packer is
    where they are normalised properly (field case 15). Raises DecodeError on any failure,
    including truncated data (Pillow's ``LOAD_TRUNCATED_IMAGES`` is never changed), and
    PixelLimitError (a DecodeError) when the header size is over ``max_pixels`` (None = the
    default limit; opened with :func:`shardkit.images.sniff.open_image`).
    """
    try:
        with open_image(data, max_pixels) as im:
            if reduce > 1:
                w, h = im.size
                if im.format != "JPEG":
                    raise DecodeError(f"DCT reduction 1/{reduce} needs a JPEG, got {im.format}")
                im.draft("RGB", (max(1, w // reduce), max(1, h // reduce)))
                want = scaled_size(w, h, Fraction(1, reduce))
                if im.size != want:
                    raise DecodeError(f"Pillow draft gave {im.size} for 1/{reduce} of {w}x{h}, "
                                      f"expected {want}")
            if im.mode != "RGB":
                im = im.convert("RGB")
            else:
                im.load()
            arr = np.asarray(im)  # C-contiguous; read-only when built from bytes
            return arr if arr.flags.writeable else arr.copy()  # writable like every backend
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"Pillow cannot decode image ({len(data)} bytes): {exc}") from exc


class Decoder:
    """Base class (and protocol) of every decoder in :data:`shardkit.decode.DECODERS`.

    Subclasses implement :meth:`_probe`, :meth:`_decode_scaled` and may override
    :meth:`decode_region` (the ROI decoder does). Instances are cheap, hold their native handle
    lazily, and are created per process (never pickled with an open handle).

    Args:
        fast_dct, fast_upsample: libjpeg speed flags (see ``shardkit.decode.get_decoder``).
        max_pixels: refuse images whose header ``width * height`` is over this (positive int;
            None = ``shardkit.images.sniff.DEFAULT_MAX_PIXELS``). The reader's own limit, never
            the dataset's ``normalization.max_pixels`` (see :mod:`shardkit.images.sniff`).

    Attributes:
        last_warnings: number of decoder warnings of the most recent call (0 when clean).
        last_warning: text of the last warning of the most recent call, or None.
        max_pixels: the resolved pixel limit (int).
    """

    name: ClassVar[str] = "base"
    supports_roi: ClassVar[bool] = False

    def __init__(self, fast_dct: bool = False, fast_upsample: bool = False,
                 max_pixels: int | None = None):
        self.fast_dct = bool(fast_dct)
        self.fast_upsample = bool(fast_upsample)
        self.max_pixels = resolve_max_pixels(max_pixels)
        self.last_warnings = 0
        self.last_warning: str | None = None

    @classmethod
    def available(cls) -> bool:
        """Whether this backend can run in this environment."""
        return True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why :meth:`available` is False here (one line), or None when it is available."""
        return None if cls.available() else f"decoder {cls.name!r} is unavailable"

    def info(self) -> dict:
        """Backend name, library versions and paths (for benchmark and bug reports)."""
        return {"name": self.name}

    def probe(self, data: bytes | memoryview) -> ImageProbe:
        """Read the header only; returns original size and usable DCT reductions.

        Raises DecodeError (unreadable header) and PixelLimitError (a DecodeError) when
        ``width * height > self.max_pixels``, for every format and backend."""
        probe = self._probe(data)
        check_pixels(probe.width, probe.height, self.max_pixels)
        return probe

    def _probe(self, data: bytes | memoryview) -> ImageProbe:
        """Backend header read (no limit check); the default reads it with Pillow."""
        w, h = pil_probe(data, self.max_pixels)
        return ImageProbe(w, h, False, (Fraction(1),))

    def decode(self, data: bytes | memoryview) -> np.ndarray:
        """Decode the whole image: RGB uint8 (H, W, 3) C-contiguous, values 0..255.

        JPEGs use this backend; other formats (PNG, ...) fall back to Pillow. Updates
        ``last_warnings``. Raises :class:`shardkit.errors.DecodeError` on fatal errors.
        """
        return self.decode_scaled(data, Fraction(1))

    def decode_scaled(self, data: bytes | memoryview, factor: Fraction,
                      probe: ImageProbe | None = None) -> np.ndarray:
        """Whole image decoded at DCT scale ``factor`` (from ``probe.factors``); the result is
        ``scaled_size(W, H, factor)`` (checked, DecodeError otherwise)."""
        probe = probe or self.probe(data)
        self.last_warnings, self.last_warning = 0, None
        if factor not in probe.factors:
            raise DecodeError(f"DCT scale {factor} not supported for this image by {self.name}; "
                              f"supported: {[str(f) for f in probe.factors]}")
        if not probe.is_jpeg:
            return pil_decode_rgb(data, max_pixels=self.max_pixels)
        arr = self._decode_scaled(data, factor)
        want = scaled_size(probe.width, probe.height, factor)
        if arr.shape != (want[1], want[0], 3):
            raise DecodeError(f"{self.name} decoded shape {arr.shape} at scale {factor} of "
                              f"{probe.width}x{probe.height}, expected {(want[1], want[0], 3)}")
        return arr

    def decode_region(self, data: bytes | memoryview, box: tuple[int, int, int, int],
                      factor: Fraction, probe: ImageProbe | None = None) -> np.ndarray:
        """Pixels ``[y0:y1, x0:x1]`` of the image decoded at scale ``factor``.

        ``box = (x0, y0, x1, y1)`` in *scaled* pixel coordinates, inside
        ``scaled_size(W, H, factor)``. Returns RGB uint8 ``(y1-y0, x1-x0, 3)`` C-contiguous.
        This default decodes the whole scaled image and slices; ROI-capable backends decode
        only the window, to the same pixels (at every chroma subsampling: tests/test_decode.py).
        Raises DecodeError (bad box, decode failure).
        """
        probe = probe or self.probe(data)
        full = self.decode_scaled(data, factor, probe)
        x0, y0, x1, y1 = box
        if not (0 <= x0 < x1 <= full.shape[1] and 0 <= y0 < y1 <= full.shape[0]):
            raise DecodeError(f"region {box} outside the {full.shape[1]}x{full.shape[0]} image")
        if (x0, y0, x1, y1) == (0, 0, full.shape[1], full.shape[0]):
            return full
        return np.ascontiguousarray(full[y0:y1, x0:x1])

    def decode_resize(self, data: bytes | memoryview, region: tuple[int, int, int, int],
                      factor: Fraction, box: tuple[float, float, float, float], out: np.ndarray,
                      flip: bool = False, interpolation: str = "bilinear",
                      probe: ImageProbe | None = None) -> np.ndarray:
        """Decode ``region`` (scaled coordinates, see :meth:`decode_region`) and resize its
        float ``box`` (coordinates relative to the region) into ``out`` (writable RGB uint8
        ``(H, W, 3)``), mirrored left-right when ``flip``. Returns ``out``. Pixels equal Pillow's
        ``resize(box=...)`` of the decoded region (see ``shardkit.decode.resize_into``).
        Updates ``last_warnings``; raises DecodeError."""
        arr = self.decode_region(data, region, factor, probe)
        return resize_into(arr, box, out, flip, interpolation)

    def _decode_scaled(self, data: bytes | memoryview, factor: Fraction) -> np.ndarray:
        raise NotImplementedError

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_handle", None)  # native handles are per process
        return state
