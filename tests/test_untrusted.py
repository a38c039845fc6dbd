"""A dataset folder is untrusted input: crafted or damaged metadata is refused where it is loaded.

Each probe damages a copy of the embedded sample packed as wds (or a small dataset built here)
and asserts the exact refusal: the loader and the Python API raise ManifestError naming the file
and the field; every command ends with one ``Error: ManifestError: ...`` line and exit 2 (or,
for ``verify``, a FAIL line and exit 1 when the damage is inside the split files), never a
traceback, and nothing is read or written outside the dataset folder.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import SAMPLE, png_chunk
from shardkit.cli import main
from shardkit.errors import DecodeError, ManifestError, PixelLimitError
from shardkit.formats import wds
from shardkit.images.sniff import DEFAULT_MAX_PIXELS, open_image
from shardkit.dataset.manifest import (
    load_index, load_manifest, read_split_records, sample_checksum, write_manifest,
    write_split_files)
from shardkit.stream.source import ShardSource
from shardkit.doctor.verify import verify

SPLIT = "val"  # 30 samples in one shard of the packed sample


@pytest.fixture()
def ds(packed_sample, tmp_path) -> Path:
    """A fresh copy of the sample packed as wds, at tmp_path/ds (tmp_path/outside is beside)."""
    root = tmp_path / "ds"
    shutil.copytree(packed_sample("wds"), root)
    return root


def edit_manifest(root: Path, change) -> None:
    man = json.loads((root / "manifest.json").read_text())
    change(man)
    (root / "manifest.json").write_text(json.dumps(man))


def rewrite_index(root: Path, split: str, change, rehash: bool = True) -> None:
    """Rewrites ``splits/<split>.index.npz`` with ``change(arrays)`` applied; with ``rehash`` the
    manifest's index_sha256 is updated to match (a consistent edit, as a crafted dataset is)."""
    path = root / "splits" / f"{split}.index.npz"
    with np.load(path) as z:
        arrays = {name: z[name].copy() for name in z.files}
    change(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())
    if rehash:
        digest = hashlib.sha256(buf.getvalue()).hexdigest()
        edit_manifest(root, lambda m: m["splits"][split].update(index_sha256=digest))


def one_error_line(args: list[str]) -> str:
    """Runs the command line; asserts exit 2, one ``Error:`` line on stderr, nothing on stdout
    and no traceback; returns the line."""
    res = CliRunner().invoke(main, args)
    where = f"{args[0]}: exit {res.exit_code}\n{res.output}"
    assert res.exit_code == 2, where
    assert res.exception is None or isinstance(res.exception, SystemExit), where
    assert "Traceback" not in res.output, where
    (line,) = res.stderr.splitlines()
    assert line.startswith("Error: ") and res.stdout == "", where
    return line


def commands(root: Path, tmp_path: Path, split: str = SPLIT) -> dict[str, list[str]]:
    return {
        "verify": ["verify", str(root)],
        "check": ["check", str(root), "--no-transforms", "--no-near-duplicates"],
        "stats": ["stats", str(root), "--split", split, "--no-save"],
        "inspect": ["inspect", str(root), "--split", split, "--n", "2", "--out",
                    str(tmp_path / "grids")],
        "export": ["export", str(root)],
        "cache build": ["cache", "build", str(root), "--split", split, "--cache",
                        f"disk:{tmp_path / 'cache'}", "--num-workers", "0", "--no-progress"],
    }


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ 1: paths outside the dataset
def _absolute_shard(root: Path, outside: Path) -> str:
    path = str(outside / "val-000000.tar")
    edit_manifest(root, lambda m: m["splits"][SPLIT]["shards"][0].update(path=path))
    return "splits['val'].shards[0].path"


def _dotdot_shard(root: Path, outside: Path) -> str:
    edit_manifest(root, lambda m: m["splits"][SPLIT]["shards"][0].update(
        path="../outside/val-000000.tar"))
    return "splits['val'].shards[0].path"


def _inner_dotdot_shard(root: Path, outside: Path) -> str:
    edit_manifest(root, lambda m: m["splits"][SPLIT]["shards"][0].update(
        path="shards/../../outside/val-000000.tar"))
    return "splits['val'].shards[0].path"


def _dotdot_split(root: Path, outside: Path) -> str:
    """A split named ../outside/val: its files would be splits/../outside/val.jsonl."""
    (outside / "val.jsonl").write_bytes((root / "splits" / "val.jsonl").read_bytes())
    (outside / "val.index.npz").write_bytes((root / "splits" / "val.index.npz").read_bytes())
    edit_manifest(root, lambda m: m["splits"].update({"../outside/val":
                                                      m["splits"].pop(SPLIT)}))
    return "split name \"../outside/val\""


ESCAPES = {"absolute shard path": _absolute_shard, "../ shard path": _dotdot_shard,
           "shards/../../ shard path": _inner_dotdot_shard, "../ split name": _dotdot_split}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_paths_outside_the_dataset_are_refused_naming_the_entry(ds, tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    # a real shard outside: before the fix every reader read it, and export wrote a .idx beside it
    shutil.copy(ds / "shards" / "val-000000.tar", outside / "val-000000.tar")
    field = ESCAPES[case](ds, outside)
    before = tree(outside)
    with pytest.raises(ManifestError, match="expected a relative path inside the dataset folder"
                       if "shard" in case else "is not a valid split name") as e:
        load_manifest(ds)
    assert field in str(e.value) and str(ds / "manifest.json") in str(e.value)
    with pytest.raises(ManifestError, match="inside the dataset folder|not a valid split name"):
        ShardSource(ds, SPLIT)
    for name, args in commands(ds, tmp_path).items():
        line = one_error_line(args)
        assert line.startswith("Error: ManifestError: ") and field in line, (name, line)
    assert tree(outside) == before  # nothing written (no .idx) beside the foreign shard
    assert not (tmp_path / "cache").exists() and not (tmp_path / "grids").exists()


def test_a_symlinked_shards_folder_inside_the_dataset_is_followed(ds, tmp_path):
    """The documented choice: containment is lexical, so a shards folder the user moved to
    another disk and linked back keeps working."""
    moved = tmp_path / "other-disk" / "shards"
    moved.parent.mkdir()
    shutil.move(ds / "shards", moved)
    (ds / "shards").symlink_to(moved, target_is_directory=True)
    assert verify(ds, decode=False).ok
    assert len(ShardSource(ds, SPLIT)) == 30


# ------------------------------------------------------------------ 2: the reader's pixel limit
def huge_png(side: int = 20000) -> bytes:
    """A valid 1-bit grayscale PNG of side x side pixels (all black), ~50 KB: small bytes, huge
    header."""
    row = b"\x00" + bytes((side + 7) // 8)
    body = zlib.compress(row * side, 9)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0,
                                                                  0, 0))
            + png_chunk(b"IDAT", body) + png_chunk(b"IEND", b""))


def build_dataset(out: Path, images: list[tuple[bytes, str]], classes=("a", "b"),
                  max_pixels: int | None = None) -> list[dict]:
    """A wds dataset of one split ``train`` with the given ``(bytes, ext)`` images, written with
    the formats API (as pack writes it, with split-file hashes), labels alternating."""
    (out / "shards").mkdir(parents=True)
    writer = wds.Writer(out / "shards" / "train-000000.tar", wds_cls=True)
    records = []
    for i, (data, ext) in enumerate(images):
        key = f"train_{i:08d}"
        offset = writer.add(key, data, ext, i % len(classes))
        records.append({"key": key, "label": i % len(classes), "shard": 0, "offset": offset,
                        "size": len(data), "ext": ext, "sha256": hashlib.sha256(data).hexdigest(),
                        "rule": "original" if ext == "jpg" else "png",
                        "xxh3": f"{sample_checksum(data):016x}", "path": f"{key}.{ext}"})
    writer.close()
    tar = out / "shards" / "train-000000.tar"
    shard = {"path": "shards/train-000000.tar", "num_samples": len(images),
             "bytes": tar.stat().st_size, "sha256": hashlib.sha256(tar.read_bytes()).hexdigest()}
    hashes = write_split_files(out, "train", records)
    write_manifest(out, {"format": "wds", "classes": list(classes),
                         "normalization": {"max_pixels": max_pixels},
                         "splits": {"train": {"num_samples": len(images), "shards": [shard],
                                              **hashes}}})
    return records


@pytest.fixture()
def bomb(tmp_path) -> tuple[Path, str]:
    """Five real photos and one 20000 x 20000 PNG, in a dataset whose manifest claims
    ``normalization.max_pixels: 10**10`` (the crafted value that lifted the limit)."""
    photos = sorted(SAMPLE.glob("*/*.jpg"))[:5]
    images = [(p.read_bytes(), "jpg") for p in photos[:3]] + [(huge_png(), "png")] + \
        [(p.read_bytes(), "jpg") for p in photos[3:]]
    root = tmp_path / "bomb"
    build_dataset(root, images, max_pixels=10 ** 10)
    return root, "train_00000003"


def test_the_header_of_the_crafted_png_is_refused_before_decoding():
    data = huge_png()
    assert len(data) < 100_000
    with pytest.raises(PixelLimitError) as e:
        open_image(data)
    assert (e.value.width, e.value.height, e.value.max_pixels) == (20000, 20000,
                                                                   DEFAULT_MAX_PIXELS)


def test_a_manifest_cannot_lift_the_readers_pixel_limit(bomb):
    root, key = bomb
    assert load_manifest(root)["normalization"]["max_pixels"] == 10 ** 10
    src = ShardSource(root, "train")
    assert src.max_pixels == DEFAULT_MAX_PIXELS and src.packed_max_pixels == 10 ** 10
    assert src.decoder().max_pixels == DEFAULT_MAX_PIXELS
    with pytest.raises(DecodeError) as e:
        src.decode(src.read(3), 3)
    text = str(e.value)
    assert f"{key!r}" in text and f"20000x20000 = 400000000 pixels is over the limit " \
        f"max_pixels={DEFAULT_MAX_PIXELS}" in text
    assert "packed with --max-pixels 10000000000: pass max_pixels=10000000000" in text
    assert ShardSource(root, "train", max_pixels=10 ** 9).max_pixels == 10 ** 9  # the caller's


def test_verify_reports_the_over_limit_image(bomb):
    root, key = bomb
    report = verify(root)
    assert report.bad_keys == [key] and len(report.problems) == 1
    assert "does not decode: PixelLimitError: image of 20000x20000" in report.problems[0]


_SKIP_RUN = """
import resource, sys
from shardkit import make_loader
loader = make_loader(sys.argv[1], "train", 2, train=False, image_size=32, num_workers=0,
                     on_error=sys.argv[2])
print("before_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
try:
    n = sum(len(images) for images, _ in loader)
    print("samples", n, "skipped", ",".join(loader.skipped))
except Exception as e:
    print("error", type(e).__name__, e)
print("maxrss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_the_loader_skips_or_names_the_over_limit_image_without_decoding_it(bomb, on_error):
    """In a process of its own, to measure its peak memory: the 400-megapixel image took the
    reader's peak from ~0.96 GB (after imports) to 5.3 GB when the manifest set the limit (and
    was not skipped); refused on its header, reading the split adds under 300 MB to the peak
    (the RGB array of that one image alone would be 1.2 GB)."""
    root, key = bomb
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", _SKIP_RUN, str(root), on_error],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    if on_error == "skip":
        assert out["samples"] == f"5 skipped {key}"
    else:
        assert out["error"].startswith("DecodeError ") and f"{key!r}" in out["error"]
        assert "over the limit" in out["error"] and "pass max_pixels=10000000000" in out["error"]
    assert int(out["maxrss_kb"]) - int(out["before_kb"]) < 300_000, out


# ------------------------------------------------------------------ 3: malformed manifest fields
def _set(path: list, value):
    def change(m):
        node = m
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


def _delete(path: list):
    def change(m):
        node = m
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
    return change


SHARD0 = ["splits", SPLIT, "shards", 0]
MALFORMED = {
    "classes a str": (_set(["classes"], "abcde"),
                      'field classes is "abcde" (str); expected an array'),
    "classes empty": (_set(["classes"], []), "expected at least one class name"),
    "class repeated": (_set(["classes"], ["daisy", "roses", "daisy", "a", "b"]),
                       "field classes[2] is \"daisy\" (str); expected distinct class names"),
    "class not a str": (_set(["classes", 1], 7), "field classes[1] is 7 (int); expected a "
                        "non-empty str"),
    "num_samples a str": (_set(["splits", SPLIT, "num_samples"], "30"),  # the right count
                          "field splits['val'].num_samples is \"30\" (str); expected an int in "
                          "[0, 1099511627776]"),
    "num_samples negative": (_set(["splits", SPLIT, "num_samples"], -1),
                             "field splits['val'].num_samples is -1 (int)"),
    "num_samples true": (_set(["splits", SPLIT, "num_samples"], True),
                         "field splits['val'].num_samples is true (bool)"),
    "num_samples huge": (_set(["splits", SPLIT, "num_samples"], 10 ** 30),
                         "expected an int in [0, 1099511627776]"),
    "num_samples missing": (_delete(["splits", SPLIT, "num_samples"]),
                            "required field splits['val'].num_samples is missing"),
    "split null": (_set(["splits", SPLIT], None),
                   "field splits['val'] is null (null); expected an object"),
    "splits a list": (_set(["splits"], [1, 2]), "field splits is [1, 2] (array); expected an "
                      "object"),
    "splits missing": (_delete(["splits"]), "required field splits is missing"),
    "shards not a list": (_set(["splits", SPLIT, "shards"], "shards/val-000000.tar"),
                          "field splits['val'].shards is \"shards/val-000000.tar\" (str); "
                          "expected an array"),
    "shard null": (_set(SHARD0, None), "field splits['val'].shards[0] is null (null); expected "
                   "an object"),
    "shard path missing": (_delete([*SHARD0, "path"]),
                           "required field splits['val'].shards[0].path is missing"),
    "shard path a number": (_set([*SHARD0, "path"], 3), "shards[0].path is 3 (int)"),
    "shard path with a backslash": (_set([*SHARD0, "path"], "shards\\val-000000.tar"),
                                    "expected a relative path inside the dataset folder"),
    "shard bytes a str": (_set([*SHARD0, "bytes"], "big"),
                          "field splits['val'].shards[0].bytes is \"big\" (str)"),
    "shard sha256 short": (_set([*SHARD0, "sha256"], "abc"),
                           "shards[0].sha256 is \"abc\" (str); expected 64 lowercase hex"),
    "shard listed twice": (lambda m: m["splits"]["test"]["shards"].append(
        dict(m["splits"][SPLIT]["shards"][0])),
        "expected a path of its own (also splits['val'].shards[0])"),
    "format unknown": (_set(["format"], "zip"), "field format is \"zip\" (str); expected one "
                       "of ['hdf5', 'lmdb', 'wds']"),
    "schema_version true": (_set(["schema_version"], True), "has schema_version True"),
    "index hash not hex": (_set(["splits", SPLIT, "index_sha256"], 5),
                           "field splits['val'].index_sha256 is 5 (int); expected 64"),
    "max_pixels a str": (_set(["normalization", "max_pixels"], "many"),
                         "field normalization.max_pixels is \"many\" (str)"),
    "class_counts short": (_set(["splits", SPLIT, "class_counts"], [1, 2]),
                           "expected 5 counts, one per class"),
    "stats mean of 2": (_set(["stats"], {SPLIT: {"mean": [0.5, 0.5], "std": [1, 1, 1]}}),
                        "field stats['val'].mean is [0.5, 0.5] (array); expected 3 numbers"),
    "hue classes a list": (_set(["stats"], {SPLIT: {"hue": {"classes": [1]}}}),
                           "field stats['val'].hue.classes is [1] (array); expected an object"),
    "degenerate not a list": (_set(["source", "degenerate"], {"a": 1}),
                              "field source.degenerate is {\"a\": 1} (object); expected an "
                              "array"),
    "near duplicates a str": (_set(["split", "near_duplicates"], "merge"),
                              "field split.near_duplicates is \"merge\" (str); expected an "
                              "object or null"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_each_malformed_manifest_field_is_named(ds, tmp_path, case):
    change, needle = MALFORMED[case]
    edit_manifest(ds, change)
    with pytest.raises(ManifestError) as e:
        load_manifest(ds)
    assert needle in str(e.value) and str(ds / "manifest.json") in str(e.value)
    for name, args in commands(ds, tmp_path).items():
        if name in ("verify", "stats"):  # the others read the manifest the same way
            line = one_error_line(args)
            assert line.startswith("Error: ManifestError: ") and needle in line, (name, line)


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000, "JSON nested deeper than Python's recursion limit"),
    ('{"schema_version": 1, "format": "wds", "classes": ["a"], "splits": {}} trailing',
     "is not JSON (Extra data)"),
    ('{"schema_version": 1, "format": "wds", "classes": ["a"], "splits": {}}',
     "field splits is {} (object); expected at least one split"),
    ('{"schema_version": 1, "n": ' + "9" * 5000 + "}", "is not JSON (Exceeds the limit"),
])
def test_manifest_text_that_is_no_manifest_is_one_error(ds, tmp_path, text, needle):
    (ds / "manifest.json").write_text(text)
    with pytest.raises(ManifestError, match=None) as e:
        load_manifest(ds)
    assert needle in str(e.value)
    assert needle in one_error_line(commands(ds, tmp_path)["verify"])


def test_the_manifest_is_read_up_to_its_bound(ds, monkeypatch):
    from shardkit.dataset import manifest as manifest_mod

    size = (ds / "manifest.json").stat().st_size
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", size - 1)
    with pytest.raises(ManifestError, match=f"manifest.json is over {size - 1} bytes"):
        load_manifest(ds)
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", size)
    assert load_manifest(ds)["format"] == "wds"


# ------------------------------------------------------------------ 3: a damaged split index
def test_every_flipped_byte_of_the_index_is_refused(ds):
    """Every one of the index's bytes, flipped in turn: never a BadZipFile or other traceback,
    never an index that loads (the zip CRCs catch most, the manifest's index_sha256 the rest)."""
    path = ds / "splits" / f"{SPLIT}.index.npz"
    good = path.read_bytes()
    man = load_manifest(ds)
    kinds = set()
    for pos in range(len(good)):
        path.write_bytes(good[:pos] + bytes([good[pos] ^ 0x01]) + good[pos + 1:])
        with pytest.raises(ManifestError) as e:
            load_index(ds, SPLIT, man)
        assert str(path) in str(e.value)
        kinds.add("sha256" if "index_sha256" in str(e.value) else "checks")
    assert kinds == {"sha256", "checks"}
    path.write_bytes(good)
    assert len(load_index(ds, SPLIT, man)) == 30


def test_a_flipped_index_byte_is_one_line_in_every_command(ds, tmp_path):
    path = ds / "splits" / f"{SPLIT}.index.npz"
    data = bytearray(path.read_bytes())
    data[200] ^= 0x01  # in the data of the first array (shard numbers)
    path.write_bytes(bytes(data))
    message = f"cannot read split index {path}: BadZipFile: Bad CRC-32 for file 'shard.npy'"
    for name, args in commands(ds, tmp_path).items():
        if name == "verify":
            res = CliRunner().invoke(main, args)
            assert res.exit_code == 1 and "Traceback" not in res.output
            (fail,) = [ln for ln in res.stdout.splitlines() if ln.startswith("FAIL ")]
            assert fail.startswith(f"FAIL split 'val': {message}"), fail
        elif name not in ("export", "check"):  # these two do not read the index
            line = one_error_line(args)
            assert line.startswith(f"Error: ManifestError: {message}"), line


N = 30
INDEX_DAMAGE = {
    "label 99": (lambda a: a["label"].__setitem__(3, 99),
                 "array 'label' has 1 invalid of 30 entries, the first at position 3 (key "
                 "'val_00000003'): 99; expected a class number in [0, 5)"),
    "label -1": (lambda a: a["label"].__setitem__(0, -1), "array 'label' has 1 invalid"),
    "shard 7": (lambda a: a["shard"].__setitem__(5, 7),
                "'shard' has 1 invalid of 30 entries, the first at position 5 (key "
                "'val_00000005'): 7; expected a shard number in [0, 1)"),
    "offset negative": (lambda a: a["offset"].__setitem__(1, -512),
                        "array 'offset' has 1 invalid"),
    "offset past the shard": (lambda a: a["offset"].__setitem__(1, 10 ** 12),
                              "expected the data of the sample inside its tar shard"),
    "size huge": (lambda a: a["size"].__setitem__(2, 10 ** 15),
                  "expected a size within its shard's bytes"),
    "size zero": (lambda a: a["size"].__setitem__(2, 0), "expected a stored size >= 1 byte"),
    "key with a slash": (lambda a: a["key"].__setitem__(4, b"../etc/x"),
                         "'key' has 1 invalid of 30 entries, the first at position 4 (key "
                         "'../etc/x')"),
    "one entry too many": (lambda a: a.update(label=np.append(a["label"], 0)),
                           "array 'label' has shape (31,); expected (30,)"),
    "labels as text": (lambda a: a.update(label=a["label"].astype("U3")),
                       "array 'label' has dtype <U3; expected int64"),
    "labels as float": (lambda a: a.update(label=a["label"].astype(np.float64)),
                        "array 'label' has dtype float64; expected int64"),
    "labels as objects": (lambda a: a.update(label=a["label"].astype(object)),
                          "array 'label' has dtype object; expected int64"),
    "offsets 2-d": (lambda a: a.update(offset=np.stack([a["offset"], a["offset"]])),
                    "array 'offset' has shape (2, 30); expected (30,)"),
    "no label": (lambda a: a.pop("label"), "lacks the array(s) ['label']"),
    "no checksums": (lambda a: a.pop("xxh3"), "lacks the array(s) ['xxh3']"),
}


@pytest.mark.parametrize("case", sorted(INDEX_DAMAGE))
def test_index_entries_out_of_range_are_refused_even_with_a_matching_hash(ds, tmp_path, case):
    """``labels as objects``: np.savez writes an object array as a pickle; it is refused from
    its .npy header, never unpickled."""
    change, needle = INDEX_DAMAGE[case]
    rewrite_index(ds, SPLIT, change)
    with pytest.raises(ManifestError) as e:
        load_index(ds, SPLIT)
    assert needle in str(e.value) and f"{SPLIT}.index.npz" in str(e.value)
    with pytest.raises(ManifestError, match="index.npz"):
        ShardSource(ds, SPLIT)
    line = one_error_line(commands(ds, tmp_path)["stats"])
    assert line.startswith("Error: ManifestError: ") and needle in line


def test_an_index_header_claiming_a_huge_shape_is_refused_without_allocating(ds):
    """A .npy header of shape (10**12,) in an index whose manifest also says 10**12 samples (the
    bound of 2**40): refused from the member sizes, no MemoryError."""
    path = ds / "splits" / f"{SPLIT}.index.npz"
    n = 10 ** 12
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, dtype in (("shard", "<i4"), ("offset", "<i8"), ("size", "<i8"),
                            ("label", "<i8"), ("key", "|S14"), ("xxh3", "<u8")):
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False,
                                                          "shape": (n,)})
            zf.writestr(f"{name}.npy", header.getvalue() + b"\0" * 64)
    path.write_bytes(buf.getvalue())
    edit_manifest(ds, lambda m: m["splits"][SPLIT].update(num_samples=n))
    with pytest.raises(ManifestError, match=r"holds 64 data bytes; its header says 4000000000000"):
        load_index(ds, SPLIT, check_hash=False)


def test_a_changed_label_is_caught_by_the_index_hash_and_by_verify(ds):
    """A label moved to another valid class (in range, so only the hash and the records tell):
    readers refuse the index; verify names the sample, the index and the records."""
    records = read_split_records(ds, SPLIT)
    old = records[3]["label"]
    new = (old + 1) % 5
    rewrite_index(ds, SPLIT, lambda a: a["label"].__setitem__(3, new), rehash=False)
    with pytest.raises(ManifestError, match=r"val.index.npz: sha256 [0-9a-f]{16}\.\.\. differs "
                       r"from the manifest's index_sha256"):
        load_index(ds, SPLIT)
    with pytest.raises(ManifestError, match="index_sha256"):
        ShardSource(ds, SPLIT)
    report = verify(ds, decode=False)
    key = records[3]["key"]
    assert report.bad_keys == [key]
    assert any(f"splits/{SPLIT}.index.npz has sha256" in p for p in report.problems)
    assert f"split 'val': the index and splits/val.jsonl differ in label for 1 sample(s): " \
        f"{key!r} (index {new}, records {old})" in report.problems


def test_label_99_is_refused_by_the_loader_and_named_by_verify(ds):
    """The probe of the field report: label 99 in a 5-class dataset, the manifest's hash
    rewritten to match. The loader refused to start; verify says which sample."""
    from shardkit import make_loader

    rewrite_index(ds, SPLIT, lambda a: a["label"].__setitem__(3, 99))
    with pytest.raises(ManifestError, match="99; expected a class number in \\[0, 5\\)"):
        make_loader(ds, SPLIT, 8, train=False, num_workers=0)
    res = CliRunner().invoke(main, ["verify", str(ds), "--no-decode"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "FAIL split 'val': " in res.stdout and "(key 'val_00000003'): 99" in res.stdout


def test_an_index_stripped_of_its_checksums_is_refused(ds):
    """Before, such an index verified OK and was then read unchecked."""
    rewrite_index(ds, SPLIT, lambda a: a.pop("xxh3"), rehash=False)
    with pytest.raises(ManifestError, match="lacks the array\\(s\\) \\['xxh3'\\]"):
        ShardSource(ds, SPLIT)
    report = verify(ds, decode=False)
    assert any("lacks the array(s) ['xxh3']" in p for p in report.problems)


def test_verify_finds_index_damage_that_keeps_every_range(ds):
    """Two entries of the index pointing at one sample (ranges, per-shard counts and dtypes all
    valid; the hash rewritten): verify compares the index with the records."""
    index = load_index(ds, SPLIT)
    rewrite_index(ds, SPLIT, lambda a: a.update(
        offset=np.where(np.arange(N) == 1, a["offset"][0], a["offset"]),
        size=np.where(np.arange(N) == 1, a["size"][0], a["size"])))
    assert len(load_index(ds, SPLIT)) == N  # every range holds
    report = verify(ds, decode=False)
    key = index.key_at(1)
    assert f"differ in offset for 1 sample(s): {key!r} (index {int(index.offset[0])}, records " \
        f"{int(index.offset[1])})" in "\n".join(report.problems)
    assert any("differ in size" in p for p in report.problems)


def test_a_dataset_packed_before_split_hashes_is_read_and_said_once(ds, caplog):
    """Backwards compatibility: a manifest without index_sha256/records_sha256 (packed by the
    earlier shardkit) is read, with one warning per split; verify prints a NOTE, exit 0."""
    import logging

    def strip(m):
        for entry in m["splits"].values():
            del entry["index_sha256"], entry["records_sha256"]
    edit_manifest(ds, strip)
    with caplog.at_level(logging.WARNING, logger="shardkit.manifest"):
        load_index(ds, SPLIT)
        ShardSource(ds, SPLIT)
    notes = [r.getMessage() for r in caplog.records if r.name == "shardkit.manifest"]
    assert len(notes) == 1 and "records no hash of the split files of 'val'" in notes[0]
    res = CliRunner().invoke(main, ["verify", str(ds), "--no-decode"])
    assert res.exit_code == 0, res.output
    assert "NOTE split 'val': the manifest records no sha256 of splits/val.jsonl and " \
        "splits/val.index.npz" in res.stdout
    assert ": OK (" in res.stdout


# ------------------------------------------------------------------ 3: damaged split records
def _replace_line(root: Path, n: int, text: str) -> None:
    path = root / "splits" / f"{SPLIT}.jsonl"
    lines = path.read_text().splitlines()
    lines[n] = text
    path.write_text("\n".join(lines) + "\n")


def _record_with(root: Path, n: int, **fields) -> None:
    rec = json.loads((root / "splits" / f"{SPLIT}.jsonl").read_text().splitlines()[n])
    rec.update(fields)
    _replace_line(root, n, json.dumps(rec))


RECORD_DAMAGE = {
    "deep nesting": (lambda r: _replace_line(r, 0, "[" * 100_000),
                     "line 1: JSON nested deeper than Python's recursion limit"),
    "a line over 1 MiB": (lambda r: _replace_line(r, 2, '"' + "x" * (1 << 20) + '"'),
                          "line 3 is 1048578 bytes long; a record is at most 1048576"),
    "not an object": (lambda r: _replace_line(r, 1, "[1, 2]"),
                      "line 2: is [1, 2] (array); expected a JSON object"),
    "width a str": (lambda r: _record_with(r, 1, width="abc"),
                    "line 2: field width is \"abc\" (str); expected an int in [1, 2147483647]"),
    "label 99": (lambda r: _record_with(r, 4, label=99),
                 "line 5: field label is 99 (int); expected a class number in [0, 5)"),
    "label a str": (lambda r: _record_with(r, 4, label="2"), "field label is \"2\" (str)"),
    "shard 3": (lambda r: _record_with(r, 4, shard=3), "line 5: field shard is 3 (int); "
                "expected a shard number in [0, 1)"),
    "no key": (lambda r: _record_with(r, 0, key=None), "line 1: field key is null (null)"),
    "offset past int64": (lambda r: _record_with(r, 3, offset=10 ** 30),
                          "line 4: field offset is 1000000000000000000000000000000 (int); "
                          "expected an int in [0, 9223372036854775807]"),
    "warnings nested": (lambda r: _record_with(r, 0, warnings=[["x"]]),
                        "field warnings[0] is [\"x\"] (array); expected a str"),
}


@pytest.mark.parametrize("case", sorted(RECORD_DAMAGE))
def test_damaged_records_are_named_by_line_and_field(ds, tmp_path, case):
    damage, needle = RECORD_DAMAGE[case]
    damage(ds)
    with pytest.raises(ManifestError) as e:
        read_split_records(ds, SPLIT)
    assert needle in str(e.value) and f"splits/{SPLIT}.jsonl" in str(e.value)
    cmds = commands(ds, tmp_path)
    for name in ("check", "inspect"):
        line = one_error_line(cmds[name])
        assert line.startswith("Error: ManifestError: ") and needle in line, (name, line)
    res = CliRunner().invoke(main, cmds["verify"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert any(needle in ln for ln in res.stdout.splitlines() if ln.startswith("FAIL "))


def test_the_split_argument_cannot_name_a_file_outside(ds):
    with pytest.raises(ManifestError, match="split '../../x' not in"):
        read_split_records(ds, "../../x")
    with pytest.raises(ManifestError, match="split '../../x' not in"):
        load_index(ds, "../../x")


# ------------------------------------------------------------------ 4: shards agree with the index
def test_verify_compares_the_cls_members_with_the_labels(ds):
    """A .cls member rewritten in place, the shard's size and sha256 updated in the manifest (so
    the shard is 'intact'): verify names the sample; other readers of the tar would train on
    that label."""
    rec = read_split_records(ds, SPLIT)[6]
    tar = ds / "shards" / "val-000000.tar"
    name, offset, size = next(m for m in _members(tar, rec) if m[0].endswith(".cls"))
    data = bytearray(tar.read_bytes())
    assert bytes(data[offset:offset + size]).strip() == str(rec["label"]).encode()
    data[offset] = ord(str((rec["label"] + 1) % 5))
    tar.write_bytes(bytes(data))
    digest = hashlib.sha256(bytes(data)).hexdigest()
    edit_manifest(ds, lambda m: m["splits"][SPLIT]["shards"][0].update(sha256=digest))
    report = verify(ds, decode=False)
    assert report.problems == [
        f"split 'val' shard shards/val-000000.tar: sample {rec['key']!r}: member "
        f"{rec['key']}.cls holds {str((rec['label'] + 1) % 5).encode()!r}, the split files say "
        f"label {rec['label']}"]


def _members(tar: Path, rec: dict) -> list[tuple[str, int, int]]:
    """The tar members ``(name, data offset, size)`` of the sample of ``rec``."""
    records = read_split_records(tar.parents[1], SPLIT)
    found = wds.sample_members(tar, [r["key"] for r in records], [r["offset"] for r in records],
                               [r["size"] for r in records])
    return found[[r["key"] for r in records].index(rec["key"])]


def test_a_fresh_pack_records_and_verifies_its_split_file_hashes(ds):
    man = load_manifest(ds)
    for split, entry in man["splits"].items():
        assert entry["index_sha256"] == hashlib.sha256(
            (ds / "splits" / f"{split}.index.npz").read_bytes()).hexdigest()
        assert entry["records_sha256"] == hashlib.sha256(
            (ds / "splits" / f"{split}.jsonl").read_bytes()).hexdigest()
    report = verify(ds, decode=False)
    assert report.ok and report.notes == []


def test_make_loader_takes_the_callers_pixel_limit(packed_sample):
    """make_loader(max_pixels=N) is the reader's own limit: the sample's photos (up to 500 x
    375) are refused under 10,000 pixels, named, and every one is skipped under 'skip'."""
    from shardkit.stream import make_loader

    out = packed_sample("wds")
    val = json.loads((out / "manifest.json").read_text())["splits"]["val"]["num_samples"]
    with make_loader(out, "val", 8, num_workers=0, image_size=32, max_pixels=10_000) as loader:
        with pytest.raises(DecodeError, match=r"sample 'val_00000000' failed: PixelLimitError: "
                           r"image of \d+x\d+ = \d+ pixels is over the limit max_pixels=10000"):
            next(iter(loader))
    with make_loader(out, "val", 8, num_workers=0, image_size=32, max_pixels=10_000,
                     on_error="skip") as loader:
        assert sum(len(labels) for _, labels in loader) == 0
        assert len(loader.skipped) == val
    with make_loader(out, "val", 8, num_workers=0, image_size=32) as loader:
        assert sum(len(labels) for _, labels in loader) == val
