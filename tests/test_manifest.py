"""manifest.json / split index writing: atomicity, permissions, non-UTF-8 names, validation."""
from __future__ import annotations

import json
import os
import stat

import pytest

from shardkit.errors import LoaderError, ConfigError, ManifestError
from shardkit.manifest import (atomic_write_bytes, json_bytes, load_index, load_manifest,
                               read_split_records, write_manifest, write_split_files)


def test_json_bytes_keeps_unicode_readable_and_escapes_non_utf8_names():
    assert json_bytes({"c": "向日葵"}) == '{"c": "向日葵"}'.encode("utf-8")
    name = os.fsdecode(b"caf\xe9_latin1.jpg")  # a Latin-1 file name, as os.listdir returns it
    data = json_bytes({"path": name})
    data.decode("utf-8")  # valid UTF-8 JSON
    assert os.fsencode(json.loads(data)["path"]) == b"caf\xe9_latin1.jpg"


def test_atomic_files_respect_the_umask(tmp_path):
    """Metadata must be readable by other users (an HTTP server, a colleague): mkstemp's 0600
    would make the dataset private to its packer while its shards are 0644."""
    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "a.json", b"{}")
        os.umask(0o077)
        atomic_write_bytes(tmp_path / "b.json", b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no temp left


def test_split_files_round_trip_with_a_non_utf8_path(tmp_path):
    name = os.fsdecode(b"daisy/caf\xe9.jpg")
    records = [{"key": "train_00000000", "label": 1, "shard": 0, "offset": 512, "size": 10,
                "path": name}]
    write_split_files(tmp_path, "train", records)
    write_manifest(tmp_path, {"format": "wds", "classes": ["a", "b"],
                              "source": {"root": os.fsdecode(b"/data/\xe9t\xe9")},
                              "splits": {"train": {"num_samples": 1, "shards": []}}})
    assert os.fsencode(read_split_records(tmp_path, "train")[0]["path"]) == b"daisy/caf\xe9.jpg"
    index = load_index(tmp_path, "train")
    assert index.key_at(0) == "train_00000000" and int(index.offset[0]) == 512
    assert load_manifest(tmp_path)["schema_version"] == 1


def test_missing_manifest_and_unknown_split_are_clear(tmp_path):
    with pytest.raises(ManifestError, match="not a finished shardkit dataset"):
        load_manifest(tmp_path)
    write_manifest(tmp_path, {"format": "wds", "classes": ["a"],
                              "splits": {"train": {"num_samples": 0, "shards": []}}})
    with pytest.raises(ManifestError, match=r"split 'val' not in .*available: \['train'\]"):
        load_index(tmp_path, "val")


def test_loader_rejects_bad_decoder_prefetch_and_foreign_state(packed_sample):
    from shardkit import make_loader

    root = packed_sample("wds")
    with pytest.raises(ConfigError, match=r"decoder='nope': expected 'auto' or one of"):
        make_loader(root, "train", 8, decoder="nope")
    with pytest.raises(ConfigError, match=r"prefetch_factor=0: expected an int >= 1"):
        make_loader(root, "train", 8, prefetch_factor=0)
    small = make_loader(root, "val", 8, train=False, num_workers=0, image_size=16)
    state = make_loader(root, "train", 8, num_workers=0, image_size=16).state_dict()
    with pytest.raises(LoaderError, match=r"num_batches=18.*num_batches=4"):
        small.load_state_dict(state)
