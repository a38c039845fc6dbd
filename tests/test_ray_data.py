"""``shardkit.ray.read_split`` (shardkit/ray/data.py, datasource.py, tasks.py): a Ray Data
datasource with one read task per shard, planned from the split index; the rows are the pixels
of ``make_loader`` / ``MapShardDataset`` for the same transform, augmentation and seed, every
key once per epoch, exactly once across ``streaming_split`` consumers; a damaged sample follows
``on_error``, a decode with libjpeg warnings ``on_warning``.

One local Ray runtime (2 CPUs, no dashboard) serves the module; real data: the embedded
flowers sample (200 photos) packed in tmp_path.
"""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")  # only for users without the extra: CI installs it

import ray.data  # noqa: E402

from conftest import SAMPLE  # noqa: E402
from shardkit import pack  # noqa: E402
from shardkit.augment import AugmentSpec  # noqa: E402
from shardkit.decode import DecodeWarningError, auto_choice  # noqa: E402
from shardkit.errors import ConfigError, ManifestError, ShardCorruptError  # noqa: E402
from shardkit.dataset.manifest import load_index, load_manifest  # noqa: E402
from shardkit.ray import read_split  # noqa: E402
from shardkit.ray.datasource import SplitDatasource  # noqa: E402
from shardkit.sharding import epoch_order  # noqa: E402
from shardkit.stream import MapShardDataset, make_loader  # noqa: E402
from shardkit.stream.source import ShardSource  # noqa: E402
from shardkit.transforms import TransformConfig, make_transform  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def ray_runtime():
    # "local": our own runtime, not a cluster another test process left on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ray-packed") / "wds"
    pack(SAMPLE, out, shard_samples=24, progress=False)
    return out


def _by_index(rows) -> dict[int, dict]:
    out = {int(r["index"]): r for r in rows}
    assert len(out) == len(rows)
    return out


# ----------------------------------------------------------------------------- planning
def test_read_tasks_are_the_shards_with_the_index_sizes(packed, monkeypatch):
    """One read task per shard whatever the parallelism asked, row counts and byte sizes from
    the index, the epoch order computed once on the driver and cut by shard: no shard is
    opened to plan."""
    import shardkit.stream.source as source_mod

    def refuse(*_a, **_k):
        raise AssertionError("a shard was opened to plan the read")

    monkeypatch.setattr(source_mod, "open_reader", refuse)
    idx, man = load_index(packed, "train"), load_manifest(packed)
    shards = man["splits"]["train"]["shards"]
    width = idx.key.dtype.itemsize
    for decode, per_row in (("bytes", None), ("train", 32 * 32 * 3)):
        src = SplitDatasource(packed, "train", decode=decode, seed=3, epoch=1,
                              image_size=None if decode == "bytes" else 32)
        for parallelism in (1, 4, 200):
            tasks = src.get_read_tasks(parallelism)
            assert len(tasks) == len(shards) == 7
        rows = [t.read_fn.args[1] for t in tasks]  # each task carries its own rows only
        assert sorted(r.shard for r in rows) == list(range(7))
        assert sum(t.metadata.num_rows for t in tasks) == len(idx) == 161
        for t, r in zip(tasks, rows):
            mine = np.flatnonzero(idx.shard == r.shard)
            assert t.metadata.num_rows == len(r.positions) == len(mine)
            assert sorted(r.positions.tolist()) == mine.tolist()
            image = idx.size[mine].sum() if per_row is None else per_row * len(mine)
            assert t.metadata.size_bytes == image + (width + 16) * len(mine)
            assert t.metadata.input_files == (str(packed / shards[r.shard]["path"]),)
        assert src.estimate_inmemory_data_size() == sum(t.metadata.size_bytes for t in tasks)
        order = epoch_order(161, seed=3, epoch=1, shuffle=decode == "train")
        places = np.concatenate([r.places for r in rows])
        assert sorted(places.tolist()) == list(range(161))
        assert all(np.array_equal(order[r.places], r.positions) for r in rows)
        assert all(np.all(np.diff(r.places) > 0) for r in rows)
        firsts = [int(r.places[0]) for r in rows]
        assert firsts == sorted(firsts)  # tasks in the epoch order of their first sample


def test_every_key_exactly_once_per_epoch(packed):
    src = ShardSource(packed, "train")
    want = sorted(src.key(i) for i in range(len(src)))
    for epoch in (0, 1):
        rows = read_split(packed, "train", decode="bytes", shuffle=True, seed=1,
                          epoch=epoch).take_all()
        assert sorted(r["key"] for r in rows) == want
        assert sorted(int(r["index"]) for r in rows) == list(range(161))


def test_an_empty_split_is_an_empty_dataset(tmp_path):
    """6 photos: the default 80/10/10 split leaves ``val`` without samples."""
    src = tmp_path / "src"
    for p in sorted(SAMPLE.glob("*/*.jpg"))[::37][:6]:
        (src / p.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, src / p.parent.name / p.name)
    pack(src, tmp_path / "out", progress=False)
    assert load_manifest(tmp_path / "out")["splits"]["val"]["num_samples"] == 0
    assert SplitDatasource(tmp_path / "out", "val").get_read_tasks(2) == []
    assert read_split(tmp_path / "out", "val", decode="eval", image_size=16).take_all() == []


# ----------------------------------------------------------------------------- pixels
def test_read_split_train_images_are_make_loaders(packed):
    rows = read_split(packed, "train", decode="train", seed=3, epoch=1, image_size=32).take_all()
    by_index = _by_index(rows)
    assert len(by_index) == 161
    loader = make_loader(packed, "train", 16, image_size=32, seed=3, num_workers=0,
                         return_meta=True)
    loader.set_epoch(1)
    seen = 0
    for images, labels, meta in loader:
        hwc = images.permute(0, 2, 3, 1).numpy()
        for k, i in enumerate(meta["index"].tolist()):
            row = by_index[i]
            assert np.array_equal(row["image"], hwc[k]), f"sample {row['key']}"
            assert row["label"] == int(labels[k])
            seen += 1
    assert seen == 161
    other = read_split(packed, "train", decode="train", seed=3, epoch=2, image_size=32)
    first = {int(r["index"]): r["image"] for r in other.take_all()}
    differ = sum(not np.array_equal(first[i], by_index[i]["image"]) for i in by_index)
    assert differ > 140  # a new epoch draws new crops and flips


def test_transform_config_and_augment_are_make_loaders(packed):
    """A non-default TransformConfig and a per-sample augmentation: the loader's pixels."""
    cfg = TransformConfig(image_size=24, scale=(0.3, 1.0), interpolation="bicubic", hflip=1.0)
    aug = [{"op": "color_jitter", "brightness": 0.4, "contrast": 0.4},
           {"op": "random_erasing", "p": 1.0}]
    rows = read_split(packed, "train", decode="train", transform=cfg, augment=aug, seed=4,
                      epoch=3).take_all()
    by_index = _by_index(rows)
    loader = make_loader(packed, "train", 32, transform=cfg, augment=aug, seed=4,
                         num_workers=0, return_meta=True)
    loader.set_epoch(3)
    got = {i: x for images, _, meta in loader
           for i, x in zip(meta["index"].tolist(), images.permute(0, 2, 3, 1).numpy())}
    assert got.keys() == by_index.keys() and len(got) == 161
    assert all(np.array_equal(by_index[i]["image"], got[i]) for i in got)
    plain = read_split(packed, "train", decode="train", transform=cfg, seed=4, epoch=3)
    unaugmented = {int(r["index"]): r["image"] for r in plain.take_all()}
    assert sum(not np.array_equal(unaugmented[i], got[i]) for i in got) > 150


def test_unshuffled_rows_are_map_shard_datasets(packed):
    """Unshuffled, a sample's place is its split position, the key of MapShardDataset's RNG:
    read_split gives MapShardDataset's pixels for the same transform, seed and epoch."""
    cfg = TransformConfig(image_size=20)
    for decode, split in (("train", "train"), ("eval", "val")):
        rows = read_split(packed, split, decode=decode, transform=cfg, seed=7, epoch=2,
                          shuffle=False).take_all()
        ds = MapShardDataset(packed, split, transform=make_transform(cfg, decode == "train"),
                             seed=7)
        ds.set_epoch(2)
        by_index = _by_index(rows)
        assert sorted(by_index) == list(range(len(ds)))
        for i, row in by_index.items():
            item = ds[i]
            assert np.array_equal(row["image"], item["image"]), (decode, row["key"])
            assert (row["key"], row["label"]) == (item["key"], item["label"])


def test_read_split_eval_and_bytes(packed):
    rows = read_split(packed, "val", decode="eval", image_size=48).take_all()
    loader = make_loader(packed, "val", 8, train=False, image_size=48, num_workers=0)
    expected = np.concatenate([im.permute(0, 2, 3, 1).numpy() for im, _ in loader])
    got = np.stack([r["image"] for r in sorted(rows, key=lambda r: int(r["index"]))])
    assert got.shape == (20, 48, 48, 3) and got.dtype == np.uint8
    assert np.array_equal(got, expected)
    src = ShardSource(packed, "test")
    raw = read_split(packed, "test").take_all()
    assert sorted(int(r["index"]) for r in raw) == list(range(len(src)))
    for r in raw:
        assert r["image"] == bytes(src.read(int(r["index"])))
        assert r["key"] == src.key(int(r["index"])) and r["image"][:2] == b"\xff\xd8"


def test_read_split_exactly_once_across_streaming_split(packed):
    ds = read_split(packed, "train", decode="train", seed=5, image_size=16)
    consumers = ds.streaming_split(2, equal=False)
    keys: list[list[str]] = [[], []]

    def consume(i: int) -> None:
        for batch in consumers[i].iter_batches(batch_size=16, batch_format="numpy"):
            assert batch["image"].shape[1:] == (16, 16, 3)
            keys[i].extend(batch["key"].tolist())

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    everything = keys[0] + keys[1]
    assert keys[0] and keys[1]  # both consumers got rows
    assert len(everything) == len(set(everything)) == 161
    assert set(everything) == {ShardSource(packed, "train").key(i) for i in range(161)}


def test_read_split_of_a_remote_pack_is_make_loaders_for_any_num_workers(packed):
    """Over HTTP the order is shard-block order, cut per loader worker; read_split and
    make_loader with 0 or 2 workers still give every sample the same pixels."""
    from helpers import serve_http

    with serve_http(packed) as (url, _):
        rows = read_split(url, "train", decode="train", seed=3, epoch=1,
                          image_size=32).take_all()
        want = {int(r["index"]): r["image"] for r in rows}
        assert len(want) == 161
        for num_workers in (0, 2):
            loader = make_loader(url, "train", 16, image_size=32, seed=3,
                                 num_workers=num_workers, return_meta=True)
            loader.set_epoch(1)
            got = {i: x for images, _, meta in loader
                   for i, x in zip(meta["index"].tolist(),
                                   images.permute(0, 2, 3, 1).numpy())}
            assert got.keys() == want.keys()
            assert all(np.array_equal(got[i], want[i]) for i in want), num_workers


# ----------------------------------------------------------------------------- errors
def test_read_split_errors(packed, tmp_path):
    with pytest.raises(ConfigError, match="decode='jpeg'"):
        read_split(packed, "train", decode="jpeg")
    with pytest.raises(ConfigError, match="epoch"):
        read_split(packed, "train", epoch=-1)
    with pytest.raises(ManifestError, match="'nope'"):
        read_split(packed, "nope")
    with pytest.raises(ManifestError, match="not a finished"):
        read_split(tmp_path, "train")
    bad = [({"on_error": "ignore"}, "on_error='ignore'"),
           ({"on_warning": "ignore", "decode": "eval"}, "on_warning='ignore'"),
           ({"transform": TransformConfig(image_size=8)}, "decode='bytes'"),
           ({"augment": "light"}, "decode='bytes'"),
           ({"augment": "light", "decode": "eval"}, "decode='eval'"),
           ({"augment": [{"op": "mixup"}], "decode": "train"}, "mixup / cutmix"),
           ({"decode": "train", "transform": TransformConfig(image_size=8), "image_size": 9},
            "disagrees"),
           ({"decode": "train", "transform": lambda d, r, out=None: d}, "needs image_size"),
           ({"decode": "train", "image_size": 0}, "image_size"),
           ({"decode": "train", "max_pixels": 0}, "max_pixels")]
    for options, match in bad:
        with pytest.raises(ConfigError, match=match):
            read_split(packed, "train", **options)
    assert AugmentSpec.parse("none").is_identity  # "none" is accepted with decode="bytes"
    read_split(packed, "train", augment="none")


@pytest.fixture(scope="module")
def damaged(packed, tmp_path_factory) -> tuple[Path, str]:
    """The packed sample with 4 stored bytes of one train sample flipped (its xxh3 no longer
    matches the index; the shard keeps its size)."""
    out = tmp_path_factory.mktemp("ray-damaged") / "wds"
    shutil.copytree(packed, out)
    idx, man = load_index(out, "train"), load_manifest(out)
    pos = 30
    shard = out / man["splits"]["train"]["shards"][int(idx.shard[pos])]["path"]
    with open(shard, "r+b") as f:
        f.seek(int(idx.offset[pos]) + 100)
        data = f.read(4)
        f.seek(int(idx.offset[pos]) + 100)
        f.write(bytes(b ^ 0xFF for b in data))
    return out, idx.key_at(pos)


def test_on_error_raise_fails_naming_shard_and_key(damaged):
    root, key = damaged
    with pytest.raises(ShardCorruptError, match=rf"train-000001\.tar: sample '{key}' is corrupt"):
        read_split(root, "train", decode="eval", image_size=16).take_all()


def test_on_error_skip_leaves_the_sample_out_and_counts_it(damaged, packed):
    root, key = damaged
    src = SplitDatasource(root, "train", decode="train", seed=2, image_size=16,
                          on_error="skip")
    rows = ray.data.read_datasource(src).take_all()
    assert len(rows) == 160 and key not in {r["key"] for r in rows}
    assert src.skipped == [key]
    clean = _by_index(read_split(packed, "train", decode="train", seed=2,
                                 image_size=16).take_all())
    assert all(np.array_equal(r["image"], clean[int(r["index"])]["image"]) for r in rows)
    assert SplitDatasource(root, "train").skipped == []  # nothing skipped without the policy


@pytest.fixture(scope="module")
def warned(tmp_path_factory) -> tuple[Path, str]:
    """6 photos packed; one has 6 junk bytes before its SOS marker (it decodes with the
    libjpeg warning "Corrupt JPEG data: 6 extraneous bytes before marker 0xda" and pack keeps
    it: field case 12). Returns the dataset and that sample's train key."""
    name, why = auto_choice()
    if name == "pil":
        pytest.skip(f"the 'auto' decoder is Pillow, which reports no libjpeg warnings ({why})")
    src = tmp_path_factory.mktemp("warned-src")
    for i, p in enumerate(sorted(SAMPLE.glob("*/*.jpg"))[::37][:6]):
        data = p.read_bytes()
        if i == 3:
            sos = data.index(b"\xff\xda")
            data = data[:sos] + b"\x00\x11junk" + data[sos:]
        (src / p.parent.name).mkdir(exist_ok=True)
        (src / p.parent.name / f"{i:02d}-{p.name}").write_bytes(data)
    out = tmp_path_factory.mktemp("warned") / "wds"
    pack(src, out, progress=False)
    from shardkit.dataset.manifest import read_split_records

    keys = [r["key"] for r in read_split_records(out, "train") if r["path"].split("/")[1][:3]
            == "03-"]
    assert len(keys) == 1
    return out, keys[0]


def test_on_warning_keep_skip_raise(warned):
    root, key = warned
    n = len(ShardSource(root, "train"))
    kept = read_split(root, "train", decode="eval", image_size=16).take_all()
    assert len(kept) == n and key in {r["key"] for r in kept}
    src = SplitDatasource(root, "train", decode="eval", image_size=16, on_warning="skip")
    rows = ray.data.read_datasource(src).take_all()
    assert sorted(r["key"] for r in rows) == sorted(r["key"] for r in kept if r["key"] != key)
    assert src.skipped == [key]
    with pytest.raises(DecodeWarningError, match=rf"sample '{key}'.*extraneous bytes"):
        read_split(root, "train", decode="eval", image_size=16, on_error="skip",
                   on_warning="raise").take_all()


def test_rows_of_a_task_without_ray_tasks(packed):
    """The task body alone (what a Ray worker runs): column batches of at most 64 rows, in the
    task's order."""
    from shardkit.ray.tasks import ROWS_PER_BATCH, read_rows

    src = SplitDatasource(packed, "train", decode="eval", image_size=8)
    task = src.get_read_tasks(1)[0]
    spec, rows = task.read_fn.args[:2]
    batches = list(read_rows(spec, rows))
    assert [len(b["index"]) for b in batches] == [len(rows.positions)]  # 24 <= ROWS_PER_BATCH
    assert ROWS_PER_BATCH == 64
    b = batches[0]
    assert b["image"].shape == (len(rows.positions), 8, 8, 3) and b["image"].dtype == np.uint8
    assert b["index"].tolist() == rows.positions.tolist() and b["label"].dtype == np.int64
