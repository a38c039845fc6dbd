"""make_loader / ShardLoader / DeviceNormalizer on real photos: exact len (case 18), epoch reaching
persistent workers, resume with another num_workers, determinism and augmentation RNG (case 17),
exact vs stream epochs (case 3), even-out over ranks, class balance, skip policy, start methods
(case 19), normalisation on the device."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from shardkit.errors import ConfigError, DecodeError, LoaderError
from shardkit.loader import DeviceNormalizer, make_loader
from shardkit.manifest import load_index
from shardkit.transforms import TransformConfig
from test_dataset import build_split

S = 16  # tiny output side keeps decode cheap on 2 shared cores (the ROI decoder DCT-scales)


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
    out = [(x, y, m["index"]) for x, y, m in loader]
    return out


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_len_is_exact_and_epoch_reaches_persistent_workers(case18, num_workers, persistent):
    """Case 18: 970 samples, batch 16 -> len 61 == batches yielded; order changes every epoch
    (also with persistent workers); each epoch is exactly-once. (The case uses 3 workers; 2 here
    for the 2-core machine - 61 batches split unevenly over 2 workers too.)"""
    loader = make_loader(case18, "train", 16, num_workers=num_workers, image_size=S,
                         persistent_workers=persistent, return_meta=True, seed=5)
    assert len(loader) == 61
    orders = []
    for epoch in range(3):
        got = _epoch(loader, epoch)
        assert len(got) == len(loader) == 61
        idx = torch.cat([i for _, _, i in got]).numpy()
        assert np.array_equal(np.sort(idx), np.arange(970))
        assert [len(i) for _, _, i in got] == [16] * 60 + [10]
        orders.append(idx)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    # same seed + epoch -> same order, whatever num_workers
    ref = make_loader(case18, "train", 16, num_workers=0, image_size=S, seed=5, return_meta=True)
    assert np.array_equal(torch.cat([i for _, _, i in _epoch(ref, 2)]).numpy(), orders[2])


def test_batches_are_channels_last_uint8_with_labels(small):
    loader = make_loader(small, "train", 8, num_workers=0, image_size=S, train=False)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, S, S) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    index = load_index(small, "train")
    assert labels.dtype == torch.int64 and labels.tolist() == index.label[:8].tolist()
    assert 20 < images.float().mean() < 235  # real photo pixels, not an empty buffer


def test_eval_loader_matches_the_eval_transform_per_sample(small, sample_dir):
    from shardkit.dataset import MapShardDataset
    from shardkit.transforms import make_transform

    tf = make_transform(TransformConfig(image_size=S), train=False)
    ds = MapShardDataset(small, "val", transform=tf)
    loader = make_loader(small, "val", 4, num_workers=2, image_size=S, train=False)
    images = torch.cat([x for x, _ in loader])
    assert images.shape[0] == 9
    for i in range(9):
        assert np.array_equal(images[i].permute(1, 2, 0).numpy(), ds[i]["image"])


def test_determinism_and_augmentation_rng_independent_of_workers(small):
    """Case 17: crops differ between samples and epochs, are identical for any num_workers and
    for two runs with the same seed, and differ for another seed."""
    def run(nw, epoch, seed=0):
        loader = make_loader(small, "train", 5, num_workers=nw, image_size=S, seed=seed,
                             shuffle=False)
        loader.set_epoch(epoch)
        return torch.cat([x for x, _ in loader])

    a0, b0 = run(0, 0), run(2, 0)
    assert torch.equal(a0, b0)
    a1 = run(2, 1)
    assert not torch.equal(a0, a1)  # same samples (no shuffle), new crops in a new epoch
    assert not torch.equal(a0, run(0, 0, seed=1))
    # the same photo at two positions in one epoch gets two different crops
    assert all(not torch.equal(a0[i], a1[i]) for i in range(0, 36, 7))


def test_same_photo_gets_different_crops_on_different_workers(case18):
    """Case 17: samples i and i + 200 are the same photo; with batch 16 and 2 workers, positions
    8..15 (batch 0, worker 0) and 208..215 (batch 13, worker 1) must get different crops."""
    loader = make_loader(case18, "train", 16, num_workers=2, image_size=S, shuffle=False)
    images = torch.cat([x for x, _ in loader])
    assert all(not torch.equal(images[i], images[i + 200]) for i in range(8, 16))


def test_resume_with_persistent_workers(small):
    loader = make_loader(small, "train", 4, num_workers=2, image_size=S, seed=3,
                         persistent_workers=True, return_meta=True)
    ref = torch.cat([m["index"] for _, _, m in loader]).tolist()
    loader.set_epoch(0)
    head = []
    for k, (_, _, m) in enumerate(loader):
        head += m["index"].tolist()
        if k == 2:
            break
    state = loader.state_dict()
    loader.load_state_dict(state)
    tail = torch.cat([m["index"] for _, _, m in loader]).tolist()
    assert head + tail == ref and len(tail) == 36 - 12


def test_resume_mid_epoch_with_other_num_workers(small):
    full = make_loader(small, "train", 4, num_workers=0, image_size=S, seed=3, return_meta=True)
    ref = _epoch(full, 1)
    first = make_loader(small, "train", 4, num_workers=2, image_size=S, seed=3, return_meta=True)
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
        resumed = make_loader(small, "train", 4, num_workers=nw, image_size=S, seed=3,
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
    bad = make_loader(small, "train", 4, num_workers=0, image_size=S, seed=4)
    with pytest.raises(LoaderError, match="seed=3"):
        bad.load_state_dict(state)


def test_resume_keeps_the_saved_streams_plan(small):
    """Shard-block order with one contiguous range per worker (streams = 2) depends on the
    worker count at start; a resume with another num_workers adopts the saved plan."""
    full = make_loader(small, "train", 4, num_workers=2, image_size=S, block=True,
                       return_meta=True)
    assert full.dataset.streams == 2
    ref = [m["index"].tolist() for _, _, m in full]
    first = make_loader(small, "train", 4, num_workers=2, image_size=S, block=True,
                        return_meta=True)
    head = []
    for k, (_, _, m) in enumerate(first):
        head.append(m["index"].tolist())
        if k == 2:
            break
    resumed = make_loader(small, "train", 4, num_workers=1, image_size=S, block=True,
                          return_meta=True)
    assert resumed.dataset.streams == 1
    resumed.load_state_dict(first.state_dict())
    assert head + [m["index"].tolist() for _, _, m in resumed] == ref


def test_every_rank_same_batches_under_pad_and_drop(small):
    for even, per_rank in (("pad", 8), ("drop", 7)):  # 36 samples over 5 ranks
        counts, valid_idx = [], []
        for rank in range(5):
            loader = make_loader(small, "train", 2, num_workers=1, image_size=S, rank=rank,
                                 world_size=5, even=even, return_meta=True)
            batches = list(loader)
            counts.append((len(loader), len(batches), sum(len(b[1]) for b in batches)))
            valid_idx += [int(i) for _, _, m in batches for i in m["index"][m["valid"]]]
        assert counts == [(-(-per_rank // 2), -(-per_rank // 2), per_rank)] * 5
        if even == "pad":
            assert sorted(valid_idx) == list(range(36))
    # pad is the default for training under world_size > 1
    assert make_loader(small, "train", 2, num_workers=0, image_size=S, rank=0,
                       world_size=5).dataset.even == "pad"


def test_eval_is_exactly_once_over_ranks_and_workers(small):
    idx = []
    for rank in range(4):  # 9 val samples over 4 ranks x 2 workers: some consumers get nothing
        loader = make_loader(small, "val", 2, num_workers=2, image_size=S, train=False,
                             rank=rank, world_size=4, return_meta=True)
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
            stream = make_loader(tmp_path, "train", 32, num_workers=nw, image_size=8,
                                 mode="stream", samples_per_epoch=256, rank=rank, world_size=2,
                                 even=None, return_meta=True)
            got = torch.cat([m["index"] for _, _, m in stream]).numpy()
            total += len(got)
            uniq |= set(got.tolist())
        assert total == 256 and 140 < len(uniq) < 190  # ~63% unique with replacement
    with pytest.raises(LoaderError, match="split 'val'"):
        make_loader(tmp_path, "val", 4, mode="stream", train=True, image_size=8)
    with pytest.raises(LoaderError, match="train=False"):
        make_loader(tmp_path, "val", 4, mode="stream", train=False, image_size=8)
    with pytest.raises(LoaderError, match="even='pad'"):
        make_loader(tmp_path, "val", 4, even="pad", train=False, image_size=8)


def test_class_balanced_sampling(sample_dir, tmp_path):
    build_split(sample_dir, tmp_path, "wds", [30, 30], start=20)  # 20 daisy + 40 dandelion
    labels = load_index(tmp_path, "train").label
    assert np.bincount(labels).tolist() == [20, 40]
    loader = make_loader(tmp_path, "train", 100, num_workers=0, image_size=8, mode="stream",
                         balance="class", samples_per_epoch=1500, return_meta=True)
    got = torch.cat([y for _, y, _ in loader]).numpy()
    assert len(got) == 1500
    freq = np.bincount(got, minlength=2) / len(got)
    np.testing.assert_allclose(freq, [0.5, 0.5], atol=0.04)  # natural frequencies: 1/3, 2/3
    idx = torch.cat([m["index"] for _, _, m in loader]).numpy()
    assert set(idx.tolist()) == set(range(60))  # every sample still drawn (~12-25 times)


def test_skip_policy_counts_and_default_raises_naming_shard_and_key(sample_dir, tmp_path):
    build_split(sample_dir, tmp_path, "hdf5", [6])
    import h5py

    with h5py.File(tmp_path / "shards/train-000000.h5", "r+") as f:
        start, stop = f["offsets"][2:4]  # same size, so the shard check passes and decoding fails
        f["images"][start:stop] = np.frombuffer(b"\xff\xd8\xff\xe0" + b"\x00" * (stop - start - 4),
                                                np.uint8)
    with pytest.raises(DecodeError, match=r"train-000000\.h5.*'train_00000002'"):
        list(make_loader(tmp_path, "train", 4, num_workers=0, image_size=S, shuffle=False))
    loader = make_loader(tmp_path, "train", 4, num_workers=0, image_size=S, shuffle=False,
                         on_error="skip", return_meta=True)
    with pytest.warns(RuntimeWarning, match="skipped sample 'train_00000002'"):
        batches = list(loader)
    assert [len(y) for _, y, _ in batches] == [3, 2]
    assert loader.skipped == ["train_00000002"]
    assert 2 not in torch.cat([m["index"] for _, _, m in batches]).tolist()


@pytest.mark.parametrize("method", [pytest.param("forkserver", marks=pytest.mark.slow), "spawn"])
def test_start_methods_with_persistent_workers(small, method):
    """Case 19: datasets pickle cleanly; timeout set; start method exposed; the epoch reaches
    persistent spawn/forkserver workers (one worker: each spawn start costs seconds here)."""
    loader = make_loader(small, "train", 6, num_workers=1, image_size=8, persistent_workers=True,
                         backend="process",
                         multiprocessing_context=method, return_meta=True)
    assert loader.start_method == method and loader.dataloader.timeout == 120
    pickle.dumps(loader.dataset)
    orders = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        idx = torch.cat([m["index"] for _, _, m in loader]).numpy()
        assert np.array_equal(np.sort(idx), np.arange(36))
        orders.append(idx)
    assert not np.array_equal(*orders)


def test_forkserver_default_for_pinned_ddp_loaders(small):
    loader = make_loader(small, "train", 4, num_workers=1, pin_memory=True, rank=1, world_size=2,
                         backend="process",
                         image_size=8)
    assert loader.start_method == "forkserver"
    assert make_loader(small, "train", 4, num_workers=0, image_size=8).start_method is None


def test_invalid_options(small):
    with pytest.raises(ConfigError, match="batch_size=0"):
        make_loader(small, "train", 0)
    with pytest.raises(ConfigError, match="timeout=0"):
        make_loader(small, "train", 2, timeout=0)
    with pytest.raises(ConfigError, match="balance='class' resamples"):
        make_loader(small, "train", 2, balance="class", image_size=8)


def test_device_normalizer_cpu(small):
    loader = make_loader(small, "val", 4, num_workers=0, image_size=S, train=False)
    norm = DeviceNormalizer(loader, "cpu", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert len(norm) == len(loader) == 3
    raw = [x for x, _ in loader]
    for (x, y), r in zip(norm, raw):
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x, (r.float() - 127.5) / 63.75)
        assert y.dtype == torch.int64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_device_normalizer_cuda_streams_pinned(small):
    loader = make_loader(small, "train", 4, num_workers=2, image_size=S, pin_memory=True,
                         shuffle=False)
    raw = [x for x, _ in make_loader(small, "train", 4, num_workers=0, image_size=S,
                                     shuffle=False)]
    got = list(DeviceNormalizer(loader, "cuda"))
    assert len(got) == len(raw) == 9
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    for (x, y), r in zip(got, raw):
        assert x.is_cuda and y.is_cuda and x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x.cpu(), (r.float() - mean) / std)


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
    loader = make_loader(small, "train", 4, num_workers=1, timeout=1, transform=_SlowTransform(),
                         image_size=8, backend=backend)
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
    with the same batches."""
    root = packed_sample(fmt)
    kw = dict(num_workers=2, image_size=32, return_meta=True, seed=3)
    proc = make_loader(root, "train", 16, backend="process", **kw)
    thr = make_loader(root, "train", 16, backend="thread", **kw)
    assert thr.backend == "thread" and proc.backend == "process" and len(thr) == len(proc)
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
    resumed = make_loader(root, "train", 16, backend="thread", **{**kw, "num_workers": 1})
    resumed.load_state_dict(state)
    rest = [m["index"] for _, _, m in resumed]
    assert [torch.equal(r, m["index"]) for r, (_, _, m) in zip(rest, b[2:])] == [True] * len(rest)
    assert len(rest) == len(b) - 2
