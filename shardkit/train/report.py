"""What a person reads during and after ``shardkit train``: the CPU estimate, a line per epoch
(with the validation scores when the epoch was evaluated, as timm's ``train.py`` prints them),
and the final summary saying which epoch is best, which is last, and which weights the test
split scored.

The lines are plain text with no trailing newline; the trainer hands them to its ``report``
callable (the command prints them on stderr, rank 0 only). Scores are fractions in metrics.json
and percentages here (top-1 / top-5), as timm prints them; macro-F1 stays on the 0-1 scale.
"""
from __future__ import annotations

import copy
import math
import time
from contextlib import nullcontext

import torch

__all__ = ["format_duration", "epoch_line", "test_line", "final_lines", "summary",
           "planned_work", "time_train_step", "estimate_line", "estimate_for", "SMOKE_FLAGS",
           "SMOKE_HINT_S"]

SMOKE_FLAGS = "--max-steps 20 --image-size 64 --batch-size 8 (or --config cpu-smoke)"
"""The flags of a smoke run, suggested by the CPU estimate."""
SMOKE_HINT_S = 600
"""The CPU estimate suggests a smoke run when the run would take longer than this (seconds)."""


def format_duration(seconds: float) -> str:
    """``"2 h 35 min"``, ``"4 min 10 s"``, ``"12 s"`` (rounded; ``"< 1 s"`` below a second)."""
    if seconds < 1:
        return "< 1 s"
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60} min"


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _scores(result: dict) -> str:
    """``top-1 62.5%, top-5 97.5%, macro-F1 0.611, loss 1.021`` (top-5 only where the result
    has it: more than 5 classes)."""
    parts = [f"top-1 {_pct(result.get('top1'))}"]
    if "top5" in result:
        parts.append(f"top-5 {_pct(result['top5'])}")
    parts += [f"macro-F1 {_num(result.get('macro_f1'))}", f"loss {_num(result.get('loss'))}"]
    return ", ".join(parts)


def _where(entry: dict) -> str:
    return f"step {entry['step']}" + (", partial" if entry.get("partial") else "")


def epoch_line(entry: dict, monitor: str, new_best: bool = False) -> str:
    """One line for a history entry (see metrics.json ``history``): the epoch (0-based, as the
    ``eval/val_epochNNN`` files), the step, the val scores when it was evaluated, the train
    loss, img/s and data-wait fraction, and ``new best <monitor>`` when it improved."""
    train = entry["train"]
    head = f"epoch {entry['epoch']} ({_where(entry)})"
    parts = [f"val {_scores(entry['val'])}"] if "val" in entry else []
    img_s = train.get("images_per_s")
    parts.append(f"train loss {_num(train.get('loss'))}, "
                 f"{'n/a' if img_s is None else f'{img_s:.1f}'} img/s, "
                 f"data wait {_pct(train.get('data_wait_fraction'))}")
    if new_best:
        parts.append(f"new best {monitor}")
    return f"{head}: " + " | ".join(parts)


def test_line(result: dict) -> str:
    """``test (45 images, best.pt of epoch 3): top-1 ...`` for the final test result (its
    ``weights`` says which checkpoint scored)."""
    weights = result.get("weights") or {}
    which = (f"{weights.get('checkpoint')}.pt of epoch {weights.get('epoch')}"
             if weights else "final weights")
    return f"{result.get('split', 'test')} ({result.get('num_samples')} images, {which}): " \
           f"{_scores(result)}"


def summary(metrics: dict) -> dict:
    """The JSON summary ``shardkit train`` prints on stdout: ``step``, ``stopped``, ``best``
    (``{monitor, value, epoch, step}`` or None: the epoch whose weights are best.pt), ``last``
    (``{epoch, step, partial, val}``: the final epoch, ``val`` its scores or None when it was
    not evaluated), ``test`` (scores and ``weights``: which checkpoint of which epoch scored)
    and ``last_train`` (the final epoch's train stats)."""
    out = {"step": metrics["step"], "stopped": metrics["stopped"], "best": metrics["best"]}
    history = metrics["history"]
    if history:
        last = history[-1]
        val = last.get("val")
        out["last"] = {"epoch": last["epoch"], "step": last["step"],
                       "partial": last.get("partial", False),
                       "val": None if val is None else {k: val[k] for k in
                                                        ("top1", "top5", "macro_f1", "loss")
                                                        if k in val}}
    if "test" in metrics:
        out["test"] = {k: metrics["test"].get(k) for k in ("top1", "top5", "macro_f1", "loss",
                                                            "weights") if k in metrics["test"]}
    if history:
        out["last_train"] = history[-1]["train"]
    return out


def final_lines(metrics: dict, monitor: str) -> list[str]:
    """The closing lines: how the run ended, the best epoch (by ``monitor``), the last epoch
    and its scores, and the test result with the weights that scored it."""
    lines = [f"done: {metrics['stopped']} after {metrics['step']} steps"]
    best = metrics.get("best")
    if best is not None:
        lines.append(f"best: epoch {best['epoch']} (step {best['step']}) by {best['monitor']} "
                     f"{_num(best['value'], 4)}: checkpoints/best.pt")
    else:
        lines.append(f"best: none (no val split scored by {monitor}, so no best.pt)")
    history = metrics.get("history") or []
    if history:
        last = history[-1]
        val = last.get("val")
        scored = f": val {_scores(val)}" if val else " (not evaluated)"
        lines.append(f"last: epoch {last['epoch']} ({_where(last)}){scored}: "
                     "checkpoints/last.pt")
    if "test" in metrics:
        lines.append(test_line(metrics["test"]))
    return lines


def planned_work(epochs: int, steps_per_epoch: int, max_steps: int | None, step: int,
                 start_epoch: int, eval_every: int, has_val: bool) -> tuple[int, int]:
    """``(steps left, val evaluations left)`` of a run at ``step`` that starts (or resumes)
    at epoch ``start_epoch``: the schedule's ``epochs * steps_per_epoch`` cut to ``max_steps``;
    an evaluation every ``eval_every`` epochs and after the last one (when ``has_val``)."""
    total = epochs * steps_per_epoch
    if max_steps:
        total = min(total, max_steps)
    if steps_per_epoch < 1 or total <= step:
        return 0, 0
    last_epoch = math.ceil(total / steps_per_epoch) - 1
    evals = sum(1 for e in range(start_epoch, last_epoch + 1)
                if (e + 1) % eval_every == 0 or e == last_epoch) if has_val else 0
    return total - step, evals


def time_train_step(model: torch.nn.Module, batch_size: int, image_size: int,
                    channels_last: bool = False, amp_dtype=None, sample: int = 4) -> float:
    """Seconds of one CPU training step of ``batch_size`` images (forward and backward), timed
    on a copy of ``model`` with ``min(batch_size, sample)`` (at least 2) zero images of
    ``image_size`` and scaled linearly: after one untimed warm-up step (a first call allocates
    and picks its kernels: several times a step's time), the faster of two timed steps.
    ``model``, its BatchNorm statistics and the global RNGs are left as they were."""
    n = max(2, min(batch_size, sample))
    twin = copy.deepcopy(model).train()
    x = torch.zeros(n, 3, image_size, image_size)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    autocast = torch.autocast("cpu", dtype=amp_dtype) if amp_dtype else nullcontext()
    times = []
    with torch.random.fork_rng(devices=[]):
        for _ in range(3):  # the first is the warm-up
            start = time.perf_counter()
            with autocast:
                logits = twin(x)
            logits.float().logsumexp(dim=1).mean().backward()
            times.append(time.perf_counter() - start)
    return min(times[1:]) * batch_size / n


def estimate_line(steps: int, step_seconds: float, batch_size: int, image_size: int,
                  evals: int, val_images: int, test_images: int) -> str:
    """The CPU estimate: ``steps`` of ``step_seconds``, plus the evaluations (a forward pass,
    counted at a third of a step's time per image), and the smoke-run flags when the run would
    take over :data:`SMOKE_HINT_S`."""
    per_image = step_seconds / batch_size / 3
    eval_seconds = (evals * val_images + test_images) * per_image
    total = steps * step_seconds + eval_seconds
    work = f"{steps} steps of {batch_size} images at {image_size} px"
    if evals:
        work += f", {evals} evaluation{'s' if evals != 1 else ''} of {val_images} val images"
    if test_images:
        work += f", 1 test of {test_images} images"
    line = (f"CPU run: {work}: about {format_duration(total)} (an estimate: "
            f"{step_seconds:.2f} s a step, timed on a few images before training; data loading "
            f"not counted)")
    return line + (f". A smoke run: {SMOKE_FLAGS}" if total > SMOKE_HINT_S else "")


def estimate_for(config, model: torch.nn.Module, amp_dtype, steps_per_epoch: int, step: int,
                 start_epoch: int, splits: dict, val_split: str | None,
                 test_split: str | None) -> str | None:
    """:func:`estimate_line` of a run (``config`` a TrainConfig, ``splits`` the manifest's) at
    ``step``, starting at ``start_epoch``, with its step timed on ``model``
    (:func:`time_train_step`); None when no step is left."""
    steps, evals = planned_work(config.epochs, steps_per_epoch, config.max_steps, step,
                                start_epoch, config.eval_every, val_split is not None)
    if steps <= 0:
        return None
    seconds = time_train_step(model, config.batch_size, config.image_size,
                              config.channels_last, amp_dtype)
    return estimate_line(steps, seconds, config.batch_size, config.image_size, evals,
                         splits[val_split]["num_samples"] if val_split else 0,
                         splits[test_split]["num_samples"] if test_split else 0)
