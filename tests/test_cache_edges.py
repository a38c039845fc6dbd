"""Edges of the decoded cache on the embedded flowers sample (140 train photos): a small
/dev/shm (the cache leaves room for the worker processes' batches and an epoch is never short),
a run that exits without ``close()`` (no arena left behind), cache files that are not ours
(another user's, writable by others, a symbolic link: never read), and damaged or crafted disk
caches (rebuilt; the served pixels are always the packed ones). Both backends."""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from shardkit.errors import LoaderError
from shardkit.dataset.manifest import read_split_records, sample_checksum
from shardkit.stream import WorkerOptions, make_loader
from shardkit.stream import arena as arena_mod
from shardkit.stream import cache as cache_mod
from shardkit.stream.cache import SHM_DIR_ENV, SHM_MARGIN, shm_reserve
from shardkit.stream.datasets import BatchDataset

BATCH = 32
N = 140  # train samples of the packed sample
BACKENDS = ["thread", "process"]


@pytest.fixture(scope="module")
def root(packed_sample) -> Path:
    return packed_sample("wds")


def _epoch(root, backend: str, epoch: int = 0, **kw):
    """``([(images, labels, positions)] of one epoch, cache_stats)``."""
    with make_loader(root, "train", BATCH, num_workers=2, return_meta=True,
                     workers=WorkerOptions(backend=backend), **kw) as loader:
        loader.set_epoch(epoch)
        out = [(x.clone(), y.clone(), m["index"].clone()) for x, y, m in loader]
        return out, loader.cache_stats()


@pytest.fixture(scope="module")
def plain(root) -> dict:
    """The uncached batches of epochs 0 and 1 (both backends yield the same)."""
    return {e: _epoch(root, "thread", e)[0] for e in (0, 1)}


def _assert_whole_and_same(got, want) -> None:
    """Every sample exactly once, and the same batches (pixels, labels, order) as ``want``."""
    positions = torch.cat([i for _, _, i in got]).tolist()
    assert sorted(positions) == list(range(N))
    assert len(got) == len(want)
    for (x, y, i), (px, py, pi) in zip(got, want):
        assert i.equal(pi) and y.equal(py) and x.equal(px)


def _split_bytes(root) -> int:
    return sum(r["width"] * r["height"] * 3 for r in read_split_records(root, "train"))


# --- a small /dev/shm ----------------------------------------------------------------------

def test_shm_reserve_is_the_stated_rule(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    batch = 64 * 3 * 224 * 224 + 3 * 4096
    assert shm_reserve("process", 4, 2, 64, 224) == 2 * 4 * 2 * batch
    assert shm_reserve("thread", 4, 2, 64, 224) == 0  # batches in private memory
    assert shm_reserve("process", 0, 2, 64, 224) == 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # torchrun: 8 ranks share the tmpfs
    assert shm_reserve("process", 4, 2, 64, 224) == 8 * 2 * 4 * 2 * batch


@pytest.mark.parametrize("backend", BACKENDS)
def test_filling_stops_at_the_reserve_and_the_epoch_stays_whole(root, shm, plain, backend,
                                                                 monkeypatch, caplog):
    """An injected tmpfs of ROOM + reserve bytes (its free space shrinks as the arena's pages
    are allocated): filling stops before the reserve is touched, once for every process, and
    both epochs are exactly the uncached ones."""
    same_fs = os.stat(shm).st_dev == os.stat("/dev/shm").st_dev if Path("/dev/shm").is_dir() \
        else False
    reserve = SHM_MARGIN + (shm_reserve(backend, 2, 2, BATCH, 224) if same_fs else 0)
    room = arena_mod.table_layout(N)[1] + _split_bytes(root) // 3

    def free_bytes(folder):
        used = sum(p.stat().st_blocks * 512 for p in Path(folder).iterdir())
        return room + reserve - used

    monkeypatch.setattr(cache_mod, "free_bytes", free_bytes)  # forked workers inherit it
    path = None
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        with make_loader(root, "train", BATCH, num_workers=2, return_meta=True, cache="ram",
                         workers=WorkerOptions(backend=backend)) as loader:
            path = Path(loader.cache.path)
            epochs = []
            for e in (0, 1):
                loader.set_epoch(e)
                epochs.append([(x.clone(), y.clone(), m["index"].clone())
                               for x, y, m in loader])
            used = path.stat().st_blocks * 512
            stats = loader.cache_stats()
    for e in (0, 1):
        _assert_whole_and_same(epochs[e], plain[e])
    biggest = max(r["width"] * r["height"] * 3 for r in read_split_records(root, "train"))
    assert used <= room + biggest  # two workers may each store one slot past the check
    assert 0 < stats["filled_samples"] < N
    assert stats["disabled"].startswith("filling stopped at")
    assert stats["hits"] == stats["filled_samples"]  # epoch 1 served what epoch 0 cached
    assert stats["misses"] == 2 * N - stats["filled_samples"]
    if backend == "thread":  # (worker processes log in their own process)
        assert caplog.text.count("filling stopped") == 1
    assert list(shm.iterdir()) == []


def _unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True)
    return probe.returncode == 0


_SMALL_SHM = textwrap.dedent("""
    import hashlib, json, logging, sys
    logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s %(message)s")
    from shardkit.stream import WorkerOptions, make_loader
    root, configs = sys.argv[1], json.loads(sys.argv[2])
    for backend, cache in configs:
        print("=== " + backend + " " + cache, file=sys.stderr, flush=True)
        res = []
        with make_loader(root, "train", 32, num_workers=2, cache=cache, return_meta=True,
                         workers=WorkerOptions(backend=backend, timeout=60)) as loader:
            for e in (0, 1):
                loader.set_epoch(e)
                h, positions = hashlib.sha256(), []
                for x, y, m in loader:
                    h.update(x.contiguous().numpy().tobytes())
                    h.update(y.numpy().tobytes())
                    positions += m["index"].tolist()
                res.append([positions, h.hexdigest()])
            stats = loader.cache_stats()
        print(json.dumps({"backend": backend, "cache": cache, "epochs": res,
                          "filled": stats and stats["filled_samples"]}), flush=True)
""")


@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare -m (a private tmpfs "
                    "mounted on /dev/shm); the injected-limit test above covers the rule")
@pytest.mark.parametrize("size,configs", [
    ("32m", [[b, c] for b in BACKENDS for c in ("none", "ram", "auto")]),
    ("80m", [["process", "none"], ["process", "ram"]]),  # the arena takes part of the tmpfs
])
def test_small_dev_shm_epochs_are_whole_with_one_warning(root, size, configs):
    """A real 32 MB (and 80 MB) /dev/shm in a private mount namespace, as Docker's 64 MB
    default: each epoch yields every sample exactly once, with the uncached pixels; a cached
    loader that falls back logs one warning (all processes together), never a traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop(SHM_DIR_ENV, None)
    cmd = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} -c "
           f"\"$SCRIPT\" {root} '{json.dumps(configs)}'")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True,
                          env={**env, "SCRIPT": _SMALL_SHM}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [[r["backend"], r["cache"]] for r in runs] == configs
    logs = dict(zip((tuple(c) for c in configs), proc.stderr.split("=== ")[1:]))
    reference = {r["backend"]: r["epochs"] for r in runs if r["cache"] == "none"}
    for r in runs:
        for (positions, digest), (_, want) in zip(r["epochs"], reference[r["backend"]]):
            assert sorted(positions) == list(range(N))
            assert digest == want  # the uncached pixels and labels, in the same order
        warnings = [ln for ln in logs[(r["backend"], r["cache"])].splitlines()
                    if ln.startswith("LOG WARNING shardkit.stream.cache")]
        assert len(warnings) == (0 if r["cache"] == "none" else 1), warnings
    if size == "80m":  # part cached, the rest decoded: still one warning for two workers
        assert 0 < runs[1]["filled"] < N


def _drop(which):
    """A ``BatchDataset.build`` that makes one batch of one worker unpicklable, so that the
    DataLoader's queue feeder thread drops it (as it drops a batch it cannot move into a full
    /dev/shm): which = (worker id, its k-th batch)."""
    real = BatchDataset.build
    seen = {"k": -1}

    def build(self, plan, b, **kw):
        batch = real(self, plan, b, **kw)
        seen["k"] += 1
        if (torch.utils.data.get_worker_info().id, seen["k"]) == which:
            batch[2]["unpicklable"] = lambda: None
        return batch

    return build


@pytest.mark.parametrize("which,lost", [((1, 1), 3), ((0, 2), 4)])
def test_a_batch_lost_between_worker_and_consumer_raises(root, monkeypatch, which, lost):
    """5 batches, worker 0 builds 0, 2, 4 and worker 1 builds 1, 3: a lost batch 3 (torch then
    skips it once worker 1 is done) or a lost last batch is an error, not a short epoch."""
    monkeypatch.setattr(BatchDataset, "build", _drop(which))  # forked workers inherit it
    got = []
    with make_loader(root, "train", BATCH, num_workers=2, return_meta=True,
                     workers=WorkerOptions(backend="process", multiprocessing_context="fork",
                                           timeout=60)) as loader:
        with pytest.raises(LoaderError, match="short") as err:
            for _, y, m in loader:
                got.append(m["index"])
    assert len(got) == min(lost, 4)
    assert (f"batch {lost} of the epoch never arrived" if lost < 4 else "1 lost") in str(
        err.value)


def test_no_shared_memory_for_a_batch_is_one_clear_error(root, monkeypatch):
    """torch cannot move a batch's tensor into a full /dev/shm: one LoaderError that says so,
    raised from the worker (not a batch silently dropped by the queue's feeder thread)."""
    def share_memory_(self):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2_3>: No "
                           "space left on device (28)")

    with make_loader(root, "train", BATCH, num_workers=2,
                     workers=WorkerOptions(backend="process", multiprocessing_context="fork",
                                           timeout=60)) as loader:
        monkeypatch.setattr(torch.Tensor, "share_memory_", share_memory_)  # in the workers too
        with pytest.raises(LoaderError, match="could not allocate shared memory") as err:
            next(iter(loader))
    assert "/dev/shm" in str(err.value) and "--shm-size" in str(err.value)


# --- a run that exits without close() ------------------------------------------------------

_NO_CLOSE = textwrap.dedent("""
    import sys
    from shardkit.stream import WorkerOptions, make_loader
    if __name__ == "__main__":
        backend, ctx = sys.argv[2], (None if sys.argv[3] == "default" else sys.argv[3])
        loader = make_loader(sys.argv[1], "train", 32, num_workers=2, cache="ram",
                             workers=WorkerOptions(backend=backend, multiprocessing_context=ctx,
                                                   persistent_workers=ctx is not None))
        n = sum(len(y) for _, y in loader)
        print(n, loader.cache_stats()["filled_samples"], loader.cache_stats()["path"])
        # no close(): the interpreter exits with the loader (and its arena) alive
""")


@pytest.mark.parametrize("backend,ctx", [("thread", "default"), ("process", "default"),
                                         ("process", "spawn")])
def test_a_run_that_exits_without_close_leaves_no_arena(root, shm, tmp_path, caplog, backend,
                                                        ctx):
    script = tmp_path / "no_close.py"  # a file: spawned workers re-import __main__
    script.write_text(_NO_CLOSE)
    proc = subprocess.run([sys.executable, str(script), str(root), backend, ctx],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n, filled, path = proc.stdout.split()
    assert (int(n), int(filled)) == (N, N) and Path(path).parent == shm
    assert list(shm.iterdir()) == []  # released at exit: neither the arena nor its lock
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        with make_loader(root, "train", BATCH, cache="ram") as loader:
            stats = loader.cache_stats()  # a new arena in the emptied folder, nothing filled yet
            assert Path(stats["path"]).parent == shm and Path(stats["path"]).is_file()
            assert stats["filled_samples"] == 0 and stats["disabled"] is None
    assert "stale" not in caplog.text and "killed" not in caplog.text


# --- cache files that are not ours -----------------------------------------------------------

def _invert(path: Path) -> None:
    """Inverts the pixels of every ready slot of the arena file ``path`` and rewrites their
    checksums, as a poisoner who knows the format would."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        length = int.from_bytes(mm[8:16], "little")
        header = json.loads(mm[24:24 + length])
        n = header["n"]
        offsets, start = arena_mod.table_layout(n)
        t = {name: np.frombuffer(mm, dtype, n, offsets[name]) for name, dtype in arena_mod.TABLE}
        for i in np.flatnonzero(t["state"] == 1):
            size = int(t["ch"][i]) * int(t["cw"][i]) * 3
            pix = np.frombuffer(mm, np.uint8, size, start + int(t["offset"][i]))
            pix[:] = 255 - pix
            t["xxh3"][i] = sample_checksum(pix)
        del t, pix


def _filled_copy(root, where: Path) -> Path:
    """Fills a RAM arena, copies it to ``where`` while it is held; returns the arena's path."""
    with make_loader(root, "train", BATCH, num_workers=2, cache="ram") as loader:
        [None for _ in loader]
        path = Path(loader.cache.path)
        shutil.copyfile(path, where)
    return path


_AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", [pytest.param("foreign", marks=_AS_ROOT),
                                  pytest.param("foreign-lock", marks=_AS_ROOT),
                                  "writable", "symlink", "ours"])
def test_a_cache_file_that_is_not_ours_is_never_read(root, shm, tmp_path, plain, caplog, kind,
                                                     backend):
    """A poisoned arena (every slot inverted, checksums rewritten) under the victim's name,
    held open by its planter so that it looks in use: another user's file (mode 0666), one
    behind a foreign lock file, one of ours writable by others, or a symbolic link is not read
    and the epoch is the uncached one; our own 0600 file is shared as designed ("ours": the
    control, the poison is served)."""
    poisoned = shm / "planted.bin"
    path = _filled_copy(root, poisoned)
    _invert(poisoned)
    os.chmod(poisoned, 0o600)
    if kind == "symlink":
        os.symlink(poisoned, path)
    else:
        os.rename(poisoned, path)
        poisoned = path
    if kind == "foreign":
        os.chown(path, 4242, 4242)
        os.chmod(path, 0o666)
    elif kind == "foreign-lock":
        lock = Path(str(path) + ".lock")
        lock.write_bytes(b"")
        os.chown(lock, 4242, 4242)
        os.chmod(lock, 0o666)
    elif kind == "writable":
        os.chmod(path, 0o666)
    before = hashlib.sha256(poisoned.read_bytes()).hexdigest()
    fd = os.open(poisoned, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # "in use": a holder's arena is shared, not rebuilt
    try:
        with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
            got, stats = _epoch(root, backend, 0, cache="ram")
    finally:
        os.close(fd)
    assert sorted(torch.cat([i for _, _, i in got]).tolist()) == list(range(N))
    if kind == "ours":
        assert stats["hits"] == N and not any(x.equal(px) for (x, _, _), (px, _, _)
                                              in zip(got, plain[0]))
        return
    _assert_whole_and_same(got, plain[0])
    assert stats is None  # the loader reads uncached
    assert hashlib.sha256(poisoned.read_bytes()).hexdigest() == before  # not written either
    expect = {"foreign": "belongs to uid 4242", "foreign-lock": "belongs to uid 4242",
              "writable": "writable by other users", "symlink": "symbolic link"}[kind]
    assert expect in caplog.text and caplog.text.count("decoded cache") == 1


def test_new_arena_files_are_private_and_named_for_the_user(root, shm):
    with make_loader(root, "train", BATCH, cache="ram") as loader:
        path = Path(loader.cache.path)
        assert f"-u{os.getuid()}-" in path.name
        for p in (path, Path(str(path) + ".lock")):
            st = os.lstat(p)
            assert (st.st_uid, st.st_mode & 0o777) == (os.getuid(), 0o600)


# --- damaged or crafted disk caches ----------------------------------------------------------

def _damage(path: Path, how: str) -> None:
    with open(path, "r+b") as f:
        head = f.read(24)
        length = int.from_bytes(head[8:16], "little")
        header = json.loads(f.read(length))
        n = header["n"]
        offsets, _ = arena_mod.table_layout(n)
        if how == "swap":  # one non-square slot: width <-> height, cw <-> ch; checksum still good
            with mmap.mmap(f.fileno(), 0) as mm:
                t = {k: np.frombuffer(mm, d, n, offsets[k]) for k, d in arena_mod.TABLE}
                i = int(np.flatnonzero(t["cw"] != t["ch"])[0])
                assert t["state"][i] == 1
                for a, b in (("width", "height"), ("cw", "ch")):
                    t[a][i], t[b][i] = int(t[b][i]), int(t[a][i])
                del t
        elif how == "truncate":
            f.truncate(offsets["xxh3"] + 10)
        elif how in ("header", "count"):
            body = b"[1, 2, 3]" if how == "header" else json.dumps(
                {**header, "n": n + 1}, sort_keys=True).encode()
            f.seek(8)
            f.write(len(body).to_bytes(8, "little") + bytes(8))
            f.seek(24)
            f.write(body + bytes(length))


@pytest.mark.parametrize("how,backend", [("swap", "thread"), ("swap", "process"),
                                         ("truncate", "thread"), ("header", "process"),
                                         ("count", "thread")])
def test_a_damaged_disk_cache_is_rebuilt_never_served(root, plain, tmp_path, caplog, how,
                                                      backend):
    spec = f"disk:{tmp_path / 'cache'}"
    first, s1 = _epoch(root, "thread", 0, cache=spec)
    assert s1["filled_samples"] == N
    (path,) = (tmp_path / "cache").glob("*.arena")
    _damage(path, how)
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        got, stats = _epoch(root, backend, 1, cache=spec)
    _assert_whole_and_same(got, plain[1])
    assert "removing a stale arena" in caplog.text
    assert ("damaged" if how != "header" else "no valid header") in caplog.text
    assert (stats["hits"], stats["misses"]) == (0, N)  # rebuilt: nothing read from the old file
    again, s3 = _epoch(root, backend, 1, cache=spec)
    _assert_whole_and_same(again, plain[1])
    assert s3["hits"] == N  # the rebuilt cache serves


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slot_that_cannot_be_read_is_decoded_not_blamed_on_the_shard(root, shm, plain,
                                                                        monkeypatch, caplog,
                                                                        backend):
    """A fault while reading a slot (here: slot() raising for every third sample) is a cache
    fault: that sample is decoded from its intact shard with the crop it would have had, never
    reported as a damaged sample (on_error='raise' would stop the run)."""
    real = arena_mod.Arena.slot

    def slot(self, i):
        if i % 3 == 0:
            raise ValueError("buffer is smaller than requested size")
        return real(self, i)

    with make_loader(root, "train", BATCH, num_workers=2, return_meta=True, cache="ram",
                     on_error="raise", workers=WorkerOptions(backend=backend)) as loader:
        [None for _ in loader]  # epoch 0 fills
        monkeypatch.setattr(arena_mod.Arena, "slot", slot)  # forked workers of epoch 1 too
        loader.set_epoch(1)
        with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
            got = [(x.clone(), y.clone(), m["index"].clone()) for x, y, m in loader]
        assert loader.skipped == []
    _assert_whole_and_same(got, plain[1])
    if backend == "thread":
        assert caplog.text.count("cannot read the slot") == 1


def test_records_with_bad_sizes_fall_back_to_the_headers(root, tmp_path, shm, plain, caplog):
    where = tmp_path / "data"
    shutil.copytree(root, where)
    jsonl = where / "splits" / "train.jsonl"
    lines = jsonl.read_text().splitlines()
    first = json.loads(lines[0])
    lines[0] = json.dumps({**first, "width": "abc"})
    jsonl.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        got, stats = _epoch(where, "thread", 0, cache="ram")
    _assert_whole_and_same(got, plain[0])
    assert stats["filled_samples"] == N and "reading 140 image headers" in caplog.text
