"""A local Ray runtime that shardkit started ends with the process that started it.

``ray.init(address="local")`` starts the head's processes (``gcs_server``, ``raylet``, the log
monitor, ...) as children of the driver, and ``raylet`` starts the agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and idle workers. When the driver is killed
(``kill -9``, the OOM killer) Ray's own fate sharing ends the head processes within a second, but
the two agents were seen still running 20 s later: a runtime nobody will ever use again, holding
memory and ports.

:func:`start` runs this module as a small watchdog process (``python -m shardkit.ray.reaper
PID SESSION_DIR ROOT...``) in its own session, so a signal to the driver's process group does
not reach it first. Every :data:`POLL_S` seconds it records the processes under the Ray head's
processes (``ROOT``: the children that ``ray.init`` added to the driver), each as ``(pid,
create_time)`` so a recycled pid is never taken for one of them. When the driver is gone it
adds every process of this user, started after the driver, that holds a file open under the
runtime's own session folder (``SESSION_DIR``, unique to the runtime: each Ray process writes
its logs there; this finds an agent whose parent, ``raylet``, died before the last look), sends
``SIGTERM`` to each, ``SIGKILL`` after :data:`GRACE_S` seconds, and exits. On
a normal exit Ray's own ``atexit`` shutdown has already ended them and the watchdog finds
nothing to do. Only processes below Ray's head processes are ever signalled, never the driver's
other children (DataLoader workers, a user's subprocesses).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

__all__ = ["start", "POLL_S", "GRACE_S"]

POLL_S = 0.5
"""Seconds between two looks at the driver and at the Ray processes below the roots."""
GRACE_S = 3.0
"""Seconds between SIGTERM and SIGKILL for a Ray process left behind by a dead driver."""


def start(driver_pid: int, session_dir: str, roots: list[int]) -> None:
    """Starts the watchdog for the Ray runtime of ``driver_pid`` (its session folder
    ``session_dir``, head processes ``roots``); nothing when ``roots`` is empty (nothing was
    started here: a cluster that was joined is not ours to end).

    The watchdog is not left a child of the driver: the launched process forks it off and
    exits at once (the classic double fork), because Ray's raylet ends the child processes of a
    driver that died, and it would end the watchdog before its work.
    """
    if not roots or not session_dir:
        return
    subprocess.run([sys.executable, "-m", "shardkit.ray.reaper", str(driver_pid),
                    str(session_dir), *map(str, roots)], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   start_new_session=True, close_fds=True, check=False, timeout=60)


def _same(pid: int, created: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one created at ``created`` and not a zombie."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - created) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def _record(seen: dict[int, float], procs) -> None:
    for proc in procs:
        try:
            seen.setdefault(proc.pid, proc.create_time())
            for child in proc.children(recursive=True):
                seen.setdefault(child.pid, child.create_time())
        except psutil.Error:
            continue


def _holding_files_under(folder: str, since: float) -> list[psutil.Process]:
    """This user's processes started after ``since`` with a file open under ``folder``."""
    prefix, uid, found = os.path.join(folder, ""), os.getuid(), []
    for proc in psutil.process_iter(["uids", "create_time"]):
        try:
            if proc.info["uids"].real != uid or proc.info["create_time"] < since:
                continue
            if any(f.path.startswith(prefix) for f in proc.open_files()):
                found.append(proc)
        except (psutil.Error, TypeError, AttributeError):
            continue
    return found


def watch(driver_pid: int, session_dir: str, roots: list[int]) -> int:
    """The watchdog's loop (see the module docstring); returns how many processes it ended."""
    try:
        driver = psutil.Process(driver_pid)
        driver_created = driver.create_time()
    except psutil.Error:
        return 0
    seen: dict[int, float] = {}
    _record(seen, [p for p in map(_proc_or_none, roots) if p is not None])
    while _same(driver_pid, driver_created) is not None:
        _record(seen, [p for p in (_same(pid, t) for pid, t in list(seen.items()))
                       if p is not None])
        time.sleep(POLL_S)
    left = [p for p in (_same(pid, t) for pid, t in seen.items()) if p is not None]
    _record(seen, left + _holding_files_under(session_dir, driver_created))
    seen.pop(os.getpid(), None)
    left = [p for p in (_same(pid, t) for pid, t in seen.items()) if p is not None]
    for proc in left:
        _signal(proc, signal.SIGTERM)
    _, alive = psutil.wait_procs(left, timeout=GRACE_S)
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    return len(left)


def _proc_or_none(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


if __name__ == "__main__":
    if os.fork() > 0:  # the launcher returns to start() at once; the watchdog is orphaned
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the driver is not for us
    watch(int(sys.argv[1]), sys.argv[2], [int(a) for a in sys.argv[3:]])
    os._exit(0)
