"""Feeding on Ray: one split of a packed dataset as a ``ray.data.Dataset`` (:func:`read_split`).

The dataset comes from :class:`shardkit.ray.datasource.SplitDatasource`, planned from the
manifest and ``splits/<split>.index.npz`` only (no shard is listed or opened on the driver):
one read task per shard, whose metadata carry its row count and in-memory size from the index;
the epoch order is computed once on the driver and each task gets only its rows
(:mod:`shardkit.ray.tasks`). A task reads its samples through
:class:`shardkit.stream.MapShardDataset` (``pread`` at the indexed offset, xxh3-checked) and,
for ``decode="train"``/``"eval"``, runs shardkit's fused transform and the augmentation. So
CPU-only Ray nodes decode and GPU trainers consume with ``iter_torch_batches`` (of
``ds.select_columns(["image", "label"])``: torch takes no text ``key``) or
``streaming_split(n, equal=False)`` (each row goes to exactly one of the ``n`` consumers; with
``equal=True`` Ray may drop rows to even them out).

Same images as :func:`shardkit.stream.make_loader` with ``world_size=1`` and the same
``transform``, ``augment``, ``seed``: the epoch order is :func:`shardkit.sharding.epoch_order`
of ``(seed, epoch)`` (shuffled for ``"train"``, split order for ``"eval"``), and the sample at
place ``j`` of that order is transformed with ``sample_rng(seed, epoch, 0, j)`` (field case 17),
so row ``index == i`` holds the pixels the loader yields for split position ``i`` in the same
epoch (tests/test_ray_data.py). Rows come out shard by shard (the samples of one shard in epoch
order, block by block; pack stores each shard's samples shuffled); Ray does not promise the
order between blocks (``random_shuffle`` or ``iter_batches(local_shuffle_buffer_size=...)``
mix them further).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from shardkit.errors import ConfigError

from .tasks import DECODE_MODES, ROWS_PER_BATCH

if TYPE_CHECKING:
    import ray.data

__all__ = ["read_split", "DECODE_MODES", "ROWS_PER_BATCH"]


def read_split(root, split: str, *, decode: str = "bytes", seed: int = 0, epoch: int = 0,
               image_size: int | None = None, transform=None, augment=None,
               shuffle: bool | None = None, on_error: str = "raise", on_warning: str = "keep",
               verify_reads: bool = True, max_pixels: int | None = None) -> ray.data.Dataset:
    """Split ``split`` of the packed dataset at ``root`` as a lazy ``ray.data.Dataset``.

    Rows: ``key`` (str), ``label`` (int64 in ``[0, num_classes)``), ``index`` (int64 split
    position), ``image``: the stored bytes (``decode="bytes"``), or uint8 ``(S, S, 3)`` RGB,
    0..255 (``"train"``: RandomResizedCrop + flip, then ``augment``; ``"eval"``: resize +
    center crop). One row per sample of the split per epoch, less the samples ``on_error`` /
    ``on_warning`` leave out.

    Args:
        root: dataset folder (every Ray node must see it at this path), ``file://`` URL, or an
            fsspec URL of ``wds`` tar shards.
        decode: one of :data:`DECODE_MODES`.
        seed, epoch: order and augmentation randomness (those of ``make_loader``).
        image_size: output side ``S`` in pixels (default 224, or ``transform.image_size``).
        transform: as :func:`shardkit.stream.make_loader`'s: a
            :class:`~shardkit.transforms.TransformConfig` (default: ``TransformConfig()``), or a
            picklable callable ``(data, rng, out=None) -> (S, S, 3) uint8`` (then
            ``image_size`` is required); ``decode`` says train or eval.
        augment: as ``make_loader``'s (a preset, op list, YAML or
            :class:`~shardkit.augment.AugmentSpec`), ``decode="train"`` only; the batch ops
            ``mixup`` / ``cutmix`` are refused (a Ray dataset is rows: mix in the trainer).
        shuffle: the epoch order is shuffled; default: on for ``"train"``, off otherwise.
        on_error: ``"raise"``: a sample that fails to read or decode fails its Ray task with
            the error naming shard and key; ``"skip"``: it is left out and logged at WARNING
            (keys in :attr:`SplitDatasource.skipped
            <shardkit.ray.datasource.SplitDatasource.skipped>`: build the datasource yourself,
            ``ray.data.read_datasource(SplitDatasource(root, split, ...))``, to read them).
        on_warning: ``"keep"`` (logged per shard), ``"skip"`` (as ``on_error="skip"``) or
            ``"raise"`` (DecodeWarningError) for a decode with libjpeg warnings (field case 12).
        verify_reads: check each sample's xxh3 against the index (a damaged sample is a
            ShardCorruptError naming it, handled by ``on_error``).
        max_pixels: the largest image (width x height) decoded, as ``make_loader``'s.

    Raises (here, on the driver):
        ConfigError: an invalid option (naming it; ``transform`` or ``augment`` with
            ``decode="bytes"``, ``augment`` with ``"eval"``), Ray not installed.
        ManifestError: no finished dataset or unknown split.
        ShardCorruptError: a listed shard is missing or of the wrong size.
    Errors reading a sample (above) fail the Ray task that reads it, and so the consumer.
    """
    try:
        import ray.data
    except ImportError:
        raise ConfigError("read_split needs Ray Data: pip install 'shardkit[ray]' (or "
                          "'ray[data]')") from None
    from .datasource import SplitDatasource

    return ray.data.read_datasource(SplitDatasource(
        root, split, decode=decode, transform=transform, image_size=image_size, augment=augment,
        seed=seed, epoch=epoch, shuffle=shuffle, on_error=on_error, on_warning=on_warning,
        verify_reads=verify_reads, max_pixels=max_pixels))
