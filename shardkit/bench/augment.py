"""The augmentation dimension of ``shardkit bench`` (``--augment``; README.md, "Benchmark").

Every grid setting is run once per augment spec (``make_loader(augment=SPEC)``,
:mod:`shardkit.augment.spec`); a row's ``setting.augment`` is the spec's canonical text: the
preset name (``none``, ``light``, ``standard``, ``randaugment``, ``trivialaugment``) or the op
list as JSON (what ``AugmentSpec.describe()`` gives, which ``make_loader`` parses back).

Option rule (``--augment``): a comma-separated list of presets and spec files (``.yaml``,
``.yml``, ``.json``), e.g. ``none,standard,randaugment`` or ``none,my-ops.yaml``; or ONE inline
YAML op list, alone (it contains commas itself), e.g. ``'[{op: color_jitter, brightness: 0.4}]'``.
To compare an op list with ``none``, save it to a file. ``none`` is always expanded first.

Augmentation is what the model trains on, not a speed knob: the recommendation is made for each
spec on its own (:func:`shardkit.bench.report.recommend`), and a row with a spec other than
``none`` gets ``ratio_to_none`` against the same setting without augmentation
(:func:`add_augment_ratios`), which is the augmentation's cost.
"""
from __future__ import annotations

import json

from shardkit.errors import ConfigError

__all__ = ["parse_augments", "none_first", "augment_label", "batch_ops_note",
           "add_augment_ratios", "augment_cost_text", "augment_cost_brief"]

_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def _canonical(item: str, name: str) -> str:
    import yaml

    from shardkit.augment import AugmentSpec

    if item[:1] in ("[", "{"):  # an inline list that does not parse was most likely mixed
        try:
            yaml.safe_load(item)
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{name}: {item!r} is not a YAML op list ({first}); an inline op "
                              f"list must be the option's only value (it contains commas): to "
                              f"compare it with presets, save it to a .yaml file and pass "
                              f"none,FILE.yaml") from None
    try:
        return AugmentSpec.parse(item).describe()
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def parse_augments(text: str, name: str = "--augment") -> list[str]:
    """``"standard,none"`` -> ``["none", "standard"]``: canonical augment specs (preset names, or
    an op list as JSON text), duplicates dropped, ``"none"`` first, then in the order given.

    Items are presets or spec files (``.yaml``/``.yml``/``.json``), comma-separated; an inline
    YAML op list (text starting with ``[`` or ``{``) is accepted only as the whole value.

    Raises:
        ConfigError: an item that is neither a preset nor a spec file, an inline op list mixed
            with other items, or a spec :class:`shardkit.augment.AugmentSpec` rejects (the
            message names the option and the item).
    """
    from shardkit.augment import PRESETS

    text = str(text).strip()
    if text[:1] in ("[", "{"):
        return [_canonical(text, name)]
    if "[" in text or "{" in text:
        raise ConfigError(f"{name}: {text!r} mixes an inline YAML op list with other items; an "
                          f"inline list contains commas, so it must be the option's only value: "
                          f"to compare it with presets, save it to a .yaml file and pass "
                          f"none,FILE.yaml")
    out = []
    for item in (s.strip() for s in text.split(",")):
        if item not in PRESETS and not item.endswith(_FILE_SUFFIXES):
            raise ConfigError(f"{name}: {item!r} is not an augment preset or spec file; expected "
                              f"a comma-separated list of {', '.join(PRESETS)} or FILE.yaml, or "
                              f"one inline YAML op list alone")
        out.append(_canonical(item, name))
    return none_first(out)


def none_first(specs) -> list[str]:
    """``specs`` without duplicates, ``"none"`` first (the unaugmented twin is measured before
    the augmented rows), the others in the order given."""
    specs = list(dict.fromkeys(specs))
    return (["none"] if "none" in specs else []) + [s for s in specs if s != "none"]


def augment_label(spec: str | None) -> str:
    """A short name for tables and plots: the preset name, or ``"ops:"`` and the op names
    joined by ``+`` for an op list (``"ops:color_jitter+rand_augment"``)."""
    spec = spec or "none"
    if not spec.startswith("["):
        return spec
    try:
        ops = [str(e.get("op")) for e in json.loads(spec)]
    except (ValueError, AttributeError):
        return "ops"
    return "ops:" + "+".join(ops)


def batch_ops_note(spec: str) -> str:
    """The note of a row whose spec has batch-level ops (mixup / cutmix: the shardkit loader
    mixes each batch, so they are timed, and yields soft targets; an ImageFolder baseline row
    does not mix); empty otherwise."""
    if not spec.startswith("["):
        return ""
    from shardkit.augment import AugmentSpec

    batch = AugmentSpec.parse(spec).batch_ops
    if not batch:
        return ""
    return (f"batch ops ({', '.join(n for n, _ in batch)}) run in the loader (timed, soft "
            f"targets); baselines do not mix")


def add_augment_ratios(results: list[dict]) -> None:
    """Sets ``ratio_to_none`` (median throughput, augmented / unaugmented) and ``none_row`` (the
    twin's id) on every measured row (shardkit or baseline) whose augment is not ``"none"`` and
    whose twin (same kind and setting, ``augment="none"``) was measured too."""
    def key(r: dict) -> tuple:
        return (r["kind"], tuple(sorted((k, v) for k, v in r["setting"].items()
                                        if k != "augment")))

    twins = {key(r): r for r in results if r["status"] == "ok"
             and r["setting"].get("augment", "none") == "none"}
    for r in results:
        if r["status"] != "ok" or r["setting"].get("augment", "none") == "none":
            continue
        twin = twins.get(key(r))
        if twin is not None:
            r["none_row"] = twin["id"]
            r["ratio_to_none"] = (r["metrics"]["throughput_img_s"]["median"]
                                  / twin["metrics"]["throughput_img_s"]["median"])


def augment_cost_text(rec: dict, twin: dict | None, bound: bool | None,
                      threshold: float) -> list[str]:
    """Sentences on the recommended row's augmentation cost: its throughput ratio to the same
    setting without augmentation, and, when the row is data-bound and its twin is not, that the
    augmentation is what makes it so (with what to do). Empty for ``augment="none"`` or without
    a measured twin."""
    spec = rec["setting"].get("augment", "none")
    if spec == "none" or twin is None or "ratio_to_none" not in rec:
        return []
    label = augment_label(spec)
    twin_thr = twin["metrics"]["throughput_img_s"]["median"]
    out = [f"augment={label} runs at {rec['ratio_to_none']:.2f}x the rate of augment=none at "
           f"this setting (row {twin['id']}, {twin_thr:.0f} img/s)."]
    if bound:
        wait = rec["metrics"]["data_wait_fraction"]["median"]
        twin_wait = twin["metrics"]["data_wait_fraction"]["median"]
        if twin_wait < threshold:
            out.append(f"The augmentation makes it data-bound (the device waits {wait:.0%} with "
                       f"it, {twin_wait:.0%} without): run it on the device "
                       f"(augment_device='cuda'), add workers, or use a lighter spec.")
        else:
            out.append(f"It is data-bound without augmentation too (waits {twin_wait:.0%}); "
                       f"the augmentation adds to it ({wait:.0%}).")
    return out


def augment_cost_brief(rec: dict, twin: dict | None, bound: bool | None,
                       threshold: float) -> str:
    """The short form of :func:`augment_cost_text` for a spec that is not the main one:
    ``" (0.58x none), waits 54%: data-bound by the augmentation (5% without)"``; the ratio only
    with a measured twin, the wait only when a step was simulated (``bound`` not None)."""
    out = f" ({rec['ratio_to_none']:.2f}x none)" if "ratio_to_none" in rec else ""
    if bound is None:
        return out
    wait = rec["metrics"]["data_wait_fraction"]["median"]
    out += f", waits {wait:.0%}"
    if bound and twin is not None and rec["setting"].get("augment", "none") != "none":
        twin_wait = twin["metrics"]["data_wait_fraction"]["median"]
        if twin_wait < threshold:
            out += f": data-bound by the augmentation ({twin_wait:.0%} without)"
    return out
