"""``shardkit train``: timm classifiers (HRNet by default) trained from shardkit shards.

Public API: :class:`TrainConfig`, :func:`load_config`, :func:`train`, :func:`build_model`,
:func:`load_pretrained`, :func:`classification_metrics`. The click command is
``shardkit.train.cli:train_command``.
"""
from __future__ import annotations

from .config import TrainConfig, load_config
from .engine import train
from .metrics import classification_metrics
from .model import build_model, check_labels, load_pretrained, topk_for

__all__ = ["TrainConfig", "load_config", "train", "build_model", "load_pretrained",
           "check_labels", "topk_for", "classification_metrics"]
