"""PyTurboJPEG decoder (TurboJPEG API of the system libjpeg-turbo).

RGB output is always requested explicitly (``TJPF_RGB``; PyTurboJPEG's default is BGR, field
case 12). Grayscale JPEGs come out as 3 equal channels; CMYK/YCCK JPEGs go to Pillow. DCT
scaling uses the reductions of ``tjGetScalingFactors`` that are in ``FAST_DCT_REDUCTIONS``.
PyTurboJPEG turns libjpeg warnings into Python ``UserWarning``s; they are caught, counted
(distinct messages, since the wrapper reads the header twice) into ``last_warnings`` and never
reach stderr. ``fast_dct`` / ``fast_upsample`` map to ``TJFLAG_FASTDCT`` /
``TJFLAG_FASTUPSAMPLE``.
"""
from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np

from shardkit.decode.base import (
    FAST_DCT_REDUCTIONS, Decoder, ImageProbe, is_jpeg, loaded_library_path, pil_probe,
)
from shardkit.errors import DecodeError

__all__ = ["TurboJPEGDecoder"]

_TJCS_CMYK, _TJCS_YCCK = 3, 4


class TurboJPEGDecoder(Decoder):
    """PyTurboJPEG decoder. See :class:`shardkit.decode.base.Decoder` for the contract."""

    name = "turbojpeg"

    @classmethod
    def available(cls) -> bool:
        return cls.unavailable_reason() is None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import turbojpeg
            turbojpeg.TurboJPEG()
        except Exception as exc:  # module missing or libturbojpeg not found
            return (f"PyTurboJPEG or libturbojpeg is missing ({type(exc).__name__}: {exc}; "
                    f"Debian: apt-get install libturbojpeg0)")
        return None

    def _tj(self):
        tj = self.__dict__.get("_handle")
        if tj is None:
            import turbojpeg
            tj = self._handle = turbojpeg.TurboJPEG()
            self._all_factors = tuple(sorted(Fraction(n, d) for n, d in tj.scaling_factors
                                             if Fraction(n, d) <= 1))
            self._factors = tuple(f for f in FAST_DCT_REDUCTIONS if f in self._all_factors)
        return tj

    def info(self) -> dict:
        import turbojpeg
        tj = self._tj()
        return {"name": self.name, "pyturbojpeg_version": turbojpeg.__version__,
                "library_path": (loaded_library_path("libturbojpeg")
                                 or tj._TurboJPEG__find_turbojpeg()),
                "scaling_factors": [str(f) for f in self._all_factors],
                "scaling_factors_used": [str(f) for f in self._factors],
                "fast_dct": self.fast_dct, "fast_upsample": self.fast_upsample}

    def _probe(self, data: bytes | memoryview) -> ImageProbe:
        if not is_jpeg(data):
            w, h = pil_probe(data, self.max_pixels)
            return ImageProbe(w, h, False, (Fraction(1),))
        tj = self._tj()
        try:
            with warnings.catch_warnings():  # header warnings are counted again by the decode
                warnings.simplefilter("ignore")
                w, h, _sub, cs = tj.decode_header(data)
        except OSError as exc:
            raise DecodeError(f"turbojpeg cannot read JPEG header ({len(data)} bytes): "
                              f"{exc}") from exc
        if w <= 0 or h <= 0:  # libjpeg reports "no image" as a mere warning
            raise DecodeError(f"turbojpeg found no image in {len(data)} bytes of JPEG data")
        if cs in (_TJCS_CMYK, _TJCS_YCCK):  # TurboJPEG cannot convert these to RGB
            return ImageProbe(w, h, False, (Fraction(1),))
        return ImageProbe(w, h, True, self._factors)

    def _decode_scaled(self, data: bytes | memoryview, factor: Fraction) -> np.ndarray:
        import turbojpeg
        tj = self._tj()
        flags = ((turbojpeg.TJFLAG_FASTDCT if self.fast_dct else 0)
                 | (turbojpeg.TJFLAG_FASTUPSAMPLE if self.fast_upsample else 0))
        sf = None if factor == 1 else (factor.numerator, factor.denominator)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                arr = tj.decode(data, pixel_format=turbojpeg.TJPF_RGB, scaling_factor=sf,
                                flags=flags)
            except OSError as exc:
                raise DecodeError(f"turbojpeg cannot decode JPEG ({len(data)} bytes): "
                                  f"{exc}") from exc
        # PyTurboJPEG reads the header twice per decode, so a header warning arrives twice:
        # count distinct messages
        messages = [str(w.message) for w in caught]
        self.last_warnings = len(set(messages))
        self.last_warning = messages[-1] if messages else None
        return arr

