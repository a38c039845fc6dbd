"""The fast batch path: :func:`make_loader` -> :class:`ShardLoader`.

Batches are built WHOLE: every sample of batch ``b`` is decoded and augmented straight into one
preallocated uint8 buffer ``(N, S, S, 3)`` (each row written through the transform's ``out=``),
returned as the ``(N, 3, S, S)`` ``channels_last`` view of that buffer plus int64 labels: no
collation and no copy (the idea of timm's ``fast_collate``, done where the batch is built).
Batch ops (mixup / cutmix) then mix that batch in place and turn its labels into float32 soft
targets (timm's ``FastCollateMixup``). Floats appear only on the device
(:class:`~shardkit.stream.DeviceNormalizer`).

Train or eval is the split's mode: ``train=None`` reads it from the split's name
(:func:`~shardkit.stream.options.resolve_train`), and every default follows it (transform,
shuffle, ``even``; evaluation never augments).

``len(loader)`` is exact (batches this rank yields in a full epoch), whatever ``num_workers``
and backend. A resume point is ``(epoch, batches consumed)``, valid for any ``num_workers``.
"""
from __future__ import annotations

import logging
from typing import Iterator

import torch

from ..errors import LoaderError, ShardkitError
from ..validate import check_int
from .backends import ProcessBackend, ThreadBackend
from .cache import make_cache, shm_reserve
from .datasets import BatchDataset
from .options import SamplingOptions, WorkerOptions
from .prefetch import resolve_prefetch_bytes
from .resolve import (check_device_decode, check_options, rank_sampling, resolve_augment,
                      resolve_mode, resolve_transform, warn_torch_threads)
from .source import ShardSource
from .state import Sampling, check_epoch
from .tuning import check_counts, plan_tuning

__all__ = ["make_loader", "ShardLoader"]

log = logging.getLogger("shardkit.stream")


class ShardLoader:
    """Iterable of ``(images, labels)``; ``(images, labels, meta)`` with ``return_meta``, where
    ``meta = {"index": int64 (N,) split positions, "valid": bool (N,) False for pad repeats}``.

    ``images``: uint8 ``(N, 3, S, S)`` RGB, ``channels_last``, 0..255, CPU (pinned with
    ``pin_memory`` when CUDA is available); ``labels``: int64 ``(N,)`` class indices, or, when
    the augmentation has batch ops (``soft_targets`` True), float32 ``(N, K)`` soft targets
    (``K = len(classes)``, rows sum to 1; see :func:`make_loader`'s ``augment``).

    Attributes:
        dataset: the :class:`~shardkit.stream.BatchDataset`; ``backend``: the
            :class:`~shardkit.stream.ThreadBackend` or :class:`~shardkit.stream.ProcessBackend`.
        skipped: keys left out (``on_error``/``on_warning="skip"``), accumulated over epochs.
        warned: keys kept although their decode gave libjpeg warnings (``on_warning="keep"``).
        transform_config: the :class:`~shardkit.transforms.TransformConfig` of the batches (None
            for a custom transform callable); :class:`DeviceNormalizer` takes its mean/std.
        augment: the :class:`~shardkit.augment.AugmentSpec` (``none`` when off);
            :meth:`augment_values` gives its scheduled strengths at the current epoch.
        augment_device: the device the per-sample ops run on, or None (CPU rows).
        train: the resolved mode (True: training transform, shuffle by default; False:
            evaluation). soft_targets: True when labels are float32 ``(N, K)`` soft targets.

    Use as a context manager (or call :meth:`close`) to stop decoding threads or persistent
    worker processes deterministically.
    """

    def __init__(self, dataset: BatchDataset, backend: ThreadBackend | ProcessBackend,
                 return_meta: bool = False, transform_config=None, device_decode=None,
                 augment=None, augment_device=None, train: bool = True):
        from ..augment import AugmentSpec

        self.dataset = dataset
        self.train = bool(train)
        self.augment = augment if augment is not None else AugmentSpec.parse(None)
        self.augment_device = augment_device
        self.device_decode = device_decode
        self.transform_config = transform_config
        self.backend = backend
        self.return_meta = return_meta
        self.skipped: list[str] = []
        self.warned: list[str] = []
        self._cache_counts = {"hits": 0, "misses": 0, "fill_seconds": 0.0, "dct_reduced": 0}
        self._epoch = 0
        self._position = 0  # batches consumed in the current epoch
        self._resume = False

    @property
    def backend_name(self) -> str:
        """``"thread"`` or ``"process"``."""
        return "thread" if isinstance(self.backend, ThreadBackend) else "process"

    @property
    def tuning(self):
        """The :class:`~shardkit.stream.tuning.Tuning` of ``num_workers`` / ``prefetch_factor``:
        the setting in use, whether it was ``"auto"``, the measurements and the reason
        (``settled`` False while the thread backend is still measuring)."""
        return self.backend.tuning

    @property
    def dataloader(self):
        """The ``torch.utils.data.DataLoader`` of the process backend; None for threads."""
        return getattr(self.backend, "dataloader", None)

    @property
    def start_method(self) -> str | None:
        """Worker start method (``fork``, ``forkserver``, ``spawn``); None for threads or
        without workers."""
        return getattr(self.backend, "start_method", None)

    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    @property
    def soft_targets(self) -> bool:
        """Whether labels are float32 ``(N, K)`` soft targets (batch ops in ``augment``)."""
        return self.dataset.mix_spec is not None

    def describe(self) -> str:
        """The loader configuration in one line (used in hang/timeout reports)."""
        s = self.dataset.sampling
        cache = self.cache
        extra = f", cache={cache.mode}:{cache.resolution}" if cache is not None else ""
        return (f"loader(split={self.dataset.source.split!r}, rank={s.rank}/{s.world_size}, "
                f"epoch={self._epoch}, batch_size={s.batch_size}, {self.backend.describe()}"
                f"{extra})")

    @property
    def cache(self):
        """The :class:`~shardkit.stream.cache.DecodedCache`, or None (no cache)."""
        return self.dataset.cache

    def cache_stats(self) -> dict | None:
        """None without a cache; else the arena's state (every process's fills) plus this
        loader's counters since it was built: ``{"mode", "kind", "resolution", "path",
        "size_bytes" (all samples at the cache resolution), "num_samples", "filled_samples",
        "filled_bytes", "disabled" (why filling stopped, or None), "hits", "misses",
        "hit_rate" (hits / (hits + misses), None before any sample), "fill_seconds" (time
        spent on misses: read + decode + store, summed over decoding threads or workers),
        "dct_reduced" (samples, hits and fills alike, whose crop was resized from the cached
        pixels where the uncached decode would have used a DCT reduction: a JPEG crop with both
        sides >= 2 x image_size; with ``cache_max_side`` unset, exactly the samples whose
        pixels differ from an uncached run's, close but not bit-exact; the first one logs a
        warning, once per loader, whatever the backend), "huge_pages" (the tmpfs huge-page mode
        of the arena's folder, ``"never"``, ``"always"``, ``"within_size"``, ``"advise"``, or
        None off a tmpfs: :func:`~shardkit.stream.memory.tmpfs_huge`)}``.
        """
        cache = self.cache
        if cache is None:
            return None
        out = cache.stats()
        out.update(self._cache_counts)
        total = out["hits"] + out["misses"]
        out["hit_rate"] = out["hits"] / total if total else None
        return out

    @property
    def epoch(self) -> int:
        return self._epoch

    def __len__(self) -> int:
        """Exact number of batches this rank yields in a full epoch (any ``num_workers``)."""
        return len(self.dataset)

    def augment_values(self) -> dict[str, float]:
        """The augmentation strengths at the current epoch, ``{"<index>.<op>.<param>": value}``:
        every scheduled parameter, and every batch op's ``alpha`` and ``p`` (scheduled or
        not, defaults filled in); empty with neither."""
        return {**self.augment.scheduled_values(self._epoch),
                **self.augment.batch_values(self._epoch)}

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch (order, augmentation randomness and the augmentation strength
        schedules). A different epoch drops a pending resume."""
        epoch = check_epoch(epoch)
        if epoch != self._epoch:
            self._epoch, self._position, self._resume = epoch, 0, False

    def state_dict(self) -> dict:
        """``{"epoch", "batches_consumed", "num_batches", "seed", "rank", "world_size",
        "batch_size", "streams"}``: where to resume; valid for any ``num_workers``."""
        s = self.dataset.sampling
        return {"epoch": self._epoch, "batches_consumed": self._position,
                "num_batches": len(self), "seed": s.seed, "rank": s.rank,
                "world_size": s.world_size, "batch_size": s.batch_size, "streams": s.streams}

    def load_state_dict(self, state: dict) -> None:
        """The next iteration yields exactly the batches of ``state["epoch"]`` not yet consumed.
        Adopts the saved ``streams`` (part of the plan), so ``num_workers`` may differ.

        Raises:
            LoaderError: the state was saved with another seed, rank, world size, batch size or
                number of batches per epoch (another dataset or split: the plan would differ),
                or ``batches_consumed`` is out of range.
        """
        s = self.dataset.sampling
        for name, mine in (("seed", s.seed), ("rank", s.rank), ("world_size", s.world_size),
                           ("batch_size", s.batch_size), ("num_batches", len(self))):
            if state.get(name, mine) != mine:
                raise LoaderError(f"cannot resume: state has {name}={state.get(name)!r}, this "
                                  f"loader has {name}={mine!r}")
        consumed = int(state["batches_consumed"])
        if not 0 <= consumed <= len(self):
            raise LoaderError(f"cannot resume: batches_consumed={consumed} not in [0, {len(self)}]")
        s.set_streams(int(state.get("streams", 1)))
        self._epoch, self._position, self._resume = int(state["epoch"]), consumed, True

    def __iter__(self) -> Iterator[tuple]:
        start = self._position if self._resume else 0
        self._resume, self._position = False, start
        state = self.dataset.sampling.state
        state.epoch, state.start_batch = self._epoch, start
        if self.cache is not None:
            self.cache.attach()  # again after close(); before workers fork
        counts = self._cache_counts
        for images, labels, meta, report in self.backend.batches(start, self.describe):
            if report.cache_hits or report.cache_misses:
                counts["hits"] += report.cache_hits
                counts["misses"] += report.cache_misses
                counts["fill_seconds"] += report.cache_fill_s
                if report.cache_dct_reduced:
                    if not counts["dct_reduced"]:  # the loader's first: one warning
                        self.cache.warn_dct(report.cache_dct_crop)
                    counts["dct_reduced"] += report.cache_dct_reduced
            if self.device_decode is not None:
                images = self._decode_on_device(images, meta)
            programs = meta.pop("augment", None)
            if programs is not None:
                images = _augment_on_device(images, programs, self.augment_device)
            mix = meta.pop("mix", None)  # drawn where the batch was built, applied once, here
            if mix is not None:
                images, labels = self.dataset.mix_batch(images, labels.to(images.device), mix)
            self._position += 1
            if report.skipped:
                self.skipped.extend(report.skipped)
            if report.warned:
                if not self.warned:
                    log.warning("sample %r decoded with libjpeg warnings and was kept "
                                "(on_warning='keep'; keys in loader.warned)", report.warned[0])
                self.warned.extend(report.warned)
            yield (images, labels, meta) if self.return_meta else (images, labels)

    def _decode_on_device(self, batch, meta):
        ds, cfg = self.dataset, self.transform_config
        try:
            return batch.decode(self.device_decode, ds.image_size, cfg.interpolation,
                                ds.transform.train, ds.source.max_pixels)
        except ShardkitError as e:
            keys = [ds.source.key(int(i)) for i in meta["index"]]
            raise type(e)(f"split {ds.source.split!r}: batched decode on {self.device_decode} "
                          f"of samples {keys[0]!r}..{keys[-1]!r} failed: {e}") from e

    def close(self) -> None:
        """Stops decoding threads / persistent worker processes, closes shard readers and
        detaches the decoded cache (the last process to detach a RAM cache removes it)."""
        self.backend.close()
        if self.cache is not None:
            self.cache.detach()

    def __enter__(self) -> "ShardLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _augment_on_device(images: torch.Tensor, programs: list, device) -> torch.Tensor:
    """Moves a uint8 ``(N, 3, S, S)`` batch to ``device`` and runs the rows' programs there as
    batched torchvision-equivalent tensor ops (:func:`shardkit.augment.batched.apply_batch`)."""
    from ..augment.batched import apply_batch

    return apply_batch(images.to(device, non_blocking=True), programs)


def make_loader(root, split: str, batch_size: int, *, train: bool | None = None,
                image_size: int | None = None, num_workers: int | str = 2,
                prefetch_factor: int | str | None = 2, pin_memory: bool = False, seed: int = 0,
                transform=None, sampling: SamplingOptions | None = None,
                workers: WorkerOptions | None = None, on_error: str = "raise",
                on_warning: str = "keep", verify_reads: bool = True, return_meta: bool = False,
                device_decode=None, cache="none", cache_max_side: int | None = None,
                cache_eval: str = "pixels", augment=None, augment_device=None,
                max_pixels: int | None = None) -> ShardLoader:
    """A :class:`ShardLoader` over ``split`` of the packed dataset at ``root``.

    The simple call is ``make_loader(root, "train", 64)`` (or ``"val"``); everything else has a
    default. (Long only by this reference of its options: the body is a few lines, one call
    per step, each step a function of this module.)

    Yields ``(images, labels)`` (``(images, labels, meta)`` with ``return_meta``):

    - ``images``: uint8 ``(B, 3, S, S)`` RGB, ``channels_last``, values 0..255 (on the device
      with ``device_decode`` / ``augment_device``, else CPU); ``B = batch_size`` except a short
      last batch, or fewer rows when ``on_error="skip"`` left samples out;
    - ``labels``: int64 ``(B,)`` class indices into ``loader.classes``; with batch ops
      (``mixup`` / ``cutmix`` in ``augment``) float32 ``(B, K)`` soft targets instead,
      ``K = len(loader.classes)``, on the images' device: row ``i`` is ``lam`` times the one-hot
      of sample ``i`` plus ``1 - lam`` times that of sample ``B - 1 - i`` (sums to 1; one-hot
      when a batch is not mixed). Train on them with a soft-target loss (timm's
      ``SoftTargetCrossEntropy``, or ``torch.nn.functional.cross_entropy``, which takes class
      probabilities); label smoothing is not applied (``t * (1 - eps) + eps / K`` adds it,
      as timm's ``mixup_target`` does).

    Args:
        batch_size: samples per batch (the last one is short unless ``sampling.drop_last``).
        train: the mode. None (default): from the split's name: ``val``, ``validation``,
            ``valid``, ``test``, ``dev``, ``eval`` (any case) are evaluation, any other name is
            training (logged at INFO when the loader is built). Training: the random resized
            crop + flip, ``augment``, shuffle on, ``even="pad"`` when ``world_size > 1``.
            Evaluation (``False``): exactly-once, plan order, deterministic (the eval resize +
            center crop), never augmented. ``True`` on an eval split is honoured with one
            warning.
        image_size: output side ``S`` in pixels (default 224, or ``transform.image_size``).
        num_workers: decoding threads (``backend="thread"``) or DataLoader worker processes;
            0 builds batches in the calling thread; ``"auto"``: the loader picks
            (:mod:`shardkit.stream.tuning`): the thread backend measures the first batches of
            training (how long the consumer waits for a batch against how long one takes to
            build, the CPUs of ``os.sched_getaffinity``, the memory the batches in flight
            take) and settles on a count between 1 and ``min(16, 2 x CPUs)``, then keeps it;
            the process backend resolves it up front (``min(CPUs, 16)``). The choice, its
            measurements and why are in ``loader.tuning``. Which samples an epoch yields,
            their order and pixels are those of a fixed setting (with block order the plan's
            streams are the tuner's upper bound, fixed up front, saved in ``state_dict``).
        prefetch_factor: batches in flight per worker (None = 2, as ``DataLoader``), or
            ``"auto"`` (with the thread backend: enough to cover the slowest build seen,
            within a tenth of the available memory; 2 with processes).
        pin_memory: batches in pinned memory (only when CUDA is available).
        seed: order and augmentation seed.
        transform: a :class:`shardkit.transforms.TransformConfig` (crop, interpolation, decoder,
            mean/std used by :class:`DeviceNormalizer` via ``loader.transform_config``), or a
            callable ``(data, rng, out=None) -> (S, S, 3) uint8`` that replaces the factory.
        sampling: :class:`SamplingOptions` (shuffle, drop_last, even, mode, balance,
            samples_per_epoch, block, rank, world_size).
        workers: :class:`WorkerOptions` (backend, persistent_workers, multiprocessing_context,
            timeout, shard_prefetch_bytes: the memory bound of remote shards fetched ahead).
        on_error: ``"raise"`` (names shard and key) or ``"skip"`` (keys in ``loader.skipped``).
        on_warning: ``"keep"`` (keys in ``loader.warned``, logged once), ``"skip"`` or
            ``"raise"`` for samples whose JPEG decode gives libjpeg warnings (field case 12).
        verify_reads: check each sample's stored bytes against its xxh3 in the index (a damaged
            sample is a ShardCorruptError naming it, handled by ``on_error``); ~0.5% of the fused
            decode (benchmarks/README.md).
        return_meta: also yield ``{"index": int64 (N,), "valid": bool (N,)}`` per batch.
        device_decode: None (default: decode in the workers, the fused CPU path) or a device
            (``"cuda"``, ``"cuda:1"``; ``"cpu"`` runs the same code without a GPU): workers only
            read the bytes and draw the crops (same RNG, so the same crops), and each batch is
            decoded with one batched ``torchvision.io.decode_jpeg`` call on that device (nvJPEG
            on CUDA), cropped, resized and flipped there; images are uint8 ``(N, 3, S, S)`` on
            that device. Pixels match the CPU path within resampling differences (measured in
            tests/test_decode.py); needs a ``TransformConfig`` transform.
        cache: decoded image cache (:mod:`shardkit.stream.cache`): ``"none"`` (default),
            ``"ram"`` (decoded uint8 pixels in shared memory, one copy per machine for threads,
            worker processes and local DDP ranks; filled during the first epoch), ``"disk:DIR"``
            (the same as a memory-mapped file in DIR, reused across runs while the dataset's
            shard sha256s match) or ``"auto"`` (ram if the split fits in half of the available
            memory, else none; logged). A cache in ``/dev/shm`` leaves the room worker
            processes need to pass batches there (:func:`shardkit.stream.cache.shm_reserve`):
            where it cannot, it fills less or not at all, with one warning, and the epoch is
            decoded as uncached. With ``cache_max_side`` unset a cached epoch yields the
            same batches as an uncached one whenever the uncached decode needs no DCT
            reduction (crops < 2S); the samples where it would are counted
            (``cache_stats()["dct_reduced"]``) and the first logs a warning; stats in
            ``loader.cache_stats()``. Needs a
            ``TransformConfig`` transform; not with ``device_decode``.
        cache_max_side: cache images resized so that the longer side is at most this many
            pixels (FFCV's ``max_resolution``); crops are scaled to the cached size.
        cache_eval: ``"pixels"`` (default) or ``"final"``: an eval loader (``train=False``)
            caches its final deterministic crops, so later passes are a memory copy.
        augment: augmentation after the crop and flip (:mod:`shardkit.augment`): a preset
            (``"none"`` (default), ``"light"``, ``"standard"``, ``"randaugment"``,
            ``"trivialaugment"``), a list of op dicts, YAML text or file, or an
            :class:`~shardkit.augment.AugmentSpec`; torchvision v2 semantics, drawn from each
            sample's RNG (same augmentation for any ``num_workers``, backend, device or resume
            point); strength schedules follow :meth:`ShardLoader.set_epoch`. Batch ops
            (``{"op": "mixup", "alpha": 0.8}``, ``{"op": "cutmix", "alpha": 1.0}``, each with
            ``p``) mix each whole batch with timm's ``Mixup(mode="batch")`` semantics
            (:mod:`shardkit.augment.mix`) and make ``labels`` soft targets (see above); batch
            ``b``'s ``lam`` and box are a pure function of ``(seed, epoch, rank, b)``, the same
            for any ``num_workers``, backend or resume point, and each batch is mixed once,
            where it is built (after the per-sample ops; on the device after them with
            ``device_decode`` / ``augment_device``). Training only: any op on an eval loader
            is a ConfigError.
        augment_device: where the per-sample ops run: None (default: the decoding threads or
            workers, on the uint8 rows, C kernels with the GIL released; with
            ``device_decode``, that device), ``"cpu"``, or a torch device (``"cuda"``): the
            programs travel with the batch, which is moved there and augmented with
            torchvision's tensor ops, so images come out uint8 ``(N, 3, S, S)`` on that device.
        max_pixels: the largest image (width x height) this reader decodes (default
            :data:`shardkit.images.sniff.DEFAULT_MAX_PIXELS`); the reader's own safety limit,
            never taken from the dataset. A dataset packed with a larger ``--max-pixels``
            needs it: its images are refused (a ``PixelLimitError``, under ``on_error``)
            otherwise.

    Raises:
        ConfigError, LoaderError: invalid options (the message names the value: a
            ``num_workers`` or ``prefetch_factor`` that is neither ``"auto"`` nor an int >= 0,
            resp. >= 1, included), an
            augmentation (per-sample or batch op) on an eval loader (``train=False``, or an
            eval split with ``train`` unset: eval never augments);
        ManifestError: no finished dataset at ``root`` or unknown ``split``.
        ShardCorruptError: a shard of the split is missing or its size differs from the
            manifest (checked up front, whatever ``on_error``: a damaged dataset, not a bad
            sample).
    """
    check_int("batch_size", batch_size, 1)
    num_workers, prefetch_factor = check_counts(num_workers, prefetch_factor)
    sampling, workers = check_options(sampling, workers)
    train, why = resolve_mode(train, split, sampling)
    tf, size = resolve_transform(transform, train, image_size)
    spec, aug_device = resolve_augment(augment, augment_device, device_decode, train, split,
                                       why)
    sampling = rank_sampling(sampling, train, split)
    source = ShardSource(root, split, on_error, verify_reads, max_pixels)
    source.prefetch_bytes = resolve_prefetch_bytes(workers.shard_prefetch_bytes)
    plan = Sampling(source, sampling, seed=seed, batch_size=batch_size, train=train)
    counts = plan_tuning(workers.backend, num_workers, prefetch_factor, batch_size, size)
    num_workers, prefetch_factor = counts[:2]  # the most threads; the auto choice is tuned
    check_device_decode(tf, device_decode, cache)
    if hasattr(tf, "max_pixels"):
        tf.max_pixels = source.max_pixels  # the limit pack applied, again at read time
    dc = make_cache(source, tf, cache, max_side=cache_max_side, cache_eval=cache_eval,
                    train=train, verify=verify_reads, transport_bytes=shm_reserve(
                        workers.backend, num_workers, prefetch_factor, batch_size, size))
    warn_torch_threads(spec, aug_device, workers.backend, num_workers)
    dataset = BatchDataset(source, plan, tf, size, on_warning,
                           device_decode=device_decode is not None, cache=dc, augment=spec,
                           augment_on_device=aug_device is not None)
    backend = _make_backend(dataset, workers, counts, pin_memory)
    if spec.batch_ops:
        log.info("split %r: batch ops %s mix each batch in the loader; labels are float32 "
                 "(B, %d) soft targets", split, [name for name, _ in spec.batch_ops],
                 len(source.classes))
    return ShardLoader(dataset, backend, return_meta=return_meta,
                       transform_config=getattr(tf, "cfg", None), device_decode=device_decode,
                       augment=spec, augment_device=aug_device, train=train)


# --- the step of make_loader that builds (the others check and resolve: resolve.py) -----------

def _make_backend(dataset: BatchDataset, workers: WorkerOptions, counts: tuple,
                  pin_memory: bool) -> ThreadBackend | ProcessBackend:
    """The backend that runs ``dataset``'s plan, from ``counts``
    (:func:`~shardkit.stream.tuning.plan_tuning`: pool size, prefetch, streams, tuner,
    tuning). A block-ordered exact plan is cut into ``streams`` (one per worker; with
    ``"auto"`` fixed up front, whatever the tuner picks); decoding threads keep one remote
    shard ahead each."""
    num_workers, prefetch_factor, streams, tuner, tuning = counts
    plan, source = dataset.sampling, dataset.source
    if plan.block and plan.mode == "exact" and streams > 1:
        plan.set_streams(streams)
    if workers.backend == "thread":
        if source.max_open is not None:
            source.max_open = max(source.max_open, 2 * num_workers)  # one shard ahead per thread
        backend = ThreadBackend(dataset, num_workers, prefetch_factor, pin_memory,
                                workers.timeout, tuner=tuner)
    else:
        backend = ProcessBackend(dataset, num_workers, prefetch_factor, pin_memory, workers,
                                 plan.world_size)
    backend.tuning = tuning
    return backend
