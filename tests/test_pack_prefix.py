"""A bare object-store prefix (or a remote .csv list) as the pack source: the
embedded sample in a local S3 API (moto, the ``s3_server`` fixture) packs to the same splits,
shards and quarantine as the folder it came from, with the folder rules (junk, markers,
split-first, group rules) applied to the listing."""
from __future__ import annotations

import csv
import functools
import importlib.util
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner

from conftest import SAMPLE
from shardkit.errors import ConfigError, SourceError
from shardkit.dataset.manifest import load_manifest, read_split_records
from shardkit.packer.run import pack
from shardkit.packer.cli import pack_command
from shardkit.sources.remote import scan_url

OPTS = dict(progress=False, workers=2, seed=0)
META = dict(metadata=SAMPLE / "metadata.csv", group_column="group_flickr_user")
MARKER = {"path": "daisy/", "reason": "folder marker (zero-byte object named like a folder)"}
JUNK = {  # relpath -> (bytes, the reason it is ignored or quarantined)
    "daisy/.DS_Store": (b"\0\0\0\1Bud1", "hidden entry (dot-name)"),
    "LICENSE.txt": (b"CC-BY", None),  # already in the sample: "file beside the class folders"
    "__MACOSX/daisy/._x.jpg": (b"\0\5\26\7", "macOS archive metadata (__MACOSX)"),
    "tulips/notes.txt": (b"picked on a sunny day\n", "not an image (sniffed: unknown)"),
}


def _put(s3_server, url: str, data: bytes) -> None:
    """One object through boto3 (s3fs drops the trailing "/" of a marker key)."""
    import boto3

    bucket, _, key = url.removeprefix("s3://").partition("/")
    boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key=key, Body=data)


@pytest.fixture(scope="module")
def flowers(s3_server, tmp_path_factory):
    """``(local folder, s3 URL)``: the sample plus :data:`JUNK`, on disk and in a bucket that
    also holds a zero-byte ``daisy/`` folder marker."""
    local = tmp_path_factory.mktemp("prefix") / "flowers"
    shutil.copytree(SAMPLE, local)
    for rel, (data, _) in JUNK.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    url = f"{s3_server.bucket()}/flowers"
    s3_server.upload_tree(local, url)
    _put(s3_server, f"{url}/daisy/", b"")
    return local, url


@pytest.fixture(scope="module")
def packs(flowers, tmp_path_factory):
    """Session-cached ``make(src, **options) -> OUT`` of :func:`shardkit.packer.run.pack`."""
    cache: dict = {}

    def make(src, **kwargs) -> Path:
        key = (str(src), tuple(sorted((k, str(v)) for k, v in kwargs.items())))
        if key not in cache:
            cache[key] = tmp_path_factory.mktemp("out") / "out"
            pack(src, cache[key], **{**OPTS, **kwargs})
        return cache[key]
    return make


def _records(out: Path) -> dict[str, list[dict]]:
    return {s: read_split_records(out, s) for s in load_manifest(out)["splits"]}


def _quarantine(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "quarantine.jsonl").read_text().splitlines()]


def _shard_hashes(out: Path) -> dict[str, list[str]]:
    splits = load_manifest(out)["splits"]
    return {s: [sh["sha256"] for sh in v["shards"]] for s, v in splits.items()}


def _same_pack(remote: Path, local: Path, renamed: dict[str, str] | None = None) -> None:
    """Records, shard hashes and quarantine equal; the manifest equal apart from its source
    section and the CSV names in ``renamed`` (remote pack's name -> local pack's name)."""
    assert _records(remote) == _records(local)
    assert _shard_hashes(remote) == _shard_hashes(local)
    assert all((remote / sh).read_bytes() == (local / sh).read_bytes() for sh in (
        s["path"] for v in load_manifest(local)["splits"].values() for s in v["shards"]))
    assert _quarantine(remote) == _quarantine(local)
    a, b = ({k: v for k, v in load_manifest(out).items() if k != "source"}
            for out in (remote, local))
    text = json.dumps(a)
    for name, local_name in (renamed or {}).items():
        assert json.dumps(name) in text
        text = text.replace(json.dumps(name), json.dumps(local_name))
    assert json.loads(text) == b


def test_prefix_packs_like_the_folder(flowers, packs):
    local, url = flowers
    remote_out, local_out = packs(url, **META), packs(local, **META)
    _same_pack(remote_out, local_out)
    manifest, local_manifest = load_manifest(remote_out), load_manifest(local_out)
    counts = {s: v["class_counts"] for s, v in manifest["splits"].items()}
    assert [sum(c) for c in zip(*counts.values())] == [  # the photos of each class folder
        len(list((SAMPLE / c).iterdir())) for c in manifest["classes"]] == [40, 44, 32, 40, 44]
    source = manifest["source"]
    assert source["root"] == url and source["kind"] == "folder"
    assert source["num_files"] == 201 and source["num_packed"] == 200  # + tulips/notes.txt
    assert [(q["path"], q["reason"]) for q in _quarantine(remote_out)] == [
        ("tulips/notes.txt", JUNK["tulips/notes.txt"][1])]
    ignored = {e["path"]: e["reason"] for e in source["ignored"]}
    assert ignored == {e["path"]: e["reason"] for e in local_manifest["source"]["ignored"]
                       } | {MARKER["path"]: MARKER["reason"]}
    assert ignored["daisy/.DS_Store"] == JUNK["daisy/.DS_Store"][1]
    assert ignored["__MACOSX"] == JUNK["__MACOSX/daisy/._x.jpg"][1]
    assert ignored["LICENSE.txt"] == ignored["metadata.csv"] == \
        "file beside the class folders (not a sample)"
    # the group column of the (local) metadata CSV joined on the prefix's relpaths
    assert manifest["split"]["group_rule"]["column"] == "group_flickr_user"
    assert len(manifest["split"]["group_to_split"]) == 120


def test_scan_url_items_are_urls_relpaths_as_on_disk(flowers):
    local, url = flowers
    result = scan_url(url + "/")
    assert result.root == url and result.layout == "class"
    assert [it.relpath for it in result.items] == sorted(
        p.relative_to(local).as_posix() for p in local.glob("*/*") if p.is_file()
        and not p.name.startswith(".") and p.parent.name != "__MACOSX")
    assert all(it.path == f"{url}/{it.relpath}" for it in result.items)
    fs, path = fsspec.core.url_to_fs(url)  # the instance scan_url used: no listing kept
    assert not [k for k in fs.dircache if k.startswith(path)]
    assert {it.label for it in result.items} == {"daisy", "dandelion", "roses", "sunflowers",
                                                 "tulips"}


def test_split_first_prefix_keeps_its_splits(s3_server, packs, tmp_path):
    local = tmp_path / "split-first"
    for cls in sorted(p for p in SAMPLE.iterdir() if p.is_dir()):
        for k, f in enumerate(sorted(cls.iterdir())[:12]):
            dest = local / ("train" if k < 9 else "val") / cls.name / f.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
    url = f"{s3_server.bucket()}/sets/flowers-split"
    s3_server.upload_tree(local, url)
    remote_out, local_out = packs(url), packs(local)
    _same_pack(remote_out, local_out)
    manifest = load_manifest(remote_out)
    assert manifest["split"]["mode"] == "given"
    assert manifest["split"]["given"]["mapping"] == {"train": "train", "val": "val"}
    records = _records(remote_out)
    assert {s: len(r) for s, r in records.items()} == {"train": 45, "val": 15}
    assert all(r["path"].startswith(f"{s}/") for s, rs in records.items() for r in rs)


def test_cli_group_by_on_a_prefix(flowers, packs, tmp_path):
    local, url = flowers
    regex = r"/(?P<group>\d\d)[^/]*$"  # the first two digits of the Flickr photo id
    result = CliRunner().invoke(pack_command, [url, str(tmp_path / "out"), "--group-by", regex,
                                               "--seed", "0", "--workers", "2", "--no-progress"])
    assert result.exit_code == 0, result.output
    _same_pack(tmp_path / "out", packs(local, group_by=regex))
    rule = load_manifest(tmp_path / "out")["split"]["group_rule"]
    assert rule == {"kind": "regex", "regex": regex}
    groups = {r["group"] for rs in _records(tmp_path / "out").values() for r in rs}
    assert 10 <= len(groups) <= 90 and all(len(g) == 2 and g.isdigit() for g in groups)


def test_metadata_split_column_on_a_prefix(flowers, packs, tmp_path):
    """--metadata with --split-column on a prefix: rows as relpaths or as the objects' full
    URLs (both joined to the prefix's relpaths), splits kept as given."""
    local, url = flowers
    with open(SAMPLE / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    meta = tmp_path / "meta.csv"
    with open(meta, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "group_flickr_user", "subset"])
        w.writerows((f"{url}/{r['path']}" if k % 2 else r["path"], r["group_flickr_user"],
                     "validation" if r["group_flickr_user"] < "f" else "train")
                    for k, r in enumerate(rows))
    opts = dict(metadata=meta, group_column="group_flickr_user", split_column="subset")
    with pytest.raises(ConfigError, match=r"--split-column 'subset' reads a column of a \.csv "
                       r"SRC or of --metadata; s3://.* is an object-store prefix"):
        pack(url, tmp_path / "bad", **OPTS, split_column="subset")
    remote_out = packs(url, **opts)
    manifest = load_manifest(remote_out)
    assert manifest["split"]["mode"] == "given"
    assert manifest["split"]["given"]["mapping"] == {"train": "train", "validation": "val"}
    want = {r["path"]: "val" if r["group_flickr_user"] < "f" else "train" for r in rows}
    got = {r["path"]: s for s, rs in _records(remote_out).items() for r in rs}
    assert got == want and len(got) == 200
    local_meta = tmp_path / "local-meta.csv"  # the same rows, relative: the same pack locally
    local_meta.write_text(meta.read_text().replace(f"{url}/", ""))
    _same_pack(remote_out, packs(local, **{**opts, "metadata": local_meta}),
               {str(meta): str(local_meta)})


def test_remote_csv_list_packs_like_the_local_csv(s3_server, flowers, tmp_path):
    local, _ = flowers
    with open(SAMPLE / "metadata.csv", newline="") as f:
        rows = list(csv.DictReader(f))[::4]
    lines = ["path,label,group"] + [f"{r['path']},{r['label']},{r['group_flickr_user']}"
                                    for r in rows]
    listing = local.parent / "list.csv"  # beside the copy: paths relative to the CSV's folder
    listing.write_text("\n".join(f"flowers/{x}" if k else x for k, x in enumerate(lines))
                       + "\n")
    url = f"{s3_server.bucket()}/lists"
    s3_server.upload_tree(local, f"{url}/flowers")
    s3_server.fs().pipe({f"{url}/list.csv": listing.read_bytes()})
    pack(f"{url}/list.csv", tmp_path / "remote", **OPTS)
    pack(listing, tmp_path / "local", **OPTS)
    _same_pack(tmp_path / "remote", tmp_path / "local", {f"{url}/list.csv": str(listing)})
    assert load_manifest(tmp_path / "remote")["source"]["kind"] == "csv"
    records = [r for rs in _records(tmp_path / "remote").values() for r in rs]
    assert sorted(r["path"] for r in records) == sorted(f"flowers/{r['path']}" for r in rows)
    assert len(records) == 50
    # a relative row whose object is missing is quarantined naming the URL that was tried
    s3_server.fs().pipe({f"{url}/list2.csv": listing.read_bytes()
                         + b"flowers/daisy/not-there.jpg,daisy,nobody\n"})
    pack(f"{url}/list2.csv", tmp_path / "remote2", **OPTS)
    lines = (tmp_path / "remote2" / "quarantine.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["path"] == "flowers/daisy/not-there.jpg"
    assert json.loads(lines[0])["reason"].endswith(f"({url}/flowers/daisy/not-there.jpg)")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_http_index_prefix_packs_like_the_folder(packs, tmp_path):
    """An http(s) prefix served as index pages (python -m http.server), names with a space and a
    "%" percent-encoded in the links and decoded in the relpaths."""
    local = tmp_path / "site" / "flowers"
    shutil.copytree(SAMPLE, local)
    odd = next(iter(sorted((local / "roses").iterdir())))
    odd.rename(odd.with_name("my rose 100%.jpg"))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        _Quiet, directory=str(tmp_path / "site")))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/flowers"
    try:
        result = scan_url(url)
        assert ("roses/my rose 100%.jpg", f"{url}/roses/my%20rose%20100%25.jpg") in [
            (it.relpath, it.path) for it in result.items]
        pack(url, tmp_path / "remote", **OPTS)
        with pytest.raises(SourceError, match=r"^source prefix 'http://.*/nothing' is empty or "
                           r"does not exist \(no object under it, or its page is not an index"):
            scan_url(url.replace("/flowers", "/nothing"))
    finally:
        httpd.shutdown()
    pack(local, tmp_path / "local", **OPTS)
    _same_pack(tmp_path / "remote", tmp_path / "local")
    assert len(_records(tmp_path / "remote")["train"]) > 100


def test_http_prefix_without_a_server_names_the_cause():
    with pytest.raises(SourceError, match=r"^cannot list source prefix 'http://127.0.0.1:1/x': "
                       r"ClientConnectorError: Cannot connect to host 127.0.0.1:1"):
        scan_url("http://127.0.0.1:1/x")


def test_empty_prefix_and_missing_bucket_are_one_line_errors(s3_server, tmp_path):
    empty = f"{s3_server.bucket()}/nothing-here"
    with pytest.raises(SourceError) as e:
        pack(empty, tmp_path / "a", **OPTS)
    assert str(e.value) == (f"source prefix {empty!r} is empty or does not exist (no object "
                            "under it)")
    missing = "s3://no-such-bucket-shardkit/flowers"
    with pytest.raises(SourceError) as e:
        pack(missing, tmp_path / "b", **OPTS)
    assert str(e.value).startswith(f"cannot list source prefix {missing!r}: NoSuchBucket: ")
    assert "\n" not in str(e.value) and not (tmp_path / "a").exists()


def test_no_credentials_names_the_cause(s3_server, monkeypatch):
    import s3fs

    url = f"{s3_server.bucket()}/flowers"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(name, "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()  # a cached instance holds the credentials
    try:
        with pytest.raises(SourceError, match=rf"^cannot list source prefix '{url}': "
                           "NoCredentialsError: Unable to locate credentials$"):
            scan_url(url)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_prefix_junk_only_and_bad_layout(s3_server):
    url = f"{s3_server.bucket()}/junk"
    _put(s3_server, f"{url}/LICENSE.txt", b"CC-BY")
    _put(s3_server, f"{url}/daisy/", b"")
    with pytest.raises(SourceError, match=r"source prefix '.*/junk' has no class folder with "
                       r"files .*ignored entries: 3: 'LICENSE.txt', 'daisy/', 'daisy'"):
        scan_url(url)
    with pytest.raises(ConfigError, match="layout='flat'"):
        scan_url(url, layout="flat")
    with pytest.raises(ConfigError, match=r"--layout class is for folder sources; .*\.csv"):
        scan_url(f"{url}/list.csv", layout="class")


def test_unknown_protocol_package_is_a_config_error():
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed: nothing is missing")
    with pytest.raises(ConfigError, match=r"source 'gs://bucket/flowers': the gs:// filesystem "
                       r"needs a package .*pip install gcsfs"):
        scan_url("gs://bucket/flowers")


@pytest.mark.ray
def test_prefix_on_ray_equals_local_engine(flowers, packs, tmp_path):
    ray = pytest.importorskip("ray")
    _, url = flowers
    local_engine = packs(url, **META)
    started = not ray.is_initialized()  # this test's own runtime, gone before the next module
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        pack(url, tmp_path / "ray", engine="ray", **OPTS, **META)
    finally:
        if started:
            ray.shutdown()
    _same_pack(tmp_path / "ray", local_engine)
    assert load_manifest(tmp_path / "ray")["source"] == load_manifest(local_engine)["source"]


def test_parallel_listing_equals_one_find(s3_server):
    from shardkit.sources import remote as scan_remote

    bucket = s3_server.bucket()
    keys = {"p/daisy/1.jpg": b"a", "p/daisy/": b"", "p/daisy/sub/2.jpg": b"b", "p/LICENSE": b"x",
            "p/rose": b"clash", "p/rose/3.jpg": b"c", "p/__MACOSX/._x": b"m", "p/empty/": b"",
            "p/tulip/deep/er/x.jpg": b"x", "px/other.jpg": b"o"}
    keys.update({f"p/many/{k:04d}.jpg": b"." for k in range(1500)})  # past one 1,000-key page
    s3_server.fs().pipe({f"{bucket}/{k}": v for k, v in keys.items()})
    base = bucket[len("s3://"):] + "/p"
    want = s3_server.fs().find(base, detail=True)
    got = scan_remote._list(s3_server.fs(), base)
    assert len(want) == len(keys) - 1 and sorted(got) == sorted(want)  # not px/
    assert {k: v["size"] for k, v in got.items()} == {k: v["size"] for k, v in want.items()}
    assert scan_remote._list(s3_server.fs(), base + "-missing") == {}
