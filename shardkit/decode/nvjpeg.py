"""Batched GPU decode + crop + resize: :func:`decode_crop_batch` (and the per-image
:class:`NvJPEGDecoder` of the registry).

:func:`decode_crop_batch` is the GPU path: the JPEGs of a batch are decoded by ONE
``torchvision.io.decode_jpeg(list, device=device)`` call (nvJPEG's batched decoder on CUDA;
libjpeg-turbo image by image on the CPU, so CPU tests run the very same code), the images
nvJPEG cannot take (non-JPEG, CMYK/YCCK JPEG) are decoded by Pillow on the CPU and uploaded,
and every image is cropped, resized (antialiased) and mirrored on ``device`` with
``torchvision.transforms.v2.functional``. Nothing goes back to the host.

Compared with the CPU fused transform (:func:`shardkit.transforms.make_transform`, Pillow's
22-bit fixed-point resize of a float box) for the same boxes, on the flowers sample decoded on
the CPU (tests/test_decode.py): train crops (``crop_first=True``, whole-pixel boxes) differ by a
mean absolute 0.008 per channel, max 1; eval (``crop_first=False``) by 0.011, max 2. The
differences are rounding only: torch's antialiased resize is Pillow's filter computed with
other rounding. On CUDA, nvJPEG's IDCT/upsampling adds its own small differences.
nvJPEG reports no libjpeg warnings, so there is no warning count on this path.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from shardkit.decode import extensions as _ext
from shardkit.decode.base import Decoder, ImageProbe, is_jpeg, pil_decode_rgb, pil_probe
from shardkit.errors import ConfigError, DecodeError, PixelLimitError
from shardkit.validate import check_int
from shardkit.images.sniff import check_pixels, open_image, resolve_max_pixels

__all__ = ["NvJPEGDecoder", "BatchProbe", "probe_batch", "decode_crop_batch"]

_log = logging.getLogger("shardkit.decode")
_jpegroi, _ = _ext.load()
_JCS_CMYK, _JCS_YCCK = 4, 5  # libjpeg J_COLOR_SPACE
_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


class BatchProbe(NamedTuple):
    """Header facts of one image: original ``width``, ``height`` (pixels, as stored) and
    whether ``decode_jpeg`` takes it (``native``: a JPEG that is not CMYK/YCCK); the others are
    decoded by Pillow on the CPU."""

    width: int
    height: int
    native: bool


def probe_batch(datas: Sequence, max_pixels: int | None = None) -> list[BatchProbe]:
    """Read the headers of a batch (no pixel decoding), e.g. to draw the crop boxes.

    Args:
        datas: N encoded images (bytes-like). max_pixels: pixel limit (None = the default
            ``shardkit.images.sniff.DEFAULT_MAX_PIXELS``; the reader's own limit, never the
            manifest's).
    Returns:
        N :class:`BatchProbe`. JPEG headers are read by the ``_jpegroi`` extension when built
        (libjpeg, no GIL), else by Pillow.
    Raises:
        DecodeError naming the index (unreadable header), PixelLimitError (over the limit).
    """
    limit = resolve_max_pixels(max_pixels)
    out = []
    for i, data in enumerate(datas):
        try:
            if is_jpeg(data) and _jpegroi is not None:
                try:
                    w, h, _n, cs, _prog = _jpegroi.header(data)
                except RuntimeError as exc:
                    raise DecodeError(f"cannot read JPEG header: {exc}") from exc
                native = cs not in (_JCS_CMYK, _JCS_YCCK)
            else:
                with open_image(data, limit) as im:
                    (w, h), native = im.size, im.format == "JPEG" and im.mode in ("RGB", "L")
            check_pixels(w, h, limit)
        except PixelLimitError:
            raise
        except DecodeError as exc:
            raise DecodeError(f"image {i} of {len(datas)} ({len(data)} bytes): {exc}") from exc
        out.append(BatchProbe(w, h, native))
    return out


def _cpu_decode(data, max_pixels: int, device):
    """Pillow decode (any format, CMYK converted) -> uint8 (3, H, W) on ``device``."""
    import torch
    arr = pil_decode_rgb(data, max_pixels=max_pixels)
    return torch.from_numpy(arr).permute(2, 0, 1).to(device)


def _decode_all(datas: Sequence, probes: list[BatchProbe], max_pixels: int, device) -> list:
    """Decode every image to uint8 (3, H, W) on ``device``: one batched ``decode_jpeg`` call
    for the native JPEGs; Pillow for the rest and for any image the batched call rejects."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    images: list = [None] * len(datas)
    native = [i for i, p in enumerate(probes) if p.native]
    if native:
        tensors = [torch.frombuffer(bytearray(datas[i]), dtype=torch.uint8) for i in native]
        try:
            decoded = decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
        except RuntimeError as exc:  # the batch failed as a whole: find the culprit(s)
            _log.warning("batched decode_jpeg of %d JPEGs on %s failed (%s); decoding them one "
                         "by one", len(native), device, exc)
            decoded = []
            for t in tensors:
                try:
                    decoded.append(decode_jpeg(t, mode=ImageReadMode.RGB, device=device))
                except RuntimeError:
                    decoded.append(None)  # left to Pillow below, which names the error
        for i, img in zip(native, decoded):
            images[i] = img
    for i, img in enumerate(images):
        if img is None:
            try:
                images[i] = _cpu_decode(datas[i], max_pixels, device)
            except DecodeError as exc:
                raise DecodeError(f"image {i} of {len(datas)}: {exc}") from exc
        p = probes[i]
        if tuple(images[i].shape) != (3, p.height, p.width):
            raise DecodeError(f"image {i} of {len(datas)}: decoded shape "
                              f"{tuple(images[i].shape)}, header says (3, {p.height}, "
                              f"{p.width})")
    return images


def decode_crop_batch(datas: Sequence, boxes: Sequence, flips: Sequence, size: int, device,
                      interpolation: str = "bilinear", *, crop_first: bool = True,
                      max_pixels: int | None = None, probes: list[BatchProbe] | None = None):
    """Decode a batch, crop each image to its box, resize to ``size x size``, mirror.

    Args:
        datas: N encoded images (bytes-like; JPEG on the fast path, anything Pillow reads).
        boxes: N boxes ``(x0, y0, x1, y1)`` in ORIGINAL pixels (floats allowed), inside the
            image, ``x0 < x1``, ``y0 < y1``: ``sample_crop_params`` boxes for train,
            ``shardkit.transforms.eval_crop_box`` for eval.
        flips: N bools: mirror left-right after resizing.
        size: output side S in pixels (int >= 1).
        device: ``torch.device`` or string ("cuda", "cuda:1", "cpu"): where decoding (CUDA:
            nvJPEG) and the crop/resize run and where the result lives.
        interpolation: "bilinear" | "bicubic" (antialiased) | "nearest".
        crop_first: True (train; torchvision ``RandomResizedCrop``): cut the box, rounded to
            whole pixels, then resize it to S x S. False (eval; torchvision ``Resize`` +
            ``CenterCrop``): resize the whole image by ``S / box size`` (rounded to whole
            pixels), then cut the S x S box, so the filter sees the pixels around it and the
            fractional eval box costs no shift.
        max_pixels: pixel limit (None = default; the reader's own, never the manifest's).
            probes: the :func:`probe_batch` result when the
            caller already read the headers (to draw the boxes), so they are not read twice.
    Returns:
        ``torch.uint8`` tensor ``(N, 3, S, S)``, RGB, values 0..255, contiguous, on ``device``.
    Raises:
        DecodeError (naming the image index) for undecodable data; PixelLimitError over the
        limit; ConfigError for mismatched lengths, a bad size, box or interpolation.
    """
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    n = len(datas)
    if len(boxes) != n or len(flips) != n:
        raise ConfigError(f"decode_crop_batch needs one box and one flip per image: {n} "
                          f"images, {len(boxes)} boxes, {len(flips)} flips")
    size = check_int("size", size, 1, message="size must be a positive int, got {value!r}")
    if interpolation not in _INTERPOLATIONS:
        raise ConfigError(f"interpolation {interpolation!r} is not one of {_INTERPOLATIONS}")
    device = torch.device(device)
    limit = resolve_max_pixels(max_pixels)
    probes = probe_batch(datas, limit) if probes is None else probes
    out = torch.empty((n, 3, size, size), dtype=torch.uint8, device=device)
    if n == 0:
        return out
    images = _decode_all(datas, probes, limit, device)
    mode = InterpolationMode(interpolation)
    for i, (img, box, flip) in enumerate(zip(images, boxes, flips)):
        x0, y0, x1, y1 = (float(v) for v in box)
        h, w = img.shape[1:]
        if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
            raise ConfigError(f"box {tuple(box)} of image {i} is empty or outside its "
                              f"{w}x{h} pixels")
        if crop_first:
            left, top, right, bottom = round(x0), round(y0), round(x1), round(y1)
            right, bottom = max(right, left + 1), max(bottom, top + 1)
            res = F.resized_crop(img, top, left, bottom - top, right - left, [size, size],
                                 interpolation=mode, antialias=True)
        else:
            sx, sy = size / (x1 - x0), size / (y1 - y0)
            rw, rh = max(size, round(w * sx)), max(size, round(h * sy))
            left, top = min(round(x0 * sx), rw - size), min(round(y0 * sy), rh - size)
            res = F.resize(img, [rh, rw], interpolation=mode, antialias=True)
            res = res[:, top:top + size, left:left + size]
        out[i] = F.horizontal_flip(res) if flip else res
    return out


class NvJPEGDecoder(Decoder):
    """GPU JPEG decoder (nvJPEG via torchvision), per image. See
    :class:`shardkit.decode.base.Decoder`.

    Cost: :meth:`decode` copies one image to the GPU, runs a one-image nvJPEG decode, waits for
    it and copies the pixels back to the host: a round trip per image, slower than the CPU
    decoders (and logged once as a warning). It exists so the registry contract (CPU numpy
    out) holds for "nvjpeg" too. For training use :func:`decode_crop_batch` (batched, stays on
    the device) or :meth:`decode_batch`. ``available()`` is False without CUDA; DCT scaling and
    ROI are not supported (scale 1 only); nvJPEG reports no warnings (``last_warnings`` is 0).
    """

    name = "nvjpeg"
    _warned = False

    @classmethod
    def available(cls) -> bool:
        try:
            import torch
            return bool(torch.cuda.is_available())
        except Exception:
            return False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None if cls.available() else "CUDA is not available (torch.cuda.is_available())"

    def info(self) -> dict:
        import torch
        import torchvision
        return {"name": self.name, "torchvision_version": torchvision.__version__,
                "cuda": torch.version.cuda,
                "device": torch.cuda.get_device_name() if self.available() else None}

    def _probe(self, data: bytes | memoryview) -> ImageProbe:
        """Header via :func:`probe_batch`; only YCbCr/gray JPEGs go to nvJPEG (CMYK/YCCK and
        everything else decode with Pillow)."""
        if not is_jpeg(data):
            w, h = pil_probe(data, self.max_pixels)
            return ImageProbe(w, h, False, (Fraction(1),))
        p = probe_batch([data], self.max_pixels)[0]
        return ImageProbe(p.width, p.height, p.native, (Fraction(1),))

    def decode_batch(self, datas: list, device: str = "cuda") -> list:
        """Decode whole images in one batched call (no crop, no resize).

        Args: datas: list of encoded images (``bytes``/``memoryview``; non-JPEG and CMYK go
        through Pillow). Returns: list of ``torch.uint8`` tensors ``(3, H_i, W_i)`` RGB on
        ``device``. Raises DecodeError naming the image index.
        """
        return _decode_all(datas, probe_batch(datas, self.max_pixels), self.max_pixels, device)

    def _decode_scaled(self, data: bytes | memoryview, factor: Fraction) -> np.ndarray:
        if not NvJPEGDecoder._warned:
            NvJPEGDecoder._warned = True
            _log.warning("nvjpeg decoder used per image: one GPU round trip per image (slower "
                         "than the CPU decoders); use shardkit.decode.nvjpeg.decode_crop_batch")
        out = self.decode_batch([data])[0]
        return out.permute(1, 2, 0).contiguous().cpu().numpy()
