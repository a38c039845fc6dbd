"""Pillow (or Pillow-SIMD, whichever owns the ``PIL`` namespace) decoder.

DCT scaling through ``Image.draft`` supports 1/8, 1/4, 1/2 and 1 only (Pillow's
``JpegImagePlugin.draft``). Pillow does not report libjpeg warnings (its error manager drops
them), so ``last_warnings`` is always 0 here; truncated data raises DecodeError.
"""
from __future__ import annotations

import functools
import re
from fractions import Fraction

import numpy as np
import PIL
from PIL import features

from shardkit.decode.base import Decoder, ImageProbe, is_jpeg, pil_decode_rgb, pil_probe

__all__ = ["PILDecoder", "pil_info", "pil_flavor"]

_PIL_FACTORS = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1))
_POST_TAG = re.compile(r"\.post\d+")


@functools.lru_cache(maxsize=1)
def _pil_distributions() -> tuple[str, ...]:
    """Installed distributions that provide the ``PIL`` package (scans site-packages once)."""
    import importlib.metadata as metadata  # ~30 ms to import: only when asked

    return tuple(sorted(metadata.packages_distributions().get("PIL", [])))


def pil_flavor(version: str | None = None,
               distributions: list[str] | tuple[str, ...] | None = None) -> dict:
    """THE rule for "stock Pillow or Pillow-SIMD" (``shardkit.bench.env`` uses it too).

    Args:
        version: a ``PIL.__version__`` to classify; default the imported one.
        distributions: the installed distributions providing ``PIL`` (e.g. ``["pillow"]``, or
            ``["Pillow-SIMD", "pillow"]`` after one overwrote the other); default from
            ``importlib.metadata`` (read once per process).
    Returns:
        ``{"version": str, "distributions": [str], "simd": bool}``; ``simd`` is True when the
        version carries a ``.postN`` tag (Pillow-SIMD's release scheme, uploadcare's
        convention, e.g. ``9.5.0.post1``) or a distribution named Pillow-SIMD provides ``PIL``.
    """
    version = PIL.__version__ if version is None else version
    dists = list(_pil_distributions() if distributions is None else distributions)
    simd = bool(_POST_TAG.search(version)) or any(
        d.lower().replace("_", "-") == "pillow-simd" for d in dists)
    return {"version": version, "distributions": dists, "simd": simd}


def pil_info() -> dict:
    """The loaded ``PIL``: ``{"name": "pil", "pillow_version", "simd", "distributions",
    "libjpeg_turbo", "library_path"}`` (``simd`` by :func:`pil_flavor`; the libjpeg-turbo
    version Pillow was built with from ``PIL.features``, None on builds without it)."""
    flavor = pil_flavor()
    try:
        turbo = features.version("libjpeg_turbo")
    except (ValueError, KeyError):  # very old Pillow: no such feature
        turbo = None
    return {"name": "pil", "pillow_version": flavor["version"], "simd": flavor["simd"],
            "distributions": flavor["distributions"], "libjpeg_turbo": turbo,
            "library_path": PIL.__file__}


class PILDecoder(Decoder):
    """Pillow decoder; any format Pillow reads. See :class:`shardkit.decode.base.Decoder`."""

    name = "pil"

    def info(self) -> dict:
        return pil_info()

    def _probe(self, data: bytes | memoryview) -> ImageProbe:
        w, h = pil_probe(data, self.max_pixels)
        if is_jpeg(data):
            return ImageProbe(w, h, True, _PIL_FACTORS)
        return ImageProbe(w, h, False, (Fraction(1),))

    def _decode_scaled(self, data: bytes | memoryview, factor: Fraction) -> np.ndarray:
        return pil_decode_rgb(data, factor.denominator, self.max_pixels)
