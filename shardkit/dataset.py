"""Datasets over a packed split: :class:`ShardDataset` (iterable) and :class:`MapShardDataset`.

Both read sample locations from the split index (numpy arrays; field case 16) and class names and
shard paths from ``manifest.json``; shards are opened lazily in the process that reads them
(readers are pid-checked, so opening in the parent and then forking is safe; field cases 8 and 10),
and the datasets pickle without any open handle (spawn / forkserver; field case 19).

Which samples a consumer reads is decided by :mod:`shardkit.sharding` from
``(seed, epoch, rank, world_size, worker_id, num_workers)`` explicitly - never from a library
default (field case 2). Exactly-once per epoch is the default, with or without ``shuffle``.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from .errors import ConfigError, DecodeError, LoaderError, ShardkitError
from .formats import open_reader
from .manifest import is_url, load_index, load_manifest
from .sharding import EpochPlan, plan_epoch, rank_count, sample_rng

__all__ = ["ShardDataset", "MapShardDataset", "dist_rank_world", "ON_ERROR", "EVAL_SPLITS"]

ON_ERROR = ("raise", "skip")
EVAL_SPLITS = frozenset({"val", "valid", "validation", "test", "eval"})


def dist_rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments when given, else the initialised
    ``torch.distributed`` default group, else ``(0, 1)`` (no ``init_process_group`` needed).

    Raises:
        ConfigError: only one of the two is given, or ``rank`` is not in ``[0, world_size)``.
    """
    if (rank is None) != (world_size is None):
        raise ConfigError(f"give both rank and world_size or neither (got rank={rank!r}, "
                          f"world_size={world_size!r})")
    if rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int)
            and 0 <= rank < world_size):
        raise ConfigError(f"rank={rank!r}, world_size={world_size!r}: expected ints with "
                          "0 <= rank < world_size")
    return rank, world_size


def worker_id_count() -> tuple[int, int]:
    """``(worker_id, num_workers)`` of the calling DataLoader worker; ``(0, 1)`` in the main
    process."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class _Source:
    """The picklable core: manifest subset, split index, lazy per-shard readers, read + decode."""

    def __init__(self, root, split: str, on_error: str = "raise"):
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error={on_error!r} is not one of {list(ON_ERROR)}")
        self.root = str(root)
        self.split = split
        manifest = load_manifest(root)
        if is_url(root) and manifest["format"] != "wds":
            raise ConfigError(f"format {manifest['format']!r} needs a local path; only 'wds' tar "
                              f"shards can be read from a URL ({root})")
        self.index = load_index(root, split, manifest)
        # keep only what readers need: a small dict, not the whole manifest (group maps etc.)
        self.manifest = {"format": manifest["format"], "classes": list(manifest["classes"]),
                         "splits": {split: {"shards": manifest["splits"][split]["shards"]}}}
        self.classes = self.manifest["classes"]
        self.num_shards = len(self.manifest["splits"][split]["shards"])
        self.on_error = on_error
        # a remote tar shard is fetched whole into memory: keep at most 2 per process (a
        # consumer in shard-block order needs the current shard and maybe the next)
        self.max_open = 2 if is_url(root) else None
        self._readers: dict[int, Any] = {}
        self._decoder = None
        self._decoder_pid = None

    def __len__(self) -> int:
        return len(self.index)

    def shard_name(self, pos: int) -> str:
        return self.manifest["splits"][self.split]["shards"][int(self.index.shard[pos])]["path"]

    def read(self, pos: int):
        """Stored bytes of the sample at split position ``pos`` (bytes or memoryview/mmap slice)."""
        s = int(self.index.shard[pos])
        reader = self._readers.get(s)
        if reader is None:
            if self.max_open is not None and len(self._readers) >= self.max_open:
                oldest = next(iter(self._readers))  # remote shards are held in memory: evict
                self._readers.pop(oldest).close()
            reader = self._readers[s] = open_reader(self.root, self.manifest, self.split, s)
        return reader.read(self.index.key_at(pos), int(self.index.offset[pos]),
                           int(self.index.size[pos]))

    def decode(self, data, pos: int, decoder: str = "auto") -> np.ndarray:
        """Decodes to uint8 ``(H, W, 3)`` RGB via :func:`shardkit.decode.get_decoder`.

        Raises:
            DecodeError: naming the shard and key.
        """
        if self._decoder is None or self._decoder_pid != os.getpid():
            from .decode import get_decoder

            self._decoder, self._decoder_pid = get_decoder(decoder), os.getpid()
        try:
            return self._decoder.decode(data)
        except Exception as e:  # noqa: BLE001 - re-raised with shard and key
            raise DecodeError(f"shard {self.shard_name(pos)}: cannot decode sample "
                              f"{self.index.key_at(pos)!r}: {e}") from e

    def handle_error(self, err: Exception, pos: int) -> str:
        """Policy for a failed sample: re-raise (naming shard and key) or return the skipped key."""
        key = self.index.key_at(pos)
        if self.on_error == "raise":
            if isinstance(err, ShardkitError) and repr(key) in str(err):
                raise err
            raise DecodeError(f"shard {self.shard_name(pos)}: sample {key!r} failed: "
                              f"{type(err).__name__}: {err}") from err
        warnings.warn(f"on_error='skip': skipped sample {key!r} of shard {self.shard_name(pos)}: "
                      f"{err}", RuntimeWarning, stacklevel=3)
        return key

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_decoder"] = None
        state["_decoder_pid"] = None
        return state


class _Planned:
    """Epoch-plan options shared by the iterable datasets (here and in :mod:`shardkit.loader`)."""

    def _init_plan(self, *, rank, world_size, shuffle, seed, mode, even, balance,
                   samples_per_epoch, block, batch_size, drop_last, train, streams=1):
        self.rank, self.world_size = dist_rank_world(rank, world_size)
        if mode == "stream" and (not train or self._source.split in EVAL_SPLITS):
            raise LoaderError(f"mode='stream' resamples with replacement; split "
                              f"{self._source.split!r} (train={train}) must be read exactly once "
                              "per epoch: use mode='exact'")
        self.shuffle = bool(shuffle) or mode == "stream"
        self.seed = int(seed)
        self.mode = mode
        self.even = even
        self.balance = balance
        self.samples_per_epoch = samples_per_epoch
        self.block = is_url(self._source.root) if block is None else bool(block)
        if is_url(self._source.root) and not self.block and self.shuffle:
            self._source.max_open = None  # random order would re-fetch evicted shards per sample
            warnings.warn(f"block=False on remote shards ({self._source.root}): every process "
                          "keeps each whole shard it touches in memory; block=True (the default "
                          "for URLs) reads shard by shard", RuntimeWarning, stacklevel=3)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.epoch = 0
        self.streams = streams
        # [epoch, start_batch, streams] in shared memory: read by workers at the start of each
        # iteration, so set_epoch / resume reach persistent workers too (field case 18)
        self.state = torch.tensor([0, 0, 1], dtype=torch.int64).share_memory_()
        self.set_streams(streams)
        self.plan(0)  # validates every option now, in the constructor, not in a worker

    def rank_samples(self) -> int:
        """Samples (pad repeats included) this rank reads per epoch, from manifest counts alone."""
        total = len(self._source) if self.mode == "exact" or self.samples_per_epoch is None \
            else self.samples_per_epoch
        return rank_count(total, self.rank, self.world_size, self.even)

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """This rank's :class:`~shardkit.sharding.EpochPlan` for ``epoch`` (default: current)."""
        idx = self._source.index
        return plan_epoch(len(idx), rank=self.rank, world_size=self.world_size, seed=self.seed,
                          epoch=self.epoch if epoch is None else epoch, shuffle=self.shuffle,
                          mode=self.mode, even=self.even, batch_size=self.batch_size,
                          drop_last=self.drop_last, labels=idx.label, balance=self.balance,
                          samples_per_epoch=self.samples_per_epoch, shards=idx.shard,
                          block=self.block, streams=self.streams)

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch used for order and augmentation RNG (call before iterating)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch={epoch!r}: expected an int >= 0")
        self.epoch = int(epoch)
        self.state[0] = self.epoch

    def set_streams(self, streams: int) -> None:
        """Sets how many contiguous ranges a rank's epoch is cut into (see
        :func:`shardkit.sharding.stream_order`); part of the plan, so keep it when resuming."""
        if isinstance(streams, bool) or not isinstance(streams, (int, np.integer)) or streams < 1:
            raise ConfigError(f"streams={streams!r}: expected an int >= 1")
        self.streams = int(streams)
        self.state[2] = self.streams

    def _sync_state(self) -> int:
        """Takes epoch and streams from the shared state (in a worker); returns the start batch."""
        self.epoch, self.streams = int(self.state[0]), int(self.state[2])
        return int(self.state[1])

    @property
    def classes(self) -> list[str]:
        """Class names from the manifest; label ``i`` is ``classes[i]``."""
        return self._source.classes


class ShardDataset(_Planned, IterableDataset):
    """Iterable dataset over one split of a packed dataset (local folder or fsspec URL for wds).

    Yields dicts: ``key`` (str), ``label`` (int in ``[0, num_classes)``), ``index`` (int, position
    in split order), ``valid`` (bool; False only for ``even="pad"`` repeats) and ``image``: the
    stored bytes (``decode=False``), a uint8 ``(H, W, 3)`` RGB numpy array (``decode=True``), or
    ``transform(data, rng)`` when ``transform`` is given (it receives the stored bytes and a
    ``numpy.random.Generator`` derived from ``(seed, epoch, rank, position)``, field case 17).

    Args:
        root, split: the packed dataset and split name.
        rank, world_size: default to the initialised ``torch.distributed`` group, else ``(0, 1)``.
        shuffle, seed: per-epoch order (see :meth:`set_epoch`); exactly-once either way.
        even: ``None`` (exactly-once), ``"pad"`` or ``"drop"`` (equal counts on every rank).
        mode: ``"exact"`` or ``"stream"`` (resampled; refused for val/test splits).
        balance, samples_per_epoch: stream-mode options (see :func:`shardkit.sharding.epoch_order`).
        block: shard-block order (default: on for URLs, i.e. remote tar shards).
        streams: cut this rank's epoch into this many contiguous ranges, range ``w`` read by
            worker ``w`` when ``streams == num_workers`` (with ``block``: whole shards per worker).
        batch_size: worker granularity: consecutive runs of ``batch_size`` samples go to one
            worker, so ``DataLoader(ds, batch_size=batch_size, num_workers=k)`` returns batches in
            plan order. Use the same value for both.
        on_error: ``"raise"`` (default; the error names shard and key) or ``"skip"`` (warns and
            counts ``skipped`` in the consuming process).
        decoder: decoder name for ``decode=True`` (see :mod:`shardkit.decode`).

    Raises:
        ManifestError: no finished dataset or unknown split. ConfigError: invalid option.
        LoaderError: ``mode="stream"`` on a val/test split.
    """

    def __init__(self, root, split: str, *, rank: int | None = None, world_size: int | None = None,
                 shuffle: bool = False, seed: int = 0, decode: bool = True,
                 transform: Callable | None = None, on_error: str = "raise",
                 even: str | None = None, mode: str = "exact", balance: str | None = None,
                 samples_per_epoch: int | None = None, block: bool | None = None,
                 batch_size: int = 1, decoder: str = "auto", streams: int = 1):
        self._source = _Source(root, split, on_error)
        self.decode = bool(decode)
        self.decoder = decoder
        self.transform = transform
        self.skipped: list[str] = []
        self._init_plan(rank=rank, world_size=world_size, shuffle=shuffle, seed=seed, mode=mode,
                        even=even, balance=balance, samples_per_epoch=samples_per_epoch,
                        block=block, batch_size=batch_size, drop_last=False, train=True,
                        streams=streams)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (all workers together)."""
        return self.rank_samples()

    def _sample(self, pos: int, rank_pos: int, valid: bool) -> dict:
        src = self._source
        data = src.read(pos)
        if self.transform is not None:
            image = self.transform(data, sample_rng(self.seed, self.epoch, self.rank, rank_pos))
        elif self.decode:
            image = src.decode(data, pos, self.decoder)
        else:
            image = bytes(data)
        return {"key": src.index.key_at(pos), "label": int(src.index.label[pos]),
                "image": image, "index": int(pos), "valid": bool(valid)}

    def __iter__(self) -> Iterator[dict]:
        start = self._sync_state()
        plan = self.plan()
        wid, nw = worker_id_count()
        for b in plan.worker_batches(wid, nw, start):
            sl = plan.batch_slice(int(b))
            for j in range(sl.start, sl.stop):
                pos = int(plan.positions[j])
                try:
                    sample = self._sample(pos, j, plan.valid[j])
                except (ShardkitError, OSError, ValueError) as e:
                    self.skipped.append(self._source.handle_error(e, pos))
                    continue
                yield sample


class MapShardDataset(Dataset):
    """Map-style dataset over one split, any format (tar shards via the offset index).

    ``ds[i]`` is the dict described in :class:`ShardDataset` for split position ``i`` (``valid`` is
    always True). ``transform(data, rng)`` gets an RNG derived from ``(seed, epoch, 0, i)``.
    Use a sampler (e.g. ``DistributedSampler``) for order and rank splitting.

    Raises:
        IndexError: ``i`` outside ``[-len, len)``. ManifestError / ShardCorruptError / DecodeError
        as for :class:`ShardDataset` (``on_error`` does not apply: a map-style item must exist).
    """

    def __init__(self, root, split: str, *, decode: bool = True, transform: Callable | None = None,
                 seed: int = 0, decoder: str = "auto"):
        self._source = _Source(root, split)
        self.decode = bool(decode)
        self.decoder = decoder
        self.transform = transform
        self.seed = int(seed)
        self.epoch = 0

    @property
    def classes(self) -> list[str]:
        return self._source.classes

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch for the transform RNG."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, i: int) -> dict:
        n = len(self._source)
        if isinstance(i, torch.Tensor):
            i = int(i)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for split {self._source.split!r} with "
                             f"{n} samples")
        pos = i % n
        src = self._source
        data = src.read(pos)
        if self.transform is not None:
            image = self.transform(data, sample_rng(self.seed, self.epoch, 0, pos))
        elif self.decode:
            image = src.decode(data, pos, self.decoder)
        else:
            image = bytes(data)
        return {"key": src.index.key_at(pos), "label": int(src.index.label[pos]),
                "image": image, "index": pos, "valid": True}
