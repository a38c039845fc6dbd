"""The manifest's ``writer`` section (shardkit.dataset.writer_config): every writer option a pack
was given is recorded, checked on load, and read back by interop instead of the tar headers;
manifests without the section (packed before it existed) still load and export.

Real packs of the embedded sample (the full 200 photos through the CLI flags; a 24-photo subset
of it where the question is only what one option does).
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardkit.interop as interop
import shardkit.interop.shards as interop_shards
from shardkit.cli import main as cli_main
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.dataset.writer_config import WRITER_FIELD, WriterConfig
from shardkit.errors import ConfigError, ManifestError, ShardCorruptError
from shardkit.interop.check import check_reader_files
from shardkit.packer.options import PackOptions
from shardkit.packer.run import pack

SMALL = {"train": 0.5, "val": 0.5}


def cli(*args: str):
    return CliRunner().invoke(cli_main, [str(a) for a in args])


def members_of(shard: Path) -> dict[str, list[str]]:
    """``{key: [member extensions in tar order]}`` of one tar, read by Python's tarfile."""
    out: dict[str, list[str]] = {}
    with tarfile.open(shard) as tar:
        for m in tar:
            key, ext = m.name.split(".", 1)
            out.setdefault(key, []).append(ext)
    return out


def all_members(out: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for shard in sorted((out / "shards").glob("*.tar")):
        found.update(members_of(shard))
    return found


def edit_manifest(out: Path, change) -> None:
    man = json.loads((out / "manifest.json").read_text())
    change(man)
    (out / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")


def no_shard_opened(monkeypatch) -> None:
    """Every way interop reads a tar fails from here on (the test then proves none was used)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a shard was opened")

    monkeypatch.setattr(tarfile, "open", refuse)
    monkeypatch.setattr(interop, "scan", refuse)
    monkeypatch.setattr(interop_shards, "sample_members", refuse)


@pytest.fixture(scope="module")
def small_src(sample_dir, tmp_path_factory) -> Path:
    """24 photos of the sample, 8 of each of three classes."""
    src = tmp_path_factory.mktemp("writer-src") / "flowers"
    for cls in ("daisy", "roses", "tulips"):
        (src / cls).mkdir(parents=True)
        for p in sorted((sample_dir / cls).glob("*.jpg"))[:8]:
            shutil.copyfile(p, src / cls / p.name)
    return src


@pytest.fixture(scope="module")
def given_flags(sample_dir, tmp_path_factory) -> Path:
    """The whole sample through `shardkit pack --no-wds-cls --wds-json --max-side 128
    --jpeg-quality 90 --shard-samples 50`."""
    out = tmp_path_factory.mktemp("writer") / "flags"
    res = cli("pack", sample_dir, out, "--no-wds-cls", "--wds-json", "--max-side", "128",
              "--jpeg-quality", "90", "--shard-samples", "50", "--no-progress")
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def bare(small_src, tmp_path_factory) -> Path:
    """``--no-wds-cls`` without ``--wds-json``: no tool can read labels from the tars."""
    out = tmp_path_factory.mktemp("writer") / "bare"
    res = cli("pack", small_src, out, "--no-wds-cls", "--split", "train=0.5,val=0.5",
              "--no-progress")
    assert res.exit_code == 0, res.output
    return out


# ------------------------------------------------------------------ what pack records
def test_the_manifest_records_each_writer_option_as_given(given_flags):
    man = load_manifest(given_flags)
    assert man[WRITER_FIELD] == {"options": {"wds_cls": False, "wds_json": True},
                                 "max_side": 128, "jpeg_quality": 90, "shard_samples": 50,
                                 "shard_bytes": None}
    config = WriterConfig.from_manifest(man)
    assert config == WriterConfig("wds", {"wds_cls": False, "wds_json": True}, 128, 90, 50,
                                  None, recorded=True)
    assert config.tar_members() == ("json",)
    assert config.every_sample_has("json") and not config.every_sample_has("cls")
    # ... and it is what the stored bytes say
    members = all_members(given_flags)
    assert len(members) == 200 and set(map(tuple, members.values())) == {("jpg", "json")}
    shards = [s for info in man["splits"].values() for s in info["shards"]]
    assert max(s["num_samples"] for s in shards) == 50 and len(shards) >= 4
    rec = next(r for r in read_split_records(given_flags, "train")
               if "original_width" in r)  # a photo over 128 px, stored downscaled
    assert max(rec["width"], rec["height"]) == 128 and rec["rule"].endswith("downscaled+jpeg")
    assert man["normalization"]["max_side"] == 128
    assert man["normalization"]["jpeg_quality"] == 90


def test_defaults_and_shard_bytes_are_recorded_as_given(small_src, tmp_path):
    """The pack default (wds with .cls, the default shard plan) and an lmdb pack with
    --shard-bytes and writer_options: each value as pack resolved it, and the shards agree."""
    out = tmp_path / "default"
    pack(small_src, out, split=SMALL, progress=False)
    assert load_manifest(out)[WRITER_FIELD] == {
        "options": {"wds_cls": True, "wds_json": False}, "max_side": None, "jpeg_quality": 95,
        "shard_samples": None, "shard_bytes": None}
    assert set(map(tuple, all_members(out).values())) == {("jpg", "cls")}
    lmdb = tmp_path / "lmdb"
    pack(small_src, lmdb, format="lmdb", split=SMALL, shard_bytes="200kB",
         writer_options={"initial_map_size": 1 << 20}, progress=False)
    man = load_manifest(lmdb)
    assert man[WRITER_FIELD] == {"options": {"initial_map_size": 1 << 20}, "max_side": None,
                                 "jpeg_quality": 95, "shard_samples": None,
                                 "shard_bytes": 200_000}
    assert WriterConfig.from_manifest(man).tar_members() == ()  # no tar, no members
    assert all(len(info["shards"]) > 1 for info in man["splits"].values())  # 200 kB rollover


def test_writer_options_keep_wds_cls(small_src, tmp_path):
    """writer_options given for wds used to replace the {wds_cls, wds_json} defaults, dropping
    the .cls members; now they add to them, and a key they name wins."""
    assert PackOptions(writer_options={"wds_json": True}).sink_writer_options == {
        "wds_cls": True, "wds_json": True}
    assert PackOptions(wds_cls=True, writer_options={"wds_cls": False}).sink_writer_options \
        == {"wds_cls": False, "wds_json": False}
    out = tmp_path / "both"
    pack(small_src, out, split=SMALL, writer_options={"wds_json": True}, progress=False)
    assert load_manifest(out)[WRITER_FIELD]["options"] == {"wds_cls": True, "wds_json": True}
    assert set(map(tuple, all_members(out).values())) == {("jpg", "cls", "json")}
    info = json.loads((out / "shards" / "_info.json").read_text())
    assert "alt_label" not in info["splits"]["train"]  # timm reads the .cls members
    off = tmp_path / "off"
    pack(small_src, off, options=PackOptions(split=SMALL, writer_options={"wds_cls": False},
                                             progress=False))
    assert load_manifest(off)[WRITER_FIELD]["options"] == {"wds_cls": False, "wds_json": False}
    assert set(map(tuple, all_members(off).values())) == {("jpg",)}


@pytest.mark.parametrize("kwargs, words", [
    (dict(writer_options={"x": 1}),
     "writer_options key 'x' is not an option of the 'wds' writer; expected one of "
     "['wds_cls', 'wds_json']"),
    (dict(writer_options={"wds_cls": "yes"}), "writer_options['wds_cls']='yes'; expected True "
     "or False"),
    (dict(format="lmdb", writer_options={"initial_map_size": 0}),
     "writer_options['initial_map_size']=0; expected an integer >= 1"),
    (dict(format="hdf5", writer_options={"wds_cls": True}),
     "writer_options key 'wds_cls' is not an option of the 'hdf5' writer; it takes none"),
])
def test_writer_options_the_writer_does_not_take_are_refused_before_anything_is_read(
        small_src, tmp_path, kwargs, words):
    with pytest.raises(ConfigError) as e:
        PackOptions(**kwargs)
    assert str(e.value) == words
    with pytest.raises(ConfigError):
        pack(small_src, tmp_path / "o", progress=False, **kwargs)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ interop reads the record
def test_export_of_a_no_cls_dataset_answers_from_the_manifest_without_opening_a_shard(
        bare, tmp_path, monkeypatch):
    out = tmp_path / "bare"
    shutil.copytree(bare, out)
    for tar in (out / "shards").glob("*.tar"):
        tar.rename(tmp_path / tar.name)  # not even there: any open would fail
    no_shard_opened(monkeypatch)
    for tool, reads in (("dali", "DALI reads labels from .cls members"),
                        ("hf", "Hugging Face datasets reads labels from .cls members"),
                        ("timm", "timm reads labels from .cls members (or .json members, "
                                 "from --wds-json)")):
        res = cli("export", out, "--to", tool)
        assert res.exit_code == 2, res.output
        (line,) = res.output.strip().splitlines()
        assert line == (f"Error: ConfigError: {out}: {reads}, and the shards have no .cls "
                        "members (the manifest records a pack with --no-wds-cls): repack with "
                        "--wds-cls")
    with pytest.raises(ConfigError, match="the manifest records a pack with --no-wds-cls"):
        interop.export(out)
    assert sorted(os.listdir(out / "shards")) == []  # nothing written
    assert interop.write_pack_metadata(out, load_manifest(out)) == []  # what pack does


def test_pack_without_cls_or_json_never_scans_its_shards(small_src, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a shard was scanned")

    monkeypatch.setattr(interop, "scan", refuse)
    out = tmp_path / "bare"
    pack(small_src, out, split=SMALL, wds_cls=False, progress=False)
    assert sorted(os.listdir(out / "shards")) == ["train-000000.tar", "val-000000.tar"]


def test_a_tool_the_shards_serve_is_still_checked_against_the_tars(given_flags, tmp_path):
    """--no-wds-cls --wds-json: timm is served (the .json labels), DALI and HF refused from the
    record; what is written is scanned from the tars, which must hold the recorded members."""
    out = tmp_path / "flags"
    shutil.copytree(given_flags, out)
    (out / "shards" / "_info.json").unlink()
    assert cli("export", out, "--to", "timm").exit_code == 0
    info = json.loads((out / "shards" / "_info.json").read_text())
    assert info["splits"]["train"]["alt_label"] == "label"
    assert (out / "shards" / "_info.json").read_bytes() == \
        (given_flags / "shards" / "_info.json").read_bytes()  # as pack wrote it
    edit_manifest(out, lambda m: m[WRITER_FIELD]["options"].update(wds_cls=True))
    with pytest.raises(ShardCorruptError) as e:
        interop.export(out, ["dali"])
    assert str(e.value) == (f"{out}: the manifest records wds_cls=true, and 0 of the 200 "
                            "samples have a .cls member: the shards are not the ones this "
                            "manifest describes (re-copy the dataset or re-pack it)")
    assert not list((out / "shards").glob("*.idx"))


def test_verify_checks_timm_labels_from_the_record_when_a_shard_cannot_be_scanned(
        given_flags, tmp_path):
    out = tmp_path / "flags"
    shutil.copytree(given_flags, out)
    path = out / "shards" / "_info.json"
    info = json.loads(path.read_text())
    del info["splits"]["train"]["alt_label"]  # timm would read .cls members the tars lack
    path.write_text(json.dumps(info))
    tar = out / "shards" / "val-000000.tar"
    tar.write_bytes(tar.read_bytes()[:2000])  # so not every shard can be scanned
    problems = check_reader_files(out)
    assert any(p.startswith("shards/_info.json: split 'train' has other alt_label than the "
                            "manifest") for p in problems), problems


# ------------------------------------------------------------------ manifests without it
def test_an_old_style_manifest_without_the_section_loads_and_exports(small_src, tmp_path,
                                                                     monkeypatch):
    out = tmp_path / "old"
    pack(small_src, out, split=SMALL, max_side=200, progress=False)
    made = {p.relative_to(out).as_posix(): p.read_bytes() for p in (out / "shards").iterdir()
            if not p.name.endswith(".tar")}
    assert sorted(made) == ["shards/_info.json", "shards/train-000000.idx",
                            "shards/val-000000.idx"]
    edit_manifest(out, lambda m: m.pop(WRITER_FIELD))
    man = load_manifest(out)
    config = WriterConfig.from_manifest(man)
    assert config == WriterConfig("wds", None, max_side=200, jpeg_quality=95, recorded=False)
    assert config.tar_members() is None
    with pytest.raises(ManifestError, match="records no writer options"):
        config.every_sample_has("cls")
    for rel in made:
        (out / rel).unlink()
    scans = []
    real_scan = interop.scan
    monkeypatch.setattr(interop, "scan", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    res = cli("export", out, "--to", "timm", "--to", "dali")
    assert res.exit_code == 0, res.output
    assert {rel: (out / rel).read_bytes() for rel in made} == made and scans == [1]
    # an old manifest of a --no-wds-cls pack: the answer comes from the tar headers, as before
    bare = tmp_path / "old-bare"
    pack(small_src, bare, split=SMALL, wds_cls=False, progress=False)
    edit_manifest(bare, lambda m: m.pop(WRITER_FIELD))
    res = cli("export", bare, "--to", "dali")
    assert res.exit_code == 2 and scans == [1, 1]
    assert "DALI reads labels from .cls members, and the shards have no .cls members (packed " \
        "with --no-wds-cls, or before .cls members were the pack default)" in res.output


# ------------------------------------------------------------------ the schema of the section
def _drop(*path):
    def change(section):
        node = section
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
        return section
    return change


def _put(key, value):
    return lambda section: {**section, key: value}


@pytest.mark.parametrize("change, words", [
    (lambda section: None, "field writer is null (null); expected an object"),
    (_drop("shard_bytes"), "required field writer.shard_bytes is missing"),
    (_drop("options", "wds_cls"), "required field writer.options['wds_cls'] is missing; "
     "expected true or false"),
    (_put("options", {"wds_cls": "yes", "wds_json": False}),
     "field writer.options['wds_cls'] is \"yes\" (str); expected true or false"),
    (_put("options", {"wds_cls": False, "wds_json": True, "extra": [1]}),
     "field writer.options['extra'] is [1] (array); expected a JSON scalar"),
    (_put("jpeg_quality", 0), "field writer.jpeg_quality is 0 (int); expected an int in "
     "[1, 100]"),
    (_put("shard_bytes", "1MB"), "field writer.shard_bytes is \"1MB\" (str)"),
    (_put("shard_samples", True), "field writer.shard_samples is true (bool)"),
    (_put("max_side", 64), "field writer.max_side is 64 (int); expected the max_side of "
     "normalization (128 (int)): one pack, one --max-side"),
])
def test_a_malformed_writer_section_is_named(given_flags, tmp_path, change, words):
    out = tmp_path / "flags"
    shutil.copytree(given_flags, out)
    edit_manifest(out, lambda m: m.update({WRITER_FIELD: change(m[WRITER_FIELD])}))
    with pytest.raises(ManifestError) as e:
        load_manifest(out)
    assert words in str(e.value) and str(out / "manifest.json") in str(e.value)
