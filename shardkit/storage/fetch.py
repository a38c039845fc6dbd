"""Reading many source files whose bytes may live in object storage: GETs kept in flight.

A GET from S3, GCS or HTTP waits ~20-100 ms for its first byte, ~100x what the decode check of a
small photo costs, so one file at a time leaves a check worker idle almost all the time (the
100 M-file model in ``benchmarks/README.md``). :func:`iter_read` keeps up to ``concurrency``
reads in flight in a thread pool while the caller works on the files already read, and yields
the results in input order, so a check task decodes file ``i`` while files ``i+1 ..
i+concurrency`` are on the wire. fsspec's own filesystems do the I/O (s3fs, gcsfs and HTTP run
their requests on fsspec's event loop thread; the pool threads only wait), so this is the same
read as :func:`shardkit.storage.urls.read_location`, concurrently.

Local paths are read one after the other in the caller's thread, as before: the page cache and
the disk's own read-ahead serve them, and the order of reads stays the one the pack documents.
Memory: at most ``concurrency`` files' bytes are held besides the one being worked on.
"""
from __future__ import annotations

import collections
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

from shardkit.storage.urls import is_url, read_location

__all__ = ["iter_read", "read_one", "DEFAULT_CONCURRENCY"]

DEFAULT_CONCURRENCY = 16
"""Reads of remote files in flight per check worker (a process, or a Ray task). With a first-byte
latency of ~30 ms and ~1-2 ms of CPU per file, ~16 reads in flight keep one core busy; more only
help when the latency is higher (cross-region) or the files larger."""


def read_one(location: str | None) -> tuple[bytes | None, BaseException | None]:
    """``(bytes, None)`` of one location, or ``(None, the exception its read raised)``;
    ``(None, None)`` for None."""
    if location is None:
        return None, None
    try:
        return read_location(location), None
    except Exception as e:  # noqa: BLE001 - handed to the caller, which names the cause
        return None, e


def iter_read(locations: Iterable[str | None], concurrency: int = DEFAULT_CONCURRENCY
              ) -> Iterator[tuple[bytes | None, BaseException | None]]:
    """``(data, None)`` or ``(None, error)`` for every location, in input order.

    Args:
        locations: local paths and/or remote fsspec URLs (``s3://``, ``gs://``, ``https://``);
            None: nothing to read there (yields ``(None, None)``).
        concurrency: most remote reads in flight (>= 1; 1 reads one at a time). Local paths are
            always read in the caller's thread, when their turn comes.

    Yields:
        the bytes of each location, or the exception its read raised (OSError, the
        filesystem's own error): a failed read does not stop the others.

    Closing the generator early waits for the reads in flight (at most ``concurrency``) and
    drops their bytes.
    """
    it = iter(locations)
    if concurrency <= 1:
        for loc in it:
            yield read_one(loc)
        return
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="shardkit-read")
    pending: collections.deque = collections.deque()  # (location, future or None for local)

    def refill() -> None:
        for loc in itertools.islice(it, max(0, concurrency - len(pending))):
            remote = loc is not None and is_url(loc)
            pending.append((loc, pool.submit(read_one, loc) if remote else None))

    try:
        refill()
        while pending:
            loc, fut = pending.popleft()
            refill()  # keep the window full while the caller works on this one
            yield read_one(loc) if fut is None else fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
