"""Decoded image cache (docs/RELIABILITY.md, "The decoded cache") on the embedded flowers sample: a
cached epoch yields exactly the uncached batches on both backends, the arena is one file shared
with another process and removed by the last one, a SIGKILLed holder leaves nothing the next run
misreads, running out of space while filling falls back to uncached reads, disk caches are
validated against the dataset, ``auto`` decides by the budget, ``cache_eval="final"``."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from shardkit.errors import ConfigError
from shardkit.stream import WorkerOptions, make_loader
from shardkit.stream import arena as arena_mod
from shardkit.stream.cache import cached_size
from shardkit.transforms import TransformConfig

BATCH = 32


@pytest.fixture(scope="module")
def root(packed_sample) -> Path:
    """The sample packed as wds (train 140 real photos, 240-500 px, S=224: no DCT reduction)."""
    return packed_sample("wds")


def _epochs(root, epochs, backend="thread", **kw):
    """``([[(images, labels)] per epoch], cache_stats)`` of one loader over ``epochs``."""
    out = []
    with make_loader(root, "train", BATCH, num_workers=2,
                     workers=WorkerOptions(backend=backend), **kw) as loader:
        for e in epochs:
            loader.set_epoch(e)
            out.append([(x.clone(), y.clone()) for x, y in loader])
        stats = loader.cache_stats()
    return out, stats


@pytest.fixture(scope="module")
def plain(root) -> dict:
    """The uncached batches of epochs 0, 1 and 2 (threads; both backends yield the same)."""
    return dict(zip((0, 1, 2), _epochs(root, [0, 1, 2])[0]))


def _num_train(root) -> int:
    from shardkit.dataset.manifest import load_manifest

    return load_manifest(root)["splits"]["train"]["num_samples"]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x1.equal(x2) and y1.equal(y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


def _dct_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "shardkit.stream.cache" and "DCT scale" in r.getMessage()]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_cached_epochs_are_exactly_the_uncached_batches(root, shm, backend, plain, caplog):
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(root, [0, 1], backend, cache="ram")
    if backend == "process":
        assert _epochs(root, [], backend)[1] is None  # no cache, no stats
    n = sum(len(y) for _, y in plain[0])
    assert n == _num_train(root) == 140
    assert _same(plain[0], cached[0])  # the filling epoch
    assert _same(plain[1], cached[1])  # served from the cache: same crops, same pixels
    assert not _same(plain[0], plain[1])  # the augmentation is live, not frozen
    assert stats["misses"] == n and stats["hits"] == n and stats["hit_rate"] == 0.5
    assert stats["filled_samples"] == n and stats["filled_bytes"] == stats["size_bytes"]
    # size = sum of w * h * 3 of the stored photos (their headers, independently)
    from shardkit.dataset.manifest import read_split_records

    recs = read_split_records(root, "train")
    assert stats["size_bytes"] == sum(r["width"] * r["height"] * 3 for r in recs)
    assert stats["fill_seconds"] > 0
    # no crop >= 2 x 224 here: nothing the uncached decode would DCT-reduce, nothing warned
    assert stats["dct_reduced"] == 0 and _dct_warnings(caplog) == []
    assert list(shm.iterdir()) == []  # the last holder removed the arena and its lock file


SMALL = 96  # most random crops of the 240-500 px sample photos are >= 192 px: DCT-reduced


@pytest.fixture(scope="module")
def plain_small(root) -> list:
    """The uncached batches of epochs 0 and 1 at image_size=SMALL (threads)."""
    return _epochs(root, [0, 1], image_size=SMALL)[0]


def _rows_differ(a, b) -> int:
    """How many samples (rows) of epochs ``a`` and ``b`` (the same order) differ in pixels."""
    assert all(y1.equal(y2) for ea, eb in zip(a, b) for (_, y1), (_, y2) in zip(ea, eb))
    return sum(int((x1 != x2).flatten(1).any(1).sum()) for ea, eb in zip(a, b)
               for (x1, _), (x2, _) in zip(ea, eb))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_dct_reduced_crops_are_counted_and_warned_once(root, shm, backend, plain_small, caplog):
    """At S=96 the uncached decode of a crop >= 192 px on both sides is DCT-reduced, the
    cache's is not: cache_stats counts exactly the samples whose pixels differ from the
    uncached run's, and the loader warns once (not per sample, thread, worker or epoch)."""
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(root, [0, 1], backend, cache="ram", image_size=SMALL)
    n = _num_train(root)
    differ = _rows_differ(plain_small, cached)
    assert 0 < stats["dct_reduced"] == differ < 2 * n  # both epochs: the fill and the hits
    (msg,) = _dct_warnings(caplog)
    assert f"image_size={SMALL}" in msg and f">= {2 * SMALL} px" in msg
    assert "not bit-exact" in msg and "docs/cache.md" in msg
    w, h = (int(v) for v in msg.split(" px crop")[0].split()[-1].split("x"))
    assert min(w, h) >= 2 * SMALL  # the crop that triggered it


def test_no_dct_scaling_keeps_small_crops_exact(root, shm, caplog):
    """The way out the warning names: dct_scaling=False decodes uncached crops at scale 1,
    so the cached epochs equal the uncached ones at S=96 too, with nothing counted."""
    tf = TransformConfig(image_size=SMALL, dct_scaling=False)
    plain, _ = _epochs(root, [0, 1], transform=tf)
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(root, [0, 1], cache="ram", transform=tf)
    assert _rows_differ(plain, cached) == 0 and stats["dct_reduced"] == 0
    assert _dct_warnings(caplog) == []


def test_eval_pixels_cache_counts_its_dct_reduced_center_crops(root, shm, caplog):
    """cache_eval="pixels" on an eval loader at S=96: the center crop of a 240-500 px photo
    is >= 192 px on both sides, so the uncached decode is DCT-reduced and the cached one is
    not. The count equals the rows that differ from the uncached eval epoch (the same in
    every epoch: the eval crop is fixed), and the loader warns once."""
    plain, _ = _epochs(root, [0], image_size=SMALL, train=False)
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(root, [0, 1], cache="ram", cache_eval="pixels",
                                image_size=SMALL, train=False)
    differ = _rows_differ(plain * 2, cached)
    assert 0 < stats["dct_reduced"] == differ and differ % 2 == 0
    assert len(_dct_warnings(caplog)) == 1


@pytest.fixture(scope="module")
def mixed(sample_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    """``(root, exts)``: 60 real photos packed as wds, every other one stored as a lossless
    PNG of its pixels; ``exts`` each train sample's ``ext`` in split order."""
    from shardkit.dataset.manifest import read_split_records
    from shardkit.packer.run import pack

    tmp_path = tmp_path_factory.mktemp("mixed")
    src = tmp_path / "mixed"
    photos = sorted(p for p in sample_dir.rglob("*.jpg"))[:60]
    for i, photo in enumerate(photos):
        dest = src / photo.parent.name / photo.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if i % 2:
            with Image.open(photo) as im:
                im.convert("RGB").save(dest.with_suffix(".png"))
        else:
            shutil.copyfile(photo, dest)
    out = tmp_path / "out"
    pack(src, out, format="wds", split={"train": 1.0}, seed=0, workers=1)
    exts = [r["ext"] for r in read_split_records(out, "train")]
    assert sorted(set(exts)) == ["jpg", "png"] and exts.count("png") == 30
    return out, exts


def test_png_samples_are_never_counted_as_dct_reduced(mixed, shm):
    """A PNG is always decoded at scale 1, cached or not: in a split of real photos where
    every other one is stored as a lossless PNG of its pixels, no PNG row is counted or
    differs, and the count still equals the JPEG rows that differ (S=96)."""
    out, exts = mixed

    def run(**kw):
        with make_loader(out, "train", 16, num_workers=2, image_size=SMALL,
                         return_meta=True, **kw) as loader:
            rows = [(x.clone(), m["index"].clone()) for x, _, m in loader]
            return rows, loader.cache_stats()

    plain, _ = run()
    cached, stats = run(cache="ram")
    differ = {"jpg": 0, "png": 0}
    for (x1, i1), (x2, i2) in zip(plain, cached):
        assert i1.equal(i2)
        for row, pos in zip((x1 != x2).flatten(1).any(1).tolist(), i1.tolist()):
            differ[exts[pos]] += row
    assert differ["png"] == 0 and 0 < differ["jpg"] == stats["dct_reduced"]


def _edit_records(root: Path, edit) -> list[dict]:
    """Rewrites ``root``'s ``splits/train.jsonl`` after ``edit(records)`` changed the list of
    record dicts in place (a hand edit: the records are metadata); returns the records."""
    path = root / "splits" / "train.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    edit(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_split_records_without_ext_take_the_format_from_the_header(mixed, tmp_path):
    """A hand-edited ``splits/train.jsonl`` whose records lost ``ext`` (allowed: the records
    are metadata) still marks exactly the JPEGs as DCT-reducible, from each sample's header:
    no PNG counted as a JPEG. The record fields that remain give the sizes."""
    from shardkit.stream.cache_exact import stored_sizes
    from shardkit.stream.source import ShardSource
    from shardkit.transforms import make_transform

    src, exts = mixed
    root = tmp_path / "edited"
    shutil.copytree(src, root)

    def drop_ext(records):
        for r in records[::3]:  # a third lose ext: both formats among them
            del r["ext"]

    records = _edit_records(root, drop_ext)
    assert {exts[i] for i in range(0, len(exts), 3)} == {"jpg", "png"}
    tf = make_transform(TransformConfig(image_size=SMALL), True)
    for root_ in (src, root):
        sizes, reducible = stored_sizes(ShardSource(root_, "train"), tf)
        assert list(reducible) == [int(e == "jpg") for e in exts]
        assert sizes.tolist() == [[r["width"], r["height"]] for r in records]


def _damage(root: Path, pos: int) -> str:
    """Overwrites the first 16 stored bytes of train sample ``pos`` in its tar shard (its xxh3
    no longer matches: a read raises ShardCorruptError); returns its key."""
    from shardkit.stream.source import ShardSource

    src = ShardSource(root, "train")
    with open(root / src.shard_name(pos), "r+b") as f:
        f.seek(int(src.index.offset[pos]))
        f.write(b"\0" * 16)
    return src.key(pos)


def test_a_damaged_sample_leaves_the_cache_usable(root, tmp_path, shm, caplog):
    """A sample the cache cannot read while it learns the sizes (damaged bytes, its record
    without ``ext``, then the sizes read from headers because a record lost its width) is
    not cached and goes to ``on_error`` in the loader, as without a cache: with ``skip`` both
    loaders yield the other 139 samples, the same pixels, and one warning names the sample."""
    from shardkit.dataset.manifest import read_split_records
    from shardkit.stream.cache_exact import UNREAD_SIZE, stored_sizes
    from shardkit.stream.source import ShardSource
    from shardkit.transforms import make_transform

    root2 = tmp_path / "damaged"
    shutil.copytree(root, root2)
    key = _damage(root2, 5)
    _edit_records(root2, lambda records: records[5].pop("ext"))
    tf = make_transform(TransformConfig(image_size=224), True)
    for lose_width in (False, True):
        if lose_width:  # sizes from every header now, the damaged one's too
            _edit_records(root2, lambda records: records[7].pop("width"))
        # on either path the unread sample gets a slot no image fits (were its read to work
        # later, it is still never served from the cache), the others their own sizes
        sizes, reducible = stored_sizes(ShardSource(root2, "train"), tf)
        assert tuple(sizes[5]) == UNREAD_SIZE and reducible[5] == 0
        want = [(r["width"], r["height"]) for r in read_split_records(root, "train")]
        assert [tuple(v) for k, v in enumerate(sizes.tolist()) if k != 5] == want[:5] + want[6:]
        caplog.clear()
        plain, _ = _epochs(root2, [0], on_error="skip")
        with caplog.at_level(logging.WARNING, logger="shardkit"):
            cached, stats = _epochs(root2, [0, 1], cache="ram", on_error="skip")
        n = _num_train(root2)
        assert sum(len(y) for _, y in plain[0]) == n - 1
        assert sum(len(y) for _, y in cached[1]) == n - 1
        assert len(cached[0]) == len(plain[0])
        for (x1, y1), (x2, y2) in zip(plain[0], cached[0]):  # the fill epoch: same batches
            assert x1.equal(x2) and y1.equal(y2)
        assert stats["filled_samples"] == n - 1
        unread = [r.getMessage() for r in caplog.records if "could not be read" in r.getMessage()]
        assert len(unread) == 1 and "1 sample(s)" in unread[0] and repr(key) in unread[0]
        if lose_width:
            assert any("record 8 gives width=None" in r.getMessage() for r in caplog.records)


def test_the_fallback_warning_says_why_the_records_do_not_give_the_sizes(root, tmp_path, caplog):
    """Records that cannot give every size are named for what is wrong: a missing record (the
    count), a side over the limit (the record and its value); the sizes then come from the
    headers, equal to the records'."""
    from shardkit.stream.cache_exact import stored_sizes
    from shardkit.stream.source import ShardSource
    from shardkit.transforms import make_transform

    tf = make_transform(TransformConfig(image_size=224), True)
    want, _ = stored_sizes(ShardSource(root, "train"), tf)
    path = tmp_path / "r" / "splits" / "train.jsonl"
    shutil.copytree(root, tmp_path / "r")
    lines = path.read_text().splitlines()
    cases = [(lines[:-1], f"holds {len(lines) - 1} records for the index's {len(lines)} samples")]
    big = json.loads(lines[2])
    big["width"] = (1 << 20) + 1
    cases.append((lines[:2] + [json.dumps(big)] + lines[3:],
                   f"record 3 gives width={(1 << 20) + 1}, height={big['height']}"))
    for edited, reason in cases:
        path.write_text("\n".join(edited) + "\n")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="shardkit"):
            sizes, _ = stored_sizes(ShardSource(tmp_path / "r", "train"), tf)
        assert sizes.tolist() == want.tolist()
        assert [reason in r.getMessage() for r in caplog.records] == [True]


def test_dct_side_is_where_choose_scale_first_reduces():
    """``dct_side`` is the least square box side that ``choose_scale`` reduces: 2 S for the
    CPU decoders (1/2 their largest factor below 1), at S = 96 and 224; NEVER without
    ``dct_scaling``."""
    from shardkit.decode import FAST_DCT_REDUCTIONS, choose_scale
    from shardkit.stream.cache_exact import NEVER, dct_side
    from shardkit.transforms import make_transform

    for s in (SMALL, 224):
        for decoder in ("roi", "turbojpeg", "pil"):
            side = dct_side(make_transform(TransformConfig(image_size=s, decoder=decoder), True))
            assert side == 2 * s
            assert choose_scale(side, side, s, s, FAST_DCT_REDUCTIONS) < 1
            assert choose_scale(side - 1, side, s, s, FAST_DCT_REDUCTIONS) == 1
    cfg = TransformConfig(image_size=224, dct_scaling=False)
    assert dct_side(make_transform(cfg, True)) == NEVER


def test_eval_loader_pixels_and_final_crops(packed_sample, shm):
    root = packed_sample("wds")

    def passes(**kw):
        with make_loader(root, "val", 8, train=False, num_workers=2, **kw) as loader:
            res = [[x.clone() for x, _ in loader] for _ in range(2)]
            return res, loader.cache_stats()

    plain, _ = passes()
    for mode in ("pixels", "final"):
        cached, stats = passes(cache="ram", cache_eval=mode)
        assert all(a.equal(b) for a, b in zip(plain[0], cached[0]))
        assert all(a.equal(b) for a, b in zip(plain[0], cached[1]))
        assert stats["hits"] == stats["misses"] == sum(len(x) for x in plain[0])
        if mode == "final":
            assert stats["size_bytes"] == stats["misses"] * 224 * 224 * 3
    with pytest.raises(ConfigError, match="final"):
        make_loader(root, "train", 8, cache="ram", cache_eval="final")


def test_max_side_caches_smaller_pixels_and_scales_the_crop(root, shm, plain):
    cached, stats = _epochs(root, [0, 1], cache="ram", cache_max_side=256)
    from shardkit.dataset.manifest import read_split_records

    recs = read_split_records(root, "train")
    want = sum(np.prod(cached_size(r["width"], r["height"], 256)) * 3 for r in recs)
    assert stats["size_bytes"] == want < sum(r["width"] * r["height"] * 3 for r in recs)
    a = torch.cat([x for x, _ in plain[1]]).float()
    b = torch.cat([x for x, _ in cached[1]]).float()
    diff = (a - b).abs().mean().item()
    # same crops from half-size pixels: close, not equal (measured 2.4 of 255 on this sample)
    assert 0 < diff < 6, diff
    assert all(y1.equal(y2) for (_, y1), (_, y2) in zip(plain[1], cached[1]))


def test_max_side_crop_matches_pillow_reference(root, sample_photo):
    """One real photo: the cached crop equals Pillow resizing the photo to the cache size,
    then resizing the scaled crop box (torchvision's crop order: crop, then resize)."""
    from shardkit.sharding import sample_rng
    from shardkit.transforms import make_transform

    data = sample_photo.read_bytes()
    tf = make_transform(TransformConfig(image_size=96), True)
    w, h = 320, 244
    cw, ch = cached_size(w, h, 200)
    pixels = tf.decode_for_cache(data, (cw, ch))
    got = tf.from_pixels(pixels, w, h, sample_rng(0, 3, 0, 7))
    p = tf.last_params
    with Image.open(sample_photo) as im:
        small = im.convert("RGB").resize((cw, ch), Image.Resampling.BILINEAR)
    fx, fy = cw / w, ch / h
    box = (p.left * fx, p.top * fy, (p.left + p.width) * fx, (p.top + p.height) * fy)
    region = (int(np.floor(box[0])), int(np.floor(box[1])), int(np.ceil(box[2])),
              int(np.ceil(box[3])))
    crop = small.crop(region)
    ref = crop.resize((96, 96), Image.Resampling.BILINEAR,
                      box=(box[0] - region[0], box[1] - region[1], box[2] - region[0],
                           box[3] - region[1]))
    ref = np.asarray(ref)[:, ::-1] if p.flip else np.asarray(ref)
    assert np.array_equal(got, ref)


_HOLDER = textwrap.dedent("""
    import sys, time
    from shardkit.stream import make_loader
    loader = make_loader(sys.argv[1], "train", 32, num_workers=1, cache="ram")
    loader.set_epoch(int(sys.argv[2]))
    total = 0
    for x, _ in loader:
        total += int(x.to(dtype=__import__("torch").int64).sum())
    s = loader.cache_stats()
    print(s["hits"], s["misses"], total, s["path"], flush=True)
    if sys.argv[3] == "hold":
        time.sleep(600)
    loader.close()
""")


def _run_holder(root, epoch: int, hold: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _HOLDER, str(root), str(epoch),
                             "hold" if hold else "exit"], stdout=subprocess.PIPE, text=True)


def test_one_copy_shared_with_another_process(root, shm):
    with make_loader(root, "train", BATCH, num_workers=2, cache="ram") as loader:
        [None for _ in loader]  # epoch 0 fills
        loader.set_epoch(1)
        mine = sum(int(x.to(torch.int64).sum()) for x, _ in loader)
        path = loader.cache_stats()["path"]
        # another process (as a second DDP rank would): attaches, every sample is a hit
        proc = _run_holder(root, 1, hold=False)
        out, _ = proc.communicate(timeout=120)
        hits, misses, total, other_path = out.split()
        assert (int(hits), int(misses), int(total), other_path) == (_num_train(root), 0, mine, path)
        assert {p.name for p in shm.iterdir()} == {Path(path).name, Path(path).name + ".lock"}
    assert list(shm.iterdir()) == []


def test_sigkilled_holder_leaves_nothing_the_next_run_misreads(root, plain, shm, caplog):
    proc = _run_holder(root, 0, hold=True)
    line = proc.stdout.readline().split()
    assert int(line[1]) == _num_train(root)  # it filled the whole split
    # the arena is damaged while still held (as a process killed mid-write could leave a slot)
    arena_path = Path(line[3])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and arena_path.exists()
    with open(arena_path, "r+b") as f:
        f.seek(-4096, os.SEEK_END)
        f.write(bytes(4096))
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(root, [0, 1], cache="ram")
    assert "stale arena" in caplog.text and "killed" in caplog.text
    assert _same(plain[0], cached[0]) and _same(plain[1], cached[1])
    assert stats["misses"] == _num_train(root)  # rebuilt, nothing read from the leftover
    assert list(shm.iterdir()) == []


def test_out_of_space_while_filling_warns_and_reads_uncached(root, plain, shm, monkeypatch,
                                                             caplog):
    real, calls = os.pwrite, []

    def pwrite(fd, data, offset):  # the 41st slot on finds the tmpfs full
        calls.append(offset)
        if len(calls) > 40:
            raise OSError(28, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(arena_mod.os, "pwrite", pwrite)
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(root, [0, 1], cache="ram")
    assert "out of space while filling" in caplog.text
    assert caplog.text.count("out of space") == 1  # one warning, not one per sample
    assert _same(plain[0], cached[0]) and _same(plain[1], cached[1])
    assert stats["filled_samples"] == 40 and stats["disabled"]
    assert stats["hits"] == 40 and stats["misses"] == 2 * _num_train(root) - 40


def test_cache_options_are_checked(root, shm):
    for bad in ("rom", "disk:", 3):
        with pytest.raises(ConfigError, match="cache="):
            make_loader(root, "train", 8, cache=bad)
    with pytest.raises(ConfigError, match="cache_max_side"):
        make_loader(root, "train", 8, cache="ram", cache_max_side=0)
    with pytest.raises(ConfigError, match="TransformConfig"):
        make_loader(root, "train", 8, cache="ram", image_size=8,
                    transform=lambda d, r, out=None: np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ConfigError, match="device_decode"):
        make_loader(root, "train", 8, cache="ram", device_decode="cpu")


def test_spawned_workers_attach_the_same_arena(root, plain, shm):
    out = []
    workers = WorkerOptions(backend="process", multiprocessing_context="spawn",
                            persistent_workers=True)  # one start: spawning is slow
    with make_loader(root, "train", BATCH, num_workers=1, workers=workers,
                     cache="ram") as loader:
        for e in (0, 1):
            loader.set_epoch(e)
            out.append([(x.clone(), y.clone()) for x, y in loader])
        stats = loader.cache_stats()
    assert _same(plain[0], out[0]) and _same(plain[1], out[1])
    assert stats["hits"] == stats["misses"] == stats["filled_samples"] == _num_train(root)
    assert list(shm.iterdir()) == []


def test_disk_cache_is_reused_across_runs_and_checked(root, plain, tmp_path, caplog):
    spec = f"disk:{tmp_path / 'cache'}"
    first, s1 = _epochs(root, [0], cache=spec)
    second, s2 = _epochs(root, [1], cache=spec)  # a new run: every sample already there
    n = _num_train(root)
    assert _same(plain[0], first[0]) and _same(plain[1], second[0])
    assert (s1["misses"], s2["hits"], s2["misses"]) == (n, n, 0)
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    where = hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:12]
    assert files == [f"shardkit-train-full-{where}.arena",
                     f"shardkit-train-full-{where}.arena.lock"]
    # a damaged slot (bit rot, a copy gone wrong) is never served: its check fails, re-decoded
    path = tmp_path / "cache" / files[0]
    with open(path, "r+b") as f:
        f.seek(-1000, os.SEEK_END)
        f.write(bytes(100))
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        third, s3 = _epochs(root, [1], cache=spec)
    assert "failed its check" in caplog.text
    assert _same(plain[1], third[0]) and (s3["hits"], s3["misses"]) == (n - 1, 1)


def test_stale_disk_cache_is_rebuilt_never_read(packed_sample, tmp_path, caplog):
    """The dataset at one place re-packed (the same photos as lmdb: other shards, other
    sha256s), same DIR and split: its arena is rebuilt, never read."""
    spec = f"disk:{tmp_path / 'cache'}"
    where = tmp_path / "data"
    shutil.copytree(packed_sample("wds"), where)
    _epochs(where, [0], cache=spec)
    shutil.rmtree(where)
    shutil.copytree(packed_sample("lmdb"), where)
    plain, _ = _epochs(where, [0])
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(where, [0], cache=spec)
    assert "stale arena, for another dataset" in caplog.text
    assert _same(plain[0], cached[0]) and stats["hits"] == 0
    assert len(list((tmp_path / "cache").glob("*.arena"))) == 1  # replaced, not added


def test_two_datasets_sharing_a_disk_dir_keep_one_arena_each(packed_sample, tmp_path):
    spec = f"disk:{tmp_path / 'cache'}"
    a, b = packed_sample("wds"), packed_sample("hdf5")
    _epochs(a, [0], cache=spec)
    _epochs(b, [0], cache=spec)
    _, again = _epochs(a, [1], cache=spec)  # a's arena was not evicted by b's
    assert again["misses"] == 0 and again["hits"] == _num_train(a)
    assert len(list((tmp_path / "cache").glob("*.arena"))) == 2
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        _epochs(a, [0], cache=f"disk:{tmp_path / 'file'}")


def test_disk_cache_of_a_killed_run_is_checked_before_reuse(root, plain, tmp_path, caplog):
    spec = f"disk:{tmp_path}"
    script = _HOLDER.replace('cache="ram"', f'cache={spec!r}')
    proc = subprocess.Popen([sys.executable, "-c", script, str(root), "0", "hold"],
                            stdout=subprocess.PIPE, text=True)
    path = Path(proc.stdout.readline().split()[3])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    with open(path, "r+b") as f:  # as if the last page never reached the disk
        f.seek(-4096, os.SEEK_END)
        f.write(bytes(4096))
    with caplog.at_level(logging.WARNING, logger="shardkit.stream.cache"):
        cached, stats = _epochs(root, [2], cache=spec)
    assert "not closed cleanly" in caplog.text and "1 bad" in caplog.text
    n = _num_train(root)
    assert _same(plain[2], cached[0]) and (stats["hits"], stats["misses"]) == (n - 1, 1)


def test_auto_takes_ram_when_the_split_fits_the_budget(root, shm, monkeypatch, caplog):
    from shardkit.stream import cache as cache_mod

    need = _epochs(root, [], cache="ram")[1]["size_bytes"]
    monkeypatch.setattr(cache_mod, "available_memory", lambda: 2 * need - 2)
    with caplog.at_level(logging.INFO, logger="shardkit.stream.cache"):
        with make_loader(root, "train", 8, cache="auto") as loader:
            assert loader.cache is None
    assert "cache='auto' -> none" in caplog.text
    monkeypatch.setattr(cache_mod, "available_memory", lambda: 2 * need)
    with caplog.at_level(logging.INFO, logger="shardkit.stream.cache"):
        with make_loader(root, "train", 8, cache="auto") as loader:
            assert loader.cache_stats()["mode"] == "ram"
    assert "cache='auto' -> ram" in caplog.text


def test_cache_build_command_fills_a_disk_cache_ahead_of_time(root, tmp_path):
    from click.testing import CliRunner

    from shardkit.cli import main

    spec = f"disk:{tmp_path}"
    res = CliRunner().invoke(main, ["cache", "build", str(root), "--cache", spec,
                                    "--no-progress"])
    assert res.exit_code == 0, res.output
    import json

    n = _num_train(root)
    built = json.loads(res.output[res.output.index("{"):])
    assert (built["filled_samples"], built["misses"]) == (n, n)
    _, stats = _epochs(root, [0], cache=spec)
    assert (stats["hits"], stats["misses"]) == (n, 0)
    res = CliRunner().invoke(main, ["cache", "build", str(root), "--cache", "ram"])
    assert res.exit_code == 2 and "disk:DIR" in res.output


def test_train_config_takes_the_cache_options():
    from shardkit.train.config import TrainConfig

    cfg = TrainConfig(data="x", cache="disk:/tmp/c", cache_max_side=256, cache_eval="final")
    assert (cfg.cache, cfg.cache_max_side, cfg.cache_eval) == ("disk:/tmp/c", 256, "final")
    for bad in (dict(cache="rom"), dict(cache_eval="crops"), dict(cache_max_side=0)):
        with pytest.raises(ConfigError, match="cache"):
            TrainConfig(data="x", **bad)


def test_pss_shows_one_copy_of_the_arena_for_two_worker_processes(root, shm):
    """Memory accounting: 2 DataLoader worker processes (fork, persistent) read the slots of a
    filled arena for 3 epochs, so each maps most of it (RSS ~ the arena in each), but PSS summed
    over main + workers counts it once, and no process holds a copy of any of its pages."""
    import psutil

    from shardkit.stream.cache import arena_memory

    workers = WorkerOptions(backend="process", multiprocessing_context="fork",
                            persistent_workers=True)
    with make_loader(root, "train", BATCH, num_workers=2, workers=workers, cache="ram",
                     image_size=32) as loader:
        for e in range(4):  # epoch 0 fills, epochs 1-3 read the slots through the mapping
            loader.set_epoch(e)
            [None for _ in loader]
        stats = loader.cache_stats()
        kids = [p.pid for p in psutil.Process().children(recursive=True)]
        mem = arena_memory(stats["path"], [os.getpid(), *kids])
    data = stats["filled_bytes"]
    assert stats["filled_samples"] == _num_train(root) and data == stats["size_bytes"]
    assert stats["hits"] == 3 * _num_train(root)
    readers = [mem["pids"][pid] for pid in kids if mem["pids"][pid]["rss"] > 0]
    assert len(readers) == 2
    for r in readers:  # each worker built ~half of each epoch's batches: most slots after 3
        assert r["rss"] >= 0.6 * data and r["shared"] > 0 and r["anonymous"] == 0
    # one copy: PSS summed over every process is the arena's size (+ its header and table, and
    # 4 KiB page rounding per slot), not once per process that reads it
    slack = arena_mod.HEADER_BYTES + 64 * 4096 + _num_train(root) * 4096
    assert data <= mem["sum_pss"] <= data + slack, (mem, data)
    assert mem["sum_rss"] >= 1.3 * data and mem["sum_anonymous"] == 0
