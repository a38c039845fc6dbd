"""Process helpers: a child that dies with its parent, and whether a pid is alive."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def exit_with_parent(parent_pid: int) -> None:
    """Initializer of the check processes: they end when the packer (``parent_pid``) dies, even
    by SIGKILL, instead of waiting forever on the pool's queue.

    On Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (through ``ctypes``) has the kernel kill the
    worker when its parent exits; elsewhere, or if that call fails, a daemon thread polls every
    0.5 s and exits the worker once its parent changed or ``parent_pid`` is gone.
    """
    first_parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != first_parent or not pid_alive(parent_pid):
                    os._exit(1)  # the parent died before the prctl took effect
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid, first_parent), daemon=True,
                     name="shardkit-parent-watch").start()


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists on this machine (also when it is another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch_parent(parent_pid: int, first_parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != first_parent or not pid_alive(parent_pid):
            os._exit(1)


