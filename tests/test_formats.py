"""Contract tests for every registered shard format (a new format needs no new test code)."""
from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from shardkit.errors import ConfigError, ShardCorruptError
from shardkit.formats import FORMATS, ShardSink, open_reader, sha256_file
from shardkit.dataset.manifest import load_index, load_manifest, write_manifest, write_split_files
from shardkit.packer.outputs.owned import owned_entries, remove_owned

ALL = sorted(FORMATS)


def _jpegs(sample_dir: Path, n: int) -> list[Path]:
    files = sorted(sample_dir.glob("*/*.jpg"))[:n]
    assert len(files) == n
    return files


def _write(out: Path, fmt: str, files: list[Path], **sink_kw) -> list[dict]:
    records = []
    with ShardSink(out, "train", fmt, **sink_kw) as sink:
        for i, p in enumerate(files):
            data = p.read_bytes()
            key = f"train_{i:08d}"
            shard, offset = sink.add(key, data, "jpg", i % 3)
            records.append(dict(key=key, shard=shard, offset=offset, size=len(data),
                                label=i % 3, sha256=hashlib.sha256(data).hexdigest()))
    shards = sink.records
    write_split_files(out, "train", records)
    write_manifest(out, {"format": fmt, "classes": ["a", "b", "c"],
                         "splits": {"train": {"num_samples": len(records), "shards": shards}}})
    return records


def _read_all(out: Path) -> list[str]:
    manifest = load_manifest(out)
    index = load_index(out, "train")
    readers = [open_reader(out, manifest, "train", i)
               for i in range(len(manifest["splits"]["train"]["shards"]))]
    return [hashlib.sha256(bytes(readers[index.shard[i]].read(
        index.key_at(i), int(index.offset[i]), int(index.size[i])))).hexdigest()
        for i in range(len(index))]


@pytest.mark.parametrize("fmt", ALL)
def test_round_trip_is_byte_exact_with_rollover(fmt, sample_dir, tmp_path):
    """Case 5: 25 images, 10 per shard -> exactly 10, 10, 5; no empty shard; bytes unchanged."""
    files = _jpegs(sample_dir, 25)
    records = _write(tmp_path / "out", fmt, files, max_samples=10)
    manifest = load_manifest(tmp_path / "out")
    shards = manifest["splits"]["train"]["shards"]
    assert [s["num_samples"] for s in shards] == [10, 10, 5]
    for s in shards:
        path = tmp_path / "out" / s["path"]
        assert s["sha256"] == sha256_file(path) and s["bytes"] == path.stat().st_size
    assert _read_all(tmp_path / "out") == [r["sha256"] for r in records]
    # nothing but finished shards remains (no temp files, no lock files)
    names = sorted(p.name for p in (tmp_path / "out" / "shards").iterdir())
    assert names == sorted(Path(s["path"]).name for s in shards)


@pytest.mark.parametrize("fmt", ALL)
def test_byte_limit_rollover(fmt, sample_dir, tmp_path):
    files = _jpegs(sample_dir, 12)
    limit = sum(p.stat().st_size for p in files[:4]) + 1
    _write(tmp_path / "out", fmt, files, max_bytes=limit)
    shards = load_manifest(tmp_path / "out")["splits"]["train"]["shards"]
    assert sum(s["num_samples"] for s in shards) == 12
    assert all(s["num_samples"] >= 1 for s in shards) and len(shards) >= 3


@pytest.mark.parametrize("fmt", ALL)
def test_readers_pickle_without_handles_and_reopen(fmt, sample_dir, tmp_path):
    files = _jpegs(sample_dir, 3)
    records = _write(tmp_path / "out", fmt, files)
    reader = open_reader(tmp_path / "out", load_manifest(tmp_path / "out"), "train", 0)
    first = bytes(reader.read(records[0]["key"], records[0]["offset"], records[0]["size"]))
    clone = pickle.loads(pickle.dumps(reader))
    # nothing but names (and the manifest's size) travels: handles live in the process's
    # table of open shards
    assert all(v is None or isinstance(v, str) or (k == "expected_bytes" and isinstance(v, int))
               for k, v in vars(clone).items())
    assert bytes(clone.read(records[0]["key"], records[0]["offset"], records[0]["size"])) == first


@pytest.mark.parametrize("fmt", ALL)
def test_aborted_sink_leaves_only_temp_files_that_are_removed(fmt, sample_dir, tmp_path):
    files = _jpegs(sample_dir, 5)
    out = tmp_path / "out"
    sink = ShardSink(out, "train", fmt, max_samples=3)
    for i, p in enumerate(files):
        sink.add(f"train_{i:08d}", p.read_bytes(), "jpg", 0)
    # killed here: shard 0 is finished, shard 1 is a temp file; no manifest exists
    assert not (out / "manifest.json").exists()
    suffix = FORMATS[fmt].suffix
    finished = sorted(p.name for p in (out / "shards").iterdir() if not p.name.startswith("."))
    assert finished == [f"train-000000{suffix}"]  # the open shard never has a final name
    leftovers = [p.name for p in (out / "shards").iterdir() if p.name.startswith(".")]
    # the next pack into OUT knows every one of them as its own (shardkit.packer.outputs.owned) ...
    owned = owned_entries(out)
    assert sorted(owned) == sorted(f"shards/{n}" for n in finished + leftovers)
    # ... and deletes them (a fresh OUT: also the finished shard, kept here to check the rest)
    temps = [e for e in owned if Path(e).name.startswith(".")]
    assert sorted(remove_owned(out, temps, prune=False)) == sorted(f"shards/{n}" for n in leftovers)
    assert all(not p.name.startswith(".") for p in (out / "shards").iterdir())


def test_unknown_format_and_bad_limits():
    with pytest.raises(ConfigError, match="unknown format 'zip'"):
        ShardSink("/tmp/x", "train", "zip")
    with pytest.raises(ConfigError, match="max_samples must be >= 1"):
        ShardSink("/tmp/x", "train", "wds", max_samples=0)


# ----------------------------------------------------------------------------- the sink's `with`
class _Stop(Exception):
    pass


@pytest.mark.parametrize("fmt", ALL)
def test_exception_inside_with_leaves_no_shard_and_no_temp_file(fmt, sample_dir, tmp_path):
    files = _jpegs(sample_dir, 2)
    out = tmp_path / "out"
    with pytest.raises(_Stop):
        with ShardSink(out, "train", fmt) as sink:
            for i, p in enumerate(files):
                sink.add(f"train_{i:08d}", p.read_bytes(), "jpg", 0)
            if fmt != "hdf5":  # HDF5 holds the samples in memory until the close
                assert [p.name for p in (out / "shards").iterdir() if p.name.startswith(".")]
            raise _Stop  # the shard's temp file(s) exist here
    assert os.listdir(out / "shards") == [] and sink.records == []


@pytest.mark.parametrize("fmt", ALL)
def test_exception_after_a_rollover_keeps_the_finished_shard_only(fmt, sample_dir, tmp_path):
    files = _jpegs(sample_dir, 5)
    out = tmp_path / "out"
    with pytest.raises(_Stop):
        with ShardSink(out, "train", fmt, max_samples=3) as sink:
            for i, p in enumerate(files):
                sink.add(f"train_{i:08d}", p.read_bytes(), "jpg", 0)
            raise _Stop
    suffix = FORMATS[fmt].suffix
    assert os.listdir(out / "shards") == [f"train-000000{suffix}"]
    assert [r["num_samples"] for r in sink.records] == [3]


def test_oserror_inside_with_gets_the_shard_name(sample_dir, tmp_path):
    """A full disk (``write`` names no file) is reported by the final name of the shard being
    written, the second one here; an error naming a real file keeps its name."""
    files = _jpegs(sample_dir, 3)
    out = tmp_path / "out"
    with pytest.raises(OSError) as err:
        with ShardSink(out, "val", "wds", max_samples=2) as sink:
            for i, p in enumerate(files):
                sink.add(f"val_{i:08d}", p.read_bytes(), "jpg", 0)
            raise OSError(28, "No space left on device")
    assert err.value.filename == str(out / "shards" / "val-000001.tar")
    assert sorted(os.listdir(out / "shards")) == ["val-000000.tar"]
    with pytest.raises(FileNotFoundError) as err:
        with ShardSink(out, "test", "wds"):
            open(tmp_path / "no-such-source.jpg", "rb")
    assert err.value.filename == str(tmp_path / "no-such-source.jpg")


def test_a_failing_close_at_the_end_of_with_leaves_no_temp_file(sample_dir, tmp_path,
                                                                 monkeypatch):
    writer = FORMATS["wds"].Writer
    real_close = writer.close

    def failing_close(self):
        real_close(self)
        raise OSError(5, "Input/output error")  # the fsync of a dying disk

    monkeypatch.setattr(writer, "close", failing_close)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="Input/output error") as err:
        with ShardSink(out, "train", "wds") as sink:
            sink.add("train_00000000", _jpegs(sample_dir, 1)[0].read_bytes(), "jpg", 0)
    assert err.value.filename == str(out / "shards" / "train-000000.tar")
    assert os.listdir(out / "shards") == []


@pytest.mark.parametrize("fmt", ALL)
def test_fixed_index_writes_exactly_that_shard(fmt, sample_dir, tmp_path):
    files = _jpegs(sample_dir, 4)
    suffix = FORMATS[fmt].suffix
    out = tmp_path / "fixed"
    with ShardSink(out, "val", fmt, index=np.int64(7)) as sink:
        got = [sink.add(f"val_{i:08d}", p.read_bytes(), "jpg", 1) for i, p in enumerate(files)]
        if fmt != "hdf5":  # HDF5 holds the samples in memory until the close
            assert [p.name for p in (out / "shards").iterdir()][0].startswith(
                f".val-000007{suffix}.tmp")
    assert [shard for shard, _ in got] == [7, 7, 7, 7]
    assert os.listdir(out / "shards") == [f"val-000007{suffix}"]
    (record,) = sink.records
    assert record["path"] == f"shards/val-000007{suffix}" and record["num_samples"] == 4
    assert record["sha256"] == sha256_file(out / record["path"])
    with ShardSink(tmp_path / "rolling", "val", fmt) as rolling:  # the same writer, at shard 0
        offsets = [rolling.add(f"val_{i:08d}", p.read_bytes(), "jpg", 1)[1]
                   for i, p in enumerate(files)]
    assert offsets == [offset for _, offset in got]
    if fmt != "lmdb":  # LMDB files differ between any two writes (free pages)
        assert rolling.records[0]["sha256"] == record["sha256"]
    with pytest.raises(ConfigError, match="shard 7 of split 'val' is finished"):
        sink.add("val_00000009", files[0].read_bytes(), "jpg", 1)
    assert os.listdir(out / "shards") == [f"val-000007{suffix}"]


def test_fixed_index_refuses_rollover_limits_and_bad_numbers(tmp_path):
    with pytest.raises(ConfigError, match="index=2 writes one shard"):
        ShardSink(tmp_path, "train", "wds", index=2, max_samples=10)
    with pytest.raises(ConfigError, match="index=2 writes one shard"):
        ShardSink(tmp_path, "train", "wds", index=2, max_bytes=10)
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ConfigError, match="expected a shard number"):
            ShardSink(tmp_path, "train", "wds", index=bad)


def test_wds_shards_are_plain_tars_for_tar_and_webdataset(sample_dir, tmp_path):
    files = _jpegs(sample_dir, 4)
    _write(tmp_path / "out", "wds", files)
    path = tmp_path / "out" / "shards" / "train-000000.tar"
    listing = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True)
    assert listing.stdout.split() == [f"train_{i:08d}.jpg" for i in range(4)]
    import webdataset as wds

    got = [s["jpg"] for s in wds.WebDataset(str(path), shardshuffle=False)]
    assert got == [p.read_bytes() for p in files]
    with tarfile.open(path) as tf:  # deterministic headers
        assert {(m.mtime, m.uid, m.mode) for m in tf.getmembers()} == {(0, 0, 0o644)}


def test_wds_optional_cls_members(sample_dir, tmp_path):
    files = _jpegs(sample_dir, 3)
    _write(tmp_path / "out", "wds", files, writer_options={"wds_cls": True})
    import webdataset as wds

    path = tmp_path / "out" / "shards" / "train-000000.tar"
    assert [int(s["cls"]) for s in wds.WebDataset(str(path), shardshuffle=False)] == [0, 1, 2]
    assert _read_all(tmp_path / "out") == [hashlib.sha256(p.read_bytes()).hexdigest()
                                           for p in files]


def test_wds_truncated_or_shifted_shard_names_shard_and_key(sample_dir, tmp_path):
    files = _jpegs(sample_dir, 4)
    records = _write(tmp_path / "out", "wds", files)
    path = tmp_path / "out" / "shards" / "train-000000.tar"
    data = path.read_bytes()
    path.write_bytes(data[: records[3]["offset"] + 10])
    reader = open_reader(tmp_path / "out", load_manifest(tmp_path / "out"), "train", 0)
    with pytest.raises(ShardCorruptError, match=r"train-000000.tar.*train_00000003.*truncated"):
        reader.read(records[3]["key"], records[3]["offset"], records[3]["size"])
    path.write_bytes(b"\0" * 512 + data)  # every offset now points at the wrong place
    reader = open_reader(tmp_path / "out", load_manifest(tmp_path / "out"), "train", 0)
    with pytest.raises(ShardCorruptError, match=r"train-000000.tar.*train_00000001"):
        reader.read(records[1]["key"], records[1]["offset"], records[1]["size"])


class _SizedEnv:
    """An ``lmdb.Environment`` that records the map sizes it is given."""

    def __init__(self, env, sizes: list[int]):
        self._env, self._sizes = env, sizes

    def set_mapsize(self, size: int):
        self._sizes.append(size)
        return self._env.set_mapsize(size)

    def __getattr__(self, name):
        return getattr(self._env, name)


def test_lmdb_tiny_map_grows_and_file_is_compacted(sample_dir, tmp_path, monkeypatch):
    """Case 9: an initial map of 1 MiB grows by doubling; the final file is tight."""
    import lmdb

    files = _jpegs(sample_dir, 30)
    source_bytes = sum(p.stat().st_size for p in files)
    sizes: list[int] = []
    real_open = lmdb.open

    def sized_open(path, **kw):
        sizes.append(kw["map_size"])
        return _SizedEnv(real_open(path, **kw), sizes)

    monkeypatch.setattr(lmdb, "open", sized_open)
    records = _write(tmp_path / "out", "lmdb", files,
                     writer_options={"initial_map_size": 1 << 20})
    monkeypatch.undo()
    assert source_bytes > 1 << 20  # more than the first map holds
    assert len(sizes) >= 2 and sizes == [(1 << 20) << k for k in range(len(sizes))], sizes
    shards = load_manifest(tmp_path / "out")["splits"]["train"]["shards"]
    assert source_bytes < shards[0]["bytes"] < 1.2 * source_bytes + (1 << 20)
    assert _read_all(tmp_path / "out") == [r["sha256"] for r in records]


_LMDB_WRITE = """
import sys
from pathlib import Path
from shardkit.formats import ShardSink
junk = [bytes([i % 251]) * 65536 for i in range(int(sys.argv[2]))]  # a different heap per run
del junk
with ShardSink(Path(sys.argv[1]), "train", "lmdb") as sink:
    for i, name in enumerate(sys.argv[3:]):
        sink.add(f"train_{i:08d}", Path(name).read_bytes(), "jpg", i % 3)
"""


def test_lmdb_shards_hold_no_stale_memory_and_repeat_byte_for_byte(sample_dir, tmp_path):
    """The LMDB writer zeroes the unused bytes of its pages (``meminit=True``): the same records
    written by two processes whose heaps differ give identical files (with ``meminit=False``
    the pages carry whatever the heap held, so the files differ)."""
    files = [str(p) for p in _jpegs(sample_dir, 12)]
    shards = []
    for run, junk in (("a", 0), ("b", 200)):
        subprocess.run([sys.executable, "-c", _LMDB_WRITE, str(tmp_path / run), str(junk),
                        *files], check=True)
        shards.append((tmp_path / run / "shards" / "train-000000.lmdb").read_bytes())
    assert shards[0] == shards[1]


def test_lmdb_reads_from_read_only_copy(sample_dir, tmp_path):
    """Case 9: a chmod 0555 copy (no lock file can be created) still reads byte-exact."""
    files = _jpegs(sample_dir, 5)
    records = _write(tmp_path / "out", "lmdb", files)
    ro = tmp_path / "ro"
    shutil.copytree(tmp_path / "out", ro)
    for p in [ro / "shards", ro / "splits", ro]:
        p.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH
                | stat.S_IXOTH)
    try:
        if os.geteuid() == 0:  # root ignores permissions; the reader must not try to lock anyway
            pass
        assert _read_all(ro) == [r["sha256"] for r in records]
        assert not any(p.name.endswith("-lock") for p in (ro / "shards").iterdir())
    finally:
        for p in [ro, ro / "shards", ro / "splits"]:
            p.chmod(0o755)


def test_hdf5_layout_is_a_uint8_blob_with_offsets_and_nul_bytes(sample_dir, tmp_path):
    """Case 11: JPEG bytes contain 0x00; stored as one contiguous uint8 blob plus int64 offsets
    (not strings, not pickles), and plain h5py slicing gives each sample back."""
    files = _jpegs(sample_dir, 3)
    assert all(b"\x00" in p.read_bytes() for p in files)
    records = _write(tmp_path / "out", "hdf5", files)
    with h5py.File(tmp_path / "out" / "shards" / "train-000000.h5", "r") as f:
        assert f.attrs["shardkit_layout"] == 2
        images, offsets = f["images"], f["offsets"][:]
        assert images.dtype == np.uint8 and images.ndim == 1 and images.chunks is None
        assert offsets.dtype == np.int64
        assert list(np.diff(offsets)) == [p.stat().st_size for p in files]
        assert f["labels"].dtype == np.int64 and list(f["labels"][:]) == [0, 1, 2]
        assert [k.decode() for k in f["keys"][:]] == [r["key"] for r in records]
        assert images[offsets[1]:offsets[2]].tobytes() == files[1].read_bytes()
        assert all(f[name].dtype.kind != "O" for name in f)  # no object (pickle/vlen) data


def test_hdf5_reader_names_a_mismatched_row(sample_dir, tmp_path):
    files = _jpegs(sample_dir, 3)
    records = _write(tmp_path / "out", "hdf5", files)
    reader = open_reader(tmp_path / "out", load_manifest(tmp_path / "out"), "train", 0)
    with pytest.raises(ShardCorruptError, match=r"train-000000.h5: row 1 holds b'train_00000001', "
                                                r"expected sample 'train_00000002'"):
        reader.read("train_00000002", 1, records[1]["size"])


@pytest.mark.parametrize("fmt", ALL)
def test_sink_fsyncs_the_shards_folder_before_the_manifest(fmt, sample_dir, tmp_path,
                                                           monkeypatch):
    """The renames into shards/ are fsynced (once, at close) before manifest.json exists, so a
    power cut cannot leave a manifest that lists shards whose names were never made durable."""
    out = tmp_path / "out"
    calls = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        calls.append((path, path.is_dir(), (out / "manifest.json").exists()))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    _write(out, fmt, _jpegs(sample_dir, 7), max_samples=3)     # 3 shards, then the manifest
    shard_dir_syncs = [exists for path, is_dir, exists in calls if path == out / "shards"]
    assert shard_dir_syncs == [False]                           # once, before the manifest
    manifest_syncs = [i for i, (p, is_dir, _) in enumerate(calls) if is_dir and p == out]
    first_shards = next(i for i, (p, _, _) in enumerate(calls) if p == out / "shards")
    assert manifest_syncs and first_shards < manifest_syncs[-1]  # OUT fsynced after the rename
    assert (out / "manifest.json").exists()


@pytest.mark.parametrize("fmt", ALL)
def test_file_uri_root_with_a_space_reads_every_format(fmt, sample_dir, tmp_path):
    """A ``file://`` root as ``Path.as_uri()`` writes it (``my%20data``) is a local path for
    every format: readers, the split index and the datasets all take it (one is_url test)."""
    from shardkit.stream import MapShardDataset, ShardDataset

    files = _jpegs(sample_dir, 5)
    out = tmp_path / "my data"
    records = _write(out, fmt, files, max_samples=2)
    uri = out.as_uri()
    assert "%20" in uri and uri.startswith("file:///")
    assert _read_all(uri) == [r["sha256"] for r in records]
    ds = MapShardDataset(uri, "train", decode=False)
    assert [ds[i]["image"] for i in range(len(ds))] == [p.read_bytes() for p in files]
    streamed = list(ShardDataset(uri, "train", decode=False, train=False))  # plan order
    assert [s["key"] for s in streamed] == [r["key"] for r in records]
    assert hashlib.sha256(streamed[4]["image"]).hexdigest() == records[4]["sha256"]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_remote_url_refused_for_lmdb_and_hdf5(fmt):
    manifest = {"format": fmt, "splits": {"train": {"shards": [{"path": "shards/x"}]}}}
    with pytest.raises(ConfigError, match=rf"format '{fmt}' needs a local path.*s3://b/ds"):
        open_reader("s3://b/ds", manifest, "train", 0)
    assert open_reader("file:///data/my%20ds", manifest, "train", 0).location == \
        "/data/my ds/shards/x"


def test_formats_package_has_no_import_cycle():
    """No module of shardkit.formats imports the package back (``base`` used to import
    ``FORMATS`` from ``formats/__init__``, which imports ``base``): the import graph of the
    package's modules, function-level imports included, is acyclic."""
    import ast
    from graphlib import CycleError, TopologicalSorter

    import shardkit.formats as package

    folder = Path(package.__file__).parent
    modules = {p.stem: p for p in folder.glob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module] if node.module else [a.name for a in node.names]
                deps |= {t.split(".")[0] if t.split(".")[0] in modules else "__init__"
                         for t in targets}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                         else [a.name for a in getattr(node, "names", [])])
                for full in filter(None, names):
                    if full == "shardkit.formats":
                        deps.add("__init__")
                    elif full.startswith("shardkit.formats."):
                        deps.add(full.split(".")[2])
        graph[name] = deps - {name}
    assert graph["base"] == set() and "__init__" not in set().union(
        *(d for n, d in graph.items() if n != "__init__"))
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"import cycle in shardkit.formats: {e.args[1]}")
    assert order.index("base") < order.index("registry") < order.index("sink")
