"""shardkit.packer.options.PackOptions (validated once, resolved values) and the seams between
the packer's steps (shardkit.packer: scan, check, split, write)."""
from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from shardkit.images import normalize as images
import shardkit.packer.check as pack_check
import shardkit.packer.scan as pack_scan
import shardkit.packer.shards as pack_shards
import shardkit.packer.split as pack_split
from shardkit.errors import ConfigError, LabelError, SplitError
from shardkit.dataset.manifest import load_manifest
from shardkit.packer.options import DEFAULT_SHARD_BYTES, PackOptions
from shardkit.packer.engines import LocalEngine
from shardkit.packer.run import pack

BAD_OPTIONS = [
    (dict(format="zip"), ConfigError, "unknown format 'zip'"),
    (dict(split="train=0.5"), SplitError, "sum to 0.5"),
    (dict(split={"train": 0.5, "val": -0.5}), SplitError, "ratio of split 'val' is -0.5"),
    (dict(seed=-1), ConfigError, "seed=-1; expected an integer >= 0"),
    (dict(seed=True), ConfigError, "seed=True; expected an integer >= 0"),
    (dict(workers=0), ConfigError, "workers=0; expected an integer >= 1"),
    (dict(workers=2.5), ConfigError, "workers=2.5; expected an integer >= 1"),
    (dict(shard_samples=0), ConfigError, "shard_samples=0; expected an integer >= 1"),
    (dict(shard_bytes="lots"), ConfigError, "size 'lots' is not a size"),
    (dict(max_pixels=0), ConfigError, "max_pixels=0; expected a pixel count >= 1"),
    (dict(on_label_conflict="drop"), ConfigError, "on_label_conflict='drop'; expected one of"),
    (dict(metadata="meta.csv"), ConfigError, "--metadata meta.csv needs --group-column"),
    (dict(group_column="who"), ConfigError, "--group-column 'who' needs --metadata"),
    (dict(group_by="(a"), ConfigError, "group regex '(a' does not compile"),
    (dict(group_by=r"\d+"), ConfigError, r"group regex '\\d+' has no capture group"),
    (dict(group_by="(a)", metadata="m.csv", group_column="who"), ConfigError, "not both"),
    (dict(writer_options=[1]), ConfigError, "writer_options=[1]; expected a mapping"),
]


@pytest.mark.parametrize("kwargs, error, words", BAD_OPTIONS)
def test_a_bad_option_raises_one_line_naming_it_before_anything_is_read(sample_dir, tmp_path,
                                                                        kwargs, error, words):
    with pytest.raises(error, match=re.escape(words)) as info:
        PackOptions(**kwargs)
    assert "\n" not in str(info.value)
    with pytest.raises(error, match=re.escape(words)):  # pack's keywords: the same validation
        pack(sample_dir, tmp_path / "o", progress=False, **kwargs)
    assert not (tmp_path / "o").exists()


def test_options_are_resolved_once_and_frozen():
    opts = PackOptions(split="train=0.7, val=0.3", shard_bytes="64MiB", workers=np.int64(2),
                       strict=1)
    assert opts.split == {"train": 0.7, "val": 0.3} and opts.shard_bytes == 64 << 20
    assert opts.workers == 2 and type(opts.workers) is int and opts.strict is True
    assert opts.max_pixels == images.DEFAULT_MAX_PIXELS == 89_478_485
    assert PackOptions().split == {"train": 0.8, "val": 0.1, "test": 0.1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 3
    with pytest.raises(ConfigError, match="seed=-2"):  # replace validates again
        opts.replace(seed=-2)
    assert opts.replace(seed=3).seed == 3 and opts.seed == 0
    with pytest.raises(ConfigError, match="options={'seed': 1}; expected a PackOptions"):
        pack("src", "out", options={"seed": 1})


MIB = 1 << 20


@pytest.mark.parametrize("samples, nbytes, shards", [
    (0, 0, 0), (1, 10, 1), (100, 6 * MIB, 1), (127, 8 * MIB, 1), (128, 8 * MIB, 2),
    (176, 11 * MIB, 2), (511, 30 * MIB, 4), (512, 30 * MIB, 8), (1483, 95 * MIB, 16),
    (1535, 98 * MIB, 16), (2047, 130 * MIB, 16), (2048, 130 * MIB, 32), (1_281_167, 0, 32),
    (50_000, 8 * 1024 * MIB, 32),             # 8 GiB: 32 shards of 256 MiB
    (1_281_167, 140 * 1024 * MIB, 576),       # ImageNet train: 560 -> a multiple of 32
    (100, 5 * 1024 * MIB, 32),                # 100 photos of 50 MB: 20 by bytes -> 32
    (10, 5 * 1024 * MIB, 10),                 # never more shards than samples
])
def test_default_shard_count_per_split_size(samples, nbytes, shards):
    """The default plan: the largest power of two <= 32 leaving >= 64 samples per shard, raised
    to keep the average shard <= 256 MiB (a power of two up to 32, then a multiple of 32)."""
    assert pack_shards.default_shard_count(samples, nbytes) == shards


@pytest.mark.parametrize("samples, nbytes", [(1483, 95 * MIB), (2048, 130 * MIB),
                                              (100_000, 9 * 1024 * MIB), (512, 1), (65, 1)])
def test_default_limits_cut_a_split_into_that_many_equal_shards(samples, nbytes):
    """shard_limits + the sink's rollover (pack_write.shard_ranges, which both engines follow)
    give exactly default_shard_count shards, all of ceil(n / S) samples but the last; shards
    stay under the 512 MiB cap, which equal files never reach."""
    from shardkit.packer.write import shard_ranges

    count = pack_shards.default_shard_count(samples, nbytes)
    max_samples, max_bytes = PackOptions().shard_limits(samples, nbytes)
    assert (max_samples, max_bytes) == (-(-samples // count), 2 * DEFAULT_SHARD_BYTES)
    ranges = shard_ranges([nbytes // samples] * samples, max_samples, max_bytes)
    lengths = [b - a for a, b in ranges]
    assert len(lengths) == count and sum(lengths) == samples
    assert set(lengths[:-1]) <= {max_samples} and 0 < lengths[-1] <= max_samples


def test_given_shard_limits_replace_the_default_plan():
    assert PackOptions(shard_samples=10).shard_limits(1000, 10 * MIB) == (10, None)
    assert PackOptions(shard_bytes="1MB").shard_limits(1000, 10 * MIB) == (None, 1_000_000)
    assert PackOptions(shard_samples=10, shard_bytes="1MB").shard_limits(5, 1) == (10, 1_000_000)
    assert DEFAULT_SHARD_BYTES == pack_shards.DEFAULT_SHARD_BYTES == 256 * MIB


def test_few_shards_warning_names_the_splits_under_the_reader_parallelism():
    def split(n, shards):
        return {"num_samples": n, "shards": [{}] * shards}

    assert pack_shards.READER_PARALLELISM == 8
    assert pack_shards.few_shards_warning({"train": split(2048, 32), "val": split(0, 0)}) == []
    (w,) = pack_shards.few_shards_warning({"train": split(1483, 16), "val": split(176, 2),
                                         "test": split(180, 1)})
    assert w.startswith("split(s) with fewer than 8 shards: val (2), test (1). Readers that "
                        "hand whole shards to each of world_size x num_workers processes")


def test_defaults_that_depend_on_two_options_follow_both():
    with_cls = PackOptions(format="wds")
    assert with_cls.sink_writer_options == {"wds_cls": True, "wds_json": False}
    assert PackOptions(wds_cls=False, wds_json=True).sink_writer_options == {
        "wds_cls": False, "wds_json": True}
    assert with_cls.replace(format="lmdb").sink_writer_options == {}
    given = PackOptions(format="wds", wds_cls=True, writer_options={"wds_json": True})
    assert given.sink_writer_options == {"wds_cls": True, "wds_json": True}  # wds_cls kept
    assert given.replace(writer_options={"wds_cls": False}).sink_writer_options == {
        "wds_cls": False, "wds_json": False}  # a key writer_options names wins
    lmdb = PackOptions(format="lmdb", writer_options={"initial_map_size": np.int64(1 << 20)})
    assert lmdb.sink_writer_options == {"initial_map_size": 1 << 20}
    assert type(lmdb.sink_writer_options["initial_map_size"]) is int  # JSON for the manifest


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_options_object_keywords_and_overrides_give_the_same_bytes(sample_dir, tmp_path):
    src = tmp_path / "src"
    for cls in ("daisy", "roses", "tulips"):
        (src / cls).mkdir(parents=True)
        for p in sorted((sample_dir / cls).glob("*.jpg"))[:4]:
            shutil.copyfile(p, src / cls / p.name)
    kwargs = dict(format="wds", split="train=0.5,val=0.5", seed=1, shard_samples=3,
                  progress=False)
    by_kwargs = pack(src, tmp_path / "a", **kwargs)
    by_options = pack(src, tmp_path / "b", options=PackOptions(**kwargs))
    overridden = pack(src, tmp_path / "c", options=PackOptions(**{**kwargs, "seed": 9}), seed=1)
    tree = _tree(tmp_path / "a")
    assert len([k for k in tree if k.endswith(".tar")]) == by_kwargs.splits["train"][
        "shards"] + by_kwargs.splits["val"]["shards"] >= 4
    assert _tree(tmp_path / "b") == tree == _tree(tmp_path / "c")
    assert by_options.splits == by_kwargs.splits == overridden.splits
    man = load_manifest(tmp_path / "a")  # the resolved options, where the schema keeps them
    assert man["format"] == "wds" and man["split"]["seed"] == 1
    assert man["split"]["ratios"] == {"train": 0.5, "val": 0.5}
    assert man["normalization"]["max_pixels"] == 89_478_485
    assert man["normalization"]["strict"] is False


def test_steps_1_to_4_run_without_an_output_folder(sample_dir, tmp_path):
    """The planning steps are seams: scan/labels/check return values, the split is pure."""
    src = tmp_path / "src"
    photos = {c: sorted((sample_dir / c).glob("*.jpg"))[:3] for c in ("daisy", "roses")}
    for cls, files in photos.items():
        (src / cls).mkdir(parents=True)
        for p in files:
            shutil.copyfile(p, src / cls / p.name)
    shutil.copyfile(photos["daisy"][0], src / "roses" / "copy.jpg")  # same bytes, other label
    (src / "roses" / "notes.txt").write_text("not a photo\n")
    opts = PackOptions(split={"train": 0.5, "val": 0.5}, on_label_conflict="quarantine",
                       progress=False)
    source = pack_scan.scan_source(src.resolve(), opts)
    assert [it.relpath for it in source.items][:3] == [f"daisy/{p.name}" for p in photos["daisy"]]
    assert source.num_files == 8 and source.group_rule == {"kind": "none"}
    label_map, label_idx = pack_scan.resolve_labels(source.items, None)
    assert label_map.classes == ["daisy", "roses"] and label_idx == [0, 0, 0, 1, 1, 1, 1, 1]
    checked = pack_check.check_files(source, opts, engine=LocalEngine.from_options(opts))
    assert [q["reason"] for q in checked.quarantine] == ["not an image (sniffed: unknown)"]
    assert len(checked.keep) == 7
    outcome = pack_split.plan_split(source, label_map, label_idx, checked, opts)
    copies = sorted(q["path"] for q in outcome.quarantined)
    assert copies == [f"daisy/{photos['daisy'][0].name}", "roses/copy.jpg"]
    assert len(outcome.keep) == 5 and outcome.conflicts[0]["labels"] == ["daisy", "roses"]
    assert pack_split.NO_GROUP_RULE_WARNING in outcome.warnings
    again = pack_split.plan_split(source, label_map, label_idx, checked, opts)
    assert again.plan.assignment == outcome.plan.assignment  # pure: same input, same plan
    with pytest.raises(LabelError, match="1 set\\(s\\) of identical bytes"):
        pack_split.plan_split(source, label_map, label_idx, checked, opts.replace(
            on_label_conflict="error"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing written anywhere


def test_jpeg_quality_without_max_side_warns():
    from shardkit.packer.options import PackOptions

    assert PackOptions(jpeg_quality=90).warnings() == [
        "--jpeg-quality 90 has no effect without --max-side (only downscaled images are "
        "re-encoded)"]
    assert PackOptions(jpeg_quality=90, max_side=512).warnings() == []
    assert PackOptions().warnings() == []
