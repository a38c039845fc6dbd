"""Decoder registry: ``DECODERS``, :func:`get_decoder`, :func:`decoder_environment`.

Backends (each a :class:`~shardkit.decode.base.Decoder`; contract in ``base.py``):

- ``"roi"``: the optional ``_jpegroi`` C extension (crop-window + DCT-scaled decode, fastest);
- ``"turbojpeg"``: PyTurboJPEG, RGB requested explicitly;
- ``"pil"``: Pillow or Pillow-SIMD, whichever is installed;
- ``"nvjpeg"``: ``torchvision.io.decode_jpeg(device="cuda")``, batched; needs CUDA.

``get_decoder("auto")`` picks roi > turbojpeg > pil (nvjpeg only when asked by name).
"""
from __future__ import annotations

from shardkit.decode.base import (
    DCT_REDUCTIONS, FAST_DCT_REDUCTIONS, WARNING_POLICIES, Decoder, DecodeWarningError, ImageProbe,
    apply_warning_policy, choose_scale, is_jpeg, scaled_size,
)
from shardkit.decode.nvjpeg import NvJPEGDecoder
from shardkit.decode.pil import PILDecoder, pil_info
from shardkit.decode.roi import RESIZE_FILTERS, ROIDecoder, resize_into
from shardkit.decode.turbo import TurboJPEGDecoder
from shardkit.errors import ConfigError

__all__ = [
    "DECODERS", "AUTO_ORDER", "get_decoder", "available_decoders", "decoder_environment",
    "Decoder", "ImageProbe", "DecodeWarningError", "WARNING_POLICIES", "apply_warning_policy",
    "choose_scale", "scaled_size", "is_jpeg", "DCT_REDUCTIONS", "FAST_DCT_REDUCTIONS",
    "resize_into", "RESIZE_FILTERS",
]

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


def get_decoder(name: str = "auto", *, fast_dct: bool = False,
                fast_upsample: bool = False) -> Decoder:
    """Create a decoder by name.

    Args:
        name: a key of :data:`DECODERS` or ``"auto"`` (first available of roi, turbojpeg, pil).
        fast_dct: libjpeg's fast integer IDCT (``JDCT_IFAST`` / ``TJFLAG_FASTDCT``); off by
            default (see benchmarks/bench_decode.py for the measured pixel difference).
        fast_upsample: no fancy (triangle) chroma upsampling; off by default.
    Raises:
        ConfigError: unknown name, or the named backend is unavailable here (says why).
    """
    if name == "auto":
        for cand in AUTO_ORDER:
            if DECODERS[cand].available():
                return DECODERS[cand](fast_dct=fast_dct, fast_upsample=fast_upsample)
        raise ConfigError(f"no decoder of {AUTO_ORDER} is available")
    if name not in DECODERS:
        raise ConfigError(f"unknown decoder {name!r}; expected 'auto' or one of "
                          f"{sorted(DECODERS)}")
    cls = DECODERS[name]
    if not cls.available():
        why = {"roi": "the optional C extension shardkit.decode._jpegroi is not built "
                      "(pip install -e . with libjpeg-turbo headers)",
               "nvjpeg": "CUDA is not available",
               "turbojpeg": "PyTurboJPEG or libturbojpeg is missing"}.get(name, "unavailable")
        raise ConfigError(f"decoder {name!r} is not available: {why}")
    return cls(fast_dct=fast_dct, fast_upsample=fast_upsample)


def decoder_environment() -> dict:
    """Describe every registered backend: availability and ``info()`` (versions, paths), plus
    which one ``"auto"`` resolves to. Used by benchmarks to report what really ran."""
    env: dict = {"auto": get_decoder("auto").name, "pil": pil_info(), "backends": {}}
    for name, cls in DECODERS.items():
        ok = cls.available()
        entry: dict = {"available": ok}
        if ok:
            try:
                entry.update(cls().info())
            except Exception as exc:  # report, never fail the benchmark on a report
                entry["info_error"] = repr(exc)
        env["backends"][name] = entry
    return env
