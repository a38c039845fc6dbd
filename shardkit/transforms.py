"""One preprocessing factory for train, val and inference: :class:`TransformConfig` +
:func:`make_transform`.

A :class:`SampleTransform` maps encoded image bytes to an RGB ``uint8`` array ``(S, S, 3)`` (HWC,
0..255, CPU), written straight into a caller buffer (a row of the batch) when one is given.

Train: RandomResizedCrop + horizontal flip. Crop parameters are sampled exactly like
torchvision's ``RandomResizedCrop.get_params`` (``torchvision/transforms/transforms.py``: 10
attempts of log-uniform aspect ratio and uniform area fraction, then a center-crop fallback),
from the ORIGINAL image size read from the header, with the caller's ``np.random.Generator``
only. Then only the crop window is decoded (ROI decoder), at the largest DCT reduction that keeps
the crop >= S in both dimensions (``dct_scaling``; reductions 1/2, 1/4, 1/8, see
``shardkit.decode.FAST_DCT_REDUCTIONS``), and resized + mirrored straight into the output by the C
extension's Pillow-exact resample (``shardkit.decode.resize_into``: antialiased, bit-identical to
Pillow's ``resize(box=...)``, i.e. torchvision's PIL path), all in one call without the GIL.
Whenever no DCT reduction applies (every flowers photo: crops are < 2S) the result equals
torchvision v2 ``resized_crop`` + ``horizontal_flip`` on the same decoded pixels, bit for bit,
also on 4:2:0 JPEGs (the ROI decode reads chroma past the crop edges; tests/test_transforms.py).
Measured single-core cost on the flowers photos: 0.64 ms per sample, vs 1.67 ms for PIL +
torchvision v2 and 0.62-0.65 ms for a bare full decode (benchmarks/bench_decode.py).

Eval/inference: timm's default: resize the shorter side to ``floor(S / crop_pct)`` then center
crop S (``timm/data/transforms_factory.py``, ``transforms_imagenet_eval``), fused into one resize
of the center box plus filter-support margin (same sampling grid as resize-then-crop; mean
absolute difference to the torchvision v2 reference < 0.01 on flowers, from float rounding).

Normalisation happens on the device: :func:`normalize_on_device` (timm ``PrefetchLoader`` style),
with ``TransformConfig.mean/std`` (:class:`shardkit.stream.DeviceNormalizer` takes them from the
loader's config).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from fractions import Fraction
from typing import NamedTuple

import numpy as np
from PIL import Image
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from shardkit.decode import choose_scale, get_decoder, resize_into, scaled_size
from shardkit.errors import ConfigError, TransformInputError
from shardkit.validate import check_int

__all__ = [
    "TransformConfig", "CropParams", "SampleTransform", "make_transform", "declared",
    "sample_crop_params",
    "eval_crop_box", "torchvision_reference", "TorchvisionReference", "normalize_on_device",
    "TransformInputError", "IMAGENET_MEAN", "IMAGENET_STD", "scaled_mean_std",
]

#: ImageNet per-channel RGB mean and std in 0..1 units: THE constants of shardkit (timm's
#: ``timm.data.constants.IMAGENET_DEFAULT_MEAN/STD``, the same values torchvision documents).
IMAGENET_MEAN: tuple[float, float, float] = tuple(IMAGENET_DEFAULT_MEAN)
IMAGENET_STD: tuple[float, float, float] = tuple(IMAGENET_DEFAULT_STD)

_FILTER_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "nearest": 0.5}  # Pillow Resample.c


@dataclass(frozen=True)
class TransformConfig:
    """Preprocessing configuration shared by train, val and inference.

    image_size: output side S (pixels). scale: RandomResizedCrop area fraction range.
    ratio: aspect ratio (w/h) range. hflip: flip probability in [0, 1]. crop_pct: eval crop
    fraction (resize shorter side to floor(S / crop_pct), center crop S). interpolation:
    "bilinear" | "bicubic" | "nearest". mean/std: per-channel RGB in 0..1 units (ImageNet from
    ``timm.data.constants``). decoder: a ``shardkit.decode.DECODERS`` name or "auto".
    dct_scaling: decode at the largest DCT reduction (M/8) that keeps the crop >= S in both
    dimensions (:func:`shardkit.decode.choose_scale`). fast_dct / fast_upsample: libjpeg speed
    flags (off by default; see benchmarks/bench_decode.py).
    """

    image_size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    crop_pct: float = 0.875
    interpolation: str = "bilinear"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    decoder: str = "auto"
    dct_scaling: bool = True
    fast_dct: bool = False
    fast_upsample: bool = False

    def __post_init__(self) -> None:
        for name in ("scale", "ratio", "mean", "std"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        object.__setattr__(self, "image_size", check_int(
            "image_size", self.image_size, 1, message="image_size must be a positive int, got "
            "{value!r}"))
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ConfigError(f"scale must be (lo, hi) with 0 < lo <= hi <= 1, got {self.scale}")
        if len(self.ratio) != 2 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(f"ratio must be (lo, hi) with 0 < lo <= hi, got {self.ratio}")
        if not 0 <= self.hflip <= 1:
            raise ConfigError(f"hflip must be a probability in [0, 1], got {self.hflip}")
        if not 0 < self.crop_pct <= 1:
            raise ConfigError(f"crop_pct must be in (0, 1], got {self.crop_pct}")
        if self.interpolation not in _FILTER_SUPPORT:
            raise ConfigError(f"interpolation {self.interpolation!r} is not one of "
                              f"{sorted(_FILTER_SUPPORT)}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError(f"mean/std must be 3 values each, std > 0; got {self.mean}, "
                              f"{self.std}")

    @classmethod
    def from_dict(cls, data: dict) -> "TransformConfig":
        """Build from a plain dict (YAML); unknown keys raise ConfigError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown transform option(s) {unknown}; known: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict:
        """Plain dict (lists for tuples), YAML/JSON-safe; ``from_dict(to_dict())`` round-trips."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


class CropParams(NamedTuple):
    """A crop in ORIGINAL pixel coordinates (torchvision order: top, left, height, width) and
    whether to flip horizontally."""

    top: int
    left: int
    height: int
    width: int
    flip: bool


def sample_crop_params(width: int, height: int, cfg: TransformConfig,
                       rng: np.random.Generator) -> CropParams:
    """RandomResizedCrop parameters + flip, drawn from ``rng`` only.

    Same algorithm as torchvision ``RandomResizedCrop.get_params`` (10 attempts, area fraction
    ~ U(scale), log aspect ratio ~ U(log ratio), ``w = round(sqrt(area * r))``; then the
    center-crop fallback clamped to ``ratio``). Flip is ``rng.random() < cfg.hflip``, drawn after.
    """
    area = width * height
    log_lo, log_hi = math.log(cfg.ratio[0]), math.log(cfg.ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(cfg.scale[0], cfg.scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            break
    else:
        in_ratio = width / height
        if in_ratio < min(cfg.ratio):
            w, h = width, int(round(width / min(cfg.ratio)))
        elif in_ratio > max(cfg.ratio):
            w, h = int(round(height * max(cfg.ratio))), height
        else:
            w, h = width, height
        top, left = (height - h) // 2, (width - w) // 2
    flip = bool(rng.random() < cfg.hflip)
    return CropParams(top, left, h, w, flip)


def eval_crop_box(width: int, height: int,
                  cfg: TransformConfig) -> tuple[float, float, float, float]:
    """The eval center crop as a box ``(x0, y0, x1, y1)`` in original (float) pixels.

    Resize shorter side to ``floor(S / crop_pct)`` (long side ``int(size * long / short)``,
    torchvision ``_compute_resized_output_size``), center crop S with the anchor
    ``int(round((resized - S) / 2))`` (torchvision ``_center_crop_compute_crop_anchor``).
    """
    s = cfg.image_size
    size = math.floor(s / cfg.crop_pct)
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    top, left = int(round((new_h - s) / 2.0)), int(round((new_w - s) / 2.0))
    rx, ry = width / new_w, height / new_h
    return (left * rx, top * ry, (left + s) * rx, (top + s) * ry)


class SampleTransform:
    """Bytes -> RGB uint8 (S, S, 3). Picklable; the decoder is created lazily per process.

    Call: ``t(data, rng=None, out=None) -> np.ndarray``. ``data``: encoded image bytes (JPEG
    fast path; PNG etc. via Pillow). ``rng``: the train randomness (ignored in eval; ``None`` in
    train means a fresh OS-seeded generator). ``out``: optional writable (S, S, 3) uint8 array;
    when given the result is written there and ``out`` is returned. Raises DecodeError on
    undecodable data, TransformInputError on a bad ``out``. After each call ``last_warnings``
    holds the decoder warning count of that sample and ``last_warning`` the last text (the
    policy is the caller's: :func:`shardkit.decode.apply_warning_policy`).
    """

    #: ``data`` may be any bytes-like object (a memoryview of a reused read buffer): it is
    #: consumed within the call and never kept (see ``BatchDataset.build``).
    accepts_buffers = True
    #: ``rng`` is drawn from within the call and never kept, so the loader may pass one
    #: generator re-keyed for each sample (:class:`shardkit.sharding.SampleRng`, ~10 us less
    #: per sample than a new one).
    keeps_rng = False
    # Both promises hold only where they are made (:func:`declared`): a subclass, which may
    # keep ``data`` or ``rng``, gets bytes and a new generator unless it makes them again.

    def __init__(self, cfg: TransformConfig, train: bool):
        self.cfg = cfg
        self.train = bool(train)
        self._decoder = None
        #: pixel limit for the decoder (None: shardkit's default); the loader sets its
        #: source's (the reader's own limit, never the dataset's normalization.max_pixels)
        self.max_pixels: int | None = None
        self.last_warnings = 0
        self.last_warning: str | None = None
        self.last_params: CropParams | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_decoder"] = None
        return state

    @property
    def decoder(self):
        if self._decoder is None:
            self._decoder = get_decoder(self.cfg.decoder, fast_dct=self.cfg.fast_dct,
                                        fast_upsample=self.cfg.fast_upsample,
                                        max_pixels=self.max_pixels)
        return self._decoder

    def crop_box(self, data, rng: np.random.Generator | None = None, probe=None):
        """The crop of one sample without decoding it: ``(box, flip, probe)``.

        ``box``: ``(x0, y0, x1, y1)`` in original pixels (ints in train: the RandomResizedCrop
        window; floats in eval: :func:`eval_crop_box`); ``flip``: bool; ``probe``: the header's
        :class:`~shardkit.decode.ImageProbe`. Draws from ``rng`` exactly as :meth:`__call__`
        does, so a batched device decode (:func:`shardkit.decode.nvjpeg.decode_crop_batch`) gets
        the same crops as the CPU path. Sets ``last_params``.
        """
        probe = probe or self.decoder.probe(data)
        if self.train:
            p = sample_crop_params(probe.width, probe.height, self.cfg,
                                   rng if rng is not None else np.random.default_rng())
            box = (p.left, p.top, p.left + p.width, p.top + p.height)
        else:
            box = eval_crop_box(probe.width, probe.height, self.cfg)
            p = CropParams(int(box[1]), int(box[0]), int(box[3] - box[1]), int(box[2] - box[0]),
                           False)
        self.last_params = p
        return box, p.flip, probe

    def __call__(self, data, rng: np.random.Generator | None = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        self._check_out(out)
        box, _, probe = self.crop_box(data, rng)
        return self._decode_crop(data, box, probe, out)

    def _check_out(self, out) -> None:
        s = self.cfg.image_size
        if out is not None and (out.shape != (s, s, 3) or out.dtype != np.uint8
                                or not out.flags.writeable):
            raise TransformInputError(f"out must be a writable ({s}, {s}, 3) uint8 array, got "
                                      f"{out.shape} {out.dtype}")

    def decode_crop(self, data, box, probe, out: np.ndarray | None = None) -> np.ndarray:
        """The rest of :meth:`__call__` once :meth:`crop_box` has drawn the crop: ``data``
        decoded and resized from ``box`` (with the flip and parameters of ``last_params``, the
        crop_box call's) into ``out`` (a writable ``(S, S, 3)`` uint8 array, or a new one),
        which is returned: ``t(data, rng, out)`` is ``t.decode_crop(data, *t.crop_box(data,
        rng)[::2], out)``. The loader draws a sample's augmentation between the two, while the
        Python that draws is still in the CPU's caches. Sets ``last_warnings`` /
        ``last_warning``. Raises DecodeError, TransformInputError (a bad ``out``)."""
        self._check_out(out)
        return self._decode_crop(data, box, probe, out)

    def _decode_crop(self, data, box, probe, out):
        s = self.cfg.image_size
        dec = self.decoder
        p = self.last_params
        margin_support = 0.0 if self.train else _FILTER_SUPPORT[self.cfg.interpolation]
        bw, bh = box[2] - box[0], box[3] - box[1]
        factor = (choose_scale(bw, bh, s, s, probe.factors) if self.cfg.dct_scaling
                  else Fraction(1))
        sw, sh = scaled_size(probe.width, probe.height, factor)
        f = float(factor)
        fb = (box[0] * f, box[1] * f, box[2] * f, box[3] * f)
        # context the filter may read beyond the box (eval only, to match resize-then-crop)
        m = (math.ceil(margin_support * max(bw * f / s, bh * f / s, 1.0)) + 1
             if margin_support else 0)
        region = (max(0, math.floor(fb[0]) - m), max(0, math.floor(fb[1]) - m),
                  min(sw, math.ceil(fb[2]) + m), min(sh, math.ceil(fb[3]) + m))
        rel = (fb[0] - region[0], fb[1] - region[1], fb[2] - region[0], fb[3] - region[1])
        target = out if out is not None else np.empty((s, s, 3), np.uint8)
        dec.decode_resize(data, region, factor, rel, target, p.flip, self.cfg.interpolation,
                          probe)
        self.last_warnings, self.last_warning = dec.last_warnings, dec.last_warning
        return target

    def decode_for_cache(self, data, size: tuple[int, int] | None = None,
                         out: np.ndarray | None = None, *, crop=None) -> np.ndarray:
        """The whole image as RGB uint8 ``(H, W, 3)`` for a decoded cache
        (:mod:`shardkit.stream.cache`), with this transform's decoder and pixel limit.

        ``size=None``: full resolution, the pixels the uncached path crops from (a full decode
        equals the ROI decode cropped: ``shardkit.decode.roi``). ``size=(w, h)``: resized to
        ``w x h`` with the config's interpolation (antialiased, Pillow-exact), decoded first at
        the largest DCT reduction that keeps ``w x h`` (when ``dct_scaling``). ``out``: a
        writable C-contiguous ``(H, W, 3)`` uint8 array to receive the resized result, or at
        full resolution the fused decode's (below); otherwise the decoder's array is returned.

        ``crop=(width, height, rng, crop_out)``: also :meth:`from_pixels` of the result into
        ``crop_out`` (same draws from ``rng``, same pixels), fused with the decode in one C
        call where the decoder can (the ROI decoder, a JPEG, full resolution, ``out`` given):
        the crop is resized from the just-decoded pixels while they are in the CPU cache, with
        no Python in between. When the result is not ``out``'s shape (the caller's index is
        wrong), nothing is cropped and ``rng`` is not drawn from: the caller checks the shape.
        Sets ``last_warnings`` / ``last_warning``. Raises DecodeError.
        """
        dec = self.decoder
        if (size is None and crop is not None and out is not None
                and hasattr(dec, "decode_whole_resize") and self._fused_fill(data, out, crop)):
            return out  # (no header read first: a decode that fails goes the path below)
        probe = dec.probe(data)
        if size is None:
            pixels = dec.decode_scaled(data, Fraction(1), probe)  # the decoder's own array
        else:
            w, h = size
            factor = (choose_scale(probe.width, probe.height, w, h, probe.factors)
                      if self.cfg.dct_scaling else Fraction(1))
            full = dec.decode_scaled(data, factor, probe)
            target = out if out is not None else np.empty((h, w, 3), np.uint8)
            pixels = resize_into(full, (0.0, 0.0, float(full.shape[1]), float(full.shape[0])),
                                 target, False, self.cfg.interpolation)
        self.last_warnings, self.last_warning = dec.last_warnings, dec.last_warning
        if crop is not None and (out is None or pixels.shape == out.shape):  # else: wrong size
            self.from_pixels(pixels, *crop)
        return pixels

    def _fused_fill(self, data, out: np.ndarray, crop) -> bool:
        """:meth:`decode_for_cache`'s one-call decode + crop into ``out`` (the index's size of
        the image) and ``crop_out`` (True), or False with ``rng`` as it was given and
        ``crop_out`` untouched (the decoder cannot, or the decode failed: the caller takes the
        two-step path, which reads the header and raises the decode's error)."""
        width, height, rng, crop_out = crop
        rng = rng if rng is not None else np.random.default_rng()
        drawn = rng.bit_generator.state
        ph, pw = out.shape[:2]
        p, region, rel = self._crop_plan(width, height, pw, ph, rng, crop_out)
        dec = self.decoder
        if not dec.decode_whole_resize(data, out, region, rel, crop_out, p.flip,
                                       self.cfg.interpolation):
            rng.bit_generator.state = drawn
            return False
        self.last_params = p
        self.last_warnings, self.last_warning = dec.last_warnings, dec.last_warning
        return True

    def _crop_plan(self, width: int, height: int, pw: int, ph: int, rng, out):
        """``(params, region, rel)`` of :meth:`from_pixels` for pixels ``pw x ph`` of a
        ``width x height`` image: the crop drawn from ``rng`` as :meth:`__call__` draws it, the
        integer window of the pixels the resampler may read, the float box inside it."""
        s = self.cfg.image_size
        if out is not None and (out.shape != (s, s, 3) or out.dtype != np.uint8
                                or not out.flags.writeable):
            raise TransformInputError(f"out must be a writable ({s}, {s}, 3) uint8 array, got "
                                      f"{out.shape} {out.dtype}")
        if self.train:
            p = sample_crop_params(width, height, self.cfg,
                                   rng if rng is not None else np.random.default_rng())
            box = (p.left, p.top, p.left + p.width, p.top + p.height)
        else:
            box = eval_crop_box(width, height, self.cfg)
            p = CropParams(int(box[1]), int(box[0]), int(box[3] - box[1]), int(box[2] - box[0]),
                           False)
        fx, fy = (1.0, 1.0) if (pw, ph) == (width, height) else (pw / width, ph / height)
        fb = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
        bw, bh = box[2] - box[0], box[3] - box[1]
        support = 0.0 if self.train else _FILTER_SUPPORT[self.cfg.interpolation]
        # the same margin and region as __call__ at scale 1 (fx = fy = 1)
        m = (math.ceil(support * max(bw * fx / s, bh * fy / s, 1.0)) + 1 if support else 0)
        region = (max(0, math.floor(fb[0]) - m), max(0, math.floor(fb[1]) - m),
                  min(pw, math.ceil(fb[2]) + m), min(ph, math.ceil(fb[3]) + m))
        rel = (fb[0] - region[0], fb[1] - region[1], fb[2] - region[0], fb[3] - region[1])
        return p, region, rel

    def from_pixels(self, pixels: np.ndarray, width: int, height: int,
                    rng: np.random.Generator | None = None,
                    out: np.ndarray | None = None) -> np.ndarray:
        """:meth:`__call__` on already decoded pixels (a decoded cache's), same RNG draws.

        Args:
            pixels: RGB uint8 ``(h, w, 3)``: the image of stored size ``width x height``, at full
                resolution or resized (a cache's ``max_side``).
            width, height: the stored image's size (the header's): crop parameters are drawn
                from it exactly as in :meth:`__call__`, then scaled by ``w / width`` and
                ``h / height``.
            rng, out: as :meth:`__call__`.
        Returns:
            ``out`` (or a new array): uint8 ``(S, S, 3)``. At full resolution the pixels equal
            :meth:`__call__`'s bit for bit whenever that path decodes at scale 1 (no DCT
            reduction: every crop < 2S, or ``dct_scaling=False``): same box, same region, same
            resampler (:func:`shardkit.decode.resize_into`). Where ``__call__`` would DCT-reduce,
            the cached crop is resized from full-resolution pixels instead (torchvision's
            reference result, not the reduced decode's). Sets ``last_params``.
        Raises:
            TransformInputError: bad ``out`` or ``pixels``.
        """
        s = self.cfg.image_size
        if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
            if out is not None and (out.shape != (s, s, 3) or out.dtype != np.uint8
                                    or not out.flags.writeable):
                raise TransformInputError(f"out must be a writable ({s}, {s}, 3) uint8 array, "
                                          f"got {out.shape} {out.dtype}")
            raise TransformInputError(f"pixels must be uint8 (h, w, 3), got {pixels.shape} "
                                      f"{pixels.dtype}")
        ph, pw = pixels.shape[:2]
        p, region, rel = self._crop_plan(width, height, pw, ph, rng, out)
        self.last_params = p
        # crop first (the filter must not read past the region, as in the ROI decode)
        crop = np.ascontiguousarray(pixels[region[1]:region[3], region[0]:region[2]])
        target = out if out is not None else np.empty((s, s, 3), np.uint8)
        resize_into(crop, rel, target, p.flip, self.cfg.interpolation)
        return target


def declared(transform, flag: str, default=None):
    """The value of the promise ``flag`` (``accepts_buffers``, ``keeps_rng``) that
    ``transform`` itself or its own class makes, else ``default``. A base class's promise does
    not count: a subclass that overrides ``__call__`` may keep ``data`` or ``rng``."""
    own = getattr(transform, "__dict__", {})
    return own[flag] if flag in own else vars(type(transform)).get(flag, default)


def make_transform(cfg: TransformConfig, train: bool) -> SampleTransform:
    """The one factory: ``train=True`` gives RandomResizedCrop+flip, ``False`` the eval
    resize + center crop used for val, test and inference."""
    return SampleTransform(cfg, train)


class TorchvisionReference:
    """torchvision.transforms.v2 equivalent of :class:`SampleTransform` on a PIL RGB image.

    ``ref(img, params=None) -> np.ndarray`` uint8 (S, S, 3). Train needs ``params`` (the
    :class:`CropParams` the shardkit transform used, see ``SampleTransform.last_params``) and
    applies ``v2.functional.resized_crop(..., antialias=True)`` then ``horizontal_flip``. Eval
    applies ``v2.Resize(floor(S / crop_pct))`` + ``v2.CenterCrop(S)``. ``.pipeline`` is the
    stochastic v2 pipeline (RandomResizedCrop + RandomHorizontalFlip) for train.
    """

    def __init__(self, cfg: TransformConfig, train: bool):
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import v2

        self.cfg, self.train = cfg, train
        self._mode = InterpolationMode(cfg.interpolation)
        s = cfg.image_size
        if train:
            self.pipeline = v2.Compose([
                v2.RandomResizedCrop(s, scale=cfg.scale, ratio=cfg.ratio,
                                     interpolation=self._mode, antialias=True),
                v2.RandomHorizontalFlip(cfg.hflip)])
        else:
            self.pipeline = v2.Compose([
                v2.Resize(math.floor(s / cfg.crop_pct), interpolation=self._mode, antialias=True),
                v2.CenterCrop(s)])

    def __call__(self, img: Image.Image, params: CropParams | None = None) -> np.ndarray:
        from torchvision.transforms.v2 import functional as F

        if not self.train:
            return np.asarray(self.pipeline(img))
        if params is None:
            raise TransformInputError("train reference needs the CropParams to reproduce")
        s = self.cfg.image_size
        out = F.resized_crop(img, params.top, params.left, params.height, params.width, [s, s],
                             interpolation=self._mode, antialias=True)
        if params.flip:
            out = F.horizontal_flip(out)
        return np.asarray(out)


def torchvision_reference(cfg: TransformConfig, train: bool) -> TorchvisionReference:
    """The torchvision v2 pipeline equivalent to ``make_transform(cfg, train)`` (for tests)."""
    return TorchvisionReference(cfg, train)


def normalize_on_device(batch, mean=IMAGENET_MEAN, std=IMAGENET_STD, *, channels_last=None):
    """THE normalisation of shardkit: uint8 images to float32 on their own device (timm
    ``PrefetchLoader`` style, ``timm/data/loader.py``), ``(batch / 255 - mean) / std``.

    Args:
        batch: ``torch.uint8`` tensor ``(N, 3, H, W)`` RGB 0..255, any device and memory format.
        mean, std: 3 values each in 0..1 units (default ImageNet's), or float32 tensors
            ``(1, 3, 1, 1)`` already in 0..255 units on ``batch``'s device (as
            :func:`scaled_mean_std` returns; pass those to avoid a host-to-device copy per batch).
        channels_last: output memory format; None keeps the input's.
    Returns:
        ``torch.float32`` ``(N, 3, H, W)``, same device, roughly zero-mean / unit-variance.
    Raises:
        TransformInputError: wrong dtype or shape.
    """
    import torch

    if batch.dtype != torch.uint8 or batch.ndim != 4 or batch.shape[1] != 3:
        raise TransformInputError(f"batch must be uint8 (N, 3, H, W), got {batch.dtype} "
                                  f"{tuple(batch.shape)}")
    if not isinstance(mean, torch.Tensor):
        mean, std = scaled_mean_std(mean, std, batch.device)
    fmt = (torch.preserve_format if channels_last is None
           else torch.channels_last if channels_last else torch.contiguous_format)
    return batch.to(dtype=torch.float32, memory_format=fmt).sub_(mean).div_(std)


def scaled_mean_std(mean, std, device):
    """``(mean * 255, std * 255)`` as float32 ``(1, 3, 1, 1)`` tensors on ``device``.

    Raises:
        TransformInputError: not 3 values each, or a std <= 0.
    """
    import torch

    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise TransformInputError(f"mean={mean!r}, std={std!r}: expected 3 values each, std > 0")
    m = torch.tensor([255.0 * v for v in mean], dtype=torch.float32, device=device)
    sd = torch.tensor([255.0 * v for v in std], dtype=torch.float32, device=device)
    return m.view(1, 3, 1, 1), sd.view(1, 3, 1, 1)
