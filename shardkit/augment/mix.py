"""Batch-level mixup / cutmix with soft targets, as timm's ``Mixup(mode="batch")``.

Semantics of ``timm.data.mixup.Mixup`` (Wightman, pytorch-image-models): with probability
``prob`` a batch is mixed; when both mixup (Zhang et al. 2018) and cutmix (Yun et al. 2019) are
on, cutmix is chosen with ``switch_prob``; ``lam ~ Beta(alpha, alpha)``; mixup blends the batch
with its reverse, cutmix pastes a box of the reversed batch (box from ``lam``, ``lam`` then
corrected to the box's area); targets are timm's ``mixup_target`` (label-smoothed one-hots
mixed by ``lam``). The one difference: the draws come from a generator that is a pure function
of ``(seed, epoch, rank, step)`` instead of numpy's global state.
"""
from __future__ import annotations

import numpy as np
import torch

from shardkit.errors import ConfigError

_PARAMS = {"mixup": {"alpha", "p"}, "cutmix": {"alpha", "p"}}


def check_batch_params(name: str, params: dict) -> None:
    """Raises ConfigError for an unknown parameter of ``mixup`` / ``cutmix`` (the values are
    checked per epoch by :func:`check_batch_values`)."""
    for key in params:
        if key not in _PARAMS[name]:
            raise ConfigError(f"augment op {name!r} has no parameter {key!r}; expected some of "
                              f"{sorted(_PARAMS[name])}")


def check_batch_values(name: str, params: dict, epoch: int) -> None:
    """The resolved values of a ``mixup`` / ``cutmix`` op at ``epoch``: ``alpha >= 0`` (0: off
    that epoch, so a schedule may end at 0) and ``0 <= p <= 1``. Raises ConfigError."""
    for key, default, lo, hi in (("alpha", 1.0, 0.0, float("inf")), ("p", 1.0, 0.0, 1.0)):
        value = params.get(key, default)
        try:
            ok = lo <= float(value) <= hi
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"{name} {key}={value!r} at epoch {epoch}; expected a number in "
                              f"[{lo}, {hi}]")


def mix_rng(seed: int, epoch: int, rank: int, step: int) -> np.random.Generator:
    """The generator of one batch's mix: a pure function of ``(seed, epoch, rank, step)``."""
    return np.random.default_rng([int(seed), int(epoch), int(rank), int(step), 0x6D6978])


class BatchMix:
    """Mixup / cutmix of a float batch with soft targets.

    Args:
        num_classes: number of classes K.
        mixup_alpha, cutmix_alpha: Beta parameters (0 turns one off; not both 0).
        prob: probability that a batch is mixed. switch_prob: probability of cutmix when both
            are on (timm's default 0.5). label_smoothing: as timm's ``mixup_target``.

    Call: ``mix(images, labels, rng) -> (images, targets)``: ``images`` float ``(N, C, H, W)``
    (mixed in place), ``labels`` int64 ``(N,)``, ``targets`` float32 ``(N, K)`` summing to 1.
    """

    def __init__(self, num_classes: int, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
                 prob: float = 1.0, switch_prob: float = 0.5, label_smoothing: float = 0.0):
        if mixup_alpha <= 0 and cutmix_alpha <= 0:
            raise ConfigError("BatchMix needs mixup_alpha > 0 or cutmix_alpha > 0")
        self.num_classes = int(num_classes)
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.prob, self.switch_prob = float(prob), float(switch_prob)
        self.label_smoothing = float(label_smoothing)

    @classmethod
    def from_spec(cls, batch_ops: list[tuple[str, dict]], num_classes: int,
                  label_smoothing: float = 0.0) -> "BatchMix | None":
        """From a spec's resolved batch ops (``AugmentSpec.resolved(epoch, batch=True)``), or
        None when no op is on (none given, or ``alpha`` or ``p`` of 0 at this epoch).

        Each op's ``p`` is the probability that a batch gets that op: a batch is mixed with
        probability ``max(p_mixup, p_cutmix)`` and cutmix is chosen with ``switch_prob =
        p_cutmix / (p_mixup + p_cutmix)``, which is timm's ``prob=1, switch_prob=0.5`` when
        both are 1 (defaults: mixup alpha 0.8, cutmix alpha 1.0, p 1)."""
        params = {name: p for name, p in batch_ops
                  if float(p.get("alpha", 0.8 if name == "mixup" else 1.0)) > 0
                  and float(p.get("p", 1.0)) > 0}
        if not params:
            return None
        mixup, cutmix = params.get("mixup"), params.get("cutmix")
        p_mix = float(mixup.get("p", 1.0)) if mixup is not None else 0.0
        p_cut = float(cutmix.get("p", 1.0)) if cutmix is not None else 0.0
        return cls(num_classes, float(mixup.get("alpha", 0.8)) if mixup is not None else 0.0,
                   float(cutmix.get("alpha", 1.0)) if cutmix is not None else 0.0,
                   max(p_mix, p_cut), switch_prob=p_cut / (p_mix + p_cut),
                   label_smoothing=label_smoothing)

    def draw(self, rng: np.random.Generator) -> tuple[float, bool]:
        """``(lam, use_cutmix)`` of one batch (timm ``Mixup._params_per_batch``)."""
        if rng.random() >= self.prob:
            return 1.0, False
        use_cutmix = self.cutmix_alpha > 0 and (
            self.mixup_alpha <= 0 or rng.random() < self.switch_prob)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        return float(rng.beta(alpha, alpha)), use_cutmix

    @staticmethod
    def box(height: int, width: int, lam: float, rng: np.random.Generator):
        """timm ``rand_bbox`` + ``correct_lam``: ``((y0, y1, x0, x1), lam)``."""
        ratio = np.sqrt(1 - lam)
        ch, cw = int(height * ratio), int(width * ratio)
        cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
        y0, y1 = np.clip(cy - ch // 2, 0, height), np.clip(cy + (ch + 1) // 2, 0, height)
        x0, x1 = np.clip(cx - cw // 2, 0, width), np.clip(cx + (cw + 1) // 2, 0, width)
        lam = 1.0 - (y1 - y0) * (x1 - x0) / float(height * width)
        return (int(y0), int(y1), int(x0), int(x1)), float(lam)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, rng: np.random.Generator):
        from timm.data.mixup import mixup_target

        lam, use_cutmix = self.draw(rng)
        if lam < 1.0:
            if use_cutmix:
                (y0, y1, x0, x1), lam = self.box(images.shape[-2], images.shape[-1], lam, rng)
                images[:, :, y0:y1, x0:x1] = images.flip(0)[:, :, y0:y1, x0:x1]
            else:
                flipped = images.flip(0).mul_(1.0 - lam)
                images.mul_(lam).add_(flipped)
        targets = mixup_target(labels, self.num_classes, lam, self.label_smoothing)
        return images, targets
