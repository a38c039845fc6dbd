"""A training checkpoint carries the xxh3 of its values: bytes flipped on disk are an error on
``--resume`` (torch.load itself checks no checksum of tensor data), never a silent resume."""
from __future__ import annotations

import logging

import pytest
import torch

from shardkit.errors import CheckpointError
from shardkit.train.checkpoint import (CHECKPOINT_FORMAT, load_checkpoint, payload_digest,
                                       save_checkpoint)


def _payload():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "classes": ["daisy", "rose", "tulip"]}


def _flip_inside(path, needle: bytes) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.find(needle)
    assert at > 0 and raw.find(needle, at + 1) < 0       # the tensor's bytes, stored once
    raw[at + 5] ^= 0x10                                  # one bit of one float32
    path.write_bytes(bytes(raw))


def test_digest_round_trips_and_names_the_flipped_file(tmp_path):
    payload = _payload()
    path = tmp_path / "last.pt"
    save_checkpoint(path, payload)
    loaded = load_checkpoint(path, ("model", "optimizer", "epoch", "classes"))
    assert loaded["version"] == 2 and loaded["digest"] == payload_digest(loaded)
    assert torch.equal(loaded["model"]["0.weight"], payload["model"]["0.weight"])

    weight = payload["model"]["2.weight"].contiguous().numpy().tobytes()
    _flip_inside(path, weight)
    damaged = torch.load(path, weights_only=True)        # torch alone loads it silently...
    assert not torch.equal(damaged["model"]["2.weight"], payload["model"]["2.weight"])
    with pytest.raises(CheckpointError, match=r"last\.pt fails its digest"):
        load_checkpoint(path, ("model",))               # ...shardkit refuses it


def test_a_changed_number_fails_the_digest_too(tmp_path):
    payload = _payload()
    path = tmp_path / "c.pt"
    save_checkpoint(path, payload)
    obj = torch.load(path, weights_only=True)
    obj["epoch"] = 4                                     # the digest covers non-tensor values
    torch.save(obj, path)
    with pytest.raises(CheckpointError, match="fails its digest"):
        load_checkpoint(path)


def test_version_1_loads_with_a_warning_and_a_missing_digest_is_refused(tmp_path, caplog):
    payload = _payload()
    old = tmp_path / "v1.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, **payload}, old)
    with caplog.at_level(logging.WARNING, logger="shardkit.train.checkpoint"):
        assert load_checkpoint(old, ("model",))["epoch"] == 3
    assert "before checkpoints carried a digest" in caplog.text

    stripped = tmp_path / "v2.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "version": 2, **payload}, stripped)
    with pytest.raises(CheckpointError, match="has no digest"):
        load_checkpoint(stripped)


def test_a_first_byte_flipped_is_called_damaged_not_a_foreign_pickle(tmp_path):
    """Byte 0 flipped turns the zip into bytes torch reads as a legacy pickle that does not
    parse: the error says the checkpoint is damaged and what to do, not "save a state_dict"."""
    path = tmp_path / "last.pt"
    save_checkpoint(path, _payload())
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, ("model",))
    text = str(info.value)
    assert f"checkpoint {path} is damaged" in text and "best.pt" in text
    assert "state_dict" not in text and "\n" not in text
