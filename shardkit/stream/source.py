"""The read side of one split: :class:`ShardSource`, shared by every consumer in a process.

A source holds the split index (numpy arrays, field case 16), the few manifest fields readers
need, lazily opened per-shard readers and, for a remote root, this process's shard prefetcher
(:mod:`.prefetch`: whole shards fetched ahead in the epoch plan's order). It is safe to share
between the decoding threads of one process: readers read with ``pread`` at an offset (no
shared file position), the reader table is guarded by a lock, and per-thread state (decoder
handles: a TurboJPEG handle is not thread-safe; scratch buffers) lives in ``threading.local``.
It pickles without any open handle (or prefetcher), so DataLoader worker processes (fork,
forkserver or spawn, field case 19) each open their own.
"""
from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from ..errors import ConfigError, DecodeError, PixelLimitError, ShardCorruptError
from ..validate import is_int
from ..formats import open_reader
from ..formats.wds import MemoryReader
from shardkit.images.sniff import resolve_max_pixels
from shardkit.dataset.manifest import load_index, load_manifest, sample_checksum
from shardkit.storage.urls import is_url, join
from .options import ON_ERROR
from .prefetch import (ShardPrefetcher, plan_shards, resolve_prefetch_bytes,
                       schedule_epoch)

__all__ = ["ShardSource", "check_shard_files", "dist_rank_world", "worker_id_count"]

log = logging.getLogger("shardkit.stream")


def dist_rank_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments when given, else the initialised
    ``torch.distributed`` default group, else ``(0, 1)`` (no ``init_process_group`` needed).

    Raises:
        ConfigError: only one of the two is given, or ``rank`` is not in ``[0, world_size)``.
    """
    if (rank is None) != (world_size is None):
        raise ConfigError(f"give both rank and world_size or neither (got rank={rank!r}, "
                          f"world_size={world_size!r})")
    if rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    if not (is_int(world_size) and world_size >= 1 and is_int(rank) and 0 <= rank < world_size):
        raise ConfigError(f"rank={rank!r}, world_size={world_size!r}: expected ints with "
                          "0 <= rank < world_size")
    return int(rank), int(world_size)


def worker_id_count() -> tuple[int, int]:
    """``(worker_id, num_workers)`` of the calling DataLoader worker; ``(0, 1)`` elsewhere."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def check_shard_files(root, split: str, shards: list[dict]) -> None:
    """Stats every shard of ``split`` listed in the manifest (local roots): each must exist and
    have exactly the manifest's ``bytes``. A missing or short shard would otherwise be found only
    when its first sample is read, maybe hours in (and a truncated LMDB shard ends the process
    with SIGBUS when its map is touched past the end of the file).

    Raises:
        ShardCorruptError: listing every missing or wrong-sized shard in one message.
    """
    problems = []
    for rec in shards:
        path = join(root, rec["path"])
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            problems.append(f"{rec['path']}: missing")
            continue
        except OSError as e:
            problems.append(f"{rec['path']}: cannot stat ({e.strerror})")
            continue
        want = rec.get("bytes")
        if want is not None and size != want:
            kind = "truncated" if size < want else "larger than written"
            problems.append(f"{rec['path']}: {size} bytes, the manifest says {want} ({kind})")
    if problems:
        shown = "; ".join(problems[:10]) + (f"; ... {len(problems) - 10} more"
                                            if len(problems) > 10 else "")
        raise ShardCorruptError(f"{root}: {len(problems)} of {len(shards)} shard(s) of split "
                                f"{split!r} do not match the manifest: {shown} (re-copy the "
                                "dataset or re-run shardkit pack; shardkit verify checks hashes)")


_UNVERIFIED_NOTED: set[tuple[str, str]] = set()


def _note_unverified(root: str, split: str) -> None:
    """Says once per process and ``(root, split)`` that reads cannot be verified."""
    if (root, split) not in _UNVERIFIED_NOTED:
        _UNVERIFIED_NOTED.add((root, split))
        log.warning("%s: the index of split %r has no per-sample checksums (packed by an older "
                    "shardkit): its reads are not verified; re-pack to enable verify_reads",
                    root, split)


class ShardSource:
    """Stored bytes and labels of one split of a packed dataset (local folder, ``file://`` URL,
    or an fsspec URL for ``wds`` tar shards).

    Attributes:
        root, split: as given. remote: True for a remote (non-``file://``) URL.
        index: the :class:`shardkit.dataset.manifest.SplitIndex`.
        classes: class names (label ``i`` is ``classes[i]``). format: ``"wds"|"lmdb"|"hdf5"``.
        max_pixels: the decoders' pixel limit (width * height of a header): the ``max_pixels``
            given, else :data:`shardkit.images.sniff.DEFAULT_MAX_PIXELS`; never the manifest's
            ``normalization.max_pixels`` (a dataset must not lift its readers' safety limit).
            An image over it is a :class:`~shardkit.images.sniff.PixelLimitError` before any pixel
            is decoded, so ``on_error="skip"`` skips it. packed_max_pixels: the manifest's
            record of pack's limit (only to say, when an image is refused, that the dataset
            claims a higher one). on_error: ``"raise"`` or ``"skip"``.
        verify_reads: as given. verified: True when reads are checked (``verify_reads`` and an
            index with checksums; an index packed before checksums existed is read unchecked,
            said once per process and split at WARNING on the ``shardkit.stream`` logger).
        prefetch_bytes: for a remote root, the memory bound in bytes of the shards fetched
            ahead of the reads (:meth:`prefetch_epoch`, :mod:`shardkit.stream.prefetch`;
            default :data:`~shardkit.stream.prefetch.DEFAULT_SHARD_PREFETCH_BYTES`, 0: off).
            Shards outside a prefetch schedule are fetched whole on their first read and kept
            in an LRU of ``max_open`` shards per process.

    Raises:
        ManifestError: no finished dataset at ``root``, unknown ``split``, or a manifest or
            split index that breaks the schema or its recorded hash
            (:func:`shardkit.dataset.manifest.load_manifest`,
            :func:`~shardkit.dataset.manifest.load_index`).
        ConfigError: bad ``on_error`` or ``max_pixels``; ``lmdb``/``hdf5`` at a remote URL.
        ShardCorruptError: a listed shard is missing or its size differs from the manifest
            (local roots; :func:`check_shard_files`).
    """

    def __init__(self, root, split: str, on_error: str = "raise", verify_reads: bool = True,
                 max_pixels: int | None = None):
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error={on_error!r} is not one of {list(ON_ERROR)}")
        self.max_pixels = resolve_max_pixels(max_pixels)
        self.root = str(root)
        self.split = split
        manifest = load_manifest(root)
        if is_url(root) and manifest["format"] != "wds":
            raise ConfigError(f"format {manifest['format']!r} needs a local path; only 'wds' tar "
                              f"shards can be read from a URL ({root})")
        self.index = load_index(root, split, manifest)
        self.format = manifest["format"]
        self.classes = list(manifest["classes"])
        self.packed_max_pixels = (manifest.get("normalization") or {}).get("max_pixels")
        self.shards = list(manifest["splits"][split]["shards"])
        # readers need only this small dict, not the whole manifest (group maps etc.)
        self._manifest = {"format": self.format, "classes": self.classes,
                          "splits": {split: {"shards": self.shards}}}
        self.on_error = on_error
        self.verify_reads = bool(verify_reads)
        self.verified = self.verify_reads and self.index.xxh3 is not None
        if self.verify_reads and not self.verified:
            _note_unverified(self.root, split)
        self.remote = is_url(root)
        if not self.remote:
            check_shard_files(root, split, self.shards)
        # a remote tar shard is fetched whole into memory: keep at most this many per process
        # (shards read outside the prefetcher's schedule)
        self.max_open = 2 if self.remote else None
        #: bytes of remote shards the prefetcher may hold (0: off; local roots: unused)
        self.prefetch_bytes = resolve_prefetch_bytes(None)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._readers: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pid = os.getpid()
        self._prefetcher: ShardPrefetcher | None = None
        self._prefetch_plan = None  # the plan whose epoch the prefetcher runs
        self._prefetch_refused = False  # said once that an order cannot be prefetched

    def _forked(self) -> None:
        """In a forked child (a DataLoader worker), start with a fresh lock and reader table:
        the parent's decoding threads may have held the lock at the fork (it would stay locked
        forever here), and the readers reopen per process anyway."""
        if self._pid != os.getpid():
            self._init_runtime()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_readers", "_lock", "_local", "_prefetcher", "_prefetch_plan"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def shard_name(self, pos: int) -> str:
        """Relative path of the shard holding split position ``pos``."""
        return self.shards[int(self.index.shard[pos])]["path"]

    def key(self, pos: int) -> str:
        return self.index.key_at(pos)

    def _reader(self, s: int):
        if self._pid != os.getpid():
            self._forked()
        pf = self._prefetcher
        if pf is not None:
            # waits for its fetch; None: not in the schedule of this thread's epoch
            data = pf.get(s, getattr(self._local, "plan", None))
            if data is not None:
                return MemoryReader(self.shards[s]["path"], data)
        reader = self._readers.get(s)
        if reader is not None:
            if self.max_open is not None:
                with self._lock:  # least recently used first: never evict a shard in use
                    if s in self._readers:
                        self._readers[s] = self._readers.pop(s)
            return reader
        with self._lock:
            reader = self._readers.get(s)
            if reader is None:
                if self.max_open is not None and len(self._readers) >= self.max_open:
                    oldest = next(iter(self._readers))  # remote shards live in memory: evict
                    self._readers.pop(oldest).close()
                reader = self._readers[s] = open_reader(self.root, self._manifest, self.split, s)
        return reader

    def read(self, pos: int) -> bytes | memoryview:
        """Stored bytes of the sample at split position ``pos``; the result stays valid. With
        :attr:`verified`, their xxh3 (:func:`shardkit.dataset.manifest.sample_checksum`, ~1 us per
        60 KB) must equal the index's, else the sample is corrupt.

        Raises:
            ShardCorruptError: checksum mismatch (naming shard, key, expected and found), or
                the shard does not hold the indexed sample. OSError: from the shard file.
        """
        idx = self.index
        data = self._reader(int(idx.shard[pos])).read(
            idx.key_at(pos), int(idx.offset[pos]), int(idx.size[pos]))
        return self._checked(pos, data) if self.verified else data

    def read_scratch(self, pos: int) -> bytes | memoryview:
        """As :meth:`read`, but the bytes may live in a buffer of the calling thread that the
        thread's next ``read_scratch`` overwrites (no allocation per sample: ~30 us saved per
        60 KB sample here, see benchmarks/README.md). Use the result before reading again.
        Verified as :meth:`read` (same errors)."""
        idx = self.index
        reader = self._reader(int(idx.shard[pos]))
        read_into = getattr(reader, "read_into", None)
        key, offset, size = idx.key_at(pos), int(idx.offset[pos]), int(idx.size[pos])
        if read_into is None:
            data = reader.read(key, offset, size)
        else:
            buf = getattr(self._local, "scratch", None)
            if buf is None or len(buf) < size + 4096:
                buf = self._local.scratch = bytearray(max(size + 4096, 1 << 20))
            data = read_into(key, offset, size, buf)
        return self._checked(pos, data) if self.verified else data

    def _checked(self, pos: int, data):
        """``data`` when its checksum is the index's; else raises ShardCorruptError."""
        found, expected = sample_checksum(data), int(self.index.xxh3[pos])
        if found != expected:
            shard, key = self.shard_name(pos), self.index.key_at(pos)
            raise ShardCorruptError(
                f"shard {shard}: sample {key!r} is corrupt: xxh3 of its {len(data)} stored bytes "
                f"is {found:016x}, the index says {expected:016x} (the shard changed after pack: "
                "re-copy it or re-pack; `shardkit verify` lists every damaged sample)",
                shard=shard, key=key)
        return data

    def decoder(self, name: str = "auto"):
        """This thread's decoder ``name`` (created on first use, with :attr:`max_pixels`)."""
        if self._pid != os.getpid():
            self._forked()
        decoders = getattr(self._local, "decoders", None)
        if decoders is None:
            decoders = self._local.decoders = {}
        dec = decoders.get(name)
        if dec is None:
            from ..decode import get_decoder

            dec = decoders[name] = get_decoder(name, max_pixels=self.max_pixels)
        return dec

    def decode(self, data, pos: int, decoder: str = "auto") -> np.ndarray:
        """Decodes to uint8 ``(H, W, 3)`` RGB, C-contiguous, values 0..255.

        Raises:
            DecodeError: naming the shard and key (also as its ``shard`` and ``key``).
        """
        try:
            return self.decoder(decoder).decode(data)
        except Exception as e:  # noqa: BLE001 - re-raised with shard and key
            shard, key = self.shard_name(pos), self.index.key_at(pos)
            raise DecodeError(f"shard {shard}: cannot decode sample {key!r}: {e}"
                              f"{self.limit_hint(e)}", shard=shard, key=key) from e

    def limit_hint(self, err: Exception) -> str:
        """For a :class:`~shardkit.images.sniff.PixelLimitError` under a limit below the one the
        dataset says it was packed with: how to read it anyway; else ``""``."""
        packed = self.packed_max_pixels
        if isinstance(err, PixelLimitError) and isinstance(packed, int) \
                and packed > self.max_pixels and err.pixels <= packed:
            return (f"; the dataset was packed with --max-pixels {packed}: pass "
                    f"max_pixels={packed} to read it, if you trust it")
        return ""

    # --- remote shards prefetched ahead of the reads (:mod:`.prefetch`) -------------------------
    @property
    def prefetcher(self) -> ShardPrefetcher | None:
        """This process's :class:`~shardkit.stream.prefetch.ShardPrefetcher` (None: a local
        root, prefetching off, or no epoch scheduled yet in this process)."""
        return self._prefetcher if self._pid == os.getpid() else None

    def prefetch_wanted(self, plan) -> bool:
        """Whether :meth:`prefetch_epoch` of ``plan`` would schedule anything: a remote root,
        :attr:`prefetch_bytes` > 0 and ``plan`` not yet scheduled in this process."""
        return self.remote and self.prefetch_bytes > 0 and not (
            self._pid == os.getpid() and self._prefetch_plan is plan)

    def prefetch_epoch(self, plan, batches) -> None:
        """Schedules the remote shards of ``plan``'s batches ``batches`` (the ones this process
        builds, in its order) for prefetching; nothing for a local root, with
        :attr:`prefetch_bytes` 0, or when ``plan`` is already the scheduled one. In a
        DataLoader worker process of ``k`` the bound is ``prefetch_bytes // k``. An order
        whose shards cannot stay within the bound is read lazily instead (one warning)."""
        if not self.remote or self.prefetch_bytes <= 0:
            return
        if self._pid != os.getpid():
            self._forked()
        with self._lock:
            if self._prefetch_plan is not plan:
                self._schedule(plan, batches)
                self._prefetch_plan = plan  # last: a reader that sees it finds the schedule

    def _schedule(self, plan, batches) -> None:
        """:meth:`prefetch_epoch`'s work, under the lock."""
        sizes = [rec.get("bytes") for rec in self.shards]
        if any(not isinstance(b, int) for b in sizes):
            return  # an old manifest without shard sizes: no bound can be kept
        bound = max(1, self.prefetch_bytes // worker_id_count()[1])
        shards, batch_of = plan_shards(plan, batches, self.index.shard)
        sched = schedule_epoch(shards, batch_of, sizes)
        if sched.peak_bytes > bound:
            if not self._prefetch_refused:
                self._prefetch_refused = True
                log.warning("%s: this epoch's order needs %.1f MB of shards in memory at "
                            "once, over the prefetch bound of %.1f MB of this process: no shard "
                            "is prefetched, each is fetched on its first read instead (set "
                            "WorkerOptions(shard_prefetch_bytes=...) to at least %d; shard-block "
                            "order, SamplingOptions(block=True), the default for URLs, needs "
                            "about one shard per stream plus one)",
                            self.root, sched.peak_bytes / 1e6, bound / 1e6,
                            math.ceil(sched.peak_bytes * self.prefetch_bytes / max(1, bound)))
            if self._prefetcher is not None:
                self._prefetcher.close()
                self._prefetcher = None
            return
        if self._prefetcher is None or self._prefetcher.bound != bound:
            if self._prefetcher is not None:
                self._prefetcher.close()
            self._prefetcher = ShardPrefetcher(
                [join(self.root, rec["path"]) for rec in self.shards],
                [rec["path"] for rec in self.shards], sizes, bound)
        self._prefetcher.schedule(plan, sched)

    def prefetch_reading(self, plan) -> None:
        """The calling thread reads for ``plan``'s epoch from now on: it waits for the
        prefetcher's fetches only while that epoch is the scheduled one."""
        self._local.plan = plan

    def prefetch_done(self, plan, positions) -> None:
        """The samples at ``positions`` (split positions) of ``plan``'s epoch are consumed
        (built, served from a cache or skipped): their shards' last samples free them."""
        pf = self._prefetcher
        if pf is not None and self._pid == os.getpid():
            pf.consumed(plan, self.index.shard[np.asarray(positions, dtype=np.int64)])

    def close(self) -> None:
        """Closes every open shard reader of this process (they reopen lazily if read again)
        and stops its prefetcher (dropping the shards it holds)."""
        with self._lock:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()
            pf, self._prefetcher, self._prefetch_plan = self._prefetcher, None, None
        if pf is not None and self._pid == os.getpid():
            pf.close()
