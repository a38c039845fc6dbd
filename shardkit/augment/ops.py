"""Augmentation ops: torchvision v2 transforms' parameter sampling, drawn from shardkit's RNG.

Each op is ``draw(rng, height, width, **params) -> program`` (a list of ``(primitive, args)``
pairs of :mod:`shardkit.augment.prims`; empty when the op does not fire). The sampling follows
the torchvision v2 transform of the same name (``torchvision/transforms/v2/_color.py``,
``_geometry.py``, ``_auto_augment.py``, ``_augment.py``, torchvision 0.29), with one deliberate
difference: the draws come from the sample's ``numpy.random.Generator`` (a pure function of
``(seed, epoch, rank, position)``, :func:`shardkit.sharding.sample_rng`) instead of torch's
global generator, so the same sample gets the same augmentation for any ``num_workers``, backend,
device or resume point. Distributions are the same: ``torch.empty(1).uniform_(a, b)`` becomes
``rng.uniform(a, b)``, ``torch.randint(lo, hi)`` ``rng.integers(lo, hi)``, ``torch.randperm(n)``
``rng.permutation(n)``, the Dirichlet of AugMix ``rng.dirichlet``.

Other differences, each stated where it applies: ``random_erasing`` fills with a constant uint8
value (the erase runs on uint8 pixels before normalisation, so 0 is black; torchvision's
``value="random"`` noise belongs to the normalised float domain); the magnitude of
``rand_augment`` / ``trivial_augment`` may be fractional under a strength schedule (linear
interpolation between torchvision's bins; integer magnitudes are torchvision's bins exactly).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

from shardkit.augment.vendored import (AUGMIX_PARTIAL_SPACE, AUGMIX_SPACE, RAND_AUGMENT_SPACE,
                                       TRIVIAL_AUGMENT_SPACE)
from shardkit.errors import ConfigError

Program = list  # [(primitive name, args tuple), ...]


def _range(value, name: str, center: float | None = None, lower: float | None = 0.0):
    """torchvision's ``_check_input``: a number v gives ``[center - v, center + v]`` (clipped
    at ``lower``), a pair is taken as is."""
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{name}={value}; expected a non-negative number or a [min, max] "
                              "pair")
        if center is None:
            return (-float(value), float(value))
        lo = center - float(value)
        return (max(lower, lo) if lower is not None else lo, center + float(value))
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] <= value[1]:
        return (float(value[0]), float(value[1]))
    raise ConfigError(f"{name}={value!r}; expected a non-negative number or a [min, max] pair")


def _fires(rng, p: float) -> bool:
    """torchvision ``_RandomApplyTransform``: the op applies when ``rand() < p``. Raises
    ConfigError for a ``p`` outside [0, 1]."""
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"p={p!r}; expected a probability in [0, 1]")
    return p >= 1.0 or (p > 0.0 and rng.random() < p)


def _fill_value(value, name: str = "fill", allow_none: bool = True):
    """Checks a uint8 fill: an int 0-255 or 3 of them, or (``allow_none``) None, torchvision's
    zero padding. Returns it; raises ConfigError naming ``name`` otherwise."""
    if value is None and allow_none:
        return value
    values = [value] if isinstance(value, (int, float)) else value
    if (not isinstance(values, (list, tuple)) or len(values) not in (1, 3)
            or not all(isinstance(v, (int, float)) and 0 <= v <= 255 for v in values)):
        raise ConfigError(f"{name}={value!r}; expected a uint8 value 0-255 or 3 of them (RGB)")
    return value


# ------------------------------------------------------------------ colour
def color_jitter(rng, h, w, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0) -> Program:
    """``ColorJitter``: factors uniform in ``[max(0, 1 - x), 1 + x]`` (hue in ``[-x, x]``,
    at most 0.5), applied in a random order. Hue is off unless asked (it changes what
    colour-defined classes look like: ``shardkit check --augment`` warns; its C kernel costs
    a few times a brightness pass, benchmarks/bench_augment_ops.py)."""
    ranges = _jitter_ranges(_hashable(brightness), _hashable(contrast), _hashable(saturation),
                            _hashable(hue))
    order = rng.permutation(4).tolist()
    uniform = rng.uniform  # a Python float per call (this runs per sample)
    factors = [None if r is None else uniform(r[0], r[1]) for r in ranges]
    return [(_JITTER_NAMES[k], (factors[k],)) for k in order if factors[k] is not None]


_JITTER_NAMES = ("brightness", "contrast", "saturation", "hue")


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


@functools.lru_cache(maxsize=256)
def _jitter_ranges(brightness, contrast, saturation, hue) -> tuple:
    """The 4 factor ranges of :func:`color_jitter` (None: the op is off), checked once per
    parameter set (this runs per sample)."""
    hue_error = ConfigError(f"hue={hue!r}; expected a value in [0, 0.5] or a pair in "
                            "[-0.5, 0.5]")  # one message for any bad hue (torchvision's range)
    try:
        hue_range = _range(hue, "hue", None)
    except ConfigError:
        raise hue_error from None
    ranges = [_range(brightness, "brightness", 1.0), _range(contrast, "contrast", 1.0),
              _range(saturation, "saturation", 1.0), hue_range]
    if not -0.5 <= ranges[3][0] <= ranges[3][1] <= 0.5:
        raise hue_error
    return tuple(None if r == ((1.0, 1.0) if k < 3 else (0.0, 0.0)) else r
                 for k, r in enumerate(ranges))


def grayscale(rng, h, w, p=0.1) -> Program:
    """``RandomGrayscale(p)``: 3-channel grayscale."""
    return [("grayscale", ())] if _fires(rng, p) else []


def sharpness(rng, h, w, sharpness_factor=2.0, p=0.5) -> Program:
    """``RandomAdjustSharpness(sharpness_factor, p)``."""
    return [("sharpness", (float(sharpness_factor),))] if _fires(rng, p) else []


def posterize(rng, h, w, bits=4, p=0.5) -> Program:
    """``RandomPosterize(bits, p)``: keeps the ``bits`` high bits (0-8)."""
    if not 0 <= int(bits) <= 8:
        raise ConfigError(f"posterize bits={bits}; expected 0-8")
    return [("posterize", (int(round(bits)),))] if _fires(rng, p) else []


def solarize(rng, h, w, threshold=128.0, p=0.5) -> Program:
    """``RandomSolarize(threshold, p)``: inverts values >= threshold (0-255)."""
    if not 0 <= float(threshold) <= 255:
        raise ConfigError(f"solarize threshold={threshold}; expected 0-255 (uint8 pixels)")
    return [("solarize", (float(threshold),))] if _fires(rng, p) else []


def autocontrast(rng, h, w, p=0.5) -> Program:
    """``RandomAutocontrast(p)``."""
    return [("autocontrast", ())] if _fires(rng, p) else []


def equalize(rng, h, w, p=0.5) -> Program:
    """``RandomEqualize(p)``."""
    return [("equalize", ())] if _fires(rng, p) else []


def gaussian_blur(rng, h, w, kernel_size=5, sigma=(0.1, 2.0), p=1.0) -> Program:
    """``GaussianBlur(kernel_size, sigma)`` (odd kernel size; sigma uniform in the range), with
    an apply probability ``p`` as timm / SimCLR use it (torchvision's class always applies)."""
    if int(kernel_size) < 1 or int(kernel_size) % 2 == 0:
        raise ConfigError(f"gaussian_blur kernel_size={kernel_size}; expected an odd int >= 1")
    lo, hi = _range(sigma, "sigma", None) if not isinstance(sigma, (int, float)) else \
        (float(sigma), float(sigma))
    if not _fires(rng, p):
        return []
    return [("gaussian_blur", (int(kernel_size), float(rng.uniform(lo, hi))))]


# ------------------------------------------------------------------ geometry
def rotation(rng, h, w, degrees=15.0, fill=0, interpolation="nearest") -> Program:
    """``RandomRotation(degrees, interpolation, expand=False, center=None, fill)``."""
    angle = float(rng.uniform(*_range(degrees, "degrees", None)))
    return [("rotate", (angle, _fill_value(fill), interpolation))]


def affine(rng, h, w, degrees=0.0, translate=None, scale=None, shear=None, fill=0,
           interpolation="nearest") -> Program:
    """``RandomAffine(degrees, translate, scale, shear, interpolation, fill)``."""
    angle = float(rng.uniform(*_range(degrees, "degrees", None)))
    _fill_value(fill)
    tx = ty = 0
    if translate is not None and not (isinstance(translate, (list, tuple))
                                      and len(translate) == 2):
        raise ConfigError(f"affine translate={translate!r}; expected [max x fraction, max y "
                          "fraction] as torchvision's RandomAffine")
    if translate is not None:
        max_dx, max_dy = float(translate[0]) * w, float(translate[1]) * h
        tx = int(round(rng.uniform(-max_dx, max_dx)))
        ty = int(round(rng.uniform(-max_dy, max_dy)))
    s = float(rng.uniform(float(scale[0]), float(scale[1]))) if scale is not None else 1.0
    sx = sy = 0.0
    if shear is not None:
        sh = [-float(shear), float(shear)] if isinstance(shear, (int, float)) else list(shear)
        sx = float(rng.uniform(sh[0], sh[1]))
        if len(sh) == 4:
            sy = float(rng.uniform(sh[2], sh[3]))
    return [("affine", (angle, (tx, ty), s, (sx, sy), fill, interpolation))]


def perspective(rng, h, w, distortion_scale=0.5, p=0.5, fill=0,
                interpolation="bilinear") -> Program:
    """``RandomPerspective(distortion_scale, p, interpolation, fill)``."""
    if not 0 <= float(distortion_scale) <= 1:
        raise ConfigError(f"distortion_scale={distortion_scale}; expected 0-1")
    _fill_value(fill)
    if not _fires(rng, p):
        return []
    bw = int(distortion_scale * (w // 2)) + 1
    bh = int(distortion_scale * (h // 2)) + 1
    ri = rng.integers
    tl = [int(ri(0, bw)), int(ri(0, bh))]
    tr = [int(ri(w - bw, w)), int(ri(0, bh))]
    br = [int(ri(w - bw, w)), int(ri(h - bh, h))]
    bl = [int(ri(0, bw)), int(ri(h - bh, h))]
    start = [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
    return [("perspective", (start, [tl, tr, br, bl], fill, interpolation))]


def random_erasing(rng, h, w, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0) -> Program:
    """``RandomErasing(p, scale, ratio, value)`` (Zhong et al. 2017) on uint8 pixels with a
    constant ``value`` (0-255, or 3 values)."""
    _fill_value(value, "value", allow_none=False)  # uint8 pixels before normalisation
    if not (0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1]):
        raise ConfigError(f"random_erasing scale={scale!r}, ratio={ratio!r}; expected "
                          "0 < scale min <= max <= 1 and 0 < ratio min <= max")
    if not _fires(rng, p):
        return []
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        area = h * w * float(rng.uniform(scale[0], scale[1]))
        aspect = math.exp(float(rng.uniform(*log_ratio)))
        eh, ew = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
        if not (eh < h and ew < w):
            continue
        i, j = int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1))
        return [("erase", (i, j, eh, ew, value))]
    return []  # torchvision: no valid box in 10 tries leaves the image as it is


# ------------------------------------------------------------------ policies
@functools.lru_cache(maxsize=4096)
def _magnitude(table_fn, bins: int, h: int, w: int, magnitude: float) -> float | None:
    """torchvision's magnitude table at bin ``magnitude``; a fractional magnitude (a strength
    schedule) interpolates linearly between the neighbouring bins. Cached: a pure function of
    its arguments (the table is a torch tensor built per call, ~10 us, and this runs per op of
    every sample)."""
    table = table_fn(bins, h, w)
    if table is None:
        return None
    lo = int(math.floor(magnitude))
    frac = magnitude - lo
    if frac == 0.0 or lo + 1 >= bins:
        return float(table[min(lo, bins - 1)])
    return float(table[lo]) * (1 - frac) + float(table[lo + 1]) * frac


@functools.lru_cache(maxsize=1024)
def _table(table_fn, bins: int, h: int, w: int) -> tuple[float, ...] | None:
    """A magnitude table as Python floats (``float`` of each torch element), or None."""
    table = table_fn(bins, h, w)
    return None if table is None else tuple(float(v) for v in table)


def _named(op: str, magnitude: float, fill, interpolation="nearest") -> Program:
    """torchvision ``_AutoAugmentBase._apply_image_or_video_transform`` as a program."""
    if op == "Identity":
        return []
    if op == "ShearX":
        return [("shear_origin", ((math.degrees(math.atan(magnitude)), 0.0), fill,
                                  interpolation))]
    if op == "ShearY":
        return [("shear_origin", ((0.0, math.degrees(math.atan(magnitude))), fill,
                                  interpolation))]
    if op in ("TranslateX", "TranslateY"):
        t = (int(magnitude), 0) if op == "TranslateX" else (0, int(magnitude))
        return [("affine", (0.0, t, 1.0, (0.0, 0.0), fill, interpolation))]
    if op == "Rotate":
        return [("rotate", (magnitude, fill, interpolation))]
    simple = {"Brightness": "brightness", "Color": "saturation", "Contrast": "contrast",
              "Sharpness": "sharpness"}
    if op in simple:
        return [(simple[op], (1.0 + magnitude,))]
    if op == "Posterize":
        return [("posterize", (int(round(magnitude)),))]
    if op == "Solarize":
        return [("solarize", (255.0 * magnitude,))]
    if op == "AutoContrast":
        return [("autocontrast", ())]
    if op == "Equalize":
        return [("equalize", ())]
    raise ConfigError(f"unknown augmentation op {op!r}")


def _policy_op(rng, space: dict, bins: int, h: int, w: int, magnitude: float | None, fill,
               interpolation) -> Program:
    _fill_value(fill)
    keys = tuple(space)
    op = keys[int(rng.integers(len(keys)))]
    table_fn, signed = space[op]
    if magnitude is None:  # TrivialAugment / AugMix draw the bin
        magnitude = float(rng.integers(bins))
    m = _magnitude(table_fn, bins, h, w, magnitude)
    if m is None:
        m = 0.0
    elif signed and rng.random() <= 0.5:
        m = -m
    return _named(op, m, fill, interpolation)


def rand_augment(rng, h, w, num_ops=2, magnitude=9, num_magnitude_bins=31, fill=None,
                 interpolation="nearest") -> Program:
    """``RandAugment(num_ops, magnitude, num_magnitude_bins)`` (Cubuk et al. 2020), torchvision's
    op space and magnitude tables."""
    bins = int(num_magnitude_bins)
    if not 0 <= float(magnitude) <= bins - 1:
        raise ConfigError(f"rand_augment magnitude={magnitude}; expected 0-{bins - 1} "
                          f"(num_magnitude_bins={bins})")
    if int(num_ops) < 0:
        raise ConfigError(f"rand_augment num_ops={num_ops}; expected >= 0")
    out: Program = []
    for _ in range(int(round(num_ops))):
        out += _policy_op(rng, RAND_AUGMENT_SPACE, bins, h, w, float(magnitude),
                          fill, interpolation)
    return out


def trivial_augment(rng, h, w, num_magnitude_bins=31, fill=None,
                    interpolation="nearest") -> Program:
    """``TrivialAugmentWide`` (Mueller & Hutter 2021): one op at a uniformly drawn magnitude."""
    if int(num_magnitude_bins) < 2:
        raise ConfigError(f"trivial_augment num_magnitude_bins={num_magnitude_bins}; "
                          "expected >= 2")
    return _policy_op(rng, TRIVIAL_AUGMENT_SPACE, int(num_magnitude_bins),
                      h, w, None, fill, interpolation)


def aug_mix(rng, h, w, severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True,
            fill=None, interpolation="bilinear") -> Program:
    """``AugMix`` (Hendrycks et al. 2020) as torchvision v2 computes it for one image."""
    if not 1 <= int(severity) <= 10:
        raise ConfigError(f"aug_mix severity={severity}; expected 1-10")
    if int(mixture_width) < 1 or float(alpha) <= 0:
        raise ConfigError(f"aug_mix mixture_width={mixture_width}, alpha={alpha}; expected "
                          "mixture_width >= 1 and alpha > 0")
    _fill_value(fill)
    space = AUGMIX_SPACE if all_ops else AUGMIX_PARTIAL_SPACE
    m = rng.dirichlet([alpha, alpha])
    weights = rng.dirichlet([alpha] * int(mixture_width)) * m[1]
    chains = []
    for _ in range(int(mixture_width)):
        depth = int(chain_depth) if chain_depth > 0 else int(rng.integers(1, 4))
        chain: Program = []
        for _ in range(depth):
            keys = tuple(space)
            op = keys[int(rng.integers(len(keys)))]
            table_fn, signed = space[op]
            table = _table(table_fn, 10, h, w)  # AugMix()._PARAMETER_MAX (its __init__)
            if table is None:
                mag = 0.0
            else:
                mag = table[int(rng.integers(int(severity)))]
                if signed and rng.random() <= 0.5:
                    mag = -mag
            chain += _named(op, mag, fill, interpolation)
        chains.append(chain)
    return [("augmix", ((float(m[0]), *map(float, weights)), chains))]


OPS: dict[str, Callable[..., Program]] = {
    "color_jitter": color_jitter, "grayscale": grayscale, "rotation": rotation,
    "affine": affine, "perspective": perspective, "gaussian_blur": gaussian_blur,
    "sharpness": sharpness, "posterize": posterize, "solarize": solarize,
    "autocontrast": autocontrast, "equalize": equalize, "rand_augment": rand_augment,
    "trivial_augment": trivial_augment, "aug_mix": aug_mix, "random_erasing": random_erasing,
}
"""Per-sample ops by spec name (``{op: NAME, **params}``)."""

BATCH_OPS = ("mixup", "cutmix")
"""Batch-level ops (:mod:`shardkit.augment.mix`), applied to whole batches by the trainer."""


def check_params(name: str, params: dict[str, Any]) -> None:
    """Raises ConfigError naming the op and the parameter when ``params`` holds a name the op
    does not take."""
    import inspect

    fn = OPS[name]
    allowed = [p for p in inspect.signature(fn).parameters if p not in ("rng", "h", "w")]
    for key in params:
        if key not in allowed:
            raise ConfigError(f"augment op {name!r} has no parameter {key!r}; expected some of "
                              f"{allowed}")
