"""The per-sample stages (shardkit/stream/stages.py): one pipeline behind the three datasets, and
the ``on_error`` / ``on_warning`` handlers, on the embedded flowers sample packed as tar shards.

A damaged sample is made by overwriting its stored bytes with zeros in a copy of the pack (the
shard keeps its size): with ``verify_reads`` the xxh3 check finds it (a ShardCorruptError that
names the sample), without it the decode fails (an error that does not, wrapped once)."""
from __future__ import annotations

import errno
import logging
import shutil

import numpy as np
import pytest
import torch

from shardkit.decode import DecodeWarningError
from shardkit.errors import (ConfigError, DecodeError, LoaderError, ResourceLimitError,
                             ShardCorruptError, SharedMemoryError, ShardkitError)
from shardkit.dataset.manifest import load_index
from shardkit.stream import (MapShardDataset, SamplingOptions, ShardDataset, WorkerOptions,
                             make_loader)
from shardkit.stream.source import ShardSource
from shardkit.stream.stages import (KeepOnWarning, RaiseOnError, RaiseOnWarning,
                                    SkipOnError, SkipOnWarning, error_handler, names_sample,
                                    warning_handler)
from shardkit.transforms import TransformConfig, make_transform

SPLIT, POS, S = "val", 4, 48  # the val split of packed_sample: 30 photos in one or two shards
ORDER = SamplingOptions(shuffle=False)


@pytest.fixture(scope="module")
def clean(packed_sample):
    return packed_sample("wds")


@pytest.fixture(scope="module")
def damaged(packed_sample, tmp_path_factory):
    """``(root, shard, key)``: a copy of the wds pack whose ``val`` sample ``POS`` has all its
    stored bytes zeroed in place."""
    root = tmp_path_factory.mktemp("stages") / "ds"
    shutil.copytree(packed_sample("wds"), root)
    idx = load_index(root, SPLIT)
    src = ShardSource(root, SPLIT)
    shard, key = src.shard_name(POS), src.key(POS)
    with open(root / shard, "r+b") as f:
        f.seek(int(idx.offset[POS]))
        f.write(bytes(int(idx.size[POS])))
    assert bytes(ShardSource(root, SPLIT, verify_reads=False).read(POS)) == bytes(
        int(idx.size[POS]))
    return root, shard, key


def _loader(root, backend: str, **kw):
    return make_loader(root, SPLIT, 8, train=False, image_size=S, num_workers=1,
                       return_meta=True, workers=WorkerOptions(backend=backend), **kw)


def _rows(loader) -> dict[int, tuple[torch.Tensor, int]]:
    with loader:
        return {int(i): (x.clone(), int(y)) for images, labels, meta in loader
                for i, x, y in zip(meta["index"], images, labels)}


# --- on_error on real data, both backends -----------------------------------------------------

@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("verify", [True, False])
def test_on_error_raise_names_the_damaged_sample_once(damaged, backend, verify):
    """raise: the checksum's ShardCorruptError names the sample and is raised as it is; the
    transform's decode error does not, and is wrapped once in a DecodeError naming it."""
    root, shard, key = damaged
    with _loader(root, backend, verify_reads=verify) as loader:
        with pytest.raises(ShardCorruptError if verify else DecodeError) as e:
            list(loader)
    text = str(e.value)
    if verify:
        assert f"shard {shard}: sample {key!r} is corrupt: xxh3 of its" in text
    else:
        assert f"shard {shard}: sample {key!r} failed: DecodeError: " in text
    if backend == "thread":  # the exception object itself (a worker process sends its text)
        assert (e.value.shard, e.value.key) == (shard, key)
        assert text.count(key) == 1
        if not verify:
            cause = e.value.__cause__
            assert isinstance(cause, DecodeError) and cause.key is None and key not in str(cause)


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("verify", [True, False])
def test_on_error_skip_leaves_out_only_the_damaged_sample(clean, damaged, backend, verify,
                                                          caplog):
    """skip: every other sample arrives with the pixels and label of the undamaged pack, the
    damaged key is listed once in ``loader.skipped`` and logged once (threads log here)."""
    root, shard, key = damaged
    want = _rows(_loader(clean, "thread"))
    loader = _loader(root, backend, verify_reads=verify, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardkit.stream"):
        got = _rows(loader)
    assert sorted(got) == [i for i in range(30) if i != POS]
    assert loader.skipped == [key]
    for i, (x, y) in got.items():
        assert torch.equal(x, want[i][0]) and y == want[i][1]
    if backend == "thread":
        msgs = [r.getMessage() for r in caplog.records if "on_error='skip'" in r.getMessage()]
        assert len(msgs) == 1 and msgs[0].startswith(
            f"on_error='skip': skipped sample {key!r} of shard {shard}: ")


def test_dict_datasets_take_the_same_handlers(damaged):
    """ShardDataset: on_error raise / skip as the loader (its own decode names the sample, so
    it is raised as it is). MapShardDataset: every error propagates unchanged."""
    root, shard, key = damaged
    with pytest.raises(ShardCorruptError) as e:
        list(ShardDataset(root, SPLIT, sampling=ORDER))
    assert (e.value.shard, e.value.key) == (shard, key)
    with pytest.raises(DecodeError) as e:
        list(ShardDataset(root, SPLIT, sampling=ORDER, verify_reads=False))
    assert (e.value.shard, e.value.key) == (shard, key)
    assert str(e.value).startswith(f"shard {shard}: cannot decode sample {key!r}: ")
    for verify in (True, False):
        ds = ShardDataset(root, SPLIT, sampling=ORDER, on_error="skip", verify_reads=verify)
        samples = list(ds)
        assert ds.skipped == [key]
        assert [s["index"] for s in samples] == [i for i in range(30) if i != POS]

    md = MapShardDataset(root, SPLIT)
    with pytest.raises(ShardCorruptError) as e:
        md[POS]
    assert (e.value.shard, e.value.key) == (shard, key)
    assert md[POS + 1]["key"] != key
    tf = make_transform(TransformConfig(image_size=S), False)
    md = MapShardDataset(root, SPLIT, transform=tf, verify_reads=False)
    with pytest.raises(DecodeError) as e:
        md[POS]
    assert (e.value.shard, e.value.key) == (shard, key)   # the transform's error, named
    assert str(e.value).startswith(f"shard {shard}: sample {key!r} failed: DecodeError: ")


def test_map_dataset_names_the_shard_of_an_os_error(clean, monkeypatch):
    """An I/O error of the shard file (EIO from a failing disk or a network mount): an error
    naming shard and key, chained to it, not a bare OSError."""
    md = MapShardDataset(clean, SPLIT)
    shard, key = md.source.shard_name(POS), md.source.key(POS)

    def failing_read(pos):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(md.source, "read", failing_read)
    with pytest.raises(DecodeError) as e:
        md[POS]
    assert (e.value.shard, e.value.key) == (shard, key)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.EIO
    assert str(e.value).startswith(f"shard {shard}: sample {key!r} failed: OSError: [Errno 5]")


# --- the handlers, on a real source ------------------------------------------------------------

def test_an_error_names_its_sample_by_attributes_never_by_its_text(clean):
    src = ShardSource(clean, SPLIT)
    shard, key = src.shard_name(POS), src.key(POS)
    handler = error_handler("raise")
    assert isinstance(handler, RaiseOnError) and error_handler("raise") is handler

    worded = ShardCorruptError(f"shard {shard}: sample {key!r} looks wrong")  # no attributes
    assert not names_sample(worded, shard, key)
    with pytest.raises(DecodeError) as e:
        handler(worded, src, POS)
    assert e.value.__cause__ is worded and (e.value.shard, e.value.key) == (shard, key)
    assert str(e.value) == f"shard {shard}: sample {key!r} failed: ShardCorruptError: {worded}"

    for err in (ShardCorruptError("named", shard=shard, key=key), DecodeError("named", key=key),
                ShardCorruptError("the whole shard", shard=shard)):
        assert names_sample(err, shard, key)
        with pytest.raises(type(err)) as e:
            handler(err, src, POS)
        assert e.value is err
    for err in (ShardCorruptError("another shard", shard="shards/val-000009.tar"),
                DecodeError("another sample", shard=shard, key="val_99999999"),
                DecodeError("a decode error is not about its shard", shard=shard),
                ValueError(f"{key!r}")):
        assert not names_sample(err, shard, key)
        with pytest.raises(DecodeError) as e:
            handler(err, src, POS)
        assert e.value is not err and e.value.__cause__ is err and e.value.key == key


def test_skip_and_the_rules_every_handler_keeps(clean, caplog):
    src = ShardSource(clean, SPLIT)
    shard, key = src.shard_name(POS), src.key(POS)
    skip = error_handler("skip")
    assert isinstance(skip, SkipOnError)
    with caplog.at_level(logging.WARNING, logger="shardkit.stream"):
        assert skip(OSError(errno.EIO, "Input/output error"), src, POS) == key
    assert [r.getMessage() for r in caplog.records] == [
        f"on_error='skip': skipped sample {key!r} of shard {shard}: [Errno 5] Input/output error"]
    for handler in (skip, error_handler("raise")):
        # the OS out of a resource is never the sample's fault
        with pytest.raises(ResourceLimitError) as e:
            handler(OSError(errno.EMFILE, "Too many open files"), src, POS)
        assert e.value.errno == errno.EMFILE and f"sample {key!r}" in str(e.value)
        # on_warning="raise" is the user's choice: never handled as a sample error
        warned = DecodeWarningError("2 decoder warning(s)")
        with pytest.raises(DecodeWarningError) as e:
            handler(warned, src, POS)
        assert e.value is warned
    with pytest.raises(ConfigError, match=r"on_error='ignore' is not one of \['raise', 'skip'\]"):
        error_handler("ignore")


def test_warning_handlers(clean):
    src = ShardSource(clean, SPLIT)
    shard, key = src.shard_name(POS), src.key(POS)
    keep, skip, raise_ = (warning_handler(n) for n in ("keep", "skip", "raise"))
    assert (type(keep), type(skip), type(raise_)) == (KeepOnWarning, SkipOnWarning,
                                                      RaiseOnWarning)
    assert keep(3, "Corrupt JPEG data", src, POS) is True
    assert skip(3, "Corrupt JPEG data", src, POS) is False
    with pytest.raises(DecodeWarningError) as e:
        raise_(3, "Corrupt JPEG data", src, POS)
    assert str(e.value) == (f"shard {shard}: sample {key!r}: 3 decoder warning(s), last: "
                            "'Corrupt JPEG data'")
    assert (e.value.shard, e.value.key) == (shard, key)
    with pytest.raises(ConfigError, match=r"on_warning='ignore' is not one of"):
        warning_handler("ignore")


# --- one pipeline: the same samples and pixels from the three datasets ------------------------

@pytest.mark.parametrize("train", [True, False])
def test_the_three_datasets_yield_the_same_samples_and_pixels(clean, train):
    """For one plan (split order, one rank), ShardDataset and MapShardDataset with the factory
    transform give, sample by sample, the key, label and pixels of the loader's batch rows (the
    random crops too: the same RNG per place); decoded and raw they agree with each other."""
    split, seed = ("train", 7) if train else ("val", 0)
    cfg = TransformConfig(image_size=S)
    with make_loader(clean, split, 16, train=train, transform=cfg, sampling=ORDER, seed=seed,
                     num_workers=0, return_meta=True) as loader:
        batches = [(x.permute(0, 2, 3, 1).numpy().copy(), y, m) for x, y, m in loader]
    rows = np.concatenate([x for x, _, _ in batches])
    labels = torch.cat([y for _, y, _ in batches]).tolist()
    index = torch.cat([m["index"] for _, _, m in batches]).tolist()
    n = len(ShardSource(clean, split))
    assert index == list(range(n))
    crops = list(ShardDataset(clean, split, train=train, sampling=ORDER, seed=seed,
                              transform=make_transform(cfg, train)))
    mapped = MapShardDataset(clean, split, seed=seed, transform=make_transform(cfg, train))
    decoded = list(ShardDataset(clean, split, train=train, sampling=ORDER))
    raw = list(ShardDataset(clean, split, train=train, sampling=ORDER, decode=False))
    mapped_decoded = MapShardDataset(clean, split)
    src = ShardSource(clean, split)
    assert len(crops) == len(decoded) == len(raw) == n
    for j in range(n):
        m = mapped[j]
        assert crops[j]["index"] == m["index"] == j
        assert crops[j]["key"] == m["key"] == decoded[j]["key"] == raw[j]["key"]
        assert crops[j]["label"] == m["label"] == labels[j]
        assert np.array_equal(crops[j]["image"], rows[j])
        assert np.array_equal(m["image"], rows[j])
        assert np.array_equal(decoded[j]["image"], mapped_decoded[j]["image"])
        assert decoded[j]["image"].dtype == np.uint8 and decoded[j]["image"].ndim == 3
        assert raw[j]["image"] == bytes(src.read(j))
    if train:  # the crops are random: not the eval crops
        centre = make_transform(cfg, False)
        eval_rows = np.stack([centre(raw[j]["image"], np.random.default_rng(0))
                              for j in range(n)])
        assert not np.array_equal(eval_rows, rows)


def test_settings_changed_on_a_dataset_reach_its_stages(clean):
    ds = ShardDataset(clean, SPLIT, sampling=ORDER, decode=False)
    assert isinstance(next(iter(ds))["image"], bytes)
    ds.decode = True
    assert next(iter(ds))["image"].shape[2] == 3
    ds.transform = lambda data, rng: len(data)
    assert next(iter(ds))["image"] == len(ShardSource(clean, SPLIT).read(0))
    ds.on_warning = "skip"
    assert ds.on_warning == "skip" and isinstance(ds.stages.on_warning, SkipOnWarning)
    with pytest.raises(ConfigError, match="on_warning='ignore'"):
        ds.on_warning = "ignore"


# --- the process backend's shared-memory failure is typed, not read from text ------------------

def test_no_shared_memory_for_a_batch_buffer_is_one_clear_error(clean, monkeypatch):
    """The batch buffer a worker allocates in shared memory: torch's RuntimeError there is a
    SharedMemoryError (a LoaderError) in the consumer, naming /dev/shm and what to change."""
    def refuse(*args, **kwargs):
        raise RuntimeError("refused by the test")  # no word of shared memory in it

    with make_loader(clean, SPLIT, 8, train=False, image_size=S, num_workers=1,
                     workers=WorkerOptions(backend="process", multiprocessing_context="fork",
                                           timeout=60)) as loader:
        monkeypatch.setattr(torch.UntypedStorage, "_new_shared", refuse)  # the forked worker's
        with pytest.raises(SharedMemoryError) as e:
            next(iter(loader))
    assert isinstance(e.value, LoaderError) and isinstance(e.value, ShardkitError)
    assert "could not allocate shared memory" in str(e.value) and "/dev/shm" in str(e.value)
    assert "refused by the test" in str(e.value)


def test_the_last_batch_built_in_parts_is_the_batch_built_whole(clean, tmp_path, monkeypatch):
    """The thread backend builds an epoch's last batch in row ranges on every thread (so none
    idles while one builds it alone): the same rows, labels, meta, skipped key and augment
    programs as one thread building it, also with a damaged sample in that batch."""
    from shardkit.stream.datasets import BatchDataset

    root = tmp_path / "ds"
    shutil.copytree(clean, root)
    last = 27                                         # val: 30 samples, batch 8: rows 24-29
    idx = load_index(root, SPLIT)
    src = ShardSource(root, SPLIT)
    shard, key = src.shard_name(last), src.key(last)
    with open(root / shard, "r+b") as f:
        f.seek(int(idx.offset[last]))
        f.write(bytes(int(idx.size[last])))
    parts = []
    real = BatchDataset.build_part

    def counted(self, batch, lo, hi, *args, **kw):
        parts.append((batch.b, lo, hi))
        return real(self, batch, lo, hi, *args, **kw)

    monkeypatch.setattr(BatchDataset, "build_part", counted)

    def epoch(num_workers, **kw):
        with make_loader(root, SPLIT, 8, train=True, image_size=S, num_workers=num_workers,
                         return_meta=True, on_error="skip", seed=3,
                         sampling=SamplingOptions(shuffle=False), **kw) as loader:
            got = [(x.clone(), y.clone(), {k: (v.clone() if torch.is_tensor(v) else v)
                                           for k, v in m.items()}) for x, y, m in loader]
            return got, loader.skipped

    for kw in ({}, {"augment": "randaugment"}, {"augment": "standard", "augment_device": "cpu"}):
        parts.clear()
        whole, skipped_whole = epoch(0, **kw)
        assert parts == [(b, 0, n) for b, n in enumerate([8, 8, 8, 6])]
        parts.clear()
        split, skipped_split = epoch(2, **kw)
        assert sorted(p for p in parts if p[0] == 3) == [(3, 0, 1), (3, 1, 3), (3, 3, 4),
                                                         (3, 4, 6)]     # 2 x 2 threads
        assert skipped_whole == skipped_split == [key]
        assert len(whole) == len(split) == 4
        for (xa, ya, ma), (xb, yb, mb) in zip(whole, split):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
            assert torch.equal(ma["index"], mb["index"]) and torch.equal(ma["valid"], mb["valid"])
            assert ma.get("augment") == mb.get("augment")
        assert last not in split[3][2]["index"].tolist() and len(split[3][0]) == 5
