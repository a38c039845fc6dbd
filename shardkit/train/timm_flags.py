"""timm ``train.py``'s augmentation flags on shardkit's augment ops, and the resolved op list.

``--aa`` (timm's auto-augment string), ``--mixup`` and ``--cutmix`` (Beta alphas) become entries
of the ``augment`` spec (:mod:`shardkit.augment.spec`), so a run has one augmentation truth and
``config.yaml`` records it as the op list that ran (:func:`augment_ops`).

``--aa`` strings (timm ``rand_augment_transform`` / ``augment_and_mix_transform`` grammar,
sections after the first separated by ``-``, in any order):

- ``rand-m<M>[-n<N>][-mstd<S>][-mmax<X>][-inc<0|1>][-p<P>]`` -> ``{op: rand_augment,
  num_ops: N (default 2), magnitude: M (default 10), num_magnitude_bins: 11}``: timm's
  magnitude is on a 0-10 scale (``_LEVEL_DENOM`` 10), which torchvision's tables span with 11
  bins (bin ``M`` = ``M / 10`` of each op's maximum, the maxima of timm's ``rand`` set: rotate
  30 degrees, shear 0.3, translate 0.45 of the side, enhance 0.9). What does not map is said in
  a note: the op set is torchvision's RandAugment (with Identity; no Invert or SolarizeAdd),
  whose Posterize and Solarize grow stronger with the magnitude as timm's ``inc1`` set does;
  every chosen op applies (timm applies each with ``p``, default 0.5); no magnitude noise
  (``mstd``, ``mmax``).
- ``augmix-m<M>[-w<W>][-d<D>][-a<A>][-b<0|1>]`` -> ``{op: aug_mix, severity: M (default 3),
  mixture_width: W (3), chain_depth: D (-1), alpha: A (1.0)}``; ``b1`` (timm's blended mix)
  and ``mstd`` are not mapped (a note says so).
- ``none``: no auto-augment op.

Anything else (timm's AutoAugment policies ``original``, ``originalr``, ``v0``, ``v0r``, ``3a``,
a transform set ``t...``) raises :class:`~shardkit.errors.ConfigError` naming what is supported.
"""
from __future__ import annotations

import inspect
import re
from typing import Any

from ..errors import ConfigError

__all__ = ["aa_op", "compose_augment", "augment_ops", "AA_FORMS", "POLICY_OPS"]

AA_FORMS = ("rand-m<M>[-n<N>][-mstd<S>][-mmax<X>][-inc<0|1>][-p<P>] (RandAugment)",
            "augmix-m<M>[-w<W>][-d<D>][-a<A>][-b<0|1>] (AugMix)", "none")
"""The ``--aa`` forms shardkit maps (see the module docstring)."""

POLICY_OPS = ("rand_augment", "trivial_augment", "aug_mix")
"""Augment ops that are an auto-augment policy: ``--aa`` replaces them."""

_TIMM_RAND_LEVELS = 10  # timm's _LEVEL_DENOM: magnitudes run 0-10


def _unsupported(text: str, why: str) -> ConfigError:
    return ConfigError(f"--aa {text!r}: {why}; supported: {'; '.join(AA_FORMS)} (or --augment "
                       "randaugment / trivialaugment / a list of ops)")


def _sections(text: str, keys: tuple[str, ...]) -> dict[str, str]:
    """``{key: value}`` of the ``-`` sections after the first (longest key first: ``mstd``
    before ``m``)."""
    out: dict[str, str] = {}
    for section in text.split("-")[1:]:
        for key in sorted(keys, key=len, reverse=True):
            if section.startswith(key) and re.fullmatch(r"-?\d+(\.\d*)?", section[len(key):]):
                out[key] = section[len(key):]
                break
        else:
            raise _unsupported(text, f"section {section!r} is not one of "
                                     f"{', '.join(k + '<number>' for k in keys)}")
    return out


def _number(text: str, sections: dict, key: str, default, kind=int):
    if key not in sections:
        return default
    try:
        return kind(sections[key])
    except ValueError:
        raise _unsupported(text, f"{key}{sections[key]}: expected {key}<{kind.__name__}>") from None


def aa_op(text: str) -> tuple[dict | None, list[str]]:
    """The augment op of timm's ``--aa TEXT`` and notes on what does not map.

    Returns ``(op dict or None for "none", [note, ...])`` (see the module docstring).

    Raises:
        ConfigError: a form or section shardkit has no op for (the message lists the forms).
    """
    text = str(text).strip()
    kind = text.split("-")[0]
    if text.lower() == "none":
        return None, []
    if kind == "rand":
        s = _sections(text, ("m", "n", "mstd", "mmax", "inc", "p"))
        magnitude = _number(text, s, "m", _TIMM_RAND_LEVELS)
        if not 0 <= magnitude <= _TIMM_RAND_LEVELS:
            raise _unsupported(text, f"magnitude m{magnitude} is outside timm's 0-10 scale")
        op = {"op": "rand_augment", "num_ops": _number(text, s, "n", 2), "magnitude": magnitude,
              "num_magnitude_bins": _TIMM_RAND_LEVELS + 1}
        unmapped = [f"each op applied with p={_number(text, s, 'p', 0.5, float)} (every chosen "
                    "op applies)"]
        unmapped += [f"{k}{s[k]} (no magnitude noise)" for k in ("mstd", "mmax") if k in s]
        note = ("torchvision's RandAugment op set and tables (Identity in it, no Invert or "
                "SolarizeAdd; Posterize and Solarize stronger with the magnitude, as timm's "
                "inc1)")
    elif kind == "augmix":
        s = _sections(text, ("m", "w", "d", "a", "b", "mstd"))
        op = {"op": "aug_mix", "severity": _number(text, s, "m", 3),
              "mixture_width": _number(text, s, "w", 3), "chain_depth": _number(text, s, "d", -1),
              "alpha": _number(text, s, "a", 1.0, float)}
        unmapped = [f"{k}{s[k]}" for k in ("b", "mstd") if k in s and float(s[k]) != 0]
        note = "torchvision's AugMix"
    else:
        raise _unsupported(text, "timm's AutoAugment policies and transform sets have no "
                                 "shardkit op" if kind in ("original", "originalr", "v0", "v0r",
                                                          "3a") else "unknown form")
    params = ", ".join(f"{k}: {v}" for k, v in op.items() if k != "op")
    notes = [f"--aa {text} runs as {{op: {op['op']}, {params}}}: {note}"
             + (f"; not mapped: {', '.join(unmapped)}" if unmapped else "")]
    return op, notes


def _entries(spec: Any) -> list[dict]:
    """The spec as a list of ``{op, **params}`` dicts (presets and files expanded)."""
    from ..augment import AugmentSpec

    parsed = AugmentSpec.parse(spec)
    return [{"op": name, **params} for name, params in parsed.ops + parsed.batch_ops]


def compose_augment(base: Any, aa: str | None = None, mixup: float | None = None,
                    cutmix: float | None = None) -> tuple[Any, list[str]]:
    """``base`` (any augment spec) with timm's flags applied, and the notes to log.

    ``aa``: replaces the policy ops (:data:`POLICY_OPS`) of ``base`` with :func:`aa_op`'s op,
    at the first one's place, else before the first ``random_erasing``, else after the other
    per-sample ops. ``mixup`` / ``cutmix``: the Beta alpha of that batch op (timm's ``--mixup``
    / ``--cutmix``); it replaces ``base``'s op of that name, and 0 removes it. With all three
    None, ``base`` is returned as it is.

    Raises:
        ConfigError: a bad ``aa`` string, a negative alpha, or a bad ``base``.
    """
    if aa is None and mixup is None and cutmix is None:
        return base, []
    entries, notes = _entries(base), []
    if aa is not None:
        op, notes = aa_op(aa)
        places = [k for k, e in enumerate(entries) if e["op"] in POLICY_OPS]
        entries = [e for e in entries if e["op"] not in POLICY_OPS]
        if op is not None:
            names = [e["op"] for e in entries]
            at = (places[0] if places else names.index("random_erasing")
                  if "random_erasing" in names else
                  len([n for n in names if n not in ("mixup", "cutmix")]))
            entries.insert(at, op)
    for name, alpha in (("mixup", mixup), ("cutmix", cutmix)):
        if alpha is None:
            continue
        if not alpha >= 0:
            raise ConfigError(f"--{name} {alpha}: expected a Beta alpha >= 0 (0: off)")
        entries = [e for e in entries if e["op"] != name]
        if alpha > 0:
            entries.append({"op": name, "alpha": float(alpha)})
    return entries, notes


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (YAML ``safe_dump`` and JSON take lists)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def augment_ops(spec: Any) -> list[dict]:
    """The op list that runs for ``spec``: ``[{op, **params}]`` in spec order (per-sample ops,
    then mixup / cutmix) with every parameter's default filled in (the op function's signature
    in :mod:`shardkit.augment.ops`, :data:`shardkit.augment.mix.BATCH_DEFAULTS`); schedules stay
    schedule dicts. ``AugmentSpec.parse`` of the result draws what ``spec`` draws. ``[]`` for
    ``none``.

    Raises:
        ConfigError: ``spec`` is not a valid augment spec.
    """
    from ..augment import AugmentSpec
    from ..augment.mix import BATCH_DEFAULTS
    from ..augment.ops import OPS

    parsed = AugmentSpec.parse(spec)
    out = []
    for name, params in parsed.ops:
        signature = inspect.signature(OPS[name]).parameters.values()
        defaults = {p.name: p.default for p in signature
                    if p.name not in ("rng", "h", "w") and p.default is not p.empty}
        out.append({"op": name, **_plain({**defaults, **params})})
    for name, params in parsed.batch_ops:
        out.append({"op": name, **_plain({**BATCH_DEFAULTS[name], **params})})
    return out
