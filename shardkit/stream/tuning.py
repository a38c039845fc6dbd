"""``num_workers="auto"`` / ``prefetch_factor="auto"``: how a loader picks its own concurrency.

The thread backend (default) tunes live, during the first batches of training: the tuner sets
how many threads build batches (``workers``, a pool of that size, at most
:attr:`AutoTuner.max_workers`) and how many batches are in flight (``workers x prefetch``). Per
batch consumed it records how long the consumer waited for it (``wait``), how long the consumer
kept it before asking for the next (``step``), how long the batch took to build (``build``) and
the builder's thread CPU time over it (``build_cpu``); every :attr:`AutoTuner.window` batches
(after letting the queue settle) it compares the window with the earlier ones:

- the consumer waited (more than :data:`WAIT_BOUND` of the window): the loader is the
  bottleneck, one more worker is tried while that still raises throughput by :data:`GAIN` and
  ``max_workers`` allows it. Past the CPU count, a thread is tried only while the builders
  spent less than :data:`ON_CPU` of their build time on a CPU (their own thread CPU time: they
  waited on reads, on the network, or for a CPU others hold) and the process does not keep the
  CPUs busy (:data:`BUSY`); builders that compute all the time would only share the CPUs with
  it;
- the consumer did not wait: fewer workers are tried when the measured build time says
  they keep up (``ceil(1.25 x build / step)``), which leaves cores to the training step;
- then it settles on the fewest workers within :data:`GAIN` of the best throughput seen, and
  picks ``prefetch`` so that the batches in flight cover the slowest build of that setting's
  window (``ceil(max build / step) + 1``, at least 2 per worker; 2 when the consumer waits
  anyway), within the memory bound
  (:func:`memory_budget`). It never measures or changes again.

Which samples a batch holds and its pixels depend only on ``(plan, b)``, never on how many
threads build it or how far ahead, so tuning changes no sample and no pixel. The plan's
``streams`` (block order, ``mode="exact"``) are fixed up front: the thread backend's
``max_workers`` (a function of the CPU count), whatever the tuner picks.

The process backend resolves ``"auto"`` once, up front (DataLoader worker processes are fixed
per iterator): ``min(CPUs, 16)`` workers within the memory bound and 2 batches in flight each;
``streams`` is that count. :class:`Tuning` says so in its ``reason``.

The decision logic (:meth:`AutoTuner.decide`) takes a :class:`Window` of measurements, so it is
tested with injected numbers and no clock.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError
from ..validate import is_int

__all__ = ["AUTO", "Tuning", "Window", "AutoTuner", "check_counts", "cpu_count",
           "memory_budget", "plan_tuning"]

AUTO = "auto"
#: The consumer waiting more than this fraction of a window's wall time means the loader is
#: the bottleneck.
WAIT_BOUND = 0.05
#: A setting must beat another's throughput by this fraction to count as better.
GAIN = 0.03
#: This process using this fraction of the CPUs (all threads) means they are busy: more
#: threads would only share them.
BUSY = 0.85
#: The builders spending at least this fraction of their build time on a CPU (thread CPU
#: time over wall time) compute all the time: at the CPU count, one more thread only
#: time-slices the CPUs with them. Measured side by side on 2 CPUs, fixed 3 or 4 threads gave
#: 1.00-1.04x of 2 with a fast consumer and with a 20 ms step: at most about :data:`GAIN`,
#: less than a trial's window can tell apart, for the cost of the trial (benchmarks/README.md
#: "Third pass").
ON_CPU = 0.85
#: The most threads the tuner picks, and the most worker processes "auto" starts.
MAX_WORKERS = 16
#: The most batches in flight per worker the tuner picks.
MAX_PREFETCH = 8


def check_counts(num_workers, prefetch_factor):
    """``(num_workers, prefetch_factor)`` checked: each an int or ``"auto"``; a None
    ``prefetch_factor`` is 2 (as ``DataLoader``, where it means "not given").

    Raises:
        ConfigError: ``num_workers`` not ``"auto"`` nor an int >= 0, ``prefetch_factor`` not
            ``"auto"`` nor an int >= 1 (bools refused; the message names the value).
    """
    if prefetch_factor is None:
        prefetch_factor = 2
    for name, value, minimum in (("num_workers", num_workers, 0),
                                 ("prefetch_factor", prefetch_factor, 1)):
        if value == AUTO:
            continue
        if not (is_int(value) and value >= minimum):
            raise ConfigError(f"{name}={value!r}: expected 'auto' or an int >= {minimum}")
    return (num_workers if num_workers == AUTO else int(num_workers),
            prefetch_factor if prefetch_factor == AUTO else int(prefetch_factor))


def cpu_count(cgroup: str = "/sys/fs/cgroup", environ=None) -> int:
    """CPUs this process may use, at least 1: ``os.sched_getaffinity`` (``os.cpu_count()``
    where the platform has no affinity), lowered to the container's CPU quota (cgroup v2
    ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, rounded up: a pod limited
    to 2 CPUs on a 64-core host sees 64 in its affinity) and shared among the ranks of this node
    (``LOCAL_WORLD_SIZE``, set by ``torchrun``) when their affinity is not already their own
    (it is still the whole machine's)."""
    environ = os.environ if environ is None else environ
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup)
    if quota is not None:
        cpus = min(cpus, quota)
    try:
        ranks = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        ranks = 1
    if ranks > 1 and cpus >= (os.cpu_count() or cpus) and quota is None:
        cpus //= ranks
    return max(1, cpus)


def _cgroup_quota(root: str) -> int | None:
    """CPUs of the cgroup quota at ``root`` (rounded up), or None for no quota / no cgroup."""
    for quota_file, period_file in ((("cpu.max",), None),
                                    (("cpu", "cpu.cfs_quota_us"), ("cpu", "cpu.cfs_period_us"))):
        try:
            text = open(os.path.join(root, *quota_file)).read().split()
            if period_file is None:
                quota, period = text[0], text[1]
            else:
                quota, period = text[0], open(os.path.join(root, *period_file)).read().strip()
            if quota in ("max", "-1"):
                return None
            return max(1, math.ceil(int(quota) / int(period)))
        except (OSError, ValueError, IndexError, ZeroDivisionError):
            continue
    return None


def memory_budget() -> int:
    """Bytes the batches in flight may hold: a tenth of ``MemAvailable`` (``/proc/meminfo``),
    between 256 MiB and 4 GiB; 1 GiB where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    return int(min(4 << 30, max(256 << 20, avail // 10)))
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


@dataclass
class Window:
    """Measurements over ``batches`` consecutive batches of one setting: seconds summed over
    them (``wait``: the consumer blocked on the batch; ``step``: the consumer held it before
    asking for the next; ``build``: building it, in its thread), ``max_build`` (the slowest
    build, s) and ``cpu`` (process CPU seconds over the window, all threads; None unknown)."""

    workers: int
    prefetch: int
    batches: int = 0
    wait: float = 0.0
    step: float = 0.0
    build: float = 0.0
    max_build: float = 0.0
    cpu: float | None = None
    build_cpu: float | None = None

    @property
    def wall(self) -> float:
        return self.wait + self.step

    @property
    def wait_fraction(self) -> float:
        return self.wait / self.wall if self.wall > 0 else 0.0

    @property
    def on_cpu(self) -> float | None:
        """The fraction of the builds' wall time their threads ran on a CPU (None unknown)."""
        if self.build_cpu is None or self.build <= 0:
            return None
        return self.build_cpu / self.build

    @property
    def rate(self) -> float:
        """Batches per second the consumer received."""
        return self.batches / self.wall if self.wall > 0 else 0.0

    def as_dict(self) -> dict:
        n = max(1, self.batches)
        return {"workers": self.workers, "prefetch": self.prefetch, "batches": self.batches,
                "batches_per_s": round(self.rate, 3),
                "wait_fraction": round(self.wait_fraction, 4),
                "wait_ms": round(1e3 * self.wait / n, 3), "step_ms": round(1e3 * self.step / n, 3),
                "build_ms": round(1e3 * self.build / n, 3),
                "max_build_ms": round(1e3 * self.max_build, 3),
                "cpu_util": None if self.cpu is None or self.wall <= 0
                else round(self.cpu / self.wall, 3),
                "build_on_cpu": None if self.on_cpu is None else round(self.on_cpu, 3)}


@dataclass
class Tuning:
    """A loader's ``num_workers`` / ``prefetch_factor`` and why (``loader.tuning``).

    Attributes:
        num_workers, prefetch_factor: the setting in use now (the final one once ``settled``).
        auto: which of the two were ``"auto"`` (``{"num_workers": bool, "prefetch_factor":
            bool}``). settled: False while the tuner is still measuring.
        reason: the decision in words. backend: ``"thread"`` or ``"process"``.
        cpus: :func:`cpu_count`; max_workers: the most workers the tuner may pick (the thread
            backend's ``num_workers``; the plan's ``streams`` in block order); memory:
            ``{"batch_bytes", "budget_bytes", "max_in_flight"}``; trials: each measured window
            (:meth:`Window.as_dict`), in order.
    """

    num_workers: int
    prefetch_factor: int
    backend: str = "thread"
    auto: dict = field(default_factory=lambda: {"num_workers": False, "prefetch_factor": False})
    settled: bool = True
    reason: str = ""
    cpus: int = 1
    max_workers: int = 0
    memory: dict = field(default_factory=dict)
    trials: list = field(default_factory=list)

    def as_dict(self) -> dict:
        """JSON-ready fields (metrics.json's ``tuning``)."""
        return asdict(self)


class AutoTuner:
    """Live tuning of the thread backend (see the module docstring). The backend calls
    :meth:`start_epoch` when an epoch's iteration starts and :meth:`observe` once per batch;
    it reads :attr:`workers` (threads allowed to build at once) and :meth:`depth` (batches in
    flight) before each submission. :attr:`tuning` is the public record.

    Args:
        cpus: CPUs available; max_workers: the most ``workers`` (the plan's streams in block
            order).
        batch_bytes: one batch's pixel buffer; budget_bytes: what the batches in flight may
            hold (:func:`memory_budget`).
        workers, prefetch: ints fix that one, None tunes it.
        window: batches per measured window; clock: process CPU seconds (injectable).
    """

    def __init__(self, cpus: int, max_workers: int, batch_bytes: int, budget_bytes: int, *,
                 workers: int | None = None, prefetch: int | None = None, window: int = 8,
                 clock=time.process_time):
        self.max_in_flight = max(1, budget_bytes // max(1, batch_bytes))
        self.max_workers = max(1, min(max_workers, self.max_in_flight))
        self.tune_workers, self.tune_prefetch = workers is None, prefetch is None
        #: the most batches ever in flight at once (the batch memory the backend may keep)
        self.most_in_flight = min(self.max_in_flight, self.max_workers * MAX_PREFETCH)
        self.workers = min(self.max_workers, cpus) if workers is None else workers
        self.prefetch = prefetch if prefetch is not None else \
            max(1, min(2, self.max_in_flight // max(1, self.workers)))
        self.window, self._clock, self.cpus = window, clock, cpus
        self.tuning = Tuning(
            self.workers, self.prefetch, "thread",
            {"num_workers": self.tune_workers, "prefetch_factor": self.tune_prefetch},
            settled=False, reason=f"measuring: it compares windows of {window} batches, "
            "then settles", cpus=cpus, max_workers=self.max_workers,
            memory={"batch_bytes": int(batch_bytes), "budget_bytes": int(budget_bytes),
                    "max_in_flight": int(self.max_in_flight)})
        self._skip = 0
        self._win: Window | None = None
        self._windows: list[Window] = []
        self._cpu0 = 0.0

    @property
    def settled(self) -> bool:
        return self.tuning.settled

    def depth(self) -> int:
        """Batches in flight allowed now: ``workers x prefetch``."""
        return self.workers * self.prefetch

    def start_epoch(self) -> None:
        """An iteration starts: the first batches (the queue filling) are not measured."""
        if not self.settled:
            self._begin(self.depth())

    def end_epoch(self) -> None:
        """An iteration ended (the epoch's last batch, or the caller stopped): while unsettled,
        the reason says how far measuring got; the next epoch goes on from there."""
        if self.settled:
            return
        t, w = self.tuning, self._win
        done = 0 if w is None else w.batches
        t.reason = (f"not settled yet: {len(self._windows)} window(s) of {self.window} batches "
                    f"measured and {done} batch(es) of the current one (at {self.workers} "
                    f"workers x prefetch {self.prefetch}); an epoch too short to finish one "
                    "goes on measuring in the next")

    def _begin(self, skip: int) -> None:
        # a new window of the current setting after ``skip`` (>= 1) unmeasured batches
        self._skip, self._win = max(1, skip), Window(self.workers, self.prefetch)

    def observe(self, wait: float, step: float, build: float,
                build_cpu: float | None = None) -> None:
        """One consumed batch: seconds the consumer waited for it, held it, it took to build
        and its builder's thread CPU seconds (None unknown). Decides at the end of each
        window."""
        if self.settled or self._win is None:
            return
        if self._skip > 0:
            self._skip -= 1
            if self._skip == 0:
                self._cpu0 = self._clock()
            return
        w = self._win
        w.batches += 1
        w.wait += wait
        w.step += step
        w.build += build
        w.max_build = max(w.max_build, build)
        if build_cpu is not None:
            w.build_cpu = (w.build_cpu or 0.0) + build_cpu
        if w.batches >= self.window:
            w.cpu = self._clock() - self._cpu0
            self.decide(w)

    def decide(self, win: Window) -> None:
        """Takes the measured window of the current setting: tries another number of workers,
        or settles (see the module docstring)."""
        t = self.tuning
        t.trials.append(win.as_dict())
        self._windows.append(win)
        nxt, why = self._next_workers(win) if self.tune_workers else (None, "")
        if nxt is not None:
            in_flight = self.depth()
            self.workers = nxt
            if self.tune_prefetch:  # within the memory bound at any count
                self.prefetch = max(1, min(self.prefetch,
                                           self.max_in_flight // max(1, self.workers)))
            t.num_workers, t.prefetch_factor = nxt, self.prefetch
            t.reason = f"trying {nxt} worker{'s' if nxt != 1 else ''}: {why}"
            # the batches in flight (the old depth, or the new one once it is deeper) were
            # started under the old setting and share the CPUs with the new builders:
            # measured from the first batch after them (a window right after the change
            # measured the transient: 2-16% below the setting before it, where fixed
            # settings ran alike)
            self._begin(max(2, in_flight, self.depth()))
            return
        self._settle(why)

    def _next_workers(self, win: Window) -> tuple[int | None, str]:
        """The worker count to try next and why, or ``(None, why settling)``."""
        tried = {w.workers: w for w in self._windows}
        prev = self._windows[-2] if len(self._windows) > 1 else None
        if prev is not None and prev.workers < win.workers and win.rate < prev.rate * (1 + GAIN):
            return None, (f"{win.workers} workers gave {win.rate:.2f} batches/s against "
                          f"{prev.rate:.2f} with {prev.workers}: no gain")
        if win.wait_fraction > WAIT_BOUND:
            nxt = win.workers + 1
            busy = win.cpu is not None and win.cpu >= BUSY * self.cpus * win.wall
            on_cpu = win.on_cpu
            if win.workers >= self.cpus and on_cpu is not None and on_cpu >= ON_CPU:
                return None, (f"the consumer waited {win.wait_fraction:.0%} of the time, but "
                              f"the {win.workers} builders were on a CPU {on_cpu:.0%} of "
                              f"their build time ({self.cpus} CPUs): a thread past the CPU "
                              "count would only share them")
            if busy and win.workers > self.cpus:
                return None, (f"the consumer waited {win.wait_fraction:.0%} of the time, but "
                              f"this process kept {win.cpu / win.wall:.1f} of {self.cpus} CPUs "
                              "busy: more threads cannot build faster")
            if nxt > self.max_workers:
                return None, (f"the consumer waited {win.wait_fraction:.0%} of the time at the "
                              f"most workers ({self.max_workers})")
            if nxt in tried:
                return None, f"the consumer waited; {nxt} workers were measured already"
            return nxt, f"the consumer waited {win.wait_fraction:.0%} of the time"
        need = max(1, math.ceil(1.25 * (win.build / max(1, win.batches))
                                / max(win.step / max(1, win.batches), 1e-6)))
        if need < win.workers and need not in tried:
            return need, (f"the consumer did not wait ({win.wait_fraction:.0%}); builds of "
                          f"{1e3 * win.build / win.batches:.0f} ms against steps of "
                          f"{1e3 * win.step / win.batches:.0f} ms need about {need}")
        return None, f"the consumer waited {win.wait_fraction:.0%} of the time"

    def _settle(self, why: str) -> None:
        """Settles on the fewest workers within GAIN of the best throughput, and a prefetch."""
        wins = self._windows
        best = max(w.rate for w in wins)
        pick = min((w for w in wins if w.rate >= best * (1 - GAIN)), key=lambda w: w.workers)
        self.workers = pick.workers
        pf_why = ""
        if self.tune_prefetch:
            step = pick.step / max(1, pick.batches)
            ahead = math.ceil(pick.max_build / max(step, 1e-6)) + 1
            if pick.wait_fraction <= WAIT_BOUND:
                pf = max(2, math.ceil(ahead / pick.workers))
                pf_why = (f"; prefetch: {ahead} batches ahead cover the slowest build "
                          f"({1e3 * pick.max_build:.0f} ms) at steps of {1e3 * step:.0f} ms")
            else:
                pf, pf_why = 2, "; prefetch 2: the consumer waits, deeper queues stay empty"
            self.prefetch = max(1, min(pf, MAX_PREFETCH,
                                       self.max_in_flight // max(1, self.workers)))
        t = self.tuning
        t.num_workers, t.prefetch_factor, t.settled = self.workers, self.prefetch, True
        t.reason = (f"settled on {self.workers} workers x prefetch {self.prefetch} "
                    f"({pick.rate:.2f} batches/s, consumer waiting {pick.wait_fraction:.0%})"
                    + (f"; {why}" if why else "") + pf_why)


def plan_tuning(backend: str, num_workers, prefetch_factor, batch_size: int, image_size: int,
                *, cpus: int | None = None, budget: int | None = None):
    """How a loader's counts are resolved: ``(num_workers, prefetch, streams, tuner, tuning)``.

    - no ``"auto"``: the counts as given, ``streams = num_workers``, no tuner;
    - thread backend: at most ``max_workers = min(16, max(2, 2 x CPUs))`` threads (within
      the memory bound), ``streams = max_workers``, an :class:`AutoTuner` (None when
      ``num_workers`` is an int 0: nothing to tune);
    - process backend: resolved now: ``min(CPUs, 16)`` workers within the memory bound,
      prefetch 2.

    ``tuning`` is the :class:`Tuning` record (the tuner's own when there is one).
    """
    cpus = cpu_count() if cpus is None else cpus
    budget = memory_budget() if budget is None else budget
    batch_bytes = batch_size * 3 * image_size * image_size
    auto = {"num_workers": num_workers == AUTO, "prefetch_factor": prefetch_factor == AUTO}
    mem = {"batch_bytes": batch_bytes, "budget_bytes": budget,
           "max_in_flight": max(1, budget // batch_bytes)}
    if not any(auto.values()) or (backend == "thread" and num_workers == 0):
        pf = 2 if prefetch_factor == AUTO else prefetch_factor
        return num_workers, pf, num_workers, None, Tuning(
            num_workers, pf, backend, auto, reason="given" if not any(auto.values()) else
            "num_workers=0: batches are built in the consumer; prefetch does not apply",
            cpus=cpus, max_workers=num_workers, memory=mem)
    if backend == "thread":
        top = min(MAX_WORKERS, max(2, 2 * cpus))
        tuner = AutoTuner(cpus, top, batch_bytes, budget,
                          workers=None if auto["num_workers"] else num_workers,
                          prefetch=None if auto["prefetch_factor"] else prefetch_factor)
        pool = tuner.max_workers if auto["num_workers"] else num_workers
        return pool, tuner.prefetch, pool, tuner, tuner.tuning
    nw = min(cpus, MAX_WORKERS, mem["max_in_flight"]) if auto["num_workers"] else num_workers
    pf = max(1, min(2, mem["max_in_flight"] // max(1, nw))) if auto["prefetch_factor"] \
        else prefetch_factor
    return nw, pf, nw, None, Tuning(
        nw, pf, backend, auto, reason=(
            f"process backend: resolved up front (DataLoader workers are fixed per iterator): "
            f"{nw} workers for {cpus} CPUs, prefetch {pf}, within {budget >> 20} MiB of "
            "batches in flight"), cpus=cpus, max_workers=nw, memory=mem)
