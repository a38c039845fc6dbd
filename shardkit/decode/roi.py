"""ROI decoder: the ``_jpegroi`` C extension (libjpeg API of the system libjpeg-turbo).

Decodes only the crop window: rows above it are skipped (``jpeg_skip_scanlines``: entropy-decoded
but not IDCT'd), columns outside it are skipped down to iMCU alignment (``jpeg_crop_scanline``),
rows below it are never read (decompression is aborted). Combined with DCT scaling (M/8,
M = 1..8) and direct RGB output (``JCS_EXT_RGB``; grayscale expands to RGB). The result equals a
full decode at the same scale, cropped, at every chroma subsampling (tested pixel-exact on real
photos at 4:4:4, 4:2:2, 4:2:0, also through the fused resize). Where chroma is upsampled
horizontally with fancy upsampling (4:2:2 at scales above 1/8, 4:2:0 at scale 1), a cropped
decode would replicate chroma at the crop's edge columns, so the extension decodes 1 more
column on each side (at least 5 in all) and cuts them off (``ROI_EDGE_CONTEXT`` in
``_jpegroi.c``; the train transform is 0.7-1.0% slower for it on 4:2:x, unchanged on 4:4:4:
benchmarks/bench_decode.py --compare-ext). Rows need no margin: ``jpeg_skip_scanlines`` decodes
the context rows above the window.

Warnings are counted by the extension, never printed. Because rows below the window are not
read, a file truncated below the window decodes without a warning on this path: corruption is
found by the full decode at pack time (field case 14), not here.

Untrusted files: a decode stops with a :class:`~shardkit.errors.DecodeError` at scan
:attr:`ROIDecoder.max_scans` + 1 (500, TurboJPEG's limit: a crafted progressive file repeats
scans to cost minutes of CPU; real ones have about 10) and when libjpeg would need more than
:attr:`ROIDecoder.max_memory` bytes (8 bytes per pixel of ``max_pixels``, what a progressive
4-component image of that size needs, plus 32 MiB).

Library floor: built against a libjpeg-turbo below 2.0.6 (or 1.5.3 on the 1.5 branch), whose
``jpeg_skip_scanlines`` / ``jpeg_crop_scanline`` have known crashes (CVE-2017-15232,
CVE-2020-35538), the extension refuses windows and this decoder reports itself unavailable
with that reason, so ``get_decoder("auto")`` falls back to the next one with one warning.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from shardkit.decode import extensions as _ext
from shardkit.decode.base import (
    DCT_REDUCTIONS, FAST_DCT_REDUCTIONS, Decoder, ImageProbe, is_jpeg, loaded_library_path,
    pil_probe,
)
from shardkit.decode.resize import RESIZE_FILTERS, resize_into, simd_level
from shardkit.errors import DecodeError

# the optional extension; None (with the reason) when it was not built
_jpegroi, _JPEGROI_REASON = _ext.load()

__all__ = ["ROIDecoder", "resize_into", "RESIZE_FILTERS"]

_JCS_CMYK, _JCS_YCCK = 4, 5


_EIGHTHS = {f: f.numerator * (8 // f.denominator) for f in DCT_REDUCTIONS}


def _eighths(factor: Fraction) -> int:
    """M of a DCT scale M/8; DecodeError for a scale libjpeg-turbo does not implement.
    (One dict lookup: this runs per sample, and a tuple scan costs 8 Fraction comparisons.)"""
    try:
        return _EIGHTHS[factor]
    except KeyError:
        raise DecodeError(f"DCT scale {factor} is not one of "
                          f"{[str(f) for f in DCT_REDUCTIONS]}") from None


def _version(number: int) -> str:
    return f"{number // 1000000}.{number // 1000 % 1000}.{number % 1000}"


class ROIDecoder(Decoder):
    """Region-of-interest JPEG decoder. See :class:`shardkit.decode.base.Decoder`."""

    name = "roi"
    supports_roi = True
    #: a decode stops at scan max_scans + 1 (TurboJPEG's limit)
    max_scans: int = 500

    @property
    def max_memory(self) -> int:
        """Bytes libjpeg may allocate for one decode: 8 per pixel of ``max_pixels`` (a
        progressive 4-component image's coefficient buffer) plus 32 MiB."""
        return min(8 * self.max_pixels + (32 << 20), 1 << 62)

    @classmethod
    def available(cls) -> bool:
        return _jpegroi is not None and bool(_jpegroi.ROI_SAFE)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if _jpegroi is None:
            return _JPEGROI_REASON or "_jpegroi not loaded (shardkit.decode.roi._jpegroi is None)"
        if not _jpegroi.ROI_SAFE:
            return (f"_jpegroi was built against libjpeg-turbo "
                    f"{_version(_jpegroi.LIBJPEG_TURBO_VERSION_NUMBER)}, below "
                    f"{_jpegroi.ROI_FLOOR}, the floor for the jpeg_skip_scanlines / "
                    f"jpeg_crop_scanline crash fixes (CVE-2017-15232, CVE-2020-35538): ROI "
                    f"decoding is off; upgrade libjpeg-turbo's headers and reinstall")
        return None

    def _flags(self) -> int:
        return ((_jpegroi.FAST_DCT if self.fast_dct else 0)
                | (_jpegroi.FAST_UPSAMPLE if self.fast_upsample else 0))

    def info(self) -> dict:
        return {"name": self.name, "extension": getattr(_jpegroi, "__file__", None),
                "libjpeg_turbo": _version(_jpegroi.LIBJPEG_TURBO_VERSION_NUMBER),
                "library_path": loaded_library_path("libjpeg.so"),
                "scaling_factors": [str(f) for f in DCT_REDUCTIONS],
                "scaling_factors_used": [str(f) for f in FAST_DCT_REDUCTIONS],
                "fast_dct": self.fast_dct, "fast_upsample": self.fast_upsample,
                "resize_simd": simd_level(), "max_pixels": self.max_pixels,
                "max_scans": self.max_scans, "max_memory": self.max_memory}

    def _probe(self, data: bytes | memoryview) -> ImageProbe:
        if not is_jpeg(data):
            w, h = pil_probe(data, self.max_pixels)
            return ImageProbe(w, h, False, (Fraction(1),))
        try:
            w, h, _ncomp, cs, _prog = _jpegroi.header(data)
        except RuntimeError as exc:
            raise DecodeError(f"cannot read JPEG header ({len(data)} bytes): {exc}") from exc
        if cs in (_JCS_CMYK, _JCS_YCCK):  # libjpeg has no CMYK -> RGB conversion
            return ImageProbe(w, h, False, (Fraction(1),))
        return ImageProbe(w, h, True, FAST_DCT_REDUCTIONS)

    def _run(self, data, box, factor: Fraction) -> np.ndarray:
        m = _eighths(factor)
        x0, y0, x1, y1 = box
        try:
            buf, (n, msg), sw, sh = _jpegroi.decode(data, x0, y0, x1 - x0, y1 - y0, m,
                                                    self._flags(), self.max_scans,
                                                    self.max_memory)
        except (RuntimeError, ValueError) as exc:
            raise DecodeError(f"roi decode of {len(data)}-byte JPEG, region {box} at scale "
                              f"{factor}: {exc}") from exc
        self.last_warnings, self.last_warning = n, msg
        h, w = (y1 - y0, x1 - x0) if x1 > x0 else (sh, sw)
        return np.frombuffer(buf, np.uint8).reshape(h, w, 3)

    def _decode_scaled(self, data: bytes | memoryview, factor: Fraction) -> np.ndarray:
        return self._run(data, (0, 0, 0, 0), factor)

    def decode_resize(self, data, region, factor, box, out, flip=False,
                      interpolation="bilinear", probe=None):
        """Fused :meth:`decode_region` + :func:`resize_into` in one C call (no GIL, no
        intermediate numpy array); falls back to the generic path for non-JPEG data, "nearest",
        or a non-contiguous ``out``. Same arguments and result as the base method."""
        probe = probe or self.probe(data)
        code = RESIZE_FILTERS.get(interpolation, 0)
        if (not probe.is_jpeg or code == 0 or not out.flags.c_contiguous
                or not out.flags.writeable):
            return super().decode_resize(data, region, factor, box, out, flip, interpolation,
                                         probe)
        m = _eighths(factor)
        x0, y0, x1, y1 = region
        try:
            n, msg = _jpegroi.crop_resize(data, x0, y0, x1 - x0, y1 - y0, m, self._flags(),
                                          tuple(float(v) for v in box), out, out.shape[1],
                                          out.shape[0], int(bool(flip)), code,
                                          self.max_scans, self.max_memory)
        except (RuntimeError, ValueError) as exc:
            raise DecodeError(f"roi decode of {len(data)}-byte JPEG, region {region} at scale "
                              f"{factor}: {exc}") from exc
        self.last_warnings, self.last_warning = n, msg
        return out

    def decode_whole_resize(self, data, dst, region, box, out, flip=False,
                            interpolation="bilinear", probe=None) -> bool:
        """The whole image at scale 1 into ``dst`` and the float ``box`` of its ``region``
        window resized into ``out``, in one C call without the GIL: the pixels of
        :meth:`decode_scaled` (scale 1) and of :func:`resize_into` on
        ``dst[y0:y1, x0:x1]``. ``dst``: writable C-contiguous uint8 ``(H, W, 3)``, the image's
        size; ``region``: ``(x0, y0, x1, y1)`` ints inside it; ``box``: inside the region.

        False (``out`` untouched) where this call does not apply: non-JPEG data, a ``dst``
        that is not the image's size or not contiguous, over ``max_pixels``, "nearest", an
        extension without this call. Without ``probe`` (the header not read first), a
        failing decode (a damaged or CMYK JPEG...) is False too: the caller's
        :meth:`probe` + :meth:`decode_scaled` path then gives its result or its error.
        Raises DecodeError (with ``probe`` only)."""
        code = RESIZE_FILTERS.get(interpolation, 0)
        h, w = dst.shape[:2]
        if (code == 0 or not dst.flags.c_contiguous or not dst.flags.writeable
                or not out.flags.c_contiguous or not hasattr(_jpegroi, "decode_into")
                or (probe is not None and (not probe.is_jpeg
                                           or (probe.width, probe.height) != (w, h)))
                or (probe is None and (not is_jpeg(data) or w * h > self.max_pixels))):
            return False
        x0, y0, x1, y1 = region
        try:
            n, msg = _jpegroi.decode_into(data, dst, w, h, 8, self._flags(),
                                          (x0, y0, x1 - x0, y1 - y0),
                                          tuple(float(v) for v in box), out, out.shape[1],
                                          out.shape[0], int(bool(flip)), code,
                                          self.max_scans, self.max_memory)
        except (RuntimeError, ValueError) as exc:
            if probe is None:
                return False
            raise DecodeError(f"roi decode of {len(data)}-byte JPEG ({w}x{h}, whole image, then "
                              f"box {box} of region {region}): {exc}") from exc
        self.last_warnings, self.last_warning = n, msg
        return True

    def decode_region(self, data, box, factor, probe=None):
        probe = probe or self.probe(data)
        self.last_warnings, self.last_warning = 0, None
        if not probe.is_jpeg:
            return super().decode_region(data, box, factor, probe)
        return self._run(data, tuple(int(v) for v in box), factor)
