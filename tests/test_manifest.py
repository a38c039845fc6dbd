"""manifest.json / split index writing: atomicity, permissions, non-UTF-8 names, validation."""
from __future__ import annotations

import json
import os
import stat

import pytest

from shardkit.errors import LoaderError, ConfigError, ManifestError
from shardkit.dataset.manifest import (
    atomic_write_bytes, json_bytes, load_index, load_manifest, read_split_records, write_manifest,
    write_split_files)


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
                "path": name, "xxh3": "0123456789abcdef"}]
    hashes = write_split_files(tmp_path, "train", records)
    shard = {"path": "shards/train-000000.tar", "num_samples": 1, "bytes": 1024,
             "sha256": "0" * 64}
    write_manifest(tmp_path, {"format": "wds", "classes": ["a", "b"],
                              "source": {"root": os.fsdecode(b"/data/\xe9t\xe9")},
                              "splits": {"train": {"num_samples": 1, "shards": [shard],
                                                   **hashes}}})
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
    from shardkit.transforms import TransformConfig

    root = packed_sample("wds")
    with pytest.raises(ConfigError, match=r"decoder='nope': expected 'auto' or one of"):
        make_loader(root, "train", 8, transform=TransformConfig(image_size=16, decoder="nope"))
    with pytest.raises(ConfigError, match=r"prefetch_factor=0: expected 'auto' or an int >= 1"):
        make_loader(root, "train", 8, prefetch_factor=0)
    small = make_loader(root, "val", 8, train=False, num_workers=0, image_size=16)
    state = make_loader(root, "train", 8, num_workers=0, image_size=16).state_dict()
    with pytest.raises(LoaderError, match=r"num_batches=18.*num_batches=4"):
        small.load_state_dict(state)


def test_is_url_and_local_path_agree_on_file_uris(tmp_path):
    """One test of "remote URL or local": file:// roots are local (percent-decoded as
    Path.as_uri() encodes them), every other scheme is remote."""
    from pathlib import Path

    from shardkit.storage.urls import is_url, join, local_path

    spaced = tmp_path / "my data" / "été"
    uri = spaced.as_uri()
    assert uri.endswith("/my%20data/%C3%A9t%C3%A9")
    assert not is_url(uri) and local_path(uri) == str(spaced)
    assert join(uri, "splits/train.jsonl") == str(spaced / "splits" / "train.jsonl")
    assert local_path("file://localhost/data/a%20b") == "/data/a b"
    assert local_path(Path("/data/a%20b")) == "/data/a%20b"     # a plain path is not decoded
    for url in ("s3://bucket/ds", "https://host/ds", "HTTP://host/ds", "simplecache::s3://b/ds"):
        assert is_url(url), url
        assert join(url + "/", "manifest.json") == url + "/manifest.json"
        with pytest.raises(ManifestError, match="remote URL"):
            local_path(url)
    assert not is_url("/data/odd://name") and not is_url(Path("/data/ds"))
    with pytest.raises(ManifestError, match="file:///absolute/path"):
        local_path("file://otherhost/data")


def test_manifest_written_and_read_through_a_file_uri(tmp_path):
    root = (tmp_path / "my data").as_uri()
    write_split_files(root, "train", [{"key": "train_00000000", "label": 0, "shard": 0,
                                       "offset": 0, "size": 3}])
    shard = {"path": "shards/train-000000.h5", "num_samples": 1, "bytes": 100,
             "sha256": "0" * 64}
    write_manifest(root, {"format": "hdf5", "classes": ["a"],
                          "splits": {"train": {"num_samples": 1, "shards": [shard]}}})
    assert (tmp_path / "my data" / "manifest.json").is_file()
    assert load_manifest(root)["format"] == "hdf5" and len(load_index(root, "train")) == 1


def test_atomic_write_with_a_file_writer_keeps_the_old_file_on_error(tmp_path):
    import numpy as np

    from shardkit.storage.atomic import atomic_write_with

    target = tmp_path / "a.npy"
    atomic_write_with(target, lambda f: np.save(f, np.arange(5)))
    assert np.load(target).tolist() == [0, 1, 2, 3, 4]

    def failing(f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write_with(target, failing)
    assert np.load(target).tolist() == [0, 1, 2, 3, 4]           # old content intact
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"]     # no temp file left


def test_failed_folder_fsync_warns_once_per_process(tmp_path, monkeypatch, caplog):
    """A file system that refuses fsync on a folder (some network/FUSE mounts) is reported
    once at WARNING naming the folder, not silently ignored, and the write still succeeds."""
    import logging

    from shardkit.storage import atomic as fsio

    real_fsync = os.fsync

    def no_dir_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(22, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", no_dir_fsync)
    monkeypatch.setattr(fsio, "_warned_dirs", False)
    with caplog.at_level(logging.DEBUG, logger="shardkit.fsio"):
        atomic_write_bytes(tmp_path / "a.json", b"{}")
        atomic_write_bytes(tmp_path / "b.json", b"[]")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(tmp_path) in warnings[0].getMessage()
    assert "Invalid argument" in warnings[0].getMessage()
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 1
    assert (tmp_path / "b.json").read_bytes() == b"[]"


def test_the_manifest_file_name_is_written_once():
    """``MANIFEST_NAME`` is defined in shardkit.dataset.schema only; no other module of shardkit
    spells the file name as a string of its own (docstrings and messages built from it aside)."""
    import ast
    from pathlib import Path

    import shardkit
    from shardkit.dataset import manifest, schema, swap
    from shardkit.packer.outputs import owned as output

    root = Path(shardkit.__file__).parent
    assert manifest.MANIFEST_NAME is schema.MANIFEST_NAME == "manifest.json"
    assert swap.MANIFEST_NAME is output.MANIFEST_NAME is schema.MANIFEST_NAME
    spelled = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.strip(" '\"/").endswith("manifest.json") \
                    and len(node.value) < 40:
                spelled.append(path.relative_to(root).as_posix())
    assert spelled == ["dataset/schema.py"]
