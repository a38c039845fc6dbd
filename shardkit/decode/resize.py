"""Pillow-exact resize into a caller buffer: :func:`resize_into`, :data:`RESIZE_FILTERS`.

Its own module so that ``base`` (the generic ``Decoder.decode_resize``) and ``roi`` (the fused
decoder) both import it without importing each other. The C path is ``_jpegroi.resize``
(``_resample.c``); without the extension Pillow itself does the work, same pixels.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from shardkit.decode import extensions as _ext

__all__ = ["RESIZE_FILTERS", "resize_into", "simd_level"]

_jpegroi, _ = _ext.load()

#: interpolation name -> Pillow filter code (``PIL.Image.Resampling``; same codes in
#: ``_resample.h``).
RESIZE_FILTERS = {"nearest": 0, "bilinear": 2, "bicubic": 3, "box": 4}

_SIMD_NAMES = ("scalar", "sse4.1", "avx2")


def simd_level() -> dict:
    """Which horizontal-pass implementation the C resize uses: ``{"in_use", "best"}``, each
    "scalar", "sse4.1" or "avx2" (None, None without the extension)."""
    if _jpegroi is None:
        return {"in_use": None, "best": None}
    level, best = _jpegroi.simd_level()
    return {"in_use": _SIMD_NAMES[level], "best": _SIMD_NAMES[best]}


def resize_into(src: np.ndarray, box: tuple[float, float, float, float], out: np.ndarray,
                flip: bool = False, interpolation: str = "bilinear") -> np.ndarray:
    """Resize the float ``box`` of ``src`` into ``out`` (optionally mirrored left-right).

    Args:
        src: RGB uint8 ``(h, w, 3)``. box: ``(x0, y0, x1, y1)`` in src pixels (floats, inside src).
        out: writable RGB uint8 ``(H, W, 3)``; receives the result. flip: mirror horizontally.
        interpolation: "bilinear" | "bicubic" | "box" | "nearest".
    Returns:
        ``out``. The pixels equal Pillow's ``Image.resize((W, H), filter, box=box)`` (then
        mirrored) bit for bit on stock Pillow 13 (the C path reimplements Pillow's
        ``Resample.c``: same float box, 22-bit fixed point, pass order); "nearest", a missing
        extension, or a non-contiguous ``out`` use Pillow itself.
    Raises:
        ValueError: box outside src, bad shapes, or unknown interpolation.
    """
    if interpolation not in RESIZE_FILTERS:
        raise ValueError(f"interpolation {interpolation!r} not in {sorted(RESIZE_FILTERS)}")
    code = RESIZE_FILTERS[interpolation]
    h, w = src.shape[:2]
    oh, ow = out.shape[:2]
    if _jpegroi is not None and code != 0 and out.flags.c_contiguous and out.flags.writeable:
        _jpegroi.resize(np.ascontiguousarray(src), w, h, tuple(float(v) for v in box), out,
                        ow, oh, int(bool(flip)), code)
        return out
    img = Image.frombuffer("RGB", (w, h), np.ascontiguousarray(src), "raw", "RGB", 0, 1)
    res = np.asarray(img.resize((ow, oh), code, box=tuple(box)))
    np.copyto(out, res[:, ::-1] if flip else res)
    return out
