"""Field case 2: a real ``torchrun --nproc_per_node 2`` run (gloo, CPU) of tests/dist_worker.py
over 8 shards x 10 real photos, 2 workers per rank: union of keys == 80, no overlap, equal batch
counts; rank/world come from the process group, not from arguments."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_dataset import build_split

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
    # make_loader (train, world 2 -> even="pad"): same batch count on both ranks, len exact
    assert [r["even"] for r in ranks] == ["pad", "pad"]
    assert [r["loader_batches"] for r in ranks] == [r["loader_len"] for r in ranks] == [14, 14]
    idx = [i for r in ranks for i, v in zip(r["loader_index"], r["loader_valid"]) if v]
    assert sorted(idx) == list(range(80))
