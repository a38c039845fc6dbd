"""CPU and memory of the main process plus its DataLoader workers, sampled with psutil.

Memory is PSS (proportional set size, ``psutil.Process.memory_full_info().pss``): pages shared by
forked workers are divided between them, so summing over processes does not count the parent's
copy-on-write pages once per worker the way summed RSS does (case 16). USS is used where PSS is
unavailable, and RSS only as a last resort, named in ``memory_kind``.

CPU is the user+system time the processes used during the window divided by its wall time, in
cores (1.0 = one core busy); worker times are read while the workers are still alive.
"""
from __future__ import annotations

import threading
import time

import psutil

__all__ = ["ProcessMonitor"]


class ProcessMonitor:
    """Samples the calling process and all its descendants between :meth:`start` and :meth:`stop`.

    Args:
        interval: seconds between memory samples (> 0); each costs ~5-10 ms of CPU per process
            (it reads ``/proc/PID/smaps_rollup``). CPU times (~0.05 ms per process) are sampled
            5x as often, so a worker that exits at the end of an epoch loses little of its time.

    Raises:
        ConfigError: ``interval`` <= 0.
    """

    def __init__(self, interval: float = 0.25):
        from shardkit.errors import ConfigError

        if not interval > 0:
            raise ConfigError(f"monitor interval={interval!r}; expected seconds > 0")
        self.interval = float(interval)
        self.proc = psutil.Process()
        self._cpu0: dict[int, float] = {}
        self._cpu_last: dict[int, float] = {}
        self._mem_peak = 0.0
        self._mem_samples: list[float] = []
        self.memory_kind = "pss"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._sys0 = None

    def _procs(self) -> list[psutil.Process]:
        try:
            return [self.proc, *self.proc.children(recursive=True)]
        except psutil.Error:
            return [self.proc]

    def _memory(self, p: psutil.Process) -> float:
        try:
            info = p.memory_full_info()
        except psutil.AccessDenied:
            self.memory_kind = "rss"
            return float(p.memory_info().rss)
        for kind in ("pss", "uss"):
            value = getattr(info, kind, None)
            if value is not None:
                if kind != "pss":
                    self.memory_kind = kind
                return float(value)
        self.memory_kind = "rss"
        return float(info.rss)

    def sample(self, memory: bool = True) -> None:
        """Take one sample now (CPU times of every live process; memory sum when ``memory``)."""
        total = 0.0
        for p in self._procs():
            try:
                t = p.cpu_times()
                self._cpu_last[p.pid] = t.user + t.system
                if memory:
                    total += self._memory(p)
            except psutil.Error:  # a worker exited between listing and reading: last sample stays
                continue
        if memory:
            self._mem_samples.append(total)
            self._mem_peak = max(self._mem_peak, total)

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self.interval / 5.0):
            tick += 1
            self.sample(memory=tick % 5 == 0)

    def start(self) -> None:
        """Baseline CPU times of every live process and start background sampling."""
        self._cpu_last.clear()
        self._mem_samples.clear()
        self._mem_peak = 0.0
        self.sample(memory=True)
        self._cpu0 = dict(self._cpu_last)
        self._sys0 = psutil.cpu_times()
        self._t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="shardkit-bench-monitor",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> dict:
        """Stop sampling (call while the workers still live) and summarise the window.

        Returns:
            ``{"cpu_util_cores": float (>= 0), "cpu_util_percent": float (100 = all usable cores
            busy), "system_cpu_percent": float (whole machine, other users included),
            "memory_mb": float (peak of the per-sample sum, MiB), "memory_mb_mean": float,
            "memory_kind": "pss"|"uss"|"rss", "processes": int}``.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample(memory=True)
        wall = max(time.perf_counter() - self._t0, 1e-9)
        used = sum(v - self._cpu0.get(pid, 0.0) for pid, v in self._cpu_last.items())
        sys1 = psutil.cpu_times()
        busy = (sum(sys1) - sys1.idle - getattr(sys1, "iowait", 0.0)) - (
            sum(self._sys0) - self._sys0.idle - getattr(self._sys0, "iowait", 0.0))
        total = sum(sys1) - sum(self._sys0)
        try:
            import os
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = psutil.cpu_count() or 1
        mib = 1024.0 * 1024.0
        return {
            "cpu_util_cores": used / wall,
            "cpu_util_percent": 100.0 * used / wall / cores,
            "system_cpu_percent": 100.0 * busy / total if total > 0 else 0.0,
            "memory_mb": self._mem_peak / mib,
            "memory_mb_mean": (sum(self._mem_samples) / len(self._mem_samples) / mib
                               if self._mem_samples else 0.0),
            "memory_kind": self.memory_kind,
            "processes": len(self._cpu_last),
        }
