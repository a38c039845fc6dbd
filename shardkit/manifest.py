"""``manifest.json`` and the per-split index: the contract between the packer and every reader.

Layout (schema version 1; the full schema is in ``docs/DESIGN.md``)::

    OUT/manifest.json              written last, atomically; its presence means "dataset complete"
    OUT/splits/<split>.jsonl       one JSON object per packed sample (human- and tool-readable)
    OUT/splits/<split>.index.npz   the same as numpy arrays, what readers load (:class:`SplitIndex`)

Readers take class names, counts and sample locations from here only, never by opening a shard
in the parent process (field cases 8 and 10). ``root`` may be a local folder, a ``file://`` URL
of one (any format; :func:`local_path`), or a remote fsspec URL (``http://``, ``https://``,
``s3://``; tar shards only). :func:`is_url` is the one test of "remote URL or local".
"""
from __future__ import annotations

import functools
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import xxhash

from .errors import ManifestError
from .fsio import atomic_write_bytes  # re-exported: the one atomic writer lives in shardkit.fsio
from .swap import finish_swap

__all__ = [
    "SCHEMA_VERSION", "MANIFEST_NAME", "SplitIndex", "is_url", "local_path", "join",
    "load_manifest", "write_manifest", "write_split_files", "load_index", "read_split_records",
    "atomic_write_bytes", "json_bytes", "CHECKSUM_FIELD", "sample_checksum",
]

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
INDEX_FIELDS = ("shard", "offset", "size", "label")
#: Per-sample checksum of the stored bytes: a 16-hex-digit string in ``splits/<split>.jsonl``,
#: a uint64 array in ``.index.npz`` (:attr:`SplitIndex.xxh3`). Absent in older datasets.
CHECKSUM_FIELD = "xxh3"


def sample_checksum(data) -> int:
    """XXH3-64 (seed 0) of ``data`` (bytes or any C-contiguous buffer: memoryview, bytearray) as
    an int in ``[0, 2**64)``: the per-sample checksum packers store and readers compare.

    From the ``xxhash`` package (python-xxhash, bindings to Yann Collet's xxHash). Chosen over
    ``zlib.crc32`` for speed: ~1.2 us vs ~16 us per 60 KB here (benchmarks/README.md), and 64
    bits. Not a cryptographic hash: it detects damage (flipped bits, truncation, a wrong
    sample), not tampering (the shards' sha256 in the manifest does that).
    """
    return xxhash.xxh3_64_intdigest(data)


def is_url(root: str | os.PathLike) -> bool:
    """True when ``root`` is a remote fsspec URL (``scheme://...`` with a scheme other than
    ``file``, e.g. ``https://``, ``s3://``); False for a local path or a ``file://`` URL.

    The one test of "local or remote" in shardkit: only ``wds`` tar shards can be read from a
    remote URL; a ``file://`` root is local for every format (see :func:`local_path`).
    """
    text = os.fspath(root)
    if not isinstance(text, str):
        text = os.fsdecode(text)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and bool(scheme) and "/" not in scheme and scheme.lower() != "file"


def local_path(root: str | os.PathLike) -> str:
    """``root`` as a local path: a plain path unchanged, a ``file://`` URL decoded.

    ``file:`` URLs are read as :meth:`pathlib.Path.as_uri` writes them: ``file:///abs/path``
    (also ``file://localhost/abs/path``) with percent-encoded characters, so
    ``Path("/tmp/my data").as_uri() == "file:///tmp/my%20data"`` gives ``/tmp/my data``
    (:func:`urllib.parse.unquote`, surrogate-escaped like ``os.fsdecode`` for non-UTF-8 bytes).

    Raises:
        ManifestError: ``root`` is a remote URL (see :func:`is_url`) or a ``file://`` URL with
            a host other than ``localhost`` or without an absolute path.
    """
    text = os.fspath(root)
    if not isinstance(text, str):
        text = os.fsdecode(text)
    if is_url(text):
        raise ManifestError(f"{text} is a remote URL, not a local path")
    if text[:7].lower() != "file://":
        return text
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise ManifestError(f"{text}: expected a local file URL file:///absolute/path (as "
                            "Path.as_uri() writes it)")
    return unquote(parts.path, errors="surrogateescape")


def join(root: str | os.PathLike, rel: str) -> str:
    """Joins a relative (posix) path onto a local folder, a ``file://`` URL (the result is a
    local path, see :func:`local_path`) or a remote URL (the result is a URL)."""
    if is_url(root):
        return os.fspath(root).rstrip("/") + "/" + rel
    return str(Path(local_path(root)) / rel)


def read_location(location: str) -> bytes:
    """The bytes of a local path or of a remote fsspec URL (``https://``, ``s3://``, ...; the
    filesystem's own package must be installed, e.g. s3fs). A remote object is read with one
    GET (``cat_file``; ``fsspec.open`` would first send a HEAD for the size, and s3fs's
    ``cat_file`` does too unless ``max_concurrency=1``: a second round trip per file). Raises
    OSError (FileNotFoundError for a missing object) or the filesystem's own error."""
    return _read_bytes(location)


@functools.lru_cache(maxsize=None)
def _one_request(protocol: str) -> dict:
    """Storage options under which ``cat_file`` of a whole object is one GET: s3fs's
    ``max_concurrency=1`` (when its version has the option), else none."""
    if protocol not in ("s3", "s3a"):
        return {}
    import inspect

    import fsspec

    try:
        init = fsspec.get_filesystem_class(protocol).__init__
    except ImportError:
        return {}  # url_to_fs names the missing package
    return {"max_concurrency": 1} if "max_concurrency" in inspect.signature(init).parameters \
        else {}


def _read_bytes(location: str) -> bytes:
    if is_url(location):
        import fsspec

        protocol = location.partition("://")[0].lower()
        fs, path = fsspec.core.url_to_fs(location, **_one_request(protocol))
        return fs.cat_file(path)
    with open(location, "rb") as f:
        return f.read()


def json_bytes(obj, **kwargs) -> bytes:
    """``obj`` as UTF-8 JSON. Text is written as is (readable Unicode), except strings that are
    not valid Unicode - a file name with non-UTF-8 bytes arrives as lone surrogates
    (``os.fsdecode``) - which are escaped (``\\udce9``): still valid JSON, and
    ``os.fsencode`` of the value read back gives the original bytes."""
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, **kwargs).encode("ascii")


def load_manifest(root: str | os.PathLike) -> dict:
    """Reads and validates ``root/manifest.json``. A local ``root`` that a killed
    ``pack --overwrite`` left half-swapped is rolled forward first
    (:func:`shardkit.swap.finish_swap`), so every reader finds one whole dataset.

    Raises:
        ManifestError: the file is missing (the dataset is not packed or a pack run did not
            finish), is not JSON, not a JSON object, or has an unknown ``schema_version``; a
            half-done swap that cannot be finished here (see finish_swap).
    """
    if not is_url(root):
        finish_swap(local_path(root))
    location = join(root, MANIFEST_NAME)
    try:
        manifest = json.loads(_read_bytes(location))
    except FileNotFoundError as e:
        cause = e.__cause__  # a remote store's own words: NoSuchBucket is not NoSuchKey
        why = f" ({type(cause).__name__}: {e})" if is_url(location) and cause is not None else ""
        raise ManifestError(f"{location} not found{why}: {root} is not a finished shardkit "
                            "dataset (run `shardkit pack`; an interrupted pack leaves no "
                            "manifest)") from None
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read {location}: {e}") from e
    if not isinstance(manifest, dict):
        raise ManifestError(f"{location} is valid JSON but not a JSON object (found "
                            f"{type(manifest).__name__}); expected the manifest object of "
                            "docs/DESIGN.md")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ManifestError(f"{location} has schema_version {version!r}; this shardkit reads "
                            f"{SCHEMA_VERSION}")
    for field in ("format", "classes", "splits"):
        if field not in manifest:
            raise ManifestError(f"{location} lacks the required field {field!r}")
    return manifest


def write_manifest(root: str | os.PathLike, manifest: dict) -> None:
    """Writes ``manifest`` to ``root/manifest.json`` atomically (the last step of a pack)."""
    manifest = {"schema_version": SCHEMA_VERSION, **manifest}
    atomic_write_bytes(Path(local_path(root)) / MANIFEST_NAME,
                       json_bytes(manifest, indent=2) + b"\n")


@dataclass(frozen=True)
class SplitIndex:
    """Where every sample of one split lives, as flat numpy arrays (no per-sample Python objects,
    so forked DataLoader workers do not copy it on read; field case 16).

    Attributes (all of length ``len(self)``, in split order):
        shard: int32, index into ``manifest["splits"][split]["shards"]``.
        offset: int64, byte offset of the image data in a tar shard; row in an HDF5 shard;
            0 for LMDB.
        size: int64, stored image size in bytes.
        label: int64, class index in ``[0, len(manifest["classes"]))``.
        key: fixed-width bytes (numpy ``S``), the sample key (ASCII).
        xxh3: uint64, :func:`sample_checksum` of each sample's stored bytes; None for an index
            written before checksums existed (reads of it cannot be verified).
    """

    shard: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    label: np.ndarray
    key: np.ndarray
    xxh3: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def key_at(self, i: int) -> str:
        """The key of sample ``i`` as ``str``."""
        return self.key[i].decode("ascii")


def write_split_files(root: str | os.PathLike, split: str, records: list[dict]) -> None:
    """Writes ``splits/<split>.jsonl`` and ``splits/<split>.index.npz`` atomically.

    ``records`` are per-sample dicts in split order with at least ``key``, ``label``, ``shard``,
    ``offset``, ``size`` (see docs/DESIGN.md for the full field list) and, in every record or
    in none, ``xxh3``: the :func:`sample_checksum` of the stored bytes as 16 hex digits.

    Raises:
        ManifestError: ``xxh3`` in some records only, or not 16 hex digits.
    """
    folder = Path(local_path(root)) / "splits"
    checksums = _checksum_array(split, records)
    lines = b"".join(json_bytes(r, sort_keys=True) + b"\n" for r in records)
    atomic_write_bytes(folder / f"{split}.jsonl", lines)
    keys = [r["key"].encode("ascii") for r in records]
    arrays = {
        "shard": np.array([r["shard"] for r in records], dtype=np.int32),
        "offset": np.array([r["offset"] for r in records], dtype=np.int64),
        "size": np.array([r["size"] for r in records], dtype=np.int64),
        "label": np.array([r["label"] for r in records], dtype=np.int64),
        "key": np.array(keys, dtype=f"S{max((len(k) for k in keys), default=1)}"),
    }
    if checksums is not None:
        arrays[CHECKSUM_FIELD] = checksums
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(folder / f"{split}.index.npz", buf.getvalue())


def _checksum_array(split: str, records: list[dict]) -> np.ndarray | None:
    """uint64 checksums of ``records`` (None when no record has one)."""
    have = sum(CHECKSUM_FIELD in r for r in records)
    if have == 0:
        return None
    if have != len(records):
        raise ManifestError(f"split {split!r}: {have} of {len(records)} records have "
                            f"{CHECKSUM_FIELD!r}; expected all or none")
    values = [r[CHECKSUM_FIELD] for r in records]
    for r, v in zip(records, values):
        if not (isinstance(v, str) and re.fullmatch("[0-9a-f]{16}", v)):
            raise ManifestError(f"split {split!r}: record {r.get('key')!r} has {CHECKSUM_FIELD} "
                                f"{v!r}; expected 16 lowercase hex digits")
    return np.array([int(v, 16) for v in values], dtype=np.uint64)


def _check_split(root, manifest: dict | None, split: str) -> None:
    manifest = manifest if manifest is not None else load_manifest(root)
    if split not in manifest["splits"]:
        raise ManifestError(f"split {split!r} not in {join(root, MANIFEST_NAME)}; "
                            f"available: {sorted(manifest['splits'])}")


def load_index(root: str | os.PathLike, split: str, manifest: dict | None = None) -> SplitIndex:
    """Loads the :class:`SplitIndex` of ``split``.

    Raises:
        ManifestError: unknown split, or a missing/unreadable index file.
    """
    _check_split(root, manifest, split)
    location = join(root, f"splits/{split}.index.npz")
    try:
        with np.load(io.BytesIO(_read_bytes(location)), allow_pickle=False) as z:
            index = SplitIndex(**{name: z[name] for name in (*INDEX_FIELDS, "key")},
                               xxh3=z[CHECKSUM_FIELD] if CHECKSUM_FIELD in z.files else None)
    except (OSError, ValueError, KeyError) as e:
        raise ManifestError(f"cannot read split index {location}: {e}") from e
    expected = (manifest or load_manifest(root))["splits"][split]["num_samples"]
    if len(index) != expected:
        raise ManifestError(f"{location} lists {len(index)} samples, manifest says {expected}")
    if index.xxh3 is not None and (index.xxh3.dtype != np.uint64
                                   or index.xxh3.shape != index.label.shape):
        raise ManifestError(f"{location}: {CHECKSUM_FIELD} is {index.xxh3.dtype} "
                            f"{index.xxh3.shape}; expected uint64 ({len(index)},)")
    return index


def read_split_records(root: str | os.PathLike, split: str) -> list[dict]:
    """All per-sample records of ``splits/<split>.jsonl`` (for tools, not for the hot path)."""
    location = join(root, f"splits/{split}.jsonl")
    try:
        text = _read_bytes(location).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{location} is not UTF-8 ({e.reason} at byte {e.start}); the file "
                            "is damaged") from None
    except OSError as e:
        raise ManifestError(f"cannot read {location}: {e}") from e
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as e:
            reason = getattr(e, "msg", None) or str(e)
            raise ManifestError(f"{location} holds a line that is not JSON (line {number}: "
                                f"{reason}); the file is damaged (truncated or edited?)") from None
    return records
