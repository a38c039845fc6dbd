"""The augmentation spec (shardkit.augment.spec): presets, op lists, YAML, errors, strength
schedules and the determinism of per-sample programs."""
from __future__ import annotations

import json
import math

import pytest

from shardkit.augment import PRESETS, AugmentSpec, scheduled_value
from shardkit.errors import ConfigError
from shardkit.sharding import sample_rng

RA_SCHEDULE = {"start": 5, "end": 12, "schedule": "linear", "epochs": 8}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_parse(name):
    spec = AugmentSpec.parse(name)
    assert spec.preset == name and spec.to_config() == name and spec.describe() == name
    assert [{"op": n, **p} for n, p in spec.ops] == PRESETS[name]
    assert spec.batch_ops == () and spec.is_identity == (name == "none")
    assert AugmentSpec.parse(f"  {name}\n") == spec


def test_none_and_specs_pass_through():
    assert AugmentSpec.parse(None) == AugmentSpec.parse("none") == AugmentSpec((), (), "none")
    spec = AugmentSpec.parse("standard")
    assert AugmentSpec.parse(spec) is spec
    assert PRESETS["standard"] == [{"op": "color_jitter", "brightness": 0.4, "contrast": 0.4,
                                    "saturation": 0.4}]  # timm's default jitter, no hue


def test_op_list_splits_per_sample_and_batch_ops():
    entries = [{"op": "color_jitter", "brightness": 0.4, "hue": 0.05},
               {"op": "rand_augment", "num_ops": 2, "magnitude": RA_SCHEDULE},
               {"op": "random_erasing", "p": 0.25}, {"op": "mixup", "alpha": 0.8},
               {"op": "cutmix", "alpha": 1.0}]
    spec = AugmentSpec.parse(entries)
    assert [n for n, _ in spec.ops] == ["color_jitter", "rand_augment", "random_erasing"]
    assert spec.batch_ops == (("mixup", {"alpha": 0.8}), ("cutmix", {"alpha": 1.0}))
    assert spec.preset is None and spec.to_config() == entries
    assert json.loads(spec.describe()) == entries
    assert spec.uses_hue() and not AugmentSpec.parse("light").uses_hue()
    assert AugmentSpec.parse({"op": "grayscale", "p": 0.2}).ops == (("grayscale", {"p": 0.2}),)


def test_yaml_text_and_files(tmp_path):
    text = "[{op: color_jitter, brightness: 0.4}, {op: rand_augment, magnitude: " \
           "{start: 5, end: 12, schedule: linear, epochs: 8}}, {op: mixup, alpha: 0.8}]"
    want = AugmentSpec.parse([{"op": "color_jitter", "brightness": 0.4},
                              {"op": "rand_augment", "magnitude": RA_SCHEDULE},
                              {"op": "mixup", "alpha": 0.8}])
    assert AugmentSpec.parse(text) == want
    (tmp_path / "bare.yaml").write_text("- {op: color_jitter, brightness: 0.4}\n"
                                        "- op: rand_augment\n  magnitude: {start: 5, end: 12, "
                                        "schedule: linear, epochs: 8}\n- {op: mixup, alpha: 0.8}\n")
    (tmp_path / "train.yml").write_text("epochs: 8\naugment:\n" + "".join(
        "  " + line + "\n" for line in (tmp_path / "bare.yaml").read_text().splitlines()))
    (tmp_path / "spec.json").write_text(json.dumps(want.to_config()))
    for name in ("bare.yaml", "train.yml", "spec.json"):
        assert AugmentSpec.parse(str(tmp_path / name)) == want, name
    (tmp_path / "preset.yaml").write_text("augment: trivialaugment\n")
    assert AugmentSpec.parse(str(tmp_path / "preset.yaml")).preset == "trivialaugment"


@pytest.mark.parametrize("spec,message", [
    ("strong", r"augment='strong'; expected a preset \(none, light"),
    ("missing.yaml", r"augment spec file missing.yaml does not exist"),
    ([{"op": "blur"}], r"augment op 'blur' is unknown; expected one of \["),
    ([{"brightness": 0.4}], r"augment entry 0: .*expected a dict with 'op'"),
    ([{"op": "grayscale"}, "flip"], r"augment entry 1: 'flip'"),
    (42, r"augment=42; expected a preset name or a list of op dicts"),
    ([{"op": "color_jitter", "strength": 0.4}],
     r"augment op 'color_jitter' has no parameter 'strength'; expected some of \['brightness'"),
    ([{"op": "color_jitter", "brightness": -0.1}], r"brightness=-0.1; expected a non-negative"),
    ([{"op": "color_jitter", "hue": 0.7}], r"hue=0.7; expected a value in \[0, 0.5\]"),
    ([{"op": "posterize", "bits": 9}], r"posterize bits=9; expected 0-8"),
    ([{"op": "solarize", "threshold": 300}], r"solarize threshold=300; expected 0-255"),
    ([{"op": "gaussian_blur", "kernel_size": 4}], r"kernel_size=4; expected an odd int"),
    ([{"op": "perspective", "distortion_scale": 1.5}], r"distortion_scale=1.5; expected 0-1"),
    ([{"op": "rand_augment", "magnitude": 31}], r"rand_augment magnitude=31; expected 0-30"),
    ([{"op": "aug_mix", "severity": 11}], r"aug_mix severity=11; expected 1-10"),
    ([{"op": "rotation", "degrees": "a lot"}], r"degrees='a lot'; expected a non-negative"),
    ([{"op": "mixup", "alpha": -1}], r"mixup alpha=-1 at epoch 0; expected a number in \[0.0"),
    ([{"op": "mixup", "alpha": "abc"}], r"mixup alpha='abc' at epoch 0; expected a number"),
    ([{"op": "cutmix", "p": 2}], r"cutmix p=2 at epoch 0; expected a number in \[0.0, 1.0\]"),
    ([{"op": "rotation", "interpolation": "bicubic"}], r"'rotation'.*'bicubic' is unsupported"),
    ([{"op": "gaussian_blur", "sigma": -1}], r"'gaussian_blur'.*sigma should have positive"),
    ([{"op": "random_erasing", "value": 300}], r"'random_erasing'.*value=300; expected a uint8"),
    ([{"op": "perspective", "fill": 300}], r"'perspective'.*fill=300; expected a uint8"),
    ([{"op": "rand_augment", "fill": [1, 2]}], r"'rand_augment'.*fill=\[1, 2\]; expected a uint8"),
    ([{"op": "random_erasing", "value": None}], r"'random_erasing'.*value=None; expected a uint8"),
    ([{"op": "grayscale", "p": 1.5}], r"'grayscale'.*p=1.5; expected a probability"),
    ([{"op": "affine", "translate": 0.1}], r"'affine'.*translate=0.1; expected \[max x"),
    ([{"op": "rand_augment", "magnitude": {"start": "five", "end": 9, "epochs": 3}}],
     r"start and end must be numbers"),
    ("[{op: color_jitter, hue: 0.2", r"is not valid YAML"),
    # one message for any bad hue: negative, past 0.5, a reversed or too wide pair
    ([{"op": "color_jitter", "hue": -0.1}], r"hue=-0.1; expected a value in \[0, 0.5\] or a"),
    ([{"op": "color_jitter", "hue": [0.2, -0.2]}], r"hue=\(0.2, -0.2\); expected a value in"),
    ([{"op": "color_jitter", "hue": [-0.6, 0.1]}], r"hue=\(-0.6, 0.1\); expected a value in"),
    ([{"op": "cutmix", "beta": 1}], r"augment op 'cutmix' has no parameter 'beta'"),
    ([{"op": "rand_augment", "magnitude": {"start": 5, "end": 12, "schedule": "exp",
                                          "epochs": 8}}],
     r"schedule of rand_augment.magnitude: 'exp'; expected one of \('linear', 'cosine', 'step'"),
    ([{"op": "rand_augment", "magnitude": {"start": 5, "end": 12}}],
     r"schedule of rand_augment.magnitude: .*expected keys start, end, epochs"),
    ([{"op": "rand_augment", "magnitude": {"start": 5, "end": 12, "epochs": 0}}],
     r"schedule of rand_augment.magnitude: epochs=0; expected >= 1"),
    # valid at epoch 0, out of range where the schedule ends: caught at parse time
    ([{"op": "rand_augment", "magnitude": {"start": 5, "end": 40, "epochs": 10}}],
     r"rand_augment magnitude=40.0; expected 0-30"),
])
def test_bad_specs_name_what_is_wrong(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        AugmentSpec.parse(spec)


def test_schedules_at_given_epochs():
    lin = {"start": 5, "end": 12, "schedule": "linear", "epochs": 8}
    assert [scheduled_value(lin, e) for e in (0, 1, 3, 7, 8, 100)] == [5.0, 6.0, 8.0, 12.0,
                                                                       12.0, 12.0]
    assert scheduled_value({"start": 5, "end": 12, "epochs": 8}, 3) == 8.0  # linear by default
    cos = {"start": 0.1, "end": 0.5, "schedule": "cosine", "epochs": 5}
    assert [scheduled_value(cos, e) for e in (0, 2, 4, 9)] == pytest.approx([0.1, 0.3, 0.5, 0.5])
    assert scheduled_value(cos, 1) == pytest.approx(0.1 + 0.4 * (1 - math.cos(math.pi / 4)) / 2)
    assert scheduled_value(cos, 1) == pytest.approx(0.15857864376269)
    step = {"start": 2, "end": 9, "schedule": "step", "epochs": 3}
    assert [scheduled_value(step, e) for e in (0, 2, 3, 50)] == [2.0, 2.0, 9.0, 9.0]
    assert scheduled_value(0.4, 17) == 0.4 and scheduled_value([0.5, 1.2], 3) == [0.5, 1.2]


def test_resolved_rounds_integer_parameters_and_reports_scheduled_values():
    spec = AugmentSpec.parse([
        {"op": "rand_augment", "num_ops": {"start": 1, "end": 3, "epochs": 5},
         "magnitude": RA_SCHEDULE},
        {"op": "color_jitter", "brightness": 0.4},
        {"op": "mixup", "alpha": {"start": 0.2, "end": 0.8, "schedule": "step", "epochs": 4}}])
    assert spec.last_scheduled_epoch() == 7  # linear over 8 epochs ends at 7, step at 4
    assert spec.resolved(0) == [("rand_augment", {"num_ops": 1, "magnitude": 5.0}),
                                ("color_jitter", {"brightness": 0.4})]
    assert spec.resolved(2) == [("rand_augment", {"num_ops": 2, "magnitude": 7.0}),
                                ("color_jitter", {"brightness": 0.4})]
    assert spec.resolved(4, batch=True) == [("mixup", {"alpha": 0.8})]
    assert spec.scheduled_values(0) == {"0.rand_augment.num_ops": 1.0,
                                        "0.rand_augment.magnitude": 5.0, "2.mixup.alpha": 0.2}
    assert spec.scheduled_values(6) == {"0.rand_augment.num_ops": 3.0,
                                        "0.rand_augment.magnitude": 11.0, "2.mixup.alpha": 0.8}
    assert AugmentSpec.parse("randaugment").scheduled_values(3) == {}


def test_draw_is_a_pure_function_of_seed_epoch_rank_position():
    spec = AugmentSpec.parse([{"op": "color_jitter", "brightness": 0.4, "contrast": 0.4},
                              {"op": "rotation", "degrees": 20},
                              {"op": "rand_augment", "magnitude": RA_SCHEDULE}])
    keys = [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (7, 3, 2, 999)]
    programs = [spec.draw(sample_rng(*k), 224, 224, k[1]) for k in keys]
    again = [spec.draw(sample_rng(*k), 224, 224, k[1]) for k in reversed(keys)][::-1]
    assert programs == again  # same (seed, epoch, rank, position): same program, any order
    for k, p in zip(keys[1:], programs[1:]):
        assert p != programs[0], k  # any other coordinate: another program
    # the crop's draws come first in the loader: a program drawn after them differs
    rng = sample_rng(0, 0, 0, 0)
    rng.random(3)
    assert spec.draw(rng, 224, 224, 0) != programs[0]


def test_block_yaml_text_parses():
    spec = AugmentSpec.parse("- {op: color_jitter, brightness: 0.4}\n- {op: mixup, alpha: 0.8}")
    assert spec.to_config() == [{"op": "color_jitter", "brightness": 0.4},
                                {"op": "mixup", "alpha": 0.8}]


def test_batch_mix_per_op_probabilities_and_schedules():
    """An op with p=0 or alpha=0 is off: mixup p=0 next to cutmix means cutmix only; a mixup
    alpha scheduled down to 0 switches mixing off at the schedule's end (no error)."""
    from shardkit.augment import BatchMix, mix_rng

    spec = AugmentSpec.parse([{"op": "mixup", "alpha": 0.8, "p": 0.0},
                              {"op": "cutmix", "alpha": 1.0, "p": 1.0}])
    mix = BatchMix.from_spec(spec.resolved(0, batch=True), 5)
    draws = [mix.draw(mix_rng(0, 0, 0, k)) for k in range(200)]
    assert mix.mixup_alpha == 0.0 and all(cut for _, cut in draws)
    both = BatchMix.from_spec(AugmentSpec.parse([{"op": "mixup", "p": 0.5},
                                                 {"op": "cutmix", "p": 0.5}]).resolved(0, True), 5)
    assert both.prob == 0.5 and both.switch_prob == 0.5
    fading = AugmentSpec.parse([{"op": "mixup", "alpha": {"start": 0.8, "end": 0.0, "epochs": 3}}])
    assert [BatchMix.from_spec(fading.resolved(e, batch=True), 5) is None
            for e in range(4)] == [False, False, True, True]
