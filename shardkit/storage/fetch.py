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
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

from shardkit.errors import ShardCorruptError, ShardFetchError
from shardkit.storage.urls import is_url, read_location

__all__ = ["iter_read", "read_one", "fetch_shard", "DEFAULT_CONCURRENCY", "FETCH_ATTEMPTS",
           "RETRY_DELAY_S"]

FETCH_ATTEMPTS = 3
"""Tries of one remote shard's GET before it is a ShardFetchError (a missing or forbidden
object: one try). Waits of :data:`RETRY_DELAY_S`, then twice that, between tries."""
RETRY_DELAY_S = 0.2


def fetch_shard(url: str, name: str, size: int | None = None, *,
                read: Callable[[str], bytes] = read_location,
                stop: Callable[[], bool] = lambda: False) -> bytes:
    """The whole bytes of the remote shard ``name`` at ``url`` (one GET through ``read``),
    tried :data:`FETCH_ATTEMPTS` times (a missing or forbidden object once; no more tries once
    ``stop()`` is true), and checked against the manifest's ``size`` (bytes) when given.
    Every remote read of a shard goes through here: the prefetcher's and a lazy reader's.

    Raises:
        ShardFetchError: the GET failed every time (names the shard, the URL and the cause; a
            refused connection, HTTP 404/403/500, a timeout).
        ShardCorruptError: the object is not ``size`` bytes long (a shard-level fault: ``key``
            is None).
    """
    data, err, attempt = None, None, 0
    for attempt in range(1, FETCH_ATTEMPTS + 1):
        try:
            data, err = read(url), None
            break
        except (FileNotFoundError, PermissionError) as e:
            err = e  # a missing or forbidden object: trying again will not help
            break
        except Exception as e:  # noqa: BLE001 - fsspec's and the client's own errors
            err = e
            if stop():
                break
            if attempt < FETCH_ATTEMPTS:
                time.sleep(RETRY_DELAY_S * 2 ** (attempt - 1))
    if err is not None:
        tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
        why = {FileNotFoundError: "no such object (HTTP 404, a missing key, or no server)",
               PermissionError: "access denied (HTTP 403)"}.get(type(err), type(err).__name__)
        raise ShardFetchError(f"shard {name}: cannot fetch {url} ({tries}): {why}: {err}; the "
                              "epoch cannot be read whole: check the URL and the server (a "
                              "missing object is not retried)", shard=name, url=url) from err
    if size is not None and len(data) != int(size):
        raise ShardCorruptError(
            f"shard {name}: {url} returned {len(data)} bytes, the manifest says {int(size)}: "
            "the object is not the packed shard (re-upload the dataset)", shard=name)
    return data

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
