"""Backends that run a :class:`~shardkit.stream.datasets.BatchDataset`'s epoch plan:
:class:`ThreadBackend` (default) and :class:`ProcessBackend`. Both yield identical batches.

Each has ``batches(start) -> iterator`` (the epoch's batches ``start, start + 1, ...`` in order),
``close()`` (stops threads or worker processes; the backend can be used again afterwards) and
context-manager use. :class:`~shardkit.stream.ShardLoader` forwards both.
"""
from __future__ import annotations

import copy
import multiprocessing
import os
import threading
import time
from collections import deque
from concurrent.futures import CancelledError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..errors import LoaderError, SharedMemoryError
from .buffers import BufferPool
from .datasets import BatchDataset
from .options import WorkerOptions
from .source import worker_id_count
from .tuning import AutoTuner, Tuning

__all__ = ["ThreadBackend", "ProcessBackend"]


class _Backend:
    num_workers: int
    prefetch_factor: int
    pin_memory: bool
    tuning: Tuning | None = None

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ThreadBackend(_Backend):
    """Builds batches in ``num_workers`` threads of the calling process.

    The fused crop-decode-resize (and libjpeg-turbo / Pillow decoding) runs without the GIL, so
    threads decode in parallel while the per-sample Python work stays short. Compared with worker
    processes this removes the inter-process transfer of every batch (a fresh shared-memory
    segment per batch: ~0.19 ms per 224 px image on a 2-core VM, a fifth of the per-image cost)
    and all fork/spawn hazards; batches land in private (or pinned) memory of the consumer, as in
    FFCV and DALI. All threads share the dataset's :class:`ShardSource` (shard readers, index);
    each has its own copy of the transform (decoder handles are not thread-safe) and its own
    read buffer; batch memory is recycled through a :class:`~shardkit.stream.buffers.BufferPool`
    once the consumer has dropped a batch. ``prefetch_factor`` batches per thread are in
    flight; they are yielded in batch order. ``num_workers=0`` builds every batch in the
    consumer's thread.

    With a ``tuner`` (:class:`~shardkit.stream.tuning.AutoTuner`, ``num_workers="auto"``;
    ``num_workers`` is then its ``max_workers``, the most it may pick) the pool has
    ``tuner.workers`` threads and ``tuner.depth()`` batches are in flight; both may change
    between batches, never what a batch holds: a new count gets a new pool (:meth:`_pool_of`),
    the builds in flight finishing on the old one. Once it settled, its setting runs as a fixed
    one.
    """

    #: Build an epoch's last batch in parts on every thread (see :meth:`_submit`); False
    #: builds it whole, as any other batch (benchmarks/bench_overhead.py compares the two).
    split_last = True

    def __init__(self, dataset: BatchDataset, num_workers: int, prefetch_factor: int,
                 pin_memory: bool, timeout: float, tuner: AutoTuner | None = None):
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.timeout = timeout
        self.tuner = tuner
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._retired: list[ThreadPoolExecutor] = []  # replaced pools whose threads still run
        self._closes = 0  # close() calls: an iteration started before one stops at its next batch
        self._local = threading.local()
        # every batch in flight, plus a few the consumer may still hold
        most = max(1, num_workers) * prefetch_factor if tuner is None else tuner.most_in_flight
        self.buffers = BufferPool(most + 4)

    def __getstate__(self):
        raise TypeError("a thread-backend ShardLoader cannot be pickled; build one per process")

    def _transform(self) -> Callable:
        tf = getattr(self._local, "transform", None)
        if tf is None:
            tf = self._local.transform = copy.copy(self.dataset.transform)
            if hasattr(tf, "_decoder"):
                tf._decoder = None  # a fresh decoder handle for this thread
        return tf

    def _build(self, plan, b: int):
        return self.dataset.build(plan, b, transform=self._transform(), pin=self.pin_memory,
                                  buffers=self.buffers)

    def _build_timed(self, plan, b: int):
        """``(batch, build seconds, build thread CPU seconds)``."""
        t0, c0 = time.perf_counter(), time.thread_time()
        batch = self._build(plan, b)
        return batch, time.perf_counter() - t0, time.thread_time() - c0

    def _part(self, batch, lo: int, hi: int):
        """``(tally, build seconds, thread CPU seconds)`` of rows ``lo:hi`` of ``batch``, in
        this thread."""
        t0, c0 = time.perf_counter(), time.thread_time()
        tally = self.dataset.build_part(batch, lo, hi, self._transform())
        return tally, time.perf_counter() - t0, time.thread_time() - c0

    def _submit(self, plan, b: int, last: bool, workers: int, timed: bool):
        """A future of batch ``b`` (``(batch, build seconds, build CPU seconds)`` when
        ``timed``). The epoch's ``last`` batch is built in ``2 x workers`` parts by every thread
        (:class:`_SplitBatch`): built whole, one thread would build it while the others idle
        (~2% of an epoch of 30 batches on 2 cores). Device-decode batches (bytes only) are never
        split."""
        if last and self.split_last and workers > 1 and not self.dataset.device_decode:
            sl = plan.batch_slice(b)
            if sl.stop - sl.start >= 2 * workers:
                return _SplitBatch(self, plan, b, 2 * workers, timed)
        return self._pool.submit(self._build_timed if timed else self._build, plan, b)

    def batches(self, start: int, describe: Callable[[], str]) -> Iterator[tuple]:
        """The current epoch's batches ``start, start + 1, ...`` in order."""
        plan = self.dataset.plan()
        numbers = plan.worker_batches(0, 1, start)
        last = int(numbers[-1]) if len(numbers) else -1
        todo = (int(b) for b in numbers)
        if self.num_workers == 0:
            for b in todo:
                yield self._build(plan, b)
            return
        tuner, opened = self.tuner, self._closes
        if tuner is not None and not tuner.settled:
            yield from self._tuned(plan, todo, last, describe, opened)
            return
        workers, depth = self.num_workers, self.num_workers * self.prefetch_factor
        if tuner is not None:  # settled: its setting, as a fixed one
            workers, depth = tuner.workers, tuner.depth()
        self._pool_of(workers)
        yield from self._fixed(plan, todo, last, describe, workers, depth, deque(), opened)

    def _open_since(self, opened: int) -> None:
        """Raises LoaderError when :meth:`close` ran since the iteration began (at ``opened``
        closes): it must not start a pool again, nor take one a later iteration started."""
        if self._closes != opened:
            raise LoaderError(_CLOSED)

    def _fixed(self, plan, todo, last: int, describe, workers: int, depth: int,
               pending: deque, opened: int) -> Iterator[tuple]:
        """The batches of ``pending`` (``(future, timed)``, submitted earlier), then of
        ``todo``, in order, ``depth`` in flight on the current pool."""
        try:
            for b in todo:
                self._open_since(opened)
                pending.append((self._submit(plan, b, b == last, workers, False), False))
                while len(pending) >= depth:  # a deeper carried queue drains to ``depth``
                    self._open_since(opened)
                    yield self._batch(pending.popleft(), describe)
            while pending:
                self._open_since(opened)
                yield self._batch(pending.popleft(), describe)
        finally:
            for f, _ in pending:
                f.cancel()

    def _batch(self, entry: tuple, describe) -> tuple:
        """The batch of a ``(future, timed)`` entry (a timed one's times dropped)."""
        future, timed = entry
        result = self._result(future, describe)
        return result[0] if timed else result

    def _pool_of(self, size: int) -> None:
        """The thread pool, ``size`` threads: the tuner's every change of ``workers`` gets a pool
        of that size (a larger pool whose extra threads waited at a gate was measured 3-5%
        slower than the same fixed setting on 2 CPUs: idle threads still took turns on the CPUs
        and their transforms' caches). A pool of another size is replaced without waiting,
        between epochs or between batches: builds it still runs or holds
        (an iteration the caller keeps, or a build that hung, which ``timeout`` reported) finish
        on its threads, which then exit."""
        if self._pool is not None and self._pool_size == size:
            return
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            # kept until its threads exit, so that close() stops them too
            self._retired = [p for p in self._retired if _alive(p)] + [self._pool]
        self._pool = ThreadPoolExecutor(size, thread_name_prefix="shardkit")
        self._pool_size = size

    def _tuned(self, plan, todo, last: int, describe, opened: int) -> Iterator[tuple]:
        """The batches of ``todo`` in order, ``tuner.depth()`` in flight on a pool of
        ``tuner.workers`` threads, measured per batch for the tuner (wait, step, build and its
        thread CPU time) until it settles; the rest of the epoch then runs as :meth:`_fixed`."""
        tuner, pending = self.tuner, deque()
        tuner.start_epoch()
        try:
            while not tuner.settled:
                self._open_since(opened)
                self._pool_of(tuner.workers)
                depth = tuner.depth()
                while len(pending) < depth:
                    b = next(todo, None)
                    if b is None:
                        break
                    pending.append((self._submit(plan, b, b == last, tuner.workers, True),
                                    True))
                if not pending:
                    return
                t0 = time.perf_counter()
                batch, build, build_cpu = self._result(pending.popleft()[0], describe)
                t1 = time.perf_counter()
                yield batch
                tuner.observe(t1 - t0, time.perf_counter() - t1, build, build_cpu)
            self._open_since(opened)
            self._pool_of(tuner.workers)
            yield from self._fixed(plan, todo, last, describe, tuner.workers, tuner.depth(),
                                   pending, opened)
        finally:
            for f, _ in pending:
                f.cancel()
            tuner.end_epoch()

    def _result(self, future, describe):
        try:
            return future.result(timeout=self.timeout)
        except CancelledError:
            raise LoaderError(f"{describe()}: {_CLOSED}") from None
        except FutureTimeout:
            raise LoaderError(f"{describe()}: no batch within timeout={self.timeout} s; a "
                              "decoding thread hung (field case 19)") from None

    def describe(self) -> str:
        if self.tuner is not None:
            t = self.tuner.tuning
            return (f"backend=thread, num_workers=auto ({t.num_workers} of {self.num_workers}, "
                    f"{'settled' if t.settled else 'measuring'}), prefetch_factor="
                    f"{t.prefetch_factor}, pin_memory={self.pin_memory}")
        return (f"backend=thread, num_workers={self.num_workers}, "
                f"prefetch_factor={self.prefetch_factor}, pin_memory={self.pin_memory}")

    def close(self) -> None:
        """Stops the decoding threads (after their current batch; queued builds are cancelled,
        those of pools the tuner replaced too) and closes shard readers. An iteration still
        running raises :class:`~shardkit.errors.LoaderError` at its next batch."""
        self._closes += 1
        pool, self._pool = self._pool, None
        retired, self._retired = self._retired, []
        pools = retired + ([pool] if pool is not None else [])
        for p in pools:  # every queue cancelled first, then each running build waited for
            p.shutdown(wait=False, cancel_futures=True)
        for p in pools:
            p.shutdown(wait=True)
        self.buffers.clear()
        self.dataset.source.close()


#: What an iteration that :meth:`ThreadBackend.close` interrupted raises at its next batch.
_CLOSED = "the loader was closed during this iteration; start a new one (iter(loader))"


def _alive(pool: ThreadPoolExecutor) -> bool:
    """Whether a shut-down pool still has a running thread (its ``_threads``; kept when the
    attribute is not there)."""
    threads = getattr(pool, "_threads", None)
    return threads is None or any(t.is_alive() for t in threads)


class _SplitBatch:
    """One batch built in ``parts`` row ranges by the pool's threads at once (the memory and
    positions taken now, in the consumer's thread); :meth:`result` waits for every part and
    assembles the batch (:meth:`BatchDataset.finish_batch`): the same batch as one build.
    Quacks like the ``Future`` of a whole build (``result(timeout)``, ``cancel()``)."""

    def __init__(self, backend: ThreadBackend, plan, b: int, parts: int, timed: bool):
        self.dataset, self.timed = backend.dataset, timed
        self.batch = backend.dataset.start_batch(plan, b, pin=backend.pin_memory,
                                                 buffers=backend.buffers)
        n = self.batch.n
        bounds = [n * k // parts for k in range(parts + 1)]
        self.futures = [backend._pool.submit(backend._part, self.batch, lo, hi)
                        for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]

    def result(self, timeout: float | None = None):
        """The batch (``(batch, summed build seconds, summed thread CPU seconds)`` when timed);
        a part's error is raised.

        Raises:
            concurrent.futures.TimeoutError: the parts not done within ``timeout`` seconds.
        """
        end = None if timeout is None else time.monotonic() + timeout
        done = [f.result(None if end is None else max(0.0, end - time.monotonic()))
                for f in self.futures]
        batch = self.dataset.finish_batch(self.batch, [tally for tally, _, _ in done])
        if not self.timed:
            return batch
        return batch, sum(d[1] for d in done), sum(d[2] for d in done)

    def cancel(self) -> bool:
        return all([f.cancel() for f in self.futures])


def _to_shared(obj):
    """``obj`` (a batch: tensors, dicts, lists, tuples of them) with every CPU tensor moved into
    shared memory now, in this worker: ``torch``'s ``RuntimeError: unable to allocate shared
    memory`` is raised here, as a :class:`~shardkit.errors.SharedMemoryError`, where the
    DataLoader reports it, and not in the queue's feeder thread, which would print it and drop
    the batch."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.device.type == "cpu" and not item.is_shared():
                try:
                    item.share_memory_()
                except RuntimeError as e:
                    raise SharedMemoryError(str(e)) from e
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return obj


class _Numbered(IterableDataset):
    """What the DataLoader of :class:`ProcessBackend` iterates: the batches of ``dataset``, each
    as ``(batch number, batch)``, in shared memory already when built in a worker process
    (:func:`_to_shared`). Worker ``w`` of ``k`` builds batches ``start + w``, then every
    ``k``-th, so the consumer can check that none was lost on the way."""

    def __init__(self, dataset: BatchDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self):
        wid, nw = worker_id_count()
        start = self.dataset.sampling.state.start_batch
        share = get_worker_info() is not None
        for k, batch in enumerate(self.dataset):
            yield start + wid + k * nw, _to_shared(batch) if share else batch


def _free_shm() -> str:
    try:
        st = os.statvfs("/dev/shm")
        return (f"/dev/shm: {st.f_bavail * st.f_frsize / 1e6:.1f} MB free of "
                f"{st.f_blocks * st.f_frsize / 1e6:.1f} MB")
    except OSError:
        return "/dev/shm: unknown size"


class ProcessBackend(_Backend):
    """``torch.utils.data.DataLoader`` worker processes (``batch_size=None``): batch ``b`` is
    built by worker ``(b - start) % num_workers``, so the DataLoader's round-robin returns
    batches in order. The epoch, resume point and stream count reach the workers through the
    dataset's shared :class:`~shardkit.stream.state.EpochState`, read at the start of every
    worker iteration, so persistent workers see ``set_epoch`` and ``load_state_dict`` too
    (field case 18).

    Every batch is moved into shared memory in its worker (a failure there, such as a full
    ``/dev/shm``, is a :class:`LoaderError` in the consumer) and carries its batch number: the
    consumer checks that batches ``start, start + 1, ...`` arrive each exactly once and all of
    them, so an epoch is whole or raises; it never ends short.
    """

    def __init__(self, dataset: BatchDataset, num_workers: int, prefetch_factor: int,
                 pin_memory: bool, options: WorkerOptions, world_size: int):
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = bool(pin_memory)
        kwargs: dict = {"batch_size": None, "num_workers": num_workers, "pin_memory": pin_memory}
        if num_workers:
            ctx = options.multiprocessing_context
            if ctx is None and pin_memory and world_size > 1:
                ctx = "forkserver"  # field case 19: CUDA state must not be forked
            if isinstance(ctx, str):
                ctx = multiprocessing.get_context(ctx)
            kwargs.update(prefetch_factor=prefetch_factor,
                          persistent_workers=options.persistent_workers,
                          timeout=options.timeout, multiprocessing_context=ctx)
        self.dataloader = DataLoader(_Numbered(dataset), **kwargs)

    @property
    def start_method(self) -> str | None:
        """Worker start method (``fork``, ``forkserver``, ``spawn``); None without workers."""
        if self.num_workers == 0:
            return None
        ctx = self.dataloader.multiprocessing_context
        return ctx.get_start_method() if ctx is not None else multiprocessing.get_start_method()

    def batches(self, start: int, describe: Callable[[], str]) -> Iterator[tuple]:
        """The current epoch's batches ``start, start + 1, ...`` in order.

        Raises:
            LoaderError: a worker timed out, could not allocate shared memory for a batch, or
                a batch was lost between a worker and this process (the epoch would be short).
        """
        total = self.dataset.plan().num_batches
        expect = start
        it = iter(self.dataloader)
        while True:
            try:
                b, batch = next(it)
            except StopIteration:
                break
            except SharedMemoryError as e:  # raised in the worker (type kept, not attributes)
                raise SharedMemoryError(
                    f"{describe()}: a worker could not allocate shared memory to pass a "
                    f"batch to this process ({_free_shm()}). Give /dev/shm more room (e.g. "
                    "docker run --shm-size=2g), lower num_workers, prefetch_factor or "
                    "batch_size, or use WorkerOptions(backend='thread') (batches in private "
                    f"memory). {str(e).strip().splitlines()[-1]}") from e
            except RuntimeError as e:
                # torch's own timeout carries nothing but its message ("DataLoader timed out
                # after N seconds"); every other RuntimeError is raised as it is
                if "timed out" not in str(e):
                    raise
                raise LoaderError(f"{describe()}: no batch within timeout="
                                  f"{self.dataloader.timeout} s ({e}); a worker hung or died "
                                  "(field case 19)") from e
            if b != expect:
                raise LoaderError(f"{describe()}: batch {expect} of the epoch never arrived "
                                  f"from its worker (batch {b} came instead); the epoch would "
                                  "be short")
            expect += 1
            yield batch
        if expect != total:
            raise LoaderError(f"{describe()}: the workers ended the epoch after "
                              f"{expect - start} of its {total - start} batches from batch "
                              f"{start} ({total - expect} lost on the way); the epoch would be "
                              "short")

    def describe(self) -> str:
        dl = self.dataloader
        return (f"backend=process, num_workers={self.num_workers}, "
                f"start_method={self.start_method}, pin_memory={self.pin_memory}, "
                f"persistent_workers={dl.persistent_workers}")

    def close(self) -> None:
        """Stops persistent worker processes (others stop at the end of each epoch)."""
        it = getattr(self.dataloader, "_iterator", None)
        if it is not None:
            # the DataLoader has no public way to stop persistent workers; this is the one
            # place shardkit reaches for it
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            self.dataloader._iterator = None
        self.dataset.source.close()
