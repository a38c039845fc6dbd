"""Optimizer, per-step LR schedule and training losses.

- Optimizers: SGD with Nesterov momentum or AdamW; weight decay only on >= 2-D weights
  (:func:`shardkit.train.model.param_groups`).
- Schedule: linear warmup then cosine decay, stepped once per optimizer step, built from
  ``torch.optim.lr_scheduler`` (``LinearLR`` + ``CosineAnnealingLR`` in ``SequentialLR``); the
  cosine form is SGDR's (Loshchilov & Hutter 2017) without restarts.
- Losses: cross-entropy with label smoothing (Szegedy et al. 2016), optionally class-weighted
  with the "balanced" weights ``n / (C * n_c)`` (scikit-learn's ``compute_class_weight``), or the
  softmax focal loss of Lin et al. 2017, "Focal Loss for Dense Object Detection" (ICCV),
  ``FL = -sum_c q_c (1 - p_c)^gamma log p_c`` with ``q`` the (smoothed) one-hot target.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .config import DEFAULT_WARMUP_EPOCHS, DEFAULT_WARMUP_MAX_FRACTION, TrainConfig
from .model import param_groups

__all__ = ["build_optimizer", "build_scheduler", "schedule_steps", "resolve_warmup",
           "class_weights", "FocalLoss", "build_loss"]

WARMUP_START_FACTOR = 1e-3  # warmup starts at lr * 1e-3 (timm's warmup_lr default is 1e-5 of 0.01)


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (Nesterov, ``config.momentum``) or AdamW at ``config.lr`` with decoupled groups."""
    groups = param_groups(model, config.weight_decay)
    if config.opt == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum,
                               nesterov=config.momentum > 0)
    return torch.optim.AdamW(groups, lr=config.lr)


def resolve_warmup(config: TrainConfig, steps_per_epoch: int) -> tuple[int, str | None]:
    """``(warmup_steps, note)`` for a schedule of ``config.epochs * steps_per_epoch`` steps.

    ``warmup_steps`` wins when set (0 = no warmup), else ``warmup_epochs`` when set; both are the
    user's choice and must be shorter than the schedule. With neither set the default warmup of
    ``DEFAULT_WARMUP_EPOCHS`` applies; when it would not be shorter than the schedule (a 1-epoch
    run) it is cut to ``DEFAULT_WARMUP_MAX_FRACTION`` of the schedule and ``note`` says so.

    Raises:
        ConfigError: an explicit warmup not shorter than the schedule (names both step counts).
    """
    total = config.epochs * steps_per_epoch
    if config.warmup_steps is not None:
        warmup, source = config.warmup_steps, f"warmup_steps={config.warmup_steps}"
    elif config.warmup_epochs is not None:
        warmup = round(config.warmup_epochs * steps_per_epoch)
        source = f"warmup_epochs={config.warmup_epochs:g}"
    else:
        warmup = round(DEFAULT_WARMUP_EPOCHS * steps_per_epoch)
        if warmup < total:
            return warmup, None
        clamped = int(total * DEFAULT_WARMUP_MAX_FRACTION)
        return clamped, (f"warmup: the default {DEFAULT_WARMUP_EPOCHS:g} epoch ({warmup} steps) "
                         f"is not shorter than the schedule of {total} steps ({config.epochs} "
                         f"epochs x {steps_per_epoch} steps); using {clamped} steps "
                         f"({DEFAULT_WARMUP_MAX_FRACTION:.0%}). Set --warmup-steps or "
                         "--warmup-epochs to choose.")
    if warmup >= total:
        raise ConfigError(f"{source}: warmup of {warmup} steps is not shorter than the schedule "
                          f"of {total} steps ({config.epochs} epochs x {steps_per_epoch} steps); "
                          "lower it (--warmup-steps 0: no warmup) or raise --epochs")
    return warmup, None


def schedule_steps(config: TrainConfig, steps_per_epoch: int) -> tuple[int, int]:
    """``(total_steps, warmup_steps)`` of the LR schedule: ``epochs * steps_per_epoch`` in all
    (warmup from :func:`resolve_warmup`).

    ``max_steps`` does not change the schedule; it only cuts the run short, so a cut run and its
    resumption follow the same curve as an uninterrupted run.

    Raises:
        ConfigError: the epoch is empty or an explicit warmup is not shorter than the schedule.
    """
    if steps_per_epoch < 1:
        raise ConfigError(f"the train loader yields {steps_per_epoch} batches per epoch; expected "
                          ">= 1 (is the train split smaller than one batch? the last short batch "
                          "is dropped)")
    total = config.epochs * steps_per_epoch
    warmup, _ = resolve_warmup(config, steps_per_epoch)
    return total, warmup


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig,
                    steps_per_epoch: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup from ``lr * 1e-3`` to ``lr`` over the warmup steps, then cosine to ``min_lr``.

    Call ``.step()`` after every optimizer step; after ``total_steps`` steps the LR is ``min_lr``.
    """
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    total, warmup = schedule_steps(config, steps_per_epoch)
    cosine = CosineAnnealingLR(optimizer, T_max=total - warmup, eta_min=config.min_lr)
    if warmup == 0:
        return cosine
    linear = LinearLR(optimizer, start_factor=WARMUP_START_FACTOR, end_factor=1.0,
                      total_iters=warmup)
    return SequentialLR(optimizer, [linear, cosine], milestones=[warmup])


def class_weights(class_counts: list[int], classes: list[str]) -> torch.Tensor:
    """float32 ``(C,)`` weights ``n / (C * n_c)`` (mean 1 over samples; rare classes weigh more).

    Raises:
        ConfigError: a class has no training sample (its weight would be infinite).
    """
    counts = torch.tensor(class_counts, dtype=torch.float64)
    empty = [classes[i] for i in torch.nonzero(counts == 0).flatten().tolist()]
    if empty:
        raise ConfigError(f"loss=weighted-ce: class(es) {empty} have no training samples; "
                          "drop them from the dataset or use loss=ce")
    return (counts.sum() / (len(counts) * counts)).float()


class FocalLoss(nn.Module):
    """Softmax focal loss (Lin et al. 2017, eq. 5, multi-class form), mean over the batch.

    ``forward(logits float (N, C), labels int64 (N,)) -> scalar``. ``gamma = 0`` and no smoothing
    gives plain cross-entropy. ``weight`` (optional ``(C,)``) plays the role of the paper's alpha.
    """

    def __init__(self, gamma: float = 2.0, label_smoothing: float = 0.0,
                 weight: torch.Tensor | None = None):
        super().__init__()
        self.gamma = gamma
        self.label_smoothing = label_smoothing
        self.register_buffer("weight", weight)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(logits.float(), dim=1)
        num_classes = logits.shape[1]
        target = F.one_hot(labels, num_classes).to(logp.dtype)
        if self.label_smoothing:
            target = target * (1 - self.label_smoothing) + self.label_smoothing / num_classes
        loss = -(target * (1 - logp.exp()).pow(self.gamma) * logp)
        if self.weight is not None:
            loss = loss * self.weight.to(loss.dtype)
        return loss.sum(dim=1).mean()


def build_loss(config: TrainConfig, class_counts: list[int], classes: list[str]) -> nn.Module:
    """The training criterion for ``config.loss`` (label smoothing applies to all three)."""
    if config.loss == "focal":
        return FocalLoss(config.focal_gamma, config.label_smoothing)
    weight = class_weights(class_counts, classes) if config.loss == "weighted-ce" else None
    return nn.CrossEntropyLoss(weight=weight, label_smoothing=config.label_smoothing)
