"""What decided a dataset's stored bytes, as ``manifest.json`` records it (its ``writer`` section).

A pack records the options of its writer beside the shards it wrote, and readers rebuild from
that record instead of guessing from the shards (in the spirit of Mosaic's ``get_config`` /
``reader_from_json`` and FFCV's fields)::

    "writer": {"options": {"wds_cls": true, "wds_json": false},   # the format Writer's kwargs
               "max_side": null, "jpeg_quality": 95,             # --max-side / --jpeg-quality
               "shard_samples": null, "shard_bytes": null}       # both null: the default plan

:class:`WriterConfig` is that record as an object: :meth:`WriterConfig.to_json` gives the
section (the packer writes it), :meth:`WriterConfig.from_manifest` reads it back from a loaded
manifest (checked by :func:`shardkit.dataset.schema.check_manifest`). :mod:`shardkit.interop`
takes from it which tar members every ``wds`` sample has (:meth:`WriterConfig.tar_members`), so a
dataset packed with ``--no-wds-cls`` is answered without opening a shard.

A manifest written before the section existed still loads: :meth:`~WriterConfig.from_manifest`
then derives what the rest of the manifest says (``max_side`` and ``jpeg_quality`` from
``normalization``, the format) and leaves the rest unknown (None, ``recorded`` False); its
readers learn the members from the tar headers, as before the record existed.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardkit.errors import ManifestError

__all__ = ["WRITER_FIELD", "WDS_MEMBER_OPTIONS", "WriterConfig"]

#: The manifest's field holding the record.
WRITER_FIELD = "writer"
#: ``wds`` Writer option -> the tar member it adds after each sample's image, in tar order
#: (:class:`shardkit.formats.wds.Writer`): ``<key>.cls`` (the label), ``<key>.json``.
WDS_MEMBER_OPTIONS = {"wds_cls": "cls", "wds_json": "json"}


@dataclass(frozen=True)
class WriterConfig:
    """The writer's options of one pack: what decided the stored bytes besides the source files.

    Attributes:
        format: the manifest's ``format`` (``"wds"``, ``"lmdb"``, ``"hdf5"``).
        options: the keyword arguments the format's Writer was built with (``wds``: ``wds_cls``
            and ``wds_json``, bools; ``lmdb``: ``initial_map_size`` when given); None when not
            recorded.
        max_side: ``--max-side`` in pixels (images longer than it stored downscaled), None
            without it.
        jpeg_quality: ``--jpeg-quality`` (1-100) of the downscaled images; in an older manifest
            known only with ``max_side``.
        shard_samples: ``--shard-samples``, None when not given.
        shard_bytes: ``--shard-bytes`` in bytes, None when not given (with ``shard_samples``
            also None: the default shard plan, :class:`shardkit.packer.options.PackOptions`).
        recorded: False for a manifest without the section: the fields above are derived
            (``format``, ``max_side``, ``jpeg_quality``) or unknown (None).
    """

    format: str
    options: Mapping[str, Any] | None
    max_side: int | None = None
    jpeg_quality: int | None = None
    shard_samples: int | None = None
    shard_bytes: int | None = None
    recorded: bool = True

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``writer`` section (the format is the manifest's own ``format``)."""
        return {"options": dict(self.options or {}), "max_side": self.max_side,
                "jpeg_quality": self.jpeg_quality, "shard_samples": self.shard_samples,
                "shard_bytes": self.shard_bytes}

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> WriterConfig:
        """The record of a manifest that :func:`shardkit.dataset.manifest.load_manifest`
        returned (its section checked by the schema); for one without the section, the
        derived config with ``recorded`` False (module docstring)."""
        section = manifest.get(WRITER_FIELD)
        if section is None:
            norm = manifest.get("normalization") or {}
            return cls(manifest["format"], None, max_side=norm.get("max_side"),
                       jpeg_quality=norm.get("jpeg_quality"), recorded=False)
        return cls(manifest["format"], dict(section["options"]), section["max_side"],
                   section["jpeg_quality"], section["shard_samples"], section["shard_bytes"])

    def tar_members(self) -> tuple[str, ...] | None:
        """The extensions of the members each sample of a ``wds`` shard has after its image, in
        tar order: ``("cls",)`` for the pack default, ``()`` for ``--no-wds-cls``,
        ``("cls", "json")`` with ``--wds-json``. ``()`` for ``lmdb`` / ``hdf5`` (no tar);
        None when not recorded (learn them from the tar headers)."""
        if self.options is None:
            return None
        if self.format != "wds":
            return ()
        return tuple(ext for option, ext in WDS_MEMBER_OPTIONS.items() if self.options[option])

    def every_sample_has(self, ext: str) -> bool:
        """Whether every sample has a ``<key>.<ext>`` member (``"cls"``, ``"json"``), as
        recorded (the question :class:`shardkit.interop.shards.ShardMembers` answers from the
        tar headers).

        Raises:
            ManifestError: the manifest records no writer options (``recorded`` False).
        """
        members = self.tar_members()
        if members is None:
            raise ManifestError("the manifest records no writer options (packed before the "
                                "'writer' section existed): the shards' members are known "
                                "from their tar headers only (shardkit.interop.shards.scan)")
        return ext in members
