"""shardkit on Ray (``pip install 'shardkit[ray]'``): pack on a cluster, feed trainers from it.

- :func:`read_split`: one split of a packed dataset as a ``ray.data.Dataset`` of rows ``key``,
  ``label``, ``index``, ``image`` (stored bytes, or uint8 ``(S, S, 3)`` after shardkit's train
  or eval transform and augmentation with :func:`shardkit.stream.make_loader`'s randomness),
  read by one Ray task per shard planned from the manifest and split index
  (:mod:`shardkit.ray.data`; the datasource: :mod:`shardkit.ray.datasource`).
- ``shardkit pack --engine ray``: the per-file check and the shard writes as Ray tasks, with the
  local engine's output (:class:`shardkit.packer.engines.RayEngine`, on the Ray plumbing of
  :mod:`shardkit.ray.engine`).

Importing this package does not import Ray; the functions do, and raise
:class:`~shardkit.errors.ConfigError` naming the extra when it is missing.
"""
from .data import DECODE_MODES, read_split

__all__ = ["read_split", "DECODE_MODES"]
