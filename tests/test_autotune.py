"""``num_workers="auto"`` / ``prefetch_factor="auto"`` (shardkit.stream.tuning): whatever the
tuner picks, an epoch yields the samples, order and pixels of a fixed setting, a resume point
stays valid, ``loader.tuning`` says what was chosen and why; the decisions themselves are
tested with injected measurements (no clock)."""
from __future__ import annotations

import pickle
import threading
import time

import pytest
import torch

from shardkit.errors import ConfigError
from shardkit.stream import SamplingOptions, WorkerOptions, make_loader
from shardkit.stream.tuning import AutoTuner, Window, check_counts, plan_tuning

S = 16  # tiny output side: cheap decodes on 2 shared cores
MB = 1 << 20


def _epoch(loader, epoch: int = 1) -> list[tuple]:
    """``(keys, labels, pixels)`` of every batch of ``epoch``."""
    loader.set_epoch(epoch)
    src = loader.dataset.source
    return [([src.key(int(i)) for i in m["index"]], y.clone(), x.clone()) for x, y, m in loader]


def _same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b) and len(a) > 0
    for (ka, ya, xa), (kb, yb, xb) in zip(a, b):
        assert ka == kb
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def _script(loader, schedule: list[int]) -> None:
    """Makes the thread backend's tuner decide after every batch, trying the worker counts of
    ``schedule`` in turn, then settle: the pool's size and the depth change mid-epoch."""
    tuner = loader.backend.tuner
    tuner.window = 1
    todo = list(schedule)

    def nxt(win):
        return (todo.pop(0), "scripted") if todo else (None, "scripted end")

    tuner._next_workers = nxt  # noqa: SLF001 - the test drives the decision, not the clock
    tuner._begin = lambda skip: AutoTuner._begin(tuner, 1)  # one unmeasured batch per change


@pytest.mark.parametrize("split", ["train", "val"])
def test_auto_thread_epoch_is_the_fixed_epoch_while_the_tuner_changes_course(packed_sample,
                                                                             split):
    root = packed_sample("wds")
    kw = dict(image_size=S, seed=5, return_meta=True)
    ref = _epoch(make_loader(root, split, 4, num_workers=2, prefetch_factor=2, **kw))
    loader = make_loader(root, split, 4, num_workers="auto", prefetch_factor="auto", **kw)
    _script(loader, [1, 4, 2, 3, 1])
    # settled on 1 whatever the measured rates (under load 4 could measure the fastest)
    loader.backend.tuner._settle = lambda why: _settle(loader.backend.tuner, 1)
    assert loader.backend.num_workers == loader.tuning.max_workers >= 2  # the pool's size
    _same(_epoch(loader), ref)
    _same(_epoch(loader), ref)  # the tuner goes on across epochs (8 batches in val)
    t = loader.tuning
    assert t.settled and t.auto == {"num_workers": True, "prefetch_factor": True}
    assert [w["workers"] for w in t.trials] == [min(t.max_workers, t.cpus), 1, 4, 2, 3, 1]
    _same(_epoch(loader), ref)  # settled: the next epoch too, on a pool of the settled size
    assert loader.backend._pool_size == t.num_workers != loader.backend.num_workers
    assert loader.backend._pool._max_workers == t.num_workers
    zero = make_loader(root, split, 4, num_workers=0, **kw)
    _same(_epoch(zero), ref)


@pytest.mark.parametrize("split", ["train", "val"])
def test_auto_process_epoch_is_the_fixed_epoch(packed_sample, split):
    root = packed_sample("wds")
    kw = dict(image_size=S, seed=5, return_meta=True, workers=WorkerOptions(backend="process"))
    ref = _epoch(make_loader(root, split, 8, num_workers=0, image_size=S, seed=5,
                             return_meta=True))
    loader = make_loader(root, split, 8, num_workers="auto", prefetch_factor="auto", **kw)
    t = loader.tuning
    assert t.backend == "process" and t.settled and "resolved up front" in t.reason
    assert loader.backend.num_workers == t.num_workers >= 1
    _same(_epoch(loader), ref)


def test_auto_block_order_fixes_streams_up_front_to_the_upper_bound(packed_sample):
    """Shard-block order cuts the epoch into streams: with auto they are the tuner's upper
    bound from the start (as a fixed loader with that many workers), whatever it settles on."""
    root = packed_sample("wds")
    kw = dict(image_size=S, seed=2, return_meta=True, sampling=SamplingOptions(block=True))
    loader = make_loader(root, "train", 8, num_workers="auto", **kw)
    top = loader.tuning.max_workers
    assert loader.dataset.sampling.streams == top and loader.state_dict()["streams"] == top
    ref = _epoch(make_loader(root, "train", 8, num_workers=top, **kw))
    _script(loader, [1, top, 2])
    _same(_epoch(loader), ref)
    assert loader.dataset.sampling.streams == top


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_resume_under_auto_gives_the_rest_of_the_epoch(packed_sample, backend):
    root = packed_sample("wds")
    kw = dict(image_size=S, seed=3, return_meta=True, sampling=SamplingOptions(block=True),
              workers=WorkerOptions(backend=backend))
    first = make_loader(root, "train", 8, num_workers="auto", prefetch_factor="auto", **kw)
    streams = first.dataset.sampling.streams
    ref = _epoch(make_loader(root, "train", 8, num_workers=max(1, streams), **kw))
    if backend == "thread":
        _script(first, [1, 3])
    first.set_epoch(1)
    src = first.dataset.source
    head = []
    for k, (x, y, m) in enumerate(first):
        head.append(([src.key(int(i)) for i in m["index"]], y.clone(), x.clone()))
        if k == 4:
            break
    state = pickle.loads(pickle.dumps(first.state_dict()))
    assert state["batches_consumed"] == 5 and state["streams"] == streams
    resumed = make_loader(root, "train", 8, num_workers="auto", **kw)
    resumed.load_state_dict(state)
    rest = []
    for x, y, m in resumed:
        rest.append(([src.key(int(i)) for i in m["index"]], y.clone(), x.clone()))
    _same(head + rest, ref)


def test_tuning_has_its_fields_after_an_epoch(packed_sample):
    loader = make_loader(packed_sample("wds"), "train", 8, num_workers="auto", image_size=S)
    for _ in loader:
        pass
    d = loader.tuning.as_dict()
    assert set(d) == {"num_workers", "prefetch_factor", "backend", "auto", "settled", "reason",
                      "cpus", "max_workers", "memory", "trials"}
    assert 1 <= d["num_workers"] <= d["max_workers"] and d["prefetch_factor"] >= 1
    assert d["auto"] == {"num_workers": True, "prefetch_factor": False}
    assert isinstance(d["settled"], bool) and d["reason"]
    assert d["memory"]["batch_bytes"] == 8 * 3 * S * S
    for trial in d["trials"]:
        assert {"workers", "prefetch", "batches", "wait_fraction", "step_ms",
                "build_ms"} <= set(trial)
    short = make_loader(packed_sample("wds"), "val", 16, num_workers="auto", image_size=S)
    assert short.tuning.reason.startswith("measuring: it compares windows of 8 batches")
    for _ in short:   # 2 batches: shorter than a window
        pass
    assert not short.tuning.settled and short.tuning.reason.startswith(
        "not settled yet: 0 window(s) of 8 batches measured")
    assert "goes on measuring in the next" in short.tuning.reason
    fixed = make_loader(packed_sample("wds"), "train", 8, num_workers=1, image_size=S).tuning
    assert (fixed.num_workers, fixed.prefetch_factor, fixed.settled, fixed.reason) == \
        (1, 2, True, "given")


@pytest.mark.parametrize("kwargs, named", [
    ({"num_workers": "fast"}, "num_workers='fast'"),
    ({"num_workers": -1}, "num_workers=-1"),
    ({"num_workers": True}, "num_workers=True"),
    ({"prefetch_factor": 0}, "prefetch_factor=0"),
    ({"prefetch_factor": "fast"}, "prefetch_factor='fast'"),
])
def test_invalid_counts_raise_config_error_naming_the_value(packed_sample, kwargs, named):
    with pytest.raises(ConfigError, match=f"{named}: expected 'auto' or an int"):
        make_loader(packed_sample("wds"), "train", 8, image_size=S, **kwargs)


def test_check_counts():
    assert check_counts("auto", None) == ("auto", 2)
    assert check_counts(3, "auto") == (3, "auto")
    assert check_counts(0, 4) == (0, 4)


# --- the decisions, from injected measurements ------------------------------------------------

def _tuner(cpus=2, top=4, budget=1024 * MB, **kw) -> AutoTuner:
    return AutoTuner(cpus, top, batch_bytes=10 * MB, budget_bytes=budget,
                     clock=lambda: 0.0, **kw)


def _win(workers, rate, wait_fraction, build_ms=90.0, prefetch=2, batches=8, max_build_ms=None,
         on_cpu=None):
    wall = batches / rate
    build = batches * build_ms / 1e3
    return Window(workers, prefetch, batches, wait=wall * wait_fraction,
                  step=wall * (1 - wait_fraction), build=build,
                  max_build=(max_build_ms or build_ms) / 1e3,
                  build_cpu=None if on_cpu is None else on_cpu * build)


def test_loader_bound_climbs_while_it_gains_then_settles_on_the_fewest():
    t = _tuner()
    assert (t.workers, t.prefetch, t.depth()) == (2, 2, 4)  # starts at the CPU count
    t.decide(_win(2, rate=10.0, wait_fraction=0.9))
    assert t.workers == 3 and not t.settled and "waited 90%" in t.tuning.reason
    t.decide(_win(3, rate=12.0, wait_fraction=0.9))
    assert t.workers == 4 and not t.settled
    t.decide(_win(4, rate=12.1, wait_fraction=0.9))  # < 3% better: no gain
    assert t.settled and t.workers == 3 and t.prefetch == 2  # loader-bound: 2 ahead is enough
    assert "no gain" in t.tuning.reason and t.tuning.num_workers == 3
    t.observe(1.0, 1.0, 1.0)  # settled: nothing changes any more
    assert (t.workers, len(t.tuning.trials)) == (3, 3)


def test_loader_bound_with_waiting_builders_tries_one_thread_past_the_cpus_then_stops():
    t = _tuner()
    win = _win(2, rate=10.0, wait_fraction=0.5, on_cpu=0.6)  # builders wait 40% on reads
    win.cpu = 1.8 * win.wall
    t.decide(win)
    assert t.workers == 3 and not t.settled  # one thread per CPU: one more is tried
    assert t.tuning.trials[0]["build_on_cpu"] == 0.6
    win = _win(3, rate=10.5, wait_fraction=0.5, on_cpu=0.6)
    win.cpu = 1.8 * win.wall  # 1.8 of 2 CPUs busy: more threads would only share them
    t.decide(win)
    assert t.settled and t.workers == 3 and "1.8 of 2 CPUs busy" in t.tuning.reason
    assert t.tuning.trials[1]["cpu_util"] == 1.8


def test_computing_builders_settle_at_the_cpu_count_without_a_trial():
    """Builders on a CPU >= ON_CPU of their build time: a third thread on 2 CPUs only shares
    them, whether the consumer only waits or has a step of its own (sleep, GPU)."""
    for wait_fraction in (0.98, 0.4):
        t = _tuner()
        t.decide(_win(2, rate=20.0, wait_fraction=wait_fraction, on_cpu=0.97))
        assert t.settled and (t.workers, t.prefetch) == (2, 2) and len(t.tuning.trials) == 1
        assert "the 2 builders were on a CPU 97% of their build time" in t.tuning.reason
    t = _tuner()  # builders that wait on the network: one more thread is tried
    t.decide(_win(2, rate=20.0, wait_fraction=0.98, on_cpu=0.5))
    assert t.workers == 3 and not t.settled
    t = _tuner(cpus=4, top=8)  # under the CPU count computing builders still climb
    t.decide(_win(2, rate=20.0, wait_fraction=0.5, on_cpu=0.99))
    assert t.workers == 3 and not t.settled
    t = _tuner()  # unknown thread CPU time (None): the trial is made
    t.decide(_win(2, rate=20.0, wait_fraction=0.98))
    assert t.workers == 3 and not t.settled


def test_a_live_window_measures_the_builders_thread_cpu(packed_sample):
    """The backend passes each build's thread CPU time: a window's ``build_on_cpu`` is a
    fraction of its build time (thread CPU seconds can only exceed wall seconds by the clocks'
    granularity)."""
    loader = make_loader(packed_sample("wds"), "train", 2, num_workers="auto", image_size=S)
    loader.backend.tuner.window = 2
    for _ in loader:
        pass
    trials = loader.tuning.trials
    assert trials and all(0.0 < t["build_on_cpu"] <= 1.2 for t in trials), trials


def test_a_change_is_measured_after_the_batches_in_flight():
    """The window after a change starts once the batches in flight under the old setting
    are out (depth of the new setting), also when the consumer waits."""
    t = _tuner(cpus=2, top=8)
    t.window = 2
    t.start_epoch()
    for _ in range(4 + 2):  # 4 skipped (depth 2 x 2), then a window of 2
        t.observe(0.1, 0.0, 0.2, 0.1)
    assert t.workers == 3 and len(t.tuning.trials) == 1  # builders on a CPU 50%: a trial
    assert t.tuning.trials[0]["build_on_cpu"] == 0.5
    for _ in range(6):  # depth 3 x 2 = 6 batches skipped
        t.observe(0.2, 0.0, 0.2, 0.1)
    assert len(t.tuning.trials) == 1
    t.observe(0.05, 0.0, 0.2, 0.1)
    t.observe(0.05, 0.0, 0.2, 0.1)
    assert len(t.tuning.trials) == 2 and t.tuning.trials[1]["wait_ms"] == 50.0


def test_loader_bound_stops_at_the_upper_bound():
    t = _tuner(cpus=4, top=4)
    t.decide(_win(4, rate=10.0, wait_fraction=0.5))
    assert t.settled and t.workers == 4 and "at the most workers (4)" in t.tuning.reason


def test_consumer_bound_tries_fewer_workers_and_keeps_them_when_they_keep_up():
    t = _tuner(cpus=8, top=16)
    assert t.workers == 8
    # steps of 80 ms, builds of 90 ms: ceil(1.25 x 90 / 80) = 2 workers keep up
    t.decide(_win(8, rate=1 / 0.08, wait_fraction=0.0))
    assert t.workers == 2 and not t.settled
    t.decide(_win(2, rate=1 / 0.0805, wait_fraction=0.01, max_build_ms=200.0))
    assert t.settled and t.workers == 2
    # in flight must cover the slowest build: ceil(200 / 80) + 1 = 4 batches, 2 per worker
    assert t.prefetch == 2


def test_consumer_bound_reverts_when_fewer_workers_fall_behind():
    t = _tuner(cpus=8, top=16)
    t.decide(_win(8, rate=12.5, wait_fraction=0.0))
    assert t.workers == 2
    t.decide(_win(2, rate=10.0, wait_fraction=0.2))  # 2 fall behind: one more
    assert t.workers == 3 and not t.settled
    t.decide(_win(3, rate=12.4, wait_fraction=0.01))  # keeps up, within 3% of 8 workers
    assert t.settled and t.workers == 3
    t = _tuner(cpus=8, top=16)
    t.decide(_win(8, rate=12.5, wait_fraction=0.0))
    t.decide(_win(2, rate=10.0, wait_fraction=0.2))
    t.decide(_win(3, rate=10.2, wait_fraction=0.15))  # no gain over 2: the best seen, 8
    assert t.settled and t.workers == 8


def test_prefetch_covers_the_slowest_build_within_the_memory_bound():
    t = _tuner(cpus=2, top=4)
    t.decide(_win(2, rate=50.0, wait_fraction=0.0, build_ms=30.0, max_build_ms=150.0))
    # steps of 20 ms, slowest build 150 ms: ceil(150 / 20) + 1 = 9 batches ahead, 5 per worker
    assert t.settled and (t.workers, t.prefetch) == (2, 5)
    small = _tuner(cpus=2, top=4, budget=60 * MB)  # room for 6 batches of 10 MB
    small.decide(_win(2, rate=50.0, wait_fraction=0.0, build_ms=30.0, max_build_ms=150.0))
    assert (small.workers, small.prefetch) == (2, 3)
    fixed = _tuner(prefetch=6)
    fixed.decide(_win(2, rate=50.0, wait_fraction=0.0, build_ms=30.0, max_build_ms=150.0))
    assert fixed.prefetch == 6


def test_memory_bound_caps_the_workers():
    t = _tuner(cpus=16, top=32, budget=30 * MB)  # 3 batches of 10 MB
    assert (t.max_workers, t.workers, t.prefetch) == (3, 3, 1)


def test_fixed_workers_with_auto_prefetch_settles_after_one_window():
    t = _tuner(workers=3)
    t.decide(_win(3, rate=10.0, wait_fraction=0.9))
    assert t.settled and t.workers == 3


def test_observe_skips_the_filling_queue_then_decides_per_window():
    t = _tuner()
    t.window = 2
    t.start_epoch()  # skips depth() = 4 batches
    for _ in range(4):
        t.observe(0.1, 0.0, 0.2)
    assert t.tuning.trials == []
    t.observe(0.1, 0.0, 0.2)
    t.observe(0.1, 0.0, 0.2)
    assert len(t.tuning.trials) == 1 and t.tuning.trials[0]["wait_fraction"] == 1.0
    assert t.workers == 3  # the consumer waited: one more worker


def test_plan_tuning_resolves_the_process_backend_up_front():
    nw, pf, streams, tuner, tuning = plan_tuning("process", "auto", "auto", 64, 224, cpus=6,
                                                 budget=1 << 30)
    assert (nw, pf, streams, tuner) == (6, 2, 6, None) and tuning.settled
    nw, pf, streams, tuner, tuning = plan_tuning("thread", "auto", 4, 64, 224, cpus=3,
                                                 budget=1 << 30)
    assert (nw, streams, tuner.max_workers, tuner.workers, tuner.prefetch) == (6, 6, 6, 3, 4)
    assert plan_tuning("thread", 2, 2, 64, 224, cpus=3)[:4] == (2, 2, 2, None)


# --- shardkit train -----------------------------------------------------------------------------

def test_train_defaults_to_auto_and_the_cli_takes_auto_or_an_int():
    from shardkit.train import load_config
    from shardkit.train.cli import train_command
    from shardkit.train.config import TrainConfig

    def params(*args):
        return train_command.make_context("train", ["D", *args]).params

    assert (TrainConfig().num_workers, TrainConfig().prefetch_factor) == ("auto", "auto")
    assert load_config("default").num_workers == "auto"
    assert params("--num-workers", "auto")["num_workers"] == "auto"
    assert params("-j", "3", "--prefetch-factor", "auto")["num_workers"] == 3
    assert params("--prefetch-factor", "auto")["prefetch_factor"] == "auto"
    with pytest.raises(Exception, match="'fast' is neither an integer nor 'auto'"):
        params("--num-workers", "fast")
    for bad, named in (({"num_workers": -1}, "num_workers=-1"),
                       ({"prefetch_factor": 0}, "prefetch_factor=0"),
                       ({"num_workers": "fast"}, "num_workers='fast'")):
        with pytest.raises(ConfigError, match=f"{named}: expected auto or an integer"):
            TrainConfig(**bad)


def test_train_with_auto_workers_writes_the_tuning_to_metrics_json(packed_sample, tmp_path):
    import json

    from click.testing import CliRunner

    from shardkit.cli import main

    run = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "train", str(packed_sample("wds")), "--out", str(run), "--config", "cpu-smoke",
        "--model", "test_resnet", "--image-size", "32", "--batch-size", "16", "--epochs", "1",
        "--max-steps", "2", "--warmup-steps", "1", "--num-workers", "auto"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    tuning = json.loads((run / "metrics.json").read_text())["tuning"]
    assert set(tuning) >= {"train", "val"}
    train = tuning["train"]
    assert train["auto"] == {"num_workers": True, "prefetch_factor": False}
    assert train["backend"] == "thread" and 1 <= train["num_workers"] <= train["max_workers"]
    assert train["reason"] and isinstance(train["settled"], bool)


def test_bench_times_auto_beside_the_grid(packed_sample, tmp_path):
    from shardkit.bench.cli import run_bench
    from shardkit.bench.runner import RunConfig

    lines: list[str] = []
    cfg = RunConfig(warmup=1, batches=3, repeats=1, batch_size=8, image_size=32)
    doc = run_bench([str(packed_sample("wds"))], tmp_path / "b", num_workers="1,2",
                    prefetch_factor="2", pin_memory="off", cfg=cfg, plots=False,
                    echo=lambda msg="", err=False: None if err else lines.append(msg))
    (auto,) = doc["auto"]
    grid = {r["id"]: r for r in doc["rows"]}
    assert auto["kind"] == "auto" and auto["status"] == "ok" and auto["id"] not in grid
    assert auto["setting"]["num_workers"] == auto["setting"]["prefetch_factor"] == "auto"
    best = max(grid.values(), key=lambda r: r["metrics"]["throughput_img_s"]["median"])
    assert auto["best_row"] == best["id"]
    assert auto["ratio_to_best"] == pytest.approx(
        auto["metrics"]["throughput_img_s"]["median"]
        / best["metrics"]["throughput_img_s"]["median"])
    assert auto["default_row"] == next(i for i, r in grid.items()
                                       if r["setting"]["num_workers"] == 2)
    assert auto["tuning"]["auto"] == {"num_workers": True, "prefetch_factor": True}
    printed = "\n".join(lines)
    assert f"auto #{auto['id']} (thread, wds, cache=none, augment=none): " in printed
    assert "x the best grid row" in printed
    off = run_bench([str(packed_sample("wds"))], tmp_path / "c", num_workers="1",
                    prefetch_factor="2", pin_memory="off", cfg=cfg, plots=False, echo=None,
                    auto=False)
    assert off["auto"] == []


def test_cpu_count_takes_the_container_quota_and_the_node_s_ranks(tmp_path):
    """A pod limited to 1.5 CPUs counts 2; cgroup v1's quota too; no quota ("max", -1) leaves
    the affinity; torchrun's ranks share an unpinned machine."""
    import os

    from shardkit.stream.tuning import cpu_count

    affinity = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cpu_count(str(v2), {}) == min(affinity, 2)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_count(str(v2), {}) == affinity
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_count(str(tmp_path / "v1"), {}) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_count(str(tmp_path / "v1"), {}) == affinity
    none = str(tmp_path / "none")
    assert cpu_count(none, {"LOCAL_WORLD_SIZE": "not a number"}) == affinity
    if affinity == (os.cpu_count() or affinity):          # not pinned: the ranks share it
        assert cpu_count(none, {"LOCAL_WORLD_SIZE": "2"}) == max(1, affinity // 2)
        assert cpu_count(none, {"LOCAL_WORLD_SIZE": str(4 * affinity)}) == 1


# --- the settled pool: replaced between epochs without waiting --------------------------------

class _FakePlan:
    def __init__(self, n):
        self.n = n

    def worker_batches(self, worker, count, start):
        return list(range(start, self.n))

    def batch_slice(self, b):
        return slice(0, 1)


class _FakeDataset:
    """Batches are their numbers; batch ``hang`` blocks until ``release`` is set; ``threads``
    maps each batch to the thread that built it (the objects: names repeat across pools)."""
    device_decode = False
    transform = None

    class source:  # noqa: N801 - what the backend closes
        @staticmethod
        def close():
            pass

    def __init__(self, n=12, hang=None, build_s=0.005):
        self.n, self.hang, self.release, self.build_s = n, hang, threading.Event(), build_s
        self.threads: dict[int, threading.Thread] = {}

    def plan(self):
        return _FakePlan(self.n)

    def build(self, plan, b, transform=None, pin=False, buffers=None):
        self.threads[b] = threading.current_thread()
        if b == self.hang:
            self.release.wait(30)
        time.sleep(self.build_s)
        return b


def _settled_backend(dataset, timeout=5.0):
    from shardkit.stream.backends import ThreadBackend

    tuner = AutoTuner(2, 4, 1, 1000)
    backend = ThreadBackend(dataset, tuner.max_workers, tuner.prefetch, False, timeout,
                            tuner=tuner)
    return backend, tuner


def _settle(tuner, workers=2):
    tuner.workers = tuner.tuning.num_workers = workers
    tuner.tuning.settled = True


def test_a_hung_build_still_times_out_after_the_tuner_settles():
    """The settled epoch replaces the pool without waiting for the hung build of the epoch
    before (which ``timeout`` reported): it raises LoaderError within its own timeout."""
    from shardkit.errors import LoaderError

    data = _FakeDataset(hang=3)
    backend, tuner = _settled_backend(data, timeout=0.5)
    try:
        with pytest.raises(LoaderError, match="no batch within timeout=0.5 s"):
            list(backend.batches(0, lambda: "x"))
        _settle(tuner)
        t0 = time.monotonic()
        with pytest.raises(LoaderError, match="no batch within timeout=0.5 s"):
            list(backend.batches(0, lambda: "x"))
        assert time.monotonic() - t0 < 5  # not blocked on the old pool's hung thread
        assert backend._pool_size == 2
    finally:
        data.release.set()
        backend.close()


def test_an_iteration_kept_across_the_pool_change_still_gives_its_batches():
    data = _FakeDataset(build_s=0.1)
    backend, tuner = _settled_backend(data)
    tuner.prefetch = 4  # 8 in flight on 4 threads: 4 still queued when the pool changes
    try:
        old = backend.batches(0, lambda: "x")
        assert [next(old), next(old)] == [0, 1]
        _settle(tuner)
        assert list(backend.batches(0, lambda: "x")) == list(range(12))
        assert list(old) == list(range(2, 12))  # its queued builds were not cancelled
    finally:
        backend.close()


def test_the_epoch_the_tuner_settles_in_goes_on_on_a_pool_of_the_settled_size():
    """Settled mid-epoch, the batches after the ones in flight are built on a new pool of the
    settled size (the gated pool this replaced cost the tuning epoch 7%); the epoch gives every
    batch once, in order."""
    data = _FakeDataset(n=16)
    threads = data.threads
    backend, tuner = _settled_backend(data)
    seen = []
    real_observe = tuner.observe

    def observe(*args):
        seen.append(args)
        real_observe(*args)
        if len(seen) == 3:
            _settle(tuner, 1)

    tuner.observe = observe
    try:
        assert list(backend.batches(0, lambda: "x")) == list(range(16))
        assert backend._pool_size == 1 and backend._pool._max_workers == 1
        assert len(seen) == 3 and all(len(a) == 4 and a[3] >= 0 for a in seen)
        late = {threads[b] for b in range(10, 16)}  # submitted after the switch
        assert len(late) == 1
        early = {threads[b] for b in range(4)}  # the tuning pool's 2 threads
        assert late.isdisjoint(early)
    finally:
        backend.close()


def test_while_tuning_a_batch_is_built_by_a_pool_of_the_workers_it_was_submitted_under():
    """Each change of the tuner's workers gets a pool of that size: the batches submitted under
    ``w`` workers are built by at most ``w`` threads (no larger pool held back by a gate)."""
    data = _FakeDataset(n=40, build_s=0.002)
    threads = data.threads
    backend, tuner = _settled_backend(data)
    tuner.window = 1
    todo = [1, 3, 4]
    tuner._next_workers = lambda win: (todo.pop(0), "scripted") if todo else (None, "end")
    submitted: dict[int, tuple] = {}  # batch: (the phase, its workers)
    real_submit = backend._submit

    def submit(plan, b, last, workers, timed):
        submitted[b] = ((len(tuner.tuning.trials), tuner.settled), workers)
        return real_submit(plan, b, last, workers, timed)

    backend._submit = submit
    try:
        assert list(backend.batches(0, lambda: "x")) == list(range(40))
        assert [t["workers"] for t in tuner.tuning.trials] == [2, 1, 3, 4]
        phases = set(submitted.values())
        assert {w for _, w in phases} == {1, 2, 3, 4}
        for phase in phases:
            built = {threads[b] for b, p in submitted.items() if p == phase}
            assert 1 <= len(built) <= phase[1], (phase, len(built))
    finally:
        backend.close()


def test_a_drop_in_workers_is_measured_after_the_old_depth_in_flight():
    """4 x 2 -> 2 x 2: 8 batches built under 4 workers are in flight; the window skips them."""
    t = _tuner(cpus=4, top=8)
    t.window = 2
    t.start_epoch()
    for _ in range(8 + 2):  # depth 4 x 2 skipped, then a window of 2: consumer-bound
        t.observe(0.0, 0.2, 0.1, 0.1)
    assert t.workers == 1 and len(t.tuning.trials) == 1  # ceil(1.25 x 0.1 / 0.2) = 1
    for _ in range(8):  # the old depth (8), not the new one (1 x 2)
        t.observe(0.0, 0.2, 0.1, 0.1)
    assert len(t.tuning.trials) == 1
    t.observe(0.0, 0.2, 0.1, 0.1)
    t.observe(0.0, 0.2, 0.1, 0.1)
    assert len(t.tuning.trials) == 2


def test_batches_in_flight_stay_within_the_memory_bound_while_workers_climb():
    t = _tuner(cpus=2, top=4, budget=50 * MB)  # room for 5 batches of 10 MB
    depths = [t.depth()]
    for workers in (2, 3):
        t.decide(_win(workers, rate=10.0 + workers, wait_fraction=0.9, on_cpu=0.5))
        depths.append(t.depth())
    assert t.workers == 4 and max(depths) <= t.max_in_flight == 5, depths
    assert t.tuning.prefetch_factor == t.prefetch == 1


def test_close_during_tuning_stops_the_replaced_pools_too():
    """close() cancels the queued builds of every pool the tuner replaced and waits for the
    running ones: no build runs after it returns; an iteration still running then raises
    LoaderError at its next batch (not a CancelledError)."""
    from shardkit.errors import LoaderError

    builds = []

    class Counting(_FakeDataset):
        def build(self, plan, b, transform=None, pin=False, buffers=None):
            time.sleep(0.05)
            builds.append(b)
            return b

    backend, tuner = _settled_backend(Counting(n=60))
    tuner.window = 1
    tuner._next_workers = lambda win: (1 if tuner.workers != 1 else 4, "scripted")
    tuner._begin = lambda skip: AutoTuner._begin(tuner, 1)
    it = backend.batches(0, lambda: "x")
    got, was_four = [], False
    while not (was_four and tuner.workers == 1):  # up to the batch after a 4 -> 1 change
        was_four = was_four or tuner.workers == 4
        got.append(next(it))
    got.append(next(it))  # the 4-thread pool retired, its queue still holding builds
    assert got == list(range(len(got)))
    retired = list(backend._retired)
    assert retired
    backend.close()
    done = len(builds)
    time.sleep(0.5)
    assert len(builds) == done < 60
    assert not any(t.is_alive() for p in retired for t in p._threads)
    with pytest.raises(LoaderError, match="the loader was closed during this iteration"):
        list(it)


def test_a_settled_epoch_drains_a_deeper_carried_queue_to_its_depth():
    """Settled mid-epoch from 3 or 4 workers x 2 to 1 x 1: the batches in flight drain to 1
    (without draining they stayed at the old depth for the rest of the epoch)."""
    backend, tuner = _settled_backend(_FakeDataset(n=40, build_s=0.002))
    tuner.workers, tuner.prefetch = 4, 2
    tuner.window = 1
    seen = [0]
    real_observe = tuner.observe

    def observe(*args):
        real_observe(*args)
        seen[0] += 1
        if seen[0] == 12:
            tuner.prefetch = 1
            _settle(tuner, 1)

    tuner.observe = observe
    tuner._next_workers = lambda win: (4 if tuner.workers != 4 else 3, "scripted")  # no end
    tuner._begin = lambda skip: AutoTuner._begin(tuner, 1)
    submitted = [0]
    real_submit = backend._submit

    def submit(*a):
        submitted[0] += 1
        return real_submit(*a)

    backend._submit = submit
    in_flight = []
    try:
        for got, b in enumerate(backend.batches(0, lambda: "x"), 1):
            if tuner.settled:
                in_flight.append(submitted[0] - got)
        assert b == 39
        assert in_flight[0] >= 4 and max(in_flight[8:]) <= 1, in_flight
    finally:
        backend.close()


def test_an_iteration_of_a_fixed_setting_raises_loader_error_after_close():
    from shardkit.errors import LoaderError
    from shardkit.stream.backends import ThreadBackend

    backend = ThreadBackend(_FakeDataset(n=30, build_s=0.01), 2, 2, False, 5.0)
    it = backend.batches(0, lambda: "x")
    assert [next(it), next(it)] == [0, 1]
    backend.close()
    with pytest.raises(LoaderError, match="the loader was closed during this iteration"):
        list(it)
    assert list(backend.batches(0, lambda: "x")) == list(range(30))  # usable again
    backend.close()
