"""OUT as an fsspec URL (README.md, "Packing into object storage"): ``shardkit pack SRC
s3://bucket/ds`` writes through a local staging folder and uploads each shard as its sink closes
it, ``manifest.json`` last. Tested on a local S3 server (moto, the ``s3_server`` fixture) with the
embedded flowers sample: the objects are the bytes of a pack into a local folder, ``make_loader``
reads the same samples from both, OUT's rules (finished dataset, overwrite, leftovers, a user's
objects, failures) hold, and Ray tasks upload their own shards."""
from __future__ import annotations

import errno
import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardkit.packer.check as pack_check
import shardkit.packer.scan as pack_scan
from shardkit.packer import write as pack_write
from shardkit.packer.outputs import upload as pack_upload
from shardkit.errors import ConfigError, DiskFullError, OutputExistsError, UploadError
from shardkit.dataset.manifest import load_index, load_manifest
from shardkit.packer.run import pack
from shardkit.packer.cli import pack_command
from shardkit.packer.outputs import owned_name
from shardkit.stream import make_loader

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"
OPTS = dict(progress=False, near_duplicates="off", metadata=SAMPLE / "metadata.csv",
            group_column="group_flickr_user")
USER = {"notes/todo.txt": b"my notes\n", "shards/mine.txt": b"mine\n",
        "README.md": b"# my dataset\n"}  # a user's own objects under OUT: never touched


def _objects(fs, url: str) -> dict[str, bytes]:
    """``{path relative to url: bytes}`` of every object under ``url``."""
    base = url.split("://", 1)[1]
    fs.invalidate_cache()
    return {p[len(base) + 1:]: fs.cat_file(p) for p in fs.find(base)}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file()}


def _shards(objects: dict) -> list[str]:
    return sorted(r for r in objects if r.startswith("shards/") and r.endswith(".tar"))


@pytest.fixture(scope="module")
def local_packs(tmp_path_factory):
    """The sample packed into local folders, 20 and 50 samples per shard."""
    root = tmp_path_factory.mktemp("local")
    for n in (20, 50):
        pack(SAMPLE, root / f"n{n}", shard_samples=n, **OPTS)
    return {n: root / f"n{n}" for n in (20, 50)}


def _epoch(root) -> dict[int, tuple[str, int, np.ndarray]]:
    """``{sample index: (key, label, pixels)}`` of one eval epoch of ``root``'s val split."""
    index = load_index(root, "val")
    loader = make_loader(root, "val", 8, train=False, image_size=64, num_workers=0,
                         return_meta=True)
    out = {}
    for images, labels, meta in loader:
        for i, y, x in zip(meta["index"].tolist(), labels.tolist(), images):
            out[i] = (index.key_at(i), y, x.numpy())
    return out


def test_s3_pack_is_the_local_pack_byte_for_byte_and_loads_alike(s3_server, local_packs,
                                                                  tmp_path, monkeypatch):
    url = s3_server.bucket() + "/flowers"
    staging = tmp_path / "tmp"
    staging.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(staging))  # $TMPDIR of this run
    on_disk = []  # local tar files in the staging folder at each shard upload
    upload = pack_upload.upload_file

    def counting(fs, local, rpath, where):
        if rpath.endswith(".tar"):
            on_disk.append(sorted(p.name for p in staging.rglob("*.tar")))
        return upload(fs, local, rpath, where)

    monkeypatch.setattr(pack_upload, "upload_file", counting)
    summary = pack(SAMPLE, url + "/", shard_samples=20, **OPTS)
    assert str(summary.out) == url and summary.format_text().startswith(f"packed {url} ")
    got, want = _objects(s3_server.fs(), url), _files(local_packs[20])
    # every file, manifest included (it has no output path or timing field), the same bytes
    shards = _shards(want)
    assert sorted(got) == sorted(want) and len(shards) == 12  # 9 train, 1 val, 2 test
    assert [r for r in got if got[r] != want[r]] == []
    manifest = json.loads(got["manifest.json"])
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            assert hashlib.sha256(got[shard["path"]]).hexdigest() == shard["sha256"]
    assert "shards/_info.json" in got and "shards/val-000000.idx" in got  # timm, DALI
    # one shard on the local disk at a time (one writer), then the staging folder is gone
    assert len(on_disk) == len(shards) and all(len(names) <= 1 for names in on_disk)
    assert list(staging.iterdir()) == []
    remote, local = _epoch(url), _epoch(local_packs[20])
    assert len(remote) == manifest["splits"]["val"]["num_samples"] > 0
    assert remote.keys() == local.keys()
    for i in remote:
        assert remote[i][:2] == local[i][:2] and np.array_equal(remote[i][2], local[i][2])


def _put_user_objects(fs, url: str) -> None:
    fs.pipe({f"{url}/{rel}": data for rel, data in USER.items()})


def test_finished_dataset_overwrite_and_leftovers(s3_server, local_packs):
    fs, url = s3_server.fs(), s3_server.bucket() + "/ds"
    _put_user_objects(fs, url)
    pack(SAMPLE, url, shard_samples=20, **OPTS)
    before = _objects(fs, url)
    with pytest.raises(OutputExistsError, match=f"{url} already holds a packed dataset"):
        pack(SAMPLE, url, shard_samples=50, **OPTS)
    assert _objects(fs, url) == before  # refused before anything was written
    summary = pack(SAMPLE, url, shard_samples=50, overwrite=True, **OPTS)
    got = _objects(fs, url)
    assert {r: d for r, d in got.items() if r not in USER} == _files(local_packs[50])
    assert {r: got[r] for r in USER} == USER  # the user's objects, README.md included
    stale = sorted(set(_shards(before)) - set(_shards(got)))
    assert len(stale) == 12 - 6 and set(stale) <= set(summary.replaced)  # 4 train, 1, 1
    assert not {r[:-4] + ".idx" for r in stale} & set(got)  # their DALI indexes went too
    assert "manifest.json" in summary.replaced
    # a killed run: owned objects, no manifest -> deleted before the next run writes
    fs.rm(url.split("://")[1] + "/manifest.json")
    fs.pipe(f"{url}/shards/train-000099.tar", b"left over")
    summary = pack(SAMPLE, url, shard_samples=50, **OPTS)
    assert "shards/train-000099.tar" in summary.cleaned and "manifest.json" not in summary.cleaned
    got = _objects(fs, url)
    assert {r: d for r, d in got.items() if r not in USER} == _files(local_packs[50])


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_lmdb_and_hdf5_to_a_url_are_refused(s3_server, fmt):
    fs, url = s3_server.fs(), s3_server.bucket() + "/ds"
    with pytest.raises(ConfigError, match=f"output {url} is a remote URL and --format {fmt}.*"
                                          "pack them to a local folder, or use --format wds"):
        pack(SAMPLE, url, format=fmt, **OPTS)
    assert _objects(fs, url) == {}


def test_missing_bucket_fails_before_the_scan(s3_server, monkeypatch):
    scanned = []
    monkeypatch.setattr(pack_scan, "scan_source", lambda *a: scanned.append(a))
    with pytest.raises(ConfigError, match="output s3://no-such-bucket/ds cannot be written "
                                          r"\(FileNotFoundError"):
        pack(SAMPLE, "s3://no-such-bucket/ds", **OPTS)
    assert scanned == []


def _owned(objects: dict) -> list[str]:
    return [r for r in objects if owned_name(r)]


def test_a_run_that_fails_while_writing_leaves_no_owned_object(s3_server, tmp_path,
                                                               monkeypatch):
    fs = s3_server.fs()
    src = tmp_path / "src"
    shutil.copytree(SAMPLE, src)
    gone = sorted(src.rglob("*.jpg"))[-1]
    check = pack_check.check_files

    def check_then_delete(*a, **k):  # the file disappears after its check
        checked = check(*a, **k)
        gone.unlink()
        return checked

    monkeypatch.setattr(pack_check, "check_files", check_then_delete)
    url = s3_server.bucket() + "/ds"
    _put_user_objects(fs, url)
    with pytest.raises(FileNotFoundError, match=gone.name):
        pack(src, url, shard_samples=20, **{**OPTS, "metadata": None, "group_column": None})
    assert _objects(fs, url) == USER
    # an overwrite whose upload fails half way: the old dataset was unfinished from the first
    # write on, so nothing owned is left, and the user's objects are
    monkeypatch.undo()
    pack(SAMPLE, url, shard_samples=20, **OPTS)
    assert len(_owned(_objects(fs, url))) > 20
    calls = []

    def failing(fs, local, rpath, where):
        calls.append(rpath)
        if len(calls) == 4:
            raise UploadError(f"cannot upload {local} to {where}: simulated")
        return upload(fs, local, rpath, where)

    upload = pack_upload.upload_file
    monkeypatch.setattr(pack_upload, "upload_file", failing)
    with pytest.raises(UploadError, match="simulated"):
        pack(SAMPLE, url, shard_samples=50, overwrite=True, **OPTS)
    assert len(calls) == 4 and _objects(fs, url) == USER


def test_a_full_staging_disk_names_tmpdir(s3_server, monkeypatch):
    fs, url = s3_server.fs(), s3_server.bucket() + "/ds"
    _put_user_objects(fs, url)

    def full(root, entries):
        raise OSError(errno.ENOSPC, "No space left on device", str(root / "quarantine.jsonl"))

    monkeypatch.setattr(pack_write, "write_quarantine", full)
    with pytest.raises(DiskFullError, match=r"while writing /\S+/quarantine.jsonl in the local "
                                            f"staging folder of the upload to {url}; .*TMPDIR"):
        pack(SAMPLE, url, **OPTS)
    assert _objects(fs, url) == USER


def test_an_upload_of_other_size_is_an_error(s3_server, monkeypatch):
    fs, url = s3_server.fs(), s3_server.bucket() + "/ds"
    store = pack_upload.remote_fs(url)[0]  # fsspec's cached instance, the one pack uses
    put = store.put_file

    def short(lpath, rpath, **kw):  # a store that drops the last byte of shard 1
        if rpath.endswith("train-000001.tar"):
            return store.pipe_file(rpath, Path(lpath).read_bytes()[:-1])
        return put(lpath, rpath, **kw)

    monkeypatch.setattr(store, "put_file", short)
    with pytest.raises(UploadError) as err:
        pack(SAMPLE, url, shard_samples=20, **OPTS)
    got, want = map(int, re.search(r"train-000001.tar holds (\d+) bytes after the upload, "
                                   r"the local file \S+ (\d+):", str(err.value)).groups())
    assert got == want - 1 > 0
    assert _objects(fs, url) == {}


def test_quarantined_files_with_a_url_out(s3_server, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(SAMPLE / "daisy", src / "daisy")
    shutil.copytree(SAMPLE / "roses", src / "roses")
    (src / "daisy" / "broken.jpg").write_bytes(b"not a jpeg")
    url = s3_server.bucket() + "/ds"
    summary = pack(src, url, progress=False, near_duplicates="off")
    assert f"{url}/quarantine.jsonl" in summary.format_text()
    assert summary.num_quarantined == 1 and summary.out == url
    lines = s3_server.fs().cat(f"{url}/quarantine.jsonl").decode().splitlines()
    assert [json.loads(line)["path"] for line in lines] == ["daisy/broken.jpg"]


@pytest.mark.ray
def test_ray_tasks_upload_the_local_engines_objects(s3_server, local_packs):
    ray = pytest.importorskip("ray")
    fs = s3_server.fs()
    url = s3_server.bucket() + "/ray"
    started = not ray.is_initialized()  # this test's own runtime; the S3 env is set already
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        pack(SAMPLE, url, shard_samples=20, engine="ray", **OPTS)
    finally:
        if started:
            ray.shutdown()
    got, want = _objects(fs, url), _files(local_packs[20])
    assert sorted(got) == sorted(want) and [r for r in got if got[r] != want[r]] == []


def test_cli_packs_to_s3(s3_server):
    url = s3_server.bucket() + "/cli"
    result = CliRunner().invoke(pack_command, [str(SAMPLE), url, "--shard-samples", "50",
                                               "--near-duplicates", "off", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"packed {url} (format wds, 5 classes)")
    assert load_manifest(url)["source"]["num_packed"] == 200
    bad = CliRunner().invoke(pack_command, [str(SAMPLE), url + "2", "--format", "lmdb"])
    assert bad.exit_code == 2 and "Error: ConfigError: output" in bad.output


def test_verify_reads_a_pack_in_object_storage(s3_server, tmp_path):
    from shardkit.doctor.verify import verify, verify_command

    url = s3_server.bucket() + "/v"
    pack(SAMPLE, url, shard_samples=50, **OPTS)
    report = verify(url)
    assert report.ok and report.num_shards == 6 and report.num_samples == 200  # 4+1+1
    result = CliRunner().invoke(verify_command, [url])
    assert result.exit_code == 0, result.output
    fs = s3_server.fs()
    tars = sorted(p for p in fs.find(url + "/shards") if p.endswith(".tar"))
    shard = tars[1]
    data = bytearray(fs.cat(shard))
    data[len(data) // 2] ^= 0xFF  # one flipped bit inside a sample's bytes
    fs.pipe(shard, bytes(data))
    fs.rm(tars[-1])
    report = verify(url)
    problems = "\n".join(report.problems)
    assert not report.ok and "sha256" in problems and "missing (no object at s3://" in problems
    result = CliRunner().invoke(verify_command, [url])
    assert result.exit_code == 1 and "FAIL" in result.output


def test_overwrite_removes_what_other_readers_take_for_the_dataset_first(s3_server, monkeypatch):
    """A killed overwrite must not leave the old _info.json / .idx / split files beside shards
    that the new run has begun to replace (timm and DALI would read a mix as one dataset)."""
    fs, url = s3_server.fs(), s3_server.bucket() + "/ow"
    pack(SAMPLE, url, shard_samples=20, **OPTS)
    old = _objects(fs, url)
    assert {"shards/_info.json", "splits/train.jsonl", "shards/train-000000.idx"} <= set(old)
    seen = []
    put_shard = pack_upload.put_shard

    def snapshot_then_put(*a, **k):  # what a kill at the first shard upload would leave
        if not seen:
            seen.append(_objects(fs, url))
        return put_shard(*a, **k)

    monkeypatch.setattr(pack_upload, "put_shard", snapshot_then_put)
    pack(SAMPLE, url, shard_samples=50, overwrite=True, **OPTS)
    left = seen[0]
    assert left and all(r.startswith("shards/") and r.endswith(".tar") for r in left), left
    assert {r: left[r] for r in left} == {r: old[r] for r in left}  # old shards, untouched yet


def test_check_stats_inspect_read_a_pack_in_object_storage(s3_server, tmp_path):
    """After a pack into S3 the doctor commands read it where it is (fresh-user review: they
    refused a URL as a missing folder); stats saves nothing there unless told, and then says
    why it cannot."""
    from shardkit.doctor.cli import check_command, stats_command

    url = s3_server.bucket() + "/doc"
    pack(SAMPLE, url, shard_samples=50, **OPTS)
    local = tmp_path / "local"
    pack(SAMPLE, local, shard_samples=50, **OPTS)
    runner = CliRunner()
    got = runner.invoke(stats_command, [url, "--max-samples", "40", "--no-progress"])
    want = runner.invoke(stats_command, [str(local), "--max-samples", "40", "--no-save",
                                         "--no-progress"])
    assert got.exit_code == 0 == want.exit_code, got.output
    assert got.output.splitlines()[:3] == want.output.splitlines()[:3]  # the same mean/std
    assert "saved" not in got.output
    bad = runner.invoke(stats_command, [url, "--save", "--no-progress"])
    assert bad.exit_code == 2 and "drop --save" in bad.output
    result = runner.invoke(check_command, [url, "--no-transforms", "--no-progress"])
    assert result.exit_code == 0 and "NO EXACT LEAK" in result.output, result.output


_KILLED_STAGING = """
import os, sys
from shardkit.packer.outputs.upload import staging_folder
folder = staging_folder()  # as a pack into object storage makes it, then killed (no cleanup)
(folder / "shards").mkdir()
(folder / "shards" / "train-000005.tar").write_bytes(b"x" * 100)
print(folder, flush=True)
os._exit(0)
"""


def test_a_killed_packs_staging_folder_is_removed_by_the_next(s3_server, tmp_path, monkeypatch):
    import socket
    import subprocess
    import sys

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # read TMPDIR again
    try:
        made = subprocess.run([sys.executable, "-c", _KILLED_STAGING], capture_output=True,
                              text=True, check=True)
        killed = Path(made.stdout.strip())
        assert killed.parent == tmp_path and (killed / pack_upload.STAGING_MARKER).is_file()
        alive = pack_upload.staging_folder()  # a pack still running (this process)
        gone = _dead_pid()
        kept = {  # whatever the name, a folder without the marker of a dead pack stays
            "shardkit-pack-2024-holiday-photos": None,  # a user's folder
            f"shardkit-pack-{gone}-abc123": None,  # the old name rule's, no marker
            f"shardkit-pack-{gone}-feed-x": {"pid": gone, "host": socket.gethostname(),
                                             "token": "beef"},  # not the token of its name
            f"shardkit-pack-{gone}-beef-y": {"pid": gone, "host": "another-host",
                                             "token": "beef"},  # another machine's pack
        }
        for name, marker in kept.items():
            (tmp_path / name / "shards").mkdir(parents=True)
            (tmp_path / name / "shards" / "keep.jpg").write_bytes(b"mine")
            if marker is not None:
                (tmp_path / name / pack_upload.STAGING_MARKER).write_text(
                    json.dumps(marker))
        pack(SAMPLE, s3_server.bucket() + "/st", shard_samples=50, **OPTS)
        assert not killed.exists() and alive.is_dir()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, *kept])
        assert all((tmp_path / name / "shards" / "keep.jpg").read_bytes() == b"mine"
                   for name in kept)
    finally:
        tempfile.tempdir = None


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_missing_bucket_is_named_when_reading(s3_server):
    from shardkit.errors import ManifestError

    with pytest.raises(ManifestError, match=r"not found \(NoSuchBucket: The specified bucket "
                                            r"does not exist\)"):
        load_manifest("s3://no-such-bucket-shardkit/ds")
    with pytest.raises(ManifestError, match=r"not found \(NoSuchKey: "):
        load_manifest(s3_server.bucket() + "/never-packed")


# ------------------------------------------------------------------ one interface, two kinds
def _write_through(target, photos: list[bytes], shard_samples: int, fail: bool = False) -> None:
    """The write side of a pack through the :class:`PackOutput` interface alone, as ``pack``
    drives it: prepare, shards through a sink whose closed shards go to ``target.upload``,
    the quarantine list, split files, the readers' files, ``manifest.json`` last, commit.
    ``fail``: raise after the shards are written (the ``with`` block aborts)."""
    from shardkit import interop
    from shardkit.dataset.manifest import (CHECKSUM_FIELD, sample_checksum, write_manifest,
                                           write_split_files)
    from shardkit.formats import ShardSink

    root = target.prepare()
    records, first = [], [0]

    def on_close(path, record):
        target.upload(path, record, records[first[0]:])
        first[0] = len(records)

    sink = ShardSink(root, "train", "wds", max_samples=shard_samples,
                     writer_options={"wds_cls": True},
                     on_close=None if target.upload is None else on_close)
    for n, data in enumerate(photos):
        key = f"train_{n:08d}"
        shard, offset = sink.add(key, data, "jpg", n % 2, {"key": key, "label": n % 2})
        records.append({"key": key, "label": n % 2, "shard": shard, "offset": offset,
                        "size": len(data), CHECKSUM_FIELD: f"{sample_checksum(data):016x}"})
    shards = sink.close()
    if fail:
        raise RuntimeError("the run fails after its shards")
    pack_write.write_quarantine(root, [{"path": "daisy/broken.jpg", "reason": "not an image"}])
    manifest = {"format": "wds", "classes": ["daisy", "roses"], "source": {"root": "/src/flow"},
                "splits": {"train": {"num_samples": len(records), "shards": shards,
                                     **write_split_files(root, "train", records)}}}
    interop.write_pack_metadata(root, manifest, members=target.shard_members)
    write_manifest(root, manifest)
    target.commit()


def test_a_local_and_an_s3_output_end_with_the_same_files(s3_server, tmp_path):
    """The same operations on a LocalOutput and a RemoteOutput (through open_output and the
    PackOutput interface only) leave the same files under OUT, byte for byte: a fresh run, a
    refused second run, an overwrite with fewer shards (the stale shard and its DALI index go),
    leftovers of a killed run written after this process listed OUT (its cached listing does
    not hide them), and a failed fresh run (nothing owned is left); the user's files stay in
    every case."""
    from shardkit.errors import OutputExistsError as Exists
    from shardkit.packer.options import PackOptions
    from shardkit.packer.outputs import LocalOutput, PackOutput, RemoteOutput, open_output

    photos = [p.read_bytes() for p in sorted((SAMPLE / "daisy").glob("*.jpg"))[:7]]
    fs, src = s3_server.fs(), tmp_path / "src"
    src.mkdir()
    outs = {LocalOutput: tmp_path / "out", RemoteOutput: s3_server.bucket() + "/same"}

    def files(out) -> dict[str, bytes]:
        return _files(out) if isinstance(out, Path) else _objects(fs, out)

    def put_user(out) -> None:
        for rel, data in USER.items():
            if isinstance(out, Path):
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                (out / rel).write_bytes(data)
            else:
                fs.pipe_file(f"{out}/{rel}", data)

    def leave(out, rel: str, data: bytes) -> None:  # what a killed run leaves
        if isinstance(out, Path):
            (out / rel).write_bytes(data)
        else:
            fs.pipe_file(f"{out}/{rel}", data)

    steps: dict[type, list] = {}
    for kind, out in outs.items():
        put_user(out)
        seen = steps[kind] = []
        with open_output(src, out, PackOptions(progress=False)) as target:
            assert type(target) is kind and isinstance(target, PackOutput)
            assert target.owned() == []
            _write_through(target, photos, 3)  # shards of 3, 3 and 1 samples
        seen.append((files(out), target.owned(), target.cleaned, sorted(target.replaced)))
        with pytest.raises(Exists, match="already holds a packed dataset"):
            with open_output(src, out, PackOptions(progress=False)) as target:
                _write_through(target, photos, 5)
        assert files(out) == seen[0][0]  # refused before anything was written
        with open_output(src, out, PackOptions(progress=False, overwrite=True)) as target:
            _write_through(target, photos, 5)  # 2 shards: train-000002 is stale
        seen.append((files(out), target.owned(), target.cleaned, sorted(target.replaced)))
        leave(out, "shards/train-000009.tar", b"left by a killed run")  # beside the dataset:
        leave(out, "splits/.train.jsonl.x1y2.tmp", b"partial")  # no manifest lists them
        with open_output(src, out, PackOptions(progress=False, overwrite=True)) as target:
            _write_through(target, photos, 4)
        seen.append((files(out), target.owned(), target.cleaned, sorted(target.replaced)))
        fresh = tmp_path / "fresh" if isinstance(out, Path) else f"{out}-fresh"
        put_user(fresh)
        with pytest.raises(RuntimeError, match="fails after its shards"):
            with open_output(src, fresh, PackOptions(progress=False)) as target:
                _write_through(target, photos, 3, fail=True)
        seen.append((files(fresh), target.owned(), target.cleaned, sorted(target.replaced)))
    local, remote = steps[LocalOutput], steps[RemoteOutput]
    first, overwritten, after_leftovers, failed = local
    assert sorted(first[0]) == sorted([*USER, "manifest.json", "quarantine.jsonl",
                                       "splits/train.jsonl", "splits/train.index.npz",
                                       "shards/_info.json", *[f"shards/train-00000{i}.{e}"
                                       for i in range(3) for e in ("tar", "idx")]])
    assert first[1][0] == "manifest.json"
    assert sorted(first[1]) == sorted(set(first[0]) - set(USER))
    assert {r: first[0][r] for r in USER} == USER
    assert "shards/train-000002.tar" not in overwritten[0]  # stale: removed by the overwrite
    assert "shards/train-000002.idx" not in overwritten[0]
    assert set(overwritten[3]) == set(first[1])  # every file of the old dataset replaced
    assert failed[0] == USER and failed[1] == []  # nothing owned left, the user's files kept
    for step, (want, got) in enumerate(zip(local, remote)):
        assert sorted(got[0]) == sorted(want[0]), step  # the same files ...
        assert [r for r in want[0] if got[0][r] != want[0][r]] == [], step  # ... same bytes
        assert sorted(got[1]) == sorted(want[1]) and got[1][:1] == want[1][:1], step
        # the same names removed or replaced (a temporary name beside an old dataset counts
        # as cleaned after a local swap, as replaced in the store)
        assert sorted(got[2] + got[3]) == sorted(want[2] + want[3]), step
    assert after_leftovers[2] == ["splits/.train.jsonl.x1y2.tmp"]
    assert "shards/train-000009.tar" in after_leftovers[3]
    assert "shards/train-000009.tar" not in after_leftovers[0]
