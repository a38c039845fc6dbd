"""The thread backend recycles batch memory only when nothing refers to a batch any more."""
from __future__ import annotations

import torch

from shardkit.stream import SamplingOptions, make_loader
from shardkit.stream.buffers import BufferPool
from helpers import build_split


def test_kept_batches_are_never_overwritten_and_dropped_ones_are_reused(sample_dir, tmp_path):
    build_split(sample_dir, tmp_path, "wds", [40, 40])
    loader = make_loader(tmp_path, "train", 8, num_workers=2, prefetch_factor=1, image_size=16,
                         seed=1)
    kept = [x.clone() for x, _ in loader]  # reference pixels of epoch 0
    loader.set_epoch(0)
    held = list(loader)  # the caller keeps every batch: 10 distinct buffers
    assert len({x.data_ptr() for x, _ in held}) == 10
    assert all(torch.equal(a, x) for a, (x, _) in zip(kept, held))
    loader.set_epoch(0)
    again = list(loader)  # `held` is still alive: nothing of it may be reused
    assert all(torch.equal(a, x) for a, (x, _) in zip(kept, held))
    assert not {x.data_ptr() for x, _ in again} & {x.data_ptr() for x, _ in held}
    del held, again
    ptrs, numpy_views = set(), []
    loader.set_epoch(0)
    for k, (x, _) in enumerate(loader):  # dropped at once: a few buffers go round
        ptrs.add(x.data_ptr())
        assert torch.equal(x, kept[k])
        if k == 3:
            numpy_views.append((x.permute(0, 2, 3, 1).numpy(), x.clone()))  # a numpy view pins it
    assert len(ptrs) <= 2 * 1 + 4 + 1  # pool limit (workers x prefetch + 4) + the one kept
    view, copy = numpy_views[0]
    assert torch.equal(torch.from_numpy(view).permute(0, 3, 1, 2), copy)  # never overwritten


def test_pool_without_use_counts_allocates(monkeypatch):
    pool = BufferPool(2)
    monkeypatch.setattr(pool, "_use_count", None)
    a, b = pool.get(2, 4, False), pool.get(2, 4, False)
    assert a.data_ptr() != b.data_ptr() and a.shape == (2, 3, 4, 4)
    assert a.is_contiguous(memory_format=torch.channels_last)


def test_custom_transforms_get_bytes_the_factory_gets_the_reused_buffer(sample_dir, tmp_path):
    """A user's transform may keep or use ``data`` as ``bytes`` (``data.startswith``); only the
    factory's transform, which declares ``accepts_buffers``, reads from the reused buffer."""
    from shardkit.transforms import TransformConfig, make_transform

    build_split(sample_dir, tmp_path, "wds", [6])
    seen = []

    def mine(data, rng, out=None):
        assert data.startswith(b"\xff\xd8")  # a bytes method: a memoryview has none
        seen.append(data)
        out[...] = 0
        return out

    list(make_loader(tmp_path, "train", 3, num_workers=2, image_size=8, transform=mine))
    assert len(seen) == 6 and all(type(d) is bytes for d in seen)
    assert len({bytes(d) for d in seen}) == 6  # kept data stayed intact
    got = []
    factory = make_transform(TransformConfig(image_size=8), True)

    class Spy:
        accepts_buffers = True

        def __call__(self, data, rng, out=None):
            got.append(type(data))
            return factory(data, rng, out=out)

    list(make_loader(tmp_path, "train", 3, num_workers=0, image_size=8, transform=Spy()))
    assert got == [memoryview] * 6 and factory.accepts_buffers is True


def test_a_subclass_of_the_factory_transform_gets_bytes_and_its_own_generators(sample_dir,
                                                                               tmp_path):
    """The factory's promises (``accepts_buffers``, ``keeps_rng``: nothing kept after the call)
    hold only where they are made (``transforms.declared``). A subclass that keeps ``data``
    and ``rng`` gets intact bytes and one generator per sample, each still drawing what
    ``sample_rng`` draws; a subclass that makes both promises again gets the reused ones."""
    import numpy as np

    from shardkit.sharding import sample_rng
    from shardkit.transforms import SampleTransform, TransformConfig, declared, make_transform

    build_split(sample_dir, tmp_path, "wds", [6])
    cfg = TransformConfig(image_size=8)

    class Keeps(SampleTransform):
        def __call__(self, data, rng=None, out=None):
            self.kept.append((data, rng, rng.bit_generator.state["state"]["key"].copy()))
            return super().__call__(data, rng, out=out)

    class Promises(Keeps):
        accepts_buffers = True
        keeps_rng = False

    assert declared(make_transform(cfg, True), "keeps_rng") is False
    assert declared(Keeps(cfg, True), "keeps_rng") is None
    for cls, reused in ((Keeps, False), (Promises, True)):
        tf = cls(cfg, True)
        tf.kept = []
        list(make_loader(tmp_path, "train", 3, num_workers=0, image_size=8, transform=tf,
                         seed=4, sampling=SamplingOptions(shuffle=False)))
        datas, rngs, keys = zip(*tf.kept)
        assert len(datas) == 6
        assert all(type(d) is (memoryview if reused else bytes) for d in datas)
        assert len({id(r) for r in rngs}) == (2 if reused else 6)  # reused: one per batch
        assert [int(k[1]) for k in keys] == [int(sample_rng(4, 0, 0, j).bit_generator.state[
            "state"]["key"][1]) for j in range(6)]
        if not reused:  # kept bytes intact, kept generators still their own sample's
            assert all(d.startswith(b"\xff\xd8") for d in datas)
            fresh = [sample_rng(4, 0, 0, j) for j in range(6)]
            for d, g in zip(datas, fresh):
                make_transform(cfg, True)(d, g)  # the same draws the row made
            assert [r.random() for r in rngs] == [g.random() for g in fresh]
        assert np.array_equal(keys[0], sample_rng(4, 0, 0, 0).bit_generator.state["state"]["key"])
