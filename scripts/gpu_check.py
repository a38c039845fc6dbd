"""GPU check: does shardkit keep one GPU training hrnet_w18_small fed? One prepared run.

The goal it tests: hrnet_w18_small, bf16, channels-last, 224 px, batch 128, SGD, on one GPU with
the machine's CPU cores, fed by shardkit with standard augmentation (timm's colour jitter 0.4
after the random resized crop and flip), trains at >= 0.95x the speed of the same model on
synthetic tensors already on the GPU, with a data-wait fraction under 5%.

Phases, in order; each has a time cap (``--cap PHASE=SECONDS``) and the whole run a budget
(``--budget``, default 470 s): a phase that overruns is cut and recorded, a phase that fails is
recorded with its reason, and the rest still run.

0. ``probe``: a subprocess reports the environment (GPU, torch/CUDA, CPU cores, decoders:
   :func:`shardkit.bench.env.collect_environment`). Without ``--dry-run`` and without CUDA the
   script stops here (exit 2).
1. ``tests``: ``pytest -m gpu tests -q`` as a subprocess; passed / failed / skipped / errors
   counted from its JUnit XML (on the CPU they all skip, which is recorded).
2. ``generate``: ``--images`` JPEGs (default 20,000) in ``--classes`` class folders (default
   1,000), near 500x375 px, quality 90, about 100-150 KB each, synthesised with numpy in one
   process per core (octave noise textures, shapes, grain; nothing is downloaded).
3. ``pack``: ``shardkit pack SRC OUT --format wds --split train=1.0 --near-duplicates off
   --workers CORES`` as a subprocess. Generation and pack times are reported; a ``--work``
   folder that already holds the same set and pack is reused (``--fresh`` redoes both).
4. ``pipelines``: the same training step (:class:`shardkit.bench.steps.ModelStep`, bf16,
   channels-last, SGD; one model per process) timed by :func:`shardkit.bench.harness.time_batches`
   for ``--warmup`` untimed then ``--steps`` timed steps, each batch through
   :class:`shardkit.stream.DeviceNormalizer` (the float conversion and normalisation on the
   device, as ``shardkit train`` does):

   - (a) ``synthetic``: one uint8 batch made once on the GPU (the ceiling);
   - (b) ``cpu_decode``: ``make_loader`` thread backend, CORES decoding threads, the fused CPU
     decode, standard augmentation on the CPU rows;
   - (c) ``device_decode``: ``device_decode="cuda"``: one batched nvJPEG ``decode_jpeg`` call
     per batch, crop, resize, flip and augmentation on the GPU;
   - (d) ``device_augment``: CPU decode, ``augment_device="cuda"`` (augmentation on the GPU);
   - (e) ``dali``: NVIDIA DALI's GPU pipeline (``benchmarks/peers/peer_dali.py``
     ``train_pipeline``) on the same JPEG files, in DALI's own venv (``--dali-venv``, built by
     ``benchmarks/peers/make_venv.sh dali``; with ``--build-peers`` the script builds it in the
     background while phases 1-3 run). Without the venv, or when it cannot be built (no
     registry reachable), it is recorded as not run, with the reason.

   (a)-(d) run in one worker subprocess (relaunched for the rest if it dies or hangs), (e) in a
   worker under the DALI venv's Python with the project's packages appended to its path. Each
   loader samples ``mode="stream"`` with an epoch of exactly the steps run, so no epoch boundary
   falls inside the timed window.
5. One JSON file (``--out``, default ``benchmarks/results/gpu_check.json``) and a table on
   stdout: each pipeline's img/s, data-wait fraction (time blocked waiting for the next batch /
   wall time of the timed window) and ratio to (a), the decoder and augmentation device really
   used, the environment, and one verdict line for the goal.

``--dry-run`` runs every phase on the CPU with tiny sizes (64 images in 10 classes, the timm
``test_resnet`` model at 32 px, batch 8, 1 warm-up and 3 timed steps): the CPU stands in for the
GPU (``device_decode="cpu"`` runs the batched ``decode_jpeg`` code with libjpeg-turbo;
``augment_device=torch.device("cpu", 0)`` runs the batched tensor augmentation code on the CPU)
and its numbers prove only that every step runs (tests/test_gpu_check.py runs it).

Usage::

    make gpu-check [GPU_CHECK_ARGS="--build-peers"]
    python scripts/gpu_check.py [--out FILE] [--work DIR] [--build-peers] [--dry-run]

Exit status: 0 the run finished and the goal is met (``--dry-run``: every pipeline (a)-(d) gave
numbers); 1 it finished and the goal is not met, a shardkit pipeline gave no numbers, or a GPU
test failed (the JSON and table say which); 2 it cannot run (one ``Error:`` line on stderr: bad
arguments, no CUDA without ``--dry-run``, no torch).

Only the standard library is imported at module level: the generation processes are forked from
a parent that never imports torch or touches CUDA.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "benchmarks" / "peers"

#: pipeline name -> the label used in the table (the goal's (a)-(e)).
PIPELINES = {
    "synthetic": "(a) synthetic on the GPU",
    "cpu_decode": "(b) shardkit CPU decode",
    "device_decode": "(c) shardkit nvJPEG decode",
    "device_augment": "(d) shardkit GPU augment",
    "dali": "(e) DALI GPU pipeline",
}
SHARDKIT_PIPELINES = ("cpu_decode", "device_decode", "device_augment")
#: default time cap per phase, seconds (their sum is the 8-minute envelope; --budget bounds all)
CAPS = {"probe": 60, "tests": 90, "generate": 60, "pack": 75, "startup": 60, "synthetic": 30,
        "cpu_decode": 45, "device_decode": 45, "device_augment": 45, "dali": 90,
        "dali_build": 300}
GOAL_RATIO, GOAL_WAIT = 0.95, 0.05
GRACE_S = 20.0       # past a pipeline's cap before its worker is killed (it cuts itself first)
MIN_PHASE_S = 5.0    # a phase with less budget left than this is not started
SYNTH_VERSION = 1    # bump when the image synthesiser changes (invalidates reused sets)

FULL = {"images": 20000, "classes": 1000, "image_size": 224, "batch_size": 128, "warmup": 30,
        "steps": 300, "model": "hrnet_w18_small"}
DRY = {"images": 64, "classes": 10, "image_size": 32, "batch_size": 8, "warmup": 1, "steps": 3,
       "model": "test_resnet"}


class CannotRun(Exception):
    """The check cannot run at all (exit 2 with one ``Error:`` line)."""


# ---------------------------------------------------------------------------------------------
# small helpers

def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _env() -> dict:
    """The environment for child processes: this repository first on PYTHONPATH (the script
    runs from a checkout without an install, as on a bare GPU machine), output unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in
                                                       env.get("PYTHONPATH", "").split(os.pathsep)
                                                       if p])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Budget:
    """The whole run's wall-clock budget: ``allowed(cap)`` is a phase's cap cut to what is left
    (seconds); ``deadline`` is absolute (``time.time()``), shared with the workers."""

    def __init__(self, seconds: float):
        self.start = time.time()
        self.deadline = self.start + seconds
        self.seconds = seconds

    def left(self) -> float:
        return self.deadline - time.time()

    def allowed(self, cap: float) -> float:
        return max(0.0, min(cap, self.left()))


def _not_run(reason: str) -> dict:
    return {"status": "not run", "reason": reason}


def _run_capped(cmd: list[str], cap: float, log: Path, env: dict | None = None) -> dict:
    """Runs ``cmd`` (its own process group, output to ``log``) for at most ``cap`` seconds:
    ``{"returncode": int | None, "seconds": float, "cut": bool}`` (None and cut when killed)."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env or _env(),
                                cwd=REPO, start_new_session=True)
        try:
            rc = proc.wait(timeout=cap)
            cut = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, cut = None, True
    return {"returncode": rc, "seconds": round(time.perf_counter() - t0, 2), "cut": cut}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group this script started for ``proc`` (start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ---------------------------------------------------------------------------------------------
# phase 1: the gpu-marked tests

def run_gpu_tests(work: Path, cap: float, tests: str) -> dict:
    """``pytest -m gpu TESTS -q`` in a subprocess; counts from its JUnit XML.

    Returns ``{"status": "ok" | "failed" | "cut" | "error", "passed", "failed", "skipped",
    "errors", "failures": [test ids], "seconds", "command", "log_tail"}``; ``ok`` means no test
    failed (all skipped is ok, and recorded as such)."""
    xml = work / "gpu-tests.xml"
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", tests, "-q", "-p", "no:cacheprovider",
           f"--junitxml={xml}"]
    log = work / "logs" / "gpu-tests.log"
    run = _run_capped(cmd, cap, log)
    out = {"command": " ".join(cmd[1:]), "seconds": run["seconds"], "cap_s": round(cap, 1)}
    counts = {"passed": None, "failed": None, "skipped": None, "errors": None}
    failures: list[str] = []
    if xml.is_file():
        try:
            root = ET.parse(xml).getroot()
            suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
            total = sum(int(s.get("tests", 0)) for s in suites)
            counts = {k: sum(int(s.get(k, 0)) for s in suites)
                      for k in ("failures", "errors", "skipped")}
            counts = {"passed": total - sum(counts.values()), "failed": counts["failures"],
                      "skipped": counts["skipped"], "errors": counts["errors"]}
            for case in root.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failures.append(f"{case.get('classname')}::{case.get('name')}")
        except (ET.ParseError, ValueError) as exc:
            out["xml_error"] = f"{type(exc).__name__}: {exc}"
    out.update(counts, failures=failures)
    if run["cut"]:
        out.update(status="cut", reason=f"pytest ran past its cap ({cap:.0f} s) and was killed")
    elif run["returncode"] == 0 or (run["returncode"] == 5 and not failures):
        out["status"] = "ok"  # 5: no test selected, recorded by the counts
    elif run["returncode"] == 1:
        out.update(status="failed", reason=f"{counts['failed']} failed, {counts['errors']} "
                                           f"errors")
    else:
        out.update(status="error", reason=f"pytest exited {run['returncode']}")
    if out["status"] != "ok":
        out["log_tail"] = _tail(log)
    return out


# ---------------------------------------------------------------------------------------------
# phase 2: an ImageNet-like JPEG set, synthesised

#: (width, height) of the generated images and their weights: ImageNet's common shapes.
SIZES = [((500, 375), 6), ((375, 500), 2), ((500, 333), 2), ((500, 400), 1), ((400, 300), 1),
         ((500, 500), 1), ((480, 360), 1)]
_BANK_SIDE = 640
_bank: tuple | None = None


def _make_bank(seed: int = 0, n: int = 6):
    """Texture fields for the synthesiser: ``n`` int16 ``(640, 640, 3)`` sums of bicubic-upscaled
    random octaves (amplitude falling with frequency, as in photos) and one grain field."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    fields = []
    for _ in range(n):
        acc = np.zeros((_BANK_SIDE, _BANK_SIDE, 3), np.float32)
        for k, amp in ((4, 60), (8, 45), (16, 34), (32, 26), (64, 20), (160, 14), (320, 9)):
            small = rng.integers(0, 256, (k, k, 3), dtype=np.uint8)
            up = Image.fromarray(small).resize((_BANK_SIDE, _BANK_SIDE), Image.BICUBIC)
            acc += (np.asarray(up, np.float32) - 128.0) * (amp / 128.0)
        fields.append(acc.astype(np.int16))
    grain = rng.integers(-128, 128, (_BANK_SIDE, _BANK_SIDE, 3), dtype=np.int16)
    return fields, grain


def synth_jpeg(index: int, seed: int = 0, quality: int = 90) -> bytes:
    """One photo-like JPEG (deterministic in ``(seed, index)``): two texture fields cropped at
    random offsets, a base colour, 3-8 filled shapes and grain of random strength, so that
    libjpeg-turbo at ``quality`` 90 writes about 100-150 KB for 500x375 px (4:2:0), as for
    photos. Size from :data:`SIZES`."""
    import numpy as np
    from PIL import Image, ImageDraw

    global _bank
    if _bank is None:
        _bank = _make_bank()
    fields, grain = _bank
    rng = np.random.default_rng([seed, index])
    w, h = SIZES[int(rng.choice(len(SIZES), p=_weights()))][0]

    def crop(f):
        y, x = int(rng.integers(0, _BANK_SIDE - h + 1)), int(rng.integers(0, _BANK_SIDE - w + 1))
        c = f[y:y + h, x:x + w]
        return c[:, ::-1] if rng.random() < 0.5 else c

    i, j = rng.choice(len(fields), 2, replace=False)
    arr = crop(fields[i]) + (crop(fields[j]) >> 1) + rng.integers(50, 200, 3).astype(np.int16)
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(-50, w)), int(rng.integers(-50, h))
        box = (x0, y0, x0 + int(rng.integers(20, 250)), y0 + int(rng.integers(20, 250)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse(box, fill=colour, outline=(0, 0, 0))
        else:
            draw.polygon([tuple(int(v) for v in rng.integers(-50, max(w, h) + 50, 2))
                          for _ in range(3)], fill=colour)
    strength = int(rng.integers(32, 72))
    arr = np.asarray(img, np.int16) + ((crop(grain) * strength) >> 7)
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _weights():
    total = sum(w for _, w in SIZES)
    return [w / total for _, w in SIZES]


def _write_chunk(args) -> tuple[int, int]:
    """Pool task: writes the JPEGs of ``(src, seed, [(index, class_dir), ...])`` (each through a
    ``.tmp`` name, so a killed pool leaves no partial ``.jpg``); returns ``(files, bytes)``."""
    src, seed, items = args
    total = 0
    for index, cls in items:
        data = synth_jpeg(index, seed)
        path = Path(src) / cls / f"img_{index:06d}.jpg"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        total += len(data)
    return len(items), total


def generate(src: Path, images: int, classes: int, workers: int, cap: float,
             seed: int = 0) -> dict:
    """Writes ``images`` JPEGs in ``classes`` folders ``c0000..`` of ``src`` with ``workers``
    forked processes, for at most ``cap`` seconds.

    Returns ``{"status": "ok" | "cut", "images", "classes", "bytes", "mean_kb", "seconds",
    "images_per_s", "workers"}``; a cut run keeps the files finished so far (no ``.tmp``)."""
    import multiprocessing

    if src.exists():
        shutil.rmtree(src)
    names = [f"c{k:04d}" for k in range(classes)]
    for name in names:
        (src / name).mkdir(parents=True)
    items = [(i, names[i % classes]) for i in range(images)]
    chunk = 25
    tasks = [(str(src), seed, items[k:k + chunk]) for k in range(0, len(items), chunk)]
    t0 = time.perf_counter()
    done = nbytes = 0
    cut = False
    ctx = multiprocessing.get_context("fork")  # this process has not imported torch
    pool = ctx.Pool(workers)
    try:
        results = pool.imap_unordered(_write_chunk, tasks)
        for _ in tasks:
            remaining = cap - (time.perf_counter() - t0)
            try:
                n, b = results.next(timeout=max(0.01, remaining))
            except multiprocessing.TimeoutError:
                cut = True
                break
            done += n
            nbytes += b
    finally:
        pool.terminate()
        pool.join()
    seconds = time.perf_counter() - t0
    for tmp in src.rglob("*.tmp"):
        tmp.unlink()
    if cut:  # count what the killed pool finished
        files = list(src.rglob("*.jpg"))
        done, nbytes = len(files), sum(f.stat().st_size for f in files)
    out = {"status": "cut" if cut else "ok", "images": done, "classes": classes,
           "bytes": nbytes, "mean_kb": round(nbytes / done / 1000, 1) if done else None,
           "seconds": round(seconds, 2), "images_per_s": round(done / seconds, 1),
           "workers": workers, "jpeg_quality": 90, "cap_s": round(cap, 1)}
    if cut:
        out["reason"] = f"generation ran past its cap ({cap:.0f} s); {done} of {images} written"
    return out


# ---------------------------------------------------------------------------------------------
# phase 3: pack

def pack(src: Path, out: Path, workers: int, cap: float, log: Path) -> dict:
    """``shardkit pack`` (wds, one train split, no near-duplicate search) as a subprocess.

    Returns ``{"status": "ok" | "failed" | "cut", "seconds", "images_per_s", "samples",
    "shards", "command"}`` (``reason`` and ``log_tail`` when not ok)."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "shardkit.cli", "pack", str(src), str(out), "--format", "wds",
           "--split", "train=1.0", "--near-duplicates", "off", "--workers", str(workers),
           "--no-progress"]
    run = _run_capped(cmd, cap, log)
    res = {"command": "shardkit " + " ".join(cmd[3:]), "seconds": run["seconds"],
           "workers": workers, "cap_s": round(cap, 1)}
    if run["cut"]:
        return {**res, "status": "cut", "reason": f"pack ran past its cap ({cap:.0f} s) and "
                                                  f"was killed", "log_tail": _tail(log)}
    if run["returncode"] != 0:
        return {**res, "status": "failed", "reason": f"pack exited {run['returncode']}",
                "log_tail": _tail(log)}
    try:
        manifest = json.loads((out / "manifest.json").read_text())
        train = manifest["splits"]["train"]
        samples, shards = int(train["num_samples"]), len(train["shards"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {**res, "status": "failed", "reason": f"no usable manifest after pack: "
                                                     f"{type(exc).__name__}: {exc}"}
    return {**res, "status": "ok", "samples": samples, "shards": shards,
            "images_per_s": round(samples / run["seconds"], 1) if run["seconds"] else None}


# ---------------------------------------------------------------------------------------------
# phase 4: the worker processes (probe, pipelines)

def _worker_main(spec_path: str) -> int:
    """Entry of a worker subprocess (``--worker SPEC``): ``mode`` ``probe`` or ``pipelines``.
    Events are JSON lines appended to ``spec["progress"]``."""
    spec = json.loads(Path(spec_path).read_text())
    for p in spec.get("extra_path", []):  # the DALI venv: its own packages first, then ours
        if p not in sys.path:
            sys.path.append(p)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    progress = open(spec["progress"], "a", encoding="utf-8")

    def emit(**event) -> None:
        progress.write(json.dumps(event, default=str) + "\n")
        progress.flush()

    if spec["mode"] == "probe":
        emit(event="env", **_probe())
        return 0
    return _pipelines_worker(spec, emit)


def _probe() -> dict:
    """The environment as JSON-ready dict: :func:`shardkit.bench.env.collect_environment` plus
    GPU facts; what fails is recorded, not raised."""
    out: dict = {"python": sys.version.split()[0], "executable": sys.executable,
                 "cpu_cores_usable": _cores()}
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = {"name": props.name, "count": torch.cuda.device_count(),
                      "memory_gib": round(props.total_memory / 2**30, 1),
                      "capability": f"{props.major}.{props.minor}",
                      "multiprocessors": props.multi_processor_count,
                      "cudnn": torch.backends.cudnn.version()}
    try:
        from shardkit.bench.env import collect_environment

        out["environment"] = collect_environment(decoders=["auto", "nvjpeg"])
    except Exception as exc:  # noqa: BLE001
        out["environment_error"] = f"{type(exc).__name__}: {exc}"
        out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda}
    return out


def _pipelines_worker(spec: dict, emit) -> int:
    t0 = time.perf_counter()
    import torch

    from shardkit.bench.steps import ModelStep

    device = torch.device(spec["device"])
    if device.type == "cuda":  # as `shardkit train` (shardkit.train.run_setup.setup_process)
        torch.backends.cudnn.benchmark = True
        if torch.cuda.get_device_capability(device)[0] >= 8:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    step = ModelStep(spec["model"], spec["num_classes"], device, amp=spec["amp"])
    emit(event="ready", seconds=round(time.perf_counter() - t0, 2), step=step.info(),
         torch=torch.__version__, python=sys.version.split()[0])
    for name in spec["pipelines"]:
        cap = spec["caps"][name]
        deadline = min(time.time() + cap, spec["budget_deadline"])
        emit(event="start", pipeline=name, cap_s=cap)
        if spec["budget_deadline"] - time.time() < MIN_PHASE_S:
            emit(event="result", pipeline=name, **_not_run("the run's budget was spent"))
            continue
        try:
            result = _run_pipeline(name, spec, step, device, deadline, cap)
        except Exception as exc:  # noqa: BLE001 - recorded; the next pipeline still runs
            result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}",
                      "traceback_tail": traceback.format_exc().splitlines()[-8:]}
        emit(event="result", pipeline=name, **result)
    return 0


def _until(batches, deadline: float):
    """Yields from ``batches`` until ``time.time()`` passes ``deadline`` (the phase cap)."""
    for batch in batches:
        yield batch
        if time.time() >= deadline:
            return


def _run_pipeline(name: str, spec: dict, step, device, deadline: float, cap: float) -> dict:
    """Times one pipeline: ``--warmup`` + ``--steps`` steps through DeviceNormalizer."""
    from shardkit.bench.harness import time_batches
    from shardkit.errors import BenchError
    from shardkit.bench.monitor import ProcessMonitor
    from shardkit.stream import DeviceNormalizer

    t0 = time.perf_counter()
    close = None
    if name == "synthetic":
        source, info = _synthetic(spec, device), {
            "decoder": "none: one uint8 batch made once on the device", "augment": "none"}
    elif name == "dali":
        source, info = _dali(spec, device)
    else:
        loader = _shardkit_loader(name, spec, device, deadline)
        source, close, info = loader, loader.close, _describe_loader(loader, spec)
    warmup, steps = spec["warmup"], spec["steps"]
    try:
        run = time_batches(_until(DeviceNormalizer(source, device), deadline), step,
                           warmup=warmup, max_batches=steps, monitor=ProcessMonitor(1.0))
    except BenchError:
        if time.time() < deadline:
            raise
        return {"status": "cut", "reason": f"its cap ({cap:.0f} s, or the run's budget) ran "
                                           f"out during the {warmup} warm-up steps",
                "seconds": round(time.perf_counter() - t0, 2), **info}
    finally:
        if close is not None:
            close()
    m = run.metrics()
    timed = len(run.loader_ms)
    out = {"status": "ok" if timed == steps else "cut",
           "img_per_s": round(m["throughput_img_s"], 1),
           "data_wait_fraction": round(m["data_wait_fraction"], 4),
           "step_ms": round(m["step_ms_per_batch"], 2),
           "loader_ms": round(m["loader_ms_per_batch"], 2),
           "loader_ms_p90": round(m["loader_ms_p90"], 2),
           "cpu_util_cores": round(m["cpu_util_cores"], 2) if "cpu_util_cores" in m else None,
           "warmup_steps": warmup, "steps_timed": timed, "images_timed": run.images,
           "timed_s": round(run.wall_s, 2), "seconds": round(time.perf_counter() - t0, 2),
           "batch_size": spec["batch_size"], **info}
    if timed < steps:
        out["reason"] = f"its cap ({cap:.0f} s, or the run's budget) ran out after {timed} of " \
                        f"{steps} timed steps"
    return out


def _synthetic(spec: dict, device):
    """(a): the same uint8 ``(B, 3, S, S)`` channels-last batch and int64 labels, made once on
    ``device``, forever."""
    import torch

    g = torch.Generator().manual_seed(0)
    b, s = spec["batch_size"], spec["image_size"]
    images = torch.randint(0, 256, (b, 3, s, s), dtype=torch.uint8, generator=g)
    images = images.to(device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, spec["num_classes"], (b,), generator=g).to(device)

    def forever():
        while True:
            yield images, labels
    return forever()


def _shardkit_loader(name: str, spec: dict, device, deadline: float):
    """(b), (c), (d): ``make_loader`` on the packed train split, thread backend, one epoch of
    exactly the steps run (``mode="stream"``)."""
    import torch

    from shardkit.stream import SamplingOptions, WorkerOptions, make_loader

    kwargs = {}
    if name == "device_decode":
        kwargs["device_decode"] = str(device)
    elif name == "device_augment":
        # on the CPU the string "cpu" means "the CPU rows"; a torch.device("cpu", 0) takes the
        # batched tensor-op path, the code that runs on CUDA
        kwargs["augment_device"] = str(device) if device.type == "cuda" else torch.device("cpu", 0)
    samples = (spec["warmup"] + spec["steps"]) * spec["batch_size"]
    return make_loader(
        spec["data"], "train", spec["batch_size"], train=True, image_size=spec["image_size"],
        num_workers=spec["threads"], pin_memory=device.type == "cuda", seed=0,
        sampling=SamplingOptions(mode="stream", samples_per_epoch=samples, drop_last=True),
        workers=WorkerOptions(backend="thread", timeout=max(10.0, deadline - time.time())),
        augment=spec["augment"], **kwargs)


def _describe_loader(loader, spec: dict) -> dict:
    """What really decoded and augmented: the decoder's ``info()`` or the batched device path,
    and where the augmentation ops ran."""
    import torchvision

    ds = loader.dataset
    out = {"threads": spec["threads"], "backend": loader.backend_name}
    if loader.device_decode is not None:
        dev = str(loader.device_decode)
        lib = "nvJPEG" if dev.startswith("cuda") else "libjpeg-turbo (the nvJPEG code on the CPU)"
        out["decoder"] = (f"torchvision {torchvision.__version__} io.decode_jpeg, one batched "
                          f"call per batch on {dev} ({lib}); crop, resize, flip on {dev}")
    else:
        info = ds.transform.decoder.info()
        out["decoder_info"] = info
        out["decoder"] = (f"{info.get('name')} (libjpeg-turbo {info.get('libjpeg_turbo', '?')})"
                          f" fused crop+decode+resize in {spec['threads']} threads")
    spec_ = loader.augment
    where = (f"{loader.augment_device} (batched tensor ops after the transfer)"
             if loader.augment_device is not None else "the CPU rows (in the decoding threads)")
    out["augment"] = "none" if spec_.is_identity else f"{spec_.describe()} on {where}"
    out["augment_device"] = None if loader.augment_device is None else str(loader.augment_device)
    return out


def _dali(spec: dict, device):
    """(e): DALI's GPU pipeline on the generated JPEG folder (``peer_dali.train_pipeline``);
    yields ``(images uint8 (N, 3, S, S) channels-last view, labels int64 (N,))``."""
    if str(PEERS) not in sys.path:
        sys.path.insert(0, str(PEERS))
    import nvidia.dali as dali
    import peer_dali
    from common import list_images
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    src = spec["src"]
    _, files = list_images(src)
    rel = [os.path.relpath(path, src) for path, _ in files]
    gpu = device.type == "cuda"
    jitter = {"standard": 0.4, "none": 0.0}.get(spec["augment"])
    if jitter is None:
        raise ValueError(f"the DALI peer implements augment 'standard' and 'none', not "
                         f"{spec['augment']!r}")
    pipe = peer_dali.train_pipeline(src, rel, [label for _, label in files],
                                    batch=spec["batch_size"], threads=spec["threads"],
                                    device_id=(device.index or 0) if gpu else None,
                                    size=spec["image_size"], jitter=jitter)
    it = DALIGenericIterator([pipe], ["images", "labels"], reader_name="reader",
                             auto_reset=True, last_batch_policy=LastBatchPolicy.DROP)

    def forever():
        while True:
            for out in it:
                d = out[0]
                yield d["images"].permute(0, 3, 1, 2), d["labels"].reshape(-1).long()
    where = "mixed (nvJPEG / the hardware JPEG decoder)" if gpu else "cpu (libjpeg-turbo)"
    return forever(), {
        "decoder": f"DALI {dali.__version__} fn.decoders.image_random_crop device={where}",
        "augment": (f"fn.color_twist brightness/contrast/saturation {jitter} + fn.flip on "
                    f"{'the GPU' if gpu else 'the CPU'}" if jitter else "flip only"),
        "threads": spec["threads"], "dali_version": dali.__version__}


class Workers:
    """Runs pipelines in worker subprocesses and enforces each pipeline's cap from outside.

    A worker reports ``ready``, then ``start`` and ``result`` per pipeline (JSON lines). A worker
    that dies, or runs ``GRACE_S`` past a pipeline's cap, is killed; that pipeline is recorded as
    failed (or cut) with the log's tail, and a new worker runs the pipelines left."""

    def __init__(self, work: Path, budget: Budget, caps: dict, script: Path | None = None):
        self.work, self.budget, self.caps = work, budget, caps
        self.script = script or Path(__file__).resolve()  # run as `python SCRIPT --worker SPEC`
        self.attempts: list[dict] = []

    def run(self, python: str, names: list[str], spec: dict, tag: str,
            env: dict | None = None) -> dict:
        results: dict[str, dict] = {}
        remaining = list(names)
        while remaining:
            if self.budget.left() < MIN_PHASE_S:
                for n in remaining:
                    results[n] = _not_run(f"the run's budget ({self.budget.seconds:.0f} s) was "
                                          f"spent before it started")
                break
            n_attempt = len(self.attempts) + 1
            progress = self.work / "logs" / f"{tag}-{n_attempt}.jsonl"
            log = self.work / "logs" / f"{tag}-{n_attempt}.log"
            spec_path = self.work / "logs" / f"{tag}-{n_attempt}.spec.json"
            progress.write_text("")
            spec_path.write_text(json.dumps({
                **spec, "mode": "pipelines", "pipelines": remaining, "progress": str(progress),
                "caps": {n: self.caps[n] for n in remaining},
                "budget_deadline": self.budget.deadline}))
            attempt = self._attempt(python, spec_path, progress, log, env)
            attempt["pipelines"] = list(remaining)
            self.attempts.append(attempt)
            for name, res in attempt["results"].items():
                results[name] = res
                remaining.remove(name)
            current = attempt["current"]
            if current is not None and current in remaining:
                why = attempt["killed"] or f"its worker died (exit {attempt['returncode']})"
                results[current] = {"status": "cut" if attempt["killed"] else "failed",
                                    "reason": why, "log_tail": _tail(log)}
                remaining.remove(current)
            elif remaining and not attempt["results"]:
                why = attempt["killed"] or (f"its worker exited (exit {attempt['returncode']}) "
                                            f"before running it")
                for n in remaining:
                    results[n] = {"status": "failed", "reason": why, "log_tail": _tail(log)}
                remaining = []
        return results

    def _attempt(self, python, spec_path: Path, progress: Path, log: Path, env) -> dict:
        started = time.time()
        state = {"ready": None, "current": None, "current_t": None, "results": {},
                 "killed": None, "returncode": None, "log": str(log)}  # killed: why, or None
        offset = 0
        with open(log, "w", encoding="utf-8") as fh:
            proc = subprocess.Popen([python, str(self.script), "--worker", str(spec_path)],
                                    stdout=fh, stderr=subprocess.STDOUT, env=env or _env(),
                                    cwd=REPO, start_new_session=True)
            while True:
                rc = proc.poll()
                offset = self._read(progress, offset, state)
                if rc is not None:
                    break
                now, cur = time.time(), state["current"]
                if state["ready"] is None and now > started + self.caps["startup"]:
                    state["killed"] = (f"its worker did not get ready within the startup cap "
                                       f"({self.caps['startup']} s) and was killed")
                elif cur is not None and now > state["current_t"] + self.caps[cur] + GRACE_S:
                    state["killed"] = (f"its worker was killed {GRACE_S:.0f} s past the cap "
                                       f"({self.caps[cur]} s)")
                elif now > self.budget.deadline + GRACE_S:
                    state["killed"] = (f"its worker was killed {GRACE_S:.0f} s past the run's "
                                       f"budget ({self.budget.seconds:.0f} s)")
                if state["killed"]:
                    _kill_group(proc)
                    break
                time.sleep(0.2)
        self._read(progress, offset, state)
        state["returncode"] = proc.returncode
        state["seconds"] = round(time.time() - started, 2)
        return state

    @staticmethod
    def _read(progress: Path, offset: int, state: dict) -> int:
        try:
            with open(progress, encoding="utf-8") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except OSError:
            return offset
        complete = chunk[:chunk.rfind("\n") + 1]
        for line in complete.splitlines():
            event = json.loads(line)
            kind = event.pop("event")
            if kind == "ready":
                state["ready"] = event
            elif kind == "start":
                state["current"], state["current_t"] = event["pipeline"], time.time()
            elif kind == "result":
                state["results"][event.pop("pipeline")] = event
                state["current"] = None
        return offset + len(complete.encode("utf-8"))


def run_probe(work: Path, cap: float) -> dict:
    """The environment from a subprocess (this process never imports torch)."""
    progress = work / "logs" / "probe.jsonl"
    progress.write_text("")
    spec = work / "logs" / "probe.spec.json"
    spec.write_text(json.dumps({"mode": "probe", "progress": str(progress)}))
    log = work / "logs" / "probe.log"
    run = _run_capped([sys.executable, str(Path(__file__).resolve()), "--worker", str(spec)],
                      cap, log)
    lines = [json.loads(x) for x in progress.read_text().splitlines() if x.strip()]
    if not lines:
        how = "cut at its cap" if run["cut"] else f"exit {run['returncode']}"
        raise CannotRun(f"the environment probe gave nothing ({how}): {_tail(log, 3)}")
    env = lines[-1]
    env.pop("event", None)
    env["seconds"] = run["seconds"]
    return env


# ---------------------------------------------------------------------------------------------
# DALI: its venv

class DaliVenv:
    """The DALI venv: present (``python`` imports ``nvidia.dali``), built in the background
    (``--build-peers``), or absent with the reason."""

    def __init__(self, path: Path, work: Path):
        self.path = path
        self.python = path / "bin" / "python"
        self.work = work
        self.build: dict | None = None
        self._proc: subprocess.Popen | None = None
        self._deadline = 0.0

    def check(self, cap: float = 60.0) -> dict:
        """``{"ok": True, "dali", "python"}`` or ``{"ok": False, "reason"}``."""
        if not self.python.exists():
            return {"ok": False, "reason": f"no {self.python}"}
        code = ("import json, sys, nvidia.dali as d; print(json.dumps({'dali': d.__version__, "
                "'python': '%d.%d' % sys.version_info[:2]}))")
        try:
            res = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True,
                                 timeout=cap)
        except subprocess.TimeoutExpired:
            return {"ok": False, "reason": f"importing nvidia.dali took over {cap:.0f} s"}
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["?"])[-1]
            return {"ok": False, "reason": f"{self.python} cannot import nvidia.dali ({last})"}
        info = json.loads(res.stdout.strip().splitlines()[-1])
        mine = "%d.%d" % sys.version_info[:2]
        if info["python"] != mine:
            return {"ok": False, "reason": f"the DALI venv has Python {info['python']}, this "
                                           f"run {mine}: the project's packages cannot be shared "
                                           f"with it; rebuild it with this Python"}
        return {"ok": True, **info}

    def start_build(self, cap: float) -> None:
        """``benchmarks/peers/make_venv.sh dali DIR`` in the background (pip fails fast when no
        registry is reachable: one retry, 15 s timeout)."""
        env = {**os.environ, "PIP_DEFAULT_TIMEOUT": "15", "PIP_RETRIES": "1"}
        log = self.work / "logs" / "dali-venv-build.log"
        self._fh = open(log, "w", encoding="utf-8")
        self._proc = subprocess.Popen(["bash", str(PEERS / "make_venv.sh"), "dali",
                                       str(self.path)], stdout=self._fh,
                                      stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                      start_new_session=True)
        self._t0 = time.time()
        self._deadline = self._t0 + cap
        self.build = {"status": "running", "command": f"benchmarks/peers/make_venv.sh dali "
                                                      f"{self.path}", "log": str(log)}

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def finish_build(self, wait_until: float) -> None:
        """Waits for the background build until ``wait_until`` (and its own cap), then
        records it (killed when still running)."""
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=max(0.0, min(wait_until, self._deadline) - time.time()))
            rc = self._proc.returncode
            self.build.update(status="ok" if rc == 0 else "failed", returncode=rc)
            if rc != 0:
                self.build["reason"] = "make_venv.sh failed (no package registry reachable?)"
        except subprocess.TimeoutExpired:
            _kill_group(self._proc)
            self.build.update(status="cut", reason="the DALI venv build did not finish in time")
        self._fh.close()
        self.build["seconds"] = round(time.time() - self._t0, 1)
        if self.build["status"] != "ok":
            self.build["log_tail"] = _tail(Path(self.build["log"]), 5)
        self._proc = None


def _project_paths() -> list[str]:
    """This interpreter's site-packages (torch, timm, ...), appended to the DALI worker's path."""
    import site
    import sysconfig

    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        paths += site.getsitepackages()
    except AttributeError:
        pass
    paths += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    seen: list[str] = []
    for p in paths:
        if p and p not in seen and Path(p).is_dir():
            seen.append(p)
    return seen


# ---------------------------------------------------------------------------------------------
# the report

def verdict(doc: dict) -> dict:
    """The goal's verdict over the shardkit pipelines (b)-(d) with numbers, against (a).

    ``met`` is True when one of them reaches ``GOAL_RATIO`` x the img/s of (a) with a data-wait
    fraction under ``GOAL_WAIT`` (``best``: the fastest such one), False when none does
    (``best``: the fastest), None for a dry run or when (a) or every shardkit pipeline lacks
    numbers. Returns ``{"goal", "met", "best", "ratio", "data_wait_fraction", "line"}``."""
    pipes = doc["pipelines"]
    goal = f">= {GOAL_RATIO}x of (a) with data-wait < {GOAL_WAIT:.0%}"
    base = pipes.get("synthetic", {}).get("img_per_s")
    cands = sorted(((p["img_per_s"], n) for n, p in pipes.items()
                    if n in SHARDKIT_PIPELINES and p.get("img_per_s")), reverse=True)
    out: dict = {"goal": goal, "met": None, "best": None}
    tests = doc["phases"].get("tests", {})
    tests_note = ("" if tests.get("status") == "ok" else
                  f"; GPU tests: {tests.get('status')} ({tests.get('reason', '')})")
    if cands:
        ok = [n for v, n in cands if base and v / base >= GOAL_RATIO
              and pipes[n]["data_wait_fraction"] < GOAL_WAIT]
        best = ok[0] if ok else cands[0][1]
        out.update(best=best, data_wait_fraction=pipes[best]["data_wait_fraction"])
        if base:
            out.update(ratio=round(pipes[best]["img_per_s"] / base, 3), met=bool(ok))
    if doc["dry_run"]:
        out["met"] = None
        out["line"] = ("verdict: none (dry run on the CPU with tiny sizes: the numbers only show "
                       "that every step ran)" + tests_note)
        return out
    if not base or not cands:
        out["met"] = None
        out["line"] = ("verdict: none: " + ("(a) has no numbers" if not base else
                                            "no shardkit pipeline has numbers") + tests_note)
        return out
    out["line"] = (f"verdict: goal {'MET' if out['met'] else 'NOT MET'}: "
                   f"{'' if out['met'] else 'fastest '}shardkit pipeline {PIPELINES[out['best']]}"
                   f" at {out['ratio']:.3f}x of (a), data-wait {out['data_wait_fraction']:.1%} "
                   f"(goal: {goal})" + tests_note)
    return out


def format_table(doc: dict) -> str:
    """The human-readable report: environment, phases, one row per pipeline, the verdict."""
    lines = []
    env = doc.get("environment", {})
    e = env.get("environment", {})
    gpu = env.get("gpu", {}).get("name") or "no GPU (CPU stands in)"
    torch_v = e.get("torch", {}).get("version") or env.get("torch", {}).get("version", "?")
    cuda_v = e.get("torch", {}).get("cuda") or env.get("torch", {}).get("cuda")
    lines.append("shardkit GPU check" + ("  [DRY RUN on the CPU: tiny sizes, not a measurement]"
                                         if doc["dry_run"] else ""))
    lines.append(f"environment: {gpu} | torch {torch_v} (CUDA {cuda_v}) | "
                 f"{env.get('cpu_cores_usable', '?')} CPU cores | python {env.get('python')} | "
                 f"model {doc['config']['model']} {doc['config']['amp'] or 'fp32'} "
                 f"{doc['config']['image_size']} px, batch {doc['config']['batch_size']}, "
                 f"{doc['config']['warmup']} warm-up + {doc['config']['steps']} timed steps")
    ph = doc["phases"]
    t = ph.get("tests", {})
    g = ph.get("generate", {})
    p = ph.get("pack", {})
    counts = (f" ({t.get('passed')} passed, {t.get('failed')} failed, {t.get('skipped')} "
              f"skipped, {t.get('errors')} errors) {t.get('seconds', 0):.1f} s"
              if t.get("passed") is not None else "")
    lines.append(f"gpu tests: {t.get('status')}{counts}"
                 + (f" - {t['reason']}" if t.get("reason") else "")
                 + (f"; failed: {', '.join(t['failures'][:5])}" if t.get("failures") else ""))
    lines.append(f"generate: {g.get('status')} {g.get('images')} JPEGs in {g.get('classes')} "
                 f"classes, {g.get('mean_kb')} KB mean, {g.get('seconds')} s"
                 + (" (reused)" if g.get("reused") else "")
                 + (f" - {g['reason']}" if g.get("reason") else ""))
    lines.append(f"pack: {p.get('status')} {p.get('samples')} samples, {p.get('shards')} shards, "
                 f"{p.get('seconds')} s ({p.get('images_per_s')} img/s)"
                 + (" (reused)" if p.get("reused") else "")
                 + (f" - {p['reason']}" if p.get("reason") else ""))
    header = (f"{'pipeline':30} {'status':8} {'img/s':>9} {'wait':>7} {'vs (a)':>7}  "
              f"decoder | augment")
    lines += ["", header, "-" * len(header)]
    for name, label in PIPELINES.items():
        r = doc["pipelines"].get(name, {})
        if r.get("img_per_s"):
            ratio = r.get("ratio_to_synthetic")
            lines.append(f"{label:30} {r['status']:8} {r['img_per_s']:9.1f} "
                         f"{r['data_wait_fraction']:7.3f} "
                         f"{(f'{ratio:.3f}' if ratio is not None else '-'):>7}  "
                         f"{r.get('decoder', '')} | {r.get('augment', '')}")
        else:
            lines.append(f"{label:30} {r.get('status', 'not run'):8} {'-':>9} {'-':>7} {'-':>7}  "
                         f"({r.get('reason', '')})")
        if r.get("img_per_s") and r.get("reason"):
            lines.append(f"{'':30} ({r['reason']})")
    lines += ["", doc["verdict"]["line"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="every phase on the CPU with tiny sizes (no GPU needed)")
    p.add_argument("--out", help="JSON result file (default benchmarks/results/gpu_check.json; "
                                 "--dry-run: bench-results/gpu_check_dry.json)")
    p.add_argument("--work", help="scratch folder for the images, the pack and the logs "
                                  "(default /tmp/shardkit-gpu-check[-dry])")
    p.add_argument("--fresh", action="store_true", help="regenerate and repack even when --work "
                                                       "holds the same set")
    for key, kind in (("images", int), ("classes", int), ("image_size", int),
                      ("batch_size", int), ("warmup", int), ("steps", int), ("model", str)):
        p.add_argument("--" + key.replace("_", "-"), type=kind,
                       help=f"default {FULL[key]} ({DRY[key]} with --dry-run)")
    p.add_argument("--threads", type=int, help="decoding threads and pack workers (default: the "
                                               "usable CPU cores)")
    p.add_argument("--augment", default="standard", help="make_loader augment preset")
    p.add_argument("--amp", default="bf16", choices=["bf16", "none"])
    p.add_argument("--pipelines", default=",".join(PIPELINES),
                   help=f"comma list of {', '.join(PIPELINES)}")
    p.add_argument("--tests", default="tests", help="what `pytest -m gpu` collects")
    p.add_argument("--no-tests", action="store_true", help="leave phase 1 out (recorded)")
    p.add_argument("--budget", type=float, default=470.0,
                   help="seconds for the whole run (default 470: under 8 minutes)")
    p.add_argument("--cap", action="append", default=[], metavar="PHASE=SECONDS",
                   help=f"a phase's time cap; phases and defaults: "
                        f"{', '.join(f'{k}={v}' for k, v in CAPS.items())}")
    p.add_argument("--dali-venv", default=os.environ.get("DALI_VENV", "/tmp/dali-venv"),
                   help="DALI's venv (default $DALI_VENV or /tmp/dali-venv)")
    p.add_argument("--build-peers", action="store_true",
                   help="build the DALI venv (benchmarks/peers/make_venv.sh dali) when absent, "
                        "in the background while phases 1-3 run")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    sizes = DRY if args.dry_run else FULL
    for key, default in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    for key in ("images", "classes", "image_size", "batch_size", "steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    args.classes = min(args.classes, args.images)
    args.threads = args.threads or _cores()
    args.pipelines = [x.strip() for x in args.pipelines.split(",") if x.strip()]
    unknown = [x for x in args.pipelines if x not in PIPELINES]
    if unknown:
        p.error(f"--pipelines: unknown {unknown}; choose from {list(PIPELINES)}")
    caps = dict(CAPS)
    for item in args.cap:
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if name not in caps or not seconds > 0:
            p.error(f"--cap {item!r}: expected PHASE=SECONDS with a phase of {list(caps)} and "
                    f"seconds > 0")
        caps[name] = seconds
    args.caps = caps
    if args.out is None:
        args.out = str(REPO / ("bench-results/gpu_check_dry.json" if args.dry_run
                               else "benchmarks/results/gpu_check.json"))
    if args.work is None:
        args.work = "/tmp/shardkit-gpu-check" + ("-dry" if args.dry_run else "")
    return args


def _same(marker: Path, want: dict) -> bool:
    try:
        return json.loads(marker.read_text()).get("params") == want
    except (OSError, ValueError, AttributeError):
        return False


def _count_jpegs(src: Path) -> int:
    try:
        return sum(1 for d in src.iterdir() if d.is_dir()
                   for f in os.scandir(d) if f.name.endswith(".jpg"))
    except OSError:
        return 0


def _guarded(phase: str, fn, *args) -> dict:
    """``fn(*args)``, or ``{"status": "failed", "reason", "traceback_tail"}`` when it raises:
    a phase's unexpected error is recorded and the run goes on."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON, the next phase still runs
        return {"status": "failed", "reason": f"{phase}: {type(exc).__name__}: {exc}",
                "traceback_tail": traceback.format_exc().splitlines()[-8:]}


def run(args) -> dict:
    """The whole check (phases 0-5 of the module docstring); returns the JSON document."""
    budget = Budget(args.budget)
    work = Path(args.work).resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    caps = args.caps
    doc: dict = {"schema": "shardkit-gpu-check/1", "dry_run": args.dry_run,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                 "config": {k: getattr(args, k) for k in (
                     "images", "classes", "image_size", "batch_size", "warmup", "steps",
                     "model", "threads", "augment", "budget", "pipelines")},
                 "caps_s": caps, "phases": {}, "pipelines": {}}
    doc["config"]["amp"] = None if args.amp == "none" else args.amp

    # 0. environment (and: is there a GPU?)
    env = run_probe(work, budget.allowed(caps["probe"]))
    doc["environment"] = env
    if "torch_error" in env:
        raise CannotRun(f"torch cannot be imported by {sys.executable}: {env['torch_error']}")
    if not args.dry_run and not env.get("cuda_available"):
        raise CannotRun("no CUDA device (torch.cuda.is_available() is False); on a CPU-only "
                        "machine run `scripts/gpu_check.py --dry-run`")
    device = "cpu" if args.dry_run else "cuda"

    dali = DaliVenv(Path(args.dali_venv), work)
    if "dali" in args.pipelines and args.build_peers and not dali.check()["ok"]:
        dali.start_build(caps["dali_build"])

    # 1. the gpu-marked tests
    if args.no_tests:
        doc["phases"]["tests"] = _not_run("--no-tests")
    elif budget.left() < MIN_PHASE_S:
        doc["phases"]["tests"] = _not_run("the run's budget was spent")
    else:
        doc["phases"]["tests"] = _guarded("tests", run_gpu_tests, work,
                                          budget.allowed(caps["tests"]), args.tests)

    # 2. generate (or reuse) the JPEG set
    src, packed = work / "src", work / "packed"
    want = {"images": args.images, "classes": args.classes, "synth": SYNTH_VERSION}
    if not args.fresh and _same(work / "src.json", want) and _count_jpegs(src) == args.images:
        gen = {**json.loads((work / "src.json").read_text())["result"], "reused": True}
    elif budget.left() < MIN_PHASE_S:
        gen = _not_run("the run's budget was spent")
    else:
        (work / "src.json").unlink(missing_ok=True)
        (work / "packed.json").unlink(missing_ok=True)
        gen = _guarded("generate", generate, src, args.images, args.classes, args.threads,
                       budget.allowed(caps["generate"]))
        if gen["status"] == "ok":
            (work / "src.json").write_text(json.dumps({"params": want, "result": gen}))
    doc["phases"]["generate"] = gen

    # 3. pack (or reuse)
    want_pack = {**want, "format": "wds"}
    if gen.get("status") != "ok":
        pk = _not_run(f"generate: {gen.get('status')}" + (" (the shardkit pipelines need the "
                                                          "whole set)"))
    elif not args.fresh and _same(work / "packed.json", want_pack) and \
            (packed / "manifest.json").is_file():
        pk = {**json.loads((work / "packed.json").read_text())["result"], "reused": True}
    elif budget.left() < MIN_PHASE_S:
        pk = _not_run("the run's budget was spent")
    else:
        pk = _guarded("pack", pack, src, packed, args.threads, budget.allowed(caps["pack"]),
                      work / "logs" / "pack.log")
        if pk["status"] == "ok":
            (work / "packed.json").write_text(json.dumps({"params": want_pack, "result": pk}))
    doc["phases"]["pack"] = pk
    doc["notes"] = ["the JPEGs and shards were written just before the pipelines ran: reads "
                    "come from the page cache (as for a dataset that fits in RAM), not a disk"]
    if dali.running():
        doc["notes"].append("the DALI venv build was still running when the pipelines started "
                            "(pip competed for a core)")

    # 4. the pipelines
    workers = Workers(work, budget, caps)
    spec = {"device": device, "model": args.model, "amp": doc["config"]["amp"],
            "num_classes": args.classes, "batch_size": args.batch_size,
            "image_size": args.image_size, "warmup": args.warmup, "steps": args.steps,
            "threads": args.threads, "augment": args.augment, "data": str(packed),
            "src": str(src)}
    mine = [n for n in args.pipelines if n != "dali"]
    need_pack = [n for n in mine if n in SHARDKIT_PIPELINES]
    if pk.get("status") != "ok":
        for n in need_pack:
            doc["pipelines"][n] = _not_run(f"pack: {pk.get('status')}")
        mine = [n for n in mine if n not in need_pack]
    if mine:
        res = _guarded("pipelines", workers.run, sys.executable, mine, spec, "worker")
        if "status" in res:  # Workers.run itself raised: that failure for each of them
            res = {n: res for n in mine}
        doc["pipelines"].update(res)
    if "dali" in args.pipelines:
        doc["pipelines"]["dali"] = _guarded("dali", _dali_phase, dali, workers, spec, gen,
                                            budget)
        if dali.build is not None:
            doc["phases"]["dali_venv_build"] = dali.build
    for name in PIPELINES:
        doc["pipelines"].setdefault(name, _not_run("not in --pipelines"))
    doc["pipelines"] = {name: doc["pipelines"][name] for name in PIPELINES}
    doc["workers"] = workers.attempts
    base = doc["pipelines"].get("synthetic", {}).get("img_per_s")
    for res in doc["pipelines"].values():
        if base and res.get("img_per_s"):
            res["ratio_to_synthetic"] = round(res["img_per_s"] / base, 3)
    doc["verdict"] = verdict(doc)
    doc["total_seconds"] = round(time.time() - budget.start, 1)
    return doc


def _dali_phase(dali: DaliVenv, workers: Workers, spec: dict, gen: dict,
                budget: Budget) -> dict:
    """(e): waits for a background venv build, checks the venv, runs the DALI worker."""
    if dali.running():
        dali.finish_build(budget.deadline - MIN_PHASE_S)
    else:
        dali.finish_build(time.time())
    check = dali.check()
    if not check["ok"]:
        built = dali.build
        if built is not None and built["status"] != "ok":
            last = (built.get("log_tail") or "").splitlines()[-1:]
            return _not_run(f"venv build {built['status']}: {built.get('reason')}"
                            + (f" (last line: {last[0]})" if last else ""))
        if built is None:
            return _not_run(f"venv absent: run benchmarks/peers/make_venv.sh dali "
                            f"{dali.path} (or pass --build-peers); {check['reason']}")
        return _not_run(check["reason"])
    if gen.get("status") != "ok":
        return _not_run(f"generate: {gen.get('status')}")
    res = workers.run(str(dali.python), ["dali"], {**spec, "extra_path": _project_paths()},
                      "dali")
    res["dali"].setdefault("dali_version", check.get("dali"))
    return res["dali"]


def main(argv: list[str] | None = None) -> int:
    """Runs the check; prints the table; returns the exit status (see the module docstring)."""
    args = parse_args(argv)
    if args.worker:
        return _worker_main(args.worker)
    try:
        doc = run(args)
    except CannotRun as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, out)
    print(format_table(doc))
    print(f"\nJSON: {out} ({doc['total_seconds']} s in all)")
    pipes = doc["pipelines"]
    shardkit_numbers = all(pipes.get(n, {}).get("img_per_s") for n in args.pipelines
                           if n != "dali")
    tests_ok = doc["phases"]["tests"].get("status") in ("ok", "not run")
    if args.dry_run:
        return 0 if shardkit_numbers and tests_ok else 1
    return 0 if doc["verdict"]["met"] and shardkit_numbers and tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
