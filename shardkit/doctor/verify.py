"""``shardkit verify``: re-hash every shard and re-read every sample of a packed dataset.

Checks, in order, for every split listed in ``manifest.json`` (layout: ``docs/DESIGN.md``):

1. the split files agree with the manifest and with each other: ``splits/<split>.jsonl`` and the
   ``.index.npz`` have the sha256 the manifest records (``records_sha256``, ``index_sha256``; a
   dataset packed before they existed gets one ``NOTE`` line per split, no ``FAIL``), pass the
   schema checks of :func:`shardkit.dataset.manifest.load_index` and
   :func:`~shardkit.dataset.manifest.read_split_records` (each read without its hash check, so that
   a damaged file is named by what is wrong in it), list ``num_samples`` samples with distinct
   keys, hold the same ``key``, ``label``, ``shard``, ``offset``, ``size`` and ``xxh3`` for each
   sample, and each shard holds as many samples as the records that point to it;
2. every shard file exists, has the recorded size in bytes and the recorded sha256;
3. every sample is read back through :func:`shardkit.formats.open_reader` and has the recorded size
   and, where the split file has one (datasets packed since checksums exist), the recorded
   ``xxh3`` of the stored bytes (:func:`shardkit.dataset.manifest.sample_checksum`; the index's copy, which
   readers compare, must be the same); a sample stored as the original file
   (``rule == "original"``) must hash to the recorded source sha256; a normalised one (any other
   rule) must decode fully with Pillow, under the pixel limit (the ``max_pixels`` given, else
   shardkit's default; never the manifest's); in an intact ``wds`` shard every ``<key>.cls``
   member must hold the sample's label;
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
another schema, or breaking the schema: a shard path outside the folder, a field of the wrong
type; :func:`shardkit.dataset.manifest.load_manifest`) stops it: one ``Error: ManifestError: ...`` line
on stderr, exit code 2, as for ``shardkit check`` / ``stats`` / ``inspect`` (see
:mod:`shardkit.doctor.cli`).
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import click
import numpy as np

from shardkit.dataset import manifest as manifest_mod
from shardkit.storage.urls import is_url, join, local_path
from shardkit.cli_common import PROGRESS_OPTION, dataset_argument, one_line_errors, progress_default
from shardkit.errors import ManifestError, ShardkitError
from shardkit.images.sniff import open_image, resolve_max_pixels
from shardkit.dataset.manifest import CHECKSUM_FIELD, sample_checksum

__all__ = ["verify", "VerifyReport", "verify_command", "RECORD_FIELDS"]

RECORD_FIELDS = ("key", "label", "shard", "offset", "size", "sha256")
"""Fields of a ``splits/<split>.jsonl`` row that verify reads (``rule`` and ``path`` optional)."""


@dataclass
class VerifyReport:
    """Result of :func:`verify`.

    Attributes:
        root: the dataset folder. ``ok``: True when no problem was found.
        problems: one line per problem, each naming the split, shard and (when known) key.
        notes: lines that are no problem but limit what could be checked (a dataset packed
            before split-file hashes existed).
        num_shards: shards checked. ``num_samples``: samples read back and checked.
        bad_shards: shard paths (relative to root) with at least one problem.
        bad_keys: sample keys that failed.
        stored: :func:`shardkit.doctor.reading.stored_resolution` of the splits whose records
            could be read: ``max_side`` and the number of downscaled samples per split.
    """

    root: Path | str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
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
        lines = [f"NOTE {n}" for n in self.notes] + [f"FAIL {p}" for p in self.problems]
        if self.stored is not None:
            from shardkit.doctor.reading import format_stored_resolution

            lines.append(format_stored_resolution(self.stored))
        verdict = "OK" if self.ok else f"{len(self.problems)} problem(s)"
        lines.append(f"verify {self.root}: {verdict} ({self.num_shards} shards, "
                     f"{self.num_samples} samples checked)")
        return "\n".join(lines)


def _decodes(data: bytes, limit: int) -> tuple[str | None, tuple[int, int]]:
    """``(None, (width, height))`` when Pillow decodes ``data`` fully under the pixel limit
    ``limit`` (checked on the header, before decoding), else ``(error, (0, 0))``."""
    try:
        with open_image(data, limit) as im:
            im.load()
            return None, im.size
    except Exception as e:  # noqa: BLE001 - any decoder failure is the finding
        return f"{type(e).__name__}: {e}", (0, 0)


def verify(root, *, decode: bool = True, max_pixels: int | None = None,
           progress: bool = False) -> VerifyReport:
    """Verifies a packed dataset against its manifest (see the module docstring for the checks).

    Args:
        root: dataset folder (``OUT`` of ``shardkit pack``), or the fsspec URL of a ``wds``
            dataset in object storage (each shard is fetched whole into a temporary folder,
            checked, and deleted).
        decode: also decode the normalised (non-``original``) samples with Pillow.
        max_pixels: the pixel limit of that decoding (None: shardkit's default,
            :data:`shardkit.images.sniff.DEFAULT_MAX_PIXELS`); an image over it is a finding.
        progress: a tqdm bar of the shards checked, on stderr.

    Returns:
        a :class:`VerifyReport`; ``report.ok`` is True when every check holds.

    Raises:
        ManifestError: ``manifest.json`` is missing, unreadable, not a JSON object, of another
            schema version or breaks the schema (nothing can be verified).
        ConfigError: a bad ``max_pixels``.
    """
    from tqdm import tqdm

    from shardkit.doctor.reading import load_manifest_dict, stored_resolution

    limit = resolve_max_pixels(max_pixels)
    remote = is_url(root)  # a wds pack in object storage: shards fetched one by one
    root = os.fspath(root).rstrip("/") if remote else Path(local_path(root))
    man = load_manifest_dict(root)
    if remote and man["format"] != "wds":
        raise ManifestError(f"{root}: a {man['format']} dataset cannot be verified from a URL "
                            "(only wds tar shards are read remotely); download it first")
    report = VerifyReport(root=root)
    read: dict[str, list[dict]] = {}
    bar = tqdm(total=sum(len(i["shards"]) for i in man["splits"].values()), desc="verify",
               unit="shard", disable=not progress)
    for split, info in man["splits"].items():
        shards = info["shards"]
        try:
            records = manifest_mod.read_split_records(root, split, man, required=RECORD_FIELDS)
        except ShardkitError as e:
            report._fail(f"split {split!r}: {e}")
            bar.update(len(shards))  # not read: nothing to check them against
            continue
        read[split] = records
        try:  # the hash is compared below, and the index with the records
            index = manifest_mod.load_index(root, split, man, check_hash=False)
        except ShardkitError as e:
            report._fail(f"split {split!r}: {e}")
            index = None
        if index is None:  # its error is reported: the records alone
            if len(records) != info["num_samples"]:
                report._fail(f"split {split!r}: splits/{split}.jsonl has {len(records)} "
                             f"records, the manifest says {info['num_samples']}")
        elif len(records) != info["num_samples"] or len(index) != info["num_samples"]:
            report._fail(f"split {split!r}: splits/{split}.jsonl has {len(records)} records, the "
                         f"index {len(index)}, the manifest says {info['num_samples']}")
        else:
            _compare_index(report, split, records, index)
        _check_unique_keys(report, split, records)
        if sum(s["num_samples"] for s in shards) != info["num_samples"]:
            report._fail(f"split {split!r}: shards hold {sum(s['num_samples'] for s in shards)} "
                         f"samples, the manifest says {info['num_samples']}")
        _verify_shards(report, root, man, split, records, remote, decode, limit, bar)
        # last: a file changed after pack is named by what is wrong in it first
        _check_split_file_hashes(report, root, man, split, index is not None)
    bar.close()
    if not remote:
        _check_stray_shards(report, root, man)
    report.stored = stored_resolution(man, read)
    return report


def _verify_shards(report, root, man, split: str, records: list[dict], remote: bool,
                   decode: bool, limit: int, bar) -> None:
    """Checks every shard of ``split`` against ``records`` (a shard in object storage fetched
    first), one tick of the tqdm ``bar`` each."""
    from shardkit import formats

    per_shard: dict[int, list[dict]] = {}
    for rec in records:
        per_shard.setdefault(rec["shard"], []).append(rec)
    check = _verify_remote_shard if remote else _verify_shard
    for idx, shard in enumerate(man["splits"][split]["shards"]):
        report.num_shards += 1
        check(report, root, man, split, idx, shard, per_shard.get(idx, []), decode, formats,
              limit)
        bar.update(1)


SHARD_FILE = re.compile(r"[A-Za-z0-9_]+-\d{6}\.(tar|lmdb|h5)")
"""A shard's file name (:func:`shardkit.formats.base.shard_name`): what glob readers take."""


def _check_stray_shards(report, root: Path, man: dict) -> None:
    """A shard-named file in a shard folder that the manifest does not list is damage: readers
    that glob ``shards/<split>-*.tar`` (webdataset, DALI, timm's own listing) would read it."""
    listed = {s["path"] for info in man["splits"].values() for s in info["shards"]}
    folders = {posixpath.dirname(path) for path in listed} | {"shards"}
    for folder in sorted(folders):
        try:
            names = os.listdir(root / folder)
        except OSError:
            continue  # a missing folder: its shards are named missing above
        for name in sorted(names):
            rel = posixpath.join(folder, name)
            if SHARD_FILE.fullmatch(name) and rel not in listed:
                report._fail(f"{rel}: a shard file the manifest does not list (a leftover of "
                             "another pack?): readers that glob the shard folder would read it; "
                             "delete it", shard=rel)


def _check_split_file_hashes(report, root, man, split: str, index_read: bool) -> None:
    """The sha256 of the split's ``.jsonl`` and (when it could be read) ``.index.npz`` against
    the manifest's ``records_sha256`` / ``index_sha256``: a FAIL each when they differ, one NOTE
    when the manifest records none (a dataset packed before they existed)."""
    names = {"records": f"splits/{split}.jsonl", "index": f"splits/{split}.index.npz"}
    unrecorded = []
    for name, rel in names.items():
        if name == "index" and not index_read:
            continue  # its error is reported already
        try:
            found, want = manifest_mod.split_file_hash(root, split, name, man)
        except ShardkitError as e:
            report._fail(f"split {split!r}: {e}")
            continue
        if want is None:
            unrecorded.append(rel)
        elif found != want:
            report._fail(f"split {split!r}: {rel} has sha256 {found[:16]}..., the manifest "
                         f"{want[:16]}... (changed after pack: damaged or edited)")
    if unrecorded:
        report.notes.append(f"split {split!r}: the manifest records no sha256 of "
                            f"{' and '.join(unrecorded)} (packed by an older shardkit): compared "
                            "with each other and the shards only; re-pack to record them")


#: index array -> the record's value as that array holds it.
_INDEX_VS_RECORD = {
    "key": lambda index: index.key.astype("U"), "label": lambda index: index.label,
    "shard": lambda index: index.shard, "offset": lambda index: index.offset,
    "size": lambda index: index.size,
}


def _compare_index(report, split: str, records: list[dict], index) -> None:
    """Every field the index holds must be the records': ``key``, ``label``, ``shard``,
    ``offset``, ``size`` and ``xxh3`` (one FAIL per field, naming up to 5 samples)."""
    keys = [r["key"] for r in records]
    if not keys:
        return
    for name, of_index in _INDEX_VS_RECORD.items():
        ours = of_index(index)
        theirs = np.array([r[name] for r in records], dtype=ours.dtype if name != "key" else None)
        _report_differences(report, split, name, keys, ours, theirs)
    if index.xxh3 is not None:
        theirs = np.array([int(r[CHECKSUM_FIELD], 16) if CHECKSUM_FIELD in r else 0
                           for r in records], dtype=np.uint64)
        missing = np.array([CHECKSUM_FIELD not in r for r in records], dtype=bool)
        _report_differences(report, split, CHECKSUM_FIELD, keys, index.xxh3, theirs, missing,
                            show=lambda v: f"{int(v):016x}")


def _shown(value) -> str:
    return repr(value.item()) if hasattr(value, "item") else repr(value)


def _report_differences(report, split, name, keys, ours, theirs, missing=None, show=_shown
                        ) -> None:
    """One FAIL for the positions where ``ours`` (the index) differs from ``theirs`` (the
    records) or the record lacks the field (``missing``), naming up to 5 keys."""
    differ = ours != theirs
    if missing is not None:
        differ |= missing
    if not differ.any():
        return
    where = np.flatnonzero(differ)
    shown = ", ".join(f"{keys[i]!r} (index {show(ours[i])}, records "
                      f"{'none' if missing is not None and missing[i] else show(theirs[i])})"
                      for i in where[:5])
    more = f" and {len(where) - 5} more" if len(where) > 5 else ""
    report._fail(f"split {split!r}: the index and splits/{split}.jsonl differ in {name} for "
                 f"{len(where)} sample(s): {shown}{more}")
    for i in where:
        report.bad_keys.append(keys[i])


def _check_unique_keys(report, split: str, records: list[dict]) -> None:
    repeated = sorted(k for k, n in Counter(r["key"] for r in records).items() if n > 1)
    if repeated:
        report._fail(f"split {split!r}: {len(repeated)} key(s) appear more than once in "
                     f"splits/{split}.jsonl (first: {repeated[0]!r})", key=repeated[0])


def _verify_remote_shard(report, root: str, man, split, idx, shard, recs, decode, formats,
                         limit: int) -> None:
    """:func:`_verify_shard` of a shard in object storage: fetched whole into a temporary folder
    (one GET; the shards are checked one at a time, so the disk holds one), then checked there."""
    import fsspec

    url = join(root, shard["path"])
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
        _verify_shard(report, Path(tmp), man, split, idx, shard, recs, decode, formats, limit)


def _verify_shard(report, root, man, split, idx, shard, recs, decode, formats, limit: int
                  ) -> None:
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
    failures = len(report.problems)
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
                err, size = _decodes(data, limit)
                if err is not None:
                    report._fail(f"{where}: sample {key!r} ({rec.get('path')}, rule "
                                 f"{rec['rule']}) does not decode: {err}", shard=path, key=key)
                elif (problem := _downscale_problem(rec, size, man)) is not None:
                    report._fail(f"{where}: sample {key!r} ({rec.get('path')}, rule "
                                 f"{rec['rule']}) {problem}", shard=path, key=key)
    finally:
        reader.close()
    if man["format"] == "wds" and intact and len(report.problems) == failures and recs:
        _check_wds_labels(report, full, recs, where, path)


def _check_wds_labels(report, full: Path, recs: list[dict], where: str, path: str) -> None:
    """Every ``<key>.cls`` member of an intact tar shard (written unless ``--no-wds-cls``) must
    hold the records' label (what other readers of the tar, WebDataset or DALI, train on)."""
    from shardkit.formats.wds import sample_members

    try:
        members = sample_members(full, [r["key"] for r in recs], [r["offset"] for r in recs],
                                 [r["size"] for r in recs])
    except ShardkitError as e:
        report._fail(f"{where}: {e}", shard=path)
        return
    with open(full, "rb") as f:
        for rec, found in zip(recs, members):
            for name, offset, size in found:
                if name != rec["key"] + ".cls":
                    continue
                text = os.pread(f.fileno(), min(size, 32), offset)
                value = text.strip()
                if not (value.isdigit() and int(value) == rec["label"]):
                    report._fail(f"{where}: sample {rec['key']!r}: member {name} holds "
                                 f"{text[:20]!r}, the split files say label {rec['label']}",
                                 shard=path, key=rec["key"])


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


@click.command("verify")
@dataset_argument()
@click.option("--no-decode", is_flag=True, help="Skip decoding the normalised samples.")
@click.option("--max-pixels", type=click.IntRange(min=1), default=None, metavar="N",
              help="Pixel limit of that decoding [default: shardkit's, 89478485; a dataset "
              "packed with a larger --max-pixels needs it].")
@PROGRESS_OPTION
@one_line_errors
def verify_command(dataset: Path | str, no_decode: bool, max_pixels: int | None,
                   progress: bool | None) -> None:
    """Re-hash the shards of DATASET (a folder, or the URL of a wds pack in object storage)
    and check every sample against the manifest, and the timm, DALI and Hugging Face files
    beside the shards against them (shardkit.interop.check).

    Exit 0 when every check holds; 1 when damage was found (one FAIL line per problem); 2 when
    DATASET is not a readable dataset or its store cannot be reached (one "Error: ..." line on
    stderr).
    """
    from shardkit.cli_common import run_command
    from shardkit.interop.check import check_reader_files

    report = run_command(verify, dataset, decode=not no_decode, max_pixels=max_pixels,
                         progress=progress_default(progress))
    report.problems.extend(run_command(check_reader_files, dataset))  # stale reader files: damage
    click.echo(report.format_text())
    if not report.ok:
        raise SystemExit(1)
