""":class:`RemoteOutput`: a pack into object storage, ``shardkit pack SRC s3://bucket/ds``
(``wds`` tar shards only).

``OUT`` may be an fsspec URL (``s3://`` with s3fs, ``gs://`` with gcsfs, any fsspec filesystem
that can write; credentials as that filesystem finds them: the standard ``AWS_*`` variables,
``~/.aws``, ``GOOGLE_APPLICATION_CREDENTIALS``, fsspec's configuration). The run writes through
the unchanged local code (:class:`shardkit.formats.ShardSink`: temp name, fsync, rename) into a
local staging folder (:func:`~shardkit.packer.outputs.upload.staging_folder`, in ``$TMPDIR``),
and every shard is uploaded as soon as its sink closes it (the sink's ``on_close`` hook,
:class:`~shardkit.packer.outputs.upload.ShardUpload`), checked and deleted locally, so the local
disk holds about one open shard per writer. The rules mirror
:mod:`shardkit.packer.outputs.local`'s for a folder:

- **Exact bytes** (:mod:`shardkit.packer.outputs.upload`): every object's size is checked
  against the local file it was uploaded from.
- **Order.** Shards while they are written; then ``quarantine.jsonl``, ``splits/*``, the readers'
  files of :mod:`shardkit.interop` (``shards/_info.json``, ``shards/<split>-NNNNNN.idx``); then one
  listing of ``OUT`` checks every object the manifest names has its size; ``manifest.json``
  LAST, so its presence still means "finished".
- **Owned names** are :func:`shardkit.packer.outputs.owned.owned_name`'s, plus
  :data:`PROBE_NAME`; a ``README.md`` only with the marker of shardkit's card. Nothing else under
  ``OUT`` is deleted.
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
  storage on this machine removes.
- **No lock.** Plain object stores have no lock that a killed packer releases, so one packer
  per ``OUT`` is the user's job: two packs into one URL at once can interleave their objects.

With ``engine="ray"`` each shard is written and uploaded inside its Ray task, in a staging
folder of that node (:meth:`shardkit.packer.engines.RayEngine.write_splits`); the driver
uploads the rest.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from shardkit.dataset.manifest import json_bytes
from shardkit.errors import ConfigError, DiskFullError, UploadError
from shardkit.storage.urls import is_url
from shardkit.packer.outputs import upload as uploads
from shardkit.packer.outputs.base import PackOutput
from shardkit.packer.outputs.owned import (CARD_NAME, MANIFEST_NAME, is_our_card_head, manifest_first, owned_entries,
                                           owned_name)
from shardkit.packer.outputs.upload import remote_fs, staging_folder

__all__ = ["RemoteOutput", "UploadError", "PROBE_NAME", "REMOTE_FORMATS"]

logger = logging.getLogger("shardkit.pack")

PROBE_NAME = ".shardkit-pack.probe"
"""The object :meth:`RemoteOutput.open` puts and deletes under ``OUT`` to check it is writable."""
REMOTE_FORMATS = ("wds",)
"""The formats a remote ``OUT`` can hold (``lmdb`` and ``hdf5`` readers need a local file
system)."""


def _is_shard(rel: str) -> bool:
    """True for a shard file (``shards/<split>-NNNNNN.tar``), not an index of shards."""
    return rel.startswith("shards/") and rel.endswith(".tar")


class RemoteOutput(PackOutput):
    """The output side of a pack into the fsspec URL ``url`` (see the module doc and
    :class:`~shardkit.packer.outputs.base.PackOutput` for the operations).

    Args:
        src, overwrite: as for :class:`~shardkit.packer.outputs.base.PackOutput`.
        url: ``OUT``. fmt: the pack's format, one of :data:`REMOTE_FORMATS`.

    Attributes:
        out: the URL (no trailing ``/``). root: the local staging folder; None before prepare.
        upload: the shard hook (a :class:`~shardkit.packer.outputs.upload.ShardUpload`); None
            before prepare.
        cleaned: owned leftovers deleted before writing (paths relative to ``OUT``).
        replaced: objects of the previous dataset overwritten or deleted (overwrite).
        fs, path: the fsspec filesystem and ``OUT``'s path in it (after :meth:`open`).

    Raises:
        ConfigError: a format other than ``wds``.
    """

    def __init__(self, src, url: str, overwrite: bool = False, fmt: str = "wds"):
        if fmt not in REMOTE_FORMATS:
            raise ConfigError(f"output {url} is a remote URL and --format {fmt} "
                              "shards are read through a local file system (memory-mapped "
                              "LMDB, HDF5 files): pack them to a local folder, or use --format "
                              "wds (tar shards, which stream from object storage)")
        super().__init__(src, url.rstrip("/"), overwrite)
        self._old: list[str] = []  # owned objects of the previous dataset (overwrite)
        self._started = False  # writing began: a failure deletes the owned objects
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
        self.check_finished()
        return self

    def holds_manifest(self) -> bool:
        self.fs.invalidate_cache(self.path)
        return self.fs.exists(self._rpath(MANIFEST_NAME))

    def listing(self) -> dict[str, int]:
        """``{path relative to OUT: size}`` of the objects in ``OUT``, ``OUT/shards`` and
        ``OUT/splits`` (where owned names live; one listing each, not the whole prefix), read
        now: fsspec's cached listing of each folder is dropped first (objects another process
        wrote since this one listed them are seen)."""
        found: dict[str, int] = {}
        for folder in ("", "shards/", "splits/"):
            self.fs.invalidate_cache(f"{self.path}/{folder}".rstrip("/"))
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
        return manifest_first([r for r in sorted(self.listing())
                               if (owned_name(r) or r == PROBE_NAME)
                               and (r != CARD_NAME or self._is_our_card(r))])

    def _is_our_card(self, rel: str) -> bool:
        try:
            head = self.fs.cat_file(self._rpath(rel), start=0, end=1 << 16)
        except Exception:  # unreadable: the user's
            return False
        return is_our_card_head(head)

    def _delete(self, rels: list[str]) -> None:
        if rels:
            self.fs.rm([self._rpath(r) for r in rels])
            self.fs.invalidate_cache(self.path)

    # ------------------------------------------------------------------ step 5
    def prepare(self) -> Path:
        """Step 5: deletes the old ``manifest.json`` (overwrite) or the owned leftovers, and
        returns the local staging folder the run writes into."""
        self.check_finished()  # a dataset finished meanwhile by another packer
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
            self.log_cleaned()
        self.root = staging_folder()
        self.upload = uploads.ShardUpload(self.out)
        return self.root

    def commit(self) -> None:
        """Uploads what the run wrote into the staging folder (every owned file there; the
        shards are up already), checks every object the manifest names, uploads
        ``manifest.json`` last, then deletes the previous dataset's objects the new one did not
        rewrite.

        Raises:
            UploadError: an upload failed, or an object is missing or has another size.
        """
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
        uploads.upload_file(self.fs, self.root / MANIFEST_NAME, self._rpath(MANIFEST_NAME),
                            self._url(MANIFEST_NAME))
        self.committed = True
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

    def abort(self) -> list[str]:
        """Deletes every owned object under ``OUT`` (see the module doc) after a failure;
        returns them. A failure to delete is logged, not raised (the run's error is)."""
        if not self._started or self.committed:
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

    def disk_full_error(self, exc: OSError) -> DiskFullError:
        return DiskFullError(exc.errno, f"no space left on device while writing "
                             f"{exc.filename or 'a file'} in the local staging folder of the "
                             f"upload to {self.out}; its objects were deleted: point TMPDIR at a "
                             "disk with room for one shard per writer and rerun", exc.filename)
