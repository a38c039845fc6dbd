"""Decoded image cache: decode once, augment every epoch (docs/RELIABILITY.md, "The decoded cache").

``make_loader(..., cache="ram")`` keeps every decoded image of the split (RGB uint8, full
resolution or resized to ``cache_max_side``) in one shared :class:`~shardkit.stream.arena.Arena`
per machine; the train transform then draws its random crop exactly as the uncached path does
and resizes it from the cached pixels (:meth:`shardkit.transforms.SampleTransform.from_pixels`),
so the augmentation stays live. The first epoch fills the arena as it goes.

Modes (:func:`parse_cache`): ``"none"``; ``"ram"`` (``/dev/shm``, or ``$SHARDKIT_CACHE_SHM``);
``"disk:DIR"`` (a memory-mapped file in DIR, reused across runs, validated against the
manifest's shard sha256s); ``"auto"`` (ram when the split's pixels fit in half of the available
memory and in the tmpfs's free space less its reserve, else none; one log line says which and
why). ``cache_eval="final"`` on an eval loader stores the final deterministic crops instead.

Fill cost: every stored slot takes fresh pages of the arena's file system, allocated by the
kernel inside the ``pwrite`` (0.08 ms of a 0.86 ms fill per flowers photo, one thread, 2-vCPU
VM; ``benchmarks/README.md``, "Seventh pass"). ``cache_stats()["huge_pages"]`` names the tmpfs's
page mode (:func:`tmpfs_huge`); ``$SHARDKIT_CACHE_SHM`` may name a tmpfs mounted
``huge=within_size`` (2 MiB pages, 512 times fewer allocations), which did not pay reliably on
that VM, where the host backs freed memory again on its first touch.

Room for the batches (the tmpfs reserve): DataLoader worker processes pass every batch to the
consumer in a fresh ``/dev/shm`` segment, so a cache that filled the tmpfs would starve them
(Docker gives containers 64 MB). A cache never takes the last :func:`shm_reserve` bytes of its
file system: ``2 x num_workers x prefetch_factor x (batch_size x 3 x S x S + 3 pages)`` per
local rank (``$LOCAL_WORLD_SIZE``, default 1) for ``backend="process"`` (0 for threads, whose
batches stay in private memory), plus :data:`SHM_MARGIN` for everything else (NCCL, other
programs), on the file system of ``/dev/shm`` (a disk cache elsewhere keeps the margin only).
The arena is not created when the tmpfs has no room beyond that; filling stops (one warning per
machine, recorded in the arena) at the first sample that would cross it (the free space is
read again after each 1/64 of the room a process saw); either way the samples
not cached are read and decoded as without a cache, so the epoch is the same.

Trust (:mod:`shardkit.stream.arena`): a RAM arena's name carries the user's uid; a file is used
only if it is a regular file of the calling user, not writable by others and not a link; its
slot layout must equal the one computed from the split index, else it is rebuilt. A sample that
cannot be read from the arena is decoded from its shard: a cache fault is never reported as a
damaged shard.

Identity of an arena (its name in RAM, its header on disk): the split's shard sha256s, the
index's per-sample xxh3s (or keys and sizes), the split name, the cache resolution, the
decoder and, for ``"final"``, the eval transform.

Exactness: a cached crop is resized from the cached pixels, an uncached one from the JPEG
decoded at the DCT reduction :func:`shardkit.decode.choose_scale` picks for its crop box (1/2,
1/4, 1/8 once both sides of the crop are >= 2x the output side). Where that reduction is < 1
the two differ (close, not bit-exact); :meth:`DecodedCache.dct_reduced` tells those samples
apart from the crop box and the stored size (the uncached path's decision, from
:mod:`shardkit.stream.cache_exact`), the loader counts them (``cache_stats()["dct_reduced"]``)
and logs one warning (:meth:`DecodedCache.warn_dct`).

Room (:mod:`shardkit.stream.memory`): ``MemAvailable``, a file system's free space and the
batch transport's :func:`~shardkit.stream.memory.shm_reserve`, re-exported here.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import ArenaUnavailable, ConfigError
from ..validate import check_int
from .arena import Arena, table_layout
from .cache_exact import NEVER, dct_side, dct_warning, stored_sizes
from .memory import arena_memory, available_memory, free_bytes, same_fs, shm_reserve, tmpfs_huge

__all__ = ["DecodedCache", "make_cache", "parse_cache", "CACHE_EVAL", "SHM_DIR_ENV",
           "SHM_MARGIN", "cache_identity", "cached_size", "available_memory", "free_bytes",
           "shm_reserve", "arena_memory"]

log = logging.getLogger("shardkit.stream.cache")

#: What an eval loader caches: decoded pixels (as train) or its final crops.
CACHE_EVAL = ("pixels", "final")
#: Environment variable naming the tmpfs folder of ``cache="ram"`` (default ``/dev/shm``).
SHM_DIR_ENV = "SHARDKIT_CACHE_SHM"
#: Bytes of its file system a cache always leaves free, on top of the batch transport.
SHM_MARGIN = 16 << 20
_VERSION = 1
#: A process reads the free space again after storing this fraction (1/N) of the room it saw.
_CHECK_SHARE = 64
#: Held while a thread stops filling (publish the stop, disable, warn) and while another
#: thread that sees the published stop disables: its silent disable never comes between the
#: stopping thread's publish and its one warning.
_STOP_LOCK = threading.Lock()
#: What a fault while reading a slot may raise (a cache fault: the sample is decoded instead).
_SLOT_FAULTS = (ValueError, IndexError, TypeError, KeyError, OSError, BufferError)


def parse_cache(spec) -> tuple[str, str | None]:
    """``(mode, dir)`` from ``"none" | "ram" | "auto" | "disk:DIR"`` (None means "none").

    Raises:
        ConfigError: anything else (naming the value and the accepted forms).
    """
    if spec is None or spec == "none":
        return "none", None
    if spec in ("ram", "auto"):
        return spec, None
    if isinstance(spec, str) and spec.startswith("disk:") and len(spec) > 5:
        return "disk", spec[5:]
    raise ConfigError(f"cache={spec!r}: expected 'none', 'ram', 'auto' or 'disk:DIR'")


def cached_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """Size of the cached pixels: unchanged without ``max_side`` or when the longer side is
    within it, else scaled so that the longer side is ``max_side`` (the other side rounded,
    at least 1), as FFCV's ``max_resolution``."""
    if max_side is None or max(width, height) <= max_side:
        return int(width), int(height)
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def cache_identity(source, kind: str, resolution: str, transform) -> dict:
    """The JSON-able identity of a cache of ``source`` (a ShardSource). See the module doc."""
    idx = source.index
    h = hashlib.sha256()
    if idx.xxh3 is not None:
        h.update(np.ascontiguousarray(idx.xxh3).tobytes())
    else:
        h.update(np.ascontiguousarray(idx.key).tobytes())
        h.update(np.ascontiguousarray(idx.size).tobytes())
    cfg = transform.cfg
    ident = {"version": _VERSION, "split": source.split, "kind": kind, "resolution": resolution,
             "num_samples": len(idx), "shards": [s.get("sha256", "") for s in source.shards],
             "samples": h.hexdigest(), "decoder": _decoder_name(cfg.decoder),
             "fast_dct": cfg.fast_dct, "fast_upsample": cfg.fast_upsample}
    if kind == "final":
        ident["transform"] = {k: cfg.to_dict()[k] for k in (
            "image_size", "crop_pct", "interpolation", "dct_scaling")}
    return ident


def _decoder_name(name: str) -> str:
    if name != "auto":
        return name
    from ..decode import auto_choice

    return auto_choice()[0]


class DecodedCache:
    """The cache of one loader: an :class:`Arena` plus the per-sample get/fill logic and this
    process's counters. Built by :func:`shardkit.stream.make_loader` (``cache=``).

    Attributes:
        mode: ``"ram"`` or ``"disk"``. kind: ``"pixels"`` or ``"final"``. max_side: as given.
        path: the arena file. verify: check each hit's pixels against the xxh3 stored at fill
            (the loader's ``verify_reads``; ~5 us per 224 KB image).
        reserve: bytes of the arena's file system left free (``SHM_MARGIN``, plus the batch
            transport when it is the file system of ``/dev/shm``).
        disabled: why this process stopped filling (out of space, the reserve reached, a slot
            that could not be read), or None.
        dct_side: the crop side (pixels, both sides of the box) from which the uncached decode
            of a JPEG would use a DCT reduction < 1 (``2 x image_size``;
            :data:`~shardkit.stream.cache_exact.NEVER` for ``"final"``, without
            ``dct_scaling``, or a decoder without reductions).

    The free space is read (``statvfs``) again only after this process has stored
    1/:data:`_CHECK_SHARE` of the room above the reserve seen at the last reading, so up to
    that many processes filling at once cannot cross the reserve between their readings.
    """

    def __init__(self, source, transform, mode: str, directory: str | None,
                 max_side: int | None = None, kind: str = "pixels", verify: bool = True,
                 image_size: int | None = None, transport_bytes: int = 0):
        max_side = check_int("cache_max_side", max_side, 1, optional=True)
        if kind not in CACHE_EVAL:
            raise ConfigError(f"cache_eval={kind!r}: expected one of {list(CACHE_EVAL)}")
        self.mode, self.kind, self.max_side = mode, kind, max_side
        self.verify = bool(verify)
        self.disabled: str | None = None
        self._unchecked = 0  # bytes this process may store before reading the free space
        self.unreadable: str | None = None  # why this process stopped reading slots
        self.unavailable: str | None = None  # why the arena could not be opened
        sizes, self._reducible = stored_sizes(source, transform)
        self.image_size = int(transform.cfg.image_size)
        # a "final" slot holds the uncached transform's own crop: exact whatever the scale
        self.dct_side = dct_side(transform) if kind == "pixels" else NEVER
        if kind == "final":
            s = int(image_size or transform.cfg.image_size)
            cached = np.full_like(sizes, s)
            resolution = f"final{s}"
        else:
            cached = np.array([cached_size(w, h, max_side) for w, h in sizes.tolist()],
                              dtype=np.int64).reshape(-1, 2)
            resolution = "full" if max_side is None else f"max{max_side}"
        self.resolution = resolution
        ident = cache_identity(source, kind, resolution, transform)
        digest = hashlib.sha256(repr(sorted(ident.items())).encode()).hexdigest()[:20]
        if mode == "ram":
            folder = Path(os.environ.get(SHM_DIR_ENV) or "/dev/shm")
            # the user in the name: another user's file of that name is refused, never read
            path = folder / f"shardkit-cache-u{os.getuid()}-{source.split}-{resolution}-" \
                f"{digest}.arena"
        else:
            folder = Path(directory)
            if folder.exists() and not folder.is_dir():
                raise ConfigError(f"cache='disk:{directory}': {folder} is not a folder")
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"cache='disk:{directory}': cannot create the folder "
                                  f"({e.strerror})") from e
            # named after the dataset's location: two datasets sharing DIR keep one arena each,
            # and a re-pack in the same place replaces its stale arena instead of adding one
            where = hashlib.sha256(os.path.realpath(source.root).encode("utf-8", "surrogatepass")
                                   ).hexdigest()[:12]
            path = folder / f"shardkit-{source.split}-{resolution}-{where}.arena"
        self.path = str(path)
        self.folder = str(folder)
        self.num_samples = len(sizes)
        shm = same_fs(folder, "/dev/shm")
        self.reserve = SHM_MARGIN + (int(transport_bytes) if shm else 0)
        self._reserve_for = (f"{transport_bytes / 1e6:.1f} MB for the batches of the "
                             f"DataLoader worker processes + a {SHM_MARGIN / 1e6:.1f} MB margin"
                             if shm and transport_bytes else
                             f"a {SHM_MARGIN / 1e6:.1f} MB margin for other users")
        self.projected_bytes = int((cached[:, 0] * cached[:, 1] * 3).sum())
        self.arena = Arena(self.path, ident, np.concatenate([sizes, cached], axis=1),
                           persistent=(mode == "disk"))

    # --- lifetime --------------------------------------------------------------------------
    def attach(self) -> bool:
        """Attaches the arena (creating it if needed); False (logged, reads stay uncached) when
        it cannot be created or attached."""
        if self.unavailable is not None and not self.arena.attached:
            return False
        from torch.utils.data import get_worker_info

        try:
            # a worker process maps the arena its consumer holds (never a lock of its own)
            self.arena.attach(hold=get_worker_info() is None)
            return True
        except (ArenaUnavailable, OSError) as e:
            self.unavailable = f"cannot open the arena: {e}"
            self._disable(self.unavailable)
            return False

    def detach(self) -> None:
        self.arena.detach()

    def __getstate__(self) -> dict:
        return self.__dict__.copy()

    def _disable(self, why: str, warn: bool = True) -> None:
        if self.disabled is None:
            self.disabled = why
            if warn:
                log.warning("decoded cache %s: %s; the remaining samples are read and decoded "
                            "without the cache (nothing wrong is served)", self.path, why)

    def _stop(self, why: str) -> None:
        """Stops filling in every process attached to the arena; only the first process to
        stop logs the warning (one per machine)."""
        with _STOP_LOCK:
            try:
                first = self.arena.stop_filling(why)
            except (ArenaUnavailable, OSError):
                first = True
            self._disable(why, warn=first)

    def room_error(self, nbytes: int) -> str | None:
        """Why ``nbytes`` more must not go into the arena's file system (it would leave less
        than :attr:`reserve` free), or None (room, or free space unknown)."""
        free = free_bytes(self.folder)
        if free is None or free - nbytes >= self.reserve:
            self._unchecked = 0 if free is None else (free - nbytes - self.reserve) // _CHECK_SHARE
            return None
        return (f"{self.folder} has {free / 1e6:.1f} MB free and {self.reserve / 1e6:.1f} MB of "
                f"it stay free ({self._reserve_for}); give it more room (e.g. docker run "
                "--shm-size=2g) or use cache='disk:DIR'")

    # --- per sample --------------------------------------------------------------------------
    def lookup(self, pos: int, tf, rng, out: np.ndarray) -> bool:
        """Writes sample ``pos`` into ``out`` from the cache (True), or does nothing (False:
        a miss; the caller reads the bytes and calls :meth:`fill`). Sets ``tf.last_warnings``
        to the warnings counted when the sample was filled. A slot that cannot be read (a cache
        fault) is a miss with ``rng`` as it was given, and stops reads from the arena in this
        process (one warning); it never raises."""
        arena = self.arena
        if self.unreadable is not None or (not arena.attached and not self.attach()):
            return False
        t = arena.table
        if t["state"][pos] != 1:
            return False
        drawn = rng.bit_generator.state
        try:
            pixels = arena.slot(pos)
            if self.verify:
                from shardkit.dataset.manifest import sample_checksum

                if sample_checksum(pixels) != int(t["xxh3"][pos]):
                    log.warning("decoded cache %s: slot of sample %d failed its check; decoding "
                                "it again", self.path, pos)
                    t["state"][pos] = 0
                    return False
            if self.kind == "final":
                out[...] = pixels
            else:
                tf.from_pixels(pixels, int(t["width"][pos]), int(t["height"][pos]), rng, out)
        except _SLOT_FAULTS as e:
            rng.bit_generator.state = drawn  # the decode path draws the same crop
            self.unreadable = f"cannot read the slot of sample {pos} ({type(e).__name__}: {e})"
            self._disable(self.unreadable)
            return False
        n = int(t["warnings"][pos])
        tf.last_warnings, tf.last_warning = n, ("libjpeg warning(s) when the sample was cached"
                                                if n else None)
        return True

    def fill(self, pos: int, data, tf, rng, out: np.ndarray) -> bool:
        """Sample ``pos`` decoded from ``data`` into the cache (when there is room) and its crop
        into ``out``, with the same result as a later :meth:`lookup` of it (the uncached
        transform's but where :meth:`dct_reduced`). Returns True when ``out`` was resized from
        the cache-resolution pixels (stored or not), False when the uncached transform made it
        (filling disabled, ``"final"``, or a size that is not the index's). Raises what the
        decode raises (the caller's ``on_error`` applies); a full tmpfs or disk, the reserve
        reached or a slot that cannot be written only stops filling (:meth:`_stop`)."""
        arena = self.arena
        if self.disabled is None and arena.attached:
            stopped = arena.filling_stopped  # another process (it warned) or thread stopped
            if stopped is not None:
                with _STOP_LOCK:  # a thread of this process stopping now warns first
                    self._disable(stopped, warn=False)
        if self.disabled is not None or not (arena.attached or self.attach()):
            tf(data, rng, out=out)
            return False
        t = arena.table
        w, h = int(t["width"][pos]), int(t["height"][pos])
        cropped = self.kind != "final"
        if not cropped:
            tf(data, rng, out=out)
            pixels = out
        else:
            cw, ch = int(t["cw"][pos]), int(t["ch"][pos])
            # decoded into a private buffer (pwrite then copies it: arena.py), and the crop
            # resized from the just-decoded pixels in the same call where the decoder can
            pixels = tf.decode_for_cache(data, None if (cw, ch) == (w, h) else (cw, ch),
                                         np.empty((ch, cw, 3), np.uint8), crop=(w, h, rng, out))
            if pixels.shape != (ch, cw, 3):  # the index's size is not the stored image's
                log.warning("decoded cache %s: sample %d decodes to %dx%d, the index says "
                            "%dx%d; served uncached", self.path, pos, pixels.shape[1],
                            pixels.shape[0], w, h)
                tf(data, rng, out=out)
                return False
        nbytes = pixels.nbytes
        why = self.room_error(nbytes) if nbytes > self._unchecked else None
        if why is not None:
            self._stop(f"filling stopped at {arena.filled()[0]} of {arena.n} samples: {why}")
            return cropped
        self._unchecked -= nbytes
        try:
            arena.store(pos, pixels, tf.last_warnings)
        except OSError as e:
            what = "out of space while filling" if e.errno in (
                errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else "cannot write the arena"
            self._stop(f"{what} ({e.strerror or e}; {arena.filled()[0]} of {arena.n} samples "
                       "cached)")
        except ValueError as e:  # the slot's size in the table is not the pixels' (damage)
            self._stop(f"cannot write the slot of sample {pos} ({e})")
        return cropped

    def dct_reduced(self, pos: int, params) -> bool:
        """Whether sample ``pos``, just served by :meth:`lookup` (or a :meth:`fill` that
        returned True) with crop ``params`` (the transform's ``last_params``), would have been
        decoded uncached at a DCT scale < 1: then the served pixels differ from the uncached
        decode's (close, not bit-exact). The uncached path's decision
        (:func:`~shardkit.decode.choose_scale` on the same box) as two integer comparisons and
        a byte read; runs per sample."""
        side = self.dct_side
        return params.width >= side and params.height >= side and self._reducible[pos] == 1

    def warn_dct(self, crop: tuple[int, int]) -> None:
        """The loader's one warning (its first sample that :meth:`dct_reduced`; ``crop`` is
        that sample's ``(width, height)``); none with ``max_side``, where cached crops are
        documented as not bit-exact anyway."""
        if self.max_side is not None:
            return
        log.warning(dct_warning(crop, self.dct_side, self.image_size))

    # --- accounting --------------------------------------------------------------------------
    def stats(self) -> dict:
        """``{"mode", "kind", "resolution", "path", "size_bytes" (all slots), "filled_samples",
        "filled_bytes", "num_samples", "disabled", "huge_pages"}`` as seen now (every process's
        fills); ``huge_pages``: the arena folder's tmpfs huge-page mode
        (:func:`~shardkit.stream.memory.tmpfs_huge`: ``"never"``, one page allocation per 4 KiB
        stored), None when not on a tmpfs."""
        arena = self.arena
        filled = arena.filled() if arena.attached else (0, 0)
        stopped = arena.filling_stopped if arena.attached else None
        return {"mode": self.mode, "kind": self.kind, "resolution": self.resolution,
                "path": self.path, "size_bytes": self.projected_bytes,
                "num_samples": arena.n if arena.attached else None,
                "filled_samples": filled[0], "filled_bytes": filled[1],
                "disabled": self.disabled or stopped, "huge_pages": tmpfs_huge(self.folder)}


def make_cache(source, transform, cache, *, max_side: int | None = None,
               cache_eval: str = "pixels", train: bool = True, verify: bool = True,
               transport_bytes: int = 0) -> DecodedCache | None:
    """The :class:`DecodedCache` of a loader (attached), or None for ``cache="none"``, for
    ``"auto"`` when the split does not fit, or when the arena cannot be opened or created (one
    warning; the loader then reads uncached).

    ``transport_bytes``: the loader's :func:`shm_reserve` (what its batches may hold of
    ``/dev/shm``); the cache leaves that plus :data:`SHM_MARGIN` free. ``"auto"``: ram when the
    projected size (every image at the cache resolution) is at most half of ``MemAvailable``
    and at most the tmpfs's free space less that reserve; one line says which and why (INFO, or
    a WARNING when only the tmpfs is too small).

    Raises:
        ConfigError: a bad ``cache`` / ``cache_max_side`` / ``cache_eval``, ``"final"`` for a
            train loader, or a transform that is not the factory's (a custom callable).
    """
    mode, directory = parse_cache(cache)
    if cache_eval not in CACHE_EVAL:
        raise ConfigError(f"cache_eval={cache_eval!r}: expected one of {list(CACHE_EVAL)}")
    if mode == "none":
        return None
    if not hasattr(transform, "from_pixels"):
        raise ConfigError(f"cache={cache!r} needs a TransformConfig transform (a custom callable "
                          "cannot crop from cached pixels)")
    if cache_eval == "final" and train:
        raise ConfigError("cache_eval='final' caches the deterministic eval crops; a train "
                          "loader's crops are random (use it with train=False)")
    if cache_eval == "final" and max_side is not None:
        raise ConfigError("cache_max_side applies to cached pixels, not to cache_eval='final'")
    kind = "final" if cache_eval == "final" else "pixels"
    dc = DecodedCache(source, transform, "ram" if mode == "auto" else mode, directory,
                      max_side=max_side, kind=kind, verify=verify,
                      transport_bytes=transport_bytes)
    if mode == "auto":
        avail = available_memory()
        shm = dc.folder
        shm_free = free_bytes(shm) or 0
        room = max(0, shm_free - dc.reserve)
        need = dc.projected_bytes
        if need > min(avail // 2, room):
            tmpfs_only = need <= avail // 2
            (log.warning if tmpfs_only else log.info)(
                "cache='auto' -> none: split %r needs %.1f MB of decoded pixels (%s), more than "
                "half of the available memory (%.1f MB) or the free space of %s (%.1f MB) less "
                "the %.1f MB that stay free (%s)%s", source.split, need / 1e6, dc.resolution,
                avail / 2e6, shm, shm_free / 1e6, dc.reserve / 1e6, dc._reserve_for,
                "; give it more room (e.g. docker run --shm-size=2g) or use cache='disk:DIR'"
                if tmpfs_only else "")
            return None
        log.info("cache='auto' -> ram: split %r needs %.1f MB of decoded pixels (%s), within "
                 "half of the available memory (%.1f MB) and the free space of %s (%.1f MB) "
                 "less the %.1f MB kept free", source.split, need / 1e6, dc.resolution,
                 avail / 2e6, shm, shm_free / 1e6, dc.reserve / 1e6)
    if not os.path.lexists(dc.path):
        why = dc.room_error(table_layout(dc.num_samples)[1])
        if why is not None:
            dc.unavailable = f"not created: {why}"
            dc._disable(dc.unavailable)
            return None
    if not dc.attach():
        return None
    return dc
