"""Pack-level stable splits and near-duplicates (docs/FIELD-CASES.md case 24), on the real photos:
a source that grows twice keeps every old group where it was (hash rule, and --split-from), a
re-encoded copy of a photo joins its original's split, degenerate images are listed or
quarantined."""
from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from conftest import SAMPLE
from shardkit.errors import ConfigError, SplitError
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.packer.run import pack
from shardkit.packer.cli import pack_command

R3 = {"train": 0.8, "val": 0.1, "test": 0.1}


def _sample_rows() -> list[dict]:
    with open(SAMPLE / "metadata.csv", newline="") as f:
        return list(csv.DictReader(f))


def _stage(root: Path, rows: list[dict]) -> Path:
    """A copy of the sample's photos in ``rows`` (class folders) with their metadata CSV."""
    for r in rows:
        dest = root / r["path"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SAMPLE / r["path"], dest)
    with open(root.parent / f"{root.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["path", "group"])
        w.writeheader()
        w.writerows({"path": r["path"], "group": r["group_flickr_user"]} for r in rows)
    return root


def _growing_source(tmp_path: Path) -> list[Path]:
    """Three stages of one source: 90, 104 and all 120 photographer groups (about 15% more
    groups each time), each stage a superset of the one before."""
    rows = _sample_rows()
    groups = sorted({r["group_flickr_user"] for r in rows})
    order = np.random.default_rng(1).permutation(len(groups))
    stages = []
    for k, n in enumerate((90, 104, 120)):
        keep = {groups[j] for j in order[:n]}
        stages.append(_stage(tmp_path / f"src{k}", [r for r in rows
                                                  if r["group_flickr_user"] in keep]))
    return stages


def _placements(out: Path) -> dict[str, str]:
    return {r["group"]: split for split in load_manifest(out)["splits"]
            for r in read_split_records(out, split)}


def _moved(before: dict[str, str], after: dict[str, str]) -> int:
    return sum(after[g] != s for g, s in before.items())


def _pack_stage(src: Path, out: Path, **kw):
    kw.setdefault("split", R3)
    return pack(src, out, metadata=src.parent / f"{src.name}.csv", group_column="group",
                progress=False, **kw)


@pytest.mark.parametrize("rule", ["hash", "split_from"])
def test_growing_source_twice_moves_no_old_group(tmp_path, rule):
    stages = _growing_source(tmp_path)
    outs = [tmp_path / f"out{k}" for k in range(3)]
    for k, (src, out) in enumerate(zip(stages, outs)):
        kw = ({} if rule == "hash" else
              {"split_method": "balanced", "split_from": outs[k - 1] if k else None})
        summary = _pack_stage(src, out, **kw)
        if rule == "split_from" and k:
            kept = load_manifest(out)["split"]["kept_from"]
            assert kept["root"] == str(outs[k - 1]) and kept["moved_groups"] == []
            assert kept["kept_groups"] == (90, 104)[k - 1]
            assert kept["new_groups"] == (14, 16)[k - 1] and kept["gone_groups"] == 0
            assert f"kept from {outs[k - 1]}: {kept['kept_groups']} groups" in \
                summary.format_text()
    placed = [_placements(out) for out in outs]
    assert [len(p) for p in placed] == [90, 104, 120]
    assert _moved(placed[0], placed[1]) == 0 and _moved(placed[1], placed[2]) == 0


def test_balanced_rule_without_split_from_moves_groups(tmp_path):
    """The field problem the two rules above solve: the same growth re-split by the balanced
    rule alone moves old groups (val/test photos end up in train)."""
    stages = _growing_source(tmp_path)
    placed = []
    for k, src in enumerate(stages):
        _pack_stage(src, tmp_path / f"out{k}", split_method="balanced")
        placed.append(_placements(tmp_path / f"out{k}"))
    assert _moved(placed[0], placed[1]) + _moved(placed[1], placed[2]) > 10


def test_split_from_in_place_overwrite_and_its_errors(tmp_path):
    stages = _growing_source(tmp_path)
    out = tmp_path / "out"
    _pack_stage(stages[0], out, split={"train": 0.7, "val": 0.3})
    before = _placements(out)
    # re-pack the grown source into the same OUT, keeping its placements and its ratios
    runner = CliRunner()
    res = runner.invoke(pack_command, [str(stages[1]), str(out), "--overwrite", "--split-from",
                                       str(out), "--metadata", str(tmp_path / "src1.csv"),
                                       "--group-column", "group", "--no-progress"])
    assert res.exit_code == 0, res.output
    man = load_manifest(out)
    assert man["split"]["ratios"] == {"train": 0.7, "val": 0.3}
    assert _moved(before, _placements(out)) == 0
    # a new split may be added (new groups can land there); an old split must still exist
    with pytest.raises(SplitError, match=r"has splits \['train', 'val'\] but the requested "
                                         r"splits are \['train', 'test'\]"):
        _pack_stage(stages[1], tmp_path / "o2", split_from=out,
                    split={"train": 0.8, "test": 0.2})
    with pytest.raises(ConfigError, match="no finished shardkit dataset there"):
        _pack_stage(stages[1], tmp_path / "o3", split_from=stages[0])


def _jpeg(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _near_source(root: Path, split_first: bool = False) -> Path:
    """10 daisies and 10 roses; a re-encoded, resized copy of one daisy under another name (its
    own group: no group rule); split-first puts original and copy in different given splits."""
    daisies = sorted((SAMPLE / "daisy").glob("*.jpg"))[:10]
    roses = sorted((SAMPLE / "roses").glob("*.jpg"))[:10]
    for cls, files in (("daisy", daisies), ("roses", roses)):
        for k, f in enumerate(files):
            split = ("train" if k < 7 else "val") + "/" if split_first else ""
            (root / f"{split}{cls}").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, root / f"{split}{cls}" / f.name)
    with Image.open(daisies[0]) as im:
        copy = im.convert("RGB").resize((im.width * 3 // 4, im.height * 3 // 4), Image.BICUBIC)
    where = root / ("val/daisy" if split_first else "daisy")
    (where / "copy_of_first.jpg").write_bytes(_jpeg(copy, quality=80))
    return root


def test_reencoded_copy_joins_its_original_in_one_split(tmp_path):
    src = _near_source(tmp_path / "src")
    first = sorted((SAMPLE / "daisy").glob("*.jpg"))[0].name
    for seed in range(4):  # whatever the seed, the pair shares a split
        out = tmp_path / f"out{seed}"
        summary = pack(src, out, seed=seed, progress=False)
        near = load_manifest(out)["split"]["near_duplicates"]
        assert near["mode"] == "merge" and near["threshold"] == 4
        assert [c["paths"] for c in near["clusters"]] == [
            [f"daisy/{first}", "daisy/copy_of_first.jpg"]]
        assert near["num_across_splits"] == 0 and len(near["clusters"][0]["splits"]) == 1
        assert "near-duplicates (pHash distance <= 4, merge): 1 cluster of 2 images" in \
            summary.format_text()
        rows = {r["path"]: r for s in load_manifest(out)["splits"]
                for r in read_split_records(out, s)}
        assert int(rows["daisy/copy_of_first.jpg"]["phash"], 16) >= 0
    off = pack(src, tmp_path / "off", near_duplicates="off", progress=False)
    assert load_manifest(tmp_path / "off")["split"]["near_duplicates"]["clusters"] == []
    assert "not searched" in off.format_text()


def test_given_splits_report_a_near_duplicate_across_them(tmp_path):
    src = _near_source(tmp_path / "src", split_first=True)
    summary = pack(src, tmp_path / "out", progress=False)
    near = load_manifest(tmp_path / "out")["split"]["near_duplicates"]
    assert near["mode"] == "report" and near["num_across_splits"] == 1
    assert near["clusters"][0]["splits"] == {"train": 1, "val": 1}
    warning = [w for w in summary.warnings if "near-duplicate cluster" in w]
    assert len(warning) == 1 and "given splits keep them where they are" in warning[0]


def _degenerate_source(root: Path) -> Path:
    for k, f in enumerate(sorted((SAMPLE / "tulips").glob("*.jpg"))[:6]):
        (root / "tulips").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, root / "tulips" / f.name)
    flat = Image.new("RGB", (300, 200), (200, 200, 200))
    (root / "tulips" / "placeholder.jpg").write_bytes(_jpeg(flat))
    with Image.open(sorted((SAMPLE / "tulips").glob("*.jpg"))[0]) as im:
        sliver = im.convert("RGB").resize((400, 20))
    (root / "tulips" / "sliver.png").write_bytes(_png(sliver))
    return root


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_degenerate_images_listed_and_quarantined_with_strict(tmp_path):
    src = _degenerate_source(tmp_path / "src")
    summary = pack(src, tmp_path / "out", progress=False, split={"train": 1.0})
    man = load_manifest(tmp_path / "out")
    listed = {d["path"]: d["reason"] for d in man["source"]["degenerate"]}
    assert sorted(listed) == ["tulips/placeholder.jpg", "tulips/sliver.png"]
    assert man["source"]["num_degenerate"] == 2 and man["source"]["num_packed"] == 8
    assert "small" in listed["tulips/sliver.png"] and "20" in listed["tulips/sliver.png"]
    assert "degenerate images (packed; --strict quarantines them): 2" in summary.format_text()
    strict = pack(src, tmp_path / "strict", progress=False, split={"train": 1.0}, strict=True)
    assert strict.num_packed == 6 and strict.quarantine_reasons == {"degenerate image": 2}


def test_check_uses_the_recorded_hashes_and_finds_what_decoding_finds(tmp_path):
    """`shardkit check` on a pack that recorded pHashes decodes nothing for the search, and
    reports the same cross-split pair and degenerate images as a run that decodes every
    sample (--recompute-hashes)."""
    from shardkit.doctor import check_dataset

    src = _near_source(tmp_path / "src", split_first=True)
    flat = Image.new("RGB", (300, 200), (200, 200, 200))
    (src / "train" / "roses" / "placeholder.jpg").write_bytes(_jpeg(flat))
    out = tmp_path / "out"
    pack(src, out, progress=False)
    stored = check_dataset(out, transforms=False)
    decoded = check_dataset(out, transforms=False, recompute_hashes=True)
    assert stored["hashes"] == {"train": "stored", "val": "stored"}
    assert decoded["hashes"] == {"train": "decoded", "val": "decoded"}
    first = sorted((SAMPLE / "daisy").glob("*.jpg"))[0].name
    pairs = [sorted([p["a"]["path"], p["b"]["path"]]) for p in stored["near_duplicates"]]
    assert pairs == [[f"train/daisy/{first}", "val/daisy/copy_of_first.jpg"]]
    assert [(p["a"]["key"], p["b"]["key"]) for p in stored["near_duplicates"]] == \
        [(p["a"]["key"], p["b"]["key"]) for p in decoded["near_duplicates"]]
    assert [d["path"] for d in stored["degenerate"]] == ["train/roses/placeholder.jpg"]
    assert stored["degenerate"] == decoded["degenerate"]
    # a pack without recorded hashes falls back to decoding
    pack(src, tmp_path / "off", near_duplicates="off", progress=False)
    assert check_dataset(tmp_path / "off", transforms=False)["hashes"] == {
        "train": "decoded", "val": "decoded"}


def test_split_from_refuses_another_group_rule_and_a_split_first_source(tmp_path):
    stages = _growing_source(tmp_path)
    prev = tmp_path / "prev"
    _pack_stage(stages[0], prev)
    with pytest.raises(ConfigError, match="grouped files by .*'column': 'group'.* this pack by "
                                          ".*'regex'.*use the same group rule"):
        pack(stages[1], tmp_path / "o1", group_by=r"^[^/]+/(?P<g>\d)", split_from=prev,
             progress=False)
    tree = tmp_path / "given"  # the first stage laid out split-first, as prev split it
    for split in load_manifest(prev)["splits"]:
        for r in read_split_records(prev, split):
            dest = tree / split / r["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SAMPLE / r["path"], dest)
    with pytest.raises(ConfigError, match="gives its own splits .* kept as given"):
        pack(tree, tmp_path / "o2", split_from=prev, progress=False)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_a_near_duplicate_bridging_old_groups_never_moves_a_held_out_group_into_train(tmp_path):
    """A resized copy of a validation photo, filed under a training photographer's group: the
    two groups must share a split, and it is the held-out one (the training group moves)."""
    stages = _growing_source(tmp_path)
    prev = tmp_path / "prev"
    _pack_stage(stages[0], prev)
    placed = _placements(prev)
    rows = {r["path"]: (split, r["group"]) for split in load_manifest(prev)["splits"]
            for r in read_split_records(prev, split)}
    val_path, (_, val_group) = next((p, v) for p, v in sorted(rows.items()) if v[0] == "val")
    train_group = next(g for g, s in sorted(placed.items()) if s == "train")
    src = stages[1]
    with Image.open(src / val_path) as im:
        copy = im.convert("RGB").resize((im.width * 3 // 4, im.height * 3 // 4), Image.BICUBIC)
    (src / "daisy" / "copy_of_val.jpg").write_bytes(_jpeg(copy, quality=85))
    with open(tmp_path / "src1.csv", "a", newline="") as f:
        f.write(f"daisy/copy_of_val.jpg,{train_group}\n")
    for kw in ({"split_from": prev, "split_method": "balanced"}, {}):
        out = tmp_path / f"out{len(kw)}"
        _pack_stage(src, out, **kw)
        after = _placements(out)
        assert after[val_group] == "val" and after[train_group] == "val"
        assert not [g for g, s in placed.items() if s != "train" and after[g] == "train"]
        if kw:
            assert load_manifest(out)["split"]["kept_from"]["moved_groups"] == [
                {"group": train_group, "from": "train", "to": "val"}]
