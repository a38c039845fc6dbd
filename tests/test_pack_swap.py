"""``pack --overwrite`` killed at every rename and unlink: the next command finds one whole dataset.

The rule under test (:mod:`shardkit.dataset.swap`): the old dataset (200 photos of
examples/flowers-sample in shards of 12) is being replaced by a new one (60 of them in shards of
8). Whatever call the packer is SIGKILLed at, the next shardkit command that opens OUT (verify,
the loader's :class:`~shardkit.stream.source.ShardSource`, a pack) finds a whole dataset, old or
new: every sample of that version, checksummed, its manifest the one a finished pack of that
version writes, and in ``OUT/shards`` and ``OUT/splits`` exactly the files that manifest lists
(what glob readers such as timm, DALI and webdataset would take), no journal left.

How the kill is injected: the packer runs in a forked child in which ``os.rename``,
``os.replace``, ``os.unlink``, ``os.remove`` and ``os.rmdir`` are wrapped; at call ``N`` the
child sends itself SIGKILL (no ``finally`` block, no ``atexit`` runs, like ``kill -9`` or
``strace -e inject=...:signal=KILL``). A first run without a kill records every call; the
journal's rename splits them into "before the commit point" (the old dataset must survive
untouched) and "after" (the new one must be rolled forward).

The default run kills the packer at the middle of the build, just before and just after the
journal's rename, and then kills the roll forward itself at every one of its calls (it is the
same function, run by the next command that opens OUT: the state after the pack's kill at call
``journal + 1 + m`` is the state after the opener's kill at its call ``m``). The ``slow`` test
kills the packer at every single call of the overwrite, for each format.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import uuid
from pathlib import Path

import pytest

from shardkit.dataset import swap
from shardkit.errors import ConfigError, ManifestError, OutputExistsError
from shardkit.dataset.manifest import load_manifest
from shardkit.packer.run import pack
from shardkit.stream.source import ShardSource
from shardkit.dataset.swap import JOURNAL_NAME, LOCK_NAME, STAGING_NAME
from shardkit.doctor.verify import verify

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "flowers-sample"
FORMATS = ("wds", "lmdb", "hdf5")
OPS = ("rename", "replace", "unlink", "remove", "rmdir")
COMMON = dict(split={"train": 0.7, "val": 0.3}, near_duplicates="off", progress=False)
OLD_N, NEW_N = 200, 60


# ----------------------------------------------------------------------------- the kill hook
def _hook(kill_at: int | None, record: Path | None) -> None:
    """Wraps :data:`OPS` of ``os`` in this (child) process: call number ``kill_at`` (0-based)
    SIGKILLs the process before it runs; ``record`` gets one JSON line per call."""
    main, count = os.getpid(), [0]
    log = open(record, "w") if record is not None else None

    def wrap(name, real):
        def op(*args, **kwargs):
            if os.getpid() == main:  # not in a process the packer forked
                if count[0] == kill_at:
                    os.kill(main, signal.SIGKILL)
                count[0] += 1
                if log is not None:
                    log.write(json.dumps([name, *(os.fsdecode(a) if isinstance(
                        a, (str, bytes, os.PathLike)) else repr(a) for a in args)]) + "\n")
                    log.flush()
            return real(*args, **kwargs)
        return op

    for name in OPS:
        setattr(os, name, wrap(name, getattr(os, name)))


def _in_child(fn, kill_at: int | None = None, record: Path | None = None) -> int:
    """Runs ``fn()`` in a forked child under :func:`_hook`; returns ``-9`` when the child was
    killed, else its exit status (0: ``fn`` returned, 1: it raised, traceback on stderr)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            _hook(kill_at, record)
            fn()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _calls(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def _relative(calls: list[list[str]], root: Path) -> list[list[str]]:
    """``calls`` with the dataset folder ``root`` written as ``OUT``."""
    return [[arg.replace(str(root), "OUT") for arg in call] for call in calls]


def _journal_call(calls: list[list[str]]) -> int:
    """Index of the rename that puts the journal in place (the commit point)."""
    hits = [i for i, c in enumerate(calls) if c[0] in ("replace", "rename")
            and c[2].endswith("/" + JOURNAL_NAME)]
    assert len(hits) == 1, calls
    return hits[0]


# ----------------------------------------------------------------------------- layouts
def _copy(src: Path, dst: Path) -> Path:
    """Copies a dataset folder; an ``OUT/shards`` that is a symlink (to another file system)
    gets a copy of its target of its own (next to the original target)."""
    shutil.copytree(src, dst, symlinks=True)
    link = dst / "shards"
    if link.is_symlink():
        target = Path(os.readlink(link))
        fresh = target.parent / f"{target.name}-{uuid.uuid4().hex[:8]}"
        shutil.copytree(target, fresh, symlinks=True)
        link.unlink()
        link.symlink_to(fresh)
    return dst


def _remove(out: Path) -> None:
    link = out / "shards"
    if link.is_symlink():
        shutil.rmtree(os.readlink(link), ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def shm_dir():
    """A folder on /dev/shm (tmpfs): another file system than the tests' tmp folder."""
    base = Path("/dev/shm")
    if not base.is_dir() or not os.access(base, os.W_OK):
        pytest.skip("no writable /dev/shm for a shards folder on another file system")
    where = Path(tempfile.mkdtemp(prefix="shardkit-test-swap-", dir=base))
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def new_src(tmp_path_factory) -> Path:
    """60 photos of the sample: 12 per class."""
    dst = tmp_path_factory.mktemp("new-src")
    for c in sorted(d for d in SAMPLE.iterdir() if d.is_dir()):
        (dst / c.name).mkdir()
        for p in sorted(c.glob("*.jpg"))[:12]:
            shutil.copyfile(p, dst / c.name / p.name)
    return dst


class Case:
    """One format (and layout): the old dataset, the recorded calls of an overwrite, and the
    manifests a finished pack of each version writes."""

    def __init__(self, work: Path, fmt: str, new_src: Path, shards_on: Path | None = None):
        self.work, self.fmt, self.new_src = work, fmt, new_src
        work.mkdir(parents=True, exist_ok=True)
        self.old = work / "old"
        if shards_on is not None:  # OUT/shards is a symlink to another file system
            self.old.mkdir()
            target = shards_on / f"{fmt}-{uuid.uuid4().hex[:8]}"
            target.mkdir()
            (self.old / "shards").symlink_to(target)
        pack(SAMPLE, self.old, format=fmt, shard_samples=12, **COMMON)
        self.manifests = {"old": _signature(load_manifest(self.old))}
        self.samples = {"old": _samples(self.old)}
        rec = _copy(self.old, work / "recorded")
        assert _in_child(self.overwrite(rec), record=work / "calls.jsonl") == 0
        self.calls = _calls(work / "calls.jsonl")
        self.journal = _journal_call(self.calls)
        self.manifests["new"] = _signature(load_manifest(rec))
        self.samples["new"] = _samples(rec)
        self.check(rec, "new")
        _remove(rec)
        self.n = 0

    def overwrite(self, out: Path):
        return lambda: pack(self.new_src, out, format=self.fmt, shard_samples=8,
                            overwrite=True, **COMMON)

    def fresh(self, name: str) -> Path:
        self.n += 1
        return _copy(self.old, self.work / f"{name}-{self.n}")

    def check(self, out: Path, expect: str | None = None, via=None) -> str:
        """Opens ``out`` (``via(out)``, else verify) and asserts it holds one whole dataset;
        returns which ("old" or "new")."""
        if via is not None:
            via(out)
        report = verify(out, decode=False)  # the first opener finishes a half-done swap
        assert report.ok, report.problems
        manifest = load_manifest(out)
        version = next((v for v, m in self.manifests.items() if m == _signature(manifest)),
                       None)
        assert version is not None, "the manifest is neither the old one nor the new one"
        if expect is not None:
            assert version == expect
        assert _samples(out) == self.samples[version]  # every sample's checksum and label
        shards = {s["path"] for info in manifest["splits"].values() for s in info["shards"]}
        if self.fmt == "wds":  # the other readers' files: DALI's .idx, timm's _info.json
            shards |= {p[: -len(".tar")] + ".idx" for p in shards} | {"shards/_info.json"}
        assert _visible(out, "shards") == shards
        assert _visible(out, "splits") == {f"splits/{s}.{ext}" for s in manifest["splits"]
                                           for ext in ("jsonl", "index.npz")}
        assert not os.path.lexists(out / JOURNAL_NAME)
        total = 0
        for split, info in manifest["splits"].items():  # the loader's reader, checksummed
            source = ShardSource(out, split)
            try:
                assert len({source.key(i) for i in range(len(source))}) == info["num_samples"]
                for i in range(len(source)):
                    assert len(source.read(i)) == int(source.index.size[i])
            finally:
                source.close()
            total += info["num_samples"]
        assert total == (OLD_N if version == "old" else NEW_N)
        return version


def _signature(manifest: dict) -> dict:
    """The manifest without its shards' sha256 (LMDB files of the same samples differ in
    their unused page bytes from pack to pack; verify checks each file against its own)."""
    manifest = json.loads(json.dumps(manifest))
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            del shard["sha256"]
    return manifest


def _samples(out: Path) -> dict[str, list[tuple[str, int, int]]]:
    """``{split: [(key, label, xxh3 of the stored bytes)]}`` from the split indexes."""
    from shardkit.dataset.manifest import load_index

    found = {}
    for split in load_manifest(out)["splits"]:
        index = load_index(out, split)
        found[split] = [(index.key_at(i), int(index.label[i]), int(index.xxh3[i]))
                        for i in range(len(index))]
    return found


def _visible(out: Path, folder: str) -> set[str]:
    """What a glob reader sees in ``out/folder``: its non-hidden entries."""
    return {f"{folder}/{p.name}" for p in (out / folder).iterdir() if not p.name.startswith(".")}


def _outside_staging(out: Path) -> dict[str, bytes]:
    """The bytes of every file of ``out`` except the staging folder, the lock file and a
    temporary name of the journal (hidden, removed by the next pack)."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and STAGING_NAME not in p.relative_to(out).parts
            and p.name != LOCK_NAME and not p.name.startswith(f".{JOURNAL_NAME}.")}


@pytest.fixture(scope="module", params=FORMATS)
def case(request, tmp_path_factory, new_src) -> Case:
    return Case(tmp_path_factory.mktemp(f"swap-{request.param}"), request.param, new_src)


# ----------------------------------------------------------------------------- the tests
def test_killed_before_the_journal_keeps_the_old_dataset_and_the_next_pack_replaces_it(case):
    old_bytes = _outside_staging(case.old)
    assert case.calls[case.journal][1].rpartition("/")[2].startswith(f".{JOURNAL_NAME}.")
    for n in sorted({case.journal // 2, case.journal}):  # mid-build; the journal's own rename
        out = case.fresh("before")
        assert _in_child(case.overwrite(out), kill_at=n) == -signal.SIGKILL
        assert (out / STAGING_NAME / "manifest.json").is_file() == (n == case.journal)
        assert _outside_staging(out) == old_bytes, n
        assert case.check(out) == "old", n
        assert (out / STAGING_NAME).is_dir()  # left for the next pack, invisible to readers
        summary = pack(case.new_src, out, format=case.fmt, shard_samples=8, overwrite=True,
                       **COMMON)
        assert summary.cleaned[:3] == [f"{STAGING_NAME}/", f"shards/{STAGING_NAME}/",
                                       f"splits/{STAGING_NAME}/"]
        assert [Path(e).name.startswith(f".{JOURNAL_NAME}.") for e in summary.cleaned[3:]] == \
            ([True] if n == case.journal else [])
        assert case.check(out) == "new"
        _remove(out)


def test_killed_after_the_journal_at_every_call_of_the_roll_forward_gives_the_new_one(case):
    at_journal = case.fresh("at-journal")
    assert _in_child(case.overwrite(at_journal), kill_at=case.journal + 1) == -signal.SIGKILL
    assert (at_journal / JOURNAL_NAME).is_file()
    rec = _copy(at_journal, case.work / "opener-recorded")
    assert _in_child(lambda: swap.finish_swap(rec), record=case.work / "opener.jsonl") == 0
    opener = _calls(case.work / "opener.jsonl")
    # the opener's roll forward makes the calls the pack's own makes after the journal
    assert _relative(opener[:-1], rec) == _relative(
        case.calls[case.journal + 1:case.journal + len(opener)], case.work / "recorded")
    assert case.check(rec) == "new"
    _remove(rec)
    kinds = {c[0] for c in opener}
    assert {"replace", "unlink", "rmdir"} <= kinds and len(opener) > 10
    for m in range(len(opener) + 1):
        out = _copy(at_journal, case.work / f"after-{m}")
        expect = -signal.SIGKILL if m < len(opener) else 0
        assert _in_child(lambda: swap.finish_swap(out), kill_at=m) == expect, m
        assert case.check(out, "new") == "new", m
        _remove(out)


def test_a_pack_opening_a_half_swapped_out_finishes_the_swap_first(case):
    at_journal = case.fresh("pack-opens")
    assert _in_child(case.overwrite(at_journal), kill_at=case.journal + 5) == -signal.SIGKILL
    assert (at_journal / JOURNAL_NAME).is_file()
    assert not (at_journal / "manifest.json").exists()  # the old one is gone: visibly unfinished
    with pytest.raises(OutputExistsError):  # the pack rolled it forward, then found it finished
        pack(case.new_src, at_journal, format=case.fmt, shard_samples=8, **COMMON)
    assert not (at_journal / JOURNAL_NAME).exists()
    assert case.check(at_journal) == "new"
    _remove(at_journal)


@pytest.mark.slow
def test_killed_at_every_rename_and_unlink_of_an_overwrite(case):
    """Every call of the recorded overwrite, for real: the packer killed at call N."""
    for n in range(len(case.calls)):
        out = case.fresh("every")
        assert _in_child(case.overwrite(out), kill_at=n) == -signal.SIGKILL, n
        assert case.check(out, "old" if n <= case.journal else "new"), n
        _remove(out)


# ----------------------------------------------------------------------------- another disk
def test_shards_symlinked_to_another_file_system_swap_without_exdev(tmp_path, new_src,
                                                                    shm_dir):
    assert os.stat(shm_dir).st_dev != os.stat(tmp_path).st_dev
    c = Case(tmp_path / "w", "wds", new_src, shards_on=shm_dir)
    target = Path(os.readlink(c.old / "shards"))
    out = c.fresh("sym")
    summary = pack(new_src, out, format="wds", shard_samples=8, overwrite=True, **COMMON)
    assert summary.replaced and c.check(out) == "new"
    real = Path(os.readlink(out / "shards"))
    assert real.parent == target.parent and not (real / STAGING_NAME).exists()
    # killed mid roll forward, on two file systems: the next opener finishes it
    at_journal = c.fresh("sym-journal")
    assert _in_child(c.overwrite(at_journal), kill_at=c.journal + 1) == -signal.SIGKILL
    staged = Path(os.readlink(at_journal / "shards")) / STAGING_NAME
    assert os.stat(staged).st_dev != os.stat(at_journal).st_dev  # staged beside its place
    for m in (0, 3, 9, 20):
        half = _copy(at_journal, c.work / f"sym-{m}")
        assert _in_child(lambda: swap.finish_swap(half), kill_at=m) == -signal.SIGKILL
        assert c.check(half, "new") == "new"
        _remove(half)
    # and the CLI, in a process of its own, is the opener: exit 0, OK, every image decoded
    res = subprocess.run([sys.executable, "-m", "shardkit.cli", "-q", "verify", str(at_journal)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    shards = sum(len(info["shards"]) for info in c.manifests["new"]["splits"].values())
    assert f"verify {at_journal}: OK ({shards} shards, {NEW_N} samples checked)" in res.stdout
    assert "had left half-done" in res.stderr and "Traceback" not in res.stderr
    assert c.check(at_journal) == "new"
    _remove(at_journal)


# ----------------------------------------------------------------------------- the journal
def test_a_half_swapped_dataset_that_cannot_be_written_is_refused_in_one_line(case,
                                                                             monkeypatch):
    """Another user's dataset, left half-swapped: no reader serves a mix, one line says why."""
    out = case.fresh("ro")
    assert _in_child(case.overwrite(out), kill_at=case.journal + 3) == -signal.SIGKILL
    before = _outside_staging(out)
    if os.geteuid() == 0:  # root writes through permission bits: refuse the lock file as the
        def refuse(self, *a, **k):  # kernel refuses it to another user
            raise ConfigError(f"{out} is not writable: cannot create {LOCK_NAME} there "
                              "(Permission denied)")
        monkeypatch.setattr(swap.DatasetLock, "acquire", refuse)
    else:
        (out / LOCK_NAME).unlink(missing_ok=True)
        out.chmod(0o555)
    try:
        with pytest.raises(ManifestError, match="left half-done .* cannot be finished from "
                                                "here: .*Permission denied"):
            load_manifest(out)
        with pytest.raises(ManifestError, match="left half-done"):
            ShardSource(out, "train")
    finally:
        out.chmod(0o755)
        monkeypatch.undo()
    assert _outside_staging(out) == before
    assert case.check(out) == "new"
    _remove(out)


@pytest.mark.parametrize("entry", ["../outside.txt", "shards/../../x.tar", "/etc/passwd",
                                   "shards/notes.txt", "splits/fold0.txt", "manifest.json",
                                   "shards/.shardkit-new", 7])
def test_a_crafted_journal_moves_and_deletes_nothing(tmp_path, entry):
    out = tmp_path / "out"
    (out / "shards").mkdir(parents=True)
    (out / "splits").mkdir()
    (out / "splits" / "fold0.txt").write_text("mine\n")
    (out / "shards" / "notes.txt").write_text("mine\n")
    (tmp_path / "outside.txt").write_text("mine\n")
    (out / JOURNAL_NAME).write_text(json.dumps({"version": 1, "moves": [],
                                                "removes": [entry]}))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ManifestError, match="not a file a pack moves or removes"):
        load_manifest(out)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_journal_names_cover_every_name_a_pack_writes(case):
    from shardkit.packer.outputs import owned_entries

    for version_root in (case.old,):
        names = [e for e in owned_entries(version_root) if e != "manifest.json"]
        assert names and all(swap.journal_entry_ok(e) for e in names), names
    assert not swap.journal_entry_ok("shards/.train-000000.tar.tmp")
    assert not swap.journal_entry_ok("shards/sub/train-000000.tar")


# ----------------------------------------------------------------------------- stats: the lock
def _stats_cli(out: Path, *args: str):
    from click.testing import CliRunner

    from shardkit.doctor import stats_command

    return CliRunner().invoke(stats_command, [str(out), "--max-samples", "6", "--no-progress",
                                              *args])


def test_stats_while_a_pack_holds_the_lock_prints_and_saves_nothing(case):
    out = case.fresh("stats-locked")
    before = (out / "manifest.json").read_bytes()
    with swap.DatasetLock(out, "pack"):  # a pack (overwrite or not) is writing OUT
        res = _stats_cli(out)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "train: 6 samples" and lines[1].startswith("mean (R, G, B): ")
    assert lines[-1].startswith(f"not saved in {out / 'manifest.json'}: {out} is being packed by "
                                f"another run (pid {os.getpid()} on host ")
    assert "Traceback" not in res.output and "{" not in res.output   # said once, as text
    assert (out / "manifest.json").read_bytes() == before
    _remove(out)


def test_stats_saving_waits_for_another_stats_and_keeps_both_splits(case, monkeypatch):
    from shardkit.doctor import stats as stats_mod
    from shardkit.doctor.stats import compute_stats

    out = case.fresh("stats-two")
    real_iter, real_save = stats_mod.iter_sample_bytes, stats_mod.save_manifest_dict
    other = []

    def interleaved(root, manifest, split, positions):  # a second stats runs start to end
        if split == "train" and not other:  # while the first one reads its samples
            other.append(compute_stats(root, "val", max_samples=4))
        yield from real_iter(root, manifest, split, positions)

    def save(root, manifest):
        assert swap.held_here(root)  # the read-merge-write happens under the dataset's lock
        real_save(root, manifest)

    monkeypatch.setattr(stats_mod, "iter_sample_bytes", interleaved)
    monkeypatch.setattr(stats_mod, "save_manifest_dict", save)
    train = compute_stats(out, "train", max_samples=4)
    assert train.not_saved is None and other[0].not_saved is None
    assert load_manifest(out)["stats"] == {"val": other[0], "train": train}
    # another stats holding the lock is waited for (here: not at all), a pack is not
    monkeypatch.setattr(swap, "BRIEF_WAIT_S", 0.0)
    with swap.DatasetLock(out, "stats"):
        busy = compute_stats(out, "val", max_samples=2)
    assert busy.not_saved.startswith(f"{out} is in use by another shardkit command (stats: "
                                     f"pid {os.getpid()} ")
    assert load_manifest(out)["stats"]["val"] == other[0]
    _remove(out)


def test_stats_of_a_dataset_replaced_meanwhile_are_not_saved_into_the_new_one(case,
                                                                              monkeypatch):
    from shardkit.doctor import stats as stats_mod
    from shardkit.doctor.stats import compute_stats

    out = case.fresh("stats-swapped")
    real_iter = stats_mod.iter_sample_bytes

    def then_replaced(*args):  # the old samples are read, then an overwrite swaps in the new
        yield from real_iter(*args)
        pack(case.new_src, out, format=case.fmt, shard_samples=8, overwrite=True, **COMMON)

    monkeypatch.setattr(stats_mod, "iter_sample_bytes", then_replaced)
    result = compute_stats(out, "train", max_samples=5)
    assert result.not_saved == ("the dataset was replaced while they were computed (a pack "
                                "finished meanwhile): rerun shardkit stats on the new one")
    assert "stats" not in load_manifest(out) and case.check(out) == "new"
    _remove(out)


@pytest.fixture
def read_only_copy(tmp_path):
    """``make(src) -> Path``: a copy of the dataset ``src`` that this process cannot write: a
    read-only tmpfs for root (which writes through permission bits), else ``chmod a-w``; skips
    when neither can be had."""
    mounted = []

    def make(src: Path) -> Path:
        where = tmp_path / "ro"
        where.mkdir()
        if os.geteuid() == 0:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)],
                               capture_output=True, text=True)
            if r.returncode:
                pytest.skip(f"root cannot mount a tmpfs here ({r.stderr.strip()}): a read-only "
                            "dataset cannot be had")
            mounted.append(where)
            shutil.copytree(src, where / "ds", symlinks=True)
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        else:
            shutil.copytree(src, where / "ds", symlinks=True)
            for p in [where / "ds", *(where / "ds").rglob("*")]:
                p.chmod(p.stat().st_mode & ~0o222)
        if os.access(where / "ds", os.W_OK):
            pytest.skip("this process can still write the read-only copy")
        return where / "ds"

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
    for p in [tmp_path / "ro", *(tmp_path / "ro").rglob("*")] if not mounted else ():
        p.chmod(p.stat().st_mode | 0o200)


def test_stats_of_a_read_only_dataset_prints_then_says_why_not_saved(case, read_only_copy):
    out = read_only_copy(case.old)
    before = (out / "manifest.json").read_bytes()
    res = _stats_cli(out)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "train: 6 samples" and lines[1].startswith("mean (R, G, B): ")
    assert lines[-1].startswith(f"not saved in {out / 'manifest.json'}: {out} is not writable: "
                                f"cannot create {LOCK_NAME} there (")
    assert lines[-1].endswith(("(read-only file system)", "(Permission denied)"))
    assert "Traceback" not in res.output and "Error" not in res.output
    assert (out / "manifest.json").read_bytes() == before
