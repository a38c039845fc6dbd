"""Shared fixtures: real data from ../shared/data (tests skip with a reason when it is absent)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SHARDKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
FLOWERS = SHARED_DATA / "flowers"
AWKWARD = SHARED_DATA / "awkward"
SAMPLE = ROOT / "examples" / "flowers-sample"


def _need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real test data not found at {path} (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="session")
def flowers_dir() -> Path:
    """The full flowers set (1,839 photos, 5 classes, metadata.csv with group_flickr_user)."""
    return _need(FLOWERS)


@pytest.fixture(scope="session")
def awkward_dir() -> Path:
    """27 awkward real-world files with EXPECTED.csv."""
    return _need(AWKWARD)


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """The embedded sample shipped in the repo (whole photographer groups, 5 classes)."""
    return _need(SAMPLE)


def _pack_factory(tmp_path_factory, name: str, src: Path, defaults: dict):
    """Session-cached ``make(fmt, **kwargs) -> Path``: ``src`` packed by ``shardkit.pack.pack``."""
    cache: dict[tuple, Path] = {}

    def make(fmt: str = "wds", **kwargs) -> Path:
        from shardkit.pack import pack

        key = (fmt, tuple(sorted(kwargs.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{name}-{fmt}") / "out"
            pack(_need(src), out, format=fmt, **{**defaults, **kwargs})
            cache[key] = out
        return cache[key]

    return make


@pytest.fixture(scope="session")
def packed_sample(tmp_path_factory):
    """Factory: the embedded sample packed once per format (train/val/test by photographer).

    Usage: ``out = packed_sample("lmdb")`` -> Path of the packed dataset (session-cached).
    """
    return _pack_factory(tmp_path_factory, "packed", SAMPLE, dict(
        split={"train": 0.7, "val": 0.15, "test": 0.15}, seed=0,
        metadata=SAMPLE / "metadata.csv", group_column="group_flickr_user", shard_samples=32,
        workers=1))


@pytest.fixture(scope="session")
def packed_flowers(tmp_path_factory):
    """Factory: the full flowers set packed once per format, grouped by group_flickr_user."""
    return _pack_factory(tmp_path_factory, "flowers", FLOWERS, dict(
        split={"train": 0.8, "val": 0.1, "test": 0.1}, seed=0,
        metadata=FLOWERS / "metadata.csv", group_column="group_flickr_user", shard_samples=256,
        workers=2))
