"""The Ray engine (README.md, "Scaling out on Ray"): ``pack --engine ray`` gives the local engine's
bytes, its tasks are retried, a dead driver leaves no manifest, a local runtime ends with its
driver (``shardkit.ray.read_split`` is tested in tests/test_ray_data.py).

One local Ray runtime (2 CPUs, no dashboard) serves the module; real data: the embedded
flowers sample (200 photos) plus awkward files made from one of them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")  # only for users without the extra: CI installs it

from click.testing import CliRunner  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from conftest import SAMPLE, make_awkward  # noqa: E402
from shardkit import pack  # noqa: E402
from shardkit import formats  # noqa: E402
import shardkit.packer.check as pack_check  # noqa: E402
import shardkit.packer.split as pack_split  # noqa: E402
from shardkit.errors import ManifestError, SourceError  # noqa: E402
from shardkit.packer import write as pack_write  # noqa: E402
from shardkit.packer.cli import pack_command  # noqa: E402
from shardkit.ray import engine  # noqa: E402
import shardkit.packer.engines as engines_mod  # noqa: E402
from shardkit.packer.engines import LocalEngine, RayEngine  # noqa: E402
from shardkit.stream.source import ShardSource  # noqa: E402

pytestmark = pytest.mark.ray

#: Awkward files added to the sample: rejects (quarantined) and files stored transcoded.
ADDED = {"daisy": ["truncated_half_photo.jpg", "cmyk_adobe.jpg"],
         "roses": ["corrupt_header.png", "exif_orientation_6.jpg", "png_rgba.png"]}


@pytest.fixture(scope="module", autouse=True)
def ray_runtime():
    # "local": our own runtime, not a cluster another test process left on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The flowers sample plus 2 rejects, 3 files stored transcoded and 2 ignored entries."""
    src = tmp_path_factory.mktemp("ray-src") / "flowers"
    shutil.copytree(SAMPLE, src)
    made = make_awkward()
    for cls, names in ADDED.items():
        for name in names:
            (src / cls / name).write_bytes(made[name])
    (src / "roses" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    return src


def _files(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _refuse(*_a, **_k):
    raise AssertionError("the local engine ran although engine='ray'")


# ----------------------------------------------------------------------------- shard ranges
@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), max_size=40),
       max_samples=st.one_of(st.none(), st.integers(1, 8)),
       max_bytes=st.one_of(st.none(), st.integers(1, 6000)))
def test_shard_ranges_are_the_sinks_rollover(tmp_path_factory, sizes, max_samples, max_bytes):
    out = tmp_path_factory.mktemp("ranges")
    sink = formats.ShardSink(out, "train", "wds", max_samples=max_samples, max_bytes=max_bytes)
    for n, size in enumerate(sizes):
        sink.add(f"train_{n:08d}", bytes(size), "jpg", 0)
    counts = [s["num_samples"] for s in sink.close()]
    ranges = pack_write.shard_ranges(sizes, max_samples, max_bytes)
    assert [b - a for a, b in ranges] == counts
    assert [a for a, _ in ranges] == np.cumsum([0] + counts)[:-1].tolist()


# ----------------------------------------------------------------------------- packing
@pytest.mark.parametrize("fmt, limits", [("wds", {"shard_bytes": "1MB"}),
                                         ("hdf5", {"shard_samples": 16}),
                                         ("wds", {})])  # the default shard plan
def test_pack_ray_is_byte_identical_to_local(tmp_path, source, monkeypatch, fmt, limits):
    local = pack(source, tmp_path / "local", format=fmt, progress=False, **limits)
    # the ray pack must not touch the local engine, nor check or write in the driver
    monkeypatch.setattr(LocalEngine, "check", _refuse)
    monkeypatch.setattr(LocalEngine, "write_splits", _refuse)
    monkeypatch.setattr(pack_check, "_check_one", _refuse)
    monkeypatch.setattr(pack_write, "write_shard", _refuse)
    remote = pack(source, tmp_path / "ray", format=fmt, progress=False, engine="ray", **limits)
    a, b = _files(tmp_path / "local"), _files(tmp_path / "ray")
    assert a == b  # manifest, splits/*.jsonl + .index.npz, quarantine, every shard
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert sum(len(s["shards"]) for s in manifest["splits"].values()) >= (10 if limits else 4)
    assert manifest["source"]["num_quarantined"] == 2 == local.num_quarantined
    assert manifest["normalization"]["transcoded"]  # stored bytes from the check task's data
    quarantined = {json.loads(line)["path"]
                   for line in (tmp_path / "ray" / "quarantine.jsonl").read_text().splitlines()}
    assert quarantined == {"daisy/truncated_half_photo.jpg", "roses/corrupt_header.png"}
    ignored = {e["path"] for e in manifest["source"]["ignored"]}
    assert {"LICENSE.txt", "metadata.csv", "roses/.DS_Store"} <= ignored
    assert remote.num_packed == local.num_packed == 203


def test_pack_ray_lmdb_same_records(tmp_path, source):
    """LMDB files differ between any two packs (free pages); records and values do not."""
    import lmdb

    pack(source, tmp_path / "local", format="lmdb", shard_samples=40, progress=False)
    pack(source, tmp_path / "ray", format="lmdb", shard_samples=40, progress=False,
         engine="ray")
    a, b = _files(tmp_path / "local"), _files(tmp_path / "ray")
    assert sorted(a) == sorted(b)
    assert {k: v for k, v in a.items() if not k.endswith((".lmdb", "manifest.json"))} == \
           {k: v for k, v in b.items() if not k.endswith((".lmdb", "manifest.json"))}
    ma, mb = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("local", "ray"))
    for m in (ma, mb):
        for s in m["splits"].values():
            for shard in s["shards"]:
                shard.pop("sha256"), shard.pop("bytes")
    assert ma == mb
    for name in a:
        if name.endswith(".lmdb"):
            items = []
            for d in ("local", "ray"):
                with lmdb.open(str(tmp_path / d / name), subdir=False, readonly=True,
                               lock=False) as env, env.begin() as txn:
                    items.append(list(txn.cursor()))
            assert items[0] == items[1] and len(items[0]) > 0


def test_pack_ray_csv_list_and_cli(tmp_path):
    """A CSV list (one row's file missing) through `shardkit pack --engine ray`."""
    rows = sorted((SAMPLE / "roses").glob("*.jpg"))[:12] + \
        sorted((SAMPLE / "tulips").glob("*.jpg"))[:12]
    lines = ["path,label"] + [f"{p},{p.parent.name}" for p in rows] + [f"{SAMPLE}/gone.jpg,roses"]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    args = [str(tmp_path / "list.csv"), "--shard-samples", "5", "--no-progress", "--seed", "7"]
    ok = CliRunner().invoke(pack_command, [args[0], str(tmp_path / "local"), *args[1:]])
    assert ok.exit_code == 0, ok.output
    res = CliRunner().invoke(pack_command, [args[0], str(tmp_path / "ray"), *args[1:],
                                            "--engine", "ray"])
    assert res.exit_code == 0, res.output
    assert _files(tmp_path / "local") == _files(tmp_path / "ray")
    q = (tmp_path / "ray" / "quarantine.jsonl").read_text()
    assert "gone.jpg" in q and "file not found" in q


def test_changed_source_file_raises_its_error_and_writes_nothing(tmp_path, source, monkeypatch):
    """A SourceError raised in a write task reaches the caller as itself; OUT is cleaned."""
    src = tmp_path / "src"
    shutil.copytree(source / "daisy", src / "daisy")
    shutil.copytree(source / "sunflowers", src / "sunflowers")
    victim = sorted((src / "daisy").glob("1*.jpg"))[0]
    plan_split = pack_split.plan_split

    def change_after_check(*a, **k):  # between step 3 (check) and step 6 (write)
        victim.write_bytes(victim.read_bytes()[:-10] + b"0123456789")
        return plan_split(*a, **k)

    monkeypatch.setattr(pack_split, "plan_split", change_after_check)
    with pytest.raises(SourceError, match="changed while packing") as info:
        pack(src, tmp_path / "out", engine="ray", progress=False, shard_samples=8)
    assert not isinstance(info.value, ray.exceptions.RayTaskError)
    assert victim.name in str(info.value)
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not list((tmp_path / "out").rglob("*.tar"))


def test_task_whose_worker_dies_is_retried(tmp_path):
    flag = str(tmp_path / "died")

    def die_once(x: int) -> int:  # defined here: pickled by value, the workers need no tests/
        if not os.path.exists(flag):
            Path(flag).touch()
            os._exit(1)  # the worker process dies mid-task
        return x * x

    def die_always(x: int) -> int:
        os._exit(1)

    task = ray.remote(max_retries=engine.MAX_RETRIES)(die_once)
    out = list(engine.run_ordered(task, [(x,) for x in range(6)], max_in_flight=1))
    assert out == [x * x for x in range(6)] and os.path.exists(flag)
    with pytest.raises(SourceError, match="died"):
        list(engine.run_ordered(ray.remote(max_retries=1)(die_always), [(1,)]))


def test_ray_engine_runs_the_public_worker_functions(tmp_path, source, monkeypatch):
    """The Ray tasks run check_chunk (one per batch) and write_shard (one per planned shard):
    spies pickled by value (defined here) leave a file per call, written in the workers."""
    calls = tmp_path / "calls"
    calls.mkdir()
    check_chunk, write_shard = pack_check.check_chunk, pack_write.write_shard

    def spy_check(jobs, concurrency):
        (calls / f"check-{jobs[0][1].replace('/', '_')}").write_text(str(len(jobs)))
        return check_chunk(jobs, concurrency)

    def spy_write(out, split, index, rows, *a, **k):
        (calls / f"write-{split}-{index}").write_text(str(os.getpid()))
        return write_shard(out, split, index, rows, *a, **k)

    made = []
    real = RayEngine.from_options.__func__

    def from_options(cls, options):  # the engine is chosen once, from the options
        made.append(options.engine)
        return real(cls, options)

    monkeypatch.setattr(RayEngine, "from_options", classmethod(from_options))
    monkeypatch.setattr(LocalEngine, "from_options", _refuse)
    monkeypatch.setattr(engines_mod, "check_chunk", spy_check)
    monkeypatch.setattr(engines_mod, "write_shard", spy_write)
    pack(source, tmp_path / "ray", shard_samples=40, progress=False, engine="ray")
    assert made == ["ray"]
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    checked = sum(int(p.read_text()) for p in calls.glob("check-*"))
    assert checked == manifest["source"]["num_files"] == 205  # every file, once
    written = {p.name for p in calls.glob("write-*")}
    assert written == {f"write-{name}-{k}" for name, split in manifest["splits"].items()
                       for k in range(len(split["shards"]))}
    assert str(os.getpid()) not in {p.read_text() for p in calls.glob("write-*")}  # workers


DRIVER = """
import sys, time
import shardkit.dataset.manifest as m
write = m.write_split_files
def slow(*a, **k):  # the first split's files are written, then the driver hangs
    write(*a, **k)
    open(sys.argv[3], "w").close()
    time.sleep(600)
m.write_split_files = slow
from shardkit import pack
pack(sys.argv[1], sys.argv[2], engine="ray", ray_address=sys.argv[4], shard_samples=16,
     progress=False)
"""


def test_killed_driver_leaves_no_manifest(tmp_path, source):
    out, flag = tmp_path / "out", tmp_path / "split-written"
    address = ray.get_runtime_context().gcs_address
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(source), str(out), str(flag),
                             address], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() else "timeout"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert list((out / "shards").glob("*.tar")) and (out / "splits").is_dir()
    assert not (out / "manifest.json").exists()  # visibly unfinished: readers refuse it
    with pytest.raises(ManifestError, match="not a finished"):
        ShardSource(out, "train")
    pack(source, out, engine="ray", shard_samples=16, progress=False)  # leftovers cleaned
    pack(source, tmp_path / "local", shard_samples=16, progress=False)
    assert _files(out) == _files(tmp_path / "local")


# ----------------------------------------------------------------------------- local runtime
LOCAL_DRIVER = r"""
import sys, psutil
from shardkit.ray.engine import ensure_ray
ensure_ray()
print(" ".join(str(p.pid) for p in psutil.Process().children(recursive=True)), flush=True)
sys.stdin.read()  # until killed
"""


def test_local_runtime_ends_with_a_killed_driver():
    """A local Ray runtime that shardkit started ends with its driver, kill -9 included: Ray
    itself left its dashboard and runtime-env agents running (seen 20 s later); the reaper
    (shardkit.ray.reaper) ends every process of that runtime within poll + grace seconds."""
    import psutil

    from shardkit.ray import reaper

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen([sys.executable, "-c", LOCAL_DRIVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.strip(), "the driver did not start Ray"
        started = []
        for pid in map(int, line.split()):
            try:
                p = psutil.Process(pid)
                started.append((p, " ".join(p.cmdline())))
            except psutil.NoSuchProcess:
                pass
        names = " ".join(cmd for _, cmd in started)
        assert "raylet" in names and "gcs_server" in names, names
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + reaper.POLL_S + reaper.GRACE_S + 10
        alive = started
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [(p, cmd) for p, cmd in alive
                     if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [cmd[:80] for _, cmd in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
