"""The epoch plan of one rank (:class:`Sampling`) and the named shared state workers read
(:class:`EpochState`).

``Sampling`` turns resolved options into :class:`shardkit.sharding.EpochPlan` s: a pure function
of ``(seed, epoch, rank, world_size, streams)`` and the split index, computed in the consumer
and identically in any worker process. ``EpochState`` carries ``epoch``, ``start_batch`` and
``streams`` in a small shared-memory tensor, read by DataLoader workers at the start of every
iteration, so persistent workers see ``set_epoch`` and ``load_state_dict`` too (field case 18).
"""
from __future__ import annotations

import logging

import torch

from ..errors import LoaderError
from ..sharding import EpochPlan, plan_epoch, rank_count
from ..validate import check_int
from .options import SamplingOptions, is_eval_split
from .source import ShardSource, dist_rank_world

__all__ = ["EpochState", "Sampling", "check_epoch"]

log = logging.getLogger("shardkit.stream")


def check_epoch(epoch) -> int:
    """``epoch`` as an int; ConfigError unless it is an int >= 0 (bools refused)."""
    return check_int("epoch", epoch, 0)


class EpochState:
    """``epoch``, ``start_batch`` (batches already consumed when resuming) and ``streams``, in
    an int64 shared-memory tensor: a copy pickled into a worker process still reads and writes
    the same memory."""

    _FIELDS = ("epoch", "start_batch", "streams")

    def __init__(self, epoch: int = 0, start_batch: int = 0, streams: int = 1):
        self._t = torch.tensor([epoch, start_batch, streams], dtype=torch.int64).share_memory_()

    def __getattr__(self, name: str) -> int:
        try:
            i = EpochState._FIELDS.index(name)
        except ValueError:
            raise AttributeError(name) from None
        return int(self.__dict__["_t"][i])

    def __setattr__(self, name: str, value) -> None:
        if name == "_t":
            object.__setattr__(self, name, value)
        elif name in EpochState._FIELDS:
            self._t[EpochState._FIELDS.index(name)] = int(value)
        else:
            raise AttributeError(f"EpochState has no field {name!r}")

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in EpochState._FIELDS}

    def __repr__(self) -> str:
        return f"EpochState({self.as_dict()})"


class Sampling:
    """Resolved sampling of one rank over ``source``: options, seed, batch rule, and the shared
    :class:`EpochState`. ``plan(epoch)`` gives that epoch's :class:`EpochPlan`.

    Raises (in the constructor, never in a worker):
        ConfigError: an invalid option or combination. LoaderError: ``mode="stream"`` on a split
        that must be read exactly once (``train=False`` or an eval split, whatever ``train``).

    ``train`` is the resolved mode (:func:`~shardkit.stream.options.resolve_train`): it is the
    default of ``options.shuffle`` (None: shuffled for training, plan order for evaluation).
    """

    def __init__(self, source: ShardSource, options: SamplingOptions, *, seed: int, batch_size: int,
                 train: bool, streams: int = 1):
        o = options
        self.source = source
        self.options = o
        self.rank, self.world_size = dist_rank_world(o.rank, o.world_size)
        if o.mode == "stream" and (not train or is_eval_split(source.split)):
            raise LoaderError(f"mode='stream' resamples with replacement; split "
                              f"{source.split!r} (train={train}) must be read exactly once "
                              "per epoch: use mode='exact'")
        self.shuffle = (train if o.shuffle is None else bool(o.shuffle)) or o.mode == "stream"
        self.seed = int(seed)
        self.mode = o.mode
        self.even = o.even
        self.balance = o.balance
        self.samples_per_epoch = o.samples_per_epoch
        self.block = source.remote if o.block is None else bool(o.block)
        if source.remote and not self.block and self.shuffle:
            source.max_open = None  # random order would re-fetch evicted shards per sample
            log.warning(
                "block=False on remote shards (%s): every process keeps each whole shard it "
                "touches in memory; block=True (the default for URLs) reads shard by shard",
                source.root)
        self.batch_size = batch_size
        self.drop_last = bool(o.drop_last)
        self.state = EpochState()
        self.set_streams(streams)
        self.plan(0)  # validates every option now, not in a worker

    @property
    def epoch(self) -> int:
        return self.state.epoch

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch used for order and augmentation RNG (call before iterating)."""
        self.state.epoch = check_epoch(epoch)

    @property
    def streams(self) -> int:
        return self.state.streams

    def set_streams(self, streams: int) -> None:
        """How many contiguous ranges a rank's epoch is cut into (see
        :func:`shardkit.sharding.stream_order`); part of the plan, so keep it when resuming."""
        self.state.streams = check_int("streams", streams, 1)

    def rank_samples(self) -> int:
        """Samples (pad repeats included) this rank reads per epoch, from manifest counts."""
        total = len(self.source) if self.mode == "exact" or self.samples_per_epoch is None \
            else self.samples_per_epoch
        return rank_count(total, self.rank, self.world_size, self.even)

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """This rank's :class:`~shardkit.sharding.EpochPlan` for ``epoch`` (default: current)."""
        idx = self.source.index
        return plan_epoch(len(idx), rank=self.rank, world_size=self.world_size, seed=self.seed,
                          epoch=self.epoch if epoch is None else epoch, shuffle=self.shuffle,
                          mode=self.mode, even=self.even, batch_size=self.batch_size,
                          drop_last=self.drop_last, labels=idx.label, balance=self.balance,
                          samples_per_epoch=self.samples_per_epoch, shards=idx.shard,
                          block=self.block, streams=self.streams)
