"""Shard readers at their edges: a bounded number of open shards, the OS running out of a
resource (never reported as damage), and damaged or crafted LMDB and HDF5 shard files (a named
error, never a signal or a traceback)."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

from shardkit.errors import ResourceLimitError, ShardCorruptError
from shardkit.formats import (FORMATS, close_all_shards, max_open_shards, open_reader,
                              open_shard_count)
from shardkit.formats.base import resource_error
from shardkit.formats.hdf5 import read_layout
from shardkit.formats.lmdb_format import check_structure
from shardkit.dataset.manifest import load_index, load_manifest, sample_checksum
from shardkit.stream import ShardDataset

ALL = sorted(FORMATS)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def many_shards(packed_sample):
    """Factory: the embedded sample packed with 2 samples per shard (71 train shards)."""
    return lambda fmt: packed_sample(fmt, shard_samples=2, near_duplicates="off")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _expected(out: Path, split: str = "train") -> dict[str, int]:
    """key -> xxh3 of the stored bytes as packed (the split index's checksums)."""
    index = load_index(out, split)
    return {index.key_at(i): int(index.xxh3[i]) for i in range(len(index))}


def _run(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SHARDKIT_MAX_OPEN_SHARDS", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


# --- a bounded table of open shards ----------------------------------------------------------

#: Runs in a fresh interpreter: ``argv[1]`` the RLIMIT_NOFILE to set (0: none), ``argv[2]`` a
#: JSON list of steps, each ``["loader", root, *policies]`` (two ShardDataset epochs per
#: ``on_error`` policy in shuffled order, then one in 2 DataLoader worker processes; the first
#: error ends the step and is returned), or the arguments of a ``shardkit``
#: command (run with click's CliRunner). Prints one JSON result per step.
STEPS = """
    import json, resource, sys
    limit = int(sys.argv[1])
    if limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    from click.testing import CliRunner
    from torch.utils.data import DataLoader
    from shardkit.cli import main
    from shardkit.formats import max_open_shards, open_shard_count
    from shardkit.stream import ShardDataset
    from shardkit.stream.options import SamplingOptions

    def loader(root, *policies):
        out = {"bound": max_open_shards(), "epochs": []}
        for on_error in policies:
            try:
                ds = ShardDataset(root, "train", decode=False, on_error=on_error,
                                  sampling=SamplingOptions(shuffle=True))
                for epoch in range(2):
                    ds.set_epoch(epoch)
                    keys = [s["key"] for s in ds]
                    out["epochs"].append([on_error, len(keys), len(set(keys)),
                                          len(ds.skipped), open_shard_count()])
            except Exception as e:
                return {"raised": type(e).__name__, "message": str(e)}
        ds = ShardDataset(root, "train", decode=False, on_error="skip", batch_size=4,
                          sampling=SamplingOptions(shuffle=True))
        keys = [s["key"] for s in DataLoader(ds, batch_size=None, num_workers=2, timeout=120)]
        out["workers"] = [len(keys), len(set(keys))]
        return out

    results = []
    for step in json.loads(sys.argv[2]):
        if step[0] == "loader":
            results.append(loader(*step[1:]))
            continue
        r = CliRunner().invoke(main, step)
        crash = r.exception if not isinstance(r.exception, (SystemExit, type(None))) else None
        results.append({"code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                        "crash": repr(crash) if crash else None})
    print(json.dumps(results))
"""


def _steps(limit: int, steps: list[list[str]]) -> list[dict]:
    """Runs :data:`STEPS` in a subprocess; asserts it ended without a signal or traceback."""
    res = _run(STEPS, str(limit), json.dumps(steps))
    assert res.returncode == 0, (res.returncode, res.stderr[-3000:])  # < 0: killed by a signal
    results = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(r.get("crash") is None for r in results), results
    return results


@pytest.mark.parametrize("fmt", ALL)
def test_every_sample_once_per_epoch_under_ulimit_64(fmt, many_shards, tmp_path):
    """71 shards, 64 file descriptors: every sample once per epoch with on_error skip and
    raise, in process and in two DataLoader workers, at most 16 shards open between reads;
    verify, stats and check pass."""
    out = _copy(many_shards(fmt), tmp_path / "ds")
    assert len(load_manifest(out)["splits"]["train"]["shards"]) >= 60
    n = len(_expected(out))
    got, verify, stats, check = _steps(64, [["loader", str(out), "skip", "raise"],
                                            ["verify", str(out)], ["stats", str(out)],
                                            ["check", str(out)]])
    assert got["bound"] == 16, got
    assert [e[:4] for e in got["epochs"]] == [["skip", n, n, 0], ["skip", n, n, 0],
                                              ["raise", n, n, 0], ["raise", n, n, 0]]
    assert all(e[4] <= 16 for e in got["epochs"])
    assert got["workers"] == [n, n]
    for result in (verify, stats, check):
        assert result["code"] == 0, result
        assert "Too many open files" not in result["stdout"] + result["stderr"]
    assert "OK (" in verify["stdout"]


@pytest.mark.parametrize("fmt", ALL)
def test_lru_keeps_the_bound_and_reads_back_exact_bytes(fmt, many_shards, monkeypatch):
    monkeypatch.setenv("SHARDKIT_MAX_OPEN_SHARDS", "3")
    assert max_open_shards() == 3
    out = many_shards(fmt)
    manifest, index, want = load_manifest(out), load_index(out, "train"), _expected(out)
    close_all_shards()
    readers = [open_reader(out, manifest, "train", s)
               for s in range(len(manifest["splits"]["train"]["shards"]))]
    for _ in range(2):  # the second pass reopens what the first closed
        for pos in range(len(index)):
            key = index.key_at(pos)
            data = readers[int(index.shard[pos])].read(key, int(index.offset[pos]),
                                                       int(index.size[pos]))
            assert sample_checksum(data) == want[key]
            assert open_shard_count() <= 3
    for r in readers:
        r.close()
    assert open_shard_count() == 0


@pytest.mark.parametrize("fmt", ALL)
def test_threads_sharing_a_table_of_two_never_read_a_closed_handle(fmt, many_shards,
                                                                    monkeypatch):
    """8 threads read random samples of 71 shards through one table of 2: every read returns
    the packed bytes (an evicted descriptor is never one a thread is reading)."""
    monkeypatch.setenv("SHARDKIT_MAX_OPEN_SHARDS", "2")
    out = many_shards(fmt)
    manifest, index, want = load_manifest(out), load_index(out, "train"), _expected(out)
    readers = [open_reader(out, manifest, "train", s)
               for s in range(len(manifest["splits"]["train"]["shards"]))]
    errors, done = [], []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for pos in rng.integers(0, len(index), 150).tolist():
                key = index.key_at(pos)
                data = readers[int(index.shard[pos])].read(key, int(index.offset[pos]),
                                                           int(index.size[pos]))
                assert sample_checksum(data) == want[key], key
            done.append(seed)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(done) == list(range(8))
    close_all_shards()


def test_a_handle_in_use_is_never_closed_by_eviction_or_close(many_shards, monkeypatch):
    """A read in flight keeps its descriptor: eviction passes it by, and close() closes it
    when that read ends (no thread ever preads a closed or reused descriptor)."""
    monkeypatch.setenv("SHARDKIT_MAX_OPEN_SHARDS", "1")
    out = many_shards("wds")
    manifest, index = load_manifest(out), load_index(out, "train")
    close_all_shards()
    readers = [open_reader(out, manifest, "train", s) for s in range(3)]
    fd, lease = readers[0]._acquire()  # a read of shard 0 in flight
    for s in (1, 2):  # each open evicts what it can: never shard 0
        pos = int(np.flatnonzero(index.shard == s)[0])
        readers[s].read(index.key_at(pos), int(index.offset[pos]), int(index.size[pos]))
    assert open_shard_count() == 2  # the bound of 1, plus the one in use
    os.fstat(fd)  # still open
    readers[0].close()
    os.fstat(fd)  # still open: its read has not ended
    readers[0]._release(lease)
    with pytest.raises(OSError):
        os.fstat(fd)
    assert open_shard_count() == 1
    close_all_shards()
    assert open_shard_count() == 0


# --- the OS out of a resource is never data damage -------------------------------------------

def _fail_shard_opens(monkeypatch, code=errno.EMFILE, times=None):
    """os.open of any shard file raises OSError(code) (``times`` times, None: always)."""
    real = os.open
    left = [times]

    def fake(path, flags, *args, **kwargs):
        if "/shards/" in os.fspath(path) and (left[0] is None or left[0] > 0):
            if left[0] is not None:
                left[0] -= 1
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake)


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_injected_emfile_is_a_resource_error_not_skipped(fmt, on_error, many_shards,
                                                         monkeypatch):
    out = many_shards(fmt)
    ds = ShardDataset(out, "train", decode=False, on_error=on_error)
    close_all_shards()
    _fail_shard_opens(monkeypatch)
    with pytest.raises(ResourceLimitError) as info:
        next(iter(ds))
    err = info.value
    assert not isinstance(err, ShardCorruptError) and err.errno == errno.EMFILE
    message = str(err)
    assert re.search(r"opening shard shards/train-\d{6}", message) and "RLIMIT_NOFILE" in message
    assert "ulimit -n" in message and "not data damage" in message
    assert ds.skipped == []


@pytest.mark.parametrize("fmt", ALL)
def test_one_emfile_is_retried_after_closing_unused_shards(fmt, many_shards, monkeypatch):
    out = many_shards(fmt)
    ds = ShardDataset(out, "train", decode=False)
    close_all_shards()
    _fail_shard_opens(monkeypatch, times=1)
    keys = [s["key"] for s in ds]
    assert sorted(keys) == sorted(_expected(out)) and ds.skipped == []


def test_lmdb_out_of_address_space_is_a_resource_error(many_shards, monkeypatch):
    import lmdb

    out = many_shards("lmdb")
    close_all_shards()

    def no_memory(path, **kwargs):
        raise lmdb.MemoryError(f"{path}: Cannot allocate memory")

    monkeypatch.setattr(lmdb, "open", no_memory)
    ds = ShardDataset(out, "train", decode=False, on_error="skip")
    with pytest.raises(ResourceLimitError, match=r"ENOMEM.*RLIMIT_AS") as info:
        next(iter(ds))
    assert info.value.errno == errno.ENOMEM and ds.skipped == []


def test_resource_errors_are_classified_by_errno():
    assert resource_error(OSError(errno.ENFILE, "x"), "w").errno == errno.ENFILE
    assert resource_error(OSError(errno.EAGAIN, "x"), "w").errno == errno.EAGAIN
    h5 = OSError("Unable to synchronously open file (errno = 24, error message = 'Too many')")
    assert resource_error(h5, "w").errno == errno.EMFILE
    for other in (OSError(errno.EIO, "x"), FileNotFoundError(2, "x"), ValueError("errno = 24"),
                  ShardCorruptError("x")):
        assert resource_error(other, "w") is None


# --- LMDB: the file's own structure, checked before it is mapped -----------------------------

def _truncate_lmdb(out: Path, match_manifest: bool, every: bool = False) -> list[str]:
    """Halves one train shard (every train shard with ``every``); ``match_manifest`` rewrites
    the manifest's bytes and sha256 of the halved shards to match. Returns their paths."""
    manifest = json.loads((out / "manifest.json").read_text())
    shards = manifest["splits"]["train"]["shards"]
    chosen = shards if every else [shards[3]]
    for rec in chosen:
        path = out / rec["path"]
        os.truncate(path, path.stat().st_size // 2)
        if match_manifest:
            rec["bytes"] = path.stat().st_size
            rec["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    return [rec["path"] for rec in chosen]


@pytest.mark.parametrize("match_manifest", [False, True], ids=["plain", "manifest-matched"])
def test_truncated_lmdb_shard_is_named_never_sigbus(match_manifest, many_shards, tmp_path):
    """verify exits 1 naming the shard; stats and check exit 2 with one Error line naming it;
    the loader raises ShardCorruptError naming it. The subprocess ends without a signal (on a
    SIGBUS the whole step list would end with returncode -7)."""
    out = _copy(many_shards("lmdb"), tmp_path / "ds")
    name = _truncate_lmdb(out, match_manifest)[0]
    verify, stats, check, loader = _steps(0, [["verify", str(out)], ["stats", str(out)],
                                              ["check", str(out)], ["loader", str(out), "raise"]])
    assert verify["code"] == 1 and name in verify["stdout"], verify
    if match_manifest:  # sizes and hashes agree, so only the file's own structure can tell
        assert "truncated LMDB file" in verify["stdout"]
    for result in (stats, check):
        assert result["code"] in (1, 2), result
        errors = [line for line in result["stderr"].splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and name in errors[0], result
        assert "Traceback" not in result["stderr"]
    assert loader["raised"] == "ShardCorruptError" and name in loader["message"], loader


def test_truncated_lmdb_shards_inspect_exits_with_one_error_line(many_shards, tmp_path):
    """Every train shard halved (inspect reads a few samples per class): one Error line."""
    out = _copy(many_shards("lmdb"), tmp_path / "ds")
    _truncate_lmdb(out, match_manifest=False, every=True)
    (res,) = _steps(0, [["inspect", str(out), "--out", str(tmp_path / "inspect")]])
    assert res["code"] in (1, 2), res
    errors = [line for line in res["stderr"].splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "truncated LMDB file" in errors[0], res
    assert "Traceback" not in res["stderr"]


def test_lmdb_structure_of_a_packed_shard(many_shards):
    out = many_shards("lmdb")
    path = out / load_manifest(out)["splits"]["train"]["shards"][0]["path"]
    head = check_structure(path)
    assert head.page_size == 4096 and head.entries == 2
    assert head.required_size == head.file_size == path.stat().st_size
    assert head.map_size >= head.required_size


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:100], "ends at byte 100, inside meta page 0"),
    (lambda b: b[:4096 + 50], "inside meta page 1"),
    (lambda b: b[:16] + b"\0\0\0\0" + b[20:], "not an LMDB meta page"),
    (lambda b: b[:20] + (7).to_bytes(4, "little") + b[24:], "data version 7"),
    (lambda b: b[:40] + (1000).to_bytes(4, "little") + b[44:], "page size 1000"),
    (lambda b: b[:len(b) - 4096], "truncated LMDB file"),
], ids=["short", "short-meta-1", "magic", "version", "page-size", "last-page"])
def test_lmdb_damaged_meta_pages_are_named(damage, message, many_shards, tmp_path):
    out = many_shards("lmdb")
    src = out / load_manifest(out)["splits"]["train"]["shards"][0]["path"]
    bad = tmp_path / "bad.lmdb"
    bad.write_bytes(damage(src.read_bytes()))
    with pytest.raises(ShardCorruptError, match=message) as info:
        check_structure(bad, "shards/bad.lmdb")
    assert "shards/bad.lmdb" in str(info.value)


# --- HDF5: every dataset's kind, dtype and shape, checked on open ----------------------------

def _hdf5_shard(many_shards) -> tuple[Path, Path, dict]:
    out = many_shards("hdf5")
    manifest = load_manifest(out)
    return out, out / manifest["splits"]["train"]["shards"][0]["path"], manifest


def _rewrite(src: Path, dst: Path, change) -> None:
    with h5py.File(src, "r") as f:
        fields = {k: f[k][:] for k in ("images", "offsets", "labels", "keys")}
        layout = f.attrs["shardkit_layout"]
    change(fields)
    with h5py.File(dst, "w") as f:
        f.attrs["shardkit_layout"] = layout
        for k, v in fields.items():
            if isinstance(v, str) and v == "group":
                f.create_group(k)
            elif v is not None:
                f.create_dataset(k, data=v)


def _set(field, value):
    def change(fields):
        fields[field] = value(fields[field]) if callable(value) else value
    return change


CRAFTED = [
    (_set("images", "group"), r"field 'images' is a Group, expected a dataset"),
    (_set("offsets", "group"), r"field 'offsets' is a Group, expected a dataset"),
    (_set("keys", None), r"field 'keys' is missing"),
    (_set("offsets", lambda o: np.array([str(v) for v in o], dtype="S12")),
     r"field 'offsets' has dtype \|S12, expected int64"),
    (_set("offsets", lambda o: o[:-1]), r"field 'offsets' has 2 entries, expected 3"),
    (_set("labels", lambda v: v[:1]), r"field 'labels' has 1 entries, expected 2"),
    (_set("images", lambda v: v.astype(np.float32)), r"field 'images' has dtype float32"),
    (_set("keys", lambda v: np.arange(len(v))), r"field 'keys' has dtype int64, expected fixed"),
    (_set("images", lambda v: v.reshape(1, -1)), r"field 'images' has shape \(1, \d+\)"),
    (_set("offsets", lambda o: o[::-1].copy()), r"field 'offsets' is not a valid table"),
    (_set("offsets", lambda o: o + 10 ** 9), r"field 'offsets' is not a valid table"),
]


@pytest.mark.parametrize("change, message", CRAFTED, ids=[
    "images-group", "offsets-group", "keys-missing", "offsets-strings", "offsets-short",
    "labels-short", "images-float", "keys-int", "images-2d", "offsets-reversed",
    "offsets-past-end"])
def test_crafted_hdf5_shard_names_shard_and_field(change, message, many_shards, tmp_path):
    out, src, manifest = _hdf5_shard(many_shards)
    ds = _copy(out, tmp_path / "ds")
    shard = ds / manifest["splits"]["train"]["shards"][0]["path"]
    _rewrite(src, shard, change)
    with pytest.raises(ShardCorruptError, match=message) as info:
        read_layout(shard, "shards/train-000000.h5")
    assert "shards/train-000000.h5" in str(info.value)
    index = load_index(ds, "train")
    reader = open_reader(ds, load_manifest(ds), "train", 0)
    pos = int(np.flatnonzero(index.shard == 0)[0])
    with pytest.raises(ShardCorruptError, match=message):
        reader.read(index.key_at(pos), int(index.offset[pos]), int(index.size[pos]))


def test_crafted_hdf5_shard_verify_exits_1_naming_it(many_shards, tmp_path):
    out, src, manifest = _hdf5_shard(many_shards)
    ds = _copy(out, tmp_path / "ds")
    rec = load_manifest(ds)["splits"]["train"]["shards"][0]
    shard = ds / rec["path"]
    _rewrite(src, shard, _set("images", "group"))
    full = json.loads((ds / "manifest.json").read_text())  # sizes and hash made to match
    full["splits"]["train"]["shards"][0].update(
        bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest())
    (ds / "manifest.json").write_text(json.dumps(full))
    from click.testing import CliRunner

    from shardkit.cli import main

    res = CliRunner().invoke(main, ["verify", str(ds)])
    assert res.exit_code == 1, (res.output, res.exception)
    assert "field 'images' is a Group" in res.stdout and rec["path"] in res.stdout
