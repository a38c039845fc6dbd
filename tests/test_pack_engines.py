"""The local engine (shardkit/packer/engines.py) runs the packer's public worker functions:
``check_chunk`` in its process pool (``iter_checks`` in-process) and ``write_shard`` once per
shard of the split plan; ``write_shard`` itself writes one shard at a fixed index. The Ray
engine's side of the same contract is in tests/test_ray.py."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import shardkit.packer.engines as engines
from shardkit.errors import ConfigError, SourceError
from shardkit.packer import check as pack_check
from shardkit.packer import write as pack_write
from shardkit.packer.engines import LocalEngine, RayEngine
from shardkit.packer.options import PackOptions
from shardkit.packer.records import CheckRecords
from shardkit.packer.run import pack
from shardkit.images.sniff import DEFAULT_MAX_PIXELS
from shardkit.sources.items import SourceItem

OPTS = dict(split={"train": 1.0}, progress=False)


def _photos(sample_dir: Path, per_class: int) -> list[Path]:
    return [p for cls in sorted(d for d in sample_dir.iterdir() if d.is_dir())
            for p in sorted(cls.glob("*.jpg"))[:per_class]]


def _source(tmp_path: Path, sample_dir: Path, per_class: int) -> Path:
    src = tmp_path / "src"
    for p in _photos(sample_dir, per_class):
        (src / p.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, src / p.parent.name / p.name)
    return src


def _jobs(paths: list[Path]) -> list[tuple]:
    return [(str(p), f"{p.parent.name}/{p.name}", DEFAULT_MAX_PIXELS, False, True, None, 90)
            for p in paths]


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _marked_chunk(jobs, concurrency):
    """check_chunk, its records marked: run in the pool's processes (picklable by name)."""
    return [{**res, "chunk_of": len(jobs)} for res in pack_check.check_chunk(jobs, concurrency)]


# ----------------------------------------------------------------------------- check
def test_local_check_runs_check_chunk_in_its_pool(sample_dir, monkeypatch):
    jobs = _jobs(_photos(sample_dir, 4))  # 20 files: chunks of 1 for 2 workers
    want = pack_check.check_chunk(jobs)
    assert len(want) == 20 and all(r["ok"] for r in want)
    monkeypatch.setattr(engines, "check_chunk", _marked_chunk)
    got = list(LocalEngine(workers=2).check(jobs, progress=False))
    assert [r.pop("chunk_of") for r in got] == [1] * 20  # every record from check_chunk
    assert got == want


def test_local_check_in_process_streams_iter_checks(sample_dir, monkeypatch):
    jobs = _jobs(_photos(sample_dir, 1))
    calls = []

    def spy(jobs_, concurrency):
        calls.append((len(jobs_), concurrency))
        yield from pack_check.iter_checks(jobs_, concurrency)

    monkeypatch.setattr(engines, "iter_checks", spy)
    got = list(LocalEngine(workers=1, concurrency=3).check(jobs, progress=False))
    assert calls == [(5, 3)] and got == pack_check.check_chunk(jobs)


def test_a_pack_uses_the_engine_of_its_options(sample_dir, tmp_path, monkeypatch):
    """packer.run chooses the engine once, from PackOptions.engine, and hands the same object
    to the check and the write step."""
    used = []
    for method in ("check", "write_splits"):
        real = getattr(LocalEngine, method)
        monkeypatch.setattr(LocalEngine, method,
                            lambda self, *a, _m=method, _real=real, **k:
                            used.append((_m, id(self))) or _real(self, *a, **k))

    def no_ray(options):
        raise AssertionError("engine='local' made a RayEngine")

    monkeypatch.setattr(RayEngine, "from_options", no_ray)
    pack(_source(tmp_path, sample_dir, 1), tmp_path / "out", engine="local", **OPTS)
    assert [m for m, _ in used] == ["check", "write_splits"] and len({i for _, i in used}) == 1


# ----------------------------------------------------------------------------- write
def test_local_write_runs_write_shard_once_per_planned_shard(sample_dir, tmp_path,
                                                             monkeypatch):
    src = _source(tmp_path, sample_dir, 5)  # 25 photos, 10 per shard: 10, 10, 5
    pack(src, tmp_path / "plain", shard_samples=10, **OPTS)
    calls = []
    real = pack_write.write_shard

    def spy(out, split, index, rows, *a, **k):
        calls.append((split, index))
        return real(out, split, index, rows, *a, **k)

    monkeypatch.setattr(engines, "write_shard", spy)
    pack(src, tmp_path / "spied", shard_samples=10, **OPTS)
    assert calls == [("train", 0), ("train", 1), ("train", 2)]
    manifest = json.loads((tmp_path / "spied" / "manifest.json").read_text())
    assert [s["num_samples"] for s in manifest["splits"]["train"]["shards"]] == [10, 10, 5]
    assert _files(tmp_path / "spied") == _files(tmp_path / "plain")


def _rows(sample_dir: Path, n: int, split: str = "val") -> tuple[list[tuple], list[dict]]:
    jobs = _jobs(_photos(sample_dir, 1)[:n])
    checked = pack_check.check_chunk(jobs)
    items = [SourceItem(path=j[0], relpath=j[1], label=j[1].split("/")[0],
                         group=j[1]) for j in jobs]
    return [(f"{split}_{k:08d}", it, res, 0) for k, (it, res) in
            enumerate(zip(items, checked))], checked


def test_write_shard_writes_one_shard_at_its_index(sample_dir, tmp_path):
    rows, checked = _rows(sample_dir, 3)
    seen = []
    records, shard = pack_write.write_shard(
        tmp_path, "val", 4, rows, ["daisy"], "wds",
        on_close=lambda path, entry, recs: seen.append((path.name, entry, len(recs))))
    assert os.listdir(tmp_path / "shards") == ["val-000004.tar"]
    assert shard["path"] == "shards/val-000004.tar" and shard["num_samples"] == 3
    assert seen == [("val-000004.tar", shard, 3)]
    assert [r["shard"] for r in records] == [4, 4, 4]
    assert [r["key"] for r in records] == ["val_00000000", "val_00000001", "val_00000002"]
    assert [r["sha256"] for r in records] == [c["sha256"] for c in checked]


def test_write_shard_of_a_changed_source_leaves_no_file(sample_dir, tmp_path):
    rows, _ = _rows(sample_dir, 3)
    victim = tmp_path / "changed.jpg"
    victim.write_bytes(Path(rows[1][1].path).read_bytes()[:-4] + b"\0\0\0\0")
    key, it, res, label = rows[1]
    rows[1] = (key, SourceItem(path=str(victim), relpath=it.relpath, label=it.label,
                                group=it.group), res, label)
    with pytest.raises(SourceError, match="changed.jpg changed while packing"):
        pack_write.write_shard(tmp_path / "out", "val", 0, rows, ["daisy"], "wds")
    assert os.listdir(tmp_path / "out" / "shards") == []
    with pytest.raises(ConfigError, match="shard 0 of split 'val': no rows"):
        pack_write.write_shard(tmp_path / "out", "val", 0, [], ["daisy"], "wds")


def test_split_ranges_and_shard_rows_follow_the_shard_plan(sample_dir):
    jobs = _jobs(_photos(sample_dir, 1))
    results = CheckRecords(len(jobs))
    for i, res in enumerate(pack_check.check_chunk(jobs)):
        results[i] = res
    members = [4, 2, 0, 1, 3]
    opts = PackOptions(shard_samples=2)
    assert pack_write.split_ranges(members, results, opts) == [(0, 2), (2, 4), (4, 5)]
    items = [f"item{i}" for i in range(5)]
    rows = list(pack_write.shard_rows("train", members, 2, 4, items, [9, 8, 7, 6, 5], results))
    assert [(key, it, label) for key, it, _, label in rows] == [
        ("train_00000002", "item0", 9), ("train_00000003", "item1", 8)]
    assert rows[0][2]["sha256"] == results[0]["sha256"]
