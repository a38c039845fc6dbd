"""Memory of a decoded cache's arena as each process maps it: :func:`arena_memory` (Linux
``/proc``), for benchmarks and tests of the one-copy-per-machine property of
:mod:`shardkit.stream.cache`."""
from __future__ import annotations

__all__ = ["arena_memory"]

_SMAPS_FIELDS = {"Rss": "rss", "Pss": "pss", "Shared_Clean": "shared", "Shared_Dirty": "shared",
                 "Private_Clean": "private", "Private_Dirty": "private", "Anonymous": "anonymous"}


def arena_memory(path: str, pids) -> dict:
    """Memory of the arena file ``path`` as mapped by each process in ``pids`` (Linux only),
    from ``/proc/PID/smaps`` (the arena's mapping) and ``/proc/PID/smaps_rollup`` (the whole
    process). All values in bytes.

    PSS (proportional set size) divides each resident page by the number of processes that map
    it, so ``sum_pss`` over the processes counts a shared arena once, while ``sum_rss`` counts it
    once per process that touched it. ``shared`` / ``private``: resident pages mapped by several
    processes / by this one only (the kernel's meaning: a private page is not a copy);
    ``anonymous`` > 0 would mean copies (copy-on-write) of the arena's pages.

    Returns:
        ``{"pids": {pid: {"rss", "pss", "shared", "private", "anonymous", "total_pss"}},
        "sum_rss", "sum_pss", "sum_anonymous", "sum_total_pss"}``; a process that has exited or
        does not map the arena counts 0 for it.
    """
    per = {}
    for pid in pids:
        row = {"rss": 0, "pss": 0, "shared": 0, "private": 0, "anonymous": 0, "total_pss": 0}
        try:
            with open(f"/proc/{pid}/smaps") as fh:
                inside = False
                for line in fh:
                    head = line.split(None, 1)[0]
                    if not head.endswith(":"):  # a mapping's first line: "start-end perms ..."
                        inside = line.rstrip("\n").endswith(path) or \
                            line.rstrip("\n").endswith(path + " (deleted)")
                    elif inside and head[:-1] in _SMAPS_FIELDS:
                        row[_SMAPS_FIELDS[head[:-1]]] += int(line.split()[1]) * 1024
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        row["total_pss"] = int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
        per[int(pid)] = row
    return {"pids": per, **{f"sum_{k}": sum(r[k] for r in per.values())
                            for k in ("rss", "pss", "anonymous", "total_pss")}}
