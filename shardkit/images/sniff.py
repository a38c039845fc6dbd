"""Open encoded images under ONE pixel limit, at pack time and at read time alike.

The packer (:func:`shardkit.images.normalize.check_image`, ``pack --max-pixels N``) and every decoder
(``shardkit.decode.get_decoder(..., max_pixels=N)``) open images through :func:`open_image` and
check sizes with :func:`check_pixels`, so an image the packer accepted under a limit is never
refused by a reader given the same limit.

A reader's limit is its own: :data:`DEFAULT_MAX_PIXELS`, or what its caller passes. The limit a
dataset was packed with (the manifest's ``normalization.max_pixels``) is a record, never a read
limit: a dataset is untrusted input, and a crafted manifest must not lift the bound that keeps a
small file with a huge header (a 1 MB 20000 x 20000 PNG) from taking gigabytes in every reader.
A dataset packed with ``--max-pixels`` above the default is read by passing that limit.

Pillow's process-wide ``Image.MAX_IMAGE_PIXELS`` is never read nor changed: ``Image.open``
applies it (a warning above it, ``DecompressionBombError`` above twice it), so this module calls
the format plugin's factory directly, the same call ``Image.open`` makes, and applies the
per-call limit instead. Some plugins check Pillow's global limit again on their own while loading
frames (GIF, TIFF, WebP, ICO; not PNG or JPEG, the two formats shardkit stores); that is
Pillow's behaviour and is left as it is.
"""
from __future__ import annotations

import io

from PIL import Image

from shardkit.errors import DecodeError, PixelLimitError
from shardkit.validate import check_int

__all__ = ["DEFAULT_MAX_PIXELS", "MEDIA_TYPES", "sniff", "resolve_max_pixels",
           "check_pixels", "open_image"]

#: Default pixel limit (width * height): Pillow's own ``PIL.Image.MAX_IMAGE_PIXELS``,
#: ``int(1024 * 1024 * 1024 // 4 // 3)`` (src/PIL/Image.py, "1024*1024*1024 // 4 // 3"; a 1 GiB
#: budget at 4 bytes per pixel over 3). Copied, not read, so that changes to Pillow's global by
#: other code do not change what shardkit accepts.
DEFAULT_MAX_PIXELS = 89_478_485

#: Every media type :func:`sniff` can return.
MEDIA_TYPES = ("jpeg", "png", "webp", "gif", "tiff", "bmp", "avif", "heif", "unknown")

#: sniffed media type -> Pillow plugin (format) name.
PIL_FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "tiff": "TIFF",
               "bmp": "BMP", "avif": "AVIF"}

_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs",
                b"mif1", b"msf1"}
_BMP_DIB_SIZES = {12, 16, 40, 52, 56, 64, 108, 124}


def sniff(data: bytes | memoryview) -> str:
    """Media type of ``data`` from its magic bytes only (the file name is never consulted).

    Returns one of :data:`MEDIA_TYPES`: "jpeg" (FF D8 FF), "png" (the 8-byte PNG signature),
    "gif" (GIF87a/GIF89a), "webp" (RIFF....WEBP), "tiff" (II*\\0, MM\\0*, or BigTIFF), "bmp"
    ("BM" plus a known DIB header size), "avif"/"heif" (ISO-BMFF ``ftyp`` box brands), else
    "unknown" (also for empty input).
    """
    head = bytes(data[:64])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if (head[:2] == b"BM" and len(head) >= 18
            and int.from_bytes(head[14:18], "little") in _BMP_DIB_SIZES):
        return "bmp"
    if head[4:8] == b"ftyp" and len(head) >= 12:
        box = min(int.from_bytes(head[:4], "big"), len(head))
        major = head[8:12]
        compatible = {head[i:i + 4] for i in range(16, box - 3, 4)}
        if major in (b"avif", b"avis") or (major in (b"mif1", b"msf1") and b"avif" in compatible):
            return "avif"
        if major in _HEIF_BRANDS or compatible & _HEIF_BRANDS:
            return "avif" if b"avif" in compatible else "heif"
    return "unknown"


def resolve_max_pixels(max_pixels: int | None) -> int:
    """The limit to apply: ``None`` means :data:`DEFAULT_MAX_PIXELS`; otherwise a positive int
    (pixels, width * height). Raises ConfigError for anything else (bool, float, <= 0)."""
    if max_pixels is None:
        return DEFAULT_MAX_PIXELS
    return check_int("max_pixels", max_pixels, 1,
                     message="max_pixels must be a positive int, got {value!r}")


def check_pixels(width: int, height: int, max_pixels: int) -> None:
    """Raise :class:`PixelLimitError` when ``width * height > max_pixels`` (a resolved limit,
    see :func:`resolve_max_pixels`)."""
    if width * height > max_pixels:
        raise PixelLimitError(width, height, max_pixels, default_max_pixels=DEFAULT_MAX_PIXELS)


def open_image(data: bytes | memoryview, max_pixels: int | None = None,
               media: str | None = None) -> Image.Image:
    """Open ``data`` with Pillow (header only, pixels not decoded yet) under a pixel limit.

    Args:
        data: the encoded image (bytes-like).
        max_pixels: limit on width * height of the header size; None = :data:`DEFAULT_MAX_PIXELS`.
        media: the :func:`sniff` result when the caller has it (saves sniffing again).
    Returns:
        a lazy ``PIL.Image.Image`` (use as a context manager; ``load()``/``convert`` decode it).
    Raises:
        PixelLimitError: the header size is over the limit (checked before any pixel decoding).
        DecodeError: no Pillow plugin reads it ("<FMT> not decodable: ..." / "not an image ..."),
            or the header is corrupt ("corrupt <FMT> header: <exception type>: <message>").
        ConfigError: bad ``max_pixels``.
    """
    limit = resolve_max_pixels(max_pixels)
    media = media or sniff(data)
    fp = io.BytesIO(data)
    im = None
    if media in PIL_FORMATS:
        fmt = PIL_FORMATS[media]
        if fmt not in Image.OPEN:
            Image.init()
        if fmt not in Image.OPEN:
            raise DecodeError(f"{media.upper()} not decodable: this Pillow build has no {fmt} "
                              f"plugin")
        try:
            im = Image.OPEN[fmt][0](fp, "")
        except Exception as e:  # noqa: BLE001 - any parser failure means a corrupt header
            raise DecodeError(f"corrupt {media.upper()} header: {type(e).__name__}: {e}") from e
    else:  # rare (stored data is JPEG or PNG): every plugin, in Image.open's order
        Image.init()
        prefix = bytes(data[:16])
        for fmt in Image.ID if data else ():
            factory, accept = Image.OPEN[fmt]
            try:
                ok = not accept or accept(prefix)
                if not ok or isinstance(ok, str):  # a str: "recognised, but unsupported"
                    continue
                fp.seek(0)
                im = factory(fp, "")
                break
            except Exception:  # noqa: BLE001 - try the next plugin, as Image.open does
                continue
        if im is None:
            raise DecodeError(f"not an image Pillow can read ({len(data)} bytes, sniffed: "
                              f"{media})")
    check_pixels(im.width, im.height, limit)
    return im
