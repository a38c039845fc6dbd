"""scripts/gpu_check.py: the prepared GPU check runs every phase (``--dry-run`` on the CPU), and
records a dead, hung or failing part instead of stopping."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gpu_check = _module()


def test_dry_run_measures_every_pipeline_and_prints_the_table(tmp_path):
    """The whole script on the CPU, as the first GPU session will run it, tiny sizes. DALI runs
    where ``$DALI_VENV`` names its venv; elsewhere it must be recorded as not run, with why."""
    out = tmp_path / "gpu_check.json"
    dali = os.environ.get("DALI_VENV", str(tmp_path / "no-dali-venv"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out),
                          "--work", str(tmp_path / "work"), "--dali-venv", dali],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["dry_run"] is True and doc["config"]["model"] == "test_resnet"
    for name in ("synthetic", "cpu_decode", "device_decode", "device_augment"):
        p = doc["pipelines"][name]
        assert p["status"] == "ok", (name, p)
        assert p["img_per_s"] > 0 and 0.0 <= p["data_wait_fraction"] <= 1.0, (name, p)
        assert p["steps_timed"] == 3 and p["images_timed"] == 3 * 8, (name, p)
        assert p["ratio_to_synthetic"] > 0
    pipes = doc["pipelines"]
    assert pipes["synthetic"]["ratio_to_synthetic"] == 1.0
    # what really ran: the fused CPU decode; the batched decode_jpeg code; the batched tensor
    # augmentation (the CUDA code paths, on the CPU)
    assert pipes["cpu_decode"]["augment_device"] is None
    assert pipes["cpu_decode"]["decoder_info"]["name"] in ("roi", "turbojpeg", "pil")
    assert "decode_jpeg" in pipes["device_decode"]["decoder"]
    assert pipes["device_decode"]["augment_device"] == "cpu"
    assert pipes["device_augment"]["augment_device"] == "cpu:0"
    assert pipes["device_augment"]["augment"].startswith("standard on cpu:0 (batched")
    dali_res = pipes["dali"]
    if "DALI_VENV" in os.environ:
        assert dali_res["status"] == "ok" and dali_res["img_per_s"] > 0, dali_res
    else:
        assert dali_res["status"] == "not run", dali_res
        assert dali_res["reason"].startswith("venv absent: run benchmarks/peers/make_venv.sh "
                                             "dali"), dali_res
    tests = doc["phases"]["tests"]
    assert tests["status"] == "ok", tests
    assert tests["skipped"] + tests["passed"] >= 1 and tests["failed"] == tests["errors"] == 0
    if not torch.cuda.is_available():
        assert tests["passed"] == 0 and tests["skipped"] >= 1, tests
    gen, pk = doc["phases"]["generate"], doc["phases"]["pack"]
    assert gen["status"] == "ok" and gen["images"] == 64 and gen["classes"] == 10
    assert 80 <= gen["mean_kb"] <= 200, gen  # photo-like at q90
    assert pk["status"] == "ok" and pk["samples"] == 64 and pk["seconds"] > 0
    assert doc["environment"]["cpu_cores_usable"] >= 1
    assert doc["verdict"]["met"] is None
    # the table
    for label in gpu_check.PIPELINES.values():
        assert label in res.stdout
    assert "DRY RUN" in res.stdout and "verdict: none (dry run" in res.stdout
    assert f"JSON: {out}" in res.stdout


def test_synthesised_jpegs_are_photo_sized_and_deterministic():
    a, b = gpu_check.synth_jpeg(3), gpu_check.synth_jpeg(3)
    assert a == b and a != gpu_check.synth_jpeg(4)
    with Image.open(io.BytesIO(a)) as im:
        assert im.format == "JPEG" and im.mode == "RGB"
        assert im.size in [size for size, _ in gpu_check.SIZES]
    sizes = [len(gpu_check.synth_jpeg(i)) for i in range(6)]
    assert all(70_000 <= s <= 220_000 for s in sizes), sizes


STUB = textwrap.dedent("""
    import json, sys, time
    spec = json.load(open(sys.argv[2]))
    progress = open(spec["progress"], "a")
    def emit(**event):
        progress.write(json.dumps(event) + "\\n")
        progress.flush()
    if "no-ready" in spec["pipelines"]:
        sys.exit(4)
    if "slow-start" in spec["pipelines"]:
        time.sleep(120)
    emit(event="ready", seconds=0.0)
    for name in spec["pipelines"]:
        emit(event="start", pipeline=name)
        if name == "dies":
            sys.exit(3)
        if name == "hangs":
            time.sleep(120)
        emit(event="result", pipeline=name, status="ok", img_per_s=10.0,
             data_wait_fraction=0.0)
""")


def _workers(tmp_path, names, monkeypatch):
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    (tmp_path / "logs").mkdir(exist_ok=True)
    monkeypatch.setattr(gpu_check, "GRACE_S", 0.5)
    caps = {"startup": 1 if "slow-start" in names else 30, **{n: 30 for n in names}, "hangs": 1}
    workers = gpu_check.Workers(tmp_path, gpu_check.Budget(300), caps, script=stub)
    return workers, workers.run(sys.executable, names, {}, "stub")


def test_a_dead_or_hung_worker_is_recorded_and_the_rest_still_run(tmp_path, monkeypatch):
    names = ["first", "dies", "after", "hangs", "last"]
    workers, res = _workers(tmp_path, names, monkeypatch)
    assert sorted(res) == sorted(names)
    assert [res[n]["status"] for n in names] == ["ok", "failed", "ok", "cut", "ok"]
    assert res["dies"]["reason"] == "its worker died (exit 3)"
    assert res["hangs"]["reason"].startswith("its worker was killed 0 s past the cap (1 s)")
    assert [a["pipelines"] for a in workers.attempts] == [names, names[2:], names[4:]]
    assert workers.attempts[1]["killed"] and workers.attempts[0]["killed"] is None


@pytest.mark.parametrize("first,reason", [
    ("no-ready", "its worker exited (exit 4) before running it"),
    ("slow-start", "its worker did not get ready within the startup cap (1 s) and was killed"),
])
def test_a_worker_that_never_gets_ready_fails_every_pipeline_once(tmp_path, monkeypatch, first,
                                                                   reason):
    workers, res = _workers(tmp_path, [first, "other"], monkeypatch)
    assert len(workers.attempts) == 1
    assert sorted(res) == sorted([first, "other"])
    for r in res.values():
        assert r["status"] == "failed" and r["reason"] == reason, r


def test_gpu_test_counts_come_from_pytest_and_an_overrun_is_cut(tmp_path, monkeypatch):
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_x.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.mark.gpu
        def test_passes():
            pass

        @pytest.mark.gpu
        def test_fails():
            assert 1 == 2

        @pytest.mark.gpu
        def test_skips():
            pytest.skip("no CUDA")

        def test_not_gpu_marked():
            assert False

        @pytest.mark.gpu
        def test_sleeps():
            if __import__("os").environ.get("GPU_CHECK_TEST_SLEEP"):
                time.sleep(120)
    """))
    (tmp_path / "logs").mkdir()
    res = gpu_check.run_gpu_tests(tmp_path, 120, str(tests))
    assert res["status"] == "failed", res
    assert (res["passed"], res["failed"], res["skipped"], res["errors"]) == (2, 1, 1, 0), res
    # the class name starts at pytest's rootdir, which depends on where the clone lies
    assert len(res["failures"]) == 1 and res["failures"][0].split(".")[-1] == \
        "test_x::test_fails", res
    monkeypatch.setenv("GPU_CHECK_TEST_SLEEP", "1")
    cut = gpu_check.run_gpu_tests(tmp_path, 3, str(tests))
    assert cut["status"] == "cut" and "past its cap (3 s)" in cut["reason"], cut


def _doc(pipes, dry=False):
    return {"dry_run": dry, "phases": {"tests": {"status": "ok"}},
            "pipelines": {n: {"img_per_s": v[0], "data_wait_fraction": v[1]}
                          for n, v in pipes.items()}}


@pytest.mark.parametrize("pipes,met,best", [
    ({"synthetic": (1000, 0.0), "cpu_decode": (960, 0.02), "device_decode": (900, 0.1)},
     True, "cpu_decode"),
    ({"synthetic": (1000, 0.0), "cpu_decode": (940, 0.02)}, False, "cpu_decode"),
    ({"synthetic": (1000, 0.0), "device_augment": (990, 0.06)}, False, "device_augment"),
    # the fastest waits too long, a slower one meets both bounds: met, by that one
    ({"synthetic": (1000, 0.0), "cpu_decode": (990, 0.06), "device_decode": (955, 0.01)},
     True, "device_decode"),
    ({"cpu_decode": (990, 0.0)}, None, "cpu_decode"),
    ({"synthetic": (1000, 0.0)}, None, None),
])
def test_verdict(pipes, met, best):
    v = gpu_check.verdict(_doc(pipes))
    assert v["met"] is met and v["best"] == best, v
    assert v["line"].startswith("verdict: ")
    if met is not None:
        assert ("goal MET" if met else "goal NOT MET") in v["line"]
    assert gpu_check.verdict(_doc(pipes, dry=True))["met"] is None
