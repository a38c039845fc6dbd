"""Decoder registry: ``DECODERS``, :func:`get_decoder`, :func:`decoder_environment`.

Backends (each a :class:`~shardkit.decode.base.Decoder`; contract in ``base.py``):

- ``"roi"``: the ``_jpegroi`` C extension (crop-window + DCT-scaled decode, fastest; built by
  ``pip install`` wherever the libjpeg headers are, ``make install`` fails if it did not);
- ``"turbojpeg"``: PyTurboJPEG, RGB requested explicitly;
- ``"pil"``: Pillow or Pillow-SIMD, whichever is installed;
- ``"nvjpeg"``: ``torchvision.io.decode_jpeg(device="cuda")``; per image here (a slow round
  trip); the batched GPU path is :func:`shardkit.decode.nvjpeg.decode_crop_batch`.

``get_decoder("auto")`` picks roi > turbojpeg > pil (nvjpeg only when asked by name) and says
once per process, on the ``shardkit.decode`` logger, which one and why: INFO when it is the
preferred one, WARNING naming the reason when it falls back (e.g. ``_jpegroi not built: ...``).
"""
from __future__ import annotations

import logging

from shardkit.decode import extensions as _ext
from shardkit.decode.base import (
    DCT_REDUCTIONS, FAST_DCT_REDUCTIONS, WARNING_POLICIES, Decoder, ImageProbe,
    apply_warning_policy, choose_scale, is_jpeg, scaled_size,
)
from shardkit.decode.nvjpeg import NvJPEGDecoder, decode_crop_batch, probe_batch
from shardkit.decode.pil import PILDecoder, pil_flavor, pil_info
from shardkit.decode.resize import RESIZE_FILTERS, resize_into, simd_level
from shardkit.decode.roi import ROIDecoder
from shardkit.decode.turbo import TurboJPEGDecoder
from shardkit.errors import ConfigError, DecodeWarningError, PixelLimitError
from shardkit.images.sniff import DEFAULT_MAX_PIXELS

__all__ = [
    "DECODERS", "AUTO_ORDER", "get_decoder", "available_decoders", "decoder_environment",
    "auto_choice", "Decoder", "ImageProbe", "DecodeWarningError", "WARNING_POLICIES",
    "apply_warning_policy", "choose_scale", "scaled_size", "is_jpeg", "DCT_REDUCTIONS",
    "FAST_DCT_REDUCTIONS", "resize_into", "RESIZE_FILTERS", "decode_crop_batch", "probe_batch",
    "pil_flavor", "DEFAULT_MAX_PIXELS", "PixelLimitError",
]

_log = logging.getLogger("shardkit.decode")
_said: set[str] = set()

#: name -> Decoder class. Every registered decoder is covered by tests/test_decode.py.
DECODERS: dict[str, type[Decoder]] = {
    "roi": ROIDecoder,
    "turbojpeg": TurboJPEGDecoder,
    "pil": PILDecoder,
    "nvjpeg": NvJPEGDecoder,
}

#: Preference order of ``get_decoder("auto")``.
AUTO_ORDER = ("roi", "turbojpeg", "pil")


def available_decoders() -> list[str]:
    """Names of the registered decoders usable in this process."""
    return [name for name, cls in DECODERS.items() if cls.available()]


def auto_choice() -> tuple[str, str | None]:
    """What ``"auto"`` resolves to here: ``(name, None)`` for the preferred (first of
    :data:`AUTO_ORDER`), ``(name, reason)`` for a fallback, the reason naming why each better
    backend is unavailable. Raises ConfigError when none is available."""
    skipped = []
    for cand in AUTO_ORDER:
        cls = DECODERS[cand]
        if cls.available():
            return cand, ("; ".join(skipped) if skipped else None)
        skipped.append(f"{cand} unavailable: {cls.unavailable_reason()}")
    raise ConfigError(f"no decoder of {AUTO_ORDER} is available: " + "; ".join(skipped))


def _say_once(level: int, message: str) -> None:
    if message not in _said:
        _said.add(message)
        _log.log(level, message)


def get_decoder(name: str = "auto", *, fast_dct: bool = False, fast_upsample: bool = False,
                max_pixels: int | None = None) -> Decoder:
    """Create a decoder by name.

    Args:
        name: a key of :data:`DECODERS` or ``"auto"`` (first available of roi, turbojpeg, pil;
            the choice and its reason are logged once per process, see the module docstring).
        fast_dct: libjpeg's fast integer IDCT (``JDCT_IFAST`` / ``TJFLAG_FASTDCT``); off by
            default (see benchmarks/bench_decode.py for the measured pixel difference).
        fast_upsample: no fancy (triangle) chroma upsampling; off by default.
        max_pixels: refuse images over this many pixels (width * height of the header) with a
            :class:`~shardkit.errors.PixelLimitError`; None = :data:`DEFAULT_MAX_PIXELS`.
            The reader's own limit, never the manifest's (see :mod:`shardkit.images.sniff`).
    Raises:
        ConfigError: unknown name, the named backend is unavailable here (says why), or a bad
            ``max_pixels``.
    """
    opts = dict(fast_dct=fast_dct, fast_upsample=fast_upsample, max_pixels=max_pixels)
    if name == "auto":
        cand, reason = auto_choice()
        if reason is None:
            _say_once(logging.INFO, f"decoder 'auto' -> {cand!r} (the preferred one)")
        else:
            _say_once(logging.WARNING, f"decoder 'auto' -> {cand!r}, not the preferred "
                                       f"{AUTO_ORDER[0]!r}: {reason}")
        return DECODERS[cand](**opts)
    if name not in DECODERS:
        raise ConfigError(f"unknown decoder {name!r}; expected 'auto' or one of "
                          f"{sorted(DECODERS)}")
    cls = DECODERS[name]
    if not cls.available():
        raise ConfigError(f"decoder {name!r} is not available: {cls.unavailable_reason()}")
    return cls(**opts)


def decoder_environment() -> dict:
    """Describe every registered backend for benchmark and bug reports.

    Returns ``{"auto": name, "auto_reason": None | str (why auto fell back), "pil":
    pil_info(), "jpegroi": {"status", "build"}, "resize_simd": {"in_use", "best"},
    "backends": {name: {"available", "unavailable_reason" | info()...}}}``.
    """
    auto, reason = auto_choice()
    env: dict = {"auto": auto, "auto_reason": reason, "pil": pil_info(),
                 "jpegroi": {"status": _ext.status_line(), "build": _ext.build_prerequisites()},
                 "resize_simd": simd_level(), "backends": {}}
    for name, cls in DECODERS.items():
        ok = cls.available()
        entry: dict = {"available": ok}
        if ok:
            try:
                entry.update(cls().info())
            except Exception as exc:  # report, never fail the benchmark on a report
                entry["info_error"] = repr(exc)
        else:
            entry["unavailable_reason"] = cls.unavailable_reason()
        env["backends"][name] = entry
    return env
