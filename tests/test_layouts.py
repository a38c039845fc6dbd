"""Source layouts on real photos: split-first trees keep their given splits,
two-level trees are an error, numeric and NFC/NFD twin class folders, given split columns."""
from __future__ import annotations

import csv
import hashlib
import shutil
import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit
from conftest import SAMPLE
from shardkit.doctor import check_dataset
from shardkit.errors import ConfigError, SourceError
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.packer.options import DEFAULT_SPLIT, PackOptions
from shardkit.packer.run import pack
from shardkit.packer.cli import pack_command
from shardkit.sources.folder import scan_folder

CAFE_NFC = unicodedata.normalize("NFC", "Café")
CAFE_NFD = unicodedata.normalize("NFD", "Café")
GIVEN_NOTE = ("left where they are (the splits are given; `shardkit check` fails on "
              "them)")


def photos(cls: str, start: int, n: int) -> list[Path]:
    """``n`` real photos of ``cls`` from the embedded sample, from position ``start``."""
    files = sorted((SAMPLE / cls).glob("*.jpg"))[start:start + n]
    assert len(files) == n
    return files


def build(root: Path, tree: dict[str, list[Path]]) -> Path:
    """Copies ``{folder relpath: photos}`` under ``root``; returns ``root``."""
    for rel, files in tree.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, root / rel / f.name)
    return root


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def records(out: Path) -> dict[str, list[dict]]:
    return {s: read_split_records(out, s) for s in load_manifest(out)["splits"]}


@pytest.fixture()
def split_first(tmp_path) -> Path:
    """``Train/`` (daisy, roses, tulips: 4 each) and ``VALID/`` (daisy, roses: 2 each; no
    tulips) plus ``VALID/daisy/copy_of_train.jpg``, the bytes of the first train daisy."""
    root = build(tmp_path / "src", {
        "Train/daisy": photos("daisy", 0, 4), "Train/roses": photos("roses", 0, 4),
        "Train/tulips": photos("tulips", 0, 4),
        "VALID/daisy": photos("daisy", 4, 2), "VALID/roses": photos("roses", 4, 2)})
    shutil.copyfile(photos("daisy", 0, 1)[0], root / "VALID" / "daisy" / "copy_of_train.jpg")
    return root


# ---------------------------------------------------------------- detection (scan only)
@pytest.mark.parametrize("folders, mapping", [
    (["Train", "VALID"], {"Train": "train", "VALID": "val"}),
    (["training", "validation", "testing"],
     {"training": "train", "validation": "val", "testing": "test"}),
    (["test", "train", "valid"], {"train": "train", "valid": "val", "test": "test"}),
    (["eval", "train"], {"train": "train", "eval": "val"}),
    (["dev", "eval", "train"], {"train": "train", "dev": "dev", "eval": "eval"}),
])
def test_split_first_trees_are_detected(tmp_path, folders, mapping):
    tree = {}
    for k, folder in enumerate(folders):
        tree[f"{folder}/daisy"] = photos("daisy", 2 * k, 2)
        tree[f"{folder}/roses"] = photos("roses", 2 * k, 1)
    result = scan_folder(build(tmp_path / "src", tree))
    assert result.layout == "split/class" and result.given_splits == mapping
    assert list(result.given_splits) == list(mapping)  # train, val, test order
    assert sorted({i.label for i in result.items}) == ["daisy", "roses"]
    for folder in folders:
        mine = [i for i in result.items if i.relpath.startswith(folder + "/")]
        assert [i.split for i in mine] == [mapping[folder]] * 3
        assert [i.label for i in mine] == ["daisy", "daisy", "roses"]
    assert result.warnings == [] and result.ignored == []


def test_layout_class_and_split_class_override_detection(split_first, tmp_path):
    as_classes = scan_folder(split_first, layout="class")
    assert as_classes.layout == "class" and as_classes.given_splits == {}
    assert sorted({i.label for i in as_classes.items}) == ["Train", "VALID"]
    assert {i.split for i in as_classes.items} == {None}
    folds = build(tmp_path / "folds", {"fold_a/daisy": photos("daisy", 0, 2),
                                       "fold_b/daisy": photos("daisy", 2, 1)})
    with pytest.raises(SourceError, match="two levels deep"):  # fold_a: not a split name
        scan_folder(folds)
    forced = scan_folder(folds, layout="split/class")
    assert forced.given_splits == {"fold_a": "fold_a", "fold_b": "fold_b"}
    assert [(i.split, i.label) for i in forced.items] == [
        ("fold_a", "daisy"), ("fold_a", "daisy"), ("fold_b", "daisy")]


def test_two_level_tree_is_an_error_showing_shape_and_both_ways_out(tmp_path):
    root = build(tmp_path / "src", {"animals/daisy": photos("daisy", 0, 2),
                                    "animals/roses": photos("roses", 0, 2),
                                    "plants/tulips": photos("tulips", 0, 3)})
    expected = (
        f"source folder {str(root)!r} is two levels deep and not split-first (top folders not "
        "all named train/val/test...): its top folders hold only sub-folders, no files, so "
        "they would become the classes; shape: animals/{daisy/ (2 files), roses/ (2 files)}, "
        "plants/{tulips/ (3 files)}. Say which it is: --layout class (layout='class') makes "
        "each top folder a class holding the files of its sub-folders, --layout split/class "
        "(layout='split/class') reads the top folders as splits holding class folders; or "
        "point SRC at a folder whose sub-folders are the classes")
    with pytest.raises(SourceError) as err:
        scan_folder(root)
    assert str(err.value) == expected
    res = CliRunner().invoke(pack_command, [str(root), str(tmp_path / "out"), "--no-progress"])
    assert res.exit_code != 0 and len(res.output.splitlines()) == 1
    assert res.output.startswith("Error: ") and res.output.endswith(f": {expected}\n")
    assert not (tmp_path / "out").exists()
    # way out 1: the top folders are classes
    classes = scan_folder(root, layout="class")
    assert [(i.label, i.relpath.split("/")[1]) for i in classes.items] == [
        ("animals", "daisy")] * 2 + [("animals", "roses")] * 2 + [("plants", "tulips")] * 3
    # way out 2: the top folders are splits
    summary = pack(root, tmp_path / "out", layout="split/class", progress=False)
    assert summary.classes == ["daisy", "roses", "tulips"]
    assert {s: v["class_counts"] for s, v in summary.splits.items()} == {
        "animals": [2, 2, 0], "plants": [0, 0, 3]}


def test_unlabelled_flat_test_folder_beside_class_folders(tmp_path):
    """Kaggle style: train/<class>/... and a flat, unlabelled test/ folder."""
    root = build(tmp_path / "src", {"train/daisy": photos("daisy", 0, 2),
                                    "train/roses": photos("roses", 0, 2),
                                    "test": photos("tulips", 0, 3)})
    result = scan_folder(root)
    assert result.layout == "split/class" and result.given_splits == {"train": "train"}
    assert [i.relpath.split("/")[:2] for i in result.items] == [["train", "daisy"]] * 2 + [
        ["train", "roses"]] * 2
    assert result.ignored == [
        (f"test/{f.name}", "file beside the class folders of split folder 'test' (not a sample)")
        for f in photos("tulips", 0, 3)]
    assert result.warnings == [
        "split folder 'test' holds no class folder with files: not packed; its 3 files lie "
        "directly in it (unlabelled?) and are listed as ignored"]


def test_split_named_class_beside_real_classes_warns(tmp_path):
    root = build(tmp_path / "src", {"train/daisy": photos("daisy", 0, 2),
                                    "roses": photos("roses", 0, 2)})
    result = scan_folder(root)
    assert result.layout == "class" and sorted({i.label for i in result.items}) == [
        "roses", "train"]
    assert result.warnings == [
        "class folder(s) ['train'] are named like splits; if SRC is split-first "
        "(SRC/<split>/<class>/...), pass --layout split/class"]


def test_two_folders_naming_one_split_is_an_error(tmp_path):
    root = build(tmp_path / "src", {"Train/daisy": photos("daisy", 0, 1),
                                    "train/daisy": photos("daisy", 1, 1)})
    with pytest.raises(SourceError, match=r"\['Train', 'train'\] all name split 'train'; merge "
                                          r"or rename them"):
        scan_folder(root)


# ---------------------------------------------------------------- packing given splits
def test_pack_keeps_given_splits_and_reports_cross_split_copies(split_first, tmp_path):
    out = tmp_path / "out"
    summary = pack(split_first, out, progress=False)
    first = photos("daisy", 0, 1)[0].name
    assert summary.classes == ["daisy", "roses", "tulips"]
    assert list(summary.splits) == ["train", "val"]
    assert {s: (v["samples"], v["class_counts"]) for s, v in summary.splits.items()} == {
        "train": (12, [4, 4, 4]), "val": (5, [3, 2, 0])}
    kept = ("given splits kept (split-first SRC: 'Train' -> train, 'VALID' -> val); pass "
            "--split NAME=FRACTION,... to pool the files and re-split them by group")
    copies = (f"given splits share identical bytes: 1 file content(s) in more than one split, "
              f"{GIVEN_NOTE}: 'Train/daisy/{first}' (train) = 'VALID/daisy/copy_of_train.jpg' "
              "(val)")
    missing = "class 'tulips' has no samples in split 'val'"
    for w in (kept, copies, missing):
        assert w in summary.warnings and f"  warning: {w}" in summary.format_text()
    man = load_manifest(out)
    assert man["classes"] == ["daisy", "roses", "tulips"]
    assert copies in man["split"]["warnings"] and missing in man["split"]["warnings"]
    assert man["split"]["merged_groups"] == [] and man["source"]["num_duplicates"] == 1
    recs = records(out)
    assert sorted(r["path"] for r in recs["val"]) == sorted(
        [f"VALID/daisy/{f.name}" for f in photos("daisy", 4, 2)] + ["VALID/daisy/copy_of_train.jpg"]
        + [f"VALID/roses/{f.name}" for f in photos("roses", 4, 2)])
    assert all(r["path"].startswith("Train/") for r in recs["train"])
    # shardkit check still fails on the copy; nothing moved
    report = check_dataset(out, transforms=False, near_duplicates=False)
    assert not report["ok"] and [e["check"] for e in report["errors"]] == ["sha_overlap"]
    assert {(s["split"], s["path"]) for s in report["sha_overlap"][0]["samples"]} == {
        ("train", f"Train/daisy/{first}"), ("val", "VALID/daisy/copy_of_train.jpg")}
    # the given val split loads
    loader = shardkit.make_loader(out, "val", 8, train=False, num_workers=0, image_size=32)
    batches = list(loader)
    assert len(batches) == 1 and tuple(batches[0][0].shape) == (5, 3, 32, 32)
    assert sorted(batches[0][1].tolist()) == [0, 0, 0, 1, 1]


def test_manifest_records_given_splits(split_first, tmp_path):
    out = tmp_path / "out"
    pack(split_first, out, split="given", progress=False)
    first = photos("daisy", 0, 1)[0]
    split = load_manifest(out)["split"]
    assert split["mode"] == "given" and split["ratios"] is None
    assert split["given"] == {
        "from": "folders", "mapping": {"Train": "train", "VALID": "val"}, "kept": True,
        "shared_bytes": [{"sha256": sha(first), "paths": {
            "train": [f"Train/daisy/{first.name}"], "val": ["VALID/daisy/copy_of_train.jpg"]}}],
        "shared_groups": []}
    assert split["achieved"]["samples"] == {"train": 12 / 17, "val": 5 / 17}


def test_ratios_pool_and_resplit_by_group_saying_so(split_first, tmp_path):
    out = tmp_path / "out"
    summary = pack(split_first, out, split="train=0.5,val=0.5", progress=False)
    assert ("given splits pooled (split-first SRC: 'Train' -> train, 'VALID' -> val) and "
            "re-split by group to train=0.5,val=0.5; --split given keeps them"
            in summary.warnings)
    assert not any(w.startswith("given splits share") for w in summary.warnings)
    recs = records(out)
    assert sum(len(r) for r in recs.values()) == 17
    first = photos("daisy", 0, 1)[0].name
    where = {r["path"]: s for s, rs in recs.items() for r in rs}
    assert where[f"Train/daisy/{first}"] == where["VALID/daisy/copy_of_train.jpg"]
    assert {p.split("/")[0] for p in where} == {"Train", "VALID"}
    report = check_dataset(out, transforms=False, near_duplicates=False)
    assert report["sha_overlap"] == [] and report["group_overlap"] == []


def test_manifest_of_a_pooled_split_first_tree(split_first, tmp_path):
    pack(split_first, tmp_path / "out", split="train=0.5,val=0.5", progress=False)
    split = load_manifest(tmp_path / "out")["split"]
    assert split["mode"] == "ratios" and split["ratios"] == {"train": 0.5, "val": 0.5}
    assert split["given"] == {"from": "folders", "mapping": {"Train": "train", "VALID": "val"},
                              "kept": False, "shared_bytes": [], "shared_groups": []}


def test_split_given_needs_given_splits(tmp_path):
    root = build(tmp_path / "src", {"daisy": photos("daisy", 0, 1), "roses": photos("roses", 0, 1)})
    res = CliRunner().invoke(pack_command, [str(root), str(tmp_path / "out"), "--split", "given",
                                            "--no-progress"])
    assert res.exit_code != 0 and len(res.output.splitlines()) == 1
    assert res.output.startswith("Error: ") and res.output.endswith(
        f": --split given: {root} gives no splits (not a split-first tree "
        "SRC/<split>/<class>/..., no --split-column); pass split ratios\n")


def test_numeric_class_folders_sort_as_numbers(tmp_path):
    root = build(tmp_path / "src", {"1": photos("daisy", 0, 2), "2": photos("roses", 0, 2),
                                    "10": photos("tulips", 0, 2)})
    summary = pack(root, tmp_path / "out", split="train=1.0", progress=False)
    assert summary.classes == ["1", "2", "10"]
    note = ("class names are all numbers: sorted as numbers (1, 2, 10), not as text (1, 10, 2, "
            "torchvision ImageFolder's order); pass --labels to choose another order")
    assert note in summary.warnings and f"  warning: {note}" in summary.format_text()
    labels = {r["path"].split("/")[0]: r["label"] for r in records(tmp_path / "out")["train"]}
    assert labels == {"1": 0, "2": 1, "10": 2}


def test_nfc_nfd_twin_class_folders_merge_with_a_warning(tmp_path):
    root = build(tmp_path / "src", {CAFE_NFD: photos("daisy", 0, 2),
                                    CAFE_NFC: photos("daisy", 2, 2),
                                    "roses": photos("roses", 0, 2)})
    twin = ("class folders 'Cafe\\u0301' and 'Caf\\xe9' are one class 'Café' after Unicode NFC "
            "normalisation and stripping spaces: their files are merged")
    assert scan_folder(root).warnings == [twin]
    summary = pack(root, tmp_path / "out", split="train=1.0", progress=False)
    assert summary.classes == [CAFE_NFC, "roses"] and twin in summary.warnings
    assert summary.splits["train"]["class_counts"] == [4, 2]


def test_twins_across_given_splits_are_named_with_their_split(tmp_path):
    root = build(tmp_path / "src", {f"train/{CAFE_NFD}": photos("daisy", 0, 2),
                                    f"val/{CAFE_NFC}": photos("daisy", 2, 1)})
    result = scan_folder(root)
    assert result.warnings == [
        "class folders 'train/Cafe\\u0301' and 'val/Caf\\xe9' are one class 'Café' after "
        "Unicode NFC normalisation and stripping spaces: their files are merged"]
    assert [(i.split, i.label) for i in result.items] == [("train", CAFE_NFC)] * 2 + [
        ("val", CAFE_NFC)]


# ---------------------------------------------------------------- split columns
def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header] + rows)
    return path


def test_csv_source_split_column_keeps_given_splits(tmp_path):
    files = photos("daisy", 0, 3) + photos("roses", 0, 3)
    rows = [[str(f), f.parent.name, split] for f, split in
            zip(files, ["train", "train", "validation", "train", "validation", "train"])]
    src = _write_csv(tmp_path / "list.csv", ["path", "label", "split"], rows)
    out = tmp_path / "out"
    summary = pack(src, out, split_column="split", progress=False)
    assert {s: v["class_counts"] for s, v in summary.splits.items()} == {
        "train": [2, 2], "val": [1, 1]}
    assert (f"given splits kept (column 'split' of {src}: 'train' -> train, 'validation' -> "
            "val); pass --split NAME=FRACTION,... to pool the files and re-split them by group"
            in summary.warnings)
    val = {Path(r["path"]).name for r in records(out)["val"]}
    assert val == {files[2].name, files[4].name}


def test_metadata_split_column_with_shared_group_warns_and_check_fails(tmp_path):
    files = {"daisy": photos("daisy", 0, 3), "roses": photos("roses", 0, 3)}
    root = build(tmp_path / "src", files)
    rows = [["daisy/" + files["daisy"][0].name, "train", "u1"],
            ["daisy/" + files["daisy"][1].name, "train", "u2"],
            ["daisy/" + files["daisy"][2].name, "val", "u1"],
            ["roses/" + files["roses"][0].name, "train", "u3"],
            ["roses/" + files["roses"][1].name, "val", "u4"],
            ["roses/" + files["roses"][2].name, "train", "u5"]]
    meta = _write_csv(tmp_path / "meta.csv", ["path", "split", "user"], rows)
    out = tmp_path / "out"
    summary = pack(root, out, metadata=meta, group_column="user", split_column="split",
                   progress=False)
    assert {s: v["class_counts"] for s, v in summary.splits.items()} == {
        "train": [2, 2], "val": [1, 1]}
    shared = (f"given splits share groups: 1 group(s) with samples in more than one split, "
              f"{GIVEN_NOTE}: 'u1' (train 1, val 1)")
    assert shared in summary.warnings and shared in load_manifest(out)["split"]["warnings"]
    report = check_dataset(out, transforms=False, near_duplicates=False)
    assert [e["check"] for e in report["errors"]] == ["group_overlap"]
    assert report["group_overlap"] == [{"group": "u1", "splits": {"train": 1, "val": 1}}]


def test_metadata_split_column_without_row_for_an_image_is_an_error(tmp_path):
    files = photos("daisy", 0, 2)
    root = build(tmp_path / "src", {"daisy": files})
    meta = _write_csv(tmp_path / "meta.csv", ["path", "split"],
                      [["daisy/" + files[0].name, "train"]])
    with pytest.raises(SourceError) as err:
        pack(root, tmp_path / "out", metadata=meta, split_column="split", progress=False)
    assert str(err.value) == (f"metadata CSV {str(meta)!r} has no row or an empty 'split' for "
                              f"1 file(s). Files without a row: 1: 'daisy/{files[1].name}'")


# ---------------------------------------------------------------- options
def test_split_options_resolve_and_conflict(tmp_path):
    default = PackOptions()
    assert default.split == DEFAULT_SPLIT and default.split_auto
    assert default.replace(seed=3).split_auto and default.replace(seed=3).split == DEFAULT_SPLIT
    ratios = PackOptions(split="train=1.0")
    assert not ratios.split_auto and not ratios.replace(seed=3).split_auto
    assert PackOptions(split="Given").split == "given"
    assert PackOptions(split="given").replace(seed=1).split == "given"
    assert PackOptions(metadata=tmp_path / "m.csv", split_column="split").group_column is None
    with pytest.raises(ConfigError, match="cannot be combined with --split ratios"):
        PackOptions(split="train=1.0", split_column="split")
    with pytest.raises(ConfigError, match=r"layout='splits'; expected one of \('auto', 'class', "
                                          r"'split/class'\)"):
        PackOptions(layout="splits")
    with pytest.raises(ConfigError, match="needs --group-column .* and/or --split-column"):
        PackOptions(metadata=tmp_path / "m.csv")


def test_split_column_needs_a_csv(tmp_path, split_first):
    root = build(tmp_path / "flat", {"daisy": photos("daisy", 0, 1)})
    with pytest.raises(ConfigError, match="reads a column of a .csv SRC or of --metadata"):
        pack(root, tmp_path / "o1", split_column="split", progress=False)
    meta = _write_csv(tmp_path / "m.csv", ["path", "split"], [])
    with pytest.raises(ConfigError, match="is split-first .*'Train' -> train, 'VALID' -> val"):
        pack(split_first, tmp_path / "o2", metadata=meta, split_column="split", progress=False)
