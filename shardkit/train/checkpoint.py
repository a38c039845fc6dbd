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
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, OutputExistsError
from .config import SCHEDULE_FIELDS, TrainConfig

__all__ = ["save_checkpoint", "load_checkpoint", "resolve_resume", "check_resume_config",
           "rng_state", "set_rng_state", "CHECKPOINT_FORMAT", "ResumeMismatchError",
           "check_run_folder"]

CHECKPOINT_FORMAT = "shardkit-train-checkpoint"


class ResumeMismatchError(ConfigError):
    """``--resume`` was given a config whose schedule-defining fields differ from the checkpoint."""


def rng_state() -> dict:
    """The python / numpy / torch (and CUDA, when present) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | Path, payload: dict) -> None:
    """Writes ``payload`` (see the module docstring) to ``path`` atomically (tmp + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, **payload}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict:
    """Reads a shardkit training checkpoint onto the CPU.

    Raises:
        ConfigError: ``path`` is missing or is not a shardkit training checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist")
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not a shardkit training checkpoint (no "
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
