"""Whole remote shards fetched ahead of the readers, in the order the epoch plan needs them.

A loader knows its whole epoch before the first sample is read: the rank's
:class:`~shardkit.sharding.EpochPlan` and the batches this process builds
(``plan.worker_batches``). So it knows in which order the shards will first be needed
(:func:`schedule_epoch`), and for a remote root (an fsspec URL of ``wds`` tar shards) a
:class:`ShardPrefetcher` fetches whole shards in that order, :data:`FETCH_THREADS` at a time,
into memory, while the decoding threads work on the shards already there (FFCV's
``schedule_epoch`` idea). Readers then slice the prefetched bytes
(:class:`shardkit.formats.wds.MemoryReader`); local datasets never get a prefetcher.

Memory (``bound`` bytes, :data:`DEFAULT_SHARD_PREFETCH_BYTES` unless the loader says
otherwise): the bytes held (shards fetched and kept, plus the size of every fetch in flight,
reserved from the manifest's ``bytes`` before it starts) never exceed ``bound``. The one
exception is a single shard larger than the bound: it is fetched alone, when nothing else is
held or in flight. ``high_water`` records the most ever held. A fetch in flight may briefly
need a second copy of its shard inside the HTTP client while the body is assembled.

Lifetime of a shard: pinned from the moment the fetch order reaches it until every sample of
it in this epoch's schedule has been consumed (its batch built, whether read, served from the
decoded cache or skipped); then it stays in memory, evictable, until its room is needed, so a
split that fits the bound is fetched once and later epochs read it from memory. Evicted first:
finished shards (the earliest finished first), then shards kept from an earlier epoch that the
current epoch needs latest (fetched again when their turn comes).

The schedule never deadlocks: the oldest batch still being built can always get its shards
when the shards that some unfinished batch still needs at any one point of the epoch fit in
``bound`` together (``EpochSchedule.peak_bytes``; shard-block order, the default for URLs,
needs about one shard per stream plus one). An order that needs more (``block=False`` with a
bound below the split) is not prefetched: the source reads those shards lazily, as without a
prefetcher, with one warning.

A failed fetch is tried :data:`FETCH_ATTEMPTS` times (a missing or forbidden object once),
then every read of that shard raises :class:`~shardkit.errors.ShardFetchError` naming the
shard and its URL; ``on_error="skip"`` never skips it, so the epoch never ends short. A
response whose length is not the manifest's ``bytes`` is a
:class:`~shardkit.errors.ShardCorruptError`.
"""
from __future__ import annotations

import threading
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import ShardCorruptError, ShardFetchError
from ..validate import check_int
from shardkit.storage.fetch import FETCH_ATTEMPTS, RETRY_DELAY_S, fetch_shard
from shardkit.storage.urls import read_location

__all__ = ["ShardPrefetcher", "EpochSchedule", "schedule_epoch", "plan_shards",
           "resolve_prefetch_bytes", "prefetch_threads", "DEFAULT_SHARD_PREFETCH_BYTES",
           "FETCH_THREADS", "FETCH_ATTEMPTS", "RETRY_DELAY_S", "THREAD_PREFIX"]

DEFAULT_SHARD_PREFETCH_BYTES = 1 << 30
"""Bytes of remote shards one loader may hold (1 GiB): about four shards of pack's default size
(256 MiB), enough for two streams' current shards and the next ones on the wire. With
``backend="process"`` each of the ``k`` worker processes holds at most ``bound // k``."""

FETCH_THREADS = 4
"""Whole-shard fetches in flight per prefetcher: with ~30 ms to the first byte, a few fetches
keep the link busy; more only help on higher latency or smaller shards."""

THREAD_PREFIX = "shardkit-prefetch"
"""Name prefix of the prefetcher's fetch threads (:func:`prefetch_threads` lists them)."""


def resolve_prefetch_bytes(value) -> int:
    """The memory bound in bytes: :data:`DEFAULT_SHARD_PREFETCH_BYTES` for None, else ``value``
    (an int >= 0; 0 turns prefetching off: shards are fetched on their first read).

    Raises:
        ConfigError: not an int >= 0 (bools refused).
    """
    if value is None:
        return DEFAULT_SHARD_PREFETCH_BYTES
    return check_int("shard_prefetch_bytes", value, 0)


def prefetch_threads() -> list[threading.Thread]:
    """The live fetch threads of every prefetcher of this process."""
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@dataclass(frozen=True)
class EpochSchedule:
    """What a prefetcher needs of one epoch of one process.

    Attributes:
        order: int64 shard numbers in the order they are first needed (each once).
        counts: int64 ``(num_shards,)``: samples of each shard this epoch (pad repeats count).
        peak_bytes: the most bytes of shards that some unfinished batch still needs at one
            point of the epoch (a point needing a single shard counts 0: it is always served).
    """

    order: np.ndarray
    counts: np.ndarray
    peak_bytes: int


def plan_shards(plan, batches: np.ndarray, shard_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(shard of each sample, batch number of each sample)`` in the order this process reads
    them: the samples of ``plan``'s batches ``batches`` (int64), batch after batch; the batch
    numbers count 0, 1, ... in that order. ``shard_of``: the split index's shard per position."""
    batches = np.asarray(batches, dtype=np.int64)
    bs, n = plan.batch_size, len(plan.positions)
    at = (batches[:, None] * bs + np.arange(bs, dtype=np.int64)[None, :]).ravel()
    which = np.repeat(np.arange(len(batches), dtype=np.int64), bs)
    keep = at < n
    return np.asarray(shard_of)[plan.positions[at[keep]]].astype(np.int64), which[keep]


def schedule_epoch(shards: np.ndarray, batch_of: np.ndarray, sizes: Sequence[int]
                   ) -> EpochSchedule:
    """The :class:`EpochSchedule` of reading samples of ``shards`` (int, one per sample, in read
    order) in batches ``batch_of`` (non-decreasing, from 0), with ``sizes[s]`` bytes per shard."""
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = np.bincount(shards, minlength=len(sizes)).astype(np.int64)
    if len(shards) == 0:
        return EpochSchedule(np.zeros(0, dtype=np.int64), counts, 0)
    ids, first = np.unique(shards, return_index=True)
    _, last_rev = np.unique(shards[::-1], return_index=True)
    last = len(shards) - 1 - last_rev
    order = ids[np.argsort(first, kind="stable")]
    nb = int(batch_of[-1]) + 1
    cover = np.zeros(nb + 1, dtype=np.int64)
    held = np.zeros(nb + 1, dtype=np.int64)
    np.add.at(cover, batch_of[first], sizes[ids])
    np.add.at(cover, batch_of[last] + 1, -sizes[ids])
    np.add.at(held, batch_of[first], 1)
    np.add.at(held, batch_of[last] + 1, -1)
    cover, held = np.cumsum(cover)[:nb], np.cumsum(held)[:nb]
    shared = cover[held > 1]
    return EpochSchedule(order.astype(np.int64), counts, int(shared.max()) if len(shared) else 0)


class ShardPrefetcher:
    """Fetches whole shards of one split ahead of its readers, within ``bound`` bytes (see the
    module docstring for the rules). Thread-safe; one per process (its threads do not survive
    a fork: the source makes a new one in a worker process).

    Args:
        urls, names: per shard, its URL and its path in the dataset (for errors).
        sizes: per shard, its size in bytes (the manifest's ``bytes``).
        bound: the memory bound in bytes (> 0).
        threads: fetches in flight (default :data:`FETCH_THREADS`).
        fetch: ``url -> bytes`` (default :func:`shardkit.storage.urls.read_location`: one GET).

    Attributes:
        high_water: the most bytes ever held (shards kept plus fetches in flight).
        fetches: ``Counter`` of completed fetches per shard number.
    """

    def __init__(self, urls: Sequence[str], names: Sequence[str], sizes: Sequence[int],
                 bound: int, threads: int = FETCH_THREADS,
                 fetch: Callable[[str], bytes] = read_location):
        self.urls, self.names = list(urls), list(names)
        self.sizes = [int(s) for s in sizes]
        self.bound = int(bound)
        self.threads = max(1, int(threads))
        self._fetch_url = fetch
        self.high_water = 0
        self.fetches: Counter = Counter()
        self._cond = _Wakeup()
        self._held: OrderedDict[int, bytes] = OrderedDict()
        self._held_bytes = 0
        self._reserved = 0
        self._inflight: set[int] = set()
        self._token: object = None
        self._order: list[int] = []
        self._rank: dict[int, int] = {}
        self._remaining: dict[int, int] = {}
        self._errors: dict[int, BaseException] = {}
        self._next = 0
        self._workers: list[threading.Thread] = []
        self._closed = False

    @property
    def held_bytes(self) -> int:
        """Bytes held now: shards kept plus fetches in flight."""
        with self._cond:
            return self._held_bytes + self._reserved

    def stats(self) -> dict:
        """``{"bound", "held_bytes", "high_water", "shards_held", "fetches"}`` (bytes, counts)."""
        with self._cond:
            return {"bound": self.bound, "held_bytes": self._held_bytes + self._reserved,
                    "high_water": self.high_water, "shards_held": len(self._held),
                    "fetches": sum(self.fetches.values())}

    # --- the consumer side -------------------------------------------------------------------
    def schedule(self, token: object, schedule: EpochSchedule) -> None:
        """Starts an epoch: fetch ``schedule.order``; ``token`` identifies it in
        :meth:`consumed` (a late batch of an abandoned epoch is ignored). Shards held from an
        earlier schedule are kept (evictable) and not fetched again."""
        with self._cond:
            if self._closed:
                return
            self._token = token
            self._order = schedule.order.tolist()
            self._rank = {s: i for i, s in enumerate(self._order)}
            self._remaining = {s: int(schedule.counts[s]) for s in self._order}
            self._errors = {}
            self._next = 0
            while len(self._workers) < min(self.threads, len(self._order)):
                t = threading.Thread(target=_fetch_loop, args=(weakref.ref(self), self._cond),
                                     daemon=True, name=f"{THREAD_PREFIX}-{len(self._workers)}")
                self._workers.append(t)
                t.start()
            self._cond.wake()

    def get(self, s: int, token: object) -> bytes | None:
        """The bytes of shard ``s`` for a reader of the epoch ``token``, waiting for its fetch;
        None (the caller reads it another way) when ``s`` is not, or no longer, in the
        schedule, or when ``token`` is not the scheduled epoch (a batch of an abandoned epoch
        still being built must not wait for the new epoch's fetches: the threads it holds may
        be the ones the new epoch needs).

        Raises:
            ShardFetchError: its fetch failed (names the shard and URL).
            ShardCorruptError: the response's length is not the manifest's.
        """
        data = self._held.get(s)
        if data is not None:
            return data
        with self._cond:
            while True:
                data = self._held.get(s)
                if data is not None:
                    return data
                if token is not self._token:
                    return None
                err = self._errors.get(s)
                if err is not None:
                    raise _copy(err)
                if self._closed or self._remaining.get(s, 0) <= 0:
                    return None
                if s not in self._inflight and self._rank[s] < self._next:
                    return None  # passed and not kept (cannot happen for a pinned shard)
                self._cond.wait()

    def consumed(self, token: object, shards: np.ndarray) -> None:
        """Samples of ``shards`` (one entry per sample) of the epoch ``token`` are done; a shard
        whose last sample this is becomes evictable."""
        ids, n = np.unique(np.asarray(shards, dtype=np.int64), return_counts=True)
        with self._cond:
            if token is not self._token:
                return
            freed = False
            for s, c in zip(ids.tolist(), n.tolist()):
                left = self._remaining.get(s)
                if left is None or left <= 0:
                    continue
                self._remaining[s] = left = max(0, left - c)
                if left == 0 and s in self._held:
                    self._held.move_to_end(s)  # evicted after the ones finished before it
                    freed = True
            if freed:
                self._cond.wake()

    def close(self) -> None:
        """Stops the fetch threads (a fetch in flight ends first) and drops every shard."""
        with self._cond:
            self._closed = True
            self._cond.wake()
            workers, self._workers = self._workers, []
        for t in workers:
            t.join()
        with self._cond:
            self._held.clear()
            self._held_bytes = 0
            self._remaining = {}

    # --- the fetch threads (:func:`_fetch_loop`) -----------------------------------------------
    def _next_job(self) -> tuple[object, int]:
        """``(job, wakeups)``: the next shard to fetch with its size reserved, None (none, or
        no room yet) or :data:`_STOP` once closed; ``wakeups``: the lock's count of wake-ups,
        to wait for the next one."""
        with self._cond:
            s = _STOP if self._closed else self._claim()
            return s, self._cond.wakeups

    def _land(self, s: int, data: bytes | None, err: BaseException | None) -> None:
        """Keeps a finished fetch (or its error, for the readers of ``s``)."""
        with self._cond:
            self._reserved -= self.sizes[s]
            self._inflight.discard(s)
            if err is None and not self._closed:
                self._held[s] = data
                self._held_bytes += len(data)
                self.fetches[s] += 1
            elif err is not None and s in self._remaining:
                self._errors[s] = err
            self._cond.wake()

    def _claim(self) -> int | None:
        """The next shard to fetch with its size reserved, or None (none, or no room yet).
        Called with the lock held."""
        if self._closed:
            return None
        s = self._peek()
        if s is None or not self._make_room(self.sizes[s]):
            return None
        self._next += 1
        self._reserved += self.sizes[s]
        self._inflight.add(s)
        self.high_water = max(self.high_water, self._held_bytes + self._reserved)
        return s

    def _peek(self) -> int | None:
        """The next shard of the order not held or in flight (the fetch pointer moves past
        those: they are pinned from here on)."""
        while self._next < len(self._order):
            s = self._order[self._next]
            if s not in self._held and s not in self._inflight:
                return s
            self._next += 1
        return None

    def _make_room(self, need: int) -> bool:
        """Evicts until ``need`` more bytes fit the bound; False when they cannot yet (pinned
        shards fill it). A shard larger than the bound fits only when nothing is held."""
        while self._held_bytes + self._reserved + need > self.bound:
            victim = self._victim()
            if victim is None:
                return self._held_bytes + self._reserved == 0
            self._held_bytes -= len(self._held.pop(victim))
        return True

    def _victim(self) -> int | None:
        """A finished shard (the earliest finished), else the kept shard needed latest."""
        for s in self._held:
            if self._remaining.get(s, 0) <= 0:
                return s
        ahead = [s for s in self._held if self._rank[s] >= self._next]
        return max(ahead, key=self._rank.__getitem__) if ahead else None

    def _fetch(self, s: int) -> tuple[bytes | None, BaseException | None]:
        """``(bytes, None)`` of shard ``s``, or ``(None, the ShardFetchError /
        ShardCorruptError its readers get)`` (:func:`shardkit.storage.fetch.fetch_shard`)."""
        try:
            return fetch_shard(self.urls[s], self.names[s], self.sizes[s], read=self._fetch_url,
                               stop=lambda: self._closed), None
        except (ShardFetchError, ShardCorruptError) as e:
            return None, e


class _Wakeup(threading.Condition):
    """A condition that counts its wake-ups (:meth:`wake`), so a fetch thread that let go of
    the lock can tell whether it missed one before it waits."""

    wakeups = 0

    def wake(self) -> None:
        """``notify_all`` (with the lock held), counted."""
        self.wakeups += 1
        self.notify_all()


_STOP = object()
_IDLE_WAIT_S = 1.0  # the longest an idle fetch thread waits before it looks again


def _fetch_loop(ref: "weakref.ref[ShardPrefetcher]", cond: _Wakeup) -> None:
    """A fetch thread: claims the next shard, fetches it, keeps it; ends when the prefetcher is
    closed or gone. It holds the prefetcher only while it claims or fetches (it waits on
    ``cond`` alone), so a loader dropped without ``close()`` is freed with its shards, and
    its threads end within ``_IDLE_WAIT_S``."""
    while True:
        pf = ref()
        if pf is None:
            return
        s, seen = pf._next_job()
        if s is _STOP:
            return
        if s is not None:
            pf._land(s, *pf._fetch(s))
            continue
        del pf
        with cond:
            if cond.wakeups == seen:  # nothing changed since the claim: wait for a change
                cond.wait(_IDLE_WAIT_S)


def _copy(err: BaseException) -> BaseException:
    """A fresh exception like ``err`` (each reading thread raises its own: one exception object
    raised in several threads at once would share one traceback)."""
    if isinstance(err, ShardFetchError):
        new: BaseException = ShardFetchError(str(err), shard=err.shard, url=err.url)
    elif isinstance(err, ShardCorruptError):
        new = ShardCorruptError(str(err), shard=err.shard, key=err.key)
    else:
        return err
    new.__cause__ = err.__cause__
    return new
