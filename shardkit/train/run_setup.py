"""Run set-up of ``shardkit train``: which splits a run uses, and the process-wide settings.

:func:`setup_process` is the only place in shardkit that seeds the global RNGs or switches
cuDNN benchmark / TF32; :func:`shardkit.train.train` calls it once per run (never on import or
when a model is built) and it logs what it set at INFO on the ``shardkit.train`` logger.
"""
from __future__ import annotations

import logging
import random

import numpy as np
import torch

from ..errors import ConfigError
from .config import TrainConfig

__all__ = ["resolve_splits", "setup_process"]

log = logging.getLogger("shardkit.train")


def resolve_splits(config: TrainConfig, splits: dict,
                   note: bool = True) -> tuple[str | None, str | None]:
    """``(val_split, test_split)`` of this run, each ``None`` when there is none.

    The train split must exist and hold samples. An explicitly named val/test split must exist
    and hold samples too; unset ones default to ``"val"`` / ``"test"`` when the dataset has them
    with samples: a split with 0 samples (``splits[name]["num_samples"] == 0``, e.g. a ratio
    that rounded to nothing) counts as missing. Without a val split the run trains every epoch
    without validation: no early stopping (``patience`` is ignored), no ``best.pt``, and the test
    split (if any) scores the last weights; ``note`` logs that once (WARNING on the
    ``shardkit.train`` logger), as it logs an empty test split (no final test score).

    Raises:
        ConfigError: the train split, or an explicitly named val/test split, is not in the
            dataset or is empty (the message lists the dataset's splits and their sizes).
    """
    names = sorted(splits)
    empty = sorted(s for s in splits if (splits[s] or {}).get("num_samples", 1) == 0)
    sizes = {s: (splits[s] or {}).get("num_samples") for s in names}
    for flag, split in (("--train-split", config.train_split), ("--val-split", config.val_split),
                        ("--test-split", config.test_split)):
        if split is not None and split not in splits:
            raise ConfigError(f"{flag} {split!r}: no such split in {config.data} (splits: "
                              f"{names}); name one of them with {flag}")
        if split is not None and split in empty:
            raise ConfigError(f"{flag} {split!r}: the split is empty in {config.data} (0 samples; "
                              f"samples per split: {sizes}); name another split with {flag} "
                              "or repack with other ratios")
    val = config.val_split or ("val" if "val" in splits and "val" not in empty else None)
    test = config.test_split or ("test" if "test" in splits and "test" not in empty else None)
    if note and not config.test_split and "test" in empty:
        log.warning("no test: the 'test' split of %s is empty (0 samples); no final test score "
                    "(samples per split: %s)", config.data, sizes)
    if val is not None and val == config.train_split:
        raise ConfigError(f"--val-split {val!r} is also the train split; name another split "
                          f"(splits: {names})")
    if val is None and note:
        log.warning("no validation: %s has %s (splits: %s) and --val-split is not "
                    "set; training all epochs without per-epoch validation, %sno best.pt, %s",
                    config.data, "an empty 'val' split (0 samples)" if "val" in empty else
                    "no 'val' split", names, "patience ignored, " if config.patience else "",
                    f"test split {test!r} scored with the last weights" if test
                    else "no test split")
    return val, test


def setup_process(config: TrainConfig, device: torch.device, announce: bool = True) -> dict:
    """The process-wide settings of a ``shardkit train`` run; returns what was set.

    Seeds python's ``random``, ``numpy.random`` and torch (all devices) with ``config.seed``; on
    a CUDA device switches on ``torch.backends.cudnn.benchmark`` and, on compute capability >= 8
    (Ampere and newer), TF32 for matmuls and cuDNN convolutions (timm's train.py does the same).
    Logs the settings at INFO when ``announce`` (rank 0). Called once per run by
    :class:`Trainer`; nothing else in shardkit changes these globals.
    """
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    done = {"seed": config.seed}
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        done["cudnn.benchmark"] = True
        if torch.cuda.get_device_capability(device)[0] >= 8:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            done["tf32"] = True
    if announce:
        log.info("process settings for this run: python/numpy/torch RNGs seeded with %d%s",
                 config.seed, "".join(f", {k}={v}" for k, v in done.items() if k != "seed"))
    return done
