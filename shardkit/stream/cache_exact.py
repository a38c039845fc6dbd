"""Which cached samples equal an uncached run's pixels, bit for bit (docs/cache.md).

A cached crop is resized from the cached pixels; an uncached one from the JPEG decoded at the
DCT reduction :func:`shardkit.decode.choose_scale` picks for its crop box (1/2, 1/4, 1/8 once
both sides of the crop are >= 2x the output side). Where that reduction is < 1 the two differ:
close, not bit-exact. :func:`dct_side` gives the crop side from which that happens for a
transform, :func:`stored_sizes` each stored image's size and whether it is a JPEG (a PNG is
always decoded at scale 1); :meth:`shardkit.stream.cache.DecodedCache.dct_reduced` combines them
per sample in two integer comparisons, and :func:`dct_warning` is the loader's one warning.
"""
from __future__ import annotations

import logging

import numpy as np

from ..errors import SAMPLE_ERRORS, ShardkitError
from shardkit.dataset.manifest import read_split_records

__all__ = ["NEVER", "JPEG_EXTS", "dct_side", "dct_warning", "stored_sizes"]

log = logging.getLogger("shardkit.stream.cache")

#: :func:`dct_side` when no crop is ever DCT-reduced (above any image side).
NEVER = 1 << 40
#: The ``ext`` of a stored JPEG in ``splits/<split>.jsonl`` (the packer writes ``"jpg"``).
JPEG_EXTS = ("jpg", "jpeg")


def stored_sizes(source, transform) -> tuple[np.ndarray, bytes]:
    """``(sizes, reducible)``: ``(width, height)`` of every stored image, and per sample 1 when
    its uncached decode may use a DCT reduction (a JPEG), else 0 (a PNG: always at scale 1).
    From ``splits/<split>.jsonl`` (upright pixels, as stored; for a record without ``ext``, the
    sample's header says whether it is a JPEG), else (no records, or records that do not give
    every sample's size: the warning says which) from each sample's header.

    A sample whose bytes or header cannot be read here does not stop the cache: it gets
    :data:`UNREAD_SIZE` (a slot no decoded image fits, so it is never served from the cache)
    and one warning names the first such sample and the count; reading it in the loader
    raises its error there, where ``on_error`` decides."""
    n = len(source)
    sizes = np.zeros((n, 2), np.int64)
    try:
        records = read_split_records(source.root, source.split)
        why = _records_problem(records, n, source.split) if records else None
    except (ShardkitError, OSError) as e:  # damaged records: the headers say the sizes
        records, why = [], str(e)
    probe = _HeaderReader(source, transform)
    if records and why is None:
        sizes[:, 0] = [r["width"] for r in records]
        sizes[:, 1] = [r["height"] for r in records]
        reducible = bytearray(str(r.get("ext")).lower() in JPEG_EXTS for r in records)
        for i, r in enumerate(records):
            if "ext" not in r:  # a record without ``ext`` (hand-made): its header says
                found = probe(i)
                if found is None:  # unreadable now: never served from the cache
                    sizes[i] = UNREAD_SIZE
                else:
                    reducible[i] = min(found.factors) < 1
        probe.report()
        return sizes, bytes(reducible)
    if why:
        log.warning("decoded cache: %s; reading %d image headers instead", why, n)
    else:
        log.info("decoded cache: split %r lists no image sizes; reading %d headers",
                 source.split, n)
    reducible = bytearray(n)
    for i in range(n):
        found = probe(i)
        if found is None:
            sizes[i] = UNREAD_SIZE
        else:
            sizes[i] = found.width, found.height
            reducible[i] = min(found.factors) < 1
    probe.report()
    return sizes, bytes(reducible)


#: The size :func:`stored_sizes` gives a sample whose header it could not read.
UNREAD_SIZE = (1, 1)


def _records_problem(records: list, n: int, split: str) -> str | None:
    """Why ``records`` cannot give the ``n`` samples' sizes (None: they can)."""
    where = f"splits/{split}.jsonl"
    if len(records) != n:
        return f"{where} holds {len(records)} records for the index's {n} samples"
    for number, r in enumerate(records, 1):
        w, h = r.get("width"), r.get("height")
        if not (_side(w) and _side(h)):
            return (f"{where} record {number} gives width={w!r}, height={h!r}; expected ints "
                    f"in 1..{MAX_SIDE}")
    return None


class _HeaderReader:
    """``reader(i)``: sample ``i``'s :class:`~shardkit.decode.ImageProbe` (the stored bytes
    read as the loader reads them, then the header), or None when either raised one of the
    sample errors; :meth:`report` logs the failures once."""

    def __init__(self, source, transform):
        self.source, self.transform = source, transform
        self.decoder = None
        self.failed: list[tuple[str, str]] = []

    def __call__(self, i: int):
        if self.decoder is None:
            from ..decode import get_decoder

            self.decoder = get_decoder(self.transform.cfg.decoder,
                                       max_pixels=self.source.max_pixels)
        try:
            return self.decoder.probe(self.source.read(i))
        except SAMPLE_ERRORS as e:
            self.failed.append((self.source.key(i), f"{type(e).__name__}: {e}"))
            return None

    def report(self) -> None:
        if self.failed:
            key, err = self.failed[0]
            log.warning("decoded cache: %d sample(s) of split %r could not be read to learn "
                        "their size and format (first: %r, %s); they are never served from the "
                        "cache, and reading them in the loader reports the error there",
                        len(self.failed), self.source.split, key, err)


def dct_side(transform) -> int:
    """The crop side from which the uncached decode of a JPEG by ``transform`` is DCT-reduced:
    the least ``w`` for which :func:`~shardkit.decode.choose_scale` picks a factor < 1 for a
    ``w x w`` box and the decoder's factors (``2 S`` for roi, turbojpeg and pil, whose largest
    factor below 1 is 1/2); :data:`NEVER` without ``dct_scaling`` or for a decoder without
    reductions (nvjpeg per image). A box reduces iff both its sides are >= this (the rule is
    ``choose_scale``'s own, searched here, not restated). An eval box's float sides are
    compared as ``CropParams``' truncated ints: the same decision for every factor ``1/d``
    (all of shardkit's)."""
    cfg = transform.cfg
    if not cfg.dct_scaling:
        return NEVER
    import io

    from PIL import Image

    from ..decode import FAST_DCT_REDUCTIONS, choose_scale, get_decoder

    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, format="JPEG")
    try:  # the decoder's own factors for a YCbCr JPEG: a header read of a tiny one
        factors = get_decoder(cfg.decoder).probe(buf.getvalue()).factors
    except Exception:  # noqa: BLE001 - the loader reports a bad decoder; assume shardkit's set
        factors = FAST_DCT_REDUCTIONS
    s = cfg.image_size

    def reduced(w: int) -> bool:
        return choose_scale(w, w, s, s, factors) < 1

    if not reduced(NEVER):
        return NEVER
    lo, hi = 1, NEVER  # reduced() is monotone in w: the least w where it holds
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reduced(mid) else (mid + 1, hi)
    return lo


#: The largest image side :func:`stored_sizes` takes from a record (px).
MAX_SIDE = 1 << 20


def _side(v) -> bool:
    return type(v) is int and 1 <= v <= MAX_SIDE


def dct_warning(crop: tuple[int, int], side: int, image_size: int) -> str:
    """The warning for a loader's first cached sample whose uncached decode would be
    DCT-reduced: ``crop`` its ``(width, height)``, ``side`` the :func:`dct_side`."""
    return (f"decoded cache: a {crop[0]}x{crop[1]} px crop (both sides >= {side} px, "
            f"{side / image_size:g}x image_size={image_size}) is decoded uncached at a libjpeg "
            "DCT scale (1/2, 1/4 or 1/8) and resized from that, while the cache resizes it from "
            "the full-size pixels: such samples are close to, not bit-exact with, an uncached "
            "run's (counted in cache_stats()['dct_reduced']). For bit-exact batches use a larger "
            "image_size (crops under 2x it) or dct_scaling=False in both runs, or accept it; see "
            "docs/cache.md. (Logged once per loader.)")
