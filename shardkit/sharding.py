"""Exactly-once epoch arithmetic: epoch order, rank / batch / worker partition (pure numpy).

One epoch of one split is planned in three steps, each a pure function of its arguments, so every
process (ranks, DataLoader workers, a resumed job) computes the same plan without talking:

1. :func:`epoch_order` - the global order of sample positions ``[0, n)`` for ``(seed, epoch)``:
   ``mode="exact"`` visits every sample exactly once (identity order, a permutation, or a
   *shard-block* permutation: shuffle the shard order, then samples inside each shard, so a
   consumer reads whole contiguous ranges of one shard - preferred for streamed remote tar
   shards); ``mode="stream"`` draws ``samples_per_epoch`` positions with replacement, uniformly or
   class-balanced (``balance="class"``: every class is drawn with probability ``1/num_classes``).
2. :func:`rank_plan` - the contiguous slice of that order owned by ``rank`` of ``world_size``.
   ``even=None`` keeps exactly-once (ranks differ by at most one sample; evaluation);
   ``even="pad"`` wraps around to the start of the order like
   ``torch.utils.data.DistributedSampler`` so every rank gets ``ceil(total / world_size)``
   samples (the repeats are flagged in ``valid``);
   ``even="drop"`` drops the remainder so every rank gets ``floor(total / world_size)``.
   The partition is over samples, not shards, so fewer shards than consumers is fine.
3. :meth:`EpochPlan.worker_batches` - batch ``b`` of a rank (``b >= start_batch``) is built by
   worker ``(b - start_batch) % num_workers``. ``torch.utils.data.DataLoader`` polls workers
   round-robin, so batches arrive in order and a resume point is just ``(epoch, batches consumed)``
   whatever ``num_workers`` was before or is now. A worker with no batch yields nothing.

All index arrays are numpy (``int64``/``bool``), never lists of Python objects (field case 16).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .errors import ConfigError
from .validate import check_int

__all__ = ["MODES", "EVEN_RULES", "BALANCE", "epoch_rng", "sample_rng", "SampleRng", "sample_rngs",
           "epoch_order", "rank_count", "rank_plan", "num_batches", "stream_order", "EpochPlan",
           "plan_epoch"]

MODES = ("exact", "stream")
EVEN_RULES = (None, "pad", "drop")
BALANCE = (None, "class")

# Distinct SeedSequence spawn keys so the order RNG and the augmentation RNG never share streams.
_ORDER_STREAM = 0x5EED0
_SAMPLE_STREAM = 0x5EED1


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {list(allowed)}")


def epoch_rng(seed: int, epoch: int, *extra: int) -> np.random.Generator:
    """The numpy Generator of ``(seed, epoch, *extra)`` (PCG64 via ``SeedSequence``).

    Used for the epoch order (``extra=()``) and, through :func:`sample_rng`, per-sample
    augmentation. Independent of process, worker and start method, so runs are reproducible.
    """
    return np.random.default_rng(np.random.SeedSequence([_ORDER_STREAM, int(seed), int(epoch),
                                                         *map(int, extra)]))


def _mix64(x: int) -> int:
    """SplitMix64 finaliser (Steele, Lea and Flood 2014): a bijective 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _sample_key(seed: int, epoch: int, rank: int, position: int) -> np.ndarray:
    """The 128-bit Philox key of :func:`sample_rng` as an exact uint64 ``(2,)`` array."""
    key0 = _mix64(_mix64(int(seed) & 0xFFFFFFFFFFFFFFFF) ^ _SAMPLE_STREAM)
    return np.array([key0, _key1(epoch, rank, position)], dtype=np.uint64)


def _key1(epoch: int, rank: int, position: int) -> int:
    return (((int(epoch) & 0xFFFFF) << 44) | ((int(rank) & 0xFFF) << 32)
            | (int(position) & 0xFFFFFFFF))


def sample_rng(seed: int, epoch: int, rank: int, position: int) -> np.random.Generator:
    """Augmentation RNG of the sample at ``position`` of ``rank``'s epoch order (field case 17).

    Derived from ``(seed, epoch, rank, position)`` only - not from the worker id or the process -
    so it differs between samples, ranks and epochs, and is identical for any ``num_workers``.
    It is a counter-based Philox generator (Salmon et al. 2011, "Parallel random numbers: as easy
    as 1, 2, 3") keyed by ``(mix64(seed, stream), epoch << 44 | rank << 32 | position)``: distinct
    for epochs < 2**20, ranks < 2**12 and positions < 2**32, and ~2x cheaper to build than a
    ``SeedSequence``-seeded generator.

    The key is passed as a uint64 array. (It used to be a list of two Python ints, which
    NumPy turns into float64 when one is >= 2**63 and the other is not: for half of all seeds,
    seed 0 among them, both words lost their low bits, and from epoch 512 on neighbouring
    positions got the same generator; docs/FIELD-CASES.md, case 17. For those seeds every
    sample's draws differ from the earlier versions', from epoch 0: a run resumed across the
    change gets other crops and flips, never other samples.)
    """
    return np.random.Generator(np.random.Philox(key=_sample_key(seed, epoch, rank, position)))


class SampleRng:
    """:func:`sample_rng` for a loop that keeps no generator: one Philox generator, re-keyed in
    place for each sample.

    ``SampleRng(seed).at(epoch, rank, position)`` returns a generator whose draws equal those of
    ``sample_rng(seed, epoch, rank, position)``, in about 1 us instead of 10-40 us (numpy's
    ``Philox(key=...)`` constructor first seeds itself from OS entropy, then the key replaces
    that seed). It is the same object on every call, valid until the next call: the loader uses
    it only for a transform that itself declares ``keeps_rng = False`` (the factory's;
    :func:`sample_rngs`). Not thread-safe: one per thread.
    """

    __slots__ = ("_state", "_key", "_bits", "generator")

    def __init__(self, seed: int):
        self._bits = np.random.Philox(key=_sample_key(seed, 0, 0, 0))
        self.generator = np.random.Generator(self._bits)
        self._state = self._bits.state  # counter 0, empty buffer: a fresh generator's state
        self._key = self._state["state"]["key"]

    def at(self, epoch: int, rank: int, position: int) -> np.random.Generator:
        """The generator of the sample at ``position`` of ``rank``'s ``epoch`` (see
        :func:`sample_rng`), reset to its first draw."""
        self._key[1] = _key1(epoch, rank, position)
        self._bits.state = self._state
        return self.generator


def sample_rngs(seed: int, reuse: bool = False) -> Callable[[int, int, int], np.random.Generator]:
    """``rng_at(epoch, rank, position)``: the sample generators of ``seed`` for one thread's
    loop over samples. ``reuse``: one generator re-keyed in place (:class:`SampleRng`), for a
    consumer that keeps none (the loader passes it for a transform that declares
    ``keeps_rng = False``: :func:`shardkit.transforms.declared`); else a new
    :func:`sample_rng` per call. Either way the draws are :func:`sample_rng`'s."""
    return SampleRng(seed).at if reuse else functools.partial(sample_rng, seed)


def epoch_order(n: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = False,
                mode: str = "exact", labels: np.ndarray | None = None, balance: str | None = None,
                samples_per_epoch: int | None = None, shards: np.ndarray | None = None,
                block: bool = False) -> np.ndarray:
    """Global order of sample positions for one epoch.

    Args:
        n: number of samples in the split (>= 0).
        seed, epoch: the order is a pure function of these (and the other arguments).
        shuffle: exact mode only; False gives ``arange(n)``.
        mode: ``"exact"`` (each position exactly once) or ``"stream"`` (``samples_per_epoch``
            draws with replacement; ``shuffle`` is implied).
        labels: int64 ``(n,)`` class per sample; required for ``balance="class"``.
        balance: ``None`` or ``"class"`` (stream mode only): sample weights ``1 / count(class)``
            so every class present has the same expected frequency.
        samples_per_epoch: stream mode: number of draws (default ``n``). Not allowed in exact mode.
        shards: int ``(n,)`` shard of each sample; with ``block=True`` and ``shuffle`` the order is
            shard-block (shard order shuffled, then samples within each shard).
        block: see ``shards``.

    Returns:
        int64 array of positions in ``[0, n)``; length ``n`` (exact) or ``samples_per_epoch``.

    Raises:
        ConfigError: unknown mode/balance, balance or ``samples_per_epoch`` in exact mode, missing
            or mis-sized ``labels``/``shards``, negative sizes, or draws requested from ``n == 0``.
    """
    n = check_int("n", n, 0)
    _check_choice("mode", mode, MODES)
    _check_choice("balance", balance, BALANCE)
    rng = epoch_rng(seed, epoch)
    if mode == "exact":
        if balance is not None:
            raise ConfigError(f"balance={balance!r} resamples, so it needs mode='stream'; "
                              "mode='exact' visits every sample exactly once")
        if samples_per_epoch is not None and samples_per_epoch != n:
            raise ConfigError(f"samples_per_epoch={samples_per_epoch!r} needs mode='stream'; "
                              f"an exact epoch has exactly n={n} samples")
        if not shuffle:
            return np.arange(n, dtype=np.int64)
        if block and shards is not None:
            shards = np.asarray(shards)
            if shards.shape != (n,):
                raise ConfigError(f"shards has shape {shards.shape}, expected ({n},)")
            ids = np.unique(shards)
            shard_rank = np.empty(int(ids.max()) + 1 if n else 0, dtype=np.int64)
            shard_rank[ids] = rng.permutation(len(ids))
            # primary key: shuffled shard rank; secondary: a random key inside the shard
            return np.lexsort((rng.random(n), shard_rank[shards])).astype(np.int64)
        return rng.permutation(n).astype(np.int64)
    count = n if samples_per_epoch is None else check_int("samples_per_epoch",
                                                          samples_per_epoch, 0)
    if count and not n:
        raise ConfigError(f"samples_per_epoch={count} draws requested from an empty split (n=0)")
    if balance is None:
        return rng.integers(0, n, size=count, dtype=np.int64)
    if labels is None:
        raise ConfigError("balance='class' needs labels (int64 array of shape (n,))")
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise ConfigError(f"labels has shape {labels.shape}, expected ({n},)")
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    weights = 1.0 / counts[inverse]
    return rng.choice(n, size=count, replace=True, p=weights / weights.sum()).astype(np.int64)


def rank_count(total: int, rank: int, world_size: int, even: str | None = None) -> int:
    """Number of samples ``rank`` gets from an order of length ``total`` (see :func:`rank_plan`)."""
    total = check_int("total", total, 0)
    world_size = check_int("world_size", world_size, 1)
    rank = check_int("rank", rank, 0)
    if rank >= world_size:
        raise ConfigError(f"rank={rank} is not in [0, world_size={world_size})")
    _check_choice("even", even, EVEN_RULES)
    if even == "pad":
        return -(-total // world_size)
    if even == "drop":
        return total // world_size
    return total // world_size + (1 if rank < total % world_size else 0)


def rank_plan(order: np.ndarray, rank: int, world_size: int,
              even: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The contiguous part of ``order`` owned by ``rank``, and its validity mask.

    Returns:
        ``(positions, valid)``: int64 ``(m,)`` with ``m = rank_count(len(order), ...)`` and bool
        ``(m,)``; ``valid`` is False only for ``even="pad"`` wrap-around repeats. With
        ``even="pad"`` and an empty ``order`` every rank gets nothing (nothing to repeat).
    """
    order = np.asarray(order, dtype=np.int64)
    total = len(order)
    m = rank_count(total, rank, world_size, even)
    if even == "pad":
        if total == 0:
            return order[:0], np.zeros(0, dtype=bool)
        start = rank * m
        idx = np.arange(start, start + m, dtype=np.int64)
        return order[idx % total], idx < total
    if even == "drop":
        start = rank * m
    else:
        base, extra = divmod(total, world_size)
        start = rank * base + min(rank, extra)
    return order[start:start + m].copy(), np.ones(m, dtype=bool)


def stream_order(count: int, batch_size: int, streams: int, drop_last: bool = False) -> np.ndarray:
    """Permutation that gives each of ``streams`` consumers one contiguous range of a rank's order.

    Batch ``b`` (in delivery order) is served by stream ``b % streams``; stream ``s``'s batches,
    taken in order, cover one contiguous range of the input order (stream 0 first). Applied to a
    shard-block order this lets worker ``w`` of ``streams == num_workers`` read whole contiguous
    shard ranges instead of every worker touching every shard (remote tar shards). Batch sizes
    are unchanged (all full, the last one short unless ``drop_last``).

    Returns:
        int64 ``(k,)``, a permutation of ``arange(k)`` with ``k = num_batches * batch_size``
        clipped to ``count``; ``streams == 1`` gives the identity.
    """
    streams = check_int("streams", streams, 1)
    nb = num_batches(count, batch_size, drop_last)
    k = min(count, nb * batch_size)
    if streams == 1 or nb <= 1:
        return np.arange(k, dtype=np.int64)
    sizes = np.full(nb, batch_size, dtype=np.int64)
    sizes[-1] = k - (nb - 1) * batch_size
    delivered = np.concatenate([np.arange(s, nb, streams) for s in range(streams)])
    starts = np.zeros(nb, dtype=np.int64)  # start of each delivered batch in the input order
    starts[delivered] = np.concatenate([[0], np.cumsum(sizes[delivered])[:-1]])
    return np.concatenate([np.arange(starts[b], starts[b] + sizes[b]) for b in range(nb)])


def num_batches(count: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches from ``count`` samples: ``floor`` with ``drop_last`` else ``ceil``."""
    count = check_int("count", count, 0)
    batch_size = check_int("batch_size", batch_size, 1)
    return count // batch_size if drop_last else -(-count // batch_size)


@dataclass(frozen=True)
class EpochPlan:
    """What one rank reads in one epoch.

    Attributes:
        positions: int64 ``(m,)`` sample positions in split order (index into ``SplitIndex``),
            in the order this rank yields them.
        valid: bool ``(m,)``; False for ``even="pad"`` repeats.
        batch_size: samples per batch (>= 1); the last batch may be short unless ``drop_last``.
        drop_last: drop a final short batch.
        epoch, rank: for RNG derivation (:func:`sample_rng`).
        places: int64 ``(m,)`` or None: the place of each yielded sample in the rank's order
            before :func:`stream_order` cut it into per-worker ranges (None: no such cut, the
            place is the index). A sample's random draws are keyed by its place
            (:meth:`place`), so they do not depend on how many streams (workers) read it.
    """

    positions: np.ndarray
    valid: np.ndarray
    batch_size: int = 1
    drop_last: bool = False
    epoch: int = 0
    rank: int = 0
    places: np.ndarray | None = None

    def place(self, j: int) -> int:
        """The RNG place of the ``j``-th yielded sample (``sample_rng(seed, epoch, rank,
        place)``): ``j`` itself unless the plan was cut into streams."""
        return j if self.places is None else int(self.places[j])

    @property
    def num_batches(self) -> int:
        """Exact number of batches this rank yields in the epoch."""
        return num_batches(len(self.positions), self.batch_size, self.drop_last)

    def batch_slice(self, b: int) -> slice:
        """Slice of ``positions`` for batch ``b`` in ``[0, num_batches)``."""
        if not 0 <= b < self.num_batches:
            raise ConfigError(f"batch {b} is not in [0, {self.num_batches})")
        return slice(b * self.batch_size, min((b + 1) * self.batch_size, len(self.positions)))

    def worker_batches(self, worker_id: int, num_workers: int, start_batch: int = 0) -> np.ndarray:
        """Batch numbers built by ``worker_id`` of ``num_workers``: ``start_batch + worker_id``,
        then every ``num_workers``-th. int64, possibly empty (a worker with nothing yields nothing).
        """
        num_workers = check_int("num_workers", num_workers, 1)
        worker_id = check_int("worker_id", worker_id, 0)
        if worker_id >= num_workers:
            raise ConfigError(f"worker_id={worker_id} is not in [0, num_workers={num_workers})")
        start_batch = check_int("start_batch", start_batch, 0)
        return np.arange(start_batch + worker_id, self.num_batches, num_workers, dtype=np.int64)


def plan_epoch(n: int, *, rank: int = 0, world_size: int = 1, seed: int = 0, epoch: int = 0,
               shuffle: bool = False, mode: str = "exact", even: str | None = None,
               batch_size: int = 1, drop_last: bool = False, labels: np.ndarray | None = None,
               balance: str | None = None, samples_per_epoch: int | None = None,
               shards: np.ndarray | None = None, block: bool = False,
               streams: int = 1) -> EpochPlan:
    """:func:`epoch_order` then :func:`rank_plan`, with the batch rule: an :class:`EpochPlan`.

    ``streams > 1`` reorders the rank's positions with :func:`stream_order` (contiguous ranges
    per worker; the plan still depends only on ``streams``, not on ``num_workers``); each
    sample keeps its place in the uncut order for its random draws (``EpochPlan.places``), so
    its crop is the same for any number of streams.

    Raises:
        ConfigError: any invalid argument (see the functions above).
    """
    order = epoch_order(n, seed=seed, epoch=epoch, shuffle=shuffle, mode=mode, labels=labels,
                        balance=balance, samples_per_epoch=samples_per_epoch, shards=shards,
                        block=block)
    positions, valid = rank_plan(order, rank, world_size, even)
    batch_size = check_int("batch_size", batch_size, 1)
    places = None
    if streams != 1:
        places = stream_order(len(positions), batch_size, streams, drop_last)
        positions, valid = positions[places], valid[places]
    return EpochPlan(positions, valid, int(batch_size), bool(drop_last), int(epoch), int(rank),
                     places)
