"""nvJPEG decoder through ``torchvision.io.decode_jpeg(..., device="cuda")``.

``decode`` returns the same CPU numpy contract as every decoder (so the contract test covers it);
:meth:`NvJPEGDecoder.decode_batch` is the useful path: a list of JPEG byte strings decoded in one
batched nvJPEG call, returning CUDA ``uint8`` tensors of shape ``(3, H, W)`` RGB (CHW, 0..255,
``ImageReadMode.RGB`` so gray expands). nvJPEG reports no warnings: ``last_warnings`` is 0.
``available()`` is False without CUDA. DCT scaling and ROI are not supported (scale 1 only).
"""
from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
from PIL import Image

from shardkit.decode.base import Decoder, ImageProbe, is_jpeg, pil_decode_rgb, pil_probe
from shardkit.errors import DecodeError

__all__ = ["NvJPEGDecoder"]


class NvJPEGDecoder(Decoder):
    """GPU JPEG decoder (nvJPEG via torchvision). See :class:`shardkit.decode.base.Decoder`."""

    name = "nvjpeg"

    @classmethod
    def available(cls) -> bool:
        try:
            import torch
            return bool(torch.cuda.is_available())
        except Exception:
            return False

    def info(self) -> dict:
        import torch
        import torchvision
        return {"name": self.name, "torchvision_version": torchvision.__version__,
                "cuda": torch.version.cuda,
                "device": torch.cuda.get_device_name() if self.available() else None}

    def probe(self, data: bytes | memoryview) -> ImageProbe:
        """Header via Pillow; only baseline/progressive YCbCr or gray JPEGs go to nvJPEG
        (CMYK/YCCK and everything else decode with Pillow)."""
        if not is_jpeg(data):
            w, h = pil_probe(data)
            return ImageProbe(w, h, False, (Fraction(1),))
        try:
            with Image.open(io.BytesIO(data)) as im:
                (w, h), mode = im.size, im.mode
        except Exception as exc:  # Pillow raises several unrelated types here
            raise DecodeError(f"cannot read JPEG header ({len(data)} bytes): {exc}") from exc
        return ImageProbe(w, h, mode in ("RGB", "L"), (Fraction(1),))

    def decode_batch(self, datas: list, device: str = "cuda") -> list:
        """Decode JPEGs on the GPU in one batched call.

        Args: datas: list of JPEG ``bytes``/``memoryview``. Returns: list of ``torch.uint8``
        tensors ``(3, H_i, W_i)`` RGB on ``device``. Raises DecodeError on failure.
        """
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg
        tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]
        try:
            return decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
        except RuntimeError as exc:
            raise DecodeError(f"nvjpeg cannot decode a batch of {len(datas)} JPEGs: "
                              f"{exc}") from exc

    def _decode_scaled(self, data: bytes | memoryview, factor: Fraction) -> np.ndarray:
        out = self.decode_batch([data])[0]
        return out.permute(1, 2, 0).contiguous().cpu().numpy()

    def decode_scaled(self, data, factor, probe=None):
        probe = probe or self.probe(data)
        if not probe.is_jpeg:
            self.last_warnings, self.last_warning = 0, None
            return pil_decode_rgb(data)
        return super().decode_scaled(data, factor, probe)
