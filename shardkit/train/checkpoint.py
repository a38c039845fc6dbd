"""Training checkpoints: written atomically, read back for ``--resume`` and the final test.

A checkpoint is a ``torch.save`` dict::

    {"format": "shardkit-train-checkpoint", "version": 2, "digest": int,
     "model": state_dict (unwrapped: no DDP / torch.compile prefixes), "optimizer", "scheduler",
     "scaler": GradScaler state or None, "epoch": int (0-based epoch of the last step),
     "epoch_done": bool, "epoch_batches": int (batches of that epoch done), "step": int (optimizer
     steps so far), "loader": train loader state or None,
     "config": TrainConfig dict, "classes": [str], "best": {"monitor", "value", "epoch", "step"}
     or None, "bad_evals": int, "history": [metrics.json history entries], "rng": {python, numpy,
     torch, cuda}}

Only tensors, numbers, strings, ``None`` and lists / tuples / dicts of them, so every checkpoint
loads with ``torch.load(..., weights_only=True)``: the RNG states are stored as tensors and plain
lists (:func:`rng_state`), never as numpy arrays or other pickled objects. Loading never uses
``weights_only=False``: a file whose pickle names any other global (``os.system``, a class with a
``__reduce__``, a numpy array) is refused with :class:`~shardkit.errors.CheckpointError` before
anything in it runs (:func:`safe_load`). Written with :func:`shardkit.storage.atomic.atomic_write_with`
(temporary file, fsync, rename, folder fsync).

``digest`` (version 2) is the xxh3-64 of every value of the payload, tensors' bytes included
(:func:`payload_digest`): ``torch.load`` checks no checksum of tensor data, so bytes flipped on
disk or in a copy would otherwise resume silently with wrong weights or optimizer moments
(the rule of a shard's per-read checks: a damaged byte is an error, never a silent wrong
result). Version 1 files (no digest) still load, with a warning.
"""
from __future__ import annotations

import logging
import pickle
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch
import xxhash

from ..errors import CheckpointError, ConfigError, OutputExistsError, ResumeMismatchError
from ..validate import is_int
from shardkit.storage.atomic import atomic_write_with
from .config import SCHEDULE_FIELDS, TrainConfig

__all__ = ["save_checkpoint", "load_checkpoint", "safe_load", "resolve_resume",
           "check_resume_config", "check_resume_classes", "rng_state", "set_rng_state",
           "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "check_run_folder", "payload_digest",
           "check_digest", "RESUME_FIELDS", "load_parts"]

CHECKPOINT_FORMAT = "shardkit-train-checkpoint"
log = logging.getLogger(__name__)


def rng_state() -> dict:
    """The python / numpy / torch (and CUDA, when initialised) global RNG states, as plain data
    that loads with ``weights_only=True``: ``python`` ``[version, [625 ints], gauss_next]``,
    ``numpy`` ``{"key": [624 ints], "pos", "has_gauss", "gauss"}`` (the legacy MT19937 state of
    ``np.random``), ``torch`` uint8 tensor, ``cuda`` list of uint8 tensors (one per device)."""
    version, internal, gauss_next = random.getstate()
    _, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state = {"python": [version, list(internal), gauss_next],
             "numpy": {"key": key.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                       "gauss": float(gauss)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restores the global RNG states saved by :func:`rng_state`."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    numpy = state["numpy"]
    np.random.set_state(("MT19937", np.asarray(numpy["key"], dtype=np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


CHECKPOINT_VERSION = 2


def payload_digest(payload: dict) -> int:
    """xxh3-64 (unsigned 64-bit int) of ``payload`` without its ``digest`` key: every key and
    leaf in order, a tensor as its dtype, shape and raw bytes, any other leaf as its ``repr``
    (numbers, strings, None). Equal for a payload and its ``torch.load`` round trip."""
    h = xxhash.xxh3_64()

    def walk(value) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(value, dict):
            h.update(f"D{len(value)}".encode())
            for k, v in value.items():
                h.update(repr(k).encode())
                walk(v)
        elif isinstance(value, (list, tuple)):
            h.update(f"L{len(value)}".encode())
            for v in value:
                walk(v)
        else:
            h.update(repr(value).encode())

    walk({k: v for k, v in payload.items() if k != "digest"})
    return h.intdigest()


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Writes ``payload`` (see the module docstring) to ``path`` atomically (temporary file,
    fsync, rename, folder fsync; :func:`shardkit.storage.atomic.atomic_write_with`), with its
    :func:`payload_digest` as ``digest``."""
    obj = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **payload}
    obj["digest"] = payload_digest(obj)
    atomic_write_with(path, lambda f: torch.save(obj, f))


def safe_load(path: str | Path, what: str = "checkpoint"):
    """``torch.load(path, map_location="cpu", weights_only=True)``: tensors, numbers, strings,
    ``None`` and containers of them; nothing in the file is executed.

    Raises:
        CheckpointError: ``path`` is missing; its pickle names a global outside torch's
            weights-only allow-list (code that would run on load, or a non-tensor object such as
            a numpy array or ``argparse.Namespace``); or it is not a readable torch file. One
            line naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} {path} does not exist")
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before failing
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        detail = (f"its pickle names {found.group(1)}" if found else
                  (re.search(r"Unsupported[^\n.]*", str(e)) or [type(e).__name__])[0])
        if found is None:  # no global named: bytes the unpickler cannot parse
            raise CheckpointError(f"{what} {path} is damaged (its pickle does not parse: "
                                  f"{detail}) and was not loaded; resume from another "
                                  "checkpoint (best.pt) or start over") from None
        raise CheckpointError(f"{what} {path} is not a plain-tensor checkpoint and was not "
                              f"loaded ({detail}): only tensors, numbers, strings and "
                              "lists/dicts of them are accepted; save a state_dict, or use "
                              ".safetensors") from None
    except (RuntimeError, OSError, EOFError, ValueError, KeyError) as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read {what} {path}: not a torch checkpoint "
                              f"({type(e).__name__}: {detail[:160]})") from None


def _optional_dict(value) -> bool:
    return value is None or isinstance(value, dict)


RESUME_FIELDS = {
    "model": ("a state_dict (dict of tensors)", lambda v: isinstance(v, dict) and bool(v)
              and all(isinstance(t, torch.Tensor) for t in v.values())),
    "optimizer": ("an optimizer state_dict (dict)", lambda v: isinstance(v, dict)),
    "scheduler": ("a scheduler state_dict (dict)", lambda v: isinstance(v, dict)),
    "scaler": ("a GradScaler state_dict or None", _optional_dict),
    "epoch": ("an int >= 0", lambda v: is_int(v) and v >= 0),
    "epoch_done": ("a bool", lambda v: isinstance(v, bool)),
    "epoch_batches": ("an int >= 0", lambda v: is_int(v) and v >= 0),
    "step": ("an int >= 0", lambda v: is_int(v) and v >= 0),
    "loader": ("a loader state (dict) or None", _optional_dict),
    "config": ("the run's TrainConfig (dict)", lambda v: isinstance(v, dict)),
    "classes": ("a list of class names (str)", lambda v: isinstance(v, (list, tuple)) and bool(v)
                and all(isinstance(c, str) for c in v)),
    "best": ("a dict with monitor/value/epoch/step, or None",
             lambda v: v is None or (isinstance(v, dict)
                                     and {"monitor", "value", "epoch", "step"} <= set(v))),
    "bad_evals": ("an int >= 0", lambda v: is_int(v) and v >= 0),
    "history": ("a list of metrics entries", lambda v: isinstance(v, (list, tuple))),
    "rng": ("RNG states with python, numpy and torch", lambda v: isinstance(v, dict)
            and {"python", "numpy", "torch"} <= set(v)),
}
"""The fields ``--resume`` reads from a training checkpoint: name -> (what is expected, test).
Every one is checked before any is used, so a malformed file is one error naming them all."""


def load_checkpoint(path: str | Path, fields: tuple[str, ...] = ()) -> dict:
    """Reads a shardkit training checkpoint onto the CPU, safely (:func:`safe_load`), and checks
    that it holds ``fields`` (names of :data:`RESUME_FIELDS`; the final test reads only
    ``model``, ``--resume`` reads every one) with the expected types.

    Raises:
        CheckpointError: ``path`` is missing, unsafe or unreadable (see :func:`safe_load`), is
            not a shardkit training checkpoint, fails its ``digest`` (bytes changed since it
            was written), or lacks a field or holds one of the wrong type (one line naming
            every such field and what was expected).
    """
    payload = safe_load(path)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a shardkit training checkpoint (no "
                              f"format={CHECKPOINT_FORMAT!r}); use --pretrained for plain weights")
    problems = []
    for name in fields:
        expected, ok = RESUME_FIELDS[name]
        if name not in payload:
            problems.append(f"no {name!r} ({expected})")
        elif not ok(payload[name]):
            problems.append(f"{name!r} is {type(payload[name]).__name__}, expected {expected}")
    if problems:
        raise CheckpointError(f"checkpoint {path} is damaged or incomplete: "
                              + "; ".join(problems))
    check_digest(path, payload)
    return payload


def check_digest(path: str | Path, payload: dict) -> None:
    """Checks ``payload["digest"]`` against :func:`payload_digest`; a version-1 checkpoint (no
    digest) passes with a warning.

    Raises:
        CheckpointError: no digest in a version >= 2 file, or a digest that does not match.
    """
    if payload.get("version") == 1 and "digest" not in payload:
        log.warning("checkpoint %s was written before checkpoints carried a digest: its tensors "
                    "cannot be checked", path)
        return
    saved = payload.get("digest")
    if not is_int(saved):
        raise CheckpointError(f"checkpoint {path} has no digest (version "
                              f"{payload.get('version')!r}): it cannot be checked; it is damaged "
                              "or was not written by shardkit")
    if payload_digest(payload) != int(saved):
        raise CheckpointError(f"checkpoint {path} fails its digest (xxh3 of its tensors and "
                              "values): its bytes changed after it was written (disk or copy "
                              "damage); resume from another checkpoint (best.pt) or start over")


def resolve_resume(resume: str | Path) -> Path | None:
    """A checkpoint file as given, or ``<run folder>/checkpoints/last.pt``; ``None`` for a run
    folder that holds a run but no checkpoint yet (a run killed before its first checkpoint:
    there is nothing to resume, so the run starts over there, with a warning).

    Raises:
        ConfigError: no checkpoint and no run at ``resume``.
    """
    path = Path(resume)
    if path.is_dir():
        if not (path / "checkpoints" / "last.pt").is_file() and _unstarted_run(path):
            log.warning("--resume %s: the run there has no checkpoint yet (it stopped before "
                        "its first one); starting it over", resume)
            return None
        path = path / "checkpoints" / "last.pt"
    if not path.is_file():
        raise ConfigError(f"--resume {resume}: no checkpoint at {path}")
    return path


def _unstarted_run(out: Path) -> bool:
    """``out`` holds a run's ``config.yaml`` but no checkpoint of it: nothing to keep."""
    ckpts = out / "checkpoints"
    return (out / "config.yaml").is_file() and not (ckpts.is_dir() and any(ckpts.glob("*.pt")))


def check_resume_classes(checkpoint_classes, dataset_classes, data) -> None:
    """Refuses to resume onto a dataset whose class list differs from the checkpoint's (a
    re-packed dataset with another class order or count would train the head on wrong labels
    without a word).

    Raises:
        ResumeMismatchError: names the count, and the first positions that differ.
    """
    saved, now = list(checkpoint_classes), list(dataset_classes)
    if saved == now:
        return
    if len(saved) != len(now):
        detail = f"the checkpoint has {len(saved)} classes, {data} has {len(now)}"
    else:
        diffs = [f"label {i}: {a!r} vs {b!r}" for i, (a, b) in enumerate(zip(saved, now))
                 if a != b]
        detail = (f"{len(diffs)} labels name other classes ({', '.join(diffs[:3])}"
                  f"{', ...' if len(diffs) > 3 else ''})")
    raise ResumeMismatchError(f"cannot resume: {detail}; the dataset was re-packed with "
                              "another class list (resume on the original dataset, or start a "
                              "new run with --pretrained CHECKPOINT)")


def check_resume_config(config: TrainConfig, saved: dict) -> None:
    """Raises :class:`ResumeMismatchError` naming every schedule field that differs."""
    diffs = {name: (saved.get(name), getattr(config, name)) for name in SCHEDULE_FIELDS
             if saved.get(name) != getattr(config, name)}
    if diffs:
        text = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
        raise ResumeMismatchError(f"cannot resume with a different step count or LR schedule "
                                  f"({text}); resume with the checkpoint's values")


def check_run_folder(out: Path, resuming: bool) -> None:
    """Refuses to start a fresh run in a folder that already holds one. A folder whose run
    never wrote a checkpoint (killed in its first epoch) holds nothing to keep: the run starts
    over there, with a warning.

    Raises:
        OutputExistsError: ``out/config.yaml`` exists beside a checkpoint and this is not a
            resume.
    """
    if not resuming and _unstarted_run(out):
        log.warning("run folder %s holds a run without a checkpoint (it stopped before its "
                    "first one); starting over there", out)
        return
    if not resuming and (out / "config.yaml").exists():
        raise OutputExistsError(f"run folder {out} already holds a run (config.yaml); pass "
                                f"--resume {out} to continue it or choose another --out")


def load_parts(ckpt: dict, parts: list, where) -> None:
    """Loads ``ckpt[name]`` into each ``(name, target)`` of ``parts`` (``target.load_state_dict``),
    then the global RNG states from ``ckpt["rng"]`` (:func:`set_rng_state`).

    Raises:
        CheckpointError: a part does not fit (names the checkpoint ``where`` and the part).
    """
    for name, target in list(parts) + [("rng", None)]:
        try:  # load_state_dict raises RuntimeError / KeyError / ValueError on a bad dict
            if target is None:
                set_rng_state(ckpt["rng"])
            else:
                target.load_state_dict(ckpt[name])
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"checkpoint {where}: its {name!r} does not fit this run "
                                  f"({type(e).__name__}: {first[:200]})") from None
