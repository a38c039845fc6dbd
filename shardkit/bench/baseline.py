"""The reference loader shardkit is compared against: torchvision ``ImageFolder`` + PIL.

The usual PyTorch training input pipeline over the original files, restricted to the same split
and producing the same uint8 batches as shardkit: ``ImageFolder`` (PIL decode, ``convert("RGB")``)
-> ``transforms.v2.RandomResizedCrop(S)`` (PIL backend, antialiased) -> ``RandomHorizontalFlip``
-> ``PILToTensor`` -> default collate: images uint8 ``(N, 3, S, S)``, labels int64 ``(N,)``.

With an augment preset (``shardkit bench --augment``) the torchvision transform a user
writes for the same augmentation goes between the flip and ``PILToTensor``, on the PIL image
(:data:`BASELINE_AUGMENT`), so the ratio to shardkit is like-for-like. An op list has no
baseline.
"""
from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import DataLoader

from shardkit.errors import ConfigError

__all__ = ["imagefolder_loader", "baseline_transform", "describe_baseline", "InSplit",
           "BASELINE_AUGMENT"]

#: Augment preset -> the torchvision v2 transforms (class name, positional args) that do the
#: same on a PIL image, after the crop and flip. The parameters are those of
#: :data:`shardkit.augment.PRESETS`: ``light``/``standard`` colour jitter 0.2/0.4 on brightness,
#: contrast and saturation (no hue), ``randaugment`` torchvision's ``RandAugment(2, 9)``
#: defaults, ``trivialaugment`` ``TrivialAugmentWide()``.
BASELINE_AUGMENT: dict[str, tuple[tuple[str, tuple], ...]] = {
    "none": (),
    "light": (("ColorJitter", (0.2, 0.2, 0.2)),),
    "standard": (("ColorJitter", (0.4, 0.4, 0.4)),),
    "randaugment": (("RandAugment", (2, 9)),),
    "trivialaugment": (("TrivialAugmentWide", ()),),
}


class InSplit:
    """Picklable ``is_valid_file`` for ImageFolder: True for files whose source-relative path is
    one of ``paths`` (so the baseline reads exactly the split shardkit reads)."""

    def __init__(self, root: str | os.PathLike, paths: list[str]):
        self.root = Path(root).resolve()
        self.paths = frozenset(paths)

    def __call__(self, path: str) -> bool:
        try:
            rel = Path(path).resolve().relative_to(self.root).as_posix()
        except ValueError:
            return False
        return rel in self.paths


def _augment_steps(augment: str) -> tuple[tuple[str, tuple], ...]:
    if augment not in BASELINE_AUGMENT:
        raise ConfigError(f"baseline augment={augment!r}: only the presets "
                          f"({', '.join(BASELINE_AUGMENT)}) have a torchvision counterpart")
    return BASELINE_AUGMENT[augment]


def baseline_transform(image_size: int = 224, augment: str = "none"):
    """``v2.Compose([RandomResizedCrop(S, antialias=True), RandomHorizontalFlip(), *AUG,
    PILToTensor()])`` applied to an RGB PIL image -> uint8 tensor ``(3, S, S)`` values 0..255;
    ``AUG`` is :data:`BASELINE_AUGMENT` ``[augment]`` (nothing for ``"none"``).

    Raises:
        ConfigError: ``augment`` is not a preset name.
    """
    from torchvision.transforms import v2

    extra = [getattr(v2, cls)(*args) for cls, args in _augment_steps(augment)]
    return v2.Compose([v2.RandomResizedCrop(image_size, antialias=True),
                       v2.RandomHorizontalFlip(), *extra, v2.PILToTensor()])


def describe_baseline(image_size: int = 224, augment: str = "none") -> str:
    """The pipeline of :func:`baseline_transform` as text, e.g. ``"RandomResizedCrop(224),
    RandomHorizontalFlip(), RandAugment(2, 9), PILToTensor()"`` (for the bench row).

    Raises:
        ConfigError: ``augment`` is not a preset name.
    """
    extra = [f"{cls}({', '.join(map(str, args))})" for cls, args in _augment_steps(augment)]
    return ", ".join([f"RandomResizedCrop({image_size})", "RandomHorizontalFlip()", *extra,
                      "PILToTensor()"])


def imagefolder_loader(root: str | os.PathLike, paths: list[str] | None, batch_size: int, *,
                       num_workers: int = 0, prefetch_factor: int | None = None,
                       pin_memory: bool = False, persistent_workers: bool = False,
                       image_size: int = 224, augment: str = "none") -> DataLoader:
    """A shuffled ``DataLoader`` over ``ImageFolder(root)`` with :func:`baseline_transform`
    (``augment``: a preset name, see :data:`BASELINE_AUGMENT`).

    Args:
        root: the original ImageFolder tree (the manifest's ``source.root``).
        paths: source-relative posix paths to include (one split); None = every image file.
        batch_size: images per batch, >= 1.

    Returns:
        A DataLoader yielding ``(uint8 (N, 3, S, S), int64 (N,))``; ``drop_last=False``.

    Raises:
        ConfigError: ``root`` is not a folder, no file of ``paths`` is found under it, or
            ``augment`` is not a preset.
    """
    from torchvision.datasets import ImageFolder

    if not Path(root).is_dir():
        raise ConfigError(f"baseline root {str(root)!r} is not a folder; expected the original "
                          f"ImageFolder tree (manifest source.root)")
    is_valid = InSplit(root, paths) if paths is not None else None
    ds = ImageFolder(str(root), transform=baseline_transform(image_size, augment),
                     is_valid_file=is_valid, allow_empty=True)
    if len(ds) == 0:
        raise ConfigError(f"baseline: none of the {len(paths or [])} split files was found under "
                          f"{root}")
    return DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                      prefetch_factor=prefetch_factor if num_workers > 0 else None,
                      pin_memory=pin_memory,
                      persistent_workers=persistent_workers and num_workers > 0)
