"""The three datasets over a packed split, side by side.

- :class:`ShardDataset`: an ``IterableDataset`` of per-sample dicts, exactly-once over
  ranks x DataLoader workers (field case 2), for a user's own ``DataLoader``;
- :class:`MapShardDataset`: map-style, ``ds[i]`` for any sampler;
- :class:`BatchDataset`: whole uint8 batches built in place, the engine of
  :func:`shardkit.stream.make_loader` (its backends call :meth:`BatchDataset.build`).

All three read through one :class:`~shardkit.stream.source.ShardSource` and, for the iterable
ones, plan epochs with one :class:`~shardkit.stream.state.Sampling`. Which samples a consumer
reads is decided from ``(seed, epoch, rank, world_size, worker_id, num_workers)`` explicitly,
never from a library default; augmentation randomness comes from ``(seed, epoch, rank,
position)`` only (field case 17), so it does not depend on ``num_workers`` or the backend.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from ..augment.mix import NO_MIX, BatchMix, MixDraw, apply_mix, mix_rng
from ..errors import ShardkitError
from ..sharding import EpochPlan, num_batches, sample_rngs
from ..transforms import declared
from .buffers import BufferPool, batch_buffer
from .options import SamplingOptions, resolve_train
from .source import ShardSource, worker_id_count
from .stages import (LEFT_OUT, BatchTally, SampleStages, error_handler,
                     warning_handler)
from .state import Sampling

__all__ = ["ShardDataset", "MapShardDataset", "BatchDataset", "BatchReport", "EncodedBatch",
           "BatchInProgress"]

log = logging.getLogger("shardkit.stream")


class _InStages:
    """A dataset setting kept in the dataset's :class:`~shardkit.stream.stages.SampleStages`
    (under the same name), so that setting it on the dataset reaches every later sample."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.stages, self.name)

    def __set__(self, obj, value) -> None:
        setattr(obj.stages, self.name, value)


class _OnWarning:
    """``on_warning`` of a dataset: the policy's name; setting it sets the stages' handler
    (:func:`~shardkit.stream.stages.warning_handler`: a ConfigError for an unknown name)."""

    def __get__(self, obj, owner=None):
        return self if obj is None else obj.stages.on_warning.name

    def __set__(self, obj, value: str) -> None:
        obj.stages.on_warning = warning_handler(value)


class _Iterable(IterableDataset):
    """What the two iterable datasets share: a source, a sampling, epoch control."""

    source: ShardSource
    sampling: Sampling

    @property
    def classes(self) -> list[str]:
        """Class names from the manifest; label ``i`` is ``classes[i]``."""
        return self.source.classes

    @property
    def epoch(self) -> int:
        return self.sampling.epoch

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch used for order and augmentation RNG (call before iterating; reaches
        persistent worker processes too)."""
        self.sampling.set_epoch(epoch)

    def set_streams(self, streams: int) -> None:
        self.sampling.set_streams(streams)

    def plan(self, epoch: int | None = None) -> EpochPlan:
        return self.sampling.plan(epoch)

    def _worker_batches(self) -> tuple[EpochPlan, np.ndarray]:
        plan = self.sampling.plan()
        wid, nw = worker_id_count()
        return plan, plan.worker_batches(wid, nw, self.sampling.state.start_batch)


class ShardDataset(_Iterable):
    """Iterable dataset over one split (local folder, or fsspec URL for ``wds`` tar shards).

    Yields dicts: ``key`` (str), ``label`` (int in ``[0, num_classes)``), ``index`` (int,
    position in split order), ``valid`` (bool; False only for ``even="pad"`` repeats) and
    ``image``: the stored bytes (``decode=False``), a uint8 ``(H, W, 3)`` RGB numpy array
    (``decode=True``), or ``transform(data, rng)`` when ``transform`` is given (it receives the
    stored bytes and a ``numpy.random.Generator`` derived from ``(seed, epoch, rank,
    position)``, field case 17).

    Args:
        root, split: the packed dataset and split name.
        train: the mode: None (default) from the split's name (val, validation, valid, test,
            dev, eval: evaluation; any other: training; logged at INFO), or a bool (True on an
            eval split warns). It sets the default order only (the ``transform`` is yours):
            ``sampling.shuffle=None`` means shuffled for training, plan order for evaluation,
            as in :func:`~shardkit.stream.make_loader`.
        sampling: a :class:`~shardkit.stream.SamplingOptions`.
        seed: order and augmentation seed.
        batch_size: worker granularity: consecutive runs of ``batch_size`` samples go to one
            worker, so ``DataLoader(ds, batch_size=batch_size, num_workers=k)`` returns batches
            in plan order. Use the same value for both.
        streams: cut this rank's epoch into this many contiguous ranges (range ``w`` read by
            worker ``w`` when ``streams == num_workers``; with ``block``: whole shards).
        decode, decoder, transform: what ``image`` is (see above); ``decoder`` is a
            :data:`shardkit.decode.DECODERS` name or ``"auto"``.
        on_error: ``"raise"`` (names shard and key) or ``"skip"`` (logged; keys in ``skipped``
            of the consuming process). on_warning: ``"keep"``, ``"skip"`` or ``"raise"`` for a
            decode with libjpeg warnings (``decode=True`` only).
        verify_reads: check each sample's xxh3 against the index (a damaged sample is a
            ShardCorruptError naming it, handled by ``on_error``).

    Raises:
        ManifestError: no finished dataset or unknown split. ConfigError: invalid option.
        LoaderError: ``mode="stream"`` on an eval split or with ``train=False``.
    """

    def __init__(self, root, split: str, *, train: bool | None = None,
                 sampling: SamplingOptions | None = None, seed: int = 0, batch_size: int = 1,
                 streams: int = 1, decode: bool = True, decoder: str = "auto",
                 transform: Callable | None = None, on_error: str = "raise",
                 on_warning: str = "keep", verify_reads: bool = True):
        self.train = resolve_train(train, split, "ShardDataset")
        self.source = ShardSource(root, split, on_error, verify_reads)
        self.sampling = Sampling(self.source, sampling or SamplingOptions(), seed=seed,
                                 batch_size=batch_size, train=self.train, streams=streams)
        #: the per-sample stages (:class:`~shardkit.stream.stages.SampleStages`)
        self.stages = SampleStages(self.source, on_error=error_handler(on_error),
                                   on_warning=warning_handler(on_warning), transform=transform,
                                   decode=decode, decoder=decoder)
        self.skipped: list[str] = []

    transform = _InStages()
    decode = _InStages()
    decoder = _InStages()
    on_warning = _OnWarning()

    def __len__(self) -> int:
        """Samples this rank yields per epoch (all workers together)."""
        return self.sampling.rank_samples()

    def __iter__(self) -> Iterator[dict]:
        plan, batches = self._worker_batches()
        src, item, seed = self.source, self.stages.item, self.sampling.seed
        src.prefetch_epoch(plan, batches)  # remote shards fetched ahead, in this order
        for b in batches:
            sl = plan.batch_slice(int(b))
            src.prefetch_reading(plan)
            for j in range(sl.start, sl.stop):
                pos = int(plan.positions[j])
                image = item(pos, (seed, plan.epoch, plan.rank, plan.place(j)), self.skipped)
                if image is not LEFT_OUT:
                    yield {"key": src.key(pos), "label": int(src.index.label[pos]),
                           "image": image, "index": pos, "valid": bool(plan.valid[j])}
            src.prefetch_done(plan, plan.positions[sl])


class MapShardDataset(Dataset):
    """Map-style dataset over one split, any format (tar shards via the offset index).

    ``ds[i]`` is the dict described in :class:`ShardDataset` for split position ``i``
    (``valid`` is always True). ``transform(data, rng)`` gets an RNG derived from
    ``(seed, epoch, 0, i)``. Use a sampler (e.g. ``DistributedSampler``) for order and ranks.

    Raises:
        IndexError: ``i`` outside ``[-len, len)``. ManifestError / ShardCorruptError /
        DecodeError / ResourceLimitError as :class:`ShardDataset` with ``on_error="raise"`` (a
        map-style item must exist): an error that does not name the sample (an ``OSError`` of
        the shard file, the transform's own error) becomes a DecodeError naming shard and key.
    """

    def __init__(self, root, split: str, *, decode: bool = True, transform: Callable | None = None,
                 seed: int = 0, decoder: str = "auto", verify_reads: bool = True):
        self.source = ShardSource(root, split, verify_reads=verify_reads)
        #: the per-sample stages: on_error="raise" (an item must exist), warnings kept
        self.stages = SampleStages(self.source, on_error=error_handler("raise"),
                                   on_warning=warning_handler("keep"),
                                   transform=transform, decode=decode, decoder=decoder)
        self.seed = int(seed)
        self.epoch = 0

    transform = _InStages()
    decode = _InStages()
    decoder = _InStages()

    @property
    def classes(self) -> list[str]:
        return self.source.classes

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch for the transform RNG."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i) -> dict:
        n = len(self.source)
        if isinstance(i, torch.Tensor):
            i = int(i)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for split {self.source.split!r} with "
                             f"{n} samples")
        pos = i % n
        src = self.source
        image = self.stages.item(pos, (self.seed, self.epoch, 0, pos), [])
        return {"key": src.key(pos), "label": int(src.index.label[pos]), "image": image,
                "index": pos, "valid": True}


class EncodedBatch(NamedTuple):
    """A batch read but not decoded (``device_decode``): the stored bytes of each sample and
    its crop, drawn on the CPU with the same RNG as the fused path."""

    datas: list
    boxes: list
    flips: list

    def decode(self, device, size: int, interpolation: str, train: bool, max_pixels=None):
        """uint8 ``(n, 3, S, S)`` RGB on ``device``, ``channels_last``
        (:func:`shardkit.decode.nvjpeg.decode_crop_batch`: one batched ``decode_jpeg`` call,
        nvJPEG on CUDA)."""
        from ..decode.nvjpeg import decode_crop_batch

        images = decode_crop_batch(self.datas, self.boxes, self.flips, size, device,
                                   interpolation, crop_first=train, max_pixels=max_pixels)
        return images.contiguous(memory_format=torch.channels_last)


class BatchInProgress(NamedTuple):
    """A batch whose rows are being built (:meth:`BatchDataset.start_batch`): its ``plan``,
    number ``b``, ``slice`` of the plan, ``n`` rows, ``images`` (uint8 ``(n, 3, S, S)``
    channels_last), ``rows`` (the same memory as ``(n, S, S, 3)``) and ``positions``."""

    plan: EpochPlan
    b: int
    slice: slice
    n: int
    images: torch.Tensor
    rows: np.ndarray
    positions: np.ndarray


class BatchReport(NamedTuple):
    """Per-batch accounting: ``skipped`` keys (left out: ``on_error``/``on_warning="skip"``)
    and ``warned`` keys (kept although their decode gave libjpeg warnings); with a decoded cache,
    ``cache_hits`` / ``cache_misses`` (samples served from it / read and decoded) and
    ``cache_fill_s`` (seconds spent reading, decoding and storing the misses, summed over the
    batch's samples), ``cache_dct_reduced`` (samples served from it whose uncached decode would
    have been DCT-reduced: not bit-exact) and ``cache_dct_crop`` (the first one's crop
    ``(width, height)``, or None)."""

    skipped: tuple[str, ...] = ()
    warned: tuple[str, ...] = ()
    cache_hits: int = 0
    cache_misses: int = 0
    cache_fill_s: float = 0.0
    cache_dct_reduced: int = 0
    cache_dct_crop: tuple[int, int] | None = None


class BatchDataset(_Iterable):
    """Iterable of whole batches ``(images, labels, meta, report)`` of one rank.

    ``images``: uint8 ``(n, 3, S, S)`` RGB, ``channels_last`` memory layout, values 0..255;
    ``labels``: int64 ``(n,)``; ``meta``: ``{"index": int64 (n,) split positions, "valid": bool
    (n,) (False for ``even="pad"`` repeats)}``, plus ``"augment"`` (one program per row, see
    :mod:`shardkit.augment.prims`) when the augmentation runs on a device; ``report``: a
    :class:`BatchReport` (skipped rows are left out, so ``n`` can be smaller than the planned
    batch). Built by :func:`~shardkit.stream.make_loader`; use that.

    ``augment``: an :class:`~shardkit.augment.AugmentSpec` or None. Each sample's program is
    drawn from its RNG right after the crop's draws (so it is a pure function of ``(seed,
    epoch, rank, position)``) and applied in the decoding thread to the row the crop wrote
    (``augment_on_device=False``), or carried in ``meta["augment"]`` for the device.

    Batch ops (``mixup`` / ``cutmix`` in ``augment``): batch ``b``'s
    :class:`~shardkit.augment.MixDraw` comes from
    :func:`~shardkit.augment.mix_rng` ``(seed, epoch, rank, b)``, ``b`` the batch's place in
    the epoch plan, so it is the same for any ``num_workers``, backend or resume point, and it
    is applied exactly once: here, to the finished uint8 batch (``labels`` then float32
    ``(n, num_classes)`` soft targets), or, when the pixels are finished later on a device
    (``device_decode``, ``augment_on_device``), carried in ``meta["mix"]`` for
    :meth:`mix_batch` there (``labels`` stay int64 until then).
    """

    def __init__(self, source: ShardSource, sampling: Sampling, transform: Callable,
                 image_size: int, on_warning: str = "keep", device_decode: bool = False,
                 cache=None, augment=None, augment_on_device: bool = False):
        #: the spec when it has batch ops (mixup / cutmix), else None
        self.mix_spec = augment if augment is not None and augment.batch_ops else None
        self._mixers: dict[int, BatchMix | None] = {}
        self.device_decode = bool(device_decode)
        self.source = source
        self.sampling = sampling
        self.transform = transform
        self.image_size = int(image_size)
        #: the per-sample stages (:class:`~shardkit.stream.stages.SampleStages`) of every row;
        #: ``cache`` (a :class:`~shardkit.stream.cache.DecodedCache` or None), ``augment``
        #: (None when the identity), ``augment_on_device`` and ``on_warning`` live there
        self.stages = SampleStages(
            source, on_error=error_handler(source.on_error),
            on_warning=warning_handler(on_warning), cache=cache,
            augment=None if augment is None or augment.is_identity else augment,
            augment_on_device=augment_on_device, size=self.image_size)

    cache = _InStages()
    augment = _InStages()
    augment_on_device = _InStages()
    on_warning = _OnWarning()

    @property
    def batch_size(self) -> int:
        return self.sampling.batch_size

    def __len__(self) -> int:
        s = self.sampling
        return num_batches(s.rank_samples(), s.batch_size, s.drop_last)

    @property
    def num_classes(self) -> int:
        return len(self.source.classes)

    def mix_draw(self, epoch: int, rank: int, b: int) -> MixDraw:
        """Batch ``b``'s :class:`~shardkit.augment.MixDraw` at ``epoch`` (no mix when the spec's
        batch ops are off at that epoch: ``alpha`` or ``p`` scheduled to 0)."""
        mixer = self._mixers.get(epoch, False)
        if mixer is False:
            mixer = BatchMix.from_spec(self.mix_spec.resolved(epoch, batch=True),
                                       self.num_classes)
            self._mixers = {epoch: mixer}  # one epoch at a time: no growth over a long run
        if mixer is None:
            return NO_MIX
        return mixer.draw_batch(mix_rng(self.sampling.seed, epoch, rank, b), self.image_size,
                                self.image_size)

    def mix_batch(self, images: torch.Tensor, labels: torch.Tensor, draw: MixDraw):
        """``(images mixed in place, float32 (n, num_classes) soft targets)``
        (:func:`~shardkit.augment.apply_mix`); a label outside the manifest's classes is a
        LabelError naming the split."""
        try:
            return apply_mix(images, labels, draw, self.num_classes)
        except ShardkitError as e:
            raise type(e)(f"split {self.source.split!r}: {e}") from None

    def _mix(self, plan: EpochPlan, b: int, images, labels, meta: dict, ready: bool):
        """Batch ``b``'s mix: applied now when the pixels are final (``ready``), else carried
        in ``meta["mix"]``; returns ``(images, labels)``."""
        if self.mix_spec is None:
            return images, labels
        draw = self.mix_draw(plan.epoch, plan.rank, b)
        if not ready:
            meta["mix"] = draw
            return images, labels
        return self.mix_batch(images, labels, draw)

    def __iter__(self):  # the "process" backend: inside a DataLoader worker
        plan, batches = self._worker_batches()
        for b in batches:
            yield self.build(plan, int(b))

    def build(self, plan: EpochPlan, b: int, *, transform: Callable | None = None,
              pin: bool = False, scratch: bool = True, buffers: "BufferPool | None" = None):
        """Batch ``b`` of ``plan``: every sample read and transformed straight into one
        preallocated ``(n, S, S, 3)`` buffer (no collation, no copy). Remote shards: the first
        build of a plan in a process schedules this process's batches for the prefetcher
        (:meth:`ShardSource.prefetch_epoch`); each build frees its samples there.

        Args:
            transform: the calling thread's copy of ``self.transform`` (a transform keeps
                per-call state such as ``last_warnings``); default ``self.transform``.
            pin: allocate the batch in pinned memory. scratch: read through the thread's reused
                buffer (:meth:`ShardSource.read_scratch`) when the transform declares
                ``accepts_buffers = True`` (any bytes-like ``data``, not kept after the call).
            buffers: a :class:`BufferPool` to take the batch memory from (the thread backend's).

        :meth:`start_batch`, :meth:`build_part` and :meth:`finish_batch` are the same work in
        pieces, so that several threads can build the rows of one batch (the thread backend
        does so for an epoch's last batch); the result is the same batch.
        """
        tf = transform or self.transform
        if self.device_decode:
            self._schedule(plan)
            self.source.prefetch_reading(plan)
            try:
                return self._build_encoded(plan, b, tf)
            finally:
                self.source.prefetch_done(plan, plan.positions[plan.batch_slice(b)])
        batch = self.start_batch(plan, b, pin=pin, buffers=buffers)
        part = self.build_part(batch, 0, batch.n, tf, scratch)
        return self.finish_batch(batch, [part])

    def _schedule(self, plan: EpochPlan) -> None:
        src = self.source
        if src.prefetch_wanted(plan):  # the first build of this plan in this process
            batches = plan.worker_batches(*worker_id_count(), self.sampling.state.start_batch)
            full = self.cache is not None and self.cache.stats()["filled_samples"] >= len(src)
            src.prefetch_epoch(plan, batches[:0] if full else batches)  # a full cache reads none

    def start_batch(self, plan: EpochPlan, b: int, *, pin: bool = False,
                    buffers: "BufferPool | None" = None) -> "BatchInProgress":
        """Batch ``b``'s memory (uint8 ``(n, 3, S, S)`` channels_last, from ``buffers`` when
        given) and positions, its rows not yet built (not for ``device_decode``)."""
        self._schedule(plan)
        sl = plan.batch_slice(b)
        n = sl.stop - sl.start
        size = self.image_size
        images = buffers.get(n, size, pin) if buffers is not None else batch_buffer(n, size, pin)
        return BatchInProgress(plan, b, sl, n, images, images.permute(0, 2, 3, 1).numpy(),
                               plan.positions[sl])

    def build_part(self, batch: "BatchInProgress", lo: int, hi: int, transform: Callable,
                   scratch: bool = True) -> BatchTally:
        """Rows ``lo:hi`` of ``batch`` read and transformed into its memory with ``transform``
        (the calling thread's copy); returns their :class:`BatchTally` (row ``lo`` is its 0).
        Parts of one batch may run in different threads at once."""
        plan, stages, src = batch.plan, self.stages, self.source
        rows, positions, first = batch.rows, batch.positions, batch.slice.start
        read = stages.reader(transform, scratch)
        rng_at = sample_rngs(self.sampling.seed, declared(transform, "keeps_rng") is False)
        epoch, rank = plan.epoch, plan.rank
        tally = BatchTally(hi - lo, epoch)
        src.prefetch_reading(plan)
        try:
            for i in range(lo, hi):
                stages.row(tally, i - lo, int(positions[i]),
                           rng_at(epoch, rank, plan.place(first + i)), rows[i], transform, read)
        finally:
            src.prefetch_done(plan, positions[lo:hi])
        return tally

    def finish_batch(self, batch: "BatchInProgress", parts: list[BatchTally]):
        """The batch ``(images, labels, meta, BatchReport)`` once ``parts`` (the tallies of
        :meth:`build_part`, in row order, covering every row) are built: rows left out
        dropped, labels, ``meta``, batch ops (mixup / cutmix)."""
        tally = BatchTally.join(parts, batch.plan.epoch)
        stages, positions, images = self.stages, batch.positions, batch.images
        keep, programs = tally.keep, tally.programs
        if tally.skipped:
            positions = positions[keep]
            programs = [p for p, k in zip(programs, keep) if k]
            images = images[torch.from_numpy(np.flatnonzero(keep))].contiguous(
                memory_format=torch.channels_last)
        labels = torch.from_numpy(self.source.index.label[positions])
        meta = _meta(batch.plan, batch.slice, positions, keep)
        on_device = stages.augment_on_device and stages.augment is not None
        if on_device:
            meta["augment"] = programs
        images, labels = self._mix(batch.plan, batch.b, images, labels, meta,
                                   ready=not on_device)
        return images, labels, meta, BatchReport(tuple(tally.skipped), tuple(tally.warned),
                                                 tally.hits, tally.misses, tally.fill_s,
                                                 tally.dct_reduced, tally.dct_crop)

    def _build_encoded(self, plan: EpochPlan, b: int, tf):
        """Batch ``b`` as an :class:`EncodedBatch`: bytes and crops only (the transform's
        :meth:`~shardkit.transforms.SampleTransform.crop_box` reads just the header)."""
        stages, sl = self.stages, plan.batch_slice(b)
        positions = plan.positions[sl]
        tally = BatchTally(len(positions), plan.epoch)
        rng_at = sample_rngs(self.sampling.seed, declared(tf, "keeps_rng") is False)
        for i, pos in enumerate(positions.tolist()):
            stages.encoded(tally, i, pos, rng_at(plan.epoch, plan.rank, plan.place(sl.start + i)),
                           tf)
        positions = positions[tally.keep]
        meta = _meta(plan, sl, positions, tally.keep)
        if stages.augment is not None:
            meta["augment"] = tally.programs
        labels = torch.from_numpy(self.source.index.label[positions])
        self._mix(plan, b, None, labels, meta, ready=False)  # mixed after the device decode
        return (EncodedBatch(tally.datas, tally.boxes, tally.flips), labels, meta,
                BatchReport(tuple(tally.skipped)))


def _meta(plan: EpochPlan, sl: slice, positions: np.ndarray, keep: np.ndarray) -> dict:
    """A batch's ``meta``: int64 ``index`` (the kept rows' split positions) and bool ``valid``
    (False for ``even="pad"`` repeats) of the rows of ``sl`` that ``keep`` keeps."""
    return {"index": torch.from_numpy(positions.copy()),
            "valid": torch.from_numpy(plan.valid[sl][keep])}
