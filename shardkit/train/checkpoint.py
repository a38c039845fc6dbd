"""Training checkpoints: written atomically, read back for ``--resume`` and the final test.

A checkpoint is a ``torch.save`` dict::

    {"format": "shardkit-train-checkpoint", "version": 1,
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
anything in it runs (:func:`safe_load`). Written with :func:`shardkit.fsio.atomic_write_with`
(temporary file, fsync, rename, folder fsync).
"""
from __future__ import annotations

import pickle
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError, ConfigError, OutputExistsError
from ..fsio import atomic_write_with
from .config import SCHEDULE_FIELDS, TrainConfig

__all__ = ["save_checkpoint", "load_checkpoint", "safe_load", "resolve_resume",
           "check_resume_config", "rng_state", "set_rng_state", "CHECKPOINT_FORMAT",
           "ResumeMismatchError", "check_run_folder"]

CHECKPOINT_FORMAT = "shardkit-train-checkpoint"


class ResumeMismatchError(ConfigError):
    """``--resume`` was given a config whose schedule-defining fields differ from the checkpoint."""


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


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Writes ``payload`` (see the module docstring) to ``path`` atomically (temporary file,
    fsync, rename, folder fsync; :func:`shardkit.fsio.atomic_write_with`)."""
    obj = {"format": CHECKPOINT_FORMAT, "version": 1, **payload}
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
        raise CheckpointError(f"{what} {path} is not a plain-tensor checkpoint and was not "
                              f"loaded ({detail}): only tensors, numbers, strings and "
                              "lists/dicts of them are accepted; save a state_dict, or use "
                              ".safetensors") from None
    except (RuntimeError, OSError, EOFError, ValueError, KeyError) as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read {what} {path}: not a torch checkpoint "
                              f"({type(e).__name__}: {detail[:160]})") from None


def load_checkpoint(path: str | Path) -> dict:
    """Reads a shardkit training checkpoint onto the CPU, safely (:func:`safe_load`).

    Raises:
        CheckpointError: ``path`` is missing, unsafe or unreadable (see :func:`safe_load`), or
            is not a shardkit training checkpoint.
    """
    payload = safe_load(path)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a shardkit training checkpoint (no "
                              f"format={CHECKPOINT_FORMAT!r}); use --pretrained for plain weights")
    return payload


def resolve_resume(resume: str | Path) -> Path:
    """A checkpoint file as given, or ``<run folder>/checkpoints/last.pt``.

    Raises:
        ConfigError: neither exists.
    """
    path = Path(resume)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt"
    if not path.is_file():
        raise ConfigError(f"--resume {resume}: no checkpoint at {path}")
    return path


def check_resume_config(config: TrainConfig, saved: dict) -> None:
    """Raises :class:`ResumeMismatchError` naming every schedule field that differs."""
    diffs = {name: (saved.get(name), getattr(config, name)) for name in SCHEDULE_FIELDS
             if saved.get(name) != getattr(config, name)}
    if diffs:
        text = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diffs.items())
        raise ResumeMismatchError(f"cannot resume with a different step count or LR schedule "
                                  f"({text}); resume with the checkpoint's values")


def check_run_folder(out: Path, resuming: bool) -> None:
    """Refuses to start a fresh run in a folder that already holds one.

    Raises:
        OutputExistsError: ``out/config.yaml`` exists and this is not a resume.
    """
    if not resuming and (out / "config.yaml").exists():
        raise OutputExistsError(f"run folder {out} already holds a run (config.yaml); pass "
                                f"--resume {out} to continue it or choose another --out")
