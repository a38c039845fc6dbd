"""ShardSource checks every listed shard when a reader is built: a missing or short shard is
one clear error up front, never a failure hours in (or a SIGBUS from a short LMDB map)."""
from __future__ import annotations

import os

import pytest

from shardkit.errors import ShardCorruptError
from shardkit.stream import MapShardDataset, ShardDataset, make_loader
from test_dataset import build_split


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
