"""Pillow (or Pillow-SIMD, whichever owns the ``PIL`` namespace) decoder.

DCT scaling through ``Image.draft`` supports 1/8, 1/4, 1/2 and 1 only (Pillow's
``JpegImagePlugin.draft``). Pillow does not report libjpeg warnings (its error manager drops
them), so ``last_warnings`` is always 0 here; truncated data raises DecodeError.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import PIL
from PIL import features

from shardkit.decode.base import Decoder, ImageProbe, is_jpeg, pil_decode_rgb, pil_probe

__all__ = ["PILDecoder", "pil_info"]

_PIL_FACTORS = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1))


def pil_info() -> dict:
    """Pillow version, whether it is Pillow-SIMD (a ``.postN`` version tag, uploadcare's
    convention), and the libjpeg-turbo version Pillow was built with (``PIL.features``)."""
    version = PIL.__version__
    return {
        "name": "pil",
        "pillow_version": version,
        "simd": ".post" in version,
        "libjpeg_turbo": features.version("libjpeg_turbo"),
        "library_path": PIL.__file__,
    }


class PILDecoder(Decoder):
    """Pillow decoder; any format Pillow reads. See :class:`shardkit.decode.base.Decoder`."""

    name = "pil"

    def info(self) -> dict:
        return pil_info()

    def probe(self, data: bytes | memoryview) -> ImageProbe:
        w, h = pil_probe(data)
        if is_jpeg(data):
            return ImageProbe(w, h, True, _PIL_FACTORS)
        return ImageProbe(w, h, False, (Fraction(1),))

    def _decode_scaled(self, data: bytes | memoryview, factor: Fraction) -> np.ndarray:
        return pil_decode_rgb(data, reduce=factor.denominator)
