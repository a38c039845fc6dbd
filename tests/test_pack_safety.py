"""A pack never destroys what it did not write, and fails in one line (docs/RELIABILITY.md,
"Writing a dataset").

Real photos from examples/flowers-sample. Disk-full cases run on a real small tmpfs when this
process may mount one (root with CAP_SYS_ADMIN), and are skipped with that reason otherwise; the
same paths are also driven by an injected ENOSPC, which runs everywhere.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit import formats
import shardkit.packer.check as pack_check
import shardkit.packer.scan as pack_scan
from shardkit.errors import (
    ConfigError, DiskFullError, LabelError, OutputExistsError, OutputLockedError, SourceError)
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.packer.options import PackOptions
from shardkit.packer.run import pack
from shardkit.packer.cli import pack_command
from shardkit.dataset.swap import LOCK_NAME, STAGING_NAME
from shardkit.doctor.verify import verify

ROOT = Path(__file__).resolve().parents[1]
FORMATS = sorted(formats.FORMATS)


def photos(sample_dir: Path, per_class: int) -> list[Path]:
    return [p for c in sorted(d for d in sample_dir.iterdir() if d.is_dir())
            for p in sorted(c.glob("*.jpg"))[:per_class]]


def copy_tree(dst: Path, files: list[Path]) -> Path:
    """ImageFolder at ``dst`` with copies of ``files`` under their class folder names."""
    for p in files:
        (dst / p.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dst / p.parent.name / p.name)
    return dst


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def cli(*args) -> subprocess.CompletedProcess:
    """``python -m shardkit.cli -q ARGS`` in a real process (real exit code; stderr: warnings
    and errors only)."""
    return subprocess.run([sys.executable, "-m", "shardkit.cli", "-q", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def one_error_line(stderr: str, kind: str) -> str:
    """The single ``Error: <kind>: ...`` line that ``stderr`` must consist of."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {kind}: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(size, ro=False) -> Path``: a fresh tmpfs folder; skips when mounting is refused."""
    mounted = []

    def mount(size: str = "2m", ro: bool = False) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        opts = f"size={size}" + (",ro" if ro else "")
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                               capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("no mount command: the real full-disk case needs a small tmpfs")
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): the "
                        "real full-disk case needs root with CAP_SYS_ADMIN")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)  # lazy: open maps


# ------------------------------------------------------------------ only shardkit's own names
def test_leftovers_are_removed_by_name_and_the_users_files_stay(sample_dir, tmp_path):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 2))
    out = tmp_path / "out"
    mine = {"splits/fold0.txt": b"daisy/a.jpg\n", "shards/README.md": b"my notes",
            "notes.txt": b"keep", "shards/train-extra.tar": b"not a shard name"}
    leftovers = {"shards/train-000003.tar": b"old", "shards/.val-000000.tar.tmp": b"half",
                 "shards/.train-000001.lmdb.tmp.work": b"lmdb", "splits/test.jsonl": b"{}\n",
                 "splits/.val.jsonl.k2j3.tmp": b"", ".manifest.json.x9.tmp": b"{",
                 "quarantine.jsonl": b""}
    for rel, data in {**mine, **leftovers}.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    res = CliRunner().invoke(pack_command, [str(src), str(out), "--split", "train=1",
                                            "--no-progress"])
    assert res.exit_code == 0, res.output
    for rel, data in mine.items():
        assert (out / rel).read_bytes() == data, rel
    for rel in leftovers:
        if rel != "quarantine.jsonl":
            assert not (out / rel).exists(), rel
    removed = [".manifest.json.x9.tmp", "quarantine.jsonl", "splits/.val.jsonl.k2j3.tmp",
               "splits/test.jsonl", "shards/.train-000001.lmdb.tmp.work",
               "shards/.val-000000.tar.tmp", "shards/train-000003.tar"]
    assert sorted(removed) == sorted(load_summary_cleaned(res.output))
    assert verify(out).ok and not (out / LOCK_NAME).exists()


def load_summary_cleaned(text: str) -> list[str]:
    (line,) = [x for x in text.splitlines() if "removed from OUT before writing" in x]
    return line.split(": ", 1)[1].split(", ")


def test_source_inside_out_is_refused_and_left_intact(sample_dir, tmp_path):
    out = tmp_path / "out"
    src = copy_tree(out / "splits" / "src", photos(sample_dir, 2))
    before = tree_bytes(src)
    res = cli("pack", src, out, "--split", "train=1", "--no-progress")
    assert res.returncode == 2
    line = one_error_line(res.stderr, "ConfigError")
    assert f"source {src} lies inside the output folder {out}" in line
    assert tree_bytes(src) == before and sorted(os.listdir(out)) == ["splits"]
    with pytest.raises(ConfigError, match="lies inside the source"):  # and the other way round
        pack(src.parent, src.parent / "out", split={"train": 1.0}, progress=False)


# ------------------------------------------------------------------ one packer per OUT
_BLOCKING_PACK = """
import sys, time
from pathlib import Path
from shardkit import formats
from shardkit.cli import main
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
real = formats.ShardSink.add
def add(self, *a, **k):  # holds the run in its write phase until the test says go
    ready.touch()
    while not go.exists():
        time.sleep(0.02)
    return real(self, *a, **k)
formats.ShardSink.add = add
sys.argv = ["shardkit"] + sys.argv[3:]
main()
"""


@pytest.mark.parametrize("second", ["fresh", "overwrite"])
def test_a_second_packer_fails_naming_the_holder(sample_dir, tmp_path, second):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 3))
    out, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", _BLOCKING_PACK, ready, go, "pack", src, out, "--split", "train=1",
         "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.02)
        flags = ["--overwrite"] if second == "overwrite" else []
        res = cli("pack", src, out, "--split", "train=1", "--no-progress", *flags)
        assert res.returncode == 2
        line = one_error_line(res.stderr, "OutputLockedError")
        assert f"{out} is being packed by another run (pid {first.pid} on host " \
            f"{socket.gethostname()}, started 20" in line
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert verify(out).ok and load_manifest(out)["source"]["num_packed"] == 15
    assert not (out / LOCK_NAME).exists()


def test_the_lock_is_taken_before_the_scan_when_out_exists(sample_dir, tmp_path, monkeypatch):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 1))
    out = tmp_path / "out"
    out.mkdir()
    seen = []
    real = pack_scan.scan_source

    def scan(*a, **k):
        seen.append(json.loads((out / LOCK_NAME).read_text()))
        with pytest.raises(OutputLockedError, match=f"pid {os.getpid()} "):
            pack(src, out, split={"train": 1.0}, progress=False)
        return real(*a, **k)

    monkeypatch.setattr(pack_scan, "scan_source", scan)
    pack(src, out, split={"train": 1.0}, progress=False)
    assert seen[0]["pid"] == os.getpid() and seen[0]["host"] == socket.gethostname()
    assert sorted(os.listdir(out)) == ["manifest.json", "quarantine.jsonl", "shards", "splits"]


# ------------------------------------------------------------------ overwrite: build, then swap
_KILLED_PACK = """
import os, signal, sys
from shardkit import formats
from shardkit import pack
real, n = formats.ShardSink.add, [0]
def add(self, *a, **k):
    if n[0] == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
    n[0] += 1
    return real(self, *a, **k)
formats.ShardSink.add = add
pack(sys.argv[1], sys.argv[2], format="lmdb", split={"train": 1.0}, shard_samples=4,
     overwrite=True, progress=False)
"""


def test_overwrite_killed_mid_pack_keeps_the_old_dataset_then_swaps(sample_dir, tmp_path):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 3))
    out = tmp_path / "out"
    pack(src, out, format="wds", split={"train": 0.6, "val": 0.4}, shard_samples=2,
         progress=False)
    (out / "splits" / "fold0.txt").write_text("mine\n")
    (out / "shards" / "README.md").write_text("mine\n")
    old = tree_bytes(out)
    proc = subprocess.run([sys.executable, "-c", _KILLED_PACK, src, out, "9"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (out / STAGING_NAME / "shards" / "train-000001.lmdb").is_file()  # built beside
    assert {k: v for k, v in tree_bytes(out).items()
            if STAGING_NAME not in k.split("/") and k != LOCK_NAME} == old
    assert verify(out).ok and load_manifest(out)["format"] == "wds"

    summary = pack(src, out, format="lmdb", split={"train": 1.0}, shard_samples=4,
                   overwrite=True, progress=False)
    assert load_manifest(out)["format"] == "lmdb" and verify(out).ok
    assert sorted(os.listdir(out / "shards")) == [
        "README.md", "train-000000.lmdb", "train-000001.lmdb", "train-000002.lmdb",
        "train-000003.lmdb"]
    assert sorted(os.listdir(out / "splits")) == ["fold0.txt", "train.index.npz", "train.jsonl"]
    assert sorted(os.listdir(out)) == ["manifest.json", "quarantine.jsonl", "shards", "splits"]
    old_shards = sorted(k for k in old if k.endswith(".tar"))
    assert len(old_shards) == 8
    # every file of the old dataset was overwritten (same name) or removed; the user's kept
    assert sorted(summary.replaced) == sorted([
        "manifest.json", "quarantine.jsonl", "splits/train.jsonl", "splits/train.index.npz",
        "splits/val.jsonl", "splits/val.index.npz", *old_shards,
        # the other readers' files of the wds dataset (shardkit.interop)
        "shards/_info.json", *(s.replace(".tar", ".idx") for s in old_shards)])
    assert summary.cleaned == [f"{STAGING_NAME}/", f"shards/{STAGING_NAME}/",
                               f"splits/{STAGING_NAME}/"]  # the killed run's staging folder
    assert "replaced the previous dataset in OUT (23 of its files overwritten or removed)" in \
        summary.format_text()


def _fail_after(n: int, error: BaseException):
    real, calls = formats.ShardSink.add, []

    def add(self, *a, **k):
        if len(calls) == n:
            raise error
        calls.append(1)
        return real(self, *a, **k)

    return add


def test_overwrite_failing_with_enospc_keeps_the_old_dataset(sample_dir, tmp_path, monkeypatch):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 3))
    out = tmp_path / "out"
    pack(src, out, format="hdf5", split={"train": 1.0}, progress=False)
    old = tree_bytes(out)
    monkeypatch.setattr(formats.ShardSink, "add",
                        _fail_after(6, OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(DiskFullError) as err:
        pack(src, out, format="wds", split={"train": 1.0}, shard_samples=4, overwrite=True,
             progress=False)
    msg = str(err.value)
    assert msg.startswith(f"no space left on device while writing {out / STAGING_NAME}/shards/"
                          "train-000001.tar; ")
    assert "the previous dataset in OUT is unchanged" in msg
    assert err.value.errno == errno.ENOSPC and isinstance(err.value, OSError)
    assert tree_bytes(out) == old and verify(out).ok


# ------------------------------------------------------------------ a full disk, for real
@pytest.mark.parametrize("fmt", FORMATS)
def test_full_disk_names_the_file_and_leaves_nothing(sample_dir, tmp_path, tmpfs, fmt):
    disk = tmpfs("2m")
    src = copy_tree(tmp_path / "src", photos(sample_dir, 12))  # 60 photos, about 4 MB
    out = disk / "out"
    res = cli("pack", src, out, "--format", fmt, "--split", "train=1", "--shard-samples", "20",
              "--no-progress")
    assert res.returncode == 2
    line = one_error_line(res.stderr, "DiskFullError")
    assert line.startswith(f"Error: DiskFullError: no space left on device while writing {out}/")
    assert "nothing was kept" in line
    named = line.split("while writing ", 1)[1].split("; ", 1)[0]
    assert Path(named).name.startswith(("train-0000", ".train-0000", "quarantine", "train."))
    assert os.listdir(disk) == []  # no temp file, no shard, not even OUT


@pytest.mark.parametrize("fmt", FORMATS)
def test_full_disk_during_overwrite_keeps_the_old_dataset(sample_dir, tmp_path, tmpfs, fmt):
    disk = tmpfs("3m")
    out = disk / "out"
    pack(copy_tree(tmp_path / "small", photos(sample_dir, 2)), out, format=fmt,
         split={"train": 1.0}, progress=False)
    old = tree_bytes(out)
    with pytest.raises(DiskFullError, match="no space left on device while writing"):
        pack(copy_tree(tmp_path / "big", photos(sample_dir, 10)), out, format=fmt,
             split={"train": 1.0}, shard_samples=10, overwrite=True, progress=False)
    assert tree_bytes(out) == old and verify(out).ok
    assert sorted(os.listdir(out)) == ["manifest.json", "quarantine.jsonl", "shards", "splits"]


def test_enospc_without_a_file_name_gets_the_shard_name(sample_dir, tmp_path, monkeypatch):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 2))
    monkeypatch.setattr(formats.ShardSink, "add",
                        _fail_after(3, OSError(errno.ENOSPC, "No space left on device")))
    out = tmp_path / "out"
    with pytest.raises(DiskFullError) as err:
        pack(src, out, split={"train": 1.0}, shard_samples=2, progress=False)
    assert err.value.filename == str(out / "shards" / "train-000001.tar")
    assert not out.exists()


# ------------------------------------------------------------------ worker processes
def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


_NO_PRCTL = """
import ctypes, sys
import shardkit.storage.procs as procs
def refuse(*a, **k):
    raise OSError("no prctl here")
procs.ctypes = type("C", (), {"CDLL": staticmethod(refuse)})
from shardkit.cli import main
sys.argv = ["shardkit"] + sys.argv[1:]
main()
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("how", ["prctl", "poll"])
def test_sigkill_of_pack_ends_its_worker_processes(sample_dir, tmp_path, how):
    src = tmp_path / "src"
    for p in photos(sample_dir, 40):  # 200 photos, 5 links each: a check phase of seconds
        (src / p.parent.name).mkdir(parents=True, exist_ok=True)
        for k in range(5):
            (src / p.parent.name / f"{k}_{p.name}").symlink_to(p)
    args = ["pack", src, tmp_path / "out", "--workers", "2", "--split", "train=1",
            "--no-progress"]
    cmd = ([sys.executable, "-m", "shardkit.cli", *args] if how == "prctl" else
           [sys.executable, "-c", _NO_PRCTL, *args])
    proc = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no workers started"
            workers = _children(proc.pid)
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [w for w in workers if _running(w)]
    for w in alive:  # do not leak them into the rest of the suite
        os.kill(w, signal.SIGKILL)
    assert len(workers) == 2 and alive == []


# ------------------------------------------------------------------ nothing to pack
def test_a_source_where_nothing_can_be_packed_fails_without_a_manifest(sample_dir, tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "notes.txt").write_text("hello\n")
    (src / "a" / "readme.md").write_text("# hi\n")
    (src / "a" / "empty.jpg").write_bytes(b"")
    photo = photos(sample_dir, 1)[0].read_bytes()
    (src / "a" / "half.jpg").write_bytes(photo[: len(photo) // 2])
    res = cli("pack", src, tmp_path / "out", "--no-progress")
    assert res.returncode == 2
    line = one_error_line(res.stderr, "SourceError")
    assert f"nothing to pack in {src}: all 4 file(s) were rejected (not an image=2, empty " \
        "file=1, truncated JPEG=1); first: a/empty.jpg: empty file (0 bytes);" in line
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()  # an existing OUT is not written either
    with pytest.raises(SourceError, match="nothing to pack"):
        pack(src, tmp_path / "out", progress=False)
    assert os.listdir(tmp_path / "out") == []


# ------------------------------------------------------------------ OUT checked before decoding
@pytest.fixture
def no_decoding(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("files were decoded before the output folder was checked")

    monkeypatch.setattr(pack_check, "check_files", refuse)


def test_out_that_is_a_file_is_reported_before_decoding(sample_dir, tmp_path, no_decoding):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 1))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=f"output {tmp_path / 'file'} exists and is not a "
                                          "folder"):
        pack(src, tmp_path / "file", progress=False)
    with pytest.raises(ConfigError, match=f"{tmp_path / 'file'} is a file, not a folder"):
        pack(src, tmp_path / "file" / "out", progress=False)
    assert (tmp_path / "file").read_text() == "x"


def test_read_only_parent_is_reported_before_decoding(sample_dir, tmp_path, tmpfs, no_decoding):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 1))
    parent = tmpfs("1m", ro=True)
    with pytest.raises(ConfigError, match=rf"output {parent / 'out'} cannot be written: "
                                          rf"{parent} is not writable \(it is on a read-only "
                                          r"file system\)"):
        pack(src, parent / "out", progress=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits; the "
                    "read-only case is covered by the read-only tmpfs test")
def test_unwritable_parent_is_reported_before_decoding(sample_dir, tmp_path, no_decoding):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 1))
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)
    with pytest.raises(ConfigError, match=r"is not writable \(no write permission\)"):
        pack(src, parent / "out", progress=False)


# ------------------------------------------------------------------ smaller things
def test_summary_names_quarantine_and_counts_transcoding_rules(made_awkward_dir, tmp_path):
    src = tmp_path / "src" / "misc"
    src.mkdir(parents=True)
    for p in made_awkward_dir.iterdir():
        if p.name != "EXPECTED.csv":
            shutil.copyfile(p, src / p.name)
    out = tmp_path / "out"
    summary = pack(src.parent, out, split={"train": 1.0}, progress=False)
    records = read_split_records(out, "train")
    expected = dict(sorted(Counter(r["rule"] for r in records if r["rule"] != "original")
                           .items()))
    man = load_manifest(out)
    assert man["normalization"]["transcoded"] == summary.transcoded == expected
    assert expected["exif-transpose+png"] == 2 and expected["cmyk-to-rgb+png"] == 1
    assert expected["alpha-over-white+png"] == 4
    assert sum(expected.values()) == summary.num_packed - sum(r["rule"] == "original"
                                                               for r in records)
    text = summary.format_text()
    assert f"    rejected files, one reason each: {out / 'quarantine.jsonl'}" in text
    rules = ", ".join(f"{k}={v}" for k, v in expected.items())
    assert f"  transcoded: {sum(expected.values())} samples ({rules}); " in text
    assert "rules" in man["normalization"] and "max_pixels" in man["normalization"]


def test_metadata_paths_with_dot_slash_or_absolute_under_src_match(sample_dir, tmp_path):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 2))
    files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
    spell = [lambda r: r, lambda r: f"./{r}", lambda r: f"{src}/{r}"]
    meta = tmp_path / "meta.csv"
    meta.write_text("path,who\n" + "".join(f"{spell[i % 3](r)},g{i // 2}\n"
                                           for i, r in enumerate(files)))
    pack(src, tmp_path / "o", split={"train": 0.5, "val": 0.5}, metadata=meta,
         group_column="who", progress=False)
    man = load_manifest(tmp_path / "o")
    assert sorted(man["split"]["group_to_split"]) == sorted({f"g{i // 2}"
                                                             for i in range(len(files))})
    groups = {r["path"]: r["group"] for s in man["splits"] for r in
              read_split_records(tmp_path / "o", s)}
    assert groups == {r: f"g{i // 2}" for i, r in enumerate(files)}
    meta.write_text("path,who\n" + "".join(f"pics/{r},g\n" for r in files))
    with pytest.raises(SourceError) as err:
        pack(src, tmp_path / "o2", split={"train": 1.0}, metadata=meta, group_column="who",
             progress=False)
    assert f"The CSV's path 'pics/{files[0]}' matches no file; compare the file " \
        f"'{files[0]}' under {src}:" in str(err.value)


def test_unknown_split_names_warn_with_the_closest_name(sample_dir, tmp_path, caplog):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 2))
    with caplog.at_level(logging.WARNING, logger="shardkit.pack"):
        summary = pack(src, tmp_path / "o", split="Train=0.6,vali=0.4", progress=False)
    for name, close in (("Train", "train"), ("vali", "val")):
        w = (f"split name {name!r} is not one of ['train', 'val', 'test'] (did you mean "
             f"{close!r}?)")
        assert any(x.startswith(w) for x in summary.warnings), summary.warnings
        assert w in caplog.text
    assert PackOptions(split="train=0.5,holdout=0.5").warnings() == [
        "split name 'holdout' is not one of ['train', 'val', 'test']; `shardkit train` uses "
        "'train', 'val' and 'test' unless told otherwise (--train-split/--val-split/"
        "--test-split)"]
    assert PackOptions(split="train=0.8,val=0.1,test=0.1").warnings() == []


def test_shard_bytes_without_a_unit_warns(sample_dir, tmp_path):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 1))
    res = cli("pack", src, tmp_path / "o", "--split", "train=1", "--shard-bytes", "256",
              "--no-progress")
    assert res.returncode == 0, res.stderr
    note = ("shard_bytes '256' has no unit: read as 256 bytes per shard; did you mean 256MB or "
            "256MiB? (units: B, KB, MB, GB, KiB, MiB, GiB)")
    assert note in res.stderr and f"warning: {note}" in res.stdout
    assert len(load_manifest(tmp_path / "o")["splits"]["train"]["shards"]) == 5  # one each
    assert PackOptions(shard_bytes="64MB").warnings() == []
    assert PackOptions(shard_bytes=256).warnings() == []  # an int is bytes, said in code
    opts = PackOptions(shard_bytes="256")
    assert opts.replace(seed=3).warnings() == [note]
    assert opts.replace(shard_bytes="1GB").warnings() == []


def test_pack_warns_when_a_requested_split_ends_up_empty(sample_dir, tmp_path):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 1))
    summary = pack(src, tmp_path / "o", split="train=0.9,val=0.05,test=0.05", progress=False)
    man = load_manifest(tmp_path / "o")
    empty = [s for s in man["splits"] if man["splits"][s]["num_samples"] == 0]
    assert empty and sum(man["splits"][s]["num_samples"] for s in man["splits"]) == 5
    for s in empty:
        assert any(w.startswith(f"split {s!r} is empty") for w in summary.warnings)


def test_pack_errors_are_one_line_with_exit_code_2(sample_dir, tmp_path):
    src = copy_tree(tmp_path / "src", photos(sample_dir, 1))
    pack(src, tmp_path / "o", split={"train": 1.0}, progress=False)
    res = cli("pack", src, tmp_path / "o", "--no-progress")
    assert res.returncode == 2
    assert "already holds a packed dataset" in one_error_line(res.stderr, "OutputExistsError")
    bad = tmp_path / "labels.yaml"
    bad.write_bytes("classes: [daisy, caf\u00e9]\n".encode("latin-1"))
    res = cli("pack", src, tmp_path / "o2", "--labels", bad, "--no-progress")
    assert res.returncode == 2
    line = one_error_line(res.stderr, "LabelError")
    assert f"label map '{bad}' is not UTF-8 text (byte 0xe9 at offset 20)" in line
    with pytest.raises(LabelError, match="not UTF-8"):
        pack(src, tmp_path / "o3", labels=bad, progress=False)
    with pytest.raises(OutputExistsError):
        pack(src, tmp_path / "o", split={"train": 1.0}, progress=False)


def test_second_packer_fails_before_scanning_even_into_a_new_out(sample_dir, tmp_path,
                                                                 monkeypatch):
    """The first run creates and locks OUT before its scan, so a second run into the same new
    OUT fails at once, without scanning or decoding anything (a user found it waiting through
    the whole decode-check pass first)."""
    from shardkit.dataset.swap import LOCK_NAME
    from shardkit.errors import OutputLockedError
    from shardkit.packer.outputs import LocalOutput

    src = copy_tree(tmp_path / "src", photos(sample_dir, 2))
    out = tmp_path / "new" / "out"
    with LocalOutput(src, out, overwrite=False):  # the first run, before its scan
        assert (out / LOCK_NAME).is_file()

        def no_scan(*a, **k):
            raise AssertionError("the second run scanned the source")

        monkeypatch.setattr(pack_scan, "scan_source", no_scan)
        with pytest.raises(OutputLockedError, match=f"pid {os.getpid()}"):
            pack(src, out, format="wds", progress=False)
    assert not out.exists()  # the first run created OUT, wrote nothing, and removed it


# ------------------------------------------------------------------ the demo's --out
def test_demo_refuses_an_out_folder_it_did_not_write(tmp_path, capsys):
    from shardkit import demo

    mine = tmp_path / "photos"
    (mine / "2024").mkdir(parents=True)
    (mine / "2024" / "beach.jpg").write_bytes(b"my photo")
    (mine / "wds").mkdir()  # even an entry with a demo output's name
    before = tree_bytes(mine)
    with pytest.raises(SystemExit) as stop:
        demo.main(["--out", str(mine)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: ConfigError: --out {mine} is not empty "
                                               "and is not the folder of an earlier demo run")
    assert tree_bytes(mine) == before and (mine / "wds").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        demo.prepare_out(tmp_path / "file")


def test_demo_replaces_only_its_own_outputs(tmp_path):
    from shardkit import demo

    fresh = demo.prepare_out(tmp_path / "new" / "demo")  # created, with the marker
    assert sorted(os.listdir(fresh)) == [demo.MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sorted(os.listdir(demo.prepare_out(empty))) == [demo.MARKER]
    earlier = tmp_path / "earlier"  # an earlier demo run's folder, with a file of the user's
    demo.prepare_out(earlier)
    for name in demo.OUTPUTS:
        (earlier / name / "sub").mkdir(parents=True)
        (earlier / name / "sub" / "f").write_text("old output")
    (earlier / "notes.txt").write_text("mine")
    demo.prepare_out(earlier)
    assert sorted(os.listdir(earlier)) == sorted([demo.MARKER, "notes.txt"])
    assert (earlier / "notes.txt").read_text() == "mine"
