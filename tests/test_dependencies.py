"""shardkit's runtime dependencies: what pyproject.toml lists is what shardkit needs to run.

``webdataset`` is a test and benchmark dependency (the ``test`` extra: tests/test_formats.py and
tests/test_interop.py read packed shards with it, benchmarks/bench_pack.py times its
ShardWriter), and ``requests`` is not used (fsspec's HTTP filesystem runs on ``aiohttp``).
A fresh interpreter where neither can be imported imports every shardkit module, packs a
``wds`` dataset from real photos and reads it back with ``make_loader``.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_RUNTIME = ("webdataset", "requests")
RAY_EXTRA_MODULES = ("shardkit.ray.datasource",)
"""Modules that import Ray at module level (the ``ray`` extra; Ray itself needs requests)."""

_SCRIPT = r"""
import importlib, json, pkgutil, sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` raises ImportError, as when it is not installed
import shardkit
names = [m.name for m in pkgutil.walk_packages(shardkit.__path__, "shardkit.")]
for name in names:
    if name in {extras!r}:
        continue
    importlib.import_module(name)
import shardkit.formats.wds, shardkit.stream
from shardkit.cli import main
from shardkit.stream import make_loader
from shardkit.transforms import TransformConfig
src, out = sys.argv[1], sys.argv[2]
main(["pack", src, out, "--format", "wds", "--split", "train=1.0", "--near-duplicates", "off",
      "--no-progress"], standalone_mode=False)
with make_loader(out, "train", 4, transform=TransformConfig(image_size=32)) as loader:
    batches = [list(b[0].shape) for b in loader]
leaked = sorted(n for n in {blocked!r} if sys.modules.get(n) is not None)
print(json.dumps({{"modules": names, "batches": batches, "leaked": leaked}}))
"""


def _dist_name(requirement: str) -> str:
    """``"webdataset>=0.2"`` -> ``"webdataset"`` (name before any version or extra)."""
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i].lower()
    return requirement.lower()


def test_webdataset_and_requests_are_not_runtime_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_dist_name(r) for r in project["dependencies"]}
    assert not runtime & set(NOT_RUNTIME), runtime
    assert {"fsspec", "aiohttp"} <= runtime  # https:// reads: fsspec's HTTPFileSystem
    assert "webdataset" in {_dist_name(r) for r in project["optional-dependencies"]["test"]}


def test_shardkit_imports_packs_and_reads_without_webdataset_or_requests(sample_dir, tmp_path):
    src = tmp_path / "src"
    for cls in ("daisy", "roses"):
        (src / cls).mkdir(parents=True)
        for photo in sorted((sample_dir / cls).glob("*.jpg"))[:3]:
            shutil.copy(photo, src / cls / photo.name)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(blocked=NOT_RUNTIME, extras=RAY_EXTRA_MODULES), str(src),
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"shardkit.formats.wds", "shardkit.stream.loader", "shardkit.interop.shards",
            "shardkit.cli", "shardkit.bench.cli"} <= set(got["modules"])
    assert got["batches"] == [[4, 3, 32, 32], [2, 3, 32, 32]]  # all 6 photos, in 2 batches
    assert got["leaked"] == []
    assert list((tmp_path / "out" / "shards").glob("train-*.tar"))
