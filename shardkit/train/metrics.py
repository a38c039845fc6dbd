"""Classification metrics from merged logits and labels (scikit-learn), saved as JSON and PNG.

Per-class precision / recall / F1 / support, macro-F1 and the confusion matrix come from
``sklearn.metrics``; a class with no prediction or no sample scores 0 (``zero_division=0``).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from shardkit.storage.atomic import atomic_write_bytes, atomic_write_with
from .model import topk_for

__all__ = ["classification_metrics", "save_eval", "plot_confusion", "better", "EarlyStopping"]


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor,
                           classes: list[str]) -> dict:
    """Metrics of one evaluation over all samples.

    Args:
        logits: float ``(N, C)`` on any device, ``C == len(classes)``.
        labels: int64 ``(N,)`` in ``[0, C)``.
        classes: class names; label ``i`` is ``classes[i]``.

    Returns:
        ``{"num_samples", "loss" (mean CE, nats, no smoothing, no class weights), "top1" (0-1),
        "top5" (only when C > 5), "macro_f1" (0-1), "per_class" {name: {precision, recall, f1,
        support}}, "confusion_matrix" (C x C list, rows = true, columns = predicted)}``. With no
        sample at all the scores are None (never NaN, which JSON cannot hold) and ``"reason"``
        says why.
    """
    from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

    logits = logits.detach().float().cpu()
    labels = labels.detach().long().cpu()
    num_classes = len(classes)
    out: dict = {"num_samples": int(labels.numel())}
    if labels.numel() == 0:
        out.update(loss=None, top1=None, macro_f1=None, per_class={},
                   confusion_matrix=np.zeros((num_classes, num_classes), int).tolist(),
                   reason="no samples to evaluate")
        return out
    out["loss"] = float(F.cross_entropy(logits, labels))
    top = logits.topk(max(topk_for(num_classes)), dim=1).indices
    for k in topk_for(num_classes):
        out[f"top{k}"] = float((top[:, :k] == labels[:, None]).any(dim=1).float().mean())
    y_true, y_pred = labels.numpy(), top[:, 0].numpy()
    ids = list(range(num_classes))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=ids, zero_division=0)
    out["macro_f1"] = float(f1_score(y_true, y_pred, labels=ids, average="macro",
                                     zero_division=0))
    out["per_class"] = {name: {"precision": float(precision[i]), "recall": float(recall[i]),
                               "f1": float(f1[i]), "support": int(support[i])}
                        for i, name in enumerate(classes)}
    out["confusion_matrix"] = confusion_matrix(y_true, y_pred, labels=ids).tolist()
    return out


def plot_confusion(matrix: list[list[int]], classes: list[str], path: str | Path,
                   title: str = "") -> None:
    """Writes the confusion matrix as a PNG (rows = true class, columns = predicted; counts),
    atomically. Draws on a ``matplotlib.figure.Figure`` (Agg canvas) without ``pyplot``, so the
    process's matplotlib backend and pyplot state are left alone."""
    from matplotlib.figure import Figure

    cm = np.asarray(matrix)
    size = max(3.0, 0.6 * len(classes) + 1.5)
    fig = Figure(figsize=(size + 1, size))
    ax = fig.subplots()
    image = ax.imshow(cm, cmap="Blues")
    fig.colorbar(image, ax=ax)
    ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right")
    ax.set_yticks(range(len(classes)), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    if len(classes) <= 30:
        threshold = cm.max() / 2 if cm.size else 0
        for (i, j), value in np.ndenumerate(cm):
            ax.text(j, i, str(value), ha="center", va="center",
                    color="white" if value > threshold else "black", fontsize=8)
    fig.tight_layout()
    atomic_write_with(path, lambda f: fig.savefig(f, dpi=100, format="png"))


def save_eval(result: dict, classes: list[str], folder: str | Path, name: str) -> dict:
    """Writes ``folder/name.json`` and ``folder/name.png`` (each atomically); returns
    ``{"json", "png"}`` paths."""
    folder = Path(folder)
    json_path, png_path = folder / f"{name}.json", folder / f"{name}.png"
    atomic_write_bytes(json_path, json.dumps(result, indent=2).encode())
    plot_confusion(result["confusion_matrix"], classes, png_path, title=name)
    return {"json": str(json_path), "png": str(png_path)}


def better(monitor: str, value: float, best: float | None) -> bool:
    """True when ``value`` of ``monitor`` improves on ``best`` (loss: lower; others: higher).
    None (no data) and NaN never improve."""
    if value is None or value != value:
        return False
    if best is None:
        return True
    return value < best if monitor == "loss" else value > best


class EarlyStopping:
    """Best value of ``monitor`` so far and the evaluations since it last improved.

    ``update(value)`` returns True when ``value`` improves on the best (see :func:`better`);
    ``should_stop`` is True once ``patience`` evaluations in a row did not improve (never when
    ``patience`` is None).
    """

    def __init__(self, monitor: str, patience: int | None = None, best: float | None = None,
                 bad_evals: int = 0):
        self.monitor, self.patience, self.best, self.bad_evals = monitor, patience, best, bad_evals

    def update(self, value: float) -> bool:
        if better(self.monitor, value, self.best):
            self.best, self.bad_evals = value, 0
            return True
        self.bad_evals += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_evals >= self.patience
