"""Packing into object storage: ``shardkit pack SRC s3://bucket/ds`` (``wds`` tar shards only).

``OUT`` may be an fsspec URL (``s3://`` with s3fs, ``gs://`` with gcsfs, any fsspec filesystem
that can write; credentials as that filesystem finds them: the standard ``AWS_*`` variables,
``~/.aws``, ``GOOGLE_APPLICATION_CREDENTIALS``, fsspec's configuration). The run writes through
the unchanged local code (:class:`shardkit.formats.ShardSink`: temp name, fsync, rename) into a
local staging folder (``tempfile.mkdtemp`` in ``$TMPDIR``), and every shard is uploaded as soon as
its sink closes it (the sink's ``on_close`` hook), checked and deleted locally, so the local disk
holds about one open shard per writer. The rules mirror :mod:`shardkit.packer.output`'s for a folder:

- **Exact bytes.** A shard is uploaded from the very file whose sha256 the manifest records; the
  object's size (``fs.info``) must be the file's, else :class:`UploadError` names both. Before it
  leaves, its tar headers are checked against its split records and its DALI index is built
  (:func:`shardkit.interop.shards.scan_shard`), which is what :mod:`shardkit.interop` needs
  later, the shards being gone from the staging folder.
- **Order.** Shards while they are written; then ``quarantine.jsonl``, ``splits/*``, the readers'
  files of :mod:`shardkit.interop` (``shards/_info.json``, ``shards/<split>-NNNNNN.idx``); then one
  listing of ``OUT`` checks every object the manifest names has its size; ``manifest.json``
  LAST, so its presence still means "finished".
- **Owned names** are :func:`shardkit.packer.output.owned_name`'s, plus :data:`PROBE_NAME`; a
  ``README.md`` only with the marker of shardkit's card. Nothing else under ``OUT`` is deleted.
- **Checked before the scan** (:meth:`RemoteOutput.open`): the format is ``wds``; ``OUT`` does
  not lie inside a URL source nor hold it; ``OUT`` can be written (a small probe object is put
  and deleted, so a missing bucket or read-only credentials fail before a long scan); a
  ``manifest.json`` needs ``overwrite`` (:class:`~shardkit.errors.OutputExistsError`).
- **Fresh OUT**: owned leftovers of a killed run (owned names, no manifest) are deleted when
  writing starts. **overwrite**: when writing starts the old ``manifest.json`` is deleted FIRST
  (the old dataset no longer looks finished: object stores cannot swap a folder, and building
  beside it would mean copying every shard), then every other file that describes the old
  shards (split files, quarantine, timm's ``_info.json``, DALI's ``.idx``, the card), since
  other readers take those as the dataset while its shards are replaced one by one; shards are
  written over the old names, and the old
  dataset's owned objects that the new one did not rewrite are deleted after the new manifest.
  Until writing starts (scan, check, split) the old dataset stays complete.
- **A run that fails** (an exception, a failed or short upload, a full staging disk) deletes
  every owned object under ``OUT``: what it uploaded and, with overwrite, what was left of the
  old dataset (no longer finished). A killed run leaves owned objects without a manifest, which
  the next run deletes, and its staging folder in ``$TMPDIR``, which the next pack into object
  storage on this machine removes (:func:`staging_folder`: the marker file inside proves it is
  shardkit's, and names a process that is gone; a folder without the marker is never touched,
  whatever its name).
- **No lock.** Plain object stores have no lock that a killed packer releases, so one packer
  per ``OUT`` is the user's job: two packs into one URL at once can interleave their objects.

With ``engine="ray"`` each shard is written and uploaded inside its Ray task, in a staging
folder of that node (:func:`shardkit.ray.engine.write_splits`); the driver uploads the rest.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from shardkit.errors import (
    ConfigError, DiskFullError, OutputExistsError, ShardCorruptError, UploadError)
from shardkit.interop.hf_card import CARD_MARKER, CARD_NAME
from shardkit.interop.shards import ShardMembers, scan_shard
from shardkit.dataset.manifest import MANIFEST_NAME, json_bytes
from shardkit.storage.urls import is_url
from shardkit.packer.output import OutputRun, owned_name
from shardkit.storage.procs import pid_alive

__all__ = ["RemoteOutput", "ShardUpload", "put_shard", "remote_fs",
           "upload_file", "staging_folder", "PROBE_NAME", "STAGING_MARKER"]

logger = logging.getLogger("shardkit.pack")

PROBE_NAME = ".shardkit-pack.probe"
"""The object :meth:`RemoteOutput.open` puts and deletes under ``OUT`` to check it is writable."""
STAGING_MARKER = ".shardkit-staging.json"
"""The file :func:`staging_folder` writes into each local staging folder it creates:
``{"pid", "host", "token", "started"}``."""


def remote_fs(url: str):
    """``(filesystem, path)`` of an fsspec URL (fsspec caches the filesystem per process).

    Raises:
        ConfigError: the URL's filesystem package is not installed (names it).
    """
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise ConfigError(f"output {url}: {e} (for s3:// pip install s3fs, for gs:// gcsfs)"
                          ) from None


def staging_folder(prefix: str = "shardkit-pack-") -> Path:
    """A new local staging folder ``<prefix><pid>-<token>-<random>`` (``tempfile.mkdtemp``: in
    ``$TMPDIR``, else ``/tmp``; mode 0700) holding :data:`STAGING_MARKER` with this process's
    pid, host name and a random token. Before it is made, the staging folders of this machine's
    earlier packs whose process is gone (killed: a ``with`` block never removed them) are
    removed and logged: a folder counts as one only when it is a real folder of this user
    holding a marker (a regular file of this user) whose token is the one in the folder's name,
    whose host is this one and whose pid is not running. Any other folder, whatever its name
    (a user's ``shardkit-pack-2024-holiday-photos``), is left alone."""
    root = Path(tempfile.gettempdir())
    for old in sorted(root.glob(f"{prefix}*")):
        owner = _dead_staging(old, prefix)
        if owner is not None:
            shutil.rmtree(old, ignore_errors=True)
            logger.info("removed %s, the staging folder of a killed pack (pid %s)", old, owner)
    token = secrets.token_hex(8)
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{token}-"))
    marker = {"pid": os.getpid(), "host": socket.gethostname(), "token": token,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / STAGING_MARKER).write_bytes(json_bytes(marker))
    return folder


def _dead_staging(folder: Path, prefix: str) -> int | None:
    """The pid of the killed pack whose staging folder ``folder`` is (see
    :func:`staging_folder`), else None."""
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        mark = os.lstat(folder / STAGING_MARKER)
        if not stat.S_ISREG(mark.st_mode) or mark.st_uid != os.getuid() or mark.st_size > 4096:
            return None
        info = json.loads((folder / STAGING_MARKER).read_bytes())
        pid, token = info["pid"], info["token"]
        if not (isinstance(pid, int) and isinstance(token, str) and token
                and folder.name.startswith(f"{prefix}{pid}-{token}-")
                and info["host"] == socket.gethostname()):
            return None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return None if pid_alive(pid) else pid


def upload_file(fs, local: Path, rpath: str, url: str) -> None:
    """Uploads the local file ``local`` to ``rpath`` of ``fs`` (``url`` names it in errors) and
    checks the object's size against the file's.

    Raises:
        UploadError: the upload failed (the filesystem's error, named), or the sizes differ.
    """
    size = os.stat(local).st_size
    try:
        fs.put_file(os.fspath(local), rpath)
        got = fs.info(rpath)["size"]
    except Exception as e:  # s3fs/gcsfs/botocore errors alike: one line naming both ends
        raise UploadError(f"cannot upload {local} to {url}: {type(e).__name__}: {e}") from None
    if got != size:
        raise UploadError(f"{url} holds {got} bytes after the upload, the local file {local} "
                          f"{size}: the object store did not keep the exact bytes; the pack "
                          "was stopped and its objects deleted")


def put_shard(url: str, path: Path, record: dict, records: list[dict]) -> ShardMembers:
    """Checks one finished shard against its split records, uploads it to
    ``url/<record["path"]>`` (:func:`upload_file`) and deletes the local file.

    Args:
        url: the remote ``OUT``. path: the local shard file (from the sink's ``on_close``).
        record: its manifest entry (``path`` relative to OUT, ``num_samples``, ``bytes``,
            ``sha256``). records: the split records of its samples (``key``, ``offset``,
            ``size``).

    Returns:
        its members with its DALI index text (:func:`shardkit.interop.shards.scan_shard`).

    Raises:
        ShardCorruptError: the shard does not match the records (a bug). UploadError.
    """
    if len(records) != record["num_samples"]:
        raise ShardCorruptError(f"shard {record['path']}: {len(records)} split records for "
                                f"{record['num_samples']} samples")
    members = scan_shard(path, record["path"], [r["key"] for r in records],
                         [r["offset"] for r in records], [r["size"] for r in records],
                         dali_index=True)
    fs, base = remote_fs(url)
    upload_file(fs, path, f"{base}/{record['path']}", f"{url}/{record['path']}")
    os.unlink(path)
    logger.debug("uploaded %s to %s", record["path"], url)
    return members


@dataclass
class ShardUpload:
    """The ``on_close`` work of a pack into ``url``: :func:`put_shard`, the members summed in
    :attr:`members` (for :func:`shardkit.interop.write_pack_metadata`)."""

    url: str
    members: ShardMembers = field(default_factory=ShardMembers)

    def __call__(self, path: Path, record: dict, records: list[dict]) -> None:
        self.members.update(put_shard(self.url, path, record, records))


def _is_shard(rel: str) -> bool:
    """True for a shard file (``shards/<split>-NNNNNN.tar``), not an index of shards."""
    return rel.startswith("shards/") and rel.endswith(".tar")


class RemoteOutput(OutputRun):
    """The output side of a pack into an fsspec URL (see the module doc); the context manager
    :func:`shardkit.packer.output.open_output` returns for a remote ``OUT``, with the interface of
    :class:`shardkit.packer.output.PackOutput`.

    Attributes:
        out: the URL (no trailing ``/``). root: the local staging folder; None before prepare.
        upload: the shard hook (a :class:`ShardUpload`); None before prepare.
        cleaned: owned leftovers deleted before writing (paths relative to ``OUT``).
        replaced: objects of the previous dataset overwritten or deleted (overwrite).

    Raises:
        ConfigError: a format other than ``wds`` (``lmdb`` and ``hdf5`` readers need a local
            file system).
    """

    def __init__(self, src, url: str, options):
        if options.format != "wds":
            raise ConfigError(f"output {url} is a remote URL and --format {options.format} "
                              "shards are read through a local file system (memory-mapped "
                              "LMDB, HDF5 files): pack them to a local folder, or use --format "
                              "wds (tar shards, which stream from object storage)")
        self.src, self.out, self.overwrite = src, url.rstrip("/"), bool(options.overwrite)
        self.root: Path | None = None
        self.upload: ShardUpload | None = None
        self.cleaned: list[str] = []
        self.replaced: list[str] = []
        self._old: list[str] = []  # owned objects of the previous dataset (overwrite)
        self._started = False  # writing began: a failure deletes the owned objects
        self._committed = False
        self.fs, self.path = None, None

    def _url(self, rel: str) -> str:
        return f"{self.out}/{rel}"

    def _rpath(self, rel: str) -> str:
        return f"{self.path}/{rel}"

    # ------------------------------------------------------------------ before the scan
    def open(self) -> RemoteOutput:
        """Checks the rules of the module doc before the scan (puts and deletes the probe).

        Raises:
            ConfigError: ``OUT`` inside a URL source or holding it; no filesystem package;
                ``OUT`` cannot be written (missing bucket, no permission: the store's error).
            OutputExistsError: a finished dataset and no ``overwrite``.
        """
        if is_url(self.src):
            src = os.fspath(self.src).rstrip("/")
            if self.out == src or self.out.startswith(src + "/"):
                raise ConfigError(f"output {self.out} lies inside the source {src}; choose "
                                  "another prefix")
            if src.startswith(self.out + "/"):
                raise ConfigError(f"source {src} lies inside the output {self.out}; a pack "
                                  "may delete and replace objects there: choose another "
                                  "output prefix")
        self.fs, self.path = remote_fs(self.out)
        self.path = self.path.rstrip("/")
        probe = self._rpath(PROBE_NAME)
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            self.fs.pipe_file(probe, json_bytes(holder))
            self.fs.rm_file(probe)
        except Exception as e:  # the store's own error, whatever its class
            raise ConfigError(f"output {self.out} cannot be written ({type(e).__name__}: "
                              f"{e}); check the bucket name and the credentials") from None
        self._check_finished()
        return self

    def _check_finished(self) -> None:
        self.fs.invalidate_cache(self.path)
        if self.fs.exists(self._rpath(MANIFEST_NAME)) and not self.overwrite:
            raise OutputExistsError(f"{self.out} already holds a packed dataset "
                                    f"({MANIFEST_NAME}); pass --overwrite (overwrite=True) to "
                                    "replace it")

    def listing(self) -> dict[str, int]:
        """``{path relative to OUT: size}`` of the objects in ``OUT``, ``OUT/shards`` and
        ``OUT/splits`` (where owned names live; one listing each, not the whole prefix)."""
        self.fs.invalidate_cache(self.path)
        found: dict[str, int] = {}
        for folder in ("", "shards/", "splits/"):
            try:
                entries = self.fs.ls(self.path + "/" + folder, detail=True)
            except FileNotFoundError:
                continue
            for e in entries:
                name = e["name"].rstrip("/")
                if e["type"] == "file" and name.startswith(self.path + "/" + folder):
                    found[name[len(self.path) + 1:]] = e["size"]
        return found

    def owned(self) -> list[str]:
        """The owned objects under ``OUT`` (relative posix paths), ``manifest.json`` first."""
        owned = [r for r in sorted(self.listing()) if (owned_name(r) or r == PROBE_NAME)
                 and (r != CARD_NAME or self._is_our_card(r))]
        if MANIFEST_NAME in owned:
            owned.insert(0, owned.pop(owned.index(MANIFEST_NAME)))
        return owned

    def _is_our_card(self, rel: str) -> bool:
        try:
            head = self.fs.cat_file(self._rpath(rel), start=0, end=1 << 16)
        except Exception:  # unreadable: the user's
            return False
        return CARD_MARKER.encode() in head

    def _delete(self, rels: list[str]) -> None:
        if rels:
            self.fs.rm([self._rpath(r) for r in rels])
            self.fs.invalidate_cache(self.path)

    # ------------------------------------------------------------------ step 5
    def prepare(self) -> Path:
        """Step 5: deletes the old ``manifest.json`` (overwrite) or the owned leftovers, and
        returns the local staging folder the run writes into."""
        self._check_finished()  # a dataset finished meanwhile by another packer
        self._started = True
        existing = self.owned()
        if existing[:1] == [MANIFEST_NAME]:  # overwrite: unfinished from here on
            self._delete([MANIFEST_NAME])
            # then every file that describes the old shards (split files, timm's _info.json,
            # DALI's .idx, the card): other readers take them as the dataset, and the shards
            # are about to be replaced one by one (a killed run must not look like a dataset
            # to them either); the old shards stay until commit deletes those not rewritten
            derived = [r for r in existing[1:] if not _is_shard(r)]
            self._delete(derived)
            self._old = [r for r in existing if r != MANIFEST_NAME and r not in derived]
            self.replaced = [MANIFEST_NAME] + derived
        else:
            self._delete(existing)
            self.cleaned = existing
            if existing:
                logger.info("removed from %s before writing (left by an unfinished run): %s",
                            self.out, ", ".join(existing))
        self.root = staging_folder()
        self.upload = ShardUpload(self.out)
        return self.root

    def commit(self) -> None:
        """Uploads what the run wrote into the staging folder (every owned file there; the
        shards are up already), checks every object the manifest names, uploads
        ``manifest.json`` last, then deletes the previous dataset's objects the new one did not
        rewrite.

        Raises:
            UploadError: an upload failed, or an object is missing or has another size.
        """
        from shardkit.packer.output import owned_entries

        manifest = json.loads((self.root / MANIFEST_NAME).read_bytes())
        files = [r for r in owned_entries(self.root) if r != MANIFEST_NAME]
        sizes = {r: (self.root / r).stat().st_size for r in files}
        sizes.update({s["path"]: s["bytes"] for info in manifest["splits"].values()
                      for s in info["shards"]})
        try:
            if files:
                self.fs.put([os.fspath(self.root / r) for r in files],
                            [self._rpath(r) for r in files])
            listed = self.listing()
        except Exception as e:
            raise UploadError(f"cannot upload the split files to {self.out}: "
                              f"{type(e).__name__}: {e}") from None
        bad = [f"{r} ({listed.get(r, 'missing')} bytes, expected {n})"
               for r, n in sizes.items() if listed.get(r) != n]
        if bad:
            raise UploadError(f"{self.out}: {len(bad)} object(s) are not the files written: "
                              f"{', '.join(bad[:5])}; the pack was stopped and its objects "
                              "deleted")
        upload_file(self.fs, self.root / MANIFEST_NAME, self._rpath(MANIFEST_NAME),
                    self._url(MANIFEST_NAME))
        self._committed = True
        new = set(sizes) | {MANIFEST_NAME}
        stale = [r for r in self._old if r not in new]
        try:
            self._delete(stale)
        except Exception as e:  # the new dataset is complete; stale objects are not listed
            logger.warning("could not delete %d object(s) of the previous dataset in %s (%s: "
                           "%s); they are not part of the new dataset", len(stale), self.out,
                           type(e).__name__, e)
        self.replaced = sorted(self.replaced + [r for r in self._old if r in new] + stale)
        logger.info("uploaded %d file(s) and the manifest to %s%s", len(files), self.out,
                    f"; {len(self.replaced)} object(s) of the old dataset overwritten or "
                    "deleted" if self._old else "")

    def rollback(self) -> list[str]:
        """Deletes every owned object under ``OUT`` (see the module doc) after a failure;
        returns them. A failure to delete is logged, not raised (the run's error is)."""
        if not self._started or self._committed:
            return []
        try:
            removed = self.owned()
            self._delete(removed)
        except Exception as e:
            logger.error("pack failed, and deleting its objects from %s failed too (%s: %s); "
                         "the next pack into it deletes them", self.out, type(e).__name__, e)
            return []
        logger.info("pack failed: deleted what it wrote in %s (%d objects)", self.out,
                    len(removed))
        return removed

    def close(self) -> None:
        """Removes the local staging folder."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def _disk_full(self, exc: OSError) -> DiskFullError:
        return DiskFullError(exc.errno, f"no space left on device while writing "
                             f"{exc.filename or 'a file'} in the local staging folder of the "
                             f"upload to {self.out}; its objects were deleted: point TMPDIR at a "
                             "disk with room for one shard per writer and rerun", exc.filename)
