"""ShardDataset / MapShardDataset on real packed photos: exactly-once over ranks x workers for every
format, uneven shards, fewer shards than consumers, LMDB/HDF5 opened before fork (cases 8, 10),
pickling, index memory (case 16), errors naming shard and key."""
from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import pickle

import numpy as np
import pytest
from torch.utils.data import DataLoader

from shardkit.errors import ConfigError, LoaderError, ManifestError, ShardCorruptError
from shardkit.formats import FORMATS
from shardkit.dataset.manifest import load_index
from shardkit.stream import MapShardDataset, SamplingOptions, ShardDataset
from helpers import build_split

ALL = sorted(FORMATS)


def _sha(b) -> str:
    return hashlib.sha256(bytes(b)).hexdigest()


@pytest.fixture(scope="module")
def uneven(sample_dir, tmp_path_factory):
    """Per format: train = 5 uneven shards (17, 3, 9, 1, 10 = 40 samples) of real photos."""
    cache = {}

    def make(fmt):
        if fmt not in cache:
            out = tmp_path_factory.mktemp(f"uneven-{fmt}")
            cache[fmt] = (out, build_split(sample_dir, out, fmt, [17, 3, 9, 1, 10]))
        return cache[fmt]
    return make


def _keys_over_consumers(root, world_size, num_workers, shuffle=False, **kw):
    per_rank = []
    for rank in range(world_size):
        opts = SamplingOptions(shuffle=shuffle, rank=rank, world_size=world_size)
        ds = ShardDataset(root, "train", sampling=opts, decode=False, batch_size=2, **kw)
        dl = DataLoader(ds, batch_size=None, num_workers=num_workers)
        per_rank.append([(s["key"], _sha(s["image"])) for s in dl])
    return per_rank


@pytest.mark.parametrize("fmt", ALL)
def test_exactly_once_over_ranks_and_workers_every_format(fmt, uneven):
    out, records = uneven(fmt)
    want = {r["key"]: r["sha256"] for r in records}
    for world_size, num_workers, shuffle in [(1, 0, False), (3, 2, True), (2, 2, False)]:
        per_rank = _keys_over_consumers(out, world_size, num_workers, shuffle=shuffle, seed=4)
        flat = [k for rank in per_rank for k, _ in rank]
        assert len(flat) == len(set(flat)) == 40  # union == all keys, no overlap
        assert dict(kv for rank in per_rank for kv in rank) == want  # byte-exact vs source


def test_fewer_shards_than_consumers(sample_dir, tmp_path):
    records = build_split(sample_dir, tmp_path, "wds", [7, 4])  # 2 shards, 3 ranks x 2 workers
    per_rank = _keys_over_consumers(tmp_path, 3, 2, shuffle=True)
    assert [len(r) for r in per_rank] == [4, 4, 3]  # every rank gets samples, split inside shards
    assert sorted(k for r in per_rank for k, _ in r) == [r["key"] for r in records]


def test_shuffle_is_deterministic_per_epoch_and_changes_across_epochs(uneven):
    out, _ = uneven("wds")
    shuffled = SamplingOptions(shuffle=True)
    ds = ShardDataset(out, "train", sampling=shuffled, seed=1, decode=False)
    e0 = [s["key"] for s in ds]
    assert e0 == [s["key"] for s in ShardDataset(out, "train", sampling=shuffled, seed=1,
                                                 decode=False)]
    ds.set_epoch(1)
    e1 = [s["key"] for s in ds]
    assert e0 != e1 and sorted(e0) == sorted(e1)
    assert [s["index"] for s in ShardDataset(out, "train", decode=False, train=False)] == \
        list(range(40))
    assert [s["index"] for s in ShardDataset(out, "train", decode=False,
                                             sampling=SamplingOptions(shuffle=False))] == \
        list(range(40))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_shuffle_none_means_the_same_as_in_make_loader(packed_sample, backend):
    """``sampling.shuffle=None`` follows the mode in ShardDataset as in make_loader: the "val"
    split in plan order, the same on every epoch; "train" shuffled, in make_loader's order for
    the same seed and batch size (DataLoader workers or not)."""
    from shardkit.stream import WorkerOptions, make_loader

    root = packed_sample("wds")
    val = ShardDataset(root, "val", decode=False, batch_size=4)
    assert not val.train and val.sampling.shuffle is False
    assert [s["index"] for s in val] == list(range(30))
    val.set_epoch(5)
    # DataLoader batch size == the dataset's worker granularity -> samples in plan order
    assert [i for b in DataLoader(val, batch_size=4, num_workers=2, collate_fn=_indices_of)
            for i in b] == list(range(30))
    train = ShardDataset(root, "train", decode=False, batch_size=8, seed=6)
    assert train.train and train.sampling.shuffle is True
    order = [i for b in DataLoader(train, batch_size=8, num_workers=2, collate_fn=_indices_of)
             for i in b]
    assert sorted(order) == list(range(140)) and order != list(range(140))
    with make_loader(root, "train", 8, seed=6, image_size=8, return_meta=True,
                     workers=WorkerOptions(backend=backend)) as loader:
        assert loader.dataset.sampling.shuffle is True
        assert [int(i) for _, _, m in loader for i in m["index"]] == order
    with make_loader(root, "val", 4, image_size=8, return_meta=True,
                     workers=WorkerOptions(backend=backend)) as loader:
        assert [int(i) for _, _, m in loader for i in m["index"]] == list(range(30))


def _keys_of(samples: list[dict]) -> list[str]:
    return [s["key"] for s in samples]


def _indices_of(samples: list[dict]) -> list[int]:
    return [s["index"] for s in samples]


def test_set_epoch_reaches_persistent_workers(uneven):
    out, _ = uneven("wds")
    ds = ShardDataset(out, "train", sampling=SamplingOptions(shuffle=True), decode=False,
                      batch_size=4)
    # DataLoader batch size == the dataset's worker granularity -> batches arrive in plan order
    dl = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, timeout=60,
                    collate_fn=_keys_of)
    orders = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        orders.append([k for batch in dl for k in batch])
        assert orders[-1] == [s["key"] for s in ds]  # workers follow the main process's epoch
    assert orders[0] != orders[1] != orders[2] and sorted(orders[0]) == sorted(orders[2])


def test_even_pad_and_drop_give_equal_counts(uneven):
    out, _ = uneven("lmdb")
    for even, per in [("pad", 14), ("drop", 13)]:
        got = [list(ShardDataset(out, "train", decode=False,
                                 sampling=SamplingOptions(rank=r, world_size=3, even=even)))
               for r in range(3)]
        assert [len(g) for g in got] == [per] * 3
    pad = [s for r in range(3) for s in ShardDataset(
        out, "train", decode=False, sampling=SamplingOptions(rank=r, world_size=3, even="pad"))]
    assert sorted(s["key"] for s in pad if s["valid"]) == sorted({s["key"] for s in pad})
    assert sum(not s["valid"] for s in pad) == 2  # 42 - 40 wrap-around repeats


def _source_sha(root, split) -> dict[str, str]:
    """key -> sha256 of the source file, for samples stored unchanged (rule "original")."""
    from shardkit.dataset.manifest import read_split_records

    recs = read_split_records(root, split)
    assert recs and all(r["rule"] == "original" for r in recs)  # sample photos are plain JPEGs
    return {r["key"]: r["sha256"] for r in recs}


@pytest.mark.parametrize("fmt", ALL)
def test_packed_sample_every_split_exactly_once_byte_exact(fmt, packed_sample):
    """The real packer's output (embedded 200-photo sample, 32 per shard): 2 ranks x 2 workers
    read every split exactly once, bytes equal to the source files."""
    root = packed_sample(fmt)
    total = 0
    for split in ("train", "val", "test"):
        want = _source_sha(root, split)
        got = {}
        for rank in range(2):
            opts = SamplingOptions(shuffle=True, rank=rank, world_size=2)
            ds = ShardDataset(root, split, sampling=opts, decode=False, batch_size=4)
            for s in DataLoader(ds, batch_size=None, num_workers=2, timeout=60):
                assert s["key"] not in got
                got[s["key"]] = _sha(s["image"])
        assert got == want
        total += len(got)
    assert total == 200


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_opened_in_parent_then_workers_read_byte_exact(fmt, method, packed_sample):
    """Cases 8 and 10 (200 packed photos; 2 workers, not 4, on 2 cores): the parent reads (opens
    the env/file) before workers start; workers under fork (3 epochs) and spawn return source
    bytes; the parent can still read afterwards; the dataset pickles without handles."""
    out = packed_sample(fmt)
    want = _source_sha(out, "train")
    # the parent opens every shard (a full epoch) before any worker exists, through another
    # object that stays alive (like an inspection step or a second loader)
    parent = ShardDataset(out, "train", decode=False)
    assert {s["key"]: _sha(s["image"]) for s in parent} == want
    ds = ShardDataset(out, "train", decode=False, batch_size=3,
                      sampling=SamplingOptions(shuffle=True))
    epochs = 1 if method == "spawn" else 3  # spawn start-up is ~5 s per loader on 2 cores
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        dl = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=method,
                        timeout=120)
        got = {s["key"]: _sha(s["image"]) for s in dl}
        assert got == want
    assert {s["key"]: _sha(s["image"]) for s in parent} == want  # parent reads afterwards
    assert {s["key"]: _sha(s["image"]) for s in ds} == want
    clone = pickle.loads(pickle.dumps(ds))
    assert all(r._handle is None for r in clone.source._readers.values())
    assert {s["key"]: _sha(s["image"]) for s in clone} == want


def test_map_dataset_all_formats_and_decode(uneven):
    for fmt in ALL:
        out, records = uneven(fmt)
        ds = MapShardDataset(out, "train", decode=False)
        assert len(ds) == 40
        assert [_sha(ds[i]["image"]) for i in range(40)] == [r["sha256"] for r in records]
        assert ds[-1]["key"] == "train_00000039" and ds[5]["label"] == records[5]["label"]
        with pytest.raises(IndexError, match="index 40 out of range"):
            ds[40]


def test_decoded_image_is_upright_rgb_uint8(uneven, sample_dir):
    out, records = uneven("wds")
    from PIL import Image

    sample = MapShardDataset(out, "train")[3]
    img = sample["image"]
    with Image.open(sample_dir / records[3]["path"]) as im:
        w, h = im.size
    assert img.dtype == np.uint8 and img.shape == (h, w, 3)


def test_transform_gets_bytes_and_a_position_rng(uneven):
    out, _ = uneven("hdf5")
    tf = lambda data, rng: (len(bytes(data)), float(rng.random()))  # noqa: E731
    shuffled = SamplingOptions(shuffle=True)
    a = [s["image"] for s in ShardDataset(out, "train", transform=tf, sampling=shuffled)]
    b = [s["image"] for s in DataLoader(ShardDataset(out, "train", transform=tf,
                                                     sampling=shuffled),
                                         batch_size=None, num_workers=2)]
    assert a == [tuple(x) for x in b]  # same draws whatever the worker count
    assert len({x[1] for x in a}) == 40  # a different draw per sample


def test_stream_refused_for_eval_and_bad_options(uneven, sample_dir, tmp_path):
    out, _ = uneven("wds")
    build_split(sample_dir, tmp_path, "wds", [5], split="val")
    with pytest.raises(LoaderError, match="split 'val'"):
        ShardDataset(tmp_path, "val", sampling=SamplingOptions(mode="stream"))
    with pytest.raises(ConfigError, match="even='both'"):
        ShardDataset(out, "train", sampling=SamplingOptions(even="both"))
    with pytest.raises(ConfigError, match="on_error='ignore'"):
        ShardDataset(out, "train", on_error="ignore")
    with pytest.raises(ConfigError, match="on_warning='ignore'"):
        ShardDataset(out, "train", on_warning="ignore")
    with pytest.raises(ConfigError, match="rank=3, world_size=2"):
        ShardDataset(out, "train", sampling=SamplingOptions(rank=3, world_size=2))
    with pytest.raises(ConfigError, match="give both rank and world_size"):
        ShardDataset(out, "train", sampling=SamplingOptions(rank=1))
    with pytest.raises(ManifestError, match="'nope'"):
        ShardDataset(out, "nope")
    stream = ShardDataset(out, "train", sampling=SamplingOptions(mode="stream",
                                                                 samples_per_epoch=100),
                          decode=False)
    assert len(stream) == len(list(stream)) == 100


def test_corrupt_shard_raises_naming_shard_and_key_or_skips(sample_dir, tmp_path, caplog):
    build_split(sample_dir, tmp_path, "wds", [4, 4])
    index = load_index(tmp_path, "train")
    shard = tmp_path / "shards/train-000001.tar"
    raw = bytearray(shard.read_bytes())
    head = int(index.offset[5]) - 512
    raw[head:head + 5] = b"XXXXX"  # clobber the member name of train_00000005
    shard.write_bytes(bytes(raw))
    with pytest.raises(ShardCorruptError, match=r"train-000001\.tar.*'train_00000005'"):
        list(ShardDataset(tmp_path, "train", decode=False))
    ds = ShardDataset(tmp_path, "train", decode=False, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardkit.stream"):
        keys = [s["key"] for s in ds]
    skips = [r for r in caplog.records if r.name == "shardkit.stream"]
    assert len(skips) == 1 and skips[0].levelno == logging.WARNING
    assert ("skipped sample 'train_00000005' of shard shards/train-000001.tar"
            in skips[0].getMessage())
    assert len(keys) == 7 and "train_00000005" not in keys and ds.skipped == ["train_00000005"]


def _walk_keys(obj, q):
    import psutil

    before = psutil.Process().memory_full_info()
    if isinstance(obj, list):
        total = sum(len(k) for k in obj)
    else:
        total = sum(len(obj.key_at(i)) for i in range(len(obj)))
    after = psutil.Process().memory_full_info()
    q.put(({"uss": after.uss - before.uss, "pss": after.pss - before.pss}, total))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_index_is_numpy_and_forked_reads_do_not_copy_it(uneven):
    """Case 16, scaled down: a forked worker walking 300k index keys stays within a small USS
    bound, while the same keys held as a Python list of str get copied into the child."""
    out, _ = uneven("wds")
    index = ShardDataset(out, "train", decode=False).source.index
    for name in ("shard", "offset", "size", "label", "key"):
        assert isinstance(getattr(index, name), np.ndarray)
    assert index.key.dtype.kind == "S" and index.label.dtype == np.int64
    big = type(index)(**{f: np.tile(getattr(index, f), 7500) for f in
                         ("shard", "offset", "size", "label", "key")})  # 300k entries
    as_list = [big.key_at(i) for i in range(len(big))]
    ctx = mp.get_context("fork")
    growth = {}
    for name, obj in (("numpy", big), ("list", as_list)):
        q = ctx.Queue()
        p = ctx.Process(target=_walk_keys, args=(obj, q))
        p.start()
        growth[name], total = q.get(timeout=60)
        p.join(60)
        assert total == 300_000 * 14
    # a list of 300k str copies >= 10 MB of pages on read (refcounts); the numpy index does not
    assert growth["list"]["uss"] > 10 * 2**20 and growth["list"]["pss"] > 5 * 2**20
    for kind in ("uss", "pss"):
        assert growth["numpy"][kind] < 0.1 * growth["list"][kind], growth
