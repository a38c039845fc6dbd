"""The thread backend recycles batch memory only when nothing refers to a batch any more."""
from __future__ import annotations

import torch

from shardkit.stream import make_loader
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
