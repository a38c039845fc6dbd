"""Seeing the augmentation (README.md) on the real flowers sample: ``shardkit inspect --augment
SPEC`` (a grid of augmented samples, pixel-equal to the train loader's rows) and ``shardkit check
--augment SPEC``'s hue warning (per-class chroma-weighted mean hue from ``shardkit stats``).

Measured on the sample's train split (140 photos, decoder "auto"): class mean hues roses 28.5,
tulips 33.3, sunflowers 49.6, dandelion 58.8, daisy 58.8 degrees; eta2 0.110 (permutation p
0.005), above the 0.06 threshold; the same photos with classes mixed (label = rank % 5): eta2
below 0.03.
"""
from __future__ import annotations

import colorsys
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit.doctor import check_command, check_dataset, inspect_command, stats_command
from shardkit.doctor.inspection import augment_grid
from shardkit.doctor.reading import decode_rgb, iter_sample_bytes, load_manifest_dict
from shardkit.doctor.stats import (HUE_ETA2_THRESHOLD, ClassHue, class_hues, compute_stats,
                                   hue_separates_classes, hue_vector)
from shardkit.errors import ConfigError
from shardkit.dataset.manifest import load_index
from shardkit.transforms import TransformConfig

SCHEDULED = ("[{op: color_jitter, brightness: 0.4, contrast: 0.4, saturation: 0.4}, "
             "{op: rand_augment, num_ops: 2, magnitude: {start: 5, end: 15, epochs: 3}}]")
HUE_ON = "[{op: color_jitter, brightness: 0.2, hue: 0.1}]"
CLASSES = ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
#: per-class mean hue (degrees) of the sample's train split, decoder "auto" (see the module doc)
TRAIN_HUES = {"daisy": 58.8, "dandelion": 58.8, "roses": 28.5, "sunflowers": 49.6,
              "tulips": 33.3}


@pytest.fixture
def clean(packed_sample, tmp_path) -> Path:
    dst = tmp_path / "ds"
    shutil.copytree(packed_sample("wds"), dst)
    return dst


def _tile(png: np.ndarray, box: list[int]) -> np.ndarray:
    left, top, right, bottom = box
    return png[top:bottom, left:right]


def _loader_rows(root: Path, spec, epoch: int, size: int) -> np.ndarray:
    """The train loader's rows of an unshuffled epoch, as (N, S, S, 3) uint8."""
    from shardkit.stream import SamplingOptions, make_loader

    n = load_manifest_dict(root)["splits"]["train"]["num_samples"]
    loader = make_loader(root, "train", n, num_workers=0, seed=0, return_meta=True,
                         transform=TransformConfig(image_size=size), augment=spec,
                         sampling=SamplingOptions(shuffle=False))
    loader.set_epoch(epoch)
    (images, _, meta), = list(loader)
    assert meta["index"].tolist() == list(range(n))      # order index == split position
    return images.permute(0, 2, 3, 1).numpy()


# ------------------------------------------------------------------------------- inspect grid

def test_augment_grid_tiles_are_the_loaders_rows(clean, tmp_path):
    size, k = 64, 2
    grid = augment_grid(clean, SCHEDULED, per_class=k, out_dir=tmp_path / "g",
                        transform_config=TransformConfig(image_size=size))
    assert grid["path"] == str(tmp_path / "g" / "inspect_train_augment.png")
    assert grid["epochs"] == [0, 2] and grid["rows"] == CLASSES and grid["cols"] == k * 4
    assert grid["scheduled"] == {0: {"1.rand_augment.magnitude": 5.0},
                                 2: {"1.rand_augment.magnitude": 15.0}}
    with Image.open(grid["path"]) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        assert list(im.size) == grid["size"]
        png = np.asarray(im)
    # grid shape: a row of k samples x (crop, augmented) x (epoch 0, epoch 2) per class
    tops = []
    for row in grid["tiles"]:
        assert [(t["epoch"], t["augmented"]) for t in row] == [
            (0, False), (0, True), (2, False), (2, True)] * k
        assert len({t["position"] for t in row}) == k
        assert len({t["box"][1] for t in row}) == 1               # one line of tiles
        lefts = [t["box"][0] for t in row]
        assert lefts == sorted(lefts) and np.diff(lefts).min() >= size
        assert all(t["box"][2] - t["box"][0] == t["box"][3] - t["box"][1] == size for t in row)
        tops.append(row[0]["box"][1])
    assert np.diff(tops).min() > size and tops[-1] + size <= png.shape[0]
    labels = load_index(clean, "train").label
    for c, row in enumerate(grid["tiles"]):
        assert all(labels[t["position"]] == c for t in row)       # rows = classes
    # pixels: exactly the loader's rows (plain crop: augment none), and augmentation shows
    for epoch in (0, 2):
        plain, augmented = (_loader_rows(clean, spec, epoch, size) for spec in ("none",
                                                                                 SCHEDULED))
        for row in grid["tiles"]:
            for t in (t for t in row if t["epoch"] == epoch):
                want = (augmented if t["augmented"] else plain)[t["position"]]
                np.testing.assert_array_equal(_tile(png, t["box"]), want)
            for crop, aug in zip(row[0::2], row[1::2]):
                diff = np.abs(_tile(png, crop["box"]).astype(int) - _tile(png, aug["box"]))
                assert diff.mean() > 2.0, (crop["key"], epoch)   # 0-255 levels


def test_augment_grid_without_schedule_and_short_classes(clean, tmp_path):
    """No schedule: epoch 0 only (crop, augmented). A class with fewer than K samples in the
    split shows all it has."""
    grid = augment_grid(clean, "standard", "val", per_class=7, out_dir=tmp_path,
                        transform_config=TransformConfig(image_size=32))
    counts = load_manifest_dict(clean)["splits"]["val"]["class_counts"]
    assert grid["epochs"] == [0] and grid["scheduled"] == {0: {}} and grid["cols"] == 14
    assert [len(row) for row in grid["tiles"]] == [2 * min(7, n) for n in counts]
    assert min(counts) < 7                                        # the short case is exercised
    with Image.open(grid["path"]) as im:
        assert list(im.size) == grid["size"] and grid["size"][0] >= 14 * 32


def test_inspect_cli_augment_prints_the_png_and_rejects_a_bad_spec(clean, tmp_path):
    tcfg = tmp_path / "t.yaml"
    tcfg.write_text("image_size: 48\n")
    before = sorted(p.relative_to(clean) for p in clean.rglob("*"))
    res = CliRunner().invoke(inspect_command, [
        str(clean), "--augment", "randaugment", "--per-class", "1", "--out-dir",
        str(tmp_path / "o"), "--transform-config", str(tcfg), "--no-progress"])
    assert res.exit_code == 0, res.output
    png = tmp_path / "o" / "inspect_train_augment.png"
    last = res.output.strip().splitlines()[-1]
    assert last.startswith(f"wrote {png} (") and "5 rows x 2 tiles of 48 px" in last
    with Image.open(png) as im:
        assert im.width >= 2 * 48 and im.height >= 5 * 48
    assert sorted(p.relative_to(clean) for p in clean.rglob("*")) == before
    for bad, says in [("[{op: nope}]", "augment op 'nope' is unknown"),
                      ("strongest", "augment='strongest'"),
                      ("[{op: color_jitter, hue: 0.9}]", "hue=0.9")]:
        res = CliRunner().invoke(inspect_command, [str(clean), "--augment", bad, "--out-dir",
                                                   str(tmp_path / "bad")])
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ConfigError: ") and says in lines[0]
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------------------------------- hue

def test_hue_vector_equals_colorsys_on_a_real_photo(sample_photo):
    with Image.open(sample_photo) as im:
        img = np.asarray(im.convert("RGB"))
    for stride in (1, 4):
        px = img[::stride, ::stride].reshape(-1, 3) / 255.0
        ref = 0j
        for r, g, b in px:
            h, s, v = colorsys.rgb_to_hsv(r, g, b)
            ref += s * v * np.exp(2j * np.pi * h)                 # chroma = S * V
        ref /= len(px)
        got = hue_vector(img, stride)
        assert abs(got - ref) < 1e-6 and abs(got) > 0.05
    pure = {(255, 0, 0): 0.0, (255, 255, 0): 60.0, (0, 255, 0): 120.0, (0, 0, 255): 240.0}
    for rgb, deg in pure.items():
        v = hue_vector(np.full((8, 8, 3), rgb, np.uint8))
        assert abs(v) == pytest.approx(1.0) and np.degrees(np.angle(v)) % 360 == pytest.approx(deg)
    assert hue_vector(np.full((8, 8, 3), 128, np.uint8)) == 0
    with pytest.raises(ConfigError, match="uint8"):
        hue_vector(np.zeros((4, 4, 3), np.float32))


def test_class_hues_of_the_flowers_sample_and_of_mixed_classes(clean):
    hue = class_hues(clean, "train")
    assert hue["num_samples"] == 140 and hue["weight"] == "chroma" and hue["stride"] == 4
    got = {c: v["mean_hue_deg"] for c, v in hue["classes"].items()}
    assert got == pytest.approx(TRAIN_HUES, abs=0.5)
    assert min(got, key=got.get) == "roses"
    assert hue["eta2"] == pytest.approx(0.110, abs=0.005) and hue["eta2_p"] <= 0.01
    assert hue_separates_classes(hue) and hue["eta2"] >= HUE_ETA2_THRESHOLD
    # the same photos, classes mixed so that each holds every flower alike: no hue signal
    manifest = load_manifest_dict(clean)
    labels = load_index(clean, "train").label
    order = np.argsort(labels, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    mixed = ClassHue(CLASSES)
    for pos, data in iter_sample_bytes(clean, manifest, "train"):
        mixed.update(decode_rgb(data), int(rank[pos] % 5))
    null = mixed.result()
    assert null["eta2"] < 0.03 and null["eta2_p"] > 0.05 and not hue_separates_classes(null)
    with pytest.raises(ConfigError, match="outside"):
        mixed.update(np.zeros((2, 2, 3), np.uint8), 5)


def test_check_warns_on_hue_jitter_over_hue_classes(clean):
    quick = dict(near_duplicates=False, transforms=False)
    report = check_dataset(clean, augment=HUE_ON, **quick)
    aug = report["augment"]
    assert aug["uses_hue"] and aug["max_hue"] == 0.1 and aug["hue_source"] == "decoded"
    assert aug["separates"] and report["ok"]
    (warning,) = [w["message"] for w in report["warnings"] if w["check"] == "augment_hue"]
    assert all(c in warning for c in CLASSES) and "`hue: 0`" in warning
    assert "+/-36 degrees" in warning and "eta2 0.110" in warning
    # no hue jitter: nothing decoded, no warning
    off = check_dataset(clean, augment="standard", **quick)["augment"]
    assert off["uses_hue"] is False and off["hue"] is None and off["warning"] is None
    # hue scheduled in from 0: on at the last epoch only
    ramp = "[{op: color_jitter, hue: {start: 0, end: 0.05, epochs: 5}}]"
    late = check_dataset(clean, augment=ramp, **quick)["augment"]
    assert late["uses_hue"] and "at epoch 4)" in late["warning"]
    # saved stats are used instead of decoding, with the same numbers
    compute_stats(clean, "train")
    saved = check_dataset(clean, augment=HUE_ON, strict=True, **quick)
    assert saved["augment"]["hue_source"] == "manifest"
    assert saved["augment"]["hue"] == aug["hue"]
    assert not saved["ok"] and any(e["check"] == "augment_hue" for e in saved["errors"])
    with pytest.raises(ConfigError, match="nope"):
        check_dataset(clean, augment="[{op: nope}]", **quick)


def test_check_and_stats_cli_show_the_hues(clean):
    args = [str(clean), "--no-near-duplicates", "--no-transforms", "--no-progress"]
    res = CliRunner().invoke(check_command, args + ["--augment", HUE_ON])
    assert res.exit_code == 0, res.output
    assert any(line.startswith("WARNING [augment_hue] hue jitter is on")
               for line in res.output.splitlines())
    assert CliRunner().invoke(check_command, args + ["--augment", HUE_ON, "--strict"]
                              ).exit_code == 1
    bad = CliRunner().invoke(check_command, args + ["--augment", "[{op: nope}]"])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    stats = CliRunner().invoke(stats_command, [str(clean), "--no-progress"])
    assert stats.exit_code == 0, stats.output
    line = next(x for x in stats.output.splitlines() if x.startswith("class mean hue"))
    assert "roses 28." in line and "hue eta2 0.110" in line
    saved = json.loads((clean / "manifest.json").read_text())["stats"]["train"]["hue"]
    assert saved["eta2"] == pytest.approx(0.110, abs=0.005)
