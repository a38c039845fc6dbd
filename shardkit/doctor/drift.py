"""Transform drift check of ``shardkit check`` (and the train transform ``shardkit inspect`` draws).

The fast transforms of :mod:`shardkit.transforms` decode only a crop window, at a DCT reduction,
and resize with Pillow; torchvision's v2 pipeline
(:func:`shardkit.transforms.torchvision_reference`) is the reference they must keep matching. On
real samples of the dataset this module checks:

1. train and eval transforms carry the *same* :class:`~shardkit.transforms.TransformConfig` (a
   val loader built from another config is silent drift), equal to the one asked for;
2. the eval output equals the torchvision reference (``Resize(floor(S / crop_pct))`` +
   ``CenterCrop(S)`` on the Pillow-decoded image) within :data:`TOLERANCE`;
3. the train output, for the crop the transform drew, equals torchvision's ``resized_crop`` (+
   flip) within the same tolerance;
4. train and eval outputs have the same shape ``(S, S, 3)`` and dtype uint8.

The config checked is the one given (``shardkit check --transform-config``: a TransformConfig
YAML, or a train run's ``config.yaml``, see :func:`load_transform_config`), else
``TransformConfig()``; nothing about training is recorded in the dataset. The command builds both
transforms from that one config, so check 1 can only fail for callers of
:func:`check_transform_drift` that pass the transforms their loaders really use (``train_t``,
``eval_t``).

Metric and tolerance. A DCT-reduced decode (``dct_scaling``, on by default) is a slightly
different low-pass than decode-then-antialias, so raw pixels legitimately differ from torchvision
where the decode is reduced. Drift that matters (another crop, a flip, swapped channels) moves
whole regions, so the check compares images after 8x8 mean pooling. Measured on the first 100
embedded flower photos (examples/flowers-sample in path order, 175-500 px; S in {96, 224},
bilinear and bicubic, one eval and one seeded train crop per photo): the correct transforms
differ from torchvision by at most 4.6 levels (raw mean abs, of 255) at S = 96 and 0.07 at
S = 224 (these small photos are rarely DCT-reduced at 224), and by at most 0.55 after pooling;
``crop_pct`` 0.875 -> 0.95 gives at least 2.9 pooled (median 10-16) and a horizontal mirror at
least 8.1 (median 35-43). :data:`TOLERANCE` sits between the two. The raw mean abs difference
is reported too.
A change of ``interpolation`` alone is a high-frequency change this metric does not separate
from DCT scaling; only check 1 (config equality) catches it, i.e. when the transforms are
passed in.
"""
from __future__ import annotations

import io
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm import tqdm

from shardkit.doctor.reading import iter_sample_bytes
from shardkit.errors import ConfigError
from shardkit.dataset.manifest import load_index

__all__ = ["TOLERANCE", "load_transform_config", "train_transform", "check_transform_drift"]

log = logging.getLogger(__name__)

TOLERANCE = {"pool": 8, "pooled_mean_abs": 1.5}
"""Max mean absolute difference (0-255 levels) per image from the torchvision reference, after
``pool`` x ``pool`` mean pooling of both images."""


def load_transform_config(path: str | Path, manifest: dict[str, Any] | None = None):
    """The :class:`~shardkit.transforms.TransformConfig` described by a YAML file.

    ``path`` is one of:

    - a YAML mapping of TransformConfig fields, at the top level or under a ``transform`` key;
    - the ``config.yaml`` that ``shardkit train`` writes in its run folder (a resolved
      :class:`~shardkit.train.config.TrainConfig`), or the run folder itself: the result is the
      TransformConfig that run's loaders were built with (``shardkit.train.data.transform_config``:
      the run's ``image_size``, mean/std from its ``mean_std``; ``mean_std: dataset`` reads
      ``manifest["stats"][train_split]`` of the dataset being checked, so ``manifest`` is needed).

    Raises:
        ConfigError: unreadable YAML, not a mapping, fields that belong to neither config (names
            them), or a train config with ``mean_std: dataset`` and no stats in ``manifest``.
    """
    from shardkit.transforms import TransformConfig  # imports timm: only when needed

    path = Path(path)
    if path.is_dir():
        path = path / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read transform config {path}: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("transform"), dict):
        data = data["transform"]
    if not isinstance(data, dict):
        raise ConfigError(f"transform config {path} must be a mapping of TransformConfig fields; "
                          f"got {type(data).__name__}")
    extra = set(data) - {f.name for f in fields(TransformConfig)}
    if not extra:
        cfg = TransformConfig.from_dict(data)
        log.info("transform config from %s: %s", path, cfg)
        return cfg
    from shardkit.train.config import TrainConfig

    if extra - {f.name for f in fields(TrainConfig)}:
        known = sorted(f.name for f in fields(TransformConfig))
        raise ConfigError(f"transform config {path}: unknown transform option(s) {sorted(extra)}; "
                          f"expected TransformConfig fields {known} (top level or under "
                          "'transform'), or a `shardkit train` run's config.yaml")
    cfg = _from_train_config(TrainConfig.from_dict(data, source=str(path)), manifest)
    log.info("transform config of the train run %s: %s", path, cfg)
    return cfg


def _from_train_config(config, manifest: dict[str, Any] | None):
    from shardkit.train.data import resolve_mean_std, transform_config

    if config.mean_std == "dataset" and manifest is None:
        raise ConfigError("a train config with mean_std: dataset needs the dataset's manifest "
                          "to resolve its mean/std")
    mean, std = resolve_mean_std(config, manifest or {})
    return transform_config(config, mean, std)


def _config(cfg):
    from shardkit.transforms import TransformConfig

    if cfg is None:
        return TransformConfig()
    if not isinstance(cfg, TransformConfig):
        raise ConfigError("transform_config must be a shardkit.transforms.TransformConfig or "
                          f"None; got {type(cfg).__name__}")
    return cfg


def train_transform(cfg=None):
    """``shardkit.transforms.make_transform(cfg, train=True)``; ``cfg`` None means
    ``TransformConfig()``.

    The result maps ``(encoded bytes, numpy Generator)`` to an ``(S, S, 3)`` uint8 RGB array.
    """
    from shardkit.transforms import make_transform

    return make_transform(_config(cfg), train=True)


def _pil_rgb(data: bytes):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return im.convert("RGB")


def _pool(a: np.ndarray, k: int) -> np.ndarray:
    h, w = a.shape[0] // k * k, a.shape[1] // k * k
    return a[:h, :w].astype(np.float64).reshape(h // k, k, w // k, k, -1).mean(axis=(1, 3))


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float] | None:
    """(raw, pooled) mean abs difference in 0-255 levels; None when the shapes differ."""
    if a.shape != b.shape:
        return None
    k = TOLERANCE["pool"]
    return (float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()),
            float(np.abs(_pool(a, k) - _pool(b, k)).mean()))


def _eval_split(manifest: dict[str, Any]) -> str:
    names = [s for s in manifest["splits"] if manifest["splits"][s]["num_samples"] > 0]
    if not names:
        raise ConfigError("every split of this dataset is empty; no sample to check transforms on")
    for preferred in ("val", "test"):
        if preferred in names:
            return preferred
    return names[0]


def check_transform_drift(root: str | Path, manifest: dict[str, Any], cfg=None, *,
                          num_samples: int = 4, seed: int = 0, train_t=None,
                          eval_t=None, progress: bool = False) -> dict[str, Any]:
    """Compare train/eval transforms with each other and with torchvision on real samples.

    Args:
        root, manifest: the packed dataset and its manifest dict.
        cfg: the TransformConfig expected (None: ``TransformConfig()``).
        num_samples: samples checked (the first ones of ``val``, else ``test``, else the first
            non-empty split), >= 1.
        seed: seed of the numpy Generator that drives the train crops.
        train_t, eval_t: transforms to check (default ``make_transform(cfg, True/False)``);
            any callable ``(bytes, rng) -> (S, S, 3) uint8`` with a ``cfg`` attribute (and, for
            train, ``last_params``) - e.g. the transforms a loader really uses.
        progress: a tqdm bar on stderr.

    Returns:
        ``{"config": cfg.to_dict(), "split", "keys", "same_config": bool, "eval_mean_abs": [per
        image {"raw", "pooled"} in 0-255 levels, or None when shapes differ], "train_mean_abs":
        [...], "train_shape", "eval_shape", "train_dtype",
        "eval_dtype", "tolerance": TOLERANCE, "problems": [str, ...], "summary": str}``;
        an empty ``problems`` list means no drift.

    Raises:
        ConfigError: ``num_samples < 1``, a config of the wrong type, or no sample to check.
    """
    from shardkit.transforms import make_transform, torchvision_reference

    if isinstance(num_samples, bool) or int(num_samples) < 1:
        raise ConfigError(f"num_samples for the transform check must be >= 1; got {num_samples!r}")
    cfg = _config(cfg)
    train_t = train_t if train_t is not None else make_transform(cfg, train=True)
    eval_t = eval_t if eval_t is not None else make_transform(cfg, train=False)
    problems: list[str] = []
    train_cfg, eval_cfg = getattr(train_t, "cfg", None), getattr(eval_t, "cfg", None)
    same = train_cfg is not None and train_cfg == eval_cfg == cfg
    if not same:
        for name, got in (("train", train_cfg), ("eval", eval_cfg)):
            if got is None:
                problems.append(f"the {name} transform records no TransformConfig (.cfg)")
            elif got != cfg:
                want, have = cfg.to_dict(), got.to_dict()
                changed = ", ".join(f"{k}: expected {v}, got {have[k]}" for k, v in want.items()
                                    if have[k] != v)
                problems.append(f"the {name} transform uses another TransformConfig than "
                                f"expected: {changed}")
    ref_eval = torchvision_reference(cfg, train=False)    # the reference is the *expected* config
    ref_train = torchvision_reference(cfg, train=True)
    split = _eval_split(manifest)
    n = min(int(num_samples), int(manifest["splits"][split]["num_samples"]))
    rng = np.random.default_rng(seed)
    keys = [load_index(root, split, manifest).key_at(i) for i in range(n)]
    eval_diffs, train_diffs, shapes = [], [], {}
    samples = sorted(iter_sample_bytes(root, manifest, split, range(n)))
    for pos, data in tqdm(samples, desc=f"transforms {split}", disable=not progress):
        ev, tr = eval_t(data, rng), train_t(data, rng)
        img = _pil_rgb(data)
        shapes = {"train_shape": list(tr.shape), "eval_shape": list(ev.shape),
                  "train_dtype": str(tr.dtype), "eval_dtype": str(ev.dtype)}
        if tr.shape != ev.shape or tr.dtype != ev.dtype:
            problems.append(f"{keys[pos]}: train output {tr.dtype} {tr.shape} differs from eval "
                            f"output {ev.dtype} {ev.shape}")
        params = getattr(train_t, "last_params", None)
        if params is None:
            problems.append(f"{keys[pos]}: the train transform records no crop (.last_params); "
                            "its output cannot be compared with torchvision")
        refs = [("eval", ev, ref_eval(img), eval_diffs)]
        if params is not None:
            refs.append(("train", tr, ref_train(img, params), train_diffs))
        for name, out, ref, diffs in refs:
            d = _diff(out, ref)
            diffs.append(None if d is None else {"raw": d[0], "pooled": d[1]})
            if d is None:
                problems.append(f"{keys[pos]}: {name} output shape {out.shape} differs from "
                                f"torchvision's {ref.shape}")
            elif d[1] > TOLERANCE["pooled_mean_abs"]:
                problems.append(f"{keys[pos]}: {name} output differs from torchvision by {d[1]:.2f}"
                                f" levels (mean abs after {TOLERANCE['pool']}x{TOLERANCE['pool']} "
                                f"pooling), above {TOLERANCE['pooled_mean_abs']}")
    worst = max((d["pooled"] for d in eval_diffs + train_diffs if d is not None),
                default=float("nan"))
    summary = (f"{n} {split} samples, S={cfg.image_size}: worst pooled mean abs difference from "
               f"torchvision {worst:.3f} levels (tolerance {TOLERANCE['pooled_mean_abs']}); "
               f"train {'=' if same else '!='} eval config; "
               + ("no drift" if not problems else f"{len(problems)} problem(s)"))
    return {"config": cfg.to_dict(), "split": split, "keys": keys, "same_config": same,
            "eval_mean_abs": eval_diffs, "train_mean_abs": train_diffs, **shapes,
            "tolerance": dict(TOLERANCE), "problems": problems, "summary": summary}
