"""Tests of the data doctor (``shardkit inspect``, ``check``, ``stats``) on real packed photos.

Field case 24 (split leakage): a clean pack passes; a group or identical bytes planted in two
splits fail with exit code 1 and name the sample; a resized copy of a flower photo in another
split is found as a pHash near-duplicate.
"""
from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, ImageOps

from shardkit.doctor import leaks
from shardkit.doctor import (check_command, check_dataset, compute_stats, inspect_command,
                             inspect_dataset, load_transform_config, stats_command)
from shardkit.doctor.reading import load_manifest_dict
from shardkit.doctor.stats import ChannelMoments
from shardkit.errors import ConfigError


# ---------------------------------------------------------------------------------------- helpers

def _copy(packed: Path, tmp_path: Path) -> Path:
    """A private copy of a (session-cached) packed dataset, safe to modify."""
    dst = tmp_path / "ds"
    shutil.copytree(packed, dst)
    return dst


def _rows(root: Path, split: str) -> list[dict]:
    text = (root / "splits" / f"{split}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _write_rows(root: Path, split: str, rows: list[dict]) -> None:
    (root / "splits" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _pil_rgb(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


def _numpy_stats(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """Reference: per-channel mean/std (0-1) over all pixels, float64, two passes."""
    pixels = np.concatenate([_pil_rgb(p).reshape(-1, 3) for p in paths]).astype(np.float64) / 255
    return pixels.mean(axis=0), pixels.std(axis=0)


@pytest.fixture
def clean(packed_sample, tmp_path) -> Path:
    return _copy(packed_sample("wds"), tmp_path)


# ------------------------------------------------------------------------------------------ stats

def test_channel_moments_match_numpy_and_are_order_free():
    rng = np.random.default_rng(3)
    imgs = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            for h, w in [(7, 5), (64, 33), (1, 1)]]
    imgs.append(np.full((50, 40, 3), 255, np.uint8))          # extreme values
    m1, m2 = ChannelMoments(), ChannelMoments()
    for im in imgs:
        m1.update(im)
    for im in reversed(imgs):
        m2.update(im)
    flat = np.concatenate([im.reshape(-1, 3) for im in imgs]).astype(np.float64) / 255
    np.testing.assert_allclose(m1.mean(), flat.mean(0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(m1.std(), flat.std(0), rtol=0, atol=1e-12)
    assert m1.mean() == m2.mean() and m1.std() == m2.std()      # exact integer accumulation
    assert m1.num_images == 4 and m1.num_pixels == 35 + 64 * 33 + 1 + 2000
    const = ChannelMoments()
    const.update(np.full((3, 3, 3), 17, np.uint8))
    assert const.std() == (0.0, 0.0, 0.0) and const.mean()[0] == 17 / 255


def test_channel_moments_reject_bad_input():
    m = ChannelMoments()
    with pytest.raises(ConfigError, match="no pixels"):
        m.mean()
    with pytest.raises(ConfigError, match=r"float32 \(4, 4, 3\)"):
        m.update(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ConfigError, match=r"uint8 \(4, 4\)"):
        m.update(np.zeros((4, 4), np.uint8))


def test_stats_equal_numpy_over_pil_decoded_sources(clean, sample_dir):
    before = json.loads((clean / "manifest.json").read_text())
    result = compute_stats(clean, "train", progress=False)
    rows = _rows(clean, "train")
    mean, std = _numpy_stats([sample_dir / r["path"] for r in rows])
    np.testing.assert_allclose(result["mean"], mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(result["std"], std, rtol=0, atol=1e-6)
    assert result["num_samples"] == len(rows) == before["splits"]["train"]["num_samples"]
    # sanity of the real values: flower photos, green/blue below red on average
    assert 0.3 < result["mean"][0] < 0.6 and result["mean"][2] < result["mean"][0]
    after = json.loads((clean / "manifest.json").read_text())
    assert after["stats"] == {"train": result}
    assert {k: v for k, v in after.items() if k != "stats"} == \
        {k: v for k, v in before.items() if k != "stats"}
    assert not list(clean.glob(".manifest.json*"))              # atomic rewrite left no temp file


def test_stats_max_samples_uses_first_rows_and_keeps_other_splits(clean, sample_dir):
    val = compute_stats(clean, "val", progress=False)
    part = compute_stats(clean, "train", max_samples=10, progress=False)
    rows = _rows(clean, "train")[:10]
    mean, std = _numpy_stats([sample_dir / r["path"] for r in rows])
    np.testing.assert_allclose(part["mean"], mean, atol=1e-6)
    np.testing.assert_allclose(part["std"], std, atol=1e-6)
    assert part["num_samples"] == 10
    stats = json.loads((clean / "manifest.json").read_text())["stats"]
    assert stats == {"val": val, "train": part}
    with pytest.raises(ConfigError, match="max_samples"):
        compute_stats(clean, "train", max_samples=0)
    with pytest.raises(ConfigError, match="'nope'"):
        compute_stats(clean, "nope")


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_stats_and_leak_check_read_every_format(packed_sample, tmp_path, sample_dir, fmt):
    root = _copy(packed_sample(fmt), tmp_path)
    part = compute_stats(root, "train", max_samples=12, progress=False)
    mean, std = _numpy_stats([sample_dir / r["path"] for r in _rows(root, "train")[:12]])
    np.testing.assert_allclose(part["mean"], mean, atol=1e-6)
    np.testing.assert_allclose(part["std"], std, atol=1e-6)
    report = check_dataset(root, transforms=False)
    assert report["ok"] and report["near_duplicates"] == [], report["errors"]


def test_stats_cli_prints_and_saves(clean):
    res = CliRunner().invoke(stats_command, [str(clean), "--split", "train", "--max-samples", "5",
                                             "--no-progress"])
    assert res.exit_code == 0, res.output
    saved = json.loads((clean / "manifest.json").read_text())["stats"]["train"]
    assert saved["num_samples"] == 5
    assert f"{saved['mean'][0]:.6f}" in res.output
    no_save = CliRunner().invoke(stats_command, [str(clean), "--split", "val", "--no-save",
                                                 "--no-progress"])
    assert no_save.exit_code == 0, no_save.output
    assert "val" not in json.loads((clean / "manifest.json").read_text())["stats"]
    bad = CliRunner().invoke(stats_command, [str(clean), "--split", "nope"])
    assert bad.exit_code == 2 and "'nope'" in bad.output


# ------------------------------------------------------------------------------------------ check

def test_check_passes_on_clean_pack(clean, tmp_path):
    report = check_dataset(clean)
    assert report["ok"], report["errors"]
    assert report["group_overlap"] == [] and report["sha_overlap"] == []
    assert report["near_duplicates"] == []
    assert report["transform"]["problems"] == []
    res = CliRunner().invoke(check_command, [str(clean), "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert "OK: no leak found" in res.output
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["ok"] is True
    assert saved["thresholds"] == {"phash_hamming": 4, "imbalance_ratio": 10.0}


@pytest.mark.parametrize("plant", ["group+sha", "group", "sha"])
def test_check_fails_on_planted_leak(clean, tmp_path, plant):
    train, val = _rows(clean, "train"), _rows(clean, "val")
    donor = train[3]
    if "group" in plant:
        val[0]["group"] = donor["group"]
    if "sha" in plant:
        val[0]["sha256"] = donor["sha256"]
    _write_rows(clean, "val", val)
    report = check_dataset(clean, near_duplicates=False, transforms=False)
    assert not report["ok"]
    if "group" in plant:
        assert report["group_overlap"] == [{"group": donor["group"], "splits": {
            "train": sum(r["group"] == donor["group"] for r in train), "val": 1}}]
    else:
        assert report["group_overlap"] == []
    if "sha" in plant:
        (shared,) = report["sha_overlap"]
        assert shared["sha256"] == donor["sha256"]
        assert {(s["split"], s["key"], s["path"]) for s in shared["samples"]} == {
            ("train", donor["key"], donor["path"]), ("val", val[0]["key"], val[0]["path"])}
    else:
        assert report["sha_overlap"] == []
    res = CliRunner().invoke(check_command, [str(clean), "--no-near-duplicates", "--no-transforms",
                                             "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 1, res.output
    assert "FAILED" in res.output
    assert (donor["group"] if "group" in plant else val[0]["key"]) in res.output
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is False


@pytest.mark.parametrize("flags", [["--no-near-duplicates"], []])
def test_check_stops_on_a_deleted_train_shard_whatever_it_reads(clean, flags):
    """With --no-near-duplicates (or recorded pHashes) check reads no shard; a deleted train
    shard gave "NO LEAK", exit 0. Exit 2, not 1: no verdict on data it cannot see (1 would
    read as a leak; the damage is verify's verdict)."""
    shards = json.loads((clean / "manifest.json").read_text())["splits"]["train"]["shards"]
    gone = shards[1]["path"]
    (clean / gone).unlink()
    res = CliRunner().invoke(check_command, [str(clean), "--no-transforms", *flags])
    assert res.exit_code == 2, res.output
    (line,) = res.output.splitlines()
    assert line == (f"Error: ShardCorruptError: {clean}: 1 of {len(shards)} shard(s) of split "
                    f"'train' do not match the manifest: {gone}: missing (re-copy the dataset or "
                    "re-run shardkit pack; shardkit verify checks hashes)")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root reads a file of mode 000")
def test_check_stops_on_an_unreadable_shard(clean):
    shard = json.loads((clean / "manifest.json").read_text())["splits"]["val"]["shards"][0]
    (clean / shard["path"]).chmod(0)
    try:
        res = CliRunner().invoke(check_command, [str(clean), "--no-near-duplicates",
                                                 "--no-transforms"])
    finally:
        (clean / shard["path"]).chmod(0o644)
    assert res.exit_code == 2, res.output
    (line,) = res.output.splitlines()
    assert line.startswith("Error: ShardCorruptError: ") and \
        f"{shard['path']}: cannot be opened (PermissionError" in line


def test_check_stops_on_a_shard_missing_in_object_storage(s3_server, packed_sample):
    """In object storage too (one listing of shards/): a deleted or cut shard object is exit 2
    naming it; the untouched dataset passes."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    url = s3_server.bucket() + "/check"
    s3_server.upload_tree(packed_sample("wds"), url)
    args = [url, "--no-near-duplicates", "--no-transforms", "--no-progress"]
    ok = CliRunner().invoke(check_command, args)
    assert ok.exit_code == 0 and "NO EXACT LEAK" in ok.output, ok.output
    manifest = load_manifest_dict(url)
    gone = manifest["splits"]["train"]["shards"][2]["path"]
    cut = manifest["splits"]["test"]["shards"][0]
    fs = s3_server.fs()
    fs.rm(f"{url}/{gone}")
    fs.pipe(f"{url}/{cut['path']}", fs.cat(f"{url}/{cut['path']}")[:1000])
    s3fs.S3FileSystem.clear_instance_cache()  # no listing cached before the change
    res = CliRunner().invoke(check_command, args)
    assert res.exit_code == 2, res.output
    (line,) = res.output.splitlines()
    assert line.startswith(f"Error: ShardCorruptError: {url}: 1 of ") and \
        f"{gone}: missing (no object at {url}/{gone})" in line  # the first damaged split
    fs.pipe(f"{url}/{gone}", (packed_sample("wds") / gone).read_bytes())
    s3fs.S3FileSystem.clear_instance_cache()
    res = CliRunner().invoke(check_command, args)
    assert res.exit_code == 2 and (f"{cut['path']}: 1000 bytes, the manifest says "
                                   f"{cut['bytes']}") in res.output, res.output


def test_check_reports_missing_class_and_imbalance(clean):
    manifest = json.loads((clean / "manifest.json").read_text())
    classes = manifest["classes"]
    val = _rows(clean, "val")
    for r in val:  # relabel class 0 as class 1 in val: class 0 disappears from val
        if r["label"] == 0:
            r["label"] = 1
    _write_rows(clean, "val", val)
    report = check_dataset(clean, near_duplicates=False, transforms=False, imbalance_threshold=1.0)
    assert report["missing_classes"] == {"val": [classes[0]]}
    assert report["ok"]                                          # warnings only
    counts = np.array(manifest["splits"]["train"]["class_counts"])
    imb = report["imbalance"]["train"]
    assert imb["ratio"] == pytest.approx(counts.max() / counts.min())
    assert imb["max_count"] == counts.max() and imb["min_count"] == counts.min()
    assert report["imbalance"]["val"]["ratio"] == float("inf")
    flagged = {w["message"].split("'")[1] for w in report["warnings"] if w["check"] == "imbalance"}
    assert "train" in flagged and "val" not in flagged            # val is reported as missing
    strict = check_dataset(clean, near_duplicates=False, transforms=False, strict=True)
    assert not strict["ok"] and [e["check"] for e in strict["errors"]] == ["missing_classes"]


def test_check_rejects_bad_thresholds(clean):
    with pytest.raises(ConfigError, match="0-64"):
        check_dataset(clean, phash_threshold=65, transforms=False)
    with pytest.raises(ConfigError, match=">= 1"):
        check_dataset(clean, imbalance_threshold=0.5, near_duplicates=False, transforms=False)


# ------------------------------------------------------------------------------- near-duplicates

def _resized_jpeg(src: Path, scale: float) -> bytes:
    with Image.open(src) as im:
        im = im.convert("RGB")
        small = im.resize((round(im.width * scale), round(im.height * scale)), Image.LANCZOS)
    buf = io.BytesIO()
    small.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def test_phash_distance_resized_copy_vs_other_photo(sample_dir):
    daisy = sorted((sample_dir / "daisy").glob("*.jpg"))
    a = leaks.phash64(_pil_rgb(daisy[0]))
    copy = leaks.phash64(np.asarray(Image.open(io.BytesIO(_resized_jpeg(daisy[0], 0.6)))))
    other = leaks.phash64(_pil_rgb(daisy[1]))
    assert bin(a ^ copy).count("1") <= 2
    assert bin(a ^ other).count("1") > leaks.PHASH_THRESHOLD


def test_near_duplicate_pairs_on_known_hashes():
    rows = {"train": [{"key": "t0", "sha256": "x", "group": "g0", "path": "a"},
                      {"key": "t1", "sha256": "y", "group": "g1", "path": "b"}],
            "val": [{"key": "v0", "sha256": "z", "group": "g2", "path": "c"},
                    {"key": "v1", "sha256": "x", "group": "g3", "path": "d"}]}
    hashes = {"train": np.array([0, 0xFFFF], np.uint64), "val": np.array([0b1111, 0], np.uint64)}
    pairs = leaks.near_duplicate_pairs(hashes, rows, threshold=4)
    # t0~v0 at distance 4; t0~v1 is byte-identical (sha_overlap's job); t1 is 12+ bits away
    assert [(p["a"]["key"], p["b"]["key"], p["distance"]) for p in pairs] == [("t0", "v0", 4)]
    assert leaks.near_duplicate_pairs(hashes, rows, threshold=3) == []
    with pytest.raises(ConfigError, match="0-64"):
        leaks.near_duplicate_pairs(hashes, rows, threshold=-1)


# Two real near-duplicate pairs in the flowers set: one photographer's re-edits of one shot
# (found by `shardkit check` on a per-file split of the full set; see test below).
RECOLOURED = [("dandelion/17161833794_e1d92259d2_m.jpg", "dandelion/18304194360_2a4a0be631_m.jpg"),
              ("tulips/5700394524_dc6f8fa9cd_n.jpg", "tulips/5635347336_bc1400e939_n.jpg")]


def test_phash_matches_real_recoloured_photos(flowers_dir):
    h = {p: leaks.phash64(_pil_rgb(flowers_dir / p)) for pair in RECOLOURED for p in pair}
    (a, b), (c, d) = RECOLOURED
    assert bin(h[a] ^ h[b]).count("1") <= leaks.PHASH_THRESHOLD
    assert bin(h[c] ^ h[d]).count("1") <= leaks.PHASH_THRESHOLD
    for x, y in [(a, c), (a, d), (b, c), (b, d)]:
        assert bin(h[x] ^ h[y]).count("1") > 16


@pytest.mark.slow
def test_full_flowers_group_split_has_no_near_duplicates_but_file_split_does(
        packed_flowers, flowers_dir, tmp_path):
    import csv

    from shardkit.packer.run import pack

    grouped = check_dataset(packed_flowers("wds"), transforms=False)
    assert grouped["ok"] and grouped["near_duplicates"] == [] and grouped["group_overlap"] == []
    out = tmp_path / "per-file"  # without pack's own near-duplicate merging, as before it existed
    pack(flowers_dir, out, format="wds", split={"train": 0.8, "val": 0.1, "test": 0.1}, seed=0,
         group_by=r"([^/]+)$", shard_samples=256, workers=2, progress=False,
         near_duplicates="off")
    by_file = check_dataset(out, transforms=False)
    photographer = {r["path"]: r["group_flickr_user"]
                    for r in csv.DictReader(open(flowers_dir / "metadata.csv", encoding="utf-8"))}
    pairs = {frozenset((p["a"]["path"], p["b"]["path"])) for p in by_file["near_duplicates"]}
    split_of = {r["path"]: s for s in ("train", "val", "test") for r in _rows(out, s)}
    apart = {frozenset(pair) for pair in RECOLOURED if split_of[pair[0]] != split_of[pair[1]]}
    assert apart and apart <= pairs                              # a file-level split leaks them
    assert all(len({photographer[x] for x in pair}) == 1 for pair in pairs)


def test_check_finds_resized_copy_in_other_split(sample_dir, tmp_path):
    from shardkit.packer.run import pack

    src = tmp_path / "src"
    originals = {}
    for cls in ("daisy", "roses", "tulips"):
        (src / cls).mkdir(parents=True)
        for i, p in enumerate(sorted((sample_dir / cls).glob("*.jpg"))[:4]):
            shutil.copyfile(p, src / cls / f"g{cls}{i}_{p.name}")
            originals[f"{cls}/g{cls}{i}_{p.name}"] = p
    orig_rel = "daisy/gdaisy0_" + sorted((sample_dir / "daisy").glob("*.jpg"))[0].name
    (src / "daisy" / "gcopy_small.jpg").write_bytes(_resized_jpeg(src / orig_rel, 0.6))
    copy_rel = "daisy/gcopy_small.jpg"
    for seed in range(20):  # each file is its own group; find a seed that splits the pair
        out = tmp_path / f"out{seed}"
        pack(src, out, format="wds", split={"train": 0.5, "val": 0.5}, seed=seed,
             group_by=r"^[^/]+/(g[a-z]+\d*)", shard_samples=8, progress=False,
             near_duplicates="off")  # pack's merging would keep the pair in one split
        where = {r["path"]: s for s in ("train", "val") for r in _rows(out, s)}
        if where[orig_rel] != where[copy_rel]:
            break
    else:
        pytest.fail("no seed in 0..19 put the photo and its copy in different splits")
    report = check_dataset(out, transforms=False)
    assert report["group_overlap"] == [] and report["sha_overlap"] == []
    assert len(report["near_duplicates"]) == 1                  # and no unrelated photo pair
    (pair,) = report["near_duplicates"]
    assert {pair["a"]["path"], pair["b"]["path"]} == {orig_rel, copy_rel}
    assert {pair["a"]["split"], pair["b"]["split"]} == {"train", "val"}
    assert pair["distance"] <= 2
    assert report["ok"]                                          # a warning by default
    assert [w["check"] for w in report["warnings"]].count("near_duplicates") == 1
    res = CliRunner().invoke(check_command, [str(out), "--strict", "--no-transforms"])
    assert res.exit_code == 1 and copy_rel in res.output and orig_rel in res.output
    lax = CliRunner().invoke(check_command, [str(out), "--no-transforms"])
    assert lax.exit_code == 0, lax.output                      # warnings keep exit 0...
    headline = lax.output.strip().splitlines()[-1]             # ...but never a plain OK
    assert headline.startswith("NO EXACT LEAK (groups, identical bytes); 1 near-duplicate "
                               "pair(s) across splits: review them (--strict fails on them)")
    assert "OK" not in headline


def test_near_duplicate_pairs_equal_all_cross_split_pairs_and_honour_skip():
    """The multi-index search over all splits at once gives exactly the cross-split pairs of an
    all-pairs loop (clustered random hashes), and skipped positions take part in none."""
    rng = np.random.default_rng(11)
    centres = rng.integers(0, 2**63, size=40, dtype=np.uint64)
    flips = [sum(1 << int(b) for b in rng.choice(64, rng.integers(0, 5), replace=False))
             for _ in range(300)]
    pool = centres[rng.integers(0, 40, 300)] ^ np.array(flips, np.uint64)
    sizes = {"train": 200, "val": 60, "test": 40}
    hashes, rows, at = {}, {}, 0
    for name, n in sizes.items():
        hashes[name] = pool[at:at + n]
        rows[name] = [{"key": f"{name}{i}", "sha256": f"{name}{i}", "group": f"{name}{i}",
                       "path": f"{name}/{i}"} for i in range(n)]
        at += n
    rows["val"][5]["sha256"] = rows["train"][0]["sha256"] = "same bytes"

    def reference(skip):
        out = []
        names = list(sizes)
        for x, sa in enumerate(names):
            for sb in names[x + 1:]:
                for i, ha in enumerate(hashes[sa]):
                    for j, hb in enumerate(hashes[sb]):
                        d = bin(int(ha) ^ int(hb)).count("1")
                        if d <= 4 and i not in skip.get(sa, ()) and j not in skip.get(sb, ()) \
                                and rows[sa][i]["sha256"] != rows[sb][j]["sha256"]:
                            out.append((d, f"{sa}{i}", f"{sb}{j}"))
        return sorted(out)

    got = [(p["distance"], p["a"]["key"], p["b"]["key"])
           for p in leaks.near_duplicate_pairs(hashes, rows)]
    assert got == reference({}) and len(got) > 300
    skip = {"train": list(range(0, 200, 3)), "test": {1, 2, 3}}
    got = [(p["distance"], p["a"]["key"], p["b"]["key"])
           for p in leaks.near_duplicate_pairs(hashes, rows, skip=skip)]
    assert got == reference(skip) and not any(k in ("train3", "test1") for _, *ks in got
                                              for k in ks)


def _blank_jpeg(w: int, h: int, value: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (value,) * 3).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def test_check_lists_degenerate_images_and_leaves_them_out_of_near_duplicates(sample_dir,
                                                                           tmp_path):
    """Two blank frames of different sizes (different bytes, pHashes 0 bits apart) in different
    splits, a placeholder and a 20x400 strip: listed as degenerate, never as near-duplicates."""
    from shardkit.packer.run import pack

    from helpers import placeholder

    src = tmp_path / "src"
    for cls in ("daisy", "roses"):
        (src / cls).mkdir(parents=True)
        for i, p in enumerate(sorted((sample_dir / cls).glob("*.jpg"))[:4]):
            shutil.copyfile(p, src / cls / f"g{cls}{i}.jpg")
    (src / "daisy" / "gblank1.jpg").write_bytes(_blank_jpeg(320, 240, 255))
    (src / "roses" / "gblank2.jpg").write_bytes(_blank_jpeg(300, 300, 250))
    (src / "roses" / "gmissing.jpg").write_bytes(placeholder())
    strip = _pil_rgb(sorted((sample_dir / "daisy").glob("*.jpg"))[0])[:, :20]
    Image.fromarray(strip).save(src / "daisy" / "gstrip.png")
    blanks = {"daisy/gblank1.jpg", "roses/gblank2.jpg"}
    for seed in range(20):  # each file is its own group; find a seed that splits the blanks
        out = tmp_path / f"out{seed}"
        pack(src, out, format="wds", split={"train": 0.5, "val": 0.5}, seed=seed,
             group_by=r"^[^/]+/(g[a-z]+\d*)", shard_samples=8, progress=False)
        where = {r["path"]: s for s in ("train", "val") for r in _rows(out, s)}
        if len({where[b] for b in blanks}) == 2:
            break
    else:
        pytest.fail("no seed in 0..19 put the two blank frames in different splits")
    report = check_dataset(out, transforms=False)
    degenerate = {d["path"]: d for d in report["degenerate"]}
    assert set(degenerate) == blanks | {"roses/gmissing.jpg", "daisy/gstrip.png"}
    assert degenerate["daisy/gstrip.png"]["reason"] == \
        f"small: 20x{strip.shape[0]} px, a side under 32"
    assert degenerate["daisy/gblank1.jpg"]["reason"] == \
        "near-constant: 100.0% of pixels within 8 levels of gray 255"
    assert degenerate["roses/gmissing.jpg"]["reason"].endswith("of gray 230")
    assert {d["split"] for d in report["degenerate"]} == {"train", "val"}
    assert report["near_duplicates"] == []                       # the blank pair is left out...
    manifest = load_manifest_dict(out)
    full = {s: leaks.split_phashes(out, manifest, s) for s in ("train", "val")}
    rows = {s: _rows(out, s) for s in ("train", "val")}
    unskipped = {frozenset((p["a"]["path"], p["b"]["path"]))
                 for p in leaks.near_duplicate_pairs(full, rows)}
    assert frozenset(blanks) in unskipped                        # ...which it would be otherwise
    assert report["ok"] and [w["check"] for w in report["warnings"]] == ["degenerate",
                                                                         "transform_drift"]
    warning = report["warnings"][0]
    assert warning["message"].startswith("4 degenerate image(s) (a side under 32 px or "
                                         "near-constant), left out of the near-duplicate search")
    res = CliRunner().invoke(check_command, [str(out), "--no-transforms"])
    assert res.exit_code == 0
    assert "degenerate images (left out of the near-duplicate search): 4" in res.output
    assert res.output.strip().splitlines()[-1] == (
        "NO EXACT LEAK (groups, identical bytes); 4 degenerate image(s) (tiny or near-constant): "
        "review them (--strict fails on them); not run: transform_drift")
    strict = CliRunner().invoke(check_command, [str(out), "--no-transforms", "--strict"])
    assert strict.exit_code == 1 and "ERROR [degenerate] 4 degenerate" in strict.output
    skipped = check_dataset(out, transforms=False, near_duplicates=False)
    assert skipped["degenerate"] is None and skipped["near_duplicates"] is None


def _report(**overrides):
    base = {"root": "/d", "ok": True, "strict": False, "errors": [], "warnings": [],
            "thresholds": {"phash_hamming": 4, "imbalance_ratio": 10.0}, "group_overlap": [],
            "sha_overlap": [], "near_duplicates": [], "imbalance": {}, "transform": None}
    return {**base, **overrides}


def test_check_headline_is_not_ok_when_there_are_warnings():
    from shardkit.doctor.check import format_check_report

    near = [{"check": "near_duplicates", "message": f"near-duplicate {i}"} for i in range(10)]
    text = format_check_report(_report(near_duplicates=[{}] * 10, warnings=near))
    assert text.splitlines()[-1] == ("NO EXACT LEAK (groups, identical bytes); 10 near-duplicate "
                                     "pair(s) across splits: review them (--strict fails on them)")
    assert format_check_report(_report()).splitlines()[-1] == "OK: no leak found"
    missing = [{"check": "missing_classes", "message": "split 'val' has no sample of ['a']"},
               {"check": "transform_drift", "message": "transform drift check not run "
                "(disabled by the caller)"}]
    assert format_check_report(_report(warnings=missing)).splitlines()[-1] == (
        "NO EXACT LEAK (groups, identical bytes); 1 other warning(s) (--strict fails on them); "
        "not run: transform_drift")
    failed = _report(ok=False, errors=[{"check": "sha_overlap", "message": "x"}], warnings=near)
    assert format_check_report(failed).splitlines()[-1] == "FAILED: 1 error(s)"


# ---------------------------------------------------------------------------------------- inspect

def test_inspect_counts_match_manifest_and_writes_pngs(clean, tmp_path):
    manifest = json.loads((clean / "manifest.json").read_text())
    report = inspect_dataset(clean, out_dir=tmp_path / "viz", n=10)
    assert list(report["splits"]) == list(manifest["splits"])
    for split, entry in manifest["splits"].items():
        got = report["splits"][split]
        assert list(got["class_counts"].values()) == entry["class_counts"]
        assert list(got["class_counts"]) == manifest["classes"]
        assert got["num_samples"] == entry["num_samples"]
        groups = {r["group"] for r in _rows(clean, split)}
        assert got["num_groups"] == entry["num_groups"] == len(groups)
        assert got["shards"]["count"] == len(entry["shards"])
        sizes = sorted(s["bytes"] for s in entry["shards"])
        assert (got["shards"]["bytes_min"], got["shards"]["bytes_max"]) == (sizes[0], sizes[-1])
        assert got["manifest_mismatch"] == []
        counts = np.array(entry["class_counts"])
        assert got["imbalance"]["ratio"] == pytest.approx(counts.max() / counts.min())
        images = report["images"][split]
        for kind, name in (("samples", "samples"), ("train_transform", "transformed")):
            png = tmp_path / "viz" / f"inspect_{split}_{name}.png"
            assert images[kind] == str(png)
            with Image.open(png) as im:
                assert im.format == "PNG" and im.width > 300 and im.height > 200
        labels = {r["key"]: r["label"] for r in _rows(clean, split)}
        shown = {labels[k] for k in images["keys"]}
        assert len(images["keys"]) == min(10, entry["num_samples"])
        assert len(shown) == min(len(manifest["classes"]), len(images["keys"]),
                                 int((counts > 0).sum()))           # every class shown in turn


def test_inspect_cli_one_split_and_mismatch(clean, tmp_path):
    res = CliRunner().invoke(inspect_command, [str(clean), "--split", "val", "--n", "4",
                                               "--out", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == [
        "inspect_val_samples.png", "inspect_val_transformed.png"]
    manifest = json.loads((clean / "manifest.json").read_text())
    for c, n in zip(manifest["classes"], manifest["splits"]["val"]["class_counts"]):
        assert any(line.split() == [c, str(n), str(n)] for line in res.output.splitlines()), c
    val = _rows(clean, "val")
    _write_rows(clean, "val", val[:-1])                           # jsonl no longer matches
    report = inspect_dataset(clean, "val", out_dir=tmp_path / "w", n=2)
    assert any("num_samples" in m for m in report["splits"]["val"]["manifest_mismatch"])
    bad = CliRunner().invoke(inspect_command, [str(clean), "--split", "nope"])
    assert bad.exit_code == 2 and "'nope'" in bad.output


def test_inspect_default_out_is_outside_the_dataset(clean, tmp_path, monkeypatch):
    """Without --out the grids go to ./inspect-<dataset folder name>, never into the dataset
    (which stays byte-identical: `shardkit verify` re-hashes it)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    before = sorted(p.relative_to(clean) for p in clean.rglob("*"))
    res = CliRunner().invoke(inspect_command, [str(clean), "--split", "test", "--n", "2"])
    assert res.exit_code == 0, res.output
    assert sorted(p.relative_to(clean) for p in clean.rglob("*")) == before
    assert not (clean / "inspect").exists()
    assert sorted(p.name for p in (cwd / f"inspect-{clean.name}").iterdir()) == [
        "inspect_test_samples.png", "inspect_test_transformed.png"]


# ------------------------------------------------------------------------------ transform drift

def test_transform_drift_clean_matches_torchvision(packed_sample):
    from shardkit.doctor.drift import TOLERANCE, check_transform_drift

    root = packed_sample("wds")
    drift = check_transform_drift(root, load_manifest_dict(root), num_samples=3)
    assert drift["problems"] == [] and drift["same_config"] is True
    assert drift["split"] == "val" and drift["keys"] == [r["key"] for r in _rows(root, "val")[:3]]
    assert drift["train_shape"] == drift["eval_shape"] == [224, 224, 3]
    assert drift["train_dtype"] == drift["eval_dtype"] == "uint8"
    assert len(drift["eval_mean_abs"]) == len(drift["train_mean_abs"]) == 3
    for d in drift["eval_mean_abs"] + drift["train_mean_abs"]:
        assert d["pooled"] <= min(d["raw"], TOLERANCE["pooled_mean_abs"])
        assert d["raw"] < 6.0                                   # DCT scaling: small raw differences


class _Flipped:
    """An eval transform that records the right config but silently mirrors its output."""

    def __init__(self, cfg):
        from shardkit.transforms import make_transform

        self.cfg, self._t = cfg, make_transform(cfg, train=False)

    def __call__(self, data, rng=None):
        return np.ascontiguousarray(self._t(data, rng)[:, ::-1])


def test_transform_drift_detects_other_config_and_silent_change(packed_sample):
    from shardkit.doctor.drift import check_transform_drift
    from shardkit.transforms import TransformConfig, make_transform

    root = packed_sample("wds")
    manifest = load_manifest_dict(root)
    cfg = TransformConfig()
    other = make_transform(TransformConfig(crop_pct=0.95), train=False)
    drift = check_transform_drift(root, manifest, cfg, num_samples=3, eval_t=other)
    assert drift["same_config"] is False
    assert any("eval transform uses another TransformConfig" in p and "crop_pct: expected 0.875, "
               "got 0.95" in p for p in drift["problems"])
    assert min(d["pooled"] for d in drift["eval_mean_abs"]) > 2.5   # the pixels drift too
    small = make_transform(TransformConfig(image_size=160), train=False)
    drift = check_transform_drift(root, manifest, cfg, num_samples=2, eval_t=small)
    assert any("train output uint8 (224, 224, 3) differs from eval output uint8 (160, 160, 3)" in p
               for p in drift["problems"])
    drift = check_transform_drift(root, manifest, cfg, num_samples=3, eval_t=_Flipped(cfg))
    assert drift["same_config"] is True                      # config alone would not tell
    flagged = [p for p in drift["problems"] if "eval output differs from torchvision" in p]
    assert len(flagged) == 3                                  # every checked sample
    assert drift["train_mean_abs"] == check_transform_drift(root, manifest, cfg,
                                                            num_samples=3)["train_mean_abs"]


def test_check_cli_transform_config_file(clean, tmp_path):
    good = tmp_path / "t.yaml"
    good.write_text("transform:\n  image_size: 160\n  crop_pct: 0.9\n")
    res = CliRunner().invoke(check_command, [str(clean), "--no-near-duplicates",
                                             "--transform-config", str(good), "--json",
                                             str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["transform"]["config"]["image_size"] == 160
    assert report["transform"]["eval_shape"] == [160, 160, 3]
    assert report["near_duplicates"] is None
    assert any(w["check"] == "near_duplicates" and "not run" in w["message"]
               for w in report["warnings"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("image_sise: 160\n")
    res = CliRunner().invoke(check_command, [str(clean), "--transform-config", str(bad)])
    assert res.exit_code == 2 and "image_sise" in res.output


def test_transform_config_from_a_train_run_folder(clean, tmp_path):
    """`--transform-config RUN` uses the TransformConfig that run's loaders were built with (its
    image_size; mean/std from mean_std, `dataset` = the manifest's stats of its train split)."""
    from shardkit.train.config import TrainConfig, save_config
    from shardkit.transforms import IMAGENET_MEAN

    run = tmp_path / "run"
    run.mkdir()
    save_config(TrainConfig(data=str(clean), out=str(run), image_size=96), run / "config.yaml")
    res = CliRunner().invoke(check_command, [str(clean), "--no-near-duplicates",
                                             "--transform-config", str(run),
                                             "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    transform = json.loads((tmp_path / "r.json").read_text())["transform"]
    assert transform["config"]["image_size"] == 96 and transform["eval_shape"] == [96, 96, 3]
    assert transform["config"]["mean"] == pytest.approx(IMAGENET_MEAN)
    assert transform["problems"] == []
    save_config(TrainConfig(data=str(clean), out=str(run), image_size=64, mean_std="dataset"),
                run / "config.yaml")
    no_stats = CliRunner().invoke(check_command, [str(clean), "--transform-config",
                                                  str(run / "config.yaml")])
    assert no_stats.exit_code == 2 and no_stats.stderr.startswith("Error: ConfigError: ")
    assert "shardkit stats" in no_stats.stderr
    stats = compute_stats(clean, "train", max_samples=8)
    report = inspect_dataset(clean, "val", out_dir=tmp_path / "grids", n=2,
                             transform_config=load_transform_config(run, load_manifest_dict(clean)))
    assert report["images"]["val"]["keys"]
    cfg = load_transform_config(run / "config.yaml", load_manifest_dict(clean))
    assert cfg.image_size == 64 and list(cfg.mean) == pytest.approx(stats["mean"])


def test_progress_bars_follow_the_terminal_rule(clean, monkeypatch):
    from shardkit.cli_common import progress_default

    class Tty:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setattr("sys.stderr", Tty(True))
    assert progress_default(None) is True and progress_default(False) is False
    monkeypatch.setattr("sys.stderr", Tty(False))
    assert progress_default(None) is False and progress_default(True) is True
    monkeypatch.undo()
    args = [str(clean), "--no-near-duplicates"]
    quiet = CliRunner().invoke(check_command, args)             # CliRunner's stderr is no tty
    assert quiet.exit_code == 0 and quiet.stderr == ""
    bars = CliRunner().invoke(check_command, args + ["--progress"])
    assert bars.exit_code == 0 and "transforms val" in bars.stderr
    grids = CliRunner().invoke(inspect_command, [str(clean), "--split", "test", "--n", "2",
                                                 "--out", str(clean.parent / "g"), "--progress"])
    assert grids.exit_code == 0 and "inspect test" in grids.stderr


def test_inspect_switches_no_matplotlib_backend_and_check_logs_notes(clean, tmp_path,
                                                                     monkeypatch, caplog):
    import matplotlib

    def no_global_switch(*args, **kwargs):
        raise AssertionError("matplotlib.use called: a process-wide backend switch")

    monkeypatch.setattr(matplotlib, "use", no_global_switch)
    report = inspect_dataset(clean, "test", out_dir=tmp_path / "g", n=3)
    with Image.open(report["images"]["test"]["samples"]) as im:
        assert im.format == "PNG" and im.width > 200
    with caplog.at_level("INFO", logger="shardkit.doctor"):
        check_dataset(clean, near_duplicates=False, transforms=False)
    notes = [r for r in caplog.records if r.name.startswith("shardkit.doctor")]
    assert {r.getMessage() for r in notes} == {
        "near-duplicate search not run (disabled by the caller)",
        "transform drift check not run (disabled by the caller)"}
