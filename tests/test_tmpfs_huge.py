"""shardkit.stream.memory.tmpfs_huge: the huge-page mode of the tmpfs a RAM arena lives on, read
from the mount table by device number (lines in the kernel's /proc/self/mountinfo format, the
other mounts copied from a real machine with unused device numbers), and reported by
``cache_stats()["huge_pages"]``."""
from __future__ import annotations

import os

import pytest

from shardkit.stream import make_loader
from shardkit.stream.memory import tmpfs_huge

SHMEM_NEVER = "always within_size advise [never] deny force\n"  # the kernel's default


def _dev(path) -> str:
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def _table(dev: str, fstype: str, options: str) -> str:
    """A mount table whose third mount is ``path``'s device, among real lines of other mounts."""
    return ("24 27 9998:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334076k,mode=755\n"
            "27 1 9998:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
            f"45 27 {dev} / /mnt/my\\040cache rw,relatime shared:7 - {fstype} tmpfs {options}\n")


@pytest.mark.parametrize("options,shmem,want", [
    ("rw,size=4194304k,huge=within_size", SHMEM_NEVER, "within_size"),
    ("rw,size=24683664k", SHMEM_NEVER, "never"),  # no huge= option: 4 KiB pages
    ("rw,huge=always,mode=1777", SHMEM_NEVER, "always"),
    ("rw,huge=advise", SHMEM_NEVER, "advise"),
    ("rw,size=24683664k", "always within_size advise never deny [force]\n", "always"),
    ("rw,huge=always", "always within_size advise never [deny] force\n", "never"),
    ("rw,huge=always", "", "always"),  # no sysfs file (older kernels): the mount option
    ("rw,huge=some_new_mode", SHMEM_NEVER, "some_new_mode"),  # not guessed as "never"
])
def test_the_mount_option_and_the_system_override(tmp_path, options, shmem, want):
    table = _table(_dev(tmp_path), "tmpfs", options)
    assert tmpfs_huge(tmp_path, mountinfo=table, shmem_enabled=shmem) == want


def test_not_a_tmpfs_no_mount_or_no_folder_is_none(tmp_path):
    dev = _dev(tmp_path)
    assert tmpfs_huge(tmp_path, _table(dev, "ext4", "rw,huge=always"), SHMEM_NEVER) is None
    assert tmpfs_huge(tmp_path, _table("9999:9999", "tmpfs", "rw,huge=always"),
                      SHMEM_NEVER) is None
    assert tmpfs_huge(tmp_path / "missing", _table(dev, "tmpfs", "rw"), SHMEM_NEVER) is None


def test_a_link_to_the_folder_finds_the_same_mount(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    table = _table(_dev(tmp_path / "real"), "tmpfs", "rw,huge=within_size")
    assert tmpfs_huge(tmp_path / "link", table, SHMEM_NEVER) == "within_size"


@pytest.mark.skipif(not os.path.exists("/proc/self/mountinfo"), reason="Linux mount table")
def test_this_machines_dev_shm_agrees_with_proc_mounts():
    """The live tables, parsed independently: /proc/mounts names each mount's options too."""
    rows = [line.split() for line in open("/proc/mounts")]
    shm = [r for r in rows if r[1] == "/dev/shm"]
    if not shm or shm[-1][2] != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here")
    options = dict(o.partition("=")[::2] for o in shm[-1][3].split(","))
    sysfs = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
    chosen = open(sysfs).read().split("[")[1].split("]")[0] if os.path.exists(sysfs) else ""
    want = {"force": "always", "deny": "never"}.get(chosen, options.get("huge", "never"))
    assert tmpfs_huge("/dev/shm") == want


def test_cache_stats_report_the_arenas_tmpfs(packed_sample, shm):
    with make_loader(packed_sample("wds"), "train", 16, cache="ram", num_workers=0) as loader:
        for _ in loader:
            break
        stats = loader.cache_stats()
    assert os.path.dirname(stats["path"]) == str(shm)
    assert stats["huge_pages"] == tmpfs_huge(shm)
    on_tmpfs = any(r.split()[1] == "/dev/shm" and r.split()[2] == "tmpfs"
                   for r in open("/proc/mounts")) and str(shm).startswith("/dev/shm/")
    assert (stats["huge_pages"] in ("never", "always", "within_size", "advise")) == on_tmpfs
