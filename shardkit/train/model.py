"""The timm classifier adapter: head size from the manifest, shape-checked pretrained loading,
label range checks and top-k clamping (field case 23, HRNet-Image-Classification).

HRNet-Image-Classification's ``cls_hrnet.py`` hardcodes a 2048 -> 1000 head, its ``evaluate.py``
always computes top-5, and its pretrained loader filters keys by name only. Here the head is built
with ``num_classes`` taken from the manifest, top-k is clamped to the class count, and pretrained
tensors whose shapes differ from the model's are skipped and reported.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError, LabelError
from .checkpoint import safe_load

__all__ = ["build_model", "probe_model", "load_pretrained", "param_groups", "check_labels",
           "topk_for", "unwrap", "pretrained_source", "initial_model"]

log = logging.getLogger("shardkit.train")


def build_model(name: str, num_classes: int, pretrained: bool = False) -> nn.Module:
    """The timm model ``name`` with a ``num_classes``-way head, randomly initialised or, with
    ``pretrained``, from timm's pretrained weights (timm fetches them from the Hugging Face Hub
    or its URL on first use and caches them; the 1000-class head is left out and the new head
    initialised, as ``timm.create_model(pretrained=True, num_classes=K)`` does).

    Without ``pretrained`` nothing is downloaded; use :func:`load_pretrained` for local weights.
    The model maps float ``(N, 3, H, W)`` normalised images to ``(N, num_classes)`` logits.

    Raises:
        ConfigError: ``name`` is not a timm model, or ``num_classes < 2``.
        CheckpointError: ``pretrained`` and the weights cannot be fetched or loaded (no
            network, no weights for that model; the message says what to do instead).
    """
    import timm

    if num_classes < 2:
        raise ConfigError(f"num_classes={num_classes}: a classifier needs at least 2 classes")
    if not timm.is_model(name):
        import difflib

        close = difflib.get_close_matches(name, timm.list_models(), n=8, cutoff=0.6)
        hint = (f"similar names: {', '.join(close)}" if close else
                "see timm.list_models('hrnet*') for names, e.g. hrnet_w18_small")
        raise ConfigError(f"model {name!r} is not a timm model; {hint}")
    if not pretrained:
        return timm.create_model(name, pretrained=False, num_classes=num_classes)
    try:
        return timm.create_model(name, pretrained=True, num_classes=num_classes)
    except (OSError, RuntimeError, ValueError) as e:  # huggingface_hub / urllib errors are OSError
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"cannot load timm's pretrained weights of {name!r} "
                              f"({type(e).__name__}: {first}); timm downloads them on first use "
                              "(the Hugging Face Hub must be reachable once, or HF_HUB_CACHE "
                              "must hold them), or pass a local file with --initial-checkpoint"
                              ) from None


def pretrained_source(model: nn.Module) -> dict:
    """Where timm's pretrained weights of ``model`` come from: ``{"architecture", "tag",
    "hf_hub_id", "url"}`` of its ``pretrained_cfg`` (empty strings / None where unset)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return {k: cfg.get(k) for k in ("architecture", "tag", "hf_hub_id", "url")}


def probe_model(model: nn.Module, image_size: int, num_classes: int,
                device: torch.device | str = "cpu") -> None:
    """One no-grad eval-mode forward of a zero ``(1, 3, S, S)`` batch: the model must accept
    ``image_size`` and return ``(1, num_classes)`` logits (no state changes; restores train mode).

    Raises:
        ConfigError: the model rejects the input size (HRNet needs a multiple of 32, some ViTs a
            fixed size) or its head does not give ``num_classes`` logits.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(torch.zeros(1, 3, image_size, image_size, device=device))
    except RuntimeError as e:
        raise ConfigError(f"the model cannot take {image_size}x{image_size} inputs ({e}); "
                          "HRNet needs image_size a multiple of 32") from e
    finally:
        model.train(was_training)
    if tuple(logits.shape) != (1, num_classes):
        raise ConfigError(f"the model gives logits of shape {tuple(logits.shape)}; expected "
                          f"(1, {num_classes}) for the manifest's {num_classes} classes")


def _state_dict_of(obj, path: Path) -> dict[str, torch.Tensor]:
    """The tensor dict inside a checkpoint: a plain state_dict, or under "model"/"state_dict"."""
    if isinstance(obj, dict):
        for key in ("model", "state_dict", "model_state_dict"):
            if isinstance(obj.get(key), dict):
                return _state_dict_of(obj[key], path)
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return obj
    raise CheckpointError(f"pretrained checkpoint {path} holds no state_dict (expected a dict of "
                          "tensors, or one under 'model' / 'state_dict')")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file, or of a torch file loaded with
    ``weights_only=True`` (:func:`shardkit.train.checkpoint.safe_load`): never executes code."""
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        if not path.is_file():
            raise CheckpointError(f"pretrained checkpoint {path} does not exist")
        try:
            return load_file(path, device="cpu")
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"cannot read pretrained checkpoint {path}: {e}") from None
    return _state_dict_of(safe_load(path, "pretrained checkpoint"), path)


def load_pretrained(model: nn.Module, path: str | Path) -> dict:
    """Loads the tensors of checkpoint ``path`` whose names *and* shapes match ``model``.

    ``path``: a ``.safetensors`` file, or a torch file (``.pt``, ``.pth``, ``.bin``) holding a
    state_dict, plain or under ``model`` / ``state_dict`` / ``model_state_dict``; it is loaded
    with ``weights_only=True``, so a pickle that would run code is refused, not executed.
    A ``module.`` / ``_orig_mod.`` prefix (DDP / torch.compile) is stripped. Returns a report:
    ``{"path", "loaded": int, "skipped_shape": [{"key", "checkpoint", "model"}],
    "unexpected": [keys not in the model], "missing": [model keys not in the checkpoint]}``.

    Raises:
        CheckpointError: the file is missing, unreadable, not plain tensors (names the file),
            or holds no state_dict.
    """
    path = Path(path)
    state = _read_weights(path)
    clean = {}
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            key = key.removeprefix(prefix)
        clean[key] = value
    own = model.state_dict()
    loadable, skipped, unexpected = {}, [], []
    for key, value in clean.items():
        if key not in own:
            unexpected.append(key)
        elif tuple(value.shape) != tuple(own[key].shape):
            skipped.append({"key": key, "checkpoint": list(value.shape),
                            "model": list(own[key].shape)})
        else:
            loadable[key] = value
    model.load_state_dict(loadable, strict=False)
    missing = sorted(set(own) - set(loadable))
    return {"path": str(path), "loaded": len(loadable), "skipped_shape": skipped,
            "unexpected": sorted(unexpected), "missing": missing}


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two optimizer groups: weights with ``weight_decay``; biases and norm parameters without.

    A parameter counts as norm/bias when it is 1-D (BatchNorm/LayerNorm weight and bias, all
    biases), the rule of timm's ``param_groups_weight_decay``.
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def check_labels(labels: torch.Tensor, num_classes: int, where: str = "batch") -> None:
    """Raises :class:`LabelError` naming the first label outside ``[0, num_classes)``.

    ``labels``: int64 ``(N,)`` on any device (read on the host; call before moving to a GPU).
    """
    if labels.numel() == 0:
        return
    bad = (labels < 0) | (labels >= num_classes)
    if bool(bad.any()):
        value = int(labels[bad][0])
        raise LabelError(f"label {value} in {where} is outside [0, {num_classes}): the model has "
                         f"{num_classes} classes (from the manifest)")


def topk_for(num_classes: int) -> tuple[int, ...]:
    """The top-k accuracies to report: (1, 5) only when there are more than 5 classes, else (1,)."""
    return (1, 5) if num_classes > 5 else (1,)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def initial_model(config, num_classes: int, fresh: bool = True,
                  note: bool = True) -> tuple[nn.Module, dict | None, dict | None]:
    """The model a run starts from, on the CPU: ``(model, pretrained_weights, report)``.

    ``config`` is a :class:`~shardkit.train.config.TrainConfig`. With ``fresh`` (not a resume,
    whose checkpoint holds the weights) the model gets timm's pretrained weights
    (``config.pretrained``, :func:`build_model`), then ``config.initial_checkpoint``
    (:func:`load_pretrained`; ``report`` is its report, else None). ``pretrained_weights`` is
    :func:`pretrained_source` when ``config.pretrained``, else None. ``note``: log what was
    loaded (INFO, ``shardkit.train``).

    Raises:
        ConfigError, CheckpointError: as :func:`build_model` and :func:`load_pretrained`.
    """
    model = build_model(config.model, num_classes, pretrained=config.pretrained and fresh)
    weights = pretrained_source(model) if config.pretrained else None
    if weights and fresh and note:
        log.info("timm pretrained weights of %s: %s", config.model,
                 weights["hf_hub_id"] or weights["url"])
    report = None
    if config.initial_checkpoint and fresh:
        report = load_pretrained(model, config.initial_checkpoint)
        skipped = report["skipped_shape"]
        if note:
            log.info("initial checkpoint %s: loaded %d tensors; skipped %d with mismatched "
                     "shapes%s", config.initial_checkpoint, report["loaded"], len(skipped),
                     ": " + ", ".join(f"{s['key']} {s['checkpoint']}->{s['model']}"
                                      for s in skipped) if skipped else "")
    return model, weights, report
