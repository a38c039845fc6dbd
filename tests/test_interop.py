"""Other tools read shardkit's wds shards as they are: timm's WebDataset reader through
``shards/_info.json``, DALI through ``shards/*.idx`` (format checked against the tars' real
member offsets here; DALI itself in the ``slow`` test), Hugging Face ``datasets`` through the
``README.md`` card, and ``webdataset``; ``shardkit export`` for existing datasets.

Real readers on the embedded sample (``packed_sample``: 200 photos, train/val/test, 32 samples
per shard); every check compares each sample with the split records (label, stored bytes).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import yaml
import pytest
from click.testing import CliRunner
from PIL import Image

from shardkit.cli import main as cli_main
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.packer.run import pack

ROOT = Path(__file__).resolve().parents[1]
SPLIT_NAMES = {"train": "train", "val": "validation", "test": "test"}  # shardkit -> timm / HF


def tar_order(out: Path, split: str) -> list[dict]:
    """The split's records in the order its samples lie in the tars (shard, then offset)."""
    return sorted(read_split_records(out, split), key=lambda r: (r["shard"], r["offset"]))


def stored_bytes(out: Path, split: str, rec: dict) -> bytes:
    shard = load_manifest(out)["splits"][split]["shards"][rec["shard"]]["path"]
    with open(out / shard, "rb") as f:
        f.seek(rec["offset"])
        return f.read(rec["size"])


def pixels(data_or_image) -> np.ndarray:
    im = data_or_image if isinstance(data_or_image, Image.Image) else \
        Image.open(io.BytesIO(data_or_image))
    return np.asarray(im.convert("RGB"))


def run_export(out: Path, *tools: str):
    args = ["export", str(out)] + [a for t in tools for a in ("--to", t)]
    return CliRunner().invoke(cli_main, args)


@pytest.fixture(scope="module")
def wds_out(packed_sample, tmp_path_factory) -> Path:
    """A private copy of the sample packed as wds, plus the Hugging Face card of ``shardkit
    export --to hf`` (pack writes only the files inside shards/); tests below change their
    copies only."""
    out = tmp_path_factory.mktemp("interop") / "flowers"
    shutil.copytree(packed_sample("wds"), out)
    assert not (out / "README.md").exists()  # pack never writes a README.md into OUT
    assert run_export(out, "hf").exit_code == 0
    return out


# ------------------------------------------------------------------ what pack writes
def test_pack_writes_each_readers_file_derived_from_the_manifest(wds_out):
    man = load_manifest(wds_out)
    shards = [s["path"] for info in man["splits"].values() for s in info["shards"]]
    assert len(shards) >= 7  # 200 samples, 32 per shard, 3 splits
    for shard in shards:
        assert (wds_out / shard.replace(".tar", ".idx")).is_file(), shard
    info = json.loads((wds_out / "shards" / "_info.json").read_text())
    assert info["name"] == "flowers-sample" and info["num_classes"] == 5  # the source's
    assert sorted(info["splits"]) == ["test", "train", "val", "validation"]
    for split, entry in info["splits"].items():
        m = man["splits"][{"validation": "val"}.get(split, split)]
        assert entry["name"] == split and entry["num_samples"] == m["num_samples"]
        assert entry["filenames"] == [Path(s["path"]).name for s in m["shards"]]
        assert entry["shard_lengths"] == [s["num_samples"] for s in m["shards"]]
        assert sum(entry["shard_lengths"]) == entry["num_samples"]
        assert "alt_label" not in entry  # labels from the .cls members
    card = (wds_out / "README.md").read_text()  # written by export --to hf (the fixture)
    assert card.startswith("---\n") and "<!-- shardkit dataset card" in card
    assert "- split: validation\n    path:\n    - shards/val-000000.tar\n" in card


def test_dali_index_files_hold_every_members_real_offset(wds_out):
    """The wds2idx v1.2 format (DALI tools/wds2idx.py): a 'v1.2 <samples>' line, then one line
    per sample in tar order, '<ext> <data offset> <size> <name>' per member; expected values
    come from Python's tarfile reading the tar, not from shardkit's index."""
    man = load_manifest(wds_out)
    for split, info in man["splits"].items():
        labels = {r["key"]: r["label"] for r in tar_order(wds_out, split)}
        for shard in info["shards"]:
            samples: dict[str, list[str]] = {}
            with tarfile.open(wds_out / shard["path"]) as tar:
                for m in tar:
                    key, ext = m.name.split(".", 1)
                    samples.setdefault(key, []).append(f"{ext} {m.offset_data} {m.size} "
                                                       f"{m.name}")
                    if ext == "cls":
                        assert int(tar.extractfile(m).read()) == labels[key], m.name
            expected = f"v1.2 {len(samples)}\n" + "".join(" ".join(v) + "\n"
                                                         for v in samples.values())
            got = (wds_out / shard["path"].replace(".tar", ".idx")).read_text()
            assert got == expected, shard["path"]
            assert len(samples) == shard["num_samples"]
            assert all(len(v) == 2 and v[1].startswith("cls ") for v in samples.values())


def test_lmdb_and_hdf5_get_no_reader_files_and_export_refuses(packed_sample):
    for fmt in ("lmdb", "hdf5"):
        out = packed_sample(fmt)
        assert sorted(os.listdir(out)) == ["manifest.json", "quarantine.jsonl", "shards",
                                           "splits"]
        assert not [p for p in os.listdir(out / "shards") if not p.endswith(
            {"lmdb": ".lmdb", "hdf5": ".h5"}[fmt])]
        res = run_export(out, "timm")
        assert res.exit_code == 2
        assert f"holds '{fmt}' shards; only 'wds' (tar) shards" in res.output
        assert len(res.output.strip().splitlines()) == 1


# ------------------------------------------------------------------ the real readers
@pytest.mark.parametrize("split", ["train", "val", "validation", "test"])
def test_timm_create_dataset_yields_exactly_the_manifests_samples(wds_out, split):
    import timm.data

    ds = timm.data.create_dataset("wds/flowers", root=str(wds_out / "shards"), split=split,
                                  is_training=False)
    name = {"validation": "val"}.get(split, split)
    records = tar_order(wds_out, name)
    got = list(ds)
    assert len(got) == len(records) == load_manifest(wds_out)["splits"][name]["num_samples"]
    assert [target for _, target in got] == [r["label"] for r in records]
    for (image, _), rec in zip(got[:: max(1, len(got) // 8)], records[:: max(1, len(got) // 8)]):
        assert np.array_equal(pixels(image), pixels(stored_bytes(wds_out, name, rec)))


def test_timm_create_loader_runs_one_training_batch(wds_out):
    import timm.data

    ds = timm.data.create_dataset("wds/flowers", root=str(wds_out / "shards"), split="train",
                                  is_training=True, batch_size=8, seed=0)
    loader = timm.data.create_loader(ds, input_size=(3, 64, 64), batch_size=8, is_training=True,
                                     num_workers=0, use_prefetcher=False)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 64, 64) and images.dtype.is_floating_point
    assert labels.shape == (8,) and 0 <= int(labels.min()) and int(labels.max()) < 5
    assert float(images.std()) > 0.1  # normalised photos, not blank tensors


# ------------------------------------------------- the default shard plan, read by timm's workers
@pytest.fixture(scope="module", params=["sample-x3", "flowers"])
def default_plan_out(request, sample_dir, tmp_path_factory) -> Path:
    """A pack with the default shard plan (no --shard-samples/--shard-bytes): the embedded
    sample linked three times into one train split (600 samples: 8 shards of 75; runs in CI),
    and the full flowers set by photographer (train split of ~1,500: 16 shards; skipped where
    ../shared/data is absent)."""
    base = tmp_path_factory.mktemp("plan")
    if request.param == "flowers":
        flowers = request.getfixturevalue("flowers_dir")
        pack(flowers, base / "out", metadata=flowers / "metadata.csv",
             group_column="group_flickr_user", near_duplicates="off", workers=2, progress=False)
        return base / "out"
    src = base / "src"
    for copy in range(3):
        for photo in sorted(sample_dir.glob("*/*.jpg")):
            link = src / photo.parent.name / f"{copy}_{photo.name}"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(photo)
    pack(src, base / "out", split={"train": 1.0}, near_duplicates="off", progress=False)
    return base / "out"


def _fingerprint(image, label) -> tuple[str, int]:
    return hashlib.sha1(image.numpy().tobytes()).hexdigest(), int(label)


@pytest.fixture(scope="module")
def timm_view(default_plan_out):
    """A fixed timm transform (resize + centre crop to 32 px, no random op) and the multiset of
    fingerprints of the train split's stored images through it: what an epoch must hold."""
    import timm.data

    transform = timm.data.create_transform(input_size=(3, 32, 32), is_training=True, no_aug=True)
    expected = Counter(
        _fingerprint(transform(Image.open(io.BytesIO(stored_bytes(default_plan_out, "train", rec)))
                               .convert("RGB")), rec["label"])
        for rec in tar_order(default_plan_out, "train"))
    return transform, expected


@pytest.mark.parametrize("workers", [2, 4])
def test_timm_workers_get_every_sample_of_the_default_shard_plan(default_plan_out, timm_view,
                                                                 workers):
    """timm's ``create_loader`` at 2 and 4 workers hands each worker whole shards (worker k
    takes shards k, k + W, ... of the shuffled list) and, in training, a quota of
    ceil(ceil(N / W) / B) * B samples that its shards are re-read to fill or cut to. With the
    default plan (power-of-two shards of equal length, the last shorter) every sample of the
    train split comes in the epoch, and the only repeats are timm's padding up to its quota;
    in eval mode every sample comes exactly once. (A one-shard split gave 768 of 1,535.)"""
    import timm.data

    out, (transform, expected) = default_plan_out, timm_view
    info = load_manifest(out)["splits"]["train"]
    lengths = [sh["num_samples"] for sh in info["shards"]]
    n = info["num_samples"]
    assert sum(expected.values()) == n
    assert len(lengths) in (8, 16) and len(lengths) % workers == 0
    assert set(lengths[:-1]) == {-(-n // len(lengths))} and lengths[-1] <= lengths[0]
    assert json.loads((out / "shards" / "_info.json").read_text())["splits"]["train"][
        "shard_lengths"] == lengths
    batch = 8
    for training in (True, False) if workers == 4 else (True,):
        ds = timm.data.create_dataset("wds/x", root=str(out / "shards"), split="train",
                                      is_training=training, batch_size=batch, seed=0)
        loader = timm.data.create_loader(ds, input_size=(3, 32, 32), batch_size=batch,
                                         is_training=training, num_workers=workers,
                                         use_prefetcher=False, persistent_workers=False)
        ds.transform = transform  # fixed, so a sample's fingerprint is known (before the fork)
        got = Counter(_fingerprint(image, label) for images, labels in loader
                      for image, label in zip(images, labels))
        if training:
            quota = -(-(-(-n // workers)) // batch) * batch
            assert sum(got.values()) == workers * quota == len(ds)
            assert not expected - got  # every sample at least once
            assert sum((got - expected).values()) == workers * quota - n  # timm's padding only
        else:
            assert got == expected  # exactly once


def test_webdataset_reads_every_split_with_keys_and_labels(wds_out):
    import webdataset as wds

    for split, info in load_manifest(wds_out)["splits"].items():
        urls = [str(wds_out / s["path"]) for s in info["shards"]]
        got = [(s["__key__"], int(s["cls"]), len(s["jpg"]))
               for s in wds.WebDataset(urls, shardshuffle=False)]
        assert got == [(r["key"], r["label"], r["size"]) for r in tar_order(wds_out, split)]


def test_hugging_face_load_dataset_reads_every_split_with_class_names(wds_out, tmp_path,
                                                                      monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ds = datasets.load_dataset(str(wds_out), cache_dir=str(tmp_path / "hf-cache"))
    man = load_manifest(wds_out)
    assert sorted(ds) == sorted(SPLIT_NAMES.values())
    for split, hf_name in SPLIT_NAMES.items():
        part = ds[hf_name].cast_column("jpg", datasets.Image(decode=False))
        records = tar_order(wds_out, split)
        assert part.num_rows == len(records) == man["splits"][split]["num_samples"]
        assert part.features["cls"].names == man["classes"]
        assert part["__key__"] == [r["key"] for r in records]
        assert part["cls"] == [r["label"] for r in records]
        for row, rec in zip(part, records):
            assert row["jpg"]["bytes"] == stored_bytes(wds_out, split, rec), rec["key"]


@pytest.mark.slow
def test_dali_reads_with_the_index_files(wds_out):
    """DALI is not installed with shardkit (large wheel): runs benchmarks/check_dali.py with
    $SHARDKIT_DALI_PYTHON (a Python that has nvidia-dali; default this one), else skips."""
    python = os.environ.get("SHARDKIT_DALI_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import nvidia.dali"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"nvidia.dali not importable by {python} (set SHARDKIT_DALI_PYTHON)")
    res = subprocess.run([python, str(ROOT / "benchmarks" / "check_dali.py"), str(wds_out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    for split, info in load_manifest(wds_out)["splits"].items():
        assert f"{split}: {info['num_samples']} samples read by DALI" in res.stdout
    assert res.stdout.strip().endswith(": OK")


# ------------------------------------------------------------------ shardkit export
def test_export_rewrites_the_same_files_and_removes_stale_indexes(wds_out, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(wds_out, out)
    made = {p.relative_to(out).as_posix(): p.read_bytes() for p in
            [out / "README.md", out / "shards" / "_info.json", *out.glob("shards/*.idx")]}
    for rel in made:
        (out / rel).unlink()
    (out / "shards" / "train-000099.idx").write_text("v1.2 0\n")  # a shard that is gone
    (out / "shards" / "notes.txt").write_text("mine")
    res = run_export(out, "all")
    assert res.exit_code == 0, res.output
    assert sorted(res.output.splitlines()[:-1]) == sorted(made)
    assert {rel: (out / rel).read_bytes() for rel in made} == made  # same bytes as pack's
    assert not (out / "shards" / "train-000099.idx").exists()
    assert (out / "shards" / "notes.txt").read_text() == "mine"


def test_export_refuses_a_readme_it_did_not_write(wds_out, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(wds_out, out)
    (out / "README.md").write_text("# my own notes\n")
    res = run_export(out, "hf")
    assert res.exit_code == 2
    assert "README.md exists and was not written by shardkit" in res.output
    assert (out / "README.md").read_text() == "# my own notes\n"
    assert run_export(out, "timm").exit_code == 0  # the other tools are unaffected


def test_export_names_the_damaged_shard_and_writes_nothing(wds_out, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(wds_out, out)
    (out / "shards" / "_info.json").unlink()
    shard = out / "shards" / "val-000000.tar"
    shard.write_bytes(shard.read_bytes()[:3000])
    res = run_export(out, "timm")
    assert res.exit_code == 2 and "ShardCorruptError" in res.output
    assert "val-000000.tar" in res.output and not (out / "shards" / "_info.json").exists()
    shard.write_bytes((wds_out / "shards" / "val-000000.tar").read_bytes())
    rec = tar_order(out, "val")[0]
    header = rec["offset"] + -(-rec["size"] // 512) * 512  # the .cls member's header
    data = bytearray(shard.read_bytes())
    data[header + 3] ^= 0x01  # one bit of its name: the header checksum no longer holds
    shard.write_bytes(bytes(data))
    res = run_export(out, "dali")
    assert res.exit_code == 2
    assert f"val-000000.tar: damaged tar header at byte {header}" in res.output
    assert run_export(out, "hf").exit_code == 2 and not (out / "shards" / "_info.json").exists()


def test_shards_without_cls_members_timm_reads_json_labels_others_refused(sample_dir, tmp_path):
    """A pack with --no-wds-cls --wds-json: timm reads the label field of the .json members
    (alt_label); DALI and HF need .cls members, so pack writes no file for them and export
    exits 2 with one line saying so. Without .json members timm is refused too."""
    import timm.data

    out = tmp_path / "nocls"
    pack(sample_dir, out, split={"train": 0.8, "val": 0.2}, wds_cls=False, wds_json=True,
         shard_samples=64, progress=False)
    assert sorted(os.listdir(out)) == ["manifest.json", "quarantine.jsonl", "shards", "splits"]
    assert not list(out.glob("shards/*.idx"))
    info = json.loads((out / "shards" / "_info.json").read_text())
    assert info["splits"]["validation"]["alt_label"] == "label"
    ds = timm.data.create_dataset("wds/x", root=str(out / "shards"), split="validation")
    assert [t for _, t in ds] == [r["label"] for r in tar_order(out, "val")]
    for tool in ("dali", "hf"):
        res = run_export(out, tool)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
        assert "read labels from .cls members, and the shards have no .cls members" in \
            res.output or "reads labels from .cls members, and the shards have no" in res.output
        assert "--wds-cls" in res.output
    assert not (out / "README.md").exists() and not list(out.glob("shards/*.idx"))
    bare = tmp_path / "bare"
    pack(sample_dir, bare, split={"train": 1.0}, wds_cls=False, progress=False)
    assert not (bare / "shards" / "_info.json").exists()
    res = run_export(bare, "timm")
    assert res.exit_code == 2 and "timm reads labels from .cls members (or .json" in res.output


def test_overwrite_with_another_format_removes_the_reader_files(wds_out, sample_dir, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(wds_out, out)
    (out / "shards" / "README.md").write_text("the user's")  # not an owned name there
    pack(sample_dir, out, format="lmdb", split={"train": 1.0}, overwrite=True, progress=False)
    # shardkit's card went with the wds dataset it described
    assert sorted(os.listdir(out)) == ["manifest.json", "quarantine.jsonl", "shards", "splits"]
    assert sorted(p for p in os.listdir(out / "shards") if not p.endswith(".lmdb")) == [
        "README.md"]
    # a README.md of the user's own in OUT (no card marker) survives a fresh pack and overwrite
    (out / "README.md").write_text("# my notes\n")
    pack(sample_dir, out, format="wds", split={"train": 1.0}, overwrite=True, progress=False)
    assert (out / "README.md").read_text() == "# my notes\n"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "README.md").write_text("# my notes\n")
    pack(sample_dir, fresh, split={"train": 1.0}, progress=False)
    assert (fresh / "README.md").read_text() == "# my notes\n"


def test_png_samples_and_non_utf8_names_with_wds_json(sample_dir, tmp_path, monkeypatch):
    """A dataset holding a PNG (stored transcoded) and a file name that is not UTF-8, packed
    with --wds-json: the .json member writes the name's undecodable bytes as \\xNN text (so
    pyarrow, under HF datasets, accepts it; the split record keeps the exact name), and the HF
    card has a png column beside jpg, one of them None in each row."""
    from conftest import make_awkward

    src = tmp_path / "src"
    for cls in ("daisy", "roses"):
        (src / cls).mkdir(parents=True)
        for p in sorted((sample_dir / cls).glob("*.jpg"))[:3]:
            shutil.copyfile(p, src / cls / p.name)
    odd = os.fsencode(str(src / "daisy")) + b"/r\xe9sum\xe9.jpg"
    shutil.copyfile(sorted((sample_dir / "daisy").glob("*.jpg"))[3], odd)
    (src / "roses" / "alpha.png").write_bytes(make_awkward()["png_rgba.png"])
    out = tmp_path / "out"
    pack(src, out, split={"train": 1.0}, wds_json=True, progress=False)
    records = tar_order(out, "train")
    assert sorted(r["ext"] for r in records) == ["jpg"] * 7 + ["png"]
    import webdataset as wds

    metas = {s["__key__"]: json.loads(s["json"]) for s in
             wds.WebDataset(str(out / "shards" / "train-000000.tar"), shardshuffle=False)}
    text = {"daisy/r\udce9sum\udce9.jpg": "daisy/r\\xe9sum\\xe9.jpg"}
    assert metas == {r["key"]: {"key": r["key"], "label": r["label"],
                                "path": text.get(r["path"], r["path"]),
                                "class": ["daisy", "roses"][r["label"]]} for r in records}
    assert b"daisy/r\xe9sum\xe9.jpg" in {os.fsencode(r["path"]) for r in records}
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run_export(out, "hf").exit_code == 0  # the card tells HF to read the tars
    train = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))["train"]
    assert [c for c in train.column_names if c in ("jpg", "png")] == ["jpg", "png"]
    for row, rec in zip(train, records):
        image = row[rec["ext"]]
        assert row["jpg" if rec["ext"] == "png" else "png"] is None
        assert np.array_equal(pixels(image), pixels(stored_bytes(out, "train", rec)))
        assert row["cls"] == rec["label"] and row["json"] == metas[rec["key"]]


# ------------------------------------------------------------------ verify checks the reader files
def run_verify(out):
    return CliRunner().invoke(cli_main, ["verify", str(out), "--no-decode"])


def _fails(result) -> list[str]:
    return [line[5:] for line in result.output.splitlines() if line.startswith("FAIL ")]


@pytest.fixture(scope="module")
def other_pack(sample_dir, tmp_path_factory) -> Path:
    """Another pack of the sample (other split, 16 samples per shard): same shard names,
    other contents, the source of the stale copies below."""
    out = tmp_path_factory.mktemp("other") / "out"
    pack(sample_dir, out, split={"train": 0.5, "val": 0.3, "test": 0.2}, shard_samples=16,
         progress=False)
    return out


def test_verify_passes_with_the_reader_files_pack_and_export_wrote(wds_out):
    result = run_verify(wds_out)
    assert result.exit_code == 0 and _fails(result) == [], result.output
    assert result.output.rstrip().endswith("OK (7 shards, 200 samples checked)")


def test_verify_fails_on_a_dali_index_copied_in_from_another_pack(wds_out, other_pack, tmp_path):
    """A stale .idx (it said OK): regenerated from the tar, compared, exit 1 naming it; a
    leftover .idx of a shard the manifest does not list too."""
    out = tmp_path / "copy"
    shutil.copytree(wds_out, out)
    shutil.copyfile(other_pack / "shards" / "train-000001.idx", out / "shards" / "train-000001.idx")
    shutil.copyfile(other_pack / "shards" / "test-000002.idx", out / "shards" / "test-000002.idx")
    result = run_verify(out)
    assert result.exit_code == 1, result.output
    stale, leftover = _fails(result)
    want = (wds_out / "shards" / "train-000001.idx").read_text().splitlines()
    have = (other_pack / "shards" / "train-000001.idx").read_text().splitlines()
    line = next(n for n, (a, b) in enumerate(zip(have, want), 1) if a != b)
    assert stale == (f"shards/train-000001.idx does not match shards/train-000001.tar: line "
                     f"{line} is {have[line - 1][:60]!r}, the tar gives {want[line - 1][:60]!r} "
                     f"(a stale index from another pack?); `shardkit export {out} --to dali` "
                     "rewrites it")
    assert leftover.startswith("shards/test-000002.idx: no shard of the manifest has this DALI "
                               "index (a leftover of another pack")
    assert result.output.rstrip().endswith("2 problem(s) (7 shards, 200 samples checked)")
    assert run_export(out, "dali").exit_code == 0
    assert run_verify(out).exit_code == 0  # export rewrote the one and removed the other


def test_verify_fails_on_a_timm_info_and_card_of_another_pack(wds_out, other_pack, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(wds_out, out)
    shutil.copyfile(other_pack / "shards" / "_info.json", out / "shards" / "_info.json")
    assert run_export(other_pack, "hf").exit_code == 0
    shutil.copyfile(other_pack / "README.md", out / "README.md")
    result = run_verify(out)
    assert result.exit_code == 1, result.output
    fails = _fails(result)
    hint = f"`shardkit export {out} --to timm` rewrites it"
    assert fails == [
        *(f"shards/_info.json: split {s!r} has other num_samples, filenames, shard_lengths than "
          f"the manifest (a copy from another pack?); {hint}"
          for s in ("test", "train", "val", "validation")),
        "README.md: its data_files are not the manifest's splits and shards (Hugging Face "
        f"datasets would read other files); `shardkit export {out} --to hf` rewrites it"]
    (out / "README.md").write_text("# my own notes\n")  # a user's README.md: not a card
    assert len(_fails(run_verify(out))) == 4
    assert run_export(out, "timm").exit_code == 0 and run_verify(out).exit_code == 0


def test_verify_fails_on_a_stale_dali_index_in_object_storage(s3_server, wds_out, other_pack):
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    url = s3_server.bucket() + "/interop"
    s3_server.upload_tree(wds_out, url)
    assert run_verify(url).exit_code == 0
    s3_server.fs().pipe(f"{url}/shards/val-000000.idx",
                        (other_pack / "shards" / "val-000000.idx").read_bytes())
    s3fs.S3FileSystem.clear_instance_cache()
    result = run_verify(url)
    assert result.exit_code == 1, result.output
    (fail,) = _fails(result)
    stale = len((other_pack / "shards" / "val-000000.idx").read_text().splitlines()) - 1
    want = load_manifest(wds_out)["splits"]["val"]["num_samples"]
    assert stale != want
    assert fail == (f"shards/val-000000.idx: it lists {stale} samples in {stale} lines, the "
                    f"split index {want}, not those of shards/val-000000.tar (a stale index "
                    "from another pack?); a `shardkit pack --overwrite` into its URL rewrites "
                    "it (export writes into a local dataset folder)")
    same_count = (wds_out / "shards" / "val-000000.idx").read_text().replace(
        " val_00000000.", " val_00000001.", 1)  # one member moved to another sample's name
    s3_server.fs().pipe(f"{url}/shards/val-000000.idx", same_count.encode())
    s3fs.S3FileSystem.clear_instance_cache()
    (fail,) = _fails(run_verify(url))
    assert fail.startswith("shards/val-000000.idx: line ") and \
        " has no member of sample 'val_00000000' at offset " in fail, fail


# ------------------------------------------------------------------ class names that are not UTF-8
@pytest.fixture(scope="module")
def latin1_out(sample_dir, tmp_path_factory) -> Path:
    """Two classes, one from the latin-1 folder name b"caf\\xe9" (4 + 4 photos), packed on
    Linux: the class name is "caf\\udce9" (os.fsdecode)."""
    src = tmp_path_factory.mktemp("latin1") / "src"
    for folder, cls in ((b"caf\xe9", "daisy"), (b"roses", "roses")):
        dst = os.fsencode(str(src)) + b"/" + folder
        os.makedirs(dst)
        for p in sorted((sample_dir / cls).glob("*.jpg"))[:4]:
            shutil.copyfile(p, dst + b"/" + os.fsencode(p.name))
    out = src.parent / "out"
    pack(src, out, split={"train": 0.5, "val": 0.5}, split_method="balanced", progress=False)
    assert load_manifest(out)["classes"] == ["caf\udce9", "roses"]
    return out


def test_inspect_shows_a_non_utf8_class_name_by_its_bytes(latin1_out, tmp_path):
    """It ended in matplotlib's TypeError traceback: the tables and the grid titles show the
    name as caf\\xe9; the JSON report keeps the exact name (escaped)."""
    res = CliRunner().invoke(cli_main, ["inspect", str(latin1_out), "--out",
                                        str(tmp_path / "grids"), "--json",
                                        str(tmp_path / "r.json"), "--n", "4"])
    assert res.exit_code == 0, res.output
    table = res.stdout.splitlines()
    assert table[2].split() == ["caf\\xe9", "2", "2", "4"]
    assert table[3].split() == ["roses", "2", "2", "4"]
    for split in ("train", "val"):
        for kind in ("samples", "transformed"):
            with Image.open(tmp_path / "grids" / f"inspect_{split}_{kind}.png") as im:
                assert im.width > 100
    report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    assert report["classes"] == ["caf\udce9", "roses"]
    assert report["splits"]["train"]["class_counts"] == {"caf\udce9": 2, "roses": 2}
    grid = CliRunner().invoke(cli_main, ["inspect", str(latin1_out), "--augment", "light",
                                         "--out", str(tmp_path / "grids"), "--per-class", "1"])
    assert grid.exit_code == 0, grid.output
    assert "samples per class: caf\\xe9 1, roses 1" in grid.stdout
    check = CliRunner().invoke(cli_main, ["check", str(latin1_out), "--no-transforms", "--json",
                                          str(tmp_path / "c.json")])
    assert check.exit_code == 0, check.output
    assert json.loads((tmp_path / "c.json").read_text())["ok"] is True


def test_export_hf_card_of_a_non_utf8_class_name(latin1_out, tmp_path, monkeypatch):
    """It ended in a UnicodeEncodeError traceback: the card is UTF-8, its ClassLabel names the
    class caf\\xe9 (as the .json members' class field), verify finds it consistent, and HF
    datasets reads it."""
    out = tmp_path / "out"
    shutil.copytree(latin1_out, out)
    res = run_export(out, "all")
    assert res.exit_code == 0, res.output
    card = (out / "README.md").read_bytes().decode("utf-8")
    meta = yaml.safe_load(card.split("---\n")[1])
    (cls,) = [f for f in meta["dataset_info"]["features"] if f["name"] == "cls"]
    assert cls["dtype"]["class_label"]["names"] == {"0": "caf\\xe9", "1": "roses"}
    assert "2 classes (label `i` is the `i`-th): `caf\\xe9`, `roses`." in card
    assert json.loads((out / "shards" / "_info.json").read_text())["num_classes"] == 2
    assert run_verify(out).exit_code == 0
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))["train"]
    assert train.features["cls"].names == ["caf\\xe9", "roses"]
    assert sorted(train["cls"]) == [0, 0, 1, 1]
