"""Every command that cannot reach its store exits 2 with one ``Error:`` line naming the URL and the
store's own error, never a traceback and never exit 1 (which ``check`` and ``verify`` give for a
leak or damage): an unreachable endpoint (a closed port on 127.0.0.1, botocore's retries off) and
missing credentials, for verify, check, stats, inspect, train, bench, cache build and pack.
Object-store URLs where the readers take them (``bench --data``, ``pack --metadata``), on a local
S3 server (moto, the ``s3_server`` fixture); ``export`` of a URL says what it supports.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardkit.cli import main
from shardkit.cli_common import CommandError, cannot_run, is_store_error, printable_text
from shardkit.errors import ManifestError

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flowers-sample"
URL = "s3://shardkit-unreachable/ds"


def _fresh_s3() -> None:
    """No s3fs instance made under other AWS_* variables (the moto fixture's) is reused."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on return: connecting is refused at once


@pytest.fixture
def dead_endpoint(monkeypatch):
    """AWS_* variables of an S3 endpoint on a closed port, one attempt per request."""
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    _fresh_s3()
    yield endpoint
    _fresh_s3()


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "verify": ["verify", URL],
        "check": ["check", URL, "--no-progress"],
        "stats": ["stats", URL, "--no-progress"],
        "inspect": ["inspect", URL, "--out", str(tmp_path / "grids"), "--no-progress"],
        "train": ["train", "--data", URL, "--out", str(tmp_path / "run"), "--config",
                  "cpu-smoke"],
        "bench": ["bench", URL, "--out", str(tmp_path / "bench")],
        "bench --data": ["bench", "--data", URL, "--out", str(tmp_path / "bench")],  # old name
        "cache": ["cache", "build", URL, "--cache", f"disk:{tmp_path / 'cache'}"],
    }


def _one_error_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.mark.parametrize("command", ["verify", "check", "stats", "inspect", "train", "bench",
                                     "bench --data", "cache"])
def test_an_unreachable_endpoint_is_exit_2_with_one_line(dead_endpoint, tmp_path, command):
    result = CliRunner().invoke(main, ["-q", *_commands(tmp_path)[command]])
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert line.startswith(f"Error: {URL}: EndpointConnectionError: Could not connect to the "
                           f'endpoint URL: "{dead_endpoint}/shardkit-unreachable/ds/manifest.json"'
                           ), line
    assert result.output.strip() == line  # nothing else: no partial report
    assert not (tmp_path / "run").exists() and not (tmp_path / "bench").exists()


def test_pack_into_an_unreachable_endpoint_is_exit_2_with_one_line(dead_endpoint):
    result = CliRunner().invoke(main, ["-q", "pack", str(SAMPLE), URL, "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "EndpointConnectionError" in _one_error_line(result)


@pytest.mark.parametrize("command", ["verify", "check"])
def test_the_commands_themselves_map_store_errors_without_the_group(dead_endpoint, command):
    """The mapping is on each command too (a CliRunner or an application calling the click
    command object, not `shardkit ...`)."""
    from shardkit.doctor.cli import check_command
    from shardkit.doctor.verify import verify_command

    cmd = {"verify": verify_command, "check": check_command}[command]
    result = CliRunner().invoke(cmd, [URL])
    assert result.exit_code == 2, result.output
    assert _one_error_line(result).startswith(f"Error: {URL}: EndpointConnectionError: ")


@pytest.mark.parametrize("command", ["verify", "check", "inspect", "stats"])
def test_no_credentials_is_exit_2_naming_the_store_error(dead_endpoint, tmp_path, monkeypatch,
                                                          command):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    _fresh_s3()
    result = CliRunner().invoke(main, ["-q", *_commands(tmp_path)[command]])
    assert result.exit_code == 2, result.output
    assert _one_error_line(result) == \
        f"Error: {URL}: NoCredentialsError: Unable to locate credentials"


def test_store_errors_are_classified_and_named():
    botocore = pytest.importorskip("botocore.exceptions")
    denied = botocore.ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}},
                                  "GetObject")
    err = cannot_run(denied, ["--no-progress", URL])
    assert isinstance(err, CommandError) and err.exit_code == 2
    assert err.message == (f"{URL}: ClientError: An error occurred (AccessDenied) when calling "
                           "the GetObject operation: Access Denied")
    assert is_store_error(botocore.NoCredentialsError())
    assert is_store_error(PermissionError(13, "Permission denied"))
    local = cannot_run(PermissionError(13, "Permission denied", "/data/x/manifest.json"),
                       ["/data/x"])
    assert local.message == ("PermissionError: [Errno 13] Permission denied: "
                             "'/data/x/manifest.json'")  # no URL argument: no URL named
    named = cannot_run(ManifestError("a\n  b"), [URL])
    assert named.message == "ManifestError: a b"  # shardkit's own errors: as before, one line
    assert cannot_run(KeyError("bug"), [URL]) is None  # a bug keeps its traceback
    assert not is_store_error(ValueError("a shardkit bug"))
    import fsspec

    with pytest.raises(ValueError) as raised:  # raised by fsspec's own code: the store's error
        fsspec.filesystem("no-such-protocol")
    assert is_store_error(raised.value)
    assert cannot_run(raised.value, ["no-such-protocol://b/ds"]).message == (
        "no-such-protocol://b/ds: ValueError: Protocol not known: no-such-protocol")


def test_printable_text_escapes_the_bytes_of_non_utf8_names():
    import os

    assert printable_text(os.fsdecode(b"caf\xe9")) == "caf\\xe9"
    assert printable_text("caf\u00e9 ok") == "caf\u00e9 ok"
    assert printable_text("x\ud800y") == "x\\ud800y"  # no byte behind it: the code point


# ------------------------------------------------------------------ URLs where readers take them
def test_export_of_a_url_says_it_writes_into_a_local_folder():
    result = CliRunner().invoke(main, ["export", URL])
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert line.startswith(f"Error: ConfigError: {URL}: export writes into a local dataset "
                           "folder; URL not supported"), line


def test_pack_metadata_from_object_storage_groups_as_the_local_csv(s3_server, tmp_path):
    """--metadata s3://.../metadata.csv (it said "File ... does not exist"): the same groups,
    split and manifest as the local CSV, the URL recorded as the group rule's csv."""
    from shardkit.dataset.manifest import load_manifest, read_split_records

    _fresh_s3()
    url = s3_server.bucket() + "/lists"
    s3_server.fs().pipe(f"{url}/metadata.csv", (SAMPLE / "metadata.csv").read_bytes())
    args = ["--group-column", "group_flickr_user", "--near-duplicates", "off",
            "--shard-samples", "100", "--no-progress"]
    remote = CliRunner().invoke(main, ["-q", "pack", str(SAMPLE), str(tmp_path / "r"),
                                       "--metadata", f"{url}/metadata.csv", *args])
    assert remote.exit_code == 0, remote.output
    local = CliRunner().invoke(main, ["-q", "pack", str(SAMPLE), str(tmp_path / "l"),
                                      "--metadata", str(SAMPLE / "metadata.csv"), *args])
    assert local.exit_code == 0, local.output
    got, want = load_manifest(tmp_path / "r"), load_manifest(tmp_path / "l")
    assert got["split"]["group_rule"] == {"kind": "column", "csv": f"{url}/metadata.csv",
                                          "column": "group_flickr_user"}
    assert want["split"]["group_rule"]["csv"] == str((SAMPLE / "metadata.csv").resolve())
    for split in want["splits"]:
        rows = [(r["path"], r["group"]) for r in read_split_records(tmp_path / "r", split)]
        assert rows == [(r["path"], r["group"]) for r in read_split_records(tmp_path / "l",
                                                                             split)]
        assert got["splits"][split]["num_groups"] == want["splits"][split]["num_groups"]
    assert sum(s["num_samples"] for s in got["splits"].values()) == 200
    missing = CliRunner().invoke(main, ["-q", "pack", str(SAMPLE), str(tmp_path / "m"),
                                        "--metadata", f"{url}/nope.csv", *args])
    assert missing.exit_code == 2
    assert _one_error_line(missing).startswith(
        f"Error: SourceError: cannot read CSV '{url}/nope.csv'")
    assert not (tmp_path / "m").exists()


def test_bench_reads_a_dataset_in_object_storage(s3_server, packed_sample, tmp_path):
    """bench --data s3://... (it said "Directory ... does not exist"): the loader reads it."""
    _fresh_s3()
    url = s3_server.bucket() + "/bench"
    s3_server.upload_tree(packed_sample("wds"), url)
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, [
        "-q", "bench", "--data", url, "--out", str(out), "--num-workers", "0",
        "--prefetch-factor", "none", "--pin-memory", "off", "--batch-size", "8",
        "--image-size", "32", "--warmup", "0", "--batches", "2", "--repeats", "1"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    doc = json.loads((out / "bench.json").read_text())
    assert doc["config"]["data"] == [url]
    (row,) = doc["rows"]
    assert row["status"] == "ok" and row["setting"]["data"] == url, row
