"""Moving batches to the device and normalising them there: :class:`DeviceNormalizer`."""
from __future__ import annotations

import torch

from ..transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_on_device, scaled_mean_std

__all__ = ["DeviceNormalizer"]


class DeviceNormalizer:
    """Wraps a :class:`~shardkit.stream.ShardLoader`: moves each batch to ``device``
    (``non_blocking``), converts to float32 and normalises there with
    :func:`shardkit.transforms.normalize_on_device`; after timm's ``PrefetchLoader``
    (``timm/data/loader.py``), including its side CUDA stream that overlaps the copy and
    normalisation of batch ``k + 1`` with the consumer's work on batch ``k``. A batch that is
    on the GPU already (``device_decode``, ``augment_device``, any source of CUDA tensors) was
    made on the current stream: the side stream waits for it first. ``device="cpu"`` works
    without a GPU (same arithmetic, no streams).

    Yields ``(images, labels, *rest)``: images float32 ``(N, 3, S, S)`` on ``device``
    (``channels_last`` unless ``channels_last=False``), roughly zero-mean / unit-variance per
    channel; labels as the loader yields them (int64 ``(N,)``, or float32 ``(N, K)`` soft
    targets with mixup / cutmix) on ``device``.

    Args:
        mean, std: per-channel RGB statistics in [0, 1] units; default: the loader's
            ``transform_config.mean/std`` (``TransformConfig``'s default is ImageNet's), else
            ImageNet's (``shardkit.transforms.IMAGENET_MEAN/STD``).

    Raises:
        TransformInputError: mean/std not 3 values each, or a std <= 0.
    """

    def __init__(self, loader, device, mean=None, std=None, channels_last: bool = True):
        cfg = getattr(loader, "transform_config", None)
        if mean is None:
            mean = cfg.mean if cfg is not None else IMAGENET_MEAN
        if std is None:
            std = cfg.std if cfg is not None else IMAGENET_STD
        self.loader = loader
        self.device = torch.device(device)
        self.channels_last = channels_last
        self.mean, self.std = scaled_mean_std(mean, std, self.device)

    def __len__(self) -> int:
        return len(self.loader)

    def _move(self, batch):
        images, *rest = batch
        images = images.to(self.device, non_blocking=True)
        rest = [_to(t, self.device) for t in rest]
        return (normalize_on_device(images, self.mean, self.std,
                                    channels_last=self.channels_last), *rest)

    def __iter__(self):
        if self.device.type != "cuda":
            for batch in self.loader:
                yield self._move(batch)
            return
        stream = torch.cuda.Stream(device=self.device)
        current = torch.cuda.current_stream(self.device)
        pending = None
        for batch in self.loader:
            if _on_cuda(batch):
                # made on the device already (device_decode, augment_device, a DALI or
                # synthetic source): its kernels were queued on the current stream, and the
                # side stream must not read it before they have run
                stream.wait_stream(current)
            with torch.cuda.stream(stream):
                moved = self._move(batch)
            if pending is not None:
                yield pending
            current.wait_stream(stream)
            _record(moved, current)
            pending = moved
        if pending is not None:
            yield pending


def _on_cuda(obj) -> bool:
    """Whether any tensor in ``obj`` (also inside dicts / lists / tuples) is on a CUDA device."""
    if isinstance(obj, torch.Tensor):
        return obj.is_cuda
    if isinstance(obj, dict):
        return any(_on_cuda(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_on_cuda(v) for v in obj)
    return False


def _to(obj, device):
    """Moves tensors (also inside dicts / lists) to ``device`` with ``non_blocking=True``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _record(obj, stream) -> None:
    """``record_stream`` on every CUDA tensor in ``obj`` (made on the side stream, used on
    ``stream``)."""
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            obj.record_stream(stream)
    elif isinstance(obj, dict):
        for v in obj.values():
            _record(v, stream)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _record(v, stream)
