"""shardkit.pack on real data: formats, splits, quarantine, crash safety, field cases
5/7/9/11/14/15/24."""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import shutil
import stat
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit import formats
from shardkit.errors import LabelError, OutputExistsError, SourceError
from shardkit.dataset.manifest import load_index, load_manifest, read_split_records
from shardkit.packer.run import pack
from shardkit.packer.cli import pack_command
from shardkit.packer.options import parse_size
from shardkit.doctor.verify import verify

FORMATS = sorted(formats.FORMATS)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def link_folder(dst: Path, files: dict[str, Path]) -> Path:
    """ImageFolder at ``dst`` whose files are symlinks: {"class/name.jpg": source path}."""
    for rel, src in files.items():
        p = dst / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(src)
    return dst


def sample_files(sample_dir: Path, n_per_class: int | None = None) -> list[Path]:
    out = []
    for cls in sorted(p for p in sample_dir.iterdir() if p.is_dir()):
        out += sorted(cls.glob("*.jpg"))[:n_per_class]
    return out


def quarantine(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]


def all_records(out: Path) -> dict[str, list[dict]]:
    man = load_manifest(out)
    return {s: read_split_records(out, s) for s in man["splits"]}


def check_packed(out: Path, src: Path, num_files: int) -> dict:
    """The invariants every packed dataset must satisfy; returns the manifest."""
    man = load_manifest(out)
    recs = all_records(out)
    where_group, where_sha = defaultdict(set), defaultdict(set)
    for split, rs in recs.items():
        for r in rs:
            where_group[r["group"]].add(split)
            where_sha[r["sha256"]].add(split)
    assert max(len(v) for v in where_group.values()) == 1, "a group is in two splits"
    assert max(len(v) for v in where_sha.values()) == 1, "identical bytes are in two splits"
    packed = sum(len(rs) for rs in recs.values())
    q = quarantine(out)
    assert man["source"]["num_files"] == num_files == packed + len(q)
    assert man["source"]["num_packed"] == packed and man["source"]["num_quarantined"] == len(q)
    for split, rs in recs.items():
        info = man["splits"][split]
        assert sum(info["class_counts"]) == info["num_samples"] == len(rs)
        assert info["class_counts"] == [sum(r["label"] == c for r in rs)
                                        for c in range(len(man["classes"]))]
        assert [r["key"] for r in rs] == [f"{split}_{i:08d}" for i in range(len(rs))]
        assert len(load_index(out, split)) == len(rs)
        assert all(0 < s["num_samples"] for s in info["shards"])  # no empty shard (case 5)
        readers = {}
        for r in rs:  # every stored original is byte-identical to its source file
            reader = readers.setdefault(r["shard"],
                                        formats.open_reader(out, man, split, r["shard"]))
            data = bytes(reader.read(r["key"], r["offset"], r["size"]))
            if r["rule"] == "original":
                assert sha(data) == r["sha256"] == sha((src / r["path"]).read_bytes())
        for reader in readers.values():
            reader.close()
    assert verify(out).ok
    return man


# ------------------------------------------------------------------ the embedded sample, fast
@pytest.mark.parametrize("fmt", FORMATS)
def test_sample_packed_in_every_format(packed_sample, sample_dir, fmt):
    out = packed_sample(fmt)
    man = check_packed(out, sample_dir, 200)
    assert man["format"] == fmt
    assert man["classes"] == ["daisy", "dandelion", "roses", "sunflowers", "tulips"]
    assert man["split"]["group_rule"]["column"] == "group_flickr_user"
    assert sorted(man["splits"]) == ["test", "train", "val"]
    assert man["source"]["num_quarantined"] == 0
    assert man["source"]["num_ignored"] == 2  # LICENSE.txt and metadata.csv beside the classes
    assert man["source"]["ignored"] == [
        {"path": n, "reason": "file beside the class folders (not a sample)"}
        for n in ("LICENSE.txt", "metadata.csv")]
    assert sum(man["splits"][s]["num_groups"] for s in man["splits"]) == 120
    with open(sample_dir / "metadata.csv", newline="") as f:
        expected = {r["group_flickr_user"] for r in csv.DictReader(f)}
    assert set(man["split"]["group_to_split"]) == expected
    for s, r in man["split"]["ratios"].items():
        assert abs(man["splits"][s]["num_samples"] / 200 - r) <= man["split"]["tolerance"]
    if fmt == "hdf5":  # case 11: real JPEG bytes hold 0x00 and still round-trip (checked above)
        rec = read_split_records(out, "train")[0]
        data = formats.open_reader(out, man, "train", rec["shard"]).read(rec["key"], rec["offset"],
                                                                         rec["size"])
        assert b"\x00" in bytes(data)


def test_same_seed_same_bytes_any_workers(packed_sample, sample_dir, tmp_path):
    a = load_manifest(packed_sample("wds"))
    pack(sample_dir, tmp_path / "o", format="wds", split={"train": 0.7, "val": 0.15, "test": 0.15},
         metadata=sample_dir / "metadata.csv", group_column="group_flickr_user", shard_samples=32,
         workers=2, progress=False, split_method="balanced")
    b = load_manifest(tmp_path / "o")
    assert [s["sha256"] for s in a["splits"]["train"]["shards"]] == \
        [s["sha256"] for s in b["splits"]["train"]["shards"]]


# ------------------------------------------------------------------ the full flowers set (slow)
@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_flowers_packed_in_every_format(packed_flowers, flowers_dir, fmt):
    out = packed_flowers(fmt)
    man = check_packed(out, flowers_dir, 1839)
    totals = [sum(man["splits"][s]["class_counts"][c] for s in man["splits"]) for c in range(5)]
    assert totals == [361, 409, 276, 365, 428]
    assert len(man["split"]["group_to_split"]) == 791
    assert man["split"]["warnings"] == []


# ------------------------------------------------------------- case 5: shard sizes, kill + resume
def test_case5_shards_10_10_5_and_resume_after_kill(sample_dir, tmp_path, monkeypatch):
    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p
                                         for p in sample_files(sample_dir, 5)})
    opts = dict(format="wds", split={"train": 1.0}, shard_samples=10, progress=False)
    clean = pack(src, tmp_path / "clean", **opts)
    man = load_manifest(tmp_path / "clean")
    assert clean.num_files == 25
    assert [s["num_samples"] for s in man["splits"]["train"]["shards"]] == [10, 10, 5]
    assert sorted(p for p in os.listdir(tmp_path / "clean" / "shards") if p.endswith(".tar")) \
        == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]

    out = tmp_path / "killed"
    real_add, calls = formats.ShardSink.add, []

    def dying_add(self, *a, **k):
        if len(calls) == 12:
            raise KeyboardInterrupt("killed after 12 samples")
        calls.append(1)
        return real_add(self, *a, **k)

    monkeypatch.setattr(formats.ShardSink, "add", dying_add)
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, **opts)
    monkeypatch.undo()
    assert len(calls) == 12 and not out.exists()  # an interrupted run removes what it wrote
    (out / "shards").mkdir(parents=True)  # what a SIGKILL after 12 samples leaves behind
    shutil.copyfile(tmp_path / "clean" / "shards" / "train-000000.tar",
                    out / "shards" / "train-000000.tar")
    (out / "shards" / ".train-000001.tar.tmp").write_bytes(b"half")
    resumed = pack(src, out, **opts)
    assert resumed.cleaned == ["shards/.train-000001.tar.tmp", "shards/train-000000.tar"]
    assert sorted(os.listdir(out / "shards")) == sorted(os.listdir(tmp_path / "clean" / "shards"))
    assert load_manifest(out)["splits"] == man["splits"]  # same shards, same sha256
    check_packed(out, src, 25)


# ------------------------------------------------------------------ case 7: no single-class shards
def test_case7_class_sorted_input_gives_mixed_shards(flowers_dir, tmp_path):
    files = {}
    for new, cls in zip("abcd", ["daisy", "dandelion", "sunflowers", "tulips"]):
        for p in sorted((flowers_dir / cls).glob("*.jpg"))[:250]:
            files[f"{new}/{p.name}"] = p
    src = link_folder(tmp_path / "src", files)
    pack(src, tmp_path / "o", format="wds", split={"train": 1.0}, shard_samples=100, workers=2,
         seed=7, progress=False)
    man = load_manifest(tmp_path / "o")
    assert [s["num_samples"] for s in man["splits"]["train"]["shards"]] == [100] * 10
    hist = defaultdict(Counter)
    for r in read_split_records(tmp_path / "o", "train"):
        hist[r["shard"]][r["label"]] += 1
    for shard, h in hist.items():  # global histogram is 25/25/25/25 per 100
        assert sorted(h) == [0, 1, 2, 3], shard
        assert max(abs(n - 25) for n in h.values()) <= 12, (shard, h)


# ------------------------------------------------------- case 9: LMDB map growth, read-only copy
def test_case9_lmdb_tiny_map_grows_and_reads_from_readonly_copy(sample_dir, tmp_path):
    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p
                                         for p in sample_files(sample_dir)})
    out = tmp_path / "o"
    pack(src, out, format="lmdb", split={"train": 1.0}, shard_samples=150, progress=False,
         writer_options={"initial_map_size": 1 << 20})
    man = load_manifest(out)
    stored = sum(r["size"] for r in read_split_records(out, "train"))
    assert stored > 10 << 20  # 200 photos: ten times the initial 1 MiB map
    assert [s["num_samples"] for s in man["splits"]["train"]["shards"]] == [150, 50]
    for s in man["splits"]["train"]["shards"]:  # compacted: no room left from the doubling
        assert s["bytes"] < 1.25 * stored * s["num_samples"] / 200 + (1 << 20)
    ro = tmp_path / "ro"
    shutil.copytree(out, ro)
    for dirpath, _, names in os.walk(ro):
        for n in names:
            os.chmod(Path(dirpath) / n, 0o444)
    for dirpath, _, _ in sorted(os.walk(ro), reverse=True):
        os.chmod(dirpath, 0o555)
    try:
        assert not list(ro.rglob("lock.mdb")) and not list(ro.rglob("*-lock"))
        report = verify(ro)
        assert report.ok and report.num_samples == 200, report.problems
    finally:
        for dirpath, _, _ in os.walk(ro):
            os.chmod(dirpath, stat.S_IRWXU)


# ------------------------------------------------------- cases 11 and 14: bad files quarantined
def test_case11_14_empty_tiny_truncated_files_quarantined(sample_dir, awkward_dir, tmp_path):
    photos = sample_files(sample_dir, 2)[:6]
    src = link_folder(tmp_path / "src", {f"a/{p.name}": p for p in photos})
    (src / "a" / "zero.jpg").write_bytes(b"")
    (src / "a" / "one.jpg").write_bytes(b"\xff")
    first = photos[0].read_bytes()
    (src / "a" / "trunc60.jpg").write_bytes(first[: len(first) * 6 // 10])
    png = (awkward_dir / "png_rgba.png").read_bytes()
    (src / "a" / "trunc.png").write_bytes(png[: len(png) // 2])
    summary = pack(src, tmp_path / "o", format="hdf5", split={"train": 1.0}, progress=False)
    q = {e["path"]: e for e in quarantine(tmp_path / "o")}
    assert sorted(q) == ["a/one.jpg", "a/trunc.png", "a/trunc60.jpg", "a/zero.jpg"]
    assert q["a/zero.jpg"]["reason"] == "empty file (0 bytes)" and q["a/zero.jpg"]["size"] == 0
    assert q["a/one.jpg"]["reason"] == "not an image (sniffed: unknown)"
    assert q["a/one.jpg"]["sha256"] == sha(b"\xff")
    assert "truncated" in q["a/trunc60.jpg"]["reason"].lower()
    assert "png" in q["a/trunc.png"]["reason"].lower()
    assert summary.num_packed == 6 and summary.num_quarantined == 4
    assert summary.quarantine_reasons["empty file"] == 1
    check_packed(tmp_path / "o", src, 10)
    with pytest.raises(SourceError, match="one.jpg: rejected .*--fail-fast stops at the first"):
        pack(src, tmp_path / "ff", format="hdf5", split={"train": 1.0}, fail_fast=True,
             progress=False)
    assert not (tmp_path / "ff" / "manifest.json").exists()


def test_fail_fast_stops_at_the_first_rejected_file(sample_dir, tmp_path, monkeypatch):
    """--fail-fast: the check stops at the first reject in scan order (the files after it are
    not checked), exit 2 with one line naming it and its reason, nothing written; the same
    file is named with --workers 2; a dangling link stops it before any file is read."""
    import shardkit.packer.check as pack_check

    photos = sample_files(sample_dir, 6)  # 6 per class; daisy sorts first
    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p for p in photos})
    (src / "dandelion" / "0_broken.jpg").write_bytes(b"\xff")  # 7th file in scan order
    (src / "tulips" / "0_empty.jpg").write_bytes(b"")
    calls = []
    real = pack_check._check_one
    monkeypatch.setattr(pack_check, "_check_one", lambda job, got=None: calls.append(job[1]) or
                        real(job, got))
    line = (f"Error: SourceError: {src / 'dandelion' / '0_broken.jpg'}: rejected (not an image "
            "(sniffed: unknown)); --fail-fast stops at the first rejected file, nothing was "
            "written")
    for workers in ("1", "2"):
        out = tmp_path / f"o{workers}"
        res = CliRunner().invoke(pack_command, [str(src), str(out), "--fail-fast", "--workers",
                                                workers, "--no-progress"])
        assert res.exit_code == 2 and res.output.strip().splitlines() == [line], res.output
        assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]
        if workers == "1":  # in this process: the 6 daisy photos, the reject, nothing after
            assert calls == sorted(calls) and len(calls) == 7
            assert calls[-1] == "dandelion/0_broken.jpg"
    calls.clear()
    (src / "daisy" / "0_gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(SourceError, match=r"0_gone.jpg: rejected \(file not found\); "
                                          "--fail-fast stops"):
        pack(src, tmp_path / "o3", fail_fast=True, progress=False)
    assert calls == []


# ------------------------------------------------------------------ case 15 + awkward folder
def test_awkward_folder_accepts_packed_rejects_quarantined(awkward_dir, tmp_path):
    with open(awkward_dir / "EXPECTED.csv", newline="") as f:
        expected = {r["file"]: r for r in csv.DictReader(f)}
    src = link_folder(tmp_path / "src", {f"misc/{name}": awkward_dir / name for name in expected})
    summary = pack(src, tmp_path / "o", format="wds", split={"train": 1.0}, progress=False)
    packed = {r["path"].split("/", 1)[1]: r for r in read_split_records(tmp_path / "o", "train")}
    q = {e["path"].split("/", 1)[1]: e for e in quarantine(tmp_path / "o")}
    assert len(packed) + len(q) == len(expected) == summary.num_files == 27
    for name, row in expected.items():
        if row["expect"] == "accept":
            assert name in packed, (name, q.get(name))
            w, h = map(int, row["upright_size"].split("x"))
            assert (packed[name]["width"], packed[name]["height"]) == (w, h), name
        elif row["expect"] == "reject":
            assert name in q and q[name]["reason"], name
    assert packed["exif_orientation_6.jpg"]["rule"].startswith("exif-transpose")
    assert packed["png_disguised_as.jpg"]["ext"] == "png"
    assert q["huge_10000x10000_gray.png"]["reason"].startswith("over --max-pixels")
    assert q["zero_bytes.jpg"]["reason"] == "empty file (0 bytes)"
    man = load_manifest(tmp_path / "o")
    assert "exif-transpose" in man["normalization"]["rules"]
    assert verify(tmp_path / "o").ok


# ----------------------------------------------------------- case 24: group prefix + duplicates
def _case24_folder(sample_dir: Path, root: Path) -> tuple[Path, Path]:
    photos = sample_files(sample_dir)
    files, k = {}, 0
    for g, size in zip("ABCDE", [50, 30, 10, 5, 5]):
        for i in range(size):
            files[f"{'ab'[i % 2]}/subj{g}_{i:04d}.jpg"] = photos[k]
            k += 1
    dup = photos[50 + 30]  # subjC_0000.jpg, class "a"
    files["a/subjD_0100.jpg"] = dup
    files["a/subjE_0100.jpg"] = dup
    files["b/subjA_0100.jpg"] = dup  # same bytes, other class
    return link_folder(root, files), dup


def test_case24_label_conflict_is_an_error_by_default(sample_dir, tmp_path):
    src, _ = _case24_folder(sample_dir, tmp_path / "src")
    with pytest.raises(LabelError) as err:
        pack(src, tmp_path / "o", split="train=0.7,val=0.15,test=0.15", group_by=r"subj(\w)_",
             progress=False)
    msg = str(err.value)
    assert "b/subjA_0100.jpg" in msg and "a/subjC_0000.jpg" in msg and "['a', 'b']" in msg
    assert not (tmp_path / "o" / "shards").exists()


@pytest.mark.parametrize("policy", ["keep", "quarantine"])
def test_case24_group_split_dedup_and_infeasibility(sample_dir, tmp_path, policy):
    src, dup = _case24_folder(sample_dir, tmp_path / "src")
    out = tmp_path / "o"
    summary = pack(src, out, split="train=0.7,val=0.15,test=0.15", group_by=r"subj(\w)_", seed=0,
                   on_label_conflict=policy, progress=False, split_method="balanced")
    man = check_packed(out, src, 103)
    assert len(summary.label_conflicts) == 1
    assert summary.label_conflicts[0]["sha256"] == sha(dup.read_bytes())
    assert summary.num_duplicates == (3 if policy == "keep" else 0)
    counts = {s: man["splits"][s]["num_samples"] for s in man["splits"]}
    if policy == "keep":  # A, C, D, E joined by the copies: sets of 73 and 30 samples
        assert man["split"]["merged_groups"] == [["A", "C", "D", "E"]]
        assert counts == {"train": 73, "val": 30, "test": 0}
    else:  # the 4 copies quarantined; sets 50/30/9/5/5 (99 samples)
        assert [e["path"] for e in quarantine(out)] == [
            "a/subjC_0000.jpg", "a/subjD_0100.jpg", "a/subjE_0100.jpg", "b/subjA_0100.jpg"]
        assert all(e["reason"].startswith("label_conflict") for e in quarantine(out))
        assert counts == {"train": 80, "val": 9, "test": 10}
    assert any("infeasible" in w or "empty" in w for w in summary.warnings)
    assert man["split"]["warnings"] and man["split"]["seed"] == 0
    assert set(man["split"]["group_to_split"]) == set("ABCDE")


# ------------------------------------------------------------------ output folder rules
def test_output_exists_and_overwrite(sample_dir, tmp_path):
    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p
                                         for p in sample_files(sample_dir, 2)})
    pack(src, tmp_path / "o", format="wds", split={"train": 1.0}, progress=False)
    with pytest.raises(OutputExistsError, match="--overwrite"):
        pack(src, tmp_path / "o", format="lmdb", split={"train": 1.0}, progress=False)
    assert load_manifest(tmp_path / "o")["format"] == "wds"
    (tmp_path / "o" / "notes.txt").write_text("mine")
    pack(src, tmp_path / "o", format="lmdb", split={"train": 1.0}, overwrite=True, progress=False)
    assert load_manifest(tmp_path / "o")["format"] == "lmdb"
    assert sorted(os.listdir(tmp_path / "o" / "shards")) == ["train-000000.lmdb"]
    assert (tmp_path / "o" / "notes.txt").read_text() == "mine"  # not ours: left alone


def test_parse_size():
    assert parse_size("64MB") == 64_000_000 and parse_size("64MiB") == 64 << 20
    assert parse_size("1.5k") == 1500 and parse_size(77) == 77 and parse_size(None) is None
    with pytest.raises(Exception, match="'lots'"):
        parse_size("lots")


# ------------------------------------------------------------------ CSV source, strict, pixel limit
def test_csv_source_with_groups_and_a_missing_row(sample_dir, tmp_path):
    photos = sample_files(sample_dir, 4)
    lines = ["path,label,group"] + [f"{p},{p.parent.name},g{i // 3}" for i, p in enumerate(photos)]
    lines.append(f"{tmp_path / 'gone.jpg'},daisy,g99")
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    summary = pack(tmp_path / "list.csv", tmp_path / "o", split={"train": 0.5, "val": 0.5},
                   progress=False)
    man = load_manifest(tmp_path / "o")
    assert man["source"]["kind"] == "csv" and man["split"]["group_rule"]["column"] == "group"
    assert summary.num_files == len(photos) + 1 == summary.num_packed + 1
    assert quarantine(tmp_path / "o") == [{"path": "gone.jpg", "reason": "file not found"}]
    assert set(man["split"]["group_to_split"]) == {f"g{i}" for i in range((len(photos) + 2) // 3)}
    assert verify(tmp_path / "o").ok


def test_a_file_symlink_loop_is_quarantined_naming_the_loop(sample_dir, tmp_path):
    """a.jpg -> b.jpg -> a.jpg in SRC: the pack goes on (exit 0) and quarantines both links
    with the loop as reason, as it quarantines a dangling link ("file not found")."""
    photos = sample_files(sample_dir, 3)
    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p for p in photos})
    os.symlink("b.jpg", src / "daisy" / "a.jpg")
    os.symlink("a.jpg", src / "daisy" / "b.jpg")
    os.symlink(tmp_path / "nowhere.jpg", src / "roses" / "dangling.jpg")
    res = CliRunner().invoke(pack_command, [str(src), str(tmp_path / "o"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert quarantine(tmp_path / "o") == [
        {"path": "daisy/a.jpg", "reason": "symlink loop: a.jpg -> b.jpg -> a.jpg"},
        {"path": "daisy/b.jpg", "reason": "symlink loop: b.jpg -> a.jpg -> b.jpg"},
        {"path": "roses/dangling.jpg", "reason": "file not found"}]
    assert f"scanned {len(photos) + 3} = packed {len(photos)} + quarantined 3 (file not " \
        "found=1, symlink loop=2)" in res.output
    check_packed(tmp_path / "o", src, len(photos) + 3)


def test_strict_rejects_what_decodes_only_with_warnings(awkward_dir, sample_dir, tmp_path):
    files = {"x/corrupt_scan_data.jpg": awkward_dir / "corrupt_scan_data.jpg"}
    files.update({f"x/{p.name}": p for p in sample_files(sample_dir, 1)})
    src = link_folder(tmp_path / "src", files)
    lax = pack(src, tmp_path / "lax", split={"train": 1.0}, progress=False)
    assert lax.num_with_warnings == 1 and "packed with decoder warnings: 1" in lax.format_text()
    rec = {r["path"]: r for r in read_split_records(tmp_path / "lax", "train")}
    assert rec["x/corrupt_scan_data.jpg"]["warnings"]  # packed, its warnings recorded
    pack(src, tmp_path / "strict", split={"train": 1.0}, strict=True, progress=False)
    q = quarantine(tmp_path / "strict")
    assert [e["path"] for e in q] == ["x/corrupt_scan_data.jpg"]
    assert "(strict)" in q[0]["reason"]


def test_max_pixels_limit_quarantines_large_images(awkward_dir, sample_dir, tmp_path):
    files = {"x/tiny.tiff": awkward_dir / "tiff_multipage.tiff"}
    files.update({f"x/{p.name}": p for p in sample_files(sample_dir, 1)})
    src = link_folder(tmp_path / "src", files)
    summary = pack(src, tmp_path / "o", split={"train": 1.0}, max_pixels=10_000, progress=False)
    assert summary.num_packed == 1 and summary.quarantine_reasons == {"over --max-pixels": 5}
    assert [r["path"] for r in read_split_records(tmp_path / "o", "train")] == ["x/tiny.tiff"]


def test_a_crashing_check_worker_raises_instead_of_hanging(sample_dir, tmp_path, monkeypatch):
    import shardkit.packer.check as pack_check

    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p
                                         for p in sample_files(sample_dir, 2)})
    monkeypatch.setattr(pack_check, "_check_one", _die_in_worker)
    with pytest.raises(SourceError, match="check worker process died"):
        pack(src, tmp_path / "o", split={"train": 1.0}, workers=2, progress=False)
    assert not (tmp_path / "o").exists()


def _die_in_worker(*_args):
    os._exit(3)  # what a segfaulting decoder looks like to the pool


def test_label_map_order_and_aliases(sample_dir, tmp_path):
    files = {f"Rose/{p.name}": p for p in sorted((sample_dir / "roses").glob("*.jpg"))[:3]}
    files.update({f"daisy/{p.name}": p for p in sorted((sample_dir / "daisy").glob("*.jpg"))[:2]})
    src = link_folder(tmp_path / "src", files)
    (tmp_path / "labels.yaml").write_text(
        "classes: [tulips, roses, daisy]\naliases: {Rose: roses}\n")
    summary = pack(src, tmp_path / "o", split={"train": 1.0}, labels=tmp_path / "labels.yaml",
                   progress=False)
    man = load_manifest(tmp_path / "o")
    assert man["classes"] == ["tulips", "roses", "daisy"]
    assert man["label_aliases"] == {"Rose": "roses"}
    assert man["splits"]["train"]["class_counts"] == [0, 3, 2]
    assert summary.splits["train"]["class_counts"] == [0, 3, 2]
    labels = {r["path"].split("/")[0]: r["label"]
              for r in read_split_records(tmp_path / "o", "train")}
    assert labels == {"Rose": 1, "daisy": 2}


def test_case5_real_sigkill_mid_shard_then_rerun(sample_dir, tmp_path):
    import subprocess
    import sys

    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p
                                         for p in sample_files(sample_dir, 5)})
    out = tmp_path / "o"
    script = f"""
import os, signal
from shardkit import formats
from shardkit import pack
real, n = formats.ShardSink.add, [0]
def add(self, *a, **k):
    if n[0] == 12:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind runs
    n[0] += 1
    return real(self, *a, **k)
formats.ShardSink.add = add
pack({str(src)!r}, {str(out)!r}, format="wds", split={{"train": 1.0}}, shard_samples=10,
     progress=False)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert sorted(p.name for p in (out / "shards").iterdir()) == [
        ".train-000001.tar.tmp", "train-000000.tar"]  # half-written shard under its temp name
    assert not (out / "manifest.json").exists()
    summary = pack(src, out, format="wds", split={"train": 1.0}, shard_samples=10, progress=False)
    assert summary.cleaned == ["quarantine.jsonl", "shards/.train-000001.tar.tmp",
                               "shards/train-000000.tar"]
    assert "removed from OUT before writing (left by an unfinished run): quarantine.jsonl, " \
        "shards/.train-000001.tar.tmp, shards/train-000000.tar" in summary.format_text()
    assert sorted(os.listdir(out)) == ["manifest.json", "quarantine.jsonl", "shards", "splits"]
    assert sorted(p for p in os.listdir(out / "shards") if p.endswith(".tar")) == [
        "train-000000.tar", "train-000001.tar", "train-000002.tar"]
    check_packed(out, src, 25)


def test_default_shard_plan_by_bytes(sample_dir, tmp_path, monkeypatch):
    """The default plan raises a split's shard count where its bytes need it: 20 photos of
    ~1.2 MB with a 300 kB target average are 5 shards by bytes -> 8 (a power of two), so
    ceil(20 / 8) = 3 samples per shard, the last holding the rest: 7 shards (fewer than 8 only
    because a shard holds fewer samples than there are shards)."""
    import shardkit.packer.shards as pack_shards

    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p
                                         for p in sample_files(sample_dir, 4)})
    monkeypatch.setattr(pack_shards, "DEFAULT_SHARD_BYTES", 300_000)
    pack(src, tmp_path / "o", format="hdf5", split={"train": 1.0}, progress=False)
    recs = read_split_records(tmp_path / "o", "train")
    total = sum(r["size"] for r in recs)
    assert 4 * 300_000 < total <= 8 * 300_000  # the premise: 5-8 shards by bytes
    per_shard = Counter(r["shard"] for r in recs)
    assert [per_shard[k] for k in sorted(per_shard)] == [3, 3, 3, 3, 3, 3, 2]
    assert [s["num_samples"] for s in load_manifest(tmp_path / "o")["splits"]["train"][
        "shards"]] == [3, 3, 3, 3, 3, 3, 2]


# ------------------------------------------------------------------ new-user reports
def copy_folder(dst: Path, files: dict[str, Path]) -> Path:
    """ImageFolder at ``dst`` holding copies: {"class/name.jpg": source path}."""
    for rel, src in files.items():
        p = dst / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, p)
    return dst


def _strict_json_lines(path: Path) -> list[dict]:
    """Lines of a JSONL file, insisting that the file is valid UTF-8."""
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()]


def test_non_utf8_file_names_are_packed_quarantined_ignored_and_printed(sample_dir, tmp_path,
                                                                        caplog):
    photos = {c: sorted((sample_dir / c).glob("*.jpg"))[:3] for c in ("daisy", "roses", "tulips")}
    src = copy_folder(tmp_path / "src", {f"{c}/{p.name}": p for c in ("daisy", "roses")
                                         for p in photos[c]})
    daisy = os.fsencode(str(src / "daisy"))
    latin1 = photos["tulips"][0].read_bytes()  # a real photo, bytes unlike any other file here
    with open(os.path.join(daisy, b"caf\xe9_latin1.jpg"), "wb") as f:
        f.write(latin1)
    with open(os.path.join(daisy, b"r\xe9sum\xe9.txt"), "wb") as f:  # quarantined: not an image
        f.write(b"some notes\n")
    with open(os.path.join(daisy, b".caf\xe9"), "wb") as f:  # ignored: hidden
        f.write(b"x")
    out = tmp_path / "o"
    with caplog.at_level(logging.DEBUG, logger="shardkit.pack"):
        summary = pack(src, out, format="wds", split={"train": 1.0}, progress=True)
    logged = caplog.text
    assert summary.num_packed == 7 and summary.num_quarantined == 1 and summary.num_ignored == 1
    man = check_packed(out, src, 8)
    for name in ("manifest.json", "splits/train.jsonl", "quarantine.jsonl"):
        (out / name).read_bytes().decode("utf-8")  # valid UTF-8 (raises otherwise)
    json.loads((out / "manifest.json").read_bytes().decode("utf-8"))
    recs = _strict_json_lines(out / "splits/train.jsonl")
    by_name = {os.fsencode(r["path"]): r for r in recs}
    rec = by_name[b"daisy/caf\xe9_latin1.jpg"]
    assert rec["sha256"] == sha(latin1) and rec["label"] == man["classes"].index("daisy")
    assert rec["key"].startswith("train_") and rec["key"].isascii() and "." not in rec["key"]
    reader = formats.open_reader(out, man, "train", rec["shard"])
    assert bytes(reader.read(rec["key"], rec["offset"], rec["size"])) == latin1
    reader.close()
    (q,) = _strict_json_lines(out / "quarantine.jsonl")
    assert os.fsencode(q["path"]) == b"daisy/r\xe9sum\xe9.txt"
    assert q["reason"].startswith("not an image") and q["sha256"] == sha(b"some notes\n")
    (ign,) = man["source"]["ignored"]
    assert os.fsencode(ign["path"]) == b"daisy/.caf\xe9"
    assert ign["reason"] == "hidden entry (dot-name)"
    for text in (summary.format_text(), logged):  # the summary shows the name escaped
        assert "daisy/.caf\\udce9: hidden entry" in text
        assert "scanned 8 = packed 7 + quarantined 1" in text
    res = CliRunner().invoke(pack_command, [str(src), str(tmp_path / "cli"), "--split", "train=1"])
    assert res.exit_code == 0, res.output
    assert summary.format_text().replace(str(out), str(tmp_path / "cli")) in res.output


def _group_tree(sample_dir: Path, root: Path) -> Path:
    """daisy/roses with subjA..subjD_<n>.jpg photos, plus daisy/notes.txt."""
    files = {}
    for c, cls in enumerate(("daisy", "roses")):
        for k, p in enumerate(sorted((sample_dir / cls).glob("*.jpg"))[:4]):
            files[f"{cls}/subj{'ABCD'[k]}_{c}.jpg"] = p
    src = copy_folder(root, files)
    (src / "daisy" / "notes.txt").write_text("taken in May\n")
    return src


def test_non_image_without_group_is_quarantined_not_a_group_error(sample_dir, tmp_path):
    src = _group_tree(sample_dir, tmp_path / "src")
    summary = pack(src, tmp_path / "o", split={"train": 0.5, "val": 0.5}, group_by=r"/(subj\w)_",
                   progress=False)
    assert [(e["path"], e["reason"]) for e in quarantine(tmp_path / "o")] == [
        ("daisy/notes.txt", "not an image (sniffed: unknown)")]
    man = check_packed(tmp_path / "o", src, 9)
    assert summary.num_packed == 8 and sorted(man["split"]["group_to_split"]) == [
        "subjA", "subjB", "subjC", "subjD"]
    # a real image the regex does not match is still an error that names it (and only it)
    shutil.copyfile(sorted((sample_dir / "tulips").glob("*.jpg"))[0],
                    src / "daisy" / "my photo with spaces.jpg")
    with pytest.raises(SourceError, match=r"gives no group for 1: 'daisy/my photo with spaces.jpg'"
                       r" path\(s\)$"):
        pack(src, tmp_path / "o2", split={"train": 0.5, "val": 0.5}, group_by=r"/(subj\w)_",
             progress=False)
    assert not (tmp_path / "o2").exists()


def test_non_image_without_metadata_row_is_quarantined_not_an_error(sample_dir, tmp_path):
    src = _group_tree(sample_dir, tmp_path / "src")
    meta = tmp_path / "meta.csv"
    rows = [f"{p.relative_to(src).as_posix()},{p.stem.split('_')[0]}"
            for p in sorted(src.glob("*/*.jpg"))]
    meta.write_text("path,who\n" + "\n".join(rows) + "\n")
    pack(src, tmp_path / "o", split={"train": 0.5, "val": 0.5}, metadata=meta, group_column="who",
         workers=2, progress=False)
    assert [(e["path"], e["reason"]) for e in quarantine(tmp_path / "o")] == [
        ("daisy/notes.txt", "not an image (sniffed: unknown)")]
    check_packed(tmp_path / "o", src, 9)
    shutil.copyfile(sorted((sample_dir / "tulips").glob("*.jpg"))[0], src / "roses" / "extra.jpg")
    with pytest.raises(SourceError, match=r"no row or an empty 'who' for 1 file\(s\)\. Files "
                                          r"without a row: 1: 'roses/extra.jpg'"):
        pack(src, tmp_path / "o2", split={"train": 0.5, "val": 0.5}, metadata=meta,
             group_column="who", progress=False)


def test_ignored_entries_are_listed_in_the_manifest(sample_dir, tmp_path):
    photos = sorted((sample_dir / "daisy").glob("*.jpg"))[:2] + \
        sorted((sample_dir / "roses").glob("*.jpg"))[:2]
    src = copy_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p for p in photos})
    (src / "daisy" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (src / "LICENSE").write_text("CC-BY\n")
    (src / "__MACOSX" / "daisy").mkdir(parents=True)
    (src / "__MACOSX" / "daisy" / "._x.jpg").write_bytes(b"\x00\x05\x16\x07")
    (src / "empty").mkdir()
    summary = pack(src, tmp_path / "o", split={"train": 1.0}, progress=False)
    man = check_packed(tmp_path / "o", src, 4)
    assert man["source"]["num_ignored"] == 4 == summary.num_ignored
    assert {e["path"]: e["reason"] for e in man["source"]["ignored"]} == {
        "LICENSE": "file beside the class folders (not a sample)",
        "__MACOSX": "macOS archive metadata (__MACOSX)",
        "daisy/.DS_Store": "hidden entry (dot-name)",
        "empty": "empty class folder (no files)"}
    assert "empty" not in man["classes"]


def test_warns_about_a_class_without_samples_in_a_split(sample_dir, tmp_path):
    photos = sorted((sample_dir / "daisy").glob("*.jpg"))[:3] + \
        sorted((sample_dir / "roses").glob("*.jpg"))[:3]
    src = copy_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p for p in photos})
    (tmp_path / "labels.yaml").write_text("classes: [daisy, dandelion, roses]\n")
    summary = pack(src, tmp_path / "o", split={"train": 1.0}, labels=tmp_path / "labels.yaml",
                   progress=False)
    man = load_manifest(tmp_path / "o")
    assert man["splits"]["train"]["class_counts"] == [3, 0, 3]
    msg = "class 'dandelion' has no samples in split 'train'"
    assert msg in summary.warnings and msg in man["split"]["warnings"]
    assert f"  warning: {msg}" in summary.format_text()
    assert not any("only one class" in w for w in summary.warnings)


def test_a_100k_class_label_map_gives_one_warning_per_split_and_a_small_manifest(sample_dir,
                                                                                  tmp_path):
    """labels.yaml with the 5 real classes and 99,995 unused ones: each split gets ONE warning
    counting its classes without samples and naming the first 20 (not one per class: 300,000
    lines, a 21 MB manifest); the summary lists at most 20 class counts per split."""
    names = ["daisy", "dandelion", "roses", "sunflowers", "tulips"] + \
        [f"class_{i:06d}" for i in range(99_995)]
    (tmp_path / "labels.yaml").write_text("classes:\n" + "".join(f"- {n}\n" for n in names))
    photos = sample_files(sample_dir, 4)
    src = link_folder(tmp_path / "src", {f"{p.parent.name}/{p.name}": p for p in photos})
    summary = pack(src, tmp_path / "o", labels=tmp_path / "labels.yaml", near_duplicates="off",
                   split={"train": 0.5, "val": 0.5}, progress=False)
    man = load_manifest(tmp_path / "o")
    assert man["classes"] == names
    expected = []
    for split, info in man["splits"].items():
        empty = [c for c, n in zip(names, info["class_counts"]) if n == 0]
        assert len(empty) >= 99_995
        expected.append(f"{len(empty)} of 100000 classes have no samples in split {split!r}: "
                        + ", ".join(repr(c) for c in empty[:20])
                        + f" and {len(empty) - 20} more (the split's class_counts has them all)")
    warned = [w for w in man["split"]["warnings"] if "no samples in split" in w]
    assert warned == expected and len(man["split"]["warnings"]) <= len(expected) + 2
    assert all(w in summary.warnings for w in expected)
    # the manifest holds the 100,000 names and 2 x 100,000 counts, little else
    assert (tmp_path / "o" / "manifest.json").stat().st_size < 60 * len(names)
    text = summary.format_text()
    assert len(text) < 10_000 and "99995 classes without samples (the manifest's class_counts" \
        in text


def test_summary_warns_about_splits_with_fewer_shards_than_reader_processes(sample_dir,
                                                                           tmp_path):
    """The embedded sample with the default plan: train (161 samples) is 2 shards, val and test
    one each; the summary (not the manifest's split warnings) says so in one line."""
    summary = pack(sample_dir, tmp_path / "o", near_duplicates="off", progress=False)
    man = load_manifest(tmp_path / "o")
    counts = {s: len(info["shards"]) for s, info in man["splits"].items()}
    assert counts == {"train": 2, "val": 1, "test": 1}
    (w,) = [w for w in summary.warnings if "fewer than 8 shards" in w]
    assert w.startswith("split(s) with fewer than 8 shards: train (2), val (1), test (1). ")
    assert f"  warning: {w}" in summary.format_text()
    assert not [x for x in man["split"]["warnings"] if "shards" in x]


def test_warns_about_a_single_class(sample_dir, tmp_path):
    photos = sorted((sample_dir / "daisy").glob("*.jpg"))[:4]
    src = copy_folder(tmp_path / "src", {f"daisy/{p.name}": p for p in photos})
    summary = pack(src, tmp_path / "o", split={"train": 1.0}, progress=False)
    man = load_manifest(tmp_path / "o")
    assert man["classes"] == ["daisy"]
    (w,) = [w for w in summary.warnings if "class" in w and "group" not in w]
    assert w.startswith("only one class: classification needs at least 2")
    assert w in man["split"]["warnings"] and f"  warning: {w}" in summary.format_text()
