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
import threading
import time
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from ..augment.mix import NO_MIX, BatchMix, MixDraw, apply_mix, mix_rng
from ..augment.prims import apply_hwc
from ..errors import ConfigError, DecodeWarningError, ShardkitError
from ..sharding import EpochPlan, num_batches, sample_rng
from .options import ON_WARNING, SamplingOptions, resolve_train
from .source import ShardSource, worker_id_count
from .state import Sampling

__all__ = ["ShardDataset", "MapShardDataset", "BatchDataset", "BatchReport", "EncodedBatch",
           "BufferPool"]

log = logging.getLogger("shardkit.stream")

#: Errors a bad sample may raise while it is read or decoded (handled by ``on_error``).
SAMPLE_ERRORS = (ShardkitError, OSError, ValueError, RuntimeError)


def _check_on_warning(on_warning: str) -> str:
    if on_warning not in ON_WARNING:
        raise ConfigError(f"on_warning={on_warning!r} is not one of {list(ON_WARNING)}")
    return on_warning


def _warning_check(source: ShardSource, pos: int, n: int, message, policy: str) -> bool:
    """Applies the decoder-warning policy to one sample; True to keep it."""
    if n == 0 or policy == "keep":
        return True
    from ..decode import apply_warning_policy

    return apply_warning_policy(n, policy, f"shard {source.shard_name(pos)}: sample "
                                f"{source.key(pos)!r}", message)


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
        self.decode = bool(decode)
        self.decoder = decoder
        self.transform = transform
        self.on_warning = _check_on_warning(on_warning)
        self.skipped: list[str] = []

    def __len__(self) -> int:
        """Samples this rank yields per epoch (all workers together)."""
        return self.sampling.rank_samples()

    def _sample(self, plan: EpochPlan, j: int) -> dict | None:
        src = self.source
        pos = int(plan.positions[j])
        data = src.read(pos)
        if self.transform is not None:
            image = self.transform(data, sample_rng(self.sampling.seed, plan.epoch, plan.rank,
                                                      plan.place(j)))
        elif self.decode:
            image = src.decode(data, pos, self.decoder)
            dec = src.decoder(self.decoder)
            if not _warning_check(src, pos, dec.last_warnings, dec.last_warning,
                                  self.on_warning):
                self.skipped.append(src.key(pos))
                return None
        else:
            image = bytes(data)
        return {"key": src.key(pos), "label": int(src.index.label[pos]), "image": image,
                "index": pos, "valid": bool(plan.valid[j])}

    def __iter__(self) -> Iterator[dict]:
        plan, batches = self._worker_batches()
        for b in batches:
            sl = plan.batch_slice(int(b))
            for j in range(sl.start, sl.stop):
                try:
                    sample = self._sample(plan, j)
                except DecodeWarningError:
                    raise  # on_warning="raise" is the user's choice: on_error does not apply
                except SAMPLE_ERRORS as e:
                    self.skipped.append(self.source.handle_error(e, int(plan.positions[j])))
                    continue
                if sample is not None:
                    yield sample


class MapShardDataset(Dataset):
    """Map-style dataset over one split, any format (tar shards via the offset index).

    ``ds[i]`` is the dict described in :class:`ShardDataset` for split position ``i``
    (``valid`` is always True). ``transform(data, rng)`` gets an RNG derived from
    ``(seed, epoch, 0, i)``. Use a sampler (e.g. ``DistributedSampler``) for order and ranks.

    Raises:
        IndexError: ``i`` outside ``[-len, len)``. ManifestError / ShardCorruptError /
        DecodeError as for :class:`ShardDataset` (no ``on_error``: a map-style item must exist).
    """

    def __init__(self, root, split: str, *, decode: bool = True, transform: Callable | None = None,
                 seed: int = 0, decoder: str = "auto", verify_reads: bool = True):
        self.source = ShardSource(root, split, verify_reads=verify_reads)
        self.decode = bool(decode)
        self.decoder = decoder
        self.transform = transform
        self.seed = int(seed)
        self.epoch = 0

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
        data = src.read(pos)
        if self.transform is not None:
            image = self.transform(data, sample_rng(self.seed, self.epoch, 0, pos))
        elif self.decode:
            image = src.decode(data, pos, self.decoder)
        else:
            image = bytes(data)
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


class BatchReport(NamedTuple):
    """Per-batch accounting: ``skipped`` keys (left out: ``on_error``/``on_warning="skip"``)
    and ``warned`` keys (kept although their decode gave libjpeg warnings); with a decoded cache,
    ``cache_hits`` / ``cache_misses`` (samples served from it / read and decoded) and
    ``cache_fill_s`` (seconds spent reading, decoding and storing the misses, summed over the
    batch's samples)."""

    skipped: tuple[str, ...] = ()
    warned: tuple[str, ...] = ()
    cache_hits: int = 0
    cache_misses: int = 0
    cache_fill_s: float = 0.0


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
        self.augment = None if augment is None or augment.is_identity else augment
        #: the spec when it has batch ops (mixup / cutmix), else None
        self.mix_spec = augment if augment is not None and augment.batch_ops else None
        self._mixers: dict[int, BatchMix | None] = {}
        self.augment_on_device = bool(augment_on_device)
        self.device_decode = bool(device_decode)
        #: a :class:`~shardkit.stream.cache.DecodedCache` or None
        self.cache = cache
        self.source = source
        self.sampling = sampling
        self.transform = transform
        self.image_size = int(image_size)
        self.on_warning = _check_on_warning(on_warning)

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
        preallocated ``(n, S, S, 3)`` buffer (no collation, no copy).

        Args:
            transform: the calling thread's copy of ``self.transform`` (a transform keeps
                per-call state such as ``last_warnings``); default ``self.transform``.
            pin: allocate the batch in pinned memory. scratch: read through the thread's reused
                buffer (:meth:`ShardSource.read_scratch`) when the transform declares
                ``accepts_buffers = True`` (any bytes-like ``data``, not kept after the call).
            buffers: a :class:`BufferPool` to take the batch memory from (the thread backend's).
        """
        tf = transform or self.transform
        if self.device_decode:
            return self._build_encoded(plan, b, tf)
        src, size = self.source, self.image_size
        sl = plan.batch_slice(b)
        n = sl.stop - sl.start
        images = buffers.get(n, size, pin) if buffers is not None else _batch_buffer(n, size, pin)
        rows = images.permute(0, 2, 3, 1).numpy()  # (n, S, S, 3) C-contiguous view, same memory
        positions = plan.positions[sl]
        keep = np.ones(n, dtype=bool)
        skipped, warned = [], []
        # the thread's reused buffer only for transforms that say they take any buffer and keep
        # nothing (the factory's); a custom transform gets ``bytes`` it may keep
        read = src.read_scratch if scratch and getattr(tf, "accepts_buffers", False) else src.read
        seed, epoch, rank, policy = self.sampling.seed, plan.epoch, plan.rank, self.on_warning
        cache, augment = self.cache, self.augment
        programs: list = []
        hits = misses = 0
        fill_s = 0.0
        for i in range(n):
            pos = int(positions[i])
            try:
                row = rows[i]
                rng = sample_rng(seed, epoch, rank, plan.place(sl.start + i))
                if cache is None:
                    out = tf(read(pos), rng, out=row)
                    if out is not None and out is not row:  # the factory's transforms fill `row`
                        row[...] = out
                elif cache.lookup(pos, tf, rng, row):
                    hits += 1
                else:
                    misses += 1
                    t0 = time.perf_counter()
                    cache.fill(pos, read(pos), tf, rng, row)
                    fill_s += time.perf_counter() - t0
                if augment is not None:  # after the crop's draws: same program on any path
                    program = augment.draw(rng, size, size, epoch)
                    if self.augment_on_device:
                        programs.append(program)
                    else:
                        apply_hwc(row, program)
                nw = getattr(tf, "last_warnings", 0)
                if nw:
                    if _warning_check(src, pos, nw, getattr(tf, "last_warning", None), policy):
                        warned.append(src.key(pos))
                    else:
                        skipped.append(src.key(pos))
                        keep[i] = False
            except DecodeWarningError:
                raise  # on_warning="raise" is the user's choice: on_error does not apply
            except SAMPLE_ERRORS as e:
                skipped.append(src.handle_error(e, pos))
                keep[i] = False
            if self.augment_on_device and augment is not None and len(programs) <= i:
                programs.append([])  # keeps programs aligned with rows (skipped rows drop)
        if skipped:
            positions = positions[keep]
            programs = [p for p, k in zip(programs, keep) if k]
            images = images[torch.from_numpy(np.flatnonzero(keep))].contiguous(
                memory_format=torch.channels_last)
        labels = torch.from_numpy(src.index.label[positions])
        meta = {"index": torch.from_numpy(positions.copy()),
                "valid": torch.from_numpy(plan.valid[sl][keep])}
        if self.augment_on_device and augment is not None:
            meta["augment"] = programs
        images, labels = self._mix(plan, b, images, labels, meta,
                                   ready=not (self.augment_on_device and augment is not None))
        return images, labels, meta, BatchReport(tuple(skipped), tuple(warned), hits, misses,
                                                 fill_s)

    def _build_encoded(self, plan: EpochPlan, b: int, tf):
        """Batch ``b`` as an :class:`EncodedBatch`: bytes and crops only (the transform's
        :meth:`~shardkit.transforms.SampleTransform.crop_box` reads just the header)."""
        src, sl = self.source, plan.batch_slice(b)
        positions = plan.positions[sl]
        keep = np.ones(len(positions), dtype=bool)
        datas, boxes, flips, skipped, programs = [], [], [], [], []
        for i, pos in enumerate(positions.tolist()):
            try:
                data = bytes(src.read(pos))
                rng = sample_rng(self.sampling.seed, plan.epoch, plan.rank,
                                 plan.place(sl.start + i))
                box, flip, _ = tf.crop_box(data, rng)
            except SAMPLE_ERRORS as e:
                skipped.append(src.handle_error(e, pos))
                keep[i] = False
                continue
            datas.append(data)
            boxes.append(box)
            flips.append(flip)
            if self.augment is not None:
                programs.append(self.augment.draw(rng, self.image_size, self.image_size,
                                                  plan.epoch))
        positions = positions[keep]
        meta = {"index": torch.from_numpy(positions.copy()),
                "valid": torch.from_numpy(plan.valid[sl][keep])}
        if self.augment is not None:
            meta["augment"] = programs
        labels = torch.from_numpy(src.index.label[positions])
        self._mix(plan, b, None, labels, meta, ready=False)  # mixed after the device decode
        return EncodedBatch(datas, boxes, flips), labels, meta, BatchReport(tuple(skipped))


class BufferPool:
    """Batch memory for the thread backend, reused once the consumer has dropped every tensor
    (and numpy array) that refers to it: a fresh 9.6 MB batch (64 x 224 x 224 x 3) costs its
    page faults and zeroing each time (measured 2.1 ms vs 0.6 ms to fill a reused one, per batch,
    on a 2-core VM; benchmarks/README.md). A buffer is reused only when its storage's use count
    (``torch._C._storage_Use_Count``, the count behind ``torch.multiprocessing``'s
    ``StorageWeakRef``) shows that nothing but the pool holds it, so a batch the caller keeps
    (``list(loader)``) is never overwritten. At most ``limit`` buffers are remembered.
    """

    def __init__(self, limit: int):
        self.limit = max(1, int(limit))
        self._storages: list = []
        self._lock = threading.Lock()
        self._use_count = getattr(torch._C, "_storage_Use_Count", None)

    def get(self, n: int, size: int, pin: bool) -> torch.Tensor:
        """uint8 ``(n, 3, size, size)`` channels_last, uninitialised (as :func:`_batch_buffer`)."""
        nbytes = n * 3 * size * size
        if self._use_count is None:
            return _batch_buffer(n, size, pin)
        with self._lock:
            for st in self._storages:
                if st.nbytes() == nbytes and st.is_pinned() == pin \
                        and self._use_count(st._cdata) == 1:
                    return _view(st, n, size)
            images = _batch_buffer(n, size, pin)
            self._storages.append(images.untyped_storage())
            if len(self._storages) > self.limit:
                self._storages.pop(0)  # forget the oldest: it is freed when its user drops it
            return images

    def clear(self) -> None:
        with self._lock:
            self._storages.clear()


def _view(storage, n: int, size: int) -> torch.Tensor:
    """The ``(n, 3, size, size)`` channels_last uint8 tensor over ``storage``."""
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)
    return flat.view(n, size, size, 3).permute(0, 3, 1, 2)


def _batch_buffer(n: int, size: int, pin: bool) -> torch.Tensor:
    """uint8 ``(n, 3, size, size)`` channels_last, uninitialised. Inside a DataLoader worker it is
    allocated in shared memory from the start: a worker's batch must cross into the main process,
    and a private buffer would be copied into a fresh shared segment when it is sent (measured
    ~0.19 ms per 224 px image here, against ~0.12 ms for writing into shared memory directly)."""
    shape = (n, 3, size, size)
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if pin or new_shared is None or torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8, memory_format=torch.channels_last,
                           pin_memory=pin)
    return _view(new_shared(n * 3 * size * size), n, size)  # channels_last strides
