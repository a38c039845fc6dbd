"""The fuzz suite: a packed dataset is untrusted input (docs/RELIABILITY.md).

Small real datasets (30 flower photos of the embedded sample, scaled to at most 96 px, in 4-sample
shards, one per format) are mutated a few hundred ways, seeded: flipped, truncated, extended or
zeroed bytes in any file; manifest, ``_info.json`` and ``.jsonl`` fields deleted, retyped,
swapped, renamed, nested 100,000 deep or pointed outside the folder; split-index arrays with
out-of-range values, other dtypes or shapes, missing or pickled; files deleted, replaced by a
folder, by a symlink out, or by another file of the same kind. On every mutant every command
(verify, check, stats, inspect, cache build, export) and the loader run; about one mutant in ten
is a damaged disk cache of the val split instead (the loader over it, then ``cache build``), and
one in twenty a damaged training checkpoint at ``train --resume``. All run in worker
processes (tests/fuzz_worker.py), and the rule is asserted: exit 0/1, or 2 with one ``Error:`` line; no
traceback, no signal; nothing written or read outside the folder; every served sample equal to the
packed one, or a ShardkitError; verify OK only when the loader serves the packed samples.

``pytest tests/test_fuzz.py --fuzz-mutants 2000`` runs more (the default is :data:`CI_MUTANTS`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from conftest import SAMPLE

WORKER = Path(__file__).with_name("fuzz_worker.py")
CI_MUTANTS = 240
SEED = 20261201
IMAGE_SIZE = 48


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    from shardkit.packer.run import pack

    root = tmp_path_factory.mktemp("fuzz-bases")
    src = root / "src"
    for cls in sorted(p for p in SAMPLE.iterdir() if p.is_dir()):
        for photo in sorted(cls.glob("*.jpg"))[:6]:
            (src / cls.name).mkdir(parents=True, exist_ok=True)
            with Image.open(photo) as im:
                im.thumbnail((96, 96))
                im.save(src / cls.name / photo.name, quality=90)
    found = {}
    for fmt in ("wds", "lmdb", "hdf5"):
        out = root / fmt
        pack(src, out, format=fmt, split={"train": 0.6, "val": 0.2, "test": 0.2}, seed=0,
             shard_samples=4, progress=False)
        truth = root / f"{fmt}-truth.json"
        subprocess.run([sys.executable, str(WORKER), "--truth", str(out), str(truth),
                        str(IMAGE_SIZE)], check=True)
        found[fmt] = {"path": str(out), "truth": str(truth), "image_size": IMAGE_SIZE}
    from shardkit.train import load_config, train

    run = root / "run"
    train(load_config("cpu-smoke", data=found["wds"]["path"], out=str(run), model="test_resnet",
                      image_size=32, batch_size=8, epochs=1, max_steps=1, num_workers=0,
                      warmup_steps=0))
    found["checkpoint"] = {"path": str(run / "checkpoints" / "last.pt")}
    listing = root / "bases.json"
    listing.write_text(json.dumps(found))
    return listing


def _run_range(bases: Path, work: Path, first: int, count: int, report: Path):
    """Starts a worker over mutants [first, first + count); returns the Popen."""
    return subprocess.Popen([sys.executable, str(WORKER), str(bases), str(work), str(first),
                             str(count), str(SEED), str(report)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})


def _fuzz(bases: Path, work: Path, total: int, workers: int = 2) -> tuple[list, list]:
    """Runs mutants 0..total-1 over ``workers`` processes; a worker that dies (a signal, an
    exit) is recorded against the mutant it was running and restarted after it."""
    per = -(-total // workers)
    ranges = [(w * per, min(per, total - w * per)) for w in range(workers) if w * per < total]
    done, crashed = [], []
    todo = [(first, count, work / f"r{first}.jsonl") for first, count in ranges]
    while todo:
        procs = [(first, count, report, _run_range(bases, work, first, count, report))
                 for first, count, report in todo]
        todo = []
        for first, count, report, proc in procs:
            _, err = proc.communicate(timeout=3600)
            started, finished = None, set()
            for line in report.read_text().splitlines() if report.exists() else []:
                entry = json.loads(line)
                if "start" in entry:
                    started = entry["start"]
                else:
                    finished.add(entry["done"]["mutant"])
                    done.append(entry["done"])
            if proc.returncode != 0 or (started is not None and started not in finished):
                crashed.append({"mutant": started, "returncode": proc.returncode,
                                "stderr": err.decode(errors="replace")[-1500:]})
                nxt = (started if started is not None else first) + 1
                if nxt < first + count:
                    todo.append((nxt, first + count - nxt, work / f"r{nxt}.jsonl"))
    return done, crashed


def test_every_mutant_keeps_the_rule(bases, tmp_path, request):
    total = request.config.getoption("--fuzz-mutants") or CI_MUTANTS
    done, crashed = _fuzz(bases, tmp_path, total)
    failures = [m for m in done if m["problems"]]
    lines = [f"mutant {m['mutant']} ({m['format']}, {m['mutation'][:100]}): "
             + " | ".join(p[:300] for p in m["problems"][:3]) for m in failures[:25]]
    lines += [f"mutant {c['mutant']}: worker died (returncode {c['returncode']}): "
              f"{c['stderr'][-600:]}" for c in crashed[:10]]
    assert len(done) + len(crashed) == total
    assert not failures and not crashed, (
        f"{len(failures)} of {total} mutants broke the rule, {len(crashed)} killed the "
        "worker:\n" + "\n".join(lines))
    # the suite really mutated: most mutants were noticed by verify or the loader
    datasets = [m for m in done if "verify" in m["results"]]
    noticed = sum(m["results"]["verify"] != 0 or m["results"]["loader"] == "raised"
                  for m in datasets)
    assert len(datasets) >= total // 2 and noticed >= len(datasets) // 2, (
        f"only {noticed} of {len(datasets)} dataset mutants were noticed")
    kinds = {m["format"] for m in done} | {m["mutation"].split(" ")[0] for m in done}
    assert {"wds", "lmdb", "hdf5", "checkpoint", "cache"} <= kinds, kinds
