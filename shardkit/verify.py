"""``shardkit verify``: re-hash every shard and re-read every sample of a packed dataset.

Checks, in order, for every split listed in ``manifest.json`` (layout: ``docs/DESIGN.md``):

1. the split files agree with the manifest: ``splits/<split>.jsonl`` and the ``.index.npz`` list
   ``num_samples`` samples, and each shard holds as many samples as the records that point to it;
2. every shard file exists, has the recorded size in bytes and the recorded sha256;
3. every sample is read back through :func:`shardkit.formats.open_reader` and has the recorded size
   and, where the split file has one (datasets packed since checksums exist), the recorded
   ``xxh3`` of the stored bytes (:func:`shardkit.manifest.sample_checksum`; the index's copy, which
   readers compare, must be the same); a sample stored as the original file
   (``rule == "original"``) must hash to the recorded source sha256; a normalised one (any other
   rule) must decode fully with Pillow;
4. samples stored downscaled (``shardkit pack --max-side N``: the rule holds ``downscaled``) must
   decode to the recorded ``width`` x ``height``, and when the manifest records N
   (``normalization.max_side``) have a longer side of N and a recorded original longer side over
   N. The report counts them per split (:func:`shardkit.doctor.reading.stored_resolution`).

A shard whose size or hash is wrong is reported, and its samples are still read (to name the
damaged keys) for the ``wds`` and ``hdf5`` formats, whose readers bound-check every access. For
``lmdb`` they are not: a corrupt LMDB B-tree page can crash the process that maps it, so only the
shard is named. Every problem names the split, the shard path and, where known, the sample key.

Damage inside the dataset (a split file that is truncated or does not match, a missing, truncated
or changed shard, a bad sample) is verify's finding: one ``FAIL`` line each, exit code 1. A
folder that is no dataset at all (``manifest.json`` missing, not JSON, not a JSON object, of
another schema) stops it: one ``Error: ManifestError: ...`` line on stderr, exit code 2, as for
``shardkit check`` / ``stats`` / ``inspect`` (see :mod:`shardkit.doctor.cli`).
"""
from __future__ import annotations

import hashlib
import io
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import click

from shardkit import manifest as manifest_mod
from shardkit.cli_errors import one_line_errors
from shardkit.errors import ManifestError, ShardkitError
from shardkit.manifest import CHECKSUM_FIELD, sample_checksum

__all__ = ["verify", "VerifyReport", "verify_command", "RECORD_FIELDS"]

RECORD_FIELDS = ("key", "shard", "offset", "size", "sha256")
"""Fields of a ``splits/<split>.jsonl`` row that verify reads (``rule`` and ``path`` optional)."""


@dataclass
class VerifyReport:
    """Result of :func:`verify`.

    Attributes:
        root: the dataset folder. ``ok``: True when no problem was found.
        problems: one line per problem, each naming the split, shard and (when known) key.
        num_shards: shards checked. ``num_samples``: samples read back and checked.
        bad_shards: shard paths (relative to root) with at least one problem.
        bad_keys: sample keys that failed.
        stored: :func:`shardkit.doctor.reading.stored_resolution` of the splits whose records
            could be read: ``max_side`` and the number of downscaled samples per split.
    """

    root: Path | str
    problems: list[str] = field(default_factory=list)
    num_shards: int = 0
    num_samples: int = 0
    bad_shards: list[str] = field(default_factory=list)
    bad_keys: list[str] = field(default_factory=list)
    stored: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def _fail(self, message: str, shard: str | None = None, key: str | None = None) -> None:
        self.problems.append(message)
        if shard is not None and shard not in self.bad_shards:
            self.bad_shards.append(shard)
        if key is not None:
            self.bad_keys.append(key)

    def format_text(self) -> str:
        """Human-readable report: one ``FAIL`` line per problem and a final verdict line."""
        lines = [f"FAIL {p}" for p in self.problems]
        if self.stored is not None:
            from shardkit.doctor.reading import format_stored_resolution

            lines.append(format_stored_resolution(self.stored))
        verdict = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        lines.append(f"verify {self.root}: {verdict} ({self.num_shards} shards, "
                     f"{self.num_samples} samples checked)")
        return "\n".join(lines)


def _decodes(data: bytes) -> tuple[str | None, tuple[int, int]]:
    """``(None, (width, height))`` when Pillow decodes ``data`` fully, else ``(error, (0, 0))``."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return None, im.size
    except Exception as e:  # noqa: BLE001 - any decoder failure is the finding
        return f"{type(e).__name__}: {e}", (0, 0)


def verify(root, *, decode: bool = True) -> VerifyReport:
    """Verifies a packed dataset against its manifest (see the module docstring for the checks).

    Args:
        root: dataset folder (``OUT`` of ``shardkit pack``), or the fsspec URL of a ``wds``
            dataset in object storage (each shard is fetched whole into a temporary folder,
            checked, and deleted).
        decode: also decode the normalised (non-``original``) samples with Pillow.

    Returns:
        a :class:`VerifyReport`; ``report.ok`` is True when every check holds.

    Raises:
        ManifestError: ``manifest.json`` is missing, unreadable, not a JSON object or of another
            schema version (nothing can be verified).
    """
    from shardkit import formats
    from shardkit.doctor.reading import load_manifest_dict, read_rows, stored_resolution

    remote = manifest_mod.is_url(root)  # a wds pack in object storage: shards fetched one by one
    root = os.fspath(root).rstrip("/") if remote else Path(manifest_mod.local_path(root))
    man = load_manifest_dict(root)
    if remote and man["format"] != "wds":
        raise ManifestError(f"{root}: a {man['format']} dataset cannot be verified from a URL "
                            "(only wds tar shards are read remotely); download it first")
    report = VerifyReport(root=root)
    read: dict[str, list[dict]] = {}
    for split, info in man["splits"].items():
        shards = info.get("shards", [])
        try:
            records = read_rows(root, split, RECORD_FIELDS)
            index = manifest_mod.load_index(root, split, man)
        except ShardkitError as e:
            report._fail(f"split {split!r}: {e}")
            continue
        read[split] = records
        if len(records) != info["num_samples"] or len(index) != info["num_samples"]:
            report._fail(f"split {split!r}: splits/{split}.jsonl has {len(records)} records, the "
                         f"index {len(index)}, the manifest says {info['num_samples']}")
        else:
            _check_index_checksums(report, split, records, index)
        if sum(s["num_samples"] for s in shards) != info["num_samples"]:
            report._fail(f"split {split!r}: shards hold {sum(s['num_samples'] for s in shards)} "
                         f"samples, the manifest says {info['num_samples']}")
        per_shard: dict[int, list[dict]] = {}
        for rec in records:
            per_shard.setdefault(int(rec["shard"]), []).append(rec)
        for extra in sorted(set(per_shard) - set(range(len(shards)))):
            report._fail(f"split {split!r}: {len(per_shard[extra])} records point to shard "
                         f"{extra}, which the manifest does not list (it has {len(shards)})",
                         key=per_shard[extra][0]["key"])
        for idx, shard in enumerate(shards):
            report.num_shards += 1
            if remote:
                _verify_remote_shard(report, root, man, split, idx, shard,
                                     per_shard.get(idx, []), decode, formats)
            else:
                _verify_shard(report, root, man, split, idx, shard, per_shard.get(idx, []),
                              decode, formats)
    report.stored = stored_resolution(man, read)
    return report


def _verify_remote_shard(report, root: str, man, split, idx, shard, recs, decode, formats
                         ) -> None:
    """:func:`_verify_shard` of a shard in object storage: fetched whole into a temporary folder
    (one GET; the shards are checked one at a time, so the disk holds one), then checked there."""
    import fsspec

    url = manifest_mod.join(root, shard["path"])
    with tempfile.TemporaryDirectory(prefix="shardkit-verify-") as tmp:
        local = Path(tmp) / shard["path"]
        local.parent.mkdir(parents=True)
        try:
            fs, path = fsspec.core.url_to_fs(url)
            fs.get_file(path, str(local))
        except FileNotFoundError:
            report._fail(f"split {split!r} shard {shard['path']}: missing (no object at {url})",
                         shard=shard["path"])
            return
        _verify_shard(report, Path(tmp), man, split, idx, shard, recs, decode, formats)


def _check_index_checksums(report, split, records, index) -> None:
    """The index's checksums (what readers compare) must be those of the split file."""
    if index.xxh3 is None:
        return
    for rec, value in zip(records, index.xxh3.tolist()):
        if rec.get(CHECKSUM_FIELD) != f"{value:016x}":
            report._fail(f"split {split!r}: sample {rec['key']!r}: splits/{split}.jsonl has "
                         f"xxh3 {rec.get(CHECKSUM_FIELD)!r}, the index {value:016x}",
                         key=rec["key"])


def _verify_shard(report, root, man, split, idx, shard, recs, decode, formats) -> None:
    from shardkit.errors import ResourceLimitError

    path = shard["path"]
    where = f"split {split!r} shard {path}"
    if len(recs) != shard["num_samples"]:
        report._fail(f"{where}: {len(recs)} records point to it, the manifest says "
                     f"{shard['num_samples']} samples", shard=path)
    full = root / path
    if not full.is_file():
        report._fail(f"{where}: missing (no file at {full})", shard=path)
        return
    size = full.stat().st_size
    intact = True
    if size != shard["bytes"]:
        report._fail(f"{where}: {size} bytes, the manifest says {shard['bytes']} (truncated or "
                     "appended to)", shard=path)
        intact = False
    else:
        digest = formats.sha256_file(full)
        if digest != shard["sha256"]:
            report._fail(f"{where}: sha256 {digest[:16]}... differs from the manifest's "
                         f"{shard['sha256'][:16]}... (bytes changed)", shard=path)
            intact = False
    if not intact and man["format"] == "lmdb":
        return  # never map a damaged LMDB file: a corrupt page can crash the process
    reader = formats.open_reader(root, man, split, idx)
    try:
        for rec in recs:
            key = rec["key"]
            try:
                data = bytes(reader.read(key, int(rec["offset"]), int(rec["size"])))
            except ResourceLimitError:
                raise  # the OS is out of open files or memory: nothing was found damaged
            except ShardkitError as e:
                report._fail(f"{where}: sample {key!r}: {e}", shard=path, key=key)
                continue
            except Exception as e:  # noqa: BLE001 - a damaged shard may fail in the library
                report._fail(f"{where}: sample {key!r} unreadable: {type(e).__name__}: {e}",
                             shard=path, key=key)
                continue
            report.num_samples += 1
            if len(data) != int(rec["size"]):
                report._fail(f"{where}: sample {key!r} has {len(data)} bytes, the index says "
                             f"{rec['size']}", shard=path, key=key)
            elif (CHECKSUM_FIELD in rec
                  and (found := f"{sample_checksum(data):016x}") != rec[CHECKSUM_FIELD]):
                report._fail(f"{where}: sample {key!r} ({rec.get('path')}) xxh3 {found} differs "
                             f"from the recorded {rec[CHECKSUM_FIELD]} (stored bytes changed)",
                             shard=path, key=key)
            elif rec.get("rule", "original") == "original":
                digest = hashlib.sha256(data).hexdigest()
                if digest != rec["sha256"]:
                    report._fail(f"{where}: sample {key!r} ({rec.get('path')}) sha256 "
                                 f"{digest[:16]}... differs from the source's "
                                 f"{rec['sha256'][:16]}...",
                                 shard=path, key=key)
            elif decode:
                err, size = _decodes(data)
                if err is not None:
                    report._fail(f"{where}: sample {key!r} ({rec.get('path')}, rule "
                                 f"{rec['rule']}) does not decode: {err}", shard=path, key=key)
                elif (problem := _downscale_problem(rec, size, man)) is not None:
                    report._fail(f"{where}: sample {key!r} ({rec.get('path')}, rule "
                                 f"{rec['rule']}) {problem}", shard=path, key=key)
    finally:
        reader.close()


def _downscale_problem(rec: dict, size: tuple[int, int], man: dict) -> str | None:
    """What is wrong with a downscaled sample decoding to ``size`` (None: nothing, or the
    sample is not downscaled)."""
    from shardkit.doctor.reading import is_downscaled

    if not is_downscaled(rec):
        return None
    recorded = (int(rec.get("width", -1)), int(rec.get("height", -1)))
    if size != recorded:
        return (f"decodes to {size[0]}x{size[1]}, the split file says "
                f"{recorded[0]}x{recorded[1]}")
    max_side = (man.get("normalization") or {}).get("max_side")
    original = max(int(rec.get("original_width", 0)), int(rec.get("original_height", 0)))
    if max_side is not None and (max(size) != max_side or original <= max_side):
        return (f"is stored at {size[0]}x{size[1]} from an original longer side of {original} "
                f"px; --max-side {max_side} gives a longer side of {max_side} from one over it")
    return None


def _dataset_arg(ctx, param, value):
    from shardkit.doctor.cli import dataset_arg  # late: it imports every doctor command

    return dataset_arg(ctx, param, value)


@click.command("verify")
@click.argument("root", callback=_dataset_arg)
@click.option("--no-decode", is_flag=True, help="Skip decoding the normalised samples.")
@one_line_errors
def verify_command(root: Path, no_decode: bool) -> None:
    """Re-hash the shards of ROOT (a folder, or the URL of a wds pack in object storage) and
    check every sample against the manifest, and the timm, DALI and Hugging Face files beside
    the shards against them (shardkit.interop.check).

    Exit 0 when every check holds; 1 when damage was found (one FAIL line per problem); 2 when
    ROOT is not a readable dataset or its store cannot be reached (one "Error: ..." line on
    stderr).
    """
    from shardkit.doctor.cli import run_command
    from shardkit.interop.check import check_reader_files

    report = run_command(verify, root, decode=not no_decode)
    report.problems.extend(run_command(check_reader_files, root))  # stale reader files: damage
    click.echo(report.format_text())
    if not report.ok:
        raise SystemExit(1)
