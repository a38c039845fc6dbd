"""``shardkit train --cache ram`` end to end on the embedded sample: metrics.json
carries each loader's decoded-cache stats, and the run equals an uncached run with the same seed
step for step (same batches, so the same per-step losses and the same final weights on CPU).

Exactness holds where the cache promises it (``cache_max_side`` unset, and the uncached decode
needs no DCT reduction: every crop under 2x the output side). The sample's photos have a shorter
side of at most 375 px, so at 192 px every crop is under 384 px and both paths resize the same
full-scale pixels.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

SIZE = 192  # > 375 / 2: no DCT reduction on any sample photo, so cached == uncached bit for bit


def _train(data: Path, run: Path, *extra: str) -> dict:
    from shardkit.cli import main

    result = CliRunner().invoke(main, [
        "train", "--data", str(data), "--out", str(run), "--config", "cpu-smoke",
        "--model", "test_resnet", "--image-size", str(SIZE), "--batch-size", "16",
        "--epochs", "2", "--max-steps", "0", "--warmup-steps", "2",
        "--samples-per-epoch", "32", *extra])  # 2 steps per epoch: the test stays short
    assert result.exit_code == 0, result.output + repr(result.exception)
    return json.loads((run / "metrics.json").read_text())


def _step_losses(run: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars("train/loss")]


def _split_sizes(root: Path, split: str) -> list[tuple[int, int]]:
    lines = (root / "splits" / f"{split}.jsonl").read_text().splitlines()
    return [(r["width"], r["height"]) for r in map(json.loads, filter(None, lines))]


def test_train_cache_ram_equals_uncached_run_and_reports_cache_stats(packed_sample, tmp_path):
    data = packed_sample("wds")
    plain = _train(data, tmp_path / "plain")
    cached = _train(data, tmp_path / "cached", "--cache", "ram")

    # the same batches: per-step losses, per-epoch stats and the final weights are identical
    steps = _step_losses(tmp_path / "plain")
    assert [s for s, _ in steps] == [1, 2, 3, 4]  # 32 draws per epoch: 2 batches of 16, x 2
    assert _step_losses(tmp_path / "cached") == steps
    assert [h["train"]["loss"] for h in cached["history"]] == \
        [h["train"]["loss"] for h in plain["history"]]
    assert [h["val"]["confusion_matrix"] for h in cached["history"]] == \
        [h["val"]["confusion_matrix"] for h in plain["history"]]
    assert cached["test"]["confusion_matrix"] == plain["test"]["confusion_matrix"]
    a = torch.load(tmp_path / "plain" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cached" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # metrics.json: one entry per loader; the uncached run has none
    assert plain["cache"] == {"train": None, "val": None, "test": None}
    stats = cached["cache"]
    assert set(stats) == {"train", "val", "test"}
    for split, c in stats.items():
        sizes = _split_sizes(data, split)
        assert c["mode"] == "ram" and c["kind"] == "pixels" and c["resolution"] == "full"
        assert c["num_samples"] == len(sizes)
        assert c["size_bytes"] == sum(w * h * 3 for w, h in sizes)
        assert c["disabled"] is None and c["fill_seconds"] > 0
        # every sample read was decoded once (a miss that filled it) and then served from RAM
        assert c["misses"] == c["filled_samples"] <= len(sizes)
        assert c["hit_rate"] == c["hits"] / (c["hits"] + c["misses"])
        assert c["dct_reduced"] == 0  # every crop < 2 x 192: nothing DCT-reduced uncached
    train = stats["train"]
    # 2 epochs of 32 draws (with replacement) from 140 samples: 64 reads; a sample drawn again,
    # in the same epoch or the next, is a hit
    assert train["hits"] + train["misses"] == 64
    n_val = len(_split_sizes(data, "val"))
    # val is evaluated after each epoch: the first pass fills, the second only hits
    assert (stats["val"]["misses"], stats["val"]["hits"]) == (n_val, n_val)
    n_test = len(_split_sizes(data, "test"))
    assert (stats["test"]["misses"], stats["test"]["hits"]) == (n_test, 0)  # one pass at the end
    for c in stats.values():  # the last holder removed every RAM arena when the run closed
        assert not Path(c["path"]).exists()
