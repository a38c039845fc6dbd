"""ShardSource checks every listed shard when a reader is built: a missing or short shard is
one clear error up front, never a failure hours in (or a SIGBUS from a short LMDB map)."""
from __future__ import annotations

import os

import pytest

from shardkit.errors import ShardCorruptError
from shardkit.stream import MapShardDataset, ShardDataset, make_loader
from helpers import build_split


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5"])
def test_missing_and_truncated_shards_are_listed_in_one_error(sample_dir, tmp_path, fmt):
    build_split(sample_dir, tmp_path, fmt, [4, 4, 4])
    shards = sorted((tmp_path / "shards").iterdir())
    assert len(shards) == 3
    os.remove(shards[0])
    os.truncate(shards[2], os.path.getsize(shards[2]) // 2)  # an interrupted copy
    for build in (lambda: make_loader(tmp_path, "train", 4, image_size=8),
                  lambda: ShardDataset(tmp_path, "train"),
                  lambda: MapShardDataset(tmp_path, "train")):
        with pytest.raises(ShardCorruptError) as info:
            build()
        msg = str(info.value)
        assert "2 of 3 shard(s) of split 'train'" in msg
        assert f"{shards[0].name}: missing" in msg
        assert f"{shards[2].name}: {os.path.getsize(shards[2])} bytes" in msg
        assert "truncated" in msg


def test_intact_shards_pass(sample_dir, tmp_path):
    build_split(sample_dir, tmp_path, "lmdb", [3, 2])
    assert len(MapShardDataset(tmp_path, "train")) == 5


def test_fork_beside_busy_decoding_threads_cannot_hang_lmdb_workers(sample_dir, tmp_path):
    """A DataLoader worker forked while a decoding thread of the parent was inside an LMDB read
    used to hang for ever in py-lmdb's ``Environment.close()`` (the child must close inherited
    environments before reopening): 1 run in 10 of a thread-backend loader left mid-epoch
    beside a new process-backend loader. Forks now wait until no LMDB read is in flight. Without
    that gate this loop hangs (LoaderError after 10 s) with probability ~98%."""
    from shardkit.stream import WorkerOptions, make_loader

    build_split(sample_dir, tmp_path, "lmdb", [20, 20])
    kw = dict(num_workers=2, image_size=8, seed=3)
    for _ in range(40):
        busy = make_loader(tmp_path, "train", 4, **kw)
        it = iter(busy)
        next(it)  # threads keep decoding ahead (prefetch) while the worker below forks
        procs = make_loader(tmp_path, "train", 4, workers=WorkerOptions(
            backend="process", timeout=10), **{**kw, "num_workers": 1})
        assert sum(len(y) for _, y in procs) == 40
        busy.close()
