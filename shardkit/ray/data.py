"""Feeding on Ray: one split of a packed dataset as a ``ray.data.Dataset`` (:func:`read_split`).

The dataset is built from the manifest and ``splits/<split>.index.npz`` only (no shard is
listed or opened on the driver): a ``ray.data.range`` over the epoch's positions, mapped in Ray
tasks that read each sample through :class:`shardkit.stream.source.ShardSource` (``pread`` at
the indexed offset, xxh3-checked) and, for ``decode="train"``/``"eval"``, run shardkit's fused
transform. So CPU-only Ray nodes decode and GPU trainers consume with ``iter_torch_batches`` (of
``ds.select_columns(["image", "label"])``: torch takes no text ``key``) or
``streaming_split(n, equal=False)`` (each row goes to exactly one of the ``n`` consumers; with
``equal=True`` Ray may drop rows to even them out).

Same images as :func:`shardkit.stream.make_loader` with ``world_size=1``: the epoch order is
:func:`shardkit.sharding.epoch_order` of ``(seed, epoch)`` (shuffled for ``"train"``, split order
for ``"eval"``), and the sample at place ``j`` of that order is transformed with
``sample_rng(seed, epoch, 0, j)`` (field case 17), so row ``index == i`` holds the pixels the
loader yields for split position ``i`` in the same epoch (tests/test_ray.py). Rows come out
block by block, roughly in epoch order; Ray does not promise the order between blocks.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from shardkit.errors import ConfigError

if TYPE_CHECKING:
    import ray.data

__all__ = ["read_split", "DECODE_MODES", "ROWS_PER_BATCH"]

DECODE_MODES = ("bytes", "train", "eval")
"""``image`` of a row: the stored bytes, or uint8 ``(S, S, 3)`` after the train transform
(RandomResizedCrop + flip) or the eval transform (resize + center crop)."""
ROWS_PER_BATCH = 64
"""Rows per ``map_batches`` call (one output block): 64 x 224 x 224 x 3 B = 9.6 MB decoded."""


@dataclass(frozen=True)
class _Spec:
    root: str
    split: str
    decode: str
    seed: int
    epoch: int
    image_size: int
    shuffle: bool
    verify_reads: bool


class _State:
    """What a Ray worker process builds once per :class:`_Spec`: source, order, transform."""

    def __init__(self, spec: _Spec):
        from shardkit.sharding import epoch_order
        from shardkit.stream.source import ShardSource

        self.source = ShardSource(spec.root, spec.split, "raise", spec.verify_reads)
        idx = self.source.index
        self.order = epoch_order(len(idx), seed=spec.seed, epoch=spec.epoch,
                                 shuffle=spec.shuffle, shards=idx.shard,
                                 block=self.source.remote)
        self.transform = None
        if spec.decode != "bytes":
            from shardkit.transforms import TransformConfig, make_transform

            self.transform = make_transform(TransformConfig(image_size=spec.image_size),
                                            spec.decode == "train")
            self.transform.max_pixels = self.source.max_pixels  # as make_loader


_STATES: dict[_Spec, _State] = {}
_STATES_LOCK = threading.Lock()


def _state(spec: _Spec) -> _State:
    with _STATES_LOCK:
        st = _STATES.get(spec)
        if st is None:
            if len(_STATES) >= 4:  # a worker serving many epochs keeps the latest few
                _STATES.pop(next(iter(_STATES))).source.close()
            st = _STATES[spec] = _State(spec)
        return st


def _rows(batch: dict, spec: _Spec) -> dict:
    """Rows for the epoch places ``batch["id"]``."""
    from shardkit.sharding import sample_rng

    st = _state(spec)
    places = np.asarray(batch["id"], dtype=np.int64)
    positions = st.order[places]
    keys, images = [], []
    for j, pos in zip(places.tolist(), positions.tolist()):
        data = st.source.read(pos)
        if st.transform is None:
            images.append(bytes(data))
        else:
            images.append(st.transform(data, sample_rng(spec.seed, spec.epoch, 0, j)))
        keys.append(st.source.key(pos))
    image = np.stack(images) if st.transform is not None else np.array(images, dtype=object)
    return {"key": np.array(keys, dtype=object), "label": st.source.index.label[positions],
            "index": positions, "image": image}


def read_split(root, split: str, *, decode: str = "bytes", seed: int = 0, epoch: int = 0,
               image_size: int = 224, shuffle: bool | None = None,
               verify_reads: bool = True) -> ray.data.Dataset:
    """Split ``split`` of the packed dataset at ``root`` as a lazy ``ray.data.Dataset``.

    Rows: ``key`` (str), ``label`` (int64 in ``[0, num_classes)``), ``index`` (int64 split
    position), ``image``: the stored bytes (``decode="bytes"``), or uint8 ``(image_size,
    image_size, 3)`` RGB, 0..255 (``"train"``: RandomResizedCrop + flip; ``"eval"``: resize +
    center crop; shardkit's :func:`~shardkit.transforms.make_transform` with the default
    :class:`~shardkit.transforms.TransformConfig`). One row per sample of the split per epoch.

    Args:
        root: dataset folder (every Ray node must see it at this path), ``file://`` URL, or an
            fsspec URL of ``wds`` tar shards.
        seed, epoch: order and augmentation randomness (those of ``make_loader``).
        shuffle: the epoch order is shuffled; default: on for ``"train"``, off otherwise.
        verify_reads: check each sample's xxh3 against the index.

    Raises (here, on the driver):
        ConfigError: ``decode`` not in :data:`DECODE_MODES`, a bad seed, epoch or image_size,
            Ray not installed. ManifestError: no finished dataset or unknown split.
        ShardCorruptError: a listed shard is missing or of the wrong size.
    Errors reading a sample (ShardCorruptError naming shard and key) fail the Ray task.
    """
    from shardkit.storage.urls import is_url, local_path
    from shardkit.stream.source import ShardSource
    from shardkit.stream.state import check_epoch
    from shardkit.validate import check_int
    from shardkit.transforms import TransformConfig

    if decode not in DECODE_MODES:
        raise ConfigError(f"decode={decode!r}; expected one of {list(DECODE_MODES)}")
    seed = check_int("seed", seed, 0, message="seed={value!r}; expected an int >= 0")
    epoch = check_epoch(epoch)
    TransformConfig(image_size=image_size)  # validates image_size (ConfigError)
    try:
        import ray.data
    except ImportError:
        raise ConfigError("read_split needs Ray Data: pip install 'shardkit[ray]' (or "
                          "'ray[data]')") from None
    root = os.fspath(root)
    if not is_url(root):
        root = os.path.abspath(local_path(root))  # Ray workers do not share the driver's cwd
    n = len(ShardSource(root, split, "raise", verify_reads))  # validates before any task
    spec = _Spec(root, split, decode, int(seed), epoch, int(image_size),
                 decode == "train" if shuffle is None else bool(shuffle), bool(verify_reads))
    blocks = max(1, -(-n // ROWS_PER_BATCH))  # one block per batch: no re-bundling
    return ray.data.range(n, override_num_blocks=blocks).map_batches(
        _rows, fn_kwargs={"spec": spec}, batch_size=ROWS_PER_BATCH, batch_format="numpy")
