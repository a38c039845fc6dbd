"""The lock of a dataset folder, and the crash-safe swap of ``shardkit pack --overwrite``.

**The lock.** Every command that writes into a dataset folder ``OUT`` (``pack``, ``stats``
saving its result, ``export``, finishing a swap) holds :class:`DatasetLock` meanwhile: an
exclusive ``fcntl.flock`` on ``OUT/.shardkit-pack.lock``, whose file names the holder (command,
pid, host, start time). A killed holder's lock is released by the kernel; the file is removed by
the holder when it ends.

**The swap.** An overwrite builds the new dataset beside the old one and swaps it in. The rule:
*the journal is the commit point.*

1. The new dataset is written whole into the staging folder while the old one stays complete
   and readable: its top-level files (``manifest.json``, ``quarantine.jsonl``) in
   ``OUT/.shardkit-new/``, its shards (and timm's / DALI's files) in ``OUT/shards/.shardkit-new/``
   and its split files in ``OUT/splits/.shardkit-new/``, which the writers reach as
   ``OUT/.shardkit-new/shards`` and ``.../splits`` (relative symlinks, :func:`make_staging`).
   Each part lies inside the very folder its files go to, so every move below is a rename inside
   one folder: it cannot fail with ``EXDEV`` when ``OUT/shards`` is a symlink to, or a mount of,
   another file system. The names are hidden: a glob reader (``OUT/shards/*.tar``, timm, DALI,
   webdataset) does not see them.
2. When every staged file is fsynced, the journal ``OUT/.shardkit-swap.json`` is written
   atomically (:func:`write_journal`): the staged files to move in and the old dataset's files
   to remove. Before it exists, the old dataset is the dataset: a kill leaves it untouched, and
   the next pack deletes the unfinished staging folder. Once it exists, the new dataset is the
   dataset and is never deleted: every later step only rolls it forward.
3. :func:`roll_forward` (idempotent: a kill at any point followed by a rerun ends in the same
   state) removes the old ``manifest.json`` first (OUT now looks unfinished to any reader that
   does not know the journal), then the old files the new dataset does not have, moves each
   staged file into place (replacing the old file of that name), moves the new
   ``manifest.json`` last, deletes the staging folder, then the journal.

Every command that opens OUT goes through :func:`finish_swap` (called by
:func:`shardkit.dataset.manifest.load_manifest` for a local dataset; ``pack`` runs :func:`roll_forward`
under its own lock): a journal present means a pack was killed during step 3, and the command
finishes the swap under the lock first (waiting up to :data:`SWAP_WAIT_S` for a pack still
swapping). So at every kill point the next shardkit command finds one whole dataset, old or new,
and afterwards ``OUT/shards`` and ``OUT/splits`` hold no shard, ``.idx`` or split file that its
manifest does not list. Between a kill during step 3 and the next shardkit command, a reader
that never opens the manifest (a plain glob) can see a mix: run any shardkit command on OUT
(``shardkit verify OUT``) after a killed ``pack --overwrite``. Finishing a swap needs write
access to OUT; without it the command fails with one line saying so (nothing is read from a
half-swapped folder).

The journal is untrusted input like the rest of a dataset: every entry must be a plain file
name of a pack's (:func:`journal_entry_ok`) in ``OUT``, ``OUT/shards`` or ``OUT/splits``, a
staged entry must be a regular file, and nothing outside those folders (or the folders a
symlinked ``OUT/shards`` / ``OUT/splits`` points to) is moved or deleted.

This module sits below every reader and writer: it imports only :mod:`shardkit.errors` and
:mod:`shardkit.storage.atomic`.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path

from shardkit.dataset.schema import MANIFEST_NAME
from shardkit.errors import ConfigError, ManifestError, OutputLockedError
from shardkit.storage.atomic import atomic_write_bytes, fsync_dir

__all__ = ["DatasetLock", "finish_swap", "roll_forward", "write_journal",
           "make_staging", "remove_staging", "staging_parts", "journal_entry_ok",
           "LOCK_NAME", "STAGING_NAME", "JOURNAL_NAME", "SWAP_WAIT_S", "BRIEF_WAIT_S"]

logger = logging.getLogger("shardkit.swap")

LOCK_NAME = ".shardkit-pack.lock"
STAGING_NAME = ".shardkit-new"
JOURNAL_NAME = ".shardkit-swap.json"
STAGED_FOLDERS = ("shards", "splits")
SWAP_WAIT_S = 60.0
"""Seconds :func:`finish_swap` waits for the lock held by a pack that is still swapping (the
swap is renames only: well under a second for thousands of shards)."""
BRIEF_WAIT_S = 30.0
"""Seconds ``pack`` and ``stats`` wait for a holder of the lock that is not a pack (``stats``
saving, ``export``, a swap being finished: they hold it for seconds at most); a pack holder
makes them fail at once."""
_POLL_S = 0.02
_JOURNAL_VERSION = 1
_SAFE_NAMES = {  # the non-hidden names a pack writes (shardkit.packer.outputs.owned's names)
    "": re.compile(r"quarantine\.jsonl|README\.md"),
    "shards": re.compile(r"[A-Za-z0-9_]+-\d{6}\.[A-Za-z0-9]+|_info\.json"),
    "splits": re.compile(r"[A-Za-z0-9_]+\.(?:jsonl|index\.npz)"),
}


# ----------------------------------------------------------------------------- the lock
_HELD: dict[str, int] = {}  # real path of a folder -> locks this process holds on it


def _key(folder: Path) -> str:
    return os.path.realpath(folder)


class DatasetLock:
    """An exclusive lock on a dataset folder (``folder/.shardkit-pack.lock``); see the module
    doc. Use as ``with DatasetLock(out, "stats", wait=BRIEF_WAIT_S):`` (``with`` calls
    :meth:`acquire` with ``wait`` and ``wait_for_pack``) or :meth:`acquire` / :meth:`release`.

    Args:
        folder: the dataset folder (it must exist). command: the holder's name written into
            the lock file (``"pack"``, ``"stats"``, ``"export"``...), shown to the next one.
            Only a holder named ``"pack"`` counts as a pack for ``wait_for_pack``.
    """

    def __init__(self, folder: str | os.PathLike, command: str = "pack", wait: float = 0.0,
                 wait_for_pack: bool = True):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.command = command
        self.fd: int | None = None
        self.wait, self.wait_for_pack = wait, wait_for_pack

    def acquire(self, wait: float = 0.0, *, wait_for_pack: bool = True) -> None:
        """Takes the lock, waiting up to ``wait`` seconds for the holder to release it (a pack
        holder only with ``wait_for_pack``; else a pack holder fails at once).

        Raises:
            OutputLockedError: another command holds it (names it, and the lock file).
            ConfigError: the lock file cannot be created (the folder is not writable: another
                user's dataset, a read-only file system).
        """
        deadline = time.monotonic() + max(0.0, float(wait))
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except OSError as e:
                why = "read-only file system" if e.errno == errno.EROFS else e.strerror
                raise ConfigError(f"{self.folder} is not writable: cannot create {LOCK_NAME} "
                                  f"there ({why})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                info = _read_holder(fd)
                os.close(fd)
                is_pack = info is not None and info.get("command", "pack") == "pack"
                if time.monotonic() < deadline and (wait_for_pack or not is_pack):
                    time.sleep(_POLL_S)
                    continue
                raise OutputLockedError(_locked_message(self.folder, self.path, info)) from None
            try:  # the holder before us may have removed the file after we opened it: retry
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {"command": self.command, "pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
        self.fd = fd
        key = _key(self.folder)
        _HELD[key] = _HELD.get(key, 0) + 1

    def release(self) -> None:
        """Removes the lock file (while still holding the lock) and releases the lock."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        key = _key(self.folder)
        _HELD[key] -= 1
        if not _HELD[key]:
            del _HELD[key]

    def __enter__(self) -> DatasetLock:
        self.acquire(self.wait, wait_for_pack=self.wait_for_pack)
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def held_here(folder: str | os.PathLike) -> bool:
    """True when this process holds a :class:`DatasetLock` on ``folder``."""
    return _key(Path(folder)) in _HELD


def _read_holder(fd: int) -> dict | None:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"null")
        return info if isinstance(info, dict) else None
    except (OSError, ValueError):
        return None


def _locked_message(folder: Path, path: Path, info: dict | None) -> str:
    try:
        who = f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (TypeError, KeyError):
        who = "holder details not written yet"
    command = (info or {}).get("command", "pack")
    if command == "pack":
        return (f"{folder} is being packed by another run ({who}; lock file {path}); wait for "
                "it to finish, or stop it, then rerun")
    return (f"{folder} is in use by another shardkit command ({command}: {who}; lock file "
            f"{path}); wait for it to finish, then rerun")


# ----------------------------------------------------------------------------- staging
def staging_parts(out: str | os.PathLike) -> list[str]:
    """The staging folder's parts (posix paths relative to ``out``, with a trailing ``/``) that
    exist as real folders (not symlinks): ``.shardkit-new/``, ``shards/.shardkit-new/``,
    ``splits/.shardkit-new/``."""
    out = Path(out)
    rels = [STAGING_NAME] + [f"{f}/{STAGING_NAME}" for f in STAGED_FOLDERS]
    return [rel + "/" for rel in rels if _real_dir(out / rel)]


def _real_dir(p: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def make_staging(out: str | os.PathLike) -> Path:
    """Creates the staging folder of an overwrite (step 1 of the module doc) and returns the
    folder to write the new dataset into, ``OUT/.shardkit-new`` (its ``shards`` and ``splits``
    are symlinks to ``OUT/shards/.shardkit-new`` and ``OUT/splits/.shardkit-new``). The parts
    must not exist (:func:`remove_staging` first).

    Raises:
        ConfigError: ``OUT/shards`` or ``OUT/splits`` (or the folder a symlink of theirs points
            to) cannot be written.
    """
    out = Path(out)
    top = out / STAGING_NAME
    top.mkdir()
    for folder in STAGED_FOLDERS:
        final = out / folder
        try:
            final.mkdir(exist_ok=True)
            (final / STAGING_NAME).mkdir()
        except OSError as e:
            shutil.rmtree(top, ignore_errors=True)
            raise ConfigError(f"cannot stage the new dataset in {final / STAGING_NAME} "
                              f"({e.strerror}): the new {folder} are staged in the folder they "
                              f"go to ({os.path.realpath(final)}), which must be writable"
                              ) from None
        os.symlink(os.path.join("..", folder, STAGING_NAME), top / folder)
        fsync_dir(final)
    fsync_dir(top)
    fsync_dir(out)
    return top


def remove_staging(out: str | os.PathLike) -> list[str]:
    """Deletes every part of the staging folder (:func:`staging_parts`); returns them."""
    out = Path(out)
    parts = staging_parts(out)
    for rel in parts:
        shutil.rmtree(out / rel.rstrip("/"), ignore_errors=True)
    if parts:
        fsync_dir(out)
    return parts


def _staged(out: Path, rel: str) -> Path:
    """Where the staged file ``rel`` lies (see :func:`make_staging`), never through a symlink
    of the staging folder."""
    folder, _, name = rel.rpartition("/")
    return (out / folder / STAGING_NAME / name) if folder else (out / STAGING_NAME / name)


# ----------------------------------------------------------------------------- the journal
def journal_entry_ok(rel: str) -> bool:
    """Whether ``rel`` may be in a swap journal: a plain, non-hidden file name that a pack
    writes, in ``OUT`` (``quarantine.jsonl``, ``README.md``), ``OUT/shards``
    (``<split>-NNNNNN.<ext>``, ``_info.json``) or ``OUT/splits`` (``<split>.jsonl``,
    ``<split>.index.npz``). ``manifest.json`` is moved by the swap itself, never listed."""
    if not isinstance(rel, str):
        return False
    folder, _, name = rel.rpartition("/")
    pattern = _SAFE_NAMES.get(folder)
    return pattern is not None and pattern.fullmatch(name) is not None


def write_journal(out: str | os.PathLike, moves: list[str], removes: list[str]) -> None:
    """Step 2 of the module doc: writes ``OUT/.shardkit-swap.json`` atomically and durably.

    Args:
        out: the dataset folder; the staged files and ``manifest.json`` are durable already.
        moves: the staged files (relative to OUT, ``manifest.json`` not included) to move in.
        removes: the old dataset's files (relative to OUT) to delete, none of them in ``moves``.

    Raises:
        ValueError: an entry that :func:`journal_entry_ok` refuses, or in both lists (a bug).
    """
    bad = [r for r in [*moves, *removes] if not journal_entry_ok(r)]
    if bad or set(moves) & set(removes):
        both = sorted(set(moves) & set(removes))
        raise ValueError(f"swap journal entries refused: {bad or both}")
    body = {"version": _JOURNAL_VERSION, "pid": os.getpid(), "host": socket.gethostname(),
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "moves": list(moves),
            "removes": list(removes)}
    atomic_write_bytes(Path(out) / JOURNAL_NAME, json.dumps(body, indent=1).encode() + b"\n")


def _read_journal(out: Path) -> tuple[list[str], list[str]]:
    path = out / JOURNAL_NAME
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise ManifestError(f"{path} is not a regular file; expected the swap journal of "
                                "an interrupted `shardkit pack --overwrite`")
        with open(path, "rb") as f:
            body = json.loads(f.read(64 << 20))
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read the swap journal {path} ({e}); the dataset in {out} "
                            "cannot be finished: repack it") from None
    body = body if isinstance(body, dict) else {}
    moves, removes = body.get("moves"), body.get("removes")
    if body.get("version") != _JOURNAL_VERSION or not isinstance(moves, list) or \
            not isinstance(removes, list):
        raise ManifestError(f"{path} is not a swap journal of this shardkit (expected version "
                            f"{_JOURNAL_VERSION} with lists 'moves' and 'removes'); repack the "
                            "dataset")
    bad = [r for r in [*moves, *removes] if not journal_entry_ok(r)]
    if bad or set(moves) & set(removes):
        shown = bad[:3] or sorted(set(moves) & set(removes))[:3]
        raise ManifestError(f"{path} lists {shown!r}: not a file a pack moves or removes (plain "
                            "names of a pack in OUT, OUT/shards, OUT/splits, each once); the "
                            "journal is damaged, nothing was changed: repack the dataset")
    return moves, removes


# ----------------------------------------------------------------------------- roll forward
def roll_forward(out: str | os.PathLike, resumed: bool = False) -> int:
    """Step 3 of the module doc: finishes the swap that ``OUT/.shardkit-swap.json`` describes.
    The caller holds the :class:`DatasetLock` of ``out``. Idempotent. Returns the number of
    files moved into place. ``resumed``: the swap was left by a killed pack (logged at WARNING).

    Raises:
        ManifestError: the journal is unreadable or lists names it may not; a listed file is
            neither staged nor in place (the staged dataset was damaged); a move or removal
            failed (the error, named). The journal is kept then: a rerun continues.
    """
    out = Path(out)
    moves, removes = _read_journal(out)
    staged_manifest = out / STAGING_NAME / MANIFEST_NAME
    moved = 0
    try:
        if _regular(staged_manifest):  # the old manifest goes first: OUT is visibly unfinished
            (out / MANIFEST_NAME).unlink(missing_ok=True)
            fsync_dir(out)
        for rel in removes:
            target = out / rel
            if os.path.lexists(target) and not _real_dir(target):
                target.unlink()
        for rel in moves:
            src, dst = _staged(out, rel), out / rel
            if os.path.lexists(src):
                if not _regular(src):
                    raise ManifestError(f"{src} is not a regular file; the staged dataset in "
                                        f"{out} is damaged: repack it")
                dst.parent.mkdir(exist_ok=True)
                os.replace(src, dst)
                moved += 1
            elif not _regular(dst):
                raise ManifestError(f"the swap journal of {out} lists {rel}, which is neither "
                                    f"staged ({src}) nor in place: the staged dataset is "
                                    "damaged; repack it")
        for folder in {rel.rpartition("/")[0] for rel in [*moves, *removes]}:
            fsync_dir(out / folder if folder else out)
        if _regular(staged_manifest):
            os.replace(staged_manifest, out / MANIFEST_NAME)  # LAST: OUT is the new dataset
            fsync_dir(out)
        elif not _regular(out / MANIFEST_NAME):
            raise ManifestError(f"the swap in {out} lost its manifest.json (neither staged nor "
                                "in place); repack the dataset")
        remove_staging(out)
        (out / JOURNAL_NAME).unlink(missing_ok=True)
        fsync_dir(out)
    except OSError as e:
        raise ManifestError(f"cannot finish replacing the dataset in {out}: {e}; the new dataset "
                            f"stays staged (journal {out / JOURNAL_NAME}): fix the cause, then "
                            "run any shardkit command on it (e.g. shardkit verify) to finish"
                            ) from None
    if resumed:
        logger.warning("%s: finished replacing the dataset, which a killed `shardkit pack "
                       "--overwrite` had left half-done (%d staged files moved into place, %d "
                       "old ones removed)", out, moved, len(removes))
    return moved


def _regular(p: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def finish_swap(root: str | os.PathLike) -> bool:
    """The hook of every command that opens a local dataset: when ``root`` holds a swap journal
    (a pack was killed while swapping, or is swapping now), finishes the swap under the lock
    (:func:`roll_forward`; waits up to :data:`SWAP_WAIT_S` for a pack still swapping). One
    ``lstat`` when there is none. Returns True when a journal was found.

    Raises:
        ManifestError: the swap cannot be finished here (``root`` is not writable: one line
            saying who can finish it; a pack still holds the lock after the wait; a damaged
            journal or staging folder, see :func:`roll_forward`).
    """
    out = Path(root)
    journal = out / JOURNAL_NAME
    if not os.path.lexists(journal):
        return False
    if held_here(out):  # this process holds the lock already (a pack, stats saving)
        roll_forward(out, resumed=True)
        return True
    lock = DatasetLock(out, "finish-swap")
    try:
        lock.acquire(SWAP_WAIT_S)
    except OutputLockedError as e:
        raise ManifestError(f"cannot open {out}: a pack is swapping a new dataset in (journal "
                            f"{journal}) and the lock is still held after {SWAP_WAIT_S:.0f} s: "
                            f"{e}") from None
    except ConfigError as e:
        raise ManifestError(f"{out} holds a dataset replacement that a killed `shardkit pack "
                            f"--overwrite` left half-done (journal {journal}), and it cannot be "
                            f"finished from here: {e}. Run any shardkit command on it (e.g. "
                            "`shardkit verify`) as a user who can write there") from None
    try:
        if os.path.lexists(journal):
            roll_forward(out, resumed=True)
    finally:
        lock.release()
    return True
