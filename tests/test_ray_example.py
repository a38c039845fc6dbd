"""examples/ray_train.py runs: a 2-node ``ray.cluster_utils.Cluster`` (1 CPU each) packs the
embedded flowers sample with ``engine="ray"`` and trains ``shardkit train``'s model for a few
steps from ``shardkit.ray.read_split``."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")  # only for users without the extra: CI installs it

pytestmark = pytest.mark.ray

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ray_train.py"


def test_ray_train_example_on_two_nodes():
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "3", "--batch-size", "8"],
                          capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-3000:]
    assert re.search(r"^cluster up in [\d.]+ s: 2 nodes, 2 CPUs$", out, re.M), out
    assert re.search(r"^packed 200 images on Ray", out, re.M), out
    losses = [float(v) for v in re.findall(r"^epoch 0 step \d: loss ([\d.]+),", out, re.M)]
    assert len(losses) == 3 and all(0.5 < v < 5 for v in losses), out  # ln(5) = 1.61 at start
    assert "ok: 3 steps" in out
