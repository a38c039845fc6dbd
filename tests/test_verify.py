"""shardkit.verify and the `shardkit pack` / `shardkit verify` command lines."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit import formats
from shardkit.cli import main
from shardkit.errors import ManifestError
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.doctor.verify import verify

FORMATS = sorted(formats.FORMATS)


def copy_of(packed: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(packed, dst)
    return dst


def middle_of_a_sample(root: Path, split: str = "val") -> tuple[str, int, str]:
    """(shard path, byte position inside a stored image, key) for the format at hand."""
    man = load_manifest(root)
    rec = read_split_records(root, split)[3]
    shard = man["splits"][split]["shards"][rec["shard"]]["path"]
    if man["format"] == "wds":
        return shard, rec["offset"] + rec["size"] // 2, rec["key"]
    data = formats.open_reader(root, man, split, rec["shard"]).read(rec["key"], rec["offset"],
                                                                    rec["size"])
    blob, mid = (root / shard).read_bytes(), rec["size"] // 2
    chunk = bytes(data)[mid:mid + 64]  # 64 bytes of JPEG scan data, unique in the shard
    pos = blob.find(chunk)
    assert pos > 0 and blob.count(chunk) == 1
    return shard, pos + 10, rec["key"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_passes_on_packed_sample(packed_sample, fmt):
    report = verify(packed_sample(fmt))
    assert report.ok, report.problems
    assert report.num_samples == 200
    assert report.num_shards == sum(len(s["shards"]) for s in
                                    load_manifest(packed_sample(fmt))["splits"].values())


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_names_shard_and_key_after_one_flipped_byte(packed_sample, tmp_path, fmt):
    root = copy_of(packed_sample(fmt), tmp_path)
    shard, pos, key = middle_of_a_sample(root)
    with open(root / shard, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))
    report = verify(root)
    assert not report.ok
    assert report.bad_shards == [shard]
    assert "sha256" in report.problems[0] and shard in report.problems[0]
    if fmt == "lmdb":  # a damaged LMDB file is never mapped: only the shard is named
        assert report.bad_keys == []
    else:
        assert report.bad_keys == [key]


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_names_truncated_and_missing_shards(packed_sample, tmp_path, fmt):
    root = copy_of(packed_sample(fmt), tmp_path)
    man = load_manifest(root)
    first, last = man["splits"]["train"]["shards"][0], man["splits"]["train"]["shards"][-1]
    os.truncate(root / first["path"], first["bytes"] // 2)
    (root / last["path"]).unlink()
    report = verify(root)
    assert sorted(report.bad_shards) == sorted([first["path"], last["path"]])
    text = "\n".join(report.problems)
    assert f"{first['path']}: {first['bytes'] // 2} bytes, the manifest says {first['bytes']}" \
        in text
    assert f"{last['path']}: missing" in text


def test_verify_counts_against_split_files(packed_sample, tmp_path):
    root = copy_of(packed_sample("wds"), tmp_path)
    lines = (root / "splits" / "test.jsonl").read_text().splitlines()
    (root / "splits" / "test.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    report = verify(root)
    assert any(f"test.jsonl has {len(lines) - 1} records" in p for p in report.problems)


def test_verify_without_manifest_raises(tmp_path):
    with pytest.raises(ManifestError, match="not a finished shardkit dataset"):
        verify(tmp_path)


# ------------------------------------------------------------------ command lines
def test_verify_cli_exit_codes(packed_sample, tmp_path):
    runner = CliRunner()
    good = runner.invoke(main, ["verify", str(packed_sample("hdf5"))])
    assert good.exit_code == 0 and "OK (" in good.output
    root = copy_of(packed_sample("hdf5"), tmp_path)
    shard = load_manifest(root)["splits"]["val"]["shards"][0]["path"]
    (root / shard).unlink()
    bad = runner.invoke(main, ["verify", str(root)])
    assert bad.exit_code == 1
    assert f"FAIL split 'val' shard {shard}: missing" in bad.output
    missing = runner.invoke(main, ["verify", str(tmp_path)])
    assert missing.exit_code == 2 and "Traceback" not in missing.output
    assert missing.stderr.startswith("Error: ManifestError: ")
    assert "manifest.json not found" in missing.stderr


@pytest.fixture()
def small_src(sample_dir, tmp_path) -> Path:
    src = tmp_path / "src"
    for cls in ("daisy", "roses"):
        (src / cls).mkdir(parents=True)
        for p in sorted((sample_dir / cls).glob("*.jpg"))[:10]:
            (src / cls / p.name).symlink_to(p)
    return src


def test_pack_cli_summary_overwrite_and_errors(small_src, tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    (small_src / "notes.txt").write_text("not a sample")
    args = ["pack", str(small_src), str(out), "--split", "train=0.5,val=0.5", "--shard-samples",
            "4", "--no-progress", "--split-method", "balanced"]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "scanned 20 = packed 20 + quarantined 0" in res.output
    assert "train: 10 samples (0.500), 10 groups, 3 shards [daisy=5, roses=5]" in res.output
    assert "no group rule" in res.output
    assert "ignored entries: 1" in res.output and "ignored notes.txt: " in res.output
    again = runner.invoke(main, args + ["--format", "lmdb"])
    assert again.exit_code == 2 and "Traceback" not in again.output
    assert "already holds a packed dataset" in again.output and "--overwrite" in again.output
    over = runner.invoke(main, args + ["--format", "lmdb", "--overwrite"])
    assert over.exit_code == 0 and load_manifest(out)["format"] == "lmdb"
    bad_split = runner.invoke(main, ["pack", str(small_src), str(tmp_path / "o2"), "--split",
                                     "train=0.5,val=0.4", "--no-progress"])
    assert bad_split.exit_code == 2
    assert "split spec 'train=0.5,val=0.4'" in bad_split.output and "sum to 0.9" in bad_split.output
    no_col = runner.invoke(main, ["pack", str(small_src), str(tmp_path / "o4"), "--metadata",
                                  __file__])
    assert no_col.exit_code == 2 and "needs --group-column" in no_col.output
    bad_fmt = runner.invoke(main, ["pack", str(small_src), str(tmp_path / "o3"), "--format", "zip"])
    assert bad_fmt.exit_code == 2 and "'zip' is not one of" in bad_fmt.output


def test_pack_cli_unknown_labels_listed_with_closest(small_src, tmp_path):
    (small_src / "daisy").rename(small_src / "dasiy")
    (small_src / "Tulip").mkdir()
    (small_src / "Tulip" / "x.jpg").symlink_to(next((small_src / "roses").iterdir()).resolve())
    labels = tmp_path / "labels.yaml"
    labels.write_text("classes: [daisy, roses, tulips]\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["pack", str(small_src), str(out), "--labels", str(labels),
                                    "--no-progress"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "2 label(s) match no class" in res.output
    assert "'dasiy' (closest: 'daisy')" in res.output
    assert "'Tulip' (closest: 'tulips')" in res.output
    assert not out.exists()  # nothing written before the labels are known


def test_pack_cli_group_by_and_wds_cls(small_src, tmp_path):
    import tarfile

    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["pack", str(small_src), str(out), "--split", "train=1.0",
                                    "--group-by", r"^(\w+)/", "--wds-cls", "--shard-bytes", "1MB",
                                    "--no-progress"])
    assert res.exit_code == 0, res.output
    man = load_manifest(out)
    assert man["split"]["group_rule"] == {"kind": "regex", "regex": r"^(\w+)/"}
    assert man["split"]["group_to_split"] == {"daisy": "train", "roses": "train"}
    shards = man["splits"]["train"]["shards"]
    assert len(shards) > 1 and all(s["bytes"] <= 1_000_000 + 20 * 1536 for s in shards)
    with tarfile.open(out / shards[0]["path"]) as tar:
        names = tar.getnames()
    assert names[0] == "train_00000000.jpg" and names[1] == "train_00000000.cls"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_flowers_verify_passes_then_names_damaged_shards(packed_flowers, tmp_path, fmt):
    assert verify(packed_flowers(fmt)).ok
    root = copy_of(packed_flowers(fmt), tmp_path)
    shards = load_manifest(root)["splits"]["train"]["shards"]
    flip, cut, gone = (shards[i]["path"] for i in range(3))
    with open(root / flip, "r+b") as f:
        f.seek(shards[0]["bytes"] // 2)
        b = f.read(1)
        f.seek(shards[0]["bytes"] // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.truncate(root / cut, shards[1]["bytes"] - 1)
    (root / gone).unlink()
    report = verify(root)
    assert sorted(report.bad_shards) == sorted([flip, cut, gone])
    text = "\n".join(report.problems)
    assert f"{flip}: sha256" in text and f"{cut}: {shards[1]['bytes'] - 1} bytes" in text
    assert f"{gone}: missing" in text
    res = CliRunner().invoke(main, ["verify", str(root)])
    assert res.exit_code == 1 and flip in res.output


# ------------------------------------------------- broken datasets: one error line, documented code
def _no_manifest(root: Path) -> str:
    (root / "manifest.json").unlink()
    return "manifest.json not found"


def _manifest_not_object(root: Path) -> str:
    (root / "manifest.json").write_text('["schema_version", 1]\n')
    return "manifest.json is valid JSON but not a JSON object"


def _truncated_jsonl(root: Path) -> str:
    path = root / "splits" / "val.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2 + 7])                 # cut inside a line
    return "splits/val.jsonl holds a line that is not JSON"


def _deleted_shard(root: Path) -> str:
    (shard,) = load_manifest(root)["splits"]["val"]["shards"]  # every command needs it
    (root / shard["path"]).unlink()
    return shard["path"]


# case -> (damage, {command: (exit code, error type on stderr or None)}); exit codes of
# shardkit.doctor.cli: 2 = cannot run (one "Error: <ErrorType>: ..." line on stderr),
# 1 = verify's verdict "damaged" (one FAIL line per problem on stdout), 0 = not affected
# (stats reads the manifest, the index and the shards, never splits/*.jsonl).
BROKEN = {
    "no manifest": (_no_manifest, {c: (2, "ManifestError")
                                   for c in ("verify", "check", "stats", "inspect")}),
    "manifest not an object": (_manifest_not_object, {c: (2, "ManifestError")
                                                      for c in ("verify", "check", "stats",
                                                                "inspect")}),
    "truncated split jsonl": (_truncated_jsonl, {"verify": (1, None), "check": (2, "ManifestError"),
                                                 "stats": (0, None),
                                                 "inspect": (2, "ManifestError")}),
    "deleted shard": (_deleted_shard, {"verify": (1, None), "check": (2, "ShardCorruptError"),
                                       "stats": (2, "ShardCorruptError"),
                                       "inspect": (2, "ShardCorruptError")}),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_dataset_gives_one_line_and_the_documented_exit_code(packed_sample, tmp_path,
                                                                      case):
    root = copy_of(packed_sample("wds"), tmp_path)
    damage, expected = BROKEN[case]
    needle = damage(root)
    args = {"verify": [], "check": ["--no-transforms"], "stats": ["--split", "val", "--no-save"],
            "inspect": ["--split", "val", "--n", "2", "--out", str(tmp_path / "grids")]}
    for command, (code, error_type) in expected.items():
        res = CliRunner().invoke(main, [command, str(root), *args[command]])
        where = f"{command} on {case}: exit {res.exit_code}\n{res.output}"
        assert res.exit_code == code, where
        assert res.exception is None or isinstance(res.exception, SystemExit), where
        assert "Traceback" not in res.output, where
        if code == 2:
            (line,) = res.stderr.splitlines()
            assert line.startswith(f"Error: {error_type}: ") and needle in line, where
            assert res.stdout == "", where
        else:
            assert res.stderr == "", where
        if command == "verify" and code == 1:
            (fail,) = [ln for ln in res.stdout.splitlines() if ln.startswith("FAIL ")]
            assert needle in fail, where
        if command == "stats" and code == 0:
            assert res.stdout.startswith("val: ")
            assert res.stdout.splitlines()[0] == \
                f"val: {load_manifest(root)['splits']['val']['num_samples']} samples"


def test_broken_dataset_error_through_the_installed_command(packed_sample, tmp_path):
    """The real process (not CliRunner): one error line (the last on stderr; only INFO notes such
    as the decoder choice may come before it), exit code 2, no traceback."""
    root = copy_of(packed_sample("wds"), tmp_path)
    shard = _deleted_shard(root)
    proc = subprocess.run([sys.executable, "-m", "shardkit.cli", "check", str(root),
                           "--no-transforms"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    *notes, line = proc.stderr.splitlines()
    assert all(n.startswith("INFO shardkit.") for n in notes), proc.stderr
    assert line.startswith("Error: ShardCorruptError: ") and f"{shard}: missing" in line
    assert proc.stdout == ""


def test_a_stray_shard_file_is_damage(packed_sample, tmp_path):
    """A shard-named file the manifest does not list (a leftover, or a copy) is what glob
    readers (webdataset, DALI) would take: verify names it and exits 1."""
    import shutil

    from click.testing import CliRunner

    from shardkit.cli import main

    out = tmp_path / "ds"
    shutil.copytree(packed_sample("wds"), out)
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0
    shutil.copyfile(out / "shards" / "train-000000.tar", out / "shards" / "train-000099.tar")
    res = CliRunner().invoke(main, ["verify", str(out)])
    assert res.exit_code == 1, res.output
    fails = [line for line in res.output.splitlines() if line.startswith("FAIL ")]
    assert fails == ["FAIL shards/train-000099.tar: a shard file the manifest does not list (a "
                     "leftover of another pack?): readers that glob the shard folder would read "
                     "it; delete it"], res.output


def test_demo_out_below_a_file_is_one_line(tmp_path):
    from shardkit import demo
    from shardkit.errors import ConfigError

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="cannot create the folder"):
        demo.prepare_out(tmp_path / "notes.txt" / "sub")
    assert (tmp_path / "notes.txt").read_text() == "mine"
