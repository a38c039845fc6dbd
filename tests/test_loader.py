"""make_loader / ShardLoader / DeviceNormalizer on real photos, on both backends (decoding threads,
the default, and DataLoader worker processes): exact len (case 18), epoch reaching persistent
workers, resume with another num_workers, determinism and augmentation RNG (case 17), exact vs
stream epochs (case 3), even-out over ranks, class balance, skip and decoder-warning policies
(case 12), start methods and hangs (case 19), close(), normalisation on the device."""
from __future__ import annotations

import logging
import os
import pickle
import threading

import numpy as np
import pytest
import torch

from shardkit.decode import DecodeWarningError, auto_choice
from shardkit.errors import ConfigError, DecodeError, LoaderError, ShardCorruptError
from shardkit.dataset.manifest import load_index
from shardkit.stream import (DeviceNormalizer, MapShardDataset, SamplingOptions, WorkerOptions,
                             make_loader)
from shardkit.stream.backends import ProcessBackend, ThreadBackend
from shardkit.transforms import IMAGENET_MEAN, IMAGENET_STD, TransformConfig
from helpers import build_split

S = 16  # tiny output side keeps decode cheap on 2 shared cores (the ROI decoder DCT-scales)
NO_SHUFFLE = SamplingOptions(shuffle=False)
BACKENDS = ("thread", "process")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Each loader test whose meaning covers both backends runs on threads and processes."""
    return request.param


def _workers(backend: str, **kw) -> WorkerOptions:
    return WorkerOptions(backend=backend, **kw)


@pytest.fixture(scope="module")
def case18(sample_dir, tmp_path_factory):
    """Case 18's repro: 10 shards x 97 real photos (the 200 sample photos reused)."""
    out = tmp_path_factory.mktemp("case18")
    build_split(sample_dir, out, "wds", [97] * 10)
    return out


@pytest.fixture(scope="module")
def small(sample_dir, tmp_path_factory):
    """train: 4 uneven lmdb shards (13, 5, 11, 7 = 36); val: 1 shard of 9."""
    out = tmp_path_factory.mktemp("small")
    build_split(sample_dir, out, "lmdb", [13, 5, 11, 7], stride=5)  # all 5 classes
    build_split(sample_dir, out, "lmdb", [9], split="val", start=2, stride=21)
    return out


def _epoch(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [(x, y, m["index"]) for x, y, m in loader]


def _shardkit_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("shardkit")}


def _worker_pids(loader) -> set[int]:
    """PIDs of the live DataLoader worker processes of a process-backend loader."""
    it = loader.dataloader._iterator  # set only while persistent workers are alive
    return set() if it is None else {w.pid for w in it._workers}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("backend,num_workers,persistent", [
    ("thread", 0, False), ("thread", 2, False), ("process", 2, False), ("process", 2, True)])
def test_len_is_exact_and_every_epoch_reshuffles(case18, backend, num_workers, persistent):
    """Case 18: 970 samples, batch 16 -> len 61 == batches yielded; order changes every epoch
    (with persistent worker processes too: the epoch reaches them); each epoch is exactly-once.
    (The case uses 3 workers; 2 here for the 2-core machine - 61 batches split unevenly over 2
    workers too.)"""
    loader = make_loader(case18, "train", 16, num_workers=num_workers, image_size=S, seed=5,
                         workers=_workers(backend, persistent_workers=persistent),
                         return_meta=True)
    assert loader.backend_name == backend and len(loader) == 61
    orders = []
    for epoch in range(3):
        got = _epoch(loader, epoch)
        assert len(got) == len(loader) == 61
        idx = torch.cat([i for _, _, i in got]).numpy()
        assert np.array_equal(np.sort(idx), np.arange(970))
        assert [len(i) for _, _, i in got] == [16] * 60 + [10]
        orders.append(idx)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    # same seed + epoch -> same order, whatever num_workers and backend
    ref = make_loader(case18, "train", 16, num_workers=0, image_size=S, seed=5, return_meta=True)
    assert np.array_equal(torch.cat([i for _, _, i in _epoch(ref, 2)]).numpy(), orders[2])
    loader.close()


def test_batches_are_channels_last_uint8_with_labels(small):
    loader = make_loader(small, "train", 8, num_workers=0, image_size=S, train=False)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, S, S) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    index = load_index(small, "train")
    assert labels.dtype == torch.int64 and labels.tolist() == index.label[:8].tolist()
    assert 20 < images.float().mean() < 235  # real photo pixels, not an empty buffer


def test_default_backend_is_threads_and_attributes_describe_it(small):
    loader = make_loader(small, "train", 4, num_workers=2, image_size=S)
    assert isinstance(loader.backend, ThreadBackend) and loader.backend_name == "thread"
    assert loader.dataloader is None and loader.start_method is None
    assert loader.transform_config == TransformConfig(image_size=S)
    proc = make_loader(small, "train", 4, num_workers=2, image_size=S,
                       workers=_workers("process"))
    assert isinstance(proc.backend, ProcessBackend) and proc.backend_name == "process"
    assert proc.dataloader.num_workers == 2 and proc.start_method in ("fork", "forkserver",
                                                                      "spawn")
    s = proc.dataset.sampling
    assert (s.rank, s.world_size, s.even, s.streams, s.seed) == (0, 1, None, 1, 0)


def test_eval_loader_matches_the_eval_transform_per_sample(small, backend):
    from shardkit.transforms import make_transform

    tf = make_transform(TransformConfig(image_size=S), train=False)
    ds = MapShardDataset(small, "val", transform=tf)
    loader = make_loader(small, "val", 4, num_workers=2, image_size=S, train=False,
                         workers=_workers(backend))
    images = torch.cat([x for x, _ in loader])
    assert images.shape[0] == 9
    for i in range(9):
        assert np.array_equal(images[i].permute(1, 2, 0).numpy(), ds[i]["image"])


def test_split_name_sets_the_mode_val_is_eval_and_train_shuffles(packed_sample, backend,
                                                                  caplog):
    """``train`` unset: "val" gets the eval transform (pixel-equal to the eval transform per
    sample), plan order and the same batches on every iteration and epoch; "train" gets the
    training crop and a new order each epoch. One INFO line per loader says which."""
    from shardkit.transforms import make_transform

    root = packed_sample("wds")
    kw = dict(num_workers=2, image_size=S, workers=_workers(backend), return_meta=True, seed=4)
    with caplog.at_level(logging.INFO, logger="shardkit.stream"):
        val = make_loader(root, "val", 8, **kw)
        train = make_loader(root, "train", 8, **kw)
    notes = [r.getMessage() for r in caplog.records if "from the split's name" in r.getMessage()]
    assert len(notes) == 2, notes
    assert "split 'val': train=False" in notes[0] and "split 'train': train=True" in notes[1]
    assert (val.train, val.dataset.sampling.shuffle) == (False, False)
    assert (train.train, train.dataset.sampling.shuffle) == (True, True)

    first, again = _epoch(val), _epoch(val, 3)
    assert np.array_equal(torch.cat([i for _, _, i in first]).numpy(), np.arange(30))
    assert len(first) == len(again) == 4
    for (x, y, i), (x2, y2, i2) in zip(first, again):
        assert torch.equal(i, i2) and torch.equal(y, y2) and torch.equal(x, x2)
    tf = make_transform(TransformConfig(image_size=S), train=False)
    ds = MapShardDataset(root, "val", transform=tf)
    images = torch.cat([x for x, _, _ in first])
    for k in range(30):
        assert np.array_equal(images[k].permute(1, 2, 0).numpy(), ds[k]["image"]), k

    e0, e1 = (torch.cat([i for _, _, i in _epoch(train, e)]).numpy() for e in (0, 1))
    assert np.array_equal(np.sort(e0), np.arange(140)) and np.array_equal(np.sort(e1),
                                                                          np.arange(140))
    assert not np.array_equal(e0, np.arange(140)) and not np.array_equal(e0, e1)
    explicit = make_loader(root, "train", 8, train=True, **kw)
    evaluated = make_loader(root, "train", 8, train=False, **kw)
    got, want, plain = _epoch(train, 2), _epoch(explicit, 2), _epoch(evaluated, 2)
    assert all(torch.equal(x, w) for (x, _, _), (w, _, _) in zip(got, want))
    assert not torch.equal(torch.cat([x for x, _, _ in got])[:8], plain[0][0])  # random crops
    for loader in (val, train, explicit, evaluated):
        loader.close()


def test_train_true_on_an_eval_split_works_and_warns_once(packed_sample, caplog):
    root = packed_sample("wds")
    with caplog.at_level(logging.INFO, logger="shardkit.stream"):
        loader = make_loader(root, "val", 8, num_workers=0, image_size=S, train=True,
                             return_meta=True, seed=4)
        orders = [torch.cat([i for _, _, i in _epoch(loader, e)]).numpy() for e in (0, 1)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "split 'val' with train=True" in warnings[0] and "evaluation split" in warnings[0]
    assert not any("from the split's name" in r.getMessage() for r in caplog.records)
    assert loader.train and loader.dataset.sampling.shuffle
    for order in orders:  # honoured: shuffled, still exactly once
        assert np.array_equal(np.sort(order), np.arange(30))
        assert not np.array_equal(order, np.arange(30))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardkit.stream"):
        for split, train in (("val", False), ("val", None), ("train", True), ("train", False)):
            make_loader(root, split, 8, num_workers=0, image_size=S, train=train).close()
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    with pytest.raises(ConfigError, match=r"train='yes': expected True, False or None"):
        make_loader(root, "val", 8, train="yes")


@pytest.mark.parametrize("split,train", [
    ("dev", False), ("Validation", False), ("valid", False), ("eval", False), ("TEST", False),
    ("holdout", True), ("train2", True)])
def test_eval_split_names(sample_dir, tmp_path, split, train):
    """val, validation, valid, test, dev, eval (any case) are eval splits; other names train.
    make_loader and ShardDataset resolve the mode, and shuffle=None from it, alike."""
    from shardkit.stream import ShardDataset
    from shardkit.stream.options import is_eval_split

    build_split(sample_dir, tmp_path, "wds", [5], split=split)
    assert is_eval_split(split) is not train
    loader = make_loader(tmp_path, split, 4, image_size=8, num_workers=0)
    ds = ShardDataset(tmp_path, split, decode=False)
    assert loader.train is train and loader.dataset.sampling.shuffle is train
    assert ds.train is train and ds.sampling.shuffle is train


def test_determinism_and_augmentation_rng_independent_of_workers(small, backend):
    """Case 17: crops differ between samples and epochs, are identical for any num_workers and
    either backend, and for two runs with the same seed, and differ for another seed."""
    def run(be, nw, epoch, seed=0):
        loader = make_loader(small, "train", 5, num_workers=nw, image_size=S, seed=seed,
                             sampling=NO_SHUFFLE, workers=_workers(be))
        loader.set_epoch(epoch)
        return torch.cat([x for x, _ in loader])

    a0 = run("thread", 0, 0)
    assert torch.equal(a0, run(backend, 2, 0))
    a1 = run(backend, 2, 1)
    assert not torch.equal(a0, a1)  # same samples (no shuffle), new crops in a new epoch
    assert not torch.equal(a0, run(backend, 0, 0, seed=1))
    # the same photo at two positions in one epoch gets two different crops
    assert all(not torch.equal(a0[i], a1[i]) for i in range(0, 36, 7))


@pytest.mark.parametrize("epoch", [3, 600])
def test_each_row_is_the_transform_of_its_position_rng(small, backend, epoch):
    """Case 17, the contract itself: row ``j`` of a shuffled epoch is the factory's transform
    of its sample's bytes drawn from ``sample_rng(seed, epoch, 0, j)``, on both backends (the
    loader re-keys one generator per thread; ``SampleRng``). At epoch 600 neighbouring
    positions shared a generator while the key went through float64."""
    from shardkit.sharding import sample_rng
    from shardkit.stream.source import ShardSource
    from shardkit.transforms import make_transform

    loader = make_loader(small, "train", 8, num_workers=2, image_size=S, seed=11,
                         workers=_workers(backend), return_meta=True)
    images = _epoch(loader, epoch)
    source, tf = ShardSource(small, "train"), make_transform(TransformConfig(image_size=S), True)
    j = 0
    for x, _, index in images:
        for row, pos in zip(x.permute(0, 2, 3, 1).numpy(), index.tolist()):
            want = tf(bytes(source.read(pos)), sample_rng(11, epoch, 0, j))
            assert np.array_equal(row, want), (j, pos)
            j += 1
    assert j == 36 and len({x[i].sum().item() for x, _, _ in images for i in range(len(x))}) > 30


def test_same_photo_gets_different_crops_on_different_workers(case18, backend):
    """Case 17: samples i and i + 200 are the same photo; with batch 16 and 2 workers, positions
    8..15 (batch 0, worker 0) and 208..215 (batch 13, worker 1) must get different crops."""
    loader = make_loader(case18, "train", 16, num_workers=2, image_size=S, sampling=NO_SHUFFLE,
                         workers=_workers(backend))
    images = torch.cat([x for x, _ in loader])
    assert all(not torch.equal(images[i], images[i + 200]) for i in range(8, 16))


@pytest.mark.parametrize("backend,persistent", [("thread", False), ("process", True)],
                         ids=["thread-pool", "persistent-processes"])
def test_load_state_dict_reaches_live_workers(small, backend, persistent):
    """A resume on the same loader whose workers outlive the epoch (the thread pool; persistent
    worker processes, which read the resume point from shared memory): the rest of the epoch,
    from the same workers."""
    before = _shardkit_threads()
    loader = make_loader(small, "train", 4, num_workers=2, image_size=S, seed=3,
                         workers=_workers(backend, persistent_workers=persistent),
                         return_meta=True)
    ref = torch.cat([m["index"] for _, _, m in loader]).tolist()

    def live():
        return _worker_pids(loader) if persistent else _shardkit_threads() - before

    workers = live()
    assert 1 <= len(workers) <= 2
    loader.set_epoch(0)
    head = []
    for k, (_, _, m) in enumerate(loader):
        head += m["index"].tolist()
        if k == 2:
            break
    state = loader.state_dict()
    assert (state["epoch"], state["batches_consumed"]) == (0, 3)
    loader.load_state_dict(state)
    tail = torch.cat([m["index"] for _, _, m in loader]).tolist()
    assert head + tail == ref and len(tail) == 36 - 12
    assert live() == workers  # the same threads / worker processes did the resume
    loader.close()


def test_resume_mid_epoch_with_other_num_workers(small, backend):
    w = _workers(backend)
    full = make_loader(small, "train", 4, num_workers=0, image_size=S, seed=3, return_meta=True)
    ref = _epoch(full, 1)
    first = make_loader(small, "train", 4, num_workers=2, image_size=S, seed=3, workers=w,
                        return_meta=True)
    first.set_epoch(1)
    seen = []
    for k, (x, y, m) in enumerate(first):
        seen.append((x, y, m["index"]))
        if k == 3:
            break
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batches_consumed"] == 4
    state = pickle.loads(pickle.dumps(state))
    for nw in (0, 1):
        resumed = make_loader(small, "train", 4, num_workers=nw, image_size=S, seed=3, workers=w,
                              return_meta=True)
        resumed.load_state_dict(state)
        resumed.set_epoch(1)  # same epoch: the resume point stays
        rest = _epoch(resumed)
        both = seen + rest
        assert len(rest) == len(ref) - 4 == 5
        for (x, y, i), (rx, ry, ri) in zip(both, ref):
            assert torch.equal(i, ri) and torch.equal(y, ry) and torch.equal(x, rx)
        assert resumed.state_dict()["batches_consumed"] == 9
        assert len(_epoch(resumed)) == 9  # next iteration is a full epoch again
    bad = make_loader(small, "train", 4, num_workers=0, image_size=S, seed=4, workers=w)
    with pytest.raises(LoaderError, match="seed=3"):
        bad.load_state_dict(state)
    with pytest.raises(LoaderError, match=r"batches_consumed=10 not in \[0, 9\]"):
        full.load_state_dict({**state, "batches_consumed": 10})


def test_resume_keeps_the_saved_streams_plan(small, backend):
    """Shard-block order with one contiguous range per worker (streams = 2) depends on the
    worker count at start; a resume with another num_workers adopts the saved plan."""
    blocks = SamplingOptions(block=True)
    kw = dict(image_size=S, sampling=blocks, workers=_workers(backend), return_meta=True)
    full = make_loader(small, "train", 4, num_workers=2, **kw)
    assert full.dataset.sampling.streams == 2 and full.state_dict()["streams"] == 2
    ref = [m["index"].tolist() for _, _, m in full]
    first = make_loader(small, "train", 4, num_workers=2, **kw)
    head = []
    for k, (_, _, m) in enumerate(first):
        head.append(m["index"].tolist())
        if k == 2:
            break
    resumed = make_loader(small, "train", 4, num_workers=1, **kw)
    assert resumed.dataset.sampling.streams == 1
    resumed.load_state_dict(first.state_dict())
    assert resumed.dataset.sampling.streams == 2
    assert head + [m["index"].tolist() for _, _, m in resumed] == ref


def test_every_rank_same_batches_under_pad_and_drop(small, backend):
    for even, per_rank in (("pad", 8), ("drop", 7)):  # 36 samples over 5 ranks
        counts, valid_idx = [], []
        for rank in range(5):
            loader = make_loader(small, "train", 2, num_workers=1, image_size=S,
                                 sampling=SamplingOptions(rank=rank, world_size=5, even=even),
                                 workers=_workers(backend), return_meta=True)
            batches = list(loader)
            counts.append((len(loader), len(batches), sum(len(b[1]) for b in batches)))
            valid_idx += [int(i) for _, _, m in batches for i in m["index"][m["valid"]]]
        assert counts == [(-(-per_rank // 2), -(-per_rank // 2), per_rank)] * 5
        if even == "pad":
            assert sorted(valid_idx) == list(range(36))
    # pad is the default for training under world_size > 1
    assert make_loader(small, "train", 2, num_workers=0, image_size=S,
                       sampling=SamplingOptions(rank=0, world_size=5)
                       ).dataset.sampling.even == "pad"


def test_eval_is_exactly_once_over_ranks_and_workers(small, backend):
    idx = []
    for rank in range(4):  # 9 val samples over 4 ranks x 2 workers: some consumers get nothing
        loader = make_loader(small, "val", 2, num_workers=2, image_size=S, train=False,
                             sampling=SamplingOptions(rank=rank, world_size=4),
                             workers=_workers(backend), return_meta=True)
        batches = list(loader)
        assert len(batches) == len(loader)
        idx += [int(i) for _, _, m in batches for i in m["index"]]
    assert sorted(idx) == list(range(9))


def test_exact_and_stream_epoch_lengths_are_global(sample_dir, tmp_path):
    """Case 3 (scaled: 4 shards x 64): exact gives each sample once; stream gives the requested
    global count whatever num_workers, with repeats; val refuses stream."""
    build_split(sample_dir, tmp_path, "wds", [64] * 4)
    build_split(sample_dir, tmp_path, "wds", [8], split="val")
    for nw in (0, 2):
        exact = make_loader(tmp_path, "train", 32, num_workers=nw, image_size=8,
                            return_meta=True)
        idx = torch.cat([m["index"] for _, _, m in exact]).numpy()
        assert len(idx) == len(np.unique(idx)) == 256
        total, uniq = 0, set()
        for rank in range(2):
            opts = SamplingOptions(mode="stream", samples_per_epoch=256, rank=rank, world_size=2)
            stream = make_loader(tmp_path, "train", 32, num_workers=nw, image_size=8,
                                 sampling=opts, return_meta=True)
            got = torch.cat([m["index"] for _, _, m in stream]).numpy()
            total += len(got)
            uniq |= set(got.tolist())
        assert total == 256 and 140 < len(uniq) < 190  # ~63% unique with replacement
    with pytest.raises(LoaderError, match="split 'val'"):
        make_loader(tmp_path, "val", 4, sampling=SamplingOptions(mode="stream"), train=True,
                    image_size=8)
    with pytest.raises(LoaderError, match="train=False"):
        make_loader(tmp_path, "val", 4, sampling=SamplingOptions(mode="stream"), train=False,
                    image_size=8)
    with pytest.raises(LoaderError, match="even='pad'"):
        make_loader(tmp_path, "val", 4, sampling=SamplingOptions(even="pad"), train=False,
                    image_size=8)


def test_class_balanced_sampling(sample_dir, tmp_path):
    build_split(sample_dir, tmp_path, "wds", [30, 30], start=20)  # 20 daisy + 40 dandelion
    labels = load_index(tmp_path, "train").label
    assert np.bincount(labels).tolist() == [20, 40]
    opts = SamplingOptions(mode="stream", balance="class", samples_per_epoch=1500)
    loader = make_loader(tmp_path, "train", 100, num_workers=0, image_size=8, sampling=opts,
                         return_meta=True)
    got = torch.cat([y for _, y, _ in loader]).numpy()
    assert len(got) == 1500
    freq = np.bincount(got, minlength=2) / len(got)
    np.testing.assert_allclose(freq, [0.5, 0.5], atol=0.04)  # natural frequencies: 1/3, 2/3
    idx = torch.cat([m["index"] for _, _, m in loader]).numpy()
    assert set(idx.tolist()) == set(range(60))  # every sample still drawn (~12-25 times)


def test_skip_policy_counts_and_default_raises_naming_shard_and_key(sample_dir, tmp_path,
                                                                     backend, caplog):
    build_split(sample_dir, tmp_path, "hdf5", [6])
    import h5py

    with h5py.File(tmp_path / "shards/train-000000.h5", "r+") as f:
        start, stop = f["offsets"][2:4]  # same size, so the shard check passes and decoding fails
        f["images"][start:stop] = np.frombuffer(b"\xff\xd8\xff\xe0" + b"\x00" * (stop - start - 4),
                                                np.uint8)
    kw = dict(num_workers=1, image_size=S, sampling=NO_SHUFFLE, workers=_workers(backend))
    # by default the read checksum catches the damage before the decoder sees it
    with pytest.raises(ShardCorruptError, match=r"train-000000\.h5: sample 'train_00000002' is "
                                                 r"corrupt: xxh3"):
        list(make_loader(tmp_path, "train", 4, **kw))
    kw["verify_reads"] = False  # the decode-failure path itself
    with pytest.raises(DecodeError, match=r"train-000000\.h5.*'train_00000002'"):
        list(make_loader(tmp_path, "train", 4, **kw))
    loader = make_loader(tmp_path, "train", 4, on_error="skip", return_meta=True, **kw)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardkit.stream"):
        batches = list(loader)
    assert [len(y) for _, y, _ in batches] == [3, 2]
    assert loader.skipped == ["train_00000002"]
    assert 2 not in torch.cat([m["index"] for _, _, m in batches]).tolist()
    if backend == "thread":  # a worker process logs in its own process, not to caplog
        msgs = [r.getMessage() for r in caplog.records if r.name == "shardkit.stream"]
        assert len(msgs) == 1
        assert msgs[0].startswith("on_error='skip': skipped sample 'train_00000002' of shard "
                                  "shards/train-000000.h5")


@pytest.fixture(scope="module")
def warned_split(sample_dir, tmp_path_factory):
    """6 real photos in one wds shard; the photo of key ``train_00000003`` has 6 junk bytes
    before its SOS marker (a JPEG that decodes with the libjpeg warning "Corrupt JPEG data: 6
    extraneous bytes before marker 0xda", as pack accepts it: field case 12)."""
    name, why = auto_choice()
    if name == "pil":
        pytest.skip(f"the 'auto' decoder is Pillow, which reports no libjpeg warnings ({why})")
    src = tmp_path_factory.mktemp("warned-src")
    photos = sorted(sample_dir.glob("*/*.jpg"))[::37][:6]  # across classes
    for i, p in enumerate(photos):
        data = p.read_bytes()
        if i == 3:
            sos = data.index(b"\xff\xda")
            data = data[:sos] + b"\x00\x11junk" + data[sos:]
        (src / p.parent.name).mkdir(exist_ok=True)
        (src / p.parent.name / f"{i:02d}-{p.name}").write_bytes(data)
    out = tmp_path_factory.mktemp("warned")
    records = build_split(src, out, "wds", [6])
    assert records[3]["path"].split("/")[1].startswith("03-")
    return out


@pytest.mark.parametrize("policy", ["keep", "skip", "raise"])
def test_decoder_warning_policy(warned_split, backend, policy, caplog):
    """Case 12 at read time: on_warning="keep" yields the sample and lists its key in
    ``loader.warned`` (logged once); "skip" leaves it out (``loader.skipped``); "raise" stops
    with DecodeWarningError naming shard, key and the libjpeg message."""
    key = "train_00000003"
    loader = make_loader(warned_split, "train", 4, num_workers=1, image_size=S, train=False,
                         on_warning=policy, workers=_workers(backend), return_meta=True)
    if policy == "raise":
        with pytest.raises(DecodeWarningError,
                           match=rf"train-000000\.tar: sample '{key}'.*extraneous bytes"):
            list(loader)
        return
    with caplog.at_level(logging.WARNING, logger="shardkit.stream"):
        batches = list(loader)
        list(loader)  # a second epoch: counted again, logged once
    idx = torch.cat([m["index"] for _, _, m in batches]).tolist()
    if policy == "keep":
        assert idx == list(range(6)) and [len(y) for _, y, _ in batches] == [4, 2]
        assert loader.warned == [key, key] and loader.skipped == []
        kept = [r.getMessage() for r in caplog.records if "libjpeg warnings" in r.getMessage()]
        assert kept == [f"sample '{key}' decoded with libjpeg warnings and was kept "
                        "(on_warning='keep'; keys in loader.warned)"]
    else:
        assert idx == [0, 1, 2, 4, 5] and [len(y) for _, y, _ in batches] == [3, 2]
        assert loader.skipped == [key, key] and loader.warned == []


def test_on_warning_raise_is_not_swallowed_by_on_error_skip(warned_split):
    """on_error covers samples that fail to read or decode; a sample that decodes with warnings
    under on_warning="raise" must still raise."""
    loader = make_loader(warned_split, "train", 4, num_workers=0, image_size=S, train=False,
                         on_error="skip", on_warning="raise")
    with pytest.raises(DecodeWarningError, match="'train_00000003'"):
        list(loader)


def test_close_stops_decoding_threads_and_the_loader_iterates_again(small):
    before = _shardkit_threads()
    loader = make_loader(small, "train", 4, num_workers=2, image_size=S, return_meta=True)
    ref = torch.cat([m["index"] for _, _, m in loader])
    mine = _shardkit_threads() - before
    assert 1 <= len(mine) <= 2 and all(t.is_alive() for t in mine)
    loader.close()
    assert not _shardkit_threads() & mine and not any(t.is_alive() for t in mine)
    again = torch.cat([m["index"] for _, _, m in loader])  # a closed loader starts new threads
    assert torch.equal(again, ref)
    assert 1 <= len(_shardkit_threads() - before) <= 2
    loader.close()
    loader.close()  # closing twice is harmless
    assert not _shardkit_threads() - before


def test_close_stops_persistent_worker_processes_and_the_loader_iterates_again(small):
    loader = make_loader(small, "train", 4, num_workers=2, image_size=S, return_meta=True,
                         workers=_workers("process", persistent_workers=True))
    ref = torch.cat([m["index"] for _, _, m in loader])
    pids = _worker_pids(loader)
    assert len(pids) == 2 and all(_pid_alive(p) for p in pids)
    loader.close()
    assert _worker_pids(loader) == set() and not any(_pid_alive(p) for p in pids)
    again = torch.cat([m["index"] for _, _, m in loader])
    assert torch.equal(again, ref)
    fresh = _worker_pids(loader)
    assert len(fresh) == 2 and not fresh & pids
    loader.close()
    assert not any(_pid_alive(p) for p in fresh)


def test_loader_as_context_manager(small, backend):
    before = _shardkit_threads()
    persistent = backend == "process"
    with make_loader(small, "val", 4, num_workers=2, image_size=S, train=False,
                     workers=_workers(backend, persistent_workers=persistent)) as loader:
        labels = torch.cat([y for _, y in loader])
        pids = _worker_pids(loader) if persistent else set()
    assert labels.tolist() == load_index(small, "val").label.tolist()
    assert not _shardkit_threads() - before
    assert not any(_pid_alive(p) for p in pids)


@pytest.mark.parametrize("method", [pytest.param("forkserver", marks=pytest.mark.slow), "spawn"])
def test_start_methods_with_persistent_workers(small, method):
    """Case 19: datasets pickle cleanly; timeout set; start method exposed; the epoch reaches
    persistent spawn/forkserver workers (one worker: each spawn start costs seconds here)."""
    loader = make_loader(small, "train", 6, num_workers=1, image_size=8, return_meta=True,
                         workers=_workers("process", persistent_workers=True,
                                          multiprocessing_context=method))
    assert loader.start_method == method and loader.dataloader.timeout == 120
    pickle.dumps(loader.dataset)
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        idx = torch.cat([m["index"] for _, _, m in loader]).numpy()
        assert np.array_equal(np.sort(idx), np.arange(36))
        orders.append(idx)
    assert not np.array_equal(*orders)
    loader.close()


def test_thread_loader_refuses_to_pickle(small):
    loader = make_loader(small, "train", 4, num_workers=1, image_size=8)
    with pytest.raises(TypeError, match="thread-backend ShardLoader cannot be pickled"):
        pickle.dumps(loader)


def test_forkserver_default_for_pinned_ddp_loaders(small):
    loader = make_loader(small, "train", 4, num_workers=1, pin_memory=True, image_size=8,
                         sampling=SamplingOptions(rank=1, world_size=2),
                         workers=_workers("process"))
    assert loader.start_method == "forkserver"
    assert make_loader(small, "train", 4, num_workers=0, image_size=8,
                       workers=_workers("process")).start_method is None


def test_invalid_options(small):
    with pytest.raises(ConfigError, match="batch_size=0"):
        make_loader(small, "train", 0)
    with pytest.raises(ConfigError, match="timeout=0"):
        make_loader(small, "train", 2, workers=WorkerOptions(timeout=0))
    with pytest.raises(ConfigError, match="backend='fibre'"):
        WorkerOptions(backend="fibre")
    with pytest.raises(ConfigError, match="balance='class' resamples"):
        make_loader(small, "train", 2, sampling=SamplingOptions(balance="class"), image_size=8)
    with pytest.raises(ConfigError, match="on_warning='ignore'"):
        make_loader(small, "train", 2, on_warning="ignore", image_size=8)
    with pytest.raises(ConfigError, match="sampling= takes a SamplingOptions"):
        make_loader(small, "train", 2, sampling={"shuffle": False}, image_size=8)
    with pytest.raises(ConfigError, match="needs image_size="):
        make_loader(small, "train", 2, transform=lambda data, rng, out=None: out)
    with pytest.raises(ConfigError, match="image_size=8 disagrees with transform.image_size=16"):
        make_loader(small, "train", 2, image_size=8, transform=TransformConfig(image_size=16))
    with pytest.raises(TypeError, match="shuffle"):
        make_loader(small, "train", 2, shuffle=False)  # the flat keywords are gone


def test_device_normalizer_cpu(small):
    loader = make_loader(small, "val", 4, num_workers=0, image_size=S, train=False)
    norm = DeviceNormalizer(loader, "cpu", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert len(norm) == len(loader) == 3
    raw = [x for x, _ in loader]
    for (x, y), r in zip(norm, raw):
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x, (r.float() - 127.5) / 63.75)
        assert y.dtype == torch.int64


def test_device_normalizer_takes_mean_std_from_the_transform_config(small):
    """No mean/std given: the loader's TransformConfig statistics, ImageNet's by default and
    for a custom transform callable (no TransformConfig)."""
    cfg = TransformConfig(image_size=S, mean=(0.5, 0.25, 0.75), std=(0.25, 0.5, 0.125))
    loader = make_loader(small, "val", 4, num_workers=0, train=False, transform=cfg)
    assert loader.transform_config is cfg
    raw = [x for x, _ in loader]
    mean = torch.tensor([0.5, 0.25, 0.75]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.25, 0.5, 0.125]).view(1, 3, 1, 1) * 255
    got = [x for x, _ in DeviceNormalizer(loader, "cpu")]
    assert len(got) == len(raw) == 3
    for x, r in zip(got, raw):
        torch.testing.assert_close(x, (r.float() - mean) / std)
    imagenet = make_loader(small, "val", 4, num_workers=0, image_size=S, train=False)
    net_mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    net_std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255
    x, _ = next(iter(DeviceNormalizer(imagenet, "cpu")))
    torch.testing.assert_close(x, (raw[0].float() - net_mean) / net_std)
    from shardkit.transforms import make_transform

    custom = make_loader(small, "val", 4, num_workers=0, train=False, image_size=S,
                         transform=make_transform(cfg, train=False))
    assert custom.transform_config is cfg  # the factory's transform carries its config
    plain = make_loader(small, "val", 4, num_workers=0, train=False, image_size=S,
                        transform=_EvalCallable(make_transform(cfg, train=False)))
    assert plain.transform_config is None
    x, _ = next(iter(DeviceNormalizer(plain, "cpu")))
    torch.testing.assert_close(x, (raw[0].float() - net_mean) / net_std)


class _EvalCallable:
    """A custom transform callable without a TransformConfig (wraps the eval transform)."""

    def __init__(self, tf):
        self.tf = tf

    def __call__(self, data, rng, out=None):
        return self.tf(data, rng, out=out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_normalizer_cuda_streams_pinned(small, backend):
    loader = make_loader(small, "train", 4, num_workers=2, image_size=S, pin_memory=True,
                         sampling=NO_SHUFFLE, workers=_workers(backend))
    raw = [x for x, _ in make_loader(small, "train", 4, num_workers=0, image_size=S,
                                     sampling=NO_SHUFFLE)]
    got = list(DeviceNormalizer(loader, "cuda"))
    assert len(got) == len(raw) == 9
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    for (x, y), r in zip(got, raw):
        assert x.is_cuda and y.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x.cpu(), (r.float() - mean) / std)
    loader.close()


class _SlowTransform:
    """Stands in for a hung worker: sleeps longer than the loader timeout."""

    def __call__(self, data, rng, out=None):
        import time

        time.sleep(3)
        return out


@pytest.mark.parametrize("backend,pattern", [
    ("process", r"split='train'.*num_workers=1, start_method=\w+.*timeout=1 s"),
    ("thread", r"split='train'.*backend=thread, num_workers=1.*timeout=1 s"),
])
def test_hang_becomes_a_loader_error_naming_the_configuration(small, backend, pattern):
    # batch 1: the hung batch finishes in the background 3 s later (close() would wait for it)
    loader = make_loader(small, "train", 1, num_workers=1, transform=_SlowTransform(),
                         image_size=8, workers=_workers(backend, timeout=1))
    with pytest.raises(LoaderError, match=pattern):
        next(iter(loader))


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5"])
def test_loader_on_packed_sample_every_format(fmt, packed_sample):
    """The real packer's output: train 140 -> 18 batches of 8; val 30 -> 4; exactly-once."""
    root = packed_sample(fmt)
    for split, train, n, nb in (("train", True, 140, 18), ("val", False, 30, 4)):
        loader = make_loader(root, split, 8, num_workers=2, image_size=S, train=train,
                             return_meta=True)
        batches = list(loader)
        assert len(loader) == len(batches) == nb
        idx = torch.cat([m["index"] for _, _, m in batches]).numpy()
        assert np.array_equal(np.sort(idx), np.arange(n))
        labels = torch.cat([y for _, y, _ in batches]).numpy()
        assert np.array_equal(labels, load_index(root, split).label[idx])


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5"])
def test_thread_and_process_backends_yield_identical_batches(fmt, packed_sample):
    """The thread backend is the same plan, order, augmentation and bytes as worker processes:
    every batch is equal, pixel for pixel, over two epochs, and a resume mid-epoch continues
    with the same batches on either backend."""
    root = packed_sample(fmt)
    kw = dict(num_workers=2, image_size=32, return_meta=True, seed=3)
    proc = make_loader(root, "train", 16, workers=_workers("process"), **kw)
    thr = make_loader(root, "train", 16, workers=_workers("thread"), **kw)
    assert thr.backend_name == "thread" and proc.backend_name == "process"
    assert len(thr) == len(proc)
    for epoch in (0, 1):
        proc.set_epoch(epoch)
        thr.set_epoch(epoch)
        a, b = list(proc), list(thr)
        assert len(a) == len(b) == len(thr)
        for (xa, ya, ma), (xb, yb, mb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
            assert torch.equal(ma["index"], mb["index"])
            assert xb.is_contiguous(memory_format=torch.channels_last)
    it = iter(thr)
    next(it)
    next(it)
    state = thr.state_dict()
    for other in ("process", "thread"):  # a thread loader's state resumes on either backend
        resumed = make_loader(root, "train", 16, workers=_workers(other),
                              **{**kw, "num_workers": 1})
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert len(rest) == len(b) - 2
        for (xr, _, mr), (xb, _, mb) in zip(rest, b[2:]):
            assert torch.equal(mr["index"], mb["index"]) and torch.equal(xr, xb)
    thr.close()
