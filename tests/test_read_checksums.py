"""Per-sample checksums: a flipped byte inside a sample's JPEG entropy data
decodes into damaged pixels without any decoder error; the xxh3 stored at pack time catches it on
every read, through ``on_error`` like any other bad sample, and ``shardkit verify`` names it."""
from __future__ import annotations

import io
import json
import logging
import shutil

import numpy as np
import pytest
from PIL import Image

from shardkit.errors import ManifestError, ShardCorruptError
from shardkit.dataset.manifest import (
    load_index, load_manifest, read_split_records, sample_checksum, write_split_files)
from shardkit.stream import ShardDataset, make_loader
from shardkit.stream.source import ShardSource
from shardkit.doctor.verify import verify

from conftest import SAMPLE

SPLIT, POS = "val", 3  # the val split of packed_sample: 30 photos, all stored as the originals


def _entropy_offset(jpeg: bytes) -> int:
    """An offset in the middle of the entropy-coded data of a baseline JPEG (after the SOS
    header), where a flipped bit makes neither a marker nor a stuffed byte."""
    sos = jpeg.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(jpeg[sos + 2:sos + 4], "big")
    p = start + (len(jpeg) - 2 - start) // 2
    while 0xFF in (jpeg[p - 1], jpeg[p], jpeg[p] ^ 0x10):
        p += 1
    return p


@pytest.fixture
def damaged(packed_sample, tmp_path):
    """``make(fmt) -> (root, key, good bytes, flipped offset)``: a copy of the packed sample with
    one bit of sample ``POS`` of ``val`` flipped in its shard file (size unchanged)."""
    def make(fmt: str):
        root = tmp_path / fmt
        shutil.copytree(packed_sample(fmt), root)
        rec = read_split_records(root, SPLIT)[POS]
        assert rec["rule"] == "original"
        good = (SAMPLE / rec["path"]).read_bytes()  # not read through the shard: no env cached
        shard = root / load_manifest(root)["splits"][SPLIT]["shards"][rec["shard"]]["path"]
        blob = shard.read_bytes()
        at = blob.find(good)
        assert at >= 0 and blob.find(good, at + 1) == -1  # stored once, unchanged (all formats)
        p = _entropy_offset(good)
        with open(shard, "r+b") as f:
            f.seek(at + p)
            f.write(bytes([good[p] ^ 0x10]))
        return root, rec["key"], good, p
    return make


def test_pack_stores_the_xxh3_of_the_stored_bytes(packed_sample):
    root = packed_sample("wds")
    records = read_split_records(root, SPLIT)
    index = load_index(root, SPLIT)
    src = ShardSource(root, SPLIT)
    assert src.verified and index.xxh3.dtype == np.uint64 and len(index.xxh3) == 30
    for i, rec in enumerate(records):
        stored = bytes(src.read(i))
        assert rec["xxh3"] == f"{sample_checksum(stored):016x}" == f"{int(index.xxh3[i]):016x}"
        assert stored == (SAMPLE / rec["path"]).read_bytes()
    assert len({r["xxh3"] for r in records}) == 30


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5"])
def test_flipped_entropy_byte_raises_or_skips_through_on_error(fmt, damaged):
    root, key, good, p = damaged(fmt)
    # unchecked, the damage is silent: the bytes decode, into different pixels
    bad = bytes(ShardSource(root, SPLIT, verify_reads=False).read(POS))
    assert len(bad) == len(good) and bad[p] == good[p] ^ 0x10
    assert bad[:p] == good[:p] and bad[p + 1:] == good[p + 1:]
    diff = np.abs(_decode(bad) - _decode(good)).max(axis=-1)
    assert 0 < np.count_nonzero(diff) and diff.max() > 32
    # checked by default, on both read paths (read_scratch for batches, read for datasets)
    src = ShardSource(root, SPLIT)
    want = f"{sample_checksum(good):016x}"
    found = f"{sample_checksum(bad):016x}"
    for read in (src.read, src.read_scratch):
        with pytest.raises(ShardCorruptError) as e:
            read(POS)
        assert f"{key!r}" in str(e.value) and src.shard_name(POS) in str(e.value)
        assert f"is {found}, the index says {want}" in str(e.value)
    for workers in (0, 2):
        with pytest.raises(ShardCorruptError, match=f"'{key}'.*{found}.*{want}"):
            list(make_loader(root, SPLIT, 8, train=False, num_workers=workers))
    with pytest.raises(ShardCorruptError, match=f"'{key}'"):
        list(ShardDataset(root, SPLIT, decode=False))
    loader = make_loader(root, SPLIT, 8, train=False, num_workers=2, on_error="skip",
                         return_meta=True)
    batches = list(loader)
    seen = np.concatenate([m["index"].numpy() for _, _, m in batches])
    assert loader.skipped == [key] and sorted(seen) == [i for i in range(30) if i != POS]
    ds = ShardDataset(root, SPLIT, decode=False, on_error="skip")
    samples = list(ds)
    assert ds.skipped == [key] and len(samples) == 29 and key not in {s["key"] for s in samples}


@pytest.mark.parametrize("fmt", ["wds", "lmdb", "hdf5"])
def test_verify_names_the_damaged_sample(fmt, damaged):
    root, key, good, _ = damaged(fmt)
    report = verify(root, decode=False)
    shard = ShardSource(root, SPLIT, verify_reads=False).shard_name(POS)
    assert not report.ok and report.bad_shards == [shard]
    if fmt == "lmdb":  # verify never maps a changed LMDB file: only the shard is named
        assert report.bad_keys == []
    else:
        assert report.bad_keys == [key]
        line = next(x for x in report.problems if f"{key!r}" in x)
        assert f"recorded {sample_checksum(good):016x}" in line


def test_verify_finds_an_index_that_disagrees_with_the_split_file(packed_sample, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(packed_sample("wds"), root)
    records = read_split_records(root, SPLIT)
    lines = (root / f"splits/{SPLIT}.jsonl").read_text().splitlines()
    rec = json.loads(lines[POS])
    rec["xxh3"] = f"{int(rec['xxh3'], 16) ^ 1:016x}"
    lines[POS] = json.dumps(rec, sort_keys=True)
    (root / f"splits/{SPLIT}.jsonl").write_text("\n".join(lines) + "\n")
    report = verify(root, decode=False)
    key = records[POS]["key"]
    assert report.bad_keys == [key, key]  # the index disagrees, and the bytes do not match
    assert any(f"differ in xxh3 for 1 sample(s): {key!r} (index {records[POS]['xxh3']}, "
               f"records {rec['xxh3']})" in x for x in report.problems)
    assert any("splits/val.jsonl has sha256" in x for x in report.problems)  # edited after pack


def test_an_index_without_checksums_loads_and_says_once_it_cannot_verify(packed_sample,
                                                                         tmp_path, caplog):
    """A dataset packed before checksums (and split-file hashes) existed: no xxh3 in the index,
    no index_sha256 in the manifest. (With the hash recorded, such an index is refused:
    tests/test_untrusted.py.)"""
    root = tmp_path / "old"
    shutil.copytree(packed_sample("hdf5"), root)
    path = root / f"splits/{SPLIT}.index.npz"
    with np.load(path) as z:
        arrays = {name: z[name] for name in z.files if name != "xxh3"}
    np.savez(path, **arrays)
    manifest = json.loads((root / "manifest.json").read_text())
    for entry in manifest["splits"].values():
        del entry["index_sha256"], entry["records_sha256"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert load_index(root, SPLIT).xxh3 is None
    with caplog.at_level(logging.WARNING, logger="shardkit.stream"):
        sources = [ShardSource(root, SPLIT), ShardSource(root, SPLIT)]
    notes = [r.getMessage() for r in caplog.records if "not verified" in r.getMessage()]
    assert len(notes) == 1 and f"split {SPLIT!r}" in notes[0] and str(root) in notes[0]
    assert not sources[0].verified and sources[0].verify_reads
    rec = read_split_records(root, SPLIT)[POS]
    assert bytes(sources[1].read(POS)) == (SAMPLE / rec["path"]).read_bytes()


def test_split_files_take_checksums_in_all_records_or_none(tmp_path):
    rec = {"key": "train_00000000", "label": 0, "shard": 0, "offset": 512, "size": 10}
    with pytest.raises(ManifestError, match="1 of 2 records have 'xxh3'; expected all or none"):
        write_split_files(tmp_path, "train", [{**rec, "xxh3": "0123456789abcdef"}, rec])
    with pytest.raises(ManifestError, match=r"'train_00000000' has xxh3 12345; expected 16"):
        write_split_files(tmp_path, "train", [{**rec, "xxh3": 12345}])
    assert not (tmp_path / "splits").exists()


def _decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB")).astype(np.int16)
