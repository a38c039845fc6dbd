"""The Ray side of ``shardkit pack --engine ray``: connecting to Ray and running tasks in order.

The engine itself, :class:`shardkit.packer.engines.RayEngine`, lives with the local one in the
packer and runs the packer's worker functions as Ray tasks through this module:

- :func:`ensure_ray`: the ``ray`` module, connected (a local runtime started here ends with this
  process, :mod:`shardkit.ray.reaper`);
- :func:`run_ordered`: tasks run with a cap on those in flight, their results yielded in input
  order, the task's own error re-raised as itself, the rest cancelled on an error or an early
  close;
- :func:`cluster_cpus`, :data:`MAX_RETRIES`.

Fault tolerance is Ray's: a task whose worker process or node dies is retried
(:data:`MAX_RETRIES` times; a retried write starts its shard again from its temp name). An error
raised by the work itself (a file changed since the check, a full disk) is not retried: it is
re-raised on the driver as the original exception, after the other tasks were cancelled and had
ended, so nothing writes into ``OUT`` after the pack cleaned up.

Requirements: every Ray node imports the same shardkit and reads the source: local paths at the
driver's paths (one machine, or a shared file system), or fsspec URLs (an object-store prefix or
URL rows: each task reads its own files, with reads in flight). A local ``OUT`` must be at the
driver's path on every node; an ``OUT`` in object storage (``wds``) needs nothing shared: each
task writes its shard in a staging folder of its own node and uploads it
(:mod:`shardkit.packer.outputs.remote`). Ray itself: ``pip install 'shardkit[ray]'``. Importing
this module does not import Ray.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Iterator, Sequence

from shardkit.errors import ConfigError, ShardkitError, SourceError

__all__ = ["ensure_ray", "run_ordered", "cluster_cpus", "MAX_RETRIES"]

logger = logging.getLogger("shardkit.ray")

MAX_RETRIES = 3
"""Retries of a task whose worker process (or node) died (Ray's ``max_retries``)."""


def ensure_ray(address: str | None = None):
    """The ``ray`` module, connected: the running Ray of this process if there is one, else
    ``ray.init(address)`` (``None``: ``RAY_ADDRESS`` if set, else a new local Ray using every
    CPU, never a cluster another process started here; it stays up for later packs and ends
    with the process, or ``ray.shutdown()``; a kill -9 of this process included: every process
    of that runtime is ended by :mod:`shardkit.ray.reaper`).

    Raises:
        ConfigError: Ray is not installed (names the extra to install).
    """
    try:
        import ray
    except ImportError:
        raise ConfigError("engine='ray' needs Ray: pip install 'shardkit[ray]' (or "
                          "'ray[data]')") from None
    if not ray.is_initialized():
        # "local": a new runtime, never one that another process left running on this machine
        # (plain ray.init() would join the last cluster started here)
        address = address or os.environ.get("RAY_ADDRESS") or "local"
        before = _children()
        context = ray.init(address=address, include_dashboard=False,
                           logging_level=logging.WARNING)
        if address == "local":  # a runtime started here ends with this process, kill -9 too
            from .reaper import start

            start(os.getpid(), context.address_info.get("session_dir"),
                  sorted(_children() - before))
        logger.info("connected to Ray at %s (%s CPUs)", address,
                    ray.cluster_resources().get("CPU"))
    elif address is not None:
        logger.info("Ray is already initialised in this process; ray_address=%s is not used",
                    address)
    return ray


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children()}


def cluster_cpus(ray) -> int:
    """The CPUs of the cluster ``ray`` (the connected module) is connected to, at least 1."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_ordered(remote_fn, args: Sequence[tuple], *, weights: Sequence[int] | None = None,
                bar=None, max_in_flight: int | None = None,
                describe: Callable[[int], str] = str) -> Iterator:
    """Runs ``remote_fn.remote(*args[i])`` for every ``i`` and yields the results in input
    order, each as soon as it and all before it are done; at most ``max_in_flight`` tasks are
    submitted at once (default: twice the cluster's CPUs). ``bar.update(weights[i])`` (default
    1) when task ``i`` finishes, in completion order.

    Raises:
        the task's own ShardkitError or OSError (unwrapped from Ray's RayTaskError);
        SourceError: a task whose worker died on every retry (``describe(i)`` names its input).
        On any error, and when the generator is closed early, the remaining tasks are
        cancelled and waited for before this returns.
    """
    import ray

    cap = max_in_flight or 2 * cluster_cpus(ray)
    done: dict[int, object] = {}
    pending: dict = {}  # ObjectRef -> input position
    submitted = emitted = 0
    try:
        while emitted < len(args):
            while submitted < len(args) and len(pending) < cap:
                pending[remote_fn.remote(*args[submitted])] = submitted
                submitted += 1
            if emitted not in done:
                ready, _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(ready[0])
                done[i] = _get(ray, ready[0], describe(i))
                if bar is not None:
                    bar.update(1 if weights is None else weights[i])
                continue
            yield done.pop(emitted)
            emitted += 1
    finally:
        if pending:  # an error, or closed early: no task may go on writing
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.wait(list(pending), num_returns=len(pending), timeout=30)


def _get(ray, ref, what: str):
    """``ray.get(ref)`` with the task's own error re-raised as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, (ShardkitError, OSError)):
            raise cause from None
        raise
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
            ray.exceptions.ObjectLostError) as e:
        raise SourceError(f"a Ray task died {MAX_RETRIES + 1} times ({what}): "
                          f"{type(e).__name__}; a file there may crash the decoder (rerun "
                          "with --engine local --workers 1 to pinpoint it)") from None
