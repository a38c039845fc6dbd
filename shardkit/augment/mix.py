"""Batch-level mixup / cutmix with soft targets, as timm's ``Mixup(mode="batch")``.

Semantics of ``timm.data.mixup.Mixup`` (Wightman, pytorch-image-models): with probability
``prob`` a batch is mixed; when both mixup (Zhang et al. 2018) and cutmix (Yun et al. 2019) are
on, cutmix is chosen with ``switch_prob``; ``lam ~ Beta(alpha, alpha)``; mixup blends the batch
with its reverse, cutmix pastes a box of the reversed batch (box from ``lam``, ``lam`` then
corrected to the box's area); targets are timm's ``mixup_target`` (label-smoothed one-hots
mixed by ``lam``). The one difference: the draws come from a generator that is a pure function
of ``(seed, epoch, rank, step)`` instead of numpy's global state.

A uint8 batch (the loader's, before normalisation) is mixed as timm's ``FastCollateMixup``
does in its collate: blended in float32 and rounded to the nearest integer (halves to even, as
``np.rint``); a cutmix box is copied as it is. Normalisation being affine, a mixed uint8 batch
normalised on the device equals the normalised batch mixed, up to that rounding (< 0.5 of a
level).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from shardkit.errors import ConfigError, LabelError

_PARAMS = {"mixup": {"alpha", "p"}, "cutmix": {"alpha", "p"}}
#: Each batch op's parameter defaults (timm's ``Mixup`` defaults: mixup 0.8, cutmix 1.0).
BATCH_DEFAULTS = {"mixup": {"alpha": 0.8, "p": 1.0}, "cutmix": {"alpha": 1.0, "p": 1.0}}


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


class MixDraw(NamedTuple):
    """One batch's mix: ``lam``, the weight of each row's own image and label, and ``box``: the
    ``(y0, y1, x0, x1)`` pixel rows / columns (end exclusive) pasted from the reversed batch
    (cutmix), or None (mixup, or no mix when ``lam == 1``)."""

    lam: float
    box: tuple[int, int, int, int] | None = None


#: The draw of a batch that is not mixed: its targets are the one-hot labels.
NO_MIX = MixDraw(1.0, None)


def soft_targets(labels: torch.Tensor, num_classes: int, lam: float,
                 label_smoothing: float = 0.0) -> torch.Tensor:
    """timm's ``mixup_target``: float32 ``(N, K)`` on ``labels``' device, ``lam`` times the
    (smoothed) one-hot of ``labels`` plus ``1 - lam`` times that of ``labels.flip(0)``; each row
    sums to 1.

    Raises:
        LabelError: a label outside ``[0, num_classes)`` (names the first one).
    """
    labels = labels.long().view(-1)
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        bad = labels[(labels < 0) | (labels >= num_classes)][0]
        raise LabelError(f"label {int(bad)} is outside [0, {num_classes}): the manifest has "
                         f"{num_classes} classes")
    off = label_smoothing / num_classes
    on = 1.0 - label_smoothing + off

    def one_hot(x):
        return torch.full((x.shape[0], num_classes), off, dtype=torch.float32,
                          device=x.device).scatter_(1, x.view(-1, 1), on)

    return one_hot(labels) * lam + one_hot(labels.flip(0)) * (1.0 - lam)


def apply_mix(images: torch.Tensor, labels: torch.Tensor, draw: MixDraw, num_classes: int,
              label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Applies one batch's :class:`MixDraw` in place: ``images`` ``(N, C, H, W)``, uint8 (each
    blended pixel rounded to the nearest integer, as timm's ``FastCollateMixup``) or float,
    on any device; ``labels`` int64 ``(N,)``. Row ``i`` is mixed with row ``N - 1 - i``.
    Returns ``(images, targets)``, ``targets`` from :func:`soft_targets`.

    Raises:
        LabelError: a label outside ``[0, num_classes)``.
    """
    targets = soft_targets(labels, num_classes, draw.lam, label_smoothing)
    if draw.box is not None:
        y0, y1, x0, x1 = draw.box
        images[:, :, y0:y1, x0:x1] = images[:, :, y0:y1, x0:x1].flip(0)
    elif draw.lam < 1.0:
        lam = draw.lam
        if images.is_floating_point():
            flipped = images.flip(0).mul_(1.0 - lam)
            images.mul_(lam).add_(flipped)
        elif images.device.type == "cpu":
            _blend_uint8(images.permute(0, 2, 3, 1).numpy(), lam)  # a view: rows (n, H, W, C)
        else:  # pair by pair: no float copy of the whole batch
            n = images.shape[0]
            for i in range((n + 1) // 2):
                j = n - 1 - i
                a, b = images[i].float(), images[j].float()
                images[i] = a.mul(lam).add_(b.mul(1.0 - lam)).round_()
                if j != i:
                    images[j] = b.mul_(lam).add_(a.mul_(1.0 - lam)).round_()
    return images, targets


def _blend_uint8(rows: np.ndarray, lam: float) -> None:
    """timm's ``FastCollateMixup`` blend of uint8 ``rows`` ``(n, ...)`` in place: row ``i``
    becomes ``rint(float32(row_i) * lam + float32(row_{n-1-i}) * (1 - lam))``, pair by pair
    through four reused float32 row buffers (measured 2x the torch ops per pair on a 2-core
    VM, ~1 ms per 224 px image)."""
    n = rows.shape[0]
    if n == 0:
        return
    l, m = np.float32(lam), np.float32(1.0 - lam)
    a, b, u, v = (np.empty(rows.shape[1:], np.float32) for _ in range(4))
    for i in range((n + 1) // 2):
        j = n - 1 - i
        a[...] = rows[i]
        b[...] = rows[j]
        np.multiply(a, l, out=u)
        np.multiply(b, m, out=v)
        u += v
        np.rint(u, out=u)
        if j != i:
            np.multiply(b, l, out=b)
            np.multiply(a, m, out=a)
            b += a
            np.rint(b, out=b)
            rows[j] = b
        rows[i] = u


class BatchMix:
    """Mixup / cutmix of a batch (float, or uint8 as the loader's) with soft targets.

    Args:
        num_classes: number of classes K.
        mixup_alpha, cutmix_alpha: Beta parameters (0 turns one off; not both 0).
        prob: probability that a batch is mixed. switch_prob: probability of cutmix when both
            are on (timm's default 0.5). label_smoothing: as timm's ``mixup_target``.

    Call: ``mix(images, labels, rng) -> (images, targets)``: ``images`` float or uint8
    ``(N, C, H, W)`` (mixed in place, see :func:`apply_mix`), ``labels`` int64 ``(N,)``,
    ``targets`` float32 ``(N, K)`` summing to 1.
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
        params = {name: {**BATCH_DEFAULTS[name], **p} for name, p in batch_ops}
        params = {name: p for name, p in params.items()
                  if float(p["alpha"]) > 0 and float(p["p"]) > 0}
        if not params:
            return None
        mixup, cutmix = params.get("mixup"), params.get("cutmix")
        p_mix = float(mixup["p"]) if mixup is not None else 0.0
        p_cut = float(cutmix["p"]) if cutmix is not None else 0.0
        return cls(num_classes, float(mixup["alpha"]) if mixup is not None else 0.0,
                   float(cutmix["alpha"]) if cutmix is not None else 0.0,
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

    def draw_batch(self, rng: np.random.Generator, height: int, width: int) -> MixDraw:
        """One batch's :class:`MixDraw` for images of ``height x width`` pixels: :meth:`draw`,
        then, for cutmix, :meth:`box` from the same generator (timm's order of draws)."""
        lam, use_cutmix = self.draw(rng)
        if lam < 1.0 and use_cutmix:
            box, lam = self.box(height, width, lam, rng)
            return MixDraw(lam, box)
        return MixDraw(lam, None)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, rng: np.random.Generator):
        draw = self.draw_batch(rng, images.shape[-2], images.shape[-1])
        return apply_mix(images, labels, draw, self.num_classes, self.label_smoothing)
