"""Tests of ``shardkit train``: config, model adapter (field case 23), schedule, losses, metrics,
and end-to-end CPU runs on the embedded sample packed by shardkit (smoke, resume, overfit,
torchrun gloo, case 23)."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from shardkit.errors import (
    ConfigError, LabelError, ManifestError, OutputExistsError, ResumeMismatchError)
from shardkit.train import (TrainConfig, build_model, check_labels, classification_metrics,
                            load_config, load_pretrained, topk_for, train)
from shardkit.train.dist import all_gather_varlen, resolve_amp
from shardkit.train.data import resolve_mean_std
from shardkit.train.metrics import EarlyStopping, better
from shardkit.train.model import param_groups, probe_model
from shardkit.train.optim import (FocalLoss, build_loss, build_optimizer, build_scheduler,
                                  class_weights)

ROOT = Path(__file__).resolve().parents[1]
CLASSES3 = ["a", "b", "c"]


# ----------------------------------------------------------------------------- config
def test_config_yaml_then_flags():
    config = load_config("cpu-smoke", lr=0.25, batch_size=None)
    assert config.lr == 0.25                      # flag wins
    assert config.batch_size == 8                 # None flag keeps the YAML value
    assert config.amp == "off" and config.image_size == 64
    default = load_config("default")
    assert default.model == "hrnet_w18_small" and default.opt == "sgd"


def test_cli_help_lists_every_documented_flag():
    from click.testing import CliRunner

    from shardkit.cli import main

    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0, result.output
    for flag in ("--data", "--out", "--model", "--epochs", "--max-steps", "--batch-size",
                 "--image-size", "--lr", "--num-workers", "--config", "--resume",
                 "--overfit-batches", "--opt", "--weight-decay", "--warmup-epochs",
                 "--warmup-steps", "--label-smoothing", "--clip-grad", "--loss", "--balance",
                 "--amp", "--compile", "--channels-last", "--patience", "--monitor",
                 "--mean-std", "--seed", "--device", "--pretrained"):
        assert f"{flag} " in result.output or f"{flag}/" in result.output, flag
    bad = CliRunner().invoke(main, ["train", "--data", "x", "--out", "y", "--opt", "adam"])
    assert bad.exit_code == 2 and "'adam' is not one of 'sgd', 'adamw'" in bad.output


def test_cli_reports_a_missing_dataset_without_traceback(tmp_path):
    from click.testing import CliRunner

    from shardkit.cli import main

    result = CliRunner().invoke(main, ["-q", "train", "--data", str(tmp_path / "nowhere"),
                                       "--out", str(tmp_path / "run"), "--config", "cpu-smoke"])
    assert result.exit_code == 2  # the convention of every command: 2 = could not run
    (line,) = result.output.splitlines()
    assert line.startswith("Error: ManifestError: ") and "nowhere" in line
    assert "Traceback" not in result.output


def test_config_rejects_unknown_and_invalid_values():
    with pytest.raises(ConfigError, match="unknown key.*'learning_rate'"):
        TrainConfig.from_dict({"learning_rate": 0.1})
    with pytest.raises(ConfigError, match="opt='adam'.*sgd"):
        TrainConfig(opt="adam")
    with pytest.raises(ConfigError, match="label_smoothing=1.0"):
        TrainConfig(label_smoothing=1.0)
    with pytest.raises(ConfigError, match="batch_size=0"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match="nonexistent"):
        load_config("nonexistent")


# ----------------------------------------------------------------------------- model (case 23)
def test_head_size_from_num_classes_not_1000():
    model = build_model("hrnet_w18_small", 3).eval()
    with torch.no_grad():
        logits = model(torch.zeros(2, 3, 64, 64))
    assert logits.shape == (2, 3)
    assert model.get_classifier().out_features == 3


def test_probe_rejects_input_sizes_the_model_cannot_take():
    model = build_model("hrnet_w18_small", 3)
    probe_model(model, 64, 3)
    assert model.training                            # train mode restored
    with pytest.raises(ConfigError, match="48x48 .*multiple of 32"):
        probe_model(model, 48, 3)
    with pytest.raises(ConfigError, match=r"\(1, 3\).*expected \(1, 4\)"):
        probe_model(model, 64, 4)


def test_unknown_model_name_raises():
    with pytest.raises(ConfigError, match="hrnet_w18_smol"):
        build_model("hrnet_w18_smol", 3)


def test_topk_clamped_to_num_classes():
    assert topk_for(3) == (1,) and topk_for(5) == (1,)
    assert topk_for(6) == (1, 5)
    logits = torch.tensor([[3.0, 2.0, 1.0], [0.0, 1.0, 5.0], [1.0, 0.0, 0.0]])
    result = classification_metrics(logits, torch.tensor([0, 1, 0]), CLASSES3)
    assert "top5" not in result and result["top1"] == pytest.approx(2 / 3)
    # six classes: top-5 is reported and counts a label ranked 5th as a hit
    six = torch.tensor([[6.0, 5.0, 4.0, 3.0, 2.0, 1.0]] * 2)
    result6 = classification_metrics(six, torch.tensor([4, 5]), list("abcdef"))
    assert result6["top1"] == 0.0 and result6["top5"] == pytest.approx(0.5)


def test_labels_out_of_range_raise_naming_the_label():
    check_labels(torch.tensor([0, 1, 2]), 3)
    with pytest.raises(LabelError, match=r"label 3 .*\[0, 3\)"):
        check_labels(torch.tensor([0, 3, 1]), 3)
    with pytest.raises(LabelError, match="label -1"):
        check_labels(torch.tensor([-1]), 3)


def test_pretrained_shape_mismatch_skipped_and_reported(tmp_path):
    source = build_model("hrnet_w18_small", 5)
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}},
               tmp_path / "w.pth")
    model = build_model("hrnet_w18_small", 3)
    report = load_pretrained(model, tmp_path / "w.pth")
    skipped = {s["key"]: (s["checkpoint"], s["model"]) for s in report["skipped_shape"]}
    assert skipped == {"classifier.weight": ([5, 2048], [3, 2048]),
                       "classifier.bias": ([5], [3])}
    assert report["missing"] == ["classifier.bias", "classifier.weight"]
    assert report["loaded"] == len(source.state_dict()) - 2
    assert torch.equal(model.state_dict()["conv1.weight"], source.state_dict()["conv1.weight"])
    assert not torch.equal(model.classifier.weight[:3], source.classifier.weight[:3])


class _Exploit:
    """Unpickling this object runs ``touch <marker>`` (what a crafted checkpoint can do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import shlex

        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def test_crafted_pickle_is_refused_for_resume_and_pretrained_and_never_runs(tmp_path):
    """--resume and --pretrained load with weights_only=True: a .pt whose pickle calls
    os.system is refused with a one-line CheckpointError naming the file; the code never runs."""
    import pickle

    from shardkit.errors import CheckpointError
    from shardkit.train.checkpoint import CHECKPOINT_FORMAT, load_checkpoint

    marker = tmp_path / "pwned"
    weights = build_model("test_resnet", 3).state_dict()
    crafted = {
        "resume.pt": {"format": CHECKPOINT_FORMAT, "version": 1, "model": weights,
                      "config": _Exploit(marker)},
        "weights.pth": {"state_dict": weights, "extra": _Exploit(marker)},
    }
    for name, payload in crafted.items():
        torch.save(payload, tmp_path / name)
    with open(tmp_path / "raw.pkl.pt", "wb") as f:            # a bare pickle, not torch.save
        pickle.dump({"model": _Exploit(marker)}, f, protocol=2)

    for name in ("resume.pt", "raw.pkl.pt"):
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(tmp_path / name)
        message = str(info.value)
        assert str(tmp_path / name) in message and "\n" not in message
        assert "not a plain-tensor checkpoint" in message
    with pytest.raises(CheckpointError, match=r"weights.pth is not a plain-tensor checkpoint "
                                              r".*posix.system"):
        load_pretrained(build_model("test_resnet", 3), tmp_path / "weights.pth")
    with pytest.raises(ConfigError, match="resume.pt is not a plain-tensor"):   # also a ConfigError
        train(TrainConfig(data=str(tmp_path), out=str(tmp_path / "run"),
                          resume=str(tmp_path / "resume.pt")))
    assert not marker.exists()
    # the payload is live: the unsafe loader would have run it
    torch.load(tmp_path / "weights.pth", weights_only=False)
    assert marker.exists()


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    """The RNG states a checkpoint holds are tensors and plain lists: they load with
    weights_only=True and restore python, numpy and torch draws exactly."""
    import random

    import numpy as np

    from shardkit.train.checkpoint import (load_checkpoint, rng_state, save_checkpoint,
                                           set_rng_state)

    random.seed(3)
    np.random.seed(4)
    np.random.normal()                                  # leaves a cached gaussian in the state
    torch.manual_seed(5)
    save_checkpoint(tmp_path / "c.pt", {"rng": rng_state()})
    expected = (random.random(), np.random.normal(), np.random.randint(1 << 30),
                torch.rand(3).tolist())
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    set_rng_state(torch.load(tmp_path / "c.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.normal(), np.random.randint(1 << 30),
            torch.rand(3).tolist()) == expected
    assert load_checkpoint(tmp_path / "c.pt")["version"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]          # no temp file left


def test_pretrained_safetensors_and_unreadable_files(tmp_path):
    from safetensors.torch import save_file

    from shardkit.errors import CheckpointError

    torch.manual_seed(2)
    source = build_model("test_resnet", 4)
    save_file(source.state_dict(), tmp_path / "w.safetensors")
    model = build_model("test_resnet", 3)
    report = load_pretrained(model, tmp_path / "w.safetensors")
    assert {s["key"] for s in report["skipped_shape"]} == {"fc.weight", "fc.bias"}
    assert report["loaded"] == len(source.state_dict()) - 2
    first = next(iter(model.state_dict()))
    assert torch.equal(model.state_dict()[first], source.state_dict()[first])
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00not safetensors")
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    for name in ("bad.safetensors", "bad.pt", "missing.pt"):
        with pytest.raises(CheckpointError, match=name):
            load_pretrained(model, tmp_path / name)


def test_importing_train_and_building_a_model_change_no_process_state():
    """No seeds, TF32 switches or matplotlib backend on import, model building or plotting; the
    run set-up (setup_process) seeds and says so at INFO."""
    code = """
import json, random, sys, tempfile
import numpy as np, torch
before = (torch.initial_seed(), random.getstate(), np.random.get_state()[1].tolist(),
          torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
          torch.backends.cudnn.benchmark)
import shardkit.train
from shardkit.train import build_model
from shardkit.train.metrics import plot_confusion
build_model("test_resnet", 3)
plot_confusion([[1, 0], [2, 3]], ["a", "b"], tempfile.mktemp(suffix=".png"))
after = (torch.initial_seed(), random.getstate(), np.random.get_state()[1].tolist(),
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark)
print(json.dumps({"same": before == after, "pyplot": "matplotlib.pyplot" in sys.modules}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"same": True, "pyplot": False}


def test_setup_process_seeds_and_logs_what_it_set(caplog):
    import logging

    from shardkit.train.engine import setup_process

    with caplog.at_level(logging.INFO, logger="shardkit.train"):
        done = setup_process(TrainConfig(seed=7), torch.device("cpu"))
    assert done == {"seed": 7} and torch.initial_seed() == 7   # no cudnn/TF32 on the CPU
    (record,) = [r for r in caplog.records if r.name == "shardkit.train"]
    assert record.levelname == "INFO" and "seeded with 7" in record.getMessage()
    with pytest.raises(ConfigError, match="sync_timing='yes'"):
        TrainConfig(sync_timing="yes")


def test_no_weight_decay_on_norms_and_biases():
    model = build_model("hrnet_w18_small", 3)
    decay, no_decay = param_groups(model, 0.05)
    names_1d = {n for n, p in model.named_parameters() if p.ndim == 1}
    assert any("bn" in n for n in names_1d) and "classifier.bias" in names_1d
    assert len(no_decay["params"]) == len(names_1d) and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.05


# ----------------------------------------------------------------------------- schedule, losses
def test_warmup_then_cosine_per_step():
    config = TrainConfig(lr=0.1, min_lr=0.001, epochs=2, warmup_steps=4, opt="sgd")
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, config)
    sched = build_scheduler(opt, config, steps_per_epoch=10)  # 20 steps in all
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(20):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[0] == pytest.approx(1e-4)                          # 0.1 * 1e-3
    assert lrs[2] == pytest.approx(0.1 * (1e-3 + (1 - 1e-3) * 2 / 4))
    assert lrs[4] == pytest.approx(0.1)                           # warmup done
    # cosine: halfway through the 16 cosine steps the LR is the mean of peak and floor
    assert lrs[12] == pytest.approx((0.1 + 0.001) / 2)
    assert lrs[20] == pytest.approx(0.001)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    with pytest.raises(ConfigError, match="warmup of 20 steps"):
        build_scheduler(opt, TrainConfig(epochs=2, warmup_steps=20), steps_per_epoch=10)


def test_class_weights_and_focal_loss():
    weights = class_weights([10, 30], ["rare", "common"])
    assert weights.tolist() == pytest.approx([2.0, 2 / 3])
    with pytest.raises(ConfigError, match="'empty'"):
        class_weights([4, 0], ["full", "empty"])
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3]])
    labels = torch.tensor([0, 2])
    ce = torch.nn.functional.cross_entropy(logits, labels)
    assert FocalLoss(gamma=0.0)(logits, labels) == pytest.approx(float(ce), rel=1e-6)
    p = torch.softmax(logits, 1)[[0, 1], labels]
    expected = (-(1 - p) ** 2 * p.log()).mean()                   # Lin et al. 2017, eq. 5
    assert FocalLoss(gamma=2.0)(logits, labels) == pytest.approx(float(expected), rel=1e-6)
    smooth = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    assert FocalLoss(0.0, label_smoothing=0.1)(logits, labels) == pytest.approx(float(smooth),
                                                                                rel=1e-6)
    criterion = build_loss(TrainConfig(loss="weighted-ce", label_smoothing=0.0), [28, 31, 22],
                           CLASSES3)
    assert criterion.weight.tolist() == pytest.approx([81 / 84, 81 / 93, 81 / 66])
    assert isinstance(build_loss(TrainConfig(loss="focal"), [1, 1, 1], CLASSES3), FocalLoss)


# ----------------------------------------------------------------------------- metrics, amp
def test_classification_metrics_values():
    # true 0,0,1,1,2 ; predicted 0,1,1,1,0
    logits = torch.eye(3)[[0, 1, 1, 1, 0]] * 4
    result = classification_metrics(logits, torch.tensor([0, 0, 1, 1, 2]), CLASSES3)
    assert result["confusion_matrix"] == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert result["top1"] == pytest.approx(0.6)
    a, b, c = (result["per_class"][k] for k in CLASSES3)
    assert (a["precision"], a["recall"], a["support"]) == (0.5, 0.5, 2)
    assert b["precision"] == pytest.approx(2 / 3) and b["recall"] == 1.0
    assert c == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert result["macro_f1"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert better("loss", 0.5, 0.6) and not better("top1", 0.5, 0.6)
    assert not better("macro_f1", float("nan"), None)


def test_early_stopping_counts_evaluations_without_improvement():
    stopper = EarlyStopping("macro_f1", patience=2)
    assert [stopper.update(v) for v in (0.3, 0.5, 0.5, 0.4)] == [True, True, False, False]
    assert stopper.best == 0.5 and stopper.should_stop
    loss = EarlyStopping("loss", patience=None)
    assert [loss.update(v) for v in (1.0, 0.8, 0.9)] == [True, True, False]
    assert not loss.should_stop                      # no patience: never stops


def test_mean_std_from_manifest_stats_or_a_clear_error():
    config = TrainConfig(data="/data/out", mean_std="dataset")
    stats = {"stats": {"train": {"mean": [0.4, 0.5, 0.3], "std": [0.2, 0.25, 0.3]}}}
    assert resolve_mean_std(config, stats) == ((0.4, 0.5, 0.3), (0.2, 0.25, 0.3))
    assert resolve_mean_std(config.replace(mean_std="imagenet"), {})[0] == (0.485, 0.456, 0.406)
    with pytest.raises(ConfigError, match="run `shardkit stats /data/out --split train`"):
        resolve_mean_std(config, {"stats": {"val": stats["stats"]["train"]}})


def test_amp_resolution_on_cpu():
    cpu = torch.device("cpu")
    assert resolve_amp("auto", cpu) is None and resolve_amp("off", cpu) is None
    assert resolve_amp("bf16", cpu) is torch.bfloat16
    with pytest.raises(ConfigError, match="fp16 needs a CUDA"):
        resolve_amp("fp16", cpu)
    t = torch.arange(6).reshape(3, 2)
    assert torch.equal(all_gather_varlen(t), t)  # one process: identity


# ----------------------------------------------------------------------------- end-to-end runs
def _run_config(data, out, **overrides) -> TrainConfig:
    """cpu-smoke (hrnet_w18_small, 64 px, batch 8, AdamW, no workers) with ``overrides``."""
    return load_config("cpu-smoke", data=str(data), out=str(out), **overrides)


def test_warmup_steps_zero_means_none_and_unset_default_is_clamped():
    """--warmup-steps 0 is "no warmup" (it was read as unset); the unset default (1 epoch) is cut
    to 10% of a schedule it would fill, with a note; an explicit too-long warmup is an error
    naming both step counts."""
    from shardkit.train.optim import resolve_warmup, schedule_steps

    one_epoch = load_config("default", epochs=1, warmup_steps=0)
    assert one_epoch.warmup_steps == 0
    assert schedule_steps(one_epoch, 3) == (3, 0)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, one_epoch)
    build_scheduler(opt, one_epoch, steps_per_epoch=3)
    assert opt.param_groups[0]["lr"] == pytest.approx(one_epoch.lr)   # no warmup: peak LR at once

    plain = load_config("default", epochs=1)                  # `shardkit train --epochs 1`
    assert plain.warmup_steps is None and plain.warmup_epochs is None
    assert schedule_steps(plain, 3) == (3, 0)
    warmup, note = resolve_warmup(plain, 40)
    assert warmup == 4 and "default 1 epoch (40 steps)" in note and "using 4 steps" in note
    assert resolve_warmup(load_config("default"), 40) == (40, None)   # 30 epochs: 1 epoch fits

    with pytest.raises(ConfigError, match=r"warmup_steps=3: warmup of 3 steps is not shorter "
                                          r"than the schedule of 3 steps"):
        schedule_steps(one_epoch.replace(warmup_steps=3), 3)
    with pytest.raises(ConfigError, match=r"warmup_epochs=1: warmup of 3 steps .* 3 steps"):
        schedule_steps(plain.replace(warmup_epochs=1.0), 3)
    assert schedule_steps(plain.replace(warmup_epochs=0.5, epochs=2), 10) == (20, 5)
    with pytest.raises(ConfigError, match="warmup_steps=-1"):
        TrainConfig(warmup_steps=-1)


def test_resolve_splits_train_required_val_optional(caplog):
    import logging

    from shardkit.train.engine import resolve_splits

    splits = {"train": {}, "test": {}}
    config = TrainConfig(data="/d")
    with caplog.at_level(logging.INFO, logger="shardkit.train"):
        assert resolve_splits(config, splits) == (None, "test")
    (note,) = [r for r in caplog.records if "no validation" in r.getMessage()]
    assert note.name == "shardkit.train" and note.levelname == "WARNING"
    assert "splits: ['test', 'train']" in note.getMessage()
    assert resolve_splits(config, {"train": {}, "val": {}, "test": {}}, False) == ("val", "test")
    assert resolve_splits(config.replace(val_split="test", test_split="test"), splits,
                          False) == ("test", "test")
    with pytest.raises(ConfigError, match=r"--train-split 'train': no such split .*"
                                          r"\['held', 'val'\]"):
        resolve_splits(config, {"held": {}, "val": {}})
    with pytest.raises(ConfigError, match=r"--val-split 'dev': no such split .*'test', 'train'"):
        resolve_splits(config.replace(val_split="dev"), splits)
    with pytest.raises(ConfigError, match=r"--test-split 'holdout'"):
        resolve_splits(config.replace(test_split="holdout"), splits)


def test_resolve_splits_treats_empty_eval_splits_as_missing(caplog):
    import logging

    from shardkit.train.engine import resolve_splits

    splits = {"train": {"num_samples": 160}, "val": {"num_samples": 0},
              "test": {"num_samples": 0}}
    config = TrainConfig(data="/d")
    with caplog.at_level(logging.INFO, logger="shardkit.train"):
        assert resolve_splits(config, splits) == (None, None)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 2 and all(r.levelname == "WARNING" for r in caplog.records)
    assert notes[0].startswith("no test: the 'test' split of /d is empty (0 samples)")
    assert notes[1].startswith("no validation: /d has an empty 'val' split (0 samples)")
    assert notes[1].endswith("no best.pt, no test split")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="shardkit.train"):
        assert resolve_splits(config, {**splits, "test": {"num_samples": 40}}) == (None, "test")
    (note,) = [r.getMessage() for r in caplog.records]
    assert note.endswith("test split 'test' scored with the last weights")
    for flag, value in (("val_split", "val"), ("test_split", "test"), ("train_split", "val")):
        with pytest.raises(ConfigError, match=rf"--{flag.replace('_', '-')} {value!r}: the "
                                              r"split is empty in /d \(0 samples; samples per "
                                              r"split: \{'test': 0, 'train': 160, 'val': 0\}\)"):
            resolve_splits(config.replace(**{flag: value}), splits, False)


def test_metrics_of_no_samples_are_null_with_a_reason_never_nan():
    result = classification_metrics(torch.zeros((0, 3)), torch.zeros(0, dtype=torch.long),
                                     CLASSES3)
    assert result["num_samples"] == 0 and result["reason"] == "no samples to evaluate"
    assert result["loss"] is None and result["top1"] is None and result["macro_f1"] is None
    json.dumps(result, allow_nan=False)  # raises on NaN
    assert not better("top1", None, None) and not better("loss", None, 0.5)
    stopper = EarlyStopping("top1", patience=1)
    assert not stopper.update(None) and stopper.should_stop


def _support(result: dict) -> int:
    return sum(c["support"] for c in result["per_class"].values())


def test_cli_smoke_run_writes_checkpoints_metrics_png_tensorboard(packed_sample, tmp_path):
    from click.testing import CliRunner
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from shardkit.cli import main
    from shardkit.dataset.manifest import load_manifest

    data, run = packed_sample("wds"), tmp_path / "run"
    result = CliRunner().invoke(main, ["train", "--data", str(data), "--out", str(run),
                                       "--config", "cpu-smoke", "--max-steps", "3",
                                       "--warmup-steps", "1", "--label-smoothing", "0.05"])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(data)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"] == str(data) and saved["max_steps"] == 3
    assert saved["label_smoothing"] == 0.05 and saved["seed"] == 0

    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["step"] == 3 and metrics["stopped"] == "max_steps"
    assert metrics["run"]["num_classes"] == 5 and metrics["run"]["seed"] == 0
    assert metrics["run"]["amp"] == "off" and metrics["run"]["world_size"] == 1
    (entry,) = metrics["history"]
    assert entry["epoch"] == 0 and entry["partial"] is True
    stats = entry["train"]
    assert stats["steps"] == 3 and stats["images"] == 24
    assert stats["images_per_s"] > 0 and 0.0 <= stats["data_wait_fraction"] <= 1.0
    assert math.isfinite(stats["loss"]) and 0 < stats["lr"] <= 1e-3
    val = entry["val"]
    assert {"loss", "top1", "macro_f1", "per_class", "confusion_matrix"} <= set(val)
    assert "top5" not in val                                   # 5 classes: no top-5
    n_val = manifest["splits"]["val"]["num_samples"]
    assert _support(val) == n_val == sum(map(sum, val["confusion_matrix"]))
    assert sorted(val["per_class"]) == manifest["classes"]
    assert [val["per_class"][c]["support"] for c in manifest["classes"]] == \
        manifest["splits"]["val"]["class_counts"]
    assert _support(metrics["test"]) == manifest["splits"]["test"]["num_samples"]
    for name in ("val_epoch000", "test_best"):
        assert (run / "eval" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert json.loads((run / "eval" / f"{name}.json").read_text())["num_samples"] > 0

    last = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert {"model", "optimizer", "scheduler", "scaler", "epoch", "step", "loader",
            "config"} <= set(last)
    assert last["step"] == 3 and last["loader"]["batches_consumed"] == 3
    assert last["model"]["classifier.weight"].shape == (5, 2048)
    assert (run / "checkpoints" / "best.pt").is_file()

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3]
    assert events.Scalars("val/macro_f1")[0].value == pytest.approx(val["macro_f1"])

    # the run folder is not silently reused, and a resume must keep the schedule
    with pytest.raises(OutputExistsError, match="--resume"):
        train(_run_config(data, run))
    with pytest.raises(ResumeMismatchError, match="lr: checkpoint 0.001 vs now 0.5"):
        train(_run_config(data, run, resume=str(run), lr=0.5, warmup_steps=1))


def _tb_scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_resume_continues_step_count_lr_schedule_and_weights(packed_sample, tmp_path):
    """A run cut by --max-steps mid-epoch and resumed ends exactly where an uninterrupted run
    does: same step count, same per-step LR curve, bit-identical weights (CPU, deterministic
    loader order and augmentation)."""
    data = packed_sample("wds")
    tiny = dict(model="test_resnet", image_size=32, batch_size=32, epochs=2, warmup_steps=2,
                eval_every=5)  # train split 140 -> 4 full batches per epoch, 8 steps in all
    full = train(_run_config(data, tmp_path / "full", max_steps=0, **tiny))
    assert full["step"] == 8 and full["stopped"] == "completed"
    cut = train(_run_config(data, tmp_path / "cut", max_steps=3, **tiny))
    assert cut["step"] == 3 and cut["stopped"] == "max_steps"
    assert torch.load(tmp_path / "cut" / "checkpoints" / "last.pt",
                      weights_only=True)["loader"]["batches_consumed"] == 3
    resumed = train(_run_config(data, tmp_path / "cut", max_steps=0, resume=str(tmp_path / "cut"),
                                **tiny))
    assert resumed["step"] == 8 and resumed["stopped"] == "completed"
    assert [(h["epoch"], h["train"]["steps"], h["partial"]) for h in resumed["history"]] == \
        [(0, 3, True), (0, 1, False), (1, 4, False)]
    lr_full = _tb_scalars(tmp_path / "full", "train/lr")
    lr_resumed = _tb_scalars(tmp_path / "cut", "train/lr")
    assert [s for s, _ in lr_resumed] == list(range(1, 9))
    assert [v for _, v in lr_resumed] == pytest.approx([v for _, v in lr_full], rel=1e-6)
    assert lr_full[1][1] == pytest.approx(1e-3) and lr_full[-1][1] == pytest.approx(0.0)
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert full["history"][-1]["val"]["confusion_matrix"] == \
        resumed["history"][-1]["val"]["confusion_matrix"]


def test_overfit_two_batches_drives_train_loss_near_zero(packed_sample, tmp_path):
    """--overfit-batches 2: the same two un-augmented batches, repeatedly -> loss < 0.05."""
    data = packed_sample("wds")
    metrics = train(_run_config(data, tmp_path / "overfit", overfit_batches=2, epochs=6,
                                max_steps=0, lr=2e-3, weight_decay=0.0, warmup_steps=2,
                                eval_every=100))
    losses = [h["train"]["loss"] for h in metrics["history"]]
    assert metrics["step"] == 12 and [h["train"]["steps"] for h in metrics["history"]] == [2] * 6
    assert losses[0] > 1.0                       # starts near ln(5) = 1.61
    assert losses[-1] < 0.05, losses
    assert yaml.safe_load((tmp_path / "overfit" / "config.yaml").read_text())[
        "label_smoothing"] == 0.0                # overfit mode turns smoothing off


def test_case23_three_class_folder_head_topk_pretrained_labels_and_data_path(
        sample_dir, tmp_path):
    """Field case 23 (HRNet-Image-Classification): a 3-class ImageFolder packed by shardkit feeds
    hrnet_w18_small: 3 logits (not 1000), no top-5, a 5-class checkpoint loads except its head
    (skipped and reported), the data path is the one given (the packed folder was moved after
    packing), and a label outside [0, 3) raises naming it."""
    from shardkit.packer.run import pack

    src = tmp_path / "three"
    for name in ("daisy", "roses", "tulips"):
        shutil.copytree(sample_dir / name, src / name)
    pack(src, tmp_path / "packed", format="hdf5", split={"train": 0.75, "val": 0.25}, seed=0,
         shard_samples=32, workers=1, progress=False)
    data = tmp_path / "moved" / "data"
    data.parent.mkdir()
    shutil.move(tmp_path / "packed", data)           # the manifest's source.root is now stale
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["classes"] == ["daisy", "roses", "tulips"]
    torch.manual_seed(1)
    weights = tmp_path / "hrnet5.pth"
    torch.save(build_model("hrnet_w18_small", 5).state_dict(), weights)

    run = tmp_path / "run"
    metrics = train(_run_config(data, run, max_steps=1, pretrained=str(weights)))
    assert metrics["run"]["num_classes"] == 3 and metrics["run"]["data"] == str(data)
    assert yaml.safe_load((run / "config.yaml").read_text())["data"] == str(data)
    val = metrics["history"][-1]["val"]
    assert "top5" not in val and len(val["confusion_matrix"]) == 3
    assert _support(val) == manifest["splits"]["val"]["num_samples"]
    assert "test" not in metrics                                # no test split was packed
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)["model"]
    assert best["classifier.weight"].shape == (3, 2048)
    report = json.loads((run / "pretrained_report.json").read_text())
    assert {s["key"]: s["checkpoint"] for s in report["skipped_shape"]} == {
        "classifier.weight": [5, 2048], "classifier.bias": [5]}
    assert report["loaded"] == len(best) - 2 and report["unexpected"] == []

    # a manifest whose class list is shorter than its labels: label 2 must raise, not train
    # (the split index is refused where it is loaded; class_counts, which would be refused
    # first, are taken out)
    manifest["classes"] = ["daisy", "roses"]
    for entry in manifest["splits"].values():
        del entry["class_counts"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"'label' has \d+ invalid .*: 2; expected a class "
                       r"number in \[0, 2\)"):
        train(_run_config(data, tmp_path / "run-bad", max_steps=1))


def test_torchrun_two_process_gloo_merges_one_evaluation(packed_sample, tmp_path):
    """``torchrun --nproc_per_node 2`` on the CPU: DDP over gloo, both ranks take the same number
    of steps, and val/test are scored exactly once over all samples (merged across ranks)."""
    from shardkit.dataset.manifest import load_manifest

    data, run = packed_sample("wds"), tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "shardkit.cli", "train", "--data", str(data), "--out", str(run),
           "--config", "cpu-smoke", "--model", "test_resnet", "--image-size", "32",
           "--batch-size", "16", "--max-steps", "0", "--device", "cpu"]  # one whole epoch
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = load_manifest(data)
    metrics = json.loads((run / "metrics.json").read_text())
    # 140 train samples -> 70 per rank (even="pad") -> 4 full batches of 16 on each rank
    assert metrics["run"]["world_size"] == 2 and metrics["run"]["steps_per_epoch"] == 4
    (entry,) = metrics["history"]
    assert metrics["step"] == 4 and metrics["stopped"] == "completed"
    assert entry["train"]["steps"] == 4 and entry["train"]["images"] == 2 * 4 * 16
    val, test = entry["val"], metrics["test"]
    for result, split in ((val, "val"), (test, "test")):
        expected = manifest["splits"][split]["num_samples"]
        assert result["num_samples"] == _support(result) == expected
        assert sum(map(sum, result["confusion_matrix"])) == expected
        assert [result["per_class"][c]["support"] for c in manifest["classes"]] == \
            manifest["splits"][split]["class_counts"]
    assert json.loads((run / "eval" / "val_epoch000.json").read_text())["num_samples"] == 30
    assert proc.stdout.count('"stopped"') == 1, proc.stdout     # summary printed by rank 0 only
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["step"] == 4


def _cli(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    """``python -m shardkit.cli ARGS`` in a real process (its real exit code)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "shardkit.cli", *map(str, args)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def test_cli_without_val_split_trains_and_split_errors_exit_nonzero(sample_dir, tmp_path):
    """A dataset packed with train/test only: `train` runs without validation (one note), the
    test split scores the last weights; a missing train split (or a named val split that is not
    there) exits non-zero naming the dataset's splits."""
    from shardkit.packer.run import pack

    data = tmp_path / "tt"
    pack(sample_dir, data, format="wds", split={"train": 0.8, "test": 0.2}, seed=0,
         shard_samples=64, workers=1, progress=False)
    common = ["--config", "cpu-smoke", "--model", "test_resnet", "--image-size", "32"]
    run = tmp_path / "run"
    ok = _cli("train", "--data", data, "--out", run, *common, "--max-steps", "2",
              "--epochs", "1", "--warmup-steps", "0")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stderr.count("no validation") == 1 and "splits: ['test', 'train']" in ok.stderr
    summary = json.loads(ok.stdout[ok.stdout.index("{"):])
    assert summary["step"] == 2 and summary["best"] is None and "test" in summary
    metrics = json.loads((run / "metrics.json").read_text())
    assert all("val" not in h for h in metrics["history"])
    assert metrics["test"]["num_samples"] == json.loads(
        (data / "manifest.json").read_text())["splits"]["test"]["num_samples"]
    assert (run / "eval" / "test_last.json").is_file()
    assert not (run / "checkpoints" / "best.pt").exists()

    for flags, needle in ((["--train-split", "training"], "--train-split 'training'"),
                          (["--val-split", "val"], "--val-split 'val'")):
        bad = _cli("train", "--data", data, "--out", tmp_path / "bad", *common, *flags)
        assert bad.returncode != 0, bad.stdout + bad.stderr
        assert needle in bad.stderr and "splits: ['test', 'train']" in bad.stderr
        assert "Traceback" not in bad.stderr and bad.stdout == ""


def _no_nan(text: str):
    def refuse(constant):
        raise AssertionError(f"{constant} in metrics.json")

    return json.loads(text, parse_constant=refuse)


def test_cli_with_an_empty_val_split_says_so_once_and_writes_no_nan(sample_dir, tmp_path):
    """An empty val split: val rounds to 0 samples (ratio 0.005 of 120 photographer groups); the run
    trains without validation, notes it once at the start, and metrics hold no NaN."""
    from shardkit.packer.run import pack

    data = tmp_path / "d"
    summary = pack(sample_dir, data, split="train=0.8,val=0.005,test=0.195", seed=0,
                   metadata=sample_dir / "metadata.csv", group_column="group_flickr_user",
                   shard_samples=64, progress=False, split_method="balanced")
    assert {s: v["samples"] for s, v in summary.splits.items()} == {
        "train": 160, "val": 0, "test": 40}
    assert any(w.startswith("split 'val' is empty") for w in summary.warnings)
    common = ["--config", "cpu-smoke", "--model", "test_resnet", "--image-size", "32",
              "--warmup-steps", "0"]
    run = tmp_path / "run"
    ok = _cli("train", "--data", data, "--out", run, *common, "--max-steps", "2", "--epochs", "2")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stderr.count("no validation") == 1
    assert ok.stderr.splitlines()[0].startswith(  # said once, at the start
        f"WARNING shardkit.train: no validation: {data} has an empty 'val' split (0 samples)")
    summary = _no_nan(ok.stdout[ok.stdout.index("{"):])
    assert summary["best"] is None and summary["test"]["top1"] is not None
    metrics = _no_nan((run / "metrics.json").read_text())
    assert all("val" not in h for h in metrics["history"])
    assert metrics["test"]["num_samples"] == 40 and (run / "eval" / "test_last.json").is_file()
    bad = _cli("-q", "train", "--data", data, "--out", tmp_path / "bad", *common,
               "--val-split", "val")
    assert bad.returncode == 2 and bad.stdout == ""
    (line,) = bad.stderr.splitlines()
    assert line.startswith("Error: ConfigError: --val-split 'val': the split is empty in ")


def test_options_run_focal_balanced_bf16_sgd_clip_dataset_stats(packed_sample, tmp_path):
    """The less common options wire through: focal loss, class-balanced sampling, bf16 autocast
    on the CPU, SGD with clipping, the train split's own mean/std, early stopping on loss."""
    from shardkit.doctor.stats import compute_stats

    data = tmp_path / "data"
    shutil.copytree(packed_sample("wds"), data)
    stats = compute_stats(data, "train", save=True)
    run = tmp_path / "run"
    metrics = train(_run_config(data, run, model="test_resnet", image_size=32, max_steps=3,
                                loss="focal", balance="class", amp="bf16", opt="sgd", lr=0.05,
                                clip_grad=1.0, mean_std="dataset", monitor="loss", patience=1))
    assert metrics["run"]["amp"] == "bfloat16" and metrics["step"] == 3
    assert metrics["run"]["mean_std"] == {"mean": pytest.approx(stats["mean"]),
                                          "std": pytest.approx(stats["std"])}
    assert 0.3 < stats["mean"][0] < 0.7 and 0.1 < stats["std"][0] < 0.4   # real photo pixels
    assert math.isfinite(metrics["history"][0]["train"]["loss"])
    assert metrics["best"]["monitor"] == "loss"
    assert _support(metrics["test"]) == 30
    with pytest.raises(ConfigError, match="shardkit stats"):
        train(_run_config(packed_sample("wds"), tmp_path / "nostats", mean_std="dataset"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_run_uses_bf16_autocast_and_merges_eval(packed_sample, tmp_path):
    """The same config on CUDA: --amp auto picks bf16 (fp16 on pre-Ampere GPUs), no code change."""
    data = packed_sample("wds")
    metrics = train(_run_config(data, tmp_path / "gpu", device="cuda", amp="auto", max_steps=3,
                                num_workers=2))
    expected = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    assert metrics["run"]["amp"] == expected and metrics["run"]["device"] == "cuda:0"
    assert metrics["step"] == 3 and _support(metrics["test"]) == 30
    assert 0.0 <= metrics["history"][0]["train"]["data_wait_fraction"] <= 1.0


@pytest.mark.slow
def test_compiled_run_saves_plain_state_dict(packed_sample, tmp_path):
    """--compile (inductor on the CPU, ~1 min): checkpoints hold the plain module's keys, so they
    load into an uncompiled model (no ``_orig_mod.`` prefix)."""
    data = packed_sample("wds")
    metrics = train(_run_config(data, tmp_path / "compiled", model="test_resnet", image_size=32,
                                max_steps=2, compile=True))
    assert metrics["step"] == 2 and _support(metrics["test"]) == 30
    state = torch.load(tmp_path / "compiled" / "checkpoints" / "best.pt",
                       weights_only=True)["model"]
    assert not any(k.startswith("_orig_mod.") for k in state)
    build_model("test_resnet", 5).load_state_dict(state)   # strict load succeeds


def test_balance_class_reaches_the_loader(packed_sample):
    """--balance class: the train loader draws classes uniformly (with replacement), so the
    rarest class (roses, 22 of 140) is drawn near 1/5 of the time instead of 22/140."""
    from shardkit.train.data import train_loader, transform_config
    from shardkit.train.dist import DistInfo

    data = packed_sample("wds")
    counts = {}
    for balance in ("none", "class"):
        config = TrainConfig(data=str(data), balance=balance, image_size=32, batch_size=20,
                             num_workers=0)
        loader = train_loader(config, DistInfo(), transform_config(config, (0.5,) * 3, (0.25,) * 3))
        labels = []
        for epoch in range(5):
            loader.set_epoch(epoch)
            labels += [y for _, y in loader]
        counts[balance] = torch.bincount(torch.cat(labels), minlength=5).tolist()
    assert counts["none"] == [5 * c for c in (28, 31, 22, 28, 31)]      # exact: each sample once
    assert sum(counts["class"]) == 700
    assert counts["class"][2] > 120 and max(counts["class"]) < 170, counts   # roses ~ 140
    longer = TrainConfig(data=str(data), samples_per_epoch=100, image_size=32, batch_size=8,
                         num_workers=0)
    assert len(train_loader(longer, DistInfo(), transform_config(longer, (0.5,) * 3,
                                                                 (0.25,) * 3))) == 12  # 100 // 8


def test_mixup_runs_once_in_the_train_loader_and_the_trainer_smooths(packed_sample, tmp_path):
    """--augment with mixup / cutmix: the train loader mixes each batch (soft targets) and the
    trainer does not mix again: the model sees the loader's mixed batch normalised, and the
    soft-target loss gets the loader's targets with label smoothing added."""
    from shardkit.stream import DeviceNormalizer
    from shardkit.train.data import train_loader, transform_config
    from shardkit.train.dist import DistInfo
    from shardkit.train.engine import Trainer

    data = packed_sample("wds")
    spec = [{"op": "mixup", "alpha": 0.8}, {"op": "cutmix", "alpha": 1.0}]
    config = _run_config(data, tmp_path / "run", model="test_resnet", image_size=32,
                         batch_size=32, max_steps=2, augment=spec)
    trainer = Trainer(config, DistInfo(), torch.device("cpu"))
    seen_x, seen_t = [], []
    forward, soft = trainer.model.forward, trainer.soft_criterion
    trainer.model.forward = lambda x: (seen_x.append(x.detach().clone()), forward(x))[1]
    trainer.soft_criterion = lambda logits, t: (seen_t.append(t.clone()), soft(logits, t))[1]
    try:
        trainer.train_epoch(0)
    finally:
        trainer.close()
    assert len(seen_x) == len(seen_t) == 2
    tc = transform_config(config, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # imagenet
    with train_loader(config, DistInfo(), tc) as loader:
        assert loader.soft_targets
        loader.set_epoch(0)
        want = []
        for x, t in DeviceNormalizer(loader, "cpu"):
            want.append((x, t))
            if len(want) == 2:
                break
    eps = config.label_smoothing
    assert eps == 0.1
    for (x, t), got_x, got_t in zip(want, seen_x, seen_t):
        assert torch.equal(got_x, x)                      # mixed once, by the loader
        assert ((t > 0) & (t < 1)).any()                  # the loader's targets are mixed
        torch.testing.assert_close(got_t, t * (1 - eps) + eps / 5, rtol=0, atol=1e-6)


def test_unknown_model_names_the_closest_timm_models():
    from shardkit.errors import ConfigError
    from shardkit.train.model import build_model

    with pytest.raises(ConfigError, match=r"'hrnet_w18_smal' is not a timm model; similar names: "
                                          r"hrnet_w18_small, "):
        build_model("hrnet_w18_smal", 5)


# ----------------------------------------------------------------------------- resume edges
_TINY = dict(model="test_resnet", image_size=32, batch_size=32, epochs=1, warmup_steps=1,
             eval_every=5)


def test_run_killed_before_its_first_checkpoint_restarts(packed_sample, tmp_path):
    """A run folder holding config.yaml but no checkpoint (a run killed in its first epoch)
    has nothing to keep: a plain rerun starts over there, and so does --resume on it (it used
    to be "already holds a run, pass --resume" followed by "no checkpoint")."""
    data = packed_sample("wds")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: test_resnet\n")   # what a killed run leaves
    done = train(_run_config(data, run, max_steps=2, **_TINY))
    assert done["step"] == 2 and (run / "checkpoints" / "last.pt").is_file()
    (run / "checkpoints" / "last.pt").unlink()
    (run / "checkpoints" / "best.pt").unlink(missing_ok=True)
    again = train(_run_config(data, run, max_steps=1, resume=str(run), **_TINY))
    assert again["step"] == 1 and [h["step"] for h in again["history"]] == [1]
    # with a checkpoint the folder is a run to keep: a fresh run is still refused
    with pytest.raises(OutputExistsError, match="--resume"):
        train(_run_config(data, run, **_TINY))


def _saved_checkpoint(packed_sample, tmp_path) -> tuple[Path, Path]:
    data = packed_sample("wds")
    run = tmp_path / "base"
    train(_run_config(data, run, max_steps=1, **_TINY))
    return data, run


@pytest.fixture(scope="module")
def saved_run(packed_sample, tmp_path_factory) -> tuple[Path, Path]:
    """(dataset, run folder) of a one-step run; read only by the tests that use it."""
    return _saved_checkpoint(packed_sample, tmp_path_factory.mktemp("ckpt-base"))


def test_resume_onto_a_dataset_with_other_classes_is_refused(saved_run, tmp_path):
    from shardkit.train.checkpoint import check_resume_classes, load_checkpoint

    data, run = saved_run
    classes = load_checkpoint(run / "checkpoints" / "last.pt", ("classes",))["classes"]
    assert classes == ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
    # the same dataset re-packed with another class order (manifest edited as a re-pack would)
    moved = tmp_path / "repacked"
    shutil.copytree(data, moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["classes"] = classes[1:] + classes[:1]
    (moved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ResumeMismatchError, match="5 labels name other classes .label 0: "
                       "'daisy' vs 'dandelion'"):
        check_resume_classes(classes, manifest["classes"], moved)
    with pytest.raises(ResumeMismatchError, match="the checkpoint has 5 classes, .* has 4"):
        check_resume_classes(classes, classes[:4], moved)
    with pytest.raises(ResumeMismatchError, match="re-packed with another class list"):
        train(_run_config(data, tmp_path / "r2", max_steps=2, resume=str(run), **_TINY)
              .replace(data=str(moved)))


@pytest.mark.parametrize("damage,field", [
    (lambda c: c.pop("config"), "no 'config'"),
    (lambda c: c.pop("model"), "no 'model'"),
    (lambda c: c.update(model={"w": 3}), "'model' is dict, expected a state_dict"),
    (lambda c: c.pop("optimizer"), "no 'optimizer'"),
    (lambda c: c.update(step="7"), "'step' is str, expected an int >= 0"),
    (lambda c: c.update(epoch=-1), "'epoch' is int, expected an int >= 0"),
    (lambda c: c.update(classes="abcde"), "'classes' is str, expected a list of class names"),
    (lambda c: c.pop("rng"), "no 'rng'"),
    (lambda c: c.update(history=None), "'history' is NoneType"),
    (lambda c: c.update(best={"value": 1}), "'best' is dict, expected a dict with monitor"),
])
def test_malformed_checkpoint_at_resume_is_one_line_naming_the_field(saved_run, tmp_path,
                                                                    damage, field):
    from click.testing import CliRunner

    from shardkit.cli import main

    tmp = tmp_path
    data, run = saved_run
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    damage(ckpt)
    bad = tmp / "bad.pt"
    torch.save(ckpt, bad)
    result = CliRunner().invoke(main, ["-q", "train", "--data", str(data), "--out",
                                       str(tmp / "run"), "--config", "cpu-smoke", "--model",
                                       "test_resnet", "--image-size", "32", "--batch-size", "32",
                                       "--epochs", "1", "--warmup-steps", "1",
                                       "--resume", str(bad)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = result.output.splitlines()
    assert line.startswith("Error: CheckpointError: ") and field in line and "bad.pt" in line


def test_checkpoint_whose_weights_do_not_fit_is_one_error(saved_run, tmp_path):
    from shardkit.errors import CheckpointError
    from shardkit.train.checkpoint import payload_digest

    data, run = saved_run
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    name = next(k for k, v in ckpt["model"].items() if v.ndim == 4)
    ckpt["model"][name] = torch.zeros(1, 1, 1, 1)
    ckpt["digest"] = payload_digest(ckpt)    # a whole file, written so: its model is the fault
    torch.save(ckpt, tmp_path / "shape.pt")
    with pytest.raises(CheckpointError, match="its 'model' does not fit this run "
                       r"\(RuntimeError: Error\(s\) in loading state_dict"):
        train(_run_config(data, tmp_path / "r", max_steps=2, resume=str(tmp_path / "shape.pt"),
                          **_TINY))
