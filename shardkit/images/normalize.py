"""Image checking and pixel normalisation at pack time.

Every source file goes through :func:`check_image` exactly once, when the dataset is packed, so
that nothing can fail hours into training (field case 14) and every reader (libjpeg-turbo, Pillow,
nvJPEG) sees the same upright RGB pixels (field case 15):

* The media type is taken from the magic bytes (:func:`sniff`), never from the file name, so a
  PNG named ``.jpg`` is handled as a PNG.
* The pixel count is read from the header *before* anything is decoded; images over
  ``max_pixels`` (default :data:`DEFAULT_MAX_PIXELS`, Pillow's own limit) are rejected with a
  reason. The header is read by :func:`shardkit.images.sniff.open_image`, the same function (and
  limit) every decoder uses at read time, so what packs under ``--max-pixels N`` reads under
  a reader limit of N (the manifest records N; readers never take their limit from it).
  Pillow's global ``Image.MAX_IMAGE_PIXELS`` and ``ImageFile.LOAD_TRUNCATED_IMAGES`` are never
  changed: the limit is passed per call.
* The whole image is decoded (not just opened). JPEGs are fully decoded with libjpeg-turbo
  (PyTurboJPEG, RGB output), the decoder every shardkit reader uses; Pillow decodes them a second
  time only when their pixels must be normalised. libjpeg-turbo's recoverable warnings are
  recorded in ``ImageResult.warnings`` (and make the file fail under ``strict=True``); "Premature
  end of JPEG file" and any decode error reject the file as truncated/corrupt.
* A standard 8-bit YCbCr or grayscale JPEG with no EXIF rotation is stored as the original bytes
  (rule ``"original"``). Grayscale stays grayscale on disk: every reader expands it to 3 channels.
  ICC profiles are ignored (pixels are taken as stored, as torchvision and timm do); ``icc`` says
  whether one was present.
* Everything else that decodes (CMYK/YCCK JPEG, EXIF-rotated JPEG/PNG/TIFF, PNG, WebP, GIF, TIFF,
  BMP, AVIF when Pillow has the codec, 16-bit, palette, alpha) is converted to upright 8-bit RGB
  and stored as a lossless PNG without metadata. ``ImageResult.rule`` is the ``+``-joined list
  of the steps applied, in order, each described in :data:`RULES` (copied into the manifest),
  e.g. ``"exif-transpose+png"`` or ``"first-frame+alpha-over-white+png"``.
* Stored resolution (``max_side``, ``shardkit pack --max-side N``, off by default): an image whose
  *upright* longer side exceeds ``max_side``, whatever its format, is downscaled so that its longer
  side is ``max_side`` (:func:`downscaled_size`) and stored as a baseline JPEG of quality
  ``jpeg_quality`` (default 95) with 4:4:4 chroma and no metadata (rule ``...+downscaled+jpeg``,
  ``original_size`` set). A JPEG, not a PNG, because the option exists to make camera-size photos
  cheap to read: PNG is neither small nor decodable at reduced scale. Alpha is already composited
  onto white and 16-bit already reduced to 8-bit by then. Images within ``max_side`` are stored as
  without the option (byte-identical originals or lossless PNGs). The downscale is Pillow's
  ``Image.resize`` with :data:`DOWNSCALE_FILTER` (Lanczos, antialiased: the filter support grows
  with the reduction) and ``reducing_gap`` :data:`DOWNSCALE_REDUCING_GAP`; JPEG sources are
  downscaled from the pixels libjpeg-turbo decoded for the check (no second decode).
* No Python warning escapes :func:`check_image` or :func:`decode_reference`. Warnings are captured
  with ``warnings.catch_warnings``, which is process-wide: call these functions from worker
  processes, not from several threads of one process.
"""
from __future__ import annotations

import functools
import io
import warnings
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageFile, ImageOps, features

from shardkit.errors import ConfigError, DecodeError, PixelLimitError
from shardkit.validate import check_int
from shardkit.images.sniff import (
    DEFAULT_MAX_PIXELS, MEDIA_TYPES, PIL_FORMATS, open_image, resolve_max_pixels, sniff)

__all__ = ["DEFAULT_MAX_PIXELS", "BACKGROUND", "PNG_COMPRESS_LEVEL", "RULES", "MEDIA_TYPES",
           "DOWNSCALE_FILTER", "DOWNSCALE_REDUCING_GAP", "ImageResult", "sniff", "check_image",
           "downscaled_size", "decode_reference"]

#: Background that transparent pixels are composited onto (8-bit RGB white).
BACKGROUND = (255, 255, 255)

#: zlib level of the normalised PNGs (1..9). 6 is Pillow's and libpng's default.
PNG_COMPRESS_LEVEL = 6

#: Filter of the ``max_side`` downscale: Pillow's Lanczos (windowed sinc, a = 3), antialiased like
#: every Pillow resize (support scaled by the reduction factor). Sharper than FFCV's box-like
#: ``cv2.INTER_AREA`` for the same size; measured against an exact float resize in
#: benchmarks/README.md ("Stored resolution").
DOWNSCALE_FILTER = Image.Resampling.LANCZOS

#: ``reducing_gap`` of that resize: Pillow first averages integer blocks (``Image.reduce``) down
#: to at least 3x the target size, then applies Lanczos. Pillow's documentation calls 3.0
#: "indistinguishable from fair resampling in most cases"; measured on a 4000x3050 photo
#: resized to 512 px: 2.4x faster than ``None`` (86 vs 204 ms), 56.4 dB PSNR against an exact
#: float Lanczos resize before JPEG coding (58.0 dB without the gap), far above the q95
#: JPEG's own ~43 dB.
DOWNSCALE_REDUCING_GAP = 3.0

#: Normalisation steps; ``ImageResult.rule`` is ``"original"`` or a "+"-joined sequence of the
#: others.
RULES: dict[str, str] = {
    "original": "standard 8-bit YCbCr/grayscale JPEG without EXIF rotation: the source bytes are "
                "stored unchanged (ICC profiles ignored, grayscale expanded to RGB by readers)",
    "first-frame": "multi-frame image (animated GIF/WebP/PNG, multi-page TIFF): only the first "
                   "frame is kept",
    "exif-transpose": "EXIF orientation 2..8 applied with PIL.ImageOps.exif_transpose, so the "
                      "stored pixels are upright",
    "16bit-to-8bit": "16-bit samples scaled to 8 bits as v8 = v16 >> 8 (the high byte; the same "
                     "rule Pillow applies when it unpacks 16-bit RGB); 32-bit 'I' images are "
                     "first clipped to 0..65535",
    "cmyk-to-rgb": "CMYK/YCCK JPEG (Adobe-inverted or not, as Pillow decodes it) converted with "
                   "Pillow's Image.convert('RGB')",
    "alpha-over-white": "alpha (RGBA, LA, palette or colour-key transparency) composited onto "
                        "opaque white (255, 255, 255) with PIL.Image.alpha_composite, then alpha "
                        "dropped",
    "to-rgb": "non-RGB colour model (grayscale, palette, bilevel, YCbCr, float) converted with "
              "Pillow's Image.convert('RGB')",
    "png": f"stored as lossless 8-bit RGB PNG (zlib level {PNG_COMPRESS_LEVEL}), no metadata",
    "downscaled": "upright longer side over --max-side N: resized with Pillow's Image.resize "
                  "(LANCZOS, reducing_gap=3.0) so that the longer side is N and the other "
                  "floor(N * short / long), at least 1 (torchvision's Resize(max_size=N) rule); "
                  "the source's size is kept as original_width/original_height",
    "jpeg": "re-encoded as a baseline JPEG with Pillow (libjpeg-turbo), quality --jpeg-quality "
            "(default 95), 4:4:4 chroma (no subsampling), optimised Huffman tables, no metadata; "
            "grayscale sources stay 1-channel",
}

_ORIENTATION_TAG = 0x0112
_TJCS_CMYK, _TJCS_YCCK = 3, 4  # libjpeg-turbo TJCS enum (turbojpeg.h)


@dataclass(frozen=True)
class ImageResult:
    """Outcome of :func:`check_image` for one source file.

    Attributes:
        ok: True when the file is to be packed.
        reason: why it was rejected (None when ``ok``).
        media: media type sniffed from the bytes (one of :data:`MEDIA_TYPES`).
        ext: encoding of ``data``: "jpg" or "png" ("" when rejected).
        data: the bytes to store (b"" when rejected).
        rule: "original" or the "+"-joined steps of :data:`RULES` ("" when rejected).
        width, height: upright size of the stored pixels in pixels (when rejected: the header
            size if it could be read, else 0).
        warnings: decoder/metadata warnings, deduplicated, in order of first appearance, each
            prefixed by its source ("libjpeg-turbo: ..." or "pillow: ...").
        icc: whether the source carried an ICC profile (it is not applied).
        pixels: with ``check_image(keep_pixels=True)`` and ``ok``: the stored image's upright
            pixels as decoded by the check, ``(height, width, 3)`` uint8 RGB (libjpeg-turbo for
            JPEGs stored as they are and for the re-encoded ``downscaled`` JPEGs, which are
            decoded back so that hashes see what readers see; Pillow otherwise); else None.
        original_size: ``(width, height)`` of the upright source image when it was stored
            downscaled (rule contains ``downscaled``), else None.
    """

    ok: bool
    reason: str | None
    media: str
    ext: str
    data: bytes
    rule: str
    width: int
    height: int
    warnings: tuple[str, ...]
    icc: bool
    pixels: np.ndarray | None = field(default=None, repr=False, compare=False)
    original_size: tuple[int, int] | None = None


class _Reject(Exception):
    """Internal: carries a rejection reason (and the header size when known) out of the checks."""

    def __init__(self, reason: str, size: tuple[int, int] = (0, 0)):
        super().__init__(reason)
        self.reason = reason
        self.size = size


@functools.lru_cache(maxsize=1)
def _turbo():
    from turbojpeg import TurboJPEG

    try:
        return TurboJPEG()
    except (OSError, RuntimeError) as e:
        raise DecodeError(f"PyTurboJPEG cannot load libjpeg-turbo ({e}); install libturbojpeg "
                          f"(Debian: apt-get install libturbojpeg0)") from e


def _open(data: bytes, media: str, max_pixels: int) -> Image.Image:
    """:func:`shardkit.images.sniff.open_image` (the readers' own header read and pixel limit),
    with its errors turned into rejection reasons."""
    try:
        return open_image(data, max_pixels, media)
    except PixelLimitError as e:
        raise _Reject(f"over --max-pixels: {e.width}x{e.height} = {e.pixels} > {e.max_pixels}",
                      (e.width, e.height)) from e
    except DecodeError as e:
        raise _Reject(str(e)) from e


def _decode_failure(media: str, who: str, e: Exception) -> _Reject:
    kind = "truncated" if ("truncat" in str(e).lower() or isinstance(e, EOFError)) else "corrupt"
    if isinstance(e, Image.DecompressionBombError):
        kind = "over Pillow's built-in decompression-bomb limit (2 x MAX_IMAGE_PIXELS) for"
    return _Reject(f"{kind} {media.upper()}: {who} cannot decode it: {type(e).__name__}: {e}")


def _orientation(im: Image.Image) -> int:
    try:
        value = im.getexif().get(_ORIENTATION_TAG, 1)
    except Exception as e:  # noqa: BLE001 - broken EXIF is a metadata problem, not a pixel one
        warnings.warn(f"unreadable EXIF block ignored: {type(e).__name__}: {e}")
        return 1
    return value if isinstance(value, int) and 2 <= value <= 8 else 1


def _check_jpeg(data: bytes, im: Image.Image, messages: list[str]
                ) -> tuple[bool, np.ndarray]:
    """Fully decode a JPEG with libjpeg-turbo (recording warnings); return ``(cmyk, pixels)``:
    True if CMYK/YCCK, and the decoded ``(H, W, 3 or 4)`` uint8 array (RGB or CMYK)."""
    from turbojpeg import TJPF_CMYK, TJPF_RGB

    turbo = _turbo()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _w, _h, _sub, colorspace = turbo.decode_header(data)
            cmyk = colorspace in (_TJCS_CMYK, _TJCS_YCCK)
            pixels = turbo.decode(data, pixel_format=TJPF_CMYK if cmyk else TJPF_RGB)
    except (OSError, ValueError) as e:
        raise _Reject(f"corrupt JPEG: libjpeg-turbo cannot decode it: {e}", im.size) from e
    turbo_msgs = [str(w.message) for w in caught]
    messages.extend(f"libjpeg-turbo: {m}" for m in turbo_msgs)
    for m in turbo_msgs:
        if "premature end" in m.lower():
            raise _Reject(f"truncated JPEG: {m} (libjpeg-turbo)", im.size)
    return cmyk, pixels


def _sixteen_bit(im: Image.Image) -> bool:
    if im.mode.startswith("I;16") or im.mode == "I":
        return True
    for tile in im.tile[:1]:
        args = tile.args if hasattr(tile, "args") else tile[3]
        rawmode = args[0] if isinstance(args, tuple) and args else args
        if isinstance(rawmode, str) and ";16" in rawmode:
            return True
    return False


def _to_rgb(im: Image.Image, steps: list[str], sixteen: bool) -> Image.Image:
    """Return an 8-bit RGB copy of ``im`` and record the steps taken."""
    if im.mode.startswith("I;16") or im.mode == "I":
        arr = np.asarray(im)
        arr = np.clip(arr.astype(np.int64), 0, 65535) if im.mode == "I" else arr.astype(np.uint16)
        key = im.info.get("transparency")  # 16-bit colour key (PNG tRNS): keep it as alpha
        gray = Image.fromarray((arr >> 8).astype(np.uint8), "L")
        if isinstance(key, int):
            alpha = np.where(arr == key, 0, 255).astype(np.uint8)
            gray = Image.merge("LA", (gray, Image.fromarray(alpha, "L")))
        im = gray
    if sixteen:
        steps.append("16bit-to-8bit")
    if im.mode == "CMYK":
        steps.append("cmyk-to-rgb")
        im = im.convert("RGB")
    has_alpha = im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in im.info
    if has_alpha:
        steps.append("alpha-over-white")
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND + (255,))
        im = Image.alpha_composite(background, rgba).convert("RGB")
    elif im.mode != "RGB":
        steps.append("to-rgb")
        try:
            im = im.convert("RGB")
        except ValueError as e:
            raise _Reject(f"unsupported colour mode {im.mode!r}: cannot convert to RGB ({e})",
                          im.size) from e
    return im


def downscaled_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """Stored size of a ``width`` x ``height`` image under ``max_side`` (all in pixels).

    Unchanged when the longer side is at most ``max_side``; else the longer side becomes
    ``max_side`` and the other ``max(1, floor(max_side * short / long))``, in exact integer
    arithmetic. This is torchvision's rule for ``Resize(size=None, max_size=N)``
    (``torchvision.transforms.v2.functional._geometry._compute_resized_output_size``:
    ``int(max_size * short / long)``); FFCV's ``max_resolution`` also truncates
    (``(ratio * size).astype(int)`` in ``ffcv/fields/rgb_image.py``), but computes the longer side
    in floating point too, where it can land one pixel short. (``shardkit.stream.cache``'s
    ``cached_size`` rounds the shorter side instead: at most one pixel apart.)
    """
    long, short = max(width, height), min(width, height)
    if long <= max_side:
        return int(width), int(height)
    new_short = max(1, max_side * short // long)
    return (max_side, new_short) if width >= height else (new_short, max_side)


def _over(size: tuple[int, int], max_side: int | None) -> bool:
    return max_side is not None and max(size) > max_side


def _downscaled(im: Image.Image, steps: list[str], max_side: int, quality: int,
                keep_pixels: bool) -> tuple[bytes, tuple[int, int], np.ndarray | None]:
    """Resize upright 8-bit ``im`` (RGB or L) to :func:`downscaled_size` and encode it as a JPEG
    (see :data:`RULES` ``downscaled``, ``jpeg``); return ``(bytes, (w, h), pixels)``, the pixels
    decoded back from those bytes by libjpeg-turbo when ``keep_pixels``."""
    from turbojpeg import TJPF_RGB

    size = downscaled_size(im.width, im.height, max_side)
    small = im.resize(size, DOWNSCALE_FILTER, reducing_gap=DOWNSCALE_REDUCING_GAP)
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=quality, subsampling=0, optimize=True)
    steps += ["downscaled", "jpeg"]
    out = buf.getvalue()
    return out, size, _turbo().decode(out, pixel_format=TJPF_RGB) if keep_pixels else None


def _png_bytes(im: Image.Image) -> bytes:
    plain = Image.fromarray(np.ascontiguousarray(np.asarray(im, dtype=np.uint8)), "RGB")
    buf = io.BytesIO()
    plain.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def _check(data: bytes, media: str, max_pixels: int, messages: list[str],
           keep_pixels: bool = False, max_side: int | None = None,
           quality: int = 95) -> ImageResult:
    im = _open(data, media, max_pixels)
    width, height = im.size
    icc = bool(im.info.get("icc_profile"))
    cmyk, pixels = _check_jpeg(data, im, messages) if media == "jpeg" else (False, None)
    if media == "jpeg" and not cmyk and im.mode in ("RGB", "L") and _orientation(im) == 1:
        # libjpeg-turbo has just decoded every pixel (warnings recorded); a second full decode by
        # Pillow would find nothing more. JPEG EXIF (APP1) precedes the scan, so the orientation
        # is known before load().
        if not _over(im.size, max_side):
            return ImageResult(True, None, media, "jpg", data, "original", width, height, (),
                               icc, pixels if keep_pixels else None)
        # downscale from those pixels; libjpeg-turbo expands grayscale to 3 equal channels
        src = (Image.fromarray(np.ascontiguousarray(pixels[..., 0]), "L") if im.mode == "L"
               else Image.fromarray(pixels, "RGB"))
        steps: list[str] = []
        out, size, small = _downscaled(src, steps, max_side, quality, keep_pixels)
        return ImageResult(True, None, media, "jpg", out, "+".join(steps), size[0], size[1], (),
                           icc, small, original_size=(width, height))
    sixteen = _sixteen_bit(im)  # from the tile's raw mode, which load() clears
    try:
        frames = getattr(im, "n_frames", 1)  # GIF: walks every frame header
        if frames > 1:
            im.seek(0)
        im.load()
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for broken streams
        raise _decode_failure(media, "Pillow", e) from e
    orientation = _orientation(im)  # after load: PNG keeps eXIf after the image data
    steps = ["first-frame"] if frames > 1 else []
    try:
        if orientation != 1:
            steps.append("exif-transpose")
            im = ImageOps.exif_transpose(im)
        im = _to_rgb(im, steps, sixteen)
        if _over(im.size, max_side):
            original = im.size
            out, size, small = _downscaled(im, steps, max_side, quality, keep_pixels)
            return ImageResult(True, None, media, "jpg", out, "+".join(steps), size[0], size[1],
                               (), icc, small, original_size=original)
        steps.append("png")
        out = _png_bytes(im)
    except _Reject:
        raise
    except Exception as e:  # noqa: BLE001
        raise _decode_failure(media, "Pillow", e) from e
    return ImageResult(True, None, media, "png", out, "+".join(steps), im.width, im.height, (),
                       icc, np.asarray(im, dtype=np.uint8) if keep_pixels else None)


def check_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS,
                strict: bool = False, keep_pixels: bool = False, max_side: int | None = None,
                jpeg_quality: int = 95) -> ImageResult:
    """Check one source file by decoding it completely, and say what to store.

    Args:
        data: the file's bytes (any bytes-like object).
        max_pixels: largest accepted ``width * height`` of the (first frame's) header size;
            positive int. Checked before decoding. Default: Pillow's limit, 89,478,485.
        strict: reject files that decode only with warnings (libjpeg-turbo "Corrupt JPEG data"
            and friends, or Pillow metadata warnings).
        keep_pixels: also return the decoded upright RGB pixels (:attr:`ImageResult.pixels`),
            for hashes computed from the same decode (pack's near-duplicate pHash).
        max_side: None (default: full resolution), or an int >= 1: an image whose upright
            longer side exceeds it is stored downscaled to it as a JPEG (module docstring;
            rule ``...downscaled+jpeg``, :attr:`ImageResult.original_size` set).
        jpeg_quality: quality (1-100) of those JPEGs; unused without ``max_side``.

    Returns:
        :class:`ImageResult`. A rejected file gets ``ok=False`` and a ``reason`` such as
        "empty file (0 bytes)", "not an image (sniffed: unknown)", "truncated JPEG: ...",
        "corrupt PNG header: ...", "over --max-pixels: 10000x10000 = 100000000 > 89478485" or
        "JPEG decodes only with warnings (strict): ...". Accepted files carry the bytes to store
        (``data``, encoding ``ext``), the ``rule`` applied and the upright ``width``/``height``.

    Raises:
        ConfigError: ``max_pixels`` is not a positive int, ``max_side`` is not None or an
            int >= 1, ``jpeg_quality`` is not an int in 1..100, ``data`` is not bytes-like, or
            ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` was set to True by other code.
        DecodeError: PyTurboJPEG cannot find the libjpeg-turbo library.
    """
    resolve_max_pixels(max_pixels)  # ConfigError unless a positive int
    max_side = check_int("max_side", max_side, 1, optional=True,
                         message="max_side={value!r}: expected None or an int >= 1 (pixels)")
    jpeg_quality = check_int("jpeg_quality", jpeg_quality, 1, 100,
                             message="jpeg_quality={value!r}: expected an int from 1 to 100")
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise ConfigError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True (set by other code in this "
                          "process); it makes Pillow pad truncated images silently, so shardkit "
                          "refuses to check images until it is False again")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigError(f"check_image needs the file's bytes, got {type(data).__name__}")
    data = bytes(data)
    media = sniff(data)

    def rejected(reason: str, size: tuple[int, int] = (0, 0), msgs: tuple[str, ...] = ()):
        return ImageResult(False, reason, media, "", b"", "", size[0], size[1], msgs, False)

    if not data:
        return rejected("empty file (0 bytes)")
    if media == "unknown":
        return rejected("not an image (sniffed: unknown)")
    if media == "heif":
        return rejected("HEIF/HEIC not decodable: Pillow has no HEIF codec (needs pillow-heif)")
    if media == "avif" and not features.check("avif"):
        return rejected("AVIF not decodable: this Pillow build has no AVIF codec (libavif)")
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = _check(data, media, max_pixels, messages, keep_pixels, max_side,
                            jpeg_quality)
        except _Reject as r:
            result = rejected(r.reason, r.size)
    for w in caught:
        if not issubclass(w.category, Image.DecompressionBombWarning):  # limits are ours
            messages.append(f"pillow: {w.message}")
    found = tuple(dict.fromkeys(messages))
    if result.ok and strict and found:
        return rejected(f"{media.upper()} decodes only with warnings (strict): " + "; ".join(found),
                        (result.width, result.height), found)
    return ImageResult(result.ok, result.reason, media, result.ext, result.data, result.rule,
                       result.width, result.height, found, result.icc, result.pixels,
                       result.original_size)


def decode_reference(data: bytes, max_pixels: int | None = None) -> np.ndarray:
    """Decode stored bytes the way every shardkit reader must: the reference pixels.

    Pillow decode of the bytes as stored (no EXIF rotation: stored pixels are upright by
    construction), converted with ``Image.convert("RGB")`` (grayscale expanded to 3 channels).
    ``max_pixels``: the reader's pixel limit (None = :data:`DEFAULT_MAX_PIXELS`; the
    reader's own, never the dataset's ``normalization.max_pixels``).

    Returns:
        numpy uint8 array of shape (H, W, 3), C-contiguous, HWC, RGB order, values 0..255.

    Raises:
        DecodeError: the bytes are not an image Pillow can decode (PixelLimitError, a
            DecodeError, when over ``max_pixels``).
    """
    data = bytes(data)
    media = sniff(data)
    if media not in PIL_FORMATS:
        raise DecodeError(f"not a decodable image (sniffed: {media}, {len(data)} bytes)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            im = open_image(data, max_pixels, media)
            im.load()
            rgb = im.convert("RGB")
        except DecodeError:
            raise
        except Exception as e:  # noqa: BLE001
            raise DecodeError(f"{media.upper()} cannot be decoded: {type(e).__name__}: {e}") from e
    return np.ascontiguousarray(np.asarray(rgb, dtype=np.uint8))
