"""shardkit: a high-throughput sharded data pipeline for image-classification training in PyTorch.

Pack image folders into WebDataset tar, LMDB or HDF5 shards with leak-free split manifests, stream
them into ``torch.utils.data.DataLoader`` with fast JPEG decoding, train timm classifiers from them,
and measure whether training is data-bound.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public names, imported lazily so that `shardkit --help` and worker start-up stay cheap.
_LAZY = {
    "ShardDataset": "shardkit.stream",
    "MapShardDataset": "shardkit.stream",
    "make_loader": "shardkit.stream",
    "ShardLoader": "shardkit.stream",
    "DeviceNormalizer": "shardkit.stream",
    "SamplingOptions": "shardkit.stream",
    "WorkerOptions": "shardkit.stream",
    "TransformConfig": "shardkit.transforms",
    "load_manifest": "shardkit.dataset.manifest",
    "load_index": "shardkit.dataset.manifest",
    "AugmentSpec": "shardkit.augment",
    "pack": "shardkit.packer.run",
    "PackOptions": "shardkit.packer.options",
    "PackSummary": "shardkit.packer.summary",
    "verify": "shardkit.doctor.verify",
}
# No module of shardkit is named like a public function (``pack``, ``verify``): importing a
# submodule binds its name in this package, which would replace the function with the module.

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value
