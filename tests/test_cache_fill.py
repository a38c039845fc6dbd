"""The decoded cache's fill (shardkit.stream.cache.DecodedCache.fill): the whole image decoded
into the fill buffer and the epoch's crop resized from it in one C call
(``SampleTransform.decode_for_cache(..., crop=...)``, ``ROIDecoder.decode_whole_resize``) gives
exactly the two-step path's pixels, crops, warnings and errors, on real photos and on awkward
files; the filled epoch and the next, cached, epoch are the uncached epochs bit for bit; a
failing fused decode falls back; the free space is not read for every sample."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_awkward
from shardkit.decode import roi as roi_mod
from shardkit.errors import ShardkitError
from shardkit.stream import WorkerOptions, make_loader
from shardkit.stream import cache as cache_mod
from shardkit.stream.source import ShardSource
from shardkit.transforms import TransformConfig, make_transform

BATCH = 32
S = 224  # the sample's photos are 240-500 px: no crop reaches 2S, no DCT reduction uncached


@pytest.fixture(scope="module")
def root(packed_sample) -> Path:
    return packed_sample("wds")


def _two_step(tf, data, w, h, seed):
    """The fill's pixels and crop without the fused call: decode, then from_pixels."""
    out, rng = np.empty((S, S, 3), np.uint8), np.random.default_rng(seed)
    pixels = tf.decode_for_cache(data)
    warnings = tf.last_warnings
    tf.from_pixels(pixels, w, h, rng, out)
    return pixels, out, warnings, rng.bit_generator.state


def _fused(tf, data, w, h, seed, shape=None):
    buf = np.empty(shape or (h, w, 3), np.uint8)
    out, rng = np.full((S, S, 3), 7, np.uint8), np.random.default_rng(seed)
    pixels = tf.decode_for_cache(data, None, buf, crop=(w, h, rng, out))
    return pixels, buf, out, tf.last_warnings, rng.bit_generator.state


@pytest.mark.parametrize("train,interpolation", [(True, "bilinear"), (True, "bicubic"),
                                                 (False, "bilinear")])
def test_fused_fill_is_the_two_step_fill_and_the_uncached_crop_on_every_photo(
        root, monkeypatch, train, interpolation):
    calls = []
    real = roi_mod.ROIDecoder.decode_whole_resize

    def spy(self, *a, **kw):
        done = real(self, *a, **kw)
        calls.append(done)
        return done

    monkeypatch.setattr(roi_mod.ROIDecoder, "decode_whole_resize", spy)
    src = ShardSource(root, "train")
    tf = make_transform(TransformConfig(image_size=S, interpolation=interpolation), train)
    for i in range(len(src)):
        data = bytes(src.read(i))
        probe = tf.decoder.probe(data)
        w, h = probe.width, probe.height
        pixels, buf, out, nw, state = _fused(tf, data, w, h, i)
        ref_pixels, ref_out, ref_nw, ref_state = _two_step(tf, data, w, h, i)
        assert pixels is buf and np.array_equal(pixels, ref_pixels), i
        assert np.array_equal(out, ref_out) and nw == ref_nw and state == ref_state, i
        uncached = tf(data, np.random.default_rng(i))
        assert np.array_equal(out, uncached), i  # scale 1 everywhere on these photos
    assert calls == [True] * len(src)  # every photo took the one-call path


def test_fused_fill_matches_the_two_step_path_on_awkward_files():
    """CMYK, grayscale, progressive, truncated (warnings), PNG/WebP/TIFF, garbage: the same
    pixels, crop, warnings and RNG state, or the same error, as decode + from_pixels."""
    tf = make_transform(TransformConfig(image_size=S), True)
    seen = {"fused": 0, "error": 0}
    for seed, (name, data) in enumerate(make_awkward().items()):
        try:
            ref = _two_step(tf, data, *_size(tf, data), seed)
        except ShardkitError as e:
            with pytest.raises(type(e)):
                w, h = 320, 244  # what an index would claim
                _fused(tf, data, w, h, seed)
            seen["error"] += 1
            continue
        w, h = _size(tf, data)
        pixels, buf, out, nw, state = _fused(tf, data, w, h, seed)
        assert np.array_equal(pixels, ref[0]) and np.array_equal(out, ref[1]), name
        assert (nw, state) == (ref[2], ref[3]), name
        seen["fused"] += pixels is buf
    assert seen["error"] >= 2 and seen["fused"] >= 4  # some of each kind were exercised


def _size(tf, data) -> tuple[int, int]:
    probe = tf.decoder.probe(data)
    return probe.width, probe.height


def test_a_wrong_index_size_crops_nothing_and_draws_nothing(root):
    src = ShardSource(root, "train")
    tf = make_transform(TransformConfig(image_size=S), True)
    data = bytes(src.read(0))
    w, h = _size(tf, data)
    pixels, buf, out, _, state = _fused(tf, data, w, h + 1, 5, shape=(h + 1, w, 3))
    assert pixels is not buf and pixels.shape == (h, w, 3)  # the caller sees the mismatch
    assert np.array_equal(pixels, tf.decode_for_cache(data))
    assert (out == 7).all()  # crop_out untouched
    assert state == np.random.default_rng(5).bit_generator.state  # nothing drawn


def _epochs(root, epochs, **kw):
    out = []
    with make_loader(root, "train", BATCH, num_workers=2, workers=WorkerOptions(backend="thread"),
                     **kw) as loader:
        for e in epochs:
            loader.set_epoch(e)
            out.append([(x.clone(), y.clone()) for x, y in loader])
        stats = loader.cache_stats()
    return out, stats


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x1.equal(x2) and y1.equal(y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


@pytest.fixture(scope="module")
def plain(root):
    return _epochs(root, [0, 1])[0]


def test_filled_and_cached_epochs_are_the_uncached_ones_through_the_fused_fill(
        root, shm, plain, monkeypatch):
    calls = []
    real = roi_mod.ROIDecoder.decode_whole_resize

    def spy(self, *a, **kw):
        calls.append(real(self, *a, **kw))
        return calls[-1]

    monkeypatch.setattr(roi_mod.ROIDecoder, "decode_whole_resize", spy)
    cached, stats = _epochs(root, [0, 1], cache="ram")
    n = stats["num_samples"]
    assert calls == [True] * n  # every sample of the fill epoch went through the one call
    assert _same(plain[0], cached[0])  # the filling epoch
    assert _same(plain[1], cached[1])  # every sample from the arena
    assert not torch.equal(plain[0][0][0], plain[1][0][0])  # the crops are live
    assert stats["misses"] == n and stats["hits"] == n and stats["filled_samples"] == n


def test_a_failing_fused_decode_falls_back_and_the_cache_holds_the_same_pixels(
        root, shm, plain, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("libjpeg: injected failure")

    monkeypatch.setattr(roi_mod._jpegroi, "decode_into", broken)
    with make_loader(root, "train", BATCH, num_workers=2, cache="ram",
                     workers=WorkerOptions(backend="thread")) as loader:
        epochs = []
        for e in (0, 1):
            loader.set_epoch(e)
            epochs.append([(x.clone(), y.clone()) for x, y in loader])
        arena, stats = loader.cache.arena, loader.cache_stats()
        src = ShardSource(root, "train")
        tf = make_transform(TransformConfig(image_size=S), True)
        for i in (0, len(src) // 2, len(src) - 1):
            ref = tf.decoder.decode_scaled(bytes(src.read(i)), Fraction(1))
            assert np.array_equal(arena.slot(i), ref)
    assert _same(plain[0], epochs[0]) and _same(plain[1], epochs[1])
    assert stats["filled_samples"] == stats["num_samples"] == stats["hits"]


def test_the_free_space_is_read_once_per_share_of_the_room(root, shm, plain, monkeypatch):
    """Plenty of room: a fill epoch reads it a handful of times, not once per sample (the
    reserve test of test_cache_edges.py checks that a shrinking room still stops in time)."""
    reads = []

    def free_bytes(folder):  # a 1 TiB tmpfs, whatever this machine has
        reads.append(folder)
        return 1 << 40

    monkeypatch.setattr(cache_mod, "free_bytes", free_bytes)
    cached, stats = _epochs(root, [0], cache="ram")
    assert stats["filled_samples"] == stats["num_samples"] == 140
    assert 1 <= len(reads) < 10
    assert _same(plain[0], cached[0])
