"""``manifest.json`` and the per-split index: the contract between the packer and every reader.

Layout (schema version 1; the full schema is in ``docs/DESIGN.md``)::

    OUT/manifest.json              written last, atomically; its presence means "dataset complete"
    OUT/splits/<split>.jsonl       one JSON object per packed sample (human- and tool-readable)
    OUT/splits/<split>.index.npz   the same as numpy arrays, what readers load (:class:`SplitIndex`)

Readers take class names, counts and sample locations from here only, never by opening a shard
in the parent process (field cases 8 and 10). ``root`` may be a local folder, a ``file://`` URL
of one (any format), or a remote fsspec URL (``http://``, ``https://``, ``s3://``; tar shards
only): :mod:`shardkit.storage.urls` tells which.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from shardkit.dataset.schema import (
    MANIFEST_NAME, RECORD_INDEX_FIELDS, check_manifest, check_record, check_split_name)
from shardkit.errors import ManifestError
from shardkit.storage.atomic import (  # re-exported: the one atomic writer lives in shardkit.storage.atomic
    atomic_write_bytes)
from shardkit.dataset.swap import finish_swap
from shardkit.storage.urls import is_url, join, local_path, read_location

__all__ = [
    "SCHEMA_VERSION", "MANIFEST_NAME", "SplitIndex", "load_manifest", "write_manifest",
    "write_split_files", "load_index", "read_split_records",
    "atomic_write_bytes", "json_bytes", "CHECKSUM_FIELD", "sample_checksum", "INDEX_HASH_FIELD",
    "RECORDS_HASH_FIELD", "MAX_MANIFEST_BYTES", "MAX_RECORD_LINE", "split_file_hash",
]

SCHEMA_VERSION = 1
INDEX_FIELDS = ("shard", "offset", "size", "label")
#: Per-sample checksum of the stored bytes: a 16-hex-digit string in ``splits/<split>.jsonl``,
#: a uint64 array in ``.index.npz`` (:attr:`SplitIndex.xxh3`). Absent in older datasets.
CHECKSUM_FIELD = "xxh3"
#: Fields of a split's manifest entry: the sha256 of ``splits/<split>.index.npz`` and of
#: ``splits/<split>.jsonl`` as pack wrote them (absent in datasets packed before they existed).
INDEX_HASH_FIELD = "index_sha256"
RECORDS_HASH_FIELD = "records_sha256"
#: Bounds on what a reader parses: ``manifest.json`` (bytes), one ``.jsonl`` line (bytes), and
#: the index bytes per sample (4 + 8 + 8 + 8 + 8 + a 255-byte key).
MAX_MANIFEST_BYTES = 128 << 20
MAX_RECORD_LINE = 1 << 20
INDEX_BYTES_PER_SAMPLE = 291

log = logging.getLogger("shardkit.manifest")


def sample_checksum(data) -> int:
    """XXH3-64 (seed 0) of ``data`` (bytes or any C-contiguous buffer: memoryview, bytearray) as
    an int in ``[0, 2**64)``: the per-sample checksum packers store and readers compare.

    From the ``xxhash`` package (python-xxhash, bindings to Yann Collet's xxHash). Chosen over
    ``zlib.crc32`` for speed: ~1.2 us vs ~16 us per 60 KB here (benchmarks/README.md), and 64
    bits. Not a cryptographic hash: it detects damage (flipped bits, truncation, a wrong
    sample), not tampering (the shards' sha256 in the manifest does that).
    """
    return xxhash.xxh3_64_intdigest(data)


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
    """Reads ``root/manifest.json`` and checks it against the schema, once, for every reader
    (:func:`shardkit.dataset.schema.check_manifest`: types and ranges of every field shardkit
    reads, split names, shard paths that stay inside ``root``). A local ``root`` that a killed
    ``pack --overwrite`` left half-swapped is rolled forward first
    (:func:`shardkit.dataset.swap.finish_swap`), so every reader finds one whole dataset.

    At most :data:`MAX_MANIFEST_BYTES` are read (a local file is not read past the bound).

    Raises:
        ManifestError: the file is missing (the dataset is not packed or a pack run did not
            finish), unreadable, over the size bound, not JSON (or nested deeper than Python's
            recursion limit), not a JSON object, of an unknown ``schema_version``, or breaks the
            schema (the message names the field and its value); a half-done swap that cannot be
            finished here (see finish_swap).
    """
    if not is_url(root):
        finish_swap(local_path(root))
    location = join(root, MANIFEST_NAME)
    try:
        data = _read_bounded(location, MAX_MANIFEST_BYTES)
    except FileNotFoundError as e:
        cause = e.__cause__  # a remote store's own words: NoSuchBucket is not NoSuchKey
        why = f" ({type(cause).__name__}: {e})" if is_url(location) and cause is not None else ""
        raise ManifestError(f"{location} not found{why}: {root} is not a finished shardkit "
                            "dataset (run `shardkit pack`; an interrupted pack leaves no "
                            "manifest)") from None
    except OSError as e:
        raise ManifestError(f"cannot read {location}: {e}") from e
    manifest = _parse_json(data, location)
    if not isinstance(manifest, dict):
        raise ManifestError(f"{location} is valid JSON but not a JSON object (found "
                            f"{type(manifest).__name__}); expected the manifest object of "
                            "docs/DESIGN.md")
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ManifestError(f"{location} has schema_version {version!r}; this shardkit reads "
                            f"{SCHEMA_VERSION}")
    check_manifest(manifest, location)
    return manifest


def _read_bounded(location: str, limit: int) -> bytes:
    """The bytes of ``location`` (:func:`read_location`), refused when over ``limit`` bytes (a
    local file is read no further than ``limit + 1`` bytes; a remote object is read whole).

    Raises:
        ManifestError: over the bound. OSError: from reading.
    """
    if is_url(location):
        data = read_location(location)
    else:
        with open(location, "rb") as f:  # read(n) allocates n bytes first: n from the size
            data = f.read(min(os.fstat(f.fileno()).st_size, limit) + 1)
    if len(data) > limit:
        raise ManifestError(f"{location} is over {limit} bytes, the most shardkit reads of this "
                            "file: it is not one that shardkit pack wrote")
    return data


def _parse_json(data: bytes, location: str, line: int | None = None):
    """``json.loads`` of UTF-8 ``data``, every failure as a ManifestError naming the file (and
    the line of a ``.jsonl`` file)."""
    where = location if line is None else f"{location} line {line}"
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ManifestError(f"{where} is not UTF-8 ({e.reason} at byte {e.start}); the file is "
                            "damaged") from None
    except RecursionError:
        raise ManifestError(f"{where}: JSON nested deeper than Python's recursion limit; the "
                            "file is damaged or crafted") from None
    except ValueError as e:  # JSONDecodeError, or an int of more than 4300 digits
        reason = getattr(e, "msg", None) or str(e)
        what = "is not JSON" if line is None else "holds a line that is not JSON"
        at = "" if line is None else f"line {line}: "
        raise ManifestError(f"{location} {what} ({at}{reason}); the file is damaged (truncated "
                            "or edited?)") from None


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


def write_split_files(root: str | os.PathLike, split: str, records: list[dict]) -> dict:
    """Writes ``splits/<split>.jsonl`` and ``splits/<split>.index.npz`` atomically.

    ``records`` are per-sample dicts in split order with at least ``key``, ``label``, ``shard``,
    ``offset``, ``size`` (see docs/DESIGN.md for the full field list) and, in every record or
    in none, ``xxh3``: the :func:`sample_checksum` of the stored bytes as 16 hex digits.

    Returns:
        ``{"index_sha256": ..., "records_sha256": ...}``: the sha256 (64 hex digits) of the two
        files as written, for the split's manifest entry (readers check them on load).

    Raises:
        ManifestError: ``split`` is not a valid split name; ``xxh3`` in some records only, or
            not 16 hex digits.
    """
    check_split_name(split)
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
    return {INDEX_HASH_FIELD: hashlib.sha256(buf.getvalue()).hexdigest(),
            RECORDS_HASH_FIELD: hashlib.sha256(lines).hexdigest()}


def _checksum_array(split: str, records: list[dict]) -> np.ndarray | None:
    """uint64 checksums of ``records`` (None when no record has one; empty for no record)."""
    have = sum(CHECKSUM_FIELD in r for r in records)
    if not records:
        return np.zeros(0, dtype=np.uint64)  # an empty split: its index is of this kind too
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


def _split_entry(root, manifest: dict | None, split: str) -> tuple[dict, dict]:
    """``(manifest, manifest["splits"][split])``, loading the manifest when None.

    Raises:
        ManifestError: ``split`` is not a split of the manifest (every split name the manifest
            holds is valid, so the files named after it stay inside ``root``).
    """
    manifest = manifest if manifest is not None else load_manifest(root)
    if split not in manifest["splits"]:
        raise ManifestError(f"split {split!r} not in {join(root, MANIFEST_NAME)}; "
                            f"available: {sorted(manifest['splits'])}")
    return manifest, manifest["splits"][split]


_LEGACY_NOTED: set[tuple[str, str]] = set()


def _check_file_hash(root, split: str, entry: dict, field: str, data: bytes,
                     location: str) -> None:
    """Compares the sha256 of ``data`` with ``entry[field]``; says once per process, root and
    split (WARNING on the ``shardkit.dataset.manifest`` logger) when the manifest has no such hash
    (a dataset packed before split-file hashes existed: its split files are not checked)."""
    want = entry.get(field)
    if want is None:
        if (str(root), split) not in _LEGACY_NOTED:
            _LEGACY_NOTED.add((str(root), split))
            log.warning("%s: the manifest records no hash of the split files of %r (packed by "
                        "an older shardkit): they are read without an integrity check; re-pack "
                        "to add one", root, split)
        return
    found = hashlib.sha256(data).hexdigest()
    if found != want:
        raise ManifestError(f"{location}: sha256 {found[:16]}... differs from the manifest's "
                            f"{field} {want[:16]}... (the file changed after pack: damaged or "
                            "edited; re-copy the dataset or re-pack it)")


def split_file_hash(root, split: str, name: str, manifest: dict | None = None
                    ) -> tuple[str, str | None]:
    """``(sha256 found, sha256 the manifest records or None)`` of split file ``name``
    (``"index"``: ``splits/<split>.index.npz``; ``"records"``: ``splits/<split>.jsonl``), for
    ``shardkit verify``. Raises ManifestError (unknown split, unreadable or oversized file)."""
    manifest, entry = _split_entry(root, manifest, split)
    field, location, limit = _split_file(root, split, name, entry)
    try:
        data = _read_bounded(location, limit)
    except OSError as e:
        raise ManifestError(f"cannot read {location}: {e}") from e
    return hashlib.sha256(data).hexdigest(), entry.get(field)


def _split_file(root, split: str, name: str, entry: dict) -> tuple[str, str, int]:
    """``(manifest hash field, location, size bound)`` of split file ``name``."""
    n = entry["num_samples"]
    if name == "index":
        return (INDEX_HASH_FIELD, join(root, f"splits/{split}.index.npz"),
                (1 << 20) + n * INDEX_BYTES_PER_SAMPLE)
    return RECORDS_HASH_FIELD, join(root, f"splits/{split}.jsonl"), n * (MAX_RECORD_LINE + 1)


def _read_split_file(root, manifest, split: str, kind: str, what: str):
    """``(manifest, split entry, location, bytes)`` of the split file ``kind`` ("index" or
    "records"), read with its size bound.

    Raises:
        ManifestError: unknown split, a file over its bound, or one that cannot be read
            (``"cannot read {what}{location}: ..."``).
    """
    manifest, entry = _split_entry(root, manifest, split)
    _, location, limit = _split_file(root, split, kind, entry)
    try:
        return manifest, entry, location, _read_bounded(location, limit)
    except OSError as e:
        raise ManifestError(f"cannot read {what}{location}: {e}") from e


def load_index(root: str | os.PathLike, split: str, manifest: dict | None = None, *,
               check_hash: bool = True) -> SplitIndex:
    """Loads the :class:`SplitIndex` of ``split`` and checks it against the manifest.

    Every array is checked before any reader sees it: the members ``shard`` (int32),
    ``offset``, ``size``, ``label`` (int64), ``key`` (``S`` of at most 255 bytes), ``xxh3``
    (uint64; required when the manifest records ``index_sha256``) are uncompressed ``.npy``
    files of shape ``(num_samples,)`` (no pickle, no object arrays, no other shape); ``label``
    lies in ``[0, len(classes))``, ``shard`` in ``[0, len(shards))``, ``size >= 1``,
    ``offset >= 0``, ``size`` within its shard's ``bytes`` (``wds``: the data
    ``[offset, offset + size)`` inside the shard, after a 512-byte header; ``hdf5``: ``offset``
    a row of the shard), keys :data:`shardkit.dataset.schema.KEY`, and each shard holds
    as many samples as the manifest says. At most ``1 MiB + 291 B * num_samples`` are read.
    Then the file's sha256 must be the manifest's ``index_sha256`` for the split (a manifest
    without one, packed before it existed, is read unchecked and said once, see
    :func:`_check_file_hash`). Cost, for the 64 MB index of 1.28 M samples here: ~0.3 s in all
    (the hash ~0.07 s, the value checks ~0.1 s; ``np.load`` alone took ~0.1 s), once per
    :class:`~shardkit.stream.ShardSource`.

    Args:
        check_hash: compare the file's sha256 with the manifest's (``shardkit verify`` turns it
            off to report the mismatch itself and go on comparing).

    Raises:
        ManifestError: unknown split, a missing, unreadable, oversized or damaged index file
            (a flipped byte: a zip CRC error or a hash mismatch), or an array that breaks the
            rules above (the message names the file, the array and the first bad entry).
    """
    manifest, entry, location, raw = _read_split_file(root, manifest, split, "index",
                                                      "split index ")
    arrays = _read_npz(raw, location, entry["num_samples"])
    missing = [f for f in (*INDEX_FIELDS, "key") if f not in arrays]
    if CHECKSUM_FIELD not in arrays and INDEX_HASH_FIELD in entry and entry["num_samples"]:
        missing.append(CHECKSUM_FIELD)  # every pack that records index hashes writes xxh3
    if missing:
        raise ManifestError(f"{location} lacks the array(s) {missing}; expected {INDEX_FIELDS} "
                            f"and 'key', and {CHECKSUM_FIELD!r} in a dataset whose manifest "
                            f"records {INDEX_HASH_FIELD}")
    index = SplitIndex(**{f: arrays[f] for f in (*INDEX_FIELDS, "key")},
                       xxh3=arrays.get(CHECKSUM_FIELD))
    _check_index_values(index, location, manifest, entry)
    if check_hash:  # after the checks, which name what is wrong in a damaged file
        _check_file_hash(root, split, entry, INDEX_HASH_FIELD, raw, location)
    return index


#: name of an index array -> its dtype as written (``key``: any ``S`` width up to 255).
_INDEX_DTYPES = {"shard": np.dtype(np.int32), "offset": np.dtype(np.int64),
                 "size": np.dtype(np.int64), "label": np.dtype(np.int64),
                 CHECKSUM_FIELD: np.dtype(np.uint64)}


def _read_npz(raw: bytes, location: str, n: int) -> dict[str, np.ndarray]:
    """The known arrays of an ``.npz`` index, each checked for dtype and shape ``(n,)`` from its
    ``.npy`` header before its data is read (never ``np.load``: no pickle, no object arrays, no
    allocation from a header's shape). Members of other names are not read."""
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            for info in zf.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else None
                if name not in (*_INDEX_DTYPES, "key"):
                    continue
                if name in arrays:
                    raise ManifestError(f"{location}: two arrays named {name!r}")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise ManifestError(f"{location}: array {name!r} is compressed; shardkit "
                                        "writes and reads uncompressed indexes (np.savez)")
                with zf.open(info) as fp:
                    arrays[name] = _read_npy(fp, info.file_size, location, name, n)
    except ManifestError:
        raise
    except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError, KeyError,
            NotImplementedError, RuntimeError) as e:
        raise ManifestError(f"cannot read split index {location}: {type(e).__name__}: {e} (the "
                            "file is damaged: re-copy the dataset or re-pack it)") from None
    return arrays


def _read_npy(fp, file_size: int, location: str, name: str, n: int) -> np.ndarray:
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    else:
        raise ManifestError(f"{location}: array {name!r} has .npy version {version}; expected "
                            "1.0 or 2.0")
    want = _INDEX_DTYPES.get(name)
    if want is not None:
        ok = dtype.kind == want.kind and dtype.itemsize == want.itemsize
    else:
        ok = dtype.kind == "S" and 1 <= dtype.itemsize <= 255
    if not ok or dtype.hasobject:
        raise ManifestError(f"{location}: array {name!r} has dtype {dtype}; expected "
                            f"{want if want is not None else 'S1..S255 (ASCII keys)'}")
    if shape != (n,):
        raise ManifestError(f"{location}: array {name!r} has shape {shape}; expected ({n},) "
                            "(the split's num_samples in the manifest)")
    count = n * dtype.itemsize
    if file_size != fp.tell() + count:
        raise ManifestError(f"{location}: array {name!r} holds {file_size - fp.tell()} data "
                            f"bytes; its header says {count}")
    data = fp.read(count)
    if len(data) != count or fp.read(1):  # reading to the end makes zipfile check the CRC
        raise ManifestError(f"{location}: array {name!r} is truncated")
    arr = np.frombuffer(data, dtype=dtype)
    return arr.astype(want) if want is not None else arr.astype(f"S{dtype.itemsize}")


_KEY_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_KEY_BYTES = np.zeros(256, dtype=bool)
_KEY_BYTES[list(_KEY_ALPHABET)] = True


def _check_index_values(index: SplitIndex, location: str, manifest: dict, entry: dict) -> None:
    """The value rules of :func:`load_index` (vectorised; one pass over each array)."""
    shards = entry["shards"]
    num_classes = len(manifest["classes"])

    def bad(name: str, mask: np.ndarray, expected: str) -> None:
        if mask.any():
            i = int(np.argmax(mask))
            raise ManifestError(f"{location}: array {name!r} has {int(mask.sum())} invalid "
                                f"of {len(index)} entries, the first at position {i} (key "
                                f"{_key_text(index.key[i])}): {getattr(index, name)[i]}; "
                                f"expected {expected}")

    bad("label", (index.label < 0) | (index.label >= num_classes),
        f"a class number in [0, {num_classes})")
    bad("shard", (index.shard < 0) | (index.shard >= len(shards)),
        f"a shard number in [0, {len(shards)}) (the split's shards in the manifest)")
    bad("size", index.size < 1, "a stored size >= 1 byte")
    bad("offset", index.offset < 0, "an offset >= 0")
    if len(index) == 0:
        return
    shard_bytes = np.array([s["bytes"] for s in shards], dtype=np.int64)[index.shard]
    bad("size", index.size > shard_bytes, "a size within its shard's bytes (manifest)")
    fmt = manifest["format"]
    if fmt == "wds":
        bad("offset", (index.offset < 512) | (index.offset > shard_bytes - index.size),
            "the data of the sample inside its tar shard: offset >= 512 (after a header) and "
            "offset + size <= the shard's bytes")
    elif fmt == "hdf5":
        rows = np.array([s["num_samples"] for s in shards], dtype=np.int64)[index.shard]
        bad("offset", index.offset >= rows, "a row of its HDF5 shard (< its num_samples)")
    keys = index.key.view(np.uint8).reshape(len(index), index.key.dtype.itemsize)
    nonzero = keys != 0  # numpy pads S values with NUL bytes at the end
    if (not nonzero[:, 0].all() or (~nonzero[:, :-1] & nonzero[:, 1:]).any()
            or index.key.tobytes().translate(None, _KEY_ALPHABET + b"\0")):  # fast, all at once
        wrong = ~nonzero[:, 0] | (~nonzero[:, :-1] & nonzero[:, 1:]).any(axis=1)  # empty; NUL
        wrong |= (nonzero & ~_KEY_BYTES[keys]).any(axis=1)  # inside; a byte outside the alphabet
        bad("key", wrong, "a sample key of 1-255 of the characters A-Z a-z 0-9 _ -")
    counts = np.bincount(index.shard, minlength=len(shards))
    for i, shard in enumerate(shards):
        if counts[i] != shard["num_samples"]:
            raise ManifestError(f"{location}: {counts[i]} samples point to shard {i} "
                                f"({shard['path']}), the manifest says {shard['num_samples']}")


def _key_text(key: bytes) -> str:
    return repr(bytes(key).decode("ascii", "backslashreplace"))


def read_split_records(root: str | os.PathLike, split: str, manifest: dict | None = None, *,
                       required: Sequence[str] = RECORD_INDEX_FIELDS) -> list[dict]:
    """All per-sample records of ``splits/<split>.jsonl`` (for tools, not for the hot path),
    each checked by :func:`shardkit.dataset.schema.check_record` (a JSON object with
    ``required``, known fields of the right type and range, labels and shard numbers in range).

    The file's hash (the manifest's ``records_sha256``) is not compared here: the records are
    metadata for tools and people, and may be edited by hand (a planted test case); readers
    take labels and locations from the index, whose hash is checked. ``shardkit verify``
    compares it (:func:`split_file_hash`) and the records with the index. Lines are at most
    :data:`MAX_RECORD_LINE` bytes (the file at most ``num_samples`` lines of that length; the
    callers compare the count with ``num_samples``).

    Raises:
        ManifestError: unknown split, a missing, unreadable or oversized file, a line that is
            too long, not UTF-8, not JSON or nested too deeply, or a record that
            breaks the schema (the message names the file, the line and the field).
    """
    manifest, entry, location, data = _read_split_file(root, manifest, split, "records", "")
    num_classes, num_shards = len(manifest["classes"]), len(entry["shards"])
    records = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        if len(line) > MAX_RECORD_LINE:
            raise ManifestError(f"{location} line {number} is {len(line)} bytes long; a record "
                                f"is at most {MAX_RECORD_LINE} (the file is damaged or crafted)")
        records.append(check_record(_parse_json(line, location, number),
                                    f"{location} line {number}", num_classes, num_shards,
                                    required))
    return records
