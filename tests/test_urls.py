"""The URL rule in one place (shardkit.storage.urls)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shardkit
from shardkit.errors import ConfigError, ManifestError
from shardkit.storage.urls import (
    is_url, join, local_path, read_location, split_url, url_protocol)

ROOT = Path(shardkit.__file__).parent
_STR_METHODS = {"partition", "rpartition", "split", "rsplit", "startswith", "endswith", "find",
                "index", "count", "removeprefix"}


@pytest.mark.parametrize("location, remote, protocol", [
    ("s3://bucket/ds", True, "s3"),
    ("S3://bucket/ds", True, "s3"),
    ("https://host/a/b", True, "https"),
    ("simplecache::s3://bucket/k", True, "s3"),
    ("gs://b", True, "gs"),
    ("file:///tmp/x", False, ""),
    ("FILE:///tmp/x", False, ""),
    ("/data/flowers", False, ""),
    ("flowers", False, ""),
    ("./odd/name://x", False, ""),  # a "scheme" with a slash is a local path
    ("://x", False, ""),
    (Path("/tmp/x"), False, ""),
    (b"s3://bucket/k", True, "s3"),
])
def test_url_rule(location, remote, protocol):
    assert is_url(location) is remote
    assert url_protocol(location) == protocol


def test_split_url_round_trips():
    for url in ("s3://b/k/a.jpg", "simplecache::s3://b/k", "https://host:8000/a"):
        scheme, rest = split_url(url)
        assert f"{scheme}://{rest}" == url
    assert split_url("simplecache::s3://b/k") == ("simplecache::s3", "b/k")
    with pytest.raises(ConfigError, match="'/tmp/x' is not a remote URL"):
        split_url("/tmp/x")


def test_local_path_join_and_read(tmp_path):
    folder = tmp_path / "my data"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"\x00\x01")
    assert local_path(folder.as_uri()) == str(folder)
    assert join(folder.as_uri(), "a.bin") == str(folder / "a.bin")
    assert join("s3://b/ds/", "splits/x.jsonl") == "s3://b/ds/splits/x.jsonl"
    assert read_location(join(folder, "a.bin")) == b"\x00\x01"
    with pytest.raises(ManifestError, match="is a remote URL, not a local path"):
        local_path("s3://b/ds")
    with pytest.raises(ManifestError, match="expected a local file URL"):
        local_path("file://otherhost/x")


def _url_parsing_outside_urls(root: Path) -> list[str]:
    """``file:line`` of every string-method call or ``in`` test on a literal containing "://"
    (telling a URL from a path by hand) outside storage/urls.py."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "storage/urls.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            literals = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _STR_METHODS:
                literals = [a for arg in node.args for a in ast.walk(arg)]
            elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn))
                                                       for o in node.ops):
                literals = [node.left]
            if any(isinstance(c, ast.Constant) and isinstance(c.value, str) and "://" in c.value
                   for c in literals):
                found.append(f"{rel}:{node.lineno}")
    return found


def test_no_module_parses_urls_by_hand():
    assert _url_parsing_outside_urls(ROOT) == []


def test_the_url_scan_can_fail(tmp_path):
    (tmp_path / "m.py").write_text('a = x.partition("://")\nb = y.startswith(("s3://", "gs://"))\n'
                                   'c = "://" in z\nd = f"{p}://{q}"\n')
    assert _url_parsing_outside_urls(tmp_path) == ["m.py:1", "m.py:2", "m.py:3"]
