"""``shardkit train`` speaks timm: timm ``train.py``'s flag names beside shardkit's, a positional
DATASET, a line per epoch on stderr, the CPU estimate, best / last in the summary, preprocessing
from the model's pretrained config, and config.yaml recording what ran (resolved data fields and
augmentation ops). Runs are tiny: test_resnet at 32 px on the embedded sample, a few steps."""
from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from shardkit.augment import AugmentSpec
from shardkit.errors import ConfigError
from shardkit.train import load_config
from shardkit.train.cli import resolve_dataset, train_command
from shardkit.train.data import model_data_config, resolve_data_fields
from shardkit.train.report import (SMOKE_FLAGS, epoch_line, estimate_line, format_duration,
                                   planned_work, time_train_step)
from shardkit.train.timm_flags import aa_op, augment_ops, compose_augment

TINY = ["--config", "cpu-smoke", "--model", "test_resnet", "--no-progress"]


def _params(*args: str) -> dict:
    """The parsed options of ``shardkit train ARGS`` (no run)."""
    return train_command.make_context("train", list(args)).params


def _invoke(*args) -> "CliRunner.Result":
    from shardkit.cli import main

    return CliRunner().invoke(main, ["train", *map(str, args)])


# ----------------------------------------------------------------------------- flag names
def test_timm_names_parse_to_the_same_options_as_shardkit_names():
    timm = _params("D", "-b", "16", "--img-size", "64", "-j", "3", "--smoothing", "0.2",
                   "--pretrained", "--initial-checkpoint", "w.pth")
    ours = _params("--data", "D", "--batch-size", "16", "--image-size", "64", "--num-workers",
                   "3", "--label-smoothing", "0.2", "--pretrained", "--initial-checkpoint",
                   "w.pth")
    keys = ("batch_size", "image_size", "num_workers", "label_smoothing", "pretrained",
            "initial_checkpoint")
    assert {k: timm[k] for k in keys} == {k: ours[k] for k in keys} == {
        "batch_size": 16, "image_size": 64, "num_workers": 3, "label_smoothing": 0.2,
        "pretrained": True, "initial_checkpoint": "w.pth"}
    assert _params("D", "--workers", "5")["num_workers"] == 5
    assert timm["dataset"] == ("D",) and ours["data"] == "D"
    # the DATASET positional and --data are one value
    assert resolve_dataset(("D",), None, None, None) == ("D", None, None)
    assert resolve_dataset((), "D", True, None) == ("D", True, None)
    assert resolve_dataset(("D",), "D", None, None)[0] == "D"
    with pytest.raises(ConfigError, match="DATASET 'D' and --data 'E': give the dataset once"):
        resolve_dataset(("D",), "E", None, None)
    with pytest.raises(ConfigError, match=r"expected one DATASET, got 2: \['D', 'E'\]"):
        resolve_dataset(("D", "E"), None, None, None)


def test_the_earlier_pretrained_file_form_becomes_initial_checkpoint(caplog):
    # `train --data D --pretrained w.pth`: click reads the switch, then w.pth as a positional
    params = _params("--data", "D", "--pretrained", "w.pth")
    assert params["pretrained"] is True and params["dataset"] == ("w.pth",)
    with caplog.at_level(logging.WARNING, "shardkit.train"):
        assert resolve_dataset(params["dataset"], "D", True, None) == ("D", None, "w.pth")
    assert "--pretrained w.pth: a checkpoint file after --pretrained is deprecated; use " \
           "--initial-checkpoint w.pth" in caplog.text
    with pytest.raises(ConfigError, match="give one, with --initial-checkpoint"):
        resolve_dataset(("w.pth",), "D", True, "other.pth")
    # the config key: a string `pretrained` is moved to initial_checkpoint, warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, "shardkit.train"):
        config = load_config("cpu-smoke", pretrained="w.pth")
    assert config.pretrained is False and config.initial_checkpoint == "w.pth"
    assert "pretrained: w.pth (a checkpoint file) is deprecated" in caplog.text


def test_pretrained_switch_then_out_parses_and_fails_only_on_the_network(monkeypatch,
                                                                          packed_sample,
                                                                          tmp_path):
    """`train DATASET --pretrained --out RUN` parses (it failed with "unexpected extra
    argument"); weights that cannot be fetched are one Error line naming the way out."""
    import timm.models._builder as builder

    def offline(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(builder, "load_pretrained", offline)
    result = _invoke(packed_sample("wds"), "--pretrained", "--out", tmp_path / "run", *TINY,
                     "--img-size", "32", "--max-steps", "1")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: CheckpointError: cannot load timm's pretrained weights of "
                           "'test_resnet' (OSError: [Errno -2] Name or service not known)")
    assert "--initial-checkpoint" in line


# ----------------------------------------------------------------------------- --aa
def test_aa_rand_maps_timm_magnitudes_onto_torchvision_tables():
    from shardkit.augment.vendored import RAND_AUGMENT_SPACE

    op, notes = aa_op("rand-m9-n3-mstd0.5-inc1")
    assert op == {"op": "rand_augment", "num_ops": 3, "magnitude": 9, "num_magnitude_bins": 11}
    (note,) = notes
    assert "not mapped: each op applied with p=0.5" in note and "mstd0.5" in note
    # timm's m9 is 9/10 of each op's maximum: rotate 30 deg, shear 0.3, enhance 0.9
    for name, timm_value in (("Rotate", 27.0), ("ShearX", 0.27), ("Brightness", 0.81)):
        table = RAND_AUGMENT_SPACE[name][0](op["num_magnitude_bins"], 224, 224)
        assert float(table[op["magnitude"]]) == pytest.approx(timm_value, rel=1e-6), name
    assert aa_op("rand-m9-mstd0.5")[0] == {"op": "rand_augment", "num_ops": 2, "magnitude": 9,
                                          "num_magnitude_bins": 11}
    assert aa_op("rand-mstd1")[0]["magnitude"] == 10                # timm's default magnitude
    assert aa_op("augmix-m5-w4-d2")[0] == {"op": "aug_mix", "severity": 5, "mixture_width": 4,
                                           "chain_depth": 2, "alpha": 1.0}
    assert aa_op("none") == (None, [])
    for text, needle in (("v0", "AutoAugment policies"), ("original", "AutoAugment policies"),
                         ("rand-m12", "outside timm's 0-10"), ("rand-m9-tweights", "'tweights'"),
                         ("autoaug", "unknown form")):
        with pytest.raises(ConfigError, match=re.escape(needle)) as info:
            aa_op(text)
        assert "supported: rand-m<M>" in str(info.value) and "augmix-m<M>" in str(info.value)


def test_aa_mixup_cutmix_compose_into_the_augment_spec():
    ops, _ = compose_augment("standard", aa="rand-m7", mixup=0.8, cutmix=1.0)
    assert [e["op"] for e in ops] == ["color_jitter", "rand_augment", "mixup", "cutmix"]
    assert ops[2] == {"op": "mixup", "alpha": 0.8} and ops[3] == {"op": "cutmix", "alpha": 1.0}
    base = [{"op": "trivial_augment"}, {"op": "random_erasing", "p": 0.25},
            {"op": "mixup", "alpha": 0.2}]
    ops, _ = compose_augment(base, aa="augmix-m3", mixup=0)      # replaced in place; 0: off
    assert [e["op"] for e in ops] == ["aug_mix", "random_erasing"]
    ops, _ = compose_augment([{"op": "random_erasing"}], aa="rand-m9")
    assert [e["op"] for e in ops] == ["rand_augment", "random_erasing"]   # before the erasing
    assert compose_augment("light") == ("light", [])
    with pytest.raises(ConfigError, match="--mixup -1.0: expected a Beta alpha >= 0"):
        compose_augment("none", mixup=-1.0)
    config = load_config("cpu-smoke", aa="rand-m9-mstd0.5-inc1", cutmix=1.0)
    assert AugmentSpec.parse(config.augment).batch_ops == (("cutmix", {"alpha": 1.0}),)


def test_cli_aa_outside_the_mapping_is_one_error_line(packed_sample, tmp_path):
    result = _invoke(packed_sample("wds"), "--out", tmp_path / "run", *TINY, "--aa", "v0")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: ConfigError: --aa 'v0': timm's AutoAugment policies")
    assert "supported: rand-m<M>" in line


# ----------------------------------------------------------------------------- resolved ops
def test_augment_ops_fill_defaults_and_draw_what_the_spec_draws():
    spec = [{"op": "color_jitter", "brightness": 0.4},
            {"op": "rand_augment", "magnitude": {"start": 5, "end": 12, "epochs": 4}},
            {"op": "random_erasing", "p": 0.5}, {"op": "mixup"}]
    ops = augment_ops(spec)
    assert ops[0] == {"op": "color_jitter", "brightness": 0.4, "contrast": 0.0,
                      "saturation": 0.0, "hue": 0.0}
    assert ops[1] == {"op": "rand_augment", "num_ops": 2,
                      "magnitude": {"start": 5, "end": 12, "epochs": 4},
                      "num_magnitude_bins": 31, "fill": None, "interpolation": "nearest"}
    assert ops[2] == {"op": "random_erasing", "p": 0.5, "scale": [0.02, 0.33],
                      "ratio": [0.3, 3.3], "value": 0}
    assert ops[3] == {"op": "mixup", "alpha": 0.8, "p": 1.0}
    assert yaml.safe_load(yaml.safe_dump(ops)) == ops                # YAML-safe (no tuples)
    a, b = AugmentSpec.parse(spec), AugmentSpec.parse(ops)
    for seed in range(20):
        for epoch in (0, 2, 5):
            assert a.draw(np.random.default_rng(seed), 64, 48, epoch) == \
                b.draw(np.random.default_rng(seed), 64, 48, epoch)
    assert augment_ops("randaugment") == [{"op": "rand_augment", "num_ops": 2, "magnitude": 9,
                                           "num_magnitude_bins": 31, "fill": None,
                                           "interpolation": "nearest"}]
    assert augment_ops("none") == []


# ----------------------------------------------------------------------------- pretrained cfg
def test_model_data_config_is_timms_resolved_config():
    import timm
    from timm.data import resolve_model_data_config

    for name in ("test_resnet", "hrnet_w18_small"):
        built = resolve_model_data_config(timm.create_model(name, pretrained=False))
        assert model_data_config(name) == {k: built[k] for k in
                                           ("mean", "std", "interpolation", "crop_pct",
                                            "crop_mode")}
    assert model_data_config("hrnet_w18_small")["interpolation"] == "bicubic"
    fields = resolve_data_fields(load_config("default", initial_checkpoint="w.pth"), {})
    assert fields == {"mean_std": "model", "mean": [0.485, 0.456, 0.406],
                      "std": [0.229, 0.224, 0.225], "interpolation": "bicubic",
                      "crop_pct": 0.875}
    plain = resolve_data_fields(load_config("default"), {})           # no weights: as before
    assert (plain["mean_std"], plain["interpolation"], plain["crop_pct"]) == \
        ("imagenet", "bilinear", 0.875)
    given = resolve_data_fields(load_config("default", pretrained=True, mean=[0.1, 0.2, 0.3],
                                            std=[0.5, 0.5, 0.5], crop_pct=0.9), {})
    assert given["mean"] == [0.1, 0.2, 0.3] and given["crop_pct"] == 0.9
    assert given["interpolation"] == "bicubic"                      # unset: the model's
    with pytest.raises(ConfigError, match="give both or neither"):
        load_config("default", mean=[0.1, 0.2, 0.3])


def test_pretrained_run_takes_preprocessing_from_the_models_config(monkeypatch, packed_sample,
                                                                   tmp_path):
    """--pretrained (timm's weights, loaded by a stand-in: no network in tests): mean/std,
    interpolation and crop fraction come from test_resnet's pretrained config (mean 0.5,
    crop 0.95) and config.yaml and metrics.json record them; explicit flags win."""
    import timm.models._builder as builder

    calls = []

    def fake_load(model, pretrained_cfg=None, num_classes=1000, **kwargs):
        calls.append((pretrained_cfg["hf_hub_id"], num_classes))
        with torch.no_grad():
            model.conv1[0].weight.fill_(0.01)                      # recognisable "weights"

    monkeypatch.setattr(builder, "load_pretrained", fake_load)
    data, run = packed_sample("wds"), tmp_path / "run"
    result = _invoke(data, "--pretrained", "--out", run, *TINY, "--img-size", "32",
                     "--max-steps", "1", "--lr", "1e-9", "--warmup-steps", "0")
    assert result.exit_code == 0, result.output
    assert calls == [("timm/test_resnet.r160_in1k", 5)]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["pretrained"] is True and saved["mean_std"] == "model"
    assert (saved["mean"], saved["std"]) == ([0.5] * 3, [0.5] * 3)
    assert (saved["interpolation"], saved["crop_pct"]) == ("bilinear", 0.95)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["run"]["transform"]["crop_pct"] == 0.95            # what the loaders used
    assert metrics["run"]["transform"]["mean"] == [0.5] * 3
    assert metrics["run"]["pretrained_weights"]["hf_hub_id"] == "timm/test_resnet.r160_in1k"
    conv = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]["conv1.0.weight"]
    assert torch.allclose(conv, torch.full_like(conv, 0.01), atol=1e-6)  # lr 1e-9: barely moved

    explicit = tmp_path / "explicit"
    result = _invoke(data, "--pretrained", "--out", explicit, *TINY, "--img-size", "32",
                     "--max-steps", "1", "--mean-std", "imagenet", "--interpolation", "bicubic",
                     "--crop-pct", "0.9")
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((explicit / "config.yaml").read_text())
    assert saved["mean_std"] == "imagenet" and saved["mean"] == [0.485, 0.456, 0.406]
    assert (saved["interpolation"], saved["crop_pct"]) == ("bicubic", 0.9)


def test_initial_checkpoint_and_its_earlier_spelling_load_and_record(packed_sample, tmp_path,
                                                                     caplog):
    """--initial-checkpoint FILE and the earlier `--pretrained FILE`: the file loads (head
    skipped for another class count), the run records initial_checkpoint and the model's
    preprocessing; `--config RUN/config.yaml` reads the record back."""
    from shardkit.train import build_model

    torch.manual_seed(3)
    weights = tmp_path / "w.pth"
    torch.save(build_model("test_resnet", 7).state_dict(), weights)
    data = packed_sample("wds")
    for name, flags in (("new", ["--initial-checkpoint", weights]),
                        ("old", ["--pretrained", weights])):
        run = tmp_path / name
        with caplog.at_level(logging.WARNING, "shardkit.train"):
            result = _invoke("--data", data, "--out", run, *flags, *TINY, "--img-size", "32",
                             "--max-steps", "1")
        assert result.exit_code == 0, result.output
        report = json.loads((run / "pretrained_report.json").read_text())
        assert report["path"] == str(weights)
        assert {s["key"] for s in report["skipped_shape"]} == {"fc.weight", "fc.bias"}
        saved = yaml.safe_load((run / "config.yaml").read_text())
        assert saved["initial_checkpoint"] == str(weights) and saved["pretrained"] is False
        assert saved["mean"] == [0.5] * 3 and saved["crop_pct"] == 0.95
    assert caplog.text.count("deprecated; use --initial-checkpoint") == 1   # the old one only
    again = load_config(tmp_path / "new" / "config.yaml")
    assert again.mean == [0.5] * 3 and again.initial_checkpoint == str(weights)


# ----------------------------------------------------------------------------- what a person reads
def test_cli_run_prints_estimate_epoch_lines_and_best_last_on_stderr(packed_sample, tmp_path,
                                                                     caplog):
    """A 2-epoch run under timm's names, DATASET positional, --no-progress: stderr holds the CPU
    estimate first, then one line per epoch whose numbers are metrics.json's, then best / last /
    test; config.yaml records the resolved augmentation ops; the JSON summary names best and
    last."""
    data, run = packed_sample("wds"), tmp_path / "run"
    spec = tmp_path / "spec.yaml"
    spec.write_text("augment:\n  - {op: color_jitter, brightness: 0.3}\n")
    with caplog.at_level(logging.WARNING, "shardkit.train"):
        result = _invoke(data, "--out", run, *TINY, "--img-size", "32", "-b", "32", "-j", "0",
                         "--max-steps", "0", "--epochs", "2", "--warmup-steps", "1",
                         "--smoothing", "0.05", "--augment", spec, "--aa",
                         "rand-m9-n2-mstd0.5-inc1", "--mixup", "0.8", "--cutmix", "1.0")
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["step"] == 8 and len(metrics["history"]) == 2   # 140 train // 32 = 4 a epoch

    lines = result.stderr.splitlines()
    estimate = [k for k, line in enumerate(lines) if line.startswith("CPU run: ")]
    assert len(estimate) == 1
    assert lines[estimate[0]].startswith("CPU run: 8 steps of 32 images at 32 px, 2 evaluations "
                                         f"of {metrics['history'][0]['val']['num_samples']} val "
                                         "images, 1 test of ")
    assert "(an estimate: " in lines[estimate[0]]
    assert SMOKE_FLAGS not in lines[estimate[0]]  # a run of seconds needs no smoke-run hint
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and lines.index(epochs[0]) > estimate[0]
    for line, entry in zip(epochs, metrics["history"]):
        val, train = entry["val"], entry["train"]
        assert line.startswith(f"epoch {entry['epoch']} (step {entry['step']}): val top-1 "
                               f"{100 * val['top1']:.1f}%, macro-F1 {val['macro_f1']:.3f}, "
                               f"loss {val['loss']:.3f} | train loss {train['loss']:.3f}, "
                               f"{train['images_per_s']:.1f} img/s, data wait "
                               f"{100 * train['data_wait_fraction']:.1f}%")
        assert "top-5" not in line                                  # 5 classes: no top-5
    best, last = metrics["best"], metrics["history"][-1]
    assert f"best: epoch {best['epoch']} (step {best['step']}) by macro_f1 " \
           f"{best['value']:.4f}: checkpoints/best.pt" in lines
    assert any(line.startswith(f"last: epoch 1 (step 8): val top-1 "
                               f"{100 * last['val']['top1']:.1f}%") for line in lines)
    (test,) = [line for line in lines if line.startswith("test (")]
    assert test.startswith(f"test ({metrics['test']['num_samples']} images, best.pt of epoch "
                           f"{best['epoch']}): top-1 {100 * metrics['test']['top1']:.1f}%")
    summary = json.loads(result.stdout)
    assert summary["best"] == best and summary["last"]["epoch"] == 1
    assert summary["last"]["val"]["macro_f1"] == last["val"]["macro_f1"]
    assert summary["test"]["weights"] == {"checkpoint": "best", "epoch": best["epoch"]}

    saved_text = (run / "config.yaml").read_text()
    saved = yaml.safe_load(saved_text)
    assert (saved["batch_size"], saved["image_size"], saved["num_workers"]) == (32, 32, 0)
    assert saved["label_smoothing"] == 0.05
    assert saved["augment"] == [
        {"op": "color_jitter", "brightness": 0.3, "contrast": 0.0, "saturation": 0.0,
         "hue": 0.0},
        {"op": "rand_augment", "num_ops": 2, "magnitude": 9, "num_magnitude_bins": 11,
         "fill": None, "interpolation": "nearest"},
        {"op": "mixup", "alpha": 0.8, "p": 1.0}, {"op": "cutmix", "alpha": 1.0, "p": 1.0}]
    assert metrics["run"]["augment_ops"] == saved["augment"]
    assert "--aa rand-m9-n2-mstd0.5-inc1 runs as {op: rand_augment" in caplog.text


def test_cli_records_the_ops_of_a_spec_file_not_its_path(packed_sample, tmp_path):
    data, run = packed_sample("wds"), tmp_path / "run"
    spec = tmp_path / "ops.yaml"
    spec.write_text("- {op: rand_augment, num_ops: 1, magnitude: {start: 2, end: 8, "
                    "epochs: 3}}\n- {op: random_erasing, p: 0.25}\n")
    result = _invoke(data, "--out", run, *TINY, "--img-size", "32", "--max-steps", "1",
                     "--augment", spec)
    assert result.exit_code == 0, result.output
    text = (run / "config.yaml").read_text()
    assert f"# augment as given: {spec}" in text.splitlines()[:3]
    saved = yaml.safe_load(text)
    assert saved["augment"][0]["magnitude"] == {"start": 2, "end": 8, "epochs": 3}
    assert saved["augment"][1] == {"op": "random_erasing", "p": 0.25, "scale": [0.02, 0.33],
                                   "ratio": [0.3, 3.3], "value": 0}
    for epoch in (0, 1, 2):
        assert AugmentSpec.parse(saved["augment"]).draw(np.random.default_rng(epoch), 32, 32,
                                                        epoch) == \
            AugmentSpec.parse(str(spec)).draw(np.random.default_rng(epoch), 32, 32, epoch)


def test_epoch_line_shows_top5_with_more_than_five_classes_and_marks_the_best():
    from shardkit.train import classification_metrics

    logits = torch.tensor([[6.0, 5.0, 4.0, 3.0, 2.0, 1.0]] * 4)
    val = classification_metrics(logits, torch.tensor([0, 4, 5, 1]), list("abcdef"))
    entry = {"epoch": 3, "step": 40, "partial": False, "val": val,
             "train": {"loss": 1.5, "images_per_s": 80.25, "data_wait_fraction": 0.125}}
    assert epoch_line(entry, "top1", new_best=True) == (
        "epoch 3 (step 40): val top-1 25.0%, top-5 75.0%, "
        f"macro-F1 {val['macro_f1']:.3f}, loss {val['loss']:.3f} | train loss 1.500, "
        "80.2 img/s, data wait 12.5% | new best top1")
    del entry["val"]
    entry["train"] = {"loss": None, "images_per_s": None, "data_wait_fraction": None}
    assert epoch_line(entry, "top1") == "epoch 3 (step 40): train loss n/a, n/a img/s, " \
                                        "data wait n/a"


def test_estimate_arithmetic_and_the_timed_step_changes_nothing():
    from shardkit.train import build_model

    # the default config on the full flowers train split: 30 epochs of 23 steps, val each epoch
    assert planned_work(30, 23, None, 0, 0, 1, True) == (690, 30)
    assert planned_work(30, 23, 100, 0, 0, 1, True) == (100, 5)     # cut in epoch 4 (0-based)
    assert planned_work(30, 23, None, 690, 30, 1, True) == (0, 0)   # nothing left
    assert planned_work(4, 10, None, 15, 1, 2, False) == (25, 0)
    line = estimate_line(690, 13.0, 64, 224, 30, 184, 184)
    # 690 * 13 s + (30 * 184 + 184) images * 13 / 64 / 3 s = 8970 + 386.2 s
    assert line.startswith("CPU run: 690 steps of 64 images at 224 px, 30 evaluations of 184 "
                           "val images, 1 test of 184 images: about 2 h 36 min (an estimate: "
                           "13.00 s a step")
    assert line.endswith(f"not counted). A smoke run: {SMOKE_FLAGS}")  # hours: the hint
    assert "smoke" not in estimate_line(20, 1.0, 8, 64, 1, 32, 28)       # seconds: none
    assert [format_duration(s) for s in (0.2, 12.4, 250, 3599.6, 9356.2)] == \
        ["< 1 s", "12 s", "4 min 10 s", "1 h 0 min", "2 h 36 min"]

    model = build_model("test_resnet", 5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    model.eval()
    assert time_train_step(model, 64, 32) > 0
    assert not model.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
