"""The per-sample read stages, in one place: read -> verify -> cache -> decode or transform ->
augment -> warning and error policy.

A :class:`SampleStages` is built once per dataset from its settings and serves every sample
of it: :meth:`SampleStages.item` for the dict datasets (:class:`~shardkit.stream.ShardDataset`,
:class:`~shardkit.stream.MapShardDataset`), :meth:`SampleStages.row` and
:meth:`SampleStages.encoded` for the rows of a :class:`~shardkit.stream.BatchDataset` batch. It
keeps no per-thread state (the caller passes its thread's transform copy), so the decoding
threads of one process share it, and it pickles with its dataset into worker processes.

The policies are handler objects, chosen once from the option's name (webdataset's
``reraise_exception`` / ``warn_and_continue`` / ``ignore_and_continue`` handlers):

- on a sample error (:data:`SAMPLE_ERRORS`): :func:`error_handler` (``on_error``)
  gives :class:`RaiseOnError` or :class:`SkipOnError` (the map-style dataset always raises:
  an item must exist);
- on decoder warnings: :func:`warning_handler` (``on_warning``) gives :class:`KeepOnWarning`,
  :class:`SkipOnWarning` or :class:`RaiseOnWarning`.

Whether an error already names its sample is read from its ``shard`` and ``key`` attributes
(set where :class:`~shardkit.errors.ShardCorruptError` and :class:`~shardkit.errors.DecodeError`
are raised), never from its message.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from ..augment.prims import apply_hwc, compile_hwc, run_steps
from ..decode.base import DecodeWarningError, apply_warning_policy
from ..errors import (SAMPLE_ERRORS, ConfigError, DecodeError, ShardCorruptError,
                      ShardFetchError, ShardkitError)
from ..formats import resource_error
from ..sharding import sample_rng
from ..transforms import SampleTransform, declared
from .options import ON_ERROR, ON_WARNING
from .source import ShardSource

__all__ = ["SampleStages", "BatchTally", "LEFT_OUT", "ErrorHandler",
           "RaiseOnError", "SkipOnError", "error_handler", "WarningHandler",
           "KeepOnWarning", "SkipOnWarning", "RaiseOnWarning", "warning_handler", "names_sample"]

log = logging.getLogger("shardkit.stream")

def _splits_crop(tf) -> bool:
    """Whether ``tf`` is the factory's transform, whose call is ``crop_box`` then
    ``decode_crop`` (a subclass that overrides the call is taken at its word: called whole)."""
    return isinstance(tf, SampleTransform) and type(tf).__call__ is SampleTransform.__call__


class _LeftOut:
    def __repr__(self) -> str:
        return "LEFT_OUT"


#: What :meth:`SampleStages.item` returns for a sample a policy left out.
LEFT_OUT = _LeftOut()


def names_sample(err: BaseException, shard: str, key: str) -> bool:
    """Whether ``err`` already names sample ``key`` of ``shard`` (so it is raised as it is):
    a :class:`~shardkit.errors.ShardkitError` whose ``key`` attribute is ``key``, or a
    :class:`~shardkit.errors.ShardCorruptError` about the whole shard (its ``shard`` attribute
    is ``shard``)."""
    if not isinstance(err, ShardkitError):
        return False
    if getattr(err, "key", None) == key:
        return True
    return isinstance(err, ShardCorruptError) and err.shard == shard


# --- error handlers --------------------------------------------------------------------------

class ErrorHandler:
    """What happens to a sample that failed in a stage: ``handler(err, source, pos)`` raises,
    or returns the key it left out.

    Under every handler that names samples, the OS running out of a resource (open files,
    memory: :func:`shardkit.formats.base.resource_error`) is never the sample's fault: it
    raises :class:`~shardkit.errors.ResourceLimitError`. Raised as they are, never handled as a
    sample's error: a :class:`~shardkit.decode.DecodeWarningError` (``on_warning="raise"``,
    the user's choice), a :class:`~shardkit.errors.ShardFetchError` (a remote shard that could
    not be fetched) and a :class:`~shardkit.errors.ShardCorruptError` about the sample's whole
    shard (``key`` None: missing, or not the manifest's size): skipping would leave out every
    sample of that shard, a short epoch (a local dataset is refused for the same fault before
    its first batch).
    """

    name = ""

    def __call__(self, err: BaseException, source: ShardSource, pos: int) -> str:
        shard, key = source.shard_name(pos), source.key(pos)
        if isinstance(err, (DecodeWarningError, ShardFetchError)) or (
                isinstance(err, ShardCorruptError) and err.shard == shard and err.key is None):
            raise err  # the user's choice; a shard that cannot be read is no sample's fault
        resource = resource_error(err, f"shard {shard}: sample {key!r}")
        if resource is not None:
            if resource is err:
                raise err
            raise resource from err
        return self.failed(err, source, pos, shard, key)

    def failed(self, err: BaseException, source: ShardSource, pos: int, shard: str,
               key: str) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RaiseOnError(ErrorHandler):
    """``on_error="raise"``: an error that names the sample (:func:`names_sample`) is raised as
    it is; any other becomes a :class:`~shardkit.errors.DecodeError` naming shard and key
    (attributes and message), chained to it."""

    name = "raise"

    def failed(self, err, source, pos, shard, key):
        if names_sample(err, shard, key):
            raise err
        raise DecodeError(f"shard {shard}: sample {key!r} failed: {type(err).__name__}: "
                          f"{err}{source.limit_hint(err)}", shard=shard, key=key) from err


class SkipOnError(ErrorHandler):
    """``on_error="skip"``: the sample is left out, with one WARNING per sample on the
    ``shardkit.stream`` logger naming key, shard and the error; returns the key."""

    name = "skip"

    def failed(self, err, source, pos, shard, key):
        log.warning("on_error='skip': skipped sample %r of shard %s: %s%s", key, shard, err,
                    source.limit_hint(err))
        return key


_ERROR_HANDLERS = {"raise": RaiseOnError(), "skip": SkipOnError()}


def error_handler(on_error: str) -> ErrorHandler:
    """The handler of ``on_error`` (one of :data:`~shardkit.stream.options.ON_ERROR`).

    Raises:
        ConfigError: any other value.
    """
    if on_error not in ON_ERROR or on_error not in _ERROR_HANDLERS:
        raise ConfigError(f"on_error={on_error!r} is not one of {list(ON_ERROR)}")
    return _ERROR_HANDLERS[on_error]


# --- warning handlers ------------------------------------------------------------------------

class WarningHandler:
    """What happens to a sample whose decode gave ``n > 0`` libjpeg warnings (field case 12):
    ``handler(n, message, source, pos)`` is True to keep it, False to leave it out, or raises."""

    name = ""

    def __call__(self, n: int, message, source: ShardSource, pos: int) -> bool:
        return apply_warning_policy(n, self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class KeepOnWarning(WarningHandler):
    """``on_warning="keep"``: the pixels are used (the batch path lists the key in
    ``BatchReport.warned``)."""

    name = "keep"

    def __call__(self, n, message, source, pos):
        return True


class SkipOnWarning(WarningHandler):
    """``on_warning="skip"``: the sample is left out, as under ``on_error="skip"``."""

    name = "skip"


class RaiseOnWarning(WarningHandler):
    """``on_warning="raise"``: :class:`~shardkit.decode.DecodeWarningError` naming shard, key
    (also as its ``shard`` and ``key``), the count and the last warning."""

    name = "raise"

    def __call__(self, n, message, source, pos):
        shard, key = source.shard_name(pos), source.key(pos)
        try:
            return apply_warning_policy(n, "raise", f"shard {shard}: sample {key!r}", message)
        except DecodeWarningError as e:
            e.shard, e.key = shard, key
            raise


_WARNING_HANDLERS = {"keep": KeepOnWarning(), "skip": SkipOnWarning(), "raise": RaiseOnWarning()}


def warning_handler(on_warning: str) -> WarningHandler:
    """The handler of ``on_warning`` (one of :data:`~shardkit.stream.options.ON_WARNING`).

    Raises:
        ConfigError: any other value.
    """
    if on_warning not in ON_WARNING or on_warning not in _WARNING_HANDLERS:
        raise ConfigError(f"on_warning={on_warning!r} is not one of {list(ON_WARNING)}")
    return _WARNING_HANDLERS[on_warning]


# --- the stages ------------------------------------------------------------------------------

class BatchTally:
    """What the stages record while the rows of one batch are built: ``keep`` (bool ``(n,)``,
    False for rows left out), ``skipped`` and ``warned`` keys, cache ``hits`` / ``misses`` /
    ``fill_s`` (seconds) / ``dct_reduced`` (rows served from the cache that the uncached decode
    would DCT-reduce: :meth:`~shardkit.stream.cache.DecodedCache.dct_reduced`) and
    ``dct_crop`` (the first such row's crop ``(width, height)``, or None), ``programs``
    (augment programs carried to the device, one per row, ``[]`` for a row that failed before
    its draw) and, for the encoded path, ``datas``, ``boxes`` and ``flips`` of the kept rows.
    ``epoch``: the epoch the batch belongs to."""

    __slots__ = ("epoch", "keep", "skipped", "warned", "hits", "misses", "fill_s", "dct_reduced",
                 "dct_crop", "programs", "datas", "boxes", "flips")

    def __init__(self, n: int, epoch: int):
        self.epoch = epoch
        self.keep = np.ones(n, dtype=bool)
        self.skipped: list[str] = []
        self.warned: list[str] = []
        self.hits = self.misses = self.dct_reduced = 0
        self.fill_s = 0.0
        self.dct_crop: tuple[int, int] | None = None
        self.programs: list = []
        self.datas: list = []
        self.boxes: list = []
        self.flips: list = []

    def leave_out(self, i: int, key: str) -> None:
        self.keep[i] = False
        self.skipped.append(key)

    @classmethod
    def join(cls, parts: list["BatchTally"], epoch: int) -> "BatchTally":
        """The tally of a batch whose rows were built in ``parts`` (in row order): one part is
        itself; more are concatenated (keys, programs and ``keep`` in row order, counts
        summed)."""
        if len(parts) == 1:
            return parts[0]
        whole = cls(0, epoch)
        whole.keep = np.concatenate([p.keep for p in parts])
        for p in parts:
            for name in ("skipped", "warned", "programs", "datas", "boxes", "flips"):
                getattr(whole, name).extend(getattr(p, name))
            whole.hits += p.hits
            whole.misses += p.misses
            whole.fill_s += p.fill_s
            whole.dct_reduced += p.dct_reduced
            if whole.dct_crop is None:
                whole.dct_crop = p.dct_crop
        return whole

    def served_reduced(self, params) -> None:
        """Counts a row that :meth:`~shardkit.stream.cache.DecodedCache.dct_reduced`."""
        self.dct_reduced += 1
        if self.dct_crop is None:
            self.dct_crop = (params.width, params.height)


class SampleStages:
    """read -> verify -> cache -> decode or transform -> augment -> policy, for one dataset.

    Args:
        source: the :class:`ShardSource` (``read`` verifies the xxh3 when the source does).
        on_error: an :class:`ErrorHandler` (:func:`error_handler`).
        on_warning: a :class:`WarningHandler` (:func:`warning_handler`).
        transform, decode, decoder: what :meth:`item` makes of the stored bytes:
            ``transform(data, rng)`` when a transform is given, else the decoded uint8
            ``(H, W, 3)`` RGB array (``decode``, with decoder ``decoder``; its warnings go to
            ``on_warning``), else the bytes. The batch path passes its thread's transform.
        cache: a :class:`~shardkit.stream.cache.DecodedCache` or None (batch rows).
        augment: an :class:`~shardkit.augment.AugmentSpec` that is not the identity, or None;
            drawn from each sample's RNG right after the crop's draws, applied to the row
            (``augment_on_device=False``) or carried in ``BatchTally.programs``.
        size: the rows' side ``S`` in pixels (the augment draws' size).

    The settings are plain attributes: a dataset that changes one changes it here.
    """

    def __init__(self, source: ShardSource, *, on_error: ErrorHandler,
                 on_warning: WarningHandler, transform: Callable | None = None,
                 decode: bool = True, decoder: str = "auto", cache=None, augment=None,
                 augment_on_device: bool = False, size: int = 0):
        self.source = source
        self.on_error = on_error
        self.on_warning = on_warning
        self.transform = transform
        self.decode = bool(decode)
        self.decoder = decoder
        self.cache = cache
        self.augment = augment
        self.augment_on_device = bool(augment_on_device)
        self.size = int(size)

    def reader(self, tf, scratch: bool) -> Callable[[int], bytes | memoryview]:
        """The read stage for transform ``tf``: the thread's reused buffer
        (:meth:`ShardSource.read_scratch`) only with ``scratch`` and a transform that says it
        takes any buffer and keeps nothing (``accepts_buffers``, the factory's, declared by the
        transform itself: :func:`~shardkit.transforms.declared`); else :meth:`ShardSource.read`
        (``bytes`` a custom transform or a subclass may keep)."""
        src = self.source
        return src.read_scratch if scratch and declared(tf, "accepts_buffers") is True else src.read

    # --- the dict datasets -------------------------------------------------------------------
    def item(self, pos: int, rng_at: tuple[int, int, int, int], skipped: list):
        """The ``image`` of the sample at split position ``pos``: ``transform(data, rng)``
        (``rng = sample_rng(*rng_at)``, i.e. ``(seed, epoch, rank, place)``), the decoded
        array, or the stored bytes; :data:`LEFT_OUT` when a policy left it out (its key then
        appended to ``skipped``). Raises what the handlers raise."""
        src = self.source
        try:
            data = src.read(pos)
            if self.transform is not None:
                return self.transform(data, sample_rng(*rng_at))
            if not self.decode:
                return bytes(data)
            image = src.decode(data, pos, self.decoder)
            dec = src.decoder(self.decoder)
            if dec.last_warnings and not self.on_warning(dec.last_warnings, dec.last_warning,
                                                         src, pos):
                skipped.append(src.key(pos))
                return LEFT_OUT
            return image
        except SAMPLE_ERRORS as e:
            skipped.append(self.on_error(e, src, pos))
            return LEFT_OUT

    # --- the batch rows ----------------------------------------------------------------------
    def row(self, tally: BatchTally, i: int, pos: int, rng: np.random.Generator,
            row: np.ndarray, tf, read) -> None:
        """Row ``i`` of a batch (a writable uint8 ``(S, S, 3)`` view) from the sample at
        ``pos``: through the cache when there is one, else ``tf(read(pos), rng, out=row)``;
        then the augment program; the transform's warnings and any sample error go to the
        handlers, and ``tally`` records the outcome."""
        src = self.source
        augment = self.augment
        try:
            cache = self.cache
            if cache is None and augment is not None and not self.augment_on_device \
                    and _splits_crop(tf):
                # the crop's draws, the augmentation's, then the decode and the ops: the same
                # draws in the same order as below, with the Python of the sample together
                # (drawn after the decode, the draw measured 5x slower: the decode had
                # refilled the caches; benchmarks/README.md "Second pass")
                data = read(pos)
                box, _, probe = tf.crop_box(data, rng)
                steps = compile_hwc(augment.draw(rng, self.size, self.size, tally.epoch),
                                    row.shape)
                tf.decode_crop(data, box, probe, row)
                run_steps(row, steps)
                augment = None  # applied
            elif cache is None:
                out = tf(read(pos), rng, out=row)
                if out is not None and out is not row:  # the factory's transforms fill `row`
                    row[...] = out
            elif cache.lookup(pos, tf, rng, row):
                tally.hits += 1
                if cache.dct_reduced(pos, tf.last_params):
                    tally.served_reduced(tf.last_params)
            else:
                tally.misses += 1
                t0 = time.perf_counter()
                served = cache.fill(pos, read(pos), tf, rng, row)
                tally.fill_s += time.perf_counter() - t0
                if served and cache.dct_reduced(pos, tf.last_params):
                    tally.served_reduced(tf.last_params)
            if augment is not None:  # after the crop's draws: same program on any path
                program = augment.draw(rng, self.size, self.size, tally.epoch)
                if self.augment_on_device:
                    tally.programs.append(program)
                else:
                    apply_hwc(row, program)
            nw = getattr(tf, "last_warnings", 0)
            if nw:
                if self.on_warning(nw, getattr(tf, "last_warning", None), src, pos):
                    tally.warned.append(src.key(pos))
                else:
                    tally.leave_out(i, src.key(pos))
        except SAMPLE_ERRORS as e:
            tally.leave_out(i, self.on_error(e, src, pos))
        if self.augment_on_device and augment is not None and len(tally.programs) <= i:
            tally.programs.append([])  # keeps programs aligned with rows (skipped rows drop)

    def encoded(self, tally: BatchTally, i: int, pos: int, rng: np.random.Generator,
                tf) -> None:
        """Row ``i`` of an encoded batch (``device_decode``): the sample's stored bytes and
        the crop ``tf.crop_box`` draws from its header (the fused path's RNG draws), then its
        augment program; a sample error goes to the error handler."""
        src = self.source
        try:
            data = bytes(src.read(pos))
            box, flip, _ = tf.crop_box(data, rng)
        except SAMPLE_ERRORS as e:
            tally.leave_out(i, self.on_error(e, src, pos))
            return
        tally.datas.append(data)
        tally.boxes.append(box)
        tally.flips.append(flip)
        if self.augment is not None:
            tally.programs.append(self.augment.draw(rng, self.size, self.size, tally.epoch))
