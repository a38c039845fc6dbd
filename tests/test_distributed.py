"""Field case 2: a real ``torchrun --nproc_per_node 2`` run (gloo, CPU) of tests/dist_worker.py
over 8 shards x 10 real photos, 2 workers per rank (DataLoader processes for ShardDataset;
threads and processes for make_loader): union of keys == 80, no overlap, equal batch counts;
rank/world come from the process group, not from arguments."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import build_split

HERE = Path(__file__).resolve().parent


def test_torchrun_two_ranks_exactly_once(sample_dir, tmp_path):
    root = tmp_path / "data"
    records = build_split(sample_dir, root, "wds", [10] * 8, stride=2)
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", "0", "--rdzv_backend", "c10d",
           "--rdzv_endpoint", "127.0.0.1:0", str(HERE / "dist_worker.py"),
           "--root", str(root), "--out", str(out), "--batch-size", "3"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        pytest.fail(f"torchrun failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-6000:]}")
    ranks = json.loads(out.read_text())
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["dataset_world"] for r in ranks] == [[0, 2], [1, 2]]  # from the process group
    all_keys = {r["key"] for r in records}
    # ShardDataset: exactly-once, ranks share nothing
    a, b = (r["dataset_keys"] for r in ranks)
    assert len(a) == len(b) == 40 and not set(a) & set(b)
    assert set(a) | set(b) == all_keys and len(all_keys) == 80
    # make_loader (train, world 2 -> even="pad"), either backend: same batch count on both
    # ranks, len exact, every sample once among the valid rows, the same plan on both backends
    for backend in ("thread", "process"):
        got = [r["loaders"][backend] for r in ranks]
        assert [g["world"] for g in got] == [[0, 2], [1, 2]]
        assert [g["even"] for g in got] == ["pad", "pad"]
        assert [g["batches"] for g in got] == [g["len"] for g in got] == [14, 14]
        idx = [i for g in got for i, v in zip(g["index"], g["valid"]) if v]
        assert sorted(idx) == list(range(80))
    assert [r["loaders"]["thread"]["index"] for r in ranks] == \
        [r["loaders"]["process"]["index"] for r in ranks]
