"""shardkit bench: harness correctness, N/A grid rows, environment report, CLI (field case 20)."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import PIL
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from shardkit.bench import (ProcessMonitor, SleepStep, expand_grid, measure, recommend,
                            time_batches)
from shardkit.bench.env import (collect_environment, describe_pil, libjpeg_turbo_version_of,
                                pil_mismatches)
from shardkit.bench.grid import Setting, parse_backends, parse_caches, parse_int_list
from shardkit.bench.runner import RunConfig, run_rows
from shardkit.errors import BenchError, ConfigError
from shardkit.stream.memory import tmpfs_huge


class FixedDelayLoader:
    """Yields ``n`` batches of 4 uint8 images, each after blocking ``ms`` milliseconds."""

    def __init__(self, n: int, ms: float):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.ms / 1000.0)
            yield torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.full((4,), i)


class SleepyDataset(Dataset):
    """``n`` items of (uint8 (3, 8, 8), label) that each take ``ms`` ms (sleep, or CPU spin)."""

    def __init__(self, n: int, ms: float, spin: bool = False):
        self.n, self.ms, self.spin = n, ms, spin

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.spin:
            end = time.process_time() + self.ms / 1000.0
            while time.process_time() < end:
                pass
        else:
            time.sleep(self.ms / 1000.0)
        return torch.zeros(3, 8, 8, dtype=torch.uint8), i


# --- case 20: the harness measures known delays within +-10% ---------------------------------

class VirtualClock:
    """A clock that only moves when the fake loader or step says so (seconds)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, ms: float) -> None:
        self.t += ms / 1000.0


def test_fixed_20ms_loader_and_30ms_step_attributed_exactly_on_a_virtual_clock():
    clock = VirtualClock()

    def loader():
        for i in range(12):
            clock.advance(500.0 if i < 2 else 20.0)  # the 2 warm-up batches are slow
            yield torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4)

    class Step30(SleepStep):
        def __call__(self, batch):
            clock.advance(30.0)

    run = time_batches(loader(), Step30(0), warmup=2, max_batches=8, clock=clock)
    m = run.metrics()
    assert len(run.loader_ms) == 8 and run.images == 32
    assert m["loader_ms_per_batch"] == pytest.approx(20.0, rel=1e-9)
    assert m["step_ms_per_batch"] == pytest.approx(30.0, rel=1e-9)
    assert m["data_wait_fraction"] == pytest.approx(0.4, rel=1e-9)
    assert m["throughput_img_s"] == pytest.approx(80.0, rel=1e-9)


def test_fixed_20ms_loader_and_30ms_step_measured_within_10_percent():
    # Real sleeps: the machine is shared, so sleeps may overshoot; the harness must report the
    # delays that really happened (timed inside the fake) within +-10%.
    true_loader, true_step = [], []

    class Timed(FixedDelayLoader):
        def __iter__(self):
            for i in range(self.n):
                t0 = time.perf_counter()
                time.sleep(self.ms / 1000.0)
                true_loader.append((time.perf_counter() - t0) * 1000.0)
                yield torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4)

    class TimedStep(SleepStep):
        def __call__(self, batch):
            t0 = time.perf_counter()
            super().__call__(batch)
            true_step.append((time.perf_counter() - t0) * 1000.0)

    res = measure(lambda r: Timed(10, 20.0), TimedStep(30.0), repeats=1, warmup=2,
                  max_batches=8, monitor=False)
    loader = res["metrics"]["loader_ms_per_batch"]["median"]
    step = res["metrics"]["step_ms_per_batch"]["median"]
    assert res["batches_timed"] == [8] and res["images_timed"] == [32]
    want_loader = sum(true_loader[2:]) / 8  # warm-up excluded
    want_step = sum(true_step[2:]) / 8
    assert want_loader >= 20.0 and want_step >= 30.0
    assert loader == pytest.approx(want_loader, rel=0.10)
    assert step == pytest.approx(want_step, rel=0.10)
    assert 18.0 <= loader <= 30.0 and 27.0 <= step <= 40.0  # sleeps overshoot, never undershoot


def test_warmup_batches_are_excluded_from_timing():
    class SlowStart(FixedDelayLoader):
        def __iter__(self):
            time.sleep(0.3)  # e.g. worker start-up: must land in warm-up, not in the numbers
            yield from super().__iter__()

    run = time_batches(SlowStart(6, 5.0), warmup=1)
    assert len(run.loader_ms) == 5
    assert max(run.loader_ms) < 50.0, run.loader_ms


def test_step_much_longer_than_loader_gives_near_zero_data_wait():
    # 2 workers each build a batch in ~20 ms; the step takes 200 ms: batches are always ready,
    # and what is left is the hand-over (unpickling, scheduling on a busy 2-core box).
    loader = DataLoader(SleepyDataset(28, 5.0), batch_size=4, num_workers=2, prefetch_factor=2)
    res = measure(lambda r: loader, SleepStep(200.0), repeats=1, warmup=2, max_batches=4,
                  monitor=False)
    frac = res["metrics"]["data_wait_fraction"]["median"]
    assert frac < 0.10, frac  # vs 20 / (20 + 200) = 0.09 with no prefetch, and > 0.9 below
    rec = recommend([_ok_row(0, 2, 2, res)], SleepStep(200.0).info())
    assert rec["data_bound"] is False


def test_tiny_step_is_data_bound():
    res = measure(lambda r: FixedDelayLoader(8, 20.0), SleepStep(0.5), repeats=1, warmup=1,
                  max_batches=6, monitor=False)
    frac = res["metrics"]["data_wait_fraction"]["median"]
    # 20 / (20 + 0.5) = 0.98 on an idle machine; a 0.5 ms sleep can return ms late on a busy one
    assert frac > 0.75, frac
    rec = recommend([_ok_row(0, 0, None, res)], SleepStep(0.5).info())
    assert rec["data_bound"] is True
    assert "DATA-BOUND" in rec["text"]


def test_loader_too_short_for_warmup_raises_bench_error():
    with pytest.raises(BenchError, match="warm-up"):
        time_batches(FixedDelayLoader(2, 0.0), warmup=3)
    with pytest.raises(ConfigError, match="warmup=-1"):
        time_batches(FixedDelayLoader(2, 0.0), warmup=-1)


def test_monitor_counts_worker_cpu_and_reports_pss():
    import psutil

    # children left by earlier tests (a forkserver, a persistent worker pool) are counted too
    others = len(psutil.Process().children(recursive=True))
    loader = DataLoader(SleepyDataset(24, 15.0, spin=True), batch_size=2, num_workers=2)
    mon = ProcessMonitor(interval=0.1)
    run = time_batches(loader, warmup=2, monitor=mon)
    res = run.resources
    assert res["processes"] == 3 + others  # main + 2 workers (+ unrelated children)
    assert res["memory_kind"] == "pss"
    # the main process mostly blocks on the queue; only the spinning workers can make this > 0.2
    assert res["cpu_util_cores"] > 0.2, res
    assert 10 < res["memory_mb"] < 64 * 1024


# --- case 20: the grid never crashes on num_workers=0 x prefetch --------------------------

def test_grid_num_workers_0_prefetch_recorded_na_and_run_once():
    rows = expand_grid([("d", "wds")], ["auto"], [0, 1], [2, 4], (False, True), (False, True),
                       pin_available=False, backends=("process",))
    assert len(rows) == 2 * 2 * 2 * 2
    zero = [r for r in rows if r.requested.num_workers == 0]
    runs = [r for r in zero if r.status == "run"]
    assert len(runs) == 1
    ran = runs[0].setting
    assert (ran.prefetch_factor, ran.persistent_workers, ran.pin_memory) == (None, False, False)
    assert "prefetch_factor=2 does not apply with num_workers=0" in runs[0].note
    for r in zero:
        if r is not runs[0]:
            assert r.status == "n/a" and r.same_as == runs[0].id, r
    na4 = [r for r in zero if r.requested.prefetch_factor == 4]
    assert all("prefetch_factor=4 does not apply" in r.note for r in na4)
    one = [r for r in rows if r.requested.num_workers == 1]
    assert sorted((r.setting.prefetch_factor, r.setting.persistent_workers)
                  for r in one if r.status == "run") == [(2, False), (2, True), (4, False),
                                                         (4, True)]
    pinned = [r for r in one if r.requested.pin_memory]
    assert all(r.status == "n/a" and "pin_memory has no effect" in r.note for r in pinned)


def test_grid_rows_with_real_dataloader_do_not_crash_and_na_rows_are_not_run():
    built = []

    def factory(s: Setting, cfg: RunConfig):
        built.append(s)  # DataLoader itself raises ValueError for prefetch with num_workers=0
        return DataLoader(SleepyDataset(16, 0.0), batch_size=4, num_workers=s.num_workers,
                          prefetch_factor=s.prefetch_factor,
                          persistent_workers=s.persistent_workers)

    rows = expand_grid([("d", "wds")], ["auto"], [0, 1], [2, 4], (False,), (False, True),
                       pin_available=False, backends=("process",))
    out = run_rows(rows, RunConfig(warmup=1, batches=2, repeats=1, batch_size=4), SleepStep(0),
                   factory=factory)
    status = [r["status"] for r in out]
    assert status.count("ok") == 5 and status.count("n/a") == 3 and "error" not in status
    assert len(built) == 5
    assert all(s.prefetch_factor is None for s in built if s.num_workers == 0)
    zero_ok = next(r for r in out if r["status"] == "ok" and r["setting"]["num_workers"] == 0)
    assert zero_ok["metrics"]["throughput_img_s"]["median"] > 0


def test_rejected_setting_is_na_and_failing_loader_is_error():
    def factory(s, cfg):
        if s.num_workers == 1:
            raise ConfigError("num_workers=1 rejected by this loader")
        return FailingLoader()

    class FailingLoader:
        def __iter__(self):
            yield torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(1)
            raise OSError("shard vanished")

    rows = expand_grid([("d", "wds")], ["auto"], [0, 1], [2], (False,), (False,),
                       pin_available=False)
    out = run_rows(rows, RunConfig(warmup=0, batches=5, repeats=1), SleepStep(0), factory=factory)
    assert [r["status"] for r in out] == ["error", "n/a"]
    assert "OSError: shard vanished" in out[0]["note"]
    assert "num_workers=1 rejected" in out[1]["note"]


def test_grid_backends_thread_persistent_and_process_num_workers_0_are_na():
    rows = expand_grid([("d", "wds")], ["auto"], [0, 2], [2], (False,), (False, True),
                       pin_available=False, backends=("process", "thread"))
    assert len(rows) == 2 * 2 * 2  # backends x workers x persistent, every request recorded
    # thread first whatever the order given, then workers, then persistent
    assert [(r.requested.backend, r.requested.num_workers, r.requested.persistent_workers)
            for r in rows] == [("thread", 0, False), ("thread", 0, True), ("thread", 2, False),
                               ("thread", 2, True), ("process", 0, False), ("process", 0, True),
                               ("process", 2, False), ("process", 2, True)]
    by = {(r.requested.backend, r.requested.num_workers, r.requested.persistent_workers): r
          for r in rows}
    t0, t2 = by["thread", 0, False], by["thread", 2, False]
    assert t0.status == t2.status == "run" and t0.setting.backend == "thread"
    # thread + persistent: N/A, measured by the thread row without it
    tp = by["thread", 2, True]
    assert tp.status == "n/a" and tp.same_as == t2.id and tp.setting == t2.setting
    assert "persistent_workers does not apply to the thread backend: threads live as long as " \
           "the loader" in tp.note
    # num_workers=0: the process rows do the thread row's work
    for key in (("process", 0, False), ("process", 0, True), ("thread", 0, True)):
        r = by[key]
        assert r.status == "n/a" and r.same_as == t0.id, r
    assert "same work" in by["process", 0, False].note
    assert "persistent_workers=True does not apply with num_workers=0" in \
        by["process", 0, True].note
    # the process backend has real persistent workers
    assert by["process", 2, False].status == by["process", 2, True].status == "run"
    assert by["process", 2, True].setting.persistent_workers is True
    assert {r.setting.backend for r in rows if r.status == "run" and r.requested.backend ==
            "process"} == {"process"}


def test_grid_backend_alone_runs_what_it_can():
    # persistent on only, thread only: the thread row runs without it and says so
    rows = expand_grid([("d", "wds")], ["auto"], [2], [2], (False,), (True,),
                       pin_available=False)
    assert len(rows) == 1 and rows[0].status == "run"
    assert rows[0].requested.backend == "thread" and rows[0].setting.persistent_workers is False
    assert "threads live as long as the loader" in rows[0].note and "measured without it" in \
        rows[0].note
    # process only: its num_workers=0 row has no thread twin to point at, so it runs
    rows = expand_grid([("d", "wds")], ["auto"], [0], [2], (False,), (False,),
                       pin_available=False, backends=["process"])
    assert [(r.status, r.setting.backend) for r in rows] == [("run", "process")]
    with pytest.raises(ConfigError, match="'fibre'"):
        expand_grid([("d", "wds")], ["auto"], [0], [2], (False,), (False,),
                    pin_available=False, backends=("fibre",))


def test_parse_backends_orders_thread_first_and_names_bad_item():
    assert parse_backends("process,thread,process") == ["thread", "process"]
    assert parse_backends("thread") == ["thread"]
    with pytest.raises(ConfigError, match="--backend: 'threads'"):
        parse_backends("thread,threads")


def test_parse_int_list_names_bad_item():
    assert parse_int_list("0,1,2,4,2", "--num-workers") == [0, 1, 2, 4]
    assert parse_int_list("none,2", "--prefetch-factor", minimum=1, allow_none=True) == [None, 2]
    with pytest.raises(ConfigError, match="'x'"):
        parse_int_list("1,x", "--num-workers")
    with pytest.raises(ConfigError, match="0 < 1"):
        parse_int_list("0", "--prefetch-factor", minimum=1)


# --- recommendation -------------------------------------------------------------------------

def _ok_row(idx, nw, pf, res, pin=False, batch=4, backend="process", cache=None,
            augment="none", kind="shardkit"):
    s = {"data": "d", "format": "wds", "decoder": "auto", "num_workers": nw,
         "prefetch_factor": pf, "pin_memory": pin, "persistent_workers": False,
         "backend": backend, "cache": "none" if cache is None else cache["requested"],
         "augment": augment}
    row = {"id": idx, "kind": kind, "status": "ok", "setting": s, "requested": s,
           "note": "", "same_as": None, "batch_size": batch, **res}
    if cache is not None:
        row["cache"] = cache
    return row


def _res(thr, wait=0.5, step=10.0):
    def one(v):
        return {"median": v, "min": v, "max": v, "q1": v, "q3": v, "values": [v]}
    return {"metrics": {"throughput_img_s": one(thr), "data_wait_fraction": one(wait),
                        "step_ms_per_batch": one(step), "loader_ms_per_batch": one(5.0)}}


def test_recommendation_is_cheapest_within_5_percent_of_best():
    rows = [_ok_row(0, 0, None, _res(50)), _ok_row(1, 2, 4, _res(100)),
            _ok_row(2, 4, 2, _res(104)), _ok_row(3, 2, 2, _res(99.5)),
            _ok_row(4, 2, 2, _res(99.8), pin=True), _ok_row(5, 1, 2, _res(98.0))]
    rec = recommend(rows, {"kind": "sleep"})
    assert rec["best_row"] == 2
    # 5% below 104 is 98.8: row 5 (1 worker, 98.0) is out; of the 2-worker rows, prefetch 2
    # with pin off (row 3) is cheapest.
    assert rec["recommended_row"] == 3
    assert rec["throughput_img_s"] == 99.5
    assert rec["text"].startswith("Recommended: wds/") and "(row 3): 100 img/s, 96% of the " \
        "fastest (" in rec["text"] and "row 2, 104 img/s), with fewer resources." in rec["text"]
    alone = recommend(rows[2:3], {"kind": "sleep"})["text"]   # the fastest row is the pick:
    assert "(row 2): 104 img/s, the fastest row." in alone and alone.count("row 2") == 1
    rec_none = recommend(rows, {"kind": "none"})
    assert rec_none["data_bound"] is None
    assert recommend([], {"kind": "none"})["recommended_row"] is None


def test_recommendation_prefers_thread_backend_at_equal_workers():
    rows = [_ok_row(0, 2, 2, _res(100.0), backend="process"),
            _ok_row(1, 2, 4, _res(99.0), backend="thread"),
            _ok_row(2, 1, 2, _res(80.0), backend="thread")]
    rec = recommend(rows, {"kind": "none"})
    # same number of workers: thread before process, even before a lower prefetch
    assert rec["best_row"] == 0 and rec["recommended_row"] == 1
    assert "backend=thread" in rec["text"]


# --- case 20: the environment names the PIL that really loaded ------------------------------

def installed_pil() -> tuple[bool, str, str]:
    """``(simd, other, message)`` for the PIL installed here: ``simd`` when the distribution
    that installed the ``PIL`` package is Pillow-SIMD (``make simd``) rather than Pillow (``make
    install``), read from the installed distributions; ``other`` the ``--expect-pil`` choice of
    the flavour that is NOT installed, and ``message`` the start of the mismatch it must give."""
    import importlib.metadata as metadata

    dists = metadata.packages_distributions().get("PIL", [])
    assert len(dists) == 1, f"several distributions provide PIL: {dists}"
    if dists[0].lower().replace("_", "-") == "pillow-simd":
        return True, "pillow", f"stock Pillow was requested but Pillow-SIMD {PIL.__version__}"
    return False, "pillow-simd", f"pillow-simd was requested but stock Pillow {PIL.__version__}"


def test_environment_reports_real_pil_and_flags_the_other_flavour():
    """Under Pillow (make install) and Pillow-SIMD (make simd) alike: the loaded PIL is named,
    asking for the other flavour is one mismatch, asking for this one (or any) none."""
    simd, other, message = installed_pil()
    env = collect_environment(expect_pil=other)
    assert env["pil"]["version"] == PIL.__version__
    assert env["pil"]["simd"] is simd
    assert env["torch"]["version"] == torch.__version__
    assert env["cpu"]["usable_cores"] >= 1
    assert len(env["mismatches"]) == 1
    assert message in env["mismatches"][0]
    same = "pillow-simd" if simd else "pillow"
    assert collect_environment(expect_pil=same)["mismatches"] == []
    assert collect_environment(expect_pil="any")["mismatches"] == []
    tj = env["turbojpeg"]
    assert Path(tj["library_path"]).is_file()
    assert re.fullmatch(r"\d+\.\d+\.\d+", tj["libjpeg_turbo"]), tj
    assert libjpeg_turbo_version_of(tj["library_path"]) == tj["libjpeg_turbo"]


def test_pillow_simd_version_tag_and_overwritten_install_are_detected():
    simd = describe_pil("9.5.0.post1", ["Pillow-SIMD"])
    assert simd["simd"] is True
    assert pil_mismatches(simd, "pillow-simd") == []
    assert "stock Pillow was requested" in pil_mismatches(simd, "pillow")[0]
    both = describe_pil("10.4.0", ["Pillow-SIMD", "pillow"])
    msgs = pil_mismatches(both, "pillow-simd")
    assert any("several distributions provide PIL" in m for m in msgs)
    with pytest.raises(ConfigError, match="'simd'"):
        pil_mismatches(simd, "simd")


# --- baseline + CLI on real packed data -----------------------------------------------------

def test_imagefolder_baseline_reads_only_the_split_as_uint8(sample_dir):
    from shardkit.bench.baseline import imagefolder_loader

    paths = sorted(p.relative_to(sample_dir).as_posix() for p in sample_dir.glob("roses/*.jpg"))[:5]
    loader = imagefolder_loader(sample_dir, paths, 4, image_size=48)
    batches = list(loader)
    assert [len(b[1]) for b in batches] == [4, 1]
    images = batches[0][0]
    assert images.dtype == torch.uint8 and tuple(images.shape) == (4, 3, 48, 48)
    assert loader.dataset.classes[int(batches[0][1][0])] == "roses"


def test_cli_on_packed_wds_writes_table_json_plots_recommendation(packed_sample, tmp_path):
    from click.testing import CliRunner

    from shardkit.cli import main

    data = packed_sample("wds")
    out = tmp_path / "bench"
    _, other_pil, pil_message = installed_pil()
    result = CliRunner().invoke(main, [
        "bench", "--data", str(data), "--out", str(out), "--num-workers", "0,1",
        "--prefetch-factor", "2,4", "--pin-memory", "both", "--batch-size", "8",
        "--image-size", "64", "--warmup", "1", "--batches", "3", "--repeats", "2",
        "--step-ms", "5", "--baseline", "imagefolder", "--expect-pil", other_pil,
        "--format", "wds", "--decoder", "auto", "--decoder", "nvjpeg", "--persistent-workers",
        "--backend", "process"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "loader ms" in result.output and "Recommended:" in result.output
    assert pil_message in result.output
    doc = json.loads((out / "bench.json").read_text())
    assert doc["schema_version"] == 4
    assert doc["config"]["backends"] == ["process"]
    assert set(doc) >= {"created_by", "created_at", "config", "step", "environment", "rows",
                        "recommendation", "plots"}
    assert doc["step"] == {"kind": "sleep", "device": "cpu", "step_ms": 5.0}
    env = doc["environment"]
    assert env["pil"]["version"] == PIL.__version__
    assert set(env) >= {"cpu", "torch", "torchvision", "pil", "turbojpeg", "shardkit_decode",
                        "mismatches"}
    assert set(env["pil"]) >= {"version", "simd", "libjpeg_turbo", "jpeg_library_path"}
    rows = doc["rows"]
    assert [r["id"] for r in rows] == list(range(len(rows)))
    for r in rows:
        assert set(r) >= {"id", "kind", "requested", "setting", "status", "note", "same_as"}
        assert r["kind"] in {"shardkit", "baseline"} and r["status"] in {"ok", "n/a"}
        assert set(r["setting"]) == {"data", "format", "decoder", "num_workers",
                                     "prefetch_factor", "pin_memory", "persistent_workers",
                                     "backend", "cache", "augment"}
        assert r["setting"]["backend"] == r["requested"]["backend"] == "process"
        if r["status"] == "n/a":
            assert r["note"] and "metrics" not in r
        else:
            for m in r["metrics"].values():
                assert set(m) == {"median", "min", "max", "q1", "q3", "values"}
                assert len(m["values"]) == 2  # --repeats 2
    shard_rows = [r for r in rows if r["kind"] == "shardkit"]
    assert len(shard_rows) == 2 * 2 * 2 * 2  # decoders x workers x prefetch x pin, all recorded
    nv = [r for r in shard_rows if r["requested"]["decoder"] == "nvjpeg"]
    if not torch.cuda.is_available():
        assert all(r["status"] == "n/a" and "CUDA" in r["note"] for r in nv)
    ok = [r for r in shard_rows if r["status"] == "ok" and r["setting"]["decoder"] == "auto"]
    # num_workers=0 once without prefetch or persistent workers; num_workers=1 with prefetch 2
    # and 4 and persistent workers (bare --persistent-workers = on); pin is N/A without CUDA
    assert sorted((r["setting"]["num_workers"], r["setting"]["prefetch_factor"],
                   r["setting"]["persistent_workers"]) for r in ok) == \
        [(0, None, False), (1, 2, True), (1, 4, True)]
    assert all(r["decoder_ran"] == doc["environment"]["shardkit_decode"]["decoders"]["auto"]
               ["name"] for r in ok)
    for r in ok:
        assert r["batches_timed"] == [3, 3]
        m = r["metrics"]
        assert set(m) >= {"loader_ms_per_batch", "step_ms_per_batch", "throughput_img_s",
                          "data_wait_fraction", "cpu_util_cores", "memory_mb"}
        # a 5 ms sleep never returns early; on a busy shared box it may return late
        assert 4.9 < m["step_ms_per_batch"]["median"] < 100.0
        assert 0.0 <= m["data_wait_fraction"]["median"] <= 1.0
        assert m["throughput_img_s"]["min"] <= m["throughput_img_s"]["median"] \
            <= m["throughput_img_s"]["max"]
        assert r["memory_kind"] == "pss" and m["memory_mb"]["median"] > 50
        assert r["ratio_to_baseline"] > 0
    base = [r for r in rows if r["kind"] == "baseline"]
    assert len(base) == 3 and all(r["status"] == "ok" for r in base)
    rec = doc["recommendation"]
    assert rec["recommended_row"] in {r["id"] for r in ok}
    assert isinstance(rec["data_bound"], bool)
    assert sorted(doc["plots"]) == ["data_wait_vs_workers.png", "loader_vs_step.png",
                                    "throughput_vs_workers.png"]
    for name in doc["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_model_step_runs_a_real_optimiser_step_on_cpu():
    from shardkit.bench.steps import ModelStep

    step = ModelStep("test_resnet", num_classes=5, device="cpu")
    before = [p.detach().clone() for p in step.model.parameters()]
    batch = (torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8), torch.tensor([1, 4]))
    run = time_batches([batch] * 3, step, warmup=1)
    assert len(run.step_ms) == 2 and min(run.step_ms) > 0
    changed = sum(not torch.equal(a, b) for a, b in zip(before, step.model.parameters()))
    assert changed > 0
    assert step.info() == {"kind": "model", "device": "cpu", "model": "test_resnet",
                           "num_classes": 5}
    # a mixup / cutmix loader's float32 (N, K) soft targets train as class probabilities
    soft = torch.tensor([[0.0, 0.3, 0.0, 0.0, 0.7], [0.0, 0.7, 0.0, 0.0, 0.3]])
    before = [p.detach().clone() for p in step.model.parameters()]
    step((batch[0], soft))
    assert any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters()))
    with pytest.raises(ConfigError, match="'no_such_net'"):
        ModelStep("no_such_net", 5)


def test_model_step_bf16_autocast_and_batches_normalised_by_device_normalizer():
    """amp="bf16" runs the forward in bfloat16; a float batch (DeviceNormalizer's output) is fed
    as it is, so it reaches the model exactly as the uint8 batch normalised by the step."""
    from shardkit.bench.steps import ModelStep
    from shardkit.stream import DeviceNormalizer

    step = ModelStep("test_resnet", num_classes=5, device="cpu", amp="bf16")
    assert step.info()["amp"] == "bf16"
    seen = []
    step.model.register_forward_hook(lambda m, args, out: seen.append((args[0].clone(), out)))
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    labels = torch.tensor([1, 4])
    step((images, labels))
    (normalised, labels_moved), = list(DeviceNormalizer([(images, labels)], "cpu"))
    step((normalised, labels_moved))
    (x_uint8, out_uint8), (x_float, out_float) = seen
    assert x_uint8.dtype == x_float.dtype == torch.float32
    assert torch.equal(x_uint8, x_float)
    assert x_float.is_contiguous(memory_format=torch.channels_last)
    assert out_uint8.dtype == out_float.dtype == torch.bfloat16
    assert ModelStep("test_resnet", 5).info().get("amp") is None
    with pytest.raises(ConfigError, match=r"amp='fp16'; expected one of \(None, 'bf16'\)"):
        ModelStep("test_resnet", 5, amp="fp16")


@pytest.mark.gpu
def test_gpu_sleep_step_is_timed_after_synchronisation():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    step = SleepStep(30.0, "cuda")
    batch = (torch.zeros(8, 3, 64, 64, dtype=torch.uint8).pin_memory(), torch.zeros(8))
    res = measure(lambda r: FixedDelayLoader(8, 0.0), step, repeats=1, warmup=1, max_batches=6,
                  monitor=False)
    assert res["metrics"]["step_ms_per_batch"]["median"] == pytest.approx(30.0, rel=0.10)
    step(batch)  # copies a pinned batch to the device without error


def test_baseline_is_na_with_a_note_when_source_root_is_unreachable(tmp_path):
    from shardkit.bench.runner import add_baseline_rows

    res = _res(100.0)
    rows = [_ok_row(0, 0, None, res), _ok_row(1, 2, 2, res)]
    info = {"root": str(tmp_path), "source_root": str(tmp_path / "moved-away")}
    base = add_baseline_rows(rows, info, RunConfig(), SleepStep(0))
    assert [b["status"] for b in base] == ["n/a", "n/a"]
    assert [b["id"] for b in base] == [2, 3]
    assert all("moved-away" in b["note"] and "not reachable" in b["note"] for b in base)
    assert all("ratio_to_baseline" not in r for r in rows)


def test_plot_series_put_the_num_workers_0_point_on_every_prefetch_line():
    from shardkit.bench.plots import _lines

    rows = expand_grid([("d", "wds")], ["auto"], [0, 2], [2, 4], (False, True), (False,),
                       pin_available=False)
    results = []
    for r in rows:
        rec = {"id": r.id, "kind": "shardkit", "status": "ok" if r.status == "run" else "n/a",
               "requested": r.requested.as_dict(), "setting": r.setting.as_dict(),
               "same_as": r.same_as, "note": r.note}
        if r.status == "run":
            rec["metrics"] = _res(10.0 * (r.id + 1))["metrics"]
        results.append(rec)
    series = _lines(results)
    # pin=on is N/A without CUDA: no line copies the pin-off numbers under a pin-on label
    assert sorted(series) == ["wds/auto thread pf=2 pin=off", "wds/auto thread pf=4 pin=off"]
    zero_id = next(r.id for r in rows if r.status == "run" and r.setting.num_workers == 0)
    for points in series.values():
        assert [x for x, _ in points] == [0, 2]
        assert points[0][1]["id"] == zero_id


def test_plot_series_one_per_backend_with_shared_num_workers_0_point():
    from shardkit.bench.plots import _lines

    rows = expand_grid([("d", "wds")], ["auto"], [0, 2], [2], (False,), (False, True),
                       pin_available=False, backends=("thread", "process"))
    results = []
    for r in rows:
        rec = {"id": r.id, "kind": "shardkit", "status": "ok" if r.status == "run" else "n/a",
               "requested": r.requested.as_dict(), "setting": r.setting.as_dict(),
               "same_as": r.same_as, "note": r.note}
        if r.status == "run":
            rec["metrics"] = _res(10.0 * (r.id + 1))["metrics"]
        results.append(rec)
    series = _lines(results)
    # no "thread ... pers" line: it would copy the thread line without persistent workers
    assert sorted(series) == ["wds/auto process pf=2 pin=off", "wds/auto process pf=2 pin=off pers",
                              "wds/auto thread pf=2 pin=off"]
    zero_id = next(r.id for r in rows if r.status == "run" and r.setting.num_workers == 0)
    for points in series.values():
        assert [x for x, _ in points] == [0, 2]
        assert points[0][1]["id"] == zero_id  # the process line starts at the thread row
    assert series["wds/auto thread pf=2 pin=off"][1][1]["setting"]["backend"] == "thread"
    assert series["wds/auto process pf=2 pin=off"][1][1]["setting"]["backend"] == "process"


def _small_bench_cli(data, out, *args: str):
    """``shardkit bench`` on ``data`` with a small grid (image size 32, 1 warm-up + 2 batches,
    no pinning) plus ``args``; asserts exit 0, returns ``(result, header line of the table)``."""
    from click.testing import CliRunner

    from shardkit.cli import main

    result = CliRunner().invoke(main, [
        "bench", "--data", str(data), "--out", str(out), *args, "--prefetch-factor", "2",
        "--pin-memory", "off", "--image-size", "32", "--warmup", "1", "--batches", "2"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result, next(line for line in result.output.splitlines() if "loader ms" in line)


def test_cli_backend_thread_and_process_gives_rows_for_both(packed_sample, tmp_path):
    data = packed_sample("wds")
    out = tmp_path / "bench"
    result, header = _small_bench_cli(data, out, "--backend", "thread,process",
                                      "--num-workers", "0,1", "--batch-size", "4",
                                      "--repeats", "1")
    assert "backend" in header
    assert re.search(r"\bthread\b", result.output) and re.search(r"\bproc\b", result.output)
    doc = json.loads((out / "bench.json").read_text())
    assert doc["schema_version"] == 4 and doc["config"]["backends"] == ["thread", "process"]
    rows = doc["rows"]
    assert [(r["requested"]["backend"], r["requested"]["num_workers"], r["status"])
            for r in rows] == [("thread", 0, "ok"), ("thread", 1, "ok"), ("process", 0, "n/a"),
                               ("process", 1, "ok")]
    for r in rows:
        assert r["setting"]["backend"] in {"thread", "process"}
        if r["status"] == "ok":
            assert r["setting"]["backend"] == r["requested"]["backend"]
            assert r["metrics"]["throughput_img_s"]["median"] > 0
    assert rows[2]["same_as"] == rows[0]["id"] and rows[2]["setting"]["backend"] == "thread"
    assert "same work" in rows[2]["note"]
    assert doc["recommendation"]["setting"]["backend"] in {"thread", "process"}


# --- plots a reader can use without the table -----------------------------------------------

@pytest.fixture(scope="module")
def small_bench(packed_sample, tmp_path_factory):
    """A real bench on the packed sample: thread and process backends, 0-2 workers, 5 ms step."""
    from shardkit.bench.cli import run_bench

    out = tmp_path_factory.mktemp("bench-plots")
    run_bench([str(packed_sample("wds"))], out, num_workers="0,1,2", prefetch_factor="2",
              pin_memory="off", backends="thread,process", step_ms=5.0, echo=None,
              cfg=RunConfig(warmup=1, batches=3, repeats=2, batch_size=8, image_size=64))
    return json.loads((out / "bench.json").read_text()), out


def _step_artist(ax):
    return [ln for ln in ax.get_lines() if ln.get_label().startswith("model step")]


def test_throughput_axis_starts_at_zero_on_a_real_bench(small_bench):
    from shardkit.bench.plots import plot_series

    doc, out = small_bench
    assert sorted(doc["plots"]) == ["data_wait_vs_workers.png", "loader_vs_step.png",
                                    "throughput_vs_workers.png"]
    for name in doc["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax = plot_series(doc["rows"], "throughput_img_s").axes[0]
    best = max(r["metrics"]["throughput_img_s"]["max"] for r in doc["rows"]
               if r["status"] == "ok")
    bottom, top = ax.get_ylim()
    assert bottom == 0 and top >= best > 0
    assert plot_series(doc["rows"], "data_wait_fraction").axes[0].get_ylim() == (0, 1.05)


def test_loader_vs_step_bars_name_their_setting_and_show_the_step_on_a_real_bench(small_bench):
    from matplotlib.colors import to_hex

    from shardkit.bench.plots import plot_loader_vs_step

    doc, _ = small_bench
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    # the process backend's num_workers=0 row (#3) is N/A: the thread row #0 did that work
    assert [r["id"] for r in ok] == [0, 1, 2, 4, 5]
    ax = plot_loader_vs_step(doc["rows"]).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "thread w0 (#0)", "thread w1 pf2 (#1)", "thread w2 pf2 (#2)", "process w1 pf2 (#4)",
        "process w2 pf2 (#5)"]
    bars = ax.patches
    assert [b.get_width() for b in bars] == [r["metrics"]["loader_ms_per_batch"]["median"]
                                             for r in ok]
    assert [b.get_y() + b.get_height() / 2 for b in bars] == [0, 1, 2, 3, 4]
    frac = [r["metrics"]["data_wait_fraction"]["median"] for r in ok]
    assert [to_hex(b.get_facecolor()) for b in bars] == [
        "#d62728" if f >= 0.10 else "#1f77b4" for f in frac]  # tab:red / tab:blue
    # decoding 8 real photos in the training loop (no workers) takes longer than 0.1 x 5 ms
    assert to_hex(bars[0].get_facecolor()) == "#d62728"
    step = [r["metrics"]["step_ms_per_batch"]["median"] for r in ok]
    assert all(4.9 < s < 100.0 for s in step)  # a 5 ms sleep, late on a busy box
    (line,) = _step_artist(ax)
    mid = sorted(step)[2]
    if max(step) - min(step) <= 0.10 * mid:  # one vertical line at the median step time
        assert list(line.get_xdata()) == [mid, mid]
        assert line.get_label() == f"model step {mid:.1f} ms/batch (median)"
    else:  # a marker on each bar
        assert list(line.get_xdata()) == step and list(line.get_ydata()) == [0, 1, 2, 3, 4]
    assert ax.get_xlim()[0] == 0
    assert "data-bound" in ax.get_title() and "10%" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["data-bound: waits for data >= 10% of wall time",
                          "keeps up: waits < 10%"]


def _timed_row(idx, nw, wait_ms, step_ms, decoder="auto", kind="shardkit", pin=False):
    frac = wait_ms / (wait_ms + step_ms)
    row = _ok_row(idx, nw, 2 if nw else None, _res(100.0, wait=frac, step=step_ms), pin=pin,
                  backend="thread")
    row["setting"] = dict(row["setting"], decoder=decoder)
    row["metrics"]["loader_ms_per_batch"] = _res(wait_ms)["metrics"]["throughput_img_s"]
    row["kind"] = kind
    return row


def test_loader_vs_step_marks_each_bar_when_step_times_differ():
    from matplotlib.colors import to_hex

    from shardkit.bench.plots import plot_loader_vs_step

    rows = [_timed_row(0, 0, 30.0, 10.0), _timed_row(1, 2, 1.0, 10.0, pin=True),
            _timed_row(2, 2, 0.5, 40.0, decoder="pil"),
            _timed_row(3, 2, 9.0, 40.0, kind="baseline")]
    ax = plot_loader_vs_step(rows, threshold=0.2).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "wds/auto thread w0 (#0)", "wds/auto thread w2 pf2 pin (#1)", "wds/pil thread w2 pf2 (#2)",
        "baseline w2 pf2 (#3)"]
    (line,) = _step_artist(ax)
    assert list(line.get_xdata()) == [10.0, 10.0, 40.0, 40.0]
    assert list(line.get_ydata()) == [0, 1, 2, 3]
    # wait fractions 0.75, 0.09, 0.01, 0.18 against threshold 0.2: only row 0 is data-bound
    assert [to_hex(b.get_facecolor()) for b in ax.patches] == [
        "#d62728", "#1f77b4", "#1f77b4", "#1f77b4"]
    assert "20%" in ax.get_title()


def test_loader_vs_step_without_a_step_draws_no_line_and_no_verdict():
    from matplotlib.colors import to_hex

    from shardkit.bench.plots import plot_loader_vs_step

    rows = [_timed_row(0, 0, 30.0, 0.001), _timed_row(1, 2, 3.0, 0.002)]
    ax = plot_loader_vs_step(rows).axes[0]
    assert _step_artist(ax) == []
    assert {to_hex(b.get_facecolor()) for b in ax.patches} == {"#1f77b4"}
    assert "no step simulated" in ax.get_title()
    assert plot_loader_vs_step([dict(rows[0], status="error")]) is None


# --- the decoded cache as a grid dimension --------------------------------------------------

def test_parse_caches_puts_none_first_and_names_bad_item():
    assert parse_caches("ram,none,ram") == ["none", "ram"]
    assert parse_caches("disk:/tmp/x,auto") == ["disk:/tmp/x", "auto"]
    with pytest.raises(ConfigError, match="--cache: 'rom'"):
        parse_caches("none,rom")
    rows = expand_grid([("d", "wds")], ["auto"], [0, 2], [2], (False,), (False,),
                       pin_available=False, caches=["ram", "none"])
    assert [(r.requested.cache, r.requested.num_workers, r.status) for r in rows] == \
        [("none", 0, "run"), ("none", 2, "run"), ("ram", 0, "run"), ("ram", 2, "run")]


def _cache(mode="ram", fill_img_s=80.0, size=40 << 20, n=140):
    return {"requested": mode, "mode": mode, "resolution": "full", "size_bytes": size,
            "filled_samples": n, "filled_bytes": size, "bytes_per_image": size / n,
            "fill_s": n / fill_img_s, "fill_img_s": fill_img_s, "fill_hit_rate": 0.0,
            "hits": 96, "misses": 0, "hit_rate": 1.0, "disabled": None}


def test_recommendation_takes_a_cache_only_when_it_pays():
    from shardkit.bench.runner import add_cache_ratios

    # the cache triples the rate: it is recommended, with its size and fill epoch in the text
    rows = [_ok_row(0, 2, 2, _res(100.0), backend="thread"),
            _ok_row(1, 2, 2, _res(300.0), backend="thread", cache=_cache(fill_img_s=80.0))]
    add_cache_ratios(rows)
    assert rows[1]["uncached_row"] == 0 and rows[1]["ratio_to_uncached"] == pytest.approx(3.0)
    assert rows[1]["fill_ratio_to_uncached"] == pytest.approx(0.8)
    rec = recommend(rows, {"kind": "none"})
    assert rec["recommended_row"] == 1 and rec["cache"]["mode"] == "ram"
    assert "cache=ram" in rec["text"] and "40 MiB" in rec["text"]
    assert "second epoch" in rec["text"] and "0.80x uncached" in rec["text"]
    # within the 5% tolerance: the uncached setting is cheaper (no memory, no fill epoch)
    rows[1]["metrics"] = _res(103.0)["metrics"]
    rec = recommend(rows, {"kind": "none"})
    assert rec["best_row"] == 1 and rec["recommended_row"] == 0
    assert "not worth its memory" in rec["text"]
    # fewer workers still come first: a cached 1-worker row beats an uncached 2-worker one
    rows.append(_ok_row(2, 1, 2, _res(102.0), backend="thread", cache=_cache()))
    assert recommend(rows, {"kind": "none"})["recommended_row"] == 2


def _split_pixels(root, split):
    records = [json.loads(x) for x in (Path(root) / "splits" / f"{split}.jsonl").read_text()
               .splitlines() if x.strip()]
    return len(records), sum(r["width"] * r["height"] * 3 for r in records)


def test_cli_cache_none_and_ram_rows_carry_size_hit_rate_and_fill(packed_sample, tmp_path):
    data = packed_sample("wds")
    out = tmp_path / "bench"
    result, header = _small_bench_cli(data, out, "--cache", "ram,none", "--num-workers", "1",
                                      "--batch-size", "8", "--repeats", "2")
    assert "cache" in header and "      cache: " in result.output
    doc = json.loads((out / "bench.json").read_text())
    assert doc["schema_version"] == 4 and doc["config"]["caches"] == ["none", "ram"]
    plain, cached = doc["rows"]
    assert plain["setting"]["cache"] == "none" and plain["cache"] == {"requested": "none",
                                                                       "mode": "none"}
    c = cached["cache"]
    n, nbytes = _split_pixels(data, "train")
    assert cached["setting"]["cache"] == "ram" and c["mode"] == "ram"
    assert c["resolution"] == "full" and c["size_bytes"] == nbytes  # every RGB pixel, 1 byte
    assert c["filled_samples"] == n and c["filled_bytes"] == nbytes
    assert c["bytes_per_image"] == pytest.approx(nbytes / n)
    assert c["fill_hit_rate"] == 0.0 and c["fill_s"] > 0 and c["disabled"] is None
    # the timed repeats read every consumed sample from the arena: (1 warm-up + 2) batches of 8
    assert (c["hits"], c["misses"], c["hit_rate"]) == (2 * 3 * 8, 0, 1.0)
    assert cached["uncached_row"] == plain["id"] and cached["ratio_to_uncached"] > 0
    assert cached["fill_ratio_to_uncached"] > 0
    assert doc["recommendation"]["recommended_row"] in (0, 1)
    assert c["path"].startswith("/dev/shm/") and not Path(c["path"]).exists()  # removed
    assert c["huge_pages"] == tmpfs_huge("/dev/shm")  # the arena's tmpfs, named in the text
    assert (f"tmpfs huge pages: {c['huge_pages']}" in result.output) == (c["huge_pages"]
                                                                          is not None)


def test_bench_disk_cache_is_reused_by_the_next_row(packed_sample, tmp_path):
    from shardkit.bench.cli import run_bench

    data = packed_sample("wds")
    cache_dir = tmp_path / "arena"
    doc = run_bench([str(data)], tmp_path / "bench", num_workers="0,1", prefetch_factor="2",
                    pin_memory="off", caches=f"disk:{cache_dir}", echo=None, plots=False,
                    cfg=RunConfig(warmup=1, batches=2, repeats=1, batch_size=8, image_size=32))
    first, second = doc["rows"]
    n, nbytes = _split_pixels(data, "train")
    assert first["cache"]["mode"] == second["cache"]["mode"] == "disk"
    assert first["cache"]["fill_hit_rate"] == 0.0  # row 0 decodes and fills
    assert second["cache"]["fill_hit_rate"] == 1.0  # row 1 finds every image in the file
    assert second["cache"]["filled_samples"] == n
    arenas = list(cache_dir.glob("*.arena"))
    assert len(arenas) == 1 and arenas[0].stat().st_size >= nbytes
    assert "ratio_to_uncached" not in second  # no uncached twin in this grid


# --- augmentation as a grid dimension -------------------------------------------------------

_JITTER_OPS = '[{op: color_jitter, brightness: 0.4}, {op: mixup, alpha: 0.8}]'


def test_parse_augments_puts_none_first_and_allows_an_inline_list_only_alone(tmp_path):
    from shardkit.bench.augment import augment_label, batch_ops_note, parse_augments

    assert parse_augments("standard,none,standard") == ["none", "standard"]
    assert parse_augments(" randaugment , light") == ["randaugment", "light"]
    with pytest.raises(ConfigError, match="--augment: 'jitter' is not an augment preset or "
                                          "spec file; expected .*none, light, standard"):
        parse_augments("none,jitter")
    # an inline op list has commas of its own: the whole value, or a file
    (inline,) = parse_augments(_JITTER_OPS)
    assert json.loads(inline) == [{"op": "color_jitter", "brightness": 0.4},
                                  {"op": "mixup", "alpha": 0.8}]
    assert augment_label(inline) == "ops:color_jitter+mixup"
    assert batch_ops_note(inline).startswith("batch ops (mixup) run in the loader (timed")
    assert batch_ops_note("standard") == ""
    for mixed in (f"none,{_JITTER_OPS}", f"{_JITTER_OPS},none"):
        with pytest.raises(ConfigError, match="only value.*save it to a .yaml file"):
            parse_augments(mixed)
    with pytest.raises(ConfigError, match="--augment: augment op 'blur' is unknown"):
        parse_augments("[{op: blur}]")
    spec_file = tmp_path / "ops.yaml"
    spec_file.write_text("augment:\n  - {op: color_jitter, brightness: 0.4}\n")
    assert parse_augments(f"none,{spec_file}") == ["none",
                                                   '[{"brightness": 0.4, "op": "color_jitter"}]']
    with pytest.raises(ConfigError, match="missing.yaml does not exist"):
        parse_augments(f"none,{tmp_path / 'missing.yaml'}")


def test_bench_refuses_augmentation_with_eval(packed_sample, tmp_path):
    from shardkit.bench.cli import run_bench

    with pytest.raises(ConfigError, match="--augment none,light with --eval: evaluation never"):
        run_bench([str(packed_sample("wds"))], tmp_path, augments="none,light", echo=None,
                  cfg=RunConfig(train=False))


def test_grid_expands_augment_inside_cache_and_outside_num_workers():
    rows = expand_grid([("d", "wds")], ["auto"], [0, 2], [2, 4], (False,), (False,),
                       pin_available=False, caches=["ram", "none"],
                       augments=["standard", "none"])
    asked = [(r.requested.cache, r.requested.augment, r.requested.num_workers,
              r.requested.prefetch_factor) for r in rows]
    assert asked[:6] == [("none", "none", 0, 2), ("none", "none", 0, 4), ("none", "none", 2, 2),
                         ("none", "none", 2, 4), ("none", "standard", 0, 2),
                         ("none", "standard", 0, 4)]
    assert [a[:2] for a in asked[::4]] == [("none", "none"), ("none", "standard"),
                                           ("ram", "none"), ("ram", "standard")]
    # num_workers=0 with prefetch 4 is measured as the row of the SAME augment spec
    na = [r for r in rows if r.status == "n/a"]
    assert len(na) == 4
    for r in na:
        twin = rows[r.same_as]
        assert (twin.setting.augment, twin.setting.cache) == (r.requested.augment,
                                                              r.requested.cache)
        assert twin.setting.num_workers == 0 and twin.status == "run"


def test_augment_ratios_and_one_recommendation_per_spec():
    from shardkit.bench.augment import add_augment_ratios

    rows = [_ok_row(0, 2, 2, _res(400.0, wait=0.02)),
            _ok_row(1, 2, 2, _res(300.0, wait=0.30), augment="standard"),
            _ok_row(2, 1, 2, _res(150.0, wait=0.60), augment="standard"),
            _ok_row(3, 2, 2, _res(200.0, wait=0.40), kind="baseline"),
            _ok_row(4, 2, 2, _res(150.0, wait=0.50), kind="baseline", augment="standard")]
    add_augment_ratios(rows)
    assert (rows[1]["none_row"], rows[1]["ratio_to_none"]) == (0, pytest.approx(0.75))
    assert "ratio_to_none" not in rows[2]  # no 1-worker row without augmentation
    assert (rows[4]["none_row"], rows[4]["ratio_to_none"]) == (3, pytest.approx(0.75))
    assert all("ratio_to_none" not in rows[i] for i in (0, 3))
    rec = recommend(rows, {"kind": "sleep"}, threshold=0.10)
    # the faster augment=none row 0 is not "cheaper": each spec is recommended on its own
    assert rec["augment"] == "standard" and rec["recommended_row"] == 1
    assert [(p["augment"], p["recommended_row"], p["data_bound"]) for p in rec["per_augment"]] \
        == [("none", 0, False), ("standard", 1, True)]
    assert rec["per_augment"][1]["ratio_to_none"] == pytest.approx(0.75)
    assert {(g["augment"], g["recommended_row"]) for g in rec["per_group"]} == \
        {("none", 0), ("standard", 1)}
    text = rec["text"]
    assert "each --augment spec gets its own recommendation" in text
    assert "augment=standard runs at 0.75x the rate of augment=none at this setting (row 0" \
        in text
    assert "The augmentation makes it data-bound (the device waits 30% with it, 2% without)" \
        in text
    assert "augment=none: row 0 (wds/auto backend=process workers=2" in text
    # the twin is data-bound too: the text says so instead of blaming the augmentation
    rows[0]["metrics"] = _res(400.0, wait=0.20)["metrics"]
    text = recommend(rows, {"kind": "sleep"})["text"]
    assert "data-bound without augmentation too (waits 20%)" in text
    # no step simulated: the cost ratio is still given, no verdict
    text = recommend(rows, {"kind": "none"})["text"]
    assert "0.75x the rate of augment=none" in text and "makes it data-bound" not in text
    # a single spec: no per-spec preamble
    rec = recommend(rows[:1], {"kind": "none"})
    assert rec["augment"] == "none" and len(rec["per_augment"]) == 1
    assert "own recommendation" not in rec["text"]


def test_baseline_transform_matches_the_augment_presets(sample_photo):
    from PIL import Image
    from torchvision.transforms import v2

    from shardkit.augment import PRESETS
    from shardkit.bench.baseline import BASELINE_AUGMENT, baseline_transform, describe_baseline

    assert set(BASELINE_AUGMENT) == set(PRESETS)
    names = {p: [type(t).__name__ for t in baseline_transform(32, p).transforms]
             for p in PRESETS}
    assert names["none"] == ["RandomResizedCrop", "RandomHorizontalFlip", "PILToTensor"]
    assert names["randaugment"] == ["RandomResizedCrop", "RandomHorizontalFlip", "RandAugment",
                                    "PILToTensor"]
    assert names["trivialaugment"][2] == "TrivialAugmentWide"
    for preset in ("light", "standard"):
        jitter = baseline_transform(32, preset).transforms[2]
        (op,) = PRESETS[preset]
        assert isinstance(jitter, v2.ColorJitter) and jitter.hue is None
        for key in ("brightness", "contrast", "saturation"):
            assert getattr(jitter, key) == (1 - op[key], 1 + op[key])
    ra = baseline_transform(32, "randaugment").transforms[2]
    assert (ra.num_ops, ra.magnitude) == (PRESETS["randaugment"][0]["num_ops"],
                                          PRESETS["randaugment"][0]["magnitude"]) == (2, 9)
    assert describe_baseline(224, "randaugment") == \
        "RandomResizedCrop(224), RandomHorizontalFlip(), RandAugment(2, 9), PILToTensor()"
    with pytest.raises(ConfigError, match="only the presets"):
        baseline_transform(32, '[{"op": "color_jitter", "brightness": 0.4}]')
    # same crop and flip draws, then the jitter changes the pixels of a real photo
    img = Image.open(sample_photo).convert("RGB")
    out = {}
    for preset in ("none", "standard"):
        torch.manual_seed(3)
        out[preset] = baseline_transform(32, preset)(img)
    assert out["none"].dtype == torch.uint8 and tuple(out["none"].shape) == (3, 32, 32)
    assert not torch.equal(out["none"], out["standard"])


def test_baseline_row_of_an_op_list_is_na_and_says_why(packed_sample):
    from shardkit.bench.runner import add_baseline_rows, dataset_info

    spec = '[{"brightness": 0.4, "op": "color_jitter"}]'
    rows = [_ok_row(0, 0, None, _res(100.0), augment=spec)]
    (base,) = add_baseline_rows(rows, dataset_info(packed_sample("wds")), RunConfig(),
                                SleepStep(0))
    assert base["status"] == "n/a" and base["setting"]["augment"] == spec
    assert "no ImageFolder baseline for augment=ops:color_jitter" in base["note"]
    assert "baseline_transform" not in base and "ratio_to_baseline" not in rows[0]


def test_cli_augment_none_and_standard_rows_ratios_and_matching_baseline(packed_sample,
                                                                          tmp_path):
    data = packed_sample("wds")
    out = tmp_path / "bench"
    result, header = _small_bench_cli(data, out, "--augment", "standard,none", "--num-workers",
                                      "1", "--batch-size", "8", "--repeats", "2",
                                      "--step-ms", "5", "--baseline", "imagefolder")
    assert "augment" in header and "x none" in header
    doc = json.loads((out / "bench.json").read_text())
    assert doc["schema_version"] == 4 and doc["config"]["augments"] == ["none", "standard"]
    rows = doc["rows"]
    assert [(r["kind"], r["setting"]["augment"], r["status"]) for r in rows] == [
        ("shardkit", "none", "ok"), ("shardkit", "standard", "ok"),
        ("baseline", "none", "ok"), ("baseline", "standard", "ok")]
    plain, jit, base_plain, base_jit = rows

    def thr(r):
        return r["metrics"]["throughput_img_s"]["median"]

    assert jit["none_row"] == plain["id"]
    assert jit["ratio_to_none"] == pytest.approx(thr(jit) / thr(plain))
    assert base_jit["none_row"] == base_plain["id"]
    assert base_jit["ratio_to_none"] == pytest.approx(thr(base_jit) / thr(base_plain))
    assert "ratio_to_none" not in plain and "ratio_to_none" not in base_plain
    # like-for-like: each shardkit row against the baseline with the same augmentation
    assert (plain["baseline_row"], jit["baseline_row"]) == (base_plain["id"], base_jit["id"])
    assert jit["ratio_to_baseline"] == pytest.approx(thr(jit) / thr(base_jit))
    assert base_jit["baseline_transform"] == ("RandomResizedCrop(32), RandomHorizontalFlip(), "
                                              "ColorJitter(0.4, 0.4, 0.4), PILToTensor()")
    assert base_plain["baseline_transform"].count("(") == 3  # crop, flip, to-tensor only
    rec = doc["recommendation"]
    assert rec["augment"] == "standard" and rec["recommended_row"] == jit["id"]
    assert [p["augment"] for p in rec["per_augment"]] == ["none", "standard"]
    assert f"augment=standard runs at {jit['ratio_to_none']:.2f}x the rate" in rec["text"]
    assert re.search(rf"^\s+{jit['id']} shardkit .* standard .* {jit['ratio_to_none']:.2f}$",
                     result.output, re.M)
