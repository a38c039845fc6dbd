"""Memory and room on this machine, as the decoded cache (:mod:`shardkit.stream.cache`) sees it.

- Room: :func:`available_memory` (``MemAvailable``), :func:`free_bytes` (a file system's free
  space), :func:`shm_reserve` (what a loader's batches may hold of ``/dev/shm``) and
  :func:`same_fs`: the inputs of ``cache="auto"`` and of the reserve a cache leaves free.
- Pages: :func:`tmpfs_huge`, whether a tmpfs gives its files 2 MiB pages (a RAM arena's fill
  then allocates a page per 2 MiB instead of per 4 KiB; ``benchmarks/README.md``, "Seventh
  pass").
- Use: :func:`arena_memory` (Linux ``/proc``), how each process maps an arena, for benchmarks
  and tests of the one-copy-per-machine property.
"""
from __future__ import annotations

import os

__all__ = ["arena_memory", "available_memory", "free_bytes", "same_fs", "shm_reserve",
           "tmpfs_huge"]

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


def available_memory() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def free_bytes(folder) -> int | None:
    """Free bytes (for an unprivileged user) of the file system holding ``folder``; None when
    unknown."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_reserve(backend: str, num_workers: int, prefetch_factor: int, batch_size: int,
                image_size: int) -> int:
    """Bytes of ``/dev/shm`` a loader's batch transport may hold at once, doubled: worker
    processes (``backend="process"``, ``num_workers > 0``) each keep ``prefetch_factor``
    batches in flight, every batch a shared-memory segment of ``batch_size x 3 x S x S`` bytes
    plus a page for each of its three small tensors, and the consumer holds a few more; times
    the local ranks (``$LOCAL_WORLD_SIZE``, default 1), which share the tmpfs. 0 for the thread
    backend or ``num_workers=0`` (batches in private memory). A cache leaves this plus
    :data:`shardkit.stream.cache.SHM_MARGIN` free."""
    if backend != "process" or num_workers == 0:
        return 0
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    batch = batch_size * 3 * image_size * image_size + 3 * 4096
    return 2 * num_workers * prefetch_factor * batch * local


def same_fs(a, b) -> bool:
    """Whether paths ``a`` and ``b`` lie on one file system (False when either is missing)."""
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False


def tmpfs_huge(folder, mountinfo: str | None = None, shmem_enabled: str | None = None
               ) -> str | None:
    """The huge-page mode of the tmpfs holding ``folder`` (Linux): ``"never"`` (base pages,
    the default of a tmpfs mounted without ``huge=``), ``"always"``, ``"within_size"`` or
    ``"advise"`` (its ``huge=`` mount option; ``"advise"`` gives huge pages only to mappings
    that ask with ``madvise``, and the arena's ``pwrite`` does not), as overridden by the
    system-wide ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` when that is ``force``
    (``"always"``) or ``deny`` (``"never"``). None when ``folder`` is missing, not on a tmpfs,
    or the mount table cannot be read. A ``huge=`` value of a newer kernel is returned as it
    is, never guessed. The mode is the mount's now: pages stored before a remount keep theirs.

    The mount is found by device number (``st_dev`` against the ``major:minor`` field of
    ``/proc/self/mountinfo``), so a bind mount or a symbolic link in ``folder`` finds its
    tmpfs. ``mountinfo`` and ``shmem_enabled`` stand in for those two files' text (tests).
    A tmpfs gets huge pages with, as root, ``mount -o remount,huge=within_size /dev/shm``.
    """
    try:
        st = os.stat(folder)
        if mountinfo is None:
            with open("/proc/self/mountinfo") as fh:
                mountinfo = fh.read()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    mode = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or fields[2] != dev or "-" not in fields[6:]:
            continue
        rest = fields[fields.index("-", 6) + 1:]  # fstype, source, super options
        if len(rest) < 3 or rest[0] != "tmpfs":
            return None
        options = dict(o.partition("=")[::2] for o in rest[2].split(","))
        mode = options.get("huge", "never")  # a value a newer kernel adds is passed on as is
    if mode is None:
        return None
    if shmem_enabled is None:
        try:
            with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as fh:
                shmem_enabled = fh.read()
        except OSError:
            shmem_enabled = ""
    chosen = shmem_enabled[shmem_enabled.find("[") + 1:shmem_enabled.find("]")] \
        if "[" in shmem_enabled else ""
    return {"force": "always", "deny": "never"}.get(chosen, mode)
